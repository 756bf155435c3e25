/* train_params.c: the trainer's four parameter sets on the device (master
 * weights, gradients, Adam m and v): the tensor list in vks_ref_params order,
 * upload of a model's weights as f32 masters, and reading them back. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "train_internal.h"
#include "vkswarm/vks_quant.h"

/* The tensor list of the model, as vks_ref_params lists it (vks_schema_list). */
static int list_tensors(vks_trainer *t) {
    const vks_model_config *c = &t->cfg;
    int rc = vks_schema_list_alloc(c, t->has_bias, &t->items, &t->n_tensors);
    if (rc) return rc;
    t->tensors = calloc((size_t)t->n_tensors, sizeof *t->tensors);
    t->layers = calloc((size_t)c->n_layers, sizeof *t->layers);
    if (!t->tensors || !t->layers) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < VKS_LAYER_N_TENSORS; k++) t->layers[l].t[k] = -1;
    for (int i = 0; i < t->n_tensors; i++) {
        const vks_schema_item *it = &t->items[i];
        train_tensor *x = &t->tensors[i];
        vks_schema_name(it, VKS_NAME_INTERNAL, x->info.name, sizeof x->info.name);
        x->info.rows = it->rows;
        x->info.cols = it->cols;
        if (it->layer >= 0) t->layers[it->layer].t[it->index] = i;
        else if (it->index == VKS_T_tok_emb) t->tok_emb = i;
        else if (it->index == VKS_T_final_norm) t->final_norm = i;
        else t->classifier = i;
    }
    if (c->shared_classifier) t->classifier = t->tok_emb;
    return VKS_OK;
}

/* The model's tensor behind trainer tensor i. */
static const vks_tensor *model_tensor(const vks_trainer *t, const vks_model *m, int i) {
    return vks_model_slot_const(m, &t->items[i]);
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
    t->has_bias = vks_model_has_bias(m);
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
    free(t->items);
    t->tensors = NULL;
    t->layers = NULL;
    t->items = NULL;
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
