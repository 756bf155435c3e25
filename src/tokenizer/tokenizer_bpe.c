/* tokenizer_bpe.c: byte-level BPE (GPT-2, Llama 3, Qwen2) as llama.cpp's
 * llm_tokenizer_bpe and Hugging Face tokenizers run it.
 *
 * The pre-tokenizer cuts the text into words. Each byte of a word becomes
 * its GPT-2 code point (printable bytes stay, the rest move to U+0100..), so
 * a word is a row of one-byte symbols. Neighbours merge by the rank of the
 * pair in the merge list (earliest first, leftmost on ties); a merge applies
 * only when both halves and the result are pieces. With ignore_merges (Llama
 * 3) a word that is itself a piece is taken whole. A final symbol that is not
 * a piece (only possible with a vocabulary lacking base bytes) becomes unk;
 * without an unk token it is an error naming the byte (llama.cpp drops it
 * silently, which loses text).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* GPT-2 bytes_to_unicode(): '!'..'~', U+00A1..U+00AC and U+00AE..U+00FF map
 * to themselves; the other 68 bytes, in order, to U+0100, U+0101, ... */
static bool byte_maps_to_itself(unsigned b) {
    return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
}

uint32_t vks_tok_byte_to_cp(unsigned char b) {
    if (byte_maps_to_itself(b)) return b;
    uint32_t n = 0;
    for (unsigned i = 0; i < b; i++) n += !byte_maps_to_itself(i);
    return 256 + n;
}

int vks_tok_cp_to_byte(uint32_t cp) {
    if (cp < 256) return byte_maps_to_itself(cp) ? (int)cp : -1;
    uint32_t n = 0;
    for (unsigned b = 0; b < 256; b++) {
        if (byte_maps_to_itself(b)) continue;
        if (256 + n == cp) return (int)b;
        n++;
    }
    return -1;
}

static uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

bool vks_tok_merge_find(const vks_tokenizer *t, int32_t left, int32_t right, int32_t *rank, int32_t *result) {
    if (!t->merges || left < 0 || right < 0) return false;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    size_t mask = t->merge_cap - 1;
    for (size_t i = (size_t)mix64(key) & mask;; i = (i + 1) & mask) {
        const tok_merge_slot *s = &t->merges[i];
        if (s->key == UINT64_MAX) return false;
        if (s->key == key) {
            *rank = s->rank;
            *result = s->result;
            return true;
        }
    }
}

static bool bpe_pair(const vks_tokenizer *t, void *ctx, const tok_sym *a, const tok_sym *b, double *priority,
                     int32_t *id) {
    (void)ctx; /* merges are by id */
    int32_t rank;
    if (!vks_tok_merge_find(t, a->id, b->id, &rank, id)) return false;
    *priority = (double)rank;
    return true;
}

/* The word's bytes as GPT-2 code points in UTF-8 (1 or 2 bytes each). */
static char *map_bytes(const char *w, size_t n, size_t *out_len) {
    char *m = malloc(2 * n + 1);
    if (!m) return NULL;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t cp = vks_tok_byte_to_cp((unsigned char)w[i]);
        if (cp < 0x80) {
            m[at++] = (char)cp;
        } else {
            m[at++] = (char)(0xC0 | (cp >> 6));
            m[at++] = (char)(0x80 | (cp & 0x3F));
        }
    }
    *out_len = at;
    return m;
}

static int encode_word(const vks_tokenizer *t, const char *w, size_t n, tok_sym *syms, tok_ids *out) {
    if (t->ignore_merges) {
        size_t ml = 0;
        char *mapped = map_bytes(w, n, &ml);
        if (!mapped) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
        int32_t id = vks_tok_lookup(t, mapped, ml);
        free(mapped);
        if (id >= 0) return vks_tok_ids_push(out, id);
    }
    for (size_t i = 0; i < n; i++) syms[i] = (tok_sym){(int32_t)i, 1, t->byte_token[(unsigned char)w[i]]};
    size_t count = n;
    int rc = vks_tok_merge(t, NULL, syms, &count, bpe_pair);
    for (size_t i = 0; rc == VKS_OK && i < count; i++) {
        int32_t id = syms[i].id >= 0 ? syms[i].id : t->unk;
        rc = id >= 0 ? vks_tok_ids_push(out, id) : vks_tok_missing_byte_error((unsigned char)w[syms[i].start]);
    }
    return rc;
}

/* Without merges (and without whole-word lookups) every byte is its own
 * token whatever the word splits are: the pre-tokenizer can be skipped. */
static int encode_bytes(const vks_tokenizer *t, const char *text, size_t len, tok_ids *out) {
    int rc = VKS_OK;
    for (size_t i = 0; rc == VKS_OK && i < len; i++) {
        int32_t id = t->byte_token[(unsigned char)text[i]];
        if (id < 0) id = t->unk;
        rc = id >= 0 ? vks_tok_ids_push(out, id) : vks_tok_missing_byte_error((unsigned char)text[i]);
    }
    return rc;
}

int vks_tok_bpe_encode_fragment(const vks_tokenizer *t, const char *text, size_t len, tok_ids *out) {
    if (len == 0) return VKS_OK;
    if (len > (size_t)INT32_MAX / 4) return vks_set_error(VKS_ERR_ARG, "tokenize: text of %zu bytes is too long", len);
    if (t->n_merges == 0 && !t->ignore_merges) return encode_bytes(t, text, len, out);
    tok_span *words = NULL;
    size_t n_words = 0;
    int rc = vks_tok_pretok_split(t->pre, text, len, &words, &n_words);
    if (rc != VKS_OK) return rc;
    tok_sym *syms = malloc(len * sizeof *syms);
    if (!syms) rc = vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    for (size_t i = 0; rc == VKS_OK && i < n_words; i++)
        rc = encode_word(t, text + words[i].start, words[i].len, syms, out);
    free(syms);
    free(words);
    return rc;
}
