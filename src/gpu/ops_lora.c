/* ops_lora.c: the LoRA linear, forward and backward (vks_ops_grad.h),
 * recorded as the matmul ops it is made of plus one scale. */
#include "ops_internal.h"

#include <math.h>
#include "vkswarm/vks_ops_grad.h"

/* Sizes, scale and the adapter's ranges; W is checked by the matmul ops. */
static int check_lora(const char *op, const vks_lora_linear *l, uint32_t M) {
    if (!l || !M || !l->in || !l->out || !l->rank || !isfinite(l->scale))
        return vks_set_error(VKS_ERR_ARG, "%s: bad sizes or scale (M=%u in=%u out=%u rank=%u)", op, M,
                             l ? l->in : 0, l ? l->out : 0, l ? l->rank : 0);
    int rc = vks_ops_check_range(op, "A", l->A, (uint64_t)l->rank * l->in, 4);
    if (!rc) rc = vks_ops_check_range(op, "B", l->B, (uint64_t)l->out * l->rank, 4);
    return rc;
}

/* VKS_ERR_ARG when `out` shares memory with any of the n bindings. */
static int check_apart(const char *op, const char *what, vks_binding out, const vks_binding *others, int n) {
    for (int i = 0; i < n; i++)
        if (vks_ops_overlap(out, others[i]))
            return vks_set_error(VKS_ERR_ARG, "%s: %s shares memory with another binding", op, what);
    return VKS_OK;
}

int vks_op_lora_forward(vks_ops *o, vks_cmd *c, const vks_lora_linear *l, vks_binding x, vks_binding z,
                        vks_binding y, uint32_t M, uint32_t ldy, uint32_t y_col0, bool accumulate,
                        vks_matmul_kind kind) {
    const char *op = "lora_forward";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_lora(op, l, M);
    if (!rc) rc = vks_ops_check_range(op, "z", z, (uint64_t)M * l->rank, 4);
    vks_binding others[] = {x, y, l->W, l->A, l->B};
    if (!rc) rc = check_apart(op, "z", z, others, 5);
    if (rc) return rc;
    rc = vks_op_matmul_kind(o, c, x, l->W, l->w_dtype, y, M, l->out, l->in, ldy, y_col0, accumulate, kind);
    if (!rc) rc = vks_op_matmul_kind(o, c, x, l->A, VKS_DTYPE_F32, z, M, l->rank, l->in, l->rank, 0, false, kind);
    if (!rc) rc = vks_op_scale(o, c, z, l->scale, M * l->rank);
    if (!rc) rc = vks_op_matmul_kind(o, c, z, l->B, VKS_DTYPE_F32, y, M, l->out, l->rank, ldy, y_col0, true, kind);
    return rc;
}

int vks_op_lora_backward(vks_ops *o, vks_cmd *c, const vks_lora_linear *l, vks_binding x, vks_binding z,
                         vks_binding dy, uint32_t ldy, uint32_t dy_col0, vks_binding dx, vks_binding dA,
                         vks_binding dB, vks_binding scratch, uint32_t M, bool accumulate_dx) {
    const char *op = "lora_backward";
    if (!o || !c) return vks_set_error(VKS_ERR_ARG, "%s: NULL argument", op);
    int rc = check_lora(op, l, M);
    uint64_t Mr = (uint64_t)M * l->rank;
    if (!rc) rc = vks_ops_check_range(op, "scratch", scratch, Mr, 4);
    vks_binding all[] = {x, z, dy, l->W, l->A, l->B, dx, dA, dB, scratch};
    const char *names[] = {"dx", "dA", "dB", "scratch"};
    for (int i = 0; !rc && i < 4; i++) {
        vks_binding out = all[6 + i];
        for (int j = 0; !rc && j < 10; j++)
            if (j != 6 + i) rc = check_apart(op, names[i], out, &all[j], 1);
    }
    if (rc) return rc;
    uint32_t in = l->in, out = l->out, r = l->rank;
    /* dB += dy^T z; g = scale dy B; dA += g^T x */
    rc = vks_op_matmul_backward_w(o, c, dy, ldy, dy_col0, z, dB, M, out, r, true);
    if (!rc) rc = vks_op_matmul_backward_x(o, c, dy, ldy, dy_col0, l->B, VKS_DTYPE_F32, scratch, M, out, r, false);
    if (!rc) rc = vks_op_scale(o, c, scratch, l->scale, (uint32_t)Mr);
    if (!rc) rc = vks_op_matmul_backward_w(o, c, scratch, r, 0, x, dA, M, r, in, true);
    if (rc || !dx.buf) return rc;
    /* dx (+)= dy W (W in its type), then += g A */
    rc = vks_op_matmul_backward_x(o, c, dy, ldy, dy_col0, l->W, l->w_dtype, dx, M, out, in, accumulate_dx);
    if (!rc) rc = vks_op_matmul_backward_x(o, c, scratch, r, 0, l->A, VKS_DTYPE_F32, dx, M, r, in, true);
    return rc;
}
