/* task_file.c: user tasks from JSONL (hostile input: bounded lines, fields and
 * counts; the first malformed line fails with "FILE: line N: ...") and the SFT
 * warm-up file of a built-in task (vks_tasks.h). */
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_philox.h"
#include "task_internal.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads one line (without LF, CR dropped) of at most max bytes into buf[max + 1].
 * A longer line is flagged at its byte max + 1 and the read stops there (the
 * rest is left unread: a line without end, /dev/zero, is not read forever).
 * False at EOF. */
bool vks_task_read_line(FILE *f, char *buf, size_t max, size_t *len, bool *too_long) {
    int ch;
    bool any = false;
    *len = 0;
    *too_long = false;
    while ((ch = getc(f)) != EOF) {
        any = true;
        if (ch == '\n') break;
        if (*len >= max) {
            *too_long = true;
            break;
        }
        buf[(*len)++] = (char)ch;
    }
    if (*len && buf[*len - 1] == '\r') (*len)--;
    buf[*len] = 0;
    return any;
}

bool vks_task_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t') return false;
    return true;
}

static const struct { const char *name; vks_verify_kind kind; } types[] = {
    {"exact", VKS_VERIFY_EXACT},   {"boxed", VKS_VERIFY_EXACT},       {"numeric", VKS_VERIFY_NUMERIC},
    {"list", VKS_VERIFY_LIST},     {"countdown", VKS_VERIFY_COUNTDOWN}, {"add", VKS_VERIFY_NUMERIC},
    {"mul", VKS_VERIFY_NUMERIC},   {"sort", VKS_VERIFY_LIST},         {"reverse", VKS_VERIFY_LIST},
    {"code", VKS_VERIFY_CODE},     {"program", VKS_VERIFY_PROGRAM},   {"environment", VKS_VERIFY_ENVIRONMENT},
    {"calc", VKS_VERIFY_ENVIRONMENT}, /* the built-in calculator environment: "answer" a number */
};

/* A string field (or, for "answer", an integer written out). */
static int string_field(json_t *root, const char *key, char *out, size_t cap, bool required) {
    json_t *v = json_object_get(root, key);
    if (!v) return required ? vks_set_error(VKS_ERR_FORMAT, "missing \"%s\"", key) : VKS_OK;
    if (json_is_integer(v) && !strcmp(key, "answer")) {
        snprintf(out, cap, "%lld", (long long)json_integer_value(v));
        return VKS_OK;
    }
    if (!json_is_string(v)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is not a string", key);
    size_t n = json_string_length(v);
    if (n + 1 > cap) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" is longer than %zu bytes", key, cap - 1);
    if (memchr(json_string_value(v), 0, n)) return vks_set_error(VKS_ERR_FORMAT, "\"%s\" holds a NUL byte", key);
    memcpy(out, json_string_value(v), n + 1);
    return VKS_OK;
}

static int countdown_fields(json_t *root, vks_task *t) {
    json_t *nums = json_object_get(root, "numbers"), *target = json_object_get(root, "target");
    if (!json_is_array(nums)) return vks_set_error(VKS_ERR_FORMAT, "countdown needs \"numbers\": [integers]");
    if (!json_is_integer(target)) return vks_set_error(VKS_ERR_FORMAT, "countdown needs \"target\": integer");
    size_t n = json_array_size(nums);
    if (n < 1 || n > VKS_TASK_MAX_NUMBERS)
        return vks_set_error(VKS_ERR_FORMAT, "\"numbers\" holds %zu entries, not 1 to %d", n, VKS_TASK_MAX_NUMBERS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_array_get(nums, i);
        if (!json_is_integer(x) || json_integer_value(x) < 1 || json_integer_value(x) > 1000000)
            return vks_set_error(VKS_ERR_FORMAT, "\"numbers\"[%zu] is not an integer from 1 to 1000000", i);
        t->numbers[i] = json_integer_value(x);
    }
    t->n_numbers = (int)n;
    t->target = json_integer_value(target);
    if (t->target < -1000000000LL || t->target > 1000000000LL)
        return vks_set_error(VKS_ERR_FORMAT, "\"target\" is outside +-1e9");
    return VKS_OK;
}

static int task_from_json(json_t *root, vks_task *t, const char *dir) {
    if (!json_is_object(root)) return vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
    char type[32];
    int rc = string_field(root, "task_type", type, sizeof type, true);
    if (rc) return rc;
    int k = -1;
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++)
        if (!strcmp(types[i].name, type)) k = i;
    if (k < 0) return vks_set_error(VKS_ERR_FORMAT, "unknown \"task_type\" '%s' (exact, numeric, list, boxed, countdown, code, program, environment, calc)", type);
    t->verify = types[k].kind;
    snprintf(t->kind, sizeof t->kind, "%s", type);
    if ((rc = string_field(root, "kind", t->kind, sizeof t->kind, false))) return rc;
    if (!t->kind[0]) return vks_set_error(VKS_ERR_FORMAT, "\"kind\" is empty");
    bool environment = t->verify == VKS_VERIFY_ENVIRONMENT && strcmp(type, "calc"); /* its reset gives the prompt */
    if ((rc = string_field(root, "prompt", t->prompt, VKS_TASK_MAX_PROMPT + 1, !environment))) return rc;
    if (t->verify == VKS_VERIFY_CODE) return vks_task_code_from_json(root, t);
    if (t->verify == VKS_VERIFY_PROGRAM || environment) { /* "answer" optional, passed on to the program as it is */
        if ((rc = string_field(root, "answer", t->answer, sizeof t->answer, false))) return rc;
        return vks_task_program_from_json(root, t, dir);
    }
    bool countdown = t->verify == VKS_VERIFY_COUNTDOWN;
    if ((rc = string_field(root, "answer", t->answer, sizeof t->answer, !countdown))) return rc;
    if (countdown) return countdown_fields(root, t);
    if (!t->answer[0]) return vks_set_error(VKS_ERR_FORMAT, "\"answer\" is empty");
    if (!vks_task_answer_matchable(t->verify == VKS_VERIFY_ENVIRONMENT ? VKS_VERIFY_NUMERIC : t->verify, t->answer))
        return vks_set_error(VKS_ERR_FORMAT, "\"answer\" '%s' is not %s, so no completion could match it", t->answer,
                             t->verify != VKS_VERIFY_LIST ? "a decimal number (like -12.5 or 1,000)"
                                                             : "a list of decimal numbers (like 1 2 3)");
    return VKS_OK;
}

static int append_task(vks_task **tasks, int64_t *n, int64_t *cap, const vks_task *t) {
    if (*n == *cap) {
        if (*n >= VKS_TASK_MAX_TASKS) return vks_set_error(VKS_ERR_FORMAT, "more than %d tasks", VKS_TASK_MAX_TASKS);
        int64_t c = *cap ? *cap * 2 : 64;
        vks_task *p = realloc(*tasks, sizeof *p * (size_t)c);
        if (!p) return vks_set_error(VKS_ERR_NOMEM, "out of memory for tasks");
        *tasks = p;
        *cap = c;
    }
    (*tasks)[(*n)++] = *t;
    return VKS_OK;
}

static int load_lines(FILE *f, const char *path, const char *dir, char *line, vks_task **tasks, int64_t *n) {
    int64_t cap = 0, line_no = 0;
    size_t len;
    bool too_long;
    vks_task *t = malloc(sizeof *t);
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    int rc = VKS_OK;
    while (rc == VKS_OK && vks_task_read_line(f, line, VKS_TASK_MAX_LINE, &len, &too_long)) {
        line_no++;
        const char *nul = memchr(line, 0, len);
        if (too_long) rc = vks_set_error(VKS_ERR_FORMAT, "longer than %d bytes", VKS_TASK_MAX_LINE);
        else if (nul) rc = vks_set_error(VKS_ERR_FORMAT, "a NUL byte at byte %zu", (size_t)(nul - line) + 1);
        else if (vks_task_blank(line, len)) continue;
        json_error_t err;
        json_t *root = rc ? NULL : json_loadb(line, len, JSON_REJECT_DUPLICATES, &err);
        if (!rc && !root) rc = vks_set_error(VKS_ERR_FORMAT, "bad JSON: %s (column %d)", err.text, err.column);
        memset(t, 0, sizeof *t);
        t->line = line_no;
        if (!rc) rc = task_from_json(root, t, dir);
        if (!rc) rc = append_task(tasks, n, &cap, t);
        if (rc) free(t->code), free(t->program), t->code = NULL, t->program = NULL; /* appended: the array's */
        json_decref(root);
        if (rc) rc = vks_error_prefix(rc, "%s: line %lld", path, (long long)line_no);
    }
    free(t);
    if (!rc && ferror(f)) rc = vks_set_error(VKS_ERR_IO, "%s: read failed: %s", path, strerror(errno));
    if (!rc && *n == 0) rc = vks_set_error(VKS_ERR_FORMAT, "%s: no tasks", path);
    return rc;
}

int vks_task_file_load(const char *path, vks_task **tasks, int64_t *n) {
    if (!path || !tasks || !n) return vks_set_error(VKS_ERR_ARG, "tasks: NULL argument");
    *tasks = NULL;
    *n = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    char *line = malloc(VKS_TASK_MAX_LINE + 1);
    /* the file's directory: a reward program's working directory */
    char *abs = realpath(path, NULL), *slash = abs ? strrchr(abs, '/') : NULL;
    if (slash) *(slash == abs ? slash + 1 : slash) = 0;
    int rc = line ? load_lines(f, path, abs ? abs : "/", line, tasks, n) : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    free(abs);
    free(line);
    fclose(f);
    if (rc) {
        vks_task_free(*tasks, *n);
        *tasks = NULL;
        *n = 0;
    }
    return rc;
}

/* ---- held-out split ---- */

#define SPLIT_KEY 0x5eedc0de5a11ull /* the split's Philox key: fixed, so it depends on the file only */

typedef struct {
    uint32_t hash;
    int64_t index;
} split_key;

static int by_hash(const void *a, const void *b) {
    const split_key *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return x->index < y->index ? -1 : x->index > y->index;
}

int vks_task_split(vks_task *tasks, int64_t *n, double fraction, vks_task **held, int64_t *n_held) {
    if (!tasks || !n || !held || !n_held || !(fraction > 0 && fraction < 1))
        return vks_set_error(VKS_ERR_ARG, "task split: the fraction must lie between 0 and 1");
    *held = NULL;
    *n_held = 0;
    if (*n < 2) return vks_set_error(VKS_ERR_ARG, "task split: %lld task(s): nothing to hold out", (long long)*n);
    int64_t k = (int64_t)(fraction * (double)*n + 0.5);
    if (k < 1) k = 1;
    if (k > *n - 1) k = *n - 1;
    split_key *keys = malloc(sizeof *keys * (size_t)*n);
    bool *out = calloc((size_t)*n, sizeof *out);
    vks_task *h = malloc(sizeof *h * (size_t)k);
    if (!keys || !out || !h) {
        free(keys), free(out), free(h);
        return vks_set_error(VKS_ERR_NOMEM, "task split: out of memory");
    }
    for (int64_t i = 0; i < *n; i++) {
        uint64_t line = (uint64_t)tasks[i].line;
        keys[i] = (split_key){vks_philox_u32(SPLIT_KEY, (uint32_t)line, (uint32_t)(line >> 32), 0), i};
    }
    qsort(keys, (size_t)*n, sizeof *keys, by_hash);
    for (int64_t i = 0; i < k; i++) out[keys[i].index] = true;
    int64_t kept = 0, taken = 0;
    for (int64_t i = 0; i < *n; i++) {
        if (out[i]) h[taken++] = tasks[i];
        else tasks[kept++] = tasks[i];
    }
    *n = kept;
    *held = h;
    *n_held = taken;
    free(keys);
    free(out);
    return VKS_OK;
}

int vks_task_file_copy(const char *in_path, const vks_task *tasks, int64_t n, const char *out_path) {
    if (!in_path || !out_path || (n && !tasks) || n < 0) return vks_set_error(VKS_ERR_ARG, "task copy: bad arguments");
    FILE *in = fopen(in_path, "rb");
    if (!in) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", in_path, strerror(errno));
    vks_outfile out;
    char *line = malloc(VKS_TASK_MAX_LINE + 1);
    int rc = line ? vks_outfile_open(&out, out_path, 0666) : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc) {
        free(line);
        fclose(in);
        return rc;
    }
    size_t len;
    bool too_long = false, ok = true;
    int64_t line_no = 0, t = 0;
    while (ok && !too_long && t < n && vks_task_read_line(in, line, VKS_TASK_MAX_LINE, &len, &too_long)) {
        line_no++;
        while (t < n && tasks[t].line < line_no) t++;
        if (!too_long && t < n && tasks[t].line == line_no)
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

/* One {"prompt","completion"} line. */
/* Writes o as one compact JSON line (o consumed; NULL: false). */
static bool put_json_line(FILE *f, json_t *o) {
    char *s = o ? json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII) : NULL;
    bool ok = s && fprintf(f, "%s\n", s) > 0;
    free(s);
    json_decref(o);
    return ok;
}

/* A task's worked completion as {"prompt", "completion"} (*o NULL when out of memory). */
static int sft_completion(const vks_task *t, json_t **o) {
    char completion[2 * VKS_TASK_MAX_ANSWER + 256];
    int rc = vks_task_worked_completion(t, completion, sizeof completion);
    *o = rc ? NULL : json_pack("{s:s, s:s}", "prompt", t->prompt, "completion", completion);
    return rc;
}

/* An environment task's worked episode as {"prompt", "turns": [...]} (vks_sft_data.h's multi-turn form). */
static int sft_episode(const vks_task *t, json_t **o) {
    vks_env_episode ep;
    int rc = vks_env_worked_episode(t, &ep);
    json_t *turns = rc ? NULL : json_array();
    int from = 0;
    while (!rc && from < ep.n && strcmp(ep.m[from].role, "assistant")) from++;
    for (int i = from; turns && i < ep.n; i++)
        json_array_append_new(turns, json_pack("{s:s, s:s%}", "role", ep.m[i].role, "content", ep.m[i].content,
                                               ep.m[i].len));
    *o = turns ? json_pack("{s:s, s:o}", "prompt", t->prompt, "turns", turns) : NULL;
    vks_env_episode_free(&ep);
    return rc;
}

int vks_task_write_sft(const vks_task_spec *s, uint64_t seed, int64_t n, const char *path) {
    if (!s || !path || n < 1 || n > UINT32_MAX) return vks_set_error(VKS_ERR_ARG, "tasks sft: bad arguments");
    vks_outfile out;
    int rc = vks_outfile_open(&out, path, 0666);
    if (rc) return rc;
    vks_task *t = malloc(sizeof *t);
    bool ok = t != NULL;
    for (int64_t i = 0; ok && i < n; i++) {
        json_t *o = NULL;
        rc = vks_task_generate(s, seed, (uint32_t)i, t);
        if (!rc) rc = t->verify == VKS_VERIFY_ENVIRONMENT ? sft_episode(t, &o) : sft_completion(t, &o);
        ok = !rc && put_json_line(out.f, o); /* on an error o is NULL */
    }
    free(t);
    if (rc) {
        vks_outfile_abort(&out);
        return rc;
    }
    return vks_outfile_finish(&out, ok);
}
