/* model_internal.h: helpers shared by the model readers/builders and the CPU
 * forward. Not a public API. */
#ifndef VKS_MODEL_INTERNAL_H
#define VKS_MODEL_INTERNAL_H
#include "vkswarm/vks_model.h"

/* Float counts of the llama2.c layout (after the 28-byte header). Per-layer
 * entries are for one layer; `total` covers the whole body, classifier
 * included only when unshared. */
typedef struct {
    size_t emb, norm, wq, wkv, wo, ffn, freq, cls, total;
} vks_l2c_sizes;

/* Fills *s; false if any product or sum overflows size_t. */
bool vks_l2c_sizes_compute(const vks_model_config *c, vks_l2c_sizes *s);
/* Points every tensor of m (config already set and checked) into `body`, an f32
 * array in llama2.c layout. Allocates m->layers. Returns VKS_OK or VKS_ERR_NOMEM. */
int vks_model_bind_llama2c(vks_model *m, const float *body);
/* Checks that every tensor of m has data, a known dtype and the shape the
 * config implies. Errors (VKS_ERR_ARG) name `what`. */
int vks_model_check_tensors(const vks_model *m, const char *what);
/* Allocates a zeroed model struct; NULL (with error set) on failure. */
vks_model *vks_model_alloc(void);

#endif
