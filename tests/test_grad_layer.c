/* test_grad_layer: the GPU training ops of the layers (RMSNorm, RoPE and SwiGLU
 * backward, the training attention forward and backward, the token
 * log-probability and its gradient, each row's entropy and the entropy
 * bonus's gradient) against their float64 references
 * (vks_ref_grad.h), table-driven: one row per case, named fields per op.
 * Outputs are poisoned with NaN before each run; outputs that accumulate start
 * from known random values and must end as old + delta. Any NaN/Inf fails.
 * Every case runs twice and the two results must be bit-identical.
 *
 * Errors are measured as max |gpu - ref| / max |ref delta| (relative to the
 * output's scale); each tolerance is stated at its row, from the f32 rounding
 * of the sums involved. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_ops_grad.h"
#include "vkswarm/vks_ref_grad.h"

#define NAN_POISON 0x7fc00000u
#define RMS_EPS 1e-5f
#define ROPE_THETA 10000.0f

static vks_gpu *gpu;
static vks_ops *ops;

typedef struct grad_case grad_case;
struct grad_case {
    const char *name;
    void (*run)(const grad_case *tc);
    /* rmsnorm_backward: dx and/or dw wanted, dx accumulating (dw always does) */
    struct { uint32_t R, D; bool dx, dw, accumulate; } norm;
    /* rope_backward: rows with positions up to max_pos, mode adjacent/half */
    struct { uint32_t R, heads, head_dim, max_pos, mode; } rope;
    /* attention: T = the sum of the packed sequences' lengths seq[] (0 ends);
     * check_stats: a backward with perturbed statistics must be off;
     * sorted: the kernels are promised that the starts never decrease (true
     * of every case: without it dk/dv scan every later query tile) */
    struct { uint32_t heads, kv_heads, head_dim, seq[3]; bool accumulate, check_stats, sorted; } attn;
    /* swiglu_backward: in_place = dg over g, du over u */
    struct { uint32_t n; bool accumulate, in_place; } swiglu;
    /* token_logprob: in_place = dlogits over logits; bad_target: rows 1 and 2
     * get targets >= V */
    struct { uint32_t R, V; bool accumulate, in_place, bad_target; } logprob;
    double tol;
    bool slow; /* GPU-bound shape, left out with VKSWARM_TEST_SHORT */
};

/* ---- helpers ---- */

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    assert_non_null(p);
    return p;
}

static double *xcalloc_d(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
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

static double max_abs(const double *x, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* Values an accumulating output starts from: random, at the delta's scale
 * (so that the sum's rounding does not hide the delta's error). */
static float *old_values(size_t n, uint64_t seed, const double *delta) {
    float *x = rand_floats(n, seed, -1, 1);
    double s = max_abs(delta, n);
    for (size_t i = 0; i < n; i++) x[i] = (float)(x[i] * s);
    return x;
}

static vks_buffer *gpu_buffer(const void *src, size_t bytes) {
    vks_buffer *b;
    assert_int_equal(vks_buffer_create(gpu, bytes, &b), VKS_OK);
    if (src) assert_int_equal(vks_buffer_upload(b, 0, src, bytes), VKS_OK);
    else assert_int_equal(vks_buffer_fill(b, NAN_POISON), VKS_OK);
    return b;
}

/* An op's return code must be VKS_OK; otherwise its message is shown. */
static void expect_ok(int rc) {
    if (rc != VKS_OK) fprintf(stderr, "  %s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
}

/* The return code must be VKS_ERR_ARG. */
static void expect_arg_error(int rc) {
    if (rc != VKS_ERR_ARG) fprintf(stderr, "  expected VKS_ERR_ARG, got %d (%s)\n", rc, rc ? vks_last_error() : "ok");
    assert_int_equal(rc, VKS_ERR_ARG);
}

static vks_binding bind(vks_buffer *b) { return (vks_binding){b, 0, 0}; }

static float *download_new(vks_buffer *b, size_t n) {
    float *x = xmalloc(n * sizeof *x);
    assert_int_equal(vks_buffer_download(b, 0, x, n * sizeof *x), VKS_OK);
    return x;
}

static vks_cmd *begin(void) {
    vks_cmd *c;
    assert_int_equal(vks_cmd_begin(gpu, &c), VKS_OK);
    return c;
}

static void submit(vks_cmd *c) { assert_int_equal(vks_cmd_submit(c), VKS_OK); }

/* got must equal (old ? old : 0) + delta within tol * max |delta| (or tol
 * when the reference delta is all zero: every test input is of order 1). */
static void expect_close(const char *what, const float *got, const float *old, const double *delta, size_t n,
                         double tol) {
    assert_false(tu_has_nonfinite(got, n));
    double scale = max_abs(delta, n), err = 0.0;
    if (scale < 1e-30) scale = 1.0;
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(got[i] - ((old ? old[i] : 0.0) + delta[i])));
    err /= scale;
    if (err > tol || getenv("VKSWARM_TEST_VERBOSE"))
        fprintf(stderr, "  %s: max error %.3g of the scale %.3g (limit %.3g)\n", what, err, scale, tol);
    assert_true(err <= tol);
}

static void expect_same_bits(const char *what, const float *a, const float *b, size_t n) {
    if (memcmp(a, b, n * sizeof *a) != 0) fprintf(stderr, "  %s: the rerun differs\n", what);
    assert_memory_equal(a, b, n * sizeof *a);
}

static void free_pair(float *a[2]) { free(a[0]); free(a[1]); }

/* ---- RMSNorm ---- */

typedef struct { const float *x, *w, *dout, *dx0, *dw0; } norm_inputs;

static void gpu_rmsnorm_backward(const grad_case *tc, const norm_inputs *in, float **dx, float **dw) {
    uint32_t R = tc->norm.R, D = tc->norm.D;
    size_t n = (size_t)R * D;
    vks_buffer *bx = gpu_buffer(in->x, n * 4), *bw = gpu_buffer(in->w, D * 4), *bdo = gpu_buffer(in->dout, n * 4);
    vks_buffer *bdx = tc->norm.dx ? gpu_buffer(in->dx0, n * 4) : NULL;
    vks_buffer *bdw = tc->norm.dw ? gpu_buffer(in->dw0, D * 4) : NULL;
    vks_buffer *bs = tc->norm.dw ? gpu_buffer(NULL, vks_op_rmsnorm_backward_scratch_bytes(R, D)) : NULL;
    vks_cmd *c = begin();
    expect_ok(vks_op_rmsnorm_backward(ops, c, bind(bx), bind(bw), bind(bdo), bind(bdx), bind(bdw), bind(bs),
                                             R, D, RMS_EPS, tc->norm.accumulate));
    submit(c);
    *dx = bdx ? download_new(bdx, n) : NULL;
    *dw = bdw ? download_new(bdw, D) : NULL;
    vks_buffer_destroy(bx); vks_buffer_destroy(bw); vks_buffer_destroy(bdo);
    if (bdx) vks_buffer_destroy(bdx);
    if (bdw) vks_buffer_destroy(bdw);
    if (bs) vks_buffer_destroy(bs);
}

static void run_rmsnorm(const grad_case *tc) {
    uint32_t R = tc->norm.R, D = tc->norm.D;
    size_t n = (size_t)R * D;
    float *x = rand_floats(n, 1, -3, 3), *w = rand_floats(D, 2, 0.5f, 1.5f), *dout = rand_floats(n, 3, -1, 1);
    double *xd = to_double(x, n), *wd = to_double(w, D), *dod = to_double(dout, n);
    double *dx_ref = xcalloc_d(n), *dw_ref = xcalloc_d(D);
    assert_int_equal(vks_ref_rmsnorm_backward(xd, wd, (int)R, (int)D, (double)RMS_EPS, dod,
                                              tc->norm.dx ? dx_ref : NULL, tc->norm.dw ? dw_ref : NULL),
                     VKS_OK);
    float *dx0 = tc->norm.accumulate ? old_values(n, 4, dx_ref) : NULL, *dw0 = old_values(D, 5, dw_ref);
    norm_inputs in = {x, w, dout, dx0, dw0};
    float *dx[2], *dw[2];
    for (int run = 0; run < 2; run++) gpu_rmsnorm_backward(tc, &in, &dx[run], &dw[run]);
    if (tc->norm.dx) {
        expect_close("dx", dx[0], dx0, dx_ref, n, tc->tol);
        expect_same_bits("dx", dx[0], dx[1], n);
    }
    if (tc->norm.dw) {
        expect_close("dw", dw[0], dw0, dw_ref, D, tc->tol);
        expect_same_bits("dw", dw[0], dw[1], D);
    }
    free_pair(dx); free_pair(dw);
    free(x); free(w); free(dout); free(xd); free(wd); free(dod); free(dx_ref); free(dw_ref); free(dx0); free(dw0);
}

/* ---- RoPE ---- */

/* x rotated back on the GPU (after a forward rotation first when `roundtrip`). */
static float *gpu_rope_backward(const grad_case *tc, const float *x, const uint32_t *pos, uint32_t stride,
                                uint32_t col0, bool roundtrip) {
    uint32_t R = tc->rope.R;
    size_t n = (size_t)R * stride;
    vks_buffer *bx = gpu_buffer(x, n * 4), *bp = gpu_buffer(pos, R * 4);
    uint32_t n_pos = tc->rope.max_pos + 1;
    float *table = tu_rope_table(ROPE_THETA, (int)tc->rope.head_dim, (int)n_pos);
    vks_buffer *bf = gpu_buffer(table, (size_t)n_pos * tc->rope.head_dim * 4);
    free(table);
    vks_cmd *c = begin();
    if (roundtrip)
        expect_ok(vks_op_rope(ops, c, bind(bx), bind(bp), bind(bf), n_pos, R, stride, col0, tc->rope.heads,
                              tc->rope.head_dim, tc->rope.mode));
    expect_ok(vks_op_rope_backward(ops, c, bind(bx), bind(bp), bind(bf), n_pos, R, stride, col0, tc->rope.heads,
                                   tc->rope.head_dim, tc->rope.mode));
    submit(c);
    float *got = download_new(bx, n);
    vks_buffer_destroy(bx); vks_buffer_destroy(bp); vks_buffer_destroy(bf);
    return got;
}

/* Heads at column 3 of rows of stride +5: the other columns stay as they were. */
static void run_rope(const grad_case *tc) {
    uint32_t R = tc->rope.R, col0 = 3, stride = col0 + tc->rope.heads * tc->rope.head_dim + 5;
    size_t n = (size_t)R * stride;
    float *x = rand_floats(n, 6, -1, 1);
    uint32_t *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) pos[r] = r == R - 1 ? tc->rope.max_pos : (r * 37u) % (tc->rope.max_pos + 1);
    double *want = to_double(x, n), *orig = to_double(x, n);
    assert_int_equal(vks_ref_rope_backward(want, pos, (int)R, (int)stride, (int)col0, (int)tc->rope.heads,
                                           (int)tc->rope.head_dim, tu_rope_freqs(ROPE_THETA, (int)tc->rope.head_dim),
                                           (int)tc->rope.mode),
                     VKS_OK);
    float *got[2];
    for (int run = 0; run < 2; run++) got[run] = gpu_rope_backward(tc, x, pos, stride, col0, false);
    expect_close("dx", got[0], NULL, want, n, tc->tol);
    expect_same_bits("dx", got[0], got[1], n);
    float *back = gpu_rope_backward(tc, x, pos, stride, col0, true); /* forward then backward: x again */
    expect_close("rope then rope_backward", back, NULL, orig, n, tc->tol);
    free_pair(got);
    free(back); free(x); free(pos); free(want); free(orig);
}

/* ---- attention ---- */

typedef struct {
    uint32_t T, H, KVH, hd;
    size_t nq, nkv, ns;
    float *q, *k, *v, *dout, *dq0, *dk0, *dv0;
    uint32_t *start;
} attn_inputs;

typedef struct { float *out, *row_max, *row_sum, *dq, *dk, *dv; } attn_outputs;

static void attn_outputs_free(attn_outputs *o) {
    free(o->out); free(o->row_max); free(o->row_sum); free(o->dq); free(o->dk); free(o->dv);
}

/* Forward, then backward from its out and statistics (row_max shifted by
 * max_shift before the backward: a planted error that must show). */
static attn_outputs gpu_attention(const attn_inputs *in, bool accumulate, bool sorted, float max_shift) {
    vks_buffer *bq = gpu_buffer(in->q, in->nq * 4), *bk = gpu_buffer(in->k, in->nkv * 4);
    vks_buffer *bv = gpu_buffer(in->v, in->nkv * 4), *bst = gpu_buffer(in->start, in->T * 4);
    vks_buffer *bo = gpu_buffer(NULL, in->nq * 4), *bmax = gpu_buffer(NULL, in->ns * 4);
    vks_buffer *bsum = gpu_buffer(NULL, in->ns * 4), *bdo = gpu_buffer(in->dout, in->nq * 4);
    vks_buffer *bdq = gpu_buffer(in->dq0, in->nq * 4), *bdk = gpu_buffer(in->dk0, in->nkv * 4);
    vks_buffer *bdv = gpu_buffer(in->dv0, in->nkv * 4);
    vks_buffer *bsc = gpu_buffer(NULL, vks_op_attention_train_backward_scratch_bytes(in->T, in->H));
    vks_attention_train a = {in->T, in->H, in->KVH, in->hd, bind(bq), bind(bk), bind(bv), bind(bst),
                             bind(bo), bind(bmax), bind(bsum), sorted};
    vks_cmd *c = begin();
    expect_ok(vks_op_attention_train(ops, c, &a));
    submit(c);
    attn_outputs r = {download_new(bo, in->nq), download_new(bmax, in->ns), download_new(bsum, in->ns), 0, 0, 0};
    if (max_shift != 0.0f) {
        float *shifted = xmalloc(in->ns * 4);
        for (size_t i = 0; i < in->ns; i++) shifted[i] = r.row_max[i] + max_shift;
        assert_int_equal(vks_buffer_upload(bmax, 0, shifted, in->ns * 4), VKS_OK);
        free(shifted);
    }
    c = begin();
    expect_ok(vks_op_attention_train_backward(ops, c, &a, bind(bdo), bind(bdq), bind(bdk), bind(bdv),
                                                     bind(bsc), accumulate));
    submit(c);
    r.dq = download_new(bdq, in->nq);
    r.dk = download_new(bdk, in->nkv);
    r.dv = download_new(bdv, in->nkv);
    vks_buffer *all[] = {bq, bk, bv, bst, bo, bmax, bsum, bdo, bdq, bdk, bdv, bsc};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
    return r;
}

typedef struct { double *out, *row_max, *row_sum, *dq, *dk, *dv; } attn_ref;

static attn_ref ref_attention(const attn_inputs *in) {
    double *q = to_double(in->q, in->nq), *k = to_double(in->k, in->nkv), *v = to_double(in->v, in->nkv);
    double *dout = to_double(in->dout, in->nq);
    attn_ref r = {xcalloc_d(in->nq), xcalloc_d(in->ns), xcalloc_d(in->ns),
                  xcalloc_d(in->nq), xcalloc_d(in->nkv), xcalloc_d(in->nkv)};
    int T = (int)in->T, H = (int)in->H, KVH = (int)in->KVH, hd = (int)in->hd;
    assert_int_equal(vks_ref_attention_forward(q, k, v, in->start, T, H, KVH, hd, r.out, r.row_max, r.row_sum),
                     VKS_OK);
    assert_int_equal(vks_ref_attention_backward(q, k, v, in->start, T, H, KVH, hd, r.row_max, r.row_sum, dout, r.dq,
                                                r.dk, r.dv),
                     VKS_OK);
    free(q); free(k); free(v); free(dout);
    return r;
}

static attn_inputs attention_inputs(const grad_case *tc) {
    attn_inputs in = {.H = tc->attn.heads, .KVH = tc->attn.kv_heads, .hd = tc->attn.head_dim};
    for (int s = 0; s < 3 && tc->attn.seq[s]; s++) in.T += tc->attn.seq[s];
    in.nq = (size_t)in.T * in.H * in.hd;
    in.nkv = (size_t)in.T * in.KVH * in.hd;
    in.ns = (size_t)in.T * in.H;
    in.start = xmalloc(in.T * 4);
    for (uint32_t s = 0, t0 = 0; s < 3 && tc->attn.seq[s]; t0 += tc->attn.seq[s], s++)
        for (uint32_t t = t0; t < t0 + tc->attn.seq[s]; t++) in.start[t] = t0;
    /* q, k in [-2, 2]: scores up to ~hd/sqrt(hd) apart, peaked softmaxes */
    in.q = rand_floats(in.nq, 7, -2, 2);
    in.k = rand_floats(in.nkv, 8, -2, 2);
    in.v = rand_floats(in.nkv, 9, -1, 1);
    in.dout = rand_floats(in.nq, 10, -1, 1);
    return in;
}

static void attn_inputs_free(attn_inputs *in) {
    free(in->q); free(in->k); free(in->v); free(in->dout); free(in->start);
    free(in->dq0); free(in->dk0); free(in->dv0);
}

static void attn_check(const grad_case *tc, const attn_inputs *in, const attn_outputs *g, const attn_ref *r) {
    expect_close("out", g->out, NULL, r->out, in->nq, tc->tol);
    expect_close("row_max", g->row_max, NULL, r->row_max, in->ns, tc->tol);
    expect_close("row_sum", g->row_sum, NULL, r->row_sum, in->ns, tc->tol);
    expect_close("dq", g->dq, in->dq0, r->dq, in->nq, tc->tol);
    expect_close("dk", g->dk, in->dk0, r->dk, in->nkv, tc->tol);
    expect_close("dv", g->dv, in->dv0, r->dv, in->nkv, tc->tol);
}

static void attn_same_bits(const attn_inputs *in, const attn_outputs *a, const attn_outputs *b) {
    expect_same_bits("out", a->out, b->out, in->nq);
    expect_same_bits("row_max", a->row_max, b->row_max, in->ns);
    expect_same_bits("row_sum", a->row_sum, b->row_sum, in->ns);
    expect_same_bits("dq", a->dq, b->dq, in->nq);
    expect_same_bits("dk", a->dk, b->dk, in->nkv);
    expect_same_bits("dv", a->dv, b->dv, in->nkv);
}

/* max |got - want| / max |want| */
static double rel_error(const float *got, const double *want, size_t n) {
    double err = 0.0;
    for (size_t i = 0; i < n; i++) err = fmax(err, fabs(got[i] - want[i]));
    return err / max_abs(want, n);
}

static void run_attention(const grad_case *tc) {
    attn_inputs in = attention_inputs(tc);
    attn_ref r = ref_attention(&in);
    if (tc->attn.accumulate) {
        in.dq0 = old_values(in.nq, 11, r.dq);
        in.dk0 = old_values(in.nkv, 12, r.dk);
        in.dv0 = old_values(in.nkv, 13, r.dv);
    }
    attn_outputs g[2];
    for (int run = 0; run < 2; run++) g[run] = gpu_attention(&in, tc->attn.accumulate, tc->attn.sorted, 0.0f);
    attn_check(tc, &in, &g[0], &r);
    attn_same_bits(&in, &g[0], &g[1]);
    if (tc->attn.check_stats) { /* the backward reads the statistics: a shifted max is seen */
        attn_outputs bad = gpu_attention(&in, false, tc->attn.sorted, 0.01f);
        double e = rel_error(bad.dv, r.dv, in.nkv);
        fprintf(stderr, "  dv with row_max + 0.01: error %.3g (must exceed %.3g)\n", e, tc->tol);
        assert_true(e > 100 * tc->tol);
        attn_outputs_free(&bad);
    }
    attn_outputs_free(&g[0]); attn_outputs_free(&g[1]);
    free(r.out); free(r.row_max); free(r.row_sum); free(r.dq); free(r.dk); free(r.dv);
    attn_inputs_free(&in);
}

/* ---- SwiGLU ---- */

typedef struct { const float *g, *u, *dout, *dg0, *du0; } swiglu_inputs;

/* The forward with out apart from g (g and u must survive it), then the backward. */
static void gpu_swiglu_backward(const grad_case *tc, const swiglu_inputs *in, float **dg, float **du) {
    uint32_t n = tc->swiglu.n;
    vks_buffer *bg = gpu_buffer(in->g, n * 4), *bu = gpu_buffer(in->u, n * 4), *bo = gpu_buffer(NULL, n * 4);
    vks_buffer *bdo = gpu_buffer(in->dout, n * 4);
    bool in_place = tc->swiglu.in_place;
    vks_buffer *bdg = in_place ? bg : gpu_buffer(in->dg0, n * 4), *bdu = in_place ? bu : gpu_buffer(in->du0, n * 4);
    vks_cmd *c = begin();
    expect_ok(vks_op_swiglu(ops, c, bind(bg), bind(bu), bind(bo), n));
    submit(c);
    float *g_after = download_new(bg, n), *u_after = download_new(bu, n);
    assert_memory_equal(g_after, in->g, n * 4);
    assert_memory_equal(u_after, in->u, n * 4);
    free(g_after); free(u_after);
    c = begin();
    expect_ok(vks_op_swiglu_backward(ops, c, bind(bg), bind(bu), bind(bdo), bind(bdg), bind(bdu), n,
                                            tc->swiglu.accumulate));
    submit(c);
    *dg = download_new(bdg, n);
    *du = download_new(bdu, n);
    vks_buffer_destroy(bg); vks_buffer_destroy(bu); vks_buffer_destroy(bo); vks_buffer_destroy(bdo);
    if (!in_place) { vks_buffer_destroy(bdg); vks_buffer_destroy(bdu); }
}

static void run_swiglu(const grad_case *tc) {
    uint32_t n = tc->swiglu.n;
    float *g = rand_floats(n, 14, -6, 6), *u = rand_floats(n, 15, -2, 2), *dout = rand_floats(n, 16, -1, 1);
    double *gd = to_double(g, n), *ud = to_double(u, n), *dod = to_double(dout, n);
    double *dg_ref = xcalloc_d(n), *du_ref = xcalloc_d(n);
    assert_int_equal(vks_ref_swiglu_backward(gd, ud, n, dod, dg_ref, du_ref), VKS_OK);
    float *dg0 = tc->swiglu.accumulate ? old_values(n, 17, dg_ref) : NULL;
    float *du0 = tc->swiglu.accumulate ? old_values(n, 18, du_ref) : NULL;
    swiglu_inputs in = {g, u, dout, dg0, du0};
    float *dg[2], *du[2];
    for (int run = 0; run < 2; run++) gpu_swiglu_backward(tc, &in, &dg[run], &du[run]);
    expect_close("dg", dg[0], dg0, dg_ref, n, tc->tol);
    expect_close("du", du[0], du0, du_ref, n, tc->tol);
    expect_same_bits("dg", dg[0], dg[1], n);
    expect_same_bits("du", du[0], du[1], n);
    free_pair(dg); free_pair(du);
    free(g); free(u); free(dout); free(gd); free(ud); free(dod); free(dg_ref); free(du_ref); free(dg0); free(du0);
}

/* ---- token log-probability ---- */

typedef struct { const float *logits, *dlogp, *dlogits0; const int32_t *target; } logprob_inputs;

static void gpu_logprob(const grad_case *tc, const logprob_inputs *in, float **logp, float **dlogits) {
    uint32_t R = tc->logprob.R, V = tc->logprob.V;
    size_t n = (size_t)R * V;
    vks_buffer *bl = gpu_buffer(in->logits, n * 4), *bt = gpu_buffer(in->target, R * 4);
    vks_buffer *blp = gpu_buffer(NULL, R * 4), *bdlp = gpu_buffer(in->dlogp, R * 4);
    vks_buffer *bdl = tc->logprob.in_place ? bl : gpu_buffer(in->dlogits0, n * 4);
    vks_cmd *c = begin();
    expect_ok(vks_op_token_logprob(ops, c, bind(bl), bind(bt), bind(blp), R, V));
    expect_ok(vks_op_token_logprob_backward(ops, c, bind(bl), bind(bt), bind(bdlp), bind(bdl), R, V,
                                                   tc->logprob.accumulate));
    submit(c);
    *logp = download_new(blp, R);
    *dlogits = download_new(bdl, n);
    vks_buffer_destroy(bl); vks_buffer_destroy(bt); vks_buffer_destroy(blp); vks_buffer_destroy(bdlp);
    if (bdl != bl) vks_buffer_destroy(bdl);
}

/* Every 5th row has no target (-1); bad_target: rows 1 and 2 point past V. */
static int32_t *logprob_targets(const grad_case *tc) {
    uint32_t R = tc->logprob.R, V = tc->logprob.V;
    int32_t *t = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) t[r] = r % 5 == 4 ? -1 : (int32_t)((r * 7919u + 13u) % V);
    if (tc->logprob.bad_target) { t[1] = (int32_t)V; t[2] = (int32_t)V + 1000; }
    return t;
}

static bool valid_target(int32_t t, uint32_t V) { return t >= 0 && (uint32_t)t < V; }

/* The reference row by row: rows without a valid target stay 0. */
static void ref_logprob(const grad_case *tc, const float *logits, const int32_t *target, const float *dlogp,
                        double *logp, double *dlogits) {
    uint32_t V = tc->logprob.V;
    double *row = xmalloc(V * sizeof *row);
    for (uint32_t r = 0; r < tc->logprob.R; r++) {
        if (!valid_target(target[r], V)) continue;
        for (uint32_t j = 0; j < V; j++) row[j] = logits[(size_t)r * V + j];
        uint32_t t = (uint32_t)target[r];
        double dl = dlogp[r];
        assert_int_equal(vks_ref_token_logprob_forward(row, 1, (int)V, &t, &logp[r]), VKS_OK);
        assert_int_equal(vks_ref_token_logprob_backward(row, 1, (int)V, &t, &dl, dlogits + (size_t)r * V), VKS_OK);
    }
    free(row);
}

/* Rows with a target >= V come back as NaN (logp and the whole gradient row);
 * they are checked and then set to the expected old + 0, so that the rest
 * of the checks see finite values. */
static void expect_bad_rows_nan(const grad_case *tc, const int32_t *target, float *logp, float *dlogits,
                                const float *dlogits0) {
    uint32_t V = tc->logprob.V;
    for (uint32_t r = 0; r < tc->logprob.R; r++) {
        if (target[r] < 0 || valid_target(target[r], V)) continue;
        assert_true(isnan(logp[r]));
        logp[r] = 0.0f;
        for (uint32_t j = 0; j < V; j++) {
            assert_true(isnan(dlogits[(size_t)r * V + j]));
            dlogits[(size_t)r * V + j] = dlogits0 ? dlogits0[(size_t)r * V + j] : 0.0f;
        }
    }
}

static void run_logprob(const grad_case *tc) {
    uint32_t R = tc->logprob.R, V = tc->logprob.V;
    size_t n = (size_t)R * V;
    float *logits = rand_floats(n, 19, -10, 10), *dlogp = rand_floats(R, 20, -1, 1);
    int32_t *target = logprob_targets(tc);
    double *logp_ref = xcalloc_d(R), *dl_ref = xcalloc_d(n);
    ref_logprob(tc, logits, target, dlogp, logp_ref, dl_ref);
    float *dl0 = tc->logprob.accumulate ? old_values(n, 21, dl_ref) : NULL;
    logprob_inputs in = {logits, dlogp, dl0, target};
    float *logp[2], *dl[2];
    for (int run = 0; run < 2; run++) gpu_logprob(tc, &in, &logp[run], &dl[run]);
    expect_same_bits("logp", logp[0], logp[1], R); /* before the NaN rows are replaced */
    expect_same_bits("dlogits", dl[0], dl[1], n);
    expect_bad_rows_nan(tc, target, logp[0], dl[0], dl0);
    expect_close("logp", logp[0], NULL, logp_ref, R, tc->tol);
    expect_close("dlogits", dl[0], dl0, dl_ref, n, tc->tol);
    for (uint32_t r = 0; r < R; r++) /* no target: exactly 0 / exactly the old values */
        if (target[r] < 0) {
            assert_true(logp[0][r] == 0.0f);
            for (uint32_t j = 0; j < V; j++)
                assert_true(dl[0][(size_t)r * V + j] == (dl0 ? dl0[(size_t)r * V + j] : 0.0f));
        }
    free_pair(logp); free_pair(dl);
    free(logits); free(dlogp); free(target); free(logp_ref); free(dl_ref); free(dl0);
}

/* ---- the entropy bonus: token_entropy, token_logprob_entropy_backward ---- */

typedef struct { float *logp, *dlogits, *entropy, *entropy_only; } entropy_out;

/* The forward, the entropy alone (read before the backward may overwrite the
 * logits), and the backward with the entropy term, in one command buffer. */
static void gpu_logprob_entropy(const grad_case *tc, const logprob_inputs *in, const float *dent, entropy_out *out) {
    uint32_t R = tc->logprob.R, V = tc->logprob.V;
    size_t n = (size_t)R * V;
    vks_buffer *bl = gpu_buffer(in->logits, n * 4), *bt = gpu_buffer(in->target, R * 4);
    vks_buffer *blp = gpu_buffer(NULL, R * 4), *bdlp = gpu_buffer(in->dlogp, R * 4), *bde = gpu_buffer(dent, R * 4);
    vks_buffer *bh = gpu_buffer(NULL, R * 4), *bh_only = gpu_buffer(NULL, R * 4);
    vks_buffer *bdl = tc->logprob.in_place ? bl : gpu_buffer(in->dlogits0, n * 4);
    vks_cmd *c = begin();
    expect_ok(vks_op_token_logprob(ops, c, bind(bl), bind(bt), bind(blp), R, V));
    expect_ok(vks_op_token_entropy(ops, c, bind(bl), bind(bt), bind(bh_only), R, V));
    expect_ok(vks_op_token_logprob_entropy_backward(ops, c, bind(bl), bind(bt), bind(bdlp), bind(bde), bind(bdl),
                                                    bind(bh), R, V, tc->logprob.accumulate));
    submit(c);
    out->logp = download_new(blp, R);
    out->dlogits = download_new(bdl, n);
    out->entropy = download_new(bh, R);
    out->entropy_only = download_new(bh_only, R);
    vks_buffer_destroy(bl); vks_buffer_destroy(bt); vks_buffer_destroy(blp); vks_buffer_destroy(bdlp);
    vks_buffer_destroy(bde); vks_buffer_destroy(bh); vks_buffer_destroy(bh_only);
    if (bdl != bl) vks_buffer_destroy(bdl);
}

static void entropy_out_free(entropy_out *o) { free(o->logp); free(o->dlogits); free(o->entropy); free(o->entropy_only); }

/* Rows with a target >= V have entropy NaN: checked, then set to 0. */
static void expect_bad_entropy_nan(const grad_case *tc, const int32_t *target, float *h) {
    for (uint32_t r = 0; r < tc->logprob.R; r++) {
        if (target[r] < 0 || valid_target(target[r], tc->logprob.V)) continue;
        assert_true(isnan(h[r]));
        h[r] = 0.0f;
    }
}

/* dentropy: random, 0 on every third row (a masked row: exactly the plain
 * backward's bits there, which the plain op run on the same inputs shows). */
static void run_logprob_entropy(const grad_case *tc) {
    uint32_t R = tc->logprob.R, V = tc->logprob.V;
    size_t n = (size_t)R * V;
    float *logits = rand_floats(n, 19, -10, 10), *dlogp = rand_floats(R, 20, -1, 1), *dent = rand_floats(R, 22, -1, 1);
    for (uint32_t r = 0; r < R; r++)
        if (r % 3 == 2) dent[r] = 0.0f;
    int32_t *target = logprob_targets(tc);
    double *logp_ref = xcalloc_d(R), *dl_ref = xcalloc_d(n), *h_ref = xcalloc_d(R), *row = xmalloc(V * sizeof *row);
    ref_logprob(tc, logits, target, dlogp, logp_ref, dl_ref);
    for (uint32_t r = 0; r < R; r++) { /* the entropy term on rows with a valid target */
        if (!valid_target(target[r], V)) continue;
        for (uint32_t j = 0; j < V; j++) row[j] = logits[(size_t)r * V + j];
        double de = dent[r];
        assert_int_equal(vks_ref_token_entropy_forward(row, 1, (int)V, &h_ref[r]), VKS_OK);
        assert_int_equal(vks_ref_token_entropy_backward(row, 1, (int)V, &de, dl_ref + (size_t)r * V), VKS_OK);
    }
    float *dl0 = tc->logprob.accumulate ? old_values(n, 21, dl_ref) : NULL;
    logprob_inputs in = {logits, dlogp, dl0, target};
    float *plain_logp, *plain_dl;
    gpu_logprob(tc, &in, &plain_logp, &plain_dl);
    entropy_out o[2];
    for (int run = 0; run < 2; run++) gpu_logprob_entropy(tc, &in, dent, &o[run]);
    expect_same_bits("dlogits", o[0].dlogits, o[1].dlogits, n);
    expect_same_bits("entropy", o[0].entropy, o[1].entropy, R);
    expect_same_bits("entropy alone", o[0].entropy_only, o[1].entropy_only, R);
    expect_same_bits("logp", o[0].logp, plain_logp, R);
    int zero_rows = 0;
    for (uint32_t r = 0; r < R; r++) /* no bonus on the row: the plain backward's bits (NaN rows too) */
        if (dent[r] == 0.0f) {
            zero_rows++;
            if (memcmp(o[0].dlogits + (size_t)r * V, plain_dl + (size_t)r * V, V * sizeof(float)) != 0)
                fail_msg("row %u with dentropy 0 differs from token_logprob_backward's", r);
        }
    assert_true(zero_rows > 0 || R < 3);
    expect_bad_rows_nan(tc, target, o[0].logp, o[0].dlogits, dl0);
    expect_bad_entropy_nan(tc, target, o[0].entropy);
    expect_bad_entropy_nan(tc, target, o[0].entropy_only);
    expect_close("dlogits", o[0].dlogits, dl0, dl_ref, n, tc->tol);
    expect_close("entropy", o[0].entropy, NULL, h_ref, R, tc->tol);
    expect_close("entropy alone", o[0].entropy_only, NULL, h_ref, R, tc->tol);
    for (uint32_t r = 0; r < R; r++) /* no target: entropy exactly 0, dlogits exactly the old values */
        if (target[r] < 0) {
            assert_true(o[0].entropy[r] == 0.0f && o[0].entropy_only[r] == 0.0f);
            for (uint32_t j = 0; j < V; j++)
                assert_true(o[0].dlogits[(size_t)r * V + j] == (dl0 ? dl0[(size_t)r * V + j] : 0.0f));
        }
    entropy_out_free(&o[0]); entropy_out_free(&o[1]);
    free(plain_logp); free(plain_dl);
    free(logits); free(dlogp); free(dent); free(target); free(logp_ref); free(dl_ref); free(h_ref); free(row); free(dl0);
}

/* ---- argument checking ---- */

static void run_bad_args(const grad_case *tc) {
    (void)tc;
    enum { NB = 12 };
    vks_buffer *buf[NB], *small = gpu_buffer(NULL, 128);
    vks_binding b[NB], none = {0};
    for (int i = 0; i < NB; i++) {
        buf[i] = gpu_buffer(NULL, 1 << 16);
        b[i] = bind(buf[i]);
    }
    vks_cmd *c = begin();
    /* rmsnorm: nothing wanted; dw without scratch; dx range too small; dx over dout */
    expect_arg_error(vks_op_rmsnorm_backward(ops, c, b[0], b[1], b[2], none, none, none, 4, 4, 1e-5f, false));
    expect_arg_error(vks_op_rmsnorm_backward(ops, c, b[0], b[1], b[2], none, b[3], none, 4, 4, 1e-5f, false));
    expect_arg_error(vks_op_rmsnorm_backward(ops, c, b[0], b[1], b[2], bind(small), none, none, 8, 8, 1e-5f, false));
    expect_ok(vks_op_rmsnorm_backward(ops, c, b[0], b[1], b[2], b[3], b[4], b[5], 8, 8, 1e-5f, false));
    expect_arg_error(vks_op_rmsnorm_backward(ops, c, b[0], b[1], b[2], b[2], b[4], b[5], 8, 8, 1e-5f, false));
    /* rope_backward: odd head_dim */
    expect_arg_error(vks_op_rope_backward(ops, c, b[0], b[1], b[2], 1, 1, 8, 0, 1, 7, VKS_ROPE_ADJACENT));
    /* attention: head_dim past 128, T past the limit, heads not a multiple of kv heads, short q */
    vks_attention_train a = {4, 2, 1, 129, b[0], b[1], b[2], b[3], b[4], b[5], b[6], false};
    expect_arg_error(vks_op_attention_train(ops, c, &a));
    a.head_dim = 128;
    expect_ok(vks_op_attention_train(ops, c, &a));
    a.T = VKS_ATTENTION_TRAIN_MAX_T + 1;
    expect_arg_error(vks_op_attention_train(ops, c, &a));
    a.T = 4;
    a.n_heads = 3;
    a.n_kv_heads = 2;
    expect_arg_error(vks_op_attention_train(ops, c, &a));
    a.n_heads = 2;
    a.n_kv_heads = 1;
    a.q = bind(small);
    expect_arg_error(vks_op_attention_train(ops, c, &a));
    a.q = b[0];
    a.out = b[0]; /* out over q */
    expect_arg_error(vks_op_attention_train(ops, c, &a));
    a.out = b[4];
    a.head_dim = 8;
    /* backward: 3 x 4 x 2 floats of scratch fit 128 bytes, 3 x 16 x 2 do not; dq over q; dk over dv */
    expect_ok(vks_op_attention_train_backward(ops, c, &a, b[7], b[8], b[9], b[10], bind(small), false));
    a.T = 16;
    expect_arg_error(vks_op_attention_train_backward(ops, c, &a, b[7], b[8], b[9], b[10], bind(small), false));
    expect_arg_error(vks_op_attention_train_backward(ops, c, &a, b[7], b[0], b[9], b[10], b[11], false));
    expect_arg_error(vks_op_attention_train_backward(ops, c, &a, b[7], b[8], b[9], b[9], b[11], false));
    /* swiglu_backward: zero length, short du, dg over du, dg over g only without accumulate */
    expect_arg_error(vks_op_swiglu_backward(ops, c, b[0], b[1], b[2], b[3], b[4], 0, false));
    expect_arg_error(vks_op_swiglu_backward(ops, c, b[0], b[1], b[2], b[3], bind(small), 33, false));
    expect_arg_error(vks_op_swiglu_backward(ops, c, b[0], b[1], b[2], b[3], b[3], 33, false));
    expect_ok(vks_op_swiglu_backward(ops, c, b[0], b[1], b[2], b[0], b[1], 33, false));
    expect_arg_error(vks_op_swiglu_backward(ops, c, b[0], b[1], b[2], b[0], b[1], 33, true));
    /* token_logprob: empty vocabulary, logits too short, dlogits over logits only without accumulate */
    expect_arg_error(vks_op_token_logprob(ops, c, b[0], b[1], b[2], 2, 0));
    expect_arg_error(vks_op_token_logprob_backward(ops, c, bind(small), b[1], b[2], b[3], 2, 17, false));
    expect_ok(vks_op_token_logprob_backward(ops, c, b[0], b[1], b[2], b[0], 2, 17, false));
    expect_arg_error(vks_op_token_logprob_backward(ops, c, b[0], b[1], b[2], b[0], 2, 17, true));
    /* token_entropy: empty vocabulary, short output, output over the logits */
    expect_arg_error(vks_op_token_entropy(ops, c, b[0], b[1], b[2], 2, 0));
    expect_arg_error(vks_op_token_entropy(ops, c, b[0], b[1], bind(small), 64, 17));
    expect_arg_error(vks_op_token_entropy(ops, c, b[0], b[1], b[0], 2, 17));
    expect_ok(vks_op_token_entropy(ops, c, b[0], b[1], b[2], 2, 17));
    /* the entropy backward: short dentropy, entropy over dlogits / dentropy / the logits, dlogits over
     * dentropy, dlogits over the logits only without accumulate */
    expect_ok(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[4], b[5], 2, 17, true));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], bind(small), b[4], b[5], 64, 17, false));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[4], b[4], 2, 17, false));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[4], b[3], 2, 17, false));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[4], b[0], 2, 17, false));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[3], b[5], 2, 17, false));
    expect_ok(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[0], b[5], 2, 17, false));
    expect_arg_error(vks_op_token_logprob_entropy_backward(ops, c, b[0], b[1], b[2], b[3], b[0], b[5], 2, 17, true));
    vks_cmd_discard(c);
    for (int i = 0; i < NB; i++) vks_buffer_destroy(buf[i]);
    vks_buffer_destroy(small);
}

/* ---- the table ---- */

/* Tolerances, as max |error| / max |reference delta|, from f32 rounding
 * (unit roundoff u = 6e-8):
 * - RMSNorm: a row's dx combines two D-term sums (x.x, g.x); dw sums R terms
 *   in two levels; the errors stay within a few hundred u even at D 256 and
 *   R 300 (measured: see VKSWARM_TEST_VERBOSE=1).
 * - RoPE: the angle pos * theta^(-2i/hd) is formed in f32 from an f32
 *   exponent: at pos 300 it is off by up to ~300 * 1e-6 rad.
 * - attention: scores (hd-term dots of values up to 2), exponentials and
 *   sums over up to T keys, in f32; dk/dv sum over up to T query rows.
 * - token log-probability: log-sum-exp over V terms, relative to ~|logit|. */
#define NORM(nm, r, d, want_dx, want_dw, acc) \
    {nm, run_rmsnorm, .norm = {.R = r, .D = d, .dx = want_dx, .dw = want_dw, .accumulate = acc}, .tol = 5e-6}
#define ROPE(nm, r, h, hd, maxp, md) \
    {nm, run_rope, .rope = {.R = r, .heads = h, .head_dim = hd, .max_pos = maxp, .mode = md}, .tol = 5e-4}
#define ATTN_(nm, h, kh, hd, s0, s1, s2, acc, stats, srt, is_slow) \
    {nm, run_attention, .attn = {.heads = h, .kv_heads = kh, .head_dim = hd, .seq = {s0, s1, s2}, .accumulate = acc, \
                                 .check_stats = stats, .sorted = srt}, .tol = 2e-5, .slow = is_slow}
#define ATTN(nm, h, kh, hd, s0, s1, s2, acc, stats, srt) ATTN_(nm, h, kh, hd, s0, s1, s2, acc, stats, srt, false)
/* The two long attention cases take ~90% of the suite, in the GPU kernel (the
 * host code and the float64 reference run the same paths at T 300 hd 8):
 * VKSWARM_TEST_SHORT (tools/test's ASan run) leaves them to the normal build. */
#define ATTN_SLOW(nm, h, kh, hd, s0, s1, s2, acc, stats, srt) ATTN_(nm, h, kh, hd, s0, s1, s2, acc, stats, srt, true)
#define SWIGLU(nm, count, acc, inplace) \
    {nm, run_swiglu, .swiglu = {.n = count, .accumulate = acc, .in_place = inplace}, .tol = 2e-6}
#define LOGPROB(nm, r, v, acc, inplace, bad) \
    {nm, run_logprob, .logprob = {.R = r, .V = v, .accumulate = acc, .in_place = inplace, .bad_target = bad}, \
     .tol = 2e-6}

/* The entropy: a second V-term sum (p log p) after the log-sum-exp; relative to ~log V. */
#define ENTROPY(nm, r, v, acc, inplace, bad) \
    {nm, run_logprob_entropy, .logprob = {.R = r, .V = v, .accumulate = acc, .in_place = inplace, .bad_target = bad}, \
     .tol = 2e-6}

static const grad_case cases[] = {
    NORM("rmsnorm_backward D1", 3, 1, true, true, false),
    NORM("rmsnorm_backward D7 accumulate", 7, 7, true, true, true),
    NORM("rmsnorm_backward D67", 67, 67, true, true, false),
    NORM("rmsnorm_backward D256 R300 accumulate", 300, 256, true, true, true),
    NORM("rmsnorm_backward dx only", 5, 173, true, false, false),
    NORM("rmsnorm_backward dw only R129", 129, 67, false, true, false),
    ROPE("rope_backward adjacent hd8", 7, 3, 8, 300, VKS_ROPE_ADJACENT),
    ROPE("rope_backward half hd64", 9, 2, 64, 300, VKS_ROPE_HALF),
    ROPE("rope_backward adjacent hd128", 67, 4, 128, 1023, VKS_ROPE_ADJACENT),
    ROPE("rope_backward half hd128", 5, 4, 128, 300, VKS_ROPE_HALF),
    ROPE("rope_backward half hd2 one row", 1, 1, 2, 5, VKS_ROPE_HALF),
    ATTN("attention T1 hd8", 2, 2, 8, 1, 0, 0, false, false, false),
    ATTN("attention T5 two seqs hd32 gqa2 sorted", 4, 2, 32, 2, 3, 0, false, true, true),
    ATTN("attention T67 three seqs hd64 gqa4 accumulate", 4, 1, 64, 30, 20, 17, true, false, false),
    ATTN("attention T67 hd38 gqa1 sorted", 2, 2, 38, 67, 0, 0, false, false, true),
    ATTN_SLOW("attention T300 two seqs hd128 gqa2 sorted", 4, 2, 128, 173, 127, 0, false, false, true),
    ATTN("attention T300 three seqs hd8 gqa4 accumulate sorted", 4, 1, 8, 100, 150, 50, true, false, true),
    ATTN_SLOW("attention T1024 hd32 gqa2 sorted", 2, 1, 32, 1024, 0, 0, false, false, true),
    SWIGLU("swiglu_backward n1", 1, false, false),
    SWIGLU("swiglu_backward n7 accumulate", 7, true, false),
    SWIGLU("swiglu_backward n100003", 100003, false, false),
    SWIGLU("swiglu_backward in place", 1000, false, true),
    LOGPROB("token_logprob V259", 17, 259, false, false, false),
    LOGPROB("token_logprob V259 accumulate", 7, 259, true, false, false),
    LOGPROB("token_logprob V32000 in place", 9, 32000, false, true, false),
    LOGPROB("token_logprob V32000 accumulate", 5, 32000, true, false, false),
    LOGPROB("token_logprob V1 one row", 1, 1, false, false, false),
    LOGPROB("token_logprob V262144", 3, 262144, false, false, false),
    LOGPROB("token_logprob targets past V", 5, 259, true, false, true),
    ENTROPY("token_entropy V259", 17, 259, false, false, false),
    ENTROPY("token_entropy V67 R13 accumulate", 13, 67, true, false, false),
    ENTROPY("token_entropy V32000 in place", 9, 32000, false, true, false),
    ENTROPY("token_entropy V1 one row", 1, 1, false, false, false),
    ENTROPY("token_entropy V2 R4 in place", 4, 2, false, true, false),
    ENTROPY("token_entropy V262144", 3, 262144, false, false, false),
    ENTROPY("token_entropy targets past V", 5, 259, true, false, true),
    {"bad arguments", run_bad_args, .tol = 0},
};

/* ---- cmocka glue ---- */

static int group_setup(void **state) {
    (void)state;
    vks_gpu_options opt = {.device_index = -1, .validation = getenv("VKSWARM_VALIDATION") != NULL};
    if (vks_gpu_create(&opt, &gpu) != VKS_OK) {
        fprintf(stderr, "vks_gpu_create: %s\n", vks_last_error());
        return -1;
    }
    if (vks_ops_create(gpu, &ops) != VKS_OK) return -1;
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
    double t0 = vks_seconds_now();
    tc->run(tc);
    if (getenv("VKSWARM_TEST_VERBOSE")) fprintf(stderr, "  %.2f s\n", vks_seconds_now() - t0);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

int main(void) {
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    struct CMUnitTest tests[N_CASES];
    size_t n = 0;
    for (size_t i = 0; i < N_CASES; i++) {
        if (cases[i].slow && tu_test_short()) {
            fprintf(stderr, "VKSWARM_TEST_SHORT: left out: %s\n", cases[i].name);
            continue;
        }
        if (tu_case_skipped(cases[i].name)) continue;
        tests[n++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    }
    return _cmocka_run_group_tests("grad_layer", tests, n, group_setup, group_teardown);
}
