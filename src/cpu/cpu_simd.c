/* cpu_simd.c: the element-wise steps of the CPU forward (softmax, SwiGLU,
 * RMSNorm) with AVX2+FMA when the CPU has them (8 lanes; checked once at run
 * time), plain C otherwise. The vector exp is the Cephes polynomial (within
 * 2 ulp of expf on the ranges used here); norms keep their double sums. */
#include "cpu/cpu_internal.h"

#include <math.h>
#include <stdatomic.h>

static void softmax_c(float *v, int n) {
    float max_v = -INFINITY, total = 0.0f;
    for (int i = 0; i < n; i++) max_v = v[i] > max_v ? v[i] : max_v;
    for (int i = 0; i < n; i++) total += (v[i] = expf(v[i] - max_v));
    float inv = 1.0f / total;
    for (int i = 0; i < n; i++) v[i] *= inv;
}

static void silu_mul_c(float *g, const float *u, size_t n) {
    for (size_t i = 0; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

static double sum_squares_c(const float *x, int n) {
    double s = 0.0;
    for (int i = 0; i < n; i++) s += (double)x[i] * (double)x[i];
    return s;
}

static void scale_rows_c(const float *x, const float *w, int n, double inv, float *y) {
    for (int i = 0; i < n; i++) y[i] = (float)((double)x[i] * inv * (double)w[i]);
}

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,fma")))

/* exp(x) on 8 lanes: x = n ln2 + r, |r| <= ln2/2, e^r by Cephes' degree-5
 * polynomial, 2^n through the exponent bits. Inputs are clamped to
 * [-87.3, 88.0] (results of 1.2e-38 and 1.6e38 at the ends; NaN stays NaN). */
AVX2 static __m256 exp8(__m256 x) {
    x = _mm256_max_ps(_mm256_set1_ps(-87.33654f), _mm256_min_ps(_mm256_set1_ps(88.0f), x));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

AVX2 static float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

AVX2 static float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}

/* Lanes i < n (0..8) of a tail. */
AVX2 static __m256i tail_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

AVX2 static void softmax_avx2(float *v, int n) {
    __m256 mx = _mm256_set1_ps(-INFINITY);
    int i = 0;
    for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(v + i));
    float max_v = hmax8(mx);
    for (int k = i; k < n; k++) max_v = v[k] > max_v ? v[k] : max_v;
    __m256 shift = _mm256_set1_ps(max_v), sum = _mm256_setzero_ps();
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), shift));
        _mm256_storeu_ps(v + i, e);
        sum = _mm256_add_ps(sum, e);
    }
    if (i < n) {
        __m256i m = tail_mask(n - i);
        __m256 e = _mm256_and_ps(exp8(_mm256_sub_ps(_mm256_maskload_ps(v + i, m), shift)), _mm256_castsi256_ps(m));
        _mm256_maskstore_ps(v + i, m, e);
        sum = _mm256_add_ps(sum, e);
    }
    __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
    for (i = 0; i + 8 <= n; i += 8) _mm256_storeu_ps(v + i, _mm256_mul_ps(_mm256_loadu_ps(v + i), inv));
    for (; i < n; i++) v[i] *= _mm256_cvtss_f32(inv);
}

AVX2 static void silu_mul_avx2(float *g, const float *u, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 x = _mm256_loadu_ps(g + i);
        __m256 d = _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x)));
        _mm256_storeu_ps(g + i, _mm256_mul_ps(_mm256_div_ps(x, d), _mm256_loadu_ps(u + i)));
    }
    silu_mul_c(g + i, u + i, n - i);
}

AVX2 static double sum_squares_avx2(const float *x, int n) {
    __m256d a = _mm256_setzero_pd(), b = _mm256_setzero_pd();
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256d lo = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), hi = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
        a = _mm256_fmadd_pd(lo, lo, a);
        b = _mm256_fmadd_pd(hi, hi, b);
    }
    double lanes[4];
    _mm256_storeu_pd(lanes, _mm256_add_pd(a, b));
    return (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]) + sum_squares_c(x + i, n - i);
}

AVX2 static void scale_rows_avx2(const float *x, const float *w, int n, double inv, float *y) {
    __m256d s = _mm256_set1_pd(inv);
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d v = _mm256_mul_pd(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + i)), s), _mm256_cvtps_pd(_mm_loadu_ps(w + i)));
        _mm_storeu_ps(y + i, _mm256_cvtpd_ps(v));
    }
    scale_rows_c(x + i, w + i, n - i, inv, y + i);
}

/* AVX2 (CPUID 7: EBX bit 5), FMA (1: ECX bit 12), OS-saved YMM state. */
static bool detect_avx2(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & (1u << 12)) || !(c & (1u << 27))) return false;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6u) != 6u) return false;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 5));
}

static bool have_avx2(void) {
    static atomic_int known; /* 0: not asked yet, 1: no, 2: yes */
    int k = atomic_load_explicit(&known, memory_order_relaxed);
    if (k == 0) atomic_store_explicit(&known, k = detect_avx2() ? 2 : 1, memory_order_relaxed);
    return k == 2;
}
#else
static bool have_avx2(void) { return false; }
#define softmax_avx2 softmax_c
#define silu_mul_avx2 silu_mul_c
#define sum_squares_avx2 sum_squares_c
#define scale_rows_avx2 scale_rows_c
#endif

void vks_cpu_softmax(float *v, int n) {
    if (n <= 0) return;
    if (have_avx2()) softmax_avx2(v, n);
    else softmax_c(v, n);
}

void vks_cpu_silu_mul(float *g, const float *u, size_t n) {
    if (have_avx2()) silu_mul_avx2(g, u, n);
    else silu_mul_c(g, u, n);
}

void vks_cpu_rmsnorm_row(const float *x, const float *w, int n, float eps, float *y) {
    double sum_sq = have_avx2() ? sum_squares_avx2(x, n) : sum_squares_c(x, n);
    double inv = 1.0 / sqrt(sum_sq / (double)n + (double)eps);
    if (have_avx2()) scale_rows_avx2(x, w, n, inv, y);
    else scale_rows_c(x, w, n, inv, y);
}
