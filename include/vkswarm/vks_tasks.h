/* vks_tasks.h: verifiable tasks for RL (src/rl/tasks*.c): built-in generators
 * keyed by (seed, index), verifiers that score a completion's final answer in
 * [0, 1], user tasks from JSONL, the thinking-budget reward, SFT warm-up data,
 * and scoring a model on tasks by generating completions (eval, filter). */
#ifndef VKS_TASKS_H
#define VKS_TASKS_H
#include "vks_common.h"
#include "vks_engine.h"
#include "vks_gpu.h"
#include "vks_model.h"
#include "vks_prompt.h"

struct vks_tokenizer;

#define VKS_TASK_MAX_PROMPT 4096  /* bytes of a prompt (user tasks included) */
#define VKS_TASK_MAX_ANSWER 256   /* bytes of a reference answer and of an extracted answer */
#define VKS_TASK_MAX_NUMBERS 8    /* countdown: given numbers */
#define VKS_TASK_MAX_LINE (64 * 1024)   /* a user task JSONL line */
#define VKS_TASK_MAX_TASKS 1000000      /* user tasks in one file */
#define VKS_TASK_LENGTH_LAMBDA 3e-4     /* thinking budget: reward per token off the target */
#define VKS_TASK_MAX_KIND 32            /* bytes of a task's kind (per-kind accuracy) */
#define VKS_TASK_MAX_KINDS 256          /* distinct kinds one evaluation reports */
#define VKS_TASK_MAX_PASS 12            /* pass@k values one evaluation reports */

/* How a completion is checked. */
typedef enum {
    VKS_VERIFY_EXACT,     /* the answer equals the reference (spaces trimmed and collapsed) */
    VKS_VERIFY_NUMERIC,   /* the same decimal number (sign, leading zeros, "1,000", "2.50" = "2.5") */
    VKS_VERIFY_LIST,      /* the same integers in the same order ("1 2 3", "1, 2, 3", "[1,2,3]") */
    VKS_VERIFY_COUNTDOWN, /* an expression of the given numbers (each at most once) equal to the target */
    VKS_VERIFY_CODE,      /* the completion's last fenced code block passes the task's tests (vks_code_tests) */
    VKS_VERIFY_PROGRAM,   /* a reward program of the user's says (vks_task_program) */
    VKS_VERIFY_ENVIRONMENT, /* a multi-turn environment says at the episode's end (vks_env_episode): a program of
                             * the user's (program set), or the built-in calculator (program NULL) */
} vks_verify_kind;

#define VKS_TASK_MAX_CASES 256      /* stdin/stdout cases of a code task */
#define VKS_TASK_MAX_WHY 256        /* bytes of a score's reason (vks_task_score_many) */

/* A code task's tests ("task_type": "code"): the program (the completion's
 * last fenced code block) runs with python3 in a sandbox (vks_sandbox.h), once
 * per case with its input on standard input, its output compared line by line
 * (trailing spaces and blank lines at the end ignored); or once with
 * test_code appended, passing when it exits with status 0. */
typedef struct {
    int n_cases;             /* 0 when test_code is set */
    const char **input, **output;
    const char *test_code;   /* Python assertions, or NULL */
    double time_limit_s;     /* CPU seconds per run ("time_limit_s", default 4; wall clock: 3 times that, plus 5) */
    int memory_mb;           /* address space per run ("memory_mb", default 512) */
    bool fraction;           /* "reward": "fraction": the share of cases passed; default all or nothing */
} vks_code_tests;

/* A reward program's task ("task_type": "program"): the command (run by
 * /usr/bin/sh -c in the task file's directory, sandboxed unless "sandbox":
 * false) is started once per process and kept running; for each completion
 * it reads one line {"prompt", "completion", "answer", "info"} and answers
 * one line {"reward": R in [0, 1], "metrics": {...}}. A rubric ("rubric":
 * [{"program": C, "weight": W}, ...] instead of "program") asks each of its
 * programs; the reward is sum_i w_i r_i with the weights divided by their
 * sum (so it stays in [0, 1], and is 1 only when every program says 1). */
#define VKS_TASK_MAX_COMMAND 1024   /* bytes of a reward program's command */
#define VKS_TASK_PROGRAM_RESTARTS 2 /* a failing program is started again this many times, then scoring fails */
#define VKS_TASK_MAX_RUBRIC 8       /* programs of a rubric */
typedef struct {
    int n;                   /* programs: 1 ("program"), or the rubric's */
    const char *commands[VKS_TASK_MAX_RUBRIC];
    double weights[VKS_TASK_MAX_RUBRIC]; /* each > 0, summing to 1 (as given, divided by their sum) */
    const char *dir;         /* the task file's directory (absolute) */
    const char *info_json;   /* the line's "info" as compact JSON ("null" when absent) */
    bool sandboxed;          /* "sandbox" (default true) */
    double timeout_s;        /* per answer ("timeout_s", default 10, at most 600) */
    int max_turns;           /* environments: assistant turns at most ("max_turns", default 4, at most
                              * VKS_ENV_MAX_TURNS); 0 for reward programs */
} vks_task_program;

/* The built-in generators. */
typedef enum {
    VKS_TASK_ADD, VKS_TASK_MUL, VKS_TASK_COUNTDOWN, VKS_TASK_SORT, VKS_TASK_REVERSE, VKS_TASK_CODE, VKS_TASK_CALC
} vks_task_kind;

typedef struct {
    vks_task_kind kind;
    int size; /* add/mul: digits per operand (1-9); countdown: given numbers (2-6); sort/reverse: list length (2-16);
               * code: the degree of the polynomial f(x) to write in Python (1-3); calc: the operands (2-4) */
    bool short_prompt; /* ":short": a terse prompt ("39+39=", "sort 5 2 9", "make 24 from 3 8 1") for small
                        * models (fewer tokens per sample); same instances, same answers */
} vks_task_spec;

typedef struct {
    char prompt[VKS_TASK_MAX_PROMPT + 64]; /* the task's text (the prompt format adds the rest: vks_prompt.h) */
    char answer[VKS_TASK_MAX_ANSWER]; /* the reference (countdown: one solution expression) */
    vks_verify_kind verify;
    int n_numbers;                          /* countdown only */
    int64_t numbers[VKS_TASK_MAX_NUMBERS];  /* countdown only */
    int64_t target;                         /* countdown only */
    int64_t line;                           /* user tasks: the JSONL line; generated: the index */
    char kind[VKS_TASK_MAX_KIND];           /* what eval reports accuracy per: a file's "kind" (default its
                                             * "task_type"); generated: the spec's name ("add:2") */
    vks_task_program *program;              /* reward program tasks: owned as code is */
    vks_code_tests *code;                   /* code tasks of a file: their tests, owned by the array
                                             * vks_task_file_load returned (free it with vks_task_free); NULL
                                             * otherwise (the built-in code task's tests come from numbers[]) */
} vks_task;

/* "add", "mul", "countdown", "sort", "reverse", "code", optionally ":N" for the size
 * (defaults: add 3, mul 2, countdown 4, sort 5, reverse 5, code 1), then optionally
 * ":short" for the terse prompt style ("add:2:short", "sort:short"). */
int vks_task_parse(const char *name, vks_task_spec *out);
/* The canonical "NAME:N[:short]" of a spec (at least 32 bytes). */
void vks_task_spec_name(const vks_task_spec *s, char *buf, size_t cap);
/* What a --task argument names: a task file when it is "file:PATH", holds a
 * '/', ends in ".jsonl", or is an existing file that is not a built-in name
 * (*path then points at the path inside name); otherwise a built-in task
 * (*spec filled, *path NULL). Unknown names fail with one line listing both forms. */
int vks_task_resolve(const char *name, vks_task_spec *spec, const char **path);
/* Instance `index` of a task: a pure function of (spec, seed, index) on every machine. */
int vks_task_generate(const vks_task_spec *s, uint64_t seed, uint32_t index, vks_task *out);
/* A short worked completion ending in the answer line (SFT warm-up). */
int vks_task_worked_completion(const vks_task *t, char *buf, size_t cap);

/* The final answer of a completion: whichever comes last of the last line
 * starting (after spaces) with "answer:" (any case; the rest of that line) and
 * the last \boxed{...} (balanced braces). Trimmed. False when there is none or
 * it is longer than VKS_TASK_MAX_ANSWER - 1 bytes. */
bool vks_task_extract_answer(const char *completion, size_t len, char *answer, size_t cap);
/* The task reward of a completion, 0 or 1 (no partial credit: a missing,
 * malformed or wrong answer scores 0). */
double vks_task_score(const vks_task *t, const char *completion, size_t len);
/* Scores n completions (texts[i], lens[i] bytes, of *tasks[i]) as
 * vks_task_score does, and says why in why[i] when why is not NULL ("answer
 * '12', expected '13'", "case 2 of 3: expected '4', got '5'", "timed out"...).
 * Code tasks run their tests in sandboxes, `parallel` at once (0: the online
 * cores); the sandbox is checked first (an error saying why it cannot be set
 * up). Errors only for what stops scoring itself, never for a completion. */
int vks_task_score_many(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                        int parallel, double *rewards, char (*why)[VKS_TASK_MAX_WHY]);

/* The metrics reward programs answer ({"reward": R, "metrics": {NAME: V}}),
 * summed per NAME for the run's metrics.jsonl: numbers, and true/false as 1/0
 * (other values, and names outside [A-Za-z0-9_.-] or longer than
 * VKS_TASK_METRIC_NAME - 1 bytes, are left out); the first
 * VKS_TASK_MAX_METRICS names only. Thread-safe. */
#define VKS_TASK_MAX_METRICS 32
#define VKS_TASK_METRIC_NAME 48
typedef struct vks_task_metrics vks_task_metrics;
int vks_task_metrics_create(vks_task_metrics **out);
void vks_task_metrics_free(vks_task_metrics *m);
/* Adds one answer's metrics object (compact JSON text). */
void vks_task_metrics_add(vks_task_metrics *m, const char *json);
/* The mean of each name over the answers that gave it since the last take
 * (at most cap; names[i] NUL-terminated), and starts over. Returns how many. */
int vks_task_metrics_take(vks_task_metrics *m, char (*names)[VKS_TASK_METRIC_NAME], double *means, int cap);
/* A program task's programs and options ("program" or "rubric", "sandbox",
 * "timeout_s") from a JSON object's text, as a task line has them, run in
 * directory dir: one allocation (free()). The RL config's "reward". */
int vks_task_program_parse(const char *json, const char *dir, vks_task_program **out);
/* vks_task_score_many that also adds reward programs' metrics to `sink` (NULL: none). */
int vks_task_score_many_into(const vks_task *const *tasks, const char *const *texts, const size_t *lens, int64_t n,
                             int parallel, double *rewards, char (*why)[VKS_TASK_MAX_WHY], vks_task_metrics *sink);
/* Multi-turn environments ("task_type": "environment", and the built-in
 * calculator: "task_type": "calc" lines, the `calc` task). An environment
 * program runs as a reward program does (/usr/bin/sh -c in the task file's
 * directory, sandboxed unless "sandbox": false, started once per process and
 * kept) and speaks JSON lines; every request names its episode (a string:
 * several may be open at once) and gets one answer line:
 *   {"type": "reset", "episode": E, "seed": S, "task": {"prompt", "answer", "info"}}
 *     -> {"messages": [{"role": R, "content": str}, ...]}      the conversation's start (1 or more)
 *   {"type": "step", "episode": E, "completion": str}           one assistant turn
 *     -> {"messages": [...], "done": bool, "reward": R, "metrics": {...}}
 * R (roles) is system, user or tool; a step's messages are appended after the
 * turn (none is fine); "reward" (0 to 1) is required when done, "metrics"
 * optional. An episode ends when the environment says done; one still going
 * after max_turns turns (or cut by the caller's token budget) scores 0 and
 * nothing more is sent for it. Environments must be deterministic for a
 * (task, seed): a verifier replays an episode with its recorded assistant
 * turns and compares every message and the reward. The built-in calculator
 * answers a turn with an "answer:" line (done: the numeric check), or else
 * with its last "calc: EXPR" line (integers, + - * / and parentheses: a tool
 * message "= VALUE", or "error: ..."), or else ends it (reward 0). */
#define VKS_ENV_MAX_TURNS 32           /* assistant turns of an episode */
#define VKS_ENV_MAX_MESSAGES 16        /* messages in one answer */
#define VKS_ENV_MAX_CONTENT (64 * 1024) /* bytes of one message */
#define VKS_ENV_MAX_ROLE 16            /* bytes of a role, NUL included */
#define VKS_ENV_DEFAULT_TURNS 4        /* max_turns when a line does not say (the calculator's too) */
typedef struct {
    char role[VKS_ENV_MAX_ROLE]; /* system, user, tool; assistant: a turn of the model's */
    char *content;               /* malloc'd, NUL-terminated (valid UTF-8 from a program) */
    size_t len;
} vks_env_message;
typedef struct {
    char id[32];            /* the episode's name in requests (unique in this process) */
    int n;                  /* messages: the start, then each turn followed by what the environment answered */
    vks_env_message *m;
    int capacity;           /* of m */
    int turns;              /* assistant turns so far */
    bool done;              /* the environment said so (reward is its); false: still going, or cut */
    double reward;
    char metrics[1024];     /* the last answer's "metrics" as compact JSON, or "" */
    char note[160];         /* the built-in calculator's reason for its reward ("answer '12', expected '13'"), or "" */
} vks_env_episode;
/* Starts an episode of t (an environment task) with seed: ep (zeroed here) holds the start messages. */
int vks_env_reset(const vks_task *t, uint64_t seed, vks_env_episode *ep);
/* Appends one assistant turn (completion, len bytes) and the environment's answer; refused after done
 * or at max_turns. An error for what the environment did wrong (named with the task line). */
int vks_env_step(const vks_task *t, vks_env_episode *ep, const char *completion, size_t len);
void vks_env_episode_free(vks_env_episode *ep);
/* The episode again from its seed and recorded turns (what `tasks score` and a verifier do): reset, then
 * each turn stepped. *reward 0 with a reason in why unless the environment said done after exactly the
 * last turn ("ended after turn 1 of 3", "not done after 2 turns"). A program that fails (crashes, hangs,
 * answers out of protocol) fails the replay naming it and the task line; it is started again for the next
 * episode, at most VKS_TASK_PROGRAM_RESTARTS times per process (a reset is retried as a reward program's
 * request is; a step is not: the episode died with it). ep may be NULL. */
int vks_env_replay(const vks_task *t, uint64_t seed, const char *const *turns, const size_t *lens, int n_turns,
                   double *reward, char *why, size_t cap, vks_env_episode *ep);
/* How an episode reaches the model (the raw prompt format, chat_template "none"; chat templates are not yet
 * supported for episodes): the start's messages' contents joined by "\n" are the task text of the prompt (one
 * message: its content as it is, as a task's prompt), given as any prompt is (vks_prompt_tokenize: BOS, the
 * user template, the think sentence); then each assistant turn's tokens and the stop token that ended it
 * (EOS), followed by the environment's messages, each as its content and "\n", as inputs (never trained on).
 * These give the two texts (malloc'd, NUL-terminated): the start (messages [0, ep->n) up to the first
 * assistant turn) and the reply of messages [from, to) (none of them the assistant's). */
int vks_env_start_text(const vks_env_episode *ep, char **out, size_t *len);
int vks_env_reply_text(const vks_env_episode *ep, int from, int to, char **out, size_t *len);
/* The built-in calculator's worked episode of t (SFT warm-up): one call of the whole expression ("calc: EXPR",
 * "= VALUE"), then "answer: VALUE"; checked to score 1. */
int vks_env_worked_episode(const vks_task *t, vks_env_episode *ep);
/* The assistant turns an episode of t may take: its line's max_turns (the calculator's: VKS_ENV_DEFAULT_TURNS). */
int vks_env_max_turns(const vks_task *t);
/* The first environment task of tasks[0..n), or NULL. */
const vks_task *vks_task_first_environment(const vks_task *tasks, int64_t n);
/* VKS_OK, or (where tasks[0..n) hold an environment task, or spec is the built-in calc) an error naming it:
 * episodes are replayed (`tasks score`, vks_env_replay) and generated by eval, tasks filter (vks_task_run) and
 * an rl run on one process, but not by rl across ranks yet.
 * Either argument may be NULL. */
int vks_task_refuse_environments(const vks_task_spec *spec, const vks_task *tasks, int64_t n);

/* Scoring a completions file without a model (`vkswarm tasks score`): lines
 * {"task": LINE, "completion": str, "id": any JSON value (optional)}, LINE a
 * line number of the task file; for an environment task "turns": [str, ...]
 * (the assistant's turns; "completion" is one turn) and "seed" (default 0),
 * the episode replayed (vks_env_replay). The whole file is checked before anything is
 * scored (the first bad line fails with "FILE: line N: ..."); then each
 * completion, in order, goes to on_scored (a non-zero return stops the run
 * and is returned). */
#define VKS_TASK_MAX_COMPLETION (1 << 20) /* bytes of a completions-file line */
#define VKS_TASK_MAX_ID 256                /* bytes of an "id" written as JSON */
typedef struct {
    int64_t line;                /* its line in the completions file */
    int64_t task_line;           /* the task's line in the task file */
    char id_json[VKS_TASK_MAX_ID]; /* its "id" as compact JSON ("" when absent) */
    double reward;
    char why[VKS_TASK_MAX_WHY];
    const vks_env_episode *episode; /* environment tasks: the replayed episode (valid during the call); else NULL */
} vks_task_scored;
int vks_task_score_file(const char *tasks_path, const char *completions_path, int parallel,
                        int (*on_scored)(void *ctx, const vks_task_scored *s), void *ctx);
/* The last fenced code block of a completion (``` lines; a language tag after
 * the opening fence is allowed): *start and *len into text. False when there
 * is no complete one. */
bool vks_task_code_block(const char *text, size_t len, size_t *start, size_t *block_len);
/* Countdown check alone: expr uses integers, + - * /, parentheses (exact
 * rational arithmetic, at most 64 tokens, nesting 32, operands below 2^31);
 * each literal must be one of numbers[], each at most once. Optionally "EXPR = TARGET". */
bool vks_task_countdown_ok(const char *expr, const int64_t *numbers, int n_numbers, int64_t target);

/* Thinking budget: r_task - lambda * |target_tokens - completion_tokens|. The
 * prompt states the target in the think sentence (vks_prompt.h). */
double vks_task_length_reward(double r_task, int target_tokens, int completion_tokens, double lambda);

/* User tasks: JSONL lines {"prompt": str, "answer": str|number, "task_type": T, ...}
 * with T one of exact, numeric, list, boxed (= exact), countdown (then
 * "numbers": [ints] and "target": int, "answer" optional), code (then "tests":
 * [{"input": str, "output": str}, ...] or "test_code": str, optionally
 * "time_limit_s", "memory_mb", "reward": "all"|"fraction"; no "answer"),
 * program (then "program": str; "answer" and "info" optional, passed on;
 * optionally "sandbox": bool, "timeout_s"), or a
 * built-in name (add/mul = numeric, sort/reverse = list); optionally "kind":
 * str (at most 31 bytes; eval's per-kind accuracy, default T). Other keys are
 * ignored. The first malformed line fails the load with "FILE: line N: ...".
 * Free the array with vks_task_free. */
int vks_task_file_load(const char *path, vks_task **tasks, int64_t *n);
/* Frees an array of tasks and the code tests and programs they own (NULL is fine). */
void vks_task_free(vks_task *tasks, int64_t n);
/* Stops every reward program this process started (they are started on first use and kept). */
void vks_task_programs_stop(void);
/* The first code task (file or built-in) of tasks[0..n), or NULL. */
const vks_task *vks_task_first_code(const vks_task *tasks, int64_t n);
/* Holds out round(fraction * n) tasks (at least 1, at most n - 1; fraction in
 * (0, 1)): those whose line numbers hash (Philox, a fixed key) lowest, so the
 * split depends only on the file. *held gets them (allocated, in file order);
 * tasks[0 .. *n) keeps the rest, in order. */
int vks_task_split(vks_task *tasks, int64_t *n, double fraction, vks_task **held, int64_t *n_held);
/* Copies the lines of in_path that tasks[0..n) came from (in file order) to
 * out_path as they were (atomically). */
int vks_task_file_copy(const char *in_path, const vks_task *tasks, int64_t n, const char *out_path);
/* Writes n instances (seed, indices 0..n-1) as {"prompt","completion"} JSONL (atomically). */
int vks_task_write_sft(const vks_task_spec *s, uint64_t seed, int64_t n, const char *path);

/* Scoring a model by generation. */
typedef struct {
    int samples;           /* completions per task (>= 1) */
    float temperature;     /* 0: greedy */
    uint64_t seed;         /* the sampler's */
    int max_new_tokens;    /* per completion (0: 256); the context bounds it too */
    int batch;             /* sequences per generation batch (0: 64) */
    vks_engine_options engine; /* weight types etc.; sizes and f32_math are set here */
    const vks_lora_adapter *lora; /* a LoRA adapter on the model (vks_engine_set_lora), or NULL */
    const vks_prompt_format *prompt; /* how prompts are given (NULL: the default, BOS + the text); checked */
    int think_tokens;      /* > 0: every prompt carries the think sentence for this budget (as an RL run's with
                            * that length target); 0: none */
    void (*progress)(void *ctx, int64_t done, int64_t total);
    void *progress_ctx;
    /* when set: called once (with progress_ctx) with the first task's prompt text as rendered, before generating */
    void (*show_prompt)(void *ctx, const char *text, size_t len);
    /* when set: called with completion_ctx for every completion once it is scored, in order (completion c is
     * sample c % samples of task c / samples): its text as scored (special tokens left out), tokens and reward */
    void (*on_completion)(void *ctx, const vks_task *task, int64_t completion, const char *text, size_t len,
                          int tokens, double reward);
    void *completion_ctx;
    vks_task_metrics *metrics; /* NULL, or where the "metrics" of reward programs and of environments (at an
                                * episode's end) are added */
} vks_task_run_options;

/* Generates samples completions (the prompt in o->prompt's format, stop at EOS, at most max_new_tokens) for each task and
 * scores them: rewards[i * samples + j] and lengths (completion tokens). */
int vks_task_run(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks, int64_t n,
                 const vks_task_run_options *o, double *rewards, int *lengths);

/* pass@k of one task from n completions of which c are correct: the unbiased
 * estimator 1 - C(n-c, k) / C(n, k) (1 when n - c < k; NaN unless 0 <= c <= n, 1 <= k <= n). */
double vks_task_pass_at_k(int n, int c, int k);

typedef struct {
    char kind[VKS_TASK_MAX_KIND];
    int64_t n;                  /* tasks of this kind */
    double accuracy;            /* their correct completions / completions */
} vks_task_kind_result;

typedef struct {
    int64_t n;                  /* tasks */
    int samples;                /* completions per task */
    int64_t solved;             /* tasks with at least one correct completion */
    double accuracy;            /* correct completions / completions (= pass@1) */
    double mean_length;         /* completion tokens */
    int n_pass;                 /* pass_at[i] is pass@pass_k[i], averaged over tasks: k = 1, 2, 4, ... below samples, and samples */
    int pass_k[VKS_TASK_MAX_PASS];
    double pass_at[VKS_TASK_MAX_PASS];
    int n_kinds;                /* per kind (vks_task.kind), in order of first appearance */
    vks_task_kind_result kinds[VKS_TASK_MAX_KINDS];
    int n_metrics;              /* what reward programs and environments answered ("metrics"): each name's mean
                                 * over the answers that gave it (vks_task_metrics_take), for
                                 * vks_task_eval_tasks and vks_task_eval; 0 for vks_task_eval_score */
    char metric_names[VKS_TASK_MAX_METRICS][VKS_TASK_METRIC_NAME];
    double metric_means[VKS_TASK_MAX_METRICS];
} vks_task_eval_result;
/* tasks[0..n), o->samples completions each. More than VKS_TASK_MAX_KINDS
 * kinds are refused before anything is generated. */
int vks_task_eval_tasks(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks,
                        int64_t n, const vks_task_run_options *o, vks_task_eval_result *r);
/* The result from rewards[i * samples + j] and lengths of tasks[0..n) (what
 * vks_task_eval_tasks reports once it has them). */
int vks_task_eval_score(const vks_task *tasks, int64_t n, int samples, const double *rewards, const int *lengths,
                        vks_task_eval_result *r);
/* n fresh instances of spec from seed, o->samples completions each. */
int vks_task_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task_spec *spec,
                  uint64_t seed, int64_t n, const vks_task_run_options *o, vks_task_eval_result *r);

/* The offline difficulty filter. A task whose solve rate (mean reward over
 * its samples) lies below min_rate is hard, above max_rate easy, else kept. */
typedef struct {
    int64_t total, hard, kept, easy;
} vks_task_filter_counts;
/* rewards[i * samples + j] -> rates[i], keep[i] and the counts. */
void vks_task_filter_classify(const double *rewards, int64_t n, int samples, double min_rate, double max_rate,
                              double *rates, bool *keep, vks_task_filter_counts *counts);
/* Copies the lines of tasks_path that are kept to out_path (as they were) and,
 * when rates_path is not NULL, writes one JSON line per task to it:
 * {"line": N, "kind": K, "solved": C, "samples": S, "solve_rate": R, "verdict": "hard"|"kept"|"easy"}
 * (both atomically). */
int vks_task_filter(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *tasks_path,
                    const char *out_path, const char *rates_path, double min_rate, double max_rate,
                    const vks_task_run_options *o, vks_task_filter_counts *counts);
#endif
