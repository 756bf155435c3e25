/* task_code.c: code tasks (vks_tasks.h "task_type": "code"): their tests read
 * from a task line, the program taken from a completion, and the reward from
 * running it in sandboxes (vks_sandbox.h); vks_task_score_many, which scores
 * completions of any task and says why. */
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"
#include "task_internal.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CODE_PYTHON "/usr/bin/python3"
#define CODE_FILE "main.py"
#define CODE_DEFAULT_TIME_S 4.0
#define CODE_MAX_TIME_S 60.0
#define CODE_DEFAULT_MEMORY_MB 512
#define CODE_MIN_MEMORY_MB 32
#define CODE_MAX_MEMORY_MB 16384

/* ---- reading a task line ---- */

static int str_of(json_t *v, const char *what, size_t i, const char **out, size_t *len) {
    if (!json_is_string(v)) return vks_set_error(VKS_ERR_FORMAT, "\"tests\"[%zu].%s is not a string", i, what);
    *out = json_string_value(v);
    *len = json_string_length(v);
    if (memchr(*out, 0, *len)) return vks_set_error(VKS_ERR_FORMAT, "\"tests\"[%zu].%s holds a NUL byte", i, what);
    return VKS_OK;
}

/* One allocation holds the struct, the case pointers and every string (the task array's owner frees it). */
static int code_alloc(json_t *tests, const char *test_code, size_t test_len, vks_code_tests **out) {
    size_t n = tests ? json_array_size(tests) : 0, bytes = sizeof(vks_code_tests) + 2 * n * sizeof(char *);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(tests, i);
        const char *s = NULL;
        size_t len = 0;
        if (!json_is_object(c)) return vks_set_error(VKS_ERR_FORMAT, "\"tests\"[%zu] is not an object", i);
        int rc = str_of(json_object_get(c, "input"), "input", i, &s, &len);
        if (!rc) bytes += len + 1;
        if (!rc) rc = str_of(json_object_get(c, "output"), "output", i, &s, &len);
        if (rc) return rc;
        bytes += len + 1;
    }
    bytes += test_code ? test_len + 1 : 0;
    vks_code_tests *ct = calloc(1, bytes);
    if (!ct) return vks_set_error(VKS_ERR_NOMEM, "out of memory for a code task's tests");
    ct->n_cases = (int)n;
    ct->input = (const char **)(ct + 1);
    ct->output = ct->input + n;
    char *at = (char *)(ct->output + n);
    for (size_t i = 0; i < n; i++) {
        json_t *c = json_array_get(tests, i);
        for (int k = 0; k < 2; k++) {
            json_t *v = json_object_get(c, k ? "output" : "input");
            size_t len = json_string_length(v);
            memcpy(at, json_string_value(v), len + 1);
            (k ? ct->output : ct->input)[i] = at;
            at += len + 1;
        }
    }
    if (test_code) {
        memcpy(at, test_code, test_len + 1);
        ct->test_code = at;
    }
    *out = ct;
    return VKS_OK;
}

static int code_limits(json_t *root, vks_code_tests *ct) {
    json_t *t = json_object_get(root, "time_limit_s"), *m = json_object_get(root, "memory_mb"),
           *r = json_object_get(root, "reward");
    ct->time_limit_s = CODE_DEFAULT_TIME_S;
    ct->memory_mb = CODE_DEFAULT_MEMORY_MB;
    if (t) {
        if (!json_is_number(t) || !(json_number_value(t) > 0 && json_number_value(t) <= CODE_MAX_TIME_S))
            return vks_set_error(VKS_ERR_FORMAT, "\"time_limit_s\" is not a number above 0 and at most %g",
                                 CODE_MAX_TIME_S);
        ct->time_limit_s = json_number_value(t);
    }
    if (m) {
        if (!json_is_integer(m) || json_integer_value(m) < CODE_MIN_MEMORY_MB || json_integer_value(m) > CODE_MAX_MEMORY_MB)
            return vks_set_error(VKS_ERR_FORMAT, "\"memory_mb\" is not an integer from %d to %d", CODE_MIN_MEMORY_MB,
                                 CODE_MAX_MEMORY_MB);
        ct->memory_mb = (int)json_integer_value(m);
    }
    if (r) {
        if (!json_is_string(r) || (strcmp(json_string_value(r), "all") && strcmp(json_string_value(r), "fraction")))
            return vks_set_error(VKS_ERR_FORMAT, "\"reward\" is not \"all\" or \"fraction\"");
        ct->fraction = !strcmp(json_string_value(r), "fraction");
    }
    return VKS_OK;
}

int vks_task_code_from_json(struct json_t *root, vks_task *t) {
    json_t *tests = json_object_get(root, "tests"), *tc = json_object_get(root, "test_code");
    if (!tests == !tc) return vks_set_error(VKS_ERR_FORMAT, "a code task needs \"tests\" or \"test_code\" (one of them)");
    if (tests && (!json_is_array(tests) || json_array_size(tests) < 1 || json_array_size(tests) > VKS_TASK_MAX_CASES))
        return vks_set_error(VKS_ERR_FORMAT, "\"tests\" is not an array of 1 to %d {\"input\", \"output\"} cases",
                             VKS_TASK_MAX_CASES);
    if (tc && (!json_is_string(tc) || memchr(json_string_value(tc), 0, json_string_length(tc))))
        return vks_set_error(VKS_ERR_FORMAT, "\"test_code\" is not a string without NUL bytes");
    if (json_object_get(root, "answer"))
        return vks_set_error(VKS_ERR_FORMAT, "a code task has tests, not an \"answer\"");
    vks_code_tests *ct = NULL;
    int rc = code_alloc(tests, tc ? json_string_value(tc) : NULL, tc ? json_string_length(tc) : 0, &ct);
    if (!rc) rc = code_limits(root, ct);
    if (rc) {
        free(ct);
        return rc;
    }
    t->code = ct;
    return VKS_OK;
}

void vks_task_free(vks_task *tasks, int64_t n) {
    for (int64_t i = 0; tasks && i < n; i++) free(tasks[i].code), free(tasks[i].program);
    free(tasks);
}

const vks_task *vks_task_first_code(const vks_task *tasks, int64_t n) {
    for (int64_t i = 0; tasks && i < n; i++)
        if (tasks[i].verify == VKS_VERIFY_CODE) return &tasks[i];
    return NULL;
}

/* ---- the built-in code task (tasks.c gen_code) ---- */

#define BUILTIN_XS 7
static const int64_t builtin_xs[BUILTIN_XS] = {-3, -1, 0, 1, 2, 5, 10};

void vks_task_code_expr(const vks_task *t, char *buf, size_t cap) {
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < t->n_numbers && at < cap; i++) {
        int power = t->n_numbers - 1 - i;
        int w = snprintf(buf + at, cap - at, "%s%lld", i ? "+" : "", (long long)t->numbers[i]);
        for (int k = 0; k < power && w >= 0 && at + (size_t)w < cap; k++) w += snprintf(buf + at + w, cap - at - w, "*x");
        if (w < 0) break;
        at += (size_t)w;
    }
}

/* Its tests: f at BUILTIN_XS against the polynomial's values, as test_code naming the first wrong x. */
static void builtin_tests(const vks_task *t, vks_code_tests *ct, char *code, size_t cap) {
    size_t at = (size_t)snprintf(code, cap, "for x, want in (");
    for (int k = 0; k < BUILTIN_XS && at < cap; k++) {
        int64_t v = 0;
        for (int i = 0; i < t->n_numbers; i++) v = v * builtin_xs[k] + t->numbers[i]; /* Horner */
        at += (size_t)snprintf(code + at, cap - at, "(%lld, %lld), ", (long long)builtin_xs[k], (long long)v);
    }
    if (at < cap)
        snprintf(code + at, cap - at, "):\n    got = f(x)\n    assert got == want, f'f({x}) = {got!r}, expected {want}'\n");
    *ct = (vks_code_tests){.test_code = code, .time_limit_s = CODE_DEFAULT_TIME_S, .memory_mb = CODE_DEFAULT_MEMORY_MB};
}

/* ---- the program of a completion ---- */

/* Whether the line at text[i..] (to its end e) is a fence: ``` at its start after spaces. */
static bool is_fence(const char *text, size_t i, size_t e) {
    while (i < e && (text[i] == ' ' || text[i] == '\t')) i++;
    return e - i >= 3 && !memcmp(text + i, "```", 3);
}

bool vks_task_code_block(const char *text, size_t len, size_t *start, size_t *block_len) {
    bool found = false, open = false;
    size_t body = 0;
    for (size_t i = 0; text && i < len;) {
        size_t e = i;
        while (e < len && text[e] != '\n') e++;
        if (is_fence(text, i, e)) {
            if (!open) {
                open = true;
                body = e < len ? e + 1 : len;
            } else {
                open = false;
                found = true;
                *start = body;
                *block_len = i - body;
            }
        }
        i = e < len ? e + 1 : len;
    }
    return found;
}

/* ---- scoring ---- */

/* Lines with trailing spaces removed, blank lines at the end dropped, compared. */
static bool same_output(const char *got, size_t got_len, const char *want) {
    const char *a = got, *ae = got + got_len, *b = want, *be = want + strlen(want);
    for (;;) {
        const char *an = memchr(a, '\n', (size_t)(ae - a)), *bn = memchr(b, '\n', (size_t)(be - b));
        const char *al = an ? an : ae, *bl = bn ? bn : be;
        const char *ax = al, *bx = bl;
        while (ax > a && (ax[-1] == ' ' || ax[-1] == '\t' || ax[-1] == '\r')) ax--;
        while (bx > b && (bx[-1] == ' ' || bx[-1] == '\t' || bx[-1] == '\r')) bx--;
        if (ax - a != bx - b || memcmp(a, b, (size_t)(ax - a))) break;
        a = an ? an + 1 : ae;
        b = bn ? bn + 1 : be;
        if (a == ae && b == be) return true;
        if (a == ae || b == be) break;
    }
    /* what is left on either side must be blank */
    for (const char *p = a; p < ae; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') return false;
    for (const char *p = b; p < be; p++)
        if (*p != ' ' && *p != '\t' && *p != '\r' && *p != '\n') return false;
    return true;
}

/* The first line of s, escaped and cut to fit a reason. */
static void snippet(const char *s, size_t len, char *out, size_t cap) {
    while (len && (s[len - 1] == '\n' || s[len - 1] == '\r' || s[len - 1] == ' ' || s[len - 1] == '\t')) len--;
    size_t n = 0;
    while (n < len && s[n] != '\n' && n < 40) n++;
    char tmp[200];
    vks_escape(s, n, tmp, sizeof tmp);
    size_t k = strlen(tmp);
    if (n < len && k + 3 < sizeof tmp) memcpy(tmp + k, "...", 4);
    k = strlen(tmp) < cap ? strlen(tmp) : cap - 1;
    memcpy(out, tmp, k);
    out[k] = 0;
}

typedef struct {
    const vks_code_tests *ct; /* the task's tests (NULL: not a code task) */
    vks_code_tests own;       /* the built-in's, made from its numbers (ct points here) */
    char own_code[512];
    int first_job, n_jobs;    /* its jobs in the batch; n_jobs 0: no program */
    char *program;            /* the file run (code + test_code) */
} code_item;

static const char *const python_argv[] = {CODE_PYTHON, "-I", CODE_FILE, NULL};

static vks_sandbox_limits code_sandbox_limits(const vks_code_tests *ct) {
    /* the CPU time is the limit; the wall clock only catches a program that waits (sleeps, blocks), so it is
     * generous: a busy program on a loaded machine must meet its CPU limit first */
    return (vks_sandbox_limits){.cpu_s = ct->time_limit_s, .wall_s = 3 * ct->time_limit_s + 5,
                                .memory_bytes = (int64_t)ct->memory_mb << 20};
}

/* The reward and reason of one code completion from its jobs' results. */
static double judge(const vks_sandbox_result *res, const code_item *it, char *why, size_t cap) {
    const vks_code_tests *ct = it->ct;
    vks_sandbox_limits l = code_sandbox_limits(ct);
    int passed = 0, first_bad = -1;
    char bad[VKS_TASK_MAX_WHY] = "";
    for (int k = 0; k < it->n_jobs; k++) {
        const vks_sandbox_result *r = &res[it->first_job + k];
        bool ok = r->end == VKS_SANDBOX_EXITED && r->code == 0 &&
                  (ct->test_code || same_output(r->out ? r->out : "", r->out_len, ct->output[k]));
        if (ok) {
            passed++;
            continue;
        }
        if (first_bad >= 0) continue;
        first_bad = k;
        if (r->end == VKS_SANDBOX_EXITED && r->code == 0) {
            char want[120], got[120];
            snippet(ct->output[k], strlen(ct->output[k]), want, sizeof want);
            snippet(r->out ? r->out : "", r->out_len, got, sizeof got);
            snprintf(bad, sizeof bad, "expected '%.100s', got '%.100s'", want, got);
        } else {
            vks_sandbox_describe(r, &l, bad, sizeof bad);
        }
    }
    int n = it->n_jobs;
    if (first_bad < 0) snprintf(why, cap, n == 1 ? "passed" : "all %d cases passed", n);
    else if (ct->test_code) snprintf(why, cap, "test_code failed: %s", bad);
    else snprintf(why, cap, "%d of %d cases passed; case %d: %s", passed, n, first_bad + 1, bad);
    if (ct->fraction) return (double)passed / n;
    return passed == n ? 1.0 : 0.0;
}

/* The jobs of one code completion appended to jobs (n_jobs counts them). */
static int add_jobs(const char *text, size_t len, code_item *it, vks_sandbox_job *jobs, int *n_jobs) {
    size_t start, blen;
    it->first_job = *n_jobs;
    it->n_jobs = 0;
    if (!vks_task_code_block(text, len, &start, &blen)) return VKS_OK;
    const vks_code_tests *ct = it->ct;
    size_t tl = ct->test_code ? strlen(ct->test_code) : 0;
    it->program = malloc(blen + tl + 3);
    if (!it->program) return vks_set_error(VKS_ERR_NOMEM, "out of memory for a program");
    memcpy(it->program, text + start, blen);
    size_t plen = blen;
    if (ct->test_code) {
        memcpy(it->program + plen, "\n\n", 2);
        memcpy(it->program + plen + 2, ct->test_code, tl);
        plen += 2 + tl;
    }
    it->program[plen] = 0;
    int runs = ct->test_code ? 1 : ct->n_cases;
    for (int k = 0; k < runs; k++) {
        const char *in = ct->test_code ? NULL : ct->input[k];
        jobs[(*n_jobs)++] = (vks_sandbox_job){.argv = python_argv, .file_name = CODE_FILE, .file_data = it->program,
                                              .file_len = plen, .input = in, .input_len = in ? strlen(in) : 0};
    }
    it->n_jobs = runs;
    return VKS_OK;
}

/* Jobs with the same limits run in one vks_sandbox_run: the code tasks of a batch grouped by their limits. */
static bool same_limits(const vks_code_tests *a, const vks_code_tests *b) {
    return a->time_limit_s == b->time_limit_s && a->memory_mb == b->memory_mb;
}

static int run_code(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                    int parallel, double *rewards, char (*why)[VKS_TASK_MAX_WHY]) {
    code_item *items = calloc((size_t)n, sizeof *items);
    if (!items) return vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    int64_t total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (tasks[i]->verify != VKS_VERIFY_CODE) continue;
        if (tasks[i]->code) items[i].ct = tasks[i]->code;
        else builtin_tests(tasks[i], &items[i].own, items[i].own_code, sizeof items[i].own_code),
             items[i].ct = &items[i].own;
        total += items[i].ct->test_code ? 1 : items[i].ct->n_cases;
    }
    int rc = total > VKS_SANDBOX_MAX_JOBS ? vks_set_error(VKS_ERR_ARG, "tasks: more than %d test runs in one batch",
                                                          VKS_SANDBOX_MAX_JOBS) : VKS_OK;
    if (!rc && total && vks_sandbox_check()) rc = vks_error_prefix(VKS_ERR_IO, "code tasks");
    vks_sandbox_job *jobs = rc || !total ? NULL : calloc((size_t)total, sizeof *jobs);
    vks_sandbox_result *res = rc || !total ? NULL : calloc((size_t)total, sizeof *res);
    bool *done = rc || !total ? NULL : calloc((size_t)n, sizeof *done);
    if (!rc && total && (!jobs || !res || !done)) rc = vks_set_error(VKS_ERR_NOMEM, "tasks: out of memory");
    /* one vks_sandbox_run per distinct (time, memory) limits, in order of first appearance */
    for (int64_t g = 0; !rc && total && g < n; g++) {
        if (!items[g].ct || done[g]) continue;
        const vks_code_tests *cg = items[g].ct;
        int n_jobs = 0;
        for (int64_t i = g; !rc && i < n; i++)
            if (items[i].ct && !done[i] && same_limits(items[i].ct, cg))
                rc = add_jobs(texts[i], lens[i], &items[i], jobs, &n_jobs);
        vks_sandbox_limits l = code_sandbox_limits(cg);
        if (!rc && n_jobs) rc = vks_sandbox_run(jobs, n_jobs, &l, parallel, res);
        for (int64_t i = g; !rc && i < n; i++) {
            if (!items[i].ct || done[i] || !same_limits(items[i].ct, cg)) continue;
            char buf[VKS_TASK_MAX_WHY];
            if (items[i].n_jobs == 0) {
                rewards[i] = 0;
                snprintf(buf, sizeof buf, "no complete ``` code block");
            } else {
                rewards[i] = judge(res, &items[i], buf, sizeof buf);
            }
            if (why) snprintf(why[i], VKS_TASK_MAX_WHY, "%s", buf);
            done[i] = true;
        }
        if (!rc && n_jobs) vks_sandbox_results_free(res, n_jobs);
    }
    for (int64_t i = 0; i < n; i++) free(items[i].program);
    free(items), free(jobs), free(res), free(done);
    return rc;
}

int vks_task_score_many(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                        int parallel, double *rewards, char (*why)[VKS_TASK_MAX_WHY]) {
    return vks_task_score_many_into(tasks, texts, lens, n, parallel, rewards, why, NULL);
}

int vks_task_score_many_into(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                             int parallel, double *rewards, char (*why)[VKS_TASK_MAX_WHY], vks_task_metrics *sink) {
    if (n < 0 || (n && (!tasks || !texts || !lens || !rewards)))
        return vks_set_error(VKS_ERR_ARG, "tasks: score: NULL argument");
    for (int64_t i = 0; i < n; i++) {
        if (!tasks[i] || !texts[i]) return vks_set_error(VKS_ERR_ARG, "tasks: score: NULL task or text");
        if (tasks[i]->verify == VKS_VERIFY_CODE || tasks[i]->verify == VKS_VERIFY_PROGRAM) continue;
        if (tasks[i]->verify == VKS_VERIFY_ENVIRONMENT) { /* a completion is one turn of an episode of seed 0 */
            char reason[VKS_TASK_MAX_WHY];
            int rc = vks_env_replay(tasks[i], 0, &texts[i], &lens[i], 1, &rewards[i], reason, sizeof reason, NULL);
            if (rc) return rc;
            if (why) memcpy(why[i], reason, sizeof reason);
            continue;
        }
        rewards[i] = vks_task_score_why(tasks[i], texts[i], lens[i], why ? why[i] : NULL, VKS_TASK_MAX_WHY);
    }
    int rc = vks_task_score_programs(tasks, texts, lens, n, rewards, why, sink);
    return rc ? rc : run_code(tasks, texts, lens, n, parallel, rewards, why);
}
