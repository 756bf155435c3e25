/* model_schema.c: the tables behind vks_model.h's schema (every tensor of a
 * model with its names, shape and presence; the architectures) and the
 * functions that walk them. */
#include "vkswarm/vks_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define VKS_SCHEMA_ROW_(field, gguf_name, hf_name, r, c, w, tr, rope) \
    [VKS_T_##field] = {#field, gguf_name, hf_name, VKS_EXT_##r, VKS_EXT_##c, VKS_WHEN_##w, tr, rope},
const vks_tensor_schema vks_layer_schema[VKS_LAYER_N_TENSORS] = {VKS_LAYER_TENSORS(VKS_SCHEMA_ROW_)};
const vks_tensor_schema vks_model_schema[VKS_MODEL_N_TENSORS] = {VKS_MODEL_TENSORS(VKS_SCHEMA_ROW_)};

static const vks_arch archs[] = {
    {"llama", "LlamaForCausalLM", VKS_ROPE_ADJACENT, false, false, "silu"},
    /* llama.cpp runs qwen2/qwen3 with NEOX RoPE (our HALF) and leaves their rows as HF has them */
    {"qwen2", "Qwen2ForCausalLM", VKS_ROPE_HALF, true, false, "silu"},
    {"qwen3", "Qwen3ForCausalLM", VKS_ROPE_HALF, false, true, "silu"},
};
#define N_ARCHS (sizeof archs / sizeof archs[0])

int64_t vks_schema_extent(const vks_model_config *c, vks_extent e) {
    switch (e) {
    case VKS_EXT_ONE: return 1;
    case VKS_EXT_DIM: return c->dim;
    case VKS_EXT_Q: return (int64_t)c->n_heads * c->head_dim;
    case VKS_EXT_KV: return (int64_t)c->n_kv_heads * c->head_dim;
    case VKS_EXT_HIDDEN: return c->hidden_dim;
    case VKS_EXT_HEAD: return c->head_dim;
    case VKS_EXT_VOCAB: return c->vocab_size;
    }
    return 0;
}

bool vks_schema_present(const vks_tensor_schema *s, const vks_model_config *c, bool has_bias) {
    switch (s->when) {
    case VKS_WHEN_ALWAYS: return true;
    case VKS_WHEN_BIAS: return has_bias;
    case VKS_WHEN_QK_NORM: return c->qk_norm;
    case VKS_WHEN_UNTIED: return !c->shared_classifier;
    }
    return false;
}

static void put_item(vks_schema_item *items, int cap, int *n, const vks_model_config *c, const vks_tensor_schema *s,
                     int layer, int index) {
    if (items && *n < cap)
        items[*n] = (vks_schema_item){s, layer, index, vks_schema_extent(c, s->rows), vks_schema_extent(c, s->cols)};
    (*n)++;
}

static void put_model_item(vks_schema_item *items, int cap, int *n, const vks_model_config *c, bool has_bias, int i) {
    if (vks_schema_present(&vks_model_schema[i], c, has_bias)) put_item(items, cap, n, c, &vks_model_schema[i], -1, i);
}

int vks_schema_list(const vks_model_config *c, bool has_bias, vks_schema_item *items, int cap) {
    int n = 0;
    put_model_item(items, cap, &n, c, has_bias, VKS_T_tok_emb);
    for (int l = 0; l < c->n_layers; l++)
        for (int i = 0; i < VKS_LAYER_N_TENSORS; i++)
            if (vks_schema_present(&vks_layer_schema[i], c, has_bias)) put_item(items, cap, &n, c, &vks_layer_schema[i], l, i);
    for (int i = VKS_T_tok_emb + 1; i < VKS_MODEL_N_TENSORS; i++) put_model_item(items, cap, &n, c, has_bias, i);
    return n;
}

int vks_schema_list_nth(const vks_model_config *c, bool has_bias, int i, vks_schema_item *out) {
    int per = 0;
    for (int t = 0; t < VKS_LAYER_N_TENSORS; t++) per += vks_schema_present(&vks_layer_schema[t], c, has_bias);
    if (i < 0) return VKS_ERR_ARG;
    if (i == 0) return put_item(out, 1, &(int){0}, c, &vks_model_schema[VKS_T_tok_emb], -1, VKS_T_tok_emb), VKS_OK;
    i--;
    if (i < per * c->n_layers) {
        int l = i / per, k = i % per;
        for (int t = 0; t < VKS_LAYER_N_TENSORS; t++)
            if (vks_schema_present(&vks_layer_schema[t], c, has_bias) && k-- == 0)
                return put_item(out, 1, &(int){0}, c, &vks_layer_schema[t], l, t), VKS_OK;
    }
    i -= per * c->n_layers;
    for (int t = VKS_T_tok_emb + 1; t < VKS_MODEL_N_TENSORS; t++)
        if (vks_schema_present(&vks_model_schema[t], c, has_bias) && i-- == 0)
            return put_item(out, 1, &(int){0}, c, &vks_model_schema[t], -1, t), VKS_OK;
    return VKS_ERR_ARG;
}

int vks_schema_list_alloc(const vks_model_config *c, bool has_bias, vks_schema_item **items, int *n) {
    *items = NULL;
    *n = vks_schema_list(c, has_bias, NULL, 0);
    vks_schema_item *a = calloc((size_t)*n, sizeof *a);
    if (!a) return vks_set_error(VKS_ERR_NOMEM, "out of memory listing %d tensors", *n);
    vks_schema_list(c, has_bias, a, *n);
    *items = a;
    return VKS_OK;
}

void vks_schema_name(const vks_schema_item *it, vks_name_kind kind, char *buf, size_t cap) {
    const char *base = kind == VKS_NAME_GGUF ? it->s->gguf : kind == VKS_NAME_HF ? it->s->hf : it->s->name;
    if (it->layer < 0) snprintf(buf, cap, "%s", base);
    else if (kind == VKS_NAME_GGUF) snprintf(buf, cap, "blk.%d.%s", it->layer, base);
    else if (kind == VKS_NAME_HF) snprintf(buf, cap, "model.layers.%d.%s", it->layer, base);
    else snprintf(buf, cap, "layers.%d.%s", it->layer, base);
}

vks_tensor *vks_model_slot(vks_model *m, const vks_schema_item *it) {
    if (it->layer >= 0) return &m->layers[it->layer].t[it->index];
    switch (it->index) {
    case VKS_T_tok_emb: return &m->tok_emb;
    case VKS_T_final_norm: return &m->final_norm;
    default: return &m->classifier;
    }
}

const vks_tensor *vks_model_slot_const(const vks_model *m, const vks_schema_item *it) {
    return vks_model_slot((vks_model *)m, it);
}

bool vks_model_has_bias(const vks_model *m) { return m && m->layers && m->cfg.n_layers > 0 && m->layers[0].bq.data; }

const vks_arch *vks_arch_find(const char *name) {
    for (size_t i = 0; name && i < N_ARCHS; i++)
        if (!strcmp(archs[i].name, name)) return &archs[i];
    return NULL;
}

const vks_arch *vks_arch_find_hf(const char *hf_class, const char *model_type) {
    for (size_t i = 0; i < N_ARCHS; i++)
        if ((hf_class && !strcmp(archs[i].hf_class, hf_class)) || (!hf_class && model_type && !strcmp(archs[i].name, model_type)))
            return &archs[i];
    return NULL;
}

void vks_arch_list(char *buf, size_t cap, bool hf) {
    size_t at = 0;
    if (cap) buf[0] = '\0';
    for (size_t i = 0; i < N_ARCHS && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%s", i ? ", " : "", hf ? archs[i].hf_class : archs[i].name);
}
