/* vks_rl_config.h: the configuration of an RL run (src/rl/rl_config.c): a
 * small JSON file, every key also settable as KEY=VALUE (the CLI's --set and
 * its named flags), and the roles of the ranks, checked against the number of
 * ranks started.
 *
 * {
 *   "task": "add:2",             built-in task (vks_tasks.h: NAME[:SIZE]) or a task file: PATH.jsonl,
 *                                a path with '/', or "file:PATH" (vks_task_resolve)
 *   "eval_tasks": "",            held-out accuracy on this task file instead of fresh instances
 *   "eval_split": 0,             a task file only: hold out this fraction of it (0 < f < 1; vks_task_split:
 *                                the same tasks for the same file) for held-out accuracy, never trained on
 *   "init": "tiny" | "model": P, the policy's start (a checkpoint from train sft, usually)
 *   "out": "rl-out",             metrics, plot, checkpoints
 *   "steps": 50,                 trainer steps
 *   "prompts_per_step": 8,       prompts per step; each gets group_size completions
 *   "group_size": 8,
 *   "async_level": 2,            k: inference uses weights at most k steps old
 *   "max_off_policy_steps": 8,   m (prime-rl's name and default): a group whose policy is more than m
 *                                steps older than the weights of the step that would train it is
 *                                dropped (off_policy_dropped); the window is min(k, m) steps
 *   "max_new_tokens": 48, "temperature": 1.0, "lr": 1e-4, "seed": 1,
 *   "warmup": 0,                 linear learning-rate warm-up over the first N steps (Adam's first
 *                                steps, fresh moments, move every weight by about lr)
 *   "length_targets": [],        e.g. [64, 128, 256]: the thinking budget; [] off (each at most
 *                                max_new_tokens)
 *   "length_penalty": 3e-4,      lambda of the thinking budget
 *   "token_budget": 0,           loss normaliser per step, 0 or 1 to 1e12 tokens (0: prompts_per_step *
 *                                group_size * max_new_tokens)
 *   "entropy_coef": 0,           entropy bonus c: -c H / token_budget per completion token (0: off; the
 *                                mean entropy is reported either way)
 *   "save_every": 10,            a checkpoint every N steps (0: only the final one), for --resume
 *   "keep": 3,                   keep the newest N checkpoints (0: all)
 *   "verify_sample": 0,          verifier ranks: 0 checks every completion; F in (0, 1] checks ceil(F n) of a
 *                                batch's n judged completions, drawn with a fresh secret, and accepts or
 *                                rejects the batch whole (group verdicts, vks_verify_group.h)
 *   "probation_batches": 8,      verifier ranks: a machine that joined the run (its key) has every group of its
 *                                first N accepted batches replayed, whatever verify_sample says (0: none)
 *   "shardcast_key": "",         across ranks: a directory made by `vkswarm keygen`: the trainer signs
 *                                the weights with its shardcast.key, the others trust only its
 *                                shardcast.pub ("": a key pair made for the run, announced at start-up)
 *   "prompt": {                  how task prompts are given to the model (vks_prompt.h), the same for
 *     "chat_template": "none",   generation, the verifiers' prompt checks and held-out accuracy:
 *     "system": "",              "none" (BOS + the text), "model" (the tokenizer's) or chatml, qwen3,
 *     "user_template": "{prompt}", llama2, llama3, llama3.1, phi3; a system message; the user message
 *     "think_template": "Think for {n} tokens.\n", around the task text; the thinking-budget sentence;
 *     "think": true              false: qwen3's enable_thinking=false
 *   },
 *   "lora": {                    LoRA (on one machine): train only adapters of this rank (0: full
 *     "rank": 0,                 fine-tuning, the default), scale alpha / rank, on these targets (q, k,
 *     "alpha": 32,               v, o, gate, up, down, PEFT's names or "all"); the inference thread
 *     "targets": "all"           applies the newest adapter to the frozen base (vks_engine_set_lora)
 *   },                           and proofs name base + adapter; written only when rank > 0
 *   "loss": {                    the policy loss (docs/rl.md "RL losses"; vks_ref_grad.h defines each):
 *     "type": "intellect2",      intellect2 | dppo_kl | ipo | cispo | dapo | gspo | decoupled_ppo; each reads
 *                                its own knobs:
 *     "delta": 4, "eps": 0.2,    intellect2: ratio cap, clip range (eps: decoupled_ppo's clip range too)
 *     "eps_low": 0.2,            dapo, cispo: the ratio (cispo: its detached coefficient) is clipped
 *     "eps_high": 0.28,          to [1 - eps_low, 1 + eps_high]
 *     "dppo_mask_low": 0.2,      dppo_kl: masks a token whose probability fell by more (A <= 0)
 *     "dppo_mask_high": 0.2,     or rose by more (A > 0) than this since it was sampled
 *     "ipo_threshold": 0.1,      ipo: masks a token whose probability moved by more, either way
 *     "adv_tau": 1,              dppo_kl, ipo: the advantage's scale
 *     "kl_tau": 0.001,           dppo_kl, ipo: weight of (logp - logp_old)^2
 *     "gspo_eps_low": 3e-4,      gspo: the sequence's ratio is clipped to [1 - gspo_eps_low, 1 + gspo_eps_high]
 *     "gspo_eps_high": 4e-4,     (the GSPO paper's; its loss is per sequence: "normalize": "sequence")
 *     "behav_cap": 5,            decoupled_ppo: the behaviour weight pi_prox / pi_behav above this is
 *     "behav_weight": "mask",    0 ("mask", AReaL's) or the cap ("truncate", TIS)
 *     "normalize": "budget"      the step's sum over: "budget" (token_budget, below), "tokens" (the completion
 *   },                           tokens trained in the step), "sequence" (each completion's mean, averaged)                           written only when not the default (stored configs stay as they were)
 *   "advantage": {"type": "group_std"}, group_std: (r - mean) / (std + eps) over the group (INTELLECT-2);
 *                                group_mean: r - mean (Dr. GRPO, prime-rl's default); written when not group_std
 *   "reward": {"program": "python3 rubric.py"}  every task scored by reward programs instead of its own check
 *                                (vks_tasks.h), run in the directory the run started in; or "rubric": [{"program",
 *                                "weight"}, ...]; "sandbox": false, "timeout_s": as a task line's; written when given
 *   "roles": {
 *     "orchestrator": 0,         owns tasks, batching and metrics; may share a rank
 *     "trainer": 0,              exactly one
 *     "inference": [[1], [2, 3]],a list of groups; a group of S ranks is a pipeline of S stages
 *     "verifiers": [4],          0 or more
 *     "relays": []               broadcast relays, 0 or more
 *   }
 * }
 * Without "roles" every role runs on rank 0 (one machine). Trainer,
 * inference, verifier and relay ranks are disjoint; the orchestrator is the
 * trainer's rank or a rank of its own (default 0). Unknown keys, duplicate or out-of-range ranks, a rank without a
 * role, and values out of range are refused, naming the key. An RL run stores
 * the whole config in each checkpoint (vks_rl_config_to_json; vks_rl.h
 * vks_rl_stored), and a resume merges what it is given over it
 * (vks_rl_config_resume). */
#ifndef VKS_RL_CONFIG_H
#define VKS_RL_CONFIG_H
#include "vks_common.h"
#include "vks_prompt.h"
#include "vks_grpo.h"
#include "vks_train_types.h"

#define VKS_RL_MAX_RANKS 4096
#define VKS_RL_MAX_GROUPS 256
#define VKS_RL_MAX_LENGTH_TARGETS 16
#define VKS_RL_MAX_REWARD 16384 /* bytes of the "reward" block as compact JSON */
#define VKS_RL_MAX_OFF_POLICY_STEPS 8     /* max_off_policy_steps' default (prime-rl's) */
#define VKS_RL_PROBATION_BATCHES 8        /* probation_batches' default */
#define VKS_RL_MAX_CONFIG_BYTES (1 << 20) /* a config file */

typedef struct {
    int first, n;              /* ranks inference_ranks[first .. first + n) form one pipeline group */
} vks_rl_group;

/* "loss": the type and every type's knobs (vks_rl_loss_params maps them). */
/* "loss.normalize": what the step's summed loss is divided by. */
typedef enum {
    VKS_NORMALIZE_BUDGET = 0, /* token_budget, or prompts_per_step x group_size x max_new_tokens (INTELLECT-2) */
    VKS_NORMALIZE_TOKENS,     /* the completion tokens trained in the step (DAPO's and prime-rl's token mean) */
    VKS_NORMALIZE_SEQUENCE    /* each completion's mean over its tokens, averaged over the step's completions
                               * (GRPO's original sample mean) */
} vks_loss_normalize;

typedef struct {
    vks_loss_type type;
    vks_loss_normalize normalize;
    double delta, eps, eps_low, eps_high, dppo_mask_low, dppo_mask_high, ipo_threshold, adv_tau, kl_tau;
    double gspo_eps_low, gspo_eps_high;
    double behav_cap;          /* decoupled_ppo */
    bool behav_truncate;       /* "behav_weight": "truncate" (else "mask") */
} vks_rl_loss;

/* "buffer": how a batch's tasks are drawn from a task file. simple: in file order, cycled (task index
 * mod the task count). difficulty_pool (prime-rl's): each task is in the easy pool (its latest group's
 * solve rate above easy_threshold), the hard pool (at most hard_threshold) or the normal pool (the rest,
 * and every task not yet seen); a batch's task is drawn from a pool chosen with the pools' weights
 * (empty pools left out), then uniformly within it. */
typedef struct {
    bool difficulty_pool;      /* "type": "difficulty_pool" (else "simple") */
    double easy_threshold, hard_threshold, easy_weight, normal_weight, hard_weight;
} vks_rl_buffer;

typedef struct {
    char task[512], init[16], model[1024], out[1024], shardcast_key[1024], eval_tasks[1024];
    double eval_split;
    int steps, prompts_per_step, group_size, async_level, max_new_tokens, save_every, keep, warmup;
    int max_off_policy_steps;  /* prime-rl's: a group more steps older than the weights it trains is dropped */
    int probation_batches;     /* a joined key's first batches: every group replayed by a verifier rank */
    double temperature, lr, length_penalty, token_budget, entropy_coef, verify_sample;
    uint64_t seed;
    int length_targets[VKS_RL_MAX_LENGTH_TARGETS], n_length_targets;
    vks_prompt_format prompt;
    int lora_rank;             /* "lora": rank (0: full fine-tuning), alpha, targets (vks_lora.h bits) */
    double lora_alpha;
    uint32_t lora_targets;
    vks_rl_loss loss;
    vks_advantage_type advantage;
    vks_rl_buffer buffer;
    char reward[VKS_RL_MAX_REWARD]; /* "reward": every task scored by reward programs instead of its own check
                                     * ({"program" | "rubric", "sandbox", "timeout_s"} as compact JSON; "": none) */
    /* roles */
    bool roles_given;
    int orchestrator, trainer;
    int inference_ranks[VKS_RL_MAX_RANKS], n_inference_ranks;
    vks_rl_group groups[VKS_RL_MAX_GROUPS];
    int n_groups;
    int verifiers[VKS_RL_MAX_RANKS], n_verifiers;
    int relays[VKS_RL_MAX_RANKS], n_relays;
    uint64_t given;            /* keys a config file or KEY=VALUE set (vks_rl_config_given); not stored */
} vks_rl_config;

/* The loss's parameters for the trainer: c's loss type and knobs, the step's
 * normaliser (token_budget: the one loss.normalize gives) and entropy bonus
 * (kl_beta 0). */
void vks_rl_loss_params(const vks_rl_config *c, double token_budget, vks_grpo_loss_params *h);
/* "budget", "tokens", "sequence". */
const char *vks_loss_normalize_name(vks_loss_normalize n);
/* "group_std", "group_mean". */
const char *vks_advantage_type_name(vks_advantage_type t);
/* The defaults (above). */
void vks_rl_config_defaults(vks_rl_config *c);
/* Reads a JSON file over c (keys not in the file keep their values). Errors
 * name the file and the key. */
int vks_rl_config_load(vks_rl_config *c, const char *path);
/* Sets one key from text ("steps=10", "roles.trainer=1",
 * "length_targets=64,128", "roles.inference=1;2,3" for groups {1} and {2,3},
 * "prompt.chat_template=qwen3", "prompt.think=false"). */
int vks_rl_config_set(vks_rl_config *c, const char *assignment);
/* Whether `key` (a key above, "length_targets", "roles" or "prompt") was set
 * by vks_rl_config_load or vks_rl_config_set since vks_rl_config_defaults. */
bool vks_rl_config_given(const vks_rl_config *c, const char *key);
/* Marks `key` given, for a value set another way (the CLI's prompt flags set
 * c->prompt through vks_prompt_set and mark "prompt"). */
void vks_rl_config_mark_given(vks_rl_config *c, const char *key);
/* The whole configuration as a JSON object (every key, "prompt" whole; "roles" only when
 * given), reals exact: malloc'd text, NULL when out of memory. What an RL
 * run stores in its checkpoints (vks_rl.h) and vks_rl_config_parse reads. */
char *vks_rl_config_to_json(const vks_rl_config *c);
/* Every key of c for a listing (the run report): the keys of
 * vks_rl_config_to_json in its order, objects flattened ("prompt.system",
 * "lora.rank" also at rank 0, "roles.trainer" when roles were given, as
 * vks_rl_config_check filled them otherwise), each value as JSON text and
 * whether it is the default's (roles: not given). */
typedef void (*vks_rl_config_visit)(void *ctx, const char *key, const char *value, bool is_default);
int vks_rl_config_each(const vks_rl_config *c, vks_rl_config_visit fn, void *ctx);
/* Reads JSON text (an object, as in a config file) over c; errors name `where`. */
int vks_rl_config_parse(vks_rl_config *c, const char *json, const char *where);
/* Resuming: c (defaults, then a config file and KEY=VALUE) over what the
 * checkpoint `where` stored (stored): keys c was not given take the stored
 * values, given ones keep c's. A given key whose value differs from the stored
 * one is refused (VKS_ERR_ARG: "resume: KEY was OLD in WHERE, now NEW
 * (--override to allow)") unless it may change on resume (out, steps,
 * save_every, keep: where and how long the run goes, not what it does) or
 * `override`; task and prompts_per_step are refused even then (the rollout
 * position is in their terms). With override, changed gets "KEY OLD -> NEW"
 * for each such key, comma-separated ("" when none). */
int vks_rl_config_resume(vks_rl_config *c, const vks_rl_config *stored, const char *where, bool override, char *changed,
                         size_t cap);
/* Checks values and roles against n_ranks started; without roles, assigns
 * every role to rank 0 (n_ranks must then be 1). */
int vks_rl_config_check(vks_rl_config *c, int n_ranks);
/* How many ranks the roles name: 1 + the highest rank named (1 without roles). */
int vks_rl_config_ranks_named(const vks_rl_config *c);
/* Whether a run with these roles across ranks trains on multi-turn episodes (environment tasks): with one
 * rank per inference group (for now: a pipeline group's turns are not built); verifier ranks replay every
 * turn. A run on one process always does. */
bool vks_rl_config_episodes_across_ranks(const vks_rl_config *c);
/* What rank r does: a bit set of VKS_RL_ROLE_*. */
enum { VKS_RL_ROLE_ORCHESTRATOR = 1, VKS_RL_ROLE_TRAINER = 2, VKS_RL_ROLE_INFERENCE = 4, VKS_RL_ROLE_VERIFIER = 8,
       VKS_RL_ROLE_RELAY = 16 };
int vks_rl_config_roles_of(const vks_rl_config *c, int rank);
#endif
