/* Batched generation with llama2.c semantics: `steps` counts positions, the
 * prompt included; each prompt occupies one KV slot; prompts are prefilled in
 * row chunks, then all live sequences decode one row each per forward. The
 * sampler runs on the GPU, keyed by (seed, sequence index, position). */
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"

typedef struct {
    int32_t *tokens;
    uint32_t *slot, *pos, *out_rows;
    vks_gpu_sample_row *sample;
    int32_t *sampled;
    int *out_seq; /* which sequence each output row belongs to */
    int n_rows, n_out;
} row_batch;

static int batch_alloc(row_batch *b, int max_rows) {
    size_t n = (size_t)max_rows;
    b->tokens = malloc(n * 4);
    b->slot = malloc(n * 4);
    b->pos = malloc(n * 4);
    b->out_rows = malloc(n * 4);
    b->sample = malloc(n * sizeof *b->sample);
    b->sampled = malloc(n * 4);
    b->out_seq = malloc(n * sizeof(int));
    if (!b->tokens || !b->slot || !b->pos || !b->out_rows || !b->sample || !b->sampled || !b->out_seq)
        return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    return VKS_OK;
}

static void batch_free(row_batch *b) {
    free(b->tokens); free(b->slot); free(b->pos); free(b->out_rows);
    free(b->sample); free(b->sampled); free(b->out_seq);
}

static vks_gpu_sample_row sample_row(const vks_generate_options *o, uint32_t seq, uint32_t pos) {
    return (vks_gpu_sample_row){.temperature = o->temperature, .top_k = o->top_k, .top_p = o->top_p,
                                .seed_lo = (uint32_t)o->seed, .seed_hi = (uint32_t)(o->seed >> 32),
                                .seq = seq, .pos = pos};
}

static void add_row(row_batch *b, int32_t token, uint32_t slot, uint32_t pos) {
    b->tokens[b->n_rows] = token;
    b->slot[b->n_rows] = slot;
    b->pos[b->n_rows] = pos;
    b->n_rows++;
}

static void add_output(row_batch *b, const vks_generate_options *o, int seq, uint32_t seq_index) {
    b->out_rows[b->n_out] = (uint32_t)(b->n_rows - 1);
    b->sample[b->n_out] = sample_row(o, seq_index, b->pos[b->n_rows - 1]);
    b->out_seq[b->n_out] = seq;
    b->n_out++;
}

static int run_batch(vks_engine *e, row_batch *b) {
    vks_forward_batch fb = {.n_rows = b->n_rows, .tokens = b->tokens, .slot = b->slot, .pos = b->pos,
                            .n_out = b->n_out, .out_rows = b->out_rows, .sample = b->sample, .sampled = b->sampled};
    return vks_engine_forward(e, &fb);
}

static bool is_stop(const vks_generate_options *o, int32_t t) {
    return t == o->stop_token_a || t == o->stop_token_b;
}

/* Appends sampled tokens; a stop token ends the sequence and is not kept
 * (run.c prints nothing for it). */
static void take_samples(const vks_generate_options *o, row_batch *b, vks_sequence *seqs, bool *done, int steps) {
    for (int i = 0; i < b->n_out; i++) {
        vks_sequence *s = &seqs[b->out_seq[i]];
        int32_t t = b->sampled[i];
        if (is_stop(o, t)) { done[b->out_seq[i]] = true; continue; }
        s->ids[s->n_ids++] = t;
        if (s->n_ids >= steps + 1) done[b->out_seq[i]] = true;
    }
}

/* Prefills every prompt: positions 0..n_prompt-1, the last one sampled.
 * A prompt of more than `steps` positions is only cut, as in run.c, which
 * forces prompt tokens up to position `steps`. */
static int prefill(vks_engine *e, const vks_generate_options *o, row_batch *b, vks_sequence *seqs, int n,
                   uint32_t seq_base, bool *done, int steps, int max_rows, int max_out) {
    b->n_rows = b->n_out = 0;
    for (int s = 0; s < n; s++) {
        if (seqs[s].n_prompt > steps) {
            seqs[s].n_ids = steps + 1;
            done[s] = true;
            continue;
        }
        for (int p = 0; p < seqs[s].n_prompt; p++) {
            add_row(b, seqs[s].ids[p], (uint32_t)s, (uint32_t)p);
            if (p == seqs[s].n_prompt - 1) add_output(b, o, s, seq_base + (uint32_t)s);
            if (b->n_rows == max_rows || b->n_out == max_out) {
                int rc = run_batch(e, b);
                if (rc) return rc;
                take_samples(o, b, seqs, done, steps);
                b->n_rows = b->n_out = 0;
            }
        }
    }
    if (b->n_rows == 0) return VKS_OK;
    int rc = run_batch(e, b);
    if (rc == VKS_OK) take_samples(o, b, seqs, done, steps);
    return rc;
}

static int decode(vks_engine *e, const vks_generate_options *o, row_batch *b, vks_sequence *seqs, int n,
                  uint32_t seq_base, bool *done, int steps) {
    for (int step = 0;; step++) {
        b->n_rows = b->n_out = 0;
        for (int s = 0; s < n; s++) {
            if (done[s]) continue;
            /* the last id sits at position n_ids-1; sampling it would produce position n_ids */
            if (seqs[s].n_ids > steps) { done[s] = true; continue; }
            add_row(b, seqs[s].ids[seqs[s].n_ids - 1], (uint32_t)s, (uint32_t)(seqs[s].n_ids - 1));
            add_output(b, o, s, seq_base + (uint32_t)s);
        }
        if (b->n_rows == 0) return VKS_OK;
        int rc = run_batch(e, b);
        if (rc) return rc;
        take_samples(o, b, seqs, done, steps);
        if (o->on_step) o->on_step(o->user, step, steps, b->n_rows);
    }
}

int vks_generate(vks_engine *e, const vks_generate_options *o, vks_sequence *seqs, int n, uint32_t seq_base) {
    if (!e || !o || !seqs || n <= 0) return vks_set_error(VKS_ERR_ARG, "vks_generate: bad arguments");
    const vks_model_config *cfg = vks_engine_config(e);
    if (!vks_engine_has_embed(e) || !vks_engine_has_head(e))
        return vks_set_error(VKS_ERR_ARG, "vks_generate needs an engine holding every layer");
    int steps = o->steps <= 0 || o->steps > cfg->seq_len ? cfg->seq_len : o->steps;
    for (int s = 0; s < n; s++) {
        if (seqs[s].n_prompt < 1) return vks_set_error(VKS_ERR_ARG, "prompt %d is empty (it needs at least BOS)", s);
        /* room for every position plus the token sampled at the last one */
        int32_t *ids = realloc(seqs[s].ids, sizeof(int32_t) * (size_t)(steps + seqs[s].n_prompt + 1));
        if (!ids) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        seqs[s].ids = ids;
        seqs[s].n_ids = seqs[s].n_prompt;
    }
    row_batch b = {0};
    bool *done = calloc((size_t)n, sizeof(bool));
    int max_rows = vks_engine_max_rows(e), max_out = vks_engine_max_out_rows(e);
    int rc = done ? batch_alloc(&b, max_rows) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (rc == VKS_OK && n > max_out)
        rc = vks_set_error(VKS_ERR_ARG, "%d sequences exceed the engine's %d output rows", n, max_out);
    if (rc == VKS_OK) rc = prefill(e, o, &b, seqs, n, seq_base, done, steps, max_rows, max_out);
    if (rc == VKS_OK) rc = decode(e, o, &b, seqs, n, seq_base, done, steps);
    batch_free(&b);
    free(done);
    return rc;
}

void vks_sequence_free(vks_sequence *s) {
    if (!s) return;
    free(s->ids);
    s->ids = NULL;
    s->n_ids = 0;
}
