/* train_backward.c: the backward of the training forward, read bottom to top
 * (train_forward.c read in reverse): the log-probability and the head, then
 * per layer, last first, the FFN block and the attention block, then the
 * embedding. acts.dres carries the gradient of the residual stream; weight
 * gradients accumulate into the gradient set. */
#include "train_internal.h"
#include "vkswarm/vks_ops_grad.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* dx (+)= dy W and dW += dy^T x for y = x W^T, trainer tensor w. */
static int matmul_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, int w, vks_buffer *dy, vks_buffer *dx,
                           bool accumulate_dx, uint32_t n) {
    const vks_train_tensor_info *i = &t->tensors[w].info;
    uint32_t N = (uint32_t)i->rows, K = (uint32_t)i->cols;
    int rc = dx ? vks_op_matmul_backward_x(t->ops, c, bind(dy), N, 0, vks_train_binding(t, VKS_SET_PARAMS, w),
                                           VKS_DTYPE_F32, bind(dx), n, N, K, accumulate_dx)
                : VKS_OK;
    return rc ? rc
              : vks_op_matmul_backward_w(t->ops, c, bind(dy), N, 0, bind(x), vks_train_binding(t, VKS_SET_GRADS, w), n,
                                         N, K, true);
}

/* dres (+)= d(rmsnorm(x, w)) given dout; dw accumulates. */
static int rmsnorm_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, int w, vks_buffer *dout, uint32_t n,
                            bool accumulate) {
    return vks_op_rmsnorm_backward(t->ops, c, bind(x), vks_train_binding(t, VKS_SET_PARAMS, w), bind(dout),
                                   bind(t->acts.dres), vks_train_binding(t, VKS_SET_GRADS, w), bind(t->acts.norm_scratch),
                                   n, (uint32_t)t->cfg.dim, t->cfg.norm_eps, accumulate);
}

static int bias_backward(vks_trainer *t, vks_cmd *c, vks_buffer *dy, int b, uint32_t n, uint32_t cols) {
    return b < 0 ? VKS_OK
                 : vks_op_bias_backward(t->ops, c, bind(dy), n, cols, vks_train_binding(t, VKS_SET_GRADS, b), true);
}

static int rope_backward(vks_trainer *t, vks_cmd *c, vks_buffer *dx, uint32_t n, uint32_t heads) {
    const vks_model_config *cf = &t->cfg;
    return vks_op_rope_backward(t->ops, c, bind(dx), bind(t->acts.pos), bind(t->acts.rope_table),
                       (uint32_t)t->acts.T, n, heads * (uint32_t)cf->head_dim, 0, heads,
                                (uint32_t)cf->head_dim, (uint32_t)cf->rope_mode);
}

/* logp (and the entropy) -> logits -> final norm: leaves d(x_in[n_layers]) in dres. */
static int head_backward(vks_trainer *t, vks_cmd *c, uint32_t n, bool with_entropy) {
    train_acts *a = &t->acts;
    uint32_t V = (uint32_t)t->cfg.vocab_size;
    int rc;
    /* the gradient replaces the logits: nothing reads them after this */
    if (with_entropy)
        rc = vks_op_token_logprob_entropy_backward(t->ops, c, bind(a->logits), bind(a->target), bind(a->dlogp),
                                                   bind(a->grpo_dent), bind(a->logits), bind(a->grpo_entropy), n, V,
                                                   false);
    else
        rc = vks_op_token_logprob_backward(t->ops, c, bind(a->logits), bind(a->target), bind(a->dlogp),
                                           bind(a->logits), n, V, false);
    if (rc || (rc = matmul_backward(t, c, a->xf, t->classifier, a->logits, a->dxn, false, n))) return rc;
    return rmsnorm_backward(t, c, a->x_in[t->cfg.n_layers], t->final_norm, a->dxn, n, false);
}

/* x_in[l + 1] = x_mid + swiglu(...) W2^T: dres holds d(x_in[l + 1]) and
 * leaves with d(x_mid) (the residual passes it through). */
static int ffn_backward(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const train_layer *L = &t->layers[l];
    train_layer_acts *x = vks_train_layer_acts(t, l);
    train_acts *a = &t->acts;
    int rc;
    if ((rc = matmul_backward(t, c, x->h, L->w2, a->dres, a->dh, false, n)) ||
        (rc = vks_op_swiglu_backward(t->ops, c, bind(x->g), bind(x->u), bind(a->dh), bind(a->dg), bind(a->du),
                                     n * (uint32_t)t->cfg.hidden_dim, false)) ||
        (rc = matmul_backward(t, c, x->xn2, L->w1, a->dg, a->dxn, false, n)) ||
        (rc = matmul_backward(t, c, x->xn2, L->w3, a->du, a->dxn, true, n)))
        return rc;
    return rmsnorm_backward(t, c, x->x_mid, L->ffn_norm, a->dxn, n, true);
}

/* Through the per-head q/k norm: dout (of the normed rows) -> dx (of pre), dw accumulates. */
static int head_norm_backward(vks_trainer *t, vks_cmd *c, vks_buffer *pre, int w, vks_buffer *dout, vks_buffer *dx,
                              uint32_t rows) {
    return vks_op_rmsnorm_backward(t->ops, c, bind(pre), vks_train_binding(t, VKS_SET_PARAMS, w), bind(dout), bind(dx),
                                   vks_train_binding(t, VKS_SET_GRADS, w), bind(t->acts.norm_scratch), rows,
                                   (uint32_t)t->cfg.head_dim, t->cfg.norm_eps, false);
}

/* x_mid = x_in + attention(norm(x_in)) Wo^T: dres holds d(x_mid) and leaves
 * with d(x_in[l]). */
static int attention_backward(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    const train_layer *L = &t->layers[l];
    train_layer_acts *x = vks_train_layer_acts(t, l);
    train_acts *a = &t->acts;
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    vks_buffer *dq = cf->qk_norm ? a->dq_pre : a->dq, *dk = cf->qk_norm ? a->dk_pre : a->dk; /* of the projections */
    int rc;
    if ((rc = matmul_backward(t, c, x->att, L->wo, a->dres, a->datt, false, n)) ||
        (rc = vks_op_attention_train_backward(t->ops, c, &(vks_attention_train){VKS_TRAIN_ATTENTION(t, x, n)},
                                              bind(a->datt), bind(a->dq), bind(a->dk), bind(a->dv),
                                              bind(a->attn_scratch), false)) ||
        (rc = rope_backward(t, c, a->dq, n, (uint32_t)cf->n_heads)) ||
        (rc = rope_backward(t, c, a->dk, n, (uint32_t)cf->n_kv_heads)) ||
        (cf->qk_norm && ((rc = head_norm_backward(t, c, x->q_pre, L->q_norm, a->dq, a->dq_pre, n * (uint32_t)cf->n_heads)) ||
                         (rc = head_norm_backward(t, c, x->k_pre, L->k_norm, a->dk, a->dk_pre,
                                                  n * (uint32_t)cf->n_kv_heads)))) ||
        (rc = bias_backward(t, c, dq, L->bq, n, qd)) ||
        (rc = bias_backward(t, c, dk, L->bk, n, kvd)) || (rc = bias_backward(t, c, a->dv, L->bv, n, kvd)) ||
        (rc = matmul_backward(t, c, x->xn1, L->wq, dq, a->dxn, false, n)) ||
        (rc = matmul_backward(t, c, x->xn1, L->wk, dk, a->dxn, true, n)) ||
        (rc = matmul_backward(t, c, x->xn1, L->wv, a->dv, a->dxn, true, n)))
        return rc;
    return rmsnorm_backward(t, c, a->x_in[l], L->attn_norm, a->dxn, n, true);
}

int vks_train_record_backward(vks_trainer *t, vks_cmd *c, uint32_t n, uint32_t n_unique_tokens, bool with_entropy) {
    int rc = head_backward(t, c, n, with_entropy);
    for (int l = t->cfg.n_layers - 1; !rc && l >= 0; l--) {
        if (t->opt.recompute) rc = vks_train_record_layer_forward(t, c, l, n);
        if (!rc) rc = ffn_backward(t, c, l, n);
        if (!rc) rc = attention_backward(t, c, l, n);
    }
    if (rc) return rc;
    const vks_train_tensor_info *emb = &t->tensors[t->tok_emb].info;
    return vks_op_embed_backward(t->ops, c, bind(t->acts.embed_index), n_unique_tokens, bind(t->acts.dres), n,
                                 (uint32_t)emb->cols, vks_train_binding(t, VKS_SET_GRADS, t->tok_emb), 0,
                                 (uint32_t)emb->rows);
}
