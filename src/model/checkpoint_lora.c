/* checkpoint_lora.c: the files of a LoRA run's checkpoint (vks_checkpoint.h):
 * the adapter in PEFT's layout (lora_peft.c) and the Adam moments of its
 * matrices in optimizer.safetensors; checkpoint.c adds state.json, the
 * manifest and the atomic placement, as for a full model. */
#include "model/checkpoint_internal.h"
#include "model/model_internal.h"
#include "vkswarm/vks_safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One matrix of the adapter in its order: layer l, target t, A or B; last,
 * the final norm where the adapter carries one (layer -1, which 'N'). */
typedef struct {
    int layer;
    vks_lora_target target;
    char which; /* 'A' or 'B' */
    int64_t rows, cols;
    size_t offset; /* in a moment block */
} lora_matrix;

/* The adapter's matrices in order; *n of them (the caller frees). */
static int list_matrices(const vks_lora_adapter *a, lora_matrix **out, int *n, size_t *n_values) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int layers = vks_lora_adapter_n_layers(a), per = __builtin_popcount(lc->targets);
    lora_matrix *m = calloc((size_t)(2 * per * layers + 1), sizeof *m);
    if (!m) return vks_set_error(VKS_ERR_NOMEM, "checkpoint: out of memory");
    int k = 0;
    size_t at = 0;
    for (int l = 0; l < layers; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++) {
            int64_t o, in;
            if (!(lc->targets & (1u << t))) continue;
            vks_lora_target_shape(c, (vks_lora_target)t, &o, &in);
            for (int b = 0; b < 2; b++, k++) {
                m[k] = (lora_matrix){l, (vks_lora_target)t, b ? 'B' : 'A', b ? o : lc->rank, b ? lc->rank : in, at};
                at += (size_t)(m[k].rows * m[k].cols);
            }
        }
    if (vks_lora_adapter_norm(a)) {
        m[k++] = (lora_matrix){-1, VKS_LORA_Q, 'N', 1, c->dim, at};
        at += (size_t)c->dim;
    }
    *out = m;
    *n = k;
    *n_values = at;
    return VKS_OK;
}

/* "exp_avg.layers.3.q_proj.lora_A" (second: "exp_avg_sq..."); the norm's "exp_avg.norm" */
static void moment_name(const lora_matrix *m, bool second, char *buf, size_t cap) {
    if (m->which == 'N') {
        snprintf(buf, cap, "%s.norm", second ? "exp_avg_sq" : "exp_avg");
        return;
    }
    snprintf(buf, cap, "%s.layers.%d.%s.lora_%c", second ? "exp_avg_sq" : "exp_avg", m->layer,
             vks_lora_target_name(m->target), m->which);
}

int vks_ckpt_lora_check(const char *dir, const vks_checkpoint_data *c) {
    if (!c->adam_m != !c->adam_v || c->layout || c->weights)
        return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_save: a LoRA checkpoint takes the adapter and both moments");
    if (c->state.step < 0 || c->state.tokens_seen < 0 || c->state.data.epoch < 0 || c->state.data.index < 0)
        return vks_set_error(VKS_ERR_ARG, "%s: negative step, token count or data position", dir);
    lora_matrix *m;
    int n;
    size_t n_values;
    int rc = list_matrices(c->lora, &m, &n, &n_values);
    for (int i = 0; rc == VKS_OK && i < n; i++) {
        const float *x = m[i].which == 'N'   ? vks_lora_adapter_norm(c->lora)
                         : m[i].which == 'A' ? vks_lora_adapter_A(c->lora, m[i].layer, m[i].target)
                                             : vks_lora_adapter_B(c->lora, m[i].layer, m[i].target);
        const float *blocks[3] = {x, c->adam_m ? c->adam_m + m[i].offset : NULL,
                                  c->adam_v ? c->adam_v + m[i].offset : NULL};
        for (int b = 0; b < 3 && rc == VKS_OK; b++)
            for (int64_t k = 0; blocks[b] && k < m[i].rows * m[i].cols; k++)
                if (!isfinite(blocks[b][k])) {
                    char name[96];
                    moment_name(&m[i], false, name, sizeof name);
                    rc = vks_set_error(VKS_ERR_ARG, "%s: the %s of %s hold NaN or Inf", dir,
                                       b == 0 ? "values" : b == 1 ? "Adam m" : "Adam v", name + strlen("exp_avg."));
                    break;
                }
    }
    free(m);
    return rc;
}

static int write_moments(const char *path, const vks_checkpoint_data *c, const lora_matrix *m, int n) {
    vks_st_write_tensor *t = calloc((size_t)n * 2, sizeof *t);
    char (*names)[96] = calloc((size_t)n * 2, sizeof *names);
    int rc = t && names ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; i < n && rc == VKS_OK; i++)
        for (int k = 0; k < 2; k++) {
            vks_st_write_tensor *w = &t[2 * i + k];
            moment_name(&m[i], k, names[2 * i + k], sizeof names[0]);
            w->name = names[2 * i + k];
            w->dtype = VKS_DTYPE_F32;
            w->n_dims = 2;
            w->shape[0] = m[i].rows;
            w->shape[1] = m[i].cols;
            w->data = (k ? c->adam_v : c->adam_m) + m[i].offset;
        }
    vks_outfile o;
    if (rc == VKS_OK) rc = vks_outfile_open(&o, path, 0666);
    if (rc == VKS_OK) {
        rc = vks_st_write_stream(o.f, path, t, (size_t)n * 2);
        if (rc == VKS_OK) rc = vks_outfile_commit(&o);
        else vks_outfile_abort(&o);
    }
    free(names);
    free(t);
    return rc;
}

int vks_ckpt_lora_write(const char *tmp, const vks_checkpoint_data *c) {
    int rc = vks_lora_save_peft(tmp, c->lora);
    if (rc != VKS_OK || !c->adam_m) return rc;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/optimizer.safetensors", tmp) >= sizeof path)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", tmp);
    lora_matrix *m;
    int n;
    size_t n_values;
    rc = list_matrices(c->lora, &m, &n, &n_values);
    if (rc == VKS_OK) rc = write_moments(path, c, m, n);
    free(m);
    return rc;
}

/* One moment: f32 of the matrix's shape, finite (and >= 0 for v). */
static int load_moment(const vks_st_file *f, const char *path, const lora_matrix *m, bool second, float *dst) {
    char name[96];
    moment_name(m, second, name, sizeof name);
    const vks_st_tensor *st = vks_st_find(f, name);
    if (!st) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", path, name);
    if (st->dtype != VKS_DTYPE_F32 || st->n_dims != 2 || st->shape[0] != m->rows || st->shape[1] != m->cols)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not f32 [%lld, %lld]", path, name, (long long)m->rows,
                             (long long)m->cols);
    size_t count = (size_t)(m->rows * m->cols);
    memcpy(dst, st->data, count * sizeof(float));
    for (size_t i = 0; i < count; i++)
        if (!isfinite(dst[i]) || (second && dst[i] < 0))
            return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s holds %s", path, name,
                                 isfinite(dst[i]) ? "a negative second moment" : "NaN or Inf");
    return VKS_OK;
}

/* |m| <= K sqrt(v) + floor, as vks_checkpoint_load checks a model's moments. */
static int check_sizes(const vks_checkpoint *c, const char *path, const lora_matrix *m, int n) {
    double k = vks_ckpt_moment_bound(&c->state) * (1 + 1e-3);
    if (!(k < INFINITY)) return VKS_OK;
    for (int i = 0; i < n; i++)
        for (size_t j = m[i].offset; j < m[i].offset + (size_t)(m[i].rows * m[i].cols); j++)
            if (fabs((double)c->adam_m[j]) > k * sqrt((double)c->adam_v[j]) + VKS_CKPT_MOMENT_FLOOR) {
                char name[96];
                moment_name(&m[i], false, name, sizeof name);
                return vks_set_error(VKS_ERR_FORMAT, "%s: the first moment of %s is %.3g where %lld Adam steps allow "
                                     "at most %.3g (corrupt)", path, name + strlen("exp_avg."), (double)c->adam_m[j],
                                     (long long)c->state.step, k * sqrt((double)c->adam_v[j]) + VKS_CKPT_MOMENT_FLOOR);
            }
    return VKS_OK;
}

static int load_moments(vks_checkpoint *c, const char *dir) {
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/optimizer.safetensors", dir) >= sizeof path)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    lora_matrix *m = NULL;
    int n = 0;
    size_t n_values = 0;
    vks_st_file *f = NULL;
    int rc = list_matrices(c->lora, &m, &n, &n_values);
    if (rc == VKS_OK) rc = vks_st_open(path, &f);
    if (rc == VKS_OK && vks_st_n_tensors(f) != 2 * (int64_t)n)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: %lld tensors, the adapter needs %d", path,
                           (long long)vks_st_n_tensors(f), 2 * n);
    if (rc == VKS_OK) {
        c->adam_m = malloc(n_values * sizeof(float));
        c->adam_v = malloc(n_values * sizeof(float));
        if (!c->adam_m || !c->adam_v) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int i = 0; i < n && rc == VKS_OK; i++) {
        rc = load_moment(f, path, &m[i], false, c->adam_m + m[i].offset);
        if (rc == VKS_OK) rc = load_moment(f, path, &m[i], true, c->adam_v + m[i].offset);
    }
    vks_st_close(f);
    if (rc == VKS_OK) rc = check_sizes(c, path, m, n);
    free(m);
    return rc;
}

int vks_ckpt_lora_load(vks_checkpoint *c, const char *dir, const vks_model *base, bool has_optimizer) {
    int rc = vks_lora_load(dir, base, &c->lora);
    if (rc == VKS_OK && has_optimizer) rc = load_moments(c, dir);
    if (rc == VKS_OK) {
        snprintf(c->arch, sizeof c->arch, "%s", base->arch);
        c->bos_id = base->bos_id;
        c->eos_id = base->eos_id;
    }
    return rc;
}
