/* tokenizer_common.c: what every tokenizer kind shares: the sorted piece
 * index and its lookup, release, accessors, and the error for a byte the
 * vocabulary cannot encode. */
#include "tokenizer_internal.h"

#include <stdlib.h>
#include <string.h>

static int cmp_piece_bytes(const char *a, size_t alen, const char *b, size_t blen) {
    size_t n = alen < blen ? alen : blen;
    int c = memcmp(a, b, n);
    if (c != 0) return c;
    return (alen > blen) - (alen < blen);
}

static int cmp_sorted(const void *pa, const void *pb) {
    const sorted_piece *a = pa, *b = pb;
    int c = cmp_piece_bytes(a->bytes, (size_t)a->len, b->bytes, (size_t)b->len);
    return c != 0 ? c : (a->id > b->id) - (a->id < b->id);
}

int32_t vks_tok_lookup(const vks_tokenizer *t, const char *bytes, size_t n) {
    size_t lo = 0, hi = (size_t)t->vocab_size;
    while (lo < hi) { /* lower bound */
        size_t mid = lo + (hi - lo) / 2;
        const sorted_piece *p = &t->sorted[mid];
        if (cmp_piece_bytes(p->bytes, (size_t)p->len, bytes, n) < 0) lo = mid + 1;
        else hi = mid;
    }
    if (lo < (size_t)t->vocab_size &&
        cmp_piece_bytes(t->sorted[lo].bytes, (size_t)t->sorted[lo].len, bytes, n) == 0)
        return t->sorted[lo].id;
    return -1;
}

void vks_tok_sort_index(vks_tokenizer *t) {
    qsort(t->sorted, (size_t)t->vocab_size, sizeof *t->sorted, cmp_sorted);
}

void vks_tokenizer_free(vks_tokenizer *t) {
    if (!t) return;
    free(t->blob);
    free(t->offset);
    free(t->len);
    free(t->score);
    free(t->sorted);
    free(t->type);
    free(t->text_blob);
    free(t->text_offset);
    free(t->text_len);
    free(t->specials);
    free(t->merges);
    vks_tok_pretok_free(t->pre);
    free(t->pre_name);
    free(t->pre_pattern);
    free(t->chat_template);
    free(t->chat_template_file);
    free(t);
}

int vks_tokenizer_vocab_size(const vks_tokenizer *t) { return t ? t->vocab_size : 0; }
int vks_tokenizer_bos(const vks_tokenizer *t) { return t ? t->bos : -1; }
int vks_tokenizer_eos(const vks_tokenizer *t) { return t ? t->eos : -1; }
int vks_tokenizer_pad(const vks_tokenizer *t) { return t ? t->pad : -1; }

int vks_tok_missing_byte_error(unsigned char b) {
    if (b > ' ' && b < 0x7f)
        return vks_set_error(VKS_ERR_FORMAT, "tokenize: the vocabulary cannot encode byte 0x%02X ('%c'): "
                             "no piece, byte token or unknown token for it", b, b);
    return vks_set_error(VKS_ERR_FORMAT, "tokenize: the vocabulary cannot encode byte 0x%02X: "
                         "no piece, byte token or unknown token for it", b);
}

