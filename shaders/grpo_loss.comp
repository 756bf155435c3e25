#version 450
// The RL loss on the log-probability of each row's target, one invocation
// per row (grid-stride): vks_ref_grpo_loss in f32, whose comment defines each
// type. x = logp - logp_old, rho = exp(x), A the advantage, w the weight:
//   type 0 intellect2: c = min(rho, delta); P = max(-c A, -clamp(c, lo, hi) A);
//                      dP = 0 where the clipped term is strictly larger (flag 1),
//                      else -A (rho < delta ? rho : 0); flag 2: rho >= delta
//   type 4 dapo:       the same without the cap
//   type 5 gspo:       dapo's with rho = exp(seq_x[r]), the row's sequence's mean log-ratio
//                      (the host's: vks_ref_sequence_log_ratio), dP = -A rho where not clipped
//   type 3 cispo:      c = clamp(rho, lo, hi); P = -c A logp, dP = -c A; flag 1: c != rho
//   type 6 decoupled_ppo: b = rho (logp_old the behaviour policy's; the proximal
//                      policy is logp itself, so pi / pi_prox = 1, inside PPO's clip);
//                      c = b where b <= hi (behav_cap), else lo (0: masked, or the cap:
//                      truncated), flag 1; P = -c A, dP = -c A
//   type 1 dppo_kl, 2 ipo: dp = exp(logp) - exp(logp_old), masked (flag 1) when
//                      dp > hi or dp < -lo (dppo_kl: the first for A > 0, the second
//                      else); P = -[!masked] adv_tau A rho + kl_tau x^2,
//                      dP = -[!masked] adv_tau A rho + 2 kl_tau x
//   loss_r = w P / token_budget, dlogp[r] = w dP / token_budget
// lo, hi: the ratio's bounds (intellect2, dapo, cispo), the probability
// masks (dppo_kl, ipo) or decoupled_ppo's over-cap coefficient and cap, set by the op. With kl_beta != 0, the k3 KL penalty to
// a reference model, y = ref_logp - logp:
//   loss_r += w kl_beta (exp(y) - y - 1) / token_budget, dlogp += w kl_beta (1 - exp(y)) / token_budget
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
layout(std430, set = 0, binding = 8) readonly buffer SeqX { float seq_x[]; };
layout(push_constant) uniform Push {
    uint R, type;
    float delta, lo, hi, token_budget, kl_beta, adv_tau, kl_tau;
} pc;

const uint INTELLECT2 = 0u, DPPO_KL = 1u, IPO = 2u, CISPO = 3u, DAPO = 4u, GSPO = 5u, DECOUPLED_PPO = 6u;

void main() {
    for (uint r = linear_invocation_id(); r < pc.R; r += total_invocations()) {
        float w = weight[r], term = 0.0, grad = 0.0;
        uint f = 0u;
        if (w != 0.0) {
            float a = adv[r], x = logp[r] - logp_old[r], rho = exp(pc.type == GSPO ? seq_x[r] : x);
            if (pc.type == INTELLECT2 || pc.type == DAPO || pc.type == GSPO) {
                bool capped = pc.type == INTELLECT2 && rho >= pc.delta;
                float c = capped ? pc.delta : rho, dc = capped ? 0.0 : rho;
                float plain = -c * a, clipped = -clamp(c, pc.lo, pc.hi) * a;
                if (capped) f |= 2u;
                if (clipped > plain) f |= 1u;
                term = w * max(plain, clipped) / pc.token_budget;
                grad = (f & 1u) != 0u ? 0.0 : -w * a * dc / pc.token_budget;
            } else if (pc.type == DECOUPLED_PPO) {
                bool over = rho > pc.hi;
                float c = over ? pc.lo : rho;
                if (over) f |= 1u;
                term = w * (-c * a) / pc.token_budget;
                grad = term;
            } else if (pc.type == CISPO) {
                float c = clamp(rho, pc.lo, pc.hi);
                if (c != rho) f |= 1u;
                term = w * (-c * a * logp[r]) / pc.token_budget;
                grad = w * (-c * a) / pc.token_budget;
            } else {
                float dp = exp(logp[r]) - exp(logp_old[r]);
                bool high = dp > pc.hi, low = dp < -pc.lo;
                bool masked = pc.type == IPO ? high || low : (a > 0.0 ? high : low);
                float pg = masked ? 0.0 : -pc.adv_tau * a * rho;
                if (masked) f |= 1u;
                term = w * (pg + pc.kl_tau * x * x) / pc.token_budget;
                grad = w * (pg + 2.0 * pc.kl_tau * x) / pc.token_budget;
            }
            if (pc.kl_beta != 0.0) {
                float y = ref_logp[r] - logp[r], e = exp(y);
                term += w * pc.kl_beta * (e - y - 1.0) / pc.token_budget;
                grad += w * pc.kl_beta * (1.0 - e) / pc.token_budget;
            }
        }
        dlogp[r] = grad;
        loss_rows[r] = term;
        flags[r] = f;
    }
}
