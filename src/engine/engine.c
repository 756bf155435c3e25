/* The GPU forward over a layer range. Read it top to bottom: create() uploads
 * weights and allocates the KV cache and activations; forward() records the
 * embedding, each layer, and the head into one command buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_quant.h"

#define MAX_CHUNKS 64
/* Weights are converted on the host a chunk at a time; chunks are capped so
 * that the host copy stays moderate even where bindings may be 4 GiB. */
#define MAX_HOST_CHUNK_BYTES ((uint64_t)256 << 20)
#define HOST_STEP_BYTES ((size_t)8 << 20)

/* A weight matrix on the device, split by rows into chunks that each fit in
 * one storage-buffer binding. Each chunk is a self-contained matrix in the
 * GPU layout of vks_op_pack_weights (block types stay quantized). */
typedef struct {
    vks_dtype dtype;
    uint32_t rows, cols, rows_per_chunk;
    int n_chunks;
    vks_buffer *chunk[MAX_CHUNKS];
} dev_matrix;

typedef struct {
    vks_buffer *attn_norm, *ffn_norm;
    dev_matrix wq, wk, wv, wo, w1, w2, w3;
    vks_buffer *bq, *bk, *bv; /* q/k/v biases (Qwen2); NULL when absent */
    vks_buffer *kcache, *vcache;
} dev_layer;

typedef struct {
    vks_buffer *x, *xb, *q, *k, *v, *att, *hb, *hb2; /* [max_rows, ...] */
    vks_buffer *tokens, *slot, *pos;                  /* [max_rows] uint32 */
    vks_buffer *out_rows, *xo, *logits, *sample, *sampled; /* [max_out_rows, ...] */
} dev_activations;

struct vks_engine {
    vks_matmul_kind matmul_kind; /* of the forward being recorded */
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
    uint64_t embed_bytes; /* device bytes of the token embedding table */
};

/* ---------- sizes ---------- */

/* The dtype a weight matrix gets on the device. keep_file_dtype keeps each
 * tensor's own type, except Q6_K (no kernel yet), which becomes f16. Rows that
 * are not a whole number of blocks of a block type (stories260K's hidden 172,
 * Q4_K's 256 against dim 64) fall back to f16, as llama.cpp falls back to
 * another type for such tensors. Norms and biases are always f32. */
static vks_dtype device_dtype(const vks_engine *e, vks_dtype file_dtype, int64_t cols) {
    vks_dtype t = e->opt.keep_file_dtype ? file_dtype : e->opt.dtype;
    if (t == VKS_DTYPE_Q6_K) t = VKS_DTYPE_F16;
    size_t be = vks_dtype_block_elems(t);
    if (be == 0 || cols % (int64_t)be) t = VKS_DTYPE_F16;
    return t;
}

/* Device bytes of a [rows, cols] matrix stored from `t` (NULL: shape only, opt.dtype). */
static uint64_t matrix_bytes(const vks_engine *e, const vks_tensor *t, uint64_t rows, uint64_t cols) {
    vks_dtype dt = device_dtype(e, t ? t->dtype : e->opt.dtype, (int64_t)cols);
    uint64_t chunk_pad = 16 * (1 + rows * cols / (MAX_HOST_CHUNK_BYTES / 2));
    return (uint64_t)vks_op_weight_bytes(dt, rows, cols) + chunk_pad;
}

static uint64_t weight_bytes_needed(const vks_engine *e, const vks_model *m) {
    const vks_model_config *c = &m->cfg;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim, kv = (uint64_t)c->kv_dim, d = (uint64_t)c->dim;
    uint64_t h = (uint64_t)c->hidden_dim, total = 0;
    for (int l = e->opt.layer_begin; l < e->opt.layer_end; l++) {
        const vks_layer_weights *w = m->layers ? &m->layers[l] : NULL;
        total += matrix_bytes(e, w ? &w->wq : NULL, qd, d) + matrix_bytes(e, w ? &w->wk : NULL, kv, d) +
                 matrix_bytes(e, w ? &w->wv : NULL, kv, d) + matrix_bytes(e, w ? &w->wo : NULL, d, qd) +
                 matrix_bytes(e, w ? &w->w1 : NULL, h, d) + matrix_bytes(e, w ? &w->w3 : NULL, h, d) +
                 matrix_bytes(e, w ? &w->w2 : NULL, d, h) + 2 * (d * 4 + 16) + (qd + 2 * kv) * 4 + 48; /* norms, biases */
    }
    if (e->has_embed) total += matrix_bytes(e, &m->tok_emb, (uint64_t)c->vocab_size, d);
    if (e->has_head)
        total += d * 4 + 16 + (c->shared_classifier && e->has_embed ? 0 :
                               matrix_bytes(e, &m->classifier, (uint64_t)c->vocab_size, d));
    return total;
}

/* Bytes of one layer's K (or V) cache; UINT64_MAX when that overflows. */
static uint64_t kv_bytes_of(const vks_engine *e, int n_slots, int kv_len) {
    size_t b = 4;
    if (!vks_mul_size(b, (size_t)n_slots, &b) || !vks_mul_size(b, (size_t)kv_len, &b) ||
        !vks_mul_size(b, (size_t)e->cfg.kv_dim, &b))
        return UINT64_MAX;
    return b;
}

static uint64_t kv_bytes_per_layer(const vks_engine *e) { return kv_bytes_of(e, e->opt.n_slots, e->opt.kv_len); }

static uint64_t activation_bytes(const vks_engine *e) {
    const vks_model_config *c = &e->cfg;
    uint64_t R = (uint64_t)e->opt.max_rows, O = (uint64_t)e->opt.max_out_rows;
    uint64_t qd = (uint64_t)c->n_heads * c->head_dim;
    return R * 4 * (2 * (uint64_t)c->dim + 2 * qd + 2 * (uint64_t)c->kv_dim + 2 * (uint64_t)c->hidden_dim + 3) +
           O * 4 * ((uint64_t)c->dim + (uint64_t)c->vocab_size + 2) + O * sizeof(vks_gpu_sample_row);
}

/* ---------- uploads ---------- */

/* Writes rows [row0, row0 + n) of t, converted to `to`, as a self-contained
 * matrix in the GPU layout into dst, a few MiB of rows at a time: the file's
 * blocks are used as they are when the types agree, else rows go through f32
 * (vks_dequantize) and are converted or quantized (vks_quantize). */
static int pack_chunk(const vks_tensor *t, const char *what, uint32_t row0, uint32_t n, vks_dtype to, void *dst) {
    size_t cols = (size_t)t->cols;
    uint64_t src_row_bytes, dst_row_bytes;
    if (!vks_dtype_row_bytes(t->dtype, cols, &src_row_bytes) || !vks_dtype_row_bytes(to, cols, &dst_row_bytes))
        return vks_set_error(VKS_ERR_FORMAT, "%s: a %s row of %zu elements is not a whole number of blocks", what,
                             vks_dtype_name(t->dtype), cols);
    size_t step = HOST_STEP_BYTES / (cols * 4) + 1;
    float *f32 = NULL;
    void *blocks = NULL;
    if (t->dtype != to) {
        f32 = malloc(step * cols * sizeof(float));
        blocks = malloc(step * (size_t)dst_row_bytes);
        if (!f32 || !blocks) {
            free(f32);
            free(blocks);
            return vks_set_error(VKS_ERR_NOMEM, "out of host memory converting weights");
        }
    }
    int rc = VKS_OK;
    for (size_t r = 0; r < n && rc == VKS_OK; r += step) {
        size_t k = n - r < step ? n - r : step;
        const void *rows = (const char *)t->data + ((size_t)row0 + r) * (size_t)src_row_bytes;
        if (t->dtype != to) {
            vks_dequantize(t->dtype, rows, f32, k * cols);
            rc = vks_quantize(to, f32, blocks, k * cols);
            rows = blocks;
        }
        if (rc == VKS_OK) rc = vks_op_pack_weight_rows(to, rows, r, k, n, cols, dst);
    }
    free(f32);
    free(blocks);
    return rc;
}

static int upload_chunk(vks_engine *e, const vks_tensor *t, const char *what, uint32_t row0, uint32_t n,
                        vks_dtype to, vks_buffer **out) {
    size_t bytes = vks_op_weight_bytes(to, n, (uint64_t)t->cols);
    void *host = calloc(1, bytes);
    if (!host) return vks_set_error(VKS_ERR_NOMEM, "out of host memory converting weights");
    int rc = pack_chunk(t, what, row0, n, to, host);
    if (!rc) rc = vks_buffer_create(e->gpu, bytes, out);
    if (!rc) rc = vks_buffer_upload(*out, 0, host, bytes);
    free(host);
    return rc;
}

/* Uploads weight matrix t (named `what` in errors) in chunks. */
static int upload_matrix(vks_engine *e, const vks_tensor *t, const char *what, dev_matrix *out) {
    vks_dtype to = device_dtype(e, t->dtype, t->cols);
    uint64_t range = vks_gpu_info(e->gpu)->max_storage_range;
    if (e->opt.max_chunk_bytes && e->opt.max_chunk_bytes < range) range = e->opt.max_chunk_bytes;
    if (range > MAX_HOST_CHUNK_BYTES) range = MAX_HOST_CHUNK_BYTES;
    uint64_t row_bytes;
    memset(out, 0, sizeof *out);
    if (!vks_dtype_row_bytes(to, (uint64_t)t->cols, &row_bytes))
        return vks_set_error(VKS_ERR_FORMAT, "%s: rows of %lld elements do not fit %s", what, (long long)t->cols,
                             vks_dtype_name(to));
    out->dtype = to;
    out->rows = (uint32_t)t->rows;
    out->cols = (uint32_t)t->cols;
    uint64_t per_chunk = range > 16 ? (range - 16) / row_bytes : 0;
    per_chunk &= ~(uint64_t)1; /* even rows keep f16 pairs inside a chunk */
    if (per_chunk == 0) return vks_set_error(VKS_ERR_ARG, "%s: a row of %llu bytes exceeds the device's storage range",
                                             what, (unsigned long long)row_bytes);
    out->rows_per_chunk = per_chunk >= out->rows ? out->rows : (uint32_t)per_chunk;
    out->n_chunks = (int)((out->rows + out->rows_per_chunk - 1) / out->rows_per_chunk);
    if (out->n_chunks > MAX_CHUNKS) {
        out->n_chunks = 0;
        return vks_set_error(VKS_ERR_ARG, "%s: weight matrix too large (%u rows of %llu bytes)", what, out->rows,
                             (unsigned long long)row_bytes);
    }
    for (int i = 0; i < out->n_chunks; i++) {
        uint32_t row0 = (uint32_t)i * out->rows_per_chunk;
        uint32_t n = out->rows - row0 < out->rows_per_chunk ? out->rows - row0 : out->rows_per_chunk;
        int rc = upload_chunk(e, t, what, row0, n, to, &out->chunk[i]);
        if (rc) return rc;
    }
    return VKS_OK;
}

static void free_matrix(dev_matrix *m) {
    for (int i = 0; i < m->n_chunks; i++) vks_buffer_destroy(m->chunk[i]);
    m->n_chunks = 0;
}

/* Uploads a vector (norm weights, biases) as f32; `cols` is the length the config implies. */
static int upload_vector(vks_engine *e, const vks_tensor *t, int64_t cols, const char *what, vks_buffer **out) {
    uint64_t row_bytes;
    if (!t->data || t->rows != 1 || t->cols != cols || !vks_dtype_row_bytes(t->dtype, (uint64_t)cols, &row_bytes))
        return vks_set_error(VKS_ERR_FORMAT, "%s: expected %lld values, the model has %lld x %lld of %s", what,
                             (long long)cols, (long long)t->rows, (long long)t->cols, vks_dtype_name(t->dtype));
    float *f = malloc((size_t)cols * sizeof(float));
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    vks_dequantize(t->dtype, t->data, f, (size_t)cols);
    int rc = vks_buffer_create(e->gpu, (size_t)cols * 4, out);
    if (!rc) rc = vks_buffer_upload(*out, 0, f, (size_t)cols * 4);
    free(f);
    return rc;
}

static int new_buffer(vks_engine *e, uint64_t bytes, const char *what, vks_buffer **out) {
    if (bytes > vks_gpu_info(e->gpu)->max_storage_range)
        return vks_set_error(VKS_ERR_NOMEM, "%s needs %llu bytes in one binding; the device allows %llu "
                             "(lower the batch or context)", what, (unsigned long long)bytes,
                             (unsigned long long)vks_gpu_info(e->gpu)->max_storage_range);
    return vks_buffer_create(e->gpu, (size_t)bytes, out);
}

static int create_layer_kv(vks_engine *e, dev_layer *l) {
    uint64_t kv = kv_bytes_per_layer(e);
    int rc = new_buffer(e, kv, "the KV cache of one layer", &l->kcache);
    if (rc == VKS_OK) rc = new_buffer(e, kv, "the KV cache of one layer", &l->vcache);
    return rc;
}

static void free_layer_kv(dev_layer *l) {
    vks_buffer_destroy(l->kcache);
    vks_buffer_destroy(l->vcache);
    l->kcache = l->vcache = NULL;
}

/* Uploads a layer's norms, optional q/k/v biases (Qwen2; absent ones stay
 * NULL) and matrices; errors name the layer and tensor. */
static int create_layer(vks_engine *e, const vks_layer_weights *w, int layer, dev_layer *l) {
    const vks_model_config *c = &e->cfg;
    int64_t d = c->dim, qd = (int64_t)c->n_heads * c->head_dim;
    struct { const vks_tensor *t; int64_t len; vks_buffer **out; const char *name; } vecs[] = {
        {&w->attn_norm, d, &l->attn_norm, "attention norm"}, {&w->ffn_norm, d, &l->ffn_norm, "FFN norm"},
        {&w->bq, qd, &l->bq, "q bias"}, {&w->bk, c->kv_dim, &l->bk, "k bias"}, {&w->bv, c->kv_dim, &l->bv, "v bias"},
    };
    struct { const vks_tensor *t; dev_matrix *out; const char *name; } mats[] = {
        {&w->wq, &l->wq, "wq"}, {&w->wk, &l->wk, "wk"}, {&w->wv, &l->wv, "wv"}, {&w->wo, &l->wo, "wo"},
        {&w->w1, &l->w1, "w1"}, {&w->w2, &l->w2, "w2"}, {&w->w3, &l->w3, "w3"},
    };
    char what[64];
    int rc;
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) {
        if (i >= 2 && !vecs[i].t->data) continue; /* no bias */
        snprintf(what, sizeof what, "layer %d %s", layer, vecs[i].name);
        if ((rc = upload_vector(e, vecs[i].t, vecs[i].len, what, vecs[i].out))) return rc;
    }
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) {
        snprintf(what, sizeof what, "layer %d %s", layer, mats[i].name);
        if ((rc = upload_matrix(e, mats[i].t, what, mats[i].out))) return rc;
    }
    return create_layer_kv(e, l);
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
        (unsigned)o->dtype >= VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_ARG, "engine options out of range (rows %d, out rows %d, slots %d, kv_len %d)",
                             o->max_rows, o->max_out_rows, o->n_slots, o->kv_len);
    if (!o->keep_file_dtype && !vks_op_weight_bytes(o->dtype, 1, vks_dtype_block_elems(o->dtype)))
        return vks_set_error(VKS_ERR_ARG, "engine: weights cannot be stored as %s on the device (f32, f16, bf16, "
                             "q8_0, q4_0 or q4_k)", vks_dtype_name(o->dtype));
    return VKS_OK;
}

static int check_fits(vks_engine *e, const vks_model *m) {
    uint64_t weights = weight_bytes_needed(e, m);
    uint64_t need = weights + 2 * kv_bytes_per_layer(e) * (uint64_t)(e->opt.layer_end - e->opt.layer_begin) +
                    activation_bytes(e);
    uint64_t avail = vks_gpu_free_bytes(e->gpu);
    if (need > avail)
        return vks_set_error(VKS_ERR_NOMEM, "model does not fit on %s: needs %llu bytes of device memory "
                             "(weights %llu, KV cache and activations %llu), %llu available",
                             vks_gpu_info(e->gpu)->name, (unsigned long long)need,
                             (unsigned long long)weights, (unsigned long long)(need - weights),
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
    if ((rc = check_fits(e, m)) || (rc = vks_ops_create(g, &e->ops))) goto fail;
    if (e->opt.f32_math) vks_ops_set_f16_math(e->ops, false);
    int n = e->opt.layer_end - e->opt.layer_begin;
    e->layers = calloc((size_t)n, sizeof *e->layers);
    if (!e->layers) { rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory"); goto fail; }
    uint64_t before_embed = vks_gpu_free_bytes(g);
    if (e->has_embed && (rc = upload_matrix(e, &m->tok_emb, "token embedding", &e->tok_emb))) goto fail;
    e->embed_bytes = before_embed - vks_gpu_free_bytes(g);
    for (int i = 0; i < n; i++)
        if ((rc = create_layer(e, &m->layers[e->opt.layer_begin + i], e->opt.layer_begin + i, &e->layers[i]))) goto fail;
    if (e->has_head) {
        if ((rc = upload_vector(e, &m->final_norm, m->cfg.dim, "final norm", &e->final_norm))) goto fail;
        if (m->cfg.shared_classifier && e->has_embed) e->classifier = e->tok_emb;
        else if ((rc = upload_matrix(e, &m->classifier, "classifier", &e->classifier))) goto fail;
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
        vks_buffer_destroy(l->bq);
        vks_buffer_destroy(l->bk);
        vks_buffer_destroy(l->bv);
        dev_matrix *ms[] = {&l->wq, &l->wk, &l->wv, &l->wo, &l->w1, &l->w2, &l->w3};
        for (int j = 0; j < 7; j++) free_matrix(ms[j]);
        free_layer_kv(l);
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
uint64_t vks_engine_decode_weight_bytes(const vks_engine *e) {
    if (!e) return 0;
    bool shared = e->has_head && e->cfg.shared_classifier;
    return e->weight_bytes - (shared ? 0 : e->embed_bytes);
}
const vks_model_config *vks_engine_config(const vks_engine *e) { return e ? &e->cfg : NULL; }
bool vks_engine_has_embed(const vks_engine *e) { return e && e->has_embed; }
bool vks_engine_has_head(const vks_engine *e) { return e && e->has_head; }
int vks_engine_max_rows(const vks_engine *e) { return e ? e->opt.max_rows : 0; }
int vks_engine_max_out_rows(const vks_engine *e) { return e ? e->opt.max_out_rows : 0; }
int vks_engine_n_slots(const vks_engine *e) { return e ? e->opt.n_slots : 0; }
int vks_engine_kv_len(const vks_engine *e) { return e ? e->opt.kv_len : 0; }

/* ---------- KV cache shape ---------- */

int vks_engine_kv_fits(const vks_engine *e, int n_slots, int kv_len) {
    if (!e || n_slots < 1 || n_slots > 65536 || kv_len < 1 || kv_len > e->cfg.seq_len)
        return vks_set_error(VKS_ERR_ARG, "KV cache of %d slots x %d positions: outside 1..65536 x 1..%d", n_slots,
                             kv_len, e ? e->cfg.seq_len : 0);
    uint64_t layers = (uint64_t)(e->opt.layer_end - e->opt.layer_begin);
    uint64_t per_layer = kv_bytes_of(e, n_slots, kv_len), range = vks_gpu_info(e->gpu)->max_storage_range;
    uint64_t avail = vks_gpu_free_bytes(e->gpu) + 2 * layers * kv_bytes_per_layer(e);
    if (per_layer > range)
        return vks_set_error(VKS_ERR_NOMEM, "a KV cache of %d x %d positions needs %llu bytes per layer in one "
                             "binding; the device allows %llu", n_slots, kv_len, (unsigned long long)per_layer,
                             (unsigned long long)range);
    if (2 * layers * per_layer > avail)
        return vks_set_error(VKS_ERR_NOMEM, "a KV cache of %d x %d positions needs %llu bytes of device memory, "
                             "%llu available", n_slots, kv_len, (unsigned long long)(2 * layers * per_layer),
                             (unsigned long long)avail);
    return VKS_OK;
}

int vks_engine_resize_kv(vks_engine *e, int n_slots, int kv_len) {
    int rc = vks_engine_kv_fits(e, n_slots, kv_len);
    if (rc) return rc;
    int n = e->opt.layer_end - e->opt.layer_begin;
    uint64_t before = vks_gpu_free_bytes(e->gpu);
    for (int i = 0; i < n; i++) free_layer_kv(&e->layers[i]);
    e->opt.n_slots = n_slots;
    e->opt.kv_len = kv_len;
    for (int i = 0; i < n && rc == VKS_OK; i++) rc = create_layer_kv(e, &e->layers[i]);
    if (rc) { /* no KV cache: every forward is refused until a resize succeeds */
        for (int i = 0; i < n; i++) free_layer_kv(&e->layers[i]);
        e->opt.n_slots = e->opt.kv_len = 0;
    }
    e->device_bytes += before - vks_gpu_free_bytes(e->gpu); /* modulo 2^64: right when the cache shrank too */
    return rc;
}

/* ---------- forward ---------- */

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
        (l->bq && (rc = vks_op_bias_add(e->ops, c, bind(a->q), bind(l->bq), R, qd))) ||
        (l->bk && (rc = vks_op_bias_add(e->ops, c, bind(a->k), bind(l->bk), R, kvd))) ||
        (l->bv && (rc = vks_op_bias_add(e->ops, c, bind(a->v), bind(l->bv), R, kvd))) ||
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
    e->matmul_kind = b->matmul_kind;
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
