/* vks_safetensors.h: safetensors files (reader mmaps and validates the JSON
 * header; writer streams tensors) and Hugging Face config.json. */
#ifndef VKS_SAFETENSORS_H
#define VKS_SAFETENSORS_H
#include "vks_model.h"

#define VKS_ST_MAX_HEADER ((uint64_t)100 << 20) /* as the reference implementation */
#define VKS_ST_MAX_DIMS 8

typedef struct vks_st_file vks_st_file;

typedef struct {
    const char *name;
    const char *dtype_name;  /* "F32", "BF16", "I64", ... */
    vks_dtype dtype;         /* VKS_DTYPE_COUNT for types vkswarm does not compute with */
    int n_dims;
    int64_t shape[VKS_ST_MAX_DIMS];
    uint64_t size;           /* bytes */
    const void *data;        /* inside the file, checked */
} vks_st_tensor;

/* Opens and validates: header length within the file and the cap, JSON object
 * of tensors with known dtypes, shapes whose byte size equals their offsets,
 * offsets inside the data section and not overlapping. */
int vks_st_open(const char *path, vks_st_file **out);
/* Same on a copy of bytes in memory (name used in errors). */
int vks_st_open_memory(const void *data, size_t size, const char *name, vks_st_file **out);
void vks_st_close(vks_st_file *f);
int64_t vks_st_n_tensors(const vks_st_file *f);
const vks_st_tensor *vks_st_tensor_at(const vks_st_file *f, int64_t i);
const vks_st_tensor *vks_st_find(const vks_st_file *f, const char *name); /* NULL if absent */

typedef struct {
    const char *name;
    vks_dtype dtype;         /* f32, f16 or bf16 */
    int n_dims;
    int64_t shape[VKS_ST_MAX_DIMS];
    const void *data;        /* exactly the bytes */
} vks_st_write_tensor;
/* Writes a safetensors file with __metadata__ {"format": "pt"}. */
int vks_st_write(const char *path, const vks_st_write_tensor *t, size_t n);

/* ---- Hugging Face config.json (LlamaForCausalLM, Qwen2ForCausalLM) ---- */
typedef struct {
    vks_model_config cfg;   /* rope_mode = VKS_ROPE_HALF */
    char arch[32];          /* "llama" or "qwen2" */
    int bos_id, eos_id;     /* -1 when absent */
    bool attention_bias;    /* qwen2: q/k/v biases */
} vks_hf_config;

int vks_hf_config_parse(const char *json, size_t len, const char *name, vks_hf_config *out);
int vks_hf_config_load(const char *path, vks_hf_config *out);
int vks_hf_config_save(const char *path, const vks_hf_config *c, vks_dtype torch_dtype);
#endif
