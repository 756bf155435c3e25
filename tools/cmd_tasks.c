/* `vkswarm tasks sft`, `vkswarm tasks filter` and `vkswarm tasks score`: argument parsing around
 * vks_task_write_sft, vks_task_filter and vks_task_score_file. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include "cli_model.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_tasks.h"
#include "vkswarm/vks_tokenizer.h"

static const char tasks_usage[] =
    "usage: vkswarm tasks sft --task NAME --out FILE.jsonl [--n N] [--seed S]\n"
    "       vkswarm tasks filter --model M --task FILE.jsonl --out KEPT.jsonl [--rates-out R.jsonl]\n"
    "                            [--samples K] [--min X] [--max X] [--temp X] [--seed S] [--max-new N]\n"
    "                            [--batch B] [--tokenizer T] [--chat-template NAME] [--system TEXT]\n"
    "                            [--user-template TEXT] [--no-think] [--think-tokens N [--think-template TEXT]]\n"
    "       vkswarm tasks score --task FILE.jsonl --completions C.jsonl [--parallel N]\n"
    "tasks sft writes N (default 1000) instances of a built-in task (add, mul, countdown, sort, reverse,\n"
    "code, calc, optionally :SIZE, e.g. mul:3) from seed S (default 0) as {\"prompt\", \"completion\"}\n"
    "lines (calc: {\"prompt\", \"turns\"} episodes: one calculator call, its result, the answer) with\n"
    "a short worked completion ending in the answer line (code: the reference in a ``` block), for\n"
    "`vkswarm train sft`.\n"
    "tasks filter completes each task of the task file FILE (--tasks is the same option; docs \"Your own\n"
    "tasks\": {\"prompt\", \"answer\", \"task_type\", ...} lines; task_type exact, numeric, list, boxed,\n"
    "countdown with \"numbers\" and \"target\", or code with tests; optionally \"kind\") K times (default 8,\n"
    "at --temp default 1.0, sampled from seed S) and copies the lines whose solve rate lies in [--min,\n"
    "--max] (default 0.1 and 0.8) to KEPT as they were: the offline difficulty filter. Each task's\n"
    "solve rate goes to R (default KEPT with .rates.jsonl for .jsonl), one line per task: {\"line\",\n"
    "\"kind\", \"solved\", \"samples\", \"solve_rate\", \"verdict\": \"hard\" (below --min), \"kept\" or \"easy\"\n"
    "(above --max)}. stdout gets one\n"
    "JSON object: total, hard, kept and easy counts, and the two files. Prompts are BOS + the task's\n"
    "text, or in the prompt format of --chat-template, --system, --user-template, --no-think and\n"
    "--think-tokens (as eval takes them, docs \"Prompts\"; the first one is shown on stderr): filter\n"
    "with the format the run will train with.\n"
    "tasks score checks completions without a model: C holds lines {\"task\": LINE, \"completion\": TEXT,\n"
    "\"id\": ANY (optional)}, LINE a line number of FILE. stdout gets one JSON line per completion, in order:\n"
    "{\"id\", \"line\" (in C), \"task\", \"reward\", \"why\"} (why: the answer read and the one expected, or\n"
    "for code tasks the first failing case, a timeout or a sandbox limit hit). C is checked whole first.\n"
    "Code tasks (task_type \"code\": docs/tasks.md) run the completion's last ``` block with python3 in a\n"
    "bubblewrap sandbox against every case, N runs at once (default: the cores). Reward program tasks\n"
    "(task_type \"program\": docs/rl.md \"Reward programs\") ask the line's program, kept running.\n"
    "Environment tasks (task_type \"environment\" or \"calc\": docs/rl.md \"Environments\") replay an\n"
    "episode: the line gives the assistant's \"turns\": [TEXT, ...] (or one \"completion\") and\n"
    "optionally \"seed\" (default 0); the output adds \"turns\" and the conversation's \"messages\".\n"
    "Answers are read from the completion's last `answer: ...` line or last \\boxed{...}.\n";

typedef struct {
    cli_model_args m;
    const char *task, *tasks_file, *out, *rates_out, *completions;
    int parallel;
    int64_t n;
    uint64_t seed;
    double min_rate, max_rate;
    vks_task_run_options o;
    vks_prompt_format prompt;
    bool prompt_given;
} tasks_args;

static void parse_tasks(int argc, char **argv, tasks_args *a) {
    static const struct option opts[] = {
        CLI_MODEL_LONG_OPTIONS, {"task", required_argument, 0, 0}, {"tasks", required_argument, 0, 0},
        {"out", required_argument, 0, 0}, {"n", required_argument, 0, 0}, {"seed", required_argument, 0, 0},
        {"samples", required_argument, 0, 0}, {"min", required_argument, 0, 0}, {"max", required_argument, 0, 0},
        {"temp", required_argument, 0, 0}, {"max-new", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
        {"rates-out", required_argument, 0, 0}, {"completions", required_argument, 0, 0},
        {"parallel", required_argument, 0, 0}, CLI_PROMPT_LONG_OPTIONS, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (tasks_args){.m = {.device = -1}, .n = 1000, .min_rate = 0.1, .max_rate = 0.8,
                      .o = {.samples = 8, .temperature = 1.0f}};
    vks_prompt_format_default(&a->prompt);
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(tasks_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (cli_prompt_option(&a->prompt, "tasks", name, optarg)) a->prompt_given = true;
        else if (!strcmp(name, "think-tokens"))
            a->o.think_tokens = (int)cli_parse_long("--think-tokens", optarg, 1, 1 << 20), a->prompt_given = true;
        else if (!strcmp(name, "task")) a->task = optarg;
        else if (!strcmp(name, "tasks")) a->tasks_file = optarg;
        else if (!strcmp(name, "out")) a->out = optarg;
        else if (!strcmp(name, "rates-out")) a->rates_out = optarg;
        else if (!strcmp(name, "completions")) a->completions = optarg;
        else if (!strcmp(name, "parallel")) a->parallel = (int)cli_parse_long("--parallel", optarg, 1, 256);
        else if (!strcmp(name, "n")) a->n = cli_parse_long("--n", optarg, 1, 100000000);
        else if (!strcmp(name, "seed")) a->seed = a->o.seed = cli_parse_u64("--seed", optarg);
        else if (!strcmp(name, "samples")) a->o.samples = (int)cli_parse_long("--samples", optarg, 1, 1024);
        else if (!strcmp(name, "min")) a->min_rate = cli_parse_double("--min", optarg, 0, 1);
        else if (!strcmp(name, "max")) a->max_rate = cli_parse_double("--max", optarg, 0, 1);
        else if (!strcmp(name, "temp")) a->o.temperature = (float)cli_parse_double("--temp", optarg, 0, 100);
        else if (!strcmp(name, "max-new")) a->o.max_new_tokens = (int)cli_parse_long("--max-new", optarg, 1, 1 << 20);
        else if (!strcmp(name, "batch")) a->o.batch = (int)cli_parse_long("--batch", optarg, 1, 4096);
    }
    if (optind >= argc || (strcmp(argv[optind], "sft") && strcmp(argv[optind], "filter") && strcmp(argv[optind], "score")))
        cli_usage_error("tasks", "say 'sft', 'filter' or 'score'");
    if (optind + 1 < argc) cli_usage_error("tasks", "unexpected argument '%s'", argv[optind + 1]);
    bool score = !strcmp(argv[optind], "score");
    if (!score && !a->out) cli_usage_error("tasks", "--out FILE is required");
    if (!score && (a->completions || a->parallel)) cli_usage_error("tasks", "--completions and --parallel go with tasks score");
    if (vks_prompt_check(&a->prompt)) cli_usage_error("tasks", "%s", vks_last_error());
}

static int tasks_sft(const tasks_args *a) {
    if (!a->task) cli_usage_error("tasks", "tasks sft needs --task NAME");
    if (a->prompt_given) cli_usage_error("tasks", "the prompt flags go with tasks filter (tasks sft writes the raw prompts)");
    vks_task_spec spec;
    if (vks_task_parse(a->task, &spec)) cli_usage_error("tasks", "%s", vks_last_error());
    if (vks_task_write_sft(&spec, a->seed, a->n, a->out)) cli_die(1, "%s", vks_last_error());
    fprintf(stderr, "vkswarm: tasks sft: wrote %lld lines\n", (long long)a->n);
    printf("data: %s\n", a->out);
    return 0;
}

/* R.jsonl beside KEPT.jsonl (KEPT.rates.jsonl; KEPT + ".rates.jsonl" without the suffix). */
static char *default_rates_path(const char *out) {
    size_t n = strlen(out);
    if (n > 6 && !strcmp(out + n - 6, ".jsonl")) n -= 6;
    char *p = malloc(n + sizeof ".rates.jsonl");
    if (!p) cli_die(1, "out of memory");
    memcpy(p, out, n);
    memcpy(p + n, ".rates.jsonl", sizeof ".rates.jsonl");
    return p;
}

/* The task file of --task / --tasks: a path, never a built-in task. */
static const char *filter_path(const tasks_args *a) {
    const char *name = a->task ? a->task : a->tasks_file;
    if (a->task && a->tasks_file) cli_usage_error("tasks", "give the task file once (--task and --tasks are the same)");
    if (!name) cli_usage_error("tasks", "tasks filter needs --task FILE.jsonl");
    vks_task_spec spec;
    const char *path = NULL;
    if (vks_task_resolve(name, &spec, &path) == VKS_OK && !path)
        cli_usage_error("tasks", "tasks filter and tasks score take a task file; '%s' is a built-in task", name);
    if (!path) path = strncmp(name, "file:", 5) ? name : name + 5; /* a missing file: named when it is opened */
    if (!*path) cli_usage_error("tasks", "--task 'file:' names no file");
    return path;
}

static int tasks_filter(tasks_args *a) {
    const char *path = filter_path(a);
    if (!a->m.model_path) cli_usage_error("tasks", "tasks filter needs --model M");
    if (a->min_rate > a->max_rate) cli_usage_error("tasks", "--min %g exceeds --max %g", a->min_rate, a->max_rate);
    char *rates = a->rates_out ? strdup(a->rates_out) : default_rates_path(a->out);
    if (!rates) cli_die(1, "out of memory");
    if (!strcmp(rates, a->out) || !strcmp(rates, path) || !strcmp(a->out, path))
        cli_usage_error("tasks", "the task file, --out and --rates-out must be three different files");
    vks_model *m = cli_load_model(&a->m);
    vks_tokenizer *tok = NULL;
    if (vks_tokenizer_load_auto(a->m.tokenizer_path, m, &tok))
        cli_die(EXIT_BAD_INPUT, "%s (tasks filter needs the model's tokenizer: --tokenizer)", vks_last_error());
    cli_check_prompt("tasks filter", &a->prompt, tok, 0);
    vks_gpu *g = cli_open_gpu(&a->m);
    a->o.engine = a->m.engine;
    a->o.prompt = &a->prompt, a->o.show_prompt = cli_show_prompt, a->o.progress_ctx = "tasks filter";
    vks_task_filter_counts n;
    int rc = vks_task_filter(g, m, tok, path, a->out, rates, a->min_rate, a->max_rate, &a->o, &n);
    if (rc) cli_die(rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1, "%s", vks_last_error());
    fprintf(stderr, "vkswarm: tasks filter: %lld tasks x %d samples: %lld hard (solve rate below %g), %lld kept, "
            "%lld easy (above %g)\n", (long long)n.total, a->o.samples, (long long)n.hard, a->min_rate,
            (long long)n.kept, (long long)n.easy, a->max_rate);
    printf("{\"total\": %lld, \"hard\": %lld, \"kept\": %lld, \"easy\": %lld, \"out\": ", (long long)n.total,
           (long long)n.hard, (long long)n.kept, (long long)n.easy);
    cli_json_string(stdout, a->out, strlen(a->out));
    printf(", \"rates\": ");
    cli_json_string(stdout, rates, strlen(rates));
    printf("}\n");
    free(rates);
    rc = cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc;
}

static int print_scored(void *ctx, const vks_task_scored *s) {
    (void)ctx;
    printf("{");
    if (s->id_json[0]) printf("\"id\": %s, ", s->id_json);
    printf("\"line\": %lld, \"task\": %lld, \"reward\": %.17g, \"why\": ", (long long)s->line,
           (long long)s->task_line, s->reward);
    cli_json_string(stdout, s->why, strlen(s->why));
    if (s->episode) { /* the conversation as replayed: what the environment said, turn by turn */
        printf(", \"turns\": %d, \"messages\": [", s->episode->turns);
        for (int i = 0; i < s->episode->n; i++) {
            printf("%s{\"role\": \"%s\", \"content\": ", i ? ", " : "", s->episode->m[i].role);
            cli_json_string(stdout, s->episode->m[i].content, s->episode->m[i].len);
            printf("}");
        }
        printf("]");
    }
    printf("}\n");
    return cli_stdout_ok() ? VKS_OK : vks_set_error(VKS_ERR_IO, "writing to stdout failed");
}

static int tasks_score(const tasks_args *a) {
    const char *name = a->task ? a->task : a->tasks_file;
    if (!name || !a->completions) cli_usage_error("tasks", "tasks score needs --task FILE.jsonl and --completions C.jsonl");
    if (a->m.model_path || a->out || a->prompt_given)
        cli_usage_error("tasks", "tasks score takes no model, --out or prompt flags");
    const char *path = filter_path(a);
    int rc = vks_task_score_file(path, a->completions, a->parallel, print_scored, NULL);
    if (rc) cli_die(rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : EXIT_FAILURE, "tasks score: %s",
                    vks_last_error());
    return 0;
}

int cmd_tasks(int argc, char **argv) {
    tasks_args a;
    parse_tasks(argc, argv, &a);
    if (!strcmp(argv[optind], "score")) return tasks_score(&a);
    return !strcmp(argv[optind], "sft") ? tasks_sft(&a) : tasks_filter(&a);
}
