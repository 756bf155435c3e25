/* vks_model.h: format-independent model description, and the llama2.c reader.
 * Weights are host-resident views (usually into an mmap); the engine uploads
 * them, converting to the requested dtype. */
#ifndef VKS_MODEL_H
#define VKS_MODEL_H
#include "vks_common.h"

typedef struct {
    int dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
    int head_dim;      /* dim / n_heads */
    int kv_dim;        /* n_kv_heads * head_dim */
    float norm_eps;    /* 1e-5 for llama2.c */
    float rope_theta;  /* 10000 for llama2.c */
    int rope_mode;     /* VKS_ROPE_ADJACENT or VKS_ROPE_HALF (vks_common.h) */
    bool shared_classifier;
} vks_model_config;

/* A weight matrix or vector: rows x cols elements of dtype, row-major. Block
 * dtypes (Q8_0, Q4_0, Q4_K, Q6_K; vks_quant.h) keep their file bytes: each row
 * is cols / block_elems blocks, so cols is a multiple of the block size. */
typedef struct {
    vks_dtype dtype;
    int64_t rows, cols;   /* vectors: rows = 1 */
    const void *data;     /* host memory, not owned */
} vks_tensor;

typedef struct {
    vks_tensor attn_norm; /* [1, dim] */
    vks_tensor wq;        /* [n_heads*head_dim, dim] */
    vks_tensor wk;        /* [kv_dim, dim] */
    vks_tensor wv;        /* [kv_dim, dim] */
    vks_tensor wo;        /* [dim, n_heads*head_dim] */
    vks_tensor ffn_norm;  /* [1, dim] */
    vks_tensor w1;        /* gate [hidden, dim] */
    vks_tensor w2;        /* down [dim, hidden] */
    vks_tensor w3;        /* up   [hidden, dim] */
    /* Optional attention biases (Qwen2); data == NULL when absent. f32 [1, rows]. */
    vks_tensor bq;        /* [1, n_heads*head_dim] */
    vks_tensor bk;        /* [1, kv_dim] */
    vks_tensor bv;        /* [1, kv_dim] */
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

/* Loads a llama2.c checkpoint. Hostile-input safe: on failure returns a
 * negative code with a one-line vks_last_error() naming the file and problem. */
int vks_model_load_llama2c(const char *path, vks_model **out);
/* Builds a random model (weights ~ N(0, 0.02)-ish, norms = 1) for benchmarks
 * and tests. seed makes it reproducible. */
int vks_model_random(const vks_model_config *cfg, uint64_t seed, vks_model **out);
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
