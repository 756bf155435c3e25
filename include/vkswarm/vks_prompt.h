/* vks_prompt.h: how a task's prompt is given to the model (src/rl/prompt.c):
 * the one rendering that RL generation, the trainer's and verifiers' prompt
 * checks, `eval --task` and `tasks filter` share, so a run is evaluated
 * exactly as it was trained.
 *
 * The task text is the task's prompt, then (with a thinking budget of T
 * tokens) the think sentence: think_template with {n} = T, after a space
 * unless the prompt ends in whitespace. The user message is user_template
 * with every {prompt} replaced by that text. Then:
 *  - chat_template "none": BOS + the user message, as it is (no special
 *    tokens parsed; BOS whatever the vocabulary says: the old behaviour);
 *  - "model" (the tokenizer's own tokenizer.chat_template) or a name
 *    (vks_chat_format: chatml, qwen3, llama2, llama3, llama3.1, phi3): the
 *    system message when given, the user message and the assistant prompt,
 *    tokenized with special tokens parsed and BOS only when the vocabulary
 *    asks for it (the templates print BOS first; vks_chat_format leaves it to
 *    the tokenizer, so it is never doubled). think = false is Qwen3's
 *    enable_thinking=false (the prompt ends with an empty think block). */
#ifndef VKS_PROMPT_H
#define VKS_PROMPT_H
#include "vks_common.h"

struct vks_tokenizer;

#define VKS_PROMPT_MAX_NAME 16    /* bytes of chat_template, NUL included */
#define VKS_PROMPT_MAX_TEXT 2048  /* bytes of system, user_template, think_template, NUL included */
#define VKS_PROMPT_DEFAULT_THINK "Think for {n} tokens.\n"

typedef struct {
    char chat_template[VKS_PROMPT_MAX_NAME]; /* "none" (default), "model" or a template name */
    char system[VKS_PROMPT_MAX_TEXT];        /* "": no system message */
    char user_template[VKS_PROMPT_MAX_TEXT]; /* holds {prompt}; default "{prompt}" */
    char think_template[VKS_PROMPT_MAX_TEXT];/* holds {n}; default VKS_PROMPT_DEFAULT_THINK */
    bool no_think;                           /* config "think": false; qwen3 (or "model" naming it) only */
} vks_prompt_format;

/* The defaults: BOS + the task text, as before prompt formats. */
void vks_prompt_format_default(vks_prompt_format *f);
/* Sets one key (chat_template, system, user_template, think_template, think:
 * true/false/1/0) from text. The value alone is checked (its length, a known
 * name, the placeholder); one-line errors call the key `name` (NULL:
 * "prompt.KEY"). vks_prompt_check checks the keys together. */
int vks_prompt_set(vks_prompt_format *f, const char *key, const char *value, const char *name);
/* The keys together: a system message or think = false need a chat template,
 * think = false one that has the switch (qwen3, or "model" if it is qwen3's). */
int vks_prompt_check(const vks_prompt_format *f);
/* Multi-turn episodes (vks_tasks.h environments) in a chat template (not
 * "none": its rendering lives with the episodes, vks_env_start_text). The
 * start: its messages (role, content; f's system message first when the
 * start has none) and the assistant prompt, tokenized as a prompt is. A
 * reply: conv[0..n) is the conversation so far, the turn just sampled the
 * last assistant message, the environment's messages after it; the reply's
 * tokens are what the template prints after that turn's text, less the stop
 * token that ended the turn (its tokens are the sampler's), up to and with
 * the next assistant prompt. A template that prints something else after an
 * assistant turn than its stop token (whitespace aside) is refused by name. */
int vks_prompt_episode_start(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *const *roles,
                             const char *const *contents, int n, int32_t **ids, int *n_ids);
int vks_prompt_episode_reply(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *const *roles,
                             const char *const *contents, int n, int32_t stop_token, int32_t **ids, int *n_ids);
/* vks_prompt_check, and that tok can render f ("model" needs its chat
 * template, think = false a Qwen3 one): what a command checks before it
 * opens devices. */
int vks_prompt_check_tokenizer(const vks_prompt_format *f, const struct vks_tokenizer *tok);
/* Whether f is the default (BOS + the raw text). */
bool vks_prompt_is_raw(const vks_prompt_format *f);

/* The text of a task's prompt (no BOS; *out malloc'd, NUL-terminated, *len
 * bytes). think_tokens > 0 adds the think sentence. model_template is the
 * tokenizer's chat template (for "model"; may be NULL otherwise). */
int vks_prompt_text(const vks_prompt_format *f, const char *model_template, const char *task_prompt, int think_tokens,
                    char **out, size_t *len);
/* The prompt's token ids (*ids malloc'd, *n entries): the text above,
 * tokenized as the header says. */
int vks_prompt_tokenize(const vks_prompt_format *f, const struct vks_tokenizer *tok, const char *task_prompt,
                        int think_tokens, int32_t **ids, int *n);
#endif
