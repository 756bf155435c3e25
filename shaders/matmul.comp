#version 450
#extension GL_EXT_control_flow_attributes : require
// Prefill matrix product: y[m, y_col0 + n] = (accumulate ? y : 0) + sum_k x[m,k] W[n,k]
// Output tiles of BM x BN; K is walked in BK slices staged in shared memory as
// vec4s of 4 consecutive k (weights decoded to f32 once per element while
// staging). Each invocation computes TM x TN outputs, strided by BM/TM rows
// and BN/TN columns, reading one vec4 of x per row and one vec4 of W per column
// for every 4 k: few, wide loads per multiply-add (CPU implementations such as
// lavapipe gather every load lane by lane, so load count dominates there).
// Every output is accumulated over k = 0..K-1 in order, one product at a time,
// whatever M and the tile are (batch invariance).
// local_size_x must equal (BM/TM) * (BN/TN); BK must be a multiple of 4.
// Staged path (GPUs): shared tiles padded to BK4 + 1 vec4s per row (no bank
// conflicts on the vec4 reads of the inner loop: lanes reading consecutive
// rows land 5 vec4s = 20 words apart, 8 distinct groups of 4 banks per
// quarter-warp; unpadded 16 words apart, 4-way) and double-buffered: slice
// k + 1 is staged into the other buffer while slice k is multiplied, one
// barrier per slice. Shared memory: 2 (BM + BN)(BK/4 + 1) 16 bytes = 30 KiB
// at 64x128x16 (f32), 15 KiB in F16_MATH (under lavapipe's 32 KiB).
// F16_MATH (the *_h variants, for devices with shaderFloat16): f16 storage
// with f32 arithmetic. x and the decoded weights are rounded to half once when
// staged (half the shared memory and half the staging traffic), converted
// back to f32 for each multiply-add; products and sums are f32 (one half
// rounding per operand, none per product). DIRECT rounds the operands the
// same way, so both give the same results.
#ifdef F16_MATH
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define TILE_VEC f16vec4
#else
#define TILE_VEC vec4
#endif
#ifdef DIRECT_SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_ballot : require
#endif
#define WEIGHT_COUNT (P_N * pc.K)  // elements of the W being read (block types, weights.glsl)
#include "common.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;
// K % 8 == 0 and x, W bound 16-byte aligned: stage with vector loads.
layout(constant_id = 6) const bool VEC4 = false;
// DIRECT (CPU drivers): no shared-memory tiles and no barriers; each
// invocation reads its x and W vec4s straight from the buffers. lavapipe
// gathers shared and storage loads alike lane by lane, so staging only added
// loads, stores and two barriers (coroutine switches) per K slice. The
// products and their order are the same: results are bit-identical.
layout(constant_id = 7) const bool DIRECT = false;

// MULTI (the *_multi variants, vks_op_matmul_multi): up to 3 products of
// the same x, y_i[m, col0_i + n] (+)= sum_k x[m,k] W_i[n,k], in one dispatch.
// Its workgroups are matrix 0's tiles, then matrix 1's, then matrix 2's (each
// numbered as in its own single dispatch), and each runs the single kernel's
// code on its matrix (matmul_part.glsl, included once per matrix): every
// output gets the same bits as from a dispatch of its own.
// Bindings: x = 0; matrix i: W_i = 1 + 2i, y_i = 2 + 2i (7 in all).
// SWIGLU (the *_swiglu variants, vks_op_matmul_swiglu): the gate product
// (matrix 0, W = binding 1) and the up product (matrix 1, W = binding 3) of
// the same x, each workgroup computing the same output tile of both, one after
// the other, with the single kernel's code (each output's sum in the same
// order), and writing y[m, y_col0 + n] = silu(g) * u (binding 2) with
// elementwise.comp OP_SWIGLU's expression: the bits of the two products
// followed by vks_op_swiglu. The single kernel's push constants (N: both).
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
#ifdef MULTI
layout(push_constant) uniform Push {
    uint M, K, accumulate, parts, N0, N1, N2, ldy0, ldy1, ldy2, col0_0, col0_1, col0_2;
} pc;
#else
layout(push_constant) uniform Push { uint M, N, K, ldy, y_col0, accumulate; } pc;
#endif

const uint BK4 = BK / 4u;
const uint BKP = BK4 + 1u;  // padded row stride of the tiles, in vec4s
// Buffer b: xs[(b BM + mm) BKP + kq] = x[m0 + mm, k0 + 4kq .. +3]
// (DIRECT never stages: one element, so that decode's wide tiles fit the limit)
shared TILE_VEC xs[DIRECT ? 1u : 2u * BM * BKP];
// Buffer b: ws[(b BN + nn) BKP + kq] = W[n0 + nn, k0 + 4kq .. +3]
shared TILE_VEC ws[DIRECT ? 1u : 2u * BN * BKP];
float acc[TM * TN];
#ifdef SWIGLU
float acc_gate[TM * TN];  // matrix 0's finished sums, as its store would read them
#endif

// 4 consecutive elements of row m of x from k (zero past M or K).
vec4 x_quad(uint m, uint k) {
    if (m >= pc.M || k >= pc.K) return vec4(0.0);
    uint e = m * pc.K + k;
    if (VEC4) return x4[e >> 2];
    vec4 v = vec4(0.0);
    for (uint c = 0u; c < 4u && k + c < pc.K; c++) v[c] = x[e + c];
    return v;
}

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define PN(name) CAT(name, MAT)  // a name of matrix MAT's copy (matmul_part.glsl)
#define MAT 0
#define W_BINDING 1
#define Y_BINDING 2
#ifdef MULTI
#define P_N pc.N0
#define P_LDY pc.ldy0
#define P_COL0 pc.col0_0
#else
#define P_N pc.N
#define P_LDY pc.ldy
#define P_COL0 pc.y_col0
#endif
#include "matmul_part.glsl"
#ifdef SWIGLU
#undef MAT
#undef W_BINDING
#define MAT 1
#define W_BINDING 3
#include "matmul_part.glsl"
#endif
#ifdef MULTI
#undef MAT
#undef W_BINDING
#undef Y_BINDING
#undef P_N
#undef P_LDY
#undef P_COL0
#define MAT 1
#define W_BINDING 3
#define Y_BINDING 4
#define P_N pc.N1
#define P_LDY pc.ldy1
#define P_COL0 pc.col0_1
#include "matmul_part.glsl"
#undef MAT
#undef W_BINDING
#undef Y_BINDING
#undef P_N
#undef P_LDY
#undef P_COL0
#define MAT 2
#define W_BINDING 5
#define Y_BINDING 6
#define P_N pc.N2
#define P_LDY pc.ldy2
#define P_COL0 pc.col0_2
#include "matmul_part.glsl"
#endif

void main() {
    uint tile = linear_group_id();  // uniform over the workgroup
#ifdef MULTI
    uint tiles_m = (pc.M + BM - 1u) / BM;
    uint t0 = tiles_m * ((pc.N0 + BN - 1u) / BN);
    if (tile < t0) { run_tile0(tile); return; }
    tile -= t0;
    uint t1 = pc.parts > 1u ? tiles_m * ((pc.N1 + BN - 1u) / BN) : 0u;
    if (tile < t1) { run_tile1(tile); return; }
    tile -= t1;
    if (pc.parts > 2u) run_tile2(tile);  // bounds-checks its own tiles
#elif defined(SWIGLU)
    run_tile0(tile);  // gate sums into acc_gate
    run_tile1(tile);  // up, then the SwiGLU store
#else
    run_tile0(tile);
#endif
}
