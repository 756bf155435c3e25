/* lora_files.c: what the adapter files share: tensor names from the model
 * schema, decoding with the finite check, the adapter for a base, and
 * vks_lora_load choosing the reader by content. */
#include "model/lora_internal.h"
#include "vkswarm/vks_quant.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The schema's name of layer l's base matrix of t without its ".weight". */
static void base_name(int layer, vks_lora_target t, vks_name_kind kind, char *buf, size_t cap) {
    int idx = vks_lora_target_tensor(t);
    vks_schema_item it = {.s = &vks_layer_schema[idx], .layer = layer, .index = idx};
    vks_schema_name(&it, kind, buf, cap);
    size_t n = strlen(buf);
    if (kind == VKS_NAME_HF && n > 7 && !strcmp(buf + n - 7, ".weight")) buf[n - 7] = '\0';
}

void vks_lora_peft_name(int layer, vks_lora_target t, char which, char *buf, size_t cap) {
    char b[128];
    base_name(layer, t, VKS_NAME_HF, b, sizeof b);
    snprintf(buf, cap, "base_model.model.%s.lora_%c.weight", b, which);
}

void vks_lora_gguf_name(int layer, vks_lora_target t, char which, char *buf, size_t cap) {
    char b[128];
    base_name(layer, t, VKS_NAME_GGUF, b, sizeof b);
    snprintf(buf, cap, "%s.lora_%c", b, which);
}

int vks_lora_decode(const char *file, const char *tensor, vks_dtype dt, const void *src, float *dst, size_t n) {
    if (dt != VKS_DTYPE_F32 && dt != VKS_DTYPE_F16 && dt != VKS_DTYPE_BF16)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s: dtype %s is not F32, F16 or BF16", file, tensor,
                             vks_dtype_name(dt));
    vks_dequantize(dt, src, dst, n);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]))
            return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s: element %zu is %s", file, tensor, i,
                                 isnan(dst[i]) ? "NaN" : "Inf");
    return VKS_OK;
}

int vks_lora_create_for(const char *file, const vks_model *base, const vks_lora_config *lc, vks_lora_adapter **out) {
    *out = NULL;
    if (!(lc->alpha > 0) || !isfinite(lc->alpha))
        return vks_set_error(VKS_ERR_FORMAT, "%s: LoRA alpha %g is not a finite positive number", file, lc->alpha);
    int rc = vks_lora_check(&base->cfg, lc->rank, lc->targets, file);
    if (rc) return vks_set_error(VKS_ERR_FORMAT, "%s (the base is %s)", vks_last_error(), base->path);
    rc = vks_lora_adapter_create(&base->cfg, lc, out);
    return rc == VKS_ERR_ARG ? vks_set_error(VKS_ERR_FORMAT, "%s: %s", file, vks_last_error()) : rc;
}

/* Whether path is a file starting with GGUF's magic. */
static bool is_gguf(const char *path) {
    FILE *f = NULL;
    if (vks_fopen_regular(path, &f) != VKS_OK) return false;
    char magic[4] = {0};
    bool yes = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
    fclose(f);
    return yes;
}

/* A PEFT directory, or one of its two files named: the directory holding it. */
static int peft_dir(const char *path, char *dir, size_t cap) {
    struct stat st;
    if (stat(path, &st) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISDIR(st.st_mode)) {
        if ((size_t)snprintf(dir, cap, "%s", path) >= cap) return vks_set_error(VKS_ERR_ARG, "%s: path too long", path);
        return VKS_OK;
    }
    const char *slash = strrchr(path, '/'), *name = slash ? slash + 1 : path;
    if (strcmp(name, "adapter_config.json") && strcmp(name, "adapter_model.safetensors"))
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a LoRA adapter (a PEFT directory or a GGUF adapter file)", path);
    int n = !slash ? 1 : slash == path ? 1 : (int)(slash - path);
    if ((size_t)snprintf(dir, cap, "%.*s", n, slash ? path : ".") >= cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", path);
    return VKS_OK;
}

int vks_lora_load_hashed(const char *path, const vks_model *base, const uint8_t base_hash[32],
                         vks_lora_adapter **out) {
    if (!path || !base || !out) return vks_set_error(VKS_ERR_ARG, "vks_lora_load: NULL argument");
    *out = NULL;
    int rc = vks_model_check_tensors(base, base->path);
    uint8_t own[32];
    if (rc == VKS_OK && !base_hash) rc = vks_model_hash(base, own);
    if (rc) return rc;
    const uint8_t *hash = base_hash ? base_hash : own;
    if (is_gguf(path)) return vks_lora_load_gguf(path, base, hash, out);
    char dir[1024];
    rc = peft_dir(path, dir, sizeof dir);
    return rc ? rc : vks_lora_load_peft(dir, base, hash, out);
}

int vks_lora_load(const char *path, const vks_model *base, vks_lora_adapter **out) {
    return vks_lora_load_hashed(path, base, NULL, out);
}
