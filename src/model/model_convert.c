/* model_convert.c: format-independent model transforms for the writers:
 * an owned f32 copy (dequantized) in a chosen RoPE row order, and checks for
 * tensors that readers bind out of files. */
#include "model/model_internal.h"
#include "vkswarm/vks_quant.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Source row for destination row r of a q/k matrix when changing RoPE order.
 * Adjacent pairs are (2i, 2i+1), half-split pairs are (i, i + head_dim/2);
 * llama.cpp's converter maps HF row j*half + i to row 2i + j. */
int64_t vks_rope_src_row(int64_t r, int head_dim, int from_mode, int to_mode) {
    if (from_mode == to_mode) return r;
    int64_t head = r / head_dim, k = r % head_dim, half = head_dim / 2, src;
    if (to_mode == VKS_ROPE_ADJACENT) src = (k % 2) * half + k / 2; /* dst 2i+j <- src j*half+i */
    else src = 2 * (k % half) + k / half;                            /* dst j*half+i <- src 2i+j */
    return head * head_dim + src;
}

/* Dequantizes row `row` of t into dst[cols]. */
void vks_tensor_row_f32(const vks_tensor *t, int64_t row, float *dst) {
    uint64_t row_bytes = 0;
    vks_dtype_row_bytes(t->dtype, (uint64_t)t->cols, &row_bytes);
    const uint8_t *src = (const uint8_t *)t->data + (size_t)row * (size_t)row_bytes;
    vks_dequantize(t->dtype, src, dst, (size_t)t->cols);
}

/* Copies src into the f32 tensor dst (same shape), permuting rows when the
 * RoPE order changes (head_dim > 0 marks q/k matrices and their biases). */
static void copy_tensor(const vks_tensor *src, const vks_tensor *dst, int head_dim, int from, int to) {
    float *out = (float *)dst->data;
    if (src->rows == 1 && head_dim > 0) { /* a q/k bias: permute elements (plain dtypes only) */
        size_t es = vks_dtype_size(src->dtype);
        for (int64_t i = 0; i < src->cols; i++)
            vks_dequantize(src->dtype, (const uint8_t *)src->data + (size_t)vks_rope_src_row(i, head_dim, from, to) * es,
                           &out[i], 1);
        return;
    }
    for (int64_t r = 0; r < src->rows; r++) {
        int64_t s = head_dim > 0 ? vks_rope_src_row(r, head_dim, from, to) : r;
        vks_tensor_row_f32(src, s, out + (size_t)r * (size_t)src->cols);
    }
}

static void free_state(void *p) { free(p); }

/* Allocates one buffer for the optional layer tensors the model has (those
 * outside the llama2.c layout: vks_layer_schema entries not always present)
 * and binds them. */
int vks_model_bind_optional(bool has_bias, vks_model *m) {
    const vks_model_config *c = &m->cfg;
    size_t per = 0;
    for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
        const vks_tensor_schema *s = &vks_layer_schema[i];
        if (s->when != VKS_WHEN_ALWAYS && vks_schema_present(s, c, has_bias))
            per += (size_t)(vks_schema_extent(c, s->rows) * vks_schema_extent(c, s->cols));
    }
    if (per == 0) return VKS_OK;
    if (m->format_state) return vks_set_error(VKS_ERR_ARG, "%s: optional tensors bound twice", m->path);
    float *b = calloc(per * (size_t)c->n_layers, sizeof(float));
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "out of memory for optional tensors");
    m->format_state = b;
    m->format_free = free_state;
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
            const vks_tensor_schema *s = &vks_layer_schema[i];
            if (s->when == VKS_WHEN_ALWAYS || !vks_schema_present(s, c, has_bias)) continue;
            int64_t rows = vks_schema_extent(c, s->rows), cols = vks_schema_extent(c, s->cols);
            m->layers[l].t[i] = (vks_tensor){VKS_DTYPE_F32, rows, cols, b};
            b += rows * cols;
        }
    return VKS_OK;
}

static void copy_layer(const vks_layer_weights *s, const vks_layer_weights *d, int hd, int from, int to) {
    for (int i = 0; i < VKS_LAYER_N_TENSORS; i++)
        if (s->t[i].data) copy_tensor(&s->t[i], &d->t[i], vks_layer_schema[i].rope ? hd : 0, from, to);
}

int vks_model_create_f32(const vks_model_config *cfg, bool has_bias, vks_model **out) {
    if (!cfg || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_create_f32: NULL argument");
    *out = NULL;
    int rc = vks_model_config_check(cfg, "vks_model_create_f32");
    if (rc != VKS_OK) return rc;
    vks_l2c_sizes s;
    if (!vks_l2c_sizes_compute(cfg, &s) || s.total > SIZE_MAX / sizeof(float))
        return vks_set_error(VKS_ERR_NOMEM, "model too large for an f32 copy");
    vks_model *m = vks_model_alloc();
    if (!m) return VKS_ERR_NOMEM;
    m->cfg = *cfg;
    m->owned = calloc(s.total, sizeof(float));
    if (!m->owned) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory for an f32 model (%zu floats)", s.total);
    if (rc == VKS_OK) rc = vks_model_bind_llama2c(m, m->owned);
    if (rc == VKS_OK) rc = vks_model_bind_optional(has_bias, m);
    if (rc != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    *out = m;
    return VKS_OK;
}

int vks_model_copy_f32(const vks_model *src, int rope_mode, vks_model **out) {
    if (!src || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_copy_f32: NULL argument");
    *out = NULL;
    int rc = vks_model_check_tensors(src, src->path);
    if (rc != VKS_OK) return rc;
    vks_model_config cfg = src->cfg;
    cfg.rope_mode = rope_mode;
    vks_model *m;
    rc = vks_model_create_f32(&cfg, vks_model_has_bias(src), &m);
    if (rc != VKS_OK) return rc == VKS_ERR_NOMEM ? vks_set_error(rc, "%s: %s", src->path, vks_last_error()) : rc;
    m->bos_id = src->bos_id;
    m->eos_id = src->eos_id;
    memcpy(m->arch, src->arch, sizeof m->arch);
    snprintf(m->path, sizeof m->path, "%s", src->path);
    int from = src->cfg.rope_mode, hd = src->cfg.head_dim;
    copy_tensor(&src->tok_emb, &m->tok_emb, 0, from, rope_mode);
    for (int l = 0; l < m->cfg.n_layers; l++) copy_layer(&src->layers[l], &m->layers[l], hd, from, rope_mode);
    copy_tensor(&src->final_norm, &m->final_norm, 0, from, rope_mode);
    if (!m->cfg.shared_classifier) copy_tensor(&src->classifier, &m->classifier, 0, from, rope_mode);
    *out = m;
    return VKS_OK;
}

/* Element alignment a tensor's bytes need when read in place. */
static size_t natural_alignment(vks_dtype t) {
    return t == VKS_DTYPE_F32 ? 4 : (t == VKS_DTYPE_F16 || t == VKS_DTYPE_BF16) ? 2 : 1;
}

int vks_check_bound_tensor(const char *what, const char *name, const vks_tensor *t, bool allow_blocks) {
    if (!t->data) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", what, name);
    size_t be = vks_dtype_block_elems(t->dtype);
    if (be == 0 || (be > 1 && !allow_blocks))
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has unsupported dtype %s", what, name,
                             vks_dtype_name(t->dtype));
    if ((uintptr_t)t->data % natural_alignment(t->dtype) != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is misaligned for %s", what, name, vks_dtype_name(t->dtype));
    return VKS_OK;
}
