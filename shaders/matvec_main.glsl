// matvec_main.glsl: main of matvec.comp and matvec_q.comp (see matvec_parts.glsl).
void main() {
#ifdef USE_SUBGROUP
    lanes_in_subgroup = subgroupAdd(1u);
#endif
    uint wg = linear_group_id();  // uniform over the workgroup
#ifdef MULTI
    uint g0 = (pc.N0 + ROWS_PER_WG - 1u) / ROWS_PER_WG;
    if (wg < g0) { run_rows0(wg); return; }
    wg -= g0;
    uint g1 = pc.parts > 1u ? (pc.N1 + ROWS_PER_WG - 1u) / ROWS_PER_WG : 0u;
    if (wg < g1) { run_rows1(wg); return; }
    wg -= g1;
    if (pc.parts > 2u) run_rows2(wg);  // bounds-checks its own rows
#else
    run_rows0(wg);
#endif
}
