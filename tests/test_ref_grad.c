/* test_ref_grad.c: the float64 training reference (vks_ref_grad.h) against
 * central finite differences of its own forward, against the inference
 * reference ops (vks_ref.h), and AdamW/schedule and the RL loss of each type
 * against hand-computed values.
 *
 * The whole-model reference (vks_ref_train.h) is checked the same way, every
 * entry of every named tensor against differences of the loss, on tiny random
 * models (tied and untied classifier, both RoPE modes, q/k/v biases, GQA
 * ratios 1, 2 and 4, packed sequences), and its logits against
 * vks_ref_forward's.
 *
 * Gradient checks use the scalar loss L = sum(c * out) with random c in
 * [-1, 1), so dL/dout = c. Each input entry x_i is moved by +-h (h = 1e-5) and
 * fd_i = (L(x_i + h) - L(x_i - h)) / 2h. In double the truncation error is
 * h^2 |L'''| / 6 ~ 1e-11 and the rounding error ~ 1e-16 |L| / h ~ 1e-10 for
 * these sizes, so fd_i matches the analytic gradient to ~1e-9 of the largest
 * gradient entry (measured: ops at most 1.1e-9 of it, RMSNorm with D = 1
 * aside; whole models at most 8.5e-8, in tensors whose gradients are <= 1e-4).
 * Tolerance: |fd_i - g_i| <= 1e-6 * max(|g_i|, max_j |g_j|) + 1e-9: a 1000x
 * margin for the ops, 12x before the absolute term for the whole model's
 * smallest gradients. The absolute 1e-9 is 10x the rounding floor and matters
 * only where a whole tensor's gradient is tiny (RMSNorm with D = 1: out ~
 * w sign(x), gradients ~1e-5, rounding alone is 1e-7 of them). A wrong term
 * (a missing factor, a wrong sign, a dropped head) is an error of the order of
 * the gradient itself (see test_checker_detects_a_wrong_gradient). Backwards
 * are called on gradients prefilled with random values and the prefill is
 * subtracted afterwards, so a backward that overwrites instead of
 * accumulating fails. */
#include "test_util.h"

#include "vkswarm/vks_common.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_ref_grad.h"
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_ref_train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FD_STEP 1e-5
#define GRAD_RTOL 1e-6
#define GRAD_ATOL 1e-9

/* ---- helpers ---- */

typedef struct { uint64_t s; } rng64;

static double rng_uniform(rng64 *r, double lo, double hi) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return lo + (hi - lo) * (double)(z >> 11) / 9007199254740992.0;
}

static double *random_doubles(rng64 *r, size_t n, double lo, double hi) {
    double *x = malloc((n ? n : 1) * sizeof *x);
    assert_non_null(x);
    for (size_t i = 0; i < n; i++) x[i] = rng_uniform(r, lo, hi);
    return x;
}

static double *zeros(size_t n) {
    double *x = calloc(n ? n : 1, sizeof *x);
    assert_non_null(x);
    return x;
}

static double weighted_sum(const double *c, const double *out, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += c[i] * out[i];
    return s;
}

/* A loss as a function of the inputs the test context points at. */
typedef double (*loss_fn)(void *ctx);

/* Returns the largest (|fd - g| - GRAD_ATOL) / max(|g_i|, max|g|) over x[0..n);
 * the caller fails when it exceeds GRAD_RTOL. Infinite when every gradient
 * entry is zero (nothing tested). */
static double grad_error(const double *x_in, size_t n, const double *grad, loss_fn loss, void *ctx) {
    double *x = (double *)x_in; /* moved and restored entry by entry */
    double gmax = 0.0, worst = 0.0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(grad[i]));
    for (size_t i = 0; i < n; i++) {
        double saved = x[i];
        x[i] = saved + FD_STEP;
        double lp = loss(ctx);
        x[i] = saved - FD_STEP;
        double lm = loss(ctx);
        x[i] = saved;
        double fd = (lp - lm) / (2.0 * FD_STEP);
        double err = (fabs(fd - grad[i]) - GRAD_ATOL) / fmax(fabs(grad[i]), gmax);
        if (!(err <= worst)) worst = err; /* NaN sticks */
    }
    if (!(gmax > 0.0)) return INFINITY;
    return worst;
}

static void check_grad(const char *what, const double *x, size_t n, const double *grad, loss_fn loss, void *ctx) {
    double err = grad_error(x, n, grad, loss, ctx);
    if (!(err <= GRAD_RTOL)) fail_msg("%s: gradient vs finite differences: relative error %.3g > %g", what, err,
                                      GRAD_RTOL);
}

/* Where the true gradient is zero everywhere (a query that sees one key does
 * not depend on q or k): the backward adds exact zeros and no entry moves L. */
static void check_grad_zero(const char *what, const double *x_in, size_t n, const double *grad, loss_fn loss,
                            void *ctx) {
    double *x = (double *)x_in;
    for (size_t i = 0; i < n; i++) {
        if (grad[i] != 0.0) fail_msg("%s: gradient entry %zu is %g, want 0", what, i, grad[i]);
        double saved = x[i];
        x[i] = saved + FD_STEP;
        double lp = loss(ctx);
        x[i] = saved - FD_STEP;
        double lm = loss(ctx);
        x[i] = saved;
        if (!(fabs(lp - lm) / (2.0 * FD_STEP) <= 1e-9)) fail_msg("%s: entry %zu moves the loss", what, i);
    }
}

/* A gradient buffer prefilled with random values (to catch overwriting). */
typedef struct { double *g, *base; size_t n; } grad_buf;

static grad_buf grad_buf_new(rng64 *r, size_t n) {
    grad_buf b = {random_doubles(r, n, -1, 1), NULL, n};
    b.base = malloc((n ? n : 1) * sizeof *b.base);
    assert_non_null(b.base);
    memcpy(b.base, b.g, n * sizeof *b.g);
    return b;
}

/* Subtracts the prefill: b.g is now what the backward added. */
static void grad_buf_settle(grad_buf *b) {
    for (size_t i = 0; i < b->n; i++) b->g[i] -= b->base[i];
}

static void grad_buf_free(grad_buf *b) {
    free(b->g);
    free(b->base);
}

/* ---- the checker itself ---- */

typedef struct { double *x, *c; size_t n; } square_ctx;

static double square_loss(void *p) { /* L = sum c x^2 */
    square_ctx *s = p;
    double l = 0.0;
    for (size_t i = 0; i < s->n; i++) l += s->c[i] * s->x[i] * s->x[i];
    return l;
}

static void test_checker_detects_a_wrong_gradient(void **state) {
    (void)state;
    rng64 r = {1};
    square_ctx s = {random_doubles(&r, 9, -1, 1), random_doubles(&r, 9, -1, 1), 9};
    double g[9];
    for (int i = 0; i < 9; i++) g[i] = 2.0 * s.c[i] * s.x[i];
    double err = grad_error(s.x, 9, g, square_loss, &s);
    assert_true(err <= 1e-8); /* the true gradient: far inside the tolerance */
    double gmax = 0.0;
    for (int i = 0; i < 9; i++) gmax = fmax(gmax, fabs(g[i]));
    g[4] += 1e-5 * gmax; /* a small error in one entry */
    assert_true(grad_error(s.x, 9, g, square_loss, &s) > GRAD_RTOL);
    for (int i = 0; i < 9; i++) g[i] = 0.0; /* nothing to compare */
    assert_true(grad_error(s.x, 9, g, square_loss, &s) > GRAD_RTOL);
    free(s.x);
    free(s.c);
}

/* ---- embedding ---- */

typedef struct {
    double *table, *c, *out;
    const uint32_t *tok;
    int V, D, R;
} embed_ctx;

static double embed_loss(void *p) {
    embed_ctx *e = p;
    assert_int_equal(vks_ref_embed_forward(e->table, e->V, e->D, e->tok, e->R, e->out), VKS_OK);
    return weighted_sum(e->c, e->out, (size_t)e->R * e->D);
}

static void test_embed_grad(void **state) {
    (void)state;
    const uint32_t tok[5] = {3, 0, 3, 6, 3}; /* repeated rows add up */
    const int dims[] = {1, 7, 67};
    for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++) {
        rng64 r = {10 + i};
        int V = 7, D = dims[i], R = 5;
        embed_ctx e = {random_doubles(&r, (size_t)V * D, -1, 1), random_doubles(&r, (size_t)R * D, -1, 1),
                       zeros((size_t)R * D), tok, V, D, R};
        grad_buf g = grad_buf_new(&r, (size_t)V * D);
        assert_int_equal(vks_ref_embed_backward(g.g, V, D, tok, R, e.c), VKS_OK);
        grad_buf_settle(&g);
        check_grad("embedding", e.table, (size_t)V * D, g.g, embed_loss, &e);
        for (int d = 0; d < D; d++) assert_true(g.g[1 * D + d] == 0.0); /* token 1 unused */
        grad_buf_free(&g);
        free(e.table), free(e.c), free(e.out);
    }
    double t[2] = {0}, d[2] = {0};
    const uint32_t bad[1] = {2};
    assert_int_equal(vks_ref_embed_backward(t, 2, 1, bad, 1, d), VKS_ERR_ARG);
    assert_int_equal(vks_ref_embed_forward(t, 2, 1, bad, 1, d), VKS_ERR_ARG);
}

/* ---- RMSNorm ---- */

typedef struct {
    double *x, *w, *c, *out, eps;
    int R, D;
} norm_ctx;

static double norm_loss(void *p) {
    norm_ctx *n = p;
    assert_int_equal(vks_ref_rmsnorm_forward(n->x, n->w, n->R, n->D, n->eps, n->out), VKS_OK);
    return weighted_sum(n->c, n->out, (size_t)n->R * n->D);
}

static void test_rmsnorm_grad(void **state) {
    (void)state;
    const int rows[] = {1, 5}, dims[] = {1, 7, 67};
    const double eps[] = {1e-5, 0.3};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t e = 0; e < 2; e++) {
                rng64 r = {100 + 10 * a + 3 * b + e};
                int R = rows[a], D = dims[b];
                size_t n = (size_t)R * D;
                norm_ctx c = {random_doubles(&r, n, -2, 2), random_doubles(&r, (size_t)D, 0.5, 1.5),
                              random_doubles(&r, n, -1, 1), zeros(n), eps[e], R, D};
                grad_buf dx = grad_buf_new(&r, n), dw = grad_buf_new(&r, (size_t)D);
                assert_int_equal(vks_ref_rmsnorm_backward(c.x, c.w, R, D, c.eps, c.c, dx.g, dw.g), VKS_OK);
                grad_buf_settle(&dx);
                grad_buf_settle(&dw);
                check_grad("rmsnorm dx", c.x, n, dx.g, norm_loss, &c);
                check_grad("rmsnorm dw", c.w, (size_t)D, dw.g, norm_loss, &c);
                grad_buf_free(&dx), grad_buf_free(&dw);
                free(c.x), free(c.w), free(c.c), free(c.out);
            }
}

/* The double forward is the inference reference's formula. */
static void test_rmsnorm_forward_matches_ref(void **state) {
    (void)state;
    float xf[2 * 7], wf[7], of[2 * 7];
    double x[2 * 7], w[7], o[2 * 7];
    tu_fill_uniform(xf, 14, 1, -2, 2);
    tu_fill_uniform(wf, 7, 2, 0.5f, 1.5f);
    for (int i = 0; i < 14; i++) x[i] = xf[i];
    for (int i = 0; i < 7; i++) w[i] = wf[i];
    vks_ref_rmsnorm(xf, wf, 2, 7, 1e-5f, of);
    assert_int_equal(vks_ref_rmsnorm_forward(x, w, 2, 7, 1e-5f, o), VKS_OK);
    for (int i = 0; i < 14; i++) assert_true(fabs(o[i] - of[i]) <= 1e-6 * fabs(o[i]) + 1e-7);
}

/* ---- matmul and bias ---- */

typedef struct {
    double *x, *W, *b, *c, *y;
    int M, N, K;
} mm_ctx;

static double mm_loss(void *p) {
    mm_ctx *m = p;
    assert_int_equal(vks_ref_matmul_forward(m->x, m->W, m->M, m->N, m->K, m->y), VKS_OK);
    assert_int_equal(vks_ref_bias_forward(m->y, m->b, m->M, m->N), VKS_OK);
    return weighted_sum(m->c, m->y, (size_t)m->M * m->N);
}

static void test_matmul_bias_grad(void **state) {
    (void)state;
    const int shapes[][3] = {{1, 1, 1}, {5, 7, 67}, {3, 67, 7}, {1, 5, 2}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        rng64 r = {200 + s};
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
        size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
        mm_ctx m = {random_doubles(&r, nx, -1, 1), random_doubles(&r, nw, -1, 1), random_doubles(&r, (size_t)N, -1, 1),
                    random_doubles(&r, ny, -1, 1), zeros(ny), M, N, K};
        grad_buf dx = grad_buf_new(&r, nx), dW = grad_buf_new(&r, nw), db = grad_buf_new(&r, (size_t)N);
        assert_int_equal(vks_ref_matmul_backward(m.x, m.W, M, N, K, m.c, dx.g, dW.g), VKS_OK);
        assert_int_equal(vks_ref_bias_backward(m.c, M, N, db.g), VKS_OK);
        grad_buf_settle(&dx), grad_buf_settle(&dW), grad_buf_settle(&db);
        check_grad("matmul dx", m.x, nx, dx.g, mm_loss, &m);
        check_grad("matmul dW", m.W, nw, dW.g, mm_loss, &m);
        check_grad("bias db", m.b, (size_t)N, db.g, mm_loss, &m);
        /* NULL gradients are skipped */
        assert_int_equal(vks_ref_matmul_backward(m.x, m.W, M, N, K, m.c, NULL, NULL), VKS_OK);
        grad_buf_free(&dx), grad_buf_free(&dW), grad_buf_free(&db);
        free(m.x), free(m.W), free(m.b), free(m.c), free(m.y);
    }
}

/* ---- LoRA linear ---- */

typedef struct {
    double *x, *W, *A, *B, *c, *y, s;
    int M, N, K, r;
} lora_ctx;

static double lora_loss(void *p) { /* L = sum c . (x W^T + s (x A^T) B^T) */
    lora_ctx *l = p;
    assert_int_equal(vks_ref_lora_forward(l->x, l->W, l->A, l->B, l->M, l->N, l->K, l->r, l->s, l->y, NULL), VKS_OK);
    return weighted_sum(l->c, l->y, (size_t)l->M * l->N);
}

/* dx, dA, dB against central differences; the forward against the product
 * written out (W + s B A) x; W gets no gradient (it is frozen). */
static void test_lora_grad(void **state) {
    (void)state;
    const int shapes[][4] = {{1, 1, 1, 1}, {5, 7, 67, 3}, {3, 67, 7, 8}, {4, 9, 12, 12}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        rng64 r = {300 + s};
        int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2], R = shapes[s][3];
        size_t nx = (size_t)M * K, nw = (size_t)N * K, na = (size_t)R * K, nb = (size_t)N * R, ny = (size_t)M * N;
        lora_ctx l = {random_doubles(&r, nx, -1, 1), random_doubles(&r, nw, -1, 1), random_doubles(&r, na, -1, 1),
                      random_doubles(&r, nb, -1, 1), random_doubles(&r, ny, -1, 1), zeros(ny), 1.7, M, N, K, R};
        grad_buf dx = grad_buf_new(&r, nx), dA = grad_buf_new(&r, na), dB = grad_buf_new(&r, nb);
        assert_int_equal(vks_ref_lora_backward(l.x, l.W, l.A, l.B, M, N, K, R, l.s, l.c, dx.g, dA.g, dB.g), VKS_OK);
        grad_buf_settle(&dx), grad_buf_settle(&dA), grad_buf_settle(&dB);
        check_grad("lora dx", l.x, nx, dx.g, lora_loss, &l);
        check_grad("lora dA", l.A, na, dA.g, lora_loss, &l);
        check_grad("lora dB", l.B, nb, dB.g, lora_loss, &l);
        /* y = x (W + s B A)^T, summed the other way round */
        double *h = zeros((size_t)M * R);
        assert_int_equal(vks_ref_lora_forward(l.x, l.W, l.A, l.B, M, N, K, R, l.s, l.y, h), VKS_OK);
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double want = 0.0;
                for (int k = 0; k < K; k++) {
                    double w = l.W[(size_t)n * K + k];
                    for (int j = 0; j < R; j++) w += l.s * l.B[(size_t)n * R + j] * l.A[(size_t)j * K + k];
                    want += w * l.x[(size_t)m * K + k];
                }
                assert_true(fabs(l.y[(size_t)m * N + n] - want) <= 1e-12 * (1.0 + fabs(want)));
            }
        /* NULL gradients are skipped; bad sizes refused */
        assert_int_equal(vks_ref_lora_backward(l.x, l.W, l.A, l.B, M, N, K, R, l.s, l.c, NULL, NULL, NULL), VKS_OK);
        assert_int_equal(vks_ref_lora_forward(l.x, l.W, l.A, l.B, M, N, K, 0, l.s, l.y, NULL), VKS_ERR_ARG);
        grad_buf_free(&dx), grad_buf_free(&dA), grad_buf_free(&dB);
        free(l.x), free(l.W), free(l.A), free(l.B), free(l.c), free(l.y), free(h);
    }
}

/* ---- RoPE ---- */

typedef struct {
    double *x, *work, *c;
    const uint32_t *pos;
    int R, stride, col0, n_heads, head_dim, mode;
} rope_ctx;

static double rope_loss(void *p) {
    rope_ctx *c = p;
    size_t n = (size_t)c->R * c->stride;
    memcpy(c->work, c->x, n * sizeof *c->x);
    assert_int_equal(vks_ref_rope_forward(c->work, c->pos, c->R, c->stride, c->col0, c->n_heads, c->head_dim,
                                          tu_rope_freqs(10000.0, c->head_dim), c->mode), VKS_OK);
    return weighted_sum(c->c, c->work, n);
}

static void test_rope_grad(void **state) {
    (void)state;
    const uint32_t pos[5] = {0, 1, 7, 2, 63};
    const int head_dims[] = {2, 8, 6};
    for (int mode = VKS_ROPE_ADJACENT; mode <= VKS_ROPE_HALF; mode++)
        for (size_t i = 0; i < sizeof head_dims / sizeof head_dims[0]; i++) {
            rng64 r = {300 + 10 * mode + i};
            int R = 5, hd = head_dims[i], heads = 3, col0 = 1, stride = col0 + heads * hd + 2;
            size_t n = (size_t)R * stride;
            rope_ctx c = {random_doubles(&r, n, -1, 1), zeros(n), random_doubles(&r, n, -1, 1),
                          pos, R, stride, col0, heads, hd, mode};
            double *dx = malloc(n * sizeof *dx);
            memcpy(dx, c.c, n * sizeof *dx); /* d(out), turned into d(in) in place */
            assert_int_equal(vks_ref_rope_backward(dx, pos, R, stride, col0, heads, hd, tu_rope_freqs(10000.0, hd), mode), VKS_OK);
            check_grad(mode == VKS_ROPE_HALF ? "rope half" : "rope adjacent", c.x, n, dx, rope_loss, &c);
            free(dx), free(c.x), free(c.work), free(c.c);
        }
}

/* Same rotation as vks_ref_rope, and backward undoes forward. */
static void test_rope_matches_ref_and_inverts(void **state) {
    (void)state;
    const uint32_t pos[3] = {5, 0, 40};
    for (int mode = VKS_ROPE_ADJACENT; mode <= VKS_ROPE_HALF; mode++) {
        float xf[3 * 16];
        double x[3 * 16], orig[3 * 16];
        tu_fill_uniform(xf, 48, 7 + mode, -1, 1);
        for (int i = 0; i < 48; i++) orig[i] = x[i] = xf[i];
        vks_ref_rope(xf, pos, 3, 16, 0, 2, 8, tu_rope_freqs(10000.0, 8), mode);
        assert_int_equal(vks_ref_rope_forward(x, pos, 3, 16, 0, 2, 8, tu_rope_freqs(10000.0, 8), mode), VKS_OK);
        for (int i = 0; i < 48; i++) assert_true(fabs(x[i] - xf[i]) <= 1e-6);
        assert_int_equal(vks_ref_rope_backward(x, pos, 3, 16, 0, 2, 8, tu_rope_freqs(10000.0, 8), mode), VKS_OK);
        for (int i = 0; i < 48; i++) assert_true(fabs(x[i] - orig[i]) <= 1e-14);
    }
    double x[4] = {0};
    assert_int_equal(vks_ref_rope_forward(x, pos, 1, 4, 0, 1, 4, tu_rope_freqs(10000.0, 4), 2), VKS_ERR_ARG); /* bad mode */
    assert_int_equal(vks_ref_rope_forward(x, pos, 1, 4, 1, 1, 4, tu_rope_freqs(10000.0, 4), 0), VKS_ERR_ARG); /* overruns row */
}

/* ---- attention ---- */

typedef struct {
    double *q, *k, *v, *c, *out;
    const uint32_t *start;
    int T, H, KVH, hd;
} attn_ctx;

static double attn_loss(void *p) {
    attn_ctx *a = p;
    assert_int_equal(vks_ref_attention_forward(a->q, a->k, a->v, a->start, a->T, a->H, a->KVH, a->hd, a->out, NULL,
                                               NULL), VKS_OK);
    return weighted_sum(a->c, a->out, (size_t)a->T * a->H * a->hd);
}

/* start[] of packed sequences of the given lengths. */
static void fill_starts(const int *lens, int n_seqs, uint32_t *start) {
    for (int s = 0, t0 = 0; s < n_seqs; t0 += lens[s], s++)
        for (int i = 0; i < lens[s]; i++) start[t0 + i] = (uint32_t)t0;
}

typedef struct { int n_seqs, lens[3]; } packing;

static void attention_case(int T, const packing *pk, int H, int KVH, int hd, uint64_t seed) {
    rng64 r = {seed};
    uint32_t start[16];
    fill_starts(pk->lens, pk->n_seqs, start);
    size_t nq = (size_t)T * H * hd, nkv = (size_t)T * KVH * hd, nstat = (size_t)T * H;
    attn_ctx a = {random_doubles(&r, nq, -1.5, 1.5), random_doubles(&r, nkv, -1.5, 1.5),
                  random_doubles(&r, nkv, -1, 1), random_doubles(&r, nq, -1, 1), zeros(nq),
                  start, T, H, KVH, hd};
    double *mx = zeros(nstat), *sm = zeros(nstat);
    assert_int_equal(vks_ref_attention_forward(a.q, a.k, a.v, start, T, H, KVH, hd, a.out, mx, sm), VKS_OK);
    grad_buf dq = grad_buf_new(&r, nq), dk = grad_buf_new(&r, nkv), dv = grad_buf_new(&r, nkv);
    assert_int_equal(vks_ref_attention_backward(a.q, a.k, a.v, start, T, H, KVH, hd, mx, sm, a.c, dq.g, dk.g, dv.g),
                     VKS_OK);
    grad_buf_settle(&dq), grad_buf_settle(&dk), grad_buf_settle(&dv);
    char what[96];
    snprintf(what, sizeof what, "attention T=%d seqs=%d H=%d KVH=%d hd=%d", T, pk->n_seqs, H, KVH, hd);
    bool one_key_each = true; /* every sequence of length 1: out = v */
    for (int i = 0; i < pk->n_seqs; i++) one_key_each = one_key_each && pk->lens[i] == 1;
    if (one_key_each) {
        check_grad_zero(what, a.q, nq, dq.g, attn_loss, &a);
        check_grad_zero(what, a.k, nkv, dk.g, attn_loss, &a);
    } else {
        check_grad(what, a.q, nq, dq.g, attn_loss, &a);
        check_grad(what, a.k, nkv, dk.g, attn_loss, &a);
    }
    check_grad(what, a.v, nkv, dv.g, attn_loss, &a);
    for (int t = 0; t < T; t++) /* a sequence's first row sees one key: probability 1 */
        if (start[t] == (uint32_t)t)
            for (int h = 0; h < H; h++) assert_true(fabs(sm[t * H + h] - 1.0) < 1e-15);
    grad_buf_free(&dq), grad_buf_free(&dk), grad_buf_free(&dv);
    free(a.q), free(a.k), free(a.v), free(a.c), free(a.out), free(mx), free(sm);
}

static void test_attention_grad(void **state) {
    (void)state;
    const packing one1 = {1, {1}}, one5 = {1, {5}}, two5 = {2, {3, 2}}, three9 = {3, {4, 1, 4}};
    const struct { int T; const packing *pk; } cases[] = {{1, &one1}, {5, &one5}, {5, &two5}, {9, &three9}};
    const int ratios[] = {1, 2, 4}, head_dims[] = {1, 4, 6};
    uint64_t seed = 400;
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
        for (size_t g = 0; g < 3; g++)
            for (size_t d = 0; d < 3; d++) {
                int KVH = g == 1 ? 2 : 1; /* 1x1, 2x2 (ratio 2, two KV heads), 4x1 */
                attention_case(cases[c].T, cases[c].pk, KVH * ratios[g], KVH, head_dims[d], seed++);
            }
}

/* Each packed sequence gives what vks_ref_attention gives for it alone. */
static void test_attention_forward_matches_ref(void **state) {
    (void)state;
    enum { T = 9, H = 4, KVH = 2, HD = 6 };
    const int lens[3] = {4, 1, 4};
    uint32_t start[T];
    fill_starts(lens, 3, start);
    float qf[T * H * HD], kf[T * KVH * HD], vf[T * KVH * HD], of[T * H * HD];
    double q[T * H * HD], k[T * KVH * HD], v[T * KVH * HD], o[T * H * HD], mx[T * H], sm[T * H];
    tu_fill_uniform(qf, sizeof qf / 4, 1, -1, 1);
    tu_fill_uniform(kf, sizeof kf / 4, 2, -1, 1);
    tu_fill_uniform(vf, sizeof vf / 4, 3, -1, 1);
    for (size_t i = 0; i < sizeof qf / 4; i++) q[i] = qf[i];
    for (size_t i = 0; i < sizeof kf / 4; i++) k[i] = kf[i], v[i] = vf[i];
    assert_int_equal(vks_ref_attention_forward(q, k, v, start, T, H, KVH, HD, o, mx, sm), VKS_OK);
    for (int s = 0, t0 = 0; s < 3; t0 += lens[s], s++) {
        uint32_t slot[T] = {0}, pos[T];
        for (int i = 0; i < lens[s]; i++) pos[i] = (uint32_t)i;
        vks_ref_attention(qf + t0 * H * HD, kf + t0 * KVH * HD, vf + t0 * KVH * HD, slot, pos, lens[s], H, KVH, HD,
                          lens[s], of + t0 * H * HD);
    }
    for (int i = 0; i < T * H * HD; i++) assert_true(fabs(o[i] - of[i]) <= 1e-6);
    uint32_t bad[T];
    memcpy(bad, start, sizeof bad);
    bad[2] = 3; /* a row whose sequence starts after it */
    assert_int_equal(vks_ref_attention_forward(q, k, v, bad, T, H, KVH, HD, o, mx, sm), VKS_ERR_ARG);
    assert_int_equal(vks_ref_attention_forward(q, k, v, start, T, 3, 2, HD, o, mx, sm), VKS_ERR_ARG); /* 3 % 2 */
}

/* ---- SwiGLU ---- */

typedef struct { double *g, *u, *c, *out; size_t n; } swiglu_ctx;

static double swiglu_loss(void *p) {
    swiglu_ctx *s = p;
    assert_int_equal(vks_ref_swiglu_forward(s->g, s->u, s->n, s->out), VKS_OK);
    return weighted_sum(s->c, s->out, s->n);
}

static void test_swiglu_grad(void **state) {
    (void)state;
    const size_t sizes[] = {1, 7, 67};
    for (size_t i = 0; i < 3; i++) {
        rng64 r = {500 + i};
        size_t n = sizes[i];
        swiglu_ctx s = {random_doubles(&r, n, -5, 5), random_doubles(&r, n, -2, 2), random_doubles(&r, n, -1, 1),
                        zeros(n), n};
        grad_buf dg = grad_buf_new(&r, n), du = grad_buf_new(&r, n);
        assert_int_equal(vks_ref_swiglu_backward(s.g, s.u, n, s.c, dg.g, du.g), VKS_OK);
        grad_buf_settle(&dg), grad_buf_settle(&du);
        check_grad("swiglu dg", s.g, n, dg.g, swiglu_loss, &s);
        check_grad("swiglu du", s.u, n, du.g, swiglu_loss, &s);
        grad_buf_free(&dg), grad_buf_free(&du);
        free(s.g), free(s.u), free(s.c), free(s.out);
    }
}

/* ---- token log-probability ---- */

typedef struct {
    double *logits, *c, *logp;
    const uint32_t *target;
    int R, V;
} logprob_ctx;

static double logprob_loss(void *p) {
    logprob_ctx *l = p;
    assert_int_equal(vks_ref_token_logprob_forward(l->logits, l->R, l->V, l->target, l->logp), VKS_OK);
    return weighted_sum(l->c, l->logp, (size_t)l->R);
}

static void test_token_logprob_grad(void **state) {
    (void)state;
    const uint32_t target[5] = {1, 0, 1, 1, 0};
    const int rows[] = {1, 5}, vocabs[] = {2, 7, 67};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 3; b++) {
            rng64 r = {600 + 3 * a + b};
            int R = rows[a], V = vocabs[b];
            size_t n = (size_t)R * V;
            logprob_ctx l = {random_doubles(&r, n, -4, 4), random_doubles(&r, (size_t)R, -1, 1),
                             zeros((size_t)R), target, R, V};
            grad_buf d = grad_buf_new(&r, n);
            assert_int_equal(vks_ref_token_logprob_backward(l.logits, R, V, target, l.c, d.g), VKS_OK);
            grad_buf_settle(&d);
            check_grad("token logprob", l.logits, n, d.g, logprob_loss, &l);
            grad_buf_free(&d);
            free(l.logits), free(l.c), free(l.logp);
        }
}

/* Cross-entropy by hand: -logp = log(e^1 + e^2 + e^3) - 2 for target 1. */
static void test_token_logprob_known(void **state) {
    (void)state;
    const double logits[3] = {1, 2, 3};
    const uint32_t target[1] = {1};
    double logp, d[3] = {0, 0, 0}, one = 1.0;
    assert_int_equal(vks_ref_token_logprob_forward(logits, 1, 3, target, &logp), VKS_OK);
    double lse = log(exp(1.0) + exp(2.0) + exp(3.0));
    assert_true(fabs(-logp - (lse - 2.0)) < 1e-15);
    assert_int_equal(vks_ref_token_logprob_backward(logits, 1, 3, target, &one, d), VKS_OK);
    assert_true(fabs(d[0] + exp(1.0 - lse)) < 1e-15);
    assert_true(fabs(d[1] - (1.0 - exp(2.0 - lse))) < 1e-15);
    assert_true(fabs(d[2] + exp(3.0 - lse)) < 1e-15);
    /* Large logits do not overflow (shifted by the maximum). */
    const double big[2] = {1000, 1000};
    assert_int_equal(vks_ref_token_logprob_forward(big, 1, 2, target, &logp), VKS_OK);
    assert_true(fabs(logp - log(0.5)) < 1e-12); /* 1000 - (1000 + log 2): ulp(1000) = 1.1e-13 */
    const uint32_t out_of_range[1] = {3};
    assert_int_equal(vks_ref_token_logprob_forward(logits, 1, 3, out_of_range, &logp), VKS_ERR_ARG);
}

/* ---- entropy of each row (the entropy bonus) ---- */

typedef struct {
    double *logits, *c, *h;
    int R, V;
} entropy_ctx;

static double entropy_loss(void *p) {
    entropy_ctx *l = p;
    assert_int_equal(vks_ref_token_entropy_forward(l->logits, l->R, l->V, l->h), VKS_OK);
    return weighted_sum(l->c, l->h, (size_t)l->R);
}

/* Odd shapes, peaked rows (logits up to +-12) and a row with c = 0. */
static void test_token_entropy_grad(void **state) {
    (void)state;
    const int rows[] = {1, 5}, vocabs[] = {2, 7, 67};
    const double spread[] = {4, 12};
    for (size_t a = 0; a < 2; a++)
        for (size_t b = 0; b < 3; b++)
            for (size_t s = 0; s < 2; s++) {
                rng64 r = {640 + 6 * a + 2 * b + s};
                int R = rows[a], V = vocabs[b];
                size_t n = (size_t)R * V;
                entropy_ctx l = {random_doubles(&r, n, -spread[s], spread[s]), random_doubles(&r, (size_t)R, -1, 1),
                                 zeros((size_t)R), R, V};
                if (R > 2) l.c[2] = 0.0;
                grad_buf d = grad_buf_new(&r, n);
                assert_int_equal(vks_ref_token_entropy_backward(l.logits, R, V, l.c, d.g), VKS_OK);
                grad_buf_settle(&d);
                check_grad("token entropy", l.logits, n, d.g, entropy_loss, &l);
                if (R > 2)
                    for (int j = 0; j < V; j++) assert_true(d.g[2 * V + j] == 0.0);
                grad_buf_free(&d);
                free(l.logits), free(l.c), free(l.h);
            }
}

/* By hand: a uniform row has H = log V and no gradient (the maximum); a
 * two-token row with p = (1/(1+e), e/(1+e)) has H = log(1+e) - e/(1+e). */
static void test_token_entropy_known(void **state) {
    (void)state;
    const double uniform[4] = {0.5, 0.5, 0.5, 0.5}, two[2] = {0.0, 1.0}, one = 1.0;
    double h, d[4] = {0, 0, 0, 0};
    assert_int_equal(vks_ref_token_entropy_forward(uniform, 1, 4, &h), VKS_OK);
    assert_true(fabs(h - log(4.0)) < 1e-15);
    assert_int_equal(vks_ref_token_entropy_backward(uniform, 1, 4, &one, d), VKS_OK);
    for (int j = 0; j < 4; j++) assert_true(fabs(d[j]) < 1e-15);
    assert_int_equal(vks_ref_token_entropy_forward(two, 1, 2, &h), VKS_OK);
    double e = exp(1.0), p1 = e / (1.0 + e);
    assert_true(fabs(h - (log(1.0 + e) - p1)) < 1e-15);
    /* dH/dz_1 = -p1 (log p1 + H) = -p0 p1 (z1 - z0): raising the likelier token lowers H */
    assert_int_equal(vks_ref_token_entropy_backward(two, 1, 2, &one, d), VKS_OK);
    assert_true(fabs(d[1] + p1 * (1.0 - p1)) < 1e-15 && fabs(d[0] - p1 * (1.0 - p1)) < 1e-15);
    assert_int_equal(vks_ref_token_entropy_forward(two, 0, 2, &h), VKS_ERR_ARG);
    assert_int_equal(vks_ref_token_entropy_backward(two, 1, 2, NULL, d), VKS_ERR_ARG);
}

/* ---- AdamW, clipping, schedule ---- */

/* One step from zero moments, values worked out by hand:
 * t = 1: m = 0.1 g, v = 0.001 g^2, m_hat = g, v_hat = g^2, so
 * p1 = p0 - lr (g / (|g| + eps) + wd p0). */
static void test_adamw_first_step_by_hand(void **state) {
    (void)state;
    const vks_adamw_params h = {.lr = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.1};
    double p[3] = {1.0, -2.0, 0.5}, g[3] = {0.1, -0.3, 0.0}, m[3] = {0}, v[3] = {0};
    assert_int_equal(vks_ref_adamw_step(p, g, m, v, 3, &h, 1, 1.0), VKS_OK);
    assert_true(fabs(p[0] - (1.0 - 0.01 * (0.1 / (0.1 + 1e-8) + 0.1))) < 1e-15);   /* 0.989000001 */
    assert_true(fabs(p[1] - (-2.0 - 0.01 * (-0.3 / (0.3 + 1e-8) - 0.2))) < 1e-15); /* -1.987999...99 */
    assert_true(fabs(p[2] - 0.5 * (1.0 - 0.01 * 0.1)) < 1e-15); /* zero gradient: only the decay */
    assert_true(fabs(m[0] - 0.01) < 1e-17 && fabs(v[1] - 0.001 * 0.09) < 1e-18);
    /* Second step, g = (0.2, 0.1, -0.4): m = 0.9 m1 + 0.1 g, v = 0.999 v1 + 0.001 g^2,
     * corrections 1 - 0.9^2 = 0.19 and 1 - 0.999^2 = 0.001999. */
    double p1 = p[0], g2[3] = {0.2, 0.1, -0.4};
    assert_int_equal(vks_ref_adamw_step(p, g2, m, v, 3, &h, 2, 1.0), VKS_OK);
    double m2 = 0.9 * 0.01 + 0.1 * 0.2, v2 = 0.999 * 1e-5 + 0.001 * 0.04;
    double want = p1 - 0.01 * ((m2 / 0.19) / (sqrt(v2 / 0.001999) + 1e-8) + 0.1 * p1);
    assert_true(fabs(p[0] - want) < 1e-15);
    assert_true(fabs(m[0] - m2) < 1e-17 && fabs(v[0] - v2) < 1e-18);
}

/* Ten steps against the closed forms m_t = (1-b1) sum_s b1^(t-s) g_s (same for
 * v with g^2), a constant gradient giving |step| ~ lr, grad_scale equal to
 * scaling the gradients, and elements updated independently. */
static void test_adamw_multi_step(void **state) {
    (void)state;
    enum { N = 6, STEPS = 10 };
    const vks_adamw_params h = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.0};
    rng64 r = {700};
    double p[N], p_half[N], g[STEPS][N], m[N] = {0}, v[N] = {0}, mh[N] = {0}, vh[N] = {0};
    for (int i = 0; i < N; i++) p[i] = p_half[i] = rng_uniform(&r, -1, 1);
    for (int t = 0; t < STEPS; t++)
        for (int i = 0; i < N; i++) g[t][i] = rng_uniform(&r, -1, 1);
    for (int t = 1; t <= STEPS; t++) {
        double g_half[N];
        for (int i = 0; i < N; i++) g_half[i] = 2.0 * g[t - 1][i]; /* scaled back by grad_scale 0.5 */
        assert_int_equal(vks_ref_adamw_step(p, g[t - 1], m, v, N, &h, t, 1.0), VKS_OK);
        /* the same update split in two calls of 3 elements each */
        assert_int_equal(vks_ref_adamw_step(p_half, g_half, mh, vh, 3, &h, t, 0.5), VKS_OK);
        assert_int_equal(vks_ref_adamw_step(p_half + 3, g_half + 3, mh + 3, vh + 3, 3, &h, t, 0.5), VKS_OK);
    }
    assert_memory_equal(p, p_half, sizeof p);
    for (int i = 0; i < N; i++) {
        double mc = 0.0, vc = 0.0;
        for (int s = 1; s <= STEPS; s++) {
            mc += 0.1 * pow(0.9, STEPS - s) * g[s - 1][i];
            vc += 0.05 * pow(0.95, STEPS - s) * g[s - 1][i] * g[s - 1][i];
        }
        assert_true(fabs(m[i] - mc) < 1e-15 && fabs(v[i] - vc) < 1e-15);
    }
    /* Constant gradient: bias correction makes every step lr * g / (|g| + eps). */
    double q = 0.5, gq = -0.25, mq = 0.0, vq = 0.0;
    for (int t = 1; t <= STEPS; t++) assert_int_equal(vks_ref_adamw_step(&q, &gq, &mq, &vq, 1, &h, t, 1.0), VKS_OK);
    assert_true(fabs(q - (0.5 + STEPS * 1e-3 * 0.25 / (0.25 + 1e-8))) < 1e-12);
    assert_int_equal(vks_ref_adamw_step(&q, &gq, &mq, &vq, 1, &h, 0, 1.0), VKS_ERR_ARG); /* steps are 1-based */
}

static void test_clip_and_norm(void **state) {
    (void)state;
    const double g[2] = {3.0, 4.0};
    assert_true(vks_ref_sum_squares(g, 2) == 25.0);
    assert_true(fabs(vks_ref_clip_scale(5.0, 1.0) - 1.0 / (5.0 + 1e-6)) < 1e-17);
    assert_true(vks_ref_clip_scale(0.5, 1.0) == 1.0);
    assert_true(vks_ref_clip_scale(50.0, 0.0) == 1.0); /* off */
}

/* ---- the RL loss of each type (vks_ref_grpo_loss) ---- */

static vks_grpo_loss_params loss_of(vks_loss_type type, double kl_beta) {
    vks_grpo_loss_params h = {.delta = VKS_GRPO_DELTA, .eps = VKS_GRPO_EPS, .token_budget = 37.0, .kl_beta = kl_beta,
                              .type = type, .eps_low = VKS_DAPO_EPS_LOW, .eps_high = VKS_DAPO_EPS_HIGH,
                              .mask_low = VKS_DPPO_MASK, .mask_high = VKS_DPPO_MASK, .adv_tau = 0.7, .kl_tau = 0.05,
                              .behav_cap = VKS_BEHAV_CAP};
    if (type == VKS_LOSS_IPO) h.mask_low = h.mask_high = VKS_IPO_THRESHOLD;
    return h;
}

typedef struct {
    int R;
    double *logp, *old, *adv, *w, *ref;
    const vks_grpo_loss_params *h;
} rl_loss_ctx;

static double rl_loss_total(void *p) {
    rl_loss_ctx *c = p;
    double total = NAN;
    assert_int_equal(vks_ref_grpo_loss(c->logp, c->old, c->adv, c->ref, c->w, c->R, c->h, NULL, NULL, &total, NULL), VKS_OK);
    return total;
}

/* Every edge of a mask or clip at least 1e-3 away (the steps are 1e-5). */
static bool near_an_edge(double logp, double old) {
    double rho = exp(logp - old), dp = exp(logp) - exp(old);
    const double ratio_edges[] = {1 - VKS_GRPO_EPS, 1 + VKS_GRPO_EPS, VKS_GRPO_DELTA, 1 - VKS_DAPO_EPS_LOW, 1 + VKS_DAPO_EPS_HIGH,
                                  VKS_BEHAV_CAP};
    const double prob_edges[] = {VKS_DPPO_MASK, VKS_IPO_THRESHOLD};
    for (int i = 0; i < 6; i++)
        if (fabs(rho - ratio_edges[i]) < 1e-3) return true;
    for (int i = 0; i < 2; i++)
        if (fabs(fabs(dp) - prob_edges[i]) < 1e-3) return true;
    return false;
}

/* d loss / d logp of every type, with and without the KL term, against
 * central differences of the loss; cispo's coefficient is a constant of its
 * gradient (stop-gradient), so its difference moves logp and logp_old
 * together (the ratio, and so the coefficient, stays). Rows cover both sides
 * of each type's clip or mask, advantages of both signs and zero, and masked
 * rows (weight 0). */
static void test_rl_loss_grad(void **state) {
    (void)state;
    enum { R = 64 };
    static const double log_ratios[] = {-1.2, -0.4, -0.03, 0.03, 0.3, 0.9, 1.7};
    for (int type = 0; type < VKS_LOSS_TYPE_COUNT; type++)
        for (int k = 0; k < 2 && type != VKS_LOSS_GSPO; k++) { /* gspo's sequences: test_gspo_grad */
            rng64 rng = {0xc0ffee00u + (uint64_t)type * 2 + (uint64_t)k};
            double logp[R], old[R], adv[R], w[R], ref[R], grad[R] = {0};
            for (int r = 0; r < R; r++) {
                do {
                    logp[r] = rng_uniform(&rng, -3.0, -0.05);
                    old[r] = logp[r] - log_ratios[r % 7] - rng_uniform(&rng, -0.02, 0.02);
                } while (near_an_edge(logp[r], old[r]));
                adv[r] = r % 5 == 4 ? 0.0 : rng_uniform(&rng, 0.1, 2.0) * ((r / 7) % 2 ? -1 : 1);
                w[r] = r % 11 == 10 ? 0.0 : rng_uniform(&rng, 0.5, 1.5);
                ref[r] = logp[r] + rng_uniform(&rng, -1.0, 1.0);
            }
            vks_grpo_loss_params h = loss_of((vks_loss_type)type, k ? 0.3 : 0.0);
            uint32_t flags[R];
            assert_int_equal(vks_ref_grpo_loss(logp, old, adv, ref, w, R, &h, NULL, flags, NULL, grad), VKS_OK);
            int in = 0, out = 0;
            for (int r = 0; r < R; r++)
                if (w[r] != 0 && adv[r] != 0) *(flags[r] & VKS_GRPO_CLIPPED ? &out : &in) += 1;
            assert_true(in > 4 && out > 4); /* both sides of the clip or mask are tested */
            rl_loss_ctx c = {R, logp, old, adv, w, ref, &h};
            double err = 0;
            for (int r = 0; r < R; r++) {
                double saved = logp[r], saved_old = old[r], lp, lm;
                bool joint = type == VKS_LOSS_CISPO;
                logp[r] = saved + FD_STEP, old[r] = joint ? saved_old + FD_STEP : saved_old;
                lp = rl_loss_total(&c);
                logp[r] = saved - FD_STEP, old[r] = joint ? saved_old - FD_STEP : saved_old;
                lm = rl_loss_total(&c);
                logp[r] = saved, old[r] = saved_old;
                err = fmax(err, fabs((lp - lm) / (2 * FD_STEP) - grad[r]));
            }
            double gmax = 0;
            for (int r = 0; r < R; r++) gmax = fmax(gmax, fabs(grad[r]));
            fprintf(stderr, "%s%s: %d rows in the trust region, %d out; gradient error %.3g of %.3g\n",
                    vks_loss_type_name(h.type), k ? " + kl" : "", in, out, err, gmax);
            assert_true(gmax > 1e-3);
            if (!(err <= GRAD_RTOL * gmax + GRAD_ATOL))
                fail_msg("%s: gradient vs finite differences: error %.3g", vks_loss_type_name(h.type), err);
        }
}

/* decoupled_ppo with the proximal policy held (vks_ref_decoupled_ppo_loss):
 * d loss / d logp against central differences, with rows on both sides of
 * PPO's clip on pi / pi_prox and behaviour weights pi_prox / pi_behav on both
 * sides of the cap, masked (AReaL's) and truncated (TIS), with and without
 * the KL term; then vks_ref_grpo_loss (pi_prox = pi: ratio 1) gives the same
 * as the held form at logp_prox = logp. */
static void test_decoupled_ppo_grad(void **state) {
    (void)state;
    enum { R = 70 };
    static const double prox_ratios[] = {-0.6, -0.05, 0.04, 0.5};     /* log pi / pi_prox: clipped or not */
    static const double behav_ratios[] = {-0.8, 0.1, 0.9, 1.4, 2.3}; /* log pi_prox / pi_behav; log 5 = 1.61 */
    for (int k = 0; k < 4; k++) {
        bool truncate = k & 1, kl = k & 2;
        rng64 rng = {0xdec0u + (uint64_t)k};
        double logp[R], prox[R], behav[R], adv[R], w[R], ref[R], grad[R] = {0};
        for (int r = 0; r < R; r++) {
            logp[r] = rng_uniform(&rng, -3.0, -0.05);
            prox[r] = logp[r] - prox_ratios[r % 4] - rng_uniform(&rng, -0.02, 0.02);
            behav[r] = prox[r] - behav_ratios[r % 5] - rng_uniform(&rng, -0.02, 0.02);
            adv[r] = r % 9 == 8 ? 0.0 : rng_uniform(&rng, 0.1, 2.0) * ((r / 3) % 2 ? -1 : 1);
            w[r] = r % 11 == 10 ? 0.0 : rng_uniform(&rng, 0.5, 1.5);
            ref[r] = logp[r] + rng_uniform(&rng, -1.0, 1.0);
        }
        vks_grpo_loss_params h = loss_of(VKS_LOSS_DECOUPLED_PPO, kl ? 0.3 : 0.0);
        h.behav_truncate = truncate;
        uint32_t flags[R];
        assert_int_equal(vks_ref_decoupled_ppo_loss(logp, prox, behav, adv, ref, w, R, &h, NULL, flags, NULL, grad), VKS_OK);
        int over = 0, clipped = 0, plain = 0;
        for (int r = 0; r < R; r++) {
            if (w[r] == 0 || adv[r] == 0) continue;
            bool o = exp(prox[r] - behav[r]) > h.behav_cap;
            over += o;
            clipped += !o && (flags[r] & VKS_GRPO_CLIPPED);
            plain += !flags[r];
        }
        assert_true(over > 4 && clipped > 4 && plain > 4); /* every region is tested */
        double err = 0, gmax = 0;
        for (int r = 0; r < R; r++) {
            double saved = logp[r], lp, lm;
            logp[r] = saved + FD_STEP;
            assert_int_equal(vks_ref_decoupled_ppo_loss(logp, prox, behav, adv, ref, w, R, &h, NULL, NULL, &lp, NULL), VKS_OK);
            logp[r] = saved - FD_STEP;
            assert_int_equal(vks_ref_decoupled_ppo_loss(logp, prox, behav, adv, ref, w, R, &h, NULL, NULL, &lm, NULL), VKS_OK);
            logp[r] = saved;
            err = fmax(err, fabs((lp - lm) / (2 * FD_STEP) - grad[r]));
            gmax = fmax(gmax, fabs(grad[r]));
        }
        fprintf(stderr, "decoupled_ppo (%s%s): %d over the cap, %d clipped, %d plain; gradient error %.3g of %.3g\n",
                truncate ? "truncate" : "mask", kl ? ", kl" : "", over, clipped, plain, err, gmax);
        assert_true(gmax > 1e-3);
        if (!(err <= GRAD_RTOL * gmax + GRAD_ATOL)) fail_msg("decoupled_ppo: gradient vs finite differences: error %.3g", err);
        /* pi_prox = pi: vks_ref_grpo_loss's form, the same rows and gradient */
        double rows_a[R], rows_b[R], ga[R] = {0}, gb[R] = {0};
        uint32_t fa[R], fb[R];
        assert_int_equal(vks_ref_decoupled_ppo_loss(logp, logp, behav, adv, ref, w, R, &h, rows_a, fa, NULL, ga), VKS_OK);
        assert_int_equal(vks_ref_grpo_loss(logp, behav, adv, ref, w, R, &h, rows_b, fb, NULL, gb), VKS_OK);
        for (int r = 0; r < R; r++) {
            assert_true(rows_a[r] == rows_b[r] && ga[r] == gb[r] && fa[r] == fb[r]);
            assert_true(!(fa[r] & VKS_GRPO_CLIPPED) || exp(logp[r] - behav[r]) > h.behav_cap); /* only the cap acts */
        }
    }
    vks_grpo_loss_params bad = loss_of(VKS_LOSS_DECOUPLED_PPO, 0.0);
    bad.behav_cap = 0.5;
    double x = -1, y = -1, a = 1;
    assert_int_equal(vks_ref_grpo_loss(&x, &y, &a, NULL, NULL, 1, &bad, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
    bad = loss_of(VKS_LOSS_GSPO, 0.0);
    assert_int_equal(vks_ref_decoupled_ppo_loss(&x, &x, &y, &a, NULL, NULL, 1, &bad, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
}

/* gspo: 12 sequences of 8 rows (one weight and one advantage each, a masked
 * prompt row first), d loss / d logp against central differences: moving one
 * row's logp moves its sequence's ratio s, so the difference sees the whole
 * sequence's dP/ds s / n, which the reference gives as w (-A s) on each row.
 * Half the sequences keep s within [1 - 3e-4, 1 + 4e-4] (their rows' log-ratios
 * within +-1e-4: the differences move s by ~1e-6), half far outside (clipped
 * or not by A's sign); with and without the KL term. */
static void test_gspo_grad(void **state) {
    (void)state;
    enum { S = 12, L = 8, R = S * L };
    int lens[S];
    for (int k = 0; k < 2; k++) {
        rng64 rng = {0x65b0u + (uint64_t)k};
        double logp[R], old[R], adv[R], w[R], ref[R], grad[R] = {0};
        for (int s = 0; s < S; s++) {
            lens[s] = L;
            double a = s % 4 == 3 ? 0.0 : rng_uniform(&rng, 0.2, 2.0) * (s % 2 ? -1 : 1);
            double weight = rng_uniform(&rng, 0.5, 1.5), far = s % 3 == 0 ? 0.0 : s % 3 == 1 ? 0.6 : -0.5;
            for (int i = 0; i < L; i++) {
                int r = s * L + i;
                logp[r] = rng_uniform(&rng, -3.0, -0.05);
                old[r] = logp[r] - far - rng_uniform(&rng, -1e-4, 1e-4);
                adv[r] = a, w[r] = i == 0 ? 0.0 : weight; /* the prompt row */
                ref[r] = logp[r] + rng_uniform(&rng, -1.0, 1.0);
            }
        }
        vks_grpo_loss_params h = {.token_budget = 37.0, .kl_beta = k ? 0.3 : 0.0, .type = VKS_LOSS_GSPO,
                                  .eps_low = VKS_GSPO_EPS_LOW, .eps_high = VKS_GSPO_EPS_HIGH};
        uint32_t flags[R];
        assert_int_equal(vks_ref_gspo_loss(logp, old, adv, ref, w, lens, S, R, &h, NULL, flags, NULL, grad), VKS_OK);
        int in = 0, out = 0;
        for (int r = 0; r < R; r++)
            if (w[r] != 0 && adv[r] != 0) *(flags[r] & VKS_GRPO_CLIPPED ? &out : &in) += 1;
        assert_true(in > 8 && out > 8);
        double err = 0, gmax = 0;
        for (int r = 0; r < R; r++) {
            double saved = logp[r], lp, lm;
            logp[r] = saved + FD_STEP;
            assert_int_equal(vks_ref_gspo_loss(logp, old, adv, ref, w, lens, S, R, &h, NULL, NULL, &lp, NULL), VKS_OK);
            logp[r] = saved - FD_STEP;
            assert_int_equal(vks_ref_gspo_loss(logp, old, adv, ref, w, lens, S, R, &h, NULL, NULL, &lm, NULL), VKS_OK);
            logp[r] = saved;
            err = fmax(err, fabs((lp - lm) / (2 * FD_STEP) - grad[r]));
            gmax = fmax(gmax, fabs(grad[r]));
        }
        fprintf(stderr, "gspo%s: %d rows in the trust region, %d out; gradient error %.3g of %.3g\n", k ? " + kl" : "",
                in, out, err, gmax);
        assert_true(gmax > 1e-3);
        if (!(err <= GRAD_RTOL * gmax + GRAD_ATOL)) fail_msg("gspo: gradient vs finite differences: error %.3g", err);
        /* two advantages in one sequence, or a sequence past the rows: refused */
        adv[L + 3] += 1.0;
        assert_int_equal(vks_ref_gspo_loss(logp, old, adv, ref, w, lens, S, R, &h, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
        adv[L + 3] -= 1.0;
        lens[S - 1] = L + 1;
        assert_int_equal(vks_ref_gspo_loss(logp, old, adv, ref, w, lens, S, R, &h, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
        assert_int_equal(vks_ref_grpo_loss(logp, old, adv, ref, w, R, &h, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
    }
}

/* One row of each type by hand (w 1, budget 1, adv_tau 1, kl_tau 1e-3):
 * logp = log 0.5 against logp_old = log 0.1 (ratio 5, p - p_old = 0.4) or
 * log 0.25 (ratio 2, 0.25). */
static void test_rl_loss_known(void **state) {
    (void)state;
    const double l5 = log(5.0);
    struct { vks_loss_type type; double old, adv, term, grad; uint32_t flags; } rows[] = {
        /* intellect2: capped at 4, the plain term -4 A is larger for A < 0: no gradient through the cap */
        {VKS_LOSS_INTELLECT2, 0.1, -1.0, 4.0, 0.0, VKS_GRPO_CAPPED},
        /* intellect2, A > 0: the clipped term -1.2 wins */
        {VKS_LOSS_INTELLECT2, 0.1, 1.0, -1.2, 0.0, VKS_GRPO_CLIPPED | VKS_GRPO_CAPPED},
        /* dppo_kl: p rose by 0.4 > 0.2 with A > 0: masked, only the KL term */
        {VKS_LOSS_DPPO_KL, 0.1, 1.0, 1e-3 * l5 * l5, 2e-3 * l5, VKS_GRPO_CLIPPED},
        /* dppo_kl, A < 0: a rise is not the advantage's direction: kept, -A rho = 5 */
        {VKS_LOSS_DPPO_KL, 0.1, -1.0, 5.0 + 1e-3 * l5 * l5, 5.0 + 2e-3 * l5, 0},
        /* ipo: |0.4| > 0.1 masks either way */
        {VKS_LOSS_IPO, 0.1, -1.0, 1e-3 * l5 * l5, 2e-3 * l5, VKS_GRPO_CLIPPED},
        /* cispo: ratio 2 clipped to 1.28: -1.28 A log 0.5, gradient -1.28 A */
        {VKS_LOSS_CISPO, 0.25, 1.0, -1.28 * log(0.5), -1.28, VKS_GRPO_CLIPPED},
        /* dapo, A > 0: clipped at 1.28 (no gradient); A < 0: the plain 2 (gradient 2) */
        {VKS_LOSS_DAPO, 0.25, 1.0, -1.28, 0.0, VKS_GRPO_CLIPPED},
        {VKS_LOSS_DAPO, 0.25, -1.0, 2.0, 2.0, 0},
        /* decoupled_ppo (pi_prox = pi): behaviour weight 2 (or 4) <= 5: -2 A, gradient -2 A; 0.5 / 0.09 = 5.6
         * is over the cap: masked */
        {VKS_LOSS_DECOUPLED_PPO, 0.25, -1.0, 2.0, 2.0, 0},
        {VKS_LOSS_DECOUPLED_PPO, 0.125, 1.0, -4.0, -4.0, 0},
        {VKS_LOSS_DECOUPLED_PPO, 0.09, 1.0, 0.0, 0.0, VKS_GRPO_CLIPPED},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        vks_grpo_loss_params h = loss_of(rows[i].type, 0.0);
        h.token_budget = 1.0, h.adv_tau = 1.0, h.kl_tau = 1e-3;
        if (h.type == VKS_LOSS_IPO) h.mask_low = h.mask_high = VKS_IPO_THRESHOLD;
        double logp = log(0.5), old = log(rows[i].old), term = NAN, grad = 0;
        uint32_t flags = 99;
        assert_int_equal(vks_ref_grpo_loss(&logp, &old, &rows[i].adv, NULL, NULL, 1, &h, &term, &flags, NULL, &grad), VKS_OK);
        if (fabs(term - rows[i].term) > 1e-12 || fabs(grad - rows[i].grad) > 1e-12 || flags != rows[i].flags)
            fail_msg("row %zu (%s): loss %.15g grad %.15g flags %u, want %.15g %.15g %u", i, vks_loss_type_name(h.type),
                     term, grad, flags, rows[i].term, rows[i].grad, rows[i].flags);
    }
    vks_grpo_loss_params bad = loss_of(VKS_LOSS_DPPO_KL, 0.0);
    bad.mask_high = 2.0;
    double x = -1, y = -1, a = 1;
    assert_int_equal(vks_ref_grpo_loss(&x, &y, &a, NULL, NULL, 1, &bad, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
}

static void test_lr_schedule(void **state) {
    (void)state;
    const vks_lr_schedule constant = {.lr = 1e-3, .warmup_steps = 10};
    assert_true(vks_ref_lr_at(&constant, 0) == 0.0);
    assert_true(fabs(vks_ref_lr_at(&constant, 1) - 1e-4) < 1e-18);
    assert_true(fabs(vks_ref_lr_at(&constant, 5) - 5e-4) < 1e-18);
    assert_true(vks_ref_lr_at(&constant, 10) == 1e-3 && vks_ref_lr_at(&constant, 11) == 1e-3);
    assert_true(vks_ref_lr_at(&constant, 100000) == 1e-3);
    const vks_lr_schedule cosine = {.lr = 1e-3, .min_lr = 1e-4, .warmup_steps = 10, .total_steps = 110, .cosine = true};
    assert_true(fabs(vks_ref_lr_at(&cosine, 10) - 1e-3) < 1e-18);
    assert_true(fabs(vks_ref_lr_at(&cosine, 60) - 5.5e-4) < 1e-15);  /* halfway: cos(pi/2) = 0 */
    assert_true(fabs(vks_ref_lr_at(&cosine, 35) - (1e-4 + 0.5 * (1 + cos(M_PI / 4)) * 9e-4)) < 1e-15);
    assert_true(vks_ref_lr_at(&cosine, 110) == 1e-4 && vks_ref_lr_at(&cosine, 500) == 1e-4);
    for (int t = 11; t <= 110; t++) assert_true(vks_ref_lr_at(&cosine, t) < vks_ref_lr_at(&cosine, t - 1));
    const vks_lr_schedule no_warmup = {.lr = 2e-3};
    assert_true(vks_ref_lr_at(&no_warmup, 1) == 2e-3);
}

/* ---- the whole model ---- */

/* A tiny random model; with biases (as Qwen2) when asked. The bias floats are
 * owned by the test (*bias_block, freed by the caller). */
static vks_model *tiny_model(const vks_model_config *cfg, uint64_t seed, bool biases, float **bias_block) {
    vks_model *m = NULL;
    assert_int_equal(vks_model_random(cfg, seed, &m), VKS_OK);
    *bias_block = NULL;
    if (!biases) return m;
    int dim = m->cfg.n_heads * m->cfg.head_dim, kv = m->cfg.kv_dim, per_layer = dim + 2 * kv; /* dim: q's width */
    float *b = malloc((size_t)per_layer * m->cfg.n_layers * sizeof *b);
    assert_non_null(b);
    tu_fill_uniform(b, (size_t)per_layer * m->cfg.n_layers, seed + 1, -0.5f, 0.5f);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        float *at = b + (size_t)l * per_layer;
        m->layers[l].bq = (vks_tensor){VKS_DTYPE_F32, 1, dim, at};
        m->layers[l].bk = (vks_tensor){VKS_DTYPE_F32, 1, kv, at + dim};
        m->layers[l].bv = (vks_tensor){VKS_DTYPE_F32, 1, kv, at + dim + kv};
    }
    *bias_block = b;
    return m;
}

typedef struct {
    vks_model_config cfg;
    bool biases;
    int n_seqs, lens[3];
} model_case;

static const model_case model_cases[] = {
    /* tied classifier, adjacent pairs, GQA ratio 2, odd hidden and vocab */
    {{.dim = 8, .hidden_dim = 11, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2, .vocab_size = 13, .seq_len = 8,
      .rope_mode = VKS_ROPE_ADJACENT, .shared_classifier = true}, false, 3, {4, 1, 3}},
    /* own classifier, half-split pairs, q/k/v biases, GQA ratio 4, one sequence */
    {{.dim = 16, .hidden_dim = 7, .n_layers = 2, .n_heads = 4, .n_kv_heads = 1, .vocab_size = 9, .seq_len = 8,
      .rope_mode = VKS_ROPE_HALF, .shared_classifier = false}, true, 1, {6}},
    /* one layer, plain multi-head, two sequences */
    {{.dim = 6, .hidden_dim = 10, .n_layers = 1, .n_heads = 3, .n_kv_heads = 3, .vocab_size = 17, .seq_len = 5,
      .rope_mode = VKS_ROPE_HALF, .shared_classifier = true}, false, 2, {5, 2}},
    /* Qwen3: per-head q/k norm, head_dim 6 with 2 heads on dim 8 (q 12 wide), GQA 2 */
    {{.dim = 8, .hidden_dim = 9, .n_layers = 2, .n_heads = 2, .n_kv_heads = 1, .head_dim = 6, .vocab_size = 11,
      .seq_len = 6, .rope_mode = VKS_ROPE_HALF, .shared_classifier = false, .qk_norm = true}, false, 2, {4, 3}},
};

static int case_tokens(const model_case *mc) {
    int n = 0;
    for (int s = 0; s < mc->n_seqs; s++) n += mc->lens[s];
    return n;
}

static void random_tokens(int32_t *tokens, int n, int vocab, uint64_t seed) {
    rng64 r = {seed};
    for (int i = 0; i < n; i++) tokens[i] = (int32_t)(rng_uniform(&r, 0, 1) * vocab) % vocab;
}

/* The training forward's logits are vks_ref_forward's, sequence by sequence.
 * vks_ref_forward rounds every op's output to f32 (relative 6e-8 each, a few
 * dozen ops deep) while the training forward stays in double: logits of
 * magnitude ~1 agree to ~1e-6; the bound 1e-5 + 1e-5 |logit| is 10x that. */
static void test_train_logits_match_ref_forward(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++) {
        const model_case *mc = &model_cases[i];
        float *bias_block;
        vks_model *m = tiny_model(&mc->cfg, 20 + i, mc->biases, &bias_block);
        vks_ref_params *p = NULL;
        assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
        assert_int_equal(p->has_bias, mc->biases);
        int n = case_tokens(mc), V = m->cfg.vocab_size;
        int32_t tokens[16];
        random_tokens(tokens, n, V, 30 + i);
        vks_ref_batch b = {tokens, n, mc->lens, mc->n_seqs};
        double *logits = malloc((size_t)n * V * sizeof *logits), logp[16];
        float *ref = malloc((size_t)n * V * sizeof *ref);
        assert_int_equal(vks_ref_train_forward(p, &b, logp, logits, NULL), VKS_OK);
        double worst = 0.0;
        for (int s = 0, t0 = 0; s < mc->n_seqs; t0 += mc->lens[s], s++) {
            assert_int_equal(vks_ref_forward(m, tokens + t0, mc->lens[s], ref + (size_t)t0 * V, NULL), VKS_OK);
            for (int j = 0; j < mc->lens[s]; j++) {
                int t = t0 + j;
                const double *row = logits + (size_t)t * V;
                for (int v = 0; v < V; v++) {
                    double d = fabs(row[v] - ref[(size_t)t * V + v]);
                    worst = fmax(worst, d);
                    assert_true(d <= 1e-5 + 1e-5 * fabs(row[v]));
                }
                /* logp of the next token of the same sequence; 0 at its end */
                if (j + 1 == mc->lens[s]) {
                    assert_true(logp[t] == 0.0);
                    continue;
                }
                double lse = 0.0;
                for (int v = 0; v < V; v++) lse += exp(row[v]);
                assert_true(fabs(logp[t] - (row[tokens[t + 1]] - log(lse))) < 1e-12);
            }
        }
        assert_true(worst > 0.0); /* f32 rounding shows: the two are independent computations */
        free(logits), free(ref), free(bias_block);
        vks_ref_params_free(p);
        vks_model_free(m);
    }
}

typedef struct {
    vks_ref_params *p;
    const vks_ref_batch *b;
    const double *weight;
    double normaliser;
} model_loss_ctx;

static double model_loss(void *ctx) {
    model_loss_ctx *c = ctx;
    double loss = NAN;
    assert_int_equal(vks_ref_train_loss(c->p, c->b, c->weight, c->normaliser, &loss, NULL), VKS_OK);
    return loss;
}

/* Every entry of every named tensor against central differences of the loss
 * (a few thousand forwards of a few tokens: well under a second). */
static void test_train_grad_every_tensor(void **state) {
    (void)state;
    for (size_t i = 0; i < sizeof model_cases / sizeof model_cases[0]; i++) {
        const model_case *mc = &model_cases[i];
        float *bias_block;
        vks_model *m = tiny_model(&mc->cfg, 40 + i, mc->biases, &bias_block);
        vks_ref_params *p = NULL, *g = NULL;
        assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
        assert_int_equal(vks_ref_params_create(&p->cfg, p->has_bias, &g), VKS_OK);
        int n = case_tokens(mc);
        int32_t tokens[16];
        random_tokens(tokens, n, m->cfg.vocab_size, 50 + i);
        rng64 r = {60 + i};
        double weight[16];
        for (int t = 0; t < n; t++) weight[t] = t % 3 == 1 ? 0.0 : rng_uniform(&r, 0.2, 1.5); /* a mask too */
        vks_ref_batch b = {tokens, n, mc->lens, mc->n_seqs};
        model_loss_ctx ctx = {p, &b, weight, 3.7};
        double loss = 0.0;
        for (size_t j = 0; j < g->n_values; j++) g->data[j] = rng_uniform(&r, -1, 1); /* must accumulate */
        double *prefill = malloc(g->n_values * sizeof *prefill);
        memcpy(prefill, g->data, g->n_values * sizeof *prefill);
        assert_int_equal(vks_ref_train_loss(p, &b, weight, 3.7, &loss, g), VKS_OK);
        for (size_t j = 0; j < g->n_values; j++) g->data[j] -= prefill[j];
        assert_true(isfinite(loss) && loss > 0.0);
        int expect = 3 + (mc->cfg.shared_classifier ? 0 : 1) +
                     mc->cfg.n_layers * (9 + (mc->biases ? 3 : 0) + (mc->cfg.qk_norm ? 2 : 0)) - 1;
        assert_int_equal(g->n_tensors, expect);
        for (int t = 0; t < g->n_tensors; t++) {
            const vks_ref_tensor *gt = &g->tensors[t];
            vks_ref_tensor *pt = vks_ref_params_find(p, gt->name);
            assert_non_null(pt);
            assert_true(pt->rows == gt->rows && pt->cols == gt->cols);
            char what[96];
            snprintf(what, sizeof what, "model case %zu, tensor %s", i, gt->name);
            check_grad(what, pt->data, (size_t)pt->rows * pt->cols, gt->data, model_loss, &ctx);
        }
        free(prefill), free(bias_block);
        vks_ref_params_free(p), vks_ref_params_free(g);
        vks_model_free(m);
    }
}

/* The entropy bonus through the whole model: L = sum_r c_r logp_r +
 * sum_r e_r H_r over rows with a target (H_r the entropy of row r's logits),
 * vks_ref_train_backward_entropy's gradient against central differences. */
typedef struct {
    const vks_ref_params *p;
    const vks_ref_batch *b;
    const double *c, *e;
} entropy_model_ctx;

static double entropy_model_loss(void *ctx) {
    entropy_model_ctx *m = ctx;
    int n = m->b->n_tokens, V = m->p->cfg.vocab_size;
    double *logp = malloc((size_t)n * sizeof *logp), *logits = malloc((size_t)n * V * sizeof *logits);
    double *h = malloc((size_t)n * sizeof *h);
    assert_true(logp && logits && h);
    assert_int_equal(vks_ref_train_forward(m->p, m->b, logp, logits, NULL), VKS_OK);
    assert_int_equal(vks_ref_token_entropy_forward(logits, n, V, h), VKS_OK);
    double loss = 0.0;
    for (int r = 0, s = 0, in_seq = 0; r < n; r++) { /* the last row of each sequence has no target */
        int len = m->b->n_seqs ? m->b->seq_lens[s] : n;
        if (++in_seq < len) loss += m->c[r] * logp[r] + m->e[r] * h[r];
        else s++, in_seq = 0;
    }
    free(logp), free(logits), free(h);
    return loss;
}

static void test_train_grad_entropy(void **state) {
    (void)state;
    for (size_t i = 0; i < 2; i++) {
        const model_case *mc = &model_cases[i];
        float *bias_block;
        vks_model *m = tiny_model(&mc->cfg, 80 + i, mc->biases, &bias_block);
        vks_ref_params *p = NULL, *g = NULL;
        assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
        assert_int_equal(vks_ref_params_create(&p->cfg, p->has_bias, &g), VKS_OK);
        int n = case_tokens(mc);
        int32_t tokens[16];
        random_tokens(tokens, n, m->cfg.vocab_size, 90 + i);
        rng64 r = {95 + i};
        double c[16], e[16];
        for (int t = 0; t < n; t++) c[t] = rng_uniform(&r, -1, 1), e[t] = t % 3 == 1 ? 0.0 : rng_uniform(&r, -1, 1);
        vks_ref_batch b = {tokens, n, mc->lens, mc->n_seqs};
        entropy_model_ctx ctx = {p, &b, c, e};
        vks_ref_acts *acts = NULL;
        double logp[16];
        assert_int_equal(vks_ref_train_forward(p, &b, logp, NULL, &acts), VKS_OK);
        assert_int_equal(vks_ref_train_backward_entropy(p, &b, acts, c, e, g), VKS_OK);
        vks_ref_acts_free(acts);
        for (int t = 0; t < g->n_tensors; t++) {
            const vks_ref_tensor *gt = &g->tensors[t];
            vks_ref_tensor *pt = vks_ref_params_find(p, gt->name);
            char what[96];
            snprintf(what, sizeof what, "entropy, model case %zu, tensor %s", i, gt->name);
            check_grad(what, pt->data, (size_t)pt->rows * pt->cols, gt->data, entropy_model_loss, &ctx);
        }
        free(bias_block);
        vks_ref_params_free(p), vks_ref_params_free(g);
        vks_model_free(m);
    }
}

/* Named views, the tied classifier, accumulation and refusals. */
static void test_train_params_and_errors(void **state) {
    (void)state;
    const model_case *mc = &model_cases[0];
    float *bias_block;
    vks_model *m = tiny_model(&mc->cfg, 70, false, &bias_block);
    vks_ref_params *p = NULL, *g = NULL, *other = NULL;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&p->cfg, false, &g), VKS_OK);
    assert_true(p->classifier == p->tok_emb && vks_ref_params_find(p, "classifier") == NULL);
    vks_ref_tensor *wk = vks_ref_params_find(p, "layers.1.wk");
    assert_non_null(wk);
    assert_true(wk->data == p->layers[1].wk && wk->rows == m->cfg.kv_dim && wk->cols == m->cfg.dim);
    assert_true(wk->data[5] == ((const float *)m->layers[1].wk.data)[5]);
    assert_null(vks_ref_params_find(p, "layers.2.wk"));
    size_t total = 0;
    for (int t = 0; t < p->n_tensors; t++) total += (size_t)p->tensors[t].rows * p->tensors[t].cols;
    assert_true(total == p->n_values && (int64_t)total == vks_model_param_count(m));

    int32_t tokens[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    const int lens[2] = {5, 3};
    vks_ref_batch b = {tokens, 8, lens, 2};
    double loss1, loss2;
    assert_int_equal(vks_ref_train_loss(p, &b, NULL, 6.0, &loss1, g), VKS_OK);
    double *once = malloc(g->n_values * sizeof *once);
    memcpy(once, g->data, g->n_values * sizeof *once);
    assert_int_equal(vks_ref_train_loss(p, &b, NULL, 6.0, &loss2, g), VKS_OK); /* adds the same again */
    assert_true(loss1 == loss2);
    for (size_t j = 0; j < g->n_values; j++)
        assert_true(fabs(g->data[j] - 2.0 * once[j]) <= 1e-13 * (1 + fabs(once[j])));
    double zero_w[8] = {0};
    vks_ref_params_zero(g);
    assert_int_equal(vks_ref_train_loss(p, &b, zero_w, 1.0, &loss1, g), VKS_OK);
    assert_true(loss1 == 0.0 && vks_ref_sum_squares(g->data, g->n_values) == 0.0);

    const int too_long[1] = {9}, short_sum[2] = {4, 3}, empty[2] = {8, 0};
    vks_ref_batch bad = {tokens, 8, too_long, 1};
    tokens[7] = 8; /* still below vocab 13 */
    assert_int_equal(vks_ref_train_loss(p, &bad, NULL, 1.0, &loss1, NULL), VKS_ERR_ARG); /* > seq_len */
    bad = (vks_ref_batch){tokens, 8, short_sum, 2};
    assert_int_equal(vks_ref_train_loss(p, &bad, NULL, 1.0, &loss1, NULL), VKS_ERR_ARG);
    bad = (vks_ref_batch){tokens, 8, empty, 2};
    assert_int_equal(vks_ref_train_loss(p, &bad, NULL, 1.0, &loss1, NULL), VKS_ERR_ARG);
    assert_int_equal(vks_ref_train_loss(p, &b, NULL, 0.0, &loss1, NULL), VKS_ERR_ARG); /* normaliser */
    tokens[3] = 13;
    assert_int_equal(vks_ref_train_loss(p, &b, NULL, 1.0, &loss1, NULL), VKS_ERR_ARG); /* outside the vocabulary */
    tokens[3] = 4;
    vks_model_config cfg = p->cfg;
    cfg.shared_classifier = false;
    assert_int_equal(vks_ref_params_create(&cfg, false, &other), VKS_OK);
    vks_ref_acts *acts = NULL;
    double logp[8], dlogp[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    assert_int_equal(vks_ref_train_forward(p, &b, logp, NULL, &acts), VKS_OK);
    assert_int_equal(vks_ref_train_backward(p, &b, acts, dlogp, other), VKS_ERR_ARG); /* shaped unlike p */
    vks_ref_batch shorter = {tokens, 5, NULL, 0};
    assert_int_equal(vks_ref_train_backward(p, &shorter, acts, dlogp, g), VKS_ERR_ARG); /* not the forward's rows */
    vks_ref_acts_free(acts);
    free(once);
    vks_ref_params_free(p), vks_ref_params_free(g), vks_ref_params_free(other);
    vks_model_free(m);
}

/* The pieces make a working trainer: AdamW on the reference gradients drives
 * the loss on one fixed sequence down (memorising it), with warm-up and
 * clipping in play. */
static void test_train_adamw_lowers_loss(void **state) {
    (void)state;
    const model_case *mc = &model_cases[1];
    float *bias_block;
    vks_model *m = tiny_model(&mc->cfg, 80, true, &bias_block);
    vks_ref_params *p = NULL, *g = NULL, *mom1 = NULL, *mom2 = NULL;
    assert_int_equal(vks_ref_params_from_model(m, &p), VKS_OK);
    assert_int_equal(vks_ref_params_create(&p->cfg, true, &g), VKS_OK);
    assert_int_equal(vks_ref_params_create(&p->cfg, true, &mom1), VKS_OK);
    assert_int_equal(vks_ref_params_create(&p->cfg, true, &mom2), VKS_OK);
    int32_t tokens[8] = {3, 1, 4, 1, 5, 0, 2, 6};
    vks_ref_batch b = {tokens, 8, NULL, 0};
    const vks_lr_schedule sched = {.lr = 2e-2, .min_lr = 2e-3, .warmup_steps = 5, .total_steps = 60, .cosine = true};
    double first = 0.0, loss = 0.0;
    for (int t = 1; t <= 60; t++) {
        vks_ref_params_zero(g);
        assert_int_equal(vks_ref_train_loss(p, &b, NULL, 7.0, &loss, g), VKS_OK);
        if (t == 1) first = loss;
        double norm = sqrt(vks_ref_sum_squares(g->data, g->n_values));
        vks_adamw_params h = {vks_ref_lr_at(&sched, t), 0.9, 0.95, 1e-8, 0.01};
        assert_int_equal(vks_ref_adamw_step(p->data, g->data, mom1->data, mom2->data, p->n_values, &h, t,
                                            vks_ref_clip_scale(norm, 1.0)), VKS_OK);
    }
    assert_true(first > 1.5);        /* ~log(9) at random weights */
    assert_true(loss < 0.1 * first); /* memorised */
    free(bias_block);
    vks_ref_params_free(p), vks_ref_params_free(g), vks_ref_params_free(mom1), vks_ref_params_free(mom2);
    vks_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_detects_a_wrong_gradient),
        cmocka_unit_test(test_embed_grad),
        cmocka_unit_test(test_rmsnorm_grad),
        cmocka_unit_test(test_rmsnorm_forward_matches_ref),
        cmocka_unit_test(test_matmul_bias_grad),
        cmocka_unit_test(test_lora_grad),
        cmocka_unit_test(test_rope_grad),
        cmocka_unit_test(test_rope_matches_ref_and_inverts),
        cmocka_unit_test(test_attention_grad),
        cmocka_unit_test(test_attention_forward_matches_ref),
        cmocka_unit_test(test_swiglu_grad),
        cmocka_unit_test(test_token_logprob_grad),
        cmocka_unit_test(test_token_logprob_known),
        cmocka_unit_test(test_token_entropy_grad),
        cmocka_unit_test(test_token_entropy_known),
        cmocka_unit_test(test_adamw_first_step_by_hand),
        cmocka_unit_test(test_adamw_multi_step),
        cmocka_unit_test(test_clip_and_norm),
        cmocka_unit_test(test_lr_schedule),
        cmocka_unit_test(test_rl_loss_grad),
        cmocka_unit_test(test_rl_loss_known),
        cmocka_unit_test(test_gspo_grad),
        cmocka_unit_test(test_decoupled_ppo_grad),
        cmocka_unit_test(test_train_logits_match_ref_forward),
        cmocka_unit_test(test_train_grad_every_tensor),
        cmocka_unit_test(test_train_grad_entropy),
        cmocka_unit_test(test_train_params_and_errors),
        cmocka_unit_test(test_train_adamw_lowers_loss),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
