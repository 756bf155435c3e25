/* lora.c: the adapters' targets, shapes, scale and PEFT initialisation (vks_lora.h). */
#include "vkswarm/vks_lora.h"

#include <math.h>
#include <string.h>
#include "vkswarm/vks_philox.h"

static const char *const target_names[VKS_LORA_TARGET_COUNT] = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                                "gate_proj", "up_proj", "down_proj"};

const char *vks_lora_target_name(vks_lora_target t) {
    return (unsigned)t < VKS_LORA_TARGET_COUNT ? target_names[t] : NULL;
}

int vks_lora_target_shape(const vks_model_config *c, vks_lora_target t, int64_t *out, int64_t *in) {
    if (!c || !out || !in || (unsigned)t >= VKS_LORA_TARGET_COUNT)
        return vks_set_error(VKS_ERR_ARG, "vks_lora_target_shape: bad arguments");
    int64_t dim = c->dim, q = (int64_t)c->n_heads * c->head_dim, kv = c->kv_dim, hidden = c->hidden_dim;
    const int64_t shapes[VKS_LORA_TARGET_COUNT][2] = {
        {q, dim}, {kv, dim}, {kv, dim}, {dim, q}, {hidden, dim}, {hidden, dim}, {dim, hidden},
    };
    *out = shapes[t][0];
    *in = shapes[t][1];
    return VKS_OK;
}

int64_t vks_lora_param_count(const vks_model_config *c, int rank, uint32_t targets) {
    if (!c || rank < 1 || !targets || (targets & ~VKS_LORA_ALL_TARGETS)) return -1;
    int64_t per_layer = 0;
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
        int64_t out, in;
        if (!(targets & (1u << t))) continue;
        vks_lora_target_shape(c, (vks_lora_target)t, &out, &in);
        per_layer += (int64_t)rank * (out + in);
    }
    return per_layer * c->n_layers;
}

int vks_lora_check(const vks_model_config *c, int rank, uint32_t targets, const char *what) {
    if (!c || !targets || (targets & ~VKS_LORA_ALL_TARGETS))
        return vks_set_error(VKS_ERR_ARG, "%s: LoRA targets 0x%x are not a set of q, k, v, o, gate, up, down", what,
                             targets);
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
        int64_t out, in;
        if (!(targets & (1u << t)) || vks_lora_target_shape(c, (vks_lora_target)t, &out, &in)) continue;
        int64_t side = out < in ? out : in;
        if (rank < 1 || rank > side)
            return vks_set_error(VKS_ERR_ARG, "%s: LoRA rank %d is outside 1..%lld (%s is %lld x %lld)", what, rank,
                                 (long long)side, target_names[t], (long long)out, (long long)in);
    }
    return VKS_OK;
}

double vks_lora_scale(double alpha, int rank) { return rank > 0 ? alpha / rank : 0.0; }

uint32_t vks_lora_stream(int layer, vks_lora_target t) {
    return (uint32_t)layer * VKS_LORA_TARGET_COUNT + (uint32_t)t;
}

int vks_lora_init(float *A, float *B, int rank, int64_t in, int64_t out, uint64_t seed, uint32_t stream) {
    if (!A || !B || rank < 1 || in < 1 || out < 1 || (uint64_t)rank * (uint64_t)in > UINT32_MAX ||
        (uint64_t)rank * (uint64_t)out > UINT32_MAX)
        return vks_set_error(VKS_ERR_ARG, "vks_lora_init: bad sizes (rank %d, in %lld, out %lld)", rank,
                             (long long)in, (long long)out);
    /* kaiming_uniform_(a=sqrt(5)): gain sqrt(2 / (1 + 5)), bound gain * sqrt(3 / fan_in) = 1 / sqrt(in) */
    double bound = 1.0 / sqrt((double)in);
    uint32_t n = (uint32_t)((uint64_t)rank * (uint64_t)in);
    for (uint32_t i = 0; i < n; i++) {
        double u = vks_rng_uniform(vks_philox_u32(seed, stream, 0, i));
        A[i] = (float)((2.0 * u - 1.0) * bound);
    }
    memset(B, 0, (size_t)rank * (size_t)out * sizeof *B);
    return VKS_OK;
}
