/* task_env.c: multi-turn environments (vks_tasks.h): an episode started and
 * stepped through a user's environment program (the JSON-lines protocol, the
 * program run as reward programs are: task_program.c) or the built-in
 * calculator, and an episode replayed from its seed and recorded turns, as
 * `tasks score` and a verifier do. */
#include "vkswarm/vks_tasks.h"
#include "task_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static atomic_uint_fast64_t episodes; /* episodes started in this process: their names */

static int append_message(vks_env_episode *ep, const char *role, const char *content, size_t len) {
    if (ep->n >= 2 * VKS_ENV_MAX_MESSAGES * (VKS_ENV_MAX_TURNS + 1))
        return vks_set_error(VKS_ERR_FORMAT, "more than %d messages in an episode",
                             2 * VKS_ENV_MAX_MESSAGES * (VKS_ENV_MAX_TURNS + 1));
    if (ep->n == ep->capacity) {
        int cap = ep->capacity ? 2 * ep->capacity : 8;
        vks_env_message *m = realloc(ep->m, sizeof *m * (size_t)cap);
        if (!m) return vks_set_error(VKS_ERR_NOMEM, "out of memory for an episode");
        ep->m = m, ep->capacity = cap;
    }
    vks_env_message *m = &ep->m[ep->n];
    snprintf(m->role, sizeof m->role, "%s", role);
    m->content = malloc(len + 1);
    if (!m->content) return vks_set_error(VKS_ERR_NOMEM, "out of memory for an episode");
    memcpy(m->content, content, len);
    m->content[len] = 0;
    m->len = len;
    ep->n++;
    return VKS_OK;
}

void vks_env_episode_free(vks_env_episode *ep) {
    if (!ep) return;
    for (int i = 0; i < ep->n; i++) free(ep->m[i].content);
    free(ep->m);
    memset(ep, 0, sizeof *ep);
}

const vks_task *vks_task_first_environment(const vks_task *tasks, int64_t n) {
    for (int64_t i = 0; tasks && i < n; i++)
        if (tasks[i].verify == VKS_VERIFY_ENVIRONMENT) return &tasks[i];
    return NULL;
}

int vks_task_refuse_environments(const vks_task_spec *spec, const vks_task *tasks, int64_t n) {
    const vks_task *t = vks_task_first_environment(tasks, n);
    if (!t && !(spec && spec->kind == VKS_TASK_CALC)) return VKS_OK;
    char name[48];
    if (t) snprintf(name, sizeof name, "task line %lld", (long long)t->line);
    else snprintf(name, sizeof name, "task calc");
    return vks_set_error(VKS_ERR_FORMAT, "%s: a multi-turn environment; rl trains on its episodes on one process, "
                         "or across ranks without pipeline groups (those not yet)", name);
}

int vks_env_max_turns(const vks_task *t) { return t && t->program ? t->program->max_turns : VKS_ENV_DEFAULT_TURNS; }

/* Messages [from, to) of ep (none the assistant's) as text: contents joined by sep, then tail after each. */
static int join_text(const vks_env_episode *ep, int from, int to, const char *sep, const char *tail, char **out,
                     size_t *len) {
    *out = NULL, *len = 0;
    if (!ep || from < 0 || to > ep->n || from > to) return vks_set_error(VKS_ERR_ARG, "env text: bad range");
    size_t n = 0, ls = strlen(sep), lt = strlen(tail);
    for (int i = from; i < to; i++) {
        if (!strcmp(ep->m[i].role, "assistant")) return vks_set_error(VKS_ERR_ARG, "env text: an assistant message");
        n += ep->m[i].len + ls + lt;
    }
    char *t = malloc(n + 1), *at = t;
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "out of memory for an episode's text");
    for (int i = from; i < to; i++) {
        if (i > from) memcpy(at, sep, ls), at += ls;
        memcpy(at, ep->m[i].content, ep->m[i].len), at += ep->m[i].len;
        memcpy(at, tail, lt), at += lt;
    }
    *at = 0;
    *out = t, *len = (size_t)(at - t);
    return VKS_OK;
}

int vks_env_start_text(const vks_env_episode *ep, char **out, size_t *len) {
    int end = 0;
    while (ep && end < ep->n && strcmp(ep->m[end].role, "assistant")) end++;
    return join_text(ep, 0, end, "\n", "", out, len);
}

int vks_env_reply_text(const vks_env_episode *ep, int from, int to, char **out, size_t *len) {
    return join_text(ep, from, to, "", "\n", out, len);
}

/* ---- the built-in calculator ---- */

/* The last line of text starting (after spaces) with "calc:" (any case): its expression, trimmed, in buf. */
static bool last_calc_line(const char *text, size_t len, char *buf, size_t cap) {
    size_t end = 0;
    long at = vks_task_last_line(text, len, "calc:", &end);
    if (at < 0) return false;
    size_t s = (size_t)at, e = end;
    while (s < e && (text[s] == ' ' || text[s] == '\t' || text[s] == '\r')) s++;
    while (e > s && (text[e - 1] == ' ' || text[e - 1] == '\t' || text[e - 1] == '\r')) e--;
    size_t n = e - s < cap - 1 ? e - s : cap - 1;
    memcpy(buf, text + s, n);
    buf[n] = 0;
    return true;
}

static int calc_step(const vks_task *t, vks_env_episode *ep, const char *text, size_t len) {
    char expr[VKS_TASK_MAX_ANSWER], got[VKS_TASK_MAX_ANSWER], reply[96];
    if (vks_task_extract_answer(text, len, got, sizeof got)) { /* done: the numeric check */
        vks_task numeric = *t;
        numeric.verify = VKS_VERIFY_NUMERIC, numeric.program = NULL;
        ep->done = true;
        ep->reward = vks_task_score_why(&numeric, text, len, ep->note, sizeof ep->note);
        return VKS_OK;
    }
    if (!last_calc_line(text, len, expr, sizeof expr)) { /* neither: the episode ends without an answer */
        ep->done = true;
        ep->reward = 0;
        snprintf(ep->note, sizeof ep->note, "a turn with neither an answer line nor a calc: line");
        return VKS_OK;
    }
    int64_t num, den;
    if (!vks_task_eval_expr(expr, &num, &den))
        snprintf(reply, sizeof reply, "error: not an expression of integers, + - * / and parentheses");
    else if (den == 1) snprintf(reply, sizeof reply, "= %lld", (long long)num);
    else snprintf(reply, sizeof reply, "= %lld/%lld", (long long)num, (long long)den);
    return append_message(ep, "tool", reply, strlen(reply));
}

int vks_env_worked_episode(const vks_task *t, vks_env_episode *ep) {
    if (!t || !ep || t->verify != VKS_VERIFY_ENVIRONMENT || t->program)
        return vks_set_error(VKS_ERR_ARG, "env: a worked episode is the built-in calculator's only");
    char expr[VKS_TASK_MAX_PROMPT], turn[VKS_TASK_MAX_PROMPT + 16];
    if (sscanf(t->prompt, "What is %4000[^?]?", expr) != 1 && sscanf(t->prompt, "calc %4000s", expr) != 1)
        return vks_set_error(VKS_ERR_ARG, "env: task %s has no expression in its prompt", t->kind);
    int rc = vks_env_reset(t, 0, ep);
    snprintf(turn, sizeof turn, "calc: %s", expr);
    if (!rc) rc = vks_env_step(t, ep, turn, strlen(turn));
    const char *last = !rc && ep->n > 0 ? ep->m[ep->n - 1].content : "", *value = strncmp(last, "= ", 2) ? NULL : last + 2;
    if (!rc && !value) rc = vks_set_error(VKS_ERR_ARG, "env: '%s' gave no value", expr);
    if (!rc) snprintf(turn, sizeof turn, "answer: %s", value);
    if (!rc) rc = vks_env_step(t, ep, turn, strlen(turn));
    if (!rc && !(ep->done && ep->reward == 1.0))
        rc = vks_set_error(VKS_ERR_ARG, "env: the worked episode of %s fails", t->kind);
    if (rc) vks_env_episode_free(ep);
    return rc;
}

/* ---- environment programs ---- */

/* Reads an answer's "messages" into ep (each {"role": system|user|tool, "content": str}). */
static int read_messages(json_t *msgs, vks_env_episode *ep, bool at_reset) {
    size_t n = json_is_array(msgs) ? json_array_size(msgs) : 0;
    if (!json_is_array(msgs) || n > VKS_ENV_MAX_MESSAGES || (at_reset && n < 1))
        return vks_set_error(VKS_ERR_FORMAT, "\"messages\" is not a list of %d to %d messages", at_reset ? 1 : 0,
                             VKS_ENV_MAX_MESSAGES);
    for (size_t i = 0; i < n; i++) {
        json_t *m = json_array_get(msgs, i), *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *r = json_string_value(role);
        if (!json_is_object(m) || !r || (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "tool")))
            return vks_set_error(VKS_ERR_FORMAT, "message %zu: \"role\" is not system, user or tool", i + 1);
        if (!json_is_string(content) || json_string_length(content) > VKS_ENV_MAX_CONTENT ||
            memchr(json_string_value(content), 0, json_string_length(content)))
            return vks_set_error(VKS_ERR_FORMAT, "message %zu: \"content\" is not a string of at most %d bytes", i + 1,
                                 VKS_ENV_MAX_CONTENT);
        int rc = append_message(ep, r, json_string_value(content), json_string_length(content));
        if (rc) return rc;
    }
    return VKS_OK;
}

typedef struct {
    vks_env_episode *ep;
    bool at_reset;
} answer_ctx;

/* One answer line of an environment: checked whole before ep changes (a bad answer leaves ep as it was). */
static int check_answer(const char *command, const char *reply, void *ctx) {
    answer_ctx *a = ctx;
    vks_env_episode *ep = a->ep;
    json_error_t err;
    json_t *o = json_loads(reply, JSON_REJECT_DUPLICATES, &err);
    json_t *done = json_object_get(o, "done"), *reward = json_object_get(o, "reward"),
           *metrics = json_object_get(o, "metrics");
    bool is_done = !a->at_reset && json_is_true(done); /* an episode starts; a reset cannot end it */
    int rc = VKS_OK, n0 = ep->n;
    if (!json_is_object(o)) rc = vks_set_error(VKS_ERR_FORMAT, "an answer that is not a JSON object");
    else if (!a->at_reset && !json_is_boolean(done)) rc = vks_set_error(VKS_ERR_FORMAT, "no \"done\": true or false");
    else if (is_done && (!json_is_number(reward) || !(json_number_value(reward) >= 0 && json_number_value(reward) <= 1)))
        rc = vks_set_error(VKS_ERR_FORMAT, "done without a \"reward\" from 0 to 1");
    else if (metrics && !json_is_object(metrics)) rc = vks_set_error(VKS_ERR_FORMAT, "\"metrics\" is not an object");
    if (!rc) rc = read_messages(json_object_get(o, "messages"), ep, a->at_reset);
    if (!rc) {
        ep->done = is_done;
        ep->reward = is_done ? json_number_value(reward) : 0;
        char *ms = metrics ? json_dumps(metrics, JSON_COMPACT) : NULL;
        snprintf(ep->metrics, sizeof ep->metrics, "%s", ms && strlen(ms) < sizeof ep->metrics ? ms : "");
        free(ms);
    }
    while (rc && ep->n > n0) free(ep->m[--ep->n].content); /* what this answer added */
    json_decref(o);
    if (rc) {
        char cmd[300];
        vks_escape(command, strlen(command), cmd, sizeof cmd);
        rc = vks_error_prefix(rc, "environment '%s' answered %s", cmd, a->at_reset ? "a reset" : "a step");
    }
    return rc;
}

/* Sends request q (consumed: "episode" added) to t's environment program and reads its answer into ep. */
static int ask_program(const vks_task *t, vks_env_episode *ep, json_t *q, bool at_reset) {
    if (q && json_object_set_new(q, "episode", json_string(ep->id))) json_decref(q), q = NULL;
    char *line = q ? json_dumps(q, JSON_COMPACT) : NULL;
    json_decref(q);
    if (!line) return vks_set_error(VKS_ERR_NOMEM, "out of memory for an environment's request");
    answer_ctx a = {ep, at_reset};
    int rc = vks_task_program_ask(t, "environment", line, at_reset, check_answer, &a);
    free(line);
    return rc;
}

/* ---- episodes ---- */

int vks_env_reset(const vks_task *t, uint64_t seed, vks_env_episode *ep) {
    if (!t || !ep || t->verify != VKS_VERIFY_ENVIRONMENT) return vks_set_error(VKS_ERR_ARG, "env: not an environment task");
    memset(ep, 0, sizeof *ep);
    snprintf(ep->id, sizeof ep->id, "e%llu", (unsigned long long)atomic_fetch_add(&episodes, 1));
    if (!t->program) return append_message(ep, "user", t->prompt, strlen(t->prompt));
    json_t *q = json_pack("{s:s, s:I, s:o}", "type", "reset", "seed", (json_int_t)(seed & INT64_MAX), "task",
                          vks_task_request_json(t));
    return ask_program(t, ep, q, true);
}

int vks_env_step(const vks_task *t, vks_env_episode *ep, const char *completion, size_t len) {
    if (!t || !ep || !completion || t->verify != VKS_VERIFY_ENVIRONMENT)
        return vks_set_error(VKS_ERR_ARG, "env: bad arguments");
    if (ep->done || ep->turns >= vks_env_max_turns(t))
        return vks_set_error(VKS_ERR_ARG, "env: the episode is over (%s)", ep->done ? "done" : "max_turns");
    char *text = vks_task_valid_utf8(completion, len);
    int rc = text ? append_message(ep, "assistant", text, strlen(text)) : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (!rc) ep->turns++;
    if (!rc && !t->program) rc = calc_step(t, ep, completion, len);
    else if (!rc) {
        json_t *q = json_pack("{s:s, s:s}", "type", "step", "completion", text);
        rc = ask_program(t, ep, q, false);
    }
    free(text);
    return rc;
}

int vks_env_replay(const vks_task *t, uint64_t seed, const char *const *turns, const size_t *lens, int n_turns,
                   double *reward, char *why, size_t cap, vks_env_episode *out) {
    if (!t || !reward || n_turns < 0 || (n_turns && (!turns || !lens)) || t->verify != VKS_VERIFY_ENVIRONMENT)
        return vks_set_error(VKS_ERR_ARG, "env replay: bad arguments");
    vks_env_episode ep;
    int rc = vks_env_reset(t, seed, &ep), limit = vks_env_max_turns(t);
    char reason[VKS_TASK_MAX_WHY] = "";
    *reward = 0;
    if (n_turns > limit)
        snprintf(reason, sizeof reason, "%d turns, more than max_turns %d", n_turns, limit);
    for (int i = 0; !rc && !reason[0] && i < n_turns; i++) {
        if (ep.done) snprintf(reason, sizeof reason, "the environment ended after turn %d of %d", i, n_turns);
        else rc = vks_env_step(t, &ep, turns[i], lens[i]);
    }
    if (!rc && !reason[0] && !ep.done)
        snprintf(reason, sizeof reason, "not done after %d turn%s%s", n_turns, n_turns == 1 ? "" : "s",
                 n_turns == limit ? " (max_turns)" : "");
    if (!rc && !reason[0]) {
        *reward = ep.reward;
        int at = snprintf(reason, sizeof reason, "environment: done after %d turn%s, reward %g", n_turns,
                          n_turns == 1 ? "" : "s", ep.reward);
        const char *extra = ep.note[0] ? ep.note : ep.metrics; /* the calculator's reason, or a program's metrics */
        if (extra[0] && at > 0 && (size_t)at < sizeof reason)
            snprintf(reason + at, sizeof reason - (size_t)at, "; %s%.*s", ep.note[0] ? "" : "metrics ",
                     (int)(sizeof reason - (size_t)at), extra); /* cut to what fits */
    }
    if (why && cap) snprintf(why, cap, "%s", reason);
    if (out && !rc) *out = ep;
    else vks_env_episode_free(&ep);
    return rc;
}
