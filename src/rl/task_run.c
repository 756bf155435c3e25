/* task_run.c: scoring a model on tasks by generation (vks_tasks.h): batched
 * completions of BOS + prompt up to EOS on one engine, each keyed by its
 * global sample index (so results do not depend on the batch size), scored by
 * the task verifiers; eval on fresh instances and the offline difficulty filter. */
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"
#include "task_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t **ids; /* BOS + prompt tokens per task */
    int *n_ids;
    int longest;
} prompt_set;

static void free_prompts(prompt_set *p, int64_t n) {
    for (int64_t i = 0; p->ids && i < n; i++) free(p->ids[i]);
    free(p->ids);
    free(p->n_ids);
}

static int tokenize_prompts(const struct vks_tokenizer *tok, const vks_model *m, const vks_task *tasks, int64_t n,
                            prompt_set *p) {
    p->ids = calloc((size_t)n, sizeof *p->ids);
    p->n_ids = calloc((size_t)n, sizeof *p->n_ids);
    if (!p->ids || !p->n_ids) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    vks_tokenize_options to = {.add_bos = true, .add_eos = false, .parse_special = false};
    for (int64_t i = 0; i < n; i++) {
        int rc = vks_tokenizer_tokenize(tok, tasks[i].prompt, strlen(tasks[i].prompt), &to, &p->ids[i], &p->n_ids[i]);
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

/* Scores the completions of one batch: sequences first .. first + count of the run. */
static int score_batch(const struct vks_tokenizer *tok, const vks_task *tasks, int samples, int max_new,
                       vks_sequence *seqs, int64_t first, int count, double *rewards, int *lengths) {
    for (int b = 0; b < count; b++) {
        const vks_sequence *s = &seqs[b];
        int n_new = s->n_ids - s->n_prompt;
        if (n_new > max_new) n_new = max_new;
        char *text = NULL;
        size_t len = 0;
        int rc = vks_tokenizer_detokenize(tok, s->ids + s->n_prompt, n_new, false, &text, &len);
        if (rc) return rc;
        rewards[first + b] = vks_task_score(&tasks[(first + b) / samples], text, len);
        lengths[first + b] = n_new;
        free(text);
    }
    return VKS_OK;
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
        if (rc == VKS_OK) rc = score_batch(tok, tasks, o->samples, max_new, seqs, first, count, rewards, lengths);
        for (int b = 0; b < count; b++) vks_sequence_free(&seqs[b]);
        if (rc == VKS_OK && o->progress) o->progress(o->progress_ctx, first + count, total);
    }
    free(seqs);
    return rc;
}

int vks_task_run(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks, int64_t n,
                 const vks_task_run_options *o, double *rewards, int *lengths) {
    if (!g || !m || !tok || !tasks || n < 1 || !o || o->samples < 1 || o->max_new_tokens < 0 || o->batch < 0 ||
        !rewards || !lengths || n > INT64_MAX / o->samples || n * o->samples > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "tasks: bad arguments");
    int max_new = o->max_new_tokens ? o->max_new_tokens : 256, batch = o->batch ? o->batch : 64;
    int64_t total = n * o->samples;
    if (total < batch) batch = (int)total;
    prompt_set p = {0};
    int rc = tokenize_prompts(tok, m, tasks, n, &p);
    /* steps count positions, prompt included: the longest prompt plus max_new, within the context */
    int steps = p.longest + max_new < m->cfg.seq_len ? p.longest + max_new : m->cfg.seq_len;
    vks_engine_options eo = o->engine;
    eo.layer_begin = eo.layer_end = 0;
    eo.n_slots = batch, eo.kv_len = steps, eo.max_rows = 256, eo.max_out_rows = batch, eo.f32_math = true;
    vks_engine *e = NULL;
    if (rc == VKS_OK) rc = vks_engine_create(g, m, &eo, &e);
    vks_generate_options go = {.sched = {.steps = steps, .temperature = o->temperature, .top_p = 1.0f, .top_k = 0,
                                         .seed = o->seed, .stop_token_a = vks_tokenizer_eos(tok), .stop_token_b = -1}};
    if (rc == VKS_OK) rc = run_batches(e, tok, tasks, total, &p, o, &go, batch, max_new, rewards, lengths);
    vks_engine_destroy(e);
    free_prompts(&p, n);
    return rc;
}

int vks_task_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task_spec *spec,
                  uint64_t seed, int64_t n, const vks_task_run_options *o, vks_task_eval_result *r) {
    if (!spec || !o || !r || n < 1 || n > UINT32_MAX) return vks_set_error(VKS_ERR_ARG, "task eval: bad arguments");
    memset(r, 0, sizeof *r);
    vks_task *tasks = malloc(sizeof *tasks * (size_t)n);
    double *rewards = malloc(sizeof *rewards * (size_t)n);
    int *lengths = malloc(sizeof *lengths * (size_t)n);
    int rc = tasks && rewards && lengths ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "task eval: out of memory");
    for (int64_t i = 0; rc == VKS_OK && i < n; i++) rc = vks_task_generate(spec, seed, (uint32_t)i, &tasks[i]);
    vks_task_run_options one = *o;
    one.samples = 1;
    if (rc == VKS_OK) rc = vks_task_run(g, m, tok, tasks, n, &one, rewards, lengths);
    double sum_len = 0;
    for (int64_t i = 0; rc == VKS_OK && i < n; i++) r->solved += rewards[i] >= 1.0, sum_len += lengths[i];
    if (rc == VKS_OK) {
        r->n = n;
        r->accuracy = (double)r->solved / (double)n;
        r->mean_length = sum_len / (double)n;
    }
    free(tasks);
    free(rewards);
    free(lengths);
    return rc;
}

/* Copies the lines of `in` whose flag is set (lines are numbered from 1, as tasks[].line). */
static int copy_kept_lines(const char *in_path, const char *out_path, const vks_task *tasks, const bool *keep,
                           int64_t n) {
    FILE *in = fopen(in_path, "rb");
    if (!in) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", in_path, strerror(errno));
    vks_outfile out;
    char *line = malloc(VKS_TASK_MAX_LINE + 1);
    int rc = line ? vks_outfile_open(&out, out_path, 0666) : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc) { free(line); fclose(in); return rc; }
    size_t len;
    bool too_long = false, ok = true;
    int64_t line_no = 0, t = 0;
    while (ok && !too_long && vks_task_read_line(in, line, VKS_TASK_MAX_LINE, &len, &too_long)) {
        line_no++;
        while (t < n && tasks[t].line < line_no) t++;
        if (!too_long && t < n && tasks[t].line == line_no && keep[t])
            ok = fwrite(line, 1, len, out.f) == len && fputc('\n', out.f) != EOF;
    }
    if (ferror(in)) ok = false, errno = EIO;
    free(line);
    fclose(in);
    if (!too_long) return vks_outfile_finish(&out, ok);
    vks_outfile_abort(&out);
    return vks_set_error(VKS_ERR_FORMAT, "%s: line %lld: longer than %d bytes (the file changed while it was read)", in_path,
                         (long long)line_no, VKS_TASK_MAX_LINE);
}

int vks_task_filter(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *tasks_path,
                    const char *out_path, double min_rate, double max_rate, const vks_task_run_options *o,
                    int64_t *kept, int64_t *total) {
    if (!tasks_path || !out_path || !o || o->samples < 1 || !kept || !total || !(min_rate <= max_rate))
        return vks_set_error(VKS_ERR_ARG, "tasks filter: bad arguments");
    vks_task *tasks = NULL;
    int64_t n = 0;
    int rc = vks_task_file_load(tasks_path, &tasks, &n);
    if (rc) return rc;
    size_t runs = (size_t)n * (size_t)o->samples;
    double *rewards = malloc(sizeof *rewards * runs);
    int *lengths = malloc(sizeof *lengths * runs);
    bool *keep = calloc((size_t)n, sizeof *keep);
    rc = rewards && lengths && keep ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tasks filter: out of memory");
    if (rc == VKS_OK) rc = vks_task_run(g, m, tok, tasks, n, o, rewards, lengths);
    *kept = 0;
    *total = n;
    for (int64_t i = 0; rc == VKS_OK && i < n; i++) {
        double sum = 0;
        for (int j = 0; j < o->samples; j++) sum += rewards[i * o->samples + j];
        double rate = sum / o->samples;
        keep[i] = rate >= min_rate && rate <= max_rate;
        *kept += keep[i];
    }
    if (rc == VKS_OK) rc = copy_kept_lines(tasks_path, out_path, tasks, keep, n);
    free(tasks);
    free(rewards);
    free(lengths);
    free(keep);
    return rc;
}
