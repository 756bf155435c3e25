/* vks_ref_grad.h: float64 reference of every training op, forward and backward
 * side by side (as llm.c's train_gpt2.c), and the AdamW step with its
 * schedule. The truth the GPU backward kernels are tested against.
 *
 * Conventions:
 * - Everything is double end to end, so central finite differences of a
 *   forward agree with its backward to ~1e-8; GPU tests convert f32 to double.
 * - Layouts are vks_ref.h's: row-major, rows = tokens, a weight W [N, K] maps
 *   K inputs to N outputs (y = x W^T).
 * - Every backward ACCUMULATES (+=) into its gradient outputs: the caller zeroes
 *   them. A gradient pointer that may be NULL is said so; NULL skips it.
 *   The one exception is RoPE, in place like its forward (see there).
 * - A residual add y = x + f(x) has no function: its backward passes dy
 *   through unchanged, i.e. the caller accumulates f's input gradient into
 *   the same buffer that already holds dy (dx = dy + df/dx^T dy).
 * - Functions return VKS_OK, or VKS_ERR_ARG (bad shape, NULL, out-of-range
 *   index) / VKS_ERR_NOMEM with vks_last_error() set, leaving outputs as they
 *   were. */
#ifndef VKS_REF_GRAD_H
#define VKS_REF_GRAD_H
#include "vks_common.h"
#include "vks_train_types.h"

/* ---- embedding: out[r, :] = table[tokens[r], :]  (table [V, D]) ---- */
int vks_ref_embed_forward(const double *table, int V, int D, const uint32_t *tokens, int R, double *out);
/* dtable[tokens[r], :] += dout[r, :], rows added in order r = 0..R-1 (a
 * deterministic order: the GPU must sum repeated tokens in the same order to
 * match bit for bit in f32). */
int vks_ref_embed_backward(double *dtable, int V, int D, const uint32_t *tokens, int R, const double *dout);

/* ---- RMSNorm: out[r, d] = x[r, d] * w[d] / sqrt(mean(x[r, :]^2) + eps) ---- */
int vks_ref_rmsnorm_forward(const double *x, const double *w, int R, int D, double eps, double *out);
/* dx (may be NULL) and dw (may be NULL); the inverse RMS is recomputed from x. */
int vks_ref_rmsnorm_backward(const double *x, const double *w, int R, int D, double eps, const double *dout,
                             double *dx, double *dw);

/* ---- matmul: y[M, N] = x[M, K] W[N, K]^T ---- */
int vks_ref_matmul_forward(const double *x, const double *W, int M, int N, int K, double *y);
/* dx[M, K] += dy W (may be NULL), dW[N, K] += dy^T x (may be NULL). */
int vks_ref_matmul_backward(const double *x, const double *W, int M, int N, int K, const double *dy, double *dx,
                            double *dW);

/* ---- bias: y[r, j] += b[j] (Qwen2's q/k/v biases) ---- */
int vks_ref_bias_forward(double *y, const double *b, int R, int D);
/* db[j] += sum_r dy[r, j]; dy passes through to the input unchanged. */
int vks_ref_bias_backward(const double *dy, int R, int D, double *db);

/* ---- RoPE, exactly vks_ref_rope's rotation (same modes, angles, arguments) ----
 * In place on x[r, col0 + h*head_dim + j], h < n_heads, row stride `stride`:
 * pair i rotates by angle pos[r] * freqs[i] (freqs[head_dim/2]: vks_rope_freqs). */
int vks_ref_rope_forward(double *x, const uint32_t *pos, int R, int stride, int col0, int n_heads, int head_dim,
                         const double *freqs, int mode);
/* In place too: the rotation is orthogonal, so the input gradient is the
 * output gradient rotated back (angle negated). Turns d(out) held in dx into
 * d(in); it does not accumulate. */
int vks_ref_rope_backward(double *dx, const uint32_t *pos, int R, int stride, int col0, int n_heads, int head_dim,
                          const double *freqs, int mode);

/* ---- causal attention over packed sequences, grouped-query heads ----
 * q, out [T, n_heads*head_dim]; k, v [T, n_kv_heads*head_dim]. Query head h
 * reads KV head h / (n_heads / n_kv_heads). Row t attends keys start[t]..t
 * (start[t] <= t: the first row of t's sequence), scale 1/sqrt(head_dim).
 * The softmax statistics of row t, head h go to row_max[t*n_heads + h] (the
 * largest scaled score) and row_sum[t*n_heads + h] (sum of exp(score - max));
 * both may be NULL. One row of scores (T doubles) is held at a time. */
int vks_ref_attention_forward(const double *q, const double *k, const double *v, const uint32_t *start, int T,
                              int n_heads, int n_kv_heads, int head_dim, double *out, double *row_max,
                              double *row_sum);
/* Gradients dq, dk, dv (each may be NULL) from dout, given the forward's
 * statistics (the probabilities are exp(score - max) / sum, not recomputed
 * from scratch: wrong statistics give wrong gradients). */
int vks_ref_attention_backward(const double *q, const double *k, const double *v, const uint32_t *start, int T,
                               int n_heads, int n_kv_heads, int head_dim, const double *row_max,
                               const double *row_sum, const double *dout, double *dq, double *dk, double *dv);

/* ---- SwiGLU: out[i] = silu(g[i]) * u[i], silu(a) = a / (1 + exp(-a)) ---- */
int vks_ref_swiglu_forward(const double *g, const double *u, size_t n, double *out);
/* dg += dout * u * silu'(g), du += dout * silu(g) (either may be NULL). */
int vks_ref_swiglu_backward(const double *g, const double *u, size_t n, const double *dout, double *dg, double *du);

/* ---- log-probability of chosen tokens ----
 * logp[r] = log_softmax(logits[r, :])[target[r]]  (logits [R, V]). The
 * cross-entropy loss of row r is -logp[r]. */
int vks_ref_token_logprob_forward(const double *logits, int R, int V, const uint32_t *target, double *logp);
/* dlogits[r, :] += dlogp[r] * (onehot(target[r]) - softmax(logits[r, :])). */
int vks_ref_token_logprob_backward(const double *logits, int R, int V, const uint32_t *target, const double *dlogp,
                                   double *dlogits);

/* ---- entropy of each row's distribution (the entropy bonus) ----
 * entropy[r] = H_r = -sum_j p_j log p_j, p = softmax(logits[r, :]). */
int vks_ref_token_entropy_forward(const double *logits, int R, int V, double *entropy);
/* dlogits[r, j] += dentropy[r] * dH_r/dlogits[r, j] = -dentropy[r] p_j (log p_j + H_r),
 * the gradient of sum_r dentropy[r] H_r. The bonus term -c w_r H_r / budget
 * has dentropy[r] = -c w_r / budget: dlogits += c w_r p_j (log p_j + H_r) / budget. */
int vks_ref_token_entropy_backward(const double *logits, int R, int V, const double *dentropy, double *dlogits);

/* ---- the RL loss on the log-probabilities (h->type picks the policy term) ----
 * Per row r with weight w[r] != 0 (a completion token; 0 masks the row),
 * x = logp - logp_old, rho = exp(x), A the row's advantage:
 *   loss_r = w[r] * P(row) / token_budget
 * summed over rows (the normaliser is the caller's: a fixed token budget per
 * step by default). The policy term P and its d/dlogp, by type:
 * - intellect2 (INTELLECT-2): c = min(rho, delta) (ratio capped at delta),
 *     P = max(-c A, -clip(c, 1 - eps, 1 + eps) A). The row is "clipped" when
 *     the clipped term is strictly the larger one: its gradient is then 0 (the
 *     clipped value is a constant); else dP = -A dc, with dc = rho where
 *     rho < delta and 0 where the cap holds (flag CAPPED).
 * - dapo (DAPO's clip-higher): the same without a cap, clip(rho, 1 - eps_low,
 *     1 + eps_high).
 * - cispo (MiniMax-M1): c = clip(rho, 1 - eps_low, 1 + eps_high) held constant,
 *     P = -c A logp, dP = -c A; "clipped" when c != rho (the gradient flows).
 * - dppo_kl (prime-rl's default): dp = exp(logp) - exp(logp_old); masked
 *     when A > 0 and dp > mask_high, or A <= 0 and dp < -mask_low;
 *     P = -[not masked] adv_tau A rho + kl_tau x^2, dP = -[not masked] adv_tau A rho + 2 kl_tau x.
 * - ipo (prime-rl's): the same, masked when dp > mask_high or dp < -mask_low
 *     whatever A's sign.
 * - gspo (GSPO): dapo's P with rho replaced by the row's sequence's ratio
 *     s = exp(mean x over the sequence's live rows), the same for all its rows
 *     (vks_ref_gspo_loss). With one weight and one advantage per sequence (a
 *     completion's), the sequence's sum of w P has d/dlogp = w dP/ds ds/dlogp
 *     summed over its n rows = w (-A s) per row (ds/dlogp = s / n), 0 where
 *     the clipped term wins.
 * - decoupled_ppo (AReaL's decoupled PPO): logp_old is the behaviour policy's
 *     (the sampler's); with pi_prox the proximal policy, rho = pi / pi_prox
 *     and b = pi_prox / pi_behav, a constant of the gradient, c = b where
 *     b <= behav_cap, else 0 (AReaL's mask: MIS) or behav_cap (behav_truncate:
 *     TIS), flag CLIPPED; P = c max(-rho A, -clip(rho, 1 - eps, 1 + eps) A)
 *     (CLIPPED also where the clipped term wins; dP = 0 there, else -c A rho).
 *     pi_prox is the weights the step starts from (vks_ref_grpo_loss: logp
 *     itself, so rho = 1, P = -c A, dP = -c A: one optimizer step per trainer
 *     step never leaves the clip range), or given (vks_ref_decoupled_ppo_loss).
 * Optional KL penalty to a reference model (kl_beta > 0; off by default), the
 * k3 estimator on the sampled token, y = ref_logp - logp:
 *   loss_r += w[r] kl_beta (exp(y) - y - 1) / token_budget   (>= 0, 0 at y = 0)
 *   d/dlogp += w[r] kl_beta (1 - exp(y)) / token_budget       (also on clipped rows) */
/* (its parameters and row flags: vks_grpo_loss_params, VKS_GRPO_*, vks_train_types.h) */
/* ref_logp (the reference model's log-probability of each row's target) may
 * be NULL when kl_beta is 0. loss_rows[r] (may be NULL) gets loss_r (0 on masked rows), flags[r] (may be
 * NULL) the VKS_GRPO_* flags (0 on masked rows), *loss (may be NULL) the sum
 * in row order; dlogp (may be NULL) ACCUMULATES d loss / d logp. weight NULL:
 * 1 for every row. h must pass vks_grpo_loss_params_ok. */
int vks_ref_grpo_loss(const double *logp, const double *logp_old, const double *advantage, const double *ref_logp,
                      const double *weight, int R, const vks_grpo_loss_params *h, double *loss_rows, uint32_t *flags, double *loss,
                      double *dlogp);
/* gspo's: the rows form n_seqs sequences of seq_lens[s] consecutive rows (summing
 * to R), each one's live rows (weight != 0) with one weight and one advantage
 * (VKS_ERR_ARG otherwise); the rest as vks_ref_grpo_loss, which refuses gspo. */
int vks_ref_gspo_loss(const double *logp, const double *logp_old, const double *advantage, const double *ref_logp,
                      const double *weight, const int *seq_lens, int n_seqs, int R, const vks_grpo_loss_params *h,
                      double *loss_rows, uint32_t *flags, double *loss, double *dlogp);
/* decoupled_ppo's with the proximal policy's log-probabilities given (the
 * rest as vks_ref_grpo_loss, logp_behav its logp_old): the loss as a function
 * of logp with pi_prox held, for finite differences across the clip. */
int vks_ref_decoupled_ppo_loss(const double *logp, const double *logp_prox, const double *logp_behav,
                               const double *advantage, const double *ref_logp, const double *weight, int R,
                               const vks_grpo_loss_params *h, double *loss_rows, uint32_t *flags, double *loss,
                               double *dlogp);
/* seq_x[r] = the mean of logp - logp_old over the live rows (weight != 0; NULL:
 * all) of row r's sequence, 0 in a sequence without one. */
int vks_ref_sequence_log_ratio(const double *logp, const double *logp_old, const double *weight, const int *seq_lens,
                               int n_seqs, int R, double *seq_x);

/* ---- optimizer (its parameters: vks_adamw_params, vks_train_types.h) ---- */
/* One AdamW step (PyTorch's and llm.c's), element by element, t = 1-based step:
 *   g = grad_scale * grads[i]            (grad_scale: clipping, else 1)
 *   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
 *   p -= lr * (m / (1 - beta1^t) / (sqrt(v / (1 - beta2^t)) + eps) + weight_decay * p)
 * (the decay uses p before the step). */
int vks_ref_adamw_step(double *params, const double *grads, double *m, double *v, size_t n,
                       const vks_adamw_params *h, int t, double grad_scale);
/* sum of g[i]^2: add these over every tensor and take the root for the
 * global gradient norm. */
double vks_ref_sum_squares(const double *g, size_t n);
/* Clipping factor for a global norm: min(1, max_norm / (norm + 1e-6)), as
 * torch.nn.utils.clip_grad_norm_; 1 when max_norm <= 0 (clipping off). */
double vks_ref_clip_scale(double norm, double max_norm);

/* Learning rate at 1-based step t of schedule s (vks_train_types.h). */
double vks_ref_lr_at(const vks_lr_schedule *s, int t);

/* ---- LoRA linear (src/ref/ref_lora.c): a frozen W [N, K] plus an adapter
 * A [r, K], B [N, r] (vks_lora.h):
 *   y[M, N] = x W^T + s (x A^T) B^T
 * h (may be NULL) receives x A^T [M, r], unscaled. */
int vks_ref_lora_forward(const double *x, const double *W, const double *A, const double *B, int M, int N, int K,
                         int r, double s, double *y, double *h);
/* With g = s dy B [M, r]:  dx += dy W + g A,  dA += g^T x,  dB += s dy^T (x A^T)
 * (each may be NULL; W is frozen: no dW). */
int vks_ref_lora_backward(const double *x, const double *W, const double *A, const double *B, int M, int N, int K,
                          int r, double s, const double *dy, double *dx, double *dA, double *dB);

#endif
