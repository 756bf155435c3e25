/* Shardcast plumbing: chunk layout of the wire stream, the tree over the
 * participating ranks, and the windowed streaming of chunks to children. */
#include <stdlib.h>
#include <string.h>
#include "broadcast_internal.h"

int vks_bc_layout_build(const vks_manifest *m, size_t chunk_bytes, chunk_layout *c) {
    memset(c, 0, sizeof *c);
    if (chunk_bytes == 0) return vks_set_error(VKS_ERR_ARG, "broadcast: chunk size 0");
    size_t n = 0;
    for (uint32_t s = 0; s < m->n_shards; s++) n += (m->shards[s].wire_size + chunk_bytes - 1) / chunk_bytes;
    c->off = malloc(n * sizeof *c->off);
    c->len = malloc(n * sizeof *c->len);
    c->shard = malloc(n * sizeof *c->shard);
    c->first_of_shard = malloc(((size_t)m->n_shards + 1) * sizeof *c->first_of_shard);
    if (!c->off || !c->len || !c->shard || !c->first_of_shard) {
        vks_bc_layout_free(c);
        return vks_set_error(VKS_ERR_NOMEM, "broadcast: out of host memory for %zu chunks", n);
    }
    size_t k = 0;
    for (uint32_t s = 0; s < m->n_shards; s++) {
        c->first_of_shard[s] = k;
        const vks_shard_entry *e = &m->shards[s];
        for (uint64_t at = 0; at < e->wire_size; at += chunk_bytes, k++) {
            uint64_t left = e->wire_size - at;
            c->off[k] = e->wire_offset + at;
            c->len[k] = (uint32_t)(left < chunk_bytes ? left : chunk_bytes);
            c->shard[k] = s;
        }
    }
    c->first_of_shard[m->n_shards] = k;
    c->n = k;
    c->n_shards = m->n_shards;
    return VKS_OK;
}

void vks_bc_layout_free(chunk_layout *c) {
    free(c->off);
    free(c->len);
    free(c->shard);
    free(c->first_of_shard);
    memset(c, 0, sizeof *c);
}

/* Position of rank among the participants, or -1. */
static int position(const uint8_t *plan, int rank) {
    if (!plan[rank]) return -1;
    int pos = 0;
    for (int r = 0; r < rank; r++) pos += plan[r] != 0;
    return pos;
}

static int rank_at(const uint8_t *plan, int size, int pos) {
    for (int r = 0; r < size; r++)
        if (plan[r] && pos-- == 0) return r;
    return -1;
}

int vks_bc_tree_parent(const uint8_t *plan, int size, int rank, int fanout) {
    int pos = position(plan, rank);
    return pos <= 0 ? -1 : rank_at(plan, size, (pos - 1) / fanout);
}

int vks_bc_tree_children(const uint8_t *plan, int size, int rank, int fanout, int *out, int cap) {
    int pos = position(plan, rank), n = 0;
    if (pos < 0) return 0;
    for (int k = 1; k <= fanout && n < cap; k++) {
        int r = rank_at(plan, size, pos * fanout + k);
        if (r < 0) break;
        out[n++] = r;
    }
    return n;
}

int vks_bc_forwarder_init(forwarder *f, vks_link *link, const int *children, int n, const chunk_layout *c, const uint8_t *wire,
                   const bcast_fault *fault, int rank) {
    memset(f, 0, sizeof *f);
    if (n > 64) return vks_set_error(VKS_ERR_ARG, "broadcast: fan-out %d above 64", n);
    f->link = link;
    f->n_children = n;
    memcpy(f->children, children, (size_t)n * sizeof *children);
    f->layout = c;
    f->wire = wire;
    f->damaged_chunk = SIZE_MAX;
    f->hold_at = SIZE_MAX;
    if (fault->rank == rank && (fault->kind == FAULT_DIE || fault->kind == FAULT_STOP)) f->hold_at = c->n / 2;
    if (fault->rank == rank && fault->kind == FAULT_SHORT && c->n && c->len[0] > 1) f->short_first = true;
    if (fault->rank == rank && fault->kind == FAULT_CORRUPT) {
        /* the fault shard is clamped to the last one so small files still see it */
        if (c->n == 0) return VKS_OK;
        size_t k = c->first_of_shard[fault->shard < c->n_shards ? fault->shard : c->n_shards - 1];
        f->damaged = malloc(c->len[k]);
        if (!f->damaged) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        f->damaged_chunk = k;
    }
    return VKS_OK;
}

static int queue_chunk(forwarder *f, int child, size_t k) {
    const chunk_layout *c = f->layout;
    const uint8_t *buf = f->wire + c->off[k];
    size_t len = c->len[k];
    if (k == f->damaged_chunk) {
        memcpy(f->damaged, buf, len);
        f->damaged[len / 2] ^= 0x5a;
        buf = f->damaged;
    }
    if (k == 0 && f->short_first) len--;
    return vks_link_isend(f->link, buf, len, f->children[child], TAG_CHUNK, &f->inflight[child][k % SEND_WINDOW]);
}

int vks_bc_forwarder_pump(forwarder *f, const uint8_t *have) {
    int rc = vks_link_progress(f->link);
    if (rc) return rc;
    size_t n = f->layout->n;
    for (int ch = 0; ch < f->n_children; ch++) {
        while (f->done_upto[ch] < f->next[ch] &&
               vks_link_send_done(f->link, f->inflight[ch][f->done_upto[ch] % SEND_WINDOW]))
            f->done_upto[ch]++;
        while (f->next[ch] < n && f->next[ch] < f->hold_at && f->next[ch] - f->done_upto[ch] < SEND_WINDOW &&
               have[f->next[ch]]) {
            rc = queue_chunk(f, ch, f->next[ch]);
            if (rc) return rc;
            f->next[ch]++;
        }
    }
    return VKS_OK;
}

size_t vks_bc_forwarder_min_queued(const forwarder *f) {
    size_t m = f->layout->n;
    for (int ch = 0; ch < f->n_children; ch++)
        if (f->next[ch] < m) m = f->next[ch];
    return m;
}

bool vks_bc_forwarder_all_done(forwarder *f) {
    for (int ch = 0; ch < f->n_children; ch++)
        if (f->done_upto[ch] < f->layout->n) return false;
    return true;
}

void vks_bc_forwarder_free(forwarder *f) {
    free(f->damaged);
    f->damaged = NULL;
}
