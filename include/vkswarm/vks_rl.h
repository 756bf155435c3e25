/* vks_rl.h: the asynchronous RL run (src/rl/rl_run.c, rl_rollouts.c), in the
 * manner of INTELLECT-2, on one machine: an inference thread generates groups
 * of completions of built-in or user tasks with the newest policy it holds,
 * scores them (task verifiers, thinking budget), has them checked by the
 * verifier (TOPLOC proofs and the sampling replay on the CPU forward), turns
 * rewards into group advantages and drops groups without signal; the trainer
 * (the calling thread) takes prompts_per_step useful groups per step, trains
 * the GRPO loss on the accepted completions and hands the new weights back.
 *
 * Async level k: the group consumed by trainer step s was generated with a
 * policy no older than s - k. The inference thread generates ahead only as far
 * as that allows and otherwise waits for new weights; k = 0 is synchronous
 * (the trainer idles while inference runs). Weights switch between batches:
 * no sequence in flight is dropped; each group records the policy step that
 * made it. */
#ifndef VKS_RL_H
#define VKS_RL_H
#include "vks_gpu.h"
#include "vks_model.h"
#include "vks_rl_config.h"

struct vks_tokenizer;

#define VKS_RL_MAX_EMPTY_BATCHES 20
#define VKS_RL_TIMELINE_STEPS 4     /* trainer steps OUT/timeline.svg shows by default */

/* What one trainer step reports. */
typedef struct {
    int64_t step, steps;      /* steps done, of steps */
    double policy_lag;        /* mean (step - 1 - policy step) over the step's groups */
    int64_t policy_lag_max;   /* the largest, at most min(async_level, max_off_policy_steps) */
    double reward;            /* mean task reward (0..1, before the length term) of every completion generated
                               * since the previous step (filtered groups included); NaN when none was */
    double trained_reward;    /* the same over the completions trained this step (groups with signal only) */
    double accuracy;          /* held-out accuracy, greedy (fresh instances or the held-out set); NaN when not
                               * measured this step */
    double accuracy_sampled;  /* the same sampled at the run's temperature (one completion a task); NaN alike */
    double accuracy_n;        /* the instances both were measured on (their standard error: vks_binomial_se) */
    double length;            /* mean completion tokens */
    double accept_rate;       /* verifier: accepted / checked completions so far (1 without a verifier) */
    double rollouts_per_s;    /* completions generated per second so far */
    double trainer_idle;      /* fraction of this step's time the trainer waited for groups */
    double broadcast_s;       /* handing the new weights to inference (export, hash, copy; across ranks:
                               * the whole Shardcast send, until every rank has them) */
    double broadcast_bytes;   /* across ranks: bytes of the step's Shardcast send on the wire; 0 here */
    double loss, grad_norm, clip_fraction, logp_mismatch;
    double mismatch_kl;       /* mean exp(x) - x - 1 over the trained tokens, x = trainer's - sampler's logp */
    int64_t logp_excluded;    /* this step's completions not trained on: their sampler log-probabilities
                               * far from those of the weights that sampled them (VKS_RL_MAX_LOGP_MISMATCH) */
    double logp_sampler_max;  /* the largest |sampler's - sampling weights'| log-probability of a trained
                               * completion token (the check above; honest: ~1e-6 at any lag) */
    double entropy;           /* mean entropy (nats, temperature 1, whole vocabulary) of the trained
                               * completion tokens' distributions under the trainer's weights before the step */
    int64_t groups_filtered;  /* groups dropped so far for equal rewards (no signal) */
    int64_t rejected;         /* completions the verifier rejected so far */
    int64_t groups_stale;     /* useful groups beyond the async window, dropped so far */
    int64_t off_policy_dropped; /* useful groups dropped so far for max_off_policy_steps */
    double elapsed_s;         /* since the run's start, across stops (metrics.jsonl's elapsed_s) */
} vks_rl_progress;

typedef struct {
    const vks_rl_config *config;     /* checked (vks_rl_config_check); roles are ignored: every role runs here */
    const vks_model *model;          /* the start policy */
    const struct vks_tokenizer *tok;
    vks_gpu *train_gpu, *infer_gpu;  /* two handles (the inference thread records on its own) */
    int eval_every;                  /* held-out accuracy every N steps, and at the start and end (0: only those) */
    int eval_n;                      /* fresh instances per evaluation, or the first eval_n tasks of the
                                      * held-out set (config eval_tasks / eval_split) when there is one (0: none);
                                      * a task file without a held-out set is not evaluated */
    uint64_t eval_seed;              /* their seed (differ from config->seed) */
    bool verify;                     /* run the verifier role */
    int max_empty_batches;           /* generation batches in a row without a useful group before the run
                                      * fails (0: VKS_RL_MAX_EMPTY_BATCHES) */
    int timeline_steps;              /* the last N trainer steps OUT/timeline.svg shows (0: VKS_RL_TIMELINE_STEPS) */
    int cheat_every;                 /* TEST ONLY: every Nth completion gets a token it did not sample (0: honest) */
    bool resume;                     /* continue from the newest checkpoint in config->out (weights, moments,
                                      * step, rollout position), when there is one; model must be its shape.
                                      * One run at a time writes config->out (OUT/vkswarm.lock); a fresh run
                                      * refuses an OUT holding an earlier run's step-N, metrics.jsonl, rl.svg,
                                      * timeline.svg or rollouts/ */
    void (*progress)(void *ctx, const vks_rl_progress *p);
    void *progress_ctx;
    /* with resume, before training (may be NULL): the checkpoint continued
     * from (its weights replace model's) and its step, or NULL and -1 when
     * config->out holds none (a fresh run) */
    void (*on_resume)(void *ctx, const char *checkpoint, int64_t step);
    /* at the start (may be NULL): the text of the run's first prompt as the
     * model gets it (config->prompt, vks_prompt.h; no BOS), with progress_ctx */
    void (*show_prompt)(void *ctx, const char *text, size_t len);
    /* A clean stop (may be NULL; vks_rl_run only: the ranks of an MPI run
     * ignore it): asked after each trainer step (once its groups are trained
     * on, before its weights go to inference, and again after progress); when
     * it returns true the run ends there as if that step were its last: the
     * inference thread is stopped and joined, the checkpoint OUT/step-N is
     * saved (whatever save_every says), the plots and metrics are written,
     * and the result's stopped_at_step is N (rc VKS_OK). Never called from a
     * signal handler: the caller's handler sets a flag that this reads. */
    bool (*stop_requested)(void *ctx);
    void *stop_ctx;
    /* A status line (may be NULL: none), with progress_ctx, when the trainer
     * has waited status_interval_s (0: VKS_RL_STATUS_INTERVAL_S, 30 s) since
     * its last step line or status line: the step it waits for, groups
     * generated / discarded / kept since that step began, what is in flight
     * on which rank (vks_rl_roles.h: vks_rl_status). */
    void (*status)(void *ctx, const char *line);
    double status_interval_s;
} vks_rl_run_options;

/* What OUT/timeline.svg shows: trainer steps first_step..last_step (with the
 * start's evaluation when that is every step), from `start` to `end` (seconds
 * since the run's start), and the seconds each role spent per kind of work in
 * that window. The inference thread's row is absent (its seconds 0) when
 * inference runs on other ranks. */
typedef struct {
    int64_t first_step, last_step;
    double start, end;
    double trainer_wait, trainer_train, trainer_publish, trainer_eval;
    double inference_wait, inference_load, inference_generate, inference_verify; /* load: new weights into the engine */
    /* who waited for whom: the trainer waiting for groups while inference
     * generated or verified, and inference waiting (for room in the async
     * window or for weights) while the trainer trained or published */
    double trainer_wait_on_inference, inference_wait_on_trainer;
} vks_rl_timeline_summary;

/* An inference or verifier rank of a run across ranks as the trainer (or
 * the orchestrator) counted it; in one process, the inference thread
 * (rank -1). An inference group of several ranks is counted as its first. */
enum { VKS_RL_RANK_LIVE = 0, VKS_RL_RANK_DROPPED = 1, VKS_RL_RANK_REFUSED = 2 };
typedef struct {
    int rank;                 /* world rank (a joined rank: numbered after the world's); -1: this process's
                               * inference thread */
    bool verifier;
    bool joined;              /* it joined the running run (vkswarm join) */
    bool admitted;            /* joined and admitted (else refused at its hello: another model, a key not allowed) */
    bool banned;              /* joined and refused for what it sent: its key may not join again */
    char identity[17];        /* joined: its key's first 16 hex digits */
    int state;                /* VKS_RL_RANK_*: refused (it sent something wrong) or dropped (silent, or it
                               * missed the weights) ranks are left out for the rest of the run */
    int64_t batches;          /* inference: its batches taken into the queue; verifier: batches it answered */
    int64_t rollouts;         /* completions in them (inference: generated; verifier: checked) */
    int64_t rejected;         /* completions the verifier rejected (inference: of its batches; verifier: by it) */
    int64_t at_step;          /* dropped or refused: the trainer's steps done then; else -1 */
    char why[320];            /* dropped or refused: why ("" while live) */
} vks_rl_rank_status;
#define VKS_RL_MAX_RANK_STATUS 64 /* ranks counted (more are left out of the report and the result) */

/* The machines that joined a running run (vkswarm join), as the trainer
 * counted them since this process started: admitted joins, joined ranks that
 * left (clean goodbye, dropped or refused), keys banned; per identity (a key,
 * over all its joins): batches taken into the queue and batches refused. */
typedef struct {
    char identity[17]; /* its key's first 16 hex digits */
    int64_t batches_accepted, batches_rejected;
} vks_rl_identity;
#define VKS_RL_MAX_IDENTITIES 256 /* identities shown (the busiest; the others counted in identities_left_out) */
typedef struct {
    int64_t joins, leaves, bans;
    int n_identities;
    int64_t identities_left_out;
    vks_rl_identity identities[VKS_RL_MAX_IDENTITIES];
} vks_rl_pool;

typedef struct {
    char final_checkpoint[4096], metrics_path[4096], plot_path[4096], timeline_path[4096], rollouts_dir[4096];
    char report_path[4096];   /* OUT/report.html */
    char heldout_path[4096];  /* eval_split: OUT/heldout.jsonl, the held-out lines as they were ("": none) */
    char eval_set[8192];      /* what held-out accuracy is measured on ("": fresh instances or nothing) */
    int64_t eval_tasks;       /* tasks of the held-out set (0: none) */
    vks_rl_timeline_summary timeline;
    double start_accuracy, final_accuracy; /* NaN without evaluations */
    double trainer_idle;                   /* over the whole run */
    int64_t rollouts, checked, accepted, rejected, groups_filtered, groups_stale, off_policy_dropped; /* checked: by a verifier
                               * (accepted + rejected; fewer than rollouts with verify_sample or without one) */
    vks_rl_rank_status ranks[VKS_RL_MAX_RANK_STATUS]; /* the inference and verifier ranks at the end */
    int n_ranks;
    int64_t trained;          /* completions the trainer trained on */
    int64_t trained_rejected; /* rejected completions that reached the trainer (skipped there; 0 unless a bug) */
    int64_t resumed_from;     /* the step resumed from, -1: a fresh run */
    int64_t stopped_at_step;  /* stop_requested ended the run after this step (its checkpoint is
                               * final_checkpoint); -1: it ran config->steps steps */
    bool start_accuracy_stored; /* resumed: start_accuracy is the run's start's (step 0), as its checkpoint recorded */
    int64_t next_batch;       /* the rollout position at the end: generation batches started */
    double elapsed_s;         /* since the run's start; a resumed run's goes on from its checkpoint's */
} vks_rl_result;

/* What an RL run stores in each checkpoint beside the trainer's state (its
 * state.json "extra"): the rollout position (rl_task, rl_prompts_per_step,
 * rl_next_batch), the whole configuration (rl_config: vks_rl_config_to_json),
 * the run's evaluation options (rl_eval: eval_every, eval_n, eval_seed,
 * verify) and its held-out accuracy at the start (rl_start_accuracy; null:
 * not measured). The newest checkpoint in out_dir, read without its tensors
 * (vks_rl_run checks it whole): *found false when there is none. */
typedef struct {
    char checkpoint[4096];
    int64_t step;
    bool has_config;          /* false: written before runs stored these (rl_config and rl_eval), or not
                               * an RL run's checkpoint (vks_rl_run refuses that one, naming its kind) */
    vks_rl_config config;
    int eval_every, eval_n;
    uint64_t eval_seed;
    bool verify;
} vks_rl_stored;
int vks_rl_stored_read(const char *out_dir, vks_rl_stored *s, bool *found);

/* Runs config->steps trainer steps; every error names its role and step. */
int vks_rl_run(const vks_rl_run_options *o, vks_rl_result *r);
#endif
