/* vks_model.h: format-independent model description, and the llama2.c reader.
 * Weights are host-resident views (usually into an mmap); the engine uploads
 * them, converting to the requested dtype. */
#ifndef VKS_MODEL_H
#define VKS_MODEL_H
#include "vks_common.h"

/* RoPE frequency scaling (config.json rope_scaling; GGUF rope_freqs). */
enum { VKS_ROPE_SCALING_NONE = 0, VKS_ROPE_SCALING_LLAMA3 = 1 };
typedef struct {
    int type;               /* VKS_ROPE_SCALING_* */
    float factor;           /* llama3: low frequencies are divided by it */
    float low_freq_factor, high_freq_factor; /* llama3: the band between is interpolated */
    int original_context;   /* llama3: original_max_position_embeddings */
} vks_rope_scaling;

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int head_dim;      /* per head: the model's own (config.json head_dim, GGUF key_length), else dim / n_heads */
    int kv_dim;        /* n_kv_heads * head_dim */
    float norm_eps;    /* 1e-5 for llama2.c */
    float rope_theta;  /* 10000 for llama2.c */
    int rope_mode;     /* VKS_ROPE_ADJACENT or VKS_ROPE_HALF (vks_common.h) */
    bool shared_classifier;
    bool qk_norm;      /* per-head RMSNorm of q and k before RoPE (Qwen3; weights q_norm, k_norm) */
    vks_rope_scaling rope_scaling; /* zero: none (Llama 3.1/3.2: llama3) */
} vks_model_config;

/* The rotation frequency (radians per position) of each RoPE pair
 * i < head_dim/2 of a model: theta^(-2i/head_dim), then the config's scaling.
 * The one place the formula is written: the reference, the CPU forward, the
 * trainer and the GPU kernels (as a table in a buffer) take it from here. */
void vks_rope_freqs(const vks_model_config *c, double *freqs);
/* cos and sin of every (position p < n_pos, pair i) angle, computed in double
 * from vks_rope_freqs, as f32 pairs at table[2 * (p * head_dim/2 + i)] (the
 * GPU kernels' table). table holds n_pos * head_dim floats; false when out of
 * memory for the frequencies. */
bool vks_rope_table(const vks_model_config *c, int n_pos, float *table);

/* A weight matrix or vector: rows x cols elements of dtype, row-major. Block
 * dtypes (Q8_0, Q4_0, Q4_K, Q6_K; vks_quant.h) keep their file bytes: each row
 * is cols / block_elems blocks, so cols is a multiple of the block size. */
typedef struct {
    vks_dtype dtype;
    int64_t rows, cols;   /* vectors: rows = 1 */
    const void *data;     /* host memory, not owned */
} vks_tensor;

/* ---- the model schema (src/model/model_schema.c) ----
 * Every tensor of a layer, once: internal field, GGUF name (after "blk.N."),
 * Hugging Face name (after "model.layers.N."), shape [rows, cols] in terms of
 * the config (VKS_EXT_*), when it is present (VKS_WHEN_*) and whether a
 * trainer updates it. The order is the trainer's (vks_ref_params, the
 * checkpoint layout, the trainer's parameter sets); readers, writers, the
 * hash and the weight checks all walk this list. q/k rows are in the model's
 * RoPE order (cfg.rope_mode; "rope" marks the tensors a change of order
 * permutes); biases and norms are vectors (rows = 1). */
#define VKS_LAYER_TENSORS(X)                                                                            \
    /* field     GGUF               Hugging Face                       rows    cols    when    train rope */ \
    X(attn_norm, "attn_norm.weight", "input_layernorm.weight", ONE, DIM, ALWAYS, true, false)          \
    X(wq, "attn_q.weight", "self_attn.q_proj.weight", Q, DIM, ALWAYS, true, true)                      \
    X(wk, "attn_k.weight", "self_attn.k_proj.weight", KV, DIM, ALWAYS, true, true)                     \
    X(wv, "attn_v.weight", "self_attn.v_proj.weight", KV, DIM, ALWAYS, true, false)                    \
    X(bq, "attn_q.bias", "self_attn.q_proj.bias", ONE, Q, BIAS, true, true)                            \
    X(bk, "attn_k.bias", "self_attn.k_proj.bias", ONE, KV, BIAS, true, true)                           \
    X(bv, "attn_v.bias", "self_attn.v_proj.bias", ONE, KV, BIAS, true, false)                          \
    X(q_norm, "attn_q_norm.weight", "self_attn.q_norm.weight", ONE, HEAD, QK_NORM, true, true)         \
    X(k_norm, "attn_k_norm.weight", "self_attn.k_norm.weight", ONE, HEAD, QK_NORM, true, true)         \
    X(wo, "attn_output.weight", "self_attn.o_proj.weight", DIM, Q, ALWAYS, true, false)                \
    X(ffn_norm, "ffn_norm.weight", "post_attention_layernorm.weight", ONE, DIM, ALWAYS, true, false)   \
    X(w1, "ffn_gate.weight", "mlp.gate_proj.weight", HIDDEN, DIM, ALWAYS, true, false)                 \
    X(w2, "ffn_down.weight", "mlp.down_proj.weight", DIM, HIDDEN, ALWAYS, true, false)                 \
    X(w3, "ffn_up.weight", "mlp.up_proj.weight", HIDDEN, DIM, ALWAYS, true, false)
/* The tensors outside the layers: tok_emb comes before them, the rest after. */
#define VKS_MODEL_TENSORS(X)                                                                      \
    X(tok_emb, "token_embd.weight", "model.embed_tokens.weight", VOCAB, DIM, ALWAYS, true, false) \
    X(final_norm, "output_norm.weight", "model.norm.weight", ONE, DIM, ALWAYS, true, false)       \
    X(classifier, "output.weight", "lm_head.weight", VOCAB, DIM, UNTIED, true, false)

/* Extents a shape is made of. */
typedef enum {
    VKS_EXT_ONE, VKS_EXT_DIM, VKS_EXT_Q /* n_heads x head_dim */, VKS_EXT_KV /* n_kv_heads x head_dim */,
    VKS_EXT_HIDDEN, VKS_EXT_HEAD /* head_dim */, VKS_EXT_VOCAB
} vks_extent;
/* When a tensor is present: always; when the model has q/k/v biases (all
 * three or none); when cfg.qk_norm; when the classifier is not tied to tok_emb. */
typedef enum { VKS_WHEN_ALWAYS, VKS_WHEN_BIAS, VKS_WHEN_QK_NORM, VKS_WHEN_UNTIED } vks_presence;

#define VKS_SCHEMA_ENUM_(field, ...) VKS_T_##field,
enum { VKS_LAYER_TENSORS(VKS_SCHEMA_ENUM_) VKS_LAYER_N_TENSORS };
enum { VKS_MODEL_TENSORS(VKS_SCHEMA_ENUM_) VKS_MODEL_N_TENSORS };

typedef struct {
    const char *name;   /* internal: "wq" (the trainer's "layers.N.wq") */
    const char *gguf;   /* "attn_q.weight" ("blk.N." before it in a layer) */
    const char *hf;     /* "self_attn.q_proj.weight" ("model.layers.N." before it in a layer) */
    vks_extent rows, cols;
    vks_presence when;
    bool trainable;
    bool rope;          /* its rows (vectors: elements) follow the q/k RoPE order, permuted per head */
} vks_tensor_schema;

extern const vks_tensor_schema vks_layer_schema[VKS_LAYER_N_TENSORS];
extern const vks_tensor_schema vks_model_schema[VKS_MODEL_N_TENSORS];

/* A layer's weights: by name (w->wq) or by schema index (w->t[VKS_T_wq]).
 * Optional tensors absent: data == NULL. */
#define VKS_SCHEMA_FIELD_(field, ...) vks_tensor field;
typedef union {
    struct { VKS_LAYER_TENSORS(VKS_SCHEMA_FIELD_) };
    vks_tensor t[VKS_LAYER_N_TENSORS];
} vks_layer_weights;

typedef struct vks_model {
    vks_model_config cfg;
    vks_tensor tok_emb;     /* [vocab, dim] */
    vks_layer_weights *layers; /* n_layers entries */
    vks_tensor final_norm;  /* [1, dim] */
    vks_tensor classifier;  /* [vocab, dim]; equals tok_emb when shared */
    /* ownership (private to the reader) */
    void *map; size_t map_size; void *owned;
    char path[512];
    /* special tokens and architecture */
    int bos_id, eos_id;     /* -1 when unknown */
    char arch[32];          /* "llama" or "qwen2" */
    struct vks_gguf *gguf;  /* open GGUF file (metadata, tokenizer) or NULL */
    char dir[512];          /* safetensors directory ("" otherwise) */
    void *format_state;     /* reader-private extra state, freed by format_free */
    void (*format_free)(void *state);
} vks_model;

/* ---- walking the schema ---- */
/* Extent e of config c (VKS_EXT_Q is n_heads * head_dim, which may differ from dim). */
int64_t vks_schema_extent(const vks_model_config *c, vks_extent e);
/* Whether a tensor of s is present in a model of c; has_bias: the model has q/k/v biases. */
bool vks_schema_present(const vks_tensor_schema *s, const vks_model_config *c, bool has_bias);
/* One present tensor of a model. */
typedef struct {
    const vks_tensor_schema *s;
    int layer;          /* -1: outside the layers (vks_model_schema) */
    int index;          /* in vks_layer_schema or vks_model_schema */
    int64_t rows, cols; /* from the config */
} vks_schema_item;
/* The present tensors of a model of c in the trainer's order: tok_emb, every
 * layer's (vks_layer_schema order), final_norm, classifier when untied. Fills
 * items[cap] (items may be NULL) and returns how many there are. */
int vks_schema_list(const vks_model_config *c, bool has_bias, vks_schema_item *items, int cap);
/* Item i of that list into *out (VKS_ERR_ARG past its end; no error message). */
int vks_schema_list_nth(const vks_model_config *c, bool has_bias, int i, vks_schema_item *out);
/* The same into a malloc'ed array (*n items); VKS_ERR_NOMEM on failure. */
int vks_schema_list_alloc(const vks_model_config *c, bool has_bias, vks_schema_item **items, int *n);
typedef enum { VKS_NAME_INTERNAL, VKS_NAME_GGUF, VKS_NAME_HF } vks_name_kind;
/* The item's full name: "layers.3.wq", "blk.3.attn_q.weight" or
 * "model.layers.3.self_attn.q_proj.weight". */
void vks_schema_name(const vks_schema_item *it, vks_name_kind kind, char *buf, size_t cap);
/* The tensor of m the item names (m->layers must hold it->layer). */
vks_tensor *vks_model_slot(vks_model *m, const vks_schema_item *it);
const vks_tensor *vks_model_slot_const(const vks_model *m, const vks_schema_item *it);
/* Whether m has q/k/v biases (those of layer 0; readers check all layers agree). */
bool vks_model_has_bias(const vks_model *m);

/* An architecture: what a model's name in GGUF/config.json implies. RoPE
 * scaling and head_dim are per model (vks_model_config). */
typedef struct {
    const char *name;      /* vks_model.arch and GGUF general.architecture */
    const char *hf_class;  /* config.json "architectures"[0] */
    int gguf_rope_mode;    /* q/k row order in GGUF: llama.cpp's converter permutes llama to adjacent pairs */
    bool bias;             /* q/k/v biases when config.json does not say (attention_bias) */
    bool qk_norm;          /* per-head q/k RMSNorm (cfg.qk_norm) */
    const char *activation; /* of the FFN gate: SiLU for all */
} vks_arch;
/* By vks_model.arch / GGUF name, or by Hugging Face class or model_type; NULL if unknown. */
const vks_arch *vks_arch_find(const char *name);
const vks_arch *vks_arch_find_hf(const char *hf_class, const char *model_type);
/* "llama, qwen2" (hf: "LlamaForCausalLM, Qwen2ForCausalLM") into buf, for messages. */
void vks_arch_list(char *buf, size_t cap, bool hf);

/* Loads a llama2.c checkpoint. Hostile-input safe: on failure returns a
 * negative code with a one-line vks_last_error() naming the file and problem. */
int vks_model_load_llama2c(const char *path, vks_model **out);
/* Builds a random model (weights ~ N(0, 0.02)-ish, norms = 1) for benchmarks
 * and tests. seed makes it reproducible. */
int vks_model_random(const vks_model_config *cfg, uint64_t seed, vks_model **out);
/* A random model of an architecture, for tests and benchmarks: "llama",
 * "llama3" (Llama 3.1's RoPE scaling: factor 8, frequency factors 1 and 4,
 * original context 8192, theta 500000), "qwen2" (q/k/v biases, theta 1e6),
 * "qwen3" (per-head q/k norms, theta 1e6). cfg.head_dim 0 means dim /
 * n_heads; kv_dim is derived. Unknown names: VKS_ERR_ARG naming them. */
int vks_model_random_arch(const vks_model_config *cfg, const char *arch, uint64_t seed, vks_model **out);
/* The configuration fields an architecture of vks_model_random_arch sets
 * (RoPE mode, theta when 0, scaling, q/k norm, head_dim when 0, kv_dim), for
 * shapes without weights (train plan); *has_bias (may be NULL): q/k/v biases. */
int vks_model_arch_config(vks_model_config *c, const char *arch, bool *has_bias);
/* A model of cfg (checked) with zeroed f32 weights it owns and may write
 * (q/k/v biases when has_bias): what a trainer fills with its weights. */
int vks_model_create_f32(const vks_model_config *cfg, bool has_bias, vks_model **out);
/* Writes a model as a llama2.c checkpoint (f32). */
int vks_model_save_llama2c(const vks_model *m, const char *path);
void vks_model_free(vks_model *m);
/* Number of parameters (classifier counted once when shared). */
int64_t vks_model_param_count(const vks_model *m);
/* Checks that every tensor of m has data, a known dtype and the shape the
 * config implies. Errors (VKS_ERR_ARG) name `what`. */
int vks_model_check_tensors(const vks_model *m, const char *what);
/* Validates a config (dims > 0, heads divide, sizes do not overflow). */
int vks_model_config_check(const vks_model_config *c, const char *what);
/* Row `row` of t (any dtype) as floats in dst[t->cols] (src/model/model_convert.c). */
void vks_tensor_row_f32(const vks_tensor *t, int64_t row, float *dst);
/* Identity of a model (src/model/model_hash.c): BLAKE2b-256 over the config
 * and every weight tensor's bytes (dtype and shape included) in a fixed order. */
int vks_model_hash(const vks_model *m, uint8_t out[32]);

/* ---- GGUF and safetensors models (src/model/gguf_model.c, safetensors.c, model_load.c) ---- */
struct vks_gguf;

/* Loads any supported model, detected by content: GGUF (magic "GGUF"), a
 * safetensors file or directory (config.json next to it), else llama2.c. */
int vks_model_load(const char *path, vks_model **out);
int vks_model_load_gguf(const char *path, vks_model **out);
/* path: a directory (config.json + model.safetensors or sharded with
 * model.safetensors.index.json) or one .safetensors file with config.json beside it. */
int vks_model_load_safetensors(const char *path, vks_model **out);
/* The GGUF file behind a model loaded from GGUF (tokenizer metadata), else NULL. */
const struct vks_gguf *vks_model_gguf(const vks_model *m);
/* Directory of a safetensors model (where tokenizer.json lives), else NULL. */
const char *vks_model_dir(const vks_model *m);

struct vks_tokenizer;
typedef struct {
    vks_dtype dtype;            /* dtype of 2-D weight matrices; norms and biases stay f32 */
    const char *tokenizer_path; /* GGUF only: llama2.c tokenizer.bin to embed, or NULL */
    /* A tokenizer to write with the model (SPM or BPE for GGUF, any kind for a
     * HF directory), or NULL. Not together with tokenizer_path. */
    const struct vks_tokenizer *tokenizer;
    /* GGUF only: a matrix whose rows are not whole blocks of dtype (Q4_K/Q6_K:
     * 256, Q8_0/Q4_0: 32) is written in the nearest type whose blocks fit,
     * as llama.cpp's quantize does: Q4_K -> Q4_0, Q6_K -> Q8_0, else f32.
     * on_fallback (may be NULL) is told each such matrix and the type used;
     * strict refuses it instead (VKS_ERR_ARG naming the tensor). */
    bool strict;
    void (*on_fallback)(void *ctx, const char *tensor, int64_t cols, vks_dtype used);
    void *fallback_ctx;
} vks_model_save_options;

/* Writes a GGUF file (arch llama or qwen2; q/k rows in adjacent-pair RoPE order
 * for llama, as llama.cpp's converter writes them). opt may be NULL (f32).
 * The tokenizer metadata comes from opt->tokenizer_path or opt->tokenizer,
 * else is copied from m's own GGUF (else only m's bos/eos ids are written). */
int vks_model_save_gguf(const vks_model *m, const char *path, const vks_model_save_options *opt);
/* Writes a Hugging Face directory: config.json + model.safetensors (q/k rows in
 * half-split RoPE order), and with opt->tokenizer its tokenizer files in the
 * form of its kind (vks_tokenizer_dir_files: tokenizer.json +
 * tokenizer_config.json, tokenizer.gguf or tokenizer.bin), all placed
 * together; tokenizer files of the other kinds left from an earlier model are
 * removed. dtype f32, f16 or bf16 (opt may be NULL: f32). */
int vks_model_save_safetensors(const vks_model *m, const char *dir, const vks_model_save_options *opt);

/* ---- the built-in tiny model (src/model/model_tiny.c) ----
 * A small Llama that needs no download, for the demo and the tests:
 *   dim 128, 4 layers, 4 query heads and 2 key/value heads of 32 (grouped-
 *   query attention), SwiGLU hidden 384, RMSNorm eps 1e-5, RoPE theta 10000
 *   (half-split pairs, as Hugging Face), context 512, the classifier tied to
 *   the token embedding; vocabulary: the 259-token byte-level tokenizer
 *   (vks_tokenizer_byte_level: bytes 0..255, <|bos|> 256, <|eos|> 257,
 *   <|pad|> 258). 0.82M parameters, f32.
 * dim and hidden are multiples of 32, so Q8_0 and Q4_0 hold every matrix;
 * Q4_K/Q6_K need rows of 256 and leave these matrices f16 (see convert).
 * Initialisation, GPT-2's: every matrix N(0, 0.02), the attention output
 * (wo) and FFN down (w2) projections N(0, 0.02 / sqrt(2 * n_layers)), norms
 * 1. A normal draw is the Irwin-Hall sum of 12 uniforms from Philox4x32-10
 * keyed by (seed, tensor, element), minus 6: integer-exact in double
 * arithmetic, so the same seed gives the same bits on every machine (tails
 * end at 6 sigma). */
void vks_model_tiny_config(vks_model_config *c);
/* Builds the tiny model from seed into *model and, when tok is not NULL, its
 * tokenizer into *tok (the model's bos_id/eos_id are the tokenizer's). */
int vks_model_init_tiny(uint64_t seed, vks_model **model, struct vks_tokenizer **tok);
/* m's tokenizer (vks_tokenizer_load_for, vks_tokenizer.h): from the tokenizer
 * file when given, else from m's own GGUF metadata or the tokenizer.json beside
 * its safetensors. m may be NULL when a path is given. (src/model/model_load.c) */
int vks_tokenizer_load_auto(const char *tokenizer_path_or_null, const vks_model *m, struct vks_tokenizer **out);
/* Residual-stream taps (the stage commitments of vks_rollout.h): for t < n,
 * the residual stream after layer layers[t] - 1, i.e. the input of layer
 * layers[t] (1 <= layers[t] < n_layers), of output row i goes to
 * out[(t * n_out + i) * dim], n_out being the call's output rows. */
typedef struct {
    int n;
    const int *layers;
    float *out;
} vks_layer_taps;

#endif
