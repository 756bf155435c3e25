/* sft_data.c: supervised fine-tuning data (vks_sft_data.h): JSONL lines read
 * as hostile input and tokenized into masked sequences, and the resumable
 * batcher that shuffles them per epoch and packs them into micro-batches. */
#include "vkswarm/vks_sft_data.h"
#include "vkswarm/vks_philox.h"
#include "vkswarm/vks_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct vks_sft_data {
    int32_t *tokens;   /* every sequence, back to back */
    uint8_t *mask;     /* per token: 1 when it is in the loss */
    int64_t *offsets;  /* sequence i is tokens[offsets[i] .. offsets[i+1]) */
    int64_t *lines;    /* source line of each sequence */
    int64_t n_seqs;
    int64_t cap_offsets, cap_lines, cap_tokens, cap_mask; /* allocated entries of each array */
    vks_sft_stats stats;
};

/* ---- storage ---- */

static int grow(void **p, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return VKS_OK;
    int64_t n = *cap ? *cap : 1024;
    while (n < need) n *= 2;
    size_t bytes;
    if (!vks_mul_size((size_t)n, elem, &bytes)) return vks_set_error(VKS_ERR_NOMEM, "SFT data: too large");
    void *q = realloc(*p, bytes);
    if (!q) return vks_set_error(VKS_ERR_NOMEM, "SFT data: out of memory");
    *p = q;
    *cap = n;
    return VKS_OK;
}

/* Room for one more sequence of len tokens (offsets[0] is set: see load_stream). */
static int reserve_sequence(vks_sft_data *d, int len) {
    int rc = grow((void **)&d->offsets, &d->cap_offsets, d->n_seqs + 2, sizeof *d->offsets);
    if (rc == VKS_OK) rc = grow((void **)&d->lines, &d->cap_lines, d->n_seqs + 1, sizeof *d->lines);
    if (rc != VKS_OK) return rc;
    int64_t need = d->offsets[d->n_seqs] + len;
    rc = grow((void **)&d->tokens, &d->cap_tokens, need, sizeof *d->tokens);
    if (rc == VKS_OK) rc = grow((void **)&d->mask, &d->cap_mask, need, sizeof *d->mask);
    return rc;
}

/* Appends BOS a b EOS (b may be empty: the {"text"} form passes it as a),
 * loss from the first token of b (or of a when loss_from_a), cut to `keep`. */
static int append_sequence(vks_sft_data *d, int bos, const int32_t *a, int na, const int32_t *b, int nb, int eos,
                           bool loss_from_a, int keep, int64_t line) {
    int64_t full = 2 + (int64_t)na + nb;
    int len = full < keep ? (int)full : keep;
    int rc = reserve_sequence(d, len);
    if (rc != VKS_OK) return rc;
    int64_t at = d->offsets[d->n_seqs];
    int32_t *t = d->tokens + at;
    uint8_t *m = d->mask + at;
    for (int i = 0; i < len; i++) {
        int k = i - 1; /* index into a then b */
        t[i] = i == 0 ? bos : k < na ? a[k] : k < na + nb ? b[k - na] : eos;
        m[i] = i > 0 && (loss_from_a || k >= na);
        d->stats.n_loss_tokens += m[i];
    }
    d->lines[d->n_seqs] = line;
    d->offsets[++d->n_seqs] = at + len;
    d->stats.n_tokens += len;
    if (len > d->stats.max_len) d->stats.max_len = len;
    return VKS_OK;
}

/* Appends tokens[0..len) with their mask as one sequence, cut to keep tokens. */
static int append_masked(vks_sft_data *d, const int32_t *tokens, const uint8_t *mask, int len, int keep, int64_t line) {
    if (len > keep) len = keep;
    int rc = reserve_sequence(d, len);
    if (rc != VKS_OK) return rc;
    int64_t at = d->offsets[d->n_seqs];
    memcpy(d->tokens + at, tokens, sizeof *tokens * (size_t)len);
    memcpy(d->mask + at, mask, (size_t)len);
    for (int i = 0; i < len; i++) d->stats.n_loss_tokens += mask[i];
    d->lines[d->n_seqs] = line;
    d->offsets[++d->n_seqs] = at + len;
    d->stats.n_tokens += len;
    if (len > d->stats.max_len) d->stats.max_len = len;
    return VKS_OK;
}

/* ---- one line ---- */

typedef struct {
    const char *name;
    const vks_tokenizer *tok;
    vks_sft_options o;
    int bos, eos, vocab;
} parse_ctx;

/* Tokenizes text (len bytes, NUL bytes allowed) of a field and checks every id. */
static int tokenize_text(const parse_ctx *c, const char *text, size_t len, const char *field, int32_t **ids, int *n) {
    vks_tokenize_options to = {.add_bos = false, .add_eos = false, .parse_special = false};
    int rc = vks_tokenizer_tokenize(c->tok, text, len, &to, ids, n);
    if (rc != VKS_OK) return vks_error_prefix(rc, "\"%s\"", field);
    for (int i = 0; i < *n; i++)
        if ((*ids)[i] < 0 || (*ids)[i] >= c->vocab)
            return vks_set_error(VKS_ERR_FORMAT, "\"%s\": token id %d outside the vocabulary of %d", field,
                                 (int)(*ids)[i], c->vocab);
    return VKS_OK;
}

/* A JSON string field tokenized (tokenize_text). */
static int tokenize_field(const parse_ctx *c, json_t *s, const char *field, int32_t **ids, int *n) {
    return tokenize_text(c, json_string_value(s), json_string_length(s), field, ids, n);
}

/* The {"prompt", "completion"} or {"text"} fields of a line's object. */
static int line_fields(json_t *root, json_t **a, json_t **b) {
    if (!json_is_object(root)) return vks_set_error(VKS_ERR_FORMAT, "not a JSON object");
    json_t *prompt = json_object_get(root, "prompt"), *completion = json_object_get(root, "completion");
    json_t *text = json_object_get(root, "text");
    if (text && (prompt || completion))
        return vks_set_error(VKS_ERR_FORMAT, "both \"text\" and \"prompt\"/\"completion\"");
    if (text) {
        *a = text;
        *b = NULL;
        return json_is_string(text) ? VKS_OK : vks_set_error(VKS_ERR_FORMAT, "\"text\" is not a string");
    }
    if (!prompt && !completion)
        return vks_set_error(VKS_ERR_FORMAT, "neither \"text\" nor \"prompt\" and \"completion\"");
    if (!prompt || !completion)
        return vks_set_error(VKS_ERR_FORMAT, "missing \"%s\"", prompt ? "completion" : "prompt");
    if (!json_is_string(prompt)) return vks_set_error(VKS_ERR_FORMAT, "\"prompt\" is not a string");
    if (!json_is_string(completion)) return vks_set_error(VKS_ERR_FORMAT, "\"completion\" is not a string");
    *a = prompt;
    *b = completion;
    return VKS_OK;
}

typedef enum { LINE_OK, LINE_MALFORMED, LINE_FATAL } line_result;

/* Applies the long-sequence policy; returns the tokens to keep (0: skip) or an error. */
static int length_policy(vks_sft_data *d, const parse_ctx *c, int64_t len, int na, bool text, int *keep) {
    *keep = (int)(len <= c->o.seq_len ? len : 0);
    if (len <= c->o.seq_len) return VKS_OK;
    if (c->o.long_policy == VKS_SFT_LONG_REFUSE)
        return vks_set_error(VKS_ERR_FORMAT, "%lld tokens (BOS and EOS included) exceed the context of %d; "
                             "shorten the line or truncate", (long long)len, c->o.seq_len);
    bool keeps_loss = text ? c->o.seq_len >= 2 : 1 + na < c->o.seq_len; /* a loss token fits */
    if (c->o.long_policy == VKS_SFT_LONG_TRUNCATE && keeps_loss) {
        *keep = c->o.seq_len;
        d->stats.n_truncated++;
    } else {
        d->stats.n_skipped_long++;
    }
    return VKS_OK;
}

/* Growing tokens and mask of a multi-turn transcript. */
typedef struct {
    int32_t *t;
    uint8_t *m;
    int n, cap;
} transcript;

static int put_tokens(transcript *x, const int32_t *ids, int n, uint8_t loss) {
    if (n > INT32_MAX / 2 - x->n) return vks_set_error(VKS_ERR_FORMAT, "too many tokens");
    if (x->n + n > x->cap) {
        int cap = (x->n + n) * 2;
        int32_t *t = realloc(x->t, sizeof *t * (size_t)cap);
        uint8_t *m = t ? realloc(x->m, (size_t)cap) : NULL;
        if (t) x->t = t;
        if (!t || !m) return vks_set_error(VKS_ERR_NOMEM, "SFT data: out of memory");
        x->m = m, x->cap = cap;
    }
    memcpy(x->t + x->n, ids, sizeof *ids * (size_t)n);
    memset(x->m + x->n, loss, (size_t)n);
    x->n += n;
    return VKS_OK;
}

/* Tokenizes text (len bytes) into x with the given loss flag. */
static int put_text(transcript *x, const parse_ctx *c, const char *text, size_t len, const char *field, uint8_t loss) {
    int32_t *ids = NULL;
    int n = 0;
    int rc = tokenize_text(c, text, len, field, &ids, &n);
    if (!rc) rc = put_tokens(x, ids, n, loss);
    free(ids);
    return rc;
}

/* {"prompt", "turns": [{"role", "content"}, ...]}: a multi-turn episode (vks_tasks.h "how an episode reaches the
 * model"): BOS prompt, then each assistant turn and EOS (in the loss), the other messages between them (system,
 * user, tool: each content and "\n", one text per run of them, never in the loss). The last turn is the assistant's. */
static int turns_line(const parse_ctx *c, json_t *root, transcript *x, int *n_prompt) {
    json_t *prompt = json_object_get(root, "prompt"), *turns = json_object_get(root, "turns");
    size_t n = json_array_size(turns);
    if (json_object_get(root, "completion") || json_object_get(root, "text"))
        return vks_set_error(VKS_ERR_FORMAT, "\"turns\" beside \"completion\" or \"text\"");
    if (!json_is_string(prompt)) return vks_set_error(VKS_ERR_FORMAT, "\"prompt\" is not a string");
    if (!json_is_array(turns) || n < 1 || n > 2 * 32 * 17) /* VKS_ENV_MAX_TURNS turns, their replies */
        return vks_set_error(VKS_ERR_FORMAT, "\"turns\" is not a list of 1 to 1088 messages");
    int rc = put_tokens(x, &c->bos, 1, 0);
    if (!rc) rc = put_text(x, c, json_string_value(prompt), json_string_length(prompt), "prompt", 0);
    *n_prompt = x->n - 1;
    char *run = NULL; /* the environment's messages since the last assistant turn */
    size_t run_len = 0;
    for (size_t i = 0; !rc && i < n; i++) {
        json_t *m = json_array_get(turns, i), *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        const char *r = json_string_value(role);
        bool assistant = r && !strcmp(r, "assistant");
        if (!json_is_object(m) || !r || (!assistant && strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "tool")))
            rc = vks_set_error(VKS_ERR_FORMAT, "\"turns\"[%zu]: \"role\" is not assistant, system, user or tool", i);
        else if (!json_is_string(content))
            rc = vks_set_error(VKS_ERR_FORMAT, "\"turns\"[%zu]: \"content\" is not a string", i);
        else if (assistant && run) {
            rc = put_text(x, c, run, run_len, "turns", 0);
            free(run), run = NULL, run_len = 0;
        }
        if (!rc && assistant) {
            rc = put_text(x, c, json_string_value(content), json_string_length(content), "turns", 1);
            if (!rc) rc = put_tokens(x, &c->eos, 1, 1);
        } else if (!rc) {
            size_t k = json_string_length(content);
            char *grown = realloc(run, run_len + k + 2);
            if (!grown) rc = vks_set_error(VKS_ERR_NOMEM, "SFT data: out of memory");
            else run = grown, memcpy(run + run_len, json_string_value(content), k), run_len += k, run[run_len++] = '\n';
        }
    }
    if (!rc && run) rc = vks_set_error(VKS_ERR_FORMAT, "\"turns\" ends with a message that is not the assistant's");
    free(run);
    return rc;
}

static line_result add_turns_line(vks_sft_data *d, const parse_ctx *c, json_t *root, int64_t line_no) {
    transcript x = {0};
    int n_prompt = 0, keep = 0, rc = turns_line(c, root, &x, &n_prompt);
    line_result r = rc == VKS_OK ? LINE_OK : rc == VKS_ERR_NOMEM ? LINE_FATAL : LINE_MALFORMED;
    if (r == LINE_OK && length_policy(d, c, x.n, n_prompt, false, &keep) != VKS_OK) r = LINE_FATAL;
    if (r == LINE_OK && keep > 0 && d->n_seqs >= c->o.max_sequences) {
        vks_set_error(VKS_ERR_FORMAT, "more than %lld sequences", (long long)c->o.max_sequences);
        r = LINE_FATAL;
    }
    if (r == LINE_OK && keep > 0 && append_masked(d, x.t, x.m, x.n, keep, line_no) != VKS_OK) r = LINE_FATAL;
    free(x.t), free(x.m);
    return r;
}

static line_result add_line(vks_sft_data *d, const parse_ctx *c, const char *line, size_t len, int64_t line_no) {
    const char *nul = memchr(line, 0, len); /* jansson would stop there: "{...\0}" passes, others read "end of file" */
    if (nul) {
        vks_set_error(VKS_ERR_FORMAT, "a NUL byte at byte %zu", (size_t)(nul - line) + 1);
        return LINE_MALFORMED;
    }
    json_error_t err;
    json_t *root = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &err);
    if (!root) {
        vks_set_error(VKS_ERR_FORMAT, "bad JSON: %s (column %d)", err.text, err.column);
        return LINE_MALFORMED;
    }
    if (json_is_object(root) && json_object_get(root, "turns")) {
        line_result r = add_turns_line(d, c, root, line_no);
        json_decref(root);
        return r;
    }
    json_t *a = NULL, *b = NULL;
    int32_t *ia = NULL, *ib = NULL;
    int na = 0, nb = 0, keep = 0;
    int rc = line_fields(root, &a, &b);
    if (rc == VKS_OK) rc = tokenize_field(c, a, b ? "prompt" : "text", &ia, &na);
    if (rc == VKS_OK && b) rc = tokenize_field(c, b, "completion", &ib, &nb);
    line_result r = rc == VKS_OK ? LINE_OK : rc == VKS_ERR_NOMEM ? LINE_FATAL : LINE_MALFORMED;
    if (r == LINE_OK && length_policy(d, c, 2 + (int64_t)na + nb, na, !b, &keep) != VKS_OK) r = LINE_FATAL;
    if (r == LINE_OK && keep > 0 && d->n_seqs >= c->o.max_sequences) {
        vks_set_error(VKS_ERR_FORMAT, "more than %lld sequences", (long long)c->o.max_sequences);
        r = LINE_FATAL;
    }
    if (r == LINE_OK && keep > 0 && append_sequence(d, c->bos, ia, na, ib, nb, c->eos, !b, keep, line_no) != VKS_OK)
        r = LINE_FATAL;
    free(ia);
    free(ib);
    json_decref(root);
    return r;
}

/* ---- reading lines ---- */

static bool blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r') return false;
    return true;
}

/* Reads one line (without its LF) into *buf, at most max bytes; a longer line
 * is reported by *too_long at its byte max + 1, where the read stops (a line
 * without end, /dev/zero, is not read forever). Returns false at EOF. */
static bool read_line(FILE *f, char **buf, size_t *cap, size_t max, size_t *len, bool *too_long) {
    *len = 0;
    *too_long = false;
    int ch = EOF;
    bool any = false;
    while ((ch = getc_unlocked(f)) != EOF) { /* the stream is this call's alone */
        any = true;
        if (ch == '\n') break;
        if (*len >= max) {
            *too_long = true;
            break;
        }
        if (*len + 1 >= *cap) {
            size_t n = *cap ? *cap * 2 : 4096;
            if (n > max + 1) n = max + 1;
            char *p = realloc(*buf, n);
            if (!p) return false; /* reported as a read error by the caller (ferror clear: NOMEM) */
            *buf = p;
            *cap = n;
        }
        (*buf)[(*len)++] = (char)ch;
    }
    return any;
}

/* A malformed line: an error in strict mode, else counted with its message kept. */
static int malformed(vks_sft_data *d, const parse_ctx *c, int64_t line_no) {
    int rc = vks_error_prefix(VKS_ERR_FORMAT, "%s: line %lld", c->name, (long long)line_no);
    if (c->o.strict) return rc;
    if (d->stats.n_malformed++ == 0) snprintf(d->stats.first_error, sizeof d->stats.first_error, "%s", vks_last_error());
    return VKS_OK;
}

static int read_lines(vks_sft_data *d, const parse_ctx *c, FILE *f) {
    char *buf = NULL;
    size_t cap = 0, len = 0;
    bool too_long = false;
    int rc = VKS_OK;
    while (rc == VKS_OK && read_line(f, &buf, &cap, c->o.max_line_bytes, &len, &too_long)) {
        int64_t line_no = ++d->stats.n_lines;
        char *s = buf;
        if (line_no == 1 && len >= 3 && !memcmp(s, "\xef\xbb\xbf", 3)) s += 3, len -= 3;
        if (len > 0 && s[len - 1] == '\r') len--;
        if (too_long) { /* its end is unknown (unread): an error even when lenient */
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: line %lld: longer than %zu bytes", c->name, (long long)line_no,
                               c->o.max_line_bytes);
            break;
        }
        if (blank(s, len)) continue;
        line_result r = add_line(d, c, s, len, line_no);
        if (r == LINE_MALFORMED) rc = malformed(d, c, line_no);
        if (r == LINE_FATAL) rc = vks_error_prefix(VKS_ERR_FORMAT, "%s: line %lld", c->name, (long long)line_no);
    }
    if (rc == VKS_OK && ferror(f)) rc = vks_set_error(VKS_ERR_IO, "%s: read failed: %s", c->name, strerror(errno));
    else if (rc == VKS_OK && !feof(f)) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory reading a line", c->name);
    free(buf);
    return rc;
}

static int setup(const char *name, const vks_tokenizer *tok, const vks_sft_options *o, parse_ctx *c) {
    if (!name || !tok || !o) return vks_set_error(VKS_ERR_ARG, "SFT data: NULL argument");
    c->name = name;
    c->tok = tok;
    c->o = *o;
    if (!c->o.max_line_bytes) c->o.max_line_bytes = VKS_SFT_MAX_LINE_BYTES;
    if (!c->o.max_sequences) c->o.max_sequences = VKS_SFT_MAX_SEQUENCES;
    int tv = vks_tokenizer_vocab_size(tok);
    c->vocab = o->vocab_size > 0 ? o->vocab_size : tv;
    c->bos = vks_tokenizer_bos(tok);
    c->eos = vks_tokenizer_eos(tok);
    if (o->seq_len < 2) return vks_set_error(VKS_ERR_ARG, "%s: seq_len %d is too short for BOS and EOS", name, o->seq_len);
    if (o->long_policy < VKS_SFT_LONG_REFUSE || o->long_policy > VKS_SFT_LONG_SKIP || c->o.max_sequences < 0 ||
        o->vocab_size < 0)
        return vks_set_error(VKS_ERR_ARG, "%s: bad SFT data options", name);
    if (c->bos < 0 || c->bos >= c->vocab || c->eos < 0 || c->eos >= c->vocab)
        return vks_set_error(VKS_ERR_ARG, "%s: the tokenizer has no BOS and EOS inside the vocabulary of %d (bos %d, eos %d)",
                             name, c->vocab, c->bos, c->eos);
    if (tv > c->vocab)
        return vks_set_error(VKS_ERR_ARG, "%s: the tokenizer's %d tokens do not fit the model's vocabulary of %d", name,
                             tv, c->vocab);
    return VKS_OK;
}

static int finish(vks_sft_data *d, const parse_ctx *c, int rc, vks_sft_data **out) {
    if (rc == VKS_OK && d->n_seqs == 0) {
        if (d->stats.n_malformed)
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: no usable sequence (%lld malformed lines; first: %s)", c->name,
                               (long long)d->stats.n_malformed, d->stats.first_error);
        else
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: no sequences (%lld lines, %lld too long)", c->name,
                               (long long)d->stats.n_lines, (long long)d->stats.n_skipped_long);
    }
    if (rc != VKS_OK) {
        vks_sft_data_free(d);
        return rc;
    }
    d->stats.n_sequences = d->n_seqs;
    *out = d;
    return VKS_OK;
}

static int load_stream(FILE *f, const parse_ctx *c, vks_sft_data **out) {
    vks_sft_data *d = calloc(1, sizeof *d);
    if (!d) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", c->name);
    int rc = grow((void **)&d->offsets, &d->cap_offsets, 2, sizeof *d->offsets);
    if (rc == VKS_OK) {
        d->offsets[0] = 0;
        rc = read_lines(d, c, f);
    }
    return finish(d, c, rc, out);
}

int vks_sft_data_load(const char *path, const vks_tokenizer *tok, const vks_sft_options *o, vks_sft_data **out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "vks_sft_data_load: NULL argument");
    *out = NULL;
    parse_ctx c;
    int rc = setup(path, tok, o, &c);
    if (rc != VKS_OK) return rc;
    FILE *f = fopen(path, "rb");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    rc = load_stream(f, &c, out);
    fclose(f);
    return rc;
}

int vks_sft_data_parse(const char *text, size_t len, const char *name, const vks_tokenizer *tok,
                       const vks_sft_options *o, vks_sft_data **out) {
    if (!out || (!text && len)) return vks_set_error(VKS_ERR_ARG, "vks_sft_data_parse: NULL argument");
    *out = NULL;
    parse_ctx c;
    int rc = setup(name, tok, o, &c);
    if (rc != VKS_OK) return rc;
    static const char empty[1] = "";
    FILE *f = fmemopen((void *)(len ? text : empty), len ? len : 1, "rb"); /* glibc refuses a size of 0 */
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    if (!len) getc_unlocked(f); /* consume the stand-in byte: the stream is at EOF */
    rc = load_stream(f, &c, out);
    fclose(f);
    return rc;
}

void vks_sft_data_free(vks_sft_data *d) {
    if (!d) return;
    free(d->tokens);
    free(d->mask);
    free(d->offsets);
    free(d->lines);
    free(d);
}

void vks_sft_data_stats(const vks_sft_data *d, vks_sft_stats *s) {
    if (!s) return;
    if (d) *s = d->stats;
    else memset(s, 0, sizeof *s);
}

int64_t vks_sft_data_count(const vks_sft_data *d) { return d ? d->n_seqs : 0; }

int vks_sft_data_sequence(const vks_sft_data *d, int64_t i, const int32_t **tokens, const uint8_t **mask, int *len,
                          int64_t *line) {
    if (!d || i < 0 || i >= d->n_seqs) return vks_set_error(VKS_ERR_ARG, "SFT data: no sequence %lld", (long long)i);
    int64_t at = d->offsets[i];
    if (tokens) *tokens = d->tokens + at;
    if (mask) *mask = d->mask + at;
    if (len) *len = (int)(d->offsets[i + 1] - at);
    if (line) *line = d->lines[i];
    return VKS_OK;
}

int vks_sft_data_hash(const vks_sft_data *d, uint8_t out[32]) {
    if (!d || !out) return vks_set_error(VKS_ERR_ARG, "vks_sft_data_hash: NULL argument");
    if (sodium_init() < 0) return vks_set_error(VKS_ERR_NOMEM, "vks_sft_data_hash: libsodium failed to start");
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, 32);
    for (int64_t i = 0; i < d->n_seqs; i++) {
        int64_t at = d->offsets[i], n = d->offsets[i + 1] - at;
        uint8_t len_le[8];
        for (int k = 0; k < 8; k++) len_le[k] = (uint8_t)((uint64_t)n >> (8 * k));
        crypto_generichash_update(&st, len_le, sizeof len_le);
        for (int64_t t = 0; t < n; t++) { /* little-endian ids, whatever the host */
            uint32_t v = (uint32_t)d->tokens[at + t];
            uint8_t b[5] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24), d->mask[at + t]};
            crypto_generichash_update(&st, b, sizeof b);
        }
    }
    crypto_generichash_final(&st, out, 32);
    return VKS_OK;
}

/* ---- the batcher ---- */

struct vks_sft_batcher {
    const vks_sft_data *d;
    vks_sft_batcher_options o;
    vks_sft_position pos;
    int64_t *order;     /* this epoch's permutation */
    int64_t order_epoch; /* the epoch `order` belongs to; -1: none yet */
    vks_sft_batch batch;
};

/* A uniform draw in [0, bound) from the epoch's counter-based stream. */
static uint64_t draw_below(uint64_t seed, int64_t epoch, int64_t i, uint64_t bound) {
    uint64_t hi = vks_philox_u32(seed, (uint32_t)epoch, (uint32_t)i, 0);
    uint64_t lo = vks_philox_u32(seed, (uint32_t)epoch, (uint32_t)i, 1);
    return (uint64_t)(((unsigned __int128)(hi << 32 | lo) * bound) >> 64);
}

static void make_order(vks_sft_batcher *b) {
    int64_t n = b->d->n_seqs;
    for (int64_t i = 0; i < n; i++) b->order[i] = i;
    if (b->o.shuffle)
        for (int64_t i = n - 1; i > 0; i--) {
            int64_t j = (int64_t)draw_below(b->pos.seed, b->pos.epoch, i, (uint64_t)i + 1);
            int64_t t = b->order[i];
            b->order[i] = b->order[j];
            b->order[j] = t;
        }
    b->order_epoch = b->pos.epoch;
}

static void batcher_free_buffers(vks_sft_batch *x) {
    free(x->tokens);
    free(x->targets);
    free(x->seq_start);
    free(x->pos);
    free(x->loss_mask);
    free(x->seq_lens);
    free(x->seq_index);
}

int vks_sft_batcher_create(const vks_sft_data *d, const vks_sft_batcher_options *o, vks_sft_batcher **out) {
    if (!d || !o || !out) return vks_set_error(VKS_ERR_ARG, "vks_sft_batcher_create: NULL argument");
    *out = NULL;
    if (o->max_tokens < d->stats.max_len || o->max_seqs < 0)
        return vks_set_error(VKS_ERR_ARG, "SFT batcher: a micro-batch of %d tokens cannot hold the longest sequence (%d tokens)",
                             o->max_tokens, d->stats.max_len);
    vks_sft_batcher *b = calloc(1, sizeof *b);
    if (!b) return vks_set_error(VKS_ERR_NOMEM, "SFT batcher: out of memory");
    b->d = d;
    b->o = *o;
    b->pos.seed = o->seed;
    b->order_epoch = -1;
    size_t n = (size_t)o->max_tokens;
    int64_t max_seqs = o->max_seqs > 0 && o->max_seqs < o->max_tokens ? o->max_seqs : o->max_tokens;
    vks_sft_batch *x = &b->batch;
    b->order = malloc((size_t)d->n_seqs * sizeof *b->order);
    x->tokens = malloc(n * sizeof *x->tokens);
    x->targets = malloc(n * sizeof *x->targets);
    x->seq_start = malloc(n * sizeof *x->seq_start);
    x->pos = malloc(n * sizeof *x->pos);
    x->loss_mask = malloc(n);
    x->seq_lens = malloc((size_t)max_seqs * sizeof *x->seq_lens);
    x->seq_index = malloc((size_t)max_seqs * sizeof *x->seq_index);
    if (!b->order || !x->tokens || !x->targets || !x->seq_start || !x->pos || !x->loss_mask || !x->seq_lens ||
        !x->seq_index) {
        vks_sft_batcher_free(b);
        return vks_set_error(VKS_ERR_NOMEM, "SFT batcher: out of memory for %d tokens", o->max_tokens);
    }
    *out = b;
    return VKS_OK;
}

void vks_sft_batcher_free(vks_sft_batcher *b) {
    if (!b) return;
    batcher_free_buffers(&b->batch);
    free(b->order);
    free(b);
}

/* Appends sequence s as rows of the batch. */
static void pack_sequence(vks_sft_batch *x, const vks_sft_data *d, int64_t s) {
    int64_t at = d->offsets[s];
    int len = (int)(d->offsets[s + 1] - at), start = x->n_tokens;
    for (int t = 0; t < len; t++) {
        int r = start + t;
        bool last = t == len - 1;
        x->tokens[r] = d->tokens[at + t];
        x->targets[r] = last ? -1 : d->tokens[at + t + 1];
        x->loss_mask[r] = last ? 0 : d->mask[at + t + 1];
        x->seq_start[r] = start;
        x->pos[r] = t;
        x->n_loss_tokens += x->loss_mask[r];
    }
    x->seq_lens[x->n_seqs] = len;
    x->seq_index[x->n_seqs++] = s;
    x->n_tokens += len;
}

int vks_sft_batcher_next(vks_sft_batcher *b, const vks_sft_batch **out) {
    if (!b || !out) return vks_set_error(VKS_ERR_ARG, "vks_sft_batcher_next: NULL argument");
    const vks_sft_data *d = b->d;
    if (b->order_epoch != b->pos.epoch) make_order(b);
    vks_sft_batch *x = &b->batch;
    x->n_tokens = x->n_seqs = x->n_loss_tokens = 0;
    x->epoch = b->pos.epoch;
    while (b->pos.index < d->n_seqs) {
        int64_t s = b->order[b->pos.index];
        int64_t len = d->offsets[s + 1] - d->offsets[s];
        if (x->n_tokens + len > b->o.max_tokens || (b->o.max_seqs > 0 && x->n_seqs >= b->o.max_seqs)) break;
        pack_sequence(x, d, s);
        b->pos.index++;
    }
    if (b->pos.index == d->n_seqs) { /* the epoch is done: the next batch starts the next one */
        b->pos.epoch++;
        b->pos.index = 0;
    }
    *out = x;
    return VKS_OK;
}

void vks_sft_batcher_position(const vks_sft_batcher *b, vks_sft_position *pos) {
    if (b && pos) *pos = b->pos;
}

int vks_sft_batcher_seek(vks_sft_batcher *b, const vks_sft_position *pos) {
    if (!b || !pos) return vks_set_error(VKS_ERR_ARG, "vks_sft_batcher_seek: NULL argument");
    if (pos->epoch < 0 || pos->epoch > (int64_t)UINT32_MAX || pos->index < 0 || pos->index >= b->d->n_seqs)
        return vks_set_error(VKS_ERR_FORMAT, "SFT batcher: position epoch %lld, index %lld lies outside the data (%lld sequences)",
                             (long long)pos->epoch, (long long)pos->index, (long long)b->d->n_seqs);
    if (pos->seed != b->pos.seed) b->order_epoch = -1;
    b->pos = *pos;
    return VKS_OK;
}
