/* pretokenize.c: the regex word splits of byte-level BPE tokenizers, with
 * PCRE2 (UTF + UCP: \p{L}, \p{N} and \s are Unicode-aware, as in Hugging Face
 * tokenizers and llama.cpp's unicode_regex_split).
 *
 * Every byte ends up in exactly one word: text between matches is a word of
 * its own (as llama.cpp does). PCRE2 needs valid UTF-8, so invalid bytes are
 * matched as U+FFFD (a symbol: [^\s\p{L}\p{N}]) in a sanitized copy, and the
 * word boundaries are mapped back to the original bytes, which the byte-level
 * table then maps like any others. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

struct tok_pretok {
    pcre2_code *re;
    pcre2_match_context *mctx;
};

#define CONTRACTIONS "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
static const char GPT2_PATTERN[] = "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";
static const char LLAMA3_PATTERN[] = CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}"
                                     "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN2_PATTERN[] = CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}"
                                    "| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

const char *vks_tok_pretok_pattern(const char *pre, bool *ignore_merges) {
    *ignore_merges = false;
    if (!pre || !strcmp(pre, "default") || !strcmp(pre, "gpt-2") || !strcmp(pre, "gpt2")) return GPT2_PATTERN;
    if (!strcmp(pre, "llama3") || !strcmp(pre, "llama-bpe") || !strcmp(pre, "llama-v3")) {
        *ignore_merges = true;
        return LLAMA3_PATTERN;
    }
    if (!strcmp(pre, "qwen2")) return QWEN2_PATTERN;
    return NULL;
}

const char *vks_tok_gpt2_pattern(void) { return GPT2_PATTERN; }

const char *vks_tok_pretok_name(const vks_tokenizer *t) {
    if (t->pre_name) return t->pre_name;
    if (!t->pre_pattern) return NULL;
    static const char *const names[] = {"gpt-2", "llama-bpe", "qwen2"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        bool ignore = false;
        const char *p = vks_tok_pretok_pattern(names[i], &ignore);
        if (!strcmp(p, t->pre_pattern) && ignore == t->ignore_merges) return names[i];
    }
    return NULL;
}

int vks_tok_pretok_create(const char *pattern, const char *source, tok_pretok **out) {
    *out = NULL;
    int err = 0;
    PCRE2_SIZE at = 0;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[160];
        pcre2_get_error_message(err, msg, sizeof msg);
        return vks_set_error(VKS_ERR_FORMAT, "%s: pre-tokenizer regex does not compile at offset %zu: %s", source,
                             (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* optional: interpreted matching when JIT is unavailable */
    tok_pretok *p = calloc(1, sizeof *p);
    pcre2_match_context *mctx = pcre2_match_context_create(NULL);
    if (!p || !mctx) {
        pcre2_code_free(re);
        pcre2_match_context_free(mctx);
        free(p);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", source);
    }
    pcre2_set_match_limit(mctx, 10000000); /* a hostile pattern fails instead of hanging */
    p->re = re;
    p->mctx = mctx;
    *out = p;
    return VKS_OK;
}

void vks_tok_pretok_free(tok_pretok *p) {
    if (!p) return;
    pcre2_code_free(p->re);
    pcre2_match_context_free(p->mctx);
    free(p);
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 if invalid. */
static size_t valid_utf8_len(const unsigned char *s, size_t n) {
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t len;
    uint32_t min, cp;
    if ((c & 0xE0) == 0xC0) { len = 2; min = 0x80; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { len = 3; min = 0x800; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { len = 4; min = 0x10000; cp = c & 0x07; }
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

/* Sanitized copy (invalid bytes -> U+FFFD) and, for every sanitized offset
 * (and the end), the original offset. NULL map when the text is valid. */
static int sanitize(const char *text, size_t len, char **clean, size_t **map, size_t *clean_len) {
    *clean = NULL;
    *map = NULL;
    const unsigned char *s = (const unsigned char *)text;
    bool valid = true;
    for (size_t i = 0; i < len && valid;) {
        size_t l = valid_utf8_len(s + i, len - i);
        valid = l > 0;
        i += l;
    }
    if (valid) {
        *clean_len = len;
        return VKS_OK;
    }
    size_t cap;
    if (!vks_mul_size(len, 3, &cap) || !vks_add_size(cap, 1, &cap))
        return vks_set_error(VKS_ERR_NOMEM, "tokenize: text too long");
    char *c = malloc(cap);
    size_t *m = malloc(cap * sizeof *m);
    if (!c || !m) {
        free(c);
        free(m);
        return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    }
    size_t at = 0;
    for (size_t i = 0; i < len;) {
        size_t l = valid_utf8_len(s + i, len - i);
        if (l == 0) {
            static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
            memcpy(c + at, fffd, 3);
            for (int k = 0; k < 3; k++) m[at + (size_t)k] = i;
            at += 3;
            i += 1;
        } else {
            memcpy(c + at, text + i, l);
            for (size_t k = 0; k < l; k++) m[at + k] = i;
            at += l;
            i += l;
        }
    }
    m[at] = len;
    *clean = c;
    *map = m;
    *clean_len = at;
    return VKS_OK;
}

typedef struct {
    tok_span *v;
    size_t n, cap;
} span_list;

static int add_span(span_list *l, size_t start, size_t end) {
    if (end <= start) return VKS_OK;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tok_span *v = realloc(l->v, cap * sizeof *v);
        if (!v) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = (tok_span){start, end - start};
    return VKS_OK;
}

/* Offset just past the code point at `at` in valid UTF-8. */
static size_t next_cp(const char *s, size_t n, size_t at) {
    at++;
    while (at < n && ((unsigned char)s[at] & 0xC0) == 0x80) at++;
    return at;
}

static int split_clean(const tok_pretok *p, const char *s, size_t n, const size_t *map, span_list *out) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(p->re, NULL);
    if (!md) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    int rc = VKS_OK;
    size_t at = 0, word_start = 0; /* sanitized offsets */
    while (rc == VKS_OK && at < n) {
        int m = pcre2_match(p->re, (PCRE2_SPTR)s, n, at, PCRE2_NO_UTF_CHECK, md, p->mctx);
        if (m == PCRE2_ERROR_NOMATCH) break;
        if (m < 0) {
            rc = vks_set_error(VKS_ERR_FORMAT, "tokenize: pre-tokenizer regex failed (PCRE2 error %d)", m);
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t ms = ov[0], me = ov[1];
        if (me <= ms) { /* an empty match: step over one code point */
            at = next_cp(s, n, ms > at ? ms : at);
            continue;
        }
        size_t a = map ? map[word_start] : word_start, b = map ? map[ms] : ms, c = map ? map[me] : me;
        rc = add_span(out, a, b); /* the unmatched text before the match */
        if (rc == VKS_OK) rc = add_span(out, b, c);
        word_start = at = me;
    }
    if (rc == VKS_OK) rc = add_span(out, map ? map[word_start] : word_start, map ? map[n] : n);
    pcre2_match_data_free(md);
    return rc;
}

int vks_tok_pretok_split(const tok_pretok *p, const char *text, size_t len, tok_span **spans, size_t *n) {
    *spans = NULL;
    *n = 0;
    if (!p) return vks_set_error(VKS_ERR_ARG, "tokenize: no pre-tokenizer");
    char *clean = NULL;
    size_t *map = NULL, clean_len = 0;
    int rc = sanitize(text, len, &clean, &map, &clean_len);
    if (rc != VKS_OK) return rc;
    span_list out = {0};
    rc = split_clean(p, clean ? clean : text, clean_len, map, &out);
    free(clean);
    free(map);
    if (rc != VKS_OK) {
        free(out.v);
        return rc;
    }
    *spans = out.v;
    *n = out.n;
    return VKS_OK;
}
