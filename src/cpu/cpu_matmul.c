/* cpu_matmul.c: weight products through OpenBLAS cblas_sgemm. f32 weights
 * are used in place; every other dtype is dequantized a panel of rows at a
 * time (on the context's threads) into one reused f32 buffer, and the panel's
 * product is written straight into its columns of y (ldc = W->rows). */
#include "cpu/cpu_internal.h"
#include "vkswarm/vks_quant.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <time.h>

void cpu_blas_threads(int threads) { openblas_set_num_threads(threads); }

void cpu_convert_rows(const vks_tensor *t, int64_t row, int64_t count, float *dst) {
    uint64_t row_bytes = 0;
    vks_dtype_row_bytes(t->dtype, (uint64_t)t->cols, &row_bytes); /* validated by vks_model_check_tensors */
    const unsigned char *src = (const unsigned char *)t->data + (size_t)row * (size_t)row_bytes;
    vks_dequantize(t->dtype, src, dst, (size_t)count * (size_t)t->cols);
}

typedef struct {
    const vks_tensor *W;
    int64_t row0;
    float *dst;
} panel_job;

static void convert_panel_rows(void *ctx, int begin, int end) {
    panel_job *j = ctx;
    cpu_convert_rows(j->W, j->row0 + begin, end - begin, j->dst + (size_t)begin * (size_t)j->W->cols);
}

static void sgemm_xwt(const float *x, const float *w, int M, int N, int K, float *y, int ldy) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1.0f, x, K, w, K, 0.0f, y, ldy);
}

void cpu_matmul(vks_cpu *c, const vks_tensor *W, const float *x, int M, float *y) {
    int N = (int)W->rows, K = (int)W->cols;
    if (W->dtype == VKS_DTYPE_F32) {
        sgemm_xwt(x, W->data, M, N, K, y, N);
        return;
    }
    for (int r0 = 0; r0 < N; r0 += c->panel_rows) {
        int nr = N - r0 < c->panel_rows ? N - r0 : c->panel_rows;
        panel_job j = {.W = W, .row0 = r0, .dst = c->panel};
        cpu_parallel_for(c->threads, nr, 8, convert_panel_rows, &j);
        sgemm_xwt(x, c->panel, M, nr, K, y + r0, N);
    }
}

static double seconds_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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
    cpu_blas_threads(vks_cpu_thread_count(threads));
    sgemm_xwt(x, w, M, N, K, y, N); /* warm-up */
    int reps = 0;
    double t0 = seconds_now(), t = t0;
    while (t - t0 < seconds || reps < 2) {
        sgemm_xwt(x, w, M, N, K, y, N);
        reps++;
        t = seconds_now();
    }
    *gflops = 2.0 * M * (double)N * K * reps / (t - t0) / 1e9;
    free(x), free(w), free(y);
    return VKS_OK;
}
