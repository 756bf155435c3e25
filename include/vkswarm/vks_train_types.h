/* vks_train_types.h: plain types of training: the RL loss's and AdamW's
 * parameters, the learning-rate schedule and a position in the SFT data, and
 * the one check of the loss's parameters (src/core/loss_params.c). Here, at
 * the bottom (src/core), so that the GPU ops, the checkpoints (src/model), the
 * reference (src/ref) and the runs (src/engine, src/rl) share them without
 * depending on each other. What they mean: vks_ref_grad.h (vks_ref_grpo_loss,
 * vks_ref_adamw_step, vks_ref_lr_at) and vks_sft_data.h (the batcher). */
#ifndef VKS_TRAIN_TYPES_H
#define VKS_TRAIN_TYPES_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The policy loss's kinds (vks_ref_grpo_loss defines each; docs/rl.md "RL losses"). */
typedef enum {
    VKS_LOSS_INTELLECT2 = 0, /* INTELLECT-2's GRPO: ratio capped at delta, clipped to [1 - eps, 1 + eps] (the default) */
    VKS_LOSS_DPPO_KL,        /* prime-rl's default: A rho unclipped, masked where the probability moved too far in
                              * the advantage's direction, plus kl_tau (logp - logp_old)^2 */
    VKS_LOSS_IPO,            /* prime-rl's ipo: the same, masked where |p - p_old| > the threshold either way */
    VKS_LOSS_CISPO,          /* MiniMax-M1's CISPO: the clipped ratio as a detached coefficient of A logp */
    VKS_LOSS_DAPO,           /* DAPO: PPO's clip with clip-higher, [1 - eps_low, 1 + eps_high], no cap */
    VKS_LOSS_GSPO,           /* GSPO (Qwen): dapo's clip on the sequence's ratio, the geometric mean of its
                              * tokens' ratios, for every token of the sequence */
    VKS_LOSS_DECOUPLED_PPO,  /* AReaL's decoupled PPO: PPO's clip on pi / pi_prox times the behaviour weight
                              * pi_prox / pi_behav (detached), masked (or truncated) above behav_cap */
    VKS_LOSS_TYPE_COUNT
} vks_loss_type;

/* The RL loss (vks_ref_grpo_loss, vks_op_grpo_loss). Fields after entropy_coef
 * are read by the loss types that name them; zero-initialised, they give
 * INTELLECT-2's loss (type 0). */
typedef struct {
    double delta;        /* intellect2: ratio cap: 4 */
    double eps;          /* intellect2: clip range: 0.2 */
    double token_budget; /* the step's fixed normaliser (> 0) */
    double kl_beta;      /* KL penalty weight, >= 0; 0: off (ref_logp not read) */
    /* Entropy bonus weight c, >= 0; 0: off. The term -c w[r] H_r / token_budget
     * (H_r the entropy of row r's whole distribution: it lowers the loss when
     * entropy is higher) needs the logits, not logp: vks_trainer_accumulate_grpo
     * adds it in the token log-probability backward; vks_ref_grpo_loss and
     * vks_op_grpo_loss ignore it (vks_ref_token_entropy_backward is its reference). */
    double entropy_coef;
    vks_loss_type type;
    double eps_low, eps_high;   /* dapo, cispo, gspo: the ratio (cispo: its coefficient; gspo: the sequence's) is
                                 * clipped to [1 - eps_low, 1 + eps_high] */
    double mask_low, mask_high; /* dppo_kl: masked where p - p_old < -mask_low (A <= 0) or > mask_high (A > 0);
                                 * ipo: where it is < -mask_low or > mask_high (both set to the threshold) */
    double adv_tau, kl_tau;     /* dppo_kl, ipo: the advantage's scale and the squared log-ratio's weight */
    double behav_cap;           /* decoupled_ppo: the behaviour weight's cap (>= 1; AReaL's behav_imp_weight_cap) */
    bool behav_truncate;        /* decoupled_ppo: a weight above the cap becomes the cap (TIS), not 0 (MIS, AReaL's) */
} vks_grpo_loss_params;
/* prime-rl's and the papers' defaults */
#define VKS_DAPO_EPS_LOW 0.2
#define VKS_DAPO_EPS_HIGH 0.28
#define VKS_DPPO_MASK 0.2
#define VKS_IPO_THRESHOLD 0.1
#define VKS_DPPO_KL_TAU 1e-3
#define VKS_GSPO_EPS_LOW 3e-4 /* the GSPO paper's: a sequence's ratio moves far less than a token's */
#define VKS_GSPO_EPS_HIGH 4e-4
#define VKS_BEHAV_CAP 5.0 /* AReaL's example configs' behav_imp_weight_cap */

/* Whether h is a valid loss: the type's own parameters in range, token_budget
 * > 0 (also as a float), kl_beta >= 0. When not, why (may be NULL) gets a
 * sentence naming the parameter. */
bool vks_grpo_loss_params_ok(const vks_grpo_loss_params *h, char *why, size_t cap);
/* "intellect2", "dppo_kl", "ipo", "cispo", "dapo", "gspo", "decoupled_ppo"; NULL for another value. */
const char *vks_loss_type_name(vks_loss_type t);
/* The type named s; false when s names none. */
bool vks_loss_type_parse(const char *s, vks_loss_type *t);
#define VKS_GRPO_DELTA 4.0
#define VKS_GRPO_EPS 0.2
/* Per-row flags of the loss (vks_ref_grpo_loss, vks_op_grpo_loss). */
#define VKS_GRPO_CLIPPED 1u /* the row left its trust region: intellect2, dapo: the clipped term is active (no
                             * gradient); dppo_kl, ipo: masked (no policy gradient); cispo: the coefficient clipped;
                             * decoupled_ppo: the behaviour weight over its cap (or the clipped term active) */
#define VKS_GRPO_CAPPED 2u  /* intellect2: rho >= delta: the ratio was capped */

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
