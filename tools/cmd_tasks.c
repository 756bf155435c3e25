/* `vkswarm tasks sft` and `vkswarm tasks filter`: argument parsing around vks_task_write_sft and vks_task_filter. */
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
    "       vkswarm tasks filter --model M --tasks FILE.jsonl --out FILE.jsonl [--samples K] [--min X]\n"
    "                            [--max X] [--temp X] [--seed S] [--max-new N] [--batch B] [--tokenizer T]\n"
    "tasks sft writes N (default 1000) instances of a built-in task (add, mul, countdown, sort, reverse,\n"
    "optionally :SIZE, e.g. mul:3) from seed S (default 0) as {\"prompt\", \"completion\"} lines with a\n"
    "short worked completion ending in the answer line, for `vkswarm train sft`.\n"
    "tasks filter completes each task of FILE ({\"prompt\", \"answer\", \"task_type\", ...} lines; task_type\n"
    "exact, numeric, list, boxed or countdown with \"numbers\" and \"target\") K times (default 8, at\n"
    "--temp default 1.0, sampled from seed S) and keeps the lines whose solve rate lies in [--min, --max]\n"
    "(default 0.1 and 0.8): the offline difficulty filter. Prints the kept and total counts.\n"
    "Answers are read from the completion's last `answer: ...` line or last \\boxed{...}.\n";

typedef struct {
    cli_model_args m;
    const char *task, *tasks_file, *out;
    int64_t n;
    uint64_t seed;
    double min_rate, max_rate;
    vks_task_run_options o;
} tasks_args;

static void parse_tasks(int argc, char **argv, tasks_args *a) {
    static const struct option opts[] = {
        CLI_MODEL_LONG_OPTIONS, {"task", required_argument, 0, 0}, {"tasks", required_argument, 0, 0},
        {"out", required_argument, 0, 0}, {"n", required_argument, 0, 0}, {"seed", required_argument, 0, 0},
        {"samples", required_argument, 0, 0}, {"min", required_argument, 0, 0}, {"max", required_argument, 0, 0},
        {"temp", required_argument, 0, 0}, {"max-new", required_argument, 0, 0}, {"batch", required_argument, 0, 0},
        {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    *a = (tasks_args){.m = {.device = -1}, .n = 1000, .min_rate = 0.1, .max_rate = 0.8,
                      .o = {.samples = 8, .temperature = 1.0f}};
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(tasks_usage, stdout); exit(0); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (!strcmp(name, "task")) a->task = optarg;
        else if (!strcmp(name, "tasks")) a->tasks_file = optarg;
        else if (!strcmp(name, "out")) a->out = optarg;
        else if (!strcmp(name, "n")) a->n = cli_parse_long("--n", optarg, 1, 100000000);
        else if (!strcmp(name, "seed")) a->seed = a->o.seed = cli_parse_u64("--seed", optarg);
        else if (!strcmp(name, "samples")) a->o.samples = (int)cli_parse_long("--samples", optarg, 1, 1024);
        else if (!strcmp(name, "min")) a->min_rate = cli_parse_double("--min", optarg, 0, 1);
        else if (!strcmp(name, "max")) a->max_rate = cli_parse_double("--max", optarg, 0, 1);
        else if (!strcmp(name, "temp")) a->o.temperature = (float)cli_parse_double("--temp", optarg, 0, 100);
        else if (!strcmp(name, "max-new")) a->o.max_new_tokens = (int)cli_parse_long("--max-new", optarg, 1, 1 << 20);
        else if (!strcmp(name, "batch")) a->o.batch = (int)cli_parse_long("--batch", optarg, 1, 4096);
    }
    if (optind >= argc || (strcmp(argv[optind], "sft") && strcmp(argv[optind], "filter")))
        cli_usage_error("tasks", "say 'sft' or 'filter'");
    if (optind + 1 < argc) cli_usage_error("tasks", "unexpected argument '%s'", argv[optind + 1]);
    if (!a->out) cli_usage_error("tasks", "--out FILE is required");
}

static int tasks_sft(const tasks_args *a) {
    if (!a->task) cli_usage_error("tasks", "tasks sft needs --task NAME");
    vks_task_spec spec;
    if (vks_task_parse(a->task, &spec)) cli_usage_error("tasks", "%s", vks_last_error());
    if (vks_task_write_sft(&spec, a->seed, a->n, a->out)) cli_die(1, "%s", vks_last_error());
    fprintf(stderr, "vkswarm: tasks sft: wrote %lld lines\n", (long long)a->n);
    printf("data: %s\n", a->out);
    return 0;
}

static int tasks_filter(tasks_args *a) {
    if (!a->m.model_path || !a->tasks_file) cli_usage_error("tasks", "tasks filter needs --model M and --tasks FILE");
    if (a->min_rate > a->max_rate) cli_usage_error("tasks", "--min %g exceeds --max %g", a->min_rate, a->max_rate);
    vks_model *m = cli_load_model(&a->m);
    vks_tokenizer *tok = NULL;
    if (vks_tokenizer_load_auto(a->m.tokenizer_path, m, &tok))
        cli_die(EXIT_BAD_INPUT, "%s (tasks filter needs the model's tokenizer: --tokenizer)", vks_last_error());
    vks_gpu *g = cli_open_gpu(&a->m);
    a->o.engine = a->m.engine;
    int64_t kept = 0, total = 0;
    int rc = vks_task_filter(g, m, tok, a->tasks_file, a->out, a->min_rate, a->max_rate, &a->o, &kept, &total);
    if (rc) cli_die(rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG ? EXIT_BAD_INPUT : 1, "%s", vks_last_error());
    printf("{\"kept\": %lld, \"total\": %lld}\n", (long long)kept, (long long)total);
    rc = cli_finish_gpu(g);
    vks_tokenizer_free(tok);
    vks_model_free(m);
    return rc;
}

int cmd_tasks(int argc, char **argv) {
    tasks_args a;
    parse_tasks(argc, argv, &a);
    return !strcmp(argv[optind], "sft") ? tasks_sft(&a) : tasks_filter(&a);
}
