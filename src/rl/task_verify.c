/* task_verify.c: the task verifiers (vks_tasks.h): the final answer of a
 * completion (last "answer:" line or last \boxed{}), exact, numeric and list
 * matches, and the countdown expression check (a bounded recursive-descent
 * parser over exact rationals). Every input is treated as hostile. */
#include "vkswarm/vks_tasks.h"
#include "task_internal.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

/* ---- extracting the answer ---- */

static bool copy_trimmed(const char *s, size_t n, char *out, size_t cap) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    if (n == 0 || n + 1 > cap || n >= VKS_TASK_MAX_ANSWER || memchr(s, 0, n)) return false;
    memcpy(out, s, n);
    out[n] = 0;
    return true;
}

long vks_task_last_line(const char *c, size_t len, const char *prefix, size_t *end) {
    long found = -1;
    size_t k = strlen(prefix);
    for (size_t i = 0; i < len;) {
        size_t eol = i;
        while (eol < len && c[eol] != '\n') eol++;
        size_t j = i;
        while (j < eol && (c[j] == ' ' || c[j] == '\t')) j++;
        if (eol - j >= k && !strncasecmp(c + j, prefix, k)) found = (long)(j + k), *end = eol;
        i = eol + 1;
    }
    return found;
}

/* The last \boxed{...} with balanced braces: offset of its text, or -1. */
static long last_boxed(const char *c, size_t len, size_t *end) {
    static const char key[] = "\\boxed{";
    const size_t kn = sizeof key - 1;
    for (size_t i = len >= kn ? len - kn + 1 : 0; i-- > 0;) {
        if (memcmp(c + i, key, kn)) continue;
        int depth = 1;
        for (size_t j = i + kn; j < len; j++) {
            depth += c[j] == '{' ? 1 : c[j] == '}' ? -1 : 0;
            if (depth == 0) { *end = j; return (long)(i + kn); }
        }
        return -1; /* the last one is unclosed: no boxed answer */
    }
    return -1;
}

bool vks_task_extract_answer(const char *completion, size_t len, char *answer, size_t cap) {
    if (!completion || !answer || !cap) return false;
    size_t line_end = 0, box_end = 0;
    long line = vks_task_last_line(completion, len, "answer:", &line_end), box = last_boxed(completion, len, &box_end);
    if (line < 0 && box < 0) return false;
    if (box > line) return copy_trimmed(completion + box, box_end - (size_t)box, answer, cap);
    return copy_trimmed(completion + line, line_end - (size_t)line, answer, cap);
}

/* ---- exact, numeric, list ---- */

/* Collapses runs of spaces; both strings are already trimmed. */
static bool same_text(const char *a, const char *b) {
    while (*a && *b) {
        if (isspace((unsigned char)*a) && isspace((unsigned char)*b)) {
            while (isspace((unsigned char)*a)) a++;
            while (isspace((unsigned char)*b)) b++;
            continue;
        }
        if (*a++ != *b++) return false;
    }
    return !*a && !*b;
}

/* A decimal number in canonical form: sign, digits without leading zeros, and
 * a fraction without trailing zeros ("-0012.50" -> "-12.5", "-0" -> "0").
 * Commas between digit groups are dropped. False unless the whole of s (n bytes) is a number. */
static bool canonical_number(const char *s, size_t n, char *out, size_t cap) {
    size_t i = 0, o = 0;
    bool neg = false;
    if (i < n && (s[i] == '-' || s[i] == '+')) neg = s[i++] == '-';
    char digits[VKS_TASK_MAX_ANSWER];
    size_t nd = 0, point = (size_t)-1;
    for (; i < n; i++) {
        char ch = s[i];
        if (isdigit((unsigned char)ch)) {
            if (nd + 1 >= sizeof digits) return false;
            digits[nd++] = ch;
        } else if (ch == '.' && point == (size_t)-1 && nd > 0) {
            point = nd;
        } else if (ch == ',' && nd > 0 && point == (size_t)-1 && i + 1 < n && isdigit((unsigned char)s[i + 1])) {
            continue;
        } else {
            return false;
        }
    }
    if (nd == 0 || point == nd) return false; /* "12." is not a number here */
    size_t int_end = point == (size_t)-1 ? nd : point, first = 0, last = nd;
    while (first + 1 < int_end && digits[first] == '0') first++;
    if (point != (size_t)-1)
        while (last > point && digits[last - 1] == '0') last--;
    bool zero = true;
    for (size_t k = first; k < last; k++) zero &= digits[k] == '0';
    if (cap < last - first + 3) return false;
    if (neg && !zero) out[o++] = '-';
    for (size_t k = first; k < last; k++) {
        if (k == int_end) out[o++] = '.';
        out[o++] = digits[k];
    }
    out[o] = 0;
    return true;
}

static bool same_number(const char *a, const char *b) {
    char ca[VKS_TASK_MAX_ANSWER + 2], cb[VKS_TASK_MAX_ANSWER + 2];
    return canonical_number(a, strlen(a), ca, sizeof ca) && canonical_number(b, strlen(b), cb, sizeof cb) &&
           !strcmp(ca, cb);
}

/* Next item of a list "[1, 2, 3]" / "1 2 3": the canonical number, or false at the end or on junk. */
static bool next_item(const char **p, char *out, size_t cap, bool *bad) {
    const char *s = *p;
    while (*s == ' ' || *s == '\t' || *s == ',' || *s == '[' || *s == ']') s++;
    if (!*s) { *p = s; return false; }
    const char *e = s;
    while (*e && *e != ' ' && *e != '\t' && *e != ',' && *e != '[' && *e != ']') e++;
    *bad = !canonical_number(s, (size_t)(e - s), out, cap);
    *p = e;
    return !*bad;
}

static bool same_list(const char *a, const char *b) {
    char ia[VKS_TASK_MAX_ANSWER + 2], ib[VKS_TASK_MAX_ANSWER + 2];
    bool bad_a = false, bad_b = false;
    for (;;) {
        bool more_a = next_item(&a, ia, sizeof ia, &bad_a), more_b = next_item(&b, ib, sizeof ib, &bad_b);
        if (bad_a || bad_b || more_a != more_b) return false;
        if (!more_a) return true;
        if (strcmp(ia, ib)) return false;
    }
}

/* ---- countdown ---- */

#define CD_MAX_TOKENS 64
#define CD_MAX_DEPTH 32
#define CD_MAX_OPERAND 2147483647LL

typedef struct { int64_t num, den; } rational; /* den > 0, reduced */

typedef struct {
    const char *s;
    int tokens, depth;
    bool failed;
    int64_t numbers[VKS_TASK_MAX_NUMBERS];
    bool used[VKS_TASK_MAX_NUMBERS];
    int n_numbers;
    bool any_literal; /* vks_task_eval_expr: every literal allowed */
} cd_parser;

static int64_t gcd64(int64_t a, int64_t b) {
    if (a < 0) a = -a;
    while (b) { int64_t t = a % b; a = b; b = t; }
    return a ? a : 1;
}

/* a op b exactly; fails on division by zero or 64-bit overflow. */
static bool rat_apply(rational a, char op, rational b, rational *r) {
    int64_t n, d, x, y;
    switch (op) {
    case '+':
    case '-':
        if (__builtin_mul_overflow(a.num, b.den, &x) || __builtin_mul_overflow(b.num, a.den, &y) ||
            __builtin_mul_overflow(a.den, b.den, &d))
            return false;
        if (op == '+' ? __builtin_add_overflow(x, y, &n) : __builtin_sub_overflow(x, y, &n)) return false;
        break;
    case '*':
        if (__builtin_mul_overflow(a.num, b.num, &n) || __builtin_mul_overflow(a.den, b.den, &d)) return false;
        break;
    default: /* '/' */
        if (b.num == 0) return false;
        if (__builtin_mul_overflow(a.num, b.den, &n) || __builtin_mul_overflow(a.den, b.num, &d)) return false;
        if (d < 0) {
            if (n == INT64_MIN || d == INT64_MIN) return false;
            n = -n, d = -d;
        }
    }
    int64_t g = gcd64(n, d);
    *r = (rational){n / g, d / g};
    return true;
}

static void skip_spaces(cd_parser *p) {
    while (*p->s == ' ' || *p->s == '\t') p->s++;
}

static bool fail(cd_parser *p) {
    p->failed = true;
    return false;
}

/* A literal: must be one of the unused given numbers. */
static bool parse_literal(cd_parser *p, rational *out) {
    int64_t v = 0;
    while (isdigit((unsigned char)*p->s)) {
        v = v * 10 + (*p->s++ - '0');
        if (v > CD_MAX_OPERAND) return fail(p);
    }
    if (p->any_literal) {
        *out = (rational){v, 1};
        return true;
    }
    for (int i = 0; i < p->n_numbers; i++)
        if (!p->used[i] && p->numbers[i] == v) {
            p->used[i] = true;
            *out = (rational){v, 1};
            return true;
        }
    return fail(p); /* not given, or already used */
}

static bool parse_sum(cd_parser *p, rational *out);

static bool parse_atom(cd_parser *p, rational *out) {
    skip_spaces(p);
    if (++p->tokens > CD_MAX_TOKENS) return fail(p);
    if (isdigit((unsigned char)*p->s)) return parse_literal(p, out);
    if (*p->s != '(' || ++p->depth > CD_MAX_DEPTH) return fail(p);
    p->s++;
    if (!parse_sum(p, out)) return false;
    skip_spaces(p);
    if (*p->s != ')') return fail(p);
    p->s++;
    p->tokens++;
    p->depth--;
    return true;
}

/* One precedence level: operands of `next` joined by ops (left to right). */
static bool parse_level(cd_parser *p, rational *out, const char *ops, bool (*next)(cd_parser *, rational *)) {
    if (!next(p, out)) return false;
    for (;;) {
        skip_spaces(p);
        char op = *p->s;
        if (!op || !strchr(ops, op)) return true;
        p->s++;
        if (++p->tokens > CD_MAX_TOKENS) return fail(p);
        rational rhs;
        if (!next(p, &rhs)) return false;
        if (!rat_apply(*out, op, rhs, out)) return fail(p);
    }
}

static bool parse_product(cd_parser *p, rational *out) { return parse_level(p, out, "*/", parse_atom); }
static bool parse_sum(cd_parser *p, rational *out) { return parse_level(p, out, "+-", parse_product); }

/* "EXPR" or "EXPR = TARGET": the part to parse, and false when a stated result is not the target. */
static bool split_result(const char *expr, int64_t target, size_t *n) {
    const char *eq = strchr(expr, '=');
    *n = eq ? (size_t)(eq - expr) : strlen(expr);
    if (!eq) return true;
    char want[32], got[VKS_TASK_MAX_ANSWER + 2];
    snprintf(want, sizeof want, "%lld", (long long)target);
    const char *r = eq + 1;
    return canonical_number(r + strspn(r, " \t"), strlen(r) - strspn(r, " \t"), got, sizeof got) && !strcmp(got, want);
}

bool vks_task_countdown_ok(const char *expr, const int64_t *numbers, int n_numbers, int64_t target) {
    if (!expr || !numbers || n_numbers < 0 || n_numbers > VKS_TASK_MAX_NUMBERS || strlen(expr) >= VKS_TASK_MAX_ANSWER)
        return false;
    size_t n;
    if (!split_result(expr, target, &n)) return false;
    char buf[VKS_TASK_MAX_ANSWER];
    memcpy(buf, expr, n);
    buf[n] = 0;
    while (n && isspace((unsigned char)buf[n - 1])) buf[--n] = 0;
    cd_parser p = {.s = buf, .n_numbers = n_numbers};
    memcpy(p.numbers, numbers, sizeof(int64_t) * (size_t)n_numbers);
    rational r;
    if (!parse_sum(&p, &r) || p.failed) return false;
    skip_spaces(&p);
    return !*p.s && r.den == 1 && r.num == target;
}

bool vks_task_eval_expr(const char *expr, int64_t *num, int64_t *den) {
    cd_parser p = {.s = expr, .any_literal = true};
    rational r;
    if (!expr || !parse_sum(&p, &r) || p.failed) return false;
    skip_spaces(&p);
    if (*p.s) return false;
    *num = r.num, *den = r.den;
    return true;
}

bool vks_task_answer_matchable(int verify, const char *answer) {
    switch (verify) {
    case VKS_VERIFY_NUMERIC: return same_number(answer, answer);
    case VKS_VERIFY_LIST: return same_list(answer, answer);
    default: return true;
    }
}

double vks_task_score_why(const vks_task *t, const char *completion, size_t len, char *why, size_t cap) {
    char got[VKS_TASK_MAX_ANSWER], shown[4 * VKS_TASK_MAX_ANSWER], want[4 * VKS_TASK_MAX_ANSWER];
    if (!t || !completion || !vks_task_extract_answer(completion, len, got, sizeof got)) {
        if (why) snprintf(why, cap, "no answer (an 'answer:' line or \\boxed{...})");
        return 0;
    }
    bool ok = false;
    switch (t->verify) {
    case VKS_VERIFY_EXACT: ok = same_text(got, t->answer); break;
    case VKS_VERIFY_NUMERIC: ok = same_number(got, t->answer); break;
    case VKS_VERIFY_LIST: ok = same_list(got, t->answer); break;
    case VKS_VERIFY_COUNTDOWN: ok = vks_task_countdown_ok(got, t->numbers, t->n_numbers, t->target); break;
    case VKS_VERIFY_CODE:
    case VKS_VERIFY_PROGRAM:
    case VKS_VERIFY_ENVIRONMENT: ok = false; break; /* scored by vks_task_score_many, vks_env_replay */
    }
    if (why) {
        vks_escape(got, strlen(got), shown, sizeof shown);
        vks_escape(t->answer, strlen(t->answer), want, sizeof want);
        if (t->verify == VKS_VERIFY_COUNTDOWN)
            snprintf(why, cap, "answer '%.100s' %s %lld", shown, ok ? "makes" : "does not make", (long long)t->target);
        else snprintf(why, cap, "answer '%.100s'%s, expected '%.100s'", shown, ok ? " matches" : "", want);
    }
    return ok ? 1 : 0;
}

double vks_task_score(const vks_task *t, const char *completion, size_t len) {
    if (t && completion && (t->verify == VKS_VERIFY_CODE || t->verify == VKS_VERIFY_PROGRAM ||
                              t->verify == VKS_VERIFY_ENVIRONMENT)) {
        double r = 0;
        const vks_task *tp = t;
        const char *text = completion;
        return vks_task_score_many(&tp, &text, &len, 1, 0, &r, NULL) ? 0 : r;
    }
    return vks_task_score_why(t, completion, len, NULL, 0);
}
