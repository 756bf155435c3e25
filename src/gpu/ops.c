/* ops.c: records transformer ops as kernel dispatches (vks_ops.h). Uses only
 * the runtime API of vks_gpu.h. Every op validates its sizes and buffer
 * ranges on the host (VKS_ERR_ARG) so that no kernel can read or write out of
 * range; kernels bounds-check everything else (tile edges, surplus groups). */
#include "ops_internal.h"
#include "vkswarm/vks_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool offset_aligned(vks_binding b, size_t align) { return b.offset % align == 0; }

/* ---- GPU weight layout ---- */

/* Block types are repacked so that every kernel load is aligned: Q8_0 and
 * Q4_0 keep the quants of all blocks first (32 and 16 bytes per block) and the
 * f16 scales after them, two per word; Q4_K blocks are 144 = 9 * 16 bytes and
 * stay as they are. Sizes are rounded up to whole 16-byte vectors (plain
 * types: to whole words). */
size_t vks_op_weight_bytes(vks_dtype t, uint64_t rows, uint64_t cols) {
    uint64_t n;
    if (!vks_ops_dtype_suffix(t) || __builtin_mul_overflow(rows, cols, &n)) return 0;
    uint64_t be = vks_dtype_block_elems(t), bytes, blocks = n / be;
    if (cols % be) return 0;
    switch (t) {
    case VKS_DTYPE_Q8_0: bytes = n + blocks * 2; break;
    case VKS_DTYPE_Q4_0: bytes = n / 2 + blocks * 2; break;
    case VKS_DTYPE_Q4_K: bytes = blocks * vks_dtype_block_bytes(t); break;
    default: /* plain elements, whole words (as check_range counts them) */
        if (__builtin_mul_overflow(n, vks_dtype_size(t), &bytes) || bytes > SIZE_MAX - 3) return 0;
        return (size_t)((bytes + 3) / 4 * 4);
    }
    if (bytes > SIZE_MAX - 15) return 0;
    return (size_t)((bytes + 15) / 16 * 16);
}

int vks_op_pack_weight_rows(vks_dtype t, const void *blocks, uint64_t row0, uint64_t n, uint64_t rows,
                            uint64_t cols, void *dst) {
    uint64_t row_bytes;
    if (!blocks || !dst || !vks_op_weight_bytes(t, rows, cols) || row0 > rows || n > rows - row0 ||
        !vks_dtype_row_bytes(t, cols, &row_bytes))
        return vks_set_error(VKS_ERR_ARG, "vks_op_pack_weight_rows: bad arguments (%s, rows %llu+%llu of %llu x %llu)",
                             vks_dtype_name(t), (unsigned long long)row0, (unsigned long long)n,
                             (unsigned long long)rows, (unsigned long long)cols);
    if (t != VKS_DTYPE_Q8_0 && t != VKS_DTYPE_Q4_0) { /* the layout is the rows themselves */
        memcpy((unsigned char *)dst + row0 * row_bytes, blocks, (size_t)(n * row_bytes));
        return VKS_OK;
    }
    /* Q8_0 / Q4_0: quants of block b at b * quant_bytes, its f16 scale after all quants */
    size_t quant_bytes = t == VKS_DTYPE_Q8_0 ? 32 : 16, bb = 2 + quant_bytes;
    size_t blocks_per_row = (size_t)cols / 32, first = (size_t)row0 * blocks_per_row;
    size_t count = (size_t)n * blocks_per_row, all = (size_t)rows * blocks_per_row;
    const unsigned char *src = blocks;
    unsigned char *quants = dst, *scales = quants + all * quant_bytes;
    for (size_t i = 0; i < count; i++) {
        memcpy(scales + 2 * (first + i), src + i * bb, 2);
        memcpy(quants + (first + i) * quant_bytes, src + i * bb + 2, quant_bytes);
    }
    return VKS_OK;
}

int vks_op_pack_weights(vks_dtype t, const void *blocks, uint64_t rows, uint64_t cols, void *dst) {
    size_t total = vks_op_weight_bytes(t, rows, cols);
    if (!dst || total == 0)
        return vks_set_error(VKS_ERR_ARG, "vks_op_pack_weights: bad arguments (%s, %llu x %llu)", vks_dtype_name(t),
                             (unsigned long long)rows, (unsigned long long)cols);
    memset(dst, 0, total); /* the padding after the last block */
    return vks_op_pack_weight_rows(t, blocks, 0, rows, rows, cols, dst);
}

/* ---- creation ---- */

static void choose_matmul_tiles(vks_ops *o) {
    /* 64x128 output tiles, 16-deep K slices, 8x8 outputs per invocation:
     * 128 invocations and, staged (GPUs), 30 KiB of shared memory (two
     * buffers of padded tiles, matmul.comp; 15 KiB in half). The large register tile
     * makes each (vec4) shared-memory load feed 32 multiply-adds, which is
     * what counts on CPU implementations, where every load is gathered lane
     * by lane (lavapipe: 3-6x the rate of 4x4 outputs with scalar loads). */
    o->mm_bm = 64; o->mm_bn = 128; o->mm_bk = 16; o->mm_tm = 8; o->mm_tn = 8;
    uint32_t limit = o->info.max_workgroup_size_x ? o->info.max_workgroup_size_x : 128;
    if (limit < 128) o->mm_bn = 64; /* 64 invocations */
    uint32_t shared = 2 * (o->mm_bm + o->mm_bn) * (o->mm_bk + 4) * 4; /* matmul.comp, matmul_grad.comp */
    if (o->info.max_shared_bytes && shared > o->info.max_shared_bytes) o->mm_bk = 4; /* stays a multiple of 4 */
    /* CPU drivers: operands read straight from the buffers (matmul.comp's DIRECT) */
    const char *env = getenv("VKSWARM_MATMUL_DIRECT");
    o->mm_direct = env && (!strcmp(env, "0") || !strcmp(env, "1")) ? env[0] == '1' : o->info.type == VKS_DEVTYPE_CPU;
    /* Decode on CPU drivers with subgroup broadcasts: f32, f16, bf16 and q8_0
     * rows through the same subgroup-broadcast matmul as prefill, in tiles of
     * 8 rows (record_matmul_decode). lavapipe's matvec made ~3.5 multiply-adds
     * per lane-by-lane load at 8 rows (each row's x re-read per weight row);
     * the tile makes ~25. Each output still sums k in order whatever the rows
     * around it: decode stays batch-invariant, and equals prefill bit for bit. */
    o->mm_decode = o->mm_direct && o->info.type == VKS_DEVTYPE_CPU && o->info.subgroup_arith &&
                   o->info.subgroup_ballot && !getenv("VKSWARM_NO_SUBGROUP");
    /* vks_op_matmul_multi on CPU drivers (DIRECT): the fused dispatch of the
     * 8-row tiles (decode of several rows, prefill) measured 1.06-2x the time of
     * separate dispatches on lavapipe, the one-row tiles (decode of one row)
     * 0.57-0.90x (BENCHMARKS.md): fused only there. VKSWARM_MATMUL_FUSE=0 never
     * fuses, =1 fuses wherever the kernel allows (test_ops tests the kernels so). */
    const char *fuse = getenv("VKSWARM_MATMUL_FUSE");
    o->mm_fuse = fuse && (!strcmp(fuse, "0") || !strcmp(fuse, "1")) ? (fuse[0] == '1' ? 2 : 0) : 1;
    /* ... and the matvec / matvec_q kernels' MULTI variants (decode on GPUs, and
     * q4_0 / q4_k decode on CPU drivers): on GPUs only; on lavapipe the fused
     * q4_0 / q4_k dispatch took 1.2-3.3x the time of separate ones (BENCHMARKS.md) */
    o->mv_fuse = o->mm_fuse == 2 || (o->mm_fuse == 1 && o->info.type != VKS_DEVTYPE_CPU);
    /* vks_op_matmul_swiglu: fused wherever the kernel applies, on CPU drivers too
     * (lavapipe, medians: 0.67-0.92x the time of matmul_multi + swiglu at one and
     * 8 rows, 0.83-0.94x in prefill tiles, BENCHMARKS.md); VKSWARM_SWIGLU_FUSE=0 never fuses */
    const char *sw = getenv("VKSWARM_SWIGLU_FUSE");
    o->swiglu_fuse = !(sw && !strcmp(sw, "0"));
}

static void choose_matvec(vks_ops *o) {
    /* VKSWARM_NO_SUBGROUP forces the shared-memory variant (tests use it). */
    o->mv_subgroup = o->info.subgroup_arith && !getenv("VKSWARM_NO_SUBGROUP");
    uint32_t sg = o->info.subgroup_size ? o->info.subgroup_size : 1;
    if (o->mv_subgroup) {
        /* 4 subgroups of (ideally) 32-64 lanes; each takes 2 rows per pass. */
        o->mv_wg = vks_ops_pick_wg(&o->info, sg >= 64 ? 256 : (sg * 4 < 128 ? 128 : sg * 4));
        o->mv_rows = 2;
        o->mv_rows_per_wg = o->mv_rows * (o->mv_wg / sg);
    } else {
        /* shared reduction of rows*M partial sums per invocation: 128*2*8*4 = 8 KiB */
        o->mv_wg = vks_ops_pick_wg(&o->info, 128);
        o->mv_rows = 2;
        o->mv_rows_per_wg = 2;
    }
}

static bool default_f16_math(const vks_device_info *info) {
    const char *env = getenv("VKSWARM_FP16_MATH");
    if (env && (!strcmp(env, "0") || !strcmp(env, "1"))) return info->fp16_arith && env[0] == '1';
    return info->fp16_arith && info->type != VKS_DEVTYPE_CPU;
}

bool vks_ops_f16_math(const vks_ops *o) { return o && o->mm_f16_math; }

void vks_ops_set_f16_math(vks_ops *o, bool on) {
    if (o) o->mm_f16_math = on && o->info.fp16_arith;
}

int vks_ops_create(vks_gpu *g, vks_ops **out) {
    if (!g || !out) return vks_set_error(VKS_ERR_ARG, "vks_ops_create: NULL argument");
    vks_ops *o = calloc(1, sizeof *o);
    if (!o) return vks_set_error(VKS_ERR_NOMEM, "vks_ops_create: out of host memory");
    o->g = g;
    o->info = *vks_gpu_info(g);
    o->wg_elementwise = vks_ops_pick_wg(&o->info, 256);
    o->wg_row = vks_ops_pick_wg(&o->info, 256);
    /* CPU drivers run a workgroup's lanes as SIMD vectors of one thread and
     * every barrier as a switch between them: one subgroup per row there
     * (for D = 128: 3 reduction levels instead of 8, and 8 busy lanes instead
     * of 256 mostly idle ones; rmsnorm_backward 4x faster on lavapipe). */
    o->wg_norm = o->info.type == VKS_DEVTYPE_CPU ? vks_ops_pick_wg(&o->info, 1) : o->wg_row;
    /* The sampler's top-k and top-p over several workgroups per row: for GPUs' idle
     * cores; a CPU driver's few threads are as busy with one workgroup per row,
     * and it pays for 9 more dispatches (BENCHMARKS). VKSWARM_SAMPLE_SPREAD=0|1. */
    const char *spread = getenv("VKSWARM_SAMPLE_SPREAD");
    o->sample_spread = spread && (!strcmp(spread, "0") || !strcmp(spread, "1")) ? spread[0] == '1'
                                                                                  : o->info.type != VKS_DEVTYPE_CPU;
    /* Top-p's per-pass digit: invocation 0 walks the 256 bins on CPU drivers (a
     * parallel scan's 11 barriers cost 3-4x the spread sampler there), the
     * workgroup's suffix sums on GPUs (the same digit). VKSWARM_SAMPLE_SERIAL_SCAN=0|1. */
    const char *serial = getenv("VKSWARM_SAMPLE_SERIAL_SCAN");
    o->sample_serial_scan = serial && (!strcmp(serial, "0") || !strcmp(serial, "1")) ? serial[0] == '1'
                                                                                       : o->info.type == VKS_DEVTYPE_CPU;
    o->wg_attention = vks_ops_pick_wg(&o->info, 64);
    /* The same on CPU drivers for attention over the KV cache: there a
     * 64-lane workgroup is 8 SIMD chunks switched at each of its reductions'
     * barriers, for a head of 8-128 values and (decoding) a few dozen keys.
     * Measured on lavapipe, stories260K, 200 sequences x 40 positions: the
     * kernel 1.5-2.5x faster, the whole generation ~12% less CPU time. */
    o->wg_attention_kv = o->info.type == VKS_DEVTYPE_CPU ? vks_ops_pick_wg(&o->info, 1) : o->wg_attention;
    o->attention_kv_sg = o->info.type == VKS_DEVTYPE_CPU && o->info.subgroup_arith && o->info.subgroup_shuffle &&
                         o->info.subgroup_size >= 4 && !getenv("VKSWARM_NO_SUBGROUP");
    /* Prefill: several query rows of one sequence per subgroup
     * (attention_rows_sg), each K/V element loaded once for all of them;
     * VKSWARM_ATTN_ROWS=1..4 fixes the count (1: one row per subgroup).
     * The tile kernel likewise (attention_rows: rows per workgroup, each K/V
     * tile loaded once for them): 4 on GPUs; on CPU drivers (where it runs
     * only without the subgroup variant) one row unless VKSWARM_ATTN_ROWS
     * asks for more. Its shared memory, ROWS * (256 + wg) + wg floats, is
     * kept within the device's limit (4 rows of 64 lanes: 5 KiB). */
    const char *rows = getenv("VKSWARM_ATTN_ROWS");
    bool rows_set = rows && rows[0] >= '1' && rows[0] <= '4' && !rows[1];
    o->attention_rows = rows_set ? (uint32_t)(rows[0] - '0') : 4;
    o->attention_tile_rows = rows_set || o->info.type != VKS_DEVTYPE_CPU ? o->attention_rows : 1;
    while (o->attention_tile_rows > 1 && o->info.max_shared_bytes &&
           4ull * (o->attention_tile_rows * (ATTENTION_MAX_HEAD_DIM + o->wg_attention_kv) + o->wg_attention_kv) >
               o->info.max_shared_bytes)
        o->attention_tile_rows--;
    /* The training attention likewise (attention_train_sg.comp): one subgroup
     * of >= 8 lanes per workgroup, rows or keys in registers, the other side
     * broadcast; the tile kernels keep 1-2 of 8 subgroups busy between 3-4
     * barriers per tile there. VKSWARM_ATTN_PER=1..4 fixes its rows (keys)
     * per lane, for benchmarks (attention_train_per in ops_grad_layer.c).
     * Subgroups of 8 or 16 lanes only: lavapipe with LP_NATIVE_VECTOR_WIDTH
     * =1024 reports 32 lanes but runs a 32-invocation workgroup as
     * gl_NumSubgroups = 2, and its subgroupAdd(1) there counted only the
     * lanes of valid rows (the kernel's lane check then gives NaN). */
    o->attention_train_sg = o->info.type == VKS_DEVTYPE_CPU && o->info.subgroup_arith && o->info.subgroup_ballot &&
                            (o->info.subgroup_size == 8 || o->info.subgroup_size == 16) &&
                            !getenv("VKSWARM_NO_SUBGROUP");
    const char *per = getenv("VKSWARM_ATTN_PER");
    o->attention_train_per = per && per[0] >= '1' && per[0] <= '4' && !per[1] ? (uint32_t)(per[0] - '0') : 0;
    choose_matvec(o);
    choose_matmul_tiles(o);
    o->mm_f16_math = default_f16_math(&o->info);
    *out = o;
    return VKS_OK;
}

void vks_ops_destroy(vks_ops *o) { free(o); }

/* ---- ops ---- */

int vks_op_embed(vks_ops *o, vks_cmd *c, vks_binding tokens, vks_binding table, vks_dtype dtype,
                 uint32_t row0, uint32_t table_rows, uint32_t D, vks_binding out, uint32_t R) {
    const char *op = "embed";
    const char *sfx = vks_ops_dtype_suffix(dtype);
    if (!o || !c || !sfx || !table_rows || !D || !R || D % vks_dtype_block_elems(dtype) ||
        (uint64_t)table_rows * D > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "embed: bad arguments");
    int rc = vks_ops_check_range(op, "tokens", tokens, R, 4);
    if (!rc) rc = vks_ops_check_weights(op, "table", table, dtype, table_rows, D);
    if (!rc) rc = vks_ops_check_range(op, "out", out, (uint64_t)R * D, 4);
    if (rc) return rc;
    char name[32];
    snprintf(name, sizeof name, "embed_%s", sfx);
    uint32_t spec[] = {o->wg_elementwise};
    uint32_t push[] = {row0, table_rows, D, R};
    vks_binding b[] = {tokens, table, out};
    return vks_ops_dispatch(o, c, name, spec, 1, b, 3, push, sizeof push,
                    ceil_div((uint64_t)R * D, o->wg_elementwise), op);
}

int vks_op_rmsnorm(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding w, vks_binding out,
                   uint32_t R, uint32_t D, float eps) {
    const char *op = "rmsnorm";
    if (!o || !c || !R || !D || !(eps >= 0.0f))
        return vks_set_error(VKS_ERR_ARG, "rmsnorm: bad arguments");
    int rc = vks_ops_check_range(op, "x", x, (uint64_t)R * D, 4);
    if (!rc) rc = vks_ops_check_range(op, "w", w, D, 4);
    if (!rc) rc = vks_ops_check_range(op, "out", out, (uint64_t)R * D, 4);
    if (rc) return rc;
    struct { uint32_t R, D; float eps; } push = {R, D, eps};
    uint32_t spec[] = {o->wg_norm};
    vks_binding b[] = {x, w, out};
    return vks_ops_dispatch(o, c, "rmsnorm", spec, 1, b, 3, &push, sizeof push, R, op);
}

static int check_matmul_args(vks_ops *o, vks_binding x, vks_binding W, vks_dtype dtype,
                             vks_binding y, uint32_t M, uint32_t N, uint32_t K, uint32_t ldy,
                             uint32_t y_col0) {
    const char *op = "matmul";
    if (!vks_ops_dtype_suffix(dtype) || !M || !N || !K || (uint64_t)y_col0 + N > ldy)
        return vks_set_error(VKS_ERR_ARG, "matmul: bad sizes M=%u N=%u K=%u ldy=%u y_col0=%u",
                             M, N, K, ldy, y_col0);
    (void)o;
    if (vks_ops_is_block_type(dtype)) {
        /* kernels index elements with 32 bits and load whole aligned blocks */
        if (K % vks_dtype_block_elems(dtype) || (uint64_t)N * K > UINT32_MAX)
            return vks_set_error(VKS_ERR_ARG, "matmul: K=%u is not a whole number of %s blocks (or N*K "
                                 "exceeds 2^32)", K, vks_dtype_name(dtype));
        if (!offset_aligned(x, 16) || !offset_aligned(W, 16))
            return vks_set_error(VKS_ERR_ARG, "matmul: %s needs 16-byte aligned x and W bindings",
                                 vks_dtype_name(dtype));
    }
    int rc = vks_ops_check_range(op, "x", x, (uint64_t)M * K, 4);
    if (!rc) rc = vks_ops_check_weights(op, "W", W, dtype, N, K);
    if (!rc) rc = vks_ops_check_range(op, "y", y, (uint64_t)(M - 1) * ldy + y_col0 + N, 4);
    return rc;
}

/* Whether matvec.comp uses 16-byte vector loads: whole vectors per row and
 * aligned bindings (plain types; matvec_q.comp always does). */
static uint32_t matvec_vec4(vks_dtype dtype, vks_binding x, vks_binding W, uint32_t K) {
    uint32_t elems_per_vec4 = dtype == VKS_DTYPE_F32 ? 4 : 8;
    return K % elems_per_vec4 == 0 && offset_aligned(x, 16) && offset_aligned(W, 16);
}

static int record_matvec(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype,
                         vks_binding y, const uint32_t push[6]) {
    uint32_t M = push[0], N = push[1], K = push[2];
    char name[32];
    vks_binding b[] = {x, W, y};
    if (vks_ops_is_block_type(dtype)) {
        snprintf(name, sizeof name, "matvec_%s%s", vks_ops_dtype_suffix(dtype), o->mv_subgroup ? "_sg" : "");
        uint32_t spec[] = {o->mv_wg, o->mv_rows, M, o->mv_rows_per_wg};
        return vks_ops_dispatch(o, c, name, spec, 4, b, 3, push, 6 * sizeof(uint32_t),
                        ceil_div(N, o->mv_rows_per_wg), "matvec");
    }
    uint32_t vec4 = matvec_vec4(dtype, x, W, K);
    snprintf(name, sizeof name, "matvec_%s%s", vks_ops_dtype_suffix(dtype), o->mv_subgroup ? "_sg" : "");
    uint32_t spec[] = {o->mv_wg, o->mv_rows, M, vec4, o->mv_rows_per_wg};
    return vks_ops_dispatch(o, c, name, spec, 5, b, 3, push, 6 * sizeof(uint32_t),
                    ceil_div(N, o->mv_rows_per_wg), "matvec");
}

/* One matmul.comp dispatch: `variant` (e.g. "matmul_f32_dsg"), output tiles
 * of bm x bn with tm x tn outputs per invocation, labelled `label` in the
 * profile. */
static int dispatch_matmul(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_binding y, const uint32_t push[6],
                           const char *variant, uint32_t bm, uint32_t bn, uint32_t tm, uint32_t tn, uint32_t direct,
                           const char *label) {
    uint32_t M = push[0], N = push[1];
    /* vector staging loads need whole 8-element groups per row and aligned bindings */
    uint32_t vec4 = push[2] % 8 == 0 && offset_aligned(x, 16) && offset_aligned(W, 16);
    uint32_t spec[] = {(bm / tm) * (bn / tn), bm, bn, o->mm_bk, tm, tn, vec4, direct};
    vks_binding b[] = {x, W, y};
    uint64_t tiles = ceil_div(M, bm) * ceil_div(N, bn);
    return vks_ops_dispatch(o, c, variant, spec, 8, b, 3, push, 6 * sizeof(uint32_t), tiles, label);
}

static int record_matmul_tiled(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W,
                               vks_dtype dtype, vks_binding y, const uint32_t push[6]) {
    char name[32];
    /* DIRECT with subgroup broadcasts of the x rows (matmul.comp DIRECT_SG); not
     * q4_k: its super-block decode per quad made it slower at 8 rows (lavapipe) */
    bool dsg = dtype != VKS_DTYPE_Q4_K && !o->mm_f16_math && o->mm_direct && o->info.subgroup_arith &&
               o->info.subgroup_ballot && o->mm_tm == 8;
    snprintf(name, sizeof name, "matmul_%s%s", vks_ops_dtype_suffix(dtype), dsg ? "_dsg" : o->mm_f16_math ? "_h" : "");
    return dispatch_matmul(o, c, x, W, y, push, name, o->mm_bm, o->mm_bn, o->mm_tm, o->mm_tn, o->mm_direct, "matmul");
}

/* The weight types whose decode is faster through record_matmul_decode's
 * tiles than through matvec / matvec_q on lavapipe at one row and at 8
 * (BENCHMARKS.md): q4_0 was 17% slower at one row, q4_k 2x slower. */
static bool decode_by_matmul(vks_dtype dtype) {
    return dtype == VKS_DTYPE_F32 || dtype == VKS_DTYPE_F16 || dtype == VKS_DTYPE_BF16 || dtype == VKS_DTYPE_Q8_0;
}

/* Decode rows on CPU drivers (o->mm_decode): matmul_<type>_dsg with output
 * tiles of 8 rows (TM = BM = 8: every invocation holds all 8, broadcast over
 * its subgroup) x 4 or 8 columns per lane, one subgroup (at least 8 lanes)
 * per workgroup, so that a call of a few rows still spreads over the cores. A
 * single row takes tiles of one row (TM = 1: the plain DIRECT loop, 7 of 8
 * rows' multiply-adds not wasted), with the same products in the same order.
 * Measured on lavapipe (BENCHMARKS.md): 1.6-3x the matvec kernel's rate at 8
 * rows; at one row faster for dim 288-768, the same for stories260K's 64. */
static int record_matmul_decode(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype,
                                vks_binding y, const uint32_t push[6]) {
    uint32_t M = push[0], N = push[1];
    uint32_t lanes = o->info.subgroup_size > 8 ? o->info.subgroup_size : 8;
    /* 8 columns per lane (fewer x loads per weight load) where that still
     * leaves 4 or more workgroups of columns to spread over the cores */
    uint32_t tm = M == 1 ? 1 : 8, tn = N >= 32 * lanes ? 8 : 4;
    char name[32];
    snprintf(name, sizeof name, "matmul_%s_dsg", vks_ops_dtype_suffix(dtype));
    return dispatch_matmul(o, c, x, W, y, push, name, tm, tn * lanes, tm, tn, 1, "matvec");
}

/* Decode rows in groups of MATVEC_MAX_M through the matrix-vector kernel; the
 * groups are bound at row offsets, so those must meet the binding alignment
 * (false: the caller falls back to the tiled kernel). */
static bool matvec_groups_aligned(const vks_ops *o, vks_binding x, vks_binding y, uint32_t K, uint32_t ldy) {
    size_t align = o->info.min_storage_align ? o->info.min_storage_align : 1;
    return ((size_t)MATVEC_MAX_M * K * 4) % align == 0 && ((size_t)MATVEC_MAX_M * ldy * 4) % align == 0 &&
           x.offset % align == 0 && y.offset % align == 0;
}

static int record_matvec_groups(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype,
                                vks_binding y, const uint32_t push[6]) {
    uint32_t M = push[0], K = push[2], ldy = push[3];
    for (uint32_t m0 = 0; m0 < M; m0 += MATVEC_MAX_M) {
        uint32_t group[6] = {M - m0 < MATVEC_MAX_M ? M - m0 : MATVEC_MAX_M, push[1], K, ldy, push[4], push[5]};
        vks_binding xg = {x.buf, x.offset + (size_t)m0 * K * 4, 0};
        vks_binding yg = {y.buf, y.offset + (size_t)m0 * ldy * 4, 0};
        int rc = record_matvec(o, c, xg, W, dtype, yg, group);
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_op_matmul_kind(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype, vks_binding y,
                       uint32_t M, uint32_t N, uint32_t K, uint32_t ldy, uint32_t y_col0, bool accumulate,
                       vks_matmul_kind kind) {
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "matmul: NULL argument");
    int rc = check_matmul_args(o, x, W, dtype, y, M, N, K, ldy, y_col0);
    if (rc) return rc;
    const uint32_t push[6] = {M, N, K, ldy, y_col0, accumulate ? 1u : 0u};
    if (kind == VKS_MATMUL_AUTO) kind = M <= MATVEC_MAX_M ? VKS_MATMUL_DECODE : VKS_MATMUL_PREFILL;
    if (kind == VKS_MATMUL_DECODE && o->mm_decode && !o->mm_f16_math && decode_by_matmul(dtype))
        return record_matmul_decode(o, c, x, W, dtype, y, push);
    if (kind == VKS_MATMUL_DECODE && M <= MATVEC_MAX_M) return record_matvec(o, c, x, W, dtype, y, push);
    if (kind == VKS_MATMUL_DECODE && matvec_groups_aligned(o, x, y, K, ldy))
        return record_matvec_groups(o, c, x, W, dtype, y, push);
    return record_matmul_tiled(o, c, x, W, dtype, y, push);
}

int vks_op_matmul(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W, vks_dtype dtype,
                  vks_binding y, uint32_t M, uint32_t N, uint32_t K, uint32_t ldy,
                  uint32_t y_col0, bool accumulate) {
    return vks_op_matmul_kind(o, c, x, W, dtype, y, M, N, K, ldy, y_col0, accumulate, VKS_MATMUL_AUTO);
}

/* ---- several products of one x in one dispatch (matmul.comp MULTI) ---- */

/* Whether part i's single dispatch would stage with vector loads (dispatch_matmul). */
static uint32_t matmul_vec4(vks_binding x, vks_binding W, uint32_t K) {
    return K % 8 == 0 && offset_aligned(x, 16) && offset_aligned(W, 16);
}

/* The per-matrix part of a MULTI dispatch's push constants (N, ldy, y_col0
 * of matrix i at push[4 + i], [7 + i], [10 + i]) and bindings (W, y at
 * b[1 + 2i], b[2 + 2i]). Unused slots repeat matrix 0's (the kernels never
 * read them). */
static void bind_parts(const vks_matmul_part *p, int n, uint32_t push[13], vks_binding b[7]) {
    for (int i = 0; i < VKS_MATMUL_MAX_PARTS; i++) {
        const vks_matmul_part *q = &p[i < n ? i : 0];
        push[4 + i] = q->N;
        push[7 + i] = q->ldy;
        push[10 + i] = q->y_col0;
        b[1 + 2 * i] = q->W;
        b[2 + 2 * i] = q->y;
    }
}

/* One <variant>_multi dispatch: matrix i's tiles of bm x bn after those of
 * matrices 0..i-1, each tile computed as in dispatch_matmul's single one.
 * Unused matrix slots repeat matrix 0's bindings (the kernel never reads them). */
static int dispatch_matmul_multi(vks_ops *o, vks_cmd *c, vks_binding x, const vks_matmul_part *p, int n,
                                 uint32_t M, uint32_t K, bool accumulate, const char *variant, uint32_t bm,
                                 uint32_t bn, uint32_t tm, uint32_t tn, uint32_t direct, const char *label) {
    char name[40];
    snprintf(name, sizeof name, "%s_multi", variant);
    uint32_t spec[] = {(bm / tm) * (bn / tn), bm, bn, o->mm_bk, tm, tn, matmul_vec4(x, p[0].W, K), direct};
    uint32_t push[13] = {M, K, accumulate ? 1u : 0u, (uint32_t)n};
    vks_binding b[7] = {x};
    bind_parts(p, n, push, b);
    uint64_t tiles = 0;
    for (int i = 0; i < n; i++) tiles += ceil_div(M, bm) * ceil_div(p[i].N, bn);
    return vks_ops_dispatch(o, c, name, spec, 8, b, 7, push, sizeof push, tiles, label);
}

/* One matvec_<type>[_sg]_multi dispatch for M <= MATVEC_MAX_M rows of x
 * from row m0 (x and every y bound at that row): matrix i's workgroups of
 * mv_rows_per_wg rows after those of matrices 0..i-1, each as in
 * record_matvec's single dispatch. Unused slots repeat matrix 0's bindings. */
static int dispatch_matvec_multi(vks_ops *o, vks_cmd *c, vks_binding x, const vks_matmul_part *p, int n,
                                 uint32_t m0, uint32_t M, uint32_t K, bool accumulate) {
    vks_dtype dtype = p[0].dtype;
    char name[40];
    snprintf(name, sizeof name, "matvec_%s%s_multi", vks_ops_dtype_suffix(dtype), o->mv_subgroup ? "_sg" : "");
    uint32_t push[13] = {M, K, accumulate ? 1u : 0u, (uint32_t)n};
    vks_binding b[7] = {{x.buf, x.offset + (size_t)m0 * K * 4, 0}};
    bind_parts(p, n, push, b);
    for (int i = 0; i < VKS_MATMUL_MAX_PARTS; i++) /* each y from row m0 */
        b[2 + 2 * i] = (vks_binding){b[2 + 2 * i].buf, b[2 + 2 * i].offset + (size_t)m0 * push[7 + i] * 4, 0};
    uint64_t groups = 0;
    for (int i = 0; i < n; i++) groups += ceil_div(p[i].N, o->mv_rows_per_wg);
    if (vks_ops_is_block_type(dtype)) {
        uint32_t spec[] = {o->mv_wg, o->mv_rows, M, o->mv_rows_per_wg};
        return vks_ops_dispatch(o, c, name, spec, 4, b, 7, push, sizeof push, groups, "matvec");
    }
    uint32_t spec[] = {o->mv_wg, o->mv_rows, M, matvec_vec4(dtype, b[0], p[0].W, K), o->mv_rows_per_wg};
    return vks_ops_dispatch(o, c, name, spec, 5, b, 7, push, sizeof push, groups, "matvec");
}

/* One <variant> (a *_swiglu) dispatch: tiles as dispatch_matmul's, each of
 * both products (bindings x, W_gate, y, W_up). */
static int dispatch_matmul_swiglu(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding Wg, vks_binding Wu, vks_binding y,
                                  const uint32_t push[6], const char *variant, uint32_t bm, uint32_t bn, uint32_t tm,
                                  uint32_t tn, uint32_t direct, const char *label) {
    uint32_t spec[] = {(bm / tm) * (bn / tn), bm, bn, o->mm_bk, tm, tn, matmul_vec4(x, Wg, push[2]), direct};
    vks_binding b[] = {x, Wg, y, Wu};
    uint64_t tiles = ceil_div(push[0], bm) * ceil_div(push[1], bn);
    return vks_ops_dispatch(o, c, variant, spec, 8, b, 4, push, 6 * sizeof(uint32_t), tiles, label);
}

int vks_op_matmul_multi(vks_ops *o, vks_cmd *c, vks_binding x, const vks_matmul_part *parts, int n_parts,
                        uint32_t M, uint32_t K, bool accumulate, vks_matmul_kind kind) {
    if (!o || !c || !parts) return vks_set_error(VKS_ERR_ARG, "matmul_multi: NULL argument");
    if (n_parts < 1 || n_parts > VKS_MATMUL_MAX_PARTS)
        return vks_set_error(VKS_ERR_ARG, "matmul_multi: %d products (1..%d allowed)", n_parts,
                             VKS_MATMUL_MAX_PARTS);
    if ((unsigned)kind > VKS_MATMUL_PREFILL) return vks_set_error(VKS_ERR_ARG, "matmul_multi: bad kind %d", (int)kind);
    for (int i = 0; i < n_parts; i++) {
        const vks_matmul_part *p = &parts[i];
        int rc = check_matmul_args(o, x, p->W, p->dtype, p->y, M, p->N, K, p->ldy, p->y_col0);
        if (rc) return vks_error_prefix(rc, "matmul_multi: product %d", i);
        /* one dispatch reads x and every W while it writes every y */
        if (vks_ops_overlap(p->y, x))
            return vks_set_error(VKS_ERR_ARG, "matmul_multi: product %d's y overlaps x", i);
        for (int j = 0; j < n_parts; j++)
            if (vks_ops_overlap(p->y, parts[j].W) || (j != i && vks_ops_overlap(p->y, parts[j].y)))
                return vks_set_error(VKS_ERR_ARG, "matmul_multi: product %d's y overlaps product %d's %s", i, j,
                                     j != i && vks_ops_overlap(p->y, parts[j].y) ? "y" : "W");
    }
    /* the path each product would take alone (vks_op_matmul_kind); fused where
     * all take the same matmul.comp variant with the same constants */
    vks_dtype dtype = parts[0].dtype;
    bool same = true;
    for (int i = 1; i < n_parts; i++)
        same = same && parts[i].dtype == dtype && matmul_vec4(x, parts[i].W, K) == matmul_vec4(x, parts[0].W, K);
    if (kind == VKS_MATMUL_AUTO) kind = M <= MATVEC_MAX_M ? VKS_MATMUL_DECODE : VKS_MATMUL_PREFILL;
    bool decode_mm = kind == VKS_MATMUL_DECODE && o->mm_decode && !o->mm_f16_math && decode_by_matmul(dtype);
    bool tiled = kind == VKS_MATMUL_PREFILL; /* (DECODE's matvec groups stay separate dispatches) */
    /* where fused (o->mm_fuse): always at 2; at 1 not the 8-row tiles of CPU drivers */
    bool fuse_rows = o->mm_fuse == 2 || (o->mm_fuse == 1 && !o->mm_direct);
    if (n_parts > 1 && same && decode_mm && (o->mm_fuse == 2 || (o->mm_fuse == 1 && M == 1))) {
        /* record_matmul_decode's tiles; the columns per lane from all products' columns */
        uint32_t lanes = o->info.subgroup_size > 8 ? o->info.subgroup_size : 8, total = 0;
        for (int i = 0; i < n_parts; i++) total += parts[i].N;
        uint32_t tm = M == 1 ? 1 : 8, tn = total >= 32 * lanes ? 8 : 4;
        char variant[32];
        snprintf(variant, sizeof variant, "matmul_%s_dsg", vks_ops_dtype_suffix(dtype));
        return dispatch_matmul_multi(o, c, x, parts, n_parts, M, K, accumulate, variant, tm, tn * lanes, tm, tn, 1,
                                     "matvec");
    }
    if (n_parts > 1 && same && tiled && fuse_rows) {
        bool dsg = dtype != VKS_DTYPE_Q4_K && !o->mm_f16_math && o->mm_direct && o->info.subgroup_arith &&
                   o->info.subgroup_ballot && o->mm_tm == 8;
        char variant[32];
        snprintf(variant, sizeof variant, "matmul_%s%s", vks_ops_dtype_suffix(dtype),
                 dsg ? "_dsg" : o->mm_f16_math ? "_h" : "");
        return dispatch_matmul_multi(o, c, x, parts, n_parts, M, K, accumulate, variant, o->mm_bm, o->mm_bn,
                                     o->mm_tm, o->mm_tn, o->mm_direct, "matmul");
    }
    /* decode through matvec / matvec_q (record_matvec, record_matvec_groups):
     * fused in groups of MATVEC_MAX_M rows where every product takes that path
     * with the same constants */
    bool matvec = kind == VKS_MATMUL_DECODE && !decode_mm;
    for (int i = 0; i < n_parts && matvec; i++)
        matvec = parts[i].dtype == dtype &&
                 (vks_ops_is_block_type(dtype) || matvec_vec4(dtype, x, parts[i].W, K) == matvec_vec4(dtype, x, parts[0].W, K)) &&
                 (M <= MATVEC_MAX_M || matvec_groups_aligned(o, x, parts[i].y, K, parts[i].ldy));
    if (n_parts > 1 && matvec && o->mv_fuse) {
        for (uint32_t m0 = 0; m0 < M; m0 += MATVEC_MAX_M) {
            int rc = dispatch_matvec_multi(o, c, x, parts, n_parts, m0, M - m0 < MATVEC_MAX_M ? M - m0 : MATVEC_MAX_M,
                                           K, accumulate);
            if (rc) return rc;
        }
        return VKS_OK;
    }
    /* mixed weight types or paths, unfused paths: one dispatch per product */
    for (int i = 0; i < n_parts; i++) {
        const vks_matmul_part *p = &parts[i];
        int rc = vks_op_matmul_kind(o, c, x, p->W, p->dtype, p->y, M, p->N, K, p->ldy, p->y_col0, accumulate, kind);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* ---- gate and up products with SwiGLU in one dispatch (matmul.comp SWIGLU) ---- */

int vks_op_matmul_swiglu(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding W_gate, vks_binding W_up,
                         vks_dtype dtype, vks_binding y, vks_binding u, uint32_t M, uint32_t N, uint32_t K,
                         vks_matmul_kind kind) {
    const char *op = "matmul_swiglu";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "matmul_swiglu: NULL argument");
    if ((unsigned)kind > VKS_MATMUL_PREFILL) return vks_set_error(VKS_ERR_ARG, "matmul_swiglu: bad kind %d", (int)kind);
    if ((uint64_t)M * N > UINT32_MAX) return vks_set_error(VKS_ERR_ARG, "matmul_swiglu: M*N exceeds 2^32");
    int rc = check_matmul_args(o, x, W_gate, dtype, y, M, N, K, N, 0);
    if (!rc) rc = check_matmul_args(o, x, W_up, dtype, y, M, N, K, N, 0);
    if (!rc) rc = vks_ops_check_range(op, "u", u, (uint64_t)M * N, 4);
    if (rc) return vks_error_prefix(rc, "matmul_swiglu");
    const vks_binding outs[2] = {y, u}, ins[3] = {x, W_gate, W_up};
    const char *out_names[2] = {"y", "u"}, *in_names[3] = {"x", "W_gate", "W_up"};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            if (vks_ops_overlap(outs[i], ins[j]))
                return vks_set_error(VKS_ERR_ARG, "matmul_swiglu: %s overlaps %s", out_names[i], in_names[j]);
    if (vks_ops_overlap(y, u)) return vks_set_error(VKS_ERR_ARG, "matmul_swiglu: y overlaps u");
    /* fused wherever the products alone take matmul.comp (the paths of vks_op_matmul_kind) */
    vks_matmul_kind k = kind == VKS_MATMUL_AUTO ? (M <= MATVEC_MAX_M ? VKS_MATMUL_DECODE : VKS_MATMUL_PREFILL) : kind;
    bool same = matmul_vec4(x, W_gate, K) == matmul_vec4(x, W_up, K);
    bool decode_mm = k == VKS_MATMUL_DECODE && o->mm_decode && !o->mm_f16_math && decode_by_matmul(dtype);
    bool fuse = o->swiglu_fuse && same && (decode_mm || k == VKS_MATMUL_PREFILL);
    if (fuse) {
        uint32_t push[6] = {M, N, K, N, 0, 0};
        char name[40];
        if (decode_mm) { /* record_matmul_decode's tiles */
            uint32_t lanes = o->info.subgroup_size > 8 ? o->info.subgroup_size : 8;
            uint32_t tm = M == 1 ? 1 : 8, tn = N >= 32 * lanes ? 8 : 4;
            snprintf(name, sizeof name, "matmul_%s_dsg_swiglu", vks_ops_dtype_suffix(dtype));
            return dispatch_matmul_swiglu(o, c, x, W_gate, W_up, y, push, name, tm, tn * lanes, tm, tn, 1, "matvec");
        }
        /* record_matmul_tiled's variant */
        bool dsg = dtype != VKS_DTYPE_Q4_K && !o->mm_f16_math && o->mm_direct && o->info.subgroup_arith &&
                   o->info.subgroup_ballot && o->mm_tm == 8;
        snprintf(name, sizeof name, "matmul_%s%s_swiglu", vks_ops_dtype_suffix(dtype),
                 dsg ? "_dsg" : o->mm_f16_math ? "_h" : "");
        return dispatch_matmul_swiglu(o, c, x, W_gate, W_up, y, push, name, o->mm_bm, o->mm_bn, o->mm_tm, o->mm_tn,
                                      o->mm_direct, "matmul");
    }
    vks_matmul_part parts[2] = {{.W = W_gate, .dtype = dtype, .y = y, .N = N, .ldy = N},
                                {.W = W_up, .dtype = dtype, .y = u, .N = N, .ldy = N}};
    rc = vks_op_matmul_multi(o, c, x, parts, 2, M, K, false, kind);
    return rc ? rc : vks_op_swiglu(o, c, y, u, y, M * N);
}

int vks_op_bias_add(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding bias, uint32_t R,
                    uint32_t D) {
    const char *op = "bias_add";
    if (!o || !c || !R || !D || (uint64_t)R * D > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "bias_add: bad arguments");
    int rc = vks_ops_check_range(op, "x", x, (uint64_t)R * D, 4);
    if (!rc) rc = vks_ops_check_range(op, "bias", bias, D, 4);
    if (rc) return rc;
    uint32_t push[] = {R, D};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {x, bias};
    return vks_ops_dispatch(o, c, "bias_add", spec, 1, b, 2, push, sizeof push,
                    ceil_div((uint64_t)R * D, o->wg_elementwise), op);
}

int vks_ops_rope_kernel(vks_ops *o, vks_cmd *c, const char *kernel, vks_binding x, vks_binding pos, vks_binding table,
                        uint32_t n_pos, uint32_t R, uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim,
                        uint32_t mode) {
    if (!o || !c || !R || !n_heads || head_dim < 2 || head_dim % 2 || !n_pos ||
        (mode != VKS_ROPE_ADJACENT && mode != VKS_ROPE_HALF) ||
        (uint64_t)col0 + (uint64_t)n_heads * head_dim > stride)
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments", kernel);
    int rc = vks_ops_check_range(kernel, "x", x, (uint64_t)(R - 1) * stride + col0 + (uint64_t)n_heads * head_dim, 4);
    if (!rc) rc = vks_ops_check_range(kernel, "pos", pos, R, 4);
    if (!rc) rc = vks_ops_check_range(kernel, "table", table, (uint64_t)n_pos * head_dim, 4);
    if (rc) return rc;
    struct { uint32_t R, stride, col0, n_heads, head_dim, mode, n_pos; } push = {R, stride, col0, n_heads, head_dim,
                                                                                mode, n_pos};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {x, pos, table};
    uint64_t pairs = (uint64_t)R * n_heads * (head_dim / 2);
    return vks_ops_dispatch(o, c, kernel, spec, 1, b, 3, &push, sizeof push,
                    ceil_div(pairs, o->wg_elementwise), kernel);
}

int vks_op_rope(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding pos, vks_binding table, uint32_t n_pos, uint32_t R,
                uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim, uint32_t mode) {
    return vks_ops_rope_kernel(o, c, "rope", x, pos, table, n_pos, R, stride, col0, n_heads, head_dim, mode);
}

/* Slots whole caches of seq_len*kv_dim elements of elem_bytes that the binding holds. */
static uint32_t cache_slots(vks_binding cache, uint32_t seq_len, uint32_t kv_dim, uint32_t elem_bytes) {
    uint64_t per_slot = (uint64_t)seq_len * kv_dim * elem_bytes;
    uint64_t n = vks_ops_binding_bytes(cache) / per_slot;
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* The KV-cache bindings kv_store and attention share: slot and pos per row,
 * both caches (elements of elem_bytes: 4 for f32, 2 for f16) at least one
 * slot long. *n_slots = slots both caches hold. */
static int check_kv_bindings(const char *op, vks_binding kcache, vks_binding vcache, vks_binding slot,
                             vks_binding pos, uint32_t R, uint32_t seq_len, uint32_t kv_dim, uint32_t elem_bytes,
                             uint32_t *n_slots) {
    int rc = vks_ops_check_range(op, "slot", slot, R, 4);
    if (!rc) rc = vks_ops_check_range(op, "pos", pos, R, 4);
    if (!rc) rc = vks_ops_check_range(op, "kcache", kcache, (uint64_t)seq_len * kv_dim, elem_bytes);
    if (!rc) rc = vks_ops_check_range(op, "vcache", vcache, (uint64_t)seq_len * kv_dim, elem_bytes);
    if (rc) return rc;
    uint32_t ks = cache_slots(kcache, seq_len, kv_dim, elem_bytes), vs = cache_slots(vcache, seq_len, kv_dim, elem_bytes);
    *n_slots = ks < vs ? ks : vs;
    return VKS_OK;
}

/* One KV-cache write: k, v [R, kv_dim] f32 into caches of elem_bytes per value
 * (4: kv_store, 2: kv_store_f16, one thread per pair of halves). */
static int kv_store_into(vks_ops *o, vks_cmd *c, const char *op, uint32_t elem_bytes, vks_binding k, vks_binding v,
                         vks_binding kcache, vks_binding vcache, vks_binding slot, vks_binding pos, uint32_t R,
                         uint32_t kv_dim, uint32_t seq_len) {
    if (!o || !c || !R || !kv_dim || (elem_bytes == 2 && kv_dim % 2) || !seq_len)
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments", op);
    uint32_t n_slots = 0;
    int rc = vks_ops_check_range(op, "k", k, (uint64_t)R * kv_dim, 4);
    if (!rc) rc = vks_ops_check_range(op, "v", v, (uint64_t)R * kv_dim, 4);
    if (!rc) rc = check_kv_bindings(op, kcache, vcache, slot, pos, R, seq_len, kv_dim, elem_bytes, &n_slots);
    if (rc) return rc;
    uint32_t push[] = {R, kv_dim, seq_len, n_slots};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {k, v, kcache, vcache, slot, pos};
    uint64_t threads = (uint64_t)R * (elem_bytes == 2 ? kv_dim / 2 : kv_dim);
    return vks_ops_dispatch(o, c, op, spec, 1, b, 6, push, sizeof push, ceil_div(threads, o->wg_elementwise), op);
}

int vks_op_kv_store(vks_ops *o, vks_cmd *c, vks_binding k, vks_binding v, vks_binding kcache,
                    vks_binding vcache, vks_binding slot, vks_binding pos, uint32_t R,
                    uint32_t kv_dim, uint32_t seq_len) {
    return kv_store_into(o, c, "kv_store", 4, k, v, kcache, vcache, slot, pos, R, kv_dim, seq_len);
}

int vks_op_rope_kv_store(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding k, vks_binding v, vks_binding kcache,
                         vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding table, uint32_t n_pos,
                         uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t mode,
                         uint32_t seq_len) {
    const char *op = "rope_kv_store";
    if (!o || !c || !R || !n_heads || !n_kv_heads || head_dim < 2 || head_dim % 2 || !n_pos || !seq_len ||
        (mode != VKS_ROPE_ADJACENT && mode != VKS_ROPE_HALF) || (uint64_t)n_heads * head_dim > UINT32_MAX / 2 ||
        (uint64_t)R * ((uint64_t)n_heads + n_kv_heads) * (head_dim / 2) > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments", op);
    uint32_t q_dim = n_heads * head_dim, kv_dim = n_kv_heads * head_dim, n_slots = 0;
    int rc = vks_ops_check_range(op, "q", q, (uint64_t)R * q_dim, 4);
    if (!rc) rc = vks_ops_check_range(op, "k", k, (uint64_t)R * kv_dim, 4);
    if (!rc) rc = vks_ops_check_range(op, "v", v, (uint64_t)R * kv_dim, 4);
    if (!rc) rc = vks_ops_check_range(op, "table", table, (uint64_t)n_pos * head_dim, 4);
    if (!rc) rc = check_kv_bindings(op, kcache, vcache, slot, pos, R, seq_len, kv_dim, 4, &n_slots);
    if (rc) return rc;
    uint32_t push[] = {R, kv_dim, seq_len, n_slots, q_dim, head_dim, mode, n_pos};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {k, v, kcache, vcache, slot, pos, table, q};
    uint64_t pairs = (uint64_t)R * (q_dim + kv_dim) / 2;
    return vks_ops_dispatch(o, c, op, spec, 1, b, 8, push, sizeof push, ceil_div(pairs, o->wg_elementwise), op);
}

/* Query rows per subgroup (per workgroup: the tile kernel, `tile`) of the
 * attention kernels over the KV cache: one for decode steps (every row its
 * own sequence), attention_rows / attention_tile_rows for prefill (AUTO:
 * prefill when R > 1). The choice changes no bits. */
static uint32_t attention_rows_of(const vks_ops *o, vks_matmul_kind kind, uint32_t R, bool tile) {
    uint32_t rows = tile ? o->attention_tile_rows : o->attention_rows;
    if (kind == VKS_MATMUL_DECODE || (kind == VKS_MATMUL_AUTO && R < 2)) return 1;
    return rows < R ? rows : R;
}

static uint32_t attention_rows(const vks_ops *o, vks_matmul_kind kind, uint32_t R) {
    return attention_rows_of(o, kind, R, false);
}

int vks_op_attention(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache,
                     vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding out,
                     uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                     uint32_t seq_len) {
    return vks_op_attention_kind(o, c, q, kcache, vcache, slot, pos, out, R, n_heads, n_kv_heads, head_dim, seq_len,
                                 VKS_MATMUL_AUTO);
}

int vks_op_attention_kind(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache,
                          vks_binding vcache, vks_binding slot, vks_binding pos, vks_binding out,
                          uint32_t R, uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim,
                          uint32_t seq_len, vks_matmul_kind kind) {
    const char *op = "attention";
    if (!o || !c || !R || !n_heads || !n_kv_heads || n_heads % n_kv_heads || !head_dim ||
        head_dim > ATTENTION_MAX_HEAD_DIM || !seq_len)
        return vks_set_error(VKS_ERR_ARG, "attention: bad arguments");
    uint32_t kv_dim = n_kv_heads * head_dim;
    uint64_t q_elems = (uint64_t)R * n_heads * head_dim;
    uint32_t n_slots = 0;
    int rc = vks_ops_check_range(op, "q", q, q_elems, 4);
    if (!rc) rc = vks_ops_check_range(op, "out", out, q_elems, 4);
    if (!rc) rc = check_kv_bindings(op, kcache, vcache, slot, pos, R, seq_len, kv_dim, 4, &n_slots);
    if (rc) return rc;
    struct {
        uint32_t R, n_heads, n_kv_heads, head_dim, seq_len, n_slots;
        float scale;
    } push = {R, n_heads, n_kv_heads, head_dim, seq_len, n_slots,
              (float)(1.0 / sqrt((double)head_dim))};
    /* CPU drivers: the barrier-free subgroup variant (a lane owns at most
     * ceil(head_dim / 4) output dims: subgroups have 4 lanes or more there);
     * elsewhere the tile kernel, prefill rows grouped per workgroup */
    bool sg = o->attention_kv_sg;
    uint32_t rows = attention_rows_of(o, kind, R, !sg);
    uint32_t spec[] = {o->wg_attention_kv, sg ? (head_dim + 3) / 4 : 1, rows};
    vks_binding b[] = {q, kcache, vcache, slot, pos, out};
    const char *name = sg ? (rows > 1 ? "attention_rows_sg" : "attention_sg") : rows > 1 ? "attention_rows" : "attention";
    return vks_ops_dispatch(o, c, name, spec, rows > 1 ? 3 : 2, b, 6, &push, sizeof push, ceil_div(R, rows) * n_heads,
                            op);
}

/* ---- the f16 KV cache (issue 28) ---- */

bool vks_ops_kv_f16_supported(const vks_ops *o) {
    return o && o->info.subgroup_arith && o->info.subgroup_shuffle && o->info.subgroup_size >= 4;
}

int vks_op_kv_store_f16(vks_ops *o, vks_cmd *c, vks_binding k, vks_binding v, vks_binding kcache,
                        vks_binding vcache, vks_binding slot, vks_binding pos, uint32_t R, uint32_t kv_dim,
                        uint32_t seq_len) {
    return kv_store_into(o, c, "kv_store_f16", 2, k, v, kcache, vcache, slot, pos, R, kv_dim, seq_len);
}

static uint32_t attention_splits(uint32_t seq_len) { return (seq_len + VKS_ATTN_SPLIT_KEYS - 1) / VKS_ATTN_SPLIT_KEYS; }

/* Floats of the split partials: per (row, head, split) head_dim + 4. */
static uint64_t attention_part_floats(uint32_t R, uint32_t n_heads, uint32_t head_dim, uint32_t seq_len) {
    return (uint64_t)R * n_heads * attention_splits(seq_len) * ((uint64_t)head_dim + 4);
}

uint64_t vks_op_attention_f16_scratch_bytes(uint32_t R, uint32_t n_heads, uint32_t head_dim, uint32_t seq_len) {
    return 4 * attention_part_floats(R, n_heads, head_dim, seq_len);
}

/* Query heads per workgroup: the largest divisor of the KV group's heads up
 * to 4 (each adds head_dim/4 vec4 accumulators per lane). */
static uint32_t attention_group(uint32_t heads_per_kv) {
    for (uint32_t g = 4; g > 1; g--)
        if (heads_per_kv % g == 0) return g;
    return 1;
}

int vks_op_attention_f16(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache, vks_binding vcache,
                         vks_binding slot, vks_binding pos, vks_binding part, vks_binding out, uint32_t R,
                         uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t seq_len) {
    return vks_op_attention_f16_kind(o, c, q, kcache, vcache, slot, pos, part, out, R, n_heads, n_kv_heads, head_dim,
                                     seq_len, VKS_MATMUL_AUTO);
}

int vks_op_attention_f16_kind(vks_ops *o, vks_cmd *c, vks_binding q, vks_binding kcache, vks_binding vcache,
                              vks_binding slot, vks_binding pos, vks_binding part, vks_binding out, uint32_t R,
                              uint32_t n_heads, uint32_t n_kv_heads, uint32_t head_dim, uint32_t seq_len,
                              vks_matmul_kind kind) {
    const char *op = "attention_f16";
    if (!o || !c || !R || !n_heads || !n_kv_heads || n_heads % n_kv_heads || !head_dim || head_dim % 4 ||
        head_dim > ATTENTION_MAX_HEAD_DIM || !seq_len)
        return vks_set_error(VKS_ERR_ARG, "attention_f16: bad arguments");
    if (!vks_ops_kv_f16_supported(o))
        return vks_set_error(VKS_ERR_GPU, "attention_f16: %s lacks subgroup arithmetic and shuffle", o->info.name);
    uint32_t kv_dim = n_kv_heads * head_dim, n_splits = attention_splits(seq_len);
    uint64_t q_elems = (uint64_t)R * n_heads * head_dim;
    uint32_t n_slots = 0;
    int rc = vks_ops_check_range(op, "q", q, q_elems, 4);
    if (!rc) rc = vks_ops_check_range(op, "out", out, q_elems, 4);
    if (!rc) rc = vks_ops_check_range(op, "part", part, attention_part_floats(R, n_heads, head_dim, seq_len), 4);
    if (!rc) rc = check_kv_bindings(op, kcache, vcache, slot, pos, R, seq_len, kv_dim, 2, &n_slots);
    if (rc) return rc;
    struct {
        uint32_t R, n_heads, n_kv_heads, head_dim, seq_len, n_slots, n_splits;
        float scale;
    } push = {R, n_heads, n_kv_heads, head_dim, seq_len, n_slots, n_splits, (float)(1.0 / sqrt((double)head_dim))};
    uint32_t group = attention_group(n_heads / n_kv_heads);
    /* one subgroup per workgroup, of 4 lanes or more: a lane owns at most
     * ceil(head_dim / 16) groups of 4 output dims */
    /* prefill: rows per subgroup, at most 4 (row, head) pairs: the heads of
     * a KV group already share the loads (lavapipe, 8/2 heads hd 32, 1024-token
     * prefill: 2 rows x 4 heads made the attention 1.37x slower) */
    uint32_t rows = attention_rows(o, kind, R);
    while (rows > 1 && rows * group > 4) rows--;
    uint32_t spec[] = {vks_ops_pick_wg(&o->info, 1), (head_dim / 4 + 3) / 4, group, VKS_ATTN_SPLIT_KEYS, rows};
    vks_binding b[] = {q, kcache, vcache, slot, pos, part, out};
    rc = vks_ops_dispatch(o, c, rows > 1 ? "attention_split_rows_f16" : "attention_split_f16", spec, rows > 1 ? 5 : 4,
                          b, 7, &push, sizeof push, ceil_div(R, rows) * (n_heads / group) * n_splits, op);
    if (rc || n_splits == 1) return rc; /* every row one split: each wrote its output */
    uint32_t spec_r[] = {o->wg_elementwise, 1, 1, VKS_ATTN_SPLIT_KEYS};
    vks_binding br[] = {part, pos, out};
    return vks_ops_dispatch(o, c, "attention_split_reduce", spec_r, 4, br, 3, &push, sizeof push,
                            ceil_div(q_elems / 4, o->wg_elementwise), "attention_split_reduce");
}

int vks_ops_elementwise(vks_ops *o, vks_cmd *c, const char *name, const vks_binding *b, int nb,
                       uint32_t n) {
    if (!o || !c || !n) return vks_set_error(VKS_ERR_ARG, "%s: bad arguments", name);
    static const char *const what[] = {"a", "b", "out"};
    for (int i = 0; i < nb; i++) {
        int rc = vks_ops_check_range(name, what[i], b[i], n, 4);
        if (rc) return rc;
    }
    uint32_t spec[] = {o->wg_elementwise};
    return vks_ops_dispatch(o, c, name, spec, 1, b, nb, &n, sizeof n, ceil_div(n, o->wg_elementwise),
                    name);
}

int vks_op_swiglu(vks_ops *o, vks_cmd *c, vks_binding g, vks_binding u, vks_binding out,
                  uint32_t n) {
    vks_binding b[] = {g, u, out};
    return vks_ops_elementwise(o, c, "swiglu", b, 3, n);
}

int vks_op_add(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding y, uint32_t n) {
    vks_binding b[] = {x, y};
    return vks_ops_elementwise(o, c, "add", b, 2, n);
}

int vks_op_scale(vks_ops *o, vks_cmd *c, vks_binding x, float s, uint32_t n) {
    const char *op = "scale";
    if (!o || !c || !n || !isfinite(s)) return vks_set_error(VKS_ERR_ARG, "scale: bad arguments");
    int rc = vks_ops_check_range(op, "x", x, n, 4);
    if (rc) return rc;
    struct { uint32_t n; float s; } push = {n, s};
    uint32_t spec[] = {o->wg_elementwise};
    return vks_ops_dispatch(o, c, "scale", spec, 1, &x, 1, &push, sizeof push, ceil_div(n, o->wg_elementwise), op);
}

int vks_op_gather_rows(vks_ops *o, vks_cmd *c, vks_binding src, vks_binding idx,
                       vks_binding dst, uint32_t n, uint32_t D) {
    const char *op = "gather_rows";
    if (!o || !c || !n || !D) return vks_set_error(VKS_ERR_ARG, "gather_rows: bad arguments");
    int rc = vks_ops_check_range(op, "src", src, D, 4);
    if (!rc) rc = vks_ops_check_range(op, "idx", idx, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "dst", dst, (uint64_t)n * D, 4);
    if (rc) return rc;
    uint64_t src_rows = vks_ops_binding_bytes(src) / ((uint64_t)D * 4);
    uint32_t push[] = {n, D, src_rows > UINT32_MAX ? UINT32_MAX : (uint32_t)src_rows};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {src, idx, dst};
    return vks_ops_dispatch(o, c, "gather_rows", spec, 1, b, 3, push, sizeof push,
                    ceil_div((uint64_t)n * D, o->wg_elementwise), op);
}

int vks_op_sample(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding params,
                  vks_binding tokens, uint32_t S, uint32_t V) {
    const char *op = "sample";
    if (!o || !c || !S || !V || V > VKS_SAMPLE_MAX_V) return vks_set_error(VKS_ERR_ARG, "sample: bad arguments");
    int rc = vks_ops_check_range(op, "logits", logits, (uint64_t)S * V, 4);
    if (!rc) rc = vks_ops_check_range(op, "params", params, S, sizeof(vks_gpu_sample_row));
    if (!rc) rc = vks_ops_check_range(op, "tokens", tokens, S, 4);
    if (rc) return rc;
    uint32_t push[] = {S, V};
    uint32_t spec[] = {o->wg_row, o->sample_serial_scan}; /* SERIAL_SCAN */
    vks_binding b[] = {logits, params, tokens};
    return vks_ops_dispatch(o, c, "sample", spec, 2, b, 3, push, sizeof push, S, op);
}

uint32_t vks_op_sample_groups(const vks_ops *o, uint32_t S, uint32_t V) {
    uint64_t w = ceil_div(V, VKS_SAMPLE_SPREAD_SLICE);
    if ((o && !o->sample_spread) || S == 0 || S > VKS_SAMPLE_SPREAD_MAX_ROWS || w < 4) return 1;
    return w > VKS_SAMPLE_SPREAD_MAX_W ? VKS_SAMPLE_SPREAD_MAX_W : (uint32_t)w;
}

uint64_t vks_op_sample_scratch_bytes(uint32_t S, uint32_t W) {
    return W <= 1 ? 0 : (uint64_t)S * VKS_SAMPLE_ROW_SCRATCH * 4;
}

/* zero (one workgroup per row), hist x 8 (W per row, integer atomics into the
 * row's counts and masses: 4 top-k passes, the first also taking the largest
 * key, then 4 top-p passes), then the sampler with the digits from them; the
 * dispatches' barriers come from their scratch accesses. */
int vks_op_sample_split(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding params,
                        vks_binding tokens, vks_binding scratch, uint32_t S, uint32_t V, uint32_t W) {
    const char *op = "sample";
    if (W == 1) return vks_op_sample(o, c, logits, params, tokens, S, V);
    if (!o || !c || !S || !V || V > VKS_SAMPLE_MAX_V || W == 0 || W > V)
        return vks_set_error(VKS_ERR_ARG, "sample: bad arguments");
    int rc = vks_ops_check_range(op, "logits", logits, (uint64_t)S * V, 4);
    if (!rc) rc = vks_ops_check_range(op, "params", params, S, sizeof(vks_gpu_sample_row));
    if (!rc) rc = vks_ops_check_range(op, "tokens", tokens, S, 4);
    if (!rc) rc = vks_ops_check_range(op, "scratch", scratch, vks_op_sample_scratch_bytes(S, W) / 4, 4);
    if (rc) return rc;
    uint32_t spec[] = {o->wg_row, o->sample_serial_scan}; /* SERIAL_SCAN */
    vks_binding hb[] = {logits, params, scratch};
    uint32_t zpush[] = {S, V, W, 0};
    rc = vks_ops_dispatch(o, c, "sample_zero", spec, 2, hb, 3, zpush, sizeof zpush, S, "sample_zero");
    for (uint32_t pass = 0; pass < 8 && !rc; pass++) {
        uint32_t push[] = {S, V, W, pass};
        rc = vks_ops_dispatch(o, c, "sample_hist", spec, 2, hb, 3, push, sizeof push, (uint64_t)S * W, "sample_hist");
    }
    if (rc) return rc;
    uint32_t push[] = {S, V, W, 0};
    vks_binding b[] = {logits, params, tokens, scratch};
    return vks_ops_dispatch(o, c, "sample_spread", spec, 2, b, 4, push, sizeof push, S, op);
}
