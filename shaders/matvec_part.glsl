// matvec_part.glsl: matvec.comp's code for one weight matrix MAT (0, 1, 2)
// with its bindings W_BINDING / Y_BINDING and sizes P_N, P_LDY, P_COL0
// (matvec_parts.glsl); included once (single product) or once per matrix
// (MULTI). Names of this copy end in MAT (PN).
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(Wb_) { uint PN(w_)[]; };
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(W4b_) { uvec4 PN(w4_)[]; };
layout(std430, set = 0, binding = Y_BINDING) buffer PN(Yb_) { float PN(y_)[]; };

uint PN(w_word)(uint i) { return PN(w_)[i]; }

vec4 PN(w_vec4_f32)(uint i) { return uintBitsToFloat(PN(w4_)[i]); }

void PN(accumulate_vec4)(uint row0) {
#if WTYPE == 0
    uint k4 = pc.K / 4u;
    for (uint i = LANE; i < k4; i += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= P_N) break;
            vec4 wv = PN(w_vec4_f32)((row0 + r) * k4 + i);
            for (uint m = 0u; m < MCOLS; m++) acc[r * MCOLS + m] += dot(wv, x4[m * k4 + i]);
        }
    }
#else
    uint k8 = pc.K / 8u, k4 = pc.K / 4u;
    for (uint i = LANE; i < k8; i += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= P_N) break;
            uvec4 q = PN(w4_)[(row0 + r) * k8 + i];
            vec4 lo = vec4(decode_pair(q.x), decode_pair(q.y));
            vec4 hi = vec4(decode_pair(q.z), decode_pair(q.w));
            for (uint m = 0u; m < MCOLS; m++)
                acc[r * MCOLS + m] += dot(lo, x4[m * k4 + 2u * i]) + dot(hi, x4[m * k4 + 2u * i + 1u]);
        }
    }
#endif
}

void PN(accumulate_scalar)(uint row0) {
    for (uint k = LANE; k < pc.K; k += LANES) {
        for (uint r = 0u; r < ROWS; r++) {
            if (row0 + r >= P_N) break;
            float wv = DECODE_ELEMENT(PN(w_word), (row0 + r) * pc.K + k);
            for (uint m = 0u; m < MCOLS; m++) acc[r * MCOLS + m] += wv * x[m * pc.K + k];
        }
    }
}

#include "matvec_store_part.glsl"

// The rows of workgroup `wg` of this matrix (numbered as in its single dispatch).
void PN(run_rows)(uint wg) {
    uint wg_row0 = wg * ROWS_PER_WG;
    if (wg_row0 >= P_N) return;  // uniform over the workgroup
    for (uint rb = GROUP_ID * ROWS; rb < ROWS_PER_WG; rb += NUM_GROUPS * ROWS) {
        for (uint v = 0u; v < ROWS * MCOLS; v++) acc[v] = 0.0;
        if (VEC4) PN(accumulate_vec4)(wg_row0 + rb);
        else PN(accumulate_scalar)(wg_row0 + rb);
        PN(reduce_and_store)(wg_row0 + rb);
    }
}
