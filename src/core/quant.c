/* quant.c: llama.cpp block formats on the CPU (the truth for the GPU
 * dequantizing kernels).
 *
 * Dequantizers compute exactly what llama.cpp's dequantize_row_q8_0 / q4_0 /
 * q4_K / q6_K compute (same operations in the same order, so bit-identical
 * floats). Quantizers follow llama.cpp's reference ones: quantize_row_q8_0_ref,
 * quantize_row_q4_0_ref and quantize_row_q4_K_ref (with the make_qkx2_quants
 * min/scale search). Q6_K uses a simpler quantizer than llama.cpp's
 * make_qx_quants search: each 16-element sub-block gets scale max/-32, the
 * sub-block scales are stored as int8 relative to the largest one. It is a
 * correct Q6_K encoder (dequantizes within a few percent), meant for tests.
 */
#include "vkswarm/vks_quant.h"

#include <math.h>
#include <string.h>

#define QK 32    /* Q8_0, Q4_0 */
#define QK_K 256 /* Q4_K, Q6_K */

size_t vks_dtype_block_elems(vks_dtype t) {
    switch (t) {
    case VKS_DTYPE_F32: case VKS_DTYPE_F16: case VKS_DTYPE_BF16: return 1;
    case VKS_DTYPE_Q8_0: case VKS_DTYPE_Q4_0: return QK;
    case VKS_DTYPE_Q4_K: case VKS_DTYPE_Q6_K: return QK_K;
    default: return 0;
    }
}

size_t vks_dtype_block_bytes(vks_dtype t) {
    switch (t) {
    case VKS_DTYPE_F32: return 4;
    case VKS_DTYPE_F16: case VKS_DTYPE_BF16: return 2;
    case VKS_DTYPE_Q8_0: return 2 + QK;
    case VKS_DTYPE_Q4_0: return 2 + QK / 2;
    case VKS_DTYPE_Q4_K: return 2 + 2 + 12 + QK_K / 2;
    case VKS_DTYPE_Q6_K: return QK_K / 2 + QK_K / 4 + QK_K / 16 + 2;
    default: return 0;
    }
}

bool vks_dtype_row_bytes(vks_dtype t, uint64_t cols, uint64_t *bytes) {
    uint64_t be = vks_dtype_block_elems(t), bb = vks_dtype_block_bytes(t);
    if (be == 0 || cols % be != 0) return false;
    return !__builtin_mul_overflow(cols / be, bb, bytes);
}

/* ---- small helpers ---- */

static float load_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return vks_f16_to_f32(h);
}

static void store_f16(uint8_t *p, float f) {
    uint16_t h = vks_f32_to_f16(f);
    memcpy(p, &h, 2);
}

/* llama.cpp's nearest_int: round to nearest, ties to even, for |f| < 2^22. */
static int nearest_int(float f) {
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* ---- dequantize ---- */

static void dequant_q8_0(const uint8_t *b, float *y) {
    float d = load_f16(b);
    const int8_t *qs = (const int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) y[j] = qs[j] * d;
}

static void dequant_q4_0(const uint8_t *b, float *y) {
    float d = load_f16(b);
    const uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (qs[j] & 0x0F) - 8, x1 = (qs[j] >> 4) - 8;
        y[j] = x0 * d;
        y[j + QK / 2] = x1 * d;
    }
}

/* 6-bit scale and min j (0..7) of a Q4_K block, as llama.cpp get_scale_min_k4. */
static void scale_min_k4(int j, const uint8_t *q, uint8_t *sc, uint8_t *m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static void dequant_q4_k(const uint8_t *b, float *y) {
    float d = load_f16(b), min = load_f16(b + 2);
    const uint8_t *scales = b + 4, *q = b + 16;
    int is = 0;
    for (int j = 0; j < QK_K; j += 64) {
        uint8_t sc, m;
        scale_min_k4(is + 0, scales, &sc, &m);
        float d1 = d * sc, m1 = min * m;
        scale_min_k4(is + 1, scales, &sc, &m);
        float d2 = d * sc, m2 = min * m;
        for (int l = 0; l < 32; l++) *y++ = d1 * (q[l] & 0xF) - m1;
        for (int l = 0; l < 32; l++) *y++ = d2 * (q[l] >> 4) - m2;
        q += 32;
        is += 2;
    }
}

static void dequant_q6_k(const uint8_t *b, float *y) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = load_f16(b + 208);
    for (int n = 0; n < QK_K; n += 128) {
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = (int8_t)((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = (int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = (int8_t)((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = (int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * sc[is + 0] * q1;
            y[l + 32] = d * sc[is + 2] * q2;
            y[l + 64] = d * sc[is + 4] * q3;
            y[l + 96] = d * sc[is + 6] * q4;
        }
        y += 128;
        ql += 64;
        qh += 32;
        sc += 8;
    }
}

static void dequant_plain(vks_dtype t, const uint8_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (t == VKS_DTYPE_F32) {
            memcpy(&dst[i], src + 4 * i, 4);
        } else {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = t == VKS_DTYPE_F16 ? vks_f16_to_f32(h) : vks_bf16_to_f32(h);
        }
    }
}

void vks_dequantize(vks_dtype t, const void *src, float *dst, size_t n) {
    size_t be = vks_dtype_block_elems(t), bb = vks_dtype_block_bytes(t);
    if (!src || !dst || be == 0 || n % be != 0) return;
    const uint8_t *b = src;
    if (be == 1) {
        dequant_plain(t, b, dst, n);
        return;
    }
    for (size_t i = 0; i < n / be; i++, b += bb, dst += be) {
        switch (t) {
        case VKS_DTYPE_Q8_0: dequant_q8_0(b, dst); break;
        case VKS_DTYPE_Q4_0: dequant_q4_0(b, dst); break;
        case VKS_DTYPE_Q4_K: dequant_q4_k(b, dst); break;
        case VKS_DTYPE_Q6_K: dequant_q6_k(b, dst); break;
        default: return;
        }
    }
}

/* ---- quantize: Q8_0, Q4_0 (llama.cpp reference) ---- */

static void quant_q8_0(const float *x, uint8_t *b) {
    float amax = 0.0f;
    for (int j = 0; j < QK; j++) amax = fmaxf(amax, fabsf(x[j]));
    float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    int8_t *qs = (int8_t *)(b + 2);
    for (int j = 0; j < QK; j++) qs[j] = (int8_t)roundf(x[j] * id);
}

static void quant_q4_0(const float *x, uint8_t *b) {
    float amax = 0.0f, max = 0.0f; /* max keeps the sign of the largest magnitude */
    for (int j = 0; j < QK; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    float d = max / -8.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    store_f16(b, d);
    uint8_t *qs = b + 2;
    for (int j = 0; j < QK / 2; j++) {
        int x0 = (int8_t)(x[j] * id + 8.5f), x1 = (int8_t)(x[j + QK / 2] * id + 8.5f);
        x0 = x0 < 15 ? x0 : 15;
        x1 = x1 < 15 ? x1 : 15;
        qs[j] = (uint8_t)(x0 | (x1 << 4));
    }
}

/* ---- quantize: Q4_K (llama.cpp quantize_row_q4_K_ref) ---- */

typedef struct { float sum_w, sum_x, min, max; } qkx2_stats;

static qkx2_stats qkx2_gather(int n, const float *x, const float *w) {
    qkx2_stats s = {w[0], w[0] * x[0], x[0], x[0]};
    for (int i = 1; i < n; i++) {
        if (x[i] < s.min) s.min = x[i];
        if (x[i] > s.max) s.max = x[i];
        s.sum_w += w[i];
        s.sum_x += w[i] * x[i];
    }
    if (s.min > 0) s.min = 0;
    return s;
}

/* Quantizes x to levels 0..nmax with `iscale` from `min`; weighted squared error
 * of scale*L + min against x. */
static float qkx2_levels(int n, int nmax, const float *x, const float *w, float iscale, float min,
                         float scale, uint8_t *L) {
    float err = 0;
    for (int i = 0; i < n; i++) {
        L[i] = (uint8_t)clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
        float diff = scale * L[i] + min - x[i];
        err += w[i] * diff * diff;
    }
    return err;
}

/* make_qkx2_quants(n, nmax, x, w, L, &the_min, Laux, rmin=-1, rdelta=0.1,
 * nstep=20, use_mad=false): searches scale and min minimizing the weighted
 * squared error. Returns the scale; *the_min = -min. */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *w, uint8_t *L,
                              float *the_min, float rmin, float rdelta, int nstep) {
    qkx2_stats s = qkx2_gather(n, x, w);
    float min = s.min, max = s.max;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.0f;
    }
    float iscale = nmax / (max - min), scale = 1 / iscale;
    float best = qkx2_levels(n, nmax, x, w, iscale, min, scale, L);
    uint8_t Laux[QK_K];
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = clampi(nearest_int(iscale * (x[i] - min)), 0, nmax);
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = s.sum_w * sum_l2 - sum_l * sum_l;
        if (D <= 0) continue;
        float this_scale = (s.sum_w * sum_xl - s.sum_x * sum_l) / D;
        float this_min = (sum_l2 * s.sum_x - sum_l * sum_xl) / D;
        if (this_min > 0) {
            this_min = 0;
            this_scale = sum_xl / sum_l2;
        }
        float err = 0;
        for (int i = 0; i < n; i++) {
            float diff = this_scale * Laux[i] + this_min - x[i];
            err += w[i] * diff * diff;
        }
        if (err < best) {
            memcpy(L, Laux, (size_t)n);
            best = err;
            scale = this_scale;
            min = this_min;
        }
    }
    *the_min = -min;
    return scale;
}

/* Packs 6-bit scale ls and min lm of sub-block j into the 12 scale bytes. */
static void pack_scale_min_k4(int j, uint8_t ls, uint8_t lm, uint8_t *q) {
    if (j < 4) {
        q[j] = ls;
        q[j + 4] = lm;
    } else {
        q[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
        q[j - 4] |= (uint8_t)((ls >> 4) << 6);
        q[j] |= (uint8_t)((lm >> 4) << 6);
    }
}

static void quant_q4_k(const float *x, uint8_t *b) {
    uint8_t L[QK_K];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; j++) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++) sum_x2 += x[32 * j + l] * x[32 * j + l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, 15, x + 32 * j, weights, L + 32 * j, &mins[j], -1.0f, 0.1f, 20);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.0f / max_scale : 0.0f;
    float inv_min = max_min > 0 ? 63.0f / max_min : 0.0f;
    uint8_t *sc = b + 4;
    memset(sc, 0, 12);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t ls = (uint8_t)nearest_int(inv_scale * scales[j]);
        uint8_t lm = (uint8_t)nearest_int(inv_min * mins[j]);
        pack_scale_min_k4(j, ls < 63 ? ls : 63, lm < 63 ? lm : 63, sc);
    }
    store_f16(b, max_scale / 63.0f);
    store_f16(b + 2, max_min / 63.0f);
    for (int j = 0; j < QK_K / 32; j++) {
        uint8_t s, m;
        scale_min_k4(j, sc, &s, &m);
        const float d = load_f16(b) * s;
        if (d == 0.0f) continue;
        const float dm = load_f16(b + 2) * m;
        for (int ii = 0; ii < 32; ii++)
            L[32 * j + ii] = (uint8_t)clampi(nearest_int((x[32 * j + ii] + dm) / d), 0, 15);
    }
    uint8_t *q = b + 16;
    for (int j = 0; j < QK_K; j += 64, q += 32)
        for (int l = 0; l < 32; l++) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

/* ---- quantize: Q6_K (simple, see the file comment) ---- */

static void q6_k_pack(const uint8_t *L, uint8_t *ql, uint8_t *qh) {
    for (int j = 0; j < QK_K; j += 128, ql += 64, qh += 32) {
        for (int l = 0; l < 32; l++) {
            uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF;
            uint8_t q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                              ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
        }
    }
}

static void quant_q6_k(const float *x, uint8_t *b) {
    float sub[QK_K / 16], max_scale = 0, amax_scale = 0;
    for (int ib = 0; ib < QK_K / 16; ib++) {
        float amax = 0, max = 0;
        for (int l = 0; l < 16; l++) {
            float v = x[16 * ib + l];
            if (fabsf(v) > amax) {
                amax = fabsf(v);
                max = v;
            }
        }
        sub[ib] = max / -32.0f; /* the largest magnitude maps to level -32 */
        if (fabsf(sub[ib]) > amax_scale) {
            amax_scale = fabsf(sub[ib]);
            max_scale = sub[ib];
        }
    }
    uint8_t L[QK_K];
    int8_t *sc = (int8_t *)(b + 192);
    memset(L, 32, sizeof L); /* level 32 = value 0 */
    if (amax_scale == 0.0f) {
        memset(sc, 0, 16);
        store_f16(b + 208, 0.0f);
        q6_k_pack(L, b, b + 128);
        return;
    }
    float iscale = -128.0f / max_scale;
    store_f16(b + 208, 1.0f / iscale);
    float d = load_f16(b + 208);
    for (int ib = 0; ib < QK_K / 16; ib++) {
        sc[ib] = (int8_t)clampi(nearest_int(iscale * sub[ib]), -128, 127);
        float dl = d * sc[ib];
        if (dl == 0.0f) continue;
        for (int l = 0; l < 16; l++)
            L[16 * ib + l] = (uint8_t)(clampi(nearest_int(x[16 * ib + l] / dl), -32, 31) + 32);
    }
    q6_k_pack(L, b, b + 128);
}

static void quant_plain(vks_dtype t, const float *src, uint8_t *dst, size_t n) {
    if (t == VKS_DTYPE_F32) {
        memcpy(dst, src, n * 4);
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h = t == VKS_DTYPE_F16 ? vks_f32_to_f16(src[i]) : vks_f32_to_bf16(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

int vks_quantize(vks_dtype t, const float *src, void *dst, size_t n) {
    size_t be = vks_dtype_block_elems(t), bb = vks_dtype_block_bytes(t);
    if (be == 0) return vks_set_error(VKS_ERR_ARG, "vks_quantize: unknown dtype %d", (int)t);
    if (!src || !dst) return vks_set_error(VKS_ERR_ARG, "vks_quantize: NULL argument");
    if (n % be != 0)
        return vks_set_error(VKS_ERR_ARG, "vks_quantize: %zu elements is not a whole number of %s blocks (%zu)",
                             n, vks_dtype_name(t), be);
    uint8_t *b = dst;
    if (be == 1) {
        quant_plain(t, src, b, n);
        return VKS_OK;
    }
    for (size_t i = 0; i < n / be; i++, b += bb, src += be) {
        switch (t) {
        case VKS_DTYPE_Q8_0: quant_q8_0(src, b); break;
        case VKS_DTYPE_Q4_0: quant_q4_0(src, b); break;
        case VKS_DTYPE_Q4_K: quant_q4_k(src, b); break;
        case VKS_DTYPE_Q6_K: quant_q6_k(src, b); break;
        default: return vks_set_error(VKS_ERR_ARG, "vks_quantize: unsupported dtype %d", (int)t);
        }
    }
    return VKS_OK;
}
