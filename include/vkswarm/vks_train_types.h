/* vks_train_types.h: plain types of training, without functions: the GRPO
 * loss's and AdamW's parameters, the learning-rate schedule and a position in
 * the SFT data. Here, at the bottom (src/core), so that the GPU ops, the
 * checkpoints (src/model), the reference (src/ref) and the runs (src/engine,
 * src/rl) share them without depending on each other. What they mean:
 * vks_ref_grad.h (vks_ref_grpo_loss, vks_ref_adamw_step, vks_ref_lr_at) and
 * vks_sft_data.h (the batcher). */
#ifndef VKS_TRAIN_TYPES_H
#define VKS_TRAIN_TYPES_H
#include <stdbool.h>
#include <stdint.h>

/* The GRPO loss (vks_ref_grpo_loss, vks_op_grpo_loss). */
typedef struct {
    double delta;        /* ratio cap: 4 */
    double eps;          /* clip range: 0.2 */
    double token_budget; /* the step's fixed normaliser (> 0) */
    double kl_beta;      /* KL penalty weight, >= 0; 0: off (ref_logp not read) */
    /* Entropy bonus weight c, >= 0; 0: off. The term -c w[r] H_r / token_budget
     * (H_r the entropy of row r's whole distribution: it lowers the loss when
     * entropy is higher) needs the logits, not logp: vks_trainer_accumulate_grpo
     * adds it in the token log-probability backward; vks_ref_grpo_loss and
     * vks_op_grpo_loss ignore it (vks_ref_token_entropy_backward is its reference). */
    double entropy_coef;
} vks_grpo_loss_params;
#define VKS_GRPO_DELTA 4.0
#define VKS_GRPO_EPS 0.2
/* Per-row flags of the loss (vks_ref_grpo_loss, vks_op_grpo_loss). */
#define VKS_GRPO_CLIPPED 1u /* the clipped term is active: no gradient */
#define VKS_GRPO_CAPPED 2u  /* rho >= delta: the ratio was capped */

typedef struct {
    double lr;           /* this step's learning rate (see vks_ref_lr_at) */
    double beta1, beta2; /* e.g. 0.9, 0.95 */
    double eps;          /* e.g. 1e-8 */
    double weight_decay; /* decoupled: p -= lr * weight_decay * p */
} vks_adamw_params;

/* Learning rate at 1-based step t: linear warm-up lr * t / warmup_steps for
 * t <= warmup_steps, then constant lr, or (cosine) a half cosine from lr down
 * to min_lr at total_steps, min_lr after. */
typedef struct {
    double lr, min_lr;
    int warmup_steps; /* 0: no warm-up */
    int total_steps;  /* cosine only: the step where min_lr is reached */
    bool cosine;
} vks_lr_schedule;

/* Where the next SFT micro-batch starts (vks_sft_data.h). */
typedef struct {
    uint64_t seed;  /* the shuffle's key */
    int64_t epoch;  /* 0-based pass over the data; < 2^32 */
    int64_t index;  /* next sequence of this epoch's order, 0 <= index < n_sequences */
} vks_sft_position;

#endif
