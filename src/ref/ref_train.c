/* ref_train.c: float64 whole-model training reference (vks_ref_train.h): the
 * parameter sets, the forward over packed sequences keeping its activations,
 * and the backward through every layer, op by op from vks_ref_grad.h, in the
 * order of llm.c's gpt2_backward. */
#include "vkswarm/vks_ref_train.h"
#include "vkswarm/vks_ref_grad.h"
#include "vkswarm/vks_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- parameter sets ---- */

/* The view of a model-level tensor (tok_emb, final_norm, classifier). */
static double **model_view(vks_ref_params *p, int index) {
    return index == VKS_T_tok_emb ? &p->tok_emb : index == VKS_T_final_norm ? &p->final_norm : &p->classifier;
}

/* Lays the tensors out in the schema's order; with p->data NULL (sizing
 * pass) only counts. */
static size_t lay_out(vks_ref_params *p, const vks_schema_item *items, int n) {
    size_t used = 0;
    p->n_tensors = n;
    for (int i = 0; i < n; i++) {
        vks_ref_tensor *t = &p->tensors[i];
        vks_schema_name(&items[i], VKS_NAME_INTERNAL, t->name, sizeof t->name);
        t->data = p->data ? p->data + used : NULL;
        t->rows = items[i].rows;
        t->cols = items[i].cols;
        used += (size_t)t->rows * (size_t)t->cols;
        *(items[i].layer >= 0 ? &p->layers[items[i].layer].t[items[i].index] : model_view(p, items[i].index)) = t->data;
    }
    if (p->cfg.shared_classifier) p->classifier = p->tok_emb;
    return used;
}

int vks_ref_params_create(const vks_model_config *cfg, bool has_bias, vks_ref_params **out) {
    if (!cfg || !out) return vks_set_error(VKS_ERR_ARG, "vks_ref_params_create: NULL argument");
    *out = NULL;
    int rc = vks_model_config_check(cfg, "vks_ref_params_create");
    if (rc != VKS_OK) return rc;
    vks_schema_item *items = NULL;
    int n = 0;
    if ((rc = vks_schema_list_alloc(cfg, has_bias, &items, &n)) != VKS_OK) return rc;
    vks_ref_params *p = calloc(1, sizeof *p);
    if (p) {
        p->cfg = *cfg;
        p->has_bias = has_bias;
        p->layers = calloc((size_t)cfg->n_layers, sizeof *p->layers);
        p->tensors = calloc((size_t)n, sizeof *p->tensors);
    }
    if (p && p->layers && p->tensors) {
        p->n_values = lay_out(p, items, n); /* sizing pass: offsets from a NULL block */
        p->data = calloc(p->n_values, sizeof *p->data);
    }
    if (!p || !p->layers || !p->tensors || !p->data) {
        free(items);
        vks_ref_params_free(p);
        return vks_set_error(VKS_ERR_NOMEM, "vks_ref_params_create: out of memory");
    }
    lay_out(p, items, n);
    free(items);
    *out = p;
    return VKS_OK;
}

void vks_ref_params_free(vks_ref_params *p) {
    if (!p) return;
    free(p->data);
    free(p->tensors);
    free(p->layers);
    free(p);
}

void vks_ref_params_zero(vks_ref_params *p) {
    if (p) memset(p->data, 0, p->n_values * sizeof *p->data);
}

vks_ref_tensor *vks_ref_params_find(const vks_ref_params *p, const char *name) {
    if (!p || !name) return NULL;
    for (int i = 0; i < p->n_tensors; i++)
        if (strcmp(p->tensors[i].name, name) == 0) return &p->tensors[i];
    return NULL;
}

/* dst[rows * cols] = t as doubles (t's shape was checked against the config). */
static void tensor_to_f64(const vks_tensor *t, float *row_buf, double *dst) {
    for (int64_t r = 0; r < t->rows; r++) {
        vks_tensor_row_f32(t, r, row_buf);
        for (int64_t c = 0; c < t->cols; c++) dst[r * t->cols + c] = row_buf[c];
    }
}

/* Every tensor p lists, from the model tensor of the same schema entry. */
static int copy_model_weights(const vks_model *m, vks_ref_params *p, float *row_buf) {
    vks_schema_item *items = NULL;
    int n = 0, rc = vks_schema_list_alloc(&m->cfg, p->has_bias, &items, &n);
    for (int i = 0; i < n && rc == VKS_OK; i++) tensor_to_f64(vks_model_slot_const(m, &items[i]), row_buf, p->tensors[i].data);
    free(items);
    return rc;
}

int vks_ref_params_from_model(const vks_model *m, vks_ref_params **out) {
    if (!m || !out) return vks_set_error(VKS_ERR_ARG, "vks_ref_params_from_model: NULL argument");
    *out = NULL;
    int rc = vks_model_check_tensors(m, "vks_ref_params_from_model");
    if (rc != VKS_OK) return rc;
    bool has_bias = vks_model_has_bias(m); /* the same in every layer: vks_model_check_tensors */
    const vks_model_config *c = &m->cfg;
    int64_t widest = c->dim > c->hidden_dim ? c->dim : c->hidden_dim;
    if (vks_schema_extent(c, VKS_EXT_Q) > widest) widest = vks_schema_extent(c, VKS_EXT_Q);
    float *row_buf = malloc((size_t)widest * sizeof *row_buf);
    if (!row_buf) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_params_from_model: out of memory");
    vks_ref_params *p = NULL;
    rc = vks_ref_params_create(c, has_bias, &p);
    if (rc == VKS_OK) rc = copy_model_weights(m, p, row_buf);
    free(row_buf);
    if (rc != VKS_OK) {
        vks_ref_params_free(p);
        return rc;
    }
    *out = p;
    return rc;
}

/* ---- the batch ---- */

/* Per-row facts derived from the packing. */
typedef struct {
    int n;
    uint32_t *tokens;  /* [n] */
    uint32_t *pos;     /* [n] position in its sequence */
    uint32_t *start;   /* [n] first row of its sequence */
    uint32_t *target;  /* [n] next token, 0 where none */
    bool *has_target;  /* [n] */
    double *freqs;     /* RoPE frequencies [head_dim/2] */
} batch_rows;

static void batch_rows_free(batch_rows *r) {
    free(r->tokens);
    free(r->pos);
    free(r->start);
    free(r->target);
    free(r->has_target);
    free(r->freqs);
}

static int check_batch(const vks_model_config *c, const vks_ref_batch *b) {
    const char *fn = "vks_ref_train";
    if (!b || !b->tokens || b->n_tokens <= 0) return vks_set_error(VKS_ERR_ARG, "%s: empty batch", fn);
    for (int r = 0; r < b->n_tokens; r++)
        if (b->tokens[r] < 0 || b->tokens[r] >= c->vocab_size)
            return vks_set_error(VKS_ERR_ARG, "%s: token %d at row %d outside the vocabulary", fn, b->tokens[r], r);
    if (!b->seq_lens) {
        if (b->n_tokens > c->seq_len)
            return vks_set_error(VKS_ERR_ARG, "%s: a sequence of %d tokens exceeds seq_len %d", fn, b->n_tokens,
                                 c->seq_len);
        return VKS_OK;
    }
    int64_t total = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->seq_lens[s] <= 0 || b->seq_lens[s] > c->seq_len)
            return vks_set_error(VKS_ERR_ARG, "%s: sequence %d has %d tokens, outside 1..seq_len %d", fn, s,
                                 b->seq_lens[s], c->seq_len);
        total += b->seq_lens[s];
    }
    if (total != b->n_tokens)
        return vks_set_error(VKS_ERR_ARG, "%s: sequence lengths add up to %lld, not n_tokens %d", fn,
                             (long long)total, b->n_tokens);
    return VKS_OK;
}

static int batch_rows_make(const vks_model_config *c, const vks_ref_batch *b, batch_rows *r) {
    memset(r, 0, sizeof *r);
    int rc = check_batch(c, b);
    if (rc != VKS_OK) return rc;
    size_t n = (size_t)b->n_tokens;
    r->n = b->n_tokens;
    r->tokens = malloc(n * sizeof *r->tokens);
    r->pos = malloc(n * sizeof *r->pos);
    r->start = malloc(n * sizeof *r->start);
    r->target = malloc(n * sizeof *r->target);
    r->has_target = malloc(n * sizeof *r->has_target);
    r->freqs = malloc((size_t)(c->head_dim / 2 + 1) * sizeof *r->freqs);
    if (!r->freqs || !r->tokens || !r->pos || !r->start || !r->target || !r->has_target) {
        batch_rows_free(r);
        return vks_set_error(VKS_ERR_NOMEM, "vks_ref_train: out of memory for %d rows", b->n_tokens);
    }
    int n_seqs = b->seq_lens ? b->n_seqs : 1;
    for (int s = 0, t0 = 0; s < n_seqs; s++) {
        int len = b->seq_lens ? b->seq_lens[s] : b->n_tokens;
        for (int i = 0; i < len; i++) {
            int t = t0 + i;
            r->tokens[t] = (uint32_t)b->tokens[t];
            r->pos[t] = (uint32_t)i;
            r->start[t] = (uint32_t)t0;
            r->has_target[t] = i + 1 < len;
            r->target[t] = r->has_target[t] ? (uint32_t)b->tokens[t + 1] : 0;
        }
        t0 += len;
    }
    vks_rope_freqs(c, r->freqs);
    return VKS_OK;
}

/* ---- activation store ---- */

typedef struct {
    double *x_in;      /* [n, dim] residual stream entering the layer */
    double *xn1;       /* [n, dim] attention norm output */
    double *q, *k, *v; /* [n, qdim], [n, kv] after bias (q/k norm) and RoPE */
    double *q_pre, *k_pre; /* with cfg.qk_norm: q and k before their per-head norm, else NULL */
    double *att_max, *att_sum; /* [n, n_heads] softmax statistics */
    double *att;       /* [n, qdim] attention output */
    double *x_mid;     /* [n, dim] stream after the attention residual */
    double *xn2;       /* [n, dim] FFN norm output */
    double *h1, *h3, *hs; /* [n, hidden] gate, up, silu(gate) * up */
} layer_acts;

struct vks_ref_acts {
    layer_acts *layers;
    double *x_final;   /* [n, dim] stream after the last layer */
    double *xnf;       /* [n, dim] final norm output */
    double *logits;    /* [n, vocab] */
    double *block;     /* everything above */
    size_t used;
    int n;             /* rows */
};

/* Hands out the next count doubles of the block (sizing pass when block is NULL). */
static double *take(vks_ref_acts *a, size_t count) {
    double *p = a->block ? a->block + a->used : NULL;
    a->used += count;
    return p;
}

static void lay_out_acts(vks_ref_acts *a, const vks_model_config *c, size_t n) {
    size_t dim = (size_t)c->dim, qdim = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->kv_dim;
    size_t hid = (size_t)c->hidden_dim, heads = (size_t)c->n_heads;
    a->used = 0;
    for (int l = 0; l < c->n_layers; l++) {
        layer_acts *s = &a->layers[l];
        s->x_in = take(a, n * dim);
        s->xn1 = take(a, n * dim);
        s->q = take(a, n * qdim);
        s->k = take(a, n * kv);
        s->v = take(a, n * kv);
        s->q_pre = c->qk_norm ? take(a, n * qdim) : NULL;
        s->k_pre = c->qk_norm ? take(a, n * kv) : NULL;
        s->att_max = take(a, n * heads);
        s->att_sum = take(a, n * heads);
        s->att = take(a, n * qdim);
        s->x_mid = take(a, n * dim);
        s->xn2 = take(a, n * dim);
        s->h1 = take(a, n * hid);
        s->h3 = take(a, n * hid);
        s->hs = take(a, n * hid);
    }
    a->x_final = take(a, n * dim);
    a->xnf = take(a, n * dim);
    a->logits = take(a, n * (size_t)c->vocab_size);
}

void vks_ref_acts_free(vks_ref_acts *a) {
    if (!a) return;
    free(a->block);
    free(a->layers);
    free(a);
}

static int acts_create(const vks_model_config *c, int n, vks_ref_acts **out) {
    vks_ref_acts *a = calloc(1, sizeof *a);
    if (a) a->layers = calloc((size_t)c->n_layers, sizeof *a->layers);
    size_t bytes = 0;
    if (a && a->layers) {
        lay_out_acts(a, c, (size_t)n); /* sizing pass */
        if (vks_mul_size(a->used, sizeof(double), &bytes)) a->block = malloc(bytes);
    }
    if (!a || !a->layers || !a->block) {
        vks_ref_acts_free(a);
        return vks_set_error(VKS_ERR_NOMEM, "vks_ref_train_forward: out of memory for the activations of %d tokens",
                             n);
    }
    lay_out_acts(a, c, (size_t)n);
    a->n = n;
    *out = a;
    return VKS_OK;
}

/* ---- forward ---- */

/* y = x @ W^T, plus b when given. */
static int linear_forward(const double *x, const double *W, const double *bias, int n, int out_dim, int in_dim,
                          double *y) {
    int rc = vks_ref_matmul_forward(x, W, n, out_dim, in_dim, y);
    if (rc == VKS_OK && bias) rc = vks_ref_bias_forward(y, bias, n, out_dim);
    return rc;
}

static void residual_add(double *x, const double *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

static int attention_forward(const vks_ref_params *p, const vks_ref_layer *w, const batch_rows *rows,
                             layer_acts *s, double *x) {
    const vks_model_config *c = &p->cfg;
    int n = rows->n, qdim = c->n_heads * c->head_dim;
    double eps = c->norm_eps;
    memcpy(s->x_in, x, (size_t)n * c->dim * sizeof *x);
    int rc = vks_ref_rmsnorm_forward(x, w->attn_norm, n, c->dim, eps, s->xn1);
    if (rc == VKS_OK) rc = linear_forward(s->xn1, w->wq, w->bq, n, qdim, c->dim, s->q);
    if (rc == VKS_OK) rc = linear_forward(s->xn1, w->wk, w->bk, n, c->kv_dim, c->dim, s->k);
    if (rc == VKS_OK) rc = linear_forward(s->xn1, w->wv, w->bv, n, c->kv_dim, c->dim, s->v);
    if (rc == VKS_OK && c->qk_norm) { /* per head, before RoPE (Qwen3) */
        memcpy(s->q_pre, s->q, (size_t)n * qdim * sizeof *s->q);
        memcpy(s->k_pre, s->k, (size_t)n * c->kv_dim * sizeof *s->k);
        rc = vks_ref_rmsnorm_forward(s->q_pre, w->q_norm, n * c->n_heads, c->head_dim, eps, s->q);
        if (rc == VKS_OK) rc = vks_ref_rmsnorm_forward(s->k_pre, w->k_norm, n * c->n_kv_heads, c->head_dim, eps, s->k);
    }
    if (rc == VKS_OK)
        rc = vks_ref_rope_forward(s->q, rows->pos, n, qdim, 0, c->n_heads, c->head_dim, rows->freqs, c->rope_mode);
    if (rc == VKS_OK)
        rc = vks_ref_rope_forward(s->k, rows->pos, n, c->kv_dim, 0, c->n_kv_heads, c->head_dim, rows->freqs,
                                  c->rope_mode);
    if (rc == VKS_OK)
        rc = vks_ref_attention_forward(s->q, s->k, s->v, rows->start, n, c->n_heads, c->n_kv_heads, c->head_dim,
                                       s->att, s->att_max, s->att_sum);
    if (rc == VKS_OK) rc = linear_forward(s->att, w->wo, NULL, n, c->dim, qdim, s->x_mid); /* the branch */
    if (rc == VKS_OK) residual_add(s->x_mid, x, (size_t)n * c->dim);
    return rc;
}

static int ffn_forward(const vks_ref_params *p, const vks_ref_layer *w, int n, layer_acts *s, double *x_out) {
    const vks_model_config *c = &p->cfg;
    size_t hidden = (size_t)n * c->hidden_dim;
    int rc = vks_ref_rmsnorm_forward(s->x_mid, w->ffn_norm, n, c->dim, c->norm_eps, s->xn2);
    if (rc == VKS_OK) rc = linear_forward(s->xn2, w->w1, NULL, n, c->hidden_dim, c->dim, s->h1);
    if (rc == VKS_OK) rc = linear_forward(s->xn2, w->w3, NULL, n, c->hidden_dim, c->dim, s->h3);
    if (rc == VKS_OK) rc = vks_ref_swiglu_forward(s->h1, s->h3, hidden, s->hs);
    if (rc == VKS_OK) rc = linear_forward(s->hs, w->w2, NULL, n, c->dim, c->hidden_dim, x_out); /* the branch */
    if (rc == VKS_OK) residual_add(x_out, s->x_mid, (size_t)n * c->dim);
    return rc;
}

/* logp of each row's target; 0 where the row has none. */
static int rows_logprob(const vks_model_config *c, const batch_rows *rows, const double *logits, double *logp) {
    int rc = vks_ref_token_logprob_forward(logits, rows->n, c->vocab_size, rows->target, logp);
    for (int r = 0; rc == VKS_OK && r < rows->n; r++)
        if (!rows->has_target[r]) logp[r] = 0.0;
    return rc;
}

/* The whole forward into the store `a`. */
static int forward_into(const vks_ref_params *p, const batch_rows *rows, vks_ref_acts *a) {
    const vks_model_config *c = &p->cfg;
    int n = rows->n;
    double *x = a->x_final; /* the stream: each layer's output is the next one's input */
    int rc = vks_ref_embed_forward(p->tok_emb, c->vocab_size, c->dim, rows->tokens, n, x);
    for (int l = 0; rc == VKS_OK && l < c->n_layers; l++) {
        rc = attention_forward(p, &p->layers[l], rows, &a->layers[l], x);
        if (rc == VKS_OK) rc = ffn_forward(p, &p->layers[l], n, &a->layers[l], x);
    }
    if (rc == VKS_OK) rc = vks_ref_rmsnorm_forward(x, p->final_norm, n, c->dim, c->norm_eps, a->xnf);
    if (rc == VKS_OK) rc = vks_ref_matmul_forward(a->xnf, p->classifier, n, c->vocab_size, c->dim, a->logits);
    return rc;
}

int vks_ref_train_forward(const vks_ref_params *p, const vks_ref_batch *b, double *logp, double *logits,
                          vks_ref_acts **acts) {
    if (acts) *acts = NULL;
    if (!p || !logp) return vks_set_error(VKS_ERR_ARG, "vks_ref_train_forward: NULL argument");
    batch_rows rows;
    int rc = batch_rows_make(&p->cfg, b, &rows);
    if (rc != VKS_OK) return rc;
    vks_ref_acts *a = NULL;
    rc = acts_create(&p->cfg, rows.n, &a);
    if (rc == VKS_OK) rc = forward_into(p, &rows, a);
    if (rc == VKS_OK) rc = rows_logprob(&p->cfg, &rows, a->logits, logp);
    if (rc == VKS_OK && logits) memcpy(logits, a->logits, (size_t)rows.n * p->cfg.vocab_size * sizeof *logits);
    batch_rows_free(&rows);
    if (rc == VKS_OK && acts)
        *acts = a;
    else
        vks_ref_acts_free(a);
    return rc;
}

/* ---- backward ---- */

/* Gradient scratch, zeroed before each use (the ops accumulate). */
typedef struct {
    double *dx;       /* [n, dim] gradient of the residual stream */
    double *dxn;      /* [n, dim] gradient of a norm's output */
    double *dq, *dk, *dv; /* [n, qdim], [n, kv] */
    double *dq_pre, *dk_pre; /* [n, qdim], [n, kv]: through the q/k norm */
    double *datt;     /* [n, qdim] */
    double *dh1, *dh3, *dhs; /* [n, hidden] */
    double *dlogits;  /* [n, vocab] */
    double *block;
    size_t total;
} grad_scratch;

static int scratch_create(const vks_model_config *c, size_t n, grad_scratch *g) {
    size_t dim = (size_t)c->dim, qdim = (size_t)c->n_heads * c->head_dim, kv = (size_t)c->kv_dim;
    size_t hid = (size_t)c->hidden_dim, sizes[] = {dim, dim, qdim, kv, kv, qdim, hid, hid, hid, (size_t)c->vocab_size,
                                                   qdim, kv};
    double **slots[] = {&g->dx, &g->dxn, &g->dq, &g->dk, &g->dv, &g->datt, &g->dh1, &g->dh3, &g->dhs, &g->dlogits,
                        &g->dq_pre, &g->dk_pre};
    size_t per_row = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) per_row += sizes[i];
    g->total = per_row * n;
    g->block = calloc(g->total, sizeof *g->block);
    if (!g->block) return vks_set_error(VKS_ERR_NOMEM, "vks_ref_train_backward: out of memory for %zu rows", n);
    double *at = g->block;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        *slots[i] = at;
        at += sizes[i] * n;
    }
    return VKS_OK;
}

static void zero(double *x, size_t n) { memset(x, 0, n * sizeof *x); }

/* Turns dx (gradient of the layer's output) into the gradient of x_mid. */
static int ffn_backward(const vks_ref_params *p, const vks_ref_layer *w, const layer_acts *s, int n,
                        vks_ref_layer *gw, grad_scratch *g) {
    const vks_model_config *c = &p->cfg;
    int dim = c->dim, hid = c->hidden_dim;
    zero(g->dhs, (size_t)n * hid);
    zero(g->dh1, (size_t)n * hid);
    zero(g->dh3, (size_t)n * hid);
    zero(g->dxn, (size_t)n * dim);
    int rc = vks_ref_matmul_backward(s->hs, w->w2, n, dim, hid, g->dx, g->dhs, gw->w2);
    if (rc == VKS_OK) rc = vks_ref_swiglu_backward(s->h1, s->h3, (size_t)n * hid, g->dhs, g->dh1, g->dh3);
    if (rc == VKS_OK) rc = vks_ref_matmul_backward(s->xn2, w->w1, n, hid, dim, g->dh1, g->dxn, gw->w1);
    if (rc == VKS_OK) rc = vks_ref_matmul_backward(s->xn2, w->w3, n, hid, dim, g->dh3, g->dxn, gw->w3);
    /* residual: dx already holds the pass-through; the norm's input gradient adds to it */
    if (rc == VKS_OK) rc = vks_ref_rmsnorm_backward(s->x_mid, w->ffn_norm, n, dim, c->norm_eps, g->dxn, g->dx,
                                                    gw->ffn_norm);
    return rc;
}

/* q/k/v projections: bias gradients, then weight and input gradients into dxn. */
static int qkv_backward(const vks_ref_params *p, const vks_ref_layer *w, const layer_acts *s, int n,
                        vks_ref_layer *gw, grad_scratch *g) {
    const vks_model_config *c = &p->cfg;
    int dim = c->dim, qdim = c->n_heads * c->head_dim, kv = c->kv_dim;
    int rc = VKS_OK;
    if (p->has_bias) {
        rc = vks_ref_bias_backward(g->dq, n, qdim, gw->bq);
        if (rc == VKS_OK) rc = vks_ref_bias_backward(g->dk, n, kv, gw->bk);
        if (rc == VKS_OK) rc = vks_ref_bias_backward(g->dv, n, kv, gw->bv);
    }
    if (rc == VKS_OK) rc = vks_ref_matmul_backward(s->xn1, w->wq, n, qdim, dim, g->dq, g->dxn, gw->wq);
    if (rc == VKS_OK) rc = vks_ref_matmul_backward(s->xn1, w->wk, n, kv, dim, g->dk, g->dxn, gw->wk);
    if (rc == VKS_OK) rc = vks_ref_matmul_backward(s->xn1, w->wv, n, kv, dim, g->dv, g->dxn, gw->wv);
    return rc;
}

/* dq, dk (gradients of the normed q, k) become those of q, k before the norm. */
static int qk_norm_backward(const vks_ref_params *p, const vks_ref_layer *w, const layer_acts *s, int n,
                            vks_ref_layer *gw, grad_scratch *g) {
    const vks_model_config *c = &p->cfg;
    size_t qn = (size_t)n * c->n_heads * c->head_dim, kn = (size_t)n * c->kv_dim;
    zero(g->dq_pre, qn);
    zero(g->dk_pre, kn);
    int rc = vks_ref_rmsnorm_backward(s->q_pre, w->q_norm, n * c->n_heads, c->head_dim, c->norm_eps, g->dq, g->dq_pre,
                                      gw->q_norm);
    if (rc == VKS_OK)
        rc = vks_ref_rmsnorm_backward(s->k_pre, w->k_norm, n * c->n_kv_heads, c->head_dim, c->norm_eps, g->dk,
                                      g->dk_pre, gw->k_norm);
    memcpy(g->dq, g->dq_pre, qn * sizeof *g->dq);
    memcpy(g->dk, g->dk_pre, kn * sizeof *g->dk);
    return rc;
}

/* Turns dx (gradient of x_mid) into the gradient of the layer's input. */
static int attention_backward(const vks_ref_params *p, const vks_ref_layer *w, const layer_acts *s,
                              const batch_rows *rows, vks_ref_layer *gw, grad_scratch *g) {
    const vks_model_config *c = &p->cfg;
    int n = rows->n, dim = c->dim, qdim = c->n_heads * c->head_dim, kv = c->kv_dim;
    zero(g->datt, (size_t)n * qdim);
    zero(g->dq, (size_t)n * qdim);
    zero(g->dk, (size_t)n * kv);
    zero(g->dv, (size_t)n * kv);
    zero(g->dxn, (size_t)n * dim);
    int rc = vks_ref_matmul_backward(s->att, w->wo, n, dim, qdim, g->dx, g->datt, gw->wo);
    if (rc == VKS_OK)
        rc = vks_ref_attention_backward(s->q, s->k, s->v, rows->start, n, c->n_heads, c->n_kv_heads, c->head_dim,
                                        s->att_max, s->att_sum, g->datt, g->dq, g->dk, g->dv);
    if (rc == VKS_OK)
        rc = vks_ref_rope_backward(g->dq, rows->pos, n, qdim, 0, c->n_heads, c->head_dim, rows->freqs, c->rope_mode);
    if (rc == VKS_OK)
        rc = vks_ref_rope_backward(g->dk, rows->pos, n, kv, 0, c->n_kv_heads, c->head_dim, rows->freqs, c->rope_mode);
    if (rc == VKS_OK && c->qk_norm) rc = qk_norm_backward(p, w, s, n, gw, g);
    if (rc == VKS_OK) rc = qkv_backward(p, w, s, n, gw, g);
    if (rc == VKS_OK)
        rc = vks_ref_rmsnorm_backward(s->x_in, w->attn_norm, n, dim, c->norm_eps, g->dxn, g->dx, gw->attn_norm);
    return rc;
}

/* dlogp (and dentropy, when not NULL) of rows with a target (others 0) ->
 * dlogits -> classifier, final norm. */
static int head_backward(const vks_ref_params *p, const batch_rows *rows, const vks_ref_acts *a,
                         const double *dlogp, const double *dentropy, vks_ref_params *grads, grad_scratch *g,
                         double *dlogp_rows) {
    const vks_model_config *c = &p->cfg;
    int n = rows->n;
    for (int r = 0; r < n; r++) dlogp_rows[r] = rows->has_target[r] ? dlogp[r] : 0.0;
    int rc = vks_ref_token_logprob_backward(a->logits, n, c->vocab_size, rows->target, dlogp_rows, g->dlogits);
    if (rc == VKS_OK && dentropy) {
        for (int r = 0; r < n; r++) dlogp_rows[r] = rows->has_target[r] ? dentropy[r] : 0.0;
        rc = vks_ref_token_entropy_backward(a->logits, n, c->vocab_size, dlogp_rows, g->dlogits);
    }
    if (rc == VKS_OK)
        rc = vks_ref_matmul_backward(a->xnf, p->classifier, n, c->vocab_size, c->dim, g->dlogits, g->dxn,
                                     grads->classifier); /* tied: grads->classifier is grads->tok_emb */
    if (rc == VKS_OK)
        rc = vks_ref_rmsnorm_backward(a->x_final, p->final_norm, n, c->dim, c->norm_eps, g->dxn, g->dx,
                                      grads->final_norm);
    return rc;
}

static bool same_shape(const vks_ref_params *a, const vks_ref_params *b) {
    return a->has_bias == b->has_bias && a->n_values == b->n_values && a->n_tensors == b->n_tensors &&
           memcmp(&a->cfg, &b->cfg, sizeof a->cfg) == 0;
}

int vks_ref_train_backward(const vks_ref_params *p, const vks_ref_batch *b, const vks_ref_acts *acts,
                           const double *dlogp, vks_ref_params *grads) {
    return vks_ref_train_backward_entropy(p, b, acts, dlogp, NULL, grads);
}

int vks_ref_train_backward_entropy(const vks_ref_params *p, const vks_ref_batch *b, const vks_ref_acts *acts,
                                   const double *dlogp, const double *dentropy, vks_ref_params *grads) {
    if (!p || !acts || !dlogp || !grads) return vks_set_error(VKS_ERR_ARG, "vks_ref_train_backward: NULL argument");
    if (!same_shape(p, grads))
        return vks_set_error(VKS_ERR_ARG, "vks_ref_train_backward: gradients shaped unlike the parameters");
    batch_rows rows;
    int rc = batch_rows_make(&p->cfg, b, &rows);
    if (rc != VKS_OK) return rc;
    if (rows.n != acts->n) {
        batch_rows_free(&rows);
        return vks_set_error(VKS_ERR_ARG, "vks_ref_train_backward: the activations hold %d rows, the batch %d",
                             acts->n, rows.n);
    }
    grad_scratch g;
    double *dlogp_rows = malloc((size_t)rows.n * sizeof *dlogp_rows);
    rc = dlogp_rows ? scratch_create(&p->cfg, (size_t)rows.n, &g)
                    : vks_set_error(VKS_ERR_NOMEM, "vks_ref_train_backward: out of memory");
    if (rc != VKS_OK) {
        free(dlogp_rows);
        batch_rows_free(&rows);
        return rc;
    }
    rc = head_backward(p, &rows, acts, dlogp, dentropy, grads, &g, dlogp_rows);
    for (int l = p->cfg.n_layers - 1; rc == VKS_OK && l >= 0; l--) {
        rc = ffn_backward(p, &p->layers[l], &acts->layers[l], rows.n, &grads->layers[l], &g);
        if (rc == VKS_OK) rc = attention_backward(p, &p->layers[l], &acts->layers[l], &rows, &grads->layers[l], &g);
    }
    if (rc == VKS_OK)
        rc = vks_ref_embed_backward(grads->tok_emb, p->cfg.vocab_size, p->cfg.dim, rows.tokens, rows.n, g.dx);
    free(g.block);
    free(dlogp_rows);
    batch_rows_free(&rows);
    return rc;
}

/* ---- the supervised loss ---- */

int vks_ref_train_loss(const vks_ref_params *p, const vks_ref_batch *b, const double *weight, double normaliser,
                       double *loss, vks_ref_params *grads) {
    if (!p || !b || !loss) return vks_set_error(VKS_ERR_ARG, "vks_ref_train_loss: NULL argument");
    if (!(normaliser > 0.0) || !isfinite(normaliser))
        return vks_set_error(VKS_ERR_ARG, "vks_ref_train_loss: normaliser %g is not a positive number", normaliser);
    if (b->n_tokens <= 0) return vks_set_error(VKS_ERR_ARG, "vks_ref_train_loss: empty batch");
    size_t n = (size_t)b->n_tokens;
    double *logp = malloc(n * sizeof *logp), *dlogp = malloc(n * sizeof *dlogp);
    vks_ref_acts *acts = NULL;
    int rc = logp && dlogp ? vks_ref_train_forward(p, b, logp, NULL, grads ? &acts : NULL)
                           : vks_set_error(VKS_ERR_NOMEM, "vks_ref_train_loss: out of memory");
    if (rc == VKS_OK) {
        double sum = 0.0;
        for (size_t r = 0; r < n; r++) {
            double w = weight ? weight[r] : 1.0;
            sum += w * logp[r]; /* logp is 0 on rows without a target */
            dlogp[r] = -w / normaliser;
        }
        *loss = -sum / normaliser;
    }
    if (rc == VKS_OK && grads) rc = vks_ref_train_backward(p, b, acts, dlogp, grads);
    vks_ref_acts_free(acts);
    free(logp);
    free(dlogp);
    return rc;
}
