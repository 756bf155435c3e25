/* vks_cpu_matmul.c: weight products through OpenBLAS cblas_sgemm. The weight's
 * rows are split into items fixed by the product's shape, which the context's
 * threads take in turn (see split_items); f32 weights are used in place, every
 * other dtype is dequantized into the worker's reused f32 panel; each item's
 * one-thread sgemm writes
 * straight into its columns of y (ldc = W->rows). OpenBLAS's own threads stay
 * off: its idle threads spin in sched_yield while conversion and the
 * non-GEMM steps run (measured: on 2 cores f16/q8_0 ran at half the f32
 * rate, mostly in the scheduler; a whole-matrix threaded sgemm per product
 * measured below these one-thread shares, BENCHMARKS.md). */
#include "cpu/cpu_internal.h"
#include "vkswarm/vks_quant.h"

#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

void vks_cpu_blas_threads(int threads) { openblas_set_num_threads(threads); }

void vks_cpu_blas_info(char *buf, size_t size) {
    if (buf && size) snprintf(buf, size, "%s; kernels %s", openblas_get_config(), openblas_get_corename());
}

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

enum {
    PANEL_MAX_FLOATS = 1 << 21, /* 8 MiB of converted rows per thread */
    MIN_CALL_MACS = 1 << 22,    /* multiply-adds of an sgemm call of a split product */
    ITEM_ROWS = 512,            /* weight rows of an sgemm call of a split product... */
    ITEM_ROWS_LEAST = 256,      /* ...or of each half of one split in two */
    ITEMS_MOST = 64,            /* items of a product, unless the panel needs more */
};

typedef struct {
    const vks_cpu *c;
    const vks_tensor *W;
    const float *x;
    int M;
    int64_t items; /* item i: weight rows [i N / items, (i + 1) N / items) */
    float *y;
} matmul_job;

static void matmul_items(void *ctx, int begin, int end, int worker) {
    matmul_job *j = ctx;
    int64_t N = j->W->rows, K = j->W->cols;
    for (int i = begin; i < end; i++) {
        int64_t r0 = i * N / j->items, r1 = (i + 1) * N / j->items;
        const float *w = (const float *)j->W->data + (size_t)(r0 * K);
        if (j->W->dtype != VKS_DTYPE_F32) {
            float *panel = j->c->panel + (size_t)worker * j->c->panel_floats;
            vks_cpu_convert_rows(j->W, r0, r1 - r0, panel);
            w = panel;
        }
        sgemm_xwt(j->x, w, j->M, (int)(r1 - r0), (int)K, j->y + r0, (int)N);
    }
}

/* Items of nearly equal rows a product is split into: a function of the
 * product's shape (and vks_cpu_options.panel_rows), never of the thread
 * count, so any number of threads makes the same sgemm calls and gets the
 * same bits. OpenBLAS's kernels sum a row's K in an order that depends on
 * where the row falls in the call and on the call's size (measured on its
 * Haswell/Zen and SkylakeX kernels: no split point keeps every bit), so
 * splitting the rows per thread made a verifier's result depend on its core
 * count. Each call packs all M activation rows again (256-row items took
 * 0-10% more CPU time than one item per thread on 2 cores, BENCHMARKS), so
 * items have ITEM_ROWS rows or more (a product of 512-1023 rows splits into
 * two halves of at least ITEM_ROWS_LEAST) and MIN_CALL_MACS multiply-adds
 * (smaller products run whole); their count is a power of two up to
 * ITEMS_MOST, so 1, 2, 4, 8... threads share them evenly, or more where
 * converted rows must fit the panel. */
static int64_t split_items(const vks_cpu *c, const vks_tensor *W, int M) {
    int64_t N = W->rows, K = W->cols, most = N;
    if (c->item_rows > 0 && most > c->item_rows) most = c->item_rows;
    if (W->dtype != VKS_DTYPE_F32 && most * K > (int64_t)c->panel_floats) most = (int64_t)c->panel_floats / K;
    int64_t needed = (N + most - 1) / most;
    int64_t least = (MIN_CALL_MACS + (int64_t)M * K - 1) / ((int64_t)M * K);
    int64_t target = least > ITEM_ROWS ? least : ITEM_ROWS, items = 1;
    while (items * 2 <= ITEMS_MOST && items * 2 * target <= N) items *= 2;
    if (items == 1 && N >= 2 * ITEM_ROWS_LEAST && N >= 2 * least) items = 2; /* two threads share it */
    return items > needed ? items : needed;
}

size_t vks_cpu_panel_floats(const vks_model *m, int item_rows) {
    size_t need = 0;
    for (int l = 0; l <= m->cfg.n_layers; l++) {
        const vks_layer_weights *w = l < m->cfg.n_layers ? &m->layers[l] : NULL;
        const vks_tensor *all[] = {w ? &w->wq : &m->classifier, w ? &w->wk : NULL, w ? &w->wv : NULL, w ? &w->wo : NULL,
                                   w ? &w->w1 : NULL, w ? &w->w2 : NULL, w ? &w->w3 : NULL};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
            const vks_tensor *t = all[i];
            if (!t || t->dtype == VKS_DTYPE_F32) continue;
            size_t rows = item_rows > 0 && item_rows < t->rows ? (size_t)item_rows : (size_t)t->rows;
            size_t floats = rows * (size_t)t->cols, cap = PANEL_MAX_FLOATS > t->cols ? PANEL_MAX_FLOATS : (size_t)t->cols;
            floats = floats < cap ? floats : cap;
            need = floats > need ? floats : need;
        }
    }
    return need;
}

void vks_cpu_matmul(vks_cpu *c, const vks_tensor *W, const float *x, int M, float *y) {
    if (M <= 0) return;
    matmul_job j = {.c = c, .W = W, .x = x, .M = M, .y = y, .items = split_items(c, W, M)};
    vks_cpu_parallel_for(c->threads, (int)j.items, 1, matmul_items, &j);
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
