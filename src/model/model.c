/* model.c: what every format shares: the config checks, allocation and
 * release of a vks_model, the tensor-shape checks and the parameter count. */
#include "model/model_internal.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_quant.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

/* Sanity limits for every reader (far above any real Llama, far below overflow). */
#define LIMIT_DIM 65536
#define LIMIT_HIDDEN (1 << 20)
#define LIMIT_LAYERS 1024
#define LIMIT_VOCAB (1 << 22)
#define LIMIT_SEQ (1 << 20)
#define LIMIT_HEAD_DIM 1024

/* ---- config ---- */

static int config_error(const char *what, const char *problem, int value) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: %s (got %d)", what, problem, value);
}

/* Each field positive and within its limit. */
static int check_ranges(const vks_model_config *c, const char *what) {
    struct { const char *name; int value, limit; } fields[] = {
        {"dim", c->dim, LIMIT_DIM},
        {"hidden_dim", c->hidden_dim, LIMIT_HIDDEN},
        {"n_layers", c->n_layers, LIMIT_LAYERS},
        {"n_heads", c->n_heads, c->dim > 0 ? c->dim : 1},
        {"n_kv_heads", c->n_kv_heads, c->n_heads > 0 ? c->n_heads : 1},
        {"vocab_size", c->vocab_size, LIMIT_VOCAB},
        {"seq_len", c->seq_len, LIMIT_SEQ},
    };
    for (size_t i = 0; i < sizeof fields / sizeof fields[0]; i++) {
        if (fields[i].value <= 0 || fields[i].value > fields[i].limit)
            return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be in 1..%d (got %d)", what,
                                 fields[i].name, fields[i].limit, fields[i].value);
    }
    return VKS_OK;
}

/* head_dim is the model's own (Qwen3: 128 on a 1024 hidden size with 16
 * heads); q and the attention output are n_heads x head_dim wide. */
static int check_heads(const vks_model_config *c, const char *what) {
    if (c->n_heads % c->n_kv_heads != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_kv_heads %d does not divide n_heads %d",
                             what, c->n_kv_heads, c->n_heads);
    if (c->head_dim <= 0 || c->head_dim > LIMIT_HEAD_DIM)
        return vks_set_error(VKS_ERR_FORMAT, "%s: head_dim must be in 1..%d (got %d)", what, LIMIT_HEAD_DIM, c->head_dim);
    if ((int64_t)c->n_heads * c->head_dim > LIMIT_DIM)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_heads x head_dim (%d x %d) exceeds %d", what, c->n_heads,
                             c->head_dim, LIMIT_DIM);
    if (c->head_dim % 2 != 0)
        return config_error(what, "head_dim must be even for RoPE", c->head_dim);
    if (c->kv_dim != c->n_kv_heads * c->head_dim)
        return config_error(what, "kv_dim must equal n_kv_heads * head_dim", c->kv_dim);
    return VKS_OK;
}

static int check_scalars(const vks_model_config *c, const char *what) {
    if (!isfinite(c->norm_eps) || c->norm_eps < 0.0f)
        return vks_set_error(VKS_ERR_FORMAT, "%s: norm_eps must be finite and >= 0 (got %g)",
                             what, (double)c->norm_eps);
    if (!isfinite(c->rope_theta) || c->rope_theta <= 0.0f)
        return vks_set_error(VKS_ERR_FORMAT, "%s: rope_theta must be finite and > 0 (got %g)",
                             what, (double)c->rope_theta);
    if (c->rope_mode != 0 && c->rope_mode != 1)
        return config_error(what, "rope_mode must be 0 (adjacent) or 1 (half)", c->rope_mode);
    const vks_rope_scaling *s = &c->rope_scaling;
    if (s->type != VKS_ROPE_SCALING_NONE && s->type != VKS_ROPE_SCALING_LLAMA3)
        return config_error(what, "unknown RoPE scaling type", s->type);
    if (s->type == VKS_ROPE_SCALING_LLAMA3 &&
        (!(s->factor >= 1.0f && s->factor <= 1e6f) || !(s->low_freq_factor > 0.0f && s->low_freq_factor < 1e6f) ||
         !(s->high_freq_factor > s->low_freq_factor && s->high_freq_factor < 1e6f) || s->original_context <= 0))
        return vks_set_error(VKS_ERR_FORMAT, "%s: llama3 RoPE scaling needs factor >= 1, 0 < low_freq_factor < "
                             "high_freq_factor and original_max_position_embeddings > 0 (got %g, %g, %g, %d)", what,
                             (double)s->factor, (double)s->low_freq_factor, (double)s->high_freq_factor,
                             s->original_context);
    return VKS_OK;
}

int vks_model_config_check(const vks_model_config *c, const char *what) {
    if (!what) what = "model config";
    if (!c) return vks_set_error(VKS_ERR_ARG, "%s: no config given", what);
    int rc = check_ranges(c, what);
    if (rc == VKS_OK) rc = check_heads(c, what);
    if (rc == VKS_OK) rc = check_scalars(c, what);
    if (rc != VKS_OK) return rc;
    vks_l2c_sizes s;
    size_t bytes;
    if (!vks_l2c_sizes_compute(c, &s) || !vks_mul_size(s.total, sizeof(float), &bytes) ||
        !vks_add_size(bytes, L2C_HEADER_BYTES, &bytes))
        return vks_set_error(VKS_ERR_FORMAT, "%s: model size overflows", what);
    return VKS_OK;
}

/* ---- allocation ---- */

vks_model *vks_model_alloc(void) {
    vks_model *m = calloc(1, sizeof *m);
    if (!m) {
        vks_set_error(VKS_ERR_NOMEM, "out of memory allocating a model");
        return NULL;
    }
    m->bos_id = m->eos_id = -1;
    snprintf(m->arch, sizeof m->arch, "llama");
    return m;
}

void vks_model_free(vks_model *m) {
    if (!m) return;
    if (m->map) munmap(m->map, m->map_size);
    if (m->gguf) vks_gguf_close(m->gguf);
    if (m->format_free) m->format_free(m->format_state);
    free(m->owned);
    free(m->layers);
    free(m);
}

/* ---- tensor shapes ---- */

/* Block formats are allowed when a row is a whole number of blocks. */
static bool tensor_ok(const vks_tensor *t, int64_t rows, int64_t cols) {
    size_t be = vks_dtype_block_elems(t->dtype);
    return t->data && be != 0 && cols % (int64_t)be == 0 && t->rows == rows && t->cols == cols;
}

static int tensor_error(const char *what, const char *name, int layer) {
    return vks_set_error(VKS_ERR_ARG, "%s: tensor %s (layer %d) has no data, a bad dtype or a wrong shape",
                         what, name, layer);
}

/* Every tensor the schema lists for m is there with its shape (vectors in
 * f32/f16/bf16); optional ones absent everywhere else. */
static int check_slot(const vks_model *m, const vks_schema_item *it, bool present, const char *what) {
    const vks_tensor *t = vks_model_slot_const(m, it);
    bool ok = present ? tensor_ok(t, it->rows, it->cols) && (it->rows > 1 || vks_dtype_size(t->dtype) != 0)
                      : t->data == NULL;
    return ok ? VKS_OK : tensor_error(what, it->s->name, it->layer);
}

int vks_model_check_tensors(const vks_model *m, const char *what) {
    if (!what) what = "model";
    if (!m) return vks_set_error(VKS_ERR_ARG, "%s: no model given", what);
    int rc = vks_model_config_check(&m->cfg, what);
    if (rc != VKS_OK) return rc;
    const vks_model_config *c = &m->cfg;
    if (!m->layers) return vks_set_error(VKS_ERR_ARG, "%s: model has no layers", what);
    bool bias = vks_model_has_bias(m);
    for (int l = -1; l < c->n_layers && rc == VKS_OK; l++) {
        int n = l < 0 ? VKS_MODEL_N_TENSORS : VKS_LAYER_N_TENSORS;
        for (int i = 0; i < n && rc == VKS_OK; i++) {
            const vks_tensor_schema *s = l < 0 ? &vks_model_schema[i] : &vks_layer_schema[i];
            vks_schema_item it = {s, l, i, vks_schema_extent(c, s->rows), vks_schema_extent(c, s->cols)};
            bool present = vks_schema_present(s, c, bias) || (l < 0 && i == VKS_T_classifier);
            rc = check_slot(m, &it, present, what);
        }
    }
    return rc;
}

/* ---- counting ---- */

int64_t vks_model_param_count(const vks_model *m) {
    if (!m || !m->layers) return 0;
    const vks_model_config *c = &m->cfg;
    bool bias = vks_model_has_bias(m);
    int64_t per_layer = 0, n = 0;
    for (int i = 0; i < VKS_LAYER_N_TENSORS; i++)
        if (vks_schema_present(&vks_layer_schema[i], c, bias))
            per_layer += vks_schema_extent(c, vks_layer_schema[i].rows) * vks_schema_extent(c, vks_layer_schema[i].cols);
    for (int i = 0; i < VKS_MODEL_N_TENSORS; i++)
        if (vks_schema_present(&vks_model_schema[i], c, bias))
            n += vks_schema_extent(c, vks_model_schema[i].rows) * vks_schema_extent(c, vks_model_schema[i].cols);
    return n + per_layer * c->n_layers;
}
