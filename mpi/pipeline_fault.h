/* pipeline_fault.h: a cheating pipeline stage, for tests only. Compiled in
 * only with VKS_TEST_FAULTS, which only the test binary vkswarm-faulty
 * (tests/meson.build) defines; the shipped vkswarm has none of it.
 *
 * VKSWARM_TEST_FAULT=RANK:KIND makes the stage on world rank RANK cheat (in
 * the pipeline command stage s is rank s; in an RL group the stage's rank):
 *   skip-layer  its engine runs its layers but the first ([begin+1, end)); a middle stage of
 *               one layer hands on the rows it received
 *   perturb     it multiplies every activation it hands on by 1 + 0.01 u, u uniform in [-1, 1]
 *   f16         its weights are f16 on the device, while the run claims f32 */
#ifndef VKS_PIPELINE_FAULT_H
#define VKS_PIPELINE_FAULT_H
#ifdef VKS_TEST_FAULTS
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "vkswarm/vks_engine.h"

enum { VKS_FAULT_NONE, VKS_FAULT_SKIP_LAYER, VKS_FAULT_PERTURB, VKS_FAULT_F16 };

static inline int vks_test_fault(int rank) {
    const char *env = getenv("VKSWARM_TEST_FAULT");
    int r;
    char kind[32];
    if (!env || sscanf(env, "%d:%31s", &r, kind) != 2 || r != rank) return VKS_FAULT_NONE;
    if (!strcmp(kind, "skip-layer")) return VKS_FAULT_SKIP_LAYER;
    if (!strcmp(kind, "perturb")) return VKS_FAULT_PERTURB;
    if (!strcmp(kind, "f16")) return VKS_FAULT_F16;
    return VKS_FAULT_NONE;
}

/* The cheating stage's engine options. */
static inline void vks_test_fault_engine(vks_engine_options *eo, int rank) {
    int f = vks_test_fault(rank);
    if (f == VKS_FAULT_SKIP_LAYER && eo->layer_begin > 0 && eo->layer_end - eo->layer_begin > 1) eo->layer_begin++;
    if (f == VKS_FAULT_F16) eo->dtype = VKS_DTYPE_F16, eo->keep_file_dtype = false;
}

/* The cheating stage's activations x (n floats) before it sends them: noise
 * (xorshift), or the input rows handed on when it holds one layer. */
static inline void vks_test_fault_output(int fault, float *x, const float *in, size_t n, bool one_layer,
                                         uint64_t *state) {
    if (fault == VKS_FAULT_SKIP_LAYER && one_layer && in) memcpy(x, in, n * sizeof *x);
    if (fault != VKS_FAULT_PERTURB) return;
    for (size_t i = 0; i < n; i++) {
        *state ^= *state << 13, *state ^= *state >> 7, *state ^= *state << 17;
        x[i] *= 1.0f + 0.01f * ((float)(*state % 2001) / 1000.0f - 1.0f);
    }
}
#endif
#endif
