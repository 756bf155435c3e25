/* prompt.c: a task's prompt as the model sees it (vks_prompt.h): the think
 * sentence, the user template, the chat template, BOS and special tokens. */
#include "vkswarm/vks_prompt.h"
#include "vkswarm/vks_tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void vks_prompt_format_default(vks_prompt_format *f) {
    memset(f, 0, sizeof *f);
    snprintf(f->chat_template, sizeof f->chat_template, "none");
    snprintf(f->user_template, sizeof f->user_template, "{prompt}");
    snprintf(f->think_template, sizeof f->think_template, "%s", VKS_PROMPT_DEFAULT_THINK);
}

/* A template name of vks_chat_format, exactly (not Jinja text). */
static bool known_template(const char *name) {
    const char *family = vks_chat_template_family(name);
    return family && !strcmp(family, name);
}

static int copy_text(char *dst, size_t cap, const char *v, const char *name) {
    size_t n = strlen(v);
    if (n >= cap) return vks_set_error(VKS_ERR_FORMAT, "%s is longer than %zu bytes", name, cap - 1);
    memcpy(dst, v, n + 1);
    return VKS_OK;
}

int vks_prompt_set(vks_prompt_format *f, const char *key, const char *v, const char *name) {
    if (!f || !key || !v) return vks_set_error(VKS_ERR_ARG, "vks_prompt_set: NULL argument");
    char full[64];
    snprintf(full, sizeof full, "prompt.%.50s", key);
    if (!name) name = full;
    if (!strcmp(key, "chat_template")) {
        if (strcmp(v, "none") && strcmp(v, "model") && !known_template(v))
            return vks_set_error(VKS_ERR_FORMAT, "%s: unknown chat template '%.40s' (none, model, %s)", name, v,
                                 vks_chat_template_names());
        return copy_text(f->chat_template, sizeof f->chat_template, v, name);
    }
    if (!strcmp(key, "system")) return copy_text(f->system, sizeof f->system, v, name);
    if (!strcmp(key, "user_template")) {
        if (!strstr(v, "{prompt}")) return vks_set_error(VKS_ERR_FORMAT, "%s must contain {prompt}", name);
        return copy_text(f->user_template, sizeof f->user_template, v, name);
    }
    if (!strcmp(key, "think_template")) {
        if (!strstr(v, "{n}")) return vks_set_error(VKS_ERR_FORMAT, "%s must contain {n}", name);
        return copy_text(f->think_template, sizeof f->think_template, v, name);
    }
    if (!strcmp(key, "think")) {
        if (!strcmp(v, "true") || !strcmp(v, "1")) f->no_think = false;
        else if (!strcmp(v, "false") || !strcmp(v, "0")) f->no_think = true;
        else return vks_set_error(VKS_ERR_FORMAT, "%s must be true or false, not '%.40s'", name, v);
        return VKS_OK;
    }
    return vks_set_error(VKS_ERR_FORMAT, "unknown key '%s' (prompt: chat_template, system, user_template, "
                         "think_template, think)", full);
}

static bool is_raw_template(const vks_prompt_format *f) { return !strcmp(f->chat_template, "none"); }

int vks_prompt_check(const vks_prompt_format *f) {
    if (!f) return vks_set_error(VKS_ERR_ARG, "vks_prompt_check: NULL argument");
    bool raw = is_raw_template(f);
    if (strcmp(f->chat_template, "model") && !raw && !known_template(f->chat_template))
        return vks_set_error(VKS_ERR_FORMAT, "prompt.chat_template: unknown chat template '%s'", f->chat_template);
    if (!strstr(f->user_template, "{prompt}")) return vks_set_error(VKS_ERR_FORMAT, "prompt.user_template must contain {prompt}");
    if (!strstr(f->think_template, "{n}")) return vks_set_error(VKS_ERR_FORMAT, "prompt.think_template must contain {n}");
    if (raw && f->system[0])
        return vks_set_error(VKS_ERR_FORMAT, "prompt.system needs a chat template (prompt.chat_template: model or a name)");
    if (f->no_think && raw)
        return vks_set_error(VKS_ERR_FORMAT, "prompt.think = false needs a chat template with the switch (qwen3 or model)");
    if (f->no_think && strcmp(f->chat_template, "model") && strcmp(f->chat_template, "qwen3"))
        return vks_set_error(VKS_ERR_FORMAT, "prompt.think = false: chat template %s has no thinking switch (qwen3 has)",
                             f->chat_template);
    return VKS_OK;
}

bool vks_prompt_is_raw(const vks_prompt_format *f) {
    vks_prompt_format d;
    vks_prompt_format_default(&d);
    return is_raw_template(f) && !f->system[0] && !strcmp(f->user_template, d.user_template) && !f->no_think;
}

/* Growing text. */
typedef struct {
    char *v;
    size_t n, cap;
} text;

static int put(text *t, const char *s, size_t n) {
    if (t->cap - t->n <= n) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap - t->n <= n) cap *= 2;
        char *v = realloc(t->v, cap);
        if (!v) return vks_set_error(VKS_ERR_NOMEM, "prompt: out of memory");
        t->v = v, t->cap = cap;
    }
    memcpy(t->v + t->n, s, n);
    t->n += n;
    t->v[t->n] = 0;
    return VKS_OK;
}

/* tmpl with every `key` replaced by value, appended to t. */
static int put_replacing(text *t, const char *tmpl, const char *key, const char *value) {
    size_t kn = strlen(key);
    int rc = VKS_OK;
    for (const char *at; !rc && (at = strstr(tmpl, key)); tmpl = at + kn) {
        rc = put(t, tmpl, (size_t)(at - tmpl));
        if (!rc) rc = put(t, value, strlen(value));
    }
    return rc ? rc : put(t, tmpl, strlen(tmpl));
}

/* The user message: the task text (and the think sentence) in the user template. */
static int user_message(const vks_prompt_format *f, const char *task_prompt, int think_tokens, text *out) {
    text body = {0};
    int rc = put(&body, task_prompt, strlen(task_prompt));
    if (!rc && think_tokens > 0) {
        char n[16];
        snprintf(n, sizeof n, "%d", think_tokens);
        char last = body.n ? body.v[body.n - 1] : ' ';
        if (!strchr(" \t\n\r\f\v", last)) rc = put(&body, " ", 1);
        if (!rc) rc = put_replacing(&body, f->think_template, "{n}", n);
    }
    if (!rc) rc = put_replacing(out, f->user_template, "{prompt}", body.v);
    free(body.v);
    return rc;
}

/* The template text of chat format f (not raw): its name, or for "model" the tokenizer's model_template,
 * whose family must be known (and have the thinking switch when think = false). */
static int chat_template_text(const vks_prompt_format *f, const char *model_template, const char **tmpl) {
    *tmpl = f->chat_template;
    if (strcmp(*tmpl, "model")) return VKS_OK;
    const char *family = model_template ? vks_chat_template_family(model_template) : NULL;
    if (!family)
        return vks_set_error(VKS_ERR_FORMAT, "prompt.chat_template model: the tokenizer has %s (known families: %s)",
                             model_template ? "a chat template that is not recognised" : "no chat template",
                             vks_chat_template_names());
    if (f->no_think && strcmp(family, "qwen3"))
        return vks_set_error(VKS_ERR_FORMAT, "prompt.think = false: the model's chat template (%s) has no thinking "
                             "switch (qwen3 has)", family);
    *tmpl = model_template;
    return VKS_OK;
}

int vks_prompt_text(const vks_prompt_format *f, const char *model_template, const char *task_prompt, int think_tokens,
                    char **out, size_t *len) {
    if (!f || !task_prompt || !out || !len || think_tokens < 0)
        return vks_set_error(VKS_ERR_ARG, "vks_prompt_text: bad argument");
    *out = NULL, *len = 0;
    int rc = vks_prompt_check(f);
    if (rc) return rc;
    text user = {0};
    rc = user_message(f, task_prompt, think_tokens, &user);
    if (rc) return free(user.v), rc;
    if (is_raw_template(f)) {
        *out = user.v, *len = user.n;
        return VKS_OK;
    }
    const char *tmpl = NULL;
    rc = chat_template_text(f, model_template, &tmpl);
    vks_chat_message msgs[2];
    int n = 0;
    if (f->system[0]) msgs[n++] = (vks_chat_message){"system", f->system};
    msgs[n++] = (vks_chat_message){"user", user.v};
    vks_chat_options o = {.add_assistant_prompt = true, .disable_thinking = f->no_think};
    char *chat = NULL;
    if (!rc) rc = vks_chat_format_opts(tmpl, msgs, n, &o, &chat);
    free(user.v);
    if (rc) return rc;
    *out = chat, *len = strlen(chat);
    return VKS_OK;
}

int vks_prompt_tokenize(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *task_prompt,
                        int think_tokens, int32_t **ids, int *n) {
    if (!f || !tok || !ids || !n) return vks_set_error(VKS_ERR_ARG, "vks_prompt_tokenize: bad argument");
    *ids = NULL, *n = 0;
    char *s = NULL;
    size_t len = 0;
    int rc = vks_prompt_text(f, vks_tokenizer_chat_template(tok), task_prompt, think_tokens, &s, &len);
    if (rc) return rc;
    bool raw = is_raw_template(f);
    /* raw: BOS always (the old behaviour); a chat template: as the vocabulary says */
    vks_tokenize_options to = {.add_bos = raw || vks_tokenizer_wants_bos(tok), .parse_special = !raw};
    rc = vks_tokenizer_tokenize(tok, s, len, &to, ids, n);
    free(s);
    return rc;
}

/* The template text of f for tok ("model": the tokenizer's; checked like vks_prompt_text). */
static int template_of(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char **tmpl) {
    int rc = vks_prompt_check(f);
    if (rc) return rc;
    if (is_raw_template(f)) return vks_set_error(VKS_ERR_ARG, "episodes: the raw format has no chat template");
    return chat_template_text(f, vks_tokenizer_chat_template(tok), tmpl);
}

/* conv[0..n) rendered (f's system message first when conv has none), with the assistant prompt. */
static int render_conversation(const vks_prompt_format *f, const char *tmpl, const char *const *roles,
                               const char *const *contents, int n, char **out) {
    vks_chat_message *msgs = calloc((size_t)n + 1, sizeof *msgs);
    if (!msgs) return vks_set_error(VKS_ERR_NOMEM, "prompt: out of memory");
    int k = 0;
    if (f->system[0] && !(n > 0 && !strcmp(roles[0], "system"))) msgs[k++] = (vks_chat_message){"system", f->system};
    for (int i = 0; i < n; i++) msgs[k++] = (vks_chat_message){roles[i], contents[i]};
    vks_chat_options o = {.add_assistant_prompt = true, .disable_thinking = f->no_think};
    int rc = vks_chat_format_opts(tmpl, msgs, k, &o, out);
    free(msgs);
    return rc;
}

int vks_prompt_episode_start(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *const *roles,
                             const char *const *contents, int n, int32_t **ids, int *n_ids) {
    if (!f || !tok || !roles || !contents || n < 1 || !ids || !n_ids)
        return vks_set_error(VKS_ERR_ARG, "vks_prompt_episode_start: bad argument");
    const char *tmpl = NULL;
    char *text = NULL;
    int rc = template_of(f, tok, &tmpl);
    if (!rc) rc = render_conversation(f, tmpl, roles, contents, n, &text);
    vks_tokenize_options to = {.add_bos = vks_tokenizer_wants_bos(tok), .parse_special = true};
    if (!rc) rc = vks_tokenizer_tokenize(tok, text, strlen(text), &to, ids, n_ids);
    free(text);
    return rc;
}

/* Stands for the sampled turn while the template renders the conversation: a text no turn holds. */
static const char turn_marker[] = "\x01vkswarm-turn\x01";

int vks_prompt_episode_reply(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *const *roles,
                             const char *const *contents, int n, int32_t stop_token, int32_t **ids, int *n_ids) {
    if (!f || !tok || !roles || !contents || n < 1 || !ids || !n_ids)
        return vks_set_error(VKS_ERR_ARG, "vks_prompt_episode_reply: bad argument");
    int turn = n - 1;
    while (turn >= 0 && strcmp(roles[turn], "assistant")) turn--;
    const char **marked = malloc(sizeof *marked * (size_t)n);
    if (!marked) return vks_set_error(VKS_ERR_NOMEM, "prompt: out of memory");
    for (int i = 0; i < n; i++) marked[i] = i == turn ? turn_marker : contents[i];
    const char *tmpl = NULL;
    char *text = NULL, *stop = NULL;
    size_t stop_len = 0;
    int rc = turn < 0 ? vks_set_error(VKS_ERR_ARG, "vks_prompt_episode_reply: no assistant turn")
                      : template_of(f, tok, &tmpl);
    if (!rc) rc = render_conversation(f, tmpl, roles, marked, n, &text);
    if (!rc) rc = vks_tokenizer_detokenize(tok, &stop_token, 1, true, &stop, &stop_len);
    const char *at = text ? strstr(text, turn_marker) : NULL, *after = at ? at + strlen(turn_marker) : NULL;
    while (after && (*after == ' ' || *after == '\n')) after++; /* llama2 prints " </s>" */
    if (!rc && (!at || strstr(after, turn_marker) || !stop_len || strncmp(after, stop, stop_len)))
        rc = vks_set_error(VKS_ERR_FORMAT, "chat template %s: an assistant turn is not followed by its stop token "
                           "in the template's text, so a turn as sampled cannot be continued", f->chat_template);
    vks_tokenize_options to = {.add_bos = false, .parse_special = true};
    if (!rc) rc = vks_tokenizer_tokenize(tok, after + stop_len, strlen(after + stop_len), &to, ids, n_ids);
    free(marked), free(text), free(stop);
    return rc;
}

int vks_prompt_check_tokenizer(const vks_prompt_format *f, const struct vks_tokenizer *tok) {
    if (!f || !tok) return vks_set_error(VKS_ERR_ARG, "vks_prompt_check_tokenizer: NULL argument");
    const char *model = vks_tokenizer_chat_template(tok);
    if (!strcmp(f->chat_template, "model") && model && !vks_chat_template_family(model)) /* never replaced by a guess */
        return vks_set_error(VKS_ERR_FORMAT, "prompt.chat_template model: %s: the chat template is not recognised "
                             "(known families: %s)", vks_tokenizer_chat_template_file(tok), vks_chat_template_names());
    char *text = NULL;
    size_t len = 0;
    int rc = vks_prompt_text(f, vks_tokenizer_chat_template(tok), "", 0, &text, &len);
    free(text);
    return rc;
}
