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
#define WEIGHT_COUNT (pc.N * pc.K)  // elements of W (block types, weights.glsl)
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

// Scalar and vector views of the same bindings; the vector ones only when VEC4.
layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 0) readonly buffer X4 { vec4 x4[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };
layout(std430, set = 0, binding = 1) readonly buffer W2 { uvec2 w2[]; };
layout(std430, set = 0, binding = 1) readonly buffer W4 { uvec4 w4[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint M, N, K, ldy, y_col0, accumulate; } pc;

const uint BK4 = BK / 4u;
const uint BKP = BK4 + 1u;  // padded row stride of the tiles, in vec4s
// Buffer b: xs[(b BM + mm) BKP + kq] = x[m0 + mm, k0 + 4kq .. +3]
// (DIRECT never stages: one element, so that decode's wide tiles fit the limit)
shared TILE_VEC xs[DIRECT ? 1u : 2u * BM * BKP];
// Buffer b: ws[(b BN + nn) BKP + kq] = W[n0 + nn, k0 + 4kq .. +3]
shared TILE_VEC ws[DIRECT ? 1u : 2u * BN * BKP];
float acc[TM * TN];

uint w_word(uint i) { return w[i]; }

// 4 consecutive elements of row m of x from k (zero past M or K).
vec4 x_quad(uint m, uint k) {
    if (m >= pc.M || k >= pc.K) return vec4(0.0);
    uint e = m * pc.K + k;
    if (VEC4) return x4[e >> 2];
    vec4 v = vec4(0.0);
    for (uint c = 0u; c < 4u && k + c < pc.K; c++) v[c] = x[e + c];
    return v;
}

float w_element(uint e) { return DECODE_ELEMENT(w_word, e); }

// 4 consecutive decoded elements of row n of W from k (zero past N or K).
vec4 w_quad(uint n, uint k) {
    if (n >= pc.N || k >= pc.K) return vec4(0.0);
    uint e = n * pc.K + k;
#if WTYPE == 0
    if (VEC4) return uintBitsToFloat(w4[e >> 2]);
#elif WTYPE == 1 || WTYPE == 2
    if (VEC4) {
        uvec2 q = w2[e >> 2];
        return vec4(decode_pair(q.x), decode_pair(q.y));
    }
#else
    return DECODE_QUAD(w_word, e);  // K is a whole number of blocks: e % 4 == 0
#endif
    vec4 v = vec4(0.0);
    for (uint c = 0u; c < 4u && k + c < pc.K; c++) v[c] = w_element(e + c);
    return v;
}

// Stages the K slice from k0 into buffer b.
void load_tiles(uint m0, uint n0, uint k0, uint b) {
    for (uint i = gl_LocalInvocationID.x; i < BM * BK4; i += WG_SIZE) {
        uint mm = i / BK4, kq = i - mm * BK4;
        xs[(b * BM + mm) * BKP + kq] = TILE_VEC(x_quad(m0 + mm, k0 + 4u * kq));
    }
    for (uint i = gl_LocalInvocationID.x; i < BN * BK4; i += WG_SIZE) {
        uint nn = i / BK4, kq = i - nn * BK4;
        ws[(b * BN + nn) * BKP + kq] = TILE_VEC(w_quad(n0 + nn, k0 + 4u * kq));
    }
}

void main() {
    const uint THREADS_N = BN / TN, THREADS_M = BM / TM;
    uint tiles_n = (pc.N + BN - 1u) / BN, tiles_m = (pc.M + BM - 1u) / BM;
    uint tile = linear_group_id();
    if (tile >= tiles_n * tiles_m) return;  // uniform over the workgroup
    uint m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
    uint tx = gl_LocalInvocationID.x % THREADS_N, ty = gl_LocalInvocationID.x / THREADS_N;

    [[unroll]] for (uint i = 0u; i < TM * TN; i++) acc[i] = 0.0;
#ifdef DIRECT_SG
    // The TM rows of x an invocation reads are the same for the lanes of a
    // subgroup (they share ty when lanes <= THREADS_N): lane l loads row
    // l % TM once and the rows reach every lane by broadcast (8 loads -> 1).
    uint lanes = subgroupAdd(1u);
    bool sg_rows = DIRECT && TM == 8u && lanes >= 8u && lanes <= THREADS_N && THREADS_N % lanes == 0u;
    if (sg_rows) {
        uint lane = gl_SubgroupInvocationID;
        for (uint k = 0u; k < pc.K; k += 4u) {
            vec4 wv[TN];
            [[unroll]] for (uint j = 0u; j < TN; j++) wv[j] = w_quad(n0 + tx + j * THREADS_N, k);
            vec4 mine = x_quad(m0 + ty + (lane % 8u) * THREADS_M, k);
            vec4 xr[8];
            xr[0] = subgroupBroadcast(mine, 0u); xr[1] = subgroupBroadcast(mine, 1u);
            xr[2] = subgroupBroadcast(mine, 2u); xr[3] = subgroupBroadcast(mine, 3u);
            xr[4] = subgroupBroadcast(mine, 4u); xr[5] = subgroupBroadcast(mine, 5u);
            xr[6] = subgroupBroadcast(mine, 6u); xr[7] = subgroupBroadcast(mine, 7u);
            [[unroll]] for (uint i = 0u; i < 8u; i++) {
                vec4 xv = xr[i];
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    float a = acc[i * TN + j];  // k order: .x .y .z .w
                    a += xv.x * wv[j].x;
                    a += xv.y * wv[j].y;
                    a += xv.z * wv[j].z;
                    a += xv.w * wv[j].w;
                    acc[i * TN + j] = a;
                }
            }
        }
    }
#else
    const bool sg_rows = false;
#endif
    if (DIRECT && !sg_rows) {
        for (uint k = 0u; k < pc.K; k += 4u) {
            vec4 wv[TN];  // (F16_MATH: rounded to half as when staged)
            [[unroll]] for (uint j = 0u; j < TN; j++) wv[j] = vec4(TILE_VEC(w_quad(n0 + tx + j * THREADS_N, k)));
            [[unroll]] for (uint i = 0u; i < TM; i++) {
                vec4 xv = vec4(TILE_VEC(x_quad(m0 + ty + i * THREADS_M, k)));
                [[unroll]] for (uint j = 0u; j < TN; j++) {
                    float a = acc[i * TN + j];  // k order: .x .y .z .w
                    a += xv.x * wv[j].x;
                    a += xv.y * wv[j].y;
                    a += xv.z * wv[j].z;
                    a += xv.w * wv[j].w;
                    acc[i * TN + j] = a;
                }
            }
        }
    }
    if (!DIRECT) {
        // Double buffering: slice t is read from buffer t % 2 while slice t + 1
        // is staged into the other; the barrier after slice t both publishes
        // slice t + 1 and frees buffer t % 2 for slice t + 2.
        uint slices = (pc.K + BK - 1u) / BK;
        load_tiles(m0, n0, 0u, 0u);
        barrier();
        for (uint t = 0u; t < slices; t++) {
            uint b = t & 1u;
            if (t + 1u < slices) load_tiles(m0, n0, (t + 1u) * BK, b ^ 1u);
            [[unroll]] for (uint kq = 0u; kq < BK4; kq++) {
                vec4 wv[TN];
                [[unroll]] for (uint j = 0u; j < TN; j++) wv[j] = vec4(ws[(b * BN + tx + j * THREADS_N) * BKP + kq]);
                [[unroll]] for (uint i = 0u; i < TM; i++) {
                    vec4 xv = vec4(xs[(b * BM + ty + i * THREADS_M) * BKP + kq]);
                    [[unroll]] for (uint j = 0u; j < TN; j++) {
                        float a = acc[i * TN + j];  // k order: .x .y .z .w
                        a += xv.x * wv[j].x;
                        a += xv.y * wv[j].y;
                        a += xv.z * wv[j].z;
                        a += xv.w * wv[j].w;
                        acc[i * TN + j] = a;
                    }
                }
            }
            barrier();
        }
    }
    [[unroll]] for (uint i = 0u; i < TM; i++) {
        uint m = m0 + ty + i * THREADS_M;
        if (m >= pc.M) continue;
        [[unroll]] for (uint j = 0u; j < TN; j++) {
            uint n = n0 + tx + j * THREADS_N;
            if (n >= pc.N) continue;
            uint o = m * pc.ldy + pc.y_col0 + n;
            y[o] = (pc.accumulate != 0u ? y[o] : 0.0) + acc[i * TN + j];
        }
    }
}
