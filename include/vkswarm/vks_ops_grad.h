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
#include "vks_train_types.h"

/* ==== linear ops (matmul, embedding, bias) and the optimizer (gradient
 * norm, clipping, AdamW): src/gpu/ops_grad_linear.c, ops_grad_optim.c ====
 * Gradients ACCUMULATE where training needs it: the matmul and bias ops take
 * an accumulate flag (false overwrites), the embedding backward always adds.
 * Tiled, as the forward matmul: see shaders/matmul_grad.comp. */

/* Forward y[m, y_col0 + n] = sum_k x[m, k] W[n, k] (vks_op_matmul), W [N, K]
 * of dtype in vks_op_matmul's layout and limits (f32 master weights; f16,
 * bf16, q8_0, q4_0, q4_k: a frozen base, decoded in registers, never
 * expanded to f32 in memory; block types need K a whole number of blocks and
 * a 16-byte aligned W). dy is the gradient of that output window:
 * dy[m, dy_col0 + n], rows of stride ldy (dy_col0 + N <= ldy).
 * dx[M, K] = (accumulate ? dx : 0) + dy . W, each element summed over n in
 * order, the old value added once at the end; the weights enter with exactly
 * the values of vks_dequantize. */
int vks_op_matmul_backward_x(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t ldy, uint32_t dy_col0,
                             vks_binding W, vks_dtype dtype, vks_binding dx, uint32_t M, uint32_t N, uint32_t K,
                             bool accumulate);
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

/* ==== LoRA linear: a frozen base W plus a low-rank adapter
 * (src/gpu/ops_lora.c; shapes, scale and PEFT init in vks_lora.h, the
 * float64 truth vks_ref_lora_forward/backward) ====
 *   y = W x + scale B (A x),  W [out, in] of w_dtype (any vks_op_matmul type,
 *   never expanded to f32), A f32 [rank, in], B f32 [out, rank].
 * Composed of the matmul ops rather than fused: W x is the forward matmul
 * (the same kernel and result as vks_op_matmul_kind of the same kind, so a
 * fresh adapter, B = 0, leaves y bit for bit the base's); A x and B z are two
 * f32 matmuls of rank rows/columns, 2 rank (in + out) / (in out) of the base's
 * work (1% for rank 16 at dim 4096), for which the tuned kernels serve as
 * they are; the scale is one elementwise product on [M, rank]. */
typedef struct {
    uint32_t in, out, rank;
    float scale;      /* alpha / rank, finite */
    vks_binding W;    /* the frozen base, vks_op_matmul's layout of w_dtype */
    vks_dtype w_dtype;
    vks_binding A, B; /* the adapter, f32 */
} vks_lora_linear;
/* y[m, y_col0 + n] = (accumulate ? y : 0) + (W x)[m, n] + (B z)[m, n] for x
 * f32 [M, in], y rows of stride ldy (y_col0 + out <= ldy), where z = scale
 * (A x), f32 [M, rank], is written to z (the backward reads it). The sums:
 * W x first (plus the old y), then B z added (vks_op_matmul's accumulate).
 * kind: as vks_op_matmul_kind, for all three products. z shares memory with
 * no other binding (VKS_ERR_ARG). */
int vks_op_lora_forward(vks_ops *o, vks_cmd *c, const vks_lora_linear *l, vks_binding x, vks_binding z,
                        vks_binding y, uint32_t M, uint32_t ldy, uint32_t y_col0, bool accumulate,
                        vks_matmul_kind kind);
/* The backward of vks_op_lora_forward given x, its z and dy (the gradient of
 * y's window: dy[m, dy_col0 + n], rows of stride ldy), with g = scale dy B
 * (written to scratch, f32 [M, rank]):
 *   dB += dy^T z          dA += g^T x         (always accumulate, as weight gradients)
 *   dx (+)= dy W + g A    (dx.buf NULL: skipped; the base part first, through
 *                          vks_op_matmul_backward_x in W's type)
 * W gets no gradient (frozen). dA [rank, in], dB [out, rank], dx [M, in] f32;
 * scratch, dA, dB and dx share memory with no other binding (VKS_ERR_ARG). */
int vks_op_lora_backward(vks_ops *o, vks_cmd *c, const vks_lora_linear *l, vks_binding x, vks_binding z,
                         vks_binding dy, uint32_t ldy, uint32_t dy_col0, vks_binding dx, vks_binding dA,
                         vks_binding dB, vks_binding scratch, uint32_t M, bool accumulate_dx);

/* ==== layer ops: RMSNorm, RoPE, attention, SwiGLU, token log-probability:
 * src/gpu/ops_grad_layer.c (shaders rmsnorm_backward.comp, rope.comp,
 * attention_train.comp, swiglu_backward.comp, token_logprob.comp) ====
 * "(+)=" below: the op overwrites, or adds to what is there when `accumulate`
 * is set; weight gradients (RMSNorm's dw) always accumulate. A binding whose
 * buf is NULL is "not wanted" where an argument says it may be. An output
 * that overlaps an input or another output is refused (VKS_ERR_ARG) except
 * where an op says it may (in place). */

/* Scratch bytes vks_op_rmsnorm_backward needs for R rows of D (R inverse RMS
 * values and the per-row-block partial sums of dw); 0 on overflow. */
size_t vks_op_rmsnorm_backward_scratch_bytes(uint32_t R, uint32_t D);
/* For out = x / rms(x) * w (vks_op_rmsnorm), with g = dout * w, s = 1/rms(x[r]):
 *   dx[r, d] (+)= s g_d - s^3 x[r, d] (g . x[r, :]) / D   (dx.buf NULL: skipped)
 *   dw[d]     += sum_r dout[r, d] x[r, d] s_r              (dw.buf NULL: skipped)
 * x, dout, dx f32 [R, D]; w, dw f32 [D]; scratch as sized above (may be NULL
 * without dw). dw's rows are summed in blocks of 64, then the blocks in order. */
int vks_op_rmsnorm_backward(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding w, vks_binding dout,
                            vks_binding dx, vks_binding dw, vks_binding scratch, uint32_t R, uint32_t D, float eps,
                            bool accumulate_dx);

/* In place, the inverse of vks_op_rope (same arguments): the gradient of the
 * rotated output in x becomes the gradient of its input (rotation by the
 * negated angle), as vks_ref_rope_backward. */
int vks_op_rope_backward(vks_ops *o, vks_cmd *c, vks_binding x, vks_binding pos, vks_binding table, uint32_t n_pos,
                         uint32_t R, uint32_t stride, uint32_t col0, uint32_t n_heads, uint32_t head_dim, uint32_t mode);

/* Causal grouped-query attention over T packed rows, for training: row t
 * attends keys start[t]..t (start[t] = first row of t's sequence; a value
 * above t is read as t, i.e. the row sees itself only), query head h reads KV
 * head h / (n_heads / n_kv_heads), scores scaled by 1/sqrt(head_dim).
 * Limits (VKS_ERR_ARG past them): head_dim <= 128 (the shared-memory tiles
 * are sized for it), T <= 16384 (the work of one dispatch grows as T^2 and a
 * GPU may stop a dispatch that runs for seconds: split longer batches at
 * sequence boundaries), and the device needs 26496 bytes of shared memory
 * per workgroup (desktop GPUs and lavapipe have 32 KiB or more). */
#define VKS_ATTENTION_TRAIN_MAX_HEAD_DIM 128u
#define VKS_ATTENTION_TRAIN_MAX_T 16384u
typedef struct {
    uint32_t T, n_heads, n_kv_heads, head_dim;
    vks_binding q;                /* f32 [T, n_heads*head_dim] */
    vks_binding k, v;             /* f32 [T, n_kv_heads*head_dim] */
    vks_binding start;            /* uint32 [T] */
    vks_binding out;              /* f32 [T, n_heads*head_dim] */
    vks_binding row_max, row_sum; /* f32 [T*n_heads], index t*n_heads + h */
    /* true promises that start[] never decreases (packed sequences, as the
     * trainer builds them): the dk/dv kernel then stops at the first query
     * tile that sees none of its keys instead of reading every later row's
     * start, and a query block's first row gives its first key. A broken
     * promise gives wrong results, never a memory fault. */
    bool starts_sorted;
} vks_attention_train;
/* Writes out and the softmax statistics of every (row t, head h): row_max =
 * the largest scaled score, row_sum = sum of exp(score - row_max), as
 * vks_ref_attention_forward. */
int vks_op_attention_train(vks_ops *o, vks_cmd *c, const vks_attention_train *a);
/* Scratch bytes of vks_op_attention_train_backward (3*T*n_heads floats); 0 on overflow. */
size_t vks_op_attention_train_backward_scratch_bytes(uint32_t T, uint32_t n_heads);
/* dq, dk, dv (+)= the gradients from dout (f32 [T, n_heads*head_dim]), given
 * a's q, k, v, start and the forward's out and statistics (probabilities are
 * recomputed from them, FlashAttention-2 style: wrong statistics give wrong
 * gradients). dq [T, n_heads*head_dim], dk, dv [T, n_kv_heads*head_dim].
 * A key's dk/dv sum over the query heads of its group and the query rows that
 * see it, in order. */
int vks_op_attention_train_backward(vks_ops *o, vks_cmd *c, const vks_attention_train *a, vks_binding dout,
                                    vks_binding dq, vks_binding dk, vks_binding dv, vks_binding scratch,
                                    bool accumulate);

/* For out = silu(g) * u (vks_op_swiglu with out apart from g keeps g and u
 * for this): dg (+)= dout * u * silu'(g), du (+)= dout * silu(g), n elements.
 * Without accumulate, dg may be g's (or dout's) memory and du u's. */
int vks_op_swiglu_backward(vks_ops *o, vks_cmd *c, vks_binding g, vks_binding u, vks_binding dout, vks_binding dg,
                           vks_binding du, uint32_t n, bool accumulate);

/* logp[r] = logits[r, target[r]] - logsumexp(logits[r, :]), logits f32 [R, V],
 * target int32 [R], logp f32 [R]. target[r] < 0 means "no target" (the last
 * row of a sequence, a masked row): logp[r] = 0. A target >= V (bad data the
 * host did not check) gives logp NaN, so that the loss shows it. */
int vks_op_token_logprob(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target, vks_binding logp,
                         uint32_t R, uint32_t V);
/* dlogits[r, :] (+)= dlogp[r] * (onehot(target[r]) - softmax(logits[r, :])),
 * dlogp f32 [R] on the device (the loss writes it: no host round trip). Rows
 * with target < 0 get no gradient (0 without accumulate, untouched with it);
 * target >= V: a NaN row. Without accumulate, dlogits may be the memory of
 * logits (the gradient replaces the logits). */
int vks_op_token_logprob_backward(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target,
                                  vks_binding dlogp, vks_binding dlogits, uint32_t R, uint32_t V, bool accumulate);
/* entropy[r] = H_r = -sum_j p_j log p_j, p = softmax(logits[r, :]), on rows
 * with a target (target >= 0); 0 on rows without one, NaN for target >= V
 * (vks_ref_token_entropy_forward). entropy f32 [R], apart from logits/target. */
int vks_op_token_entropy(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target, vks_binding entropy,
                         uint32_t R, uint32_t V);
/* The entropy bonus: vks_op_token_logprob_backward plus the gradient of
 * sum_r dentropy[r] H_r (dentropy f32 [R]: d loss / d H_r, e.g. -coef w_r /
 * token_budget for the bonus term -coef w_r H_r / token_budget):
 *   dlogits[r, j] (+)= dlogp[r] (onehot - p_j) - dentropy[r] p_j (log p_j + H_r)
 * (vks_ref_token_logprob_backward + vks_ref_token_entropy_backward), and
 * entropy[r] = H_r as vks_op_token_entropy. A row with dentropy[r] == 0 gets
 * exactly the values of vks_op_token_logprob_backward (same arithmetic).
 * Targets, accumulate and the in-place rule as vks_op_token_logprob_backward;
 * entropy shares memory with no other binding. */
int vks_op_token_logprob_entropy_backward(vks_ops *o, vks_cmd *c, vks_binding logits, vks_binding target,
                                          vks_binding dlogp, vks_binding dentropy, vks_binding dlogits,
                                          vks_binding entropy, uint32_t R, uint32_t V, bool accumulate);

/* ==== loss ops: the RL loss (src/gpu/ops_grad_loss.c, shaders/grpo_loss.comp) ====
 * The RL loss of h->type per row (intellect2, dppo_kl, ipo, cispo, dapo, gspo),
 * vks_ref_grpo_loss in f32 (the definitions, the flags and the parameters are
 * there; h must pass vks_grpo_loss_params_ok), one invocation per row: every
 * output is OVERWRITTEN (dlogp is the gradient the trainer's backward starts
 * from, not a sum). Rows with weight 0 get dlogp 0, loss 0 and flags 0 and
 * their other inputs are not read. Bindings of R 4-byte values each; dlogp
 * may be logp's memory (in place); no other output may share memory with
 * another binding (VKS_ERR_ARG). Deterministic: no reduction (the host sums
 * loss_rows in order). */
typedef struct {
    vks_binding logp;      /* f32: this policy's log-probability of each row's target (the forward's) */
    vks_binding logp_old;  /* f32: the policy that sampled it */
    vks_binding advantage; /* f32: the row's sequence's advantage */
    vks_binding weight;    /* f32: completion mask / weight, 0 masks the row */
    vks_binding ref_logp;  /* f32: the reference model's (KL term); may be unset (buf NULL) when h->kl_beta == 0 */
    vks_binding dlogp;     /* f32 out: d loss / d logp */
    vks_binding loss_rows; /* f32 out: each row's loss term (already divided by the token budget) */
    vks_binding flags;     /* uint32 out: VKS_GRPO_CLIPPED | VKS_GRPO_CAPPED */
    vks_binding seq_log_ratio; /* f32: gspo only (may be unset otherwise): the row's sequence's mean
                                * logp - logp_old over its live rows (vks_ref_sequence_log_ratio) */
} vks_grpo_loss_rows;
int vks_op_grpo_loss(vks_ops *o, vks_cmd *c, const vks_grpo_loss_rows *rows, uint32_t R,
                     const vks_grpo_loss_params *h);

#endif
