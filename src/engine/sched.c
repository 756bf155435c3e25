/* Generation schedule (see vks_sched.h). */
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_sched.h"

int vks_step_alloc(vks_step *s, int max_rows) {
    memset(s, 0, sizeof *s);
    if (max_rows <= 0) return vks_set_error(VKS_ERR_ARG, "step: %d rows", max_rows);
    size_t n = (size_t)max_rows;
    s->tokens = malloc(n * 4);
    s->slot = malloc(n * 4);
    s->pos = malloc(n * 4);
    s->seq = malloc(n * 4);
    s->out_rows = malloc(n * 4);
    s->out_seq = malloc(n * sizeof(int));
    s->sample = malloc(n * sizeof *s->sample);
    s->max_rows = max_rows;
    if (!s->tokens || !s->slot || !s->pos || !s->seq || !s->out_rows || !s->out_seq || !s->sample) {
        vks_step_free(s);
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    }
    return VKS_OK;
}

void vks_step_free(vks_step *s) {
    free(s->tokens); free(s->slot); free(s->pos); free(s->seq);
    free(s->out_rows); free(s->out_seq); free(s->sample);
    memset(s, 0, sizeof *s);
}

int vks_seq_init(vks_seq_state *s, const vks_sched_params *p, const int32_t *prompt, int n_prompt,
                 uint32_t seq_index, uint32_t slot) {
    memset(s, 0, sizeof *s);
    if (!p || !prompt || n_prompt < 1 || p->steps < 1)
        return vks_set_error(VKS_ERR_ARG, "sequence %u: empty prompt (it needs at least BOS)", seq_index);
    /* every position plus the token sampled at the last one; a prompt longer
     * than `steps` is only cut (run.c forces prompt tokens up to position steps) */
    size_t cap = (size_t)(n_prompt > p->steps ? n_prompt : p->steps) + 1;
    s->ids = malloc(cap * sizeof(int32_t));
    if (!s->ids) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    memcpy(s->ids, prompt, sizeof(int32_t) * (size_t)n_prompt);
    s->n_ids = s->n_prompt = n_prompt;
    s->seq_index = seq_index;
    s->slot = slot;
    s->stop_token = -1;
    if (n_prompt > p->steps) {
        s->n_ids = p->steps + 1;
        s->done = true;
    }
    return VKS_OK;
}

void vks_seq_free(vks_seq_state *s) {
    free(s->ids);
    memset(s, 0, sizeof *s);
    s->done = true; /* an empty slot takes no part in any step */
}

vks_gpu_sample_row vks_sched_sample_row(const vks_sched_params *p, uint32_t seq_index, uint32_t pos) {
    return (vks_gpu_sample_row){.temperature = p->temperature, .top_k = p->top_k, .top_p = p->top_p,
                                .seed_lo = (uint32_t)p->seed, .seed_hi = (uint32_t)(p->seed >> 32),
                                .seq = seq_index, .pos = pos};
}

static void add_row(vks_step *st, const vks_seq_state *s, int32_t token, uint32_t pos) {
    st->tokens[st->n_rows] = token;
    st->slot[st->n_rows] = s->slot;
    st->pos[st->n_rows] = pos;
    st->seq[st->n_rows] = s->seq_index;
    st->n_rows++;
}

static void add_out(const vks_sched_params *p, vks_step *st, const vks_seq_state *s, int seq_i) {
    int r = st->n_rows - 1;
    st->out_rows[st->n_out] = (uint32_t)r;
    st->out_seq[st->n_out] = seq_i;
    st->sample[st->n_out] = vks_sched_sample_row(p, s->seq_index, st->pos[r]);
    st->n_out++;
}

/* Prompt chunks of as many sequences as fit; the last prompt row samples. */
static void build_prefill(const vks_sched_params *p, vks_seq_state *seqs, int n, vks_step *st) {
    for (int i = 0; i < n && st->n_rows < st->max_rows; i++) {
        vks_seq_state *s = &seqs[i];
        while (!s->done && s->ids && s->fed < s->n_prompt && st->n_rows < st->max_rows) {
            add_row(st, s, s->ids[s->fed], (uint32_t)s->fed);
            s->fed++;
            if (s->fed == s->n_prompt) add_out(p, st, s, i);
        }
    }
}

/* One row per live sequence: its last id at position n_ids - 1. */
static void build_decode(const vks_sched_params *p, vks_seq_state *seqs, int n, vks_step *st) {
    for (int i = 0; i < n && st->n_rows < st->max_rows; i++) {
        vks_seq_state *s = &seqs[i];
        if (s->done || !s->ids) continue;
        if (s->n_ids > p->steps) { s->done = true; continue; }
        add_row(st, s, s->ids[s->n_ids - 1], (uint32_t)(s->n_ids - 1));
        add_out(p, st, s, i);
    }
}

bool vks_sched_build(const vks_sched_params *p, vks_seq_state *seqs, int n, vks_step *st) {
    st->n_rows = st->n_out = 0;
    bool pending_prompt = false;
    for (int i = 0; i < n; i++) pending_prompt |= !seqs[i].done && seqs[i].ids && seqs[i].fed < seqs[i].n_prompt;
    st->prefill = pending_prompt;
    if (pending_prompt) build_prefill(p, seqs, n, st);
    else build_decode(p, seqs, n, st);
    return st->n_rows > 0;
}

static bool is_stop(const vks_sched_params *p, int32_t t) { return t == p->stop_token_a || t == p->stop_token_b; }

void vks_sched_apply(const vks_sched_params *p, vks_seq_state *seqs, const vks_step *st, const int32_t *sampled) {
    for (int i = 0; i < st->n_out; i++) {
        vks_seq_state *s = &seqs[st->out_seq[i]];
        if (s->done) continue;
        /* a stop token ends the sequence and is not kept: run.c prints nothing for it */
        if (is_stop(p, sampled[i])) {
            s->done = true;
            s->stop_token = sampled[i];
            continue;
        }
        s->ids[s->n_ids++] = sampled[i];
        if (s->n_ids > p->steps) s->done = true;
    }
}

int vks_sched_steps(int steps, int seq_len) { return steps <= 0 || steps > seq_len ? seq_len : steps; }
