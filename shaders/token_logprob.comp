#version 450
// Log-probability of chosen tokens, one workgroup per row of logits [R, V]:
//   TOKEN_LOGPROB_FORWARD:  logp[r] = logits[r, target[r]] - logsumexp(logits[r, :])
//   TOKEN_LOGPROB_BACKWARD: dlogits[r, :] (+)= dlogp[r] (onehot(target[r]) - softmax(logits[r, :]))
//   TOKEN_ENTROPY:          entropy[r] = H_r = -sum_j p_j log p_j, p = softmax(logits[r, :])
//   TOKEN_LOGPROB_BACKWARD + TOKEN_ENTROPY (the entropy bonus): the backward
//     plus the gradient of dentropy[r] * H_r, dH_r/dlogits[r, j] = -p_j (log p_j + H_r):
//     dlogits[r, j] (+)= dlogp[r] (onehot - p_j) - dentropy[r] p_j (log p_j + H_r),
//     and entropy[r] = H_r; a row with dentropy 0 gets exactly the plain backward's values.
// target is int32: a row with target < 0 has no target (the last row of a
// sequence, a masked row): logp 0, entropy 0 and no gradient (overwrite mode
// writes 0). A target >= V is an error made loud: logp NaN, entropy NaN and a
// NaN gradient row.
// The log-sum-exp is one pass of per-invocation running (max, sum) pairs,
// merged by a fixed tree: bit-identical run to run. The entropy is a second
// pass, sum_j p_j log p_j = -H, summed by a fixed tree too. In the
// backward each element is read and written by the same invocation after
// every read of the row, so dlogits may be the memory of logits (overwrite mode).
#include "common.glsl"
layout(local_size_x_id = 0) in;

const float NEG_INF = -1.0 / 0.0;

layout(std430, set = 0, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, set = 0, binding = 1) readonly buffer Target { int target[]; };
#if defined(TOKEN_LOGPROB_FORWARD)
layout(std430, set = 0, binding = 2) writeonly buffer LogP { float logp[]; };
#elif defined(TOKEN_LOGPROB_BACKWARD)
layout(std430, set = 0, binding = 2) readonly buffer DLogP { float dlogp[]; };
layout(std430, set = 0, binding = 3) buffer DLogits { float dlogits[]; };
#ifdef TOKEN_ENTROPY
layout(std430, set = 0, binding = 4) readonly buffer DEntropy { float dentropy[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Entropy { float entropy[]; };
#endif
#else  // TOKEN_ENTROPY alone
layout(std430, set = 0, binding = 2) writeonly buffer Entropy { float entropy[]; };
#endif
layout(push_constant) uniform Push { uint R, V, accumulate; } pc;

shared float red_m[WG_SIZE], red_s[WG_SIZE];

// (m, s) <- the pair for the union: max and sum of exp(x - max).
void merge(inout float m, inout float s, float m2, float s2) {
    if (m2 == NEG_INF) return;
    if (m == NEG_INF) { m = m2; s = s2; return; }
    float mx = max(m, m2);
    s = s * exp(m - mx) + s2 * exp(m2 - mx);
    m = mx;
}

// log(sum_j exp(logits[base + j])) over the row, every invocation gets it.
float row_logsumexp(uint base) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    float m = NEG_INF, s = 0.0;
    for (uint j = t; j < pc.V; j += WG_SIZE) merge(m, s, logits[base + j], 1.0);
    red_m[t] = m;
    red_s[t] = s;
    barrier();
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u; len = half_n, half_n = (half_n + 1u) / 2u) {
        if (t < len - half_n) {
            float a = red_m[t], b = red_s[t];
            merge(a, b, red_m[t + half_n], red_s[t + half_n]);
            red_m[t] = a;
            red_s[t] = b;
        }
        barrier();
    }
    return red_m[0] + log(red_s[0]);
}

#ifdef TOKEN_ENTROPY
// Right after row_logsumexp: H = -sum_j p_j log p_j over the row, every
// invocation gets it. log p_j is taken as (logits_j - m) - log(s) from the
// reduction's max m and shifted sum s, not as logits_j - lse: lse = m + log(s)
// rounds to the ulp of m, an absolute error that would dominate a small H
// (a peaked row). m and ls = log(s) are returned for the gradient.
float row_entropy(uint base, out float m, out float ls) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    m = red_m[0];
    ls = log(red_s[0]);
    float s = 0.0;
    for (uint j = t; j < pc.V; j += WG_SIZE) {
        float lp = (logits[base + j] - m) - ls;
        s += exp(lp) * lp;
    }
    barrier();  // every invocation has read red_m[0] and red_s[0]
    red_s[t] = s;
    barrier();
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u; len = half_n, half_n = (half_n + 1u) / 2u) {
        if (t < len - half_n) red_s[t] += red_s[t + half_n];
        barrier();
    }
    return -red_s[0];
}
#endif

void main() {
    uint r = linear_group_id();
    if (r >= pc.R) return;  // uniform over the workgroup
    int tgt = target[r];
    uint t = gl_LocalInvocationID.x, base = r * pc.V;
    const float nan = uintBitsToFloat(0x7fc00000u);
#ifdef TOKEN_LOGPROB_FORWARD
    if (tgt < 0 || uint(tgt) >= pc.V) {  // uniform: one target per workgroup
        if (t == 0u) logp[r] = tgt < 0 ? 0.0 : nan;
        return;
    }
    float lse = row_logsumexp(base);
    if (t == 0u) logp[r] = logits[base + uint(tgt)] - lse;
#elif defined(TOKEN_LOGPROB_BACKWARD)
    if (tgt < 0) {
        if (pc.accumulate == 0u)
            for (uint j = t; j < pc.V; j += WG_SIZE) dlogits[base + j] = 0.0;
#ifdef TOKEN_ENTROPY
        if (t == 0u) entropy[r] = 0.0;
#endif
        return;
    }
    if (uint(tgt) >= pc.V) {
        for (uint j = t; j < pc.V; j += WG_SIZE) dlogits[base + j] = nan;
#ifdef TOKEN_ENTROPY
        if (t == 0u) entropy[r] = nan;
#endif
        return;
    }
    float lse = row_logsumexp(base), g = dlogp[r];
#ifdef TOKEN_ENTROPY
    float m, ls, h = row_entropy(base, m, ls), de = dentropy[r];
    if (t == 0u) entropy[r] = h;
    if (de != 0.0) {  // uniform: one row per workgroup
        for (uint j = t; j < pc.V; j += WG_SIZE) {
            float lp = (logits[base + j] - m) - ls, p = exp(lp);
            float v = (j == uint(tgt) ? g : 0.0) - g * p - de * p * (lp + h);
            dlogits[base + j] = pc.accumulate != 0u ? dlogits[base + j] + v : v;
        }
        return;
    }
#endif
    for (uint j = t; j < pc.V; j += WG_SIZE) {
        float v = (j == uint(tgt) ? g : 0.0) - g * exp(logits[base + j] - lse);
        dlogits[base + j] = pc.accumulate != 0u ? dlogits[base + j] + v : v;
    }
#else  // TOKEN_ENTROPY alone
    if (tgt < 0 || uint(tgt) >= pc.V) {  // uniform: one target per workgroup
        if (t == 0u) entropy[r] = tgt < 0 ? 0.0 : nan;
        return;
    }
    row_logsumexp(base);
    float m, ls, h = row_entropy(base, m, ls);
    if (t == 0u) entropy[r] = h;
#endif
}
