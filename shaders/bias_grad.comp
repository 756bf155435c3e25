#version 450
// Bias backward: db[j] = (accumulate ? db[j] : 0) + dy[0, j] + dy[1, j] + ...
// adding rows one by one in increasing order onto the old value (exactly a
// sequential f32 loop over r: deterministic). One invocation per column j.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Dy { float dy[]; };
layout(std430, set = 0, binding = 1) buffer Db { float db[]; };
layout(push_constant) uniform Push { uint R, D, accumulate; } pc;

void main() {
    for (uint j = linear_invocation_id(); j < pc.D; j += total_invocations()) {
        float s = pc.accumulate != 0u ? db[j] : 0.0;
        for (uint r = 0u; r < pc.R; r++) s += dy[r * pc.D + j];
        db[j] = s;
    }
}
