/* test_train_io.c: the host side of training: SFT data and its batcher,
 * checkpoints (round trip, resume, corruption, keep N), metrics and the SVG
 * plot and timeline. No GPU except one `vkswarm generate` on a checkpoint. */
#include "test_util.h"
#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_ref_train.h"
#include "vkswarm/vks_sft_data.h"
#include "vkswarm/vks_tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define BOS 256
#define EOS 257
#define VOCAB 258

/* ---- helpers ---- */

static void write_file(const char *path, const void *data, size_t len) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    assert_int_equal(fclose(f), 0);
}

static bool exists(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0;
}

/* GPT-2's byte-to-unicode table as UTF-8 (a byte-level BPE's piece spelling). */
static void byte_piece(int b, char out[4]) {
    int cp = b, extra = 0;
    bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (!direct) {
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255))) extra++;
        cp = 256 + extra;
    }
    if (cp < 0x80) out[0] = (char)cp, out[1] = 0;
    else out[0] = (char)(0xC0 | (cp >> 6)), out[1] = (char)(0x80 | (cp & 0x3F)), out[2] = 0;
}

/* A byte-level tokenizer (id b = byte b, BOS 256, EOS 257, no merges) as
 * tokenizer.json + tokenizer_config.json in dir. */
static void write_byte_tokenizer(const char *dir) {
    json_t *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        char piece[4];
        byte_piece(b, piece);
        json_object_set_new(vocab, piece, json_integer(b));
    }
    json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", BOS, "content", "<|bos|>", "special", 1));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", EOS, "content", "<|eos|>", "special", 1));
    json_t *root = json_pack("{s:{s:s,s:o,s:[]},s:{s:s,s:b,s:b},s:o}", "model", "type", "BPE", "vocab", vocab, "merges",
                             "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0, "use_regex", 1,
                             "added_tokens", added);
    assert_non_null(root);
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(json_dump_file(root, path, JSON_COMPACT), 0);
    json_decref(root);
    json_t *cfg = json_pack("{s:s,s:s,s:b}", "bos_token", "<|bos|>", "eos_token", "<|eos|>", "add_bos_token", 1);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    assert_int_equal(json_dump_file(cfg, path, JSON_INDENT(1)), 0);
    json_decref(cfg);
}

static char tok_dir[256];

/* The directory holding the test tokenizer's files (made once). */
static const char *ensure_tok_dir(void) {
    if (!tok_dir[0]) {
        snprintf(tok_dir, sizeof tok_dir, "%s", tu_tmpdir());
        write_byte_tokenizer(tok_dir);
    }
    return tok_dir;
}

static vks_tokenizer *byte_tokenizer(void) {
    ensure_tok_dir();
    char path[512];
    snprintf(path, sizeof path, "%s/tokenizer.json", tok_dir);
    vks_tokenizer *t = NULL;
    if (vks_tokenizer_load_hf_json(path, &t) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_int_equal(vks_tokenizer_vocab_size(t), VOCAB);
    assert_int_equal(vks_tokenizer_bos(t), BOS);
    assert_int_equal(vks_tokenizer_eos(t), EOS);
    return t;
}

static vks_sft_options sft_opts(int seq_len) { return (vks_sft_options){.seq_len = seq_len, .vocab_size = VOCAB}; }

static vks_sft_data *parse_ok(const char *text, const vks_sft_options *o) {
    vks_tokenizer *t = byte_tokenizer();
    vks_sft_data *d = NULL;
    int rc = vks_sft_data_parse(text, strlen(text), "d.jsonl", t, o, &d);
    if (rc != VKS_OK) fail_msg("%s", vks_last_error());
    vks_tokenizer_free(t);
    return d;
}

/* The error of parsing text, which must fail; copied out. */
static const char *parse_error(const char *text, size_t len, const vks_sft_options *o) {
    static char msg[512];
    vks_tokenizer *t = byte_tokenizer();
    vks_sft_data *d = NULL;
    int rc = vks_sft_data_parse(text, len, "d.jsonl", t, o, &d);
    vks_tokenizer_free(t);
    assert_int_not_equal(rc, VKS_OK);
    assert_null(d);
    snprintf(msg, sizeof msg, "%s", vks_last_error());
    return msg;
}

static void assert_contains(const char *hay, const char *needle) {
    if (!strstr(hay, needle)) fail_msg("'%s' does not contain '%s'", hay, needle);
}

/* ---- SFT data ---- */

static void check_sequence(const vks_sft_data *d, int64_t i, const char *prompt, const char *body, int64_t line) {
    const int32_t *tok;
    const uint8_t *mask;
    int len;
    int64_t at_line;
    assert_int_equal(vks_sft_data_sequence(d, i, &tok, &mask, &len, &at_line), VKS_OK);
    int np = (int)strlen(prompt), nb = (int)strlen(body);
    assert_int_equal(len, 2 + np + nb);
    assert_int_equal(at_line, line);
    assert_int_equal(tok[0], BOS);
    assert_int_equal(mask[0], 0);
    for (int k = 0; k < np; k++) {
        assert_int_equal(tok[1 + k], (unsigned char)prompt[k]);
        assert_int_equal(mask[1 + k], 0);
    }
    for (int k = 0; k < nb; k++) {
        assert_int_equal(tok[1 + np + k], (unsigned char)body[k]);
        assert_int_equal(mask[1 + np + k], 1);
    }
    assert_int_equal(tok[len - 1], EOS);
    assert_int_equal(mask[len - 1], 1);
}

/* Multi-turn transcripts ({"prompt", "turns"}): BOS prompt, each assistant turn and EOS in the loss, the
 * environment's messages between them (each content and "\n", one run as one text) out of it, token by token
 * against the byte tokenizer; malformed transcripts named. */
static void test_sft_turns(void **state) {
    (void)state;
    vks_sft_options o = sft_opts(64);
    vks_sft_data *d = parse_ok("{\"prompt\": \"q\", \"turns\": [{\"role\": \"assistant\", \"content\": \"c:1\"}, "
                               "{\"role\": \"tool\", \"content\": \"=1\"}, {\"role\": \"user\", \"content\": \"go\"}, "
                               "{\"role\": \"assistant\", \"content\": \"a\"}]}\n", &o);
    const int32_t *tok;
    const uint8_t *mask;
    int len;
    int64_t line;
    assert_int_equal(vks_sft_data_sequence(d, 0, &tok, &mask, &len, &line), VKS_OK);
    /* BOS q | c : 1 EOS | = 1 \n g o \n | a EOS */
    const int want[] = {BOS, 'q', 'c', ':', '1', EOS, '=', '1', '\n', 'g', 'o', '\n', 'a', EOS};
    const uint8_t loss[] = {0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 1, 1};
    assert_int_equal(len, (int)(sizeof want / sizeof want[0]));
    for (int k = 0; k < len; k++) {
        assert_int_equal(tok[k], want[k]);
        assert_int_equal(mask[k], loss[k]);
    }
    vks_sft_stats st;
    vks_sft_data_stats(d, &st);
    assert_int_equal(st.n_loss_tokens, 6);
    vks_sft_data_free(d);
    static const struct { const char *line, *msg; } bad[] = {
        {"{\"prompt\": \"q\", \"turns\": []}", "\"turns\" is not a list of 1 to"},
        {"{\"prompt\": \"q\", \"turns\": [{\"role\": \"assistant\", \"content\": \"a\"}, {\"role\": \"tool\", "
         "\"content\": \"x\"}]}", "ends with a message that is not the assistant's"},
        {"{\"prompt\": \"q\", \"turns\": [{\"role\": \"robot\", \"content\": \"a\"}]}",
         "\"turns\"[0]: \"role\" is not assistant, system, user or tool"},
        {"{\"prompt\": \"q\", \"turns\": [{\"role\": \"assistant\", \"content\": 3}]}",
         "\"turns\"[0]: \"content\" is not a string"},
        {"{\"prompt\": \"q\", \"completion\": \"a\", \"turns\": [{\"role\": \"assistant\", \"content\": \"a\"}]}",
         "\"turns\" beside \"completion\" or \"text\""},
        {"{\"turns\": [{\"role\": \"assistant\", \"content\": \"a\"}]}", "\"prompt\" is not a string"},
    };
    o.strict = true;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *msg = parse_error(bad[i].line, strlen(bad[i].line), &o);
        assert_contains(msg, "d.jsonl: line 1: ");
        assert_contains(msg, bad[i].msg);
    }
}

static void test_sft_masks(void **state) {
    (void)state;
    vks_sft_options o = sft_opts(64);
    vks_sft_data *d = parse_ok("{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n"
                               "\n"
                               "{\"text\": \"hello\", \"id\": 7}\n"
                               "{\"completion\": \"\", \"prompt\": \"x\\u0000y\"}",
                               &o);
    assert_int_equal(vks_sft_data_count(d), 3);
    check_sequence(d, 0, "2+2=", "4", 1);
    check_sequence(d, 1, "", "hello", 3); /* text: loss on every token after BOS */
    vks_sft_data_free(d);
    /* special tokens typed into the data stay text: a line cannot forge BOS/EOS */
    d = parse_ok("{\"prompt\": \"<|eos|>\", \"completion\": \"<|bos|>\"}\n", &o);
    check_sequence(d, 0, "<|eos|>", "<|bos|>", 1);
    vks_sft_data_free(d);
    d = parse_ok("{\"prompt\": \"2+2=\", \"completion\": \"4\"}\n"
                 "\n"
                 "{\"text\": \"hello\", \"id\": 7}\n"
                 "{\"completion\": \"\", \"prompt\": \"x\\u0000y\"}",
                 &o);
    const int32_t *tok;
    const uint8_t *mask;
    int len;
    assert_int_equal(vks_sft_data_sequence(d, 2, &tok, &mask, &len, NULL), VKS_OK);
    int32_t want[] = {BOS, 'x', 0, 'y', EOS}; /* an embedded NUL is a byte like any other */
    uint8_t want_mask[] = {0, 0, 0, 0, 1};    /* an empty completion still learns to stop */
    assert_int_equal(len, 5);
    assert_memory_equal(tok, want, sizeof want);
    assert_memory_equal(mask, want_mask, sizeof want_mask);
    vks_sft_stats s;
    vks_sft_data_stats(d, &s);
    assert_int_equal(s.n_sequences, 3);
    assert_int_equal(s.n_tokens, 7 + 7 + 5);
    assert_int_equal(s.n_loss_tokens, 2 + 6 + 1);
    assert_int_equal(s.max_len, 7);
    assert_int_equal(s.n_lines, 4);
    assert_int_equal(s.n_malformed, 0);
    assert_int_equal(vks_sft_data_sequence(d, 3, NULL, NULL, NULL, NULL), VKS_ERR_ARG);
    vks_sft_data_free(d);
}

static void test_sft_bom_crlf_blank(void **state) {
    (void)state;
    vks_sft_options o = sft_opts(64);
    vks_sft_data *d = parse_ok("\xef\xbb\xbf{\"text\": \"a\"}\r\n \t\r\n\r\n{\"text\": \"b\"}\r\n", &o);
    assert_int_equal(vks_sft_data_count(d), 2);
    check_sequence(d, 0, "", "a", 1);
    check_sequence(d, 1, "", "b", 4);
    vks_sft_data_free(d);
}

static const struct {
    const char *line, *problem;
} malformed[] = {
    {"{\"prompt\": \"a\", \"completion\": ", "bad JSON"},
    {"[\"prompt\", \"completion\"]", "not a JSON object"},
    {"{\"prompt\": \"a\"}", "missing \"completion\""},
    {"{\"completion\": \"a\"}", "missing \"prompt\""},
    {"{\"prompt\": 3, \"completion\": \"a\"}", "\"prompt\" is not a string"},
    {"{\"prompt\": \"a\", \"completion\": null}", "\"completion\" is not a string"},
    {"{\"text\": [\"a\"]}", "\"text\" is not a string"},
    {"{\"text\": \"a\", \"prompt\": \"b\"}", "both"},
    {"{\"answer\": \"a\"}", "neither"},
    {"{\"text\": \"a\", \"text\": \"b\"}", "bad JSON"},       /* duplicate key */
    {"{\"text\": \"\xff\"}", "bad JSON"},                      /* invalid UTF-8 */
    {"{\"text\": \"a\"} {\"text\": \"b\"}", "bad JSON"},       /* two objects on a line */
    {"\"just a string\"", "bad JSON"},
};

static void test_sft_malformed_named(void **state) {
    (void)state;
    vks_sft_options o = sft_opts(64);
    o.strict = true;
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"text\": \"ok\"}\n\n%s\n{\"text\": \"ok\"}\n", malformed[i].line);
        const char *msg = parse_error(text, strlen(text), &o);
        assert_contains(msg, "d.jsonl: line 3: ");
        assert_contains(msg, malformed[i].problem);
    }
    /* lenient: each bad line is counted and skipped, the first message kept */
    o.strict = false;
    char text[4096] = "";
    for (size_t i = 0; i < sizeof malformed / sizeof malformed[0]; i++) {
        strcat(text, malformed[i].line);
        strcat(text, "\n{\"text\": \"ok\"}\n");
    }
    vks_sft_data *d = parse_ok(text, &o);
    vks_sft_stats s;
    vks_sft_data_stats(d, &s);
    size_t n_bad = sizeof malformed / sizeof malformed[0];
    assert_int_equal(s.n_malformed, n_bad);
    assert_int_equal(s.n_sequences, n_bad);
    assert_contains(s.first_error, "d.jsonl: line 1: bad JSON");
    vks_sft_data_free(d);
    /* nothing usable: an error that says why */
    const char *msg = parse_error("{\"text\": 1}\n{\"text\": 2}\n", 24, &o);
    assert_contains(msg, "no usable sequence (2 malformed lines; first: d.jsonl: line 1:");
    assert_contains(parse_error("", 0, &o), "no sequences");
    assert_contains(parse_error("\n \n", 3, &o), "no sequences");
}

static void test_sft_line_limit(void **state) {
    (void)state;
    vks_sft_options o = sft_opts(1 << 20);
    o.max_line_bytes = 64;
    o.strict = true;
    char text[512];
    snprintf(text, sizeof text, "{\"text\": \"short\"}\n{\"text\": \"%0100d\"}\n", 0);
    assert_contains(parse_error(text, strlen(text), &o), "d.jsonl: line 2: longer than 64 bytes");
    o.strict = false; /* lenient too: where the long line ends is never looked for (/dev/zero has no end) */
    strcat(text, "{\"text\": \"after\"}\n");
    assert_contains(parse_error(text, strlen(text), &o), "d.jsonl: line 2: longer than 64 bytes");
    /* a raw NUL byte is named with its place, not read as the end of the text
     * (jansson took '{"text": "a"\0}' whole and called others "end of file") */
    const char raw[] = "{\"text\": \"a\0b\"}\n", cut[] = "{\"text\": \"a\"\0}\n";
    o.strict = true;
    assert_contains(parse_error(raw, sizeof raw - 1, &o), "d.jsonl: line 1: a NUL byte at byte 12");
    assert_contains(parse_error(cut, sizeof cut - 1, &o), "d.jsonl: line 1: a NUL byte at byte 13");
    /* a line without end fails at the limit (an alarm turns reading forever into a failure) */
    vks_tokenizer *t = byte_tokenizer();
    vks_sft_data *none = NULL;
    alarm(60);
    int rc = vks_sft_data_load("/dev/zero", t, &o, &none);
    alarm(0);
    vks_tokenizer_free(t);
    assert_int_equal(rc, VKS_ERR_FORMAT);
    assert_contains(vks_last_error(), "/dev/zero: line 1: longer than 64 bytes");
}

static void test_sft_long_sequences(void **state) {
    (void)state;
    const char *text = "{\"prompt\": \"abc\", \"completion\": \"defgh\"}\n" /* 10 tokens */
                       "{\"prompt\": \"abcdefgh\", \"completion\": \"ij\"}\n" /* prompt fills 8 + BOS */
                       "{\"text\": \"0123456789\"}\n"                          /* 12 tokens */
                       "{\"text\": \"ok\"}\n";
    vks_sft_options o = sft_opts(8);
    const char *msg = parse_error(text, strlen(text), &o);
    assert_contains(msg, "d.jsonl: line 1: 10 tokens (BOS and EOS included) exceed the context of 8");
    o.strict = false; /* a length refusal is not a malformed line: lenient mode refuses too */
    assert_contains(parse_error(text, strlen(text), &o), "line 1: 10 tokens");

    o.long_policy = VKS_SFT_LONG_SKIP;
    vks_sft_data *d = parse_ok(text, &o);
    vks_sft_stats s;
    vks_sft_data_stats(d, &s);
    assert_int_equal(s.n_sequences, 1);
    assert_int_equal(s.n_skipped_long, 3);
    check_sequence(d, 0, "", "ok", 4);
    vks_sft_data_free(d);

    o.long_policy = VKS_SFT_LONG_TRUNCATE;
    d = parse_ok(text, &o);
    vks_sft_data_stats(d, &s);
    assert_int_equal(s.n_sequences, 3);
    assert_int_equal(s.n_truncated, 2);
    assert_int_equal(s.n_skipped_long, 1); /* line 2 keeps no completion token */
    assert_int_equal(s.max_len, 8);
    const int32_t *tok;
    const uint8_t *mask;
    int len;
    int64_t line;
    assert_int_equal(vks_sft_data_sequence(d, 0, &tok, &mask, &len, &line), VKS_OK);
    int32_t want[] = {BOS, 'a', 'b', 'c', 'd', 'e', 'f', 'g'}; /* cut: no EOS */
    uint8_t want_mask[] = {0, 0, 0, 0, 1, 1, 1, 1};
    assert_int_equal(len, 8);
    assert_memory_equal(tok, want, sizeof want);
    assert_memory_equal(mask, want_mask, sizeof want_mask);
    assert_int_equal(vks_sft_data_sequence(d, 1, &tok, &mask, &len, &line), VKS_OK);
    assert_int_equal(line, 3);
    assert_int_equal(len, 8);
    assert_int_equal(tok[7], '6');
    vks_sft_data_free(d);

    o.long_policy = VKS_SFT_LONG_REFUSE;
    o.seq_len = 1;
    vks_tokenizer *t = byte_tokenizer();
    vks_sft_data *none = NULL;
    assert_int_equal(vks_sft_data_parse(text, strlen(text), "d.jsonl", t, &o, &none), VKS_ERR_ARG);
    o.seq_len = 64;
    o.vocab_size = 200; /* the tokenizer's ids do not fit such a model */
    assert_int_equal(vks_sft_data_parse(text, strlen(text), "d.jsonl", t, &o, &none), VKS_ERR_ARG);
    vks_tokenizer_free(t);
}

static void test_sft_file_and_hash(void **state) {
    (void)state;
    const char *text = "{\"prompt\": \"q\", \"completion\": \"a\"}\n{\"text\": \"t\"}\n";
    char path[512];
    snprintf(path, sizeof path, "%s/data.jsonl", tu_tmpdir());
    write_file(path, text, strlen(text));
    vks_tokenizer *t = byte_tokenizer();
    vks_sft_options o = sft_opts(64);
    vks_sft_data *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(vks_sft_data_load(path, t, &o, &a), VKS_OK);
    assert_int_equal(vks_sft_data_parse(text, strlen(text), "x", t, &o, &b), VKS_OK);
    const char *other = "{\"prompt\": \"q\", \"completion\": \"b\"}\n{\"text\": \"t\"}\n";
    assert_int_equal(vks_sft_data_parse(other, strlen(other), "x", t, &o, &c), VKS_OK);
    uint8_t ha[32], hb[32], hc[32];
    assert_int_equal(vks_sft_data_hash(a, ha), VKS_OK);
    assert_int_equal(vks_sft_data_hash(b, hb), VKS_OK);
    assert_int_equal(vks_sft_data_hash(c, hc), VKS_OK);
    assert_memory_equal(ha, hb, 32);
    assert_memory_not_equal(ha, hc, 32);
    strcat(path, ".missing");
    vks_sft_data *none = NULL;
    assert_int_equal(vks_sft_data_load(path, t, &o, &none), VKS_ERR_IO);
    assert_contains(vks_last_error(), "data.jsonl.missing: cannot open");
    vks_sft_data_free(a);
    vks_sft_data_free(b);
    vks_sft_data_free(c);
    vks_tokenizer_free(t);
}

/* ---- the batcher ---- */

/* n sequences of varied lengths: "text" i is i % 13 + 1 copies of a letter. */
static vks_sft_data *varied_data(int n) {
    size_t cap = (size_t)n * 64 + 1;
    char *text = calloc(cap, 1);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        len += (size_t)snprintf(text + len, cap - len, "{\"prompt\": \"%c\", \"completion\": \"%.*s\"}\n", 'a' + i % 26,
                                i % 13 + 1, "zzzzzzzzzzzzzz");
    }
    vks_sft_options o = sft_opts(32);
    o.strict = true;
    vks_sft_data *d = parse_ok(text, &o);
    free(text);
    assert_int_equal(vks_sft_data_count(d), n);
    return d;
}

/* Every row of a batch against the data it came from. */
static void check_batch(const vks_sft_data *d, const vks_sft_batch *x, int max_tokens) {
    assert_true(x->n_tokens > 0 && x->n_tokens <= max_tokens);
    int row = 0, loss = 0;
    for (int s = 0; s < x->n_seqs; s++) {
        const int32_t *tok;
        const uint8_t *mask;
        int len;
        assert_int_equal(vks_sft_data_sequence(d, x->seq_index[s], &tok, &mask, &len, NULL), VKS_OK);
        assert_int_equal(x->seq_lens[s], len);
        for (int t = 0; t < len; t++, row++) {
            assert_int_equal(x->tokens[row], tok[t]);
            assert_int_equal(x->seq_start[row], row - t);
            assert_int_equal(x->pos[row], t);
            assert_int_equal(x->targets[row], t + 1 < len ? tok[t + 1] : -1);
            assert_int_equal(x->loss_mask[row], t + 1 < len ? mask[t + 1] : 0);
            loss += x->loss_mask[row];
        }
    }
    assert_int_equal(row, x->n_tokens);
    assert_int_equal(loss, x->n_loss_tokens);
}

static void test_batcher_packs_epochs(void **state) {
    (void)state;
    int n = 50;
    vks_sft_data *d = varied_data(n);
    vks_sft_batcher_options bo = {.max_tokens = 40, .seed = 7, .shuffle = true};
    vks_sft_batcher *b = NULL;
    assert_int_equal(vks_sft_batcher_create(d, &bo, &b), VKS_OK);
    int64_t first_epoch_order[50], k = 0;
    for (int epoch = 0; epoch < 3; epoch++) {
        int seen[50] = {0}, count = 0;
        while (count < n) {
            const vks_sft_batch *x;
            assert_int_equal(vks_sft_batcher_next(b, &x), VKS_OK);
            assert_int_equal(x->epoch, epoch);
            check_batch(d, x, bo.max_tokens);
            for (int s = 0; s < x->n_seqs; s++) {
                seen[x->seq_index[s]]++;
                count++;
                if (epoch == 0) first_epoch_order[k++] = x->seq_index[s];
            }
        }
        assert_int_equal(count, n); /* a batch never spans epochs */
        for (int i = 0; i < n; i++) assert_int_equal(seen[i], 1);
        vks_sft_position p;
        vks_sft_batcher_position(b, &p);
        assert_int_equal(p.epoch, epoch + 1);
        assert_int_equal(p.index, 0);
    }
    bool shuffled = false;
    for (int i = 0; i < n; i++) shuffled |= first_epoch_order[i] != i;
    assert_true(shuffled);
    vks_sft_batcher_free(b);
    /* file order without shuffling, and max_seqs */
    bo.shuffle = false;
    bo.max_seqs = 2;
    assert_int_equal(vks_sft_batcher_create(d, &bo, &b), VKS_OK);
    const vks_sft_batch *x;
    assert_int_equal(vks_sft_batcher_next(b, &x), VKS_OK);
    assert_int_equal(x->n_seqs, 2);
    assert_int_equal(x->seq_index[0], 0);
    assert_int_equal(x->seq_index[1], 1);
    vks_sft_batcher_free(b);
    /* a micro-batch must hold the longest sequence */
    bo.max_tokens = 15; /* longest: BOS + 1 + 13 + EOS = 16 */
    assert_int_equal(vks_sft_batcher_create(d, &bo, &b), VKS_ERR_ARG);
    assert_null(b);
    vks_sft_data_free(d);
}

/* The tokens of the next n batches, back to back, with -1 between batches. */
static int collect(vks_sft_batcher *b, int n, int32_t *out) {
    int k = 0;
    for (int i = 0; i < n; i++) {
        const vks_sft_batch *x;
        assert_int_equal(vks_sft_batcher_next(b, &x), VKS_OK);
        memcpy(out + k, x->tokens, (size_t)x->n_tokens * sizeof *out);
        k += x->n_tokens;
        out[k++] = -1;
    }
    return k;
}

static void test_batcher_resume_exact(void **state) {
    (void)state;
    vks_sft_data *d = varied_data(37);
    vks_sft_batcher_options bo = {.max_tokens = 33, .seed = 12345, .shuffle = true};
    vks_sft_batcher *straight = NULL, *resumed = NULL, *other_seed = NULL;
    assert_int_equal(vks_sft_batcher_create(d, &bo, &straight), VKS_OK);
    static int32_t a[40000], b2[40000], c[40000];
    /* resume points inside the first epoch, near an epoch's end, and epochs on */
    int gaps[] = {1, 4, 8, 27};
    for (size_t i = 0; i < sizeof gaps / sizeof gaps[0]; i++) {
        collect(straight, gaps[i], a);
        vks_sft_position p;
        vks_sft_batcher_position(straight, &p);
        assert_true(p.seed == 12345);
        int na = collect(straight, 30, a);
        /* a fresh batcher with another seed in its options: the position carries the seed */
        vks_sft_batcher_options ro = bo;
        ro.seed = 999;
        assert_int_equal(vks_sft_batcher_create(d, &ro, &resumed), VKS_OK);
        collect(resumed, 3, b2); /* wherever it was: seek replaces it */
        assert_int_equal(vks_sft_batcher_seek(resumed, &p), VKS_OK);
        int nb = collect(resumed, 30, b2);
        assert_int_equal(na, nb);
        assert_memory_equal(a, b2, (size_t)na * sizeof *a);
        vks_sft_batcher_free(resumed);
    }
    /* another seed gives another order */
    vks_sft_position p0 = {.seed = 1, .epoch = 0, .index = 0}, p1 = {.seed = 2, .epoch = 0, .index = 0};
    assert_int_equal(vks_sft_batcher_create(d, &bo, &other_seed), VKS_OK);
    assert_int_equal(vks_sft_batcher_seek(other_seed, &p0), VKS_OK);
    int n0 = collect(other_seed, 6, c);
    assert_int_equal(vks_sft_batcher_seek(other_seed, &p1), VKS_OK);
    int n1 = collect(other_seed, 6, b2);
    assert_false(n0 == n1 && memcmp(c, b2, (size_t)n0 * sizeof *c) == 0);
    /* positions outside the data are refused */
    vks_sft_position bad[] = {{1, -1, 0}, {1, 0, -1}, {1, 0, 37}, {1, (int64_t)1 << 33, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_equal(vks_sft_batcher_seek(other_seed, &bad[i]), VKS_ERR_FORMAT);
    vks_sft_batcher_free(other_seed);
    vks_sft_batcher_free(straight);
    vks_sft_data_free(d);
}

/* ---- parameter layout and checkpoints ---- */

static vks_model_config tiny_config(bool shared, int rope_mode) {
    vks_model_config c = {.dim = 32, .hidden_dim = 40, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = VOCAB, .seq_len = 64, .head_dim = 8, .kv_dim = 16, .norm_eps = 1e-5f,
                          .rope_theta = 10000.0f, .rope_mode = rope_mode, .shared_classifier = shared};
    return c;
}

static void test_layout_matches_ref_params(void **state) {
    (void)state;
    for (int variant = 0; variant < 4; variant++) {
        vks_model_config c = tiny_config(variant & 1, VKS_ROPE_HALF);
        bool bias = variant & 2;
        vks_param_layout *l = NULL;
        vks_ref_params *p = NULL;
        assert_int_equal(vks_param_layout_create(&c, bias, &l), VKS_OK);
        assert_int_equal(vks_ref_params_create(&c, bias, &p), VKS_OK);
        assert_int_equal(l->n_tensors, p->n_tensors);
        assert_int_equal(l->n_values, p->n_values);
        for (int i = 0; i < l->n_tensors; i++) {
            assert_string_equal(l->tensors[i].name, p->tensors[i].name);
            assert_int_equal(l->tensors[i].rows, p->tensors[i].rows);
            assert_int_equal(l->tensors[i].cols, p->tensors[i].cols);
            assert_int_equal(l->tensors[i].offset, (size_t)(p->tensors[i].data - p->data));
            assert_ptr_equal(vks_param_layout_find(l, l->tensors[i].name), &l->tensors[i]);
        }
        assert_null(vks_param_layout_find(l, "layers.2.wq"));
        vks_ref_params_free(p);
        vks_param_layout_free(l);
    }
}

static void fill(float *x, size_t n, uint64_t seed, bool nonneg) {
    tu_fill_uniform(x, n, seed, nonneg ? 0.0f : -1.0f, 1.0f);
}

typedef struct {
    vks_param_layout *l;
    float *w, *m, *v;
    vks_checkpoint_data c;
} ckpt_fixture;

static void fixture_make(ckpt_fixture *f, const vks_model_config *cfg, bool bias, uint64_t seed) {
    memset(f, 0, sizeof *f);
    assert_int_equal(vks_param_layout_create(cfg, bias, &f->l), VKS_OK);
    size_t n = f->l->n_values;
    f->w = malloc(n * sizeof(float));
    f->m = malloc(n * sizeof(float));
    f->v = malloc(n * sizeof(float));
    fill(f->w, n, seed, false);
    fill(f->m, n, seed + 1, false);
    fill(f->v, n, seed + 2, true);
    for (size_t i = 0; i < n; i++) f->v[i] += f->m[i] * f->m[i]; /* |m| <= sqrt(v): moments Adam can make */
    f->c = (vks_checkpoint_data){.layout = f->l, .weights = f->w, .adam_m = f->m, .adam_v = f->v, .arch = "llama",
                                 .bos_id = BOS, .eos_id = EOS};
    vks_ckpt_state *s = &f->c.state;
    s->step = 123;
    s->tokens_seen = 456789;
    s->seed = 0xfedcba9876543210ull; /* above 2^63: needs the string form */
    s->data = (vks_sft_position){.seed = 18446744073709551615ull, .epoch = 3, .index = 17};
    memset(s->data_hash, 'a', 64);
    s->rng_key = 42;
    s->rng_counter = 1ull << 40;
    s->adam = (vks_adamw_params){.lr = 3e-4 / 7, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
    s->schedule = (vks_lr_schedule){.lr = 3e-4, .min_lr = 3e-5, .warmup_steps = 10, .total_steps = 1000, .cosine = true};
    s->grad_clip = 1.0;
    s->extra_json = "{\"batch\":8,\"data\":\"train.jsonl\",\"note\":[1,2.5,null]}";
}

static void fixture_free(ckpt_fixture *f) {
    vks_param_layout_free(f->l);
    free(f->w);
    free(f->m);
    free(f->v);
}

static void check_state_equal(const vks_ckpt_state *a, const vks_ckpt_state *b) {
    assert_int_equal(a->step, b->step);
    assert_int_equal(a->tokens_seen, b->tokens_seen);
    assert_true(a->seed == b->seed);
    assert_true(a->data.seed == b->data.seed);
    assert_int_equal(a->data.epoch, b->data.epoch);
    assert_int_equal(a->data.index, b->data.index);
    assert_string_equal(a->data_hash, b->data_hash);
    assert_true(a->rng_key == b->rng_key && a->rng_counter == b->rng_counter);
    assert_memory_equal(&a->adam, &b->adam, sizeof a->adam); /* doubles exactly */
    assert_true(a->schedule.lr == b->schedule.lr && a->schedule.min_lr == b->schedule.min_lr);
    assert_int_equal(a->schedule.warmup_steps, b->schedule.warmup_steps);
    assert_int_equal(a->schedule.total_steps, b->schedule.total_steps);
    assert_int_equal(a->schedule.cosine, b->schedule.cosine);
    assert_true(a->grad_clip == b->grad_clip);
    assert_string_equal(a->extra_json, b->extra_json);
}

static void test_checkpoint_roundtrip(void **state) {
    (void)state;
    ensure_tok_dir();
    for (int variant = 0; variant < 2; variant++) {
        vks_model_config cfg = tiny_config(variant == 0, VKS_ROPE_HALF);
        ckpt_fixture f;
        fixture_make(&f, &cfg, variant == 1, 100 + (uint64_t)variant);
        f.c.arch = variant == 1 ? "qwen2" : "llama";
        f.c.tokenizer_dir = tok_dir;
        char dir[512];
        const char *out = tu_tmpdir();
        assert_int_equal(vks_checkpoint_step_dir(out, f.c.state.step, dir, sizeof dir), VKS_OK);
        assert_true(strstr(dir, "/step-000000123") != NULL);
        if (vks_checkpoint_save(dir, &f.c) != VKS_OK) fail_msg("%s", vks_last_error());
        vks_checkpoint *c = NULL;
        if (vks_checkpoint_load(dir, &c) != VKS_OK) fail_msg("%s", vks_last_error());
        assert_int_equal(c->layout->n_values, f.l->n_values);
        assert_int_equal(c->layout->has_bias, variant == 1);
        assert_int_equal(c->layout->cfg.rope_mode, VKS_ROPE_HALF);
        assert_memory_equal(c->weights, f.w, f.l->n_values * sizeof(float));
        assert_memory_equal(c->adam_m, f.m, f.l->n_values * sizeof(float));
        assert_memory_equal(c->adam_v, f.v, f.l->n_values * sizeof(float));
        assert_string_equal(c->arch, f.c.arch);
        assert_int_equal(c->bos_id, BOS);
        assert_int_equal(c->eos_id, EOS);
        check_state_equal(&c->state, &f.c.state);
        /* the tokenizer files came along byte for byte */
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/tokenizer.json", tok_dir);
        snprintf(b, sizeof b, "%s/tokenizer.json", dir);
        size_t la, lb;
        unsigned char *ta = tu_read_file(a, &la), *tb = tu_read_file(b, &lb);
        assert_non_null(tb);
        assert_int_equal(la, lb);
        assert_memory_equal(ta, tb, la);
        free(ta);
        free(tb);
        /* nothing left beside it but the checkpoint */
        DIR *dd = opendir(out);
        struct dirent *e;
        int n = 0;
        while ((e = readdir(dd)) != NULL) n += e->d_name[0] != '.';
        closedir(dd);
        assert_int_equal(n, 1);
        vks_checkpoint_free(c);
        fixture_free(&f);
    }
}

/* Half-split row of adjacent-pair row r (q/k rows within a head of hd). */
static int64_t half_row_source(int64_t r, int hd) {
    int64_t head = r / hd, k = r % hd, half = hd / 2;
    return head * hd + 2 * (k % half) + k / half; /* dst j*half+i <- src 2i+j */
}

static void check_permuted(const vks_param_layout *l, const float *orig, const float *loaded) {
    int hd = l->cfg.head_dim;
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *t = &l->tensors[i];
        bool qk = strstr(t->name, ".wq") || strstr(t->name, ".wk");
        bool qk_bias = strstr(t->name, ".bq") || strstr(t->name, ".bk");
        for (int64_t r = 0; r < t->rows; r++)
            for (int64_t col = 0; col < t->cols; col++) {
                int64_t sr = qk ? half_row_source(r, hd) : r, sc = qk_bias ? half_row_source(col, hd) : col;
                float want = orig[t->offset + (size_t)(sr * t->cols + sc)];
                float got = loaded[t->offset + (size_t)(r * t->cols + col)];
                if (memcmp(&want, &got, sizeof want)) fail_msg("%s[%lld,%lld]", t->name, (long long)r, (long long)col);
            }
    }
}

static void test_checkpoint_rope_order(void **state) {
    (void)state;
    /* a model trained in llama2.c's adjacent-pair order comes back half-split,
     * its moments permuted with it (as the engine loads either) */
    vks_model_config cfg = tiny_config(false, VKS_ROPE_ADJACENT);
    ckpt_fixture f;
    fixture_make(&f, &cfg, true, 7);
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", tu_tmpdir());
    if (vks_checkpoint_save(dir, &f.c) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_checkpoint *c = NULL;
    if (vks_checkpoint_load(dir, &c) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_int_equal(c->layout->cfg.rope_mode, VKS_ROPE_HALF);
    check_permuted(f.l, f.w, c->weights);
    check_permuted(f.l, f.m, c->adam_m);
    check_permuted(f.l, f.v, c->adam_v);
    vks_checkpoint_free(c);
    fixture_free(&f);
}

static void test_checkpoint_is_a_model(void **state) {
    (void)state;
    ensure_tok_dir();
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 9);
    for (size_t i = 0; i < f.l->n_values; i++) f.w[i] *= 0.1f;
    f.c.tokenizer_dir = tok_dir;
    f.c.adam_m = f.c.adam_v = NULL; /* weights only */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/ckpt", tu_tmpdir());
    if (vks_checkpoint_save(dir, &f.c) != VKS_OK) fail_msg("%s", vks_last_error());
    char opt_path[600];
    snprintf(opt_path, sizeof opt_path, "%s/optimizer.safetensors", dir);
    assert_false(exists(opt_path));
    /* any model reader takes it, tokenizer included */
    vks_model *m = NULL;
    if (vks_model_load(dir, &m) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_tokenizer *t = NULL;
    if (vks_tokenizer_load_auto(NULL, m, &t) != VKS_OK) fail_msg("%s", vks_last_error());
    int32_t *ids = NULL;
    int n = 0;
    vks_tokenize_options to = {.add_bos = true};
    assert_int_equal(vks_tokenizer_tokenize(t, "hi", 2, &to, &ids, &n), VKS_OK);
    int32_t want[] = {BOS, 'h', 'i'};
    assert_int_equal(n, 3);
    assert_memory_equal(ids, want, sizeof want);
    free(ids);
    vks_tokenizer_free(t);
    vks_checkpoint *c = NULL;
    assert_int_equal(vks_checkpoint_load(dir, &c), VKS_OK);
    assert_null(c->adam_m);
    assert_null(c->adam_v);
    vks_checkpoint_free(c);
    vks_model_free(m);
    /* and the command line generates from it */
    char cmd[1024], *text = NULL;
    snprintf(cmd, sizeof cmd, "printf ab | %s tokenize --model %s 2>&1", tu_bin(), dir);
    assert_int_equal(tu_run(cmd, &text), 0);
    assert_string_equal(text, "256 97 98\n");
    free(text);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt hi -n 6 --temp 0 2>&1 >/dev/null", tu_bin(), dir);
    int rc = tu_run(cmd, &text);
    if (rc != 0) fail_msg("generate from a checkpoint: %s", text);
    free(text);
    fixture_free(&f);
}

/* Loading dir must fail with a message holding `want`. */
static void assert_refused(const char *dir, const char *want) {
    vks_checkpoint *c = NULL;
    int rc = vks_checkpoint_load(dir, &c);
    if (rc == VKS_OK) fail_msg("%s: loaded, expected '%s'", dir, want);
    assert_null(c);
    assert_contains(vks_last_error(), want);
}

/* Copies a checkpoint directory's files (flat) into a new one. */
static void copy_dir(const char *from, const char *to) {
    assert_int_equal(mkdir(to, 0777), 0);
    DIR *d = opendir(from);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/%s", from, e->d_name);
        snprintf(b, sizeof b, "%s/%s", to, e->d_name);
        size_t n;
        unsigned char *buf = tu_read_file(a, &n);
        assert_non_null(buf);
        write_file(b, buf, n);
        free(buf);
    }
    closedir(d);
}

static void edit_file(const char *dir, const char *name, long at, int delta, long truncate_to) {
    char p[600];
    assert_true(snprintf(p, sizeof p, "%s/%s", dir, name) < (int)sizeof p);
    size_t n;
    unsigned char *buf = tu_read_file(p, &n);
    assert_non_null(buf);
    if (at >= 0) buf[(size_t)at % n] ^= (unsigned char)delta;
    write_file(p, buf, truncate_to >= 0 ? (size_t)truncate_to : n);
    free(buf);
}

/* state.json with one key replaced by a JSON value (text). */
static void set_state_key(const char *dir, const char *obj, const char *key, const char *value) {
    char p[600];
    snprintf(p, sizeof p, "%s/state.json", dir);
    json_t *root = json_load_file(p, 0, NULL);
    assert_non_null(root);
    json_t *target = obj ? json_object_get(root, obj) : root;
    json_t *v = json_loads(value, JSON_DECODE_ANY, NULL);
    assert_non_null(v);
    json_object_set_new(target, key, v);
    assert_int_equal(json_dump_file(root, p, 0), 0);
    json_decref(root);
}

static void test_checkpoint_corrupt_refused(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(false, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 11);
    const char *root = tu_tmpdir();
    char good[512], bad[600];
    snprintf(good, sizeof good, "%s/good", root);
    assert_int_equal(vks_checkpoint_save(good, &f.c), VKS_OK);
    int k = 0;
#define FRESH() (snprintf(bad, sizeof bad, "%s/bad%d", root, k++), copy_dir(good, bad), bad)
    /* a crash before state.json: the writer's temporary never looks complete */
    FRESH();
    char p[700];
    snprintf(p, sizeof p, "%s/state.json", bad);
    unlink(p);
    assert_refused(bad, "state.json: missing: not a complete checkpoint");
    edit_file(FRESH(), "state.json", -1, 0, 200);
    assert_refused(bad, "state.json: bad JSON");
    /* a NUL byte (in place of the closing brace) is named as one, with its offset */
    FRESH();
    snprintf(p, sizeof p, "%s/state.json", bad);
    size_t n;
    unsigned char *text = tu_read_file(p, &n);
    assert_non_null(text);
    unsigned char *brace = text + n;
    while (brace > text && *--brace != '}') {}
    assert_int_equal(*brace, '}');
    *brace = 0;
    write_file(p, text, n);
    char want[64];
    snprintf(want, sizeof want, "state.json: a NUL byte at offset %zu", (size_t)(brace - text));
    free(text);
    assert_refused(bad, want);
    set_state_key(FRESH(), NULL, "complete", "false");
    assert_refused(bad, "not complete");
    set_state_key(FRESH(), NULL, "version", "2");
    assert_refused(bad, "checkpoint version 2");
    set_state_key(FRESH(), NULL, "step", "-1");
    assert_refused(bad, "\"step\" is out of range");
    set_state_key(FRESH(), NULL, "seed", "\"12x\"");
    assert_refused(bad, "\"seed\" is not a decimal string");
    set_state_key(FRESH(), NULL, "seed", "\"18446744073709551616\"");
    assert_refused(bad, "\"seed\" is out of range");
    set_state_key(FRESH(), "data", "epoch", "4294967296");
    assert_refused(bad, "\"epoch\" is out of range");
    set_state_key(FRESH(), "data", "hash", "\"abc\"");
    assert_refused(bad, "\"hash\" is not 64 hex digits");
    set_state_key(FRESH(), "optimizer", "beta2", "1.5");
    assert_refused(bad, "\"beta2\" is out of range");
    set_state_key(FRESH(), "schedule", "cosine", "1");
    assert_refused(bad, "\"cosine\" is not true or false");
    set_state_key(FRESH(), NULL, "extra", "[1]");
    assert_refused(bad, "\"extra\" is not an object");
    set_state_key(FRESH(), "files", "../../etc/passwd", "{\"bytes\": 1, \"blake2b\": \"00\"}");
    assert_refused(bad, "lists an unknown file '../../etc/passwd'");
    set_state_key(FRESH(), "files", "state.json", "{\"bytes\": 1, \"blake2b\": \"00\"}");
    assert_refused(bad, "unknown file 'state.json'");
    set_state_key(FRESH(), "files", "config.json", "{\"bytes\": 1}");
    assert_refused(bad, "the entry of config.json needs");
    set_state_key(FRESH(), NULL, "files", "{\"config.json\": {\"bytes\": 1, \"blake2b\": \"00\"}}");
    assert_refused(bad, "lists no model.safetensors");
    /* files that differ from what state.json recorded */
    edit_file(FRESH(), "model.safetensors", -1, 0, 1000);
    assert_refused(bad, "model.safetensors: 1000 bytes, state.json says");
    edit_file(FRESH(), "optimizer.safetensors", 5000, 0x40, -1);
    assert_refused(bad, "optimizer.safetensors: contents differ from the hash in state.json (corrupt)");
    edit_file(FRESH(), "config.json", 20, 0x01, -1);
    assert_refused(bad, "config.json: contents differ");
    snprintf(p, sizeof p, "%s/optimizer.safetensors", FRESH());
    unlink(p);
    assert_refused(bad, "optimizer.safetensors: missing (listed in state.json)");
    /* a shard index beside the model does not redirect the loader */
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", FRESH());
    const char *index = "{\"weight_map\": {\"model.norm.weight\": \"evil.safetensors\"}}";
    write_file(p, index, strlen(index));
    vks_checkpoint *c2 = NULL;
    if (vks_checkpoint_load(bad, &c2) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_checkpoint_free(c2);
    /* a symbolic link in place of a file is not followed */
    snprintf(p, sizeof p, "%s/config.json", FRESH());
    char target[700];
    snprintf(target, sizeof target, "%s/config.json", good);
    unlink(p);
    assert_int_equal(symlink(target, p), 0);
    assert_refused(bad, "config.json: cannot open");
    /* random damage to state.json: refused or loaded, never a crash */
    for (int trial = 0; trial < 64; trial++) {
        FRESH();
        edit_file(bad, "state.json", trial * 37 + 3, 1 << (trial % 8), -1);
        vks_checkpoint *c = NULL;
        if (vks_checkpoint_load(bad, &c) == VKS_OK) vks_checkpoint_free(c);
    }
    assert_refused(root, "state.json: missing");
#undef FRESH
    /* the undamaged one still loads */
    vks_checkpoint *c = NULL;
    assert_int_equal(vks_checkpoint_load(good, &c), VKS_OK);
    vks_checkpoint_free(c);
    fixture_free(&f);
}

static void test_checkpoint_moments_checked(void **state) {
    (void)state;
    /* a hand-made optimizer file: right hashes, wrong contents */
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 13);
    const char *root = tu_tmpdir();
    char dir[512];
    snprintf(dir, sizeof dir, "%s/negative_v", root);
    f.v[f.l->tensors[3].offset + 2] = -1.0f; /* a negative second moment */
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    assert_refused(dir, "exp_avg_sq.model.layers.0.self_attn.k_proj.weight holds a negative second moment");
    /* NaN is refused at save time: nothing is written */
    f.v[f.l->tensors[3].offset + 2] = 1.0f;
    f.w[f.l->tensors[5].offset] = NAN;
    snprintf(dir, sizeof dir, "%s/nan", root);
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_ARG);
    assert_contains(vks_last_error(), "weights of tensor layers.0.wo hold NaN or Inf");
    assert_false(exists(dir));
    f.w[f.l->tensors[5].offset] = 0.5f;
    /* only one moment */
    f.c.adam_v = NULL;
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_ARG);
    f.c.adam_v = f.v;
    /* a failure halfway (a tokenizer directory without tokenizer.json) leaves nothing */
    f.c.tokenizer_dir = root;
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_IO);
    assert_contains(vks_last_error(), "tokenizer.json: cannot open");
    assert_false(exists(dir));
    DIR *dd = opendir(root);
    struct dirent *e;
    while ((e = readdir(dd)) != NULL) assert_null(strstr(e->d_name, ".tmp-"));
    closedir(dd);
    /* extra_json must be an object */
    f.c.tokenizer_dir = NULL;
    f.c.state.extra_json = "[1]";
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_ARG);
    assert_false(exists(dir));
    fixture_free(&f);
}

static void test_checkpoint_replace(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 21);
    const char *root = tu_tmpdir();
    char dir[512];
    assert_int_equal(vks_checkpoint_step_dir(root, f.c.state.step, dir, sizeof dir), VKS_OK);
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    f.w[0] = 12345.0f;
    f.c.state.tokens_seen = 6;
    strcat(dir, "/");
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK); /* same directory again: replaced whole */
    dir[strlen(dir) - 1] = '\0';
    vks_checkpoint *c = NULL;
    if (vks_checkpoint_load(dir, &c) != VKS_OK) fail_msg("%s", vks_last_error());
    assert_true(c->weights[0] == 12345.0f);
    assert_int_equal(c->state.tokens_seen, 6);
    vks_checkpoint_free(c);
    DIR *dd = opendir(root);
    struct dirent *e;
    int n = 0;
    while ((e = readdir(dd)) != NULL) n += e->d_name[0] != '.';
    closedir(dd);
    assert_int_equal(n, 1);
    /* a directory holding other files is not replaced */
    char other[600];
    snprintf(other, sizeof other, "%s/notes.txt", dir);
    write_file(other, "mine", 4);
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_IO);
    assert_contains(vks_last_error(), "holds files that are not a checkpoint's");
    assert_true(exists(other));
    fixture_free(&f);
}

static void make_dir_with(const char *root, const char *name, const char *file) {
    char p[600];
    snprintf(p, sizeof p, "%s/%s", root, name);
    assert_int_equal(mkdir(p, 0777), 0);
    if (file) {
        snprintf(p, sizeof p, "%s/%s/%s", root, name, file);
        write_file(p, "x", 1);
    }
}

static void test_checkpoint_keep_latest(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 31);
    f.c.adam_m = f.c.adam_v = NULL;
    const char *root = tu_tmpdir();
    char dir[512];
    bool found = true;
    assert_int_equal(vks_checkpoint_latest(root, dir, sizeof dir, &found), VKS_OK);
    assert_false(found);
    for (int step = 1; step <= 6; step++) {
        assert_int_equal(vks_checkpoint_step_dir(root, step * 10, dir, sizeof dir), VKS_OK);
        assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    }
    /* what is not ours, or not finished by a live writer, must stay */
    pid_t child = fork();
    if (child == 0) _exit(0);
    assert_int_equal(waitpid(child, NULL, 0), child);
    char name[128];
    snprintf(name, sizeof name, "step-000000070.tmp-%ld-0", (long)child); /* a dead writer's: removed */
    make_dir_with(root, name, "model.safetensors");
    snprintf(name, sizeof name, "step-000000080.tmp-%ld-0", (long)getppid()); /* a live writer's */
    make_dir_with(root, name, "model.safetensors");
    snprintf(name, sizeof name, "step-000000090.tmp-%ld-0", (long)getpid()); /* this process's */
    make_dir_with(root, name, NULL);
    make_dir_with(root, "step-000000001", "state.json");    /* complete-looking but holds a user's file too: */
    char p[600];
    snprintf(p, sizeof p, "%s/step-000000001/my-notes.txt", root);
    write_file(p, "x", 1);
    make_dir_with(root, "step-0000000", "state.json");      /* too few digits */
    make_dir_with(root, "step-000000002-old", "state.json"); /* another name */
    make_dir_with(root, "step-000000003", NULL);             /* no state.json: never finished, not counted */
    make_dir_with(root, "runs", "state.json");
    snprintf(p, sizeof p, "%s/step-000000004", root);
    char link_target[600];
    snprintf(link_target, sizeof link_target, "%s/step-000000010", root);
    assert_int_equal(symlink(link_target, p), 0); /* a link: not followed, not removed */
    /* the latest has the highest step; the temporaries of steps 70-90 are not complete */
    assert_int_equal(vks_checkpoint_latest(root, dir, sizeof dir, &found), VKS_OK);
    assert_true(found);
    assert_true(strstr(dir, "/step-000000060") != NULL);
    int removed = -1;
    assert_int_equal(vks_checkpoint_prune(root, 0, INT64_MAX, &removed), VKS_ERR_ARG);
    assert_int_equal(vks_checkpoint_prune(root, 2, INT64_MAX, &removed), VKS_OK);
    assert_int_equal(removed, 5); /* steps 10-40, and the dead writer's temporary */
    const char *stay[] = {"step-000000050", "step-000000060", "step-000000001", "step-0000000", "step-000000002-old",
                          "step-000000003", "runs", "step-000000004"};
    for (size_t i = 0; i < sizeof stay / sizeof stay[0]; i++) {
        snprintf(p, sizeof p, "%s/%s", root, stay[i]);
        if (!exists(p)) fail_msg("%s was removed", stay[i]);
    }
    snprintf(name, sizeof name, "%s/step-000000080.tmp-%ld-0", root, (long)getppid());
    assert_true(exists(name));
    snprintf(name, sizeof name, "%s/step-000000090.tmp-%ld-0", root, (long)getpid());
    assert_true(exists(name));
    snprintf(name, sizeof name, "%s/step-000000070.tmp-%ld-0", root, (long)child);
    assert_false(exists(name));
    for (int step = 1; step <= 4; step++) {
        assert_int_equal(vks_checkpoint_step_dir(root, step * 10, dir, sizeof dir), VKS_OK);
        assert_false(exists(dir));
    }
    /* pruning again changes nothing */
    assert_int_equal(vks_checkpoint_prune(root, 2, INT64_MAX, &removed), VKS_OK);
    assert_int_equal(removed, 0);
    assert_int_equal(vks_checkpoint_latest(root, dir, sizeof dir, &found), VKS_OK);
    assert_true(strstr(dir, "/step-000000060") != NULL);
    fixture_free(&f);
}

/* state.json's step: bounded (no int overflow downstream), and the step of
 * the directory's name (issue 23, points 5 and 6). */
static void test_checkpoint_step_checked(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 41);
    const char *root = tu_tmpdir();
    char good[512], bad[600];
    assert_int_equal(vks_checkpoint_step_dir(root, 123, good, sizeof good), VKS_OK);
    assert_int_equal(vks_checkpoint_save(good, &f.c), VKS_OK);
    vks_checkpoint *c = NULL;
    strcat(good, "/"); /* the name counts without the slash */
    if (vks_checkpoint_load(good, &c) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_checkpoint_free(c);
    good[strlen(good) - 1] = '\0';
    snprintf(bad, sizeof bad, "%s/big", root);
    copy_dir(good, bad);
    set_state_key(bad, NULL, "step", "4611686018427387904");
    assert_refused(bad, "\"step\" is out of range");
    set_state_key(bad, NULL, "step", "1000000001");
    assert_refused(bad, "\"step\" is out of range");
    snprintf(bad, sizeof bad, "%s/step-000000004", root); /* step 123's files under step 4's name */
    copy_dir(good, bad);
    assert_refused(bad, "\"step\" is 123, the directory's name says 4");
    bool found = false;
    char dir[600];
    assert_int_equal(vks_checkpoint_latest(root, dir, sizeof dir, &found), VKS_OK);
    assert_true(found && strstr(dir, "/step-000000123"));
    /* a missing output directory holds no checkpoint (not an error) */
    snprintf(bad, sizeof bad, "%s/absent", root);
    assert_int_equal(vks_checkpoint_latest(bad, dir, sizeof dir, &found), VKS_OK);
    assert_false(found);
    fixture_free(&f);
}

/* Finite moments no run could have made are refused: |m| <= K sqrt(v) with
 * K from the step and betas (issue 23, point 8: exp_avg 1e30 was taken and
 * the next update blew the norm weights up to 2.7e30). */
/* A LoRA run's checkpoint: the adapter (PEFT's files, base hash recorded)
 * and its moments round-trip bit for bit, adjacent-pair q/k rows included;
 * loading it over another base, as a full model, or a full checkpoint as a
 * LoRA one is refused naming the kind; a changed file is refused by hash. */
static void test_checkpoint_lora(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(false, VKS_ROPE_ADJACENT);
    vks_model *base = NULL, *other = NULL;
    assert_int_equal(vks_model_random(&cfg, 5, &base), VKS_OK);
    assert_int_equal(vks_model_random(&cfg, 6, &other), VKS_OK);
    vks_lora_config lc = {.rank = 3, .alpha = 12.0, .targets = (1u << VKS_LORA_Q) | (1u << VKS_LORA_K) | (1u << VKS_LORA_DOWN)};
    vks_lora_adapter *a = NULL;
    assert_int_equal(vks_lora_adapter_create(&base->cfg, &lc, &a), VKS_OK);
    assert_int_equal(vks_lora_adapter_init(a, 9), VKS_OK);
    assert_int_equal(vks_lora_adapter_set_base(a, base), VKS_OK);
    size_t n = (size_t)vks_lora_param_count(&base->cfg, lc.rank, lc.targets);
    for (int l = 0; l < cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            if (!(lc.targets & (1u << t))) continue;
            vks_lora_target_shape(&base->cfg, (vks_lora_target)t, &out, &in);
            fill(vks_lora_adapter_B(a, l, (vks_lora_target)t), (size_t)(out * lc.rank), 30 + (uint64_t)(l * 7 + t), false);
        }
    float *m = malloc(n * sizeof *m), *v = malloc(n * sizeof *v);
    fill(m, n, 7, false);
    fill(v, n, 8, true);
    for (size_t i = 0; i < n; i++) v[i] += m[i] * m[i];
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 3); /* for its state */
    vks_checkpoint_data c = {.adam_m = m, .adam_v = v, .state = f.c.state, .lora = a};
    char dir[512];
    assert_int_equal(vks_checkpoint_step_dir(tu_tmpdir(), c.state.step, dir, sizeof dir), VKS_OK);
    if (vks_checkpoint_save(dir, &c) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_checkpoint *ck = NULL;
    if (vks_checkpoint_load_lora(dir, base, &ck) != VKS_OK) fail_msg("%s", vks_last_error());
    check_state_equal(&ck->state, &c.state);
    assert_null(ck->layout);
    assert_memory_equal(ck->adam_m, m, n * sizeof *m);
    assert_memory_equal(ck->adam_v, v, n * sizeof *v);
    uint8_t h1[32], h2[32];
    assert_int_equal(vks_lora_adapter_hash(a, h1), VKS_OK);
    assert_int_equal(vks_lora_adapter_hash(ck->lora, h2), VKS_OK);
    assert_memory_equal(h1, h2, 32); /* every A and B bit for bit, q/k rows back in the base's order */
    vks_checkpoint_free(ck);
    ck = NULL;
    assert_int_equal(vks_checkpoint_load_lora(dir, other, &ck), VKS_ERR_FORMAT);
    assert_contains(vks_last_error(), "base_model_hash");
    assert_refused(dir, "a LoRA run's checkpoint (an adapter)");
    char edited[600];
    snprintf(edited, sizeof edited, "%s-edited", dir);
    copy_dir(dir, edited);
    edit_file(edited, "optimizer.safetensors", 4000, 1, -1);
    assert_int_equal(vks_checkpoint_load_lora(edited, base, &ck), VKS_ERR_FORMAT);
    assert_contains(vks_last_error(), "optimizer.safetensors: contents differ");
    /* a full model's checkpoint is not a LoRA one */
    char full[600];
    snprintf(full, sizeof full, "%s/step-000000124", tu_tmpdir());
    f.c.state.step = 124;
    assert_int_equal(vks_checkpoint_save(full, &f.c), VKS_OK);
    assert_int_equal(vks_checkpoint_load_lora(full, base, &ck), VKS_ERR_FORMAT);
    assert_contains(vks_last_error(), "a full fine-tuning checkpoint, not a LoRA run's");
    /* NaN in a moment is refused before anything is written */
    m[5] = NAN;
    snprintf(full, sizeof full, "%s/step-000000125", tu_tmpdir());
    c.state.step = 125;
    assert_int_equal(vks_checkpoint_save(full, &c), VKS_ERR_ARG);
    assert_false(exists(full));
    fixture_free(&f);
    free(m);
    free(v);
    vks_lora_adapter_free(a);
    vks_model_free(base);
    vks_model_free(other);
}

static void test_checkpoint_moment_sizes(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 43);
    const char *root = tu_tmpdir();
    char dir[512];
    const vks_param_info *norm = vks_param_layout_find(f.l, "final_norm");
    assert_non_null(norm);
    snprintf(dir, sizeof dir, "%s/huge", root);
    f.m[norm->offset + 3] = 1e30f;
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK); /* finite: the writer takes it */
    assert_refused(dir, "the first moment of final_norm is 1e+30 where 123 Adam steps (betas 0.9, 0.95) allow at most");
    /* one step: m = 0.1 g, v = 0.05 g^2, so |m| <= 0.4472 sqrt(v) exactly */
    f.c.state.step = 1;
    for (size_t i = 0; i < f.l->n_values; i++) f.m[i] = 0.447f * sqrtf(f.v[i]) * (i % 2 ? 1.0f : -1.0f);
    snprintf(dir, sizeof dir, "%s/one-step", root);
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    vks_checkpoint *c = NULL;
    if (vks_checkpoint_load(dir, &c) != VKS_OK) fail_msg("%s", vks_last_error());
    vks_checkpoint_free(c);
    f.m[norm->offset] = 0.46f * sqrtf(f.v[norm->offset]);
    snprintf(dir, sizeof dir, "%s/one-step-over", root);
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    assert_refused(dir, "the first moment of final_norm is");
    fixture_free(&f);
}

/* A run saves and prunes only its own: a step-N that is not a complete
 * checkpoint (a user's model.safetensors alone) is not replaced, and a prune
 * never touches checkpoints newer than the one just written (issue 23, points
 * 10 and 19). */
static void test_checkpoint_only_own_replaced(void **state) {
    (void)state;
    vks_model_config cfg = tiny_config(true, VKS_ROPE_HALF);
    ckpt_fixture f;
    fixture_make(&f, &cfg, false, 47);
    f.c.adam_m = f.c.adam_v = NULL;
    const char *root = tu_tmpdir();
    char dir[512], p[700];
    make_dir_with(root, "step-000000001", "model.safetensors");
    assert_int_equal(vks_checkpoint_step_dir(root, 1, dir, sizeof dir), VKS_OK);
    f.c.state.step = 1;
    assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_ERR_IO);
    assert_contains(vks_last_error(), "step-000000001: exists and is not a complete checkpoint (no state.json; not replaced)");
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    size_t n = 0;
    unsigned char *kept = tu_read_file(p, &n);
    assert_true(kept && n == 1 && kept[0] == 'x');
    free(kept);
    for (int step = 10; step <= 30; step += 10) {
        f.c.state.step = step;
        assert_int_equal(vks_checkpoint_step_dir(root, step, dir, sizeof dir), VKS_OK);
        assert_int_equal(vks_checkpoint_save(dir, &f.c), VKS_OK);
    }
    int removed = -1;
    assert_int_equal(vks_checkpoint_prune(root, 1, 10, &removed), VKS_OK); /* 10 is the newest of ours */
    assert_int_equal(removed, 0);
    assert_int_equal(vks_checkpoint_prune(root, 1, 20, &removed), VKS_OK);
    assert_int_equal(removed, 1);
    const int left[] = {20, 30};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(vks_checkpoint_step_dir(root, left[i], dir, sizeof dir), VKS_OK);
        assert_true(exists(dir));
    }
    assert_int_equal(vks_checkpoint_step_dir(root, 10, dir, sizeof dir), VKS_OK);
    assert_false(exists(dir));
    snprintf(p, sizeof p, "%s/step-000000001/model.safetensors", root);
    assert_true(exists(p));
    fixture_free(&f);
}

/* ---- metrics and the plot ---- */

static void test_metrics_roundtrip(void **state) {
    (void)state;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/run", tu_tmpdir()); /* created by open */
    vks_metrics *m = NULL;
    assert_int_equal(vks_metrics_open(dir, -1, &m), VKS_OK);
    double loss[6] = {2.302585092994046, 1.0 / 3.0, NAN, 0.1, 1e-300, 5};
    for (int s = 1; s <= 5; s++) {
        vks_metric v[3] = {{"loss", loss[s - 1]}, {"lr", 3e-4 * s}, {"tokens", 1000.0 * s}};
        assert_int_equal(vks_metrics_log(m, s, v, s == 4 ? 2 : 3), VKS_OK);
    }
    /* each line is whole on disk before close */
    char path[600];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    assert_string_equal(vks_metrics_path(m), path);
    size_t len;
    char *text = (char *)tu_read_file(path, &len);
    assert_non_null(text);
    assert_true(strncmp(text, "{\"step\":1,\"loss\":2.30258509299404", 33) == 0);
    assert_non_null(strstr(text, "{\"step\":3,\"loss\":null,"));
    assert_non_null(strstr(text, "\"tokens\":2000}\n"));
    free(text);
    vks_metric dup[2] = {{"a", 1}, {"a", 2}}, step_name[1] = {{"step", 1}};
    assert_int_equal(vks_metrics_log(m, 6, dup, 2), VKS_ERR_ARG);
    assert_int_equal(vks_metrics_log(m, 6, step_name, 1), VKS_ERR_ARG);
    assert_int_equal(vks_metrics_close(m), VKS_OK);

    const char *keys[] = {"loss", "tokens", "absent"};
    vks_metric_series *s = NULL;
    assert_int_equal(vks_metrics_read(path, keys, 3, &s), VKS_OK);
    assert_int_equal(s->n, 5);
    for (int i = 0; i < 5; i++) {
        assert_true(s->x[i] == i + 1);
        if (i == 2) assert_true(isnan(s->y[0][i]));
        else assert_memory_equal(&s->y[0][i], &loss[i], sizeof(double)); /* exact */
        if (i == 3) assert_true(isnan(s->y[1][i]));
        else assert_true(s->y[1][i] == 1000.0 * (i + 1));
        assert_true(isnan(s->y[2][i]));
    }
    vks_metric_series_free(s);

    /* a crash mid-line, then a resume from the checkpoint of step 3 */
    FILE *f = fopen(path, "ab");
    fputs("{\"step\":6,\"lo", f);
    fclose(f);
    assert_int_equal(vks_metrics_open(dir, 3, &m), VKS_OK);
    vks_metric v = {"loss", 0.25};
    assert_int_equal(vks_metrics_log(m, 4, &v, 1), VKS_OK);
    assert_int_equal(vks_metrics_close(m), VKS_OK);
    assert_int_equal(vks_metrics_read(path, keys, 1, &s), VKS_OK);
    assert_int_equal(s->n, 4);
    assert_true(s->x[3] == 4 && s->y[0][3] == 0.25);
    assert_true(s->y[0][1] == loss[1]);
    vks_metric_series_free(s);
    /* a new run starts the file anew */
    assert_int_equal(vks_metrics_open(dir, -1, &m), VKS_OK);
    assert_int_equal(vks_metrics_close(m), VKS_OK);
    assert_int_equal(vks_metrics_read(path, keys, 1, &s), VKS_OK);
    assert_int_equal(s->n, 0);
    vks_metric_series_free(s);
    assert_int_equal(vks_metrics_read("/nonexistent/metrics.jsonl", keys, 1, &s), VKS_ERR_IO);
    /* the keys with a prefix, in the order first seen, each once; lines without a step and keys too long left out */
    f = fopen(path, "wb");
    fprintf(f, "{\"step\":1,\"p.a\":1,\"q\":2}\n{\"p.b\":3}\nnot json\n{\"step\":2,\"p.c\":1,\"p.a\":2,\"p.%0100d\":1}\n", 0);
    fclose(f);
    char names[4][VKS_METRIC_KEY];
    int n = -1;
    assert_int_equal(vks_metrics_keys(path, "p.", names, 4, &n), VKS_OK);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "p.a");
    assert_string_equal(names[1], "p.c");
    assert_int_equal(vks_metrics_keys(path, "p.", names, 1, &n), VKS_OK);
    assert_int_equal(n, 1);
    assert_int_equal(vks_metrics_keys("/nonexistent/metrics.jsonl", "p.", names, 4, &n), VKS_ERR_IO);
}

/* ---- a small SVG checker: balanced tags, finite numbers ---- */

typedef struct {
    int n_paths, n_moves, n_circles, n_texts;
    char texts[64][128];
} svg_summary;

/* Every number in s (an attribute value) parses as finite. */
static void check_numbers(const char *s, size_t n) {
    char buf[1 << 16];
    assert_true(n < sizeof buf);
    memcpy(buf, s, n);
    buf[n] = 0;
    for (char *p = buf; *p;) {
        if ((*p >= '0' && *p <= '9') || ((*p == '-' || *p == '.') && p[1] >= '0' && p[1] <= '9')) {
            char *end;
            double v = strtod(p, &end);
            assert_true(isfinite(v));
            assert_true(end > p);
            p = end;
        } else {
            p++;
        }
    }
}

/* Parses an SVG file's tags: well nested, attributes quoted, numbers finite,
 * no "nan"/"inf" anywhere. */
static void check_svg(const char *path, svg_summary *sum) {
    memset(sum, 0, sizeof *sum);
    size_t len;
    char *text = (char *)tu_read_file(path, &len);
    assert_non_null(text);
    assert_true(strncmp(text, "<?xml", 5) == 0);
    for (char *q = text; *q; q++) {
        assert_false(strncasecmp(q, "nan", 3) == 0 && !(q > text && q[-1] >= 'a' && q[-1] <= 'z'));
        assert_false(strncasecmp(q, "inf", 3) == 0 && !(q > text && q[-1] >= 'a' && q[-1] <= 'z'));
    }
    char stack[32][32];
    int depth = 0, roots = 0;
    const char *p = strstr(text, "?>") + 2;
    while ((p = strchr(p, '<')) != NULL) {
        bool closing = p[1] == '/';
        const char *name = p + 1 + closing;
        size_t nlen = strspn(name, "abcdefghijklmnopqrstuvwxyz");
        assert_true(nlen > 0 && nlen < 32);
        const char *end = strchr(name, '>');
        assert_non_null(end);
        bool self = end[-1] == '/';
        /* attributes: name="value" pairs only */
        for (const char *a = name + nlen; a < end - self;) {
            if (*a == ' ') {
                a++;
                continue;
            }
            assert_false(closing);
            const char *eq = strchr(a, '=');
            assert_true(eq && eq < end && eq[1] == '"');
            const char *close = strchr(eq + 2, '"');
            assert_true(close && close < end);
            assert_null(memchr(eq + 2, '<', (size_t)(close - eq - 2)));
            if (strncmp(a, "font-family", 11) && strncmp(a, "xmlns", 5) && strncmp(a, "text-anchor", 11) &&
                strncmp(a, "fill", 4) && strncmp(a, "stroke=", 7))
                check_numbers(eq + 2, (size_t)(close - eq - 2));
            a = close + 1;
        }
        if (closing) {
            assert_true(depth > 0);
            assert_true(strncmp(stack[depth - 1], name, nlen) == 0 && stack[depth - 1][nlen] == 0);
            depth--;
        } else if (!self) {
            assert_true(depth < 32);
            if (depth == 0) roots++;
            memcpy(stack[depth], name, nlen);
            stack[depth++][nlen] = 0;
        } else if (depth == 0) {
            roots++;
        }
        if (!closing && !strncmp(name, "path ", 5)) {
            sum->n_paths++;
            const char *d = strstr(name, " d=\"");
            for (const char *c = d + 4; *c != '"'; c++) sum->n_moves += *c == 'M';
        }
        if (!closing && !strncmp(name, "circle ", 7)) sum->n_circles++;
        if (!closing && !strncmp(name, "text ", 5) && sum->n_texts < 64) {
            const char *t = end + 1, *t_end = strstr(t, "</text>");
            assert_non_null(t_end);
            snprintf(sum->texts[sum->n_texts++], 128, "%.*s", (int)(t_end - t), t);
            assert_null(memchr(t, '<', (size_t)(t_end - t))); /* character data is escaped */
        }
        p = end + 1;
    }
    assert_int_equal(depth, 0);
    assert_int_equal(roots, 1);
    free(text);
}

static bool has_text(const svg_summary *s, const char *t) {
    for (int i = 0; i < s->n_texts; i++)
        if (!strcmp(s->texts[i], t)) return true;
    return false;
}

static void test_plot_svg(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/plot.svg", tu_tmpdir());
    double x[12], y1[12], y2[12];
    for (int i = 0; i < 12; i++) {
        x[i] = i;
        y1[i] = 3.0 - 0.2 * i;
        y2[i] = i * 0.1;
    }
    y1[4] = NAN;      /* gap: two stretches */
    y2[2] = INFINITY; /* gaps around one lone point (3) */
    y2[4] = NAN;
    x[8] = 1e308;     /* beyond the plotting range: a gap too */
    vks_plot_series s[2] = {{.name = "loss <train> & \"val\"", .x = x, .y = y1, .n = 12}, {.name = "lr\x01\xff", .x = x, .y = y2, .n = 12}};
    vks_plot p = {.title = "Loss", .x_label = "step", .y_label = "value", .series = s, .n_series = 2};
    assert_int_equal(vks_plot_svg(path, &p), VKS_OK);
    svg_summary sum;
    check_svg(path, &sum);
    assert_int_equal(sum.n_paths, 2);
    assert_int_equal(sum.n_moves, 3 + 4); /* y1: 0-3, 5-7, 9-11; y2: 0-1, 3, 5-7, 9-11 */
    assert_int_equal(sum.n_circles, 1);
    assert_true(has_text(&sum, "loss &lt;train&gt; &amp; &quot;val&quot;"));
    assert_true(has_text(&sum, "lr\\x01\\xff"));
    assert_true(has_text(&sum, "Loss"));
    assert_true(has_text(&sum, "0")); /* a tick label on both axes */
    assert_true(has_text(&sum, "10"));
    /* degenerate data: nothing finite, one point, a constant */
    double nan1[1] = {NAN}, one_x[1] = {5}, one_y[1] = {2}, cx[3] = {1, 2, 3}, cy[3] = {7, 7, 7};
    vks_plot_series cases[3][1] = {{{.name = "none", .x = nan1, .y = nan1, .n = 1}}, {{.name = "one", .x = one_x, .y = one_y, .n = 1}}, {{.name = "flat", .x = cx, .y = cy, .n = 3}}};
    for (int i = 0; i < 3; i++) {
        vks_plot q = {.series = cases[i], .n_series = 1, .width = 10, .height = 10};
        assert_int_equal(vks_plot_svg(path, &q), VKS_OK);
        check_svg(path, &sum);
        assert_int_equal(has_text(&sum, "no data"), i == 0);
    }
    vks_plot none = {0};
    assert_int_equal(vks_plot_svg(path, &none), VKS_OK);
    check_svg(path, &sum);
    vks_plot_series broken = {.name = "x", .n = 3};
    vks_plot bad = {.series = &broken, .n_series = 1};
    assert_int_equal(vks_plot_svg(path, &bad), VKS_ERR_ARG);
    /* from a metrics file */
    char dir[512];
    snprintf(dir, sizeof dir, "%s", tu_tmpdir());
    vks_metrics *m = NULL;
    assert_int_equal(vks_metrics_open(dir, -1, &m), VKS_OK);
    for (int i = 0; i < 30; i++) {
        vks_metric v[2] = {{"loss", 5.0 / (i + 1)}, {"grad_norm", i % 7 == 3 ? NAN : 1.0 + (i % 3)}};
        assert_int_equal(vks_metrics_log(m, i, v, 2), VKS_OK);
    }
    assert_int_equal(vks_metrics_close(m), VKS_OK);
    char mpath[600], svg[600];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/loss.svg", dir);
    const char *keys[] = {"loss", "grad_norm"};
    assert_int_equal(vks_metrics_plot(mpath, keys, 2, "training", svg), VKS_OK);
    check_svg(svg, &sum);
    assert_int_equal(sum.n_paths, 2);
    assert_int_equal(sum.n_moves, 1 + 5); /* grad_norm: gaps at 3, 10, 17, 24 */
    assert_true(has_text(&sum, "training"));
    assert_true(has_text(&sum, "grad_norm"));
}

/* Gantt-style timelines: bars clipped to the time shown (bars of no length or
 * outside it left out), names escaped, marks outside the range left out, a
 * legend of the kinds in use only, bad kinds refused. */
static void test_timeline_svg(void **state) {
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/timeline.svg", tu_tmpdir());
    vks_timeline_kind kinds[3] = {{"wait", 0xc7c7c7}, {"a <b> & c", 0xd62728}, {"unused", 0x1f77b4}};
    vks_timeline_bar trainer[5] = {{0, 1, 0}, {1, 3, 1}, {NAN, 2, 1}, {5, 9, 1}, {7, 8, 0}};
    vks_timeline_bar inference[2] = {{-1, 0.5, 0}, {2, 2, 1}};
    vks_timeline_row rows[2] = {{"trainer", trainer, 5}, {"generator", inference, 2}}; /* check_svg refuses "inf" */
    vks_timeline_mark marks[2] = {{1, 1}, {10, 2}};
    vks_timeline t = {.title = "who waited", .mark_label = "step", .t0 = 0, .t1 = 6, .rows = rows, .n_rows = 2,
                      .kinds = kinds, .n_kinds = 3, .marks = marks, .n_marks = 2};
    assert_int_equal(vks_timeline_svg(path, &t), VKS_OK);
    svg_summary sum;
    check_svg(path, &sum);
    assert_true(has_text(&sum, "who waited") && has_text(&sum, "trainer") && has_text(&sum, "generator"));
    assert_true(has_text(&sum, "step 1") && !has_text(&sum, "step 2"));
    assert_true(has_text(&sum, "wait") && has_text(&sum, "a &lt;b&gt; &amp; c") && !has_text(&sum, "unused"));
    assert_true(has_text(&sum, "0") && has_text(&sum, "6") && has_text(&sum, "seconds"));
    char *text = (char *)tu_read_file(path, NULL);
    assert_non_null(text);
    int bars = 0;
    for (const char *q = text; (q = strstr(q, "<title>")) != NULL; q++) bars++;
    assert_int_equal(bars, 4); /* [0, 1], [1, 3], [5, 6] of [5, 9], [0, 0.5] of [-1, 0.5] */
    assert_non_null(strstr(text, "fill=\"#d62728\"><title>a &lt;b&gt; &amp; c 4.000 s</title>"));
    free(text);
    /* an empty range: one second from t0; nothing at all */
    t.t1 = -3;
    assert_int_equal(vks_timeline_svg(path, &t), VKS_OK);
    check_svg(path, &sum);
    vks_timeline none = {0};
    assert_int_equal(vks_timeline_svg(path, &none), VKS_OK);
    check_svg(path, &sum);
    trainer[1].kind = 3;
    t.t1 = 6;
    assert_int_equal(vks_timeline_svg(path, &t), VKS_ERR_ARG);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sft_masks),
        cmocka_unit_test(test_sft_turns),
        cmocka_unit_test(test_sft_bom_crlf_blank),
        cmocka_unit_test(test_sft_malformed_named),
        cmocka_unit_test(test_sft_line_limit),
        cmocka_unit_test(test_sft_long_sequences),
        cmocka_unit_test(test_sft_file_and_hash),
        cmocka_unit_test(test_batcher_packs_epochs),
        cmocka_unit_test(test_batcher_resume_exact),
        cmocka_unit_test(test_layout_matches_ref_params),
        cmocka_unit_test(test_checkpoint_roundtrip),
        cmocka_unit_test(test_checkpoint_rope_order),
        cmocka_unit_test(test_checkpoint_is_a_model),
        cmocka_unit_test(test_checkpoint_corrupt_refused),
        cmocka_unit_test(test_checkpoint_moments_checked),
        cmocka_unit_test(test_checkpoint_replace),
        cmocka_unit_test(test_checkpoint_keep_latest),
        cmocka_unit_test(test_checkpoint_step_checked),
        cmocka_unit_test(test_checkpoint_moment_sizes),
        cmocka_unit_test(test_checkpoint_lora),
        cmocka_unit_test(test_checkpoint_only_own_replaced),
        cmocka_unit_test(test_metrics_roundtrip),
        cmocka_unit_test(test_plot_svg),
        cmocka_unit_test(test_timeline_svg),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
