#version 450
// One AdamW step, elementwise (vks_ref_adamw_step's formula and order):
//   g = scale * grad[i]               scale read from the device (clipping)
//   m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
//   p -= lr * (m / c1 / (sqrt(v / c2) + eps) + weight_decay * p)
// with c1 = 1 - beta1^t, c2 = 1 - beta2^t computed on the host in double
// (as are 1 - beta1 and 1 - beta2), decay on the pre-step p.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer P { float p[]; };
layout(std430, set = 0, binding = 1) readonly buffer G { float grad[]; };
layout(std430, set = 0, binding = 2) buffer M { float m[]; };
layout(std430, set = 0, binding = 3) buffer V { float v[]; };
layout(std430, set = 0, binding = 4) readonly buffer Scale { float scale[]; };
layout(push_constant) uniform Push {
    uint n;
    float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, c1, c2;
} pc;

void main() {
    float s = scale[0];
    for (uint i = linear_invocation_id(); i < pc.n; i += total_invocations()) {
        float g = s * grad[i];
        float mi = pc.beta1 * m[i] + pc.one_minus_beta1 * g;
        float vi = pc.beta2 * v[i] + pc.one_minus_beta2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float m_hat = mi / pc.c1, v_hat = vi / pc.c2;
        float pi = p[i];
        p[i] = pi - pc.lr * (m_hat / (sqrt(v_hat) + pc.eps) + pc.weight_decay * pi);
    }
}
