/* engine_forward.c: the forward over a layer range, read top to bottom:
 * embedding, then per layer the attention block and the FFN block (residual
 * adds fused into the output matmuls), then the head (final norm, classifier,
 * optional sampling), all recorded into one command buffer. */
#include <stdlib.h>
#include <string.h>
#include "engine_internal.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* y[:, 0:N] (row stride ldy) (+)= x @ W^T, one dispatch per weight chunk. */
static int matmul(vks_engine *e, vks_cmd *c, vks_buffer *x, const dev_matrix *w, vks_buffer *y, uint32_t M,
                  uint32_t ldy, bool accumulate) {
    for (int i = 0; i < w->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * w->rows_per_chunk;
        uint32_t n = w->rows - row0 < w->rows_per_chunk ? w->rows - row0 : w->rows_per_chunk;
        int rc = vks_op_matmul_kind(e->ops, c, bind(x), bind(w->chunk[i]), w->dtype, bind(y), M, n, w->cols, ldy,
                                    row0, accumulate, e->matmul_kind);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* y_i[:, 0:N_i] = x @ W_i^T for n (<= 3) matrices of x's width: one dispatch
 * (vks_op_matmul_multi, each output's bits as from its own product) where
 * every matrix is one chunk, else matmul() per matrix. */
static int matmul_multi(vks_engine *e, vks_cmd *c, vks_buffer *x, const dev_matrix *const *w, vks_buffer *const *y,
                        const uint32_t *ldy, int n, uint32_t M) {
    vks_matmul_part p[VKS_MATMUL_MAX_PARTS];
    bool fused = n <= VKS_MATMUL_MAX_PARTS;
    for (int i = 0; fused && i < n; i++) {
        fused = w[i]->n_chunks == 1 && w[i]->cols == w[0]->cols;
        p[i] = (vks_matmul_part){.W = bind(w[i]->chunk[0]), .dtype = w[i]->dtype, .y = bind(y[i]), .N = w[i]->rows,
                                 .ldy = ldy[i]};
    }
    if (fused) return vks_op_matmul_multi(e->ops, c, bind(x), p, n, M, w[0]->cols, false, e->matmul_kind);
    for (int i = 0; i < n; i++) {
        int rc = matmul(e, c, x, w[i], y[i], M, ldy[i], false);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* The adapter's y += scale B (A x) after layer l's target-t product (none without one). */
static int lora(vks_engine *e, vks_cmd *c, const dev_layer *l, vks_lora_target t, vks_buffer *x, vks_buffer *y,
                uint32_t R, uint32_t ldy) {
    return vks_engine_record_lora(e, c, (int)(l - e->w.layers), t, x, y, R, ldy);
}

static int record_embedding(vks_engine *e, vks_cmd *c, uint32_t R) {
    const dev_matrix *t = &e->w.tok_emb;
    for (int i = 0; i < t->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * t->rows_per_chunk;
        uint32_t n = t->rows - row0 < t->rows_per_chunk ? t->rows - row0 : t->rows_per_chunk;
        int rc = vks_op_embed(e->ops, c, bind(e->act.tokens), bind(t->chunk[i]), t->dtype, row0, n, t->cols,
                              bind(e->act.x), R);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* RoPE, the KV store and attention over the cache. f32 cache: RoPE fused
 * with the store (rope_kv_store); f16 cache (opt.kv_f16): RoPE on q and k,
 * kv_store_f16, the split attention. */
static int record_kv_attention(vks_engine *e, vks_cmd *c, const dev_layer_kv *kv, uint32_t R) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t kvd = (uint32_t)cf->kv_dim, L = (uint32_t)e->opt.kv_len, mode = (uint32_t)cf->rope_mode;
    uint32_t H = (uint32_t)cf->n_heads, KH = (uint32_t)cf->n_kv_heads, hd = (uint32_t)cf->head_dim;
    int rc;
    if (e->opt.kv_f16) {
        if ((rc = vks_op_rope(e->ops, c, bind(a->q), bind(a->pos), bind(a->rope_table), L, R, H * hd, 0, H, hd, mode)) ||
            (rc = vks_op_rope(e->ops, c, bind(a->k), bind(a->pos), bind(a->rope_table), L, R, kvd, 0, KH, hd, mode)) ||
            (rc = vks_op_kv_store_f16(e->ops, c, bind(a->k), bind(a->v), bind(kv->kcache), bind(kv->vcache),
                                      bind(a->slot), bind(a->pos), R, kvd, L)))
            return rc;
        return vks_op_attention_f16_kind(e->ops, c, bind(a->q), bind(kv->kcache), bind(kv->vcache), bind(a->slot),
                                         bind(a->pos), bind(a->att_part), bind(a->att), R, H, KH, hd, L,
                                         e->matmul_kind);
    }
    /* RoPE on q in place and on k into the cache, v into the cache: one dispatch */
    if ((rc = vks_op_rope_kv_store(e->ops, c, bind(a->q), bind(a->k), bind(a->v), bind(kv->kcache), bind(kv->vcache),
                                   bind(a->slot), bind(a->pos), bind(a->rope_table), L, R, H, KH, hd, mode, L)))
        return rc;
    return vks_op_attention_kind(e->ops, c, bind(a->q), bind(kv->kcache), bind(kv->vcache), bind(a->slot),
                                 bind(a->pos), bind(a->att), R, H, KH, hd, L, e->matmul_kind);
}

static int record_attention_block(vks_engine *e, vks_cmd *c, const dev_layer *l, const dev_layer_kv *kv,
                                  uint32_t R) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    /* q, k, v: one product (LoRA adds to each output after it) */
    const dev_matrix *qkv_w[] = {&l->mat[VKS_T_wq], &l->mat[VKS_T_wk], &l->mat[VKS_T_wv]};
    vks_buffer *qkv_y[] = {a->q, a->k, a->v};
    const uint32_t qkv_ldy[] = {qd, kvd, kvd};
    int rc;
    if ((rc = vks_op_rmsnorm(e->ops, c, bind(a->x), bind(l->vec[VKS_T_attn_norm]), bind(a->xb), R, (uint32_t)cf->dim, cf->norm_eps)) ||
        (rc = matmul_multi(e, c, a->xb, qkv_w, qkv_y, qkv_ldy, 3, R)) ||
        (rc = lora(e, c, l, VKS_LORA_Q, a->xb, a->q, R, qd)) ||
        (rc = lora(e, c, l, VKS_LORA_K, a->xb, a->k, R, kvd)) ||
        (rc = lora(e, c, l, VKS_LORA_V, a->xb, a->v, R, kvd)) ||
        (l->vec[VKS_T_bq] && (rc = vks_op_bias_add(e->ops, c, bind(a->q), bind(l->vec[VKS_T_bq]), R, qd))) ||
        (l->vec[VKS_T_bk] && (rc = vks_op_bias_add(e->ops, c, bind(a->k), bind(l->vec[VKS_T_bk]), R, kvd))) ||
        (l->vec[VKS_T_bv] && (rc = vks_op_bias_add(e->ops, c, bind(a->v), bind(l->vec[VKS_T_bv]), R, kvd))) ||
        (cf->qk_norm && /* per-head RMSNorm before RoPE (Qwen3), in place */
         ((rc = vks_op_rmsnorm(e->ops, c, bind(a->q), bind(l->vec[VKS_T_q_norm]), bind(a->q), R * (uint32_t)cf->n_heads,
                               (uint32_t)cf->head_dim, cf->norm_eps)) ||
          (rc = vks_op_rmsnorm(e->ops, c, bind(a->k), bind(l->vec[VKS_T_k_norm]), bind(a->k),
                               R * (uint32_t)cf->n_kv_heads, (uint32_t)cf->head_dim, cf->norm_eps)))) ||
        (rc = record_kv_attention(e, c, kv, R)))
        return rc;
    /* residual: x += wo @ att (the matmul accumulates into x) */
    if ((rc = matmul(e, c, a->att, &l->mat[VKS_T_wo], a->x, R, (uint32_t)cf->dim, true))) return rc;
    return lora(e, c, l, VKS_LORA_O, a->att, a->x, R, (uint32_t)cf->dim);
}

static int record_ffn_block(vks_engine *e, vks_cmd *c, const dev_layer *l, uint32_t R) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t H = (uint32_t)cf->hidden_dim;
    /* gate and up: one product (LoRA adds to each output after it) */
    const dev_matrix *gate_up_w[] = {&l->mat[VKS_T_w1], &l->mat[VKS_T_w3]};
    vks_buffer *gate_up_y[] = {a->hb, a->hb2};
    const uint32_t gate_up_ldy[] = {H, H};
    /* without LoRA on gate or up: the products and SwiGLU as one op (hb2 its scratch) */
    const dev_matrix *wg = gate_up_w[0], *wu = gate_up_w[1];
    bool gate_up_lora = e->lora.layers && (e->lora.targets & (1u << VKS_LORA_GATE | 1u << VKS_LORA_UP));
    int rc = vks_op_rmsnorm(e->ops, c, bind(a->x), bind(l->vec[VKS_T_ffn_norm]), bind(a->xb), R, (uint32_t)cf->dim,
                            cf->norm_eps);
    if (rc == VKS_OK && !gate_up_lora && wg->n_chunks == 1 && wu->n_chunks == 1 && wg->dtype == wu->dtype &&
        wg->cols == wu->cols && wg->rows == H && wu->rows == H) {
        if ((rc = vks_op_matmul_swiglu(e->ops, c, bind(a->xb), bind(wg->chunk[0]), bind(wu->chunk[0]), wg->dtype,
                                       bind(a->hb), bind(a->hb2), R, H, wg->cols, e->matmul_kind)) ||
            (rc = matmul(e, c, a->hb, &l->mat[VKS_T_w2], a->x, R, (uint32_t)cf->dim, true)))
            return rc;
        return lora(e, c, l, VKS_LORA_DOWN, a->hb, a->x, R, (uint32_t)cf->dim);
    }
    if (rc ||
        (rc = matmul_multi(e, c, a->xb, gate_up_w, gate_up_y, gate_up_ldy, 2, R)) ||
        (rc = lora(e, c, l, VKS_LORA_GATE, a->xb, a->hb, R, H)) ||
        (rc = lora(e, c, l, VKS_LORA_UP, a->xb, a->hb2, R, H)) ||
        (rc = vks_op_swiglu(e->ops, c, bind(a->hb), bind(a->hb2), bind(a->hb), R * H)) ||
        (rc = matmul(e, c, a->hb, &l->mat[VKS_T_w2], a->x, R, (uint32_t)cf->dim, true)))
        return rc;
    return lora(e, c, l, VKS_LORA_DOWN, a->hb, a->x, R, (uint32_t)cf->dim);
}

/* Whether b's output rows are all its rows in order (every decode step): the
 * head then norms x into xo directly, without gathering the rows first. */
static bool outputs_every_row(const vks_forward_batch *b) {
    if (b->n_out != b->n_rows) return false;
    for (int i = 0; i < b->n_out; i++)
        if (b->out_rows[i] != (uint32_t)i) return false;
    return true;
}

static int record_head(vks_engine *e, vks_cmd *c, const vks_forward_batch *b) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t O = (uint32_t)b->n_out, D = (uint32_t)cf->dim;
    int rc;
    if (outputs_every_row(b))
        rc = vks_op_rmsnorm(e->ops, c, bind(a->x), bind(e->w.final_norm), bind(a->xo), O, D, cf->norm_eps);
    else if (!(rc = vks_op_gather_rows(e->ops, c, bind(a->x), bind(a->out_rows), bind(a->xo), O, D)))
        rc = vks_op_rmsnorm(e->ops, c, bind(a->xo), bind(e->w.final_norm), bind(a->xo), O, D, cf->norm_eps);
    if (rc || (rc = matmul(e, c, a->xo, &e->w.classifier, a->logits, O, (uint32_t)cf->vocab_size, false))) return rc;
    if (b->sample) { /* few rows of a large vocabulary: top-k's histograms over several workgroups, same tokens */
        uint32_t W = a->sample_scratch ? vks_op_sample_groups(e->ops, O, (uint32_t)cf->vocab_size) : 1;
        rc = vks_op_sample_split(e->ops, c, bind(a->logits), bind(a->sample), bind(a->sampled), bind(a->sample_scratch),
                                 O, (uint32_t)cf->vocab_size, W);
    }
    /* the sampled tokens' log-probabilities at temperature 1: O floats to download, not O x vocab */
    if (rc == VKS_OK && b->sample && b->sampled_logp)
        rc = vks_op_token_logprob(e->ops, c, bind(a->logits), bind(a->sampled), bind(a->logp), O, (uint32_t)cf->vocab_size);
    return rc;
}

/* The output rows of the residual stream into each tap at boundary `layer`. */
static int record_taps(vks_engine *e, vks_cmd *c, const vks_forward_batch *b, int layer) {
    for (int t = 0; b->taps && t < b->taps->n; t++) {
        if (b->taps->layers[t] != layer) continue;
        int rc = vks_op_gather_rows(e->ops, c, bind(e->act.x), bind(e->act.out_rows), bind(e->tap_bufs[t]),
                                    (uint32_t)b->n_out, (uint32_t)e->cfg.dim);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* One device buffer per tap, made on first use and kept. */
static int ensure_tap_buffers(vks_engine *e, const vks_layer_taps *taps) {
    if (!taps || taps->n <= e->n_tap_bufs) return VKS_OK;
    vks_buffer **b = realloc(e->tap_bufs, sizeof *b * (size_t)taps->n);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "forward: out of host memory");
    e->tap_bufs = b;
    for (; e->n_tap_bufs < taps->n; e->n_tap_bufs++) {
        size_t bytes = (size_t)e->opt.max_out_rows * (size_t)e->cfg.dim * 4;
        int rc = vks_buffer_create(e->gpu, bytes, &e->tap_bufs[e->n_tap_bufs]);
        if (rc) return rc;
    }
    return VKS_OK;
}

static int check_taps(const vks_engine *e, const vks_forward_batch *b) {
    const vks_layer_taps *t = b->taps;
    if (!t || t->n == 0) return VKS_OK;
    if (t->n < 0 || t->n > e->cfg.n_layers || !t->layers || !t->out || !e->w.has_head)
        return vks_set_error(VKS_ERR_ARG, "forward: bad layer taps");
    for (int i = 0; i < t->n; i++)
        if (t->layers[i] <= e->opt.layer_begin || t->layers[i] >= e->opt.layer_end)
            return vks_set_error(VKS_ERR_ARG, "forward: tap at layer %d is not inside the range [%d, %d)", t->layers[i],
                                 e->opt.layer_begin, e->opt.layer_end);
    return ensure_tap_buffers((vks_engine *)e, t);
}

static int check_batch(const vks_engine *e, const vks_forward_batch *b) {
    const vks_model_config *cf = &e->cfg;
    if (b->n_rows <= 0 || b->n_rows > e->opt.max_rows || !b->slot || !b->pos)
        return vks_set_error(VKS_ERR_ARG, "forward: %d rows (1..%d allowed)", b->n_rows, e->opt.max_rows);
    if (e->w.has_embed ? !b->tokens : !b->x_in) return vks_set_error(VKS_ERR_ARG, "forward: missing input rows");
    for (int r = 0; r < b->n_rows; r++) {
        if (b->slot[r] >= (uint32_t)e->opt.n_slots || b->pos[r] >= (uint32_t)e->opt.kv_len)
            return vks_set_error(VKS_ERR_ARG, "forward: row %d has slot %u / position %u outside the KV cache "
                                 "(%d slots x %d positions)", r, b->slot[r], b->pos[r], e->opt.n_slots, e->opt.kv_len);
        if (e->w.has_embed && (b->tokens[r] < 0 || b->tokens[r] >= cf->vocab_size))
            return vks_set_error(VKS_ERR_ARG, "forward: token %d at row %d is outside the vocabulary (%d)",
                                 b->tokens[r], r, cf->vocab_size);
    }
    if (e->w.has_head) {
        if (b->n_out < 0 || b->n_out > e->opt.max_out_rows || (b->n_out && !b->out_rows) || (b->sample && !b->sampled))
            return vks_set_error(VKS_ERR_ARG, "forward: %d output rows (0..%d allowed)", b->n_out, e->opt.max_out_rows);
        if (b->sampled_logp && !b->sample)
            return vks_set_error(VKS_ERR_ARG, "forward: sampled_logp needs sample (the tokens it is of)");
        for (int i = 0; i < b->n_out; i++)
            if (b->out_rows[i] >= (uint32_t)b->n_rows)
                return vks_set_error(VKS_ERR_ARG, "forward: output row %u is not a row of this batch", b->out_rows[i]);
    }
    return VKS_OK;
}

/* ---- host buffers: the step's inputs and outputs travel inside its recording ---- */

enum { FWD_LOGITS = 1, FWD_HIDDEN = 2, FWD_SAMPLE = 4, FWD_X_OUT = 8, FWD_TAPS = 16, FWD_LOGP = 32 };

static size_t place(size_t *at, size_t bytes) {
    size_t here = *at;
    *at += (bytes + 15) / 16 * 16;
    return here;
}

int vks_engine_host_buffers_create(vks_engine *e) {
    size_t R = (size_t)e->opt.max_rows, O = (size_t)e->opt.max_out_rows, D = (size_t)e->cfg.dim;
    engine_host_layout *l = &e->io;
    size_t in = 0, out = 0;
    l->slot = place(&in, R * 4);
    l->pos = place(&in, R * 4);
    l->tokens = place(&in, R * 4);
    l->out_rows = place(&in, O * 4);
    l->sample = place(&in, O * sizeof(vks_gpu_sample_row));
    l->x_in = place(&in, e->w.has_embed ? 0 : R * D * 4);
    l->sampled = place(&out, O * 4);
    l->logp = place(&out, O * 4);
    l->hidden = place(&out, O * D * 4);
    l->x_out = place(&out, e->w.has_head ? 0 : R * D * 4);
    l->in_bytes = in;
    l->out_bytes = out;
    int rc = vks_host_buffer_create(e->gpu, in, &e->host_in);
    return rc ? rc : vks_host_buffer_create(e->gpu, out, &e->host_out);
}

static void recording_free(engine_recording *r) {
    vks_cmd_discard(r->cmd);
    free(r->tap_layers);
    *r = (engine_recording){0};
}

void vks_engine_drop_recordings(vks_engine *e) {
    for (int i = 0; i < ENGINE_RECORDINGS; i++) recording_free(&e->rec[i]);
}

void vks_engine_host_buffers_free(vks_engine *e) {
    vks_engine_drop_recordings(e);
    vks_host_buffer_destroy(e->host_in);
    vks_host_buffer_destroy(e->host_out);
    vks_host_buffer_destroy(e->host_logits);
    vks_host_buffer_destroy(e->host_taps);
    e->host_in = e->host_out = e->host_logits = e->host_taps = NULL;
    e->n_host_taps = 0;
}

static unsigned wanted_outputs(const vks_engine *e, const vks_forward_batch *b) {
    if (!e->w.has_head) return b->x_out ? FWD_X_OUT : 0;
    if (b->n_out == 0) return 0;
    return (b->logits ? FWD_LOGITS : 0) | (b->hidden ? FWD_HIDDEN : 0) | (b->sample ? FWD_SAMPLE : 0) |
           (b->sample && b->sampled_logp ? FWD_LOGP : 0) | (b->taps && b->taps->n > 0 ? FWD_TAPS : 0);
}

static int ensure_host_logits(vks_engine *e) {
    if (e->host_logits) return VKS_OK;
    return vks_host_buffer_create(e->gpu, (size_t)e->opt.max_out_rows * (size_t)e->cfg.vocab_size * 4, &e->host_logits);
}

/* Room for n taps; a larger buffer drops the recordings (they bind the old one). */
static int ensure_host_taps(vks_engine *e, int n) {
    if (n <= e->n_host_taps) return VKS_OK;
    vks_engine_drop_recordings(e);
    vks_host_buffer_destroy(e->host_taps);
    e->host_taps = NULL, e->n_host_taps = 0;
    int rc = vks_host_buffer_create(e->gpu, (size_t)n * (size_t)e->opt.max_out_rows * (size_t)e->cfg.dim * 4, &e->host_taps);
    if (rc == VKS_OK) e->n_host_taps = n;
    return rc;
}

static void write_inputs(vks_engine *e, const vks_forward_batch *b) {
    char *in = vks_host_buffer_map(e->host_in);
    const engine_host_layout *l = &e->io;
    size_t R = (size_t)b->n_rows;
    memcpy(in + l->slot, b->slot, R * 4);
    memcpy(in + l->pos, b->pos, R * 4);
    if (e->w.has_embed) memcpy(in + l->tokens, b->tokens, R * 4);
    else memcpy(in + l->x_in, b->x_in, R * (size_t)e->cfg.dim * 4);
    if (!e->w.has_head || b->n_out == 0) return;
    memcpy(in + l->out_rows, b->out_rows, (size_t)b->n_out * 4);
    if (b->sample) memcpy(in + l->sample, b->sample, (size_t)b->n_out * sizeof(vks_gpu_sample_row));
}

static int record_uploads(vks_engine *e, vks_cmd *c, int n_rows, int n_out, unsigned what) {
    dev_activations *a = &e->act;
    const engine_host_layout *l = &e->io;
    vks_host_buffer *in = e->host_in;
    size_t R = (size_t)n_rows;
    int rc;
    if ((rc = vks_cmd_upload(c, in, l->slot, a->slot, 0, R * 4)) || (rc = vks_cmd_upload(c, in, l->pos, a->pos, 0, R * 4)))
        return rc;
    if (e->w.has_embed) rc = vks_cmd_upload(c, in, l->tokens, a->tokens, 0, R * 4);
    else rc = vks_cmd_upload(c, in, l->x_in, a->x, 0, R * (size_t)e->cfg.dim * 4);
    if (rc || !e->w.has_head || n_out == 0) return rc;
    if ((rc = vks_cmd_upload(c, in, l->out_rows, a->out_rows, 0, (size_t)n_out * 4))) return rc;
    if (what & FWD_SAMPLE) rc = vks_cmd_upload(c, in, l->sample, a->sample, 0, (size_t)n_out * sizeof(vks_gpu_sample_row));
    return rc;
}

/* A device-to-host copy, its bytes added to *bytes. */
static int download(vks_cmd *c, vks_buffer *src, vks_host_buffer *dst, size_t dst_offset, size_t n, uint64_t *bytes) {
    *bytes += n;
    return vks_cmd_download(c, src, 0, dst, dst_offset, n);
}

static int record_downloads(vks_engine *e, vks_cmd *c, int n_rows, int n_out, int n_taps, unsigned what,
                            uint64_t *bytes) {
    dev_activations *a = &e->act;
    const engine_host_layout *l = &e->io;
    size_t O = (size_t)n_out, D = (size_t)e->cfg.dim;
    int rc = VKS_OK;
    if (what & FWD_X_OUT) rc = download(c, a->x, e->host_out, l->x_out, (size_t)n_rows * D * 4, bytes);
    if (!rc && (what & FWD_LOGITS)) rc = download(c, a->logits, e->host_logits, 0, O * (size_t)e->cfg.vocab_size * 4, bytes);
    if (!rc && (what & FWD_HIDDEN)) rc = download(c, a->xo, e->host_out, l->hidden, O * D * 4, bytes);
    if (!rc && (what & FWD_SAMPLE)) rc = download(c, a->sampled, e->host_out, l->sampled, O * 4, bytes);
    if (!rc && (what & FWD_LOGP)) rc = download(c, a->logp, e->host_out, l->logp, O * 4, bytes);
    for (int t = 0; !rc && (what & FWD_TAPS) && t < n_taps; t++)
        rc = download(c, e->tap_bufs[t], e->host_taps, (size_t)t * O * D * 4, O * D * 4, bytes);
    return rc;
}

static void read_outputs(vks_engine *e, const vks_forward_batch *b, unsigned what) {
    const char *out = vks_host_buffer_map(e->host_out);
    const engine_host_layout *l = &e->io;
    size_t O = (size_t)b->n_out, D = (size_t)e->cfg.dim;
    if (what & FWD_X_OUT) memcpy(b->x_out, out + l->x_out, (size_t)b->n_rows * D * 4);
    if (what & FWD_LOGITS)
        memcpy(b->logits, vks_host_buffer_map(e->host_logits), O * (size_t)e->cfg.vocab_size * 4);
    if (what & FWD_HIDDEN) memcpy(b->hidden, out + l->hidden, O * D * 4);
    if (what & FWD_SAMPLE) memcpy(b->sampled, out + l->sampled, O * 4);
    if (what & FWD_LOGP) memcpy(b->sampled_logp, out + l->logp, O * 4);
    if (what & FWD_TAPS) memcpy(b->taps->out, vks_host_buffer_map(e->host_taps), (size_t)b->taps->n * O * D * 4);
}

/* Records the forward of b (its inputs on the device) into c. *layers gets
 * the transformer layers' share of the recording. */
static int record_forward(vks_engine *e, vks_cmd *c, const vks_forward_batch *b, vks_cmd_counts *layers) {
    uint32_t R = (uint32_t)b->n_rows;
    int rc = VKS_OK;
    e->matmul_kind = b->matmul_kind;
    if (e->w.has_embed) rc = record_embedding(e, c, R);
    vks_cmd_counts before, after;
    vks_cmd_counts_get(c, &before);
    for (int i = 0; i < e->w.n_layers && rc == VKS_OK; i++) {
        rc = record_attention_block(e, c, &e->w.layers[i], &e->kv[i], R);
        if (rc == VKS_OK) rc = record_ffn_block(e, c, &e->w.layers[i], R);
        if (rc == VKS_OK && b->n_out > 0) rc = record_taps(e, c, b, e->opt.layer_begin + i + 1);
    }
    vks_cmd_counts_get(c, &after);
    *layers = (vks_cmd_counts){after.dispatches - before.dispatches, after.barriers - before.barriers,
                               after.descriptor_writes - before.descriptor_writes};
    if (rc == VKS_OK && e->w.has_head && b->n_out > 0) rc = record_head(e, c, b);
    return rc;
}

static bool same_taps(const engine_recording *r, const vks_forward_batch *b) {
    int n = b->taps ? b->taps->n : 0;
    return r->n_taps == n && (n == 0 || !memcmp(r->tap_layers, b->taps->layers, sizeof(int) * (size_t)n));
}

/* The recording of this shape and these outputs, or a new one in place of
 * the least recently used: inputs copied in from host_in, the forward,
 * outputs copied out to host_out / host_logits. */
static int find_recording(vks_engine *e, const vks_forward_batch *b, unsigned what, engine_recording **out) {
    engine_recording *lru = &e->rec[0];
    bool every_row = outputs_every_row(b);
    for (int i = 0; i < ENGINE_RECORDINGS; i++) {
        engine_recording *r = &e->rec[i];
        if (r->cmd && r->n_rows == b->n_rows && r->n_out == b->n_out && r->kind == b->matmul_kind && r->what == what &&
            same_taps(r, b) && r->every_row == every_row) {
            r->used = ++e->rec_clock;
            *out = r;
            return VKS_OK;
        }
        if (!r->cmd || (lru->cmd && r->used < lru->used)) lru = r;
    }
    recording_free(lru);
    vks_cmd *c;
    int rc = vks_cmd_begin_reusable(e->gpu, &c);
    if (rc) return rc;
    engine_recording r = {.cmd = c, .n_rows = b->n_rows, .n_out = b->n_out, .kind = b->matmul_kind, .what = what,
                          .every_row = every_row};
    if (what & FWD_TAPS) {
        r.n_taps = b->taps->n;
        if (!(r.tap_layers = malloc(sizeof(int) * (size_t)r.n_taps))) rc = vks_set_error(VKS_ERR_NOMEM, "forward: out of host memory");
        else memcpy(r.tap_layers, b->taps->layers, sizeof(int) * (size_t)r.n_taps);
    }
    if (rc || (rc = record_uploads(e, c, b->n_rows, b->n_out, what)) || (rc = record_forward(e, c, b, &r.layers)) ||
        (rc = record_downloads(e, c, b->n_rows, b->n_out, r.n_taps, what, &r.download_bytes))) {
        recording_free(&r);
        return rc;
    }
    r.used = ++e->rec_clock;
    *lru = r;
    e->stats.recorded++;
    *out = lru;
    return VKS_OK;
}

static int run_forward(vks_engine *e, const vks_forward_batch *b, vks_cmd_counts *layers) {
    unsigned what = wanted_outputs(e, b);
    int rc = (what & FWD_LOGITS) ? ensure_host_logits(e) : VKS_OK;
    if (rc == VKS_OK && (what & FWD_TAPS)) rc = ensure_host_taps(e, b->taps->n);
    engine_recording *r;
    uint64_t recorded_before = e->stats.recorded;
    if (rc || (rc = find_recording(e, b, what, &r))) return rc;
    write_inputs(e, b);
    *layers = r->layers;
    e->stats.download_bytes += r->download_bytes;
    if (e->stats.recorded == recorded_before) layers->descriptor_writes = 0; /* replayed: the host wrote none */
    if ((rc = vks_cmd_run(r->cmd))) { /* not kept: the device may be lost */
        recording_free(r);
        return rc;
    }
    read_outputs(e, b, what);
    return VKS_OK;
}

static void count_forward(vks_engine *e, const vks_gpu_counters *before, double t0, const vks_cmd_counts *layers) {
    vks_gpu_counters after;
    vks_gpu_counters_get(e->gpu, &after);
    vks_engine_stats *s = &e->stats;
    s->forwards++;
    s->dispatches += after.dispatches - before->dispatches;
    s->barriers += after.barriers - before->barriers;
    s->descriptor_writes += after.descriptor_writes - before->descriptor_writes;
    s->submits += after.submits - before->submits;
    s->wait_s += after.wait_s - before->wait_s;
    s->layers += (uint64_t)e->w.n_layers;
    s->layer_dispatches += layers->dispatches;
    s->layer_barriers += layers->barriers;
    s->layer_descriptor_writes += layers->descriptor_writes;
    s->wall_s += vks_seconds_now() - t0;
}

int vks_engine_forward(vks_engine *e, const vks_forward_batch *b) {
    if (!e || !b) return vks_set_error(VKS_ERR_ARG, "vks_engine_forward: NULL argument");
    int rc = check_batch(e, b);
    if (rc || (rc = check_taps(e, b))) return rc;
    double t0 = vks_seconds_now();
    vks_gpu_counters before;
    vks_gpu_counters_get(e->gpu, &before);
    vks_cmd_counts layers = {0};
    rc = run_forward(e, b, &layers);
    if (rc == VKS_OK) count_forward(e, &before, t0, &layers);
    return rc;
}

void vks_engine_stats_get(const vks_engine *e, vks_engine_stats *out) {
    if (out) *out = e ? e->stats : (vks_engine_stats){0};
}
