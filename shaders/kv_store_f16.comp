#version 450
// The f16 KV cache's store (issue 28): as kv_store.comp, each value rounded
// to half (nearest even, half.glsl) and two halves packed per word, low half
// first: kcache word (slot[r]*seq_len + pos[r])*kv_dim/2 + j holds k[r, 2j]
// and k[r, 2j+1]. One invocation per pair (kv_dim is even: whole heads of an
// even head_dim), so no two invocations write one word and no 16-bit storage
// feature is needed. Rows whose slot/pos fall outside the cache are skipped.
#include "common.glsl"
#include "half.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer K { vec2 k[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { vec2 v[]; };
layout(std430, set = 0, binding = 2) writeonly buffer KC { uint kcache[]; };
layout(std430, set = 0, binding = 3) writeonly buffer VC { uint vcache[]; };
layout(std430, set = 0, binding = 4) readonly buffer Slot { uint slot[]; };
layout(std430, set = 0, binding = 5) readonly buffer Pos { uint pos[]; };
layout(push_constant) uniform Push { uint R, kv_dim, seq_len, n_slots; } pc;

uint pack_pair(vec2 x) { return f32_to_f16_bits(x.x) | (f32_to_f16_bits(x.y) << 16); }

void main() {
    uint pairs = pc.kv_dim / 2u, count = pc.R * pairs;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint r = i / pairs, j = i - r * pairs;
        uint s = slot[r], p = pos[r];
        if (s >= pc.n_slots || p >= pc.seq_len) continue;
        uint dst = (s * pc.seq_len + p) * pairs + j;
        kcache[dst] = pack_pair(k[i]);
        vcache[dst] = pack_pair(v[i]);
    }
}
