/* ops_grad_loss.c: records the RL losses on the device (vks_ops_grad.h,
 * "loss ops"): the RL loss of each type and its gradient with respect to each row's
 * log-probability, written where the trainer's backward reads it. */
#include "ops_internal.h"
#include "vkswarm/vks_ops_grad.h"

#include <math.h>

enum { N_GRPO = 9, GRPO_REF = 4, GRPO_DLOGP = 5, GRPO_OUT_END = 8, GRPO_SEQ = 8 }; /* bindings; ref_logp; outputs
                                                                                 * [DLOGP, OUT_END); seq_log_ratio */

/* Every binding holds R 4-byte values; no output shares memory with another
 * binding, except dlogp with logp (in place). ref_logp only counts with the
 * KL term (kl), seq_log_ratio with gspo (seq). */
static int check_grpo(const char *op, const vks_binding *b, uint32_t R, bool kl, bool seq) {
    static const char *const what[] = {"logp", "logp_old", "advantage", "weight", "ref_logp",
                                       "dlogp", "loss_rows", "flags", "seq_log_ratio"};
    bool used[N_GRPO];
    for (int i = 0; i < N_GRPO; i++) used[i] = (i != GRPO_REF || kl) && (i != GRPO_SEQ || seq);
    for (int i = 0; i < N_GRPO; i++) {
        int rc = used[i] ? vks_ops_check_range(op, what[i], b[i], R, 4) : VKS_OK;
        if (rc) return rc;
    }
    for (int out = GRPO_DLOGP; out < GRPO_OUT_END; out++)
        for (int i = 0; i < N_GRPO; i++)
            if (i != out && !(out == GRPO_DLOGP && i == 0) && used[i] && vks_ops_overlap(b[out], b[i]))
                return vks_set_error(VKS_ERR_ARG, "%s: %s shares memory with %s", op, what[out], what[i]);
    return VKS_OK;
}

/* The kernel's lo, hi: the ratio's bounds, or the probability masks. */
static void bounds(const vks_grpo_loss_params *h, float *lo, float *hi) {
    switch (h->type) {
    case VKS_LOSS_INTELLECT2: *lo = (float)(1.0 - h->eps), *hi = (float)(1.0 + h->eps); break;
    case VKS_LOSS_DAPO:
    case VKS_LOSS_GSPO:
    case VKS_LOSS_CISPO: *lo = (float)(1.0 - h->eps_low), *hi = (float)(1.0 + h->eps_high); break;
    case VKS_LOSS_DECOUPLED_PPO: *lo = h->behav_truncate ? (float)h->behav_cap : 0.0f, *hi = (float)h->behav_cap; break;
    default: *lo = (float)h->mask_low, *hi = (float)h->mask_high; break;
    }
}

int vks_op_grpo_loss(vks_ops *o, vks_cmd *c, const vks_grpo_loss_rows *rows, uint32_t R,
                     const vks_grpo_loss_params *h) {
    const char *op = "grpo_loss";
    char why[128] = "";
    if (!o || !c || !rows || !R || !vks_grpo_loss_params_ok(h, why, sizeof why))
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments (R=%u%s%s)", op, R, why[0] ? "; " : "", why);
    bool kl = h->kl_beta != 0.0, seq = h->type == VKS_LOSS_GSPO;
    vks_binding b[N_GRPO] = {rows->logp, rows->logp_old, rows->advantage, rows->weight, rows->ref_logp,
                             rows->dlogp, rows->loss_rows, rows->flags, rows->seq_log_ratio};
    int rc = check_grpo(op, b, R, kl, seq);
    if (rc) return rc;
    /* not read: logp stands in for a binding that may be unset */
    if (!kl) b[GRPO_REF] = rows->logp;
    if (!seq) b[GRPO_SEQ] = rows->logp;
    struct { uint32_t R, type; float delta, lo, hi, token_budget, kl_beta, adv_tau, kl_tau; } push = {
        R, (uint32_t)h->type, (float)h->delta, 0, 0, (float)h->token_budget, (float)h->kl_beta, (float)h->adv_tau,
        (float)h->kl_tau};
    bounds(h, &push.lo, &push.hi);
    uint32_t spec[] = {o->wg_elementwise};
    return vks_ops_dispatch(o, c, "grpo_loss", spec, 1, b, N_GRPO, &push, sizeof push,
                            ceil_div(R, o->wg_elementwise), op);
}
