/* vks_rl_roles.h: what the roles of an RL run share, for the run on one
 * machine (src/rl) and the run across ranks (mpi/rl_*.c): completions and
 * their groups, the queue of groups within the async window, the inference
 * side's state (vks_rl_gen) and where the trainer's groups come from
 * (vks_rl_source). The rest of the run's internals: src/rl/rl_internal.h. */
#ifndef VKS_RL_ROLES_H
#define VKS_RL_ROLES_H
#include "vks_lora.h"
#include "vks_rollout.h"
#include "vks_engine.h"
#include "vks_rl.h"
#include "vks_tasks.h"
#include "vks_toploc.h"

struct vks_rl_shared;   /* the single-process hand-over (src/rl) */
struct vks_rl_timeline; /* a role's record of what it did when (src/rl) */
#define VKS_RL_MAX_GROUP 1024          /* group_size's bound in the config */
#define VKS_RL_MAX_BATCH 4096          /* prompts_per_step x group_size generated at once */

/* One completion: BOS + prompt, then the completion (with the stop token when one ended it); of an episode
 * (environment tasks), every turn after its start with the environment's replies between them. */
typedef struct {
    int32_t *tokens;
    int prompt_len, completion_len;
    float *logp;          /* completion_len entries: the sampler's record (logp_old; 0 on the environment's) */
    uint8_t *trained;     /* completion_len entries or NULL (every token): 1 on the model's own tokens, 0 on a
                           * multi-turn episode's environment messages (inputs, never trained on) */
    uint64_t episode_seed; /* an episode's environment seed: task_index x group_size + its place in the group */
    double task_reward;   /* 0..1 */
    double reward;        /* with the thinking-budget term */
    double advantage;
    bool accepted;        /* by the verifier (true without one) */
    bool logp_far;        /* the sampling version's log-probabilities (the trainer's) are far from logp:
                           * not trained on */
} vks_rl_sample;

/* The trainer trains on no completion whose recorded log-probabilities differ
 * by more than this (nats) on any token from what the weights that sampled it
 * give (its group's policy_step: the trainer's current weights at lag 0, a
 * version it kept at lag 1..k): such a record is not the sampling policy's
 * (honest: ~3e-7), and it would set the token's importance ratio at will.
 * Not against the current weights at lag > 0: a step at lr 1e-2 can move a
 * token by more than this. Counted in the metrics (logp_excluded). */
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
    int64_t off_policy;        /* groups dropped for max_off_policy_steps (off_policy_dropped) */
    double task_reward_sum;    /* over every rollout, 0..1 each */
} vks_rl_counters;
/* What one generation batch counted. */
typedef struct {
    int64_t rollouts, checked, accepted;
    double task_reward_sum;    /* sum of the task rewards of all its rollouts (0..rollouts) */
} vks_rl_gen_counts;

/* The groups on their way to the trainer (rl_queue.c): a ring of
 * prompts_per_step x (async_level + 2) groups, filled within the window:
 * min(async_level, max_off_policy) steps.
 * Not locked: the single-process hand-over holds its mutex around it. */
typedef struct {
    vks_rl_batch_group *ring;
    int head, len, cap;
    int prompts_per_step, async_level, max_off_policy;
    int64_t pushed;            /* useful groups queued so far (consumed ones included) */
    int64_t empty_prompts;     /* prompts in a row without a useful group */
    vks_rl_counters counters;
} vks_rl_queue;
/* max_off_policy: the config's max_off_policy_steps (>= 0). */
int vks_rl_queue_init(vks_rl_queue *q, int prompts_per_step, int async_level, int max_off_policy);
void vks_rl_queue_free(vks_rl_queue *q);
/* How many more groups made with the weights of step `policy` may be queued; whether any. */
int64_t vks_rl_queue_room(const vks_rl_queue *q, int64_t policy);
bool vks_rl_queue_has_room(const vks_rl_queue *q, int64_t policy);
/* How many more generation batches to hand out, with `out` batches already
 * out: each may bring prompts_per_step useful groups, so no more are out than
 * the window can take (at k = 0 one at a time: a second would go stale). */
int64_t vks_rl_queue_batches_to_grant(const vks_rl_queue *q, int64_t policy, int64_t out);
/* Queues a batch's n_groups (<= prompts_per_step) groups made with policy
 * `policy`: a group without signal (n = 0) is counted as filtered; one that
 * the step consuming it would find more than max_off_policy steps old as
 * off_policy, one past the async window (or with the ring full) as stale,
 * and either is freed; the others move into the ring (groups[p] left empty).
 * Counts cnt; an error after max_empty_batches x prompts_per_step prompts in
 * a row (0: VKS_RL_MAX_EMPTY_BATCHES batches' worth) without a useful group. */
int vks_rl_queue_push(vks_rl_queue *q, int64_t policy, vks_rl_batch_group *groups, int n_groups,
                      const vks_rl_gen_counts *cnt, int max_empty_batches);
/* Moves the n oldest groups (n <= len) into out[]. */
int vks_rl_queue_pop(vks_rl_queue *q, int n, vks_rl_batch_group *out);

/* The trainer's status line (rl_status.c): when the run has said nothing for
 * interval_s (a step line, or an earlier status line), one line saying which
 * step it waits for, since when, and what the queue counted since that step
 * began: "rl: step 3/20, 41 s without a step: generated 96 groups, discarded
 * 90 (no signal), kept 6/8; in flight: rank 1 2 batches, rank 2 1; waiting
 * for verifier rank 3". The source of groups that blocks (the single-process
 * wait, take_mpi's rounds) calls vks_rl_status_poll from its loop: the queue
 * it holds is the one place that knows these counts. */
#define VKS_RL_STATUS_INTERVAL_S 30.0
typedef struct {
    double interval_s;          /* <= 0: no status lines */
    double last;                /* when the run last said something */
    double step_start;          /* when the step waited for began */
    int64_t step, steps;        /* the step waited for (1-based), of */
    bool have_base;             /* base: the queue's counts at the first poll of the step */
    vks_rl_counters base;
    int64_t base_pushed;
    void (*say)(void *ctx, const char *line); /* NULL: no status lines */
    void *ctx;
} vks_rl_status;
/* The step `step` of `steps` begins (at `now`, vks_seconds_now()). */
void vks_rl_status_begin(vks_rl_status *s, int64_t step, int64_t steps, double now);
/* The run said something (a step's line) at `now`: silence counts from here. */
void vks_rl_status_said(vks_rl_status *s, double now);
/* When interval_s passed since the run last said something: says the line,
 * from the queue q (held: locked by the caller where it needs a lock) and
 * in_flight (NULL or "": nothing more), e.g. "in flight: rank 1 2 batches". */
void vks_rl_status_poll(vks_rl_status *s, const vks_rl_queue *q, const char *in_flight);
/* Seconds until the next line is due (>= 0; interval_s when no lines are said). */
double vks_rl_status_due_in(const vks_rl_status *s);

/* The inference thread's state. */
typedef struct vks_rl_gen vks_rl_gen;
struct vks_rl_gen {
    const vks_rl_run_options *o;
    struct vks_rl_shared *sh;
    vks_task_spec spec;       /* built-in task, when tasks is NULL */
    vks_task *tasks;          /* user tasks (a task file), the held-out ones taken out */
    int64_t n_tasks;
    const char *tasks_path;   /* their file (inside config->task), NULL for a built-in task */
    vks_task *held;           /* config->eval_split: the held-out tasks of the file (never trained on) */
    int64_t n_held;
    vks_model *model;         /* the policy it generates with (owned; LoRA: the frozen base, borrowed) */
    vks_lora_adapter *adapter; /* LoRA: the policy's adapter on model (owned); NULL: full fine-tuning */
    bool model_borrowed;      /* LoRA: model is the run's base, not freed here */
    int64_t policy_step;
    uint8_t model_hash[32];
    vks_engine *engine;
    int64_t batch;            /* generation batches done */
    double verify_start, verify_end; /* the last batch's verification (vks_seconds_now(); both 0: none) */
    struct vks_rl_timeline *timeline;       /* the inference thread's record (NULL: none, as on inference ranks) */
    char rollouts_dir[4096];
    char policy_weights[512]; /* where the policy's weights are, for the rollout files ("": OUT/step-N
                               * when the run saves that step); set with the policy */
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
    vks_task_metrics *program_metrics; /* what reward programs answered in this process's scoring (made by open_tasks) */
    vks_task_program *reward_program;  /* config "reward": scores every task instead of its own check (NULL: none) */
    bool episodes;            /* the tasks are multi-turn environments (set by open_tasks): a batch is episodes */
    int turns;                /* episodes: the turn files the last batch wrote (its rollout file, then
                               * batch-N-turn-T.jsonl for T = 2..turns) */
    struct vks_difficulty_pool *pool; /* config buffer.type difficulty_pool: which task each slot gets (made by
                                         open_tasks; NULL: task_index mod n_tasks) */
    bool episodes_allowed;    /* set before open_tasks where this role runs episodes (a run on one process,
                               * for now); else open_tasks refuses environment tasks */
};

/* Opens the run's tasks (config->task) into g, holding out config->eval_split
 * of a task file (the same split on every rank); vks_rl_gen_close frees them,
 * the engine and the policy. */
int vks_rl_gen_open_tasks(vks_rl_gen *g);
void vks_rl_gen_close(vks_rl_gen *g);
/* Makes m (owned from here) the policy of step `step`: a fresh engine. */
int vks_rl_gen_set_policy(vks_rl_gen *g, vks_model *m, int64_t step);
/* LoRA: makes adapter a (owned from here) the policy of step `step` on the
 * base g->model (g->model_borrowed): the engine is made once, then only the
 * adapter is swapped (vks_engine_set_lora); the model hash is base + adapter. */
int vks_rl_gen_set_adapter(vks_rl_gen *g, vks_lora_adapter *a, int64_t step);
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
/* Task `index` of the run (task_index of a group): a built-in instance or a
 * user task (its line in the task file in t->line). */
int vks_rl_gen_task(const vks_rl_gen *g, int64_t index, vks_task *t);
/* The sampler seed of generation batch `batch` (every batch has its own). */
uint64_t vks_rl_batch_seed(const vks_rl_config *c, int64_t batch);
/* Creates the run's OUT directory (config->out) and OUT/sub (either may exist)
 * and makes OUT/sub g's rollouts_dir: where its batches' rollout files and
 * its record of rejections go. */
int vks_rl_gen_make_dirs(vks_rl_gen *g, const char *sub);
/* Where batch `batch`'s rollout file goes: g->rollouts_dir/batch-NNNNNN.jsonl. */
void vks_rl_batch_path(const vks_rl_gen *g, int64_t batch, char *out, size_t cap);
/* Episodes: where turn `turn` (0, 1, ...) of batch `batch` goes: its rollout file for the first turn,
 * g->rollouts_dir/batch-NNNNNN-turn-T.jsonl (T = turn + 1) for the others. */
void vks_rl_turn_path(const vks_rl_gen *g, int64_t batch, int turn, char *out, size_t cap);
/* What the trainer's check compares (vks_rl_check_samples): the prompt is task
 * task_index's (built as the inference side builds it: g->model gives the
 * vocabulary and context), a stop token only at the end, then the rewards
 * the task (and the thinking budget) give s's completion (a verifier rank
 * scores the rollout records of groups sent without completions). */
int vks_rl_score_sample(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, double *task_reward,
                        double *reward, char *err, size_t cap);
/* The same for n completions of one task at once (one group: code tasks' tests run in parallel
 * sandboxes): task_reward[i] and reward[i] for s[i]; on an error *bad is the completion it concerns
 * (the first in order) and err says why. */
int vks_rl_score_samples(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, int n, double *task_reward,
                         double *reward, int *bad, char *err, size_t cap);
/* The trainer's check of n completions of one task from another rank: scored as above, their sent rewards
 * must be what the task gives (*bad: the first that fails; err says why). */
int vks_rl_check_samples(const vks_rl_gen *g, int64_t task_index, const vks_rl_sample *s, int n, int *bad, char *err,
                         size_t cap);

/* One episode of a batch as a verifier rebuilt it (vks_rl_verify_episodes). */
typedef struct {
    vks_verdict verdict;   /* accepted: every turn passed the proofs and the sampler's replay, each turn's prompt is
                            * the conversation its environment gave, and the episode ends after its last turn */
    int32_t *ids;          /* the episode rebuilt: its start (n_prompt tokens), then its turns and the replies */
    int n_ids, n_prompt;
    uint8_t *trained;      /* n_ids - n_prompt: 1 on the model's own tokens (the mask its sample must carry) */
    float *logp;           /* n_ids - n_prompt: the replay's log-probability of each own token, 0 on replies */
    double task_reward;    /* the environment's (0: the episode was cut) */
} vks_rl_episode_check;
/* The episodes i of batch `batch` (i < n_prompts x group_size; episode i of task batch x prompts_per_step +
 * i / group_size, environment seed as the inference side gives it) rebuilt from their environments and the
 * batch's turn files files[0..turns) (turn t's records keyed by episode: seq), each turn verified on model
 * with vo (TOPLOC proofs, the sampler's replay; vo->logp_out is the function's own). check_streams: each
 * record must also be the batch's sampler stream (its seed, its episode's index, the run's temperature).
 * out[0..n) filled (free with vks_rl_episode_checks_free); a malformed file (a record of no episode, one
 * episode twice in a turn) is VKS_ERR_FORMAT. What one process's verifier and a verifier rank both run. */
int vks_rl_verify_episodes(const vks_rl_gen *g, const vks_model *model, const vks_verify_options *vo, int64_t batch,
                           int n_prompts, const vks_rollout_file *files, int turns, bool check_streams,
                           vks_rl_episode_check *out);
void vks_rl_episode_checks_free(vks_rl_episode_check *x, int n);

/* Where the trainer's groups come from and its weights go: the inference
 * thread (NULL source) or inference ranks (mpi/rl_roles.c). */
typedef struct {
    void *ctx;
    /* Hands the weights of trainer step `step` (0: the start) to inference; m is owned from here. */
    int (*publish)(void *ctx, vks_model *m, int64_t step);
    /* LoRA (config lora.rank > 0): hands the adapter of trainer step `step`
     * (owned from here; its base recorded) instead; NULL: LoRA is refused. */
    int (*publish_adapter)(void *ctx, vks_lora_adapter *a, int64_t step);
    /* Blocks (bounded) until the prompts_per_step groups that trainer step
     * step + 1 consumes are there; moves them into groups[]; polls status
     * (vks_rl_status_poll) while it waits. */
    int (*take)(void *ctx, int64_t step, vks_rl_batch_group *groups, vks_rl_status *status);
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
    /* The joins so far (NULL, or false returned: the run takes no joins). */
    bool (*pool)(void *ctx, vks_rl_pool *out);
    /* Where the completions are scored for the metrics: reward programs' metrics (NULL: none known here). */
    vks_task_metrics *(*program_metrics)(void *ctx);
} vks_rl_source;
/* vks_rl_run with the groups from src (NULL: the inference thread). */
int vks_rl_run_source(const vks_rl_run_options *o, const vks_rl_source *src, vks_rl_result *r);

#endif
