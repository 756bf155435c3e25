// matvec_parts.glsl: the per-matrix macros of matvec.comp and matvec_q.comp.
// Their per-matrix code (matvec_part.glsl, matvec_q_part.glsl) is included
// with MAT = 0 and, with MULTI (the *_multi variants, vks_op_matmul_multi),
// again with MAT = 1 and 2: up to 3 products of the same x,
// y_i[m, col0_i + n] (+)= sum_k x[m,k] W_i[n,k], in one dispatch. Names of
// matrix MAT's copy end in MAT (PN); the macros below expand where that copy
// is parsed. Bindings: x = 0; matrix i: W_i = 1 + 2i, y_i = 2 + 2i.
// MULTI push constants: M, K, accumulate, parts, N0..N2, ldy0..ldy2,
// col0_0..col0_2 (the single kernel: M, N, K, ldy, y_col0, accumulate).
// MATVEC_MAIN (matvec_main.glsl, after the copies) splits the workgroups:
// matrix 0's, then matrix 1's, then matrix 2's, each numbered as in its own
// single dispatch and running the single kernel's code, so every output has
// the bits of a dispatch of its own.
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define PN(name) CAT(name, MAT)
#define W_BINDING (1 + 2 * MAT)
#define Y_BINDING (2 + 2 * MAT)
#ifdef MULTI
#define P_N pc.CAT(N, MAT)
#define P_LDY pc.CAT(ldy, MAT)
#define P_COL0 pc.CAT(col0_, MAT)
#define PUSH_CONSTANTS uint M, K, accumulate, parts, N0, N1, N2, ldy0, ldy1, ldy2, col0_0, col0_1, col0_2;
#else
#define P_N pc.N
#define P_LDY pc.ldy
#define P_COL0 pc.y_col0
#define PUSH_CONSTANTS uint M, N, K, ldy, y_col0, accumulate;
#endif
