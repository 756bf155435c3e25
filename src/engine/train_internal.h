/* train_internal.h: what the trainer's files share (not a public interface).
 * train_params.c owns the parameter sets; the forward, backward and
 * optimizer files record into the same vks_trainer. */
#ifndef VKS_TRAIN_INTERNAL_H
#define VKS_TRAIN_INTERNAL_H
#include "engine_internal.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_ops_grad.h"
#include "vkswarm/vks_train.h"

/* One tensor of a set: rows * cols f32 on the device. */
typedef struct {
    vks_train_tensor_info info;
    vks_buffer *buf[VKS_SET_COUNT];
} train_tensor;

/* A layer's tensors as indices into vks_trainer.tensors (by name or schema
 * index; -1 when absent from the model). */
#define TRAIN_FIELD_(field, ...) int field;
typedef union {
    struct { VKS_LAYER_TENSORS(TRAIN_FIELD_) };
    int t[VKS_LAYER_N_TENSORS];
} train_layer;

/* What a layer's forward keeps for its backward, [T, ...] each (T = max_tokens). */
typedef struct {
    vks_buffer *xn1, *q, *k, *v, *att;  /* attention block: normed input, q/k after RoPE, v, attention output */
    vks_buffer *stat_max, *stat_sum;    /* [T, n_heads] softmax statistics */
    vks_buffer *x_mid, *xn2;            /* residual after attention, its norm */
    vks_buffer *g, *u, *h;              /* FFN gate, up, swiglu(g, u) */
    vks_buffer *q_pre, *k_pre;          /* with cfg.qk_norm: q and k before their per-head norm, else NULL */
    vks_buffer *z[VKS_LORA_TARGET_COUNT]; /* LoRA: [T, rank] scale A x of each targeted matrix, else NULL */
} train_layer_acts;

/* The activation store and the backward's scratch. With opt.recompute one
 * train_layer_acts serves every layer (recomputed from x_in[l] in backward). */
typedef struct {
    int T;                               /* rows allocated */
    vks_buffer *tokens, *pos, *start, *target; /* [T] uint32 (target int32, VKS_TRAIN_NO_TARGET where none) */
    vks_buffer **x_in;                   /* n_layers + 1: each layer's input; x_in[n_layers] the last output */
    train_layer_acts *layer;             /* n_layers, or 1 with recompute */
    vks_buffer *xf, *logits, *logp, *dlogp; /* head: final norm [T, D], [T, V] (then their gradient), [T], [T] */
    /* backward scratch */
    vks_buffer *dres, *dxn, *dq, *dk, *dv, *datt, *dh, *dg, *du;
    vks_buffer *dq_pre, *dk_pre;         /* with cfg.qk_norm: gradients through the q/k norm, else NULL */
    vks_buffer *norm_scratch, *attn_scratch; /* the RMSNorm and attention backward ops' scratch */
    vks_buffer *embed_index;             /* VKS_EMBED_GRAD_INDEX_WORDS(T) uint32 */
    vks_buffer *clip_partials, *clip_out, *one; /* gradient norm: partial sums, {scale, norm}, 1.0f */
    /* GRPO loss: per row logp_old, advantage, weight, reference logp (inputs), loss term, flags (outputs), [T] each */
    vks_buffer *grpo_old, *grpo_adv, *grpo_weight, *grpo_ref, *grpo_loss, *grpo_flags;
    /* the entropy: d loss / d H per row (the bonus's input), each row's entropy (output), [T] each */
    vks_buffer *grpo_dent, *grpo_entropy;
    vks_buffer *grpo_seq; /* gspo: each row's sequence's mean log-ratio (input), [T] */
    vks_buffer *rope_table; /* [T, head_dim/2] (cos, sin): vks_rope_table */
    vks_buffer *lora_scratch; /* LoRA: [T, rank], vks_op_lora_backward's g; NULL in full fine-tuning */
    uint32_t n_partials;
} train_acts;

/* One buffer of the activation store: where its handle goes, its 4-byte
 * elements and what the memory plan calls it. */
typedef enum { TRAIN_BUF_ACT, TRAIN_BUF_LOGITS, TRAIN_BUF_SCRATCH } train_buffer_kind;
typedef struct {
    vks_buffer **b;
    uint64_t n;
    train_buffer_kind kind;
} train_buffer;
/* at most: q/k norm's buffers only with qk_norm, LoRA's only with an adapter */
enum { TRAIN_LAYER_BUFFERS = 14 + VKS_LORA_TARGET_COUNT, TRAIN_OTHER_BUFFERS = 36 };
/* train.c: the store's buffer lists for T rows (a layer's set; the head and
 * the backward's scratch), written to out; returns the count. lora: the
 * adapter's rank and targets (NULL or rank 0: full fine-tuning). The trainer
 * allocates and frees through them, vks_train_plan (train_plan.c) counts them. */
int vks_train_layer_buffers(const vks_model_config *c, const vks_lora_config *lora, uint64_t T, train_layer_acts *a,
                            train_buffer out[TRAIN_LAYER_BUFFERS]);
int vks_train_other_buffers(const vks_model_config *c, const vks_lora_config *lora, uint64_t T, uint64_t n_partials,
                            train_acts *a, train_buffer out[TRAIN_OTHER_BUFFERS]);

/* A micro-batch's per-row facts, built on the host from vks_train_batch. */
typedef struct {
    int n;
    uint32_t *tokens, *pos, *start;
    int32_t *target; /* VKS_TRAIN_NO_TARGET on the last row of each sequence */
    bool *has_target;
} train_rows;

struct vks_trainer {
    vks_gpu *gpu;
    vks_ops *ops;
    vks_model_config cfg;
    vks_trainer_options opt;
    int bos_id, eos_id;
    char arch[32];
    bool has_bias;
    train_tensor *tensors;
    vks_schema_item *items; /* what tensors[i] is in the model schema */
    int n_tensors;
    int tok_emb, final_norm, classifier; /* classifier == tok_emb when tied */
    train_layer *layers;
    train_acts acts;
    int steps; /* optimizer steps taken */
    uint64_t plan_bytes; /* the memory plan's total (check_fits) */
    /* LoRA (opt.lora set): the tensors are each layer's A and B of every
     * target; the model's weights are the frozen base on the device in their
     * file's types (the engine's upload). Full fine-tuning: lora.rank 0 and
     * every weight is a trainer tensor; `mats` views them as one-chunk f32
     * matrices so that the forward reads both kinds the same way. */
    vks_lora_config lora;
    float lora_scale;
    int (*adapter)[VKS_LORA_TARGET_COUNT]; /* [n_layers][target]: tensor of A (B follows), -1 when not targeted */
    vks_param_set base;
    dev_matrix *mats; /* full fine-tuning: n_tensors views of the masters */
};

static inline bool vks_train_is_lora(const vks_trainer *t) { return t->lora.rank > 0; }

#define VKS_TRAIN_NO_TARGET (-1) /* what vks_op_token_logprob reads as "no target" */
#define VKS_TRAIN_MAX_TOKENS ((int)VKS_ATTENTION_TRAIN_MAX_T)

/* The vks_attention_train of layer activations a over n rows. The starts are
 * sorted: rows_build (train.c) lays the sequences out in order and gives a
 * row the first row of its own sequence. */
#define VKS_TRAIN_ATTENTION(t, a, n)                                                                               \
    .T = (n), .n_heads = (uint32_t)(t)->cfg.n_heads, .n_kv_heads = (uint32_t)(t)->cfg.n_kv_heads,                 \
    .head_dim = (uint32_t)(t)->cfg.head_dim, .q = {(a)->q, 0, 0}, .k = {(a)->k, 0, 0}, .v = {(a)->v, 0, 0},       \
    .start = {(t)->acts.start, 0, 0}, .out = {(a)->att, 0, 0}, .row_max = {(a)->stat_max, 0, 0},                  \
    .row_sum = {(a)->stat_sum, 0, 0}, .starts_sorted = true

/* train_params.c */
int vks_train_params_create(vks_trainer *t, const vks_model *m, const vks_lora_adapter *lora);
void vks_train_params_free(vks_trainer *t);
/* The binding of tensor i of a set. */
vks_binding vks_train_binding(const vks_trainer *t, vks_param_kind set, int i);
/* The model's weights as the forward reads them (the masters or the frozen
 * base): matrix k (schema index) of layer l, the embedding, the classifier;
 * vector k of layer l and the final norm; their gradients (NULL bindings
 * when frozen). */
const dev_matrix *vks_train_layer_matrix(const vks_trainer *t, int l, int k);
const dev_matrix *vks_train_embedding(const vks_trainer *t);
const dev_matrix *vks_train_classifier(const vks_trainer *t);
vks_binding vks_train_layer_vector(const vks_trainer *t, vks_param_kind set, int l, int k);
vks_binding vks_train_final_norm(const vks_trainer *t, vks_param_kind set);
/* The LoRA target of schema matrix k (wq -> q, ..., w2 -> down), or -1. */
int vks_train_lora_target(int k);

/* train_forward.c: records the forward of n rows (rows already uploaded):
 * every layer, the head and the log-probabilities into acts.logp. */
int vks_train_record_forward(vks_trainer *t, vks_cmd *c, uint32_t n);
/* The forward of layer l alone (x_in[l] -> x_in[l + 1]); backward recomputes with it. */
/* LoRA: layer l's targeted matrix k (schema index) with its adapter. */
vks_lora_linear vks_train_lora_linear(const vks_trainer *t, int l, int k);
int vks_train_record_layer_forward(vks_trainer *t, vks_cmd *c, int l, uint32_t n);
/* train_backward.c: records the backward of loss = sum_r dlogp[r] * logp[r]
 * (acts.dlogp uploaded), accumulating into the gradient set. */
/* with_entropy (GRPO): the backward also writes each row's entropy to
 * acts.grpo_entropy and adds the entropy bonus's gradient from acts.grpo_dent
 * (vks_op_token_logprob_entropy_backward; rows with dent 0, e.g. every row
 * when the bonus is off, get the plain token_logprob backward's values). */
int vks_train_record_backward(vks_trainer *t, vks_cmd *c, uint32_t n, uint32_t n_unique_tokens, bool with_entropy);
/* The activations of layer l (the shared set under recompute). */
train_layer_acts *vks_train_layer_acts(vks_trainer *t, int l);
#endif
