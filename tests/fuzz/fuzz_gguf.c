/* libFuzzer target: the GGUF reader and every getter on whatever it accepts. */
#include "vkswarm/vks_gguf.h"

#include <string.h>

static void walk_key(const vks_gguf *g, int64_t i) {
    const char *key = vks_gguf_key(g, i), *s;
    size_t len;
    int64_t v;
    double d;
    bool b;
    vks_gguf_type et;
    uint64_t n;
    (void)vks_gguf_get_i64(g, key, &v);
    (void)vks_gguf_get_f64(g, key, &d);
    (void)vks_gguf_get_bool(g, key, &b);
    (void)vks_gguf_get_str(g, key, &s, &len);
    if (vks_gguf_get_arr_info(g, key, &et, &n) != VKS_OK) return;
    if (et == VKS_GGUF_STRING) {
        for (uint64_t k = 0; k < n && k < 64; k++) (void)vks_gguf_get_arr_str(g, key, k, &s, &len);
        return;
    }
    float f[64];
    int32_t x[64];
    if (n <= 64) {
        (void)vks_gguf_get_arr_f32(g, key, f, n);
        (void)vks_gguf_get_arr_i32(g, key, x, n);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vks_gguf *g = NULL;
    if (vks_gguf_open_memory(data, size, "fuzz", &g) != VKS_OK) return 0;
    for (int64_t i = 0; i < vks_gguf_n_kv(g); i++) walk_key(g, i);
    volatile uint8_t sink = 0;
    for (int64_t i = 0; i < vks_gguf_n_tensors(g); i++) {
        const vks_gguf_tensor *t = vks_gguf_tensor_at(g, i);
        if (vks_gguf_find_tensor(g, t->name) != t) __builtin_trap();
        if (t->size) sink ^= ((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->size - 1];
    }
    (void)sink;
    vks_gguf_close(g);
    return 0;
}
