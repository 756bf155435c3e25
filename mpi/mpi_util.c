/* Start, stop and share values across the world (see vks_mpi.h). */
#include "vkswarm/vks_mpi.h"
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "vkswarm/vks_common.h"

/* Open MPI's TCP transport writes to its sockets with writev, which raises
 * SIGPIPE when the peer's end is gone; its default action ends the process
 * without a word. Seen: the RL trainer, back from a long first training step
 * (no MPI call meanwhile, so the transport had not yet read the EOF of a rank
 * killed during it), sent that rank the manifest and a beat in a row; the
 * second write hit the reset connection and SIGPIPE killed the trainer.
 * Ignored, the write fails with EPIPE and the transport closes the connection,
 * as it does for a peer that hung up while it was listening. A handler the
 * program installed itself is left alone. */
static void ignore_sigpipe(void) {
    struct sigaction old;
    if (sigaction(SIGPIPE, NULL, &old) == 0 && old.sa_handler == SIG_DFL && !(old.sa_flags & SA_SIGINFO)) {
        struct sigaction ign = {0};
        ign.sa_handler = SIG_IGN;
        sigemptyset(&ign.sa_mask);
        sigaction(SIGPIPE, &ign, NULL);
    }
}

static int rank_from_env(void);

/* VKSWARM_TEST_SIGNAL, parsed once: *point is empty when it is unset, malformed or for another rank. */
static void test_signal(char point[16], bool *stop, long *nth) {
    static bool parsed;
    static char p[16];
    static bool s;
    static long n;
    if (!parsed) {
        parsed = true;
        const char *env = getenv("VKSWARM_TEST_SIGNAL");
        int r = -1;
        char sig[8] = "";
        n = 1;
        if (!env || sscanf(env, "%d:%7[a-z]:%15[a-z]:%ld", &r, sig, p, &n) < 3 || r != rank_from_env() || n < 1 ||
            (strcmp(sig, "kill") && strcmp(sig, "stop")))
            p[0] = 0;
        s = !strcmp(sig, "stop");
    }
    memcpy(point, p, sizeof p);
    *stop = s, *nth = n;
}

void vks_test_point(const char *point) {
    static long passed;
    char p[16];
    bool stop;
    long nth;
    test_signal(p, &stop, &nth);
    if (!p[0] || strcmp(p, point) || ++passed != nth) return;
    fprintf(stderr, "rank %d: test signal: %s at %s %ld (pid %ld)\n", rank_from_env(), stop ? "stopping" : "dying", point,
            nth, (long)getpid());
    fflush(stderr);
    raise(stop ? SIGSTOP : SIGKILL);
}

void vks_mpi_start(int threads, int *rank, int *size) {
    int provided, want = threads == VKS_MPI_THREADS_MULTIPLE   ? MPI_THREAD_MULTIPLE
                         : threads == VKS_MPI_THREADS_FUNNELED ? MPI_THREAD_FUNNELED
                                                               : MPI_THREAD_SINGLE;
    ignore_sigpipe();
    vks_test_point("init");
    MPI_Init_thread(NULL, NULL, want, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
}

bool vks_mpi_threads_multiple(void) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Query_thread(&provided);
    return provided == MPI_THREAD_MULTIPLE;
}

void vks_mpi_stop(void) { MPI_Finalize(); }

MPI_Comm vks_mpi_world(void) { return MPI_COMM_WORLD; }

/* ---- start-up that cannot hang (every wait under a deadline) ---- */

static int rank_from_env(void) {
    const char *s = getenv("OMPI_COMM_WORLD_RANK");
    char *end;
    long r = s ? strtol(s, &end, 10) : -1;
    return s && *s && !*end && r >= 0 && r < INT_MAX ? (int)r : -1;
}

/* A thread that hands the caller's on_stuck a message when a blocking MPI call
 * (MPI_Init, MPI_Finalize: fences over every rank) does not return within
 * timeout_s. Nothing can unwind out of that call, so ending the process is
 * on_stuck's job (tools/), not the library's. */
typedef struct {
    pthread_mutex_t lock;
    pthread_cond_t done_cond;
    bool done, watching;
    double timeout_s;
    const char *what;
    vks_mpi_stuck_fn on_stuck;
    pthread_t thread;
} watchdog;

static void *watch(void *arg) {
    watchdog *w = arg;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = floor(w->timeout_s);
    until.tv_sec += (time_t)whole;
    until.tv_nsec += (long)((w->timeout_s - whole) * 1e9);
    if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
    pthread_mutex_lock(&w->lock);
    int rc = 0;
    while (!w->done && rc != ETIMEDOUT) rc = pthread_cond_timedwait(&w->done_cond, &w->lock, &until);
    bool done = w->done;
    pthread_mutex_unlock(&w->lock);
    if (done) return NULL;
    char msg[256];
    snprintf(msg, sizeof msg, "rank %d: %s did not complete within %.1f s; stopping", rank_from_env(), w->what,
             w->timeout_s);
    w->on_stuck(msg);
    return NULL;
}

static void write_pid_file(int rank) {
    const char *dir = getenv("VKSWARM_PID_DIR");
    if (!dir || !*dir) return;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.pid", dir, rank);
    vks_outfile o;
    if (vks_outfile_open(&o, path, 0644)) return; /* a test hook: no pid file, no harm */
    fprintf(o.f, "%ld\n", (long)getpid());
    vks_outfile_commit(&o);
}

static void watchdog_start(watchdog *w, double timeout_s, const char *what, vks_mpi_stuck_fn on_stuck) {
    *w = (watchdog){.timeout_s = timeout_s, .what = what, .on_stuck = on_stuck};
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->done_cond, NULL);
    w->watching = on_stuck && pthread_create(&w->thread, NULL, watch, w) == 0;
}

static void watchdog_stop(watchdog *w) {
    pthread_mutex_lock(&w->lock);
    w->done = true;
    pthread_cond_signal(&w->done_cond);
    pthread_mutex_unlock(&w->lock);
    if (w->watching) pthread_join(w->thread, NULL);
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->done_cond);
}

void vks_mpi_start_within(int threads, double timeout_s, vks_mpi_stuck_fn on_stuck, int *rank, int *size) {
    watchdog w;
    watchdog_start(&w, timeout_s, "MPI start-up (a rank did not join)", on_stuck);
    vks_mpi_start(threads, rank, size);
    watchdog_stop(&w);
    write_pid_file(*rank);
    vks_test_point("started");
}

void vks_mpi_stop_within(double timeout_s, vks_mpi_stuck_fn on_stuck) {
    watchdog w;
    watchdog_start(&w, timeout_s, "MPI_Finalize (a rank stopped answering at the end)", on_stuck);
    vks_mpi_stop();
    watchdog_stop(&w);
}

double vks_mpi_deadline_tick(vks_mpi_clock *c, double timeout_s) {
    double now = vks_seconds_now();
    if (c->last > 0 && now - c->last > timeout_s / 2) c->jumped += now - c->last; /* we were stopped, not them */
    c->last = now;
    return now - c->jumped;
}

int vks_mpi_wait_within(MPI_Comm comm, MPI_Request *reqs, const int *peer, int n, double timeout_s, const char *what) {
    return vks_mpi_wait_within_doing(comm, reqs, peer, n, timeout_s, what, NULL, NULL);
}

int vks_mpi_wait_within_doing(MPI_Comm comm, MPI_Request *reqs, const int *peer, int n, double timeout_s,
                              const char *what, void (*meanwhile)(void *), void *ctx) {
    vks_mpi_clock clock = {0};
    double start = vks_mpi_deadline_tick(&clock, timeout_s);
    for (;;) {
        int pending = -1;
        for (int i = 0; i < n; i++) {
            int flag = 1;
            if (reqs[i] != MPI_REQUEST_NULL) MPI_Test(&reqs[i], &flag, MPI_STATUS_IGNORE);
            if (!flag && pending < 0) pending = i;
        }
        if (pending < 0) return VKS_OK;
        if (vks_mpi_deadline_tick(&clock, timeout_s) - start > timeout_s) {
            (void)comm; /* requests stay pending: the caller ends the job */
            return vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s)", peer[pending], timeout_s, what);
        }
        if (meanwhile) meanwhile(ctx);
        usleep(200);
    }
}

/* ---- a job on a thread beside the MPI loop ---- */

typedef struct {
    int (*job)(void *);
    void *arg;
    int rc;
    char err[1024];
    pthread_mutex_t mu;
    bool done;
} beside_job;

static void *beside_thread(void *p) {
    beside_job *j = p;
    int rc = j->job(j->arg);
    if (rc) snprintf(j->err, sizeof j->err, "%s", vks_last_error()); /* the error text is per thread */
    pthread_mutex_lock(&j->mu);
    j->rc = rc, j->done = true;
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

int vks_mpi_run_beside(int (*job)(void *), void *arg, int (*meanwhile)(void *), void *ctx, const char *what) {
    beside_job j = {.job = job, .arg = arg};
    pthread_mutex_init(&j.mu, NULL);
    pthread_t th;
    if (pthread_create(&th, NULL, beside_thread, &j)) {
        pthread_mutex_destroy(&j.mu);
        return vks_set_error(VKS_ERR_NOMEM, "cannot start a thread for %s", what);
    }
    int rc = VKS_OK;
    char err[1024] = "";
    for (;;) {
        pthread_mutex_lock(&j.mu);
        bool done = j.done;
        pthread_mutex_unlock(&j.mu);
        if (done) break;
        int m = meanwhile ? meanwhile(ctx) : VKS_OK;
        if (m && !rc) rc = m, snprintf(err, sizeof err, "%s", vks_last_error());
        usleep(1000);
    }
    pthread_join(th, NULL);
    pthread_mutex_destroy(&j.mu);
    if (j.rc) return vks_set_error(j.rc, "%s", j.err);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}

/* ---- exchanges that name the rank everyone waits for ----
 * A rank can be silent in an exchange only because it waits on another: Open
 * MPI's TCP transport completes a small send locally before the connection is
 * up, so a rank stopped just after finishing one exchange may have delivered
 * its message to some ranks and not to others. Those others stay in the first
 * exchange waiting on it, while the first ones wait on them in the next: each
 * would blame a live rank. So a waiting rank answers "whom do you wait for?"
 * (TAG_WHO_WAITS, answered on TAG_WAITS_ON with that rank, or -1), and a rank
 * whose wait times out asks its silent peer once before naming anyone. */
enum { TAG_WHO_WAITS = 190, TAG_WAITS_ON = 191 };

typedef struct {
    MPI_Comm comm;
    const MPI_Request *reqs;
    const int *peer;
    int n;
} exchange_wait;

/* The rank of the first request still pending, or -1. */
static int waited_on(const exchange_wait *w) {
    for (int i = 0; i < w->n; i++)
        if (w->reqs[i] != MPI_REQUEST_NULL) return w->peer[i];
    return -1;
}

/* The meanwhile hook of an exchange's wait: answers every question waiting. */
static void answer_who_waits(void *ctx) {
    const exchange_wait *w = ctx;
    for (;;) {
        int flag = 0, question;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_WHO_WAITS, w->comm, &flag, &st);
        if (!flag) return;
        MPI_Recv(&question, 1, MPI_INT, st.MPI_SOURCE, TAG_WHO_WAITS, w->comm, MPI_STATUS_IGNORE);
        int answer = waited_on(w);
        /* 4 bytes to a rank that has just asked: sent eagerly, never blocks */
        MPI_Send(&answer, 1, MPI_INT, st.MPI_SOURCE, TAG_WAITS_ON, w->comm);
    }
}

/* Asks `silent` whom it waits for, answering questions meanwhile, for at most
 * `bound` seconds. Returns that rank when it is a third rank, else -1. */
static int ask_who_waits(exchange_wait *w, int silent, double bound) {
    static const int question = 0; /* outlives the send, which a silent rank may never take */
    int me, size, answer = -1;
    MPI_Comm_rank(w->comm, &me);
    MPI_Comm_size(w->comm, &size);
    MPI_Request ask;
    if (MPI_Isend(&question, 1, MPI_INT, silent, TAG_WHO_WAITS, w->comm, &ask) != MPI_SUCCESS) return -1;
    MPI_Request_free(&ask);
    double until = vks_seconds_now() + bound;
    while (vks_seconds_now() < until) {
        int flag = 0;
        MPI_Iprobe(silent, TAG_WAITS_ON, w->comm, &flag, MPI_STATUS_IGNORE);
        if (flag) {
            MPI_Recv(&answer, 1, MPI_INT, silent, TAG_WAITS_ON, w->comm, MPI_STATUS_IGNORE);
            return answer >= 0 && answer < size && answer != me && answer != silent ? answer : -1;
        }
        answer_who_waits(w);
        usleep(1000);
    }
    return -1;
}

int vks_mpi_exchange(MPI_Comm comm, const void *mine, void *all, size_t bytes, int tag, double timeout_s,
                     const char *what) {
    return vks_mpi_exchange_named(comm, mine, all, bytes, tag, timeout_s, what, NULL);
}

int vks_mpi_exchange_named(MPI_Comm comm, const void *mine, void *all, size_t bytes, int tag, double timeout_s,
                           const char *what, const int *names) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (bytes > INT_MAX || size < 1) return vks_set_error(VKS_ERR_ARG, "%s: %zu bytes per rank", what, bytes);
    MPI_Request *reqs = malloc(sizeof *reqs * 2 * (size_t)size);
    int *peer = malloc(sizeof *peer * 2 * (size_t)size);
    if (!reqs || !peer) {
        free(reqs);
        free(peer);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    memcpy((char *)all + bytes * (size_t)rank, mine, bytes);
    int n = 0;
    /* receives first, in rank order: on a timeout the lowest silent rank is named */
    for (int r = 0; r < size; r++)
        if (r != rank) {
            peer[n] = r;
            MPI_Irecv((char *)all + bytes * (size_t)r, (int)bytes, MPI_BYTE, r, tag, comm, &reqs[n++]);
        }
    for (int r = 0; r < size; r++)
        if (r != rank) {
            peer[n] = r;
            MPI_Isend(mine, (int)bytes, MPI_BYTE, r, tag, comm, &reqs[n++]);
        }
    exchange_wait w = {.comm = comm, .reqs = reqs, .peer = peer, .n = n};
    int rc = vks_mpi_wait_within_doing(comm, reqs, peer, n, timeout_s, what, answer_who_waits, &w);
    if (rc == VKS_ERR_TIMEOUT) {
        int silent = waited_on(&w);
        int behind = silent >= 0 ? ask_who_waits(&w, silent, fmin(2.0, timeout_s / 2)) : -1;
#define NAMED(r) (names && (r) >= 0 && (r) < size ? names[r] : (r))
        if (behind >= 0)
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s; rank %d waits on it too)",
                               NAMED(behind), timeout_s, what, NAMED(silent));
        else if (names && silent >= 0)
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d did not answer within %.1f s (%s)", NAMED(silent), timeout_s, what);
#undef NAMED
    }
    free(reqs);
    free(peer);
    return rc;
}

bool vks_mpi_recovery_enabled(void) {
    const char *v = getenv("OMPI_MCA_orte_enable_recovery");
    return v && (!strcmp(v, "1") || !strcmp(v, "true"));
}

int vks_mpi_check_ranks(MPI_Comm comm, const uint8_t model_hash[32], double timeout_s) {
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    uint8_t mine[64] = {0};
    snprintf((char *)mine, 32, "%s", VKS_VERSION);
    memcpy(mine + 32, model_hash, 32);
    uint8_t *all = malloc(64 * (size_t)size);
    if (!all) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int rc = vks_mpi_exchange(comm, mine, all, 64, VKS_MPI_TAG_CHECK_RANKS, timeout_s, "checking versions and models");
    if (rc) return rc; /* all stays in MPI's hands: the caller ends the job */
    int bad = -1, what = 0;
    for (int r = 0; r < size && bad < 0; r++) {
        if (memcmp(all + 64 * r, all, 32)) bad = r, what = 1;
        else if (memcmp(all + 64 * r + 32, all + 32, 32)) bad = r, what = 2;
    }
    char theirs[4 * 31 + 8], first[4 * 31 + 8]; /* room for 31 escaped bytes; a hash takes 65 */
    if (bad >= 0 && what == 1) { /* the version strings are another rank's bytes: escaped */
        vks_escape((const char *)all + 64 * bad, strnlen((const char *)all + 64 * bad, 31), theirs, sizeof theirs);
        vks_escape((const char *)all, strnlen((const char *)all, 31), first, sizeof first);
        rc = vks_set_error(VKS_ERR_FORMAT, "rank %d runs vkswarm %s, rank 0 runs %s", bad, theirs, first);
    } else if (bad >= 0) {
        vks_hash_hex(all + 64 * bad + 32, theirs);
        vks_hash_hex(all + 32, first);
        rc = vks_set_error(VKS_ERR_FORMAT, "rank %d loaded a different model than rank 0: model hash %s on rank %d, %s "
                           "on rank 0 (every rank must load the same model file)", bad, theirs, bad, first);
    }
    free(all);
    return rc;
}
