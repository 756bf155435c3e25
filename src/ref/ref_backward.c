/* ref_backward.c: float64 forward and backward of every training op, pairs
 * side by side, and AdamW with its schedule (see vks_ref_grad.h). Plain loops
 * for clarity; every backward accumulates into its gradients. */
#include "vkswarm/vks_ref_grad.h"

#include <math.h>
#include <stdlib.h>

static int bad_args(const char *fn) {
    return vks_set_error(VKS_ERR_ARG, "%s: NULL pointer or a size out of range", fn);
}

static double dot(const double *a, const double *b, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* ---- embedding ---- */

static bool tokens_in_range(const uint32_t *tokens, int R, int V) {
    for (int r = 0; r < R; r++)
        if (tokens[r] >= (uint32_t)V) return false;
    return true;
}

int vks_ref_embed_forward(const double *table, int V, int D, const uint32_t *tokens, int R, double *out) {
    if (!table || !tokens || !out || V <= 0 || D <= 0 || R <= 0 || !tokens_in_range(tokens, R, V))
        return bad_args("vks_ref_embed_forward");
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) out[(size_t)r * D + d] = table[(size_t)tokens[r] * D + d];
    return VKS_OK;
}

int vks_ref_embed_backward(double *dtable, int V, int D, const uint32_t *tokens, int R, const double *dout) {
    if (!dtable || !tokens || !dout || V <= 0 || D <= 0 || R <= 0 || !tokens_in_range(tokens, R, V))
        return bad_args("vks_ref_embed_backward");
    for (int r = 0; r < R; r++)
        for (int d = 0; d < D; d++) dtable[(size_t)tokens[r] * D + d] += dout[(size_t)r * D + d];
    return VKS_OK;
}

/* ---- RMSNorm ---- */

static double inv_rms(const double *row, int D, double eps) {
    return 1.0 / sqrt(dot(row, row, D) / D + eps);
}

int vks_ref_rmsnorm_forward(const double *x, const double *w, int R, int D, double eps, double *out) {
    if (!x || !w || !out || R <= 0 || D <= 0 || !(eps >= 0.0)) return bad_args("vks_ref_rmsnorm_forward");
    for (int r = 0; r < R; r++) {
        const double *row = x + (size_t)r * D;
        double inv = inv_rms(row, D, eps);
        for (int d = 0; d < D; d++) out[(size_t)r * D + d] = row[d] * inv * w[d];
    }
    return VKS_OK;
}

/* With g = dout * w and s = inv_rms: out_d = x_d s w_d and ds/dx_d = -s^3 x_d / D, so
 * dx_d = s g_d - s^3 x_d (g . x) / D. */
int vks_ref_rmsnorm_backward(const double *x, const double *w, int R, int D, double eps, const double *dout,
                             double *dx, double *dw) {
    if (!x || !w || !dout || R <= 0 || D <= 0 || !(eps >= 0.0)) return bad_args("vks_ref_rmsnorm_backward");
    for (int r = 0; r < R; r++) {
        const double *row = x + (size_t)r * D, *dy = dout + (size_t)r * D;
        double s = inv_rms(row, D, eps);
        if (dw)
            for (int d = 0; d < D; d++) dw[d] += dy[d] * row[d] * s;
        if (!dx) continue;
        double g_dot_x = 0.0;
        for (int d = 0; d < D; d++) g_dot_x += dy[d] * w[d] * row[d];
        for (int d = 0; d < D; d++) dx[(size_t)r * D + d] += s * dy[d] * w[d] - s * s * s * row[d] * g_dot_x / D;
    }
    return VKS_OK;
}

/* ---- matmul ---- */

int vks_ref_matmul_forward(const double *x, const double *W, int M, int N, int K, double *y) {
    if (!x || !W || !y || M <= 0 || N <= 0 || K <= 0) return bad_args("vks_ref_matmul_forward");
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) y[(size_t)m * N + n] = dot(x + (size_t)m * K, W + (size_t)n * K, K);
    return VKS_OK;
}

int vks_ref_matmul_backward(const double *x, const double *W, int M, int N, int K, const double *dy, double *dx,
                            double *dW) {
    if (!x || !W || !dy || M <= 0 || N <= 0 || K <= 0) return bad_args("vks_ref_matmul_backward");
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double g = dy[(size_t)m * N + n];
            const double *wn = W + (size_t)n * K, *xm = x + (size_t)m * K;
            if (dx)
                for (int k = 0; k < K; k++) dx[(size_t)m * K + k] += g * wn[k];
            if (dW)
                for (int k = 0; k < K; k++) dW[(size_t)n * K + k] += g * xm[k];
        }
    return VKS_OK;
}

/* ---- bias ---- */

int vks_ref_bias_forward(double *y, const double *b, int R, int D) {
    if (!y || !b || R <= 0 || D <= 0) return bad_args("vks_ref_bias_forward");
    for (int r = 0; r < R; r++)
        for (int j = 0; j < D; j++) y[(size_t)r * D + j] += b[j];
    return VKS_OK;
}

int vks_ref_bias_backward(const double *dy, int R, int D, double *db) {
    if (!dy || !db || R <= 0 || D <= 0) return bad_args("vks_ref_bias_backward");
    for (int r = 0; r < R; r++)
        for (int j = 0; j < D; j++) db[j] += dy[(size_t)r * D + j];
    return VKS_OK;
}

/* ---- RoPE ---- */

/* Rotates every pair of one head by +angle (direction 1) or -angle (-1); the
 * angle and pairing are vks_ref_rope's (ref_ops.c rope_head). */
static void rotate_head(double *head, uint32_t pos, int head_dim, const double *freqs, int mode, int direction) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * freqs[i];
        double c = cos(angle), s = direction * sin(angle);
        int i0 = mode == VKS_ROPE_HALF ? i : 2 * i;
        int i1 = mode == VKS_ROPE_HALF ? i + half : 2 * i + 1;
        double v0 = head[i0], v1 = head[i1];
        head[i0] = v0 * c - v1 * s;
        head[i1] = v0 * s + v1 * c;
    }
}

static int rope_apply(const char *fn, double *x, const uint32_t *pos, int R, int stride, int col0, int n_heads,
                      int head_dim, const double *freqs, int mode, int direction) {
    if (!x || !pos || !freqs || R <= 0 || n_heads <= 0 || head_dim <= 1 || head_dim % 2 != 0 || col0 < 0 ||
        (int64_t)stride < (int64_t)col0 + (int64_t)n_heads * head_dim ||
        (mode != VKS_ROPE_ADJACENT && mode != VKS_ROPE_HALF))
        return bad_args(fn);
    for (int r = 0; r < R; r++)
        for (int h = 0; h < n_heads; h++)
            rotate_head(x + (size_t)r * stride + col0 + (size_t)h * head_dim, pos[r], head_dim, freqs, mode,
                        direction);
    return VKS_OK;
}

int vks_ref_rope_forward(double *x, const uint32_t *pos, int R, int stride, int col0, int n_heads, int head_dim,
                         const double *freqs, int mode) {
    return rope_apply("vks_ref_rope_forward", x, pos, R, stride, col0, n_heads, head_dim, freqs, mode, 1);
}

int vks_ref_rope_backward(double *dx, const uint32_t *pos, int R, int stride, int col0, int n_heads, int head_dim,
                          const double *freqs, int mode) {
    return rope_apply("vks_ref_rope_backward", dx, pos, R, stride, col0, n_heads, head_dim, freqs, mode, -1);
}

/* ---- attention ---- */

typedef struct {
    const double *q, *k, *v;
    const uint32_t *start;
    int T, n_heads, n_kv_heads, head_dim;
} attn_shape;

static bool attn_shape_ok(const attn_shape *a) {
    if (!a->q || !a->k || !a->v || !a->start || a->T <= 0 || a->n_heads <= 0 || a->n_kv_heads <= 0 ||
        a->head_dim <= 0 || a->n_heads % a->n_kv_heads != 0)
        return false;
    for (int t = 0; t < a->T; t++)
        if (a->start[t] > (uint32_t)t) return false;
    return true;
}

/* Query row t, head h. */
static const double *attn_q(const attn_shape *a, int t, int h) {
    return a->q + ((size_t)t * a->n_heads + h) * a->head_dim;
}
/* Key (or value) row j of the KV head that query head h reads. */
static size_t attn_kv_offset(const attn_shape *a, int j, int h) {
    int kv_head = h / (a->n_heads / a->n_kv_heads);
    return ((size_t)j * a->n_kv_heads + kv_head) * a->head_dim;
}

/* scores[j - start] = q_t . k_j / sqrt(head_dim) for j = start[t]..t. */
static void attn_scores(const attn_shape *a, int t, int h, double *scores) {
    double scale = 1.0 / sqrt((double)a->head_dim);
    for (int j = (int)a->start[t]; j <= t; j++)
        scores[j - a->start[t]] = dot(attn_q(a, t, h), a->k + attn_kv_offset(a, j, h), a->head_dim) * scale;
}

int vks_ref_attention_forward(const double *q, const double *k, const double *v, const uint32_t *start, int T,
                              int n_heads, int n_kv_heads, int head_dim, double *out, double *row_max,
                              double *row_sum) {
    attn_shape a = {q, k, v, start, T, n_heads, n_kv_heads, head_dim};
    if (!attn_shape_ok(&a) || !out) return bad_args("vks_ref_attention_forward");
    double *p = malloc((size_t)T * sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_attention_forward: out of memory for %d scores", T);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            int n_keys = t - (int)start[t] + 1;
            attn_scores(&a, t, h, p);
            double max = -INFINITY, sum = 0.0;
            for (int j = 0; j < n_keys; j++) max = fmax(max, p[j]);
            for (int j = 0; j < n_keys; j++) {
                p[j] = exp(p[j] - max);
                sum += p[j];
            }
            double *o = out + ((size_t)t * n_heads + h) * head_dim;
            for (int d = 0; d < head_dim; d++) o[d] = 0.0;
            for (int j = 0; j < n_keys; j++) {
                const double *vj = v + attn_kv_offset(&a, (int)start[t] + j, h);
                for (int d = 0; d < head_dim; d++) o[d] += p[j] / sum * vj[d];
            }
            if (row_max) row_max[(size_t)t * n_heads + h] = max;
            if (row_sum) row_sum[(size_t)t * n_heads + h] = sum;
        }
    free(p);
    return VKS_OK;
}

/* One (row, head) of the backward. With P the probabilities, s the scaled
 * scores and o = sum_j P_j v_j:
 *   dv_j += P_j dout;  dP_j = dout . v_j;  ds_j = P_j (dP_j - sum_i P_i dP_i)
 *   dq += scale sum_j ds_j k_j;  dk_j += scale ds_j q. */
static void attn_backward_row(const attn_shape *a, int t, int h, double max, double sum, const double *dout,
                              double *p, double *dp, double *dq, double *dk, double *dv) {
    int j0 = (int)a->start[t], n_keys = t - j0 + 1, hd = a->head_dim;
    double scale = 1.0 / sqrt((double)hd);
    attn_scores(a, t, h, p);
    double p_dot_dp = 0.0;
    for (int j = 0; j < n_keys; j++) {
        p[j] = exp(p[j] - max) / sum;
        dp[j] = dot(dout, a->v + attn_kv_offset(a, j0 + j, h), hd);
        p_dot_dp += p[j] * dp[j];
    }
    const double *qt = attn_q(a, t, h);
    for (int j = 0; j < n_keys; j++) {
        size_t kv = attn_kv_offset(a, j0 + j, h);
        double ds = p[j] * (dp[j] - p_dot_dp) * scale;
        for (int d = 0; d < hd; d++) {
            if (dv) dv[kv + d] += p[j] * dout[d];
            if (dk) dk[kv + d] += ds * qt[d];
            if (dq) dq[((size_t)t * a->n_heads + h) * hd + d] += ds * a->k[kv + d];
        }
    }
}

int vks_ref_attention_backward(const double *q, const double *k, const double *v, const uint32_t *start, int T,
                               int n_heads, int n_kv_heads, int head_dim, const double *row_max,
                               const double *row_sum, const double *dout, double *dq, double *dk, double *dv) {
    attn_shape a = {q, k, v, start, T, n_heads, n_kv_heads, head_dim};
    if (!attn_shape_ok(&a) || !row_max || !row_sum || !dout) return bad_args("vks_ref_attention_backward");
    double *p = malloc(2 * (size_t)T * sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_attention_backward: out of memory for %d scores", T);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < n_heads; h++) {
            size_t th = (size_t)t * n_heads + h;
            attn_backward_row(&a, t, h, row_max[th], row_sum[th], dout + th * head_dim, p, p + T, dq, dk, dv);
        }
    free(p);
    return VKS_OK;
}

/* ---- SwiGLU ---- */

static double sigmoid(double a) { return 1.0 / (1.0 + exp(-a)); }

int vks_ref_swiglu_forward(const double *g, const double *u, size_t n, double *out) {
    if (!g || !u || !out) return bad_args("vks_ref_swiglu_forward");
    for (size_t i = 0; i < n; i++) out[i] = g[i] * sigmoid(g[i]) * u[i];
    return VKS_OK;
}

/* silu'(a) = s(a) (1 + a (1 - s(a))) with s the sigmoid. */
int vks_ref_swiglu_backward(const double *g, const double *u, size_t n, const double *dout, double *dg, double *du) {
    if (!g || !u || !dout) return bad_args("vks_ref_swiglu_backward");
    for (size_t i = 0; i < n; i++) {
        double s = sigmoid(g[i]);
        if (dg) dg[i] += dout[i] * u[i] * s * (1.0 + g[i] * (1.0 - s));
        if (du) du[i] += dout[i] * g[i] * s;
    }
    return VKS_OK;
}

/* ---- token log-probability ---- */

/* log(sum_j exp(row[j])), shifted by the maximum. */
static double log_sum_exp(const double *row, int V) {
    double max = -INFINITY, sum = 0.0;
    for (int j = 0; j < V; j++) max = fmax(max, row[j]);
    for (int j = 0; j < V; j++) sum += exp(row[j] - max);
    return max + log(sum);
}

int vks_ref_token_logprob_forward(const double *logits, int R, int V, const uint32_t *target, double *logp) {
    if (!logits || !target || !logp || R <= 0 || V <= 0 || !tokens_in_range(target, R, V))
        return bad_args("vks_ref_token_logprob_forward");
    for (int r = 0; r < R; r++) {
        const double *row = logits + (size_t)r * V;
        logp[r] = row[target[r]] - log_sum_exp(row, V);
    }
    return VKS_OK;
}

int vks_ref_token_logprob_backward(const double *logits, int R, int V, const uint32_t *target, const double *dlogp,
                                   double *dlogits) {
    if (!logits || !target || !dlogp || !dlogits || R <= 0 || V <= 0 || !tokens_in_range(target, R, V))
        return bad_args("vks_ref_token_logprob_backward");
    for (int r = 0; r < R; r++) {
        const double *row = logits + (size_t)r * V;
        double lse = log_sum_exp(row, V);
        double *drow = dlogits + (size_t)r * V;
        for (int j = 0; j < V; j++) drow[j] -= dlogp[r] * exp(row[j] - lse);
        drow[target[r]] += dlogp[r];
    }
    return VKS_OK;
}

/* ---- entropy of each row ---- */

/* H = -sum_j p_j log p_j with log p_j = row[j] - lse. */
static double row_entropy(const double *row, int V, double lse) {
    double h = 0.0;
    for (int j = 0; j < V; j++) {
        double logp = row[j] - lse;
        h -= exp(logp) * logp;
    }
    return h;
}

int vks_ref_token_entropy_forward(const double *logits, int R, int V, double *entropy) {
    if (!logits || !entropy || R <= 0 || V <= 0) return bad_args("vks_ref_token_entropy_forward");
    for (int r = 0; r < R; r++) {
        const double *row = logits + (size_t)r * V;
        entropy[r] = row_entropy(row, V, log_sum_exp(row, V));
    }
    return VKS_OK;
}

/* dH/dz_j = -p_j (log p_j + H): from H = -sum_k p_k log p_k and
 * dp_k/dz_j = p_k (delta_kj - p_j), using sum_k dp_k/dz_j = 0. */
int vks_ref_token_entropy_backward(const double *logits, int R, int V, const double *dentropy, double *dlogits) {
    if (!logits || !dentropy || !dlogits || R <= 0 || V <= 0) return bad_args("vks_ref_token_entropy_backward");
    for (int r = 0; r < R; r++) {
        const double *row = logits + (size_t)r * V;
        double lse = log_sum_exp(row, V), h = row_entropy(row, V, lse);
        double *drow = dlogits + (size_t)r * V;
        for (int j = 0; j < V; j++) {
            double logp = row[j] - lse;
            drow[j] -= dentropy[r] * exp(logp) * (logp + h);
        }
    }
    return VKS_OK;
}

/* ---- the RL loss ---- */

static double clamp(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* One live row's policy term w P and its d/dlogp w dP, before the budget:
 * x = logp - logp_old, a the advantage, w the weight (vks_ref_grad.h defines
 * P for each type). */
typedef struct { double term, grad; uint32_t flags; } policy_row;

static policy_row clipped_ratio(double rho, double a, double w, double cap, double lo, double hi) {
    policy_row p = {0};
    double c = fmin(rho, cap), dc = rho < cap ? rho : 0.0;
    double plain = -c * a, clipped = -clamp(c, lo, hi) * a;
    if (rho >= cap) p.flags |= VKS_GRPO_CAPPED;
    if (clipped > plain) p.flags |= VKS_GRPO_CLIPPED;
    p.term = w * fmax(plain, clipped);
    p.grad = (p.flags & VKS_GRPO_CLIPPED) ? 0.0 : -w * a * dc;
    return p;
}

/* decoupled_ppo: rho = pi / pi_prox under PPO's clip, times the behaviour
 * weight pi_prox / pi_behav (logp_old is the behaviour's), a constant of the
 * gradient, set to 0 (or the cap) above behav_cap. */
static policy_row decoupled(const vks_grpo_loss_params *h, double logp, double logp_behav, double logp_prox, double a,
                            double w) {
    double b = exp(logp_prox - logp_behav);
    bool over = b > h->behav_cap;
    double c = over ? (h->behav_truncate ? h->behav_cap : 0.0) : b;
    policy_row p = clipped_ratio(exp(logp - logp_prox), a, w * c, INFINITY, 1.0 - h->eps, 1.0 + h->eps);
    if (over) p.flags |= VKS_GRPO_CLIPPED;
    return p;
}

/* aux: gspo's sequence log-ratio for this row, decoupled_ppo's proximal
 * log-probability (unused by the others). */
static policy_row policy_term(const vks_grpo_loss_params *h, double logp, double logp_old, double aux, double a,
                              double w) {
    double x = logp - logp_old, rho = exp(x);
    switch (h->type) {
    case VKS_LOSS_DECOUPLED_PPO: return decoupled(h, logp, logp_old, aux, a, w);
    case VKS_LOSS_GSPO: return clipped_ratio(exp(aux), a, w, INFINITY, 1.0 - h->eps_low, 1.0 + h->eps_high);
    case VKS_LOSS_INTELLECT2: return clipped_ratio(rho, a, w, h->delta, 1.0 - h->eps, 1.0 + h->eps);
    case VKS_LOSS_DAPO: return clipped_ratio(rho, a, w, INFINITY, 1.0 - h->eps_low, 1.0 + h->eps_high);
    case VKS_LOSS_CISPO: { /* c is a constant of the gradient (stop-gradient) */
        double c = clamp(rho, 1.0 - h->eps_low, 1.0 + h->eps_high);
        return (policy_row){w * (-c * a * logp), w * (-c * a), c != rho ? VKS_GRPO_CLIPPED : 0u};
    }
    default: { /* dppo_kl, ipo: the mask is a constant of the gradient */
        double dp = exp(logp) - exp(logp_old);
        bool high = dp > h->mask_high, low = dp < -h->mask_low;
        bool masked = h->type == VKS_LOSS_IPO ? high || low : a > 0.0 ? high : low;
        double pg = masked ? 0.0 : -h->adv_tau * a * rho;
        return (policy_row){w * (pg + h->kl_tau * x * x), w * (pg + 2.0 * h->kl_tau * x), masked ? VKS_GRPO_CLIPPED : 0u};
    }
    }
}

/* The loss over R rows; aux: gspo's sequence log-ratio of each row, or
 * decoupled_ppo's proximal log-probability (NULL for the other types). */
static void loss_rows_of(const double *logp, const double *logp_old, const double *advantage, const double *ref_logp,
                         const double *weight, const double *aux, int R, const vks_grpo_loss_params *h,
                         double *loss_rows, uint32_t *flags, double *loss, double *dlogp) {
    double total = 0.0;
    for (int r = 0; r < R; r++) {
        double w = weight ? weight[r] : 1.0, term = 0.0, grad = 0.0;
        uint32_t f = 0;
        if (w != 0.0) {
            policy_row p = policy_term(h, logp[r], logp_old[r], aux ? aux[r] : 0.0, advantage[r], w);
            f = p.flags;
            term = p.term / h->token_budget;
            grad = p.grad / h->token_budget;
            if (h->kl_beta != 0.0) {
                double x = ref_logp[r] - logp[r], e = exp(x);
                term += w * h->kl_beta * (e - x - 1.0) / h->token_budget;
                grad += w * h->kl_beta * (1.0 - e) / h->token_budget;
            }
        }
        if (loss_rows) loss_rows[r] = term;
        if (flags) flags[r] = f;
        if (dlogp) dlogp[r] += grad;
        total += term;
    }
    if (loss) *loss = total;
}

int vks_ref_grpo_loss(const double *logp, const double *logp_old, const double *advantage, const double *ref_logp,
                      const double *weight, int R, const vks_grpo_loss_params *h, double *loss_rows, uint32_t *flags,
                      double *loss, double *dlogp) {
    if (!logp || !logp_old || !advantage || R <= 0 || !vks_grpo_loss_params_ok(h, NULL, 0) ||
        h->type == VKS_LOSS_GSPO || (h->kl_beta != 0.0 && !ref_logp))
        return bad_args("vks_ref_grpo_loss");
    /* decoupled_ppo: pi_prox is the weights the step starts from, logp itself */
    const double *prox = h->type == VKS_LOSS_DECOUPLED_PPO ? logp : NULL;
    loss_rows_of(logp, logp_old, advantage, ref_logp, weight, prox, R, h, loss_rows, flags, loss, dlogp);
    return VKS_OK;
}

/* Checks the sequences tile [0, R) and, given advantages, that each one's
 * live rows (weight != 0) share one weight and one advantage. */
static bool sequences_ok(const double *weight, const double *advantage, const int *seq_lens, int n_seqs, int R) {
    if (!seq_lens || n_seqs < 1) return false;
    int row = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seq_lens[s] < 1 || seq_lens[s] > R - row) return false;
        int first = -1;
        for (int k = row; advantage && k < row + seq_lens[s]; k++) {
            if (weight && weight[k] == 0.0) continue;
            if (first < 0) first = k;
            else if ((weight && weight[k] != weight[first]) || advantage[k] != advantage[first]) return false;
        }
        row += seq_lens[s];
    }
    return row == R;
}

int vks_ref_sequence_log_ratio(const double *logp, const double *logp_old, const double *weight, const int *seq_lens,
                               int n_seqs, int R, double *seq_x) {
    if (!logp || !logp_old || !seq_x || R <= 0 || !sequences_ok(weight, NULL, seq_lens, n_seqs, R))
        return bad_args("vks_ref_sequence_log_ratio");
    for (int s = 0, row = 0; s < n_seqs; row += seq_lens[s++]) {
        double sum = 0.0;
        int live = 0;
        for (int k = row; k < row + seq_lens[s]; k++)
            if (!weight || weight[k] != 0.0) sum += logp[k] - logp_old[k], live++;
        for (int k = row; k < row + seq_lens[s]; k++) seq_x[k] = live ? sum / live : 0.0;
    }
    return VKS_OK;
}

int vks_ref_gspo_loss(const double *logp, const double *logp_old, const double *advantage, const double *ref_logp,
                      const double *weight, const int *seq_lens, int n_seqs, int R, const vks_grpo_loss_params *h,
                      double *loss_rows, uint32_t *flags, double *loss, double *dlogp) {
    if (!logp || !logp_old || !advantage || R <= 0 || !vks_grpo_loss_params_ok(h, NULL, 0) ||
        h->type != VKS_LOSS_GSPO || (h->kl_beta != 0.0 && !ref_logp) || !sequences_ok(weight, advantage, seq_lens, n_seqs, R))
        return bad_args("vks_ref_gspo_loss");
    double *seq_x = malloc(sizeof *seq_x * (size_t)R);
    if (!seq_x) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_gspo_loss: out of memory");
    int rc = vks_ref_sequence_log_ratio(logp, logp_old, weight, seq_lens, n_seqs, R, seq_x);
    if (!rc) loss_rows_of(logp, logp_old, advantage, ref_logp, weight, seq_x, R, h, loss_rows, flags, loss, dlogp);
    free(seq_x);
    return rc;
}

int vks_ref_decoupled_ppo_loss(const double *logp, const double *logp_prox, const double *logp_behav,
                               const double *advantage, const double *ref_logp, const double *weight, int R,
                               const vks_grpo_loss_params *h, double *loss_rows, uint32_t *flags, double *loss,
                               double *dlogp) {
    if (!logp || !logp_prox || !logp_behav || !advantage || R <= 0 || !vks_grpo_loss_params_ok(h, NULL, 0) ||
        h->type != VKS_LOSS_DECOUPLED_PPO || (h->kl_beta != 0.0 && !ref_logp))
        return bad_args("vks_ref_decoupled_ppo_loss");
    loss_rows_of(logp, logp_behav, advantage, ref_logp, weight, logp_prox, R, h, loss_rows, flags, loss, dlogp);
    return VKS_OK;
}

/* ---- optimizer ---- */

int vks_ref_adamw_step(double *params, const double *grads, double *m, double *v, size_t n,
                       const vks_adamw_params *h, int t, double grad_scale) {
    if (!params || !grads || !m || !v || !h || t < 1 || !(h->beta1 >= 0.0 && h->beta1 < 1.0) ||
        !(h->beta2 >= 0.0 && h->beta2 < 1.0) || !(h->eps > 0.0))
        return bad_args("vks_ref_adamw_step");
    double correct1 = 1.0 - pow(h->beta1, t), correct2 = 1.0 - pow(h->beta2, t);
    for (size_t i = 0; i < n; i++) {
        double g = grad_scale * grads[i];
        m[i] = h->beta1 * m[i] + (1.0 - h->beta1) * g;
        v[i] = h->beta2 * v[i] + (1.0 - h->beta2) * g * g;
        double m_hat = m[i] / correct1, v_hat = v[i] / correct2;
        params[i] -= h->lr * (m_hat / (sqrt(v_hat) + h->eps) + h->weight_decay * params[i]);
    }
    return VKS_OK;
}

double vks_ref_sum_squares(const double *g, size_t n) {
    double s = 0.0;
    for (size_t i = 0; g && i < n; i++) s += g[i] * g[i];
    return s;
}

double vks_ref_clip_scale(double norm, double max_norm) {
    if (!(max_norm > 0.0)) return 1.0;
    double scale = max_norm / (norm + 1e-6);
    return scale < 1.0 ? scale : 1.0;
}

double vks_ref_lr_at(const vks_lr_schedule *s, int t) {
    if (!s || t < 1) return 0.0;
    if (t <= s->warmup_steps) return s->lr * t / s->warmup_steps;
    if (!s->cosine) return s->lr;
    if (t >= s->total_steps) return s->min_lr;
    double progress = (double)(t - s->warmup_steps) / (double)(s->total_steps - s->warmup_steps);
    return s->min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (s->lr - s->min_lr);
}
