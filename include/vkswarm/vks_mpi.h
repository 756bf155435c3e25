/* vks_mpi.h: the few MPI calls the command-line tools need (start, stop,
 * share a value), so that MPI is called only from mpi/. */
#ifndef VKS_MPI_H
#define VKS_MPI_H
#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>
#include <stddef.h>

/* How other threads use MPI: none exist (SINGLE); they exist but only the
 * main thread calls MPI (FUNNELED: GPU and verify workers); any thread calls
 * it (MULTIPLE: an RL pipeline group's leader runs the pipeline on its
 * generation thread while its main thread beats to the trainer). */
enum { VKS_MPI_THREADS_SINGLE = 0, VKS_MPI_THREADS_FUNNELED = 1, VKS_MPI_THREADS_MULTIPLE = 2 };
/* MPI_Init_thread at that level on the world. SIGPIPE is ignored first
 * (unless the program handles it): a write to a rank that died must fail, not
 * end this process (mpi_util.c). */
void vks_mpi_start(int threads, int *rank, int *size);
/* Whether MPI granted MPI_THREAD_MULTIPLE. */
bool vks_mpi_threads_multiple(void);
void vks_mpi_stop(void);
/* Ending the job (MPI_Abort) is the caller's decision (tools/cli_mpi.c). */
/* The world communicator, for the mpi/ modules' entry points. */
MPI_Comm vks_mpi_world(void);

/* ---- waits that cannot hang: every one is bounded by a timeout ---- */

/* Called on a watchdog thread when MPI_Init or MPI_Finalize has not returned
 * within the timeout, with one line naming this rank and the call. Nothing
 * unwinds out of a blocking MPI call, so it must end the process (the library
 * never does); NULL: no watchdog. */
typedef void (*vks_mpi_stuck_fn)(const char *message);

/* vks_mpi_start under a watchdog: when MPI_Init does not complete within
 * timeout_s (a rank was stopped before it joined), on_stuck is called. With
 * VKSWARM_PID_DIR set, each rank writes DIR/rank-R.pid after MPI_Init (fault
 * tests find a rank's process there). */
void vks_mpi_start_within(int threads, double timeout_s, vks_mpi_stuck_fn on_stuck, int *rank, int *size);
/* Test hook: with VKSWARM_TEST_SIGNAL=RANK:kill|stop:POINT[:N] set, the process of world rank
 * RANK raises SIGKILL or SIGSTOP the Nth time (default 1) it passes POINT, after a stderr line
 * "rank R: test signal: stopping|dying at POINT N (pid P)". Points: "init" (before MPI_Init),
 * "started" (after it, and after the pid file), "step" (a pipeline stage finished a step),
 * "batch" (a verifier rank took a batch), "plan" (a Shardcast node took the transfer plan). Fault tests fire at such points, not after a delay,
 * so that a test means the same on a fast machine, a slow one and a loaded one. */
void vks_test_point(const char *point);
/* vks_mpi_stop under the same watchdog: MPI_Finalize waits for every rank,
 * so a rank stopped at the end would hold the others forever. Rank 0 must
 * therefore write its output within timeout_s of the others' finalize. */
void vks_mpi_stop_within(double timeout_s, vks_mpi_stuck_fn on_stuck);

/* A clock that does not count the time this process was stopped: when two
 * ticks are more than timeout_s / 2 apart the process itself stood still
 * (SIGSTOP, suspended VM), so the gap is left out and no peer is blamed. */
typedef struct { double last, jumped; } vks_mpi_clock;
double vks_mpi_deadline_tick(vks_mpi_clock *c, double timeout_s);

/* Polls n requests (peer[i]: the rank request i talks to) until all complete
 * or timeout_s passes; then VKS_ERR_TIMEOUT naming the rank of the first pending
 * request and `what`. After a timeout the requests stay pending: the caller
 * must end the job (MPI_Abort), not free the buffers and carry on. */
int vks_mpi_wait_within(MPI_Comm comm, MPI_Request *reqs, const int *peer, int n, double timeout_s, const char *what);
/* The same, calling meanwhile(ctx) (when not NULL) on every poll: a rank
 * that must keep beating while it waits on a peer that may be dead. */
int vks_mpi_wait_within_doing(MPI_Comm comm, MPI_Request *reqs, const int *peer, int n, double timeout_s,
                              const char *what, void (*meanwhile)(void *), void *ctx);

/* Runs job(arg) on a thread of its own while this thread calls
 * meanwhile(ctx) (when not NULL) about every millisecond until the job ends:
 * it keeps MPI moving (beats, broadcasts, control messages; the job makes no
 * MPI call). Returns the job's status, with its error text carried over to
 * this thread, else meanwhile's first non-zero status (the job still runs to
 * its end: a thread is never cancelled). */
int vks_mpi_run_beside(int (*job)(void *), void *arg, int (*meanwhile)(void *), void *ctx, const char *what);

/* All-gather of `bytes` per rank by point-to-point messages under tag, bounded
 * by timeout_s (a blocking collective cannot time out). all[] holds size *
 * bytes, rank r's part at r * bytes. On a timeout: VKS_ERR_TIMEOUT naming the lowest
 * silent rank (see vks_mpi_wait_within). Every rank must call it with the same
 * bytes and tag, in the same order as its other exchanges. */
int vks_mpi_exchange(MPI_Comm comm, const void *mine, void *all, size_t bytes, int tag, double timeout_s,
                     const char *what);
/* The same; its message names comm rank r as names[r] (NULL: r), e.g. world
 * ranks for a sub-communicator's ranks. */
int vks_mpi_exchange_named(MPI_Comm comm, const void *mine, void *all, size_t bytes, int tag, double timeout_s,
                           const char *what, const int *names);

/* Whether mpirun was started with --enable-recovery (Open MPI puts
 * OMPI_MCA_orte_enable_recovery=1 in every rank's environment): only then
 * can the job go on after a rank leaves without MPI_Finalize. */
bool vks_mpi_recovery_enabled(void);

/* Start-up check of every rank of a job (`vkswarm pipeline`, `vkswarm rl`),
 * collective over comm: the same vkswarm version and the same model hash
 * (vks_model_hash; with an adapter vks_lora_model_hash) on every rank. On a
 * mismatch VKS_ERR_FORMAT naming the lowest rank that differs and both
 * versions or both hashes (every rank sees the same error). A rank silent for
 * timeout_s: VKS_ERR_TIMEOUT naming it; the caller must end the job
 * (MPI_Abort), since MPI_Finalize would wait for the silent rank. */
enum { VKS_MPI_TAG_CHECK_RANKS = 100 };
int vks_mpi_check_ranks(MPI_Comm comm, const uint8_t model_hash[32], double timeout_s);
#endif
