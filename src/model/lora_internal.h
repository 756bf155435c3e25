/* lora_internal.h: what the adapter files (lora_peft.c, lora_gguf.c) and the
 * merge (lora_merge.c) share with lora.c. Not a public API. */
#ifndef VKS_LORA_INTERNAL_H
#define VKS_LORA_INTERNAL_H
#include "vkswarm/vks_lora.h"

/* Records the base's identity without hashing it again (the loader has the hash). */
void vks_lora_adapter_set_base_id(vks_lora_adapter *a, const uint8_t hash[32], const char *arch, const char *name);
/* The base's vks_model.arch and path as vks_lora_adapter_set_base saw them ("" until set). */
const char *vks_lora_adapter_base_arch(const vks_lora_adapter *a);
const char *vks_lora_adapter_base_name(const vks_lora_adapter *a);
/* The shape (and q/k RoPE order, rope_mode) of the base the adapter was made for. */
const vks_model_config *vks_lora_adapter_base_config(const vks_lora_adapter *a);
/* B [out, rank] of target t from src to dst, rows of q and k moved from RoPE
 * order `from` to `to` (VKS_ROPE_*) as the base's wq/wk rows are
 * (vks_rope_src_row); other targets and from == to copy. */
void vks_lora_permute_b(const vks_lora_adapter *a, vks_lora_target t, const float *src, float *dst, int from, int to);
/* Decodes n elements of dtype dt (f32, f16, bf16) at src into dst and refuses
 * a NaN or Inf, naming file and tensor (VKS_ERR_FORMAT). */
int vks_lora_decode(const char *file, const char *tensor, vks_dtype dt, const void *src, float *dst, size_t n);
/* Names for layer l's target t: PEFT's "base_model.model.model.layers.L.self_attn.q_proj.lora_A.weight"
 * (which 'A' or 'B') and GGUF's "blk.L.attn_q.weight.lora_a" ('a' or 'b'), from the model schema. */
void vks_lora_peft_name(int layer, vks_lora_target t, char which, char *buf, size_t cap);
void vks_lora_gguf_name(int layer, vks_lora_target t, char which, char *buf, size_t cap);
/* A config and the adapter it makes for base: rank and targets checked
 * against the base's shapes; errors VKS_ERR_FORMAT naming file. */
int vks_lora_create_for(const char *file, const vks_model *base, const vks_lora_config *lc, vks_lora_adapter **out);
/* The readers behind vks_lora_load; hash is base's vks_model_hash. */
int vks_lora_load_peft(const char *dir, const vks_model *base, const uint8_t hash[32], vks_lora_adapter **out);
int vks_lora_load_gguf(const char *path, const vks_model *base, const uint8_t hash[32], vks_lora_adapter **out);
#endif
