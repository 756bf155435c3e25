/* train_forward.c: the training forward, read top to bottom: embedding, per
 * layer the attention block and the FFN block, the head and the
 * log-probability of each row's target, keeping what the backward needs
 * (train_internal.h). Every matmul is f32 (the master weights). */
#include "train_internal.h"
#include "vkswarm/vks_ops_grad.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* y[n, N] = x[n, K] W^T for trainer tensor w (f32 [N, K]). */
static int matmul(vks_trainer *t, vks_cmd *c, vks_buffer *x, int w, vks_buffer *y, uint32_t n) {
    const vks_train_tensor_info *i = &t->tensors[w].info;
    return vks_op_matmul_kind(t->ops, c, bind(x), vks_train_binding(t, VKS_SET_PARAMS, w), VKS_DTYPE_F32, bind(y), n,
                              (uint32_t)i->rows, (uint32_t)i->cols, (uint32_t)i->rows, 0, false, VKS_MATMUL_PREFILL);
}

static int rmsnorm(vks_trainer *t, vks_cmd *c, vks_buffer *x, int w, vks_buffer *out, uint32_t n) {
    return vks_op_rmsnorm(t->ops, c, bind(x), vks_train_binding(t, VKS_SET_PARAMS, w), bind(out), n,
                          (uint32_t)t->cfg.dim, t->cfg.norm_eps);
}

static int bias(vks_trainer *t, vks_cmd *c, vks_buffer *y, int b, uint32_t n, uint32_t cols) {
    return b < 0 ? VKS_OK : vks_op_bias_add(t->ops, c, bind(y), vks_train_binding(t, VKS_SET_PARAMS, b), n, cols);
}

static int rope(vks_trainer *t, vks_cmd *c, vks_buffer *x, uint32_t n, uint32_t heads) {
    const vks_model_config *cf = &t->cfg;
    return vks_op_rope(t->ops, c, bind(x), bind(t->acts.pos), bind(t->acts.rope_table),
                       (uint32_t)t->acts.T, n, heads * (uint32_t)cf->head_dim, 0, heads,
                       (uint32_t)cf->head_dim, (uint32_t)cf->rope_mode);
}

/* Per-head RMSNorm of x [rows, head_dim] (Qwen3's q/k norm), in place; x
 * before it is kept in pre for the backward. */
static int head_norm(vks_trainer *t, vks_cmd *c, vks_buffer *x, vks_buffer *pre, int w, uint32_t rows) {
    uint32_t hd = (uint32_t)t->cfg.head_dim;
    int rc = vks_cmd_copy(c, x, 0, pre, 0, (size_t)rows * hd * sizeof(float));
    return rc ? rc : vks_op_rmsnorm(t->ops, c, bind(pre), vks_train_binding(t, VKS_SET_PARAMS, w), bind(x), rows, hd,
                                    t->cfg.norm_eps);
}

/* x_mid = x_in + attention(norm(x_in)) Wo^T */
static int attention_block(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    const train_layer *L = &t->layers[l];
    train_layer_acts *a = vks_train_layer_acts(t, l);
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    int rc;
    if ((rc = rmsnorm(t, c, t->acts.x_in[l], L->attn_norm, a->xn1, n)) ||
        (rc = matmul(t, c, a->xn1, L->wq, a->q, n)) || (rc = matmul(t, c, a->xn1, L->wk, a->k, n)) ||
        (rc = matmul(t, c, a->xn1, L->wv, a->v, n)) || (rc = bias(t, c, a->q, L->bq, n, qd)) ||
        (rc = bias(t, c, a->k, L->bk, n, kvd)) || (rc = bias(t, c, a->v, L->bv, n, kvd)) ||
        (cf->qk_norm && ((rc = head_norm(t, c, a->q, a->q_pre, L->q_norm, n * (uint32_t)cf->n_heads)) ||
                         (rc = head_norm(t, c, a->k, a->k_pre, L->k_norm, n * (uint32_t)cf->n_kv_heads)))) ||
        (rc = rope(t, c, a->q, n, (uint32_t)cf->n_heads)) || (rc = rope(t, c, a->k, n, (uint32_t)cf->n_kv_heads)) ||
        (rc = vks_op_attention_train(t->ops, c, &(vks_attention_train){VKS_TRAIN_ATTENTION(t, a, n)})) ||
        (rc = matmul(t, c, a->att, L->wo, a->x_mid, n)))
        return rc;
    return vks_op_add(t->ops, c, bind(a->x_mid), bind(t->acts.x_in[l]), n * (uint32_t)cf->dim);
}

/* x_in[l + 1] = x_mid + swiglu(norm(x_mid) W1^T, norm(x_mid) W3^T) W2^T */
static int ffn_block(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    const train_layer *L = &t->layers[l];
    train_layer_acts *a = vks_train_layer_acts(t, l);
    vks_buffer *out = t->acts.x_in[l + 1];
    int rc;
    if ((rc = rmsnorm(t, c, a->x_mid, L->ffn_norm, a->xn2, n)) || (rc = matmul(t, c, a->xn2, L->w1, a->g, n)) ||
        (rc = matmul(t, c, a->xn2, L->w3, a->u, n)) ||
        (rc = vks_op_swiglu(t->ops, c, bind(a->g), bind(a->u), bind(a->h), n * (uint32_t)cf->hidden_dim)) ||
        (rc = matmul(t, c, a->h, L->w2, out, n)))
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
    if ((rc = rmsnorm(t, c, a->x_in[t->cfg.n_layers], t->final_norm, a->xf, n)) ||
        (rc = matmul(t, c, a->xf, t->classifier, a->logits, n)))
        return rc;
    return vks_op_token_logprob(t->ops, c, bind(a->logits), bind(a->target), bind(a->logp), n,
                                (uint32_t)t->cfg.vocab_size);
}

int vks_train_record_forward(vks_trainer *t, vks_cmd *c, uint32_t n) {
    const vks_train_tensor_info *emb = &t->tensors[t->tok_emb].info;
    int rc = vks_op_embed(t->ops, c, bind(t->acts.tokens), vks_train_binding(t, VKS_SET_PARAMS, t->tok_emb),
                          VKS_DTYPE_F32, 0, (uint32_t)emb->rows, (uint32_t)emb->cols, bind(t->acts.x_in[0]), n);
    for (int l = 0; !rc && l < t->cfg.n_layers; l++) rc = vks_train_record_layer_forward(t, c, l, n);
    return rc ? rc : head(t, c, n);
}
