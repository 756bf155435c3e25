/* train_params.c: the trainer's four parameter sets on the device (master
 * weights, gradients, Adam m and v): the tensor list in vks_ref_params order,
 * upload of a model's weights as f32 masters, and reading them back; with
 * LoRA, the adapter's A and B as the tensors and the model as the frozen base
 * (the engine's upload, in the file's types). The forward and backward read
 * weights through the accessors at the end, whichever the kind. */
#include <math.h>
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

/* The LoRA target of schema matrix k, or -1. */
int vks_train_lora_target(int k) {
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++)
        if (vks_lora_target_tensor((vks_lora_target)t) == k) return t;
    return -1;
}

/* LoRA's tensor list: per layer and target, A [rank, in] then B [out, rank]. */
static int list_lora_tensors(vks_trainer *t) {
    const vks_model_config *c = &t->cfg;
    int per_layer = __builtin_popcount(t->lora.targets);
    t->n_tensors = 2 * per_layer * c->n_layers + (t->opt.lora_save_norm ? 1 : 0);
    t->tensors = calloc((size_t)t->n_tensors, sizeof *t->tensors);
    t->adapter = calloc((size_t)c->n_layers, sizeof *t->adapter);
    if (!t->tensors || !t->adapter) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    t->tok_emb = t->final_norm = t->classifier = -1;
    int i = 0;
    for (int l = 0; l < c->n_layers; l++)
        for (int k = 0; k < VKS_LORA_TARGET_COUNT; k++) {
            t->adapter[l][k] = -1;
            if (!(t->lora.targets & (1u << k))) continue;
            int64_t out, in;
            vks_lora_target_shape(c, (vks_lora_target)k, &out, &in);
            t->adapter[l][k] = i;
            for (int ab = 0; ab < 2; ab++, i++) {
                train_tensor *x = &t->tensors[i];
                snprintf(x->info.name, sizeof x->info.name, "layers.%d.%s.lora_%c", l,
                         vks_lora_target_name((vks_lora_target)k), ab ? 'B' : 'A');
                x->info.rows = ab ? out : t->lora.rank;
                x->info.cols = ab ? t->lora.rank : in;
            }
        }
    if (t->opt.lora_save_norm) { /* modules_to_save ["norm"]: PEFT's module name */
        t->final_norm = i;
        snprintf(t->tensors[i].info.name, sizeof t->tensors[i].info.name, "norm");
        t->tensors[i].info.rows = 1;
        t->tensors[i].info.cols = c->dim;
    }
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

/* Full fine-tuning: each master as a one-chunk f32 matrix (what the engine's
 * chunked matrices look like), so the forward reads both kinds alike. */
static int view_masters(vks_trainer *t) {
    t->mats = calloc((size_t)t->n_tensors, sizeof *t->mats);
    if (!t->mats) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int i = 0; i < t->n_tensors; i++) {
        dev_matrix *d = &t->mats[i];
        d->dtype = VKS_DTYPE_F32;
        d->rows = d->rows_per_chunk = (uint32_t)t->tensors[i].info.rows;
        d->cols = (uint32_t)t->tensors[i].info.cols;
        d->n_chunks = 1;
        d->chunk[0] = t->tensors[i].buf[VKS_SET_PARAMS];
    }
    return VKS_OK;
}

static int create_full(vks_trainer *t, const vks_model *m) {
    int rc = list_tensors(t);
    for (int i = 0; !rc && i < t->n_tensors; i++) {
        rc = create_buffers(t, &t->tensors[i]);
        if (!rc) rc = upload_master(&t->tensors[i], model_tensor(t, m, i));
    }
    return rc ? rc : view_masters(t);
}

/* An adapter that fits the model (its layers and every targeted matrix's
 * shape: vks_lora_adapter_check_shape), of a valid rank and alpha. */
static int check_adapter(const vks_model_config *c, const vks_lora_adapter *a) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    int rc = vks_lora_adapter_check_shape(a, c, "trainer");
    if (rc) return rc;
    if (!(lc->alpha > 0) || !isfinite(lc->alpha))
        return vks_set_error(VKS_ERR_ARG, "trainer: LoRA alpha %g (finite, > 0)", lc->alpha);
    return vks_lora_check(c, lc->rank, lc->targets, "trainer");
}

/* A targeted matrix must be one buffer: vks_op_lora_* take W whole. */
static int check_unchunked(const vks_trainer *t) {
    for (int l = 0; l < t->cfg.n_layers; l++)
        for (int k = 0; k < VKS_LAYER_N_TENSORS; k++) {
            int target = vks_train_lora_target(k);
            if (target < 0 || t->adapter[l][target] < 0 || t->base.layers[l].mat[k].n_chunks == 1) continue;
            return vks_set_error(VKS_ERR_ARG, "trainer: layer %d %s exceeds one storage binding; LoRA needs it whole",
                                 l, vks_layer_schema[k].name);
        }
    return VKS_OK;
}

static int create_lora(vks_trainer *t, const vks_model *m, const vks_lora_adapter *a) {
    int rc = check_adapter(&t->cfg, a);
    if (rc) return rc;
    t->lora = *vks_lora_adapter_config(a);
    t->lora_scale = (float)vks_lora_scale(t->lora.alpha, t->lora.rank);
    rc = list_lora_tensors(t);
    for (int i = 0; !rc && i < t->n_tensors; i++) rc = create_buffers(t, &t->tensors[i]);
    for (int l = 0; !rc && l < t->cfg.n_layers; l++)
        for (int k = 0; !rc && k < VKS_LORA_TARGET_COUNT; k++) {
            int i = t->adapter[l][k];
            if (i < 0) continue;
            rc = vks_trainer_write(t, VKS_SET_PARAMS, i, vks_lora_adapter_A(a, l, (vks_lora_target)k));
            if (!rc) rc = vks_trainer_write(t, VKS_SET_PARAMS, i + 1, vks_lora_adapter_B(a, l, (vks_lora_target)k));
        }
    /* modules_to_save ["norm"]: from the adapter where it carries one, else the base's */
    if (!rc && t->final_norm >= 0 && vks_lora_adapter_norm(a))
        rc = vks_trainer_write(t, VKS_SET_PARAMS, t->final_norm, vks_lora_adapter_norm(a));
    else if (!rc && t->final_norm >= 0) rc = upload_master(&t->tensors[t->final_norm], &m->final_norm);
    /* the frozen base: the engine's parameter set of every layer, in the file's types */
    vks_engine_options e = {.layer_end = t->cfg.n_layers, .keep_file_dtype = true};
    if (!rc) rc = vks_param_set_upload(t->gpu, m, &e, &t->base);
    return rc ? rc : check_unchunked(t);
}

int vks_train_params_create(vks_trainer *t, const vks_model *m, const vks_lora_adapter *lora) {
    t->has_bias = vks_model_has_bias(m);
    return lora ? create_lora(t, m, lora) : create_full(t, m);
}

void vks_train_params_free(vks_trainer *t) {
    for (int i = 0; t->tensors && i < t->n_tensors; i++)
        for (int s = 0; s < VKS_SET_COUNT; s++) vks_buffer_destroy(t->tensors[i].buf[s]);
    free(t->tensors);
    free(t->layers);
    free(t->items);
    free(t->adapter);
    free(t->mats);
    vks_param_set_free(&t->base);
    t->tensors = NULL;
    t->layers = NULL;
    t->items = NULL;
    t->adapter = NULL;
    t->mats = NULL;
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
    if (vks_train_is_lora(t))
        return vks_set_error(VKS_ERR_ARG, "trainer: a LoRA trainer exports its adapter, not a model");
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

const vks_lora_config *vks_trainer_lora_config(const vks_trainer *t) {
    return t && vks_train_is_lora(t) ? &t->lora : NULL;
}

int vks_trainer_export_lora(vks_trainer *t, vks_lora_adapter *a) {
    if (!t || !a || !vks_train_is_lora(t)) return vks_set_error(VKS_ERR_ARG, "vks_trainer_export_lora: no LoRA trainer");
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    if (lc->rank != t->lora.rank || lc->targets != t->lora.targets || vks_lora_adapter_n_layers(a) != t->cfg.n_layers)
        return vks_set_error(VKS_ERR_ARG, "vks_trainer_export_lora: the adapter has another rank, targets or layers");
    int rc = VKS_OK;
    for (int l = 0; !rc && l < t->cfg.n_layers; l++)
        for (int k = 0; !rc && k < VKS_LORA_TARGET_COUNT; k++) {
            int i = t->adapter[l][k];
            if (i < 0) continue;
            rc = vks_trainer_read(t, VKS_SET_PARAMS, i, vks_lora_adapter_A(a, l, (vks_lora_target)k));
            if (!rc) rc = vks_trainer_read(t, VKS_SET_PARAMS, i + 1, vks_lora_adapter_B(a, l, (vks_lora_target)k));
        }
    if (rc || t->final_norm < 0) return rc;
    float *w = malloc((size_t)t->cfg.dim * sizeof *w); /* modules_to_save ["norm"] */
    if (!w) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    rc = vks_trainer_read(t, VKS_SET_PARAMS, t->final_norm, w);
    if (!rc) rc = vks_lora_adapter_set_norm(a, w);
    free(w);
    return rc;
}

/* ---- the weights as the forward and backward read them ---- */

const dev_matrix *vks_train_layer_matrix(const vks_trainer *t, int l, int k) {
    return vks_train_is_lora(t) ? &t->base.layers[l].mat[k] : &t->mats[t->layers[l].t[k]];
}

const dev_matrix *vks_train_embedding(const vks_trainer *t) {
    return vks_train_is_lora(t) ? &t->base.tok_emb : &t->mats[t->tok_emb];
}

const dev_matrix *vks_train_classifier(const vks_trainer *t) {
    return vks_train_is_lora(t) ? &t->base.classifier : &t->mats[t->classifier];
}

/* A frozen vector has no gradient, Adam moments or other set: NULL there. */
vks_binding vks_train_layer_vector(const vks_trainer *t, vks_param_kind set, int l, int k) {
    if (vks_train_is_lora(t)) return (vks_binding){set == VKS_SET_PARAMS ? t->base.layers[l].vec[k] : NULL, 0, 0};
    int i = t->layers[l].t[k];
    return i < 0 ? (vks_binding){0} : vks_train_binding(t, set, i);
}

vks_binding vks_train_final_norm(const vks_trainer *t, vks_param_kind set) {
    if (vks_train_is_lora(t) && t->final_norm < 0) return (vks_binding){set == VKS_SET_PARAMS ? t->base.final_norm : NULL, 0, 0};
    return vks_train_binding(t, set, t->final_norm);
}
