/* rl_internal.h: what the RL run's files share (src/rl): saving a trainer's
 * state as a checkpoint (sft.c and rl_run.c), and the hand-over between the
 * RL run's inference thread (rl_rollouts.c) and its trainer (rl_run.c). */
#ifndef VKS_RL_INTERNAL_H
#define VKS_RL_INTERNAL_H
#include <pthread.h>
#include <stdio.h>
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_rl_roles.h"
#include "vkswarm/vks_train.h"

/* Copies one parameter set between the trainer and a checkpoint block (by name). */
int vks_rl_move_set(vks_trainer *t, const vks_param_layout *l, vks_param_kind set, float *block, bool to_block);
/* Saves the trainer's weights and both moments as OUT/step-N (state->step),
 * then keeps the newest `keep` (0: all) up to step N (never one newer, never
 * N). dir gets the checkpoint's path. A failed save says which earlier
 * checkpoint is left as it was. */
int vks_rl_save_trainer(vks_trainer *t, const vks_param_layout *l, const vks_model *m,
                        const struct vks_tokenizer *tok, const vks_ckpt_state *state, const char *out_dir, int keep,
                        char *dir, size_t cap);
/* One set of every trainer tensor in order (LoRA: the adapter's order, per
 * layer and target, A then B) to or from a block of n floats. */
int vks_rl_move_lora_set(vks_trainer *t, vks_param_kind set, float *block, size_t n, bool to_block);
/* LoRA: the trainer's adapter (copied into a, an adapter of the trainer's
 * config with the base recorded) and both moments saved as OUT/step-N,
 * then pruned as vks_rl_save_trainer does. */
int vks_rl_save_lora(vks_trainer *t, vks_lora_adapter *a, const vks_ckpt_state *state, const char *out_dir, int keep,
                     char *dir, size_t cap);

/* The RL trainer's weights (its parameter set, n floats as
 * vks_rl_move_lora_set moves them) of its last cap versions (trainer steps):
 * async level k needs k + 1, the current one and the k a completion may lag
 * behind. put: the block that is to hold version step (its own if held, else
 * an empty slot's or the oldest version's; NULL: out of memory); get: NULL
 * when not held; forget: a block that did not get its values. */
typedef struct {
    int cap;
    size_t n;
    int64_t *step;  /* each slot's version, -1: none */
    float **values; /* each slot's n floats, made on first use */
} vks_rl_versions;
int vks_rl_versions_init(vks_rl_versions *v, int cap, size_t n);
void vks_rl_versions_free(vks_rl_versions *v);
float *vks_rl_versions_put(vks_rl_versions *v, int64_t step);
const float *vks_rl_versions_get(const vks_rl_versions *v, int64_t step);
void vks_rl_versions_forget(vks_rl_versions *v, int64_t step);

/* Closes m (may be NULL); returns rc when it is an error already (its
 * message kept), else vks_metrics_close's result. */
struct vks_metrics;
int vks_rl_close_metrics(struct vks_metrics *m, int rc);

/* A training run's output directory (train sft's and rl's OUT). One run at a
 * time writes there: vks_rl_out_lock creates OUT when missing and takes
 * OUT/vkswarm.lock (flock; "pid N on host H" inside; the lock ends with the
 * process), refusing a second run naming the first; vks_rl_out_unlock removes
 * it. A run that starts afresh first calls vks_rl_out_check_fresh: OUT must
 * hold nothing an earlier run left that it would overwrite or prune (step-*,
 * or one of the NULL-terminated output names, an empty directory excepted);
 * resuming (--resume found no checkpoint), the files are the run's own
 * (an attempt that ended before its first checkpoint) but a step-N, not a
 * complete checkpoint, is refused. */
typedef struct {
    int fd;
    char lock[4200];
} vks_rl_out_dir;
int vks_rl_out_lock(vks_rl_out_dir *d, const char *out);
void vks_rl_out_unlock(vks_rl_out_dir *d);
int vks_rl_out_check_fresh(const char *out, const char *const *outputs, bool resuming);
/* Refuses a checkpoint's model (had) of another shape or context than the run's start model (want). */
int vks_rl_ckpt_check_shape(const vks_model *had, const vks_model *want, const char *dir, const char *who);
/* Whether a checkpoint is an RL run's (its state records the RL task). */
bool vks_rl_ckpt_is_rl(const vks_checkpoint *ck);
/* Refuses to resume a checkpoint of the other kind of run (want_rl: rl, else
 * train sft, which records its data's hash), naming the kind. */
int vks_rl_ckpt_check_kind(const vks_checkpoint *ck, const char *dir, bool want_rl);
/* Refuses moments made with other Adam betas than the resuming run's (the
 * loader bounds them with the betas recorded). */
int vks_rl_ckpt_check_betas(const vks_checkpoint *ck, const char *dir, const char *who, double beta1, double beta2);

/* The hand-over, under mu: groups from inference to the trainer, weights back. */
typedef struct vks_rl_shared {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    vks_rl_queue queue;
    vks_model *next_model;   /* newest weights the inference thread has not taken; NULL: none */
    vks_lora_adapter *next_adapter; /* LoRA: the newest adapter instead (the base stays); NULL: none */
    int64_t next_step;
    bool stop;               /* the trainer is done: inference returns */
    int gen_rc;              /* inference failed: the code, and gen_error the message */
    char gen_error[1024];
    int64_t batches;         /* generation batches started (the rollout position) */
    double gen_busy_s;       /* seconds spent generating, scoring and verifying */
    int64_t scoring_prompts; /* prompts generated and not yet in the queue (being scored: rl_rollouts.c scorer) */
} vks_rl_shared;

/* ---- what each role did when (timeline.c): OUT/timeline.svg ---- */
typedef enum {
    VKS_RL_WORK_WAIT,      /* trainer: for groups; inference: for room in the async window or for weights */
    VKS_RL_WORK_TRAIN,
    VKS_RL_WORK_PUBLISH,   /* the trainer's weights to inference */
    VKS_RL_WORK_EVAL,      /* held-out evaluation */
    VKS_RL_WORK_LOAD,      /* inference: new weights into its engine */
    VKS_RL_WORK_GENERATE,  /* inference: a batch's generation, scoring and hand-over */
    VKS_RL_WORK_VERIFY,    /* inference: the batch's verification */
    VKS_RL_WORK_KINDS
} vks_rl_work;

typedef struct {
    double start, end;     /* seconds since the run's start */
    int64_t step;          /* the trainer step it belongs to (0: before the first); inference: its policy step */
    vks_rl_work kind;
} vks_rl_span;

/* Intervals kept per role: a trainer step makes 3 or 4, a generation batch 3
 * to 5 (with the waits and weight loads before it): enough for the plotted
 * last few steps even when many batches in a row lack signal. */
#define VKS_RL_TIMELINE_SPANS 512

/* The newest VKS_RL_TIMELINE_SPANS intervals of one role (a ring). */
typedef struct vks_rl_timeline {
    vks_rl_span *spans;    /* NULL: records nothing */
    int next, len;         /* where the next one goes; how many are kept */
    double t0;             /* the run's start (vks_seconds_now()) */
} vks_rl_timeline;
int vks_rl_timeline_init(vks_rl_timeline *t, double t0);
void vks_rl_timeline_free(vks_rl_timeline *t);
/* Records [start, end] (vks_seconds_now() times) as `kind` of step `step`,
 * dropping the oldest interval when full; t NULL or without storage: nothing. */
void vks_rl_timeline_add(vks_rl_timeline *t, vks_rl_work kind, int64_t step, double start, double end);
/* Records [*since, now] and sets *since to now. */
void vks_rl_timeline_note(vks_rl_timeline *t, vks_rl_work kind, int64_t step, double *since);
/* Writes the Gantt chart of the trainer's last `last_n` steps (all of them,
 * with the start's evaluation, when that reaches step 1) to path: the
 * trainer's row, and the inference thread's when inference is not NULL.
 * Fills *sum with what it shows. */
int vks_rl_timeline_write(const vks_rl_timeline *trainer, const vks_rl_timeline *inference, int last_n,
                          const char *path, vks_rl_timeline_summary *sum);
/* The same chart as an <svg> element written to f (the run report). */
int vks_rl_timeline_write_to(FILE *f, const vks_rl_timeline *trainer, const vks_rl_timeline *inference, int last_n);

/* ---- the run report (report.c): OUT/report.html ---- */
enum { VKS_RL_SAMPLE_TRAINED, VKS_RL_SAMPLE_LOGP_FAR, VKS_RL_SAMPLE_REJECTED };
typedef struct {
    int64_t step, task_index, policy_step;
    int64_t line;             /* the task's line in its task file (0: a built-in task's instance) */
    double task_reward, reward, advantage;
    int status;               /* VKS_RL_SAMPLE_* */
    char *prompt, *completion; /* decoded (malloc'd; NULL: not decodable), cut to 2 KiB */
    char *answer;             /* the task's expected answer (malloc'd; NULL: not known) */
} vks_rl_report_sample;
#define VKS_RL_REPORT_SAMPLES 200 /* the newest kept (4 a step: the last 50 steps) */
typedef struct {
    vks_rl_report_sample *ring; /* VKS_RL_REPORT_SAMPLES entries once one is kept */
    int next, len;
} vks_rl_report_samples;
/* Keeps step's samples for the report: of the first two groups with
 * completions, the highest- and lowest-reward one each, with their task's
 * expected answer and line (from gen's tasks; gen NULL: not known). */
int vks_rl_report_capture(vks_rl_report_samples *s, const struct vks_tokenizer *tok, const vks_rl_gen *gen,
                          int64_t step, const vks_rl_batch_group *groups, int n_groups);
void vks_rl_report_samples_free(vks_rl_report_samples *s);

/* A resumed run's stop: the checkpoint it went on from (its step, when it
 * was saved, the run's elapsed seconds then) and when the run went on. */
typedef struct {
    int64_t step;
    double stopped_unix, resumed_unix, elapsed_s;
} vks_rl_resume;
#define VKS_RL_MAX_RESUMES 32 /* the newest kept in checkpoints and shown */

/* The held-out accuracy's comparison, start -> final: the change, twice the
 * standard error of the difference (sqrt(se0^2 + se1^2), the two
 * measurements taken as independent) and its verdict: +1 rose, -1 fell by
 * more than that, 0 within it; NaN (verdict 0) when either is not known. */
typedef struct {
    double change, noise2;
    int verdict;
} vks_rl_accuracy_change;
vks_rl_accuracy_change vks_rl_accuracy_compare(double a0, double se0, double a1, double se1);

typedef struct {
    const char *task;
    int64_t step, steps;
    bool final;               /* the run ended (else: after a step) */
    bool across_ranks;        /* inference runs on other ranks */
    double elapsed_s;         /* since the run's start, across stops */
    const vks_rl_config *config; /* the table of keys (NULL: none) */
    const char *model;        /* the start model's path ("": --init tiny) and hash (hex; "" not known) */
    const char *model_hash;
    const char *task_set;     /* what the run trains and evaluates on, in words */
    const vks_rl_resume *resumes; /* a resumed run's stops, oldest first */
    int n_resumes;
    const char *metrics_path; /* the curves */
    const vks_rl_timeline *trainer, *inference; /* inference NULL: the trainer's row only */
    int last_n;               /* trainer steps the timeline shows */
    const vks_rl_report_samples *samples;
    const vks_rl_rank_status *ranks;
    int n_ranks;
    vks_rl_counters totals;
} vks_rl_report;
/* Writes out_dir/report.html (temporary name, renamed): the held-out
 * accuracy start -> final (metrics_path's first and last evaluation), the
 * summary, the run (config, model, tasks, ranks and roles, stops), the
 * curves of metrics_path, the timeline, the ranks, the samples and the
 * verifier's rejections (out_dir/rollouts*\/rejected.jsonl). */
int vks_rl_report_write(const char *out_dir, const vks_rl_report *rep);

/* The inference thread's body (pthread start routine; arg: vks_rl_gen *). */
void *vks_rl_gen_main(void *arg);
#endif
