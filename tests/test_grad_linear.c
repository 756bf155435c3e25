/* test_grad_linear: the GPU backward of the linear ops (matmul: dX through
 * weights of every type the engine holds, dW in f32; the LoRA linear on a
 * frozen base; embedding, bias) and the optimizer (gradient norm, clip scale,
 * AdamW) against their float64 references (vks_ref_grad.h), table-driven:
 * one row per case, named fields per op family.
 * Every case runs its GPU op twice on the same inputs and requires
 * bit-identical outputs (determinism). Outputs that are overwritten are
 * poisoned with NaN first; gradients that accumulate start from known random
 * values and the check is old + delta. Any NaN/Inf fails.
 * Tolerances are error bounds of the f32 arithmetic, per element, relative to
 * the magnitudes that enter each result (stated at each check), plus, for the
 * matmuls, an NMSE as test_ops. Embedding and bias backward must also equal a
 * sequential f32 host loop bit for bit (their documented order). */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_ops_grad.h"
#include "vkswarm/vks_ref_grad.h"

#define NAN_POISON 0x7fc00000u
#define U (1.0 / 16777216.0) /* f32 unit roundoff, 2^-24 */

static vks_gpu *gpu;
static vks_ops *ops;

/* One table row; each runner reads its own family's fields. */
typedef struct grad_case grad_case;
typedef void (*grad_runner)(const grad_case *tc);
struct grad_case {
    const char *name;
    grad_runner run;
    struct {
        uint32_t M, N, K;
        uint32_t col0, pad; /* dy is the window [col0, col0 + N) of rows of col0 + N + pad */
        bool accumulate;
        vks_dtype dtype; /* W's type (dX only; 0 = f32) */
    } mm;
    struct {
        uint32_t R, D, V;
        uint32_t row0, rows; /* the table chunk; rows 0: the whole table */
    } emb;
    struct {
        uint32_t R, D;
        bool accumulate;
    } bias;
    struct {
        uint32_t M, in, out, rank;
        uint32_t col0, pad; /* y and dy are the window [col0, col0 + out) of rows of col0 + out + pad */
        double alpha;
        vks_dtype dtype; /* the frozen base's type */
        bool accumulate; /* y and dx start from random values */
        uint32_t fd_stride; /* finite differences on every fd_stride-th element of A and B */
    } lora;
    struct {
        uint32_t n;
        int first_step, steps; /* first_step > 1: start from random moments */
        double lr, beta2, weight_decay;
        float scale; /* the device-side gradient scale */
    } adamw;
    struct {
        uint32_t counts[4];
        int n_grads;
        double ratio; /* max_norm = ratio * the true norm; 0: clipping off */
        bool then_adamw;
    } clip;
};

/* ---- helpers ---- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static float *rand_floats(size_t n, uint64_t seed, float lo, float hi) {
    float *x = xmalloc(n * sizeof *x);
    tu_fill_uniform(x, n, seed, lo, hi);
    return x;
}

static double *to_double(const float *x, size_t n) {
    double *d = xmalloc(n * sizeof *d);
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

static double *abs_double(const float *x, size_t n) {
    double *d = to_double(x, n);
    for (size_t i = 0; i < n; i++) d[i] = fabs(d[i]);
    return d;
}

/* A buffer holding src, or NaN poison when src is NULL. */
static vks_buffer *gpu_buffer(const void *src, size_t bytes) {
    vks_buffer *b;
    assert_int_equal(vks_buffer_create(gpu, bytes, &b), VKS_OK);
    if (src) assert_int_equal(vks_buffer_upload(b, 0, src, bytes), VKS_OK);
    else assert_int_equal(vks_buffer_fill(b, NAN_POISON), VKS_OK);
    return b;
}

static vks_binding bind(vks_buffer *b) { return (vks_binding){b, 0, 0}; }

static float *download(vks_buffer *b, size_t n) {
    float *x = xmalloc(n * 4);
    assert_int_equal(vks_buffer_download(b, 0, x, n * 4), VKS_OK);
    return x;
}

static vks_cmd *begin(void) {
    vks_cmd *c;
    assert_int_equal(vks_cmd_begin(gpu, &c), VKS_OK);
    return c;
}

static void submit(vks_cmd *c) { assert_int_equal(vks_cmd_submit(c), VKS_OK); }

/* gamma_n of rounding-error analysis: a sum of n rounded terms is off by at
 * most gamma_n times the sum of their magnitudes. */
static double gamma_n(double n) { return n * U / (1.0 - n * U); }

static void expect_same_bits(const char *what, const float *a, const float *b, size_t n) {
    if (memcmp(a, b, n * 4) != 0) {
        size_t i = 0;
        while (i < n && memcmp(a + i, b + i, 4) == 0) i++;
        fprintf(stderr, "%s: element %zu differs: %.9g vs %.9g\n", what, i, (double)a[i], (double)b[i]);
        fail();
    }
}

/* |got - want| <= bound per element; reports the worst ratio. */
static void expect_within(const char *what, const float *got, const double *want, const double *bound, size_t n) {
    assert_false(tu_has_nonfinite(got, n));
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - want[i]);
        double r = bound[i] > 0.0 ? err / bound[i] : (err > 0.0 ? INFINITY : 0.0);
        if (r > worst) { worst = r; at = i; }
    }
    if (worst > 1.0 || getenv("VKSWARM_TEST_VERBOSE"))
        fprintf(stderr, "%s: worst error %.3g of its bound at %zu (got %.9g want %.9g bound %.3g)\n", what, worst, at,
                (double)got[at], want[at], bound[at]);
    assert_true(worst <= 1.0);
}

/* Normalized mean squared error against the double result. */
static void expect_nmse(const char *what, const float *got, const double *want, size_t n, double tol) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        num += d * d;
        den += want[i] * want[i];
    }
    double e = num / (den > 1e-300 ? den : 1e-300);
    if (e > tol || getenv("VKSWARM_TEST_VERBOSE")) fprintf(stderr, "%s: nmse %.3g (limit %.3g)\n", what, e, tol);
    assert_true(e <= tol);
}

/* ---- matmul backward ---- */

/* f32 products summed one by one (test_ops' matmul limit): typical errors are
 * ~1e-14 relative; a dropped or misplaced term is ~1/R. */
#define MATMUL_NMSE 1e-11

typedef struct {
    uint32_t M, N, K, ldy, col0;
    const float *x, *w, *dy, *old; /* old: NULL = overwrite; w: the values W's type decodes to */
    const void *w_packed;          /* W in its type's GPU layout (dX) */
    size_t w_bytes;
    vks_dtype dtype;
} matmul_io;

/* One GPU run: dx = dy . W (dw false) or dW = dy^T . x (dw true). */
static float *gpu_matmul_backward(const matmul_io *io, bool dw) {
    uint32_t M = io->M, N = io->N, K = io->K;
    size_t n_out = dw ? (size_t)N * K : (size_t)M * K;
    vks_buffer *bdy = gpu_buffer(io->dy, (size_t)M * io->ldy * 4);
    vks_buffer *bin = dw ? gpu_buffer(io->x, (size_t)M * K * 4) : gpu_buffer(io->w_packed, io->w_bytes);
    vks_buffer *bout = gpu_buffer(io->old, n_out * 4);
    vks_cmd *c = begin();
    bool acc = io->old != NULL;
    if (dw)
        assert_int_equal(vks_op_matmul_backward_w(ops, c, bind(bdy), io->ldy, io->col0, bind(bin), bind(bout), M, N,
                                                  K, acc), VKS_OK);
    else
        assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(bdy), io->ldy, io->col0, bind(bin), io->dtype,
                                                  bind(bout), M, N, K, acc), VKS_OK);
    submit(c);
    float *out = download(bout, n_out);
    vks_buffer_destroy(bdy); vks_buffer_destroy(bin); vks_buffer_destroy(bout);
    return out;
}

/* The reference on (x, W, dy) and, for the bound, on their magnitudes. */
static void ref_matmul_backward(const matmul_io *io, bool dw, const float *dy_dense, double *want, double *mag) {
    uint32_t M = io->M, N = io->N, K = io->K;
    size_t nx = (size_t)M * K, nw = (size_t)N * K, ny = (size_t)M * N;
    double *x = to_double(io->x, nx), *w = to_double(io->w, nw), *dy = to_double(dy_dense, ny);
    double *ax = abs_double(io->x, nx), *aw = abs_double(io->w, nw), *ady = abs_double(dy_dense, ny);
    assert_int_equal(vks_ref_matmul_backward(x, w, (int)M, (int)N, (int)K, dy, dw ? NULL : want, dw ? want : NULL),
                     VKS_OK);
    assert_int_equal(vks_ref_matmul_backward(ax, aw, (int)M, (int)N, (int)K, ady, dw ? NULL : mag, dw ? mag : NULL),
                     VKS_OK);
    free(x); free(w); free(dy); free(ax); free(aw); free(ady);
}

static void run_matmul_backward(const grad_case *tc, bool dw) {
    uint32_t M = tc->mm.M, N = tc->mm.N, K = tc->mm.K, col0 = tc->mm.col0, ldy = col0 + N + tc->mm.pad;
    size_t n_out = dw ? (size_t)N * K : (size_t)M * K;
    float *x = rand_floats((size_t)M * K, 1, -1, 1), *w = rand_floats((size_t)N * K, 2, -1, 1);
    float *dy = rand_floats((size_t)M * ldy, 3, -1, 1); /* columns outside the window must not count */
    float *old = tc->mm.accumulate ? rand_floats(n_out, 4, -2, 2) : NULL;
    /* dX through W of its type: the reference takes the values the GPU
     * decodes (f16/bf16 rounded, block types vks_dequantize'd), exactly */
    size_t w_bytes = 0;
    void *w_packed = dw ? NULL : tu_pack_weights(w, N, K, tc->mm.dtype, &w_bytes);
    matmul_io io = {M, N, K, ldy, col0, x, w, dy, old, w_packed, w_bytes, tc->mm.dtype};

    float *got = gpu_matmul_backward(&io, dw), *again = gpu_matmul_backward(&io, dw);
    expect_same_bits("rerun", got, again, n_out);

    float *dy_dense = xmalloc((size_t)M * N * 4);
    for (size_t m = 0; m < M; m++) memcpy(dy_dense + m * N, dy + m * ldy + col0, (size_t)N * 4);
    double *want = old ? to_double(old, n_out) : calloc(n_out, sizeof(double));
    double *bound = old ? abs_double(old, n_out) : calloc(n_out, sizeof(double));
    assert_non_null(want); assert_non_null(bound);
    ref_matmul_backward(&io, dw, dy_dense, want, bound);
    /* R products summed one at a time (R+1 roundings with the old value):
     * |error| <= gamma_{R+1} * (sum |products| + |old|) */
    double g = gamma_n((dw ? M : N) + 1.0);
    for (size_t i = 0; i < n_out; i++) bound[i] *= g;
    expect_within(tc->name, got, want, bound, n_out);
    expect_nmse(tc->name, got, want, n_out, MATMUL_NMSE);
    free(x); free(w); free(dy); free(old); free(got); free(again); free(dy_dense); free(want); free(bound);
    free(w_packed);
}

static void run_matmul_dx(const grad_case *tc) { run_matmul_backward(tc, false); }
static void run_matmul_dw(const grad_case *tc) { run_matmul_backward(tc, true); }

/* ---- LoRA linear: y = W x + s B (A x), W frozen in any type ---- */

typedef struct {
    uint32_t M, in, out, rank, ldy, col0;
    float scale;
    vks_dtype dtype;
    const void *w_packed;
    size_t w_bytes;
    const float *x, *A, *B, *dy, *y_old, *dx_old, *dA_old, *dB_old; /* *_old NULL: overwrite (y, dx) */
} lora_io;

typedef struct {
    float *y, *z, *dx, *dA, *dB;
} lora_out;

static void lora_out_free(lora_out *r) { free(r->y); free(r->z); free(r->dx); free(r->dA); free(r->dB); }

/* One GPU forward then backward (one command buffer). */
static lora_out gpu_lora(const lora_io *io, vks_matmul_kind kind) {
    uint32_t M = io->M, in = io->in, out = io->out, r = io->rank;
    size_t ny = (size_t)M * io->ldy, nx = (size_t)M * in, nz = (size_t)M * r;
    vks_buffer *bw = gpu_buffer(io->w_packed, io->w_bytes), *ba = gpu_buffer(io->A, (size_t)r * in * 4);
    vks_buffer *bb = gpu_buffer(io->B, (size_t)out * r * 4), *bx = gpu_buffer(io->x, nx * 4);
    vks_buffer *by = gpu_buffer(io->y_old, ny * 4), *bz = gpu_buffer(NULL, nz * 4);
    vks_buffer *bdy = gpu_buffer(io->dy, ny * 4), *bdx = gpu_buffer(io->dx_old, nx * 4);
    vks_buffer *bda = gpu_buffer(io->dA_old, (size_t)r * in * 4), *bdb = gpu_buffer(io->dB_old, (size_t)out * r * 4);
    vks_buffer *bs = gpu_buffer(NULL, nz * 4);
    vks_lora_linear l = {in, out, r, io->scale, bind(bw), io->dtype, bind(ba), bind(bb)};
    vks_cmd *c = begin();
    assert_int_equal(vks_op_lora_forward(ops, c, &l, bind(bx), bind(bz), bind(by), M, io->ldy, io->col0,
                                         io->y_old != NULL, kind), VKS_OK);
    assert_int_equal(vks_op_lora_backward(ops, c, &l, bind(bx), bind(bz), bind(bdy), io->ldy, io->col0, bind(bdx),
                                          bind(bda), bind(bdb), bind(bs), M, io->dx_old != NULL), VKS_OK);
    submit(c);
    lora_out o = {download(by, ny), download(bz, nz), download(bdx, nx), download(bda, (size_t)r * in),
                  download(bdb, (size_t)out * r)};
    vks_buffer *all[] = {bw, ba, bb, bx, by, bz, bdy, bdx, bda, bdb, bs};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
    return o;
}

/* The reference's loss L = sum dy . y (dy dense [M, out]) at (A, B). */
static double ref_lora_loss(const double *x, const double *w, const double *A, const double *B, const lora_io *io,
                            double s, const double *dy) {
    size_t ny = (size_t)io->M * io->out;
    double *y = xmalloc(ny * sizeof *y);
    assert_int_equal(vks_ref_lora_forward(x, w, A, B, (int)io->M, (int)io->out, (int)io->in, (int)io->rank, s, y,
                                          NULL), VKS_OK);
    double l = 0.0;
    for (size_t i = 0; i < ny; i++) l += dy[i] * y[i];
    free(y);
    return l;
}

/* Central differences of that loss in every stride-th element of p (A or B),
 * checked against the reference backward's gradient g: L is linear in each
 * element, so the difference is exact up to rounding (~1e-12 relative here). */
static void check_fd(const char *what, double *p, const double *g, size_t n, uint32_t stride, const double *x,
                     const double *w, double *A, double *B, const lora_io *io, double s, const double *dy) {
    double gmax = 0.0;
    for (size_t i = 0; i < n; i++) gmax = fmax(gmax, fabs(g[i]));
    for (size_t i = 0; i < n; i += stride) {
        double keep = p[i], h = 1e-3;
        p[i] = keep + h;
        double lp = ref_lora_loss(x, w, A, B, io, s, dy);
        p[i] = keep - h;
        double lm = ref_lora_loss(x, w, A, B, io, s, dy);
        p[i] = keep;
        double fd = (lp - lm) / (2 * h);
        if (fabs(fd - g[i]) > 1e-8 * gmax) {
            fprintf(stderr, "%s[%zu]: finite difference %.12g, backward %.12g\n", what, i, fd, g[i]);
            fail();
        }
    }
}

/* got (+ old) against want = old + ref within gamma_n times the magnitudes
 * mag (the reference on absolute values, + |old|), and an NMSE. */
static void expect_lora(const char *what, const float *got, const double *ref, const double *mag, const float *old,
                        size_t n, double gamma) {
    double *want = xmalloc(n * sizeof *want), *bound = xmalloc(n * sizeof *bound);
    for (size_t i = 0; i < n; i++) {
        want[i] = (old ? old[i] : 0.0) + ref[i];
        bound[i] = gamma * (mag[i] + (old ? fabs(old[i]) : 0.0));
    }
    expect_within(what, got, want, bound, n);
    expect_nmse(what, got, want, n, MATMUL_NMSE);
    free(want); free(bound);
}

static void run_lora(const grad_case *tc) {
    uint32_t M = tc->lora.M, in = tc->lora.in, out = tc->lora.out, r = tc->lora.rank, col0 = tc->lora.col0;
    uint32_t ldy = col0 + out + tc->lora.pad;
    size_t nx = (size_t)M * in, nw = (size_t)out * in, na = (size_t)r * in, nb = (size_t)out * r;
    size_t ny = (size_t)M * ldy, nyd = (size_t)M * out;
    float scale = (float)vks_lora_scale(tc->lora.alpha, (int)r);
    double s = scale; /* the reference takes the f32 scale the GPU multiplies by */
    float *x = rand_floats(nx, 11, -1, 1), *w = rand_floats(nw, 12, -1, 1), *A = rand_floats(na, 13, -0.5f, 0.5f);
    float *B = rand_floats(nb, 14, -0.5f, 0.5f), *dy = rand_floats(ny, 15, -1, 1);
    bool acc = tc->lora.accumulate;
    float *y_old = acc ? rand_floats(ny, 16, -2, 2) : NULL, *dx_old = acc ? rand_floats(nx, 17, -2, 2) : NULL;
    float *dA_old = rand_floats(na, 18, -1, 1), *dB_old = rand_floats(nb, 19, -1, 1);
    size_t w_bytes;
    void *w_packed = tu_pack_weights(w, out, in, tc->lora.dtype, &w_bytes); /* w: the decoded values */
    lora_io io = {M, in, out, r, ldy, col0, scale, tc->lora.dtype, w_packed, w_bytes,
                  x, A, B, dy, y_old, dx_old, dA_old, dB_old};
    lora_out got = gpu_lora(&io, VKS_MATMUL_AUTO), again = gpu_lora(&io, VKS_MATMUL_AUTO);
    expect_same_bits("rerun y", got.y, again.y, ny);
    expect_same_bits("rerun dx", got.dx, again.dx, nx);
    expect_same_bits("rerun dA", got.dA, again.dA, na);
    expect_same_bits("rerun dB", got.dB, again.dB, nb);

    /* the reference on the values and on their magnitudes (|s| for s) */
    double *xd = to_double(x, nx), *wd = to_double(w, nw), *Ad = to_double(A, na), *Bd = to_double(B, nb);
    double *xa = abs_double(x, nx), *wa = abs_double(w, nw), *Aa = abs_double(A, na), *Ba = abs_double(B, nb);
    float *dy_dense = xmalloc(nyd * 4), *yo_dense = acc ? xmalloc(nyd * 4) : NULL, *y_dense = xmalloc(nyd * 4);
    for (size_t m = 0; m < M; m++) {
        memcpy(dy_dense + m * out, dy + m * ldy + col0, (size_t)out * 4);
        memcpy(y_dense + m * out, got.y + m * ldy + col0, (size_t)out * 4);
        if (acc) memcpy(yo_dense + m * out, y_old + m * ldy + col0, (size_t)out * 4);
    }
    /* the rest of each row of y is untouched (poison or the old values) */
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < ldy; j++)
            if (j < col0 || j >= col0 + out) {
                float want = acc ? y_old[m * ldy + j] : 0.0f, have = got.y[m * ldy + j];
                if (acc) assert_memory_equal(&have, &want, 4);
                else assert_true(isnan(have));
            }
    double *dyd = to_double(dy_dense, nyd), *dya = abs_double(dy_dense, nyd);
    double *y = xmalloc(nyd * 8), *ya = xmalloc(nyd * 8), *h = xmalloc((size_t)M * r * 8);
    double *dx = calloc(nx, 8), *dxa = calloc(nx, 8), *dA = calloc(na, 8), *dAa = calloc(na, 8);
    double *dB = calloc(nb, 8), *dBa = calloc(nb, 8);
    assert_true(dx && dxa && dA && dAa && dB && dBa);
    int Mi = (int)M, N = (int)out, K = (int)in, R = (int)r;
    assert_int_equal(vks_ref_lora_forward(xd, wd, Ad, Bd, Mi, N, K, R, s, y, h), VKS_OK);
    assert_int_equal(vks_ref_lora_forward(xa, wa, Aa, Ba, Mi, N, K, R, fabs(s), ya, NULL), VKS_OK);
    assert_int_equal(vks_ref_lora_backward(xd, wd, Ad, Bd, Mi, N, K, R, s, dyd, dx, dA, dB), VKS_OK);
    assert_int_equal(vks_ref_lora_backward(xa, wa, Aa, Ba, Mi, N, K, R, fabs(s), dya, dxa, dAa, dBa), VKS_OK);

    /* z = fl(s fl(A x)): K products then one rounding */
    double *zs = xmalloc((size_t)M * r * 8), *za = xmalloc((size_t)M * r * 8);
    assert_int_equal(vks_ref_matmul_forward(xa, Aa, Mi, R, K, za), VKS_OK);
    for (size_t i = 0; i < (size_t)M * r; i++) { zs[i] = s * h[i]; za[i] *= fabs(s); }
    expect_lora("z", got.z, zs, za, NULL, (size_t)M * r, gamma_n(K + 2.0));
    /* Error bounds from the chain of roundings (gamma_n(sum of the chain's
     * terms + the scale + the old value)), e.g. y: z carries K + 1, B z r + 1
     * more, W x K + 1 with the old value: within K + r + K + 4; dA: g = s dy B
     * (out + 1) then M products summed; dB: z then M; dx: dy W (out + 1),
     * g A (r + 1) on top of g's own out + 1. */
    expect_lora("y", y_dense, y, ya, yo_dense, nyd, gamma_n(2.0 * K + R + 4));
    expect_lora("dA", got.dA, dA, dAa, dA_old, na, gamma_n(N + Mi + 3.0));
    expect_lora("dB", got.dB, dB, dBa, dB_old, nb, gamma_n(K + Mi + 3.0));
    expect_lora("dx", got.dx, dx, dxa, dx_old, nx, gamma_n(2.0 * N + R + 4));

    /* the reference's gradients against finite differences of its own forward */
    check_fd("dA", Ad, dA, na, tc->lora.fd_stride, xd, wd, Ad, Bd, &io, s, dyd);
    check_fd("dB", Bd, dB, nb, tc->lora.fd_stride, xd, wd, Ad, Bd, &io, s, dyd);

    lora_out_free(&got); lora_out_free(&again);
    free(x); free(w); free(A); free(B); free(dy); free(y_old); free(dx_old); free(dA_old); free(dB_old);
    free(w_packed); free(xd); free(wd); free(Ad); free(Bd); free(xa); free(wa); free(Aa); free(Ba);
    free(dy_dense); free(yo_dense); free(y_dense); free(dyd); free(dya); free(y); free(ya); free(h);
    free(dx); free(dxa); free(dA); free(dAa); free(dB); free(dBa); free(zs); free(za);
}

/* A fresh adapter (PEFT init: A Kaiming-uniform from Philox, B = 0) leaves
 * the base's output bit for bit: the forward against vks_op_matmul_kind alone,
 * for decode rows (M <= 8) and prefill rows alike. */
static void run_lora_fresh(const grad_case *tc) {
    uint32_t M = tc->lora.M, in = tc->lora.in, out = tc->lora.out, r = tc->lora.rank;
    size_t nx = (size_t)M * in, ny = (size_t)M * out;
    float *x = rand_floats(nx, 21, -1, 1), *w = rand_floats((size_t)out * in, 22, -1, 1);
    float *A = xmalloc((size_t)r * in * 4), *B = rand_floats((size_t)out * r, 23, -1, 1); /* init zeroes it */
    assert_int_equal(vks_lora_init(A, B, (int)r, in, out, 1234, vks_lora_stream(3, VKS_LORA_UP)), VKS_OK);
    for (size_t i = 0; i < (size_t)out * r; i++) assert_true(B[i] == 0.0f);
    size_t w_bytes;
    void *w_packed = tu_pack_weights(w, out, in, tc->lora.dtype, &w_bytes);
    vks_buffer *bw = gpu_buffer(w_packed, w_bytes), *ba = gpu_buffer(A, (size_t)r * in * 4);
    vks_buffer *bb = gpu_buffer(B, (size_t)out * r * 4), *bx = gpu_buffer(x, nx * 4);
    vks_buffer *by = gpu_buffer(NULL, ny * 4), *bbase = gpu_buffer(NULL, ny * 4), *bz = gpu_buffer(NULL, (size_t)M * r * 4);
    vks_lora_linear l = {in, out, r, (float)vks_lora_scale(tc->lora.alpha, (int)r), bind(bw), tc->lora.dtype,
                         bind(ba), bind(bb)};
    vks_matmul_kind kinds[] = {VKS_MATMUL_DECODE, VKS_MATMUL_PREFILL};
    for (int k = 0; k < 2; k++) {
        vks_cmd *c = begin();
        assert_int_equal(vks_op_lora_forward(ops, c, &l, bind(bx), bind(bz), bind(by), M, out, 0, false, kinds[k]),
                         VKS_OK);
        assert_int_equal(vks_op_matmul_kind(ops, c, bind(bx), bind(bw), tc->lora.dtype, bind(bbase), M, out, in, out,
                                            0, false, kinds[k]), VKS_OK);
        submit(c);
        float *y = download(by, ny), *base = download(bbase, ny), *z = download(bz, (size_t)M * r);
        assert_false(tu_has_nonfinite(base, ny));
        expect_same_bits(kinds[k] == VKS_MATMUL_DECODE ? "decode: base" : "prefill: base", y, base, ny);
        bool any = false; /* the adapter did run: A x is not all zero */
        for (size_t i = 0; i < (size_t)M * r; i++) any |= z[i] != 0.0f;
        assert_true(any);
        free(y); free(base); free(z);
    }
    /* PEFT's bound: |A| < 1/sqrt(in), and A spans it */
    double amax = 0.0, bound = 1.0 / sqrt((double)in);
    for (size_t i = 0; i < (size_t)r * in; i++) amax = fmax(amax, fabs(A[i]));
    assert_true(amax < bound && amax > 0.9 * bound);
    vks_buffer *all[] = {bw, ba, bb, bx, by, bbase, bz};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
    free(x); free(w); free(A); free(B); free(w_packed);
}

/* ---- embedding backward ---- */

static uint32_t *rand_tokens(uint32_t R, uint32_t V, uint64_t seed) {
    uint32_t *t = xmalloc((size_t)R * 4);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 7;
    for (uint32_t r = 0; r < R; r++) {
        s ^= s >> 12; s ^= s << 25; s ^= s >> 27;
        t[r] = (uint32_t)((s * 0x2545F4914F6CDD1Dull) >> 33) % V;
    }
    return t;
}

static float *gpu_embed_backward(const uint32_t *tok, uint32_t R, uint32_t V, uint32_t D, const float *dout,
                                 const float *old, uint32_t row0, uint32_t rows) {
    size_t words = VKS_EMBED_GRAD_INDEX_WORDS(R);
    uint32_t *index = xmalloc(words * 4), n_unique = 0;
    assert_int_equal(vks_op_embed_backward_index(tok, R, V, index, &n_unique), VKS_OK);
    vks_buffer *bi = gpu_buffer(index, words * 4), *bd = gpu_buffer(dout, (size_t)R * D * 4);
    vks_buffer *bt = gpu_buffer(old, (size_t)rows * D * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_embed_backward(ops, c, bind(bi), n_unique, bind(bd), R, D, bind(bt), row0, rows), VKS_OK);
    submit(c);
    float *out = download(bt, (size_t)rows * D);
    free(index);
    vks_buffer_destroy(bi); vks_buffer_destroy(bd); vks_buffer_destroy(bt);
    return out;
}

/* The table chunk [row0, row0 + rows) of a V-row table starts from random
 * values; rows of tokens outside it must keep them. */
static void run_embed_backward(const grad_case *tc) {
    uint32_t R = tc->emb.R, D = tc->emb.D, V = tc->emb.V, row0 = tc->emb.row0;
    uint32_t rows = tc->emb.rows ? tc->emb.rows : V;
    size_t n = (size_t)rows * D;
    uint32_t *tok = rand_tokens(R, V, 5);
    float *dout = rand_floats((size_t)R * D, 6, -1, 1), *old = rand_floats(n, 7, -2, 2);
    float *got = gpu_embed_backward(tok, R, V, D, dout, old, row0, rows);
    float *again = gpu_embed_backward(tok, R, V, D, dout, old, row0, rows);
    expect_same_bits("rerun", got, again, n);

    /* the documented order: a sequential f32 loop over r, bit for bit */
    float *seq = xmalloc(n * 4);
    memcpy(seq, old, n * 4);
    for (uint32_t r = 0; r < R; r++)
        if (tok[r] >= row0 && tok[r] - row0 < rows)
            for (uint32_t d = 0; d < D; d++) seq[(size_t)(tok[r] - row0) * D + d] += dout[(size_t)r * D + d];
    expect_same_bits("sequential f32 loop", got, seq, n);

    /* the float64 reference on the whole table; the chunk's rows are checked */
    double *table = calloc((size_t)V * D, sizeof(double)), *mag = calloc((size_t)V * D, sizeof(double));
    assert_non_null(table); assert_non_null(mag);
    for (size_t i = 0; i < n; i++) {
        table[(size_t)row0 * D + i] = old[i];
        mag[(size_t)row0 * D + i] = fabs(old[i]);
    }
    double *dd = to_double(dout, (size_t)R * D), *ad = abs_double(dout, (size_t)R * D);
    assert_int_equal(vks_ref_embed_backward(table, (int)V, (int)D, tok, (int)R, dd), VKS_OK);
    assert_int_equal(vks_ref_embed_backward(mag, (int)V, (int)D, tok, (int)R, ad), VKS_OK);
    /* a row's sum has at most R additions onto its old value */
    for (size_t i = 0; i < (size_t)V * D; i++) mag[i] *= gamma_n(R);
    expect_within(tc->name, got, table + (size_t)row0 * D, mag + (size_t)row0 * D, n);
    free(tok); free(dout); free(old); free(got); free(again); free(seq); free(table); free(mag); free(dd); free(ad);
}

/* The index by hand, and a token outside the vocabulary refused. */
static void run_embed_index(const grad_case *tc) {
    (void)tc;
    const uint32_t tok[] = {5, 2, 5, 0, 2, 5};
    uint32_t index[VKS_EMBED_GRAD_INDEX_WORDS(6)], n_unique = 0;
    assert_int_equal(vks_op_embed_backward_index(tok, 6, 6, index, &n_unique), VKS_OK);
    const uint32_t want[] = {0, 2, 5, 0, 0, 0, /* tokens */ 0, 1, 3, 6, 0, 0, 0, /* starts */ 3, 1, 4, 0, 2, 5};
    assert_int_equal(n_unique, 3);
    assert_memory_equal(index, want, sizeof want);
    assert_int_equal(vks_op_embed_backward_index(tok, 6, 5, index, &n_unique), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "row 0"));
}

/* ---- bias backward ---- */

static float *gpu_bias_backward(const float *dy, uint32_t R, uint32_t D, const float *old) {
    vks_buffer *bdy = gpu_buffer(dy, (size_t)R * D * 4), *bdb = gpu_buffer(old, (size_t)D * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_bias_backward(ops, c, bind(bdy), R, D, bind(bdb), old != NULL), VKS_OK);
    submit(c);
    float *out = download(bdb, D);
    vks_buffer_destroy(bdy); vks_buffer_destroy(bdb);
    return out;
}

static void run_bias_backward(const grad_case *tc) {
    uint32_t R = tc->bias.R, D = tc->bias.D;
    float *dy = rand_floats((size_t)R * D, 8, -1, 1);
    float *old = tc->bias.accumulate ? rand_floats(D, 9, -2, 2) : NULL;
    float *got = gpu_bias_backward(dy, R, D, old), *again = gpu_bias_backward(dy, R, D, old);
    expect_same_bits("rerun", got, again, D);

    float *seq = xmalloc((size_t)D * 4);
    for (uint32_t j = 0; j < D; j++) seq[j] = old ? old[j] : 0.0f;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t j = 0; j < D; j++) seq[j] += dy[(size_t)r * D + j];
    expect_same_bits("sequential f32 loop", got, seq, D);

    double *want = old ? to_double(old, D) : calloc(D, sizeof(double));
    double *mag = old ? abs_double(old, D) : calloc(D, sizeof(double));
    assert_non_null(want); assert_non_null(mag);
    double *dd = to_double(dy, (size_t)R * D), *ad = abs_double(dy, (size_t)R * D);
    assert_int_equal(vks_ref_bias_backward(dd, (int)R, (int)D, want), VKS_OK);
    assert_int_equal(vks_ref_bias_backward(ad, (int)R, (int)D, mag), VKS_OK);
    for (uint32_t j = 0; j < D; j++) mag[j] *= gamma_n(R);
    expect_within(tc->name, got, want, mag, D);
    free(dy); free(old); free(got); free(again); free(seq); free(want); free(mag); free(dd); free(ad);
}

/* ---- AdamW ---- */

typedef struct {
    float *p, *m, *v;
} adam_state;

/* One GPU step from `in` (grads g, scale at scale[0] of the device) into a
 * freshly downloaded state. */
static adam_state gpu_adamw_step(const adam_state *in, const float *g, uint32_t n, const vks_adamw_params *h, int t,
                                 vks_buffer *scale) {
    vks_buffer *bp = gpu_buffer(in->p, (size_t)n * 4), *bg = gpu_buffer(g, (size_t)n * 4);
    vks_buffer *bm = gpu_buffer(in->m, (size_t)n * 4), *bv = gpu_buffer(in->v, (size_t)n * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_adamw(ops, c, bind(bp), bind(bg), bind(bm), bind(bv), n, h, t, bind(scale)), VKS_OK);
    submit(c);
    adam_state out = {download(bp, n), download(bm, n), download(bv, n)};
    vks_buffer_destroy(bp); vks_buffer_destroy(bg); vks_buffer_destroy(bm); vks_buffer_destroy(bv);
    return out;
}

static void free_state(adam_state *s) { free(s->p); free(s->m); free(s->v); }

/* Error bounds of one f32 AdamW step from the same (f32) state, first order,
 * times 2 for the second-order terms. Roundings counted per operation
 * (hyperparameters rounded to f32 count as one more each); Vulkan allows
 * 2.5 ulp for a division and sqrt as 1/inversesqrt (~3 ulp): 3u and 4u. */
typedef struct {
    double m, v, p;
} adam_bounds;

static adam_bounds adamw_bounds(double p, double grad, double m, double v, const vks_adamw_params *h, int t,
                                double scale) {
    double b1 = h->beta1, b2 = h->beta2, c1 = 1.0 - pow(b1, t), c2 = 1.0 - pow(b2, t);
    double g = scale * grad;
    double m1 = b1 * m + (1 - b1) * g, v1 = b2 * v + (1 - b2) * g * g;
    double e_m = 6 * U * (b1 * fabs(m) + (1 - b1) * fabs(g));
    double e_v = 8 * U * (b2 * v + (1 - b2) * g * g);
    double mhat = m1 / c1, vhat = v1 / c2, sq = sqrt(vhat);
    double e_mhat = e_m / c1 + 5 * U * fabs(mhat), e_vhat = e_v / c2 + 5 * U * vhat;
    double e_sq = (sq > 0 ? fmin(sqrt(e_vhat), e_vhat / sq) : sqrt(e_vhat)) + 4 * U * sq;
    double den = sq + h->eps, ratio = mhat / den;
    double e_den = e_sq + 2 * U * den;
    double e_ratio = e_mhat / den + fabs(ratio) * e_den / den + 3 * U * fabs(ratio);
    double upd = ratio + h->weight_decay * p, p1 = p - h->lr * upd;
    double e_upd = e_ratio + 3 * U * h->weight_decay * fabs(p) + U * fabs(upd);
    double e_p = h->lr * e_upd + 2 * U * h->lr * fabs(upd) + U * fabs(p1);
    return (adam_bounds){2 * e_m, 2 * e_v, 2 * e_p};
}

/* The reference from the GPU's previous state, compared element by element. */
static void check_adamw_step(const char *name, const adam_state *prev, const adam_state *got, const float *grad,
                             uint32_t n, const vks_adamw_params *h, int t, double scale) {
    double *p = to_double(prev->p, n), *m = to_double(prev->m, n), *v = to_double(prev->v, n);
    double *g = to_double(grad, n);
    assert_int_equal(vks_ref_adamw_step(p, g, m, v, n, h, t, scale), VKS_OK);
    double *bp = xmalloc((size_t)n * 8), *bm = xmalloc((size_t)n * 8), *bv = xmalloc((size_t)n * 8);
    for (uint32_t i = 0; i < n; i++) {
        adam_bounds b = adamw_bounds(prev->p[i], grad[i], prev->m[i], prev->v[i], h, t, scale);
        bp[i] = b.p; bm[i] = b.m; bv[i] = b.v;
    }
    char what[160];
    snprintf(what, sizeof what, "%s step %d m", name, t);
    expect_within(what, got->m, m, bm, n);
    snprintf(what, sizeof what, "%s step %d v", name, t);
    expect_within(what, got->v, v, bv, n);
    snprintf(what, sizeof what, "%s step %d p", name, t);
    expect_within(what, got->p, p, bp, n);
    free(p); free(m); free(v); free(g); free(bp); free(bm); free(bv);
}

static vks_buffer *scale_buffer(float s) { return gpu_buffer(&s, 4); }

static void run_adamw(const grad_case *tc) {
    uint32_t n = tc->adamw.n;
    vks_adamw_params h = {tc->adamw.lr, 0.9, tc->adamw.beta2, 1e-8, tc->adamw.weight_decay};
    bool resume = tc->adamw.first_step > 1;
    adam_state s = {rand_floats(n, 10, -1, 1), rand_floats(n, 11, -0.1f, 0.1f), rand_floats(n, 12, 0, 0.01f)};
    if (!resume) {
        memset(s.m, 0, (size_t)n * 4);
        memset(s.v, 0, (size_t)n * 4);
    }
    vks_buffer *scale = scale_buffer(tc->adamw.scale);
    for (int k = 0; k < tc->adamw.steps; k++) {
        int t = tc->adamw.first_step + k;
        float *grad = rand_floats(n, 100 + (uint64_t)k, -1, 1);
        if (k == 1) grad[0] = 0.0f; /* a zero gradient: only decay moves p */
        adam_state next = gpu_adamw_step(&s, grad, n, &h, t, scale);
        adam_state again = gpu_adamw_step(&s, grad, n, &h, t, scale);
        expect_same_bits("rerun p", next.p, again.p, n);
        expect_same_bits("rerun m", next.m, again.m, n);
        expect_same_bits("rerun v", next.v, again.v, n);
        check_adamw_step(tc->name, &s, &next, grad, n, &h, t, tc->adamw.scale);
        free_state(&again);
        free_state(&s);
        s = next;
        free(grad);
    }
    free_state(&s);
    vks_buffer_destroy(scale);
}

/* ---- gradient norm and clipping ---- */

/* The sum of squares is of positive terms, each partial in a chain of at
 * most ITEMS (32) + 2 log2(workgroup <= 1024) + partials per invocation
 * (<= 4 here) + 2 additions < 64: relative error <= gamma_64 < 4e-6 on the
 * sum, half that on the norm, plus the square root's ~3 ulp. */
#define NORM_REL_TOL 3e-6
#define SCALE_REL_TOL 4e-6 /* the norm's error + a division */

static void gpu_grad_clip(float *const *grads, const uint32_t *counts, int n_grads, float max_norm, float out[2],
                          vks_buffer **gbuf) {
    uint32_t partials = 0;
    vks_binding b[4];
    for (int i = 0; i < n_grads; i++) {
        gbuf[i] = gpu_buffer(grads[i], (size_t)counts[i] * 4);
        b[i] = bind(gbuf[i]);
        partials += vks_op_grad_squares_partials(ops, counts[i]);
    }
    vks_buffer *bp = gpu_buffer(NULL, (size_t)partials * 4), *bo = gpu_buffer(NULL, 8);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_grad_clip(ops, c, b, counts, n_grads, bind(bp), max_norm, bind(bo)), VKS_OK);
    submit(c);
    assert_int_equal(vks_buffer_download(bo, 0, out, 8), VKS_OK);
    vks_buffer_destroy(bp);
    vks_buffer_destroy(bo);
}

static void expect_rel(const char *what, double got, double want, double tol) {
    double rel = fabs(got - want) / fabs(want);
    if (rel > tol || getenv("VKSWARM_TEST_VERBOSE"))
        fprintf(stderr, "%s: %.9g vs %.9g (relative %.3g, limit %.3g)\n", what, got, want, rel, tol);
    assert_true(rel <= tol);
}

/* AdamW on the first gradient buffer, reading the scale where the clip kernel
 * wrote it (the out buffer of a fresh clip run). */
static void clip_then_adamw(float *const *grads, const uint32_t *counts, int n_grads, float max_norm, float scale) {
    uint32_t n = counts[0], partials = 0;
    vks_buffer *gbuf[4];
    vks_binding b[4];
    for (int i = 0; i < n_grads; i++) {
        gbuf[i] = gpu_buffer(grads[i], (size_t)counts[i] * 4);
        b[i] = bind(gbuf[i]);
        partials += vks_op_grad_squares_partials(ops, counts[i]);
    }
    vks_buffer *bpart = gpu_buffer(NULL, (size_t)partials * 4), *bo = gpu_buffer(NULL, 8);
    adam_state s = {rand_floats(n, 13, -1, 1), calloc(n, 4), calloc(n, 4)};
    assert_non_null(s.m); assert_non_null(s.v);
    vks_buffer *bp = gpu_buffer(s.p, (size_t)n * 4), *bm = gpu_buffer(s.m, (size_t)n * 4);
    vks_buffer *bv = gpu_buffer(s.v, (size_t)n * 4);
    vks_adamw_params h = {1e-3, 0.9, 0.95, 1e-8, 0.1};
    vks_cmd *c = begin();
    assert_int_equal(vks_op_grad_clip(ops, c, b, counts, n_grads, bind(bpart), max_norm, bind(bo)), VKS_OK);
    assert_int_equal(vks_op_adamw(ops, c, bind(bp), b[0], bind(bm), bind(bv), n, &h, 1, bind(bo)), VKS_OK);
    submit(c);
    adam_state got = {download(bp, n), download(bm, n), download(bv, n)};
    check_adamw_step("clip then adamw", &s, &got, grads[0], n, &h, 1, scale);
    free_state(&got); free_state(&s);
    for (int i = 0; i < n_grads; i++) vks_buffer_destroy(gbuf[i]);
    vks_buffer_destroy(bpart); vks_buffer_destroy(bo); vks_buffer_destroy(bp); vks_buffer_destroy(bm);
    vks_buffer_destroy(bv);
}

static void run_clip(const grad_case *tc) {
    int n_grads = tc->clip.n_grads;
    float *grads[4] = {NULL, NULL, NULL, NULL};
    double sum = 0.0;
    for (int i = 0; i < n_grads; i++) {
        grads[i] = rand_floats(tc->clip.counts[i], 20 + (uint64_t)i, -1, 1);
        double *d = to_double(grads[i], tc->clip.counts[i]);
        sum += vks_ref_sum_squares(d, tc->clip.counts[i]);
        free(d);
    }
    double norm = sqrt(sum), max_norm = (double)(float)(tc->clip.ratio * norm);
    double want_scale = vks_ref_clip_scale(norm, max_norm);
    float out[2], again[2];
    vks_buffer *gbuf[4];
    gpu_grad_clip(grads, tc->clip.counts, n_grads, (float)max_norm, out, gbuf);
    for (int i = 0; i < n_grads; i++) vks_buffer_destroy(gbuf[i]);
    gpu_grad_clip(grads, tc->clip.counts, n_grads, (float)max_norm, again, gbuf);
    for (int i = 0; i < n_grads; i++) vks_buffer_destroy(gbuf[i]);
    expect_same_bits("rerun", out, again, 2);
    assert_false(tu_has_nonfinite(out, 2));
    expect_rel("norm", out[1], norm, NORM_REL_TOL);
    if (want_scale == 1.0) assert_true(out[0] == 1.0f); /* below the max, or clipping off: exactly 1 */
    else expect_rel("scale", out[0], want_scale, SCALE_REL_TOL);
    if (tc->clip.then_adamw) clip_then_adamw(grads, tc->clip.counts, n_grads, (float)max_norm, out[0]);
    for (int i = 0; i < n_grads; i++) free(grads[i]);
}

/* ---- argument checking ---- */

static void run_bad_args(const grad_case *tc) {
    (void)tc;
    vks_buffer *b = gpu_buffer(NULL, 1024);
    vks_cmd *c = begin();
    vks_adamw_params h = {1e-3, 0.9, 0.95, 1e-8, 0.0};
    /* dy window past ldy; dx too small for M*K; dW too small; zero sizes */
    const vks_dtype f32 = VKS_DTYPE_F32;
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 1, bind(b), f32, bind(b), 2, 4, 4, false),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 0, bind(b), f32, bind(b), 100, 4, 4, false),
                     VKS_ERR_ARG);
    /* dX through a typed W: K not whole blocks, a W past the binding (4 x 256
     * q4_k = 576 bytes fits, 8 x 256 does not), a misaligned block-type W, q6_k
     * (no kernel), a bad dtype */
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 0, bind(b), VKS_DTYPE_Q4_0, bind(b), 1, 4, 48,
                                              false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 8, 0, bind(b), VKS_DTYPE_Q4_K, bind(b), 1, 4, 256,
                                              false), VKS_OK);
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 8, 0, bind(b), VKS_DTYPE_Q4_K, bind(b), 1, 8, 256,
                                              false), VKS_ERR_ARG);
    vks_binding off4 = {b, 4, 0};
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 0, off4, VKS_DTYPE_Q8_0, bind(b), 1, 4, 32,
                                              false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 0, bind(b), VKS_DTYPE_Q6_K, bind(b), 1, 1, 256,
                                              false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_x(ops, c, bind(b), 4, 0, bind(b), (vks_dtype)99, bind(b), 1, 4, 4,
                                              false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_w(ops, c, bind(b), 200, 0, bind(b), bind(b), 1, 200, 2, true),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_backward_w(ops, c, bind(b), 4, 0, bind(b), bind(b), 0, 4, 4, true), VKS_ERR_ARG);
    /* more distinct tokens than rows; an index too small for R; a table too small */
    assert_int_equal(vks_op_embed_backward(ops, c, bind(b), 5, bind(b), 4, 4, bind(b), 0, 4), VKS_ERR_ARG);
    assert_int_equal(vks_op_embed_backward(ops, c, bind(b), 1, bind(b), 100, 1, bind(b), 0, 4), VKS_ERR_ARG);
    assert_int_equal(vks_op_embed_backward(ops, c, bind(b), 1, bind(b), 4, 4, bind(b), 0, 100), VKS_ERR_ARG);
    assert_int_equal(vks_op_bias_backward(ops, c, bind(b), 300, 1, bind(b), true), VKS_ERR_ARG);
    /* AdamW: step 0, beta1 = 1, a scale binding past the end */
    assert_int_equal(vks_op_adamw(ops, c, bind(b), bind(b), bind(b), bind(b), 16, &h, 0, bind(b)), VKS_ERR_ARG);
    vks_adamw_params bad = h;
    bad.beta1 = 1.0;
    assert_int_equal(vks_op_adamw(ops, c, bind(b), bind(b), bind(b), bind(b), 16, &bad, 1, bind(b)), VKS_ERR_ARG);
    vks_binding past_end = {b, 2048, 0};
    assert_int_equal(vks_op_adamw(ops, c, bind(b), bind(b), bind(b), bind(b), 16, &h, 1, past_end), VKS_ERR_ARG);
    /* clipping: partials past the binding, an out of one float, NaN max norm */
    assert_int_equal(vks_op_grad_squares(ops, c, bind(b), 16, bind(b), 256), VKS_ERR_ARG);
    vks_binding one_float = {b, 0, 4};
    assert_int_equal(vks_op_clip_scale(ops, c, bind(b), 4, 1.0f, one_float), VKS_ERR_ARG);
    assert_int_equal(vks_op_clip_scale(ops, c, bind(b), 4, NAN, bind(b)), VKS_ERR_ARG);
    submit(c);
    vks_buffer_destroy(b);
}

/* Sizes, scale, ranges and shared memory refused (VKS_ERR_ARG). */
static void run_lora_bad_args(const grad_case *tc) {
    (void)tc;
    vks_buffer *b = gpu_buffer(NULL, 4096), *z = gpu_buffer(NULL, 256), *s = gpu_buffer(NULL, 256);
    vks_buffer *g = gpu_buffer(NULL, 4096);
    vks_lora_linear l = {8, 8, 2, 2.0f, bind(b), VKS_DTYPE_F32, bind(b), bind(b)};
    vks_cmd *c = begin();
    /* fine as it is: 4 rows */
    assert_int_equal(vks_op_lora_forward(ops, c, &l, bind(b), bind(z), bind(b), 4, 8, 0, false, VKS_MATMUL_AUTO),
                     VKS_OK);
    vks_binding dA = {g, 0, 64}, dB = {g, 2048, 0};
    assert_int_equal(vks_op_lora_backward(ops, c, &l, bind(b), bind(z), bind(b), 8, 0, (vks_binding){0}, dA, dB,
                                          bind(s), 4, false), VKS_OK);
    vks_lora_linear bad = l;
    bad.rank = 0;
    assert_int_equal(vks_op_lora_forward(ops, c, &bad, bind(b), bind(z), bind(b), 4, 8, 0, false, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    bad = l;
    bad.scale = INFINITY;
    assert_int_equal(vks_op_lora_forward(ops, c, &bad, bind(b), bind(z), bind(b), 4, 8, 0, false, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    bad = l;
    bad.rank = 200; /* A [200, 8] is 6400 bytes: past b */
    assert_int_equal(vks_op_lora_forward(ops, c, &bad, bind(b), bind(z), bind(b), 4, 8, 0, false, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    /* z too small for 100 rows; z inside y; scratch inside dA; dB overlapping dA */
    assert_int_equal(vks_op_lora_forward(ops, c, &l, bind(b), bind(z), bind(b), 100, 8, 0, false, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_lora_forward(ops, c, &l, bind(b), (vks_binding){b, 1024, 0}, bind(b), 4, 8, 0, false,
                                         VKS_MATMUL_AUTO), VKS_ERR_ARG);
    assert_int_equal(vks_op_lora_backward(ops, c, &l, bind(b), bind(z), bind(b), 8, 0, (vks_binding){0}, dA, dB,
                                          bind(g), 4, false), VKS_ERR_ARG);
    assert_int_equal(vks_op_lora_backward(ops, c, &l, bind(b), bind(z), bind(b), 8, 0, (vks_binding){0}, bind(g),
                                          dB, bind(s), 4, false), VKS_ERR_ARG);
    submit(c);
    vks_buffer_destroy(b); vks_buffer_destroy(z); vks_buffer_destroy(s); vks_buffer_destroy(g);
}

/* ---- the table ---- */

#define DX(nm, m, n, k, c0, pd, acc) {nm, run_matmul_dx, .mm = {m, n, k, c0, pd, acc, VKS_DTYPE_F32}}
#define DXT(nm, t, m, n, k, c0, pd, acc) {nm, run_matmul_dx, .mm = {m, n, k, c0, pd, acc, VKS_DTYPE_##t}}
#define DW(nm, m, n, k, c0, pd, acc) {nm, run_matmul_dw, .mm = {m, n, k, c0, pd, acc, VKS_DTYPE_F32}}
#define LORA(nm, t, m, i, o, r, a, c0, pd, acc, fd) \
    {nm, run_lora, .lora = {m, i, o, r, c0, pd, a, VKS_DTYPE_##t, acc, fd}}
#define LORA_FRESH(nm, t, m, i, o, r) {nm, run_lora_fresh, .lora = {m, i, o, r, 0, 0, 16.0, VKS_DTYPE_##t, false, 1}}
#define EMB(nm, r, d, v, r0, rows) {nm, run_embed_backward, .emb = {r, d, v, r0, rows}}
#define BIAS(nm, r, d, acc) {nm, run_bias_backward, .bias = {r, d, acc}}
#define ADAMW(nm, n_, t0, steps_, lr_, b2, wd, s) \
    {nm, run_adamw, .adamw = {.n = n_, .first_step = t0, .steps = steps_, .lr = lr_, .beta2 = b2, .weight_decay = wd, .scale = s}}
#define CLIP(nm, ratio_, then, ...) \
    {nm, run_clip, .clip = {.counts = {__VA_ARGS__}, .n_grads = sizeof((uint32_t[]){__VA_ARGS__}) / 4, .ratio = ratio_, .then_adamw = then}}

static const grad_case cases[] = {
    /* matmul dX = dY . W: odd shapes (scalar staging), more tiles than one in
     * both directions, vector staging (N, K, ldy, col0 multiples of 4) */
    DX("dx 1x1x1", 1, 1, 1, 0, 0, false),
    DX("dx M7 N67 K173", 7, 67, 173, 0, 0, false),
    DX("dx M130 N67 K173 accumulate", 130, 67, 173, 0, 0, true),
    DX("dx window col0 5 pad 7", 67, 41, 130, 5, 7, true),
    DX("dx vec4 M65 N64 K136", 65, 64, 136, 0, 0, false),
    DX("dx vec4 window col0 8 accumulate", 70, 36, 260, 8, 4, true),
    DX("dx big M300 N520 K384", 300, 520, 384, 0, 0, true),
    /* around the staged tiles (64 x 128 outputs, reduction slices of 16, two
     * buffers): a last slice of 1, odd and even slice counts */
    DX("dx tile edges M63 N17 K129", 63, 17, 129, 0, 0, false),
    DX("dx tile edges vec4 M65 N48 K128 accumulate", 65, 48, 128, 0, 0, true),
    DXT("dx q4_0 tile edges M64 N33 K160", Q4_0, 64, 33, 160, 0, 0, false),
    /* dX through a frozen base of each other type (LoRA): odd shapes (scalar
     * reads; block types need K whole blocks), vector reads, windows, more
     * tiles than one, a long reduction */
    DXT("dx f16 M7 N67 K173", F16, 7, 67, 173, 0, 0, false),
    DXT("dx f16 vec4 window col0 8 accumulate", F16, 70, 36, 260, 8, 4, true),
    DXT("dx f16 big M300 N520 K384", F16, 300, 520, 384, 0, 0, true),
    DXT("dx bf16 M130 N67 K173 accumulate", BF16, 130, 67, 173, 0, 0, true),
    DXT("dx bf16 vec4 M65 N64 K136", BF16, 65, 64, 136, 0, 0, false),
    DXT("dx q8_0 M7 N67 K96", Q8_0, 7, 67, 96, 0, 0, false),
    DXT("dx q8_0 window col0 5 pad 7 accumulate", Q8_0, 67, 41, 160, 5, 7, true),
    DXT("dx q8_0 big M300 N520 K384", Q8_0, 300, 520, 384, 0, 0, true),
    DXT("dx q4_0 M1 N1 K32", Q4_0, 1, 1, 32, 0, 0, false),
    DXT("dx q4_0 M130 N67 K224 accumulate", Q4_0, 130, 67, 224, 0, 0, true),
    DXT("dx q4_0 vec4 window col0 8", Q4_0, 70, 36, 256, 8, 4, false),
    DXT("dx q4_k M7 N67 K256", Q4_K, 7, 67, 256, 0, 0, false),
    DXT("dx q4_k window col0 5 pad 7 accumulate", Q4_K, 67, 41, 512, 5, 7, true),
    DXT("dx q4_k big M300 N1031 K768", Q4_K, 300, 1031, 768, 0, 0, true),
    /* matmul dW = dY^T . X */
    DW("dw 1x1x1", 1, 1, 1, 0, 0, false),
    DW("dw M173 N7 K67", 173, 7, 67, 0, 0, false),
    DW("dw M67 N130 K173 accumulate", 67, 130, 173, 0, 0, true),
    DW("dw window col0 3 pad 1", 33, 70, 129, 3, 1, true),
    DW("dw vec4 M17 N68 K132", 17, 68, 132, 0, 0, false),
    DW("dw vec4 window col0 4 accumulate", 45, 132, 200, 4, 8, true),
    DW("dw big M1031 N260 K200", 1031, 260, 200, 0, 0, true),
    DW("dw tile edges M17 N65 K127", 17, 65, 127, 0, 0, false),
    DW("dw tile edges vec4 M48 N64 K132 accumulate", 48, 64, 132, 0, 0, true),
    /* LoRA on a frozen base of each type: y, z, dx, dA, dB against the float64
     * reference (and dA, dB of the reference against its finite
     * differences); scales that round (alpha / rank = 5/3, 0.7), windows, old
     * values, more tiles than one */
    LORA("lora f32 M7 in67 out41 r3", F32, 7, 67, 41, 3, 5.0, 0, 0, false, 1),
    LORA("lora f16 M13 in70 out33 r4 window accumulate", F16, 13, 70, 33, 4, 2.8, 3, 2, true, 1),
    LORA("lora bf16 M9 in64 out48 r8", BF16, 9, 64, 48, 8, 16.0, 0, 0, false, 1),
    LORA("lora q8_0 M11 in96 out37 r4 accumulate", Q8_0, 11, 96, 37, 4, 5.0, 0, 0, true, 1),
    LORA("lora q4_0 M9 in128 out29 r2 window", Q4_0, 9, 128, 29, 2, 5.0, 8, 4, false, 1),
    LORA("lora q4_k M5 in256 out33 r4 accumulate", Q4_K, 5, 256, 33, 4, 5.0, 0, 0, true, 1),
    LORA("lora q4_k big M130 in512 out200 r16", Q4_K, 130, 512, 200, 16, 32.0, 0, 0, true, 97),
    LORA("lora q8_0 big M300 in384 out520 r16 window", Q8_0, 300, 384, 520, 16, 5.0, 4, 4, true, 211),
    /* a fresh adapter: the base's output bit for bit, decode and prefill */
    LORA_FRESH("lora fresh f32", F32, 3, 67, 41, 4),
    LORA_FRESH("lora fresh f16", F16, 70, 64, 33, 8),
    LORA_FRESH("lora fresh bf16", BF16, 9, 70, 48, 16),
    LORA_FRESH("lora fresh q8_0", Q8_0, 66, 96, 37, 4),
    LORA_FRESH("lora fresh q4_0", Q4_0, 5, 128, 29, 2),
    LORA_FRESH("lora fresh q4_k", Q4_K, 130, 256, 70, 16),
    {"lora bad arguments", run_lora_bad_args, .mm = {0}},
    /* embedding: many repeats (V 7), few, one token, a table chunk */
    EMB("embed R173 D67 V7", 173, 67, 7, 0, 0),
    EMB("embed R67 D130 V1000", 67, 130, 1000, 0, 0),
    EMB("embed R1 D1 V1", 1, 1, 1, 0, 0),
    EMB("embed chunk rows 30..80 of 100", 300, 33, 100, 30, 50),
    EMB("embed big R4099 D256 V300", 4099, 256, 300, 0, 0),
    {"embed index by hand", run_embed_index, .mm = {0}},
    /* bias */
    BIAS("bias R7 D131", 7, 131, false),
    BIAS("bias R300 D1 accumulate", 300, 1, true),
    BIAS("bias R1 D1", 1, 1, true),
    BIAS("bias big R2049 D600 accumulate", 2049, 600, true),
    /* AdamW: from zero moments (bias correction at t = 1..6), resumed at t = 40 */
    ADAMW("adamw n1", 1, 1, 3, 1e-3, 0.999, 0.0, 1.0f),
    ADAMW("adamw n67 decay scale", 67, 1, 6, 1e-2, 0.95, 0.1, 0.37f),
    ADAMW("adamw n100003 resumed", 100003, 40, 3, 3e-4, 0.999, 0.01, 1.0f),
    /* clipping: norm above the max (scale < 1), below (exactly 1), off */
    CLIP("clip above max, 3 buffers", 0.25, false, 1, 67, 100003),
    CLIP("clip below max, 4 buffers", 1.5, false, 173, 7, 67, 70001),
    CLIP("clip off", 0.0, false, 1000),
    CLIP("clip big then adamw", 0.5, true, 1u << 20, 3),
    CLIP("clip below max then adamw", 2.0, true, 4099, 1),
    {"bad arguments", run_bad_args, .mm = {0}},
};

/* ---- cmocka glue ---- */

static int group_setup(void **state) {
    (void)state;
    gpu = tu_gpu_open();
    if (!gpu || vks_ops_create(gpu, &ops) != VKS_OK) return -1;
    const vks_device_info *info = vks_gpu_info(gpu);
    fprintf(stderr, "device: %s, subgroup %u, shared %u\n", info->name, info->subgroup_size, info->max_shared_bytes);
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    vks_ops_destroy(ops);
    vks_gpu_destroy(gpu);
    return 0;
}

static void run_case(void **state) {
    const grad_case *tc = *state;
    tc->run(tc);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

int main(void) {
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[N_CASES];
    size_t n = 0;
    for (size_t i = 0; i < N_CASES; i++)
        if (!tu_case_skipped(cases[i].name))
            tests[n++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return _cmocka_run_group_tests("grad_linear", tests, n, group_setup, group_teardown);
}
