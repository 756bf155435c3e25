#version 450
// Decode matrix-vector product for small M (M = MCOLS <= 8 activation rows):
//   y[m, y_col0 + n] = (accumulate ? y : 0) + sum_k x[m, k] * W[n, k]
// Each workgroup owns ROWS_PER_WG consecutive weight rows. A "lane group"
// (a subgroup with USE_SUBGROUP, else the whole workgroup) takes ROWS rows at
// a time: its lanes stride over K with coalesced loads (uvec4 when VEC4, i.e.
// the rows and bindings are 16-byte aligned), then reduce.
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#include "common.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;         // rows per lane group pass
layout(constant_id = 2) const uint MCOLS = 1;        // == M
layout(constant_id = 3) const bool VEC4 = false;     // 16-byte aligned fast path
layout(constant_id = 4) const uint ROWS_PER_WG = 1;  // multiple of ROWS

// x and W are each bound once and viewed both as scalars and as 16-byte
// vectors (aliased declarations of one binding); the vector views are used
// only when VEC4 guarantees alignment and whole vectors.
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer W4 { uvec4 w4[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint M, N, K, ldy, y_col0, accumulate; } pc;

#ifdef USE_SUBGROUP
// Lanes actually executing together: counted, not gl_SubgroupSize, since
// some drivers (Intel's varying sizes, lavapipe with LP_NATIVE_VECTOR_WIDTH=1024)
// run smaller subgroups than gl_SubgroupSize reports.
uint lanes_in_subgroup;
#define LANES lanes_in_subgroup
#define LANE gl_SubgroupInvocationID
#define GROUP_ID gl_SubgroupID
#define NUM_GROUPS gl_NumSubgroups
#else
#define LANES WG_SIZE
#define LANE gl_LocalInvocationID.x
#define GROUP_ID 0u
#define NUM_GROUPS 1u
shared float red[WG_SIZE * ROWS * MCOLS];
#endif

float acc[ROWS * MCOLS];

uint w_word(uint i) { return w[i]; }

vec4 w_vec4_f32(uint i) { return uintBitsToFloat(w4[i]); }

void accumulate_vec4(uint row0) {
#if WTYPE == 0
    uint k4 = pc.K / 4u;
    for (uint i = LANE; i < k4; i += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= pc.N) break;
            vec4 wv = w_vec4_f32((row0 + r) * k4 + i);
            for (uint m = 0u; m < MCOLS; m++) acc[r * MCOLS + m] += dot(wv, x4[m * k4 + i]);
        }
    }
#else
    uint k8 = pc.K / 8u, k4 = pc.K / 4u;
    for (uint i = LANE; i < k8; i += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= pc.N) break;
            uvec4 q = w4[(row0 + r) * k8 + i];
            vec4 lo = vec4(decode_pair(q.x), decode_pair(q.y));
            vec4 hi = vec4(decode_pair(q.z), decode_pair(q.w));
            for (uint m = 0u; m < MCOLS; m++)
                acc[r * MCOLS + m] += dot(lo, x4[m * k4 + 2u * i]) + dot(hi, x4[m * k4 + 2u * i + 1u]);
        }
    }
#endif
}

void accumulate_scalar(uint row0) {
    for (uint k = LANE; k < pc.K; k += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= pc.N) break;
            float wv = DECODE_ELEMENT(w_word, (row0 + r) * pc.K + k);
            for (uint m = 0u; m < MCOLS; m++) acc[r * MCOLS + m] += wv * x[m * pc.K + k];
        }
    }
}

void store(uint row0, uint v, float s) {
    uint r = v / MCOLS, m = v - r * MCOLS;
    if (row0 + r >= pc.N) return;
    uint o = m * pc.ldy + pc.y_col0 + row0 + r;
    y[o] = (pc.accumulate != 0u ? y[o] : 0.0) + s;
}

// Sums acc over the lane group; the sums are stored by one lane.
void reduce_and_store(uint row0) {
#ifdef USE_SUBGROUP
    for (uint v = 0u; v < ROWS * MCOLS; v++) {
        float s = subgroupAdd(acc[v]);
        if (subgroupElect()) store(row0, v, s);
    }
#else
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    for (uint v = 0u; v < ROWS * MCOLS; v++) red[v * n + t] = acc[v];
    barrier();
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u; len = half_n, half_n = (half_n + 1u) / 2u) {
        if (t < len - half_n)
            for (uint v = 0u; v < ROWS * MCOLS; v++) red[v * n + t] += red[v * n + t + half_n];
        barrier();
    }
    for (uint v = t; v < ROWS * MCOLS; v += n) store(row0, v, red[v * n]);
#endif
}

void main() {
#ifdef USE_SUBGROUP
    lanes_in_subgroup = subgroupAdd(1u);
#endif
    uint wg_row0 = linear_group_id() * ROWS_PER_WG;
    if (wg_row0 >= pc.N) return;  // uniform over the workgroup
    for (uint rb = GROUP_ID * ROWS; rb < ROWS_PER_WG; rb += NUM_GROUPS * ROWS) {
        for (uint v = 0u; v < ROWS * MCOLS; v++) acc[v] = 0.0;
        if (VEC4) accumulate_vec4(wg_row0 + rb);
        else accumulate_scalar(wg_row0 + rb);
        reduce_and_store(wg_row0 + rb);
    }
}
