/* tokenizer_vocab.c: builds SPM / BPE tokenizers from a vocabulary (GGUF or
 * tokenizer.json, already parsed): pieces, display texts, special tokens,
 * byte tokens and merges. Tokenizing is in tokenizer_api.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static const char SPACE_ESC[3] = {(char)0xE2, (char)0x96, (char)0x81};  /* U+2581 */
static const char UNK_TEXT[3] = {(char)0xE2, (char)0x96, (char)0x85};   /* U+2585, as llama.cpp prints unk */

static int check_spec(const tok_vocab_spec *s) {
    if (s->n < 1 || s->n > TOK_MAX_VOCAB)
        return vks_set_error(VKS_ERR_FORMAT, "%s: vocabulary of %d tokens outside 1..%d", s->source, s->n,
                             TOK_MAX_VOCAB);
    for (int i = 0; i < s->n; i++) {
        if (s->lens[i] > TOK_MAX_PIECE)
            return vks_set_error(VKS_ERR_FORMAT, "%s: token %d is %zu bytes long (limit %d)", s->source, i,
                                 s->lens[i], TOK_MAX_PIECE);
        if (s->scores && !isfinite(s->scores[i]))
            return vks_set_error(VKS_ERR_FORMAT, "%s: token %d has a non-finite score", s->source, i);
        if (s->types && s->types[i] > VKS_TOKEN_TYPE_BYTE)
            return vks_set_error(VKS_ERR_FORMAT, "%s: token %d has unknown type %u", s->source, i, s->types[i]);
    }
    const int32_t ids[4] = {s->bos, s->eos, s->unk, s->pad};
    const char *names[4] = {"bos", "eos", "unknown", "padding"};
    for (int k = 0; k < 4; k++)
        if (ids[k] < -1 || ids[k] >= s->n)
            return vks_set_error(VKS_ERR_FORMAT, "%s: %s token id %d outside 0..%d", s->source, names[k], ids[k],
                                 s->n - 1);
    if (s->n_merges > TOK_MAX_MERGES)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %zu merges (limit %d)", s->source, s->n_merges, TOK_MAX_MERGES);
    return VKS_OK;
}

static int copy_pieces(vks_tokenizer *t, const tok_vocab_spec *s) {
    size_t V = (size_t)s->n, blob = 0;
    for (size_t i = 0; i < V; i++) blob += s->lens[i] + 1; /* each <= 1 MiB, V <= 4M: no overflow */
    t->offset = malloc(V * sizeof *t->offset);
    t->len = malloc(V * sizeof *t->len);
    t->score = malloc(V * sizeof *t->score);
    t->sorted = malloc(V * sizeof *t->sorted);
    t->type = malloc(V);
    t->blob = malloc(blob);
    if (!t->offset || !t->len || !t->score || !t->sorted || !t->type || !t->blob)
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for the vocabulary", s->source);
    size_t at = 0;
    for (size_t i = 0; i < V; i++) {
        memcpy(t->blob + at, s->pieces[i], s->lens[i]);
        t->blob[at + s->lens[i]] = '\0';
        t->offset[i] = at;
        t->len[i] = (int32_t)s->lens[i];
        t->score[i] = s->scores ? s->scores[i] : 0.0f;
        t->type[i] = s->types ? s->types[i] : VKS_TOKEN_TYPE_NORMAL;
        t->sorted[i] = (sorted_piece){t->blob + at, (int32_t)s->lens[i], (int32_t)i};
        if ((int)s->lens[i] > t->max_token_length) t->max_token_length = (int)s->lens[i];
        at += s->lens[i] + 1;
    }
    vks_tok_sort_index(t);
    return VKS_OK;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

int vks_tok_byte_piece(const char *p, size_t n) {
    if (n != 6 || memcmp(p, "<0x", 3) != 0 || p[5] != '>') return -1;
    int hi = hex_digit(p[3]), lo = hex_digit(p[4]);
    return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

/* What piece i prints, written at out (room for len + 3 bytes); returns bytes. */
static size_t piece_text(const vks_tokenizer *t, int i, char *out) {
    const char *p = t->blob + t->offset[i];
    size_t n = (size_t)t->len[i], at = 0;
    uint8_t ty = t->type[i];
    if (ty == VKS_TOKEN_TYPE_UNKNOWN) {
        memcpy(out, UNK_TEXT, 3);
        return 3;
    }
    if (ty == VKS_TOKEN_TYPE_CONTROL || ty == VKS_TOKEN_TYPE_USER_DEFINED) {
        memcpy(out, p, n);
        return n;
    }
    if (t->kind == TOK_KIND_SPM) {
        int b = ty == VKS_TOKEN_TYPE_BYTE ? vks_tok_byte_piece(p, n) : -1;
        if (b >= 0) {
            out[0] = (char)b;
            return 1;
        }
        for (size_t k = 0; k < n;) {
            if (n - k >= 3 && memcmp(p + k, SPACE_ESC, 3) == 0) {
                out[at++] = ' ';
                k += 3;
            } else {
                out[at++] = p[k++];
            }
        }
        return at;
    }
    for (size_t k = 0; k < n;) { /* BPE: undo the byte-to-code-point table */
        unsigned char c = (unsigned char)p[k];
        int b = -1;
        if (c >= 0xC0 && c < 0xE0 && k + 1 < n) b = vks_tok_cp_to_byte((uint32_t)(c & 0x1F) << 6 | (p[k + 1] & 0x3F));
        else if (c < 0x80) b = vks_tok_cp_to_byte(c);
        if (b >= 0) {
            out[at++] = (char)b;
            k += c < 0x80 ? 1 : 2;
        } else {
            out[at++] = p[k++]; /* not from the table: keep the bytes */
        }
    }
    return at;
}

static int build_texts(vks_tokenizer *t, const char *source) {
    size_t V = (size_t)t->vocab_size, total = 0;
    for (size_t i = 0; i < V; i++) total += (size_t)t->len[i] + 3;
    t->text_blob = malloc(total + 1);
    t->text_offset = malloc(V * sizeof *t->text_offset);
    t->text_len = malloc(V * sizeof *t->text_len);
    if (!t->text_blob || !t->text_offset || !t->text_len)
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for the vocabulary", source);
    size_t at = 0;
    for (size_t i = 0; i < V; i++) {
        size_t n = piece_text(t, (int)i, t->text_blob + at);
        t->text_offset[i] = at;
        t->text_len[i] = (int32_t)n;
        at += n;
    }
    return VKS_OK;
}

typedef struct {
    int32_t len, id;
} special_key;

/* Longest piece first, then lowest id. */
static int cmp_special(const void *pa, const void *pb) {
    const special_key *a = pa, *b = pb;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return (a->id > b->id) - (a->id < b->id);
}

static bool is_special_type(uint8_t ty) {
    return ty == VKS_TOKEN_TYPE_CONTROL || ty == VKS_TOKEN_TYPE_USER_DEFINED || ty == VKS_TOKEN_TYPE_UNKNOWN;
}

static int collect_specials(vks_tokenizer *t, const char *source) {
    int n = 0;
    for (int i = 0; i < t->vocab_size; i++) n += t->len[i] > 0 && is_special_type(t->type[i]);
    if (n == 0) return VKS_OK;
    special_key *keys = malloc((size_t)n * sizeof *keys);
    t->specials = malloc((size_t)n * sizeof *t->specials);
    if (!keys || !t->specials) {
        free(keys);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", source);
    }
    int k = 0;
    for (int i = 0; i < t->vocab_size; i++)
        if (t->len[i] > 0 && is_special_type(t->type[i])) keys[k++] = (special_key){t->len[i], i};
    qsort(keys, (size_t)n, sizeof *keys, cmp_special);
    for (int i = 0; i < n; i++) t->specials[i] = keys[i].id;
    t->n_specials = n;
    free(keys);
    return VKS_OK;
}

static void find_byte_tokens(vks_tokenizer *t) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        size_t n;
        if (t->kind == TOK_KIND_SPM) {
            static const char hex[] = "0123456789ABCDEF";
            memcpy(s, "<0x", 3);
            s[3] = hex[b >> 4];
            s[4] = hex[b & 15];
            s[5] = '>';
            n = 6;
        } else {
            uint32_t cp = vks_tok_byte_to_cp((unsigned char)b);
            if (cp < 0x80) {
                s[0] = (char)cp;
                n = 1;
            } else {
                s[0] = (char)(0xC0 | (cp >> 6));
                s[1] = (char)(0x80 | (cp & 0x3F));
                n = 2;
            }
        }
        t->byte_token[b] = vks_tok_lookup(t, s, n);
    }
}

/* Returns 1 when the pair is new, 0 when an earlier merge already has it. */
static int merge_insert(vks_tokenizer *t, int32_t left, int32_t right, int32_t rank, int32_t result) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t mask = t->merge_cap - 1;
    uint64_t h = key;
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    h *= 0xc4ceb9fe1a85ec53ULL;
    h ^= h >> 33;
    for (size_t i = (size_t)h & mask;; i = (i + 1) & mask) {
        tok_merge_slot *s = &t->merges[i];
        if (s->key == key) return 0; /* first occurrence keeps its rank */
        if (s->key == UINT64_MAX) {
            *s = (tok_merge_slot){key, rank, result};
            return 1;
        }
    }
}

/* Merges "left right" (split at the first space after the first byte, as
 * llama.cpp does); entries whose halves or result are not pieces are skipped. */
static int build_merges(vks_tokenizer *t, const tok_vocab_spec *s) {
    size_t cap = 16;
    while (cap < 2 * s->n_merges + 16) cap *= 2;
    t->merges = malloc(cap * sizeof *t->merges);
    char *joined = malloc((size_t)2 * TOK_MAX_PIECE + 1);
    if (!t->merges || !joined) {
        free(joined);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory for %zu merges", s->source, s->n_merges);
    }
    memset(t->merges, 0xFF, cap * sizeof *t->merges);
    t->merge_cap = cap;
    for (size_t r = 0; r < s->n_merges; r++) {
        const char *m = s->merges[r];
        size_t n = s->merge_lens[r];
        if (n > 2 * (size_t)TOK_MAX_PIECE) continue;
        const char *sp = n > 1 ? memchr(m + 1, ' ', n - 1) : NULL;
        if (!sp) continue;
        size_t ll = (size_t)(sp - m), rl = n - ll - 1;
        int32_t left = vks_tok_lookup(t, m, ll), right = vks_tok_lookup(t, sp + 1, rl);
        memcpy(joined, m, ll);
        memcpy(joined + ll, sp + 1, rl);
        int32_t result = vks_tok_lookup(t, joined, ll + rl);
        if (left >= 0 && right >= 0 && result >= 0) t->n_merges += merge_insert(t, left, right, (int32_t)r, result);
    }
    free(joined);
    return VKS_OK;
}

static char *dup_or_null(const char *s) {
    if (!s) return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d) memcpy(d, s, n);
    return d;
}

static int setup_bpe(vks_tokenizer *t, const tok_vocab_spec *s) {
    bool ignore = false;
    const char *pattern = s->pre_pattern ? s->pre_pattern : vks_tok_pretok_pattern(s->pre_name, &ignore);
    if (!pattern)
        return vks_set_error(VKS_ERR_FORMAT, "%s: unsupported pre-tokenizer '%s' (known: gpt-2, llama-bpe, llama3, "
                             "qwen2)", s->source, s->pre_name);
    if (s->pre_pattern) ignore = s->ignore_merges;
    t->ignore_merges = ignore;
    t->pre_pattern = dup_or_null(pattern);
    if (!t->pre_pattern) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", s->source);
    int rc = vks_tok_pretok_create(pattern, s->source, &t->pre);
    if (rc == VKS_OK) rc = build_merges(t, s);
    return rc;
}

int vks_tok_build(const tok_vocab_spec *s, vks_tokenizer **out) {
    *out = NULL;
    int rc = check_spec(s);
    if (rc != VKS_OK) return rc;
    vks_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", s->source);
    t->kind = s->kind;
    t->vocab_size = s->n;
    t->space_id = -1;
    t->bos = s->bos;
    t->eos = s->eos;
    t->unk = s->unk;
    t->pad = s->pad;
    t->add_bos = s->add_bos;
    t->add_eos = s->add_eos;
    t->add_space_prefix = s->add_space_prefix;
    rc = copy_pieces(t, s);
    if (rc == VKS_OK) rc = build_texts(t, s->source);
    if (rc == VKS_OK) rc = collect_specials(t, s->source);
    if (rc == VKS_OK) find_byte_tokens(t);
    if (rc == VKS_OK && t->kind == TOK_KIND_BPE) rc = setup_bpe(t, s);
    if (rc == VKS_OK) {
        t->pre_name = dup_or_null(s->pre_name);
        t->chat_template = dup_or_null(s->chat_template);
        t->chat_template_file = s->chat_template ? dup_or_null(s->chat_template_file ? s->chat_template_file : s->source) : NULL;
        if ((s->pre_name && !t->pre_name) || (s->chat_template && (!t->chat_template || !t->chat_template_file)))
            rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", s->source);
    }
    if (rc != VKS_OK) {
        vks_tokenizer_free(t);
        return rc;
    }
    *out = t;
    return VKS_OK;
}
