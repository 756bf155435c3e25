/* ops_grad_layer.c: records the backward of the layer ops (RMSNorm, RoPE,
 * SwiGLU), the training attention (forward with softmax statistics and its
 * backward) and the token log-probability with its gradient (vks_ops_grad.h).
 * Sizes and binding ranges are checked here; kernels bounds-check the rest. */
#include "ops_internal.h"
#include "vkswarm/vks_ops_grad.h"

#include <math.h>

/* Rows per block of RMSNorm's dw partial sums (rmsnorm_backward.comp). */
#define RMSNORM_DW_ROWS 64u
/* Query rows per workgroup of attention_train and attention_train_dq, keys per
 * workgroup of attention_train_dkdv (the shader's BQ and BK). */
#define ATTN_TRAIN_QUERY_BLOCK 16u
#define ATTN_TRAIN_KEY_BLOCK 16u
/* Shared memory of the largest attention_train kernel (attention_train_dkdv:
 * K, V tiles of 16 rows and Q, dO tiles of 8 rows of 33 vec4s, P and dS tiles,
 * statistics); Vulkan promises only 16 KiB, desktop GPUs and lavapipe have 32+. */
#define ATTN_TRAIN_SHARED_BYTES 26496u

static bool wanted(vks_binding b) { return b.buf != NULL; }

/* VKS_ERR_ARG when output `out` overlaps any of the n bindings in `in` (bindings
 * that a later kernel of the same op still reads, or other outputs). */
static int check_apart(const char *op, const char *what, vks_binding out, const vks_binding *in, int n) {
    for (int i = 0; i < n; i++)
        if (vks_ops_overlap(out, in[i]))
            return vks_set_error(VKS_ERR_ARG, "%s: %s shares memory with an input or another output", op, what);
    return VKS_OK;
}

/* ---- RMSNorm ---- */

static uint64_t rmsnorm_dw_blocks(uint32_t R) { return ceil_div(R, RMSNORM_DW_ROWS); }

/* Floats of scratch: R inverse RMS values, then blocks x D partial sums. */
static uint64_t rmsnorm_scratch_floats(uint32_t R, uint32_t D) { return R + rmsnorm_dw_blocks(R) * D; }

size_t vks_op_rmsnorm_backward_scratch_bytes(uint32_t R, uint32_t D) {
    uint64_t bytes = rmsnorm_scratch_floats(R, D) * 4;
    return bytes > SIZE_MAX || bytes / 4 > UINT32_MAX ? 0 : (size_t)bytes;
}

static int check_rmsnorm_backward(vks_binding x, vks_binding w, vks_binding dout, vks_binding dx, vks_binding dw,
                                  vks_binding scratch, uint32_t R, uint32_t D) {
    const char *op = "rmsnorm_backward";
    uint64_t n = (uint64_t)R * D;
    int rc = vks_ops_check_range(op, "x", x, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "w", w, D, 4);
    if (!rc) rc = vks_ops_check_range(op, "dout", dout, n, 4);
    if (!rc && wanted(dx)) rc = vks_ops_check_range(op, "dx", dx, n, 4);
    if (!rc && wanted(dw)) rc = vks_ops_check_range(op, "dw", dw, D, 4);
    if (!rc && wanted(dw)) rc = vks_ops_check_range(op, "scratch", scratch, rmsnorm_scratch_floats(R, D), 4);
    vks_binding read[] = {x, w, dout, dw, scratch};
    if (!rc && wanted(dx)) rc = check_apart(op, "dx", dx, read, 5);
    vks_binding read_dw[] = {x, w, dout, scratch};
    if (!rc && wanted(dw)) rc = check_apart(op, "dw", dw, read_dw, 4);
    return rc;
}

/* dw += sum over rows of dout * x * inv, through per-block partial sums in scratch. */
static int record_rmsnorm_dw(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding dout, vks_binding dw,
                             vks_binding scratch, uint32_t R, uint32_t D) {
    uint32_t push[] = {R, D, RMSNORM_DW_ROWS};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding partial_b[] = {x, dout, scratch};
    int rc = vks_ops_dispatch(o, c, "rmsnorm_backward_dw_partial", spec, 1, partial_b, 3, push, sizeof push,
                              ceil_div(rmsnorm_dw_blocks(R) * D, o->wg_elementwise), "rmsnorm_backward");
    if (rc) return rc;
    vks_binding sum_b[] = {scratch, dw};
    return vks_ops_dispatch(o, c, "rmsnorm_backward_dw_sum", spec, 1, sum_b, 2, push, sizeof push,
                            ceil_div(D, o->wg_elementwise), "rmsnorm_backward");
}

int vks_op_rmsnorm_backward(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding w, vks_binding dout,
                            vks_binding dx, vks_binding dw, vks_binding scratch, uint32_t R, uint32_t D, float eps,
                            bool accumulate_dx) {
    if (!o || !c || !R || !D || !(eps >= 0.0f) || (!wanted(dx) && !wanted(dw)))
        return vks_set_error(VKS_ERR_ARG, "rmsnorm_backward: bad arguments");
    int rc = check_rmsnorm_backward(x, w, dout, dx, dw, scratch, R, D);
    if (rc) return rc;
    /* flags: 1 = write dx, 2 = accumulate into dx, 4 = write the inverse RMS for dw */
    uint32_t flags = (wanted(dx) ? 1u : 0u) | (accumulate_dx ? 2u : 0u) | (wanted(dw) ? 4u : 0u);
    struct { uint32_t R, D; float eps; uint32_t flags; } push = {R, D, eps, flags};
    uint32_t spec[] = {o->wg_norm};
    /* bindings that are not wanted get dout, which the kernel then never writes */
    vks_binding b[] = {x, w, dout, wanted(dx) ? dx : dout, wanted(dw) ? scratch : dout};
    rc = vks_ops_dispatch(o, c, "rmsnorm_backward_rows", spec, 1, b, 5, &push, sizeof push, R, "rmsnorm_backward");
    if (rc || !wanted(dw)) return rc;
    return record_rmsnorm_dw(o, c, x, dout, dw, scratch, R, D);
}

/* ---- RoPE ---- */

int vks_op_rope_backward(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding pos, vks_binding table, uint32_t n_pos,
                         uint32_t R, uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim, uint32_t mode) {
    return vks_ops_rope_kernel(o, c, "rope_backward", x, pos, table, n_pos, R, stride, col0, n_heads, head_dim, mode);
}

/* ---- attention ---- */

typedef struct {
    uint32_t T, n_heads, n_kv_heads, head_dim;
    float scale;
    uint32_t flags; /* 1: accumulate into the outputs; 2: a->starts_sorted */
} attn_push;

static int check_attention_train(const vks_ops *o, const char *op, const vks_attention_train *a) {
    if (o->info.max_shared_bytes && o->info.max_shared_bytes < ATTN_TRAIN_SHARED_BYTES)
        return vks_set_error(VKS_ERR_ARG, "%s: the device has %u bytes of shared memory, the kernels need %u", op,
                             o->info.max_shared_bytes, ATTN_TRAIN_SHARED_BYTES);
    if (!a->T || !a->n_heads || !a->n_kv_heads || a->n_heads % a->n_kv_heads || !a->head_dim)
        return vks_set_error(VKS_ERR_ARG, "%s: bad shape T=%u heads=%u kv_heads=%u head_dim=%u", op, a->T,
                             a->n_heads, a->n_kv_heads, a->head_dim);
    if (a->head_dim > VKS_ATTENTION_TRAIN_MAX_HEAD_DIM || a->T > VKS_ATTENTION_TRAIN_MAX_T)
        return vks_set_error(VKS_ERR_ARG, "%s: T=%u head_dim=%u past the supported %u rows, head_dim %u", op, a->T,
                             a->head_dim, VKS_ATTENTION_TRAIN_MAX_T, VKS_ATTENTION_TRAIN_MAX_HEAD_DIM);
    uint64_t nq = (uint64_t)a->T * a->n_heads * a->head_dim, nkv = (uint64_t)a->T * a->n_kv_heads * a->head_dim;
    uint64_t stats = (uint64_t)a->T * a->n_heads;
    int rc = vks_ops_check_range(op, "q", a->q, nq, 4);
    if (!rc) rc = vks_ops_check_range(op, "k", a->k, nkv, 4);
    if (!rc) rc = vks_ops_check_range(op, "v", a->v, nkv, 4);
    if (!rc) rc = vks_ops_check_range(op, "start", a->start, a->T, 4);
    if (!rc) rc = vks_ops_check_range(op, "out", a->out, nq, 4);
    if (!rc) rc = vks_ops_check_range(op, "row_max", a->row_max, stats, 4);
    if (!rc) rc = vks_ops_check_range(op, "row_sum", a->row_sum, stats, 4);
    vks_binding ins[] = {a->q, a->k, a->v, a->start, a->out, a->row_max};
    if (!rc) rc = check_apart(op, "out", a->out, ins, 4);
    if (!rc) rc = check_apart(op, "row_max", a->row_max, ins, 5);
    if (!rc) rc = check_apart(op, "row_sum", a->row_sum, ins, 6);
    return rc;
}

static attn_push attention_push(const vks_attention_train *a, bool accumulate) {
    return (attn_push){a->T, a->n_heads, a->n_kv_heads, a->head_dim, (float)(1.0 / sqrt((double)a->head_dim)),
                       (accumulate ? 1u : 0u) | (a->starts_sorted ? 2u : 0u)};
}

/* Specialization constants of the attention_train kernels: workgroup size,
 * head_dim rounded up to a vec4, and whether the tiles' rows can be read as
 * vec4s (head_dim % 4 == 0, every float operand 16-byte aligned). */
static bool aligned16(vks_binding b) { return b.offset % 16 == 0; }

static void attention_spec(const vks_ops *o, const vks_attention_train *a, vks_binding dout, uint32_t spec[3]) {
    spec[0] = o->wg_attention;
    spec[1] = (a->head_dim + 3u) / 4u * 4u;
    spec[2] = a->head_dim % 4 == 0 && aligned16(a->q) && aligned16(a->k) && aligned16(a->v) && aligned16(dout);
}

/* Rows (forward, dq) or keys (dk/dv) per lane of the CPU drivers' kernels
 * (attention_train_sg.comp): each walked row's broadcast feeds that many; the
 * registers and LLVM's compile time grow with rows x head_dim. Measured on
 * lavapipe (BENCHMARKS.md), rates against the forward matmul's: head_dim 32,
 * dk/dv at 1, 2, 3-4 per lane 0.67x, 0.9x, ~1.1x; head_dim 64, forward / dq /
 * dk/dv at 2 per lane 0.44x / 0.65x / 0.68x, at 3 per lane 0.51x / 0.74x /
 * 0.68x. Compile time, cold: dk/dv ~6 s at head_dim 64 x 2 per lane, ~21 s at
 * 64 x 3; all three ~110 s at 128 x 3 (~12 s at 128 x 1). So at most 48 vec4s
 * of head_dim x rows per lane for the forward and dq, 32 for dk/dv (twice
 * their registers per key). */
static uint32_t attention_train_per(const vks_ops *o, uint32_t head_dim, bool dkdv) {
    if (o->attention_train_per) return o->attention_train_per;
    uint32_t per = (dkdv ? 32 : 48) / ((head_dim + 3) / 4);
    return per < 1 ? 1 : per > 4 ? 4 : per;
}

/* The CPU drivers' kernels: workgroup = one subgroup. */
static void attention_sg_spec(const vks_ops *o, const vks_attention_train *a, vks_binding dout, bool dkdv,
                              uint32_t spec[4]) {
    attention_spec(o, a, dout, spec);
    spec[0] = o->info.subgroup_size;
    spec[1] = (a->head_dim + 3u) / 4u;
    spec[3] = attention_train_per(o, a->head_dim, dkdv);
}

/* Workgroups over T rows (or keys) in blocks of `block` (tile kernels), times `heads`. */
static uint64_t attention_groups(const vks_ops *o, const vks_attention_train *a, uint32_t block, bool dkdv) {
    if (o->attention_train_sg) block = o->info.subgroup_size * attention_train_per(o, a->head_dim, dkdv);
    return ceil_div(a->T, block) * (dkdv ? a->n_kv_heads : a->n_heads);
}

int vks_op_attention_train(vks_ops *o, vks_cmd *c, const vks_attention_train *a) {
    const char *op = "attention_train";
    if (!o || !c || !a) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_attention_train(o, op, a);
    if (rc) return rc;
    attn_push push = attention_push(a, false);
    uint32_t spec[4];
    bool sg = o->attention_train_sg;
    if (sg) attention_sg_spec(o, a, a->q, false, spec);
    else attention_spec(o, a, a->q, spec);
    vks_binding b[] = {a->q, a->k, a->v, a->start, a->out, a->row_max, a->row_sum};
    return vks_ops_dispatch(o, c, sg ? "attention_train_sg" : "attention_train", spec, sg ? 4 : 3, b, 7, &push,
                            sizeof push, attention_groups(o, a, ATTN_TRAIN_QUERY_BLOCK, false), op);
}

/* Floats of the backward's scratch: (max, sum, delta) per (row, head). */
static uint64_t attention_scratch_floats(uint32_t T, uint32_t n_heads) { return 3 * (uint64_t)T * n_heads; }

size_t vks_op_attention_train_backward_scratch_bytes(uint32_t T, uint32_t n_heads) {
    uint64_t floats = attention_scratch_floats(T, n_heads);
    return floats > UINT32_MAX ? 0 : (size_t)(floats * 4);
}

int vks_op_attention_train_backward(vks_ops *o, vks_cmd *c, const vks_attention_train *a, vks_binding dout,
                                    vks_binding dq, vks_binding dk, vks_binding dv, vks_binding scratch,
                                    bool accumulate) {
    const char *op = "attention_train_backward";
    if (!o || !c || !a) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_attention_train(o, op, a);
    if (rc) return rc;
    uint64_t nq = (uint64_t)a->T * a->n_heads * a->head_dim, nkv = (uint64_t)a->T * a->n_kv_heads * a->head_dim;
    rc = vks_ops_check_range(op, "dout", dout, nq, 4);
    if (!rc) rc = vks_ops_check_range(op, "dq", dq, nq, 4);
    if (!rc) rc = vks_ops_check_range(op, "dk", dk, nkv, 4);
    if (!rc) rc = vks_ops_check_range(op, "dv", dv, nkv, 4);
    if (!rc) rc = vks_ops_check_range(op, "scratch", scratch, attention_scratch_floats(a->T, a->n_heads), 4);
    vks_binding used[] = {a->q, a->k, a->v, a->start, a->out, a->row_max, a->row_sum, dout, scratch, dq, dk, dv};
    if (!rc) rc = check_apart(op, "dq", dq, used, 9);
    if (!rc) rc = check_apart(op, "dk", dk, used, 10);
    if (!rc) rc = check_apart(op, "dv", dv, used, 11);
    if (!rc) rc = check_apart(op, "scratch", scratch, used, 8);
    if (rc) return rc;
    attn_push push = attention_push(a, accumulate);
    /* scratch[t, h] = (max, sum, dout . out): the statistics and sum_j P_j dP_j
     * of every (row, head), in one binding for the two kernels after it */
    uint32_t spec_e[] = {o->wg_elementwise};
    vks_binding b_delta[] = {a->out, dout, a->row_max, a->row_sum, scratch};
    rc = vks_ops_dispatch(o, c, "attention_train_delta", spec_e, 1, b_delta, 5, &push, sizeof push,
                          ceil_div((uint64_t)a->T * a->n_heads, o->wg_elementwise), "attention_train_delta");
    if (rc) return rc;
    uint32_t spec[4], spec_kv[4];
    bool sg = o->attention_train_sg;
    if (sg) {
        attention_sg_spec(o, a, dout, false, spec);
        attention_sg_spec(o, a, dout, true, spec_kv);
    } else {
        attention_spec(o, a, dout, spec);
        attention_spec(o, a, dout, spec_kv);
    }
    vks_binding b_dq[] = {a->q, a->k, a->v, a->start, dout, scratch, dq};
    rc = vks_ops_dispatch(o, c, sg ? "attention_train_dq_sg" : "attention_train_dq", spec, sg ? 4 : 3, b_dq, 7,
                          &push, sizeof push, attention_groups(o, a, ATTN_TRAIN_QUERY_BLOCK, false),
                          "attention_train_dq");
    if (rc) return rc;
    vks_binding b_dkdv[] = {a->q, a->k, a->v, a->start, dout, scratch, dk, dv};
    return vks_ops_dispatch(o, c, sg ? "attention_train_dkdv_sg" : "attention_train_dkdv", spec_kv, sg ? 4 : 3, b_dkdv,
                            8, &push, sizeof push, attention_groups(o, a, ATTN_TRAIN_KEY_BLOCK, true),
                            "attention_train_dkdv");
}

/* ---- SwiGLU ---- */

int vks_op_swiglu_backward(vks_ops *o, vks_cmd *c, vks_binding g, vks_binding u, vks_binding dout, vks_binding dg,
                           vks_binding du, uint32_t n, bool accumulate) {
    const char *op = "swiglu_backward";
    if (!o || !c || !n) return vks_set_error(VKS_ERR_ARG, "%s: bad arguments", op);
    int rc = vks_ops_check_range(op, "g", g, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "u", u, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "dout", dout, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "dg", dg, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "du", du, n, 4);
    /* dg may be g's or dout's memory and du u's (each element is read before
     * it is written), but not when accumulating, and never each other's */
    vks_binding dg_apart[] = {u, du, g, dout}, du_apart[] = {g, dout, u};
    if (!rc) rc = check_apart(op, "dg", dg, dg_apart, accumulate ? 4 : 2);
    if (!rc) rc = check_apart(op, "du", du, du_apart, accumulate ? 3 : 2);
    if (rc) return rc;
    uint32_t push[] = {n, accumulate ? 1u : 0u};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {g, u, dout, dg, du};
    return vks_ops_dispatch(o, c, "swiglu_backward", spec, 1, b, 5, push, sizeof push,
                            ceil_div(n, o->wg_elementwise), op);
}

/* ---- token log-probability ---- */

static int check_logprob(const char *op, vks_binding logits, vks_binding target, const char *per_row_name,
                         vks_binding per_row, uint32_t R, uint32_t V) {
    if (!R || !V) return vks_set_error(VKS_ERR_ARG, "%s: bad sizes R=%u V=%u", op, R, V);
    int rc = vks_ops_check_range(op, "logits", logits, (uint64_t)R * V, 4);
    if (!rc) rc = vks_ops_check_range(op, "target", target, R, 4);
    if (!rc) rc = vks_ops_check_range(op, per_row_name, per_row, R, 4);
    return rc;
}

int vks_op_token_logprob(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target, vks_binding logp,
                         uint32_t R, uint32_t V) {
    const char *op = "token_logprob";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_logprob(op, logits, target, "logp", logp, R, V);
    if (rc) return rc;
    uint32_t push[] = {R, V, 0};
    uint32_t spec[] = {o->wg_row};
    vks_binding b[] = {logits, target, logp};
    return vks_ops_dispatch(o, c, "token_logprob", spec, 1, b, 3, push, sizeof push, R, op);
}

int vks_op_token_logprob_backward(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target,
                                  vks_binding dlogp, vks_binding dlogits, uint32_t R, uint32_t V, bool accumulate) {
    const char *op = "token_logprob_backward";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_logprob(op, logits, target, "dlogp", dlogp, R, V);
    if (!rc) rc = vks_ops_check_range(op, "dlogits", dlogits, (uint64_t)R * V, 4);
    /* over the logits only in overwrite mode: each element is read before it is replaced */
    vks_binding read[] = {logits, target, dlogp};
    if (!rc) rc = check_apart(op, "dlogits", dlogits, read + (accumulate ? 0 : 1), accumulate ? 3 : 2);
    if (rc) return rc;
    uint32_t push[] = {R, V, accumulate ? 1u : 0u};
    uint32_t spec[] = {o->wg_row};
    vks_binding b[] = {logits, target, dlogp, dlogits};
    return vks_ops_dispatch(o, c, "token_logprob_backward", spec, 1, b, 4, push, sizeof push, R, op);
}

int vks_op_token_entropy(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target, vks_binding entropy,
                         uint32_t R, uint32_t V) {
    const char *op = "token_entropy";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_logprob(op, logits, target, "entropy", entropy, R, V);
    vks_binding read[] = {logits, target};
    if (!rc) rc = check_apart(op, "entropy", entropy, read, 2);
    if (rc) return rc;
    uint32_t push[] = {R, V, 0};
    uint32_t spec[] = {o->wg_row};
    vks_binding b[] = {logits, target, entropy};
    return vks_ops_dispatch(o, c, "token_entropy", spec, 1, b, 3, push, sizeof push, R, op);
}

int vks_op_token_logprob_entropy_backward(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target,
                                          vks_binding dlogp, vks_binding dentropy, vks_binding dlogits,
                                          vks_binding entropy, uint32_t R, uint32_t V, bool accumulate) {
    const char *op = "token_logprob_entropy_backward";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_logprob(op, logits, target, "dlogp", dlogp, R, V);
    if (!rc) rc = vks_ops_check_range(op, "dentropy", dentropy, R, 4);
    if (!rc) rc = vks_ops_check_range(op, "dlogits", dlogits, (uint64_t)R * V, 4);
    if (!rc) rc = vks_ops_check_range(op, "entropy", entropy, R, 4);
    /* over the logits only in overwrite mode: each element is read before it is replaced */
    vks_binding read[] = {logits, target, dlogp, dentropy, entropy};
    if (!rc) rc = check_apart(op, "dlogits", dlogits, read + (accumulate ? 0 : 1), accumulate ? 5 : 4);
    vks_binding others[] = {logits, target, dlogp, dentropy, dlogits};
    if (!rc) rc = check_apart(op, "entropy", entropy, others, 5);
    if (rc) return rc;
    uint32_t push[] = {R, V, accumulate ? 1u : 0u};
    uint32_t spec[] = {o->wg_row};
    vks_binding b[] = {logits, target, dlogp, dlogits, dentropy, entropy};
    return vks_ops_dispatch(o, c, "token_logprob_entropy_backward", spec, 1, b, 6, push, sizeof push, R, op);
}
