/* vks_rollout.h: rollout files (JSONL). The first line describes the format
 * and the model:
 *   {"format":"vkswarm-rollouts","version":1,"model":NAME,"model_hash":HEX64,
 *    "stop_ids":[1,2],"toploc":{"chunk_rows":32,"k":128,"prime":65497}}
 * plus "kv_type":"f16" when the generator's KV cache held halves (issue 28;
 * the verifier's engine then uses one too; absent: f32, the files of f32
 * runs are unchanged).
 * then one sample per line:
 *   {"id":STR,"prompt_ids":[..],"output_ids":[..],"seed":U64,"seq":U32,
 *    "temperature":X,"top_k":K,"top_p":P,"max_steps":N,"model_hash":HEX64,
 *    "proofs":BASE64}
 * and, from a pipeline whose stages commit what they hand on,
 *    "stage_proofs":[{"rank":R,"layers":[first,end],"proofs":BASE64},..]
 * one entry per stage that hands activations on, in stage order: TOPLOC
 * chunk proofs (vks_toploc.h) of the residual stream after layer end-1, at
 * the sampling positions (the rows the final proofs commit), rounded to bf16
 * as the stage sent them. Files without the field are as before.
 * The policy that made them (issue 36; `vkswarm rl`'s rollout files): the
 * header holds "policy_step":N (the trainer step whose weights generated
 * every sample; 0: the start) and "policy_weights":STR (where those weights
 * are: a checkpoint directory, or the Shardcast step an inference rank took
 * them from), each sample "policy_step":N. Optional: a file without them (an
 * older one, or `vkswarm generate`'s) reads as before, the policy unknown.
 * output_ids includes the stop token when generation stopped on one. seq is
 * the sampler's stream index (the prompt's index in its generation batch):
 * the sampler is keyed by (seed, seq, position). max_steps counts positions,
 * prompt included (llama2.c -n). Unknown fields are ignored (the RL issue adds
 * rewards and advantages). The parser treats every line as hostile: limits on
 * lengths and counts, strict types and ranges, one-line errors. */
#ifndef VKS_ROLLOUT_H
#define VKS_ROLLOUT_H
#include "vks_common.h"
#include "vks_engine.h"
#include <stdio.h>

enum {
    VKS_ROLLOUT_VERSION = 1,
    VKS_ROLLOUT_MAX_STOP = 8,
    VKS_ROLLOUT_MAX_IDS = 1 << 20,           /* per list */
    VKS_ROLLOUT_MAX_ID_LEN = 256,            /* bytes of "id" */
    VKS_ROLLOUT_MAX_LINE = 64 << 20,         /* bytes per line */
    VKS_ROLLOUT_MAX_STAGES = 64,             /* stage_proofs entries */
    VKS_ROLLOUT_MAX_RANK = 1 << 24,          /* a stage's rank */
    VKS_ROLLOUT_MAX_LAYERS = 1 << 16,        /* layer numbers in stage_proofs */
    VKS_ROLLOUT_MAX_POLICY_STEP = 1 << 30,   /* policy_step */
};

/* vks_stage_proof (one stage's commitment): vks_engine.h. */

typedef struct {
    int version;
    char model[256];
    uint8_t model_hash[32];
    int32_t stop_ids[VKS_ROLLOUT_MAX_STOP];
    int n_stop;
    bool kv_f16; /* "kv_type":"f16": made with an f16 KV cache, replayed with one (absent: f32) */
    bool has_policy;          /* "policy_step" present (false: unknown) */
    int64_t policy_step;
    char policy_weights[512]; /* "" when absent */
} vks_rollout_header;

typedef struct {
    char *id;
    int32_t *prompt_ids, *output_ids;
    int n_prompt, n_output;
    uint64_t seed;
    uint32_t seq;
    float temperature, top_p;
    uint32_t top_k;
    int max_steps;
    uint8_t model_hash[32];
    uint8_t *proofs;
    size_t proof_bytes;
    vks_stage_proof *stage_proofs; /* NULL when the file has none */
    int n_stage_proofs;
    bool has_policy;               /* "policy_step" present (false: unknown) */
    int64_t policy_step;
} vks_rollout_sample;

/* Writes one JSON line (with '\n'). */
int vks_rollout_write_header(FILE *f, const vks_rollout_header *h);
int vks_rollout_write_sample(FILE *f, const vks_rollout_sample *s);

/* Parse one line (len bytes, without the newline). On failure: VKS_ERR_FORMAT
 * and a one-line reason (the caller prefixes file and line). */
int vks_rollout_parse_header(const char *line, size_t len, vks_rollout_header *out);
int vks_rollout_parse_sample(const char *line, size_t len, vks_rollout_sample *out);
void vks_rollout_sample_free(vks_rollout_sample *s);
/* Deep copy of n stage proofs into *out (malloc'd; NULL when n == 0), and their release. */
int vks_stage_proofs_copy(const vks_stage_proof *src, int n, vks_stage_proof **out);
void vks_stage_proofs_free(vks_stage_proof *p, int n);

typedef struct {
    vks_rollout_header header;
    vks_rollout_sample *samples;
    int n_samples;
} vks_rollout_file;

/* Reads a whole rollout file; errors name "path:line: problem". */
int vks_rollout_read(const char *path, vks_rollout_file *out);
/* Same from memory (the fuzz target's entry); name is used in errors. */
int vks_rollout_read_mem(const char *data, size_t len, const char *name, vks_rollout_file *out);
void vks_rollout_file_free(vks_rollout_file *f);
#endif
