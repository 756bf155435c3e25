/* ops_grad_linear.c: records the backward of the linear ops (matmul, dX
 * through weights of any type, dW in f32; embedding, bias) as kernel
 * dispatches (vks_ops_grad.h), and builds the embedding backward's token
 * index on the host. */
#include "ops_internal.h"

#include <stdio.h>
#include <string.h>
#include "vkswarm/vks_ops_grad.h"
#include "vkswarm/vks_quant.h"

#include <stdlib.h>

/* ---- matmul backward: C[I, J] (+)= sum_r A(i, r) B(j, r), matmul_grad.comp ---- */

typedef struct {
    uint32_t I, J, R, lda, a_col0, ldb, accumulate;
} matmul_grad_push;

static bool aligned16(vks_binding b) { return b.offset % 16 == 0; }

/* The checks both directions share: sizes, the dy window, dy's range. */
static int check_dy(const char *op, vks_binding dy, uint32_t ldy, uint32_t dy_col0, uint32_t M, uint32_t N,
                    uint32_t K) {
    if (!M || !N || !K || (uint64_t)dy_col0 + N > ldy)
        return vks_set_error(VKS_ERR_ARG, "%s: bad sizes M=%u N=%u K=%u ldy=%u dy_col0=%u", op, M, N, K, ldy,
                             dy_col0);
    return vks_ops_check_range(op, "dy", dy, (uint64_t)(M - 1) * ldy + dy_col0 + N, 4);
}

/* Records matmul_grad_<dir> over the [I, J] output in tiles of the forward's
 * size. On CPU drivers (mm_direct) with subgroup broadcasts both directions
 * take the _dsg variant (A rows broadcast over a subgroup, as the forward's
 * matmul_f32_dsg); without them dX reads plainly and dW stays staged (the
 * shader says why). */
static int record_matmul_grad(vks_ops *o, vks_cmd *c, const char *dir, vks_dtype b_type, vks_binding a,
                              vks_binding b, vks_binding out, const matmul_grad_push *p, bool vec4,
                              const char *label) {
    uint32_t wg = (o->mm_bm / o->mm_tm) * (o->mm_bn / o->mm_tn);
    bool dsg = o->mm_direct && o->info.subgroup_arith && o->info.subgroup_ballot && o->mm_tm == 8;
    uint32_t direct = (dsg || strcmp(dir, "dx") == 0) ? o->mm_direct : 0;
    char name[40], type[8] = "";
    if (b_type != VKS_DTYPE_F32) snprintf(type, sizeof type, "_%s", vks_dtype_name(b_type)); /* checked: has a kernel */
    snprintf(name, sizeof name, "matmul_grad_%s%s%s", dir, type, dsg ? "_dsg" : "");
    uint32_t spec[] = {wg, o->mm_bm, o->mm_bn, o->mm_bk, o->mm_tm, o->mm_tn, vec4, direct};
    vks_binding bind[] = {a, b, out};
    uint64_t tiles = ceil_div(p->I, o->mm_bm) * ceil_div(p->J, o->mm_bn);
    return vks_ops_dispatch(o, c, name, spec, 8, bind, 3, p, sizeof *p, tiles, label);
}

/* W's type: a kernel for it, block types K whole blocks, N * K indexable with
 * 32 bits (as the forward, vks_op_matmul) and W 16-byte aligned (whole
 * blocks are read with vector loads). */
static int check_weight_type(const char *op, vks_binding W, vks_dtype dtype, uint32_t N, uint32_t K) {
    if (!vks_ops_dtype_suffix(dtype))
        return vks_set_error(VKS_ERR_ARG, "%s: no kernel for %s weights", op, vks_dtype_name(dtype));
    if (vks_ops_is_block_type(dtype)) {
        if (K % vks_dtype_block_elems(dtype) || (uint64_t)N * K > UINT32_MAX)
            return vks_set_error(VKS_ERR_ARG, "%s: K=%u is not a whole number of %s blocks (or N*K exceeds 2^32)",
                                 op, K, vks_dtype_name(dtype));
        if (!aligned16(W)) return vks_set_error(VKS_ERR_ARG, "%s: %s needs a 16-byte aligned W", op, vks_dtype_name(dtype));
    }
    return vks_ops_check_weights(op, "W", W, dtype, N, K);
}

int vks_op_matmul_backward_x(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t ldy, uint32_t dy_col0,
                             vks_binding W, vks_dtype dtype, vks_binding dx, uint32_t M, uint32_t N, uint32_t K,
                             bool accumulate) {
    const char *op = "matmul_backward_x";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_dy(op, dy, ldy, dy_col0, M, N, K);
    if (!rc) rc = check_weight_type(op, W, dtype, N, K);
    if (!rc) rc = vks_ops_check_range(op, "dx", dx, (uint64_t)M * K, 4);
    if (rc) return rc;
    /* A = dy read along its rows (r = n), B = W read down its columns (j = k) */
    matmul_grad_push p = {M, K, N, ldy, dy_col0, K, accumulate ? 1u : 0u};
    bool vec4 = N % 4 == 0 && ldy % 4 == 0 && dy_col0 % 4 == 0 && K % 4 == 0 && aligned16(dy) && aligned16(W);
    return record_matmul_grad(o, c, "dx", dtype, dy, W, dx, &p, vec4, op);
}

int vks_op_matmul_backward_w(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t ldy, uint32_t dy_col0,
                             vks_binding x, vks_binding dW, uint32_t M, uint32_t N, uint32_t K, bool accumulate) {
    const char *op = "matmul_backward_w";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_dy(op, dy, ldy, dy_col0, M, N, K);
    if (!rc) rc = vks_ops_check_range(op, "x", x, (uint64_t)M * K, 4);
    if (!rc) rc = vks_ops_check_range(op, "dW", dW, (uint64_t)N * K, 4);
    if (rc) return rc;
    /* A = dy read down its columns (i = n, r = m), B = x down its columns (j = k) */
    matmul_grad_push p = {N, K, M, ldy, dy_col0, K, accumulate ? 1u : 0u};
    bool vec4 = N % 4 == 0 && ldy % 4 == 0 && dy_col0 % 4 == 0 && K % 4 == 0 && aligned16(dy) && aligned16(x);
    return record_matmul_grad(o, c, "dw", VKS_DTYPE_F32, dy, x, dW, &p, vec4, op);
}

/* ---- embedding backward ---- */

typedef struct {
    uint32_t token, row;
} token_row;

static int by_token_then_row(const void *a, const void *b) {
    const token_row *x = a, *y = b;
    if (x->token != y->token) return x->token < y->token ? -1 : 1;
    return x->row < y->row ? -1 : x->row > y->row;
}

/* index = [tok[u] (R words)] [start[u] (R + 1 words)] [row[i] (R words)]:
 * shaders/embed_grad.comp. Unused tok/start words are zero. */
int vks_op_embed_backward_index(const uint32_t *tokens, uint32_t R, uint32_t V, uint32_t *index,
                                uint32_t *n_unique) {
    if (!tokens || !index || !n_unique || !R || !V)
        return vks_set_error(VKS_ERR_ARG, "embed_backward_index: bad arguments");
    for (uint32_t r = 0; r < R; r++)
        if (tokens[r] >= V)
            return vks_set_error(VKS_ERR_ARG, "embed_backward_index: token %u at row %u is outside the "
                                 "vocabulary of %u", tokens[r], r, V);
    token_row *pairs = malloc((size_t)R * sizeof *pairs);
    if (!pairs) return vks_set_error(VKS_ERR_NOMEM, "embed_backward_index: out of host memory");
    for (uint32_t r = 0; r < R; r++) pairs[r] = (token_row){tokens[r], r};
    qsort(pairs, R, sizeof *pairs, by_token_then_row);
    uint32_t *tok = index, *start = index + R, *row = index + 2 * (size_t)R + 1;
    for (size_t i = 0; i < 2 * (size_t)R + 1; i++) index[i] = 0;
    uint32_t u = 0;
    for (uint32_t i = 0; i < R; i++) {
        if (i == 0 || pairs[i].token != pairs[i - 1].token) {
            tok[u] = pairs[i].token;
            start[u++] = i;
        }
        row[i] = pairs[i].row;
    }
    start[u] = R;
    free(pairs);
    *n_unique = u;
    return VKS_OK;
}

int vks_op_embed_backward(vks_ops *o, vks_cmd *c, vks_binding index, uint32_t n_unique, vks_binding dout,
                          uint32_t R, uint32_t D, vks_binding dtable, uint32_t row0, uint32_t table_rows) {
    const char *op = "embed_backward";
    if (!o || !c || !R || !D || !n_unique || n_unique > R || !table_rows)
        return vks_set_error(VKS_ERR_ARG, "%s: bad sizes R=%u D=%u n_unique=%u table_rows=%u", op, R, D, n_unique,
                             table_rows);
    int rc = vks_ops_check_range(op, "index", index, VKS_EMBED_GRAD_INDEX_WORDS(R), 4);
    if (!rc) rc = vks_ops_check_range(op, "dout", dout, (uint64_t)R * D, 4);
    if (!rc) rc = vks_ops_check_range(op, "dtable", dtable, (uint64_t)table_rows * D, 4);
    if (rc) return rc;
    uint32_t push[] = {n_unique, R, D, row0, table_rows};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {index, dout, dtable};
    return vks_ops_dispatch(o, c, "embed_grad", spec, 1, b, 3, push, sizeof push,
                            ceil_div((uint64_t)n_unique * D, o->wg_elementwise), op);
}

/* ---- bias backward ---- */

int vks_op_bias_backward(vks_ops *o, vks_cmd *c, vks_binding dy, uint32_t R, uint32_t D, vks_binding db,
                         bool accumulate) {
    const char *op = "bias_backward";
    if (!o || !c || !R || !D) return vks_set_error(VKS_ERR_ARG, "%s: bad sizes R=%u D=%u", op, R, D);
    int rc = vks_ops_check_range(op, "dy", dy, (uint64_t)R * D, 4);
    if (!rc) rc = vks_ops_check_range(op, "db", db, D, 4);
    if (rc) return rc;
    uint32_t push[] = {R, D, accumulate ? 1u : 0u};
    uint32_t spec[] = {o->wg_elementwise};
    vks_binding b[] = {dy, db};
    return vks_ops_dispatch(o, c, "bias_grad", spec, 1, b, 2, push, sizeof push, ceil_div(D, o->wg_elementwise),
                            op);
}
