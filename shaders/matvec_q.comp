#version 450
// Decode matrix-vector product with block-quantized weights (M = MCOLS <= 8):
//   y[m, y_col0 + n] = (accumulate ? y : 0) + sum_k x[m, k] * W[n, k]
// WTYPE 3 = Q8_0, 4 = Q4_0, 5 = Q4_K, in the layouts of weights.glsl.
// The work is split as in matvec.comp: a workgroup owns ROWS_PER_WG rows; a
// lane group (a subgroup with USE_SUBGROUP, else the whole workgroup) takes
// ROWS rows at a time and its lanes stride over 32-element units (a Q8_0 or
// Q4_0 block, a Q4_K sub-block). A lane loads each row's unit with 16-byte
// loads and decodes it in registers once, loads each x row's 32 values once,
// and applies the unit's scale and offset once per dot product. The ops
// layer guarantees K % 32 == 0 (K % 256 for Q4_K) and 16-byte aligned bindings.
#ifdef USE_SUBGROUP
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
#define WEIGHT_COUNT (pc.N * pc.K)
#include "common.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;         // rows per lane group pass
layout(constant_id = 2) const uint MCOLS = 1;        // == M
layout(constant_id = 3) const uint ROWS_PER_WG = 1;  // multiple of ROWS

layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer W4 { uvec4 w4[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint M, N, K, ldy, y_col0, accumulate; } pc;

#ifdef USE_SUBGROUP
// Lanes actually executing together, counted (see matvec.comp).
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
// The current unit of each of the ROWS rows: 32 quants (before scaling) and
// its affine map w = scale * q - offset (offset: Q4_0's 8 * d, Q4_K's min).
vec4 q[ROWS * 8];
float scale[ROWS], offset[ROWS];

// Four signed bytes of a word as floats.
vec4 i8x4(uint word) { return vec4(ivec4(word << 24, word << 16, word << 8, word) >> 24); }
// Four nibbles of a word (one per byte, at bit `shift` of each byte) as floats.
vec4 u4x4(uint word, uint shift) {
    return vec4((uvec4(word) >> (uvec4(0u, 8u, 16u, 24u) + shift)) & 15u);
}

#if WTYPE == 3 || WTYPE == 4
// Decodes unit `unit` (a block index in W) for row slot r.
void decode_unit(uint unit, uint r) {
    float d = block_scale(w[SCALE0 + unit / 2u], unit);
    uint o = r * 8u;
    scale[r] = d;
#if WTYPE == 3
    offset[r] = 0.0;
    uvec4 a = w4[2u * unit], b = w4[2u * unit + 1u];
    q[o] = i8x4(a.x); q[o + 1u] = i8x4(a.y); q[o + 2u] = i8x4(a.z); q[o + 3u] = i8x4(a.w);
    q[o + 4u] = i8x4(b.x); q[o + 5u] = i8x4(b.y); q[o + 6u] = i8x4(b.z); q[o + 7u] = i8x4(b.w);
#else
    offset[r] = 8.0 * d;
    uvec4 a = w4[unit];  // byte j: element j (low nibble), element j + 16 (high)
    q[o] = u4x4(a.x, 0u); q[o + 1u] = u4x4(a.y, 0u); q[o + 2u] = u4x4(a.z, 0u); q[o + 3u] = u4x4(a.w, 0u);
    q[o + 4u] = u4x4(a.x, 4u); q[o + 5u] = u4x4(a.y, 4u); q[o + 6u] = u4x4(a.z, 4u); q[o + 7u] = u4x4(a.w, 4u);
#endif
}
#else
// unit = sub-block index in W: block unit/8, sub-block s = unit%8, whose 32
// quants are nibble (s & 1) of the 32 bytes at quant byte 32*(s/2).
void decode_unit(uint unit, uint r) {
    uint blk = unit >> 3, s = unit & 7u, base = 36u * blk, o = r * 8u;
    vec2 dm = unpackHalf2x16(w[base]);
    uvec2 scm = q4_k_scale_min(uvec3(w[base + 1u], w[base + 2u], w[base + 3u]), s);
    scale[r] = dm.x * float(scm.x);
    offset[r] = dm.y * float(scm.y);
    uint v = 9u * blk + 1u + 2u * (s >> 1), shift = (s & 1u) * 4u;
    uvec4 a = w4[v], b = w4[v + 1u];
    q[o] = u4x4(a.x, shift); q[o + 1u] = u4x4(a.y, shift); q[o + 2u] = u4x4(a.z, shift); q[o + 3u] = u4x4(a.w, shift);
    q[o + 4u] = u4x4(b.x, shift); q[o + 5u] = u4x4(b.y, shift); q[o + 6u] = u4x4(b.z, shift); q[o + 7u] = u4x4(b.w, shift);
}
#endif

// Unit u (vec4 index 8u in an x row) of rows row0 .. row0 + nr - 1: each
// row's quants are decoded once, each x row is loaded once; the scale and
// offset apply per unit: sum w x = scale * sum q x - offset * sum x.
void accumulate_unit(uint row0, uint nr, uint u) {
    uint units = pc.K / 32u;
    // Loops run to the constant ROWS (rows past nr repeat row 0) so that the
    // compiler can unroll them and keep q[] in registers.
    for (uint r = 0u; r < ROWS; r++) decode_unit((row0 + (r < nr ? r : 0u)) * units + u, r);
    for (uint m = 0u; m < MCOLS; m++) {
        uint xb = m * (pc.K / 4u) + u * 8u;
        vec4 xv[8];
        vec4 xs = vec4(0.0);
        for (uint i = 0u; i < 8u; i++) {
            xv[i] = x4[xb + i];
            xs += xv[i];
        }
        float xsum = dot(xs, vec4(1.0));
        for (uint r = 0u; r < ROWS; r++) {
            float s = 0.0;
            for (uint i = 0u; i < 8u; i++) s += dot(q[r * 8u + i], xv[i]);
            acc[r * MCOLS + m] += scale[r] * s - offset[r] * xsum;  // unused for r >= nr
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
    uint units = pc.K / 32u;
    for (uint rb = GROUP_ID * ROWS; rb < ROWS_PER_WG; rb += NUM_GROUPS * ROWS) {
        uint row0 = wg_row0 + rb;
        for (uint v = 0u; v < ROWS * MCOLS; v++) acc[v] = 0.0;
        uint nr = min(ROWS, pc.N - min(row0, pc.N));
        for (uint u = LANE; nr > 0u && u < units; u += LANES) accumulate_unit(row0, nr, u);
        reduce_and_store(row0);
    }
}
