#version 450
// RMSNorm backward, three kernels (variants by define), with s_r = 1/rms(x[r, :])
// and g = dout * w:
//   RMSNORM_BWD_ROWS: one workgroup per row r:
//       dx[r, d] (+)= s_r g_d - s_r^3 x[r, d] (g . x[r, :]) / D, and s_r -> inv[r].
//   RMSNORM_BWD_DW_PARTIAL: one invocation per (row block b, column d):
//       part[b, d] = sum over the block's rows, in order, of dout[r, d] x[r, d] s_r.
//   RMSNORM_BWD_DW_SUM: one invocation per column: dw[d] += sum_b part[b, d], b in order.
// Fixed summation orders, no atomics: the result is bit-identical run to run.
#include "common.glsl"
layout(local_size_x_id = 0) in;

#ifdef RMSNORM_BWD_ROWS
#include "reduce.glsl"
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { float w[]; };
layout(std430, set = 0, binding = 2) readonly buffer DOut { float dout[]; };
layout(std430, set = 0, binding = 3) buffer DX { float dx[]; };
layout(std430, set = 0, binding = 4) buffer Inv { float inv[]; };
// flags: 1 = write dx, 2 = accumulate into dx, 4 = write inv
layout(push_constant) uniform Push { uint R, D; float eps; uint flags; } pc;

void main() {
    uint r = linear_group_id();
    if (r >= pc.R) return;  // uniform over the workgroup
    uint t = gl_LocalInvocationID.x, base = r * pc.D;
    float ss = 0.0, gx = 0.0;
    for (uint d = t; d < pc.D; d += WG_SIZE) {
        float xv = x[base + d];
        ss += xv * xv;
        gx += dout[base + d] * w[d] * xv;
    }
    float s = inversesqrt(workgroup_sum(ss) / float(pc.D) + pc.eps);
    float g_dot_x = workgroup_sum(gx);
    if (t == 0u && (pc.flags & 4u) != 0u) inv[r] = s;
    if ((pc.flags & 1u) == 0u) return;
    float coef = s * s * s * g_dot_x / float(pc.D);
    bool acc = (pc.flags & 2u) != 0u;
    for (uint d = t; d < pc.D; d += WG_SIZE) {
        float v = s * dout[base + d] * w[d] - coef * x[base + d];
        dx[base + d] = acc ? dx[base + d] + v : v;
    }
}
#endif

#ifdef RMSNORM_BWD_DW_PARTIAL
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer DOut { float dout[]; };
// inv[0, R), then the partial sums part[b * D + d] from word R on
layout(std430, set = 0, binding = 2) buffer Scratch { float scratch[]; };
layout(push_constant) uniform Push { uint R, D, rows_per_block; } pc;

void main() {
    uint blocks = (pc.R + pc.rows_per_block - 1u) / pc.rows_per_block;
    uint id = linear_invocation_id();
    if (id >= blocks * pc.D) return;
    uint b = id / pc.D, d = id - b * pc.D;
    uint r0 = b * pc.rows_per_block, r1 = min(r0 + pc.rows_per_block, pc.R);
    float acc = 0.0;
    for (uint r = r0; r < r1; r++) acc += dout[r * pc.D + d] * x[r * pc.D + d] * scratch[r];
    scratch[pc.R + id] = acc;
}
#endif

#ifdef RMSNORM_BWD_DW_SUM
layout(std430, set = 0, binding = 0) readonly buffer Scratch { float scratch[]; };
layout(std430, set = 0, binding = 1) buffer DW { float dw[]; };
layout(push_constant) uniform Push { uint R, D, rows_per_block; } pc;

void main() {
    uint d = linear_invocation_id();
    if (d >= pc.D) return;
    uint blocks = (pc.R + pc.rows_per_block - 1u) / pc.rows_per_block;
    float acc = 0.0;
    for (uint b = 0u; b < blocks; b++) acc += scratch[pc.R + b * pc.D + d];
    dw[d] += acc;
}
#endif
