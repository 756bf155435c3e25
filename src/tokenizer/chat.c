/* chat.c: chat templates of the common families, written out in C (no Jinja
 * interpreter): a Jinja tokenizer.chat_template is recognized by its markers.
 *   chatml  <|im_start|>{role}\n{content}<|im_end|>\n      prompt: <|im_start|>assistant\n
 *   qwen3   chatml with reasoning (Qwen3's template, no tools): an assistant turn's
 *           "<think>R</think>C" keeps R only after the last user query, as
 *           "<think>\nR\n</think>\n\nC" (the last turn always, R may be empty); earlier
 *           turns keep C only; tool results go into user turns as <tool_response>;
 *           prompt: <|im_start|>assistant\n, with disable_thinking (enable_thinking=false)
 *           followed by an empty "<think>\n\n</think>\n\n"
 *   llama3  <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
 *                                                         prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
 *   llama3.1  llama3 after a system turn that always comes first: "Cutting Knowledge
 *           Date: December 2023\nToday Date: 26 Jul 2024\n\n" then the system message
 *           (trimmed) if the conversation starts with one (Llama 3.1-3.3's template
 *           without tools; tool and ipython turns are refused; its default date:
 *           Llama 3.2's template would print today's date, which no rollout should
 *           depend on)
 *   llama2  [INST] {user, trimmed} [/INST] {assistant, trimmed} </s><s>[INST] ... [/INST]
 *           (a system message goes first into the first user turn as <<SYS>>\n{system}\n<</SYS>>\n\n)
 *   phi3    <|{role}|>\n{content}<|end|>\n                   prompt: <|assistant|>\n
 * A Jinja template's default system message (chatml and qwen3 families: Qwen2.5's
 * "You are Qwen, ...") goes first when the conversation has no system message.
 * The BOS token that the Jinja templates print first is left to the tokenizer.
 * "trimmed" strips ASCII whitespace (Jinja's trim strips Unicode spaces too). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_tokenizer.h"

typedef struct {
    char *v;
    size_t n, cap;
    bool failed;
} text_buf;

static void put(text_buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->cap - b->n <= n) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n <= n) {
            if (cap > SIZE_MAX / 2) {
                b->failed = true;
                return;
            }
            cap *= 2;
        }
        char *v = realloc(b->v, cap);
        if (!v) {
            b->failed = true;
            return;
        }
        b->v = v;
        b->cap = cap;
    }
    memcpy(b->v + b->n, s, n);
    b->n += n;
    b->v[b->n] = '\0';
}

static void puts_(text_buf *b, const char *s) { put(b, s, strlen(s)); }

static bool is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }

static void put_trimmed(text_buf *b, const char *s) {
    size_t n = strlen(s);
    while (n > 0 && is_space(*s)) s++, n--;
    while (n > 0 && is_space(s[n - 1])) n--;
    put(b, s, n);
}

static bool has(const char *t, const char *marker) { return strstr(t, marker) != NULL; }

static const char *const family_names[] = {"chatml", "qwen3", "llama2", "llama3", "llama3.1", "phi3"};
#define N_FAMILIES (sizeof family_names / sizeof family_names[0])

const char *vks_chat_template_names(void) { return "chatml, qwen3, llama2, llama3, llama3.1, phi3"; /* family_names */ }

static bool is_name(const char *t) {
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(t, family_names[i])) return true;
    return false;
}

const char *vks_chat_template_family(const char *t) {
    if (!t) return NULL;
    for (size_t i = 0; i < N_FAMILIES; i++)
        if (!strcmp(t, family_names[i])) return family_names[i];
    if (has(t, "<|im_start|>")) return has(t, "enable_thinking") ? "qwen3" : "chatml";
    if (has(t, "<|start_header_id|>")) return has(t, "Cutting Knowledge Date") ? "llama3.1" : "llama3";
    if (has(t, "[INST]")) return "llama2";
    if (has(t, "<|assistant|>") && has(t, "<|end|>")) return "phi3";
    return NULL;
}

static void format_chatml(text_buf *b, const vks_chat_message *m, int n, bool prompt) {
    for (int i = 0; i < n; i++) {
        puts_(b, "<|im_start|>");
        puts_(b, m[i].role);
        puts_(b, "\n");
        puts_(b, m[i].content);
        puts_(b, "<|im_end|>\n");
    }
    if (prompt) puts_(b, "<|im_start|>assistant\n");
}

static void format_llama3(text_buf *b, const vks_chat_message *m, int n, bool prompt) {
    for (int i = 0; i < n; i++) {
        puts_(b, "<|start_header_id|>");
        puts_(b, m[i].role);
        puts_(b, "<|end_header_id|>\n\n");
        put_trimmed(b, m[i].content);
        puts_(b, "<|eot_id|>");
    }
    if (prompt) puts_(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

static void format_phi3(text_buf *b, const vks_chat_message *m, int n, bool prompt) {
    for (int i = 0; i < n; i++) {
        puts_(b, "<|");
        puts_(b, m[i].role);
        puts_(b, "|>\n");
        puts_(b, m[i].content);
        puts_(b, "<|end|>\n");
    }
    if (prompt) puts_(b, "<|assistant|>\n");
}

/* The n bytes at s without the given leading and trailing bytes (Python's
 * lstrip/rstrip of '\n'). */
static void strip_newlines(const char **s, size_t *n, bool left, bool right) {
    while (left && *n > 0 && **s == '\n') (*s)++, (*n)--;
    while (right && *n > 0 && (*s)[*n - 1] == '\n') (*n)--;
}

/* The last occurrence of needle in s[0..n), or NULL. */
static const char *last_of(const char *s, size_t n, const char *needle) {
    size_t k = strlen(needle);
    const char *hit = NULL;
    for (size_t i = 0; i + k <= n; i++)
        if (!memcmp(s + i, needle, k)) hit = s + i;
    return hit;
}

static bool is_tool_response(const char *c) {
    size_t n = strlen(c), a = strlen("<tool_response>"), b = strlen("</tool_response>");
    return n >= a && n >= b && !strncmp(c, "<tool_response>", a) && !strcmp(c + n - b, "</tool_response>");
}

/* An assistant turn of Qwen3's template: content "...<think>R</think>C" is
 * split into reasoning R and answer C (the first </think> ends R, the last
 * starts C, the last <think> before it starts R). */
static void qwen3_assistant(text_buf *b, const char *content, bool after_last_query, bool last) {
    const char *c = content, *r = "";
    size_t cn = strlen(content), rn = 0;
    const char *end = strstr(content, "</think>");
    if (end) {
        r = content;
        rn = (size_t)(end - content);
        strip_newlines(&r, &rn, false, true);
        const char *open = last_of(r, rn, "<think>");
        if (open) {
            rn -= (size_t)(open + 7 - r);
            r = open + 7;
        }
        strip_newlines(&r, &rn, true, false);
        const char *tail = last_of(content, cn, "</think>") + 8;
        c = tail;
        cn = strlen(tail);
        strip_newlines(&c, &cn, true, false);
    }
    puts_(b, "<|im_start|>assistant\n");
    if (after_last_query && (last || rn > 0)) {
        strip_newlines(&r, &rn, true, true);
        puts_(b, "<think>\n");
        put(b, r, rn);
        puts_(b, "\n</think>\n\n");
        strip_newlines(&c, &cn, true, false);
    }
    put(b, c, cn);
    puts_(b, "<|im_end|>\n");
}

/* Qwen3's template without tools (its hybrid-thinking form: enable_thinking). */
static int format_qwen3(text_buf *b, const vks_chat_message *m, int n, const vks_chat_options *o) {
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--)
        if (!strcmp(m[i].role, "user") && !is_tool_response(m[i].content)) {
            last_query = i;
            break;
        }
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        bool user_like = !strcmp(role, "user") || !strcmp(role, "system");
        if (user_like) {
            puts_(b, "<|im_start|>");
            puts_(b, role);
            puts_(b, "\n");
            puts_(b, m[i].content);
            puts_(b, "<|im_end|>\n");
        } else if (!strcmp(role, "assistant")) {
            qwen3_assistant(b, m[i].content, i > last_query, i == n - 1);
        } else if (!strcmp(role, "tool")) {
            if (i == 0 || strcmp(m[i - 1].role, "tool")) puts_(b, "<|im_start|>user");
            puts_(b, "\n<tool_response>\n");
            puts_(b, m[i].content);
            puts_(b, "\n</tool_response>");
            if (i == n - 1 || strcmp(m[i + 1].role, "tool")) puts_(b, "<|im_end|>\n");
        } else {
            return vks_set_error(VKS_ERR_ARG, "chat: qwen3 has no role '%s'", role);
        }
    }
    if (o->add_assistant_prompt) puts_(b, "<|im_start|>assistant\n");
    if (o->add_assistant_prompt && o->disable_thinking) puts_(b, "<think>\n\n</think>\n\n");
    return VKS_OK;
}

/* Llama 3.1-3.3's template without tools (its tool turns print their content
 * through tojson, which is not written here: refused). */
static int format_llama31(text_buf *b, const vks_chat_message *m, int n, bool prompt) {
    for (int i = 0; i < n; i++)
        if (!strcmp(m[i].role, "tool") || !strcmp(m[i].role, "ipython"))
            return vks_set_error(VKS_ERR_ARG, "chat: llama3.1's '%s' turns are not supported", m[i].role);
    puts_(b, "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
             "Today Date: 26 Jul 2024\n\n");
    int first = 0;
    if (n > 0 && !strcmp(m[0].role, "system")) {
        put_trimmed(b, m[0].content);
        first = 1;
    }
    puts_(b, "<|eot_id|>");
    format_llama3(b, m + first, n - first, prompt);
    return VKS_OK;
}

/* Meta's Llama 2 chat format (as its Hugging Face template writes it). */
static int format_llama2(text_buf *b, const vks_chat_message *m, int n) {
    const char *system = NULL;
    bool first_turn = true;
    for (int i = 0; i < n; i++) {
        const char *role = m[i].role;
        if (!strcmp(role, "system")) {
            if (i != 0) return vks_set_error(VKS_ERR_ARG, "chat: llama2 takes a system message only first");
            system = m[i].content;
        } else if (!strcmp(role, "user")) {
            puts_(b, first_turn ? "[INST] " : "<s>[INST] ");
            if (system) {
                text_buf joined = {0};
                puts_(&joined, "<<SYS>>\n");
                puts_(&joined, system);
                puts_(&joined, "\n<</SYS>>\n\n");
                puts_(&joined, m[i].content);
                if (joined.failed) b->failed = true;
                else put_trimmed(b, joined.v);
                free(joined.v);
                system = NULL;
            } else {
                put_trimmed(b, m[i].content);
            }
            puts_(b, " [/INST]");
            first_turn = false;
        } else if (!strcmp(role, "assistant")) {
            puts_(b, " ");
            put_trimmed(b, m[i].content);
            puts_(b, " </s>");
        } else {
            return vks_set_error(VKS_ERR_ARG, "chat: llama2 has no role '%s'", role);
        }
    }
    return VKS_OK;
}

/* The system turn's opening inside a Jinja string literal: the marker, then a
 * newline written as the escape \n or as itself; the text after it. */
static const char *after_system_opener(const char *at) {
    at += strlen("<|im_start|>system");
    if (at[0] == '\\' && at[1] == 'n') return at + 2;
    return *at == '\n' ? at + 1 : NULL;
}

/* Jinja's string escapes of s[0..n) decoded into b (\n, \t, \r, \\, \', \"). */
static void put_unescaped(text_buf *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c == '\\' && i + 1 < n) {
            char e = s[++i];
            c = e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        }
        put(b, &c, 1);
    }
}

/* Whether s[0..n) stays inside one string literal: no unescaped quote (the
 * literal would end) and no Jinja tag (text outside a literal). */
static bool one_literal(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '\\') i++;
        else if (s[i] == '\'' || s[i] == '"' || (s[i] == '{' && i + 1 < n && strchr("{%#", s[i + 1]))) return false;
    }
    return true;
}

int vks_chat_default_system(const char *t, char **out) {
    if (!t || !out) return vks_set_error(VKS_ERR_ARG, "vks_chat_default_system: NULL argument");
    *out = NULL;
    const char *family = vks_chat_template_family(t);
    if (!family || is_name(t) || (strcmp(family, "chatml") && strcmp(family, "qwen3"))) return VKS_OK;
    for (const char *at = t; (at = strstr(at, "<|im_start|>system")); at++) {
        const char *text = after_system_opener(at), *end = text ? strstr(text, "<|im_end|>") : NULL;
        if (!end || end == text || !one_literal(text, (size_t)(end - text))) continue;
        text_buf b = {0};
        put_unescaped(&b, text, (size_t)(end - text));
        if (b.failed) {
            free(b.v);
            return vks_set_error(VKS_ERR_NOMEM, "chat: out of memory");
        }
        *out = b.v;
        return VKS_OK;
    }
    return VKS_OK;
}

int vks_chat_format_opts(const char *tmpl, const vks_chat_message *msgs, int n, const vks_chat_options *o,
                         char **out) {
    if (!tmpl || !out || !o || n < 0 || (!msgs && n > 0))
        return vks_set_error(VKS_ERR_ARG, "vks_chat_format: bad argument");
    *out = NULL;
    const char *family = vks_chat_template_family(tmpl);
    if (!family)
        return vks_set_error(VKS_ERR_ARG, "chat: the template is not recognised (known families: %s)",
                             vks_chat_template_names());
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0])
            return vks_set_error(VKS_ERR_ARG, "chat: message %d has no role or content", i);
        for (const char *r = msgs[i].role; *r; r++)
            if (*r == '<' || *r == '>' || *r == '|' || is_space(*r))
                return vks_set_error(VKS_ERR_ARG, "chat: message %d has a bad role '%s'", i, msgs[i].role);
    }
    char *system = NULL; /* the template's own system message, when the conversation brings none */
    int rc = n > 0 && !strcmp(msgs[0].role, "system") ? VKS_OK : vks_chat_default_system(tmpl, &system);
    vks_chat_message *with_system = NULL;
    if (rc == VKS_OK && system) {
        with_system = malloc(sizeof *with_system * (size_t)(n + 1));
        if (!with_system) rc = vks_set_error(VKS_ERR_NOMEM, "chat: out of memory");
        else {
            with_system[0] = (vks_chat_message){"system", system};
            if (n > 0) memcpy(with_system + 1, msgs, sizeof *msgs * (size_t)n);
            msgs = with_system, n++;
        }
    }
    if (rc != VKS_OK) return free(system), rc;
    text_buf b = {0};
    puts_(&b, "");
    bool prompt = o->add_assistant_prompt;
    if (!strcmp(family, "chatml")) format_chatml(&b, msgs, n, prompt);
    else if (!strcmp(family, "qwen3")) rc = format_qwen3(&b, msgs, n, o);
    else if (!strcmp(family, "llama3")) format_llama3(&b, msgs, n, prompt);
    else if (!strcmp(family, "llama3.1")) rc = format_llama31(&b, msgs, n, prompt);
    else if (!strcmp(family, "phi3")) format_phi3(&b, msgs, n, prompt);
    else rc = format_llama2(&b, msgs, n);
    if (rc == VKS_OK && b.failed) rc = vks_set_error(VKS_ERR_NOMEM, "chat: out of memory");
    free(with_system);
    free(system);
    if (rc != VKS_OK) {
        free(b.v);
        return rc;
    }
    *out = b.v;
    return VKS_OK;
}

int vks_chat_format(const char *tmpl, const vks_chat_message *msgs, int n, bool add_assistant_prompt, char **out) {
    vks_chat_options o = {.add_assistant_prompt = add_assistant_prompt};
    return vks_chat_format_opts(tmpl, msgs, n, &o, out);
}
