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

struct vks_tokenizer;

#define VKS_TASK_MAX_PROMPT 4096  /* bytes of a prompt (user tasks included) */
#define VKS_TASK_MAX_ANSWER 256   /* bytes of a reference answer and of an extracted answer */
#define VKS_TASK_MAX_NUMBERS 8    /* countdown: given numbers */
#define VKS_TASK_MAX_LINE (64 * 1024)   /* a user task JSONL line */
#define VKS_TASK_MAX_TASKS 1000000      /* user tasks in one file */
#define VKS_TASK_LENGTH_LAMBDA 3e-4     /* thinking budget: reward per token off the target */

/* How a completion is checked. */
typedef enum {
    VKS_VERIFY_EXACT,     /* the answer equals the reference (spaces trimmed and collapsed) */
    VKS_VERIFY_NUMERIC,   /* the same decimal number (sign, leading zeros, "1,000", "2.50" = "2.5") */
    VKS_VERIFY_LIST,      /* the same integers in the same order ("1 2 3", "1, 2, 3", "[1,2,3]") */
    VKS_VERIFY_COUNTDOWN, /* an expression of the given numbers (each at most once) equal to the target */
} vks_verify_kind;

/* The built-in generators. */
typedef enum { VKS_TASK_ADD, VKS_TASK_MUL, VKS_TASK_COUNTDOWN, VKS_TASK_SORT, VKS_TASK_REVERSE } vks_task_kind;

typedef struct {
    vks_task_kind kind;
    int size; /* add/mul: digits per operand (1-9); countdown: given numbers (2-6); sort/reverse: list length (2-16) */
    bool short_prompt; /* ":short": a terse prompt ("39+39=", "sort 5 2 9", "make 24 from 3 8 1") for small
                        * models (fewer tokens per sample); same instances, same answers */
} vks_task_spec;

typedef struct {
    char prompt[VKS_TASK_MAX_PROMPT + 64]; /* room for vks_task_add_length_target's sentence */
    char answer[VKS_TASK_MAX_ANSWER]; /* the reference (countdown: one solution expression) */
    vks_verify_kind verify;
    int n_numbers;                          /* countdown only */
    int64_t numbers[VKS_TASK_MAX_NUMBERS];  /* countdown only */
    int64_t target;                         /* countdown only */
    int64_t line;                           /* user tasks: the JSONL line; generated: the index */
} vks_task;

/* "add", "mul", "countdown", "sort", "reverse", optionally ":N" for the size
 * (defaults: add 3, mul 2, countdown 4, sort 5, reverse 5), then optionally
 * ":short" for the terse prompt style ("add:2:short", "sort:short"). */
int vks_task_parse(const char *name, vks_task_spec *out);
/* The canonical "NAME:N[:short]" of a spec (at least 32 bytes). */
void vks_task_spec_name(const vks_task_spec *s, char *buf, size_t cap);
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
/* Countdown check alone: expr uses integers, + - * /, parentheses (exact
 * rational arithmetic, at most 64 tokens, nesting 32, operands below 2^31);
 * each literal must be one of numbers[], each at most once. Optionally "EXPR = TARGET". */
bool vks_task_countdown_ok(const char *expr, const int64_t *numbers, int n_numbers, int64_t target);

/* Thinking budget: r_task - lambda * |target_tokens - completion_tokens|. */
double vks_task_length_reward(double r_task, int target_tokens, int completion_tokens, double lambda);
/* Appends the sentence stating the target length T to the task's prompt. */
int vks_task_add_length_target(vks_task *t, int target_tokens);

/* User tasks: JSONL lines {"prompt": str, "answer": str|number, "task_type": T, ...}
 * with T one of exact, numeric, list, boxed (= exact), countdown (then
 * "numbers": [ints] and "target": int, "answer" optional), or a built-in name
 * (add/mul = numeric, sort/reverse = list). Other keys are ignored. The first
 * malformed line fails the load with "FILE: line N: ...". */
int vks_task_file_load(const char *path, vks_task **tasks, int64_t *n);
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
    void (*progress)(void *ctx, int64_t done, int64_t total);
    void *progress_ctx;
} vks_task_run_options;

/* Generates samples completions (BOS + prompt, stop at EOS) for each task and
 * scores them: rewards[i * samples + j] and lengths (completion tokens). */
int vks_task_run(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task *tasks, int64_t n,
                 const vks_task_run_options *o, double *rewards, int *lengths);

typedef struct {
    int64_t n, solved;
    double accuracy;            /* solved / n */
    double mean_length;         /* completion tokens */
} vks_task_eval_result;
/* n fresh instances of spec from seed, one completion each. */
int vks_task_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const vks_task_spec *spec,
                  uint64_t seed, int64_t n, const vks_task_run_options *o, vks_task_eval_result *r);
/* Copies the lines of tasks_path whose solve rate (mean reward over
 * o->samples) lies in [min_rate, max_rate] to out_path (atomically). */
int vks_task_filter(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *tasks_path,
                    const char *out_path, double min_rate, double max_rate, const vks_task_run_options *o,
                    int64_t *kept, int64_t *total);
#endif
