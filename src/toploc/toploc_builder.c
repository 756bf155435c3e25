/* toploc_builder.c: builds TOPLOC proofs on a worker thread. The generator
 * pushes each committed row as it comes back from the GPU (a bf16 copy);
 * every full chunk of 32 rows becomes a job the worker turns into 258 bytes
 * while the GPU runs the next step. */
#include "vkswarm/vks_toploc.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct job {
    struct job *next;
    int seq, chunk, n_rows;
    uint16_t *rows; /* owned */
} job;

typedef struct {
    uint16_t *chunk;     /* rows being filled */
    int rows_in_chunk, total_rows, n_chunks;
    uint8_t *proofs;     /* written by the worker only */
    size_t proof_cap;
} seq_state;

struct vks_toploc_builder {
    int n_seqs, dim;
    seq_state *seqs;
    pthread_t worker;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    job *head, *tail;
    bool closing, finished, thread_started;
    int error;           /* first worker error (vks code) */
    double busy_s;       /* the worker's time building proofs (written by it until it is joined) */
    char error_msg[256];
};

static size_t chunk_values(const vks_toploc_builder *b) { return (size_t)VKS_TOPLOC_CHUNK_ROWS * (size_t)b->dim; }

static int store_proof(vks_toploc_builder *b, const job *j, const uint8_t proof[VKS_TOPLOC_PROOF_BYTES]) {
    seq_state *s = &b->seqs[j->seq];
    size_t need = (size_t)(j->chunk + 1) * VKS_TOPLOC_PROOF_BYTES;
    if (need > s->proof_cap) {
        size_t cap = s->proof_cap ? s->proof_cap * 2 : 4 * VKS_TOPLOC_PROOF_BYTES;
        while (cap < need) cap *= 2;
        uint8_t *p = realloc(s->proofs, cap);
        if (!p) return vks_set_error(VKS_ERR_NOMEM, "toploc builder: out of host memory");
        s->proofs = p;
        s->proof_cap = cap;
    }
    memcpy(s->proofs + (size_t)j->chunk * VKS_TOPLOC_PROOF_BYTES, proof, VKS_TOPLOC_PROOF_BYTES);
    return VKS_OK;
}

static job *next_job(vks_toploc_builder *b) {
    pthread_mutex_lock(&b->lock);
    while (!b->head && !b->closing) pthread_cond_wait(&b->wake, &b->lock);
    job *j = b->head;
    if (j) {
        b->head = j->next;
        if (!b->head) b->tail = NULL;
    }
    pthread_mutex_unlock(&b->lock);
    return j;
}

static void *worker_main(void *arg) {
    vks_toploc_builder *b = arg;
    for (job *j; (j = next_job(b));) {
        double t0 = vks_seconds_now();
        uint8_t proof[VKS_TOPLOC_PROOF_BYTES];
        int rc = vks_toploc_chunk_proof_bf16(j->rows, j->n_rows, b->dim, proof);
        if (rc == VKS_OK) rc = store_proof(b, j, proof);
        if (rc && !b->error) { /* only the worker writes these until it is joined */
            b->error = rc;
            snprintf(b->error_msg, sizeof b->error_msg, "%s", vks_last_error());
        }
        free(j->rows);
        free(j);
        b->busy_s += vks_seconds_now() - t0;
    }
    return NULL;
}

int vks_toploc_builder_create(int n_seqs, int dim, vks_toploc_builder **out) {
    if (!out || n_seqs < 1 || dim < 1 || dim > (1 << 22))
        return vks_set_error(VKS_ERR_ARG, "toploc builder: %d sequences of dim %d", n_seqs, dim);
    *out = NULL;
    vks_toploc_builder *b = calloc(1, sizeof *b);
    if (!b || !(b->seqs = calloc((size_t)n_seqs, sizeof *b->seqs))) {
        free(b);
        return vks_set_error(VKS_ERR_NOMEM, "toploc builder: out of host memory");
    }
    b->n_seqs = n_seqs;
    b->dim = dim;
    pthread_mutex_init(&b->lock, NULL);
    pthread_cond_init(&b->wake, NULL);
    if (pthread_create(&b->worker, NULL, worker_main, b)) {
        vks_toploc_builder_destroy(b);
        return vks_set_error(VKS_ERR_NOMEM, "toploc builder: cannot start the worker thread");
    }
    b->thread_started = true;
    *out = b;
    return VKS_OK;
}

static int enqueue_chunk(vks_toploc_builder *b, int seq) {
    seq_state *s = &b->seqs[seq];
    job *j = malloc(sizeof *j);
    if (!j) return vks_set_error(VKS_ERR_NOMEM, "toploc builder: out of host memory");
    *j = (job){.seq = seq, .chunk = s->n_chunks++, .n_rows = s->rows_in_chunk, .rows = s->chunk};
    s->chunk = NULL;
    s->rows_in_chunk = 0;
    pthread_mutex_lock(&b->lock);
    if (b->tail) b->tail->next = j;
    else b->head = j;
    b->tail = j;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    return VKS_OK;
}

int vks_toploc_builder_push(vks_toploc_builder *b, int seq, const float *row) {
    if (!b || !row || seq < 0 || seq >= b->n_seqs || b->finished)
        return vks_set_error(VKS_ERR_ARG, "toploc builder: bad push (sequence %d)", seq);
    seq_state *s = &b->seqs[seq];
    if (!s->chunk && !(s->chunk = malloc(chunk_values(b) * sizeof *s->chunk)))
        return vks_set_error(VKS_ERR_NOMEM, "toploc builder: out of host memory");
    uint16_t *dst = s->chunk + (size_t)s->rows_in_chunk * (size_t)b->dim;
    for (int i = 0; i < b->dim; i++) dst[i] = vks_f32_to_bf16(row[i]);
    s->rows_in_chunk++;
    s->total_rows++;
    return s->rows_in_chunk == VKS_TOPLOC_CHUNK_ROWS ? enqueue_chunk(b, seq) : VKS_OK;
}

static void stop_worker(vks_toploc_builder *b) {
    if (!b->thread_started) return;
    pthread_mutex_lock(&b->lock);
    b->closing = true;
    pthread_cond_signal(&b->wake);
    pthread_mutex_unlock(&b->lock);
    pthread_join(b->worker, NULL);
    b->thread_started = false;
}

int vks_toploc_builder_finish(vks_toploc_builder *b) {
    if (!b) return vks_set_error(VKS_ERR_ARG, "toploc builder: NULL");
    int rc = VKS_OK;
    for (int s = 0; s < b->n_seqs && !b->finished && rc == VKS_OK; s++)
        if (b->seqs[s].rows_in_chunk > 0) rc = enqueue_chunk(b, s);
    b->finished = true;
    stop_worker(b);
    if (rc) return rc;
    if (b->error) return vks_set_error(b->error, "%s", b->error_msg);
    return VKS_OK;
}

const uint8_t *vks_toploc_builder_proofs(const vks_toploc_builder *b, int seq, size_t *len) {
    if (len) *len = 0;
    if (!b || !b->finished || b->error || seq < 0 || seq >= b->n_seqs) return NULL;
    if (len) *len = (size_t)b->seqs[seq].n_chunks * VKS_TOPLOC_PROOF_BYTES;
    return b->seqs[seq].proofs;
}

int vks_toploc_builder_rows(const vks_toploc_builder *b, int seq) {
    return b && seq >= 0 && seq < b->n_seqs ? b->seqs[seq].total_rows : 0;
}

int vks_toploc_builder_dim(const vks_toploc_builder *b) { return b ? b->dim : 0; }

double vks_toploc_builder_busy_s(const vks_toploc_builder *b) { return b && b->finished ? b->busy_s : 0; }

void vks_toploc_builder_destroy(vks_toploc_builder *b) {
    if (!b) return;
    stop_worker(b);
    for (job *j = b->head, *next; j; j = next) {
        next = j->next;
        free(j->rows);
        free(j);
    }
    for (int s = 0; s < b->n_seqs; s++) {
        free(b->seqs[s].chunk);
        free(b->seqs[s].proofs);
    }
    pthread_mutex_destroy(&b->lock);
    pthread_cond_destroy(&b->wake);
    free(b->seqs);
    free(b);
}
