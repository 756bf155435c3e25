/* test_ops: every GPU op against its vks_ref_* reference, table-driven.
 * Each table row is one cmocka test; adding a shape or an op is one row.
 * Outputs are poisoned with NaN before each run; any NaN/Inf fails. */
#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_gpu.h"
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_philox.h"
#include "vkswarm/vks_ref.h"

#define NAN_POISON 0x7fc00000u

static vks_gpu *gpu;
static vks_ops *ops;

/* One table row: a name, its runner, the NMSE limit and the shape of the op
 * family the runner tests. The runner is the tag: it reads only its family's
 * member of the union (each runner documents its fields). */
typedef struct op_case op_case;
typedef void (*op_runner)(const op_case *tc);
struct op_case {
    const char *name;
    op_runner run;
    double tol;                /* nmse threshold */
    union {
        struct { uint32_t M, N, K; vks_dtype dtype; bool accumulate_window, half_exact; } matmul;
        struct {
            uint32_t M, K, N[3]; int parts; vks_dtype dtype; vks_matmul_kind kind; bool accumulate;
            int path; /* MV_GPU, MV_SHARED: decode through the matvec kernels (run_matmul_multi) */
            bool mixed; vks_dtype dtype_rest; /* mixed: products 1, 2 of dtype_rest */
        } multi;
        struct { uint32_t M, N, K; vks_dtype dtype; vks_matmul_kind kind; float x_range; } swiglu_mm;
        struct { uint32_t tokens, dim, vocab; vks_dtype dtype; bool chunk; } embed;
        struct { uint32_t R, D; bool in_place; } rows;       /* rmsnorm, bias_add */
        struct { uint32_t R, heads, head_dim, max_pos, mode; } rope;
        struct { uint32_t R, kv_dim, seq_len; } kv_store;
        struct { uint32_t R, heads, kv_heads, head_dim, seq_len, mode; } rope_kv;
        struct { uint32_t heads, kv_heads, head_dim, seq_len, decode_rows; } attention;
        struct { uint32_t n; bool in_place; } elementwise;   /* swiglu, add */
        struct { uint32_t R, D, src_rows; } gather;
        struct {
            uint32_t S, V; float temperature; uint32_t top_k; float top_p; bool ties, near_one;
            /* split: also vks_op_sample_split at W workgroups per row (VKS_AUTO_W: vks_op_sample_groups),
             * token for token against vks_op_sample; mixed: rows cycle greedy / the row's settings /
             * no top-k / no top-p; nans: every 97th logit NaN, every 89th -inf; infs: every 5th row
             * has +inf logits (every 1009th); seed: of the logits; VKS_SWEEP_W: split at W = 1 to 64 */
            uint32_t split; bool mixed, nans, infs; uint64_t seed;
            int serial_scan; /* 1 / 2: an ops of its own with VKSWARM_SAMPLE_SERIAL_SCAN 0 / 1 (0: the device's) */
        } sample;
    };
};

/* ---- small helpers ---- */

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

static vks_buffer *gpu_buffer(const void *src, size_t bytes) {
    vks_buffer *b;
    assert_int_equal(vks_buffer_create(gpu, bytes, &b), VKS_OK);
    if (src) assert_int_equal(vks_buffer_upload(b, 0, src, bytes), VKS_OK);
    else assert_int_equal(vks_buffer_fill(b, NAN_POISON), VKS_OK);
    return b;
}

static vks_binding bind(vks_buffer *b) { return (vks_binding){b, 0, 0}; }

static void download(vks_buffer *b, void *dst, size_t bytes) {
    assert_int_equal(vks_buffer_download(b, 0, dst, bytes), VKS_OK);
}

static vks_cmd *begin(void) {
    vks_cmd *c;
    assert_int_equal(vks_cmd_begin(gpu, &c), VKS_OK);
    return c;
}

static void submit(vks_cmd *c) { assert_int_equal(vks_cmd_submit(c), VKS_OK); }

static void expect_close(const char *what, const float *got, const float *want, size_t n,
                         double tol) {
    assert_false(tu_has_nonfinite(got, n));
    double e = tu_nmse(got, want, n);
    if (e > tol || getenv("VKSWARM_TEST_VERBOSE"))
        fprintf(stderr, "%s: nmse %.3g (limit %.3g)\n", what, e, tol);
    assert_true(e <= tol);
}

static vks_buffer *weight_buffer(float *w, size_t rows, size_t cols, vks_dtype t) {
    size_t bytes;
    void *p = tu_pack_weights(w, rows, cols, t, &bytes);
    vks_buffer *b = gpu_buffer(p, bytes);
    free(p);
    return b;
}

/* ---- runners ---- */

/* Half-storage matmul (matmul_*_h): x and W rounded to half (u = 2^-11 each),
 * products and sums in f32, so every term is off by at most about 2u relative
 * and the NMSE of the sums by at most (3u)^2 (the bound of the earlier
 * variant, which also rounded each product to half). */
#define F16_MATH_NMSE (9.0 / (2048.0 * 2048.0))

/* Rounds to a multiple of 2^-10: exact in half for |v| <= 1 (11 bits). */
static void round_to_half_grid(float *v, size_t n) {
    for (size_t i = 0; i < n; i++) v[i] = nearbyintf(v[i] * 1024.0f) / 1024.0f;
}

/* matmul: x [M,K], W [N,K] of dtype. accumulate_window: accumulate into a y of
 * row stride ldy = N + 7 at column 5, whose other columns must stay untouched. */
static void run_matmul(const op_case *tc) {
    uint32_t M = tc->matmul.M, N = tc->matmul.N, K = tc->matmul.K;
    vks_dtype dtype = tc->matmul.dtype;
    bool window = tc->matmul.accumulate_window;
    uint32_t ldy = window ? N + 7 : N, col0 = window ? 5 : 0;
    float *x = rand_floats((size_t)M * K, 1, -1, 1);
    float *w = rand_floats((size_t)N * K, 2, -1, 1);
    /* half_exact: operands exact in half, so the half-storage kernel (f32
     * products of exact operands) meets the f32 tolerance too; products
     * rounded to half would not */
    if (tc->matmul.half_exact) {
        round_to_half_grid(x, (size_t)M * K);
        round_to_half_grid(w, (size_t)N * K);
    }
    vks_buffer *bx = gpu_buffer(x, (size_t)M * K * 4);
    vks_buffer *bw = weight_buffer(w, N, K, dtype);
    size_t ny = (size_t)M * ldy;
    float *y0 = window ? rand_floats(ny, 3, -1, 1) : NULL;
    vks_buffer *by = gpu_buffer(y0, ny * 4);

    vks_cmd *c = begin();
    assert_int_equal(vks_op_matmul(ops, c, bind(bx), bind(bw), dtype, bind(by), M, N, K, ldy,
                                   col0, window),
                     VKS_OK);
    submit(c);

    float *prod = xmalloc((size_t)M * N * 4), *want = xmalloc(ny * 4), *got = xmalloc(ny * 4);
    vks_ref_matmul(x, w, (int)M, (int)N, (int)K, prod);
    for (size_t m = 0; m < M; m++)
        for (size_t j = 0; j < ldy; j++) {
            bool in = j >= col0 && j < col0 + N;
            float base = window ? y0[m * ldy + j] : 0.0f;
            want[m * ldy + j] = base + (in ? prod[m * N + j - col0] : 0.0f);
        }
    download(by, got, ny * 4);
    expect_close(tc->name, got, want, ny, vks_ops_f16_math(ops) && !tc->matmul.half_exact ? F16_MATH_NMSE : tc->tol);
    free(x); free(w); free(y0); free(prod); free(want); free(got);
    vks_buffer_destroy(bx); vks_buffer_destroy(bw); vks_buffer_destroy(by);
}

/* The matvec paths a matmul_multi row can force: MV_GPU the subgroup matvec
 * kernels that GPUs decode with (VKSWARM_MATMUL_DIRECT=0: CPU drivers then
 * decode every type through them), MV_SHARED their shared-memory variant
 * (VKSWARM_NO_SUBGROUP, as well). */
enum { MV_DEFAULT, MV_GPU, MV_SHARED };

/* The suite's ops, or (path) ops of their own made with the path's
 * environment; the caller destroys those. */
/* A variable's value to put back with restore_env after setting it for one
 * vks_ops (a copy, or NULL when unset), so that a copy's own settings survive. */
static char *saved_env(const char *name) {
    const char *v = getenv(name);
    return v ? strdup(v) : NULL;
}

static void restore_env(const char *name, char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
    free(saved);
}

static vks_ops *ops_with_path(int path) {
    if (path == MV_DEFAULT) return ops;
    vks_ops *o;
    char *direct = saved_env("VKSWARM_MATMUL_DIRECT"), *nosg = saved_env("VKSWARM_NO_SUBGROUP");
    setenv("VKSWARM_MATMUL_DIRECT", "0", 1);
    if (path == MV_SHARED) setenv("VKSWARM_NO_SUBGROUP", "1", 1);
    assert_int_equal(vks_ops_create(gpu, &o), VKS_OK);
    restore_env("VKSWARM_MATMUL_DIRECT", direct);
    restore_env("VKSWARM_NO_SUBGROUP", nosg);
    return o;
}

/* Whether decode of dtype takes the 8-row matmul tiles (ops.c: CPU drivers
 * with subgroup broadcasts, DIRECT, f32 arithmetic, f32/f16/bf16/q8_0), not
 * the matvec kernels. */
static bool decode_by_tiles(int path, vks_dtype dtype) {
    const vks_device_info *info = vks_gpu_info(gpu);
    const char *direct = getenv("VKSWARM_MATMUL_DIRECT");
    return path == MV_DEFAULT && info->type == VKS_DEVTYPE_CPU && info->subgroup_arith && info->subgroup_ballot &&
           !getenv("VKSWARM_NO_SUBGROUP") && !(direct && !strcmp(direct, "0")) && !vks_ops_f16_math(ops) &&
           dtype != VKS_DTYPE_Q4_0 && dtype != VKS_DTYPE_Q4_K;
}

/* matmul_multi: parts (2-3) products of one x [M,K] with weights [N_i,K] of
 * dtype, each into its own y. Against the float64 reference, and bit for bit
 * against one vks_op_matmul_kind per product (the fused dispatch must not
 * change any output's bits). main sets VKSWARM_MATMUL_FUSE=1 (fused wherever
 * the kernel allows). accumulate: into y of row stride N_i + 3 at
 * column 2, whose other columns must stay untouched. Prefill then always
 * fuses into one dispatch; decode does where it takes the tiled kernel (CPU
 * drivers, f32/f16/bf16/q8_0) and through the matvec kernels (one dispatch
 * per 8 rows, where those rows' bindings are aligned), and path forces
 * those (MV_GPU, MV_SHARED). mixed: products 1 and 2 of dtype_rest, never
 * fused (one dispatch per product). */
static void run_matmul_multi(const op_case *tc) {
    uint32_t M = tc->multi.M, K = tc->multi.K;
    int n = tc->multi.parts;
    vks_dtype dtype = tc->multi.dtype;
    bool acc = tc->multi.accumulate;
    vks_ops *o = ops_with_path(tc->multi.path);
    float *x = rand_floats((size_t)M * K, 11, -1, 1);
    vks_buffer *bx = gpu_buffer(x, (size_t)M * K * 4);
    float *w[3], *y0[3];
    vks_buffer *bw[3], *fused[3], *alone[3];
    vks_matmul_part p[3];
    for (int i = 0; i < n; i++) {
        uint32_t N = tc->multi.N[i], ldy = acc ? N + 3 : N;
        w[i] = rand_floats((size_t)N * K, 12 + (uint64_t)i, -1, 1);
        vks_dtype t = i && tc->multi.mixed ? tc->multi.dtype_rest : dtype;
        bw[i] = weight_buffer(w[i], N, K, t);
        y0[i] = acc ? rand_floats((size_t)M * ldy, 20 + (uint64_t)i, -1, 1) : NULL;
        fused[i] = gpu_buffer(y0[i], (size_t)M * ldy * 4);
        alone[i] = gpu_buffer(y0[i], (size_t)M * ldy * 4);
        p[i] = (vks_matmul_part){.W = bind(bw[i]), .dtype = t, .y = bind(fused[i]), .N = N, .ldy = ldy,
                                 .y_col0 = acc ? 2 : 0};
    }
    vks_cmd *c = begin();
    vks_cmd_counts k0, k1, k2;
    vks_cmd_counts_get(c, &k0);
    assert_int_equal(vks_op_matmul_multi(o, c, bind(bx), p, n, M, K, acc, tc->multi.kind), VKS_OK);
    vks_cmd_counts_get(c, &k1);
    for (int i = 0; i < n; i++)
        assert_int_equal(vks_op_matmul_kind(o, c, bind(bx), bind(bw[i]), p[i].dtype, bind(alone[i]), M, p[i].N, K, p[i].ldy,
                                            p[i].y_col0, acc, tc->multi.kind), VKS_OK);
    vks_cmd_counts_get(c, &k2);
    submit(c);
    uint64_t n_fused = k1.dispatches - k0.dispatches, n_alone = k2.dispatches - k1.dispatches;
    if (getenv("VKSWARM_TEST_VERBOSE")) fprintf(stderr, "%s: %llu dispatches (alone: %llu)\n", tc->name,
                                                (unsigned long long)n_fused, (unsigned long long)n_alone);
    assert_true(n_fused == 1 || n_fused == n_alone || n_fused == (M + 7) / 8); /* (matvec: per 8 rows) */
    if (tc->multi.mixed) assert_int_equal(n_fused, n_alone);
    else if (tc->multi.kind == VKS_MATMUL_PREFILL || (tc->multi.kind == VKS_MATMUL_AUTO && M > 8))
        assert_int_equal(n_fused, 1);
    const char *fuse = getenv("VKSWARM_MATMUL_FUSE");
    bool decode = tc->multi.kind == VKS_MATMUL_DECODE || (tc->multi.kind == VKS_MATMUL_AUTO && M <= 8);
    if (decode && fuse && !strcmp(fuse, "1") && !tc->multi.mixed && !decode_by_tiles(tc->multi.path, dtype)) {
        /* the matvec kernels: one dispatch per 8 rows (more rows: if every group's bindings are aligned) */
        size_t align = vks_gpu_info(gpu)->min_storage_align ? vks_gpu_info(gpu)->min_storage_align : 1;
        bool aligned = (8 * (size_t)K * 4) % align == 0;
        for (int i = 0; i < n; i++) aligned = aligned && (8 * (size_t)p[i].ldy * 4) % align == 0;
        assert_int_equal(n_fused, M <= 8 || aligned ? (M + 7) / 8 : n_alone);
    }
    for (int i = 0; i < n; i++) {
        uint32_t N = p[i].N, ldy = p[i].ldy, col0 = p[i].y_col0;
        size_t ny = (size_t)M * ldy;
        float *prod = xmalloc((size_t)M * N * 4), *want = xmalloc(ny * 4), *got = xmalloc(ny * 4),
              *ref = xmalloc(ny * 4);
        vks_ref_matmul(x, w[i], (int)M, (int)N, (int)K, prod);
        for (size_t m = 0; m < M; m++)
            for (size_t j = 0; j < ldy; j++) {
                bool in = j >= col0 && j < col0 + N;
                want[m * ldy + j] = (acc ? y0[i][m * ldy + j] : 0.0f) + (in ? prod[m * N + j - col0] : 0.0f);
            }
        download(fused[i], got, ny * 4);
        download(alone[i], ref, ny * 4);
        expect_close(tc->name, got, want, ny, vks_ops_f16_math(o) ? F16_MATH_NMSE : tc->tol);
        if (memcmp(got, ref, ny * 4)) {
            for (size_t e = 0; e < ny; e++)
                if (memcmp(&got[e], &ref[e], 4)) {
                    fprintf(stderr, "%s: product %d element %zu: fused %.9g, alone %.9g\n", tc->name, i, e,
                            (double)got[e], (double)ref[e]);
                    break;
                }
            fail();
        }
        free(prod); free(want); free(got); free(ref);
    }
    for (int i = 0; i < n; i++) {
        free(w[i]); free(y0[i]);
        vks_buffer_destroy(bw[i]); vks_buffer_destroy(fused[i]); vks_buffer_destroy(alone[i]);
    }
    free(x);
    vks_buffer_destroy(bx);
    if (o != ops) vks_ops_destroy(o);
}

/* matmul_swiglu: silu(x Wg^T) * (x Wu^T), x [M,K] in [-x_range, x_range]
 * (1 if 0; large ranges give |g| past exp's range), Wg, Wu [N,K] of dtype.
 * Against the float64 reference, and bit for bit against vks_op_matmul_multi
 * of the two followed by vks_op_swiglu (fused wherever the kernel allows;
 * prefill always is). */
static void run_matmul_swiglu(const op_case *tc) {
    uint32_t M = tc->swiglu_mm.M, N = tc->swiglu_mm.N, K = tc->swiglu_mm.K;
    vks_dtype dtype = tc->swiglu_mm.dtype;
    vks_matmul_kind kind = tc->swiglu_mm.kind;
    float r = tc->swiglu_mm.x_range > 0 ? tc->swiglu_mm.x_range : 1.0f;
    size_t ny = (size_t)M * N;
    float *x = rand_floats((size_t)M * K, 31, -r, r), *wg = rand_floats((size_t)N * K, 32, -1, 1),
          *wu = rand_floats((size_t)N * K, 33, -1, 1);
    vks_buffer *bx = gpu_buffer(x, (size_t)M * K * 4), *bg = weight_buffer(wg, N, K, dtype),
               *bu = weight_buffer(wu, N, K, dtype);
    vks_buffer *y = gpu_buffer(NULL, ny * 4), *scratch = gpu_buffer(NULL, ny * 4), *g = gpu_buffer(NULL, ny * 4),
               *u = gpu_buffer(NULL, ny * 4);
    vks_matmul_part p[2] = {{.W = bind(bg), .dtype = dtype, .y = bind(g), .N = N, .ldy = N},
                            {.W = bind(bu), .dtype = dtype, .y = bind(u), .N = N, .ldy = N}};
    vks_cmd *c = begin();
    vks_cmd_counts k0, k1;
    vks_cmd_counts_get(c, &k0);
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(bx), bind(bg), bind(bu), dtype, bind(y), bind(scratch), M, N, K,
                                          kind), VKS_OK);
    vks_cmd_counts_get(c, &k1);
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(bx), p, 2, M, K, false, kind), VKS_OK);
    assert_int_equal(vks_op_swiglu(ops, c, bind(g), bind(u), bind(g), (uint32_t)ny), VKS_OK);
    submit(c);
    uint64_t n_fused = k1.dispatches - k0.dispatches;
    if (getenv("VKSWARM_TEST_VERBOSE")) fprintf(stderr, "%s: %llu dispatches\n", tc->name, (unsigned long long)n_fused);
    if (kind == VKS_MATMUL_PREFILL || (kind == VKS_MATMUL_AUTO && M > 8)) assert_int_equal(n_fused, 1);
    float *want = xmalloc(ny * 4), *got = xmalloc(ny * 4), *ref = xmalloc(ny * 4);
    vks_ref_matmul_swiglu(x, wg, wu, (int)M, (int)N, (int)K, want);
    download(y, got, ny * 4);
    download(g, ref, ny * 4);
    expect_close(tc->name, got, want, ny, vks_ops_f16_math(ops) ? F16_MATH_NMSE : tc->tol);
    if (memcmp(got, ref, ny * 4)) {
        for (size_t e = 0; e < ny; e++)
            if (memcmp(&got[e], &ref[e], 4)) {
                fprintf(stderr, "%s: element %zu: fused %.9g, matmul_multi + swiglu %.9g\n", tc->name, e,
                        (double)got[e], (double)ref[e]);
                break;
            }
        fail();
    }
    free(x); free(wg); free(wu); free(want); free(got); free(ref);
    vks_buffer_destroy(bx); vks_buffer_destroy(bg); vks_buffer_destroy(bu); vks_buffer_destroy(y);
    vks_buffer_destroy(scratch); vks_buffer_destroy(g); vks_buffer_destroy(u);
}

/* embed: R tokens looked up in a table of V rows of D. chunk: the GPU table is
 * the chunk [row0, row0 + V/2) and rows outside it must keep their old values. */
static void run_embed(const op_case *tc) {
    uint32_t V = tc->embed.vocab, D = tc->embed.dim, R = tc->embed.tokens;
    vks_dtype dtype = tc->embed.dtype;
    bool chunk = tc->embed.chunk;
    uint32_t row0 = chunk ? V / 3 : 0, rows = chunk ? V / 2 : V;
    float *table = rand_floats((size_t)V * D, 4, -2, 2);
    uint32_t *tok = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) tok[r] = (r * 7919u + 13u) % V;
    vks_buffer *bt = gpu_buffer(tok, R * 4);
    /* the GPU table holds rows [row0, row0 + rows) only */
    vks_buffer *btab = weight_buffer(table + (size_t)row0 * D, rows, D, dtype);
    float *old = chunk ? rand_floats((size_t)R * D, 5, -1, 1) : NULL;
    vks_buffer *bo = gpu_buffer(old, (size_t)R * D * 4);

    vks_cmd *c = begin();
    assert_int_equal(vks_op_embed(ops, c, bind(bt), bind(btab), dtype, row0, rows, D,
                                  bind(bo), R), VKS_OK);
    submit(c);

    float *want = xmalloc((size_t)R * D * 4), *got = xmalloc((size_t)R * D * 4);
    vks_ref_embed(table, (int)V, (int)D, tok, (int)R, want);  /* table rows now rounded */
    for (uint32_t r = 0; r < R; r++)
        if (tok[r] < row0 || tok[r] >= row0 + rows)
            memcpy(want + (size_t)r * D, old + (size_t)r * D, D * 4);
    download(bo, got, (size_t)R * D * 4);
    expect_close(tc->name, got, want, (size_t)R * D, tc->tol);
    free(table); free(tok); free(old); free(want); free(got);
    vks_buffer_destroy(bt); vks_buffer_destroy(btab); vks_buffer_destroy(bo);
}

/* rmsnorm: R rows of D, into a fresh buffer or in place. */
static void run_rmsnorm(const op_case *tc) {
    uint32_t R = tc->rows.R, D = tc->rows.D;
    size_t n = (size_t)R * D;
    float *x = rand_floats(n, 6, -3, 3), *w = rand_floats(D, 7, 0.5f, 1.5f);
    vks_buffer *bx = gpu_buffer(x, n * 4), *bw = gpu_buffer(w, D * 4);
    vks_buffer *bo = tc->rows.in_place ? bx : gpu_buffer(NULL, n * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_rmsnorm(ops, c, bind(bx), bind(bw), bind(bo), R, D, 1e-5f), VKS_OK);
    submit(c);
    float *want = xmalloc(n * 4), *got = xmalloc(n * 4);
    vks_ref_rmsnorm(x, w, (int)R, (int)D, 1e-5f, want);
    download(bo, got, n * 4);
    expect_close(tc->name, got, want, n, tc->tol);
    free(x); free(w); free(want); free(got);
    if (bo != bx) vks_buffer_destroy(bo);
    vks_buffer_destroy(bx); vks_buffer_destroy(bw);
}

/* rope: R rows at positions 0..max_pos, heads x head_dim at column 3 of rows of
 * stride +5 (other columns untouched); mode VKS_ROPE_ADJACENT or VKS_ROPE_HALF. */
static void run_rope(const op_case *tc) {
    uint32_t R = tc->rope.R, heads = tc->rope.heads, head_dim = tc->rope.head_dim;
    uint32_t mode = tc->rope.mode, col0 = 3, stride = col0 + heads * head_dim + 5;
    size_t n = (size_t)R * stride;
    float *x = rand_floats(n, 8, -1, 1), *want = xmalloc(n * 4), *got = xmalloc(n * 4);
    uint32_t *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) pos[r] = (r * 37u) % (tc->rope.max_pos + 1);
    vks_buffer *bx = gpu_buffer(x, n * 4), *bp = gpu_buffer(pos, R * 4);
    uint32_t n_pos = tc->rope.max_pos + 1;
    float *table = tu_rope_table(10000.0, (int)head_dim, (int)n_pos);
    vks_buffer *bf = gpu_buffer(table, (size_t)n_pos * head_dim * 4);
    free(table);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_rope(ops, c, bind(bx), bind(bp), bind(bf), n_pos, R, stride, col0, heads, head_dim, mode),
                     VKS_OK);
    submit(c);
    memcpy(want, x, n * 4);
    vks_ref_rope(want, pos, (int)R, (int)stride, (int)col0, (int)heads, (int)head_dim,
                 tu_rope_freqs(10000.0, (int)head_dim), (int)mode);
    download(bx, got, n * 4);
    expect_close(tc->name, got, want, n, tc->tol);
    free(x); free(want); free(got); free(pos);
    vks_buffer_destroy(bx); vks_buffer_destroy(bp); vks_buffer_destroy(bf);
}

/* kv_store: R rows of kv_dim into 3 slots of seq_len; the rest of the caches untouched. */
static void run_kv_store(const op_case *tc) {
    uint32_t R = tc->kv_store.R, kv = tc->kv_store.kv_dim, L = tc->kv_store.seq_len, slots = 3;
    size_t nc = (size_t)slots * L * kv, nr = (size_t)R * kv;
    float *k = rand_floats(nr, 9, -1, 1), *v = rand_floats(nr, 10, -1, 1);
    float *kc = rand_floats(nc, 11, -1, 1), *vc = rand_floats(nc, 12, -1, 1);
    uint32_t *slot = xmalloc(R * 4), *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) { slot[r] = r % slots; pos[r] = (r * 5u) % L; }
    vks_buffer *bk = gpu_buffer(k, nr * 4), *bv = gpu_buffer(v, nr * 4);
    vks_buffer *bkc = gpu_buffer(kc, nc * 4), *bvc = gpu_buffer(vc, nc * 4);
    vks_buffer *bs = gpu_buffer(slot, R * 4), *bp = gpu_buffer(pos, R * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_kv_store(ops, c, bind(bk), bind(bv), bind(bkc), bind(bvc), bind(bs),
                                     bind(bp), R, kv, L), VKS_OK);
    submit(c);
    for (uint32_t r = 0; r < R; r++) {
        size_t dst = ((size_t)slot[r] * L + pos[r]) * kv;
        memcpy(kc + dst, k + (size_t)r * kv, kv * 4);
        memcpy(vc + dst, v + (size_t)r * kv, kv * 4);
    }
    float *got = xmalloc(nc * 4);
    download(bkc, got, nc * 4);
    expect_close("kcache", got, kc, nc, tc->tol);
    download(bvc, got, nc * 4);
    expect_close("vcache", got, vc, nc, tc->tol);
    free(k); free(v); free(kc); free(vc); free(slot); free(pos); free(got);
    vks_buffer_destroy(bk); vks_buffer_destroy(bv); vks_buffer_destroy(bkc);
    vks_buffer_destroy(bvc); vks_buffer_destroy(bs); vks_buffer_destroy(bp);
}

/* rope_kv_store: R rows (heads and kv_heads of head_dim) into 3 slots of
 * seq_len at distinct (slot, pos): q rotated in place and k rotated into the
 * cache against the float64 rope, v copied exactly, the rest of the caches
 * and k untouched; and bit for bit what rope, rope, kv_store give. */
static void run_rope_kv_store(const op_case *tc) {
    uint32_t R = tc->rope_kv.R, hd = tc->rope_kv.head_dim, L = tc->rope_kv.seq_len, mode = tc->rope_kv.mode, slots = 3;
    uint32_t qd = tc->rope_kv.heads * hd, kv = tc->rope_kv.kv_heads * hd;
    size_t nq = (size_t)R * qd, nr = (size_t)R * kv, nc = (size_t)slots * L * kv;
    float *q = rand_floats(nq, 13, -1, 1), *k = rand_floats(nr, 14, -1, 1), *v = rand_floats(nr, 15, -1, 1);
    float *kc = rand_floats(nc, 16, -1, 1), *vc = rand_floats(nc, 17, -1, 1);
    uint32_t *slot = xmalloc(R * 4), *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) slot[r] = r % slots, pos[r] = (r * 5u) % L;
    float *table = tu_rope_table(10000.0, (int)hd, (int)L);
    vks_buffer *bt = gpu_buffer(table, (size_t)L * hd * 4), *bs = gpu_buffer(slot, R * 4), *bp = gpu_buffer(pos, R * 4);
    vks_buffer *bq = gpu_buffer(q, nq * 4), *bk = gpu_buffer(k, nr * 4), *bv = gpu_buffer(v, nr * 4);
    vks_buffer *bkc = gpu_buffer(kc, nc * 4), *bvc = gpu_buffer(vc, nc * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_rope_kv_store(ops, c, bind(bq), bind(bk), bind(bv), bind(bkc), bind(bvc), bind(bs), bind(bp),
                                          bind(bt), L, R, tc->rope_kv.heads, tc->rope_kv.kv_heads, hd, mode, L), VKS_OK);
    submit(c);
    float *got_q = xmalloc(nq * 4), *got_k = xmalloc(nr * 4), *got_kc = xmalloc(nc * 4), *got_vc = xmalloc(nc * 4);
    download(bq, got_q, nq * 4), download(bk, got_k, nr * 4), download(bkc, got_kc, nc * 4), download(bvc, got_vc, nc * 4);
    /* the float64 reference */
    float *want_q = xmalloc(nq * 4), *want_k = xmalloc(nr * 4), *want_kc = xmalloc(nc * 4), *want_vc = xmalloc(nc * 4);
    memcpy(want_q, q, nq * 4), memcpy(want_k, k, nr * 4), memcpy(want_kc, kc, nc * 4), memcpy(want_vc, vc, nc * 4);
    const double *freqs = tu_rope_freqs(10000.0, (int)hd);
    vks_ref_rope(want_q, pos, (int)R, (int)qd, 0, (int)tc->rope_kv.heads, (int)hd, freqs, (int)mode);
    vks_ref_rope(want_k, pos, (int)R, (int)kv, 0, (int)tc->rope_kv.kv_heads, (int)hd, freqs, (int)mode);
    for (uint32_t r = 0; r < R; r++) {
        size_t dst = ((size_t)slot[r] * L + pos[r]) * kv;
        memcpy(want_kc + dst, want_k + (size_t)r * kv, kv * 4);
        memcpy(want_vc + dst, v + (size_t)r * kv, kv * 4);
    }
    expect_close("q", got_q, want_q, nq, tc->tol);
    expect_close("kcache", got_kc, want_kc, nc, tc->tol);
    assert_memory_equal(got_vc, want_vc, nc * 4);
    assert_memory_equal(got_k, k, nr * 4);
    /* the unfused kernels on the same inputs: the same bits */
    vks_buffer *bq2 = gpu_buffer(q, nq * 4), *bk2 = gpu_buffer(k, nr * 4), *bkc2 = gpu_buffer(kc, nc * 4),
               *bvc2 = gpu_buffer(vc, nc * 4);
    c = begin();
    assert_int_equal(vks_op_rope(ops, c, bind(bq2), bind(bp), bind(bt), L, R, qd, 0, tc->rope_kv.heads, hd, mode), VKS_OK);
    assert_int_equal(vks_op_rope(ops, c, bind(bk2), bind(bp), bind(bt), L, R, kv, 0, tc->rope_kv.kv_heads, hd, mode), VKS_OK);
    assert_int_equal(vks_op_kv_store(ops, c, bind(bk2), bind(bv), bind(bkc2), bind(bvc2), bind(bs), bind(bp), R, kv, L),
                     VKS_OK);
    submit(c);
    download(bq2, want_q, nq * 4), download(bkc2, want_kc, nc * 4), download(bvc2, want_vc, nc * 4);
    assert_memory_equal(got_q, want_q, nq * 4);
    assert_memory_equal(got_kc, want_kc, nc * 4);
    assert_memory_equal(got_vc, want_vc, nc * 4);
    free(q), free(k), free(v), free(kc), free(vc), free(slot), free(pos), free(table);
    free(got_q), free(got_k), free(got_kc), free(got_vc), free(want_q), free(want_k), free(want_kc), free(want_vc);
    vks_buffer *all[] = {bt, bs, bp, bq, bk, bv, bkc, bvc, bq2, bk2, bkc2, bvc2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) vks_buffer_destroy(all[i]);
}

/* The suite's ops (rows 0, !tile), or ops of their own made with
 * VKSWARM_ATTN_ROWS = rows (rows per subgroup, or per workgroup of the tile
 * kernel, in prefill; 0: unset) and, for `tile`, VKSWARM_NO_SUBGROUP=1 (the
 * tile kernel GPUs run); the caller destroys those. */
static vks_ops *ops_with(unsigned rows, bool tile) {
    if (!rows && !tile) return ops;
    vks_ops *o;
    char v[2] = {(char)('0' + rows), 0};
    char *saved_rows = saved_env("VKSWARM_ATTN_ROWS"), *saved_nosg = saved_env("VKSWARM_NO_SUBGROUP");
    if (rows) setenv("VKSWARM_ATTN_ROWS", v, 1);
    if (tile) setenv("VKSWARM_NO_SUBGROUP", "1", 1);
    assert_int_equal(vks_ops_create(gpu, &o), VKS_OK);
    restore_env("VKSWARM_ATTN_ROWS", saved_rows);
    restore_env("VKSWARM_NO_SUBGROUP", saved_nosg);
    return o;
}

static vks_ops *ops_with_rows(unsigned rows) { return ops_with(rows, false); }

/* The f32-cache attention's out[r, h, :] for R rows on the device, the rows
 * grouped as `kind` says, by ops_with(rows, tile). */
static float *attention_on_device(const float *q, const float *kc, const float *vc, size_t nc, const uint32_t *slot,
                                  const uint32_t *pos, uint32_t R, uint32_t H, uint32_t KH, uint32_t hd, uint32_t L,
                                  vks_matmul_kind kind, unsigned rows, bool tile) {
    vks_ops *o = ops_with(rows, tile);
    size_t nq = (size_t)R * H * hd;
    vks_buffer *bq = gpu_buffer(q, nq * 4), *bkc = gpu_buffer(kc, nc * 4), *bvc = gpu_buffer(vc, nc * 4);
    vks_buffer *bo = gpu_buffer(NULL, nq * 4), *bs = gpu_buffer(slot, R * 4), *bp = gpu_buffer(pos, R * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_attention_kind(o, c, bind(bq), bind(bkc), bind(bvc), bind(bs), bind(bp), bind(bo), R, H,
                                           KH, hd, L, kind), VKS_OK);
    submit(c);
    float *got = xmalloc(nq * 4);
    download(bo, got, nq * 4);
    vks_buffer_destroy(bq); vks_buffer_destroy(bkc); vks_buffer_destroy(bvc);
    vks_buffer_destroy(bo); vks_buffer_destroy(bs); vks_buffer_destroy(bp);
    if (o != ops) vks_ops_destroy(o);
    return got;
}

/* attention: a prefill batch of every position of two sequences (lengths
 * seq_len and seq_len/3+1, slots 2 and 0 of 3), plus decode_rows extra rows at
 * mixed slots/positions (R odd in most rows of the table). (1) Against the
 * reference. (2) Batch invariance: the batch as prefill (rows grouped per
 * subgroup, the device's default and 2, 3, 4 rows: groups inside a sequence,
 * across its ends and across slots) gives the same bits as one row per
 * subgroup (decode), and each decode row alone the same bits as in the
 * batch. (3) The same for the tile kernel GPUs run (VKSWARM_NO_SUBGROUP=1):
 * one row per workgroup against the reference, grouped rows (its default
 * and VKSWARM_ATTN_ROWS=2..4, prefill) and each decode row alone bit for bit
 * equal to it. */
static void run_attention(const op_case *tc) {
    uint32_t L = tc->attention.seq_len, hd = tc->attention.head_dim;
    uint32_t H = tc->attention.heads, KH = tc->attention.kv_heads;
    uint32_t len_a = L, len_b = L / 3 + 1, R = len_a + len_b + tc->attention.decode_rows, slots = 3;
    uint32_t *slot = xmalloc(R * 4), *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) {
        if (r < len_a) { slot[r] = 2; pos[r] = r; }
        else if (r < len_a + len_b) { slot[r] = 0; pos[r] = r - len_a; }
        else { slot[r] = r % slots; pos[r] = (r * 97u) % L; }
    }
    size_t nq = (size_t)R * H * hd, nc = (size_t)slots * L * KH * hd;
    float *q = rand_floats(nq, 13, -2, 2), *kc = rand_floats(nc, 14, -2, 2);
    float *vc = rand_floats(nc, 15, -1, 1);
    float *want = xmalloc(nq * 4);
    vks_ref_attention(q, kc, vc, slot, pos, (int)R, (int)H, (int)KH, (int)hd, (int)L, want);
    for (int tile = 0; tile < 2; tile++) {
        float *got = attention_on_device(q, kc, vc, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_AUTO, 0, tile);
        expect_close(tc->name, got, want, nq, tc->tol);
        float *one = attention_on_device(q, kc, vc, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_DECODE, 0, tile);
        expect_close(tc->name, one, want, nq, tc->tol);
        assert_memory_equal(got, one, nq * 4);
        for (unsigned rows = 0; rows <= 4; rows += rows ? 1 : 2) { /* 0: the default */
            if (!rows && !tile) continue; /* that is `got` */
            float *grouped =
                attention_on_device(q, kc, vc, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_PREFILL, rows, tile);
            assert_memory_equal(grouped, one, nq * 4);
            free(grouped);
        }
        for (uint32_t r = len_a + len_b; r < R; r++) {
            float *alone = attention_on_device(q + (size_t)r * H * hd, kc, vc, nc, slot + r, pos + r, 1, H, KH, hd,
                                               L, VKS_MATMUL_PREFILL, 0, tile);
            assert_memory_equal(alone, got + (size_t)r * H * hd, (size_t)H * hd * 4);
            free(alone);
        }
        free(got); free(one);
    }
    free(slot); free(pos); free(q); free(kc); free(vc); free(want);
}

/* kv_store_f16: every value of the caches as vks_f32_to_f16 rounds it, bit
 * for bit (ties, subnormals, overflow to inf, NaN among the inputs); the
 * rest of the caches untouched. */
static void run_kv_store_f16(const op_case *tc) {
    uint32_t R = tc->kv_store.R, kv = tc->kv_store.kv_dim, L = tc->kv_store.seq_len, slots = 3;
    size_t nc = (size_t)slots * L * kv, nr = (size_t)R * kv;
    float *k = rand_floats(nr, 9, -1, 1), *v = rand_floats(nr, 10, -70000, 70000);
    static const float special[] = {0.5f + 1.0f / 4096.0f, 1.0f + 3.0f / 2048.0f /* ties */, 65519.0f, 65520.0f,
                                    -3e-8f, 5.96e-8f, 2.98e-8f, 1e-5f, -0.0f, NAN, INFINITY, 6.1e-5f};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < nr; i++) k[i * 3 % nr] = special[i];
    uint16_t *kc = xmalloc(nc * 2), *vc = xmalloc(nc * 2), *got = xmalloc(nc * 2);
    for (size_t i = 0; i < nc; i++) { kc[i] = (uint16_t)(i * 7919u); vc[i] = (uint16_t)(i * 104729u); }
    uint32_t *slot = xmalloc(R * 4), *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) { slot[r] = r % slots; pos[r] = (r * 5u) % L; }
    vks_buffer *bk = gpu_buffer(k, nr * 4), *bv = gpu_buffer(v, nr * 4);
    vks_buffer *bkc = gpu_buffer(kc, nc * 2), *bvc = gpu_buffer(vc, nc * 2);
    vks_buffer *bs = gpu_buffer(slot, R * 4), *bp = gpu_buffer(pos, R * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_kv_store_f16(ops, c, bind(bk), bind(bv), bind(bkc), bind(bvc), bind(bs), bind(bp), R, kv, L),
                     VKS_OK);
    submit(c);
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t j = 0; j < kv; j++) {
            size_t dst = ((size_t)slot[r] * L + pos[r]) * kv + j;
            kc[dst] = vks_f32_to_f16(k[(size_t)r * kv + j]);
            vc[dst] = vks_f32_to_f16(v[(size_t)r * kv + j]);
        }
    download(bkc, got, nc * 2);
    assert_memory_equal(got, kc, nc * 2);
    download(bvc, got, nc * 2);
    assert_memory_equal(got, vc, nc * 2);
    (void)tc->tol;
    free(k); free(v); free(kc); free(vc); free(got); free(slot); free(pos);
    vks_buffer_destroy(bk); vks_buffer_destroy(bv); vks_buffer_destroy(bkc);
    vks_buffer_destroy(bvc); vks_buffer_destroy(bs); vks_buffer_destroy(bp);
}

/* The f16-cache attention's out[r, h, :] for R rows on the device (caches of halves). */
static float *attention_f16_on_device(const float *q, const uint16_t *kc, const uint16_t *vc, size_t nc,
                                      const uint32_t *slot, const uint32_t *pos, uint32_t R, uint32_t H, uint32_t KH,
                                      uint32_t hd, uint32_t L, vks_matmul_kind kind, unsigned rows) {
    vks_ops *o = ops_with_rows(rows);
    size_t nq = (size_t)R * H * hd;
    vks_buffer *bq = gpu_buffer(q, nq * 4), *bkc = gpu_buffer(kc, nc * 2), *bvc = gpu_buffer(vc, nc * 2);
    vks_buffer *bo = gpu_buffer(NULL, nq * 4), *bs = gpu_buffer(slot, R * 4), *bp = gpu_buffer(pos, R * 4);
    vks_buffer *bpart = gpu_buffer(NULL, (size_t)vks_op_attention_f16_scratch_bytes(R, H, hd, L));
    vks_cmd *c = begin();
    assert_int_equal(vks_op_attention_f16_kind(o, c, bind(bq), bind(bkc), bind(bvc), bind(bs), bind(bp),
                                               bind(bpart), bind(bo), R, H, KH, hd, L, kind), VKS_OK);
    submit(c);
    float *got = xmalloc(nq * 4);
    download(bo, got, nq * 4);
    vks_buffer_destroy(bq); vks_buffer_destroy(bkc); vks_buffer_destroy(bvc);
    vks_buffer_destroy(bo); vks_buffer_destroy(bs); vks_buffer_destroy(bp); vks_buffer_destroy(bpart);
    if (o != ops) vks_ops_destroy(o);
    return got;
}

/* f16 rounding (nearest even, half.glsl): |x16 - x| <= 2^-11 |x| + 2^-25
 * (the second term for subnormal halves). */
static double f16_err(double x) { return fabs(x) / 2048.0 + 0x1p-25; }

/* The bound on |attention(f16 caches) - attention(f32 caches)| for (row r,
 * head h, dim d), from the rounding alone: each score s_j moves by at most
 * eps = scale sum_d |q_d| err(k_jd), so each weight p_j by a factor within
 * e^(+-2 eps) and sum_j |p'_j - p_j| <= e^(2 eps) - 1; the values move by
 * err(v). |out' - out| <= max_j err(v_jd) + (e^(2 eps) - 1) max_j |v_jd|.
 * f16_score_err gives max_j eps_j, the same for every d of the head (so
 * computed once per row and head: per d it was most of this test's time). */
static double f16_score_err(const float *q, const float *kc, uint32_t slot, uint32_t pos, uint32_t kvh, uint32_t hd,
                            uint32_t kvd, uint32_t L) {
    double eps = 0;
    for (uint32_t j = 0; j <= pos; j++) {
        const float *k = kc + ((size_t)slot * L + j) * kvd + (size_t)kvh * hd;
        double e = 0;
        for (uint32_t i = 0; i < hd; i++) e += fabs(q[i]) * f16_err(k[i]);
        eps = fmax(eps, e / sqrt((double)hd));
    }
    return eps;
}

static double f16_attention_bound(double eps, const float *vc, uint32_t slot, uint32_t pos, uint32_t kvh, uint32_t hd,
                                  uint32_t kvd, uint32_t L, uint32_t d) {
    double vmax = 0, verr = 0;
    for (uint32_t j = 0; j <= pos; j++) {
        double v = vc[((size_t)slot * L + j) * kvd + (size_t)kvh * hd + d];
        vmax = fmax(vmax, fabs(v));
        verr = fmax(verr, f16_err(v));
    }
    return verr + expm1(2 * eps) * vmax;
}

/* attention_f16 (split over keys, query heads of a KV group together): the
 * rows of run_attention over caches of halves. (1) Against the reference
 * over the same halves (widened): the f32 limit of the f32 kernel. (2)
 * Against the reference over the f32 values before rounding: each element
 * within f16_attention_bound plus 2^-20 max|v| for the f32 arithmetic. (3)
 * Batch invariance: the batch as prefill (rows grouped per subgroup: the
 * default and 2, 3, 4 rows) gives the same bits as one row per subgroup
 * (decode), and each of the decode rows alone the same bits as in the
 * batch. */
static void run_attention_f16(const op_case *tc) {
    uint32_t L = tc->attention.seq_len, hd = tc->attention.head_dim;
    uint32_t H = tc->attention.heads, KH = tc->attention.kv_heads, kvd = KH * hd;
    uint32_t len_a = L, len_b = L / 3 + 1, R = len_a + len_b + tc->attention.decode_rows, slots = 3;
    uint32_t *slot = xmalloc(R * 4), *pos = xmalloc(R * 4);
    for (uint32_t r = 0; r < R; r++) {
        if (r < len_a) { slot[r] = 2; pos[r] = r; }
        else if (r < len_a + len_b) { slot[r] = 0; pos[r] = r - len_a; }
        else { slot[r] = r % slots; pos[r] = (r * 97u) % L; }
    }
    size_t nq = (size_t)R * H * hd, nc = (size_t)slots * L * kvd;
    float *q = rand_floats(nq, 13, -2, 2), *kc = rand_floats(nc, 14, -2, 2), *vc = rand_floats(nc, 15, -1, 1);
    uint16_t *kh = xmalloc(nc * 2), *vh = xmalloc(nc * 2);
    float *k16 = xmalloc(nc * 4), *v16 = xmalloc(nc * 4);
    for (size_t i = 0; i < nc; i++) {
        kh[i] = vks_f32_to_f16(kc[i]), vh[i] = vks_f32_to_f16(vc[i]);
        k16[i] = vks_f16_to_f32(kh[i]), v16[i] = vks_f16_to_f32(vh[i]);
    }
    float *got = attention_f16_on_device(q, kh, vh, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_AUTO, 0);
    float *want = xmalloc(nq * 4);
    vks_ref_attention(q, k16, v16, slot, pos, (int)R, (int)H, (int)KH, (int)hd, (int)L, want);
    expect_close(tc->name, got, want, nq, tc->tol);
    vks_ref_attention(q, kc, vc, slot, pos, (int)R, (int)H, (int)KH, (int)hd, (int)L, want);
    double worst = 0;
    for (uint32_t r = 0; r < R; r++)
        for (uint32_t h = 0; h < H; h++) {
            uint32_t kvh = h / (H / KH);
            double eps = f16_score_err(q + ((size_t)r * H + h) * hd, kc, slot[r], pos[r], kvh, hd, kvd, L);
            for (uint32_t d = 0; d < hd; d++) {
                size_t i = ((size_t)r * H + h) * hd + d;
                double vmax = 0;
                for (uint32_t j = 0; j <= pos[r]; j++)
                    vmax = fmax(vmax, fabs(vc[((size_t)slot[r] * L + j) * kvd + (size_t)kvh * hd + d]));
                double bound = f16_attention_bound(eps, vc, slot[r], pos[r], kvh, hd, kvd, L, d) + 0x1p-20 * vmax;
                double err = fabs((double)got[i] - want[i]);
                worst = fmax(worst, err / bound);
                if (err > bound) fprintf(stderr, "%s: row %u head %u dim %u: |%g - %g| > %g\n", tc->name, r, h, d,
                                         got[i], want[i], bound);
                assert_true(err <= bound);
            }
        }
    if (getenv("VKSWARM_TEST_VERBOSE")) fprintf(stderr, "%s: worst error / f16 bound %.3g\n", tc->name, worst);
    float *one = attention_f16_on_device(q, kh, vh, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_DECODE, 0);
    assert_memory_equal(got, one, nq * 4);
    for (unsigned rows = 2; rows <= 4; rows++) {
        float *grouped = attention_f16_on_device(q, kh, vh, nc, slot, pos, R, H, KH, hd, L, VKS_MATMUL_PREFILL, rows);
        assert_memory_equal(grouped, one, nq * 4);
        free(grouped);
    }
    free(one);
    for (uint32_t r = len_a + len_b; r < R; r++) {
        float *alone = attention_f16_on_device(q + (size_t)r * H * hd, kh, vh, nc, slot + r, pos + r, 1, H, KH, hd, L,
                                               VKS_MATMUL_PREFILL, 0);
        assert_memory_equal(alone, got + (size_t)r * H * hd, (size_t)H * hd * 4);
        free(alone);
    }
    free(slot); free(pos); free(q); free(kc); free(vc); free(kh); free(vh); free(k16); free(v16); free(got); free(want);
}

/* swiglu / add over n elements; add is always in place, swiglu when in_place. */
static void run_elementwise(const op_case *tc, bool swiglu) {
    size_t n = tc->elementwise.n;
    float *a = rand_floats(n, 16, -6, 6), *b = rand_floats(n, 17, -2, 2);
    float *want = xmalloc(n * 4), *got = xmalloc(n * 4);
    vks_buffer *ba = gpu_buffer(a, n * 4), *bb = gpu_buffer(b, n * 4);
    vks_buffer *bo = swiglu && !tc->elementwise.in_place ? gpu_buffer(NULL, n * 4) : ba;
    vks_cmd *c = begin();
    if (swiglu)
        assert_int_equal(vks_op_swiglu(ops, c, bind(ba), bind(bb), bind(bo), (uint32_t)n), VKS_OK);
    else
        assert_int_equal(vks_op_add(ops, c, bind(ba), bind(bb), (uint32_t)n), VKS_OK);
    submit(c);
    if (swiglu) vks_ref_swiglu(a, b, n, want);
    else { memcpy(want, a, n * 4); vks_ref_add(want, b, n); }
    download(bo, got, n * 4);
    expect_close(tc->name, got, want, n, tc->tol);
    free(a); free(b); free(want); free(got);
    if (bo != ba) vks_buffer_destroy(bo);
    vks_buffer_destroy(ba); vks_buffer_destroy(bb);
}
static void run_swiglu(const op_case *tc) { run_elementwise(tc, true); }
static void run_add(const op_case *tc) { run_elementwise(tc, false); }

/* bias_add: R rows of D columns, always in place (rows.in_place unused). */
static void run_bias_add(const op_case *tc) {
    uint32_t R = tc->rows.R, D = tc->rows.D;
    size_t n = (size_t)R * D;
    float *x = rand_floats(n, 18, -3, 3), *bias = rand_floats(D, 19, -1, 1);
    float *want = xmalloc(n * 4), *got = xmalloc(n * 4);
    vks_buffer *bx = gpu_buffer(x, n * 4), *bb = gpu_buffer(bias, D * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_bias_add(ops, c, bind(bx), bind(bb), R, D), VKS_OK);
    submit(c);
    memcpy(want, x, n * 4);
    vks_ref_bias_add(want, bias, (int)R, (int)D);
    download(bx, got, n * 4);
    expect_close(tc->name, got, want, n, tc->tol);
    free(x); free(bias); free(want); free(got);
    vks_buffer_destroy(bx); vks_buffer_destroy(bb);
}

/* gather_rows: R rows of D picked from src_rows source rows. */
static void run_gather(const op_case *tc) {
    uint32_t n = tc->gather.R, D = tc->gather.D, src_rows = tc->gather.src_rows;
    float *src = rand_floats((size_t)src_rows * D, 18, -1, 1);
    uint32_t *idx = xmalloc(n * 4);
    for (uint32_t i = 0; i < n; i++) idx[i] = (i * 7u + 3u) % src_rows;
    vks_buffer *bs = gpu_buffer(src, (size_t)src_rows * D * 4), *bi = gpu_buffer(idx, n * 4);
    vks_buffer *bd = gpu_buffer(NULL, (size_t)n * D * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_gather_rows(ops, c, bind(bs), bind(bi), bind(bd), n, D), VKS_OK);
    submit(c);
    float *want = xmalloc((size_t)n * D * 4), *got = xmalloc((size_t)n * D * 4);
    for (uint32_t i = 0; i < n; i++) memcpy(want + (size_t)i * D, src + (size_t)idx[i] * D, D * 4);
    download(bd, got, (size_t)n * D * 4);
    expect_close(tc->name, got, want, (size_t)n * D, tc->tol);
    free(src); free(idx); free(want); free(got);
    vks_buffer_destroy(bs); vks_buffer_destroy(bi); vks_buffer_destroy(bd);
}

/* ---- sampler ---- */

static float gumbel_score(const float *logits, const vks_sample_params *p, uint32_t i) {
    float u = vks_rng_uniform(vks_philox_u32(p->seed, p->seq, p->pos, i));
    return logits[i] / p->temperature + vks_gumbel_from_uniform(u);
}

/* A GPU/reference disagreement is acceptable only when float rounding can
 * explain it: the two tokens' Gumbel scores nearly tie, or the GPU token sits
 * at the top-p boundary of the reference's kept set. */
static bool near_tie(const float *logits, int V, const vks_sample_params *p, uint32_t got,
                     uint32_t want) {
    if (got >= (uint32_t)V) return false;
    float a = gumbel_score(logits, p, got), b = gumbel_score(logits, p, want);
    if (fabsf(a - b) <= 1e-5f * (1.0f + fabsf(b))) return true;
    uint8_t *keep = xmalloc((size_t)V);
    float *z = xmalloc((size_t)V * 4);
    vks_ref_sample_kept(logits, V, p, keep, z);
    float zmin = INFINITY;
    for (int i = 0; i < V; i++)
        if (keep[i] && z[i] < zmin) zmin = z[i];
    bool boundary = !keep[got] && fabsf(z[got] - zmin) <= 1e-3f * (1.0f + fabsf(zmin));
    free(keep); free(z);
    return boundary;
}

/* A position whose draw for some token i < V has a uniform within 64 / 2^23
 * of 1 (-log(u) ~ 1e-6 or less: where a GPU's log has a large relative
 * error); sets *token to it. */
static uint32_t position_near_one(uint64_t seed, uint32_t seq, uint32_t V, uint32_t *token) {
    for (uint32_t pos = 0;; pos++)
        for (uint32_t i = 0; i < V; i++)
            if ((vks_philox_u32(seed, seq, pos, i) >> 9) >= (1u << 23) - 64) {
                *token = i;
                return pos;
            }
}

/* near_one rows: the draw of token i has u near 1 and token j = i + 1 is set
 * so that its Gumbel score (in double: -log(-log u)) differs from i's by
 * +-0.02 (alternating), every other token far below: both the GPU and the
 * reference must pick the winner that double precision picks. */
static void set_near_one(float *row, uint32_t V, const vks_sample_params *p, uint32_t i, bool j_wins) {
    uint32_t j = (i + 1) % V;
    for (uint32_t k = 0; k < V; k++) row[k] = -40.0f;
    double ui = vks_rng_uniform(vks_philox_u32(p->seed, p->seq, p->pos, i));
    double uj = vks_rng_uniform(vks_philox_u32(p->seed, p->seq, p->pos, j));
    double gi = -log(-log(ui)), gj = -log(-log(uj));
    row[i] = 0.0f;
    row[j] = (float)(gi - gj + (j_wins ? 0.02 : -0.02));
}

/* sample: S rows of V logits. ties: logits rounded to halves to create ties. */
#define VKS_AUTO_W UINT32_MAX
#define VKS_SWEEP_W (UINT32_MAX - 1)

static void run_sample(const op_case *tc) {
    uint32_t S = tc->sample.S, V = tc->sample.V;
    vks_ops *dev_ops = ops;
    if (tc->sample.serial_scan) { /* both kernels with the other scan of top-p's bins (the same digits) */
        char *saved = saved_env("VKSWARM_SAMPLE_SERIAL_SCAN");
        setenv("VKSWARM_SAMPLE_SERIAL_SCAN", tc->sample.serial_scan == 2 ? "1" : "0", 1);
        assert_int_equal(vks_ops_create(gpu, &ops), VKS_OK);
        restore_env("VKSWARM_SAMPLE_SERIAL_SCAN", saved);
    }
    float *logits = rand_floats((size_t)S * V, tc->sample.seed ? tc->sample.seed : 19, -8, 8);
    if (tc->sample.ties)
        for (size_t i = 0; i < (size_t)S * V; i++) logits[i] = roundf(logits[i] * 2) / 2;
    for (size_t i = 0; tc->sample.nans && i < (size_t)S * V; i++) {
        if (i % 97 == 5) logits[i] = NAN;
        else if (i % 89 == 7) logits[i] = -INFINITY;
    }
    for (size_t i = 0; tc->sample.infs && i < (size_t)S * V; i++)
        if (i / V % 5 == 2 && i % 1009 == 11 + i / V % 3) logits[i] = INFINITY;
    vks_gpu_sample_row *rows = xmalloc(S * sizeof *rows);
    vks_sample_params *ref = xmalloc(S * sizeof *ref);
    uint32_t *expect = xmalloc(S * 4);
    for (uint32_t s = 0; s < S; s++) {
        uint32_t top_k = tc->sample.top_k;
        float temperature = tc->sample.temperature, top_p = tc->sample.top_p;
        if (tc->sample.mixed && s % 4 == 1) temperature = 0.0f;
        if (tc->sample.mixed && s % 4 == 2) top_k = 0;
        if (tc->sample.mixed && s % 4 == 3) top_p = 1.0f;
        uint64_t seed = 0x123456789abcull * (s + 1) + tc->sample.seed;
        ref[s] = (vks_sample_params){temperature, top_k, top_p, seed, s * 3u, 17u + s};
        uint32_t near = 0;
        if (tc->sample.near_one) {
            ref[s].pos = position_near_one(seed, ref[s].seq, V, &near);
            set_near_one(logits + (size_t)s * V, V, &ref[s], near, s % 2 == 0);
            expect[s] = s % 2 == 0 ? (near + 1) % V : near;
        }
        rows[s] = (vks_gpu_sample_row){temperature, top_k, top_p, (uint32_t)seed,
                                       (uint32_t)(seed >> 32), s * 3u, ref[s].pos, 0};
    }
    vks_buffer *bl = gpu_buffer(logits, (size_t)S * V * 4);
    vks_buffer *bp = gpu_buffer(rows, S * sizeof *rows), *bt = gpu_buffer(NULL, S * 4);
    vks_cmd *c = begin();
    assert_int_equal(vks_op_sample(ops, c, bind(bl), bind(bp), bind(bt), S, V), VKS_OK);
    submit(c);
    uint32_t *got = xmalloc(S * 4);
    download(bt, got, S * 4);
    if (tc->sample.split) { /* the spread radix selects: the one-workgroup kernel's tokens, every row */
        static const uint32_t sweep[] = {1, 2, 3, 7, 16, 38, 64};
        uint32_t auto_w = tc->sample.split == VKS_AUTO_W ? vks_op_sample_groups(NULL, S, V) : tc->sample.split;
        bool sweeping = tc->sample.split == VKS_SWEEP_W;
        for (size_t n = 0; n < (sweeping ? sizeof sweep / sizeof *sweep : 1); n++) {
            uint32_t W = sweeping ? sweep[n] : auto_w;
            if (W > V) continue;
            assert_true(W > 1 || sweeping);
            uint64_t scratch_bytes = vks_op_sample_scratch_bytes(S, W);
            vks_buffer *bs = gpu_buffer(NULL, scratch_bytes ? scratch_bytes : 4), *bt2 = gpu_buffer(NULL, S * 4);
            c = begin();
            assert_int_equal(vks_op_sample_split(ops, c, bind(bl), bind(bp), bind(bt2), bind(bs), S, V, W), VKS_OK);
            submit(c);
            uint32_t *got2 = xmalloc(S * 4);
            download(bt2, got2, S * 4);
            for (uint32_t s = 0; s < S; s++)
                if (got2[s] != got[s]) fprintf(stderr, "%s: row %u split (W %u) %u one workgroup %u\n", tc->name, s, W, got2[s], got[s]);
            assert_memory_equal(got2, got, S * 4);
            free(got2);
            vks_buffer_destroy(bs); vks_buffer_destroy(bt2);
        }
    }
    uint32_t mismatches = 0;
    for (uint32_t s = 0; s < S; s++) {
        const float *row = logits + (size_t)s * V;
        uint32_t want = vks_ref_sample(row, (int)V, &ref[s]);
        if (tc->sample.near_one) { /* no rounding excuse: the scores are 0.02 apart */
            if (got[s] != expect[s] || want != expect[s])
                fprintf(stderr, "%s: row %u gpu %u ref %u, double precision %u\n", tc->name, s, got[s], want, expect[s]);
            assert_int_equal(want, expect[s]);
            assert_int_equal(got[s], expect[s]);
            continue;
        }
        if (got[s] == want) continue;
        mismatches++;
        fprintf(stderr, "%s: row %u gpu %u ref %u\n", tc->name, s, got[s], want);
        assert_true(ref[s].temperature > 0.0f);  /* greedy must match exactly */
        assert_true(near_tie(row, (int)V, &ref[s], got[s], want));
    }
    assert_true(mismatches * 200 <= S); /* at most 1 in 200 rows */
    if (ops != dev_ops) vks_ops_destroy(ops);
    ops = dev_ops;
    free(logits); free(rows); free(ref); free(got); free(expect);
    vks_buffer_destroy(bl); vks_buffer_destroy(bp); vks_buffer_destroy(bt);
}

/* ---- argument checking ---- */

static void run_bad_args(const op_case *tc) {
    (void)tc;
    vks_buffer *b = gpu_buffer(NULL, 1024);
    vks_cmd *c = begin();
    /* too small for M*K, zero sizes, column window past ldy, head_dim too large */
    assert_int_equal(vks_op_matmul(ops, c, bind(b), bind(b), VKS_DTYPE_F32, bind(b), 4, 4, 100, 4,
                                   0, false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul(ops, c, bind(b), bind(b), VKS_DTYPE_F32, bind(b), 0, 4, 4, 4, 0,
                                   false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul(ops, c, bind(b), bind(b), VKS_DTYPE_F32, bind(b), 2, 4, 4, 4, 1,
                                   false), VKS_ERR_ARG);
    assert_int_equal(vks_op_attention(ops, c, bind(b), bind(b), bind(b), bind(b), bind(b), bind(b),
                                      1, 1, 1, 512, 1), VKS_ERR_ARG);
    assert_int_equal(vks_op_add(ops, c, bind(b), bind(b), 257), VKS_ERR_ARG);
    /* f16 cache: odd kv_dim, head_dim not a multiple of 4, a scratch too small */
    assert_int_equal(vks_op_kv_store_f16(ops, c, bind(b), bind(b), bind(b), bind(b), bind(b), bind(b), 1, 3, 1),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_attention_f16(ops, c, bind(b), bind(b), bind(b), bind(b), bind(b), bind(b), bind(b), 1, 1,
                                          1, 6, 1), VKS_ERR_ARG);
    assert_int_equal(vks_op_attention_f16(ops, c, bind(b), bind(b), bind(b), bind(b), bind(b), bind(b), bind(b), 2, 16,
                                          1, 8, 4), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "part"));
    /* block types: K not a whole number of blocks, an unaligned binding, q6_k (no kernel) */
    assert_int_equal(vks_op_matmul(ops, c, bind(b), bind(b), VKS_DTYPE_Q4_0, bind(b), 1, 2, 48, 2,
                                   0, false), VKS_ERR_ARG);
    vks_binding unaligned = {b, 4, 0};
    assert_int_equal(vks_op_matmul(ops, c, unaligned, bind(b), VKS_DTYPE_Q8_0, bind(b), 1, 2, 32, 2,
                                   0, false), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul(ops, c, bind(b), bind(b), VKS_DTYPE_Q6_K, bind(b), 1, 1, 256, 1,
                                   0, false), VKS_ERR_ARG);
    /* matmul_multi: 0 or 4 products, a product's own checks, outputs overlapping x, a W or each other */
    vks_buffer *b2 = gpu_buffer(NULL, 1024), *b3 = gpu_buffer(NULL, 1024);
    vks_binding lo = {b3, 0, 512}, hi = {b3, 512, 512};
    vks_matmul_part mp[4] = {{bind(b), VKS_DTYPE_F32, lo, 4, 4, 0}, {bind(b), VKS_DTYPE_F32, hi, 4, 4, 0},
                             {bind(b), VKS_DTYPE_F32, bind(b2), 4, 4, 0}, {bind(b), VKS_DTYPE_F32, hi, 4, 4, 0}};
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 3, 2, 4, false, VKS_MATMUL_AUTO), VKS_OK);
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 0, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 4, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), NULL, 2, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp + 1, 3, 2, 4, false, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG); /* the first and the last of these 3 both write hi */
    assert_non_null(strstr(vks_last_error(), "overlaps"));
    mp[1].N = 5; /* 5 columns past ldy 4 */
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 2, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "product 1"));
    mp[1].N = 4;
    mp[1].y = bind(b); /* y = x = W */
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 2, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    mp[1].y = hi;
    mp[1].W = bind(b2); /* part 2 writes W of part 1 */
    assert_int_equal(vks_op_matmul_multi(ops, c, bind(b), mp, 3, 2, 4, false, VKS_MATMUL_AUTO), VKS_ERR_ARG);
    /* matmul_swiglu: y or u overlapping x, a W or each other; sizes; u too small; bad kind */
    vks_binding W2 = {b, 0, 64}; /* 4 x 4 f32 */
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, hi, 2, 4, 4, VKS_MATMUL_AUTO),
                     VKS_OK);
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, hi, 2, 4, 4, VKS_MATMUL_PREFILL),
                     VKS_OK);
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, lo, 2, 4, 4, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG); /* y = u */
    assert_non_null(strstr(vks_last_error(), "overlaps"));
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b2), W2, W2, VKS_DTYPE_F32, lo, bind(b), 2, 4, 4,
                                          VKS_MATMUL_AUTO), VKS_ERR_ARG); /* u = W */
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), bind(b2), bind(b2), VKS_DTYPE_F32, lo, bind(b), 2, 4, 4,
                                          VKS_MATMUL_AUTO), VKS_ERR_ARG); /* u = x */
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, bind(b3), VKS_DTYPE_F32, lo, bind(b2), 2, 4, 4,
                                          VKS_MATMUL_AUTO), VKS_ERR_ARG); /* y inside W_up */
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, hi, 0, 4, 4, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, (vks_binding){b3, 512, 16}, 2,
                                          4, 4, VKS_MATMUL_AUTO), VKS_ERR_ARG); /* u: 4 of 8 floats */
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, hi, 2, 4, 4, (vks_matmul_kind)7),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_matmul_swiglu(ops, c, bind(b), W2, W2, VKS_DTYPE_Q4_0, lo, hi, 2, 4, 4, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG); /* K = 4: not whole blocks */
    assert_int_equal(vks_op_matmul_swiglu(NULL, c, bind(b), W2, W2, VKS_DTYPE_F32, lo, hi, 2, 4, 4, VKS_MATMUL_AUTO),
                     VKS_ERR_ARG);
    assert_int_equal(vks_op_embed(ops, c, bind(b), bind(b), VKS_DTYPE_Q4_K, 0, 2, 128, bind(b), 1),
                     VKS_ERR_ARG); /* D = 128 is half a block */
    assert_int_equal(vks_op_embed(ops, c, bind(b), bind(b), VKS_DTYPE_Q4_K, 0, 8, 256, bind(b), 1),
                     VKS_ERR_ARG); /* 8 blocks of 144 bytes exceed the 1024-byte table */
    /* the spread sampler: no workgroups per row, a scratch too small for 2 rows at W = 8 */
    assert_int_equal(vks_op_sample_split(ops, c, bind(b), bind(b), bind(b), bind(b), 1, 8, 0), VKS_ERR_ARG);
    /* a vocabulary of 2^26 or more (top-p's 64-bit fixed-point sums) */
    assert_int_equal(vks_op_sample(ops, c, bind(b), bind(b), bind(b), 1, VKS_SAMPLE_MAX_V + 1), VKS_ERR_ARG);
    assert_int_equal(vks_op_sample_split(ops, c, bind(b), bind(b), bind(b), bind(b), 2, 8, 8), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "scratch"));
    /* W: 1 for many rows or a short row; one per 4096 logits, at most 64; 1 on CPU drivers by default */
    assert_int_equal(vks_op_sample_groups(NULL, 1, 151936), 38);
    assert_int_equal(vks_op_sample_groups(NULL, 8, 32000), 8);
    assert_int_equal(vks_op_sample_groups(NULL, 9, 151936), 1);
    assert_int_equal(vks_op_sample_groups(NULL, 1, 12288), 1);
    assert_int_equal(vks_op_sample_groups(NULL, 1, 1u << 20), 64);
    if (!getenv("VKSWARM_SAMPLE_SPREAD"))
        assert_int_equal(vks_op_sample_groups(ops, 1, 151936), vks_gpu_info(gpu)->type == VKS_DEVTYPE_CPU ? 1 : 38);
    vks_binding past_end = {b, 2048, 0};
    assert_int_equal(vks_op_add(ops, c, past_end, bind(b), 1), VKS_ERR_ARG);
    submit(c);
    vks_buffer_destroy(b); vks_buffer_destroy(b2); vks_buffer_destroy(b3);
}

/* ---- the table ---- */

#define F32 VKS_DTYPE_F32
#define F16 VKS_DTYPE_F16
#define BF16 VKS_DTYPE_BF16
#define Q8_0 VKS_DTYPE_Q8_0
#define Q4_0 VKS_DTYPE_Q4_0
#define Q4_K VKS_DTYPE_Q4_K
/* Families whose limit is the same for every row; the shape is named in the row. */
#define MATMUL(nm, ...) {nm, run_matmul, .tol = 1e-11, .matmul = {__VA_ARGS__}}
#define MULTI(nm, ...) {nm, run_matmul_multi, .tol = 1e-11, .multi = {__VA_ARGS__}}
#define SWIGLU_MM(nm, ...) {nm, run_matmul_swiglu, .tol = 1e-11, .swiglu_mm = {__VA_ARGS__}}
#define QKV(a, b) .parts = 3, .N = {a, b, b}
#define GATE_UP(a) .parts = 2, .N = {a, a}
#define EMBED(nm, ...) {nm, run_embed, .tol = 0, .embed = {__VA_ARGS__}}
#define ROPE(nm, ...) {nm, run_rope, .tol = 1e-10, .rope = {__VA_ARGS__}}
#define ATTN(nm, ...) {nm, run_attention, .tol = 1e-11, .attention = {__VA_ARGS__}}
#define ATTN_F16(nm, ...) {nm, run_attention_f16, .tol = 1e-11, .attention = {__VA_ARGS__}}
#define SAMPLE(nm, ...) {nm, run_sample, .sample = {__VA_ARGS__}}

static const op_case cases[] = {
    MATMUL("matvec f32 M1 odd", .M = 1, .N = 173, .K = 67, .dtype = F32),
    MATMUL("matvec f32 M3 odd", .M = 3, .N = 173, .K = 67, .dtype = F32),
    MATMUL("matvec f32 M8 vec4", .M = 8, .N = 173, .K = 256, .dtype = F32),
    MATMUL("matvec f16 M1 odd", .M = 1, .N = 173, .K = 67, .dtype = F16),
    MATMUL("matvec f16 M2 vec4", .M = 2, .N = 300, .K = 512, .dtype = F16),
    MATMUL("matvec bf16 M1 odd", .M = 1, .N = 173, .K = 67, .dtype = BF16),
    MATMUL("matvec bf16 M4 vec4", .M = 4, .N = 67, .K = 1024, .dtype = BF16),
    MATMUL("matvec f32 accumulate window", .M = 3, .N = 173, .K = 64, .dtype = F32, .accumulate_window = true),
    MATMUL("matvec f16 accumulate window", .M = 1, .N = 173, .K = 67, .dtype = F16, .accumulate_window = true),
    MATMUL("matmul f32 M17 odd", .M = 17, .N = 173, .K = 67, .dtype = F32),
    MATMUL("matmul f32 M64", .M = 64, .N = 173, .K = 67, .dtype = F32),
    MATMUL("matmul f16 M17", .M = 17, .N = 173, .K = 67, .dtype = F16),
    MATMUL("matmul f16 M64 K256", .M = 64, .N = 130, .K = 256, .dtype = F16),
    MATMUL("matmul bf16 M17", .M = 17, .N = 173, .K = 67, .dtype = BF16),
    MATMUL("matmul bf16 M100", .M = 100, .N = 65, .K = 129, .dtype = BF16),
    MATMUL("matmul f32 accumulate window", .M = 17, .N = 173, .K = 67, .dtype = F32, .accumulate_window = true),
    MATMUL("matmul bf16 accumulate window", .M = 70, .N = 64, .K = 64, .dtype = BF16, .accumulate_window = true),
    /* vector staging (K % 8 == 0) with partial K slices and tiles in M and N */
    MATMUL("matmul f32 M130 N200 K40", .M = 130, .N = 200, .K = 40, .dtype = F32),
    MATMUL("matmul f16 M65 N129 K520", .M = 65, .N = 129, .K = 520, .dtype = F16),
    MATMUL("matmul f16 accumulate window K24", .M = 66, .N = 131, .K = 24, .dtype = F16, .accumulate_window = true),
    /* around the staged tiles (64 x 128 outputs, K slices of 16, two buffers):
     * one row short or over, a last slice of 1 element, odd and even slice
     * counts, whole tiles of one slice */
    MATMUL("matmul f32 tile edges M63 N129 K17", .M = 63, .N = 129, .K = 17, .dtype = F32),
    MATMUL("matmul f32 tile edges vec4 M65 N127 K48", .M = 65, .N = 127, .K = 48, .dtype = F32),
    MATMUL("matmul f16 tile edges vec4 M64 N256 K16", .M = 64, .N = 256, .K = 16, .dtype = F16),
    MATMUL("matmul bf16 tile edges M129 N128 K33", .M = 129, .N = 128, .K = 33, .dtype = BF16),
    /* operands exact in half: f32 products in the half-storage kernel */
    MATMUL("matmul f32 half-exact M67 N130 K72", .M = 67, .N = 130, .K = 72, .dtype = F32, .half_exact = true),
    MATMUL("matmul f16 half-exact M65 N129 K49", .M = 65, .N = 129, .K = 49, .dtype = F16, .half_exact = true),
    /* block types: GPU vs the reference on the dequantized weights (K whole blocks) */
    MATMUL("matvec q8_0 M1", .M = 1, .N = 173, .K = 96, .dtype = Q8_0),
    MATMUL("matvec q8_0 M3 K1024", .M = 3, .N = 67, .K = 1024, .dtype = Q8_0),
    MATMUL("matvec q8_0 M8", .M = 8, .N = 37, .K = 160, .dtype = Q8_0),
    MATMUL("matvec q4_0 M1", .M = 1, .N = 173, .K = 96, .dtype = Q4_0),
    MATMUL("matvec q4_0 M2 K1024", .M = 2, .N = 67, .K = 1024, .dtype = Q4_0),
    MATMUL("matvec q4_0 M7", .M = 7, .N = 37, .K = 160, .dtype = Q4_0),
    MATMUL("matvec q4_k M1", .M = 1, .N = 173, .K = 256, .dtype = Q4_K),
    MATMUL("matvec q4_k M3 K1280", .M = 3, .N = 67, .K = 1280, .dtype = Q4_K),
    MATMUL("matvec q4_k M8", .M = 8, .N = 37, .K = 512, .dtype = Q4_K),
    MATMUL("matvec q8_0 accumulate window", .M = 1, .N = 173, .K = 64, .dtype = Q8_0, .accumulate_window = true),
    MATMUL("matvec q4_k accumulate window", .M = 2, .N = 41, .K = 256, .dtype = Q4_K, .accumulate_window = true),
    MATMUL("matmul q8_0 M17", .M = 17, .N = 173, .K = 96, .dtype = Q8_0),
    MATMUL("matmul q4_0 M70", .M = 70, .N = 65, .K = 160, .dtype = Q4_0),
    MATMUL("matmul q4_k M17", .M = 17, .N = 67, .K = 512, .dtype = Q4_K),
    MATMUL("matmul q4_0 accumulate window", .M = 9, .N = 130, .K = 64, .dtype = Q4_0, .accumulate_window = true),
    MATMUL("matmul q4_k accumulate window", .M = 66, .N = 37, .K = 256, .dtype = Q4_K, .accumulate_window = true),
    MATMUL("matmul q8_0 M70 N130", .M = 70, .N = 130, .K = 64, .dtype = Q8_0),
    MATMUL("matmul q8_0 tile edges M63 N129 K64", .M = 63, .N = 129, .K = 64, .dtype = Q8_0),
    MATMUL("matmul q4_0 tile edges M65 N127 K96", .M = 65, .N = 127, .K = 96, .dtype = Q4_0),
    MATMUL("matmul q4_k tile edges M63 N129 K256", .M = 63, .N = 129, .K = 256, .dtype = Q4_K),
    /* Q/K/V and gate/up as one dispatch: decode (M 1, 8, more rows as DECODE) and prefill */
    MULTI("matmul_multi f32 M1 qkv K67", .M = 1, .K = 67, QKV(67, 29), .dtype = F32),
    MULTI("matmul_multi f32 M8 qkv wide K64", .M = 8, .K = 64, QKV(200, 40), .dtype = F32),
    MULTI("matmul_multi f32 M1 qkv wide K64", .M = 1, .K = 64, QKV(300, 20), .dtype = F32),
    MULTI("matmul_multi f32 M17 gate_up K67", .M = 17, .K = 67, GATE_UP(130), .dtype = F32),
    MULTI("matmul_multi f32 M12 decode qkv accumulate", .M = 12, .K = 64, QKV(67, 29), .dtype = F32,
          .kind = VKS_MATMUL_DECODE, .accumulate = true),
    MULTI("matmul_multi f32 M70 prefill qkv accumulate", .M = 70, .K = 48, QKV(131, 33), .dtype = F32,
          .accumulate = true),
    MULTI("matmul_multi f16 M1 qkv K67", .M = 1, .K = 67, QKV(67, 29), .dtype = F16),
    MULTI("matmul_multi f16 M8 gate_up K64", .M = 8, .K = 64, GATE_UP(130), .dtype = F16),
    MULTI("matmul_multi f16 M20 qkv K64", .M = 20, .K = 64, QKV(67, 29), .dtype = F16),
    MULTI("matmul_multi bf16 M1 gate_up K64", .M = 1, .K = 64, GATE_UP(130), .dtype = BF16),
    MULTI("matmul_multi bf16 M8 qkv K67", .M = 8, .K = 67, QKV(67, 29), .dtype = BF16),
    MULTI("matmul_multi bf16 M33 qkv K67", .M = 33, .K = 67, QKV(67, 29), .dtype = BF16),
    MULTI("matmul_multi q8_0 M1 qkv wide K96", .M = 1, .K = 96, QKV(200, 40), .dtype = Q8_0),
    MULTI("matmul_multi q8_0 M8 qkv K64", .M = 8, .K = 64, QKV(67, 29), .dtype = Q8_0),
    MULTI("matmul_multi q8_0 M17 gate_up K96", .M = 17, .K = 96, GATE_UP(130), .dtype = Q8_0),
    MULTI("matmul_multi q8_0 M12 decode gate_up", .M = 12, .K = 64, GATE_UP(67), .dtype = Q8_0,
          .kind = VKS_MATMUL_DECODE),
    MULTI("matmul_multi q4_0 M1 qkv K96", .M = 1, .K = 96, QKV(67, 29), .dtype = Q4_0),
    MULTI("matmul_multi q4_0 M8 gate_up K64", .M = 8, .K = 64, GATE_UP(130), .dtype = Q4_0),
    MULTI("matmul_multi q4_0 M17 qkv K96", .M = 17, .K = 96, QKV(67, 29), .dtype = Q4_0),
    MULTI("matmul_multi q4_k M1 qkv K256", .M = 1, .K = 256, QKV(67, 29), .dtype = Q4_K),
    MULTI("matmul_multi q4_k M8 gate_up K256", .M = 8, .K = 256, GATE_UP(130), .dtype = Q4_K),
    MULTI("matmul_multi q4_k M65 qkv K256 accumulate", .M = 65, .K = 256, QKV(131, 33), .dtype = Q4_K,
          .accumulate = true),
    /* the matvec kernels' MULTI variants: GPUs' decode (forced here on CPU drivers: MV_GPU with
     * subgroups, MV_SHARED without), q4_0 / q4_k decode everywhere; more than 8 rows in groups of 8 */
    MULTI("matmul_multi f32 M1 qkv K67 matvec", .M = 1, .K = 67, QKV(67, 29), .dtype = F32, .path = MV_GPU),
    MULTI("matmul_multi f32 M3 qkv wide K64 matvec", .M = 3, .K = 64, QKV(300, 20), .dtype = F32, .path = MV_GPU),
    MULTI("matmul_multi f32 M12 decode qkv accumulate matvec", .M = 12, .K = 64, QKV(67, 29), .dtype = F32,
          .kind = VKS_MATMUL_DECODE, .accumulate = true, .path = MV_GPU),
    MULTI("matmul_multi f16 M1 gate_up K64 matvec", .M = 1, .K = 64, GATE_UP(130), .dtype = F16, .path = MV_GPU),
    MULTI("matmul_multi bf16 M2 qkv K67 matvec", .M = 2, .K = 67, QKV(67, 29), .dtype = BF16, .path = MV_GPU),
    MULTI("matmul_multi q8_0 M1 qkv K96 matvec", .M = 1, .K = 96, QKV(67, 29), .dtype = Q8_0, .path = MV_GPU),
    MULTI("matmul_multi q8_0 M8 gate_up accumulate matvec", .M = 8, .K = 64, GATE_UP(67), .dtype = Q8_0,
          .accumulate = true, .path = MV_GPU),
    MULTI("matmul_multi q4_0 M5 gate_up K96 accumulate", .M = 5, .K = 96, GATE_UP(67), .dtype = Q4_0,
          .accumulate = true),
    MULTI("matmul_multi q4_0 M12 decode qkv", .M = 12, .K = 64, QKV(67, 29), .dtype = Q4_0,
          .kind = VKS_MATMUL_DECODE),
    MULTI("matmul_multi q4_k M3 qkv K512 accumulate", .M = 3, .K = 512, QKV(37, 13), .dtype = Q4_K,
          .accumulate = true),
    /* mixed weight types: one dispatch per product */
    MULTI("matmul_multi q4_0 M1 qkv mixed q8_0 matvec", .M = 1, .K = 64, QKV(67, 29), .dtype = Q4_0, .mixed = true,
          .dtype_rest = Q8_0, .path = MV_GPU),
    MULTI("matmul_multi f32 M17 gate_up mixed f16", .M = 17, .K = 64, GATE_UP(130), .dtype = F32, .mixed = true,
          .dtype_rest = F16),
    MULTI("matmul_multi f32 M1 qkv K67 matvec shared", .M = 1, .K = 67, QKV(67, 29), .dtype = F32,
          .path = MV_SHARED),
    MULTI("matmul_multi f16 M8 qkv K64 matvec shared", .M = 8, .K = 64, QKV(67, 29), .dtype = F16,
          .path = MV_SHARED),
    MULTI("matmul_multi bf16 M1 gate_up K64 matvec shared", .M = 1, .K = 64, GATE_UP(130), .dtype = BF16,
          .accumulate = true, .path = MV_SHARED),
    MULTI("matmul_multi q8_0 M12 decode gate_up accumulate matvec shared", .M = 12, .K = 64, GATE_UP(67),
          .dtype = Q8_0, .kind = VKS_MATMUL_DECODE, .accumulate = true, .path = MV_SHARED),
    MULTI("matmul_multi q4_0 M2 qkv K96 matvec shared", .M = 2, .K = 96, QKV(67, 29), .dtype = Q4_0,
          .path = MV_SHARED),
    MULTI("matmul_multi q4_k M1 gate_up K256 matvec shared", .M = 1, .K = 256, GATE_UP(130), .dtype = Q4_K,
          .path = MV_SHARED),
    SWIGLU_MM("matmul_swiglu f32 M1 N131 K67", .M = 1, .N = 131, .K = 67, .dtype = F32),
    SWIGLU_MM("matmul_swiglu f32 M8 N67 K67", .M = 8, .N = 67, .K = 67, .dtype = F32),
    SWIGLU_MM("matmul_swiglu f32 M17 N131 K67", .M = 17, .N = 131, .K = 67, .dtype = F32),
    SWIGLU_MM("matmul_swiglu f32 M70 N131 K67", .M = 70, .N = 131, .K = 67, .dtype = F32),
    SWIGLU_MM("matmul_swiglu f16 M1 N131 K67", .M = 1, .N = 131, .K = 67, .dtype = F16),
    SWIGLU_MM("matmul_swiglu f16 M8 N67 K67", .M = 8, .N = 67, .K = 67, .dtype = F16),
    SWIGLU_MM("matmul_swiglu f16 M17 N131 K67", .M = 17, .N = 131, .K = 67, .dtype = F16),
    SWIGLU_MM("matmul_swiglu f16 M70 N131 K67", .M = 70, .N = 131, .K = 67, .dtype = F16),
    SWIGLU_MM("matmul_swiglu bf16 M1 N131 K67", .M = 1, .N = 131, .K = 67, .dtype = BF16),
    SWIGLU_MM("matmul_swiglu bf16 M8 N67 K67", .M = 8, .N = 67, .K = 67, .dtype = BF16),
    SWIGLU_MM("matmul_swiglu bf16 M17 N131 K67", .M = 17, .N = 131, .K = 67, .dtype = BF16),
    SWIGLU_MM("matmul_swiglu bf16 M70 N131 K67", .M = 70, .N = 131, .K = 67, .dtype = BF16),
    SWIGLU_MM("matmul_swiglu q8_0 M1 N131 K96", .M = 1, .N = 131, .K = 96, .dtype = Q8_0),
    SWIGLU_MM("matmul_swiglu q8_0 M8 N67 K96", .M = 8, .N = 67, .K = 96, .dtype = Q8_0),
    SWIGLU_MM("matmul_swiglu q8_0 M17 N131 K96", .M = 17, .N = 131, .K = 96, .dtype = Q8_0),
    SWIGLU_MM("matmul_swiglu q8_0 M70 N131 K96", .M = 70, .N = 131, .K = 96, .dtype = Q8_0),
    SWIGLU_MM("matmul_swiglu q4_0 M1 N131 K96", .M = 1, .N = 131, .K = 96, .dtype = Q4_0),
    SWIGLU_MM("matmul_swiglu q4_0 M8 N67 K96", .M = 8, .N = 67, .K = 96, .dtype = Q4_0),
    SWIGLU_MM("matmul_swiglu q4_0 M17 N131 K96", .M = 17, .N = 131, .K = 96, .dtype = Q4_0),
    SWIGLU_MM("matmul_swiglu q4_0 M70 N131 K96", .M = 70, .N = 131, .K = 96, .dtype = Q4_0),
    SWIGLU_MM("matmul_swiglu q4_k M1 N131 K256", .M = 1, .N = 131, .K = 256, .dtype = Q4_K),
    SWIGLU_MM("matmul_swiglu q4_k M8 N67 K256", .M = 8, .N = 67, .K = 256, .dtype = Q4_K),
    SWIGLU_MM("matmul_swiglu q4_k M17 N131 K256", .M = 17, .N = 131, .K = 256, .dtype = Q4_K),
    SWIGLU_MM("matmul_swiglu q4_k M70 N131 K256", .M = 70, .N = 131, .K = 256, .dtype = Q4_K),
    /* |g| up to ~100: exp(-g) overflowing and underflowing, on both paths */
    SWIGLU_MM("matmul_swiglu f32 M70 N131 K64 large", .M = 70, .N = 131, .K = 64, .dtype = F32, .x_range = 24),
    SWIGLU_MM("matmul_swiglu f32 M1 N300 K64 large", .M = 1, .N = 300, .K = 64, .dtype = F32, .x_range = 24),
    SWIGLU_MM("matmul_swiglu q8_0 M12 decode N67 K64", .M = 12, .N = 67, .K = 64, .dtype = Q8_0, .kind = VKS_MATMUL_DECODE),
    EMBED("embed q8_0", .tokens = 9, .dim = 96, .vocab = 100, .dtype = Q8_0),
    EMBED("embed q4_0 chunk", .tokens = 17, .dim = 64, .vocab = 90, .dtype = Q4_0, .chunk = true),
    EMBED("embed q4_k chunk", .tokens = 17, .dim = 512, .vocab = 30, .dtype = Q4_K, .chunk = true),
    EMBED("embed f32", .tokens = 9, .dim = 67, .vocab = 100, .dtype = F32),
    EMBED("embed f16", .tokens = 9, .dim = 67, .vocab = 100, .dtype = F16),
    EMBED("embed bf16", .tokens = 9, .dim = 67, .vocab = 100, .dtype = BF16),
    EMBED("embed f16 chunk", .tokens = 17, .dim = 33, .vocab = 90, .dtype = F16, .chunk = true),
    EMBED("embed f32 chunk", .tokens = 17, .dim = 64, .vocab = 90, .dtype = F32, .chunk = true),
    {"rmsnorm D67", run_rmsnorm, .tol = 1e-12, .rows = {.R = 5, .D = 67}},
    {"rmsnorm D4096 in place", run_rmsnorm, .tol = 1e-12, .rows = {.R = 3, .D = 4096, .in_place = true}},
    {"rmsnorm D1", run_rmsnorm, .tol = 1e-12, .rows = {.R = 2, .D = 1}},
    ROPE("rope adjacent hd8", .R = 7, .heads = 3, .head_dim = 8, .max_pos = 300, .mode = VKS_ROPE_ADJACENT),
    ROPE("rope half hd64", .R = 9, .heads = 2, .head_dim = 64, .max_pos = 300, .mode = VKS_ROPE_HALF),
    ROPE("rope adjacent hd128", .R = 5, .heads = 4, .head_dim = 128, .max_pos = 300, .mode = VKS_ROPE_ADJACENT),
    ROPE("rope half hd128", .R = 5, .heads = 4, .head_dim = 128, .max_pos = 300, .mode = VKS_ROPE_HALF),
    {"kv_store", run_kv_store, .tol = 0, .kv_store = {.R = 7, .kv_dim = 67, .seq_len = 20}},
    {"rope_kv_store adjacent hd8 gqa3", run_rope_kv_store, .tol = 1e-10,
     .rope_kv = {.R = 7, .heads = 6, .kv_heads = 2, .head_dim = 8, .seq_len = 20, .mode = VKS_ROPE_ADJACENT}},
    {"rope_kv_store half hd64 gqa2", run_rope_kv_store, .tol = 1e-10,
     .rope_kv = {.R = 9, .heads = 4, .kv_heads = 2, .head_dim = 64, .seq_len = 300, .mode = VKS_ROPE_HALF}},
    {"rope_kv_store adjacent hd128 mha", run_rope_kv_store, .tol = 1e-10,
     .rope_kv = {.R = 5, .heads = 3, .kv_heads = 3, .head_dim = 128, .seq_len = 40, .mode = VKS_ROPE_ADJACENT}},
    ATTN("attention hd8 gqa1", .heads = 2, .kv_heads = 2, .head_dim = 8, .seq_len = 40, .decode_rows = 5),
    ATTN("attention hd64 gqa2", .heads = 4, .kv_heads = 2, .head_dim = 64, .seq_len = 300, .decode_rows = 3),
    ATTN("attention hd128 gqa4", .heads = 8, .kv_heads = 2, .head_dim = 128, .seq_len = 150, .decode_rows = 4),
    ATTN("attention hd256 gqa1", .heads = 2, .kv_heads = 2, .head_dim = 256, .seq_len = 70, .decode_rows = 2),
    ATTN("attention hd72 gqa4", .heads = 4, .kv_heads = 1, .head_dim = 72, .seq_len = 129, .decode_rows = 1),
    {"kv_store f16", run_kv_store_f16, .tol = 0, .kv_store = {.R = 7, .kv_dim = 66, .seq_len = 20}},
    ATTN_F16("attention f16 hd8 gqa1", .heads = 2, .kv_heads = 2, .head_dim = 8, .seq_len = 40, .decode_rows = 5),
    ATTN_F16("attention f16 hd64 gqa2", .heads = 4, .kv_heads = 2, .head_dim = 64, .seq_len = 300, .decode_rows = 3),
    ATTN_F16("attention f16 hd128 gqa4 splits", .heads = 8, .kv_heads = 2, .head_dim = 128, .seq_len = 600,
             .decode_rows = 4),
    ATTN_F16("attention f16 hd128 gqa2 splits", .heads = 4, .kv_heads = 2, .head_dim = 128, .seq_len = 280,
             .decode_rows = 2),
    ATTN_F16("attention f16 hd256 gqa1", .heads = 2, .kv_heads = 2, .head_dim = 256, .seq_len = 70, .decode_rows = 2),
    ATTN_F16("attention f16 hd72 gqa6 splits", .heads = 6, .kv_heads = 1, .head_dim = 72, .seq_len = 520,
             .decode_rows = 3),
    {"swiglu", run_swiglu, .tol = 1e-12, .elementwise = {.n = 100003}},
    {"swiglu in place", run_swiglu, .tol = 1e-12, .elementwise = {.n = 1, .in_place = true}},
    {"add", run_add, .tol = 1e-14, .elementwise = {.n = 1000}},
    {"bias_add", run_bias_add, .tol = 1e-14, .rows = {.R = 7, .D = 131}},
    {"bias_add one column", run_bias_add, .tol = 1e-14, .rows = {.R = 300, .D = 1}},
    {"gather_rows", run_gather, .tol = 0, .gather = {.R = 13, .D = 67, .src_rows = 10}},
    SAMPLE("sample greedy V32000", .S = 4, .V = 32000, .temperature = 0.0f),
    SAMPLE("sample greedy ties", .S = 8, .V = 1000, .temperature = 0.0f, .ties = true),
    SAMPLE("sample T0.8", .S = 200, .V = 1000, .temperature = 0.8f),
    SAMPLE("sample top-k 40", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 40),
    SAMPLE("sample top-k ties", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 40, .ties = true),
    SAMPLE("sample top-p 0.9", .S = 200, .V = 1000, .temperature = 1.0f, .top_p = 0.9f),
    SAMPLE("sample top-k 50 top-p 0.7 ties", .S = 200, .V = 1000, .temperature = 0.7f, .top_k = 50,
           .top_p = 0.7f, .ties = true),
    SAMPLE("sample V32000 top-k top-p", .S = 4, .V = 32000, .temperature = 0.9f, .top_k = 100, .top_p = 0.95f),
    /* the radix select's edges: one key kept (with its ties), all but one, digits that tie in every pass */
    SAMPLE("sample top-k 1 ties", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 1, .ties = true),
    SAMPLE("sample top-k 999", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 999),
    SAMPLE("sample top-k 3 top-p 0.5 V32000 ties", .S = 8, .V = 32000, .temperature = 1.3f, .top_k = 3, .top_p = 0.5f,
           .ties = true),
    /* more workgroups than maxComputeWorkGroupCount[0] (65535 on lavapipe): folded into y */
    SAMPLE("sample u near 1", .S = 16, .V = 64, .temperature = 1.0f, .near_one = true),
    SAMPLE("sample greedy 70000 rows", .S = 70000, .V = 3, .temperature = 0.0f, .ties = true),
    /* top-k's radix select over several workgroups per row (vks_op_sample_split) */
    SAMPLE("sample split top-k 40 V151936", .S = 8, .V = 151936, .temperature = 1.0f, .top_k = 40, .split = VKS_AUTO_W),
    SAMPLE("sample split top-k 1 ties V151936", .S = 4, .V = 151936, .temperature = 0.8f, .top_k = 1, .ties = true,
           .split = VKS_AUTO_W, .seed = 3),
    SAMPLE("sample split top-k 40 top-p 0.9 ties mixed V151936", .S = 8, .V = 151936, .temperature = 1.1f, .top_k = 40,
           .top_p = 0.9f, .ties = true, .mixed = true, .split = VKS_AUTO_W, .seed = 5),
    SAMPLE("sample split top-k V-1 V32000", .S = 6, .V = 32000, .temperature = 1.0f, .top_k = 31999, .split = VKS_AUTO_W),
    SAMPLE("sample split top-k V V32000", .S = 6, .V = 32000, .temperature = 1.0f, .top_k = 32000, .split = VKS_AUTO_W),
    SAMPLE("sample split top-k 40 top-p 0.95 V32000 nans", .S = 8, .V = 32000, .temperature = 0.7f, .top_k = 40,
           .top_p = 0.95f, .nans = true, .split = VKS_AUTO_W, .seed = 7),
    SAMPLE("sample split top-k 7 top-p 0.5 ties V50021", .S = 8, .V = 50021, .temperature = 1.3f, .top_k = 7,
           .top_p = 0.5f, .ties = true, .split = VKS_AUTO_W, .seed = 11),
    SAMPLE("sample split top-k 3000 ties mixed V50021 W64", .S = 8, .V = 50021, .temperature = 2.0f, .top_k = 3000,
           .ties = true, .mixed = true, .split = 64, .seed = 13),
    SAMPLE("sample split top-k 50 top-p 0.7 ties V1000 W3", .S = 200, .V = 1000, .temperature = 0.7f, .top_k = 50,
           .top_p = 0.7f, .ties = true, .split = 3, .seed = 17),
    SAMPLE("sample split top-k 40 mixed nans V1000 W7", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 40,
           .top_p = 0.8f, .mixed = true, .nans = true, .split = 7, .seed = 19),
    SAMPLE("sample split top-k 999 V1000 W2", .S = 200, .V = 1000, .temperature = 1.0f, .top_k = 999, .split = 2, .seed = 23),
    /* nearly flat scores (T 20): a kept set one token off changes about half the tokens at k 1 or 2 */
    SAMPLE("sample split top-k 2 T20 V151936 W38", .S = 32, .V = 151936, .temperature = 20.0f, .top_k = 2, .split = 38,
           .seed = 31),
    SAMPLE("sample split top-k 1 T20 V100003 W25", .S = 32, .V = 100003, .temperature = 20.0f, .top_k = 1, .split = 25,
           .seed = 37),
    SAMPLE("sample split top-k 1 V37 W37", .S = 64, .V = 37, .temperature = 1.0f, .top_k = 1, .ties = true, .split = 37, .seed = 29),
    /* top-p's radix select over several workgroups per row: exact masses, so the one-workgroup kernel's tokens */
    SAMPLE("sample split top-p 0.9 V151936", .S = 8, .V = 151936, .temperature = 1.0f, .top_p = 0.9f, .split = VKS_AUTO_W,
           .seed = 41),
    SAMPLE("sample split top-p 0.9 T20 V151936 W38", .S = 32, .V = 151936, .temperature = 20.0f, .top_p = 0.9f,
           .split = 38, .seed = 43),
    SAMPLE("sample split top-p 0.5 ties nans infs V50021 W1-64", .S = 10, .V = 50021, .temperature = 0.7f, .top_p = 0.5f,
           .ties = true, .nans = true, .infs = true, .split = VKS_SWEEP_W, .seed = 47),
    SAMPLE("sample split top-k 40 top-p 0.9 T0.3 V100003 W1-64", .S = 6, .V = 100003, .temperature = 0.3f, .top_k = 40,
           .top_p = 0.9f, .split = VKS_SWEEP_W, .seed = 53),
    SAMPLE("sample split top-k 3000 top-p 0.99 T2 ties mixed nans V4099 W1-64", .S = 8, .V = 4099, .temperature = 2.0f,
           .top_k = 3000, .top_p = 0.99f, .ties = true, .mixed = true, .nans = true, .split = VKS_SWEEP_W, .seed = 59),
    SAMPLE("sample split top-p 0.95 T1.5 mixed nans infs V1000 W3", .S = 200, .V = 1000, .temperature = 1.5f, .top_k = 100,
           .top_p = 0.95f, .mixed = true, .nans = true, .infs = true, .split = 3, .seed = 61),
    SAMPLE("sample split top-p 1e-30 ties V4099 W5", .S = 16, .V = 4099, .temperature = 1.0f, .top_p = 1e-30f, .ties = true,
           .split = 5, .seed = 67),
    SAMPLE("sample split top-p 0.999999 T4 V4099 W2", .S = 16, .V = 4099, .temperature = 4.0f, .top_p = 0.999999f,
           .split = 2, .seed = 71),
    SAMPLE("sample split top-p 0.8 ties V37 W37", .S = 64, .V = 37, .temperature = 1.0f, .top_p = 0.8f, .ties = true,
           .split = 37, .seed = 73),
    /* top-p's digit scans: the workgroup's suffix sums (GPUs) and one invocation's walk (CPU drivers) */
    SAMPLE("sample split top-k 40 top-p 0.9 T0.3 V100003 W1-64 parallel scan", .S = 6, .V = 100003, .temperature = 0.3f,
           .top_k = 40, .top_p = 0.9f, .split = VKS_SWEEP_W, .seed = 53, .serial_scan = 1),
    SAMPLE("sample split top-p 0.5 ties nans infs V50021 W1-64 serial scan", .S = 10, .V = 50021, .temperature = 0.7f,
           .top_p = 0.5f, .ties = true, .nans = true, .infs = true, .split = VKS_SWEEP_W, .seed = 47, .serial_scan = 2),
    SAMPLE("sample split top-p 0.95 T1.5 mixed nans infs V1000 W3 parallel scan", .S = 200, .V = 1000, .temperature = 1.5f,
           .top_k = 100, .top_p = 0.95f, .mixed = true, .nans = true, .infs = true, .split = 3, .seed = 61, .serial_scan = 1),
    SAMPLE("sample top-p 0.95 T1.5 ties nans infs", .S = 200, .V = 1000, .temperature = 1.5f, .top_p = 0.95f, .ties = true,
           .nans = true, .infs = true, .seed = 79),
    {"add 2^24+3 elements", run_add, .tol = 0, .elementwise = {.n = (1u << 24) + 3}},
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
    fprintf(stderr, "device: %s, subgroup %u, shared %u, matmul in %s\n", info->name, info->subgroup_size,
            info->max_shared_bytes, vks_ops_f16_math(ops) ? "half arithmetic" : "f32");
    const char *want_f16 = getenv("VKSWARM_FP16_MATH");
    if (want_f16 && !strcmp(want_f16, "1") && !vks_ops_f16_math(ops)) {
        fprintf(stderr, "VKSWARM_FP16_MATH=1 but the half-arithmetic kernels are off (device without shaderFloat16)\n");
        return info->fp16_arith ? -1 : 0;
    }
    return 0;
}

static int group_teardown(void **state) {
    (void)state;
    vks_ops_destroy(ops);
    vks_gpu_destroy(gpu);
    return 0;
}

static void run_case(void **state) {
    const op_case *tc = *state;
    tc->run(tc);
    assert_int_equal(vks_gpu_validation_messages(gpu), 0);
}

/* VKSWARM_TEST_SHORT (tools/test's ASan build): the first row of each runner
 * kind (its first two words: op and dtype or mode) plus the accumulate-window
 * rows (their bindings are offsets into larger buffers), since ASan sees the
 * host side, which the rows of a kind share; the normal build runs every row. */
static size_t kind_length(const char *name) { /* the first two words: "matmul q4_k", "sample greedy" */
    size_t n = strcspn(name, " ");
    return name[n] ? n + 1 + strcspn(name + n + 1, " ") : n;
}

static bool first_of_kind(size_t i) {
    size_t n = kind_length(cases[i].name);
    for (size_t j = 0; j < i; j++)
        if (cases[j].run == cases[i].run && kind_length(cases[j].name) == n && !strncmp(cases[j].name, cases[i].name, n))
            return false;
    return true;
}

int main(void) {
    enum { N_CASES = sizeof cases / sizeof cases[0] };
    /* matmul_multi rows test the fused kernels on every path they exist for
     * (CPU drivers otherwise keep the 8-row tiles as separate dispatches) */
    setenv("VKSWARM_MATMUL_FUSE", "1", 0);
    struct CMUnitTest tests[N_CASES];
    size_t n = 0;
    for (size_t i = 0; i < N_CASES; i++)
        if ((!tu_test_short() || first_of_kind(i) || strstr(cases[i].name, "window")) && !tu_case_skipped(cases[i].name))
            tests[n++] = (struct CMUnitTest){cases[i].name, run_case, NULL, NULL, (void *)&cases[i]};
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return _cmocka_run_group_tests("ops", tests, n, group_setup, group_teardown);
}
