/* test_cpu.c: the fast f32 CPU forward (src/cpu) against the float64
 * reference forward: stories260K, every weight type, Qwen2 biases, odd
 * shapes, several sequences in one call, panels smaller than a matrix, any
 * thread count; and the CPU verifier giving the same verdicts on 1 and N
 * threads. (GPU rollouts and every TOPLOC cheat through the same verifier:
 * tests/test_toploc.c, whose vks_verify_batch_cpu is this forward.) */
#include "test_util.h"
#include "vkswarm/vks_cpu.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_sched.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_toploc.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Host allocations hung on a model's tensors (freed after the model). */
typedef struct {
    void *p[128];
    int n;
} allocs;

static void *keep(allocs *a, void *p) {
    assert_non_null(p);
    assert_true(a->n < 128);
    return a->p[a->n++] = p;
}

static void free_allocs(allocs *a) {
    for (int i = 0; i < a->n; i++) free(a->p[i]);
    a->n = 0;
}

static void convert_tensor(vks_tensor *t, vks_dtype to, allocs *a) {
    uint64_t row_bytes;
    assert_true(vks_dtype_row_bytes(to, (uint64_t)t->cols, &row_bytes));
    void *dst = keep(a, malloc((size_t)(row_bytes * (uint64_t)t->rows)));
    size_t n = (size_t)(t->rows * t->cols);
    if (to == VKS_DTYPE_F16 || to == VKS_DTYPE_BF16) {
        uint16_t *h = dst;
        for (size_t i = 0; i < n; i++)
            h[i] = to == VKS_DTYPE_F16 ? vks_f32_to_f16(((const float *)t->data)[i]) : vks_f32_to_bf16(((const float *)t->data)[i]);
    } else {
        assert_int_equal(vks_quantize(to, t->data, dst, n), VKS_OK);
    }
    t->dtype = to;
    t->data = dst;
}

/* Every matrix of m (embedding and classifier included) becomes dtype `to`. */
static void convert_model(vks_model *m, vks_dtype to, allocs *a) {
    if (to == VKS_DTYPE_F32) return;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        vks_layer_weights *w = &m->layers[l];
        vks_tensor *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (size_t i = 0; i < 7; i++) convert_tensor(mats[i], to, a);
    }
    bool shared = m->classifier.data == m->tok_emb.data;
    convert_tensor(&m->tok_emb, to, a);
    if (shared) m->classifier = m->tok_emb;
    else convert_tensor(&m->classifier, to, a);
}

/* Qwen2-style q/k/v biases, f32, values in +-0.1. */
static void add_biases(vks_model *m, allocs *a) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        vks_layer_weights *w = &m->layers[l];
        vks_tensor *b[] = {&w->bq, &w->bk, &w->bv};
        int64_t cols[] = {(int64_t)m->cfg.n_heads * m->cfg.head_dim, m->cfg.kv_dim, m->cfg.kv_dim};
        for (int i = 0; i < 3; i++) {
            float *v = keep(a, malloc(sizeof(float) * (size_t)cols[i]));
            tu_fill_uniform(v, (size_t)cols[i], 100 + (uint64_t)(l * 3 + i), -0.1f, 0.1f);
            *b[i] = (vks_tensor){.dtype = VKS_DTYPE_F32, .rows = 1, .cols = cols[i], .data = v};
        }
    }
}

static int32_t *make_ids(int n, int vocab, uint64_t seed) {
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    assert_non_null(ids);
    for (int i = 0; i < n; i++) ids[i] = (int32_t)((seed * 2654435761u + (uint64_t)i * 40503u) % (uint64_t)vocab);
    return ids;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) worst = d; /* NaN becomes the worst */
    }
    return worst;
}

/* The fast forward over n_seqs sequences in one call against the reference
 * run on each alone: logits and hidden rows within tol. */
static double compare_with_reference(const vks_model *m, const vks_cpu_options *opt, const int *lens, int n_seqs,
                                     double tol) {
    int total = 0;
    for (int s = 0; s < n_seqs; s++) total += lens[s];
    size_t V = (size_t)m->cfg.vocab_size, D = (size_t)m->cfg.dim;
    int32_t *ids = make_ids(total, m->cfg.vocab_size, (uint64_t)total);
    float *fast = malloc(sizeof(float) * V * (size_t)total), *fast_h = malloc(sizeof(float) * D * (size_t)total);
    float *ref = malloc(sizeof(float) * V * (size_t)total), *ref_h = malloc(sizeof(float) * D * (size_t)total);
    assert_true(fast && fast_h && ref && ref_h);
    vks_cpu *c;
    assert_int_equal(vks_cpu_create(m, opt, &c), VKS_OK);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, n_seqs, NULL, total, fast, fast_h), VKS_OK);
    vks_cpu_destroy(c);
    for (int s = 0, row = 0; s < n_seqs; row += lens[s++])
        assert_int_equal(vks_ref_forward(m, ids + row, lens[s], ref + (size_t)row * V, ref_h + (size_t)row * D), VKS_OK);
    double d = max_abs_diff(fast, ref, V * (size_t)total), dh = max_abs_diff(fast_h, ref_h, D * (size_t)total);
    free(ids), free(fast), free(fast_h), free(ref), free(ref_h);
    if (dh > d) d = dh;
    assert_true(d <= tol);
    return d;
}

static void test_stories_f32_within_1e4(void **state) {
    (void)state;
    const char *path = tu_shared_path("stories260K/stories260K.bin");
    if (!path) skip();
    vks_model *m;
    assert_int_equal(vks_model_load(path, &m), VKS_OK);
    int lens[] = {64, 1, 37, 200};
    for (int threads = 1; threads <= 3; threads += 2) {
        vks_cpu_options o = {.threads = threads};
        double d = compare_with_reference(m, &o, lens, 4, 1e-4);
        fprintf(stderr, "stories260K f32, %d threads: largest |logit - reference| %.3g\n", threads, d);
    }
    vks_model_free(m);
}

/* A GQA model whose matrix rows are whole Q4_K/Q6_K blocks (256). */
static vks_model *block_model(int rope_mode) {
    vks_model_config c = {.dim = 256, .hidden_dim = 512, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 300, .seq_len = 48, .head_dim = 64, .kv_dim = 128, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = rope_mode, .shared_classifier = false};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 7, &m), VKS_OK);
    return m;
}

static void test_every_weight_type_with_biases(void **state) {
    (void)state;
    vks_dtype types[] = {VKS_DTYPE_F32, VKS_DTYPE_F16, VKS_DTYPE_BF16, VKS_DTYPE_Q8_0,
                         VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K, VKS_DTYPE_Q6_K};
    int lens[] = {48, 5, 17};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        allocs a = {0};
        vks_model *m = block_model((int)(i % 2));
        add_biases(m, &a);
        convert_model(m, types[i], &a);
        vks_cpu_options o = {.threads = 2, .panel_rows = 100}; /* 300-row classifier: three panels */
        double d = compare_with_reference(m, &o, lens, 3, 1e-4);
        fprintf(stderr, "%-5s weights, biases: largest difference %.3g\n", vks_dtype_name(types[i]), d);
        vks_model_free(m);
        free_allocs(&a);
    }
}

static void test_odd_shapes_and_panels(void **state) {
    (void)state;
    /* 5 query heads over 1 KV head of 6, hidden 70, vocab 97, panels of 7 rows */
    vks_model_config c = {.dim = 30, .hidden_dim = 70, .n_layers = 3, .n_heads = 5, .n_kv_heads = 1,
                          .vocab_size = 97, .seq_len = 37, .head_dim = 6, .kv_dim = 6, .norm_eps = 1e-5f,
                          .rope_theta = 500.0f, .rope_mode = 0, .shared_classifier = true};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 11, &m), VKS_OK);
    allocs a = {0};
    int lens[] = {1, 13, 37, 2, 36};
    vks_cpu_options one = {.threads = 1, .panel_rows = 7}, many = {.threads = 5, .panel_rows = 7};
    compare_with_reference(m, &one, lens, 5, 1e-4);
    compare_with_reference(m, &many, lens, 5, 1e-4);
    convert_model(m, VKS_DTYPE_F16, &a); /* converted panels with a 6-row remainder (97 = 13 x 7 + 6) */
    compare_with_reference(m, &many, lens, 5, 1e-4);
    add_biases(m, &a);
    m->cfg.rope_mode = VKS_ROPE_HALF;
    compare_with_reference(m, &one, lens, 5, 1e-4);
    vks_model_free(m);
    free_allocs(&a);
}

/* head_dim 8 with 5 heads on dim 30: q and the attention output are 40 wide. */
static void test_head_dim(void **state) {
    (void)state;
    vks_model_config c = {.dim = 30, .hidden_dim = 70, .n_layers = 2, .n_heads = 5, .n_kv_heads = 1,
                          .vocab_size = 97, .seq_len = 37, .head_dim = 8, .kv_dim = 8, .norm_eps = 1e-5f,
                          .rope_theta = 500.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = true};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 12, &m), VKS_OK);
    allocs a = {0};
    add_biases(m, &a);
    int lens[] = {1, 13, 37};
    vks_cpu_options o = {.threads = 2};
    compare_with_reference(m, &o, lens, 3, 1e-4);
    vks_model_free(m);
    free_allocs(&a);
}

/* Qwen3: per-head q/k norm before RoPE, head_dim 8 with 5 heads on dim 30. */
static void test_qwen3(void **state) {
    (void)state;
    vks_model_config c = {.dim = 30, .hidden_dim = 70, .n_layers = 2, .n_heads = 5, .n_kv_heads = 1,
                          .vocab_size = 97, .seq_len = 37, .head_dim = 8, .kv_dim = 8, .norm_eps = 1e-6f,
                          .rope_theta = 1e6f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = true, .qk_norm = true};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 13, &m), VKS_OK);
    int lens[] = {1, 13, 37};
    vks_cpu_options o = {.threads = 2};
    compare_with_reference(m, &o, lens, 3, 1e-4);
    vks_model_free(m);
}

/* Logits and hidden rows of one prefill (lens: n sequences) on `threads`. */
static void prefill_on(const vks_model *m, int threads, const int32_t *ids, const int *lens, int n, int total,
                       float *logits, float *hidden) {
    vks_cpu_options o = {.threads = threads};
    vks_cpu *c;
    assert_int_equal(vks_cpu_create(m, &o, &c), VKS_OK);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, n, NULL, total, logits, hidden), VKS_OK);
    vks_cpu_destroy(c);
}

/* Every thread count gives the same bits: weight rows are split among
 * threads, never a dot product's K sum, and no split call is small enough
 * for OpenBLAS's small-matrix kernel (10 rows: 1-row-of-work items did). */
static void test_same_bits_on_any_thread_count(void **state) {
    (void)state;
    const char *core = getenv("VKSWARM_TEST_EXPECT_CORE"); /* set by test_same_bits_on_every_core_type */
    if (core) {
        char info[256];
        vks_cpu_blas_info(info, sizeof info);
        char want[64];
        snprintf(want, sizeof want, "kernels %s", core);
        if (!strstr(info, want)) fail_msg("OPENBLAS_CORETYPE=%s was not taken: %s", core, info);
    }
    vks_dtype types[] = {VKS_DTYPE_F32, VKS_DTYPE_Q8_0};
    int batches[][3] = {{48, 5, 17}, {7, 3, 0}};
    size_t V = 300, D = 256;
    int32_t *ids = make_ids(70, (int)V, 5);
    float *first = malloc(sizeof(float) * V * 70), *logits = malloc(sizeof(float) * V * 70);
    float *first_h = malloc(sizeof(float) * D * 70), *hidden = malloc(sizeof(float) * D * 70);
    assert_true(ids && first && logits && first_h && hidden);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        allocs a = {0};
        vks_model *m = block_model(1);
        convert_model(m, types[i], &a);
        for (int b = 0; b < 2; b++) {
            int n = batches[b][2] ? 3 : 2, total = batches[b][0] + batches[b][1] + batches[b][2];
            prefill_on(m, 1, ids, batches[b], n, total, first, first_h);
            for (int threads = 2; threads <= 5; threads++) {
                prefill_on(m, threads, ids, batches[b], n, total, logits, hidden);
                assert_memory_equal(logits, first, sizeof(float) * V * (size_t)total);
                assert_memory_equal(hidden, first_h, sizeof(float) * D * (size_t)total);
            }
        }
        vks_model_free(m);
        free_allocs(&a);
    }
    free(ids), free(first), free(logits), free(first_h), free(hidden);
}

/* The same test under each OpenBLAS kernel family this CPU can run (each
 * picks its own sgemm kernels, with their own edge handling: the row split by
 * thread count once passed on SkylakeX and failed on Haswell and Zen, the
 * kernels most home CPUs get). OpenBLAS reads OPENBLAS_CORETYPE when it is
 * loaded, so each runs in a fresh copy of this program. */
static void test_same_bits_on_every_core_type(void **state) {
    (void)state;
    static const char *const cores[] = {"Sandybridge", "Haswell", "Zen", "SkylakeX"};
    bool avx = __builtin_cpu_supports("avx"), avx2 = avx && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    bool runs[] = {avx, avx2, avx2, avx512};
    int ran = 0, failed = 0;
    for (size_t i = 0; i < sizeof cores / sizeof cores[0]; i++) {
        if (!runs[i]) {
            fprintf(stderr, "core type %s: skipped (this CPU lacks its instructions)\n", cores[i]);
            continue;
        }
        char cmd[512];
        snprintf(cmd, sizeof cmd,
                 "OPENBLAS_CORETYPE=%s VKSWARM_TEST_EXPECT_CORE=%s VKSWARM_TEST_FILTER=test_same_bits_on_any_thread_count "
                 "/proc/%d/exe >/dev/null 2>&1",
                 cores[i], cores[i], (int)getpid());
        int rc = system(cmd);
        fprintf(stderr, "core type %s: %s\n", cores[i], rc == 0 ? "same bits on 1-5 threads" : "FAILED");
        if (rc != 0) fprintf(stderr, "  to see why: %s\n", cmd);
        failed += rc != 0;
        ran++;
    }
    assert_int_equal(failed, 0);
    assert_true(ran > 0 || !avx);
}

static void test_output_rows_and_bad_arguments(void **state) {
    (void)state;
    vks_model *m = block_model(1);
    vks_cpu *c;
    assert_int_equal(vks_cpu_create(m, NULL, &c), VKS_OK);
    int lens[] = {10, 20}, rows[] = {29, 0, 9};
    int32_t *ids = make_ids(30, 300, 3);
    size_t V = 300, D = 256;
    float *all = malloc(sizeof(float) * V * 30), *some = malloc(sizeof(float) * V * 3), *h = malloc(sizeof(float) * D * 3);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, NULL, 30, all, NULL), VKS_OK);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, rows, 3, some, h), VKS_OK);
    for (int i = 0; i < 3; i++) assert_true(max_abs_diff(some + i * V, all + (size_t)rows[i] * V, V) <= 1e-5);
    int bad_lens[] = {0, 49, -3};
    for (int i = 0; i < 3; i++) assert_int_equal(vks_cpu_prefill(c, ids, &bad_lens[i], 1, NULL, 1, all, NULL), VKS_ERR_ARG);
    int bad_rows[] = {30}, neg_rows[] = {-1};
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, bad_rows, 1, some, NULL), VKS_ERR_ARG);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, neg_rows, 1, some, NULL), VKS_ERR_ARG);
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, NULL, 29, all, NULL), VKS_ERR_ARG);
    ids[17] = 300;
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, NULL, 30, all, NULL), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "row 17"));
    ids[17] = -1;
    assert_int_equal(vks_cpu_prefill(c, ids, lens, 2, NULL, 30, all, NULL), VKS_ERR_ARG);
    vks_cpu_destroy(c);
    free(ids), free(all), free(some), free(h);
    vks_model_free(m);
}

/* ---- the CPU verifier: same verdicts on 1 and N threads ---- */

/* An honest sample generated with the reference forward (recomputed each step). */
static void gen_sample(const vks_model *m, const uint8_t hash[32], int i, int steps, vks_rollout_sample *out) {
    int V = m->cfg.vocab_size, D = m->cfg.dim, n_prompt = 1 + i % 5;
    int32_t *ids = make_ids(steps + 1, V, 50 + (uint64_t)i);
    float *logits = malloc(sizeof(float) * (size_t)(steps + 1) * V), *hidden = malloc(sizeof(float) * (size_t)(steps + 1) * D);
    float *rows = malloc(sizeof(float) * (size_t)steps * D);
    int n = n_prompt;
    for (; n <= steps; n++) {
        assert_int_equal(vks_ref_forward(m, ids, n, logits, hidden), VKS_OK);
        memcpy(rows + (size_t)(n - n_prompt) * D, hidden + (size_t)(n - 1) * D, sizeof(float) * (size_t)D);
        vks_sample_params sp = {.temperature = 0.9f, .seed = 77, .seq = (uint32_t)i, .pos = (uint32_t)(n - 1)};
        ids[n] = (int32_t)vks_ref_sample(logits + (size_t)(n - 1) * V, V, &sp);
    }
    int n_out = n - n_prompt;
    *out = (vks_rollout_sample){.id = strdup("s"), .n_prompt = n_prompt, .n_output = n_out, .seed = 77,
                                .seq = (uint32_t)i, .temperature = 0.9f, .max_steps = steps};
    out->prompt_ids = malloc(sizeof(int32_t) * (size_t)n_prompt);
    out->output_ids = malloc(sizeof(int32_t) * (size_t)n_out);
    memcpy(out->prompt_ids, ids, sizeof(int32_t) * (size_t)n_prompt);
    memcpy(out->output_ids, ids + n_prompt, sizeof(int32_t) * (size_t)n_out);
    memcpy(out->model_hash, hash, 32);
    out->proof_bytes = vks_toploc_proof_size((size_t)n_out);
    out->proofs = malloc(out->proof_bytes);
    assert_int_equal(vks_toploc_build(rows, n_out, D, out->proofs), VKS_OK);
    free(ids), free(logits), free(hidden), free(rows);
}

/* 12 samples of 40 steps (2 proof chunks); 8 with VKSWARM_TEST_SHORT (tools/
 * test's ASan run, where generating them with the reference forward, which
 * recomputes the prefix each step, dominates): both cheats and every prompt
 * length stay. */
static void test_verdicts_same_on_1_and_n_threads(void **state) {
    (void)state;
    enum { MAX_N = 12, STEPS = 40 };
    const int N = tu_test_short() ? 8 : MAX_N;
    vks_model *m = block_model(0);
    vks_verify_options o;
    vks_verify_options_default(&o);
    assert_int_equal(vks_model_hash(m, o.model_hash), VKS_OK);
    vks_rollout_sample s[MAX_N];
    for (int i = 0; i < N; i++) gen_sample(m, o.model_hash, i, STEPS, &s[i]);
    s[3].output_ids[10] = (s[3].output_ids[10] + 1) % 300; /* cheats: a changed token, a forged proof byte */
    s[7].proofs[5] ^= 0x40;
    vks_verdict v[3][MAX_N];
    int threads[] = {1, 4};
    for (int k = 0; k < 2; k++) {
        o.cpu_threads = threads[k];
        assert_int_equal(vks_verify_batch_cpu(m, &o, s, N, v[k]), VKS_OK);
    }
    o.cpu_reference = true;
    assert_int_equal(vks_verify_batch_cpu(m, &o, s, N, v[2]), VKS_OK);
    for (int i = 0; i < N; i++) {
        bool cheat = i == 3 || i == 7;
        for (int k = 0; k < 3; k++) {
            if (v[k][i].accepted == cheat) fprintf(stderr, "sample %d, run %d: %s\n", i, k, v[k][i].reason);
            assert_true(v[k][i].accepted == !cheat);
            assert_string_equal(v[k][i].reason, v[0][i].reason);
        }
    }
    for (int i = 0; i < N; i++) vks_rollout_sample_free(&s[i]);
    vks_model_free(m);
}

/* ---- GPU rollouts (lavapipe; meson runs this again at other subgroup sizes) ---- */

static void push_hidden(void *user, const vks_step *st, const vks_seq_state *states, const float *hidden,
                        const int32_t *sampled) {
    vks_toploc_builder *b = user;
    (void)sampled;
    int dim = vks_toploc_builder_dim(b);
    for (int i = 0; i < st->n_out; i++)
        if (!states[st->out_seq[i]].done)
            assert_int_equal(vks_toploc_builder_push(b, st->out_seq[i], hidden + (size_t)i * (size_t)dim), VKS_OK);
}

/* n samples generated on the GPU as `generate --rollouts-out` makes them. */
static vks_rollout_sample *gpu_samples(vks_gpu *g, const vks_model *m, const uint8_t hash[32], int n, int steps) {
    vks_sequence *seqs = calloc((size_t)n, sizeof *seqs);
    assert_non_null(seqs);
    for (int i = 0; i < n; i++) {
        seqs[i].n_prompt = 1 + i % 7;
        seqs[i].ids = make_ids(seqs[i].n_prompt, m->cfg.vocab_size, 900 + (uint64_t)i);
        seqs[i].ids[0] = 1;
    }
    vks_engine_options eo = {.n_slots = n, .kv_len = steps, .max_rows = 256, .max_out_rows = n, .f32_math = true};
    vks_engine *e;
    vks_toploc_builder *b;
    assert_int_equal(vks_engine_create(g, m, &eo, &e), VKS_OK);
    assert_int_equal(vks_toploc_builder_create(n, m->cfg.dim, &b), VKS_OK);
    vks_generate_options go = {.sched = {.steps = steps, .temperature = 1.0f, .top_p = 0.9f, .seed = 31, .stop_token_a = 1, .stop_token_b = 2}, .on_hidden = push_hidden, .user = b};
    assert_int_equal(vks_generate(e, &go, seqs, n, 0), VKS_OK);
    assert_int_equal(vks_toploc_builder_finish(b), VKS_OK);
    vks_rollout_sample *out = calloc((size_t)n, sizeof *out);
    for (int i = 0; i < n; i++) {
        vks_sequence *q = &seqs[i];
        int n_out = q->n_ids - q->n_prompt + (q->stop_token >= 0);
        out[i] = (vks_rollout_sample){.id = strdup("g"), .n_prompt = q->n_prompt, .n_output = n_out, .seed = 31,
                                      .seq = (uint32_t)i, .temperature = 1.0f, .top_p = 0.9f, .max_steps = steps};
        out[i].prompt_ids = malloc(sizeof(int32_t) * (size_t)q->n_prompt);
        out[i].output_ids = malloc(sizeof(int32_t) * (size_t)n_out);
        memcpy(out[i].prompt_ids, q->ids, sizeof(int32_t) * (size_t)q->n_prompt);
        memcpy(out[i].output_ids, q->ids + q->n_prompt, sizeof(int32_t) * (size_t)(q->n_ids - q->n_prompt));
        if (q->stop_token >= 0) out[i].output_ids[n_out - 1] = q->stop_token;
        memcpy(out[i].model_hash, hash, 32);
        const uint8_t *p = vks_toploc_builder_proofs(b, i, &out[i].proof_bytes);
        out[i].proofs = malloc(out[i].proof_bytes);
        memcpy(out[i].proofs, p, out[i].proof_bytes);
        vks_sequence_free(q);
    }
    vks_toploc_builder_destroy(b);
    vks_engine_destroy(e);
    free(seqs);
    return out;
}

/* 200 GPU samples, none rejected; 50 with VKSWARM_TEST_SHORT (tools/test's
 * ASan run: the same code; the normal build runs all 200 at three widths). */
static void test_gpu_rollouts_accepted(void **state) {
    (void)state;
    enum { STEPS = 40 };
    const int N = tu_test_short() ? 50 : 200;
    const char *path = tu_shared_path("stories260K/stories260K.bin");
    if (!path) skip();
    vks_gpu *g = tu_gpu_open();
    if (!g) skip();
    vks_model *m;
    assert_int_equal(vks_model_load(path, &m), VKS_OK);
    vks_verify_options o;
    vks_verify_options_default(&o);
    assert_int_equal(vks_model_hash(m, o.model_hash), VKS_OK);
    o.stop_ids[0] = 1, o.stop_ids[1] = 2, o.n_stop = 2;
    vks_rollout_sample *s = gpu_samples(g, m, o.model_hash, N, STEPS);
    vks_verdict *v = calloc((size_t)N, sizeof *v);
    o.cpu_threads = 3;
    assert_int_equal(vks_verify_batch_cpu(m, &o, s, N, v), VKS_OK);
    int rejected = 0;
    float worst_gap = 0;
    for (int i = 0; i < N; i++) {
        if (!v[i].accepted) fprintf(stderr, "sample %d rejected: %s\n", i, v[i].reason);
        rejected += !v[i].accepted;
        worst_gap = v[i].max_gap > worst_gap ? v[i].max_gap : worst_gap;
    }
    const char *width = getenv("LP_NATIVE_VECTOR_WIDTH");
    fprintf(stderr, "%d GPU samples (lavapipe vector width %s): %d rejected by the fast CPU verifier, largest gap %.3g\n",
            N, width ? width : "default", rejected, (double)worst_gap);
    assert_int_equal(rejected, 0);
    assert_int_equal(vks_gpu_validation_messages(g), 0);
    for (int i = 0; i < N; i++) vks_rollout_sample_free(&s[i]);
    free(s), free(v);
    vks_model_free(m);
    vks_gpu_destroy(g);
}

/* ---- the CLI: logits --cpu against the GPU's, verify with no Vulkan device ---- */

static float *read_floats(const char *path, size_t want) {
    size_t len = 0;
    unsigned char *b = tu_read_file(path, &len);
    assert_non_null(b);
    assert_int_equal(len, want * sizeof(float));
    return (float *)(void *)b;
}

static void test_cli_logits_cpu_and_no_gpu_verify(void **state) {
    (void)state;
    const char *dir = tu_tmpdir(), *bin = tu_bin(), *rnd = "--random-model 64,128,2,4,2,96,32";
    char cmd[2048], *err = NULL;
    snprintf(cmd, sizeof cmd, "echo '1 5 9 13 2 77 30' > %s/ids && %s logits %s --ids %s/ids --out %s/gpu.f32 2>/dev/null && "
             "%s logits %s --cpu --threads 3 --ids %s/ids --out %s/cpu.f32 2>/dev/null", dir, bin, rnd, dir, dir, bin,
             rnd, dir, dir);
    assert_int_equal(tu_run(cmd, NULL), 0);
    char path[1024];
    snprintf(path, sizeof path, "%s/gpu.f32", dir);
    float *gpu = read_floats(path, 7 * 96);
    snprintf(path, sizeof path, "%s/cpu.f32", dir);
    float *cpu = read_floats(path, 7 * 96);
    assert_true(max_abs_diff(cpu, gpu, 7 * 96) <= 1e-4);
    free(gpu), free(cpu);
    /* rollouts from the GPU, verified where no Vulkan driver loads: the CPU forward takes over */
    snprintf(cmd, sizeof cmd, "%s generate %s --prompt '1 5 7' -n 20 --seed 3 --rollouts-out %s/r.jsonl > /dev/null 2>&1 && "
             "VK_ICD_FILENAMES=/nonexistent VK_DRIVER_FILES=/nonexistent %s verify %s --rollouts %s/r.jsonl 2>&1",
             bin, rnd, dir, bin, rnd, dir);
    assert_int_equal(tu_run(cmd, &err), 0);
    assert_non_null(strstr(err, "verifying with the CPU forward"));
    assert_non_null(strstr(err, "1 accepted"));
    free(err);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stories_f32_within_1e4),
        cmocka_unit_test(test_every_weight_type_with_biases),
        cmocka_unit_test(test_odd_shapes_and_panels),
        cmocka_unit_test(test_head_dim),
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_same_bits_on_any_thread_count),
        cmocka_unit_test(test_same_bits_on_every_core_type),
        cmocka_unit_test(test_output_rows_and_bad_arguments),
        cmocka_unit_test(test_verdicts_same_on_1_and_n_threads),
        cmocka_unit_test(test_gpu_rollouts_accepted),
        cmocka_unit_test(test_cli_logits_cpu_and_no_gpu_verify),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
