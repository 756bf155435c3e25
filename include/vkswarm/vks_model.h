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
    int rope_mode;     /* VKS_ROPE_ADJACENT or VKS_ROPE_HALF (vks_ref.h) */
    bool shared_classifier;
} vks_model_config;

/* A weight matrix or vector: rows x cols elements of dtype, row-major. */
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
} vks_model;

/* Loads a llama2.c checkpoint. Hostile-input safe: on failure returns a
 * negative code with a one-line vks_last_error() naming the file and problem. */
int vks_model_load_llama2c(const char *path, vks_model **out);
/* Builds a random model (weights ~ N(0, 0.02)-ish, norms = 1) for benchmarks
 * and tests. seed makes it reproducible. */
int vks_model_random(const vks_model_config *cfg, uint64_t seed, vks_model **out);
/* Writes a model as a llama2.c checkpoint (f32). */
int vks_model_save_llama2c(const vks_model *m, const char *path);
void vks_model_free(vks_model *m);
/* Number of parameters (classifier counted once when shared). */
int64_t vks_model_param_count(const vks_model *m);
/* Validates a config (dims > 0, heads divide, sizes do not overflow). */
int vks_model_config_check(const vks_model_config *c, const char *what);
#endif
