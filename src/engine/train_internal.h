/* train_internal.h: what the trainer's files share (not a public interface).
 * train_params.c owns the parameter sets; the forward, backward and
 * optimizer files record into the same vks_trainer. */
#ifndef VKS_TRAIN_INTERNAL_H
#define VKS_TRAIN_INTERNAL_H
#include "vkswarm/vks_ops.h"
#include "vkswarm/vks_train.h"

/* One tensor of a set: rows * cols f32 on the device. */
typedef struct {
    vks_train_tensor_info info;
    vks_buffer *buf[VKS_SET_COUNT];
} train_tensor;

/* A layer's tensors as indices into vks_trainer.tensors (bias: -1 when absent). */
typedef struct {
    int attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w1, w2, w3;
} train_layer;

struct vks_trainer {
    vks_gpu *gpu;
    vks_ops *ops;
    vks_model_config cfg;
    vks_trainer_options opt;
    int bos_id, eos_id;
    char arch[32];
    bool has_bias;
    train_tensor *tensors;
    int n_tensors;
    int tok_emb, final_norm, classifier; /* classifier == tok_emb when tied */
    train_layer *layers;
};

/* train_params.c */
int vks_train_params_create(vks_trainer *t, const vks_model *m);
void vks_train_params_free(vks_trainer *t);
/* The binding of tensor i of a set. */
vks_binding vks_train_binding(const vks_trainer *t, vks_param_kind set, int i);
#endif
