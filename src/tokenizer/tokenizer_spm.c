/* tokenizer_spm.c: SentencePiece BPE as llama.cpp's llm_tokenizer_spm runs it
 * on a GGUF "llama" vocabulary.
 *
 * The text (with a dummy-prefix space when asked) has every ' ' replaced by
 * U+2581. It is cut into UTF-8 characters: a lead byte claims 1-4 bytes as
 * in llama.cpp, but only continuation bytes are taken (llama.cpp takes any
 * bytes, so for invalid UTF-8 it can swallow the next character, U+2581
 * included, and detokenize no longer gives the text back; for valid UTF-8
 * both are the same). Neighbours whose concatenation is a
 * piece merge, highest score first, leftmost on ties. Each final symbol is
 * its piece, or else one "<0xXX>" byte token per byte (unk if the vocabulary
 * has no such byte token; an error naming the byte when it has no unk either).
 * Deviation from llama.cpp, only visible with crafted text: CONTROL, UNKNOWN
 * and BYTE pieces are never merge results (SentencePiece never produces them
 * from text; llama.cpp would turn "<s>" typed text into BOS).
 */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static const char SPACE_ESC[3] = {(char)0xE2, (char)0x96, (char)0x81}; /* U+2581 */

/* Id of a piece text may become: not CONTROL, UNKNOWN or BYTE. */
static int32_t text_piece(const vks_tokenizer *t, const char *s, size_t n) {
    int32_t id = vks_tok_lookup(t, s, n);
    if (id < 0) return -1;
    uint8_t ty = t->type[id];
    return ty == VKS_TOKEN_TYPE_CONTROL || ty == VKS_TOKEN_TYPE_UNKNOWN || ty == VKS_TOKEN_TYPE_BYTE ? -1 : id;
}

static bool spm_pair(const vks_tokenizer *t, void *ctx, const tok_sym *a, const tok_sym *b, double *priority,
                     int32_t *id) {
    const char *text = ctx;
    int32_t m = text_piece(t, text + a->start, (size_t)a->len + (size_t)b->len);
    if (m < 0) return false;
    *priority = -(double)t->score[m];
    *id = m;
    return true;
}

static size_t utf8_len(unsigned char lead) {
    static const unsigned char by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
    return by_high_nibble[lead >> 4];
}

/* The escaped text: optional prefix space, every ' ' as U+2581. */
static char *escape_spaces(const char *text, size_t len, bool prefix_space, size_t *out_len) {
    size_t spaces = prefix_space ? 1 : 0;
    for (size_t i = 0; i < len; i++) spaces += text[i] == ' ';
    size_t total; /* len + 2 * spaces + prefix */
    if (!vks_mul_size(spaces, 3, &total) || !vks_add_size(total, len, &total)) return NULL;
    char *esc = malloc(total + 1);
    if (!esc) return NULL;
    size_t at = 0;
    if (prefix_space) {
        memcpy(esc, SPACE_ESC, 3);
        at = 3;
    }
    for (size_t i = 0; i < len; i++) {
        if (text[i] == ' ') {
            memcpy(esc + at, SPACE_ESC, 3);
            at += 3;
        } else {
            esc[at++] = text[i];
        }
    }
    *out_len = at;
    return esc;
}

static int emit_symbol(const vks_tokenizer *t, const char *esc, const tok_sym *s, tok_ids *out) {
    int32_t id = s->id >= 0 ? s->id : text_piece(t, esc + s->start, (size_t)s->len);
    if (id >= 0) return vks_tok_ids_push(out, id);
    for (int32_t i = 0; i < s->len; i++) {
        unsigned char byte = (unsigned char)esc[s->start + i];
        int32_t b = t->byte_token[byte] >= 0 ? t->byte_token[byte] : t->unk;
        int rc = b >= 0 ? vks_tok_ids_push(out, b) : vks_tok_missing_byte_error(byte);
        if (rc != VKS_OK) return rc;
    }
    return VKS_OK;
}

int vks_tok_spm_encode_fragment(const vks_tokenizer *t, const char *text, size_t len, bool prefix_space,
                            tok_ids *out) {
    size_t n_esc = 0;
    char *esc = escape_spaces(text, len, prefix_space, &n_esc);
    if (!esc) return vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory for %zu bytes of text", len);
    if (n_esc > (size_t)INT32_MAX) {
        free(esc);
        return vks_set_error(VKS_ERR_ARG, "tokenize: text of %zu bytes is too long", len);
    }
    tok_sym *syms = malloc((n_esc ? n_esc : 1) * sizeof *syms);
    int rc = syms ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "tokenize: out of memory");
    size_t n = 0;
    for (size_t at = 0; rc == VKS_OK && at < n_esc;) {
        size_t cl = 1, claim = utf8_len((unsigned char)esc[at]);
        while (cl < claim && at + cl < n_esc && ((unsigned char)esc[at + cl] & 0xC0) == 0x80) cl++;
        syms[n++] = (tok_sym){(int32_t)at, (int32_t)cl, -1};
        at += cl;
    }
    if (rc == VKS_OK) rc = vks_tok_merge(t, esc, syms, &n, spm_pair);
    for (size_t i = 0; rc == VKS_OK && i < n; i++) rc = emit_symbol(t, esc, &syms[i], out);
    free(syms);
    free(esc);
    return rc;
}
