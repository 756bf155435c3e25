/* engine_weights.c: the model's weights on the device for a layer range (a
 * parameter set): the device type of each matrix, conversion on the host a
 * chunk at a time, upload in binding-sized chunks, the tied classifier. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "engine_internal.h"
#include "vkswarm/vks_quant.h"

/* Weights are converted on the host a chunk at a time; chunks are capped so
 * that the host copy stays moderate even where bindings may be 4 GiB. */
#define MAX_HOST_CHUNK_BYTES ((uint64_t)256 << 20)
#define HOST_STEP_BYTES ((size_t)8 << 20)

/* The dtype a weight matrix gets on the device. keep_file_dtype keeps each
 * tensor's own type, except Q6_K (no kernel yet), which becomes f16. Rows that
 * are not a whole number of blocks of a block type (stories260K's hidden 172,
 * Q4_K's 256 against dim 64) fall back to f16, as llama.cpp falls back to
 * another type for such tensors. Norms and biases are always f32. */
static vks_dtype device_dtype(const vks_engine_options *opt, vks_dtype file_dtype, int64_t cols) {
    vks_dtype t = opt->keep_file_dtype ? file_dtype : opt->dtype;
    if (t == VKS_DTYPE_Q6_K) t = VKS_DTYPE_F16;
    size_t be = vks_dtype_block_elems(t);
    if (be == 0 || cols % (int64_t)be) t = VKS_DTYPE_F16;
    return t;
}

/* Device bytes of a [rows, cols] matrix stored from `t` (NULL: shape only, opt.dtype). */
static uint64_t matrix_bytes(const vks_engine_options *opt, const vks_tensor *t, uint64_t rows, uint64_t cols) {
    vks_dtype dt = device_dtype(opt, t ? t->dtype : opt->dtype, (int64_t)cols);
    uint64_t chunk_pad = 16 * (1 + rows * cols / (MAX_HOST_CHUNK_BYTES / 2));
    return (uint64_t)vks_op_weight_bytes(dt, rows, cols) + chunk_pad;
}

bool vks_engine_keeps_file_types(const vks_model *m) {
    if (!m || !m->layers) return false;
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int i = 0; i < VKS_LAYER_N_TENSORS; i++)
            if (m->layers[l].t[i].data && vks_dtype_block_elems(m->layers[l].t[i].dtype) > 1) return true;
    return vks_dtype_block_elems(m->tok_emb.dtype) > 1;
}

/* Every matrix of the layer (vks_layer_schema) as the device holds it, and
 * its vectors (norms, biases) as f32 buffers. */
uint64_t vks_engine_layer_bytes(const vks_model *m, const vks_engine_options *opt, int layer) {
    if (!m || !opt || layer < 0 || layer >= m->cfg.n_layers) return 0;
    const vks_model_config *c = &m->cfg;
    const vks_layer_weights *w = m->layers ? &m->layers[layer] : NULL;
    bool bias = vks_model_has_bias(m);
    uint64_t bytes = 0;
    for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
        const vks_tensor_schema *s = &vks_layer_schema[i];
        if (!vks_schema_present(s, c, bias)) continue;
        uint64_t rows = (uint64_t)vks_schema_extent(c, s->rows), cols = (uint64_t)vks_schema_extent(c, s->cols);
        bytes += s->rows == VKS_EXT_ONE ? cols * 4 + 16 : matrix_bytes(opt, w ? &w->t[i] : NULL, rows, cols);
    }
    return bytes;
}

uint64_t vks_engine_embedding_bytes(const vks_model *m, const vks_engine_options *opt) {
    if (!m || !opt) return 0;
    return matrix_bytes(opt, &m->tok_emb, (uint64_t)m->cfg.vocab_size, (uint64_t)m->cfg.dim);
}

uint64_t vks_param_set_bytes_needed(const vks_engine_options *opt, const vks_model *m) {
    const vks_model_config *c = &m->cfg;
    bool has_embed = opt->layer_begin == 0, has_head = opt->layer_end == c->n_layers;
    uint64_t d = (uint64_t)c->dim, total = 0;
    for (int l = opt->layer_begin; l < opt->layer_end; l++) total += vks_engine_layer_bytes(m, opt, l);
    if (has_embed) total += vks_engine_embedding_bytes(m, opt);
    if (has_head)
        total += d * 4 + 16 + (c->shared_classifier && has_embed ? 0 :
                               matrix_bytes(opt, &m->classifier, (uint64_t)c->vocab_size, d));
    return total;
}

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

static int upload_chunk(vks_gpu *g, const vks_tensor *t, const char *what, uint32_t row0, uint32_t n,
                        vks_dtype to, vks_buffer **out) {
    size_t bytes = vks_op_weight_bytes(to, n, (uint64_t)t->cols);
    void *host = calloc(1, bytes);
    if (!host) return vks_set_error(VKS_ERR_NOMEM, "out of host memory converting weights");
    int rc = pack_chunk(t, what, row0, n, to, host);
    if (!rc) rc = vks_buffer_create(g, bytes, out);
    if (!rc) rc = vks_buffer_upload(*out, 0, host, bytes);
    free(host);
    return rc;
}

/* Uploads weight matrix t (named `what` in errors) in chunks. */
static int upload_matrix(vks_gpu *g, const vks_engine_options *opt, const vks_tensor *t, const char *what,
                         dev_matrix *out) {
    vks_dtype to = device_dtype(opt, t->dtype, t->cols);
    uint64_t range = vks_gpu_info(g)->max_storage_range;
    if (opt->max_chunk_bytes && opt->max_chunk_bytes < range) range = opt->max_chunk_bytes;
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
        int rc = upload_chunk(g, t, what, row0, n, to, &out->chunk[i]);
        if (rc) return rc;
    }
    return VKS_OK;
}

static void free_matrix(dev_matrix *m) {
    for (int i = 0; i < m->n_chunks; i++) vks_buffer_destroy(m->chunk[i]);
    m->n_chunks = 0;
}

/* Uploads a vector (norm weights, biases) as f32; `cols` is the length the config implies. */
static int upload_vector(vks_gpu *g, const vks_tensor *t, int64_t cols, const char *what, vks_buffer **out) {
    uint64_t row_bytes;
    if (!t->data || t->rows != 1 || t->cols != cols || !vks_dtype_row_bytes(t->dtype, (uint64_t)cols, &row_bytes))
        return vks_set_error(VKS_ERR_FORMAT, "%s: expected %lld values, the model has %lld x %lld of %s", what,
                             (long long)cols, (long long)t->rows, (long long)t->cols, vks_dtype_name(t->dtype));
    float *f = malloc((size_t)cols * sizeof(float));
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    vks_dequantize(t->dtype, t->data, f, (size_t)cols);
    int rc = vks_buffer_create(g, (size_t)cols * 4, out);
    if (!rc) rc = vks_buffer_upload(*out, 0, f, (size_t)cols * 4);
    free(f);
    return rc;
}

/* Uploads every tensor of a layer the model has (vks_layer_schema: vectors as
 * f32, matrices chunked); errors name the layer and tensor. */
static int upload_layer(vks_gpu *g, const vks_model_config *c, const vks_engine_options *opt,
                        const vks_layer_weights *w, int layer, dev_layer *l) {
    char what[64];
    int rc = VKS_OK;
    for (int i = 0; i < VKS_LAYER_N_TENSORS && !rc; i++) {
        const vks_tensor_schema *s = &vks_layer_schema[i];
        if (!w->t[i].data) continue; /* optional and absent (vks_model_check_tensors checked the rest) */
        snprintf(what, sizeof what, "layer %d %s", layer, s->name);
        if (s->rows == VKS_EXT_ONE) rc = upload_vector(g, &w->t[i], vks_schema_extent(c, s->cols), what, &l->vec[i]);
        else rc = upload_matrix(g, opt, &w->t[i], what, &l->mat[i]);
    }
    return rc;
}

static void free_layer(dev_layer *l) {
    for (int i = 0; i < VKS_LAYER_N_TENSORS; i++) {
        vks_buffer_destroy(l->vec[i]);
        free_matrix(&l->mat[i]);
    }
}

int vks_param_set_upload(vks_gpu *g, const vks_model *m, const vks_engine_options *opt, vks_param_set *p) {
    memset(p, 0, sizeof *p);
    p->has_embed = opt->layer_begin == 0;
    p->has_head = opt->layer_end == m->cfg.n_layers;
    p->n_layers = opt->layer_end - opt->layer_begin;
    p->layers = calloc((size_t)p->n_layers, sizeof *p->layers);
    if (!p->layers) return vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    int rc;
    uint64_t before_embed = vks_gpu_free_bytes(g);
    if (p->has_embed && (rc = upload_matrix(g, opt, &m->tok_emb, "token embedding", &p->tok_emb))) return rc;
    p->embed_bytes = before_embed - vks_gpu_free_bytes(g);
    for (int i = 0; i < p->n_layers; i++) {
        int layer = opt->layer_begin + i;
        if ((rc = upload_layer(g, &m->cfg, opt, &m->layers[layer], layer, &p->layers[i]))) return rc;
    }
    if (p->has_head) {
        if ((rc = upload_vector(g, &m->final_norm, m->cfg.dim, "final norm", &p->final_norm))) return rc;
        if (m->cfg.shared_classifier && p->has_embed) p->classifier = p->tok_emb;
        else if ((rc = upload_matrix(g, opt, &m->classifier, "classifier", &p->classifier))) return rc;
    }
    return VKS_OK;
}

void vks_param_set_free(vks_param_set *p) {
    if (!p) return;
    for (int i = 0; p->layers && i < p->n_layers; i++) free_layer(&p->layers[i]);
    free(p->layers);
    p->layers = NULL;
    if (p->classifier.chunk[0] != p->tok_emb.chunk[0]) free_matrix(&p->classifier);
    free_matrix(&p->tok_emb);
    vks_buffer_destroy(p->final_norm);
    p->final_norm = NULL;
}

int vks_rope_table_upload(vks_gpu *g, const vks_model_config *c, int n_pos, vks_buffer **out) {
    size_t n = (size_t)n_pos * (size_t)c->head_dim;
    float *f = malloc(n * sizeof *f);
    int rc = f && vks_rope_table(c, n_pos, f) ? vks_buffer_create(g, n * sizeof *f, out)
                                               : vks_set_error(VKS_ERR_NOMEM, "out of host memory for the RoPE table");
    if (!rc) rc = vks_buffer_upload(*out, 0, f, n * sizeof *f);
    free(f);
    return rc;
}
