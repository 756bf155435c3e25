/* train_params.c: the trainer's four parameter sets on the device (master
 * weights, gradients, Adam m and v): the tensor list in vks_ref_params order,
 * upload of a model's weights as f32 masters, and reading them back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train_internal.h"
#include "vkswarm/vks_quant.h"

static int add_tensor(vks_trainer *t, const char *name, int64_t rows, int64_t cols) {
    train_tensor *x = &t->tensors[t->n_tensors];
    memset(x, 0, sizeof *x);
    snprintf(x->info.name, sizeof x->info.name, "%s", name);
    x->info.rows = rows;
    x->info.cols = cols;
    return t->n_tensors++;
}

static int add_layer_tensor(vks_trainer *t, int l, const char *field, int64_t rows, int64_t cols) {
    char name[32];
    snprintf(name, sizeof name, "layers.%d.%s", l, field);
    return add_tensor(t, name, rows, cols);
}

/* The tensor list of cfg, as vks_ref_params lists it. */
static int list_tensors(vks_trainer *t) {
    const vks_model_config *c = &t->cfg;
    int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim, kv = c->kv_dim, h = c->hidden_dim;
    t->tensors = calloc((size_t)c->n_layers * 12 + 3, sizeof *t->tensors);
    t->layers = calloc((size_t)c->n_layers, sizeof *t->layers);
    if (!t->tensors || !t->layers) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    t->tok_emb = add_tensor(t, "tok_emb", c->vocab_size, d);
    for (int l = 0; l < c->n_layers; l++) {
        train_layer *L = &t->layers[l];
        L->attn_norm = add_layer_tensor(t, l, "attn_norm", 1, d);
        L->wq = add_layer_tensor(t, l, "wq", qd, d);
        L->wk = add_layer_tensor(t, l, "wk", kv, d);
        L->wv = add_layer_tensor(t, l, "wv", kv, d);
        L->bq = t->has_bias ? add_layer_tensor(t, l, "bq", 1, qd) : -1;
        L->bk = t->has_bias ? add_layer_tensor(t, l, "bk", 1, kv) : -1;
        L->bv = t->has_bias ? add_layer_tensor(t, l, "bv", 1, kv) : -1;
        L->wo = add_layer_tensor(t, l, "wo", d, qd);
        L->ffn_norm = add_layer_tensor(t, l, "ffn_norm", 1, d);
        L->w1 = add_layer_tensor(t, l, "w1", h, d);
        L->w2 = add_layer_tensor(t, l, "w2", d, h);
        L->w3 = add_layer_tensor(t, l, "w3", h, d);
    }
    t->final_norm = add_tensor(t, "final_norm", 1, d);
    t->classifier = c->shared_classifier ? t->tok_emb : add_tensor(t, "classifier", c->vocab_size, d);
    return VKS_OK;
}

/* The model's tensor behind trainer tensor i (same order as list_tensors). */
static const vks_tensor *model_tensor(const vks_trainer *t, const vks_model *m, int i) {
    if (i == t->tok_emb) return &m->tok_emb;
    if (i == t->final_norm) return &m->final_norm;
    if (i == t->classifier) return &m->classifier;
    for (int l = 0; l < t->cfg.n_layers; l++) {
        const train_layer *L = &t->layers[l];
        const vks_layer_weights *w = &m->layers[l];
        const int idx[] = {L->attn_norm, L->wq, L->wk, L->wv, L->bq, L->bk, L->bv, L->wo, L->ffn_norm, L->w1, L->w2, L->w3};
        const vks_tensor *ts[] = {&w->attn_norm, &w->wq, &w->wk, &w->wv, &w->bq, &w->bk, &w->bv, &w->wo,
                                  &w->ffn_norm, &w->w1, &w->w2, &w->w3};
        for (int k = 0; k < 12; k++)
            if (idx[k] == i) return ts[k];
    }
    return NULL;
}

static size_t tensor_bytes(const train_tensor *x) { return (size_t)x->info.rows * (size_t)x->info.cols * sizeof(float); }

/* Dequantizes model tensor src into the masters of tensor x. */
static int upload_master(train_tensor *x, const vks_tensor *src) {
    if (!src || !src->data || src->rows * src->cols != x->info.rows * x->info.cols)
        return vks_set_error(VKS_ERR_FORMAT, "trainer: tensor %s is missing or has another shape", x->info.name);
    size_t n = (size_t)x->info.rows * (size_t)x->info.cols;
    float *f = malloc(n * sizeof *f);
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for %s", x->info.name);
    vks_dequantize(src->dtype, src->data, f, n);
    int rc = vks_buffer_upload(x->buf[VKS_SET_PARAMS], 0, f, n * sizeof *f);
    free(f);
    return rc;
}

static int create_buffers(vks_trainer *t, train_tensor *x) {
    size_t bytes = tensor_bytes(x);
    if (bytes > vks_gpu_info(t->gpu)->max_storage_range)
        return vks_set_error(VKS_ERR_ARG, "trainer: tensor %s (%zu bytes) exceeds one storage binding (%llu bytes): "
                             "models this large are not trainable here", x->info.name, bytes,
                             (unsigned long long)vks_gpu_info(t->gpu)->max_storage_range);
    for (int s = 0; s < VKS_SET_COUNT; s++) {
        int rc = vks_buffer_create(t->gpu, bytes, &x->buf[s]);
        if (!rc && s != VKS_SET_PARAMS) rc = vks_buffer_fill(x->buf[s], 0);
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_train_params_create(vks_trainer *t, const vks_model *m) {
    t->has_bias = m->cfg.n_layers > 0 && m->layers[0].bq.data != NULL;
    int rc = list_tensors(t);
    for (int i = 0; !rc && i < t->n_tensors; i++) {
        rc = create_buffers(t, &t->tensors[i]);
        if (!rc) rc = upload_master(&t->tensors[i], model_tensor(t, m, i));
    }
    return rc;
}

void vks_train_params_free(vks_trainer *t) {
    for (int i = 0; t->tensors && i < t->n_tensors; i++)
        for (int s = 0; s < VKS_SET_COUNT; s++) vks_buffer_destroy(t->tensors[i].buf[s]);
    free(t->tensors);
    free(t->layers);
    t->tensors = NULL;
    t->layers = NULL;
}

vks_binding vks_train_binding(const vks_trainer *t, vks_param_kind set, int i) {
    return (vks_binding){t->tensors[i].buf[set], 0, 0};
}

int vks_trainer_n_tensors(const vks_trainer *t) { return t ? t->n_tensors : 0; }

int vks_trainer_tensor_info(const vks_trainer *t, int i, vks_train_tensor_info *info) {
    if (!t || !info || i < 0 || i >= t->n_tensors) return vks_set_error(VKS_ERR_ARG, "trainer: no tensor %d", i);
    *info = t->tensors[i].info;
    return VKS_OK;
}

int vks_trainer_find_tensor(const vks_trainer *t, const char *name) {
    for (int i = 0; t && name && i < t->n_tensors; i++)
        if (!strcmp(t->tensors[i].info.name, name)) return i;
    return -1;
}

static int check_access(const vks_trainer *t, vks_param_kind set, int i, const void *p) {
    if (!t || !p || (unsigned)set >= VKS_SET_COUNT || i < 0 || i >= t->n_tensors)
        return vks_set_error(VKS_ERR_ARG, "trainer: bad tensor access (set %d, tensor %d)", (int)set, i);
    return VKS_OK;
}

int vks_trainer_read(vks_trainer *t, vks_param_kind set, int i, float *dst) {
    int rc = check_access(t, set, i, dst);
    return rc ? rc : vks_buffer_download(t->tensors[i].buf[set], 0, dst, tensor_bytes(&t->tensors[i]));
}

int vks_trainer_write(vks_trainer *t, vks_param_kind set, int i, const float *src) {
    int rc = check_access(t, set, i, src);
    return rc ? rc : vks_buffer_upload(t->tensors[i].buf[set], 0, src, tensor_bytes(&t->tensors[i]));
}

int vks_trainer_export_model(vks_trainer *t, vks_model **out) {
    if (!t || !out) return vks_set_error(VKS_ERR_ARG, "vks_trainer_export_model: NULL argument");
    vks_model *m = NULL;
    int rc = vks_model_create_f32(&t->cfg, t->has_bias, &m);
    for (int i = 0; !rc && i < t->n_tensors; i++) {
        /* the copy owns its f32 weights: writing them is the point of it */
        float *dst = (float *)(uintptr_t)model_tensor(t, m, i)->data;
        rc = vks_trainer_read(t, VKS_SET_PARAMS, i, dst);
    }
    if (rc) {
        vks_model_free(m);
        return rc;
    }
    m->bos_id = t->bos_id;
    m->eos_id = t->eos_id;
    memcpy(m->arch, t->arch, sizeof m->arch);
    *out = m;
    return VKS_OK;
}
