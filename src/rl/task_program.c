/* task_program.c: reward programs (vks_tasks.h "task_type": "program"): the
 * task line read, each distinct program started once per process (sandboxed
 * unless the line says otherwise) and kept, asked one JSON line per completion,
 * its answer checked; a program that fails is started again at most
 * VKS_TASK_PROGRAM_RESTARTS times, then scoring fails naming it and the task. */
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"
#include "task_internal.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROGRAM_DEFAULT_TIMEOUT_S 10.0
#define PROGRAM_MAX_TIMEOUT_S 600.0
#define PROGRAM_MAX_INFO (64 * 1024)

/* ---- reading a task line ---- */

/* A command from a task line (where: what it is, for errors; key: its name): a string of 1 to
 * VKS_TASK_MAX_COMMAND - 1 bytes. */
static int command_of(json_t *cmd, const char *where, const char *key) {
    if (!json_is_string(cmd) || !json_string_length(cmd) || json_string_length(cmd) >= VKS_TASK_MAX_COMMAND ||
        memchr(json_string_value(cmd), 0, json_string_length(cmd)))
        return vks_set_error(VKS_ERR_FORMAT, "%s needs \"%s\": a command of 1 to %d bytes", where, key,
                             VKS_TASK_MAX_COMMAND - 1);
    return VKS_OK;
}

/* "program": C, or "rubric": [{"program": C, "weight": W}, ...]: the commands and weights (normalized). */
static int programs_of(json_t *root, json_t *cmds[VKS_TASK_MAX_RUBRIC], double weights[VKS_TASK_MAX_RUBRIC], int *n) {
    json_t *cmd = json_object_get(root, "program"), *rubric = json_object_get(root, "rubric");
    if (cmd && rubric) return vks_set_error(VKS_ERR_FORMAT, "a program task has \"program\" or \"rubric\", not both");
    if (!rubric) {
        cmds[0] = cmd, weights[0] = 1, *n = 1;
        return command_of(cmd, "a program task", "program");
    }
    size_t k = json_is_array(rubric) ? json_array_size(rubric) : 0;
    if (k < 1 || k > VKS_TASK_MAX_RUBRIC)
        return vks_set_error(VKS_ERR_FORMAT, "\"rubric\" is not a list of 1 to %d {\"program\", \"weight\"} objects",
                             VKS_TASK_MAX_RUBRIC);
    double sum = 0;
    for (size_t i = 0; i < k; i++) {
        json_t *e = json_array_get(rubric, i), *w = json_object_get(e, "weight");
        char where[48];
        snprintf(where, sizeof where, "rubric entry %zu", i + 1);
        if (!json_is_object(e) || json_object_size(e) != 2u - !w)
            return vks_set_error(VKS_ERR_FORMAT, "%s is not {\"program\": ..., \"weight\": ...}", where);
        int rc = command_of(json_object_get(e, "program"), where, "program");
        if (rc) return rc;
        double wv = w ? (json_is_number(w) ? json_number_value(w) : -1) : 1;
        if (!(wv > 0 && wv <= 1e6))
            return vks_set_error(VKS_ERR_FORMAT, "%s: \"weight\" is not a number above 0 (at most 1e6; a penalty, a "
                                 "weight below 0, would take the reward out of [0, 1])", where);
        cmds[i] = json_object_get(e, "program"), weights[i] = wv, sum += wv;
    }
    for (size_t i = 0; i < k; i++) weights[i] /= sum;
    *n = (int)k;
    return VKS_OK;
}

/* An environment's command and "max_turns" (environment tasks: one command, no rubric). */
static int environment_of(json_t *root, json_t **cmd, int *max_turns) {
    json_t *mt = json_object_get(root, "max_turns");
    *cmd = json_object_get(root, "environment");
    if (json_object_get(root, "program") || json_object_get(root, "rubric"))
        return vks_set_error(VKS_ERR_FORMAT, "an environment task has \"environment\", not \"program\" or \"rubric\"");
    if (mt && (!json_is_integer(mt) || json_integer_value(mt) < 1 || json_integer_value(mt) > VKS_ENV_MAX_TURNS))
        return vks_set_error(VKS_ERR_FORMAT, "\"max_turns\" is not an integer from 1 to %d", VKS_ENV_MAX_TURNS);
    *max_turns = mt ? (int)json_integer_value(mt) : VKS_ENV_DEFAULT_TURNS;
    return command_of(*cmd, "an environment task", "environment");
}

int vks_task_program_from_json(struct json_t *root, vks_task *t, const char *dir) {
    json_t *info = json_object_get(root, "info"), *sb = json_object_get(root, "sandbox"),
           *to = json_object_get(root, "timeout_s"), *cmds[VKS_TASK_MAX_RUBRIC];
    double weights[VKS_TASK_MAX_RUBRIC] = {1};
    int n = 1, max_turns = 0;
    int rc = t->verify == VKS_VERIFY_ENVIRONMENT ? environment_of(root, &cmds[0], &max_turns)
                                                  : programs_of(root, cmds, weights, &n);
    if (rc) return rc;
    if (sb && !json_is_boolean(sb)) return vks_set_error(VKS_ERR_FORMAT, "\"sandbox\" is not true or false");
    double timeout = PROGRAM_DEFAULT_TIMEOUT_S;
    if (to) {
        if (!json_is_number(to) || !(json_number_value(to) > 0 && json_number_value(to) <= PROGRAM_MAX_TIMEOUT_S))
            return vks_set_error(VKS_ERR_FORMAT, "\"timeout_s\" is not a number above 0 and at most %g",
                                 PROGRAM_MAX_TIMEOUT_S);
        timeout = json_number_value(to);
    }
    char *info_json = info ? json_dumps(info, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    if (info && (!info_json || strlen(info_json) > PROGRAM_MAX_INFO)) {
        free(info_json);
        return vks_set_error(VKS_ERR_FORMAT, "\"info\" is longer than %d bytes as JSON", PROGRAM_MAX_INFO);
    }
    const char *info_text = info_json ? info_json : "null";
    size_t lc = 0, ld = strlen(dir), li = strlen(info_text);
    for (int i = 0; i < n; i++) lc += json_string_length(cmds[i]) + 1;
    vks_task_program *p = calloc(1, sizeof *p + lc + ld + li + 2);
    if (!p) {
        free(info_json);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory for a program task");
    }
    char *at = (char *)(p + 1);
    p->n = n;
    for (int i = 0; i < n; i++) {
        p->commands[i] = memcpy(at, json_string_value(cmds[i]), json_string_length(cmds[i]) + 1);
        at += json_string_length(cmds[i]) + 1;
        p->weights[i] = weights[i];
    }
    p->dir = memcpy(at, dir, ld + 1), at += ld + 1;
    p->info_json = memcpy(at, info_text, li + 1);
    p->sandboxed = sb ? json_is_true(sb) : true;
    p->timeout_s = timeout;
    p->max_turns = max_turns;
    free(info_json);
    t->program = p;
    return VKS_OK;
}

int vks_task_program_parse(const char *json, const char *dir, vks_task_program **out) {
    *out = NULL;
    json_error_t err;
    json_t *o = json && dir ? json_loads(json, JSON_REJECT_DUPLICATES, &err) : NULL;
    if (!json_is_object(o)) {
        json_decref(o);
        return vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
    }
    vks_task t = {0};
    int rc = vks_task_program_from_json(o, &t, dir);
    json_decref(o);
    if (!rc) *out = t.program;
    return rc;
}

/* ---- the running programs ---- */

typedef struct entry {
    char *command, *dir;
    bool sandboxed, environment; /* one process per (command, dir, sandboxed, protocol) */
    vks_sandbox_proc *proc;
    int starts;
    pthread_mutex_t lock; /* one request at a time */
    struct entry *next;
} entry;

static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static entry *registry;

/* The running program of command `command` of p (started when first asked). */
static entry *entry_for(const vks_task_program *p, const char *command) {
    pthread_mutex_lock(&registry_lock);
    entry *e = registry;
    bool environment = p->max_turns > 0;
    while (e && (strcmp(e->command, command) || strcmp(e->dir, p->dir) || e->sandboxed != p->sandboxed ||
                 e->environment != environment))
        e = e->next;
    if (!e && (e = calloc(1, sizeof *e))) {
        e->command = strdup(command);
        e->dir = strdup(p->dir);
        e->sandboxed = p->sandboxed;
        e->environment = environment;
        pthread_mutex_init(&e->lock, NULL);
        if (!e->command || !e->dir) {
            free(e->command), free(e->dir), free(e);
            e = NULL;
        } else {
            e->next = registry;
            registry = e;
        }
    }
    pthread_mutex_unlock(&registry_lock);
    return e;
}

void vks_task_programs_stop(void) {
    pthread_mutex_lock(&registry_lock);
    for (entry *e = registry, *next; e; e = next) {
        next = e->next;
        vks_sandbox_proc_stop(e->proc);
        pthread_mutex_destroy(&e->lock);
        free(e->command), free(e->dir), free(e);
    }
    registry = NULL;
    pthread_mutex_unlock(&registry_lock);
}

char *vks_task_valid_utf8(const char *s, size_t len) {
    char *out = malloc(3 * len + 1);
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < len;) {
        size_t n = vks_utf8_decode(s + i, len - i, NULL);
        if (n && s[i]) memcpy(out + o, s + i, n), o += n, i += n;
        else memcpy(out + o, "\xef\xbf\xbd", 3), o += 3, i += n ? n : 1;
    }
    out[o] = 0;
    return out;
}

json_t *vks_task_request_json(const vks_task *t) {
    char *prompt = vks_task_valid_utf8(t->prompt, strlen(t->prompt));
    char *answer = vks_task_valid_utf8(t->answer, strlen(t->answer));
    json_error_t err;
    json_t *info = t->program ? json_loads(t->program->info_json, JSON_DECODE_ANY, &err) : json_null();
    json_t *q = prompt && answer && info
                    ? json_pack("{s:s, s:o, s:o}", "prompt", prompt, "answer",
                                t->answer[0] ? json_string(answer) : json_null(), "info", info)
                    : NULL;
    if (!q) json_decref(info);
    free(prompt), free(answer);
    return q;
}

/* The request line for one completion (malloc'd, compact JSON). */
static char *request_line(const vks_task *t, const char *text, size_t len) {
    char *clean = vks_task_valid_utf8(text, len);
    json_t *q = vks_task_request_json(t);
    if (q && clean && json_object_set_new(q, "completion", json_string(clean))) json_decref(q), q = NULL;
    char *line = q && clean ? json_dumps(q, JSON_COMPACT) : NULL;
    json_decref(q);
    free(clean);
    return line;
}

/* The reward in an answer line; an error saying what is wrong with it. */
static int parse_answer(const char *command, const char *reply, double *reward, char *metrics, size_t cap) {
    json_error_t err;
    json_t *a = json_loads(reply, JSON_REJECT_DUPLICATES, &err);
    int rc = VKS_OK;
    json_t *r = a ? json_object_get(a, "reward") : NULL, *m = a ? json_object_get(a, "metrics") : NULL;
    char shown[120];
    vks_escape(reply, strlen(reply) < 60 ? strlen(reply) : 60, shown, sizeof shown);
    char cmd[300];
    vks_escape(command, strlen(command), cmd, sizeof cmd);
    if (!json_is_object(a)) rc = vks_set_error(VKS_ERR_FORMAT, "'%s' answered '%s', not a JSON object", cmd, shown);
    else if (!json_is_number(r))
        rc = vks_set_error(VKS_ERR_FORMAT, "'%s' answered '%s' without a number \"reward\"", cmd, shown);
    else if (!(json_number_value(r) >= 0 && json_number_value(r) <= 1))
        rc = vks_set_error(VKS_ERR_FORMAT, "'%s' answered reward %g, not a number from 0 to 1", cmd, json_number_value(r));
    else if (m && !json_is_object(m))
        rc = vks_set_error(VKS_ERR_FORMAT, "'%s' answered \"metrics\" that is not an object", cmd);
    if (!rc) {
        *reward = json_number_value(r);
        metrics[0] = 0;
        char *ms = m ? json_dumps(m, JSON_COMPACT) : NULL;
        if (ms) snprintf(metrics, cap, "%s", ms);
        free(ms);
    }
    json_decref(a);
    return rc;
}

/* Asks e's program one line (for task t; what: "reward program", "environment") and has check() read the
 * answer. After a failure the program is stopped; it is started again (for this request when retry, else for
 * the next one) while it has been started at most VKS_TASK_PROGRAM_RESTARTS times before. */
static int ask(entry *e, const vks_task *t, const char *what, const char *line, bool retry,
               int (*check)(const char *command, const char *reply, void *ctx), void *ctx) {
    for (;;) {
        int rc = VKS_OK;
        if (!e->proc && e->starts > VKS_TASK_PROGRAM_RESTARTS)
            return vks_set_error(VKS_ERR_IO, "%s (task line %lld): failed %d times, not started again", what,
                                 (long long)t->line, e->starts);
        if (!e->proc) {
            vks_sandbox_proc_spec spec = {.command = e->command, .dir = e->dir, .sandboxed = e->sandboxed};
            vks_sandbox_limits l = {.memory_bytes = 4ll << 30, .processes = 64, .file_bytes = 64ll << 20};
            e->starts++;
            rc = vks_sandbox_proc_start(&spec, &l, &e->proc);
        }
        char *reply = NULL;
        if (!rc) rc = vks_sandbox_proc_request(e->proc, line, strlen(line), t->program->timeout_s, &reply);
        if (!rc) rc = check(e->command, reply, ctx);
        free(reply);
        if (!rc) return VKS_OK;
        vks_sandbox_proc_stop(e->proc); /* after any failure: a fresh start */
        e->proc = NULL;
        if (!retry || e->starts > VKS_TASK_PROGRAM_RESTARTS)
            return e->starts == 1 ? vks_error_prefix(rc, "%s (task line %lld; started once)", what, (long long)t->line)
                                  : vks_error_prefix(rc, "%s (task line %lld; started %d times)", what,
                                                     (long long)t->line, e->starts);
    }
}

/* ask() of the running program of command (one of t's), one request at a time. */
static int ask_command(const vks_task *t, const char *command, const char *what, const char *line, bool retry,
                       int (*check)(const char *command, const char *reply, void *ctx), void *ctx) {
    entry *e = entry_for(t->program, command);
    if (!e) return vks_set_error(VKS_ERR_NOMEM, "out of memory for a %s", what);
    pthread_mutex_lock(&e->lock);
    int rc = ask(e, t, what, line, retry, check, ctx);
    pthread_mutex_unlock(&e->lock);
    return rc;
}

int vks_task_program_ask(const vks_task *t, const char *what, const char *line, bool retry,
                         int (*check)(const char *command, const char *reply, void *ctx), void *ctx) {
    return ask_command(t, t->program->commands[0], what, line, retry, check, ctx);
}

typedef struct {
    double *reward;
    char *metrics;
    size_t cap;
} answer_ctx;

static int check_answer(const char *command, const char *reply, void *ctx) {
    answer_ctx *a = ctx;
    return parse_answer(command, reply, a->reward, a->metrics, a->cap);
}

int vks_task_score_programs(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                            double *rewards, char (*why)[VKS_TASK_MAX_WHY], vks_task_metrics *sink) {
    for (int64_t i = 0; i < n; i++) {
        const vks_task_program *p = tasks[i]->program;
        if (tasks[i]->verify != VKS_VERIFY_PROGRAM) continue;
        if (!p || p->n < 1 || p->n > VKS_TASK_MAX_RUBRIC) return vks_set_error(VKS_ERR_ARG, "a program task without a program");
        char *line = request_line(tasks[i], texts[i], lens[i]);
        if (!line) return vks_set_error(VKS_ERR_NOMEM, "out of memory for a reward program's request");
        char parts[VKS_TASK_MAX_WHY] = "", metrics[4096] = "", all_metrics[VKS_TASK_MAX_WHY] = "";
        double sum = 0;
        for (int k = 0; k < p->n; k++) {
            double r = 0;
            answer_ctx a = {&r, metrics, sizeof metrics};
            int rc = ask_command(tasks[i], p->commands[k], "reward program", line, true, check_answer, &a);
            if (rc) {
                free(line);
                return rc;
            }
            sum += p->weights[k] * r;
            if (sink && metrics[0]) vks_task_metrics_add(sink, metrics);
            size_t at = strlen(parts), am = strlen(all_metrics);
            snprintf(parts + at, sizeof parts - at, "%s%.4g*%g", k ? " + " : "", p->weights[k], r);
            if (metrics[0]) snprintf(all_metrics + am, sizeof all_metrics - am, "%s%s", am ? " " : "", metrics);
        }
        free(line);
        rewards[i] = p->n == 1 ? sum : fmin(1.0, fmax(0.0, sum)); /* the rounding of the weights' sum */
        if (why && p->n == 1)
            snprintf(why[i], VKS_TASK_MAX_WHY, "reward program: %g%s%.200s", rewards[i], all_metrics[0] ? "; metrics " : "",
                     all_metrics);
        else if (why)
            snprintf(why[i], VKS_TASK_MAX_WHY, "rubric: %.100s = %g%s%.120s", parts, rewards[i],
                     all_metrics[0] ? "; metrics " : "", all_metrics);
    }
    return VKS_OK;
}

/* ---- the programs' metrics, summed for the run ---- */

struct vks_task_metrics {
    pthread_mutex_t lock;
    int n;
    char names[VKS_TASK_MAX_METRICS][VKS_TASK_METRIC_NAME];
    double sum[VKS_TASK_MAX_METRICS];
    int64_t count[VKS_TASK_MAX_METRICS];
};

int vks_task_metrics_create(vks_task_metrics **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return vks_set_error(VKS_ERR_NOMEM, "out of memory for the programs' metrics");
    pthread_mutex_init(&(*out)->lock, NULL);
    return VKS_OK;
}

void vks_task_metrics_free(vks_task_metrics *m) {
    if (!m) return;
    pthread_mutex_destroy(&m->lock);
    free(m);
}

/* A name metrics.jsonl can carry as it is. */
static bool metric_name_ok(const char *k) {
    size_t n = strlen(k);
    if (!n || n >= VKS_TASK_METRIC_NAME) return false;
    for (size_t i = 0; i < n; i++)
        if (!((k[i] >= 'a' && k[i] <= 'z') || (k[i] >= 'A' && k[i] <= 'Z') || (k[i] >= '0' && k[i] <= '9') ||
              k[i] == '_' || k[i] == '.' || k[i] == '-'))
            return false;
    return true;
}

void vks_task_metrics_add(vks_task_metrics *m, const char *json) {
    json_error_t err;
    json_t *o = m && json ? json_loads(json, 0, &err) : NULL;
    const char *k;
    json_t *v;
    if (!json_is_object(o)) {
        json_decref(o);
        return;
    }
    pthread_mutex_lock(&m->lock);
    json_object_foreach(o, k, v) {
        double x = json_is_number(v) ? json_number_value(v) : json_is_boolean(v) ? (double)json_is_true(v) : NAN;
        if (!isfinite(x) || !metric_name_ok(k)) continue;
        int i = 0;
        while (i < m->n && strcmp(m->names[i], k)) i++;
        if (i == m->n) {
            if (m->n == VKS_TASK_MAX_METRICS) continue;
            snprintf(m->names[m->n++], VKS_TASK_METRIC_NAME, "%s", k);
        }
        m->sum[i] += x, m->count[i]++;
    }
    pthread_mutex_unlock(&m->lock);
    json_decref(o);
}

int vks_task_metrics_take(vks_task_metrics *m, char (*names)[VKS_TASK_METRIC_NAME], double *means, int cap) {
    if (!m) return 0;
    int k = 0;
    pthread_mutex_lock(&m->lock);
    for (int i = 0; i < m->n && k < cap; i++) {
        if (!m->count[i]) continue;
        memcpy(names[k], m->names[i], VKS_TASK_METRIC_NAME);
        means[k++] = m->sum[i] / (double)m->count[i];
        m->sum[i] = 0, m->count[i] = 0;
    }
    pthread_mutex_unlock(&m->lock);
    return k;
}
