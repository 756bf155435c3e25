/* vks_verifier.h: verifier ranks in an MPI job. The dispatcher (usually rank
 * 0) hands batches of rollout samples to verifier ranks, which check each
 * batch with one batched prefill (vks_verify_batch) and send back verdicts.
 * Messages are checked like every other MPI input: sizes against headers,
 * counts against limits, samples through the rollout parser. */
#ifndef VKS_VERIFIER_H
#define VKS_VERIFIER_H
#include <mpi.h>
#include "vks_rollout.h"
#include "vks_toploc.h"

/* Verifies n samples into out[n]; returns non-zero only on an internal failure. */
typedef int (*vks_verify_fn)(void *ctx, const vks_rollout_sample *samples, int n, vks_verdict *out);

/* What became of the verifier ranks during a dispatch. */
typedef struct {
    int n_lost;        /* verifiers that went silent for the timeout (their batches went to others) */
    int first_lost;    /* the first of them, -1 when none */
    bool all_stopped;  /* every verifier answered the final stop: MPI_Finalize will not wait forever */
} vks_dispatch_report;

/* Dispatcher: sends batches of up to `batch` samples to ranks `first_verifier`
 * .. size-1 as they become free, collects the verdicts in sample order. With
 * no verifier rank it verifies locally with fn. Every wait is bounded by
 * timeout_s: a verifier silent that long (no heartbeat, no answer) is lost,
 * its batch goes to another verifier, or is verified here (fn on a thread)
 * when none is left; whatever it sends later is discarded, so no verdict
 * counts twice. Stops the verifiers at the end. When the report says not
 * every verifier stopped, the caller must end the job with vks_mpi_abort
 * (MPI_Finalize would wait for the silent rank). */
int vks_verifier_dispatch(MPI_Comm comm, int first_verifier, const vks_rollout_sample *samples, int n, int batch,
                          double timeout_s, vks_verify_fn fn, void *ctx, vks_verdict *out, vks_dispatch_report *report);
/* Verifier rank: serves batches from `dispatcher` until told to stop, sending
 * heartbeats while it verifies (fn runs on a thread). A dispatcher silent for
 * timeout_s is an error (VKS_ERR_TIMEOUT) naming it; the caller ends the job. */
int vks_verifier_serve(MPI_Comm comm, int dispatcher, int max_batch, double timeout_s, vks_verify_fn fn, void *ctx);

/* Start-up: the dispatcher sends a few settings bytes (at most 4096; buf must
 * stay valid until the job ends) to every verifier; a verifier waits for them
 * at most timeout_s (VKS_ERR_TIMEOUT naming the dispatcher). */
int vks_verifier_send_settings(MPI_Comm comm, int first_verifier, const void *buf, size_t bytes);
int vks_verifier_recv_settings(MPI_Comm comm, int dispatcher, void *buf, size_t bytes, double timeout_s);
#endif
