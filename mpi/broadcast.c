/* Shardcast roles over MPI: the origin (rank 0) and the nodes (relays and
 * receivers). Protocol, all through vks_link so emulated links apply:
 *   origin -> all     MANIFEST (signed blob)
 *   node -> origin    ACK (int32: 0 accepted, 1 refused)
 *   origin -> accepted PLAN (one byte per rank: takes part or not)
 *   parent -> child   CHUNK (chunks of the wire stream, in order)
 *   node -> origin    REQ (shard to send again) / origin -> node REPAIR
 *   node -> origin    LOST (int32: my parent, silent; I turned to the origin)
 *   node -> origin    DONE (int32 status, then why it failed or refused the file:
 *                     broadcast_internal.h) / origin -> finished FINISH (int32:
 *                     ranks lost; > 0 tells survivors not to MPI_Finalize)
 *   origin <-> all    BEAT (1 byte, every second; not emulated traffic)
 *   node -> origin    BYE (int32 final status) / origin -> node GO (int32:
 *                     ranks silent): the closing handshake (vks_bcast_close)
 * Every size read from a message is checked before use. */
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "broadcast_internal.h"

vks_bcast_role vks_bcast_role_of(int rank, int relays) {
    return rank == 0 ? VKS_BCAST_ORIGIN : rank <= relays ? VKS_BCAST_RELAY : VKS_BCAST_RECEIVER;
}

static int parse_fault(const char *s, bcast_fault *f) {
    memset(f, 0, sizeof *f);
    f->rank = -1;
    if (!s || !*s) return VKS_OK;
    char kind[16];
    int rank = -1;
    unsigned shard = 0;
    int n = sscanf(s, "%15[a-z]:%d:%u", kind, &rank, &shard);
    if (n < 2 || rank < 0) return vks_set_error(VKS_ERR_ARG, "fault '%s': expected KIND:RANK[:SHARD]", s);
    if (!strcmp(kind, "corrupt")) f->kind = FAULT_CORRUPT;
    else if (!strcmp(kind, "short")) f->kind = FAULT_SHORT;
    else if (!strcmp(kind, "die")) f->kind = FAULT_DIE;
    else if (!strcmp(kind, "stop")) f->kind = FAULT_STOP;
    else return vks_set_error(VKS_ERR_ARG, "fault '%s': unknown kind (corrupt, short, die, stop)", s);
    f->rank = rank;
    f->shard = shard;
    return VKS_OK;
}

/* MPI_Comm_dup as a nonblocking collective polled against a deadline: a
 * rank stopped at start-up cannot hold the others forever. */
static int dup_bounded(MPI_Comm comm, double timeout_s, MPI_Comm *out) {
    MPI_Request rq;
    if (MPI_Comm_idup(comm, out, &rq) != MPI_SUCCESS) return vks_set_error(VKS_ERR_IO, "broadcast: MPI_Comm_idup failed");
    double deadline = MPI_Wtime() + timeout_s;
    for (int flag = 0; !flag;) {
        MPI_Test(&rq, &flag, MPI_STATUS_IGNORE);
        if (!flag && MPI_Wtime() > deadline) {
            int rank = -1;
            MPI_Comm_rank(comm, &rank);
            return vks_set_error(VKS_ERR_IO, "broadcast: rank %d: start-up: not every rank joined within %.0fs", rank,
                                 timeout_s);
        }
        if (!flag) usleep(1000);
    }
    return VKS_OK;
}

int vks_bcast_create(MPI_Comm comm, const vks_bcast_options *opt, vks_bcast **out) {
    if (!opt || !out) return vks_set_error(VKS_ERR_ARG, "broadcast: null argument");
    *out = NULL;
    vks_bcast *b = calloc(1, sizeof *b);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    b->opt = *opt;
    if (b->opt.fanout <= 0) b->opt.fanout = 2;
    if (b->opt.chunk_bytes == 0) b->opt.chunk_bytes = 1u << 20;
    if (b->opt.timeout_s <= 0) b->opt.timeout_s = 30;
    if (b->opt.keep_versions <= 0) b->opt.keep_versions = 2;
    int rc = VKS_OK;
    if (b->opt.fanout > 64 || b->opt.keep_versions > MAX_KEEP || b->opt.chunk_bytes > (1u << 30))
        rc = vks_set_error(VKS_ERR_ARG, "broadcast: fan-out (max 64), versions kept (max %d) or chunk size out of range",
                           MAX_KEEP);
    if (!rc) rc = parse_fault(opt->fault, &b->fault);
    if (rc) {
        free(b);
        return rc;
    }
    rc = dup_bounded(comm, b->opt.timeout_s, &b->comm);
    if (rc) return rc; /* b stays allocated: the pending dup may still write b->comm */
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &b->rank);
    MPI_Comm_size(b->comm, &b->size);
    b->last_heard = calloc((size_t)b->size, sizeof *b->last_heard);
    b->outcome = calloc((size_t)b->size, 1);
    b->gone = calloc((size_t)b->size, 1);
    b->why = calloc((size_t)b->size, sizeof *b->why);
    if (!b->last_heard || !b->outcome || !b->gone || !b->why) rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    for (int r = 0; !rc && r < b->size; r++) b->last_heard[r] = vks_bc_now_s();
    if (b->opt.relays < 0 || b->opt.relays >= b->size) b->opt.relays = b->size > 1 ? b->size - 1 : 0;
    if (!rc) rc = vks_link_create(b->comm, &b->opt.link, &b->link);
    if (!rc) rc = vks_link_set_shared_uplink(b->link, b->opt.shared_uplink);
    if (rc) {
        MPI_Comm_free(&b->comm);
        free(b->last_heard);
        free(b->outcome);
        free(b->gone);
        free(b->why);
        free(b);
        return rc;
    }
    *out = b;
    return VKS_OK;
}

void vks_bcast_destroy(vks_bcast *b) {
    if (!b) return;
    vks_link_destroy(b->link);
    for (int i = 0; i < b->n_cached; i++) free(b->cache[i].wire);
    MPI_Comm_free(&b->comm);
    free(b->last_heard);
    free(b->outcome);
    free(b->gone);
    free(b->why);
    free(b);
}

void vks_bcast_drop(vks_bcast *b, int rank) {
    if (!b || b->rank != 0 || rank <= 0 || rank >= b->size) return;
    b->gone[rank] = 1;
    b->outcome[rank] = OUTCOME_SILENT; /* not waited for at vks_bcast_close either */
}

bool vks_bcast_rank_ok(const vks_bcast *b, int rank) {
    return b && b->rank == 0 && rank > 0 && rank < b->size && b->outcome[rank] == OUTCOME_OK;
}

const char *vks_bcast_rank_why(const vks_bcast *b, int rank) {
    return b && b->rank == 0 && rank > 0 && rank < b->size ? b->why[rank] : "";
}

bool vks_bcast_waiting(vks_bcast *b) {
    if (!b || b->rank == 0) return false;
    int flag = 0;
    MPI_Status st;
    vks_link_progress(b->link);
    MPI_Iprobe(0, TAG_MANIFEST, b->comm, &flag, &st);
    return flag != 0;
}

/* ---- small helpers ---- */

double vks_bc_now_s(void) { return MPI_Wtime(); }

void vks_bc_idle(void) { usleep(100); }

/* Open MPI's TCP transport moves bytes only inside MPI calls, so a rank with
 * transfers in flight keeps calling (yielding the core between calls); once
 * nothing has moved for a millisecond it sleeps in short naps instead, so
 * that idle ranks do not take the cores from those hashing or forwarding. */
void vks_bc_pace(double *last_progress, bool progressed) {
    double t = vks_bc_now_s();
    if (progressed) *last_progress = t;
    else if (t - *last_progress < 1e-3) sched_yield();
    else usleep(100);
}

/* Waits for a message (src, tag) while driving the link and the heartbeats;
 * false once src has not been heard from for `timeout` (<= 0: forever). */
bool vks_bc_wait_probe(vks_bcast *b, int src, int tag, double timeout, MPI_Status *st) {
    for (;;) {
        int flag = 0;
        vks_link_progress(b->link);
        vks_bc_beat(b);
        MPI_Iprobe(src, tag, b->comm, &flag, st);
        if (flag) {
            vks_bc_heard(b, src);
            return true;
        }
        if (timeout > 0 && vks_bc_silent_for(b, src) > timeout) return false;
        vks_bc_idle();
    }
}

/* ---- liveness ---- */

static const uint8_t beat_byte = 0;

static void send_beat(vks_bcast *b, int dest) {
    MPI_Request rq;
    if (MPI_Isend(&beat_byte, 1, MPI_BYTE, dest, TAG_BEAT, b->comm, &rq) == MPI_SUCCESS) MPI_Request_free(&rq);
}

void vks_bc_heard(vks_bcast *b, int rank) {
    if (rank >= 0 && rank < b->size) b->last_heard[rank] = vks_bc_now_s();
}

double vks_bc_silent_for(const vks_bcast *b, int rank) { return rank >= 0 && rank < b->size ? vks_bc_now_s() - b->last_heard[rank] : 0; }

void vks_bc_beat(vks_bcast *b) {
    double t = vks_bc_now_s();
    if (t - b->last_beat >= BEAT_S) {
        b->last_beat = t;
        if (b->opt.beat) b->opt.beat(b->opt.beat_ctx);
        if (b->rank != 0) send_beat(b, 0);
        else
            for (int r = 1; r < b->size; r++)
                if (!b->gone[r]) send_beat(b, r);
    }
    for (;;) {
        int flag = 0, count = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_BEAT, b->comm, &flag, &st);
        if (!flag) return;
        uint8_t byte;
        MPI_Get_count(&st, MPI_BYTE, &count);
        MPI_Recv(count == 1 ? &byte : NULL, count == 1 ? 1 : 0, MPI_BYTE, st.MPI_SOURCE, TAG_BEAT, b->comm,
                 MPI_STATUS_IGNORE);
        vks_bc_heard(b, st.MPI_SOURCE);
    }
}

void vks_bcast_keepalive(vks_bcast *b) {
    if (b) vks_bc_beat(b);
}

void vks_bc_fault_point(vks_bcast *b, size_t progress, size_t hold_at) {
    const bcast_fault *f = &b->fault;
    if ((f->kind != FAULT_DIE && f->kind != FAULT_STOP) || f->rank != b->rank || progress < hold_at) return;
    bool stop = f->kind == FAULT_STOP;
    fprintf(stderr, "broadcast: rank %d: fault injection: %s now (pid %ld)\n", b->rank, stop ? "stopping" : "dying",
            (long)getpid());
    fflush(stderr);
    b->fault.kind = FAULT_NONE; /* once */
    raise(stop ? SIGSTOP : SIGKILL);
}

bool vks_bc_recv_i32(vks_bcast *b, const MPI_Status *st, int tag, int32_t *v) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    vks_bc_heard(b, st->MPI_SOURCE);
    if (count == (int)sizeof *v) {
        MPI_Recv(v, (int)sizeof *v, MPI_BYTE, st->MPI_SOURCE, tag, b->comm, MPI_STATUS_IGNORE);
        return true;
    }
    MPI_Recv(NULL, 0, MPI_BYTE, st->MPI_SOURCE, tag, b->comm, MPI_STATUS_IGNORE);
    return false;
}

/* Sends a small buffer through the link and waits for it (bounded). */
void vks_bc_send_small(vks_bcast *b, const void *buf, size_t len, int dest, int tag) {
    vks_link_send *s;
    if (vks_link_isend(b->link, buf, len, dest, tag, &s)) return;
    double deadline = vks_bc_now_s() + b->opt.timeout_s + b->opt.link.latency_ms * 1e-3;
    while (!vks_link_send_done(b->link, s) && vks_bc_now_s() < deadline) vks_bc_idle();
}

uint64_t vks_bc_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
void vks_bc_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}

/* ---- origin ---- */

typedef struct {
    uint8_t *buf;
    vks_link_send *send;
} pending_repair;

/* Answers every REQ waiting: sends the shard again, straight from the origin. */
static int serve_requests(vks_bcast *b, const vks_manifest *m, const uint8_t *wire, pending_repair *rep, int cap,
                          int *n_rep, bool *event) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_REQ, b->comm, &flag, &st);
        if (!flag) return VKS_OK;
        uint8_t req[REPAIR_HEADER];
        int count = 0;
        MPI_Get_count(&st, MPI_BYTE, &count);
        if (count != REPAIR_HEADER) {
            MPI_Recv(NULL, 0, MPI_BYTE, st.MPI_SOURCE, TAG_REQ, b->comm, MPI_STATUS_IGNORE);
            fprintf(stderr, "broadcast: rank %d: malformed shard request (%d bytes) ignored\n", st.MPI_SOURCE, count);
            continue;
        }
        MPI_Recv(req, REPAIR_HEADER, MPI_BYTE, st.MPI_SOURCE, TAG_REQ, b->comm, MPI_STATUS_IGNORE);
        vks_bc_heard(b, st.MPI_SOURCE);
        *event = true;
        uint32_t s = (uint32_t)vks_bc_get_u64(req);
        if (vks_bc_get_u64(req + 8) != m->version || s >= m->n_shards || *n_rep >= cap) {
            fprintf(stderr, "broadcast: rank %d: request for shard %u of version %llu ignored\n", st.MPI_SOURCE, s,
                    (unsigned long long)vks_bc_get_u64(req + 8));
            continue;
        }
        const vks_shard_entry *e = &m->shards[s];
        uint8_t *buf = malloc(REPAIR_HEADER + (size_t)e->wire_size);
        if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        memcpy(buf, req, REPAIR_HEADER);
        memcpy(buf + REPAIR_HEADER, wire + e->wire_offset, e->wire_size);
        pending_repair *p = &rep[(*n_rep)++];
        p->buf = buf;
        int rc = vks_link_isend(b->link, buf, REPAIR_HEADER + (size_t)e->wire_size, st.MPI_SOURCE, TAG_REPAIR, &p->send);
        if (rc) return rc;
    }
}

/* A node reports its parent silent (it turned to the origin): the origin
 * stops waiting for that parent. Only a rank's own tree parent can be
 * reported, so a hostile rank cannot strike out arbitrary ranks. */
static void take_lost_reports(vks_bcast *b, const uint8_t *plan, uint8_t *done, int *finished, bool *event) {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_LOST, b->comm, &flag, &st);
        if (!flag) return;
        int32_t r = -1;
        vks_bc_recv_i32(b, &st, TAG_LOST, &r);
        *event = true;
        if (!plan[st.MPI_SOURCE] || r <= 0 || r >= b->size || !plan[r] ||
            vks_bc_tree_parent(plan, b->size, st.MPI_SOURCE, b->opt.fanout) != r) {
            fprintf(stderr, "broadcast: rank %d: bogus report of a silent parent ignored\n", st.MPI_SOURCE);
            continue;
        }
        if (!done[r]) {
            fprintf(stderr, "broadcast: rank %d reports rank %d silent\n", st.MPI_SOURCE, r);
            done[r] = 2; /* lost */
            b->outcome[r] = OUTCOME_SILENT;
            (*finished)++;
        }
    }
}

/* Receives the probed DONE *st: its status, and the reason that comes with a
 * failure or refusal into why (escaped: another rank's bytes). A malformed
 * one reads as a failure. */
static int32_t recv_done(vks_bcast *b, const MPI_Status *st, char why[WHY_BYTES]) {
    char buf[sizeof(int32_t) + WHY_BYTES];
    int count = 0, r = st->MPI_SOURCE;
    MPI_Get_count(st, MPI_BYTE, &count);
    vks_bc_heard(b, r);
    bool fits = count >= (int)sizeof(int32_t) && count <= (int)sizeof buf - 1;
    MPI_Recv(fits ? buf : NULL, fits ? count : 0, MPI_BYTE, r, TAG_DONE, b->comm, MPI_STATUS_IGNORE);
    int32_t status = DONE_FAILED;
    why[0] = 0;
    if (fits) memcpy(&status, buf, sizeof status);
    if (!fits) snprintf(why, WHY_BYTES, "a malformed DONE (%d bytes)", count);
    else if (status != DONE_OK) vks_escape(buf + sizeof status, (size_t)count - sizeof status, why, WHY_BYTES);
    return fits ? status : DONE_FAILED;
}

/* Collects ACKs for the manifest: plan[r] = 1 for ranks that accepted. */
static void collect_acks(vks_bcast *b, uint8_t *plan, int *refused) {
    int got = 0, expected = 0;
    for (int r = 1; r < b->size; r++) expected += !b->gone[r];
    double deadline = vks_bc_now_s() + b->opt.timeout_s + 2 * b->opt.link.latency_ms * 1e-3;
    while (got < expected && vks_bc_now_s() < deadline) {
        MPI_Status st;
        int flag = 0;
        vks_link_progress(b->link);
        vks_bc_beat(b);
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_ACK, b->comm, &flag, &st);
        if (!flag) {
            vks_bc_idle();
            continue;
        }
        int32_t status = -1;
        vks_bc_recv_i32(b, &st, TAG_ACK, &status);
        if (plan[st.MPI_SOURCE] || st.MPI_SOURCE == 0 || b->gone[st.MPI_SOURCE] ||
            b->outcome[st.MPI_SOURCE] == OUTCOME_REFUSED)
            continue;
        got++;
        if (status == 0) plan[st.MPI_SOURCE] = 1;
        else {
            (*refused)++;
            b->outcome[st.MPI_SOURCE] = OUTCOME_REFUSED;
        }
    }
    for (int r = 1; r < b->size; r++)
        if (!plan[r] && !b->gone[r] && b->outcome[r] != OUTCOME_REFUSED) {
            fprintf(stderr, "broadcast: rank %d did not answer the manifest within %.0fs\n", r, b->opt.timeout_s);
            b->outcome[r] = OUTCOME_SILENT;
        }
}

/* Planned ranks not heard from (heartbeats included) for timeout_s: lost. */
static void strike_silent(vks_bcast *b, const uint8_t *plan, uint8_t *done, int *finished) {
    for (int r = 1; r < b->size; r++)
        if (plan[r] && !done[r] && vks_bc_silent_for(b, r) > b->opt.timeout_s) {
            fprintf(stderr, "broadcast: rank %d silent for %.0fs\n", r, vks_bc_silent_for(b, r));
            done[r] = 2;
            b->outcome[r] = OUTCOME_SILENT;
            (*finished)++;
        }
}

static const char *const outcome_names[] = {"pending", "ok", "failed", "refused", "silent"};

int vks_bc_write_status(vks_bcast *b, bool complete) {
    if (!b->opt.status_out || b->rank != 0) return VKS_OK;
    int n_ok = 0, n_silent = 0;
    for (int r = 1; r < b->size; r++) {
        n_ok += b->outcome[r] == OUTCOME_OK;
        n_silent += b->outcome[r] == OUTCOME_SILENT;
    }
    vks_outfile o;
    int rc = vks_outfile_open(&o, b->opt.status_out, 0644);
    if (rc) return rc;
    fprintf(o.f, "{\"version\":%llu,\"complete\":%s,\"ok\":%s,\"seconds\":%.3f,\"ranks_ok\":%d,"
            "\"ranks_failed\":%d,\"ranks_silent\":%d,\"ranks\":[", (unsigned long long)b->status_version,
            complete ? "true" : "false", complete && n_ok == b->size - 1 ? "true" : "false", b->status_seconds, n_ok,
            b->size - 1 - n_ok, n_silent);
    for (int r = 1; r < b->size; r++) {
        vks_bcast_role role = vks_bcast_role_of(r, b->opt.relays);
        fprintf(o.f, "%s{\"rank\":%d,\"role\":\"%s\",\"outcome\":\"%s\"}", r > 1 ? "," : "", r,
                role == VKS_BCAST_RELAY ? "relay" : "receiver", outcome_names[b->outcome[r] % 5]);
    }
    fputs("]}\n", o.f);
    return vks_outfile_commit(&o);
}

static int send_version(vks_bcast *b, const uint8_t *blob, size_t blob_len, const uint8_t *wire, size_t wire_len,
                        vks_bcast_report *rep, bool *manifest_sent) {
    memset(rep, 0, sizeof *rep);
    vks_manifest m;
    /* the origin parses its own blob; the nodes check the signature */
    int rc = vks_manifest_parse(blob, blob_len, "origin: manifest", &m);
    if (rc) return rc;
    if (wire_len != m.wire_size) {
        vks_manifest_free(&m);
        return vks_set_error(VKS_ERR_ARG, "origin: wire stream is %zu bytes, the manifest says %llu", wire_len,
                             (unsigned long long)m.wire_size);
    }
    double t0 = vks_bc_now_s();
    uint8_t *plan = calloc((size_t)b->size, 1), *have = NULL, *done = calloc((size_t)b->size, 1);
    int max_rep = 4 * (int)m.n_shards * b->size + 16;
    pending_repair *reps = calloc((size_t)max_rep, sizeof *reps);
    chunk_layout lay;
    rc = !plan || !done || !reps ? vks_set_error(VKS_ERR_NOMEM, "out of host memory") : vks_bc_layout_build(&m, b->opt.chunk_bytes, &lay);
    if (rc) goto out;
    plan[0] = 1;
    have = malloc(lay.n + 1);
    if (!have) {
        vks_bc_layout_free(&lay);
        rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        goto out;
    }
    memset(have, 1, lay.n);
    memset(b->outcome, OUTCOME_PENDING, (size_t)b->size);
    memset(b->why, 0, (size_t)b->size * sizeof *b->why);
    int n_gone = 0;
    for (int r = 1; r < b->size; r++)
        if (b->gone[r]) b->outcome[r] = OUTCOME_SILENT, n_gone++;
    b->status_version = m.version;
    b->status_seconds = 0;
    for (int r = 0; r < b->size; r++) b->last_heard[r] = vks_bc_now_s();
    rc = vks_bc_write_status(b, false);
    if (rc) {
        b->status_version = 0; /* no status to update at close */
        vks_bc_layout_free(&lay);
        goto out;
    }
    *manifest_sent = true;
    for (int r = 1; r < b->size; r++) {
        vks_link_send *s;
        if (!b->gone[r]) vks_link_isend(b->link, blob, blob_len, r, TAG_MANIFEST, &s);
    }
    int refused = 0, accepted = 0, n_rep = 0, ok = 0;
    collect_acks(b, plan, &refused);
    for (int r = 1; r < b->size; r++) {
        if (!plan[r]) continue;
        accepted++;
        vks_link_send *s;
        vks_link_isend(b->link, plan, (size_t)b->size, r, TAG_PLAN, &s);
    }
    int children[64];
    int nc = vks_bc_tree_children(plan, b->size, 0, b->opt.fanout, children, 64);
    forwarder fw;
    rc = vks_bc_forwarder_init(&fw, b->link, children, nc, &lay, wire, &b->fault, 0);
    int finished = 0;
    double last_event = vks_bc_now_s(), last_moved = last_event, last_turn = last_event;
    size_t sent_before = 0;
    while (!rc && finished < accepted && vks_bc_now_s() - last_event < 2 * b->opt.timeout_s + 5) {
        if (vks_bc_now_s() - last_turn > b->opt.timeout_s / 2)
            fprintf(stderr, "broadcast: rank 0: this rank stalled for %.0fs (stopped?): the others may have given up on it\n",
                    vks_bc_now_s() - last_turn);
        last_turn = vks_bc_now_s();
        size_t before = vks_bc_forwarder_min_queued(&fw);
        bool event = false;
        rc = vks_bc_forwarder_pump(&fw, have);
        vks_bc_fault_point(b, vks_bc_forwarder_min_queued(&fw), fw.hold_at);
        vks_bc_beat(b);
        if (!rc) rc = serve_requests(b, &m, wire, reps, max_rep, &n_rep, &event);
        take_lost_reports(b, plan, done, &finished, &event);
        strike_silent(b, plan, done, &finished);
        MPI_Status st;
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_DONE, b->comm, &flag, &st);
        if (flag) {
            int r = st.MPI_SOURCE;
            bool counts = plan[r] && !done[r];
            char why[WHY_BYTES];
            int32_t status = recv_done(b, &st, why);
            if (counts) { /* delivered only when the receiver says it took the file */
                done[r] = 1;
                finished++;
                ok += status == DONE_OK;
                refused += status == DONE_REFUSED;
                b->outcome[r] = status == DONE_OK ? OUTCOME_OK : status == DONE_REFUSED ? OUTCOME_REFUSED : OUTCOME_FAILED;
                if (status == DONE_REFUSED) snprintf(b->why[r], WHY_BYTES, "%s", why); /* the caller names it */
                if (status) fprintf(stderr, "broadcast: rank %d %s version %llu: %s\n", r,
                                    status == DONE_REFUSED ? "refused" : "failed to take", (unsigned long long)m.version, why);
            }
            event = true;
        }
        size_t sent = fw.n_children ? fw.done_upto[0] : 0;
        bool moved = event || vks_bc_forwarder_min_queued(&fw) != before || sent != sent_before;
        sent_before = sent;
        if (event || vks_bc_forwarder_min_queued(&fw) != before) last_event = vks_bc_now_s();
        vks_bc_pace(&last_moved, moved);
    }
    int32_t lost = 0;
    for (int r = 1; r < b->size; r++)
        if (plan[r] && done[r] != 1) {
            if (!done[r]) fprintf(stderr, "broadcast: rank %d fell silent\n", r);
            b->outcome[r] = OUTCOME_SILENT;
            lost++;
        }
    double seconds = vks_bc_now_s() - t0;
    for (int r = 1; r < b->size; r++)
        if (plan[r] && done[r] == 1) vks_bc_send_small(b, &lost, sizeof lost, r, TAG_FINISH);
    for (int i = 0; i < n_rep; i++) /* repairs to live ranks are done by now: they sent DONE */
        if (vks_link_send_done(b->link, reps[i].send)) free(reps[i].buf);
    vks_bc_forwarder_free(&fw);
    vks_bc_layout_free(&lay);
    *rep = (vks_bcast_report){.version = m.version, .step = m.step, .file_bytes = m.file_size,
                              .wire_bytes = m.wire_size, .seconds = seconds, .ranks_ok = ok,
                              .ranks_failed = b->size - 1 - ok, .ranks_lost = lost};
    memcpy(rep->file_hash, m.file_hash, VKS_HASH_BYTES);
    memcpy(rep->model_hash, m.model_hash, VKS_HASH_BYTES);
    b->status_seconds = seconds;
    int status_rc = vks_bc_write_status(b, true);
    if (!rc) rc = status_rc;
    int expected = b->size - 1 - n_gone; /* ranks dropped before this send are not waited for */
    if (!rc && ok != expected)
        rc = vks_set_error(refused == expected - ok ? VKS_ERR_FORMAT : VKS_ERR_IO, "origin: %d of %d ranks did not receive version %llu (%d refused it)",
                           expected - ok, expected, (unsigned long long)m.version, refused);
out:
    free(plan);
    free(have);
    free(done);
    free(reps);
    vks_manifest_free(&m);
    return rc;
}

int vks_bcast_send(vks_bcast *b, const uint8_t *blob, size_t blob_len, const uint8_t *wire, size_t wire_len,
                   vks_bcast_report *rep) {
    if (!b || !blob || !wire || !rep || b->rank != 0) return vks_set_error(VKS_ERR_ARG, "broadcast: send from rank 0 only");
    bool manifest_sent = false;
    int rc = send_version(b, blob, blob_len, wire, wire_len, rep, &manifest_sent);
    if (rc && !manifest_sent) vks_bcast_cancel(b); /* the others wait for a manifest that will not come */
    return rc;
}

/* ---- closing handshake ---- */

/* Origin: BYE from every rank not known silent (or until it falls silent),
 * then the status file, then GO (the number of silent ranks) to each. */
static int close_origin(vks_bcast *b, int *lost) {
    uint8_t *said = calloc((size_t)b->size, 1);
    MPI_Request *go = calloc((size_t)b->size, sizeof *go);
    if (!said || !go) {
        free(said);
        free(go);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    int waiting = 0;
    for (int r = 1; r < b->size; r++) waiting += b->outcome[r] != OUTCOME_SILENT;
    double give_up = vks_bc_now_s() + 2 * b->opt.timeout_s + 5; /* even ranks that beat must say BYE by then */
    while (waiting > 0) {
        vks_bc_beat(b);
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_BYE, b->comm, &flag, &st);
        int32_t status = 1;
        if (flag && vks_bc_recv_i32(b, &st, TAG_BYE, &status) && !said[st.MPI_SOURCE] &&
            b->outcome[st.MPI_SOURCE] != OUTCOME_SILENT) {
            said[st.MPI_SOURCE] = 1;
            waiting--;
            if (status != 0 && b->outcome[st.MPI_SOURCE] == OUTCOME_OK) b->outcome[st.MPI_SOURCE] = OUTCOME_FAILED;
        }
        for (int r = 1; r < b->size; r++)
            if (!said[r] && b->outcome[r] != OUTCOME_SILENT && (vks_bc_silent_for(b, r) > b->opt.timeout_s || vks_bc_now_s() > give_up)) {
                if (vks_bc_silent_for(b, r) > b->opt.timeout_s)
                    fprintf(stderr, "broadcast: rank %d silent for %.0fs at the end\n", r, vks_bc_silent_for(b, r));
                else
                    fprintf(stderr, "broadcast: rank %d did not close within %.0fs\n", r, 2 * b->opt.timeout_s + 5);
                b->outcome[r] = OUTCOME_SILENT;
                waiting--;
            }
        if (!flag) usleep(500);
    }
    int32_t *n_lost = &b->bye; /* the GO payload: outlives a send to a rank that stopped */
    *n_lost = 0;
    for (int r = 1; r < b->size; r++) *n_lost += !said[r];
    int rc = b->status_version ? vks_bc_write_status(b, true) : VKS_OK;
    for (int r = 1; r < b->size; r++) {
        go[r] = MPI_REQUEST_NULL;
        if (said[r]) MPI_Isend(n_lost, (int)sizeof *n_lost, MPI_BYTE, r, TAG_GO, b->comm, &go[r]);
    }
    for (double until = vks_bc_now_s() + b->opt.timeout_s;;) { /* small messages: at once, unless a rank stopped */
        int all = 0;
        MPI_Testall(b->size - 1, go + 1, &all, MPI_STATUSES_IGNORE);
        if (all || vks_bc_now_s() > until) break;
        usleep(500);
    }
    *lost = *n_lost;
    free(said);
    free(go); /* requests still pending belong to ranks that stopped; the job ends without them */
    return rc;
}

/* Nodes: BYE to the origin, then GO from it while it lives. */
static int close_node(vks_bcast *b, int status, int *lost) {
    if (b->origin_silent)
        return vks_set_error(VKS_ERR_IO, "rank %d: the origin (rank 0) is silent: leaving without it", b->rank);
    b->bye = status;
    MPI_Request rq;
    if (MPI_Isend(&b->bye, (int)sizeof b->bye, MPI_BYTE, 0, TAG_BYE, b->comm, &rq) == MPI_SUCCESS) MPI_Request_free(&rq);
    for (;;) {
        vks_bc_beat(b);
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(0, TAG_GO, b->comm, &flag, &st);
        int32_t v = -1;
        if (flag) {
            if (!vks_bc_recv_i32(b, &st, TAG_GO, &v) || v < 0 || v >= b->size) v = 1; /* malformed: assume the worst */
            *lost = v;
            return VKS_OK;
        }
        if (vks_bc_silent_for(b, 0) > b->opt.timeout_s) {
            b->origin_silent = true;
            return vks_set_error(VKS_ERR_IO, "rank %d: the origin (rank 0) silent for %.0fs at the end", b->rank,
                                 vks_bc_silent_for(b, 0));
        }
        usleep(500);
    }
}

void vks_bcast_cancel(vks_bcast *b) {
    if (!b || b->rank != 0) return;
    static const uint8_t nothing = 0;
    for (int r = 1; r < b->size; r++) {
        MPI_Request rq;
        if (!b->gone[r] && MPI_Isend(&nothing, 0, MPI_BYTE, r, TAG_MANIFEST, b->comm, &rq) == MPI_SUCCESS) MPI_Request_free(&rq);
    }
}

int vks_bcast_close(vks_bcast *b, int status, int *lost) {
    if (!b || !lost) return vks_set_error(VKS_ERR_ARG, "broadcast: null argument");
    *lost = b->size;
    return b->rank == 0 ? close_origin(b, lost) : close_node(b, status, lost);
}

/* ---- benchmark baselines ---- */

static int p2p_transfer(MPI_Comm comm, int rank, uint8_t *buf, size_t bytes, const vks_link_options *lo, bool shared,
                        size_t chunk) {
    if (rank == 0) {
        vks_link *l;
        int rc = vks_link_create(comm, lo, &l);
        if (rc) return rc;
        vks_link_set_shared_uplink(l, shared);
        vks_link_send *win[SEND_WINDOW] = {0};
        size_t n = (bytes + chunk - 1) / chunk, queued = 0, done = 0;
        while (done < n) {
            vks_link_progress(l);
            while (done < queued && vks_link_send_done(l, win[done % SEND_WINDOW])) done++;
            while (queued < n && queued - done < SEND_WINDOW) {
                size_t off = queued * chunk, len = bytes - off < chunk ? bytes - off : chunk;
                rc = vks_link_isend(l, buf + off, len, 1, TAG_CHUNK, &win[queued % SEND_WINDOW]);
                if (rc) break;
                queued++;
            }
            if (rc) break;
        }
        vks_link_destroy(l);
        return rc;
    }
    if (rank == 1)
        for (size_t off = 0; off < bytes; off += chunk) {
            size_t len = bytes - off < chunk ? bytes - off : chunk;
            MPI_Recv(buf + off, (int)len, MPI_BYTE, 0, TAG_CHUNK, comm, MPI_STATUS_IGNORE);
        }
    return VKS_OK;
}

int vks_bcast_baseline(MPI_Comm comm, const char *kind, size_t bytes, const vks_link_options *link, bool shared_uplink,
                       size_t chunk_bytes, double *seconds) {
    if (!kind || !link || !seconds || bytes == 0 || chunk_bytes == 0 || chunk_bytes > (1u << 30))
        return vks_set_error(VKS_ERR_ARG, "baseline: bad argument");
    bool p2p = !strcmp(kind, "p2p");
    if (!p2p && strcmp(kind, "mpi-bcast")) return vks_set_error(VKS_ERR_ARG, "baseline: unknown kind '%s'", kind);
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    if (size < 2) return vks_set_error(VKS_ERR_ARG, "baseline: needs 2 ranks or more");
    uint8_t *buf = malloc(bytes);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "baseline: out of host memory for %zu bytes", bytes);
    memset(buf, rank == 0 ? 0xab : 0, bytes);
    MPI_Barrier(comm);
    double t0 = MPI_Wtime();
    int rc = VKS_OK;
    if (p2p) {
        rc = p2p_transfer(comm, rank, buf, bytes, link, shared_uplink, chunk_bytes);
    } else {
        for (size_t off = 0; off < bytes; off += (1u << 30)) {
            size_t len = bytes - off < (1u << 30) ? bytes - off : (1u << 30);
            MPI_Bcast(buf + off, (int)len, MPI_BYTE, 0, comm);
        }
    }
    double mine = MPI_Wtime() - t0, slowest = 0;
    MPI_Allreduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, comm);
    *seconds = slowest;
    free(buf);
    return rc;
}
