/* lora_merge.c: an adapter merged into its base (vks_lora_merge): every
 * targeted W becomes W + (alpha / rank) B A, in double from W's decoded
 * values, rounded once to f32; an adapter's final norm (modules_to_save)
 * replaces the base's. The merged model is an owned f32 copy whose
 * tensors replace m's; m keeps its GGUF/directory (tokenizer metadata). */
#include "model/lora_internal.h"
#include "model/model_internal.h"

#include <stdlib.h>
#include <string.h>

/* m's reader state and the merged copy, freed together. */
typedef struct {
    void *state;
    void (*state_free)(void *);
    vks_model *merged;
} merge_state;

static void merge_state_free(void *p) {
    merge_state *s = p;
    if (!s) return;
    if (s->state_free) s->state_free(s->state);
    vks_model_free(s->merged);
    free(s);
}

static bool same_shape(const vks_model_config *x, const vks_model_config *y) {
    return x->dim == y->dim && x->hidden_dim == y->hidden_dim && x->n_layers == y->n_layers &&
           x->n_heads == y->n_heads && x->n_kv_heads == y->n_kv_heads && x->head_dim == y->head_dim &&
           x->rope_mode == y->rope_mode;
}

/* W[o][i] += s * sum_k B[o][k] A[k][i], the sum in double. */
static void merge_matrix(float *W, const float *A, const float *B, int64_t out, int64_t in, int r, double s,
                         double *acc) {
    for (int64_t o = 0; o < out; o++) {
        memset(acc, 0, (size_t)in * sizeof *acc);
        for (int k = 0; k < r; k++) {
            double b = B[o * r + k];
            const float *a = A + (size_t)k * (size_t)in;
            for (int64_t i = 0; i < in; i++) acc[i] += b * a[i];
        }
        float *w = W + (size_t)o * (size_t)in;
        for (int64_t i = 0; i < in; i++) w[i] = (float)((double)w[i] + s * acc[i]);
    }
}

static int merge_layers(vks_model *f, const vks_lora_adapter *a) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    double s = vks_lora_scale(lc->alpha, lc->rank);
    int64_t widest = f->cfg.dim > f->cfg.hidden_dim ? f->cfg.dim : f->cfg.hidden_dim;
    if ((int64_t)f->cfg.n_heads * f->cfg.head_dim > widest) widest = (int64_t)f->cfg.n_heads * f->cfg.head_dim;
    double *acc = malloc((size_t)widest * sizeof *acc);
    if (!acc) return vks_set_error(VKS_ERR_NOMEM, "LoRA merge: out of memory");
    for (int l = 0; l < f->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            const float *A = vks_lora_adapter_A(a, l, (vks_lora_target)t);
            if (!A) continue;
            int64_t out, in;
            vks_lora_target_shape(&f->cfg, (vks_lora_target)t, &out, &in);
            float *W = (float *)f->layers[l].t[vks_lora_target_tensor((vks_lora_target)t)].data;
            merge_matrix(W, A, vks_lora_adapter_B(a, l, (vks_lora_target)t), out, in, lc->rank, s, acc);
        }
    free(acc);
    return VKS_OK;
}

/* m's tensors become f's (f stays alive in m's state). */
static int adopt(vks_model *m, vks_model *f) {
    merge_state *s = calloc(1, sizeof *s);
    if (!s) return vks_set_error(VKS_ERR_NOMEM, "LoRA merge: out of memory");
    *s = (merge_state){m->format_state, m->format_free, f};
    m->format_state = s;
    m->format_free = merge_state_free;
    m->tok_emb = f->tok_emb;
    for (int l = 0; l < m->cfg.n_layers; l++) m->layers[l] = f->layers[l];
    m->final_norm = f->final_norm;
    m->classifier = f->classifier;
    return VKS_OK;
}

/* m's reader state and an adapter's final norm, freed together. */
typedef struct {
    void *state;
    void (*state_free)(void *);
    float *norm;
} norm_state;

static void norm_state_free(void *p) {
    norm_state *s = p;
    if (!s) return;
    if (s->state_free) s->state_free(s->state);
    free(s->norm);
    free(s);
}

int vks_lora_apply_norm(vks_model *m, const vks_lora_adapter *a) {
    if (!m || !a) return vks_set_error(VKS_ERR_ARG, "vks_lora_apply_norm: NULL argument");
    const float *w = vks_lora_adapter_norm(a);
    if (!w) return VKS_OK;
    int64_t dim = m->cfg.dim;
    if (vks_lora_adapter_base_config(a)->dim != dim)
        return vks_set_error(VKS_ERR_ARG, "%s: the LoRA adapter's final norm is for another shape", m->path);
    norm_state *s = calloc(1, sizeof *s);
    float *copy = malloc((size_t)dim * sizeof *copy);
    if (!s || !copy) {
        free(s);
        free(copy);
        return vks_set_error(VKS_ERR_NOMEM, "LoRA final norm: out of memory");
    }
    memcpy(copy, w, (size_t)dim * sizeof *copy);
    *s = (norm_state){m->format_state, m->format_free, copy};
    m->format_state = s;
    m->format_free = norm_state_free;
    m->final_norm = (vks_tensor){.dtype = VKS_DTYPE_F32, .rows = 1, .cols = dim, .data = copy};
    return VKS_OK;
}

int vks_lora_merge(vks_model *m, const vks_lora_adapter *a) {
    if (!m || !a) return vks_set_error(VKS_ERR_ARG, "vks_lora_merge: NULL argument");
    if (!same_shape(&m->cfg, vks_lora_adapter_base_config(a)))
        return vks_set_error(VKS_ERR_ARG, "%s: the LoRA adapter is for another shape or q/k RoPE order", m->path);
    vks_model *f = NULL;
    int rc = vks_model_copy_f32(m, m->cfg.rope_mode, &f);
    if (rc == VKS_OK) rc = merge_layers(f, a);
    if (rc == VKS_OK) rc = adopt(m, f);
    if (rc != VKS_OK) {
        vks_model_free(f);
        return rc;
    }
    return vks_lora_apply_norm(m, a);
}
