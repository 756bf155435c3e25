#version 450
// SwiGLU backward, one invocation per element (grid-stride), for
// out = silu(g) * u with silu(a) = a * sigmoid(a):
//   dg (+)= dout * u * sigmoid(g) * (1 + g * (1 - sigmoid(g)))
//   du (+)= dout * silu(g)
// Every element is read before it is written, so in overwrite mode dg may be
// the memory of g (or dout) and du that of u.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer G { float g[]; };
layout(std430, set = 0, binding = 1) readonly buffer U { float u[]; };
layout(std430, set = 0, binding = 2) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 3) buffer DG { float dg[]; };
layout(std430, set = 0, binding = 4) buffer DU { float du[]; };
layout(push_constant) uniform Push { uint n, accumulate; } pc;

void main() {
    for (uint i = linear_invocation_id(); i < pc.n; i += total_invocations()) {
        float a = g[i], b = u[i], d = dout[i];
        float s = 1.0 / (1.0 + exp(-a));
        float vg = d * b * s * (1.0 + a * (1.0 - s)), vu = d * a * s;
        if (pc.accumulate != 0u) {
            vg += dg[i];
            vu += du[i];
        }
        dg[i] = vg;
        du[i] = vu;
    }
}
