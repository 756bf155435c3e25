/* vks_sft.h: supervised fine-tuning runs (src/rl/sft.c): the loop that joins
 * the data (vks_sft_data.h), the GPU trainer (vks_train.h), checkpoints
 * (vks_checkpoint.h) and metrics (vks_metrics.h); and evaluation of a model
 * on such data (mean loss and token accuracy of the completions). */
#ifndef VKS_SFT_H
#define VKS_SFT_H
#include "vks_gpu.h"
#include "vks_model.h"
#include "vks_ref_grad.h"

struct vks_tokenizer;

typedef struct {
    int64_t step, steps;       /* steps done, of steps */
    double loss, lr, grad_norm;
    double tokens_per_s;       /* loss tokens per second over this run so far */
    double elapsed_s;
} vks_sft_progress;

typedef struct {
    const vks_model *model;            /* the start (ignored on resume: the checkpoint is the start) */
    const struct vks_tokenizer *tok;   /* the model's tokenizer */
    const char *data_path;             /* JSONL: {"prompt","completion"} or {"text"} lines */
    const char *out_dir;               /* checkpoints OUT/step-N, metrics.jsonl, loss.svg; one run at a time
                                        * (OUT/vkswarm.lock); a fresh run refuses an OUT holding an earlier
                                        * run's step-N, metrics.jsonl or loss.svg */
    int steps;                         /* optimizer steps (total, a resume included) */
    int batch;                         /* sequences per step */
    int micro_batch;                   /* sequences per micro-batch (forward + backward); <= batch */
    vks_lr_schedule schedule;          /* lr, warm-up, constant or cosine */
    vks_adamw_params adamw;            /* betas, eps, weight decay (lr comes from the schedule) */
    double grad_clip;                  /* global-norm clipping; <= 0: off */
    uint64_t seed;                     /* the data order */
    int save_every;                    /* checkpoint every N steps (0: only at the end) */
    int keep;                          /* checkpoints kept (0: all) */
    bool resume;                       /* continue from the newest complete checkpoint in out_dir */
    bool recompute;                    /* recompute activations in backward */
    void (*progress)(void *ctx, const vks_sft_progress *p);
    void *progress_ctx;
    /* with resume, before training (may be NULL): the checkpoint continued
     * from (its weights replace model's) and its step, or NULL and -1 when
     * out_dir holds none (a fresh run) */
    void (*on_resume)(void *ctx, const char *checkpoint, int64_t step);
    /* A clean stop (may be NULL): asked after each step; true ends the run
     * there as if it were the last: checkpoint OUT/step-N (whatever
     * save_every says), metrics and plot, result stopped_at_step N (rc
     * VKS_OK). Never called from a signal handler: it reads a flag. */
    bool (*stop_requested)(void *ctx);
    void *stop_ctx;
    /* Resuming, a setting that differs from what the checkpoint recorded (seed,
     * lr, warmup, cosine, min_lr, weight_decay, grad_clip, batch, micro_batch)
     * is refused naming it, old and new value, unless override (then listed in
     * the result's overridden). steps may change (with cosine, the schedule
     * then ends at the new last step). */
    bool override;
    /* LoRA (lora_rank > 0): only an adapter of this rank on lora_targets
     * (0: all seven) with scale lora_alpha / rank (0: VKS_LORA_DEFAULT_ALPHA)
     * is trained, PEFT-initialised from seed, on model frozen in its file's
     * types. Checkpoints hold the adapter (vks_checkpoint.h), the base
     * model's hash recorded: a resume over another base, or with another
     * rank, alpha or targets, is refused. 0: full fine-tuning. */
    int lora_rank;
    double lora_alpha;
    uint32_t lora_targets;
    /* LoRA: also train the final norm (PEFT's modules_to_save ["norm"],
     * vks_trainer_options.lora_save_norm); the adapter directories carry it
     * and a resume must ask for it as the checkpoint holds it. */
    bool lora_save_norm;
} vks_sft_run_options;

typedef struct {
    char final_checkpoint[4096];       /* LoRA: the adapter directory (PEFT's layout) */
    char metrics_path[4096];
    char plot_path[4096];
    double first_loss, last_loss;      /* the mean loss of this run's first and last loss_window steps */
    int loss_window;                   /* steps in each mean (vks_sft_loss_window_means) */
    int64_t loss_steps;                /* this run's steps (a resumed run's since its resume) */
    int64_t resumed_from;              /* the step resumed from, -1 for a fresh run */
    int64_t stopped_at_step;           /* stop_requested ended the run after this step; -1: it ran all steps */
    char overridden[1024];             /* resumed with override: "KEY OLD -> NEW, ..." ("": nothing changed) */
    uint64_t plan_bytes;               /* the trainer's memory plan (vks_trainer_plan_bytes) */
} vks_sft_result;

/* The "loss A -> B" summary: the mean loss over the first and over the last
 * window steps of a run, window = steps / 10 clamped to [1, 20] (one
 * minibatch's loss is too noisy to compare). Add each step's loss in order. */
#define VKS_SFT_LOSS_WINDOW_MAX 20
typedef struct {
    double first[VKS_SFT_LOSS_WINDOW_MAX]; /* the first losses */
    double last[VKS_SFT_LOSS_WINDOW_MAX];  /* a ring of the newest */
    int64_t n;
} vks_sft_loss_window;
void vks_sft_loss_window_add(vks_sft_loss_window *w, double loss);
/* *window steps (0 and NaN means when none was added). */
void vks_sft_loss_window_means(const vks_sft_loss_window *w, int *window, double *first, double *last);

/* Runs the whole training; every error names the file or step. */
int vks_sft_train(vks_gpu *g, const vks_sft_run_options *o, vks_sft_result *r);

typedef struct {
    int64_t sequences, loss_tokens;
    double mean_loss;                  /* -mean log p of the loss tokens (the completions) */
    double token_accuracy;             /* fraction of loss tokens that are the model's argmax */
} vks_sft_eval_result;
/* Scores m on a JSONL file of the same form (no training). */
int vks_sft_eval(vks_gpu *g, const vks_model *m, const struct vks_tokenizer *tok, const char *data_path,
                 vks_sft_eval_result *r);
#endif
