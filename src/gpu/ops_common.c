/* ops_common.c: the checked dispatch helpers every op file uses (ops_internal.h). */
#include "ops_internal.h"

#include <stdio.h>

/* A workgroup size near `target`: a multiple of the subgroup size, within limits. */
uint32_t vks_ops_pick_wg(const vks_device_info *info, uint32_t target) {
    uint32_t sg = info->subgroup_size ? info->subgroup_size : 1;
    uint32_t limit = info->max_workgroup_size_x ? info->max_workgroup_size_x : 128;
    if (target > limit) target = limit;
    uint32_t wg = round_down(target, sg);
    return wg ? wg : (sg <= limit ? sg : limit);
}

/* Bytes a binding exposes, or 0 when it is unusable. */
size_t vks_ops_binding_bytes(vks_binding b) {
    if (!b.buf) return 0;
    size_t size = vks_buffer_size(b.buf);
    if (b.offset >= size) return 0;
    if (b.range == 0) return size - b.offset;
    size_t end;
    if (!vks_add_size(b.offset, b.range, &end) || end > size) return 0;
    return b.range;
}

/* Checks that `b` holds at least count elements of elem_bytes (count may be
 * fractional for packed 16-bit types: bytes = ceil(count*elem_bytes/4)*4). */
int vks_ops_check_range(const char *op, const char *what, vks_binding b, uint64_t count,
                       uint32_t elem_bytes) {
    size_t need;
    if (!vks_mul_size((size_t)count, elem_bytes, &need))
        return vks_set_error(VKS_ERR_ARG, "%s: %s size overflows", op, what);
    need = (need + 3) / 4 * 4; /* kernels read whole 32-bit words */
    size_t have = vks_ops_binding_bytes(b);
    if (have == 0 || have < need)
        return vks_set_error(VKS_ERR_ARG, "%s: %s needs %zu bytes, binding has %zu", op, what, need,
                             have);
    /* kernels index with 32-bit element indices */
    if (need / 4 > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "%s: %s exceeds 2^32 words", op, what);
    return VKS_OK;
}

/* Checks that `b` holds a [rows, cols] weight matrix of dtype in the GPU layout. */
bool vks_ops_overlap(vks_binding a, vks_binding b) {
    if (!a.buf || a.buf != b.buf) return false;
    size_t a_end = a.offset + vks_ops_binding_bytes(a), b_end = b.offset + vks_ops_binding_bytes(b);
    return a.offset < b_end && b.offset < a_end;
}

int vks_ops_check_weights(const char *op, const char *what, vks_binding b, vks_dtype t, uint64_t rows,
                         uint64_t cols) {
    size_t bytes = vks_op_weight_bytes(t, rows, cols);
    if (bytes == 0)
        return vks_set_error(VKS_ERR_ARG, "%s: %s of %llu x %llu %s has no valid size", op, what,
                             (unsigned long long)rows, (unsigned long long)cols, vks_dtype_name(t));
    return vks_ops_check_range(op, what, b, bytes, 1);
}

/* Splits a linear workgroup count over x, y, z (kernels use the linear index). */
int vks_ops_grid(const vks_ops *o, const char *op, uint64_t groups, uint32_t g[3]) {
    uint64_t max_x = o->info.max_workgroup_count_x ? o->info.max_workgroup_count_x : 65535;
    if (groups == 0) return vks_set_error(VKS_ERR_ARG, "%s: empty dispatch", op);
    uint64_t gx = groups < max_x ? groups : max_x;
    uint64_t rest = ceil_div(groups, gx);
    uint64_t gy = rest < MIN_GROUP_COUNT_YZ ? rest : MIN_GROUP_COUNT_YZ;
    uint64_t gz = ceil_div(rest, gy);
    if (gz > MIN_GROUP_COUNT_YZ)
        return vks_set_error(VKS_ERR_ARG, "%s: %llu workgroups exceed the device grid", op,
                             (unsigned long long)groups);
    g[0] = (uint32_t)gx;
    g[1] = (uint32_t)gy;
    g[2] = (uint32_t)gz;
    return VKS_OK;
}

/* Looks up (or builds) a kernel and records one dispatch over `groups` workgroups. */
int vks_ops_dispatch(vks_ops *o, vks_cmd *c, const char *name, const uint32_t *spec, int n_spec,
                    const vks_binding *b, int n_bindings, const void *push, uint32_t push_bytes,
                    uint64_t groups, const char *label) {
    if (push_bytes > MAX_PUSH_BYTES || push_bytes % 4)
        return vks_set_error(VKS_ERR_ARG, "%s: push constants of %u bytes", name, push_bytes);
    uint32_t g[3] = {0, 0, 0};
    int rc = vks_ops_grid(o, label, groups, g);
    if (rc) return rc;
    vks_kernel *k;
    rc = vks_kernel_get(o->g, name, spec, n_spec, n_bindings, push_bytes, &k);
    if (rc) return rc;
    return vks_cmd_dispatch(c, k, b, n_bindings, push, push_bytes, g[0], g[1], g[2], label);
}

