/* ref_forward.c: the whole model forward on the CPU from the reference ops,
 * following llama2.c run.c. All n positions go through each layer together:
 * every row's K/V is computed before attention, and causal attention (row r
 * sees keys 0..r) makes this identical to run.c's token-by-token loop.
 * f16/bf16 and block-quantized weights are converted to f32 (vks_dequantize)
 * a chunk of rows at a time. Optional q/k/v biases (Qwen2) are added after
 * their matmuls. */
#include "vkswarm/vks_ref_forward.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_ref.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_lora.h"

#include <stdlib.h>
#include <string.h>

#define CONVERT_CHUNK_ROWS 64

typedef struct {
    float *x, *xb, *q, *k, *v, *att, *tmp, *h1, *h3;
    float *norm_w;    /* one converted norm vector [dim] */
    float *w_chunk;   /* CONVERT_CHUNK_ROWS converted weight rows */
    float *y_chunk;   /* [n, CONVERT_CHUNK_ROWS] partial matmul output */
    uint32_t *pos, *slot;
    double *freqs;    /* RoPE frequencies [head_dim/2] */
    const vks_lora_adapter *lora; /* or NULL */
    int layer;        /* the layer being computed */
    bool kv_f16;      /* K and V rounded to half before attention (the engine's f16 cache) */
} fwd_buffers;

static void free_buffers(fwd_buffers *b) {
    float *all[] = {b->x, b->xb, b->q, b->k, b->v, b->att, b->tmp, b->h1, b->h3,
                    b->norm_w, b->w_chunk, b->y_chunk};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
    free(b->pos);
    free(b->slot);
    free(b->freqs);
}

static int alloc_buffers(fwd_buffers *b, const vks_model_config *c, int n) {
    size_t rows = (size_t)n, dim = (size_t)c->dim, kv = (size_t)c->kv_dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)vks_schema_extent(c, VKS_EXT_Q), widest = dim > hid ? dim : hid;
    if (qd > widest) widest = qd;
    memset(b, 0, sizeof *b);
    b->x = malloc(rows * dim * sizeof(float));
    b->xb = malloc(rows * dim * sizeof(float));
    b->q = malloc(rows * qd * sizeof(float));
    b->att = malloc(rows * qd * sizeof(float));
    b->tmp = malloc(rows * dim * sizeof(float));
    b->k = malloc(rows * kv * sizeof(float));
    b->v = malloc(rows * kv * sizeof(float));
    b->h1 = malloc(rows * hid * sizeof(float));
    b->h3 = malloc(rows * hid * sizeof(float));
    b->norm_w = malloc((dim > (size_t)c->head_dim ? dim : (size_t)c->head_dim) * sizeof(float));
    b->w_chunk = malloc(CONVERT_CHUNK_ROWS * widest * sizeof(float));
    b->y_chunk = malloc(rows * CONVERT_CHUNK_ROWS * sizeof(float));
    b->pos = malloc(rows * sizeof(uint32_t));
    b->slot = calloc(rows, sizeof(uint32_t));
    b->freqs = malloc((size_t)(c->head_dim / 2 + 1) * sizeof(double));
    if (!b->freqs || !b->x || !b->xb || !b->q || !b->att || !b->tmp || !b->k || !b->v || !b->h1 || !b->h3 ||
        !b->norm_w || !b->w_chunk || !b->y_chunk || !b->pos || !b->slot) {
        free_buffers(b);
        return vks_set_error(VKS_ERR_NOMEM, "vks_ref_forward: out of memory for %d positions", n);
    }
    for (int i = 0; i < n; i++) b->pos[i] = (uint32_t)i;
    vks_rope_freqs(c, b->freqs);
    return VKS_OK;
}

/* Converts `count` rows starting at `row` of t into dst as f32 (the row size
 * was validated by vks_model_check_tensors). */
static void convert_rows(const vks_tensor *t, int64_t row, int64_t count, float *dst) {
    uint64_t row_bytes = 0;
    vks_dtype_row_bytes(t->dtype, (uint64_t)t->cols, &row_bytes);
    const unsigned char *src = (const unsigned char *)t->data + (size_t)row * (size_t)row_bytes;
    vks_dequantize(t->dtype, src, dst, (size_t)count * (size_t)t->cols);
}

/* y[r, :] += bias for n rows of bias->cols (no-op when the model has no bias). */
static void add_bias(const vks_tensor *bias, float *y, int n, fwd_buffers *b) {
    if (!bias->data) return;
    size_t cols = (size_t)bias->cols;
    convert_rows(bias, 0, 1, b->w_chunk);
    for (size_t r = 0; r < (size_t)n; r++) vks_ref_add(y + r * cols, b->w_chunk, cols);
}

/* y[M, rows] = x[M, cols] @ W^T for a weight of any dtype. */
static void matmul_tensor(const vks_tensor *W, const float *x, int M, float *y, fwd_buffers *b) {
    int N = (int)W->rows, K = (int)W->cols;
    if (W->dtype == VKS_DTYPE_F32) {
        vks_ref_matmul(x, W->data, M, N, K, y);
        return;
    }
    for (int r0 = 0; r0 < N; r0 += CONVERT_CHUNK_ROWS) {
        int nr = N - r0 < CONVERT_CHUNK_ROWS ? N - r0 : CONVERT_CHUNK_ROWS;
        convert_rows(W, r0, nr, b->w_chunk);
        vks_ref_matmul(x, b->w_chunk, M, nr, K, b->y_chunk);
        for (int m = 0; m < M; m++)
            memcpy(y + (size_t)m * (size_t)N + (size_t)r0, b->y_chunk + (size_t)m * (size_t)nr,
                   (size_t)nr * sizeof(float));
    }
}

/* y[M, out] += scale B (A x) for the current layer's target t (in double,
 * rounded once per element); nothing when the adapter lacks it. */
static int lora_add(fwd_buffers *b, const vks_model_config *c, vks_lora_target t, const float *x, int M, float *y) {
    const float *A = vks_lora_adapter_A(b->lora, b->layer, t), *B = vks_lora_adapter_B(b->lora, b->layer, t);
    if (!A || !B) return VKS_OK;
    int64_t out, in;
    vks_lora_target_shape(c, t, &out, &in);
    const vks_lora_config *lc = vks_lora_adapter_config(b->lora);
    int r = lc->rank;
    double s = vks_lora_scale(lc->alpha, r);
    double *z = malloc((size_t)r * sizeof *z);
    if (!z) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_forward: out of memory");
    for (int m = 0; m < M; m++) {
        const float *xm = x + (size_t)m * (size_t)in;
        float *ym = y + (size_t)m * (size_t)out;
        for (int k = 0; k < r; k++) {
            double acc = 0;
            for (int64_t i = 0; i < in; i++) acc += (double)A[(size_t)k * (size_t)in + (size_t)i] * xm[i];
            z[k] = acc;
        }
        for (int64_t o = 0; o < out; o++) {
            double acc = 0;
            for (int k = 0; k < r; k++) acc += (double)B[(size_t)o * (size_t)r + (size_t)k] * z[k];
            ym[o] = (float)((double)ym[o] + s * acc);
        }
    }
    free(z);
    return VKS_OK;
}

/* matmul_tensor plus the adapter's share of target t. */
static int adapted_matmul(const vks_model *m, const vks_tensor *W, vks_lora_target t, const float *x, int M, float *y,
                          fwd_buffers *b) {
    matmul_tensor(W, x, M, y, b);
    return b->lora ? lora_add(b, &m->cfg, t, x, M, y) : VKS_OK;
}

static void rmsnorm_tensor(const vks_model *m, const vks_tensor *w, const float *x, int n, float *out,
                           fwd_buffers *b) {
    convert_rows(w, 0, 1, b->norm_w);
    vks_ref_rmsnorm(x, b->norm_w, n, m->cfg.dim, m->cfg.norm_eps, out);
}

static int attention_block(const vks_model *m, const vks_layer_weights *w, int n, fwd_buffers *b) {
    const vks_model_config *c = &m->cfg;
    rmsnorm_tensor(m, &w->attn_norm, b->x, n, b->xb, b);
    int rc;
    if ((rc = adapted_matmul(m, &w->wq, VKS_LORA_Q, b->xb, n, b->q, b)) ||
        (rc = adapted_matmul(m, &w->wk, VKS_LORA_K, b->xb, n, b->k, b)) ||
        (rc = adapted_matmul(m, &w->wv, VKS_LORA_V, b->xb, n, b->v, b)))
        return rc;
    add_bias(&w->bq, b->q, n, b);
    add_bias(&w->bk, b->k, n, b);
    add_bias(&w->bv, b->v, n, b);
    int qd = c->n_heads * c->head_dim;
    if (c->qk_norm) { /* per head, before RoPE (Qwen3) */
        convert_rows(&w->q_norm, 0, 1, b->norm_w);
        vks_ref_rmsnorm(b->q, b->norm_w, n * c->n_heads, c->head_dim, c->norm_eps, b->q);
        convert_rows(&w->k_norm, 0, 1, b->norm_w);
        vks_ref_rmsnorm(b->k, b->norm_w, n * c->n_kv_heads, c->head_dim, c->norm_eps, b->k);
    }
    vks_ref_rope(b->q, b->pos, n, qd, 0, c->n_heads, c->head_dim, b->freqs, c->rope_mode);
    vks_ref_rope(b->k, b->pos, n, c->kv_dim, 0, c->n_kv_heads, c->head_dim, b->freqs, c->rope_mode);
    if (b->kv_f16) /* as the engine's kv_store_f16 stores them: nearest even */
        for (size_t i = 0; i < (size_t)n * (size_t)c->kv_dim; i++) {
            b->k[i] = vks_f16_to_f32(vks_f32_to_f16(b->k[i]));
            b->v[i] = vks_f16_to_f32(vks_f32_to_f16(b->v[i]));
        }
    /* One slot whose cache holds exactly these n positions. */
    vks_ref_attention(b->q, b->k, b->v, b->slot, b->pos, n, c->n_heads, c->n_kv_heads, c->head_dim, n,
                      b->att);
    if ((rc = adapted_matmul(m, &w->wo, VKS_LORA_O, b->att, n, b->tmp, b))) return rc;
    vks_ref_add(b->x, b->tmp, (size_t)n * (size_t)c->dim);
    return VKS_OK;
}

static int ffn_block(const vks_model *m, const vks_layer_weights *w, int n, fwd_buffers *b) {
    const vks_model_config *c = &m->cfg;
    rmsnorm_tensor(m, &w->ffn_norm, b->x, n, b->xb, b);
    int rc;
    if ((rc = adapted_matmul(m, &w->w1, VKS_LORA_GATE, b->xb, n, b->h1, b)) ||
        (rc = adapted_matmul(m, &w->w3, VKS_LORA_UP, b->xb, n, b->h3, b)))
        return rc;
    vks_ref_swiglu(b->h1, b->h3, (size_t)n * (size_t)c->hidden_dim, b->h1);
    if ((rc = adapted_matmul(m, &w->w2, VKS_LORA_DOWN, b->h1, n, b->tmp, b))) return rc;
    vks_ref_add(b->x, b->tmp, (size_t)n * (size_t)c->dim);
    return VKS_OK;
}

static int check_args(const vks_model *m, const int32_t *ids, int n, const float *logits) {
    if (!m || !ids || !logits) return vks_set_error(VKS_ERR_ARG, "vks_ref_forward: NULL argument");
    int rc = vks_model_check_tensors(m, "vks_ref_forward");
    if (rc != VKS_OK) return rc;
    if (n <= 0 || n > m->cfg.seq_len)
        return vks_set_error(VKS_ERR_ARG, "vks_ref_forward: n = %d outside 1..seq_len %d", n, m->cfg.seq_len);
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= m->cfg.vocab_size)
            return vks_set_error(VKS_ERR_ARG, "vks_ref_forward: token %d at position %d outside the vocabulary",
                                 ids[i], i);
    return VKS_OK;
}

int vks_ref_forward(const vks_model *m, const int32_t *ids, int n, float *logits, float *hidden) {
    return vks_ref_forward_taps(m, ids, n, logits, hidden, NULL);
}

static int forward(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                   float *hidden, const vks_layer_taps *taps, bool kv_f16);

int vks_ref_forward_kv_f16(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                           float *hidden, const vks_layer_taps *taps) {
    return forward(m, a, ids, n, logits, hidden, taps, true);
}

int vks_ref_forward_taps(const vks_model *m, const int32_t *ids, int n, float *logits, float *hidden,
                         const vks_layer_taps *taps) {
    return vks_ref_forward_lora(m, NULL, ids, n, logits, hidden, taps);
}

int vks_ref_forward_lora(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                         float *hidden, const vks_layer_taps *taps) {
    return forward(m, a, ids, n, logits, hidden, taps, false);
}

static int forward(const vks_model *m, const vks_lora_adapter *a, const int32_t *ids, int n, float *logits,
                   float *hidden, const vks_layer_taps *taps, bool kv_f16) {
    int rc = check_args(m, ids, n, logits);
    if (rc == VKS_OK && a) rc = vks_lora_adapter_check_shape(a, &m->cfg, "vks_ref_forward");
    if (rc != VKS_OK) return rc;
    if (taps && taps->n && (taps->n < 0 || !taps->layers || !taps->out))
        return vks_set_error(VKS_ERR_ARG, "vks_ref_forward: bad layer taps");
    for (int t = 0; taps && t < taps->n; t++)
        if (taps->layers[t] < 1 || taps->layers[t] >= m->cfg.n_layers)
            return vks_set_error(VKS_ERR_ARG, "vks_ref_forward: tap at layer %d", taps->layers[t]);
    const vks_model_config *c = &m->cfg;
    fwd_buffers b;
    if ((rc = alloc_buffers(&b, c, n)) != VKS_OK) return rc;
    b.kv_f16 = kv_f16;
    for (int r = 0; r < n; r++) convert_rows(&m->tok_emb, ids[r], 1, b.x + (size_t)r * (size_t)c->dim);
    b.lora = a;
    for (int l = 0; l < c->n_layers && rc == VKS_OK; l++) {
        b.layer = l;
        rc = attention_block(m, &m->layers[l], n, &b);
        if (rc == VKS_OK) rc = ffn_block(m, &m->layers[l], n, &b);
        for (int t = 0; taps && t < taps->n; t++)
            if (taps->layers[t] == l + 1)
                memcpy(taps->out + (size_t)t * (size_t)n * (size_t)c->dim, b.x, (size_t)n * (size_t)c->dim * sizeof(float));
    }
    if (rc != VKS_OK) {
        free_buffers(&b);
        return rc;
    }
    rmsnorm_tensor(m, &m->final_norm, b.x, n, b.xb, &b);
    if (hidden) memcpy(hidden, b.xb, (size_t)n * (size_t)c->dim * sizeof(float));
    matmul_tensor(&m->classifier, b.xb, n, logits, &b);
    free_buffers(&b);
    return VKS_OK;
}
