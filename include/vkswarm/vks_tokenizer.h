/* vks_tokenizer.h: llama2.c tokenizer (SentencePiece-style BPE with scores and
 * byte fallback) with exactly run.c's encode/decode semantics. */
#ifndef VKS_TOKENIZER_H
#define VKS_TOKENIZER_H
#include "vks_common.h"

typedef struct vks_tokenizer vks_tokenizer;

/* vocab_size comes from the model header (the file does not store it). */
int vks_tokenizer_load_llama2c(const char *path, int vocab_size, vks_tokenizer **out);
void vks_tokenizer_free(vks_tokenizer *t);
int vks_tokenizer_vocab_size(const vks_tokenizer *t);
int vks_tokenizer_bos(const vks_tokenizer *t); /* 1 */
int vks_tokenizer_eos(const vks_tokenizer *t); /* 2 */
/* Encodes text (len bytes, any bytes) into ids. *n_out receives the count;
 * ids must hold at least len + 3 entries. */
int vks_tokenizer_encode(const vks_tokenizer *t, const char *text, size_t len, bool bos,
                         bool eos, int32_t *ids, int *n_out);
/* Decodes `next` given the previous token, as run.c decode(): after BOS a
 * leading space is stripped, "<0xXX>" becomes the byte. Returns a pointer to
 * piece bytes (len in *len) valid until the tokenizer is freed or the next call
 * with the same buf. buf must hold >= 2 bytes. Out-of-range ids give len 0. */
const char *vks_tokenizer_decode(const vks_tokenizer *t, int prev, int next, char *buf, size_t *len);
/* run.c safe_printf rule: true if the piece should be printed. */
bool vks_tokenizer_piece_printable(const char *piece, size_t len);
#endif
