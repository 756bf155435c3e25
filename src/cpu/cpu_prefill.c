/* cpu_prefill.c: the fast f32 forward over many sequences at once (see
 * vks_cpu.h). Rows of every sequence go through each layer together; each
 * sequence attends causally to its own rows only. Norms accumulate in double
 * and RoPE rotates in double as the reference does; attention and SwiGLU run
 * in f32. */
#include "cpu/cpu_internal.h"
#include "vkswarm/vks_model.h"

#include <cblas.h>
#include <limits.h>
#include <stdatomic.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>


typedef struct {
    int rows, n_seqs, max_len;
    const int *seq_lens;
    int *seq_base;     /* first row of each sequence */
    uint32_t *pos;     /* position of each row in its sequence */
    double *rope_cos, *rope_sin; /* [max_len, head_dim/2] */
    float *x, *xb, *q, *k, *v, *att, *tmp, *h1, *h3;
    atomic_int failed; /* a worker could not get its scratch */
} activations;

static void free_activations(activations *a) {
    float *f[] = {a->x, a->xb, a->q, a->k, a->v, a->att, a->tmp, a->h1, a->h3};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) free(f[i]);
    free(a->seq_base), free(a->pos), free(a->rope_cos), free(a->rope_sin);
}

/* freqs: scratch of head_dim/2 doubles. */
static void fill_positions_and_rope(activations *a, const vks_model_config *c, double *freqs) {
    for (int s = 0, row = 0; s < a->n_seqs; s++) {
        a->seq_base[s] = row;
        for (int t = 0; t < a->seq_lens[s]; t++) a->pos[row++] = (uint32_t)t;
    }
    int half = c->head_dim / 2;
    vks_rope_freqs(c, freqs);
    for (int p = 0; p < a->max_len; p++)
        for (int i = 0; i < half; i++) {
            double angle = (double)p * freqs[i];
            a->rope_cos[(size_t)p * half + i] = cos(angle);
            a->rope_sin[(size_t)p * half + i] = sin(angle);
        }
}

static int alloc_activations(activations *a, const vks_model_config *c, const int *seq_lens, int n_seqs, int rows) {
    memset(a, 0, sizeof *a);
    a->rows = rows, a->n_seqs = n_seqs, a->seq_lens = seq_lens;
    for (int s = 0; s < n_seqs; s++)
        if (seq_lens[s] > a->max_len) a->max_len = seq_lens[s];
    size_t r = (size_t)rows, dim = (size_t)c->dim, kv = (size_t)c->kv_dim, hid = (size_t)c->hidden_dim;
    size_t qd = (size_t)c->n_heads * (size_t)c->head_dim;
    size_t rope = (size_t)a->max_len * (size_t)(c->head_dim / 2) + 1;
    a->seq_base = malloc((size_t)n_seqs * sizeof(int));
    a->pos = malloc(r * sizeof(uint32_t));
    a->rope_cos = malloc(rope * sizeof(double)), a->rope_sin = malloc(rope * sizeof(double));
    a->x = malloc(r * dim * 4), a->xb = malloc(r * dim * 4), a->q = malloc(r * qd * 4);
    a->att = malloc(r * qd * 4), a->tmp = malloc(r * dim * 4);
    a->k = malloc(r * kv * 4), a->v = malloc(r * kv * 4);
    a->h1 = malloc(r * hid * 4), a->h3 = malloc(r * hid * 4);
    if (!a->seq_base || !a->pos || !a->rope_cos || !a->rope_sin || !a->x || !a->xb || !a->q || !a->att || !a->tmp ||
        !a->k || !a->v || !a->h1 || !a->h3) {
        free_activations(a);
        return vks_set_error(VKS_ERR_NOMEM, "vks_cpu_prefill: out of memory for %d rows", rows);
    }
    atomic_init(&a->failed, 0);
    double *freqs = malloc((size_t)(c->head_dim / 2 + 1) * sizeof *freqs);
    if (!freqs) {
        free_activations(a);
        return vks_set_error(VKS_ERR_NOMEM, "vks_cpu_prefill: out of memory");
    }
    fill_positions_and_rope(a, c, freqs);
    free(freqs);
    return VKS_OK;
}

/* ---- row-parallel element-wise steps ---- */

typedef struct {
    const vks_cpu *c;
    activations *a;
    const float *in, *w;
    float *out;
    int width;
} row_job;

static void rmsnorm_rows(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    size_t D = (size_t)j->width;
    for (int r = begin; r < end; r++)
        vks_cpu_rmsnorm_row(j->in + (size_t)r * D, j->w, j->width, j->c->m->cfg.norm_eps, j->out + (size_t)r * D);
}

static void rmsnorm(vks_cpu *c, activations *a, const vks_tensor *w, const float *in, int rows, float *out) {
    vks_cpu_convert_rows(w, 0, 1, c->vec);
    row_job j = {.c = c, .a = a, .in = in, .w = c->vec, .out = out, .width = c->m->cfg.dim};
    vks_cpu_parallel_for(c->threads, rows, 16, rmsnorm_rows, &j);
}

static void head_norm_rows(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    for (int r = begin; r < end; r++) /* rows of head_dim, in place */
        vks_cpu_rmsnorm_row(j->out + (size_t)r * j->width, j->w, j->width, j->c->m->cfg.norm_eps,
                            j->out + (size_t)r * j->width);
}

/* RMSNorm of every head of x [rows, heads * head_dim] with w [head_dim]. */
static void head_norm(vks_cpu *c, activations *a, const vks_tensor *w, float *x, int heads) {
    vks_cpu_convert_rows(w, 0, 1, c->vec);
    row_job j = {.c = c, .a = a, .w = c->vec, .out = x, .width = c->m->cfg.head_dim};
    vks_cpu_parallel_for(c->threads, a->rows * heads, 16, head_norm_rows, &j);
}

static void rope_rows(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    const vks_model_config *cf = &j->c->m->cfg;
    int hd = cf->head_dim, half = hd / 2, heads = j->width / hd;
    for (int r = begin; r < end; r++) {
        const double *cs = j->a->rope_cos + (size_t)j->a->pos[r] * half, *sn = j->a->rope_sin + (size_t)j->a->pos[r] * half;
        for (int h = 0; h < heads; h++) {
            float *head = j->out + (size_t)r * j->width + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                int i0 = cf->rope_mode == VKS_ROPE_HALF ? i : 2 * i, i1 = cf->rope_mode == VKS_ROPE_HALF ? i + half : 2 * i + 1;
                double v0 = head[i0], v1 = head[i1];
                head[i0] = (float)(v0 * cs[i] - v1 * sn[i]);
                head[i1] = (float)(v0 * sn[i] + v1 * cs[i]);
            }
        }
    }
}

static void rope(vks_cpu *c, activations *a, float *x, int width) {
    row_job j = {.c = c, .a = a, .out = x, .width = width};
    vks_cpu_parallel_for(c->threads, a->rows, 16, rope_rows, &j);
}

static void swiglu_rows(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    size_t W = (size_t)j->width, first = (size_t)begin * W;
    vks_cpu_silu_mul(j->a->h1 + first, j->a->h3 + first, (size_t)(end - begin) * W);
}

static void add_rows(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    size_t W = (size_t)j->width;
    for (size_t i = (size_t)begin * W; i < (size_t)end * W; i++) j->out[i] += j->in[i];
}

static void add_residual(vks_cpu *c, activations *a, const float *y) {
    row_job j = {.c = c, .a = a, .in = y, .out = a->x, .width = c->m->cfg.dim};
    vks_cpu_parallel_for(c->threads, a->rows, 64, add_rows, &j);
}

/* y[r, :] += bias (no-op when the model has none). */
static void add_bias(vks_cpu *c, const vks_tensor *bias, float *y, int rows) {
    if (!bias->data) return;
    size_t cols = (size_t)bias->cols;
    vks_cpu_convert_rows(bias, 0, 1, c->vec);
    for (size_t r = 0; r < (size_t)rows; r++)
        for (size_t i = 0; i < cols; i++) y[r * cols + i] += c->vec[i];
}

/* ---- attention: one work item per (sequence, query head) ----
 * Query rows go in blocks of ATT_BLOCK: scores = Q K^T and out = P V are
 * single-threaded sgemm calls on this worker (BLAS threads are set to 1
 * around the loop), softmax over each row's keys 0..t in between. */

enum { ATT_BLOCK = 64 };

static void softmax_causal(float *s, int ld, int rows, int t0) {
    for (int i = 0; i < rows; i++) {
        float *row = s + (size_t)i * ld;
        int last = t0 + i;
        vks_cpu_softmax(row, last + 1);
        memset(row + last + 1, 0, (size_t)(ld - last - 1) * sizeof *row);
    }
}

static void attend_block(const vks_model_config *cf, const activations *a, int base, int t0, int rows, int h,
                         float *scores) {
    int hd = cf->head_dim, qd = cf->n_heads * hd, kv_off = (h / (cf->n_heads / cf->n_kv_heads)) * hd, keys = t0 + rows;
    const float *q = a->q + (size_t)(base + t0) * qd + (size_t)h * hd;
    const float *k = a->k + (size_t)base * cf->kv_dim + kv_off, *v = a->v + (size_t)base * cf->kv_dim + kv_off;
    float *out = a->att + (size_t)(base + t0) * qd + (size_t)h * hd;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, hd, 1.0f / sqrtf((float)hd), q, qd, k,
                cf->kv_dim, 0.0f, scores, keys);
    softmax_causal(scores, keys, rows, t0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, hd, keys, 1.0f, scores, keys, v, cf->kv_dim, 0.0f, out,
                qd);
}

static void attention_items(void *ctx, int begin, int end, int worker) {
    (void)worker;
    row_job *j = ctx;
    const vks_model_config *cf = &j->c->m->cfg;
    float *scores = malloc((size_t)ATT_BLOCK * (size_t)j->a->max_len * sizeof *scores);
    if (!scores) {
        atomic_store(&j->a->failed, 1);
        return;
    }
    for (int it = begin; it < end; it++) {
        int s = it / cf->n_heads, h = it % cf->n_heads, len = j->a->seq_lens[s];
        for (int t0 = 0; t0 < len; t0 += ATT_BLOCK)
            attend_block(cf, j->a, j->a->seq_base[s], t0, len - t0 < ATT_BLOCK ? len - t0 : ATT_BLOCK, h, scores);
    }
    free(scores);
}

/* ---- layers ---- */

/* y[rows, out] += scale B (A x) for layer w's target t when the adapter has
 * it: z = x A^T, then y += scale z B^T (two one-thread sgemms; the adapter is
 * a few percent of the product). */
static void lora_add(vks_cpu *c, const vks_layer_weights *w, vks_lora_target t, const float *x, int rows, float *y,
                     activations *a) {
    int layer = (int)(w - c->m->layers);
    const float *A = vks_lora_adapter_A(c->lora, layer, t), *B = vks_lora_adapter_B(c->lora, layer, t);
    if (!A || !B) return;
    int64_t out, in;
    vks_lora_target_shape(&c->m->cfg, t, &out, &in);
    const vks_lora_config *lc = vks_lora_adapter_config(c->lora);
    int r = lc->rank;
    float *z = malloc((size_t)rows * (size_t)r * sizeof *z);
    if (!z) {
        atomic_store(&a->failed, 1);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, r, (int)in, 1.0f, x, (int)in, A, (int)in, 0.0f, z, r);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, (int)out, r, (float)vks_lora_scale(lc->alpha, r), z, r,
                B, r, 1.0f, y, (int)out);
    free(z);
}

/* vks_cpu_matmul plus the adapter's share of target t. */
static void adapted_matmul(vks_cpu *c, const vks_layer_weights *w, vks_lora_target t, const vks_tensor *W,
                           const float *x, activations *a, float *y) {
    vks_cpu_matmul(c, W, x, a->rows, y);
    if (c->lora) lora_add(c, w, t, x, a->rows, y, a);
}

static void attention_block(vks_cpu *c, const vks_layer_weights *w, activations *a) {
    const vks_model_config *cf = &c->m->cfg;
    rmsnorm(c, a, &w->attn_norm, a->x, a->rows, a->xb);
    adapted_matmul(c, w, VKS_LORA_Q, &w->wq, a->xb, a, a->q);
    adapted_matmul(c, w, VKS_LORA_K, &w->wk, a->xb, a, a->k);
    adapted_matmul(c, w, VKS_LORA_V, &w->wv, a->xb, a, a->v);
    add_bias(c, &w->bq, a->q, a->rows);
    add_bias(c, &w->bk, a->k, a->rows);
    add_bias(c, &w->bv, a->v, a->rows);
    if (cf->qk_norm) { /* per head, before RoPE (Qwen3) */
        head_norm(c, a, &w->q_norm, a->q, cf->n_heads);
        head_norm(c, a, &w->k_norm, a->k, cf->n_kv_heads);
    }
    rope(c, a, a->q, cf->n_heads * cf->head_dim);
    rope(c, a, a->k, cf->kv_dim);
    if (c->kv_f16) /* as the engine's f16 cache holds them (kv_store_f16: nearest even) */
        for (size_t i = 0; i < (size_t)a->rows * (size_t)cf->kv_dim; i++) {
            a->k[i] = vks_f16_to_f32(vks_f32_to_f16(a->k[i]));
            a->v[i] = vks_f16_to_f32(vks_f32_to_f16(a->v[i]));
        }
    row_job j = {.c = c, .a = a};
    vks_cpu_parallel_for(c->threads, a->n_seqs * cf->n_heads, 1, attention_items, &j);
    adapted_matmul(c, w, VKS_LORA_O, &w->wo, a->att, a, a->tmp);
    add_residual(c, a, a->tmp);
}

static void ffn_block(vks_cpu *c, const vks_layer_weights *w, activations *a) {
    rmsnorm(c, a, &w->ffn_norm, a->x, a->rows, a->xb);
    adapted_matmul(c, w, VKS_LORA_GATE, &w->w1, a->xb, a, a->h1);
    adapted_matmul(c, w, VKS_LORA_UP, &w->w3, a->xb, a, a->h3);
    row_job j = {.c = c, .a = a, .width = c->m->cfg.hidden_dim};
    vks_cpu_parallel_for(c->threads, a->rows, 16, swiglu_rows, &j);
    adapted_matmul(c, w, VKS_LORA_DOWN, &w->w2, a->h1, a, a->tmp);
    add_residual(c, a, a->tmp);
}

/* Final norm and classifier on the chosen rows only (gathered into xb, tmp). */
static void output_rows(vks_cpu *c, activations *a, const int *out_rows, int n_out, float *logits, float *hidden) {
    size_t dim = (size_t)c->m->cfg.dim;
    for (int i = 0; i < n_out; i++)
        memcpy(a->tmp + (size_t)i * dim, a->x + (size_t)(out_rows ? out_rows[i] : i) * dim, dim * sizeof(float));
    rmsnorm(c, a, &c->m->final_norm, a->tmp, n_out, a->xb);
    if (hidden) memcpy(hidden, a->xb, (size_t)n_out * dim * sizeof(float));
    vks_cpu_matmul(c, &c->m->classifier, a->xb, n_out, logits);
}

/* ---- entry points ---- */

static int check_prefill_args(const vks_cpu *c, const int32_t *ids, const int *seq_lens, int n_seqs,
                              const int *out_rows, int n_out, const float *logits, int *rows) {
    if (!c || !ids || !seq_lens || !logits || n_seqs <= 0)
        return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: NULL argument or no sequences");
    const vks_model_config *cf = &c->m->cfg;
    int64_t total = 0;
    for (int s = 0; s < n_seqs; s++) {
        if (seq_lens[s] <= 0 || seq_lens[s] > cf->seq_len)
            return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: sequence %d has %d tokens, outside 1..seq_len %d", s,
                                 seq_lens[s], cf->seq_len);
        if ((total += seq_lens[s]) > INT_MAX / 4)
            return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: too many rows in one call");
    }
    for (int64_t r = 0; r < total; r++)
        if (ids[r] < 0 || ids[r] >= cf->vocab_size)
            return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: token %d at row %lld outside the vocabulary", ids[r],
                                 (long long)r);
    if (out_rows ? n_out < 0 || n_out > total : n_out != total)
        return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: %d output rows of %lld", n_out, (long long)total);
    for (int i = 0; out_rows && i < n_out; i++)
        if (out_rows[i] < 0 || out_rows[i] >= total)
            return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: output row %d outside 0..%lld", out_rows[i],
                                 (long long)total - 1);
    *rows = (int)total;
    return VKS_OK;
}

/* Copies the output rows of the residual stream into every tap at boundary `layer`. */
static void take_taps(const vks_cpu *c, const activations *a, const vks_layer_taps *taps, int layer,
                      const int *out_rows, int n_out) {
    size_t dim = (size_t)c->m->cfg.dim;
    for (int t = 0; taps && t < taps->n; t++) {
        if (taps->layers[t] != layer) continue;
        float *dst = taps->out + (size_t)t * (size_t)n_out * dim;
        for (int i = 0; i < n_out; i++)
            memcpy(dst + (size_t)i * dim, a->x + (size_t)(out_rows ? out_rows[i] : i) * dim, dim * sizeof(float));
    }
}

static bool taps_ok(const vks_model_config *cf, const vks_layer_taps *taps) {
    if (!taps || taps->n == 0) return true;
    if (taps->n < 0 || !taps->layers || !taps->out) return false;
    for (int t = 0; t < taps->n; t++)
        if (taps->layers[t] < 1 || taps->layers[t] >= cf->n_layers) return false;
    return true;
}

int vks_cpu_prefill(vks_cpu *c, const int32_t *ids, const int *seq_lens, int n_seqs, const int *out_rows, int n_out,
                    float *logits, float *hidden) {
    return vks_cpu_prefill_taps(c, ids, seq_lens, n_seqs, out_rows, n_out, logits, hidden, NULL);
}

int vks_cpu_prefill_taps(vks_cpu *c, const int32_t *ids, const int *seq_lens, int n_seqs, const int *out_rows,
                         int n_out, float *logits, float *hidden, const vks_layer_taps *taps) {
    int rows = 0, rc = check_prefill_args(c, ids, seq_lens, n_seqs, out_rows, n_out, logits, &rows);
    if (rc != VKS_OK) return rc;
    if (!taps_ok(&c->m->cfg, taps)) return vks_set_error(VKS_ERR_ARG, "vks_cpu_prefill: bad layer taps");
    const vks_model_config *cf = &c->m->cfg;
    activations a;
    if ((rc = alloc_activations(&a, cf, seq_lens, n_seqs, rows)) != VKS_OK) return rc;
    vks_cpu_blas_threads(1); /* each worker's sgemm runs on that worker */
    for (int r = 0; r < rows; r++) vks_cpu_convert_rows(&c->m->tok_emb, ids[r], 1, a.x + (size_t)r * cf->dim);
    for (int l = 0; l < cf->n_layers; l++) {
        attention_block(c, &c->m->layers[l], &a);
        ffn_block(c, &c->m->layers[l], &a);
        take_taps(c, &a, taps, l + 1, out_rows, n_out);
    }
    if (n_out > 0) output_rows(c, &a, out_rows, n_out, logits, hidden);
    rc = atomic_load(&a.failed) ? vks_set_error(VKS_ERR_NOMEM, "vks_cpu_prefill: out of memory for attention scores or the adapter")
                                : VKS_OK;
    free_activations(&a);
    return rc;
}

static int64_t widest_row(const vks_model *m) {
    const vks_model_config *c = &m->cfg;
    int64_t w = c->dim > c->hidden_dim ? c->dim : c->hidden_dim, qd = (int64_t)c->n_heads * c->head_dim;
    if (qd > w) w = qd;
    return w > c->kv_dim ? w : c->kv_dim;
}

int vks_cpu_create(const vks_model *m, const vks_cpu_options *opt, vks_cpu **out) {
    if (!m || !out) return vks_set_error(VKS_ERR_ARG, "vks_cpu_create: NULL argument");
    *out = NULL;
    int rc = vks_model_check_tensors(m, "vks_cpu_create");
    if (rc != VKS_OK) return rc;
    vks_cpu *c = calloc(1, sizeof *c);
    if (!c) return vks_set_error(VKS_ERR_NOMEM, "vks_cpu_create: out of memory");
    int64_t wide = widest_row(m);
    c->m = m;
    c->threads = vks_cpu_thread_count(opt ? opt->threads : 0);
    c->item_rows = opt && opt->panel_rows > 0 ? opt->panel_rows : 0;
    c->kv_f16 = opt && opt->kv_f16;
    c->panel_floats = vks_cpu_panel_floats(m, c->item_rows);
    /* each worker's panel starts on a 64-byte boundary, so no worker's sgemm
     * sees its converted rows at another alignment than another's */
    c->panel_floats = (c->panel_floats + 15) / 16 * 16;
    c->panel = c->panel_floats ? aligned_alloc(64, c->panel_floats * (size_t)c->threads * sizeof(float)) : NULL;
    c->vec = malloc((size_t)wide * sizeof(float));
    if ((c->panel_floats && !c->panel) || !c->vec) {
        vks_cpu_destroy(c);
        return vks_set_error(VKS_ERR_NOMEM, "vks_cpu_create: out of memory for %d panels of %zu floats", c->threads,
                             c->panel_floats);
    }
    *out = c;
    return VKS_OK;
}

int vks_cpu_set_lora(vks_cpu *c, const vks_lora_adapter *a) {
    if (!c) return vks_set_error(VKS_ERR_ARG, "vks_cpu_set_lora: NULL context");
    int rc = a ? vks_lora_adapter_check_shape(a, &c->m->cfg, "CPU forward") : VKS_OK;
    c->lora = rc ? NULL : a;
    return rc;
}

void vks_cpu_destroy(vks_cpu *c) {
    if (!c) return;
    free(c->panel);
    free(c->vec);
    free(c);
}
