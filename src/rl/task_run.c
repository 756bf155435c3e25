/* task_run.c: scoring a model on tasks by generation (vks_tasks.h): batched
 * completions of the prompt (in the prompt format, vks_prompt.h) up to EOS on one engine, each keyed by its
 * global sample index (so results do not depend on the batch size), scored by
 * the task verifiers; eval (accuracy, pass@k, per kind) and the offline
 * difficulty filter (solve rates, hard / kept / easy). */
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"
#include "task_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t **ids; /* prompt tokens per task (vks_prompt_tokenize) */
    int *n_ids;
    int longest;
} prompt_set;

static void free_prompts(prompt_set *p, int64_t n) {
    for (int64_t i = 0; p->ids && i < n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n_ids);
}

static int tokenize_prompts(const vks_prompt_format *f, int think, const struct vks_tokenizer *tok, const vks_model *m,
                            const vks_task *tasks, int64_t n, prompt_set *p) {
    p->ids = calloc((size_t)n, sizeof *p->ids);
    p->n_ids = calloc((size_t)n, sizeof *p->n_ids);
    if (!p->ids || !p->n_ids) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int64_t i = 0; i < n; i++) {
        int rc = vks_prompt_tokenize(f, tok, tasks[i].prompt, think, &p->ids[i], &p->n_ids[i]);
        if (rc) return vks_error_prefix(rc, "task %lld", (long long)tasks[i].line);
        for (int k = 0; k < p->n_ids[i]; k++)
            if (p->ids[i][k] < 0 || p->ids[i][k] >= m->cfg.vocab_size)
                return vks_set_error(VKS_ERR_FORMAT, "task %lld: token %d outside the model's vocabulary",
                                     (long long)tasks[i].line, (int)p->ids[i][k]);
        if (p->n_ids[i] >= m->cfg.seq_len)
            return vks_set_error(VKS_ERR_FORMAT, "task %lld: the prompt's %d tokens leave no room in the context of %d",
                                 (long long)tasks[i].line, p->n_ids[i], m->cfg.seq_len);
        if (p->n_ids[i] > p->longest) p->longest = p->n_ids[i];
    }
    return VKS_OK;
}

/* Scores the completions of one batch: sequences first .. first + count of the run (code tasks' tests run
 * in parallel sandboxes: vks_task_score_many). */
static int score_batch(const struct vks_tokenizer *tok, const vks_task *tasks, const vks_task_run_options *o,
                       int max_new, vks_sequence *seqs, int64_t first, int count, double *rewards, int *lengths) {
    if (count < 1) return VKS_OK;
    char **texts = calloc((size_t)count, sizeof *texts);
    size_t *lens = calloc((size_t)count, sizeof *lens);
    const vks_task **which = calloc((size_t)count, sizeof *which);
    int rc = texts && lens && which ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int b = 0; rc == VKS_OK && b < count; b++) {
        const vks_sequence *s = &seqs[b];
        int n_new = s->n_ids - s->n_prompt;
        if (n_new > max_new) n_new = max_new;
        rc = vks_tokenizer_detokenize(tok, s->ids + s->n_prompt, n_new, false, &texts[b], &lens[b]);
        which[b] = &tasks[(first + b) / o->samples];
        lengths[first + b] = n_new;
    }
    if (rc == VKS_OK)
        rc = vks_task_score_many_into(which, (const char *const *)texts, lens, count, 0, rewards + first, NULL,
                                      o->metrics);
    for (int b = 0; rc == VKS_OK && o->on_completion && b < count; b++)
        o->on_completion(o->completion_ctx, which[b], first + b, texts[b], lens[b], lengths[first + b],
                         rewards[first + b]);
    for (int b = 0; texts && b < count; b++) free(texts[b]);
    free(texts), free(lens), free(which);
    return rc;
}

static int run_batches(vks_engine *e, const struct vks_tokenizer *tok, const vks_task *tasks, int64_t total,
                       const prompt_set *p, const vks_task_run_options *o, const vks_generate_options *go, int batch,
                       int max_new, double *rewards, int *lengths) {
    vks_sequence *seqs = calloc((size_t)batch, sizeof *seqs);
    int rc = seqs ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int64_t first = 0; rc == VKS_OK && first < total; first += batch) {
        int count = total - first < batch ? (int)(total - first) : batch;
        for (int b = 0; b < count && rc == VKS_OK; b++) {
            int64_t task = (first + b) / o->samples;
            seqs[b] = (vks_sequence){.n_prompt = p->n_ids[task], .n_ids = p->n_ids[task], .stop_token = -1};
            seqs[b].ids = malloc(sizeof(int32_t) * (size_t)p->n_ids[task]);
            if (!seqs[b].ids) rc = vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
            else memcpy(seqs[b].ids, p->ids[task], sizeof(int32_t) * (size_t)p->n_ids[task]);
        }
        if (rc == VKS_OK) rc = vks_generate(e, go, seqs, count, (uint32_t)first);
        if (rc == VKS_OK) rc = score_batch(tok, tasks, o, max_new, seqs, first, count, rewards, lengths);
        for (int b = 0; b < count; b++) vks_sequence_free(&seqs[b]);
        if (rc == VKS_OK && o->progress) o->progress(o->progress_ctx, first + count, total);
    }
    free(seqs);
    return rc;
}

/* Batches of episodes: started, turned until every one is over, scored (the environment's reward when it said
 * done, else 0), reported as completions are. Sample i's environment seed and sampler sequence index are i. */
static int run_episodes(vks_engine *e, const vks_prompt_format *f, const struct vks_tokenizer *tok,
                        const vks_model *m, const vks_task *tasks, int64_t total, const vks_task_run_options *o,
                        const vks_generate_options *go, int batch, int max_new, double *rewards, int *lengths) {
    vks_episode *xs = calloc((size_t)batch, sizeof *xs);
    const vks_task **which = calloc((size_t)batch, sizeof *which);
    uint32_t *index = calloc((size_t)batch, sizeof *index);
    int rc = xs && which && index ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    for (int64_t first = 0; rc == VKS_OK && first < total; first += batch) {
        int count = total - first < batch ? (int)(total - first) : batch;
        for (int b = 0; b < count && !rc; b++) {
            which[b] = &tasks[(first + b) / o->samples], index[b] = (uint32_t)(first + b);
            rc = vks_episode_start(f, tok, m->cfg.vocab_size, m->cfg.seq_len, which[b], (uint64_t)(first + b),
                                   o->think_tokens, &xs[b]);
        }
        if (!rc) rc = vks_episodes_run(e, go, f, tok, which, index, count, max_new, NULL, xs);
        for (int b = 0; b < count && !rc; b++) {
            rewards[first + b] = xs[b].ep.done ? xs[b].ep.reward : 0;
            if (xs[b].ep.done && xs[b].ep.metrics[0] && o->metrics) vks_task_metrics_add(o->metrics, xs[b].ep.metrics);
            lengths[first + b] = xs[b].generated;
            char *text = NULL;
            size_t len = 0;
            if (o->on_completion) rc = vks_episode_text(&xs[b], &text, &len);
            if (!rc && o->on_completion)
                o->on_completion(o->completion_ctx, which[b], first + b, text, len, lengths[first + b],
                                 rewards[first + b]);
            free(text);
        }
        for (int b = 0; b < count; b++) vks_episode_free(&xs[b]);
        if (rc == VKS_OK && o->progress) o->progress(o->progress_ctx, first + count, total);
    }
    free(xs), free(which), free(index);
    return rc;
}

/* Environment tasks run as episodes: all of the set or none. */
static int episodes_wanted(const vks_task *tasks, int64_t n, bool *wanted) {
    const vks_task *env = vks_task_first_environment(tasks, n);
    *wanted = env != NULL;
    if (!env) return VKS_OK;
    for (int64_t i = 0; i < n; i++)
        if (tasks[i].verify != VKS_VERIFY_ENVIRONMENT)
            return vks_set_error(VKS_ERR_FORMAT, "task %lld is an environment and task %lld is not: a set of tasks "
                                 "with episodes runs environment tasks only (for now)", (long long)env->line,
                                 (long long)tasks[i].line);
    return VKS_OK;
}

int vks_task_run(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks, int64_t n,
                 const vks_task_run_options *o, double *rewards, int *lengths) {
    if (!g || !m || !tok || !tasks || n < 1 || !o || o->samples < 1 || o->max_new_tokens < 0 || o->batch < 0 ||
        o->think_tokens < 0 ||
        !rewards || !lengths || n > INT64_MAX / o->samples || n * o->samples > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "tasks: bad arguments");
    if (vks_task_first_code(tasks, n) && vks_sandbox_check()) /* before anything is generated */
        return vks_error_prefix(VKS_ERR_IO, "code tasks");
    int max_new = o->max_new_tokens ? o->max_new_tokens : 256, batch = o->batch ? o->batch : 64;
    int64_t total = n * o->samples;
    if (total < batch) batch = (int)total;
    vks_prompt_format raw;
    vks_prompt_format_default(&raw);
    const vks_prompt_format *f = o->prompt ? o->prompt : &raw;
    prompt_set p = {0};
    bool episodes = false;
    int rc = episodes_wanted(tasks, n, &episodes);
    if (rc == VKS_OK && o->show_prompt) { /* the first prompt as the model gets it */
        char *text = NULL;
        size_t len = 0;
        if (episodes) /* what the environment starts the first episode (seed 0) with */
            rc = vks_episode_start_text(f, tok, m->cfg.vocab_size, m->cfg.seq_len, &tasks[0], 0, o->think_tokens, &text, &len);
        else rc = vks_prompt_text(f, vks_tokenizer_chat_template(tok), tasks[0].prompt, o->think_tokens, &text, &len);
        if (rc == VKS_OK) o->show_prompt(o->progress_ctx, text, len);
        free(text);
    }
    if (rc == VKS_OK && !episodes) rc = tokenize_prompts(f, o->think_tokens, tok, m, tasks, n, &p);
    /* steps count positions, prompt included, and the token sampled at the last one is kept: the longest
     * prompt gets max_new tokens (within the context); completions of shorter ones are cut at max_new.
     * Episodes (their starts come from their environments) get the whole context. */
    int steps = !episodes && p.longest + max_new - 1 < m->cfg.seq_len ? p.longest + max_new - 1 : m->cfg.seq_len;
    vks_engine_options eo = o->engine;
    eo.layer_begin = eo.layer_end = 0;
    eo.n_slots = batch, eo.kv_len = steps, eo.max_rows = 256, eo.max_out_rows = batch, eo.f32_math = true;
    vks_engine *e = NULL;
    if (rc == VKS_OK) rc = vks_engine_create(g, m, &eo, &e);
    if (rc == VKS_OK && o->lora) rc = vks_engine_set_lora(e, o->lora);
    vks_generate_options go = {.sched = {.steps = steps, .temperature = o->temperature, .top_p = 1.0f, .top_k = 0,
                                         .seed = o->seed, .stop_token_a = vks_tokenizer_eos(tok), .stop_token_b = -1}};
    if (rc == VKS_OK && episodes) rc = run_episodes(e, f, tok, m, tasks, total, o, &go, batch, max_new, rewards, lengths);
    else if (rc == VKS_OK) rc = run_batches(e, tok, tasks, total, &p, o, &go, batch, max_new, rewards, lengths);
    vks_engine_destroy(e);
    free_prompts(&p, n);
    return rc;
}

double vks_task_pass_at_k(int n, int c, int k) {
    if (n < 1 || c < 0 || c > n || k < 1 || k > n) return NAN;
    if (n - c < k) return 1.0;
    /* C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i): no large binomials */
    double fail = 1.0;
    for (int i = n - c + 1; i <= n; i++) fail *= 1.0 - (double)k / (double)i;
    return 1.0 - fail;
}

/* The kinds of tasks[0..n) in order of first appearance; kind_of[i] indexes them. */
static int collect_kinds(const vks_task *tasks, int64_t n, vks_task_eval_result *r, int *kind_of) {
    for (int64_t i = 0; i < n; i++) {
        int k = 0;
        while (k < r->n_kinds && strcmp(r->kinds[k].kind, tasks[i].kind)) k++;
        if (k == r->n_kinds) {
            if (k == VKS_TASK_MAX_KINDS)
                return vks_set_error(VKS_ERR_FORMAT, "task %lld: more than %d task kinds", (long long)tasks[i].line,
                                     VKS_TASK_MAX_KINDS);
            snprintf(r->kinds[k].kind, sizeof r->kinds[k].kind, "%s", tasks[i].kind);
            r->n_kinds++;
        }
        kind_of[i] = k;
    }
    return VKS_OK;
}

/* k = 1, 2, 4, ... below samples, then samples. */
static void pass_ks(vks_task_eval_result *r, int samples) {
    r->n_pass = 0;
    for (int k = 1; k < samples && r->n_pass < VKS_TASK_MAX_PASS - 1; k *= 2) r->pass_k[r->n_pass++] = k;
    r->pass_k[r->n_pass++] = samples;
}

static void summarise(int64_t n, int samples, const double *rewards, const int *lengths, const int *kind_of,
                      vks_task_eval_result *r) {
    double correct_sum = 0, sum_len = 0, kind_correct[VKS_TASK_MAX_KINDS] = {0};
    for (int64_t i = 0; i < n; i++) {
        int c = 0;
        for (int j = 0; j < samples; j++) c += rewards[i * samples + j] >= 1.0, sum_len += lengths[i * samples + j];
        r->solved += c > 0;
        correct_sum += c;
        kind_correct[kind_of[i]] += c;
        r->kinds[kind_of[i]].n++;
        for (int p = 0; p < r->n_pass; p++) r->pass_at[p] += vks_task_pass_at_k(samples, c, r->pass_k[p]);
    }
    r->n = n;
    r->samples = samples;
    r->accuracy = correct_sum / ((double)n * samples);
    r->mean_length = sum_len / ((double)n * samples);
    for (int p = 0; p < r->n_pass; p++) r->pass_at[p] /= (double)n;
    for (int k = 0; k < r->n_kinds; k++) r->kinds[k].accuracy = kind_correct[k] / ((double)r->kinds[k].n * samples);
}

int vks_task_eval_score(const vks_task *tasks, int64_t n, int samples, const double *rewards, const int *lengths,
                        vks_task_eval_result *r) {
    if (!tasks || !rewards || !lengths || !r || n < 1 || samples < 1 || samples > 1 << 20)
        return vks_set_error(VKS_ERR_ARG, "task eval: bad arguments");
    memset(r, 0, sizeof *r);
    int *kind_of = malloc(sizeof *kind_of * (size_t)n);
    int rc = kind_of ? collect_kinds(tasks, n, r, kind_of) : vks_set_error(VKS_ERR_NOMEM, "task eval: out of memory");
    pass_ks(r, samples);
    if (rc == VKS_OK) summarise(n, samples, rewards, lengths, kind_of, r);
    free(kind_of);
    return rc;
}

int vks_task_eval_tasks(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks,
                        int64_t n, const vks_task_run_options *o, vks_task_eval_result *r) {
    if (!tasks || !o || !r || n < 1 || o->samples < 1 || n > INT64_MAX / o->samples)
        return vks_set_error(VKS_ERR_ARG, "task eval: bad arguments");
    size_t runs = (size_t)n * (size_t)o->samples;
    double *rewards = calloc(runs, sizeof *rewards);
    int *lengths = calloc(runs, sizeof *lengths);
    vks_task_run_options with = *o; /* the metrics go to a sink of this evaluation's own (and on to o's) */
    int rc = rewards && lengths ? vks_task_metrics_create(&with.metrics)
                                : vks_set_error(VKS_ERR_NOMEM, "task eval: out of memory");
    if (rc == VKS_OK) rc = vks_task_eval_score(tasks, n, o->samples, rewards, lengths, r); /* the kinds, checked first */
    if (rc == VKS_OK) rc = vks_task_run(g, m, tok, tasks, n, &with, rewards, lengths);
    if (rc == VKS_OK) rc = vks_task_eval_score(tasks, n, o->samples, rewards, lengths, r);
    if (rc == VKS_OK)
        r->n_metrics = vks_task_metrics_take(with.metrics, r->metric_names, r->metric_means, VKS_TASK_MAX_METRICS);
    for (int i = 0; rc == VKS_OK && o->metrics && i < r->n_metrics; i++) {
        char one[VKS_TASK_METRIC_NAME + 64];
        snprintf(one, sizeof one, "{\"%s\": %.17g}", r->metric_names[i], r->metric_means[i]);
        vks_task_metrics_add(o->metrics, one);
    }
    vks_task_metrics_free(with.metrics);
    free(rewards);
    free(lengths);
    return rc;
}

int vks_task_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task_spec *spec,
                  uint64_t seed, int64_t n, const vks_task_run_options *o, vks_task_eval_result *r) {
    if (!spec || !o || !r || n < 1 || n > UINT32_MAX) return vks_set_error(VKS_ERR_ARG, "task eval: bad arguments");
    memset(r, 0, sizeof *r);
    vks_task *tasks = malloc(sizeof *tasks * (size_t)n);
    int rc = tasks ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "task eval: out of memory");
    for (int64_t i = 0; rc == VKS_OK && i < n; i++) rc = vks_task_generate(spec, seed, (uint32_t)i, &tasks[i]);
    if (rc == VKS_OK) rc = vks_task_eval_tasks(g, m, tok, tasks, n, o, r);
    free(tasks);
    return rc;
}

void vks_task_filter_classify(const double *rewards, int64_t n, int samples, double min_rate, double max_rate,
                              double *rates, bool *keep, vks_task_filter_counts *c) {
    *c = (vks_task_filter_counts){.total = n};
    for (int64_t i = 0; i < n; i++) {
        double sum = 0;
        for (int j = 0; j < samples; j++) sum += rewards[i * samples + j];
        rates[i] = sum / samples;
        keep[i] = rates[i] >= min_rate && rates[i] <= max_rate;
        c->hard += rates[i] < min_rate;
        c->easy += rates[i] > max_rate;
        c->kept += keep[i];
    }
}

static const char *verdict(double rate, double min_rate, double max_rate) {
    return rate < min_rate ? "hard" : rate > max_rate ? "easy" : "kept";
}

static int write_rates(const char *path, const vks_task *tasks, int64_t n, int samples, const double *rewards,
                       const double *rates, double min_rate, double max_rate) {
    vks_outfile out;
    int rc = vks_outfile_open(&out, path, 0666);
    if (rc) return rc;
    bool ok = true;
    for (int64_t i = 0; ok && i < n; i++) {
        int solved = 0;
        for (int j = 0; j < samples; j++) solved += rewards[i * samples + j] >= 1.0;
        json_t *o = json_pack("{s:I, s:s, s:i, s:i, s:f, s:s}", "line", (json_int_t)tasks[i].line, "kind", tasks[i].kind,
                              "solved", solved, "samples", samples, "solve_rate", rates[i], "verdict",
                              verdict(rates[i], min_rate, max_rate));
        char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) : NULL;
        ok = s && fprintf(out.f, "%s\n", s) > 0;
        free(s);
        json_decref(o);
    }
    return vks_outfile_finish(&out, ok);
}

/* The kept tasks, in file order. */
static int write_kept(const char *in_path, const char *out_path, const vks_task *tasks, const bool *keep, int64_t n) {
    vks_task *kept = malloc(sizeof *kept * (size_t)(n ? n : 1));
    if (!kept) return vks_set_error(VKS_ERR_NOMEM, "tasks filter: out of memory");
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (keep[i]) kept[k++] = tasks[i];
    int rc = vks_task_file_copy(in_path, kept, k, out_path);
    free(kept);
    return rc;
}

int vks_task_filter(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *tasks_path,
                    const char *out_path, const char *rates_path, double min_rate, double max_rate,
                    const vks_task_run_options *o, vks_task_filter_counts *counts) {
    if (!tasks_path || !out_path || !o || o->samples < 1 || !counts || !(min_rate <= max_rate))
        return vks_set_error(VKS_ERR_ARG, "tasks filter: bad arguments");
    memset(counts, 0, sizeof *counts);
    vks_task *tasks = NULL;
    int64_t n = 0;
    int rc = vks_task_file_load(tasks_path, &tasks, &n);
    if (rc) return rc;
    size_t runs = (size_t)n * (size_t)o->samples;
    double *rewards = malloc(sizeof *rewards * runs), *rates = malloc(sizeof *rates * (size_t)n);
    int *lengths = malloc(sizeof *lengths * runs);
    bool *keep = calloc((size_t)n, sizeof *keep);
    rc = rewards && rates && lengths && keep ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks filter: out of memory");
    if (rc == VKS_OK) rc = vks_task_run(g, m, tok, tasks, n, o, rewards, lengths);
    if (rc == VKS_OK) vks_task_filter_classify(rewards, n, o->samples, min_rate, max_rate, rates, keep, counts);
    if (rc == VKS_OK) rc = write_kept(tasks_path, out_path, tasks, keep, n);
    if (rc == VKS_OK && rates_path) rc = write_rates(rates_path, tasks, n, o->samples, rewards, rates, min_rate, max_rate);
    vks_task_free(tasks, n);
    free(rewards);
    free(rates);
    free(lengths);
    free(keep);
    return rc;
}
