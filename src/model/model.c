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

static int check_heads(const vks_model_config *c, const char *what) {
    if (c->dim % c->n_heads != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_heads %d does not divide dim %d", what,
                             c->n_heads, c->dim);
    if (c->n_heads % c->n_kv_heads != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_kv_heads %d does not divide n_heads %d",
                             what, c->n_kv_heads, c->n_heads);
    if (c->head_dim != c->dim / c->n_heads)
        return config_error(what, "head_dim must equal dim / n_heads", c->head_dim);
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

/* Optional biases: all three or none, f32/f16/bf16 vectors. */
static bool bias_ok(const vks_tensor *t, int64_t cols) {
    return vks_dtype_size(t->dtype) != 0 && tensor_ok(t, 1, cols);
}

static int tensor_error(const char *what, const char *name, int layer) {
    return vks_set_error(VKS_ERR_ARG, "%s: tensor %s (layer %d) has no data, a bad dtype or a wrong shape",
                         what, name, layer);
}

static int check_layer(const vks_model *m, int l, const char *what) {
    const vks_model_config *c = &m->cfg;
    const vks_layer_weights *w = &m->layers[l];
    struct { const vks_tensor *t; const char *name; int64_t rows, cols; } want[] = {
        {&w->attn_norm, "attn_norm", 1, c->dim},   {&w->wq, "wq", c->dim, c->dim},
        {&w->wk, "wk", c->kv_dim, c->dim},         {&w->wv, "wv", c->kv_dim, c->dim},
        {&w->wo, "wo", c->dim, c->dim},            {&w->ffn_norm, "ffn_norm", 1, c->dim},
        {&w->w1, "w1", c->hidden_dim, c->dim},     {&w->w2, "w2", c->dim, c->hidden_dim},
        {&w->w3, "w3", c->hidden_dim, c->dim},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        if (!tensor_ok(want[i].t, want[i].rows, want[i].cols))
            return tensor_error(what, want[i].name, l);
    if (w->bq.data || w->bk.data || w->bv.data) {
        if (!bias_ok(&w->bq, c->dim)) return tensor_error(what, "bq", l);
        if (!bias_ok(&w->bk, c->kv_dim)) return tensor_error(what, "bk", l);
        if (!bias_ok(&w->bv, c->kv_dim)) return tensor_error(what, "bv", l);
    }
    return VKS_OK;
}

int vks_model_check_tensors(const vks_model *m, const char *what) {
    if (!what) what = "model";
    if (!m) return vks_set_error(VKS_ERR_ARG, "%s: no model given", what);
    int rc = vks_model_config_check(&m->cfg, what);
    if (rc != VKS_OK) return rc;
    const vks_model_config *c = &m->cfg;
    if (!m->layers) return vks_set_error(VKS_ERR_ARG, "%s: model has no layers", what);
    if (!tensor_ok(&m->tok_emb, c->vocab_size, c->dim)) return tensor_error(what, "tok_emb", -1);
    if (!tensor_ok(&m->final_norm, 1, c->dim)) return tensor_error(what, "final_norm", -1);
    if (!tensor_ok(&m->classifier, c->vocab_size, c->dim))
        return tensor_error(what, "classifier", -1);
    for (int l = 0; l < c->n_layers; l++)
        if ((rc = check_layer(m, l, what)) != VKS_OK) return rc;
    return VKS_OK;
}

/* ---- counting ---- */

int64_t vks_model_param_count(const vks_model *m) {
    if (!m || !m->layers) return 0;
    int64_t n = m->tok_emb.rows * m->tok_emb.cols + m->final_norm.rows * m->final_norm.cols;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const vks_layer_weights *w = &m->layers[l];
        const vks_tensor *all[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->wo,
                                   &w->ffn_norm, &w->w1, &w->w2, &w->w3};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) n += all[i]->rows * all[i]->cols;
    }
    if (!m->cfg.shared_classifier) n += m->classifier.rows * m->classifier.cols;
    return n;
}
