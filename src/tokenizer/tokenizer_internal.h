/* tokenizer_internal.h: the tokenizer object shared by tokenizer*.c,
 * pretokenize.c and the loaders. Three kinds share one vocabulary store:
 *   LLAMA2C  tokenizer.bin, run.c semantics (tokenizer.c)
 *   SPM      SentencePiece BPE by scores with byte fallback, as llama.cpp's
 *            llm_tokenizer_spm (tokenizer_spm.c)
 *   BPE      byte-level BPE by merge rank (GPT-2, Llama 3, Qwen2) after a
 *            regex pre-tokenizer (tokenizer_bpe.c, pretokenize.c)
 */
#ifndef VKS_TOKENIZER_INTERNAL_H
#define VKS_TOKENIZER_INTERNAL_H
#include "vkswarm/vks_tokenizer.h"

#define TOK_MAX_PIECE (1 << 20)   /* sanity limit for piece lengths */
#define TOK_MAX_VOCAB (1 << 22)
#define TOK_MAX_MERGES (1 << 24)

typedef enum { TOK_KIND_LLAMA2C, TOK_KIND_SPM, TOK_KIND_BPE } tok_kind;

typedef struct {
    const char *bytes;
    int32_t len, id;
} sorted_piece;

typedef struct tok_pretok tok_pretok;

typedef struct {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX = empty slot */
    int32_t rank, result;
} tok_merge_slot;

struct vks_tokenizer {
    tok_kind kind;
    int vocab_size, max_token_length;
    char *blob;           /* every piece, NUL-terminated, back to back */
    size_t *offset;       /* piece i starts at blob + offset[i] */
    int32_t *len;
    float *score;
    sorted_piece *sorted; /* by (bytes, length, id) for binary search */
    int32_t space_id;     /* llama2c: id of " " or -1 */

    /* SPM and BPE only */
    uint8_t *type;        /* VKS_TOKEN_TYPE_* per id */
    char *text_blob;      /* decoded bytes of each piece (what detokenize prints) */
    size_t *text_offset;
    int32_t *text_len;
    int32_t bos, eos, unk, pad; /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix, ignore_merges;
    int32_t *specials;    /* CONTROL / USER_DEFINED / UNKNOWN ids, longest text first */
    int n_specials;
    int32_t byte_token[256]; /* SPM: "<0xXX>" id; BPE: id of the mapped byte; -1 if none */
    tok_merge_slot *merges;  /* BPE: open-addressing table, merge_cap slots */
    size_t merge_cap, n_merges; /* n_merges: entries in the table */
    tok_pretok *pre;
    char *pre_name;
    char *pre_pattern;       /* BPE: the regex the words are split with */
    char *chat_template;
    char *chat_template_file; /* where it was read (a .gguf or tokenizer_config.json) */
};

/* Id of the piece equal to bytes[0..n), lowest id among duplicates, or -1. */
int32_t vks_tok_lookup(const vks_tokenizer *t, const char *bytes, size_t n);
/* The byte a "<0xHH>" piece of n bytes stands for, or -1. */
int vks_tok_byte_piece(const char *p, size_t n);
/* Sorts t->sorted (filled by the caller) for vks_tok_lookup. */
void vks_tok_sort_index(vks_tokenizer *t);

/* A growable id list. */
typedef struct {
    int32_t *v;
    size_t n, cap;
} tok_ids;
int vks_tok_ids_push(tok_ids *ids, int32_t id);
/* VKS_ERR_ARG: text byte b has no token (no piece, byte token or unk). */
int vks_tok_missing_byte_error(unsigned char b);

/* ---- merge engine (tokenizer_merge.c) ----
 * Symbols are adjacent spans of one text (start, len) with their ids. `pair`
 * decides whether two neighbours merge: it returns true with a priority
 * (lower merges first; ties go to the leftmost pair) and the id of the merged
 * symbol. `ctx` is the caller's, passed to `pair` as it is (SPM: the text;
 * llama2.c: a scratch buffer). */
typedef struct {
    int32_t start, len, id;
} tok_sym;
typedef bool (*tok_pair_fn)(const vks_tokenizer *t, void *ctx, const tok_sym *a, const tok_sym *b, double *priority,
                            int32_t *id);
/* Merges syms[0..*n) in place (compacting them); VKS_ERR_NOMEM on failure. */
int vks_tok_merge(const vks_tokenizer *t, void *ctx, tok_sym *syms, size_t *n, tok_pair_fn pair);

/* ---- per kind ---- */
int vks_tok_spm_encode_fragment(const vks_tokenizer *t, const char *text, size_t len, bool prefix_space,
                            tok_ids *out);
int vks_tok_bpe_encode_fragment(const vks_tokenizer *t, const char *text, size_t len, tok_ids *out);
/* GPT-2's byte <-> code point table. */
uint32_t vks_tok_byte_to_cp(unsigned char b);
int vks_tok_cp_to_byte(uint32_t cp); /* -1 if cp is not in the table */
/* Merge table of a BPE tokenizer: rank and result of (left, right), or false. */
bool vks_tok_merge_find(const vks_tokenizer *t, int32_t left, int32_t right, int32_t *rank, int32_t *result);

/* ---- pre-tokenizer (pretokenize.c) ---- */
/* Regex of a GGUF tokenizer.ggml.pre name, or NULL when unknown. */
const char *vks_tok_pretok_pattern(const char *pre_name, bool *ignore_merges);
int vks_tok_pretok_create(const char *pattern, const char *source, tok_pretok **out);
void vks_tok_pretok_free(tok_pretok *p);
typedef struct {
    size_t start, len;
} tok_span;
/* Splits text into words (every byte in exactly one span, in order). Invalid
 * UTF-8 bytes take part in matching as U+FFFD but keep their own bytes. */
int vks_tok_pretok_split(const tok_pretok *p, const char *text, size_t len, tok_span **spans, size_t *n);

/* The tokenizer.ggml.pre name of a BPE tokenizer's split rules (its own
 * name, else the name of the known regex it uses), or NULL when none fits. */
const char *vks_tok_pretok_name(const vks_tokenizer *t);
/* The regex of GPT-2's pre-tokenizer (a ByteLevel pre-tokenizer with use_regex). */
const char *vks_tok_gpt2_pattern(void);

/* ---- building SPM / BPE tokenizers from a vocabulary (tokenizer_vocab.c) ---- */
typedef struct {
    const char *source;          /* file name for errors */
    tok_kind kind;               /* TOK_KIND_SPM or TOK_KIND_BPE */
    int n;                       /* vocabulary size */
    const char *const *pieces;   /* n pieces (GGUF/HF text: U+2581 or byte-mapped) */
    const size_t *lens;
    const float *scores;         /* NULL: all 0 */
    const uint8_t *types;        /* NULL: all normal */
    const char *const *merges;   /* BPE: "left right", n_merges of them */
    const size_t *merge_lens;
    size_t n_merges;
    int32_t bos, eos, unk, pad;  /* -1 when absent */
    bool add_bos, add_eos, add_space_prefix;
    const char *pre_name;        /* BPE: GGUF pre name, or NULL */
    const char *pre_pattern;     /* BPE: explicit regex (tokenizer.json), or NULL */
    bool ignore_merges;          /* with pre_pattern (else from pre_name) */
    const char *chat_template;   /* or NULL */
    const char *chat_template_file; /* where it was read (messages), or NULL */
} tok_vocab_spec;
int vks_tok_build(const tok_vocab_spec *s, vks_tokenizer **out);
#endif
