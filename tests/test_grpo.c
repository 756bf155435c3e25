/* test_grpo: GRPO on the GPU trainer (vks_trainer_accumulate_grpo) and its
 * host side (vks_grpo.h): group advantages and the online filter by hand;
 * the whole-model gradient of the GRPO loss against the float64 model
 * reference (vks_ref_grpo_loss's dlogp through vks_ref_train_backward) by
 * tensor name, with ratios in every branch, with the KL term and with the
 * entropy bonus (vks_ref_train_backward_entropy), and the reported mean
 * entropy; one step from logp_old == logp
 * raises the positive-advantage completion and lowers the other; reruns are
 * bit-identical; bad rows are refused. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_grpo.h"
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

/* ---- advantages and the filter ---- */

static void test_advantages(void **state) {
    (void)state;
    /* group 0: mean 0.5, population std 0.5 (the sample std would be 0.577);
     * group 1: all equal; group 2: {0, 1}: population std 0.5 (sample: 0.707) */
    double r[] = {1, 0, 0, 1, 0.3, 0.3, 0.3, 0.3, 0, 1, 0, 1};
    double a[12];
    assert_int_equal(vks_grpo_advantages(r, 3, 4, VKS_ADVANTAGE_GROUP_STD, a), VKS_OK);
    double unit = 0.5 / (0.5 + 1e-6);
    double want[] = {unit, -unit, -unit, unit, 0, 0, 0, 0, -unit, unit, -unit, unit};
    for (int i = 0; i < 12; i++) assert_true(fabs(a[i] - want[i]) < 1e-12);
    assert_true(vks_grpo_group_has_signal(r, 4));
    assert_false(vks_grpo_group_has_signal(r + 4, 4));
    assert_true(vks_grpo_group_has_signal(r + 8, 4));
    assert_false(vks_grpo_group_has_signal(r, 1)); /* one completion: nothing to compare */
    double r3[] = {2.0, -1.0, 0.5};              /* mean 0.5, std sqrt(1.5) */
    assert_int_equal(vks_grpo_advantages(r3, 1, 3, VKS_ADVANTAGE_GROUP_STD, a), VKS_OK);
    assert_true(fabs(a[0] - 1.5 / (sqrt(1.5) + 1e-6)) < 1e-12 && fabs(a[2]) < 1e-12);
    double bad[] = {0, NAN};
    assert_int_equal(vks_grpo_advantages(bad, 1, 2, VKS_ADVANTAGE_GROUP_STD, a), VKS_ERR_ARG);
    assert_int_equal(vks_grpo_advantages(r, 0, 4, VKS_ADVANTAGE_GROUP_STD, a), VKS_ERR_ARG);
    assert_int_equal(vks_grpo_advantages(r, 1, 0, VKS_ADVANTAGE_GROUP_STD, a), VKS_ERR_ARG);
    /* group_mean (Dr. GRPO): r - mean, no division; a flat group still 0 */
    assert_int_equal(vks_grpo_advantages(r, 3, 4, VKS_ADVANTAGE_GROUP_MEAN, a), VKS_OK);
    double centred[] = {0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, -0.5, 0.5, -0.5, 0.5};
    for (int i = 0; i < 12; i++) assert_true(fabs(a[i] - centred[i]) < 1e-15);
    assert_int_equal(vks_grpo_advantages(r3, 1, 3, VKS_ADVANTAGE_GROUP_MEAN, a), VKS_OK);
    assert_true(fabs(a[0] - 1.5) < 1e-15 && fabs(a[1] + 1.5) < 1e-15 && fabs(a[2]) < 1e-15);
    assert_int_equal(vks_grpo_advantages(r3, 1, 3, (vks_advantage_type)2, a), VKS_ERR_ARG);
}

static void test_sequence_rows(void **state) {
    (void)state;
    float adv[7], w[7];
    assert_int_equal(vks_grpo_sequence_rows(3, 4, NULL, -0.5, adv, w), VKS_OK);
    float want_w[] = {0, 0, 1, 1, 1, 1, 0}; /* rows 2..5 predict the 4 completion tokens */
    for (int i = 0; i < 7; i++) {
        assert_true(w[i] == want_w[i]);
        assert_true(adv[i] == (want_w[i] ? -0.5f : 0.0f));
    }
    assert_int_equal(vks_grpo_sequence_rows(0, 4, NULL, 1, adv, w), VKS_ERR_ARG);
    assert_int_equal(vks_grpo_sequence_rows(3, -1, NULL, 1, adv, w), VKS_ERR_ARG);
}

/* The trainer's bound on a sampler's log-probabilities: a packed sequence
 * is far when a live row (weight != 0) differs by more than the bound or is
 * not finite; prompt rows (weight 0) never count. */
static void test_far_sequences(void **state) {
    (void)state;
    /* three sequences of 4, 3 and 5 rows; live rows: 1-2, 5, 8-10 */
    float w[] = {0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1, 0};
    float old[] = {0, -1, -2, 0, 0, -3, 0, 0, -1, -1, -1, 0};
    float lp[12];
    memcpy(lp, old, sizeof lp);
    int lens[] = {4, 3, 5};
    bool far[3];
    assert_int_equal(vks_grpo_far_sequences(lp, old, w, lens, 3, 5.0, far), 0);
    lp[2] = -7.0f;          /* sequence 0: 5 nats off, not beyond */
    lp[3] = -100.0f;        /* a row without weight: never counts */
    old[9] = -3e38f;        /* sequence 2: the claim of a cheating rank */
    assert_int_equal(vks_grpo_far_sequences(lp, old, w, lens, 3, 5.0, far), 1);
    assert_false(far[0]), assert_false(far[1]), assert_true(far[2]);
    lp[2] = -7.01f;         /* now beyond */
    lp[5] = NAN;            /* not finite: far */
    assert_int_equal(vks_grpo_far_sequences(lp, old, w, lens, 3, 5.0, far), 3);
    int bad[] = {4, -1, 5};
    assert_int_equal(vks_grpo_far_sequences(lp, old, w, bad, 3, 5.0, far), -1);
    assert_int_equal(vks_grpo_far_sequences(NULL, old, w, lens, 3, 5.0, far), -1);
}

/* ---- the trainer ---- */

static vks_model *small_model(bool tied, int rope_mode, uint64_t seed) {
    vks_model_config c = {.dim = 48, .hidden_dim = 72, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 67, .seq_len = 32, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_mode = rope_mode, .shared_classifier = tied};
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(&c, seed, &m), VKS_OK);
    return m;
}

static vks_trainer *make_trainer(const vks_model *m, bool recompute) {
    vks_trainer_options o = {.max_tokens = 48, .recompute = recompute};
    vks_trainer *t = NULL;
    if (vks_trainer_create(gpu, m, &o, &t)) fprintf(stderr, "vks_trainer_create: %s\n", vks_last_error());
    assert_non_null(t);
    return t;
}

/* A group of G completions of one prompt, packed: sequence s is the prompt
 * then completion s; per-row advantage and completion mask. */
enum { MAX_ROWS = 48, PROMPT = 5 };
typedef struct {
    int32_t tokens[MAX_ROWS];
    int lens[8], n_seqs, n;
    float adv[MAX_ROWS], weight[MAX_ROWS];
} group_batch;

static void make_group(group_batch *g, const int *completion_lens, const double *rewards, int G, int vocab,
                       uint64_t seed) {
    memset(g, 0, sizeof *g);
    double adv[8];
    assert_int_equal(vks_grpo_advantages(rewards, 1, G, VKS_ADVANTAGE_GROUP_STD, adv), VKS_OK);
    int32_t prompt[PROMPT];
    uint64_t s = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (int i = 0; i < PROMPT; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        prompt[i] = (int32_t)((s >> 33) % (uint64_t)vocab);
    }
    for (int q = 0; q < G; q++) {
        int start = g->n, len = PROMPT + completion_lens[q];
        assert_true(start + len <= MAX_ROWS);
        memcpy(g->tokens + start, prompt, sizeof prompt);
        for (int i = PROMPT; i < len; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            g->tokens[start + i] = (int32_t)((s >> 33) % (uint64_t)vocab);
        }
        assert_int_equal(vks_grpo_sequence_rows(PROMPT, completion_lens[q], NULL, adv[q], g->adv + start, g->weight + start),
                         VKS_OK);
        g->lens[q] = len;
        g->n += len;
    }
    g->n_seqs = G;
}

static vks_train_batch train_batch(const group_batch *g) {
    return (vks_train_batch){.tokens = g->tokens, .n_tokens = g->n, .seq_lens = g->lens, .n_seqs = g->n_seqs,
                             .weight = g->weight};
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

static const int lens4[] = {4, 6, 3, 5};
static const double rewards4[] = {1.0, 0.0, 0.5, 0.0};
/* logp - logp_old of the live rows in turn: below 1 - eps, inside, above
 * 1 + eps, above delta; each >= 0.08 from an edge (f32 logp is within 2e-5). */
static const double shifts[] = {-0.6, -0.1, 0.05, 0.4, 1.7};

/* kl_beta != 0: with the KL penalty to a reference logp within +-0.5 of logp.
 * entropy_coef != 0: with the entropy bonus (the reference adds the gradient of
 * -coef sum_r w_r H_r / budget through vks_ref_train_backward_entropy). The
 * mean entropy is reported either way. */
static void check_grpo_gradients(bool tied, int rope_mode, bool recompute, double kl_beta, double entropy_coef) {
    vks_model *m = small_model(tied, rope_mode, 29);
    group_batch gb;
    make_group(&gb, lens4, rewards4, 4, m->cfg.vocab_size, 31);
    vks_trainer *t = make_trainer(m, recompute);
    vks_train_batch b = train_batch(&gb);
    float logp0[MAX_ROWS], logp_old[MAX_ROWS], logp[MAX_ROWS], ref_logp[MAX_ROWS];
    assert_int_equal(vks_trainer_logprobs(t, &b, logp0), VKS_OK);
    for (int i = 0, k = 0; i < gb.n; i++) {
        logp_old[i] = gb.weight[i] ? logp0[i] - (float)shifts[k % 5] : NAN;
        ref_logp[i] = gb.weight[i] ? fminf(0.0f, logp0[i] + 0.5f - 0.23f * (float)(k % 5)) : NAN;
        k += gb.weight[i] != 0;
    }
    vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 64, .kl_beta = kl_beta,
                              .entropy_coef = entropy_coef};
    vks_grpo_stats st;
    vks_grpo_rows rows = {logp_old, gb.adv, kl_beta != 0.0 ? ref_logp : NULL};
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, &st, logp), VKS_OK);
    assert_memory_equal(logp, logp0, sizeof(float) * (size_t)gb.n); /* the same forward, bit for bit */

    vks_ref_params *p, *g;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, false, &g), VKS_OK);
    vks_ref_batch rb = {.tokens = gb.tokens, .n_tokens = gb.n, .seq_lens = gb.lens, .n_seqs = gb.n_seqs};
    double ref_logp_d[MAX_ROWS], old[MAX_ROWS], adv[MAX_ROWS], w[MAX_ROWS], dlogp[MAX_ROWS] = {0}, ref_loss;
    double model_logp[MAX_ROWS], dent[MAX_ROWS], h_rows[MAX_ROWS];
    double *logits = malloc(sizeof *logits * (size_t)gb.n * (size_t)m->cfg.vocab_size);
    assert_non_null(logits);
    uint32_t flags[MAX_ROWS];
    for (int i = 0; i < gb.n; i++) {
        ref_logp_d[i] = ref_logp[i];
        old[i] = logp_old[i];
        adv[i] = gb.adv[i];
        w[i] = gb.weight[i];
    }
    vks_ref_acts *acts;
    assert_int_equal(vks_ref_train_forward(p, &rb, model_logp, logits, &acts), VKS_OK);
    assert_int_equal(vks_ref_grpo_loss(model_logp, old, adv, kl_beta != 0.0 ? ref_logp_d : NULL, w, gb.n, &h, NULL,
                                       flags, &ref_loss, dlogp), VKS_OK);
    assert_int_equal(vks_ref_token_entropy_forward(logits, gb.n, m->cfg.vocab_size, h_rows), VKS_OK);
    double entropy = 0; /* the bonus -c w H / budget in the loss; d loss / d H = -c w / budget */
    for (int i = 0; i < gb.n; i++) {
        dent[i] = -entropy_coef * w[i] / h.token_budget;
        ref_loss += dent[i] * h_rows[i];
        entropy += w[i] ? h_rows[i] : 0.0;
    }
    assert_int_equal(vks_ref_train_backward_entropy(p, &rb, acts, dlogp, entropy_coef != 0.0 ? dent : NULL, g), VKS_OK);
    if (entropy_coef != 0.0) { /* the bonus must move the gradient by far more than the tolerance */
        vks_ref_params *plain;
        assert_int_equal(vks_ref_params_create(&m->cfg, false, &plain), VKS_OK);
        assert_int_equal(vks_ref_train_backward(p, &rb, acts, dlogp, plain), VKS_OK);
        double moved = 0;
        for (int i = 0; i < g->n_tensors; i++) {
            double d = 0, scale = 1e-6;
            for (int64_t k = 0; k < g->tensors[i].rows * g->tensors[i].cols; k++) {
                d = fmax(d, fabs(g->tensors[i].data[k] - plain->tensors[i].data[k]));
                scale = fmax(scale, fabs(g->tensors[i].data[k]));
            }
            moved = fmax(moved, d / scale);
        }
        fprintf(stderr, "the entropy bonus moves the reference gradient by up to %.3g of a tensor's scale\n", moved);
        assert_true(moved > 0.05);
        vks_ref_params_free(plain);
    }
    vks_ref_acts_free(acts);
    free(logits);

    int live = 0, clipped = 0, capped = 0;
    double mismatch = 0, kl = 0;
    for (int i = 0; i < gb.n; i++) {
        if (!w[i]) continue;
        live++;
        clipped += (flags[i] & VKS_GRPO_CLIPPED) != 0;
        capped += (flags[i] & VKS_GRPO_CAPPED) != 0;
        mismatch += fabs((double)logp[i] - old[i]);
        kl += kl_beta != 0.0 ? exp(ref_logp_d[i] - logp[i]) - (ref_logp_d[i] - logp[i]) - 1.0 : 0.0;
    }
    fprintf(stderr, "grpo: %d live rows, loss %.6g (ref %.6g), %d clipped, %d capped, mismatch %.4f, kl %.4f, "
            "entropy %.6f (ref %.6f)\n", st.tokens, st.loss, ref_loss, st.clipped, st.capped, st.logp_mismatch, st.kl,
            st.entropy, entropy / live);
    assert_true(fabs(st.entropy - entropy / live) <= 1e-5 * entropy / live); /* f32 logits and sums */
    assert_true(fabs(st.kl - kl / live) < 1e-9);
    assert_true(kl_beta == 0.0 ? st.kl == 0.0 : st.kl > 0.01);
    assert_int_equal(st.tokens, live);
    assert_true(live == 4 + 6 + 3 + 5);
    assert_int_equal(st.clipped, clipped);
    assert_int_equal(st.capped, capped);
    assert_true(clipped > 0 && capped > 0 && clipped < live);
    assert_true(fabs(st.clip_fraction - (double)clipped / live) < 1e-12);
    assert_true(fabs(st.logp_mismatch - mismatch / live) < 1e-9);
    assert_true(fabs(st.loss - ref_loss) <= 1e-5 * (fabs(ref_loss) + 1e-3));

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

static void test_gradients_untied(void **s) { (void)s; check_grpo_gradients(false, VKS_ROPE_ADJACENT, false, 0, 0); }
static void test_gradients_tied_recompute(void **s) { (void)s; check_grpo_gradients(true, VKS_ROPE_HALF, true, 0, 0); }
static void test_gradients_kl(void **s) { (void)s; check_grpo_gradients(false, VKS_ROPE_HALF, false, 0.2, 0); }
/* the bonus (tied + recompute, with the KL term too) at a weight where it moves the gradient
 * by a good part of its scale (printed) */
static void test_gradients_entropy(void **s) { (void)s; check_grpo_gradients(true, VKS_ROPE_ADJACENT, true, 0.1, 0.3); }

/* The float64 reference's GRPO gradient (into a new set) of the batch with weights w. */
static vks_ref_params *ref_grpo_gradient(const vks_model *m, const vks_ref_batch *rb, const double *old,
                                         const double *adv, const double *w, const vks_grpo_loss_params *h,
                                         double *loss) {
    vks_ref_params *p, *g;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&m->cfg, false, &g), VKS_OK);
    double logp[MAX_ROWS], dlogp[MAX_ROWS] = {0};
    uint32_t flags[MAX_ROWS];
    vks_ref_acts *acts;
    assert_int_equal(vks_ref_train_forward(p, rb, logp, NULL, &acts), VKS_OK);
    assert_int_equal(vks_ref_grpo_loss(logp, old, adv, NULL, w, rb->n_tokens, h, NULL, flags, loss, dlogp), VKS_OK);
    assert_int_equal(vks_ref_train_backward(p, rb, acts, dlogp, g), VKS_OK);
    vks_ref_acts_free(acts);
    vks_ref_params_free(p);
    return g;
}

/* Multi-turn (issue 38): a hand-built two-turn episode (prompt, the assistant's turn, the environment's reply,
 * the assistant's second turn) beside a one-turn completion of the same group. Only the assistant's tokens are
 * trained: the rows vks_grpo_sequence_rows makes from the episode's mask are the ones written out here, and
 * the trainer's loss and gradients equal the float64 reference's with the reply's rows dead. Training the
 * reply too moves the reference gradient by far more than the tolerance: the mask is what is tested. */
static void test_episode_mask(void **state) {
    (void)state;
    enum { P = 5, C1 = 10, C2 = 6, N = P + C1 + P + C2 };
    static const uint8_t trained[C1] = {1, 1, 1, 0, 0, 0, 0, 1, 1, 1}; /* turn, reply (4 tokens), turn */
    static const int live[] = {4, 5, 6, 11, 12, 13,                     /* rows P - 1 + k of trained tokens k */
                               P + C1 + 4, P + C1 + 5, P + C1 + 6, P + C1 + 7, P + C1 + 8, P + C1 + 9};
    vks_model *m = small_model(false, VKS_ROPE_HALF, 43);
    int32_t tokens[N];
    uint64_t x = 47;
    for (int i = 0; i < N; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        tokens[i] = (int32_t)((x >> 33) % (uint64_t)m->cfg.vocab_size);
    }
    memcpy(tokens + P + C1, tokens, sizeof(int32_t) * P); /* one prompt */
    int lens[2] = {P + C1, P + C2};
    float adv[N], w[N];
    assert_int_equal(vks_grpo_sequence_rows(P, C1, trained, 1.0, adv, w), VKS_OK);
    assert_int_equal(vks_grpo_sequence_rows(P, C2, NULL, -1.0, adv + P + C1, w + P + C1), VKS_OK);
    assert_int_equal(vks_grpo_trained_tokens(C1, trained), 6);
    assert_int_equal(vks_grpo_trained_tokens(C2, NULL), C2);
    double wd[N] = {0}, advd[N] = {0}, w_all[N] = {0}, old[N];
    for (size_t k = 0; k < sizeof live / sizeof *live; k++) wd[live[k]] = 1, advd[live[k]] = live[k] < P + C1 ? 1 : -1;
    for (int i = 0; i < N; i++) {
        assert_true(w[i] == (float)wd[i]);
        assert_true(adv[i] == (float)advd[i]);
        w_all[i] = (i >= P - 1 && i <= P + C1 - 2) || (i >= P + C1 + P - 1 && i <= N - 2); /* every completion row */
    }
    vks_trainer *t = make_trainer(m, false);
    vks_train_batch b = {.tokens = tokens, .n_tokens = N, .seq_lens = lens, .n_seqs = 2, .weight = w};
    float logp0[N], logp_old[N], logp[N];
    assert_int_equal(vks_trainer_logprobs(t, &b, logp0), VKS_OK);
    for (int i = 0; i < N; i++) { /* every completion row off by a shift, the reply's too */
        logp_old[i] = i >= P ? logp0[i] - (float)shifts[i % 5] : 0.0f;
        old[i] = logp_old[i];
        if (!w_all[i]) advd[i] = 0;
        else if (!wd[i]) advd[i] = 1; /* the reply's rows, live only in the unmasked reference */
    }
    vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 64};
    vks_grpo_stats st;
    vks_grpo_rows rows = {logp_old, adv, NULL};
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, &st, logp), VKS_OK);
    assert_int_equal(st.tokens, 12);
    vks_ref_batch rb = {.tokens = tokens, .n_tokens = N, .seq_lens = lens, .n_seqs = 2};
    double loss, loss_all;
    vks_ref_params *g = ref_grpo_gradient(m, &rb, old, advd, wd, &h, &loss);
    vks_ref_params *g_all = ref_grpo_gradient(m, &rb, old, advd, w_all, &h, &loss_all);
    fprintf(stderr, "episode: loss %.6g (ref %.6g; the reply trained too: %.6g)\n", st.loss, loss, loss_all);
    assert_true(fabs(st.loss - loss) <= 1e-5 * (fabs(loss) + 1e-3));
    double moved = 0;
    for (int i = 0; i < g->n_tensors; i++) {
        size_t n = (size_t)(g->tensors[i].rows * g->tensors[i].cols);
        float *grad = malloc(n * sizeof *grad);
        assert_non_null(grad);
        assert_int_equal(vks_trainer_read(t, VKS_SET_GRADS, i, grad), VKS_OK);
        double err = tensor_error(grad, g->tensors[i].data, n);
        if (err > 1e-4) fprintf(stderr, "gradient of %s: relative error %.3g\n", g->tensors[i].name, err);
        assert_true(err <= 1e-4);
        double *all = g_all->tensors[i].data, d = 0, scale = 1e-6;
        for (size_t k = 0; k < n; k++) d = fmax(d, fabs(all[k] - g->tensors[i].data[k])), scale = fmax(scale, fabs(all[k]));
        moved = fmax(moved, d / scale);
        free(grad);
    }
    fprintf(stderr, "training the reply too would move the gradient by up to %.3g of a tensor's scale\n", moved);
    assert_true(moved > 0.05);
    vks_ref_params_free(g), vks_ref_params_free(g_all);
    vks_trainer_destroy(t);
    vks_model_free(m);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* Sum of the live rows' logp of sequence q. */
static double completion_logp(const group_batch *g, const float *logp, int q) {
    int start = 0;
    for (int i = 0; i < q; i++) start += g->lens[i];
    double sum = 0;
    for (int r = start; r < start + g->lens[q]; r++)
        if (g->weight[r]) sum += logp[r];
    return sum;
}

/* From logp_old == logp, one AdamW step on two completions with rewards
 * {1, 0} (advantages +-1): the first completion becomes more likely, the
 * second less; nothing is clipped and the mismatch is exactly 0. */
static void test_step_follows_advantage(void **state) {
    (void)state;
    vks_model *m = small_model(false, VKS_ROPE_HALF, 37);
    static const int lens[] = {7, 7};
    static const double rewards[] = {1.0, 0.0};
    group_batch gb;
    make_group(&gb, lens, rewards, 2, m->cfg.vocab_size, 41);
    vks_trainer *t = make_trainer(m, false);
    vks_train_batch b = train_batch(&gb);
    float before[MAX_ROWS], after[MAX_ROWS];
    assert_int_equal(vks_trainer_logprobs(t, &b, before), VKS_OK);
    vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 14};
    vks_grpo_stats st;
    vks_grpo_rows rows = {before, gb.adv, NULL};
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, &st, NULL), VKS_OK);
    assert_int_equal(st.tokens, 14);
    assert_int_equal(st.clipped, 0);
    assert_true(st.logp_mismatch == 0.0 && st.max_mismatch == 0.0);
    /* at rho = 1 the loss is -sum A / budget = 0 for two opposite advantages */
    assert_true(fabs(st.loss) < 1e-6);
    vks_adamw_params adamw = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0};
    assert_int_equal(vks_trainer_step(t, &adamw, 0, NULL), VKS_OK);
    assert_int_equal(vks_trainer_logprobs(t, &b, after), VKS_OK);
    double up = completion_logp(&gb, after, 0) - completion_logp(&gb, before, 0);
    double down = completion_logp(&gb, after, 1) - completion_logp(&gb, before, 1);
    fprintf(stderr, "one step: A>0 completion logp %+.4f, A<0 completion %+.4f\n", up, down);
    assert_true(up > 0 && down < 0);
    vks_trainer_destroy(t);
    vks_model_free(m);
}

/* The same batch twice on fresh trainers: bit-identical gradients and stats. */
static void test_deterministic(void **state) {
    (void)state;
    vks_model *m = small_model(true, VKS_ROPE_ADJACENT, 43);
    group_batch gb;
    make_group(&gb, lens4, rewards4, 4, m->cfg.vocab_size, 47);
    vks_train_batch b = train_batch(&gb);
    float *grads[2] = {NULL, NULL}, logp_old[MAX_ROWS];
    vks_grpo_stats st[2];
    size_t total = 0;
    for (int run = 0; run < 2; run++) {
        vks_trainer *t = make_trainer(m, run == 1); /* recompute changes nothing either */
        float lp[MAX_ROWS];
        assert_int_equal(vks_trainer_logprobs(t, &b, lp), VKS_OK);
        if (run == 0)
            for (int i = 0, k = 0; i < gb.n; i++) logp_old[i] = lp[i] - (float)shifts[k++ % 5];
        vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 32};
        vks_grpo_rows rows = {logp_old, gb.adv, NULL};
        assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, &st[run], NULL), VKS_OK);
        total = 0;
        for (int i = 0; i < vks_trainer_n_tensors(t); i++) {
            vks_train_tensor_info info;
            assert_int_equal(vks_trainer_tensor_info(t, i, &info), VKS_OK);
            total += (size_t)(info.rows * info.cols);
        }
        grads[run] = malloc(total * sizeof(float));
        for (int i = 0, off = 0; i < vks_trainer_n_tensors(t); i++) {
            vks_train_tensor_info info;
            assert_int_equal(vks_trainer_tensor_info(t, i, &info), VKS_OK);
            assert_int_equal(vks_trainer_read(t, VKS_SET_GRADS, i, grads[run] + off), VKS_OK);
            off += (int)(info.rows * info.cols);
        }
        vks_trainer_destroy(t);
    }
    assert_false(tu_has_nonfinite(grads[0], total));
    assert_memory_equal(grads[0], grads[1], total * sizeof(float));
    /* a fingerprint of the gradients and the loss, to compare builds (e.g. before and after a change
     * that must leave this path bit-identical) on one device */
    uint64_t fnv = 14695981039346656037ull;
    const unsigned char *bytes = (const unsigned char *)grads[0];
    for (size_t i = 0; i < total * sizeof(float); i++) fnv = (fnv ^ bytes[i]) * 1099511628211ull;
    bytes = (const unsigned char *)&st[0].loss;
    for (size_t i = 0; i < sizeof st[0].loss; i++) fnv = (fnv ^ bytes[i]) * 1099511628211ull;
    fprintf(stderr, "grpo gradients and loss: fingerprint %016llx (loss %.9g)\n", (unsigned long long)fnv, st[0].loss);
    assert_true(st[0].tokens == st[1].tokens && st[0].clipped == st[1].clipped && st[0].capped == st[1].capped);
    assert_memory_equal(&st[0].loss, &st[1].loss, sizeof st[0].loss);
    assert_memory_equal(&st[0].logp_mismatch, &st[1].logp_mismatch, sizeof st[0].logp_mismatch);
    free(grads[0]);
    free(grads[1]);
    vks_model_free(m);
}

/* NaN or positive logp_old and NaN advantages on a live row are refused;
 * on a masked row they are never read. */
static void test_bad_rows(void **state) {
    (void)state;
    vks_model *m = small_model(false, VKS_ROPE_ADJACENT, 53);
    group_batch gb;
    make_group(&gb, lens4, rewards4, 4, m->cfg.vocab_size, 59);
    vks_trainer *t = make_trainer(m, false);
    vks_train_batch b = train_batch(&gb);
    float old[MAX_ROWS], adv[MAX_ROWS], ref[MAX_ROWS];
    vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 32};
    for (int i = 0; i < gb.n; i++) old[i] = ref[i] = gb.weight[i] ? -1.0f : NAN;
    memcpy(adv, gb.adv, sizeof adv);
    adv[0] = NAN; /* row 0 is a prompt row */
    vks_grpo_rows rows = {old, adv, NULL};
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_OK);
    adv[PROMPT] = NAN; /* a completion row */
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    adv[PROMPT] = 1;
    old[PROMPT] = 0.5f;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    old[PROMPT] = -1;
    h.kl_beta = 0.1; /* KL on: ref_logp needed, and checked */
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    rows.ref_logp = ref;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_OK);
    ref[PROMPT + 1] = NAN;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    ref[PROMPT + 1] = -1.0f;
    h.entropy_coef = -0.1; /* a bonus, not a penalty; and a number */
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    h.entropy_coef = NAN;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    h.entropy_coef = 0.1;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_OK);
    h.token_budget = 0;
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, &h, NULL, NULL), VKS_ERR_ARG);
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, &rows, NULL, NULL, NULL), VKS_ERR_ARG);
    assert_int_equal(vks_trainer_accumulate_grpo(t, &b, NULL, &h, NULL, NULL), VKS_ERR_ARG);
    vks_trainer_destroy(t);
    vks_model_free(m);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_advantages),
        cmocka_unit_test(test_sequence_rows),
        cmocka_unit_test(test_far_sequences),
        cmocka_unit_test(test_gradients_untied),
        cmocka_unit_test(test_gradients_tied_recompute),
        cmocka_unit_test(test_gradients_kl),
        cmocka_unit_test(test_gradients_entropy),
        cmocka_unit_test(test_episode_mask),
        cmocka_unit_test(test_step_follows_advantage),
        cmocka_unit_test(test_deterministic),
        cmocka_unit_test(test_bad_rows),
    };
    return cmocka_run_group_tests_name("grpo", tests, setup, teardown);
}
