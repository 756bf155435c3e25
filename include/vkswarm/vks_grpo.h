/* vks_grpo.h: the host side of INTELLECT-2's GRPO (src/rl/advantage.c):
 * group-relative advantages, the online filter, and the per-row arrays the
 * trainer's loss reads (vks_trainer_accumulate_grpo). The loss itself is
 * vks_ref_grpo_loss / vks_op_grpo_loss; the thinking-budget reward
 * adjustment belongs to the tasks (the rewards given here already include it). */
#ifndef VKS_GRPO_H
#define VKS_GRPO_H
#include "vks_common.h"

/* Added to the group's standard deviation (INTELLECT-2's value). */
#define VKS_GRPO_STD_EPS 1e-6

/* The advantage of a completion in its group (config "advantage.type"). */
typedef enum {
    VKS_ADVANTAGE_GROUP_STD = 0, /* (r - mean) / (std + VKS_GRPO_STD_EPS): INTELLECT-2's GRPO */
    VKS_ADVANTAGE_GROUP_MEAN     /* r - mean: Dr. GRPO, prime-rl's default (no difficulty bias from the std) */
} vks_advantage_type;

/* n_groups groups of G completions of one prompt each, rewards[g * G + i]:
 * advantage[g * G + i] = (r - mean) / (std + VKS_GRPO_STD_EPS), mean and the
 * POPULATION standard deviation (divided by G, not G - 1) of its own group,
 * computed in double; r - mean with VKS_ADVANTAGE_GROUP_MEAN. A group whose
 * rewards are all equal gets 0 everywhere. VKS_ERR_ARG on NULL, n_groups < 1,
 * G < 1, an unknown type or a reward that is not finite. */
int vks_grpo_advantages(const double *rewards, int n_groups, int G, vks_advantage_type type, double *advantage);

/* The online filter: false when the G rewards are all equal (every advantage
 * 0: the group carries no signal and must not reach the trainer), true
 * otherwise. G < 1 or NULL: false. */
bool vks_grpo_group_has_signal(const double *rewards, int G);

/* One packed sequence of prompt_len prompt tokens then completion_len
 * completion tokens (prompt_len >= 1), rows [0, prompt_len + completion_len)
 * of the arrays: weight = 1 and advantage = adv on the rows whose target is
 * a completion token (rows prompt_len - 1 .. prompt_len + completion_len - 2),
 * weight = 0 and advantage = 0 elsewhere (the prompt rows and the last row,
 * which has no target). trained (completion_len entries, NULL: all 1) marks
 * the completion tokens of the model's own in a multi-turn episode: the
 * environment's tokens (0) are inputs, their rows dead as the prompt's.
 * VKS_ERR_ARG on NULL or bad lengths. */
int vks_grpo_sequence_rows(int prompt_len, int completion_len, const uint8_t *trained, double adv, float *advantage,
                           float *weight);
/* How many of a completion's completion_len tokens are trained on (trained: as above). */
int vks_grpo_trained_tokens(int completion_len, const uint8_t *trained);

/* The trainer's bound on what a sampler's record may claim. A packed
 * micro-batch of n_seqs sequences (seq_lens rows each): far[i] = true when a
 * row of sequence i with weight != 0 has |logp - logp_old| > max_mismatch
 * (or either is not finite), else false; returns how many are far (-1: NULL
 * or a bad length). */
int vks_grpo_far_sequences(const float *logp, const float *logp_old, const float *weight, const int *seq_lens, int n_seqs,
                           double max_mismatch, bool *far);
#endif
