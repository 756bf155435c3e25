/* `vkswarm train sft` and `vkswarm eval`: argument parsing around vks_sft_train and vks_sft_eval. */
#include <getopt.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include "cli_model.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_lora.h"
#include "vkswarm/vks_sft.h"
#include "vkswarm/vks_sandbox.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"

static const char train_usage[] =
    "usage: vkswarm train sft (--model M | --init tiny) --data FILE.jsonl --steps N [--batch B]\n"
    "                         [--micro-batch b] [--lr X] [--warmup N] [--cosine] [--min-lr X]\n"
    "                         [--weight-decay X] [--grad-clip X] [--out DIR] [--resume [--override]] [--seed S]\n"
    "                         [--save-every N] [--keep N] [--recompute] [--device N] [--profile]\n"
    "                         [--lora-rank R [--lora-alpha A] [--lora-targets LIST] [--lora-modules-to-save norm]]\n"
    "Supervised fine-tuning on the GPU. FILE.jsonl holds {\"prompt\": ..., \"completion\": ...} lines (the\n"
    "loss is on the completion and EOS), {\"text\": ...} lines (every token after BOS) or multi-turn\n"
    "{\"prompt\": ..., \"turns\": [{\"role\", \"content\"}, ...]} lines (the loss on each assistant turn\n"
    "and its EOS, not on the environment's messages between them: docs/rl.md \"Environments\"). Each step takes\n"
    "B sequences (default 8) in micro-batches of b (default B) whose gradients add up, then one AdamW\n"
    "step (betas 0.9, 0.95, eps 1e-8, --weight-decay 0.1) at --lr (default 1e-3) after a linear\n"
    "--warmup (default 0 steps), constant or --cosine down to --min-lr (default lr/10) at the last\n"
    "step; gradients are clipped to a global norm of --grad-clip (default 1, 0: off).\n"
    "--init tiny starts from the built-in tiny model (byte-level vocabulary) initialised from --seed,\n"
    "which also orders the data (default 0). DIR (default sft-out) gets metrics.jsonl (one JSON\n"
    "object per step: loss, lr, grad_norm, tokens_per_s), loss.svg and checkpoints DIR/step-N\n"
    "(safetensors + config.json + tokenizer, optimizer.safetensors, state.json), the last --keep\n"
    "(default 3) of them, every --save-every steps (default: only the last). --resume continues\n"
    "from the newest checkpoint in DIR, bit for bit (said on stderr, as is a DIR without one: a fresh\n"
    "run); give the same options (--steps may change): a --seed, --lr, --warmup, --cosine, --min-lr,\n"
    "--weight-decay, --grad-clip, --batch or --micro-batch other than the checkpoint's is refused, exit\n"
    "2, naming it with both values, unless --override (then said on stderr). One run at a time\n"
    "writes DIR; a fresh run refuses a DIR holding an earlier run's files.\n"
    "Ctrl-C (SIGINT) or SIGTERM stops cleanly: the current step finishes, its checkpoint, metrics and\n"
    "plot are written, and the run exits 130 with one line: 'vkswarm: train: stopped at step N;\n"
    "checkpoint DIR/step-N; continue with: PROGRAM train sft ... --resume' (this command line). A\n"
    "second signal stops at once.\n"
    "--lora-rank R trains only LoRA adapters of rank R (PEFT's initialisation from --seed; scale A / R,\n"
    "--lora-alpha A default 32) on LIST (comma-separated q, k, v, o, gate, up, down or PEFT's q_proj, ...;\n"
    "default all) over the model frozen in its file's types (f32, f16, bf16, q8_0, q4_0, q4_k; q6_k as\n"
    "f16). Checkpoints then hold the adapter in PEFT's layout (adapter_model.safetensors +\n"
    "adapter_config.json, the base model's hash recorded) with optimizer.safetensors and state.json;\n"
    "the final checkpoint is the adapter directory (--lora DIR, convert --lora, PEFT and vLLM read it).\n"
    "--lora-modules-to-save norm also trains the final norm's weight beside the adapters (PEFT's\n"
    "modules_to_save; norm is the only module supported): without it the frozen final norm and\n"
    "classifier bound the logits, and LoRA can stall on a small model (NOTES \"Training\"). The adapter\n"
    "directory then holds base_model.model.model.norm.weight and \"modules_to_save\": [\"norm\"]; --lora\n"
    "and convert --lora use it in place of the base's final norm (a GGUF adapter cannot hold it).\n"
    "--resume needs the same --model, rank, alpha, targets and modules (another base is refused naming it).\n"
    "Before training, a run whose memory plan (train plan) exceeds the device's free memory is refused,\n"
    "exit 2, with the plan in the message; at the end stderr gets the peak device memory held beside\n"
    "the plan, and the process's peak RSS.\n"
    "Progress goes to stderr; stdout gets the paths (escaped):\n"
    "  metrics: PATH\n  plot: PATH\n  final checkpoint: PATH\n"
    "vkswarm train plan --help: the device memory a run needs (full or LoRA), without a device.\n";

static const char eval_usage[] =
    "usage: vkswarm eval --model M --data FILE.jsonl [--tokenizer T] [--device N]\n"
    "       vkswarm eval --model M --task T [--n N] [--samples K] [--seed S] [--temp X] [--max-new N]\n"
    "                    [--batch B] [--chat-template NAME] [--system TEXT] [--user-template TEXT] [--no-think]\n"
    "                    [--think-tokens N [--think-template TEXT]] [--lora PATH] [--show N]\n"
    "Scores a model on a JSONL file like train sft's: prints one JSON object with the number of\n"
    "sequences and loss tokens, the mean loss (-log p per completion token) and the token accuracy\n"
    "(the fraction of completion tokens that are the model's most likely next token).\n"
    "--task T scores completions instead: T is a built-in task (add, mul, countdown, sort, reverse, code,\n"
    "calc (multi-turn episodes with a calculator: docs/rl.md \"Environments\"), optionally :SIZE, e.g.\n"
    "mul:3: N fresh instances from seed S, default 100 and 0) or a task file\n"
    "(PATH.jsonl, a path with '/', or file:PATH; docs \"Your own tasks\": its first N tasks, default all).\n"
    "Each task gets K completions (default 1; BOS + prompt, or the prompt format of --chat-template\n"
    "none|model|chatml|qwen3|llama2|llama3|llama3.1|phi3, --system, --user-template (holds {prompt}) and\n"
    "--no-think as rl takes them, docs \"Prompts\"; --think-tokens N adds the think sentence of a budget\n"
    "of N, as an RL run with that length target; the first prompt is shown on stderr; up to EOS or\n"
    "--max-new tokens, default 256;\n"
    "--temp default 0: greedy with K = 1, 1.0 with K > 1; sampled from seed S; in batches of B, default\n"
    "64), each scored by its final answer. One JSON object: task, seed, n, samples, solved (tasks with a\n"
    "correct completion), accuracy (correct completions / completions), pass@k for k = 1, 2, 4, ... and K\n"
    "(the unbiased estimator 1 - C(K-c, k) / C(K, k) per task, c correct of K, averaged), mean_length\n"
    "(completion tokens) and kinds: accuracy per task kind (a file's \"kind\", else its task_type; a\n"
    "built-in task's name); and metrics, when reward programs or environments answered some: each name's\n"
    "mean over the answers that gave it.\n"
    "--show N: before that object, one JSON line for each of the first N tasks: show (1..N), line (the\n"
    "task file's line; a built-in task's index), kind, prompt (as the model got it, chat template and\n"
    "all), expected (the reference answer) and completions: text, answer (the final answer read from\n"
    "it, or null), reward and tokens for each of its K completions.\n"
    CLI_LORA_HELP "(with --task only).\n";

typedef struct {
    cli_model_args m;
    const char *init, *data, *out;
    bool cosine, lr_min_given;
    vks_sft_run_options o;
} train_args;

static void parse_train(int argc, char **argv, train_args *a) {
    static const struct option opts[] = {
        CLI_MODEL_LONG_OPTIONS, {"init", required_argument, 0, 0}, {"data", required_argument, 0, 0},
        {"steps", required_argument, 0, 0}, {"batch", required_argument, 0, 0}, {"micro-batch", required_argument, 0, 0},
        {"lr", required_argument, 0, 0}, {"warmup", required_argument, 0, 0}, {"cosine", no_argument, 0, 0},
        {"min-lr", required_argument, 0, 0}, {"weight-decay", required_argument, 0, 0},
        {"grad-clip", required_argument, 0, 0}, {"out", required_argument, 0, 0}, {"resume", no_argument, 0, 0},
        {"seed", required_argument, 0, 0}, {"save-every", required_argument, 0, 0}, {"keep", required_argument, 0, 0},
        {"recompute", no_argument, 0, 0}, {"override", no_argument, 0, 0}, {"lora-rank", required_argument, 0, 0},
        {"lora-alpha", required_argument, 0, 0}, {"lora-targets", required_argument, 0, 0},
        {"lora-modules-to-save", required_argument, 0, 0}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    vks_sft_run_options *o = &a->o;
    bool lora_given = false;
    *o = (vks_sft_run_options){.batch = 8, .schedule = {.lr = 1e-3}, .grad_clip = 1.0, .keep = 3,
                               .adamw = {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1}};
    a->out = "sft-out";
    a->m.device = -1;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(train_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (!strcmp(name, "init")) a->init = optarg;
        else if (!strcmp(name, "data")) a->data = optarg;
        else if (!strcmp(name, "steps")) o->steps = (int)cli_parse_long("--steps", optarg, 1, 100000000);
        else if (!strcmp(name, "batch")) o->batch = (int)cli_parse_long("--batch", optarg, 1, 1 << 20);
        else if (!strcmp(name, "micro-batch")) o->micro_batch = (int)cli_parse_long("--micro-batch", optarg, 1, 1 << 20);
        else if (!strcmp(name, "lr")) o->schedule.lr = cli_parse_double("--lr", optarg, 0, 10);
        else if (!strcmp(name, "warmup")) o->schedule.warmup_steps = (int)cli_parse_long("--warmup", optarg, 0, 100000000);
        else if (!strcmp(name, "cosine")) a->cosine = true;
        else if (!strcmp(name, "min-lr")) o->schedule.min_lr = cli_parse_double("--min-lr", optarg, 0, 10), a->lr_min_given = true;
        else if (!strcmp(name, "weight-decay")) o->adamw.weight_decay = cli_parse_double("--weight-decay", optarg, 0, 10);
        else if (!strcmp(name, "grad-clip")) o->grad_clip = cli_parse_double("--grad-clip", optarg, 0, 1e9);
        else if (!strcmp(name, "out")) a->out = optarg;
        else if (!strcmp(name, "resume")) o->resume = true;
        else if (!strcmp(name, "seed")) o->seed = cli_parse_u64("--seed", optarg);
        else if (!strcmp(name, "save-every")) o->save_every = (int)cli_parse_long("--save-every", optarg, 0, 100000000);
        else if (!strcmp(name, "keep")) o->keep = (int)cli_parse_long("--keep", optarg, 0, 1000000);
        else if (!strcmp(name, "recompute")) o->recompute = true;
        else if (!strcmp(name, "override")) o->override = true;
        else if (!strcmp(name, "lora-rank")) o->lora_rank = (int)cli_parse_long("--lora-rank", optarg, 1, 1 << 20);
        else if (!strcmp(name, "lora-alpha"))
            o->lora_alpha = cli_parse_double("--lora-alpha", optarg, 1e-6, 1e6), lora_given = true;
        else if (!strcmp(name, "lora-targets")) {
            if (vks_lora_parse_targets(optarg, &o->lora_targets, "--lora-targets"))
                cli_usage_error("train", "%s", vks_last_error());
            lora_given = true;
        } else if (!strcmp(name, "lora-modules-to-save")) {
            if (strcmp(optarg, "norm"))
                cli_usage_error("train", "--lora-modules-to-save: '%s' is not supported (supported: norm, the final "
                                "norm)", optarg);
            o->lora_save_norm = lora_given = true;
        }
    }
    if (lora_given && !o->lora_rank) cli_usage_error("train", "--lora-alpha, --lora-targets and --lora-modules-to-save go with --lora-rank R");
    if (o->override && !o->resume) cli_usage_error("train", "--override applies to --resume only");
    if (optind >= argc || strcmp(argv[optind], "sft")) cli_usage_error("train", "the kinds of training are 'sft' and 'plan'");
    if (optind + 1 < argc) cli_usage_error("train", "unexpected argument '%s'", argv[optind + 1]);
    cli_no_kv_type(&a->m, "train");
    if (!a->data || !o->steps) cli_usage_error("train", "--data FILE and --steps N are required");
    if (!!a->init + !!a->m.model_path + !!a->m.random_spec != 1)
        cli_usage_error("train", "give exactly one of --model, --random-model and --init tiny");
    if (a->init && strcmp(a->init, "tiny")) cli_usage_error("train", "--init '%s' is not 'tiny'", a->init);
    if (!o->micro_batch) o->micro_batch = o->batch;
    if (o->micro_batch > o->batch) cli_usage_error("train", "--micro-batch %d exceeds --batch %d", o->micro_batch, o->batch);
    o->schedule.cosine = a->cosine;
    o->schedule.total_steps = o->steps;
    if (!a->lr_min_given) o->schedule.min_lr = o->schedule.lr / 10;
    o->data_path = a->data;
    o->out_dir = a->out;
}

static void on_progress(void *ctx, const vks_sft_progress *p) {
    cli_progress *bar = ctx;
    char what[96];
    snprintf(what, sizeof what, "train: loss %.4f, lr %.2e, grad norm %.3f, %.0f tokens/s", p->loss, p->lr,
             p->grad_norm, p->tokens_per_s);
    bar->what = what;
    cli_progress_update(bar, (long)p->step, (long)p->steps, "steps");
    bar->what = "train";
}

/* The device memory the run's buffers held at their peak beside the trainer's
 * plan, and the process's peak resident memory (on a CPU driver such as
 * lavapipe the "device" memory is host memory, counted there too). */
static void print_memory(const vks_gpu *g, uint64_t plan_bytes) {
    uint64_t peak = vks_gpu_peak_bytes(g);
    struct rusage ru;
    double rss_mib = getrusage(RUSAGE_SELF, &ru) ? -1 : (double)ru.ru_maxrss / 1024;
    fprintf(stderr, "vkswarm: train: device memory: peak %.1f MiB, plan %.1f MiB (peak/plan %.4f); process peak RSS %.1f MiB\n",
            (double)peak / (1 << 20), (double)plan_bytes / (1 << 20), plan_bytes ? (double)peak / (double)plan_bytes : 0,
            rss_mib);
}

/* The model and tokenizer a command starts from: --init tiny, or --model with its tokenizer. */
static vks_model *load_start(cli_model_args *m, const char *init, uint64_t seed, vks_tokenizer **tok) {
    vks_model *model = NULL;
    if (init) {
        if (vks_model_init_tiny(seed, &model, tok)) cli_die(1, "%s", vks_last_error());
        return model;
    }
    model = cli_load_model(m);
    if (vks_tokenizer_load_auto(m->tokenizer_path, model, tok))
        cli_die(EXIT_BAD_INPUT, "%s (training needs the model's tokenizer: --tokenizer)", vks_last_error());
    return model;
}

/* A library call failed after the device was opened: its message, then the
 * device, model and tokenizer freed (exiting with them held leaked the GPU
 * context under LeakSanitizer), then the status to return. */
static int fail_freeing(int rc, vks_gpu *g, vks_model *m, vks_tokenizer *tok) {
    cli_note("%s", vks_last_error());
    cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1;
}

int cmd_train(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "plan")) return cmd_train_plan(argc - 1, argv + 1);
    train_args a = {0};
    parse_train(argc, argv, &a);
    cli_stop_install(); /* before the model loads: a signal from here on stops after a step */
    vks_tokenizer *tok = NULL;
    vks_model *m = load_start(&a.m, a.init, a.o.seed, &tok);
    if (vks_tokenizer_check_dir_files(tok)) /* checkpoints hold it: refused now, not at the first save */
        cli_die(EXIT_BAD_INPUT, "%s (checkpoints could not hold the tokenizer)", vks_last_error());
    vks_gpu *g = cli_open_gpu(&a.m);
    cli_progress bar;
    cli_progress_start(&bar, "train");
    a.o.model = m;
    a.o.tok = tok;
    a.o.progress = on_progress;
    a.o.on_resume = cli_on_resume_train;
    a.o.progress_ctx = &bar;
    a.o.stop_requested = cli_stop_requested;
    vks_sft_result r;
    int rc = vks_sft_train(g, &a.o, &r);
    if (rc) return fail_freeing(rc, g, m, tok);
    if (r.overridden[0]) cli_note("train: --override: resumed with %s", r.overridden);
    cli_progress_end(&bar, r.stopped_at_step >= 0 ? (long)r.stopped_at_step : (long)a.o.steps, "steps");
    fprintf(stderr, "vkswarm: train: loss %.4f -> %.4f (mean of the first and of the last %d of %lld steps%s)\n",
            r.first_loss, r.last_loss, r.loss_window, (long long)r.loss_steps, r.resumed_from >= 0 ? " since the resume" : "");
    print_memory(g, r.plan_bytes);
    cli_put_path_line("metrics", r.metrics_path);
    cli_put_path_line("plot", r.plot_path);
    cli_put_path_line("final checkpoint", r.final_checkpoint);
    if (a.o.lora_rank) cli_put_path_line("adapter", r.final_checkpoint);
    if (r.stopped_at_step >= 0) { /* the same command line with --resume continues it */
        bool has_resume = false;
        const char **args = malloc(sizeof *args * (size_t)(argc + 2));
        if (!args) return fail_freeing(vks_set_error(VKS_ERR_NOMEM, "out of memory"), g, m, tok);
        args[0] = "train", args[1] = "sft"; /* getopt moved "sft" to the end of argv */
        int n = 2;
        for (int i = 1; i + 1 < argc; i++) args[n++] = argv[i], has_resume = has_resume || !strcmp(argv[i], "--resume");
        if (!has_resume) args[n++] = "--resume";
        cli_stop_line("train", r.stopped_at_step, r.final_checkpoint, n, args);
        free(args);
    }
    if (a.m.profile) cli_print_profile(g);
    rc = cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc ? rc : r.stopped_at_step >= 0 ? EXIT_STOPPED : 0;
}

typedef struct {
    const char *task;
    int64_t n, show;
    uint64_t seed;
    bool n_given, temp_given;
    vks_task_run_options o;
    vks_prompt_format prompt;
} task_eval_args;

static void print_task_eval(const task_eval_args *ta, const char *name, const vks_task_eval_result *r) {
    printf("{\"task\": ");
    cli_json_string(stdout, name, strlen(name));
    printf(", \"seed\": %llu, \"n\": %lld, \"samples\": %d, \"solved\": %lld, \"accuracy\": %.6f",
           (unsigned long long)ta->seed, (long long)r->n, r->samples, (long long)r->solved, r->accuracy);
    for (int i = 0; i < r->n_pass; i++) printf(", \"pass@%d\": %.6f", r->pass_k[i], r->pass_at[i]);
    printf(", \"mean_length\": %.3f, \"kinds\": {", r->mean_length);
    for (int k = 0; k < r->n_kinds; k++) {
        printf(k ? ", " : "");
        cli_json_string(stdout, r->kinds[k].kind, strlen(r->kinds[k].kind));
        printf(": {\"n\": %lld, \"accuracy\": %.6f}", (long long)r->kinds[k].n, r->kinds[k].accuracy);
    }
    printf("}");
    if (r->n_metrics) printf(", \"metrics\": {");
    for (int k = 0; k < r->n_metrics; k++) { /* names are [A-Za-z0-9_.-] (vks_task_metrics_add) */
        printf("%s\"%s\": ", k ? ", " : "", r->metric_names[k]);
        printf(isfinite(r->metric_means[k]) ? "%.6g" : "null", r->metric_means[k]);
    }
    printf(r->n_metrics ? "}}\n" : "}\n");
}

/* eval --show N: the first N tasks and their completions, kept as they are scored. */
typedef struct {
    int64_t n; /* tasks shown */
    int samples;
    vks_task *tasks;
    char **text; /* [n * samples], NUL-terminated */
    size_t *len;
    int *tokens;
    double *reward;
    bool failed; /* out of memory */
} shown_set;

static void keep_completion(void *ctx, const vks_task *task, int64_t c, const char *text, size_t len, int tokens,
                            double reward) {
    shown_set *s = ctx;
    if (c / s->samples >= s->n || s->failed) return;
    if (c % s->samples == 0) s->tasks[c / s->samples] = *task;
    if (!(s->text[c] = malloc(len + 1))) {
        s->failed = true;
        return;
    }
    memcpy(s->text[c], text, len);
    s->text[c][len] = 0;
    s->len[c] = len, s->tokens[c] = tokens, s->reward[c] = reward;
}

static void shown_alloc(shown_set *s, int64_t n, int samples) {
    *s = (shown_set){.n = n, .samples = samples};
    size_t k = (size_t)n * (size_t)samples;
    s->tasks = calloc((size_t)n, sizeof *s->tasks), s->text = calloc(k, sizeof *s->text);
    s->len = calloc(k, sizeof *s->len), s->tokens = calloc(k, sizeof *s->tokens), s->reward = calloc(k, sizeof *s->reward);
    if (!s->tasks || !s->text || !s->len || !s->tokens || !s->reward) cli_die(1, "out of host memory");
}

static void shown_free(shown_set *s) {
    for (int64_t c = 0; s->text && c < s->n * s->samples; c++) free(s->text[c]);
    free(s->tasks), free(s->text), free(s->len), free(s->tokens), free(s->reward);
}

static void put_json_text(const char *key, const char *s, size_t len) {
    printf(", \"%s\": ", key);
    cli_json_string(stdout, s, len);
}

/* One JSON line per shown task (stdout: results; every string JSON-escaped). */
static void print_shown(const shown_set *s, const vks_task_run_options *o, const vks_tokenizer *tok) {
    if (s->failed) cli_die(1, "eval --show: out of host memory");
    for (int64_t i = 0; i < s->n; i++) {
        const vks_task *t = &s->tasks[i];
        char *prompt = NULL, answer[VKS_TASK_MAX_ANSWER];
        size_t plen = 0;
        if (vks_prompt_text(o->prompt, vks_tokenizer_chat_template(tok), t->prompt, o->think_tokens, &prompt, &plen))
            cli_die(1, "%s", vks_last_error());
        printf("{\"show\": %lld, \"line\": %lld", (long long)i + 1, (long long)t->line);
        put_json_text("kind", t->kind, strlen(t->kind));
        put_json_text("prompt", prompt, plen);
        put_json_text("expected", t->answer, strlen(t->answer));
        printf(", \"completions\": [");
        for (int j = 0; j < s->samples; j++) {
            int64_t c = i * s->samples + j;
            printf("%s{\"text\": ", j ? ", " : "");
            cli_json_string(stdout, s->text[c], s->len[c]);
            if (vks_task_extract_answer(s->text[c], s->len[c], answer, sizeof answer)) put_json_text("answer", answer, strlen(answer));
            else printf(", \"answer\": null");
            printf(", \"reward\": %g, \"tokens\": %d}", s->reward[c], s->tokens[c]);
        }
        printf("]}\n");
        free(prompt);
    }
}

/* eval --task: a task file's first n tasks (all without --n) or n fresh
 * instances of a built-in task, completed and verified. */
static int eval_task(cli_model_args *ma, const task_eval_args *ta) {
    vks_task_spec spec;
    const char *path = NULL;
    if (vks_task_resolve(ta->task, &spec, &path)) cli_usage_error("eval", "%s", vks_last_error());
    vks_task *tasks = NULL;
    int64_t n = 0;
    if (path && vks_task_file_load(path, &tasks, &n)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    int64_t n_loaded = n; /* what vks_task_free frees */
    if (path && ta->n_given && ta->n < n) n = ta->n;
    if (vks_task_first_code(tasks, n) && vks_sandbox_check()) cli_die(EXIT_FAILURE, "eval: %s", vks_last_error());
    vks_tokenizer *tok = NULL;
    vks_model *m = load_start(ma, NULL, 0, &tok);
    cli_check_prompt("eval", &ta->prompt, tok, 0);
    vks_gpu *g = cli_open_gpu(ma);
    vks_task_run_options o = ta->o;
    o.engine = ma->engine;
    o.lora = ma->lora;
    o.prompt = &ta->prompt, o.show_prompt = cli_show_prompt, o.progress_ctx = "eval";
    if (!ta->temp_given && o.samples > 1) o.temperature = 1.0f; /* K greedy completions would all be the same */
    shown_set shown = {0};
    if (ta->show) {
        shown_alloc(&shown, ta->show < (path ? n : ta->n) ? ta->show : (path ? n : ta->n), o.samples);
        o.on_completion = keep_completion, o.completion_ctx = &shown;
    }
    vks_task_eval_result *r = malloc(sizeof *r);
    if (!r) return vks_task_free(tasks, n_loaded), fail_freeing(vks_set_error(VKS_ERR_NOMEM, "out of memory"), g, m, tok);
    int rc = path ? vks_task_eval_tasks(g, m, tok, tasks, n, &o, r) : vks_task_eval(g, m, tok, &spec, ta->seed, ta->n, &o, r);
    if (rc) return free(r), vks_task_free(tasks, n_loaded), shown_free(&shown), vks_lora_adapter_free(ma->lora), ma->lora = NULL,
                   fail_freeing(rc, g, m, tok);
    print_shown(&shown, &o, tok);
    shown_free(&shown);
    char name[32];
    vks_task_spec_name(&spec, name, sizeof name);
    print_task_eval(ta, path ? path : name, r);
    free(r);
    vks_task_free(tasks, n_loaded);
    rc = cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    cli_free_model(ma, m);
    return rc;
}

/* The --task options; false when name is not one of them. */
static bool task_option(task_eval_args *ta, const char *name, const char *val) {
    if (!strcmp(name, "task")) ta->task = val;
    else if (!strcmp(name, "n")) ta->n = cli_parse_long("--n", val, 1, 10000000), ta->n_given = true;
    else if (!strcmp(name, "samples")) ta->o.samples = (int)cli_parse_long("--samples", val, 1, 1024);
    else if (!strcmp(name, "seed")) ta->seed = ta->o.seed = cli_parse_u64("--seed", val);
    else if (!strcmp(name, "temp")) ta->o.temperature = (float)cli_parse_double("--temp", val, 0, 100), ta->temp_given = true;
    else if (!strcmp(name, "max-new")) ta->o.max_new_tokens = (int)cli_parse_long("--max-new", val, 1, 1 << 20);
    else if (!strcmp(name, "batch")) ta->o.batch = (int)cli_parse_long("--batch", val, 1, 4096);
    else if (!strcmp(name, "think-tokens")) ta->o.think_tokens = (int)cli_parse_long("--think-tokens", val, 1, 1 << 20);
    else if (!strcmp(name, "show")) ta->show = cli_parse_long("--show", val, 1, 1 << 20);
    else if (!cli_prompt_option(&ta->prompt, "eval", name, val)) return false;
    return true;
}

int cmd_eval(int argc, char **argv) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, CLI_LORA_LONG_OPTION, {"data", required_argument, 0, 0},
                                         {"task", required_argument, 0, 0}, {"n", required_argument, 0, 0},
                                         {"seed", required_argument, 0, 0}, {"temp", required_argument, 0, 0},
                                         {"max-new", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
                                         {"samples", required_argument, 0, 0}, {"show", required_argument, 0, 0},
                                         CLI_PROMPT_LONG_OPTIONS,
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    cli_model_args ma = {.device = -1};
    task_eval_args ta = {.n = 100, .o = {.samples = 1}};
    vks_prompt_format_default(&ta.prompt);
    const char *data = NULL;
    bool task_only = false; /* a --task option was given */
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(eval_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&ma, name, optarg)) continue;
        if (!strcmp(name, "data")) data = optarg;
        else if (task_option(&ta, name, optarg) && strcmp(name, "task")) task_only = true;
    }
    if (optind < argc) cli_usage_error("eval", "unexpected argument '%s'", argv[optind]);
    cli_no_kv_type(&ma, "eval");
    if (!ma.model_path || !!data + !!ta.task != 1) cli_usage_error("eval", "--model M and one of --data FILE and --task NAME are required");
    if (data && task_only)
        cli_usage_error("eval", "--n, --samples, --seed, --temp, --max-new, --batch, --show and the prompt flags go with "
                        "--task");
    if (data && ma.lora_path) cli_usage_error("eval", "--lora goes with --task (the --data loss has no adapters yet)");
    if (vks_prompt_check(&ta.prompt)) cli_usage_error("eval", "%s", vks_last_error());
    if (ta.task) return eval_task(&ma, &ta);
    vks_tokenizer *tok = NULL;
    vks_model *m = load_start(&ma, NULL, 0, &tok);
    vks_gpu *g = cli_open_gpu(&ma);
    vks_sft_eval_result r;
    int rc = vks_sft_eval(g, m, tok, data, &r);
    if (!rc && !(isfinite(r.mean_loss) && isfinite(r.token_accuracy))) /* JSON has no nan or inf */
        rc = vks_set_error(VKS_ERR_FORMAT, "eval: the mean loss over %s is %s, not a finite number: the model's "
                           "activations overflow (weights too large?)", data, isnan(r.mean_loss) ? "NaN" : "infinite");
    if (rc) return fail_freeing(rc, g, m, tok);
    printf("{\"sequences\": %lld, \"loss_tokens\": %lld, \"mean_loss\": %.6f, \"token_accuracy\": %.6f}\n",
           (long long)r.sequences, (long long)r.loss_tokens, r.mean_loss, r.token_accuracy);
    if (ma.profile) cli_print_profile(g);
    rc = cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc;
}
