#version 450
// kcache[(slot[r]*seq_len + pos[r])*kv_dim + j] = k[r*kv_dim + j]; same for v.
// One invocation per (r, j). Rows whose slot/pos fall outside the cache
// (n_slots given by the ops layer) are skipped.
// KV_STORE_ROPE (kernel rope_kv_store, the decode/prefill forward): RoPE fused
// with the store, one invocation per (row, head, pair) of q and of k: q is
// rotated in place and k rotated on its way into the cache (k itself is left
// as it was), with rope.comp's arithmetic (the same bits).
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) writeonly buffer KC { float kcache[]; };
layout(std430, set = 0, binding = 3) writeonly buffer VC { float vcache[]; };
layout(std430, set = 0, binding = 4) readonly buffer Slot { uint slot[]; };
layout(std430, set = 0, binding = 5) readonly buffer Pos { uint pos[]; };

// The one place a cache element is written.
void store(uint dst, float key, float value) {
    kcache[dst] = key;
    vcache[dst] = value;
}

#ifndef KV_STORE_ROPE
layout(push_constant) uniform Push { uint R, kv_dim, seq_len, n_slots; } pc;

void main() {
    uint count = pc.R * pc.kv_dim;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint r = i / pc.kv_dim, j = i - r * pc.kv_dim;
        uint s = slot[r], p = pos[r];
        if (s >= pc.n_slots || p >= pc.seq_len) continue;
        store((s * pc.seq_len + p) * pc.kv_dim + j, k[i], v[i]);
    }
}
#else
layout(std430, set = 0, binding = 6) readonly buffer Table { vec2 cos_sin[]; }; // [n_pos, head_dim/2]
layout(std430, set = 0, binding = 7) buffer Q { float q[]; };
layout(push_constant) uniform Push { uint R, kv_dim, seq_len, n_slots, q_dim, head_dim, mode, n_pos; } pc;

void main() {
    uint half_dim = pc.head_dim / 2u, q_pairs = pc.q_dim / 2u, per_row = q_pairs + pc.kv_dim / 2u;
    uint count = pc.R * per_row;
    for (uint id = linear_invocation_id(); id < count; id += total_invocations()) {
        uint r = id / per_row, rem = id - r * per_row;
        bool is_q = rem < q_pairs;
        uint pair = is_q ? rem : rem - q_pairs;
        uint h = pair / half_dim, i = pair - h * half_dim, p = pos[r];
        vec2 cs = cos_sin[min(p, pc.n_pos - 1u) * half_dim + i]; // positions past the table: the op's caller guarantees none
        float c = cs.x, s = cs.y;
        uint o0 = h * pc.head_dim + (pc.mode == 0u ? 2u * i : i);
        uint o1 = pc.mode == 0u ? o0 + 1u : o0 + half_dim;
        if (is_q) {
            uint b = r * pc.q_dim;
            float x0 = q[b + o0], x1 = q[b + o1];
            q[b + o0] = x0 * c - x1 * s;
            q[b + o1] = x0 * s + x1 * c;
            continue;
        }
        uint sl = slot[r];
        if (sl >= pc.n_slots || p >= pc.seq_len) continue;
        uint b = r * pc.kv_dim, dst = (sl * pc.seq_len + p) * pc.kv_dim;
        float x0 = k[b + o0], x1 = k[b + o1];
        store(dst + o0, x0 * c - x1 * s, v[b + o0]);
        store(dst + o1, x0 * s + x1 * c, v[b + o1]);
    }
}
#endif
