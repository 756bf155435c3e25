/* lora_gguf.c: llama.cpp's GGUF LoRA adapters (convert_lora_to_gguf.py writes
 * them, llama-adapter.cpp reads them): general.type "adapter", adapter.type
 * "lora", adapter.lora.alpha (f32), general.architecture = the base's;
 * tensors "blk.N.<base tensor>.lora_a" (ne = [in, rank]) and ".lora_b"
 * (ne = [rank, out]), so in memory A is [rank, in] and B [out, rank] as here.
 * B of q and k has its rows in the RoPE order of that architecture's GGUF
 * models (llama: adjacent pairs, as llama.cpp's converter permutes wq/wk),
 * moved to and from the base's own order like the GGUF model reader/writer. */
#include "model/lora_internal.h"
#include "vkswarm/vks_gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HASH_KEY "vkswarm.base_model_hash"
#define MAX_NAME 128

static int gguf_rope_mode(const char *arch) {
    const vks_arch *a = vks_arch_find(arch);
    return a ? a->gguf_rope_mode : VKS_ROPE_ADJACENT;
}

/* ---- writing ---- */

static int add_metadata(vks_gguf_writer *w, const vks_lora_adapter *a) {
    int rc = vks_gguf_add_str(w, "general.type", "adapter");
    if (rc == VKS_OK) rc = vks_gguf_add_str(w, "general.architecture", vks_lora_adapter_base_arch(a));
    if (rc == VKS_OK) rc = vks_gguf_add_str(w, "adapter.type", "lora");
    if (rc == VKS_OK) rc = vks_gguf_add_f32(w, "adapter.lora.alpha", (float)vks_lora_adapter_config(a)->alpha);
    char hex[65];
    vks_hash_hex(vks_lora_adapter_base_hash(a), hex);
    return rc == VKS_OK ? vks_gguf_add_str(w, HASH_KEY, hex) : rc;
}

static int add_pair(vks_gguf_writer *w, const vks_lora_adapter *a, int l, vks_lora_target t) {
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int64_t out, in, r = vks_lora_adapter_config(a)->rank;
    vks_lora_target_shape(c, t, &out, &in);
    char name[MAX_NAME];
    vks_lora_gguf_name(l, t, 'a', name, sizeof name);
    int64_t ne_a[2] = {in, r}, ne_b[2] = {r, out};
    int rc = vks_gguf_add_tensor(w, name, VKS_DTYPE_F32, 2, ne_a, vks_lora_adapter_A(a, l, t));
    float *b = rc == VKS_OK ? malloc((size_t)(out * r) * sizeof *b) : NULL;
    if (rc == VKS_OK && !b) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc != VKS_OK) return rc;
    vks_lora_permute_b(a, t, vks_lora_adapter_B(a, l, t), b, c->rope_mode, gguf_rope_mode(vks_lora_adapter_base_arch(a)));
    vks_lora_gguf_name(l, t, 'b', name, sizeof name);
    return vks_gguf_add_tensor_owned(w, name, VKS_DTYPE_F32, 2, ne_b, b);
}

int vks_lora_save_gguf(const char *path, const vks_lora_adapter *a) {
    if (!path || !a) return vks_set_error(VKS_ERR_ARG, "vks_lora_save_gguf: NULL argument");
    if (!vks_lora_adapter_base_hash(a) || !vks_arch_find(vks_lora_adapter_base_arch(a)))
        return vks_set_error(VKS_ERR_ARG, "%s: a GGUF adapter names its base's architecture: set the base first", path);
    if (vks_lora_adapter_norm(a))
        return vks_set_error(VKS_ERR_ARG, "%s: the adapter carries a trained final norm (modules_to_save [\"norm\"]), "
                             "which llama.cpp's GGUF LoRA format has no place for: save it in PEFT's layout, or merge "
                             "it (convert --lora)", path);
    vks_gguf_writer *w = NULL;
    int rc = vks_gguf_writer_create(&w);
    if (rc == VKS_OK) rc = add_metadata(w, a);
    uint32_t targets = vks_lora_adapter_config(a)->targets;
    for (int l = 0; l < vks_lora_adapter_n_layers(a) && rc == VKS_OK; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT && rc == VKS_OK; t++)
            if (targets & (1u << t)) rc = add_pair(w, a, l, (vks_lora_target)t);
    if (rc == VKS_OK) rc = vks_gguf_writer_save(w, path);
    vks_gguf_writer_free(w);
    return rc;
}

/* ---- reading ---- */

/* A tensor name's layer, target and 'a'/'b'; false for anything else. */
static bool parse_name(const char *name, int n_layers, int *layer, vks_lora_target *t, char *which) {
    if (strncmp(name, "blk.", 4)) return false;
    char *end = NULL;
    long l = strtol(name + 4, &end, 10);
    if (end == name + 4 || *end != '.' || l < 0 || l >= n_layers || (name[4] == '0' && end != name + 5)) return false;
    char expect[MAX_NAME];
    for (int k = 0; k < VKS_LORA_TARGET_COUNT; k++)
        for (int w = 0; w < 2; w++) {
            vks_lora_gguf_name((int)l, (vks_lora_target)k, w ? 'b' : 'a', expect, sizeof expect);
            if (!strcmp(expect, name)) {
                *layer = (int)l;
                *t = (vks_lora_target)k;
                *which = w ? 'b' : 'a';
                return true;
            }
        }
    return false;
}

static int check_str(const vks_gguf *g, const char *path, const char *key, const char *want) {
    const char *v = NULL;
    if (vks_gguf_get_str(g, key, &v, NULL) != VKS_OK) return vks_set_error(VKS_ERR_FORMAT, "%s: no %s string", path, key);
    if (strcmp(v, want))
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s is '%.40s', not '%s'", path, key, v, want);
    return VKS_OK;
}

/* Rank (lora_a's ne[1]) and targets from the tensor names; every name must be one of an adapter's. */
static int scan_tensors(const vks_gguf *g, const char *path, const vks_model *base, vks_lora_config *lc) {
    lc->rank = 0;
    lc->targets = 0;
    for (int64_t i = 0; i < vks_gguf_n_tensors(g); i++) {
        const vks_gguf_tensor *gt = vks_gguf_tensor_at(g, i);
        int l;
        vks_lora_target t;
        char which;
        if (!parse_name(gt->name, base->cfg.n_layers, &l, &t, &which))
            return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not a LoRA tensor of the base's layers "
                                 "(blk.N.<q/k/v/o/gate/up/down>.weight.lora_a/b)", path, gt->name);
        lc->targets |= 1u << t;
        if (which == 'a' && !lc->rank) lc->rank = gt->ne[1] > INT32_MAX ? -1 : (int)gt->ne[1];
    }
    if (!lc->targets) return vks_set_error(VKS_ERR_FORMAT, "%s: holds no LoRA tensors", path);
    return VKS_OK;
}

/* alpha: adapter.lora.alpha; absent or 0 means scale 1 in llama.cpp, i.e. alpha = rank. */
static int read_alpha(const vks_gguf *g, const char *path, vks_lora_config *lc) {
    double alpha = 0;
    if (vks_gguf_find_key(g, "adapter.lora.alpha") >= 0 && vks_gguf_get_f64(g, "adapter.lora.alpha", &alpha) != VKS_OK)
        return VKS_ERR_FORMAT;
    if (!isfinite(alpha) || alpha < 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: adapter.lora.alpha %g is not a finite number >= 0", path, alpha);
    lc->alpha = alpha == 0 ? (double)lc->rank : alpha;
    return VKS_OK;
}

static int check_hash(const vks_gguf *g, const char *path, const vks_model *base, const uint8_t hash[32]) {
    if (vks_gguf_find_key(g, HASH_KEY) < 0) return VKS_OK;
    const char *hex = NULL;
    uint8_t want[32];
    if (vks_gguf_get_str(g, HASH_KEY, &hex, NULL) != VKS_OK || vks_hash_parse_hex(hex, want) != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: %s is not 64 hex digits", path, HASH_KEY);
    if (!memcmp(want, hash, 32)) return VKS_OK;
    char have[65];
    vks_hash_hex(hash, have);
    return vks_set_error(VKS_ERR_FORMAT, "%s: %s: the adapter was made for base model %.16s..., not %s (%.16s...)",
                         path, HASH_KEY, hex, base->path, have);
}

static int read_header(const vks_gguf *g, const char *path, const vks_model *base, const uint8_t hash[32],
                       vks_lora_config *lc) {
    int rc = check_str(g, path, "general.type", "adapter");
    if (rc == VKS_OK) rc = check_str(g, path, "adapter.type", "lora");
    if (rc == VKS_OK) rc = check_str(g, path, "general.architecture", base->arch);
    if (rc == VKS_OK) rc = check_hash(g, path, base, hash);
    if (rc == VKS_OK) rc = scan_tensors(g, path, base, lc);
    return rc == VKS_OK ? read_alpha(g, path, lc) : rc;
}

static int bind_matrix(const vks_gguf *g, const char *path, const char *name, int64_t ne0, int64_t ne1,
                       const vks_gguf_tensor **out) {
    const vks_gguf_tensor *gt = vks_gguf_find_tensor(g, name);
    if (!gt) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", path, name);
    if (gt->ne[0] != ne0 || gt->ne[1] != ne1 || gt->ne[2] != 1 || gt->ne[3] != 1)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has ne [%lld, %lld, %lld, %lld]; the rank and the base need "
                             "[%lld, %lld]", path, name, (long long)gt->ne[0], (long long)gt->ne[1], (long long)gt->ne[2],
                             (long long)gt->ne[3], (long long)ne0, (long long)ne1);
    if (gt->dtype == VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has ggml type %u, not F32, F16 or BF16", path, name,
                             gt->ggml_type);
    *out = gt;
    return VKS_OK;
}

static int read_pair(const vks_gguf *g, const char *path, vks_lora_adapter *a, int l, vks_lora_target t, float *tmp,
                     int file_mode) {
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int64_t out, in, r = vks_lora_adapter_config(a)->rank;
    vks_lora_target_shape(c, t, &out, &in);
    char name[MAX_NAME];
    const vks_gguf_tensor *gt = NULL;
    vks_lora_gguf_name(l, t, 'a', name, sizeof name);
    int rc = bind_matrix(g, path, name, in, r, &gt);
    if (rc == VKS_OK) rc = vks_lora_decode(path, name, gt->dtype, gt->data, vks_lora_adapter_A(a, l, t), (size_t)(r * in));
    vks_lora_gguf_name(l, t, 'b', name, sizeof name);
    if (rc == VKS_OK) rc = bind_matrix(g, path, name, r, out, &gt);
    if (rc == VKS_OK) rc = vks_lora_decode(path, name, gt->dtype, gt->data, tmp, (size_t)(out * r));
    if (rc == VKS_OK) vks_lora_permute_b(a, t, tmp, vks_lora_adapter_B(a, l, t), file_mode, c->rope_mode);
    return rc;
}

static int read_tensors(const vks_gguf *g, const char *path, vks_lora_adapter *a, const char *arch) {
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int64_t r = vks_lora_adapter_config(a)->rank, max_out = c->dim, n_read = 0;
    if (c->hidden_dim > max_out) max_out = c->hidden_dim;
    if ((int64_t)c->n_heads * c->head_dim > max_out) max_out = (int64_t)c->n_heads * c->head_dim;
    float *tmp = malloc((size_t)(max_out * r) * sizeof *tmp);
    int rc = tmp ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    for (int l = 0; l < vks_lora_adapter_n_layers(a) && rc == VKS_OK; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT && rc == VKS_OK; t++)
            if (vks_lora_adapter_A(a, l, (vks_lora_target)t)) {
                rc = read_pair(g, path, a, l, (vks_lora_target)t, tmp, gguf_rope_mode(arch));
                n_read += 2;
            }
    free(tmp);
    /* every name is an adapter's (scan_tensors) and every expected one was found: more means duplicates */
    if (rc == VKS_OK && n_read != vks_gguf_n_tensors(g))
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: holds %lld tensors, the adapter %lld", path,
                           (long long)vks_gguf_n_tensors(g), (long long)n_read);
    return rc;
}

int vks_lora_load_gguf(const char *path, const vks_model *base, const uint8_t hash[32], vks_lora_adapter **out) {
    vks_gguf *g = NULL;
    int rc = vks_gguf_open(path, &g);
    vks_lora_config lc = {0};
    vks_lora_adapter *a = NULL;
    if (rc == VKS_OK) rc = read_header(g, path, base, hash, &lc);
    if (rc == VKS_OK) rc = vks_lora_create_for(path, base, &lc, &a);
    if (rc == VKS_OK) rc = read_tensors(g, path, a, base->arch);
    vks_gguf_close(g);
    if (rc != VKS_OK) {
        vks_lora_adapter_free(a);
        return rc;
    }
    vks_lora_adapter_set_base_id(a, hash, base->arch, base->path);
    *out = a;
    return VKS_OK;
}
