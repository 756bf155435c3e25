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
} vks_sft_run_options;

typedef struct {
    char final_checkpoint[4096];
    char metrics_path[4096];
    char plot_path[4096];
    double first_loss, last_loss;
    int64_t resumed_from;              /* the step resumed from, -1 for a fresh run */
} vks_sft_result;

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
