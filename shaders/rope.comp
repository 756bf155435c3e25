#version 450
// Rotary position embedding, in place. One invocation per (row, head, pair).
// Pair i rotates by angle pos * freq[i]; the host computes cos and sin of
// every (position, pair) in double from vks_rope_freqs (the formula is written
// once, and no f32 sin/cos of a large angle loses accuracy here):
//   mode 0 (adjacent): elements (2i, 2i+1)   (llama2.c / GGUF)
//   mode 1 (half):     elements (i, i + head_dim/2)   (Hugging Face)
// ROPE_BACKWARD (kernel rope_backward): the inverse rotation (angle negated),
// which turns the gradient of the output into the gradient of the input.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer Pos { uint pos[]; };
layout(std430, set = 0, binding = 2) readonly buffer Table { vec2 cos_sin[]; }; // [n_pos, head_dim/2]
layout(push_constant) uniform Push {
    uint R, stride, col0, n_heads, head_dim, mode, n_pos;
} pc;

void main() {
    uint half_dim = pc.head_dim / 2u;
    uint pairs_per_row = pc.n_heads * half_dim;
    uint count = pc.R * pairs_per_row;
    for (uint id = linear_invocation_id(); id < count; id += total_invocations()) {
        uint r = id / pairs_per_row, rem = id - r * pairs_per_row;
        uint h = rem / half_dim, i = rem - h * half_dim;
        vec2 cs = cos_sin[min(pos[r], pc.n_pos - 1u) * half_dim + i]; // positions past the table: the op's caller guarantees none
        float c = cs.x, s = cs.y;
#ifdef ROPE_BACKWARD
        s = -s;
#endif
        uint base = r * pc.stride + pc.col0 + h * pc.head_dim;
        uint i0 = pc.mode == 0u ? base + 2u * i : base + i;
        uint i1 = pc.mode == 0u ? i0 + 1u : i0 + half_dim;
        float x0 = x[i0], x1 = x[i1];
        x[i0] = x0 * c - x1 * s;
        x[i1] = x0 * s + x1 * c;
    }
}
