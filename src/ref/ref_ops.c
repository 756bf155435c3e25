/* ref_ops.c: plain C reference of every op (see vks_ref.h). Accumulates in
 * double and stores float. Written for clarity, not speed. */
#include "vkswarm/vks_ref.h"

#include <math.h>
#include <stdlib.h>

void vks_ref_embed(const float *table, int V, int D, const uint32_t *tokens, int R, float *out) {
    if (!table || !tokens || !out || V <= 0 || D <= 0 || R <= 0) return;
    for (int r = 0; r < R; r++) {
        float *dst = out + (size_t)r * (size_t)D;
        if (tokens[r] >= (uint32_t)V) { /* out of range: zeros rather than a wild read */
            for (int d = 0; d < D; d++) dst[d] = 0.0f;
            continue;
        }
        const float *src = table + (size_t)tokens[r] * (size_t)D;
        for (int d = 0; d < D; d++) dst[d] = src[d];
    }
}

void vks_ref_rmsnorm(const float *x, const float *w, int R, int D, float eps, float *out) {
    if (!x || !w || !out || R <= 0 || D <= 0) return;
    for (int r = 0; r < R; r++) {
        const float *row = x + (size_t)r * (size_t)D;
        double sum_sq = 0.0;
        for (int d = 0; d < D; d++) sum_sq += (double)row[d] * (double)row[d];
        double inv = 1.0 / sqrt(sum_sq / D + (double)eps);
        float *dst = out + (size_t)r * (size_t)D;
        for (int d = 0; d < D; d++) dst[d] = (float)((double)row[d] * inv * (double)w[d]);
    }
}

/* Four partial sums: breaks the add dependency chain (about 4x faster) and
 * in double the order does not matter at f32 output precision. */
static double dot_f64(const float *a, const float *b, int n) {
    double acc[4] = {0.0, 0.0, 0.0, 0.0};
    int i = 0;
    for (; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++) acc[j] += (double)a[i + j] * (double)b[i + j];
    for (; i < n; i++) acc[0] += (double)a[i] * (double)b[i];
    return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

void vks_ref_matmul(const float *x, const float *W, int M, int N, int K, float *y) {
    if (!x || !W || !y || M <= 0 || N <= 0 || K <= 0) return;
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * (size_t)K;
        float *yr = y + (size_t)m * (size_t)N;
        for (int n = 0; n < N; n++) yr[n] = (float)dot_f64(xr, W + (size_t)n * (size_t)K, K);
    }
}

void vks_ref_matmul_swiglu(const float *x, const float *Wg, const float *Wu, int M, int N, int K, float *y) {
    if (!x || !Wg || !Wu || !y || M <= 0 || N <= 0 || K <= 0) return;
    for (int m = 0; m < M; m++) {
        const float *xr = x + (size_t)m * (size_t)K;
        for (int n = 0; n < N; n++) {
            double g = dot_f64(xr, Wg + (size_t)n * (size_t)K, K), u = dot_f64(xr, Wu + (size_t)n * (size_t)K, K);
            y[(size_t)m * (size_t)N + n] = (float)(g / (1.0 + exp(-g)) * u);
        }
    }
}

/* Rotates one head in place; element pairs depend on the mode. */
static void rope_head(float *head, uint32_t pos, int head_dim, const double *freqs, int mode) {
    int half = head_dim / 2;
    for (int i = 0; i < half; i++) {
        double angle = (double)pos * freqs[i];
        double c = cos(angle), s = sin(angle);
        int i0 = mode == VKS_ROPE_HALF ? i : 2 * i;
        int i1 = mode == VKS_ROPE_HALF ? i + half : 2 * i + 1;
        double v0 = head[i0], v1 = head[i1];
        head[i0] = (float)(v0 * c - v1 * s);
        head[i1] = (float)(v0 * s + v1 * c);
    }
}

void vks_ref_rope(float *x, const uint32_t *pos, int R, int stride, int col0, int n_heads,
                  int head_dim, const double *freqs, int mode) {
    if (!x || !pos || !freqs || R <= 0 || n_heads <= 0 || head_dim <= 1 || col0 < 0) return;
    if ((int64_t)stride < (int64_t)col0 + (int64_t)n_heads * head_dim) return; /* heads overrun a row */
    if (mode != VKS_ROPE_ADJACENT && mode != VKS_ROPE_HALF) return;
    for (int r = 0; r < R; r++) {
        float *row = x + (size_t)r * (size_t)stride + (size_t)col0;
        for (int h = 0; h < n_heads; h++)
            rope_head(row + (size_t)h * (size_t)head_dim, pos[r], head_dim, freqs, mode);
    }
}

/* One query head against keys 0..last of one KV head. `scores` holds last+1
 * doubles, `acc` head_dim doubles. Softmax is computed in double. */
static void attend_head(const float *qh, const float *kbase, const float *vbase, size_t kv_stride,
                        uint32_t last, int head_dim, double *scores, double *acc, float *out) {
    double scale = 1.0 / sqrt((double)head_dim);
    double max_score = -INFINITY;
    for (uint32_t t = 0; t <= last; t++) {
        scores[t] = dot_f64(qh, kbase + (size_t)t * kv_stride, head_dim) * scale;
        if (scores[t] > max_score) max_score = scores[t];
    }
    double total = 0.0;
    for (uint32_t t = 0; t <= last; t++) {
        scores[t] = exp(scores[t] - max_score);
        total += scores[t];
    }
    for (int j = 0; j < head_dim; j++) acc[j] = 0.0;
    for (uint32_t t = 0; t <= last; t++) {
        const float *vt = vbase + (size_t)t * kv_stride;
        double w = scores[t] / total;
        for (int j = 0; j < head_dim; j++) acc[j] += w * (double)vt[j];
    }
    for (int j = 0; j < head_dim; j++) out[j] = (float)acc[j];
}

static bool attention_args_ok(const float *q, const float *kcache, const float *vcache,
                              const uint32_t *slot, const uint32_t *pos, int R, int n_heads,
                              int n_kv_heads, int head_dim, int seq_len, const float *out) {
    if (!q || !kcache || !vcache || !slot || !pos || !out) return false;
    if (R <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0 || seq_len <= 0) return false;
    if (n_heads % n_kv_heads != 0) return false;
    for (int r = 0; r < R; r++)
        if (pos[r] >= (uint32_t)seq_len) return false;
    return true;
}

/* On invalid arguments or allocation failure the output (when given) is NaN,
 * so a caller comparing against the reference notices. */
void vks_ref_attention(const float *q, const float *kcache, const float *vcache,
                       const uint32_t *slot, const uint32_t *pos, int R, int n_heads,
                       int n_kv_heads, int head_dim, int seq_len, float *out) {
    size_t q_dim = (size_t)n_heads * (size_t)(head_dim > 0 ? head_dim : 0);
    if (!attention_args_ok(q, kcache, vcache, slot, pos, R, n_heads, n_kv_heads, head_dim,
                           seq_len, out)) {
        if (out && R > 0)
            for (size_t i = 0; i < (size_t)R * q_dim; i++) out[i] = NAN;
        return;
    }
    size_t kv_dim = (size_t)n_kv_heads * (size_t)head_dim;
    int group = n_heads / n_kv_heads;
    double *scores = malloc(((size_t)seq_len + (size_t)head_dim) * sizeof *scores);
    if (!scores) {
        for (size_t i = 0; i < (size_t)R * q_dim; i++) out[i] = NAN;
        return;
    }
    double *acc = scores + seq_len;
    for (int r = 0; r < R; r++) {
        size_t slot_base = (size_t)slot[r] * (size_t)seq_len * kv_dim;
        for (int h = 0; h < n_heads; h++) {
            size_t kv_off = slot_base + (size_t)(h / group) * (size_t)head_dim;
            size_t q_off = (size_t)r * q_dim + (size_t)h * (size_t)head_dim;
            attend_head(q + q_off, kcache + kv_off, vcache + kv_off, kv_dim, pos[r], head_dim,
                        scores, acc, out + q_off);
        }
    }
    free(scores);
}

void vks_ref_swiglu(const float *g, const float *u, size_t n, float *out) {
    if (!g || !u || !out) return;
    for (size_t i = 0; i < n; i++) {
        double a = g[i];
        out[i] = (float)(a / (1.0 + exp(-a)) * (double)u[i]);
    }
}

void vks_ref_bias_add(float *x, const float *bias, int R, int D) {
    if (!x || !bias) return;
    for (int r = 0; r < R; r++)
        for (int j = 0; j < D; j++) x[(size_t)r * D + j] = (float)((double)x[(size_t)r * D + j] + (double)bias[j]);
}

void vks_ref_add(float *x, const float *y, size_t n) {
    if (!x || !y) return;
    for (size_t i = 0; i < n; i++) x[i] = (float)((double)x[i] + (double)y[i]);
}
