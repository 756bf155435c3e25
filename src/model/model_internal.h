/* model_internal.h: helpers shared by the model readers/builders and the CPU
 * forward. Not a public API. */
#ifndef VKS_MODEL_INTERNAL_H
#define VKS_MODEL_INTERNAL_H
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_safetensors.h"

/* Float counts of the llama2.c layout (after the 28-byte header). Per-layer
 * entries are for one layer; `total` covers the whole body, classifier
 * included only when unshared. */
typedef struct {
    size_t emb, norm, wq, wkv, wo, ffn, freq, cls, total;
} vks_l2c_sizes;

/* Fills *s; false if any product or sum overflows size_t. */
#define L2C_HEADER_BYTES 28 /* 7 int32 fields */
bool vks_l2c_sizes_compute(const vks_model_config *c, vks_l2c_sizes *s);
/* Points every tensor of m (config already set and checked) into `body`, an f32
 * array in llama2.c layout. Allocates m->layers. Returns VKS_OK or VKS_ERR_NOMEM. */
int vks_model_bind_llama2c(vks_model *m, const float *body);
/* Binds zeroed f32 tensors (owned by m) for the optional layer tensors the
 * config and has_bias imply (biases, q/k norms): those outside the llama2.c
 * layout. */
int vks_model_bind_optional(bool has_bias, vks_model *m);
/* Allocates a zeroed model struct; NULL (with error set) on failure. */
vks_model *vks_model_alloc(void);
/* A model of config c (complete: head_dim, kv_dim set) whose tensors are
 * views into one owned, zeroed f32 block in llama2.c layout (random_model.c);
 * name is its path and starts every error message. */
int vks_model_alloc_f32(const vks_model_config *c, const char *name, vks_model **out);

/* ---- issue 3 (src/model/model_convert.c) ---- */
/* Source row of destination row r of a q/k matrix [n_heads*head_dim, dim]
 * when RoPE row order changes from from_mode to to_mode (VKS_ROPE_*). */
int64_t vks_rope_src_row(int64_t r, int head_dim, int from_mode, int to_mode);
/* Owned f32 copy of src (biases included) with q/k rows (and biases) in
 * rope_mode order. */
int vks_model_copy_f32(const vks_model *src, int rope_mode, vks_model **out);
/* Checks a tensor bound out of a file: data present, dtype known (block
 * formats only when allow_blocks), data aligned for its element type. */
int vks_check_bound_tensor(const char *what, const char *name, const vks_tensor *t, bool allow_blocks);
/* ---- issue 9 (src/model/model_weights_check.c) ---- */
/* Refuses a model with a NaN or Inf weight (f32/f16/bf16 elements, the f16
 * scales of block formats), naming the tensor and `what` (the file). */
int vks_model_check_finite(const vks_model *m, const char *what);
/* Tensor i (0..n-1) of the file(s) a model was bound from: its data pointer
 * and *name. */
typedef const void *(*vks_file_tensor_fn)(const void *ctx, int64_t i, const char **name);
/* Refuses a file holding tensors that m does not use, naming the first. */
int vks_model_check_unused(const vks_model *m, const char *what, int64_t n_file, vks_file_tensor_fn tensor_at,
                           const void *ctx);
/* src/model/gguf_tokenizer.c: writes tokenizer.ggml.* keys from a llama2.c
 * tokenizer.bin (tokenizer_path), else copies them from m's GGUF, else just
 * the known bos/eos ids. */
struct vks_gguf_writer;
int vks_gguf_add_tokenizer(struct vks_gguf_writer *w, const vks_model *m, const char *tokenizer_path);
/* ---- writers' bodies, for files written through vks_outfile (the HF
 * directory commits config.json and model.safetensors together) ---- */
/* The whole safetensors file to f; errors name `name`. */
int vks_st_write_stream(FILE *f, const char *name, const vks_st_write_tensor *t, size_t n);
/* config.json to f; errors name `path`. */
int vks_hf_config_write_stream(FILE *f, const char *path, const vks_hf_config *c, vks_dtype torch_dtype);
#endif
