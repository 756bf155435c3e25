/* train_forward.c: the training forward, read top to bottom: embedding, per
 * layer the attention block and the FFN block, the head and the
 * log-probability of each row's target, keeping what the backward needs
 * (train_internal.h). Full fine-tuning: every matmul is f32 (the master
 * weights). LoRA: the frozen base in its type, the targeted matrices through
 * vks_op_lora_forward (z kept per target for the backward). */
#include "train_internal.h"
#include "vkswarm/vks_ops_grad.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* y[n, rows] = x W^T for a weight matrix, one dispatch per chunk. */
static int matmul_chunks(vks_trainer *t, vks_cmd *c, vks_buffer *x, const dev_matrix *w, vks_buffer *y, uint32_t n) {
    for (int i = 0; i < w->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * w->rows_per_chunk;
        uint32_t rows = w->rows - row0 < w->rows_per_chunk ? w->rows - row0 : w->rows_per_chunk;
        int rc = vks_op_matmul_kind(t->ops, c, bind(x), bind(w->chunk[i]), w->dtype, bind(y), n, rows, w->cols,
                                    w->rows, row0, false, VKS_MATMUL_PREFILL);
        if (rc) return rc;
    }
    return VKS_OK;
}

vks_lora_linear vks_train_lora_linear(const vks_trainer *t, int l, int k) {
    const dev_matrix *w = vks_train_layer_matrix(t, l, k);
    int a = t->adapter[l][vks_train_lora_target(k)];
    return (vks_lora_linear){.in = w->cols, .out = w->rows, .rank = (uint32_t)t->lora.rank, .scale = t->lora_scale,
                             .W = bind(w->chunk[0]), .w_dtype = w->dtype,
                             .A = vks_train_binding(t, VKS_SET_PARAMS, a),
                             .B = vks_train_binding(t, VKS_SET_PARAMS, a + 1)};
}

/* y[n, N] = x[n, K] W^T for layer l's matrix k (schema index); with an
 * adapter on it, + scale B (A x) with z = scale A x kept in the layer's set. */
static int matmul(vks_trainer *t, vks_cmd *c, vks_buffer *x, int l, int k, vks_buffer *y, uint32_t n) {
    int target = vks_train_lora_target(k);
    if (!vks_train_is_lora(t) || t->adapter[l][target] < 0)
        return matmul_chunks(t, c, x, vks_train_layer_matrix(t, l, k), y, n);
    vks_lora_linear ll = vks_train_lora_linear(t, l, k);
    return vks_op_lora_forward(t->ops, c, &ll, bind(x), bind(vks_train_layer_acts(t, l)->z[target]), bind(y), n,
                               ll.out, 0, false, VKS_MATMUL_PREFILL);
}

static int rmsnorm(vks_trainer *t, vks_cmd *c, vks_buffer *x, vks_binding w, vks_buffer *out, uint32_t n) {
    return vks_op_rmsnorm(t->ops, c, bind(x), w, bind(out), n, (uint32_t)t->cfg.dim, t->cfg.norm_eps);
}

static int bias(vks_trainer *t, vks_cmd *c, vks_buffer *y, int l, int k, uint32_t n, uint32_t cols) {
    vks_binding b = vks_train_layer_vector(t, VKS_SET_PARAMS, l, k);
    return b.buf ? vks_op_bias_add(t->ops, c, bind(y), b, n, cols) : VKS_OK;
}

static int rope(vks_trainer *t, vks_cmd *c, vks_buffer *x, uint32_t n, uint32_t heads) {
    const vks_model_config *cf = &t->cfg;
    return vks_op_rope(t->ops, c, bind(x), bind(t->acts.pos), bind(t->acts.rope_table),
                       (uint32_t)t->acts.T, n, heads * (uint32_t)cf->head_dim, 0, heads,
                       (uint32_t)cf->head_dim, (uint32_t)cf->rope_mode);
}

/* Per-head RMSNorm of x [rows, head_dim] (Qwen3's q/k norm), in place; x
 * before it is kept in pre for the backward. */
static int head_norm(vks_trainer *t, vks_cmd *c, vks_buffer *x, vks_buffer *pre, vks_binding w, uint32_t rows) {
    uint32_t hd = (uint32_t)t->cfg.head_dim;
    int rc = vks_cmd_copy(c, x, 0, pre, 0, (size_t)rows * hd * sizeof(float));
    return rc ? rc : vks_op_rmsnorm(t->ops, c, bind(pre), w, bind(x), rows, hd, t->cfg.norm_eps);
}

/* x_mid = x_in + attention(norm(x_in)) Wo^T */
static int attention_block(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    train_layer_acts *a = vks_train_layer_acts(t, l);
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    vks_binding attn_norm = vks_train_layer_vector(t, VKS_SET_PARAMS, l, VKS_T_attn_norm);
    vks_binding q_norm = vks_train_layer_vector(t, VKS_SET_PARAMS, l, VKS_T_q_norm);
    vks_binding k_norm = vks_train_layer_vector(t, VKS_SET_PARAMS, l, VKS_T_k_norm);
    int rc;
    if ((rc = rmsnorm(t, c, t->acts.x_in[l], attn_norm, a->xn1, n)) ||
        (rc = matmul(t, c, a->xn1, l, VKS_T_wq, a->q, n)) || (rc = matmul(t, c, a->xn1, l, VKS_T_wk, a->k, n)) ||
        (rc = matmul(t, c, a->xn1, l, VKS_T_wv, a->v, n)) || (rc = bias(t, c, a->q, l, VKS_T_bq, n, qd)) ||
        (rc = bias(t, c, a->k, l, VKS_T_bk, n, kvd)) || (rc = bias(t, c, a->v, l, VKS_T_bv, n, kvd)) ||
        (cf->qk_norm && ((rc = head_norm(t, c, a->q, a->q_pre, q_norm, n * (uint32_t)cf->n_heads)) ||
                         (rc = head_norm(t, c, a->k, a->k_pre, k_norm, n * (uint32_t)cf->n_kv_heads)))) ||
        (rc = rope(t, c, a->q, n, (uint32_t)cf->n_heads)) || (rc = rope(t, c, a->k, n, (uint32_t)cf->n_kv_heads)) ||
        (rc = vks_op_attention_train(t->ops, c, &(vks_attention_train){VKS_TRAIN_ATTENTION(t, a, n)})) ||
        (rc = matmul(t, c, a->att, l, VKS_T_wo, a->x_mid, n)))
        return rc;
    return vks_op_add(t->ops, c, bind(a->x_mid), bind(t->acts.x_in[l]), n * (uint32_t)cf->dim);
}

/* x_in[l + 1] = x_mid + swiglu(norm(x_mid) W1^T, norm(x_mid) W3^T) W2^T */
static int ffn_block(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    train_layer_acts *a = vks_train_layer_acts(t, l);
    vks_buffer *out = t->acts.x_in[l + 1];
    int rc;
    if ((rc = rmsnorm(t, c, a->x_mid, vks_train_layer_vector(t, VKS_SET_PARAMS, l, VKS_T_ffn_norm), a->xn2, n)) ||
        (rc = matmul(t, c, a->xn2, l, VKS_T_w1, a->g, n)) || (rc = matmul(t, c, a->xn2, l, VKS_T_w3, a->u, n)) ||
        (rc = vks_op_swiglu(t->ops, c, bind(a->g), bind(a->u), bind(a->h), n * (uint32_t)cf->hidden_dim)) ||
        (rc = matmul(t, c, a->h, l, VKS_T_w2, out, n)))
        return rc;
    return vks_op_add(t->ops, c, bind(out), bind(a->x_mid), n * (uint32_t)cf->dim);
}

int vks_train_record_layer_forward(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    int rc = attention_block(t, c, l, n);
    return rc ? rc : ffn_block(t, c, l, n);
}

static int head(vks_trainer *t, vks_cmd *c, uint32_t n) {
    train_acts *a = &t->acts;
    int rc;
    if ((rc = rmsnorm(t, c, a->x_in[t->cfg.n_layers], vks_train_final_norm(t, VKS_SET_PARAMS), a->xf, n)) ||
        (rc = matmul_chunks(t, c, a->xf, vks_train_classifier(t), a->logits, n)))
        return rc;
    return vks_op_token_logprob(t->ops, c, bind(a->logits), bind(a->target), bind(a->logp), n,
                                (uint32_t)t->cfg.vocab_size);
}

static int embedding(vks_trainer *t, vks_cmd *c, uint32_t n) {
    const dev_matrix *e = vks_train_embedding(t);
    for (int i = 0; i < e->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * e->rows_per_chunk;
        uint32_t rows = e->rows - row0 < e->rows_per_chunk ? e->rows - row0 : e->rows_per_chunk;
        int rc = vks_op_embed(t->ops, c, bind(t->acts.tokens), bind(e->chunk[i]), e->dtype, row0, rows, e->cols,
                              bind(t->acts.x_in[0]), n);
        if (rc) return rc;
    }
    return VKS_OK;
}

int vks_train_record_forward(vks_trainer *t, vks_cmd *c, uint32_t n) {
    int rc = embedding(t, c, n);
    for (int l = 0; !rc && l < t->cfg.n_layers; l++) rc = vks_train_record_layer_forward(t, c, l, n);
    return rc ? rc : head(t, c, n);
}
