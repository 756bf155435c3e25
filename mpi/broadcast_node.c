/* Shardcast on relays and receivers: accept or refuse the manifest, receive
 * the wire stream from the parent while forwarding it, check every shard,
 * repair from the origin, and (receivers) decode and switch versions. */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "broadcast_internal.h"
#include "vkswarm/vks_mpi.h"

enum { SHARD_INCOMPLETE, SHARD_REQUESTED, SHARD_VERIFIED };

typedef struct {
    vks_bcast *b;
    const vks_manifest *m;
    chunk_layout lay;
    uint8_t *wire, *have, *shard_state, *shard_bad, *req_buf;
    uint32_t *missing;
    vks_link_send **req_send;
    int parent;
    bool parent_dead;
    MPI_Request rq[RECV_WINDOW];
    size_t posted, received, verified;
    double last_parent, last_event;
    int repaired;
    uint64_t bytes;
    forwarder fw;
    /* Chunks come from the parent in order, so each shard's hash is computed
     * as its chunks arrive (stream_ok: every chunk of stream_shard so far
     * went through `stream`); no second pass once the last chunk is in. */
    crypto_generichash_state stream;
    uint32_t stream_shard;
    bool stream_ok;
    /* Receivers of a manifest without deltas: the wire stream is the file.
     * Chunks are written to the (invisible) staging file as they arrive;
     * repaired shards are written again. */
    bool direct;
    int fd;
    bool write_failed;
    int32_t lost_parent; /* TAG_LOST payload (stays valid while it is sent) */
    vks_link_send *lost_send;
} node;

/* ---- manifest acceptance ---- */

/* Receives the manifest blob from the origin; *blob malloc'd. */
static int receive_manifest(vks_bcast *b, uint8_t **blob, size_t *len) {
    MPI_Status st;
    if (!vks_bc_wait_probe(b, 0, TAG_MANIFEST, b->opt.manifest_timeout_s, &st)) {
        b->origin_silent = true;
        return vks_set_error(VKS_ERR_IO, "rank %d: no manifest and no word from the origin (rank 0) for %.0fs", b->rank,
                             b->opt.manifest_timeout_s);
    }
    int count = 0;
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count == 0) { /* vks_bcast_cancel */
        MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_MANIFEST, b->comm, MPI_STATUS_IGNORE);
        return vks_set_error(VKS_ERR_IO, "rank %d: the origin (rank 0) has no version to send (see its message)", b->rank);
    }
    size_t max = VKS_MANIFEST_HEADER_BYTES + (size_t)VKS_SHARD_MAX_COUNT * VKS_MANIFEST_ENTRY_BYTES + VKS_SIGNATURE_BYTES;
    if (count <= 0 || (size_t)count > max) {
        MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_MANIFEST, b->comm, MPI_STATUS_IGNORE);
        return vks_set_error(VKS_ERR_FORMAT, "rank %d: manifest of %d bytes refused", b->rank, count);
    }
    *blob = malloc((size_t)count);
    if (!*blob) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    MPI_Recv(*blob, count, MPI_BYTE, 0, TAG_MANIFEST, b->comm, MPI_STATUS_IGNORE);
    *len = (size_t)count;
    return VKS_OK;
}

/* Signature, no replay, and for receivers the delta base: reads *base. */
static int accept_manifest(vks_bcast *b, const uint8_t *blob, size_t len, vks_manifest *m, uint8_t **base,
                           size_t *base_len) {
    char what[64];
    snprintf(what, sizeof what, "rank %d: manifest", b->rank);
    int rc = vks_manifest_open(blob, len, b->opt.public_key, what, m);
    if (rc) return rc;
    if (b->opt.max_file_bytes && (m->file_size > b->opt.max_file_bytes || m->wire_size > b->opt.max_file_bytes))
        return vks_set_error(VKS_ERR_FORMAT, "rank %d: manifest of a %llu-byte file (%llu on the wire), at most %llu "
                             "expected", b->rank, (unsigned long long)m->file_size, (unsigned long long)m->wire_size,
                             (unsigned long long)b->opt.max_file_bytes);
    uint64_t have = b->latest;
    bool receiver = vks_bcast_role_of(b->rank, b->opt.relays) == VKS_BCAST_RECEIVER;
    if (receiver) {
        if (!b->opt.store_dir) return vks_set_error(VKS_ERR_ARG, "rank %d: receiver without a store directory", b->rank);
        vks_store_sweep(b->opt.store_dir); /* what a transfer killed here left, even if this one is refused */
        if (m->delta) rc = vks_store_read_current(b->opt.store_dir, &have, base, base_len);
        else rc = vks_store_current(b->opt.store_dir, &have);
        if (rc) return rc;
    }
    if (m->version <= have)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d: manifest version %llu is not newer than version %llu held here "
                             "(replayed or stale)", b->rank, (unsigned long long)m->version, (unsigned long long)have);
    if (receiver && m->delta) {
        uint8_t h[VKS_HASH_BYTES];
        if (*base) vks_hash(*base, *base_len, h);
        if (have != m->base_version || !*base || memcmp(h, m->base_hash, VKS_HASH_BYTES))
            return vks_set_error(VKS_ERR_FORMAT, "rank %d: delta against version %llu, this rank holds version %llu%s",
                                 b->rank, (unsigned long long)m->base_version, (unsigned long long)have,
                                 have == m->base_version ? " with other bytes" : "");
    }
    return VKS_OK;
}

/* ---- transfer ---- */

static int request_repair(node *n, uint32_t s) {
    n->shard_state[s] = SHARD_REQUESTED;
    n->repaired++;
    uint8_t *req = n->req_buf + (size_t)s * REPAIR_HEADER;
    vks_bc_put_u64(req, s);
    vks_bc_put_u64(req + 8, n->m->version);
    return vks_link_isend(n->b->link, req, REPAIR_HEADER, 0, TAG_REQ, &n->req_send[s]);
}

/* The shard's wire hash: from the stream when it covered every chunk. */
static bool shard_hash_ok(node *n, uint32_t s) {
    const vks_shard_entry *e = &n->m->shards[s];
    if (!n->stream_ok || n->stream_shard != s) return vks_shard_wire_ok(n->m, s, n->wire + e->wire_offset, e->wire_size);
    uint8_t h[VKS_HASH_BYTES];
    crypto_generichash_final(&n->stream, h, VKS_HASH_BYTES);
    n->stream_ok = false;
    return sodium_memcmp(h, e->wire_hash, VKS_HASH_BYTES) == 0;
}

static int check_shard(node *n, uint32_t s) {
    if (!n->shard_bad[s] && shard_hash_ok(n, s)) {
        n->shard_state[s] = SHARD_VERIFIED;
        n->verified++;
        return VKS_OK;
    }
    fprintf(stderr, "broadcast: rank %d: shard %u from rank %d fails its hash, asking the origin\n", n->b->rank, s,
            n->parent);
    return request_repair(n, s);
}

/* Writes wire bytes [off, off+len) to the staging file (direct receivers). */
static void write_through(node *n, uint64_t off, size_t len) {
    if (n->fd < 0 || n->write_failed) return;
    for (size_t done = 0; done < len;) {
        ssize_t w = pwrite(n->fd, n->wire + off + done, len - done, (off_t)(off + done));
        if (w <= 0) {
            if (w < 0 && errno == EINTR) continue;
            n->write_failed = true;
            return;
        }
        done += (size_t)w;
    }
}

/* Hashes (shard stream) and writes (direct receivers) a chunk that just arrived. */
static void stream_chunk(node *n, size_t k, bool bad) {
    uint32_t s = n->lay.shard[k];
    const uint8_t *p = n->wire + n->lay.off[k];
    if (k == n->lay.first_of_shard[s]) {
        crypto_generichash_init(&n->stream, NULL, 0, VKS_HASH_BYTES);
        n->stream_shard = s;
        n->stream_ok = true;
    }
    if (bad || n->stream_shard != s) n->stream_ok = false;
    if (n->stream_ok) crypto_generichash_update(&n->stream, p, n->lay.len[k]);
    if (n->direct) write_through(n, n->lay.off[k], n->lay.len[k]);
}

static int chunk_arrived(node *n, size_t k, bool bad) {
    uint32_t s = n->lay.shard[k];
    n->have[k] = 1;
    n->bytes += n->lay.len[k];
    if (bad) n->shard_bad[s] = 1;
    stream_chunk(n, k, bad);
    if (--n->missing[s] == 0 && n->shard_state[s] == SHARD_INCOMPLETE) return check_shard(n, s);
    return VKS_OK;
}

/* Keeps RECV_WINDOW receives posted from the parent and takes completed ones in order. */
static int poll_parent(node *n) {
    if (n->parent_dead) return VKS_OK;
    while (n->posted < n->lay.n && n->posted < n->fw.hold_at && n->posted - n->received < RECV_WINDOW) {
        size_t k = n->posted++;
        MPI_Irecv(n->wire + n->lay.off[k], (int)n->lay.len[k], MPI_BYTE, n->parent, TAG_CHUNK, n->b->comm,
                  &n->rq[k % RECV_WINDOW]);
    }
    while (n->received < n->posted) {
        size_t k = n->received;
        int flag = 0, count = -1;
        MPI_Status st;
        int err = MPI_Test(&n->rq[k % RECV_WINDOW], &flag, &st);
        if (err == MPI_SUCCESS && !flag) break;
        if (err == MPI_SUCCESS) MPI_Get_count(&st, MPI_BYTE, &count);
        bool bad = err != MPI_SUCCESS || count != (int)n->lay.len[k];
        if (bad)
            fprintf(stderr, "broadcast: rank %d: chunk %zu from rank %d has the wrong length (%d, expected %u)\n",
                    n->b->rank, k, n->parent, count, n->lay.len[k]);
        n->received++;
        n->last_parent = n->last_event = vks_bc_now_s();
        int rc = chunk_arrived(n, k, bad);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* The parent fell silent: cancel its receives, ask the origin for the rest. */
static int fail_over(node *n) {
    fprintf(stderr, "broadcast: rank %d: relay %d silent for %.0fs, turning to the origin\n", n->b->rank, n->parent,
            n->b->opt.timeout_s);
    n->parent_dead = true;
    n->lost_parent = n->parent;
    vks_link_isend(n->b->link, &n->lost_parent, sizeof n->lost_parent, 0, TAG_LOST, &n->lost_send);
    for (size_t k = n->received; k < n->posted; k++) {
        /* A receive the dead rank had started cannot always be cancelled
         * (Open MPI keeps it matched): give it a moment, then abandon it.
         * Its shard is fetched again from the origin below either way. */
        MPI_Request *r = &n->rq[k % RECV_WINDOW];
        MPI_Status st;
        int flag = 0, cancelled = 0;
        MPI_Cancel(r);
        for (double until = vks_bc_now_s() + 0.1; !flag && vks_bc_now_s() < until;) MPI_Test(r, &flag, &st);
        if (flag) MPI_Test_cancelled(&st, &cancelled);
        if (flag && !cancelled) chunk_arrived(n, k, true);
    }
    for (uint32_t s = 0; s < n->m->n_shards; s++)
        if (n->shard_state[s] == SHARD_INCOMPLETE) {
            int rc = request_repair(n, s);
            if (rc) return rc;
        }
    return VKS_OK;
}

/* Takes a REPAIR from the origin: checked, then copied into place. */
static int poll_repair(node *n) {
    MPI_Status st;
    int flag = 0, count = 0;
    MPI_Iprobe(0, TAG_REPAIR, n->b->comm, &flag, &st);
    if (!flag) return VKS_OK;
    MPI_Get_count(&st, MPI_BYTE, &count);
    uint8_t *buf = count >= REPAIR_HEADER && (uint64_t)count <= REPAIR_HEADER + (uint64_t)n->m->shard_size
                       ? malloc((size_t)count) : NULL;
    if (!buf) {
        MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_REPAIR, n->b->comm, MPI_STATUS_IGNORE);
        return vks_set_error(VKS_ERR_IO, "rank %d: repair message of %d bytes from the origin refused", n->b->rank, count);
    }
    MPI_Recv(buf, count, MPI_BYTE, 0, TAG_REPAIR, n->b->comm, MPI_STATUS_IGNORE);
    n->last_event = vks_bc_now_s();
    vks_bc_heard(n->b, 0);
    uint64_t s = vks_bc_get_u64(buf);
    size_t len = (size_t)count - REPAIR_HEADER;
    int rc = VKS_OK;
    if (vks_bc_get_u64(buf + 8) != n->m->version || s >= n->m->n_shards || n->shard_state[s] != SHARD_REQUESTED ||
        !vks_shard_wire_ok(n->m, (uint32_t)s, buf + REPAIR_HEADER, len)) {
        rc = vks_set_error(VKS_ERR_IO, "rank %d: repair of shard %llu from the origin is not the signed shard",
                           n->b->rank, (unsigned long long)s);
    } else {
        memcpy(n->wire + n->m->shards[s].wire_offset, buf + REPAIR_HEADER, len);
        write_through(n, n->m->shards[s].wire_offset, len);
        for (size_t k = n->lay.first_of_shard[s]; k < n->lay.first_of_shard[s + 1]; k++)
            if (!n->have[k]) {
                n->have[k] = 1;
                n->bytes += n->lay.len[k];
            }
        n->shard_state[s] = SHARD_VERIFIED;
        n->verified++;
    }
    free(buf);
    return rc;
}

static void maybe_fault(node *n) {
    vks_bc_fault_point(n->b, n->fw.n_children ? vks_bc_forwarder_min_queued(&n->fw) : n->received, n->fw.hold_at);
}

/* The origin sends a heartbeat every second: silence means it is gone. */
static int check_origin(node *n) {
    vks_bcast *b = n->b;
    if (vks_bc_silent_for(b, 0) <= b->opt.timeout_s) return VKS_OK;
    b->origin_silent = true;
    return vks_set_error(VKS_ERR_IO, "rank %d: the origin (rank 0) silent for %.0fs with %zu of %u shards verified",
                         b->rank, vks_bc_silent_for(b, 0), n->verified, n->m->n_shards);
}

/* Receives until every shard is verified. */
static int transfer(node *n) {
    const vks_bcast_options *o = &n->b->opt;
    double last_report = 0, last_moved = vks_bc_now_s();
    n->last_parent = n->last_event = vks_bc_now_s();
    while (n->verified < n->m->n_shards) {
        size_t before = n->received + n->verified, queued = n->fw.n_children ? n->fw.done_upto[0] : 0;
        int rc = poll_parent(n);
        if (!rc) rc = poll_repair(n);
        if (!rc) rc = vks_bc_forwarder_pump(&n->fw, n->have);
        if (rc) return rc;
        maybe_fault(n);
        vks_bc_beat(n->b);
        rc = check_origin(n);
        if (rc) return rc;
        double t = vks_bc_now_s();
        if (!n->parent_dead && n->parent != 0 && n->received < n->lay.n && t - n->last_parent > o->timeout_s) {
            rc = fail_over(n);
            if (rc) return rc;
        }
        if (t - n->last_event > 3 * o->timeout_s)
            return vks_set_error(VKS_ERR_IO, "rank %d: origin silent for %.0fs with %zu of %u shards verified",
                                 n->b->rank, t - n->last_event, n->verified, n->m->n_shards);
        if (o->progress && t - last_report > 0.25) {
            o->progress(o->progress_ctx, n->bytes, n->m->wire_size);
            last_report = t;
        }
        size_t queued_now = n->fw.n_children ? n->fw.done_upto[0] : 0;
        vks_bc_pace(&last_moved, n->received + n->verified != before || queued_now != queued);
    }
    if (o->progress) o->progress(o->progress_ctx, n->m->wire_size, n->m->wire_size);
    return VKS_OK;
}

/* Direct receivers: the staging file the chunks are written to. */
static int open_staging(node *n) {
    char path[4096];
    int rc = vks_store_stage(n->b->opt.store_dir, n->m->version, path, sizeof path);
    if (rc) return rc;
    n->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (n->fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot create (%s)", path, strerror(errno));
    return VKS_OK;
}

static int node_init(node *n, vks_bcast *b, const vks_manifest *m, const uint8_t *plan) {
    memset(n, 0, sizeof *n);
    n->b = b;
    n->m = m;
    n->fd = -1;
    n->direct = vks_bcast_role_of(b->rank, b->opt.relays) == VKS_BCAST_RECEIVER && m->delta == VKS_DELTA_NONE;
    if (n->direct) {
        int rc = open_staging(n);
        if (rc) return rc;
    }
    int rc = vks_bc_layout_build(m, b->opt.chunk_bytes, &n->lay);
    if (rc) return rc;
    n->wire = malloc(m->wire_size);
    n->have = calloc(n->lay.n + 1, 1);
    n->shard_state = calloc(m->n_shards, 1);
    n->shard_bad = calloc(m->n_shards, 1);
    n->req_buf = calloc(m->n_shards, REPAIR_HEADER);
    n->missing = calloc(m->n_shards, sizeof *n->missing);
    n->req_send = calloc(m->n_shards, sizeof *n->req_send);
    if (!n->wire || !n->have || !n->shard_state || !n->shard_bad || !n->req_buf || !n->missing || !n->req_send)
        return vks_set_error(VKS_ERR_NOMEM, "rank %d: out of host memory for %llu bytes", b->rank,
                             (unsigned long long)m->wire_size);
    for (uint32_t s = 0; s < m->n_shards; s++)
        n->missing[s] = (uint32_t)(n->lay.first_of_shard[s + 1] - n->lay.first_of_shard[s]);
    n->parent = vks_bc_tree_parent(plan, b->size, b->rank, b->opt.fanout);
    int children[64];
    int nc = vks_bc_tree_children(plan, b->size, b->rank, b->opt.fanout, children, 64);
    return vks_bc_forwarder_init(&n->fw, b->link, children, nc, &n->lay, n->wire, &b->fault, b->rank);
}

/* Frees what the node owns; the wire buffer only when no send still reads it. */
static void node_free(node *n, bool keep_wire) {
    bool req_left = false;
    for (uint32_t s = 0; n->req_send && s < n->m->n_shards; s++)
        if (n->req_send[s] && !vks_link_send_done(n->b->link, n->req_send[s])) req_left = true;
    if (n->lost_send && !vks_link_send_done(n->b->link, n->lost_send)) req_left = true; /* keeps req_buf too */
    bool sends_left = !vks_bc_forwarder_all_done(&n->fw);
    vks_bc_forwarder_free(&n->fw);
    if (!keep_wire && !sends_left) free(n->wire);
    free(n->have);
    free(n->shard_state);
    free(n->shard_bad);
    if (!req_left) free(n->req_buf); /* else a send to a dead rank may still read it */
    free(n->missing);
    free(n->req_send);
    vks_bc_layout_free(&n->lay);
    if (n->fd >= 0) close(n->fd);
    n->fd = -1;
}

/* ---- receivers: decode, check, switch ---- */

/* Manifests without deltas: every shard is verified and already written to
 * the staging file; make it durable and switch. No whole-file hash pass:
 * the parser made sure the shards tile the file and that each raw shard's
 * data hash is its wire hash, so the verified shards are the signed file
 * (the file hash is implied; a pass would cost a core-second per GiB). */
static int finish_direct(node *n) {
    vks_bcast *b = n->b;
    const vks_manifest *m = n->m;
    int rc = VKS_OK;
    if (n->write_failed || fsync(n->fd) != 0)
        rc = vks_set_error(VKS_ERR_IO, "rank %d: %s: writing version %llu failed (%s)", b->rank, b->opt.store_dir,
                           (unsigned long long)m->version, strerror(errno));
    if (close(n->fd) != 0 && !rc)
        rc = vks_set_error(VKS_ERR_IO, "rank %d: %s: closing version %llu failed", b->rank, b->opt.store_dir,
                           (unsigned long long)m->version);
    n->fd = -1;
    if (!rc) rc = vks_store_commit(b->opt.store_dir, m->version, b->opt.keep_versions);
    return rc;
}

static int decode_and_store(vks_bcast *b, const vks_manifest *m, const uint8_t *wire, const uint8_t *base,
                            size_t base_len) {
    uint8_t *out = malloc(m->file_size);
    if (!out) return vks_set_error(VKS_ERR_NOMEM, "rank %d: out of host memory", b->rank);
    int rc = VKS_OK;
    for (uint32_t s = 0; s < m->n_shards && !rc; s++) {
        uint64_t off;
        uint32_t len;
        vks_shard_range(m, s, &off, &len);
        rc = vks_shard_decode(m, s, wire + m->shards[s].wire_offset, base, base_len, out + off);
    }
    uint8_t h[VKS_HASH_BYTES];
    if (!rc) {
        vks_hash(out, m->file_size, h);
        if (memcmp(h, m->file_hash, VKS_HASH_BYTES))
            rc = vks_set_error(VKS_ERR_FORMAT, "rank %d: assembled file does not match the signed file hash", b->rank);
    }
    if (!rc) rc = vks_store_write(b->opt.store_dir, m->version, out, m->file_size);
    if (!rc) rc = vks_store_commit(b->opt.store_dir, m->version, b->opt.keep_versions);
    if (rc) vks_store_abort(b->opt.store_dir, m->version);
    free(out);
    return rc;
}

static void cache_version(vks_bcast *b, uint64_t version, uint8_t *wire) {
    if (b->n_cached == b->opt.keep_versions) {
        free(b->cache[0].wire);
        memmove(b->cache, b->cache + 1, (size_t)(b->n_cached - 1) * sizeof b->cache[0]);
        b->n_cached--;
    }
    b->cache[b->n_cached].version = version;
    b->cache[b->n_cached].wire = wire;
    b->n_cached++;
}

/* After DONE: keep forwarding to children until the origin says FINISH,
 * which carries the number of ranks that fell silent. Returns that number
 * (1 when the origin itself is silent). */
static int wait_finish(node *n, double elapsed) {
    vks_bcast *b = n->b;
    double deadline = vks_bc_now_s() + 3 * b->opt.timeout_s + 2 * elapsed;
    int32_t lost = 1;
    double last_moved = vks_bc_now_s();
    for (;;) {
        int flag = 0;
        MPI_Status st;
        size_t sent = n->fw.n_children ? n->fw.done_upto[0] : 0;
        vks_bc_forwarder_pump(&n->fw, n->have);
        bool moved = (n->fw.n_children ? n->fw.done_upto[0] : 0) != sent;
        vks_bc_beat(b);
        MPI_Iprobe(0, TAG_FINISH, b->comm, &flag, &st);
        if (flag) {
            if (!vks_bc_recv_i32(b, &st, TAG_FINISH, &lost) || lost < 0 || lost >= b->size)
                lost = 1; /* malformed: assume the worst */
            break;
        }
        if (vks_bc_now_s() > deadline || vks_bc_silent_for(b, 0) > b->opt.timeout_s) {
            fprintf(stderr, "broadcast: rank %d: no FINISH from the origin (rank 0), silent for %.0fs: leaving\n",
                    b->rank, vks_bc_silent_for(b, 0));
            b->origin_silent = vks_bc_silent_for(b, 0) > b->opt.timeout_s;
            break;
        }
        /* children still fed: keep MPI progressing; else only the FINISH is awaited */
        if (vks_bc_forwarder_all_done(&n->fw)) usleep(500);
        else vks_bc_pace(&last_moved, moved);
    }
    /* FINISH comes once every live rank said DONE, so the children have it
     * all; sends to a child that died never complete: no drain then. */
    double drain = vks_bc_now_s() + b->opt.timeout_s;
    while (lost == 0 && !vks_bc_forwarder_all_done(&n->fw) && vks_bc_now_s() < drain) {
        size_t sent = n->fw.done_upto[0];
        vks_bc_forwarder_pump(&n->fw, n->have);
        vks_bc_beat(b);
        vks_bc_pace(&last_moved, n->fw.done_upto[0] != sent);
    }
    return lost;
}

static int receive_plan(vks_bcast *b, uint8_t *plan) {
    MPI_Status st;
    int count = 0;
    /* The origin sends the plan once every rank has answered the manifest or
     * timeout_s has passed: while it waits on a dead rank its own beats can
     * stall too (seen: Open MPI's failing TCP connects to the dead rank), so
     * a live receiver must outwait that wait, or both give up together and the
     * origin counts the live rank as failed. */
    if (!vks_bc_wait_probe(b, 0, TAG_PLAN, 2 * b->opt.timeout_s + 2 * b->opt.link.latency_ms * 1e-3, &st)) {
        b->origin_silent = true;
        return vks_set_error(VKS_ERR_IO, "rank %d: no transfer plan from the origin (rank 0), silent for %.0fs", b->rank,
                             vks_bc_silent_for(b, 0));
    }
    MPI_Get_count(&st, MPI_BYTE, &count);
    if (count != b->size) {
        MPI_Recv(NULL, 0, MPI_BYTE, 0, TAG_PLAN, b->comm, MPI_STATUS_IGNORE);
        return vks_set_error(VKS_ERR_IO, "rank %d: malformed plan (%d bytes for %d ranks)", b->rank, count, b->size);
    }
    MPI_Recv(plan, count, MPI_BYTE, 0, TAG_PLAN, b->comm, MPI_STATUS_IGNORE);
    if (!plan[0] || !plan[b->rank]) return vks_set_error(VKS_ERR_IO, "rank %d: left out of the transfer", b->rank);
    vks_test_point("plan"); /* tests: a rank that lags behind the others from here */
    return VKS_OK;
}

/* The caller's check of a version just switched to (vks_bcast_options.accept). */
static int accept_file(vks_bcast *b, const vks_bcast_report *rep) {
    char path[4300];
    int rc = vks_store_path(b->opt.store_dir, rep->version, path, sizeof path);
    return rc ? rc : b->opt.accept(b->opt.accept_ctx, path, rep);
}

/* DONE to the origin: the status, and the reason of a failure or refusal. */
static void send_done(vks_bcast *b, int32_t status, const char *why) {
    char buf[sizeof status + WHY_BYTES];
    size_t len = status == DONE_OK ? 0 : strnlen(why, WHY_BYTES - 1);
    memcpy(buf, &status, sizeof status);
    memcpy(buf + sizeof status, why, len);
    vks_bc_send_small(b, buf, sizeof status + len, 0, TAG_DONE);
}

int vks_bcast_receive(vks_bcast *b, vks_bcast_report *rep) {
    if (!b || !rep || b->rank == 0) return vks_set_error(VKS_ERR_ARG, "broadcast: receive on ranks other than 0");
    memset(rep, 0, sizeof *rep);
    uint8_t *blob = NULL, *base = NULL, *plan = NULL;
    size_t blob_len = 0, base_len = 0;
    vks_manifest m = {0};
    vks_bc_heard(b, 0); /* the origin's silence counts from here */
    b->origin_silent = false;
    int rc = receive_manifest(b, &blob, &blob_len);
    if (rc) return rc;
    double t0 = vks_bc_now_s();
    rc = accept_manifest(b, blob, blob_len, &m, &base, &base_len);
    int32_t status = rc ? 1 : 0;
    char err[512];
    snprintf(err, sizeof err, "%s", vks_last_error());
    vks_bc_send_small(b, &status, sizeof status, 0, TAG_ACK);
    free(blob);
    if (rc) {
        vks_manifest_free(&m);
        free(base);
        return vks_set_error(rc, "%s", err);
    }
    plan = malloc((size_t)b->size);
    rc = plan ? receive_plan(b, plan) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    node n = {0};
    bool have_node = false;
    if (!rc) {
        rc = node_init(&n, b, &m, plan);
        have_node = true;
    }
    if (!rc) rc = transfer(&n);
    bool receiver = vks_bcast_role_of(b->rank, b->opt.relays) == VKS_BCAST_RECEIVER;
    if (!rc && receiver) rc = n.direct ? finish_direct(&n) : decode_and_store(b, &m, n.wire, base, base_len);
    if (rc && have_node && n.direct) {
        if (n.fd >= 0) close(n.fd);
        n.fd = -1;
        vks_store_abort(b->opt.store_dir, m.version);
    }
    double t_done = vks_bc_now_s(); /* verified, written, switched */
    *rep = (vks_bcast_report){.version = m.version, .step = m.step, .file_bytes = m.file_size,
                              .wire_bytes = m.wire_size, .seconds = t_done - t0,
                              .repaired_shards = n.repaired, .failovers = n.parent_dead};
    memcpy(rep->file_hash, m.file_hash, VKS_HASH_BYTES);
    memcpy(rep->model_hash, m.model_hash, VKS_HASH_BYTES);
    status = rc ? DONE_FAILED : DONE_OK;
    if (!rc && receiver && b->opt.accept && (rc = accept_file(b, rep))) status = DONE_REFUSED;
    snprintf(err, sizeof err, "%s", rc ? vks_last_error() : "");
    bool origin_there = !b->origin_silent;
    if (origin_there) send_done(b, status, err);
    int lost = have_node && origin_there ? wait_finish(&n, vks_bc_now_s() - t0) : 0;
    bool keep = !rc && !receiver;
    if (!rc) {
        b->latest = m.version;
        if (keep) cache_version(b, m.version, n.wire);
    } else memset(rep, 0, sizeof *rep);
    rep->ranks_lost = lost;
    rep->failovers = n.parent_dead;
    if (have_node) node_free(&n, keep);
    vks_manifest_free(&m);
    free(base);
    free(plan);
    if (rc) return vks_set_error(rc, "%s", err);
    return VKS_OK;
}
