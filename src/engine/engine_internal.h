/* engine_internal.h: what the engine's files share (not a public interface).
 * engine.c owns creation, the KV cache and activations; engine_weights.c the
 * weights on the device (a parameter set); engine_forward.c the recording of
 * the forward. */
#ifndef VKS_ENGINE_INTERNAL_H
#define VKS_ENGINE_INTERNAL_H
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_ops_grad.h" /* vks_op_token_logprob */

#define MAX_CHUNKS 64

/* A weight matrix on the device, split by rows into chunks that each fit in
 * one storage-buffer binding. Each chunk is a self-contained matrix in the
 * GPU layout of vks_op_pack_weights (block types stay quantized). */
typedef struct {
    vks_dtype dtype;
    uint32_t rows, cols, rows_per_chunk;
    int n_chunks;
    vks_buffer *chunk[MAX_CHUNKS];
} dev_matrix;

/* One layer's parameters. */
/* One layer's parameters by schema index (vks_layer_schema): vectors (norms,
 * biases; NULL when absent) as f32 buffers, matrices chunked. */
typedef struct {
    vks_buffer *vec[VKS_LAYER_N_TENSORS];
    dev_matrix mat[VKS_LAYER_N_TENSORS];
} dev_layer;

/* One layer's KV cache [n_slots, kv_len, kv_dim] (K and V). */
typedef struct {
    vks_buffer *kcache, *vcache;
} dev_layer_kv;

/* The parameters of a layer range on the device: one parameter set. The
 * forward reads the weights' set; training creates more of the same shape
 * (gradients, two Adam moments), as llm.c's ParameterTensors. */
typedef struct {
    bool has_embed, has_head; /* the range starts at layer 0 / ends at the last layer */
    dev_matrix tok_emb, classifier; /* classifier aliases tok_emb when tied */
    vks_buffer *final_norm;
    dev_layer *layers; /* n_layers entries, for layers layer_begin.. */
    int n_layers;
    uint64_t embed_bytes; /* device bytes of the token embedding table */
} vks_param_set;

typedef struct {
    vks_buffer *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* [max_rows, ...] */
    vks_buffer *tokens, *slot, *pos;                  /* [max_rows] uint32 */
    vks_buffer *out_rows, *xo, *logits, *sample, *sampled, *logp; /* [max_out_rows, ...] */
    vks_buffer *rope_table;                           /* [kv_len, head_dim/2] (cos, sin): vks_rope_table */
    vks_buffer *att_part; /* kv_f16: the split attention's partials for max_rows rows over kv_len keys */
    vks_buffer *sample_scratch; /* top-k's partial histograms over several workgroups (few rows, large vocabulary) */
} dev_activations;

/* A LoRA adapter's matrices of the engine's layer range (engine_lora.c):
 * per layer and target A [rank, in] and scale * B [out, rank] (NULL: not
 * targeted); z [max_rows, rank] holds A x between the two products. */
typedef struct {
    vks_buffer *A[VKS_LORA_TARGET_COUNT], *B[VKS_LORA_TARGET_COUNT];
} dev_lora_layer;
typedef struct {
    dev_lora_layer *layers; /* w.n_layers entries; NULL: no adapter */
    int rank;
    uint32_t targets;
    vks_buffer *z;
} dev_lora;

/* A forward's recording kept for replay (engine_forward.c): the shape and
 * outputs it was recorded for; the inputs come from the host buffer. */
#define ENGINE_RECORDINGS 8
typedef struct {
    vks_cmd *cmd; /* NULL: free */
    int n_rows, n_out;
    vks_matmul_kind kind;
    unsigned what; /* FWD_* bits */
    bool every_row; /* the output rows were all the rows in order (no gather in the head) */
    int n_taps, *tap_layers; /* with FWD_TAPS: the boundaries tapped (malloc'd) */
    vks_cmd_counts layers; /* the transformer layers' share */
    uint64_t download_bytes; /* device-to-host bytes each run copies */
    uint64_t used;         /* LRU stamp */
} engine_recording;

/* Where a forward's inputs and outputs sit in the host buffers. */
typedef struct {
    size_t slot, pos, tokens, out_rows, sample, x_in, in_bytes;   /* host_in */
    size_t sampled, logp, hidden, x_out, out_bytes;              /* host_out */
} engine_host_layout;

struct vks_engine {
    vks_matmul_kind matmul_kind; /* of the forward being recorded */
    vks_gpu *gpu;
    vks_ops *ops;
    vks_model_config cfg;
    vks_engine_options opt;
    vks_param_set w;   /* the weights */
    dev_layer_kv *kv;  /* w.n_layers entries */
    dev_activations act;
    dev_lora lora;
    vks_buffer **tap_bufs; /* residual-stream taps [max_out_rows, dim] each, made on first use */
    int n_tap_bufs;
    uint64_t weight_bytes, device_bytes;
    vks_engine_stats stats;
    vks_host_buffer *host_in, *host_out, *host_logits; /* host_logits: made at the first forward that wants logits */
    vks_host_buffer *host_taps; /* [n_host_taps, max_out_rows, dim]: made at the first forward with taps */
    int n_host_taps;
    engine_host_layout io;
    engine_recording rec[ENGINE_RECORDINGS];
    uint64_t rec_clock;
};

/* engine_forward.c: the host buffers of the forward's inputs and outputs,
 * and the recordings kept (dropped when the buffers they bind change). */
int vks_engine_host_buffers_create(vks_engine *e);
void vks_engine_drop_recordings(vks_engine *e);
void vks_engine_host_buffers_free(vks_engine *e);

/* engine_weights.c: device bytes the weights of opt's layer range need, and
 * their upload (errors name the layer and tensor) and release. */
uint64_t vks_param_set_bytes_needed(const vks_engine_options *opt, const vks_model *m);
int vks_param_set_upload(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, vks_param_set *out);
void vks_param_set_free(vks_param_set *p);

/* engine_lora.c: y[:, 0:out] (row stride ldy) += scale B (A x) for layer l
 * (index in the range) and target t when the adapter has it; nothing else. */
int vks_engine_record_lora(vks_engine *e, vks_cmd *c, int l, vks_lora_target t, vks_buffer *x, vks_buffer *y,
                           uint32_t M, uint32_t ldy);
void vks_engine_lora_free(vks_engine *e);

/* The model's RoPE table for positions < n_pos (vks_rope_table) on the device. */
int vks_rope_table_upload(vks_gpu *g, const vks_model_config *c, int n_pos, vks_buffer **out);
#endif
