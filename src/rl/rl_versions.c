/* rl_versions.c: the RL trainer's weights of its last few versions
 * (rl_internal.h), kept so that a completion sampled by an older version can
 * have its log-probabilities checked against the weights that sampled it. */
#include <stdlib.h>
#include <string.h>
#include "rl_internal.h"

int vks_rl_versions_init(vks_rl_versions *v, int cap, size_t n) {
    memset(v, 0, sizeof *v);
    if (cap < 0 || (cap && !n)) return vks_set_error(VKS_ERR_ARG, "rl: %d versions of %zu values", cap, n);
    if (!cap) return VKS_OK;
    v->step = malloc(sizeof *v->step * (size_t)cap);
    v->values = calloc((size_t)cap, sizeof *v->values);
    if (!v->step || !v->values) {
        free(v->step), free(v->values);
        memset(v, 0, sizeof *v);
        return vks_set_error(VKS_ERR_NOMEM, "rl: out of host memory");
    }
    v->cap = cap, v->n = n;
    for (int i = 0; i < cap; i++) v->step[i] = -1;
    return VKS_OK;
}

void vks_rl_versions_free(vks_rl_versions *v) {
    for (int i = 0; v->values && i < v->cap; i++) free(v->values[i]);
    free(v->values), free(v->step);
    memset(v, 0, sizeof *v);
}

static int slot_of(const vks_rl_versions *v, int64_t step) {
    for (int i = 0; step >= 0 && i < v->cap; i++)
        if (v->step[i] == step) return i;
    return -1;
}

float *vks_rl_versions_put(vks_rl_versions *v, int64_t step) {
    if (!v->cap || step < 0) return NULL;
    int at = slot_of(v, step);
    if (at < 0) { /* an empty slot (-1), else the oldest version's */
        at = 0;
        for (int i = 1; i < v->cap; i++)
            if (v->step[i] < v->step[at]) at = i;
    }
    if (!v->values[at] && !(v->values[at] = malloc(sizeof *v->values[at] * v->n))) return NULL;
    v->step[at] = step;
    return v->values[at];
}

const float *vks_rl_versions_get(const vks_rl_versions *v, int64_t step) {
    int at = slot_of(v, step);
    return at < 0 ? NULL : v->values[at];
}

void vks_rl_versions_forget(vks_rl_versions *v, int64_t step) {
    int at = slot_of(v, step);
    if (at >= 0) v->step[at] = -1;
}
