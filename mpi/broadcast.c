/* Shardcast roles over MPI: the origin (rank 0) and the nodes (relays and
 * receivers). Protocol, all through vks_link so emulated links apply:
 *   origin -> all     MANIFEST (signed blob)
 *   node -> origin    ACK (int32: 0 accepted, 1 refused)
 *   origin -> accepted PLAN (one byte per rank: takes part or not)
 *   parent -> child   CHUNK (chunks of the wire stream, in order)
 *   node -> origin    REQ (shard to send again) / origin -> node REPAIR
 *   node -> origin    LOST (int32: my parent, silent; I turned to the origin)
 *   node -> origin    DONE (int32 status) / origin -> finished FINISH (int32:
 *                     ranks lost; > 0 tells survivors not to MPI_Finalize)
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
    else return vks_set_error(VKS_ERR_ARG, "fault '%s': unknown kind (corrupt, short, die)", s);
    f->rank = rank;
    f->shard = shard;
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
    MPI_Comm_dup(comm, &b->comm);
    MPI_Comm_set_errhandler(b->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(b->comm, &b->rank);
    MPI_Comm_size(b->comm, &b->size);
    if (b->opt.relays < 0 || b->opt.relays >= b->size) b->opt.relays = b->size > 1 ? b->size - 1 : 0;
    rc = vks_link_create(b->comm, &b->opt.link, &b->link);
    if (!rc) rc = vks_link_set_shared_uplink(b->link, b->opt.shared_uplink);
    if (rc) {
        MPI_Comm_free(&b->comm);
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
    free(b);
}

/* ---- small helpers ---- */

double now_s(void) { return MPI_Wtime(); }

void idle(void) { usleep(100); }

/* Open MPI's TCP transport moves bytes only inside MPI calls, so a rank with
 * transfers in flight keeps calling (yielding the core between calls); once
 * nothing has moved for a millisecond it sleeps in short naps instead, so
 * that idle ranks do not take the cores from those hashing or forwarding. */
void pace(double *last_progress, bool progressed) {
    double t = now_s();
    if (progressed) *last_progress = t;
    else if (t - *last_progress < 1e-3) sched_yield();
    else usleep(100);
}

/* Waits for a message (src, tag) while driving the link; false on timeout
 * (timeout <= 0 waits forever). */
bool wait_probe(vks_bcast *b, int src, int tag, double timeout, MPI_Status *st) {
    double deadline = now_s() + timeout;
    for (;;) {
        int flag = 0;
        vks_link_progress(b->link);
        MPI_Iprobe(src, tag, b->comm, &flag, st);
        if (flag) return true;
        if (timeout > 0 && now_s() > deadline) return false;
        idle();
    }
}

bool recv_i32(vks_bcast *b, const MPI_Status *st, int tag, int32_t *v) {
    int count = 0;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (count == (int)sizeof *v) {
        MPI_Recv(v, (int)sizeof *v, MPI_BYTE, st->MPI_SOURCE, tag, b->comm, MPI_STATUS_IGNORE);
        return true;
    }
    MPI_Recv(NULL, 0, MPI_BYTE, st->MPI_SOURCE, tag, b->comm, MPI_STATUS_IGNORE);
    return false;
}

/* Sends a small buffer through the link and waits for it (bounded). */
void send_small(vks_bcast *b, const void *buf, size_t len, int dest, int tag) {
    vks_link_send *s;
    if (vks_link_isend(b->link, buf, len, dest, tag, &s)) return;
    double deadline = now_s() + b->opt.timeout_s + b->opt.link.latency_ms * 1e-3;
    while (!vks_link_send_done(b->link, s) && now_s() < deadline) idle();
}

uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
void put_u64(uint8_t *p, uint64_t v) {
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
        *event = true;
        uint32_t s = (uint32_t)get_u64(req);
        if (get_u64(req + 8) != m->version || s >= m->n_shards || *n_rep >= cap) {
            fprintf(stderr, "broadcast: rank %d: request for shard %u of version %llu ignored\n", st.MPI_SOURCE, s,
                    (unsigned long long)get_u64(req + 8));
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
        recv_i32(b, &st, TAG_LOST, &r);
        *event = true;
        if (!plan[st.MPI_SOURCE] || r <= 0 || r >= b->size || !plan[r] ||
            tree_parent(plan, b->size, st.MPI_SOURCE, b->opt.fanout) != r) {
            fprintf(stderr, "broadcast: rank %d: bogus report of a silent parent ignored\n", st.MPI_SOURCE);
            continue;
        }
        if (!done[r]) {
            fprintf(stderr, "broadcast: rank %d reports rank %d silent\n", st.MPI_SOURCE, r);
            done[r] = 2; /* lost */
            (*finished)++;
        }
    }
}

/* Collects ACKs for the manifest: plan[r] = 1 for ranks that accepted. */
static void collect_acks(vks_bcast *b, uint8_t *plan, int *refused) {
    int got = 0;
    double deadline = now_s() + b->opt.timeout_s + 2 * b->opt.link.latency_ms * 1e-3;
    while (got < b->size - 1 && now_s() < deadline) {
        MPI_Status st;
        int flag = 0;
        vks_link_progress(b->link);
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_ACK, b->comm, &flag, &st);
        if (!flag) {
            idle();
            continue;
        }
        int32_t status = -1;
        recv_i32(b, &st, TAG_ACK, &status);
        if (plan[st.MPI_SOURCE] || st.MPI_SOURCE == 0) continue;
        got++;
        if (status == 0) plan[st.MPI_SOURCE] = 1;
        else (*refused)++;
    }
}

int vks_bcast_send(vks_bcast *b, const uint8_t *blob, size_t blob_len, const uint8_t *wire, size_t wire_len,
                   vks_bcast_report *rep) {
    if (!b || !blob || !wire || !rep || b->rank != 0) return vks_set_error(VKS_ERR_ARG, "broadcast: send from rank 0 only");
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
    double t0 = now_s();
    uint8_t *plan = calloc((size_t)b->size, 1), *have = NULL, *done = calloc((size_t)b->size, 1);
    int max_rep = 4 * (int)m.n_shards * b->size + 16;
    pending_repair *reps = calloc((size_t)max_rep, sizeof *reps);
    chunk_layout lay;
    rc = !plan || !done || !reps ? vks_set_error(VKS_ERR_NOMEM, "out of host memory") : layout_build(&m, b->opt.chunk_bytes, &lay);
    if (rc) goto out;
    plan[0] = 1;
    have = malloc(lay.n + 1);
    if (!have) {
        layout_free(&lay);
        rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        goto out;
    }
    memset(have, 1, lay.n);
    for (int r = 1; r < b->size; r++) {
        vks_link_send *s;
        vks_link_isend(b->link, blob, blob_len, r, TAG_MANIFEST, &s);
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
    int nc = tree_children(plan, b->size, 0, b->opt.fanout, children, 64);
    forwarder fw;
    rc = forwarder_init(&fw, b->link, children, nc, &lay, wire, &b->fault, 0);
    int finished = 0;
    double last_event = now_s(), last_moved = last_event;
    size_t sent_before = 0;
    while (!rc && finished < accepted && now_s() - last_event < 2 * b->opt.timeout_s + 5) {
        size_t before = forwarder_min_queued(&fw);
        bool event = false;
        rc = forwarder_pump(&fw, have);
        if (!rc) rc = serve_requests(b, &m, wire, reps, max_rep, &n_rep, &event);
        take_lost_reports(b, plan, done, &finished, &event);
        MPI_Status st;
        int flag = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, TAG_DONE, b->comm, &flag, &st);
        if (flag) {
            int32_t status = -1;
            recv_i32(b, &st, TAG_DONE, &status);
            if (plan[st.MPI_SOURCE] && !done[st.MPI_SOURCE]) {
                done[st.MPI_SOURCE] = 1;
                finished++;
                ok += status == 0;
                if (status) fprintf(stderr, "broadcast: rank %d failed\n", st.MPI_SOURCE);
            }
            event = true;
        }
        size_t sent = fw.n_children ? fw.done_upto[0] : 0;
        bool moved = event || forwarder_min_queued(&fw) != before || sent != sent_before;
        sent_before = sent;
        if (event || forwarder_min_queued(&fw) != before) last_event = now_s();
        pace(&last_moved, moved);
    }
    int32_t lost = 0;
    for (int r = 1; r < b->size; r++)
        if (plan[r] && done[r] != 1) {
            if (!done[r]) fprintf(stderr, "broadcast: rank %d fell silent\n", r);
            lost++;
        }
    double seconds = now_s() - t0;
    for (int r = 1; r < b->size; r++)
        if (plan[r] && done[r] == 1) send_small(b, &lost, sizeof lost, r, TAG_FINISH);
    for (int i = 0; i < n_rep; i++) /* repairs to live ranks are done by now: they sent DONE */
        if (vks_link_send_done(b->link, reps[i].send)) free(reps[i].buf);
    forwarder_free(&fw);
    layout_free(&lay);
    *rep = (vks_bcast_report){.version = m.version, .step = m.step, .file_bytes = m.file_size,
                              .wire_bytes = m.wire_size, .seconds = seconds, .ranks_ok = ok,
                              .ranks_failed = b->size - 1 - ok, .ranks_lost = lost};
    memcpy(rep->file_hash, m.file_hash, VKS_HASH_BYTES);
    if (!rc && ok != b->size - 1)
        rc = vks_set_error(refused == b->size - 1 - ok ? VKS_ERR_FORMAT : VKS_ERR_IO, "origin: %d of %d ranks did not receive version %llu (%d refused the manifest)",
                           b->size - 1 - ok, b->size - 1, (unsigned long long)m.version, refused);
out:
    free(plan);
    free(have);
    free(done);
    free(reps);
    vks_manifest_free(&m);
    return rc;
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
