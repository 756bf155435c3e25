/* Prompts in, JSON lines out: shared by `generate` and `pipeline`, which
 * print exactly the same thing for the same prompts and seed. */
#ifndef VKS_CLI_PROMPTS_H
#define VKS_CLI_PROMPTS_H
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_prompt.h"
#include "vkswarm/vks_tokenizer.h"

/* One prompt per line (a last line without '\n' counts), or for a path ending
 * in .jsonl one {"prompt": "..."} object per line (blank lines skipped);
 * exits 2 on bad input. */
char **cli_read_prompts(const char *path, int *n_out);
/* encode(prompt, bos) into s->ids / s->n_prompt; without a tokenizer the
 * prompt is token ids (whitespace-separated, each in [0, vocab)) after BOS. */
void cli_encode_prompt(const vks_tokenizer *t, int vocab, const char *text, vks_sequence *s, int bos);
/* generate's and pipeline's chat flags (CLI_CHAT_LONG_OPTIONS): they need
 * the model's tokenizer (a usage error of cmd otherwise), then
 * cli_check_prompt. Nothing to check without them. */
void cli_check_chat_flags(const char *cmd, const vks_prompt_format *f, const vks_tokenizer *t);
/* Prompt `index` (0-based) of cmd as ids into s: BOS + the text without chat
 * flags (cli_encode_prompt), else in the chat format (vks_prompt_tokenize:
 * what rl and eval feed; the first prompt is shown on stderr). Exit 2 naming
 * the prompt when it cannot be encoded or a token is outside the vocabulary. */
void cli_encode_formatted_prompt(const char *cmd, const vks_prompt_format *f, const vks_tokenizer *t, int vocab,
                                 const char *text, int index, vks_sequence *s);
/* What llama2.c's run.c prints for a sequence: decode(prev, next) for each pair. */
char *cli_sequence_text(const vks_tokenizer *t, const vks_sequence *s, size_t *len_out);
/* {"prompt", "ids", "text"} on one line of stdout. */
/* Tokens generated after the prompts (0 for a sequence whose -n ends inside its prompt). */
long cli_generated_tokens(const vks_sequence *seqs, int n);
void cli_print_json(const char *prompt, const vks_sequence *s, const char *text, size_t len);

/* Sampling options shared by generate and pipeline: -n, --temp, --top-p, --top-k, --seed. */
typedef struct {
    int steps;
    float temperature, top_p;
    uint32_t top_k;
    uint64_t seed;
    bool seed_given;
} cli_sampling;
#define CLI_SAMPLING_LONG_OPTIONS                                                          \
    {"temp", required_argument, 0, 0}, {"top-p", required_argument, 0, 0},                \
        {"top-k", required_argument, 0, 0}, {"seed", required_argument, 0, 0}
/* llama2.c's defaults: -n 256 --temp 1.0 --top-p 0.9. */
void cli_sampling_defaults(cli_sampling *s);
/* Handles a long option by name, or -n (name "n"); false if not one of them. */
bool cli_sampling_option(cli_sampling *s, const char *name, const char *val);
/* Picks the seed from the clock when none was given and prints it on stderr. */
void cli_sampling_finish(cli_sampling *s);
/* The schedule's parameters: -n clamped to the context (0 = the context), and
 * the stop tokens: BOS (llama2.c stories end with it, as run.c stops on it) and
 * the tokenizer's EOS. */
vks_sched_params cli_sched_params(const cli_sampling *s, const vks_model *m, const vks_tokenizer *t);
#endif
