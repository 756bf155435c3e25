/* rl_internal.h: what the RL run's files share (src/rl): saving a trainer's
 * state as a checkpoint (sft.c and rl_run.c), and the hand-over between the
 * RL run's inference thread (rl_rollouts.c) and its trainer (rl_run.c). */
#ifndef VKS_RL_INTERNAL_H
#define VKS_RL_INTERNAL_H
#include <pthread.h>
#include <stdio.h>
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_engine.h"
#include "vkswarm/vks_rl.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_toploc.h"
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

#define VKS_RL_MAX_GROUP 1024          /* group_size's bound in the config */
#define VKS_RL_MAX_BATCH 4096          /* prompts_per_step x group_size generated at once */

/* One completion: BOS + prompt, then the completion (with the stop token when one ended it). */
typedef struct {
    int32_t *tokens;
    int prompt_len, completion_len;
    float *logp;          /* completion_len entries: the sampler's record (logp_old) */
    double task_reward;   /* 0..1 */
    double reward;        /* with the thinking-budget term */
    double advantage;
    bool accepted;        /* by the verifier (true without one) */
    bool logp_far;        /* the trainer's log-probabilities are far from logp: not trained on */
} vks_rl_sample;

/* The trainer trains on no completion whose recorded log-probabilities differ
 * from its own by more than this (nats) on any token: such a record is not the
 * sampling policy's (honest: ~3e-7 at async level 0, and k steps of drift stay
 * well below), and it would set the token's importance ratio at will. The
 * step is redone without it; counted in the metrics (logp_excluded). */
#define VKS_RL_MAX_LOGP_MISMATCH 5.0

/* A group of accepted completions of one prompt, with signal. */
typedef struct {
    vks_rl_sample *samples;
    int n;
    int64_t policy_step;  /* the trainer step whose weights generated it (0: the start) */
    int64_t task_index;
} vks_rl_batch_group;

void vks_rl_group_free(vks_rl_batch_group *g);

/* What generation batches counted, for the metrics. */
typedef struct {
    int64_t rollouts, checked, accepted, rejected, filtered, stale;
    double task_reward_sum;    /* over every rollout, 0..1 each */
} vks_rl_counters;
/* What one generation batch counted. */
typedef struct {
    int64_t rollouts, checked, accepted;
    double task_reward_sum;    /* sum of the task rewards of all its rollouts (0..rollouts) */
} vks_rl_gen_counts;

/* The groups on their way to the trainer (rl_queue.c): a ring of
 * prompts_per_step x (async_level + 2) groups, filled within the async window.
 * Not locked: the single-process hand-over holds its mutex around it. */
typedef struct {
    vks_rl_batch_group *ring;
    int head, len, cap;
    int prompts_per_step, async_level;
    int64_t pushed;            /* useful groups queued so far (consumed ones included) */
    int64_t empty_prompts;     /* prompts in a row without a useful group */
    vks_rl_counters counters;
} vks_rl_queue;
int vks_rl_queue_init(vks_rl_queue *q, int prompts_per_step, int async_level);
void vks_rl_queue_free(vks_rl_queue *q);
/* How many more groups made with the weights of step `policy` may be queued; whether any. */
int64_t vks_rl_queue_room(const vks_rl_queue *q, int64_t policy);
bool vks_rl_queue_has_room(const vks_rl_queue *q, int64_t policy);
/* How many more generation batches to hand out, with `out` batches already
 * out: each may bring prompts_per_step useful groups, so no more are out than
 * the window can take (at k = 0 one at a time: a second would go stale). */
int64_t vks_rl_queue_batches_to_grant(const vks_rl_queue *q, int64_t policy, int64_t out);
/* Queues a batch's n_groups (<= prompts_per_step) groups made with policy
 * `policy`: a group without signal (n = 0) is counted as filtered, one past
 * the window (or with the ring full) as stale and freed; the others move into
 * the ring (groups[p] left empty). Counts cnt; an error after
 * max_empty_batches x prompts_per_step prompts in a row (0:
 * VKS_RL_MAX_EMPTY_BATCHES batches' worth) without a useful group. */
int vks_rl_queue_push(vks_rl_queue *q, int64_t policy, vks_rl_batch_group *groups, int n_groups,
                      const vks_rl_gen_counts *cnt, int max_empty_batches);
/* Moves the n oldest groups (n <= len) into out[]. */
int vks_rl_queue_pop(vks_rl_queue *q, int n, vks_rl_batch_group *out);

/* The hand-over, under mu: groups from inference to the trainer, weights back. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    vks_rl_queue queue;
    vks_model *next_model;   /* newest weights the inference thread has not taken; NULL: none */
    int64_t next_step;
    bool stop;               /* the trainer is done: inference returns */
    int gen_rc;              /* inference failed: the code, and gen_error the message */
    char gen_error[1024];
    int64_t batches;         /* generation batches started (the rollout position) */
    double gen_busy_s;       /* seconds spent generating, scoring and verifying */
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
typedef struct {
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

/* The inference thread's state. */
typedef struct vks_rl_gen vks_rl_gen;
struct vks_rl_gen {
    const vks_rl_run_options *o;
    vks_rl_shared *sh;
    vks_task_spec spec;       /* built-in task, when tasks is NULL */
    vks_task *tasks;          /* user tasks (a task file), the held-out ones taken out */
    int64_t n_tasks;
    const char *tasks_path;   /* their file (inside config->task), NULL for a built-in task */
    vks_task *held;           /* config->eval_split: the held-out tasks of the file (never trained on) */
    int64_t n_held;
    vks_model *model;         /* the policy it generates with (owned) */
    int64_t policy_step;
    uint8_t model_hash[32];
    vks_engine *engine;
    int64_t batch;            /* generation batches done */
    double verify_start, verify_end; /* the last batch's verification (vks_seconds_now(); both 0: none) */
    vks_rl_timeline *timeline;       /* the inference thread's record (NULL: none, as on inference ranks) */
    char rollouts_dir[4096];
    bool defer_verify;        /* a verifier rank checks the batches: write the rollout file, verify
                                 nothing here, every completion goes into its group unverified */
    bool rejections_started;  /* rollouts_dir/rejected.jsonl has been trimmed for this process's batches */
    bool keep_flat_groups;    /* TEST ONLY: keep groups without signal (advantages 0), so that a
                                 rank told to send garbage always has a group to spoil */
    /* Generation elsewhere (NULL: on this engine with vks_generate): an RL
     * pipeline group's first rank (mpi/rl_group.c) runs it across its stages.
     * It fills seqs[0..n) as vks_generate with record_logp does, and their
     * TOPLOC proofs when toploc; the policy is g->model at g->policy_step, and
     * vks_rl_gen_set_policy makes no engine. */
    int (*generate)(void *ctx, const vks_rl_gen *g, const vks_sched_params *sp, vks_sequence *seqs, int n, bool toploc);
    void *generate_ctx;
};

/* Opens the run's tasks (config->task) into g, holding out config->eval_split
 * of a task file (the same split on every rank); vks_rl_gen_close frees them,
 * the engine and the policy. */
int vks_rl_gen_open_tasks(vks_rl_gen *g);
void vks_rl_gen_close(vks_rl_gen *g);
/* Makes m (owned from here) the policy of step `step`: a fresh engine. */
int vks_rl_gen_set_policy(vks_rl_gen *g, vks_model *m, int64_t step);
/* The verifier's rejections, one JSON object per rejected completion,
 * appended per batch (each line flushed and checked) to
 * rollouts_dir/VKS_RL_REJECTED_FILE:
 *   {"batch":B,"policy_step":S,"sample":I,"file":"batch-B.jsonl","id":ID,
 *    "seq":Q,"task_index":T,"output_tokens":N,"reason":STR,"max_gap":X,
 *    "logit_margin":M,"n_chunks":C,"toploc_exp_mismatches":E,
 *    "toploc_mant_mean":A,"toploc_mant_median":D}
 * (sample: the completion's index in the batch and in its rollout file; the
 * gap, margin and TOPLOC statistics are the verdict's, null when not finite).
 * Before a process's first batch the file keeps only lines of earlier batches
 * (a fresh run starts it empty; a resumed one drops the batches it makes
 * again). A batch with rejections also prints one line on stderr. */
#define VKS_RL_REJECTED_FILE "rejected.jsonl"
/* Records batch g->batch's rejected completions (samples: its rollout file,
 * in order; v: their verdicts, made with vo) as above. */
int vks_rl_record_rejections(vks_rl_gen *g, const vks_rollout_sample *samples, const vks_verdict *v, int n,
                             const vks_verify_options *vo);

/* Renders the run's first prompt (task 0, its think sentence included; no
 * BOS) and hands its text to o->show_prompt when set: an error here, at the
 * start, when the prompt format cannot render it (e.g. "model" without a
 * chat template), not at the first batch. */
int vks_rl_gen_show_prompt(const vks_rl_gen *g);
/* Generation batch `batch` with the current policy: the first n_prompts
 * (1..prompts_per_step) of its tasks (task batch * prompts_per_step + p) x
 * group_size completions, scored, verified (o->verify), as groups[0..n_prompts)
 * (groups[p].n = 0: no signal, dropped; groups has prompts_per_step entries,
 * the rest left empty). The single-process inference thread (n_prompts: the
 * window's room) and an inference rank (mpi/rl_roles.c: all) both call it. */
int vks_rl_gen_batch(vks_rl_gen *g, int64_t batch, int n_prompts, vks_rl_batch_group *groups, vks_rl_gen_counts *cnt);
/* The sampler seed of generation batch `batch` (every batch has its own). */
uint64_t vks_rl_batch_seed(const vks_rl_config *c, int64_t batch);
/* Creates the run's OUT directory (config->out) and OUT/sub (either may exist)
 * and makes OUT/sub g's rollouts_dir: where its batches' rollout files and
 * its record of rejections go. */
int vks_rl_gen_make_dirs(vks_rl_gen *g, const char *sub);
/* Where batch `batch`'s rollout file goes: g->rollouts_dir/batch-NNNNNN.jsonl. */
void vks_rl_batch_path(const vks_rl_gen *g, int64_t batch, char *out, size_t cap);
/* The trainer's check of a sample from another rank: its prompt is task
 * task_index's (built as the inference side builds it: g->model gives the
 * vocabulary and context) and its rewards are what the task (and the
 * thinking budget) give its completion. err says why not. */
int vks_rl_check_sample(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, char *err, size_t cap);
/* What vks_rl_check_sample compares: the prompt and stop checks, then the
 * rewards the task (and the thinking budget) give s's completion (a verifier
 * rank scores the rollout records of groups sent without completions). */
int vks_rl_score_sample(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, double *task_reward,
                        double *reward, char *err, size_t cap);

/* Where the trainer's groups come from and its weights go: the inference
 * thread (NULL source) or inference ranks (mpi/rl_roles.c). */
typedef struct {
    void *ctx;
    /* Hands the weights of trainer step `step` (0: the start) to inference; m is owned from here. */
    int (*publish)(void *ctx, vks_model *m, int64_t step);
    /* Blocks (bounded) until the prompts_per_step groups that trainer step
     * step + 1 consumes are there; moves them into groups[]. */
    int (*take)(void *ctx, int64_t step, vks_rl_batch_group *groups);
    void (*counters)(void *ctx, vks_rl_counters *c);
    /* The rollout position: generation batches started so far (a resumed run starts the next one). */
    int64_t (*position)(void *ctx);
    /* Before the first publish of a resumed run: trainer steps done, the next generation batch. */
    void (*resume)(void *ctx, int64_t step, int64_t next_batch);
    /* Bytes the last publish put on the wire (NULL: not measured). */
    double (*broadcast_bytes)(void *ctx);
    /* The inference and verifier ranks as counted so far, at most cap of them
     * into out; returns how many (NULL: not known on this rank). */
    int (*ranks)(void *ctx, vks_rl_rank_status *out, int cap);
} vks_rl_source;
/* vks_rl_run with the groups from src (NULL: the inference thread). */
int vks_rl_run_source(const vks_rl_run_options *o, const vks_rl_source *src, vks_rl_result *r);

/* ---- the run report (report.c): OUT/report.html ---- */
enum { VKS_RL_SAMPLE_TRAINED, VKS_RL_SAMPLE_LOGP_FAR, VKS_RL_SAMPLE_REJECTED };
typedef struct {
    int64_t step, task_index, policy_step;
    double task_reward, reward, advantage;
    int status;               /* VKS_RL_SAMPLE_* */
    char *prompt, *completion; /* decoded (malloc'd; NULL: not decodable), cut to 2 KiB */
} vks_rl_report_sample;
#define VKS_RL_REPORT_SAMPLES 200 /* the newest kept (4 a step: the last 50 steps) */
typedef struct {
    vks_rl_report_sample *ring; /* VKS_RL_REPORT_SAMPLES entries once one is kept */
    int next, len;
} vks_rl_report_samples;
/* Keeps step's samples for the report: of the first two groups with
 * completions, the highest- and lowest-reward one each. */
int vks_rl_report_capture(vks_rl_report_samples *s, const struct vks_tokenizer *tok, int64_t step,
                          const vks_rl_batch_group *groups, int n_groups);
void vks_rl_report_samples_free(vks_rl_report_samples *s);

typedef struct {
    const char *task;
    int64_t step, steps;
    bool final;               /* the run ended (else: a checkpoint's) */
    bool across_ranks;        /* inference runs on other ranks */
    double elapsed_s;
    const char *metrics_path; /* the curves */
    const vks_rl_timeline *trainer, *inference; /* inference NULL: the trainer's row only */
    int last_n;               /* trainer steps the timeline shows */
    const vks_rl_report_samples *samples;
    const vks_rl_rank_status *ranks;
    int n_ranks;
    vks_rl_counters totals;
} vks_rl_report;
/* Writes out_dir/report.html (temporary name, renamed): the summary, the
 * curves of metrics_path, the timeline, the ranks, the samples and the
 * verifier's rejections (out_dir/rollouts*\/rejected.jsonl). */
int vks_rl_report_write(const char *out_dir, const vks_rl_report *rep);

/* The inference thread's body (pthread start routine; arg: vks_rl_gen *). */
void *vks_rl_gen_main(void *arg);
#endif
