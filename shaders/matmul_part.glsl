// matmul_part.glsl: matmul.comp's code for one weight matrix MAT (0, 1, 2)
// with its bindings W_BINDING / Y_BINDING and sizes P_N, P_LDY, P_COL0;
// included once (single product) or once per matrix (MULTI, SWIGLU). Names of this
// copy end in MAT (PN). Element e of W, decoded, is PN(w_element)(e).
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(Wb_) { uint PN(w_)[]; };
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(W2b_) { uvec2 PN(w2_)[]; };
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(W4b_) { uvec4 PN(w4_)[]; };
layout(std430, set = 0, binding = Y_BINDING) buffer PN(Yb_) { float PN(y_)[]; };

uint PN(w_word)(uint i) { return PN(w_)[i]; }

float PN(w_element)(uint e) { return DECODE_ELEMENT(PN(w_word), e); }

// 4 consecutive decoded elements of row n of W from k (zero past N or K).
vec4 PN(w_quad)(uint n, uint k) {
    if (n >= P_N || k >= pc.K) return vec4(0.0);
    uint e = n * pc.K + k;
#if WTYPE == 0
    if (VEC4) return uintBitsToFloat(PN(w4_)[e >> 2]);
#elif WTYPE == 1 || WTYPE == 2
    if (VEC4) {
        uvec2 q = PN(w2_)[e >> 2];
        return vec4(decode_pair(q.x), decode_pair(q.y));
    }
#else
    return DECODE_QUAD(PN(w_word), e);  // K is a whole number of blocks: e % 4 == 0
#endif
    vec4 v = vec4(0.0);
    for (uint c = 0u; c < 4u && k + c < pc.K; c++) v[c] = PN(w_element)(e + c);
    return v;
}

// Stages the K slice from k0 into buffer b.
void PN(load_tiles)(uint m0, uint n0, uint k0, uint b) {
    for (uint i = gl_LocalInvocationID.x; i < BM * BK4; i += WG_SIZE) {
        uint mm = i / BK4, kq = i - mm * BK4;
        xs[(b * BM + mm) * BKP + kq] = TILE_VEC(x_quad(m0 + mm, k0 + 4u * kq));
    }
    for (uint i = gl_LocalInvocationID.x; i < BN * BK4; i += WG_SIZE) {
        uint nn = i / BK4, kq = i - nn * BK4;
        ws[(b * BN + nn) * BKP + kq] = TILE_VEC(PN(w_quad)(n0 + nn, k0 + 4u * kq));
    }
}

// The output tile `tile` of this matrix (numbered as in its single dispatch).
void PN(run_tile)(uint tile) {
    const uint THREADS_N = BN / TN, THREADS_M = BM / TM;
    uint tiles_n = (P_N + BN - 1u) / BN, tiles_m = (pc.M + BM - 1u) / BM;
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
            [[unroll]] for (uint j = 0u; j < TN; j++) wv[j] = PN(w_quad)(n0 + tx + j * THREADS_N, k);
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
            [[unroll]] for (uint j = 0u; j < TN; j++) wv[j] = vec4(TILE_VEC(PN(w_quad)(n0 + tx + j * THREADS_N, k)));
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
        PN(load_tiles)(m0, n0, 0u, 0u);
        barrier();
        for (uint t = 0u; t < slices; t++) {
            uint b = t & 1u;
            if (t + 1u < slices) PN(load_tiles)(m0, n0, (t + 1u) * BK, b ^ 1u);
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
            if (n >= P_N) continue;
            uint o = m * P_LDY + P_COL0 + n;
#if defined(SWIGLU) && MAT == 0
            // the value the single kernel would store (accumulate is 0)
            acc_gate[i * TN + j] = (pc.accumulate != 0u ? PN(y_)[o] : 0.0) + acc[i * TN + j];
#elif defined(SWIGLU)
            float g = acc_gate[i * TN + j];
            float u = (pc.accumulate != 0u ? PN(y_)[o] : 0.0) + acc[i * TN + j];
            PN(y_)[o] = g / (1.0 + exp(-g)) * u;  // elementwise.comp OP_SWIGLU
#else
            PN(y_)[o] = (pc.accumulate != 0u ? PN(y_)[o] : 0.0) + acc[i * TN + j];
#endif
        }
    }
}
