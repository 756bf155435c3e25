/* vks_ops_grad.h: records the training ops into a command buffer: the
 * backward of the forward ops (vks_ops.h) and the optimizer. Same conventions
 * as vks_ops.h: f32 activations and gradients, row-major, rows = tokens;
 * buffers passed as vks_binding; every size and binding range checked on the
 * host (VKS_ERR_ARG); deterministic: the same inputs give bit-identical
 * outputs on one device (no float atomics, every sum in a fixed order).
 * The float64 truth of each op is in vks_ref_grad.h. */
#ifndef VKS_OPS_GRAD_H
#define VKS_OPS_GRAD_H
#include "vks_ops.h"
#include "vks_ref_grad.h"

/* ==== linear ops (matmul, embedding, bias) and the optimizer (gradient
 * norm, clipping, AdamW): src/gpu/ops_grad_linear.c, ops_grad_optim.c ====
 * Gradients ACCUMULATE where training needs it: the matmul and bias ops take
 * an accumulate flag (false overwrites), the embedding backward always adds.
 * Tiled, as the forward matmul: see shaders/matmul_grad.comp. */

/* Forward y[m, y_col0 + n] = sum_k x[m, k] W[n, k] (vks_op_matmul), W f32
 * [N, K]. dy is the gradient of that output window: dy[m, dy_col0 + n], rows
 * of stride ldy (dy_col0 + N <= ldy).
 * dx[M, K] = (accumulate ? dx : 0) + dy . W, each element summed over n in
 * order, the old value added once at the end. */
int vks_op_matmul_backward_x(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t ldy, uint32_t dy_col0,
                             vks_binding W, vks_binding dx, uint32_t M, uint32_t N, uint32_t K, bool accumulate);
/* dW[N, K] = (accumulate ? dW : 0) + dy^T . x (x f32 [M, K]), each element
 * summed over m in order, the old value added once at the end. */
int vks_op_matmul_backward_w(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t ldy, uint32_t dy_col0,
                             vks_binding x, vks_binding dW, uint32_t M, uint32_t N, uint32_t K, bool accumulate);

/* Embedding backward: dtable[tokens[r], :] += dout[r, :] for r = 0..R-1 in
 * that order (a sequential f32 loop, bit for bit), without atomics. The host,
 * which knows the tokens, groups the rows by token first:
 * vks_op_embed_backward_index writes VKS_EMBED_GRAD_INDEX_WORDS(R) words
 * (upload them, see shaders/embed_grad.comp for the layout) and the number
 * of distinct tokens; VKS_ERR_ARG naming the row when a token is >= V.
 * vks_op_embed_backward adds into a table chunk holding rows
 * [row0, row0 + table_rows) of D columns (as vks_op_embed); rows of other
 * tokens are not touched. It always accumulates: zero the table first. */
#define VKS_EMBED_GRAD_INDEX_WORDS(R) (3 * (size_t)(R) + 1)
int vks_op_embed_backward_index(const uint32_t *tokens, uint32_t R, uint32_t V, uint32_t *index,
                                uint32_t *n_unique);
int vks_op_embed_backward(vks_ops *o, vks_cmd *c, vks_binding index, uint32_t n_unique, vks_binding dout,
                          uint32_t R, uint32_t D, vks_binding dtable, uint32_t row0, uint32_t table_rows);

/* Bias backward: db[j] = (accumulate ? db[j] : 0) + dy[0, j] + dy[1, j] + ...
 * (rows added one by one in order: a sequential f32 loop, bit for bit).
 * dy f32 [R, D], db f32 [D]. */
int vks_op_bias_backward(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t R, uint32_t D, vks_binding db,
                         bool accumulate);

/* Global gradient-norm clipping on the device, in two deterministic levels:
 * vks_op_grad_squares writes the sums of squares of g[0..n) in
 * vks_op_grad_squares_partials(o, n) fixed chunks to partials[first ..], one
 * call per gradient buffer at consecutive `first`s; vks_op_clip_scale then
 * sums partials[0 .. n_partials) in order in one workgroup and writes
 * out[0] = vks_ref_clip_scale(norm, max_norm) (1 when max_norm <= 0) and
 * out[1] = norm (f32). The chunking depends on the device's workgroup size:
 * bit-identical on one device, not across devices. */
uint32_t vks_op_grad_squares_partials(const vks_ops *o, uint64_t n);
int vks_op_grad_squares(vks_ops *o, vks_cmd *c, vks_binding g, uint32_t n, vks_binding partials, uint32_t first);
int vks_op_clip_scale(vks_ops *o, vks_cmd *c, vks_binding partials, uint32_t n_partials, float max_norm,
                      vks_binding out);
/* Both steps over n_grads buffers (grads[i] holding counts[i] floats);
 * partials must hold the sum of their vks_op_grad_squares_partials. */
int vks_op_grad_clip(vks_ops *o, vks_cmd *c, const vks_binding *grads, const uint32_t *counts, int n_grads,
                     vks_binding partials, float max_norm, vks_binding out);

/* One AdamW step over n elements, vks_ref_adamw_step's formula in f32 (the
 * bias corrections 1 - beta^t and 1 - beta are computed here in double):
 * params, grads, m, v f32 [n]; the gradient scale is scale[0], read on the
 * device (the out of vks_op_clip_scale, or a buffer holding 1.0f). t >= 1. */
int vks_op_adamw(vks_ops *o, vks_cmd *c, vks_binding params, vks_binding grads, vks_binding m, vks_binding v,
                 uint32_t n, const vks_adamw_params *h, int t, vks_binding scale);

#endif
