/* advantage.c: GRPO's group-relative advantages, the online filter and the
 * per-row advantage/weight arrays of a packed sequence (vks_grpo.h). */
#include "vkswarm/vks_grpo.h"

#include <math.h>

static int check_rewards(const double *r, int n) {
    for (int i = 0; i < n; i++)
        if (!isfinite(r[i])) return vks_set_error(VKS_ERR_ARG, "GRPO: reward %d is %g (not finite)", i, r[i]);
    return VKS_OK;
}

/* Mean and population standard deviation of x[0..n). */
static void mean_std(const double *x, int n, double *mean, double *std) {
    double sum = 0.0, sq = 0.0;
    for (int i = 0; i < n; i++) sum += x[i];
    *mean = sum / n;
    for (int i = 0; i < n; i++) sq += (x[i] - *mean) * (x[i] - *mean);
    *std = sqrt(sq / n);
}

int vks_grpo_advantages(const double *rewards, int n_groups, int G, vks_advantage_type type, double *advantage) {
    if (!rewards || !advantage || n_groups < 1 || G < 1 || (type != VKS_ADVANTAGE_GROUP_STD && type != VKS_ADVANTAGE_GROUP_MEAN))
        return vks_set_error(VKS_ERR_ARG, "GRPO advantages: %d groups of %d (both >= 1), type %d, or a NULL array",
                             n_groups, G, (int)type);
    int rc = check_rewards(rewards, n_groups * G);
    if (rc) return rc;
    for (int g = 0; g < n_groups; g++) {
        const double *r = rewards + (size_t)g * G;
        double *a = advantage + (size_t)g * G, mean, std;
        mean_std(r, G, &mean, &std);
        bool signal = vks_grpo_group_has_signal(r, G);
        double scale = type == VKS_ADVANTAGE_GROUP_STD ? std + VKS_GRPO_STD_EPS : 1.0;
        for (int i = 0; i < G; i++) a[i] = signal ? (r[i] - mean) / scale : 0.0;
    }
    return VKS_OK;
}

bool vks_grpo_group_has_signal(const double *rewards, int G) {
    if (!rewards || G < 1) return false;
    for (int i = 1; i < G; i++)
        if (rewards[i] != rewards[0]) return true;
    return false;
}

int vks_grpo_sequence_rows(int prompt_len, int completion_len, const uint8_t *trained, double adv, float *advantage,
                           float *weight) {
    if (!advantage || !weight || prompt_len < 1 || completion_len < 0 || completion_len > INT32_MAX - prompt_len)
        return vks_set_error(VKS_ERR_ARG, "GRPO rows: prompt of %d tokens (>= 1), completion of %d (>= 0)",
                             prompt_len, completion_len);
    int n = prompt_len + completion_len;
    for (int r = 0; r < n; r++) {
        /* the target (row r + 1) is a completion token, the assistant's */
        bool live = r >= prompt_len - 1 && r < n - 1 && (!trained || trained[r + 1 - prompt_len]);
        weight[r] = live ? 1.0f : 0.0f;
        advantage[r] = live ? (float)adv : 0.0f;
    }
    return VKS_OK;
}

int vks_grpo_trained_tokens(int completion_len, const uint8_t *trained) {
    if (!trained) return completion_len > 0 ? completion_len : 0;
    int n = 0;
    for (int k = 0; k < completion_len; k++) n += trained[k] != 0;
    return n;
}

int vks_grpo_far_sequences(const float *logp, const float *logp_old, const float *weight, const int *seq_lens, int n_seqs,
                           double max_mismatch, bool *far) {
    if (!logp || !logp_old || !weight || !seq_lens || !far || n_seqs < 0) return -1;
    int n_far = 0;
    size_t row = 0;
    for (int i = 0; i < n_seqs; i++) {
        if (seq_lens[i] < 0) return -1;
        far[i] = false;
        for (int k = 0; k < seq_lens[i]; k++, row++)
            if (weight[row] != 0 && !(fabs((double)logp[row] - (double)logp_old[row]) <= max_mismatch)) far[i] = true;
        n_far += far[i];
    }
    return n_far;
}
