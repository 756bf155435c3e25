/* test_train: the GPU trainer (vks_train.h) against the float64 training
 * reference (vks_ref_train.h): log-probabilities, the loss and the gradient of
 * every parameter tensor by name, AdamW steps, the loss curve, determinism,
 * recompute, resume and overfitting a handful of sequences. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_ref_grad.h"
#include "vkswarm/vks_ref_train.h"
#include "vkswarm/vks_train.h"

static vks_gpu *gpu;

static int setup(void **state) {
    (void)state;
    return (gpu = tu_gpu_open()) ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    vks_gpu_destroy(gpu);
    return 0;
}

/* A small model with odd sizes: GQA 2, untied classifier unless tied. */
static vks_model *small_model(bool tied, int rope_mode, uint64_t seed) {
    vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 67, .seq_len = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_mode = rope_mode, .shared_classifier = tied};
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, seed, &m), VKS_OK);
    return m;
}

/* Two packed sequences (lengths 9 and 14) of pseudo-random tokens. */
typedef struct {
    int32_t tokens[23];
    int lens[2];
    float weight[23];
} small_batch;

static void make_batch(small_batch *b, int vocab, uint64_t seed) {
    b->lens[0] = 9;
    b->lens[1] = 14;
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < 23; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        b->tokens[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
        b->weight[i] = (i % 3 == 0) ? 0.0f : 1.0f / 23.0f; /* a mask and a normaliser */
    }
}

static vks_train_batch train_batch(const small_batch *b) {
    return (vks_train_batch){.tokens = b->tokens, .n_tokens = 23, .seq_lens = b->lens, .n_seqs = 2, .weight = b->weight};
}

static vks_ref_batch ref_batch(const small_batch *b) {
    return (vks_ref_batch){.tokens = b->tokens, .n_tokens = 23, .seq_lens = b->lens, .n_seqs = 2};
}

static vks_trainer *make_trainer(const vks_model *m, bool recompute) {
    vks_trainer_options o = {.max_tokens = 32, .recompute = recompute};
    vks_trainer *t = NULL;
    if (vks_trainer_create(gpu, m, &o, &t)) fprintf(stderr, "vks_trainer_create: %s\n", vks_last_error());
    assert_non_null(t);
    return t;
}

/* Largest |a - ref| relative to the largest |ref| of a tensor (plus a floor). */
static double tensor_error(const float *a, const double *ref, size_t n) {
    double err = 0, scale = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= err)) err = d; /* NaN propagates */
        if (fabs(ref[i]) > scale) scale = fabs(ref[i]);
    }
    return err / (scale + 1e-6);
}

/* The trainer's log-probabilities, loss and every gradient of m against the
 * float64 reference; frees m. */
static void check_model_gradients(vks_model *m, bool recompute) {
    small_batch sb;
    make_batch(&sb, m->cfg.vocab_size, 3);
    vks_trainer *t = make_trainer(m, recompute);
    vks_train_batch b = train_batch(&sb);
    double loss;
    float logp[23];
    assert_int_equal(vks_trainer_accumulate(t, &b, &loss, logp), VKS_OK);

    vks_ref_params *p, *g;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, vks_model_has_bias(m), &g), VKS_OK);
    vks_ref_batch rb = ref_batch(&sb);
    double ref_logp[23], w[23], ref_loss;
    for (int i = 0; i < 23; i++) w[i] = sb.weight[i];
    assert_int_equal(vks_ref_train_forward(p, &rb, ref_logp, NULL, NULL), VKS_OK);
    assert_int_equal(vks_ref_train_loss(p, &rb, w, 1.0, &ref_loss, g), VKS_OK);
    for (int i = 0; i < 23; i++) assert_true(fabs(logp[i] - ref_logp[i]) < 2e-5 * (1 + fabs(ref_logp[i])));
    assert_true(fabs(loss - ref_loss) < 1e-5 * (1 + fabs(ref_loss)));

    assert_int_equal(vks_trainer_n_tensors(t), g->n_tensors);
    for (int i = 0; i < g->n_tensors; i++) {
        vks_train_tensor_info info;
        assert_int_equal(vks_trainer_tensor_info(t, i, &info), VKS_OK);
        assert_string_equal(info.name, g->tensors[i].name);
        size_t n = (size_t)(info.rows * info.cols);
        float *grad = malloc(n * sizeof *grad);
        assert_int_equal(vks_trainer_read(t, VKS_SET_GRADS, i, grad), VKS_OK);
        assert_false(tu_has_nonfinite(grad, n));
        double err = tensor_error(grad, g->tensors[i].data, n);
        if (err > 1e-4) fprintf(stderr, "gradient of %s: relative error %.3g\n", info.name, err);
        assert_true(err <= 1e-4);
        free(grad);
    }
    vks_ref_params_free(p);
    vks_ref_params_free(g);
    vks_trainer_destroy(t);
    vks_model_free(m);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

static void check_gradients(bool tied, int rope_mode, bool recompute) {
    check_model_gradients(small_model(tied, rope_mode, 7), recompute);
}

/* head_dim 16 with 4 heads on dim 48: q and the attention output are 64 wide. */
static void test_gradients_head_dim(void **state) {
    (void)state;
    vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                          .vocab_size = 67, .seq_len = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_mode = VKS_ROPE_HALF};
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, 7, &m), VKS_OK);
    check_model_gradients(m, false);
}

/* Qwen3: the gradients of q_norm and k_norm (and through them) too. */
static void test_gradients_qwen3(void **state) {
    (void)state;
    vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .head_dim = 16,
                          .vocab_size = 67, .seq_len = 32, .norm_eps = 1e-6f, .rope_theta = 1e6f,
                          .rope_mode = VKS_ROPE_HALF, .qk_norm = true};
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, 8, &m), VKS_OK);
    check_model_gradients(m, false);
    assert_int_equal(vks_model_random(&c, 9, &m), VKS_OK);
    check_model_gradients(m, true); /* recomputed layers keep q/k before the norm too */
}

static void test_gradients_untied_adjacent(void **s) { (void)s; check_gradients(false, VKS_ROPE_ADJACENT, false); }
static void test_gradients_tied_half(void **s) { (void)s; check_gradients(true, VKS_ROPE_HALF, false); }
static void test_gradients_recompute(void **s) { (void)s; check_gradients(false, VKS_ROPE_HALF, true); }

static const vks_adamw_params adamw = {.lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/* One SFT step and one RL (GRPO) step for every architecture: finite losses,
 * the weights move, the trainer's model exports with the architecture. */
static void test_every_architecture_steps(void **state) {
    (void)state;
    const char *archs[] = {"llama", "llama3", "qwen2", "qwen3"};
    for (int a = 0; a < 4; a++) {
        vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                              .vocab_size = 67, .seq_len = 32, .head_dim = a == 3 ? 16 : 0, .norm_eps = 1e-6f};
        vks_model *m = NULL;
        if (vks_model_random_arch(&c, archs[a], 50 + (uint64_t)a, &m)) fail_msg("%s", vks_last_error());
        small_batch sb;
        make_batch(&sb, m->cfg.vocab_size, 5);
        vks_train_batch b = train_batch(&sb);
        vks_trainer *t = make_trainer(m, false);
        double loss, norm;
        assert_int_equal(vks_trainer_accumulate(t, &b, &loss, NULL), VKS_OK); /* SFT */
        assert_int_equal(vks_trainer_step(t, &adamw, 1.0, &norm), VKS_OK);
        assert_true(isfinite(loss) && isfinite(norm) && norm > 0);
        float logp[23], old[23], adv[23];
        assert_int_equal(vks_trainer_logprobs(t, &b, logp), VKS_OK);
        for (int i = 0; i < 23; i++) {
            old[i] = logp[i] - 0.01f;
            adv[i] = i < 9 ? 1.0f : -1.0f;
        }
        vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 23};
        vks_grpo_rows rows = {old, adv, NULL};
        vks_grpo_stats st;
        assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, &st, NULL), VKS_OK); /* RL */
        assert_int_equal(vks_trainer_step(t, &adamw, 1.0, &norm), VKS_OK);
        assert_true(isfinite(st.loss) && st.tokens > 0 && isfinite(norm) && norm > 0);
        vks_model *out;
        assert_int_equal(vks_trainer_export_model(t, &out), VKS_OK);
        assert_string_equal(out->arch, m->arch);
        assert_true(out->cfg.qk_norm == m->cfg.qk_norm && out->cfg.rope_scaling.type == m->cfg.rope_scaling.type);
        assert_true(vks_model_has_bias(out) == vks_model_has_bias(m));
        float w0 = ((const float *)m->layers[1].wq.data)[3], w1 = ((const float *)out->layers[1].wq.data)[3];
        assert_true(w0 != w1); /* two steps moved the weights */
        vks_model_free(out);
        vks_trainer_destroy(t);
        vks_model_free(m);
    }
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* steps of accumulate + step; losses[] gets each step's loss. */
static void train_steps(vks_trainer *t, const small_batch *sb, int steps, double max_norm, double *losses) {
    vks_train_batch b = train_batch(sb);
    for (int s = 0; s < steps; s++) {
        assert_int_equal(vks_trainer_accumulate(t, &b, &losses[s], NULL), VKS_OK);
        double norm;
        assert_int_equal(vks_trainer_step(t, &adamw, max_norm, &norm), VKS_OK);
        assert_true(isfinite(norm) && norm > 0);
    }
}

/* 20 steps on the GPU and with the reference (gradients, clipping, AdamW in
 * double) give the same loss curve within 1e-3 relative. 8 steps with
 * VKSWARM_TEST_SHORT (the ASan run): the loss is 0.45x the first by then. */
static void test_loss_curve_matches_reference(void **state) {
    (void)state;
    vks_model *m = small_model(false, VKS_ROPE_ADJACENT, 11);
    small_batch sb;
    make_batch(&sb, m->cfg.vocab_size, 5);
    enum { MAX_STEPS = 20 };
    const int steps = tu_test_short() ? 8 : MAX_STEPS;
    double gpu_loss[MAX_STEPS], ref_loss[MAX_STEPS];
    vks_trainer *t = make_trainer(m, false);
    train_steps(t, &sb, steps, 1.0, gpu_loss);
    vks_trainer_destroy(t);

    vks_ref_params *p, *g, *mo, *v;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, false, &g), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, false, &mo), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, false, &v), VKS_OK);
    vks_ref_batch rb = ref_batch(&sb);
    double w[23];
    for (int i = 0; i < 23; i++) w[i] = sb.weight[i];
    for (int s = 0; s < steps; s++) {
        vks_ref_params_zero(g);
        assert_int_equal(vks_ref_train_loss(p, &rb, w, 1.0, &ref_loss[s], g), VKS_OK);
        double scale = vks_ref_clip_scale(sqrt(vks_ref_sum_squares(g->data, g->n_values)), 1.0);
        assert_int_equal(vks_ref_adamw_step(p->data, g->data, mo->data, v->data, p->n_values, &adamw, s + 1, scale),
                         VKS_OK);
    }
    for (int s = 0; s < steps; s++) {
        if (s % 5 == 0 || s == steps - 1) fprintf(stderr, "step %2d: gpu %.6f ref %.6f\n", s + 1, gpu_loss[s], ref_loss[s]);
        assert_true(fabs(gpu_loss[s] - ref_loss[s]) <= 1e-3 * fabs(ref_loss[s]));
    }
    assert_true(gpu_loss[steps - 1] < 0.8 * gpu_loss[0]);
    vks_ref_params_free(p);
    vks_ref_params_free(g);
    vks_ref_params_free(mo);
    vks_ref_params_free(v);
    vks_model_free(m);
}

/* The same model, data and device: bit-identical losses. */
static void test_deterministic(void **state) {
    (void)state;
    vks_model *m = small_model(true, VKS_ROPE_HALF, 13);
    small_batch sb;
    make_batch(&sb, m->cfg.vocab_size, 9);
    double a[6], b[6];
    vks_trainer *t = make_trainer(m, false);
    train_steps(t, &sb, 6, 1.0, a);
    vks_trainer_destroy(t);
    t = make_trainer(m, true); /* recompute changes nothing either */
    train_steps(t, &sb, 6, 1.0, b);
    vks_trainer_destroy(t);
    assert_memory_equal(a, b, sizeof a);
    vks_model_free(m);
}

/* Copies every set of one trainer into another (what a checkpoint carries). */
static void copy_state(vks_trainer *from, vks_trainer *to) {
    for (int i = 0; i < vks_trainer_n_tensors(from); i++) {
        vks_train_tensor_info info;
        assert_int_equal(vks_trainer_tensor_info(from, i, &info), VKS_OK);
        float *x = malloc(sizeof *x * (size_t)(info.rows * info.cols));
        for (int s = VKS_SET_PARAMS; s <= VKS_SET_ADAM_V; s++) {
            if (s == VKS_SET_GRADS) continue;
            assert_int_equal(vks_trainer_read(from, (vks_param_kind)s, i, x), VKS_OK);
            assert_int_equal(vks_trainer_write(to, (vks_param_kind)s, i, x), VKS_OK);
        }
        free(x);
    }
    vks_trainer_set_steps(to, vks_trainer_steps(from));
}

/* N steps straight == N/2, state moved to a fresh trainer, N/2: bit for bit. */
static void test_resume(void **state) {
    (void)state;
    vks_model *m = small_model(false, VKS_ROPE_ADJACENT, 17);
    small_batch sb;
    make_batch(&sb, m->cfg.vocab_size, 21);
    double straight[8], resumed[8];
    vks_trainer *t = make_trainer(m, false);
    train_steps(t, &sb, 8, 0.5, straight);
    vks_trainer_destroy(t);
    t = make_trainer(m, false);
    train_steps(t, &sb, 4, 0.5, resumed);
    vks_trainer *u = make_trainer(m, false);
    copy_state(t, u);
    vks_trainer_destroy(t);
    train_steps(u, &sb, 4, 0.5, resumed + 4);
    vks_trainer_destroy(u);
    assert_memory_equal(straight, resumed, sizeof straight);
    vks_model_free(m);
}

/* A small model memorises two fixed sequences: the loss goes near zero.
 * 150 steps; 40 with VKSWARM_TEST_SHORT (the ASan run: the same code, the
 * same bound; the loss is below 0.01 from step 30 on). */
static void test_overfit(void **state) {
    (void)state;
    vks_model *m = small_model(true, VKS_ROPE_HALF, 19);
    small_batch sb;
    make_batch(&sb, m->cfg.vocab_size, 23);
    for (int i = 0; i < 23; i++) sb.weight[i] = 1.0f / 23.0f;
    vks_trainer *t = make_trainer(m, false);
    vks_train_batch b = train_batch(&sb);
    vks_adamw_params h = adamw;
    h.lr = 1e-2;
    h.weight_decay = 0;
    double first = 0, loss = 0;
    const int steps = tu_test_short() ? 40 : 150;
    for (int s = 0; s < steps; s++) {
        assert_int_equal(vks_trainer_accumulate(t, &b, &loss, NULL), VKS_OK);
        if (s == 0) first = loss;
        assert_int_equal(vks_trainer_step(t, &h, 1.0, NULL), VKS_OK);
    }
    fprintf(stderr, "overfit: loss %.4f -> %.4f after %d steps\n", first, loss, steps);
    assert_true(loss < 0.05);
    vks_trainer_destroy(t);
    vks_model_free(m);
}

/* Hostile batches are refused, naming the problem. */
static void test_bad_batches(void **state) {
    (void)state;
    vks_model *m = small_model(false, VKS_ROPE_ADJACENT, 1);
    vks_trainer *t = make_trainer(m, false);
    int32_t tokens[40] = {0};
    int lens[2] = {5, 30};
    vks_train_batch b = {.tokens = tokens, .n_tokens = 40};
    assert_int_equal(vks_trainer_accumulate(t, &b, NULL, NULL), VKS_ERR_ARG); /* more rows than max_tokens */
    b.n_tokens = 10;
    tokens[3] = 67;
    assert_int_equal(vks_trainer_accumulate(t, &b, NULL, NULL), VKS_ERR_ARG); /* outside the vocabulary */
    tokens[3] = -1;
    assert_int_equal(vks_trainer_accumulate(t, &b, NULL, NULL), VKS_ERR_ARG);
    tokens[3] = 0;
    b.seq_lens = lens;
    b.n_seqs = 2;
    assert_int_equal(vks_trainer_accumulate(t, &b, NULL, NULL), VKS_ERR_ARG); /* lengths exceed the rows */
    vks_trainer_destroy(t);
    vks_model_free(m);
}

/* The memory plan (vks_train_plan_make) against what the trainer allocates
 * (vks_gpu_free_bytes before and after vks_trainer_create): full fine-tuning,
 * tied and not, with and without recompute, at 512 rows so that the smallest
 * activation ([T, n_heads]: 8 KiB) outweighs the slack: 16 bytes of rounding
 * per buffer and the gradient norm's partial sums, whose count depends on the
 * device's workgroup size (at least 32 elements per partial). */
static void test_plan_matches_trainer(void **state) {
    (void)state;
    for (int k = 0; k < 6; k++) { /* 4, 5: Qwen3 (q/k norm buffers, head_dim 16 on dim 48 with 4 heads) */
        bool tied = k & 1, recompute = k & 2, qwen3 = k >= 4;
        vks_model *m = NULL;
        if (qwen3) {
            vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                                  .vocab_size = 67, .seq_len = 32, .head_dim = 16, .norm_eps = 1e-6f,
                                  .shared_classifier = tied};
            assert_int_equal(vks_model_random_arch(&c, "qwen3", 5, &m), VKS_OK);
            recompute = k == 5;
        } else {
            m = small_model(tied, VKS_ROPE_HALF, 5);
        }
        vks_train_plan_options o = {.tokens = 512, .recompute = recompute};
        vks_train_plan p;
        assert_int_equal(vks_train_plan_make(m, &o, &p), VKS_OK);
        assert_int_equal(p.params, vks_model_param_count(m));
        assert_int_equal(p.trainable, p.params);
        assert_true(p.base == 4 * (uint64_t)p.params && p.gradients == p.base && p.optimizer == 2 * p.base);
        assert_int_equal(p.adapter, 0);
        assert_int_equal(p.logits, 512ull * 67 * 4 + 2 * 512 * 4);
        uint64_t before = vks_gpu_free_bytes(gpu);
        vks_trainer_options to = {.max_tokens = 512, .recompute = recompute};
        vks_trainer *t = NULL;
        assert_int_equal(vks_trainer_create(gpu, m, &to, &t), VKS_OK);
        uint64_t used = before - vks_gpu_free_bytes(gpu);
        int n_tensors = vks_trainer_n_tensors(t), layer_sets = recompute ? 1 : 2;
        uint64_t buffers = 4 * (uint64_t)n_tensors + 3 + 14 * (uint64_t)layer_sets + 34;
        uint64_t slack = 16 * buffers + 4 * ((uint64_t)p.trainable / 32 + (uint64_t)n_tensors);
        if (getenv("VKSWARM_TEST_VERBOSE"))
            fprintf(stderr, "plan %llu, trainer %llu, slack %llu\n", (unsigned long long)p.total,
                    (unsigned long long)used, (unsigned long long)slack);
        if (!(used <= p.total + slack && p.total <= used + slack))
            fail_msg("plan %llu bytes, trainer %llu (slack %llu)", (unsigned long long)p.total,
                     (unsigned long long)used, (unsigned long long)slack);
        vks_trainer_destroy(t);
        vks_model_free(m);
    }
}

/* LoRA plans: Llama-3.1-8B's shape has its published 8,030,261,248
 * parameters and, at rank 16 on all seven projections, PEFT's 41,943,040
 * trainable; the adapter's z and backward scratch on top of the same store;
 * bad ranks and token counts refused. */
static void test_plan_lora(void **state) {
    (void)state;
    vks_model shape = {.cfg = {.dim = 4096, .hidden_dim = 14336, .n_layers = 32, .n_heads = 32, .n_kv_heads = 8,
                               .vocab_size = 128256, .seq_len = 131072, .head_dim = 128, .kv_dim = 1024,
                               .norm_eps = 1e-5f, .rope_theta = 500000.0f}};
    vks_train_plan_options o = {.lora_rank = 16, .base_dtype = VKS_DTYPE_Q4_K, .tokens = 2048, .recompute = true};
    vks_train_plan lora, full;
    assert_int_equal(vks_train_plan_make(&shape, &o, &lora), VKS_OK);
    assert_int_equal(lora.params, 8030261248ll);
    assert_int_equal(lora.trainable, 41943040ll);
    assert_true(lora.adapter == 4 * 41943040ull && lora.gradients == lora.adapter && lora.optimizer == 2 * lora.adapter);
    /* q4_k: 144 bytes per 256 weights of every matrix (embedding and classifier
     * too), the 65 norms f32; then under 1 MiB the engine reserves (bias
     * slots, 16-byte chunk padding) */
    uint64_t norms = 65ull * 4096, matrices = (8030261248ull - norms) / 256 * 144;
    assert_true(lora.base >= matrices + 4 * norms && lora.base < matrices + 4 * norms + (1u << 20));
    vks_train_plan_options f = {.tokens = 2048, .recompute = true};
    assert_int_equal(vks_train_plan_make(&shape, &f, &full), VKS_OK);
    uint64_t z = 2048ull * 16 * 4;
    assert_int_equal(lora.activations, full.activations + 7 * z); /* one layer's adapters under recompute */
    assert_int_equal(lora.logits, full.logits);
    assert_true(lora.scratch < full.scratch + z); /* fewer gradient-norm partials, one [T, rank] more */
    o.recompute = false;
    f.recompute = false;
    assert_int_equal(vks_train_plan_make(&shape, &o, &lora), VKS_OK);
    assert_int_equal(vks_train_plan_make(&shape, &f, &full), VKS_OK);
    assert_int_equal(lora.activations, full.activations + 32 * 7 * z);
    o.lora_rank = 1025; /* k/v are 1024 x 4096 */
    assert_int_equal(vks_train_plan_make(&shape, &o, &lora), VKS_ERR_ARG);
    o.lora_rank = 16;
    o.tokens = 16385;
    assert_int_equal(vks_train_plan_make(&shape, &o, &lora), VKS_ERR_ARG);
    o.tokens = 2048;
    o.lora_targets = 1u << 9;
    assert_int_equal(vks_train_plan_make(&shape, &o, &lora), VKS_ERR_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_matches_trainer),
        cmocka_unit_test(test_plan_lora),
        cmocka_unit_test(test_gradients_untied_adjacent),
        cmocka_unit_test(test_gradients_tied_half),
        cmocka_unit_test(test_gradients_recompute),
        cmocka_unit_test(test_gradients_head_dim),
        cmocka_unit_test(test_gradients_qwen3),
        cmocka_unit_test(test_every_architecture_steps),
        cmocka_unit_test(test_loss_curve_matches_reference),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_overfit),
        cmocka_unit_test(test_bad_batches),
    };
    return cmocka_run_group_tests_name("train", tests, setup, teardown);
}
