/* train_backward.c: the backward of the training forward, read bottom to top
 * (train_forward.c read in reverse): the log-probability and the head, then
 * per layer, last first, the FFN block and the attention block, then the
 * embedding. acts.dres carries the gradient of the residual stream; weight
 * gradients accumulate into the gradient set. LoRA: only the adapters get
 * gradients (vks_op_lora_backward); frozen matrices pass dX = dY W back in
 * their type; norms, biases, the embedding and the classifier get none, and
 * nothing flows below layer 0's adapters. */
#include "train_internal.h"
#include "vkswarm/vks_ops_grad.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }
static const vks_binding none = {0};

/* dx (+)= dy W, one product per chunk of W (the later ones add). */
static int backward_x_chunks(vks_trainer *t, vks_cmd *c, const dev_matrix *w, vks_buffer *dy, vks_buffer *dx,
                             bool accumulate_dx, uint32_t n) {
    for (int i = 0; i < w->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * w->rows_per_chunk;
        uint32_t rows = w->rows - row0 < w->rows_per_chunk ? w->rows - row0 : w->rows_per_chunk;
        int rc = vks_op_matmul_backward_x(t->ops, c, bind(dy), w->rows, row0, bind(w->chunk[i]), w->dtype, bind(dx),
                                          n, rows, w->cols, accumulate_dx || i > 0);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* dx (+)= dy W and dW += dy^T x for y = x W^T, W a trained f32 master. */
static int master_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, int w, vks_buffer *dy, vks_buffer *dx,
                           bool accumulate_dx, uint32_t n) {
    const vks_train_tensor_info *i = &t->tensors[w].info;
    uint32_t N = (uint32_t)i->rows, K = (uint32_t)i->cols;
    int rc = dx ? backward_x_chunks(t, c, &t->mats[w], dy, dx, accumulate_dx, n) : VKS_OK;
    return rc ? rc
              : vks_op_matmul_backward_w(t->ops, c, bind(dy), N, 0, bind(x), vks_train_binding(t, VKS_SET_GRADS, w), n,
                                         N, K, true);
}

/* The backward of layer l's matmul k (schema index), y = x W^T: full
 * fine-tuning dx and dW; LoRA dx (dx NULL: skipped) and, where targeted, the
 * adapter's dA and dB from the z the forward kept. */
static int matmul_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, int l, int k, vks_buffer *dy, vks_buffer *dx,
                           bool accumulate_dx, uint32_t n) {
    if (!vks_train_is_lora(t)) return master_backward(t, c, x, t->layers[l].t[k], dy, dx, accumulate_dx, n);
    int target = vks_train_lora_target(k), a = t->adapter[l][target];
    if (a < 0) return dx ? backward_x_chunks(t, c, vks_train_layer_matrix(t, l, k), dy, dx, accumulate_dx, n) : VKS_OK;
    vks_lora_linear ll = vks_train_lora_linear(t, l, k);
    return vks_op_lora_backward(t->ops, c, &ll, bind(x), bind(vks_train_layer_acts(t, l)->z[target]), bind(dy),
                                ll.out, 0, dx ? bind(dx) : none, vks_train_binding(t, VKS_SET_GRADS, a),
                                vks_train_binding(t, VKS_SET_GRADS, a + 1), bind(t->acts.lora_scratch), n,
                                accumulate_dx);
}

/* dres (+)= d(rmsnorm(x, w)) given dout; dw accumulates (when trained). */
static int rmsnorm_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, vks_binding w, vks_binding dw,
                            vks_buffer *dout, uint32_t n, bool accumulate) {
    return vks_op_rmsnorm_backward(t->ops, c, bind(x), w, bind(dout), bind(t->acts.dres), dw,
                                   bind(t->acts.norm_scratch), n, (uint32_t)t->cfg.dim, t->cfg.norm_eps, accumulate);
}

static int layer_norm_backward(vks_trainer *t, vks_cmd *c, vks_buffer *x, int l, int k, vks_buffer *dout,
                               uint32_t n, bool accumulate) {
    return rmsnorm_backward(t, c, x, vks_train_layer_vector(t, VKS_SET_PARAMS, l, k),
                            vks_train_layer_vector(t, VKS_SET_GRADS, l, k), dout, n, accumulate);
}

static int bias_backward(vks_trainer *t, vks_cmd *c, vks_buffer *dy, int l, int k, uint32_t n, uint32_t cols) {
    vks_binding db = vks_train_layer_vector(t, VKS_SET_GRADS, l, k);
    return db.buf ? vks_op_bias_backward(t->ops, c, bind(dy), n, cols, db, true) : VKS_OK;
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
    if (!rc) rc = vks_train_is_lora(t) ? backward_x_chunks(t, c, vks_train_classifier(t), a->logits, a->dxn, false, n)
                                       : master_backward(t, c, a->xf, t->classifier, a->logits, a->dxn, false, n);
    return rc ? rc : rmsnorm_backward(t, c, a->x_in[t->cfg.n_layers], vks_train_final_norm(t, VKS_SET_PARAMS),
                                      vks_train_final_norm(t, VKS_SET_GRADS), a->dxn, n, false);
}

/* x_in[l + 1] = x_mid + swiglu(...) W2^T: dres holds d(x_in[l + 1]) and
 * leaves with d(x_mid) (the residual passes it through). */
static int ffn_backward(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    train_layer_acts *x = vks_train_layer_acts(t, l);
    train_acts *a = &t->acts;
    int rc;
    if ((rc = matmul_backward(t, c, x->h, l, VKS_T_w2, a->dres, a->dh, false, n)) ||
        (rc = vks_op_swiglu_backward(t->ops, c, bind(x->g), bind(x->u), bind(a->dh), bind(a->dg), bind(a->du),
                                     n * (uint32_t)t->cfg.hidden_dim, false)) ||
        (rc = matmul_backward(t, c, x->xn2, l, VKS_T_w1, a->dg, a->dxn, false, n)) ||
        (rc = matmul_backward(t, c, x->xn2, l, VKS_T_w3, a->du, a->dxn, true, n)))
        return rc;
    return layer_norm_backward(t, c, x->x_mid, l, VKS_T_ffn_norm, a->dxn, n, true);
}

/* Through the per-head q/k norm: dout (of the normed rows) -> dx (of pre), dw accumulates. */
static int head_norm_backward(vks_trainer *t, vks_cmd *c, vks_buffer *pre, int l, int k, vks_buffer *dout,
                              vks_buffer *dx, uint32_t rows) {
    return vks_op_rmsnorm_backward(t->ops, c, bind(pre), vks_train_layer_vector(t, VKS_SET_PARAMS, l, k), bind(dout),
                                   bind(dx), vks_train_layer_vector(t, VKS_SET_GRADS, l, k),
                                   bind(t->acts.norm_scratch), rows, (uint32_t)t->cfg.head_dim, t->cfg.norm_eps,
                                   false);
}

/* x_mid = x_in + attention(norm(x_in)) Wo^T: dres holds d(x_mid) and leaves
 * with d(x_in[l]); LoRA at layer 0 stops at the adapters' gradients (nothing
 * below is trained). */
static int attention_backward(vks_trainer *t, vks_cmd *c, int l, uint32_t n) {
    const vks_model_config *cf = &t->cfg;
    train_layer_acts *x = vks_train_layer_acts(t, l);
    train_acts *a = &t->acts;
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    vks_buffer *dq = cf->qk_norm ? a->dq_pre : a->dq, *dk = cf->qk_norm ? a->dk_pre : a->dk; /* of the projections */
    bool to_input = !vks_train_is_lora(t) || l > 0;
    vks_buffer *dxn = to_input ? a->dxn : NULL;
    int rc;
    if ((rc = matmul_backward(t, c, x->att, l, VKS_T_wo, a->dres, a->datt, false, n)) ||
        (rc = vks_op_attention_train_backward(t->ops, c, &(vks_attention_train){VKS_TRAIN_ATTENTION(t, x, n)},
                                              bind(a->datt), bind(a->dq), bind(a->dk), bind(a->dv),
                                              bind(a->attn_scratch), false)) ||
        (rc = rope_backward(t, c, a->dq, n, (uint32_t)cf->n_heads)) ||
        (rc = rope_backward(t, c, a->dk, n, (uint32_t)cf->n_kv_heads)) ||
        (cf->qk_norm && ((rc = head_norm_backward(t, c, x->q_pre, l, VKS_T_q_norm, a->dq, a->dq_pre,
                                                  n * (uint32_t)cf->n_heads)) ||
                         (rc = head_norm_backward(t, c, x->k_pre, l, VKS_T_k_norm, a->dk, a->dk_pre,
                                                  n * (uint32_t)cf->n_kv_heads)))) ||
        (rc = bias_backward(t, c, dq, l, VKS_T_bq, n, qd)) || (rc = bias_backward(t, c, dk, l, VKS_T_bk, n, kvd)) ||
        (rc = bias_backward(t, c, a->dv, l, VKS_T_bv, n, kvd)) ||
        (rc = matmul_backward(t, c, x->xn1, l, VKS_T_wq, dq, dxn, false, n)) ||
        (rc = matmul_backward(t, c, x->xn1, l, VKS_T_wk, dk, dxn, true, n)) ||
        (rc = matmul_backward(t, c, x->xn1, l, VKS_T_wv, a->dv, dxn, true, n)))
        return rc;
    return to_input ? layer_norm_backward(t, c, a->x_in[l], l, VKS_T_attn_norm, a->dxn, n, true) : VKS_OK;
}

int vks_train_record_backward(vks_trainer *t, vks_cmd *c, uint32_t n, uint32_t n_unique_tokens, bool with_entropy) {
    int rc = head_backward(t, c, n, with_entropy);
    for (int l = t->cfg.n_layers - 1; !rc && l >= 0; l--) {
        if (t->opt.recompute) rc = vks_train_record_layer_forward(t, c, l, n);
        if (!rc) rc = ffn_backward(t, c, l, n);
        if (!rc) rc = attention_backward(t, c, l, n);
    }
    if (rc || vks_train_is_lora(t)) return rc; /* LoRA: the embedding is frozen */
    const vks_train_tensor_info *emb = &t->tensors[t->tok_emb].info;
    return vks_op_embed_backward(t->ops, c, bind(t->acts.embed_index), n_unique_tokens, bind(t->acts.dres), n,
                                 (uint32_t)emb->cols, vks_train_binding(t, VKS_SET_GRADS, t->tok_emb), 0,
                                 (uint32_t)emb->rows);
}
