/* vks_tokenizer.h: tokenizers exactly as the originals.
 *  - llama2.c tokenizer.bin: run.c's encode/decode semantics.
 *  - GGUF tokenizer.ggml.model "llama": SentencePiece BPE by scores with byte
 *    fallback (llama.cpp llm_tokenizer_spm: U+2581 for spaces, dummy prefix).
 *  - GGUF "gpt2" and Hugging Face tokenizer.json BPE: byte-level BPE by merge
 *    rank after the GPT-2 / Llama 3 / Qwen2 regex pre-tokenizer (PCRE2).
 * Plus chat templates (ChatML, Qwen3, Llama 2, Llama 3, Llama 3.1, Phi-3). */
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
/* Padding token id, or -1 when the vocabulary names none. */
int vks_tokenizer_pad(const vks_tokenizer *t);
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

/* ---- GGUF / tokenizer.json vocabularies ---- */
struct vks_gguf;

/* Token types as GGUF stores them (tokenizer.ggml.token_type). */
enum {
    VKS_TOKEN_TYPE_UNDEFINED = 0,
    VKS_TOKEN_TYPE_NORMAL = 1,
    VKS_TOKEN_TYPE_UNKNOWN = 2,
    VKS_TOKEN_TYPE_CONTROL = 3,
    VKS_TOKEN_TYPE_USER_DEFINED = 4,
    VKS_TOKEN_TYPE_UNUSED = 5,
    VKS_TOKEN_TYPE_BYTE = 6,
};

/* Loads the vocabulary of a GGUF file (vocab-only or a full model). */
int vks_tokenizer_load_gguf(const char *path, vks_tokenizer **out);
/* Same from an open GGUF (name is used in error messages). */
int vks_tokenizer_load_gguf_handle(const struct vks_gguf *g, const char *name, vks_tokenizer **out);
/* Loads a Hugging Face tokenizer.json (BPE model: vocab, merges, byte-level
 * pre-tokenizer, added tokens); reads tokenizer_config.json beside it when
 * present (bos/eos tokens, add_bos_token, chat_template). */
int vks_tokenizer_load_hf_json(const char *path, vks_tokenizer **out);
/* What a model offers its tokenizer loader (vks_tokenizer_load_auto in
 * vks_model.h fills it from a model). */
typedef struct {
    const struct vks_gguf *gguf; /* its open GGUF, or NULL */
    const char *dir;             /* its safetensors directory ("" or NULL: none) */
    const char *name;            /* its path, in errors */
    int vocab_size;
} vks_tokenizer_source;
/* From the tokenizer file when given (tokenizer.bin: needs m for the vocab
 * size; .gguf; tokenizer.json; or a directory holding tokenizer.json), else
 * from the model's own GGUF metadata or the tokenizer.json beside a
 * safetensors model. m may be NULL when a path is given. */
int vks_tokenizer_load_for(const char *tokenizer_path_or_null, const vks_tokenizer_source *m, vks_tokenizer **out);

typedef struct {
    bool add_bos, add_eos;
    bool parse_special; /* match CONTROL tokens in the text (USER_DEFINED always match) */
} vks_tokenize_options;

/* Encodes len bytes (any bytes) into *ids (malloc'd, *n entries). */
int vks_tokenizer_tokenize(const vks_tokenizer *t, const char *text, size_t len, const vks_tokenize_options *o,
                           int32_t **ids, int *n);
/* Decodes ids into *text (malloc'd, NUL-terminated, *len bytes). Control
 * tokens print their text only with show_special. SPM drops the dummy-prefix
 * space of the first piece, so detokenize(tokenize(s)) == s. Ids out of range
 * are an error. */
int vks_tokenizer_detokenize(const vks_tokenizer *t, const int32_t *ids, int n, bool show_special, char **text,
                             size_t *len);
/* "llama2c", "spm" or "bpe" */
const char *vks_tokenizer_kind(const vks_tokenizer *t);
/* Whether the vocabulary asks for BOS / EOS (tokenizer.ggml.add_bos_token ...). */
bool vks_tokenizer_wants_bos(const vks_tokenizer *t);
bool vks_tokenizer_wants_eos(const vks_tokenizer *t);
/* tokenizer.chat_template (Jinja text) or NULL. */
const char *vks_tokenizer_chat_template(const vks_tokenizer *t);
/* Where that template was read, for messages: the GGUF file (its
 * tokenizer.chat_template) or the tokenizer_config.json; NULL without one. */
const char *vks_tokenizer_chat_template_file(const vks_tokenizer *t);
/* Id of the token whose piece is exactly text[0..len), or -1. */
int vks_tokenizer_find(const vks_tokenizer *t, const char *text, size_t len);
/* Token type (VKS_TOKEN_TYPE_*); NORMAL for llama2c vocabularies. -1 if out of range. */
int vks_tokenizer_token_type(const vks_tokenizer *t, int id);

/* ---- the byte-level vocabulary (tokenizer_bytes.c) ----
 * The built-in tiny model's tokenizer: id b (0..255) is byte b, then three
 * control tokens. It is a GPT-2 style byte-level BPE (pieces in GPT-2's
 * byte-to-unicode spelling, "gpt-2" pre-tokenizer) with no merges, so every
 * byte of any text, invalid UTF-8 included, is exactly one token, and GGUF
 * ("gpt2" tokenizer.ggml.*) and tokenizer.json hold it as they hold any BPE.
 * BOS is added by default (tokenizer.ggml.add_bos_token), EOS is not. */
enum {
    VKS_BYTE_VOCAB_BOS = 256, /* "<|bos|>" */
    VKS_BYTE_VOCAB_EOS = 257, /* "<|eos|>" */
    VKS_BYTE_VOCAB_PAD = 258, /* "<|pad|>" */
    VKS_BYTE_VOCAB_SIZE = 259,
};
int vks_tokenizer_byte_level(vks_tokenizer **out);

/* ---- writing a tokenizer (tokenizer_save.c) ---- */
struct vks_gguf_writer;
/* Adds the tokenizer.ggml.* keys (and tokenizer.chat_template) of an SPM or
 * BPE tokenizer, as llama.cpp's converter writes them, so that
 * vks_tokenizer_load_gguf gives the same tokenizer back. A llama2.c
 * tokenizer.bin is embedded by the model writer instead (its tokenizer_path). */
int vks_tokenizer_save_gguf(const vks_tokenizer *t, struct vks_gguf_writer *w);
/* Writes a BPE tokenizer as a Hugging Face tokenizer.json (to tok, named
 * tok_name in errors) and tokenizer_config.json (to cfg): BPE model with
 * vocab and merges, ByteLevel pre-tokenizer (a Split regex before it unless
 * it is GPT-2's), control tokens as special added tokens, BOS/EOS/PAD/UNK,
 * add_bos_token/add_eos_token and the chat template in the config, so that
 * vks_tokenizer_load_hf_json gives the same tokenizer back. */
int vks_tokenizer_save_hf(const vks_tokenizer *t, FILE *tok, const char *tok_name, FILE *cfg, const char *cfg_name);

/* A model directory (a Hugging Face directory, a training checkpoint) holds
 * its tokenizer in the form of its kind: byte-level BPE as tokenizer.json +
 * tokenizer_config.json; SentencePiece (GGUF "llama") as tokenizer.gguf, a
 * GGUF file of tokenizer.ggml.* metadata and no tensors; llama2.c as its own
 * tokenizer.bin, byte for byte. vks_tokenizer_load_auto reads a directory's
 * tokenizer in this order, the first file present. */
#define VKS_TOKENIZER_JSON "tokenizer.json"
#define VKS_TOKENIZER_CONFIG_JSON "tokenizer_config.json"
#define VKS_TOKENIZER_GGUF "tokenizer.gguf"
#define VKS_TOKENIZER_BIN "tokenizer.bin"
/* The file names t is written to in a directory (names[0], and names[1] for
 * BPE's config); returns how many (1 or 2; 0 when t is NULL). */
int vks_tokenizer_dir_files(const vks_tokenizer *t, const char *names[2]);
/* Writes t to the open files f[i] named names[i] (as vks_tokenizer_dir_files
 * gives them), so that vks_tokenizer_load_auto on the directory gives the same
 * tokenizer back. */
int vks_tokenizer_save_dir_files(const vks_tokenizer *t, FILE *const f[2], const char *const names[2]);
/* A dry run of vks_tokenizer_save_dir_files (to /dev/null): what a job that
 * writes checkpoints checks before it starts, rather than at its first save. */
int vks_tokenizer_check_dir_files(const vks_tokenizer *t);

/* ---- chat templates (chat.c) ---- */
typedef struct {
    const char *role;    /* "system", "user", "assistant" */
    const char *content;
} vks_chat_message;

/* Formats a conversation. template_name_or_jinja: "chatml", "qwen3",
 * "llama2", "llama3", "llama3.1", "phi3", or a Jinja template
 * (tokenizer.chat_template) whose family is recognized from its markers
 * (chat.c lists each family's rules). A Jinja template is followed in its
 * default system message too (vks_chat_default_system): a conversation that
 * does not start with a system message gets it, as the template would print
 * it; a name alone has none. The text carries no BOS (the tokenizer adds it);
 * tokenize it with parse_special. *out is malloc'd. */
int vks_chat_format(const char *template_name_or_jinja, const vks_chat_message *msgs, int n,
                    bool add_assistant_prompt, char **out);
typedef struct {
    bool add_assistant_prompt;
    bool disable_thinking; /* qwen3: enable_thinking=false, the prompt ends with an empty <think> block */
} vks_chat_options;
int vks_chat_format_opts(const char *template_name_or_jinja, const vks_chat_message *msgs, int n,
                         const vks_chat_options *o, char **out);
/* Family name ("chatml", ...) of a name or Jinja text, or NULL. */
const char *vks_chat_template_family(const char *template_name_or_jinja);
/* The family names, for messages: "chatml, qwen3, llama2, llama3, llama3.1, phi3". */
const char *vks_chat_template_names(void);
/* The system message a Jinja template prints when the conversation has none
 * (Qwen2.5's "You are Qwen, created by Alibaba Cloud. You are a helpful
 * assistant."): in the chatml and qwen3 families, a string literal holding
 * "<|im_start|>system\n", text and "<|im_end|>" (the literal's escapes
 * decoded). *out is malloc'd, or NULL when the template has none (a name, or
 * a system turn only from the conversation's own message, as Qwen3's). */
int vks_chat_default_system(const char *template_name_or_jinja, char **out);
#endif
