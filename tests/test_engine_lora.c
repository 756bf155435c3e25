/* test_engine_lora.c: LoRA adapters in inference (issue 25): the engine's
 * unmerged adapter against the float64 reference, a fresh adapter against
 * the base bit for bit, merged against unmerged, adapter swaps, batch
 * invariance with an adapter; the CPU forward with an adapter. Each weight
 * type of the base: f32, f16, q8_0, q4_0 (GGUF files written and read back). */
#include "test_util.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_cpu.h"
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_toploc.h"

static vks_gpu *gpu;

static int setup(void **state) {
    (void)state;
    gpu = tu_gpu_open();
    return gpu ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    vks_gpu_destroy(gpu);
    return 0;
}

static void assert_no_validation_messages(void) { assert_int_equal(vks_gpu_validation_messages(gpu), 0); }

enum { N_IDS = 24, N_TYPES = 4 };
static const vks_dtype types[N_TYPES] = {VKS_DTYPE_F32, VKS_DTYPE_F16, VKS_DTYPE_Q8_0, VKS_DTYPE_Q4_0};
static const int schema_of[VKS_LORA_TARGET_COUNT] = {VKS_T_wq, VKS_T_wk, VKS_T_wv, VKS_T_wo,
                                                                 VKS_T_w1, VKS_T_w3, VKS_T_w2};

/* A random GQA model with every matrix a whole number of 32-blocks, written
 * as GGUF of type t and read back (so engine and reference see the same
 * decoded weights). */
static vks_model *random_model_of(vks_dtype t) {
    vks_model_config c = {.dim = 64, .hidden_dim = 128, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 97, .seq_len = 64, .head_dim = 16, .kv_dim = 32, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false};
    vks_model *m, *l = NULL;
    assert_int_equal(vks_model_random(&c, 25, &m), VKS_OK);
    char path[1100];
    snprintf(path, sizeof path, "%s/lora-base-%s.gguf", tu_tmpdir(), vks_dtype_name(t));
    vks_model_save_options so = {.dtype = t};
    if (vks_model_save_gguf(m, path, &so) || vks_model_load(path, &l)) fail_msg("%s", vks_last_error());
    vks_model_free(m);
    return l;
}

/* A PEFT-initialised adapter of rank r, every target, with B drawn too
 * (b_scale 0: a fresh adapter, B = 0). */
static vks_lora_adapter *adapter_for(const vks_model *m, int r, double alpha, uint64_t seed, float b_scale) {
    vks_lora_config lc = {.rank = r, .alpha = alpha, .targets = VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a;
    assert_int_equal(vks_lora_adapter_create(&m->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, seed), VKS_OK);
    for (int l = 0; b_scale != 0 && l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            tu_fill_uniform(vks_lora_adapter_B(a, l, (vks_lora_target)t), (size_t)(out * r),
                            seed * 131 + (uint64_t)(l * 7 + t), -b_scale, b_scale);
        }
    return a;
}

static void ids_of(int32_t *ids, int n, int vocab) {
    for (int i = 0; i < n; i++) ids[i] = (i * 37 + 5) % vocab;
}

/* The engine's logits of every position of ids with adapter a (NULL: none). */
static float *engine_logits(vks_engine *e, const vks_lora_adapter *a, const int32_t *ids, int n) {
    int V = vks_engine_config(e)->vocab_size;
    float *got = malloc(sizeof(float) * (size_t)n * (size_t)V);
    if (vks_engine_set_lora(e, a) || vks_engine_logits(e, 0, ids, 0, n, 0, got, NULL))
        fail_msg("%s", vks_last_error());
    return got;
}

static vks_engine *engine_for(const vks_model *m) {
    vks_engine_options o = {.n_slots = 1, .kv_len = N_IDS, .max_rows = 13};
    vks_engine *e;
    if (vks_engine_create(gpu, m, &o, &e)) fail_msg("%s", vks_last_error());
    return e;
}

/* Largest |a - ref| over the largest |ref|. */
static double rel_diff(const float *a, const float *ref, size_t n) {
    double d = 0, s = 0;
    for (size_t i = 0; i < n; i++) {
        double di = fabs((double)a[i] - ref[i]);
        if (!(di <= d)) d = di; /* NaN propagates as a failure */
        s = fmax(s, fabs((double)ref[i]));
    }
    return d / s;
}

/* A fresh adapter (B = 0) leaves the base's logits bit for bit; removing
 * the adapter restores them too. */
static void test_fresh_adapter_is_the_base(void **state) {
    (void)state;
    int32_t ids[N_IDS];
    for (int k = 0; k < N_TYPES; k++) {
        vks_model *m = random_model_of(types[k]);
        ids_of(ids, N_IDS, m->cfg.vocab_size);
        size_t n = (size_t)N_IDS * (size_t)m->cfg.vocab_size;
        vks_lora_adapter *fresh = adapter_for(m, 4, 32, 3, 0), *other = adapter_for(m, 4, 32, 4, 0.05f);
        vks_engine *e = engine_for(m);
        float *base = engine_logits(e, NULL, ids, N_IDS), *with = engine_logits(e, fresh, ids, N_IDS);
        assert_true(vks_engine_has_lora(e));
        assert_memory_equal(base, with, n * sizeof(float));
        free(with);
        with = engine_logits(e, other, ids, N_IDS);
        assert_true(rel_diff(with, base, n) > 1e-3); /* the other adapter does change them */
        free(with);
        with = engine_logits(e, NULL, ids, N_IDS);
        assert_false(vks_engine_has_lora(e));
        assert_memory_equal(base, with, n * sizeof(float));
        free(with);
        free(base);
        vks_engine_destroy(e);
        vks_lora_adapter_free(fresh);
        vks_lora_adapter_free(other);
        vks_model_free(m);
    }
    assert_no_validation_messages();
}

/* A random adapter: GPU (unmerged, W in its type) and CPU forward against
 * the float64 reference with the adapter, within the engine-vs-reference
 * tolerance of test_engine (NMSE 1e-10) and the CPU's (1e-4 relative). */
static void test_adapter_vs_reference(void **state) {
    (void)state;
    int32_t ids[N_IDS];
    for (int k = 0; k < N_TYPES; k++) {
        vks_model *m = random_model_of(types[k]);
        ids_of(ids, N_IDS, m->cfg.vocab_size);
        size_t n = (size_t)N_IDS * (size_t)m->cfg.vocab_size;
        vks_lora_adapter *a = adapter_for(m, 8, 16, 5, 0.05f);
        float *want = malloc(n * sizeof(float)), *base = malloc(n * sizeof(float)), *cpu = malloc(n * sizeof(float));
        assert_int_equal(vks_ref_forward_lora(m, a, ids, N_IDS, want, NULL, NULL), VKS_OK);
        assert_int_equal(vks_ref_forward(m, ids, N_IDS, base, NULL), VKS_OK);
        vks_engine *e = engine_for(m);
        float *got = engine_logits(e, a, ids, N_IDS);
        vks_cpu *c;
        int lens[1] = {N_IDS};
        assert_int_equal(vks_cpu_create(m, NULL, &c), VKS_OK);
        assert_int_equal(vks_cpu_set_lora(c, a), VKS_OK);
        assert_int_equal(vks_cpu_prefill(c, ids, lens, 1, NULL, N_IDS, cpu, NULL), VKS_OK);
        vks_cpu_destroy(c);
        double effect = rel_diff(base, want, n), nmse = tu_nmse(got, want, n), on_cpu = rel_diff(cpu, want, n);
        fprintf(stderr, "%s base: the adapter moves the logits by %.3g; GPU nmse %.3g, CPU relative %.3g\n",
                vks_dtype_name(types[k]), effect, nmse, on_cpu);
        assert_true(effect > 1e-2);
        assert_true(nmse < 1e-10);
        assert_true(on_cpu < 1e-4);
        free(want);
        free(base);
        free(cpu);
        free(got);
        vks_engine_destroy(e);
        vks_lora_adapter_free(a);
        vks_model_free(m);
    }
    assert_no_validation_messages();
}

/* m's weights decoded to f32, with scale B A added (in double) to every
 * targeted matrix: the merged model. */
static vks_model *merged_model(const vks_model *m, const vks_lora_adapter *a) {
    vks_model *f;
    assert_int_equal(vks_model_create_f32(&m->cfg, false, &f), VKS_OK);
    const vks_tensor *src[3] = {&m->tok_emb, &m->final_norm, &m->classifier};
    vks_tensor *dst[3] = {&f->tok_emb, &f->final_norm, &f->classifier};
    for (int i = 0; i < 3; i++) vks_dequantize(src[i]->dtype, src[i]->data, (float *)dst[i]->data, (size_t)(src[i]->rows * src[i]->cols));
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    double s = vks_lora_scale(lc->alpha, lc->rank);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
            const vks_tensor *t = &m->layers[l].t[i];
            if (t->data) vks_dequantize(t->dtype, t->data, (float *)f->layers[l].t[i].data, (size_t)(t->rows * t->cols));
        }
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            float *W = (float *)f->layers[l].t[schema_of[t]].data;
            const float *A = vks_lora_adapter_A(a, l, (vks_lora_target)t), *B = vks_lora_adapter_B(a, l, (vks_lora_target)t);
            for (int64_t o = 0; o < out; o++)
                for (int64_t k = 0; k < in; k++) {
                    double acc = 0;
                    for (int j = 0; j < lc->rank; j++) acc += (double)B[o * lc->rank + j] * A[j * in + k];
                    W[o * in + k] = (float)((double)W[o * in + k] + s * acc);
                }
        }
    }
    return f;
}

/* Merged (W + s B A as an f32 model) against unmerged (W in its type, the
 * adapter beside it): logits within 1e-5 relative. */
static void test_merged_vs_unmerged(void **state) {
    (void)state;
    int32_t ids[N_IDS];
    for (int k = 0; k < N_TYPES; k++) {
        vks_model *m = random_model_of(types[k]);
        ids_of(ids, N_IDS, m->cfg.vocab_size);
        size_t n = (size_t)N_IDS * (size_t)m->cfg.vocab_size;
        vks_lora_adapter *a = adapter_for(m, 8, 16, 6, 0.05f);
        vks_model *f = merged_model(m, a);
        vks_engine *e = engine_for(m), *ef = engine_for(f);
        float *unmerged = engine_logits(e, a, ids, N_IDS), *merged = engine_logits(ef, NULL, ids, N_IDS);
        double d = rel_diff(unmerged, merged, n);
        fprintf(stderr, "%s base: merged vs unmerged relative %.3g\n", vks_dtype_name(types[k]), d);
        assert_true(d < 1e-5);
        free(unmerged);
        free(merged);
        vks_engine_destroy(e);
        vks_engine_destroy(ef);
        vks_lora_adapter_free(a);
        vks_model_free(f);
        vks_model_free(m);
    }
    assert_no_validation_messages();
}

/* Swapping adapters between batches: X, then Y (same shape: replaced in
 * place, recordings kept), then Y' of another rank (new buffers, recordings
 * dropped), then X again: each equals a fresh engine with that adapter bit
 * for bit. An adapter for another shape is refused and leaves none. */
static void test_adapter_swaps(void **state) {
    (void)state;
    int32_t ids[N_IDS];
    vks_model *m = random_model_of(VKS_DTYPE_Q8_0);
    ids_of(ids, N_IDS, m->cfg.vocab_size);
    size_t n = (size_t)N_IDS * (size_t)m->cfg.vocab_size;
    vks_lora_adapter *ad[3] = {adapter_for(m, 4, 32, 7, 0.05f), adapter_for(m, 4, 32, 8, 0.05f),
                               adapter_for(m, 2, 32, 9, 0.05f)};
    float *fresh[3];
    for (int i = 0; i < 3; i++) {
        vks_engine *e = engine_for(m);
        fresh[i] = engine_logits(e, ad[i], ids, N_IDS);
        vks_engine_destroy(e);
    }
    vks_engine *e = engine_for(m);
    uint64_t weights = vks_engine_weight_bytes(e);
    const int order[] = {0, 1, 2, 0, 1};
    for (int i = 0; i < 5; i++) {
        float *got = engine_logits(e, ad[order[i]], ids, N_IDS);
        assert_memory_equal(got, fresh[order[i]], n * sizeof(float));
        free(got);
    }
    assert_int_equal(vks_engine_weight_bytes(e), weights);
    vks_model_config other = m->cfg;
    other.hidden_dim = 96;
    vks_lora_config lc = {.rank = 2, .alpha = 8, .targets = VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *wrong;
    assert_int_equal(vks_lora_adapter_create(&other, &lc, &wrong), VKS_OK);
    assert_int_equal(vks_engine_set_lora(e, wrong), VKS_ERR_FORMAT);
    assert_non_null(strstr(vks_last_error(), "gate_proj"));
    assert_false(vks_engine_has_lora(e));
    vks_lora_adapter_free(wrong);
    for (int i = 0; i < 3; i++) {
        free(fresh[i]);
        vks_lora_adapter_free(ad[i]);
    }
    vks_engine_destroy(e);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* Captures the committed hidden rows of every sampled position, by sequence
 * index and position, to compare batched and lone runs bit for bit. */
enum { CAP_SEQS = 12, CAP_POS = 40, CAP_DIM = 64 };
static float captured[2][CAP_SEQS][CAP_POS][CAP_DIM];
static int capture_run;

static void capture_hidden(void *user, const vks_step *st, const vks_seq_state *seqs, const float *hidden,
                           const int32_t *sampled) {
    (void)user;
    (void)sampled;
    for (int i = 0; i < st->n_out; i++) {
        const vks_seq_state *s = &seqs[st->out_seq[i]];
        uint32_t pos = st->pos[st->out_rows[i]];
        if (s->seq_index < CAP_SEQS && pos < CAP_POS)
            memcpy(captured[capture_run][s->seq_index][pos], hidden + (size_t)i * CAP_DIM, sizeof(float) * CAP_DIM);
    }
}

/* With an adapter, twelve sequences decoded as one batch give each one's
 * tokens and hidden rows bit for bit as generated alone. */
static void test_batch_invariance_with_adapter(void **state) {
    (void)state;
    vks_model *m = random_model_of(VKS_DTYPE_Q4_0);
    enum { N = 12 };
    vks_lora_adapter *a = adapter_for(m, 8, 16, 10, 0.05f);
    vks_generate_options g = {.sched = {.steps = CAP_POS, .temperature = 0.8f, .top_p = 0.95f, .seed = 9,
                                        .stop_token_a = -1, .stop_token_b = -1},
                              .on_hidden = capture_hidden};
    memset(captured, 0, sizeof captured);
    vks_sequence batch[N] = {{0}}, alone[N] = {{0}};
    for (int s = 0; s < N; s++) {
        batch[s].n_prompt = alone[s].n_prompt = 1 + (s * 5) % 23;
        batch[s].ids = malloc(sizeof(int32_t) * 32);
        alone[s].ids = malloc(sizeof(int32_t) * 32);
        for (int i = 0; i < batch[s].n_prompt; i++) batch[s].ids[i] = alone[s].ids[i] = (s * 31 + i * 7) % 97;
    }
    vks_engine_options o = {.n_slots = N, .kv_len = CAP_POS, .max_rows = 40};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    assert_int_equal(vks_engine_set_lora(e, a), VKS_OK);
    capture_run = 0;
    assert_int_equal(vks_generate(e, &g, batch, N, 0), VKS_OK);
    capture_run = 1;
    for (int s = 0; s < N; s++) {
        assert_int_equal(vks_generate(e, &g, &alone[s], 1, (uint32_t)s), VKS_OK);
        assert_memory_equal(captured[0][s], captured[1][s], sizeof captured[0][s]);
        assert_int_equal(alone[s].n_ids, batch[s].n_ids);
        assert_memory_equal(alone[s].ids, batch[s].ids, sizeof(int32_t) * (size_t)alone[s].n_ids);
        vks_sequence_free(&alone[s]);
        vks_sequence_free(&batch[s]);
    }
    vks_engine_destroy(e);
    vks_lora_adapter_free(a);
    vks_model_free(m);
    assert_no_validation_messages();
}

/* Two stages (layers [0,1) and [1,2), as a pipeline splits them) with the
 * adapter each holds for its own layers give the whole engine's logits bit
 * for bit. */
static void test_stages_hold_their_layers(void **state) {
    (void)state;
    vks_model *m = random_model_of(VKS_DTYPE_Q4_0);
    vks_lora_adapter *a = adapter_for(m, 8, 16, 14, 0.05f);
    enum { R = 9 };
    int32_t ids[R];
    uint32_t slot[R] = {0}, pos[R], out_rows[R];
    ids_of(ids, R, m->cfg.vocab_size);
    for (int i = 0; i < R; i++) pos[i] = out_rows[i] = (uint32_t)i;
    size_t V = (size_t)m->cfg.vocab_size, D = (size_t)m->cfg.dim;
    float *want = malloc(sizeof(float) * R * V), *got = malloc(sizeof(float) * R * V), *x = malloc(sizeof(float) * R * D);
    vks_engine *e[3];
    const int ranges[3][2] = {{0, 2}, {0, 1}, {1, 2}};
    for (int k = 0; k < 3; k++) {
        vks_engine_options o = {.layer_begin = ranges[k][0], .layer_end = ranges[k][1], .n_slots = 1, .kv_len = R,
                                .max_rows = R};
        if (vks_engine_create(gpu, m, &o, &e[k]) || vks_engine_set_lora(e[k], a)) fail_msg("%s", vks_last_error());
    }
    vks_forward_batch whole = {.n_rows = R, .matmul_kind = VKS_MATMUL_PREFILL, .tokens = ids, .slot = slot, .pos = pos,
                               .n_out = R, .out_rows = out_rows, .logits = want};
    vks_forward_batch first = {.n_rows = R, .matmul_kind = VKS_MATMUL_PREFILL, .tokens = ids, .slot = slot, .pos = pos,
                               .x_out = x};
    vks_forward_batch second = {.n_rows = R, .matmul_kind = VKS_MATMUL_PREFILL, .x_in = x, .slot = slot, .pos = pos,
                                .n_out = R, .out_rows = out_rows, .logits = got};
    assert_int_equal(vks_engine_forward(e[0], &whole), VKS_OK);
    assert_int_equal(vks_engine_forward(e[1], &first), VKS_OK);
    assert_int_equal(vks_engine_forward(e[2], &second), VKS_OK);
    assert_memory_equal(got, want, sizeof(float) * R * V);
    float *base = engine_logits(e[0], NULL, ids, R);
    assert_true(rel_diff(base, want, R * V) > 1e-3);
    free(base);
    for (int k = 0; k < 3; k++) vks_engine_destroy(e[k]);
    free(want);
    free(got);
    free(x);
    vks_lora_adapter_free(a);
    vks_model_free(m);
    assert_no_validation_messages();
}

static void to_writer(void *user, const vks_step *st, const vks_seq_state *seqs, const float *hidden,
                      const int32_t *sampled) {
    (void)sampled;
    vks_rollout_writer_on_hidden(user, st, seqs, hidden);
}

/* Rollouts of N prompts generated with adapter `gen` on the engine, the file
 * naming the model by base + `named` (an honest worker: named = gen). */
static void make_rollouts(vks_model *m, const vks_lora_adapter *gen, const vks_lora_adapter *named, const char *path,
                          vks_rollout_file *rf) {
    enum { N = 4, STEPS = 20 };
    vks_engine_options o = {.n_slots = N, .kv_len = STEPS, .max_rows = 64, .max_out_rows = N, .f32_math = true};
    vks_engine *e;
    assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
    assert_int_equal(vks_engine_set_lora(e, gen), VKS_OK);
    vks_generate_options g = {.sched = {.steps = STEPS, .temperature = 1.0f, .top_p = 0.9f, .seed = 11,
                                        .stop_token_a = -1, .stop_token_b = -1},
                              .on_hidden = to_writer};
    vks_rollout_writer *w;
    if (vks_rollout_writer_create(path, m, named, "lora test", &g.sched, N, true, &w)) fail_msg("%s", vks_last_error());
    g.user = w;
    vks_sequence s[N] = {{0}};
    for (int i = 0; i < N; i++) {
        s[i].n_prompt = 3 + i;
        s[i].ids = malloc(sizeof(int32_t) * 8);
        for (int k = 0; k < s[i].n_prompt; k++) s[i].ids[k] = (i * 13 + k * 5 + 1) % 97;
    }
    assert_int_equal(vks_generate(e, &g, s, N, 0), VKS_OK);
    if (vks_rollout_writer_finish(w, s, N, 0)) fail_msg("%s", vks_last_error());
    vks_rollout_writer_destroy(w);
    for (int i = 0; i < N; i++) vks_sequence_free(&s[i]);
    vks_engine_destroy(e);
    if (vks_rollout_read(path, rf)) fail_msg("%s", vks_last_error());
}

/* The verdicts of every sample of rf by a verifier holding base m with
 * adapter `with` (GPU engine, fast CPU forward and float64 reference);
 * returns how many each accepted, and the first rejection's reason. */
static void verify_with(vks_model *m, const vks_lora_adapter *with, const vks_rollout_file *rf, int accepted[3],
                        char reason[256]) {
    vks_verify_options vo;
    vks_verify_options_default(&vo);
    assert_int_equal(vks_lora_model_hash(m, with, vo.model_hash), VKS_OK);
    memcpy(vo.stop_ids, rf->header.stop_ids, sizeof vo.stop_ids);
    vo.n_stop = rf->header.n_stop;
    vo.lora = with;
    vks_verdict v[8];
    int n = rf->n_samples;
    assert_true(n <= 8);
    reason[0] = 0;
    for (int path = 0; path < 3; path++) {
        if (path == 0) {
            vks_engine_options o = {.n_slots = n, .kv_len = 1, .max_rows = 128, .max_out_rows = 128, .f32_math = true};
            vks_engine *e;
            assert_int_equal(vks_engine_create(gpu, m, &o, &e), VKS_OK);
            assert_int_equal(vks_engine_set_lora(e, with), VKS_OK);
            assert_int_equal(vks_verify_batch(e, &vo, rf->samples, n, v), VKS_OK);
            vks_engine_destroy(e);
        } else {
            vo.cpu_reference = path == 2;
            assert_int_equal(vks_verify_batch_cpu(m, &vo, rf->samples, n, v), VKS_OK);
        }
        accepted[path] = 0;
        for (int i = 0; i < n; i++) {
            accepted[path] += v[i].accepted;
            if (!v[i].accepted && !reason[0]) snprintf(reason, 256, "%s", v[i].reason);
        }
    }
}

/* Rollouts made with adapter X verify with X on every path; with adapter Y,
 * with X at twice its alpha, or with no adapter, they are rejected as another
 * model (the file names base + X). Rollouts made with Y that claim X are
 * rejected by their proofs or draws. */
static void test_rollouts_name_the_adapter(void **state) {
    (void)state;
    vks_model *m = random_model_of(VKS_DTYPE_Q8_0);
    vks_lora_adapter *x = adapter_for(m, 4, 16, 12, 0.05f), *y = adapter_for(m, 4, 16, 13, 0.05f);
    vks_lora_adapter *x2 = adapter_for(m, 4, 32, 12, 0.05f); /* X's matrices, alpha doubled */
    char path[1100], reason[256];
    snprintf(path, sizeof path, "%s/lora-rollouts.jsonl", tu_tmpdir());
    vks_rollout_file rf = {0};
    make_rollouts(m, x, x, path, &rf);
    int acc[3];
    verify_with(m, x, &rf, acc, reason);
    fprintf(stderr, "verified with X: %d %d %d of %d accepted %s\n", acc[0], acc[1], acc[2], rf.n_samples, reason);
    assert_true(acc[0] == rf.n_samples && acc[1] == rf.n_samples && acc[2] == rf.n_samples);
    const vks_lora_adapter *others[] = {y, x2, NULL};
    for (int k = 0; k < 3; k++) {
        uint8_t h[32];
        assert_int_equal(vks_lora_model_hash(m, others[k], h), VKS_OK);
        const char *problem = vks_verify_header_problem(&rf.header, h, rf.header.stop_ids, rf.header.n_stop);
        assert_non_null(problem);
        assert_non_null(strstr(problem, "model_hash"));
        verify_with(m, others[k], &rf, acc, reason);
        assert_true(acc[0] == 0 && acc[1] == 0 && acc[2] == 0);
        assert_non_null(strstr(reason, "model hash"));
    }
    vks_rollout_file_free(&rf);
    make_rollouts(m, y, x, path, &rf); /* made with Y, claiming X */
    verify_with(m, x, &rf, acc, reason);
    fprintf(stderr, "made with Y, claiming X: %d %d %d of %d accepted (%s)\n", acc[0], acc[1], acc[2], rf.n_samples,
            reason);
    assert_true(acc[0] == 0 && acc[1] == 0 && acc[2] == 0);
    vks_rollout_file_free(&rf);
    vks_lora_adapter_free(x);
    vks_lora_adapter_free(x2);
    vks_lora_adapter_free(y);
    vks_model_free(m);
    assert_no_validation_messages();
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fresh_adapter_is_the_base), cmocka_unit_test(test_adapter_vs_reference),
        cmocka_unit_test(test_merged_vs_unmerged),        cmocka_unit_test(test_adapter_swaps),
        cmocka_unit_test(test_batch_invariance_with_adapter), cmocka_unit_test(test_rollouts_name_the_adapter),
        cmocka_unit_test(test_stages_hold_their_layers),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
