/* tasks.c: the built-in task generators (vks_tasks.h), keyed by (seed, index)
 * through Philox so every machine makes the same instances, their worked
 * completions for SFT warm-up, and the thinking-budget reward. */
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_philox.h"
#include "task_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>

#define TASK_STREAM 0x7a5cu /* the Philox "position" word of task generation (low 16 bits) */

static const struct { const char *name; vks_task_kind kind; int def, min, max; } kinds[] = {
    {"add", VKS_TASK_ADD, 3, 1, 9},         {"mul", VKS_TASK_MUL, 2, 1, 9},
    {"countdown", VKS_TASK_COUNTDOWN, 4, 2, 6}, {"sort", VKS_TASK_SORT, 5, 2, 16},
    {"reverse", VKS_TASK_REVERSE, 5, 2, 16},     {"code", VKS_TASK_CODE, 1, 1, 3},
    {"calc", VKS_TASK_CALC, 3, 2, 4},
};
#define N_KINDS (int)(sizeof kinds / sizeof kinds[0])

int vks_task_parse(const char *name, vks_task_spec *out) {
    if (!name || !out) return vks_set_error(VKS_ERR_ARG, "task: NULL argument");
    const char *colon = strchr(name, ':');
    size_t len = colon ? (size_t)(colon - name) : strlen(name);
    for (int i = 0; i < N_KINDS; i++) {
        if (strlen(kinds[i].name) != len || memcmp(kinds[i].name, name, len)) continue;
        out->kind = kinds[i].kind;
        out->size = kinds[i].def;
        out->short_prompt = false;
        if (!colon) return VKS_OK;
        const char *style = strstr(colon, ":short");
        if (style && !style[6]) out->short_prompt = true;
        if (style == colon && !style[6]) return VKS_OK; /* NAME:short */
        char *end;
        long v = strtol(colon + 1, &end, 10);
        if (out->short_prompt && end == style) end += 6;
        if (end == colon + 1 || *end || v < kinds[i].min || v > kinds[i].max)
            return vks_set_error(VKS_ERR_ARG, "task '%s': the size after ':' must be %d to %d", name, kinds[i].min,
                                 kinds[i].max);
        out->size = (int)v;
        return VKS_OK;
    }
    return vks_set_error(VKS_ERR_ARG, "unknown task '%s' (add, mul, countdown, sort, reverse, code, calc, optionally :N and :short)", name);
}

/* Whether name starts with a built-in's name (then alone or followed by ':'). */
static bool builtin_name(const char *name) {
    for (int i = 0; i < N_KINDS; i++) {
        size_t n = strlen(kinds[i].name);
        if (!strncmp(name, kinds[i].name, n) && (!name[n] || name[n] == ':')) return true;
    }
    return false;
}

int vks_task_resolve(const char *name, vks_task_spec *spec, const char **path) {
    if (!name || !spec || !path) return vks_set_error(VKS_ERR_ARG, "task: NULL argument");
    *path = NULL;
    size_t len = strlen(name);
    if (!strncmp(name, "file:", 5)) {
        if (!name[5]) return vks_set_error(VKS_ERR_ARG, "\"file:\" names no file (file:PATH for JSONL tasks)");
        *path = name + 5;
        return VKS_OK;
    }
    struct stat st;
    bool looks_like_path = strchr(name, '/') || (len > 6 && !strcmp(name + len - 6, ".jsonl"));
    if (looks_like_path || (!builtin_name(name) && !stat(name, &st) && S_ISREG(st.st_mode))) {
        *path = name;
        return VKS_OK;
    }
    if (builtin_name(name)) return vks_task_parse(name, spec);
    return vks_set_error(VKS_ERR_ARG, "unknown task '%s': neither a built-in task (add, mul, countdown, sort, reverse, "
                         "code, optionally :N and :short) nor a task file (PATH.jsonl, a path with '/', or file:PATH)", name);
}

void vks_task_spec_name(const vks_task_spec *s, char *buf, size_t cap) {
    for (int i = 0; i < N_KINDS; i++)
        if (kinds[i].kind == s->kind) {
            snprintf(buf, cap, "%s:%d%s", kinds[i].name, s->size, s->short_prompt ? ":short" : "");
            return;
        }
    snprintf(buf, cap, "?");
}

/* ---- deterministic draws ---- */

typedef struct {
    uint64_t seed;
    uint32_t stream; /* TASK_STREAM with the kind and size: tasks sharing a seed draw differently */
    uint32_t index, k; /* k counts draws within the instance */
} draws;

/* Uniform in [lo, hi] (multiply-shift: a bias below 2^-20 for these ranges). */
static int64_t draw(draws *d, int64_t lo, int64_t hi) {
    uint32_t u = vks_philox_u32(d->seed, d->index, d->stream, d->k++);
    return lo + (int64_t)(((uint64_t)u * (uint64_t)(hi - lo + 1)) >> 32);
}

static int64_t pow10i(int n) {
    int64_t p = 1;
    while (n-- > 0) p *= 10;
    return p;
}

/* A number of exactly `digits` digits (1 digit: 0-9). */
static int64_t draw_digits(draws *d, int digits) {
    return digits == 1 ? draw(d, 0, 9) : draw(d, pow10i(digits - 1), pow10i(digits) - 1);
}

static int fmt(char *buf, size_t cap, const char *f, ...) __attribute__((format(printf, 3, 4)));
static int fmt(char *buf, size_t cap, const char *f, ...) {
    va_list ap;
    va_start(ap, f);
    int n = vsnprintf(buf, cap, f, ap);
    va_end(ap);
    return n < 0 || (size_t)n >= cap ? vks_set_error(VKS_ERR_ARG, "task: text longer than %zu bytes", cap) : VKS_OK;
}

/* "a b c" into buf. */
static void join_list(const int64_t *v, int n, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < n && at < cap; i++) {
        int w = snprintf(buf + at, cap - at, i ? " %lld" : "%lld", (long long)v[i]);
        if (w < 0) break;
        at += (size_t)w;
    }
}

static const char answer_hint[] = "End with the line answer: ";

static int gen_arith(const vks_task_spec *s, draws *d, vks_task *t) {
    int64_t a = draw_digits(d, s->size), b = draw_digits(d, s->size);
    bool add = s->kind == VKS_TASK_ADD;
    t->verify = VKS_VERIFY_NUMERIC;
    int rc = s->short_prompt ? fmt(t->prompt, sizeof t->prompt, "%lld%c%lld=\n", (long long)a, add ? '+' : '*', (long long)b)
                             : fmt(t->prompt, sizeof t->prompt, "What is %lld %c %lld? %sN\n", (long long)a,
                                   add ? '+' : '*', (long long)b, answer_hint);
    return rc ? rc : fmt(t->answer, sizeof t->answer, "%lld", (long long)(add ? a + b : a * b));
}

static int gen_list(const vks_task_spec *s, draws *d, vks_task *t) {
    int64_t v[16];
    char list[128], ans[128];
    for (int i = 0; i < s->size; i++) v[i] = draw(d, 0, 99);
    join_list(v, s->size, list, sizeof list);
    int64_t r[16];
    for (int i = 0; i < s->size; i++) r[i] = s->kind == VKS_TASK_REVERSE ? v[s->size - 1 - i] : v[i];
    if (s->kind == VKS_TASK_SORT) /* insertion sort: at most 16 items */
        for (int i = 1; i < s->size; i++)
            for (int j = i; j > 0 && r[j - 1] > r[j]; j--) { int64_t x = r[j]; r[j] = r[j - 1]; r[j - 1] = x; }
    join_list(r, s->size, ans, sizeof ans);
    t->verify = VKS_VERIFY_LIST;
    const char *what = s->kind == VKS_TASK_SORT ? (s->short_prompt ? "sort" : "Sort ascending")
                                                 : (s->short_prompt ? "reverse" : "Reverse");
    int rc = s->short_prompt ? fmt(t->prompt, sizeof t->prompt, "%s %s\n", what, list)
                             : fmt(t->prompt, sizeof t->prompt, "%s: %s. %sLIST\n", what, list, answer_hint);
    return rc ? rc : fmt(t->answer, sizeof t->answer, "%s", ans);
}

/* Countdown: draw the numbers, then fold a random subset (at least two, in a
 * random order) with random operations, keeping every intermediate a positive
 * integer below 1000 (exact divisions only); the result is the target, so the
 * instance is solvable and the fold is one solution. */
static bool fold_target(draws *d, const int64_t *nums, int n, int64_t *target, char *expr, size_t cap) {
    int order[VKS_TASK_MAX_NUMBERS];
    for (int i = 0; i < n; i++) order[i] = i;
    for (int i = n - 1; i > 0; i--) { /* Fisher-Yates */
        int j = (int)draw(d, 0, i), x = order[i];
        order[i] = order[j], order[j] = x;
    }
    int used = (int)draw(d, 2, n);
    int64_t acc = nums[order[0]];
    char prev_op = 0, tmp[VKS_TASK_MAX_ANSWER];
    snprintf(expr, cap, "%lld", (long long)acc);
    for (int i = 1; i < used; i++) {
        int64_t x = nums[order[i]];
        static const char ops[] = "+-*/";
        char op = ops[draw(d, 0, 3)];
        int64_t r = op == '+' ? acc + x : op == '-' ? acc - x : op == '*' ? acc * x : (x && acc % x == 0 ? acc / x : -1);
        if (r <= 0 || r >= 1000 || (op == '/' && x == 1) || (op == '*' && x == 1)) op = '+', r = acc + x;
        bool paren = (op == '*' || op == '/') && (prev_op == '+' || prev_op == '-');
        snprintf(tmp, sizeof tmp, paren ? "(%s)%c%lld" : "%s%c%lld", expr, op, (long long)x);
        snprintf(expr, cap, "%s", tmp);
        acc = r;
        prev_op = op;
    }
    *target = acc;
    return acc >= 1 && acc < 1000;
}

static int gen_countdown(const vks_task_spec *s, draws *d, vks_task *t) {
    t->n_numbers = s->size;
    for (int i = 0; i < s->size; i++) t->numbers[i] = draw(d, 1, i == 0 ? 50 : 12);
    bool ok = false;
    for (int tries = 0; tries < 64 && !ok; tries++)
        ok = fold_target(d, t->numbers, s->size, &t->target, t->answer, sizeof t->answer);
    if (!ok) { /* never seen; the sum of two numbers is always a valid fallback */
        t->target = t->numbers[0] + t->numbers[1];
        snprintf(t->answer, sizeof t->answer, "%lld+%lld", (long long)t->numbers[0], (long long)t->numbers[1]);
    }
    char list[128];
    join_list(t->numbers, s->size, list, sizeof list);
    t->verify = VKS_VERIFY_COUNTDOWN;
    if (s->short_prompt) return fmt(t->prompt, sizeof t->prompt, "make %lld from %s\n", (long long)t->target, list);
    return fmt(t->prompt, sizeof t->prompt, "Make %lld from %s with + - * / (each number at most once). %sEXPR\n",
               (long long)t->target, list, answer_hint);
}

/* code: a polynomial of degree `size` with coefficients 1-9, as a Python expression in x ("3*x+1",
 * "2*x*x+5*x+7"); its tests are made from the coefficients when scored (vks_task_code_tests_of). */
static int gen_code(const vks_task_spec *s, draws *d, vks_task *t) {
    t->n_numbers = s->size + 1;
    for (int i = 0; i <= s->size; i++) t->numbers[i] = draw(d, 1, 9);
    char expr[128];
    vks_task_code_expr(t, expr, sizeof expr);
    t->verify = VKS_VERIFY_CODE;
    int rc = s->short_prompt ? fmt(t->prompt, sizeof t->prompt, "python f(x)=%s\n", expr)
                             : fmt(t->prompt, sizeof t->prompt, "Write a Python function f(x) that returns %s. Reply "
                                   "with the code in a ```python block.\n", expr);
    return rc ? rc : fmt(t->answer, sizeof t->answer, "def f(x): return %s", expr);
}

/* calc: `size` two-digit operands joined by + - * (the first operator *, so that the product is worth a
 * calculator call), e.g. "37*12+85": a multi-turn task on the built-in calculator environment. */
static int gen_calc(const vks_task_spec *s, draws *d, vks_task *t) {
    char expr[64];
    int at = snprintf(expr, sizeof expr, "%lld", (long long)draw(d, 10, 99));
    for (int i = 1; i < s->size; i++)
        at += snprintf(expr + at, sizeof expr - (size_t)at, "%c%lld", i == 1 ? '*' : "+-*"[draw(d, 0, 2)],
                       (long long)draw(d, 10, 99));
    int64_t num, den;
    if (!vks_task_eval_expr(expr, &num, &den) || den != 1) return vks_set_error(VKS_ERR_ARG, "calc: '%s'", expr);
    t->verify = VKS_VERIFY_ENVIRONMENT;
    int rc = s->short_prompt ? fmt(t->prompt, sizeof t->prompt, "calc %s\n", expr)
                             : fmt(t->prompt, sizeof t->prompt, "What is %s? You may use the calculator: a line "
                                   "calc: EXPR gets its value back. %sN\n", expr, answer_hint);
    return rc ? rc : fmt(t->answer, sizeof t->answer, "%lld", (long long)num);
}

int vks_task_generate(const vks_task_spec *s, uint64_t seed, uint32_t index, vks_task *out) {
    if (!s || !out) return vks_set_error(VKS_ERR_ARG, "task: NULL argument");
    vks_task_spec chk;
    char name[32];
    vks_task_spec_name(s, name, sizeof name);
    if (vks_task_parse(name, &chk)) return VKS_ERR_ARG;
    memset(out, 0, sizeof *out);
    out->line = index;
    snprintf(out->kind, sizeof out->kind, "%s", name);
    draws d = {.seed = seed, .stream = TASK_STREAM | (uint32_t)s->kind << 24 | (uint32_t)s->size << 16, .index = index};
    switch (s->kind) {
    case VKS_TASK_ADD:
    case VKS_TASK_MUL: return gen_arith(s, &d, out);
    case VKS_TASK_COUNTDOWN: return gen_countdown(s, &d, out);
    case VKS_TASK_CODE: return gen_code(s, &d, out);
    case VKS_TASK_CALC: return gen_calc(s, &d, out);
    default: return gen_list(s, &d, out);
    }
}

/* Long multiplication by the digits of b: "a*b = a*4 + a*30 = 48 + 360 = 408". */
static int worked_mul(int64_t a, int64_t b, const char *answer, char *buf, size_t cap) {
    char terms[VKS_TASK_MAX_ANSWER * 2] = "", parts[VKS_TASK_MAX_ANSWER * 2] = "";
    size_t ta = 0, pa = 0;
    int64_t place = 1;
    for (int64_t rest = b; rest > 0 && ta < sizeof terms && pa < sizeof parts; rest /= 10, place *= 10) {
        int64_t digit = (rest % 10) * place;
        ta += (size_t)snprintf(terms + ta, sizeof terms - ta, ta ? " + %lld*%lld" : "%lld*%lld", (long long)a, (long long)digit);
        if (ta < sizeof terms)
            pa += (size_t)snprintf(parts + pa, sizeof parts - pa, pa ? " + %lld" : "%lld", (long long)(a * digit));
    }
    if (b < 10) return fmt(buf, cap, "%lld*%lld = %s\nanswer: %s", (long long)a, (long long)b, answer, answer);
    return fmt(buf, cap, "%lld*%lld = %s = %s = %s\nanswer: %s", (long long)a, (long long)b, terms, parts, answer, answer);
}

int vks_task_worked_completion(const vks_task *t, char *buf, size_t cap) {
    if (!t || !buf || !cap) return vks_set_error(VKS_ERR_ARG, "task: NULL argument");
    if (t->verify == VKS_VERIFY_ENVIRONMENT) /* a transcript of several turns, not one completion */
        return vks_set_error(VKS_ERR_ARG, "task %s: a multi-turn environment has no one-completion worked answer",
                             t->kind);
    long long a, b;
    char op;
    if (sscanf(t->prompt, "What is %lld %c %lld?", &a, &op, &b) == 3) {
        if (op == '*') return worked_mul(a, b, t->answer, buf, cap);
        return fmt(buf, cap, "%lld+%lld = %s\nanswer: %s", a, b, t->answer, t->answer);
    }
    if (t->verify == VKS_VERIFY_COUNTDOWN)
        return fmt(buf, cap, "%s = %lld\nanswer: %s", t->answer, (long long)t->target, t->answer);
    if (t->verify == VKS_VERIFY_CODE && !t->code) { /* the built-in: its reference in a block (:short: a lambda) */
        char expr[128];
        vks_task_code_expr(t, expr, sizeof expr);
        if (strstr(t->kind, ":short")) return fmt(buf, cap, "```\nf=lambda x:%s\n```", expr);
        return fmt(buf, cap, "```python\ndef f(x):\n    return %s\n```", expr);
    }
    return fmt(buf, cap, "answer: %s", t->answer);
}

double vks_task_length_reward(double r_task, int target_tokens, int completion_tokens, double lambda) {
    double off = (double)target_tokens - (double)completion_tokens;
    return r_task - lambda * (off < 0 ? -off : off);
}
