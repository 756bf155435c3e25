/* libFuzzer target: the safetensors header reader. */
#include "vkswarm/vks_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vks_st_file *f = NULL;
    if (vks_st_open_memory(data, size, "fuzz", &f) != VKS_OK) return 0;
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < vks_st_n_tensors(f); i++) {
        const vks_st_tensor *t = vks_st_tensor_at(f, i);
        if (vks_st_find(f, t->name) != t) __builtin_trap();
        if (t->size) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->size - 1];
    }
    (void)sink;
    vks_st_close(f);
    return 0;
}
