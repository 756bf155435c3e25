/* Verifier ranks (see vks_verifier.h). A batch travels as its samples' JSON
 * lines, so a verifier parses exactly what `vkswarm verify` would read.
 * Both sides keep calling MPI while a batch is verified (on a thread): they
 * send heartbeats every second, and every wait is bounded by the timeout. A
 * verifier silent that long loses its batch to the others (or to the
 * dispatcher itself); anything it sends afterwards is discarded. */
#include "vkswarm/vks_verifier.h"
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <unistd.h>
#include "vkswarm/vks_mpi.h"

enum { TAG_BATCH = 11, TAG_VERDICTS = 12, TAG_STOP = 13, TAG_HEARTBEAT = 14, TAG_STOP_ACK = 15, TAG_SETTINGS = 16 };
#define HEARTBEAT_EVERY_S 1.0
#define VERIFY_MAGIC 0x46524556u /* "VERF" */
#define MAX_BATCH_BYTES (256u << 20)

typedef struct { uint32_t magic, batch_id, n, pad; } batch_header;
typedef struct { uint32_t accepted; char reason[252]; } wire_verdict;

/* ---- batches: header, lengths[n], lines ---- */

static void *pack_batch(const vks_rollout_sample *s, int n, uint32_t id, size_t *bytes) {
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    uint32_t *lens = malloc(sizeof(uint32_t) * (size_t)n);
    long prev = 0;
    for (int i = 0; f && lens && i < n; i++) {
        if (vks_rollout_write_sample(f, &s[i])) { fclose(f); f = NULL; break; }
        fflush(f);
        lens[i] = (uint32_t)(ftell(f) - prev);
        prev = ftell(f);
    }
    if (!f || !lens) { free(lens); free(text); return NULL; }
    fclose(f);
    *bytes = sizeof(batch_header) + 4 * (size_t)n + text_len;
    char *buf = malloc(*bytes);
    if (buf) {
        batch_header h = {VERIFY_MAGIC, id, (uint32_t)n, 0};
        memcpy(buf, &h, sizeof h);
        memcpy(buf + sizeof h, lens, 4 * (size_t)n);
        memcpy(buf + sizeof h + 4 * (size_t)n, text, text_len);
    }
    free(lens);
    free(text);
    return buf;
}

/* Parses a received batch into samples; on failure a one-line reason. */
static int unpack_batch(const char *buf, size_t bytes, int max_batch, vks_rollout_sample **out, int *n_out,
                        uint32_t *id, char *err, size_t err_len) {
    batch_header h;
    if (bytes < sizeof h) return snprintf(err, err_len, "batch shorter than its header"), VKS_ERR_FORMAT;
    memcpy(&h, buf, sizeof h);
    if (h.magic != VERIFY_MAGIC || h.n == 0 || h.n > (uint32_t)max_batch || bytes < sizeof h + 4 * (size_t)h.n)
        return snprintf(err, err_len, "batch header: %u samples (1..%d allowed)", h.n, max_batch), VKS_ERR_FORMAT;
    vks_rollout_sample *s = calloc(h.n, sizeof *s);
    if (!s) return snprintf(err, err_len, "out of host memory"), VKS_ERR_NOMEM;
    size_t at = sizeof h + 4 * (size_t)h.n;
    for (uint32_t i = 0; i < h.n; i++) {
        uint32_t len;
        memcpy(&len, buf + sizeof h + 4 * (size_t)i, 4);
        if (len > bytes - at || vks_rollout_parse_sample(buf + at, len, &s[i])) {
            snprintf(err, err_len, "sample %u of batch %u: %s", i, h.batch_id,
                     len > bytes - at ? "length past the message" : vks_last_error());
            for (uint32_t j = 0; j < i; j++) vks_rollout_sample_free(&s[j]);
            free(s);
            return VKS_ERR_FORMAT;
        }
        at += len;
    }
    if (at != bytes) {
        for (uint32_t j = 0; j < h.n; j++) vks_rollout_sample_free(&s[j]);
        free(s);
        return snprintf(err, err_len, "batch %u has %zu stray bytes", h.batch_id, bytes - at), VKS_ERR_FORMAT;
    }
    *out = s;
    *n_out = (int)h.n;
    *id = h.batch_id;
    return VKS_OK;
}

/* ---- a verify call on a thread, so that the MPI thread keeps answering ---- */

typedef struct {
    pthread_t thread;
    pthread_mutex_t lock;
    bool running, finished;
    vks_verify_fn fn;
    void *ctx;
    const vks_rollout_sample *s;
    int n, rc;
    vks_verdict *out;
    char err[256];
} background_call;

static void *background_main(void *arg) {
    background_call *b = arg;
    int rc = b->fn(b->ctx, b->s, b->n, b->out);
    pthread_mutex_lock(&b->lock);
    b->rc = rc;
    if (rc) snprintf(b->err, sizeof b->err, "%s", vks_last_error());
    b->finished = true;
    pthread_mutex_unlock(&b->lock);
    return NULL;
}

static int background_start(background_call *b, vks_verify_fn fn, void *ctx, const vks_rollout_sample *s, int n,
                            vks_verdict *out) {
    b->fn = fn, b->ctx = ctx, b->s = s, b->n = n, b->out = out, b->finished = false, b->rc = 0;
    pthread_mutex_init(&b->lock, NULL);
    if (pthread_create(&b->thread, NULL, background_main, b)) {
        pthread_mutex_destroy(&b->lock);
        return vks_set_error(VKS_ERR_NOMEM, "cannot start a verify thread");
    }
    b->running = true;
    return VKS_OK;
}

static bool background_finished(background_call *b) {
    pthread_mutex_lock(&b->lock);
    bool f = b->finished;
    pthread_mutex_unlock(&b->lock);
    return f;
}

/* Joins a running call; returns its status (its error message set here). */
static int background_join(background_call *b) {
    if (!b->running) return VKS_OK;
    pthread_join(b->thread, NULL);
    pthread_mutex_destroy(&b->lock);
    b->running = false;
    return b->rc ? vks_set_error(b->rc, "%s", b->err) : VKS_OK;
}

/* ---- small bounded messaging helpers ---- */

static void send_heartbeat(MPI_Comm comm, int to) {
    static const uint32_t beat = VERIFY_MAGIC;
    MPI_Request req;
    MPI_Isend(&beat, 4, MPI_BYTE, to, TAG_HEARTBEAT, comm, &req);
    MPI_Request_free(&req);
}

/* Receives a probed message of at most max bytes into a malloc'd buffer. */
static int recv_probed(MPI_Comm comm, const MPI_Status *st, size_t max, double timeout_s, char **buf, int *bytes) {
    MPI_Get_count(st, MPI_BYTE, bytes);
    if (*bytes < 0 || (size_t)*bytes > max)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d sent a message of %d bytes (tag %d, at most %zu)", st->MPI_SOURCE,
                             *bytes, st->MPI_TAG, max);
    *buf = malloc((size_t)*bytes + 1);
    if (!*buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    MPI_Request req;
    MPI_Irecv(*buf, *bytes, MPI_BYTE, st->MPI_SOURCE, st->MPI_TAG, comm, &req);
    int peer = st->MPI_SOURCE, rc = vks_mpi_wait_within(comm, &req, &peer, 1, timeout_s, "receiving a message");
    if (rc) *buf = NULL; /* MPI may still write into it: leak it, the job ends */
    return rc;
}

static int recv_discard(MPI_Comm comm, const MPI_Status *st, size_t max, double timeout_s) {
    char *buf;
    int bytes, rc = recv_probed(comm, st, max, timeout_s, &buf, &bytes);
    free(buf);
    return rc;
}

static int send_within(MPI_Comm comm, const void *buf, size_t bytes, int to, int tag, double timeout_s, const char *what) {
    MPI_Request req;
    MPI_Isend(buf, (int)bytes, MPI_BYTE, to, tag, comm, &req);
    return vks_mpi_wait_within(comm, &req, &to, 1, timeout_s, what);
}

/* ---- start-up settings (rank 0 -> verifiers) ---- */

int vks_verifier_send_settings(MPI_Comm comm, int first_verifier, const void *buf, size_t bytes) {
    int size;
    MPI_Comm_size(comm, &size);
    if (bytes > 4096) return vks_set_error(VKS_ERR_ARG, "verifier settings: %zu bytes", bytes);
    for (int r = first_verifier; r < size; r++) { /* small: sent eagerly, buf outlives the job */
        MPI_Request req;
        MPI_Isend(buf, (int)bytes, MPI_BYTE, r, TAG_SETTINGS, comm, &req);
        MPI_Request_free(&req);
    }
    return VKS_OK;
}

int vks_verifier_recv_settings(MPI_Comm comm, int dispatcher, void *buf, size_t bytes, double timeout_s) {
    if (bytes > 4096) return vks_set_error(VKS_ERR_ARG, "verifier settings: %zu bytes", bytes);
    MPI_Request req;
    MPI_Status st;
    MPI_Irecv(buf, (int)bytes, MPI_BYTE, dispatcher, TAG_SETTINGS, comm, &req);
    int rc = vks_mpi_wait_within(comm, &req, &dispatcher, 1, timeout_s, "waiting for the verify settings");
    (void)st;
    return rc;
}

/* ---- verifier side ---- */

typedef struct {
    MPI_Comm comm;
    int dispatcher, max_batch;
    double timeout_s;
    vks_verify_fn fn;
    void *ctx;
    background_call call;
    vks_rollout_sample *s; /* the batch being verified */
    int n;
    uint32_t id;
    vks_verdict *v;
} verifier_state;

static void drop_batch(verifier_state *vs) {
    for (int i = 0; i < vs->n; i++) vks_rollout_sample_free(&vs->s[i]);
    free(vs->s);
    free(vs->v);
    vs->s = NULL, vs->v = NULL, vs->n = 0;
}

static int start_batch(verifier_state *vs, const MPI_Status *st) {
    if (vs->call.running)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d sent a batch while one was being verified", st->MPI_SOURCE);
    char *buf, err[200];
    int bytes, rc = recv_probed(vs->comm, st, MAX_BATCH_BYTES, vs->timeout_s, &buf, &bytes);
    if (rc) return rc;
    rc = unpack_batch(buf, (size_t)bytes, vs->max_batch, &vs->s, &vs->n, &vs->id, err, sizeof err);
    free(buf);
    if (rc) return vks_set_error(rc, "bad batch from rank %d: %s", st->MPI_SOURCE, err);
    vs->v = calloc((size_t)vs->n, sizeof *vs->v);
    if (!vs->v) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    vks_test_point("batch"); /* holding the batch: it must go to another rank */
    return background_start(&vs->call, vs->fn, vs->ctx, vs->s, vs->n, vs->v);
}

static int send_verdicts(verifier_state *vs) {
    int rc = background_join(&vs->call);
    size_t reply_bytes = sizeof(batch_header) + sizeof(wire_verdict) * (size_t)vs->n;
    char *reply = rc ? NULL : malloc(reply_bytes);
    if (!rc && !reply) rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (rc == VKS_OK) {
        batch_header h = {VERIFY_MAGIC, vs->id, (uint32_t)vs->n, 0};
        memcpy(reply, &h, sizeof h);
        for (int i = 0; i < vs->n; i++) {
            wire_verdict w = {.accepted = vs->v[i].accepted};
            memcpy(w.reason, vs->v[i].reason, sizeof w.reason - 1); /* both NUL-terminated; cut to the wire's size */
            memcpy(reply + sizeof h + sizeof w * (size_t)i, &w, sizeof w);
        }
        rc = send_within(vs->comm, reply, reply_bytes, vs->dispatcher, TAG_VERDICTS, vs->timeout_s, "sending verdicts");
        if (rc == VKS_OK) free(reply); /* else MPI may still read it: the job ends */
    }
    drop_batch(vs);
    return rc;
}

/* One message from the dispatcher; *stop once it said so (and was answered). */
static int serve_message(verifier_state *vs, const MPI_Status *st, bool *stop) {
    if (st->MPI_TAG == TAG_HEARTBEAT) return recv_discard(vs->comm, st, 4, vs->timeout_s);
    if (st->MPI_TAG == TAG_BATCH) return start_batch(vs, st);
    if (st->MPI_TAG != TAG_STOP)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d sent a message with unknown tag %d", st->MPI_SOURCE, st->MPI_TAG);
    int rc = recv_discard(vs->comm, st, 0, vs->timeout_s);
    if (rc == VKS_OK && vs->call.running) { /* a batch given to others meanwhile: finish it, answer nothing */
        rc = background_join(&vs->call);
        drop_batch(vs);
    }
    if (rc == VKS_OK) rc = send_within(vs->comm, NULL, 0, vs->dispatcher, TAG_STOP_ACK, vs->timeout_s, "answering stop");
    *stop = rc == VKS_OK;
    return rc;
}

static int serve_loop(verifier_state *vs) {
    vks_mpi_clock clock = {0};
    double now = vks_mpi_deadline_tick(&clock, vs->timeout_s), last_heard = now, last_beat = -1e30;
    for (bool stop = false; !stop;) {
        now = vks_mpi_deadline_tick(&clock, vs->timeout_s);
        if (now - last_beat >= HEARTBEAT_EVERY_S) send_heartbeat(vs->comm, vs->dispatcher), last_beat = now;
        int flag, rc = VKS_OK;
        MPI_Status st;
        MPI_Iprobe(vs->dispatcher, MPI_ANY_TAG, vs->comm, &flag, &st);
        if (flag) {
            last_heard = now;
            rc = serve_message(vs, &st, &stop);
        } else if (vs->call.running && background_finished(&vs->call)) {
            rc = send_verdicts(vs);
        } else if (now - last_heard > vs->timeout_s) {
            rc = vks_set_error(VKS_ERR_TIMEOUT, "rank %d stopped answering (the dispatcher): nothing within %.1f s",
                               vs->dispatcher, vs->timeout_s);
        } else {
            usleep(500);
        }
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_verifier_serve(MPI_Comm comm, int dispatcher, int max_batch, double timeout_s, vks_verify_fn fn, void *ctx) {
    if (!fn || max_batch < 1 || timeout_s <= 0) return vks_set_error(VKS_ERR_ARG, "verifier: bad arguments");
    verifier_state vs = {.comm = comm, .dispatcher = dispatcher, .max_batch = max_batch, .timeout_s = timeout_s,
                         .fn = fn, .ctx = ctx};
    int rc = serve_loop(&vs);
    if (rc == VKS_OK) drop_batch(&vs); /* on an error a thread may still use it: the job ends */
    return rc;
}

/* ---- dispatcher side ---- */

typedef struct {
    int batch;           /* batch index in flight, -1 when idle */
    bool lost, stopped;  /* stopped: answered the stop message */
    bool revived;        /* lost, then heard from again: gets no work, but its stop answer is awaited */
    double last_heard;
    MPI_Request send;    /* the batch message, while MPI still reads it */
    void *send_buf;
} verifier_peer;

typedef struct {
    MPI_Comm comm;
    int first, size, n, batch, n_batches;
    double timeout_s, now;
    vks_mpi_clock clock;
    const vks_rollout_sample *samples;
    vks_verdict *out;
    vks_verify_fn fn;
    void *ctx;
    verifier_peer *peer;
    int *requeued, n_requeued, next_new, n_done;
    int local_batch;     /* the batch the dispatcher verifies itself, -1 when none */
    background_call local;
    vks_dispatch_report *report;
    double last_beat;
} dispatcher;

static int batch_len(const dispatcher *d, int b) {
    int start = b * d->batch;
    return d->n - start < d->batch ? d->n - start : d->batch;
}

/* The next batch nobody is verifying, or -1. */
static int take_batch(dispatcher *d) {
    if (d->n_requeued) return d->requeued[--d->n_requeued];
    return d->next_new < d->n_batches ? d->next_new++ : -1;
}

static void give_back(dispatcher *d, int b) {
    d->requeued[d->n_requeued++] = b;
}

static int send_batch(dispatcher *d, int r, int b) {
    size_t bytes;
    int start = b * d->batch, n = batch_len(d, b);
    void *msg = pack_batch(d->samples + start, n, (uint32_t)start, &bytes);
    if (!msg || bytes > MAX_BATCH_BYTES) {
        free(msg);
        return vks_set_error(VKS_ERR_NOMEM, "cannot pack a batch of %d samples", n);
    }
    verifier_peer *p = &d->peer[r];
    MPI_Isend(msg, (int)bytes, MPI_BYTE, r, TAG_BATCH, d->comm, &p->send);
    p->send_buf = msg;
    p->batch = b;
    p->last_heard = d->now; /* its silence counts from now */
    return VKS_OK;
}

static void reap_send(verifier_peer *p) {
    int flag = 0;
    if (p->send_buf) MPI_Test(&p->send, &flag, MPI_STATUS_IGNORE);
    if (flag) free(p->send_buf), p->send_buf = NULL;
}

static bool any_live_verifier(const dispatcher *d) {
    for (int r = d->first; r < d->size; r++)
        if (!d->peer[r].lost) return true;
    return false;
}

static int assign_work(dispatcher *d) {
    for (int r = d->first; r < d->size; r++) {
        verifier_peer *p = &d->peer[r];
        reap_send(p);
        if (p->lost || p->batch >= 0 || p->send_buf) continue;
        int b = take_batch(d);
        if (b < 0) return VKS_OK;
        int rc = send_batch(d, r, b);
        if (rc) return rc;
    }
    if (d->local_batch >= 0 || any_live_verifier(d)) return VKS_OK;
    int b = take_batch(d); /* nobody left: verify here, on a thread, still answering MPI */
    if (b < 0) return VKS_OK;
    d->local_batch = b;
    return background_start(&d->local, d->fn, d->ctx, d->samples + b * d->batch, batch_len(d, b), d->out + b * d->batch);
}

static int finish_local(dispatcher *d) {
    if (d->local_batch < 0 || !background_finished(&d->local)) return VKS_OK;
    int rc = background_join(&d->local);
    d->n_done++;
    d->local_batch = -1;
    return rc;
}

static int take_verdicts(dispatcher *d, const MPI_Status *st) {
    verifier_peer *p = &d->peer[st->MPI_SOURCE];
    int b = p->batch, n = batch_len(d, b);
    size_t want = sizeof(batch_header) + sizeof(wire_verdict) * (size_t)n;
    char *buf;
    int bytes, rc = recv_probed(d->comm, st, want, d->timeout_s, &buf, &bytes);
    if (rc) return rc;
    batch_header h;
    memcpy(&h, buf, (size_t)bytes < sizeof h ? 0 : sizeof h);
    if ((size_t)bytes != want || h.magic != VERIFY_MAGIC || h.n != (uint32_t)n || h.batch_id != (uint32_t)(b * d->batch))
        rc = vks_set_error(VKS_ERR_FORMAT, "rank %d answered for another batch (%d bytes)", st->MPI_SOURCE, bytes);
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        wire_verdict w;
        memcpy(&w, buf + sizeof h + sizeof w * (size_t)i, sizeof w);
        w.reason[sizeof w.reason - 1] = 0;
        vks_verdict *v = &d->out[b * d->batch + i];
        memset(v, 0, sizeof *v);
        v->accepted = w.accepted == 1;
        snprintf(v->reason, sizeof v->reason, "%s", w.reason);
    }
    free(buf);
    if (rc == VKS_OK) d->n_done++, p->batch = -1;
    return rc;
}

/* A message from a verifier; a lost one's are read and dropped (its batch went to another). */
static int handle_message(dispatcher *d, const MPI_Status *st) {
    int r = st->MPI_SOURCE;
    if (r < d->first || r >= d->size) return vks_set_error(VKS_ERR_FORMAT, "rank %d is not a verifier", r);
    verifier_peer *p = &d->peer[r];
    p->last_heard = d->now;
    p->revived = p->lost;
    if (st->MPI_TAG == TAG_HEARTBEAT) return recv_discard(d->comm, st, 4, d->timeout_s);
    if (st->MPI_TAG == TAG_STOP_ACK) {
        p->stopped = true;
        return recv_discard(d->comm, st, 0, d->timeout_s);
    }
    if (st->MPI_TAG != TAG_VERDICTS) return vks_set_error(VKS_ERR_FORMAT, "rank %d sent unknown tag %d", r, st->MPI_TAG);
    if (p->lost) return recv_discard(d->comm, st, MAX_BATCH_BYTES, d->timeout_s);
    if (p->batch < 0) return vks_set_error(VKS_ERR_FORMAT, "rank %d sent verdicts nobody asked for", r);
    return take_verdicts(d, st);
}

static void mark_lost(dispatcher *d, int r) {
    verifier_peer *p = &d->peer[r];
    p->lost = true;
    if (p->batch >= 0) give_back(d, p->batch);
    p->batch = -1;
    if (d->report->n_lost++ == 0) d->report->first_lost = r;
}

static bool awaited(const verifier_peer *p) { return !p->stopped && (!p->lost || p->revived); }

static void check_silence(dispatcher *d) {
    for (int r = d->first; r < d->size; r++) {
        verifier_peer *p = &d->peer[r];
        if (!awaited(p) || d->now - p->last_heard <= d->timeout_s) continue;
        if (p->lost) p->revived = false;
        else mark_lost(d, r);
    }
}

/* One turn: heartbeats out, at most one message in, silence checks. */
static int pump(dispatcher *d) {
    d->now = vks_mpi_deadline_tick(&d->clock, d->timeout_s);
    if (d->now - d->last_beat >= HEARTBEAT_EVERY_S) {
        for (int r = d->first; r < d->size; r++)
            if (!d->peer[r].stopped) send_heartbeat(d->comm, r); /* a stopped one may be in MPI_Finalize */
        d->last_beat = d->now;
    }
    int flag, rc = VKS_OK;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, d->comm, &flag, &st);
    if (flag) rc = handle_message(d, &st);
    check_silence(d);
    if (!flag) usleep(500);
    return rc;
}

/* Every verifier is told to stop; the live ones answer within the timeout or count as lost. */
static int stop_verifiers(dispatcher *d) {
    static const char none = 0;
    for (int r = d->first; r < d->size; r++) {
        MPI_Request req;
        MPI_Isend(&none, 0, MPI_BYTE, r, TAG_STOP, d->comm, &req);
        MPI_Request_free(&req);
        d->peer[r].last_heard = d->now; /* the answer is due within the timeout from now */
    }
    for (;;) {
        bool waiting = false;
        for (int r = d->first; r < d->size; r++) waiting |= awaited(&d->peer[r]);
        if (!waiting) return VKS_OK;
        int rc = pump(d);
        if (rc) return rc;
    }
}

static int dispatch_all(dispatcher *d) {
    d->now = vks_mpi_deadline_tick(&d->clock, d->timeout_s);
    for (int r = d->first; r < d->size; r++) d->peer[r] = (verifier_peer){.batch = -1, .last_heard = d->now};
    d->last_beat = -1e30;
    int rc = VKS_OK;
    while (rc == VKS_OK && d->n_done < d->n_batches) {
        rc = assign_work(d);
        if (rc == VKS_OK) rc = pump(d);
        if (rc == VKS_OK) rc = finish_local(d);
    }
    if (rc == VKS_OK) rc = stop_verifiers(d);
    d->report->all_stopped = true;
    for (int r = d->first; r < d->size; r++) d->report->all_stopped &= d->peer[r].stopped;
    return rc;
}

int vks_verifier_dispatch(MPI_Comm comm, int first_verifier, const vks_rollout_sample *samples, int n, int batch,
                          double timeout_s, vks_verify_fn fn, void *ctx, vks_verdict *out, vks_dispatch_report *report) {
    int size;
    MPI_Comm_size(comm, &size);
    if ((!samples && n > 0) || !out || !report || n < 0 || batch < 1 || first_verifier < 1 || timeout_s <= 0)
        return vks_set_error(VKS_ERR_ARG, "verifier dispatch: bad arguments");
    *report = (vks_dispatch_report){.first_lost = -1, .all_stopped = true};
    if (first_verifier >= size) return n ? fn(ctx, samples, n, out) : VKS_OK; /* nobody else: verify here */
    dispatcher d = {.comm = comm, .first = first_verifier, .size = size, .n = n, .batch = batch,
                    .n_batches = (n + batch - 1) / batch, .timeout_s = timeout_s, .samples = samples, .out = out,
                    .fn = fn, .ctx = ctx, .local_batch = -1, .report = report};
    d.peer = calloc((size_t)size, sizeof *d.peer);
    d.requeued = malloc(sizeof(int) * ((size_t)d.n_batches + 1));
    int rc = d.peer && d.requeued ? dispatch_all(&d) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    bool in_use = d.local_batch >= 0; /* an error while verifying here: the thread still runs, the job ends */
    for (int r = first_verifier; d.peer && r < size; r++) {
        if (d.peer[r].send_buf) reap_send(&d.peer[r]);
        in_use |= d.peer[r].send_buf != NULL; /* a lost rank never took its batch: MPI still reads it */
    }
    if (in_use) return rc;
    free(d.peer);
    free(d.requeued);
    return rc;
}
