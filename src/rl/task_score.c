/* task_score.c: scoring a file of completions against a task file without a
 * model (vks_task_score_file, `vkswarm tasks score`): the file is checked
 * whole first, then scored in chunks (code tasks' tests in parallel). */
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"
#include "task_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SCORE_CHUNK 256 /* completions scored together (their code tests share the sandbox pool) */

typedef struct {
    int64_t line, task;  /* completions-file line; index into the tasks */
    char *text;          /* "completion" (environments: its one turn) */
    size_t len;
    int n_turns;         /* "turns" (environment tasks): turns[0..n_turns), 0 without */
    char **turns;
    size_t *turn_lens;
    uint64_t seed;       /* "seed" (environment tasks; default 0) */
    char id[VKS_TASK_MAX_ID];
} completion;

static void free_completion(completion *c) {
    free(c->text);
    for (int i = 0; i < c->n_turns; i++) free(c->turns[i]);
    free(c->turns), free(c->turn_lens);
    c->text = NULL, c->turns = NULL, c->turn_lens = NULL, c->n_turns = 0;
}

static char *copy_string(json_t *s, size_t *len) {
    char *out = malloc(json_string_length(s) + 1);
    if (out) memcpy(out, json_string_value(s), json_string_length(s) + 1), *len = json_string_length(s);
    return out;
}

/* An environment task's "turns" (a list of 1 to VKS_ENV_MAX_TURNS strings) and "seed"; copied when keep. */
static int environment_fields(json_t *root, bool keep, completion *c) {
    json_t *turns = json_object_get(root, "turns"), *seed = json_object_get(root, "seed");
    size_t n = json_array_size(turns);
    if (seed && (!json_is_integer(seed) || json_integer_value(seed) < 0))
        return vks_set_error(VKS_ERR_FORMAT, "\"seed\" is not an integer of at least 0");
    c->seed = seed ? (uint64_t)json_integer_value(seed) : 0;
    if (!turns) return VKS_OK;
    if (json_object_get(root, "completion"))
        return vks_set_error(VKS_ERR_FORMAT, "\"completion\" and \"turns\": give one of them");
    if (!json_is_array(turns) || n < 1 || n > VKS_ENV_MAX_TURNS)
        return vks_set_error(VKS_ERR_FORMAT, "\"turns\" is not a list of 1 to %d strings", VKS_ENV_MAX_TURNS);
    for (size_t i = 0; i < n; i++)
        if (!json_is_string(json_array_get(turns, i)))
            return vks_set_error(VKS_ERR_FORMAT, "\"turns\"[%zu] is not a string", i);
    if (!keep) return VKS_OK;
    c->turns = calloc(n, sizeof *c->turns);
    c->turn_lens = calloc(n, sizeof *c->turn_lens);
    if (!c->turns || !c->turn_lens) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++, c->n_turns++)
        if (!(c->turns[i] = copy_string(json_array_get(turns, i), &c->turn_lens[i])))
            return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    return VKS_OK;
}

/* The task whose file line is `line` (tasks are in file order), or -1. */
static int64_t task_at_line(const vks_task *tasks, int64_t n, int64_t line) {
    int64_t lo = 0, hi = n - 1;
    while (lo <= hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (tasks[mid].line == line) return mid;
        if (tasks[mid].line < line) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

/* One completions line: checked, and (when keep) its text copied into c. */
static int parse_line(const char *buf, size_t len, const vks_task *tasks, int64_t n, bool keep, completion *c) {
    json_error_t err;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "bad JSON: %s (column %d)", err.text, err.column);
    int rc = VKS_OK;
    json_t *task = json_object_get(root, "task"), *text = json_object_get(root, "completion"),
           *id = json_object_get(root, "id");
    bool env = false;
    if (!json_is_object(root)) rc = vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
    else if (!json_is_integer(task)) rc = vks_set_error(VKS_ERR_FORMAT, "\"task\" is not an integer (a task file line)");
    else if ((c->task = task_at_line(tasks, n, json_integer_value(task))) < 0)
        rc = vks_set_error(VKS_ERR_FORMAT, "\"task\": line %lld of the task file holds no task",
                           (long long)json_integer_value(task));
    else if (!(env = tasks[c->task].verify == VKS_VERIFY_ENVIRONMENT) &&
             (json_object_get(root, "turns") || json_object_get(root, "seed")))
        rc = vks_set_error(VKS_ERR_FORMAT, "\"turns\" and \"seed\" go with environment tasks; task line %lld is none",
                           (long long)json_integer_value(task));
    else if (env) rc = environment_fields(root, keep, c);
    if (!rc && !json_is_string(text) && !(env && json_object_get(root, "turns")))
        rc = vks_set_error(VKS_ERR_FORMAT, env ? "no \"completion\" string or \"turns\" list"
                                               : "\"completion\" is not a string");
    c->id[0] = 0;
    if (!rc && id) {
        char *s = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!s || strlen(s) >= sizeof c->id) rc = vks_set_error(VKS_ERR_FORMAT, "\"id\" is longer than %d bytes as JSON",
                                                                VKS_TASK_MAX_ID - 1);
        else memcpy(c->id, s, strlen(s) + 1);
        free(s);
    }
    if (!rc && keep && text && !(c->text = copy_string(text, &c->len))) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    json_decref(root);
    return rc;
}

/* Reads the next non-blank line into buf; 0 at EOF, 1 with a line, an error otherwise. */
static int next_line(FILE *f, char *buf, size_t *len, int64_t *line_no) {
    bool too_long;
    while (vks_task_read_line(f, buf, VKS_TASK_MAX_COMPLETION, len, &too_long)) {
        ++*line_no;
        if (too_long) return vks_set_error(VKS_ERR_FORMAT, "longer than %d bytes", VKS_TASK_MAX_COMPLETION);
        if (memchr(buf, 0, *len)) return vks_set_error(VKS_ERR_FORMAT, "a NUL byte");
        if (!vks_task_blank(buf, *len)) return 1;
    }
    return ferror(f) ? vks_set_error(VKS_ERR_IO, "read failed: %s", strerror(errno)) : 0;
}

/* Environment tasks: each episode replayed from its seed and turns ("completion": one turn). */
static int score_episode(const vks_task *t, const completion *c, vks_task_scored *s, vks_env_episode *ep) {
    const char *one = c->text;
    return vks_env_replay(t, c->seed, c->n_turns ? (const char *const *)c->turns : &one,
                          c->n_turns ? c->turn_lens : &c->len, c->n_turns ? c->n_turns : 1, &s->reward, s->why,
                          sizeof s->why, ep);
}

static int score_chunk(const vks_task *tasks, completion *cs, int n, int parallel,
                       int (*on_scored)(void *, const vks_task_scored *), void *ctx) {
    const vks_task **which = calloc((size_t)n, sizeof *which);
    const char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    int *at = calloc((size_t)n, sizeof *at); /* the others' index into which[] */
    double *rewards = malloc(sizeof *rewards * (size_t)n);
    char(*why)[VKS_TASK_MAX_WHY] = malloc(sizeof *why * (size_t)n);
    vks_task_scored *s = malloc(sizeof *s);
    int rc = which && texts && lens && at && rewards && why && s ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    int k = 0;
    for (int i = 0; !rc && i < n; i++)
        if (tasks[cs[i].task].verify != VKS_VERIFY_ENVIRONMENT)
            at[i] = k, which[k] = &tasks[cs[i].task], texts[k] = cs[i].text, lens[k++] = cs[i].len;
    if (!rc && k) rc = vks_task_score_many(which, texts, lens, k, parallel, rewards, why);
    for (int i = 0; !rc && i < n; i++) {
        const vks_task *t = &tasks[cs[i].task];
        *s = (vks_task_scored){.line = cs[i].line, .task_line = t->line};
        memcpy(s->id_json, cs[i].id, sizeof s->id_json);
        vks_env_episode ep = {0};
        if (t->verify == VKS_VERIFY_ENVIRONMENT) {
            rc = score_episode(t, &cs[i], s, &ep);
            s->episode = &ep;
        } else {
            s->reward = rewards[at[i]];
            memcpy(s->why, why[at[i]], sizeof s->why);
        }
        if (!rc) rc = on_scored(ctx, s);
        else rc = vks_error_prefix(rc, "line %lld", (long long)cs[i].line);
        vks_env_episode_free(&ep);
    }
    free(which), free(texts), free(lens), free(at), free(rewards), free(why), free(s);
    return rc;
}

/* Pass 1 (score false): every line checked. Pass 2: scored in chunks. */
static int pass(FILE *f, char *buf, const vks_task *tasks, int64_t n, bool score, int parallel,
                int (*on_scored)(void *, const vks_task_scored *), void *ctx, int64_t *count) {
    completion *cs = calloc(SCORE_CHUNK, sizeof *cs);
    if (!cs) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    int64_t line_no = 0;
    int k = 0, rc = VKS_OK, got;
    *count = 0;
    while ((got = next_line(f, buf, &cs[k].len, &line_no)) == 1) {
        cs[k].line = line_no;
        rc = parse_line(buf, cs[k].len, tasks, n, score, &cs[k]);
        if (rc) {
            free_completion(&cs[k]);
            rc = vks_error_prefix(rc, "line %lld", (long long)line_no);
            break;
        }
        ++*count;
        if (score && ++k == SCORE_CHUNK) {
            rc = score_chunk(tasks, cs, k, parallel, on_scored, ctx);
            for (int i = 0; i < k; i++) free_completion(&cs[i]);
            k = 0;
            if (rc) break;
        }
    }
    if (got < 0) rc = vks_error_prefix(got, "line %lld", (long long)line_no);
    if (!rc && score && k) rc = score_chunk(tasks, cs, k, parallel, on_scored, ctx);
    for (int i = 0; i < k; i++) free_completion(&cs[i]);
    free(cs);
    return rc;
}

int vks_task_score_file(const char *tasks_path, const char *completions_path, int parallel,
                        int (*on_scored)(void *ctx, const vks_task_scored *s), void *ctx) {
    if (!tasks_path || !completions_path || !on_scored || parallel < 0)
        return vks_set_error(VKS_ERR_ARG, "tasks score: bad arguments");
    vks_task *tasks = NULL;
    int64_t n = 0, count = 0;
    int rc = vks_task_file_load(tasks_path, &tasks, &n);
    if (rc) return rc;
    FILE *f = fopen(completions_path, "rb");
    char *buf = malloc(VKS_TASK_MAX_COMPLETION + 1);
    if (!f) rc = vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", completions_path, strerror(errno));
    else if (!buf) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (!rc) rc = pass(f, buf, tasks, n, false, parallel, on_scored, ctx, &count);
    if (!rc && count == 0) rc = vks_set_error(VKS_ERR_FORMAT, "no completions");
    if (!rc && fseek(f, 0, SEEK_SET)) rc = vks_set_error(VKS_ERR_IO, "cannot read it again: %s", strerror(errno));
    bool sandbox_ok = rc || !vks_task_first_code(tasks, n) || vks_sandbox_check() == VKS_OK;
    if (!rc && sandbox_ok) rc = pass(f, buf, tasks, n, true, parallel, on_scored, ctx, &count);
    if (rc && f) rc = vks_error_prefix(rc, "%s", completions_path);
    if (!sandbox_ok) rc = vks_error_prefix(VKS_ERR_IO, "code tasks");
    if (f) fclose(f);
    free(buf);
    vks_task_programs_stop();
    vks_task_free(tasks, n);
    return rc;
}
