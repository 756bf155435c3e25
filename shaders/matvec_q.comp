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
#define WEIGHT_COUNT (P_N * pc.K)  // elements of the W being read (weights.glsl)
#include "common.glsl"
#include "weights.glsl"
#include "matvec_parts.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;         // rows per lane group pass
layout(constant_id = 2) const uint MCOLS = 1;        // == M
layout(constant_id = 3) const uint ROWS_PER_WG = 1;  // multiple of ROWS

layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
// W and y: per matrix (matvec_q_part.glsl; MULTI: up to 3, matvec_parts.glsl)
layout(push_constant) uniform Push { PUSH_CONSTANTS } pc;

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

#define MAT 0
#include "matvec_q_part.glsl"
#ifdef MULTI
#undef MAT
#define MAT 1
#include "matvec_q_part.glsl"
#undef MAT
#define MAT 2
#include "matvec_q_part.glsl"
#endif
#include "matvec_main.glsl"
