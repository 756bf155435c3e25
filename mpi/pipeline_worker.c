/* GPU worker thread of a pipeline rank (see pipeline_worker.h). */
#include "pipeline_worker.h"
#include "pipeline_fault.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

void vks_job_free(vks_job *j) {
    if (!j) return;
    free(j->in);
    free(j->out);
    free(j);
}

/* Copies the incoming message's rows into the engine's input layout. */
static void unpack_rows(const vks_worker *w, const void *msg, uint32_t dim) {
    const vks_msg_header *h = msg;
    const vks_row_meta *meta = vks_msg_meta(msg);
    for (uint32_t r = 0; r < h->n_rows; r++) {
        w->slot[r] = meta[r].slot;
        w->pos[r] = meta[r].pos;
    }
    size_t n = (size_t)h->n_rows * dim;
    if (h->wire == VKS_WIRE_F16) {
        const uint16_t *src = vks_msg_rows(msg);
        for (size_t i = 0; i < n; i++) w->x_in[i] = vks_f16_to_f32(src[i]);
    } else {
        memcpy(w->x_in, vks_msg_rows(msg), n * sizeof(float));
    }
}

static void *alloc_msg(uint32_t type, uint32_t mb, uint32_t n_rows, uint32_t n_out, uint32_t dim, uint32_t wire,
                       size_t *bytes) {
    *bytes = vks_msg_size(type, n_rows, n_out, dim, wire);
    vks_msg_header *h = *bytes ? malloc(*bytes) : NULL;
    if (h) *h = (vks_msg_header){VKS_MSG_MAGIC, type, mb, n_rows, n_out, dim, wire, 0};
    return h;
}

/* ACT for the next stage: same rows and out rows, the residual stream after our layers. */
static int pack_act(vks_worker *w, vks_job *j, const vks_forward_batch *b, uint32_t n_out, const vks_row_meta *meta,
                    const uint32_t *out_rows, uint32_t dim) {
    uint32_t n_rows = (uint32_t)b->n_rows;
    j->out = alloc_msg(VKS_MSG_ACT, j->mb, n_rows, n_out, dim, (uint32_t)w->wire, &j->out_bytes);
    if (!j->out) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (b->matmul_kind == VKS_MATMUL_PREFILL) ((vks_msg_header *)j->out)->flags = VKS_MSG_PREFILL;
    memcpy((void *)vks_msg_meta(j->out), meta, sizeof(vks_row_meta) * n_rows);
    memcpy((void *)vks_msg_out_rows(j->out), out_rows, 4 * (size_t)n_out);
    size_t n = (size_t)n_rows * dim;
    if (w->wire == VKS_WIRE_F16) {
        uint16_t *dst = (uint16_t *)vks_msg_rows(j->out);
        for (size_t i = 0; i < n; i++) dst[i] = vks_f32_to_f16(w->x_out[i]);
    } else {
        memcpy((void *)vks_msg_rows(j->out), w->x_out, n * sizeof(float));
    }
    return VKS_OK;
}

static int pack_tokens(vks_worker *w, vks_job *j, uint32_t n_out) {
    j->out = alloc_msg(VKS_MSG_TOKENS, j->mb, 0, n_out, 0, 0, &j->out_bytes);
    if (!j->out) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    memcpy((void *)vks_msg_tokens(j->out), w->sampled, 4 * (size_t)n_out);
    return VKS_OK;
}

/* The sampled tokens' log-probabilities, by sequence and position (rank 0
 * knows which position's token each generated id is). */
static void record_logp(vks_worker *w, const vks_forward_batch *b, const vks_row_meta *meta, const uint32_t *out_rows,
                        uint32_t n_out) {
    int V = vks_engine_config(w->engine)->vocab_size;
    for (uint32_t i = 0; i < n_out; i++) {
        const vks_row_meta *rm = &meta[out_rows[i]];
        int32_t tok = b->sampled[i];
        if (rm->seq >= (uint32_t)w->logp_seqs || rm->pos >= (uint32_t)w->logp_steps || tok < 0 || tok >= V) continue;
        w->logp_by_pos[(size_t)rm->seq * (size_t)w->logp_steps + rm->pos] = w->step_logp[i];
    }
}

/* Stage commitment: the output rows at the sampling positions, as the next
 * stage receives them (f16 on an f16 wire). */
static int commit_sent_rows(vks_worker *w, const vks_row_meta *meta, const uint32_t *out_rows, uint32_t n_out,
                            uint32_t dim) {
    double t0 = vks_seconds_now();
    int rc = VKS_OK;
    for (uint32_t i = 0; rc == VKS_OK && i < n_out; i++) {
        const float *row = w->x_out + (size_t)out_rows[i] * dim;
        if (w->wire == VKS_WIRE_F16) {
            for (uint32_t k = 0; k < dim; k++) w->hidden[k] = vks_f16_to_f32(vks_f32_to_f16(row[k]));
            row = w->hidden;
        }
        rc = vks_toploc_builder_push(w->stage_builder, (int)meta[out_rows[i]].seq, row);
    }
    w->commit_s += vks_seconds_now() - t0;
    return rc;
}

static int run_job(vks_worker *w, vks_job *j) {
    uint32_t dim = (uint32_t)vks_engine_config(w->engine)->dim;
    vks_forward_batch b = {0};
    vks_row_meta *meta = NULL;
    const uint32_t *out_rows;
    uint32_t n_out;
    if (w->first_stage) {
        const vks_step *st = j->step;
        b = vks_step_batch(st, NULL, NULL);
        b.n_out = 0; /* the output rows and their sampling belong to the last stage (below) */
        b.out_rows = NULL;
        b.sample = NULL;
        out_rows = st->out_rows;
        n_out = (uint32_t)st->n_out;
        meta = malloc(sizeof *meta * (size_t)st->n_rows);
        if (!meta) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        for (int r = 0; r < st->n_rows; r++) meta[r] = (vks_row_meta){st->slot[r], st->pos[r], st->seq[r]};
    } else {
        const vks_msg_header *h = j->in;
        unpack_rows(w, j->in, dim);
        b = (vks_forward_batch){.n_rows = (int)h->n_rows, .x_in = w->x_in, .slot = w->slot, .pos = w->pos,
                                .matmul_kind = h->flags & VKS_MSG_PREFILL ? VKS_MATMUL_PREFILL : VKS_MATMUL_DECODE};
        out_rows = vks_msg_out_rows(j->in);
        n_out = h->n_out;
    }
    const vks_row_meta *row_meta = meta ? meta : vks_msg_meta(j->in);
    if (w->last_stage) {
        for (uint32_t i = 0; i < n_out; i++) {
            const vks_row_meta *rm = &row_meta[out_rows[i]];
            w->sample[i] = vks_sched_sample_row(w->sched, rm->seq, rm->pos);
        }
        b.n_out = (int)n_out;
        b.out_rows = out_rows;
        b.sample = w->sample;
        b.sampled = w->sampled;
        b.hidden = w->builder ? w->hidden : NULL;
        b.sampled_logp = w->logp_by_pos ? w->step_logp : NULL;
    } else {
        b.x_out = w->x_out;
    }
    int rc = vks_engine_forward(w->engine, &b);
#ifdef VKS_TEST_FAULTS
    if (rc == VKS_OK && !w->last_stage)
        vks_test_fault_output(w->fault, w->x_out, w->first_stage ? NULL : w->x_in, (size_t)b.n_rows * dim,
                              w->fault_one_layer, &w->fault_rng);
#endif
    for (uint32_t i = 0; rc == VKS_OK && b.hidden && i < n_out; i++)
        rc = vks_toploc_builder_push(w->builder, (int)row_meta[out_rows[i]].seq, w->hidden + (size_t)i * dim);
    if (rc == VKS_OK && b.sampled_logp) record_logp(w, &b, row_meta, out_rows, n_out);
    if (rc == VKS_OK && w->stage_builder && !w->last_stage) rc = commit_sent_rows(w, row_meta, out_rows, n_out, dim);
    if (rc == VKS_OK)
        rc = w->last_stage ? pack_tokens(w, j, n_out) : pack_act(w, j, &b, n_out, row_meta, out_rows, dim);
    free(meta);
    return rc;
}

static void *worker_main(void *arg) {
    vks_worker *w = arg;
    pthread_mutex_lock(&w->lock);
    for (;;) {
        while (!w->todo && !w->stop) pthread_cond_wait(&w->wake, &w->lock);
        if (!w->todo) break;
        vks_job *j = w->todo;
        w->todo = j->next;
        pthread_mutex_unlock(&w->lock);
        double t0 = vks_seconds_now();
        j->rc = run_job(w, j);
        j->gpu_s = vks_seconds_now() - t0;
        if (j->rc) snprintf(j->err, sizeof j->err, "%s", vks_last_error());
        pthread_mutex_lock(&w->lock);
        vks_job **tail = &w->done;
        while (*tail) tail = &(*tail)->next;
        j->next = NULL;
        *tail = j;
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

int vks_worker_start(vks_worker *w, vks_engine *e, const vks_sched_params *sched, int wire, bool first_stage,
                     bool last_stage) {
    memset(w, 0, sizeof *w);
    w->engine = e;
    w->sched = sched;
    w->wire = wire;
    w->first_stage = first_stage;
    w->last_stage = last_stage;
    size_t rows = (size_t)vks_engine_max_rows(e), dim = (size_t)vks_engine_config(e)->dim;
    w->x_in = malloc(rows * dim * sizeof(float));
    w->x_out = malloc(rows * dim * sizeof(float));
    w->slot = malloc(rows * 4);
    w->pos = malloc(rows * 4);
    w->out_rows = malloc(rows * 4);
    w->sample = malloc(rows * sizeof *w->sample);
    w->sampled = malloc(rows * 4);
    w->hidden = malloc(rows * dim * sizeof(float));
    if (!w->hidden || !w->x_in || !w->x_out || !w->slot || !w->pos || !w->out_rows || !w->sample || !w->sampled)
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    pthread_mutex_init(&w->lock, NULL);
    pthread_cond_init(&w->wake, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w)) return vks_set_error(VKS_ERR_NOMEM, "cannot start GPU thread");
    return VKS_OK;
}

void vks_worker_stop(vks_worker *w) {
    pthread_mutex_lock(&w->lock);
    w->stop = true;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
    pthread_join(w->thread, NULL);
    while (w->done) {
        vks_job *j = w->done;
        w->done = j->next;
        vks_job_free(j);
    }
    pthread_mutex_destroy(&w->lock);
    pthread_cond_destroy(&w->wake);
    free(w->x_in); free(w->x_out); free(w->slot); free(w->pos);
    free(w->out_rows); free(w->sample); free(w->sampled); free(w->hidden);
}

void vks_worker_submit(vks_worker *w, vks_job *j) {
    pthread_mutex_lock(&w->lock);
    vks_job **tail = &w->todo;
    while (*tail) tail = &(*tail)->next;
    j->next = NULL;
    *tail = j;
    pthread_cond_signal(&w->wake);
    pthread_mutex_unlock(&w->lock);
}

vks_job *vks_worker_take_done(vks_worker *w) {
    pthread_mutex_lock(&w->lock);
    vks_job *j = w->done;
    if (j) w->done = j->next;
    pthread_mutex_unlock(&w->lock);
    return j;
}
