/* The GPU forward over a layer range. Read it top to bottom: create() uploads
 * weights and allocates the KV cache and activations; forward() records the
 * embedding, each layer, and the head into one command buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_ref.h"

#define MAX_CHUNKS 64

/* A weight matrix on the device, split by rows into chunks that each fit in
 * one storage-buffer binding. */
typedef struct {
    vks_dtype dtype;
    uint32_t rows, cols, rows_per_chunk;
    int n_chunks;
    vks_buffer *chunk[MAX_CHUNKS];
} dev_matrix;

typedef struct {
    vks_buffer *attn_norm, *ffn_norm;
    dev_matrix wq, wk, wv, wo, w1, w2, w3;
    vks_buffer *kcache, *vcache;
} dev_layer;

typedef struct {
    vks_buffer *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* [max_rows, ...] */
    vks_buffer *tokens, *slot, *pos;                  /* [max_rows] uint32 */
    vks_buffer *out_rows, *xo, *logits, *sample, *sampled; /* [max_out_rows, ...] */
} dev_activations;

struct vks_engine {
    vks_gpu *gpu;
    vks_ops *ops;
    vks_model_config cfg;
    vks_engine_options opt;
    bool has_embed, has_head;
    dev_matrix tok_emb, classifier;
    vks_buffer *final_norm;
    dev_layer *layers; /* opt.layer_end - opt.layer_begin entries */
    dev_activations act;
    uint64_t weight_bytes, device_bytes;
};

/* ---------- sizes ---------- */

static uint64_t matrix_bytes(vks_dtype t, uint64_t rows, uint64_t cols) {
    return rows * cols * vks_dtype_size(t) + 16;
}

static uint64_t weight_bytes_needed(const vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    vks_dtype t = e->opt.dtype;
    uint64_t per_layer = matrix_bytes(t, (uint64_t)c->n_heads * c->head_dim, c->dim) +
                         2 * matrix_bytes(t, c->kv_dim, c->dim) +
                         matrix_bytes(t, c->dim, (uint64_t)c->n_heads * c->head_dim) +
                         3 * matrix_bytes(t, c->hidden_dim, c->dim) + 2 * ((uint64_t)c->dim * 4 + 16);
    uint64_t total = per_layer * (uint64_t)(e->opt.layer_end - e->opt.layer_begin);
    if (e->has_embed) total += matrix_bytes(t, c->vocab_size, c->dim);
    if (e->has_head) total += (uint64_t)c->dim * 4 + (c->shared_classifier && e->has_embed ? 0 : matrix_bytes(t, c->vocab_size, c->dim));
    return total;
}

static uint64_t kv_bytes_per_layer(const vks_engine *e) {
    return (uint64_t)e->opt.n_slots * (uint64_t)e->opt.kv_len * (uint64_t)e->cfg.kv_dim * 4;
}

static uint64_t activation_bytes(const vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    uint64_t R = (uint64_t)e->opt.max_rows, O = (uint64_t)e->opt.max_out_rows;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim;
    return R * 4 * (2 * (uint64_t)c->dim + 2 * qd + 2 * (uint64_t)c->kv_dim + 2 * (uint64_t)c->hidden_dim + 3) +
           O * 4 * ((uint64_t)c->dim + (uint64_t)c->vocab_size + 2) + O * sizeof(vks_gpu_sample_row);
}

/* ---------- uploads ---------- */

/* Converts `n` elements of src (dtype `from`) into dst (dtype `to`). */
static void convert_elements(const void *src, vks_dtype from, void *dst, vks_dtype to, size_t n) {
    if (from == to) {
        memcpy(dst, src, n * vks_dtype_size(to));
        return;
    }
    for (size_t i = 0; i < n; i++) {
        float f = from == VKS_DTYPE_F32 ? ((const float *)src)[i]
                : from == VKS_DTYPE_F16 ? vks_f16_to_f32(((const uint16_t *)src)[i])
                                        : vks_bf16_to_f32(((const uint16_t *)src)[i]);
        if (to == VKS_DTYPE_F32) ((float *)dst)[i] = f;
        else if (to == VKS_DTYPE_F16) ((uint16_t *)dst)[i] = vks_f32_to_f16(f);
        else ((uint16_t *)dst)[i] = vks_f32_to_bf16(f);
    }
}

/* Uploads `rows` rows of t starting at row0 into buffer b, converted to `to`. */
static int upload_rows(vks_buffer *b, const vks_tensor *t, uint32_t row0, uint32_t rows, vks_dtype to) {
    size_t row_elems = (size_t)t->cols;
    size_t step_rows = ((size_t)8 << 20) / (row_elems * 4) + 1; /* ~8 MiB host blocks */
    void *tmp = malloc(step_rows * row_elems * 4);
    if (!tmp) return vks_set_error(VKS_ERR_NOMEM, "out of host memory converting weights");
    int rc = VKS_OK;
    for (size_t r = 0; r < rows && rc == VKS_OK; r += step_rows) {
        size_t n = rows - r < step_rows ? rows - r : step_rows;
        const char *src = (const char *)t->data + ((size_t)row0 + r) * row_elems * vks_dtype_size(t->dtype);
        convert_elements(src, t->dtype, tmp, to, n * row_elems);
        rc = vks_buffer_upload(b, r * row_elems * vks_dtype_size(to), tmp, n * row_elems * vks_dtype_size(to));
    }
    free(tmp);
    return rc;
}

static int upload_matrix(vks_engine *e, const vks_tensor *t, dev_matrix *out) {
    vks_dtype to = e->opt.dtype;
    uint64_t range = vks_gpu_info(e->gpu)->max_storage_range;
    if (e->opt.max_chunk_bytes && e->opt.max_chunk_bytes < range) range = e->opt.max_chunk_bytes;
    uint64_t row_bytes = (uint64_t)t->cols * vks_dtype_size(to);
    memset(out, 0, sizeof *out);
    out->dtype = to;
    out->rows = (uint32_t)t->rows;
    out->cols = (uint32_t)t->cols;
    uint64_t per_chunk = range > 16 ? (range - 16) / row_bytes : 0;
    per_chunk &= ~(uint64_t)1; /* even rows keep f16 pairs inside a chunk */
    if (per_chunk == 0) return vks_set_error(VKS_ERR_ARG, "a weight row of %llu bytes exceeds the device's storage range",
                                             (unsigned long long)row_bytes);
    out->rows_per_chunk = per_chunk >= out->rows ? out->rows : (uint32_t)per_chunk;
    out->n_chunks = (int)((out->rows + out->rows_per_chunk - 1) / out->rows_per_chunk);
    if (out->n_chunks > MAX_CHUNKS) return vks_set_error(VKS_ERR_ARG, "weight matrix too large (%d chunks)", out->n_chunks);
    for (int i = 0; i < out->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * out->rows_per_chunk;
        uint32_t n = out->rows - row0 < out->rows_per_chunk ? out->rows - row0 : out->rows_per_chunk;
        int rc = vks_buffer_create(e->gpu, (size_t)n * row_bytes, &out->chunk[i]);
        if (!rc) rc = upload_rows(out->chunk[i], t, row0, n, to);
        if (rc) return rc;
    }
    return VKS_OK;
}

static void free_matrix(dev_matrix *m) {
    for (int i = 0; i < m->n_chunks; i++) vks_buffer_destroy(m->chunk[i]);
    m->n_chunks = 0;
}

static int upload_vector(vks_engine *e, const vks_tensor *t, vks_buffer **out) {
    int rc = vks_buffer_create(e->gpu, (size_t)t->cols * 4, out);
    return rc ? rc : upload_rows(*out, t, 0, 1, VKS_DTYPE_F32);
}

static int new_buffer(vks_engine *e, uint64_t bytes, const char *what, vks_buffer **out) {
    if (bytes > vks_gpu_info(e->gpu)->max_storage_range)
        return vks_set_error(VKS_ERR_NOMEM, "%s needs %llu bytes in one binding; the device allows %llu "
                             "(lower the batch or context)", what, (unsigned long long)bytes,
                             (unsigned long long)vks_gpu_info(e->gpu)->max_storage_range);
    return vks_buffer_create(e->gpu, (size_t)bytes, out);
}

static int create_layer(vks_engine *e, const vks_layer_weights *w, dev_layer *l) {
    int rc;
    if ((rc = upload_vector(e, &w->attn_norm, &l->attn_norm)) || (rc = upload_vector(e, &w->ffn_norm, &l->ffn_norm)) ||
        (rc = upload_matrix(e, &w->wq, &l->wq)) || (rc = upload_matrix(e, &w->wk, &l->wk)) ||
        (rc = upload_matrix(e, &w->wv, &l->wv)) || (rc = upload_matrix(e, &w->wo, &l->wo)) ||
        (rc = upload_matrix(e, &w->w1, &l->w1)) || (rc = upload_matrix(e, &w->w2, &l->w2)) ||
        (rc = upload_matrix(e, &w->w3, &l->w3)))
        return rc;
    uint64_t kv = kv_bytes_per_layer(e);
    if ((rc = new_buffer(e, kv, "the KV cache of one layer", &l->kcache)) ||
        (rc = new_buffer(e, kv, "the KV cache of one layer", &l->vcache)))
        return rc;
    return VKS_OK;
}

static int create_activations(vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    dev_activations *a = &e->act;
    uint64_t R = (uint64_t)e->opt.max_rows, O = (uint64_t)e->opt.max_out_rows;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim;
    struct { vks_buffer **b; uint64_t bytes; const char *what; } list[] = {
        {&a->x, R * c->dim * 4, "activations"}, {&a->xb, R * c->dim * 4, "activations"},
        {&a->q, R * qd * 4, "queries"}, {&a->att, R * qd * 4, "attention output"},
        {&a->k, R * c->kv_dim * 4, "keys"}, {&a->v, R * c->kv_dim * 4, "values"},
        {&a->hb, R * c->hidden_dim * 4, "FFN activations"}, {&a->hb2, R * c->hidden_dim * 4, "FFN activations"},
        {&a->tokens, R * 4, "tokens"}, {&a->slot, R * 4, "slots"}, {&a->pos, R * 4, "positions"},
        {&a->out_rows, O * 4, "output rows"}, {&a->xo, O * c->dim * 4, "output hidden rows"},
        {&a->logits, O * c->vocab_size * 4, "logits"}, {&a->sample, O * sizeof(vks_gpu_sample_row), "sampler"},
        {&a->sampled, O * 4, "sampled tokens"},
    };
    for (size_t i = 0; i < sizeof list / sizeof list[0]; i++) {
        int rc = new_buffer(e, list[i].bytes, list[i].what, list[i].b);
        if (rc) return rc;
    }
    return VKS_OK;
}

static void free_activations(dev_activations *a) {
    vks_buffer **all = (vks_buffer **)a;
    for (size_t i = 0; i < sizeof *a / sizeof(vks_buffer *); i++) vks_buffer_destroy(all[i]);
}

static int check_options(vks_engine *e, const vks_model *m, const vks_engine_options *opt) {
    e->opt = *opt;
    vks_engine_options *o = &e->opt;
    if (o->layer_begin == 0 && o->layer_end == 0) o->layer_end = m->cfg.n_layers;
    if (o->max_rows <= 0) o->max_rows = 256;
    if (o->max_out_rows <= 0) o->max_out_rows = o->max_rows;
    if (o->n_slots <= 0) o->n_slots = 1;
    if (o->kv_len <= 0) o->kv_len = m->cfg.seq_len;
    if (o->layer_begin < 0 || o->layer_end > m->cfg.n_layers || o->layer_begin >= o->layer_end)
        return vks_set_error(VKS_ERR_ARG, "layer range [%d, %d) is not inside the model's %d layers", o->layer_begin,
                             o->layer_end, m->cfg.n_layers);
    if (o->max_rows > 65536 || o->max_out_rows > o->max_rows || o->n_slots > 65536 || o->kv_len > m->cfg.seq_len ||
        (unsigned)o->dtype > VKS_DTYPE_BF16)
        return vks_set_error(VKS_ERR_ARG, "engine options out of range (rows %d, out rows %d, slots %d, kv_len %d)",
                             o->max_rows, o->max_out_rows, o->n_slots, o->kv_len);
    return VKS_OK;
}

static int check_fits(vks_engine *e) {
    uint64_t need = weight_bytes_needed(e) + 2 * kv_bytes_per_layer(e) * (uint64_t)(e->opt.layer_end - e->opt.layer_begin) +
                    activation_bytes(e);
    uint64_t avail = vks_gpu_free_bytes(e->gpu);
    if (need > avail)
        return vks_set_error(VKS_ERR_NOMEM, "model does not fit on %s: needs %llu bytes of device memory "
                             "(weights %llu, KV cache and activations %llu), %llu available",
                             vks_gpu_info(e->gpu)->name, (unsigned long long)need,
                             (unsigned long long)weight_bytes_needed(e), (unsigned long long)(need - weight_bytes_needed(e)),
                             (unsigned long long)avail);
    return VKS_OK;
}

int vks_engine_create(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, vks_engine **out) {
    if (!g || !m || !opt || !out) return vks_set_error(VKS_ERR_ARG, "vks_engine_create: NULL argument");
    *out = NULL;
    vks_engine *e = calloc(1, sizeof *e);
    if (!e) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    e->gpu = g;
    e->cfg = m->cfg;
    uint64_t before = vks_gpu_free_bytes(g);
    int rc = check_options(e, m, opt);
    if (rc) goto fail;
    e->has_embed = e->opt.layer_begin == 0;
    e->has_head = e->opt.layer_end == m->cfg.n_layers;
    if ((rc = check_fits(e)) || (rc = vks_ops_create(g, &e->ops))) goto fail;
    int n = e->opt.layer_end - e->opt.layer_begin;
    e->layers = calloc((size_t)n, sizeof *e->layers);
    if (!e->layers) { rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory"); goto fail; }
    if (e->has_embed && (rc = upload_matrix(e, &m->tok_emb, &e->tok_emb))) goto fail;
    for (int i = 0; i < n; i++)
        if ((rc = create_layer(e, &m->layers[e->opt.layer_begin + i], &e->layers[i]))) goto fail;
    if (e->has_head) {
        if ((rc = upload_vector(e, &m->final_norm, &e->final_norm))) goto fail;
        if (m->cfg.shared_classifier && e->has_embed) e->classifier = e->tok_emb;
        else if ((rc = upload_matrix(e, &m->classifier, &e->classifier))) goto fail;
    }
    e->weight_bytes = before - vks_gpu_free_bytes(g);
    if ((rc = create_activations(e))) goto fail;
    e->device_bytes = before - vks_gpu_free_bytes(g);
    *out = e;
    return VKS_OK;
fail:
    vks_engine_destroy(e);
    return rc;
}

void vks_engine_destroy(vks_engine *e) {
    if (!e) return;
    int n = e->opt.layer_end - e->opt.layer_begin;
    for (int i = 0; e->layers && i < n; i++) {
        dev_layer *l = &e->layers[i];
        vks_buffer_destroy(l->attn_norm);
        vks_buffer_destroy(l->ffn_norm);
        dev_matrix *ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w1, &l->w2, &l->w3};
        for (int j = 0; j < 7; j++) free_matrix(ms[j]);
        vks_buffer_destroy(l->kcache);
        vks_buffer_destroy(l->vcache);
    }
    free(e->layers);
    if (e->classifier.chunk[0] != e->tok_emb.chunk[0]) free_matrix(&e->classifier);
    free_matrix(&e->tok_emb);
    vks_buffer_destroy(e->final_norm);
    free_activations(&e->act);
    vks_ops_destroy(e->ops);
    free(e);
}

uint64_t vks_engine_device_bytes(const vks_engine *e) { return e ? e->device_bytes : 0; }
uint64_t vks_engine_weight_bytes(const vks_engine *e) { return e ? e->weight_bytes : 0; }
const vks_model_config *vks_engine_config(const vks_engine *e) { return e ? &e->cfg : NULL; }
bool vks_engine_has_embed(const vks_engine *e) { return e && e->has_embed; }
bool vks_engine_has_head(const vks_engine *e) { return e && e->has_head; }
int vks_engine_max_rows(const vks_engine *e) { return e ? e->opt.max_rows : 0; }
int vks_engine_max_out_rows(const vks_engine *e) { return e ? e->opt.max_out_rows : 0; }

/* ---------- forward ---------- */

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* y[:, 0:N] (row stride ldy) (+)= x @ W^T, one dispatch per weight chunk. */
static int matmul(vks_engine *e, vks_cmd *c, vks_buffer *x, const dev_matrix *w, vks_buffer *y, uint32_t M,
                  uint32_t ldy, bool accumulate) {
    for (int i = 0; i < w->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * w->rows_per_chunk;
        uint32_t n = w->rows - row0 < w->rows_per_chunk ? w->rows - row0 : w->rows_per_chunk;
        int rc = vks_op_matmul(e->ops, c, bind(x), bind(w->chunk[i]), w->dtype, bind(y), M, n, w->cols, ldy, row0,
                               accumulate);
        if (rc) return rc;
    }
    return VKS_OK;
}

static int record_embedding(vks_engine *e, vks_cmd *c, uint32_t R) {
    const dev_matrix *t = &e->tok_emb;
    for (int i = 0; i < t->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * t->rows_per_chunk;
        uint32_t n = t->rows - row0 < t->rows_per_chunk ? t->rows - row0 : t->rows_per_chunk;
        int rc = vks_op_embed(e->ops, c, bind(e->act.tokens), bind(t->chunk[i]), t->dtype, row0, n, t->cols,
                              bind(e->act.x), R);
        if (rc) return rc;
    }
    return VKS_OK;
}

static int record_attention_block(vks_engine *e, vks_cmd *c, dev_layer *l, uint32_t R) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t qd = (uint32_t)(cf->n_heads * cf->head_dim), kvd = (uint32_t)cf->kv_dim;
    int rc;
    if ((rc = vks_op_rmsnorm(e->ops, c, bind(a->x), bind(l->attn_norm), bind(a->xb), R, (uint32_t)cf->dim, cf->norm_eps)) ||
        (rc = matmul(e, c, a->xb, &l->wq, a->q, R, qd, false)) ||
        (rc = matmul(e, c, a->xb, &l->wk, a->k, R, kvd, false)) ||
        (rc = matmul(e, c, a->xb, &l->wv, a->v, R, kvd, false)) ||
        (rc = vks_op_rope(e->ops, c, bind(a->q), bind(a->pos), R, qd, 0, (uint32_t)cf->n_heads,
                          (uint32_t)cf->head_dim, cf->rope_theta, (uint32_t)cf->rope_mode)) ||
        (rc = vks_op_rope(e->ops, c, bind(a->k), bind(a->pos), R, kvd, 0, (uint32_t)cf->n_kv_heads,
                          (uint32_t)cf->head_dim, cf->rope_theta, (uint32_t)cf->rope_mode)) ||
        (rc = vks_op_kv_store(e->ops, c, bind(a->k), bind(a->v), bind(l->kcache), bind(l->vcache), bind(a->slot),
                              bind(a->pos), R, kvd, (uint32_t)e->opt.kv_len)) ||
        (rc = vks_op_attention(e->ops, c, bind(a->q), bind(l->kcache), bind(l->vcache), bind(a->slot), bind(a->pos),
                               bind(a->att), R, (uint32_t)cf->n_heads, (uint32_t)cf->n_kv_heads,
                               (uint32_t)cf->head_dim, (uint32_t)e->opt.kv_len)))
        return rc;
    /* residual: x += wo @ att (the matmul accumulates into x) */
    return matmul(e, c, a->att, &l->wo, a->x, R, (uint32_t)cf->dim, true);
}

static int record_ffn_block(vks_engine *e, vks_cmd *c, dev_layer *l, uint32_t R) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t H = (uint32_t)cf->hidden_dim;
    int rc;
    if ((rc = vks_op_rmsnorm(e->ops, c, bind(a->x), bind(l->ffn_norm), bind(a->xb), R, (uint32_t)cf->dim, cf->norm_eps)) ||
        (rc = matmul(e, c, a->xb, &l->w1, a->hb, R, H, false)) ||
        (rc = matmul(e, c, a->xb, &l->w3, a->hb2, R, H, false)) ||
        (rc = vks_op_swiglu(e->ops, c, bind(a->hb), bind(a->hb2), bind(a->hb), R * H)))
        return rc;
    return matmul(e, c, a->hb, &l->w2, a->x, R, (uint32_t)cf->dim, true);
}

static int record_head(vks_engine *e, vks_cmd *c, const vks_forward_batch *b) {
    const vks_model_config *cf = &e->cfg;
    dev_activations *a = &e->act;
    uint32_t O = (uint32_t)b->n_out, D = (uint32_t)cf->dim;
    int rc;
    if ((rc = vks_op_gather_rows(e->ops, c, bind(a->x), bind(a->out_rows), bind(a->xo), O, D)) ||
        (rc = vks_op_rmsnorm(e->ops, c, bind(a->xo), bind(e->final_norm), bind(a->xo), O, D, cf->norm_eps)) ||
        (rc = matmul(e, c, a->xo, &e->classifier, a->logits, O, (uint32_t)cf->vocab_size, false)))
        return rc;
    if (b->sample)
        rc = vks_op_sample(e->ops, c, bind(a->logits), bind(a->sample), bind(a->sampled), O, (uint32_t)cf->vocab_size);
    return rc;
}

static int check_batch(const vks_engine *e, const vks_forward_batch *b) {
    const vks_model_config *cf = &e->cfg;
    if (b->n_rows <= 0 || b->n_rows > e->opt.max_rows || !b->slot || !b->pos)
        return vks_set_error(VKS_ERR_ARG, "forward: %d rows (1..%d allowed)", b->n_rows, e->opt.max_rows);
    if (e->has_embed ? !b->tokens : !b->x_in) return vks_set_error(VKS_ERR_ARG, "forward: missing input rows");
    for (int r = 0; r < b->n_rows; r++) {
        if (b->slot[r] >= (uint32_t)e->opt.n_slots || b->pos[r] >= (uint32_t)e->opt.kv_len)
            return vks_set_error(VKS_ERR_ARG, "forward: row %d has slot %u / position %u outside the KV cache "
                                 "(%d slots x %d positions)", r, b->slot[r], b->pos[r], e->opt.n_slots, e->opt.kv_len);
        if (e->has_embed && (b->tokens[r] < 0 || b->tokens[r] >= cf->vocab_size))
            return vks_set_error(VKS_ERR_ARG, "forward: token %d at row %d is outside the vocabulary (%d)",
                                 b->tokens[r], r, cf->vocab_size);
    }
    if (e->has_head) {
        if (b->n_out < 0 || b->n_out > e->opt.max_out_rows || (b->n_out && !b->out_rows) || (b->sample && !b->sampled))
            return vks_set_error(VKS_ERR_ARG, "forward: %d output rows (0..%d allowed)", b->n_out, e->opt.max_out_rows);
        for (int i = 0; i < b->n_out; i++)
            if (b->out_rows[i] >= (uint32_t)b->n_rows)
                return vks_set_error(VKS_ERR_ARG, "forward: output row %u is not a row of this batch", b->out_rows[i]);
    }
    return VKS_OK;
}

static int upload_inputs(vks_engine *e, const vks_forward_batch *b) {
    dev_activations *a = &e->act;
    size_t R = (size_t)b->n_rows;
    int rc;
    if ((rc = vks_buffer_upload(a->slot, 0, b->slot, R * 4)) || (rc = vks_buffer_upload(a->pos, 0, b->pos, R * 4)))
        return rc;
    if (e->has_embed) rc = vks_buffer_upload(a->tokens, 0, b->tokens, R * 4);
    else rc = vks_buffer_upload(a->x, 0, b->x_in, R * (size_t)e->cfg.dim * 4);
    if (rc || !e->has_head || b->n_out == 0) return rc;
    if ((rc = vks_buffer_upload(a->out_rows, 0, b->out_rows, (size_t)b->n_out * 4))) return rc;
    if (b->sample) rc = vks_buffer_upload(a->sample, 0, b->sample, (size_t)b->n_out * sizeof(vks_gpu_sample_row));
    return rc;
}

static int download_outputs(vks_engine *e, const vks_forward_batch *b) {
    dev_activations *a = &e->act;
    size_t O = (size_t)b->n_out, D = (size_t)e->cfg.dim;
    int rc = VKS_OK;
    if (!e->has_head)
        return b->x_out ? vks_buffer_download(a->x, 0, b->x_out, (size_t)b->n_rows * D * 4) : VKS_OK;
    if (O == 0) return VKS_OK;
    if (b->logits) rc = vks_buffer_download(a->logits, 0, b->logits, O * (size_t)e->cfg.vocab_size * 4);
    if (!rc && b->hidden) rc = vks_buffer_download(a->xo, 0, b->hidden, O * D * 4);
    if (!rc && b->sample) rc = vks_buffer_download(a->sampled, 0, b->sampled, O * 4);
    return rc;
}

int vks_engine_forward(vks_engine *e, const vks_forward_batch *b) {
    if (!e || !b) return vks_set_error(VKS_ERR_ARG, "vks_engine_forward: NULL argument");
    int rc = check_batch(e, b);
    if (rc || (rc = upload_inputs(e, b))) return rc;
    vks_cmd *c;
    if ((rc = vks_cmd_begin(e->gpu, &c))) return rc;
    uint32_t R = (uint32_t)b->n_rows;
    if (e->has_embed) rc = record_embedding(e, c, R);
    int n_layers = e->opt.layer_end - e->opt.layer_begin;
    for (int i = 0; i < n_layers && rc == VKS_OK; i++) {
        rc = record_attention_block(e, c, &e->layers[i], R);
        if (rc == VKS_OK) rc = record_ffn_block(e, c, &e->layers[i], R);
    }
    if (rc == VKS_OK && e->has_head && b->n_out > 0) rc = record_head(e, c, b);
    if (rc) {
        vks_cmd_discard(c);
        return rc;
    }
    if ((rc = vks_cmd_submit(c))) return rc;
    return download_outputs(e, b);
}
