/* libFuzzer target: Hugging Face config.json parsing and validation. */
#include "vkswarm/vks_safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    vks_hf_config c;
    (void)vks_hf_config_parse((const char *)data, size, "fuzz", &c);
    return 0;
}
