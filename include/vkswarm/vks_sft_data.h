/* vks_sft_data.h: supervised fine-tuning data (src/rl/sft_data.c): JSONL
 * lines tokenized into sequences with a loss mask, and a deterministic,
 * resumable batcher that packs them into micro-batches.
 *
 * Lines (hostile input: every line is checked, bounded and named):
 *   {"prompt": "...", "completion": "..."}  ->  BOS prompt completion EOS,
 *        loss on the completion's tokens and EOS;
 *   {"text": "..."}                         ->  BOS text EOS, loss on every
 *        token after BOS;
 *   {"prompt": "...", "turns": [{"role": R, "content": "..."}, ...]}  (a
 *        multi-turn episode, vks_tasks.h)  ->  BOS prompt, then each
 *        assistant turn and EOS (in the loss), the other messages (system,
 *        user, tool) between them each as its content and "\n", one run of
 *        them tokenized as one text (never in the loss); the last message
 *        is the assistant's.
 * Prompt and completion are tokenized separately (add_bos/add_eos off, no
 * special tokens parsed), so their boundary is a token boundary and the mask
 * is exact. Other keys are ignored; a line with both forms, a missing or
 * non-string field or bad JSON (invalid UTF-8 included) is malformed. A line
 * longer than max_line_bytes is an error in strict and lenient mode alike
 * (reading stops at the limit: its end is never looked for). Blank lines (only spaces, tabs, CR) are
 * skipped and not counted; a UTF-8 byte order mark at the start is skipped;
 * a CR before the LF is dropped. Messages name "<file>: line <n>: ...".
 *
 * A sequence is at most seq_len tokens (the model's context: BOS and EOS
 * included). A longer one is, by long_policy:
 *   VKS_SFT_LONG_REFUSE   (default) an error naming the line, the length and
 *                         the limit, in strict and lenient mode alike (the data
 *                         set does not fit the model);
 *   VKS_SFT_LONG_TRUNCATE cut to its first seq_len tokens (the end of the
 *                         completion and EOS are lost); a line that keeps no
 *                         loss token is skipped and counted as n_skipped_long;
 *   VKS_SFT_LONG_SKIP     skipped and counted as n_skipped_long. */
#ifndef VKS_SFT_DATA_H
#define VKS_SFT_DATA_H
#include "vks_common.h"
#include "vks_train_types.h"

struct vks_tokenizer;

#define VKS_SFT_MAX_LINE_BYTES ((size_t)1 << 20) /* default line limit: 1 MiB */
#define VKS_SFT_MAX_SEQUENCES ((int64_t)1 << 26) /* default limit on the number of sequences */

enum { VKS_SFT_LONG_REFUSE = 0, VKS_SFT_LONG_TRUNCATE = 1, VKS_SFT_LONG_SKIP = 2 };

typedef struct {
    int seq_len;           /* longest sequence, BOS and EOS included (the model's seq_len); >= 2 */
    int vocab_size;        /* every id must lie below it (the model's vocabulary); 0: the tokenizer's */
    int long_policy;       /* VKS_SFT_LONG_* */
    bool strict;           /* a malformed line is an error; else it is counted, skipped, and the first kept */
    size_t max_line_bytes; /* 0: VKS_SFT_MAX_LINE_BYTES */
    int64_t max_sequences; /* 0: VKS_SFT_MAX_SEQUENCES */
} vks_sft_options;

typedef struct {
    int64_t n_sequences, n_tokens, n_loss_tokens;
    int max_len;              /* longest sequence (tokens) */
    int64_t n_lines;          /* lines read, blank ones included */
    int64_t n_malformed;      /* skipped as malformed (lenient mode) */
    int64_t n_truncated;      /* cut to seq_len (VKS_SFT_LONG_TRUNCATE) */
    int64_t n_skipped_long;   /* dropped for their length */
    char first_error[320];    /* the first malformed line's message, "" when none */
} vks_sft_stats;

typedef struct vks_sft_data vks_sft_data;

/* Reads a JSONL file. An empty result (no usable line) is an error. */
int vks_sft_data_load(const char *path, const struct vks_tokenizer *tok, const vks_sft_options *o,
                      vks_sft_data **out);
/* Same from len bytes in memory; name stands for the file in messages. */
int vks_sft_data_parse(const char *text, size_t len, const char *name, const struct vks_tokenizer *tok,
                       const vks_sft_options *o, vks_sft_data **out);
void vks_sft_data_free(vks_sft_data *d);
void vks_sft_data_stats(const vks_sft_data *d, vks_sft_stats *s);
int64_t vks_sft_data_count(const vks_sft_data *d);
/* Sequence i: len tokens and a mask, mask[t] = 1 when token t is in the loss
 * (predicted from token t-1: never token 0, the BOS); *line is its line in the
 * file. Pointers stay valid until the data is freed. */
int vks_sft_data_sequence(const vks_sft_data *d, int64_t i, const int32_t **tokens, const uint8_t **mask,
                          int *len, int64_t *line);
/* Identity of the data as trained: BLAKE2b-256 over every sequence's length,
 * tokens and mask in order (a resume checks it). */
int vks_sft_data_hash(const vks_sft_data *d, uint8_t out[32]);

/* ---- the batcher ----
 * Epoch e visits every sequence once, in the order of a permutation drawn by
 * Fisher-Yates (swap i with j < i + 1 drawn from the 64 bits of
 * vks_philox_u32(seed, e, i, 0 and 1)) (file order when shuffle is off), and packs them greedily in that order: a
 * micro-batch takes the next sequences while they fit in max_tokens rows
 * (and max_seqs); it never spans two epochs, and a sequence is never split.
 * The generator is counter-based, so its whole state is (seed, epoch): the
 * position (vks_sft_position, vks_train_types.h) is everything a resume needs, and seeking to a saved
 * position yields exactly the micro-batches that followed it. */

typedef struct {
    int max_tokens; /* rows per micro-batch: at least the longest sequence */
    int max_seqs;   /* sequences per micro-batch; 0: no limit */
    uint64_t seed;
    bool shuffle;
} vks_sft_batcher_options;

/* A micro-batch of packed rows. Row r holds token tokens[r] at position pos[r]
 * of its sequence, which starts at row seq_start[r]: row r attends to rows
 * seq_start[r]..r. targets[r] is the next token of the same sequence (-1 on a
 * sequence's last row), and loss_mask[r] = 1 when that target is in the loss,
 * so loss = -sum_r loss_mask[r] * log p(targets[r] | rows seq_start[r]..r).
 * seq_lens/n_seqs describe the same packing as vks_ref_batch does. */
typedef struct {
    int n_tokens, n_seqs, n_loss_tokens;
    int32_t *tokens, *targets, *seq_start, *pos; /* [max_tokens] */
    uint8_t *loss_mask;                          /* [max_tokens] */
    int *seq_lens;                               /* [n_seqs] */
    int64_t *seq_index;                          /* the data set's index of each sequence */
    int64_t epoch;                               /* the epoch the sequences come from */
} vks_sft_batch;

typedef struct vks_sft_batcher vks_sft_batcher;

/* The data must outlive the batcher. Starts at epoch 0, index 0. */
int vks_sft_batcher_create(const vks_sft_data *d, const vks_sft_batcher_options *o, vks_sft_batcher **out);
void vks_sft_batcher_free(vks_sft_batcher *b);
/* The next micro-batch (owned by the batcher, valid until the next call). */
int vks_sft_batcher_next(vks_sft_batcher *b, const vks_sft_batch **out);
/* Where the next micro-batch starts. */
void vks_sft_batcher_position(const vks_sft_batcher *b, vks_sft_position *pos);
/* Continues from a saved position (its seed replaces the options' seed);
 * refuses one outside the data. */
int vks_sft_batcher_seek(vks_sft_batcher *b, const vks_sft_position *pos);
#endif
