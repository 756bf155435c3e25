/* toploc_proof.c: TOPLOC chunk proofs: top-k selection over bf16 rows,
 * building a proof and checking one against recomputed rows. */
#include "vkswarm/vks_toploc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { BF16_EXP_MASK = 0x7F80, BF16_MANT_MASK = 0x007F, BF16_NAN_ABOVE = 0x7F80 };

size_t vks_toploc_proof_size(size_t n_rows) {
    return (n_rows + VKS_TOPLOC_CHUNK_ROWS - 1) / VKS_TOPLOC_CHUNK_ROWS * VKS_TOPLOC_PROOF_BYTES;
}

void vks_toploc_thresholds_default(vks_toploc_thresholds *t) {
    if (!t) return;
    t->max_exp_mismatches = 38;
    t->max_mant_mean = 10.0;
    t->max_mant_median = 8.0;
}

/* Rank key of a bf16 value by magnitude: NaN 0, numbers (and inf) 1 + |bits|. */
static uint16_t magnitude_key(uint16_t v) {
    uint16_t a = v & 0x7FFF;
    return a > BF16_NAN_ABOVE ? 0 : (uint16_t)(a + 1);
}

/* Finds the largest key T with count(key >= T) >= k by a two-pass radix
 * select (high byte, then low byte). Sets *above = count(key > T). */
static uint16_t kth_key(const uint16_t *v, int n, int k, int *above) {
    int hist[256] = {0}, acc = 0, hi = 0;
    for (int i = 0; i < n; i++) hist[magnitude_key(v[i]) >> 8]++;
    for (hi = 255; hi > 0 && acc + hist[hi] < k; hi--) acc += hist[hi];
    int greater = acc; /* keys with a larger high byte */
    memset(hist, 0, sizeof hist);
    for (int i = 0; i < n; i++) {
        uint16_t key = magnitude_key(v[i]);
        if (key >> 8 == hi) hist[key & 0xFF]++;
    }
    int lo;
    for (lo = 255; lo > 0 && greater + hist[lo] < k; lo--) greater += hist[lo];
    *above = greater;
    return (uint16_t)(hi << 8 | lo);
}

int vks_toploc_topk(const uint16_t *v, int n, int k, uint32_t *idx) {
    if (!v || !idx || n <= 0 || k <= 0) return 0;
    if (k > n) k = n;
    int above;
    uint16_t t = kth_key(v, n, k, &above);
    int ties = k - above, taken = 0; /* ties at the threshold go to the lowest indices */
    for (int i = 0; i < n && taken < k; i++) {
        uint16_t key = magnitude_key(v[i]);
        if (key > t || (key == t && ties > 0)) {
            if (key == t) ties--;
            idx[taken++] = (uint32_t)i;
        }
    }
    return taken;
}

/* The largest m <= prime making idx mod m pairwise distinct; 0 if none. */
static uint32_t injective_modulus(const uint32_t *idx, int k) {
    static _Thread_local uint8_t seen[VKS_TOPLOC_PRIME + 1];
    uint32_t max_idx = 0;
    for (int i = 0; i < k; i++) max_idx = idx[i] > max_idx ? idx[i] : max_idx;
    if (max_idx < VKS_TOPLOC_PRIME) return VKS_TOPLOC_PRIME; /* already distinct */
    for (uint32_t m = VKS_TOPLOC_PRIME; m >= (uint32_t)k && m > 0; m--) {
        bool ok = true;
        int i;
        for (i = 0; i < k && ok; i++) {
            uint32_t x = idx[i] % m;
            ok = !seen[x];
            seen[x] = 1;
        }
        for (int j = 0; j < i; j++) seen[idx[j] % m] = 0;
        if (ok) return m;
    }
    return 0;
}

static bool chunk_args_ok(const void *rows, int n_rows, int dim) {
    return rows && n_rows >= 1 && n_rows <= VKS_TOPLOC_CHUNK_ROWS && dim >= 1 && dim <= (1 << 22);
}

int vks_toploc_chunk_proof_bf16(const uint16_t *rows, int n_rows, int dim, uint8_t out[VKS_TOPLOC_PROOF_BYTES]) {
    if (!chunk_args_ok(rows, n_rows, dim) || !out)
        return vks_set_error(VKS_ERR_ARG, "toploc: chunk of %d rows x %d (1..32 rows)", n_rows, dim);
    int n = n_rows * dim;
    uint32_t idx[VKS_TOPLOC_K], x[VKS_TOPLOC_K];
    uint16_t y[VKS_TOPLOC_K];
    int k = vks_toploc_topk(rows, n, VKS_TOPLOC_K, idx);
    vks_toploc_poly p = {.m = (uint16_t)injective_modulus(idx, k)};
    if (p.m == 0) return vks_set_error(VKS_ERR_FORMAT, "toploc: no injective modulus for this chunk");
    for (int i = 0; i < k; i++) {
        x[i] = idx[i] % p.m;
        y[i] = rows[idx[i]];
    }
    int rc = vks_toploc_interpolate(x, y, k, p.coeffs);
    if (rc == VKS_OK) vks_toploc_poly_write(&p, out);
    return rc;
}

static uint16_t *round_rows(const float *rows, size_t n) {
    uint16_t *b = malloc(n * sizeof *b);
    if (b)
        for (size_t i = 0; i < n; i++) b[i] = vks_f32_to_bf16(rows[i]);
    return b;
}

int vks_toploc_chunk_proof(const float *rows, int n_rows, int dim, uint8_t out[VKS_TOPLOC_PROOF_BYTES]) {
    if (!chunk_args_ok(rows, n_rows, dim) || !out)
        return vks_set_error(VKS_ERR_ARG, "toploc: chunk of %d rows x %d (1..32 rows)", n_rows, dim);
    uint16_t *b = round_rows(rows, (size_t)n_rows * (size_t)dim);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "toploc: out of host memory");
    int rc = vks_toploc_chunk_proof_bf16(b, n_rows, dim, out);
    free(b);
    return rc;
}

int vks_toploc_build(const float *rows, int n_rows, int dim, uint8_t *out) {
    if (!rows || !out || n_rows < 0 || dim < 1) return vks_set_error(VKS_ERR_ARG, "toploc: bad build arguments");
    for (int r0 = 0, c = 0; r0 < n_rows; r0 += VKS_TOPLOC_CHUNK_ROWS, c++) {
        int nr = n_rows - r0 < VKS_TOPLOC_CHUNK_ROWS ? n_rows - r0 : VKS_TOPLOC_CHUNK_ROWS;
        int rc = vks_toploc_chunk_proof(rows + (size_t)r0 * (size_t)dim, nr, dim,
                                        out + (size_t)c * VKS_TOPLOC_PROOF_BYTES);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* Median of small non-negative integers (mantissa differences < 128). */
static double median_small(const int *v, int n) {
    int hist[128] = {0};
    for (int i = 0; i < n; i++) hist[v[i]]++;
    int lo = -1, hi = -1, seen = 0; /* the (n-1)/2-th and n/2-th smallest */
    for (int b = 0; b < 128 && hi < 0; b++) {
        seen += hist[b];
        if (lo < 0 && seen > (n - 1) / 2) lo = b;
        if (seen > n / 2) hi = b;
    }
    return (lo + hi) / 2.0;
}

static void compare_values(const vks_toploc_poly *p, const uint16_t *own, const uint32_t *idx, int k,
                           vks_toploc_stats *st) {
    int mant[VKS_TOPLOC_K], n_mant = 0;
    long sum = 0;
    st->exp_mismatches = 0;
    st->n_compared = k;
    for (int i = 0; i < k; i++) {
        uint16_t claimed = (uint16_t)vks_toploc_poly_eval(p, idx[i]), mine = own[idx[i]];
        if ((claimed & BF16_EXP_MASK) != (mine & BF16_EXP_MASK)) {
            st->exp_mismatches++;
            continue;
        }
        int d = abs((int)(claimed & BF16_MANT_MASK) - (int)(mine & BF16_MANT_MASK));
        mant[n_mant++] = d;
        sum += d;
    }
    st->mant_mean = n_mant ? (double)sum / n_mant : 1e9;
    st->mant_median = n_mant ? median_small(mant, n_mant) : 1e9;
}

int vks_toploc_check_chunk(const uint8_t *proof, size_t len, const float *rows, int n_rows, int dim,
                           const vks_toploc_thresholds *th, bool *accepted, vks_toploc_stats *st,
                           char *why, size_t why_len) {
    if (!proof || !chunk_args_ok(rows, n_rows, dim) || !th || !accepted || !st || (!why && why_len))
        return vks_set_error(VKS_ERR_ARG, "toploc: bad check arguments");
    *accepted = false;
    memset(st, 0, sizeof *st);
    vks_toploc_poly p;
    if (vks_toploc_poly_parse(proof, len, &p)) {
        if (why_len) snprintf(why, why_len, "%s", vks_last_error());
        return VKS_OK;
    }
    size_t n = (size_t)n_rows * (size_t)dim;
    uint16_t *own = round_rows(rows, n);
    if (!own) return vks_set_error(VKS_ERR_NOMEM, "toploc: out of host memory");
    uint32_t idx[VKS_TOPLOC_K];
    int k = vks_toploc_topk(own, (int)n, VKS_TOPLOC_K, idx);
    compare_values(&p, own, idx, k, st);
    free(own);
    if (st->exp_mismatches > th->max_exp_mismatches) {
        if (why_len) snprintf(why, why_len, "exponent mismatches %d > %d", st->exp_mismatches, th->max_exp_mismatches);
    } else if (st->mant_mean > th->max_mant_mean) {
        if (why_len) snprintf(why, why_len, "mantissa error mean %.2f > %.2f", st->mant_mean, th->max_mant_mean);
    } else if (st->mant_median > th->max_mant_median) {
        if (why_len) snprintf(why, why_len, "mantissa error median %.1f > %.1f", st->mant_median, th->max_mant_median);
    } else {
        *accepted = true;
        if (why_len) why[0] = '\0';
    }
    return VKS_OK;
}
