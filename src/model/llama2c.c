/* llama2c.c: llama2.c checkpoint reader and writer.
 *
 * File layout (little-endian): 7 int32 header fields (dim, hidden_dim,
 * n_layers, n_heads, n_kv_heads, vocab_size, seq_len), then f32 tensors with
 * no padding: token embedding, per-layer stacks of rms_att, wq, wk, wv, wo,
 * rms_ffn, w1, w2, w3, then rms_final, the two legacy freq_cis tables
 * [seq_len, head_dim/2] and, when vocab_size < 0, the unshared classifier.
 *
 * Hostile input: the header is validated before any size is derived from it,
 * all size arithmetic is overflow-checked, and the file must be at least as
 * large as the header implies. Bytes after that are refused (run.c ignores
 * them): they mean the header describes fewer layers, a smaller vocabulary or
 * a shorter context than the file holds, and every tensor would be misread.
 */
#include "model/model_internal.h"
#include "vkswarm/vks_quant.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- layout ---- */

bool vks_l2c_sizes_compute(const vks_model_config *c, vks_l2c_sizes *s) {
    size_t d = (size_t)c->dim, L = (size_t)c->n_layers, per_layer = 0, stacked = 0, t = 0;
    bool ok = vks_mul_size((size_t)c->vocab_size, d, &s->emb);
    s->norm = d;
    ok = ok && vks_mul_size((size_t)c->n_heads * (size_t)c->head_dim, d, &s->wq); /* dim x dim in llama2.c files */
    ok = ok && vks_mul_size((size_t)c->kv_dim, d, &s->wkv);
    s->wo = s->wq;
    ok = ok && vks_mul_size((size_t)c->hidden_dim, d, &s->ffn);
    ok = ok && vks_mul_size((size_t)c->seq_len, (size_t)(c->head_dim / 2), &s->freq);
    s->cls = c->shared_classifier ? 0 : s->emb;
    /* per layer: 2 norms + wq + wk + wv + wo + w1 + w2 + w3 */
    size_t parts[] = {s->norm, s->norm, s->wq, s->wkv, s->wkv, s->wo, s->ffn, s->ffn, s->ffn};
    for (size_t i = 0; ok && i < sizeof parts / sizeof parts[0]; i++)
        ok = vks_add_size(per_layer, parts[i], &per_layer);
    ok = ok && vks_mul_size(per_layer, L, &stacked);
    size_t rest[] = {s->emb, stacked, s->norm, s->freq, s->freq, s->cls};
    for (size_t i = 0; ok && i < sizeof rest / sizeof rest[0]; i++)
        ok = vks_add_size(t, rest[i], &t);
    s->total = t;
    return ok;
}

/* ---- tensor views ---- */

static vks_tensor f32_view(const float *data, int64_t rows, int64_t cols) {
    vks_tensor t = {VKS_DTYPE_F32, rows, cols, data};
    return t;
}

/* Views layer `layer` of a stack of [rows, cols] matrices. */
static vks_tensor stacked_view(const float *stack, int layer, int64_t rows, int64_t cols) {
    return f32_view(stack + (size_t)layer * (size_t)rows * (size_t)cols, rows, cols);
}

int vks_model_bind_llama2c(vks_model *m, const float *body) {
    const vks_model_config *c = &m->cfg;
    vks_l2c_sizes s;
    if (!vks_l2c_sizes_compute(c, &s)) return vks_set_error(VKS_ERR_FORMAT, "model size overflows");
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return vks_set_error(VKS_ERR_NOMEM, "out of memory allocating layers");
    size_t L = (size_t)c->n_layers;
    const float *p = body;
    m->tok_emb = f32_view(p, c->vocab_size, c->dim);
    p += s.emb;
    const float *att_norm = p, *wq = att_norm + L * s.norm, *wk = wq + L * s.wq;
    const float *wv = wk + L * s.wkv, *wo = wv + L * s.wkv, *ffn_norm = wo + L * s.wo;
    const float *w1 = ffn_norm + L * s.norm, *w2 = w1 + L * s.ffn, *w3 = w2 + L * s.ffn;
    for (int l = 0; l < c->n_layers; l++) {
        vks_layer_weights *lw = &m->layers[l];
        lw->attn_norm = stacked_view(att_norm, l, 1, c->dim);
        lw->wq = stacked_view(wq, l, (int64_t)c->n_heads * c->head_dim, c->dim);
        lw->wk = stacked_view(wk, l, c->kv_dim, c->dim);
        lw->wv = stacked_view(wv, l, c->kv_dim, c->dim);
        lw->wo = stacked_view(wo, l, c->dim, (int64_t)c->n_heads * c->head_dim);
        lw->ffn_norm = stacked_view(ffn_norm, l, 1, c->dim);
        lw->w1 = stacked_view(w1, l, c->hidden_dim, c->dim);
        lw->w2 = stacked_view(w2, l, c->dim, c->hidden_dim);
        lw->w3 = stacked_view(w3, l, c->hidden_dim, c->dim);
    }
    const float *final_norm = w3 + L * s.ffn;
    m->final_norm = f32_view(final_norm, 1, c->dim);
    const float *cls = final_norm + s.norm + 2 * s.freq; /* skip the freq_cis tables */
    m->classifier = c->shared_classifier ? m->tok_emb : f32_view(cls, c->vocab_size, c->dim);
    return VKS_OK;
}

/* ---- loading ---- */

static int32_t read_le_i32(const unsigned char *b) {
    uint32_t u = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    int32_t v;
    memcpy(&v, &u, sizeof v);
    return v;
}

/* Builds and checks the config from the raw header. */
static int config_from_header(const unsigned char *hdr, const char *path, vks_model_config *c) {
    int32_t f[7];
    for (int i = 0; i < 7; i++) f[i] = read_le_i32(hdr + 4 * i);
    memset(c, 0, sizeof *c);
    c->dim = f[0];
    c->hidden_dim = f[1];
    c->n_layers = f[2];
    c->n_heads = f[3];
    c->n_kv_heads = f[4];
    c->shared_classifier = f[5] > 0;
    /* Negative vocab = unshared classifier; INT32_MIN has no positive twin. */
    c->vocab_size = f[5] == INT32_MIN ? INT32_MIN : (f[5] < 0 ? -f[5] : f[5]);
    c->seq_len = f[6];
    c->head_dim = c->n_heads > 0 ? c->dim / c->n_heads : 0;
    c->kv_dim = c->n_kv_heads > 0 && c->head_dim > 0 && c->n_kv_heads <= c->n_heads
                    ? c->n_kv_heads * c->head_dim : 0;
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_mode = 0; /* VKS_ROPE_ADJACENT */
    char what[600];
    snprintf(what, sizeof what, "%s: bad header", path);
    if (c->n_heads > 0 && c->dim % c->n_heads != 0) /* the format's head_dim is dim / n_heads */
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_heads %d does not divide dim %d", what, c->n_heads, c->dim);
    return vks_model_config_check(c, what);
}

/* Opens path and returns its descriptor and size (a regular file). */
static int open_regular(const char *path, int *fd_out, size_t *size_out) {
    int fd = vks_open_read(path, 0); /* a FIFO must not block: refused below */
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < 0 ||
        (uintmax_t)st.st_size > SIZE_MAX) {
        close(fd);
        return vks_set_error(VKS_ERR_IO, "%s: not a readable regular file", path);
    }
    *fd_out = fd;
    *size_out = (size_t)st.st_size;
    return VKS_OK;
}

static int read_header(int fd, const char *path, size_t file_size, unsigned char *hdr) {
    if (file_size < L2C_HEADER_BYTES)
        return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: header needs %d bytes, file has %zu",
                             path, L2C_HEADER_BYTES, file_size);
    ssize_t got = pread(fd, hdr, L2C_HEADER_BYTES, 0);
    if (got != L2C_HEADER_BYTES)
        return vks_set_error(VKS_ERR_IO, "%s: cannot read header", path);
    return VKS_OK;
}

/* Maps the file after checking it holds everything the config implies. */
static int map_body(int fd, const char *path, size_t file_size, const vks_model_config *c,
                    void **map_out) {
    vks_l2c_sizes s;
    size_t need = 0;
    if (!vks_l2c_sizes_compute(c, &s) || !vks_mul_size(s.total, sizeof(float), &need) ||
        !vks_add_size(need, L2C_HEADER_BYTES, &need))
        return vks_set_error(VKS_ERR_FORMAT, "%s: model size overflows", path);
    if (file_size < need)
        return vks_set_error(VKS_ERR_FORMAT, "%s: truncated: header needs %zu bytes, file has %zu",
                             path, need, file_size);
    if (file_size > need)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %zu bytes after the %zu the header describes (more layers or "
                             "a larger vocabulary than declared?)", path, file_size - need, need);
    void *map = mmap(NULL, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (map == MAP_FAILED) return vks_set_error(VKS_ERR_IO, "%s: mmap failed: %s", path, strerror(errno));
    *map_out = map;
    return VKS_OK;
}

int vks_model_load_llama2c(const char *path, vks_model **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_load_llama2c: NULL argument");
    *out = NULL;
    int fd = -1;
    size_t file_size = 0;
    int rc = open_regular(path, &fd, &file_size);
    if (rc != VKS_OK) return rc;
    unsigned char hdr[L2C_HEADER_BYTES];
    vks_model_config cfg;
    void *map = NULL;
    rc = read_header(fd, path, file_size, hdr);
    if (rc == VKS_OK) rc = config_from_header(hdr, path, &cfg);
    if (rc == VKS_OK) rc = map_body(fd, path, file_size, &cfg, &map);
    close(fd);
    if (rc != VKS_OK) return rc;
    vks_model *m = vks_model_alloc();
    if (!m) {
        munmap(map, file_size);
        return VKS_ERR_NOMEM;
    }
    m->cfg = cfg;
    m->map = map;
    m->map_size = file_size;
    snprintf(m->path, sizeof m->path, "%s", path);
    rc = vks_model_bind_llama2c(m, (const float *)((const unsigned char *)map + L2C_HEADER_BYTES));
    if (rc == VKS_OK) rc = vks_model_check_finite(m, path);
    if (rc != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    *out = m;
    return VKS_OK;
}

/* ---- saving ---- */

static size_t tensor_elements(const vks_tensor *t) { return (size_t)t->rows * (size_t)t->cols; }

static float tensor_elem_f32(const vks_tensor *t, size_t i) {
    const unsigned char *b = t->data;
    uint16_t h;
    switch (t->dtype) {
    case VKS_DTYPE_F16: memcpy(&h, b + 2 * i, 2); return vks_f16_to_f32(h);
    case VKS_DTYPE_BF16: memcpy(&h, b + 2 * i, 2); return vks_bf16_to_f32(h);
    case VKS_DTYPE_F32: break;
    default: return NAN; /* block formats are dequantized by the caller */
    }
    float f;
    memcpy(&f, b + 4 * i, 4);
    return f;
}

/* Writes a tensor as f32, converting in chunks. */
static bool write_tensor(FILE *f, const vks_tensor *t) {
    size_t n = tensor_elements(t);
    if (t->dtype == VKS_DTYPE_F32) return fwrite(t->data, sizeof(float), n, f) == n;
    float chunk[1024];
    for (size_t done = 0; done < n;) {
        size_t k = n - done < 1024 ? n - done : 1024;
        for (size_t i = 0; i < k; i++) chunk[i] = tensor_elem_f32(t, done + i);
        if (fwrite(chunk, sizeof(float), k, f) != k) return false;
        done += k;
    }
    return true;
}

static bool write_zeros(FILE *f, size_t n_floats) {
    static const float zeros[1024];
    for (size_t done = 0; done < n_floats;) {
        size_t k = n_floats - done < 1024 ? n_floats - done : 1024;
        if (fwrite(zeros, sizeof(float), k, f) != k) return false;
        done += k;
    }
    return true;
}

static bool write_header(FILE *f, const vks_model_config *c) {
    int32_t vocab = c->shared_classifier ? c->vocab_size : -c->vocab_size;
    int32_t fields[7] = {c->dim, c->hidden_dim, c->n_layers, c->n_heads, c->n_kv_heads, vocab, c->seq_len};
    unsigned char b[L2C_HEADER_BYTES];
    for (int i = 0; i < 7; i++) {
        uint32_t u;
        memcpy(&u, &fields[i], 4);
        for (int j = 0; j < 4; j++) b[4 * i + j] = (unsigned char)(u >> (8 * j));
    }
    return fwrite(b, 1, sizeof b, f) == sizeof b;
}

/* Writes one per-layer tensor (at member_offset in vks_layer_weights) for every layer. */
static bool write_stack(FILE *f, const vks_model *m, size_t member_offset) {
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const vks_tensor *t = (const vks_tensor *)((const char *)&m->layers[l] + member_offset);
        if (!write_tensor(f, t)) return false;
    }
    return true;
}

static bool write_body(FILE *f, const vks_model *m) {
    const size_t stacks[] = {
        offsetof(vks_layer_weights, attn_norm), offsetof(vks_layer_weights, wq),
        offsetof(vks_layer_weights, wk),        offsetof(vks_layer_weights, wv),
        offsetof(vks_layer_weights, wo),        offsetof(vks_layer_weights, ffn_norm),
        offsetof(vks_layer_weights, w1),        offsetof(vks_layer_weights, w2),
        offsetof(vks_layer_weights, w3),
    };
    bool ok = write_header(f, &m->cfg) && write_tensor(f, &m->tok_emb);
    for (size_t i = 0; ok && i < sizeof stacks / sizeof stacks[0]; i++) ok = write_stack(f, m, stacks[i]);
    size_t freq = (size_t)m->cfg.seq_len * (size_t)(m->cfg.head_dim / 2);
    ok = ok && write_tensor(f, &m->final_norm) && write_zeros(f, 2 * freq);
    if (ok && !m->cfg.shared_classifier) ok = write_tensor(f, &m->classifier);
    return ok;
}

/* llama2.c needs f32 in adjacent RoPE order: other models go through an f32 copy. */
static bool needs_f32_copy(const vks_model *m) {
    if (m->cfg.rope_mode != 0 || vks_dtype_block_elems(m->tok_emb.dtype) != 1) return true;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        const vks_layer_weights *w = &m->layers[l];
        const vks_tensor *all[] = {&w->wq, &w->wk, &w->wv, &w->wo, &w->w1, &w->w2, &w->w3};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            if (vks_dtype_block_elems(all[i]->dtype) != 1) return true;
    }
    return vks_dtype_block_elems(m->classifier.dtype) != 1;
}

int vks_model_save_llama2c(const vks_model *m, const char *path) {
    if (!path) return vks_set_error(VKS_ERR_ARG, "vks_model_save_llama2c: NULL path");
    int rc = vks_model_check_tensors(m, path);
    if (rc != VKS_OK) return rc;
    if (vks_model_has_bias(m))
        return vks_set_error(VKS_ERR_ARG, "%s: llama2.c files cannot hold q/k/v biases", path);
    if (m->cfg.qk_norm || m->cfg.rope_scaling.type != VKS_ROPE_SCALING_NONE)
        return vks_set_error(VKS_ERR_ARG, "%s: llama2.c files cannot hold q/k norms or RoPE scaling (%s)", path, m->arch);
    if (m->cfg.n_heads * m->cfg.head_dim != m->cfg.dim)
        return vks_set_error(VKS_ERR_ARG, "%s: llama2.c files cannot hold head_dim %d (they imply dim / n_heads = %d)",
                             path, m->cfg.head_dim, m->cfg.dim / m->cfg.n_heads);
    if (needs_f32_copy(m)) {
        vks_model *f32 = NULL;
        rc = vks_model_copy_f32(m, 0, &f32);
        if (rc == VKS_OK) rc = vks_model_save_llama2c(f32, path);
        vks_model_free(f32);
        return rc;
    }
    /* a temporary renamed into place: `path` may be the mapped input */
    vks_outfile o;
    rc = vks_outfile_open(&o, path, 0666);
    if (rc != VKS_OK) return rc;
    return vks_outfile_finish(&o, write_body(o.f, m));
}
