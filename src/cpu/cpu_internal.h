/* cpu_internal.h: private parts of the fast CPU forward (src/cpu). */
#ifndef VKS_CPU_INTERNAL_H
#define VKS_CPU_INTERNAL_H
#include "vkswarm/vks_cpu.h"

struct vks_cpu {
    const vks_model *m;
    int threads;
    int panel_rows; /* weight rows per work item of a matrix product */
    float *panel;   /* per worker: panel_rows x widest matrix row, f32 */
    size_t panel_floats;
    float *vec;   /* one converted norm or bias vector (widest row) */
};

/* Work items [begin, end) of a parallel loop, run by worker 0..threads-1. */
typedef void (*cpu_task_fn)(void *ctx, int begin, int end, int worker);
/* Runs fn over items 0..n-1 on up to `threads` threads (the caller is worker
 * 0), handing out `grain` items at a time. Runs everything on the caller
 * when threads cannot be started. */
void vks_cpu_parallel_for(int threads, int n, int grain, cpu_task_fn fn, void *ctx);

/* Converts `count` rows from `row` of t into dst as f32. */
void vks_cpu_convert_rows(const vks_tensor *t, int64_t row, int64_t count, float *dst);
/* y[M, W->rows] = x[M, W->cols] W^T for a weight of any dtype (ldy = W->rows):
 * each worker converts panel_rows weight rows into its own panel and runs a
 * one-thread sgemm on them, so conversion and products never wait on each other. */
void vks_cpu_matmul(vks_cpu *c, const vks_tensor *W, const float *x, int M, float *y);
/* Sets OpenBLAS's thread count (a process-wide setting; the forward uses 1). */
void vks_cpu_blas_threads(int threads);
#endif
