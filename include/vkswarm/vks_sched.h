/* vks_sched.h: the generation schedule shared by single-GPU generation and the
 * pipeline's first stage: sequences with llama2.c semantics (`steps` counts
 * positions, prompt included; forced prompt tokens, then sampled ones; stop
 * tokens end a sequence), built into steps of rows. A step is either prefill
 * rows (prompt chunks, several sequences) or decode rows (one per live
 * sequence), never both: a row's arithmetic then does not depend on what else
 * is in the batch. */
#ifndef VKS_SCHED_H
#define VKS_SCHED_H
#include "vks_ops.h"

typedef struct {
    int steps;                      /* positions, prompt included */
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    int stop_token_a, stop_token_b; /* -1: none */
} vks_sched_params;

typedef struct {
    int32_t *ids;       /* prompt ids, then generated ids; capacity steps + 1 */
    int n_ids, n_prompt;
    int fed;            /* prompt positions already sent through a forward */
    uint32_t seq_index; /* keys the sampler's RNG */
    uint32_t slot;      /* KV cache slot */
    bool done;
    int32_t stop_token; /* the stop token that ended it, or -1 */
} vks_seq_state;

typedef struct {
    int n_rows, n_out;
    bool prefill;
    int32_t *tokens;
    uint32_t *slot, *pos, *seq; /* seq: sequence index (RNG key) per row */
    uint32_t *out_rows;         /* rows that sample */
    int *out_seq;               /* index into the vks_seq_state array per out row */
    vks_gpu_sample_row *sample; /* sampler parameters per out row */
    int max_rows;
} vks_step;

int vks_step_alloc(vks_step *s, int max_rows);
void vks_step_free(vks_step *s);

/* Takes ownership of `prompt` ids (copied); fails on an empty prompt. */
/* The steps a run takes: `steps`, or the model's context seq_len when steps
 * is 0 or more than that. */
int vks_sched_steps(int steps, int seq_len);
int vks_seq_init(vks_seq_state *s, const vks_sched_params *p, const int32_t *prompt, int n_prompt,
                 uint32_t seq_index, uint32_t slot);
void vks_seq_free(vks_seq_state *s);

vks_gpu_sample_row vks_sched_sample_row(const vks_sched_params *p, uint32_t seq_index, uint32_t pos);
/* Builds the next step over seqs[0..n); returns false when every sequence is done. */
bool vks_sched_build(const vks_sched_params *p, vks_seq_state *seqs, int n, vks_step *step);
/* Applies the tokens sampled for step's out rows. */
void vks_sched_apply(const vks_sched_params *p, vks_seq_state *seqs, const vks_step *step, const int32_t *sampled);
#endif
