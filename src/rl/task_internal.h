/* task_internal.h: the bounded JSONL line reader shared by task_file.c and
 * task_run.c, and the check of a user task's reference answer. */
#ifndef VKS_TASK_INTERNAL_H
#define VKS_TASK_INTERNAL_H
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "vkswarm/vks_tasks.h"

/* Reads one line (without LF; a final CR dropped) of at most max bytes into
 * buf[max + 1]; a longer line is flagged at byte max + 1, where the read
 * stops (the rest unread). False at EOF. */
bool vks_task_read_line(FILE *f, char *buf, size_t max, size_t *len, bool *too_long);
bool vks_task_blank(const char *s, size_t n);
/* False when no completion could match the reference answer of t: a numeric
 * answer that is no decimal number (nan, inf, 1e999), a list answer with an
 * item that is none. */
bool vks_task_answer_matchable(int verify, const char *answer);

struct json_t;
/* A code task's tests from its JSON line (task_code.c): t->code allocated. */
int vks_task_code_from_json(struct json_t *root, vks_task *t);
/* A reward program task's command, info and options from its JSON line (task_program.c); dir: the
 * task file's directory (absolute). */
int vks_task_program_from_json(struct json_t *root, vks_task *t, const char *dir);
/* The reward program tasks of tasks[0..n) scored, one request at a time per program. */
int vks_task_score_programs(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                            double *rewards, char (*why)[VKS_TASK_MAX_WHY], vks_task_metrics *sink);
/* Text as valid UTF-8 (a completion may end inside a character): invalid bytes and NUL become U+FFFD (malloc'd). */
char *vks_task_valid_utf8(const char *s, size_t len);
/* {"prompt", "answer" (null when empty), "info"}: what a program is told of task t (a new reference). */
struct json_t *vks_task_request_json(const vks_task *t);
/* Asks t's program (t->program->commands[0], started on first use and kept; what: "environment" etc. for
 * errors) one request line and has check() read its answer line; see task_program.c's ask for restarts. */
int vks_task_program_ask(const vks_task *t, const char *what, const char *line, bool retry,
                         int (*check)(const char *command, const char *reply, void *ctx), void *ctx);
/* The last line of c[0..len) starting (after spaces and tabs) with prefix (any case): the offset of the
 * text after the prefix, and *end that of the line's end (its newline, or len); -1 when there is none. */
long vks_task_last_line(const char *c, size_t len, const char *prefix, size_t *end);
/* Evaluates an arithmetic expression (integers below 2^31, + - * /, parentheses; at most 64 tokens, nesting 32)
 * exactly: false when it is none, divides by zero or overflows. */
bool vks_task_eval_expr(const char *expr, int64_t *num, int64_t *den);
/* The built-in code task's polynomial in x from numbers[] (highest power first: "2*x*x+5*x+7"). */
void vks_task_code_expr(const vks_task *t, char *buf, size_t cap);
/* vks_task_score with a reason (why: NULL, or cap bytes); code tasks score 0 here. */
double vks_task_score_why(const vks_task *t, const char *completion, size_t len, char *why, size_t cap);

/* ---- multi-turn episodes (episode.c), for eval and tasks filter (task_run.c) and RL (rl_rollouts.c) ---- */
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_prompt.h"
typedef struct {
    vks_env_episode ep;
    int32_t *ids;      /* the conversation's tokens so far (vks_env_start_text's "how an episode reaches the model") */
    float *logp;       /* per token of ids: the sampler's log-probability of the assistant's (with record_logp), 0 */
    uint8_t *trained;  /* per token of ids: 1 the assistant's (trained on), 0 the start's and the environment's */
    int n_ids, n_start; /* tokens; the start's (the prompt) */
    int generated;     /* the assistant's tokens, stop tokens included */
    bool over;         /* the environment said done, or the episode was cut */
    char *partial;     /* a cut turn's text (never stepped, its tokens kept), or NULL */
} vks_episode;
void vks_episode_free(vks_episode *x);
/* Episode of task t with environment seed `seed`: reset, its start as a prompt (think: a thinking budget's
 * sentence, raw format only) within vocab and a context of `context` positions. */
int vks_episode_start(const vks_prompt_format *f, const struct vks_tokenizer *tok, int vocab, int context,
                      const vks_task *t, uint64_t seed, int think, vks_episode *x);
/* What a caller does around each turn of vks_episodes_run (any may be NULL). */
typedef struct {
    void *ctx;
    /* before the turn's vks_generate of k episodes (turn: 0, 1, ...): may set go->on_hidden and go->user */
    int (*before)(void *ctx, int turn, vks_generate_options *go, int k);
    /* after it: seqs[0..k) generated, seqs[i] of episode which[i] with sampler index index[i]; not yet stepped */
    int (*generated)(void *ctx, int turn, const vks_sequence *seqs, const uint32_t *index, const int *which, int k);
    /* after every turn was stepped and its reply appended */
    void (*stepped)(void *ctx, int turn, vks_episode *xs, int count);
} vks_episode_hooks;
/* Turns every episode of xs[0..count) (started; episode b of tasks[b] with sampler sequence index seq_index[b])
 * until each is over: within max_new tokens after its start (replies included) and go->sched.steps positions. */
int vks_episodes_run(vks_engine *e, const vks_generate_options *go, const vks_prompt_format *f,
                     const struct vks_tokenizer *tok, const vks_task *const *tasks, const uint32_t *seq_index,
                     int count, int max_new, const vks_episode_hooks *hooks, vks_episode *xs);
/* After one generated turn s (new tokens after s->n_prompt, stopped by s->stop_token or not) of episode x of task
 * t: stepped through the environment and the reply appended, or the episode cut (the token budget or the context
 * spent, no stop, max_turns reached without done). A cut turn's tokens are kept (trained on, as a completion cut
 * at max_new_tokens is), its text in x->partial. s->logp may be NULL (0 recorded). What a verifier replays. */
int vks_episode_take_turn(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_task *t, int max_new,
                          int context, vks_episode *x, const vks_sequence *s);
/* The same for a recorded turn: its n tokens after the conversation x (a final EOS: the turn's stop token). */
int vks_episode_replay_turn(const vks_prompt_format *f, const struct vks_tokenizer *tok, const vks_task *t, int max_new,
                            int context, vks_episode *x, const int32_t *turn, int n);
/* How episode `seed` of task t starts, as the model gets it (its environment reset, the start's tokens
 * decoded with control tokens shown, BOS left out): what rl and eval show as their first prompt. */
int vks_episode_start_text(const vks_prompt_format *f, const struct vks_tokenizer *tok, int vocab, int context,
                           const vks_task *t, uint64_t seed, int think, char **text, size_t *len);
/* The conversation after the start as text (what eval --show prints): each message's content and "\n"
 * (a cut turn's text last). */
int vks_episode_text(const vks_episode *x, char **out, size_t *len);
#endif
