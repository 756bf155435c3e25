/* vks_toploc.h: TOPLOC proofs of inference (arXiv 2501.16007, following its
 * public implementation), and a builder that makes them off the GPU's path.
 *
 * Committed rows: the final hidden state after the last RMSNorm, one row per
 * position that samples a token (row 0: the last prompt position; row t: the
 * position that produced output token t), rounded to bf16. Rows are grouped
 * in chunks of 32 (the last may be shorter). Per chunk, the chunk is flattened
 * to n = rows * dim values and the k = min(128, n) largest by |value| are
 * taken; ties go to the lower flat index. With y_i the bf16 bit pattern of
 * value i and x_i = idx_i mod m (m: the largest integer <= 65497 making the
 * x_i pairwise distinct), the proof is the polynomial of degree < k through
 * the (x_i, y_i) over GF(65497), as ascending monomial coefficients.
 *
 * Bytes of one chunk proof (always 258): m as big-endian uint16, then 128
 * big-endian uint16 coefficients (those above degree k-1 are zero when a
 * chunk has fewer than 128 values).
 *
 * Checking a chunk: the verifier takes its own top-k indices, evaluates the
 * polynomial at idx mod m, and compares bf16 exponent bits (0x7F80) and
 * mantissa bits (0x007F) with its own values: exp_mismatches counts differing
 * exponents; the absolute mantissa differences where exponents agree give a
 * mean and a median. Accepted iff all three are within the thresholds. */
#ifndef VKS_TOPLOC_H
#define VKS_TOPLOC_H
#include "vks_engine.h"
#include "vks_rollout.h"

enum {
    VKS_TOPLOC_CHUNK_ROWS = 32,
    VKS_TOPLOC_K = 128,
    VKS_TOPLOC_PRIME = 65497,
    VKS_TOPLOC_PROOF_BYTES = 2 + 2 * VKS_TOPLOC_K, /* 258 */
};

/* Bytes of the proofs for n_rows committed rows: ceil(n_rows/32) * 258. */
size_t vks_toploc_proof_size(size_t n_rows);

/* Builds the proof of one chunk of n_rows (1..32) rows of dim floats.
 * The rows are rounded to bf16 here. */
int vks_toploc_chunk_proof(const float *rows, int n_rows, int dim, uint8_t out[VKS_TOPLOC_PROOF_BYTES]);
/* Same, from rows already rounded to bf16 patterns. */
int vks_toploc_chunk_proof_bf16(const uint16_t *rows, int n_rows, int dim, uint8_t out[VKS_TOPLOC_PROOF_BYTES]);
/* Builds the proofs of n_rows rows (every chunk); out holds vks_toploc_proof_size(n_rows) bytes. */
int vks_toploc_build(const float *rows, int n_rows, int dim, uint8_t *out);

typedef struct {
    int max_exp_mismatches; /* 38 */
    double max_mant_mean;   /* 10 */
    double max_mant_median; /* 8 */
} vks_toploc_thresholds;
void vks_toploc_thresholds_default(vks_toploc_thresholds *t);

typedef struct {
    int exp_mismatches;
    int n_compared;
    double mant_mean, mant_median; /* over the values whose exponents agree; 1e9 when none do */
} vks_toploc_stats;

/* Checks one chunk proof (len bytes) against the verifier's own rows.
 * Returns VKS_OK and sets *accepted and *st; a malformed proof (wrong length,
 * m = 0 or above the prime, a coefficient >= 65497) is a rejection with the
 * problem in why (never an error). Errors only for bad arguments. */
int vks_toploc_check_chunk(const uint8_t *proof, size_t len, const float *rows, int n_rows, int dim,
                           const vks_toploc_thresholds *th, bool *accepted, vks_toploc_stats *st,
                           char *why, size_t why_len);

/* ---- the polynomial layer (exposed for tests and fuzzing) ---- */
typedef struct {
    uint16_t m;
    uint16_t coeffs[VKS_TOPLOC_K];
} vks_toploc_poly;
/* Parses 258 bytes; returns VKS_ERR_FORMAT with a reason for m = 0, m > 65497,
 * a coefficient >= 65497 or a wrong length. */
int vks_toploc_poly_parse(const uint8_t *bytes, size_t len, vks_toploc_poly *out);
void vks_toploc_poly_write(const vks_toploc_poly *p, uint8_t out[VKS_TOPLOC_PROOF_BYTES]);
/* Interpolates through n (<= 128) points with pairwise distinct x < 65497. */
int vks_toploc_interpolate(const uint32_t *x, const uint16_t *y, int n, uint16_t coeffs[VKS_TOPLOC_K]);
/* Evaluates at x mod m (Horner, mod 65497). */
uint32_t vks_toploc_poly_eval(const vks_toploc_poly *p, uint32_t idx);
/* Indices of the k largest |bf16| values of v[0..n) (ties: lower index; NaN
 * ranks below every number), in ascending index order. Returns k. */
int vks_toploc_topk(const uint16_t *v, int n, int k, uint32_t *idx);

/* ---- builder: proofs made on a worker thread while the GPU runs ---- */
typedef struct vks_toploc_builder vks_toploc_builder;
/* n_seqs sequences of rows of dim floats. */
int vks_toploc_builder_create(int n_seqs, int dim, vks_toploc_builder **out);
/* Appends the next committed row of sequence seq (copied; rounded to bf16). */
int vks_toploc_builder_push(vks_toploc_builder *b, int seq, const float *row);
/* Flushes partial chunks and waits for the worker. */
int vks_toploc_builder_finish(vks_toploc_builder *b);
/* After finish: the proofs of seq (owned by the builder) and their length. */
const uint8_t *vks_toploc_builder_proofs(const vks_toploc_builder *b, int seq, size_t *len);
int vks_toploc_builder_rows(const vks_toploc_builder *b, int seq);
int vks_toploc_builder_dim(const vks_toploc_builder *b);
/* After finish: seconds the worker thread spent building proofs. */
double vks_toploc_builder_busy_s(const vks_toploc_builder *b);
void vks_toploc_builder_destroy(vks_toploc_builder *b);

/* ---- verification of rollout samples (src/toploc/verify.c) ----
 * Per sample: structure (model hash, ids in the vocabulary, lengths within
 * max_steps and the context, a sample that stops early ends with a stop token
 * and has none before), then one prefill over prompt + output[:-1] giving the
 * N committed rows and their logits; every TOPLOC chunk is checked, and the
 * sampler is replayed: from the verifier's logits, the sample's seed, seq,
 * temperature, top-k and top-p, each emitted token must be the seeded
 * Gumbel-max draw or within logit_margin of it.
 *
 * The margin. With scores s_i = l_i / T + g_i (g_i the seeded Gumbel noise),
 * a verifier whose logits differ from the generator's by at most e per entry
 * sees each score moved by at most e / T, so an honest token's score gap is at
 * most 2e / T; in logits, T * gap <= 2e whatever the temperature. The gap is
 * therefore measured in logits (T * (best score - token score); at T = 0 the
 * plain logit gap) and compared with logit_margin. Measured e between f32
 * implementations on stories260K (GPU f32 on lavapipe, tiled matmul and
 * matvec, vs the C reference in double; test_toploc prints it): 3.9e-5, so
 * honest gaps stay below 7.7e-5; the default 1e-3 is 13 times that bound (26
 * times e), room for other devices and larger logits. What it allows: a forger
 * may emit another token than the draw only where its score is within
 * margin / T of the best one; for one swapped token that is a chance of about
 * margin / T (the top-two Gumbel spacing is about Exp(1)), 0.1% at T = 1. The
 * previous 0.01 let 1 of 200 runner-up swaps through (gap 0.0039).
 *
 * The task. TOPLOC commits only the rows of sampling positions, so a changed
 * prompt token can leave every committed bf16 value and every draw unchanged
 * (the rows move by less than bf16 resolution). A verifier that knows the task
 * (which prompt each sample was given) sets task_prompts: the sample with
 * stream index seq must carry exactly task_prompts[seq].
 *
 * Stage commitments (vks_rollout_sample.stage_proofs, from a pipeline): the
 * same prefill taps the residual stream at each stage's last layer for the N
 * committed rows, and the commitments are checked in stage order with the
 * same thresholds before the final proofs; the first that fails is the
 * reason ("stage K (rank R, layers [a,b)): TOPLOC chunk ..."), a failed
 * final proof then reads "last stage (layers [b,n)): ...". Their ranges must
 * tile the layers from 0 and end before the last one, each proof of the N
 * rows' size (else the sample is rejected naming the entry). */
typedef struct {
    vks_toploc_thresholds toploc;
    float logit_margin;                      /* default 1e-3 (see above) */
    uint8_t model_hash[32];                  /* the verifier's model: vks_lora_model_hash(base, lora) */
    int32_t stop_ids[VKS_ROLLOUT_MAX_STOP];  /* the stop tokens the samples were generated with */
    int n_stop;
    /* The task, when known (NULL: prompts are not checked): prompt q is
     * task_prompts[q], task_prompt_lens[q] ids, for q < n_task_prompts. */
    const int32_t *const *task_prompts;
    const int *task_prompt_lens;
    int n_task_prompts;
    /* vks_verify_batch_cpu: threads of the fast f32 forward (vks_cpu.h; <= 0:
     * every core), or the float64 reference forward when cpu_reference. */
    int cpu_threads;
    bool cpu_reference;
    /* vks_verify_batch_cpu: the LoRA adapter the samples were made with
     * (NULL: none); vks_verify_batch's engine holds its own (vks_engine_set_lora). */
    const vks_lora_adapter *lora;
    /* The samples were made with an f16 KV cache (rollout header kv_type):
     * the CPU forwards replay one; vks_verify_batch's engine must hold one. */
    bool kv_f16;
    /* NULL, or per sample (NULL or n_output floats): the log-probability
     * (temperature 1, whole vocabulary, as vks_generate's record_logp) the
     * verifier's logits give each output token, written as the sampler is
     * replayed (a sample rejected before its replay gets none). */
    float *const *logp_out;
} vks_verify_options;
enum { VKS_VERIFY_MAX_TASK_PROMPTS = 1 << 24 };
/* Default thresholds and margin; no stop tokens, no task, zero hash (the caller sets the hash and stops). */
void vks_verify_options_default(vks_verify_options *o);

typedef struct {
    bool accepted;
    char reason[256];         /* why rejected: which check, chunk or position ("" when accepted) */
    int n_chunks;
    vks_toploc_stats worst;   /* each statistic's largest value over the chunks */
    float max_gap;            /* largest sampler gap seen, in logits */
    int blamed_rank;          /* rejected by a pipeline stage's commitment: that stage's rank (as its
                               * stage_proofs entry names it); -1 otherwise */
} vks_verdict;

/* ---- rollout files from generation ----
 * The writer checks at create that `path` can be made, collects proofs from
 * the committed hidden rows (the vks_generate_options.on_hidden hook body;
 * toploc false: none made here, e.g. the pipeline's last stage makes them),
 * and at finish writes the header and one sample per sequence (output ids:
 * the generated ids, then the stop token when one ended it; seq index
 * i + seq_base; proofs from this writer, else seqs[i].proofs) through a
 * temporary file: on failure nothing stays at `path`. */
typedef struct vks_rollout_writer vks_rollout_writer;
/* lora: the adapter generating with m (NULL: none); the file names the
 * model by vks_lora_model_hash(m, lora). */
int vks_rollout_writer_create(const char *path, const vks_model *m, const vks_lora_adapter *lora,
                              const char *model_name, const vks_sched_params *sp, int n_seqs, bool toploc,
                              vks_rollout_writer **out);
/* Names the policy that generates: trainer step `step` (>= 0), its weights
 * at `weights` (a checkpoint directory, "shardcast step N"; NULL: not said);
 * in the header and every sample (vks_rollout.h). */
void vks_rollout_writer_set_policy(vks_rollout_writer *r, int64_t step, const char *weights);
/* Records that the generator's engine keeps an f16 KV cache (header kv_type). */
void vks_rollout_writer_set_kv_f16(vks_rollout_writer *r, bool on);
/* A failure here is kept and returned by finish (the hook cannot return one). */
void vks_rollout_writer_on_hidden(vks_rollout_writer *r, const vks_step *st, const vks_seq_state *states,
                                  const float *hidden);
int vks_rollout_writer_finish(vks_rollout_writer *r, const vks_sequence *seqs, int n, uint32_t seq_base);
/* The same for a vks_generate with seq_index (NULL: seq_base + i): sample i's stream index is seq_index[i]. */
int vks_rollout_writer_finish_indexed(vks_rollout_writer *r, const vks_sequence *seqs, int n, uint32_t seq_base,
                                      const uint32_t *seq_index);
void vks_rollout_writer_destroy(vks_rollout_writer *r);

/* File-level rules that reject every sample of a rollout file: the file must
 * name the verifier's model (model_hash) and stop only on tokens the verifier
 * trusts. Returns the reason, or NULL when the header passes. */
const char *vks_verify_header_problem(const vks_rollout_header *h, const uint8_t model_hash[32],
                                      const int32_t *trusted_stop, int n_trusted);

/* Verifies n samples on a GPU engine holding every layer: several sequences'
 * rows go through each vks_engine_forward (one KV slot each, up to the
 * engine's rows and output rows). The n samples are one batch: the engine's
 * KV cache is resized to n slots of the longest sample's positions (prompt +
 * output, at most the model's context) when it holds less, in groups where
 * that does not fit the device; a sample that does not fit alone is
 * rejected. Returns an error only when the engine fails; rejections are
 * verdicts. */
int vks_verify_batch(vks_engine *e, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                     vks_verdict *out);
/* The same without a GPU: all n samples go through one batched prefill of the
 * fast f32 CPU forward (vks_cpu.h) on o->cpu_threads threads, or one by one
 * through the float64 reference forward when o->cpu_reference. */
int vks_verify_batch_cpu(const vks_model *m, const vks_verify_options *o, const vks_rollout_sample *samples, int n,
                         vks_verdict *out);
#endif
