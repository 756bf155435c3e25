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
#include "matvec_parts.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint ROWS = 1;         // rows per lane group pass
layout(constant_id = 2) const uint MCOLS = 1;        // == M
layout(constant_id = 3) const bool VEC4 = false;     // 16-byte aligned fast path
layout(constant_id = 4) const uint ROWS_PER_WG = 1;  // multiple of ROWS

// x and each W are bound once and viewed both as scalars and as 16-byte
// vectors (aliased declarations of one binding); the vector views are used
// only when VEC4 guarantees alignment and whole vectors. W and y: per matrix
// (matvec_part.glsl; MULTI: up to 3 matrices, matvec_parts.glsl).
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(push_constant) uniform Push { PUSH_CONSTANTS } pc;

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

#define MAT 0
#include "matvec_part.glsl"
#ifdef MULTI
#undef MAT
#define MAT 1
#include "matvec_part.glsl"
#undef MAT
#define MAT 2
#include "matvec_part.glsl"
#endif
#include "matvec_main.glsl"
