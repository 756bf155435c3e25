#version 450
// Attention over the f16 KV cache (issue 28), split over keys, the query
// heads of one KV group together.
//
// SPLIT (default): one workgroup per (row r, block of GROUP query heads of
// one KV group, split sp). Split sp covers keys [sp*SPLIT_KEYS,
// (sp+1)*SPLIT_KEYS) of keys 0..pos[r]: the partition depends only on the
// row's own number of keys, never on the batch or the cache's length, so a
// row's result is the same whatever rows surround it (batch invariance) and
// whatever the verifier's cache size. Splits past the row's keys exit. The
// split writes its unnormalised output, running max and sum for each head to
// `part`; REDUCE combines a row's splits in order 0, 1, ... (a fixed order).
// A row of one split (at most SPLIT_KEYS keys) writes its output directly
// and REDUCE skips it: again a choice by the row's own length only (the host
// leaves REDUCE out when no row can have two splits).
// One decoding sequence thus gives n_kv_heads x ceil(keys / SPLIT_KEYS)
// workgroups where the f32 kernel gave n_heads.
//
// Inside a split: one subgroup (other subgroups, on drivers that run smaller
// subgroups than they report, exit); the key tile is the subgroup's lanes,
// counted. Scores: lane l owns key t0 + l and reads its K row as f16 x 4
// (one 8-byte load per 4 dims) once for the GROUP heads. Values: lanes own
// output dims in fours (d4 = lane + i * lanes), so consecutive lanes read
// consecutive 8-byte words of a V row, again once for the GROUP heads.
// Accumulation is f32 (the halves widen exactly).
//
// ROWS_SPLIT (prefill): one subgroup per (group of ROWS consecutive rows,
// block of GROUP heads, split sp), ROWS a specialization constant. When the
// group's rows share a slot, each K/V word is loaded once for the ROWS x
// GROUP (row, head) pairs; each row does exactly the arithmetic of SPLIT
// alone, in the same order (the same splits, tiles from the split's first
// key in steps of the lane count, masked at the row's own key count), so its
// bits do not depend on its group or the batch. A group whose rows span
// slots runs its rows one after another.
#ifdef ROWS_SPLIT
#extension GL_EXT_control_flow_attributes : require
#endif
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#include "common.glsl"
#include "half.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint V4_PER_LANE = 1;  // ceil(head_dim / 4 / 4): lanes >= 4
layout(constant_id = 2) const uint GROUP = 1;        // query heads per workgroup, dividing heads per KV head
layout(constant_id = 3) const uint SPLIT_KEYS = 256;
#ifdef ROWS_SPLIT
layout(constant_id = 4) const uint ROWS = 2;  // rows per subgroup
#endif

#ifdef REDUCE
layout(std430, set = 0, binding = 0) readonly buffer Part { vec4 part[]; };
layout(std430, set = 0, binding = 1) readonly buffer Pos { uint pos[]; };
layout(std430, set = 0, binding = 2) writeonly buffer Out { vec4 out4[]; };
#else
layout(std430, set = 0, binding = 0) readonly buffer Q { vec4 q4[]; };
layout(std430, set = 0, binding = 1) readonly buffer KC { uvec2 kc[]; };
layout(std430, set = 0, binding = 2) readonly buffer VC { uvec2 vc[]; };
layout(std430, set = 0, binding = 3) readonly buffer Slot { uint slot[]; };
layout(std430, set = 0, binding = 4) readonly buffer Pos { uint pos[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Part { vec4 part[]; };
layout(std430, set = 0, binding = 6) writeonly buffer Out { vec4 out4[]; };
#endif
layout(push_constant) uniform Push {
    uint R, n_heads, n_kv_heads, head_dim, seq_len, n_slots, n_splits;
    float scale;
} pc;

// part: [R, n_heads, n_splits] records of head_dim/4 + 1 vec4: the
// unnormalised output, then (max, sum, 0, 0).
uint record(uint r, uint h, uint sp) {
    return ((r * pc.n_heads + h) * pc.n_splits + sp) * (pc.head_dim / 4u + 1u);
}

uint keys_of(uint r) { return min(pos[r], pc.seq_len - 1u) + 1u; }

uint splits_of(uint r) { return min((keys_of(r) + SPLIT_KEYS - 1u) / SPLIT_KEYS, pc.n_splits); }

#ifdef REDUCE
// One invocation per (row, head, 4 dims): the row's splits in order.
void main() {
    uint hd4 = pc.head_dim / 4u, i = linear_invocation_id();
    if (i >= pc.R * pc.n_heads * hd4) return;
    uint d4 = i % hd4, rh = i / hd4, r = rh / pc.n_heads, h = rh - r * pc.n_heads;
    uint used = splits_of(r);
    if (used == 1u) return;  // written by the split itself
    float m = -1.0 / 0.0;
    for (uint sp = 0u; sp < used; sp++) m = max(m, part[record(r, h, sp) + hd4].x);
    float l = 0.0;
    vec4 o = vec4(0.0);
    for (uint sp = 0u; sp < used; sp++) {
        uint rec = record(r, h, sp);
        vec4 st = part[rec + hd4];
        float w = exp(st.x - m);
        l += st.y * w;
        o += part[rec + d4] * w;
    }
    out4[i] = o / l;
}
#elif defined(ROWS_SPLIT)
// Split sp of rows r0 .. r0 + nr - 1 (nr <= ROWS, one slot), heads h0 ..
// h0 + GROUP - 1: SPLIT's arithmetic per (row, head), the K/V loads shared.
void split_rows(uint r0, uint nr, uint h0, uint sp, uint lanes, uint lane) {
    uint kvh = h0 / (pc.n_heads / pc.n_kv_heads);
    uint hd4 = pc.head_dim / 4u, row4 = pc.n_kv_heads * hd4;
    // row rr's q at q0 + min(rr, nr - 1) * q4_row (surplus rows reread the last)
    uint q4_row = pc.n_heads * hd4, q0 = (r0 * pc.n_heads + h0) * hd4;
    uint k_begin = sp * SPLIT_KEYS, k_end[ROWS], max_end = k_begin;
    bool whole[ROWS];
    [[unroll]] for (uint rr = 0u; rr < ROWS; rr++) {
        uint r = r0 + min(rr, nr - 1u);
        k_end[rr] = rr < nr ? max(k_begin, min(keys_of(r), k_begin + SPLIT_KEYS)) : k_begin;
        whole[rr] = splits_of(r) == 1u;
        max_end = max(max_end, k_end[rr]);
    }
    if (max_end == k_begin) return;  // no row of the group reaches this split (uniform)
    // slot is GPU data the ops layer cannot check: clamp so that a bad value
    // never reads outside the cache.
    uint s = min(slot[r0], pc.n_slots - 1u);
    uint cache0 = s * pc.seq_len * row4 + kvh * hd4;
    vec4 o[ROWS * GROUP * V4_PER_LANE];
    float m_run[ROWS * GROUP], l_run[ROWS * GROUP], p[ROWS * GROUP];
    [[unroll]] for (uint i = 0u; i < ROWS * GROUP * V4_PER_LANE; i++) o[i] = vec4(0.0);
    [[unroll]] for (uint g = 0u; g < ROWS * GROUP; g++) { m_run[g] = -1.0 / 0.0; l_run[g] = 0.0; }
    for (uint t0 = k_begin; t0 < max_end; t0 += lanes) {
        uint j = t0 + lane, tile_len = min(lanes, max_end - t0);
        float sc[ROWS * GROUP];
        [[unroll]] for (uint g = 0u; g < ROWS * GROUP; g++) sc[g] = 0.0;
        if (j < max_end) {
            uint kb = cache0 + j * row4;
            for (uint d4 = 0u; d4 < hd4; d4++) {
                vec4 kv = unpack_half4(kc[kb + d4]);
                [[unroll]] for (uint rr = 0u; rr < ROWS; rr++)
                    [[unroll]] for (uint g = 0u; g < GROUP; g++) sc[rr * GROUP + g] += dot(q4[q0 + min(rr, nr - 1u) * q4_row + g * hd4 + d4], kv);
            }
        }
        [[unroll]] for (uint rr = 0u; rr < ROWS; rr++)
            [[unroll]] for (uint g = 0u; g < GROUP; g++) {
                uint x = rr * GROUP + g;
                if (t0 >= k_end[rr]) { p[x] = 0.0; continue; }  // the row's keys are done (uniform)
                float sg = j < k_end[rr] ? sc[x] * pc.scale : -1.0 / 0.0;
                float m_new = max(m_run[x], subgroupMax(sg));
                p[x] = j < k_end[rr] ? exp(sg - m_new) : 0.0;
                float corr = exp(m_run[x] - m_new);
                l_run[x] = l_run[x] * corr + subgroupAdd(p[x]);
                [[unroll]] for (uint i = 0u; i < V4_PER_LANE; i++) o[x * V4_PER_LANE + i] *= corr;
                m_run[x] = m_new;
            }
        for (uint jj = 0u; jj < tile_len; jj++) {
            uint vb = cache0 + (t0 + jj) * row4;
            float pj[ROWS * GROUP];
            [[unroll]] for (uint g = 0u; g < ROWS * GROUP; g++) pj[g] = subgroupShuffle(p[g], jj);
            [[unroll]] for (uint i = 0u; i < V4_PER_LANE; i++) {
                uint d4 = lane + i * lanes;
                if (d4 < hd4) {
                    vec4 vv = unpack_half4(vc[vb + d4]);
                    [[unroll]] for (uint rr = 0u; rr < ROWS; rr++)
                        if (t0 + jj < k_end[rr])
                            [[unroll]] for (uint g = 0u; g < GROUP; g++)
                                o[(rr * GROUP + g) * V4_PER_LANE + i] += pj[rr * GROUP + g] * vv;
                }
            }
        }
    }
    [[unroll]] for (uint rr = 0u; rr < ROWS; rr++) {
        if (rr >= nr || k_end[rr] == k_begin) continue;  // a surplus row, or one that needs fewer splits
        [[unroll]] for (uint g = 0u; g < GROUP; g++) {
            uint x = rr * GROUP + g;
            if (whole[rr]) {
                [[unroll]] for (uint i = 0u; i < V4_PER_LANE; i++) {
                    uint d4 = lane + i * lanes;
                    if (d4 < hd4) out4[q0 + rr * q4_row + g * hd4 + d4] = o[x * V4_PER_LANE + i] / l_run[x];
                }
                continue;
            }
            uint rec = record(r0 + rr, h0 + g, sp);
            [[unroll]] for (uint i = 0u; i < V4_PER_LANE; i++) {
                uint d4 = lane + i * lanes;
                if (d4 < hd4) part[rec + d4] = o[x * V4_PER_LANE + i];
            }
            if (lane == 0u) part[rec + hd4] = vec4(m_run[x], l_run[x], 0.0, 0.0);
        }
    }
}

void main() {
    uint n_blocks = pc.n_heads / GROUP, n_groups = (pc.R + ROWS - 1u) / ROWS, id = linear_group_id();
    if (id >= n_groups * n_blocks * pc.n_splits || gl_SubgroupID != 0u) return;
    uint sp = id % pc.n_splits, gb = id / pc.n_splits;
    uint rg = gb / n_blocks, h0 = (gb - rg * n_blocks) * GROUP;
    uint r0 = rg * ROWS, nr = min(ROWS, pc.R - r0), hd4 = pc.head_dim / 4u;
    uint lanes = subgroupAdd(1u), lane = gl_SubgroupInvocationID;
    if (lanes * V4_PER_LANE < hd4) {  // fewer lanes than the host planned for: loud, never partial
        vec4 nan4 = vec4(uintBitsToFloat(0x7fc00000u));
        for (uint rr = 0u; rr < nr; rr++) {
            uint r = r0 + rr;
            if (sp * SPLIT_KEYS >= keys_of(r)) continue;
            bool whole = splits_of(r) == 1u;
            [[unroll]] for (uint g = 0u; g < GROUP; g++) {
                uint rec = record(r, h0 + g, sp);
                for (uint d4 = lane; d4 <= hd4; d4 += lanes) {
                    part[rec + d4] = nan4;
                    if (whole && d4 < hd4) out4[(r * pc.n_heads + h0 + g) * hd4 + d4] = nan4;
                }
            }
        }
        return;
    }
    bool same = true;  // one slot (as clamped) for the whole group: shared loads
    uint s0 = min(slot[r0], pc.n_slots - 1u);
    for (uint rr = 1u; rr < nr; rr++) same = same && min(slot[r0 + rr], pc.n_slots - 1u) == s0;
    if (same) split_rows(r0, nr, h0, sp, lanes, lane);
    else
        for (uint rr = 0u; rr < nr; rr++) split_rows(r0 + rr, 1u, h0, sp, lanes, lane);
}
#else
void main() {
    uint n_blocks = pc.n_heads / GROUP, id = linear_group_id();
    if (id >= pc.R * n_blocks * pc.n_splits || gl_SubgroupID != 0u) return;
    uint sp = id % pc.n_splits, rb = id / pc.n_splits;
    uint r = rb / n_blocks, h0 = (rb - r * n_blocks) * GROUP;
    uint kvh = h0 / (pc.n_heads / pc.n_kv_heads);
    uint hd4 = pc.head_dim / 4u, row4 = pc.n_kv_heads * hd4;  // 4-half words of a head, of a cache row
    uint n_keys = keys_of(r), k_begin = sp * SPLIT_KEYS;
    if (k_begin >= n_keys) return;  // the row needs fewer splits (uniform)
    uint k_end = min(n_keys, k_begin + SPLIT_KEYS);
    // slot is GPU data the ops layer cannot check: clamp so that a bad value
    // never reads outside the cache.
    uint s = min(slot[r], pc.n_slots - 1u);
    uint cache0 = s * pc.seq_len * row4 + kvh * hd4;
    uint q0 = (r * pc.n_heads + h0) * hd4;
    uint lanes = subgroupAdd(1u), lane = gl_SubgroupInvocationID;

    bool whole = splits_of(r) == 1u;  // the row's only split: write the output itself
    if (lanes * V4_PER_LANE < hd4) {  // fewer lanes than the host planned for: loud, never partial
        vec4 nan4 = vec4(uintBitsToFloat(0x7fc00000u));
        for (uint g = 0u; g < GROUP; g++) {
            uint rec = record(r, h0 + g, sp);
            for (uint d4 = lane; d4 <= hd4; d4 += lanes) {
                part[rec + d4] = nan4;
                if (whole && d4 < hd4) out4[q0 + g * hd4 + d4] = nan4;
            }
        }
        return;
    }
    vec4 o[GROUP * V4_PER_LANE];
    float m_run[GROUP], l_run[GROUP], p[GROUP];
    for (uint i = 0u; i < GROUP * V4_PER_LANE; i++) o[i] = vec4(0.0);
    for (uint g = 0u; g < GROUP; g++) { m_run[g] = -1.0 / 0.0; l_run[g] = 0.0; }
    for (uint t0 = k_begin; t0 < k_end; t0 += lanes) {
        uint j = t0 + lane, tile_len = min(lanes, k_end - t0);
        float sc[GROUP];
        for (uint g = 0u; g < GROUP; g++) sc[g] = 0.0;
        if (j < k_end) {
            uint kb = cache0 + j * row4;
            for (uint d4 = 0u; d4 < hd4; d4++) {
                vec4 kv = unpack_half4(kc[kb + d4]);
                for (uint g = 0u; g < GROUP; g++) sc[g] += dot(q4[q0 + g * hd4 + d4], kv);
            }
        }
        for (uint g = 0u; g < GROUP; g++) {
            float sg = j < k_end ? sc[g] * pc.scale : -1.0 / 0.0;
            float m_new = max(m_run[g], subgroupMax(sg));
            p[g] = j < k_end ? exp(sg - m_new) : 0.0;
            float corr = exp(m_run[g] - m_new);
            l_run[g] = l_run[g] * corr + subgroupAdd(p[g]);
            for (uint i = 0u; i < V4_PER_LANE; i++) o[g * V4_PER_LANE + i] *= corr;
            m_run[g] = m_new;
        }
        for (uint jj = 0u; jj < tile_len; jj++) {
            uint vb = cache0 + (t0 + jj) * row4;
            float pj[GROUP];
            for (uint g = 0u; g < GROUP; g++) pj[g] = subgroupShuffle(p[g], jj);
            for (uint i = 0u; i < V4_PER_LANE; i++) {
                uint d4 = lane + i * lanes;
                if (d4 < hd4) {
                    vec4 vv = unpack_half4(vc[vb + d4]);
                    for (uint g = 0u; g < GROUP; g++) o[g * V4_PER_LANE + i] += pj[g] * vv;
                }
            }
        }
    }
    if (whole) {
        for (uint g = 0u; g < GROUP; g++)
            for (uint i = 0u; i < V4_PER_LANE; i++) {
                uint d4 = lane + i * lanes;
                if (d4 < hd4) out4[q0 + g * hd4 + d4] = o[g * V4_PER_LANE + i] / l_run[g];
            }
        return;
    }
    for (uint g = 0u; g < GROUP; g++) {
        uint rec = record(r, h0 + g, sp);
        for (uint i = 0u; i < V4_PER_LANE; i++) {
            uint d4 = lane + i * lanes;
            if (d4 < hd4) part[rec + d4] = o[g * V4_PER_LANE + i];
        }
        if (lane == 0u) part[rec + hd4] = vec4(m_run[g], l_run[g], 0.0, 0.0);
    }
}
#endif
