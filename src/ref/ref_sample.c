/* ref_sample.c: the reference sampler (its RNG: src/core/philox.c).
 *
 * Sampling semantics (the GLSL sampler mirrors this exactly):
 *   1. temperature <= 0: greedy. token = argmax(logits), lowest index on ties.
 *      vks_ref_sample_kept reports z = logits and keeps only that token.
 *   2. Otherwise z_i = logits_i / temperature (float division).
 *   3. top_k with 0 < top_k < V: tau_k = the k-th largest z (counting
 *      duplicates). Keep z_i >= tau_k, so every tie at the threshold is kept.
 *   4. top_p with 0 < top_p < 1: over the kept tokens, in double,
 *      p_i = exp(z_i - zmax) / sum_kept exp(z_j - zmax) (sum in index order).
 *      Walk the distinct kept z values from the largest down, adding the
 *      probability of all tokens equal to each value (in index order) to a
 *      running double sum; tau_p is the first value at which that sum is
 *      >= top_p (the smallest kept z if rounding never gets there). Keep
 *      z_i >= tau_p: the minimal set of top values reaching top_p.
 *   5. token = argmax over kept i of z_i + g_i (float add), lowest index on ties,
 *      with g_i = vks_gumbel_from_uniform(vks_rng_uniform(vks_philox_u32(seed, seq, pos, i)))
 *      in float (-log(-log(u)), with -log(u) from a series near u = 1). This is the Gumbel-max trick: a draw from softmax(z) over the
 *      kept set, reproducible per (seed, seq, pos) and independent of batching.
 * NaN z values are never kept by top-k/top-p thresholds and never win an argmax
 * (if every value is NaN the result is token 0).
 *
 * The uniform uses 23 bits, ((u32 >> 9) + 0.5) / 2^23: every value is exact
 * in float and strictly inside (0, 1). (With 24 bits, 2^24 - 0.5 rounds up to
 * 2^24 and u = 1 gives a Gumbel of +inf.) The GLSL sampler does the same.
 */
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_philox.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- sampler ---- */

/* Index of the largest value (NaN never wins; lowest index on ties). */
static int argmax_first(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best] || (isnan(v[best]) && !isnan(v[i]))) best = i;
    return best;
}

/* Kept tokens in descending z, ties in ascending index: a stable LSD radix
 * sort (four 8-bit passes) over an order-preserving key, O(V) where qsort
 * with a comparator was most of a verifier's time on large vocabularies. */
typedef struct {
    uint32_t key; /* ascending key = descending z; -0 and +0 share one */
    int32_t i;
} ranked;

static uint32_t descending_key(float z) {
    uint32_t u;
    memcpy(&u, &z, sizeof u);
    if (u == 0x80000000u) u = 0;
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* ascending with z */
    return ~u;
}

/* Sorts the m kept entries of z (never NaN) into a; b is scratch of m. */
static ranked *rank_kept(const float *z, int n, const uint8_t *keep, ranked *a, ranked *b, int *m_out) {
    int m = 0;
    for (int i = 0; i < n; i++)
        if (keep[i]) a[m++] = (ranked){descending_key(z[i]), i};
    for (int shift = 0; shift < 32; shift += 8) {
        uint32_t count[257] = {0};
        for (int j = 0; j < m; j++) count[((a[j].key >> shift) & 255u) + 1]++;
        if (m == 0 || count[((a[0].key >> shift) & 255u) + 1] == (uint32_t)m) continue; /* one digit: order holds */
        for (int d = 0; d < 256; d++) count[d + 1] += count[d];
        for (int j = 0; j < m; j++) b[count[(a[j].key >> shift) & 255u]++] = a[j];
        ranked *t = a;
        a = b;
        b = t;
    }
    *m_out = m;
    return a;
}

/* Keeps z_i >= the k-th largest kept z (NaN is never kept). */
static void apply_top_k(const float *z, int n, uint32_t k, uint8_t *keep, ranked *a, ranked *b) {
    int m;
    const ranked *order = rank_kept(z, n, keep, a, b, &m);
    if (m == 0) return;
    float tau = z[order[(k < (uint32_t)m ? k : (uint32_t)m) - 1].i];
    for (int i = 0; i < n; i++) keep[i] = keep[i] && z[i] >= tau;
}

/* Keeps the minimal top set of kept z whose probability reaches top_p.
 * Walking the ranked tokens adds each distinct value's tokens in index
 * order, so the running sum is the one the rule in the header defines. */
static void apply_top_p(const float *z, int n, float top_p, uint8_t *keep, ranked *a, ranked *b) {
    int m;
    const ranked *order = rank_kept(z, n, keep, a, b, &m);
    if (m == 0) return;
    double zmax = z[order[0].i], total = 0.0;
    for (int i = 0; i < n; i++)
        if (keep[i]) total += exp((double)z[i] - zmax);
    float tau = z[order[m - 1].i];
    double cum = 0.0;
    for (int j = 0; j < m; j++) {
        cum += exp((double)z[order[j].i] - zmax) / total;
        if (cum >= (double)top_p) { /* the whole value's group is kept: z >= tau */
            tau = z[order[j].i];
            break;
        }
    }
    for (int i = 0; i < n; i++) keep[i] = keep[i] && z[i] >= tau;
}

static bool sample_args_ok(const float *logits, int V, const vks_sample_params *p) {
    return logits && p && V > 0;
}

int vks_ref_sample_kept(const float *logits, int V, const vks_sample_params *p, uint8_t *keep,
                        float *z) {
    if (!sample_args_ok(logits, V, p) || !keep || !z) return 0;
    if (!(p->temperature > 0.0f)) {
        memcpy(z, logits, (size_t)V * sizeof *z);
        memset(keep, 0, (size_t)V);
        keep[argmax_first(logits, V)] = 1;
        return 1;
    }
    for (int i = 0; i < V; i++) {
        z[i] = logits[i] / p->temperature;
        keep[i] = !isnan(z[i]);
    }
    bool use_k = p->top_k > 0 && p->top_k < (uint32_t)V;
    bool use_p = p->top_p > 0.0f && p->top_p < 1.0f;
    if (use_k || use_p) {
        ranked *scratch = malloc(2 * (size_t)V * sizeof *scratch);
        if (!scratch) return 0;
        if (use_k) apply_top_k(z, V, p->top_k, keep, scratch, scratch + V);
        if (use_p) apply_top_p(z, V, p->top_p, keep, scratch, scratch + V);
        free(scratch);
    }
    int count = 0;
    for (int i = 0; i < V; i++) count += keep[i];
    return count;
}

float vks_gumbel_from_uniform(float u) {
    /* -log(u) near u = 1 from its complement, which is exact for u >= 0.5: a GPU's
     * log only has an absolute error bound there (GLSL: 2^-21 on [0.5, 2]), a
     * relative error of several times -log(u) when u is within ~1e-6 of 1, which
     * moved Gumbel values by 0.05 and more on lavapipe (an honest rank's token was
     * rejected). The series' truncation error is below w^5 / 5 < 2e-10 w. */
    float w = 1.0f - u;
    float e = w < 0.015625f ? w * (1.0f + w * (0.5f + w * (0.33333334f + w * 0.25f))) : -logf(u);
    return -logf(e);
}

static float gumbel(const vks_sample_params *p, uint32_t idx) {
    return vks_gumbel_from_uniform(vks_rng_uniform(vks_philox_u32(p->seed, p->seq, p->pos, idx)));
}

/* The kept i with the largest z_i + g_i (float add), lowest index on ties;
 * -1 when none is kept. Its score goes to *best. */
static int gumbel_argmax(const float *z, const uint8_t *keep, int n, const vks_sample_params *p, float *best) {
    int arg = -1;
    uint32_t u[VKS_PHILOX_LANES];
    for (int i0 = 0; i0 < n; i0 += VKS_PHILOX_LANES) {
        int m = n - i0 < VKS_PHILOX_LANES ? n - i0 : VKS_PHILOX_LANES;
        if (!memchr(keep + i0, 1, (size_t)m)) continue;
        vks_philox_u32_lanes(p->seed, p->seq, p->pos, (uint32_t)i0, u);
        for (int l = 0; l < m; l++) {
            if (!keep[i0 + l]) continue;
            float score = z[i0 + l] + vks_gumbel_from_uniform(vks_rng_uniform(u[l]));
            if (arg < 0 || score > *best) arg = i0 + l, *best = score;
        }
    }
    return arg;
}

/* Returns the sampled token; 0 on invalid arguments or allocation failure. */
uint32_t vks_ref_sample(const float *logits, int V, const vks_sample_params *p) {
    if (!sample_args_ok(logits, V, p)) return 0;
    if (!(p->temperature > 0.0f)) return (uint32_t)argmax_first(logits, V);
    uint8_t *keep = malloc((size_t)V);
    float *z = malloc((size_t)V * sizeof *z);
    uint32_t best = 0;
    if (keep && z && vks_ref_sample_kept(logits, V, p, keep, z) > 0) {
        float best_score;
        int arg = gumbel_argmax(z, keep, V, p, &best_score);
        best = arg < 0 ? 0 : (uint32_t)arg;
    }
    free(keep);
    free(z);
    return best;
}

void vks_ref_sample_gap(const float *logits, int V, const vks_sample_params *p, int32_t token, uint8_t *keep, float *z,
                        double *gap, double *outside) {
    *outside = 0;
    if (!(p->temperature > 0.0f)) {
        *gap = (double)logits[argmax_first(logits, V)] - (double)logits[token];
        return;
    }
    if (vks_ref_sample_kept(logits, V, p, keep, z) <= 0) { /* nothing kept (all NaN) */
        *gap = INFINITY;
        return;
    }
    double tau = INFINITY;
    for (int i = 0; i < V; i++)
        if (keep[i] && z[i] < tau) tau = z[i];
    float best_score;
    double best = gumbel_argmax(z, keep, V, p, &best_score) < 0 ? -INFINITY : best_score;
    float own = z[token] + gumbel(p, (uint32_t)token);
    *gap = (best - (double)own) * (double)p->temperature;
    if (!keep[token]) *outside = (tau - (double)z[token]) * (double)p->temperature;
}
