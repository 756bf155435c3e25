/* random_model.c: reproducible random models for tests and benchmarks.
 * Weights live in one owned f32 block in llama2.c layout, so the same views
 * (and the writer) work as for a loaded checkpoint. */
#include "model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RANDOM_MODEL_MAX_BYTES ((size_t)16 << 30)

/* xorshift64* stream: tiny, fast and good enough for weights. */
typedef struct { uint64_t s; } xorshift_rng;

static float rng_uniform_pm1(xorshift_rng *r) { /* uniform in [-1, 1) */
    r->s ^= r->s >> 12;
    r->s ^= r->s << 25;
    r->s ^= r->s >> 27;
    uint32_t u = (uint32_t)((r->s * 0x2545F4914F6CDD1Dull) >> 40); /* 24 bits */
    return (float)u * (2.0f / 16777216.0f) - 1.0f;
}

/* Matrix entries in +-0.5/sqrt(cols) keep activations O(1) through a layer. */
static void fill_matrix(const vks_tensor *t, xorshift_rng *r) {
    float *w = (float *)t->data;
    float amp = 0.5f / sqrtf((float)t->cols);
    size_t n = (size_t)t->rows * (size_t)t->cols;
    for (size_t i = 0; i < n; i++) w[i] = amp * rng_uniform_pm1(r);
}

/* Norm weights 1 +- 0.05. */
static void fill_norm(const vks_tensor *t, xorshift_rng *r) {
    float *w = (float *)t->data;
    for (int64_t i = 0; i < t->cols; i++) w[i] = 1.0f + 0.05f * rng_uniform_pm1(r);
}

static void fill_weights(vks_model *m, uint64_t seed) {
    xorshift_rng r = {seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull};
    if (r.s == 0) r.s = 1; /* xorshift must not start at 0 */
    fill_matrix(&m->tok_emb, &r);
    for (int l = 0; l < m->cfg.n_layers; l++) {
        vks_layer_weights *w = &m->layers[l];
        fill_norm(&w->attn_norm, &r);
        const vks_tensor *mats[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) fill_matrix(mats[i], &r);
        fill_norm(&w->ffn_norm, &r);
    }
    fill_norm(&m->final_norm, &r);
    if (!m->cfg.shared_classifier) fill_matrix(&m->classifier, &r);
    for (int l = 0; l < m->cfg.n_layers && m->cfg.qk_norm; l++) { /* after the rest: older models draw the same */
        fill_norm(&m->layers[l].q_norm, &r);
        fill_norm(&m->layers[l].k_norm, &r);
    }
}

/* Derived fields and llama2.c defaults the caller may leave at 0. */
static vks_model_config complete_config(const vks_model_config *in) {
    vks_model_config c = *in;
    if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
    if (c.kv_dim == 0 && c.n_kv_heads > 0 && c.n_kv_heads <= c.n_heads) c.kv_dim = c.n_kv_heads * c.head_dim;
    if (c.norm_eps == 0.0f) c.norm_eps = 1e-5f;
    if (c.rope_theta == 0.0f) c.rope_theta = 10000.0f;
    return c;
}

int vks_model_alloc_f32(const vks_model_config *c, const char *name, vks_model **out) {
    *out = NULL;
    int rc = vks_model_config_check(c, name);
    if (rc != VKS_OK) return VKS_ERR_ARG; /* message already names the problem */
    vks_l2c_sizes s;
    size_t bytes = 0;
    if (!vks_l2c_sizes_compute(c, &s) || !vks_mul_size(s.total, sizeof(float), &bytes) ||
        bytes > RANDOM_MODEL_MAX_BYTES)
        return vks_set_error(VKS_ERR_NOMEM, "%s: %zu floats exceed the 16 GiB limit", name, s.total);
    vks_model *m = vks_model_alloc();
    if (!m) return VKS_ERR_NOMEM;
    m->cfg = *c;
    snprintf(m->path, sizeof m->path, "%s", name);
    m->owned = calloc(s.total, sizeof(float)); /* zeroed: the unused freq_cis gap stays 0 */
    if (!m->owned) {
        vks_model_free(m);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for %zu bytes", name, bytes);
    }
    rc = vks_model_bind_llama2c(m, m->owned);
    if (rc == VKS_OK) rc = vks_model_bind_optional(false, m);
    if (rc != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    *out = m;
    return VKS_OK;
}

int vks_model_random(const vks_model_config *cfg, uint64_t seed, vks_model **out) {
    if (!cfg || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_random: NULL argument");
    *out = NULL;
    vks_model_config c = complete_config(cfg);
    if (vks_model_config_check(&c, "random model config") != VKS_OK) return VKS_ERR_ARG;
    char name[64];
    snprintf(name, sizeof name, "random(seed=%llu)", (unsigned long long)seed);
    int rc = vks_model_alloc_f32(&c, name, out);
    if (rc == VKS_OK) fill_weights(*out, seed);
    if (rc == VKS_OK && c.qk_norm) snprintf((*out)->arch, sizeof (*out)->arch, "qwen3");
    return rc;
}

/* Biases of every layer, uniform in [-0.1, 0.1). */
static int add_random_biases(vks_model *m, uint64_t seed) {
    int rc = vks_model_bind_optional(true, m);
    xorshift_rng r = {seed * 0x2545F4914F6CDD1Dull + 7};
    for (int l = 0; l < m->cfg.n_layers && rc == VKS_OK; l++)
        for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
            vks_tensor *t = &m->layers[l].t[i];
            if (vks_layer_schema[i].when != VKS_WHEN_BIAS) continue;
            float *w = (float *)(uintptr_t)t->data; /* owned by m */
            for (int64_t k = 0; k < t->cols; k++) w[k] = 0.1f * rng_uniform_pm1(&r);
        }
    return rc;
}

int vks_model_arch_config(vks_model_config *c, const char *arch, bool *has_bias) {
    if (!c || !arch) return vks_set_error(VKS_ERR_ARG, "vks_model_arch_config: NULL argument");
    bool llama3 = !strcmp(arch, "llama3"), qwen2 = !strcmp(arch, "qwen2"), qwen3 = !strcmp(arch, "qwen3");
    if (!llama3 && !qwen2 && !qwen3 && strcmp(arch, "llama"))
        return vks_set_error(VKS_ERR_ARG, "random model: architecture '%.40s' is not llama, llama3, qwen2 or qwen3", arch);
    if (c->head_dim == 0 && c->n_heads > 0) c->head_dim = c->dim / c->n_heads;
    c->kv_dim = c->head_dim * c->n_kv_heads;
    c->rope_mode = qwen2 || qwen3 ? VKS_ROPE_HALF : VKS_ROPE_ADJACENT;
    c->qk_norm = qwen3;
    if (c->rope_theta == 0.0f) c->rope_theta = llama3 ? 500000.0f : qwen2 || qwen3 ? 1000000.0f : 10000.0f;
    if (llama3) c->rope_scaling = (vks_rope_scaling){VKS_ROPE_SCALING_LLAMA3, 8.0f, 1.0f, 4.0f, 8192};
    if (has_bias) *has_bias = qwen2;
    return VKS_OK;
}

int vks_model_random_arch(const vks_model_config *cfg, const char *arch, uint64_t seed, vks_model **out) {
    if (!cfg || !arch || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_random_arch: NULL argument");
    *out = NULL;
    vks_model_config c = *cfg;
    bool has_bias = false;
    int rc = vks_model_arch_config(&c, arch, &has_bias);
    if (rc) return rc;
    c.kv_dim = 0; /* derived by vks_model_random */
    rc = vks_model_random(&c, seed, out);
    if (rc == VKS_OK && has_bias) rc = add_random_biases(*out, seed);
    if (rc == VKS_OK) snprintf((*out)->arch, sizeof (*out)->arch, "%s", strcmp(arch, "llama3") ? arch : "llama");
    if (rc != VKS_OK) {
        vks_model_free(*out);
        *out = NULL;
    }
    return rc;
}
