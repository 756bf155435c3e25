/* The vkswarm binary as a user runs it: exact reference text on stdout,
 * logits files, JSON output, --help everywhere, exit status 2 on bad input. */
#define _GNU_SOURCE /* memmem */
#include "chat_templates.h"
#include "test_util.h"
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_rollout.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>
#include <jansson.h>
#include <sys/wait.h>
#include <signal.h>
#include <errno.h>
#include <time.h>

static void test_help_everywhere(void **state) {
    (void)state;
    const char *cmds[] = {"devices", "generate", "logits", "bench", "train", "eval", "tasks"};
    char cmd[1024];
    for (int i = 0; i < 7; i++) {
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

/* bench names the host CPU (lavapipe figures depend on it) and reports a
 * matmul rate only after checking the kernel's result. */
static void test_bench_small(void **state) {
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s bench --random-model 64,128,1,4,4,64,64 --prompt-len 8 --gen 2 2>/dev/null", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "host: "));
    assert_non_null(strstr(out, "cores online"));
    assert_non_null(strstr(out, "matmul rate: "));
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

/* ---- lost output and partial files (issue 9, items 1-3) ---- */

/* Copies a shared model path out of tu_shared_path's static buffer. */
static bool shared_copy(const char *rel, char *out, size_t cap) {
    const char *p = tu_shared_path(rel);
    if (!p) return false;
    snprintf(out, cap, "%s", p);
    return true;
}

/* Number of lines of s that contain needle. */
static int lines_with(const char *s, const char *needle) {
    int n = 0;
    for (const char *line = s; line && *line;) {
        const char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char buf[4096];
        snprintf(buf, sizeof buf, "%.*s", (int)(len < sizeof buf - 1 ? len : sizeof buf - 1), line);
        if (strstr(buf, needle)) n++;
        line = end ? end + 1 : NULL;
    }
    return n;
}

/* Runs `args` with stdout on /dev/full: exit 1 and exactly one line on stderr
 * that says stdout failed (no other stderr line when quiet). Counts misses. */
static int stdout_misses;
static void expect_stdout_full(const char *args, const char *stdin_text, bool quiet) {
    char cmd[16384], *err;
    if (stdin_text)
        snprintf(cmd, sizeof cmd, "printf '%s' | %s %s 2>&1 >/dev/full", stdin_text, tu_bin(), args);
    else snprintf(cmd, sizeof cmd, "%s %s 2>&1 >/dev/full", tu_bin(), args);
    int rc = tu_run(cmd, &err);
    if (rc != 1 || lines_with(err, "stdout failed") != 1 || (quiet && lines_with(err, "") != 1)) {
        fprintf(stderr, "stdout on /dev/full: %s\n-> exit %d, stderr: %s\n", args, rc, err);
        stdout_misses++;
    }
    free(err);
}

static void test_stdout_full_exits_1(void **state) {
    (void)state;
    if (access("/dev/full", W_OK) != 0) skip();
    char dir[256], args[8192];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    expect_stdout_full("devices", NULL, true);
    snprintf(args, sizeof args, "keygen --out %s/keys", dir);
    expect_stdout_full(args, NULL, true);
    char model[2048], tok[2048];
    if (!shared_copy("stories260K/stories260K.bin", model, sizeof model) ||
        !shared_copy("stories260K/tok512.bin", tok, sizeof tok)) {
        assert_int_equal(stdout_misses, 0);
        return;
    }
    snprintf(args, sizeof args, "tokenize --tokenizer %s --vocab-size 512", tok);
    expect_stdout_full(args, "Once upon a time", true);
    snprintf(args, sizeof args, "detokenize --tokenizer %s --vocab-size 512", tok);
    expect_stdout_full(args, "1 403 407", true);
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --prompt Once -n 16 --temp 0", model, tok);
    expect_stdout_full(args, NULL, false);
    char prompts[512], rollouts[512], cmd[16384];
    snprintf(prompts, sizeof prompts, "%s/prompts.txt", dir);
    snprintf(rollouts, sizeof rollouts, "%s/r.jsonl", dir);
    FILE *f = fopen(prompts, "w");
    fputs("Once upon a time\nThe dog\n", f);
    fclose(f);
    snprintf(args, sizeof args, "generate --model %s --tokenizer %s --prompts %s -n 16 --temp 0", model, tok, prompts);
    expect_stdout_full(args, NULL, false);
    snprintf(cmd, sizeof cmd, "%s %s --rollouts-out %s >/dev/null 2>&1", tu_bin(), args, rollouts);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(args, sizeof args, "verify --model %s --rollouts %s", model, rollouts);
    expect_stdout_full(args, NULL, false);
    snprintf(args, sizeof args, "verify --model %s --rollouts %s --jsonl", model, rollouts);
    expect_stdout_full(args, NULL, false);
    assert_int_equal(stdout_misses, 0);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    assert_int_equal(fclose(f), 0);
}

static bool same_file(const char *a, const char *b) {
    size_t na, nb;
    unsigned char *x = tu_read_file(a, &na), *y = tu_read_file(b, &nb);
    bool same = x && y && na == nb && memcmp(x, y, na) == 0;
    free(x);
    free(y);
    return same;
}

static void run_ok(const char *args) {
    char cmd[16384];
    snprintf(cmd, sizeof cmd, "%s %s 2>&1", tu_bin(), args);
    char *out;
    int rc = tu_run(cmd, &out);
    if (rc) fprintf(stderr, "%s -> %d: %s", args, rc, out);
    free(out);
    assert_int_equal(rc, 0);
}

/* Rollouts made with the f16 KV cache (--kv-type f16) record it in their
 * header ("kv_type":"f16") and verify honest by the verifier's own f16-cache
 * replay (the same rounding, vks_f32_to_f16) on the GPU and on the CPU (fast
 * and reference forwards); 300 positions cross the split attention's first
 * boundary. A verifier told another cache type refuses the file (exit 2);
 * files of the f32 cache carry no kv_type. */
static void test_kv_f16_rollouts_verified(void **state) {
    (void)state;
    char model[2048], dir[256], prompts[512], a[8192], cmd[16384];
    if (!shared_copy("stories260K/stories260K.bin", model, sizeof model)) skip();
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(prompts, sizeof prompts, "%s/kv_prompts.txt", dir);
    write_text(prompts, "1 403 407 100\n1 403\n1 500 300 200 10\n");
    snprintf(a, sizeof a, "generate --random-model 64,128,2,8,4,512,512 --prompts %s -n 300 --temp 0.9 --seed 5 "
             "--kv-type f16 --rollouts-out %s/kv16.jsonl", prompts, dir);
    run_ok(a);
    snprintf(cmd, sizeof cmd, "head -1 %s/kv16.jsonl | grep -q '\"kv_type\":\"f16\"'", dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(a, sizeof a, "verify --random-model 64,128,2,8,4,512,512 --rollouts %s/kv16.jsonl", dir);
    run_ok(a);
    snprintf(cmd, sizeof cmd, "%s verify --random-model 64,128,2,8,4,512,512 --rollouts %s/kv16.jsonl --kv-type f32 "
             ">/dev/null 2>&1", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(a, sizeof a, "verify --random-model 64,128,2,8,4,512,512 --rollouts %s/kv16.jsonl --cpu", dir);
    run_ok(a);
    snprintf(a, sizeof a, "verify --random-model 64,128,2,8,4,512,512 --rollouts %s/kv16.jsonl --cpu-reference", dir);
    run_ok(a);
    snprintf(a, sizeof a, "generate --random-model 64,128,2,8,4,512,512 --prompts %s -n 20 --seed 5 "
             "--rollouts-out %s/kv32.jsonl", prompts, dir);
    run_ok(a);
    snprintf(cmd, sizeof cmd, "grep -q kv_type %s/kv32.jsonl", dir);
    assert_int_equal(tu_run(cmd, NULL), 1);
    (void)model;
}

/* convert onto its own input (each format) gives what a fresh conversion
 * gives, and the llama2.c model onto itself keeps its logits. */
static void test_convert_onto_input(void **state) {
    (void)state;
    char model[2048], ids[2048], dir[256], a[8192];
    if (!shared_copy("stories260K/stories260K.bin", model, sizeof model) ||
        !shared_copy("stories260K/ref/greedy_onceuponatime_n64.ids", ids, sizeof ids))
        skip();
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(a, sizeof a, "convert --in %s --out %s/m.bin", model, dir);
    run_ok(a); /* m.bin: the writer's bytes (freq_cis zeroed), a fresh conversion */
    snprintf(a, sizeof a, "logits --model %s/m.bin --ids %s --out %s/before.f32", dir, ids, dir);
    run_ok(a);
    const char *outs[] = {"m.bin", "m.gguf", "hf"};
    for (int i = 0; i < 3; i++) {
        if (i > 0) {
            snprintf(a, sizeof a, "convert --in %s/m.bin --out %s/%s", dir, dir, outs[i]);
            run_ok(a);
        }
        snprintf(a, sizeof a, "convert --in %s/%s --out %s/fresh-%s", dir, outs[i], dir, outs[i]);
        run_ok(a);
        snprintf(a, sizeof a, "convert --in %s/%s --out %s/%s", dir, outs[i], dir, outs[i]);
        run_ok(a); /* onto itself: the input stays mapped while it is replaced */
        char p[1024], q[1024];
        if (i < 2) {
            snprintf(p, sizeof p, "%s/%s", dir, outs[i]);
            snprintf(q, sizeof q, "%s/fresh-%s", dir, outs[i]);
            assert_true(same_file(p, q));
        } else {
            const char *files[] = {"config.json", "model.safetensors"};
            for (int k = 0; k < 2; k++) {
                snprintf(p, sizeof p, "%s/hf/%s", dir, files[k]);
                snprintf(q, sizeof q, "%s/fresh-hf/%s", dir, files[k]);
                assert_true(same_file(p, q));
            }
        }
    }
    snprintf(a, sizeof a, "logits --model %s/m.bin --ids %s --out %s/after.f32", dir, ids, dir);
    run_ok(a);
    char p[1024], q[1024];
    snprintf(p, sizeof p, "%s/before.f32", dir);
    snprintf(q, sizeof q, "%s/after.f32", dir);
    assert_true(same_file(p, q));
}

/* True when dir holds exactly the names in keep (n of them). */
static bool dir_holds_only(const char *dir, const char *const *keep, int n) {
    DIR *d = opendir(dir);
    if (!d) return false;
    int found = 0;
    bool ok = true;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        bool known = false;
        for (int i = 0; i < n; i++) known = known || !strcmp(e->d_name, keep[i]);
        if (!known) fprintf(stderr, "left behind: %s/%s\n", dir, e->d_name);
        ok = ok && known;
        found++;
    }
    closedir(d);
    return ok && found == n;
}

/* Runs args with file writes limited to `blocks` (RLIMIT_FSIZE, SIGXFSZ
 * ignored: write() fails with EFBIG as on a full disk). Expects exit 1 and
 * one line on stderr with `msg` (naming the file). */
static void expect_write_failure(int blocks, const char *args, const char *msg) {
    char cmd[16384], *err;
    snprintf(cmd, sizeof cmd,
             "MESA_SHADER_CACHE_DISABLE=true sh -c \"trap '' XFSZ; ulimit -f %d; exec %s %s 2>&1 >/dev/null\"", blocks,
             tu_bin(), args);
    int rc = tu_run(cmd, &err);
    if (rc != 1 || !strstr(err, msg)) fprintf(stderr, "%s -> %d: %s", args, rc, err);
    assert_int_equal(rc, 1);
    assert_int_equal(lines_with(err, msg), 1);
    free(err);
}

static void test_write_failure_leaves_nothing(void **state) {
    (void)state;
    char dir[256], a[8192], p[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(a, sizeof a, "keygen --out %s/keys", dir);
    expect_write_failure(0, a, "keys/shardcast.key: write failed");
    assert_true(dir_holds_only(dir, NULL, 0)); /* no key, no temporary, no directory */
    run_ok(a);                                 /* and no "exists" afterwards */
    char model[2048], ids[2048], tok[2048];
    if (!shared_copy("stories260K/stories260K.bin", model, sizeof model) ||
        !shared_copy("stories260K/ref/greedy_onceuponatime_n64.ids", ids, sizeof ids) ||
        !shared_copy("stories260K/tok512.bin", tok, sizeof tok))
        return;
    snprintf(a, sizeof a, "%s/keys", dir);
    const char *keys_only[] = {"keys"}, *with_old[] = {"keys", "x.bin"}, *with_prompts[] = {"keys", "x.bin", "p.txt"};
    const char *outs[] = {"x.gguf", "hf", "x.f32"};
    const char *msgs[] = {"x.gguf: write failed", "hf/model.safetensors: write failed", "x.f32: write failed"};
    for (int i = 0; i < 3; i++) {
        if (i < 2) snprintf(a, sizeof a, "convert --in %s --out %s/%s", model, dir, outs[i]);
        else snprintf(a, sizeof a, "logits --model %s --ids %s --out %s/%s", model, ids, dir, outs[i]);
        expect_write_failure(64, a, msgs[i]);
        assert_true(dir_holds_only(dir, keys_only, 1));
    }
    /* an existing output stays as it was */
    snprintf(p, sizeof p, "%s/x.bin", dir);
    write_text(p, "old");
    snprintf(a, sizeof a, "convert --in %s --out %s", model, p);
    expect_write_failure(64, a, "x.bin: write failed");
    assert_true(dir_holds_only(dir, with_old, 2));
    size_t n;
    char *old = (char *)tu_read_file(p, &n);
    assert_string_equal(old, "old");
    free(old);
    snprintf(p, sizeof p, "%s/p.txt", dir);
    write_text(p, "Once upon a time\nThe dog\n");
    snprintf(a, sizeof a, "generate --model %s --tokenizer %s --prompts %s -n 64 --temp 0 --rollouts-out %s/r.jsonl",
             model, tok, p, dir);
    expect_write_failure(1, a, "r.jsonl: ");
    assert_true(dir_holds_only(dir, with_prompts, 3));
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
        {"generate --kv-type f8", "vkswarm: --kv-type: 'f8' is not f16 or f32"},
        {"rl --kv-type f16", "vkswarm rl: --kv-type: this command keeps the f32 KV cache"},
        {"train sft --kv-type f16", "vkswarm train: --kv-type: this command keeps the f32 KV cache"},
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

/* vkswarm mpirun (tools/cmd_mpirun.c), with sh standing in for mpirun: arguments passed on as
 * they are, its exit status returned, the first SIGINT to the wrapper turned into SIGUSR1 to
 * the child and a second into SIGINT; no arguments or a program that cannot run: named. */
static void test_mpirun_wrapper(void **state) {
    (void)state;
    char *out, *err;
    int rc = run_capture("mpirun", &out, &err);
    if (rc != 2 || !strstr(err, "vkswarm mpirun: no mpirun arguments") || !one_clean_line(err) || *out)
        fail_msg("no arguments: status %d, stderr '%s'", rc, err);
    free(out), free(err);
    assert_int_equal(setenv("VKSWARM_MPIRUN", "sh", 1), 0);
    rc = run_capture("mpirun -c 'echo \"$0:$1\"; exit 7' a 'b c'", &out, &err);
    if (rc != 7 || strcmp(out, "a:b c\n")) fail_msg("pass-through: status %d, stdout '%s'", rc, out);
    free(out), free(err);
    /* the child asks its parent (the wrapper) to be interrupted, as a terminal's Ctrl-C would */
    rc = run_capture("mpirun -c 'trap \"echo usr1; exit 5\" USR1; kill -INT $PPID; sleep 20 & wait'", &out, &err);
    if (rc != 5 || strcmp(out, "usr1\n") || !strstr(err, "vkswarm: mpirun: stopping cleanly: SIGUSR1 to every rank"))
        fail_msg("first Ctrl-C: status %d, stdout '%s', stderr '%s'", rc, out, err);
    free(out), free(err);
    rc = run_capture("mpirun -c 'trap \"kill -INT $PPID\" USR1; trap \"echo int; exit 6\" INT; kill -INT $PPID; "
                     "sleep 20 & wait; sleep 20 & wait'", &out, &err);
    if (rc != 6 || strcmp(out, "int\n") || !strstr(err, "vkswarm: mpirun: SIGINT to mpirun"))
        fail_msg("second Ctrl-C: status %d, stdout '%s', stderr '%s'", rc, out, err);
    free(out), free(err);
    /* Open MPI's hang after an abort: its "ranks" end (one with status 3, one killed) and are never reaped
     * (exec keeps them as zombies of the sleeping "mpirun"): ended 5 s later with the ranks' status */
    time_t t0 = time(NULL);
    rc = run_capture("mpirun -c '(exit 3) & sh -c \"kill -9 \\$\\$\" & exec sleep 60'", &out, &err);
    time_t took = time(NULL) - t0;
    if (rc != 3 || took > 30 || !strstr(err, "vkswarm: mpirun: every rank ended 5 s ago but mpirun has not"))
        fail_msg("mpirun hung after its ranks: status %d after %lld s, stderr '%s'", rc, (long long)took, err);
    free(out), free(err);
    assert_int_equal(setenv("VKSWARM_MPIRUN", "/nonexistent/mpirun", 1), 0);
    rc = run_capture("mpirun -np 1 true", &out, &err);
    if (rc != 127 || !strstr(err, "vkswarm: mpirun: cannot run /nonexistent/mpirun: No such file"))
        fail_msg("no mpirun: status %d, stderr '%s'", rc, err);
    free(out), free(err);
    unsetenv("VKSWARM_MPIRUN");
}

/* vkswarm mpirun --join: ompi-server started first (a script standing in: it writes its URI
 * where --report-uri says), mpirun given --ompi-server file:FILE holding that URI ahead of the
 * other arguments, the server ended and its file removed afterwards; a server that cannot run
 * is named. vkswarm join's own mistakes: one line, exit 2. */
static void test_mpirun_join(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char server[1024], mpirun[1024], file_arg[1100], *out, *err;
    snprintf(server, sizeof server, "%s/fake-ompi-server", dir);
    snprintf(mpirun, sizeof mpirun, "%s/fake-mpirun", dir);
    write_text(server, "#!/bin/sh\n[ \"$1 $2\" = '--no-daemonize --report-uri' ] || exit 9\n"
                          "echo '123.0;tcp://127.0.0.1:1' > \"$3\"\nexec sleep 60\n");
    write_text(mpirun, "#!/bin/sh\necho \"$1 $3 $4\"; cat \"${2#file:}\"; echo \"$2\" >&2\n");
    assert_int_equal(chmod(server, 0755) | chmod(mpirun, 0755), 0);
    assert_int_equal(setenv("VKSWARM_OMPI_SERVER", server, 1) | setenv("VKSWARM_MPIRUN", mpirun, 1), 0);
    int rc = run_capture("mpirun --join -np 2", &out, &err);
    if (rc != 0 || strcmp(out, "--ompi-server -np 2\n123.0;tcp://127.0.0.1:1\n"))
        fail_msg("--join: status %d, stdout '%s', stderr '%s'", rc, out, err);
    snprintf(file_arg, sizeof file_arg, "%s", err);
    file_arg[strcspn(file_arg, "\n")] = 0;
    struct stat st;
    if (strncmp(file_arg, "file:", 5) || stat(file_arg + 5, &st) == 0) fail_msg("the URI file '%s' was left", file_arg);
    free(out), free(err);
    assert_int_equal(setenv("VKSWARM_OMPI_SERVER", "/nonexistent/ompi-server", 1), 0);
    rc = run_capture("mpirun --join -np 2 true", &out, &err);
    if (rc != 1 || !strstr(err, "cannot run /nonexistent/ompi-server") || !strstr(err, "exited before it was ready") || *out)
        fail_msg("no ompi-server: status %d, stderr '%s'", rc, err);
    free(out), free(err);
    unsetenv("VKSWARM_OMPI_SERVER");
    /* --join-run: mpirun given the server of a run's join line (from its file), the rest unchanged */
    char line[1100], args[2300];
    snprintf(line, sizeof line, "%s/join.uri", dir);
    write_text(line, "9.0:77@123.0;tcp://127.0.0.1:1\n");
    write_text(mpirun, "#!/bin/sh\necho \"$*\"\n");
    snprintf(args, sizeof args, "mpirun --join-run %s -np 2 vkswarm join --run %s", line, line);
    rc = run_capture(args, &out, &err);
    char want[2400];
    snprintf(want, sizeof want, "--ompi-server 123.0;tcp://127.0.0.1:1 -np 2 vkswarm join --run %s\n", line);
    if (rc != 0 || strcmp(out, want)) fail_msg("--join-run: status %d, stdout '%s', stderr '%s'", rc, out, err);
    free(out), free(err);
    unsetenv("VKSWARM_MPIRUN");
    assert_int_equal(setenv("OMPI_COMM_WORLD_SIZE", "2", 1), 0); /* as under mpirun without --ompi-server */
    rc = run_capture("join --run x@y", &out, &err);
    if (rc != 2 || !strstr(err, "vkswarm join: under mpirun, mpirun must know the run's ompi-server: vkswarm mpirun "
                            "--join-run x@y -np 2") || !one_clean_line(err))
        fail_msg("join under a plain mpirun: status %d, stderr '%s'", rc, err);
    free(out), free(err);
    unsetenv("OMPI_COMM_WORLD_SIZE");
    static const struct { const char *args, *msg; } bad[] = {
        {"mpirun --join-run", "vkswarm mpirun: --join-run needs the run's DIR/join.uri"},
        {"mpirun --join-run /nonexistent/join.uri -np 2 true", "vkswarm: mpirun: --join-run /nonexistent/join.uri: no such file, nor a join line"},
        {"join", "vkswarm join: --run URI|FILE is required"},
        {"join --run x@y --model", "vkswarm join: option '--model' needs a value"},
        {"join --run /nonexistent/join.uri", "vkswarm: join: --run /nonexistent/join.uri: no such file, nor a join line"},
        {"join --run x@y --random-model 64,128,1,4,4,32,32", "vkswarm join: the model is the run's base: --model only"},
        {"rl --init tiny --join-allow /nonexistent", "vkswarm rl: --join-allow goes with --join"},
        {"join --run x@y --key /nonexistent", "vkswarm: join: --key: /nonexistent/shardcast.key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        rc = run_capture(bad[i].args, &out, &err);
        if (rc != 2 || strncmp(err, bad[i].msg, strlen(bad[i].msg)) || !one_clean_line(err))
            fail_msg("'%s': status %d, stderr '%s'", bad[i].args, rc, err);
        free(out), free(err);
    }
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
    if (!strstr(err, ": cannot read: Is a directory") || strstr(err, "no prompts")) fail_msg("--prompts DIR: '%s'", err);
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
    write_text(path, line);
    snprintf(args, sizeof args, "generate %s --prompts %s -n 2 --seed 1", rnd, path);
    if (run_capture(args, &out, &err) != 0) fail_msg("1 MiB prompt line: '%s'", err);
    free(out), free(err);
    strcpy(line + mib, " \n");
    write_text(path, line);
    assert_int_equal(run_capture(args, &out, &err), 2);
    assert_non_null(strstr(err, "longer than 1048576 bytes"));
    free(out), free(err), free(line);
    /* detokenize: a bad word is named, nothing is printed */
    const char *tok = tu_shared_path("stories260K/tok512.bin");
    if (!tok) return;
    snprintf(path, sizeof path, "%s/ids.txt", dir);
    write_text(path, "1 2 x\n");
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
    /* another model: the sample is rejected, status 2 (wrong weights, issue 36): both hashes; a file from
     * generate (as one written by an older vkswarm rl) does not say which policy step made it */
    snprintf(args, sizeof args, "verify --random-model 64,128,2,4,4,32,32 --rollouts %s --cpu", path);
    assert_int_equal(run_capture(args, &out, &err), 2);
    if (!strstr(err, "vkswarm: verify: wrong weights: ") || !strstr(err, " was made by model_hash ") ||
        !strstr(err, ", --model has model_hash ") || !strstr(err, "the file does not say which policy step made it"))
        fail_msg("stderr: '%s'", err);
    const char *want = "1-0\\x09accepted\\x0a1-0-shadow\\x1b[2J\trejected: ";
    if (strncmp(out, want, strlen(want)) || strstr(out, "\taccepted")) fail_msg("plain output: '%s'", out);
    char *second = strchr(out, '\n');
    assert_non_null(second);
    assert_non_null(strstr(second + 1, "verified 1 samples: 0 accepted, 1 rejected\n"));
    free(out), free(err);
}


/* ---- verify --sample-fraction / --sample: group verdicts (issue 27) ---- */

static const char group_model[] = "--random-model 64,128,1,4,4,32,32";
static const bool group_cheat[16] = {[9] = true, [12] = true, [14] = true}; /* three of the seed-22 run */

/* Two generate runs (seeds 21 and 22, 8 prompts each) in one file; samples
 * 9, 12 and 14 (of the second run) carry a first output token their sampler
 * did not draw. */
static void write_group_file(const char *dir, char *path, size_t len) {
    char cmd[4096], one[600];
    snprintf(one, sizeof one, "%s/gp.txt", dir);
    write_text(one, "3 4 5\n6 7\n8\n9 10 11 12\n13 14\n15\n16 17 18\n19\n");
    vks_rollout_file rf[2];
    for (int r = 0; r < 2; r++) {
        snprintf(cmd, sizeof cmd, "%s generate %s --prompts %s -n 12 --seed %d --rollouts-out %s/g%d.jsonl >/dev/null 2>&1",
                 tu_bin(), group_model, one, 21 + r, dir, r);
        assert_int_equal(tu_run(cmd, NULL), 0);
        snprintf(cmd, sizeof cmd, "%s/g%d.jsonl", dir, r);
        assert_int_equal(vks_rollout_read(cmd, &rf[r]), VKS_OK);
        assert_int_equal(rf[r].n_samples, 8);
    }
    snprintf(path, len, "%s/groups.jsonl", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(vks_rollout_write_header(f, &rf[0].header), VKS_OK);
    for (int i = 0; i < 16; i++) {
        vks_rollout_sample *x = &rf[i / 8].samples[i % 8];
        if (group_cheat[i]) x->output_ids[0] = 3 + (x->output_ids[0] + 7) % 29; /* another token (vocabulary 32), never a stop token */
        assert_int_equal(vks_rollout_write_sample(f, x), VKS_OK);
    }
    assert_int_equal(fclose(f), 0);
    vks_rollout_file_free(&rf[0]);
    vks_rollout_file_free(&rf[1]);
}

/* The line of sample i (its id is "SEED-j") in jsonl output, or NULL. */
static const char *sample_line(const char *out, int i) {
    char key[64];
    snprintf(key, sizeof key, "{\"id\":\"%d-%d\",", 21 + i / 8, i % 8);
    return strstr(out, key);
}

static bool line_has(const char *line, const char *what) {
    const char *end = line ? strchr(line, '\n') : NULL, *at = line ? strstr(line, what) : NULL;
    return at && end && at < end;
}

static int count_lines(const char *s) {
    int n = 0;
    for (; *s; s++) n += *s == '\n';
    return n;
}

/* C(n - k, m) / C(n, m), computed here on its own. */
static double hypergeometric_none(int n, int k, int m) {
    double p = 1;
    for (int i = 0; i < m; i++) p *= n - k - i > 0 ? (double)(n - k - i) / (n - i) : 0;
    return p;
}

static void test_verify_group_sampling(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char path[600], args[2048], *out, *err;
    write_group_file(dir, path, sizeof path);
    /* without the options: as always, every cheat named, nothing else on stdout */
    snprintf(args, sizeof args, "verify %s --cpu --jsonl --rollouts %s", group_model, path);
    assert_int_equal(run_capture(args, &out, &err), 1);
    assert_int_equal(count_lines(out), 16);
    for (int i = 0; i < 16; i++) {
        const char *line = sample_line(out, i);
        if (!line_has(line, group_cheat[i] ? "\"accepted\":false,\"reason\":\"TOPLOC chunk 0" : "\"accepted\":true,\"reason\":\"\"}"))
            fail_msg("sample %d: %s", i, out);
    }
    assert_null(strstr(out, "checked"));
    assert_non_null(strstr(err, "verified 16 samples: 13 accepted, 3 rejected\n"));
    free(out), free(err);
    /* every sample checked: the honest group passes, the other is rejected whole, each cheat with its reason */
    snprintf(args, sizeof args, "verify %s --cpu --rollouts %s --sample-fraction 1 --sample-seed 5", group_model, path);
    assert_int_equal(run_capture(args, &out, &err), 1);
    if (!strstr(out, "21-0\taccepted\n") || !strstr(out, "22-1\trejected: TOPLOC chunk 0") ||
        !strstr(out, "22-0\trejected: checked and passed; group rejected: 3 of 8 checked samples failed, the first 22-1\n") ||
        !strstr(out, "group 1 (seed 21): accepted: 8 of 8 checked; a group with >= 10% bad rollouts passes with "
                     "probability <= 0\n") ||
        !strstr(out, "group 2 (seed 22): rejected: 3 of 8 checked failed, the first 22-1; its 8 samples rejected\n") ||
        !strstr(out, "verified 16 samples: 8 accepted, 8 rejected (2 groups; 16 samples checked, 0 accepted unverified)\n"))
        fail_msg("--sample-fraction 1: '%s'", out);
    free(out), free(err);
    /* 2 of 8 checked per group under many secrets */
    bool first[16], differs = false;
    int rejected = 0;
    for (int secret = 1; secret <= 16; secret++) {
        snprintf(args, sizeof args, "verify %s --cpu --jsonl --rollouts %s --sample 2 --sample-seed %d --bad-fraction 0.25",
                 group_model, path, secret);
        int rc = run_capture(args, &out, &err);
        bool checked[16], bad_checked = false;
        int n_checked = 0;
        for (int i = 0; i < 16; i++) {
            const char *line = sample_line(out, i);
            checked[i] = line_has(line, "\"checked\":true}");
            if (!checked[i] && !line_has(line, "\"checked\":false}")) fail_msg("sample %d: %s", i, out);
            n_checked += checked[i];
            bad_checked |= checked[i] && group_cheat[i];
        }
        assert_int_equal(n_checked, 4);
        for (int i = 8; i < 16; i++) /* the group's verdict: rejected exactly when a checked sample is a cheat */
            if (!line_has(sample_line(out, i), bad_checked ? "\"accepted\":false" : "\"accepted\":true"))
                fail_msg("secret %d, sample %d (a cheat checked: %d): %s", secret, i, bad_checked, out);
        for (int i = 0; i < 8; i++) assert_true(line_has(sample_line(out, i), "\"accepted\":true"));
        assert_int_equal(rc, bad_checked ? 1 : 0);
        rejected += bad_checked;
        /* the stated bound, k = ceil(0.25 * 8) = 2 bad of 8, 2 checked: 15/28 */
        char want[256];
        snprintf(want, sizeof want, "{\"group\":2,\"seed\":22,\"samples\":8,\"checked\":2,\"failed\":%d,\"accepted\":%s,"
                 "\"bad_fraction\":0.25,\"pass_bound\":%.17g}\n", bad_checked ? (checked[9] + checked[12] + checked[14]) : 0,
                 bad_checked ? "false" : "true", hypergeometric_none(8, 2, 2));
        if (!strstr(out, want)) fail_msg("want '%s' in '%s'", want, out);
        assert_true(fabs(hypergeometric_none(8, 2, 2) - 15.0 / 28) < 1e-15);
        if (secret == 1) memcpy(first, checked, sizeof first);
        else differs |= memcmp(first, checked, sizeof first) != 0;
        free(out), free(err);
        if (secret == 1) { /* the same secret: the same subset */
            char *again;
            assert_int_equal(run_capture(args, &again, &err), rc);
            for (int i = 0; i < 16; i++) assert_true(line_has(sample_line(again, i), checked[i] ? "\"checked\":true}" : "\"checked\":false}"));
            free(again), free(err);
        }
    }
    assert_true(differs);
    fprintf(stderr, "group of 8 with 3 cheats, 2 checked: rejected under %d of 16 secrets (exact chance %.3f)\n", rejected,
            1 - hypergeometric_none(8, 3, 2));
    /* the plain line states the bound (the first secret whose draw misses the 3 cheats of 16: chance 0.65 each) */
    bool seen_accepted = false;
    for (int secret = 1; secret <= 20 && !seen_accepted; secret++) {
        snprintf(args, sizeof args, "verify %s --cpu --rollouts %s --sample 2 --sample-seed %d --group-by file",
                 group_model, path, secret);
        int rc = run_capture(args, &out, &err);
        assert_int_equal(count_lines(out), 16 + 1 + 1);
        seen_accepted = rc == 0;
        char want[256];
        if (seen_accepted) snprintf(want, sizeof want, "group 1 (file): accepted: 2 of 16 checked; a group with >= 10%% bad "
                                    "rollouts passes with probability <= %.4g\n", hypergeometric_none(16, 2, 2));
        else snprintf(want, sizeof want, "group 1 (file): rejected: ");
        if (!strstr(out, want)) fail_msg("want '%s' in '%s'", want, out);
        if (seen_accepted && (!strstr(out, "22-1\taccepted unverified\n") || !strstr(out, "14 accepted unverified)")))
            fail_msg("'%s'", out);
        free(out), free(err);
    }
    assert_true(seen_accepted);
    /* option mistakes */
    const char *bad[] = {"--sample 0", "--sample-fraction 0", "--sample-fraction 1.5", "--sample-seed 3",
                         "--sample 2 --group-by batch", "--sample 2 --sample-fraction 0.5", "--sample 2 --bad-fraction 0",
                         "--sample 2 --sample-fraction 1", "--bad-fraction 0.1", "--group-by seed"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "verify %s --cpu --rollouts %s %s", group_model, path, bad[i]);
        assert_int_equal(run_capture(args, &out, &err), 2);
        if (*out || !one_clean_line(err)) fail_msg("%s: '%s' '%s'", bad[i], out, err);
        free(out), free(err);
    }
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
    write_text(path, "Once \xff\xfe upon \xc3\x28 a \xe2\x80\xa8 time \x1b[2J\n");
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

/* ---- the built-in tiny model (issue 11) ---- */

/* Runs a shell pipeline (%s is the binary, twice at most); returns stdout. */
static char *pipe_ok(const char *fmt, const char *arg) {
    char cmd[16384], *out;
    snprintf(cmd, sizeof cmd, fmt, tu_bin(), arg, tu_bin(), arg);
    int rc = tu_run(cmd, &out);
    if (rc) fail_msg("'%s' -> %d", cmd, rc);
    return out;
}

/* The model's own tokenizer: one id per byte after BOS, and the bytes back. */
static void check_tiny_tokenizer(const char *model) {
    char *ids = pipe_ok("printf 'a\\377\\303( z' | %s tokenize --model %s", model);
    assert_string_equal(ids, "256 97 255 195 40 32 122\n");
    free(ids);
    char *text = pipe_ok("printf 'a\\377\\303( z\\n' | %s tokenize --model %s | %s detokenize --model %s", model);
    assert_string_equal(text, "a\377\303( z\n");
    free(text);
}

static void check_tiny_generates(const char *dir, const char *model) {
    char args[8192], *out, *err;
    snprintf(args, sizeof args, "generate --model %s --prompt ab -n 24 --temp 0", model);
    int rc = run_capture(args, &out, &err);
    if (rc || strncmp(out, "ab", 2)) fail_msg("%s: status %d, stdout '%s', stderr '%s'", args, rc, out, err);
    free(out), free(err);
    char prompts[1024];
    snprintf(prompts, sizeof prompts, "%s/tiny-prompts.txt", dir);
    write_text(prompts, "ab\n\xc3\xa9\n");
    snprintf(args, sizeof args, "generate --model %s --prompts %s -n 24 --temp 1 --seed 9", model, prompts);
    rc = run_capture(args, &out, &err);
    if (rc || !strstr(out, "\"ids\":[256,97,98,") || !strstr(out, "\"ids\":[256,195,169,"))
        fail_msg("%s: status %d, stdout '%s', stderr '%s'", args, rc, out, err);
    free(out), free(err);
}

static float *tiny_logits(const char *dir, const char *model, const char *name) {
    char args[8192], path[1024];
    snprintf(path, sizeof path, "%s/%s.f32", dir, name);
    snprintf(args, sizeof args, "logits --model %s --ids %s/tiny-ids.txt --out %s", model, dir, path);
    run_ok(args);
    size_t n = 0;
    float *l = (float *)tu_read_file(path, &n);
    assert_int_equal(n, 5 * 259 * sizeof(float));
    return l;
}

static void test_init_tiny(void **state) {
    (void)state;
    char dir[256], a[8192], p[1024], q[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    /* The same seed writes the same bytes; another seed other weights. */
    const char *outs[] = {"t.gguf", "t-again.gguf", "t4.gguf", "hf", "hf-again"};
    const int seeds[] = {3, 3, 4, 3, 3};
    for (int i = 0; i < 5; i++) {
        snprintf(a, sizeof a, "convert --init tiny --seed %d --out %s/%s", seeds[i], dir, outs[i]);
        run_ok(a);
    }
    snprintf(p, sizeof p, "%s/t.gguf", dir);
    snprintf(q, sizeof q, "%s/t-again.gguf", dir);
    assert_true(same_file(p, q));
    snprintf(q, sizeof q, "%s/t4.gguf", dir);
    assert_false(same_file(p, q));
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int k = 0; k < 4; k++) {
        snprintf(p, sizeof p, "%s/hf/%s", dir, files[k]);
        snprintf(q, sizeof q, "%s/hf-again/%s", dir, files[k]);
        assert_true(same_file(p, q));
    }
    /* Both checkpoints carry the tokenizer, run, and give the same logits. */
    snprintf(p, sizeof p, "%s/tiny-ids.txt", dir);
    write_text(p, "256 72 105 255 10\n");
    float *ref = NULL;
    const char *models[] = {"t.gguf", "hf"};
    for (int i = 0; i < 2; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, models[i]);
        check_tiny_tokenizer(p);
        check_tiny_generates(dir, p);
        float *l = tiny_logits(dir, p, models[i]);
        double d = 0;
        for (int k = 0; ref && k < 5 * 259; k++) d = fmax(d, fabs((double)l[k] - ref[k]));
        assert_true(d <= 1e-5);
        if (ref) free(l);
        else ref = l;
    }
    free(ref);
    /* GGUF -> Hugging Face and back keep the tokenizer. */
    snprintf(a, sizeof a, "convert --in %s/t.gguf --out %s/from-gguf", dir, dir);
    run_ok(a);
    snprintf(a, sizeof a, "convert --in %s/hf --out %s/from-hf.gguf", dir, dir);
    run_ok(a);
    snprintf(p, sizeof p, "%s/from-gguf", dir);
    check_tiny_tokenizer(p);
    snprintf(p, sizeof p, "%s/from-hf.gguf", dir);
    check_tiny_tokenizer(p);
    /* Refused: exit 2, one line. */
    const char *bad[] = {"--init tiny --out %s/t.bin", "--init huge --out %s/x.gguf",
                         "--init tiny --in %s/t.gguf --out x.gguf", "--init tiny --tokenizer %s/t.gguf --out x.gguf",
                         "--init tiny --type q8_0 --out %s/x-hf", "--init tiny --seed -1 --out %s/x.gguf"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char args[8192], *out, *err;
        snprintf(args, sizeof args, "convert ");
        snprintf(args + 8, sizeof args - 8, bad[i], dir);
        int rc = run_capture(args, &out, &err);
        if (rc != 2 || !one_clean_line(err)) fail_msg("'%s': status %d, stderr '%s'", args, rc, err);
        free(out), free(err);
    }
    /* A failed write leaves none of the four files. */
    char sub[512];
    snprintf(sub, sizeof sub, "%s/wf", dir);
    assert_int_equal(mkdir(sub, 0777), 0);
    snprintf(a, sizeof a, "convert --init tiny --out %s/hf", sub);
    expect_write_failure(64, a, "hf/model.safetensors: write failed");
    assert_true(dir_holds_only(sub, NULL, 0));
}

/* train sft from --init tiny: the three result lines, metrics per step, a
 * checkpoint that generate and eval read, and 2 steps + --resume 2 steps
 * giving the 4-step run's losses and weights bit for bit; bad data refused
 * naming file and line. */
static char *read_text(const char *path) {
    size_t len;
    char *s = (char *)tu_read_file(path, &len);
    assert_non_null(s);
    return s;
}

/* eval --data of a copy of the checkpoint with every weight times 1e10
 * (finite, so loading takes it): the activations overflow. No "nan" reaches the
 * JSON on stdout (it printed "mean_loss": nan, exit 0): a message, exit 2. */
static void eval_of_overflowing_weights(const char *dir, const char *data) {
    char cmd[4096], path[1024], *out, *err;
    snprintf(cmd, sizeof cmd, "cp -r %s/a/step-000000004 %s/huge", dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(path, sizeof path, "%s/huge/model.safetensors", dir);
    size_t len = 0;
    unsigned char *st = tu_read_file(path, &len);
    assert_non_null(st);
    uint64_t header = 0;
    for (int i = 7; i >= 0; i--) header = header << 8 | st[i];
    assert_true(8 + header < len);
    for (size_t i = 8 + (size_t)header; i + 4 <= len; i += 4) { /* F32 tensors */
        float w;
        memcpy(&w, st + i, 4);
        w *= 1e10f;
        memcpy(st + i, &w, 4);
    }
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(st, 1, len, f), len);
    fclose(f);
    free(st);
    snprintf(cmd, sizeof cmd, "eval --model %s/huge --data %s", dir, data);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (*out || !strstr(err, "add.jsonl is NaN, not a finite number") || strstr(err, "Sanitizer")) fail_msg("eval, huge weights: '%s' '%s'", out, err);
    free(out), free(err);
}

static void test_train_sft_resume(void **state) {
    (void)state;
    char dir[256]; /* a copy: run_capture's tu_tmpdir() reuses the buffer */
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char data[512], cmd[4096], path[1024];
    snprintf(data, sizeof data, "%s/add.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 12; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, 2 * i, 3 * i);
    fclose(f);
    const char *args = "train sft --init tiny --batch 4 --micro-batch 2 --lr 3e-3 --keep 2";
    char *out;
    snprintf(cmd, sizeof cmd, "%s %s --data %s --steps 4 --out %s/a 2>%s/a.err", tu_bin(), args, data, dir, dir);
    assert_int_equal(tu_run(cmd, &out), 0);
    snprintf(path, sizeof path, "metrics: %s/a/metrics.jsonl\nplot: %s/a/loss.svg\nfinal checkpoint: %s/a/step-000000004\n",
             dir, dir, dir);
    assert_string_equal(out, path);
    free(out);
    snprintf(cmd, sizeof cmd, "%s %s --data %s --steps 2 --out %s/b 2>/dev/null && %s %s --data %s --steps 4 --out %s/b "
             "--resume 2>%s/b.err", tu_bin(), args, data, dir, tu_bin(), args, data, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    /* "loss A -> B" compares means over windows of the steps (here 1 of 4: 10%, at least 1) and says so */
    snprintf(path, sizeof path, "%s/a.err", dir);
    out = read_text(path);
    if (!strstr(out, " (mean of the first and of the last 1 of 4 steps)\n")) fail_msg("train: %s", out);
    free(out);
    snprintf(path, sizeof path, "%s/b.err", dir);
    out = read_text(path);
    if (!strstr(out, " (mean of the first and of the last 1 of 2 steps since the resume)\n")) fail_msg("train: %s", out);
    free(out);
    snprintf(path, sizeof path, "%s/a/metrics.jsonl", dir);
    char *a = read_text(path);
    snprintf(path, sizeof path, "%s/b/metrics.jsonl", dir);
    char *b = read_text(path);
    /* the same 4 lines up to the rate column */
    int lines = 0;
    for (char *p = a, *q = b; *p; lines++) {
        char *pe = strstr(p, "\"tokens_per_s\""), *qe = strstr(q, "\"tokens_per_s\"");
        assert_non_null(pe);
        assert_non_null(qe);
        assert_int_equal(pe - p, qe - q);
        assert_memory_equal(p, q, (size_t)(pe - p));
        p = strchr(pe, '\n') + 1;
        q = strchr(qe, '\n') + 1;
    }
    assert_int_equal(lines, 4);
    free(a);
    free(b);
    snprintf(cmd, sizeof cmd, "cmp %s/a/step-000000004/model.safetensors %s/b/step-000000004/model.safetensors && "
             "cmp %s/a/step-000000004/optimizer.safetensors %s/b/step-000000004/optimizer.safetensors", dir, dir, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s eval --model %s/a/step-000000004 --data %s 2>/dev/null", tu_bin(), dir, data);
    assert_int_equal(tu_run(cmd, &out), 0);
    double loss = -1, acc = -1;
    const char *l = strstr(out, "\"mean_loss\": "), *t = strstr(out, "\"token_accuracy\": ");
    assert_non_null(l);
    assert_non_null(t);
    loss = atof(l + 13);
    acc = atof(t + 18);
    assert_true(loss > 0 && loss < 5.6 && acc >= 0 && acc <= 1); /* trained below the uniform 5.56 */
    free(out);
    eval_of_overflowing_weights(dir, data);
    f = fopen(data, "a");
    fputs("{\"prompt\": 3}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s --data %s --steps 1 --out %s/c 2>&1 >/dev/null", tu_bin(), args, data, dir);
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "line 13"));
    free(out);
    /* eval on it: one line, exit 2, and the device freed first (the ASan build's
     * leak check failed this run: the GPU context was held at exit) */
    char *err;
    snprintf(cmd, sizeof cmd, "eval --model %s/a/step-000000004 --data %s", dir, data);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (*out || !strstr(err, "add.jsonl: line 13: ") || strstr(err, "Sanitizer"))
        fail_msg("eval, bad line: '%s' '%s'", out, err);
    free(out), free(err);
}

/* The last line of a command's stderr (the device line comes first). */
static const char *last_line(const char *err) {
    size_t n = strlen(err);
    const char *p = err + (n ? n - 1 : 0);
    while (p > err && p[-1] != '\n') p--;
    return p;
}

/* Metrics files equal line for line up to each line's rate column. */
static void same_metrics(const char *pa, const char *pb, int want_lines) {
    char *a = read_text(pa), *b = read_text(pb);
    int lines = 0;
    for (char *p = a, *q = b; *p; lines++) {
        char *pe = strstr(p, "\"tokens_per_s\""), *qe = strstr(q, "\"tokens_per_s\"");
        assert_non_null(pe);
        assert_non_null(qe);
        assert_int_equal(pe - p, qe - q);
        assert_memory_equal(p, q, (size_t)(pe - p));
        p = strchr(pe, '\n') + 1;
        q = strchr(qe, '\n') + 1;
    }
    assert_int_equal(lines, want_lines);
    free(a);
    free(b);
}

/* train sft --lora-rank: checkpoints hold the adapter in PEFT's layout
 * (and the moments, state.json); 2 steps then --resume to 4 equal 4
 * straight, bit for bit; another base, rank or a full run's resume are
 * refused; bad ranks and targets exit 2 with one line and make no OUT; a
 * run whose plan exceeds the device (VKSWARM_DEVICE_MEMORY) exits 2 with
 * the plan in one line. */
static void test_train_sft_lora(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char data[512], cmd[4096], path[1024], base1[600], base2[600];
    snprintf(data, sizeof data, "%s/add.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 12; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, 2 * i, 3 * i);
    fclose(f);
    /* two bases: the checkpoints of a short full run (models with their tokenizer) */
    snprintf(cmd, sizeof cmd, "%s train sft --init tiny --batch 4 --lr 3e-3 --data %s --steps 2 --save-every 1 "
             "--out %s/full >/dev/null 2>&1", tu_bin(), data, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(base1, sizeof base1, "%s/full/step-000000001", dir);
    snprintf(base2, sizeof base2, "%s/full/step-000000002", dir);
    const char *args = "train sft --batch 4 --micro-batch 2 --lr 3e-3 --keep 2 --lora-rank 4 --lora-alpha 8 "
                       "--lora-targets q,v,down,up";
    char *out, *err;
    snprintf(cmd, sizeof cmd, "%s %s --model %s --data %s --steps 4 --out %s/a 2>%s/a.err", tu_bin(), args, base1,
             data, dir, dir);
    assert_int_equal(tu_run(cmd, &out), 0);
    /* the peak of the device bytes held beside the plan: within 1% (test_train_lora test_peak_is_the_plan
     * checks the bytes against the plan's own slack) */
    snprintf(path, sizeof path, "%s/a.err", dir);
    char *log = read_text(path);
    const char *mem = strstr(log, "vkswarm: train: device memory: peak ");
    double peak_mib, plan_mib, ratio, rss_mib;
    assert_non_null(mem);
    assert_int_equal(sscanf(mem, "vkswarm: train: device memory: peak %lf MiB, plan %lf MiB (peak/plan %lf); "
                            "process peak RSS %lf MiB", &peak_mib, &plan_mib, &ratio, &rss_mib), 4);
    if (!(peak_mib > 0 && ratio >= 0.99 && ratio <= 1.01 && rss_mib > 0)) fail_msg("%s", mem);
    free(log);
    char expect[2048];
    snprintf(expect, sizeof expect, "metrics: %s/a/metrics.jsonl\nplot: %s/a/loss.svg\nfinal checkpoint: "
             "%s/a/step-000000004\nadapter: %s/a/step-000000004\n", dir, dir, dir, dir);
    assert_string_equal(out, expect);
    free(out);
    snprintf(path, sizeof path, "%s/a/step-000000004/adapter_config.json", dir);
    char *config = read_text(path);
    assert_non_null(strstr(config, "\"r\": 4"));
    assert_non_null(strstr(config, "\"peft_type\": \"LORA\""));
    assert_non_null(strstr(config, "\"base_model_hash\""));
    assert_non_null(strstr(config, "\"down_proj\""));
    assert_null(strstr(config, "\"k_proj\""));
    free(config);
    snprintf(cmd, sizeof cmd, "%s %s --model %s --data %s --steps 2 --out %s/b 2>/dev/null >/dev/null && %s %s --model %s "
             "--data %s --steps 4 --out %s/b --resume 2>/dev/null >/dev/null", tu_bin(), args, base1, data, dir, tu_bin(),
             args, base1, data, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    char pa[600], pb[600];
    snprintf(pa, sizeof pa, "%s/a/metrics.jsonl", dir);
    snprintf(pb, sizeof pb, "%s/b/metrics.jsonl", dir);
    same_metrics(pa, pb, 4);
    snprintf(cmd, sizeof cmd, "cd %s && for f in adapter_model.safetensors adapter_config.json optimizer.safetensors; do "
             "cmp a/step-000000004/$f b/step-000000004/$f || exit 1; done && ! test -e a/step-000000004/model.safetensors",
             dir);
    assert_int_equal(tu_run(cmd, NULL), 0);

    /* resuming over another base, with another rank, or as full fine-tuning: refused, exit 2, one line */
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --steps 5 --out %s/a --resume", args, base2, data, dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (!one_clean_line(last_line(err)) || !strstr(last_line(err), "base_model_hash") ||
        !strstr(last_line(err), "full/step-000000002"))
        fail_msg("another base: '%s'", err);
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "%s --lora-rank 2 --model %s --data %s --steps 5 --out %s/a --resume", args, base1, data, dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (!one_clean_line(last_line(err)) || !strstr(last_line(err), "rank 4")) fail_msg("another rank: '%s'", err);
    free(out), free(err);
    snprintf(cmd, sizeof cmd, "train sft --batch 4 --micro-batch 2 --lr 3e-3 --keep 2 --model %s --data %s --steps 5 "
             "--out %s/a --resume", base1, data, dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (!one_clean_line(last_line(err)) || !strstr(last_line(err), "LoRA"))
        fail_msg("full resume of a LoRA run: '%s'", err);
    free(out), free(err);

    /* bad LoRA options: one line, exit 2, nothing made */
    const char *bad[] = {"--lora-rank 0", "--lora-rank 129", "--lora-rank 4 --lora-targets q,lm_head",
                         "--lora-alpha 8", "--lora-rank 4 --lora-alpha -1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "train sft --init tiny --data %s --steps 1 --out %s/bad %s", data, dir, bad[i]);
        assert_int_equal(run_capture(cmd, &out, &err), 2);
        if (*out || !one_clean_line(last_line(err))) fail_msg("%s: '%s' '%s'", bad[i], out, err);
        free(out), free(err);
        snprintf(path, sizeof path, "%s/bad", dir);
        assert_int_equal(access(path, F_OK), -1);
    }
    /* a device too small for the plan: exit 2, the plan in one line (full fine-tuning and LoRA) */
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd, "VKSWARM_DEVICE_MEMORY=1M %s train sft --init tiny --data %s --steps 1 --out %s/small%d "
                 "%s 2>&1 >/dev/null", tu_bin(), data, dir, k, k ? "--lora-rank 4" : "");
        assert_int_equal(tu_run(cmd, &out), 2);
        const char *line = strstr(out, "vkswarm: trainer: the run needs ");
        if (!line || !strstr(line, "1.0 MiB are free") || !strstr(line, "optimizer") || !strstr(line, "total") ||
            strchr(line, '\n') != line + strlen(line) - 1)
            fail_msg("too small a device: '%s'", out);
        free(out);
    }
}

/* The largest |x[i] - y[i]|. */
static double max_diff(const float *x, const float *y, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)x[i] - (double)y[i]));
    return m;
}

/* train sft --lora-modules-to-save norm (issue 40 item 6): the adapter
 * directory holds the trained final norm as PEFT names it
 * (base_model.model.model.norm.weight, "modules_to_save": ["norm"]); logits
 * --lora (GPU and --cpu) and convert --lora use it: they match the float64
 * forward with it and differ from base + adapter without it; a GGUF adapter
 * cannot hold it (refused); 2 steps then --resume equal 4 straight, bit for
 * bit; a resume without the option, another module or no --lora-rank: exit 2,
 * one line. */
static void test_train_sft_lora_norm(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s/lnorm", tu_tmpdir());
    mkdir(dir, 0777);
    char data[512], cmd[8192], path[1024], base[600], ad[600], ids[600], *out, *err;
    snprintf(data, sizeof data, "%s/rev.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 16; i++) {
        char w[6];
        for (int k = 0; k < 5; k++) w[k] = (char)('a' + (i * 3 + k * 5) % 8);
        w[5] = 0;
        fprintf(f, "{\"prompt\": \"reverse %s =\", \"completion\": \" %c%c%c%c%c.\"}\n", w, w[4], w[3], w[2], w[1], w[0]);
    }
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train sft --init tiny --batch 4 --lr 3e-3 --data %s --steps 1 --out %s/full "
             ">/dev/null 2>&1", tu_bin(), data, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(base, sizeof base, "%s/full/step-000000001", dir);
    const char *args = "train sft --batch 4 --lr 1e-2 --lora-rank 4 --lora-alpha 8 --lora-modules-to-save norm";
    snprintf(cmd, sizeof cmd, "%s --model %s --data %s --steps 4 --out %s/a", args, base, data, dir);
    if (run_capture(cmd, &out, &err)) fail_msg("%s: %s", cmd, err);
    free(out), free(err);
    snprintf(ad, sizeof ad, "%s/a/step-000000004", dir);
    snprintf(path, sizeof path, "%s/adapter_config.json", ad);
    json_t *cfg = json_load_file(path, 0, NULL);
    json_t *mts = json_object_get(cfg, "modules_to_save");
    if (!json_is_array(mts) || json_array_size(mts) != 1 || strcmp(json_string_value(json_array_get(mts, 0)), "norm"))
        fail_msg("%s: modules_to_save is not [\"norm\"]", path);
    json_decref(cfg);

    /* in process: the adapter with its trained norm, and the float64 forward with and without it */
    vks_model *m = NULL, *with = NULL;
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_model_load(base, &m), VKS_OK);
    assert_int_equal(vks_model_load(base, &with), VKS_OK);
    if (vks_lora_load(ad, m, &a)) fail_msg("%s", vks_last_error());
    const float *norm = vks_lora_adapter_norm(a);
    assert_non_null(norm);
    float *base_norm = malloc(sizeof(float) * (size_t)m->cfg.dim);
    vks_tensor_row_f32(&m->final_norm, 0, base_norm);
    double moved = max_diff(norm, base_norm, (size_t)m->cfg.dim);
    if (!(moved > 1e-3)) fail_msg("the final norm did not train: %g", moved);
    free(base_norm);
    assert_int_equal(vks_lora_apply_norm(with, a), VKS_OK);
    enum { N = 12 };
    int32_t tokens[N];
    for (int i = 0; i < N; i++) tokens[i] = (int32_t)(1 + (i * 37) % (m->cfg.vocab_size - 1));
    snprintf(ids, sizeof ids, "%s/ids.txt", dir);
    f = fopen(ids, "w");
    for (int i = 0; i < N; i++) fprintf(f, "%d\n", tokens[i]);
    fclose(f);
    size_t n = (size_t)N * (size_t)m->cfg.vocab_size;
    float *want = malloc(n * sizeof *want), *without = malloc(n * sizeof *without);
    assert_int_equal(vks_ref_forward_lora(with, a, tokens, N, want, NULL, NULL), VKS_OK);
    assert_int_equal(vks_ref_forward_lora(m, a, tokens, N, without, NULL, NULL), VKS_OK);
    double apart = max_diff(want, without, n);
    if (!(apart > 1e-2)) fail_msg("the norm hardly changes the logits (%g): no test", apart);

    /* logits --lora on the GPU and --cpu, and the model convert --lora merged */
    char merged[600];
    snprintf(merged, sizeof merged, "%s/merged.gguf", dir);
    snprintf(cmd, sizeof cmd, "convert --in %s --lora %s --out %s", base, ad, merged);
    if (run_capture(cmd, &out, &err)) fail_msg("%s: %s", cmd, err);
    free(out), free(err);
    const char *runs[][2] = {{base, " --lora "}, {base, " --cpu --lora "}, {merged, ""}};
    for (int r = 0; r < 3; r++) {
        snprintf(path, sizeof path, "%s/logits%d.f32", dir, r);
        snprintf(cmd, sizeof cmd, "logits --model %s --ids %s --out %s%s%s", runs[r][0], ids, path, runs[r][1],
                 runs[r][1][0] ? ad : "");
        if (run_capture(cmd, &out, &err)) fail_msg("%s: %s", cmd, err);
        free(out), free(err);
        size_t got_n;
        float *got = (float *)tu_read_file(path, &got_n);
        assert_int_equal(got_n, n * sizeof(float));
        double d = max_diff(got, want, n);
        if (!(d < 1e-4)) fail_msg("%s: %g from the forward with the norm (%g without)", cmd, d, apart);
        free(got);
    }
    free(want), free(without);

    /* llama.cpp's GGUF adapter has no place for the norm */
    snprintf(path, sizeof path, "%s/adapter.gguf", dir);
    assert_int_equal(vks_lora_save_gguf(path, a), VKS_ERR_ARG);
    if (!strstr(vks_last_error(), "final norm")) fail_msg("%s", vks_last_error());
    assert_int_equal(access(path, F_OK), -1);
    vks_lora_adapter_free(a);
    vks_model_free(m);
    vks_model_free(with);

    /* checkpoints carry the norm and its moments: 2 steps, then --resume to 4 */
    snprintf(cmd, sizeof cmd, "%s %s --model %s --data %s --steps 2 --out %s/b >/dev/null 2>&1 && %s %s --model %s "
             "--data %s --steps 4 --out %s/b --resume >/dev/null 2>&1", tu_bin(), args, base, data, dir, tu_bin(), args,
             base, data, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "cd %s && for f in adapter_model.safetensors adapter_config.json optimizer.safetensors; do "
             "cmp a/step-000000004/$f b/step-000000004/$f || exit 1; done", dir);
    assert_int_equal(tu_run(cmd, NULL), 0);

    /* refused, exit 2, one line: a resume without the option, another module, the option without --lora-rank */
    snprintf(cmd, sizeof cmd, "train sft --batch 4 --lr 1e-2 --lora-rank 4 --lora-alpha 8 --model %s --data %s "
             "--steps 5 --out %s/a --resume", base, data, dir);
    assert_int_equal(run_capture(cmd, &out, &err), 2);
    if (!one_clean_line(last_line(err)) || !strstr(last_line(err), "final norm")) fail_msg("resume: '%s'", err);
    free(out), free(err);
    const char *bad[] = {"--lora-rank 4 --lora-modules-to-save lm_head", "--lora-modules-to-save norm"};
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "train sft --init tiny --data %s --steps 1 --out %s/bad %s", data, dir, bad[i]);
        assert_int_equal(run_capture(cmd, &out, &err), 2);
        if (*out || !one_clean_line(err) || !strstr(err, i ? "--lora-rank" : "supported: norm"))
            fail_msg("%s: '%s'", bad[i], err);
        free(out), free(err);
    }
    snprintf(cmd, sizeof cmd, "train sft --help");
    assert_int_equal(run_capture(cmd, &out, &err), 0);
    assert_non_null(strstr(out, "--lora-modules-to-save norm"));
    free(out), free(err);
}

/* The stdout of a command that must succeed. */
static char *stdout_of(const char *cmd) {
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    if (rc != 0) fail_msg("exit %d: %s", rc, cmd);
    return out;
}

/* tokenize's ids for TEXT (printf escapes) with the tokenizer options given. */
static char *ids_of(const char *tok_args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time, Lily saw a caf\\303\\251 \\377 and 12 cats.' | %s tokenize %s "
             "2>/dev/null", tu_bin(), tok_args);
    return stdout_of(cmd);
}

/* Training a model whose tokenizer is not byte-level BPE: its checkpoint
 * holds the tokenizer (stories260K's llama2.c tok512.bin byte for byte; a
 * SentencePiece GGUF vocabulary as tokenizer.gguf), and generate and tokenize
 * read it from the checkpoint with the same ids as from the original file.
 * convert --tokenizer takes a GGUF vocabulary as well as a tokenizer.bin. */
static void test_train_sft_sentencepiece(void **state) {
    (void)state;
    const char *shared = tu_shared_path("stories260K/stories260K.bin");
    if (!shared) skip();
    char model[1024], tok[1024], spm[1024], data[1024], cmd[8192], a[4096], b[4096];
    snprintf(model, sizeof model, "%s", shared);
    snprintf(tok, sizeof tok, "%s", tu_shared_path("stories260K/tok512.bin"));
    snprintf(spm, sizeof spm, "%s", tu_shared_path("llamacpp-vocab/ggml-vocab-llama-spm.gguf"));
    const char *dir = tu_tmpdir();
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    fputs("{\"text\": \"Once upon a time there was a cat.\"}\n{\"prompt\": \"Lily went\", \"completion\": \" home.\"}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s train sft --model %s --tokenizer %s --data %s --steps 2 --batch 2 --out %s/l2c "
             "2>/dev/null", tu_bin(), model, tok, data, dir);
    free(stdout_of(cmd));
    snprintf(cmd, sizeof cmd, "cmp %s %s/l2c/step-000000002/tokenizer.bin", tok, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(a, sizeof a, "--model %s --tokenizer %s", model, tok);
    snprintf(b, sizeof b, "--model %s/l2c/step-000000002", dir);
    char *want = ids_of(a), *got = ids_of(b);
    assert_true(strlen(want) > 20);
    assert_string_equal(got, want);
    free(want);
    free(got);
    snprintf(cmd, sizeof cmd, "%s generate --model %s/l2c/step-000000002 --prompt 'Once upon a time' -n 24 --temp 0 "
             "2>/dev/null", tu_bin(), dir);
    got = stdout_of(cmd);
    snprintf(cmd, sizeof cmd, "%s generate --model %s/l2c/step-000000002 --tokenizer %s --prompt 'Once upon a time' "
             "-n 24 --temp 0 2>/dev/null", tu_bin(), dir, tok);
    want = stdout_of(cmd);
    assert_true(strncmp(got, "Once upon a time", 16) == 0);
    assert_string_equal(got, want);
    free(want);
    free(got);
    /* A SentencePiece GGUF vocabulary: convert --tokenizer puts it into a
     * Hugging Face directory and into GGUF; training keeps it. */
    snprintf(cmd, sizeof cmd, "%s convert --random-model 64,128,1,4,4,32000 --tokenizer %s --out %s/spm 2>/dev/null && "
             "%s convert --random-model 64,128,1,4,4,32000 --tokenizer %s --out %s/spm.gguf 2>/dev/null",
             tu_bin(), spm, dir, tu_bin(), spm, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s train sft --model %s/spm --data %s --steps 1 --batch 2 --out %s/spmrun 2>/dev/null",
             tu_bin(), dir, data, dir);
    free(stdout_of(cmd));
    snprintf(a, sizeof a, "--tokenizer %s", spm);
    want = ids_of(a);
    const char *models[3] = {"spm", "spm.gguf", "spmrun/step-000000001"};
    for (int i = 0; i < 3; i++) {
        snprintf(b, sizeof b, "--model %s/%s", dir, models[i]);
        got = ids_of(b);
        assert_string_equal(got, want);
        free(got);
    }
    free(want);
    snprintf(a, sizeof a, "%s/spmrun/step-000000001/tokenizer.gguf", dir);
    assert_int_equal(access(a, F_OK), 0);
    /* A llama2.c model file holds no tokenizer: refused before anything is written. */
    snprintf(cmd, sizeof cmd, "%s convert --in %s --tokenizer %s --out %s/x.bin 2>&1", tu_bin(), model, tok, dir);
    char *out = NULL;
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "holds no tokenizer"));
    free(out);
    /* A tokenizer no checkpoint could hold (a GGUF vocabulary repeating a piece, which
     * tokenizer.json cannot) is refused before training starts, not at the first save. */
    vks_gguf_writer *w = NULL;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    const char *toks[] = {"a", "b", "ab", "a"}, *merges[] = {"a b"};
    assert_int_equal(vks_gguf_add_str(w, "tokenizer.ggml.model", "gpt2"), VKS_OK);
    assert_int_equal(vks_gguf_add_str(w, "tokenizer.ggml.pre", "gpt-2"), VKS_OK);
    assert_int_equal(vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4), VKS_OK);
    assert_int_equal(vks_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, 1), VKS_OK);
    snprintf(a, sizeof a, "%s/dup.gguf", dir);
    assert_int_equal(vks_gguf_writer_save(w, a), VKS_OK);
    vks_gguf_writer_free(w);
    snprintf(cmd, sizeof cmd, "%s convert --random-model 32,64,1,2,2,4 --tokenizer %s --out %s/dup-model.gguf "
             "2>/dev/null", tu_bin(), a, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s train sft --model %s/dup-model.gguf --data %s --steps 1 --out %s/dup 2>&1", tu_bin(),
             dir, data, dir);
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "repeats an earlier piece"));
    free(out);
    snprintf(a, sizeof a, "%s/dup", dir);
    assert_int_not_equal(access(a, F_OK), 0);
}

static void expect_in(const char *text, const char *want) {
    if (!strstr(text, want)) fail_msg("'%s' lacks '%s'", text, want);
}

/* train plan (issue 25): the Llama-3.1-8B shape in q4_k at rank 16, 2048
 * tokens, recompute: the part lines and one JSON line whose parts add up to
 * total_bytes, within the issue's 12 GiB; a real model file (stories260K);
 * bad values exit 2 naming them. */
static void test_train_plan(void **state) {
    (void)state;
    char cmd[1024], *out;
    snprintf(cmd, sizeof cmd, "%s train plan --help", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    expect_in(out, "usage: vkswarm train plan");
    free(out);
    snprintf(cmd, sizeof cmd, "%s train plan --random-model 4096,14336,32,32,8,128256 --type q4_k --lora-rank 16 "
             "--tokens 2048 --recompute", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    expect_in(out, "model: dim 4096, hidden 14336, 32 layers, 32/8 heads, vocab 128256: 8030261248 parameters\n");
    expect_in(out, "LoRA rank 16 on q, k, v, o, gate, up, down of every layer: 41943040 trainable; frozen base q4_k\n");
    expect_in(out, "  activations ");
    size_t n = strlen(out);
    assert_true(n > 2 && out[n - 1] == '\n');
    out[n - 1] = 0;
    json_t *o = json_loads(last_line(out), JSON_REJECT_DUPLICATES, NULL);
    assert_non_null(o);
    const char *parts[] = {"base_bytes", "adapter_bytes", "gradient_bytes", "optimizer_bytes", "activation_bytes",
                           "logit_bytes", "scratch_bytes"};
    json_int_t sum = 0;
    for (int i = 0; i < 7; i++) {
        json_t *v = json_object_get(o, parts[i]);
        assert_true(json_is_integer(v) && json_integer_value(v) > 0);
        sum += json_integer_value(v);
    }
    json_int_t total = json_integer_value(json_object_get(o, "total_bytes"));
    assert_true(total == sum && total <= 12ll << 30);
    assert_int_equal(json_integer_value(json_object_get(o, "trainable")), 41943040);
    json_decref(o);
    free(out);
    /* --arch: Qwen3-0.6B's shape (head_dim 128 on 16 heads of a 1024 hidden size; its tied
     * classifier counted untied here) has its 596,049,920 parameters plus the second
     * embedding; qwen2's q/k/v biases and llama's neither */
    const struct { const char *arch; long long params; } arch[] = {
        {"qwen3", 596049920ll + 155582464ll}, {"qwen2", 751625216ll + 114688}, {"llama3", 751625216ll}};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s train plan --random-model 1024,3072,28,16,8,151936,4096,128 --arch %s", tu_bin(),
                 arch[i].arch);
        assert_int_equal(tu_run(cmd, &out), 0);
        o = json_loads(last_line(out), JSON_REJECT_DUPLICATES, NULL);
        assert_non_null(o);
        if (json_integer_value(json_object_get(o, "params")) != arch[i].params)
            fail_msg("%s: %s", arch[i].arch, last_line(out));
        json_decref(o);
        free(out);
    }
    const char *model = tu_shared_path("stories260K/stories260K.bin");
    if (model) {
        snprintf(cmd, sizeof cmd, "%s train plan --model %s --lora-rank 4 --type q8_0 2>/dev/null", tu_bin(), model);
        assert_int_equal(tu_run(cmd, &out), 0);
        expect_in(out, "model: dim 64, hidden 172, 5 layers, 8/4 heads, vocab 512:");
        expect_in(out, "512 tokens per micro-batch, recompute off\n"); /* the model's context */
        free(out);
    }
    const struct { const char *args, *want; } bad[] = {
        {"--random-model 64,128,2,4,1,100 --lora-rank 17", "LoRA rank 17 is outside 1..16 (k_proj is 16 x 64)"},
        {"--random-model 64,128,2,4,4,100 --type q4_k", "--type is the frozen base of --lora-rank R > 0"},
        {"--random-model 64,128,2,4,4,100 --lora-rank 4 --type q6_k", "--type 'q6_k' is not"},
        {"--random-model 64,128,2,4,4,100 --tokens 0", "--tokens"},
        {"--lora-rank 4", "give one of --model and --random-model"},
        {"--random-model 64,128,2,4", "--random-model: '64,128,2,4' is not"},
        {"--random-model 64,128,2,4,4,100 --arch mistral", "architecture 'mistral' is not llama, llama3, qwen2 or qwen3"},
        {"--arch qwen3 --lora-rank 4", "give one of --model and --random-model"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "%s train plan %s 2>&1 >/dev/null", tu_bin(), bad[i].args);
        char *err;
        assert_int_equal(tu_run(cmd, &err), 2);
        expect_in(err, bad[i].want);
        free(err);
    }
}

/* train sft's output directory (issue 23): --resume says what it does, found
 * or not, the same rule as rl (point 17); a fresh run refuses an OUT holding
 * an earlier run's files or a user's step-N before writing (point 10); an RL
 * run's checkpoint is refused naming the kind (point 7); a failed save names
 * the checkpoint that survives (point 20; a file size limit for a full
 * disk); paths on stdout are escaped (point 20). */
static void test_train_out_dir(void **state) {
    (void)state;
    char dir[256], data[512], args[4096], p[1024], want[1600], *out, *err;
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(data, sizeof data, "%s/d.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 6; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, i, 2 * i);
    fclose(f);
    const char *base = "train sft --init tiny --batch 2 --data";
    snprintf(args, sizeof args, "%s %s --steps 1 --resume --out %s/o", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 0); /* OUT missing: a fresh run, said */
    expect_in(err, "vkswarm: train: --resume: the output directory holds no checkpoint: a fresh run from the start model\n");
    free(out), free(err);
    snprintf(args, sizeof args, "%s %s --steps 2 --resume --out %s/o", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 0);
    snprintf(want, sizeof want, "vkswarm: train: --resume: continuing from %s/o/step-000000001 (resumed from step 1): its weights and "
             "optimizer state replace the start model's", dir);
    expect_in(err, want);
    free(out), free(err);
    snprintf(p, sizeof p, "%s/o/metrics.jsonl", dir);
    char *metrics = read_text(p);
    /* a fresh run onto it: refused, nothing changed */
    snprintf(args, sizeof args, "%s %s --steps 1 --out %s/o", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    expect_in(last_line(err), "from an earlier run, which a fresh run would overwrite: --resume continues that run");
    assert_true(one_clean_line(last_line(err)));
    free(out), free(err);
    char *again = read_text(p);
    assert_string_equal(again, metrics);
    free(again);
    /* a user's step-000000001 holding a model only */
    snprintf(p, sizeof p, "%s/u/step-000000001", dir);
    assert_int_equal(tu_run(strcat(strcpy(args, "mkdir -p "), p), NULL), 0);
    strcat(p, "/model.safetensors");
    write_text(p, "mine");
    snprintf(args, sizeof args, "%s %s --steps 1 --out %s/u", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    expect_in(last_line(err), "u: holds step-000000001 from an earlier run");
    free(out), free(err);
    snprintf(args, sizeof args, "%s %s --steps 1 --resume --out %s/u", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 2); /* no checkpoint to resume, and not the run's to replace */
    expect_in(last_line(err), "u: holds step-000000001, which is not a complete checkpoint (no state.json): nothing to resume");
    free(out), free(err);
    again = read_text(p);
    assert_string_equal(again, "mine");
    free(again);
    /* the RL run's kind of checkpoint (the task in "extra", no data hash) */
    snprintf(args, sizeof args, "cp -r %s/o %s/r && sed -i -e 's/\"hash\": \"[0-9a-f]*\"/\"hash\": \"\"/' -e "
             "'s/\"sft_batch\"/\"rl_task\": \"add:1\", \"rl_prompts_per_step\": 2, \"rl_next_batch\": 3, \"sft_batch\"/' "
             "%s/r/step-000000002/state.json", dir, dir, dir);
    assert_int_equal(tu_run(args, NULL), 0);
    snprintf(args, sizeof args, "%s %s --steps 3 --resume --out %s/r", base, data, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    snprintf(want, sizeof want, "sft: %s/r/step-000000002 is an RL run's checkpoint (vkswarm rl), not train sft's", dir);
    expect_in(last_line(err), want);
    free(out), free(err);
    snprintf(p, sizeof p, "%s/r/metrics.jsonl", dir);
    again = read_text(p);
    assert_string_equal(again, metrics);
    free(again);
    free(metrics);
    /* the disk full at step 3's checkpoint: step 2 stays and the message says so */
    snprintf(args, sizeof args, "sh -c \"trap '' XFSZ; ulimit -f 1000; exec %s %s %s --steps 3 --resume --out %s/o\" "
             "2>%s/full.txt", tu_bin(), base, data, dir, dir);
    assert_int_equal(tu_run(args, NULL), 1);
    snprintf(p, sizeof p, "%s/full.txt", dir);
    err = read_text(p);
    snprintf(want, sizeof want, "(checkpoint %s/o/step-000000003 not saved, nothing of it left; %s/o/step-000000002 is "
             "as it was, and --resume continues from it)\n", dir, dir);
    expect_in(last_line(err), want);
    free(err);
    snprintf(p, sizeof p, "%s/o/step-000000003", dir);
    assert_int_not_equal(access(p, F_OK), 0);
    /* an OUT with a newline: one line per path on stdout */
    snprintf(args, sizeof args, "o=\"$(printf '%s/n\\nl')\"; %s %s %s --steps 1 --out \"$o\" 2>/dev/null", dir, tu_bin(),
             base, data);
    assert_int_equal(tu_run(args, &out), 0);
    snprintf(want, sizeof want, "metrics: %s/n\\x0al/metrics.jsonl\nplot: %s/n\\x0al/loss.svg\n"
             "final checkpoint: %s/n\\x0al/step-000000001\n", dir, dir, dir);
    assert_string_equal(out, want);
    free(out);
}

static double json_number(const char *out, const char *key) {
    char k[64];
    snprintf(k, sizeof k, "\"%s\": ", key);
    const char *p = strstr(out, k);
    assert_non_null(p);
    return atof(p + strlen(k));
}

/* tasks sft -> train sft --init tiny -> eval --task (deterministic per seed) and
 * tasks filter (kept lines copied as they were; a bad line named). */
static void test_tasks_eval(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char cmd[4096], path[1024], *out;
    snprintf(cmd, sizeof cmd, "%s tasks sft --task reverse:2 --n 6 --seed 3 --out %s/rev.jsonl 2>/dev/null", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, &out), 0);
    snprintf(path, sizeof path, "data: %s/rev.jsonl\n", dir);
    assert_string_equal(out, path);
    free(out);
    snprintf(path, sizeof path, "%s/rev.jsonl", dir);
    char *data = read_text(path);
    int lines = 0;
    for (char *p = data; (p = strchr(p, '\n')); p++) lines++;
    assert_int_equal(lines, 6);
    assert_non_null(strstr(data, "{\"prompt\":\"Reverse: "));
    assert_non_null(strstr(data, "\"completion\":\"answer: "));
    free(data);
    snprintf(cmd, sizeof cmd, "%s train sft --init tiny --batch 2 --data %s --steps 1 --out %s/rt 2>/dev/null", tu_bin(),
             path, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    char *first = NULL;
    for (int run = 0; run < 2; run++) { /* the same instances and completions again, whatever the batch */
        snprintf(cmd, sizeof cmd, "%s eval --model %s/rt/step-000000001 --task reverse:2 --n 5 --seed 11 --max-new 10 "
                 "--temp 1 --batch %d 2>/dev/null", tu_bin(), dir, run ? 2 : 5);
        assert_int_equal(tu_run(cmd, &out), 0);
        assert_non_null(strstr(out, "{\"task\": \"reverse:2\", \"seed\": 11, \"n\": 5, "));
        double acc = json_number(out, "accuracy"), len = json_number(out, "mean_length");
        assert_true(acc >= 0 && acc <= 1);
        assert_true(len >= 0 && len <= 10);
        if (run) assert_string_equal(out, first);
        free(first);
        first = out;
    }
    free(first);
    const char *bad[][2] = {{"--task divide", "unknown task 'divide'"}, {"--task mul:12", "must be 1 to 9"},
                            {"--task add --data x.jsonl", "one of --data"}, {"--data x.jsonl --n 3", "go with --task"},
                            {"--task add --n 0", "--n: '0'"}};
    for (int i = 0; i < 5; i++) {
        snprintf(cmd, sizeof cmd, "%s eval --model %s/rt/step-000000001 %s 2>&1", tu_bin(), dir, bad[i][0]);
        assert_int_equal(tu_run(cmd, &out), 2);
        assert_non_null(strstr(out, bad[i][1]));
        free(out);
    }
    snprintf(path, sizeof path, "%s/user.jsonl", dir);
    write_text(path, "{\"prompt\": \"2+2?\", \"answer\": \"4\", \"task_type\": \"numeric\"}\n\n"
                     "{\"prompt\": \"Make 8\",  \"task_type\": \"countdown\", \"numbers\": [2, 10], \"target\": 8}\n");
    snprintf(cmd, sizeof cmd, "%s tasks filter --model %s/rt/step-000000001 --tasks %s --samples 2 --max-new 6 --min 0 "
             "--max 0 --out %s/kept.jsonl 2>/dev/null", tu_bin(), dir, path, dir);
    assert_int_equal(tu_run(cmd, &out), 0);
    char want[4096]; /* an untrained model solves neither */
    snprintf(want, sizeof want, "{\"total\": 2, \"hard\": 0, \"kept\": 2, \"easy\": 0, \"out\": \"%s/kept.jsonl\", "
             "\"rates\": \"%s/kept.rates.jsonl\"}\n", dir, dir);
    assert_string_equal(out, want);
    free(out);
    snprintf(cmd, sizeof cmd, "%s/kept.jsonl", dir);
    data = read_text(cmd);
    assert_string_equal(data, "{\"prompt\": \"2+2?\", \"answer\": \"4\", \"task_type\": \"numeric\"}\n"
                              "{\"prompt\": \"Make 8\",  \"task_type\": \"countdown\", \"numbers\": [2, 10], \"target\": 8}\n");
    free(data);
    FILE *f = fopen(path, "a");
    fputs("{\"prompt\": \"x\", \"answer\": \"4\"}\n", f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s tasks filter --model %s/rt/step-000000001 --tasks %s --out %s/kept2.jsonl 2>&1",
             tu_bin(), dir, path, dir);
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "user.jsonl: line 4: missing \"task_type\""));
    free(out);
    snprintf(cmd, sizeof cmd, "%s/kept2.jsonl", dir);
    assert_int_not_equal(access(cmd, F_OK), 0);
}

/* Config values checked before anything runs, naming the key, exit 2 (a
 * token_budget of 1e-300 failed at step 1 as "grpo_loss: bad arguments";
 * "file:" with no name exited 1); lines without end fail at the limit
 * (these ran forever), nothing written. */
static void test_rl_and_data_inputs_exit_2(void **state) {
    (void)state;
    char dir[256], args[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    const struct { const char *args, *msg; } cases[] = {
        {"rl --set task=file: --out %s/o", "vkswarm: config: task: \"file:\" names no file"},
        {"rl --set token_budget=1e-300 --out %s/o", "vkswarm rl: --set: token_budget must be 0 or a number in [1, 1e+12]"},
        {"rl --set length_targets=64,0 --out %s/o", "length_targets: 0 is not a token count in [1, 1048576]"},
        {"rl --set task=file:/dev/zero --steps 1 --out %s/o", "vkswarm: /dev/zero: line 1: longer than 65536 bytes"},
        {"train sft --init tiny --data /dev/zero --steps 1 --out %s/o", "vkswarm: /dev/zero: line 1: longer than 1048576 bytes"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *out, *err;
        snprintf(args, sizeof args, cases[i].args, dir);
        int rc = run_capture(args, &out, &err);
        if (rc != 2 || *out || !strstr(err, cases[i].msg)) fail_msg("'%s': status %d, stderr '%s'", args, rc, err);
        free(out), free(err);
    }
    snprintf(args, sizeof args, "%s/o", dir);
    assert_int_not_equal(access(args, F_OK), 0);
}

/* Issue 26, prompts: an RL run with a prompt block (Qwen3's template, a
 * system prompt, a user template, thinking off) shows its first prompt once,
 * generates from exactly that (the rollout file's prompt ids: BOS once, then
 * the template's bytes: the tiny vocabulary is bytes), and eval takes the same
 * flags; a template the tokenizer lacks and a user template without {prompt}
 * are one-line refusals (exit 2). */
static void test_prompts(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char cmd[8192], path[1024], *out;
    snprintf(path, sizeof path, "%s/prompt.json", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, "{\"prompt\": {\"chat_template\": \"qwen3\", \"system\": \"Be brief.\", "
               "\"user_template\": \"Q: {prompt}\", \"think\": false}}\n");
    fclose(f);
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --init tiny --config prompt.json --task add:1:short --steps 1 --out rl-p "
             "--set prompts_per_step=2 --set group_size=2 --set max_new_tokens=8 --set length_targets=4,8 "
             "--set async_level=0 --eval-n 2 2>&1", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    const char *line = "vkswarm: rl: prompt: <|im_start|>system\\x0aBe brief.<|im_end|>\\x0a<|im_start|>user\\x0aQ: ";
    char *at = strstr(out, line);
    if (!at) fail_msg("no prompt line in:\n%s", out);
    assert_null(strstr(at + strlen(line), "rl: prompt: ")); /* once */
    const char *tail = "=\\x0aThink for 8 tokens.\\x0a<|im_end|>\\x0a<|im_start|>assistant\\x0a<think>\\x0a\\x0a"
                       "</think>\\x0a\\x0a\n"; /* the task's text ends in a newline: the sentence follows it */
    if (!strstr(at, tail) || strchr(at, '\n') + 1 != strstr(at, tail) + strlen(tail))
        fail_msg("the prompt line does not end in the think sentence and the assistant turn:\n%s", out);
    free(out);
    /* the rollouts carry that prompt: BOS (256) once, then the template's bytes, think sentence after a space or newline */
    snprintf(path, sizeof path, "%s/rl-p/rollouts/batch-000000.jsonl", dir);
    out = read_text(path);
    /* "<|im_start|>sys" after one BOS */
    at = strstr(out, "\"prompt_ids\":[256,60,124,105,109,95,115,116,97,114,116,124,62,115,121,115,");
    if (!at) fail_msg("prompt ids: %.300s", out);
    assert_null(strstr(out, "[256,256")); /* BOS not doubled */
    free(out);
    /* eval with the same flags (and the budget of a length target): the same rendering */
    snprintf(cmd, sizeof cmd, "cd %s && %s eval --model rl-p/step-000000001 --task add:1:short --n 2 --max-new 4 "
             "--chat-template qwen3 --system 'Be brief.' --user-template 'Q: {prompt}' --no-think --think-tokens 8 2>&1",
             dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    at = strstr(out, "vkswarm: eval: prompt: <|im_start|>system\\x0aBe brief.<|im_end|>\\x0a<|im_start|>user\\x0aQ: ");
    if (!at) fail_msg("no prompt line in:\n%s", out);
    assert_non_null(strstr(at, tail));
    assert_non_null(strstr(out, "{\"task\": \"add:1:short\", \"seed\": 0, \"n\": 2, "));
    assert_non_null(strstr(out, "\"mean_length\": 4.000")); /* --max-new 4 and nothing more (an EOS would be shorter) */
    free(out);
    /* refusals: one line, exit 2, naming the key or flag */
    static const struct { const char *args, *want; } bad[] = {
        {"eval --model rl-p/step-000000001 --task add:1 --user-template 'Q:'", "--user-template must contain {prompt}"},
        {"eval --model rl-p/step-000000001 --task add:1 --chat-template mistral", "--chat-template: unknown chat template"},
        {"eval --model rl-p/step-000000001 --task add:1 --chat-template model",
         "prompt.chat_template model: the tokenizer has no chat template"},
        {"eval --model rl-p/step-000000001 --data x.jsonl --system hi", "the prompt flags go with --task"},
        {"tasks filter --model rl-p/step-000000001 --task t.jsonl --out k.jsonl --system hi",
         "prompt.system needs a chat template"},
        {"rl --init tiny --chat-template model --steps 1 --out rl-q", "prompt.chat_template model: the tokenizer has no chat template"},
        {"rl --init tiny --set prompt.think=false", "config: prompt.think = false needs a chat template"},
        {"rl --init tiny --think-tokens 8", "--think-tokens goes with eval and tasks filter"},
        {"eval --model rl-p/step-000000001 --task add:1 --think-tokens 0", "--think-tokens"},
        {"eval --model rl-p/step-000000001 --task add:1 --think-template 'Think.'", "--think-template must contain {n}"},
        {"rl --init tiny --set max_new_tokens=8 --set length_targets=4,16", "length_targets: 16 exceeds max_new_tokens 8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && %s %s 2>&1 >/dev/null", dir, tu_bin(), bad[i].args);
        assert_int_equal(tu_run(cmd, &out), 2);
        if (!strstr(out, bad[i].want) || count_lines(out) != 1)
            fail_msg("%s: %s", bad[i].args, out);
        free(out);
    }
}

/* README's own-task example, as a user types it: a task file (two kinds),
 * tasks filter (solve rates, hard / kept / easy), rl --task PATH.jsonl with a
 * held-out split measured in the run, eval --task PATH.jsonl with pass@k and
 * per-kind accuracy. An untrained model solves nothing, so rates are 0, every
 * task is hard at --min 0.1, and accuracies are 0 (measured, not missing). */
static void test_own_tasks(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char cmd[8192], path[1024], want[4096], *out;
    snprintf(cmd, sizeof cmd, "%s tasks sft --task add:1 --n 4 --out %s/own-sft.jsonl 2>/dev/null && "
             "%s train sft --init tiny --batch 2 --data %s/own-sft.jsonl --steps 1 --out %s/own 2>/dev/null",
             tu_bin(), dir, tu_bin(), dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(path, sizeof path, "%s/word.jsonl", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++)
        fprintf(f, "{\"prompt\": \"Tom has %d apples and buys %d more. How many? End with answer: N\\n\", \"answer\": %d, "
                "\"task_type\": \"numeric\", \"kind\": \"%s\"}\n", i, i + 2, 2 * i + 2, i % 2 ? "apples" : "pears");
    fclose(f);
    /* tasks filter --task PATH: every task hard; the rates file says so per task */
    snprintf(cmd, sizeof cmd, "cd %s && %s tasks filter --model own/step-000000001 --task word.jsonl --samples 2 "
             "--max-new 4 --out kept.jsonl --rates-out rates.jsonl 2>&1 >stdout.txt", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "8 tasks x 2 samples: 8 hard (solve rate below 0.1), 0 kept, 0 easy (above 0.8)"));
    free(out);
    snprintf(path, sizeof path, "%s/stdout.txt", dir);
    out = read_text(path);
    assert_string_equal(out, "{\"total\": 8, \"hard\": 8, \"kept\": 0, \"easy\": 0, \"out\": \"kept.jsonl\", "
                             "\"rates\": \"rates.jsonl\"}\n");
    free(out);
    snprintf(path, sizeof path, "%s/rates.jsonl", dir);
    out = read_text(path);
    assert_int_equal(count_lines(out), 8);
    assert_non_null(strstr(out, "{\"line\":1,\"kind\":\"pears\",\"solved\":0,\"samples\":2,\"solve_rate\":0.0,"
                                "\"verdict\":\"hard\"}\n{\"line\":2,\"kind\":\"apples\","));
    free(out);
    snprintf(path, sizeof path, "%s/kept.jsonl", dir);
    out = read_text(path);
    assert_string_equal(out, "");
    free(out);
    /* rl --task PATH.jsonl --eval-split: held-out accuracy measured (0), the held-out file named */
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --init tiny --task word.jsonl --eval-split 0.25 --eval-n 8 --steps 1 "
             "--out rl-own --set prompts_per_step=2 --set group_size=4 --set max_new_tokens=12 "
             "--set length_targets=4,12 --set async_level=0 2>/dev/null", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "task: word.jsonl\n"));
    assert_non_null(strstr(out, "held-out: 2 of the 8 tasks of word.jsonl (eval_split 0.25; rl-own/heldout.jsonl)\n"));
    assert_non_null(strstr(out, "accuracy: 0.000 -> 0.000\n"));
    free(out);
    snprintf(path, sizeof path, "%s/rl-own/heldout.jsonl", dir);
    out = read_text(path);
    assert_int_equal(count_lines(out), 2);
    free(out);
    /* an earlier run's held-out file alone: a fresh run would overwrite it, refused */
    snprintf(cmd, sizeof cmd, "cd %s && mkdir rl-h && echo '{}' > rl-h/heldout.jsonl && %s rl --init tiny --task word.jsonl "
             "--eval-split 0.25 --steps 1 --out rl-h 2>&1", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "rl-h: holds heldout.jsonl from an earlier run"));
    free(out);
    /* a task file without a held-out set: --eval-n refused before the run, else said */
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --init tiny --task word.jsonl --eval-n 4 --steps 1 2>&1", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "a task file is evaluated on held-out tasks: give --eval-tasks FILE or --eval-split F"));
    free(out);
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --init tiny --task add:2 --eval-split 0.1 2>&1", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "eval_split holds out part of a task file"));
    free(out);
    snprintf(cmd, sizeof cmd, "cd %s && %s rl --init tiny --task words 2>&1", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "unknown task 'words': neither a built-in task"));
    free(out);
    /* eval --task PATH.jsonl --samples 4: pass@1, 2, 4 and the two kinds */
    snprintf(cmd, sizeof cmd, "cd %s && %s eval --model own/step-000000001 --task word.jsonl --samples 4 --max-new 4 "
             "--seed 5 2>/dev/null", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    snprintf(want, sizeof want, "{\"task\": \"word.jsonl\", \"seed\": 5, \"n\": 8, \"samples\": 4, \"solved\": 0, "
             "\"accuracy\": 0.000000, \"pass@1\": 0.000000, \"pass@2\": 0.000000, \"pass@4\": 0.000000, \"mean_length\": ");
    assert_true(!strncmp(out, want, strlen(want)));
    assert_non_null(strstr(out, "\"kinds\": {\"pears\": {\"n\": 4, \"accuracy\": 0.000000}, "
                                "\"apples\": {\"n\": 4, \"accuracy\": 0.000000}}}\n"));
    free(out);
    snprintf(cmd, sizeof cmd, "cd %s && %s eval --model own/step-000000001 --task file:word.jsonl --n 3 --max-new 2 "
             "2>/dev/null", dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "{\"task\": \"word.jsonl\", \"seed\": 0, \"n\": 3, \"samples\": 1, "));
    assert_non_null(strstr(out, "\"kinds\": {\"pears\": {\"n\": 2, \"accuracy\": 0.000000}, \"apples\": {\"n\": 1, "));
    free(out);
    /* a built-in task: its kind is its name */
    snprintf(cmd, sizeof cmd, "cd %s && %s eval --model own/step-000000001 --task add:1 --n 2 --max-new 2 2>/dev/null",
             dir, tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "\"kinds\": {\"add:1\": {\"n\": 2, "));
    free(out);
    snprintf(cmd, sizeof cmd, "cd %s && %s tasks filter --model own/step-000000001 --task add:2 --out k.jsonl 2>&1", dir,
             tu_bin());
    assert_int_equal(tu_run(cmd, &out), 2);
    assert_non_null(strstr(out, "tasks filter and tasks score take a task file; 'add:2' is a built-in task"));
    free(out);
}

/* Runs vkswarm with `args` (shell syntax), stdout to a file, stderr read as
 * it comes; once stderr holds `trigger`, sends SIGINT (event-triggered, no
 * sleep). Returns the exit status (128 + N for a signal N); *err gets all of
 * stderr, *out stdout (malloc'd). */
static int run_interrupted(const char *args, const char *trigger, char **out, char **err) {
    char outp[600], cmd[16384];
    snprintf(outp, sizeof outp, "%s/stdout.txt", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "exec %s %s >%s", tu_bin(), args, outp);
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]), close(fd[1]);
        execl("/bin/sh", "sh", "-c", cmd, (char *)NULL);
        _exit(127);
    }
    close(fd[1]);
    size_t len = 0, cap = 1 << 16;
    char *buf = malloc(cap);
    assert_non_null(buf);
    bool sent = false;
    for (;;) {
        if (len + 4096 + 1 > cap) assert_non_null(buf = realloc(buf, cap *= 2));
        ssize_t n = read(fd[0], buf + len, 4096);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        len += (size_t)n;
        buf[len] = 0;
        if (!sent && strstr(buf, trigger)) assert_int_equal(kill(pid, SIGINT), 0), sent = true;
    }
    buf[len] = 0;
    close(fd[0]);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!sent) fail_msg("'%s' never printed '%s': %s", args, trigger, buf);
    *err = buf;
    *out = (char *)tu_read_file(outp, NULL);
    assert_non_null(*out);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* metrics.jsonl's lines without the keys that measure time. */
static char *metrics_untimed(const char *path, int *lines) {
    char *text = read_text(path), *res = calloc(1, strlen(text) + 1);
    assert_non_null(res);
    *lines = 0;
    for (char *line = text, *end; *line; line = end + 1) {
        end = strchr(line, '\n');
        assert_non_null(end);
        json_t *o = json_loadb(line, (size_t)(end - line), JSON_REJECT_DUPLICATES, NULL);
        assert_true(json_is_object(o));
        /* times, and what the inference thread has made by the time the line is written (it pushes
         * the next step's groups while the trainer writes this step's line: a race, not a result) */
        const char *timed[] = {"rollouts_per_s", "trainer_idle", "broadcast_s", "elapsed_s",
                               "reward", "groups_filtered", "rejected", "groups_stale", "off_policy_dropped"};
        for (int i = 0; i < 9; i++) json_object_del(o, timed[i]);
        char *t = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        strcat(res, t), strcat(res, "\n");
        free(t);
        json_decref(o);
        (*lines)++;
    }
    free(text);
    return res;
}

/* A clean stop of rl (issue 26): SIGINT once step 1 is on stderr: that step
 * or the next one ends the run with its checkpoint, metrics and plots, exit
 * 130 and one line saying how to continue; `rl --out OUT --resume` alone
 * takes the config from the checkpoint, says so before the step lines, and
 * at k = 0 writes what the straight run wrote (each step once); a changed key
 * is refused naming it and both values, --override allows it and says so. */
/* A config whose roles name 3 ranks, run without mpirun: exit 2 and one
 * line giving the mpirun line that starts it on one machine (the command
 * line as given, a word with a space quoted); nothing else runs. */
static void test_rl_needs_mpirun(void **state) {
    (void)state;
    char dir[256], args[2048], want[2048];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char p[600];
    snprintf(p, sizeof p, "%s/run.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"roles\": {\"orchestrator\": 0, \"trainer\": 0, \"inference\": [[1], [2]]}}\n", f);
    fclose(f);
    snprintf(args, sizeof args, "rl --config %s --init tiny --out '%s/o x'", p, dir);
    char *out, *err;
    assert_int_equal(run_capture(args, &out, &err), 2);
    /* the program as it was run; as root Open MPI needs --allow-run-as-root (issue 40 item 7f) */
    snprintf(want, sizeof want, "vkswarm: rl: the config's roles name 3 ranks but 1 was started; on one machine run: "
             "mpirun%s --oversubscribe --mca btl tcp,self -np 3 %s rl --config %s --init tiny --out '%s/o x'\n",
             geteuid() == 0 ? " --allow-run-as-root" : "", tu_bin(), p, dir);
    assert_string_equal(err, want);
    assert_string_equal(out, "");
    free(out), free(err);
    snprintf(p, sizeof p, "%s/o x", dir);
    assert_int_not_equal(access(p, F_OK), 0); /* nothing made */
}

/* README.md and every page of docs/ (not docs/pending/), one after another. */
static char *read_docs(const char *src) {
    char p[1024];
    snprintf(p, sizeof p, "%s/README.md", src);
    char *all = (char *)tu_read_file(p, NULL);
    assert_non_null(all);
    snprintf(p, sizeof p, "%s/docs", src);
    DIR *d = opendir(p);
    assert_non_null(d);
    for (struct dirent *e; (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".md")) continue;
        snprintf(p, sizeof p, "%s/docs/%s", src, e->d_name);
        char *page = (char *)tu_read_file(p, NULL);
        assert_non_null(page);
        size_t have = strlen(all);
        all = realloc(all, have + strlen(page) + 2);
        assert_non_null(all);
        snprintf(all + have, strlen(page) + 2, "\n%s", page);
        free(page);
    }
    closedir(d);
    return all;
}

/* Every docs section that a command's --help names ("docs \"NAME\"", maybe
 * across a line break) is a heading of README.md or a page of docs/ (a `code`
 * span in a heading is read without its backquotes). */
static void test_rl_help_sections_exist(void **state) {
    (void)state;
    const char *src = tu_source();
    char cmd[1024], *help = NULL;
    char *readme = read_docs(src);
    for (char *q = readme, *w = readme; ; q++) { /* drop backquotes */
        if (*q != '`') *w++ = *q;
        if (!*q) break;
    }
    const char *cmds[] = {"rl", "generate", "tasks", "train", "eval", "verify", "broadcast", "pipeline"};
    int named = 0;
    for (size_t c = 0; c < sizeof cmds / sizeof cmds[0]; c++) {
        snprintf(cmd, sizeof cmd, "%s %s --help", tu_bin(), cmds[c]);
        assert_int_equal(tu_run(cmd, &help), 0);
        for (const char *q = help; (q = strstr(q, "docs \"")); ) {
            q += 6;
            const char *end = strchr(q, '"');
            assert_non_null(end);
            char want[256];
            int n = snprintf(want, sizeof want, "# %.*s\n", (int)(end - q), q);
            for (int i = 2; i < n - 1; i++)
                if (want[i] == '\n') want[i] = ' '; /* a name broken across lines */
            if (!strstr(readme, want)) fail_msg("%s --help names docs \"%.*s\": no such heading", cmds[c], (int)(end - q), q);
            named += !strcmp(cmds[c], "rl");
            q = end;
        }
        free(help);
    }
    assert_true(named >= 4);
    free(readme);
}

/* Whether a program is on PATH. */
static bool have_program(const char *name) {
    char cmd[256];
    snprintf(cmd, sizeof cmd, "command -v %s >/dev/null 2>&1", name);
    return tu_run(cmd, NULL) == 0;
}

/* The run report (issues 26, 36): OUT/report.html, rebuilt after each step
 * (the step-1 page, copied when the step's line comes, says "1 of 2 (in
 * progress") and at the end; one page with nothing loaded from elsewhere; the
 * task file's hostile text escaped. Then headless Chromium loads it: no
 * console message, the page's script ran (data-ready, the counts it fills
 * in), the curves (10 SVGs) and the sample table are in the DOM; a
 * screenshot is taken (report.png, for a look). */
static void test_rl_report(void **state) {
    (void)state;
    char dir[256], cmd[8192], p[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(p, sizeof p, "%s/t.jsonl", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++) /* a tag, a quote, an entity and a control byte in every prompt */
        fprintf(f, "{\"prompt\": \"<b>%d</b>+%d='\\u0007&amp;\", \"answer\": \"%d\", \"task_type\": \"numeric\"}\n", i,
                i + 1, 2 * i + 1);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cd %s && (%s rl --init tiny --task t.jsonl --steps 2 --save-every 1 --async-level 0 "
             "--set prompts_per_step=2 --set group_size=4 --set max_new_tokens=12 --set length_targets=4,12 "
             "--eval-split 0.25 --eval-n 2 --out o 2>&1 >out.txt; echo \"status $?\") | while IFS= read -r l; do "
             "case \"$l\" in 'rl: step 1/2'*) cp o/report.html step1.html;; 'status '*) echo \"$l\";; esac; done",
             dir, tu_bin());
    char *out = NULL;
    assert_int_equal(tu_run(cmd, &out), 0);
    if (strcmp(out, "status 0\n")) fail_msg("rl: %s", out);
    free(out);
    snprintf(p, sizeof p, "%s/out.txt", dir);
    out = (char *)tu_read_file(p, NULL);
    assert_non_null(strstr(out, "\nreport: o/report.html\n"));
    free(out);
    snprintf(p, sizeof p, "%s/step1.html", dir);
    char *page = (char *)tu_read_file(p, NULL);
    assert_non_null(page);
    assert_non_null(strstr(page, "<dd id=\"step\">1 of 2 (in progress"));
    free(page);
    snprintf(p, sizeof p, "%s/o/report.html", dir);
    page = (char *)tu_read_file(p, NULL);
    assert_non_null(page);
    assert_non_null(strstr(page, "<dd id=\"step\">2 of 2 (the run ended)</dd>"));
    assert_non_null(strstr(page, "</h1>\n<section id=\"headline\">\n<p class=\"headline "));
    assert_non_null(strstr(page, "id=\"accuracy-greedy\">Held-out accuracy (greedy): 0.000 &rarr; "));
    assert_null(strstr(page, "<b>")); /* the tasks' text is escaped */
    assert_null(strstr(page, "\a"));
    assert_null(strstr(page, "http")); /* nothing loaded from elsewhere (the SVG namespace aside) */
    assert_non_null(strstr(page, "&lt;b&gt;"));
    assert_non_null(strstr(page, "&#39;\\x07&amp;amp;"));
    int figures = 0, rows = 0;
    for (const char *q = page; (q = strstr(q, "<figure class=\"curve\"")); q++) figures++;
    const char *table = strstr(page, "<table id=\"samples\">");
    assert_non_null(table);
    for (const char *q = table; (q = strstr(q, "<tr><td>")) && q < strstr(table, "</table>"); q++) rows++;
    assert_int_equal(figures, 11); /* report.c curves[] */
    assert_in_range(rows, 2, 8); /* 1 or 2 of the first two groups, each step */
    assert_non_null(strstr(page, "<td>this process</td><td>inference thread</td><td>live</td>"));
    assert_non_null(strstr(page, "<section id=\"timeline\">"));
    free(page);
    if (!have_program("chromium")) {
        fprintf(stderr, "test_rl_report: SKIPPED the browser check: no chromium (tools/install-deps installs it)\n");
        return;
    }
    /* a profile of its own in the test's directory; the DOM after the scripts ran; console lines on stderr */
    snprintf(cmd, sizeof cmd, "cd %s && HOME=%s timeout 120 chromium --headless --no-sandbox --disable-gpu "
             "--user-data-dir=%s/chromium --enable-logging=stderr --v=0 --dump-dom file://%s/o/report.html "
             "> dom.html 2> chromium.txt && HOME=%s timeout 120 chromium --headless --no-sandbox --disable-gpu "
             "--user-data-dir=%s/chromium --hide-scrollbars --window-size=1400,2400 --screenshot=%s/report.png "
             "file://%s/o/report.html 2>/dev/null", dir, dir, dir, dir, dir, dir, dir, dir);
    if (tu_run(cmd, NULL)) fail_msg("chromium failed: %s", cmd);
    snprintf(p, sizeof p, "%s/chromium.txt", dir);
    char *log = (char *)tu_read_file(p, NULL);
    assert_non_null(log);
    if (strstr(log, "CONSOLE") || strstr(log, "Uncaught")) fail_msg("the page logged on the console: %s", log);
    free(log);
    snprintf(p, sizeof p, "%s/dom.html", dir);
    char *dom = (char *)tu_read_file(p, NULL);
    assert_non_null(dom);
    assert_non_null(strstr(dom, "data-ready=\"1\""));
    assert_non_null(strstr(dom, "<pre id=\"js-errors\" hidden=\"\"></pre>"));
    assert_non_null(strstr(dom, "<span id=\"curve-count\">11</span>"));
    char want[64];
    snprintf(want, sizeof want, "<span id=\"sample-count\">%d</span>", rows);
    assert_non_null(strstr(dom, want));
    assert_non_null(strstr(dom, "<table id=\"samples\">"));
    assert_non_null(strstr(dom, "&lt;b&gt;"));
    free(dom);
    snprintf(p, sizeof p, "%s/report.png", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(st.st_size > 10000);
}

static void test_rl_clean_stop(void **state) {
    (void)state;
    char dir[256], tasks[400], base[2048], args[4096], want[2048], p[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(tasks, sizeof tasks, "%s/t.jsonl", dir);
    FILE *f = fopen(tasks, "w");
    assert_non_null(f);
    for (int i = 0; i < 8; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"answer\": \"%d\", \"task_type\": \"numeric\"}\n", i, i + 1, 2 * i + 1);
    fclose(f);
    snprintf(base, sizeof base, "rl --init tiny --task %s --steps 3 --async-level 0 --set prompts_per_step=2 "
             "--set group_size=4 --set max_new_tokens=12 --set length_targets=4,12 --set lr=1e-3 --eval-split 0.25 "
             "--eval-n 2 --eval-every 2", tasks);
    char *out, *err;
    snprintf(args, sizeof args, "%s --out %s/a", base, dir);
    int rc = run_capture(args, &out, &err);
    if (rc) fail_msg("straight run: %d: %s", rc, err);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --out %s/b", base, dir);
    rc = run_interrupted(args, "rl: step 1/3", &out, &err);
    long long stop = -1;
    const char *at = strstr(err, "vkswarm: rl: stopped at step ");
    if (rc != 130 || !at || sscanf(at, "vkswarm: rl: stopped at step %lld", &stop) != 1) fail_msg("stopped: %d: %s", rc, err);
    assert_true(stop == 1 || stop == 2);
    snprintf(want, sizeof want, "vkswarm: rl: stopped at step %lld; checkpoint %s/b/step-%09lld; continue with: %s rl "
             "--out %s/b --resume\n", stop, dir, stop, tu_bin(), dir);
    expect_in(err, want);
    assert_int_equal(lines_with(err, "continue with"), 1);
    assert_int_equal(lines_with(err, "vkswarm: stopping after this step"), 1);
    snprintf(want, sizeof want, "final checkpoint: %s/b/step-%09lld\n", dir, stop);
    expect_in(out, want);
    const char *files[] = {"rl.svg", "timeline.svg", "metrics.jsonl", "report.html", "step-000000000/state.json"};
    for (int i = 0; i < 5; i++) {
        if (i == 4) snprintf(p, sizeof p, "%s/b/step-%09lld/state.json", dir, stop);
        else snprintf(p, sizeof p, "%s/b/%s", dir, files[i]);
        if (access(p, F_OK)) fail_msg("no %s", p);
    }
    int lines;
    snprintf(p, sizeof p, "%s/b/metrics.jsonl", dir);
    free(metrics_untimed(p, &lines));
    assert_int_equal(lines, stop + 1); /* step 0: the start's held-out accuracy */
    free(out), free(err);
    /* a changed key, refused naming it: nothing runs */
    snprintf(args, sizeof args, "rl --out %s/b --resume --set group_size=2", dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    snprintf(want, sizeof want, "vkswarm: rl: resume: group_size was 4 in %s/b/step-%09lld, now 2 (--override to allow)\n",
             dir, stop);
    assert_string_equal(err, want);
    free(out), free(err);
    snprintf(args, sizeof args, "rl --out %s/b --resume --eval-n 3", dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    expect_in(err, "rl: resume: eval_n was 2 in ");
    free(out), free(err);
    snprintf(args, sizeof args, "rl --out %s/b --resume --system Terse.", dir); /* a prompt flag is compared too */
    assert_int_equal(run_capture(args, &out, &err), 2);
    expect_in(err, "rl: resume: prompt was {\"chat_template\":\"none\",\"system\":\"\",");
    free(out), free(err);
    /* --resume alone: the stored config, said before the steps; the straight run's lines */
    snprintf(args, sizeof args, "rl --out %s/b --resume", dir);
    rc = run_capture(args, &out, &err);
    if (rc) fail_msg("resume: %d: %s", rc, err);
    snprintf(want, sizeof want, "(resumed from step %lld)", stop);
    const char *said = strstr(err, want), *step = strstr(err, "rl: step ");
    if (!said || !step || said > step) fail_msg("resume said after the steps: %s", err);
    expect_in(out, " (from the run's start, step 0)\n");
    free(out), free(err);
    snprintf(p, sizeof p, "%s/a/metrics.jsonl", dir);
    char *straight = metrics_untimed(p, &lines);
    assert_int_equal(lines, 4);
    snprintf(p, sizeof p, "%s/b/metrics.jsonl", dir);
    char *resumed = metrics_untimed(p, &lines);
    assert_int_equal(lines, 4);
    if (strcmp(straight, resumed)) fail_msg("straight:\n%s\nresumed:\n%s", straight, resumed);
    free(straight), free(resumed);
    /* --override: allowed, and said */
    snprintf(args, sizeof args, "rl --out %s/b --resume --steps 4 --set max_new_tokens=14 --override", dir);
    rc = run_capture(args, &out, &err);
    if (rc) fail_msg("override: %d: %s", rc, err);
    snprintf(want, sizeof want, "vkswarm: rl: --override: resuming %s/b/step-000000003 with max_new_tokens 12 -> 14\n", dir);
    expect_in(err, want);
    expect_in(out, "final checkpoint: ");
    free(out), free(err);
}

/* train sft stops the same way: SIGINT once the device is open (before the
 * first step): step 1 ends the run, checkpointed, exit 130, the command to
 * continue; that command finishes the run; a changed setting on resume is
 * refused naming it, --override allows it and says so. */
static void test_train_clean_stop(void **state) {
    (void)state;
    char dir[256], data[512], base[2048], args[4096], want[4096], p[1024];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(data, sizeof data, "%s/add.jsonl", dir);
    FILE *f = fopen(data, "w");
    assert_non_null(f);
    for (int i = 0; i < 12; i++) fprintf(f, "{\"prompt\": \"%d+%d=\", \"completion\": \"%d\"}\n", i, 2 * i, 3 * i);
    fclose(f);
    snprintf(base, sizeof base, "train sft --init tiny --batch 4 --lr 3e-3 --data %s --steps 3 --out %s/o", data, dir);
    char *out, *err;
    int rc = run_interrupted(base, "vkswarm: device 0", &out, &err);
    if (rc != 130) fail_msg("train stopped: %d: %s", rc, err);
    snprintf(want, sizeof want, "vkswarm: train: stopped at step 1; checkpoint %s/o/step-000000001; continue with: %s "
             "train sft --init tiny --batch 4 --lr 3e-3 --data %s --steps 3 --out %s/o --resume\n", dir, tu_bin(), data, dir);
    expect_in(err, want);
    assert_int_equal(lines_with(err, "continue with"), 1);
    snprintf(want, sizeof want, "final checkpoint: %s/o/step-000000001\n", dir);
    expect_in(out, want);
    snprintf(p, sizeof p, "%s/o/loss.svg", dir);
    assert_int_equal(access(p, F_OK), 0);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --resume --lr 1e-3", base);
    assert_int_equal(run_capture(args, &out, &err), 2);
    snprintf(want, sizeof want, "sft: resume: lr was 0.003 in %s/o/step-000000001, now 0.001 (--override to allow)\n", dir);
    expect_in(err, want);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --resume", base);
    rc = run_capture(args, &out, &err);
    if (rc) fail_msg("train resume: %d: %s", rc, err);
    free(out), free(err);
    snprintf(p, sizeof p, "%s/o/metrics.jsonl", dir);
    char *m = read_text(p);
    assert_int_equal(lines_with(m, "{\"step\":"), 3);
    free(m);
    snprintf(args, sizeof args, "%s --resume --steps 4 --grad-clip 2 --override", base);
    rc = run_capture(args, &out, &err);
    if (rc) fail_msg("train override: %d: %s", rc, err);
    expect_in(err, "vkswarm: train: --override: resumed with grad_clip 1 -> 2\n");
    free(out), free(err);
}

/* The base's adapter with PEFT's A and a random B, written as PEFT (dir) and GGUF (gguf). */
static void write_tiny_adapter(const char *base, const char *dir, const char *gguf, vks_lora_adapter **out) {
    vks_model *m = NULL;
    assert_int_equal(vks_model_load(base, &m), VKS_OK);
    vks_lora_config lc = {4, 16.0, VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 2), VKS_OK);
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t o, i;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &o, &i);
            tu_fill_uniform(vks_lora_adapter_B(a, l, t), (size_t)(4 * o), (uint64_t)(l * 8 + t), -0.05f, 0.05f);
        }
    assert_int_equal(vks_lora_adapter_set_base(a, m), VKS_OK);
    assert_int_equal(vks_lora_save_peft(dir, a), VKS_OK);
    assert_int_equal(vks_lora_save_gguf(gguf, a), VKS_OK);
    vks_model_free(m);
    *out = a;
}

#define LORA_IDS 6

/* The float64 reference's logits of the model at path (or of m when path is NULL). */
static float *ref_logits(const char *path, const vks_model *m) {
    static const int32_t ids[LORA_IDS] = {256, 72, 105, 33, 10, 200};
    vks_model *own = NULL;
    if (path) assert_int_equal(vks_model_load(path, &own), VKS_OK);
    const vks_model *x = path ? own : m;
    float *lg = malloc(sizeof(float) * LORA_IDS * (size_t)x->cfg.vocab_size);
    assert_non_null(lg);
    assert_int_equal(vks_ref_forward(x, ids, LORA_IDS, lg, NULL), VKS_OK);
    vks_model_free(own);
    return lg;
}

static double max_rel_diff(const float *a, const float *b, size_t n) {
    double worst = 0, scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - b[i]) / scale);
    return worst;
}

/* convert --lora merges a PEFT or GGUF adapter: the merged files give the
 * logits of the library's merge (W + alpha/r B A in double, checked against
 * the weights in test_lora) within 1e-5 relative, and not the base's; --type
 * quantizes the merge; an adapter that does not fit is one line, exit 2,
 * nothing written. */
static void test_convert_lora(void **state) {
    (void)state;
    char dir[256], base[300], other[300], ad[300], adg[300], out[300], args[2048];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(base, sizeof base, "%s/base", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    snprintf(ad, sizeof ad, "%s/adapter", dir);
    snprintf(adg, sizeof adg, "%s/adapter.gguf", dir);
    snprintf(args, sizeof args, "convert --init tiny --seed 3 --out %s", base);
    run_ok(args);
    vks_lora_adapter *a = NULL;
    write_tiny_adapter(base, ad, adg, &a);
    vks_model *merged = NULL;
    assert_int_equal(vks_model_load(base, &merged), VKS_OK);
    assert_int_equal(vks_lora_merge(merged, a), VKS_OK);
    float *want = ref_logits(NULL, merged), *plain = ref_logits(base, NULL);
    size_t n = (size_t)LORA_IDS * (size_t)merged->cfg.vocab_size;
    assert_true(max_rel_diff(plain, want, n) > 1e-3); /* the adapter changes the model */
    const char *outs[3][2] = {{"merged.gguf", ad}, {"merged_hf", adg}, {"merged_q8.gguf", ad}};
    for (int i = 0; i < 3; i++) {
        snprintf(out, sizeof out, "%s/%s", dir, outs[i][0]);
        snprintf(args, sizeof args, "convert --in %s --lora %s --out %s%s", base, outs[i][1], out,
                 i == 2 ? " --type q8_0" : "");
        run_ok(args);
        float *got = ref_logits(out, NULL);
        double d = max_rel_diff(got, want, n);
        if (i < 2 && d > 1e-5) fail_msg("%s: logits differ by %g relative", out, d);
        if (i == 2 && (d > 2e-2 || d == 0)) fail_msg("%s: q8_0 logits differ by %g relative", out, d);
        free(got);
    }
    /* another model's base: refused by its hash; a rank-0 config: refused; neither writes */
    snprintf(args, sizeof args, "convert --init tiny --seed 4 --out %s", other);
    run_ok(args);
    char *o = NULL, *err = NULL;
    snprintf(out, sizeof out, "%s/refused.gguf", dir);
    snprintf(args, sizeof args, "convert --in %s --lora %s --out %s", other, ad, out);
    assert_int_equal(run_capture(args, &o, &err), 2);
    if (!one_clean_line(err) || !strstr(err, "adapter_config.json: vkswarm.base_model_hash: the adapter was made for"))
        fail_msg("other base: '%s'", err);
    free(o), free(err);
    char cfg[400];
    snprintf(cfg, sizeof cfg, "%s/adapter_config.json", ad);
    write_text(cfg, "{\"peft_type\": \"LORA\", \"r\": 0, \"lora_alpha\": 16, \"target_modules\": [\"q_proj\"]}\n");
    snprintf(args, sizeof args, "convert --in %s --lora %s --out %s", base, ad, out);
    assert_int_equal(run_capture(args, &o, &err), 2);
    if (!one_clean_line(err) || !strstr(err, "adapter_config.json: r: must be an integer >= 1"))
        fail_msg("rank 0: '%s'", err);
    free(o), free(err);
    assert_int_not_equal(access(out, F_OK), 0);
    free(want);
    free(plain);
    vks_model_free(merged);
    vks_lora_adapter_free(a);
}

/* --lora (issue 25): a base written in llama2.c's format, adapters saved in PEFT's
 * layout. A fresh adapter (B = 0) generates the base's text; rollouts made
 * with a nonzero one verify with it (GPU and --cpu) and are rejected without
 * it or with the fresh one, naming the model hash; a bad adapter is one line,
 * exit 2. */
static void save_adapter(const vks_model *m, const char *dir, uint64_t seed, bool nonzero) {
    vks_lora_config lc = {.rank = 4, .alpha = 16, .targets = VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, seed), VKS_OK);
    assert_int_equal(vks_lora_adapter_set_base(a, m), VKS_OK);
    for (int l = 0; nonzero && l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            tu_fill_uniform(vks_lora_adapter_B(a, l, (vks_lora_target)t), (size_t)(out * 4), seed + (uint64_t)t, -0.05f,
                            0.05f);
        }
    if (vks_lora_save_peft(dir, a)) fail_msg("%s", vks_last_error());
    vks_lora_adapter_free(a);
}

static void test_lora_cli(void **state) {
    (void)state;
    const char *dir = tu_tmpdir();
    char model[600], fresh[600], x[600], rollouts[600], args[4096], *out, *err, *base_out;
    snprintf(model, sizeof model, "%s/lora-base.bin", dir);
    snprintf(fresh, sizeof fresh, "%s/lora-fresh", dir);
    snprintf(x, sizeof x, "%s/lora-x", dir);
    snprintf(rollouts, sizeof rollouts, "%s/lora-r.jsonl", dir);
    vks_model_config c = {.dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 97,
                          .seq_len = 64, .head_dim = 16, .kv_dim = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_mode = VKS_ROPE_HALF};
    vks_model *r, *m;
    assert_int_equal(vks_model_random(&c, 31, &r), VKS_OK);
    assert_int_equal(vks_model_save_llama2c(r, model), VKS_OK);
    vks_model_free(r);
    assert_int_equal(vks_model_load(model, &m), VKS_OK);
    save_adapter(m, fresh, 1, false);
    save_adapter(m, x, 2, true);
    vks_model_free(m);
    snprintf(args, sizeof args, "generate --model %s --prompt '' -n 24 --seed 3", model);
    if (run_capture(args, &base_out, &err)) fail_msg("%s: %s", args, err);
    free(err);
    snprintf(args, sizeof args, "generate --model %s --prompt '' -n 24 --seed 3 --lora %s", model, fresh);
    if (run_capture(args, &out, &err)) fail_msg("%s: %s", args, err);
    assert_string_equal(out, base_out);
    free(out), free(err);
    snprintf(args, sizeof args, "generate --model %s --prompt '' -n 24 --seed 3 --lora %s --rollouts-out %s", model, x,
             rollouts);
    if (run_capture(args, &out, &err)) fail_msg("%s: %s", args, err);
    if (!strcmp(out, base_out)) fail_msg("the adapter did not change the text: %s", out);
    free(out), free(err), free(base_out);
    const char *paths[] = {"", " --cpu"};
    for (int p = 0; p < 2; p++) {
        snprintf(args, sizeof args, "verify --model %s --rollouts %s --lora %s%s", model, rollouts, x, paths[p]);
        if (run_capture(args, &out, &err)) fail_msg("%s: %s%s", args, out, err);
        free(out), free(err);
        const char *others[] = {"", fresh};
        for (int k = 0; k < 2; k++) {
            snprintf(args, sizeof args, "verify --model %s --rollouts %s%s%s%s", model, rollouts, k ? " --lora " : "",
                     others[k], paths[p]);
            assert_int_equal(run_capture(args, &out, &err), 2); /* wrong weights (issue 36) */
            if (!strstr(out, "model_hash") || !strstr(err, "vkswarm: verify: wrong weights: ")) fail_msg("%s: %s", args, out);
            free(out), free(err);
        }
    }
    snprintf(args, sizeof args, "generate --model %s --prompt '' -n 4 --lora %s/no-such-adapter", model, dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    if (!one_clean_line(err) || !strstr(err, "no-such-adapter")) fail_msg("stderr: '%s'", err);
    free(out), free(err);
}

/* Issue 40 item 4: --type q4_k on the tiny model (rows of 128 and 384
 * columns, not whole 256-blocks) writes q4_0 (the nearest type whose blocks
 * fit), says which matrices and why, and the size written; --strict refuses
 * naming the first matrix and writes nothing. */
static void test_convert_fallback_said(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char args[2048], p[1024], *out, *err;
    snprintf(args, sizeof args, "convert --init tiny --out %s/q4.gguf --type q4_k", dir);
    int rc = run_capture(args, &out, &err);
    if (rc) fail_msg("convert: %d: %s", rc, err);
    expect_in(err, "vkswarm: convert: 25 matrices of 128 columns written as q4_0, not q4_k (rows are not whole "
              "256-element q4_k blocks; --strict refuses): token_embd.weight, blk.0.attn_q.weight, ");
    expect_in(err, "vkswarm: convert: 4 matrices of 384 columns written as q4_0, not q4_k");
    snprintf(p, sizeof p, "%s/q4.gguf", dir);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    char want[1200];
    snprintf(want, sizeof want, "vkswarm: convert: wrote %s: %lld bytes (", p, (long long)st.st_size);
    expect_in(err, want);
    if (st.st_size > 600000) fail_msg("q4_k of the tiny model: %lld bytes (f32 is 3.29 MB)", (long long)st.st_size);
    vks_model *m = NULL;
    assert_int_equal(vks_model_load(p, &m), VKS_OK);
    assert_int_equal(m->tok_emb.dtype, VKS_DTYPE_Q4_0);
    assert_int_equal(m->layers[0].w2.dtype, VKS_DTYPE_Q4_0);
    vks_model_free(m);
    free(out), free(err);
    snprintf(args, sizeof args, "convert --init tiny --out %s/strict.gguf --type q4_k --strict", dir);
    assert_int_equal(run_capture(args, &out, &err), 2);
    snprintf(want, sizeof want, "vkswarm: convert: --strict: %s/strict.gguf: tensor token_embd.weight has rows of 128 "
             "columns, not whole 256-element q4_k blocks\n", dir);
    expect_in(err, want);
    assert_int_equal(lines_with(err, "written as"), 0);
    snprintf(p, sizeof p, "%s/strict.gguf", dir);
    assert_int_not_equal(access(p, F_OK), 0);
    free(out), free(err);
}

/* Issue 40 item 7c/7f: a missing key file of config shardcast_key is a usage
 * error on every rank (exit 2, one line naming the file; it was 1), found
 * before MPI starts. */
static void test_rl_missing_key_exit_2(void **state) {
    (void)state;
    if (!have_program("mpirun")) skip();
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char p[600], cmd[8192], errp[700];
    snprintf(p, sizeof p, "%s/roles.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"roles\": {\"trainer\": 0, \"inference\": [[1]]}}\n", f);
    fclose(f);
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    snprintf(cmd, sizeof cmd, "timeout 120 mpirun%s --oversubscribe --mca btl tcp,self -np 2 %s rl --config %s --init tiny "
             "--steps 1 --out %s/o --timeout-s 20 --set shardcast_key=%s/nokeys 2>%s >/dev/null",
             geteuid() == 0 ? " --allow-run-as-root" : "", tu_bin(), p, dir, dir, errp);
    int rc = tu_run(cmd, NULL);
    char *err = (char *)tu_read_file(errp, NULL);
    char want[1200];
    snprintf(want, sizeof want, "vkswarm: rl: shardcast_key: %s/nokeys/shardcast.pub: cannot open Ed25519 public key "
             "(No such file or directory)\n", dir);
    if (rc != 2 || !strstr(err, want)) fail_msg("exit %d (want 2), stderr: %s", rc, err);
    free(err);
}

/* Issue 40 items 7a/7b: under mpirun, a quantized model's note comes once (the
 * trainer's), and the trainer's error carries "rl: " once (the library's
 * message and the command both said it: "vkswarm: rl: rl: OUT: holds ..."). */
static void test_rl_mpi_words_once(void **state) {
    (void)state;
    if (!have_program("mpirun")) skip();
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char p[600], cmd[8192], errp[700];
    snprintf(cmd, sizeof cmd, "%s convert --init tiny --out %s/q8.gguf --type q8_0 2>/dev/null && mkdir -p %s/used && "
             "echo x > %s/used/metrics.jsonl", tu_bin(), dir, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(p, sizeof p, "%s/roles.json", dir);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fputs("{\"roles\": {\"trainer\": 0, \"inference\": [[1]]}}\n", f);
    fclose(f);
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    snprintf(cmd, sizeof cmd, "timeout 120 mpirun%s --oversubscribe --mca btl tcp,self -np 2 %s rl --config %s --model "
             "%s/q8.gguf --steps 1 --out %s/used --timeout-s 20 2>%s >/dev/null",
             geteuid() == 0 ? " --allow-run-as-root" : "", tu_bin(), p, dir, dir, errp);
    int rc = tu_run(cmd, NULL);
    char *err = (char *)tu_read_file(errp, NULL);
    char want[1200];
    snprintf(want, sizeof want, "vkswarm: rl: %s/used: holds metrics.jsonl from an earlier run", dir);
    if (rc != 2 || !strstr(err, want) || strstr(err, "rl: rl:"))
        fail_msg("exit %d (want 2), stderr (want '%s', no 'rl: rl:'): %s", rc, want, err);
    if (lines_with(err, "quantized model: weights keep their file types") != 1)
        fail_msg("the quantized model's note %d times: %s", lines_with(err, "quantized model"), err);
    free(err);
}

/* Issue 40 item 7d: a .jsonl prompts file holds {"prompt": "..."} per line,
 * so a prompt may end in a line end; a bad line is exit 2 naming it. */
static void test_prompts_json_lines(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char cmd[8192], p[600], *out;
    snprintf(cmd, sizeof cmd, "%s convert --init tiny --out %s/tiny.gguf 2>/dev/null", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(p, sizeof p, "%s/p.jsonl", dir);
    const char *two = "{\"prompt\": \"ab\\n\"}\r\n\n  \n{\"prompt\": \"c\", \"note\": 1}";
    write_bytes(p, two, strlen(two));
    snprintf(cmd, sizeof cmd, "%s generate --model %s/tiny.gguf --prompts %s -n 6 --temp 0 --seed 1 2>/dev/null", tu_bin(),
             dir, p);
    assert_int_equal(tu_run(cmd, &out), 0);
    char *second = strchr(out, '\n');
    assert_non_null(second);
    *second++ = 0;
    expect_in(out, "{\"prompt\":\"ab\\n\",\"ids\":[256,97,98,10,");
    expect_in(second, "{\"prompt\":\"c\",\"ids\":[256,99,");
    assert_non_null(strchr(second, '\n'));
    assert_string_equal(strchr(second, '\n'), "\n"); /* two prompts: blank lines are not prompts */
    free(out);
    char errp[700];
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    const char *bad[][2] = {{"{\"prompt\": \"a\"}\n{\"prompt\": 3}\n", "line 2: \"prompt\" is not a string"},
                            {"{\"text\": \"a\"}\n", "line 1: missing \"prompt\""},
                            {"[\"a\"]\n", "line 1: not a JSON object"},
                            {"{\"prompt\": \"a\\u0000b\"}\n", "line 1: bad JSON: \\u0000 is not allowed"},
                            {"{\"prompt\": \"a\"\n", "line 1: bad JSON"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_bytes(p, bad[i][0], strlen(bad[i][0]));
        snprintf(cmd, sizeof cmd, "%s generate --model %s/tiny.gguf --prompts %s -n 4 2>%s", tu_bin(), dir, p, errp);
        expect_bad_input(cmd, errp, "p.jsonl: ", bad[i][1]);
    }
}

/* Issue 36 item 3: generate takes --chat-template, --system and --no-think as
 * tokenize --chat (and rl, eval) take them: the prompt ids it feeds (the
 * "ids" of its JSON line, before the generated ones) are tokenize's for the
 * same flags, and it shows that prompt once on stderr; the flags' bad
 * combinations are refused as eval refuses them (exit 2, one line). */
static void test_generate_chat_flags(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char args[4096], path[600], *out, *err, *ids;
    snprintf(args, sizeof args, "convert --init tiny --out %s/tiny.gguf", dir);
    assert_int_equal(run_capture(args, &out, &err), 0);
    free(out), free(err);
    snprintf(path, sizeof path, "%s/p.jsonl", dir);
    const char *prompts = "{\"prompt\": \"What is 2+2?\"}\n";
    write_bytes(path, prompts, strlen(prompts));
    static const char *const flags[] = {"--chat-template qwen3 --system 'Be brief.' --no-think",
                                        "--chat-template chatml --system 'Be brief.'", "--chat-template llama3"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        snprintf(args, sizeof args, "tokenize --model %s/tiny.gguf --chat %s --prompt 'What is 2+2?'", dir, flags[i]);
        assert_int_equal(run_capture(args, &ids, &err), 0);
        free(err);
        ids[strcspn(ids, "\n")] = 0;
        for (char *c = ids; *c; c++) *c = *c == ' ' ? ',' : *c; /* "256 60 ..." -> "256,60,..." */
        snprintf(args, sizeof args, "generate --model %s/tiny.gguf --prompts %s -n 200 --temp 0 --seed 1 %s", dir, path,
                 flags[i]);
        assert_int_equal(run_capture(args, &out, &err), 0);
        char want[8192];
        snprintf(want, sizeof want, "{\"prompt\":\"What is 2+2?\",\"ids\":[%s,", ids); /* then generated ids */
        if (!strstr(out, want) || count_lines(out) != 1) fail_msg("%s:\nstdout %s\nwant %s", flags[i], out, want);
        if (lines_with(err, "vkswarm: generate: prompt: ") != 1) fail_msg("%s: stderr %s", flags[i], err);
        free(out), free(err), free(ids);
    }
    snprintf(args, sizeof args, "generate --model %s/tiny.gguf --prompt hi -n 40 --temp 0 --seed 1 "
             "--chat-template qwen3 --system 'Be brief.' --no-think", dir);
    assert_int_equal(run_capture(args, &out, &err), 0);
    expect_in(err, "vkswarm: generate: prompt: <|im_start|>system\\x0aBe brief.<|im_end|>\\x0a<|im_start|>user\\x0ahi"
                   "<|im_end|>\\x0a<|im_start|>assistant\\x0a<think>\\x0a\\x0a</think>\\x0a\\x0a\n");
    free(out), free(err);
    static const struct { const char *flags, *want; } bad[] = {
        {"--system 'Be brief.'", "prompt.system needs a chat template"},
        {"--no-think", "prompt.think = false needs a chat template"},
        {"--chat-template chatml --no-think", "chat template chatml has no thinking switch"},
        {"--chat-template mistral", "--chat-template: unknown chat template 'mistral'"},
        {"--chat-template model", "prompt.chat_template model: the tokenizer has no chat template"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "generate --model %s/tiny.gguf --prompt hi -n 8 %s", dir, bad[i].flags);
        int rc = run_capture(args, &out, &err);
        if (rc != 2 || *out || !strstr(err, bad[i].want) || count_lines(err) != 1)
            fail_msg("%s: exit %d, stderr %s", bad[i].flags, rc, err);
        free(out), free(err);
    }
}

/* Issue 36 item 3: eval --show N prints, before its summary, one JSON line
 * per task for the first N tasks: the prompt as the model got it, the
 * expected answer and each completion with its answer, reward and length;
 * shown for every task, those rewards and lengths are the summary's; strings
 * from the task file and the model are escaped (no raw control byte). */
static void test_eval_show(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char args[4096], path[600], *out, *err;
    snprintf(path, sizeof path, "%s/t.jsonl", dir);
    const char *tasks = "{\"prompt\": \"\\u001b[31mred\\u001b[0m 20+22=\", \"answer\": 42, \"task_type\": \"numeric\"}\n"
                        "{\"prompt\": \"sort 3 1 2\", \"answer\": \"1 2 3\", \"task_type\": \"list\", \"kind\": \"lists\"}\n"
                        "{\"prompt\": \"say yes\", \"answer\": \"yes\", \"task_type\": \"exact\"}\n";
    write_bytes(path, tasks, strlen(tasks));
    snprintf(args, sizeof args, "convert --init tiny --out %s/tiny.gguf", dir);
    assert_int_equal(run_capture(args, &out, &err), 0);
    free(out), free(err);
    snprintf(args, sizeof args, "eval --model %s/tiny.gguf --task %s --samples 2 --max-new 6 --show 5", dir, path);
    assert_int_equal(run_capture(args, &out, &err), 0);
    assert_int_equal(count_lines(out), 4); /* three tasks (fewer than 5), then the summary */
    for (const char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20 && *c != '\n') fail_msg("raw control byte 0x%02x on stdout: %s", *c, out);
    expect_in(out, "\"prompt\": \"\\u001b[31mred\\u001b[0m 20+22=\", \"expected\": \"42\"");
    expect_in(out, "{\"show\": 2, \"line\": 2, \"kind\": \"lists\", \"prompt\": \"sort 3 1 2\", \"expected\": \"1 2 3\", ");
    double reward_sum = 0, tokens_sum = 0;
    char *line = out;
    for (int i = 0; i < 3; i++) {
        char *end = strchr(line, '\n');
        json_error_t e;
        json_t *o = json_loadb(line, (size_t)(end - line), 0, &e);
        if (!o) fail_msg("line %d is not JSON (%s): %s", i + 1, e.text, line);
        assert_int_equal(json_integer_value(json_object_get(o, "show")), i + 1);
        assert_int_equal(json_integer_value(json_object_get(o, "line")), i + 1);
        json_t *c = json_object_get(o, "completions");
        assert_int_equal(json_array_size(c), 2);
        for (size_t j = 0; j < 2; j++) {
            json_t *one = json_array_get(c, j);
            assert_true(json_is_string(json_object_get(one, "text")));
            json_t *a = json_object_get(one, "answer");
            assert_true(json_is_null(a) || json_is_string(a));
            reward_sum += json_number_value(json_object_get(one, "reward"));
            tokens_sum += (double)json_integer_value(json_object_get(one, "tokens"));
        }
        json_decref(o);
        line = end + 1;
    }
    json_t *summary = json_loads(line, 0, NULL);
    assert_non_null(summary);
    assert_float_equal(json_number_value(json_object_get(summary, "accuracy")), reward_sum / 6, 1e-6);
    assert_float_equal(json_number_value(json_object_get(summary, "mean_length")), tokens_sum / 6, 1e-3);
    json_decref(summary);
    free(out), free(err);
    snprintf(args, sizeof args, "eval --model %s/tiny.gguf --task %s --max-new 4 --show 1", dir, path);
    assert_int_equal(run_capture(args, &out, &err), 0);
    assert_int_equal(count_lines(out), 2);
    assert_int_equal(lines_with(out, "{\"show\": "), 1);
    free(out), free(err);
    snprintf(args, sizeof args, "eval --model %s/tiny.gguf --data %s --show 1", dir, path);
    assert_int_equal(run_capture(args, &out, &err), 2);
    expect_in(err, "--show and the prompt flags go with --task");
    free(out), free(err);
}

/* A copy of the tiny model as a Hugging Face directory whose
 * tokenizer_config.json holds chat template tmpl. */
static void tiny_with_template(const char *tiny_dir, const char *dir, const char *tmpl) {
    char cmd[2048], path[1024];
    snprintf(cmd, sizeof cmd, "cp -r %s %s", tiny_dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    assert_non_null(cfg);
    assert_int_equal(json_object_set_new(cfg, "chat_template", json_string(tmpl)), 0);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(2)), 0);
    json_decref(cfg);
}

/* Runs vkswarm args; expects exit 0 and stderr holding want_err. stdout returned. */
static char *run_ok_saying(const char *args, const char *want_err) {
    char *out, *err;
    int rc = run_capture(args, &out, &err);
    if (rc != 0 || !strstr(err, want_err)) fail_msg("'%s': exit %d, stderr '%s' (want '%s')", args, rc, err, want_err);
    free(err);
    return out;
}

/* The text of token ids (tokenize's output line) by `detokenize --model model`. */
static char *detokenized(const char *ids, const char *model) {
    char cmd[16384], *out;
    snprintf(cmd, sizeof cmd, "printf '%%s' '%s' | %s detokenize --model %s", ids, tu_bin(), model);
    assert_int_equal(tu_run(cmd, &out), 0);
    return out;
}

/* Issue 36 item 3: --chat-template model on Qwen2.5-0.5B-Instruct's and
 * Qwen3-0.6B's own Jinja templates (tests/chat_templates.h, in a
 * tokenizer_config.json and carried into a GGUF): stderr names the file and
 * the family; Qwen2.5's default system message is kept (the tokens are
 * chatml's with that system message; --system replaces it), Qwen3 has none
 * and takes --no-think; tokenize, generate and eval say and render the same.
 * A template of no known family is refused naming the file (exit 2, one line). */
static void test_chat_template_model(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    char args[4096], want[1024], *out, *err;
    snprintf(args, sizeof args, "convert --init tiny --out %s/tiny", dir);
    assert_int_equal(run_capture(args, &out, &err), 0);
    free(out), free(err);
    char q25[300], q3[300], other[300], tiny[300];
    snprintf(tiny, sizeof tiny, "%s/tiny", dir);
    snprintf(q25, sizeof q25, "%s/qwen25", dir), snprintf(q3, sizeof q3, "%s/qwen3", dir);
    snprintf(other, sizeof other, "%s/other", dir);
    tiny_with_template(tiny, q25, QWEN25_TEMPLATE);
    tiny_with_template(tiny, q3, QWEN3_TEMPLATE);
    tiny_with_template(tiny, other, "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}");
    const char *qwen_system = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";
    /* Qwen2.5: chatml with its default system message */
    snprintf(want, sizeof want, "vkswarm: tokenize: chat template: %s/tokenizer_config.json: family chatml, default "
             "system message kept: \"%s\"\n", q25, qwen_system);
    snprintf(args, sizeof args, "tokenize --model %s --chat --prompt Hi", q25);
    char *model_ids = run_ok_saying(args, want);
    snprintf(args, sizeof args, "tokenize --model %s --chat --chat-template chatml --system '%s' --prompt Hi", q25,
             qwen_system);
    char *chatml_ids = run_ok_saying(args, "");
    assert_string_equal(model_ids, chatml_ids);
    free(model_ids), free(chatml_ids);
    snprintf(args, sizeof args, "generate --model %s --chat-template model --prompt Hi -n 200 --temp 0 --seed 1", q25);
    snprintf(want, sizeof want, "vkswarm: generate: prompt: <|im_start|>system\\x0a%s<|im_end|>\\x0a<|im_start|>user\\x0aHi"
             "<|im_end|>\\x0a<|im_start|>assistant\\x0a\n", qwen_system);
    free(run_ok_saying(args, want));
    free(run_ok_saying(args, "vkswarm: generate: chat template: "));
    snprintf(args, sizeof args, "eval --model %s --task add:1:short --n 1 --max-new 2 --chat-template model --show 1", q25);
    snprintf(want, sizeof want, "vkswarm: eval: chat template: %s/tokenizer_config.json: family chatml, default system "
             "message kept", q25);
    out = run_ok_saying(args, want);
    snprintf(want, sizeof want, "\"prompt\": \"<|im_start|>system\\n%s<|im_end|>\\n<|im_start|>user\\n", qwen_system);
    expect_in(out, want);
    free(out);
    snprintf(args, sizeof args, "tokenize --model %s --chat --system 'Be brief.' --prompt Hi", q25);
    char *ids = run_ok_saying(args, "its default system message replaced by the one given");
    out = detokenized(ids, q25);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out), free(ids);
    /* the same template carried into a GGUF (tokenizer.chat_template) */
    snprintf(args, sizeof args, "convert --in %s --out %s/qwen25.gguf", q25, dir);
    free(run_ok_saying(args, ""));
    snprintf(args, sizeof args, "tokenize --model %s/qwen25.gguf --chat --prompt Hi", dir);
    snprintf(want, sizeof want, "vkswarm: tokenize: chat template: %s/qwen25.gguf: family chatml, default system message "
             "kept: \"%s\"\n", dir, qwen_system);
    free(run_ok_saying(args, want));
    /* Qwen3: no default system message; --no-think */
    snprintf(args, sizeof args, "tokenize --model %s --chat --no-think --prompt Hi", q3);
    snprintf(want, sizeof want, "vkswarm: tokenize: chat template: %s/tokenizer_config.json: family qwen3, no default "
             "system message\n", q3);
    ids = run_ok_saying(args, want);
    out = detokenized(ids, q3);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out), free(ids);
    snprintf(args, sizeof args, "eval --model %s --task add:1:short --n 1 --max-new 2 --chat-template model --no-think", q3);
    free(run_ok_saying(args, "vkswarm: eval: prompt: <|im_start|>user\\x0a"));
    /* a template of no known family: refused by name, never replaced */
    static const char *const refused[] = {"tokenize --model %s --chat --prompt Hi",
                                          "generate --model %s --chat-template model --prompt Hi -n 8",
                                          "eval --model %s --task add:1 --n 1 --chat-template model"};
    snprintf(want, sizeof want, "%s/tokenizer_config.json: the chat template is not recognised (known families: chatml, "
             "qwen3, llama2, llama3, llama3.1, phi3)", other);
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        snprintf(args, sizeof args, refused[i], other);
        int rc = run_capture(args, &out, &err);
        if (rc != 2 || *out || !strstr(err, want) || count_lines(err) != 1) fail_msg("'%s': exit %d, stderr %s", args, rc, err);
        free(out), free(err);
    }
}

/* Issue 40 item 7e: --no-think with a template that has no thinking switch is
 * refused (exit 2), as rl and eval refuse prompt.think = false. */
static void test_tokenize_no_think_refused(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char cmd[8192], errp[700];
    snprintf(errp, sizeof errp, "%s/err.txt", dir);
    snprintf(cmd, sizeof cmd, "%s convert --init tiny --out %s/tiny.gguf 2>/dev/null", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "printf Hi | %s tokenize --model %s/tiny.gguf --chat --chat-template chatml --no-think "
             ">/dev/null 2>%s", tu_bin(), dir, errp);
    expect_bad_input(cmd, errp, "vkswarm tokenize: prompt.think = false: chat template chatml has no thinking switch (qwen3 has)",
                     "see vkswarm tokenize --help");
    snprintf(cmd, sizeof cmd, "printf Hi | %s tokenize --model %s/tiny.gguf --chat --chat-template qwen3 --no-think "
             ">/dev/null 2>%s", tu_bin(), dir, errp);
    assert_int_equal(tu_run(cmd, NULL), 0);
}

/* Issue 40 item 7b: loading notes are said by one rank of an MPI job (the
 * launcher's rank variable; before MPI_Init). */
static void test_quantized_note_once(void **state) {
    (void)state;
    char dir[256];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir()); /* tu_tmpdir's buffer is reused by run_capture */
    char cmd[8192], *out;
    snprintf(cmd, sizeof cmd, "%s convert --init tiny --out %s/q8.gguf --type q8_0 2>/dev/null", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    const char *env[] = {"", "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_RANK=1"};
    for (int i = 0; i < 3; i++) {
        snprintf(cmd, sizeof cmd, "%s %s train plan --model %s/q8.gguf --lora-rank 4 2>&1 >/dev/null", env[i], tu_bin(),
                 dir);
        assert_int_equal(tu_run(cmd, &out), 0);
        if (lines_with(out, "quantized model: weights keep their file types") != (i < 2))
            fail_msg("'%s': %s", env[i], out);
        free(out);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_help_everywhere),        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_train_plan),
        cmocka_unit_test(test_bench_small),
        cmocka_unit_test(test_generate_reference_text), cmocka_unit_test(test_logits_file),
        cmocka_unit_test(test_prompts_jsonl),          cmocka_unit_test(test_bad_files_exit_2),
        cmocka_unit_test(test_input_lines_nul_and_crlf), cmocka_unit_test(test_tokenizer_of_another_model),
        cmocka_unit_test(test_stdout_full_exits_1),    cmocka_unit_test(test_convert_onto_input),
        cmocka_unit_test(test_convert_lora), cmocka_unit_test(test_lora_cli),
        cmocka_unit_test(test_train_sft_lora_norm),
        cmocka_unit_test(test_write_failure_leaves_nothing),
        cmocka_unit_test(test_kv_f16_rollouts_verified),
        cmocka_unit_test(test_option_errors_one_line), cmocka_unit_test(test_mpirun_wrapper), cmocka_unit_test(test_mpirun_join), cmocka_unit_test(test_messages_say_what_happened),
        cmocka_unit_test(test_verify_ids_escaped),     cmocka_unit_test(test_verify_group_sampling),     cmocka_unit_test(test_prompts_json_invalid_utf8),
        cmocka_unit_test(test_file_strings_escaped_in_messages),
        cmocka_unit_test(test_init_tiny), cmocka_unit_test(test_train_sft_resume),
        cmocka_unit_test(test_train_sft_lora),
        cmocka_unit_test(test_rl_needs_mpirun), cmocka_unit_test(test_rl_help_sections_exist), cmocka_unit_test(test_rl_report), cmocka_unit_test(test_rl_clean_stop), cmocka_unit_test(test_train_clean_stop),
        cmocka_unit_test(test_train_sft_sentencepiece), cmocka_unit_test(test_train_out_dir),
        cmocka_unit_test(test_tasks_eval),            cmocka_unit_test(test_rl_and_data_inputs_exit_2),
        cmocka_unit_test(test_own_tasks),
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_convert_fallback_said), cmocka_unit_test(test_rl_missing_key_exit_2),
        cmocka_unit_test(test_rl_mpi_words_once), cmocka_unit_test(test_prompts_json_lines),
        cmocka_unit_test(test_tokenize_no_think_refused), cmocka_unit_test(test_quantized_note_once),
        cmocka_unit_test(test_generate_chat_flags), cmocka_unit_test(test_eval_show),
        cmocka_unit_test(test_chat_template_model),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
