#version 450
#extension GL_EXT_control_flow_attributes : require
#ifdef DIRECT_SG
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_ballot : require
#endif
// Matmul backward:
//   C[i, j] = (accumulate ? C[i, j] : 0) + sum_{r < R} A(i, r) B(j, r)
// with C dense [I, J] and B(j, r) = b[r * ldb + j] (B read down its columns).
//   GRAD_DX: A(i, r) = a[i * lda + a_col0 + r]   dX[M,K] = dY[M,N] . W[N,K]
//            (I = M, J = K, R = N; a = dY, b = W)
//   GRAD_DW: A(i, r) = a[r * lda + a_col0 + i]   dW[N,K] = dY^T . X
//            (I = N, J = K, R = M; a = dY, b = X)
// dY may be a column window [a_col0, a_col0 + N) of rows of stride lda, as the
// forward writes its output (weights split into row chunks).
// GRAD_DX takes W in any weight type of weights.glsl (WTYPE: f32 masters for
// full fine-tuning; a frozen f16/bf16/q8_0/q4_0/q4_k base for LoRA): every
// read of b goes through b_along_j / b_col, which decode the elements in
// registers with weights.glsl's decoders (W is never expanded to f32 in
// memory). W is then the dense [N, K] matrix (ldb = K = J) of
// vks_op_pack_weights's layout; block types have K a whole number of blocks,
// so a quad of 4 consecutive k never leaves its block. Decoding is exact (the
// values equal vks_dequantize's), so the sums are those of the dequantized
// matrix, in the same order as for f32.
// The structure is matmul.comp's: BI x BJ output tiles, the reduction walked
// in BK slices staged in shared memory as vec4s of 4 consecutive r, TI x TJ
// outputs per invocation. An operand read down its columns is staged in 4x4
// blocks: 4 loads of 4 consecutive i (or j) at 4 consecutive r, transposed in
// registers, so it costs as many (vector) loads as one read along its rows.
// Every output sums r = 0..R-1 in order, one product at a time, then adds the
// old value once: deterministic, whatever the tile.
// Staged path (GPUs), as matmul.comp's: tiles padded to BK4 + 1 vec4s per row
// (the inner loop's vec4 reads free of bank conflicts; the transposed stores
// 4-way instead of 8-way) and double-buffered, one barrier per slice. Shared
// memory: 2 (BI + BJ)(BK/4 + 1) 16 bytes = 30 KiB at 64x128x16.
// local_size_x must equal (BI/TI) * (BJ/TJ); BI, BJ and BK multiples of 4.
#ifndef WTYPE
#define WTYPE 0  // f32 (GRAD_DW's operands are always f32)
#endif
#include "common.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BI = 64;
layout(constant_id = 2) const uint BJ = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TI = 4;
layout(constant_id = 5) const uint TJ = 4;
// I, J, R, lda, ldb, a_col0 multiples of 4 and a, b bound 16-byte aligned:
// stage with vector loads (a vector is then wholly inside or outside).
layout(constant_id = 6) const bool VEC4 = false;
// DIRECT (CPU drivers): no shared tiles or barriers, operands read straight
// from the buffers (matmul.comp says why); same products in the same order.
// Plain DIRECT is dX only: for dW both operands run down columns and every
// invocation loads its own TI rows of A, which made dW 20% slower than staged
// on lavapipe. The DIRECT_SG variants (subgroup broadcast of the A rows, as
// matmul.comp's) take both; dW falls back to the staged loop when the
// subgroup does not fit (fewer than 8 lanes, or lanes spanning two ty).
layout(constant_id = 7) const bool DIRECT = false;

layout(std430, set = 0, binding = 0) readonly buffer A { float a[]; };
layout(std430, set = 0, binding = 0) readonly buffer A4 { vec4 a4[]; };
layout(std430, set = 0, binding = 1) readonly buffer B { float b[]; };
layout(std430, set = 0, binding = 1) readonly buffer B4 { vec4 b4[]; };
#ifdef GRAD_DX
#define WEIGHT_COUNT (pc.R * pc.J)  // elements of W [N, K] (block types, weights.glsl)
#include "weights.glsl"
// The weight words of b for the other types (views of the same binding).
layout(std430, set = 0, binding = 1) readonly buffer BW { uint bw[]; };
layout(std430, set = 0, binding = 1) readonly buffer BW2 { uvec2 bw2[]; };
uint b_word(uint i) { return bw[i]; }
#endif
layout(std430, set = 0, binding = 2) buffer C { float c[]; };
layout(push_constant) uniform Push { uint I, J, R, lda, a_col0, ldb, accumulate; } pc;

const uint BK4 = BK / 4u;
const uint BKP = BK4 + 1u;  // padded row stride of the tiles, in vec4s
shared vec4 as_[2u * BI * BKP];  // buffer b: as_[(b BI + ii) BKP + kq] = A(i0 + ii, k0 + 4kq .. +3)
shared vec4 bs_[2u * BJ * BKP];  // buffer b: bs_[(b BJ + jj) BKP + kq] = B(j0 + jj, k0 + 4kq .. +3)
float acc[TI * TJ];

// ---- A: 4 consecutive values, zero outside [0, I) x [0, R) ----
#ifdef GRAD_DX
// A(i, r0 .. r0+3): along a row of a.
vec4 a_along_r(uint i, uint r0) {
    if (i >= pc.I || r0 >= pc.R) return vec4(0.0);
    uint e = i * pc.lda + pc.a_col0 + r0;
    if (VEC4) return a4[e >> 2];
    vec4 v = vec4(0.0);
    for (uint q = 0u; q < 4u && r0 + q < pc.R; q++) v[q] = a[e + q];
    return v;
}
#else
// A(i0 .. i0+3, r): along a row of a (A is a's transpose).
vec4 a_along_i(uint i0, uint r) {
    if (i0 >= pc.I || r >= pc.R) return vec4(0.0);
    uint e = r * pc.lda + pc.a_col0 + i0;
    if (VEC4) return a4[e >> 2];
    vec4 v = vec4(0.0);
    for (uint q = 0u; q < 4u && i0 + q < pc.I; q++) v[q] = a[e + q];
    return v;
}
#endif

// Element e of b: f32, or (GRAD_DX) a weight decoded in registers.
#if defined(GRAD_DX) && WTYPE != 0
float b_elem(uint e) { return DECODE_ELEMENT(b_word, e); }
#else
float b_elem(uint e) { return b[e]; }
#endif

// B(j0 .. j0+3, r): along a row of b (j0 a multiple of 4).
vec4 b_along_j(uint j0, uint r) {
    if (j0 >= pc.J || r >= pc.R) return vec4(0.0);
    uint e = r * pc.ldb + j0;
#if !defined(GRAD_DX) || WTYPE == 0
    if (VEC4) return b4[e >> 2];
#elif WTYPE == 1 || WTYPE == 2
    if (VEC4) {  // 4 halves = 2 words, 8-byte aligned (e % 4 == 0)
        uvec2 q = bw2[e >> 2];
        return vec4(decode_pair(q.x), decode_pair(q.y));
    }
#else
    return DECODE_QUAD(b_word, e);  // e % 4 == 0 and j0 + 3 < J (whole blocks)
#endif
    vec4 v = vec4(0.0);
    for (uint q = 0u; q < 4u && j0 + q < pc.J; q++) v[q] = b_elem(e + q);
    return v;
}

// Block (x, kq) of 4 columns x 4 reductions: q[c] holds column values at r = 4kq + c;
// its transpose goes to 4 consecutive shared rows, vec4 per row along r.
#ifdef GRAD_DX
// B(j, r .. r+3) down a column of b (zeros past J or R), for plain DIRECT.
vec4 b_col(uint j, uint r) {
    vec4 v = vec4(0.0);
    if (j >= pc.J) return v;
    for (uint q = 0u; q < 4u && r + q < pc.R; q++) v[q] = b_elem((r + q) * pc.ldb + j);
    return v;
}
#endif


#define STAGE_TRANSPOSED(tile, rows, first, k0, along, b)                              \
    for (uint blk = gl_LocalInvocationID.x; blk < (rows / 4u) * BK4; blk += WG_SIZE) { \
        uint xb = blk % (rows / 4u), kq = blk / (rows / 4u);                            \
        vec4 q0 = along(first + 4u * xb, k0 + 4u * kq);                                 \
        vec4 q1 = along(first + 4u * xb, k0 + 4u * kq + 1u);                           \
        vec4 q2 = along(first + 4u * xb, k0 + 4u * kq + 2u);                            \
        vec4 q3 = along(first + 4u * xb, k0 + 4u * kq + 3u);                            \
        [[unroll]] for (uint d = 0u; d < 4u; d++)                                       \
            tile[(b * rows + 4u * xb + d) * BKP + kq] = vec4(q0[d], q1[d], q2[d], q3[d]); \
    }

// Stages the reduction slice from k0 into buffer b.
void load_tiles(uint i0, uint j0, uint k0, uint b) {
#ifdef GRAD_DX
    for (uint t = gl_LocalInvocationID.x; t < BI * BK4; t += WG_SIZE) {
        uint ii = t / BK4, kq = t - ii * BK4;
        as_[(b * BI + ii) * BKP + kq] = a_along_r(i0 + ii, k0 + 4u * kq);
    }
#else
    STAGE_TRANSPOSED(as_, BI, i0, k0, a_along_i, b)
#endif
    STAGE_TRANSPOSED(bs_, BJ, j0, k0, b_along_j, b)
}

void main() {
    const uint THREADS_J = BJ / TJ, THREADS_I = BI / TI;
    uint tiles_j = (pc.J + BJ - 1u) / BJ, tiles_i = (pc.I + BI - 1u) / BI;
    uint tile = linear_group_id();
    if (tile >= tiles_j * tiles_i) return;  // uniform over the workgroup
    uint i0 = (tile / tiles_j) * BI, j0 = (tile % tiles_j) * BJ;
    uint tx = gl_LocalInvocationID.x % THREADS_J, ty = gl_LocalInvocationID.x / THREADS_J;

    [[unroll]] for (uint e = 0u; e < TI * TJ; e++) acc[e] = 0.0;
#ifdef DIRECT_SG
    // Outer products over r, 4 r at a time, with every operand read as vectors
    // (lavapipe's cost is its number of load instructions, each a loop over
    // the lanes: a vector load costs about what a scalar one does):
    //  - columns in runs of 4 (j = jq * 4 * THREADS_J + 4 tx + c): B(j..j+3, r)
    //    is one vector load along a row of b, for each r;
    //  - the A values of an invocation are the same for every lane of its
    //    subgroup (they share ty when lanes <= THREADS_J): lane l loads one
    //    vec4 of them and subgroupBroadcast hands all 8 to every lane. dX: row
    //    ty + l * THREADS_I at r..r+3 (along a row of dY); dW: rows 8 ty +
    //    4 (l % 2) .. +3 at r + l / 2 (along a row of dY, A being its transpose).
    // Each output still adds its products one at a time in r order.
    uint lanes = subgroupAdd(1u);
    bool sg_rows = DIRECT && TI == 8u && TJ == 8u && lanes >= 8u && lanes <= THREADS_J && THREADS_J % lanes == 0u;
    if (sg_rows) {
        uint lane = gl_SubgroupInvocationID % 8u;
        for (uint k = 0u; k < pc.R; k += 4u) {
            vec4 bq[8];  // bq[rr * 2 + jq] = B(j .. j+3, k + rr), j = j0 + jq * 4 * THREADS_J + 4 tx
            [[unroll]] for (uint rr = 0u; rr < 4u; rr++)
                [[unroll]] for (uint jq = 0u; jq < 2u; jq++)
                    bq[rr * 2u + jq] = b_along_j(j0 + jq * 4u * THREADS_J + 4u * tx, k + rr);
#ifdef GRAD_DX
            vec4 mine = a_along_r(i0 + ty + lane * THREADS_I, k);
#else
            vec4 mine = a_along_i(i0 + 8u * ty + 4u * (lane % 2u), k + lane / 2u);
#endif
            vec4 ar[8];
            ar[0] = subgroupBroadcast(mine, 0u); ar[1] = subgroupBroadcast(mine, 1u);
            ar[2] = subgroupBroadcast(mine, 2u); ar[3] = subgroupBroadcast(mine, 3u);
            ar[4] = subgroupBroadcast(mine, 4u); ar[5] = subgroupBroadcast(mine, 5u);
            ar[6] = subgroupBroadcast(mine, 6u); ar[7] = subgroupBroadcast(mine, 7u);
            [[unroll]] for (uint rr = 0u; rr < 4u; rr++) {
                [[unroll]] for (uint i = 0u; i < 8u; i++) {
#ifdef GRAD_DX
                    float av = ar[i][rr];                 // A(ty + i THREADS_I, k + rr)
#else
                    float av = ar[rr * 2u + i / 4u][i % 4u];  // A(8 ty + i, k + rr)
#endif
                    [[unroll]] for (uint j = 0u; j < 8u; j++) acc[i * 8u + j] += av * bq[rr * 2u + j / 4u][j % 4u];
                }
            }
        }
    }
#else
    const bool sg_rows = false;
#endif
#ifdef GRAD_DX
    bool plain_direct = DIRECT && !sg_rows;
#else
    bool plain_direct = false;  // dW: staged unless the subgroup path ran
#endif
    bool staged = !sg_rows && !plain_direct;
#ifdef GRAD_DX
    if (plain_direct) {
        for (uint k = 0u; k < pc.R; k += 4u) {
            vec4 bv[TJ];
            [[unroll]] for (uint j = 0u; j < TJ; j++) bv[j] = b_col(j0 + tx + j * THREADS_J, k);
            [[unroll]] for (uint i = 0u; i < TI; i++) {
                vec4 av = a_along_r(i0 + ty + i * THREADS_I, k);
                [[unroll]] for (uint j = 0u; j < TJ; j++) {
                    float s = acc[i * TJ + j];  // r order: .x .y .z .w
                    s += av.x * bv[j].x;
                    s += av.y * bv[j].y;
                    s += av.z * bv[j].z;
                    s += av.w * bv[j].w;
                    acc[i * TJ + j] = s;
                }
            }
        }
    }
#endif
    // staged is uniform over the workgroup (every subgroup has the same lanes).
    // Double buffering as matmul.comp's: slice t read from buffer t % 2 while
    // slice t + 1 is staged into the other; one barrier per slice.
    if (staged) {
        uint slices = (pc.R + BK - 1u) / BK;
        load_tiles(i0, j0, 0u, 0u);
        barrier();
        for (uint t = 0u; t < slices; t++) {
            uint b = t & 1u;
            if (t + 1u < slices) load_tiles(i0, j0, (t + 1u) * BK, b ^ 1u);
            [[unroll]] for (uint kq = 0u; kq < BK4; kq++) {
                vec4 bv[TJ];
                [[unroll]] for (uint j = 0u; j < TJ; j++) bv[j] = bs_[(b * BJ + tx + j * THREADS_J) * BKP + kq];
                [[unroll]] for (uint i = 0u; i < TI; i++) {
                    vec4 av = as_[(b * BI + ty + i * THREADS_I) * BKP + kq];
                    [[unroll]] for (uint j = 0u; j < TJ; j++) {
                        float s = acc[i * TJ + j];  // r order: .x .y .z .w
                        s += av.x * bv[j].x;
                        s += av.y * bv[j].y;
                        s += av.z * bv[j].z;
                        s += av.w * bv[j].w;
                        acc[i * TJ + j] = s;
                    }
                }
            }
            barrier();
        }
    }
    [[unroll]] for (uint i = 0u; i < TI; i++) {
#ifdef GRAD_DX
        uint row = i0 + ty + i * THREADS_I;
#else
        uint row = sg_rows ? i0 + 8u * ty + i : i0 + ty + i * THREADS_I;
#endif
        if (row >= pc.I) continue;
        [[unroll]] for (uint j = 0u; j < TJ; j++) {
            uint col = sg_rows ? j0 + (j / 4u) * 4u * THREADS_J + 4u * tx + j % 4u : j0 + tx + j * THREADS_J;
            if (col >= pc.J) continue;
            uint o = row * pc.J + col;
            c[o] = (pc.accumulate != 0u ? c[o] : 0.0) + acc[i * TJ + j];
        }
    }
}
