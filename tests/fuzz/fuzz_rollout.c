/* libFuzzer target: rollout files and TOPLOC proofs on hostile bytes.
 * The first input byte picks what the rest is:
 *   even: a rollout file (JSONL), parsed; its samples are then verified on the
 *         CPU against a tiny random model (structure, proofs, sampler replay;
 *         with bit 1 set, against a known task too)
 *   odd:  chunk proofs, parsed and checked against fixed rows
 * Parses may fail (with a one-line message); verdicts may reject; nothing may
 * crash, leak or hang. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "vkswarm/vks_toploc.h"

static vks_model *model;
static vks_verify_options opts;

static void init(void) {
    if (model) return;
    vks_model_config c = {.dim = 16, .hidden_dim = 24, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1,
                          .vocab_size = 32, .seq_len = 24};
    if (vks_model_random(&c, 5, &model)) abort();
    vks_verify_options_default(&opts);
    if (vks_model_hash(model, opts.model_hash)) abort();
    opts.stop_ids[0] = 1;
    opts.stop_ids[1] = 2;
    opts.n_stop = 2;
}

/* A small task (bit 1 of the first byte turns it on): seq 0 was given [1 5], seq 1 [1]. */
static const int32_t task0[] = {1, 5}, task1[] = {1};
static const int32_t *const task_prompts[] = {task0, task1};
static const int task_lens[] = {2, 1};

static void fuzz_file(const uint8_t *data, size_t size, bool with_task) {
    vks_rollout_file f;
    if (vks_rollout_read_mem((const char *)data, size, "fuzz", &f) != VKS_OK) return;
    vks_verdict *v = calloc((size_t)f.n_samples + 1, sizeof *v);
    /* make some samples reach the model: the hash is the one thing a fuzzer cannot guess */
    for (int i = 0; i < f.n_samples; i++)
        if (f.samples[i].model_hash[0] == 0) memcpy(f.samples[i].model_hash, opts.model_hash, 32);
    vks_verify_options o = opts;
    if (with_task) {
        o.task_prompts = task_prompts;
        o.task_prompt_lens = task_lens;
        o.n_task_prompts = 2;
    }
    if (v) vks_verify_batch_cpu(model, &o, f.samples, f.n_samples, v);
    free(v);
    vks_rollout_file_free(&f);
}

static void fuzz_proofs(const uint8_t *data, size_t size) {
    float rows[3 * 16];
    for (int i = 0; i < 3 * 16; i++) rows[i] = (float)((i * 37) % 11) - 5.0f;
    for (size_t off = 0; off < size; off += VKS_TOPLOC_PROOF_BYTES) {
        size_t len = size - off < VKS_TOPLOC_PROOF_BYTES ? size - off : VKS_TOPLOC_PROOF_BYTES;
        vks_toploc_thresholds th;
        vks_toploc_thresholds_default(&th);
        bool ok;
        vks_toploc_stats st;
        char why[160];
        vks_toploc_check_chunk(data + off, len, rows, 3, 16, &th, &ok, &st, why, sizeof why);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    init();
    if (size == 0) return 0;
    if (data[0] & 1) fuzz_proofs(data + 1, size - 1);
    else fuzz_file(data + 1, size - 1, (data[0] & 2) != 0);
    return 0;
}
