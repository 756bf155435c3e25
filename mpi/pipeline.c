/* Pipeline-parallel generation (see vks_pipeline.h). The main thread is the
 * only one that calls MPI: it receives and checks messages, hands forward
 * passes to the GPU worker, sends results through the (optionally emulated)
 * link, sends heartbeats and watches the other ranks' silence. Rank 0 also
 * runs the schedule: K micro-batches of B KV slots each, refilled with the
 * next prompt as soon as a sequence ends. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <limits.h>
#include <unistd.h>
#include "pipeline_worker.h"
#include "pipeline_fault.h"
#include "protocol.h"
#include "vkswarm/vks_mpi.h"
#include "vkswarm/vks_pipeline.h"

#define HEARTBEAT_EVERY_S 1.0

typedef struct {
    vks_seq_state *seqs;  /* batch slots */
    int *prompt_of;       /* prompt index per slot, -1 when free */
    vks_step step;
    bool in_flight;
} microbatch;

typedef struct outgoing {
    struct outgoing *next;
    void *buf;
    vks_link_send *send;
} outgoing;

typedef struct {
    MPI_Comm comm;
    int rank, size, prev, next;
    const vks_pipeline_options *o;
    vks_engine *engine;
    vks_worker worker;
    vks_link *link;
    vks_msg_limits limits;
    outgoing *outbox;
    double *last_heard, last_heartbeat;
    vks_mpi_clock clock;         /* leaves out the time this rank itself was stopped */
    bool *left_loop;             /* rank r is waiting in the finish exchange: no more messages */
    int probe_from;              /* round robin over the sources */
    double now;                  /* this loop iteration's time on that clock */
    vks_pipeline_stats *stats;
    bool finished;
    int n_seqs;                  /* prompts in the whole job (every rank) */
    vks_toploc_builder *builder; /* last stage with TOPLOC */
    bool awaiting_proofs;        /* rank 0: DONE sent, proofs not yet here */
    vks_toploc_builder *stage_builder; /* other stages with stage proofs: what this stage hands on */
    int awaiting_stage_proofs;   /* rank 0: middle stages whose commitments are not yet here */
    bool *stage_got;             /* rank 0: [size] whose commitments are in */
    float *logp_by_pos;          /* last stage with record_logp: [n_seqs, steps] (the worker fills it) */
    float *step_logp;            /* the worker's scratch for it: one step's sampled tokens' logp */
    bool awaiting_logp;          /* rank 0: DONE sent, log-probabilities not yet here */
    /* rank 0 only */
    microbatch *mbs;
    vks_sequence *prompts;
    int n_prompts, next_prompt, n_finished;
} pipe_ctx;

/* Errors. The first one ends this rank's part of the job: every function
 * returns it upward and vks_pipeline_run cleans up and returns it. Messages
 * start with this rank's number; the codes say how the caller should end:
 * VKS_ERR_TIMEOUT a silent rank (status 3), VKS_ERR_FORMAT a bad message from
 * another rank or input (2), others a local failure (1). */
/* Rank r of the pipeline's communicator as messages name it: its world rank
 * when the caller gave them (stage_ranks: an RL group's stages), else r. */
static int named(const pipe_ctx *c, int r) { return c->o->stage_ranks && r >= 0 && r < c->size ? c->o->stage_ranks[r] : r; }

static int fail(pipe_ctx *c, int code, const char *msg) {
    return vks_set_error(code, "rank %d: %s", named(c, c->rank), msg);
}

static int fail_rank(pipe_ctx *c, int code, const char *what, int other) {
    return vks_set_error(code, "rank %d: rank %d %s", named(c, c->rank), named(c, other), what);
}

static int out_of_memory(pipe_ctx *c) { return fail(c, VKS_ERR_NOMEM, "out of host memory"); }

/* A bounded wait for one request to or from `peer`: a silent peer ends the job. */
static int wait_for(pipe_ctx *c, MPI_Request *req, int peer, const char *what) {
    int shown = named(c, peer); /* only named in the message */
    if (vks_mpi_wait_within(c->comm, req, &shown, 1, c->o->timeout_s, what))
        return fail(c, VKS_ERR_TIMEOUT, vks_last_error());
    return VKS_OK;
}

/* Blocking receive of a probed message, bounded by the timeout. */
static int recv_probed(pipe_ctx *c, void *buf, int bytes, const MPI_Status *st, const char *what) {
    MPI_Request req;
    MPI_Irecv(buf, bytes, MPI_BYTE, st->MPI_SOURCE, st->MPI_TAG, c->comm, &req);
    return wait_for(c, &req, st->MPI_SOURCE, what);
}

/* ---------------- sending ---------------- */

/* Queues buf (malloc'd; the outbox owns it from here, also on failure). */
static int send_message(pipe_ctx *c, void *buf, size_t bytes, int dest, int tag) {
    outgoing *o = malloc(sizeof *o);
    if (!o) {
        free(buf);
        return out_of_memory(c);
    }
    if (vks_link_isend(c->link, buf, bytes, dest, tag, &o->send)) {
        free(buf);
        free(o);
        return fail(c, VKS_ERR_IO, vks_last_error());
    }
    o->buf = buf;
    o->next = c->outbox;
    c->outbox = o;
    c->stats->bytes_sent += bytes;
    return VKS_OK;
}

static void reap_outbox(pipe_ctx *c) {
    for (outgoing **p = &c->outbox; *p;) {
        outgoing *o = *p;
        if (vks_link_send_done(c->link, o->send)) {
            *p = o->next;
            free(o->buf);
            free(o);
        } else {
            p = &o->next;
        }
    }
}

static void send_heartbeats(pipe_ctx *c, double now) {
    static vks_msg_header beat = {VKS_MSG_MAGIC, VKS_MSG_HEARTBEAT, 0, 0, 0, 0, 0, 0};
    if (now - c->last_heartbeat < HEARTBEAT_EVERY_S) return;
    c->last_heartbeat = now;
    for (int r = 0; r < c->size; r++) {
        if (r == c->rank) continue;
        MPI_Request req;
        MPI_Isend(&beat, sizeof beat, MPI_BYTE, r, VKS_TAG_HEARTBEAT, c->comm, &req);
        MPI_Request_free(&req);
    }
}

/* last_heard and now are on c->clock, which leaves out any time this rank was
 * itself stopped: a rank that resumes does not blame the ones that waited. */
static int check_silence(pipe_ctx *c, double now) {
    for (int r = 0; r < c->size; r++)
        if (r != c->rank && !c->left_loop[r] && now - c->last_heard[r] > c->o->timeout_s)
            return fail_rank(c, VKS_ERR_TIMEOUT, "stopped answering: no message within the timeout; stopping the job", r);
    return VKS_OK;
}

/* ---------------- rank 0: the schedule ---------------- */

static void finish_sequence(pipe_ctx *c, microbatch *mb, int i) {
    vks_seq_state *s = &mb->seqs[i];
    vks_sequence *out = &c->prompts[mb->prompt_of[i]];
    free(out->ids);
    out->ids = s->ids;
    out->n_ids = s->n_ids;
    out->stop_token = s->stop_token;
    s->ids = NULL;
    vks_seq_free(s);
    mb->prompt_of[i] = -1;
    c->n_finished++;
}

/* Collects finished sequences and gives their slots the next prompts. */
static int refill(pipe_ctx *c, int m) {
    microbatch *mb = &c->mbs[m];
    for (int i = 0; i < c->o->batch; i++) {
        if (mb->prompt_of[i] >= 0 && mb->seqs[i].done) finish_sequence(c, mb, i);
        if (mb->prompt_of[i] >= 0 || c->next_prompt == c->n_prompts) continue;
        int p = c->next_prompt++;
        uint32_t slot = (uint32_t)(m * c->o->batch + i);
        if (vks_seq_init(&mb->seqs[i], &c->o->sched, c->prompts[p].ids, c->prompts[p].n_prompt, (uint32_t)p, slot))
            return fail(c, VKS_ERR_FORMAT, vks_last_error());
        mb->prompt_of[i] = p;
        if (mb->seqs[i].done) finish_sequence(c, mb, i), i--; /* a prompt longer than -n: only cut */
    }
    return VKS_OK;
}

static int schedule_microbatch(pipe_ctx *c, int m) {
    microbatch *mb = &c->mbs[m];
    int rc = refill(c, m);
    if (rc || !vks_sched_build(&c->o->sched, mb->seqs, c->o->batch, &mb->step)) return rc;
    vks_job *j = calloc(1, sizeof *j);
    if (!j) return out_of_memory(c);
    j->mb = (uint32_t)m;
    j->step = &mb->step;
    mb->in_flight = true;
    vks_worker_submit(&c->worker, j);
    return VKS_OK;
}

static int apply_tokens(pipe_ctx *c, uint32_t m, const int32_t *tokens, uint32_t n) {
    microbatch *mb = &c->mbs[m];
    if (!mb->in_flight || (int)n != mb->step.n_out)
        return fail(c, VKS_ERR_FORMAT, "tokens for a micro-batch that has none in flight");
    vks_sched_apply(&c->o->sched, mb->seqs, &mb->step, tokens);
    mb->in_flight = false;
    return schedule_microbatch(c, (int)m);
}

static bool all_done(const pipe_ctx *c) {
    if (c->n_finished < c->n_prompts) return false;
    for (int m = 0; m < c->o->micro_batches; m++)
        if (c->mbs[m].in_flight) return false;
    return true;
}

/* Rank 0, after DONE: finished once everything due from the other stages is in. */
static void update_finished(pipe_ctx *c) {
    c->finished = !c->awaiting_proofs && !c->awaiting_logp && c->awaiting_stage_proofs == 0;
}

/* ---------------- log-probabilities (last stage -> rank 0) ---------------- */

/* Rank 0: each sequence's vks_sequence.logp from the last stage's [n_seqs,
 * steps] record: generated id k (and the stop token after the last one) was
 * sampled from position n_prompt + k - 1. A missing or impossible value fails
 * (from another rank: a bad message). */
static int apply_logp(pipe_ctx *c, const float *by_pos) {
    int steps = c->o->sched.steps;
    for (int i = 0; i < c->n_seqs; i++) {
        vks_sequence *q = &c->prompts[i];
        int n = q->n_ids - q->n_prompt + (q->stop_token >= 0);
        float *logp = calloc((size_t)steps + 1, sizeof *logp);
        if (!logp) return out_of_memory(c);
        for (int k = 0; k < n; k++) {
            int pos = q->n_prompt + k - 1;
            float v = pos >= 0 && pos < steps ? by_pos[(size_t)i * (size_t)steps + (size_t)pos] : NAN;
            if (!(v <= 0)) { /* NaN: never recorded; a log-probability is never positive */
                free(logp);
                char msg[160];
                snprintf(msg, sizeof msg, "no valid log-probability for token %d of sequence %d (the last stage's record)", k, i);
                return fail(c, VKS_ERR_FORMAT, msg);
            }
            logp[k] = v;
        }
        free(q->logp);
        q->logp = logp;
    }
    return VKS_OK;
}

static int send_logp(pipe_ctx *c) {
    size_t n = (size_t)c->n_seqs * (size_t)c->o->sched.steps, bytes = sizeof(vks_msg_header) + sizeof(float) * n;
    if (bytes > INT_MAX) return fail(c, VKS_ERR_ARG, "the log-probabilities do not fit one message");
    vks_msg_header *h = malloc(bytes);
    if (!h) return out_of_memory(c);
    *h = (vks_msg_header){VKS_MSG_MAGIC, VKS_MSG_LOGP, 0, (uint32_t)c->o->sched.steps, (uint32_t)c->n_seqs, 0, 0, 0};
    memcpy(h + 1, c->logp_by_pos, sizeof(float) * n);
    MPI_Request req;
    MPI_Isend(h, (int)bytes, MPI_BYTE, 0, VKS_TAG_LOGP, c->comm, &req);
    int rc = wait_for(c, &req, 0, "sending the log-probabilities");
    if (!rc) free(h); /* else still MPI's: the caller ends the job */
    return rc;
}

static int receive_logp(pipe_ctx *c, const MPI_Status *st) {
    if (st->MPI_SOURCE != c->size - 1 || !c->awaiting_logp)
        return fail_rank(c, VKS_ERR_FORMAT, "sent log-probabilities but is not the last stage, or none were due",
                         st->MPI_SOURCE);
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    size_t n = (size_t)c->n_seqs * (size_t)c->o->sched.steps, want = sizeof(vks_msg_header) + sizeof(float) * n;
    if (bytes < 0 || (size_t)bytes != want)
        return fail_rank(c, VKS_ERR_FORMAT, "sent a log-probability message of the wrong size", st->MPI_SOURCE);
    vks_msg_header *h = malloc(want);
    int rc = !h ? out_of_memory(c) : recv_probed(c, h, bytes, st, "receiving the log-probabilities");
    if (rc == VKS_ERR_TIMEOUT) h = NULL; /* still MPI's: the caller ends the job */
    if (!rc && (h->magic != VKS_MSG_MAGIC || h->type != VKS_MSG_LOGP || h->n_out != (uint32_t)c->n_seqs ||
                h->n_rows != (uint32_t)c->o->sched.steps))
        rc = fail_rank(c, VKS_ERR_FORMAT, "sent a malformed log-probability message", st->MPI_SOURCE);
    if (!rc) rc = apply_logp(c, (const float *)(h + 1));
    free(h);
    if (rc) return rc;
    c->awaiting_logp = false;
    update_finished(c);
    return VKS_OK;
}

/* ---------------- TOPLOC proofs (last stage -> rank 0) ---------------- */

/* *dst (malloc'd, replacing what was there) becomes a copy of len bytes of p. */
static int set_bytes(pipe_ctx *c, uint8_t **dst, size_t *dst_len, const uint8_t *p, size_t len) {
    free(*dst);
    *dst = len ? malloc(len) : NULL;
    *dst_len = 0;
    if (len && !*dst) return out_of_memory(c);
    if (len) memcpy(*dst, p, len);
    *dst_len = len;
    return VKS_OK;
}

static int set_proof(pipe_ctx *c, int i, const uint8_t *p, size_t len) {
    return set_bytes(c, &c->prompts[i].proofs, &c->prompts[i].proof_bytes, p, len);
}

static int finish_builder(pipe_ctx *c) {
    if (vks_toploc_builder_finish(c->builder)) return fail(c, VKS_ERR_NOMEM, vks_last_error());
    return VKS_OK;
}

static int take_local_proofs(pipe_ctx *c) {
    int rc = finish_builder(c);
    for (int i = 0; !rc && i < c->n_seqs; i++) {
        size_t len;
        const uint8_t *p = vks_toploc_builder_proofs(c->builder, i, &len);
        rc = set_proof(c, i, p, len);
    }
    return rc;
}

/* After DONE: a builder's proofs (finished here) to rank 0 as one PROOFS message with `tag`. */
static int send_builder_proofs(pipe_ctx *c, vks_toploc_builder *b, int tag, const char *what) {
    if (vks_toploc_builder_finish(b)) return fail(c, VKS_ERR_NOMEM, vks_last_error());
    const uint8_t **p = malloc(sizeof *p * (size_t)c->n_seqs);
    size_t *lens = malloc(sizeof *lens * (size_t)c->n_seqs), bytes = 0;
    void *msg = NULL;
    int rc = p && lens ? VKS_OK : out_of_memory(c);
    for (int i = 0; !rc && i < c->n_seqs; i++) p[i] = vks_toploc_builder_proofs(b, i, &lens[i]);
    if (!rc) msg = vks_msg_pack_proofs(p, lens, (uint32_t)c->n_seqs, &bytes);
    if (!rc && (!msg || bytes > INT_MAX)) rc = fail(c, VKS_ERR_NOMEM, "cannot pack the proofs");
    if (!rc) {
        MPI_Request req;
        MPI_Isend(msg, (int)bytes, MPI_BYTE, 0, tag, c->comm, &req);
        rc = wait_for(c, &req, 0, what);
        if (rc) msg = NULL; /* still MPI's: the caller ends the job */
    }
    free(msg);
    free(p);
    free(lens);
    return rc;
}

static int send_proofs(pipe_ctx *c) {
    return send_builder_proofs(c, c->builder, VKS_TAG_PROOFS, "sending the TOPLOC proofs");
}

static int unpack_proofs(pipe_ctx *c, const uint8_t *msg, int bytes, size_t max_one, size_t *lens, size_t *offs) {
    char err[256], buf[320];
    if (vks_msg_check_proofs(msg, (size_t)bytes, (uint32_t)c->n_seqs, VKS_TOPLOC_PROOF_BYTES, max_one, lens, offs, err,
                             sizeof err)) {
        snprintf(buf, sizeof buf, "bad proofs from the last stage: %s", err);
        return fail(c, VKS_ERR_FORMAT, buf);
    }
    int rc = VKS_OK;
    for (int i = 0; !rc && i < c->n_seqs; i++) rc = set_proof(c, i, msg + offs[i], lens[i]);
    return rc;
}

static int receive_proofs(pipe_ctx *c, const MPI_Status *st) {
    if (st->MPI_SOURCE != c->size - 1 || !c->awaiting_proofs)
        return fail_rank(c, VKS_ERR_FORMAT, "sent proofs but is not the last stage, or none were due", st->MPI_SOURCE);
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    size_t max_one = vks_toploc_proof_size((size_t)c->o->sched.steps + 1);
    size_t max = sizeof(vks_msg_header) + (4 + max_one) * (size_t)c->n_seqs;
    if (bytes < 0 || (size_t)bytes > max)
        return fail_rank(c, VKS_ERR_FORMAT, "sent a proof message larger than the job allows", st->MPI_SOURCE);
    uint8_t *msg = malloc((size_t)bytes + 1);
    size_t *lens = malloc(sizeof *lens * (size_t)c->n_seqs), *offs = malloc(sizeof *offs * (size_t)c->n_seqs);
    int rc = !msg || !lens || !offs ? out_of_memory(c) : recv_probed(c, msg, bytes, st, "receiving the TOPLOC proofs");
    if (rc == VKS_ERR_TIMEOUT) msg = NULL; /* still MPI's: the caller ends the job */
    if (!rc) rc = unpack_proofs(c, msg, bytes, max_one, lens, offs);
    free(msg); free(lens); free(offs);
    if (rc) return rc;
    c->awaiting_proofs = false;
    update_finished(c);
    return VKS_OK;
}

/* ---------------- stage commitments (stages 0..S-2 -> rank 0) ---------------- */

static bool stage_proofs_on(const vks_pipeline_options *o, int size) { return o->toploc && o->stage_proofs && size > 1; }

/* Rank 0: every sequence gets one (empty) entry per stage that hands on. */
static int prepare_stage_entries(pipe_ctx *c) {
    if (!(c->stage_got = calloc((size_t)c->size, sizeof *c->stage_got))) return out_of_memory(c);
    for (int i = 0; i < c->n_prompts; i++) {
        vks_sequence *q = &c->prompts[i];
        vks_stage_proofs_free(q->stage_proofs, q->n_stage_proofs);
        q->n_stage_proofs = 0;
        if (!(q->stage_proofs = calloc((size_t)c->size - 1, sizeof *q->stage_proofs))) return out_of_memory(c);
        q->n_stage_proofs = c->size - 1;
        for (int s = 0; s < c->size - 1; s++)
            q->stage_proofs[s] = (vks_stage_proof){.rank = c->o->stage_ranks ? c->o->stage_ranks[s] : s,
                                                   .layer_begin = c->o->first[s], .layer_end = c->o->first[s + 1]};
    }
    return VKS_OK;
}

static int set_stage_proof(pipe_ctx *c, int stage, int i, const uint8_t *p, size_t len) {
    vks_stage_proof *sp = &c->prompts[i].stage_proofs[stage];
    return set_bytes(c, &sp->proofs, &sp->proof_bytes, p, len);
}

/* Rank 0: stage `stage`'s commitments, from its own builder (msg NULL) or a
 * checked message. */
static int take_stage_proofs(pipe_ctx *c, int stage, const uint8_t *msg, int bytes) {
    size_t max_one = vks_toploc_proof_size((size_t)c->o->sched.steps + 1);
    size_t *lens = malloc(sizeof *lens * (size_t)c->n_seqs), *offs = malloc(sizeof *offs * (size_t)c->n_seqs);
    int rc = lens && offs ? VKS_OK : out_of_memory(c);
    if (!rc && !msg && vks_toploc_builder_finish(c->stage_builder)) rc = fail(c, VKS_ERR_NOMEM, vks_last_error());
    char err[256], buf[320];
    if (!rc && msg &&
        vks_msg_check_proofs(msg, (size_t)bytes, (uint32_t)c->n_seqs, VKS_TOPLOC_PROOF_BYTES, max_one, lens, offs, err,
                             sizeof err)) {
        snprintf(buf, sizeof buf, "bad stage commitments from rank %d: %s", stage, err);
        rc = fail(c, VKS_ERR_FORMAT, buf);
    }
    for (int i = 0; !rc && i < c->n_seqs; i++) {
        size_t len = 0;
        const uint8_t *p = msg ? msg + offs[i] : vks_toploc_builder_proofs(c->stage_builder, i, &len);
        rc = set_stage_proof(c, stage, i, p, msg ? lens[i] : len);
    }
    free(lens);
    free(offs);
    return rc;
}

/* A middle stage, after DONE: its commitments to rank 0. */
static int send_stage_proofs(pipe_ctx *c) {
    return send_builder_proofs(c, c->stage_builder, VKS_TAG_STAGE_PROOFS, "sending the stage commitments");
}

static int receive_stage_proofs(pipe_ctx *c, const MPI_Status *st) {
    int from = st->MPI_SOURCE;
    if (from < 1 || from > c->size - 2 || !c->awaiting_stage_proofs || c->stage_got[from])
        return fail_rank(c, VKS_ERR_FORMAT, "sent stage commitments but is not a middle stage, or none were due", from);
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    size_t max = sizeof(vks_msg_header) + (4 + vks_toploc_proof_size((size_t)c->o->sched.steps + 1)) * (size_t)c->n_seqs;
    if (bytes < 0 || (size_t)bytes > max)
        return fail_rank(c, VKS_ERR_FORMAT, "sent a stage commitment message larger than the job allows", from);
    uint8_t *msg = malloc((size_t)bytes + 1);
    int rc = !msg ? out_of_memory(c) : recv_probed(c, msg, bytes, st, "receiving the stage commitments");
    if (rc == VKS_ERR_TIMEOUT) msg = NULL; /* still MPI's: the caller ends the job */
    if (!rc) rc = take_stage_proofs(c, from, msg, bytes);
    free(msg);
    if (rc) return rc;
    c->stage_got[from] = true;
    c->awaiting_stage_proofs--;
    update_finished(c);
    return VKS_OK;
}

static int broadcast_done(pipe_ctx *c) {
    static vks_msg_header done = {VKS_MSG_MAGIC, VKS_MSG_DONE, 0, 0, 0, 0, 0, 0};
    for (int r = 1; r < c->size; r++) {
        MPI_Request req;
        MPI_Isend(&done, sizeof done, MPI_BYTE, r, VKS_TAG_DONE, c->comm, &req);
        int rc = wait_for(c, &req, r, "sending the stop message");
        if (rc) return rc;
    }
    if (c->builder) { /* one rank: rank 0 is the last stage */
        int rc = take_local_proofs(c);
        if (rc) return rc;
    }
    if (c->logp_by_pos) { /* the same */
        int rc = apply_logp(c, c->logp_by_pos);
        if (rc) return rc;
    }
    if (c->stage_builder) { /* rank 0's own commitments */
        int rc = take_stage_proofs(c, 0, NULL, 0);
        if (rc) return rc;
    }
    c->awaiting_proofs = c->o->toploc && c->size > 1;
    c->awaiting_logp = c->o->record_logp && c->size > 1;
    c->awaiting_stage_proofs = c->stage_builder ? c->size - 2 : 0;
    update_finished(c);
    return VKS_OK;
}

/* ---------------- receiving ---------------- */

static int receive(pipe_ctx *c, const MPI_Status *st, void **msg, int *bytes) {
    *msg = NULL;
    MPI_Get_count(st, MPI_BYTE, bytes);
    size_t max = vks_msg_size(VKS_MSG_ACT, c->limits.max_rows, c->limits.max_out, c->limits.dim, VKS_WIRE_F32);
    if (*bytes < 0 || (size_t)*bytes > max) {
        char buf[128];
        snprintf(buf, sizeof buf, "rank %d sent a message of %d bytes; at most %zu are expected", named(c, st->MPI_SOURCE),
                 *bytes, max);
        return fail(c, VKS_ERR_FORMAT, buf);
    }
    void *m = malloc(*bytes > 0 ? (size_t)*bytes : 1);
    if (!m) return out_of_memory(c);
    int rc = recv_probed(c, m, *bytes, st, "receiving a pipeline message");
    if (!rc) *msg = m; /* on a timeout m stays MPI's: the caller ends the job */
    return rc;
}

static int handle_stage_message(pipe_ctx *c, const MPI_Status *st) {
    if (st->MPI_SOURCE != c->prev)
        return fail_rank(c, VKS_ERR_FORMAT, "sent a pipeline message but is not the previous stage", st->MPI_SOURCE);
    int bytes;
    void *msg;
    int rc = receive(c, st, &msg, &bytes);
    if (rc) return rc;
    uint32_t expect = c->rank == 0 ? VKS_MSG_TOKENS : VKS_MSG_ACT;
    char err[256];
    if (vks_msg_check(msg, (size_t)bytes, st->MPI_TAG, expect, &c->limits, err, sizeof err)) {
        char buf[320];
        snprintf(buf, sizeof buf, "bad message from rank %d: %s", st->MPI_SOURCE, err);
        free(msg);
        return fail(c, VKS_ERR_FORMAT, buf);
    }
    const vks_msg_header *h = msg;
    if (c->rank == 0) {
        rc = apply_tokens(c, h->mb, vks_msg_tokens(msg), h->n_out);
        free(msg);
        return rc;
    }
    vks_job *j = calloc(1, sizeof *j);
    if (!j) {
        free(msg);
        return out_of_memory(c);
    }
    j->mb = h->mb;
    j->in = msg;
    vks_worker_submit(&c->worker, j);
    return VKS_OK;
}

/* The next message of a source still in its loop (round robin). A rank that
 * left its loop has sent its finish-exchange message, which waits for
 * sync_ranks; nothing it sent before is behind it (MPI keeps the order). */
static bool probe_next(pipe_ctx *c, MPI_Status *st) {
    for (int k = 1; k <= c->size; k++) {
        int r = (c->probe_from + k) % c->size, flag;
        if (r == c->rank || c->left_loop[r]) continue;
        MPI_Iprobe(r, MPI_ANY_TAG, c->comm, &flag, st);
        if (!flag) continue;
        if (st->MPI_TAG == VKS_TAG_FINISH) {
            c->left_loop[r] = true;
            continue;
        }
        c->probe_from = r;
        return true;
    }
    return false;
}

static int handle_control_message(pipe_ctx *c, const MPI_Status *st) {
    vks_msg_header h;
    int bytes;
    MPI_Get_count(st, MPI_BYTE, &bytes);
    if (bytes != (int)sizeof h) return fail_rank(c, VKS_ERR_FORMAT, "sent a control message of the wrong size", st->MPI_SOURCE);
    int rc = recv_probed(c, &h, sizeof h, st, "receiving a control message");
    if (rc || st->MPI_TAG != VKS_TAG_DONE) return rc;
    if (st->MPI_SOURCE != 0 || h.magic != VKS_MSG_MAGIC || h.type != VKS_MSG_DONE)
        return fail_rank(c, VKS_ERR_FORMAT, "sent a stop message but is not rank 0", st->MPI_SOURCE);
    if (c->logp_by_pos && (rc = send_logp(c))) return rc; /* before the proofs: rank 0 takes both */
    if (c->builder && (rc = send_proofs(c))) return rc;
    if (c->stage_builder && (rc = send_stage_proofs(c))) return rc;
    c->finished = true;
    return VKS_OK;
}

/* One message, if any: 1 when one was handled, 0 when none waited, or an error. */
static int poll_messages(pipe_ctx *c) {
    MPI_Status st;
    if (!probe_next(c, &st)) return 0;
    c->last_heard[st.MPI_SOURCE] = c->now;
    int rc;
    if (st.MPI_TAG == VKS_TAG_HEARTBEAT || st.MPI_TAG == VKS_TAG_DONE) rc = handle_control_message(c, &st);
    else if (st.MPI_TAG == VKS_TAG_PROOFS && c->rank == 0) rc = receive_proofs(c, &st);
    else if (st.MPI_TAG == VKS_TAG_LOGP && c->rank == 0) rc = receive_logp(c, &st);
    else if (st.MPI_TAG == VKS_TAG_STAGE_PROOFS && c->rank == 0) rc = receive_stage_proofs(c, &st);
    else if (st.MPI_TAG < VKS_TAG_MB || st.MPI_TAG >= VKS_TAG_MB + c->o->micro_batches)
        rc = fail_rank(c, VKS_ERR_FORMAT, "sent a message with an unknown tag or micro-batch id", st.MPI_SOURCE);
    else rc = handle_stage_message(c, &st);
    return rc ? rc : 1;
}

/* ---------------- finished GPU work ---------------- */

/* One finished forward pass, if any: 1 when one was passed on, 0 when none, or an error. */
static int poll_worker(pipe_ctx *c) {
    vks_job *j = vks_worker_take_done(&c->worker);
    if (!j) return 0;
    int rc = VKS_OK;
    if (j->rc) {
        rc = fail(c, VKS_ERR_GPU, j->err);
    } else {
        c->stats->steps++;
        vks_test_point("step");
        c->stats->gpu_busy_s += j->gpu_s;
        if (c->size == 1) {
            const vks_msg_header *h = j->out;
            rc = apply_tokens(c, j->mb, vks_msg_tokens(j->out), h->n_out);
        } else {
            rc = send_message(c, j->out, j->out_bytes, c->next, VKS_TAG_MB + (int)j->mb);
            j->out = NULL; /* owned by the outbox now */
        }
    }
    vks_job_free(j);
    return rc ? rc : 1;
}

/* ---------------- set-up ---------------- */

#ifdef VKS_TEST_FAULTS
/* The rank VKSWARM_TEST_FAULT names: this process's world rank (a pipeline
 * may run on a communicator of some ranks, e.g. an RL group re-formed
 * without a stage: the cheat stays with its process). */
static int fault_rank(void) {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
#endif

/* Every rank creates its engine, then all learn whether each one could: when
 * any could not, every rank returns an error at this same point, so the job
 * can still end cleanly (stats->ended_together; MPI_Finalize works). */
vks_engine_options vks_pipeline_engine_options(const vks_pipeline_options *o, int rank) {
    vks_engine_options eo = o->engine;
    eo.layer_begin = o->first[rank], eo.layer_end = o->first[rank + 1];
    eo.max_rows = o->chunk > o->batch ? o->chunk : o->batch, eo.max_out_rows = o->batch;
    eo.n_slots = o->micro_batches * o->batch, eo.kv_len = o->sched.steps;
#ifdef VKS_TEST_FAULTS
    vks_test_fault_engine(&eo, fault_rank());
#endif
    return eo;
}

/* The caller's engine (o->keep_engine), when its sizes hold the run. */
static int check_kept_engine(const pipe_ctx *c) {
    vks_engine_options eo = vks_pipeline_engine_options(c->o, c->rank);
    vks_engine *e = c->o->keep_engine;
    if (vks_engine_max_rows(e) < eo.max_rows || vks_engine_max_out_rows(e) < eo.max_out_rows ||
        vks_engine_n_slots(e) < eo.n_slots || vks_engine_kv_len(e) < eo.kv_len ||
        vks_engine_has_embed(e) != (eo.layer_begin == 0) ||
        vks_engine_has_head(e) != (eo.layer_end == vks_engine_config(e)->n_layers))
        return vks_set_error(VKS_ERR_ARG, "pipeline: the kept engine does not hold the run (sizes or layer range)");
    return VKS_OK;
}

static int create_engine(pipe_ctx *c, vks_gpu *g, const vks_model *m) {
    const vks_pipeline_options *o = c->o;
    vks_engine_options eo = vks_pipeline_engine_options(o, c->rank);
    int mine = o->keep_engine ? check_kept_engine(c) : vks_engine_create(g, m, &eo, &c->engine);
    if (o->keep_engine) c->engine = o->keep_engine;
    else if (!mine && o->lora) mine = vks_engine_set_lora(c->engine, o->lora);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", mine ? vks_last_error() : "");
    int failed = mine != 0, *all = malloc(sizeof(int) * (size_t)c->size);
    if (!all) return out_of_memory(c);
    if (vks_mpi_exchange_named(c->comm, &failed, all, sizeof failed, VKS_TAG_ENGINE, o->timeout_s, "creating the engines",
                               o->stage_ranks))
        return fail(c, VKS_ERR_TIMEOUT, vks_last_error());
    int first_failed = -1;
    for (int r = 0; r < c->size && first_failed < 0; r++)
        if (all[r]) first_failed = r;
    free(all);
    if (first_failed < 0) return VKS_OK;
    c->stats->ended_together = true;
    if (mine) return fail(c, mine, msg);
    return fail_rank(c, VKS_ERR_ARG, "could not create its engine (see its message)", first_failed);
}

static int setup_rank0(pipe_ctx *c, vks_sequence *prompts, int n_prompts) {
    c->prompts = prompts;
    c->n_prompts = n_prompts;
    c->mbs = calloc((size_t)c->o->micro_batches, sizeof *c->mbs);
    if (!c->mbs) return out_of_memory(c);
    int rows = c->o->chunk > c->o->batch ? c->o->chunk : c->o->batch;
    for (int m = 0; m < c->o->micro_batches; m++) {
        microbatch *mb = &c->mbs[m];
        mb->seqs = calloc((size_t)c->o->batch, sizeof *mb->seqs);
        mb->prompt_of = malloc(sizeof(int) * (size_t)c->o->batch);
        if (!mb->seqs || !mb->prompt_of || vks_step_alloc(&mb->step, rows)) return out_of_memory(c);
        for (int i = 0; i < c->o->batch; i++) mb->prompt_of[i] = -1;
    }
    return VKS_OK;
}

static void teardown_rank0(pipe_ctx *c) {
    for (int m = 0; c->mbs && m < c->o->micro_batches; m++) {
        for (int i = 0; c->mbs[m].seqs && i < c->o->batch; i++) vks_seq_free(&c->mbs[m].seqs[i]);
        free(c->mbs[m].seqs);
        free(c->mbs[m].prompt_of);
        vks_step_free(&c->mbs[m].step);
    }
    free(c->mbs);
}

static int check_options(const vks_pipeline_options *o, int size) {
    if (!o || !o->first || o->micro_batches < 1 || o->micro_batches > 4096 || o->batch < 1 || o->batch > 65536 ||
        o->chunk < 1 || o->chunk > 65536 || o->timeout_s <= 0 || o->sched.steps < 1)
        return vks_set_error(VKS_ERR_ARG, "pipeline: bad options");
    for (int s = 0; s < size; s++)
        if (o->first[s] >= o->first[s + 1]) return vks_set_error(VKS_ERR_ARG, "pipeline: stage %d has no layers", s);
    return VKS_OK;
}

/* A barrier that cannot hang: a rank silent for the timeout is named and ends the job. */
static int sync_ranks(pipe_ctx *c, int tag, const char *what) {
    char mine = 1, *all = malloc((size_t)c->size);
    if (!all) return out_of_memory(c);
    if (vks_mpi_exchange_named(c->comm, &mine, all, 1, tag, c->o->timeout_s, what, c->o->stage_ranks))
        return fail(c, VKS_ERR_TIMEOUT, vks_last_error()); /* all stays MPI's: the caller ends the job */
    free(all);
    return VKS_OK;
}

/* ---------------- the loop ---------------- */

static int start_schedule(pipe_ctx *c) {
    int rc = VKS_OK;
    for (int m = 0; !rc && m < c->o->micro_batches; m++) rc = schedule_microbatch(c, m);
    if (!rc && all_done(c)) rc = broadcast_done(c);
    return rc;
}

/* One pass: messages, finished GPU work, sends, heartbeats, silence. */
static int run_once(pipe_ctx *c) {
    c->now = vks_mpi_deadline_tick(&c->clock, c->o->timeout_s);
    int got = poll_messages(c);
    if (got < 0) return got;
    int done = poll_worker(c);
    if (done < 0) return done;
    if (c->rank == 0 && !c->finished && !c->awaiting_proofs && !c->awaiting_logp && !c->awaiting_stage_proofs &&
        all_done(c)) {
        int rc = broadcast_done(c);
        if (rc) return rc;
    }
    vks_link_progress(c->link);
    reap_outbox(c);
    send_heartbeats(c, c->now);
    int rc = check_silence(c, c->now);
    if (rc) return rc;
    if (!got && !done) usleep(200); /* leave the cores to the GPU driver (lavapipe runs on them) */
    return VKS_OK;
}

/* Lets queued sends (heartbeats aside) reach their destination. */
static int drain_outbox(pipe_ctx *c) {
    double start = vks_mpi_deadline_tick(&c->clock, c->o->timeout_s);
    while (c->outbox) {
        if (vks_mpi_deadline_tick(&c->clock, c->o->timeout_s) - start > c->o->timeout_s)
            return fail_rank(c, VKS_ERR_TIMEOUT, "did not take this rank's last messages within the timeout; stopping the job",
                             c->next);
        vks_link_progress(c->link);
        reap_outbox(c);
        if (c->outbox) usleep(200);
    }
    return VKS_OK;
}

static int run_loop(pipe_ctx *c) {
    int rc = c->rank == 0 ? start_schedule(c) : VKS_OK;
    while (!rc && !c->finished) rc = run_once(c);
    return rc ? rc : drain_outbox(c);
}

/* Everything vks_pipeline_run made, in reverse; sends still queued are
 * cancelled (after an error the caller ends the job). */
static void destroy(pipe_ctx *c, bool worker_started) {
    if (worker_started) vks_worker_stop(&c->worker);
    vks_link_destroy(c->link);
    while (c->outbox) {
        outgoing *o = c->outbox;
        c->outbox = o->next;
        free(o->buf);
        free(o);
    }
    vks_toploc_builder_destroy(c->builder);
    vks_toploc_builder_destroy(c->stage_builder);
    free(c->stage_got);
    free(c->logp_by_pos);
    free(c->step_logp);
    if (c->rank == 0) teardown_rank0(c);
    free(c->last_heard);
    free(c->left_loop);
    if (c->engine != c->o->keep_engine) vks_engine_destroy(c->engine);
}

static int prepare(pipe_ctx *c, const vks_model *m, vks_sequence *prompts, int n_prompts, bool *worker_started) {
    const vks_pipeline_options *o = c->o;
    int rows = o->chunk > o->batch ? o->chunk : o->batch;
    c->limits = (vks_msg_limits){.max_rows = (uint32_t)rows, .max_out = (uint32_t)o->batch,
                                 .dim = (uint32_t)m->cfg.dim, .n_mb = (uint32_t)o->micro_batches};
    c->last_heard = malloc(sizeof(double) * (size_t)c->size);
    c->left_loop = calloc((size_t)c->size, sizeof *c->left_loop);
    if (!c->last_heard || !c->left_loop) return out_of_memory(c);
    if (vks_link_create(c->comm, &o->link, &c->link)) return fail(c, VKS_ERR_IO, vks_last_error());
    if (vks_worker_start(&c->worker, c->engine, &o->sched, o->wire, c->rank == 0, c->rank == c->size - 1))
        return fail(c, VKS_ERR_NOMEM, vks_last_error());
    *worker_started = true;
#ifdef VKS_TEST_FAULTS
    c->worker.fault = vks_test_fault(fault_rank()), c->worker.fault_rng = 0x9E3779B97F4A7C15ull;
    c->worker.fault_one_layer = o->first[c->rank + 1] - o->first[c->rank] == 1;
#endif
    int rc = c->rank == 0 ? setup_rank0(c, prompts, n_prompts) : VKS_OK;
    if (!rc && o->toploc && c->rank == c->size - 1) {
        if (vks_toploc_builder_create(n_prompts, m->cfg.dim, &c->builder)) return fail(c, VKS_ERR_NOMEM, vks_last_error());
        c->worker.builder = c->builder; /* the worker is idle until the first job */
    }
    if (!rc && stage_proofs_on(o, c->size) && c->rank < c->size - 1) {
        if (vks_toploc_builder_create(n_prompts, m->cfg.dim, &c->stage_builder)) return fail(c, VKS_ERR_NOMEM, vks_last_error());
        c->worker.stage_builder = c->stage_builder;
        if (c->rank == 0) rc = prepare_stage_entries(c);
    }
    if (!rc && o->record_logp && c->rank == c->size - 1) {
        size_t n = (size_t)n_prompts * (size_t)o->sched.steps;
        c->logp_by_pos = malloc(sizeof(float) * n);
        c->step_logp = malloc(sizeof(float) * (size_t)o->batch);
        if (!c->logp_by_pos || !c->step_logp) return out_of_memory(c);
        for (size_t i = 0; i < n; i++) c->logp_by_pos[i] = NAN;
        c->worker.logp_by_pos = c->logp_by_pos, c->worker.step_logp = c->step_logp;
        c->worker.logp_seqs = n_prompts, c->worker.logp_steps = o->sched.steps;
    }
    return rc;
}

int vks_pipeline_run(MPI_Comm comm, vks_gpu *g, const vks_model *m, const vks_pipeline_options *o,
                     vks_sequence *prompts, int n_prompts, vks_pipeline_stats *stats) {
    pipe_ctx c = {.comm = comm, .o = o, .stats = stats};
    MPI_Comm_rank(comm, &c.rank);
    MPI_Comm_size(comm, &c.size);
    memset(stats, 0, sizeof *stats);
    int rc = check_options(o, c.size);
    if (rc) return rc;
    if (n_prompts < 1 || (c.rank == 0 && !prompts)) return vks_set_error(VKS_ERR_ARG, "pipeline: no prompts");
    c.n_seqs = n_prompts;
    c.prev = (c.rank + c.size - 1) % c.size;
    c.next = (c.rank + 1) % c.size;
    double t0 = MPI_Wtime();
    bool worker_started = false;
    rc = create_engine(&c, g, m);
    if (!rc) rc = prepare(&c, m, prompts, n_prompts, &worker_started);
    /* every engine is ready: start the silence clocks now */
    if (!rc) rc = sync_ranks(&c, VKS_TAG_READY, "waiting for every rank's engine");
    if (!rc) {
        c.now = vks_mpi_deadline_tick(&c.clock, o->timeout_s);
        for (int r = 0; r < c.size; r++) c.last_heard[r] = c.now;
        rc = run_loop(&c);
    }
    if (worker_started) vks_worker_stop(&c.worker);
    stats->commit_s = c.worker.commit_s; /* the worker thread has been joined */
    if (c.stage_builder && vks_toploc_builder_finish(c.stage_builder) == VKS_OK) /* already finished on success */
        stats->commit_build_s = vks_toploc_builder_busy_s(c.stage_builder);
    worker_started = false;
    stats->wall_s = MPI_Wtime() - t0;
    if (!rc) rc = sync_ranks(&c, VKS_TAG_FINISH, "finishing the job");
    destroy(&c, worker_started);
    return rc;
}

int vks_pipeline_share_job(MPI_Comm comm, vks_pipeline_job *job, double timeout_s) {
    if (!job) return vks_set_error(VKS_ERR_ARG, "vks_pipeline_share_job: NULL job");
    int64_t wire[4] = {(int64_t)job->seed, job->n_prompts, job->stop_token_a, job->stop_token_b};
    int rank, size;
    MPI_Comm_rank(comm, &rank);
    MPI_Comm_size(comm, &size);
    int64_t *all = malloc(sizeof wire * (size_t)size);
    if (!all) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int rc = vks_mpi_exchange(comm, wire, all, sizeof wire, VKS_TAG_SHARED, timeout_s, "sharing the seed and prompt count");
    if (rc) return rc; /* all stays in MPI's hands: the caller ends the job */
    memcpy(wire, all, sizeof wire); /* rank 0's */
    free(all);
    if (wire[1] < 0 || wire[1] > INT_MAX || wire[2] < -1 || wire[2] > INT_MAX || wire[3] < -1 || wire[3] > INT_MAX)
        return vks_set_error(VKS_ERR_FORMAT, "rank %d: rank 0 sent a bad job (prompts %lld, stop tokens %lld %lld)", rank,
                             (long long)wire[1], (long long)wire[2], (long long)wire[3]);
    *job = (vks_pipeline_job){(uint64_t)wire[0], (int)wire[1], (int)wire[2], (int)wire[3]};
    return VKS_OK;
}
