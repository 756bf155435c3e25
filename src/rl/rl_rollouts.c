/* rl_rollouts.c: the RL run's inference thread (vks_rl.h): batches of
 * prompts_per_step tasks x group_size completions with the newest policy it
 * may use, scored by the task verifiers (and the thinking budget), checked by
 * the verifier (TOPLOC proofs and the sampling replay, vks_verify_batch_cpu,
 * on a rollout file it writes per batch), turned into group advantages over
 * the accepted completions; groups without signal are dropped (online filter),
 * the others go to the trainer while the async window allows. The thread
 * records what it did when (its timeline: waits, weight loads, generation,
 * verification). */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rl_internal.h"
#include "task_internal.h"
#include "vkswarm/vks_difficulty_pool.h"
#include "vkswarm/vks_grpo.h"
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_philox.h"
#include "vkswarm/vks_rollout.h"
#include "vkswarm/vks_tokenizer.h"
#include "vkswarm/vks_toploc.h"

void vks_rl_group_free(vks_rl_batch_group *g) {
    for (int i = 0; g->samples && i < g->n; i++)
        free(g->samples[i].tokens), free(g->samples[i].logp), free(g->samples[i].trained);
    free(g->samples);
    g->samples = NULL;
    g->n = 0;
}

/* One generation batch in flight. */
typedef struct {
    vks_task *tasks;        /* P */
    int32_t **prompt_ids;   /* P: BOS + prompt */
    int *prompt_lens;
    vks_sequence *seqs;     /* P * G */
    vks_verdict *verdicts;  /* P * G, when verifying */
    double *task_reward, *reward;
    int *lengths;           /* completion tokens kept for training (stop token included) */
    uint8_t **trained;      /* P * G, episodes: which completion tokens are the model's (vks_rl_sample.trained) */
    int longest_prompt;
} gen_batch;

static void batch_free(gen_batch *b, int P, int n) {
    for (int p = 0; b->prompt_ids && p < P; p++) free(b->prompt_ids[p]);
    for (int i = 0; b->seqs && i < n; i++) vks_sequence_free(&b->seqs[i]);
    for (int i = 0; b->trained && i < n; i++) free(b->trained[i]);
    free(b->trained);
    free(b->tasks), free(b->prompt_ids), free(b->prompt_lens), free(b->seqs), free(b->verdicts);
    free(b->task_reward), free(b->reward), free(b->lengths);
}

static int batch_alloc(gen_batch *b, int P, int n) {
    memset(b, 0, sizeof *b);
    b->tasks = calloc((size_t)P, sizeof *b->tasks);
    b->prompt_ids = calloc((size_t)P, sizeof *b->prompt_ids);
    b->prompt_lens = calloc((size_t)P, sizeof *b->prompt_lens);
    b->seqs = calloc((size_t)n, sizeof *b->seqs);
    b->verdicts = calloc((size_t)n, sizeof *b->verdicts);
    b->task_reward = calloc((size_t)n, sizeof *b->task_reward);
    b->reward = calloc((size_t)n, sizeof *b->reward);
    b->lengths = calloc((size_t)n, sizeof *b->lengths);
    b->trained = calloc((size_t)n, sizeof *b->trained);
    if (b->tasks && b->prompt_ids && b->prompt_lens && b->seqs && b->verdicts && b->task_reward && b->reward && b->lengths &&
        b->trained)
        return VKS_OK;
    return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
}

/* Task `index` of the run: a built-in instance or a user task (cycled, or the difficulty pool's draw), and
 * its thinking-budget target when the run has length targets (0: none). */
static int make_task(const vks_rl_gen *g, int64_t index, vks_task *t, int *target) {
    const vks_rl_config *c = g->o->config;
    int64_t line = g->tasks ? index % g->n_tasks : 0;
    int rc = g->pool ? vks_difficulty_pool_task(g->pool, index, &line) : VKS_OK;
    if (!rc) rc = g->tasks ? (*t = g->tasks[line], VKS_OK) : vks_task_generate(&g->spec, c->seed, (uint32_t)index, t);
    if (!rc && g->reward_program) t->verify = VKS_VERIFY_PROGRAM, t->program = g->reward_program; /* config "reward" */
    *target = 0;
    if (rc || !c->n_length_targets) return rc;
    uint32_t draw = vks_philox_u32(c->seed, (uint32_t)index, 0x1e46u, 0);
    *target = c->length_targets[draw % (uint32_t)c->n_length_targets];
    return VKS_OK;
}

int vks_rl_gen_task(const vks_rl_gen *g, int64_t index, vks_task *t) {
    int target;
    if (!g || !t || index < 0 || (g->tasks && g->n_tasks < 1)) return vks_set_error(VKS_ERR_ARG, "vks_rl_gen_task: bad argument");
    return make_task(g, index, t, &target);
}

/* The prompt of task t with its target, rendered in the run's prompt format
 * (vks_prompt.h): what generation feeds and every check compares against. */
static int tokenize_prompt(const vks_rl_gen *g, const vks_task *t, int target, int32_t **ids, int *n) {
    const vks_model_config *cf = &g->model->cfg;
    int rc = vks_prompt_tokenize(&g->o->config->prompt, g->o->tok, t->prompt, target, ids, n);
    if (rc) return vks_error_prefix(rc, "task %lld", (long long)t->line);
    for (int k = 0; k < *n; k++)
        if ((*ids)[k] < 0 || (*ids)[k] >= cf->vocab_size)
            return vks_set_error(VKS_ERR_FORMAT, "task %lld: token %d outside the vocabulary", (long long)t->line, (*ids)[k]);
    if (*n + g->o->config->max_new_tokens > cf->seq_len)
        return vks_set_error(VKS_ERR_FORMAT, "task %lld: %d prompt tokens + max_new_tokens %d exceed the context of %d",
                             (long long)t->line, *n, g->o->config->max_new_tokens, cf->seq_len);
    return VKS_OK;
}

int vks_rl_gen_show_prompt(const vks_rl_gen *g) {
    vks_task t;
    char *text = NULL;
    size_t len = 0;
    int target = 0, rc = make_task(g, 0, &t, &target);
    const vks_model_config *mc = &g->o->model->cfg; /* the run's start model: the policy's shape */
    if (!rc && g->episodes) /* what the environment starts it with (the run's first episode: seed 0) */
        rc = vks_episode_start_text(&g->o->config->prompt, g->o->tok, mc->vocab_size, mc->seq_len, &t, 0, target,
                                    &text, &len);
    else if (!rc)
        rc = vks_prompt_text(&g->o->config->prompt, vks_tokenizer_chat_template(g->o->tok), t.prompt, target, &text, &len);
    if (!rc && g->o->show_prompt) g->o->show_prompt(g->o->progress_ctx, text, len);
    free(text);
    return rc;
}

static int prepare_batch(const vks_rl_gen *g, gen_batch *b, int n_prompts, int *targets) {
    const vks_rl_config *c = g->o->config;
    int P = c->prompts_per_step, G = c->group_size;
    for (int p = 0; p < n_prompts; p++) {
        int rc = make_task(g, g->batch * P + p, &b->tasks[p], &targets[p]);
        if (rc || g->episodes) { /* an episode's prompt is its environment's start (run_episodes) */
            if (rc) return rc;
            continue;
        }
        rc = tokenize_prompt(g, &b->tasks[p], targets[p], &b->prompt_ids[p], &b->prompt_lens[p]);
        if (rc) return rc;
        if (b->prompt_lens[p] > b->longest_prompt) b->longest_prompt = b->prompt_lens[p];
        for (int j = 0; j < G; j++) {
            vks_sequence *s = &b->seqs[p * G + j];
            s->ids = malloc(sizeof(int32_t) * (size_t)b->prompt_lens[p]);
            if (!s->ids) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
            memcpy(s->ids, b->prompt_ids[p], sizeof(int32_t) * (size_t)b->prompt_lens[p]);
            s->n_prompt = s->n_ids = b->prompt_lens[p];
            s->stop_token = -1;
        }
    }
    return VKS_OK;
}

/* One completion's text (up to a final stop token) for scoring, after its prompt (the task's, ids[0..n)) and
 * stop tokens are checked; *n_new its tokens. */
static int completion_text(const vks_rl_gen *g, int64_t task_index, const int32_t *ids, int n, const vks_rl_sample *s,
                           char **text, size_t *len, int *n_new, char *err, size_t cap) {
    if (n != s->prompt_len || memcmp(ids, s->tokens, sizeof(int32_t) * (size_t)n)) {
        snprintf(err, cap, "the prompt is not task %lld's", (long long)task_index);
        return VKS_ERR_FORMAT;
    }
    /* a stop token can only end a completion (it stops the sampler) */
    int eos = vks_tokenizer_eos(g->o->tok);
    *n_new = s->completion_len;
    if (*n_new > 0 && s->tokens[s->prompt_len + *n_new - 1] == eos) --*n_new;
    for (int k = 0; k < *n_new; k++)
        if (s->tokens[s->prompt_len + k] == eos) {
            snprintf(err, cap, "a stop token inside the completion");
            return VKS_ERR_FORMAT;
        }
    int rc = vks_tokenizer_detokenize(g->o->tok, s->tokens + s->prompt_len, *n_new, false, text, len);
    if (rc) snprintf(err, cap, "%s", vks_last_error());
    return rc;
}

/* Environment seed of sample j of task `task_index`: its index among the run's samples (what a replay of the
 * episode is given again). */
static uint64_t episode_seed(const vks_rl_gen *g, int64_t task_index, int j) {
    return (uint64_t)task_index * (uint64_t)g->o->config->group_size + (uint64_t)j;
}

/* Sample s of an episode task replayed through its environment (the trainer's check of a completion from
 * another rank): started with the sample's seed (one of its task's), each run of the model's own tokens stepped
 * through the environment as generation stepped it; the conversation (replies included), where it ends and
 * the mask must be what the environment gives. *task_reward: the environment's; *own: the model's tokens. */
static int replay_episode(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, double *task_reward,
                          int *own, char *err, size_t cap) {
    const vks_rl_config *c = g->o->config;
    const vks_model_config *mc = &g->model->cfg;
    uint64_t first = episode_seed(g, task_index, 0);
    vks_task t;
    vks_episode x = {0};
    int target = 0, rc = make_task(g, task_index, &t, &target);
    const char *why = NULL;
    if (!rc && (!s->trained || s->episode_seed < first || s->episode_seed - first >= (uint64_t)c->group_size))
        why = "not an episode of its task (its seed or mask)";
    if (!rc && !why) rc = vks_episode_start(&c->prompt, g->o->tok, mc->vocab_size, mc->seq_len, &t, s->episode_seed,
                                            target, &x);
    if (!rc && !why && (x.n_ids != s->prompt_len || memcmp(x.ids, s->tokens, sizeof(int32_t) * (size_t)x.n_ids)))
        why = "the prompt is not its environment's start";
    int at = 0; /* tokens of the completion replayed */
    while (!rc && !why && at < s->completion_len && !x.over) {
        int end = at;
        while (end < s->completion_len && s->trained[end]) end++;
        if (end == at) {
            why = "its conversation is not what the environment gave (a forged reply)";
            break;
        }
        rc = vks_episode_replay_turn(&c->prompt, g->o->tok, &t, c->max_new_tokens, mc->seq_len, &x,
                                     s->tokens + s->prompt_len + at, end - at);
        if (!rc && (x.n_ids > s->prompt_len + s->completion_len ||
                    memcmp(x.ids, s->tokens, sizeof(int32_t) * (size_t)x.n_ids)))
            why = "its conversation is not what the environment gave (a forged reply)";
        at = x.n_ids - s->prompt_len;
    }
    if (!rc && !why && !x.over && x.n_ids >= mc->seq_len - 1) x.over = true; /* the context is full */
    if (!rc && !why && (at != s->completion_len || !x.over))
        why = "it does not end where its environment ends it";
    if (!rc && !why && memcmp(x.trained + s->prompt_len, s->trained, (size_t)s->completion_len))
        why = "its mask is not its turns";
    *task_reward = x.ep.done ? x.ep.reward : 0;
    *own = vks_grpo_trained_tokens(s->completion_len, s->trained);
    if (rc) snprintf(err, cap, "task %lld: %s", (long long)task_index, vks_last_error());
    else if (why) snprintf(err, cap, "%s", why), rc = VKS_ERR_FORMAT;
    vks_episode_free(&x);
    return rc;
}

int vks_rl_score_samples(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, int n, double *task_reward,
                         double *reward, int *bad, char *err, size_t cap) {
    const vks_rl_config *c = g->o->config;
    *bad = 0;
    vks_task t;
    int target = 0, n_ids = 0;
    int rc = n < 1 ? vks_set_error(VKS_ERR_ARG, "no completions") : make_task(g, task_index, &t, &target);
    if (rc && g->episodes) snprintf(err, cap, "task %lld: %s", (long long)task_index, vks_last_error());
    for (int i = 0; !rc && g->episodes && i < n; i++) { /* episodes: each replayed through its environment */
        int own = 0;
        *bad = i;
        rc = replay_episode(g, task_index, &s[i], &task_reward[i], &own, err, cap);
        reward[i] = target ? vks_task_length_reward(task_reward[i], target, own, c->length_penalty) : task_reward[i];
    }
    if (g->episodes) return rc;
    int32_t *ids = NULL;
    if (!rc) rc = tokenize_prompt(g, &t, target, &ids, &n_ids);
    if (rc) {
        snprintf(err, cap, "task %lld: %s", (long long)task_index, vks_last_error());
        return rc;
    }
    char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int *n_new = calloc((size_t)n, sizeof *n_new);
    const vks_task **which = calloc((size_t)n, sizeof *which);
    if (!texts || !lens || !n_new || !which) {
        rc = vks_set_error(VKS_ERR_NOMEM, "out of host memory");
        snprintf(err, cap, "out of host memory");
    }
    for (int i = 0; !rc && i < n; i++) {
        which[i] = &t, *bad = i;
        rc = completion_text(g, task_index, ids, n_ids, &s[i], &texts[i], &lens[i], &n_new[i], err, cap);
    }
    /* code tasks: the group's tests at once, in parallel sandboxes */
    if (!rc) {
        *bad = 0;
        rc = vks_task_score_many_into(which, (const char *const *)texts, lens, n, 0, task_reward, NULL,
                                      g->program_metrics);
        if (rc) snprintf(err, cap, "scoring here failed: %s", vks_last_error());
    }
    for (int i = 0; !rc && i < n; i++)
        reward[i] = target ? vks_task_length_reward(task_reward[i], target, n_new[i], c->length_penalty) : task_reward[i];
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts), free(lens), free(n_new), free(which), free(ids);
    return rc;
}

int vks_rl_score_sample(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, double *task_reward,
                        double *reward, char *err, size_t cap) {
    int bad = 0;
    return vks_rl_score_samples(g, task_index, s, 1, task_reward, reward, &bad, err, cap);
}

int vks_rl_check_samples(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, int n, int *bad, char *err,
                         size_t cap) {
    double *task_reward = calloc((size_t)(n > 0 ? n : 1), sizeof *task_reward);
    double *reward = calloc((size_t)(n > 0 ? n : 1), sizeof *reward);
    int rc = task_reward && reward ? vks_rl_score_samples(g, task_index, s, n, task_reward, reward, bad, err, cap)
                                   : vks_set_error(VKS_ERR_NOMEM, "out of host memory");
    if (!task_reward || !reward) snprintf(err, cap, "out of host memory");
    for (int i = 0; !rc && i < n; i++)
        if (task_reward[i] != s[i].task_reward || fabs(reward[i] - s[i].reward) > 1e-12 * (1 + fabs(reward[i]))) {
            *bad = i;
            snprintf(err, cap, "rewards %g / %g, the task gives %g / %g", s[i].task_reward, s[i].reward, task_reward[i],
                     reward[i]);
            rc = VKS_ERR_FORMAT;
        }
    free(task_reward), free(reward);
    return rc;
}


/* The sampler of batch `batch`: its own seed, so stream indices restart at 0
 * in every batch (the verifier's task prompts are indexed by them). */
uint64_t vks_rl_batch_seed(const vks_rl_config *c, int64_t batch) {
    uint32_t w[4];
    vks_philox4_u32(c->seed, (uint32_t)batch, 0x5a3du, (uint32_t)(batch >> 32), w);
    return (uint64_t)w[0] << 32 | w[1];
}

static bool is_dir(const char *path) {
    struct stat st;
    return !stat(path, &st) && S_ISDIR(st.st_mode);
}

int vks_rl_gen_make_dirs(vks_rl_gen *g, const char *sub) {
    const char *out = g->o->config->out;
    if (mkdir(out, 0777) && !is_dir(out)) return vks_set_error(VKS_ERR_IO, "%s: cannot create the directory", out);
    snprintf(g->rollouts_dir, sizeof g->rollouts_dir, "%s/%s", out, sub);
    if (mkdir(g->rollouts_dir, 0777) && !is_dir(g->rollouts_dir))
        return vks_set_error(VKS_ERR_IO, "%s: cannot create the directory", g->rollouts_dir);
    return VKS_OK;
}

void vks_rl_batch_path(const vks_rl_gen *g, int64_t batch, char *out, size_t cap) {
    snprintf(out, cap, "%s/batch-%06lld.jsonl", g->rollouts_dir, (long long)batch);
}

/* steps count positions and the token sampled at the last one is kept
 * (llama2.c): longest prompt + max_new_tokens - 1 gives the longest prompt
 * max_new_tokens tokens, none more. Shorter prompts of the batch may run
 * longer; score_batch cuts every completion at max_new_tokens. */
static vks_sched_params batch_sched(const vks_rl_gen *g, const gen_batch *b) {
    const vks_rl_config *c = g->o->config;
    return (vks_sched_params){.steps = b->longest_prompt + c->max_new_tokens - 1, .temperature = (float)c->temperature,
                              .top_p = 1.0f, .top_k = 0, .seed = vks_rl_batch_seed(c, g->batch),
                              .stop_token_a = vks_tokenizer_eos(g->o->tok), .stop_token_b = -1};
}

static void on_hidden(void *user, const vks_step *st, const vks_seq_state *states, const float *hidden,
                      const int32_t *sampled) {
    (void)sampled;
    vks_rollout_writer_on_hidden(user, st, states, hidden);
}

/* TEST ONLY: a cheating inference worker's completions carry a token the
 * sampler did not draw (the first generated one, shifted by one). */
static void cheat(const vks_rl_gen *g, gen_batch *b, int n) {
    int every = g->o->cheat_every, V = g->model->cfg.vocab_size;
    for (int i = 0; every > 0 && i < n; i++) {
        int64_t global = g->batch * g->o->config->prompts_per_step * g->o->config->group_size + i;
        vks_sequence *s = &b->seqs[i];
        if ((global + 1) % every == 0 && s->n_ids > s->n_prompt) s->ids[s->n_prompt] = (s->ids[s->n_prompt] + 1) % V;
    }
}

/* ---- the verifier's rejections (rl_internal.h: VKS_RL_REJECTED_FILE) ---- */

enum { REJECTED_MAX_LINE = 1 << 16 }; /* a longer line in an old file is dropped */

/* The line's "batch" when it is an object with an integer one, else -1. */
static int64_t line_batch(const char *line, size_t len) {
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES, NULL);
    json_t *b = json_object_get(o, "batch");
    int64_t batch = json_is_integer(b) ? (int64_t)json_integer_value(b) : -1;
    json_decref(o);
    return batch;
}

/* Before this process's first batch: rewrites the file (temporary + rename)
 * with the old lines of batches before it; no file, nothing to do. */
static int rejections_start(vks_rl_gen *g, const char *path) {
    FILE *in = fopen(path, "rb");
    if (!in) return errno == ENOENT ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    vks_outfile o;
    int rc = vks_outfile_open(&o, path, 0666);
    if (rc) {
        fclose(in);
        return rc;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    bool ok = true;
    while (ok && (len = getline(&line, &cap, in)) > 0) {
        size_t n = (size_t)len - (line[len - 1] == '\n');
        if (n > REJECTED_MAX_LINE) continue;
        int64_t b = line_batch(line, n);
        if (b >= 0 && b < g->batch) ok = fwrite(line, 1, n, o.f) == n && putc('\n', o.f) != EOF;
    }
    bool read_failed = ferror(in) != 0;
    free(line);
    fclose(in);
    if (read_failed) {
        vks_outfile_abort(&o);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read the earlier rejections", path);
    }
    return vks_outfile_finish(&o, ok);
}

/* A JSON string of bytes from a file: escaped first (jansson wants UTF-8). */
static json_t *text_value(const char *s) {
    char buf[1024];
    vks_escape(s ? s : "", s ? strlen(s) : 0, buf, sizeof buf);
    return json_string(buf);
}

static json_t *number_value(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static char *rejection_line(const vks_rl_gen *g, const vks_rollout_sample *s, const vks_verdict *v,
                            const vks_verify_options *vo, int i) {
    const vks_rl_config *c = g->o->config;
    char file[64];
    snprintf(file, sizeof file, "batch-%06lld.jsonl", (long long)g->batch);
    json_t *o = json_object();
    bool ok = o != NULL;
#define PUT(key, val) (ok = ok && json_object_set_new(o, key, val) == 0)
    PUT("batch", json_integer((json_int_t)g->batch));
    PUT("policy_step", json_integer((json_int_t)g->policy_step));
    PUT("sample", json_integer(i));
    PUT("file", json_string(file));
    PUT("id", text_value(s->id));
    PUT("seq", json_integer((json_int_t)s->seq));
    PUT("task_index", json_integer((json_int_t)(g->batch * c->prompts_per_step + i / c->group_size)));
    PUT("output_tokens", json_integer(s->n_output));
    PUT("reason", text_value(v->reason));
    PUT("max_gap", number_value(v->max_gap));
    PUT("logit_margin", number_value(vo->logit_margin));
    PUT("n_chunks", json_integer(v->n_chunks));
    PUT("toploc_exp_mismatches", json_integer(v->worst.exp_mismatches));
    PUT("toploc_mant_mean", number_value(v->worst.mant_mean));
    PUT("toploc_mant_median", number_value(v->worst.mant_median));
#undef PUT
    char *line = ok ? json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(o);
    return line;
}

int vks_rl_record_rejections(vks_rl_gen *g, const vks_rollout_sample *samples, const vks_verdict *v, int n,
                             const vks_verify_options *vo) {
    char path[4200];
    snprintf(path, sizeof path, "%s/" VKS_RL_REJECTED_FILE, g->rollouts_dir);
    if (!g->rejections_started) {
        int rc = rejections_start(g, path);
        if (rc) return rc;
        g->rejections_started = true;
    }
    int rejected = 0, first = -1;
    for (int i = 0; i < n; i++)
        if (!v[i].accepted) rejected++, first = first < 0 ? i : first;
    if (!rejected) return VKS_OK;
    FILE *f = fopen(path, "ab");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    bool ok = true;
    for (int i = 0; ok && i < n; i++) {
        if (v[i].accepted) continue;
        char *line = rejection_line(g, &samples[i], &v[i], vo, i);
        if (!line) {
            fclose(f);
            return vks_set_error(VKS_ERR_NOMEM, "%s: cannot format a line", path);
        }
        size_t len = strlen(line);
        line[len] = '\n'; /* the terminator becomes the newline: one write per line */
        ok = fwrite(line, 1, len + 1, f) == len + 1 && fflush(f) == 0;
        free(line);
    }
    int e = errno;
    ok = fclose(f) == 0 && ok;
    if (!ok) return vks_set_error(VKS_ERR_IO, "%s: write failed: %s", path, strerror(e ? e : EIO));
    char reason[300], where[300], msg[1024];
    vks_escape(v[first].reason, strlen(v[first].reason), reason, sizeof reason);
    vks_escape(path, strlen(path), where, sizeof where);
    snprintf(msg, sizeof msg, "vkswarm: rl: batch %lld (policy step %lld): the verifier rejected %d of %d completions; "
             "sample %d: %s (all in %s)\n", (long long)g->batch, (long long)g->policy_step, rejected, n, first, reason,
             where);
    fputs(msg, stderr);
    return VKS_OK;
}

/* The verifier: reads the batch's rollout file back (as a verifier rank
 * receives it) and replays it on the CPU forward of the same policy. */
static int verify_batch(vks_rl_gen *g, const char *path, gen_batch *b, int n) {
    vks_rollout_file f;
    int rc = vks_rollout_read(path, &f);
    if (rc) return rc;
    if (f.n_samples != n) rc = vks_set_error(VKS_ERR_FORMAT, "%s: %d samples, %d expected", path, f.n_samples, n);
    vks_verify_options vo;
    vks_verify_options_default(&vo);
    memcpy(vo.model_hash, g->model_hash, 32);
    vo.n_stop = f.header.n_stop;
    memcpy(vo.stop_ids, f.header.stop_ids, sizeof vo.stop_ids);
    int G = g->o->config->group_size;
    const int32_t **prompts = malloc(sizeof *prompts * (size_t)n);
    int *lens = malloc(sizeof *lens * (size_t)n);
    if (!rc && (!prompts || !lens)) rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int i = 0; !rc && i < n; i++) prompts[i] = b->prompt_ids[i / G], lens[i] = b->prompt_lens[i / G];
    vo.task_prompts = prompts, vo.task_prompt_lens = lens, vo.n_task_prompts = n;
    vo.cpu_threads = 1;
    vo.lora = g->adapter;
    if (!rc) rc = vks_verify_batch_cpu(g->model, &vo, f.samples, n, b->verdicts);
    if (!rc) rc = vks_rl_record_rejections(g, f.samples, b->verdicts, n, &vo);
    free(prompts);
    free(lens);
    vks_rollout_file_free(&f);
    return rc;
}

/* Whether this batch's verdicts are made here (else by a verifier rank, or none). */
static bool verified_here(const vks_rl_gen *g) { return g->o->verify && !g->defer_verify; }

static bool checkpoint_exists(const char *dir) {
    char path[4200];
    if ((size_t)snprintf(path, sizeof path, "%s/state.json", dir) >= sizeof path) return false;
    struct stat st;
    return stat(path, &st) == 0;
}

/* Where the weights of the policy generating are, for its rollout files:
 * what the caller set (an inference rank: the Shardcast step), else the
 * checkpoint OUT/step-N when the run saves that step (every save_every and
 * the last, or already there, as the step a resumed run went on from;
 * step 0: the start model, as --model gave it). */
static void policy_weights(const vks_rl_gen *g, char *out, size_t cap) {
    const vks_rl_config *c = g->o->config;
    int64_t step = g->policy_step;
    if (g->policy_weights[0]) snprintf(out, cap, "%s", g->policy_weights);
    else if (step == 0) snprintf(out, cap, "the start model (vkswarm rl --model)");
    else if (vks_checkpoint_step_dir(c->out, step, out, cap)) snprintf(out, cap, "step %lld", (long long)step);
    else if ((c->save_every && step % c->save_every == 0) || step == c->steps || checkpoint_exists(out)) {
        /* out holds OUT/step-N: saved by the run's rule, or there already (the step a run resumed from) */
    } else
        snprintf(out, cap, "not saved (save_every %d; the trainer's weights of step %lld)", c->save_every, (long long)step);
}

/* The rollout file at path for n sequences generated with go (its TOPLOC proofs made here when own_proofs),
 * naming the policy generating; go's hidden-state hook feeds it. */
static int open_rollout_file(const vks_rl_gen *g, const char *path, int n, bool own_proofs, vks_generate_options *go,
                             vks_rollout_writer **w) {
    int rc = vks_rollout_writer_create(path, g->model, g->adapter, "policy", &go->sched, n, own_proofs, w);
    if (rc) return rc;
    char where[1024];
    policy_weights(g, where, sizeof where);
    vks_rollout_writer_set_policy(*w, g->policy_step, where);
    go->on_hidden = on_hidden, go->user = *w;
    return VKS_OK;
}

static int generate_batch(vks_rl_gen *g, gen_batch *b, int n) {
    vks_sched_params sp = batch_sched(g, b);
    vks_generate_options go = {.sched = sp, .record_logp = true};
    vks_rollout_writer *w = NULL;
    char path[4200];
    vks_rl_batch_path(g, g->batch, path, sizeof path);
    int rc = VKS_OK;
    bool toploc = g->o->verify || g->defer_verify;
    if (toploc) /* the rollout file: for this verifier or a verifier rank (proofs made here unless elsewhere) */
        rc = open_rollout_file(g, path, n, !g->generate, &go, &w);
    if (!rc) rc = g->generate ? g->generate(g->generate_ctx, g, &sp, b->seqs, n, toploc)
                              : vks_generate(g->engine, &go, b->seqs, n, 0);
    if (!rc) cheat(g, b, n);
    if (!rc && w) rc = vks_rollout_writer_finish(w, b->seqs, n, 0);
    vks_rollout_writer_destroy(w);
    if (!rc && verified_here(g)) {
        g->verify_start = vks_seconds_now();
        rc = verify_batch(g, path, b, n);
        g->verify_end = vks_seconds_now();
    }
    return rc;
}

/* Task rewards of the completions (text up to the stop token, at most
 * max_new_tokens: a sequence with a shorter prompt than the batch's longest
 * may have run past it, and the rest is dropped), the thinking-budget term,
 * and the tokens kept for training (the stop token within max_new_tokens;
 * mpi/rl_verifier.c rebuild_flat cuts rollout records the same way). */
static int score_batch(const vks_rl_gen *g, gen_batch *b, const int *targets, int n) {
    const vks_rl_config *c = g->o->config;
    if (n < 1) return VKS_OK;
    char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    const vks_task **which = calloc((size_t)n, sizeof *which);
    int *own = calloc((size_t)n, sizeof *own); /* the completion's tokens, for the thinking budget */
    int rc = texts && lens && which && own ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        vks_sequence *s = &b->seqs[i];
        int n_new = s->n_ids - s->n_prompt, keep_stop = s->stop_token >= 0;
        if (n_new >= c->max_new_tokens) n_new = c->max_new_tokens, keep_stop = 0;
        rc = vks_tokenizer_detokenize(g->o->tok, s->ids + s->n_prompt, n_new, false, &texts[i], &lens[i]);
        which[i] = &b->tasks[i / c->group_size];
        b->lengths[i] = n_new + keep_stop;
        own[i] = n_new;
    }
    /* code tasks: every completion's tests at once, in parallel sandboxes */
    if (rc == VKS_OK)
        rc = vks_task_score_many_into(which, (const char *const *)texts, lens, n, 0, b->task_reward, NULL, g->program_metrics);
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        int target = targets[i / c->group_size];
        b->reward[i] = target ? vks_task_length_reward(b->task_reward[i], target, own[i], c->length_penalty)
                              : b->task_reward[i];
    }
    for (int i = 0; texts && i < n; i++) free(texts[i]);
    free(texts), free(lens), free(which), free(own);
    return rc;
}

/* Episode i of batch b (task i / group_size) started from its environment with its seed. */
static int start_batch_episode(const vks_rl_gen *g, const gen_batch *b, const int *targets, int i, vks_episode *x) {
    const vks_rl_config *c = g->o->config;
    int p = i / c->group_size;
    return vks_episode_start(&c->prompt, g->o->tok, g->model->cfg.vocab_size, g->model->cfg.seq_len, &b->tasks[p],
                             episode_seed(g, g->batch * c->prompts_per_step + p, i % c->group_size), targets[p], x);
}

/* ---- multi-turn episodes (environment tasks) ---- */

/* Turn `turn`'s rollout file of the batch: the batch's own for the first turn, batch-B-turn-T.jsonl (T from 2)
 * for the others. Each record is one assistant turn: its prompt the conversation so far. */
void vks_rl_turn_path(const vks_rl_gen *g, int64_t batch, int turn, char *out, size_t cap) {
    if (turn == 0) vks_rl_batch_path(g, batch, out, cap);
    else snprintf(out, cap, "%s/batch-%06lld-turn-%d.jsonl", g->rollouts_dir, (long long)batch, turn + 1);
}

typedef struct {
    vks_rl_gen *g;
    vks_rollout_writer *w; /* the turn's, while it generates */
    int turns;             /* turn files written */
    int *reply_at;         /* per episode: where the last turn's reply starts (TEST ONLY: cheat) */
} episode_files;

static int turn_before(void *ctx, int turn, vks_generate_options *go, int k) {
    episode_files *e = ctx;
    char path[4200];
    vks_rl_turn_path(e->g, e->g->batch, turn, path, sizeof path);
    return open_rollout_file(e->g, path, k, true, go, &e->w);
}

static int turn_generated(void *ctx, int turn, const vks_sequence *seqs, const uint32_t *index, const int *which, int k) {
    (void)turn;
    episode_files *e = ctx;
    int rc = vks_rollout_writer_finish_indexed(e->w, seqs, k, 0, index);
    vks_rollout_writer_destroy(e->w);
    e->w = NULL;
    e->turns += !rc;
    for (int i = 0; i < k; i++) e->reply_at[which[i]] = seqs[i].n_ids + 1; /* after the turn and its stop token */
    return rc;
}

/* TEST ONLY: a cheating inference worker writes its own tool results: every cheat_every-th episode's first
 * reply gets its first token shifted by one. */
static void turn_stepped(void *ctx, int turn, vks_episode *xs, int count) {
    episode_files *e = ctx;
    int every = e->g->o->cheat_every, V = e->g->model->cfg.vocab_size;
    int64_t first = e->g->batch * e->g->o->config->prompts_per_step * e->g->o->config->group_size;
    for (int i = 0; every > 0 && turn == 0 && i < count; i++)
        if ((first + i + 1) % every == 0 && !xs[i].over && xs[i].n_ids > e->reply_at[i])
            xs[i].ids[e->reply_at[i]] = (xs[i].ids[e->reply_at[i]] + 1) % V;
}

static void reject(vks_verdict *v, const char *fmt, int turn, const char *what) {
    if (!v->accepted) return; /* the first reason stands */
    v->accepted = false;
    snprintf(v->reason, sizeof v->reason, fmt, turn + 1, what);
}

void vks_rl_episode_checks_free(vks_rl_episode_check *x, int n) {
    for (int i = 0; x && i < n; i++) free(x[i].ids), free(x[i].trained), free(x[i].logp);
}

/* One turn file's records replayed on the rebuilt episodes xs: each record's prompt must be the conversation
 * its episode's environment gives (else a reply was forged), its turn is stepped through the environment as
 * generation stepped it, and its tokens go through the verifier (TOPLOC, the sampler's replay), whose
 * log-probabilities of the turn's own tokens go into the episode. */
static int verify_turn(const vks_rl_gen *g, const vks_model *model, const vks_verify_options *vo, int64_t batch,
                       const vks_rollout_file *f, int turn, bool check_streams, vks_episode *xs, const vks_task *tasks,
                       vks_rl_episode_check *out, int n) {
    const vks_rl_config *c = g->o->config;
    int m = f->n_samples;
    vks_verdict *v = calloc((size_t)(m ? m : 1), sizeof *v);
    float **logp = calloc((size_t)(m ? m : 1), sizeof *logp);
    uint8_t *seen = calloc((size_t)n, 1);
    int rc = v && logp && seen ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int j = 0; !rc && j < m; j++) {
        const vks_rollout_sample *r = &f->samples[j];
        if (r->seq >= (uint32_t)n || seen[r->seq]++)
            rc = vks_set_error(VKS_ERR_FORMAT, "turn %d: record %d is of episode %u (%d episodes, each once)", turn + 1, j,
                               r->seq, n);
        else if (!(logp[j] = malloc(sizeof(float) * (size_t)(r->n_output + 1))))
            rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    }
    vks_verify_options vt = *vo;
    vt.logp_out = logp;
    if (!rc) rc = vks_verify_batch_cpu(model, &vt, f->samples, m, v);
    uint64_t seed = vks_rl_batch_seed(c, batch);
    for (int j = 0; !rc && j < m; j++) {
        const vks_rollout_sample *r = &f->samples[j];
        int i = (int)r->seq;
        vks_verdict *o = &out[i].verdict;
        vks_episode *x = &xs[i];
        if (!v[j].accepted) reject(o, "turn %d: %s", turn, v[j].reason);
        if (check_streams && (r->seed != seed || r->temperature != (float)c->temperature || r->top_p != 1.0f || r->top_k != 0))
            reject(o, "turn %d: %s", turn, "its record is not the batch's sampler stream");
        if (x->over || r->n_prompt != x->n_ids || memcmp(r->prompt_ids, x->ids, sizeof(int32_t) * (size_t)x->n_ids)) {
            reject(o, "turn %d: %s", turn, "its conversation is not what the environment gave (a forged reply)");
            x->over = true;
            continue;
        }
        int at = x->n_ids;
        rc = vks_episode_replay_turn(&c->prompt, g->o->tok, &tasks[i / c->group_size], c->max_new_tokens,
                                     model->cfg.seq_len, x, r->output_ids, r->n_output);
        for (int k = 0; !rc && k < r->n_output && at + k < x->n_ids; k++)
            if (x->trained[at + k]) x->logp[at + k] = logp[j][k];
    }
    for (int j = 0; logp && j < m; j++) free(logp[j]);
    free(v), free(logp), free(seen);
    return rc;
}

int vks_rl_verify_episodes(const vks_rl_gen *g, const vks_model *model, const vks_verify_options *vo, int64_t batch,
                           int n_prompts, const vks_rollout_file *files, int turns, bool check_streams,
                           vks_rl_episode_check *out) {
    const vks_rl_config *c = g->o->config;
    int P = c->prompts_per_step, G = c->group_size, n = n_prompts * G;
    if (!g->episodes || n_prompts < 1 || n_prompts > P || turns < 1 || !model || !vo || !files || !out)
        return vks_set_error(VKS_ERR_ARG, "verifier: bad episode batch");
    memset(out, 0, sizeof *out * (size_t)n);
    vks_episode *xs = calloc((size_t)n, sizeof *xs);
    vks_task *tasks = calloc((size_t)n_prompts, sizeof *tasks);
    int *targets = calloc((size_t)n_prompts, sizeof *targets);
    int rc = xs && tasks && targets ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    for (int p = 0; !rc && p < n_prompts; p++) rc = make_task(g, batch * P + p, &tasks[p], &targets[p]);
    for (int i = 0; !rc && i < n; i++) {
        out[i].verdict = (vks_verdict){.accepted = true, .blamed_rank = -1};
        rc = vks_episode_start(&c->prompt, g->o->tok, model->cfg.vocab_size, model->cfg.seq_len, &tasks[i / G],
                               episode_seed(g, batch * P + i / G, i % G), targets[i / G], &xs[i]);
    }
    for (int t = 0; !rc && t < turns; t++)
        rc = verify_turn(g, model, vo, batch, &files[t], t, check_streams, xs, tasks, out, n);
    for (int i = 0; !rc && i < n; i++) {
        vks_episode *x = &xs[i];
        vks_rl_episode_check *e = &out[i];
        if (!x->over && x->n_ids >= model->cfg.seq_len - 1) x->over = true; /* the context is full */
        if (!x->over) reject(&e->verdict, "turn %d: %s", turns - 1, "the episode goes on after its last turn");
        int len = x->n_ids - x->n_start;
        e->trained = malloc((size_t)(len ? len : 1));
        e->logp = malloc(sizeof(float) * (size_t)(len ? len : 1));
        if (!e->trained || !e->logp) {
            rc = vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
            break;
        }
        memcpy(e->trained, x->trained + x->n_start, (size_t)len);
        memcpy(e->logp, x->logp + x->n_start, sizeof(float) * (size_t)len);
        e->ids = x->ids, e->n_ids = x->n_ids, e->n_prompt = x->n_start;
        x->ids = NULL;
        e->task_reward = x->ep.done ? x->ep.reward : 0;
    }
    for (int i = 0; xs && i < n; i++) vks_episode_free(&xs[i]);
    free(xs), free(tasks), free(targets);
    if (rc) vks_rl_episode_checks_free(out, n);
    return rc;
}

/* The verifier of a batch of episodes on this process (its own turn files read back, as a verifier rank reads
 * the ones it is sent): an episode is accepted when vks_rl_verify_episodes accepts it and it is the completion
 * and reward the batch holds. Rejections go to rejected.jsonl as the batch's first-turn records (sample = the
 * episode). */
static int verify_episodes(vks_rl_gen *g, gen_batch *b, int n, int turns) {
    vks_rollout_file *files = calloc((size_t)(turns > 0 ? turns : 1), sizeof *files);
    vks_rl_episode_check *checks = calloc((size_t)n, sizeof *checks);
    int rc = files && checks ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "verifier: out of host memory");
    int read = 0;
    for (; !rc && read < turns; read++) {
        char path[4200];
        vks_rl_turn_path(g, g->batch, read, path, sizeof path);
        if ((rc = vks_rollout_read(path, &files[read]))) break;
    }
    vks_verify_options vo;
    vks_verify_options_default(&vo);
    memcpy(vo.model_hash, g->model_hash, 32);
    vo.cpu_threads = 1;
    vo.lora = g->adapter;
    if (!rc && turns > 0) {
        vo.n_stop = files[0].header.n_stop;
        memcpy(vo.stop_ids, files[0].header.stop_ids, sizeof vo.stop_ids);
    }
    if (!rc) rc = vks_rl_verify_episodes(g, g->model, &vo, g->batch, n / g->o->config->group_size, files, turns, false, checks);
    for (int i = 0; !rc && i < n; i++) {
        const vks_sequence *s = &b->seqs[i];
        vks_verdict *v = &b->verdicts[i];
        *v = checks[i].verdict;
        if (checks[i].n_ids != s->n_ids || memcmp(checks[i].ids, s->ids, sizeof(int32_t) * (size_t)s->n_ids))
            reject(v, "turn %d: %s", turns - 1, "the completion is not its turns and replies");
        else if (checks[i].task_reward != b->task_reward[i])
            reject(v, "turn %d: %s", turns - 1, "its reward is not the environment's");
    }
    if (!rc && files[0].n_samples == n) rc = vks_rl_record_rejections(g, files[0].samples, b->verdicts, n, &vo);
    else if (!rc) rc = vks_set_error(VKS_ERR_FORMAT, "batch %lld: the first turn's file holds %d of %d episodes",
                                     (long long)g->batch, files[0].n_samples, n);
    vks_rl_episode_checks_free(checks, n);
    for (int t = 0; t < read; t++) vks_rollout_file_free(&files[t]);
    free(files), free(checks);
    return rc;
}

static int run_episodes(vks_rl_gen *g, gen_batch *b, const int *targets, int n) {
    const vks_rl_config *c = g->o->config;
    int G = c->group_size;
    vks_sched_params sp = batch_sched(g, b);
    sp.steps = g->model->cfg.seq_len;
    vks_generate_options go = {.sched = sp, .record_logp = true};
    vks_episode *xs = calloc((size_t)n, sizeof *xs);
    const vks_task **which = calloc((size_t)n, sizeof *which);
    uint32_t *index = calloc((size_t)n, sizeof *index);
    episode_files files = {.g = g, .reply_at = calloc((size_t)n, sizeof(int))};
    vks_episode_hooks hooks = {.ctx = &files, .before = turn_before, .generated = turn_generated,
                               .stepped = turn_stepped};
    int rc = xs && which && index && files.reply_at ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc && g->generate) rc = vks_set_error(VKS_ERR_ARG, "inference: episodes run on this process's engine only");
    for (int i = 0; !rc && i < n; i++) {
        which[i] = &b->tasks[i / G], index[i] = (uint32_t)i;
        rc = start_batch_episode(g, b, targets, i, &xs[i]);
    }
    if (!rc)
        rc = vks_episodes_run(g->engine, &go, &c->prompt, g->o->tok, which, index, n, c->max_new_tokens,
                              g->o->verify || g->defer_verify || g->o->cheat_every ? &hooks : NULL, xs);
    vks_rollout_writer_destroy(files.w);
    g->turns = files.turns; /* a verifier rank is sent them all */
    for (int i = 0; !rc && i < n; i++) {
        vks_episode *x = &xs[i];
        vks_sequence *s = &b->seqs[i];
        int len = x->n_ids - x->n_start, own = 0;
        vks_sequence_free(s);
        *s = (vks_sequence){.ids = x->ids, .n_prompt = x->n_start, .n_ids = x->n_ids, .stop_token = -1};
        s->logp = malloc(sizeof(float) * (size_t)(len ? len : 1));
        b->trained[i] = malloc((size_t)(len ? len : 1));
        x->ids = NULL;
        if (!s->logp || !b->trained[i]) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
        for (int k = 0; !rc && k < len; k++)
            s->logp[k] = x->logp[x->n_start + k], b->trained[i][k] = x->trained[x->n_start + k], own += x->trained[x->n_start + k];
        b->lengths[i] = len;
        b->task_reward[i] = x->ep.done ? x->ep.reward : 0;
        if (x->ep.done && x->ep.metrics[0]) vks_task_metrics_add(g->program_metrics, x->ep.metrics);
        int target = targets[i / G];
        b->reward[i] = target ? vks_task_length_reward(b->task_reward[i], target, own, c->length_penalty) : b->task_reward[i];
    }
    for (int i = 0; xs && i < n; i++) vks_episode_free(&xs[i]);
    free(xs), free(which), free(index), free(files.reply_at);
    if (!rc && verified_here(g)) {
        g->verify_start = vks_seconds_now();
        rc = verify_episodes(g, b, n, files.turns);
        g->verify_end = vks_seconds_now();
    }
    return rc;
}

static int copy_sample(const gen_batch *b, int i, double adv, bool accepted, vks_rl_sample *out) {
    const vks_sequence *s = &b->seqs[i];
    int n = s->n_prompt + b->lengths[i];
    *out = (vks_rl_sample){.prompt_len = s->n_prompt, .completion_len = b->lengths[i], .task_reward = b->task_reward[i],
                           .reward = b->reward[i], .advantage = adv, .accepted = accepted};
    out->tokens = malloc(sizeof(int32_t) * (size_t)n);
    out->logp = malloc(sizeof(float) * (size_t)(b->lengths[i] ? b->lengths[i] : 1));
    if (!out->tokens || !out->logp) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    memcpy(out->tokens, s->ids, sizeof(int32_t) * (size_t)(n - (b->lengths[i] > s->n_ids - s->n_prompt)));
    if (b->lengths[i] > s->n_ids - s->n_prompt) out->tokens[n - 1] = s->stop_token; /* the stop token, kept */
    memcpy(out->logp, s->logp, sizeof(float) * (size_t)b->lengths[i]);
    if (b->trained[i]) {
        out->trained = malloc((size_t)(b->lengths[i] ? b->lengths[i] : 1));
        if (!out->trained) return vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
        memcpy(out->trained, b->trained[i], (size_t)b->lengths[i]);
    }
    return VKS_OK;
}

/* The accepted completions of prompt p as a group with advantages, or none
 * (n = 0) when fewer than two were accepted or their rewards are all equal. */
static int make_group(const vks_rl_gen *g, const gen_batch *b, int64_t batch, int64_t policy_step, int p,
                      vks_rl_batch_group *out) {
    int G = g->o->config->group_size, n = 0;
    int idx[VKS_RL_MAX_GROUP];
    double r[VKS_RL_MAX_GROUP], adv[VKS_RL_MAX_GROUP];
    memset(out, 0, sizeof *out);
    out->policy_step = policy_step;
    out->task_index = batch * g->o->config->prompts_per_step + p;
    for (int j = 0; j < G; j++)
        if (!verified_here(g) || b->verdicts[p * G + j].accepted) idx[n] = p * G + j, r[n] = b->reward[p * G + j], n++;
    if (n < 2 || (!g->keep_flat_groups && !vks_grpo_group_has_signal(r, n))) return VKS_OK;
    int rc = vks_grpo_advantages(r, 1, n, g->o->config->advantage, adv);
    out->samples = rc ? NULL : calloc((size_t)n, sizeof *out->samples);
    if (!rc && !out->samples) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    for (int k = 0; !rc && k < n; k++)
        rc = copy_sample(b, idx[k], adv[k], verified_here(g) ? b->verdicts[idx[k]].accepted : !g->defer_verify,
                         &out->samples[out->n++]);
    for (int k = 0; !rc && g->episodes && k < n; k++) out->samples[k].episode_seed = episode_seed(g, out->task_index, idx[k] % G);
    if (rc) vks_rl_group_free(out);
    return rc;
}

/* Whether the run's tasks are episodes (environment tasks: all of them or none), and where they may run. */
static int open_episodes(vks_rl_gen *g) {
    const vks_task *env = vks_task_first_environment(g->tasks, g->n_tasks);
    g->episodes = env || (!g->tasks && g->spec.kind == VKS_TASK_CALC);
    if (!g->episodes) return VKS_OK;
    const char *where = g->tasks_path ? g->tasks_path : "task";
    if (!g->episodes_allowed)
        return vks_error_prefix(vks_task_refuse_environments(&g->spec, g->tasks, g->n_tasks), "%s", where);
    for (int64_t i = 0; i < g->n_tasks; i++)
        if (g->tasks[i].verify != VKS_VERIFY_ENVIRONMENT)
            return vks_set_error(VKS_ERR_FORMAT, "%s: task %lld is an environment and task %lld is not: rl trains on "
                                 "episodes of environment tasks only", where, (long long)env->line,
                                 (long long)g->tasks[i].line);
    return VKS_OK;
}

int vks_rl_gen_open_tasks(vks_rl_gen *g) {
    const vks_rl_config *c = g->o->config;
    int rc = vks_task_resolve(c->task, &g->spec, &g->tasks_path);
    if (!rc && !g->tasks_path && g->spec.kind == VKS_TASK_CODE && !c->reward[0] && vks_sandbox_check()) /* before the run starts */
        rc = vks_error_prefix(VKS_ERR_IO, "task %s", c->task);
    if (!rc && !g->program_metrics) rc = vks_task_metrics_create(&g->program_metrics); /* reward programs' metrics */
    if (!rc && c->reward[0] && !g->reward_program) { /* the config's: run where the run started */
        char dir[4096];
        if (!getcwd(dir, sizeof dir)) rc = vks_set_error(VKS_ERR_IO, "reward: the current directory: %s", strerror(errno));
        if (!rc) rc = vks_task_program_parse(c->reward, dir, &g->reward_program);
        if (!rc && g->reward_program->sandboxed && vks_sandbox_check()) rc = VKS_ERR_IO; /* before the run starts */
        if (rc) rc = vks_error_prefix(rc, "config reward");
    }
    if (rc || !g->tasks_path) return rc ? rc : open_episodes(g);
    rc = vks_task_file_load(g->tasks_path, &g->tasks, &g->n_tasks);
    if (!rc && g->n_tasks < 1) rc = vks_set_error(VKS_ERR_FORMAT, "%s: no tasks", g->tasks_path);
    if (!rc) rc = open_episodes(g);
    /* code tasks: the sandbox is checked before the run starts (every rank scores: vks_rl_score_sample) */
    if (!rc && vks_task_first_code(g->tasks, g->n_tasks) && vks_sandbox_check())
        rc = vks_error_prefix(VKS_ERR_IO, "%s: code tasks", g->tasks_path);
    if (!rc && c->eval_split > 0) {
        rc = vks_task_split(g->tasks, &g->n_tasks, c->eval_split, &g->held, &g->n_held);
        if (rc) rc = vks_error_prefix(rc, "%s: eval_split %g", g->tasks_path, c->eval_split);
    }
    if (!rc && c->buffer.difficulty_pool && !g->pool) rc = vks_difficulty_pool_create(g->n_tasks, &c->buffer, c->seed, &g->pool);
    return rc;
}

void vks_rl_gen_close(vks_rl_gen *g) {
    vks_engine_destroy(g->engine);
    g->engine = NULL;
    if (!g->model_borrowed) vks_model_free(g->model);
    g->model = NULL;
    vks_lora_adapter_free(g->adapter);
    g->adapter = NULL;
    vks_task_free(g->tasks, g->n_tasks);
    g->tasks = NULL;
    vks_task_free(g->held, g->n_held);
    g->held = NULL;
    vks_task_metrics_free(g->program_metrics);
    g->program_metrics = NULL;
    free(g->reward_program);
    g->reward_program = NULL;
    vks_difficulty_pool_free(g->pool);
    g->pool = NULL;
}

/* A generated batch, not yet scored: what its scoring needs (the batch's
 * index and policy step are its own: the next batch may be generating). */
typedef struct {
    gen_batch b;
    int *targets;
    int P, n;
    int64_t batch, policy_step;
} gen_pending;

/* Frees what x holds; its batch and policy step stay (an error names the batch). */
static void pending_free(gen_pending *x) {
    if (x->P) batch_free(&x->b, x->P, x->n);
    free(x->targets);
    x->targets = NULL, x->P = x->n = 0;
}

/* Generation (and verification) of batch `batch`: n_prompts tasks x group_size. x is freed by gen_end. */
static int gen_begin(vks_rl_gen *g, int64_t batch, int n_prompts, gen_pending *x) {
    const vks_rl_config *c = g->o->config;
    memset(x, 0, sizeof *x);
    if (n_prompts < 1 || n_prompts > c->prompts_per_step)
        return vks_set_error(VKS_ERR_ARG, "inference: %d prompts in a batch of %d", n_prompts, c->prompts_per_step);
    x->P = n_prompts, x->n = n_prompts * c->group_size, x->batch = batch, x->policy_step = g->policy_step;
    g->batch = batch;
    g->verify_start = g->verify_end = 0;
    x->targets = calloc((size_t)x->P, sizeof *x->targets);
    int rc = batch_alloc(&x->b, x->P, x->n);
    if (!rc && !x->targets) rc = vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!rc) rc = prepare_batch(g, &x->b, x->P, x->targets);
    if (!rc && g->episodes) rc = run_episodes(g, &x->b, x->targets, x->n);
    else if (!rc) rc = generate_batch(g, &x->b, x->n);
    return rc;
}

/* Difficulty pools: each prompt's solve rate (its completions' mean task reward, rejected ones too: the
 * pool is about the task, not the rank) moves its task to its pool for the batches drawn after this. */
static int record_solve_rates(const vks_rl_gen *g, const gen_pending *x) {
    int G = g->o->config->group_size, rc = VKS_OK;
    for (int p = 0; !rc && p < x->P; p++) {
        double sum = 0;
        for (int j = 0; j < G; j++) sum += x->b.task_reward[p * G + j];
        int64_t task = 0;
        double rate = sum / G;
        rc = vks_difficulty_pool_task(g->pool, x->batch * g->o->config->prompts_per_step + p, &task);
        if (!rc) rc = vks_difficulty_pool_record(g->pool, task, rate < 0 ? 0 : rate > 1 ? 1 : rate);
    }
    return rc;
}

/* Scoring of a generated batch (an episode's reward came with it), its groups, its counts; frees x. */
static int gen_end(const vks_rl_gen *g, gen_pending *x, vks_rl_batch_group *groups, vks_rl_gen_counts *cnt) {
    const vks_rl_config *c = g->o->config;
    memset(groups, 0, sizeof *groups * (size_t)c->prompts_per_step);
    memset(cnt, 0, sizeof *cnt);
    int rc = g->episodes ? VKS_OK : score_batch(g, &x->b, x->targets, x->n);
    if (!rc && g->pool) rc = record_solve_rates(g, x);
    for (int p = 0; !rc && p < x->P; p++) rc = make_group(g, &x->b, x->batch, x->policy_step, p, &groups[p]);
    if (rc)
        for (int p = 0; p < x->P; p++) vks_rl_group_free(&groups[p]);
    cnt->rollouts = rc ? 0 : x->n;
    for (int i = 0; !rc && verified_here(g) && i < x->n; i++) cnt->checked++, cnt->accepted += x->b.verdicts[i].accepted;
    for (int i = 0; !rc && i < x->n; i++) cnt->task_reward_sum += x->b.task_reward[i];
    pending_free(x);
    return rc;
}

int vks_rl_gen_batch(vks_rl_gen *g, int64_t batch, int n_prompts, vks_rl_batch_group *groups, vks_rl_gen_counts *cnt) {
    gen_pending x;
    int rc = gen_begin(g, batch, n_prompts, &x);
    int erc = rc ? VKS_OK : gen_end(g, &x, groups, cnt);
    if (rc) {
        memset(groups, 0, sizeof *groups * (size_t)g->o->config->prompts_per_step);
        memset(cnt, 0, sizeof *cnt);
        pending_free(&x);
    }
    return rc ? rc : erc;
}

/* The batch run from start to end on the thread's timeline: generation, with
 * its verification in the middle when there was one. */
static void note_batch(vks_rl_gen *g, double start, double end) {
    vks_rl_timeline *t = g->timeline;
    int64_t step = g->policy_step;
    if (g->verify_end > g->verify_start && g->verify_start >= start) {
        vks_rl_timeline_add(t, VKS_RL_WORK_GENERATE, step, start, g->verify_start);
        vks_rl_timeline_add(t, VKS_RL_WORK_VERIFY, step, g->verify_start, g->verify_end);
        start = g->verify_end; /* then scoring and the hand-over */
    }
    vks_rl_timeline_add(t, VKS_RL_WORK_GENERATE, step, start, end);
}

/* Whether the run's rewards come from running something (code tests in sandboxes, reward programs): then a
 * batch is scored beside the next one's generation. Other checks take microseconds: scored in place. */
static bool slow_scoring(const vks_rl_gen *g) {
    if (g->episodes) return false; /* an episode's reward comes with its last turn */
    if (g->reward_program || (!g->tasks && g->spec.kind == VKS_TASK_CODE)) return true;
    for (int64_t i = 0; i < g->n_tasks; i++)
        if (g->tasks[i].verify == VKS_VERIFY_CODE || g->tasks[i].verify == VKS_VERIFY_PROGRAM) return true;
    return false;
}

/* One process: the last generated batch, scored and handed to the trainer on a thread of its own while the
 * next batch generates, so that a slow test never stalls generation. One at a time: batches reach the queue in
 * order. The window counts its prompts (vks_rl_shared.scoring_prompts) until it is handed over. */
typedef struct {
    vks_rl_gen *g;
    gen_pending x;
    pthread_t thread;
    bool running;
    int rc;
    char error[1024];
} scorer;

/* Batch x scored, its groups into the queue (frees x). */
static int hand_over(vks_rl_gen *g, gen_pending *x) {
    int P = g->o->config->prompts_per_step, n_prompts = x->P;
    int64_t policy_step = x->policy_step;
    vks_rl_batch_group *groups = calloc((size_t)P, sizeof *groups);
    vks_rl_gen_counts cnt;
    int rc = groups ? gen_end(g, x, groups, &cnt) : vks_set_error(VKS_ERR_NOMEM, "inference: out of host memory");
    if (!groups) pending_free(x);
    vks_rl_shared *sh = g->sh;
    pthread_mutex_lock(&sh->mu);
    if (!rc) rc = vks_rl_queue_push(&sh->queue, policy_step, groups, n_prompts, &cnt, g->o->max_empty_batches);
    sh->scoring_prompts -= n_prompts;
    pthread_cond_broadcast(&sh->cv); /* groups for the trainer, or room in the window again */
    pthread_mutex_unlock(&sh->mu);
    for (int p = 0; groups && p < P; p++) vks_rl_group_free(&groups[p]);
    free(groups);
    return rc;
}

static void *scorer_main(void *arg) {
    scorer *s = arg;
    s->rc = hand_over(s->g, &s->x);
    if (s->rc) snprintf(s->error, sizeof s->error, "%s", vks_last_error());
    return NULL;
}

/* Waits for the batch being scored, if any; its error. */
static int scorer_join(scorer *s) {
    if (!s->running) return VKS_OK;
    pthread_join(s->thread, NULL);
    s->running = false;
    return s->rc ? vks_set_error(s->rc, "batch %lld: %s", (long long)s->x.batch, s->error) : VKS_OK;
}

/* A batch of n_prompts prompts (the window's room, at most prompts_per_step): generated here, then scored
 * and handed over (beside the next batch's generation when scoring is slow). */
static int run_batch(vks_rl_gen *g, scorer *sc, int n_prompts) {
    double t0 = vks_seconds_now();
    pthread_mutex_lock(&g->sh->mu);
    g->sh->batches = g->batch + 1; /* the rollout position a checkpoint records */
    g->sh->scoring_prompts += n_prompts;
    pthread_mutex_unlock(&g->sh->mu);
    gen_pending x;
    int rc = gen_begin(g, g->batch, n_prompts, &x);
    int previous = scorer_join(sc); /* the batch before this one reaches the queue first */
    if (previous) rc = previous;
    if (rc) {
        pending_free(&x);
        pthread_mutex_lock(&g->sh->mu);
        g->sh->scoring_prompts -= n_prompts;
        pthread_mutex_unlock(&g->sh->mu);
    } else if (slow_scoring(g)) {
        sc->g = g, sc->x = x, sc->rc = VKS_OK;
        sc->running = pthread_create(&sc->thread, NULL, scorer_main, sc) == 0;
        if (!sc->running) rc = hand_over(g, &sc->x); /* no thread: scored here */
    } else {
        rc = hand_over(g, &x);
    }
    g->batch++;
    double t1 = vks_seconds_now();
    note_batch(g, t0, t1);
    pthread_mutex_lock(&g->sh->mu);
    g->sh->gen_busy_s += t1 - t0;
    pthread_mutex_unlock(&g->sh->mu);
    return rc;
}

/* The inference engine of model m for a whole batch of the run. */
static int make_engine(vks_rl_gen *g, const vks_model *m) {
    const vks_rl_config *c = g->o->config;
    int n = c->prompts_per_step * c->group_size;
    /* verifiers recompute in f32 and compare within margins: no half arithmetic */
    vks_engine_options eo = {.n_slots = n, .kv_len = m->cfg.seq_len, .max_rows = n > 256 ? n : 256, .max_out_rows = n,
                             .f32_math = true, .dtype = VKS_DTYPE_F32};
    return vks_engine_create(g->o->infer_gpu, m, &eo, &g->engine);
}

int vks_rl_gen_set_adapter(vks_rl_gen *g, vks_lora_adapter *a, int64_t step) {
    vks_lora_adapter_free(g->adapter);
    g->adapter = a;
    g->policy_step = step;
    int rc = g->engine || g->generate ? VKS_OK : make_engine(g, g->model);
    if (!rc && g->engine) rc = vks_engine_set_lora(g->engine, a);
    return rc ? rc : vks_lora_model_hash(g->model, a, g->model_hash);
}

/* Replaces the policy with the trainer's newest weights. */
int vks_rl_gen_set_policy(vks_rl_gen *g, vks_model *m, int64_t step) {
    vks_engine_destroy(g->engine);
    g->engine = NULL;
    vks_model_free(g->model);
    g->model = m;
    g->policy_step = step;
    const vks_rl_config *c = g->o->config;
    int n = c->prompts_per_step * c->group_size;
    /* verifiers recompute in f32 and compare within margins: no half arithmetic */
    vks_engine_options eo = {.n_slots = n, .kv_len = m->cfg.seq_len, .max_rows = n > 256 ? n : 256, .max_out_rows = n,
                             .f32_math = true, .dtype = VKS_DTYPE_F32};
    int rc = vks_model_hash(m, g->model_hash);
    if (!rc && !g->generate) rc = vks_engine_create(g->o->infer_gpu, m, &eo, &g->engine);
    return rc;
}

/* Waits until it may generate (the async window has room) or new weights
 * arrive; takes them. Returns false when the run is over; else *n_prompts is
 * the batch to generate: as many prompts as the window has room for (at most
 * prompts_per_step), so that no group is made only to go stale. The waits and
 * the weight loads go on the thread's timeline. */
static bool wait_for_work(vks_rl_gen *g, int *rc, int *n_prompts) {
    vks_rl_shared *sh = g->sh;
    double since = vks_seconds_now();
    pthread_mutex_lock(&sh->mu);
    for (;;) {
        if (sh->stop) break;
        if (sh->next_model || sh->next_adapter) {
            vks_model *m = sh->next_model;
            vks_lora_adapter *a = sh->next_adapter;
            int64_t step = sh->next_step;
            sh->next_model = NULL;
            sh->next_adapter = NULL;
            pthread_mutex_unlock(&sh->mu);
            vks_rl_timeline_note(g->timeline, VKS_RL_WORK_WAIT, g->policy_step, &since);
            *rc = a ? vks_rl_gen_set_adapter(g, a, step) : vks_rl_gen_set_policy(g, m, step);
            vks_rl_timeline_note(g->timeline, VKS_RL_WORK_LOAD, step, &since);
            if (*rc) return false;
            pthread_mutex_lock(&sh->mu);
            continue;
        }
        int64_t room = vks_rl_queue_room(&sh->queue, g->policy_step) - sh->scoring_prompts; /* a batch being scored */
        if (room > 0) {
            *n_prompts = room < g->o->config->prompts_per_step ? (int)room : g->o->config->prompts_per_step;
            break;
        }
        pthread_cond_wait(&sh->cv, &sh->mu);
    }
    bool go = !sh->stop;
    pthread_mutex_unlock(&sh->mu);
    vks_rl_timeline_note(g->timeline, VKS_RL_WORK_WAIT, g->policy_step, &since);
    return go;
}

void *vks_rl_gen_main(void *arg) {
    vks_rl_gen *g = arg;
    int rc = VKS_OK;
    int n_prompts = 0;
    scorer sc = {0};
    while (wait_for_work(g, &rc, &n_prompts) && !(rc = run_batch(g, &sc, n_prompts))) {}
    int last = scorer_join(&sc); /* the last batch's scoring, whatever ended the loop */
    if (!rc) rc = last;
    if (rc) {
        vks_rl_shared *sh = g->sh;
        pthread_mutex_lock(&sh->mu);
        sh->gen_rc = rc;
        snprintf(sh->gen_error, sizeof sh->gen_error, "inference, batch %lld: %s", (long long)g->batch, vks_last_error());
        pthread_cond_broadcast(&sh->cv);
        pthread_mutex_unlock(&sh->mu);
    }
    return NULL;
}
