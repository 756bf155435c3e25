/* chat.c: chat templates of the common families, written out in C (no Jinja
 * interpreter): a Jinja tokenizer.chat_template is recognized by its markers.
 *   chatml  <|im_start|>{role}\n{content}<|im_end|>\n      prompt: <|im_start|>assistant\n
 *   llama3  <|start_header_id|>{role}<|end_header_id|>\n\n{content, trimmed}<|eot_id|>
 *                                                         prompt: <|start_header_id|>assistant<|end_header_id|>\n\n
 *   llama2  [INST] {user, trimmed} [/INST] {assistant, trimmed} </s><s>[INST] ... [/INST]
 *           (a system message goes first into the first user turn as <<SYS>>\n{system}\n<</SYS>>\n\n)
 *   phi3    <|{role}|>\n{content}<|end|>\n                   prompt: <|assistant|>\n
 * The BOS token that the Jinja templates print first is left to the tokenizer. */
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

const char *vks_chat_template_family(const char *t) {
    if (!t) return NULL;
    static const char *names[] = {"chatml", "llama2", "llama3", "phi3"};
    for (int i = 0; i < 4; i++)
        if (!strcmp(t, names[i])) return names[i];
    if (strstr(t, "<|im_start|>")) return "chatml";
    if (strstr(t, "<|start_header_id|>")) return "llama3";
    if (strstr(t, "[INST]")) return "llama2";
    if (strstr(t, "<|assistant|>") && strstr(t, "<|end|>")) return "phi3";
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

int vks_chat_format(const char *tmpl, const vks_chat_message *msgs, int n, bool add_assistant_prompt, char **out) {
    if (!tmpl || !out || n < 0 || (!msgs && n > 0)) return vks_set_error(VKS_ERR_ARG, "vks_chat_format: bad argument");
    *out = NULL;
    const char *family = vks_chat_template_family(tmpl);
    if (!family)
        return vks_set_error(VKS_ERR_ARG, "chat: unsupported template (known: chatml, llama2, llama3, phi3): %.60s",
                             tmpl);
    for (int i = 0; i < n; i++) {
        if (!msgs[i].role || !msgs[i].content || !msgs[i].role[0])
            return vks_set_error(VKS_ERR_ARG, "chat: message %d has no role or content", i);
        for (const char *r = msgs[i].role; *r; r++)
            if (*r == '<' || *r == '>' || *r == '|' || is_space(*r))
                return vks_set_error(VKS_ERR_ARG, "chat: message %d has a bad role '%s'", i, msgs[i].role);
    }
    text_buf b = {0};
    puts_(&b, "");
    int rc = VKS_OK;
    if (!strcmp(family, "chatml")) format_chatml(&b, msgs, n, add_assistant_prompt);
    else if (!strcmp(family, "llama3")) format_llama3(&b, msgs, n, add_assistant_prompt);
    else if (!strcmp(family, "phi3")) format_phi3(&b, msgs, n, add_assistant_prompt);
    else rc = format_llama2(&b, msgs, n);
    if (rc == VKS_OK && b.failed) rc = vks_set_error(VKS_ERR_NOMEM, "chat: out of memory");
    if (rc != VKS_OK) {
        free(b.v);
        return rc;
    }
    *out = b.v;
    return VKS_OK;
}
