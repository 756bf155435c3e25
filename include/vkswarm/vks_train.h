/* vks_train.h: training a whole model, or a LoRA adapter on a frozen base,
 * on the device (src/engine/train*.c).
 * Four parameter sets of the same shape live on the device: f32 master
 * weights, gradients and the two Adam moments, each a list of tensors.
 * Full fine-tuning: named and ordered as vks_ref_params (vks_ref_train.h),
 * i.e. vks_schema_list: tok_emb, each layer's tensors in the schema's order,
 * final_norm and, when the classifier is not tied to tok_emb, classifier. A
 * model in any file type is dequantized to the f32 masters on load
 * (quantized blocks are not trained in place; writing quantized weights back
 * is convert's job).
 * LoRA (vks_trainer_options.lora): the tensors are the adapter's alone, per
 * layer and per target in vks_lora_target order, A then B:
 * "layers.N.q_proj.lora_A" [rank, in], "layers.N.q_proj.lora_B" [out, rank]
 * (PEFT's module names); the model's weights stay frozen on the device in
 * their file's types (the inference engine's upload: f32, f16, bf16, q8_0,
 * q4_0, q4_k; q6_k as f16), never expanded to f32; the targeted products are
 * vks_op_lora_forward/_backward, the rest only pass dX = dY W back. */
#ifndef VKS_TRAIN_H
#define VKS_TRAIN_H
#include "vks_gpu.h"
#include "vks_lora.h"
#include "vks_model.h"
#include "vks_train_types.h" /* vks_adamw_params, vks_lr_schedule, vks_grpo_loss_params */

typedef enum { VKS_SET_PARAMS = 0, VKS_SET_GRADS = 1, VKS_SET_ADAM_M = 2, VKS_SET_ADAM_V = 3, VKS_SET_COUNT } vks_param_kind;

typedef struct {
    char name[32];
    int64_t rows, cols; /* vectors: rows = 1 */
} vks_train_tensor_info;

typedef struct vks_trainer vks_trainer;

typedef struct {
    int max_tokens;  /* rows of one micro-batch (packed sequences); 0: the model's seq_len */
    bool recompute;  /* keep only each layer's input; recompute its activations in backward */
    /* LoRA: train only this adapter (its config; its A and B are the starting
     * values, copied) on the frozen model; it must fit the model's config.
     * NULL: full fine-tuning. */
    const vks_lora_adapter *lora;
    /* LoRA: also train the final norm's weight beside the adapter (PEFT's
     * modules_to_save = ["norm"]): tensor "norm" [1, dim], last, starting
     * from the adapter's norm where it carries one (which sets this), else
     * the model's; vks_trainer_export_lora puts it in the adapter. Without it
     * the logits are bounded by the frozen norm and classifier (NOTES
     * "Training"). Not in the memory plan. */
    bool lora_save_norm;
} vks_trainer_options;

/* Before allocating anything, the run's memory plan (vks_train_plan_make
 * with these options; LoRA: the base in its file's types) is compared with
 * the device's free memory (vks_gpu_free_bytes; VKSWARM_DEVICE_MEMORY caps
 * it): a run that would not fit is refused, VKS_ERR_ARG with the plan in
 * the message. */
int vks_trainer_create(vks_gpu *g, const vks_model *m, const vks_trainer_options *o, vks_trainer **out);
void vks_trainer_destroy(vks_trainer *t);

/* One micro-batch: packed sequences as vks_ref_batch (sequence s is
 * seq_lens[s] consecutive tokens at positions 0..seq_lens[s]-1, attending
 * only to itself; seq_lens NULL: one sequence). Row r's target is the next
 * token of its own sequence; the last row of each sequence has none.
 * weight[r] scales row r's loss term (0 masks it; the caller divides by its
 * normaliser), ignored on rows without a target; NULL: 1 for every row. */
typedef struct {
    const int32_t *tokens;
    int n_tokens;
    const int *seq_lens;
    int n_seqs;
    const float *weight;
} vks_train_batch;

/* Forward and backward of loss = -sum_r weight[r] * logp[r] over rows with a
 * target: the gradients of every parameter ACCUMULATE into the gradient set
 * (micro-batches add up until vks_trainer_step). *loss (may be NULL) gets the
 * loss; logp (may be NULL, n_tokens entries) each row's log-probability of
 * its target (0 where none). */
int vks_trainer_accumulate(vks_trainer *t, const vks_train_batch *b, double *loss, float *logp);
/* What one GRPO micro-batch reports, over its live rows (weight != 0). */
typedef struct {
    double loss;          /* sum of the rows' loss terms (each already divided by the token budget) */
    int tokens;           /* live rows */
    int clipped, capped;  /* rows with VKS_GRPO_CLIPPED (no gradient), VKS_GRPO_CAPPED (rho >= delta) */
    double clip_fraction; /* clipped / tokens (0 without live rows) */
    double logp_mismatch; /* mean |logp - logp_old|: the trainer's recomputation vs the sampler's record */
    double mismatch_kl;   /* mean exp(x) - x - 1, x = logp - logp_old: prime-rl's sampler-trainer mismatch KL */
    double max_mismatch;  /* the largest of them */
    double kl;            /* mean k3 KL estimate exp(x) - x - 1, x = ref_logp - logp (0 without the KL term) */
    double entropy;       /* mean entropy (nats) of the live rows' distributions (temperature 1, whole
                           * vocabulary); reported with or without the entropy bonus */
} vks_grpo_stats;

/* A GRPO micro-batch's per-row inputs, n_tokens entries each. */
typedef struct {
    const float *logp_old;  /* the sampling policy's log-probability of the row's target */
    const float *advantage; /* the row's sequence's advantage */
    const float *ref_logp;  /* the reference model's, for the KL term; read only when kl_beta != 0 */
} vks_grpo_rows;

/* Forward, INTELLECT-2's GRPO loss (vks_ref_grpo_loss: ratio cap h->delta,
 * clip h->eps, divided by h->token_budget) and backward, recorded in ONE
 * command buffer: the loss kernel reads the forward's logp and writes the
 * backward's dlogp on the device. Gradients ACCUMULATE as with
 * vks_trainer_accumulate. b->weight[r] is the completion mask (1 on rows
 * whose target is a completion token, 0 on prompt rows; NULL: every row with
 * a target is live; vks_grpo_sequence_rows builds it); rows without a target
 * are never live. rows' arrays are read only on live rows (finite,
 * log-probabilities <= 0, or VKS_ERR_ARG naming the row). With h->kl_beta
 * the KL penalty to the reference model is added (off by default), with
 * h->entropy_coef c the entropy bonus -c w[r] H_r / token_budget per live row
 * (off by default: 0 records the same kernels as before it existed, plus one
 * that only reads the logits for stats->entropy; the bonus's gradient is
 * added in the token log-probability backward); stats->loss includes it.
 * stats and logp (this policy's log-probability of each row's target, 0
 * where none) may be NULL. */
int vks_trainer_accumulate_grpo(vks_trainer *t, const vks_train_batch *b, const vks_grpo_rows *rows,
                                const vks_grpo_loss_params *h, vks_grpo_stats *stats, float *logp);
/* Forward only: logp[n_tokens] as above (evaluation, the RL trainer's check of
 * the inference ranks' log-probabilities). */
int vks_trainer_logprobs(vks_trainer *t, const vks_train_batch *b, float *logp);
/* The same, and top1[r] = 1 where row r's target is the model's most likely
 * token (lowest index on ties), 0 elsewhere and where there is no target. */
int vks_trainer_score(vks_trainer *t, const vks_train_batch *b, float *logp, uint8_t *top1);

/* One optimizer step on the accumulated gradients, all on the device: the
 * global gradient norm, clipping to max_grad_norm (<= 0: off), AdamW with h
 * at step vks_trainer_steps(t) + 1, then zeroed gradients. *grad_norm (may be
 * NULL) gets the norm before clipping. */
int vks_trainer_step(vks_trainer *t, const vks_adamw_params *h, double max_grad_norm, double *grad_norm);
/* Optimizer steps taken (restored by vks_trainer_set_steps on resume). */
int vks_trainer_steps(const vks_trainer *t);
/* The device bytes its memory plan (vks_train_plan_make, below) gave when it
 * was created: what its buffers should hold at their peak (vks_gpu_peak_bytes). */
uint64_t vks_trainer_plan_bytes(const vks_trainer *t);
void vks_trainer_set_steps(vks_trainer *t, int steps);
/* Zeroes the gradient set (vks_trainer_step does it after each step). */
int vks_trainer_zero_grads(vks_trainer *t);

/* The parameter tensors (same list in every set). */
int vks_trainer_n_tensors(const vks_trainer *t);
int vks_trainer_tensor_info(const vks_trainer *t, int i, vks_train_tensor_info *info);
/* Index of the tensor called name, or -1. */
int vks_trainer_find_tensor(const vks_trainer *t, const char *name);
/* Copies tensor i of a set to or from host f32 (rows * cols values). */
int vks_trainer_read(vks_trainer *t, vks_param_kind set, int i, float *dst);
int vks_trainer_write(vks_trainer *t, vks_param_kind set, int i, const float *src);
/* A host model (f32, owning its weights) with the current master weights and
 * m's config, special tokens and architecture: for checkpoints, generation
 * and broadcasting. Full fine-tuning only (VKS_ERR_ARG for a LoRA trainer). */
int vks_trainer_export_model(vks_trainer *t, vks_model **out);
/* LoRA: the config the trainer trains (NULL for full fine-tuning). */
const vks_lora_config *vks_trainer_lora_config(const vks_trainer *t);
/* LoRA: copies the current A and B of every layer and target into a, an
 * adapter of the same config and layer count (VKS_ERR_ARG otherwise), and
 * the trained final norm where lora_save_norm (vks_lora_adapter_set_norm). */
int vks_trainer_export_lora(vks_trainer *t, vks_lora_adapter *a);

/* ---- the memory plan (src/engine/train_plan.c): device bytes of a training
 * run, computed without a device ---- */
typedef struct {
    int lora_rank;         /* 0: full fine-tuning (every weight trained, f32 masters) */
    uint32_t lora_targets; /* vks_lora.h's VKS_LORA_* bits; 0: all seven */
    vks_dtype base_dtype;  /* LoRA: the frozen base's type on the device (as vks_engine_options.dtype) */
    bool keep_file_dtype;  /* LoRA: every matrix keeps m's file type instead (a quantized GGUF) */
    int tokens;            /* rows of one micro-batch (packed sequences), 1..16384 */
    bool recompute;        /* keep only each layer's input (vks_trainer_options.recompute) */
} vks_train_plan_options;

typedef struct {
    int64_t params;            /* the model's parameters */
    int64_t trainable;         /* the trained ones: all (rank 0) or the adapters' */
    uint64_t base;             /* the model's weights: f32 masters (rank 0), the frozen base in its type (LoRA) */
    uint64_t adapter;          /* the adapters' A and B, f32 (their masters); 0 at rank 0 */
    uint64_t gradients;        /* f32 per trainable parameter */
    uint64_t optimizer;        /* AdamW's two f32 moments per trainable parameter */
    uint64_t activations;      /* what the forward keeps for the backward (train_plan.c lists it) */
    uint64_t logits;           /* [tokens, vocab] logits (their gradient replaces them) and log-probabilities */
    uint64_t scratch;          /* the backward's gradients of the activations, op scratch, batch rows, RL rows */
    uint64_t total;            /* the sum */
} vks_train_plan;

/* The plan for model m and options o. m may hold only its config (layers
 * NULL, as for a shape given on the command line): the base's size then
 * follows from the shapes and o->base_dtype. VKS_ERR_ARG for a bad config,
 * rank, target mask or token count. */
int vks_train_plan_make(const vks_model *m, const vks_train_plan_options *o, vks_train_plan *out);
/* The plan in one line: "base 1.23 GiB, adapter 4.0 MiB, ..., scratch 2.0 MiB: total 3.45 GiB". */
int vks_train_plan_describe(const vks_train_plan *p, char *buf, size_t cap);
#endif
