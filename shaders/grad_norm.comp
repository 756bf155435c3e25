#version 450
// Global gradient norm and clip scale, in two deterministic levels (no atomics):
//   GRAD_SQUARES: workgroup w sums g[i]^2 over its fixed chunk of
//     WG_SIZE * ITEMS elements (invocation t takes i = chunk + t, + WG_SIZE,
//     ... in order, then a fixed shared-memory tree) into partial[first + w].
//     One dispatch per gradient buffer, each at its own `first`.
//   CLIP_SCALE: one workgroup sums partial[0 .. n) the same way and writes
//     out[0] = clip scale = max_norm > 0 ? min(1, max_norm / (norm + 1e-6)) : 1
//     (vks_ref_clip_scale) and out[1] = norm = sqrt(sum). AdamW reads out[0].
#include "common.glsl"
#include "reduce.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ITEMS = 32;

#ifdef GRAD_SQUARES
layout(std430, set = 0, binding = 0) readonly buffer G { float g[]; };
layout(std430, set = 0, binding = 1) buffer Partial { float partial[]; };
layout(push_constant) uniform Push { uint n, first; } pc;

void main() {
    uint w = linear_group_id(), t = gl_LocalInvocationID.x;
    uint chunk = WG_SIZE * ITEMS;
    if (w >= (pc.n + chunk - 1u) / chunk) return;  // uniform over the workgroup
    float s = 0.0;
    for (uint k = 0u; k < ITEMS; k++) {
        uint i = w * chunk + k * WG_SIZE + t;
        if (i < pc.n) s += g[i] * g[i];
    }
    float total = workgroup_sum(s);
    if (t == 0u) partial[pc.first + w] = total;
}
#endif

#ifdef CLIP_SCALE
layout(std430, set = 0, binding = 0) readonly buffer Partial { float partial[]; };
layout(std430, set = 0, binding = 1) buffer Out { float outv[]; };
layout(push_constant) uniform Push { uint n; float max_norm; } pc;

void main() {
    uint t = gl_LocalInvocationID.x;
    float s = 0.0;
    for (uint i = t; i < pc.n; i += WG_SIZE) s += partial[i];
    float norm = sqrt(workgroup_sum(s));
    if (t == 0u) {
        outv[0] = pc.max_norm > 0.0 ? min(1.0, pc.max_norm / (norm + 1e-6)) : 1.0;
        outv[1] = norm;
    }
}
#endif
