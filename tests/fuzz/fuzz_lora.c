/* libFuzzer target: LoRA adapter files (vks_lora_load) on hostile bytes for a
 * small llama base. The first byte picks what the rest is:
 *   x % 3 == 0: a PEFT adapter_config.json (beside a valid adapter_model.safetensors);
 *   x % 3 == 1: a PEFT adapter_model.safetensors (beside a valid adapter_config.json);
 *   x % 3 == 2: a GGUF LoRA adapter.
 * Loads may fail (with a one-line message); nothing may crash, leak or hang.
 * With VKSWARM_FUZZ_SEEDS=DIR set, initialisation writes the three valid
 * files, each behind its selector byte, into DIR as seeds (tools/fuzz). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "vkswarm/vks_lora.h"

static char dir[64];
static vks_model *base;

static void path_of(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", dir, name); }

static void write_file(const char *path, uint8_t selector, const uint8_t *data, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) abort();
    if (selector != 0xff && fputc(selector, f) == EOF) abort();
    if (size && fwrite(data, 1, size, f) != size) abort();
    if (fclose(f)) abort();
}

static void copy_file(const char *from, const char *to, uint8_t selector) {
    FILE *f = fopen(from, "rb");
    if (!f) abort();
    static uint8_t buf[1 << 20];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    write_file(to, selector, buf, n);
}

/* A valid PEFT directory in dir/peft (then copied to dir/cfg and dir/st) and dir/good.gguf. */
static void write_valid(void) {
    vks_lora_config lc = {2, 4.0, VKS_LORA_ALL_TARGETS};
    vks_lora_adapter *a = NULL;
    char p[128], q[128];
    if (vks_lora_adapter_create(&base->cfg, &lc, &a) || vks_lora_adapter_init(a, 1) ||
        vks_lora_adapter_set_base(a, base))
        abort();
    vks_lora_adapter_B(a, 0, VKS_LORA_Q)[3] = 0.5f;
    path_of(p, sizeof p, "peft");
    if (vks_lora_save_peft(p, a)) abort();
    path_of(p, sizeof p, "good.gguf");
    if (vks_lora_save_gguf(p, a)) abort();
    vks_lora_adapter_free(a);
    const char *sub[2] = {"cfg", "st"};
    for (int i = 0; i < 2; i++) {
        path_of(p, sizeof p, sub[i]);
        if (mkdir(p, 0700)) abort();
        const char *other = i == 0 ? "adapter_model.safetensors" : "adapter_config.json";
        snprintf(p, sizeof p, "%s/peft/%s", dir, other);
        snprintf(q, sizeof q, "%s/%s/%s", dir, sub[i], other);
        copy_file(p, q, 0xff);
    }
}

static void write_seeds(const char *to) {
    const char *from[3] = {"peft/adapter_config.json", "peft/adapter_model.safetensors", "good.gguf"};
    for (int i = 0; i < 3; i++) {
        char p[128], q[512];
        path_of(p, sizeof p, from[i]);
        snprintf(q, sizeof q, "%s/lora_seed%d", to, i);
        copy_file(p, q, (uint8_t)i);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    snprintf(dir, sizeof dir, "/tmp/vkswarm-fuzz-lora.XXXXXX");
    if (!mkdtemp(dir)) abort();
    vks_model_config c = {.dim = 32, .hidden_dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                          .vocab_size = 64, .seq_len = 16};
    if (vks_model_random_arch(&c, "llama", 1, &base)) abort();
    write_valid();
    const char *seeds = getenv("VKSWARM_FUZZ_SEEDS");
    if (seeds) write_seeds(seeds);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    static const char *const targets[3] = {"cfg/adapter_config.json", "st/adapter_model.safetensors", "x.gguf"};
    static const char *const load[3] = {"cfg", "st", "x.gguf"};
    int which = data[0] % 3;
    char p[128];
    path_of(p, sizeof p, targets[which]);
    write_file(p, 0xff, data + 1, size - 1);
    path_of(p, sizeof p, load[which]);
    vks_lora_adapter *a = NULL;
    if (vks_lora_load(p, base, &a) == VKS_OK && !a) abort();
    if (a && !vks_lora_adapter_A(a, 0, (vks_lora_target)__builtin_ctz(vks_lora_adapter_config(a)->targets))) abort();
    vks_lora_adapter_free(a);
    return 0;
}
