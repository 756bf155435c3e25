/* train.c: the trainer (vks_train.h): creation with its activation store,
 * micro-batches (rows built on the host, one command buffer for forward and
 * backward; the GRPO loss computed on the device in between), and the
 * optimizer step (clipping and AdamW on the device). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "train_internal.h"
#include "vkswarm/vks_ops_grad.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

/* ---- the activation store ---- */

static int make(vks_trainer *t, vks_buffer **b, uint64_t floats) {
    uint64_t bytes = (floats ? floats : 1) * 4;
    if (bytes > vks_gpu_info(t->gpu)->max_storage_range)
        return vks_set_error(VKS_ERR_ARG, "trainer: an activation of %llu bytes exceeds one storage binding: "
                             "fewer tokens per micro-batch (--micro-batch)", (unsigned long long)bytes);
    return vks_buffer_create(t->gpu, (size_t)bytes, b);
}

/* The RMSNorm backward's scratch: for the layer norms, and with q/k norm for
 * T x n_heads rows of head_dim. */
static uint64_t norm_scratch_floats(const vks_model_config *c, uint64_t T) {
    uint64_t layer = vks_op_rmsnorm_backward_scratch_bytes((uint32_t)T, (uint32_t)c->dim) / 4 + 1;
    uint64_t heads = c->qk_norm ? vks_op_rmsnorm_backward_scratch_bytes((uint32_t)(T * (uint64_t)c->n_heads),
                                                                        (uint32_t)c->head_dim) / 4 + 1 : 0;
    return layer > heads ? layer : heads;
}

/* The buffers of one layer's activation set and their 4-byte elements for T
 * rows: the one list make_layer_acts allocates, free_layer_acts frees and
 * vks_train_plan counts. */
static bool has_lora(const vks_lora_config *lora) { return lora && lora->rank > 0; }

int vks_train_layer_buffers(const vks_model_config *c, const vks_lora_config *lora, uint64_t T, train_layer_acts *a,
                            train_buffer out[TRAIN_LAYER_BUFFERS]) {
    uint64_t d = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv = (uint64_t)c->kv_dim, h = (uint64_t)c->hidden_dim, heads = (uint64_t)c->n_heads;
    const train_buffer all[] = {
        {&a->xn1, T * d, TRAIN_BUF_ACT}, {&a->q, T * qd, TRAIN_BUF_ACT}, {&a->k, T * kv, TRAIN_BUF_ACT},
        {&a->v, T * kv, TRAIN_BUF_ACT}, {&a->att, T * qd, TRAIN_BUF_ACT}, {&a->stat_max, T * heads, TRAIN_BUF_ACT},
        {&a->stat_sum, T * heads, TRAIN_BUF_ACT}, {&a->x_mid, T * d, TRAIN_BUF_ACT}, {&a->xn2, T * d, TRAIN_BUF_ACT},
        {&a->g, T * h, TRAIN_BUF_ACT}, {&a->u, T * h, TRAIN_BUF_ACT}, {&a->h, T * h, TRAIN_BUF_ACT},
        /* q/k norm (Qwen3): q and k before the norm, for its backward */
        {&a->q_pre, T * qd, TRAIN_BUF_ACT}, {&a->k_pre, T * kv, TRAIN_BUF_ACT},
    };
    int n = c->qk_norm ? 14 : 12;
    memcpy(out, all, sizeof *all * (size_t)n);
    for (int t = 0; has_lora(lora) && t < VKS_LORA_TARGET_COUNT; t++) /* LoRA: each adapter's z = scale A x */
        if (lora->targets & (1u << t)) out[n++] = (train_buffer){&a->z[t], T * (uint64_t)lora->rank, TRAIN_BUF_ACT};
    return n;
}

/* The same for the rest of the store: the head (final norm, logits and
 * log-probabilities) and the backward's scratch; n_partials: the gradient
 * norm's partial sums. */
int vks_train_other_buffers(const vks_model_config *c, const vks_lora_config *lora, uint64_t T, uint64_t n_partials,
                            train_acts *a, train_buffer out[TRAIN_OTHER_BUFFERS]) {
    uint64_t d = (uint64_t)c->dim, qd = (uint64_t)c->n_heads * c->head_dim;
    uint64_t kv = (uint64_t)c->kv_dim, h = (uint64_t)c->hidden_dim, V = (uint64_t)c->vocab_size;
    uint64_t hd = (uint64_t)c->head_dim;
    const train_buffer_kind A = TRAIN_BUF_ACT, L = TRAIN_BUF_LOGITS, S = TRAIN_BUF_SCRATCH;
    const train_buffer all[TRAIN_OTHER_BUFFERS - 1] = {
        {&a->tokens, T, S}, {&a->pos, T, S}, {&a->start, T, S}, {&a->target, T, S}, {&a->xf, T * d, A},
        {&a->logits, T * V, L}, {&a->logp, T, L}, {&a->dlogp, T, L}, {&a->dres, T * d, S}, {&a->dxn, T * d, S},
        {&a->dq, T * qd, S}, {&a->dk, T * kv, S}, {&a->dv, T * kv, S}, {&a->datt, T * qd, S}, {&a->dh, T * h, S},
        {&a->dg, T * h, S}, {&a->du, T * h, S},
        {&a->norm_scratch, norm_scratch_floats(c, T), S},
        {&a->attn_scratch, vks_op_attention_train_backward_scratch_bytes((uint32_t)T, (uint32_t)c->n_heads) / 4 + 1, S},
        {&a->embed_index, VKS_EMBED_GRAD_INDEX_WORDS(T), S}, {&a->clip_partials, n_partials, S},
        {&a->clip_out, 2, S}, {&a->one, 1, S}, {&a->grpo_old, T, S}, {&a->grpo_adv, T, S}, {&a->grpo_weight, T, S},
        {&a->grpo_ref, T, S}, {&a->grpo_loss, T, S}, {&a->grpo_flags, T, S}, {&a->grpo_dent, T, S},
        {&a->grpo_entropy, T, S}, {&a->grpo_seq, T, S},
        {&a->rope_table, T * hd, S}, /* (cos, sin) per position and pair: vks_rope_table */
        /* q/k norm (Qwen3): their gradients before the norm */
        {&a->dq_pre, T * qd, S}, {&a->dk_pre, T * kv, S},
    };
    int n = c->qk_norm ? TRAIN_OTHER_BUFFERS - 1 : TRAIN_OTHER_BUFFERS - 3;
    memcpy(out, all, sizeof *all * (size_t)n);
    if (has_lora(lora)) out[n++] = (train_buffer){&a->lora_scratch, T * (uint64_t)lora->rank, S}; /* LoRA backward's g */
    return n;
}

static int make_all(vks_trainer *t, const train_buffer *all, int n) {
    for (int i = 0; i < n; i++) {
        int rc = make(t, all[i].b, all[i].n);
        if (rc) return rc;
    }
    return VKS_OK;
}

static void free_all(const train_buffer *all, int n) {
    for (int i = 0; i < n; i++) vks_buffer_destroy(*all[i].b);
}

static int make_layer_acts(vks_trainer *t, train_layer_acts *a) {
    train_buffer all[TRAIN_LAYER_BUFFERS];
    return make_all(t, all, vks_train_layer_buffers(&t->cfg, &t->lora, (uint64_t)t->acts.T, a, all));
}

static void free_layer_acts(vks_trainer *t, train_layer_acts *a) {
    train_buffer all[TRAIN_LAYER_BUFFERS];
    free_all(all, vks_train_layer_buffers(&t->cfg, &t->lora, (uint64_t)t->acts.T, a, all));
}

/* The trainer's RoPE table (positions < T), made by the one function. */
static int upload_rope_table(vks_trainer *t) {
    size_t n = (size_t)t->acts.T * (size_t)t->cfg.head_dim;
    float *f = malloc((n ? n : 1) * sizeof *f);
    int rc = f && vks_rope_table(&t->cfg, t->acts.T, f) ? vks_buffer_upload(t->acts.rope_table, 0, f, n * sizeof *f)
                                                        : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory for the RoPE table");
    free(f);
    return rc;
}

static int make_scratch(vks_trainer *t) {
    train_acts *a = &t->acts;
    uint64_t grads = 0;
    for (int i = 0; i < t->n_tensors; i++) grads += vks_op_grad_squares_partials(t->ops,
                         (uint64_t)t->tensors[i].info.rows * (uint64_t)t->tensors[i].info.cols);
    a->n_partials = (uint32_t)grads;
    train_buffer all[TRAIN_OTHER_BUFFERS];
    int rc = make_all(t, all, vks_train_other_buffers(&t->cfg, &t->lora, (uint64_t)a->T, grads, a, all));
    if (rc) return rc;
    float one = 1.0f;
    rc = vks_buffer_upload(a->one, 0, &one, sizeof one);
    return rc ? rc : upload_rope_table(t);
}

static int make_acts(vks_trainer *t) {
    train_acts *a = &t->acts;
    int n_layers = t->cfg.n_layers, n_sets = t->opt.recompute ? 1 : n_layers;
    a->x_in = calloc((size_t)n_layers + 1, sizeof *a->x_in);
    a->layer = calloc((size_t)n_sets, sizeof *a->layer);
    if (!a->x_in || !a->layer) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int rc = VKS_OK;
    for (int l = 0; !rc && l <= n_layers; l++) rc = make(t, &a->x_in[l], (uint64_t)a->T * (uint64_t)t->cfg.dim);
    for (int l = 0; !rc && l < n_sets; l++) rc = make_layer_acts(t, &a->layer[l]);
    return rc ? rc : make_scratch(t);
}

static void free_acts(vks_trainer *t) {
    train_acts *a = &t->acts;
    for (int l = 0; a->x_in && l <= t->cfg.n_layers; l++) vks_buffer_destroy(a->x_in[l]);
    for (int l = 0; a->layer && l < (t->opt.recompute ? 1 : t->cfg.n_layers); l++) free_layer_acts(t, &a->layer[l]);
    train_buffer all[TRAIN_OTHER_BUFFERS];
    free_all(all, vks_train_other_buffers(&t->cfg, &t->lora, (uint64_t)a->T, a->n_partials, a, all));
    free(a->x_in);
    free(a->layer);
}

train_layer_acts *vks_train_layer_acts(vks_trainer *t, int l) { return &t->acts.layer[t->opt.recompute ? 0 : l]; }

/* ---- creation ---- */

/* The run's memory plan against the device's free memory; its total in *total. */
static int check_fits(vks_gpu *g, const vks_model *m, const vks_trainer_options *o, uint64_t *total) {
    vks_train_plan_options po = {.tokens = o->max_tokens, .recompute = o->recompute};
    const vks_lora_config *lc = o->lora ? vks_lora_adapter_config(o->lora) : NULL;
    if (lc) po.lora_rank = lc->rank, po.lora_targets = lc->targets, po.keep_file_dtype = true;
    vks_train_plan p;
    int rc = vks_train_plan_make(m, &po, &p);
    if (rc) return rc;
    *total = p.total;
    uint64_t free_bytes = vks_gpu_free_bytes(g);
    if (p.total <= free_bytes) return VKS_OK;
    char plan[256];
    vks_train_plan_describe(&p, plan, sizeof plan);
    return vks_set_error(VKS_ERR_ARG, "trainer: the run needs %.1f MiB of device memory, %.1f MiB are free (%s, "
                         "%d tokens per micro-batch%s); fewer tokens per micro-batch, recompute or LoRA need less",
                         (double)p.total / (1 << 20), (double)free_bytes / (1 << 20), plan, o->max_tokens,
                         lc ? ", LoRA" : "");
}

int vks_trainer_create(vks_gpu *g, const vks_model *m, const vks_trainer_options *o, vks_trainer **out) {
    if (!g || !m || !out) return vks_set_error(VKS_ERR_ARG, "vks_trainer_create: NULL argument");
    *out = NULL;
    int rc = vks_model_check_tensors(m, "trainer");
    if (rc) return rc;
    vks_trainer *t = calloc(1, sizeof *t);
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    t->gpu = g;
    t->cfg = m->cfg;
    if (o) t->opt = *o;
    if (t->opt.max_tokens <= 0) t->opt.max_tokens = m->cfg.seq_len;
    if (vks_lora_adapter_norm(t->opt.lora)) t->opt.lora_save_norm = true; /* an adapter's trained norm trains on */
    t->acts.T = t->opt.max_tokens;
    t->bos_id = m->bos_id;
    t->eos_id = m->eos_id;
    memcpy(t->arch, m->arch, sizeof t->arch);
    if (t->opt.max_tokens > VKS_TRAIN_MAX_TOKENS)
        rc = vks_set_error(VKS_ERR_ARG, "trainer: %d tokens per micro-batch, at most %d", t->opt.max_tokens,
                           VKS_TRAIN_MAX_TOKENS);
    if (!rc) rc = check_fits(g, m, &t->opt, &t->plan_bytes);
    if (!rc) rc = vks_ops_create(g, &t->ops);
    if (!rc) vks_ops_set_f16_math(t->ops, false); /* training matmuls stay f32 */
    if (!rc) rc = vks_train_params_create(t, m, t->opt.lora);
    t->opt.lora = NULL; /* copied: the caller keeps its adapter */
    if (!rc) rc = make_acts(t);
    if (rc) {
        vks_trainer_destroy(t);
        return rc;
    }
    *out = t;
    return VKS_OK;
}

void vks_trainer_destroy(vks_trainer *t) {
    if (!t) return;
    free_acts(t);
    vks_train_params_free(t);
    vks_ops_destroy(t->ops);
    free(t);
}

/* ---- a micro-batch ---- */

static void rows_free(train_rows *r) {
    free(r->tokens);
    free(r->pos);
    free(r->start);
    free(r->target);
    free(r->has_target);
}

/* Positions, sequence starts and targets of a packed batch; bounds-checked. */
static int rows_build(const vks_trainer *t, const vks_train_batch *b, train_rows *r) {
    memset(r, 0, sizeof *r);
    if (!b || !b->tokens || b->n_tokens < 1 || b->n_tokens > t->acts.T || b->n_seqs < 0 || (b->n_seqs && !b->seq_lens))
        return vks_set_error(VKS_ERR_ARG, "trainer: a micro-batch of %d tokens (1..%d)", b ? b->n_tokens : 0, t->acts.T);
    int n = b->n_tokens;
    r->n = n;
    r->tokens = malloc(sizeof *r->tokens * (size_t)n);
    r->pos = malloc(sizeof *r->pos * (size_t)n);
    r->start = malloc(sizeof *r->start * (size_t)n);
    r->target = malloc(sizeof *r->target * (size_t)n);
    r->has_target = malloc(sizeof *r->has_target * (size_t)n);
    if (!r->tokens || !r->pos || !r->start || !r->target || !r->has_target)
        return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int one_len = n, n_seqs = b->n_seqs ? b->n_seqs : 1, row = 0;
    const int *lens = b->n_seqs ? b->seq_lens : &one_len;
    for (int s = 0; s < n_seqs; s++) {
        if (lens[s] < 1 || lens[s] > t->cfg.seq_len || lens[s] > n - row)
            return vks_set_error(VKS_ERR_ARG, "trainer: sequence %d has %d tokens (1..%d, the rest of %d)", s, lens[s],
                                 t->cfg.seq_len, n - row);
        for (int i = 0; i < lens[s]; i++, row++) {
            int32_t tok = b->tokens[row];
            if (tok < 0 || tok >= t->cfg.vocab_size)
                return vks_set_error(VKS_ERR_ARG, "trainer: token %d at row %d is outside the vocabulary (%d)", tok,
                                     row, t->cfg.vocab_size);
            r->tokens[row] = (uint32_t)tok;
            r->pos[row] = (uint32_t)i;
            r->start[row] = (uint32_t)(row - i);  /* never decreases (VKS_TRAIN_ATTENTION's starts_sorted) */
            r->has_target[row] = i + 1 < lens[s];
            r->target[row] = r->has_target[row] ? b->tokens[row + 1] : VKS_TRAIN_NO_TARGET;
        }
    }
    if (row != n) return vks_set_error(VKS_ERR_ARG, "trainer: sequence lengths add up to %d, not %d tokens", row, n);
    return VKS_OK;
}

static int upload_rows(vks_trainer *t, const train_rows *r) {
    size_t bytes = sizeof(uint32_t) * (size_t)r->n;
    int rc = vks_buffer_upload(t->acts.tokens, 0, r->tokens, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.pos, 0, r->pos, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.start, 0, r->start, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.target, 0, r->target, bytes);
    return rc;
}

/* dlogp[r] = -weight[r] on rows with a target (d loss / d logp). */
static int upload_dlogp(vks_trainer *t, const vks_train_batch *b, const train_rows *r) {
    float *d = malloc(sizeof *d * (size_t)r->n);
    if (!d) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int i = 0; i < r->n; i++) d[i] = r->has_target[i] ? -(b->weight ? b->weight[i] : 1.0f) : 0.0f;
    int rc = vks_buffer_upload(t->acts.dlogp, 0, d, sizeof *d * (size_t)r->n);
    free(d);
    return rc;
}

static int upload_embed_index(vks_trainer *t, const train_rows *r, uint32_t *n_unique) {
    uint32_t *index = malloc(sizeof *index * VKS_EMBED_GRAD_INDEX_WORDS(r->n));
    if (!index) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int rc = vks_op_embed_backward_index(r->tokens, (uint32_t)r->n, (uint32_t)t->cfg.vocab_size, index, n_unique);
    if (!rc) rc = vks_buffer_upload(t->acts.embed_index, 0, index, sizeof *index * VKS_EMBED_GRAD_INDEX_WORDS(r->n));
    free(index);
    return rc;
}

/* Downloads logp and, when wanted, the weighted loss. */
static int read_logp(vks_trainer *t, const vks_train_batch *b, const train_rows *r, double *loss, float *logp) {
    float *lp = logp ? logp : malloc(sizeof *lp * (size_t)r->n);
    if (!lp) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int rc = vks_buffer_download(t->acts.logp, 0, lp, sizeof *lp * (size_t)r->n);
    double sum = 0;
    for (int i = 0; !rc && i < r->n; i++) {
        if (!r->has_target[i]) lp[i] = 0.0f;
        else sum -= (double)(b->weight ? b->weight[i] : 1.0f) * lp[i];
    }
    if (!rc && loss) *loss = sum;
    if (lp != logp) free(lp);
    return rc;
}

/* A GRPO micro-batch's per-row inputs (vks_trainer_accumulate_grpo). */
typedef struct {
    const vks_grpo_rows *rows;
    const vks_grpo_loss_params *h;
    vks_grpo_stats *stats;
    const float *seq_x; /* gspo: each row's sequence's mean log-ratio (sequence_log_ratio); else NULL */
} grpo_job;

static bool has_kl(const grpo_job *g) { return g->h->kl_beta != 0.0; }
static bool has_bonus(const grpo_job *g) { return g->h->entropy_coef != 0.0; }

/* The row weights the loss sees: 0 on rows without a target. */
static float row_weight(const vks_train_batch *b, const train_rows *r, int i) {
    return r->has_target[i] ? (b->weight ? b->weight[i] : 1.0f) : 0.0f;
}

/* Uploads weight, logp_old, advantage and (with the KL term) the reference
 * logp; a live row (weight != 0) needs finite values, log-probabilities <= 0
 * (a NaN there would reach every gradient). */
static int upload_grpo(vks_trainer *t, const vks_train_batch *b, const train_rows *r, const grpo_job *g) {
    size_t bytes = sizeof(float) * (size_t)r->n;
    float *w = malloc(bytes), *old = malloc(bytes), *adv = malloc(bytes), *ref = malloc(bytes);
    int rc = w && old && adv && ref ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int i = 0; !rc && i < r->n; i++) {
        w[i] = row_weight(b, r, i);
        bool live = w[i] != 0.0f;
        old[i] = live ? g->rows->logp_old[i] : 0.0f;
        adv[i] = live ? g->rows->advantage[i] : 0.0f;
        ref[i] = live && has_kl(g) ? g->rows->ref_logp[i] : 0.0f;
        if (!isfinite(w[i]) || !isfinite(old[i]) || !isfinite(adv[i]) || !isfinite(ref[i]) || old[i] > 0.0f ||
            ref[i] > 0.0f)
            rc = vks_set_error(VKS_ERR_ARG, "trainer: GRPO row %d has weight %g, logp_old %g, advantage %g, ref_logp "
                               "%g (finite, log-probabilities <= 0)", i, w[i], old[i], adv[i], ref[i]);
    }
    if (!rc) rc = vks_buffer_upload(t->acts.grpo_weight, 0, w, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.grpo_old, 0, old, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.grpo_adv, 0, adv, bytes);
    if (!rc) rc = vks_buffer_upload(t->acts.grpo_ref, 0, ref, bytes);
    if (!rc && g->seq_x) rc = vks_buffer_upload(t->acts.grpo_seq, 0, g->seq_x, bytes);
    if (!rc) { /* d loss / d H_r of the bonus term -c w_r H_r / token_budget (reuses old[]); +0 when off */
        for (int i = 0; i < r->n; i++)
            old[i] = has_bonus(g) ? (float)(-g->h->entropy_coef * w[i] / g->h->token_budget) : 0.0f;
        rc = vks_buffer_upload(t->acts.grpo_dent, 0, old, bytes);
    }
    free(w);
    free(old);
    free(adv);
    free(ref);
    return rc;
}

/* The loss kernel between forward and backward: logp -> dlogp on the device. */
static int record_grpo(vks_trainer *t, vks_cmd *c, uint32_t n, const grpo_job *g) {
    train_acts *a = &t->acts;
    vks_grpo_loss_rows rows = {bind(a->logp),     bind(a->grpo_old),  bind(a->grpo_adv),  bind(a->grpo_weight),
                               bind(a->grpo_ref), bind(a->dlogp),     bind(a->grpo_loss), bind(a->grpo_flags),
                               bind(a->grpo_seq)};
    return vks_op_grpo_loss(t->ops, c, &rows, n, g->h);
}

/* The statistics from logp, the loss terms and the flags, summed in row order. */
static int read_grpo(vks_trainer *t, const vks_train_batch *b, const train_rows *r, const grpo_job *g, float *logp) {
    size_t bytes = sizeof(float) * (size_t)r->n;
    float *lp = logp ? logp : malloc(bytes), *loss = malloc(bytes), *ent = malloc(bytes);
    uint32_t *flags = malloc(bytes);
    int rc = lp && loss && ent && flags ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    if (!rc) rc = vks_buffer_download(t->acts.logp, 0, lp, bytes);
    if (!rc) rc = vks_buffer_download(t->acts.grpo_loss, 0, loss, bytes);
    if (!rc) rc = vks_buffer_download(t->acts.grpo_flags, 0, flags, bytes);
    if (!rc) rc = vks_buffer_download(t->acts.grpo_entropy, 0, ent, bytes);
    vks_grpo_stats st = {0};
    double mismatch = 0.0, mismatch_kl = 0.0, kl = 0.0, entropy = 0.0;
    for (int i = 0; !rc && i < r->n; i++) {
        if (!r->has_target[i]) lp[i] = 0.0f;
        float w = row_weight(b, r, i);
        if (w == 0.0f) continue;
        st.tokens++;
        st.loss += loss[i];
        entropy += ent[i];
        if (has_bonus(g)) st.loss -= g->h->entropy_coef * w * ent[i] / g->h->token_budget;
        st.clipped += (flags[i] & VKS_GRPO_CLIPPED) != 0;
        st.capped += (flags[i] & VKS_GRPO_CAPPED) != 0;
        double x = (double)lp[i] - g->rows->logp_old[i], d = fabs(x);
        mismatch += d;
        mismatch_kl += expm1(x) - x; /* exp(x) - 1 - x without cancelling at small x */
        st.max_mismatch = fmax(st.max_mismatch, d);
        if (has_kl(g)) {
            double x = (double)g->rows->ref_logp[i] - lp[i];
            kl += exp(x) - x - 1.0;
        }
    }
    st.kl = st.tokens ? kl / st.tokens : 0.0;
    st.entropy = st.tokens ? entropy / st.tokens : 0.0;
    st.clip_fraction = st.tokens ? (double)st.clipped / st.tokens : 0.0;
    st.logp_mismatch = st.tokens ? mismatch / st.tokens : 0.0;
    st.mismatch_kl = st.tokens ? mismatch_kl / st.tokens : 0.0;
    if (!rc && g->stats) *g->stats = st;
    if (lp != logp) free(lp);
    free(loss);
    free(ent);
    free(flags);
    return rc;
}

/* One micro-batch: forward, and with backward the loss's dlogp (uploaded for
 * the weighted log-likelihood, computed on the device for GRPO) and the
 * backward, all in one command buffer. */
/* top1[r] = 1 when row r's target is the argmax of its logits (lowest index
 * on ties); the rows' targets are the ones rows_build derived. */
static int read_top1(vks_trainer *t, const train_rows *r, uint8_t *top1) {
    size_t V = (size_t)t->cfg.vocab_size;
    float *logits = malloc(sizeof *logits * V * (size_t)r->n);
    if (!logits) return vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int rc = vks_buffer_download(t->acts.logits, 0, logits, sizeof *logits * V * (size_t)r->n);
    for (int i = 0; !rc && i < r->n; i++) {
        const float *row = logits + V * (size_t)i;
        size_t best = 0;
        for (size_t v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        top1[i] = r->has_target[i] && (int32_t)best == r->target[i];
    }
    free(logits);
    return rc;
}

static int run(vks_trainer *t, const vks_train_batch *b, bool backward, const grpo_job *g, double *loss, float *logp,
               uint8_t *top1) {
    if (!t) return vks_set_error(VKS_ERR_ARG, "trainer: NULL trainer");
    train_rows r;
    uint32_t n_unique = 0;
    int rc = rows_build(t, b, &r);
    if (!rc) rc = upload_rows(t, &r);
    if (!rc && g) rc = upload_grpo(t, b, &r, g);
    if (!rc && backward && !g) rc = upload_dlogp(t, b, &r);
    if (!rc && backward && !vks_train_is_lora(t)) rc = upload_embed_index(t, &r, &n_unique);
    vks_cmd *c = NULL;
    if (!rc) rc = vks_cmd_begin(t->gpu, &c);
    if (!rc) rc = vks_train_record_forward(t, c, (uint32_t)r.n);
    if (!rc && g) rc = record_grpo(t, c, (uint32_t)r.n, g);
    if (!rc && backward) rc = vks_train_record_backward(t, c, (uint32_t)r.n, n_unique, g != NULL);
    if (c) rc = rc ? (vks_cmd_discard(c), rc) : vks_cmd_submit(c);
    if (!rc) rc = g ? read_grpo(t, b, &r, g, logp) : read_logp(t, b, &r, loss, logp);
    if (!rc && top1) rc = read_top1(t, &r, top1);
    rows_free(&r);
    return rc;
}

int vks_trainer_accumulate(vks_trainer *t, const vks_train_batch *b, double *loss, float *logp) {
    return run(t, b, true, NULL, loss, logp, NULL);
}

/* gspo: seq_x[r] = the mean of logp - logp_old over the live rows (a target
 * and weight != 0) of row r's sequence, from the current weights' logp (a
 * forward pass of its own: the loss kernel needs the whole sequence's ratio
 * before any of its rows' gradients). vks_ref_sequence_log_ratio is the
 * reference. */
static int sequence_log_ratio(vks_trainer *t, const vks_train_batch *b, const float *logp_old, float *seq_x) {
    float *lp = malloc(sizeof *lp * (size_t)b->n_tokens);
    int rc = lp ? run(t, b, false, NULL, NULL, lp, NULL) : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    int one_len = b->n_tokens, n_seqs = b->n_seqs ? b->n_seqs : 1;
    const int *lens = b->n_seqs ? b->seq_lens : &one_len;
    for (int s = 0, row = 0; !rc && s < n_seqs; row += lens[s++]) {
        double sum = 0.0;
        int live = 0;
        for (int i = 0; i < lens[s]; i++) {
            int k = row + i;
            if (i + 1 < lens[s] && (!b->weight || b->weight[k] != 0.0f)) sum += (double)lp[k] - logp_old[k], live++;
        }
        for (int i = 0; i < lens[s]; i++) seq_x[row + i] = live ? (float)(sum / live) : 0.0f;
    }
    free(lp);
    return rc;
}

int vks_trainer_accumulate_grpo(vks_trainer *t, const vks_train_batch *b, const vks_grpo_rows *rows,
                                const vks_grpo_loss_params *h, vks_grpo_stats *stats, float *logp) {
    if (!t || !b || !rows || !rows->logp_old || !rows->advantage || !h || (h->kl_beta != 0.0 && !rows->ref_logp))
        return vks_set_error(VKS_ERR_ARG, "vks_trainer_accumulate_grpo: NULL argument (ref_logp is needed with kl_beta)");
    if (!(h->entropy_coef >= 0.0) || !isfinite(h->entropy_coef))
        return vks_set_error(VKS_ERR_ARG, "vks_trainer_accumulate_grpo: entropy_coef %g (finite, >= 0)", h->entropy_coef);
    grpo_job g = {rows, h, stats, NULL};
    float *seq_x = NULL;
    if (h->type == VKS_LOSS_GSPO) { /* the micro-batch's shape is checked by the forward (rows_build) */
        seq_x = b->n_tokens > 0 ? malloc(sizeof *seq_x * (size_t)b->n_tokens) : NULL;
        int rc = seq_x ? sequence_log_ratio(t, b, rows->logp_old, seq_x)
                       : b->n_tokens > 0 ? vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory") : VKS_OK;
        if (rc) {
            free(seq_x);
            return rc;
        }
        g.seq_x = seq_x;
    }
    int rc = run(t, b, true, &g, NULL, logp, NULL);
    free(seq_x);
    return rc;
}

int vks_trainer_logprobs(vks_trainer *t, const vks_train_batch *b, float *logp) {
    if (!logp) return vks_set_error(VKS_ERR_ARG, "vks_trainer_logprobs: NULL logp");
    return run(t, b, false, NULL, NULL, logp, NULL);
}

int vks_trainer_score(vks_trainer *t, const vks_train_batch *b, float *logp, uint8_t *top1) {
    if (!logp || !top1) return vks_set_error(VKS_ERR_ARG, "vks_trainer_score: NULL output");
    return run(t, b, false, NULL, NULL, logp, top1);
}

/* ---- the optimizer step ---- */

int vks_trainer_zero_grads(vks_trainer *t) {
    for (int i = 0; t && i < t->n_tensors; i++) {
        int rc = vks_buffer_fill(t->tensors[i].buf[VKS_SET_GRADS], 0);
        if (rc) return rc;
    }
    return t ? VKS_OK : vks_set_error(VKS_ERR_ARG, "trainer: NULL trainer");
}

static int record_step(vks_trainer *t, vks_cmd *c, const vks_adamw_params *h, double max_grad_norm) {
    vks_binding *grads = malloc(sizeof *grads * (size_t)t->n_tensors);
    uint32_t *counts = malloc(sizeof *counts * (size_t)t->n_tensors);
    int rc = grads && counts ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "trainer: out of host memory");
    for (int i = 0; !rc && i < t->n_tensors; i++) {
        grads[i] = vks_train_binding(t, VKS_SET_GRADS, i);
        counts[i] = (uint32_t)(t->tensors[i].info.rows * t->tensors[i].info.cols);
    }
    if (!rc) rc = vks_op_grad_clip(t->ops, c, grads, counts, t->n_tensors, bind(t->acts.clip_partials),
                                   (float)max_grad_norm, bind(t->acts.clip_out));
    for (int i = 0; !rc && i < t->n_tensors; i++)
        rc = vks_op_adamw(t->ops, c, vks_train_binding(t, VKS_SET_PARAMS, i), grads[i],
                          vks_train_binding(t, VKS_SET_ADAM_M, i), vks_train_binding(t, VKS_SET_ADAM_V, i), counts[i],
                          h, t->steps + 1, bind(t->acts.clip_out));
    free(grads);
    free(counts);
    return rc;
}

int vks_trainer_step(vks_trainer *t, const vks_adamw_params *h, double max_grad_norm, double *grad_norm) {
    if (!t || !h) return vks_set_error(VKS_ERR_ARG, "vks_trainer_step: NULL argument");
    vks_cmd *c;
    int rc = vks_cmd_begin(t->gpu, &c);
    if (rc) return rc;
    rc = record_step(t, c, h, max_grad_norm);
    rc = rc ? (vks_cmd_discard(c), rc) : vks_cmd_submit(c);
    float out[2] = {0, 0};
    if (!rc) rc = vks_buffer_download(t->acts.clip_out, 0, out, sizeof out);
    if (!rc && !isfinite(out[1]))
        rc = vks_set_error(VKS_ERR_ARG, "trainer: the gradient norm is %g at step %d: not applied", out[1], t->steps + 1);
    if (!rc) t->steps++;
    if (!rc && grad_norm) *grad_norm = out[1];
    int zr = vks_trainer_zero_grads(t);
    return rc ? rc : zr;
}

int vks_trainer_steps(const vks_trainer *t) { return t ? t->steps : 0; }
uint64_t vks_trainer_plan_bytes(const vks_trainer *t) { return t ? t->plan_bytes : 0; }
void vks_trainer_set_steps(vks_trainer *t, int steps) {
    if (t && steps >= 0) t->steps = steps;
}
