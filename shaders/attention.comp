#version 450
// Causal GQA attention over the KV cache [n_slots, seq_len, kv_dim], used by
// prefill and decode alike. One workgroup per (row r, head h); row r attends
// to keys 0..pos[r] of slot[r]. Keys are visited in tiles of local_size_x
// (one key per invocation for the scores) with an online softmax, so any
// seq_len fits in a few KiB of shared memory. head_dim <= MAX_HEAD_DIM.
//
// USE_SUBGROUP (CPU drivers): the same online softmax without a barrier. One
// subgroup per (row, head) (a workgroup's other subgroups, on drivers that run
// smaller subgroups than they report, do nothing); the tile is the subgroup's
// lanes, counted; subgroupMax/subgroupAdd reduce, subgroupShuffle hands each
// key's weight to the lanes that own the output dims (d = lane + i * lanes,
// i < DIMS_PER_LANE, a specialization constant: ceil(head_dim / 4)). On
// lavapipe a shader with barriers runs as coroutines: the shared-memory
// reductions cost ~50 barriers per head while decoding.
//
// ROWS_SG (prefill on CPU drivers, with USE_SUBGROUP): one subgroup per
// (group of ROWS consecutive rows, head), ROWS a specialization constant.
// When the group's rows share a slot, each K and V element is loaded once
// for all of them; each row keeps its own online softmax and does exactly
// the arithmetic of USE_SUBGROUP alone, in the same order (key tiles from 0
// in steps of the lane count, masked at the row's own key count), so a row's
// bits do not depend on its group or the batch. A group whose rows span
// slots runs its rows one after another.
//
// ROWS_TILE (prefill on GPUs, without USE_SUBGROUP): the tile kernel with one
// workgroup per (group of ROWS consecutive rows, head). Invocation t computes
// key t0 + t's score for every row of the group from one read of the key, and
// each V element it reads feeds every row's output dims: the group loads each
// K/V tile once. Each row keeps its own online softmax with the one-row
// kernel's arithmetic and order (tiles of WG_SIZE keys from key 0, its own
// workgroup_max/workgroup_sum over the tile, V summed in key order, masked at
// its own key count; a row whose keys are done skips the tile), so its bits
// equal `attention`'s whatever the group or batch. A group whose rows span
// slots runs each run of consecutive rows of one slot in turn. Shared memory:
// ROWS * (MAX_HEAD_DIM + WG_SIZE) + WG_SIZE floats (ROWS 4, 64 lanes: 5 KiB).
#if defined(ROWS_SG) || defined(ROWS_TILE)
#extension GL_EXT_control_flow_attributes : require
#endif
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#endif
#include "common.glsl"
#ifndef USE_SUBGROUP
#include "reduce.glsl"
#endif
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint DIMS_PER_LANE = 1;  // USE_SUBGROUP only
#if defined(ROWS_SG) || defined(ROWS_TILE)
layout(constant_id = 2) const uint ROWS = 2;  // rows per subgroup (ROWS_SG) / workgroup (ROWS_TILE)
#endif

const uint MAX_HEAD_DIM = 256u;
// Output elements owned per invocation (d = t, t + WG, ...).
const uint DIMS_PER_THREAD = (MAX_HEAD_DIM + WG_SIZE - 1u) / WG_SIZE;

layout(std430, set = 0, binding = 0) readonly buffer Q { float q[]; };
layout(std430, set = 0, binding = 1) readonly buffer KC { float kcache[]; };
layout(std430, set = 0, binding = 2) readonly buffer VC { float vcache[]; };
layout(std430, set = 0, binding = 3) readonly buffer Slot { uint slot[]; };
layout(std430, set = 0, binding = 4) readonly buffer Pos { uint pos[]; };
layout(std430, set = 0, binding = 5) writeonly buffer Out { float outv[]; };
layout(push_constant) uniform Push {
    uint R, n_heads, n_kv_heads, head_dim, seq_len, n_slots;
    float scale;
} pc;

#if defined(ROWS_TILE)
shared float q_s[ROWS * MAX_HEAD_DIM];  // row g's q * scale at g * MAX_HEAD_DIM
shared float p_s[ROWS * WG_SIZE];       // row g's tile weights at g * WG_SIZE
#elif !defined(USE_SUBGROUP)
shared float q_s[MAX_HEAD_DIM];
shared float p_s[WG_SIZE];

float score(uint kbase) {
    float s = 0.0;
    for (uint d = 0u; d < pc.head_dim; d++) s += q_s[d] * kcache[kbase + d];
    return s;
}

#endif

#if defined(USE_SUBGROUP) && defined(ROWS_SG)
// Rows r0 .. r0 + nr - 1 (nr <= ROWS) of one slot, head h: USE_SUBGROUP's
// arithmetic per row, each K/V load shared by the rows.
void attend_rows(uint r0, uint nr, uint h, uint lanes, uint lane) {
    uint kv_dim = pc.n_kv_heads * pc.head_dim;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    // slot/pos are GPU data the ops layer cannot check: clamp so that a bad
    // value never reads outside the cache.
    uint s = min(slot[r0], pc.n_slots - 1u);
    uint cache0 = s * pc.seq_len * kv_dim + kvh * pc.head_dim;
    // row g's q at qbase + min(g, nr - 1) * q_dim (surplus rows reread the last)
    uint q_dim = pc.n_heads * pc.head_dim, qbase = r0 * q_dim + h * pc.head_dim;
    uint n_keys[ROWS];
    uint max_keys = 0u;
    [[unroll]] for (uint g = 0u; g < ROWS; g++) {
        n_keys[g] = g < nr ? min(pos[r0 + g], pc.seq_len - 1u) + 1u : 0u;
        max_keys = max(max_keys, n_keys[g]);
    }
    float o[ROWS * DIMS_PER_LANE];
    [[unroll]] for (uint i = 0u; i < ROWS * DIMS_PER_LANE; i++) o[i] = 0.0;
    float m_run[ROWS], l_run[ROWS], p[ROWS];
    [[unroll]] for (uint g = 0u; g < ROWS; g++) { m_run[g] = -1.0 / 0.0; l_run[g] = 0.0; }
    for (uint t0 = 0u; t0 < max_keys; t0 += lanes) {
        uint j = t0 + lane, tile_len = min(lanes, max_keys - t0);
        float sc[ROWS];
        [[unroll]] for (uint g = 0u; g < ROWS; g++) sc[g] = 0.0;
        if (j < max_keys) {
            for (uint d = 0u; d < pc.head_dim; d++) {
                float k = kcache[cache0 + j * kv_dim + d];
                [[unroll]] for (uint g = 0u; g < ROWS; g++) sc[g] += (q[qbase + min(g, nr - 1u) * q_dim + d] * pc.scale) * k;
            }
        }
        [[unroll]] for (uint g = 0u; g < ROWS; g++) {
            if (t0 >= n_keys[g]) { p[g] = 0.0; continue; }  // the row's keys are done (uniform)
            float sg = j < n_keys[g] ? sc[g] : -1.0 / 0.0;
            float m_new = max(m_run[g], subgroupMax(sg));
            p[g] = j < n_keys[g] ? exp(sg - m_new) : 0.0;
            float corr = exp(m_run[g] - m_new);
            l_run[g] = l_run[g] * corr + subgroupAdd(p[g]);
            [[unroll]] for (uint i = 0u; i < DIMS_PER_LANE; i++) o[g * DIMS_PER_LANE + i] *= corr;
            m_run[g] = m_new;
        }
        for (uint jj = 0u; jj < tile_len; jj++) {
            float pj[ROWS];
            [[unroll]] for (uint g = 0u; g < ROWS; g++) pj[g] = subgroupShuffle(p[g], jj);
            uint vbase = cache0 + (t0 + jj) * kv_dim;
            [[unroll]] for (uint i = 0u; i < DIMS_PER_LANE; i++) {
                uint d = lane + i * lanes;
                if (d < pc.head_dim) {
                    float v = vcache[vbase + d];
                    [[unroll]] for (uint g = 0u; g < ROWS; g++)
                        if (t0 + jj < n_keys[g]) o[g * DIMS_PER_LANE + i] += pj[g] * v;
                }
            }
        }
    }
    [[unroll]] for (uint g = 0u; g < ROWS; g++)
        [[unroll]] for (uint i = 0u; i < DIMS_PER_LANE; i++) {
            uint d = lane + i * lanes;
            if (g < nr && d < pc.head_dim) outv[qbase + g * q_dim + d] = o[g * DIMS_PER_LANE + i] / l_run[g];
        }
}

void main() {
    uint n_groups = (pc.R + ROWS - 1u) / ROWS, id = linear_group_id();
    if (id >= n_groups * pc.n_heads || gl_SubgroupID != 0u) return;
    uint lanes = subgroupAdd(1u), lane = gl_SubgroupInvocationID;
    uint rg = id / pc.n_heads, h = id - rg * pc.n_heads;
    uint r0 = rg * ROWS, nr = min(ROWS, pc.R - r0);
    if (lanes * DIMS_PER_LANE < pc.head_dim) {  // fewer lanes than the host planned for: loud, never partial
        for (uint g = 0u; g < nr; g++) {
            uint qbase = (r0 + g) * pc.n_heads * pc.head_dim + h * pc.head_dim;
            for (uint d = lane; d < pc.head_dim; d += lanes) outv[qbase + d] = uintBitsToFloat(0x7fc00000u);
        }
        return;
    }
    bool same = true;  // one slot (as clamped) for the whole group: shared loads
    uint s0 = min(slot[r0], pc.n_slots - 1u);
    for (uint g = 1u; g < nr; g++) same = same && min(slot[r0 + g], pc.n_slots - 1u) == s0;
    if (same) attend_rows(r0, nr, h, lanes, lane);
    else
        for (uint g = 0u; g < nr; g++) attend_rows(r0 + g, 1u, h, lanes, lane);
}
#elif defined(ROWS_TILE)
// Rows r0 .. r0 + nr - 1 (nr <= ROWS) of one slot, head h: the one-row tile
// kernel's arithmetic per row, each K/V load shared by the rows.
void attend_rows(uint r0, uint nr, uint h) {
    uint t = gl_LocalInvocationID.x, wg = WG_SIZE;
    uint kv_dim = pc.n_kv_heads * pc.head_dim;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint q_dim = pc.n_heads * pc.head_dim, qbase = r0 * q_dim + h * pc.head_dim;
    // slot/pos are GPU data the ops layer cannot check: clamp so that a bad
    // value never reads outside the cache.
    uint s = min(slot[r0], pc.n_slots - 1u);
    uint cache0 = s * pc.seq_len * kv_dim + kvh * pc.head_dim;
    uint n_keys[ROWS];
    uint max_keys = 0u;
    [[unroll]] for (uint g = 0u; g < ROWS; g++) {
        n_keys[g] = g < nr ? min(pos[r0 + g], pc.seq_len - 1u) + 1u : 0u;
        max_keys = max(max_keys, n_keys[g]);
    }
    barrier();  // q_s and p_s may still be read for the previous run of rows
    // surplus rows (g >= nr) copy the last row's q: defined values, never used
    [[unroll]] for (uint g = 0u; g < ROWS; g++)
        for (uint d = t; d < pc.head_dim; d += wg)
            q_s[g * MAX_HEAD_DIM + d] = q[qbase + min(g, nr - 1u) * q_dim + d] * pc.scale;
    float o[ROWS * DIMS_PER_THREAD];
    [[unroll]] for (uint i = 0u; i < ROWS * DIMS_PER_THREAD; i++) o[i] = 0.0;
    float m_run[ROWS], l_run[ROWS], corr[ROWS];
    [[unroll]] for (uint g = 0u; g < ROWS; g++) { m_run[g] = -1.0 / 0.0; l_run[g] = 0.0; corr[g] = 1.0; }
    barrier();

    for (uint t0 = 0u; t0 < max_keys; t0 += wg) {
        uint j = t0 + t, tile_len = min(wg, max_keys - t0);
        float sc[ROWS];
        [[unroll]] for (uint g = 0u; g < ROWS; g++) sc[g] = 0.0;
        if (j < max_keys) {
            uint kbase = cache0 + j * kv_dim;
            for (uint d = 0u; d < pc.head_dim; d++) {
                float k = kcache[kbase + d];
                [[unroll]] for (uint g = 0u; g < ROWS; g++) sc[g] += q_s[g * MAX_HEAD_DIM + d] * k;
            }
        }
        [[unroll]] for (uint g = 0u; g < ROWS; g++) {
            if (t0 >= n_keys[g]) continue;  // the row's keys are done (uniform: no barrier skipped by some)
            float sg = j < n_keys[g] ? sc[g] : -1.0 / 0.0;
            float m_new = max(m_run[g], workgroup_max(sg));
            float p = j < n_keys[g] ? exp(sg - m_new) : 0.0;
            p_s[g * WG_SIZE + t] = p;
            corr[g] = exp(m_run[g] - m_new);
            l_run[g] = l_run[g] * corr[g] + workgroup_sum(p);  // its barriers also publish p_s
            m_run[g] = m_new;
        }
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = t + i * wg;
            if (d >= pc.head_dim) break;
            float acc[ROWS];
            [[unroll]] for (uint g = 0u; g < ROWS; g++) acc[g] = o[g * DIMS_PER_THREAD + i] * corr[g];
            for (uint jj = 0u; jj < tile_len; jj++) {
                float v = vcache[cache0 + (t0 + jj) * kv_dim + d];
                [[unroll]] for (uint g = 0u; g < ROWS; g++)
                    if (t0 + jj < n_keys[g]) acc[g] += p_s[g * WG_SIZE + jj] * v;
            }
            [[unroll]] for (uint g = 0u; g < ROWS; g++)
                if (t0 < n_keys[g]) o[g * DIMS_PER_THREAD + i] = acc[g];
        }
    }
    [[unroll]] for (uint g = 0u; g < ROWS; g++)
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = t + i * wg;
            if (g < nr && d < pc.head_dim) outv[qbase + g * q_dim + d] = o[g * DIMS_PER_THREAD + i] / l_run[g];
        }
}

void main() {
    uint n_groups = (pc.R + ROWS - 1u) / ROWS, id = linear_group_id();
    if (id >= n_groups * pc.n_heads) return;  // uniform over the workgroup
    uint rg = id / pc.n_heads, h = id - rg * pc.n_heads;
    uint r0 = rg * ROWS, nr = min(ROWS, pc.R - r0);
    // runs of consecutive rows of one slot (as clamped), each with shared loads
    for (uint a = 0u; a < nr;) {
        uint s = min(slot[r0 + a], pc.n_slots - 1u), b = a + 1u;
        while (b < nr && min(slot[r0 + b], pc.n_slots - 1u) == s) b++;
        attend_rows(r0 + a, b - a, h);
        a = b;
    }
}
#elif defined(USE_SUBGROUP)
void main() {
    uint id = linear_group_id();
    if (id >= pc.R * pc.n_heads || gl_SubgroupID != 0u) return;
    uint lanes = subgroupAdd(1u), lane = gl_SubgroupInvocationID;
    uint r = id / pc.n_heads, h = id - r * pc.n_heads;
    uint kv_dim = pc.n_kv_heads * pc.head_dim;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint qbase = r * pc.n_heads * pc.head_dim + h * pc.head_dim;
    // slot/pos are GPU data the ops layer cannot check: clamp so that a bad
    // value never reads outside the cache.
    uint s = min(slot[r], pc.n_slots - 1u);
    uint n_keys = min(pos[r], pc.seq_len - 1u) + 1u;
    uint cache0 = s * pc.seq_len * kv_dim + kvh * pc.head_dim;

    if (lanes * DIMS_PER_LANE < pc.head_dim) {  // fewer lanes than the host planned for: loud, never partial
        for (uint d = lane; d < pc.head_dim; d += lanes) outv[qbase + d] = uintBitsToFloat(0x7fc00000u);
        return;
    }
    float o[DIMS_PER_LANE];
    for (uint i = 0u; i < DIMS_PER_LANE; i++) o[i] = 0.0;
    float m_run = -1.0 / 0.0, l_run = 0.0;
    for (uint t0 = 0u; t0 < n_keys; t0 += lanes) {
        uint j = t0 + lane, tile_len = min(lanes, n_keys - t0);
        float sc = -1.0 / 0.0;
        if (j < n_keys) {
            sc = 0.0;
            for (uint d = 0u; d < pc.head_dim; d++) sc += (q[qbase + d] * pc.scale) * kcache[cache0 + j * kv_dim + d];
        }
        float m_new = max(m_run, subgroupMax(sc));
        float p = j < n_keys ? exp(sc - m_new) : 0.0;
        float corr = exp(m_run - m_new);
        l_run = l_run * corr + subgroupAdd(p);
        for (uint i = 0u; i < DIMS_PER_LANE; i++) o[i] *= corr;
        for (uint jj = 0u; jj < tile_len; jj++) {
            float pj = subgroupShuffle(p, jj);
            uint vbase = cache0 + (t0 + jj) * kv_dim;
            for (uint i = 0u; i < DIMS_PER_LANE; i++) {
                uint d = lane + i * lanes;
                if (d < pc.head_dim) o[i] += pj * vcache[vbase + d];
            }
        }
        m_run = m_new;
    }
    for (uint i = 0u; i < DIMS_PER_LANE; i++) {
        uint d = lane + i * lanes;
        if (d < pc.head_dim) outv[qbase + d] = o[i] / l_run;
    }
}
#else
void main() {
    uint id = linear_group_id();
    if (id >= pc.R * pc.n_heads) return;  // uniform over the workgroup
    uint r = id / pc.n_heads, h = id - r * pc.n_heads;
    uint t = gl_LocalInvocationID.x, wg = WG_SIZE;
    uint kv_dim = pc.n_kv_heads * pc.head_dim;
    uint kvh = h / (pc.n_heads / pc.n_kv_heads);
    uint qbase = r * pc.n_heads * pc.head_dim + h * pc.head_dim;
    // slot/pos are GPU data the ops layer cannot check: clamp so that a bad
    // value never reads outside the cache.
    uint s = min(slot[r], pc.n_slots - 1u);
    uint n_keys = min(pos[r], pc.seq_len - 1u) + 1u;
    uint cache0 = s * pc.seq_len * kv_dim + kvh * pc.head_dim;

    for (uint d = t; d < pc.head_dim; d += wg) q_s[d] = q[qbase + d] * pc.scale;
    float o[DIMS_PER_THREAD];
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) o[i] = 0.0;
    float m_run = -1.0 / 0.0, l_run = 0.0;
    barrier();

    for (uint t0 = 0u; t0 < n_keys; t0 += wg) {
        uint j = t0 + t, tile_len = min(wg, n_keys - t0);
        float sc = j < n_keys ? score(cache0 + j * kv_dim) : -1.0 / 0.0;
        float m_new = max(m_run, workgroup_max(sc));
        float p = j < n_keys ? exp(sc - m_new) : 0.0;
        p_s[t] = p;
        float corr = exp(m_run - m_new);
        l_run = l_run * corr + workgroup_sum(p);  // its barriers also publish p_s
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = t + i * wg;
            if (d >= pc.head_dim) break;
            float acc = o[i] * corr;
            for (uint jj = 0u; jj < tile_len; jj++)
                acc += p_s[jj] * vcache[cache0 + (t0 + jj) * kv_dim + d];
            o[i] = acc;
        }
        m_run = m_new;
    }
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
        uint d = t + i * wg;
        if (d < pc.head_dim) outv[qbase + d] = o[i] / l_run;
    }
}
#endif
