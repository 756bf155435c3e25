/* `vkswarm generate` and `vkswarm logits`. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli_model.h"
#include "cli_util.h"

#define MAX_PROMPTS 4096
#define MAX_PROMPT_BYTES (1 << 20)

static const char generate_usage[] =
    "usage: vkswarm generate --model M --tokenizer T [--prompt TEXT | --prompts FILE] [-n STEPS]\n"
    "                        [--temp X] [--top-p P] [--top-k K] [--seed S] [--dtype f32|f16|bf16]\n"
    "                        [--device N] [--profile] [--random-model dim,hidden,layers,heads,kv,vocab]\n"
    "Generates text. -n counts positions, prompt included (llama2.c); 0 means the model's context.\n"
    "Defaults: -n 256 --temp 1.0 --top-p 0.9 --top-k 0 (off), --seed from the clock (printed on stderr).\n"
    "Sampling is Gumbel-max with a Philox RNG keyed by (seed, prompt index, position): results do\n"
    "not depend on batch composition. With --prompts FILE (one prompt per line) all prompts run as\n"
    "one batch and stdout gets one JSON object per prompt, in order: {\"prompt\", \"ids\", \"text\"},\n"
    "where ids are the prompt ids followed by the generated ones and text is what a single run prints.\n"
    "Without --tokenizer (random models) output is token ids.\n";

typedef struct {
    cli_model_args m;
    const char *prompt, *prompts_file;
    int steps;
    vks_generate_options g;
    bool seed_given;
} generate_args;

static void parse_generate(int argc, char **argv, generate_args *a) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS,
                                         {"prompt", required_argument, 0, 0}, {"prompts", required_argument, 0, 0},
                                         {"temp", required_argument, 0, 0}, {"top-p", required_argument, 0, 0},
                                         {"top-k", required_argument, 0, 0}, {"seed", required_argument, 0, 0},
                                         {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    a->m.device = -1;
    a->steps = 256;
    a->g.temperature = 1.0f;
    a->g.top_p = 0.9f;
    int c, idx;
    while ((c = getopt_long(argc, argv, "n:h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(generate_usage, stdout); exit(0); }
        if (c == 'n') { a->steps = (int)cli_parse_long("-n", optarg, 0, 1 << 20); continue; }
        if (c != 0) { fputs(generate_usage, stderr); exit(EXIT_BAD_INPUT); }
        const char *name = opts[idx].name;
        if (cli_model_option(&a->m, name, optarg)) continue;
        if (!strcmp(name, "prompt")) a->prompt = optarg;
        else if (!strcmp(name, "prompts")) a->prompts_file = optarg;
        else if (!strcmp(name, "temp")) a->g.temperature = (float)cli_parse_double("--temp", optarg, 0, 1e6);
        else if (!strcmp(name, "top-p")) a->g.top_p = (float)cli_parse_double("--top-p", optarg, 0, 1);
        else if (!strcmp(name, "top-k")) a->g.top_k = (uint32_t)cli_parse_long("--top-k", optarg, 0, 1 << 24);
        else if (!strcmp(name, "seed")) { a->g.seed = cli_parse_u64("--seed", optarg); a->seed_given = true; }
    }
    if (optind < argc) cli_die(EXIT_BAD_INPUT, "generate: unexpected argument '%s' (see --help)", argv[optind]);
    if (a->prompt && a->prompts_file) cli_die(EXIT_BAD_INPUT, "generate: give --prompt or --prompts, not both");
}

/* Reads one prompt per line (a final line without '\n' counts). */
static char **read_prompts(const char *path, int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(EXIT_BAD_INPUT, "%s: cannot open", path);
    char **lines = calloc(MAX_PROMPTS, sizeof *lines);
    char *buf = malloc(MAX_PROMPT_BYTES + 2);
    int n = 0;
    if (!lines || !buf) cli_die(1, "out of host memory");
    while (fgets(buf, MAX_PROMPT_BYTES + 2, f)) {
        size_t len = strlen(buf);
        if (len > MAX_PROMPT_BYTES) cli_die(EXIT_BAD_INPUT, "%s: line %d is longer than %d bytes", path, n + 1, MAX_PROMPT_BYTES);
        if (len && buf[len - 1] == '\n') buf[--len] = 0;
        if (n == MAX_PROMPTS) cli_die(EXIT_BAD_INPUT, "%s: more than %d prompts", path, MAX_PROMPTS);
        lines[n++] = strdup(buf);
    }
    fclose(f);
    free(buf);
    if (n == 0) cli_die(EXIT_BAD_INPUT, "%s: no prompts", path);
    *n_out = n;
    return lines;
}

static void encode_prompt(const vks_tokenizer *t, const char *text, vks_sequence *s, int bos) {
    size_t len = strlen(text);
    s->ids = malloc(sizeof(int32_t) * (len + 3));
    if (!s->ids) cli_die(1, "out of host memory");
    if (!t) {
        if (len) cli_die(EXIT_BAD_INPUT, "a prompt needs --tokenizer");
        s->ids[0] = bos;
        s->n_prompt = 1;
        return;
    }
    if (vks_tokenizer_encode(t, text, len, true, false, s->ids, &s->n_prompt))
        cli_die(EXIT_BAD_INPUT, "cannot encode prompt: %s", vks_last_error());
}

/* What run.c prints for a sequence: decode(prev, next) for each pair. */
static char *sequence_text(const vks_tokenizer *t, const vks_sequence *s, size_t *len_out) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    for (int i = 0; out && i + 1 < s->n_ids; i++) {
        char buf[32];
        size_t plen;
        const char *piece;
        if (t) {
            piece = vks_tokenizer_decode(t, s->ids[i], s->ids[i + 1], buf, &plen);
            if (!vks_tokenizer_piece_printable(piece, plen)) continue;
        } else {
            plen = (size_t)snprintf(buf, sizeof buf, "%s%d", i ? " " : "", s->ids[i + 1]);
            piece = buf;
        }
        if (len + plen + 1 > cap) {
            while (len + plen + 1 > cap) cap *= 2;
            char *n = realloc(out, cap);
            if (!n) { free(out); return NULL; }
            out = n;
        }
        memcpy(out + len, piece, plen);
        len += plen;
    }
    if (!out) cli_die(1, "out of host memory");
    out[len] = 0;
    *len_out = len;
    return out;
}

static void print_json(const char *prompt, const vks_sequence *s, const char *text, size_t len) {
    fputs("{\"prompt\":", stdout);
    cli_json_string(stdout, prompt, strlen(prompt));
    fputs(",\"ids\":[", stdout);
    for (int i = 0; i < s->n_ids; i++) printf("%s%d", i ? "," : "", s->ids[i]);
    fputs("],\"text\":", stdout);
    cli_json_string(stdout, text, len);
    fputs("}\n", stdout);
}

static void on_step(void *user, int step, int n_steps, int active) {
    cli_progress_update(user, step + 1, n_steps, "steps");
    (void)active;
}

int cmd_generate(int argc, char **argv) {
    generate_args a = {0};
    parse_generate(argc, argv, &a);
    vks_model *m = cli_load_model(&a.m);
    vks_tokenizer *t = cli_load_tokenizer(&a.m, m);
    if (!a.seed_given) a.g.seed = (uint64_t)time(NULL);
    fprintf(stderr, "vkswarm: seed %llu\n", (unsigned long long)a.g.seed);
    int n = 1;
    char **prompts = a.prompts_file ? read_prompts(a.prompts_file, &n) : NULL;
    vks_sequence *seqs = calloc((size_t)n, sizeof *seqs);
    for (int i = 0; i < n; i++) encode_prompt(t, prompts ? prompts[i] : (a.prompt ? a.prompt : ""), &seqs[i], 1);
    int steps = a.steps == 0 || a.steps > m->cfg.seq_len ? m->cfg.seq_len : a.steps;
    a.g.steps = steps;
    a.g.stop_token_a = 1; /* BOS ends a llama2.c story */
    a.g.stop_token_b = t ? vks_tokenizer_eos(t) : -1;
    vks_gpu *g = cli_open_gpu(&a.m);
    vks_engine_options eo = {.dtype = a.m.dtype, .n_slots = n, .kv_len = steps, .max_rows = n > 256 ? n : 256,
                             .max_out_rows = n};
    vks_engine *e = cli_create_engine(g, m, &eo);
    cli_progress p;
    cli_progress_start(&p, "generate");
    a.g.on_step = on_step;
    a.g.user = &p;
    if (vks_generate(e, &a.g, seqs, n, 0)) cli_die(1, "generate: %s", vks_last_error());
    long produced = 0;
    for (int i = 0; i < n; i++) produced += seqs[i].n_ids - seqs[i].n_prompt;
    cli_progress_end(&p, produced, "tokens");
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        char *text = sequence_text(t, &seqs[i], &len);
        if (prompts) print_json(prompts[i], &seqs[i], text, len);
        else { fwrite(text, 1, len, stdout); fputc('\n', stdout); }
        free(text);
        vks_sequence_free(&seqs[i]);
        if (prompts) free(prompts[i]);
    }
    fflush(stdout);
    if (a.m.profile) cli_print_profile(g);
    vks_engine_destroy(e);
    int rc = cli_finish_gpu(g);
    free(seqs);
    free(prompts);
    vks_tokenizer_free(t);
    vks_model_free(m);
    return rc;
}

/* ---------------- logits ---------------- */

static const char logits_usage[] =
    "usage: vkswarm logits --model M --ids FILE --out FILE [--dtype f32|f16|bf16] [--device N] [--profile]\n"
    "Feeds the ids (whitespace-separated integers; lines starting with '#' are ignored) at positions\n"
    "0..N-1 of one sequence and writes float32 logits [N, vocab], little-endian, to --out.\n";

/* Parses the ids file strictly: integers in [0, vocab), at most max_n of them. */
static int32_t *read_ids(const char *path, int vocab, int max_n, int *n_out) {
    size_t len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(EXIT_BAD_INPUT, "%s: cannot open", path);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)max_n);
    char line[65536];
    int n = 0, lineno = 0;
    while (ids && fgets(line, sizeof line, f)) {
        lineno++;
        len = strlen(line);
        if (len == sizeof line - 1 && line[len - 1] != '\n') cli_die(EXIT_BAD_INPUT, "%s:%d: line too long", path, lineno);
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

int cmd_logits(int argc, char **argv) {
    static const struct option opts[] = {CLI_MODEL_LONG_OPTIONS, {"ids", required_argument, 0, 0},
                                         {"out", required_argument, 0, 0}, {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    cli_model_args ma = {.device = -1};
    const char *ids_path = NULL, *out_path = NULL;
    int c, idx;
    while ((c = getopt_long(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') { fputs(logits_usage, stdout); return 0; }
        if (c != 0) { fputs(logits_usage, stderr); return EXIT_BAD_INPUT; }
        const char *name = opts[idx].name;
        if (cli_model_option(&ma, name, optarg)) continue;
        if (!strcmp(name, "ids")) ids_path = optarg;
        else if (!strcmp(name, "out")) out_path = optarg;
    }
    if (!ids_path || !out_path) cli_die(EXIT_BAD_INPUT, "logits: --ids and --out are required (see --help)");
    vks_model *m = cli_load_model(&ma);
    int n;
    int32_t *ids = read_ids(ids_path, m->cfg.vocab_size, m->cfg.seq_len, &n);
    vks_gpu *g = cli_open_gpu(&ma);
    int chunk = n < 128 ? n : 128;
    vks_engine_options eo = {.dtype = ma.dtype, .n_slots = 1, .kv_len = n, .max_rows = chunk, .max_out_rows = chunk};
    vks_engine *e = cli_create_engine(g, m, &eo);
    size_t V = (size_t)m->cfg.vocab_size;
    float *logits = malloc(sizeof(float) * V * (size_t)n);
    uint32_t *slot = calloc((size_t)chunk, 4), *pos = malloc(4 * (size_t)chunk), *rows = malloc(4 * (size_t)chunk);
    if (!logits || !slot || !pos || !rows) cli_die(1, "out of host memory");
    for (int r = 0; r < chunk; r++) rows[r] = (uint32_t)r;
    for (int p0 = 0; p0 < n; p0 += chunk) {
        int R = n - p0 < chunk ? n - p0 : chunk;
        for (int r = 0; r < R; r++) pos[r] = (uint32_t)(p0 + r);
        vks_forward_batch b = {.n_rows = R, .tokens = ids + p0, .slot = slot, .pos = pos, .n_out = R,
                               .out_rows = rows, .logits = logits + (size_t)p0 * V};
        if (vks_engine_forward(e, &b)) cli_die(1, "logits: %s", vks_last_error());
    }
    FILE *f = fopen(out_path, "wb");
    if (!f || fwrite(logits, sizeof(float) * V, (size_t)n, f) != (size_t)n || fclose(f))
        cli_die(1, "%s: cannot write", out_path);
    fprintf(stderr, "vkswarm: wrote %d x %zu logits to %s\n", n, V, out_path);
    if (ma.profile) cli_print_profile(g);
    vks_engine_destroy(e);
    int rc = cli_finish_gpu(g);
    free(logits); free(slot); free(pos); free(rows); free(ids);
    vks_model_free(m);
    return rc;
}
