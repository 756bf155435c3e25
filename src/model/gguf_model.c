/* gguf_model.c: Llama-family models in GGUF files (architectures llama and
 * qwen2), read in place from the mmap and written from any vks_model.
 *
 * Tensor names and metadata keys are llama.cpp's. q/k row order: llama.cpp's
 * converter permutes llama q/k rows to adjacent RoPE pairs (rope_mode
 * ADJACENT) but leaves qwen2 in Hugging Face's half-split order (llama.cpp
 * runs qwen2 with NEOX RoPE, our HALF); the writer does the same, so a model
 * gives the same logits from every format. */
#include "model/model_internal.h"
#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_tokenizer.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_NAME 96
#define ROPE_FREQS "rope_freqs.weight" /* llama.cpp: per-pair divisors of the frequencies (Llama 3.1) */

const struct vks_gguf *vks_model_gguf(const vks_model *m) { return m ? m->gguf : NULL; }

static int arch_rope_mode(const char *arch) {
    const vks_arch *a = vks_arch_find(arch);
    return a ? a->gguf_rope_mode : VKS_ROPE_ADJACENT;
}

/* ---- reading ---- */

/* "<arch>.<suffix>" as a positive int (<= INT32_MAX). Errors name the file
 * once: the getters' messages already start with it. */
static int get_dim(const vks_gguf *g, const char *path, const char *arch, const char *suffix, bool required, int *out) {
    char key[MAX_NAME];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (vks_gguf_find_key(g, key) < 0 && !required) return VKS_OK;
    uint32_t v;
    int rc = vks_gguf_get_u32(g, key, &v);
    if (rc != VKS_OK) return VKS_ERR_FORMAT;
    if (v == 0 || v > INT32_MAX) return vks_set_error(VKS_ERR_FORMAT, "%s: bad value %u for %s", path, v, key);
    *out = (int)v;
    return VKS_OK;
}

static int get_float(const vks_gguf *g, const char *arch, const char *suffix, float *out) {
    char key[MAX_NAME];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (vks_gguf_find_key(g, key) < 0) return VKS_OK; /* keep the default */
    int rc = vks_gguf_get_f32(g, key, out);
    return rc == VKS_OK ? rc : VKS_ERR_FORMAT;
}

static int read_arch(const vks_gguf *g, const char *path, char *arch, size_t cap) {
    const char *a;
    if (vks_gguf_get_str(g, "general.architecture", &a, NULL) != VKS_OK)
        return vks_set_error(VKS_ERR_FORMAT, "%s: no general.architecture string", path);
    if (!vks_arch_find(a)) {
        char names[256];
        vks_arch_list(names, sizeof names, false);
        return vks_set_error(VKS_ERR_FORMAT, "%s: unsupported architecture '%.40s' (need one of: %s)", path, a, names);
    }
    snprintf(arch, cap, "%s", a);
    return VKS_OK;
}

static int read_config(const vks_gguf *g, const char *path, const char *arch, vks_model_config *c) {
    memset(c, 0, sizeof *c);
    c->norm_eps = 1e-5f;
    c->rope_theta = 10000.0f;
    c->rope_mode = arch_rope_mode(arch);
    c->qk_norm = vks_arch_find(arch)->qk_norm;
    int rc = get_dim(g, path, arch, "embedding_length", true, &c->dim);
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "feed_forward_length", true, &c->hidden_dim);
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "block_count", true, &c->n_layers);
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "attention.head_count", true, &c->n_heads);
    c->n_kv_heads = c->n_heads;
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "attention.head_count_kv", false, &c->n_kv_heads);
    c->seq_len = 2048;
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "context_length", false, &c->seq_len);
    if (rc == VKS_OK) rc = get_float(g, arch, "attention.layer_norm_rms_epsilon", &c->norm_eps);
    if (rc == VKS_OK) rc = get_float(g, arch, "rope.freq_base", &c->rope_theta);
    if (rc != VKS_OK) return rc;
    /* head_dim: attention.key_length (= value_length) when given (Qwen3), else dim / n_heads */
    int key_len = 0, value_len = 0;
    if ((rc = get_dim(g, path, arch, "attention.key_length", false, &key_len)) != VKS_OK) return rc;
    if (key_len == 0 && c->dim % c->n_heads != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: n_heads %d does not divide dim %d (and no %s.attention.key_length "
                             "is given)", path, c->n_heads, c->dim, arch);
    if (key_len == 0) key_len = c->dim / c->n_heads;
    value_len = key_len;
    if ((rc = get_dim(g, path, arch, "attention.value_length", false, &value_len)) != VKS_OK) return rc;
    if (value_len != key_len)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s.attention.value_length %d differs from key_length %d "
                             "(not supported)", path, arch, value_len, key_len);
    c->head_dim = key_len;
    c->kv_dim = c->n_kv_heads <= c->n_heads ? c->n_kv_heads * c->head_dim : 0;
    int rope_dims = c->head_dim;
    if ((rc = get_dim(g, path, arch, "rope.dimension_count", false, &rope_dims)) != VKS_OK) return rc;
    if (rope_dims != c->head_dim)
        return vks_set_error(VKS_ERR_FORMAT, "%s: partial RoPE (%d of %d dims) is not supported", path, rope_dims,
                             c->head_dim);
    return VKS_OK;
}

/* Binds tensor `name` with shape [rows, cols] (ne = {cols, rows}). */
static int bind(const vks_gguf *g, const char *path, const char *name, int64_t rows, int64_t cols, bool required,
                bool allow_blocks, vks_tensor *t) {
    const vks_gguf_tensor *gt = vks_gguf_find_tensor(g, name);
    if (!gt) return required ? vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", path, name) : VKS_OK;
    bool shape_ok = gt->ne[0] == cols && gt->ne[1] == rows && gt->ne[2] == 1 && gt->ne[3] == 1;
    if (!shape_ok)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has shape [%lld, %lld, %lld, %lld], config implies [%lld, %lld]",
                             path, name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2],
                             (long long)gt->ne[3], (long long)cols, (long long)rows);
    if (gt->dtype == VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has ggml type %u, which vkswarm does not support", path,
                             name, gt->ggml_type);
    *t = (vks_tensor){gt->dtype, rows, cols, gt->data};
    return vks_check_bound_tensor(path, name, t, allow_blocks);
}

static int bind_model(vks_model *m, const char *path) {
    const vks_gguf *g = m->gguf;
    vks_model_config *c = &m->cfg;
    const vks_gguf_tensor *emb = vks_gguf_find_tensor(g, "token_embd.weight");
    if (!emb) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor token_embd.weight", path);
    if (emb->ne[1] <= 0 || emb->ne[1] > INT32_MAX)
        return vks_set_error(VKS_ERR_FORMAT, "%s: token_embd.weight has a bad vocab dimension", path);
    c->vocab_size = (int)emb->ne[1];
    int declared = c->vocab_size;
    int rc = get_dim(g, path, m->arch, "vocab_size", false, &declared);
    if (rc != VKS_OK) return rc;
    if (declared != c->vocab_size)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s.vocab_size %d disagrees with token_embd.weight (%d rows)", path,
                             m->arch, declared, c->vocab_size);
    c->shared_classifier = vks_gguf_find_tensor(g, "output.weight") == NULL;
    if ((rc = vks_model_config_check(c, path)) != VKS_OK) return rc;
    /* biases are in the file or not (layers that disagree fail below: a missing or an unused tensor) */
    bool bias = vks_gguf_find_tensor(g, "blk.0.attn_q.bias") != NULL;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    if (!m->layers) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    vks_schema_item *items = NULL;
    int n = 0;
    rc = vks_schema_list_alloc(c, bias, &items, &n);
    char name[MAX_NAME];
    for (int i = 0; i < n && rc == VKS_OK; i++) {
        vks_schema_name(&items[i], VKS_NAME_GGUF, name, sizeof name);
        rc = bind(g, path, name, items[i].rows, items[i].cols, true, items[i].s->rows != VKS_EXT_ONE, vks_model_slot(m, &items[i]));
    }
    free(items);
    if (c->shared_classifier) m->classifier = m->tok_emb;
    return rc == VKS_OK ? vks_model_check_tensors(m, path) : rc;
}

/* Llama 3.1/3.2 in llama.cpp's form: a rope_freqs tensor of head_dim/2
 * divisors. Its parameters come from <arch>.rope.scaling.factor (else the
 * largest divisor), .original_context_length (else 8192), .low_freq_factor
 * and .high_freq_factor (else 1 and 4: every Llama 3.1/3.2 release); the
 * divisors must equal the llama3 formula's for them, else the file is refused. */
static int read_rope_freqs(const vks_gguf *g, const char *path, const char *arch, vks_model_config *c) {
    const vks_gguf_tensor *t = vks_gguf_find_tensor(g, ROPE_FREQS);
    if (!t) return VKS_OK;
    int half = c->head_dim / 2;
    if (t->dtype != VKS_DTYPE_F32 || t->ne[0] != half || t->ne[1] != 1 || t->ne[2] != 1 || t->ne[3] != 1)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s must be %d f32 values", path, ROPE_FREQS, half);
    const float *ff = t->data;
    vks_rope_scaling *s = &c->rope_scaling;
    *s = (vks_rope_scaling){VKS_ROPE_SCALING_LLAMA3, 0.0f, 1.0f, 4.0f, 8192};
    for (int i = 0; i < half; i++)
        if (ff[i] > s->factor) s->factor = ff[i];
    int rc = get_float(g, arch, "rope.scaling.factor", &s->factor);
    if (rc == VKS_OK) rc = get_float(g, arch, "rope.scaling.low_freq_factor", &s->low_freq_factor);
    if (rc == VKS_OK) rc = get_float(g, arch, "rope.scaling.high_freq_factor", &s->high_freq_factor);
    if (rc == VKS_OK) rc = get_dim(g, path, arch, "rope.scaling.original_context_length", false, &s->original_context);
    if (rc == VKS_OK) rc = vks_model_config_check(c, path);
    if (rc != VKS_OK) return rc;
    double *scaled = malloc((size_t)half * sizeof *scaled), *plain = malloc((size_t)half * sizeof *plain);
    vks_model_config p = *c;
    p.rope_scaling.type = VKS_ROPE_SCALING_NONE;
    if (!scaled || !plain) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    if (rc == VKS_OK) vks_rope_freqs(c, scaled), vks_rope_freqs(&p, plain);
    for (int i = 0; i < half && rc == VKS_OK; i++)
        if (!(fabs(plain[i] / scaled[i] - ff[i]) <= 1e-5 * ff[i]))
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: %s[%d] = %g is not the llama3 RoPE scaling's %g (factor %g, "
                               "low/high frequency factors %g/%g, original context %d): not supported", path,
                               ROPE_FREQS, i, (double)ff[i], plain[i] / scaled[i], (double)s->factor,
                               (double)s->low_freq_factor, (double)s->high_freq_factor, s->original_context);
    free(scaled);
    free(plain);
    return rc;
}

/* Sliding-window attention shorter than the context is refused by name. */
static int check_sliding_window(const vks_gguf *g, const char *path, const char *arch, int context) {
    int window = context;
    int rc = get_dim(g, path, arch, "attention.sliding_window", false, &window);
    if (rc == VKS_OK && window < context)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: %s.attention.sliding_window %d is shorter than the context %d: "
                           "sliding-window attention (Mistral) is not supported", path, arch, window, context);
    return rc;
}

/* <arch>.rope.scaling.type: only "none" (or absent) is what the engine runs. */
static int check_rope_scaling(const vks_gguf *g, const char *path, const char *arch) {
    char key[MAX_NAME];
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (vks_gguf_find_key(g, key) < 0) return VKS_OK;
    const char *type = NULL;
    if (vks_gguf_get_str(g, key, &type, NULL) != VKS_OK)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s is not a string", path, key);
    if (strcmp(type, "none") == 0) return VKS_OK;
    return vks_set_error(VKS_ERR_FORMAT, "%s: RoPE scaling type '%.40s' (%s) is not supported", path, type, key);
}

/* The file's tensors but rope_freqs (read into the config, not a weight). */
typedef struct {
    const vks_gguf *g;
    int64_t skip; /* index of rope_freqs.weight, or -1 */
} file_tensors;

static const void *gguf_tensor_data(const void *ctx, int64_t i, const char **name) {
    const file_tensors *f = ctx;
    const vks_gguf_tensor *t = vks_gguf_tensor_at(f->g, f->skip >= 0 && i >= f->skip ? i + 1 : i);
    *name = t ? t->name : NULL;
    return t ? t->data : NULL;
}

/* Every tensor of the file is used, and every weight is finite. */
static int check_weights(const vks_model *m, const char *path) {
    file_tensors f = {m->gguf, -1};
    for (int64_t i = 0; i < vks_gguf_n_tensors(m->gguf); i++)
        if (!strcmp(vks_gguf_tensor_at(m->gguf, i)->name, ROPE_FREQS)) f.skip = i;
    int rc = vks_model_check_unused(m, path, vks_gguf_n_tensors(m->gguf) - (f.skip >= 0), gguf_tensor_data, &f);
    return rc == VKS_OK ? vks_model_check_finite(m, path) : rc;
}

static void read_special_ids(vks_model *m) {
    uint32_t v;
    if (vks_gguf_get_u32(m->gguf, "tokenizer.ggml.bos_token_id", &v) == VKS_OK && v < (uint32_t)m->cfg.vocab_size)
        m->bos_id = (int)v;
    if (vks_gguf_get_u32(m->gguf, "tokenizer.ggml.eos_token_id", &v) == VKS_OK && v < (uint32_t)m->cfg.vocab_size)
        m->eos_id = (int)v;
}

int vks_model_load_gguf(const char *path, vks_model **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_load_gguf: NULL argument");
    *out = NULL;
    vks_model *m = vks_model_alloc();
    if (!m) return VKS_ERR_NOMEM;
    snprintf(m->path, sizeof m->path, "%s", path);
    int rc = vks_gguf_open(path, &m->gguf);
    if (rc == VKS_OK) rc = read_arch(m->gguf, path, m->arch, sizeof m->arch);
    if (rc == VKS_OK) rc = read_config(m->gguf, path, m->arch, &m->cfg);
    if (rc == VKS_OK) rc = check_rope_scaling(m->gguf, path, m->arch);
    if (rc == VKS_OK) rc = check_sliding_window(m->gguf, path, m->arch, m->cfg.seq_len);
    if (rc == VKS_OK) rc = bind_model(m, path);
    if (rc == VKS_OK) rc = read_rope_freqs(m->gguf, path, m->arch, &m->cfg); /* the config is complete by now */
    if (rc == VKS_OK) rc = check_weights(m, path);
    if (rc != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    read_special_ids(m);
    *out = m;
    return VKS_OK;
}

/* ---- writing ---- */

/* The type a block type falls back to when a row is not whole blocks of it:
 * llama.cpp's quantize takes Q5_0 for Q4_K and Q8_0 for Q6_K; vkswarm has no
 * Q5_0, so Q4_K takes Q4_0 (the same 4.5 bits per weight). F32 ends the chain. */
static vks_dtype fallback_of(vks_dtype t) {
    return t == VKS_DTYPE_Q4_K ? VKS_DTYPE_Q4_0 : t == VKS_DTYPE_Q6_K ? VKS_DTYPE_Q8_0 : VKS_DTYPE_F32;
}

/* The type a matrix of `cols` columns is written in for --type `want`
 * (o->strict: an error instead of a fallback; o->on_fallback told). */
static int matrix_type(const char *name, int64_t cols, vks_dtype want, const vks_model_save_options *o, vks_dtype *out) {
    uint64_t row_bytes;
    vks_dtype t = want;
    while (!vks_dtype_row_bytes(t, (uint64_t)cols, &row_bytes)) t = fallback_of(t);
    if (t != want && o && o->strict)
        return vks_set_error(VKS_ERR_ARG, "tensor %s has rows of %lld columns, not whole %zu-element %s blocks", name,
                             (long long)cols, vks_dtype_block_elems(want), vks_dtype_name(want));
    if (t != want && o && o->on_fallback) o->on_fallback(o->fallback_ctx, name, cols, t);
    *out = t;
    return VKS_OK;
}

/* Encodes an f32 tensor: a matrix as dtype (or its fallback), the rest f32. */
static int add_tensor(vks_gguf_writer *w, const char *name, const vks_tensor *t, vks_dtype dtype, bool matrix,
                      const vks_model_save_options *o) {
    uint64_t row_bytes, total;
    if (!matrix) dtype = VKS_DTYPE_F32;
    int rc = matrix ? matrix_type(name, t->cols, dtype, o, &dtype) : VKS_OK;
    if (rc) return rc;
    vks_dtype_row_bytes(dtype, (uint64_t)t->cols, &row_bytes);
    int64_t ne[2] = {t->cols, t->rows};
    int n_dims = matrix ? 2 : 1;
    if (dtype == VKS_DTYPE_F32) return vks_gguf_add_tensor(w, name, dtype, n_dims, ne, t->data);
    if (__builtin_mul_overflow(row_bytes, (uint64_t)t->rows, &total) || total > SIZE_MAX)
        return vks_set_error(VKS_ERR_NOMEM, "tensor %s too large", name);
    void *buf = malloc((size_t)total);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "out of memory encoding %s", name);
    vks_quantize(dtype, t->data, buf, (size_t)t->rows * (size_t)t->cols);
    return vks_gguf_add_tensor_owned(w, name, dtype, n_dims, ne, buf);
}

static int add_hparams(vks_gguf_writer *w, const vks_model *m) {
    const vks_model_config *c = &m->cfg;
    const char *a = m->arch;
    char key[MAX_NAME];
    int rc = vks_gguf_add_str(w, "general.architecture", a);
    if (rc == VKS_OK) rc = vks_gguf_add_str(w, "general.name", "vkswarm");
    struct { const char *suffix; int value; } dims[] = {
        {"context_length", c->seq_len},          {"embedding_length", c->dim},
        {"block_count", c->n_layers},            {"feed_forward_length", c->hidden_dim},
        {"attention.head_count", c->n_heads},    {"attention.head_count_kv", c->n_kv_heads},
        {"rope.dimension_count", c->head_dim},   {"vocab_size", c->vocab_size},
    };
    for (size_t i = 0; i < sizeof dims / sizeof dims[0] && rc == VKS_OK; i++) {
        snprintf(key, sizeof key, "%s.%s", a, dims[i].suffix);
        rc = vks_gguf_add_u32(w, key, (uint32_t)dims[i].value);
    }
    if (c->n_heads * c->head_dim != c->dim) /* llama.cpp's default is dim / n_heads */
        for (int i = 0; i < 2 && rc == VKS_OK; i++) {
            snprintf(key, sizeof key, "%s.attention.%s_length", a, i ? "value" : "key");
            rc = vks_gguf_add_u32(w, key, (uint32_t)c->head_dim);
        }
    snprintf(key, sizeof key, "%s.attention.layer_norm_rms_epsilon", a);
    if (rc == VKS_OK) rc = vks_gguf_add_f32(w, key, c->norm_eps);
    snprintf(key, sizeof key, "%s.rope.freq_base", a);
    if (rc == VKS_OK) rc = vks_gguf_add_f32(w, key, c->rope_theta);
    return rc;
}

/* Llama 3 scaling as llama.cpp writes it: rope_freqs (each pair's frequency
 * divisor) and the scaling keys (factor and original context are llama.cpp's,
 * the frequency factors are read back by vkswarm). */
static int add_rope_scaling(vks_gguf_writer *w, const vks_model *m) {
    const vks_model_config *c = &m->cfg;
    const vks_rope_scaling *s = &c->rope_scaling;
    if (s->type == VKS_ROPE_SCALING_NONE) return VKS_OK;
    char key[MAX_NAME];
    struct { const char *suffix; float v; } f[] = {{"rope.scaling.factor", s->factor},
                                                   {"rope.scaling.low_freq_factor", s->low_freq_factor},
                                                   {"rope.scaling.high_freq_factor", s->high_freq_factor}};
    int rc = VKS_OK;
    for (size_t i = 0; i < 3 && rc == VKS_OK; i++) {
        snprintf(key, sizeof key, "%s.%s", m->arch, f[i].suffix);
        rc = vks_gguf_add_f32(w, key, f[i].v);
    }
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", m->arch);
    if (rc == VKS_OK) rc = vks_gguf_add_u32(w, key, (uint32_t)s->original_context);
    int half = c->head_dim / 2;
    double *scaled = malloc((size_t)half * sizeof *scaled), *plain = malloc((size_t)half * sizeof *plain);
    float *ff = malloc((size_t)half * sizeof *ff);
    vks_model_config p = *c;
    p.rope_scaling.type = VKS_ROPE_SCALING_NONE;
    if (rc == VKS_OK && (!scaled || !plain || !ff)) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc == VKS_OK) {
        vks_rope_freqs(c, scaled);
        vks_rope_freqs(&p, plain);
        for (int i = 0; i < half; i++) ff[i] = (float)(plain[i] / scaled[i]);
        int64_t ne[1] = {half};
        rc = vks_gguf_add_tensor_owned(w, ROPE_FREQS, VKS_DTYPE_F32, 1, ne, ff);
        ff = NULL;
    }
    free(scaled);
    free(plain);
    free(ff);
    return rc;
}

static int add_all_tensors(vks_gguf_writer *w, const vks_model *m, vks_dtype dt, const vks_model_save_options *o) {
    vks_schema_item *items = NULL;
    int n = 0, rc = vks_schema_list_alloc(&m->cfg, vks_model_has_bias(m), &items, &n);
    char name[MAX_NAME];
    for (int i = 0; i < n && rc == VKS_OK; i++) {
        vks_schema_name(&items[i], VKS_NAME_GGUF, name, sizeof name);
        rc = add_tensor(w, name, vks_model_slot_const(m, &items[i]), dt, items[i].s->rows != VKS_EXT_ONE, o);
    }
    free(items);
    return rc == VKS_OK ? add_rope_scaling(w, m) : rc;
}

static int add_tokenizer(vks_gguf_writer *w, const vks_model *m, const vks_model_save_options *opt) {
    if (opt && opt->tokenizer) return vks_tokenizer_save_gguf(opt->tokenizer, w);
    return vks_gguf_add_tokenizer(w, m, opt ? opt->tokenizer_path : NULL);
}

int vks_model_save_gguf(const vks_model *m, const char *path, const vks_model_save_options *opt) {
    if (!m || !path) return vks_set_error(VKS_ERR_ARG, "vks_model_save_gguf: NULL argument");
    vks_dtype dt = opt ? opt->dtype : VKS_DTYPE_F32;
    if (vks_gguf_ggml_from_dtype(dt) == UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "%s: dtype %s cannot be written to GGUF", path, vks_dtype_name(dt));
    if (!vks_arch_find(m->arch) || vks_arch_find(m->arch)->qk_norm != m->cfg.qk_norm)
        return vks_set_error(VKS_ERR_ARG, "%s: cannot write architecture '%s'", path, m->arch);
    if (opt && opt->tokenizer && opt->tokenizer_path)
        return vks_set_error(VKS_ERR_ARG, "%s: give a tokenizer file or a tokenizer, not both", path);
    vks_model *f32 = NULL;
    int rc = vks_model_copy_f32(m, arch_rope_mode(m->arch), &f32);
    if (rc != VKS_OK) return rc;
    vks_gguf_writer *w = NULL;
    rc = vks_gguf_writer_create(&w);
    if (rc == VKS_OK) rc = add_hparams(w, f32);
    if (rc == VKS_OK) rc = add_tokenizer(w, m, opt);
    if (rc == VKS_OK) rc = add_all_tensors(w, f32, dt, opt);
    if (rc == VKS_ERR_ARG) rc = vks_error_prefix(rc, "%s", path);
    if (rc == VKS_OK) rc = vks_gguf_writer_save(w, path);
    vks_gguf_writer_free(w);
    vks_model_free(f32);
    return rc;
}
