/* test_quant: quantized weights in the engine. Block-quantized random models
 * on the GPU against the CPU forward on the same blocks (quantized on upload
 * and kept from the "file"), device bytes per parameter, stories260K in Q8_0
 * against the llama2.c reference logits, Qwen2 q/k/v biases, refusals.
 * The per-kernel reference tests of the block types are rows of test_ops. */
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_quant.h"

static vks_gpu *gpu;

static int setup(void **state) {
    (void)state;
    if (!(gpu = tu_gpu_open())) return -1;
    return 0;
}

static int teardown(void **state) {
    (void)state;
    vks_gpu_destroy(gpu);
    return 0;
}

static void assert_no_validation_messages(void) { assert_int_equal(vks_gpu_validation_messages(gpu), 0); }

/* ---- helpers ---- */

/* Host allocations a test hangs on a model's tensors (freed with the model). */
typedef struct {
    void *p[64];
    int n;
} allocs;

static void *keep(allocs *a, void *p) {
    assert_non_null(p);
    assert_true(a->n < 64);
    a->p[a->n++] = p;
    return p;
}

static void free_allocs(allocs *a) {
    for (int i = 0; i < a->n; i++) free(a->p[i]);
    a->n = 0;
}

/* Replaces the f32 tensor t by its vks_quantize blocks of type `to`. */
static void quantize_tensor(vks_tensor *t, vks_dtype to, allocs *a) {
    assert_int_equal(t->dtype, VKS_DTYPE_F32);
    uint64_t row_bytes;
    assert_true(vks_dtype_row_bytes(to, (uint64_t)t->cols, &row_bytes));
    void *blocks = keep(a, malloc((size_t)(row_bytes * (uint64_t)t->rows)));
    assert_int_equal(vks_quantize(to, t->data, blocks, (size_t)(t->rows * t->cols)), VKS_OK);
    t->dtype = to;
    t->data = blocks;
}

/* Replaces a block tensor by f16 of its dequantized values (what the engine uploads for Q6_K). */
static void dequantize_to_f16(vks_tensor *t, allocs *a) {
    size_t n = (size_t)(t->rows * t->cols);
    float *f = malloc(n * sizeof *f);
    assert_non_null(f);
    vks_dequantize(t->dtype, t->data, f, n);
    uint16_t *h = keep(a, malloc(n * sizeof *h));
    for (size_t i = 0; i < n; i++) h[i] = vks_f32_to_f16(f[i]);
    free(f);
    t->dtype = VKS_DTYPE_F16;
    t->data = h;
}

/* A random GQA model whose matrices all have rows of whole Q4_K blocks (256). */
static vks_model *random_model(bool shared) {
    vks_model_config c = {.dim = 256, .hidden_dim = 512, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 300, .seq_len = 32, .head_dim = 64, .kv_dim = 128, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = 1, .shared_classifier = shared};
    vks_model *m;
    assert_int_equal(vks_model_random(&c, 11, &m), VKS_OK);
    return m;
}

/* Feeds ids[first..end) at those positions of slot 0 in chunks of `chunk`
 * rows; logits of position p go to logits[p * V]. */
static void engine_logits(vks_engine *e, const int32_t *ids, int first, int end, int chunk, float *logits,
                          int V) {
    (void)V;
    int rc = vks_engine_logits(e, 0, ids, first, end, chunk, logits, NULL);
    if (rc) fprintf(stderr, "forward: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
}

/* GPU logits of model `gm` (engine options o) against CPU logits of `cm`:
 * prefill in chunks of 13 rows (tiled matmul and matvec), then decode rows. */
static double gpu_vs_cpu(const vks_model *gm, const vks_engine_options *o, const vks_model *cm) {
    enum { N = 24 };
    int V = gm->cfg.vocab_size;
    int32_t ids[N];
    for (int i = 0; i < N; i++) ids[i] = (i * 37 + 5) % V;
    float *want = malloc(sizeof(float) * N * (size_t)V), *got = malloc(sizeof(float) * N * (size_t)V);
    assert_non_null(want);
    assert_non_null(got);
    assert_int_equal(vks_ref_forward(cm, ids, N, want, NULL), VKS_OK);
    vks_engine_options eo = *o;
    eo.n_slots = 1;
    eo.kv_len = N;
    eo.max_rows = 13;
    vks_engine *e;
    int rc = vks_engine_create(gpu, gm, &eo, &e);
    if (rc) fprintf(stderr, "engine: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
    for (size_t i = 0; i < (size_t)N * V; i++) got[i] = NAN;
    engine_logits(e, ids, 0, 20, 13, got, V); /* 13 + 7 rows: tiled matmul, then matvec */
    engine_logits(e, ids, 20, N, 1, got, V);  /* decode steps */
    vks_engine_destroy(e);
    assert_false(tu_has_nonfinite(got, (size_t)N * V));
    double nmse = tu_nmse(got, want, (size_t)N * V);
    free(want);
    free(got);
    return nmse;
}

/* ---- tests ---- */

/* Quantized on upload (dtype q8_0 / q4_0 / q4_k): same values as the CPU
 * forward on the vks_quantize blocks of every matrix, embedding included. */
static void test_quantize_on_upload(void **state) {
    (void)state;
    vks_dtype types[] = {VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K};
    for (int t = 0; t < 3; t++) {
        vks_model *gm = random_model(t == 1), *cm = random_model(t == 1);
        allocs a = {0};
        vks_layer_weights *w = cm->layers;
        for (int l = 0; l < cm->cfg.n_layers; l++) {
            vks_tensor *ms[] = {&w[l].wq, &w[l].wk, &w[l].wv, &w[l].wo, &w[l].w1, &w[l].w2, &w[l].w3};
            for (int i = 0; i < 7; i++) quantize_tensor(ms[i], types[t], &a);
        }
        quantize_tensor(&cm->tok_emb, types[t], &a);
        if (cm->cfg.shared_classifier) cm->classifier = cm->tok_emb;
        else quantize_tensor(&cm->classifier, types[t], &a);
        vks_engine_options o = {.dtype = types[t]};
        double nmse = gpu_vs_cpu(gm, &o, cm);
        fprintf(stderr, "%s on upload: nmse %.3g\n", vks_dtype_name(types[t]), nmse);
        assert_true(nmse < 1e-10);
        /* and quantization matters: the f32 logits differ */
        vks_engine_options f = {.dtype = VKS_DTYPE_F32};
        double vs_f32 = gpu_vs_cpu(gm, &f, cm);
        fprintf(stderr, "%s vs f32 weights: nmse %.3g\n", vks_dtype_name(types[t]), vs_f32);
        assert_true(vs_f32 > 1e-7);
        free_allocs(&a);
        vks_model_free(gm);
        vks_model_free(cm);
    }
    assert_no_validation_messages();
}

/* keep_file_dtype: a "file" mixing every type; Q6_K goes to the device as f16. */
static void test_keep_file_dtype(void **state) {
    (void)state;
    vks_model *gm = random_model(false), *cm = random_model(false);
    allocs a = {0};
    vks_dtype mix[7] = {VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K, VKS_DTYPE_F32,
                        VKS_DTYPE_Q4_K, VKS_DTYPE_Q6_K, VKS_DTYPE_Q8_0};
    vks_model *both[2] = {gm, cm};
    for (int k = 0; k < 2; k++) {
        vks_layer_weights *w = both[k]->layers;
        for (int l = 0; l < 2; l++) {
            vks_tensor *ms[] = {&w[l].wq, &w[l].wk, &w[l].wv, &w[l].wo, &w[l].w1, &w[l].w2, &w[l].w3};
            for (int i = 0; i < 7; i++)
                if (mix[(i + l) % 7] != VKS_DTYPE_F32) quantize_tensor(ms[i], mix[(i + l) % 7], &a);
        }
        quantize_tensor(&both[k]->tok_emb, VKS_DTYPE_Q4_0, &a);
        quantize_tensor(&both[k]->classifier, VKS_DTYPE_Q6_K, &a);
    }
    /* the CPU reference sees the Q6_K tensors as the engine uploads them */
    for (int l = 0; l < 2; l++) {
        vks_tensor *ms[] = {&cm->layers[l].wq, &cm->layers[l].wk, &cm->layers[l].wv, &cm->layers[l].wo,
                            &cm->layers[l].w1, &cm->layers[l].w2, &cm->layers[l].w3};
        for (int i = 0; i < 7; i++)
            if (ms[i]->dtype == VKS_DTYPE_Q6_K) dequantize_to_f16(ms[i], &a);
    }
    dequantize_to_f16(&cm->classifier, &a);
    vks_engine_options o = {.keep_file_dtype = true, .dtype = VKS_DTYPE_BF16 /* ignored */};
    double nmse = gpu_vs_cpu(gm, &o, cm);
    fprintf(stderr, "file types kept: nmse %.3g\n", nmse);
    assert_true(nmse < 1e-10);
    free_allocs(&a);
    vks_model_free(gm);
    vks_model_free(cm);
    assert_no_validation_messages();
}

/* Weights stay quantized in device memory: at most 0.6 bytes per parameter for Q4_0. */
static void test_device_bytes(void **state) {
    (void)state;
    vks_model *m = random_model(false);
    double params = (double)vks_model_param_count(m);
    vks_dtype types[] = {VKS_DTYPE_F16, VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0, VKS_DTYPE_Q4_K};
    double limit[] = {2.1, 1.1, 0.6, 0.6};
    for (int t = 0; t < 4; t++) {
        vks_engine_options o = {.dtype = types[t], .n_slots = 1, .kv_len = 8, .max_rows = 4};
        vks_engine *e;
        assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
        double per_param = (double)vks_engine_weight_bytes(e) / params;
        fprintf(stderr, "%s: %.4f bytes per parameter\n", vks_dtype_name(types[t]), per_param);
        assert_true(per_param <= limit[t]);
        assert_true(per_param >= 0.5);
        /* decode reads all but the (unshared) embedding table */
        assert_true(vks_engine_decode_weight_bytes(e) < vks_engine_weight_bytes(e));
        /* the planning sizes (pipeline placement) agree with what was placed */
        uint64_t planned = vks_engine_embedding_bytes(m, &o);
        for (int l = 0; l < m->cfg.n_layers; l++) planned += vks_engine_layer_bytes(m, &o, l);
        if (!m->cfg.shared_classifier) planned += vks_engine_embedding_bytes(m, &o); /* the classifier's shape */
        double placed = (double)vks_engine_weight_bytes(e);
        fprintf(stderr, "%s: planned %llu bytes, placed %.0f\n", vks_dtype_name(types[t]), (unsigned long long)planned,
                placed);
        assert_true(planned >= 0.95 * placed && planned <= 1.05 * placed);
        assert_int_equal(vks_engine_layer_bytes(m, &o, m->cfg.n_layers), 0);
        /* weights only: a larger KV cache does not change the figure */
        vks_engine_options big = o;
        big.n_slots = 4;
        big.kv_len = 32;
        vks_engine *e2;
        assert_int_equal(vks_engine_create(gpu, m, &big, &e2), VKS_OK);
        assert_int_equal(vks_engine_weight_bytes(e2), vks_engine_weight_bytes(e));
        assert_true(vks_engine_device_bytes(e2) > vks_engine_device_bytes(e));
        vks_engine_destroy(e2);
        vks_engine_destroy(e);
    }
    vks_model_free(m);
    assert_no_validation_messages();
}

/* ---- stories260K in Q8_0 ---- */

static int32_t *read_ref_ids(const char *name, int *n) {
    char rel[256];
    snprintf(rel, sizeof rel, "stories260K/ref/%s.ids", name);
    const char *path = tu_shared_path(rel);
    char *text = path ? (char *)tu_read_file(path, NULL) : NULL;
    if (!text) return NULL;
    int32_t *ids = malloc(sizeof(int32_t) * 4096);
    assert_non_null(ids);
    *n = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#') continue;
        for (char *tok = line; *tok && *n < 4096;) {
            char *end;
            long v = strtol(tok, &end, 10);
            if (end == tok) break;
            ids[(*n)++] = (int32_t)v;
            tok = end;
        }
    }
    free(text);
    return ids;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Q8_0 where rows are whole blocks (dim 64), f16 for w2 (hidden 172). */
static void test_stories_q8_0(void **state) {
    (void)state;
    const char *path = tu_shared_path("stories260K/stories260K.bin");
    if (!path) skip();
    vks_model *m;
    assert_int_equal(vks_model_load_llama2c(path, &m), VKS_OK);
    const char *cases[] = {"greedy_noprompt_n200", "greedy_onceuponatime_n64"};
    int V = m->cfg.vocab_size;
    for (int c = 0; c < 2; c++) {
        int n_ids = 0;
        int32_t *ids = read_ref_ids(cases[c], &n_ids);
        char rel[256];
        snprintf(rel, sizeof rel, "stories260K/ref/%s.logits.f32", cases[c]);
        size_t bytes = 0;
        float *ref = (float *)tu_read_file(tu_shared_path(rel), &bytes);
        assert_non_null(ids);
        assert_non_null(ref);
        int N = (int)(bytes / 4 / (size_t)V);
        assert_true(N > 0 && N <= n_ids);
        vks_engine_options o = {.dtype = VKS_DTYPE_Q8_0, .n_slots = 1, .kv_len = N, .max_rows = 64};
        vks_engine *e;
        assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
        float *got = malloc(bytes);
        assert_non_null(got);
        engine_logits(e, ids, 0, N, 64, got, V);
        assert_false(tu_has_nonfinite(got, (size_t)N * V));
        int agree = 0;
        for (int p = 0; p < N; p++) agree += argmax(got + (size_t)p * V, V) == argmax(ref + (size_t)p * V, V);
        fprintf(stderr, "stories260K q8_0 %s: top-1 agreement %d/%d, nmse %.3g\n", cases[c], agree, N,
                tu_nmse(got, ref, (size_t)N * V));
        assert_true(agree >= 0.98 * N);
        vks_engine_destroy(e);
        free(got);
        free(ref);
        free(ids);
    }
    vks_model_free(m);
    assert_no_validation_messages();
}

/* ---- Qwen2 biases ---- */

static void test_qkv_biases(void **state) {
    (void)state;
    vks_model *m = random_model(false);
    allocs a = {0};
    int qd = m->cfg.n_heads * m->cfg.head_dim, kv = m->cfg.kv_dim;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        vks_layer_weights *w = &m->layers[l];
        float *bq = keep(&a, malloc(sizeof(float) * (size_t)qd)), *bk = keep(&a, malloc(sizeof(float) * (size_t)kv));
        float *bv = keep(&a, malloc(sizeof(float) * (size_t)kv));
        tu_fill_uniform(bq, (size_t)qd, 100 + (uint64_t)l, -0.5f, 0.5f);
        tu_fill_uniform(bk, (size_t)kv, 200 + (uint64_t)l, -0.5f, 0.5f);
        tu_fill_uniform(bv, (size_t)kv, 300 + (uint64_t)l, -0.5f, 0.5f);
        w->bq = (vks_tensor){VKS_DTYPE_F32, 1, qd, bq};
        w->bk = (vks_tensor){VKS_DTYPE_F32, 1, kv, bk};
        w->bv = (vks_tensor){VKS_DTYPE_F32, 1, kv, bv};
    }
    vks_engine_options o = {.dtype = VKS_DTYPE_F32};
    double nmse = gpu_vs_cpu(m, &o, m);
    fprintf(stderr, "q/k/v biases: nmse %.3g\n", nmse);
    assert_true(nmse < 1e-10);
    /* the biases matter: the same model without them is far from it */
    vks_model *plain = random_model(false);
    double without = gpu_vs_cpu(plain, &o, m);
    fprintf(stderr, "without biases: nmse %.3g\n", without);
    assert_true(without > 1e-4);
    /* and biases with quantized matrices */
    o.dtype = VKS_DTYPE_Q8_0;
    vks_model *cm = random_model(false);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        vks_layer_weights *w = &cm->layers[l];
        w->bq = m->layers[l].bq;
        w->bk = m->layers[l].bk;
        w->bv = m->layers[l].bv;
        vks_tensor *ms[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (int i = 0; i < 7; i++) quantize_tensor(ms[i], VKS_DTYPE_Q8_0, &a);
    }
    quantize_tensor(&cm->tok_emb, VKS_DTYPE_Q8_0, &a);
    quantize_tensor(&cm->classifier, VKS_DTYPE_Q8_0, &a);
    nmse = gpu_vs_cpu(m, &o, cm);
    fprintf(stderr, "q/k/v biases, q8_0: nmse %.3g\n", nmse);
    assert_true(nmse < 1e-10);
    free_allocs(&a);
    vks_model_free(cm);
    vks_model_free(plain);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* ---- refusals ---- */

static void test_refusals(void **state) {
    (void)state;
    vks_model *m = random_model(false);
    vks_engine *e = NULL;
    vks_engine_options o = {.dtype = VKS_DTYPE_Q6_K, .n_slots = 1, .kv_len = 8, .max_rows = 4};
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_ERR_ARG);
    assert_null(e);
    o.dtype = (vks_dtype)99;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_ERR_ARG);
    /* a "file" tensor claiming Q4_K with rows of 256 elements but a bias of the wrong length */
    float bad_bias[3] = {0};
    m->layers[1].bk = (vks_tensor){VKS_DTYPE_F32, 1, 3, bad_bias};
    o.dtype = VKS_DTYPE_Q4_0;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "layer 1 bk"));
    m->layers[1].bk = (vks_tensor){0};
    /* a kept block tensor whose rows are not whole blocks: an error, no crash */
    vks_model_config c = {.dim = 96, .hidden_dim = 64, .n_layers = 1, .n_heads = 2, .n_kv_heads = 2,
                          .vocab_size = 50, .seq_len = 8, .head_dim = 48, .kv_dim = 96, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f};
    vks_model *small;
    assert_int_equal(vks_model_random(&c, 3, &small), VKS_OK);
    small->layers[0].wq.dtype = VKS_DTYPE_Q4_K; /* 96 is not a multiple of 256 */
    vks_engine_options k = {.keep_file_dtype = true, .n_slots = 1, .kv_len = 8, .max_rows = 4};
    int rc = vks_engine_create(gpu, small, &k, &e);
    fprintf(stderr, "refused: %s\n", vks_last_error());
    assert_int_equal(rc, VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "layer 0 wq"));
    assert_null(e);
    small->layers[0].wq.dtype = VKS_DTYPE_F32;
    vks_model_free(small);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* The default weight-type policy: block-quantized matrices keep their types. */
static void test_default_type_policy(void **state) {
    (void)state;
    vks_model *m = random_model(false);
    assert_false(vks_engine_keeps_file_types(m));
    vks_dtype saved = m->layers[m->cfg.n_layers - 1].w2.dtype;
    m->layers[m->cfg.n_layers - 1].w2.dtype = VKS_DTYPE_Q4_0; /* only the type is looked at */
    assert_true(vks_engine_keeps_file_types(m));
    m->layers[m->cfg.n_layers - 1].w2.dtype = saved;
    assert_false(vks_engine_keeps_file_types(NULL));
    vks_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_on_upload), cmocka_unit_test(test_keep_file_dtype),
        cmocka_unit_test(test_device_bytes), cmocka_unit_test(test_default_type_policy),       cmocka_unit_test(test_stories_q8_0),
        cmocka_unit_test(test_qkv_biases),         cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
