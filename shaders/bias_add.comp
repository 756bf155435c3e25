#version 450
// Bias broadcast over rows: x[r, j] += bias[j] for r < R, j < D (Qwen2 q/k/v).
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Bias { float bias[]; };
layout(push_constant) uniform Push { uint R, D; } pc;

void main() {
    uint count = pc.R * pc.D;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations())
        x[i] += bias[i % pc.D];
}
