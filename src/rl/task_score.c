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
    char *text;
    size_t len;
    char id[VKS_TASK_MAX_ID];
} completion;

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
    if (!json_is_object(root)) rc = vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
    else if (!json_is_integer(task)) rc = vks_set_error(VKS_ERR_FORMAT, "\"task\" is not an integer (a task file line)");
    else if ((c->task = task_at_line(tasks, n, json_integer_value(task))) < 0)
        rc = vks_set_error(VKS_ERR_FORMAT, "\"task\": line %lld of the task file holds no task",
                           (long long)json_integer_value(task));
    else if (!json_is_string(text)) rc = vks_set_error(VKS_ERR_FORMAT, "\"completion\" is not a string");
    c->id[0] = 0;
    if (!rc && id) {
        char *s = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
        if (!s || strlen(s) >= sizeof c->id) rc = vks_set_error(VKS_ERR_FORMAT, "\"id\" is longer than %d bytes as JSON",
                                                                VKS_TASK_MAX_ID - 1);
        else memcpy(c->id, s, strlen(s) + 1);
        free(s);
    }
    if (!rc && keep) {
        c->len = json_string_length(text);
        c->text = malloc(c->len + 1);
        if (!c->text) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
        else memcpy(c->text, json_string_value(text), c->len + 1);
    }
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

static int score_chunk(const vks_task *tasks, completion *cs, int n, int parallel,
                       int (*on_scored)(void *, const vks_task_scored *), void *ctx) {
    const vks_task **which = calloc((size_t)n, sizeof *which);
    const char **texts = calloc((size_t)n, sizeof *texts);
    size_t *lens = calloc((size_t)n, sizeof *lens);
    double *rewards = malloc(sizeof *rewards * (size_t)n);
    char(*why)[VKS_TASK_MAX_WHY] = malloc(sizeof *why * (size_t)n);
    vks_task_scored *s = malloc(sizeof *s);
    int rc = which && texts && lens && rewards && why && s ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    for (int i = 0; !rc && i < n; i++) which[i] = &tasks[cs[i].task], texts[i] = cs[i].text, lens[i] = cs[i].len;
    if (!rc) rc = vks_task_score_many(which, texts, lens, n, parallel, rewards, why);
    for (int i = 0; !rc && i < n; i++) {
        *s = (vks_task_scored){.line = cs[i].line, .task_line = tasks[cs[i].task].line, .reward = rewards[i]};
        memcpy(s->id_json, cs[i].id, sizeof s->id_json);
        memcpy(s->why, why[i], sizeof s->why);
        rc = on_scored(ctx, s);
    }
    free(which), free(texts), free(lens), free(rewards), free(why), free(s);
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
        if (rc) break;
        ++*count;
        if (score && ++k == SCORE_CHUNK) {
            rc = score_chunk(tasks, cs, k, parallel, on_scored, ctx);
            for (int i = 0; i < k; i++) free(cs[i].text), cs[i].text = NULL;
            k = 0;
            if (rc) break;
        }
    }
    if (got < 0) rc = got;
    if (rc) rc = vks_error_prefix(rc, "line %lld", (long long)line_no);
    if (!rc && score && k) rc = score_chunk(tasks, cs, k, parallel, on_scored, ctx);
    for (int i = 0; i < k; i++) free(cs[i].text);
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
