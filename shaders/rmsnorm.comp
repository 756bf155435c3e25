#version 450
// RMSNorm: one workgroup per row; out may alias x (each element is read
// before the barrier that precedes its write).
#include "common.glsl"
#include "reduce.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) buffer Out { float outv[]; };
layout(push_constant) uniform Push { uint R, D; float eps; } pc;

void main() {
    uint r = linear_group_id();
    if (r >= pc.R) return;  // uniform over the workgroup
    uint t = gl_LocalInvocationID.x, base = r * pc.D;
    float ss = 0.0;
    for (uint d = t; d < pc.D; d += WG_SIZE) ss += x[base + d] * x[base + d];
    float total = workgroup_sum(ss);
    float scale = inversesqrt(total / float(pc.D) + pc.eps);
    for (uint d = t; d < pc.D; d += WG_SIZE) outv[base + d] = x[base + d] * scale * w[d];
}
