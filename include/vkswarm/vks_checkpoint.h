/* vks_checkpoint.h: training checkpoints (src/model/checkpoint.c).
 *
 * A checkpoint is a directory, OUT/step-000000123 (9 or more digits):
 *   model.safetensors + config.json  the f32 weights as a Hugging Face model
 *                                    (vks_model_save_safetensors: half-split
 *                                    RoPE rows), so `vkswarm generate --model
 *                                    DIR` and `convert` read it;
 *   tokenizer.json, tokenizer_config.json  when the run has them (copied);
 *   optimizer.safetensors            the Adam moments, f32, named
 *                                    "exp_avg.<name>" (m) and "exp_avg_sq.<name>"
 *                                    (v) after the model file's tensor names,
 *                                    same shapes and row order;
 *   state.json                       step, data position, RNG state, optimizer
 *                                    settings, and the byte size and BLAKE2b-256
 *                                    of every other file; written last.
 * Writing is atomic: everything goes into DIR.tmp-<pid>-<n> (each file
 * fsynced, state.json last), the directory is fsynced and renamed to DIR
 * (atomically exchanged with an older checkpoint of that name, which is then
 * removed), and the parent is fsynced. So a crash leaves either the complete
 * checkpoint or none under DIR. The loader refuses a directory without a
 * complete state.json, and any file whose size or hash differs from it.
 *
 * Parameters travel as one f32 block per set (weights, Adam m, Adam v) in the
 * layout below: vks_ref_params' order and names, so the trainer's parameter
 * sets map onto it one to one.
 *
 * A LoRA run's checkpoint holds the adapter instead of the model:
 *   adapter_model.safetensors + adapter_config.json  PEFT's layout
 *                                    (vks_lora_save_peft; the base model's
 *                                    hash in adapter_config.json), so the
 *                                    directory is the adapter: `--lora DIR`,
 *                                    PEFT and vLLM read it;
 *   optimizer.safetensors            "exp_avg.<name>", "exp_avg_sq.<name>"
 *                                    with the trainer's names
 *                                    (layers.N.q_proj.lora_A, ...) in the
 *                                    adapter's order, rows in the base's own
 *                                    order (as the trainer holds them);
 *   state.json                       as above (sizes and hashes of the rest).
 * No tokenizer: the base has it. */
#ifndef VKS_CHECKPOINT_H
#define VKS_CHECKPOINT_H
#include "vks_lora.h"
#include "vks_model.h"
#include "vks_train_types.h"

/* ---- parameter layout ---- */
typedef struct {
    char name[32];   /* "tok_emb", "layers.<l>.<field>" (fields as vks_layer_weights), "final_norm", "classifier" */
    int64_t rows, cols;
    size_t offset;   /* first float of the tensor in a block */
    vks_schema_item item; /* what it is in the model schema (names, presence) */
} vks_param_info;

/* The tensors vks_schema_list gives (tok_emb, each layer's in the schema's
 * order, final_norm, classifier unless tied to tok_emb), back to back. */
typedef struct {
    vks_model_config cfg;
    bool has_bias;
    int n_tensors;
    vks_param_info *tensors;
    size_t n_values; /* floats in a block */
} vks_param_layout;

int vks_param_layout_create(const vks_model_config *cfg, bool has_bias, vks_param_layout **out);
/* Whether two configs give the same parameter tensors (names and shapes). */
bool vks_param_config_same(const vks_model_config *a, const vks_model_config *b);
void vks_param_layout_free(vks_param_layout *l);
const vks_param_info *vks_param_layout_find(const vks_param_layout *l, const char *name);
/* Copies m's weights (any dtype, dequantized; rows in m's RoPE order) into
 * block[l->n_values]; m's config must be l's. */
int vks_param_layout_gather(const vks_param_layout *l, const vks_model *m, float *block);
/* The reverse: block's values into m's tensors, which must be f32 and owned
 * (vks_model_create_f32 with l's config). */
int vks_param_layout_scatter(const vks_param_layout *l, const float *block, vks_model *m);

/* ---- what a resume needs besides the tensors ---- */
/* The largest step a checkpoint may record (and a run may take). */
#define VKS_CKPT_MAX_STEP 1000000000

typedef struct {
    int64_t step;              /* optimizer steps taken, 0..VKS_CKPT_MAX_STEP; a directory named step-N holds step N */
    int64_t tokens_seen;       /* training tokens consumed */
    uint64_t seed;             /* the run's seed */
    vks_sft_position data;     /* where the next micro-batch starts */
    char data_hash[65];        /* vks_sft_data_hash in hex, "" when none */
    uint64_t rng_key, rng_counter; /* a counter-based generator's state, for anything else the run draws */
    vks_adamw_params adam;     /* betas, eps, weight decay; lr of the last step */
    vks_lr_schedule schedule;
    double grad_clip;          /* global-norm clipping, <= 0: off */
    const char *extra_json;    /* a JSON object stored as "extra" (NULL: none); the loader's copy is owned by
                                * the vks_checkpoint */
} vks_ckpt_state;

typedef struct {
    const vks_param_layout *layout;
    const float *weights;        /* layout->n_values floats, rows in layout->cfg.rope_mode order */
    const float *adam_m, *adam_v; /* both, or both NULL (no optimizer.safetensors) */
    const char *arch;            /* "llama" or "qwen2"; NULL: "llama" */
    int bos_id, eos_id;          /* -1: unknown */
    const char *tokenizer_dir;   /* copies its tokenizer.json (and tokenizer_config.json) when not NULL */
    const vks_model_save_options *save; /* passed on to vks_model_save_safetensors (dtype forced to f32); may be NULL */
    vks_ckpt_state state;
    /* LoRA: the adapter, saved instead of layout and weights (both NULL);
     * adam_m and adam_v then hold vks_lora_param_count floats each, in the
     * adapter's order (per layer and target, A then B). */
    const vks_lora_adapter *lora;
} vks_checkpoint_data;

/* OUT/step-<step, 9 digits or more> into buf. */
int vks_checkpoint_step_dir(const char *out_dir, int64_t step, char *buf, size_t cap);
/* Writes the checkpoint as directory `dir`, atomically (see above). An
 * existing `dir` is replaced only when it is a complete checkpoint (state.json)
 * holding nothing but checkpoint files;
 * NaN or Inf in any block is refused (the loader would refuse it). */
int vks_checkpoint_save(const char *dir, const vks_checkpoint_data *c);

typedef struct {
    vks_param_layout *layout;      /* from config.json: cfg.rope_mode is VKS_ROPE_HALF */
    float *weights;
    float *adam_m, *adam_v;        /* NULL when the checkpoint holds no optimizer state */
    char arch[32];
    int bos_id, eos_id;
    vks_ckpt_state state;
    vks_lora_adapter *lora;        /* a LoRA checkpoint (vks_checkpoint_load_lora): the adapter; layout and
                                    * weights NULL, the moments in the adapter's order */
} vks_checkpoint;

/* Loads and checks everything: state.json (bounded, every field typed and in
 * range, "complete"; a directory named step-N must record step N), each
 * listed file's size and hash, the model (as any safetensors model: shapes
 * against config.json, finite weights, no unused tensor), the moments (exact
 * names, f32, shapes, finite, v >= 0, and |m| no larger than `step` Adam
 * updates with the recorded betas can make it: |m| <= K sqrt(v), K =
 * (1 - b1) / sqrt(1 - b2) * sqrt(sum_{k<step} (b1^2 / b2)^k), by
 * Cauchy-Schwarz; so the next update, lr m_hat / (sqrt(v_hat) + eps), is
 * bounded too). */
int vks_checkpoint_load(const char *dir, vks_checkpoint **out);
/* The same for a LoRA run's checkpoint over base model `base`: the adapter
 * through vks_lora_load (shapes and the recorded base hash against base,
 * finite values), the moments as above. Each loader refuses the other kind,
 * naming it. */
int vks_checkpoint_load_lora(const char *dir, const vks_model *base, vks_checkpoint **out);
void vks_checkpoint_free(vks_checkpoint *c);

/* The complete checkpoint (a step-N directory holding state.json) with the
 * highest step in out_dir: its path in buf and *found, or *found false (also
 * when out_dir does not exist). */
int vks_checkpoint_latest(const char *out_dir, char *buf, size_t cap, bool *found);
/* Keeps the `keep` (>= 1) newest step-N directories of out_dir with N <=
 * through_step (the checkpoint just written: it is always kept, and newer
 * ones are not the caller's) and removes the older ones, and temporaries that
 * writers which are no longer running left behind. Only directories named as
 * this code names them and holding only the files it writes are removed;
 * anything else is left alone. *n_removed (may be NULL) counts the
 * directories removed. */
int vks_checkpoint_prune(const char *out_dir, int keep, int64_t through_step, int *n_removed);
#endif
