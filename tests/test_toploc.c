/* TOPLOC proofs, rollout files and verification: the polynomial layer against
 * hand values, proofs against perturbed rows, hostile rollout lines, honest
 * work across implementations (GPU generation verified on the CPU reference
 * and the other way round, several batchings, subgroup sizes through the
 * CLI) and every kind of cheat caught in each of 200 samples. */
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "vkswarm/vks_cpu.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_philox.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_sched.h"
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_verify_group.h"

enum { N_SAMPLES = 200, STEPS = 40 };
/* Samples per case: N_SAMPLES; 50 with VKSWARM_TEST_SHORT (tools/test's ASan
 * run: the same code and the same every-sample checks, on fewer samples; the
 * normal build runs all 200). Set in main. */
static int n_samples = N_SAMPLES;

static vks_gpu *gpu;
static vks_model *stories;
static uint8_t stories_hash[32];

static int setup(void **state) {
    (void)state;
    if (!(gpu = tu_gpu_open())) return -1;
    const char *path = tu_shared_path("stories260K/stories260K.bin");
    if (path && (vks_model_load_llama2c(path, &stories) || vks_model_hash(stories, stories_hash))) return -1;
    return 0;
}

static vks_rollout_sample *honest_base;
static void free_samples(vks_rollout_sample *s, int n);

static int teardown(void **state) {
    (void)state;
    if (honest_base) free_samples(honest_base, n_samples);
    vks_model_free(stories);
    vks_gpu_destroy(gpu);
    return 0;
}

static const char *dump_label = "honest"; /* VKSWARM_TOPLOC_DUMP: per-sample statistics */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return *s >> 33;
}

/* ---------------- the polynomial layer ---------------- */

static void test_poly_known_values(void **state) {
    (void)state;
    /* through (0,5), (1,7): 5 + 2x; through (1,1), (2,4), (3,9): x^2 */
    uint32_t x1[] = {0, 1}, x2[] = {1, 2, 3};
    uint16_t y1[] = {5, 7}, y2[] = {1, 4, 9};
    vks_toploc_poly p = {.m = VKS_TOPLOC_PRIME};
    assert_int_equal(vks_toploc_interpolate(x1, y1, 2, p.coeffs), VKS_OK);
    assert_int_equal(p.coeffs[0], 5);
    assert_int_equal(p.coeffs[1], 2);
    assert_int_equal(p.coeffs[2], 0);
    assert_int_equal(vks_toploc_interpolate(x2, y2, 3, p.coeffs), VKS_OK);
    assert_int_equal(p.coeffs[0], 0);
    assert_int_equal(p.coeffs[1], 0);
    assert_int_equal(p.coeffs[2], 1);
    assert_int_equal(vks_toploc_poly_eval(&p, 300), (300 * 300) % VKS_TOPLOC_PRIME);
    /* (x - 1)(x - 2) mod p at a large x, through Horner */
    uint16_t y3[] = {0, 0, 2};
    assert_int_equal(vks_toploc_interpolate(x2, y3, 3, p.coeffs), VKS_OK);
    assert_int_equal(vks_toploc_poly_eval(&p, 65000), (uint32_t)((64999ULL * 64998ULL) % VKS_TOPLOC_PRIME));
    uint32_t dup[] = {4, 4};
    assert_int_not_equal(vks_toploc_interpolate(dup, y1, 2, p.coeffs), VKS_OK);
}

static void test_poly_random_points(void **state) {
    (void)state;
    uint64_t s = 42;
    for (int trial = 0; trial < 20; trial++) {
        uint32_t x[VKS_TOPLOC_K];
        uint16_t y[VKS_TOPLOC_K];
        int n = 1 + (int)(rng_next(&s) % VKS_TOPLOC_K);
        for (int i = 0; i < n; i++) {
            x[i] = (uint32_t)(i * 511 + rng_next(&s) % 500); /* distinct */
            y[i] = (uint16_t)(rng_next(&s) % 65497);
        }
        vks_toploc_poly p = {.m = VKS_TOPLOC_PRIME};
        assert_int_equal(vks_toploc_interpolate(x, y, n, p.coeffs), VKS_OK);
        for (int i = 0; i < n; i++) assert_int_equal(vks_toploc_poly_eval(&p, x[i]), y[i]);
        uint8_t bytes[VKS_TOPLOC_PROOF_BYTES];
        vks_toploc_poly back;
        vks_toploc_poly_write(&p, bytes);
        assert_int_equal(vks_toploc_poly_parse(bytes, sizeof bytes, &back), VKS_OK);
        assert_memory_equal(&back, &p, sizeof p);
    }
}

static void test_poly_parse_rejects(void **state) {
    (void)state;
    uint8_t b[VKS_TOPLOC_PROOF_BYTES] = {0};
    vks_toploc_poly p;
    assert_int_equal(vks_toploc_poly_parse(b, sizeof b, &p), VKS_ERR_FORMAT); /* m = 0 */
    assert_non_null(strstr(vks_last_error(), "m = 0"));
    b[0] = 0xFF, b[1] = 0xD8; /* 65496: fine */
    assert_int_equal(vks_toploc_poly_parse(b, sizeof b, &p), VKS_OK);
    b[0] = 0xFF, b[1] = 0xFF;
    assert_int_equal(vks_toploc_poly_parse(b, sizeof b, &p), VKS_ERR_FORMAT);
    b[1] = 0xD9; /* m = 65497 */
    b[2 + 2 * 77] = 0xFF, b[3 + 2 * 77] = 0xD9; /* coefficient 77 = 65497 */
    assert_int_equal(vks_toploc_poly_parse(b, sizeof b, &p), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "coefficient 77"));
    assert_int_equal(vks_toploc_poly_parse(b, 130, &p), VKS_ERR_FORMAT); /* k = 64 */
}

static void test_topk_ties_and_nan(void **state) {
    (void)state;
    /* |values|: 2, 3, 3, nan, 1, -3, 0 */
    uint16_t v[] = {vks_f32_to_bf16(2), vks_f32_to_bf16(3), vks_f32_to_bf16(3), 0x7FC1,
                    vks_f32_to_bf16(1), vks_f32_to_bf16(-3), 0};
    uint32_t idx[8];
    assert_int_equal(vks_toploc_topk(v, 7, 2, idx), 2);
    assert_int_equal(idx[0], 1); /* ties at 3: lower indices first */
    assert_int_equal(idx[1], 2);
    assert_int_equal(vks_toploc_topk(v, 7, 4, idx), 4);
    uint32_t want[] = {0, 1, 2, 5};
    assert_memory_equal(idx, want, sizeof want);
    assert_int_equal(vks_toploc_topk(v, 7, 7, idx), 7); /* NaN comes last */
    assert_int_equal(idx[3], 3);
}

/* ---------------- proofs ---------------- */

static void check_rows(const uint8_t *proof, const float *rows, int n_rows, int dim, bool want, int *exp_mis) {
    vks_toploc_thresholds th;
    vks_toploc_thresholds_default(&th);
    bool ok;
    vks_toploc_stats st;
    char why[160];
    assert_int_equal(vks_toploc_check_chunk(proof, VKS_TOPLOC_PROOF_BYTES, rows, n_rows, dim, &th, &ok, &st, why,
                                            sizeof why), VKS_OK);
    if (ok != want) fprintf(stderr, "chunk %s: %s (exp %d mean %.2f median %.1f)\n", ok ? "accepted" : "rejected", why,
                            st.exp_mismatches, st.mant_mean, st.mant_median);
    assert_true(ok == want);
    if (exp_mis) *exp_mis = st.exp_mismatches;
}

static void test_proof_self_and_perturbed(void **state) {
    (void)state;
    const int dims[] = {64, 288, 4096}; /* 4096: 131072 values, the modulus search runs */
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++) {
        int dim = dims[d], rows = 32;
        size_t n = (size_t)rows * (size_t)dim;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        tu_fill_uniform(x, n, 7 + d, -3.0f, 3.0f);
        uint8_t proof[VKS_TOPLOC_PROOF_BYTES];
        assert_int_equal(vks_toploc_chunk_proof(x, rows, dim, proof), VKS_OK);
        int mis;
        check_rows(proof, x, rows, dim, true, &mis);
        assert_int_equal(mis, 0);
        /* 1e-4 relative noise: bf16 rounding barely moves */
        for (size_t i = 0; i < n; i++) y[i] = x[i] * (1.0f + 1e-4f * (float)((int)((i * 7919) % 3) - 1));
        check_rows(proof, y, rows, dim, true, NULL);
        /* 5% scale: the mantissas move by ~6 units of 128 on average... and the median too */
        for (size_t i = 0; i < n; i++) y[i] = x[i] * 1.15f;
        check_rows(proof, y, rows, dim, false, NULL);
        /* other values altogether */
        tu_fill_uniform(y, n, 99 + d, -3.0f, 3.0f);
        check_rows(proof, y, rows, dim, false, NULL);
        free(x);
        free(y);
    }
}

static void test_build_sizes_and_builder(void **state) {
    (void)state;
    assert_int_equal(vks_toploc_proof_size(0), 0);
    assert_int_equal(vks_toploc_proof_size(1), 258);
    assert_int_equal(vks_toploc_proof_size(32), 258);
    assert_int_equal(vks_toploc_proof_size(33), 516);
    const int dim = 64, n_seqs = 3, lens[] = {1, 33, 70};
    float *rows[3];
    vks_toploc_builder *b;
    assert_int_equal(vks_toploc_builder_create(n_seqs, dim, &b), VKS_OK);
    for (int s = 0; s < n_seqs; s++) {
        rows[s] = malloc(sizeof(float) * (size_t)lens[s] * dim);
        tu_fill_uniform(rows[s], (size_t)lens[s] * dim, 100 + (uint64_t)s, -2, 2);
    }
    for (int r = 0; r < 70; r++) /* interleaved as decode steps push them */
        for (int s = 0; s < n_seqs; s++)
            if (r < lens[s]) assert_int_equal(vks_toploc_builder_push(b, s, rows[s] + (size_t)r * dim), VKS_OK);
    assert_int_equal(vks_toploc_builder_finish(b), VKS_OK);
    for (int s = 0; s < n_seqs; s++) {
        size_t len, want = vks_toploc_proof_size((size_t)lens[s]);
        const uint8_t *got = vks_toploc_builder_proofs(b, s, &len);
        assert_int_equal(len, want);
        uint8_t *ref = malloc(want);
        assert_int_equal(vks_toploc_build(rows[s], lens[s], dim, ref), VKS_OK);
        assert_memory_equal(got, ref, want);
        free(ref);
        free(rows[s]);
    }
    vks_toploc_builder_destroy(b);
}

/* ---------------- rollout files ---------------- */

static vks_rollout_header make_header(void) {
    vks_rollout_header h = {.version = 1, .n_stop = 2, .stop_ids = {1, 2}};
    snprintf(h.model, sizeof h.model, "stories260K");
    memcpy(h.model_hash, stories_hash, 32);
    return h;
}

static void test_rollout_roundtrip(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    vks_rollout_header h = make_header();
    int32_t prompt[] = {1, 400, 7}, out[] = {5, 6, 2};
    uint8_t proofs[VKS_TOPLOC_PROOF_BYTES];
    for (int i = 0; i < VKS_TOPLOC_PROOF_BYTES; i++) proofs[i] = (uint8_t)(i * 37);
    vks_rollout_sample s = {.id = "a\"b\\c\n", .prompt_ids = prompt, .n_prompt = 3, .output_ids = out, .n_output = 3,
                            .seed = 18446744073709551615ULL, .seq = 4000000000u, .temperature = 0.7f, .top_k = 40,
                            .top_p = 0.9f, .max_steps = 40, .proofs = proofs, .proof_bytes = sizeof proofs};
    memcpy(s.model_hash, stories_hash, 32);
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    assert_int_equal(vks_rollout_write_sample(f, &s), VKS_OK);
    s.seed = 12345;
    s.temperature = 0;
    assert_int_equal(vks_rollout_write_sample(f, &s), VKS_OK);
    fclose(f);
    vks_rollout_file rf;
    assert_int_equal(vks_rollout_read_mem(buf, len, "mem", &rf), VKS_OK);
    assert_int_equal(rf.n_samples, 2);
    assert_memory_equal(rf.header.model_hash, stories_hash, 32);
    assert_int_equal(rf.header.n_stop, 2);
    vks_rollout_sample *r = &rf.samples[0];
    assert_string_equal(r->id, "a\"b\\c\n");
    assert_int_equal(r->n_prompt, 3);
    assert_memory_equal(r->prompt_ids, prompt, sizeof prompt);
    assert_memory_equal(r->output_ids, out, sizeof out);
    assert_true(r->seed == 18446744073709551615ULL);
    assert_int_equal(r->seq, 4000000000u);
    assert_true(r->temperature == 0.7f && r->top_p == 0.9f && r->top_k == 40 && r->max_steps == 40);
    assert_int_equal(r->proof_bytes, sizeof proofs);
    assert_memory_equal(r->proofs, proofs, sizeof proofs);
    assert_true(rf.samples[1].seed == 12345 && rf.samples[1].temperature == 0.0f);
    vks_rollout_file_free(&rf);
    free(buf);
}

/* A model name (a path) that is not UTF-8 still gives a valid header: its
 * invalid bytes become U+FFFD (issue 9, item 17). */
static void test_rollout_header_model_not_utf8(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    vks_rollout_header h = make_header();
    snprintf(h.model, sizeof h.model, "m\xff\xc3.gguf");
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    fclose(f);
    vks_rollout_file rf;
    assert_int_equal(vks_rollout_read_mem(buf, len, "mem", &rf), VKS_OK);
    assert_string_equal(rf.header.model, "m\xef\xbf\xbd\xef\xbf\xbd.gguf");
    vks_rollout_file_free(&rf);
    free(buf);
}

/* The KV cache type (issue 28): an f16 header round-trips as "kv_type":"f16";
 * an f32 header carries no kv_type (files as before); "kv_type":"f32" reads
 * as f32 and any other value is refused. */
static void test_rollout_header_kv_type(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    vks_rollout_header h = make_header();
    h.kv_f16 = true;
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    fclose(f);
    assert_non_null(strstr(buf, "\"kv_type\":\"f16\""));
    vks_rollout_header got;
    assert_int_equal(vks_rollout_parse_header(buf, len - 1, &got), VKS_OK);
    assert_true(got.kv_f16);
    free(buf);
    f = open_memstream(&buf, &len);
    h.kv_f16 = false;
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    fclose(f);
    assert_null(strstr(buf, "kv_type"));
    assert_int_equal(vks_rollout_parse_header(buf, len - 1, &got), VKS_OK);
    assert_false(got.kv_f16);
    char line[1024];
    const char *values[] = {"\"f32\"", "\"f8\"", "16", "null"};
    for (int i = 0; i < 4; i++) {
        snprintf(line, sizeof line, "%.*s,\"kv_type\":%s}", (int)(len - 2), buf, values[i]);
        int rc = vks_rollout_parse_header(line, strlen(line), &got);
        assert_int_equal(rc, i == 0 ? VKS_OK : VKS_ERR_FORMAT);
        if (i == 0) assert_false(got.kv_f16);
        else assert_non_null(strstr(vks_last_error(), "kv_type"));
    }
    free(buf);
}

/* Issue 36: the policy that made a rollout file (header policy_step and
 * policy_weights, each record policy_step) round-trips; without them a file
 * reads as before, the policy unknown; bad values are refused by name. */
static void test_rollout_policy(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    vks_rollout_header h = make_header(), got;
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    fclose(f);
    assert_null(strstr(buf, "policy"));
    assert_int_equal(vks_rollout_parse_header(buf, len - 1, &got), VKS_OK);
    assert_false(got.has_policy);
    assert_string_equal(got.policy_weights, "");
    free(buf);
    f = open_memstream(&buf, &len);
    h.has_policy = true, h.policy_step = 7;
    snprintf(h.policy_weights, sizeof h.policy_weights, "out/step-000000007");
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    fclose(f);
    assert_non_null(strstr(buf, "\"policy_step\":7,\"policy_weights\":\"out/step-000000007\""));
    assert_int_equal(vks_rollout_parse_header(buf, len - 1, &got), VKS_OK);
    assert_true(got.has_policy);
    assert_int_equal(got.policy_step, 7);
    assert_string_equal(got.policy_weights, "out/step-000000007");
    char line[1024];
    const char *bad[] = {"\"policy_step\":-1", "\"policy_step\":\"7\"", "\"policy_step\":1.5",
                         "\"policy_step\":1,\"policy_weights\":3"};
    for (int i = 0; i < 4; i++) {
        snprintf(line, sizeof line, "{\"format\":\"vkswarm-rollouts\",\"version\":1,\"model_hash\":\"%064d\","
                 "\"stop_ids\":[],%s}", 0, bad[i]);
        assert_int_equal(vks_rollout_parse_header(line, strlen(line), &got), VKS_ERR_FORMAT);
        assert_non_null(strstr(vks_last_error(), i == 3 ? "policy_weights" : "policy_step"));
    }
    free(buf);
    /* a record: policy_step written when known, read back; absent: unknown */
    int32_t p[1] = {1}, o[1] = {2};
    vks_rollout_sample s = {.id = "a", .prompt_ids = p, .n_prompt = 1, .output_ids = o, .n_output = 1, .max_steps = 2,
                            .has_policy = true, .policy_step = 3}, r;
    for (int k = 0; k < 2; k++) {
        f = open_memstream(&buf, &len);
        assert_int_equal(vks_rollout_write_sample(f, &s), VKS_OK);
        fclose(f);
        assert_int_equal(vks_rollout_parse_sample(buf, len - 1, &r), VKS_OK);
        assert_true(r.has_policy == s.has_policy);
        if (s.has_policy) assert_int_equal(r.policy_step, 3);
        else assert_null(strstr(buf, "policy_step"));
        vks_rollout_sample_free(&r);
        free(buf);
        s.has_policy = false;
    }
}

/* vks_verify_batch refuses an engine whose KV cache type is not the samples'
 * (kv_f16 both ways) before replaying anything. */
static void test_verify_kv_type_mismatch(void **state) {
    (void)state;
    if (!stories) skip();
    vks_verify_options o;
    vks_verify_options_default(&o);
    vks_verdict v;
    for (int f16 = 0; f16 < 2; f16++) {
        vks_engine_options eo = {.n_slots = 1, .kv_len = 1, .max_rows = 16, .max_out_rows = 16, .f32_math = true,
                                 .kv_f16 = f16 == 1};
        vks_engine *e;
        assert_int_equal(vks_engine_create(gpu, stories, &eo, &e), VKS_OK);
        o.kv_f16 = f16 == 0;
        assert_int_equal(vks_verify_batch(e, &o, NULL, 0, &v), VKS_ERR_ARG);
        assert_non_null(strstr(vks_last_error(), "KV cache"));
        o.kv_f16 = f16 == 1;
        assert_int_equal(vks_verify_batch(e, &o, NULL, 0, &v), VKS_OK);
        vks_engine_destroy(e);
    }
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

static void test_rollout_malformed(void **state) {
    (void)state;
    char hex[65];
    vks_hash_hex(stories_hash, hex);
    char header[512];
    snprintf(header, sizeof header,
             "{\"format\":\"vkswarm-rollouts\",\"version\":1,\"model\":\"m\",\"model_hash\":\"%s\",\"stop_ids\":[1,2]}\n",
             hex);
    char good[1024];
    snprintf(good, sizeof good,
             "{\"id\":\"x\",\"prompt_ids\":[1],\"output_ids\":[2],\"seed\":1,\"seq\":0,\"temperature\":1,\"top_k\":0,"
             "\"top_p\":0.9,\"max_steps\":8,\"model_hash\":\"%s\",\"proofs\":\"\"}", hex);
    struct { const char *from, *to, *want; } cases[] = {
        {"\"prompt_ids\":[1]", "\"prompt_ids\":[-1]", "not a token id"},
        {"\"prompt_ids\":[1]", "\"prompt_ids\":[99999999999999999999999]", "not JSON"},
        {"\"prompt_ids\":[1]", "\"prompt_ids\":\"1\"", "not an array"},
        {"\"seed\":1", "\"seed\":-1", "unsigned 64-bit"},
        {"\"seed\":1", "\"seed\":\"18446744073709551616\"", "does not fit"},
        {"\"temperature\":1", "\"temperature\":1e999", "not JSON"},
        {"\"temperature\":1", "\"temperature\":-1", "outside"},
        {"\"top_p\":0.9", "\"top_p\":1.5", "outside"},
        {"\"max_steps\":8", "\"max_steps\":0", "outside"},
        {"\"max_steps\":8", "\"max_steps\":4294967296", "outside"},
        {"\"proofs\":\"\"", "\"proofs\":\"AAA*\"", "base64"},
        {"\"proofs\":\"\"", "\"proofs\":\"AAA\"", "base64"},
        {"\"proofs\":\"\"", "\"proofs\":7", "base64"},
        {"\"id\":\"x\"", "\"id\":\"x\",\"id\":\"y\"", "not JSON"},
        {"\"id\":\"x\",", "", "missing field \"id\""},
        {"\"seq\":0,", "", "missing field \"seq\""},
        {"\"model_hash\":\"", "\"model_hash\":\"zz", "hex"},
        {"}", "", "not JSON"},          /* truncated */
        {"{", "[", "not JSON"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char line[2048], file[4096];
        const char *at = strstr(good, cases[i].from);
        assert_non_null(at);
        snprintf(line, sizeof line, "%.*s%s%s", (int)(at - good), good, cases[i].to, at + strlen(cases[i].from));
        snprintf(file, sizeof file, "%s%s\n", header, line);
        vks_rollout_file rf;
        int rc = vks_rollout_read_mem(file, strlen(file), "f.jsonl", &rf);
        if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), cases[i].want) || !strstr(vks_last_error(), "f.jsonl:2:"))
            fprintf(stderr, "case %zu: rc %d, '%s' (want '%s')\n", i, rc, vks_last_error(), cases[i].want);
        assert_int_equal(rc, VKS_ERR_FORMAT);
        assert_non_null(strstr(vks_last_error(), cases[i].want));
    }
    /* the good line parses; headers: wrong format, version, missing, garbage */
    char file[4096];
    vks_rollout_file rf;
    snprintf(file, sizeof file, "%s%s\n", header, good);
    assert_int_equal(vks_rollout_read_mem(file, strlen(file), "f", &rf), VKS_OK);
    vks_rollout_file_free(&rf);
    const char *bad_headers[] = {"{\"format\":\"other\"}", "{\"format\":\"vkswarm-rollouts\",\"version\":2}", "", "\x01\x02",
                                 "null"};
    for (size_t i = 0; i < sizeof bad_headers / sizeof bad_headers[0]; i++)
        assert_int_equal(vks_rollout_read_mem(bad_headers[i], strlen(bad_headers[i]), "f", &rf), VKS_ERR_FORMAT);
}

/* ---------------- generation helpers ---------------- */

typedef struct {
    vks_toploc_builder *b;
} gen_hook;

static void on_hidden(void *user, const vks_step *st, const vks_seq_state *states, const float *hidden,
                      const int32_t *sampled) {
    gen_hook *h = user;
    (void)sampled;
    int dim = vks_toploc_builder_dim(h->b);
    for (int i = 0; i < st->n_out; i++)
        if (!states[st->out_seq[i]].done)
            assert_int_equal(vks_toploc_builder_push(h->b, st->out_seq[i], hidden + (size_t)i * (size_t)dim), VKS_OK);
}

typedef struct {
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    int steps;
} gen_params;

static int32_t *make_prompt(int i, int vocab, int *n) {
    uint64_t s = 1000 + (uint64_t)i;
    *n = 1 + i % 6;
    int32_t *p = malloc(sizeof(int32_t) * (size_t)*n);
    p[0] = 1;
    for (int k = 1; k < *n; k++) p[k] = 3 + (int32_t)(rng_next(&s) % (uint64_t)(vocab - 3));
    return p;
}

static void fill_sample(vks_rollout_sample *s, int i, const gen_params *gp, const int32_t *ids, int n_prompt,
                        const int32_t *out, int n_out) {
    char id[32];
    snprintf(id, sizeof id, "s%d", i);
    *s = (vks_rollout_sample){.id = strdup(id), .n_prompt = n_prompt, .n_output = n_out, .seed = gp->seed,
                              .seq = (uint32_t)i, .temperature = gp->temperature, .top_k = gp->top_k,
                              .top_p = gp->top_p, .max_steps = gp->steps};
    s->prompt_ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    s->output_ids = malloc(sizeof(int32_t) * (size_t)(n_out + 1));
    memcpy(s->prompt_ids, ids, sizeof(int32_t) * (size_t)n_prompt);
    memcpy(s->output_ids, out, sizeof(int32_t) * (size_t)n_out);
    memcpy(s->model_hash, stories_hash, 32);
}

static float **gen_logp; /* when set: gen_gpu records each sample's log-probabilities there (malloc'd) */

/* n honest samples from `m` on the GPU (one vks_generate over all of them). */
static vks_rollout_sample *gen_gpu(const vks_model *m, vks_dtype dt, int n, const gen_params *gp, int max_rows) {
    vks_sequence *seqs = calloc((size_t)n, sizeof *seqs);
    for (int i = 0; i < n; i++) seqs[i].ids = make_prompt(i, m->cfg.vocab_size, &seqs[i].n_prompt);
    vks_engine_options eo = {.dtype = dt, .n_slots = n, .kv_len = gp->steps, .max_rows = max_rows, .max_out_rows = n};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &eo, &e), VKS_OK);
    gen_hook h;
    assert_int_equal(vks_toploc_builder_create(n, m->cfg.dim, &h.b), VKS_OK);
    vks_generate_options go = {.sched = {.steps = gp->steps, .temperature = gp->temperature, .top_p = gp->top_p, .top_k = gp->top_k, .seed = gp->seed, .stop_token_a = 1, .stop_token_b = 2}, .on_hidden = on_hidden, .user = &h};
    double t0 = now_s();
    go.record_logp = gen_logp != NULL;
    assert_int_equal(vks_generate(e, &go, seqs, n, 0), VKS_OK);
    assert_int_equal(vks_toploc_builder_finish(h.b), VKS_OK);
    fprintf(stderr, "  generated %d samples (%s) on the GPU in %.2f s\n", n, vks_dtype_name(dt), now_s() - t0);
    vks_rollout_sample *out = calloc((size_t)n, sizeof *out);
    for (int i = 0; i < n; i++) {
        vks_sequence *q = &seqs[i];
        int n_out = q->n_ids - q->n_prompt;
        fill_sample(&out[i], i, gp, q->ids, q->n_prompt, q->ids + q->n_prompt, n_out);
        if (q->stop_token >= 0) out[i].output_ids[out[i].n_output++] = q->stop_token;
        const uint8_t *p = vks_toploc_builder_proofs(h.b, i, &out[i].proof_bytes);
        out[i].proofs = malloc(out[i].proof_bytes);
        memcpy(out[i].proofs, p, out[i].proof_bytes);
        if (gen_logp) gen_logp[i] = q->logp, q->logp = NULL;
        vks_sequence_free(q);
    }
    vks_toploc_builder_destroy(h.b);
    vks_engine_destroy(e);
    free(seqs);
    return out;
}

/* One honest sample with the CPU reference forward (recomputed every step). */
static void gen_cpu(const vks_model *m, int i, const gen_params *gp, vks_rollout_sample *out) {
    int n_prompt, V = m->cfg.vocab_size, dim = m->cfg.dim;
    int32_t *prompt = make_prompt(i, V, &n_prompt);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)(gp->steps + 1));
    memcpy(ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    int n = n_prompt;
    float *logits = malloc(sizeof(float) * (size_t)gp->steps * V), *hidden = malloc(sizeof(float) * (size_t)gp->steps * dim);
    float *rows = malloc(sizeof(float) * (size_t)gp->steps * dim);
    int n_rows = 0;
    while (n <= gp->steps) {
        assert_int_equal(vks_ref_forward(m, ids, n, logits, hidden), VKS_OK);
        memcpy(rows + (size_t)n_rows++ * dim, hidden + (size_t)(n - 1) * dim, sizeof(float) * (size_t)dim);
        vks_sample_params sp = {.temperature = gp->temperature, .top_k = gp->top_k, .top_p = gp->top_p,
                                .seed = gp->seed, .seq = (uint32_t)i, .pos = (uint32_t)(n - 1)};
        ids[n] = (int32_t)vks_ref_sample(logits + (size_t)(n - 1) * V, V, &sp);
        n++;
        if (ids[n - 1] == 1 || ids[n - 1] == 2) break;
    }
    fill_sample(out, i, gp, ids, n_prompt, ids + n_prompt, n - n_prompt);
    out->proof_bytes = vks_toploc_proof_size((size_t)n_rows);
    out->proofs = malloc(out->proof_bytes);
    assert_int_equal(vks_toploc_build(rows, n_rows, dim, out->proofs), VKS_OK);
    free(prompt); free(ids); free(logits); free(hidden); free(rows);
}

static void free_samples(vks_rollout_sample *s, int n) {
    for (int i = 0; i < n; i++) vks_rollout_sample_free(&s[i]);
    free(s);
}

static vks_verify_options verify_opts(void) {
    vks_verify_options o;
    vks_verify_options_default(&o);
    memcpy(o.model_hash, stories_hash, 32);
    o.stop_ids[0] = 1;
    o.stop_ids[1] = 2;
    o.n_stop = 2;
    return o;
}

static double last_max_gap; /* largest sampler gap of the last verify_count, in logits */

static const vks_toploc_thresholds strict_thresholds;

/* Verifies on the CPU (cpu) or a batched GPU engine; returns the accepted
 * count. *strict_accepted (may be NULL): how many the strict thresholds
 * accept, from the same verdicts: a sample passes them iff it passed every
 * other check and each statistic's worst chunk value is within them (exact,
 * as every strict threshold is at or below o's; one pass instead of two). */
static int verify_count(const vks_rollout_sample *s, int n, bool cpu, const vks_verify_options *o, bool print_rejects,
                        int *strict_accepted) {
    vks_verdict *v = calloc((size_t)n, sizeof *v);
    double t0 = now_s();
    if (cpu) {
        assert_int_equal(vks_verify_batch_cpu(stories, o, s, n, v), VKS_OK);
    } else {
        vks_engine_options eo = {.n_slots = 16, .kv_len = STEPS, .max_rows = 256, .max_out_rows = 256};
        vks_engine *e;
        int rc = vks_engine_create(gpu, stories, &eo, &e);
        if (rc == VKS_OK) rc = vks_verify_batch(e, o, s, n, v);
        if (rc) fprintf(stderr, "verify: %s\n", vks_last_error());
        assert_int_equal(rc, VKS_OK);
        vks_engine_destroy(e);
    }
    vks_toploc_stats worst = {0};
    for (int i = 0; i < n; i++) {
        if (v[i].worst.exp_mismatches > worst.exp_mismatches) worst.exp_mismatches = v[i].worst.exp_mismatches;
        if (v[i].worst.mant_mean > worst.mant_mean) worst.mant_mean = v[i].worst.mant_mean;
        if (v[i].worst.mant_median > worst.mant_median) worst.mant_median = v[i].worst.mant_median;
    }
    FILE *dump = getenv("VKSWARM_TOPLOC_DUMP") ? fopen(getenv("VKSWARM_TOPLOC_DUMP"), "a") : NULL;
    for (int i = 0; dump && i < n; i++)
        fprintf(dump, "%s %d %.4f %.1f %d %.5f\n", dump_label, v[i].worst.exp_mismatches, v[i].worst.mant_mean,
                v[i].worst.mant_median, v[i].accepted, v[i].max_gap);
    if (dump) fclose(dump);
    fprintf(stderr, "  verified %d samples on the %s in %.2f s; largest exp mismatches %d, mantissa mean %.3f, median %.1f\n",
            n, cpu ? "CPU" : "GPU", now_s() - t0, worst.exp_mismatches, worst.mant_mean, worst.mant_median);
    int accepted = 0, strict_ok = 0;
    const vks_toploc_thresholds *st = &strict_thresholds;
    assert_true(st->max_exp_mismatches <= o->toploc.max_exp_mismatches && st->max_mant_mean <= o->toploc.max_mant_mean &&
                st->max_mant_median <= o->toploc.max_mant_median);
    last_max_gap = 0;
    for (int i = 0; i < n; i++) {
        if (v[i].max_gap > last_max_gap) last_max_gap = v[i].max_gap;
        strict_ok += v[i].accepted && v[i].worst.exp_mismatches <= st->max_exp_mismatches &&
                     v[i].worst.mant_mean <= st->max_mant_mean && v[i].worst.mant_median <= st->max_mant_median;
        accepted += v[i].accepted;
        if (print_rejects && !v[i].accepted) fprintf(stderr, "  %s: %s\n", s[i].id, v[i].reason);
    }
    free(v);
    if (strict_accepted) *strict_accepted = strict_ok;
    return accepted;
}

static const gen_params sampled_params = {.temperature = 1.0f, .top_p = 0.9f, .seed = 77, .steps = STEPS};

/* Thresholds fitted to f32 engines: honest work (GPU vs CPU reference) shows
 * at most 0 exponent mismatches and a mantissa mean of 0.008 (one unit in one
 * of 128 values) with a median of 0. Every strict threshold is at or below the
 * default one, so acceptance at the strict thresholds implies acceptance at
 * the default ones. */
static const vks_toploc_thresholds strict_thresholds = {.max_exp_mismatches = 2, .max_mant_mean = 0.25,
                                                        .max_mant_median = 0};

static vks_verify_options strict_opts(void) {
    vks_verify_options o = verify_opts();
    o.toploc = strict_thresholds;
    return o;
}

/* The task the shared samples were generated for: prompt i is make_prompt(i). */
typedef struct {
    int32_t *ids[N_SAMPLES];
    int lens[N_SAMPLES];
} task;

static void task_make(task *t, vks_verify_options *o) {
    for (int i = 0; i < n_samples; i++) t->ids[i] = make_prompt(i, stories->cfg.vocab_size, &t->lens[i]);
    o->task_prompts = (const int32_t *const *)t->ids;
    o->task_prompt_lens = t->lens;
    o->n_task_prompts = n_samples;
}

static void task_free(task *t) {
    for (int i = 0; i < n_samples; i++) free(t->ids[i]);
}

/* The honest samples every test shares (n_samples prompts, one GPU generation): honest_base. */

static const vks_rollout_sample *honest_samples(void) {
    if (!honest_base) honest_base = gen_gpu(stories, VKS_DTYPE_F32, n_samples, &sampled_params, 256);
    return honest_base;
}

static vks_rollout_sample *copy_samples(const vks_rollout_sample *b, int n) {
    vks_rollout_sample *s = calloc((size_t)n, sizeof *s);
    for (int i = 0; i < n; i++) {
        gen_params gp = {.temperature = b[i].temperature, .top_p = b[i].top_p, .top_k = b[i].top_k,
                         .seed = b[i].seed, .steps = b[i].max_steps};
        fill_sample(&s[i], i, &gp, b[i].prompt_ids, b[i].n_prompt, b[i].output_ids, b[i].n_output);
        s[i].seq = b[i].seq;
        s[i].proofs = malloc(b[i].proof_bytes);
        memcpy(s[i].proofs, b[i].proofs, s[i].proof_bytes = b[i].proof_bytes);
    }
    return s;
}

/* ---------------- honest work passes ---------------- */

static void test_honest_gpu_on_cpu_and_gpu(void **state) {
    (void)state;
    if (!stories) skip();
    vks_verify_options o = verify_opts(), so = strict_opts();
    const vks_rollout_sample *s = honest_samples();
    int early = 0;
    for (int i = 0; i < n_samples; i++) early += s[i].n_prompt + s[i].n_output < STEPS + 1;
    fprintf(stderr, "honest: %d samples (%d stopped on a stop token)\n", n_samples, early);
    vks_verify_options ot = o; /* with the task known */
    task t;
    task_make(&t, &ot);
    int strict_ok;
    assert_int_equal(verify_count(s, n_samples, true, &ot, true, &strict_ok), n_samples);
    assert_int_equal(strict_ok, n_samples);
    double gap_cpu = last_max_gap;
    task_free(&t);
    /* lavapipe is slow: a fifth on the GPU, at the strict thresholds (which imply the default ones) */
    assert_int_equal(verify_count(s, 40, false, &so, true, NULL), 40);
    fprintf(stderr, "largest honest sampler gap: %.3g logits on the CPU verifier, %.3g on the GPU (margin %.3g)\n",
            gap_cpu, last_max_gap, (double)o.logit_margin);
    /* other samplers and batchings: greedy, top-k, small prefill chunks, one sequence */
    gen_params greedy = {.temperature = 0, .seed = 5, .steps = STEPS};
    gen_params topk = {.temperature = 0.8f, .top_k = 20, .top_p = 0.95f, .seed = 9, .steps = STEPS};
    struct { const gen_params *p; int n, rows; } cfgs[] = {{&greedy, 24, 256}, {&topk, 8, 8}, {&sampled_params, 1, 3}};
    for (size_t c = 0; c < sizeof cfgs / sizeof cfgs[0]; c++) {
        vks_rollout_sample *g = gen_gpu(stories, VKS_DTYPE_F32, cfgs[c].n, cfgs[c].p, cfgs[c].rows);
        assert_int_equal(verify_count(g, cfgs[c].n, c != 1, &so, true, NULL), cfgs[c].n);
        free_samples(g, cfgs[c].n);
    }
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* The replay's log-probabilities (vks_verify_options.logp_out: what an RL
 * verifier rank compares with an inference rank's claims) equal those the
 * generator recorded (GPU f32 vs the fast CPU forward: within 1e-4), on the
 * CPU (batched and reference) and the GPU verifier; a sample without an
 * array gets none. */
static void test_replay_logp(void **state) {
    (void)state;
    if (!stories) skip();
    enum { N = 6 };
    float *recorded[N], *replayed[N];
    gen_logp = recorded;
    vks_rollout_sample *s = gen_gpu(stories, VKS_DTYPE_F32, N, &sampled_params, 256);
    gen_logp = NULL;
    for (int pass = 0; pass < 3; pass++) {
        for (int i = 0; i < N; i++) {
            replayed[i] = i == 3 ? NULL : malloc(sizeof(float) * (size_t)s[i].n_output);
            for (int k = 0; replayed[i] && k < s[i].n_output; k++) replayed[i][k] = 1.0f; /* not a log-probability */
        }
        vks_verify_options o = verify_opts();
        o.logp_out = replayed;
        o.cpu_reference = pass == 1;
        assert_int_equal(verify_count(s, N, pass < 2, &o, true, NULL), N);
        double worst = 0;
        for (int i = 0; i < N; i++)
            for (int k = 0; replayed[i] && k < s[i].n_output; k++) {
                assert_true(replayed[i][k] <= 0);
                double d = fabs((double)replayed[i][k] - (double)recorded[i][k]);
                worst = d > worst ? d : worst;
            }
        fprintf(stderr, "  replayed log-probabilities (%s): largest difference %.3g\n",
                pass == 0 ? "CPU" : pass == 1 ? "CPU reference" : "GPU", worst);
        assert_true(worst < 1e-4);
        for (int i = 0; i < N; i++) free(replayed[i]);
    }
    for (int i = 0; i < N; i++) free(recorded[i]);
    free_samples(s, N);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

static void test_honest_cpu_on_gpu(void **state) {
    (void)state;
    if (!stories) skip();
    enum { N = 8 };
    vks_rollout_sample s[N];
    for (int i = 0; i < N; i++) gen_cpu(stories, i, &sampled_params, &s[i]);
    vks_verify_options so = strict_opts();
    assert_int_equal(verify_count(s, N, false, &so, true, NULL), N);
    /* and the same tokens as the GPU generator drew (batch- and device-invariant sampling) */
    const vks_rollout_sample *g = honest_samples();
    int same = 0;
    for (int i = 0; i < N; i++)
        same += g[i].n_output == s[i].n_output && !memcmp(g[i].output_ids, s[i].output_ids, 4 * (size_t)s[i].n_output);
    fprintf(stderr, "CPU and GPU generators agree on %d of %d samples\n", same, N);
    assert_int_equal(same, N);
    for (int i = 0; i < N; i++) vks_rollout_sample_free(&s[i]);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* Largest |logit| difference between the GPU engine (prefill of each sample
 * in chunks of max_rows rows: the tiled matmul above 8 rows, matvec at or
 * below) and the C reference, over the sampling rows of n samples. */
static double gpu_cpu_logit_diff(const vks_rollout_sample *s, int n, int max_rows) {
    int V = stories->cfg.vocab_size, dim = stories->cfg.dim;
    vks_engine_options eo = {.n_slots = 1, .kv_len = STEPS, .max_rows = max_rows, .max_out_rows = max_rows};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, stories, &eo, &e), VKS_OK);
    float *ref = malloc(sizeof(float) * STEPS * (size_t)V), *hid = malloc(sizeof(float) * STEPS * (size_t)dim);
    float *got = malloc(sizeof(float) * STEPS * (size_t)V);
    int32_t ids[STEPS];
    double worst = 0;
    for (int i = 0; i < n; i++) {
        int L = s[i].n_prompt + s[i].n_output - 1;
        memcpy(ids, s[i].prompt_ids, 4 * (size_t)s[i].n_prompt);
        memcpy(ids + s[i].n_prompt, s[i].output_ids, 4 * (size_t)(s[i].n_output - 1));
        assert_int_equal(vks_ref_forward(stories, ids, L, ref, hid), VKS_OK);
        assert_int_equal(vks_engine_logits(e, 0, ids, 0, L, max_rows, got, NULL), VKS_OK);
        for (int p = s[i].n_prompt - 1; p < L; p++) /* the rows that sample */
            for (int v = 0; v < V; v++) {
                double d = fabs((double)got[(size_t)p * V + v] - (double)ref[(size_t)p * V + v]);
                if (d > worst) worst = d;
            }
    }
    free(ref); free(hid); free(got);
    vks_engine_destroy(e);
    return worst;
}

/* The sampler margin against what honest implementations differ by: an honest
 * token's gap is at most twice the largest logit difference (vks_toploc.h);
 * the default margin must leave a factor of at least 10 above that. */
static void test_honest_logit_differences(void **state) {
    (void)state;
    if (!stories) skip();
    const vks_rollout_sample *s = honest_samples();
    double tiled = gpu_cpu_logit_diff(s, 32, 256), matvec = gpu_cpu_logit_diff(s + 32, 8, 8);
    double worst = tiled > matvec ? tiled : matvec;
    vks_verify_options o;
    vks_verify_options_default(&o);
    fprintf(stderr, "largest GPU f32 vs C reference logit difference: %.3g (tiled matmul), %.3g (matvec); "
            "honest gap bound %.3g, margin %.3g: factor %.0f\n", tiled, matvec, 2 * worst, (double)o.logit_margin,
            (double)o.logit_margin / (2 * worst));
    assert_true(worst > 0); /* the two really are different implementations */
    assert_true(20 * worst <= (double)o.logit_margin);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* ---------------- cheats are caught ---------------- */

static void report(const char *what, int caught, int n, const char *profile, bool cpu) {
    fprintf(stderr, "cheat %-36s caught in %3d of %d samples (%s, %s verifier)\n", what, caught, n, profile,
            cpu ? "CPU" : "GPU");
}

/* Rejections of n cheating samples under o; *strict_caught (may be NULL): under the strict thresholds. */
static int detect(const char *what, vks_rollout_sample *s, int n, bool cpu, const vks_verify_options *o,
                  int *strict_caught) {
    char label[64];
    snprintf(label, sizeof label, "%.60s", what);
    for (char *c = label; *c; c++) *c = *c == ' ' ? '_' : *c;
    dump_label = label;
    int strict_ok, caught = n - verify_count(s, n, cpu, o, false, &strict_ok);
    dump_label = "honest";
    bool is_strict = o->toploc.max_exp_mismatches == strict_thresholds.max_exp_mismatches &&
                     o->toploc.max_mant_mean == strict_thresholds.max_mant_mean;
    report(what, caught, n, is_strict ? "strict 2/0.25/0" : "TOPLOC 38/10/8", cpu);
    if (strict_caught) {
        *strict_caught = n - strict_ok;
        report(what, n - strict_ok, n, "strict 2/0.25/0", cpu);
    }
    return caught;
}

/* At the default TOPLOC thresholds (*at_default) and at the strict ones (returned). */
static int detect_both(const char *what, vks_rollout_sample *s, int n, int *at_default) {
    vks_verify_options o = verify_opts();
    int strict;
    *at_default = detect(what, s, n, true, &o, &strict);
    return strict;
}

static vks_model *perturbed_copy(const vks_model *m, int layer, float rel) {
    vks_model *c;
    assert_int_equal(vks_model_random(&m->cfg, 1, &c), VKS_OK);
    const vks_tensor *src[] = {&m->tok_emb, &m->final_norm};
    vks_tensor *dst[] = {&c->tok_emb, &c->final_norm};
    for (int i = 0; i < 2; i++) memcpy((void *)dst[i]->data, src[i]->data, (size_t)(src[i]->rows * src[i]->cols) * 4);
    uint64_t seed = 3;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const vks_layer_weights *a = &m->layers[l];
        vks_layer_weights *b = &c->layers[l];
        const vks_tensor *sa[] = {&a->attn_norm, &a->wq, &a->wk, &a->wv, &a->wo, &a->ffn_norm, &a->w1, &a->w2, &a->w3};
        vks_tensor *sb[] = {&b->attn_norm, &b->wq, &b->wk, &b->wv, &b->wo, &b->ffn_norm, &b->w1, &b->w2, &b->w3};
        for (int t = 0; t < 9; t++) {
            size_t n = (size_t)(sa[t]->rows * sa[t]->cols);
            float *w = (float *)sb[t]->data;
            memcpy(w, sa[t]->data, n * 4);
            if (l == layer && t > 0 && t != 5) /* matrices of that layer: w *= 1 + rel * u, u in [-1, 1] */
                for (size_t i = 0; i < n; i++) w[i] *= 1.0f + rel * ((float)(rng_next(&seed) % 2001) / 1000.0f - 1.0f);
        }
    }
    return c;
}

/* Cheats that need their own generation run shorter (CHEAT_STEPS positions:
 * one proof chunk each) to keep the suite fast; still n_samples each. */
enum { CHEAT_STEPS = 16 };

static void test_cheats_other_models(void **state) {
    (void)state;
    if (!stories) skip();
    gen_params gp = sampled_params;
    gp.steps = 12; /* other weights altogether: every chunk is far off */
    vks_model *other;
    assert_int_equal(vks_model_random(&stories->cfg, 2024, &other), VKS_OK);
    vks_rollout_sample *s = gen_gpu(other, VKS_DTYPE_F32, n_samples, &gp, 256);
    int d;
    assert_int_equal(detect_both("another model (other weights)", s, n_samples, &d), n_samples);
    assert_int_equal(d, n_samples);
    free_samples(s, n_samples);
    vks_model_free(other);
    gp.steps = CHEAT_STEPS;
    vks_model *pert = perturbed_copy(stories, 2, 0.01f);
    s = gen_gpu(pert, VKS_DTYPE_F32, n_samples, &gp, 256);
    /* TOPLOC's thresholds miss most of these; the strict ones catch all */
    assert_int_equal(detect_both("layer 2 perturbed by 1%", s, n_samples, &d), n_samples);
    vks_verify_options so = strict_opts();
    assert_int_equal(detect("layer 2 perturbed by 1%", s, 24, false, &so, NULL), 24);
    free_samples(s, n_samples);
    vks_model_free(pert);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* Lower precision claimed as f32: a detection rate, reported. */
static void test_lower_precision_rate(void **state) {
    (void)state;
    if (!stories) skip();
    const vks_dtype dts[] = {VKS_DTYPE_F16, VKS_DTYPE_BF16};
    gen_params gp = sampled_params;
    gp.steps = CHEAT_STEPS;
    for (size_t d = 0; d < 2; d++) {
        vks_rollout_sample *s = gen_gpu(stories, dts[d], n_samples, &gp, 256);
        char what[64];
        snprintf(what, sizeof what, "%s weights claimed as f32", vks_dtype_name(dts[d]));
        int caught;
        int caught_strict = detect_both(what, s, n_samples, &caught);
        assert_true(caught_strict >= caught);
        if (dts[d] == VKS_DTYPE_BF16) assert_int_equal(caught_strict, n_samples);
        free_samples(s, n_samples);
    }
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* The second-best token at output index t by the seeded scores, among the
 * tokens the sampler keeps (top-k/top-p; -1 when it keeps only the draw), from the verifier's logits; *gap:
 * how far below the draw it scores, in logits (temperature * score gap). */
static int32_t runner_up(const float *logits, int V, const vks_rollout_sample *s, int t, int32_t drawn, double *gap) {
    vks_sample_params p = {.temperature = s->temperature, .top_k = s->top_k, .top_p = s->top_p, .seed = s->seed,
                           .seq = s->seq, .pos = (uint32_t)(s->n_prompt - 1 + t)};
    uint8_t *keep = malloc((size_t)V);
    float *z = malloc(sizeof(float) * (size_t)V);
    int best = -1;
    if (!(p.temperature > 0) || vks_ref_sample_kept(logits, V, &p, keep, z) < 2) { /* nothing else to draw */
        free(keep);
        free(z);
        return -1;
    }
    double best_score = -INFINITY, drawn_score = 0;
    for (int i = 0; i < V; i++) {
        if (!keep[i]) continue;
        double score = (double)(z[i] + vks_gumbel_from_uniform(vks_rng_uniform(vks_philox_u32(p.seed, p.seq, p.pos, (uint32_t)i))));
        if (i == drawn) drawn_score = score;
        else if (score > best_score) best_score = score, best = i;
    }
    assert_true(keep[drawn]);
    *gap = (drawn_score - best_score) * (double)p.temperature;
    free(keep);
    free(z);
    return best;
}

/* Every sample rejected with a reason containing `want`. */
static void assert_reasons(const vks_rollout_sample *s, int n, const vks_verify_options *o, const char *want) {
    vks_verdict *v = calloc((size_t)n, sizeof *v);
    assert_int_equal(vks_verify_batch_cpu(stories, o, s, n, v), VKS_OK);
    for (int i = 0; i < n; i++) {
        if (v[i].accepted || !strstr(v[i].reason, want)) fprintf(stderr, "  %s: '%s'\n", s[i].id, v[i].reason);
        assert_false(v[i].accepted);
        assert_non_null(strstr(v[i].reason, want));
    }
    free(v);
}

static void test_cheats_edited_samples(void **state) {
    (void)state;
    if (!stories) skip();
    int V = stories->cfg.vocab_size, dim = stories->cfg.dim;
    const vks_rollout_sample *base = honest_samples();
    vks_rollout_sample *s = copy_samples(base, n_samples);
    vks_verify_options o = verify_opts();
    uint64_t r = 11;
    int d;
    /* a changed prompt token */
    for (int i = 0; i < n_samples; i++) {
        int p = (int)(rng_next(&r) % (uint64_t)s[i].n_prompt);
        s[i].prompt_ids[p] = 3 + (s[i].prompt_ids[p] + 1 + (int32_t)(rng_next(&r) % 500)) % (V - 3);
    }
    /* Without the task, TOPLOC + the sampler see only what the change does to
     * the committed rows and the draws: reported, not required (vks_toploc.h). */
    int strict_rate = detect_both("changed prompt token, task unknown", s, n_samples, &d);
    assert_true(strict_rate >= d);
    vks_verify_options ot = o;
    task t;
    task_make(&t, &ot);
    assert_int_equal(detect("changed prompt token, task known", s, n_samples, true, &ot, NULL), n_samples);
    assert_reasons(s, n_samples, &ot, "prompt does not match the task");
    assert_int_equal(detect("changed prompt token, task known", s, 24, false, &ot, NULL), 24);
    task_free(&t);
    /* a changed output token (not a stop token) */
    for (int i = 0; i < n_samples; i++) {
        memcpy(s[i].prompt_ids, base[i].prompt_ids, 4 * (size_t)base[i].n_prompt);
        int k = (int)(rng_next(&r) % (uint64_t)s[i].n_output);
        int32_t old = s[i].output_ids[k];
        do s[i].output_ids[k] = 3 + (int32_t)(rng_next(&r) % (uint64_t)(V - 3));
        while (s[i].output_ids[k] == old);
    }
    assert_int_equal(detect("changed output token", s, n_samples, true, &o, NULL), n_samples);
    assert_int_equal(detect("changed output token", s, 24, false, &o, NULL), 24);
    /* the runner-up instead of the seeded draw at output index k, the sample
     * cut right after it (max_steps lowered so it is complete) with honest
     * proofs of its rows: only the sampler replay can see it */
    float *logits = malloc(sizeof(float) * (STEPS + 1) * (size_t)V), *hidden = malloc(sizeof(float) * (STEPS + 1) * (size_t)dim);
    double min_gap = INFINITY;
    for (int i = 0; i < n_samples; i++) {
        const vks_rollout_sample *b = &base[i];
        int k0 = (int)(rng_next(&r) % (uint64_t)b->n_output), L = b->n_prompt + b->n_output - 1;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
        memcpy(ids, b->prompt_ids, 4 * (size_t)b->n_prompt);
        memcpy(ids + b->n_prompt, b->output_ids, 4 * (size_t)(b->n_output - 1));
        assert_int_equal(vks_ref_forward(stories, ids, L, logits, hidden), VKS_OK);
        free(ids);
        int row0 = b->n_prompt - 1, k = k0, other = -1;
        double gap = 0;
        for (int j = 0; j < b->n_output && other < 0; j++) { /* the first position from k0 with a choice */
            k = (k0 + j) % b->n_output;
            other = runner_up(logits + (size_t)(row0 + k) * V, V, b, k, b->output_ids[k], &gap);
        }
        assert_true(other >= 0);
        s[i].n_output = k + 1;
        memcpy(s[i].output_ids, b->output_ids, 4 * (size_t)k);
        s[i].output_ids[k] = other;
        if (gap < min_gap) min_gap = gap;
        s[i].max_steps = b->n_prompt + k;
        s[i].proof_bytes = vks_toploc_proof_size((size_t)k + 1);
        assert_int_equal(vks_toploc_build(hidden + (size_t)row0 * dim, k + 1, dim, s[i].proofs), VKS_OK);
        if (s[i].output_ids[k] == 1 || s[i].output_ids[k] == 2) s[i].max_steps = STEPS; /* a stop: fine either way */
    }
    fprintf(stderr, "smallest gap between the draw and the runner-up: %.3g logits (margin %.3g)\n", min_gap,
            (double)o.logit_margin);
    assert_int_equal(detect("runner-up token instead of the draw", s, n_samples, true, &o, NULL), n_samples);
    assert_int_equal(detect("runner-up token instead of the draw", s, 24, false, &o, NULL), 24);
    /* a stop without EOS: output cut short (and proofs rebuilt for the kept rows) */
    for (int i = 0; i < n_samples; i++) {
        const vks_rollout_sample *b = &base[i];
        s[i].max_steps = STEPS;
        int keep = b->n_output > 1 ? 1 + (int)(rng_next(&r) % (uint64_t)(b->n_output - 1)) : 1;
        memcpy(s[i].output_ids, b->output_ids, 4 * (size_t)b->n_output);
        s[i].n_output = keep;
        if (keep == b->n_output) s[i].output_ids[keep - 1] = 5; /* one-token sample: drop its stop */
        s[i].proof_bytes = vks_toploc_proof_size((size_t)keep);
        memcpy(s[i].proofs, b->proofs, s[i].proof_bytes); /* chunk proofs change only in the last chunk */
    }
    assert_int_equal(detect("stop without EOS", s, n_samples, true, &o, NULL), n_samples);
    free(logits);
    free(hidden);
    free_samples(s, n_samples);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

static void test_malformed_proofs_rejected(void **state) {
    (void)state;
    if (!stories) skip();
    vks_rollout_sample *s = copy_samples(honest_samples(), 5);
    vks_verify_options o = verify_opts();
    vks_verdict v[5];
    s[0].proofs[0] = s[0].proofs[1] = 0;                          /* m = 0 */
    s[1].proofs[2 + 2 * 5] = 0xFF, s[1].proofs[3 + 2 * 5] = 0xFF; /* coefficient >= prime */
    s[2].proof_bytes -= 1;                                        /* truncated */
    for (size_t i = 0; i < s[3].proof_bytes; i++) s[3].proofs[i] = (uint8_t)(i * 131 + 7); /* random bytes */
    memcpy(s[4].model_hash, "another model's hash, 32 bytes!", 32);
    assert_int_equal(vks_verify_batch_cpu(stories, &o, s, 5, v), VKS_OK);
    const char *want[] = {"m = 0", "coefficient 5", "bytes", "TOPLOC chunk 0", "model hash"};
    for (int i = 0; i < 5; i++) {
        fprintf(stderr, "malformed %d: %s\n", i, v[i].reason);
        assert_false(v[i].accepted);
        assert_non_null(strstr(v[i].reason, want[i]));
        assert_int_equal(v[i].blamed_rank, -1); /* the file's structure is the sender's, not a stage's */
    }
    free_samples(s, 5);
}

/* ---------------- stage commitments (issue 27) ---------------- */

/* Round trip of "stage_proofs", and a sample without them is written exactly as before. */
static void test_stage_proofs_roundtrip(void **state) {
    (void)state;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int32_t prompt[] = {1, 7}, out[] = {5, 2};
    uint8_t p0[VKS_TOPLOC_PROOF_BYTES], p1[VKS_TOPLOC_PROOF_BYTES];
    for (int i = 0; i < VKS_TOPLOC_PROOF_BYTES; i++) p0[i] = (uint8_t)(i * 37), p1[i] = (uint8_t)(i * 11 + 3);
    vks_stage_proof sp[2] = {{.rank = 0, .layer_begin = 0, .layer_end = 2, .proofs = p0, .proof_bytes = sizeof p0},
                             {.rank = 7, .layer_begin = 2, .layer_end = 3, .proofs = p1, .proof_bytes = sizeof p1}};
    vks_rollout_sample s = {.id = "x", .prompt_ids = prompt, .n_prompt = 2, .output_ids = out, .n_output = 2,
                            .seed = 3, .max_steps = 8, .proofs = p0, .proof_bytes = sizeof p0};
    vks_rollout_header h = make_header();
    assert_int_equal(vks_rollout_write_header(f, &h), VKS_OK);
    assert_int_equal(vks_rollout_write_sample(f, &s), VKS_OK);
    fflush(f);
    assert_null(strstr(buf, "stage_proofs")); /* files without them stay as they were */
    s.stage_proofs = sp, s.n_stage_proofs = 2;
    assert_int_equal(vks_rollout_write_sample(f, &s), VKS_OK);
    fclose(f);
    vks_rollout_file rf;
    assert_int_equal(vks_rollout_read_mem(buf, len, "mem", &rf), VKS_OK);
    assert_int_equal(rf.n_samples, 2);
    assert_int_equal(rf.samples[0].n_stage_proofs, 0);
    assert_null(rf.samples[0].stage_proofs);
    const vks_rollout_sample *r = &rf.samples[1];
    assert_int_equal(r->n_stage_proofs, 2);
    for (int k = 0; k < 2; k++) {
        assert_int_equal(r->stage_proofs[k].rank, sp[k].rank);
        assert_int_equal(r->stage_proofs[k].layer_begin, sp[k].layer_begin);
        assert_int_equal(r->stage_proofs[k].layer_end, sp[k].layer_end);
        assert_int_equal(r->stage_proofs[k].proof_bytes, VKS_TOPLOC_PROOF_BYTES);
        assert_memory_equal(r->stage_proofs[k].proofs, sp[k].proofs, VKS_TOPLOC_PROOF_BYTES);
    }
    vks_stage_proof *copy;
    assert_int_equal(vks_stage_proofs_copy(r->stage_proofs, 2, &copy), VKS_OK);
    assert_memory_equal(copy[1].proofs, p1, sizeof p1);
    vks_stage_proofs_free(copy, 2);
    vks_rollout_file_free(&rf);
    free(buf);
}

/* "stage_proofs" is hostile input: counts, ranks, layer ranges, types and base64 are bounded. */
static void test_stage_proofs_malformed(void **state) {
    (void)state;
    char hex[65];
    vks_hash_hex(stories_hash, hex);
    char head[1024];
    snprintf(head, sizeof head,
             "{\"format\":\"vkswarm-rollouts\",\"version\":1,\"model\":\"m\",\"model_hash\":\"%s\",\"stop_ids\":[1,2]}\n"
             "{\"id\":\"x\",\"prompt_ids\":[1],\"output_ids\":[2],\"seed\":1,\"seq\":0,\"temperature\":1,\"top_k\":0,"
             "\"top_p\":0.9,\"max_steps\":8,\"model_hash\":\"%s\",\"proofs\":\"\",\"stage_proofs\":", hex, hex);
    char many[8192] = "[";
    for (int i = 0; i <= VKS_ROLLOUT_MAX_STAGES; i++)
        snprintf(many + strlen(many), sizeof many - strlen(many), "%s{\"rank\":0,\"layers\":[0,1],\"proofs\":\"\"}",
                 i ? "," : "");
    strcat(many, "]");
    struct { const char *value, *want; } cases[] = {
        {"{}", "not an array"},
        {"[7]", "not an object"},
        {many, "entries (at most 64)"},
        {"[{\"rank\":-1,\"layers\":[0,1],\"proofs\":\"\"}]", "\"rank\" = -1 outside"},
        {"[{\"rank\":16777217,\"layers\":[0,1],\"proofs\":\"\"}]", "outside"},
        {"[{\"rank\":\"1\",\"layers\":[0,1],\"proofs\":\"\"}]", "not an integer"},
        {"[{\"layers\":[0,1],\"proofs\":\"\"}]", "missing field \"rank\""},
        {"[{\"rank\":1,\"proofs\":\"\"}]", "\"layers\" is not [first, end]"},
        {"[{\"rank\":1,\"layers\":[0],\"proofs\":\"\"}]", "\"layers\" is not [first, end]"},
        {"[{\"rank\":1,\"layers\":[0,1,2],\"proofs\":\"\"}]", "\"layers\" is not [first, end]"},
        {"[{\"rank\":1,\"layers\":[\"0\",1],\"proofs\":\"\"}]", "\"layers\" is not [first, end]"},
        {"[{\"rank\":1,\"layers\":[2,2],\"proofs\":\"\"}]", "is not a range"},
        {"[{\"rank\":1,\"layers\":[-1,2],\"proofs\":\"\"}]", "is not a range"},
        {"[{\"rank\":1,\"layers\":[0,65537],\"proofs\":\"\"}]", "is not a range"},
        {"[{\"rank\":1,\"layers\":[0,1]}]", "missing field \"proofs\""},
        {"[{\"rank\":1,\"layers\":[0,1],\"proofs\":\"AAA*\"}]", "base64"},
        {"[{\"rank\":1,\"layers\":[0,1],\"proofs\":[]}]", "base64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char file[16384];
        snprintf(file, sizeof file, "%s%s}\n", head, cases[i].value);
        vks_rollout_file rf;
        int rc = vks_rollout_read_mem(file, strlen(file), "f.jsonl", &rf);
        if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), cases[i].want))
            fprintf(stderr, "case %zu: rc %d, '%s' (want '%s')\n", i, rc, vks_last_error(), cases[i].want);
        assert_int_equal(rc, VKS_ERR_FORMAT);
        assert_non_null(strstr(vks_last_error(), cases[i].want));
        assert_non_null(strstr(vks_last_error(), "f.jsonl:2:"));
    }
    char file[16384];
    vks_rollout_file rf;
    snprintf(file, sizeof file, "%s[]}\n", head); /* an empty list: none */
    assert_int_equal(vks_rollout_read_mem(file, strlen(file), "f", &rf), VKS_OK);
    assert_int_equal(rf.samples[0].n_stage_proofs, 0);
    vks_rollout_file_free(&rf);
}

/* How a test stage commits: honestly, or cheating. */
enum { COMMIT_HONEST, COMMIT_PERTURB, COMMIT_SKIP_LAYER };

/* Three stages over stories260K's 5 layers: [0,2) rank 0, [2,3) rank 1, the last [3,5).
 * Each sample gets the stage commitments of the residual stream the CPU forward computes
 * (vks_cpu_prefill_taps); stage `cheat_stage` commits `how` instead. */
static void add_stage_proofs(vks_rollout_sample *s, int n, int cheat_stage, int how) {
    const vks_model_config *c = &stories->cfg;
    vks_cpu *cpu;
    assert_int_equal(vks_cpu_create(stories, NULL, &cpu), VKS_OK);
    const int ends[2] = {2, 3}, ranks[2] = {0, 1};
    const int layers[3] = {2, 3, 1}; /* the taps: both boundaries, and layer 1 for a stage 0 that skips layer 1 */
    uint64_t rng = 99;
    for (int i = 0; i < n; i++) {
        int L = s[i].n_prompt + s[i].n_output - 1, n_out = s[i].n_output;
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)L);
        memcpy(ids, s[i].prompt_ids, sizeof(int32_t) * (size_t)s[i].n_prompt);
        memcpy(ids + s[i].n_prompt, s[i].output_ids, sizeof(int32_t) * (size_t)(n_out - 1));
        int *out_rows = malloc(sizeof(int) * (size_t)n_out);
        for (int t = 0; t < n_out; t++) out_rows[t] = s[i].n_prompt - 1 + t;
        float *logits = malloc(sizeof(float) * (size_t)n_out * (size_t)c->vocab_size);
        float *taps = malloc(sizeof(float) * 3 * (size_t)n_out * (size_t)c->dim);
        vks_layer_taps lt = {.n = 3, .layers = layers, .out = taps};
        assert_int_equal(vks_cpu_prefill_taps(cpu, ids, &L, 1, out_rows, n_out, logits, NULL, &lt), VKS_OK);
        s[i].stage_proofs = calloc(2, sizeof *s[i].stage_proofs);
        s[i].n_stage_proofs = 2;
        for (int k = 0; k < 2; k++) {
            float *rows = taps + (size_t)k * (size_t)n_out * (size_t)c->dim;
            if (k == cheat_stage && how == COMMIT_SKIP_LAYER) rows = taps + 2 * (size_t)n_out * (size_t)c->dim;
            if (k == cheat_stage && how == COMMIT_PERTURB)
                for (size_t e = 0; e < (size_t)n_out * (size_t)c->dim; e++)
                    rows[e] *= 1.0f + 0.01f * ((float)(rng_next(&rng) % 2001) / 1000.0f - 1.0f);
            vks_stage_proof *p = &s[i].stage_proofs[k];
            *p = (vks_stage_proof){.rank = ranks[k], .layer_begin = k ? ends[k - 1] : 0, .layer_end = ends[k],
                                   .proof_bytes = vks_toploc_proof_size((size_t)n_out)};
            p->proofs = malloc(p->proof_bytes);
            assert_int_equal(vks_toploc_build(rows, n_out, c->dim, p->proofs), VKS_OK);
        }
        free(ids), free(out_rows), free(logits), free(taps);
    }
    vks_cpu_destroy(cpu);
}

/* Verdicts of n samples on the fast CPU forward, the reference forward or the GPU. */
static void verify_all(const vks_rollout_sample *s, int n, const vks_verify_options *o, int path, vks_verdict *v) {
    if (path == 2) {
        vks_engine_options eo = {.n_slots = 1, .kv_len = 1, .max_rows = 256, .max_out_rows = 256, .f32_math = true};
        vks_engine *e;
        assert_int_equal(vks_engine_create(gpu, stories, &eo, &e), VKS_OK);
        assert_int_equal(vks_verify_batch(e, o, s, n, v), VKS_OK);
        vks_engine_destroy(e);
    } else {
        vks_verify_options oc = *o;
        oc.cpu_reference = path == 1;
        assert_int_equal(vks_verify_batch_cpu(stories, &oc, s, n, v), VKS_OK);
    }
}

/* Every sample's verdict contains want (NULL: every sample accepted) and
 * blames stage rank `blamed` (-1: none). */
static void expect_verdicts_blaming(const vks_rollout_sample *s, int n, const vks_verify_options *o, const char *want,
                                    int blamed, const char *what) {
    static const char *paths[] = {"CPU", "reference", "GPU"};
    vks_verdict *v = calloc((size_t)n, sizeof *v);
    for (int path = 0; path < 3; path++) {
        int n_ref = path == 1 ? (n < 4 ? n : 4) : n; /* the float64 reference is slow */
        verify_all(s, n_ref, o, path, v);
        int hits = 0;
        for (int i = 0; i < n_ref; i++) {
            bool hit = (want ? !v[i].accepted && strstr(v[i].reason, want) : v[i].accepted) && v[i].blamed_rank == blamed;
            if (!hit)
                fprintf(stderr, "  %s, %s verifier: %s: %s (blamed rank %d)\n", what, paths[path], s[i].id, v[i].reason,
                        v[i].blamed_rank);
            hits += hit;
        }
        fprintf(stderr, "stage commitments: %-34s %3d of %d as expected (%s verifier)\n", what, hits, n_ref, paths[path]);
        assert_int_equal(hits, n_ref);
    }
    free(v);
}

static void expect_verdicts(const vks_rollout_sample *s, int n, const vks_verify_options *o, const char *want,
                            const char *what) {
    expect_verdicts_blaming(s, n, o, want, -1, what);
}

static void test_stage_proofs_verify(void **state) {
    (void)state;
    if (!stories) skip();
    int n = n_samples < 48 ? n_samples : 48;
    vks_verify_options o = verify_opts(), so = strict_opts();
    vks_rollout_sample *s = copy_samples(honest_samples(), n);
    add_stage_proofs(s, n, -1, COMMIT_HONEST);
    expect_verdicts(s, n, &so, NULL, "honest (strict)");
    free_samples(s, n);
    /* stage 0 skipped layer 1 (it handed on layer 0's output) */
    s = copy_samples(honest_samples(), n);
    add_stage_proofs(s, n, 0, COMMIT_SKIP_LAYER);
    expect_verdicts_blaming(s, n, &o, "stage 0 (rank 0, layers [0,2)): TOPLOC chunk", 0, "stage 0 skipped layer 1");
    free_samples(s, n);
    s = copy_samples(honest_samples(), n);
    add_stage_proofs(s, n, 1, COMMIT_PERTURB);
    expect_verdicts_blaming(s, n, &so, "stage 1 (rank 1, layers [2,3)): TOPLOC chunk", 1, "stage 1 perturbed 1% (strict)");
    free_samples(s, n);
    /* the stages pass and the final proofs fail: the last stage is named by its layers */
    s = copy_samples(honest_samples(), n);
    add_stage_proofs(s, n, -1, COMMIT_HONEST);
    for (int k = 0; k < n; k++)
        for (size_t i = 0; i < s[k].proof_bytes; i++) s[k].proofs[i] = (uint8_t)(i * 131 + 7);
    expect_verdicts(s, n, &o, "last stage (layers [3,5)): TOPLOC chunk 0", "final proofs of random bytes");
    free_samples(s, n);
    /* structure: ranges that do not tile the model from layer 0, or end at its last layer; sizes */
    s = copy_samples(honest_samples(), 4);
    add_stage_proofs(s, 4, -1, COMMIT_HONEST);
    s[0].stage_proofs[0].layer_begin = 1;
    s[1].stage_proofs[1].layer_begin = 3;
    s[2].stage_proofs[1].layer_end = stories->cfg.n_layers;
    s[3].stage_proofs[1].proof_bytes -= VKS_TOPLOC_PROOF_BYTES / 2;
    vks_verdict v[4];
    assert_int_equal(vks_verify_batch_cpu(stories, &o, s, 4, v), VKS_OK);
    const char *want[] = {"stage 0 (rank 0): layers [1,2) are not [0, end) with end < 5",
                          "stage 1 (rank 1): layers [3,3) are not [2, end)", "stage 1 (rank 1): layers [2,5) are not [2, end)",
                          "stage 1 (rank 1, layers [2,3)): proofs are"};
    for (int i = 0; i < 4; i++) {
        fprintf(stderr, "structure %d: %s\n", i, v[i].reason);
        assert_false(v[i].accepted);
        assert_non_null(strstr(v[i].reason, want[i]));
        assert_int_equal(v[i].blamed_rank, -1); /* the file's structure is the sender's, not a stage's */
    }
    free_samples(s, 4);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* A model whose header declares a context of 2^20 positions (valid: generate
 * runs it) with short samples: the verifier's KV cache is sized by the
 * batch's longest sample, not by batch x context (16 x 2^20 positions did
 * not fit: "needs 21478446304 bytes"). Library call, then the CLI on the file. */
static void test_verify_huge_context(void **state) {
    (void)state;
    vks_model_config c = {.dim = 16, .hidden_dim = 32, .n_layers = 2, .n_heads = 4, .n_kv_heads = 4,
                          .vocab_size = 32, .seq_len = 1 << 20, .head_dim = 4, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_ADJACENT, .shared_classifier = true};
    vks_model *r, *m;
    char dir[256], path[512], cmd[4096];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(path, sizeof path, "%s/huge_context.bin", dir);
    assert_int_equal(vks_model_random(&c, 3, &r), VKS_OK);
    assert_int_equal(vks_model_save_llama2c(r, path), VKS_OK);
    vks_model_free(r);
    assert_int_equal(vks_model_load_llama2c(path, &m), VKS_OK);
    assert_int_equal(m->cfg.seq_len, 1 << 20);
    enum { N = 4 };
    const gen_params gp = {.temperature = 1.0f, .top_p = 0.9f, .seed = 5, .steps = 12};
    vks_rollout_sample *s = gen_gpu(m, VKS_DTYPE_F32, N, &gp, 64);
    int longest = 0;
    for (int i = 0; i < N; i++)
        if (s[i].n_prompt + s[i].n_output - 1 > longest) longest = s[i].n_prompt + s[i].n_output - 1;
    vks_engine_options eo = {.f32_math = true, .n_slots = 16, .kv_len = 1, .max_rows = 512, .max_out_rows = 512};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &eo, &e), VKS_OK);
    vks_verify_options o = verify_opts();
    vks_verdict v[N];
    assert_int_equal(vks_verify_batch(e, &o, s, N, v), VKS_OK);
    for (int i = 0; i < N; i++) {
        if (!v[i].accepted) fprintf(stderr, "  %s: %s\n", s[i].id, v[i].reason);
        assert_true(v[i].accepted);
    }
    assert_int_equal(vks_engine_n_slots(e), N);
    assert_int_equal(vks_engine_kv_len(e), longest);
    vks_engine_destroy(e);
    free_samples(s, N);
    vks_model_free(m);
    /* the CLI: generate rollouts, then verify them with the default batch of 16 */
    snprintf(cmd, sizeof cmd, "printf '3 4 5\\n6\\n7 8\\n' > %s/hp.txt && %s generate --model %s --prompts %s/hp.txt "
             "-n 10 --seed 4 --rollouts-out %s/hr.jsonl > /dev/null 2>&1", dir, tu_bin(), path, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s verify --model %s --rollouts %s/hr.jsonl 2>&1", tu_bin(), path, dir);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    fprintf(stderr, "%s", out ? out : "");
    assert_int_equal(rc, 0);
    assert_non_null(strstr(out, "verified 3 samples: 3 accepted, 0 rejected"));
    free(out);
}

/* A structurally valid sample of 2^20 positions whose KV cache cannot fit the
 * device (4 KiB a position and layer: 4 GiB in one binding) is rejected with
 * the reason, before any forward; the short samples beside it are accepted. */
static void test_verify_sample_beyond_device(void **state) {
    (void)state;
    vks_model_config c = {.dim = 1024, .hidden_dim = 32, .n_layers = 1, .n_heads = 8, .n_kv_heads = 8,
                          .vocab_size = 32, .seq_len = 1 << 20, .head_dim = 128, .kv_dim = 1024, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_ADJACENT, .shared_classifier = true};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 4, &m), VKS_OK);
    enum { N = 3 };
    const gen_params gp = {.temperature = 1.0f, .top_p = 0.9f, .seed = 6, .steps = 8};
    vks_rollout_sample *s = gen_gpu(m, VKS_DTYPE_F32, N, &gp, 64);
    vks_rollout_sample *big = &s[1]; /* replaced by a full-length sample of 2^20 positions */
    free(big->prompt_ids);
    free(big->proofs);
    big->max_steps = big->n_prompt = 1 << 20;
    big->n_output = 1;
    big->prompt_ids = calloc((size_t)big->n_prompt, sizeof(int32_t));
    big->proof_bytes = vks_toploc_proof_size(1);
    big->proofs = calloc(1, big->proof_bytes);
    vks_engine_options eo = {.f32_math = true, .n_slots = 16, .kv_len = 1, .max_rows = 512, .max_out_rows = 512};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &eo, &e), VKS_OK);
    vks_verify_options o = verify_opts();
    vks_verdict v[N];
    int rc = vks_verify_batch(e, &o, s, N, v);
    if (rc) fprintf(stderr, "  verify: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
    assert_true(v[0].accepted && v[2].accepted);
    assert_false(v[1].accepted);
    fprintf(stderr, "  %s\n", v[1].reason);
    assert_non_null(strstr(v[1].reason, "1048576 positions do not fit the verifier's device"));
    assert_true(vks_engine_kv_len(e) <= gp.steps);
    vks_engine_destroy(e);
    free_samples(s, N);
    vks_model_free(m);
}

/* ---------------- the CLI, and lavapipe at other subgroup sizes ---------------- */

static void test_cli_generate_verify(void **state) {
    (void)state;
    const char *bin = tu_bin(), *path = tu_shared_path("stories260K/stories260K.bin");
    char model_s[512], tok_s[512], dir[256], cmd[4096];
    if (!bin || !path) skip();
    snprintf(model_s, sizeof model_s, "%s", path);
    if (!(path = tu_shared_path("stories260K/tok512.bin"))) skip();
    snprintf(tok_s, sizeof tok_s, "%s", path);
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nThe dog\\nLily\\n\\n' > %s/p.txt", dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    const char *widths[] = {"", "LP_NATIVE_VECTOR_WIDTH=128 ", "LP_NATIVE_VECTOR_WIDTH=1024 "};
    for (int w = 0; w < 3; w++) {
        snprintf(cmd, sizeof cmd, "%s%s generate --model %s --tokenizer %s --prompts %s/p.txt -n 60 --seed %d "
                 "--rollouts-out %s/r%d.jsonl > /dev/null 2>&1", widths[w], bin, model_s, tok_s, dir, 10 + w, dir, w);
        assert_int_equal(tu_run(cmd, NULL), 0);
        snprintf(cmd, sizeof cmd, "%s verify --cpu --jsonl --model %s --rollouts %s/r%d.jsonl > %s/v%d.jsonl 2>/dev/null",
                 bin, model_s, dir, w, dir, w);
        assert_int_equal(tu_run(cmd, NULL), 0);
    }
    /* GPU verifier, text output */
    snprintf(cmd, sizeof cmd, "%s verify --model %s --rollouts %s/r0.jsonl > %s/v.txt 2>/dev/null", bin, model_s, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s/v0.jsonl", dir);
    char *out = (char *)tu_read_file(cmd, NULL);
    assert_non_null(out);
    assert_non_null(strstr(out, "{\"id\":\"10-0\",\"accepted\":true,\"reason\":\"\"}"));
    free(out);
    /* the task known: the same prompts pass; another prompt 2 rejects sample 1 */
    snprintf(cmd, sizeof cmd, "%s verify --cpu --model %s --tokenizer %s --prompts %s/p.txt --rollouts %s/r0.jsonl "
             "> /dev/null 2>&1", bin, model_s, tok_s, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time\\nThe cat\\nLily\\n\\n' > %s/q.txt && %s verify --cpu --jsonl "
             "--model %s --tokenizer %s --prompts %s/q.txt --rollouts %s/r0.jsonl > %s/vq.jsonl 2>/dev/null", dir, bin,
             model_s, tok_s, dir, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 1);
    snprintf(cmd, sizeof cmd, "%s/vq.jsonl", dir);
    out = (char *)tu_read_file(cmd, NULL);
    assert_non_null(out);
    assert_non_null(strstr(out, "{\"id\":\"10-1\",\"accepted\":false,\"reason\":\"prompt does not match the task"));
    assert_non_null(strstr(out, "{\"id\":\"10-2\",\"accepted\":true,\"reason\":\"\"}"));
    free(out);
    /* a tampered file: exit 1; a malformed one: exit 2 */
    snprintf(cmd, sizeof cmd, "sed '2s/\"output_ids\":\\[/\"output_ids\":[9,/' %s/r0.jsonl > %s/bad.jsonl", dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s verify --cpu --model %s --rollouts %s/bad.jsonl > /dev/null 2>&1", bin, model_s, dir);
    assert_int_equal(tu_run(cmd, NULL), 1);
    snprintf(cmd, sizeof cmd, "head -c 300 %s/r0.jsonl > %s/trunc.jsonl && %s verify --cpu --model %s --rollouts "
             "%s/trunc.jsonl > /dev/null 2>&1", dir, dir, bin, model_s, dir);
    assert_int_equal(tu_run(cmd, NULL), 2);
}

/* The file-level rules: another model's file, or stop tokens the verifier
 * does not trust, reject every sample. */
static void test_header_rules(void **state) {
    (void)state;
    vks_rollout_header h = {0};
    uint8_t mine[32] = {1, 2, 3};
    memcpy(h.model_hash, mine, 32);
    h.stop_ids[0] = 2;
    h.n_stop = 1;
    const int32_t trusted[] = {1, 2};
    assert_null(vks_verify_header_problem(&h, mine, trusted, 2));
    assert_non_null(strstr(vks_verify_header_problem(&h, mine, trusted, 1), "stop_ids"));
    h.model_hash[31] ^= 1;
    assert_non_null(strstr(vks_verify_header_problem(&h, mine, trusted, 2), "another model"));
}


/* ---------------- group verdicts on a sampled subset (issue 27) ---------------- */

/* Fake rollouts: no model runs here; the verifier stand-in rejects the
 * samples whose id starts with "bad" (what a real verifier does to a cheat is
 * test_cli's test_verify_group_sampling). */
typedef struct {
    int calls, n_seen;
    bool fail;
} fake_verifier;

static int fake_verify(void *ctx, const vks_rollout_sample *s, int n, vks_verdict *out) {
    fake_verifier *f = ctx;
    f->calls++;
    f->n_seen += n;
    if (f->fail) return vks_set_error(VKS_ERR_GPU, "fake failure");
    for (int i = 0; i < n; i++) {
        out[i] = (vks_verdict){.accepted = strncmp(s[i].id, "bad", 3) != 0};
        if (!out[i].accepted) snprintf(out[i].reason, sizeof out[i].reason, "cheat %s", s[i].id);
    }
    return VKS_OK;
}

/* n samples of sampler seed `seed`; those with index in bad[] are cheats. */
static void fake_group(vks_rollout_sample *s, int n, uint64_t seed, const bool *bad) {
    for (int i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof id, "%s%llu-%d", bad && bad[i] ? "bad" : "ok", (unsigned long long)seed, i);
        s[i] = (vks_rollout_sample){.id = strdup(id), .seed = seed, .seq = (uint32_t)i, .max_steps = 8};
        assert_non_null(s[i].id);
    }
}

static void free_fake(vks_rollout_sample *s, int n) {
    for (int i = 0; i < n; i++) free(s[i].id);
}

/* The exact hypergeometric chance that none of k bad is among m of n, by log-gamma. */
static double none_drawn(int n, int k, int m) {
    if (n - k < m) return 0;
    return exp(lgamma(n - k + 1.0) - lgamma(n - k - m + 1.0) - lgamma(n + 1.0) + lgamma(n - m + 1.0));
}

static void test_group_bound_formula(void **state) {
    (void)state;
    /* k = ceil(p n): 10% of 128 is 13; 10% of 30 is 3 (not 4: 0.1 * 30 rounds above 3 in double) */
    assert_true(fabs(vks_group_pass_bound(128, 16, 0.1) - none_drawn(128, 13, 16)) < 1e-12);
    assert_true(fabs(vks_group_pass_bound(30, 5, 0.1) - none_drawn(30, 3, 5)) < 1e-12);
    assert_true(vks_group_pass_bound(128, 16, 0.1) <= pow(0.9, 16));
    assert_true(fabs(vks_group_pass_bound(10, 3, 0.01) - 0.7) < 1e-12); /* at least one bad: 1 - m/n */
    assert_true(vks_group_pass_bound(10, 10, 0.1) == 0);              /* all checked */
    assert_true(vks_group_pass_bound(10, 2, 1.0) == 0);
    for (int n = 1; n <= 200; n += 7)
        for (int m = 1; m <= n; m += 5)
            for (double p = 0.05; p <= 1; p += 0.15) {
                int k = (int)ceil(p * n - 1e-9);
                k = k < 1 ? 1 : k;
                double want = none_drawn(n, k, m), got = vks_group_pass_bound(n, m, p);
                if (fabs(got - want) > 1e-9 * (want > 1e-300 ? want : 1) + 1e-300)
                    fail_msg("n %d m %d p %g: %.17g, want %.17g", n, m, p, got, want);
                assert_true(got <= pow(1 - (double)k / n, m) + 1e-12);
            }
    vks_group_sampling gs;
    vks_group_sampling_default(&gs);
    gs.fraction = 0.125;
    assert_int_equal(vks_group_checked_count(&gs, 128), 16);
    assert_int_equal(vks_group_checked_count(&gs, 129), 17);
    assert_int_equal(vks_group_checked_count(&gs, 3), 1);
    gs.fraction = 0.1;
    assert_int_equal(vks_group_checked_count(&gs, 30), 3);
    gs.count = 40;
    assert_int_equal(vks_group_checked_count(&gs, 30), 30);
    assert_int_equal(vks_group_checked_count(&gs, 128), 40);
    gs.count = -1;
    assert_non_null(vks_group_sampling_problem(&gs));
    gs.count = 0, gs.fraction = 0;
    assert_non_null(vks_group_sampling_problem(&gs));
    gs.fraction = 1.5;
    assert_non_null(vks_group_sampling_problem(&gs));
    gs.fraction = 0.5, gs.bad_fraction = 0;
    assert_non_null(vks_group_sampling_problem(&gs));
    gs.bad_fraction = 0.1;
    assert_null(vks_group_sampling_problem(&gs));
}

enum { GN = 128, GM = 16, GBAD = 13 };

/* Group 1 (seed 7): GN honest. Group 2 (seed 9): GN with GBAD cheats,
 * interleaved with group 1 in the file. */
static vks_rollout_sample *two_groups(void) {
    vks_rollout_sample *s = calloc(2 * GN, sizeof *s), a[GN], b[GN];
    assert_non_null(s);
    bool bad[GN] = {0};
    for (int i = 0; i < GBAD; i++) bad[(i * 37 + 5) % GN] = true;
    fake_group(a, GN, 7, NULL);
    fake_group(b, GN, 9, bad);
    for (int i = 0; i < GN; i++) s[2 * i] = a[i], s[2 * i + 1] = b[i];
    return s;
}

static void test_group_full_names_every_cheat(void **state) {
    (void)state;
    vks_rollout_sample *s = two_groups();
    vks_group_sampling gs;
    vks_group_sampling_default(&gs); /* fraction 1: every sample checked */
    vks_verdict v[2 * GN];
    vks_group_plan p;
    fake_verifier f = {0};
    assert_int_equal(vks_verify_groups(s, 2 * GN, &gs, fake_verify, &f, v, &p), VKS_OK);
    assert_int_equal(f.calls, 1);
    assert_int_equal(f.n_seen, 2 * GN);
    assert_int_equal(p.n_groups, 2);
    assert_true(p.groups[0].seed == 7 && p.groups[1].seed == 9); /* by first appearance */
    assert_true(p.groups[0].accepted && !p.groups[1].accepted);
    assert_int_equal(p.groups[1].n_failed, GBAD);
    assert_int_equal(p.groups[0].n_checked, GN);
    for (int i = 0; i < 2 * GN; i++) {
        assert_true(p.checked[i]);
        assert_int_equal(p.group_of[i], i % 2);
        bool cheat = !strncmp(s[i].id, "bad", 3);
        if (cheat) { /* named with the verifier's own reason */
            char want[64];
            snprintf(want, sizeof want, "cheat %s", s[i].id);
            assert_string_equal(v[i].reason, want);
        } else if (i % 2) {
            assert_false(v[i].accepted); /* the whole group goes */
            assert_non_null(strstr(v[i].reason, "checked and passed; group rejected: 13 of 128 checked samples failed"));
        } else {
            assert_true(v[i].accepted);
        }
    }
    assert_int_equal(strncmp(s[p.groups[1].first_failed].id, "bad", 3), 0);
    vks_group_plan_free(&p);
    /* the verifier's failure is the caller's error */
    f.fail = true;
    assert_int_equal(vks_verify_groups(s, 2 * GN, &gs, fake_verify, &f, v, &p), VKS_ERR_GPU);
    vks_group_plan_free(&p);
    free_fake(s, 2 * GN);
    free(s);
}

/* 16 of 128 checked per group: the subset follows the secret and the
 * content, a group is rejected exactly when a checked sample is a cheat, and
 * over 200 secrets the acceptance rate of the group with 13 cheats matches
 * the stated bound C(115, 16) / C(128, 16). */
static void test_group_sampling_statistics(void **state) {
    (void)state;
    vks_rollout_sample *s = two_groups();
    vks_group_sampling gs;
    vks_group_sampling_default(&gs);
    gs.count = GM;
    enum { SECRETS = 200 };
    int accepted = 0, times_checked[2 * GN] = {0};
    bool first[2 * GN];
    for (int secret = 0; secret < SECRETS; secret++) {
        gs.secret = 1000003u * (uint64_t)secret + 17;
        vks_verdict v[2 * GN];
        vks_group_plan p, again;
        fake_verifier f = {0};
        assert_int_equal(vks_verify_groups(s, 2 * GN, &gs, fake_verify, &f, v, &p), VKS_OK);
        assert_int_equal(f.n_seen, 2 * GM);
        assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &again), VKS_OK); /* the same secret, the same subset */
        assert_memory_equal(p.checked, again.checked, sizeof(bool) * 2 * GN);
        vks_group_plan_free(&again);
        if (secret == 0) memcpy(first, p.checked, sizeof first);
        bool bad_checked = false;
        int n_checked[2] = {0};
        for (int i = 0; i < 2 * GN; i++) {
            n_checked[i % 2] += p.checked[i];
            times_checked[i] += p.checked[i];
            bad_checked |= p.checked[i] && !strncmp(s[i].id, "bad", 3);
        }
        assert_int_equal(n_checked[0], GM);
        assert_int_equal(n_checked[1], GM);
        assert_true(p.groups[0].accepted);
        assert_true(p.groups[1].accepted == !bad_checked); /* rejected exactly when a checked one is bad */
        for (int i = 1; i < 2 * GN; i += 2) {
            assert_true(v[i].accepted == !bad_checked);
            if (!p.checked[i] && v[i].accepted) assert_string_equal(v[i].reason, ""); /* accepted unverified */
        }
        assert_true(fabs(p.groups[1].pass_bound - none_drawn(GN, GBAD, GM)) < 1e-12);
        accepted += p.groups[1].accepted;
        vks_group_plan_free(&p);
    }
    /* other secrets, other subsets; every sample is drawn sometimes (each
     * misses 200 draws of 1/8 with chance 2.6e-12) */
    vks_group_plan p;
    gs.secret = 17 + 1000003u;
    assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &p), VKS_OK);
    assert_memory_not_equal(p.checked, first, sizeof first);
    vks_group_plan_free(&p);
    for (int i = 0; i < 2 * GN; i++) assert_true(times_checked[i] > 0);
    /* one changed byte of one sample redraws its group's subset, not the other's */
    gs.secret = 17;
    s[3].seq ^= 1;
    assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &p), VKS_OK);
    bool same0 = true, same1 = true;
    for (int i = 0; i < 2 * GN; i++) *(i % 2 ? &same1 : &same0) &= p.checked[i] == first[i];
    assert_true(same0 && !same1);
    vks_group_plan_free(&p);
    s[3].seq ^= 1;
    /* so does a changed byte of a stage commitment (a pipeline's sample) */
    uint8_t stage_bytes[4] = {1, 2, 3, 4};
    vks_stage_proof stage = {.rank = 2, .layer_begin = 0, .layer_end = 1, .proofs = stage_bytes, .proof_bytes = 4};
    s[3].stage_proofs = &stage, s[3].n_stage_proofs = 1;
    bool with_stage[2 * GN];
    assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &p), VKS_OK);
    memcpy(with_stage, p.checked, sizeof with_stage);
    vks_group_plan_free(&p);
    stage_bytes[2] ^= 1;
    assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &p), VKS_OK);
    assert_memory_not_equal(p.checked, with_stage, sizeof with_stage);
    vks_group_plan_free(&p);
    s[3].stage_proofs = NULL, s[3].n_stage_proofs = 0;
    /* the empirical pass rate of the 13-of-128 group against the exact value (4 standard deviations) */
    double want = none_drawn(GN, GBAD, GM), rate = (double)accepted / SECRETS;
    double sd = sqrt(want * (1 - want) / SECRETS);
    fprintf(stderr, "group of %d with %d bad, %d checked: passed %d of %d secrets (%.3f; exact %.4f, (1-p)^m %.4f)\n", GN,
            GBAD, GM, accepted, SECRETS, rate, want, pow(1 - (double)GBAD / GN, GM));
    assert_true(fabs(rate - want) <= 4 * sd);
    /* one group for the whole file */
    gs.whole_file = true;
    assert_int_equal(vks_group_plan_make(s, 2 * GN, &gs, &p), VKS_OK);
    assert_int_equal(p.n_groups, 1);
    assert_int_equal(p.groups[0].n, 2 * GN);
    assert_int_equal(p.groups[0].n_checked, GM);
    vks_group_plan_free(&p);
    /* no samples: no groups, the verifier still called once (verifier ranks wait for the end) */
    vks_verdict none[1];
    fake_verifier f = {0};
    assert_int_equal(vks_verify_groups(s, 0, &gs, fake_verify, &f, none, &p), VKS_OK);
    assert_int_equal(p.n_groups, 0);
    assert_int_equal(f.calls, 1);
    vks_group_plan_free(&p);
    free_fake(s, 2 * GN);
    free(s);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_poly_known_values),
        cmocka_unit_test(test_poly_random_points),
        cmocka_unit_test(test_poly_parse_rejects),
        cmocka_unit_test(test_topk_ties_and_nan),
        cmocka_unit_test(test_proof_self_and_perturbed),
        cmocka_unit_test(test_build_sizes_and_builder),
        cmocka_unit_test(test_rollout_roundtrip),
        cmocka_unit_test(test_rollout_header_model_not_utf8), cmocka_unit_test(test_rollout_header_kv_type), cmocka_unit_test(test_rollout_policy),
        cmocka_unit_test(test_verify_kv_type_mismatch),
        cmocka_unit_test(test_rollout_malformed),
        cmocka_unit_test(test_stage_proofs_roundtrip),
        cmocka_unit_test(test_stage_proofs_malformed),
        cmocka_unit_test(test_stage_proofs_verify),
        cmocka_unit_test(test_malformed_proofs_rejected),
        cmocka_unit_test(test_honest_gpu_on_cpu_and_gpu),
        cmocka_unit_test(test_honest_cpu_on_gpu),
        cmocka_unit_test(test_replay_logp),
        cmocka_unit_test(test_honest_logit_differences),
        cmocka_unit_test(test_cheats_edited_samples),
        cmocka_unit_test(test_cheats_other_models),
        cmocka_unit_test(test_lower_precision_rate),
        cmocka_unit_test(test_cli_generate_verify),
        cmocka_unit_test(test_verify_huge_context),
        cmocka_unit_test(test_verify_sample_beyond_device),
        cmocka_unit_test(test_header_rules),
        cmocka_unit_test(test_group_bound_formula),
        cmocka_unit_test(test_group_full_names_every_cheat),
        cmocka_unit_test(test_group_sampling_statistics),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    if (tu_test_short()) n_samples = 50;
    return cmocka_run_group_tests(tests, setup, teardown);
}
