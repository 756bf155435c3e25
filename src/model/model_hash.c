/* model_hash.c: a model's identity, BLAKE2b-256 over its config and every
 * weight tensor in a fixed order. Rollouts and pipeline stages name the model
 * they ran by this hash. */
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_quant.h"

#include <sodium.h>
#include <string.h>

static void put_i64(crypto_generichash_state *st, int64_t v) {
    uint8_t b[8];
    for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)v >> (8 * i));
    crypto_generichash_update(st, b, sizeof b);
}

static void put_f32(crypto_generichash_state *st, float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    put_i64(st, (int64_t)u);
}

static void put_config(crypto_generichash_state *st, const vks_model_config *c) {
    const int64_t ints[] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, c->vocab_size,
                            c->seq_len, c->head_dim, c->kv_dim, c->rope_mode, c->shared_classifier};
    crypto_generichash_update(st, (const uint8_t *)"vkswarm-model-v1", 16);
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) put_i64(st, ints[i]);
    put_f32(st, c->norm_eps);
    put_f32(st, c->rope_theta);
    if (c->qk_norm) put_i64(st, 0x716b6e6f726d); /* "qknorm": absent from v1, so older models keep their hash */
    if (c->rope_scaling.type != VKS_ROPE_SCALING_NONE) { /* the same */
        put_i64(st, c->rope_scaling.type);
        put_f32(st, c->rope_scaling.factor);
        put_f32(st, c->rope_scaling.low_freq_factor);
        put_f32(st, c->rope_scaling.high_freq_factor);
        put_i64(st, c->rope_scaling.original_context);
    }
}

/* Tensor header (present, dtype, shape) then its bytes. Absent tensors
 * (optional biases) hash as a marker only. */
static int put_tensor(crypto_generichash_state *st, const vks_tensor *t, const char *name) {
    put_i64(st, t->data != NULL);
    if (!t->data) return VKS_OK;
    uint64_t row_bytes, bytes;
    if (t->rows < 0 || t->cols < 0 || !vks_dtype_row_bytes(t->dtype, (uint64_t)t->cols, &row_bytes) ||
        __builtin_mul_overflow(row_bytes, (uint64_t)t->rows, &bytes))
        return vks_set_error(VKS_ERR_FORMAT, "model hash: tensor %s has a bad shape or dtype", name);
    put_i64(st, t->dtype);
    put_i64(st, t->rows);
    put_i64(st, t->cols);
    crypto_generichash_update(st, t->data, bytes);
    return VKS_OK;
}

/* A layer: the tensors always present in schema order, then the optional
 * ones (absent q/k/v biases as their marker, as version 1 had them; other
 * absent ones add nothing), so the hash of a model made before the schema is
 * unchanged. */
static int put_layer(crypto_generichash_state *st, const vks_layer_weights *w) {
    int rc = VKS_OK;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < VKS_LAYER_N_TENSORS && rc == VKS_OK; i++)
            if ((vks_layer_schema[i].when == VKS_WHEN_ALWAYS) == (pass == 0) &&
                (w->t[i].data || vks_layer_schema[i].when == VKS_WHEN_BIAS))
                rc = put_tensor(st, &w->t[i], vks_layer_schema[i].name);
    return rc;
}

int vks_model_hash(const vks_model *m, uint8_t out[32]) {
    if (!m || !out || !m->layers) return vks_set_error(VKS_ERR_ARG, "vks_model_hash: NULL argument");
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_NOMEM, "vks_model_hash: libsodium failed to start");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    put_config(&st, &m->cfg);
    int rc = put_tensor(&st, &m->tok_emb, "tok_emb");
    for (int l = 0; l < m->cfg.n_layers && rc == VKS_OK; l++) rc = put_layer(&st, &m->layers[l]);
    if (rc == VKS_OK) rc = put_tensor(&st, &m->final_norm, "final_norm");
    if (rc == VKS_OK && !m->cfg.shared_classifier) rc = put_tensor(&st, &m->classifier, "classifier");
    if (rc == VKS_OK) crypto_generichash_final(&st, out, 32);
    return rc;
}
