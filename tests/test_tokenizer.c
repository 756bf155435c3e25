/* Tokenizers against the originals: llama.cpp's test vectors for the GGUF
 * vocabularies (SentencePiece and GPT-2 byte-level BPE), llama2.c run.c
 * vectors, round trips, invalid UTF-8, special tokens, tokenizer.json,
 * chat templates, hostile files, and the tokenize/detokenize commands. */
#include "chat_templates.h"
#include "test_util.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_model.h"
#include "vkswarm/vks_tokenizer.h"

#define SEP "\n__ggml_vocab_test__\n"

typedef struct {
    char **text;
    size_t *len;
    int n;
} cases;

/* Splits an .inp file into its cases (each one followed by SEP). */
static cases read_cases(const char *path) {
    size_t size;
    char *data = (char *)tu_read_file(path, &size);
    assert_non_null(data);
    cases c = {calloc(4096, sizeof(char *)), calloc(4096, sizeof(size_t)), 0};
    size_t at = 0, sl = strlen(SEP);
    while (at < size) {
        char *hit = strstr(data + at, SEP);
        assert_non_null(hit);
        size_t n = (size_t)(hit - (data + at));
        c.text[c.n] = malloc(n + 1);
        memcpy(c.text[c.n], data + at, n);
        c.text[c.n][n] = 0;
        c.len[c.n++] = n;
        at += n + sl;
    }
    free(data);
    return c;
}

static void free_cases(cases *c) {
    for (int i = 0; i < c->n; i++) free(c->text[i]);
    free(c->text);
    free(c->len);
}

/* Parses one line of ids; returns the count. */
static int parse_ids(const char *line, int32_t *ids, int cap) {
    int n = 0;
    char *end;
    for (const char *s = line; *s && *s != '\n';) {
        if (*s == ' ') {
            s++;
            continue;
        }
        long v = strtol(s, &end, 10);
        assert_true(end != s && n < cap);
        ids[n++] = (int32_t)v;
        s = end;
    }
    return n;
}

/* Runs every case of a vector set; returns how many matched (and asserts all do). */
static int check_vectors(const vks_tokenizer *t, const char *inp, const char *out, bool round_trip) {
    cases c = read_cases(inp);
    char *expect = (char *)tu_read_file(out, NULL);
    assert_non_null(expect);
    const char *line = expect;
    int ok = 0;
    int32_t *want = malloc(1 << 20);
    for (int i = 0; i < c.n; i++) {
        assert_non_null(line);
        int nw = parse_ids(line, want, (1 << 20) / 4);
        vks_tokenize_options o = {0};
        int32_t *ids = NULL;
        int n = 0;
        assert_int_equal(vks_tokenizer_tokenize(t, c.text[i], c.len[i], &o, &ids, &n), VKS_OK);
        bool same = n == nw && (n == 0 || !memcmp(ids, want, (size_t)n * 4));
        if (!same) {
            fprintf(stderr, "case %d '%s': got", i, c.text[i]);
            for (int k = 0; k < n; k++) fprintf(stderr, " %d", ids[k]);
            fprintf(stderr, "\n  want %s", line);
        }
        ok += same;
        if (round_trip) {
            char *text;
            size_t len;
            assert_int_equal(vks_tokenizer_detokenize(t, ids, n, false, &text, &len), VKS_OK);
            if (len != c.len[i] || memcmp(text, c.text[i], len)) fprintf(stderr, "round trip %d: '%s'\n", i, text);
            assert_int_equal(len, c.len[i]);
            assert_memory_equal(text, c.text[i], len);
            free(text);
        }
        free(ids);
        line = strchr(line, '\n');
        if (line) line++;
    }
    fprintf(stderr, "%s: %d/%d cases match\n", inp, ok, c.n);
    assert_int_equal(ok, c.n);
    free(want);
    free(expect);
    free_cases(&c);
    return ok;
}

static vks_tokenizer *load_vocab(const char *name) {
    char rel[256];
    snprintf(rel, sizeof rel, "llamacpp-vocab/%s", name);
    const char *p = tu_shared_path(rel);
    if (!p) return NULL;
    vks_tokenizer *t = NULL;
    int rc = vks_tokenizer_load_auto(p, NULL, &t);
    if (rc) fprintf(stderr, "%s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
    return t;
}

static void vocab_vectors(const char *name, const char *kind) {
    vks_tokenizer *t = load_vocab(name);
    if (!t) skip();
    assert_string_equal(vks_tokenizer_kind(t), kind);
    char inp[2048], out[2048];
    snprintf(inp, sizeof inp, "%s", tu_shared_path("llamacpp-vocab/"));
    snprintf(out, sizeof out, "%s", inp);
    strcat(inp, name);
    strcat(inp, ".inp");
    strcat(out, name);
    strcat(out, ".out");
    assert_int_equal(check_vectors(t, inp, out, true), 46);
    vks_tokenizer_free(t);
}

static void test_llama_spm_vectors(void **s) { (void)s; vocab_vectors("ggml-vocab-llama-spm.gguf", "spm"); }
static void test_phi3_vectors(void **s) { (void)s; vocab_vectors("ggml-vocab-phi-3.gguf", "spm"); }
static void test_gpt2_vectors(void **s) { (void)s; vocab_vectors("ggml-vocab-gpt-2.gguf", "bpe"); }

/* llama2.c's tokenizer.bin of the same vocabulary gives the same ids (run.c). */
static void test_llama2c_bin_on_spm_vectors(void **s) {
    (void)s;
    const char *p = tu_shared_path("llamacpp-vocab/llama2c-tokenizer.bin");
    if (!p) skip();
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_llama2c(p, 32000, &t), VKS_OK);
    char inp[2048], out[2048];
    snprintf(inp, sizeof inp, "%s", tu_shared_path("llamacpp-vocab/ggml-vocab-llama-spm.gguf.inp"));
    snprintf(out, sizeof out, "%s", tu_shared_path("llamacpp-vocab/ggml-vocab-llama-spm.gguf.out"));
    assert_int_equal(check_vectors(t, inp, out, false), 46);
    vks_tokenizer_free(t);
}

static void test_tok512_vectors(void **s) {
    (void)s;
    const char *p = tu_shared_path("stories260K/tok512.bin");
    if (!p) skip();
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_llama2c(p, 512, &t), VKS_OK);
    char inp[2048], out[2048];
    snprintf(inp, sizeof inp, "%s", tu_shared_path("stories260K/ref/tok512.encode.inp"));
    snprintf(out, sizeof out, "%s", tu_shared_path("stories260K/ref/tok512.encode.out"));
    assert_int_equal(check_vectors(t, inp, out, true), 21);
    vks_tokenizer_free(t);
}

/* tok512.bin embedded in a GGUF (as llama.cpp stores SentencePiece) and read
 * back by the SPM tokenizer gives run.c's ids too. */
static void test_tok512_through_gguf(void **s) {
    (void)s;
    const char *shared = tu_shared_path("stories260K/stories260K.bin");
    if (!shared) skip();
    char mp[2048], tok[2048], path[4096], inp[2048], out[2048];
    snprintf(mp, sizeof mp, "%s", shared); /* tu_shared_path reuses its buffer */
    snprintf(tok, sizeof tok, "%s", tu_shared_path("stories260K/tok512.bin"));
    vks_model *m = NULL;
    int lrc = vks_model_load_llama2c(mp, &m);
    if (lrc) fprintf(stderr, "%s\n", vks_last_error());
    assert_int_equal(lrc, VKS_OK);
    snprintf(path, sizeof path, "%s/s.gguf", tu_tmpdir());
    vks_model_save_options so = {.dtype = VKS_DTYPE_F32, .tokenizer_path = tok};
    assert_int_equal(vks_model_save_gguf(m, path, &so), VKS_OK);
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_auto(path, m, &t), VKS_OK);
    assert_string_equal(vks_tokenizer_kind(t), "spm");
    snprintf(inp, sizeof inp, "%s", tu_shared_path("stories260K/ref/tok512.encode.inp"));
    snprintf(out, sizeof out, "%s", tu_shared_path("stories260K/ref/tok512.encode.out"));
    assert_int_equal(check_vectors(t, inp, out, true), 21);
    vks_tokenizer_free(t);
    vks_model_free(m);
}

/* Bytes that are not UTF-8 survive tokenize + detokenize unchanged. */
static void invalid_utf8_round_trip(const char *name) {
    vks_tokenizer *t = load_vocab(name);
    if (!t) skip();
    static const char text[] = "ok \xff\xfe caf\xc3 \xe4\xbd \xed\xa0\x80 end \xf4\x90\x80\x80\xc0\xaf";
    size_t len = sizeof text - 1;
    vks_tokenize_options o = {0};
    int32_t *ids;
    int n;
    assert_int_equal(vks_tokenizer_tokenize(t, text, len, &o, &ids, &n), VKS_OK);
    assert_true(n > 0);
    char *back;
    size_t blen;
    assert_int_equal(vks_tokenizer_detokenize(t, ids, n, false, &back, &blen), VKS_OK);
    assert_int_equal(blen, len);
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
    vks_tokenizer_free(t);
}

static void test_invalid_utf8(void **s) {
    (void)s;
    invalid_utf8_round_trip("ggml-vocab-llama-spm.gguf");
    invalid_utf8_round_trip("ggml-vocab-gpt-2.gguf");
}

static int count_id(const int32_t *ids, int n, int32_t id) {
    int c = 0;
    for (int i = 0; i < n; i++) c += ids[i] == id;
    return c;
}

static void test_special_tokens(void **s) {
    (void)s;
    vks_tokenizer *t = load_vocab("ggml-vocab-gpt-2.gguf");
    if (!t) skip();
    static const char text[] = "a<|endoftext|>b<|endoftext|>";
    int32_t *ids;
    int n;
    vks_tokenize_options o = {.parse_special = true};
    int eot = vks_tokenizer_find(t, "<|endoftext|>", 13);
    assert_int_equal(eot, 50256);
    assert_int_equal(vks_tokenizer_token_type(t, eot), VKS_TOKEN_TYPE_CONTROL);
    assert_int_equal(vks_tokenizer_tokenize(t, text, strlen(text), &o, &ids, &n), VKS_OK);
    assert_int_equal(n, 4);
    assert_int_equal(ids[1], 50256);
    assert_int_equal(ids[3], 50256);
    char *back;
    assert_int_equal(vks_tokenizer_detokenize(t, ids, n, true, &back, NULL), VKS_OK);
    assert_string_equal(back, text);
    free(back);
    assert_int_equal(vks_tokenizer_detokenize(t, ids, n, false, &back, NULL), VKS_OK);
    assert_string_equal(back, "ab");
    free(back);
    free(ids);
    o.parse_special = false;
    assert_int_equal(vks_tokenizer_tokenize(t, text, strlen(text), &o, &ids, &n), VKS_OK);
    assert_int_equal(count_id(ids, n, 50256), 0);
    free(ids);
    vks_tokenizer_free(t);

    /* SPM: BOS typed in text, and the dummy prefix after a special token. */
    t = load_vocab("ggml-vocab-llama-spm.gguf");
    o = (vks_tokenize_options){.add_bos = true, .parse_special = true};
    assert_int_equal(vks_tokenizer_tokenize(t, "Hi</s>Hi", 8, &o, &ids, &n), VKS_OK);
    int32_t hi = ids[1];
    assert_int_equal(ids[0], 1);
    assert_int_equal(n, 4);
    assert_int_equal(ids[2], 2);
    assert_int_equal(ids[3], hi); /* "▁Hi" again: prefix space after a special token */
    free(ids);
    o.parse_special = false;
    assert_int_equal(vks_tokenizer_tokenize(t, "<s>", 3, &o, &ids, &n), VKS_OK);
    assert_int_equal(count_id(ids, n, 1), 1); /* only the added BOS */
    free(ids);
    vks_tokenizer_free(t);
}

static void test_phi3_metadata(void **s) {
    (void)s;
    vks_tokenizer *t = load_vocab("ggml-vocab-phi-3.gguf");
    if (!t) skip();
    assert_int_equal(vks_tokenizer_eos(t), 32000);
    const char *tmpl = vks_tokenizer_chat_template(t);
    assert_non_null(tmpl);
    const char *fam = vks_chat_template_family(tmpl);
    assert_non_null(fam);
    fprintf(stderr, "phi-3 chat template family: %s\n", fam);
    vks_tokenizer_free(t);
}

static void test_chat_formats(void **s) {
    (void)s;
    vks_chat_message m[] = {{"system", "Be brief."}, {"user", " Hi! "}, {"assistant", "Hello."}, {"user", "Bye"}};
    char *out;
    assert_int_equal(vks_chat_format("chatml", m, 4, true, &out), VKS_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi! <|im_end|>\n"
                             "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                             "<|im_start|>assistant\n");
    free(out);
    assert_int_equal(vks_chat_format("llama3", m, 4, true, &out), VKS_OK);
    assert_string_equal(out, "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                             "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                             "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                             "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(out);
    assert_int_equal(vks_chat_format("llama2", m, 4, true, &out), VKS_OK);
    assert_string_equal(out, "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n Hi! [/INST] Hello. </s><s>[INST] Bye [/INST]");
    free(out);
    assert_int_equal(vks_chat_format("phi3", m + 1, 1, true, &out), VKS_OK);
    assert_string_equal(out, "<|user|>\n Hi! <|end|>\n<|assistant|>\n");
    free(out);
    /* Jinja templates are recognized by their markers. */
    assert_string_equal(vks_chat_template_family("{% for m in messages %}<|im_start|>{{ m.role }}"), "chatml");
    assert_string_equal(vks_chat_template_family("{{ '<|start_header_id|>' + role }}"), "llama3");
    assert_string_equal(vks_chat_template_family("{{ bos_token + '[INST] ' + c }}"), "llama2");
    assert_null(vks_chat_template_family("{{ messages }}"));
    assert_int_equal(vks_chat_format("{{ messages }}", m, 1, true, &out), VKS_ERR_ARG);
    vks_chat_message bad[] = {{"us<er", "x"}};
    assert_int_equal(vks_chat_format("chatml", bad, 1, true, &out), VKS_ERR_ARG);
}

static char *chat_or_fail(const char *tmpl, const vks_chat_message *m, int n, bool prompt, bool no_think) {
    vks_chat_options o = {.add_assistant_prompt = prompt, .disable_thinking = no_think};
    char *out = NULL;
    int rc = vks_chat_format_opts(tmpl, m, n, &o, &out);
    if (rc) fail_msg("chat %s: %s", tmpl, vks_last_error());
    return out;
}

static void assert_chat(const char *tmpl, const vks_chat_message *m, int n, bool prompt, bool no_think,
                        const char *want) {
    char *out = chat_or_fail(tmpl, m, n, prompt, no_think);
    assert_string_equal(out, want);
    free(out);
}

/* Qwen3's template (Qwen3-0.6B ... 235B tokenizer_config.json), the <think>
 * convention of reasoning models, against renderings published from
 * transformers' apply_chat_template: the model card's prompts with
 * enable_thinking true and false, and a history turn without reasoning
 * getting the empty think block of the last turn (SkyRL's templates README:
 * [user "Hi", assistant "Hello"] without a generation prompt). The rest
 * follows the template's rules: reasoning is kept only after the last user
 * query, tool results (and user turns holding only one) do not count as
 * queries. */
static void test_chat_qwen3_thinking(void **s) {
    (void)s;
    vks_chat_message one[] = {{"user", "Give me a short introduction to large language model."}};
    assert_chat("qwen3", one, 1, true, false,
                "<|im_start|>user\nGive me a short introduction to large language model.<|im_end|>\n"
                "<|im_start|>assistant\n");
    assert_chat("qwen3", one, 1, true, true,
                "<|im_start|>user\nGive me a short introduction to large language model.<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\n");
    vks_chat_message hi[] = {{"user", "Hi"}, {"assistant", "Hello"}};
    assert_chat("qwen3", hi, 2, false, false,
                "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n");
    /* The reasoning of an answered turn is dropped; the last turn's kept, its newlines normalised. */
    vks_chat_message multi[] = {{"system", "Be brief."},
                                {"user", "1+1?"},
                                {"assistant", "<think>\nOne and one.\n</think>\n\n2"},
                                {"user", "Times 3?"},
                                {"assistant", "<think>\n\n2 times 3\n\n</think>\n\n\n6"}};
    assert_chat("qwen3", multi, 5, false, false,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
                "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nTimes 3?<|im_end|>\n"
                "<|im_start|>assistant\n<think>\n2 times 3\n</think>\n\n6<|im_end|>\n");
    assert_chat("qwen3", multi, 4, true, false,
                "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n1+1?<|im_end|>\n"
                "<|im_start|>assistant\n2<|im_end|>\n<|im_start|>user\nTimes 3?<|im_end|>\n<|im_start|>assistant\n");
    /* After the last query: a turn with reasoning keeps it, one without stays plain (not last);
     * consecutive tool results share one user turn. */
    vks_chat_message tools[] = {{"user", "Weather?"},
                                {"assistant", "<think>look it up</think>calling"},
                                {"tool", "sunny"},
                                {"tool", "20C"},
                                {"assistant", "no reasoning here"},
                                {"user", "<tool_response>\nlate\n</tool_response>"},
                                {"assistant", "Sunny, 20C."}};
    assert_chat("qwen3", tools, 7, false, false,
                "<|im_start|>user\nWeather?<|im_end|>\n"
                "<|im_start|>assistant\n<think>\nlook it up\n</think>\n\ncalling<|im_end|>\n"
                "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n<tool_response>\n20C\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\nno reasoning here<|im_end|>\n"
                "<|im_start|>user\n<tool_response>\nlate\n</tool_response><|im_end|>\n"
                "<|im_start|>assistant\n<think>\n\n</think>\n\nSunny, 20C.<|im_end|>\n");
    /* Several think blocks: reasoning after the last <think> before the first </think>,
     * the answer after the last </think>. */
    vks_chat_message twice[] = {{"user", "q"}, {"assistant", "<think>a<think>b</think>mid</think>\nend"}};
    assert_chat("qwen3", twice, 2, false, false,
                "<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n<think>\nb\n</think>\n\nend<|im_end|>\n");
    /* Recognized from the Jinja text by its enable_thinking switch; plain ChatML stays ChatML. */
    assert_string_equal(vks_chat_template_family("{%- if enable_thinking is defined %}<|im_start|>"), "qwen3");
    assert_string_equal(vks_chat_template_family("{{ '<|im_start|>' + m.role }}"), "chatml");
    char *out = NULL;
    vks_chat_message bad[] = {{"critic", "x"}};
    assert_int_equal(vks_chat_format("qwen3", bad, 1, true, &out), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "critic"));
}

/* Llama 3.1-3.3's template (no tools, its default date) against the rendering
 * published from apply_chat_template (BOS left to the tokenizer): the system
 * turn always comes first, with the knowledge-cutoff lines. */
/* Issue 36 item 3: a Jinja template's default system message (Qwen2.5's,
 * Qwen2's, written with escapes) is found and printed first when the
 * conversation has none, as the template does; a given system message
 * replaces it; Qwen3's template, a name, and a system turn built from the
 * conversation's own message have none. */
static void test_chat_default_system(void **s) {
    (void)s;
    char *sys = NULL, *out = NULL;
    assert_int_equal(vks_chat_default_system(QWEN25_TEMPLATE, &sys), VKS_OK);
    assert_string_equal(sys, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    free(sys);
    const char *qwen2 = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                        "{{ '<|im_start|>system\\nYou are a \\'helpful\\' assistant.<|im_end|>\\n' }}{% endif %}"
                        "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}";
    assert_int_equal(vks_chat_default_system(qwen2, &sys), VKS_OK);
    assert_string_equal(sys, "You are a 'helpful' assistant.");
    free(sys);
    const char *none[] = {QWEN3_TEMPLATE, "chatml", "qwen3", "<|im_start|>system\n{{ messages[0].content }}<|im_end|>",
                          "{{ '<|im_start|>system\\n' + m.content + '<|im_end|>' }}"};
    for (size_t i = 0; i < sizeof none / sizeof none[0]; i++) {
        sys = (char *)1;
        assert_int_equal(vks_chat_default_system(none[i], &sys), VKS_OK);
        assert_null(sys);
    }
    vks_chat_message user[] = {{"user", "Hi"}}, both[] = {{"system", "Be brief."}, {"user", "Hi"}};
    assert_int_equal(vks_chat_format(QWEN25_TEMPLATE, user, 1, true, &out), VKS_OK);
    assert_string_equal(out, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant."
                             "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    assert_int_equal(vks_chat_format(QWEN25_TEMPLATE, both, 2, true, &out), VKS_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                             "<|im_start|>assistant\n");
    free(out);
    assert_string_equal(vks_chat_template_family(QWEN3_TEMPLATE), "qwen3");
    assert_int_equal(vks_chat_format(QWEN3_TEMPLATE, user, 1, true, &out), VKS_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
    assert_int_equal(vks_chat_format("chatml", user, 1, true, &out), VKS_OK); /* a name: no default */
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
    free(out);
}

static void test_chat_llama31(void **s) {
    (void)s;
    vks_chat_message user[] = {{"user", "What is 2+2?"}};
    assert_chat("llama3.1", user, 1, true, false,
                "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+2?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
    vks_chat_message m[] = {{"system", "  You are a pirate. \n"}, {"user", " Hi! "}, {"assistant", "Arr.\n"}};
    assert_chat("llama3.1", m, 3, false, false,
                "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
                "Today Date: 26 Jul 2024\n\nYou are a pirate.<|eot_id|>"
                "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\nArr.<|eot_id|>");
    assert_string_equal(vks_chat_template_family("{{- \"Cutting Knowledge Date: December 2023\\n\" }}"
                                                 "{{ '<|start_header_id|>' }}"), "llama3.1");
    assert_string_equal(vks_chat_template_family("{{ '<|start_header_id|>' + role }}"), "llama3");
    char *out = NULL;
    vks_chat_message tool[] = {{"user", "x"}, {"tool", "{}"}};
    assert_int_equal(vks_chat_format("llama3.1", tool, 2, true, &out), VKS_ERR_ARG);
}

/* The pre-tokenizers named by tokenizer.ggml.pre, on a tiny GGUF BPE vocabulary
 * (llama-bpe and qwen2 have test vectors but no vocabulary in the shared folder). */
static void test_pretokenizer_rules(void **s) {
    (void)s;
    const char *toks[] = {"1", "2", "3", "4", "12", "123", "1234", "'", "S", "'S", "34"};
    const char *merges[] = {"1 2", "12 3", "123 4", "' S", "3 4"};
    const char *pres[] = {"gpt-2", "llama-bpe", "qwen2"};
    const int32_t want[3][5] = {{6, 7, 8}, {5, 3, 9}, {0, 1, 2, 3, 9}};
    const int want_n[3] = {3, 3, 5};
    const char *dir = tu_tmpdir();
    for (int p = 0; p < 3; p++) {
        vks_gguf_writer *w;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        vks_gguf_add_str(w, "tokenizer.ggml.model", "gpt2");
        vks_gguf_add_str(w, "tokenizer.ggml.pre", pres[p]);
        vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 11);
        vks_gguf_add_arr_str(w, "tokenizer.ggml.merges", merges, 5);
        char path[4096];
        snprintf(path, sizeof path, "%s/pre%d.gguf", dir, p);
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        vks_tokenizer *t = NULL;
        assert_int_equal(vks_tokenizer_load_gguf(path, &t), VKS_OK);
        vks_tokenize_options o = {0};
        int32_t *ids;
        int n;
        assert_int_equal(vks_tokenizer_tokenize(t, "1234'S", 6, &o, &ids, &n), VKS_OK);
        assert_int_equal(n, want_n[p]);
        assert_memory_equal(ids, want[p], (size_t)n * 4);
        free(ids);
        vks_tokenizer_free(t);
    }
}

/* ---- tokenizer.json ---- */

static const char *write_text(const char *dir, const char *name, const char *text) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

/* A tiny byte-level BPE: base bytes a, b, c, space (Ġ) and merges in both
 * JSON forms. Rank order decides: " ab" is Ġa + b, "abc" is ab + c. */
static const char TINY_JSON[] =
    "{\"added_tokens\": [{\"id\": 9, \"content\": \"<|end|>\", \"special\": true}],"
    " \"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true},"
    " \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, \"\\u0120\": 3, \"ab\": 4,"
    " \"abc\": 5, \"\\u0120a\": 6, \"\\u0120ab\": 7, \"bc\": 8},"
    " \"merges\": [\"\\u0120 a\", \"a b\", \"\\u0120a b\", [\"ab\", \"c\"], \"b c\"]}}";

static void test_hf_json(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    write_text(dir, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"<|end|>\"}, \"chat_template\": "
                                             "\"{{'<|im_start|>'}}\"}");
    char path[4096];
    snprintf(path, sizeof path, "%s", write_text(dir, "tokenizer.json", TINY_JSON));
    vks_tokenizer *t = NULL;
    int rc = vks_tokenizer_load_auto(dir, NULL, &t); /* a directory: its tokenizer.json */
    if (rc) fprintf(stderr, "%s\n", vks_last_error());
    assert_int_equal(rc, VKS_OK);
    assert_string_equal(vks_tokenizer_kind(t), "bpe");
    assert_int_equal(vks_tokenizer_eos(t), 9);
    assert_string_equal(vks_chat_template_family(vks_tokenizer_chat_template(t)), "chatml");
    vks_tokenize_options o = {.parse_special = true};
    int32_t *ids;
    int n;
    /* "abc ab<|end|>bc": words "abc", " ab", "<|end|>", "bc" */
    assert_int_equal(vks_tokenizer_tokenize(t, "abc ab<|end|>bc", 15, &o, &ids, &n), VKS_OK);
    int32_t want[] = {5, 7, 9, 8};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    char *back;
    assert_int_equal(vks_tokenizer_detokenize(t, ids, n, true, &back, NULL), VKS_OK);
    assert_string_equal(back, "abc ab<|end|>bc");
    free(back);
    free(ids);
    vks_tokenizer_free(t);

    /* Hostile variants: one-line errors naming the file, never a crash. */
    const char *bad[] = {
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": -1}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {\"a\": 0}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [7]}, \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"added_tokens\": [{\"id\": 1}],"
        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}",
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
        "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}}, {\"type\": \"ByteLevel\"}]}}",
        "{\"model\": [1, 2]}",
        "[1, 2",
        "",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *p = write_text(dir, "bad.json", bad[i]);
        rc = vks_tokenizer_load_hf_json(p, &t);
        assert_true(rc < 0);
        assert_null(t);
        assert_non_null(strstr(vks_last_error(), "bad.json"));
        assert_null(strchr(vks_last_error(), '\n'));
    }
}

/* Issue 9 item 10: a vocabulary that cannot encode a byte of the input (no
 * piece, no byte token, no unk) is an error naming the byte, never ids that
 * silently lack it. */
static void expect_encode_error(const vks_tokenizer *t, const char *text, const char *want) {
    int32_t *ids = NULL;
    int n = 0;
    vks_tokenize_options o = {0};
    int rc = vks_tokenizer_tokenize(t, text, strlen(text), &o, &ids, &n);
    if (rc != VKS_ERR_FORMAT || !strstr(vks_last_error(), want))
        fail_msg("'%s': rc %d, %d ids, '%s' (want '%s')", text, rc, n, rc ? vks_last_error() : "", want);
    free(ids);
}

static void test_bpe_missing_bytes(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_hf_json(write_text(dir, "tokenizer.json", TINY_JSON), &t), VKS_OK);
    expect_encode_error(t, "Habc", "byte 0x48 ('H')");
    expect_encode_error(t, "ab \xc3\xa9", "byte 0xC3");
    vks_tokenizer_free(t);
    const char *empty = "{\"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []},"
                        " \"added_tokens\": [{\"id\": 0, \"content\": \"<|end|>\", \"special\": true}],"
                        " \"pre_tokenizer\": {\"type\": \"ByteLevel\"}}";
    int rc = vks_tokenizer_load_hf_json(write_text(dir, "tokenizer.json", empty), &t);
    if (rc == VKS_OK) expect_encode_error(t, "Hi", "byte 0x48 ('H')"); /* or refused at load */
    vks_tokenizer_free(t);
}

/* SPM: a byte with no "<0xHH>" token and no unk (token 0 is not UNKNOWN and
 * no unknown_token_id) is an error; with an UNKNOWN token 0 it becomes unk. */
static void test_spm_missing_bytes(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    const char *toks[] = {"<s>", "</s>", ("\xe2\x96\x81" "a"), "a"};
    for (int with_unk = 0; with_unk < 2; with_unk++) {
        vks_gguf_writer *w;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        vks_gguf_add_str(w, "tokenizer.ggml.model", "llama");
        vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        int32_t types[4] = {with_unk ? 2 : 3, 3, 1, 1};
        vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, types, 4);
        float scores[4] = {0, 0, -1, -2};
        vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, scores, 4);
        vks_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 0);
        vks_gguf_add_u32(w, "tokenizer.ggml.eos_token_id", 1);
        char path[4096];
        snprintf(path, sizeof path, "%s/nobytes%d.gguf", dir, with_unk);
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        vks_tokenizer *t = NULL;
        if (vks_tokenizer_load_gguf(path, &t) != VKS_OK) fail_msg("%s", vks_last_error());
        if (!with_unk) {
            expect_encode_error(t, "ab", "byte 0x62 ('b')");
        } else {
            int32_t *ids = NULL;
            int n = 0;
            vks_tokenize_options o = {0};
            assert_int_equal(vks_tokenizer_tokenize(t, "ab", 2, &o, &ids, &n), VKS_OK);
            int32_t want[2] = {2, 0}; /* "▁a", unk */
            assert_int_equal(n, 2);
            assert_memory_equal(ids, want, sizeof want);
            free(ids);
        }
        vks_tokenizer_free(t);
    }
}

/* ---- hostile GGUF vocabularies ---- */

/* Empty, null, [] and BOM-prefixed tokenizer.json files: said for what they
 * are (never "a llama2.c tokenizer.bin needs the model's vocab size"); a
 * byte order mark before valid JSON is skipped. */
static void test_hf_json_odd_files(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    const char *bad[] = {"", "null", "[]", " \n", "\xef\xbb\xbf", "\xef\xbb\xbfnull"};
    const char *names[] = {"tokenizer.json", "tok"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        for (int k = 0; k < 2; k++) {
            const char *p = write_text(dir, names[k], bad[i]);
            vks_tokenizer *t = NULL;
            assert_true(vks_tokenizer_load_auto(p, NULL, &t) < 0);
            assert_null(t);
            bool said = strstr(vks_last_error(), names[k]) && !strstr(vks_last_error(), "llama2.c");
            bool must = k == 0 || i == 0 || i == 2; /* "tok" holding null: could be anything */
            if (must && !said) fail_msg("'%s' as %s: %s", bad[i], names[k], vks_last_error());
        }
    char bom_json[sizeof TINY_JSON + 3] = "\xef\xbb\xbf";
    strcat(bom_json, TINY_JSON);
    for (int k = 0; k < 2; k++) {
        vks_tokenizer *t = NULL;
        int rc = vks_tokenizer_load_auto(write_text(dir, names[k], bom_json), NULL, &t);
        if (rc) fail_msg("BOM + JSON as %s: %s", names[k], vks_last_error());
        assert_int_equal(vks_tokenizer_vocab_size(t), 10);
        vks_tokenizer_free(t);
    }
}

static void test_gguf_mutations(void **s) {
    (void)s;
    const char *p = tu_shared_path("llamacpp-vocab/ggml-vocab-gpt-2.gguf");
    if (!p) skip();
    size_t size;
    unsigned char *orig = tu_read_file(p, &size);
    unsigned char *buf = malloc(size);
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    int loaded = 0, refused = 0;
    for (int iter = 0; iter < 40; iter++) {
        memcpy(buf, orig, size);
        size_t len = size;
        if (iter % 4 == 0) {
            len = (size_t)((x >> 11) % size); /* truncation */
        } else {
            /* byte flips: in the header and first KV pairs, or anywhere (mostly token text) */
            size_t span = iter % 4 == 1 ? 4096 : size;
            for (int k = 0; k < 8; k++) {
                x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                unsigned char *b = &buf[(x >> 5) % span];
                if (iter % 4 == 3) { /* change letters only: still a valid file, odd pieces */
                    if (*b >= 'a' && *b <= 'z') *b ^= 0x20;
                } else {
                    *b ^= (unsigned char)(1u << (x % 8));
                }
            }
        }
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        vks_gguf *g = NULL;
        vks_tokenizer *t = NULL;
        int rc = vks_gguf_open_memory(buf, len, "mutant.gguf", &g);
        if (rc == VKS_OK) rc = vks_tokenizer_load_gguf_handle(g, "mutant.gguf", &t);
        if (rc == VKS_OK) {
            int32_t *ids;
            int n;
            vks_tokenize_options o = {.parse_special = true};
            assert_int_equal(vks_tokenizer_tokenize(t, "Hello <|endoftext|> w\xff", 22, &o, &ids, &n), VKS_OK);
            free(ids);
            loaded++;
        } else {
            if (refused < 3) fprintf(stderr, "refused: %s\n", vks_last_error());
            assert_non_null(strstr(vks_last_error(), "mutant.gguf"));
            refused++;
        }
        vks_tokenizer_free(t);
        vks_gguf_close(g);
    }
    fprintf(stderr, "gguf mutations: %d loaded, %d refused\n", loaded, refused);
    assert_true(refused > 0);
    assert_true(loaded > 0);
    free(buf);
    free(orig);
}

/* Hand-made GGUF vocabularies with bad fields. */
static void test_gguf_bad_fields(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    const char *toks[] = {"<unk>", "<s>", "</s>", "a"};
    struct {
        const char *what;
        int variant;
    } cases[] = {{"no model key", 0}, {"unknown model", 1}, {"bos out of range", 2}, {"bad token type", 3},
                 {"scores length", 4}, {"unknown pre", 5}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        vks_gguf_writer *w;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        int v = cases[i].variant;
        if (v != 0) vks_gguf_add_str(w, "tokenizer.ggml.model", v == 1 ? "bert" : v == 5 ? "gpt2" : "llama");
        vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 4);
        if (v == 5) vks_gguf_add_arr_str(w, "tokenizer.ggml.merges", toks, 0);
        if (v == 5) vks_gguf_add_str(w, "tokenizer.ggml.pre", "mystery");
        if (v == 2) vks_gguf_add_u32(w, "tokenizer.ggml.bos_token_id", 4);
        int32_t types[4] = {2, 3, 3, v == 3 ? 9 : 1};
        vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, types, 4);
        float scores[4] = {0, 0, 0, -1};
        vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, scores, v == 4 ? 3 : 4);
        char path[4096];
        snprintf(path, sizeof path, "%s/bad%zu.gguf", dir, i);
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        vks_tokenizer *t = NULL;
        int rc = vks_tokenizer_load_gguf(path, &t);
        if (rc == VKS_OK) fprintf(stderr, "%s: loaded\n", cases[i].what);
        assert_true(rc < 0);
        assert_non_null(strstr(vks_last_error(), path));
    }
}

/* ---- the byte-level vocabulary and the tokenizer writers (issue 11) ---- */

/* n bytes of every value (NUL and invalid UTF-8 included), from a fixed LCG. */
static char *random_bytes(size_t n, uint32_t seed) {
    char *b = malloc(n ? n : 1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        b[i] = (char)(seed >> 24);
    }
    return b;
}

static int32_t *tokenize_or_fail(const vks_tokenizer *t, const char *text, size_t len, vks_tokenize_options o, int *n) {
    int32_t *ids = NULL;
    int rc = vks_tokenizer_tokenize(t, text, len, &o, &ids, n);
    if (rc) fail_msg("tokenize: %s", vks_last_error());
    return ids;
}

static char *detokenize_or_fail(const vks_tokenizer *t, const int32_t *ids, int n, bool special, size_t *len) {
    char *text = NULL;
    int rc = vks_tokenizer_detokenize(t, ids, n, special, &text, len);
    if (rc) fail_msg("detokenize: %s", vks_last_error());
    return text;
}

/* Any bytes are one token each (id = byte), and come back exactly. */
static void check_bytes_one_to_one(const vks_tokenizer *t, const char *text, size_t len) {
    int n = 0;
    int32_t *ids = tokenize_or_fail(t, text, len, (vks_tokenize_options){0}, &n);
    assert_int_equal(n, (int)len);
    for (size_t i = 0; i < len; i++)
        if (ids[i] != (unsigned char)text[i]) fail_msg("byte %zu (0x%02x) became id %d", i, (unsigned char)text[i], ids[i]);
    size_t blen = 0;
    char *back = detokenize_or_fail(t, ids, n, false, &blen);
    assert_int_equal(blen, len);
    assert_memory_equal(back, text, len);
    free(back);
    free(ids);
}

static void test_byte_level_vocabulary(void **s) {
    (void)s;
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_byte_level(&t), VKS_OK);
    assert_string_equal(vks_tokenizer_kind(t), "bpe");
    assert_int_equal(vks_tokenizer_vocab_size(t), 259);
    assert_int_equal(vks_tokenizer_bos(t), 256);
    assert_int_equal(vks_tokenizer_eos(t), 257);
    assert_int_equal(vks_tokenizer_pad(t), 258);
    assert_true(vks_tokenizer_wants_bos(t));
    assert_false(vks_tokenizer_wants_eos(t));
    assert_int_equal(vks_tokenizer_find(t, "<|pad|>", 7), 258);
    for (int id = 256; id < 259; id++) assert_int_equal(vks_tokenizer_token_type(t, id), VKS_TOKEN_TYPE_CONTROL);
    for (int b = 0; b < 256; b++) { /* each byte alone */
        char c = (char)b;
        check_bytes_one_to_one(t, &c, 1);
    }
    const char odd[] = "caf\xc3\xa9 \xff\xfe \xc3\x28 \xed\xa0\x80 \xf4\x90\x80\x80 \r\n\t  \x1b[2J 12345 'll";
    check_bytes_one_to_one(t, odd, sizeof odd - 1);
    char *big = random_bytes(1 << 20, 11);
    check_bytes_one_to_one(t, big, 1 << 20);
    free(big);

    /* BOS and EOS around the text; control tokens print only with show_special. */
    int n = 0;
    int32_t *ids = tokenize_or_fail(t, "hi", 2, (vks_tokenize_options){.add_bos = true, .add_eos = true}, &n);
    int32_t want[] = {256, 'h', 'i', 257};
    assert_int_equal(n, 4);
    assert_memory_equal(ids, want, sizeof want);
    size_t len = 0;
    char *text = detokenize_or_fail(t, ids, n, false, &len);
    assert_string_equal(text, "hi");
    free(text);
    text = detokenize_or_fail(t, ids, n, true, &len);
    assert_string_equal(text, "<|bos|>hi<|eos|>");
    free(text);
    free(ids);
    /* A control token's text is bytes unless special tokens are parsed. */
    ids = tokenize_or_fail(t, "a<|eos|>", 8, (vks_tokenize_options){0}, &n);
    assert_int_equal(n, 8);
    free(ids);
    ids = tokenize_or_fail(t, "a<|eos|>", 8, (vks_tokenize_options){.parse_special = true}, &n);
    assert_int_equal(n, 2);
    assert_int_equal(ids[1], 257);
    free(ids);
    /* What generate calls: BOS, then one id per byte. */
    int32_t buf[8];
    assert_int_equal(vks_tokenizer_encode(t, "\xff" "a", 2, true, false, buf, &n), VKS_OK);
    assert_int_equal(n, 3);
    assert_int_equal(buf[0], 256);
    assert_int_equal(buf[1], 255);
    assert_int_equal(buf[2], 'a');
    vks_tokenizer_free(t);
}

/* Writes t as GGUF metadata or as tokenizer.json + tokenizer_config.json and
 * loads it back. */
static vks_tokenizer *saved_and_reloaded(const vks_tokenizer *t, bool hf) {
    const char *dir = tu_tmpdir();
    char path[4096], cfg[4096];
    vks_tokenizer *back = NULL;
    int rc;
    if (hf) {
        snprintf(path, sizeof path, "%s/tokenizer.json", dir);
        snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
        FILE *f = fopen(path, "wb"), *g = fopen(cfg, "wb");
        assert_true(f && g);
        rc = vks_tokenizer_save_hf(t, f, path, g, cfg);
        if (rc) fail_msg("save_hf: %s", vks_last_error());
        assert_int_equal(fclose(f), 0);
        assert_int_equal(fclose(g), 0);
        rc = vks_tokenizer_load_auto(dir, NULL, &back);
    } else {
        snprintf(path, sizeof path, "%s/vocab.gguf", dir);
        vks_gguf_writer *w = NULL;
        assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
        rc = vks_tokenizer_save_gguf(t, w);
        if (rc) fail_msg("save_gguf: %s", vks_last_error());
        assert_int_equal(vks_gguf_writer_save(w, path), VKS_OK);
        vks_gguf_writer_free(w);
        rc = vks_tokenizer_load_gguf(path, &back);
    }
    if (rc) fail_msg("reload: %s", vks_last_error());
    return back;
}

/* Same vocabulary: size, specials, flags, and each token's type and text. */
static void assert_same_tokenizer(const vks_tokenizer *a, const vks_tokenizer *b) {
    assert_string_equal(vks_tokenizer_kind(a), vks_tokenizer_kind(b));
    assert_int_equal(vks_tokenizer_vocab_size(a), vks_tokenizer_vocab_size(b));
    assert_int_equal(vks_tokenizer_bos(a), vks_tokenizer_bos(b));
    assert_int_equal(vks_tokenizer_eos(a), vks_tokenizer_eos(b));
    assert_int_equal(vks_tokenizer_pad(a), vks_tokenizer_pad(b));
    assert_int_equal(vks_tokenizer_wants_bos(a), vks_tokenizer_wants_bos(b));
    assert_int_equal(vks_tokenizer_wants_eos(a), vks_tokenizer_wants_eos(b));
    const char *ta = vks_tokenizer_chat_template(a), *tb = vks_tokenizer_chat_template(b);
    assert_true(!ta == !tb);
    if (ta) assert_string_equal(ta, tb);
    for (int id = 0; id < vks_tokenizer_vocab_size(a); id++) {
        int ty = vks_tokenizer_token_type(a, id);
        if (ty == VKS_TOKEN_TYPE_UNUSED) continue; /* an id nobody names */
        if (ty != vks_tokenizer_token_type(b, id)) fail_msg("token %d: type %d, then %d", id, ty, vks_tokenizer_token_type(b, id));
        size_t la, lb;
        char *xa = detokenize_or_fail(a, &id, 1, true, &la), *xb = detokenize_or_fail(b, &id, 1, true, &lb);
        if (la != lb || memcmp(xa, xb, la)) fail_msg("token %d: text '%s', then '%s'", id, xa, xb);
        free(xa);
        free(xb);
    }
}

static void vectors_of(const vks_tokenizer *t, const char *name) {
    char inp[2048], out[2048];
    snprintf(inp, sizeof inp, "%s%s.inp", tu_shared_path("llamacpp-vocab/"), name);
    snprintf(out, sizeof out, "%s%s.out", tu_shared_path("llamacpp-vocab/"), name);
    assert_int_equal(check_vectors(t, inp, out, true), 46);
}

static void test_byte_level_through_files(void **s) {
    (void)s;
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_byte_level(&t), VKS_OK);
    char *text = random_bytes(4096, 5);
    for (int hf = 0; hf < 2; hf++) {
        vks_tokenizer *back = saved_and_reloaded(t, hf);
        assert_same_tokenizer(t, back);
        check_bytes_one_to_one(back, text, 4096);
        vks_tokenizer_free(back);
    }
    free(text);
    vks_tokenizer_free(t);
}

/* Real vocabularies through the writers still give llama.cpp's ids: the
 * merges (GPT-2: 50000, in rank order), scores and flags survive. */
static void test_tokenizer_writers_real_vocabularies(void **s) {
    (void)s;
    vks_tokenizer *gpt2 = load_vocab("ggml-vocab-gpt-2.gguf");
    if (!gpt2) skip();
    for (int hf = 0; hf < 2; hf++) {
        vks_tokenizer *back = saved_and_reloaded(gpt2, hf);
        assert_same_tokenizer(gpt2, back);
        vectors_of(back, "ggml-vocab-gpt-2.gguf");
        vks_tokenizer_free(back);
    }
    vks_tokenizer_free(gpt2);
    vks_tokenizer *spm = load_vocab("ggml-vocab-llama-spm.gguf");
    vks_tokenizer *back = saved_and_reloaded(spm, false);
    assert_same_tokenizer(spm, back);
    vectors_of(back, "ggml-vocab-llama-spm.gguf");
    vks_tokenizer_free(back);
    /* tokenizer.json holds byte-level BPE only: refused, naming the file. */
    FILE *f = tmpfile(), *g = tmpfile();
    assert_int_equal(vks_tokenizer_save_hf(spm, f, "x/tokenizer.json", g, "x/tokenizer_config.json"), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "x/tokenizer.json"));
    fclose(f);
    fclose(g);
    vks_tokenizer_free(spm);
}

/* Writes t as a model directory holds it (vks_tokenizer_dir_files) and loads
 * the directory back as a model's tokenizer of `vocab` tokens. */
static vks_tokenizer *through_dir(const vks_tokenizer *t, int vocab, const char *dir) {
    const char *names[2];
    int n = vks_tokenizer_dir_files(t, names);
    assert_true(n == 1 || n == 2);
    char paths[2][4096];
    FILE *f[2] = {NULL, NULL};
    const char *p[2] = {NULL, NULL};
    for (int i = 0; i < n; i++) {
        snprintf(paths[i], sizeof paths[i], "%s/%s", dir, names[i]);
        f[i] = fopen(paths[i], "wb");
        assert_non_null(f[i]);
        p[i] = paths[i];
    }
    int rc = vks_tokenizer_save_dir_files(t, f, p);
    if (rc) fail_msg("save_dir_files: %s", vks_last_error());
    for (int i = 0; i < n; i++) assert_int_equal(fclose(f[i]), 0);
    vks_model fake = {0}; /* a model directory's tokenizer: only the vocab size is read */
    fake.cfg.vocab_size = vocab;
    snprintf(fake.dir, sizeof fake.dir, "%s", dir);
    snprintf(fake.path, sizeof fake.path, "%s", dir);
    vks_tokenizer *back = NULL;
    rc = vks_tokenizer_load_auto(NULL, &fake, &back);
    if (rc) fail_msg("reload: %s", vks_last_error());
    return back;
}

/* Every kind of tokenizer the project reads goes into a model directory (a
 * training checkpoint) and comes back the same: llama2.c's tokenizer.bin byte
 * for byte, SentencePiece vocabularies as tokenizer.gguf, byte-level BPE as
 * tokenizer.json; each still gives its reference ids. */
static void test_tokenizer_dir_files_every_kind(void **s) {
    (void)s;
    const char *p = tu_shared_path("stories260K/tok512.bin");
    if (!p) skip();
    char tok512[2048], dir[2048], path[4096], inp[2048], out[2048];
    snprintf(tok512, sizeof tok512, "%s", p);
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_llama2c(tok512, 512, &t), VKS_OK);
    snprintf(dir, sizeof dir, "%s/l2c", tu_tmpdir());
    assert_int_equal(mkdir(dir, 0777), 0);
    vks_tokenizer *back = through_dir(t, 512, dir);
    assert_same_tokenizer(t, back);
    snprintf(inp, sizeof inp, "%s", tu_shared_path("stories260K/ref/tok512.encode.inp"));
    snprintf(out, sizeof out, "%s", tu_shared_path("stories260K/ref/tok512.encode.out"));
    assert_int_equal(check_vectors(back, inp, out, true), 21);
    size_t na, nb;
    uint8_t *a = tu_read_file(tok512, &na);
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    uint8_t *b = tu_read_file(path, &nb);
    assert_true(a && b && na == nb && !memcmp(a, b, na));
    free(a);
    free(b);
    vks_tokenizer_free(back);
    vks_tokenizer_free(t);
    const char *vocabs[3] = {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf"};
    const char *files[3] = {"tokenizer.gguf", "tokenizer.gguf", "tokenizer.json"};
    for (int v = 0; v < 3; v++) {
        t = load_vocab(vocabs[v]);
        snprintf(dir, sizeof dir, "%s/v%d", tu_tmpdir(), v);
        assert_int_equal(mkdir(dir, 0777), 0);
        back = through_dir(t, vks_tokenizer_vocab_size(t), dir);
        snprintf(path, sizeof path, "%s/%s", dir, files[v]);
        assert_int_equal(access(path, F_OK), 0);
        assert_same_tokenizer(t, back);
        vectors_of(back, vocabs[v]);
        vks_tokenizer_free(back);
        vks_tokenizer_free(t);
    }
}

/* A model directory rewritten with a tokenizer of another kind keeps only the
 * new one (a stale tokenizer.json would be read first). */
static void test_model_dir_replaces_tokenizer(void **s) {
    (void)s;
    const char *p = tu_shared_path("stories260K/tok512.bin");
    if (!p) skip();
    vks_tokenizer *l2c = NULL, *bytes = NULL, *back = NULL;
    assert_int_equal(vks_tokenizer_load_llama2c(p, 512, &l2c), VKS_OK);
    vks_model *m = NULL;
    assert_int_equal(vks_model_init_tiny(0, &m, &bytes), VKS_OK);
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/hf", tu_tmpdir());
    vks_model_save_options o = {.dtype = VKS_DTYPE_F32, .tokenizer = bytes};
    assert_int_equal(vks_model_save_safetensors(m, dir, &o), VKS_OK);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    assert_int_equal(access(path, F_OK), 0);
    o.tokenizer = l2c;
    assert_int_equal(vks_model_save_safetensors(m, dir, &o), VKS_OK);
    assert_int_not_equal(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    vks_model fake = {0};
    fake.cfg.vocab_size = 512;
    assert_int_equal(vks_tokenizer_load_auto(dir, &fake, &back), VKS_OK);
    assert_string_equal(vks_tokenizer_kind(back), "llama2c");
    vks_tokenizer_free(back);
    o.tokenizer = bytes; /* and back: tokenizer.bin goes */
    assert_int_equal(vks_model_save_safetensors(m, dir, &o), VKS_OK);
    snprintf(path, sizeof path, "%s/tokenizer.bin", dir);
    assert_int_not_equal(access(path, F_OK), 0);
    assert_int_equal(vks_tokenizer_load_auto(dir, m, &back), VKS_OK);
    assert_same_tokenizer(bytes, back);
    vks_tokenizer_free(back);
    vks_model_free(m);
    vks_tokenizer_free(bytes);
    vks_tokenizer_free(l2c);
}

/* TINY_JSON with a Split regex before a ByteLevel without its own regex. */
static const char *tiny_json_with_split(const char *regex_json, bool ignore_merges) {
    static char buf[4096];
    const char *pre = strstr(TINY_JSON, "\"pre_tokenizer\"");
    const char *model = strstr(TINY_JSON, "\"model\"");
    snprintf(buf, sizeof buf, "%.*s\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", "
             "\"pattern\": {\"Regex\": \"%s\"}, \"behavior\": \"Isolated\", \"invert\": false}, {\"type\": "
             "\"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]}, \"model\": {\"ignore_merges\": %s, %s",
             (int)(pre - TINY_JSON), TINY_JSON, regex_json, ignore_merges ? "true" : "false",
             strchr(model, '{') + 1);
    return buf;
}

/* Llama 3's split rules have a GGUF name (llama-bpe); a regex without one
 * goes to tokenizer.json only. */
static void test_tokenizer_writers_split_rules(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    static const char llama3[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}{1,3}|"
                                 " ?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+";
    vks_tokenizer *t = NULL;
    int rc = vks_tokenizer_load_hf_json(write_text(dir, "tokenizer.json", tiny_json_with_split(llama3, true)), &t);
    if (rc) fail_msg("%s", vks_last_error());
    for (int hf = 0; hf < 2; hf++) {
        vks_tokenizer *back = saved_and_reloaded(t, hf);
        assert_same_tokenizer(t, back);
        int n = 0; /* ignore_merges: "abc" is a piece, taken whole; "ab" too */
        int32_t *ids = tokenize_or_fail(back, "abc ab", 6, (vks_tokenize_options){0}, &n);
        int32_t want[] = {5, 7};
        assert_int_equal(n, 2);
        assert_memory_equal(ids, want, sizeof want);
        free(ids);
        vks_tokenizer_free(back);
    }
    vks_tokenizer_free(t);
    rc = vks_tokenizer_load_hf_json(write_text(dir, "tokenizer.json", tiny_json_with_split("\\\\S+|\\\\s+", false)), &t);
    if (rc) fail_msg("%s", vks_last_error());
    vks_gguf_writer *w = NULL;
    assert_int_equal(vks_gguf_writer_create(&w), VKS_OK);
    assert_int_equal(vks_tokenizer_save_gguf(t, w), VKS_ERR_ARG);
    assert_non_null(strstr(vks_last_error(), "no GGUF name"));
    vks_gguf_writer_free(w);
    vks_tokenizer *back = saved_and_reloaded(t, true);
    assert_same_tokenizer(t, back);
    int n = 0;
    int32_t *ids = tokenize_or_fail(back, "abc ab", 6, (vks_tokenize_options){0}, &n);
    assert_int_equal(n, 3); /* "abc", " " (Ġ), "ab": the space is a word of its own here */
    free(ids);
    vks_tokenizer_free(back);
    vks_tokenizer_free(t);
}

/* tokenizer.json with merges in both forms, a special token, an EOS from the
 * config and a chat template, through both writers. */
static void test_tokenizer_writers_merges_and_template(void **s) {
    (void)s;
    const char *dir = tu_tmpdir();
    write_text(dir, "tokenizer_config.json", "{\"eos_token\": {\"content\": \"<|end|>\"}, \"chat_template\": "
                                             "\"{{'<|im_start|>'}}\"}");
    write_text(dir, "tokenizer.json", TINY_JSON);
    vks_tokenizer *t = NULL;
    assert_int_equal(vks_tokenizer_load_auto(dir, NULL, &t), VKS_OK);
    int32_t want[] = {5, 7, 9, 8};
    for (int hf = 0; hf < 2; hf++) {
        vks_tokenizer *back = saved_and_reloaded(t, hf);
        assert_same_tokenizer(t, back);
        int n = 0;
        int32_t *ids = tokenize_or_fail(back, "abc ab<|end|>bc", 15, (vks_tokenize_options){.parse_special = true}, &n);
        assert_int_equal(n, 4);
        assert_memory_equal(ids, want, sizeof want);
        free(ids);
        vks_tokenizer_free(back);
    }
    vks_tokenizer_free(t);
}

/* ---- through the binary ---- */

static void test_cli(void **s) {
    (void)s;
    const char *p = tu_shared_path("llamacpp-vocab/ggml-vocab-gpt-2.gguf");
    if (!p) skip();
    char gpt2[2048], spm[2048], tok512[2048], cmd[8192], *out;
    snprintf(gpt2, sizeof gpt2, "%s", p);
    snprintf(spm, sizeof spm, "%s", tu_shared_path("llamacpp-vocab/ggml-vocab-llama-spm.gguf"));
    snprintf(tok512, sizeof tok512, "%s", tu_shared_path("stories260K/tok512.bin"));
    snprintf(cmd, sizeof cmd, "printf 'Hello world' | %s tokenize --tokenizer %s", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "15496 995\n");
    free(out);
    snprintf(cmd, sizeof cmd, "echo '15496 995 50256' | %s detokenize --tokenizer %s", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "Hello world");
    free(out);
    snprintf(cmd, sizeof cmd, "echo '15496 995 50256' | %s detokenize --special --tokenizer %s", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "Hello world<|endoftext|>");
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'Hello world' | %s tokenize --model %s", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, &out), 0); /* --model alone: the GGUF's own tokenizer */
    assert_string_equal(out, "15496 995\n");
    free(out);
    /* SPM: BOS by default (add_bos_token), --no-bos off. */
    snprintf(cmd, sizeof cmd, "printf 'Hello world' | %s tokenize --tokenizer %s", tu_bin(), spm);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "1 15043 3186\n");
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'Hello world' | %s tokenize --no-bos --tokenizer %s", tu_bin(), spm);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "15043 3186\n");
    free(out);
    snprintf(cmd, sizeof cmd, "echo 1 15043 3186 | %s detokenize --tokenizer %s", tu_bin(), spm);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "Hello world");
    free(out);
    /* Chat with a named template: the markers are special tokens of the vocabulary. */
    snprintf(cmd, sizeof cmd, "printf 'Hi' | %s tokenize --chat --chat-template llama2 --no-bos --tokenizer %s "
             "| %s detokenize --tokenizer %s", tu_bin(), spm, tu_bin(), spm);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "[INST] Hi [/INST]");
    free(out);
    /* Qwen3's prompt without thinking, through the tiny model's byte-level tokenizer (the
     * markers are plain bytes there): detokenized, the exact text. */
    snprintf(cmd, sizeof cmd, "cd %s && %s convert --init tiny --out tiny.gguf 2>/dev/null && printf 'Hi' | %s tokenize "
             "--model tiny.gguf --no-bos --chat --chat-template qwen3 --no-think | %s detokenize --model tiny.gguf",
             tu_tmpdir(), tu_bin(), tu_bin(), tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    snprintf(cmd, sizeof cmd, "printf x | %s tokenize --no-think --tokenizer %s 2>/dev/null", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, NULL), 2);
    /* llama2.c tokenizer.bin without a model needs --vocab-size. */
    snprintf(cmd, sizeof cmd, "printf 'Once upon a time' | %s tokenize --no-bos --vocab-size 512 --tokenizer %s",
             tu_bin(), tok512);
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_string_equal(out, "403 407 261 378\n");
    free(out);
    snprintf(cmd, sizeof cmd, "printf 'x' | %s tokenize --tokenizer %s 2>/dev/null", tu_bin(), tok512);
    assert_int_equal(tu_run(cmd, NULL), 2);
    /* Bad input: exit 2. */
    snprintf(cmd, sizeof cmd, "echo '15496 99999999' | %s detokenize --tokenizer %s 2>/dev/null", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "echo '15496 x' | %s detokenize --tokenizer %s 2>/dev/null", tu_bin(), gpt2);
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "printf x | %s tokenize --tokenizer /nonexistent.gguf 2>/dev/null", tu_bin());
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "printf x | %s tokenize --chat --chat-template nope --tokenizer %s 2>/dev/null", tu_bin(),
             gpt2);
    assert_int_equal(tu_run(cmd, NULL), 2);
    snprintf(cmd, sizeof cmd, "%s tokenize --help", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "usage: vkswarm tokenize"));
    free(out);
    snprintf(cmd, sizeof cmd, "%s detokenize --help", tu_bin());
    assert_int_equal(tu_run(cmd, &out), 0);
    assert_non_null(strstr(out, "usage: vkswarm detokenize"));
    free(out);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_spm_vectors),  cmocka_unit_test(test_phi3_vectors),
        cmocka_unit_test(test_gpt2_vectors),       cmocka_unit_test(test_llama2c_bin_on_spm_vectors),
        cmocka_unit_test(test_tok512_vectors),     cmocka_unit_test(test_tok512_through_gguf),
            cmocka_unit_test(test_invalid_utf8),
        cmocka_unit_test(test_special_tokens),     cmocka_unit_test(test_phi3_metadata),
        cmocka_unit_test(test_chat_formats),       cmocka_unit_test(test_hf_json),
        cmocka_unit_test(test_chat_qwen3_thinking), cmocka_unit_test(test_chat_llama31), cmocka_unit_test(test_chat_default_system),
        cmocka_unit_test(test_hf_json_odd_files),
        cmocka_unit_test(test_gguf_mutations),     cmocka_unit_test(test_gguf_bad_fields),
        cmocka_unit_test(test_pretokenizer_rules), cmocka_unit_test(test_cli),
        cmocka_unit_test(test_bpe_missing_bytes),  cmocka_unit_test(test_spm_missing_bytes),
        cmocka_unit_test(test_byte_level_vocabulary), cmocka_unit_test(test_byte_level_through_files),
        cmocka_unit_test(test_tokenizer_writers_real_vocabularies),
        cmocka_unit_test(test_tokenizer_writers_merges_and_template),
        cmocka_unit_test(test_tokenizer_writers_split_rules),
        cmocka_unit_test(test_tokenizer_dir_files_every_kind), cmocka_unit_test(test_model_dir_replaces_tokenizer),
    };
    if (getenv("VKSWARM_TEST_FILTER")) cmocka_set_test_filter(getenv("VKSWARM_TEST_FILTER"));
    return cmocka_run_group_tests(tests, NULL, NULL);
}
