/* sft.c: supervised fine-tuning runs and their evaluation (vks_sft.h): data
 * -> micro-batches -> the GPU trainer -> AdamW steps, with metrics, a loss
 * plot and atomic checkpoints that a resume continues bit for bit. */
#include <math.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_sft.h"
#include "vkswarm/vks_sft_data.h"
#include "vkswarm/vks_tokenizer.h"
#include "vkswarm/vks_train.h"
#include "rl_internal.h"

/* One micro-batch copied out of the batcher (whose buffer the next call reuses). */
typedef struct {
    int32_t *tokens;
    int *seq_lens;
    float *weight;   /* loss_mask / the step's loss tokens */
    uint8_t *mask;
    int n_tokens, n_seqs, n_loss;
} micro;

static void micro_free(micro *m) {
    free(m->tokens);
    free(m->seq_lens);
    free(m->weight);
    free(m->mask);
}

static int micro_copy(const vks_sft_batch *b, micro *m) {
    memset(m, 0, sizeof *m);
    m->n_tokens = b->n_tokens;
    m->n_seqs = b->n_seqs;
    m->n_loss = b->n_loss_tokens;
    m->tokens = malloc(sizeof *m->tokens * (size_t)b->n_tokens);
    m->seq_lens = malloc(sizeof *m->seq_lens * (size_t)b->n_seqs);
    m->weight = malloc(sizeof *m->weight * (size_t)b->n_tokens);
    m->mask = malloc((size_t)b->n_tokens);
    if (!m->tokens || !m->seq_lens || !m->weight || !m->mask) return vks_set_error(VKS_ERR_NOMEM, "sft: out of host memory");
    memcpy(m->tokens, b->tokens, sizeof *m->tokens * (size_t)b->n_tokens);
    memcpy(m->seq_lens, b->seq_lens, sizeof *m->seq_lens * (size_t)b->n_seqs);
    memcpy(m->mask, b->loss_mask, (size_t)b->n_tokens);
    return VKS_OK;
}

static vks_train_batch train_batch(const micro *m) {
    return (vks_train_batch){.tokens = m->tokens, .n_tokens = m->n_tokens, .seq_lens = m->seq_lens,
                             .n_seqs = m->n_seqs, .weight = m->weight};
}

/* ---- the run's state ---- */

typedef struct {
    const vks_sft_run_options *o;
    vks_model *own_model;     /* loaded from a checkpoint on resume */
    const vks_model *model;
    vks_sft_data *data;
    vks_sft_batcher *batcher;
    vks_trainer *trainer;
    vks_param_layout *layout;
    vks_metrics *metrics;
    uint8_t data_hash[32];
    int64_t tokens_seen;
    micro *micros;
    int n_micros, cap_micros;
    vks_rl_out_dir out;       /* out_dir, locked */
    vks_lora_adapter *adapter; /* LoRA: the start, then what each checkpoint saves; NULL: full fine-tuning */
    vks_lora_config lora;      /* LoRA: the options' config (rank 0: full fine-tuning) */
} sft_run;

static void run_free(sft_run *s) {
    for (int i = 0; i < s->cap_micros; i++) micro_free(&s->micros[i]);
    free(s->micros);
    vks_metrics_close(s->metrics);
    vks_param_layout_free(s->layout);
    vks_trainer_destroy(s->trainer);
    vks_sft_batcher_free(s->batcher);
    vks_sft_data_free(s->data);
    vks_model_free(s->own_model);
    vks_lora_adapter_free(s->adapter);
    vks_rl_out_unlock(&s->out);
}

/* LoRA: what state.json's extra records of the adapter (resume compares it). */
static void lora_extra(const sft_run *s, char *buf, size_t cap) {
    if (!s->adapter) {
        buf[0] = 0;
        return;
    }
    char hash[65] = "";
    const uint8_t *h = vks_lora_adapter_base_hash(s->adapter);
    if (h) vks_hash_hex(h, hash);
    snprintf(buf, cap, ", \"lora_rank\": %d, \"lora_alpha\": %.17g, \"lora_targets\": %u, \"base_model_hash\": \"%s\"",
             s->lora.rank, s->lora.alpha, s->lora.targets, hash);
}

static int save_checkpoint(sft_run *s, int64_t step, const vks_adamw_params *h, char *dir, size_t cap) {
    const vks_sft_run_options *o = s->o;
    char extra[512], lora[256];
    lora_extra(s, lora, sizeof lora);
    snprintf(extra, sizeof extra, "{\"sft_batch\": %d, \"sft_micro_batch\": %d%s}", o->batch, o->micro_batch, lora);
    vks_ckpt_state st = {.step = step, .tokens_seen = s->tokens_seen, .seed = o->seed, .adam = *h,
                         .schedule = o->schedule, .grad_clip = o->grad_clip, .extra_json = extra};
    vks_sft_batcher_position(s->batcher, &st.data);
    vks_hash_hex(s->data_hash, st.data_hash);
    if (s->adapter) return vks_rl_save_lora(s->trainer, s->adapter, &st, o->out_dir, o->keep, dir, cap);
    return vks_rl_save_trainer(s->trainer, s->layout, s->model, o->tok, &st, o->out_dir, o->keep, dir, cap);
}

/* Resuming: one setting against what the checkpoint recorded (see vks_sft_run_options.override). */
static int same_setting(const vks_sft_run_options *o, const char *dir, const char *key, double was, double now,
                        vks_sft_result *r) {
    if (was == now) return VKS_OK;
    if (!o->override)
        return vks_set_error(VKS_ERR_ARG, "sft: resume: %s was %.15g in %s, now %.15g (--override to allow)", key, was,
                             dir, now);
    size_t at = strlen(r->overridden);
    if (at < sizeof r->overridden)
        snprintf(r->overridden + at, sizeof r->overridden - at, "%s%s %.15g -> %.15g", at ? ", " : "", key, was, now);
    return VKS_OK;
}

static int check_settings(const vks_sft_run_options *o, const vks_checkpoint *ck, const char *dir, vks_sft_result *r) {
    const vks_ckpt_state *st = &ck->state;
    json_t *x = st->extra_json ? json_loads(st->extra_json, JSON_REJECT_DUPLICATES, NULL) : NULL;
    json_t *b = json_object_get(x, "sft_batch"), *mb = json_object_get(x, "sft_micro_batch");
    r->overridden[0] = 0;
    int rc = same_setting(o, dir, "seed", (double)st->seed, (double)o->seed, r);
    if (!rc) rc = same_setting(o, dir, "lr", st->schedule.lr, o->schedule.lr, r);
    if (!rc) rc = same_setting(o, dir, "warmup", st->schedule.warmup_steps, o->schedule.warmup_steps, r);
    if (!rc) rc = same_setting(o, dir, "cosine", st->schedule.cosine, o->schedule.cosine, r);
    if (!rc) rc = same_setting(o, dir, "min_lr", st->schedule.min_lr, o->schedule.min_lr, r);
    if (!rc) rc = same_setting(o, dir, "weight_decay", st->adam.weight_decay, o->adamw.weight_decay, r);
    if (!rc) rc = same_setting(o, dir, "grad_clip", st->grad_clip, o->grad_clip, r);
    if (!rc && json_is_integer(b)) rc = same_setting(o, dir, "batch", (double)json_integer_value(b), o->batch, r);
    if (!rc && json_is_integer(mb))
        rc = same_setting(o, dir, "micro_batch", (double)json_integer_value(mb), o->micro_batch, r);
    json_decref(x);
    return rc;
}

/* A LoRA resume continues the same adapter: rank, alpha and targets as
 * recorded (the base was checked by vks_checkpoint_load_lora). */
static int check_lora_settings(const sft_run *s, const vks_checkpoint *ck, const char *dir) {
    const vks_lora_config *had = vks_lora_adapter_config(ck->lora), *now = &s->lora;
    bool had_norm = vks_lora_adapter_norm(ck->lora) != NULL;
    if (had_norm != s->o->lora_save_norm)
        return vks_set_error(VKS_ERR_ARG, "sft: resume: %s holds a LoRA adapter %s the final norm (modules_to_save); this "
                             "run asks %s", dir, had_norm ? "with" : "without", had_norm ? "none" : "for it");
    if (had->rank == now->rank && had->alpha == now->alpha && had->targets == now->targets) return VKS_OK;
    return vks_set_error(VKS_ERR_ARG, "sft: resume: %s holds a LoRA adapter of rank %d, alpha %g, targets 0x%x; this run "
                         "asks rank %d, alpha %g, targets 0x%x", dir, had->rank, had->alpha, had->targets, now->rank,
                         now->alpha, now->targets);
}

/* A fresh LoRA run's adapter: PEFT's initialisation from the seed, the base recorded. */
static int fresh_adapter(sft_run *s) {
    int rc = vks_lora_adapter_create(&s->o->model->cfg, &s->lora, &s->adapter);
    if (!rc) rc = vks_lora_adapter_init(s->adapter, s->o->seed);
    if (!rc) rc = vks_lora_adapter_set_base(s->adapter, s->o->model);
    return rc;
}

/* A checkpoint found on resume: the model's (its weights become the model)
 * or, for LoRA, the adapter's over the same base. */
static int open_checkpoint(sft_run *s, const char *dir, vks_checkpoint **ck, vks_sft_result *r) {
    const vks_sft_run_options *o = s->o;
    int rc = s->lora.rank ? vks_checkpoint_load_lora(dir, o->model, ck) : vks_checkpoint_load(dir, ck);
    if (rc) return rc;
    if ((rc = vks_rl_ckpt_check_kind(*ck, dir, false)) ||
        (rc = vks_rl_ckpt_check_betas(*ck, dir, "sft", o->adamw.beta1, o->adamw.beta2)) ||
        (rc = check_settings(o, *ck, dir, r)))
        return rc;
    if (s->lora.rank) {
        if ((rc = check_lora_settings(s, *ck, dir))) return rc;
        s->adapter = (*ck)->lora; /* the start: its values, its recorded base */
        (*ck)->lora = NULL;
        return VKS_OK;
    }
    if ((rc = vks_model_load(dir, &s->own_model)) || (rc = vks_rl_ckpt_check_shape(s->own_model, o->model, dir, "sft")))
        return rc;
    s->model = s->own_model;
    return VKS_OK;
}

/* On resume: the newest checkpoint's weights become the model (LoRA: its
 * adapter the start); its moments, step and data position are applied once
 * the trainer exists. */
static int open_start(sft_run *s, vks_checkpoint **ck, vks_sft_result *r) {
    const vks_sft_run_options *o = s->o;
    int64_t *resumed_from = &r->resumed_from;
    s->model = o->model;
    *resumed_from = -1;
    static const char *const outputs[] = {"metrics.jsonl", "loss.svg", NULL};
    int rc = vks_rl_out_lock(&s->out, o->out_dir);
    if (rc) return vks_error_prefix(rc, "sft");
    char dir[4096];
    bool found = false;
    if (o->resume && (rc = vks_checkpoint_latest(o->out_dir, dir, sizeof dir, &found))) return rc;
    if (!found) { /* a fresh run */
        if ((rc = vks_rl_out_check_fresh(o->out_dir, outputs, o->resume))) return vks_error_prefix(rc, "sft");
        if (o->resume && o->on_resume) o->on_resume(o->progress_ctx, NULL, -1);
        return s->lora.rank ? fresh_adapter(s) : VKS_OK;
    }
    if ((rc = open_checkpoint(s, dir, ck, r))) return rc;
    *resumed_from = (*ck)->state.step;
    if (o->on_resume) o->on_resume(o->progress_ctx, dir, *resumed_from);
    return VKS_OK;
}

static int apply_checkpoint(sft_run *s, const vks_checkpoint *ck) {
    char want[65];
    vks_hash_hex(s->data_hash, want);
    if (ck->state.data_hash[0] && strcmp(ck->state.data_hash, want))
        return vks_set_error(VKS_ERR_ARG, "sft: %s is not the data the checkpoint was trained on (its hash differs)",
                             s->o->data_path);
    if (!ck->adam_m || !ck->adam_v) return vks_set_error(VKS_ERR_FORMAT, "sft: the checkpoint has no optimizer state");
    int rc;
    if (s->adapter) {
        size_t n = (size_t)vks_lora_param_count(&s->model->cfg, s->lora.rank, s->lora.targets);
        if (vks_lora_adapter_norm(s->adapter)) n += (size_t)s->model->cfg.dim; /* modules_to_save ["norm"] */
        rc = vks_rl_move_lora_set(s->trainer, VKS_SET_ADAM_M, ck->adam_m, n, false);
        if (!rc) rc = vks_rl_move_lora_set(s->trainer, VKS_SET_ADAM_V, ck->adam_v, n, false);
    } else {
        rc = vks_rl_move_set(s->trainer, s->layout, VKS_SET_ADAM_M, ck->adam_m, false);
        if (!rc) rc = vks_rl_move_set(s->trainer, s->layout, VKS_SET_ADAM_V, ck->adam_v, false);
    }
    if (!rc) rc = vks_sft_batcher_seek(s->batcher, &ck->state.data);
    vks_trainer_set_steps(s->trainer, (int)ck->state.step);
    s->tokens_seen = ck->state.tokens_seen;
    return rc;
}

/* The data, read before OUT is made or locked: a bad file is refused first.
 * A resumed model has the starting model's shape (open_start checks it). */
static int open_data(sft_run *s) {
    const vks_sft_run_options *o = s->o;
    const vks_model_config *c = &o->model->cfg;
    vks_sft_options data_opt = {.seq_len = c->seq_len, .vocab_size = c->vocab_size, .strict = true};
    int rc = vks_sft_data_load(o->data_path, o->tok, &data_opt, &s->data);
    return rc ? rc : vks_sft_data_hash(s->data, s->data_hash);
}

static int open_run(sft_run *s, const vks_checkpoint *ck, vks_gpu *g) {
    const vks_sft_run_options *o = s->o;
    const vks_model_config *c = &s->model->cfg;
    int rc = VKS_OK;
    vks_sft_stats st;
    if (!rc) vks_sft_data_stats(s->data, &st);
    int max_tokens = rc ? 0 : st.max_len * o->micro_batch;
    if (!rc) {
        vks_sft_batcher_options bo = {.max_tokens = max_tokens, .max_seqs = o->micro_batch, .seed = o->seed,
                                      .shuffle = true};
        rc = vks_sft_batcher_create(s->data, &bo, &s->batcher);
    }
    vks_trainer_options to = {.max_tokens = max_tokens, .recompute = o->recompute, .lora = s->adapter,
                              .lora_save_norm = s->adapter && o->lora_save_norm};
    if (!rc) rc = vks_trainer_create(g, s->model, &to, &s->trainer);
    if (!rc && !s->adapter) rc = vks_param_layout_create(c, vks_model_has_bias(s->model), &s->layout);
    if (!rc && ck) rc = apply_checkpoint(s, ck);
    if (!rc) rc = vks_metrics_open(o->out_dir, ck ? ck->state.step : -1, &s->metrics);
    return rc;
}

/* ---- one step ---- */

/* Collects micro-batches until the step holds o->batch sequences; each row's
 * weight is its loss mask over the step's loss tokens (a per-token mean). */
static int collect_step(sft_run *s) {
    int seqs = 0, loss_tokens = 0, rc = VKS_OK;
    s->n_micros = 0;
    while (!rc && seqs < s->o->batch) {
        if (s->n_micros == s->cap_micros) {
            int cap = s->cap_micros ? 2 * s->cap_micros : 8;
            micro *m = realloc(s->micros, sizeof *m * (size_t)cap);
            if (!m) return vks_set_error(VKS_ERR_NOMEM, "sft: out of host memory");
            memset(m + s->cap_micros, 0, sizeof *m * (size_t)(cap - s->cap_micros));
            s->micros = m;
            s->cap_micros = cap;
        }
        const vks_sft_batch *b;
        micro *m = &s->micros[s->n_micros];
        micro_free(m);
        if ((rc = vks_sft_batcher_next(s->batcher, &b)) || (rc = micro_copy(b, m))) break;
        s->n_micros++;
        seqs += b->n_seqs;
        loss_tokens += b->n_loss_tokens;
    }
    for (int i = 0; !rc && i < s->n_micros; i++)
        for (int r = 0; r < s->micros[i].n_tokens; r++)
            s->micros[i].weight[r] = loss_tokens ? (float)s->micros[i].mask[r] / (float)loss_tokens : 0.0f;
    s->tokens_seen += loss_tokens;
    return rc;
}

static int train_step(sft_run *s, vks_adamw_params *h, double *loss, double *grad_norm) {
    int rc = collect_step(s);
    *loss = 0;
    for (int i = 0; !rc && i < s->n_micros; i++) {
        vks_train_batch b = train_batch(&s->micros[i]);
        double l;
        rc = vks_trainer_accumulate(s->trainer, &b, &l, NULL);
        *loss += l;
    }
    h->lr = vks_ref_lr_at(&s->o->schedule, vks_trainer_steps(s->trainer) + 1);
    return rc ? rc : vks_trainer_step(s->trainer, h, s->o->grad_clip, grad_norm);
}

static int check_options(const vks_sft_run_options *o) {
    if (!o || !o->model || !o->tok || !o->data_path || !o->out_dir || o->steps < 1 || o->batch < 1 ||
        o->micro_batch < 1 || o->micro_batch > o->batch || o->save_every < 0 || o->keep < 0 || o->lora_rank < 0)
        return vks_set_error(VKS_ERR_ARG, "sft: bad options (steps, batch and micro-batch >= 1, micro-batch <= batch)");
    if (!o->lora_rank)
        return o->lora_save_norm ? vks_set_error(VKS_ERR_ARG, "sft: lora_save_norm goes with a LoRA rank") : VKS_OK;
    double alpha = o->lora_alpha ? o->lora_alpha : VKS_LORA_DEFAULT_ALPHA;
    if (!(alpha > 0) || !isfinite(alpha)) return vks_set_error(VKS_ERR_ARG, "sft: LoRA alpha %g (finite, > 0)", alpha);
    return vks_lora_check(&o->model->cfg, o->lora_rank, o->lora_targets ? o->lora_targets : VKS_LORA_ALL_TARGETS,
                          "sft");
}

static vks_lora_config lora_config(const vks_sft_run_options *o) {
    if (!o->lora_rank) return (vks_lora_config){0};
    return (vks_lora_config){.rank = o->lora_rank, .alpha = o->lora_alpha ? o->lora_alpha : VKS_LORA_DEFAULT_ALPHA,
                             .targets = o->lora_targets ? o->lora_targets : VKS_LORA_ALL_TARGETS};
}

static int finish(sft_run *s, const vks_adamw_params *h, vks_sft_result *r) {
    r->plan_bytes = vks_trainer_plan_bytes(s->trainer);
    int rc = save_checkpoint(s, vks_trainer_steps(s->trainer), h, r->final_checkpoint, sizeof r->final_checkpoint);
    snprintf(r->metrics_path, sizeof r->metrics_path, "%s", vks_metrics_path(s->metrics));
    rc = vks_rl_close_metrics(s->metrics, rc); /* also after a failed save: nothing leaks */
    s->metrics = NULL;
    snprintf(r->plot_path, sizeof r->plot_path, "%s/loss.svg", s->o->out_dir);
    const char *keys[] = {"loss"};
    if (!rc) rc = vks_metrics_plot(r->metrics_path, keys, 1, "training loss", r->plot_path);
    return rc;
}

void vks_sft_loss_window_add(vks_sft_loss_window *w, double loss) {
    if (w->n < VKS_SFT_LOSS_WINDOW_MAX) w->first[w->n] = loss;
    w->last[w->n % VKS_SFT_LOSS_WINDOW_MAX] = loss;
    w->n++;
}

void vks_sft_loss_window_means(const vks_sft_loss_window *w, int *window, double *first, double *last) {
    int64_t k = w->n / 10;
    *window = w->n < 1 ? 0 : k < 1 ? 1 : k > VKS_SFT_LOSS_WINDOW_MAX ? VKS_SFT_LOSS_WINDOW_MAX : (int)k;
    double a = 0, b = 0;
    for (int i = 0; i < *window; i++) a += w->first[i], b += w->last[(w->n - 1 - i) % VKS_SFT_LOSS_WINDOW_MAX];
    *first = *window ? a / *window : NAN;
    *last = *window ? b / *window : NAN;
}

int vks_sft_train(vks_gpu *g, const vks_sft_run_options *o, vks_sft_result *r) {
    int rc = check_options(o);
    if (rc || !g || !r) return rc ? rc : vks_set_error(VKS_ERR_ARG, "sft: NULL argument");
    memset(r, 0, sizeof *r);
    sft_run s = {.o = o, .out = {.fd = -1}, .lora = lora_config(o)};
    vks_checkpoint *ck = NULL;
    r->stopped_at_step = -1;
    rc = open_data(&s);
    if (!rc) rc = open_start(&s, &ck, r);
    if (!rc) rc = open_run(&s, ck, g);
    vks_adamw_params h = o->adamw;
    double t0 = vks_seconds_now();
    int64_t tokens0 = s.tokens_seen;
    vks_sft_loss_window losses = {0};
    while (!rc && vks_trainer_steps(s.trainer) < o->steps) {
        double loss, norm;
        if ((rc = train_step(&s, &h, &loss, &norm))) break;
        int64_t step = vks_trainer_steps(s.trainer);
        double el = vks_seconds_now() - t0, tps = (double)(s.tokens_seen - tokens0) / (el > 0 ? el : 1e-9);
        vks_sft_loss_window_add(&losses, loss);
        vks_metric m[] = {{"loss", loss}, {"lr", h.lr}, {"grad_norm", norm}, {"tokens_per_s", tps}};
        rc = vks_metrics_log(s.metrics, step, m, 4);
        if (o->progress) o->progress(o->progress_ctx, &(vks_sft_progress){step, o->steps, loss, h.lr, norm, tps, el});
        if (!rc && step < o->steps && o->stop_requested && o->stop_requested(o->stop_ctx)) {
            r->stopped_at_step = step; /* finish saves its checkpoint */
            break;
        }
        char dir[4096];
        if (!rc && o->save_every && step % o->save_every == 0 && step < o->steps)
            rc = save_checkpoint(&s, step, &h, dir, sizeof dir);
    }
    vks_sft_loss_window_means(&losses, &r->loss_window, &r->first_loss, &r->last_loss);
    r->loss_steps = losses.n;
    if (!rc) rc = finish(&s, &h, r);
    vks_checkpoint_free(ck);
    run_free(&s);
    return rc;
}

/* ---- evaluation ---- */

int vks_sft_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *data_path,
                 vks_sft_eval_result *r) {
    if (!g || !m || !tok || !data_path || !r) return vks_set_error(VKS_ERR_ARG, "sft eval: NULL argument");
    memset(r, 0, sizeof *r);
    vks_sft_options data_opt = {.seq_len = m->cfg.seq_len, .vocab_size = m->cfg.vocab_size, .strict = true};
    vks_sft_data *d = NULL;
    vks_trainer *t = NULL;
    int rc = vks_sft_data_load(data_path, tok, &data_opt, &d);
    vks_sft_stats st;
    if (!rc) vks_sft_data_stats(d, &st);
    vks_trainer_options to = {.max_tokens = rc ? 1 : st.max_len};
    if (!rc) rc = vks_trainer_create(g, m, &to, &t);
    float *logp = rc ? NULL : malloc(sizeof *logp * (size_t)st.max_len);
    uint8_t *top1 = rc ? NULL : malloc((size_t)st.max_len);
    if (!rc && (!logp || !top1)) rc = vks_set_error(VKS_ERR_NOMEM, "sft eval: out of host memory");
    double sum = 0;
    int64_t correct = 0;
    for (int64_t i = 0; !rc && i < vks_sft_data_count(d); i++) {
        const int32_t *tokens;
        const uint8_t *mask;
        int len;
        int64_t line;
        if ((rc = vks_sft_data_sequence(d, i, &tokens, &mask, &len, &line))) break;
        vks_train_batch b = {.tokens = tokens, .n_tokens = len};
        if ((rc = vks_trainer_score(t, &b, logp, top1))) break;
        for (int k = 0; k + 1 < len; k++) /* row k predicts token k + 1 */
            if (mask[k + 1]) sum -= logp[k], correct += top1[k], r->loss_tokens++;
        r->sequences++;
    }
    if (!rc && r->loss_tokens) {
        r->mean_loss = sum / (double)r->loss_tokens;
        r->token_accuracy = (double)correct / (double)r->loss_tokens;
    }
    free(logp);
    free(top1);
    vks_trainer_destroy(t);
    vks_sft_data_free(d);
    return rc;
}
