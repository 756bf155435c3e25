/* vks_lora.h: low-rank adapters (LoRA) on a frozen base (issue 25): which
 * matrices of a layer carry one, their shapes, the scale and PEFT's
 * initialisation (src/model/lora.c). An adapter of target matrix W [out, in]
 * is A [rank, in] and B [out, rank], f32; the layer computes
 *   y = W x + scale B (A x),  scale = alpha / rank
 * (vks_op_lora_forward on the GPU, vks_ref_lora_forward in float64). */
#ifndef VKS_LORA_H
#define VKS_LORA_H
#include "vks_model.h"

/* The target matrices of a layer, in PEFT's module names' order. */
typedef enum {
    VKS_LORA_Q, VKS_LORA_K, VKS_LORA_V, VKS_LORA_O, VKS_LORA_GATE, VKS_LORA_UP, VKS_LORA_DOWN,
    VKS_LORA_TARGET_COUNT
} vks_lora_target;
#define VKS_LORA_ALL_TARGETS ((1u << VKS_LORA_TARGET_COUNT) - 1u)

/* PEFT's module name of a target ("q_proj", ..., "down_proj"); NULL when out of range. */
const char *vks_lora_target_name(vks_lora_target t);
/* The shape [out, in] of target t's base matrix in a model of config c
 * (q: [n_heads*head_dim, dim], k/v: [kv_dim, dim], o: [dim, n_heads*head_dim],
 * gate/up: [hidden, dim], down: [dim, hidden]); VKS_ERR_ARG for a bad t. */
int vks_lora_target_shape(const vks_model_config *c, vks_lora_target t, int64_t *out, int64_t *in);
/* Parameters of the adapters of every layer for the targets in the mask
 * (bit t = target t): sum over layers and targets of rank * (out + in);
 * -1 when rank < 1 or the mask is empty or holds unknown bits. */
int64_t vks_lora_param_count(const vks_model_config *c, int rank, uint32_t targets);
/* VKS_ERR_ARG naming `what` unless 1 <= rank <= the smaller side of every
 * targeted matrix and targets is a non-empty set of known bits. */
int vks_lora_check(const vks_model_config *c, int rank, uint32_t targets, const char *what);
/* alpha / rank (PEFT's scaling without rsLoRA). */
double vks_lora_scale(double alpha, int rank);

/* PEFT's initialisation of one adapter (LoraLayer.reset_lora_parameters,
 * init_lora_weights=True): A Kaiming-uniform with a = sqrt(5), i.e. uniform
 * in [-1/sqrt(in), 1/sqrt(in)), B zero, so that a fresh adapter leaves the
 * base's output unchanged. Element i of A is
 *   (2 u - 1) / sqrt(in),  u = vks_rng_uniform(vks_philox_u32(seed, stream, 0, i))
 * with `stream` naming the matrix (vks_lora_stream). A [rank, in], B [out, rank];
 * VKS_ERR_ARG for NULL or sizes < 1 (or rank * in past 2^32). */
int vks_lora_init(float *A, float *B, int rank, int64_t in, int64_t out, uint64_t seed, uint32_t stream);
/* The Philox stream of layer l's target t: l * VKS_LORA_TARGET_COUNT + t. */
uint32_t vks_lora_stream(int layer, vks_lora_target t);

/* ---- Adapters as data (declared in session 14; implemented in src/model/lora*.c) ----
 * One adapter for a whole model: its settings and, for every layer and every
 * target in the mask, A [rank, in] and B [out, rank] as f32 on the host. */
#define VKS_LORA_DEFAULT_ALPHA 32.0 /* "LoRA Without Regret": alpha 32 whatever the rank */

typedef struct {
    int rank;         /* 1 .. the smaller side of every targeted matrix */
    double alpha;     /* scale = alpha / rank; finite, > 0 */
    uint32_t targets; /* bit t = vks_lora_target t */
} vks_lora_config;

typedef struct vks_lora_adapter vks_lora_adapter;

/* Parses a target list: comma-separated short names (q,k,v,o,gate,up,down),
 * PEFT module names (q_proj, ..., down_proj) or "all"; VKS_ERR_ARG naming
 * `what` and the unknown name otherwise. */
int vks_lora_parse_targets(const char *s, uint32_t *targets, const char *what);

/* A zeroed adapter for a model of config c (vks_lora_check first); the base
 * hash is unset until vks_lora_adapter_set_base. */
int vks_lora_adapter_create(const vks_model_config *c, const vks_lora_config *lc, vks_lora_adapter **out);
void vks_lora_adapter_free(vks_lora_adapter *a);
/* PEFT's initialisation of every matrix (vks_lora_init with vks_lora_stream). */
int vks_lora_adapter_init(vks_lora_adapter *a, uint64_t seed);
const vks_lora_config *vks_lora_adapter_config(const vks_lora_adapter *a);
int vks_lora_adapter_n_layers(const vks_lora_adapter *a);
/* The config of the model the adapter was made for (its shapes); NULL for NULL. */
const vks_model_config *vks_lora_adapter_base_config(const vks_lora_adapter *a);
/* VKS_OK when the adapter was made for a model of c's shape (layers and
 * every targeted matrix's [out, in]); else VKS_ERR_FORMAT naming `what`. */
int vks_lora_adapter_check_shape(const vks_lora_adapter *a, const vks_model_config *c, const char *what);
/* Layer l's A [rank, in] / B [out, rank] of target t; NULL when t is not targeted or l is out of range. */
float *vks_lora_adapter_A(const vks_lora_adapter *a, int layer, vks_lora_target t);
float *vks_lora_adapter_B(const vks_lora_adapter *a, int layer, vks_lora_target t);
/* PEFT's modules_to_save = ["norm"]: the final norm's weight [dim] trained
 * beside the adapter, used in place of the base's (vks_lora_apply_norm,
 * vks_lora_merge) and part of the adapter's hash. set_norm copies w (finite,
 * base dim values; NULL removes it); vks_lora_adapter_norm is NULL without one. */
int vks_lora_adapter_set_norm(vks_lora_adapter *a, const float *w);
const float *vks_lora_adapter_norm(const vks_lora_adapter *a);
/* Records the base model's identity (vks_model_hash, its arch and path) in the adapter. */
int vks_lora_adapter_set_base(vks_lora_adapter *a, const vks_model *base);
/* The recorded base hash; NULL until vks_lora_adapter_set_base (or a load). */
const uint8_t *vks_lora_adapter_base_hash(const vks_lora_adapter *a);
/* The base matrix of target t: its index in vks_layer_schema (VKS_T_wq, ...); -1 for a bad t. */
int vks_lora_target_tensor(vks_lora_target t);

/* Identity of an adapter: BLAKE2b-256 over its config and every matrix. */
int vks_lora_adapter_hash(const vks_lora_adapter *a, uint8_t out[32]);
/* Identity of base + adapter, the model hash proofs and rollouts carry:
 * the base's vks_model_hash when a is NULL, else BLAKE2b-256 over a domain
 * tag, the base hash and the adapter hash. */
int vks_lora_model_hash(const vks_model *base, const vks_lora_adapter *a, uint8_t out[32]);

/* PEFT's layout in directory dir (created if missing): adapter_model.safetensors
 * (F32; tensor names base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight
 * [rank, in], ...lora_B.weight [out, rank], mlp.gate_proj/up_proj/down_proj
 * under .mlp.) and adapter_config.json (peft_type "LORA", r, lora_alpha,
 * target_modules, bias "none", task_type "CAUSAL_LM", base_model_name_or_path,
 * and "vkswarm": {"base_model_hash": hex} once the base is set; with a final
 * norm, base_model.model.model.norm.weight [dim] and modules_to_save ["norm"]), committed
 * together through vks_outfile. q/k rows of B are written in Hugging Face's
 * half-split RoPE order, as the HF writer writes wq/wk. */
int vks_lora_save_peft(const char *dir, const vks_lora_adapter *a);
/* llama.cpp's GGUF LoRA adapter (general.type = adapter, adapter.type = lora,
 * adapter.lora.alpha, general.architecture = the base's, vkswarm.base_model_hash;
 * tensors blk.N.attn_q.weight.lora_a ne = [in, rank] and .lora_b ne = [rank, out],
 * F32; q/k rows of B in the RoPE order of that architecture's GGUF models).
 * The base must be set (vks_lora_adapter_set_base: the architecture). An
 * adapter with a final norm is refused (VKS_ERR_ARG): the format has no place for it. */
int vks_lora_save_gguf(const char *path, const vks_lora_adapter *a);
/* Loads a PEFT directory (or its adapter_config.json / adapter_model.safetensors)
 * or a GGUF LoRA file (magic "GGUF") for the base model `base`: every tensor's
 * shape against the base, the base hash where the file names one, rank,
 * targets, finite values (F32, F16, BF16 read); missing and extra tensors,
 * use_rslora, fan_in_fan_out, DoRA, layers_to_transform, rank_pattern,
 * alpha_pattern and modules_to_save other than ["norm"] (read into
 * vks_lora_adapter_norm) refused; VKS_ERR_FORMAT naming file and tensor. q/k rows of B
 * come in base's own RoPE order (cfg.rope_mode), like its wq/wk. A GGUF
 * without adapter.lora.alpha (or 0) has scale 1 (alpha = rank), as llama.cpp.
 * The adapter records base's identity. */
int vks_lora_load(const char *path, const vks_model *base, vks_lora_adapter **out);
/* The same with base's vks_model_hash given (NULL: computed), for callers
 * that load adapter after adapter onto one base (hashing an 8B base reads
 * all of its bytes). */
int vks_lora_load_hashed(const char *path, const vks_model *base, const uint8_t base_hash[32],
                         vks_lora_adapter **out);

/* Merges a into m: every targeted W becomes W + (alpha / rank) B A computed
 * in double from W's decoded values and rounded once to f32; all of m's
 * tensors become f32 (owned by m; q/k rows in m's order). a must be for m's
 * shape and RoPE order (VKS_ERR_ARG otherwise). */
int vks_lora_merge(vks_model *m, const vks_lora_adapter *a);
/* Where a carries a final norm (modules_to_save ["norm"]), m's final norm
 * becomes an f32 copy of it, owned by m, so every forward of m (GPU engine,
 * CPU, reference; with a applied unmerged) uses it; vks_model_hash(m) then
 * covers it. VKS_OK and nothing changed when a has none; VKS_ERR_ARG when a
 * is for another shape. vks_lora_merge does this itself. */
int vks_lora_apply_norm(vks_model *m, const vks_lora_adapter *a);
#endif
