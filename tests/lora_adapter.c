/* lora_adapter MODEL DIR: writes a PEFT adapter (rank 4, alpha 16, every
 * target, B nonzero) for the model file MODEL into DIR; run by
 * mpi/test_pipeline.sh, which has no other way to make one. */
#include <stdio.h>
#include "vkswarm/vks_lora.h"

int main(int argc, char **argv) {
    vks_model *m = NULL;
    vks_lora_adapter *a = NULL;
    vks_lora_config lc = {.rank = 4, .alpha = 16, .targets = VKS_LORA_ALL_TARGETS};
    if (argc != 3 || vks_model_load(argv[1], &m) || vks_lora_adapter_create(&m->cfg, &lc, &a) ||
        vks_lora_adapter_init(a, 5) || vks_lora_adapter_set_base(a, m)) {
        fprintf(stderr, "lora_adapter: %s\n", argc != 3 ? "usage: lora_adapter MODEL DIR" : vks_last_error());
        return 2;
    }
    for (int l = 0; l < m->cfg.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            vks_lora_target_shape(&m->cfg, (vks_lora_target)t, &out, &in);
            float *B = vks_lora_adapter_B(a, l, (vks_lora_target)t);
            for (int64_t i = 0; i < out * lc.rank; i++) B[i] = 0.05f * (float)((i * 7919 + t) % 201 - 100) / 100.0f;
        }
    int rc = vks_lora_save_peft(argv[2], a);
    if (rc) fprintf(stderr, "lora_adapter: %s\n", vks_last_error());
    vks_lora_adapter_free(a);
    vks_model_free(m);
    return rc ? 1 : 0;
}
