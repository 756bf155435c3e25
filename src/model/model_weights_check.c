/* model_weights_check.c: checks run once on a freshly bound model.
 *  - Every weight is finite (one pass over the bytes, exponent bits only:
 *    f32/f16/bf16 elements, the f16 scales of block formats). A NaN or Inf
 *    weight otherwise turns every logit into NaN and the sampler into <unk>.
 *  - Every tensor of the file is used (vks_model_check_unused): a tensor the
 *    loader does not consume (an extra layer, an lm_head beside tied
 *    embeddings, a bias of an unknown kind) means the config and the weights
 *    disagree, and running anyway gives wrong results. */
#include "model/model_internal.h"
#include "vkswarm/vks_quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool f32_bits_finite(const unsigned char *p) {
    uint32_t u;
    memcpy(&u, p, 4);
    return (u & 0x7f800000u) != 0x7f800000u;
}

static bool f16_bits_finite(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7c00u) != 0x7c00u;
}

static bool bf16_bits_finite(const unsigned char *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return (h & 0x7f80u) != 0x7f80u;
}

/* Byte offsets of the f16 scales inside one block of t (n of them). */
static int block_scale_offsets(vks_dtype t, size_t off[2]) {
    switch (t) {
    case VKS_DTYPE_Q8_0:
    case VKS_DTYPE_Q4_0: off[0] = 0; return 1;           /* d */
    case VKS_DTYPE_Q4_K: off[0] = 0; off[1] = 2; return 2; /* d, dmin */
    case VKS_DTYPE_Q6_K: off[0] = 208; return 1;          /* d after ql, qh, scales */
    default: return 0;
    }
}

/* Index of the first non-finite element (or block) of t, or -1. */
static int64_t first_non_finite(const vks_tensor *t) {
    const unsigned char *b = t->data;
    size_t be = vks_dtype_block_elems(t->dtype), bb = vks_dtype_block_bytes(t->dtype);
    if (be == 0 || bb == 0) return -1; /* unknown dtypes are refused by the shape checks */
    size_t n_blocks = (size_t)t->rows * (size_t)t->cols / be;
    size_t off[2];
    int n_scales = block_scale_offsets(t->dtype, off);
    for (size_t i = 0; i < n_blocks; i++) {
        const unsigned char *p = b + i * bb;
        bool ok = true;
        switch (t->dtype) {
        case VKS_DTYPE_F32: ok = f32_bits_finite(p); break;
        case VKS_DTYPE_F16: ok = f16_bits_finite(p); break;
        case VKS_DTYPE_BF16: ok = bf16_bits_finite(p); break;
        default:
            for (int s = 0; s < n_scales; s++) ok = ok && f16_bits_finite(p + off[s]);
        }
        if (!ok) return (int64_t)(i * be);
    }
    return -1;
}

static int check_one(const char *what, const char *name, int layer, const vks_tensor *t) {
    if (!t->data) return VKS_OK;
    int64_t at = first_non_finite(t);
    if (at < 0) return VKS_OK;
    int64_t row = at / t->cols, col = at % t->cols;
    if (layer >= 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s of layer %d holds NaN or Inf (row %lld, column %lld)",
                             what, name, layer, (long long)row, (long long)col);
    return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s holds NaN or Inf (row %lld, column %lld)", what, name,
                         (long long)row, (long long)col);
}

int vks_model_check_finite(const vks_model *m, const char *what) {
    vks_schema_item *items = NULL;
    int n = 0, rc = vks_schema_list_alloc(&m->cfg, vks_model_has_bias(m), &items, &n);
    for (int i = 0; i < n && rc == VKS_OK; i++)
        rc = check_one(what, items[i].s->name, items[i].layer, vks_model_slot_const(m, &items[i]));
    free(items);
    return rc;
}

static void note_bound(const vks_tensor *t, const void **seen, int64_t *n) {
    if (t->data) seen[(*n)++] = t->data;
}

/* The data pointers of every tensor bound in m (at most cap). */
static int64_t bound_data(const vks_model *m, const void **seen, size_t cap) {
    int64_t n = 0;
    for (int l = -1; l < m->cfg.n_layers; l++) {
        int count = l < 0 ? VKS_MODEL_N_TENSORS : VKS_LAYER_N_TENSORS;
        for (int i = 0; i < count && (size_t)n < cap; i++) {
            if (l < 0 && i == VKS_T_classifier && m->cfg.shared_classifier) continue; /* tok_emb's data */
            note_bound(l < 0 ? vks_model_slot_const(m, &(vks_schema_item){.layer = -1, .index = i}) : &m->layers[l].t[i],
                       seen, &n);
        }
    }
    return n;
}

static bool pointer_in(const void *p, const void **set, int64_t n) {
    for (int64_t i = 0; i < n; i++)
        if (set[i] == p) return true;
    return false;
}

int vks_model_check_unused(const vks_model *m, const char *what, int64_t n_file, vks_file_tensor_fn tensor_at,
                           const void *ctx) {
    size_t cap = VKS_MODEL_N_TENSORS + VKS_LAYER_N_TENSORS * (size_t)m->cfg.n_layers;
    const void **seen = malloc(cap * sizeof *seen);
    if (!seen) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", what);
    int64_t n_bound = bound_data(m, seen, cap);
    int rc = VKS_OK;
    /* Names are unique in a file and every bound tensor is one of them, so
     * more file tensors than bound ones means at least one is unused. */
    for (int64_t i = 0; i < n_file && rc == VKS_OK; i++) {
        const char *name = NULL;
        const void *data = tensor_at(ctx, i, &name);
        if (!pointer_in(data, seen, n_bound))
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not used by the %s model the config describes "
                               "(an extra layer or an unsupported kind of weight)", what, name ? name : "?", m->arch);
    }
    if (rc == VKS_OK && n_file != n_bound)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: the file holds %lld tensors, the model uses %lld", what,
                           (long long)n_file, (long long)n_bound);
    free(seen);
    return rc;
}
