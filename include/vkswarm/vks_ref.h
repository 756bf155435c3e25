/* vks_ref.h: plain C reference of every op. Accumulates in double; the truth
 * for tests and the CPU path for verification. Layouts match the shaders
 * (see shaders/README.md): row-major, rows = tokens. */
#ifndef VKS_REF_H
#define VKS_REF_H
#include "vks_common.h"


/* out[r, :] = table[tokens[r], :]  (table [V, D] f32) */
void vks_ref_embed(const float *table, int V, int D, const uint32_t *tokens, int R, float *out);
/* out[r, d] = x[r, d] / sqrt(mean(x[r,:]^2) + eps) * w[d] */
void vks_ref_rmsnorm(const float *x, const float *w, int R, int D, float eps, float *out);
/* y[m, n] = sum_k x[m, k] * W[n, k]   (x [M,K], W [N,K], y [M,N]) */
void vks_ref_matmul(const float *x, const float *W, int M, int N, int K, float *y);
/* In place on x[r, col0 + h*head_dim + j] for h < n_heads, row stride `stride`.
 * Angle = pos[r] * freqs[i] for pair i (freqs[head_dim/2]: vks_rope_freqs). */
void vks_ref_rope(float *x, const uint32_t *pos, int R, int stride, int col0, int n_heads,
                  int head_dim, const double *freqs, int mode);
/* Causal GQA attention over a KV cache laid out [n_slots, seq_len, kv_dim]
 * (kv_dim = n_kv_heads*head_dim). Row r attends to keys 0..pos[r] of slot[r].
 * q [R, n_heads*head_dim], out [R, n_heads*head_dim]. scale = 1/sqrt(head_dim). */
void vks_ref_attention(const float *q, const float *kcache, const float *vcache,
                       const uint32_t *slot, const uint32_t *pos, int R, int n_heads,
                       int n_kv_heads, int head_dim, int seq_len, float *out);
/* out[i] = silu(g[i]) * u[i], silu(a) = a / (1 + exp(-a)) */
void vks_ref_swiglu(const float *g, const float *u, size_t n, float *out);
/* y[m, n] = silu(g) * u with g = sum_k x[m, k] Wg[n, k], u = the same with Wu,
 * all in float64 (x [M,K], Wg and Wu [N,K], y [M,N]): vks_op_matmul_swiglu */
void vks_ref_matmul_swiglu(const float *x, const float *Wg, const float *Wu, int M, int N, int K, float *y);
/* x[i] += y[i] */
void vks_ref_add(float *x, const float *y, size_t n);
/* x[r, j] += bias[j] for r < R, j < D (x [R, D], bias [D]). */
void vks_ref_bias_add(float *x, const float *bias, int R, int D);

/* ---- sampling (see shaders/README.md "Sampling") ---- */
typedef struct {
    float temperature; /* <= 0: greedy */
    uint32_t top_k;    /* 0 or >= V: off */
    float top_p;       /* <= 0 or >= 1: off */
    uint64_t seed;
    uint32_t seq;      /* sequence index (prompt number), not batch slot */
    uint32_t pos;      /* position of the row whose logits are sampled */
} vks_sample_params;

/* The RNG (vks_philox_u32, vks_rng_uniform) is in vks_philox.h. Gumbel: -log(-log(u)). */
/* The sampler's Gumbel noise -log(-log(u)) in float, with -log(u) from a short
 * series when u is within 2^-6 of 1 (shaders/sample.comp computes the same). */
float vks_gumbel_from_uniform(float u);
/* Returns the sampled token. Greedy and all ties: lowest index wins. */
uint32_t vks_ref_sample(const float *logits, int V, const vks_sample_params *p);
/* Fills keep[V] (1 = token survives top-k/top-p) and z[V] = logits/T. Returns count kept. */
int vks_ref_sample_kept(const float *logits, int V, const vks_sample_params *p, uint8_t *keep, float *z);
/* What a verifier replays: *gap is the logit distance (temperature x Gumbel
 * score gap; greedy: logit gap) between the seeded draw and `token`, 0 when
 * `token` is the draw, +inf when nothing is kept; *outside is how far below the
 * top-k/top-p threshold `token` lies when it was cut, else 0. keep and z are
 * scratch of V entries, as for vks_ref_sample_kept. */
void vks_ref_sample_gap(const float *logits, int V, const vks_sample_params *p, int32_t token, uint8_t *keep, float *z,
                        double *gap, double *outside);

#endif
