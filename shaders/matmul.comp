#version 450
// Prefill matrix product: y[m, y_col0 + n] = (accumulate ? y : 0) + sum_k x[m,k] W[n,k]
// Output tiles of BM x BN; K is walked in BK slices staged in shared memory
// (weights decoded to f32 once per slice). Each invocation computes TM x TN
// outputs, strided by BM/TM rows and BN/TN columns so that neighbouring
// invocations read neighbouring shared words and write neighbouring columns.
// local_size_x must equal (BM/TM) * (BN/TN).
#define WEIGHT_COUNT (pc.N * pc.K)  // elements of W (block types, weights.glsl)
#include "common.glsl"
#include "weights.glsl"
layout(local_size_x_id = 0) in;
layout(constant_id = 1) const uint BM = 64;
layout(constant_id = 2) const uint BN = 64;
layout(constant_id = 3) const uint BK = 16;
layout(constant_id = 4) const uint TM = 4;
layout(constant_id = 5) const uint TN = 4;

layout(std430, set = 0, binding = 0) readonly buffer X { float x[]; };
layout(std430, set = 0, binding = 1) readonly buffer W { uint w[]; };
layout(std430, set = 0, binding = 2) buffer Y { float y[]; };
layout(push_constant) uniform Push { uint M, N, K, ldy, y_col0, accumulate; } pc;

shared float xs[BK * BM];  // xs[kk * BM + mm]
shared float ws[BK * BN];  // ws[kk * BN + nn]
float acc[TM * TN];

uint w_word(uint i) { return w[i]; }

void load_tiles(uint m0, uint n0, uint k0) {
    for (uint i = gl_LocalInvocationID.x; i < BM * BK; i += WG_SIZE) {
        uint mm = i / BK, kk = i - mm * BK, m = m0 + mm, k = k0 + kk;
        xs[kk * BM + mm] = (m < pc.M && k < pc.K) ? x[m * pc.K + k] : 0.0;
    }
    for (uint i = gl_LocalInvocationID.x; i < BN * BK; i += WG_SIZE) {
        uint nn = i / BK, kk = i - nn * BK, n = n0 + nn, k = k0 + kk;
        ws[kk * BN + nn] = (n < pc.N && k < pc.K) ? DECODE_ELEMENT(w_word, n * pc.K + k) : 0.0;
    }
}

void main() {
    const uint THREADS_N = BN / TN, THREADS_M = BM / TM;
    uint tiles_n = (pc.N + BN - 1u) / BN, tiles_m = (pc.M + BM - 1u) / BM;
    uint tile = linear_group_id();
    if (tile >= tiles_n * tiles_m) return;  // uniform over the workgroup
    uint m0 = (tile / tiles_n) * BM, n0 = (tile % tiles_n) * BN;
    uint tx = gl_LocalInvocationID.x % THREADS_N, ty = gl_LocalInvocationID.x / THREADS_N;

    for (uint i = 0u; i < TM * TN; i++) acc[i] = 0.0;
    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        barrier();  // previous slice fully consumed
        load_tiles(m0, n0, k0);
        barrier();
        for (uint kk = 0u; kk < BK; kk++) {
            float wv[TN];
            for (uint j = 0u; j < TN; j++) wv[j] = ws[kk * BN + tx + j * THREADS_N];
            for (uint i = 0u; i < TM; i++) {
                float xv = xs[kk * BM + ty + i * THREADS_M];
                for (uint j = 0u; j < TN; j++) acc[i * TN + j] += xv * wv[j];
            }
        }
    }
    for (uint i = 0u; i < TM; i++) {
        uint m = m0 + ty + i * THREADS_M;
        if (m >= pc.M) continue;
        for (uint j = 0u; j < TN; j++) {
            uint n = n0 + tx + j * THREADS_N;
            if (n >= pc.N) continue;
            uint o = m * pc.ldy + pc.y_col0 + n;
            y[o] = (pc.accumulate != 0u ? y[o] : 0.0) + acc[i * TN + j];
        }
    }
}
