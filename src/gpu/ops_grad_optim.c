/* ops_grad_optim.c: records the optimizer on the device (vks_ops_grad.h):
 * the global gradient norm and clip scale in two deterministic levels, and
 * the AdamW step reading that scale from device memory. */
#include "ops_internal.h"
#include "vkswarm/vks_ops_grad.h"

#include <math.h>

/* Elements each invocation of grad_squares adds (spec constant ITEMS): a
 * workgroup's chunk is wg_row * GRAD_SQUARES_ITEMS elements. */
#define GRAD_SQUARES_ITEMS 32u

static uint64_t squares_chunk(const vks_ops *o) { return (uint64_t)o->wg_row * GRAD_SQUARES_ITEMS; }

uint32_t vks_op_grad_squares_partials(const vks_ops *o, uint64_t n) {
    if (!o) return 0;
    uint64_t p = ceil_div(n, squares_chunk(o));
    return p > UINT32_MAX ? UINT32_MAX : (uint32_t)p;
}

int vks_op_grad_squares(vks_ops *o, vks_cmd *c, vks_binding g, uint32_t n, vks_binding partials, uint32_t first) {
    const char *op = "grad_squares";
    if (!o || !c || !n) return vks_set_error(VKS_ERR_ARG, "%s: bad arguments (n=%u)", op, n);
    uint32_t groups = vks_op_grad_squares_partials(o, n);
    int rc = vks_ops_check_range(op, "g", g, n, 4);
    if (!rc) rc = vks_ops_check_range(op, "partials", partials, (uint64_t)first + groups, 4);
    if (rc) return rc;
    uint32_t push[] = {n, first};
    uint32_t spec[] = {o->wg_row, GRAD_SQUARES_ITEMS};
    vks_binding b[] = {g, partials};
    return vks_ops_dispatch(o, c, "grad_squares", spec, 2, b, 2, push, sizeof push, groups, op);
}

int vks_op_clip_scale(vks_ops *o, vks_cmd *c, vks_binding partials, uint32_t n_partials, float max_norm,
                      vks_binding out) {
    const char *op = "clip_scale";
    if (!o || !c || !n_partials || isnan(max_norm))
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments (n_partials=%u)", op, n_partials);
    int rc = vks_ops_check_range(op, "partials", partials, n_partials, 4);
    if (!rc) rc = vks_ops_check_range(op, "out", out, 2, 4);
    if (rc) return rc;
    struct { uint32_t n; float max_norm; } push = {n_partials, max_norm};
    uint32_t spec[] = {o->wg_row};
    vks_binding b[] = {partials, out};
    return vks_ops_dispatch(o, c, "clip_scale", spec, 1, b, 2, &push, sizeof push, 1, op);
}

int vks_op_grad_clip(vks_ops *o, vks_cmd *c, const vks_binding *grads, const uint32_t *counts, int n_grads,
                     vks_binding partials, float max_norm, vks_binding out) {
    if (!o || !c || !grads || !counts || n_grads <= 0)
        return vks_set_error(VKS_ERR_ARG, "grad_clip: bad arguments");
    uint64_t first = 0;
    for (int i = 0; i < n_grads; i++) {
        if (first + vks_op_grad_squares_partials(o, counts[i]) > UINT32_MAX)
            return vks_set_error(VKS_ERR_ARG, "grad_clip: more than 2^32 partial sums");
        int rc = vks_op_grad_squares(o, c, grads[i], counts[i], partials, (uint32_t)first);
        if (rc) return rc;
        first += vks_op_grad_squares_partials(o, counts[i]);
    }
    return vks_op_clip_scale(o, c, partials, (uint32_t)first, max_norm, out);
}

int vks_op_adamw(vks_ops *o, vks_cmd *c, vks_binding params, vks_binding grads, vks_binding m, vks_binding v,
                 uint32_t n, const vks_adamw_params *h, int t, vks_binding scale) {
    const char *op = "adamw";
    if (!o || !c || !h || !n || t < 1 || !(h->beta1 >= 0.0 && h->beta1 < 1.0) ||
        !(h->beta2 >= 0.0 && h->beta2 < 1.0) || !(h->eps > 0.0) || !isfinite(h->lr) || !isfinite(h->weight_decay))
        return vks_set_error(VKS_ERR_ARG, "%s: bad arguments (n=%u, step %d)", op, n, t);
    static const char *const what[] = {"params", "grads", "m", "v"};
    vks_binding b[] = {params, grads, m, v, scale};
    for (int i = 0; i < 4; i++) {
        int rc = vks_ops_check_range(op, what[i], b[i], n, 4);
        if (rc) return rc;
    }
    int rc = vks_ops_check_range(op, "scale", scale, 1, 4);
    if (rc) return rc;
    struct {
        uint32_t n;
        float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, eps, weight_decay, c1, c2;
    } push = {n,
              (float)h->lr,
              (float)h->beta1,
              (float)(1.0 - h->beta1),
              (float)h->beta2,
              (float)(1.0 - h->beta2),
              (float)h->eps,
              (float)h->weight_decay,
              (float)(1.0 - pow(h->beta1, t)),
              (float)(1.0 - pow(h->beta2, t))};
    uint32_t spec[] = {o->wg_elementwise};
    return vks_ops_dispatch(o, c, "adamw", spec, 1, b, 5, &push, sizeof push, ceil_div(n, o->wg_elementwise), op);
}
