/* rl_run.c: the RL run's trainer and orchestration (vks_rl.h): starts the
 * inference thread, takes prompts_per_step useful groups per step, trains
 * INTELLECT-2's GRPO loss on them (vks_trainer_accumulate_grpo over packed
 * micro-batches, one AdamW step), hands the new weights to inference, scores
 * held-out accuracy, logs metrics, records what the trainer (and the
 * inference thread) did when for OUT/timeline.svg, and saves checkpoints
 * (every save_every steps and the final one; --resume continues from one). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "rl_internal.h"
#include "vkswarm/vks_difficulty_pool.h"
#include "vkswarm/vks_rl_bans.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_tokenizer.h"

/* The run's fixed optimizer settings (INTELLECT-2 style: no weight decay, clipping at 1). */
#define RL_BETA1 0.9
#define RL_BETA2 0.95
#define RL_GRAD_CLIP 1.0

typedef struct {
    const vks_rl_run_options *o;
    const vks_rl_config *c;
    vks_trainer *trainer;
    vks_param_layout *layout;
    vks_metrics *metrics;
    vks_rl_shared sh;
    vks_rl_gen gen;
    const vks_rl_source *src;    /* NULL: the inference thread */
    pthread_t thread;
    bool thread_started, shared_ready;
    vks_rl_batch_group *groups;  /* the step's P groups */
    /* a micro-batch being packed */
    int32_t *tokens;
    int *seq_lens;
    float *weight, *advantage, *logp_old;
    float *logp;                 /* the trainer's own of each row */
    vks_rl_sample **seq_sample;  /* each packed sequence's sample */
    bool *far;                   /* each packed sequence: logp far from its record */
    bool *seq_checked;           /* each packed sequence: its record checked already (an older version's) */
    vks_rl_versions versions;    /* async level k > 0: the trainer's weights of its last k + 1 versions */
    size_t n_values;             /* floats in the trainer's parameter set */
    int max_tokens;
    int64_t trained, trained_rejected;
    vks_rl_counters reported;    /* the counters at the previous step's report */
    /* a resumed run */
    const vks_model *start;      /* the start policy: o->model, or the resumed checkpoint's weights */
    vks_model *own_model;        /* those weights, loaded */
    vks_checkpoint *ck;          /* the checkpoint resumed from */
    vks_lora_adapter *adapter;   /* LoRA (config lora.rank > 0): the start, then what checkpoints save; else NULL */
    int64_t next_batch;          /* the rollout position it recorded */
    double t_start;              /* the run's start (vks_seconds_now()) */
    vks_rl_timeline timeline;    /* the trainer's intervals */
    vks_rl_timeline gen_timeline; /* the inference thread's (written by it; read after it is joined) */
    vks_rl_out_dir out;          /* config->out, locked */
    vks_task *eval_tasks;        /* the held-out set: gen.held, then config->eval_tasks; NULL: fresh instances */
    int64_t n_eval_tasks;
    int64_t n_eval_own;          /* the last n_eval_own of them (config->eval_tasks') own their tests/programs */
    double start_accuracy;       /* the run's, at step 0 (a resumed run: as its checkpoint recorded) */
    bool start_accuracy_stored;  /* resumed from a checkpoint that recorded it */
    /* a clean stop (o->stop_requested) */
    bool stopped;
    int64_t stop_position;       /* the rollout position the final checkpoint records */
    int64_t published_position;  /* the rollout position when the last weights were handed over */
    vks_rl_counters counted;     /* a resumed run: the counters its checkpoint recorded (the inference thread
                                  * counts on from them); zero otherwise */
    bool counted_stored;
    vks_rl_report_samples samples; /* for OUT/report.html */
    /* for OUT/report.html */
    double elapsed_before;       /* a resumed run: the elapsed seconds its checkpoint recorded */
    vks_rl_resume resumes[VKS_RL_MAX_RESUMES]; /* its stops, oldest first */
    int n_resumes;
    char model_hash[65];         /* o->model's (hex) */
    char task_set[16384];        /* what it trains and evaluates on, in words */
    vks_rl_status status;        /* the line after a silence (o->status) */
} rl_run;

/* Seconds since the run's start, across stops (a resumed run goes on from its checkpoint's). */
static double run_elapsed(const rl_run *r) { return r->elapsed_before + vks_seconds_now() - r->t_start; }

static int check_options(const vks_rl_run_options *o) {
    if (!o || !o->config || !o->model || !o->tok || !o->train_gpu || !o->infer_gpu || o->eval_every < 0 ||
        o->eval_n < 0 || o->cheat_every < 0 || o->timeline_steps < 0)
        return vks_set_error(VKS_ERR_ARG, "rl: bad options");
    const vks_rl_config *c = o->config;
    if ((int64_t)c->prompts_per_step * c->group_size > VKS_RL_MAX_BATCH)
        return vks_set_error(VKS_ERR_ARG, "rl: prompts_per_step x group_size is %lld, at most %d on one machine",
                             (long long)c->prompts_per_step * c->group_size, VKS_RL_MAX_BATCH);
    if (c->group_size > VKS_RL_MAX_GROUP) return vks_set_error(VKS_ERR_ARG, "rl: group_size above %d", VKS_RL_MAX_GROUP);
    return VKS_OK;
}

static int make_dirs(rl_run *r, vks_rl_result *res) {
    int rc = vks_rl_gen_make_dirs(&r->gen, "rollouts");
    snprintf(res->rollouts_dir, sizeof res->rollouts_dir, "%s", r->gen.rollouts_dir);
    return rc;
}

/* ---- resume ---- */

static void get_counters(rl_run *r, vks_rl_counters *c);

/* What a checkpoint records beside the trainer's state (vks_rl_stored): the
 * task, the batch size (task i of batch b is b * P + i), the rollout
 * position, the whole config, the evaluation options and the start accuracy. */
static char *position_json(const rl_run *r, int64_t next_batch) {
    char *text = vks_rl_config_to_json(r->c);
    json_t *config = text ? json_loads(text, JSON_REJECT_DUPLICATES, NULL) : NULL;
    free(text);
    if (!config) return NULL;
    vks_rl_counters n;
    get_counters((rl_run *)r, &n);
    json_t *o = json_pack("{s:s, s:i, s:I, s:o, s:{s:i, s:i, s:I, s:b}, s:o, s:{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:f}}",
                          "rl_task", r->c->task,
                          "rl_prompts_per_step", r->c->prompts_per_step, "rl_next_batch", (json_int_t)next_batch,
                          "rl_config", config, "rl_eval", "eval_every", r->o->eval_every, "eval_n", r->o->eval_n,
                          "eval_seed", (json_int_t)r->o->eval_seed, "verify", (int)r->o->verify, "rl_start_accuracy",
                          isnan(r->start_accuracy) ? json_null() : json_real(r->start_accuracy), "rl_counters",
                          "rollouts", (json_int_t)n.rollouts, "checked", (json_int_t)n.checked, "accepted",
                          (json_int_t)n.accepted, "rejected", (json_int_t)n.rejected, "filtered", (json_int_t)n.filtered,
                          "stale", (json_int_t)n.stale, "off_policy", (json_int_t)n.off_policy, "task_reward_sum",
                          n.task_reward_sum);
    json_t *stops = json_array();
    for (int i = 0; stops && i < r->n_resumes; i++) {
        const vks_rl_resume *x = &r->resumes[i];
        json_array_append_new(stops, json_pack("{s:I, s:f, s:f, s:f}", "step", (json_int_t)x->step, "stopped_unix",
                                               x->stopped_unix, "resumed_unix", x->resumed_unix, "elapsed_s", x->elapsed_s));
    }
    if (o && stops) {
        json_object_set_new(o, "rl_elapsed_s", json_real(run_elapsed(r)));
        json_object_set_new(o, "rl_saved_unix", json_real((double)time(NULL)));
        json_object_set_new(o, "rl_resumes", stops);
    } else json_decref(stops);
    char *s = o && stops ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(o);
    return s;
}

/* A resumed run's clock and stops: the elapsed seconds and stops its
 * checkpoint recorded, this resume added (older checkpoints: from 0, none). */
static void read_resumes(rl_run *r, json_t *o) {
    json_t *el = json_object_get(o, "rl_elapsed_s"), *saved = json_object_get(o, "rl_saved_unix");
    json_t *stops = json_object_get(o, "rl_resumes"), *x;
    size_t i;
    r->elapsed_before = json_is_number(el) && json_number_value(el) >= 0 ? json_number_value(el) : 0;
    json_array_foreach(stops, i, x) {
        json_t *st = json_object_get(x, "step"), *a = json_object_get(x, "stopped_unix"), *b = json_object_get(x, "resumed_unix"),
               *e = json_object_get(x, "elapsed_s");
        if (!json_is_integer(st) || !json_is_number(a) || !json_is_number(b) || !json_is_number(e)) continue;
        if (r->n_resumes == VKS_RL_MAX_RESUMES) /* the newest kept */
            memmove(r->resumes, r->resumes + 1, sizeof *r->resumes * (VKS_RL_MAX_RESUMES - 1)), r->n_resumes--;
        r->resumes[r->n_resumes++] = (vks_rl_resume){(int64_t)json_integer_value(st), json_number_value(a),
                                                     json_number_value(b), json_number_value(e)};
    }
    if (r->n_resumes == VKS_RL_MAX_RESUMES)
        memmove(r->resumes, r->resumes + 1, sizeof *r->resumes * (VKS_RL_MAX_RESUMES - 1)), r->n_resumes--;
    r->resumes[r->n_resumes++] = (vks_rl_resume){r->ck->state.step, json_is_number(saved) ? json_number_value(saved) : NAN,
                                                 (double)time(NULL), r->elapsed_before};
}

static int read_position(rl_run *r, const char *dir) {
    const char *extra = r->ck->state.extra_json;
    json_t *o = extra ? json_loads(extra, JSON_REJECT_DUPLICATES, NULL) : NULL;
    const char *task = json_string_value(json_object_get(o, "rl_task"));
    json_t *p = json_object_get(o, "rl_prompts_per_step"), *b = json_object_get(o, "rl_next_batch");
    int rc = VKS_OK;
    if (!task || !p || !b)
        rc = vks_set_error(VKS_ERR_FORMAT, "rl: %s is not an RL run's checkpoint (no rollout position)", dir);
    else if (!json_is_integer(p) || !json_is_integer(b) || json_integer_value(b) < 0 ||
             json_integer_value(b) > ((json_int_t)1 << 40))
        rc = vks_set_error(VKS_ERR_FORMAT, "rl: %s/state.json: %s is not an integer in [0, 2^40]", dir,
                           json_is_integer(p) ? "rl_next_batch" : "rl_prompts_per_step");
    else if (strcmp(task, r->c->task))
        rc = vks_set_error(VKS_ERR_ARG, "rl: resume: task was \"%s\" in %s, now \"%s\" (the rollout position is in the "
                           "terms of its task and prompts_per_step)", task, dir, r->c->task);
    else if (json_integer_value(p) != r->c->prompts_per_step)
        rc = vks_set_error(VKS_ERR_ARG, "rl: resume: prompts_per_step was %lld in %s, now %d (the rollout position is in "
                           "the terms of its task and prompts_per_step)", (long long)json_integer_value(p), dir,
                           r->c->prompts_per_step);
    else r->next_batch = (int64_t)json_integer_value(b);
    json_t *a = json_object_get(o, "rl_start_accuracy");
    if (!rc && a && (json_is_number(a) || json_is_null(a))) {
        r->start_accuracy = json_is_null(a) ? NAN : json_number_value(a);
        r->start_accuracy_stored = true;
    }
    json_t *n = json_object_get(o, "rl_counters");
    int64_t *f[] = {&r->counted.rollouts, &r->counted.checked, &r->counted.accepted, &r->counted.rejected,
                    &r->counted.filtered, &r->counted.stale, &r->counted.off_policy};
    const char *names[] = {"rollouts", "checked", "accepted", "rejected", "filtered", "stale", "off_policy"};
    bool ok = !rc && !r->src && json_is_object(n) && json_is_number(json_object_get(n, "task_reward_sum"));
    for (int i = 0; ok && i < 7; i++) {
        json_t *v = json_object_get(n, names[i]);
        if (!v && i == 6) continue; /* a checkpoint from before max_off_policy_steps */
        ok = json_is_integer(v) && json_integer_value(v) >= 0;
        if (ok) *f[i] = (int64_t)json_integer_value(v);
    }
    if (ok) r->counted.task_reward_sum = json_number_value(json_object_get(n, "task_reward_sum"));
    else memset(&r->counted, 0, sizeof r->counted);
    r->counted_stored = ok;
    if (!rc) read_resumes(r, o);
    json_decref(o);
    return rc;
}

static int stored_fail(json_t *root, const char *path, const char *what) {
    json_decref(root);
    return vks_set_error(VKS_ERR_FORMAT, "%s: %s", path, what);
}

int vks_rl_stored_read(const char *out_dir, vks_rl_stored *s, bool *found) {
    if (!out_dir || !s || !found) return vks_set_error(VKS_ERR_ARG, "vks_rl_stored_read: NULL argument");
    memset(s, 0, sizeof *s);
    vks_rl_config_defaults(&s->config);
    int rc = vks_checkpoint_latest(out_dir, s->checkpoint, sizeof s->checkpoint, found);
    if (rc || !*found) return rc;
    char path[4200], *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "%s/state.json", s->checkpoint);
    if ((rc = vks_file_read_all(path, 4 << 20, &text, &len))) return rc;
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    free(text);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
    json_t *step = json_object_get(root, "step"), *extra = json_object_get(root, "extra");
    if (!json_is_integer(step)) return stored_fail(root, path, "step is not an integer");
    s->step = (int64_t)json_integer_value(step);
    json_t *config = json_object_get(extra, "rl_config"), *ev = json_object_get(extra, "rl_eval");
    if (!json_object_get(extra, "rl_task") || (!config && !ev)) {
        /* another kind of checkpoint (vks_rl_run refuses it naming the kind), or an older RL one: no config */
        json_decref(root);
        return VKS_OK;
    }
    json_t *every = json_object_get(ev, "eval_every"), *n = json_object_get(ev, "eval_n"),
           *seed = json_object_get(ev, "eval_seed"), *verify = json_object_get(ev, "verify");
    if (!json_is_object(config) || !json_is_integer(every) || !json_is_integer(n) || !json_is_integer(seed) ||
        !json_is_boolean(verify) || json_integer_value(every) < 0 || json_integer_value(every) > (1 << 30) ||
        json_integer_value(n) < 0 || json_integer_value(n) > (1 << 20))
        return stored_fail(root, path, "extra.rl_config or extra.rl_eval is not what vkswarm rl writes");
    s->eval_every = (int)json_integer_value(every), s->eval_n = (int)json_integer_value(n);
    s->eval_seed = (uint64_t)json_integer_value(seed), s->verify = json_is_true(verify);
    char *ctext = json_dumps(config, JSON_COMPACT | JSON_REAL_PRECISION(17));
    char where[4300];
    snprintf(where, sizeof where, "%s: extra.rl_config", path);
    rc = ctext ? vks_rl_config_parse(&s->config, ctext, where) : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    free(ctext);
    s->config.given = 0;
    s->has_config = !rc;
    json_decref(root);
    return rc;
}

static bool lora(const rl_run *r) { return r->c->lora_rank > 0; }

static vks_lora_config lora_config(const rl_run *r) {
    return (vks_lora_config){.rank = r->c->lora_rank, .alpha = r->c->lora_alpha, .targets = r->c->lora_targets};
}

/* A fresh LoRA run's adapter: PEFT's initialisation from the run's seed, the base recorded. */
static int fresh_adapter(rl_run *r) {
    vks_lora_config lc = lora_config(r);
    int rc = vks_lora_adapter_create(&r->o->model->cfg, &lc, &r->adapter);
    if (!rc) rc = vks_lora_adapter_init(r->adapter, r->c->seed);
    return rc ? rc : vks_lora_adapter_set_base(r->adapter, r->o->model);
}

/* LoRA: the trainer's current adapter as a new one (for inference or evaluation). */
static int export_adapter(rl_run *r, vks_lora_adapter **out) {
    int rc = vks_lora_adapter_create(&r->o->model->cfg, vks_lora_adapter_config(r->adapter), out);
    if (!rc) rc = vks_trainer_export_lora(r->trainer, *out);
    if (rc) {
        vks_lora_adapter_free(*out);
        *out = NULL;
    }
    return rc;
}

/* On resume: the newest checkpoint in OUT becomes the start policy; its
 * moments, step and rollout position are applied once the trainer exists.
 * Nothing there: a fresh run. */
static int open_start(rl_run *r, vks_rl_result *res) {
    r->start = r->o->model;
    res->resumed_from = -1;
    static const char *const outputs[] = {"metrics.jsonl", "rl.svg", "timeline.svg", "report.html", "rollouts", "heldout.jsonl",
                                          VKS_RL_BANS_FILE, NULL};
    int rc = vks_rl_out_lock(&r->out, r->c->out);
    if (rc) return vks_error_prefix(rc, "rl");
    char dir[4096];
    bool found = false;
    if (r->o->resume && (rc = vks_checkpoint_latest(r->c->out, dir, sizeof dir, &found))) return rc;
    if (!found) { /* a fresh run */
        if ((rc = vks_rl_out_check_fresh(r->c->out, outputs, r->o->resume))) return vks_error_prefix(rc, "rl");
        if (r->o->resume && r->o->on_resume) r->o->on_resume(r->o->progress_ctx, NULL, -1);
        return lora(r) ? fresh_adapter(r) : VKS_OK;
    }
    if (lora(r)) { /* the adapter over the same base (its hash checked), the base as given */
        if ((rc = vks_checkpoint_load_lora(dir, r->o->model, &r->ck)) || (rc = vks_rl_ckpt_check_kind(r->ck, dir, true)) ||
            (rc = vks_rl_ckpt_check_betas(r->ck, dir, "rl", RL_BETA1, RL_BETA2)))
            return rc;
        r->adapter = r->ck->lora;
        r->ck->lora = NULL;
        const vks_lora_config *had = vks_lora_adapter_config(r->adapter);
        if (had->rank != r->c->lora_rank || had->alpha != r->c->lora_alpha || had->targets != r->c->lora_targets)
            return vks_set_error(VKS_ERR_ARG, "rl: resume: %s holds a LoRA adapter of rank %d, alpha %g, targets 0x%x; "
                                 "the config asks rank %d, alpha %g, targets 0x%x", dir, had->rank, had->alpha,
                                 had->targets, r->c->lora_rank, r->c->lora_alpha, r->c->lora_targets);
    } else if ((rc = vks_checkpoint_load(dir, &r->ck)) || (rc = vks_rl_ckpt_check_kind(r->ck, dir, true)) ||
               (rc = vks_rl_ckpt_check_betas(r->ck, dir, "rl", RL_BETA1, RL_BETA2)) ||
               (rc = vks_model_load(dir, &r->own_model)) ||
               (rc = vks_rl_ckpt_check_shape(r->own_model, r->o->model, dir, "rl")))
        return rc;
    if (!r->ck->adam_m || !r->ck->adam_v) return vks_set_error(VKS_ERR_FORMAT, "rl: %s has no optimizer state", dir);
    if ((rc = read_position(r, dir))) return rc;
    if (r->own_model) {
        r->own_model->bos_id = r->o->model->bos_id, r->own_model->eos_id = r->o->model->eos_id;
        r->start = r->own_model;
    }
    res->resumed_from = r->ck->state.step;
    if (r->o->on_resume) r->o->on_resume(r->o->progress_ctx, dir, res->resumed_from);
    return VKS_OK;
}

static int apply_checkpoint(rl_run *r) {
    int rc;
    if (lora(r)) {
        size_t n = (size_t)vks_lora_param_count(&r->o->model->cfg, r->c->lora_rank, r->c->lora_targets);
        rc = vks_rl_move_lora_set(r->trainer, VKS_SET_ADAM_M, r->ck->adam_m, n, false);
        if (!rc) rc = vks_rl_move_lora_set(r->trainer, VKS_SET_ADAM_V, r->ck->adam_v, n, false);
    } else {
        rc = vks_rl_move_set(r->trainer, r->layout, VKS_SET_ADAM_M, r->ck->adam_m, false);
        if (!rc) rc = vks_rl_move_set(r->trainer, r->layout, VKS_SET_ADAM_V, r->ck->adam_v, false);
    }
    vks_trainer_set_steps(r->trainer, (int)r->ck->state.step);
    /* the groups that trainer steps 1..step consumed count as queued (the async window) */
    r->sh.queue.pushed = r->ck->state.step * r->c->prompts_per_step;
    r->gen.batch = r->sh.batches = r->next_batch;
    if (!r->src && r->counted_stored) /* the metrics' totals go on from the checkpoint's (across ranks: from 0) */
        r->sh.queue.counters = r->reported = r->counted;
    return rc;
}

/* The rollout position: generation batches started so far. */
static int64_t position(rl_run *r) {
    if (r->src) return r->src->position(r->src->ctx);
    pthread_mutex_lock(&r->sh.mu);
    int64_t b = r->sh.batches;
    pthread_mutex_unlock(&r->sh.mu);
    return b;
}

/* OUT/step-N with the trainer's state and the rollout position next_batch; keeps the newest c->keep. */
static int save_checkpoint(rl_run *r, int64_t next_batch, char *dir, size_t cap) {
    const vks_rl_config *c = r->c;
    char *extra = position_json(r, next_batch);
    if (!extra) return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    vks_ckpt_state st = {.step = vks_trainer_steps(r->trainer), .seed = c->seed,
                         .adam = {.lr = c->lr, .beta1 = RL_BETA1, .beta2 = RL_BETA2, .eps = 1e-8},
                         .schedule = {.lr = c->lr}, .grad_clip = RL_GRAD_CLIP, .extra_json = extra};
    int rc = lora(r) ? vks_rl_save_lora(r->trainer, r->adapter, &st, c->out, c->keep, dir, cap)
                     : vks_rl_save_trainer(r->trainer, r->layout, r->start, r->o->tok, &st, c->out, c->keep, dir, cap);
    free(extra);
    return rc ? vks_error_prefix(rc, "trainer, checkpoint at step %lld", (long long)st.step) : VKS_OK;
}

/* The held-out set, before anything is generated: the split's tasks (written
 * to OUT/heldout.jsonl as they were) and the tasks of config->eval_tasks;
 * res->eval_set says what it is. */
static int open_eval_tasks(rl_run *r, vks_rl_result *res) {
    const vks_rl_config *c = r->c;
    vks_task *file = NULL;
    int64_t n_file = 0;
    int rc = VKS_OK;
    size_t at = 0, cap = sizeof res->eval_set;
    res->eval_set[0] = 0;
    if (r->gen.n_held) {
        snprintf(res->heldout_path, sizeof res->heldout_path, "%s/heldout.jsonl", c->out);
        rc = vks_task_file_copy(r->gen.tasks_path, r->gen.held, r->gen.n_held, res->heldout_path);
        at += (size_t)snprintf(res->eval_set, cap, "%lld of the %lld tasks of %s (eval_split %g; %s)",
                               (long long)r->gen.n_held, (long long)(r->gen.n_held + r->gen.n_tasks),
                               r->gen.tasks_path, c->eval_split, res->heldout_path);
    }
    if (!rc && c->eval_tasks[0]) {
        vks_task_spec spec;
        const char *path = NULL;
        rc = vks_task_resolve(c->eval_tasks, &spec, &path);
        if (!rc && !path) rc = vks_set_error(VKS_ERR_FORMAT, "eval_tasks '%s' is not a task file", c->eval_tasks);
        if (!rc) rc = vks_task_file_load(path, &file, &n_file);
        if (!rc && !r->gen.episodes_allowed && vks_task_refuse_environments(NULL, file, n_file))
            rc = vks_error_prefix(VKS_ERR_FORMAT, "%s", path);
        if (!rc && vks_task_first_code(file, n_file) && vks_sandbox_check())
            rc = vks_error_prefix(VKS_ERR_IO, "%s: code tasks", path);
        if (!rc && at < cap)
            snprintf(res->eval_set + at, cap - at, "%s%lld tasks of %s", at ? " and " : "", (long long)n_file, path);
    }
    r->n_eval_tasks = r->gen.n_held + n_file;
    if (!rc && r->n_eval_tasks) {
        r->eval_tasks = malloc(sizeof *r->eval_tasks * (size_t)r->n_eval_tasks);
        if (!r->eval_tasks) rc = vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    }
    if (!rc && r->gen.n_held) memcpy(r->eval_tasks, r->gen.held, sizeof *r->eval_tasks * (size_t)r->gen.n_held);
    if (!rc && n_file) memcpy(r->eval_tasks + r->gen.n_held, file, sizeof *file * (size_t)n_file);
    if (rc) vks_task_free(file, n_file);
    else free(file); /* its code tests now belong to r->eval_tasks (freed in run_free) */
    r->n_eval_own = rc ? 0 : n_file;
    res->eval_tasks = rc ? 0 : r->n_eval_tasks;
    return rc ? vks_error_prefix(rc, "held-out tasks") : VKS_OK;
}

/* The report's words for the tasks (after open_eval_tasks) and the start model's hash. */
static int describe_run(rl_run *r, const vks_rl_result *res) {
    char *t = r->task_set;
    size_t cap = sizeof r->task_set, at;
    if (r->gen.tasks_path)
        at = (size_t)snprintf(t, cap, "task file %s: %lld tasks trained on", r->gen.tasks_path, (long long)r->gen.n_tasks);
    else {
        char name[64];
        vks_task_spec_name(&r->gen.spec, name, sizeof name);
        at = (size_t)snprintf(t, cap, "built-in task %s: fresh instances (seed %llu)", name,
                              (unsigned long long)r->c->seed);
    }
    if (at < cap && !r->o->eval_n) snprintf(t + at, cap - at, "; held-out accuracy not measured (eval_n 0)");
    else if (at < cap && res->eval_set[0]) snprintf(t + at, cap - at, "; held out: %s (eval_n %d)", res->eval_set, r->o->eval_n);
    else if (at < cap && !r->gen.tasks_path)
        snprintf(t + at, cap - at, "; held-out accuracy on %d fresh instances (seed %llu)", r->o->eval_n,
                 (unsigned long long)r->o->eval_seed);
    else if (at < cap) snprintf(t + at, cap - at, "; no held-out set (eval_split or eval_tasks): not evaluated");
    uint8_t h[32];
    int rc = vks_model_hash(r->o->model, h);
    if (!rc) vks_hash_hex(h, r->model_hash);
    return rc;
}

/* At async level k > 0 the trainer keeps its last k + 1 versions' weights on
 * the host (a completion is checked against the version that sampled it). */
static int open_versions(rl_run *r) {
    int k = r->c->async_level;
    r->n_values = 0;
    for (int i = 0; k > 0 && i < vks_trainer_n_tensors(r->trainer); i++) {
        vks_train_tensor_info info;
        int rc = vks_trainer_tensor_info(r->trainer, i, &info);
        if (rc) return rc;
        r->n_values += (size_t)(info.rows * info.cols);
    }
    return vks_rl_versions_init(&r->versions, k > 0 ? k + 1 : 0, r->n_values);
}

static int open_run(rl_run *r, vks_rl_result *res) {
    const vks_rl_config *c = r->c;
    const vks_model *m = r->start;
    int P = c->prompts_per_step;
    r->max_tokens = m->cfg.seq_len > 2048 ? m->cfg.seq_len : 2048;
    r->groups = calloc((size_t)P, sizeof *r->groups);
    r->tokens = malloc(sizeof *r->tokens * (size_t)r->max_tokens);
    r->seq_lens = malloc(sizeof *r->seq_lens * (size_t)r->max_tokens);
    r->weight = malloc(sizeof *r->weight * (size_t)r->max_tokens);
    r->advantage = malloc(sizeof *r->advantage * (size_t)r->max_tokens);
    r->logp_old = malloc(sizeof *r->logp_old * (size_t)r->max_tokens);
    r->logp = malloc(sizeof *r->logp * (size_t)r->max_tokens);
    r->seq_sample = malloc(sizeof *r->seq_sample * (size_t)r->max_tokens);
    r->far = malloc(sizeof *r->far * (size_t)r->max_tokens);
    r->seq_checked = calloc((size_t)r->max_tokens, sizeof *r->seq_checked);
    if (!r->groups || !r->tokens || !r->seq_lens || !r->weight || !r->advantage || !r->logp_old || !r->logp ||
        !r->seq_sample || !r->far || !r->seq_checked)
        return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    int rc = vks_rl_queue_init(&r->sh.queue, P, c->async_level, c->max_off_policy_steps);
    if (!rc) rc = vks_rl_timeline_init(&r->timeline, r->t_start);
    if (rc) return rc;
    rc = make_dirs(r, res); /* the tasks were read before OUT was made (vks_rl_run_source) */
    if (!rc) rc = open_eval_tasks(r, res);
    if (!rc) rc = describe_run(r, res);
    vks_trainer_options to = {.max_tokens = r->max_tokens, .lora = r->adapter};
    if (!rc) rc = vks_trainer_create(r->o->train_gpu, m, &to, &r->trainer);
    if (!rc && !lora(r)) rc = vks_param_layout_create(&m->cfg, vks_model_has_bias(m), &r->layout);
    if (!rc && r->ck) rc = apply_checkpoint(r);
    if (!rc) rc = open_versions(r);
    if (!rc) rc = vks_metrics_open(c->out, r->ck ? r->ck->state.step : -1, &r->metrics);
    return rc;
}

static int start_inference(rl_run *r) {
    int64_t step = vks_trainer_steps(r->trainer); /* 0, or the step resumed from */
    if (r->src) {
        vks_model *m = NULL;
        if (r->ck) r->src->resume(r->src->ctx, step, r->next_batch);
        if (lora(r)) {
            vks_lora_adapter *a = NULL;
            int rc = export_adapter(r, &a);
            return rc ? rc : r->src->publish_adapter(r->src->ctx, a, step);
        }
        int rc = vks_trainer_export_model(r->trainer, &m);
        return rc ? rc : r->src->publish(r->src->ctx, m, step);
    }
    if (pthread_mutex_init(&r->sh.mu, NULL)) return vks_set_error(VKS_ERR_NOMEM, "rl: pthread_mutex_init failed");
    if (pthread_cond_init(&r->sh.cv, NULL)) {
        pthread_mutex_destroy(&r->sh.mu);
        return vks_set_error(VKS_ERR_NOMEM, "rl: pthread_cond_init failed");
    }
    r->shared_ready = true;
    r->gen.o = r->o;
    r->gen.sh = &r->sh;
    int rc = vks_rl_timeline_init(&r->gen_timeline, r->t_start);
    if (rc) return rc;
    r->gen.timeline = &r->gen_timeline;
    /* the inference thread starts from the trainer's f32 masters: policy step 0 (or the resumed step);
     * LoRA: from the base and the trainer's adapter */
    if (lora(r)) {
        r->gen.model = (vks_model *)r->o->model; /* borrowed: never written nor freed by the thread */
        r->gen.model_borrowed = true;
        rc = export_adapter(r, &r->sh.next_adapter);
    } else {
        rc = vks_trainer_export_model(r->trainer, &r->sh.next_model);
    }
    r->sh.next_step = step;
    if (!rc && pthread_create(&r->thread, NULL, vks_rl_gen_main, &r->gen))
        rc = vks_set_error(VKS_ERR_NOMEM, "rl: cannot start the inference thread");
    r->thread_started = !rc;
    return rc;
}

static void stop_inference(rl_run *r) {
    if (r->thread_started) {
        pthread_mutex_lock(&r->sh.mu);
        r->sh.stop = true;
        pthread_cond_broadcast(&r->sh.cv);
        pthread_mutex_unlock(&r->sh.mu);
        pthread_join(r->thread, NULL);
        r->thread_started = false;
    }
}

static void run_free(rl_run *r) {
    stop_inference(r);
    vks_rl_queue_free(&r->sh.queue);
    vks_model_free(r->sh.next_model);
    vks_lora_adapter_free(r->sh.next_adapter);
    vks_lora_adapter_free(r->adapter);
    if (r->shared_ready) pthread_mutex_destroy(&r->sh.mu), pthread_cond_destroy(&r->sh.cv);
    vks_rl_gen_close(&r->gen);
    vks_rl_timeline_free(&r->timeline);
    vks_rl_timeline_free(&r->gen_timeline);
    for (int i = 0; r->groups && i < r->c->prompts_per_step; i++) vks_rl_group_free(&r->groups[i]);
    free(r->groups), free(r->tokens), free(r->seq_lens), free(r->weight), free(r->advantage), free(r->logp_old);
    free(r->logp), free(r->seq_sample), free(r->far), free(r->seq_checked);
    vks_rl_versions_free(&r->versions);
    vks_metrics_close(r->metrics);
    vks_param_layout_free(r->layout);
    vks_trainer_destroy(r->trainer);
    vks_checkpoint_free(r->ck);
    vks_model_free(r->own_model);
    vks_rl_out_unlock(&r->out);
    for (int64_t i = r->n_eval_tasks - r->n_eval_own; r->eval_tasks && i < r->n_eval_tasks; i++)
        free(r->eval_tasks[i].code), free(r->eval_tasks[i].program);
    free(r->eval_tasks);
    vks_rl_report_samples_free(&r->samples);
}

/* Blocks until P groups are queued (or inference failed); takes them. */
static int take_groups(rl_run *r, double *waited) {
    int P = r->c->prompts_per_step, rc = VKS_OK;
    double t0 = vks_seconds_now();
    vks_rl_status_begin(&r->status, vks_trainer_steps(r->trainer) + 1, r->c->steps, t0);
    if (r->src) {
        rc = r->src->take(r->src->ctx, vks_trainer_steps(r->trainer), r->groups, &r->status);
        *waited = vks_seconds_now() - t0;
        return rc;
    }
    pthread_mutex_lock(&r->sh.mu);
    while (r->sh.queue.len < P && !r->sh.gen_rc) {
        /* woken by each batch queued, or when a status line is due */
        vks_rl_status_poll(&r->status, &r->sh.queue, "in flight: the inference thread's batch");
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        double due = vks_rl_status_due_in(&r->status);
        until.tv_sec += (time_t)due;
        until.tv_nsec += (long)((due - (double)(time_t)due) * 1e9);
        if (until.tv_nsec >= 1000000000L) until.tv_sec++, until.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&r->sh.cv, &r->sh.mu, &until);
    }
    if (r->sh.gen_rc) rc = vks_set_error(r->sh.gen_rc, "%s", r->sh.gen_error);
    if (!rc) rc = vks_rl_queue_pop(&r->sh.queue, P, r->groups);
    pthread_cond_broadcast(&r->sh.cv);
    pthread_mutex_unlock(&r->sh.mu);
    *waited = vks_seconds_now() - t0;
    return rc;
}

/* What the step's samples say, for the metrics. */
typedef struct {
    double reward, length, lag;
    int64_t lag_max;      /* the oldest group's lag */
    int n;
    vks_grpo_stats grpo;  /* summed over micro-batches (fractions recomputed) */
    double mismatch_sum, mismatch_kl_sum, entropy_sum;
    int far;              /* completions left out: their logp far from the sampling version's */
    double sampler_max;   /* the largest |logp - logp_old| of a trained completion against its sampling version */
} step_stats;

/* The largest |logp - logp_old| over the live rows (weight != 0) of each
 * packed sequence i with keep[i] (NULL: every one). */
static double sequences_max(const rl_run *r, int n_seqs, const bool *keep) {
    double most = 0;
    for (int i = 0, at = 0; i < n_seqs; at += r->seq_lens[i++])
        for (int k = at; (!keep || keep[i]) && k < at + r->seq_lens[i]; k++)
            if (r->weight[k] != 0 && fabs((double)r->logp[k] - (double)r->logp_old[k]) > most)
                most = fabs((double)r->logp[k] - (double)r->logp_old[k]);
    return most;
}

static int flush_micro(rl_run *r, int n_tokens, int n_seqs, const vks_grpo_loss_params *h, step_stats *st) {
    if (!n_tokens) return VKS_OK;
    vks_train_batch b = {.tokens = r->tokens, .n_tokens = n_tokens, .seq_lens = r->seq_lens, .n_seqs = n_seqs,
                         .weight = r->weight};
    vks_grpo_rows rows = {.logp_old = r->logp_old, .advantage = r->advantage};
    vks_grpo_stats s;
    int rc = vks_trainer_accumulate_grpo(r->trainer, &b, &rows, h, &s, r->logp);
    if (rc) return rc;
    /* this policy sampled them (lag 0): its logp is the check; older versions' were checked by check_lagged */
    vks_grpo_far_sequences(r->logp, r->logp_old, r->weight, r->seq_lens, n_seqs, VKS_RL_MAX_LOGP_MISMATCH, r->far);
    for (int i = 0; i < n_seqs; i++) {
        r->seq_sample[i]->logp_far = r->far[i] && !r->seq_checked[i];
        st->far += r->seq_sample[i]->logp_far;
        r->far[i] = !r->seq_checked[i]; /* the lag-0 sequences, for sampler_max */
    }
    double most = sequences_max(r, n_seqs, r->far);
    if (most > st->sampler_max) st->sampler_max = most;
    st->grpo.loss += s.loss;
    st->grpo.tokens += s.tokens;
    st->grpo.clipped += s.clipped;
    st->grpo.capped += s.capped;
    st->mismatch_sum += s.logp_mismatch * s.tokens;
    st->mismatch_kl_sum += s.mismatch_kl * s.tokens;
    st->entropy_sum += s.entropy * s.tokens;
    if (s.max_mismatch > st->grpo.max_mismatch) st->grpo.max_mismatch = s.max_mismatch;
    return VKS_OK;
}

/* A step trains a completion a verifier did not reject and whose
 * log-probabilities the step's check did not find far (logp_far). */
static bool trained_on(const vks_rl_sample *s) { return s->accepted && !s->logp_far; }

/* Appends s to the micro-batch being packed: its tokens, completion mask,
 * advantage and sampler log-probabilities (rows [*n_tokens, + its length)). */
static int pack(rl_run *r, const vks_rl_sample *s, int *n_tokens, int *n_seqs) {
    int at = *n_tokens, len = s->prompt_len + s->completion_len;
    memcpy(r->tokens + at, s->tokens, sizeof(int32_t) * (size_t)len);
    int rc = vks_grpo_sequence_rows(s->prompt_len, s->completion_len, s->trained, s->advantage, r->advantage + at,
                                    r->weight + at);
    int trained = vks_grpo_trained_tokens(s->completion_len, s->trained);
    if (r->c->loss.normalize == VKS_NORMALIZE_SEQUENCE && trained > 0) /* the completion's mean */
        for (int k = 0; k < len; k++) r->weight[at + k] /= (float)trained;
    for (int k = 0; k < len; k++) r->logp_old[at + k] = 0.0f;
    for (int k = 0; k < s->completion_len; k++) r->logp_old[at + s->prompt_len - 1 + k] = s->logp[k];
    r->seq_sample[*n_seqs] = (vks_rl_sample *)s;
    r->seq_lens[(*n_seqs)++] = len;
    *n_tokens += len;
    return rc;
}

/* The check of a micro-batch of completions sampled by the version now
 * loaded: the trainer's log-probabilities (forward only) against their
 * records; a far one is marked and counted. */
static int check_micro(rl_run *r, int n_tokens, int n_seqs, step_stats *ck) {
    if (!n_tokens) return VKS_OK;
    vks_train_batch b = {.tokens = r->tokens, .n_tokens = n_tokens, .seq_lens = r->seq_lens, .n_seqs = n_seqs,
                         .weight = r->weight};
    int rc = vks_trainer_logprobs(r->trainer, &b, r->logp);
    if (rc) return rc;
    vks_grpo_far_sequences(r->logp, r->logp_old, r->weight, r->seq_lens, n_seqs, VKS_RL_MAX_LOGP_MISMATCH, r->far);
    for (int i = 0; i < n_seqs; i++) r->seq_sample[i]->logp_far = r->far[i], ck->far += r->far[i], r->far[i] = !r->far[i];
    double most = sequences_max(r, n_seqs, r->far); /* of those kept */
    if (most > ck->sampler_max) ck->sampler_max = most;
    return VKS_OK;
}

/* Checks the accepted completions of the step's groups made by version v
 * (loaded in the trainer) in micro-batches. */
static int check_version(rl_run *r, int64_t v, step_stats *ck) {
    int n_tokens = 0, n_seqs = 0, rc = VKS_OK;
    for (int gi = 0; !rc && gi < r->c->prompts_per_step; gi++) {
        const vks_rl_batch_group *g = &r->groups[gi];
        for (int i = 0; !rc && g->policy_step == v && i < g->n; i++) {
            const vks_rl_sample *s = &g->samples[i];
            int len = s->prompt_len + s->completion_len;
            if (!s->accepted) continue;
            if (len > r->max_tokens) return vks_set_error(VKS_ERR_FORMAT, "rl: a completion of %d tokens", len);
            if (n_tokens + len > r->max_tokens) {
                rc = check_micro(r, n_tokens, n_seqs, ck);
                n_tokens = n_seqs = 0;
            }
            if (!rc) rc = pack(r, s, &n_tokens, &n_seqs);
        }
    }
    return rc ? rc : check_micro(r, n_tokens, n_seqs, ck);
}

/* Async level k > 0: the completions an older version sampled (lag 1..k) are
 * checked against that version's weights, loaded into the trainer for a
 * forward pass, then the current weights are put back (bit for bit). A
 * version not held (none should be: the window keeps lags <= k) leaves its
 * completions out. The current version (lag 0) is checked by the GRPO pass
 * itself (flush_micro). ck counts those left out (far) and the largest
 * difference of those kept (sampler_max). */
static int check_lagged(rl_run *r, int64_t step, step_stats *ck) {
    float *now = vks_rl_versions_put(&r->versions, step); /* the current weights: the next steps' older version */
    int rc = !r->versions.cap ? VKS_OK : now ? vks_rl_move_lora_set(r->trainer, VKS_SET_PARAMS, now, r->n_values, true)
                                             : vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    if (rc) vks_rl_versions_forget(&r->versions, step);
    bool loaded = false;
    for (int gi = 0; !rc && gi < r->c->prompts_per_step; gi++) {
        int64_t v = r->groups[gi].policy_step;
        bool seen = v == step;
        for (int gj = 0; gj < gi && !seen; gj++) seen = r->groups[gj].policy_step == v;
        if (seen) continue; /* each version once */
        const float *w = vks_rl_versions_get(&r->versions, v);
        if (w) {
            rc = vks_rl_move_lora_set(r->trainer, VKS_SET_PARAMS, (float *)w, r->n_values, false);
            loaded = true;
            if (!rc) rc = check_version(r, v, ck);
            continue;
        }
        for (int gj = gi; gj < r->c->prompts_per_step; gj++)
            for (int i = 0; r->groups[gj].policy_step == v && i < r->groups[gj].n; i++) {
                vks_rl_sample *s = &r->groups[gj].samples[i];
                s->logp_far = s->accepted;
                ck->far += s->accepted;
            }
    }
    if (loaded) { /* the current weights back, also after a failed check */
        int put = vks_rl_move_lora_set(r->trainer, VKS_SET_PARAMS, now, r->n_values, false);
        if (!rc) rc = put;
    }
    return rc;
}

/* Packs the step's completions into micro-batches of at most max_tokens rows
 * and accumulates the GRPO loss over them. */
static int accumulate_step(rl_run *r, const vks_grpo_loss_params *h, step_stats *st) {
    int n_tokens = 0, n_seqs = 0, rc = VKS_OK;
    for (int gi = 0; !rc && gi < r->c->prompts_per_step; gi++) {
        const vks_rl_batch_group *g = &r->groups[gi];
        for (int i = 0; !rc && i < g->n; i++) {
            const vks_rl_sample *s = &g->samples[i];
            int len = s->prompt_len + s->completion_len;
            r->trained_rejected += !s->accepted; /* never trained on; counted, so that a leak shows */
            if (!trained_on(s)) continue;
            r->trained++;
            if (len > r->max_tokens) return vks_set_error(VKS_ERR_FORMAT, "rl: a completion of %d tokens", len);
            if (n_tokens + len > r->max_tokens) {
                rc = flush_micro(r, n_tokens, n_seqs, h, st);
                n_tokens = n_seqs = 0;
            }
            if (rc) break;
            r->seq_checked[n_seqs] = g->policy_step != vks_trainer_steps(r->trainer);
            rc = pack(r, s, &n_tokens, &n_seqs);
            st->reward += s->task_reward, st->length += vks_grpo_trained_tokens(s->completion_len, s->trained), st->n++;
        }
    }
    if (!rc) rc = flush_micro(r, n_tokens, n_seqs, h, st);
    return rc;
}

/* What the step's summed loss is divided by (loss.normalize), over the
 * completions accumulate_step trains (trained_on). */
static double step_divisor(const rl_run *r) {
    const vks_rl_config *c = r->c;
    if (c->loss.normalize == VKS_NORMALIZE_BUDGET)
        return c->token_budget > 0 ? c->token_budget : (double)c->prompts_per_step * c->group_size * c->max_new_tokens;
    double tokens = 0, completions = 0;
    for (int gi = 0; gi < c->prompts_per_step; gi++)
        for (int i = 0; i < r->groups[gi].n; i++) {
            const vks_rl_sample *s = &r->groups[gi].samples[i];
            int trained = vks_grpo_trained_tokens(s->completion_len, s->trained);
            if (!trained_on(s) || trained <= 0) continue;
            tokens += trained, completions++;
        }
    double n = c->loss.normalize == VKS_NORMALIZE_TOKENS ? tokens : completions;
    return n > 0 ? n : 1;
}

static int train_step(rl_run *r, step_stats *st, double *grad_norm) {
    const vks_rl_config *c = r->c;
    int64_t step = vks_trainer_steps(r->trainer); /* this step consumes groups of step `step` */
    double lag = 0;
    int64_t lag_max = 0;
    for (int i = 0; i < c->prompts_per_step; i++) {
        int64_t age = step - r->groups[i].policy_step;
        lag += (double)age;
        if (age > lag_max) lag_max = age;
    }
    vks_grpo_loss_params h;
    memset(st, 0, sizeof *st);
    int64_t trained = r->trained, rejected = r->trained_rejected;
    step_stats lagged = {0};
    int rc = check_lagged(r, step, &lagged);
    vks_rl_loss_params(c, step_divisor(r), &h); /* after the check: far completions are not counted */
    if (!rc) rc = accumulate_step(r, &h, st);
    if (!rc && st->far) { /* again without the completions whose log-probabilities are not the policy's */
        int far = st->far;
        memset(st, 0, sizeof *st);
        r->trained = trained, r->trained_rejected = rejected;
        rc = vks_trainer_zero_grads(r->trainer);
        vks_rl_loss_params(c, step_divisor(r), &h);
        if (!rc) rc = accumulate_step(r, &h, st);
        st->far = far;
    }
    st->far += lagged.far;
    if (lagged.sampler_max > st->sampler_max) st->sampler_max = lagged.sampler_max;
    st->lag = lag / c->prompts_per_step, st->lag_max = lag_max;
    double lr = c->warmup && step + 1 < c->warmup ? c->lr * (double)(step + 1) / c->warmup : c->lr;
    vks_adamw_params a = {.lr = lr, .beta1 = RL_BETA1, .beta2 = RL_BETA2, .eps = 1e-8, .weight_decay = 0};
    if (!rc) rc = vks_trainer_step(r->trainer, &a, RL_GRAD_CLIP, grad_norm);
    if (!rc) rc = vks_rl_report_capture(&r->samples, r->o->tok, &r->gen, step + 1, r->groups, c->prompts_per_step);
    for (int i = 0; i < c->prompts_per_step; i++) vks_rl_group_free(&r->groups[i]);
    if (rc) return vks_error_prefix(rc, "trainer, step %lld", (long long)step + 1);
    return VKS_OK;
}

/* Hands the new weights to the inference thread (replacing any it has not
 * taken yet); returns the seconds it took. */
static int publish(rl_run *r, double *seconds) {
    double t0 = vks_seconds_now();
    vks_model *m = NULL;
    vks_lora_adapter *a = NULL;
    int rc = lora(r) ? export_adapter(r, &a) : vks_trainer_export_model(r->trainer, &m);
    if (rc) return vks_error_prefix(rc, "trainer: exporting the weights");
    if (r->src) {
        rc = a ? r->src->publish_adapter(r->src->ctx, a, vks_trainer_steps(r->trainer))
               : r->src->publish(r->src->ctx, m, vks_trainer_steps(r->trainer));
        *seconds = vks_seconds_now() - t0;
        return rc;
    }
    pthread_mutex_lock(&r->sh.mu);
    r->published_position = r->sh.batches; /* at k = 0 inference waits for these weights: where a resume continues */
    vks_model_free(r->sh.next_model);
    vks_lora_adapter_free(r->sh.next_adapter);
    r->sh.next_model = m;
    r->sh.next_adapter = a;
    r->sh.next_step = vks_trainer_steps(r->trainer);
    pthread_cond_broadcast(&r->sh.cv);
    pthread_mutex_unlock(&r->sh.mu);
    *seconds = vks_seconds_now() - t0;
    return VKS_OK;
}

/* Held-out accuracy of the trainer's current weights, greedy and sampled at
 * the run's temperature (one completion a task, the sampler seeded with
 * eval_seed): on the first eval_n tasks of the held-out set, or eval_n fresh
 * instances of a built-in task; NaN without eval_n, or for a task file
 * without a held-out set. p gets accuracy, accuracy_sampled and accuracy_n. */
static int evaluate(rl_run *r, vks_rl_progress *p) {
    p->accuracy = p->accuracy_sampled = p->accuracy_n = NAN;
    if (!r->o->eval_n || (r->gen.tasks && !r->eval_tasks)) return VKS_OK;
    double since = vks_seconds_now();
    vks_model *m = NULL;
    vks_lora_adapter *a = NULL;
    int rc = lora(r) ? export_adapter(r, &a) : vks_trainer_export_model(r->trainer, &m);
    vks_task_run_options to = {.samples = 1, .temperature = 0, .max_new_tokens = r->c->max_new_tokens,
                               .engine = {.dtype = VKS_DTYPE_F32}, .prompt = &r->c->prompt, .lora = a};
    const vks_model *policy = a ? r->o->model : m;
    vks_task_eval_result e;
    int64_t n = r->n_eval_tasks < r->o->eval_n ? r->n_eval_tasks : r->o->eval_n;
    double acc[2] = {NAN, NAN};
    vks_task *scored = r->eval_tasks; /* the config's reward, when given, scores the held-out set too */
    if (!rc && r->eval_tasks && r->gen.reward_program && n > 0) {
        if (!(scored = malloc(sizeof *scored * (size_t)n))) rc = vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
        for (int64_t i = 0; !rc && i < n; i++) {
            scored[i] = r->eval_tasks[i];
            scored[i].verify = VKS_VERIFY_PROGRAM, scored[i].program = r->gen.reward_program;
        }
    }
    for (int sampled = 0; !rc && sampled < 2; sampled++) {
        to.temperature = sampled ? (float)r->c->temperature : 0.0f;
        to.seed = r->o->eval_seed;
        if (r->eval_tasks) rc = vks_task_eval_tasks(r->o->train_gpu, policy, r->o->tok, scored, n, &to, &e);
        else rc = vks_task_eval(r->o->train_gpu, policy, r->o->tok, &r->gen.spec, r->o->eval_seed, r->o->eval_n, &to, &e);
        if (!rc) acc[sampled] = e.accuracy, p->accuracy_n = (double)e.n;
    }
    if (!rc) p->accuracy = acc[0], p->accuracy_sampled = acc[1];
    if (scored != r->eval_tasks) free(scored); /* the tasks' own programs stay r->eval_tasks' */
    vks_model_free(m);
    vks_lora_adapter_free(a);
    vks_rl_timeline_note(&r->timeline, VKS_RL_WORK_EVAL, vks_trainer_steps(r->trainer), &since);
    return rc ? vks_error_prefix(rc, "held-out evaluation") : VKS_OK;
}

/* The inference ranks (or the inference thread) as counted so far; how many. */
static int get_ranks(rl_run *r, vks_rl_rank_status *out, int cap) {
    if (r->src) return r->src->ranks ? r->src->ranks(r->src->ctx, out, cap) : 0;
    vks_rl_counters c;
    pthread_mutex_lock(&r->sh.mu);
    c = r->sh.queue.counters;
    int64_t batches = r->sh.batches;
    pthread_mutex_unlock(&r->sh.mu);
    out[0] = (vks_rl_rank_status){.rank = -1, .batches = batches, .rollouts = c.rollouts, .rejected = c.rejected,
                                  .at_step = -1};
    return 1;
}

/* Per rank of a run across ranks: "rankR.batches", ".rollouts_per_s", ".rejected", ".dropped" (1: dropped or refused). */
typedef struct {
    char name[4][40];
} rank_names;

static int rank_metrics(rl_run *r, const vks_rl_progress *p, vks_metric *m, rank_names *names, int cap) {
    if (!r->src) return 0;
    vks_rl_rank_status *st = malloc(sizeof *st * VKS_RL_MAX_RANK_STATUS);
    int n = st ? get_ranks(r, st, VKS_RL_MAX_RANK_STATUS) : 0, k = 0;
    static const char *const what[4] = {"batches", "rollouts_per_s", "rejected", "dropped"};
    for (int i = 0; i < n && k + 4 <= cap; i++) {
        double v[4] = {(double)st[i].batches, p->elapsed_s > 0 ? (double)st[i].rollouts / p->elapsed_s : 0,
                       (double)st[i].rejected, st[i].state != VKS_RL_RANK_LIVE};
        for (int j = 0; j < 4; j++) {
            snprintf(names[i].name[j], sizeof names[i].name[j], "rank%d.%s", st[i].rank, what[j]);
            m[k++] = (vks_metric){names[i].name[j], v[j]};
        }
    }
    free(st);
    return k;
}

/* A run that takes joins: "joins", "leaves", "bans" and per identity
 * "key.K.batches_accepted" / ".batches_rejected" (K: the key's first 16 hex
 * digits), once anyone joined. */
typedef struct {
    char name[2][48];
} identity_names;
enum { POOL_METRICS = 4 + 2 * VKS_RL_MAX_IDENTITIES };

/* "program.NAME": the mean of each metric the reward programs answered for
 * the completions scored since the last step (where they are scored: the
 * inference thread here, the trainer's checks across ranks). */
typedef char program_names[VKS_TASK_METRIC_NAME + 8];
static int program_metrics(rl_run *r, vks_metric *m, program_names *names) {
    vks_task_metrics *sink = !r->src ? r->gen.program_metrics : r->src->program_metrics ? r->src->program_metrics(r->src->ctx) : NULL;
    char raw[VKS_TASK_MAX_METRICS][VKS_TASK_METRIC_NAME];
    double means[VKS_TASK_MAX_METRICS];
    int k = vks_task_metrics_take(sink, raw, means, VKS_TASK_MAX_METRICS);
    for (int i = 0; i < k; i++) {
        snprintf(names[i], sizeof names[i], "program.%.47s", raw[i]);
        m[i] = (vks_metric){names[i], means[i]};
    }
    return k;
}

static int pool_metrics(rl_run *r, vks_rl_pool *pool, vks_metric *m, identity_names *names) {
    if (!r->src || !r->src->pool || !r->src->pool(r->src->ctx, pool) || !(pool->joins || pool->bans)) return 0;
    int k = 0;
    m[k++] = (vks_metric){"joins", (double)pool->joins};
    m[k++] = (vks_metric){"leaves", (double)pool->leaves};
    m[k++] = (vks_metric){"bans", (double)pool->bans};
    for (int i = 0; i < pool->n_identities; i++) {
        const vks_rl_identity *id = &pool->identities[i];
        snprintf(names[i].name[0], sizeof names[i].name[0], "key.%s.batches_accepted", id->identity);
        snprintf(names[i].name[1], sizeof names[i].name[1], "key.%s.batches_rejected", id->identity);
        m[k++] = (vks_metric){names[i].name[0], (double)id->batches_accepted};
        m[k++] = (vks_metric){names[i].name[1], (double)id->batches_rejected};
    }
    if (pool->identities_left_out) m[k++] = (vks_metric){"keys_left_out", (double)pool->identities_left_out};
    return k;
}

/* An evaluation's metrics (none when not measured): accuracy, accuracy_se,
 * accuracy_n and the same of accuracy_sampled; returns how many. */
static int eval_metrics(const vks_rl_progress *p, vks_metric *m) {
    int n = 0;
    if (isnan(p->accuracy)) return 0;
    m[n++] = (vks_metric){"accuracy", p->accuracy};
    m[n++] = (vks_metric){"accuracy_se", vks_binomial_se(p->accuracy, p->accuracy_n)};
    m[n++] = (vks_metric){"accuracy_n", p->accuracy_n};
    m[n++] = (vks_metric){"accuracy_sampled", p->accuracy_sampled};
    m[n++] = (vks_metric){"accuracy_sampled_se", vks_binomial_se(p->accuracy_sampled, p->accuracy_n)};
    m[n++] = (vks_metric){"accuracy_sampled_n", p->accuracy_n};
    return n;
}

/* A fresh run's step-0 line: the start's evaluation (when measured). */
static int log_start(rl_run *r, const vks_rl_progress *p) {
    vks_metric m[7];
    int n = eval_metrics(p, m);
    if (!n) return VKS_OK;
    m[n++] = (vks_metric){"elapsed_s", run_elapsed(r)};
    return vks_metrics_log(r->metrics, 0, m, n);
}

/* clip_fraction's other name where the loss masks tokens (prime-rl's dppo_kl
 * and ipo; decoupled_ppo's MIS) or truncates their importance weight
 * (decoupled_ppo's TIS); NULL where it clips a ratio. */
static const char *trust_region_metric(const vks_rl_loss *l) {
    if (l->type == VKS_LOSS_DPPO_KL || l->type == VKS_LOSS_IPO) return "masked_fraction";
    if (l->type == VKS_LOSS_DECOUPLED_PPO) return l->behav_truncate ? "truncated_fraction" : "masked_fraction";
    return NULL;
}

static int log_step(rl_run *r, const vks_rl_progress *p) {
    enum { FIXED = 34 };
    vks_metric *m = malloc(sizeof *m * (FIXED + 4 * VKS_RL_MAX_RANK_STATUS + POOL_METRICS + VKS_TASK_MAX_METRICS));
    rank_names *names = malloc(sizeof *names * VKS_RL_MAX_RANK_STATUS);
    identity_names *id_names = malloc(sizeof *id_names * VKS_RL_MAX_IDENTITIES);
    vks_rl_pool *pool = malloc(sizeof *pool);
    program_names *prog_names = malloc(sizeof *prog_names * VKS_TASK_MAX_METRICS);
    if (!m || !names || !id_names || !pool || !prog_names) {
        free(m), free(names), free(id_names), free(pool), free(prog_names);
        return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    }
    int n = 0;
    m[n++] = (vks_metric){"policy_lag", p->policy_lag};
    m[n++] = (vks_metric){"policy_lag_max", (double)p->policy_lag_max};
    if (!isnan(p->reward)) m[n++] = (vks_metric){"reward", p->reward};
    m[n++] = (vks_metric){"trained_reward", p->trained_reward};
    n += eval_metrics(p, m + n);
    m[n++] = (vks_metric){"length", p->length};
    m[n++] = (vks_metric){"accept_rate", p->accept_rate};
    m[n++] = (vks_metric){"rollouts_per_s", p->rollouts_per_s};
    m[n++] = (vks_metric){"trainer_idle", p->trainer_idle};
    m[n++] = (vks_metric){"broadcast_s", p->broadcast_s};
    if (r->src && r->src->broadcast_bytes) m[n++] = (vks_metric){"broadcast_bytes", p->broadcast_bytes};
    m[n++] = (vks_metric){"loss", p->loss};
    m[n++] = (vks_metric){"grad_norm", p->grad_norm};
    m[n++] = (vks_metric){"clip_fraction", p->clip_fraction};
    const char *also = trust_region_metric(&r->c->loss);
    if (also) m[n++] = (vks_metric){also, p->clip_fraction};
    m[n++] = (vks_metric){"logp_mismatch", p->logp_mismatch};
    m[n++] = (vks_metric){"mismatch_kl", p->mismatch_kl};
    m[n++] = (vks_metric){"logp_excluded", (double)p->logp_excluded};
    m[n++] = (vks_metric){"logp_sampler_max", p->logp_sampler_max};
    m[n++] = (vks_metric){"entropy", p->entropy};
    m[n++] = (vks_metric){"groups_filtered", (double)p->groups_filtered};
    m[n++] = (vks_metric){"rejected", (double)p->rejected};
    m[n++] = (vks_metric){"groups_stale", (double)p->groups_stale};
    m[n++] = (vks_metric){"off_policy_dropped", (double)p->off_policy_dropped};
    m[n++] = (vks_metric){"elapsed_s", p->elapsed_s};
    if (r->gen.pool) { /* buffer.type difficulty_pool: the pools' sizes now */
        int64_t size[VKS_POOL_COUNT];
        vks_difficulty_pool_sizes(r->gen.pool, size);
        m[n++] = (vks_metric){"pool_easy", (double)size[VKS_POOL_EASY]};
        m[n++] = (vks_metric){"pool_normal", (double)size[VKS_POOL_NORMAL]};
        m[n++] = (vks_metric){"pool_hard", (double)size[VKS_POOL_HARD]};
    }
    n += rank_metrics(r, p, m + n, names, 4 * VKS_RL_MAX_RANK_STATUS);
    n += pool_metrics(r, pool, m + n, id_names);
    n += program_metrics(r, m + n, prog_names);
    int rc = vks_metrics_log(r->metrics, p->step, m, n);
    free(m), free(names), free(id_names), free(pool), free(prog_names);
    return rc;
}

/* Fills the counters the inference thread keeps. */
static void get_counters(rl_run *r, vks_rl_counters *c) {
    if (r->src) {
        r->src->counters(r->src->ctx, c);
        return;
    }
    pthread_mutex_lock(&r->sh.mu);
    *c = r->sh.queue.counters;
    pthread_mutex_unlock(&r->sh.mu);
}

static void read_counters(rl_run *r, vks_rl_progress *p, double t_start) {
    vks_rl_counters c;
    get_counters(r, &c);
    p->accept_rate = c.checked ? (double)c.accepted / (double)c.checked : 1.0;
    double el = vks_seconds_now() - t_start;
    p->rollouts_per_s = el > 0 ? (double)(c.rollouts - r->counted.rollouts) / el : 0; /* this process's */
    p->groups_filtered = c.filtered;
    p->rejected = c.rejected;
    p->groups_stale = c.stale;
    p->off_policy_dropped = c.off_policy;
    p->elapsed_s = run_elapsed(r);
    int64_t made = c.rollouts - r->reported.rollouts;
    p->reward = made > 0 ? (c.task_reward_sum - r->reported.task_reward_sum) / (double)made : NAN;
    r->reported = c;
}

/* OUT/report.html from what the run has now; final: at the end (the
 * inference thread joined: its row of the timeline is complete). */
static int write_report(rl_run *r, bool final, const char *metrics_path) {
    vks_rl_rank_status *ranks = malloc(sizeof *ranks * VKS_RL_MAX_RANK_STATUS);
    if (!ranks) return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    vks_rl_report rep = {.task = r->c->task, .step = vks_trainer_steps(r->trainer), .steps = r->c->steps, .final = final,
                         .across_ranks = r->src != NULL, .config = r->c, .model = r->o->model->path,
                         .model_hash = r->model_hash, .task_set = r->task_set, .resumes = r->resumes,
                         .n_resumes = r->n_resumes, .elapsed_s = run_elapsed(r), .metrics_path = metrics_path,
                         .trainer = &r->timeline, .inference = final && !r->src ? &r->gen_timeline : NULL,
                         .last_n = r->o->timeline_steps ? r->o->timeline_steps : VKS_RL_TIMELINE_STEPS,
                         .samples = &r->samples, .ranks = ranks};
    rep.n_ranks = get_ranks(r, ranks, VKS_RL_MAX_RANK_STATUS);
    get_counters(r, &rep.totals);
    int rc = vks_rl_report_write(r->c->out, &rep);
    free(ranks);
    return rc;
}

/* Every save_every steps (not the last: finish saves it), before the weights
 * are published: at k = 0 inference is then waiting for them, so the rollout
 * position recorded is exactly where a resumed run must continue. */
static int save_periodic(rl_run *r) {
    int64_t step = vks_trainer_steps(r->trainer);
    if (!r->c->save_every || step % r->c->save_every || step >= r->c->steps) return VKS_OK;
    char dir[4096];
    return save_checkpoint(r, position(r), dir, sizeof dir);
}

/* Whether the caller asks for a clean stop after this step (not after the
 * last: that ends the run anyway). Across ranks (r->src) the trainer stops
 * before the step's weights go out, and the caller's STOP ends every rank. */
static bool stop_asked(const rl_run *r) {
    return r->o->stop_requested && vks_trainer_steps(r->trainer) < r->c->steps &&
           r->o->stop_requested(r->o->stop_ctx);
}

static int one_step(rl_run *r, double t_start, double *idle_sum, double *time_sum, vks_rl_progress *p) {
    double t0 = vks_seconds_now(), since = t0, waited = 0, broadcast_s = 0, norm = 0;
    int64_t this_step = vks_trainer_steps(r->trainer) + 1;
    step_stats st;
    int rc = take_groups(r, &waited);
    vks_rl_timeline_note(&r->timeline, VKS_RL_WORK_WAIT, this_step, &since);
    if (!rc) rc = train_step(r, &st, &norm);
    vks_rl_timeline_note(&r->timeline, VKS_RL_WORK_TRAIN, this_step, &since);
    if (!rc && stop_asked(r)) { /* before the weights go out: at k = 0 inference is waiting for them */
        r->stopped = true;
        r->stop_position = position(r);
    }
    if (!rc && !r->stopped) rc = save_periodic(r); /* stopping: finish saves it */
    if (!rc && !r->stopped) rc = publish(r, &broadcast_s);
    vks_rl_timeline_note(&r->timeline, VKS_RL_WORK_PUBLISH, this_step, &since);
    if (rc) return rc;
    double spent = vks_seconds_now() - t0;
    *idle_sum += waited, *time_sum += spent;
    int64_t step = vks_trainer_steps(r->trainer);
    *p = (vks_rl_progress){.step = step, .steps = r->c->steps, .policy_lag = st.lag, .policy_lag_max = st.lag_max,
                           .trained_reward = st.n ? st.reward / st.n : 0, .accuracy = NAN, .accuracy_sampled = NAN,
                           .accuracy_n = NAN,
                           .length = st.n ? st.length / st.n : 0, .trainer_idle = spent > 0 ? waited / spent : 0,
                           .broadcast_s = broadcast_s, .loss = st.grpo.loss, .grad_norm = norm,
                           .broadcast_bytes = r->src && r->src->broadcast_bytes ? r->src->broadcast_bytes(r->src->ctx) : 0,
                           .clip_fraction = st.grpo.tokens ? (double)st.grpo.clipped / st.grpo.tokens : 0,
                           .logp_mismatch = st.grpo.tokens ? st.mismatch_sum / st.grpo.tokens : 0,
                           .mismatch_kl = st.grpo.tokens ? st.mismatch_kl_sum / st.grpo.tokens : 0,
                           .logp_excluded = st.far, .logp_sampler_max = st.sampler_max,
                           .entropy = st.grpo.tokens ? st.entropy_sum / st.grpo.tokens : 0};
    bool eval_now = step == r->c->steps || (r->o->eval_every && step % r->o->eval_every == 0);
    if (eval_now) rc = evaluate(r, p);
    read_counters(r, p, t_start);
    if (!rc) rc = log_step(r, p);
    if (!rc && step < r->c->steps && !r->stopped) /* every step, with its metrics line; finish writes the last */
        rc = write_report(r, false, vks_metrics_path(r->metrics));
    return rc;
}

static int finish(rl_run *r, vks_rl_result *res) {
    const vks_rl_config *c = r->c;
    res->next_batch = r->stopped ? r->stop_position : position(r);
    int rc = save_checkpoint(r, res->next_batch, res->final_checkpoint, sizeof res->final_checkpoint);
    snprintf(res->metrics_path, sizeof res->metrics_path, "%s", vks_metrics_path(r->metrics));
    rc = vks_rl_close_metrics(r->metrics, rc); /* also after a failed save: nothing leaks */
    r->metrics = NULL;
    snprintf(res->plot_path, sizeof res->plot_path, "%s/rl.svg", c->out);
    const char *keys[] = {"reward", "accuracy", "trainer_idle", "accept_rate"};
    if (!rc) rc = vks_metrics_plot(res->metrics_path, keys, 4, "RL run: reward, held-out accuracy, trainer idle, accepted",
                                   res->plot_path);
    /* the inference thread is joined: its intervals are final (inference ranks: the trainer's row only) */
    snprintf(res->timeline_path, sizeof res->timeline_path, "%s/timeline.svg", c->out);
    int last_n = r->o->timeline_steps ? r->o->timeline_steps : VKS_RL_TIMELINE_STEPS;
    if (!rc) rc = vks_rl_timeline_write(&r->timeline, r->src ? NULL : &r->gen_timeline, last_n, res->timeline_path,
                                        &res->timeline);
    snprintf(res->report_path, sizeof res->report_path, "%s/report.html", c->out);
    if (!rc) rc = write_report(r, true, res->metrics_path);
    res->n_ranks = get_ranks(r, res->ranks, VKS_RL_MAX_RANK_STATUS);
    vks_rl_counters cn;
    get_counters(r, &cn);
    res->rollouts = cn.rollouts, res->checked = cn.checked, res->accepted = cn.accepted, res->rejected = cn.rejected;
    res->groups_filtered = cn.filtered, res->groups_stale = cn.stale, res->off_policy_dropped = cn.off_policy;
    return rc;
}

int vks_rl_run(const vks_rl_run_options *o, vks_rl_result *res) { return vks_rl_run_source(o, NULL, res); }

int vks_rl_run_source(const vks_rl_run_options *o, const vks_rl_source *src, vks_rl_result *res) {
    int rc = check_options(o);
    if (!rc && src && !src->publish_adapter && o->config->lora_rank > 0)
        rc = vks_set_error(VKS_ERR_ARG, "rl: lora.rank > 0: this source of groups takes no adapters");
    if (!rc && o->config->lora_rank > 0)
        rc = vks_lora_check(&o->model->cfg, o->config->lora_rank, o->config->lora_targets, "rl: lora");
    if (rc || !res) return rc ? rc : vks_set_error(VKS_ERR_ARG, "rl: NULL result");
    memset(res, 0, sizeof *res);
    res->start_accuracy = res->final_accuracy = NAN;
    res->stopped_at_step = -1;
    double t_start = vks_seconds_now(), idle = 0, total = 0;
    rl_run r = {.o = o, .c = o->config, .src = src, .t_start = t_start, .out = {.fd = -1}, .start_accuracy = NAN};
    r.gen.o = o;
    r.gen.episodes_allowed = !src || vks_rl_config_episodes_across_ranks(o->config);
    r.status = (vks_rl_status){.say = o->status, .ctx = o->progress_ctx,
                               .interval_s = o->status_interval_s > 0 ? o->status_interval_s : VKS_RL_STATUS_INTERVAL_S};
    rc = vks_rl_gen_open_tasks(&r.gen); /* a bad task file is refused before OUT is made or locked */
    if (!rc) rc = vks_rl_gen_show_prompt(&r.gen);
    if (!rc) rc = open_start(&r, res);
    if (!rc) rc = open_run(&r, res);
    /* resumed: the run's start accuracy as its checkpoint recorded it (not the resume point's); a fresh run
     * logs its start's evaluation as metrics.jsonl's step 0 (a resumed one keeps that line) */
    if (!rc && !r.start_accuracy_stored) {
        vks_rl_progress p0;
        rc = evaluate(&r, &p0);
        r.start_accuracy = p0.accuracy;
        if (!rc && !r.ck) rc = log_start(&r, &p0);
    }
    res->start_accuracy = r.start_accuracy, res->start_accuracy_stored = r.start_accuracy_stored;
    if (!rc) rc = start_inference(&r);
    if (!rc) rc = write_report(&r, false, vks_metrics_path(r.metrics)); /* the start's */
    vks_rl_progress p = {0};
    while (!rc && vks_trainer_steps(r.trainer) < r.c->steps) {
        if ((rc = one_step(&r, t_start, &idle, &total, &p))) break;
        if (!isnan(p.accuracy)) res->final_accuracy = p.accuracy;
        if (o->progress) o->progress(o->progress_ctx, &p);
        vks_rl_status_said(&r.status, vks_seconds_now());
        /* asked while the step finished: its weights went out already (one process; across ranks the
         * stop lands before the next step's weights go out, where the position is the source's) */
        if (!r.stopped && !r.src && stop_asked(&r)) {
            r.stopped = true;
            r.stop_position = r.published_position;
        }
        if (r.stopped) {
            res->stopped_at_step = vks_trainer_steps(r.trainer);
            break;
        }
    }
    stop_inference(&r);
    if (!rc) rc = finish(&r, res);
    res->trainer_idle = total > 0 ? idle / total : 0;
    res->trained = r.trained, res->trained_rejected = r.trained_rejected;
    res->elapsed_s = run_elapsed(&r);
    run_free(&r);
    return rc;
}
