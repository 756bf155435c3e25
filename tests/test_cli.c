/* The vkswarm binary as a user runs it: exact reference text on stdout,
 * logits files, JSON output, --help everywhere, exit status 2 on bad input. */
#include "test_util.h"
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

/* Issue 9 item 14: input lines end at "\n" or "\r\n"; a NUL byte is an error
 * naming the file and line (it used to cut the line short silently). */
static void write_bytes(const char *path, const char *bytes, size_t n) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* Runs cmd (stderr to errp); expects exit 2 and a last stderr line holding both strings. */
static void expect_bad_input(const char *cmd, const char *errp, const char *want_a, const char *want_b) {
    int rc = tu_run(cmd, NULL);
    char *err = (char *)tu_read_file(errp, NULL);
    assert_non_null(err);
    size_t n = strlen(err);
    if (n && err[n - 1] == '\n') err[--n] = 0;
    char *last = strrchr(err, '\n') ? strrchr(err, '\n') + 1 : err;
    if (rc != 2 || !strstr(last, want_a) || !strstr(last, want_b))
        fail_msg("'%s': exit %d, stderr '%s' (want '%s' and '%s')", cmd, rc, err, want_a, want_b);
    free(err);
}

static const char RANDOM_MODEL[] = "--random-model 64,96,2,4,2,64,32";

static void test_input_lines_nul_and_crlf(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char prompts[512], ids[512], errp[600], cmd[8192], *out;
    snprintf(prompts, sizeof prompts, "%s/prompts.txt", dir);
    snprintf(ids, sizeof ids, "%s/ids.txt", dir);
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    write_bytes(prompts, "1 2\n3\0 4\n", 9);
    snprintf(cmd, sizeof cmd, "%s generate %s --prompts %s -n 4 --temp 0 2>%s", tu_bin(), RANDOM_MODEL, prompts, errp);
    expect_bad_input(cmd, errp, "prompts.txt: line 2", "NUL");
    write_bytes(ids, "1 2\n3\0 999\n", 11);
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --out %s/o.f32 2>%s", tu_bin(), RANDOM_MODEL, ids, dir, errp);
    expect_bad_input(cmd, errp, "ids.txt: line 2", "NUL");
    snprintf(cmd, sizeof cmd, "printf '1 2\\n3\\0004' | %s detokenize --tokenizer %s --vocab-size 512 2>%s", tu_bin(),
             tu_shared_path("stories260K/tok512.bin") ? tu_shared_path("stories260K/tok512.bin") : "/nonexistent", errp);
    if (tu_shared_path("stories260K/tok512.bin")) expect_bad_input(cmd, errp, "line 2", "NUL");
    /* CRLF: the same prompts as with LF (id prompts refused the "\r" before). */
    write_bytes(prompts, "1 2\r\n3\r\n", 8);
    snprintf(cmd, sizeof cmd, "%s generate %s --prompts %s -n 4 --temp 0 --seed 1 2>%s", tu_bin(), RANDOM_MODEL, prompts,
             errp);
    if (tu_run(cmd, &out) != 0) fail_msg("CRLF prompts: %s", (char *)tu_read_file(errp, NULL));
    assert_non_null(strstr(out, "{\"prompt\":\"1 2\",\"ids\":[1,1,2,"));
    assert_non_null(strstr(out, "{\"prompt\":\"3\",\"ids\":[1,3,"));
    assert_null(strstr(out, "\\r"));
    free(out);
    write_bytes(ids, "1 2\r\n3\r\n", 8);
    snprintf(cmd, sizeof cmd, "%s logits %s --ids %s --out %s/o.f32 2>%s", tu_bin(), RANDOM_MODEL, ids, dir, errp);
    assert_int_equal(tu_run(cmd, NULL), 0);
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (!model) return;
    char model_s[2048], tok_s[2048];
    snprintf(model_s, sizeof model_s, "%s", model);
    snprintf(tok_s, sizeof tok_s, "%s", tu_shared_path("stories260K/tok512.bin"));
    write_bytes(prompts, "Once upon a time\r\n", 18); /* text prompts: no "\r" token at the end */
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokenizer %s --prompts %s --temp 0 -n 8 2>/dev/null", tu_bin(),
             model_s, tok_s, prompts);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "{\"prompt\":\"Once upon a time\",\"ids\":[1,403,407,261,378,"));
    free(out);
}

/* Issue 9 item 11: a llama2.c tokenizer of another model (32000 tokens on the
 * 512-token stories260K) is refused naming both counts, exit 2. */
static void test_tokenizer_of_another_model(void **state) {
    (void)state;
    char model_s[2048], tok_s[2048], errp[600], cmd[8192];
    const char *model = tu_shared_path("stories260K/stories260K.bin"); /* a static buffer: copy it */
    if (!model) skip();
    snprintf(model_s, sizeof model_s, "%s", model);
    const char *tok = tu_shared_path("llamacpp-vocab/llama2c-tokenizer.bin");
    if (!tok) skip();
    snprintf(tok_s, sizeof tok_s, "%s", tok);
    snprintf(errp, sizeof errp, "%s/err.txt", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "%s generate --model %s --tokenizer %s --prompt 'Once' -n 8 --seed 1 2>%s", tu_bin(),
             model_s, tok_s, errp);
    expect_bad_input(cmd, errp, "holds 32000 tokens", "vocabulary has 512");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_everywhere),        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_generate_reference_text), cmocka_unit_test(test_logits_file),
        cmocka_unit_test(test_prompts_jsonl),          cmocka_unit_test(test_bad_files_exit_2),
        cmocka_unit_test(test_input_lines_nul_and_crlf), cmocka_unit_test(test_tokenizer_of_another_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
