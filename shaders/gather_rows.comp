#version 450
// dst[i, :] = src[idx[i], :], D floats per row; one invocation per element.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer Src { float src[]; };
layout(std430, set = 0, binding = 1) readonly buffer Idx { uint idx[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Dst { float dst[]; };
// src_rows: rows in src; an out-of-range index yields a zero row, never a stray read.
layout(push_constant) uniform Push { uint n, D, src_rows; } pc;

void main() {
    uint count = pc.n * pc.D;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint row = i / pc.D, d = i - row * pc.D;
        uint s = idx[row];
        dst[i] = s < pc.src_rows ? src[s * pc.D + d] : 0.0;
    }
}
