/* engine_lora.c: a LoRA adapter beside the engine's weights (issue 25). The
 * adapter's matrices of the engine's layer range live in their own device
 * buffers, so swapping adapters never touches the base; the forward adds
 * y += B_s (A x) after each targeted product, unmerged, whatever W's type
 * (B_s = scale * B, rounded to f32 once on upload). */
#include <stdlib.h>
#include <string.h>
#include "engine_internal.h"

static vks_binding bind(vks_buffer *b) { return (vks_binding){.buf = b}; }

void vks_engine_lora_free(vks_engine *e) {
    dev_lora *d = &e->lora;
    for (int l = 0; d->layers && l < e->w.n_layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            vks_buffer_destroy(d->layers[l].A[t]);
            vks_buffer_destroy(d->layers[l].B[t]);
        }
    free(d->layers);
    vks_buffer_destroy(d->z);
    *d = (dev_lora){0};
}

/* The device buffers for an adapter of this rank and these targets; the
 * recordings bind the old ones, so they go. */
static int lora_alloc(vks_engine *e, int rank, uint32_t targets) {
    vks_engine_drop_recordings(e);
    vks_engine_lora_free(e);
    dev_lora *d = &e->lora;
    if (!(d->layers = calloc((size_t)e->w.n_layers, sizeof *d->layers)))
        return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: out of host memory");
    d->rank = rank;
    d->targets = targets;
    int rc = vks_buffer_create(e->gpu, (size_t)e->opt.max_rows * (size_t)rank * 4, &d->z);
    for (int l = 0; !rc && l < e->w.n_layers; l++)
        for (int t = 0; !rc && t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t out, in;
            if (!(targets & (1u << t))) continue;
            vks_lora_target_shape(&e->cfg, (vks_lora_target)t, &out, &in);
            rc = vks_buffer_create(e->gpu, (size_t)rank * (size_t)in * 4, &d->layers[l].A[t]);
            if (!rc) rc = vks_buffer_create(e->gpu, (size_t)out * (size_t)rank * 4, &d->layers[l].B[t]);
        }
    return rc;
}

/* Uploads layer l's A and scale * B of target t (a ranks-sized host copy of B). */
static int lora_upload(vks_engine *e, const vks_lora_adapter *a, int l, vks_lora_target t, float scale) {
    int64_t out, in;
    vks_lora_target_shape(&e->cfg, t, &out, &in);
    int layer = e->opt.layer_begin + l, r = e->lora.rank;
    size_t nb = (size_t)out * (size_t)r;
    float *bs = malloc(nb * sizeof *bs);
    if (!bs) return vks_set_error(VKS_ERR_NOMEM, "LoRA adapter: out of host memory");
    const float *B = vks_lora_adapter_B(a, layer, t);
    for (size_t i = 0; i < nb; i++) bs[i] = scale * B[i];
    int rc = vks_buffer_upload(e->lora.layers[l].A[t], 0, vks_lora_adapter_A(a, layer, t), (size_t)r * (size_t)in * 4);
    if (!rc) rc = vks_buffer_upload(e->lora.layers[l].B[t], 0, bs, nb * 4);
    free(bs);
    return rc;
}

int vks_engine_set_lora(vks_engine *e, const vks_lora_adapter *a) {
    if (!e) return vks_set_error(VKS_ERR_ARG, "vks_engine_set_lora: NULL engine");
    if (!a) {
        if (e->lora.layers) vks_engine_drop_recordings(e);
        vks_engine_lora_free(e);
        return VKS_OK;
    }
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    float scale = (float)vks_lora_scale(lc->alpha, lc->rank);
    int rc = vks_lora_adapter_check_shape(a, &e->cfg, "engine");
    /* the same shape keeps its buffers (and the recordings that bind them) */
    if (!rc && (!e->lora.layers || e->lora.rank != lc->rank || e->lora.targets != lc->targets))
        rc = lora_alloc(e, lc->rank, lc->targets);
    for (int l = 0; !rc && l < e->w.n_layers; l++)
        for (int t = 0; !rc && t < VKS_LORA_TARGET_COUNT; t++)
            if (lc->targets & (1u << t)) rc = lora_upload(e, a, l, (vks_lora_target)t, scale);
    if (rc) { /* no half-uploaded adapter stays */
        vks_engine_drop_recordings(e);
        vks_engine_lora_free(e);
    }
    return rc;
}

bool vks_engine_has_lora(const vks_engine *e) { return e && e->lora.layers; }

int vks_engine_record_lora(vks_engine *e, vks_cmd *c, int l, vks_lora_target t, vks_buffer *x, vks_buffer *y,
                           uint32_t M, uint32_t ldy) {
    const dev_lora *d = &e->lora;
    if (!d->layers || !(d->targets & (1u << t))) return VKS_OK;
    int64_t out, in;
    vks_lora_target_shape(&e->cfg, t, &out, &in);
    uint32_t r = (uint32_t)d->rank;
    int rc = vks_op_matmul_kind(e->ops, c, bind(x), bind(d->layers[l].A[t]), VKS_DTYPE_F32, bind(d->z), M, r,
                                (uint32_t)in, r, 0, false, e->matmul_kind);
    if (!rc)
        rc = vks_op_matmul_kind(e->ops, c, bind(d->z), bind(d->layers[l].B[t]), VKS_DTYPE_F32, bind(y), M,
                                (uint32_t)out, r, ldy, 0, true, e->matmul_kind);
    return rc;
}
