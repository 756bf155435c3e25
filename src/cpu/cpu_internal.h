/* cpu_internal.h: private parts of the fast CPU forward (src/cpu). */
#ifndef VKS_CPU_INTERNAL_H
#define VKS_CPU_INTERNAL_H
#include "vkswarm/vks_cpu.h"

struct vks_cpu {
    const vks_model *m;
    int threads;
    int item_rows;  /* most weight rows per sgemm (vks_cpu_options.panel_rows); 0: no limit */
    float *panel;   /* per worker: panel_floats of converted weight rows (NULL: all f32) */
    size_t panel_floats;
    float *vec;   /* one converted norm or bias vector (widest row) */
    bool kv_f16;  /* vks_cpu_options.kv_f16 */
    const vks_lora_adapter *lora; /* or NULL (vks_cpu_set_lora) */
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
 * the weight's rows are split into items fixed by the product's shape, never
 * by the thread count (so the bits are the same on any number of threads);
 * each worker converts an item's rows into its own panel unless f32 and runs
 * one one-thread sgemm on them (the activations are packed once per item). */
void vks_cpu_matmul(vks_cpu *c, const vks_tensor *W, const float *x, int M, float *y);
/* Floats of panel each worker needs for m's products: its largest non-f32
 * weight (at most item_rows rows when > 0), at most 8 MiB (0: all f32). */
size_t vks_cpu_panel_floats(const vks_model *m, int item_rows);
/* Element-wise steps (cpu_simd.c: AVX2+FMA when the CPU has them). */
/* v[0..n) = softmax(v) in place. */
void vks_cpu_softmax(float *v, int n);
/* g[i] = silu(g[i]) * u[i]. */
void vks_cpu_silu_mul(float *g, const float *u, size_t n);
/* y = x / rms(x) * w over n values (the sum of squares in double). */
void vks_cpu_rmsnorm_row(const float *x, const float *w, int n, float eps, float *y);
/* Sets OpenBLAS's thread count (a process-wide setting; the forward uses 1). */
void vks_cpu_blas_threads(int threads);
#endif
