/* `vkswarm generate` and `vkswarm logits`. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli_lines.h"
#include "cli_model.h"
#include "cli_prompts.h"
#include "cli_util.h"
#include "vkswarm/vks_toploc.h"
#include "vkswarm/vks_cpu.h"

static const char generate_usage[] =
    "usage: vkswarm generate --model M --tokenizer T [--prompt TEXT | --prompts FILE] [-n STEPS]\n"
    "                        [--temp X] [--top-p P] [--top-k K] [--seed S] [--dtype f32|f16|bf16]\n"
    "                        [--kv-type f32|f16] [--device N] [--profile]\n"
    "                        [--random-model dim,hidden,layers,heads,kv,vocab[,seq[,head_dim]]\n"
    "                         [--arch llama|llama3|qwen2|qwen3]]\n"
    "                        [--rollouts-out FILE [--toploc | --no-toploc]] [--lora PATH]\n"
    "                        [--chat-template NAME [--system TEXT] [--no-think]]\n"
    "Generates text. -n counts positions, prompt included (llama2.c); 0 means the model's context.\n"
    "Defaults: -n 256 --temp 1.0 --top-p 0.9 --top-k 0 (off), --seed from the clock (printed on stderr).\n"
    "Sampling is Gumbel-max with a Philox RNG keyed by (seed, prompt index, position): results do\n"
    "not depend on batch composition. With --prompts FILE (one prompt per line; a FILE named *.jsonl\n"
    "holds one {\"prompt\": \"...\"} object per line, so a prompt may hold line ends) all prompts run as\n"
    "one batch and stdout gets one JSON object per prompt, in order: {\"prompt\", \"ids\", \"text\"},\n"
    "where ids are the prompt ids followed by the generated ones and text is what a single run prints.\n"
    "Without --tokenizer (random models) output is token ids.\n"
    "--chat-template model|chatml|qwen3|llama2|llama3|llama3.1|phi3 makes each prompt one user message in\n"
    "that chat format with an assistant prompt (model: the tokenizer's own Jinja template, mapped to its\n"
    "family and its default system message, both named on stderr; one of no known family is refused),\n"
    "--system TEXT the system message, --no-think Qwen3's enable_thinking=false: the tokens that\n"
    "`vkswarm tokenize --chat` prints for the same flags, and that rl and eval feed (default none: BOS\n"
    "and the prompt as it is). The first prompt as rendered is shown on stderr.\n"
    "--rollouts-out FILE also writes a rollout file (JSONL, see docs \"Verifiable rollouts (TOPLOC) and\n"
    "vkswarm verify\") for\n"
    "`vkswarm verify`: one sample per prompt with its TOPLOC proofs, built on a worker thread while\n"
    "the GPU runs (--toploc, the default; --no-toploc writes empty proofs, to measure their cost);\n"
    "the file names the model by the hash of base and adapter.\n"
    "--kv-type f16 keeps the KV cache in halves (default f32): half its memory; attention split over\n"
    "keys. A rollout file records it and `vkswarm verify` (GPU or --cpu) replays with the same cache.\n" CLI_LORA_HELP;

typedef struct {
    cli_model_args m;
    cli_sampling s;
    const char *prompt, *prompts_file, *rollouts_out;
    bool no_toploc;
    vks_prompt_format format; /* the chat flags; default: BOS + the prompt */
} generate_args;

static void parse_generate(int argc, char **argv, generate_args *a) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, CLI_SAMPLING_LONG_OPTIONS, CLI_LORA_LONG_OPTION,
                                         CLI_CHAT_LONG_OPTIONS,
                                         {"prompt", required_argument, 0, 0}, {"prompts", required_argument, 0, 0},
                                         {"rollouts-out", required_argument, 0, 0}, {"toploc", no_argument, 0, 0},
                                         {"no-toploc", no_argument, 0, 0}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    a->m.device = -1;
    cli_sampling_defaults(&a->s);
    vks_prompt_format_default(&a->format);
    int c, idx;
    while ((c = cli_getopt(argc, argv, "n:h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(generate_usage, stdout); exit(0); }
        if (c == 'n') { cli_sampling_option(&a->s, "n", optarg); continue; }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg) || cli_sampling_option(&a->s, name, optarg) ||
            cli_prompt_option(&a->format, "generate", name, optarg))
            continue;
        if (!strcmp(name, "prompt")) a->prompt = optarg;
        else if (!strcmp(name, "prompts")) a->prompts_file = optarg;
        else if (!strcmp(name, "rollouts-out")) a->rollouts_out = optarg;
        else if (!strcmp(name, "toploc")) a->no_toploc = false;
        else if (!strcmp(name, "no-toploc")) a->no_toploc = true;
    }
    if (optind < argc) cli_usage_error("generate", "unexpected argument '%s'", argv[optind]);
    if (a->prompt && a->prompts_file) cli_die(EXIT_BAD_INPUT, "generate: give --prompt or --prompts, not both");
    if (vks_prompt_check(&a->format)) cli_usage_error("generate", "%s", vks_last_error());
}

typedef struct {
    cli_progress progress;
    vks_rollout_writer *rollouts; /* NULL without --rollouts-out */
} generate_hooks;

static void on_step(void *user, int step, int n_steps, int active) {
    cli_progress_update(&((generate_hooks *)user)->progress, step + 1, n_steps, "steps");
    (void)active;
}

static void on_hidden(void *user, const vks_step *st, const vks_seq_state *states, const float *hidden,
                      const int32_t *sampled) {
    vks_rollout_writer_on_hidden(((generate_hooks *)user)->rollouts, st, states, hidden);
    (void)sampled;
}

/* A rollout must be verifiable: its prompt has to fit in -n positions. */
static void check_rollout_prompts(const vks_sequence *seqs, int n, int steps) {
    for (int i = 0; i < n; i++)
        if (seqs[i].n_prompt > steps)
            cli_die(EXIT_BAD_INPUT, "generate: prompt %d has %d tokens, more than -n %d (no rollout possible)", i + 1,
                    seqs[i].n_prompt, steps);
}

int cmd_generate(int argc, char **argv) {
    generate_args a = {0};
    parse_generate(argc, argv, &a);
    vks_model *m = cli_load_model(&a.m);
    vks_tokenizer *t = cli_load_tokenizer(&a.m, m);
    cli_check_chat_flags("generate", &a.format, t);
    cli_sampling_finish(&a.s);
    int n = 1;
    char **prompts = a.prompts_file ? cli_read_prompts(a.prompts_file, &n) : NULL;
    vks_sequence *seqs = calloc((size_t)n, sizeof *seqs);
    if (!seqs) cli_die(1, "out of host memory");
    for (int i = 0; i < n; i++)
        cli_encode_formatted_prompt("generate", &a.format, t, m->cfg.vocab_size,
                                    prompts ? prompts[i] : (a.prompt ? a.prompt : ""), i, &seqs[i]);
    vks_sched_params sp = cli_sched_params(&a.s, m, t);
    int steps = sp.steps;
    vks_generate_options go = {.sched = sp};
    vks_gpu *g = cli_open_gpu(&a.m);
    /* rollouts are recomputed by verifiers in f32 and compared within margins:
     * no half arithmetic for them */
    vks_engine_options eo = a.m.engine;
    eo.n_slots = n, eo.kv_len = steps, eo.max_rows = n > 256 ? n : 256, eo.max_out_rows = n;
    eo.f32_math = a.rollouts_out != NULL;
    vks_engine *e = cli_create_engine(g, m, &eo);
    cli_engine_lora(&a.m, e);
    generate_hooks hooks = {0};
    if (a.rollouts_out) {
        check_rollout_prompts(seqs, n, steps);
        if (vks_rollout_writer_create(a.rollouts_out, m, a.m.lora, a.m.model_path ? a.m.model_path : a.m.random_spec, &sp, n,
                                      !a.no_toploc, &hooks.rollouts))
            cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
        vks_rollout_writer_set_kv_f16(hooks.rollouts, eo.kv_f16); /* the verifier replays with the same cache */
        go.on_hidden = on_hidden;
    }
    cli_progress_start(&hooks.progress, "generate");
    go.on_step = on_step;
    go.user = &hooks;
    if (vks_generate(e, &go, seqs, n, 0)) cli_die(1, "generate: %s", vks_last_error());
    long produced = cli_generated_tokens(seqs, n);
    cli_progress_end(&hooks.progress, produced, "tokens");
    if (hooks.rollouts && vks_rollout_writer_finish(hooks.rollouts, seqs, n, 0)) cli_die(1, "%s", vks_last_error());
    vks_rollout_writer_destroy(hooks.rollouts);
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *text = cli_sequence_text(t, &seqs[i], &len);
        if (prompts) cli_print_json(prompts[i], &seqs[i], text, len);
        else { fwrite(text, 1, len, stdout); fputc('\n', stdout); }
        free(text);
        vks_sequence_free(&seqs[i]);
        if (prompts) free(prompts[i]);
    }
    cli_flush_stdout();
    if (a.m.profile) cli_print_profile(g);
    vks_engine_destroy(e);
    int rc = cli_finish_gpu(g);
    free(seqs);
    free(prompts);
    vks_tokenizer_free(t);
    cli_free_model(&a.m, m);
    return rc;
}

/* ---------------- logits ---------------- */

static const char logits_usage[] =
    "usage: vkswarm logits --model M --ids FILE --out FILE [--dtype f32|f16|bf16] [--device N] [--profile]\n"
    "                      [--cpu [--threads N]] [--lora PATH]\n"
    "Feeds the ids (whitespace-separated integers; lines starting with '#' are ignored) at positions\n"
    "0..N-1 of one sequence and writes float32 logits [N, vocab], little-endian, to --out.\n"
    "--cpu: the fast f32 CPU forward (OpenBLAS) on N threads (default: every core) instead of the GPU.\n"
    CLI_LORA_HELP;

/* Parses the ids file strictly: integers in [0, vocab), at most max_n of them. */
static int32_t *read_ids(const char *path, int vocab, int max_n, int *n_out) {
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(EXIT_BAD_INPUT, "%s: cannot open", path);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_n);
    char line[65536 + 2];
    int n = 0, lineno = 0;
    while (ids && cli_read_line(f, path, lineno + 1, line, 65536, &len)) {
        lineno++;
        if (line[0] == '#') continue;
        for (char *s = line;;) {
            while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
            if (!*s) break;
            char *end;
            long v = strtol(s, &end, 10);
            if (end == s || (*end && !strchr(" \t\r\n", *end)))
                cli_die(EXIT_BAD_INPUT, "%s:%d: '%.20s' is not an integer", path, lineno, s);
            if (v < 0 || v >= vocab) cli_die(EXIT_BAD_INPUT, "%s:%d: id %ld outside the vocabulary [0, %d)", path, lineno, v, vocab);
            if (n == max_n) cli_die(EXIT_BAD_INPUT, "%s: more than %d ids (the model's context)", path, max_n);
            ids[n++] = (int32_t)v;
            s = end;
        }
    }
    fclose(f);
    if (!ids) cli_die(1, "out of host memory");
    if (n == 0) cli_die(EXIT_BAD_INPUT, "%s: no ids", path);
    *n_out = n;
    return ids;
}

/* The engine's logits of ids at positions 0..n-1 of one sequence (one KV slot). */
static void logits_gpu(const cli_model_args *ma, const vks_model *m, const int32_t *ids, int n, float *logits) {
    vks_gpu *g = cli_open_gpu(ma);
    int chunk = n < 128 ? n : 128;
    vks_engine_options eo = ma->engine;
    eo.n_slots = 1, eo.kv_len = n, eo.max_rows = chunk, eo.max_out_rows = chunk;
    vks_engine *e = cli_create_engine(g, m, &eo);
    cli_engine_lora(ma, e);
    if (vks_engine_logits(e, 0, ids, 0, n, chunk, logits, NULL)) cli_die(1, "logits: %s", vks_last_error());
    if (ma->profile) cli_print_profile(g);
    vks_engine_destroy(e);
    if (cli_finish_gpu(g)) cli_die(1, "logits: %s", vks_last_error());
}

/* The fast CPU forward's logits (vks_cpu.h). */
static void logits_cpu(const vks_model *m, const vks_lora_adapter *lora, int threads, const int32_t *ids, int n,
                       float *logits) {
    vks_cpu_options co = {.threads = threads};
    vks_cpu *cpu = NULL;
    if (vks_cpu_create(m, &co, &cpu) || vks_cpu_set_lora(cpu, lora) || vks_cpu_prefill(cpu, ids, &n, 1, NULL, n, logits, NULL))
        cli_die(1, "logits: %s", vks_last_error());
    vks_cpu_destroy(cpu);
}

int cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, CLI_LORA_LONG_OPTION, {"ids", required_argument, 0, 0},
                                         {"out", required_argument, 0, 0}, {"cpu", no_argument, 0, 0},
                                         {"threads", required_argument, 0, 0}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    cli_model_args ma = {.device = -1};
    const char *ids_path = NULL, *out_path = NULL;
    bool cpu = false;
    int threads = 0;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(logits_usage, stdout); return 0; }
        const char *name = opts[idx].name;
        if (cli_model_option(&ma, name, optarg)) continue;
        if (!strcmp(name, "ids")) ids_path = optarg;
        else if (!strcmp(name, "out")) out_path = optarg;
        else if (!strcmp(name, "cpu")) cpu = true;
        else if (!strcmp(name, "threads")) threads = (int)cli_parse_long("--threads", optarg, 1, 256);
    }
    if (optind < argc) cli_usage_error("logits", "unexpected argument '%s'", argv[optind]);
    if (!ids_path || !out_path) cli_usage_error("logits", "--ids and --out are required");
    vks_model *m = cli_load_model(&ma);
    int n;
    int32_t *ids = read_ids(ids_path, m->cfg.vocab_size, m->cfg.seq_len, &n);
    size_t V = (size_t)m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * V * (size_t)n);
    if (!logits) cli_die(1, "out of host memory");
    if (cpu) logits_cpu(m, ma.lora, threads, ids, n, logits);
    else logits_gpu(&ma, m, ids, n, logits);
    vks_outfile out; /* a temporary renamed into place when complete */
    int rc = vks_outfile_open(&out, out_path, 0666);
    if (rc == VKS_OK) rc = vks_outfile_finish(&out, fwrite(logits, sizeof(float) * V, (size_t)n, out.f) == (size_t)n);
    free(logits); free(ids);
    cli_free_model(&ma, m);
    if (rc) cli_die(1, "%s", vks_last_error());
    fprintf(stderr, "vkswarm: wrote %d x %zu logits to %s\n", n, V, out_path);
    return 0;
}
