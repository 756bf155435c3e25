/* Batched generation on one engine: every prompt gets a KV slot; the schedule
 * (vks_sched.h) alternates prefill chunks and decode steps; the sampler runs
 * on the GPU, keyed by (seed, sequence index, position). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_sched.h"

vks_forward_batch vks_step_batch(const vks_step *st, int32_t *sampled, float *hidden) {
    return (vks_forward_batch){.n_rows = st->n_rows,
                               .matmul_kind = st->prefill ? VKS_MATMUL_PREFILL : VKS_MATMUL_DECODE,
                               .tokens = st->tokens, .slot = st->slot, .pos = st->pos, .n_out = st->n_out,
                               .out_rows = st->out_rows, .sample = st->sample, .sampled = sampled, .hidden = hidden};
}

static int init_states(const vks_sched_params *p, const vks_sequence *seqs, int n, uint32_t seq_base,
                       const uint32_t *seq_index, vks_seq_state *states) {
    for (int s = 0; s < n; s++) {
        uint32_t index = seq_index ? seq_index[s] : seq_base + (uint32_t)s;
        int rc = vks_seq_init(&states[s], p, seqs[s].ids, seqs[s].n_prompt, index, (uint32_t)s);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* Hands the generated ids (and recorded log-probabilities) back to the caller's sequences. */
static void export_states(vks_seq_state *states, vks_sequence *seqs, int n, float **logp) {
    for (int s = 0; s < n; s++) {
        free(seqs[s].ids);
        seqs[s].ids = states[s].ids;
        seqs[s].n_ids = states[s].n_ids;
        seqs[s].stop_token = states[s].stop_token;
        states[s].ids = NULL;
        free(seqs[s].logp);
        seqs[s].logp = logp ? logp[s] : NULL;
        if (logp) logp[s] = NULL;
    }
}

float vks_token_logp(const float *row, int vocab, int32_t token) {
    double mx = row[0], sum = 0;
    for (int v = 1; v < vocab; v++) mx = row[v] > mx ? row[v] : mx;
    for (int v = 0; v < vocab; v++) sum += exp((double)row[v] - mx);
    return (float)((double)row[token] - mx - log(sum));
}

/* Per-sequence log-probabilities of the tokens sampled in this step, at the
 * index the token takes among the sequence's generated ids (read before
 * vks_sched_apply appends them). */
static void record_logp(const vks_step *st, const vks_seq_state *states, const float *step_logp, int vocab,
                        const int32_t *sampled, float **logp) {
    for (int i = 0; i < st->n_out; i++) {
        const vks_seq_state *q = &states[st->out_seq[i]];
        int k = q->n_ids - q->n_prompt;
        if (q->done || k < 0 || sampled[i] < 0 || sampled[i] >= vocab) continue;
        logp[st->out_seq[i]][k] = step_logp[i];
    }
}

/* The furthest position any sequence holds (0-based, at most steps - 1):
 * the progress of a run of `steps` positions, prefill included. */
static int furthest_position(const vks_seq_state *states, int n, int steps) {
    int furthest = 0;
    for (int s = 0; s < n; s++)
        if (states[s].n_ids > furthest) furthest = states[s].n_ids;
    return furthest > steps ? steps - 1 : furthest - 1;
}

static int run_schedule(vks_engine *e, const vks_generate_options *o, const vks_sched_params *p,
                        vks_seq_state *states, int n, vks_step *st, float **logp) {
    int D = vks_engine_config(e)->dim, V = vks_engine_config(e)->vocab_size;
    int32_t *sampled = malloc(sizeof(int32_t) * (size_t)st->max_rows);
    float *hidden = o->on_hidden ? malloc(sizeof(float) * (size_t)st->max_rows * (size_t)D) : NULL;
    float *step_logp = logp ? malloc(sizeof(float) * (size_t)st->max_rows) : NULL;
    int rc = !sampled || (o->on_hidden && !hidden) || (logp && !step_logp) ? vks_set_error(VKS_ERR_NOMEM, "out of host memory")
                                                                             : VKS_OK;
    while (rc == VKS_OK && vks_sched_build(p, states, n, st)) {
        vks_forward_batch fb = vks_step_batch(st, sampled, hidden);
        fb.sampled_logp = step_logp;
        if ((rc = vks_engine_forward(e, &fb))) break;
        if (o->on_hidden) o->on_hidden(o->user, st, states, hidden, sampled);
        if (logp) record_logp(st, states, step_logp, V, sampled, logp);
        vks_sched_apply(p, states, st, sampled);
        if (o->on_step && !st->prefill) o->on_step(o->user, furthest_position(states, n, p->steps), p->steps, st->n_rows);
    }
    free(sampled);
    free(hidden);
    free(step_logp);
    return rc;
}

/* One array per sequence, room for every position it can reach (and a stop token). */
static float **alloc_logp(const vks_sched_params *p, int n) {
    float **logp = calloc((size_t)n, sizeof *logp);
    for (int s = 0; logp && s < n; s++)
        if (!(logp[s] = calloc((size_t)p->steps + 1, sizeof **logp))) {
            for (int i = 0; i < s; i++) free(logp[i]);
            free(logp);
            return NULL;
        }
    return logp;
}

int vks_generate(vks_engine *e, const vks_generate_options *o, vks_sequence *seqs, int n, uint32_t seq_base) {
    if (!e || !o || !seqs || n <= 0) return vks_set_error(VKS_ERR_ARG, "vks_generate: bad arguments");
    const vks_model_config *cfg = vks_engine_config(e);
    if (!vks_engine_has_embed(e) || !vks_engine_has_head(e))
        return vks_set_error(VKS_ERR_ARG, "vks_generate needs an engine holding every layer");
    if (n > vks_engine_max_out_rows(e))
        return vks_set_error(VKS_ERR_ARG, "%d sequences exceed the engine's %d output rows", n, vks_engine_max_out_rows(e));
    vks_sched_params p = o->sched;
    p.steps = vks_sched_steps(p.steps, cfg->seq_len);
    vks_seq_state *states = calloc((size_t)n, sizeof *states);
    vks_step st;
    int rc = states ? vks_step_alloc(&st, vks_engine_max_rows(e)) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (rc) { free(states); return rc; }
    float **logp = o->record_logp ? alloc_logp(&p, n) : NULL;
    if (o->record_logp && !logp) rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (rc == VKS_OK) rc = init_states(&p, seqs, n, seq_base, o->seq_index, states);
    if (rc == VKS_OK) rc = run_schedule(e, o, &p, states, n, &st, logp);
    if (rc == VKS_OK) export_states(states, seqs, n, logp);
    for (int s = 0; s < n; s++) vks_seq_free(&states[s]);
    for (int s = 0; logp && s < n; s++) free(logp[s]);
    free(logp);
    free(states);
    vks_step_free(&st);
    return rc;
}

void vks_sequence_free(vks_sequence *s) {
    if (!s) return;
    free(s->ids);
    free(s->proofs);
    free(s->logp);
    for (int i = 0; s->stage_proofs && i < s->n_stage_proofs; i++) free(s->stage_proofs[i].proofs);
    free(s->stage_proofs);
    s->stage_proofs = NULL;
    s->n_stage_proofs = 0;
    s->ids = NULL;
    s->proofs = NULL;
    s->logp = NULL;
    s->n_ids = 0;
    s->proof_bytes = 0;
}
