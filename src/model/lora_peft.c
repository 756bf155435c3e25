/* lora_peft.c: adapters in PEFT's layout (a directory holding
 * adapter_model.safetensors and adapter_config.json), as PEFT's
 * save_pretrained writes them and vLLM reads them.
 *
 * PEFT's q_proj/k_proj outputs are in Hugging Face's half-split RoPE order;
 * B of q and k is permuted between that and the base's own order exactly as
 * the HF reader/writer permute wq/wk (vks_lora_permute_b). A is never
 * permuted (its columns are the layer input). */
#include "model/lora_internal.h"
#include "model/model_internal.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define CONFIG_FILE "adapter_config.json"
#define WEIGHTS_FILE "adapter_model.safetensors"
#define MAX_CONFIG_BYTES (1 << 20)
#define MAX_NAME 160
/* modules_to_save ["norm"]: PEFT saves the module's own weight under its full name */
#define NORM_MODULE "norm"
#define NORM_NAME "base_model.model.model.norm.weight"

static int join(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

/* ---- writing ---- */

typedef struct {
    vks_st_write_tensor *t;
    float **owned; /* permuted copies of B */
    size_t n, n_owned;
} peft_tensors;

static void peft_tensors_free(peft_tensors *p) {
    for (size_t i = 0; i < p->n; i++) free((void *)p->t[i].name);
    for (size_t i = 0; i < p->n_owned; i++) free(p->owned[i]);
    free(p->t);
    free(p->owned);
}

/* rows 0: a vector [cols] (the norm, as PEFT saves nn.Parameter [dim]) */
static int add_tensor(peft_tensors *p, const char *name, const float *data, int64_t rows, int64_t cols) {
    vks_st_write_tensor *t = &p->t[p->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = strdup(name))) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    p->n++;
    t->dtype = VKS_DTYPE_F32;
    t->n_dims = rows ? 2 : 1;
    t->shape[0] = rows ? rows : cols;
    t->shape[1] = rows ? cols : 0;
    t->data = data;
    return VKS_OK;
}

/* A as it is; B with q/k rows in HF order. */
static int add_pair(peft_tensors *p, const vks_lora_adapter *a, int l, vks_lora_target t) {
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int64_t out, in, r = vks_lora_adapter_config(a)->rank;
    vks_lora_target_shape(c, t, &out, &in);
    char name[MAX_NAME];
    vks_lora_peft_name(l, t, 'A', name, sizeof name);
    int rc = add_tensor(p, name, vks_lora_adapter_A(a, l, t), r, in);
    float *b = malloc((size_t)out * (size_t)r * sizeof *b);
    if (rc == VKS_OK && !b) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc != VKS_OK) {
        free(b);
        return rc;
    }
    p->owned[p->n_owned++] = b;
    vks_lora_permute_b(a, t, vks_lora_adapter_B(a, l, t), b, c->rope_mode, VKS_ROPE_HALF);
    vks_lora_peft_name(l, t, 'B', name, sizeof name);
    return add_tensor(p, name, b, out, r);
}

static int collect_tensors(const vks_lora_adapter *a, peft_tensors *p) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    size_t pairs = (size_t)vks_lora_adapter_n_layers(a) * VKS_LORA_TARGET_COUNT;
    p->t = calloc(2 * pairs + 1, sizeof *p->t);
    p->owned = calloc(pairs, sizeof *p->owned);
    if (!p->t || !p->owned) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    int rc = VKS_OK;
    for (int l = 0; l < vks_lora_adapter_n_layers(a) && rc == VKS_OK; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT && rc == VKS_OK; t++)
            if (lc->targets & (1u << t)) rc = add_pair(p, a, l, (vks_lora_target)t);
    if (rc == VKS_OK && vks_lora_adapter_norm(a))
        rc = add_tensor(p, NORM_NAME, vks_lora_adapter_norm(a), 0, vks_lora_adapter_base_config(a)->dim);
    return rc;
}

static json_t *config_json(const vks_lora_adapter *a) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    json_t *root = json_object(), *targets = json_array();
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++)
        if (lc->targets & (1u << t)) json_array_append_new(targets, json_string(vks_lora_target_name((vks_lora_target)t)));
    const char *name = vks_lora_adapter_base_name(a);
    json_object_set_new(root, "peft_type", json_string("LORA"));
    json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(root, "r", json_integer(lc->rank));
    json_object_set_new(root, "lora_alpha", json_real(lc->alpha));
    json_object_set_new(root, "target_modules", targets);
    json_object_set_new(root, "bias", json_string("none"));
    json_object_set_new(root, "base_model_name_or_path", name[0] ? json_string(name) : json_null());
    json_object_set_new(root, "fan_in_fan_out", json_false());
    json_object_set_new(root, "use_rslora", json_false());
    json_object_set_new(root, "use_dora", json_false());
    json_object_set_new(root, "lora_dropout", json_real(0.0));
    json_object_set_new(root, "inference_mode", json_true());
    json_object_set_new(root, "init_lora_weights", json_true());
    json_object_set_new(root, "layers_to_transform", json_null());
    json_object_set_new(root, "modules_to_save",
                        vks_lora_adapter_norm(a) ? json_pack("[s]", NORM_MODULE) : json_null());
    json_object_set_new(root, "rank_pattern", json_object());
    json_object_set_new(root, "alpha_pattern", json_object());
    const uint8_t *h = vks_lora_adapter_base_hash(a);
    if (h) {
        char hex[65];
        vks_hash_hex(h, hex);
        json_object_set_new(root, "vkswarm", json_pack("{ss}", "base_model_hash", hex));
    }
    return root;
}

static int write_config(FILE *f, const char *path, const vks_lora_adapter *a) {
    json_t *root = config_json(a);
    int rc = root && json_dumpf(root, f, JSON_INDENT(2) | JSON_SORT_KEYS) == 0 && fputc('\n', f) != EOF
                 ? VKS_OK
                 : vks_set_error(VKS_ERR_IO, "%s: write failed", path);
    json_decref(root);
    return rc;
}

static int write_files(const char *dir, const vks_lora_adapter *a, const peft_tensors *p) {
    char paths[2][1100];
    int rc = join(paths[0], sizeof paths[0], dir, WEIGHTS_FILE);
    if (rc == VKS_OK) rc = join(paths[1], sizeof paths[1], dir, CONFIG_FILE);
    vks_outfile o[2] = {{0}};
    for (int i = 0; i < 2 && rc == VKS_OK; i++) rc = vks_outfile_open(&o[i], paths[i], 0666);
    if (rc == VKS_OK) rc = vks_st_write_stream(o[0].f, paths[0], p->t, p->n);
    if (rc == VKS_OK) rc = write_config(o[1].f, paths[1], a);
    if (rc != VKS_OK) {
        vks_outfile_abort(&o[0]);
        vks_outfile_abort(&o[1]);
        return rc;
    }
    return vks_outfile_commit_all(o, 2, false);
}

int vks_lora_save_peft(const char *dir, const vks_lora_adapter *a) {
    if (!dir || !a) return vks_set_error(VKS_ERR_ARG, "vks_lora_save_peft: NULL argument");
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    peft_tensors p = {0};
    int rc = collect_tensors(a, &p);
    if (rc == VKS_OK) rc = write_files(dir, a, &p);
    peft_tensors_free(&p);
    return rc;
}

/* ---- reading adapter_config.json ---- */

typedef struct {
    vks_lora_config lc;
    bool norm; /* modules_to_save ["norm"] */
    bool has_hash;
    uint8_t hash[32];
} peft_config;

static int config_error(const char *path, const char *key, const char *problem) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: %s: %s", path, key, problem);
}

/* Keys whose only supported value is "absent", null, false or empty. */
static int refuse_unsupported(const char *path, json_t *root) {
    static const char *const flags[] = {"use_rslora", "fan_in_fan_out", "use_dora"};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (json_is_true(json_object_get(root, flags[i])))
            return config_error(path, flags[i], "true is not supported (vkswarm's LoRA is plain: scale alpha / r, W [out, in])");
    static const char *const patterns[] = {"rank_pattern", "alpha_pattern", "layers_to_transform", "layers_pattern"};
    for (size_t i = 0; i < sizeof patterns / sizeof patterns[0]; i++) {
        json_t *v = json_object_get(root, patterns[i]);
        bool empty = !v || json_is_null(v) || (json_is_object(v) && json_object_size(v) == 0) ||
                     (json_is_array(v) && json_array_size(v) == 0);
        if (!empty) return config_error(path, patterns[i], "is not supported (every layer and target must have r and lora_alpha)");
    }
    json_t *bias = json_object_get(root, "bias");
    if (bias && !(json_is_string(bias) && !strcmp(json_string_value(bias), "none")))
        return config_error(path, "bias", "only \"none\" is supported");
    json_t *type = json_object_get(root, "peft_type");
    if (!json_is_string(type) || strcmp(json_string_value(type), "LORA"))
        return config_error(path, "peft_type", "is not \"LORA\"");
    return VKS_OK;
}

static int parse_target(const char *path, const char *s, uint32_t *mask) {
    for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++)
        if (!strcmp(s, vks_lora_target_name((vks_lora_target)t))) {
            *mask |= 1u << t;
            return VKS_OK;
        }
    return vks_set_error(VKS_ERR_FORMAT, "%s: target_modules: unknown module '%.64s' (q_proj, k_proj, v_proj, o_proj, "
                         "gate_proj, up_proj, down_proj)", path, s);
}

static int parse_targets(const char *path, json_t *v, uint32_t *mask) {
    *mask = 0;
    if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
        *mask = VKS_LORA_ALL_TARGETS;
        return VKS_OK;
    }
    if (!json_is_array(v) || json_array_size(v) == 0)
        return config_error(path, "target_modules", "must be a non-empty list of module names (or \"all-linear\")");
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_string(e)) return config_error(path, "target_modules", "holds a non-string");
        int rc = parse_target(path, json_string_value(e), mask);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* modules_to_save: absent, null, [] or ["norm"] (the final norm, trained beside the adapter). */
static int parse_modules_to_save(const char *path, json_t *v, peft_config *pc) {
    if (!v || json_is_null(v) || (json_is_array(v) && json_array_size(v) == 0)) return VKS_OK;
    json_t *e = json_is_array(v) && json_array_size(v) == 1 ? json_array_get(v, 0) : NULL;
    if (!json_is_string(e) || strcmp(json_string_value(e), NORM_MODULE))
        return config_error(path, "modules_to_save", "only [\"norm\"] (the final norm) is supported");
    pc->norm = true;
    return VKS_OK;
}

static int parse_hash(const char *path, json_t *root, peft_config *pc) {
    json_t *v = json_object_get(root, "vkswarm");
    if (!v) return VKS_OK;
    json_t *h = json_object_get(v, "base_model_hash");
    if (!json_is_object(v) || !json_is_string(h) || vks_hash_parse_hex(json_string_value(h), pc->hash) != 0)
        return config_error(path, "vkswarm.base_model_hash", "is not 64 hex digits");
    pc->has_hash = true;
    return VKS_OK;
}

static int parse_config(const char *path, json_t *root, peft_config *pc) {
    if (!json_is_object(root)) return vks_set_error(VKS_ERR_FORMAT, "%s: not a JSON object", path);
    int rc = refuse_unsupported(path, root);
    if (rc) return rc;
    json_t *r = json_object_get(root, "r"), *alpha = json_object_get(root, "lora_alpha");
    if (!json_is_integer(r) || json_integer_value(r) < 1 || json_integer_value(r) > INT32_MAX)
        return config_error(path, "r", "must be an integer >= 1");
    if (!json_is_number(alpha) || !(json_number_value(alpha) > 0) || !isfinite(json_number_value(alpha)))
        return config_error(path, "lora_alpha", "must be a finite number > 0");
    pc->lc.rank = (int)json_integer_value(r);
    pc->lc.alpha = json_number_value(alpha);
    rc = parse_targets(path, json_object_get(root, "target_modules"), &pc->lc.targets);
    if (!rc) rc = parse_modules_to_save(path, json_object_get(root, "modules_to_save"), pc);
    return rc ? rc : parse_hash(path, root, pc);
}

static int read_config(const char *path, peft_config *pc) {
    char *buf = NULL;
    size_t len = 0;
    int rc = vks_file_read_all(path, MAX_CONFIG_BYTES, &buf, &len);
    if (rc) return rc;
    json_error_t err;
    json_t *root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &err);
    free(buf);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: bad JSON: %s (line %d)", path, err.text, err.line);
    rc = parse_config(path, root, pc);
    json_decref(root);
    return rc;
}

/* ---- reading adapter_model.safetensors ---- */

static int bind_matrix(const char *file, const vks_st_file *f, const char *name, int64_t rows, int64_t cols,
                       const vks_st_tensor **out) {
    const vks_st_tensor *t = vks_st_find(f, name);
    if (!t) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", file, name);
    if (t->n_dims != 2)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has %d dimensions, not 2", file, name, t->n_dims);
    if (t->shape[0] != rows || t->shape[1] != cols)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has shape [%lld, %lld]; r and the base need [%lld, %lld]",
                             file, name, (long long)t->shape[0], (long long)t->shape[1], (long long)rows,
                             (long long)cols);
    if (t->dtype == VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has dtype %s, not F32, F16 or BF16", file, name,
                             t->dtype_name);
    *out = t;
    return VKS_OK;
}

static int read_pair(const char *file, const vks_st_file *f, vks_lora_adapter *a, int l, vks_lora_target t,
                     float *tmp) {
    int64_t out, in, r = vks_lora_adapter_config(a)->rank;
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    vks_lora_target_shape(c, t, &out, &in);
    char name[MAX_NAME];
    const vks_st_tensor *st = NULL;
    vks_lora_peft_name(l, t, 'A', name, sizeof name);
    int rc = bind_matrix(file, f, name, r, in, &st);
    if (rc == VKS_OK) rc = vks_lora_decode(file, name, st->dtype, st->data, vks_lora_adapter_A(a, l, t), (size_t)(r * in));
    vks_lora_peft_name(l, t, 'B', name, sizeof name);
    if (rc == VKS_OK) rc = bind_matrix(file, f, name, out, r, &st);
    if (rc == VKS_OK) rc = vks_lora_decode(file, name, st->dtype, st->data, tmp, (size_t)(out * r));
    if (rc == VKS_OK) vks_lora_permute_b(a, t, tmp, vks_lora_adapter_B(a, l, t), VKS_ROPE_HALF, c->rope_mode);
    return rc;
}

/* Whether name is one the adapter reads. */
static bool expected_name(const vks_lora_adapter *a, const char *name, bool norm) {
    char n[MAX_NAME];
    if (norm && !strcmp(name, NORM_NAME)) return true;
    for (int l = 0; l < vks_lora_adapter_n_layers(a); l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT; t++)
            for (int w = 0; w < 2 && vks_lora_adapter_A(a, l, (vks_lora_target)t); w++) {
                vks_lora_peft_name(l, (vks_lora_target)t, w ? 'B' : 'A', n, sizeof n);
                if (!strcmp(n, name)) return true;
            }
    return false;
}

/* Every expected tensor was read; a file holding more names the first extra one. */
static int refuse_extra(const char *file, const vks_st_file *f, const vks_lora_adapter *a, int64_t n_read, bool norm) {
    if (vks_st_n_tensors(f) == n_read) return VKS_OK;
    for (int64_t i = 0; i < vks_st_n_tensors(f); i++) {
        const char *name = vks_st_tensor_at(f, i)->name;
        if (!expected_name(a, name, norm))
            return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not one of the adapter's (target_modules, layers of "
                                 "the base)", file, name);
    }
    return vks_set_error(VKS_ERR_FORMAT, "%s: holds tensors the adapter does not use", file);
}

/* modules_to_save ["norm"]: the final norm's weight, [dim] (or [1, dim]). */
static int read_norm(const char *file, const vks_st_file *f, vks_lora_adapter *a) {
    int64_t dim = vks_lora_adapter_base_config(a)->dim;
    const vks_st_tensor *t = vks_st_find(f, NORM_NAME);
    if (!t) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s (modules_to_save [\"norm\"])", file, NORM_NAME);
    bool vector = (t->n_dims == 1 && t->shape[0] == dim) || (t->n_dims == 2 && t->shape[0] == 1 && t->shape[1] == dim);
    if (!vector) return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not [%lld]", file, NORM_NAME, (long long)dim);
    if (t->dtype == VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has dtype %s, not F32, F16 or BF16", file, NORM_NAME,
                             t->dtype_name);
    float *w = malloc((size_t)dim * sizeof *w);
    int rc = w ? vks_lora_decode(file, NORM_NAME, t->dtype, t->data, w, (size_t)dim)
               : vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc == VKS_OK) rc = vks_lora_adapter_set_norm(a, w);
    free(w);
    return rc;
}

static int read_weights(const char *file, vks_lora_adapter *a, bool norm) {
    vks_st_file *f = NULL;
    int rc = vks_st_open(file, &f);
    if (rc) return rc;
    const vks_model_config *c = vks_lora_adapter_base_config(a);
    int64_t r = vks_lora_adapter_config(a)->rank, n_read = 0, max_out = c->dim;
    if (c->hidden_dim > max_out) max_out = c->hidden_dim;
    if ((int64_t)c->n_heads * c->head_dim > max_out) max_out = (int64_t)c->n_heads * c->head_dim;
    float *tmp = malloc((size_t)(max_out * r) * sizeof *tmp);
    if (!tmp) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    for (int l = 0; l < vks_lora_adapter_n_layers(a) && rc == VKS_OK; l++)
        for (int t = 0; t < VKS_LORA_TARGET_COUNT && rc == VKS_OK; t++)
            if (vks_lora_adapter_A(a, l, (vks_lora_target)t)) {
                rc = read_pair(file, f, a, l, (vks_lora_target)t, tmp);
                n_read += 2;
            }
    if (rc == VKS_OK && norm) rc = read_norm(file, f, a), n_read++;
    if (rc == VKS_OK) rc = refuse_extra(file, f, a, n_read, norm);
    free(tmp);
    vks_st_close(f);
    return rc;
}

static int check_hash(const char *path, const peft_config *pc, const vks_model *base, const uint8_t hash[32]) {
    if (!pc->has_hash || !memcmp(pc->hash, hash, 32)) return VKS_OK;
    char want[65], have[65];
    vks_hash_hex(pc->hash, want);
    vks_hash_hex(hash, have);
    return vks_set_error(VKS_ERR_FORMAT, "%s: vkswarm.base_model_hash: the adapter was made for base model %.16s..., "
                         "not %s (%.16s...)", path, want, base->path, have);
}

int vks_lora_load_peft(const char *dir, const vks_model *base, const uint8_t hash[32], vks_lora_adapter **out) {
    char cfg_path[1100], st_path[1100];
    int rc = join(cfg_path, sizeof cfg_path, dir, CONFIG_FILE);
    if (rc == VKS_OK) rc = join(st_path, sizeof st_path, dir, WEIGHTS_FILE);
    peft_config pc = {0};
    if (rc == VKS_OK) rc = read_config(cfg_path, &pc);
    if (rc == VKS_OK) rc = check_hash(cfg_path, &pc, base, hash);
    vks_lora_adapter *a = NULL;
    if (rc == VKS_OK) rc = vks_lora_create_for(cfg_path, base, &pc.lc, &a);
    if (rc == VKS_OK) rc = read_weights(st_path, a, pc.norm);
    if (rc != VKS_OK) {
        vks_lora_adapter_free(a);
        return rc;
    }
    vks_lora_adapter_set_base_id(a, hash, base->arch, base->path);
    *out = a;
    return VKS_OK;
}
