/* Prompts in, JSON lines out (see cli_prompts.h). */
#include "cli_prompts.h"
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "cli_lines.h"
#include "cli_util.h"

#define MAX_PROMPTS 4096
#define MAX_PROMPT_BYTES (1 << 20)

static bool is_jsonl(const char *path) {
    size_t n = strlen(path);
    return n >= 6 && !strcmp(path + n - 6, ".jsonl");
}

/* A JSON-lines prompt: {"prompt": "..."} (other keys ignored, as task files'
 * readers do); the line's text itself is not a prompt. Exit 2 naming the line. */
static char *json_prompt(const char *path, int line_no, const char *text, size_t len) {
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) cli_die(EXIT_BAD_INPUT, "%s: line %d: bad JSON: %s (column %d)", path, line_no, err.text, err.column);
    json_t *v = json_object_get(root, "prompt");
    const char *why = !json_is_object(root) ? "not a JSON object" : !v ? "missing \"prompt\""
                      : !json_is_string(v) ? "\"prompt\" is not a string" : NULL; /* \u0000: jansson refuses it */
    if (why) cli_die(EXIT_BAD_INPUT, "%s: line %d: %s (a .jsonl prompts file holds {\"prompt\": \"...\"} per line)", path,
                     line_no, why);
    char *p = strdup(json_string_value(v));
    json_decref(root);
    if (!p) cli_die(1, "out of host memory");
    return p;
}

static bool blank(const char *s) { return s[strspn(s, " \t")] == 0; }

/* Reads one prompt per line (a final line without '\n' counts; "\r\n" ends a
 * line like "\n"; a NUL byte is an error naming the line). A .jsonl file
 * holds one JSON object per line instead, {"prompt": "..."}, so that a prompt
 * may hold any text (line ends too); blank lines are skipped there. */
char **cli_read_prompts(const char *path, int *n_out) {
    FILE *f = fopen(path, "rb");
    if (!f) cli_die(EXIT_BAD_INPUT, "%s: cannot open", path);
    char **lines = calloc(MAX_PROMPTS, sizeof *lines);
    char *buf = malloc(MAX_PROMPT_BYTES + 2);
    int n = 0, line_no = 0;
    size_t len;
    bool json = is_jsonl(path);
    if (!lines || !buf) cli_die(1, "out of host memory");
    while (cli_read_line(f, path, ++line_no, buf, MAX_PROMPT_BYTES, &len)) {
        if (json && blank(buf)) continue;
        if (n == MAX_PROMPTS) cli_die(EXIT_BAD_INPUT, "%s: more than %d prompts", path, MAX_PROMPTS);
        lines[n] = json ? json_prompt(path, line_no, buf, len) : strdup(buf);
        if (!lines[n++]) cli_die(1, "out of host memory");
    }
    if (ferror(f)) cli_die(EXIT_BAD_INPUT, "%s: cannot read: %s", path, strerror(errno)); /* a directory, say */
    fclose(f);
    free(buf);
    if (n == 0) cli_die(EXIT_BAD_INPUT, "%s: no prompts", path);
    *n_out = n;
    return lines;
}

/* Without a tokenizer a prompt is BOS followed by the ids written in it
 * (whitespace-separated integers in [0, vocab)): random models have no text. */
static void parse_id_prompt(const char *text, int vocab, vks_sequence *s, int bos) {
    s->ids[0] = bos;
    s->n_prompt = 1;
    for (const char *p = text;;) {
        while (*p == ' ' || *p == '\t') p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || (*end && *end != ' ' && *end != '\t') || v < 0 || v >= vocab)
            cli_die(EXIT_BAD_INPUT, "prompt '%.40s': without --tokenizer a prompt is token ids in [0, %d)", text, vocab);
        s->ids[s->n_prompt++] = (int32_t)v;
        p = end;
    }
}

void cli_encode_prompt(const vks_tokenizer *t, int vocab, const char *text, vks_sequence *s, int bos) {
    size_t len = strlen(text);
    s->ids = malloc(sizeof(int32_t) * (len + 3));
    if (!s->ids) cli_die(1, "out of host memory");
    s->stop_token = -1;
    if (!t) {
        parse_id_prompt(text, vocab, s, bos);
        return;
    }
    if (vks_tokenizer_encode(t, text, len, true, false, s->ids, &s->n_prompt))
        cli_die(EXIT_BAD_INPUT, "cannot encode prompt: %s", vks_last_error());
}

void cli_check_chat_flags(const char *cmd, const vks_prompt_format *f, const vks_tokenizer *t) {
    if (vks_prompt_is_raw(f)) return;
    if (!t) cli_usage_error(cmd, "--chat-template needs the model's tokenizer (--tokenizer)");
    cli_check_prompt(cmd, f, t, 0);
}

void cli_encode_formatted_prompt(const char *cmd, const vks_prompt_format *f, const vks_tokenizer *t, int vocab,
                                 const char *text, int index, vks_sequence *s) {
    if (vks_prompt_is_raw(f)) {
        cli_encode_prompt(t, vocab, text, s, 1);
        return;
    }
    if (index == 0) {
        char *shown = NULL;
        size_t len = 0;
        if (vks_prompt_text(f, vks_tokenizer_chat_template(t), text, 0, &shown, &len))
            cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
        cli_show_prompt((void *)cmd, shown, len);
        free(shown);
    }
    *s = (vks_sequence){.stop_token = -1};
    if (vks_prompt_tokenize(f, t, text, 0, &s->ids, &s->n_prompt))
        cli_die(EXIT_BAD_INPUT, "%s: prompt %d: %s", cmd, index + 1, vks_last_error());
    for (int k = 0; k < s->n_prompt; k++)
        if (s->ids[k] >= vocab)
            cli_die(EXIT_BAD_INPUT, "%s: prompt %d: token %d outside the model's vocabulary", cmd, index + 1, s->ids[k]);
    s->n_ids = s->n_prompt;
}

/* What run.c prints for a sequence: decode(prev, next) for each pair. run.c's
 * safe_printf drops single-byte pieces that are not printable: that rule is
 * for llama2.c vocabularies; GGUF and tokenizer.json pieces print their bytes
 * (a byte-level vocabulary spells a UTF-8 character in several tokens). */
char *cli_sequence_text(const vks_tokenizer *t, const vks_sequence *s, size_t *len_out) {
    size_t cap = 64, len = 0;
    char *out = malloc(cap);
    bool run_c_filter = t && !strcmp(vks_tokenizer_kind(t), "llama2c");
    for (int i = 0; out && i + 1 < s->n_ids; i++) {
        char buf[32];
        size_t plen;
        const char *piece;
        if (t) {
            piece = vks_tokenizer_decode(t, s->ids[i], s->ids[i + 1], buf, &plen);
            if (run_c_filter ? !vks_tokenizer_piece_printable(piece, plen) : plen == 0) continue;
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

long cli_generated_tokens(const vks_sequence *seqs, int n) {
    long total = 0;
    for (int i = 0; i < n; i++)
        if (seqs[i].n_ids > seqs[i].n_prompt) total += seqs[i].n_ids - seqs[i].n_prompt; /* -n may end in the prompt */
    return total;
}

void cli_print_json(const char *prompt, const vks_sequence *s, const char *text, size_t len) {
    fputs("{\"prompt\":", stdout);
    cli_json_string(stdout, prompt, strlen(prompt));
    fputs(",\"ids\":[", stdout);
    for (int i = 0; i < s->n_ids; i++) printf("%s%d", i ? "," : "", s->ids[i]);
    fputs("],\"text\":", stdout);
    cli_json_string(stdout, text, len);
    fputs("}\n", stdout);
}


void cli_sampling_defaults(cli_sampling *s) {
    *s = (cli_sampling){.steps = 256, .temperature = 1.0f, .top_p = 0.9f};
}

bool cli_sampling_option(cli_sampling *s, const char *name, const char *val) {
    if (!strcmp(name, "n")) s->steps = (int)cli_parse_long("-n", val, 0, 1 << 20);
    else if (!strcmp(name, "temp")) s->temperature = (float)cli_parse_double("--temp", val, 0, 1e6);
    else if (!strcmp(name, "top-p")) s->top_p = (float)cli_parse_double("--top-p", val, 0, 1);
    else if (!strcmp(name, "top-k")) s->top_k = (uint32_t)cli_parse_long("--top-k", val, 0, 1 << 24);
    else if (!strcmp(name, "seed")) {
        s->seed = cli_parse_u64("--seed", val);
        s->seed_given = true;
    } else return false;
    return true;
}

void cli_sampling_finish(cli_sampling *s) {
    if (!s->seed_given) s->seed = (uint64_t)time(NULL);
    fprintf(stderr, "vkswarm: seed %llu\n", (unsigned long long)s->seed);
}

vks_sched_params cli_sched_params(const cli_sampling *s, const vks_model *m, const vks_tokenizer *t) {
    return (vks_sched_params){.steps = vks_sched_steps(s->steps, m->cfg.seq_len), .temperature = s->temperature, .top_p = s->top_p, .top_k = s->top_k,
                              .seed = s->seed, .stop_token_a = t ? vks_tokenizer_bos(t) : 1,
                              .stop_token_b = t ? vks_tokenizer_eos(t) : -1};
}
