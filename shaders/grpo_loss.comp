#version 450
// GRPO loss (INTELLECT-2's variant) on the log-probability of each row's
// target, one invocation per row (grid-stride), vks_ref_grpo_loss in f32:
//   rho = exp(logp - logp_old), c = min(rho, delta)
//   loss_r = w * max(-c A, -clamp(c, 1 - eps, 1 + eps) A) / token_budget
//   dlogp[r] = 0 where the clipped term is strictly larger (flag CLIPPED),
//              else -w A (rho < delta ? rho : 0) / token_budget
// flags: 1 = clipped term active, 2 = rho >= delta (ratio capped).
// With kl_beta != 0, the k3 KL penalty to a reference model, x = ref_logp - logp:
//   loss_r += w kl_beta (exp(x) - x - 1) / token_budget, dlogp += w kl_beta (1 - exp(x)) / token_budget
// Rows with weight 0 (prompt tokens, rows without a target) write zeros and
// read nothing else, so their logp/logp_old may be anything. dlogp is
// overwritten; each row is read before it is written, so dlogp may be the
// memory of logp (in place).
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer LogP { float logp[]; };
layout(std430, set = 0, binding = 1) readonly buffer LogPOld { float logp_old[]; };
layout(std430, set = 0, binding = 2) readonly buffer Adv { float adv[]; };
layout(std430, set = 0, binding = 3) readonly buffer Weight { float weight[]; };
layout(std430, set = 0, binding = 4) readonly buffer RefLogP { float ref_logp[]; };
layout(std430, set = 0, binding = 5) buffer DLogP { float dlogp[]; };
layout(std430, set = 0, binding = 6) writeonly buffer LossRows { float loss_rows[]; };
layout(std430, set = 0, binding = 7) writeonly buffer Flags { uint flags[]; };
layout(push_constant) uniform Push { uint R; float delta, lo, hi, token_budget, kl_beta; } pc;

void main() {
    for (uint r = linear_invocation_id(); r < pc.R; r += total_invocations()) {
        float w = weight[r], term = 0.0, grad = 0.0;
        uint f = 0u;
        if (w != 0.0) {
            float a = adv[r], rho = exp(logp[r] - logp_old[r]);
            float c = min(rho, pc.delta), dc = rho < pc.delta ? rho : 0.0;
            float plain = -c * a, clipped = -clamp(c, pc.lo, pc.hi) * a;
            if (rho >= pc.delta) f |= 2u;
            if (clipped > plain) f |= 1u;
            term = w * max(plain, clipped) / pc.token_budget;
            grad = (f & 1u) != 0u ? 0.0 : -w * a * dc / pc.token_budget;
            if (pc.kl_beta != 0.0) {
                float x = ref_logp[r] - logp[r], e = exp(x);
                term += w * pc.kl_beta * (e - x - 1.0) / pc.token_budget;
                grad += w * pc.kl_beta * (1.0 - e) / pc.token_budget;
            }
        }
        dlogp[r] = grad;
        loss_rows[r] = term;
        flags[r] = f;
    }
}
