/* tokenizer_api.c: the public tokenize / detokenize of every tokenizer kind.
 *
 * Special tokens: CONTROL and UNKNOWN pieces are cut out of the text only
 * with parse_special, USER_DEFINED ones always (llama.cpp
 * tokenizer_st_partition), longest piece first. Raw text between them is
 * tokenized per fragment; SPM puts its dummy-prefix space before the first
 * fragment and before any fragment that follows a special token. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* ---- tokenize ---- */

typedef struct {
    size_t start, len;
    int32_t token; /* -1: raw text */
} fragment;

typedef struct {
    fragment *v;
    size_t n, cap;
} frag_list;

static int frag_push(frag_list *l, fragment f) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        fragment *v = realloc(l->v, cap * sizeof *v);
        if (!v) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = f;
    return VKS_OK;
}

static bool special_eligible(const vks_tokenizer *t, int32_t id, bool parse_special) {
    uint8_t ty = t->type[id];
    return ty == VKS_TOKEN_TYPE_USER_DEFINED || parse_special;
}

/* First occurrence of needle (n > 0 bytes) in hay[0..h), or NULL. */
static const char *find_bytes(const char *hay, size_t h, const char *needle, size_t n) {
    while (h >= n) {
        const char *c = memchr(hay, needle[0], h - n + 1);
        if (!c) return NULL;
        if (!memcmp(c, needle, n)) return c;
        h -= (size_t)(c - hay) + 1;
        hay = c + 1;
    }
    return NULL;
}

/* Cuts every occurrence of token id out of the raw fragments of *l. */
static int split_on(const vks_tokenizer *t, const char *text, int32_t id, frag_list *l) {
    const char *piece = t->blob + t->offset[id];
    size_t plen = (size_t)t->len[id];
    frag_list next = {0};
    int rc = VKS_OK;
    for (size_t i = 0; rc == VKS_OK && i < l->n; i++) {
        fragment f = l->v[i];
        if (f.token >= 0 || f.len < plen) {
            rc = frag_push(&next, f);
            continue;
        }
        size_t at = f.start, end = f.start + f.len;
        while (rc == VKS_OK && at < end) {
            const char *hit = find_bytes(text + at, end - at, piece, plen);
            if (!hit) break;
            size_t h = (size_t)(hit - text);
            if (h > at) rc = frag_push(&next, (fragment){at, h - at, -1});
            if (rc == VKS_OK) rc = frag_push(&next, (fragment){h, plen, id});
            at = h + plen;
        }
        if (rc == VKS_OK && at < end) rc = frag_push(&next, (fragment){at, end - at, -1});
    }
    free(l->v);
    *l = next;
    return rc;
}

static int partition(const vks_tokenizer *t, const char *text, size_t len, bool parse_special, frag_list *l) {
    int rc = len > 0 ? frag_push(l, (fragment){0, len, -1}) : VKS_OK;
    for (int k = 0; rc == VKS_OK && k < t->n_specials; k++) {
        int32_t id = t->specials[k];
        if (special_eligible(t, id, parse_special)) rc = split_on(t, text, id, l);
    }
    return rc;
}

static int tokenize_fragments(const vks_tokenizer *t, const char *text, const frag_list *l, tok_ids *out) {
    bool prev_special = true; /* SPM: the first fragment gets the dummy prefix */
    int rc = VKS_OK;
    for (size_t i = 0; rc == VKS_OK && i < l->n; i++) {
        const fragment *f = &l->v[i];
        if (f->token >= 0) {
            rc = vks_tok_ids_push(out, f->token);
            prev_special = true;
        } else if (t->kind == TOK_KIND_SPM) {
            rc = vks_tok_spm_encode_fragment(t, text + f->start, f->len, t->add_space_prefix && prev_special, out);
            prev_special = false;
        } else {
            rc = vks_tok_bpe_encode_fragment(t, text + f->start, f->len, out);
        }
    }
    return rc;
}

static int tokenize_llama2c(const vks_tokenizer *t, const char *text, size_t len, const vks_tokenize_options *o,
                            tok_ids *out) {
    if (len > (size_t)INT32_MAX - 3) return vks_set_error(VKS_ERR_ARG, "tokenize: text of %zu bytes is too long", len);
    out->v = malloc((len + 3) * sizeof *out->v);
    if (!out->v) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    int n = 0;
    int rc = vks_tokenizer_encode(t, text, len, o->add_bos, o->add_eos, out->v, &n);
    out->n = (size_t)n;
    return rc;
}

int vks_tokenizer_tokenize(const vks_tokenizer *t, const char *text, size_t len, const vks_tokenize_options *o,
                           int32_t **ids, int *n) {
    if (!t || !o || !ids || !n || (!text && len > 0))
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_tokenize: NULL argument");
    *ids = NULL;
    *n = 0;
    tok_ids out = {0};
    int rc;
    if (t->kind == TOK_KIND_LLAMA2C) {
        rc = tokenize_llama2c(t, text, len, o, &out);
    } else {
        frag_list frags = {0};
        rc = o->add_bos && t->bos >= 0 ? vks_tok_ids_push(&out, t->bos) : VKS_OK;
        if (rc == VKS_OK) rc = partition(t, text, len, o->parse_special, &frags);
        if (rc == VKS_OK) rc = tokenize_fragments(t, text, &frags, &out);
        if (rc == VKS_OK && o->add_eos && t->eos >= 0) rc = vks_tok_ids_push(&out, t->eos);
        free(frags.v);
    }
    if (rc == VKS_OK && out.n > (size_t)INT32_MAX) rc = vks_set_error(VKS_ERR_ARG, "tokenize: too many tokens");
    if (rc != VKS_OK) {
        free(out.v);
        return rc;
    }
    *ids = out.v;
    *n = (int)out.n;
    return VKS_OK;
}

/* ---- detokenize ---- */

typedef struct {
    char *v;
    size_t n, cap;
} byte_buf;

static int buf_add(byte_buf *b, const char *s, size_t n) {
    if (n > b->cap - b->n - 1 || !b->v) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap - b->n - 1 < n) {
            if (cap > SIZE_MAX / 2) return vks_set_error(VKS_ERR_NOMEM, "detokenize: out of memory");
            cap *= 2;
        }
        char *v = realloc(b->v, cap);
        if (!v) return vks_set_error(VKS_ERR_NOMEM, "detokenize: out of memory");
        b->v = v;
        b->cap = cap;
    }
    memcpy(b->v + b->n, s, n);
    b->n += n;
    b->v[b->n] = '\0';
    return VKS_OK;
}

/* What token id prints at this point (at_start: nothing printed yet). */
static const char *token_text(const vks_tokenizer *t, int32_t id, bool show_special, bool at_start, char *tmp,
                              size_t *len) {
    *len = 0;
    if (t->kind == TOK_KIND_LLAMA2C) {
        if (id == t->bos || id == t->eos) {
            if (!show_special) return "";
            *len = (size_t)t->len[id];
            return t->blob + t->offset[id];
        }
        return vks_tokenizer_decode(t, at_start ? t->bos : -1, id, tmp, len);
    }
    if (t->type[id] == VKS_TOKEN_TYPE_CONTROL) {
        if (!show_special) return "";
        *len = (size_t)t->len[id];
        return t->blob + t->offset[id];
    }
    const char *s = t->text_blob + t->text_offset[id];
    size_t n = (size_t)t->text_len[id];
    if (at_start && t->kind == TOK_KIND_SPM && t->add_space_prefix && n > 0 && s[0] == ' ') {
        s++;
        n--;
    }
    *len = n;
    return s;
}

int vks_tokenizer_detokenize(const vks_tokenizer *t, const int32_t *ids, int n, bool show_special, char **text,
                             size_t *len) {
    if (!t || (!ids && n > 0) || n < 0 || !text)
        return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_detokenize: bad argument");
    *text = NULL;
    if (len) *len = 0;
    byte_buf b = {0};
    int rc = buf_add(&b, "", 0);
    bool at_start = true;
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->vocab_size) {
            rc = vks_set_error(VKS_ERR_ARG, "detokenize: token %d (position %d) outside 0..%d", ids[i], i,
                               t->vocab_size - 1);
            break;
        }
        char tmp[2];
        size_t pl = 0;
        bool special = t->kind == TOK_KIND_LLAMA2C ? ids[i] == t->bos || ids[i] == t->eos
                                                   : t->type[ids[i]] == VKS_TOKEN_TYPE_CONTROL;
        const char *p = token_text(t, ids[i], show_special, at_start, tmp, &pl);
        rc = buf_add(&b, p, pl);
        if (!special) at_start = false;
    }
    if (rc != VKS_OK) {
        free(b.v);
        return rc;
    }
    *text = b.v;
    if (len) *len = b.n;
    return VKS_OK;
}

/* ---- accessors ---- */

const char *vks_tokenizer_kind(const vks_tokenizer *t) {
    if (!t) return "none";
    return t->kind == TOK_KIND_LLAMA2C ? "llama2c" : t->kind == TOK_KIND_SPM ? "spm" : "bpe";
}
bool vks_tokenizer_wants_bos(const vks_tokenizer *t) { return t && t->add_bos && t->bos >= 0; }
bool vks_tokenizer_wants_eos(const vks_tokenizer *t) { return t && t->add_eos && t->eos >= 0; }
const char *vks_tokenizer_chat_template(const vks_tokenizer *t) { return t ? t->chat_template : NULL; }
const char *vks_tokenizer_chat_template_file(const vks_tokenizer *t) { return t ? t->chat_template_file : NULL; }

int vks_tokenizer_find(const vks_tokenizer *t, const char *text, size_t len) {
    if (!t || (!text && len > 0)) return -1;
    return vks_tok_lookup(t, text, len);
}

int vks_tokenizer_token_type(const vks_tokenizer *t, int id) {
    if (!t || id < 0 || id >= t->vocab_size) return -1;
    return t->type ? t->type[id] : VKS_TOKEN_TYPE_NORMAL;
}
