/* tokenizer_bytes.c: the byte-level vocabulary of the built-in tiny model:
 * one token per byte (id = byte value) plus <|bos|>, <|eos|>, <|pad|>, built
 * as a GPT-2 style byte-level BPE with no merges. The pieces are GPT-2's
 * byte-to-unicode spelling of each byte, so the files every BPE vocabulary
 * goes through (GGUF "gpt2", tokenizer.json) carry it unchanged, and with no
 * merges the encoder maps each byte to its own token (tokenizer_bpe.c). */
#include <string.h>

#include "tokenizer_internal.h"

static const char *const CONTROL_PIECES[3] = {"<|bos|>", "<|eos|>", "<|pad|>"};

/* The UTF-8 bytes of byte b's GPT-2 code point (1 or 2 bytes) into out. */
static size_t byte_piece(unsigned char b, char out[2]) {
    uint32_t cp = vks_tok_byte_to_cp(b);
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6)); /* every code point of the table is below U+0800 */
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int vks_tokenizer_byte_level(vks_tokenizer **out) {
    if (!out) return vks_set_error(VKS_ERR_ARG, "vks_tokenizer_byte_level: NULL argument");
    char spelled[256][2];
    const char *pieces[VKS_BYTE_VOCAB_SIZE];
    size_t lens[VKS_BYTE_VOCAB_SIZE];
    uint8_t types[VKS_BYTE_VOCAB_SIZE];
    for (int b = 0; b < 256; b++) {
        lens[b] = byte_piece((unsigned char)b, spelled[b]);
        pieces[b] = spelled[b];
        types[b] = VKS_TOKEN_TYPE_NORMAL; /* as GPT-2 GGUF files mark their byte tokens */
    }
    for (int k = 0; k < 3; k++) {
        pieces[256 + k] = CONTROL_PIECES[k];
        lens[256 + k] = strlen(CONTROL_PIECES[k]);
        types[256 + k] = VKS_TOKEN_TYPE_CONTROL;
    }
    tok_vocab_spec s = {.source = "byte-level vocabulary", .kind = TOK_KIND_BPE, .n = VKS_BYTE_VOCAB_SIZE,
                        .pieces = pieces, .lens = lens, .types = types, .n_merges = 0,
                        .bos = VKS_BYTE_VOCAB_BOS, .eos = VKS_BYTE_VOCAB_EOS, .unk = -1, .pad = VKS_BYTE_VOCAB_PAD,
                        .add_bos = true, .add_eos = false, .pre_name = "gpt-2"};
    return vks_tok_build(&s, out);
}
