#version 450
// kcache[(slot[r]*seq_len + pos[r])*kv_dim + j] = k[r*kv_dim + j]; same for v.
// One invocation per (r, j). Rows whose slot/pos fall outside the cache
// (n_slots given by the ops layer) are skipped.
#include "common.glsl"
layout(local_size_x_id = 0) in;

layout(std430, set = 0, binding = 0) readonly buffer K { float k[]; };
layout(std430, set = 0, binding = 1) readonly buffer V { float v[]; };
layout(std430, set = 0, binding = 2) writeonly buffer KC { float kcache[]; };
layout(std430, set = 0, binding = 3) writeonly buffer VC { float vcache[]; };
layout(std430, set = 0, binding = 4) readonly buffer Slot { uint slot[]; };
layout(std430, set = 0, binding = 5) readonly buffer Pos { uint pos[]; };
layout(push_constant) uniform Push { uint R, kv_dim, seq_len, n_slots; } pc;

void main() {
    uint count = pc.R * pc.kv_dim;
    for (uint i = linear_invocation_id(); i < count; i += total_invocations()) {
        uint r = i / pc.kv_dim, j = i - r * pc.kv_dim;
        uint s = slot[r], p = pos[r];
        if (s >= pc.n_slots || p >= pc.seq_len) continue;
        uint dst = (s * pc.seq_len + p) * pc.kv_dim + j;
        kcache[dst] = k[i];
        vcache[dst] = v[i];
    }
}
