/* loss_params.c: the one check of the RL loss's parameters (vks_train_types.h),
 * shared by the float64 reference, the GPU op and the run's configuration. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "vkswarm/vks_train_types.h"

static const char *const type_names[VKS_LOSS_TYPE_COUNT] = {"intellect2", "dppo_kl", "ipo", "cispo", "dapo", "gspo",
                                                                 "decoupled_ppo"};

const char *vks_loss_type_name(vks_loss_type t) {
    return (unsigned)t < VKS_LOSS_TYPE_COUNT ? type_names[t] : NULL;
}

bool vks_loss_type_parse(const char *s, vks_loss_type *t) {
    for (int i = 0; s && t && i < VKS_LOSS_TYPE_COUNT; i++)
        if (!strcmp(s, type_names[i])) {
            *t = (vks_loss_type)i;
            return true;
        }
    return false;
}

static bool in(double x, double lo, double hi) { return isfinite(x) && x >= lo && x <= hi; }

static bool fail(char *why, size_t cap, const char *text) {
    if (why && cap) snprintf(why, cap, "%s", text);
    return false;
}

bool vks_grpo_loss_params_ok(const vks_grpo_loss_params *h, char *why, size_t cap) {
    if (!h) return fail(why, cap, "no loss parameters");
    if (!(isfinite(h->token_budget) && h->token_budget > 0.0 && (float)h->token_budget > 0.0f))
        return fail(why, cap, "token_budget must be > 0");
    if (!in(h->kl_beta, 0.0, 1e6)) return fail(why, cap, "kl_beta must be in [0, 1e6]");
    switch (h->type) {
    case VKS_LOSS_INTELLECT2:
        if (!(h->eps >= 0.0 && h->eps < 1.0)) return fail(why, cap, "intellect2: eps must be in [0, 1)");
        if (!(isfinite(h->delta) && h->delta >= 1.0 + h->eps)) return fail(why, cap, "intellect2: delta must be >= 1 + eps");
        return true;
    case VKS_LOSS_CISPO:
    case VKS_LOSS_DAPO:
    case VKS_LOSS_GSPO:
        if (!in(h->eps_low, 0.0, 1.0)) return fail(why, cap, "eps_low must be in [0, 1]");
        if (!in(h->eps_high, 0.0, 1e6)) return fail(why, cap, "eps_high must be in [0, 1e6]");
        return true;
    case VKS_LOSS_DECOUPLED_PPO:
        if (!(h->eps >= 0.0 && h->eps < 1.0)) return fail(why, cap, "decoupled_ppo: eps must be in [0, 1)");
        if (!in(h->behav_cap, 1.0, 1e6)) return fail(why, cap, "decoupled_ppo: behav_cap must be in [1, 1e6]");
        return true;
    case VKS_LOSS_DPPO_KL:
    case VKS_LOSS_IPO: /* probabilities differ by at most 1 */
        if (!in(h->mask_low, 0.0, 1.0) || !in(h->mask_high, 0.0, 1.0))
            return fail(why, cap, "the probability masks must be in [0, 1]");
        if (!in(h->adv_tau, 0.0, 1e6)) return fail(why, cap, "adv_tau must be in [0, 1e6]");
        if (!in(h->kl_tau, 0.0, 1e6)) return fail(why, cap, "kl_tau must be in [0, 1e6]");
        return true;
    default: return fail(why, cap, "unknown loss type");
    }
}
