/* `vkswarm tokenize` and `vkswarm detokenize`. */
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli_model.h"
#include "cli_util.h"
#include "commands.h"

#define MAX_INPUT_BYTES ((size_t)256 << 20)

static const char tokenize_usage[] =
    "usage: vkswarm tokenize (--model M | --tokenizer T [--vocab-size N]) [--no-bos] [--special]\n"
    "                        [--chat [--chat-template NAME] [--system TEXT] [--no-think]] [--prompt TEXT]\n"
    "Reads UTF-8 text on stdin (every byte counts, a final newline too; or --prompt TEXT) and prints\n"
    "its token ids, space-separated, on one line. The tokenizer comes from --tokenizer (llama2.c\n"
    "tokenizer.bin, a .gguf, a Hugging Face tokenizer.json or its directory) or from the model (GGUF\n"
    "metadata, tokenizer.json beside safetensors). tokenizer.bin alone needs --vocab-size.\n"
    "BOS is added when the vocabulary asks for it (--no-bos: never). --special: control tokens\n"
    "written in the text (<|endoftext|>, </s>...) become those tokens.\n"
    "--chat: stdin is one user message, formatted with the model's chat template (--chat-template\n"
    "model, the default: stderr names its file, the family it maps to and its default system message,\n"
    "kept unless --system; a template of no known family is refused) or the one named by\n"
    "--chat-template: chatml, qwen3, llama2, llama3, llama3.1, phi3, and an assistant prompt; special\n"
    "tokens are parsed. --no-think: Qwen3's enable_thinking=false (the prompt ends with an empty\n"
    "<think></think> block); refused (exit 2) with a template that has no thinking switch. The same\n"
    "flags give generate, eval and rl the same prompt.\n";

static const char detokenize_usage[] =
    "usage: vkswarm detokenize (--model M | --tokenizer T [--vocab-size N]) [--special]\n"
    "Reads token ids (whitespace-separated) on stdin and prints their text, nothing added.\n"
    "Control tokens print only with --special.\n";

typedef struct {
    cli_model_args m;
    int vocab_size;
    bool no_bos, special, chat, chat_flags; /* chat_flags: --chat-template, --system or --no-think given */
    const char *prompt;
    vks_prompt_format format; /* --chat: as rl's prompt block, chat template "model" by default */
} tok_args;

static void parse_args(int argc, char **argv, tok_args *a, bool tokenize) {
    static const struct option opts[] = {{"model", required_argument, 0, 0},     {"tokenizer", required_argument, 0, 0},
                                         {"vocab-size", required_argument, 0, 0}, {"no-bos", no_argument, 0, 0},
                                         {"special", no_argument, 0, 0},          {"chat", no_argument, 0, 0},
                                         CLI_CHAT_LONG_OPTIONS,                   {"prompt", required_argument, 0, 0},
                                         {"help", no_argument, 0, 'h'},           {0, 0, 0, 0}};
    vks_prompt_format_default(&a->format);
    if (vks_prompt_set(&a->format, "chat_template", "model", NULL)) cli_die(1, "%s", vks_last_error());
    const char *usage = tokenize ? tokenize_usage : detokenize_usage;
    int c, idx;
    while ((c = cli_getopt(argc, argv, "h", opts, &idx)) != -1) {
        if (c == 'h') {
            fputs(usage, stdout);
            exit(0);
        }
        const char *name = opts[idx].name;
        bool tok_only = !strcmp(name, "no-bos") || !strcmp(name, "chat") || !strcmp(name, "chat-template") ||
                        !strcmp(name, "system") || !strcmp(name, "prompt") || !strcmp(name, "no-think");
        if (tok_only && !tokenize) cli_usage_error("detokenize", "unknown option '--%s'", name);
        if (!strcmp(name, "model")) a->m.model_path = optarg;
        else if (!strcmp(name, "tokenizer")) a->m.tokenizer_path = optarg;
        else if (!strcmp(name, "vocab-size")) a->vocab_size = (int)cli_parse_long("--vocab-size", optarg, 1, 1 << 22);
        else if (!strcmp(name, "no-bos")) a->no_bos = true;
        else if (!strcmp(name, "special")) a->special = true;
        else if (!strcmp(name, "chat")) a->chat = true;
        else if (!strcmp(name, "prompt")) a->prompt = optarg;
        else if (cli_prompt_option(&a->format, "tokenize", name, optarg)) a->chat_flags = true;
    }
    if (optind < argc) cli_usage_error(argv[0], "unexpected argument '%s'", argv[optind]);
    if (!a->m.model_path && !a->m.tokenizer_path) cli_die(EXIT_BAD_INPUT, "%s: give --model or --tokenizer", argv[0]);
    if (a->chat_flags && !a->chat)
        cli_die(EXIT_BAD_INPUT, "tokenize: --chat-template, --system and --no-think need --chat");
    if (a->chat && vks_prompt_check(&a->format)) cli_usage_error("tokenize", "%s", vks_last_error());
}

static bool is_gguf_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[4] = {0};
    bool yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    if (f) fclose(f);
    return yes;
}

static vks_tokenizer *load_tokenizer(const tok_args *a) {
    vks_tokenizer *t = NULL;
    int rc;
    if (!a->m.model_path) {
        vks_model fake = {0}; /* only its vocab size is read: tokenizer.bin needs one */
        fake.cfg.vocab_size = a->vocab_size;
        snprintf(fake.path, sizeof fake.path, "--vocab-size");
        rc = vks_tokenizer_load_auto(a->m.tokenizer_path, a->vocab_size ? &fake : NULL, &t);
    } else if (!a->m.tokenizer_path && is_gguf_file(a->m.model_path)) {
        rc = vks_tokenizer_load_gguf(a->m.model_path, &t); /* metadata only: no need to map the weights */
    } else {
        cli_model_args ma = a->m; /* the weights' device type does not matter here */
        vks_model *m = cli_load_model(&ma);
        rc = vks_tokenizer_load_auto(a->m.tokenizer_path, m, &t);
        vks_model_free(m);
    }
    if (rc) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    return t;
}

static char *read_stdin(size_t *len) {
    size_t cap = 1 << 16, n = 0, got;
    char *buf = malloc(cap);
    if (!buf) cli_die(1, "out of memory");
    while ((got = fread(buf + n, 1, cap - n - 1, stdin)) > 0) {
        n += got;
        if (n + 1 == cap) {
            if (cap >= MAX_INPUT_BYTES) cli_die(EXIT_BAD_INPUT, "stdin: more than %zu bytes", MAX_INPUT_BYTES);
            char *nb = realloc(buf, cap *= 2);
            if (!nb) cli_die(1, "out of memory");
            buf = nb;
        }
    }
    if (ferror(stdin)) cli_die(EXIT_BAD_INPUT, "stdin: read error");
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* The chat text for one user message: rl's and eval's rendering (vks_prompt_text). */
static char *chat_text(const tok_args *a, const vks_tokenizer *t, const char *user) {
    cli_check_prompt("tokenize", &a->format, t, 0);
    char *out = NULL;
    size_t len = 0;
    if (vks_prompt_text(&a->format, vks_tokenizer_chat_template(t), user, 0, &out, &len))
        cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    return out;
}

int cmd_tokenize(int argc, char **argv) {
    tok_args a = {0};
    parse_args(argc, argv, &a, true);
    vks_tokenizer *t = load_tokenizer(&a);
    size_t len = 0;
    char *text = a.prompt ? strdup(a.prompt) : read_stdin(&len);
    if (!text) cli_die(1, "out of memory");
    if (a.prompt) len = strlen(text);
    if (a.chat) {
        if (memchr(text, '\0', len)) cli_die(EXIT_BAD_INPUT, "tokenize: --chat text contains a NUL byte");
        char *formatted = chat_text(&a, t, text);
        free(text);
        text = formatted;
        len = strlen(text);
    }
    vks_tokenize_options o = {.add_bos = !a.no_bos && vks_tokenizer_wants_bos(t),
                              .add_eos = false,
                              .parse_special = a.special || a.chat};
    int32_t *ids = NULL;
    int n = 0;
    if (vks_tokenizer_tokenize(t, text, len, &o, &ids, &n)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
    printf("\n");
    free(ids);
    free(text);
    vks_tokenizer_free(t);
    cli_flush_stdout(); /* a lost result is exit 1 with a message */
    return 0;
}

/* Parses whitespace-separated ids (anything else is bad input). */
static int32_t *parse_id_list(const char *s, int vocab, int *n_out) {
    size_t cap = 256, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) cli_die(1, "out of memory");
    while (*s) {
        if (*s == ' ' || *s == '\n' || *s == '\t' || *s == '\r') {
            s++;
            continue;
        }
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || (*end && *end != ' ' && *end != '\n' && *end != '\t' && *end != '\r')) {
            size_t word = strcspn(s, " \n\t\r");
            free(ids);
            cli_die(EXIT_BAD_INPUT, "stdin: '%.*s' (word %zu) is not a token id", word > 40 ? 40 : (int)word, s, n + 1);
        }
        if (v < 0 || v >= vocab) {
            free(ids); /* cli_die exits: nothing left for the leak checker */
            cli_die(EXIT_BAD_INPUT, "stdin: token %ld (word %zu) outside 0..%d", v, n + 1, vocab - 1);
        }
        if (n == cap) {
            if (cap > (size_t)INT32_MAX / 2) cli_die(EXIT_BAD_INPUT, "stdin: too many ids");
            int32_t *nb = realloc(ids, (cap *= 2) * sizeof *ids);
            if (!nb) cli_die(1, "out of memory");
            ids = nb;
        }
        ids[n++] = (int32_t)v;
        s = end;
    }
    *n_out = (int)n;
    return ids;
}

/* 1-based line number of the byte at `at` in text. */
static int line_of(const char *text, const char *at) {
    int line = 1;
    for (const char *p = text; p < at; p++) line += *p == '\n';
    return line;
}

int cmd_detokenize(int argc, char **argv) {
    tok_args a = {0};
    parse_args(argc, argv, &a, false);
    vks_tokenizer *t = load_tokenizer(&a);
    size_t len;
    char *in = read_stdin(&len);
    const char *nul = memchr(in, '\0', len);
    if (nul) cli_die(EXIT_BAD_INPUT, "stdin: line %d holds a NUL byte among the ids", line_of(in, nul));
    int n = 0;
    int32_t *ids = parse_id_list(in, vks_tokenizer_vocab_size(t), &n);
    char *text = NULL;
    size_t tlen = 0;
    if (vks_tokenizer_detokenize(t, ids, n, a.special, &text, &tlen)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    fwrite(text, 1, tlen, stdout);
    free(text);
    free(ids);
    free(in);
    vks_tokenizer_free(t);
    cli_flush_stdout(); /* a lost result is exit 1 with a message */
    return 0;
}
