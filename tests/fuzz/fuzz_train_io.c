/* libFuzzer target: the training inputs on hostile bytes. The first byte
 * picks what the rest is:
 *   x % 3 == 0: SFT JSONL data (bits of the byte choose strict/lenient, the
 *               long-sequence policy and the context), then a few batches from
 *               a position taken from the data's first bytes;
 *   x % 3 == 1: a checkpoint's state.json (the other files are a valid
 *               checkpoint's), loaded;
 *   x % 3 == 2: a metrics.jsonl, read back and plotted.
 * Loads may fail (with a one-line message); nothing may crash, leak or hang. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vkswarm/vks_checkpoint.h"
#include "vkswarm/vks_metrics.h"
#include "vkswarm/vks_sft_data.h"
#include "vkswarm/vks_tokenizer.h"

static char dir[64];
static vks_tokenizer *tok;

/* A byte-level BPE (id b = byte b, <|bos|> 256, <|eos|> 257) as tokenizer.json. */
static void write_tokenizer(void) {
    json_t *vocab = json_object(), *added = json_array();
    for (int b = 0; b < 256; b++) {
        bool direct = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        int cp = b;
        if (!direct) {
            cp = 256;
            for (int x = 0; x < b; x++) cp += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        }
        char piece[4] = {0};
        if (cp < 0x80) piece[0] = (char)cp;
        else piece[0] = (char)(0xC0 | (cp >> 6)), piece[1] = (char)(0x80 | (cp & 0x3F));
        json_object_set_new(vocab, piece, json_integer(b));
    }
    json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 256, "content", "<|bos|>", "special", 1));
    json_array_append_new(added, json_pack("{s:i,s:s,s:b}", "id", 257, "content", "<|eos|>", "special", 1));
    json_t *root = json_pack("{s:{s:s,s:o,s:[]},s:{s:s,s:b},s:o}", "model", "type", "BPE", "vocab", vocab, "merges",
                             "pre_tokenizer", "type", "ByteLevel", "use_regex", 1, "added_tokens", added);
    json_t *cfg = json_pack("{s:s,s:s}", "bos_token", "<|bos|>", "eos_token", "<|eos|>");
    char path[128];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (!root || !cfg || json_dump_file(root, path, 0)) abort();
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (json_dump_file(cfg, path, 0)) abort();
    json_decref(root);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (vks_tokenizer_load_hf_json(path, &tok)) abort();
}

static void write_checkpoint(void) {
    vks_model_config c = {.dim = 16, .hidden_dim = 24, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .vocab_size = 258,
                          .seq_len = 32, .head_dim = 8, .kv_dim = 8, .norm_eps = 1e-5f, .rope_theta = 10000.0f,
                          .rope_mode = VKS_ROPE_HALF, .shared_classifier = true};
    vks_param_layout *l = NULL;
    if (vks_param_layout_create(&c, false, &l)) abort();
    float *w = calloc(l->n_values, sizeof *w);
    if (!w) abort();
    for (size_t i = 0; i < l->n_values; i++) w[i] = (float)((i * 7) % 13) / 13.0f;
    vks_checkpoint_data d = {.layout = l, .weights = w, .adam_m = w, .adam_v = w, .bos_id = 256, .eos_id = 257,
                             .tokenizer_dir = dir, .state = {.step = 1}}; /* m = v < 1: moments one step can make */
    char path[128];
    snprintf(path, sizeof path, "%s/ck", dir);
    if (vks_checkpoint_save(path, &d)) abort();
    free(w);
    vks_param_layout_free(l);
}

/* Removes what init and the runs wrote (at exit). */
static void cleanup(void) {
    const char *files[] = {"ck/model.safetensors", "ck/config.json", "ck/tokenizer.json", "ck/tokenizer_config.json",
                           "ck/optimizer.safetensors", "ck/state.json", "ck", "tokenizer.json", "tokenizer_config.json",
                           "metrics.jsonl", "plot.svg", ""};
    char path[128];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        if (unlink(path) != 0) rmdir(path);
    }
    vks_tokenizer_free(tok);
}

static void init(void) {
    if (tok) return;
    snprintf(dir, sizeof dir, "/tmp/vkswarm-fuzz-train.XXXXXX");
    if (!mkdtemp(dir)) abort();
    atexit(cleanup);
    write_tokenizer();
    write_checkpoint();
}

static void fuzz_data(uint8_t mode, const uint8_t *data, size_t size) {
    vks_sft_options o = {.seq_len = 2 + (mode >> 3) * 2, .strict = (mode >> 1) & 1, .long_policy = (mode >> 2) % 3,
                         .max_line_bytes = 4096};
    vks_sft_data *d = NULL;
    if (vks_sft_data_parse((const char *)data, size, "fuzz.jsonl", tok, &o, &d)) return;
    vks_sft_stats s;
    vks_sft_data_stats(d, &s);
    vks_sft_batcher_options bo = {.max_tokens = s.max_len + (size > 0 ? data[0] % 16 : 0), .seed = size, .shuffle = true,
                                  .max_seqs = size > 1 ? data[1] % 4 : 0};
    vks_sft_batcher *b = NULL;
    if (vks_sft_batcher_create(d, &bo, &b) == VKS_OK) {
        vks_sft_position p = {.seed = 3, .epoch = size > 2 ? data[2] : 0, .index = size > 3 ? data[3] : 0};
        vks_sft_batcher_seek(b, &p);
        for (int i = 0; i < 8; i++) {
            const vks_sft_batch *x;
            vks_sft_batcher_next(b, &x);
        }
        vks_sft_batcher_free(b);
    }
    vks_sft_data_free(d);
}

static void put_file(const char *name, const uint8_t *data, size_t size) {
    char path[128];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, size, f) != size || fclose(f)) abort();
}

static void fuzz_state(const uint8_t *data, size_t size) {
    put_file("ck/state.json", data, size);
    char path[128];
    snprintf(path, sizeof path, "%s/ck", dir);
    vks_checkpoint *c = NULL;
    if (vks_checkpoint_load(path, &c) == VKS_OK) vks_checkpoint_free(c);
}

static void fuzz_metrics(const uint8_t *data, size_t size) {
    put_file("metrics.jsonl", data, size);
    char path[128], svg[128];
    snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
    snprintf(svg, sizeof svg, "%s/plot.svg", dir);
    const char *keys[] = {"loss", "lr", "step"};
    vks_metrics_plot(path, keys, 3, "fuzz", svg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (size == 0) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_data(data[0], data + 1, size - 1); break;
    case 1: fuzz_state(data + 1, size - 1); break;
    default: fuzz_metrics(data + 1, size - 1); break;
    }
    return 0;
}
