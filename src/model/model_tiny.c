/* model_tiny.c: the built-in tiny model (`--init tiny`): a small Llama with
 * the byte-level vocabulary, initialised from a seed as GPT-2 initialises,
 * so the demo and the tests need no downloaded model. The architecture and
 * the initialisation are documented in vks_model.h. */
#include "model/model_internal.h"
#include "vkswarm/vks_philox.h"
#include "vkswarm/vks_tokenizer.h"

#include <math.h>
#include <stdio.h>

#define TINY_STD 0.02

void vks_model_tiny_config(vks_model_config *c) {
    *c = (vks_model_config){.dim = 128, .hidden_dim = 384, .n_layers = 4, .n_heads = 4, .n_kv_heads = 2,
                            .vocab_size = VKS_BYTE_VOCAB_SIZE, .seq_len = 512, .head_dim = 32, .kv_dim = 64,
                            .norm_eps = 1e-5f, .rope_theta = 10000.0f, .rope_mode = VKS_ROPE_HALF,
                            .shared_classifier = true};
}

/* One N(0, 1) draw: the 12 words of Philox blocks (seed; tensor, element,
 * 0..2) as uniforms on the 2^-23 grid, which sum exactly in double, so the
 * result has the same bits on every machine (no libm, no rounding order). */
static double normal_draw(uint64_t seed, uint32_t tensor, uint32_t element) {
    double sum = 0.0;
    for (uint32_t block = 0; block < 3; block++) {
        uint32_t u[4];
        vks_philox4_u32(seed, tensor, element, block, u);
        for (int k = 0; k < 4; k++) sum += (double)vks_rng_uniform(u[k]);
    }
    return sum - 6.0;
}

/* Fills a matrix with N(0, std^2); `tensor` keys its draws. */
static void fill_normal(const vks_tensor *t, uint64_t seed, uint32_t tensor, double std) {
    float *w = (float *)t->data;
    uint32_t n = (uint32_t)(t->rows * t->cols); /* < 2^20 here */
    for (uint32_t i = 0; i < n; i++) w[i] = (float)(normal_draw(seed, tensor, i) * std);
}

static void fill_ones(const vks_tensor *t) {
    float *w = (float *)t->data;
    for (int64_t i = 0; i < t->cols; i++) w[i] = 1.0f;
}

static void init_weights(vks_model *m, uint64_t seed) {
    const vks_model_config *c = &m->cfg;
    double residual_std = TINY_STD / sqrt(2.0 * c->n_layers); /* wo and w2 write into the residual stream */
    uint32_t tensor = 0;
    fill_normal(&m->tok_emb, seed, tensor++, TINY_STD);
    for (int l = 0; l < c->n_layers; l++) {
        vks_layer_weights *w = &m->layers[l];
        fill_ones(&w->attn_norm);
        fill_ones(&w->ffn_norm);
        fill_normal(&w->wq, seed, tensor++, TINY_STD);
        fill_normal(&w->wk, seed, tensor++, TINY_STD);
        fill_normal(&w->wv, seed, tensor++, TINY_STD);
        fill_normal(&w->wo, seed, tensor++, residual_std);
        fill_normal(&w->w1, seed, tensor++, TINY_STD);
        fill_normal(&w->w2, seed, tensor++, residual_std);
        fill_normal(&w->w3, seed, tensor++, TINY_STD);
    }
    fill_ones(&m->final_norm);
}

int vks_model_init_tiny(uint64_t seed, vks_model **model, struct vks_tokenizer **tok) {
    if (!model) return vks_set_error(VKS_ERR_ARG, "vks_model_init_tiny: NULL argument");
    *model = NULL;
    if (tok) *tok = NULL;
    vks_model_config c;
    vks_model_tiny_config(&c);
    char name[64];
    snprintf(name, sizeof name, "tiny(seed=%llu)", (unsigned long long)seed);
    vks_model *m = NULL;
    int rc = vks_model_alloc_f32(&c, name, &m);
    if (rc != VKS_OK) return rc;
    init_weights(m, seed);
    m->bos_id = VKS_BYTE_VOCAB_BOS;
    m->eos_id = VKS_BYTE_VOCAB_EOS;
    if (tok && (rc = vks_tokenizer_byte_level(tok)) != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    *model = m;
    return VKS_OK;
}
