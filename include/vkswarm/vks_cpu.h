/* vks_cpu.h: the fast f32 CPU forward (src/cpu). The same layer-range forward
 * as the engine over many sequences (rows) at once: grouped-query attention,
 * both RoPE pairings, Qwen2 q/k/v biases and every weight type the engine
 * reads. Matrix products go through OpenBLAS cblas_sgemm (one BLAS thread
 * per call): a weight's rows are split among the context's pthreads, a share
 * each, and f16, bf16, Q8_0, Q4_0, Q4_K and Q6_K rows are dequantized into
 * each thread's reused f32 panel (no f32 copy of the model). Norms, RoPE and
 * attention run on the same threads. The float64 reference
 * (vks_ref_forward.h) stays the oracle. */
#ifndef VKS_CPU_H
#define VKS_CPU_H
#include "vks_model.h"
#include "vks_lora.h"

typedef struct vks_cpu vks_cpu;

typedef struct {
    int threads;    /* <= 0: every online core */
    int panel_rows; /* most weight rows per sgemm call; <= 0: items by the product's shape (converted: <= ~8 MiB);
                       the bits depend on this and the shape, never on threads */
    bool kv_f16;    /* K and V rounded to half (vks_f32_to_f16) before attention: the replay of an
                       engine with the f16 KV cache (vks_engine_options.kv_f16) */
} vks_cpu_options;

/* Thread count a vks_cpu_options.threads value means (<= 0: online cores). */
int vks_cpu_thread_count(int threads);
/* opt may be NULL (defaults). The model must outlive the context. */
int vks_cpu_create(const vks_model *m, const vks_cpu_options *opt, vks_cpu **out);
void vks_cpu_destroy(vks_cpu *c);
/* A LoRA adapter for the forwards that follow (NULL: none): each targeted
 * product adds scale B (A x), unmerged (two sgemms). The adapter must
 * outlive its use; VKS_ERR_FORMAT when made for another model's shape. */
int vks_cpu_set_lora(vks_cpu *c, const vks_lora_adapter *a);
/* Runs n_seqs sequences, each from position 0: ids holds seq_lens[0] ids of
 * the first, then the second's, ... For the rows out_rows[0..n_out) of that
 * concatenation (NULL: every row, n_out = the total) writes logits
 * [n_out, vocab] and, when hidden != NULL, the final-norm rows [n_out, dim]. */
int vks_cpu_prefill(vks_cpu *c, const int32_t *ids, const int *seq_lens, int n_seqs, const int *out_rows, int n_out,
                    float *logits, float *hidden);
/* The same, also writing the residual-stream taps of the output rows (taps
 * may be NULL or have n == 0: none). */
int vks_cpu_prefill_taps(vks_cpu *c, const int32_t *ids, const int *seq_lens, int n_seqs, const int *out_rows,
                         int n_out, float *logits, float *hidden, const vks_layer_taps *taps);
/* Runs fn over items 0..n-1 on the context's threads (one item at a time). */
void vks_cpu_parallel(const vks_cpu *c, int n, void (*fn)(void *ctx, int begin, int end), void *ctx);
/* cblas_sgemm's rate in GFLOP/s on y[M,N] = x[M,K] W[N,K]^T (as the forward
 * calls it) with `threads` BLAS threads, repeated for about `seconds`. */
int vks_cpu_sgemm_rate(int M, int N, int K, int threads, double seconds, double *gflops);
/* The BLAS build and the kernels it picked for this CPU (OpenBLAS's
 * openblas_get_config and openblas_get_corename: "Haswell", "SkylakeX", "Zen", ...),
 * as "CONFIG; kernels CORE" in buf. */
void vks_cpu_blas_info(char *buf, size_t size);
#endif
