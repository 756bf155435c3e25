/* The vkswarm binary as a user runs it: exact reference text on stdout,
 * logits files, JSON output, --help everywhere, exit status 2 on bad input. */
#define _GNU_SOURCE /* memmem */
#include "test_util.h"
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_gguf.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_help_everywhere(void **state) {
    (void)state;
    const char *cmds[] = {"devices", "generate", "logits", "bench"};
    char cmd[1024];
    for (int i = 0; i < 4; i++) {
        char *out;
        snprintf(cmd, sizeof cmd, "%s %s --help 2>/dev/null", tu_bin(), cmds[i]);
        assert_int_equal(tu_run(cmd, &out), 0);
        assert_non_null(strstr(out, "usage: vkswarm"));
        free(out);
    }
    snprintf(cmd, sizeof cmd, "%s nonsense 2>/dev/null", tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "%s generate --temp abc 2>/dev/null", tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 2);
}

static void test_devices(void **state) {
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s devices", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "subgroup"));
    assert_non_null(strstr(out, "0*"));
    free(out);
}

static void check_text(const char *args, const char *ref_rel) {
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) skip();
    char model_s[2048], tok_s[2048], cmd[8192], *out;
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(tok_s, sizeof tok_s, "%s", tu_shared_path("stories260K/tok512.bin"));
    char *want = (char *)tu_read_file(tu_shared_path(ref_rel), NULL);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokenizer %s %s 2>/dev/null", tu_bin(), model_s, tok_s, args);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, want);
    free(out);
    free(want);
}

static void test_generate_reference_text(void **state) {
    (void)state;
    check_text("--temp 0 -n 200", "stories260K/ref/greedy_noprompt_n200.txt");
    check_text("--prompt 'Once upon a time' --temp 0 -n 64", "stories260K/ref/greedy_onceuponatime_n64.txt");
}

static void test_logits_file(void **state) {
    (void)state;
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) skip();
    char model_s[2048], ids_s[2048], ref_s[2048], cmd[8192], out_path[512];
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(ids_s, sizeof ids_s, "%s", tu_shared_path("stories260K/ref/greedy_onceuponatime_n64.ids"));
    snprintf(ref_s, sizeof ref_s, "%s", tu_shared_path("stories260K/ref/greedy_onceuponatime_n64.logits.f32"));
    snprintf(out_path, sizeof out_path, "%s/logits.f32", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "%s logits --model %s --ids %s --out %s 2>/dev/null", tu_bin(), model_s, ids_s, out_path);
    /* the ids file holds 65 ids (64 fed + the last sampled); the reference has 64 rows */
    assert_int_equal(tu_run(cmd, NULL), 0);
    size_t got_n, ref_n;
    float *got = (float *)tu_read_file(out_path, &got_n), *ref = (float *)tu_read_file(ref_s, &ref_n);
    assert_int_equal(got_n, ref_n + 512 * 4);
    double m = 0;
    for (size_t i = 0; i < ref_n / 4; i++) m = fmax(m, fabs((double)got[i] - ref[i]));
    assert_true(m <= 1e-4);
    free(got);
    free(ref);
}

static void test_prompts_jsonl(void **state) {
    (void)state;
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) skip();
    char model_s[2048], tok_s[2048], cmd[8192], path[512], *out;
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(tok_s, sizeof tok_s, "%s", tu_shared_path("stories260K/tok512.bin"));
    snprintf(path, sizeof path, "%s/prompts.txt", tu_tmpdir());
    FILE *f = fopen(path, "w");
    fputs("Once upon a time\nThe \"dog\"\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokenizer %s --prompts %s --temp 0 -n 64 2>/dev/null", tu_bin(),
             model_s, tok_s, path);
    assert_int_equal(tu_run(cmd, &out), 0);
    char *line2 = strchr(out, '\n');
    assert_non_null(line2);
    *line2++ = 0;
    assert_non_null(strstr(out, "{\"prompt\":\"Once upon a time\",\"ids\":[1,403,407,261,378,"));
    char *want = (char *)tu_read_file(tu_shared_path("stories260K/ref/greedy_onceuponatime_n64.txt"), NULL);
    want[strlen(want) - 1] = 0; /* drop the final newline: text is what a run prints, without it */
    char *text = strstr(out, "\"text\":\"");
    assert_non_null(text);
    assert_memory_equal(text + 8, "Once upon a time, there was a little girl named Lily.", 53);
    assert_non_null(strstr(line2, "{\"prompt\":\"The \\\"dog\\\"\""));
    free(want);
    free(out);
}

/* Hostile files through the CLI: one line on stderr naming the file, exit 2. */
static void test_bad_files_exit_2(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[512], cmd[8192], errp[600];
    snprintf(path, sizeof path, "%s/bad.bin", dir);
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    FILE *f = fopen(path, "wb");
    int32_t hdr[7] = {64, 172, 5, 8, 4, 512, 512};
    fwrite(hdr, 4, 7, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s generate --model %s -n 4 2>%s", tu_bin(), path, errp);
    assert_int_equal(tu_run(cmd, NULL), 2);
    char *err = (char *)tu_read_file(errp, NULL);
    assert_non_null(strstr(err, "bad.bin"));
    assert_non_null(strchr(err, '\n'));
    assert_true(strchr(err, '\n')[1] == 0); /* one line */
    free(err);
    snprintf(cmd, sizeof cmd, "%s generate --model /nonexistent/m.bin 2>/dev/null", tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 2);
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) return;
    char model_s[2048];
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    f = fopen(path, "w");
    fputs("1 2 3 999\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s logits --model %s --ids %s --out %s/o.f32 2>/dev/null", tu_bin(), model_s, path, dir);
    assert_int_equal(tu_run(cmd, NULL), 2);
    f = fopen(path, "w");
    fputs("1 2 x3\n", f);
    fclose(f);
    assert_int_equal(tu_run(cmd, NULL), 2);
}

/* Runs `args` (the vkswarm arguments, shell syntax) with stderr captured:
 * returns the exit status; *out gets stdout and *err stderr (malloc'd). */
static int run_capture(const char *args, char **out, char **err) {
    char errp[600], cmd[16384];
    snprintf(errp, sizeof errp, "%s/stderr.txt", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "%s %s 2>%s", tu_bin(), args, errp);
    int rc = tu_run(cmd, out);
    *err = (char *)tu_read_file(errp, NULL);
    assert_non_null(*err);
    return rc;
}

/* One line, ending in '\n', and no byte a terminal could act on. */
static bool one_clean_line(const char *err) {
    size_t n = strlen(err);
    if (n == 0 || err[n - 1] != '\n' || strchr(err, '\n') != err + n - 1) return false;
    for (size_t i = 0; i + 1 < n;) {
        uint32_t cp;
        size_t k = vks_utf8_decode(err + i, n - 1 - i, &cp);
        if (k == 0 || cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)) return false;
        i += k;
    }
    return true;
}

/* Option mistakes: one line naming the option and "see --help", exit 2, in every command. */
static void test_option_errors_one_line(void **state) {
    (void)state;
    const char *cmds[] = {"devices", "generate", "logits", "bench", "tokenize", "detokenize", "convert", "pipeline",
                          "verify", "keygen", "broadcast"};
    char args[256], want[256];
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char *out, *err;
        snprintf(args, sizeof args, "%s --foo", cmds[i]);
        int rc = run_capture(args, &out, &err);
        snprintf(want, sizeof want, "vkswarm %s: unknown option '--foo' (see vkswarm %s --help)\n", cmds[i], cmds[i]);
        if (rc != 2 || strcmp(err, want) || *out) fail_msg("'%s': status %d, stderr '%s'", args, rc, err);
        free(out);
        free(err);
    }
    const struct { const char *args, *msg; } more[] = {
        {"generate --model", "vkswarm generate: option '--model' needs a value"},
        {"generate -n", "vkswarm generate: option '-n' needs a value"},
        {"generate -q", "vkswarm generate: unknown option '-q'"},
        {"generate --toploc=yes", "vkswarm generate: option '--toploc' takes no value"},
        {"verify --rollouts", "vkswarm verify: option '--rollouts' needs a value"},
        {"convert --in m.bin extra", "vkswarm convert: unexpected argument 'extra'"},
        {"keygen --out", "vkswarm keygen: option '--out' needs a value"},
        {"broadcast --file", "vkswarm broadcast: option '--file' needs a value"},
        {"detokenize --model m --chat", "vkswarm detokenize: unknown option '--chat'"},
        {"tokenize \"$(printf -- '--\\033]0;x\\007')\"", "vkswarm tokenize: unknown option '--\\x1b]0;x\\x07'"},
        {"nonsense", "vkswarm: unknown command 'nonsense' (see vkswarm --help)"},
    };
    for (size_t i = 0; i < sizeof more / sizeof more[0]; i++) {
        char *out, *err;
        int rc = run_capture(more[i].args, &out, &err);
        if (rc != 2 || strncmp(err, more[i].msg, strlen(more[i].msg)) || !one_clean_line(err))
            fail_msg("'%s': status %d, stderr '%s'", more[i].args, rc, err);
        free(out);
        free(err);
    }
}

static void write_text_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* Messages that used to mislead (issue 9, item 19). */
static void test_messages_say_what_happened(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    const char *rnd = "--random-model 64,128,1,4,4,32,32";
    char args[2048], *out, *err;
    /* a directory where a file belongs */
    snprintf(args, sizeof args, "generate %s --prompts %s", rnd, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    if (!strstr(err, ": cannot read: Is a directory\n") || strstr(err, "no prompts")) fail_msg("--prompts DIR: '%s'", err);
    free(out), free(err);
    snprintf(args, sizeof args, "verify %s --rollouts %s --cpu", rnd, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    if (!strstr(err, "Is a directory") || !one_clean_line(err)) fail_msg("--rollouts DIR: '%s'", err);
    free(out), free(err);
    /* -n shorter than the prompt: no negative token count */
    snprintf(args, sizeof args, "generate %s --prompt '5 6 7 8 9' -n 3 --seed 1", rnd);
    assert_int_equal(run_capture(args, &out, &err), 0);
    if (!strstr(err, "generate: 0 tokens in")) fail_msg("-n 3, 6-token prompt: '%s'", err);
    free(out), free(err);
    /* a prompt line of exactly 1 MiB is allowed; one byte more is not */
    char path[600];
    snprintf(path, sizeof path, "%s/long.txt", dir);
    size_t mib = 1 << 20;
    char *line = malloc(mib + 3);
    memset(line, ' ', mib);
    strcpy(line + mib, "\n");
    write_text_file(path, line);
    snprintf(args, sizeof args, "generate %s --prompts %s -n 2 --seed 1", rnd, path);
    if (run_capture(args, &out, &err) != 0) fail_msg("1 MiB prompt line: '%s'", err);
    free(out), free(err);
    strcpy(line + mib, " \n");
    write_text_file(path, line);
    assert_int_equal(run_capture(args, &out, &err), 2);
    assert_non_null(strstr(err, "longer than 1048576 bytes"));
    free(out), free(err), free(line);
    /* detokenize: a bad word is named, nothing is printed */
    const char *tok = tu_shared_path("stories260K/tok512.bin");
    if (!tok) return;
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    write_text_file(path, "1 2 x\n");
    snprintf(args, sizeof args, "detokenize --tokenizer %s --vocab-size 512 < %s", tok, path);
    assert_int_equal(run_capture(args, &out, &err), 2);
    if (*out || !strstr(err, "'x'") || !one_clean_line(err)) fail_msg("detokenize '1 2 x': '%s' '%s'", out, err);
    free(out), free(err);
}

/* A sample id holding a tab and a newline cannot forge an "accepted" line in
 * verify's plain output (issue 9, item 15). */
static void test_verify_ids_escaped(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char args[2048], *out, *err, path[600];
    snprintf(path, sizeof path, "%s/r.jsonl", dir);
    snprintf(args, sizeof args,
             "generate --random-model 64,128,1,4,4,32,32 --prompt '' -n 4 --seed 1 --rollouts-out %s >/dev/null 2>&1 && "
             "sed -i 's/\"id\":\"1-0\"/\"id\":\"1-0\\\\taccepted\\\\n1-0-shadow\\\\u001b[2J\"/' %s && grep -c shadow %s",
             path, path, path);
    assert_int_equal(run_capture(args, &out, &err), 0);
    assert_string_equal(out, "1\n");
    free(out), free(err);
    /* another model: the sample is rejected */
    snprintf(args, sizeof args, "verify --random-model 64,128,2,4,4,32,32 --rollouts %s --cpu", path);
    assert_int_equal(run_capture(args, &out, &err), 1);
    const char *want = "1-0\\x09accepted\\x0a1-0-shadow\\x1b[2J\trejected: ";
    if (strncmp(out, want, strlen(want)) || strstr(out, "\taccepted")) fail_msg("plain output: '%s'", out);
    char *second = strchr(out, '\n');
    assert_non_null(second);
    assert_non_null(strstr(second + 1, "verified 1 samples: 0 accepted, 1 rejected\n"));
    free(out), free(err);
}

/* Whole output is valid UTF-8. */
static bool valid_utf8(const char *s, size_t n) {
    for (size_t i = 0; i < n;) {
        size_t k = vks_utf8_decode(s + i, n - i, NULL);
        if (k == 0) return false;
        i += k;
    }
    return true;
}

/* --prompts with invalid UTF-8: the JSON lines stay valid UTF-8, invalid
 * bytes become \ufffd (issue 9, item 17). */
static void test_prompts_json_invalid_utf8(void **state) {
    (void)state;
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) skip();
    char model_s[2048], tok_s[2048], args[8192], path[600], *out, *err;
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(tok_s, sizeof tok_s, "%s", tu_shared_path("stories260K/tok512.bin"));
    snprintf(path, sizeof path, "%s/bad-utf8.txt", tu_tmpdir());
    write_text_file(path, "Once \xff\xfe upon \xc3\x28 a \xe2\x80\xa8 time \x1b[2J\n");
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --prompts %s --temp 0 -n 40", model_s, tok_s, path);
    assert_int_equal(run_capture(args, &out, &err), 0);
    if (!valid_utf8(out, strlen(out))) fail_msg("not UTF-8: '%s'", out);
    const char *want = "{\"prompt\":\"Once \\ufffd\\ufffd upon \\ufffd( a \\u2028 time \\u001b[2J\",";
    if (strncmp(out, want, strlen(want))) fail_msg("prompt field: '%s'", out);
    free(out), free(err);
}

/* GGUF strings (architecture, tensor name, key, tokenizer model) holding ESC
 * and other control bytes: every message is one line with them escaped
 * (issue 9, item 16). */
static void write_esc_gguf(const char *path, int variant) {
    vks_gguf_writer *w;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    static float t[32];
    int64_t ne[1] = {32};
    const char *arch = variant == 0 ? "\x1b]0;pwned\x07\x1b[2J\x9b\r" : "llama";
    assert_int_equal(vks_gguf_add_str(w, "general.architecture", arch), VKS_OK);
    assert_int_equal(vks_gguf_add_str(w, "tokenizer.ggml.model", variant == 3 ? "\x1b[31mred\n" : "llama"), VKS_OK);
    assert_int_equal(vks_gguf_add_u32(w, variant == 2 ? "key\x1b[2J\x7f" : "x.u32", 7), VKS_OK);
    assert_int_equal(vks_gguf_add_tensor(w, variant == 1 ? "t\x1b]2;x\x07" : "t.f32", VKS_DTYPE_F32, 1, ne, t), VKS_OK);
    assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
    vks_gguf_writer_free(w);
    size_t len;
    unsigned char *b = tu_read_file(path, &len);
    if (variant == 1) { /* the tensor's ggml type: unknown (u32 n_dims, u64 ne0, then the type) */
        unsigned char *name = memmem(b, len, "t\x1b]2;x\x07", 7);
        assert_non_null(name);
        uint32_t bad = 99;
        memcpy(name + 7 + 4 + 8, &bad, 4);
    }
    if (variant == 2) { /* the key's value type: unknown */
        unsigned char *key = memmem(b, len, "key\x1b[2J\x7f", 8);
        assert_non_null(key);
        uint32_t bad = 77;
        memcpy(key + 8, &bad, 4);
    }
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
    free(b);
}

static void test_file_strings_escaped_in_messages(void **state) {
    (void)state;
    char path[600], args[2048], *out, *err;
    snprintf(path, sizeof path, "%s/esc.gguf", tu_tmpdir());
    const char *cmds[] = {"generate --model %s -n 2", "convert --in %s --out %s.gguf", "tokenize --tokenizer %s --prompt hi",
                          "tokenize --model %s --prompt hi"};
    const char *expect[] = {"\\x1b]0;pwned", "t\\x1b]2;x\\x07", "key\\x1b[2J\\x7f", "\\x1b[31mred\\x0a"};
    for (int v = 0; v < 4; v++) {
        write_esc_gguf(path, v);
        for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
            if (v == 3 && c < 2) continue; /* the model loads; only its tokenizer is bad */
            if (v == 0 && c >= 2) continue; /* tokenize reads a GGUF's metadata only, not its architecture */
            snprintf(args, sizeof args, cmds[c], path, path);
            int rc = run_capture(args, &out, &err);
            if (rc != 2 || !one_clean_line(err) || !strstr(err, expect[v]) || !strstr(err, path))
                fail_msg("variant %d, '%s': status %d, stderr '%s'", v, cmds[c], rc, err);
            free(out), free(err);
        }
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_everywhere),        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_generate_reference_text), cmocka_unit_test(test_logits_file),
        cmocka_unit_test(test_prompts_jsonl),          cmocka_unit_test(test_bad_files_exit_2),
        cmocka_unit_test(test_option_errors_one_line), cmocka_unit_test(test_messages_say_what_happened),
        cmocka_unit_test(test_verify_ids_escaped),     cmocka_unit_test(test_prompts_json_invalid_utf8),
        cmocka_unit_test(test_file_strings_escaped_in_messages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
