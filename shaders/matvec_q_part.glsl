// matvec_q_part.glsl: matvec_q.comp's code for one weight matrix MAT (0, 1,
// 2) with its bindings W_BINDING / Y_BINDING and sizes P_N, P_LDY, P_COL0
// (matvec_parts.glsl); included once (single product) or once per matrix
// (MULTI). Names of this copy end in MAT (PN).
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(Wb_) { uint PN(w_)[]; };
layout(std430, set = 0, binding = W_BINDING) readonly buffer PN(W4b_) { uvec4 PN(w4_)[]; };
layout(std430, set = 0, binding = Y_BINDING) buffer PN(Yb_) { float PN(y_)[]; };

#if WTYPE == 3 || WTYPE == 4
// Decodes unit `unit` (a block index in W) for row slot r.
void PN(decode_unit)(uint unit, uint r) {
    float d = block_scale(PN(w_)[SCALE0 + unit / 2u], unit);
    uint o = r * 8u;
    scale[r] = d;
#if WTYPE == 3
    offset[r] = 0.0;
    uvec4 a = PN(w4_)[2u * unit], b = PN(w4_)[2u * unit + 1u];
    q[o] = i8x4(a.x); q[o + 1u] = i8x4(a.y); q[o + 2u] = i8x4(a.z); q[o + 3u] = i8x4(a.w);
    q[o + 4u] = i8x4(b.x); q[o + 5u] = i8x4(b.y); q[o + 6u] = i8x4(b.z); q[o + 7u] = i8x4(b.w);
#else
    offset[r] = 8.0 * d;
    uvec4 a = PN(w4_)[unit];  // byte j: element j (low nibble), element j + 16 (high)
    q[o] = u4x4(a.x, 0u); q[o + 1u] = u4x4(a.y, 0u); q[o + 2u] = u4x4(a.z, 0u); q[o + 3u] = u4x4(a.w, 0u);
    q[o + 4u] = u4x4(a.x, 4u); q[o + 5u] = u4x4(a.y, 4u); q[o + 6u] = u4x4(a.z, 4u); q[o + 7u] = u4x4(a.w, 4u);
#endif
}
#else
// unit = sub-block index in W: block unit/8, sub-block s = unit%8, whose 32
// quants are nibble (s & 1) of the 32 bytes at quant byte 32*(s/2).
void PN(decode_unit)(uint unit, uint r) {
    uint blk = unit >> 3, s = unit & 7u, base = 36u * blk, o = r * 8u;
    vec2 dm = unpackHalf2x16(PN(w_)[base]);
    uvec2 scm = q4_k_scale_min(uvec3(PN(w_)[base + 1u], PN(w_)[base + 2u], PN(w_)[base + 3u]), s);
    scale[r] = dm.x * float(scm.x);
    offset[r] = dm.y * float(scm.y);
    uint v = 9u * blk + 1u + 2u * (s >> 1), shift = (s & 1u) * 4u;
    uvec4 a = PN(w4_)[v], b = PN(w4_)[v + 1u];
    q[o] = u4x4(a.x, shift); q[o + 1u] = u4x4(a.y, shift); q[o + 2u] = u4x4(a.z, shift); q[o + 3u] = u4x4(a.w, shift);
    q[o + 4u] = u4x4(b.x, shift); q[o + 5u] = u4x4(b.y, shift); q[o + 6u] = u4x4(b.z, shift); q[o + 7u] = u4x4(b.w, shift);
}
#endif

// Unit u (vec4 index 8u in an x row) of rows row0 .. row0 + nr - 1: each
// row's quants are decoded once, each x row is loaded once; the scale and
// offset apply per unit: sum w x = scale * sum q x - offset * sum x.
void PN(accumulate_unit)(uint row0, uint nr, uint u) {
    uint units = pc.K / 32u;
    // Loops run to the constant ROWS (rows past nr repeat row 0) so that the
    // compiler can unroll them and keep q[] in registers.
    for (uint r = 0u; r < ROWS; r++) PN(decode_unit)((row0 + (r < nr ? r : 0u)) * units + u, r);
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

#include "matvec_store_part.glsl"

// The rows of workgroup `wg` of this matrix (numbered as in its single dispatch).
void PN(run_rows)(uint wg) {
    uint wg_row0 = wg * ROWS_PER_WG;
    if (wg_row0 >= P_N) return;  // uniform over the workgroup
    uint units = pc.K / 32u;
    for (uint rb = GROUP_ID * ROWS; rb < ROWS_PER_WG; rb += NUM_GROUPS * ROWS) {
        uint row0 = wg_row0 + rb;
        for (uint v = 0u; v < ROWS * MCOLS; v++) acc[v] = 0.0;
        uint nr = min(ROWS, P_N - min(row0, P_N));
        for (uint u = LANE; nr > 0u && u < units; u += LANES) PN(accumulate_unit)(row0, nr, u);
        PN(reduce_and_store)(row0);
    }
}
