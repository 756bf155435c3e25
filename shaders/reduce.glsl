// reduce.glsl: workgroup reductions through shared memory (no subgroup
// features needed). Any workgroup size works; every invocation must call
// them (they contain barriers) and all get the result.
shared float red_f[WG_SIZE];

float workgroup_sum(float v) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();  // red_f may still be read by a previous reduction
    red_f[t] = v;
    barrier();
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u; len = half_n, half_n = (half_n + 1u) / 2u) {
        if (t < len - half_n) red_f[t] += red_f[t + half_n];
        barrier();
    }
    return red_f[0];
}

float workgroup_max(float v) {
    uint t = gl_LocalInvocationID.x, n = WG_SIZE;
    barrier();
    red_f[t] = v;
    barrier();
    for (uint half_n = (n + 1u) / 2u, len = n; len > 1u; len = half_n, half_n = (half_n + 1u) / 2u) {
        if (t < len - half_n) red_f[t] = max(red_f[t], red_f[t + half_n]);
        barrier();
    }
    return red_f[0];
}
