/* vks_verifier.h: verifier ranks in an MPI job. The dispatcher (usually rank
 * 0) hands batches of rollout samples to verifier ranks, which check each
 * batch with one batched prefill (vks_verify_batch) and send back verdicts.
 * Messages are checked like every other MPI input: sizes against headers,
 * counts against limits, samples through the rollout parser. */
#ifndef VKS_VERIFIER_H
#define VKS_VERIFIER_H
#include <mpi.h>
#include "vkswarm/vks_rollout.h"
#include "vkswarm/vks_toploc.h"

/* Verifies n samples into out[n]; returns non-zero only on an internal failure. */
typedef int (*vks_verify_fn)(void *ctx, const vks_rollout_sample *samples, int n, vks_verdict *out);

/* Dispatcher: sends batches of up to `batch` samples to ranks `first_verifier`
 * .. size-1 as they become free, collects the verdicts in sample order. With
 * no verifier rank it verifies locally with fn. A verifier silent for
 * timeout_s is reported by rank. Stops the verifiers at the end. */
int vks_verifier_dispatch(MPI_Comm comm, int first_verifier, const vks_rollout_sample *samples, int n, int batch,
                          double timeout_s, vks_verify_fn fn, void *ctx, vks_verdict *out);
/* Verifier rank: serves batches from `dispatcher` until told to stop. */
int vks_verifier_serve(MPI_Comm comm, int dispatcher, int max_batch, vks_verify_fn fn, void *ctx);
#endif
