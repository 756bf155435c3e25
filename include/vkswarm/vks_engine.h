/* vks_engine.h: the transformer forward on the GPU over a layer range (a
 * pipeline stage is a range), with its KV cache. Rows are tokens: each row
 * names its KV slot (sequence) and position, so one call can mix prefill
 * chunks of several sequences and decode steps. */
#ifndef VKS_ENGINE_H
#define VKS_ENGINE_H
#include "vks_gpu.h"
#include "vks_lora.h"
#include "vks_model.h"
#include "vks_ops.h"
#include "vks_sched.h"

typedef struct {
    int layer_begin, layer_end; /* [begin, end); 0,0 = all layers */
    vks_dtype dtype;            /* weight dtype on the device: f32, f16, bf16, or q8_0, q4_0,
                                   q4_k (quantized on upload; matrices whose rows are not whole
                                   blocks stay f16; norms and biases are f32) */
    bool keep_file_dtype;       /* ignore dtype: every matrix keeps its file's type (q6_k,
                                   which has no kernel yet, is dequantized to f16) */
    int max_rows;               /* rows per forward call (0: 256) */
    int max_out_rows;           /* rows producing logits per call (0: max_rows) */
    int n_slots;                /* sequences with a KV cache (0: 1) */
    int kv_len;                 /* positions per slot (0: model seq_len) */
    uint64_t max_chunk_bytes;   /* split weights above this (0: the device's binding limit) */
    bool f32_math;              /* no half-arithmetic kernels even where the device has them
                                   (verifiers: their logits are compared within a margin) */
    bool kv_f16;                /* the KV cache in halves (rounded to nearest even), attention split
                                   over keys (vks_op_attention_f16): half the cache memory and
                                   traffic; a verifier replays with the same type (issue 28) */
} vks_engine_options;

typedef struct vks_engine vks_engine;

/* Uploads the weights of the layer range (plus embedding when the range starts
 * at 0 and final norm + classifier when it ends at n_layers). Refuses with the
 * bytes needed and available when the model does not fit. */
int vks_engine_create(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, vks_engine **out);
/* The default weight-type policy: a model with block-quantized matrices
 * keeps its file types on the device (keep_file_dtype) unless the user asks
 * for a type; other models are converted to opt.dtype. */
bool vks_engine_keeps_file_types(const vks_model *m);
void vks_engine_destroy(vks_engine *e);
/* A LoRA adapter (vks_lora.h) for the forwards that follow: its matrices of
 * the engine's layer range go to the device beside the base, which stays as
 * it is (the forward adds scale B (A x) after each targeted product). NULL
 * removes it. An adapter of the same rank and targets replaces the previous
 * one in place; VKS_ERR_FORMAT when it was made for another model's shape.
 * On failure the engine has no adapter. */
int vks_engine_set_lora(vks_engine *e, const vks_lora_adapter *a);
bool vks_engine_has_lora(const vks_engine *e);
/* Device bytes this engine allocated (weights, KV cache, activations). */
uint64_t vks_engine_device_bytes(const vks_engine *e);
uint64_t vks_engine_weight_bytes(const vks_engine *e);
/* Device bytes that layer `layer` (its matrices, norms and biases), or the
 * token embedding table, takes with opt's weight types, as vks_engine_create
 * places them: the sizes pipeline placement plans with. 0 for a bad layer. */
uint64_t vks_engine_layer_bytes(const vks_model *m, const vks_engine_options *opt, int layer);
uint64_t vks_engine_embedding_bytes(const vks_model *m, const vks_engine_options *opt);
/* A rank's measurements for pipeline placement (vks_partition_auto). */
typedef struct {
    double seconds_per_layer;  /* measured step time of one layer at the run's batch */
    uint64_t free_bytes;       /* device memory available */
} vks_stage_measure;
/* This device's step time for layer 0 at `rows` rows (a warm-up, then the
 * mean of 3 forwards) and its free memory, for vks_partition_auto. opt gives
 * the weight types; the layer range and sizes are set here. */
int vks_engine_measure_stage(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, int rows,
                             vks_stage_measure *out);
/* Weight bytes one decode step reads: all but the embedding table (which is
 * only gathered from), unless it doubles as the classifier. */
uint64_t vks_engine_decode_weight_bytes(const vks_engine *e);
const vks_model_config *vks_engine_config(const vks_engine *e);
bool vks_engine_has_embed(const vks_engine *e);
bool vks_engine_has_head(const vks_engine *e);
int vks_engine_max_rows(const vks_engine *e);
int vks_engine_max_out_rows(const vks_engine *e);
int vks_engine_n_slots(const vks_engine *e);  /* KV slots (sequences) */
int vks_engine_kv_len(const vks_engine *e);   /* positions per slot */
bool vks_engine_kv_f16(const vks_engine *e);  /* the KV cache holds halves (options.kv_f16) */
/* VKS_OK when a KV cache of n_slots x kv_len positions (kv_len at most the
 * model's context) fits on the device in place of the engine's current one;
 * else an error with the bytes needed and available. */
int vks_engine_kv_fits(const vks_engine *e, int n_slots, int kv_len);
/* Replaces the KV cache by one of n_slots x kv_len positions (contents are
 * lost; weights and activations stay). Checked as vks_engine_kv_fits first;
 * when an allocation still fails the engine has no KV cache (0 slots, every
 * forward refused) until a later resize succeeds. */
int vks_engine_resize_kv(vks_engine *e, int n_slots, int kv_len);

typedef struct {
    int n_rows;
    vks_matmul_kind matmul_kind; /* AUTO, or DECODE / PREFILL: see vks_ops.h (batch invariance); also
                                    how attention groups rows (vks_op_attention_kind, same bits) */
    const int32_t *tokens;       /* [n_rows]; required when the engine has the embedding */
    const float *x_in;           /* [n_rows, dim]; required otherwise */
    const uint32_t *slot, *pos;  /* [n_rows] */
    /* Head outputs (engines with the head only): */
    int n_out;
    const uint32_t *out_rows;    /* [n_out] row indices whose logits are wanted */
    float *logits;               /* [n_out, vocab] or NULL */
    float *hidden;               /* [n_out, dim] final-norm rows or NULL */
    const vks_layer_taps *taps;  /* residual-stream taps of the output rows (vks_model.h) at boundaries
                                    inside the engine's range, or NULL */
    const vks_gpu_sample_row *sample; /* [n_out] or NULL: sample on the GPU */
    int32_t *sampled;            /* [n_out] sampled tokens (when sample != NULL) */
    float *sampled_logp;         /* [n_out] or NULL (needs sample): log-softmax(logits)[sampled] at
                                    temperature 1, computed on the device (token_logprob.comp) */
    /* Stage output (engines without the head): */
    float *x_out;                /* [n_rows, dim] residual stream after the range */
} vks_forward_batch;

/* Records the whole forward into one command buffer and submits it once. */
int vks_engine_forward(vks_engine *e, const vks_forward_batch *b);

/* What the engine's forwards did since it was created; counts are exact.
 * dispatches, barriers: executed; descriptor_writes: written by the host;
 * submits: queue submissions, transfers included. layer_*: the share of the
 * transformer layers (summed over layers; layers = layers run). wall_s: time
 * in vks_engine_forward, wait_s: of it blocked waiting for the device. */
typedef struct {
    uint64_t forwards, recorded; /* forwards; of them recorded (the rest replayed a recording) */
    uint64_t dispatches, barriers, descriptor_writes, submits;
    uint64_t layers, layer_dispatches, layer_barriers, layer_descriptor_writes;
    uint64_t download_bytes; /* device-to-host bytes the forwards copied out */
    double wall_s, wait_s;
} vks_engine_stats;
void vks_engine_stats_get(const vks_engine *e, vks_engine_stats *out);

/* ---- feed ids, collect logits (engine_feed.c) ---- */
/* Feeds ids[first..end) at those positions of KV slot `slot` (positions
 * before `first` must be in the cache already), in forwards of at most
 * `chunk` rows (0: as many as the engine takes), and collects the logits of
 * every position p into logits[p * vocab] (and, when hidden is not NULL, the
 * final-norm rows into hidden[p * dim]). The engine must hold every layer.
 * One sequence through a vks_feed. */
int vks_engine_logits(vks_engine *e, uint32_t slot, const int32_t *ids, int first, int end, int chunk, float *logits,
                      float *hidden);

/* One sequence of a feed: the token ids[p] goes to position p of KV slot
 * `slot` for p in [begin, end) (positions before begin must be in the cache
 * already); positions from out_begin on are output rows, whose logits (and
 * final-norm rows) are collected. */
typedef struct {
    uint32_t slot;
    const int32_t *ids; /* indexed by position */
    int begin, end, out_begin;
} vks_feed_seq;

typedef struct {
    int max_rows;      /* rows per forward (0 or more than the engine's: the engine's max_rows) */
    bool want_hidden;  /* collect the final-norm rows too */
    /* NULL: each forward's output rows go to one of two buffers of the feed,
     * which alternate. Else output row k of the whole feed (in feeding order)
     * goes to all_logits[k * vocab] (all_hidden[k * dim]): the caller holds
     * every row. */
    float *all_logits, *all_hidden;
    /* Residual-stream taps of the output rows at these layer boundaries
     * (vks_model.h; n_taps 0: none), into the feed's own buffers. */
    int n_taps;
    const int *tap_layers;
} vks_feed_options;

/* The output rows of one forward, in feeding order. */
typedef struct {
    int n;
    const int *seq, *pos; /* [n]: the row's sequence (index into the feed's) and position */
    const float *logits;  /* [n, vocab] */
    const float *hidden;  /* [n, dim] final-norm rows; NULL without want_hidden */
    const float *taps;    /* [n_taps, n, dim] (vks_feed_options.n_taps); NULL without */
} vks_feed_rows;

typedef struct vks_feed vks_feed;

/* Feeds the sequences in order, packing the next rows of consecutive
 * sequences into each forward: at most max_rows rows, of which at most the
 * engine's max_out_rows are output rows. The engine must hold every layer;
 * seqs (not the ids) is copied. */
int vks_feed_create(vks_engine *e, const vks_feed_seq *seqs, int n_seqs, const vks_feed_options *opt,
                    vks_feed **out);
/* Runs the next forward and points *rows at its output rows (NULL once every
 * row is fed; a forward of prompt rows only gives n == 0). Rows stay valid until
 * the next call but one (the buffers alternate), so a caller may check them on
 * another thread while the next forward runs, and until vks_feed_destroy. */
int vks_feed_next(vks_feed *f, const vks_feed_rows **rows);
void vks_feed_destroy(vks_feed *f);

/* ---- generation (generate.c) ---- */
typedef struct {
    /* steps (positions, prompt included, as llama2.c -n; 0 or more than the
     * model's context: the context), sampling, seed and stop tokens */
    vks_sched_params sched;
    /* Progress callback (may be NULL): after each decode step, the last position
     * any sequence holds (0-based) of n_steps, and the rows of the step. */
    void (*on_step)(void *user, int step, int n_steps, int active);
    /* Called after every forward with the final-norm hidden rows [step->n_out, dim]
     * of the sampling rows and the tokens sampled from them, before they are
     * applied (may be NULL; TOPLOC proofs are built from these rows). */
    void (*on_hidden)(void *user, const vks_step *step, const vks_seq_state *seqs,
                      const float *hidden, const int32_t *sampled);
    void *user;
    /* Record each sampled token's log-probability in vks_sequence.logp: the
     * model's log-softmax at temperature 1, before top-k/top-p (what a
     * trainer recomputes), from the logits of the same forward: computed on
     * the device (vks_forward_batch.sampled_logp), one float per sampling
     * row downloaded. */
    bool record_logp;
    /* NULL: sequence s samples with seq index seq_base + s; else with seq_index[s] (a multi-turn episode's
     * later turns keep their sequence's index when the others have ended) */
    const uint32_t *seq_index;
} vks_generate_options;

/* One stage's commitment of the activations it handed on: layers
 * [layer_begin, layer_end) ran on rank `rank`. */
typedef struct {
    int rank;
    int layer_begin, layer_end;
    uint8_t *proofs;
    size_t proof_bytes;
} vks_stage_proof;

typedef struct {
    int32_t *ids;    /* prompt ids followed by generated ids (malloc'd) */
    int n_ids;
    int n_prompt;
    int32_t stop_token; /* the stop token that ended it (not in ids), or -1 */
    uint8_t *proofs;    /* TOPLOC chunk proofs when the producer made them (malloc'd), else NULL */
    size_t proof_bytes;
    /* A pipeline's stage commitments (malloc'd), else NULL */
    vks_stage_proof *stage_proofs;
    int n_stage_proofs;
    /* With record_logp (malloc'd, else NULL): logp[i] for generated id
     * n_prompt + i, then one more for the stop token when one ended it. */
    float *logp;
} vks_sequence;

/* The forward of one schedule step: its rows, tokens, KV slots and
 * positions, the matmul kind (prefill or decode), its sampling rows with
 * their sampler parameters, and where the sampled tokens and (when not NULL)
 * the final-norm hidden rows go. */
vks_forward_batch vks_step_batch(const vks_step *st, int32_t *sampled, float *hidden);

/* Runs every prompt as one batch (one KV slot each; the engine needs at
 * least n_seqs slots). Sequence s samples with seq index seq_base + s (or
 * opt->seq_index[s]). */
int vks_generate(vks_engine *e, const vks_generate_options *opt, vks_sequence *seqs, int n_seqs,
                 uint32_t seq_base);
void vks_sequence_free(vks_sequence *s);
/* log-softmax(row)[token] in double, at temperature 1: what record_logp
 * stores (token must lie in [0, vocab)). */
float vks_token_logp(const float *row, int vocab, int32_t token);
#endif
