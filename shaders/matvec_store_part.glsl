// matvec_store_part.glsl: the store and the lane-group reduction of one
// weight matrix's copy (PN), shared by matvec_part.glsl and
// matvec_q_part.glsl, which include it once per copy.
void PN(store)(uint row0, uint v, float s) {
    uint r = v / MCOLS, m = v - r * MCOLS;
    if (row0 + r >= P_N) return;
    uint o = m * P_LDY + P_COL0 + row0 + r;
    PN(y_)[o] = (pc.accumulate != 0u ? PN(y_)[o] : 0.0) + s;
}

// Sums acc over the lane group; the sums are stored by one lane.
void PN(reduce_and_store)(uint row0) {
#ifdef USE_SUBGROUP
    for (uint v = 0u; v < ROWS * MCOLS; v++) {
        float s = subgroupAdd(acc[v]);
        if (subgroupElect()) PN(store)(row0, v, s);
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
    for (uint v = t; v < ROWS * MCOLS; v += n) PN(store)(row0, v, red[v * n]);
#endif
}
