/* vks_cpu_matmul.c: weight products through OpenBLAS cblas_sgemm. The weight's
 * rows are split among the context's threads, panel_rows at a time; f32
 * weights are used in place, every other dtype is dequantized into the
 * worker's reused f32 panel; each panel's one-thread sgemm writes straight
 * into its columns of y (ldc = W->rows). OpenBLAS's own threads stay off:
 * its idle threads spin in sched_yield while conversion runs (measured: on 2
 * cores f16/q8_0 ran at half the f32 rate, mostly in the scheduler). */
#include "cpu/cpu_internal.h"
#include "vkswarm/vks_quant.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

void vks_cpu_blas_threads(int threads) { openblas_set_num_threads(threads); }

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
/* f16 -> f32 with the F16C instruction, 8 at a time (exact, as vks_f16_to_f32). */
__attribute__((target("avx,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(src + i))));
    for (; i < n; i++) dst[i] = vks_f16_to_f32(src[i]);
}

/* CPUID leaf 1, ECX: F16C (bit 29) and AVX (28) with OS-saved YMM state
 * (OSXSAVE, bit 27, and XCR0 bits 1-2). clang 14's __builtin_cpu_supports
 * does not know "f16c", so ask the CPU directly. */
static bool have_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
    if (!(c & (1u << 29)) || !(c & (1u << 28)) || !(c & (1u << 27))) return false;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return (lo & 6u) == 6u;
}
#else
static void f16_to_f32_f16c(const uint16_t *src, float *dst, size_t n) { vks_dequantize(VKS_DTYPE_F16, src, dst, n); }
static bool have_f16c(void) { return false; }
#endif

void vks_cpu_convert_rows(const vks_tensor *t, int64_t row, int64_t count, float *dst) {
    uint64_t row_bytes = 0;
    vks_dtype_row_bytes(t->dtype, (uint64_t)t->cols, &row_bytes); /* validated by vks_model_check_tensors */
    const unsigned char *src = (const unsigned char *)t->data + (size_t)row * (size_t)row_bytes;
    size_t n = (size_t)count * (size_t)t->cols;
    if (t->dtype == VKS_DTYPE_F16 && have_f16c()) f16_to_f32_f16c((const uint16_t *)(const void *)src, dst, n);
    else vks_dequantize(t->dtype, src, dst, n);
}

static void sgemm_xwt(const float *x, const float *w, int M, int N, int K, float *y, int ldy) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, ldy);
}

typedef struct {
    const vks_cpu *c;
    const vks_tensor *W;
    const float *x;
    int M;
    float *y;
} matmul_job;

/* Weight rows [begin, end): converted into this worker's panel unless f32. */
static void matmul_rows(void *ctx, int begin, int end, int worker) {
    matmul_job *j = ctx;
    int N = (int)j->W->rows, K = (int)j->W->cols;
    const float *w = (const float *)j->W->data + (size_t)begin * (size_t)K;
    if (j->W->dtype != VKS_DTYPE_F32) {
        float *panel = j->c->panel + (size_t)worker * j->c->panel_floats;
        vks_cpu_convert_rows(j->W, begin, end - begin, panel);
        w = panel;
    }
    sgemm_xwt(j->x, w, j->M, end - begin, K, j->y + begin, N);
}

void vks_cpu_matmul(vks_cpu *c, const vks_tensor *W, const float *x, int M, float *y) {
    matmul_job j = {.c = c, .W = W, .x = x, .M = M, .y = y};
    int N = (int)W->rows, share = (N + c->threads - 1) / c->threads; /* every thread gets work */
    int rows = share < c->panel_rows ? (share < 16 && c->panel_rows > 16 ? 16 : share) : c->panel_rows;
    vks_cpu_parallel_for(c->threads, N, rows, matmul_rows, &j);
}

int vks_cpu_sgemm_rate(int M, int N, int K, int threads, double seconds, double *gflops) {
    if (M <= 0 || N <= 0 || K <= 0 || !gflops || !(seconds > 0) || M > (1 << 20) || N > (1 << 20) || K > (1 << 20))
        return vks_set_error(VKS_ERR_ARG, "vks_cpu_sgemm_rate: bad shape %dx%dx%d", M, N, K);
    float *x = calloc((size_t)M * (size_t)K, sizeof *x), *w = calloc((size_t)N * (size_t)K, sizeof *w);
    float *y = malloc((size_t)M * (size_t)N * sizeof *y);
    if (!x || !w || !y) {
        free(x), free(w), free(y);
        return vks_set_error(VKS_ERR_NOMEM, "vks_cpu_sgemm_rate: out of memory for %dx%dx%d", M, N, K);
    }
    for (size_t i = 0; i < (size_t)M * (size_t)K; i++) x[i] = (float)((i * 7) % 13) * 0.01f;
    for (size_t i = 0; i < (size_t)N * (size_t)K; i++) w[i] = (float)((i * 5) % 11) * 0.01f;
    vks_cpu_blas_threads(vks_cpu_thread_count(threads));
    sgemm_xwt(x, w, M, N, K, y, N); /* warm-up */
    int reps = 0;
    double t0 = vks_seconds_now(), t = t0;
    while (t - t0 < seconds || reps < 2) {
        sgemm_xwt(x, w, M, N, K, y, N);
        reps++;
        t = vks_seconds_now();
    }
    *gflops = 2.0 * M * (double)N * K * reps / (t - t0) / 1e9;
    free(x), free(w), free(y);
    return VKS_OK;
}
