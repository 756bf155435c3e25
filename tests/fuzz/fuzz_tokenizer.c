/* libFuzzer target: tokenizer loading and encoding on hostile bytes.
 * The first input byte picks what the rest is:
 *   0: a GGUF vocabulary (loaded from memory), then used to encode a fixed text
 *   1: a tokenizer.json (written to a temporary file), then the same
 *   2..: text to encode (and decode again) with the GPT-2 and Llama SPM vocabularies
 *        of $VKSWARM_SHARED/models/llamacpp-vocab when present, else with a tiny
 *        built-in GGUF vocabulary; with and without parse_special.
 * Loads may fail (with an error message); nothing may crash, leak or hang. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vkswarm/vks_gguf.h"
#include "vkswarm/vks_tokenizer.h"

static const char SAMPLE[] = "Hello world <|endoftext|></s> caf\xc3\xa9 \xff 123 \xe4\xbd\xa0";

static void exercise(const vks_tokenizer *t, const char *text, size_t len) {
    for (int special = 0; special < 2; special++) {
        vks_tokenize_options o = {.add_bos = true, .add_eos = true, .parse_special = special};
        int32_t *ids = NULL;
        int n = 0;
        if (vks_tokenizer_tokenize(t, text, len, &o, &ids, &n) != VKS_OK) continue;
        char *back = NULL;
        size_t blen = 0;
        if (vks_tokenizer_detokenize(t, ids, n, special, &back, &blen) == VKS_OK) free(back);
        char buf[8];
        for (int i = 0; i + 1 < n; i++) vks_tokenizer_decode(t, ids[i], ids[i + 1], buf, &blen);
        free(ids);
    }
}

static vks_tokenizer *tiny_vocab(void) {
    const char *toks[] = {"<unk>", "<s>", "</s>", "\xe2\x96\x81", "a", "b", "\xe2\x96\x81" "a", "ab", "<0x61>"};
    int32_t types[] = {2, 3, 3, 1, 1, 1, 1, 1, 6};
    float scores[] = {0, 0, 0, -1, -2, -3, -4, -5, 0};
    vks_gguf_writer *w = NULL;
    vks_tokenizer *t = NULL;
    char path[64];
    snprintf(path, sizeof path, "/tmp/fuzz_tokenizer_%d.gguf", (int)getpid());
    if (vks_gguf_writer_create(&w)) return NULL;
    vks_gguf_add_str(w, "tokenizer.ggml.model", "llama");
    vks_gguf_add_arr_str(w, "tokenizer.ggml.tokens", toks, 9);
    vks_gguf_add_arr(w, "tokenizer.ggml.token_type", VKS_GGUF_INT32, types, 9);
    vks_gguf_add_arr(w, "tokenizer.ggml.scores", VKS_GGUF_FLOAT32, scores, 9);
    if (vks_gguf_writer_save(w, path) == VKS_OK) vks_tokenizer_load_gguf(path, &t);
    vks_gguf_writer_free(w);
    unlink(path);
    return t;
}

static vks_tokenizer *shared_vocab(const char *name) {
    const char *root = getenv("VKSWARM_SHARED");
    if (!root) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/models/llamacpp-vocab/%s", root, name);
    vks_tokenizer *t = NULL;
    vks_tokenizer_load_gguf(path, &t);
    return t;
}

static vks_tokenizer *fixed[2];

static void load_fixed(void) {
    if (fixed[0] || fixed[1]) return;
    fixed[0] = shared_vocab("ggml-vocab-gpt-2.gguf");
    fixed[1] = shared_vocab("ggml-vocab-llama-spm.gguf");
    if (!fixed[1]) fixed[1] = tiny_vocab();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    uint8_t mode = data[0];
    data++;
    size--;
    vks_tokenizer *t = NULL;
    if (mode == 0) {
        vks_gguf *g = NULL;
        if (vks_gguf_open_memory(data, size, "fuzz.gguf", &g) == VKS_OK &&
            vks_tokenizer_load_gguf_handle(g, "fuzz.gguf", &t) == VKS_OK)
            exercise(t, SAMPLE, sizeof SAMPLE - 1);
        vks_tokenizer_free(t);
        vks_gguf_close(g);
    } else if (mode == 1) {
        char path[64];
        snprintf(path, sizeof path, "/tmp/fuzz_tokenizer_%d.json", (int)getpid());
        FILE *f = fopen(path, "wb");
        if (!f) return 0;
        fwrite(data, 1, size, f);
        fclose(f);
        if (vks_tokenizer_load_hf_json(path, &t) == VKS_OK) exercise(t, SAMPLE, sizeof SAMPLE - 1);
        vks_tokenizer_free(t);
        unlink(path);
    } else {
        load_fixed();
        for (int i = 0; i < 2; i++)
            if (fixed[i]) exercise(fixed[i], (const char *)data, size);
    }
    return 0;
}
