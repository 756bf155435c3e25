/* hf_model.c: Hugging Face checkpoints (config.json + safetensors, single or
 * sharded with model.safetensors.index.json) as vks_model, read in place.
 * HF stores q/k rows for half-split RoPE, so these models run with
 * VKS_ROPE_HALF; the writer permutes rows into that order. */
#include "model/model_internal.h"
#include "vkswarm/vks_quant.h"
#include "vkswarm/vks_safetensors.h"
#include "vkswarm/vks_tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_SHARDS 1024
#define MAX_INDEX_BYTES (64 << 20)
#define MAX_NAME 128

typedef struct {
    vks_st_file **files;
    int n;
} hf_state;

static void hf_state_free(void *p) {
    hf_state *s = p;
    if (!s) return;
    for (int i = 0; i < s->n; i++) vks_st_close(s->files[i]);
    free(s->files);
    free(s);
}

const char *vks_model_dir(const vks_model *m) { return m && m->dir[0] ? m->dir : NULL; }

static bool is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool exists(const char *p) {
    struct stat st;
    return stat(p, &st) == 0;
}

static int join(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

static int add_shard(hf_state *s, const char *path) {
    if (s->n >= MAX_SHARDS) return vks_set_error(VKS_ERR_FORMAT, "%s: more than %d shards", path, MAX_SHARDS);
    vks_st_file **f = realloc(s->files, (size_t)(s->n + 1) * sizeof *f);
    if (!f) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    s->files = f;
    int rc = vks_st_open(path, &s->files[s->n]);
    if (rc == VKS_OK) s->n++;
    return rc;
}

/* A shard file name from the index must be a plain name inside the directory. */
static bool safe_shard_name(const char *n) {
    return n && n[0] && n[0] != '.' && !strchr(n, '/') && !strchr(n, '\\') && strlen(n) < 256;
}

static int open_sharded(hf_state *s, const char *dir, const char *index_path) {
    json_error_t err;
    FILE *f = NULL;
    int rc = vks_fopen_regular(index_path, &f);
    if (rc) return rc;
    json_t *root = json_loadf(f, JSON_REJECT_DUPLICATES, &err);
    fclose(f);
    if (!root) return vks_set_error(VKS_ERR_FORMAT, "%s: bad JSON: %s", index_path, err.text);
    json_t *map = json_object_get(root, "weight_map");
    rc = json_is_object(map) ? VKS_OK : vks_set_error(VKS_ERR_FORMAT, "%s: no weight_map object", index_path);
    /* Distinct shard names, in order of first appearance. */
    const char **names = NULL;
    int n_names = 0;
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        if (rc != VKS_OK) break;
        const char *shard = json_string_value(val);
        if (!safe_shard_name(shard)) {
            rc = vks_set_error(VKS_ERR_FORMAT, "%s: tensor '%s' maps to a bad shard name", index_path, key);
            break;
        }
        bool seen = false;
        for (int i = 0; i < n_names && !seen; i++) seen = strcmp(names[i], shard) == 0;
        if (seen) continue;
        if (n_names >= MAX_SHARDS) rc = vks_set_error(VKS_ERR_FORMAT, "%s: more than %d shards", index_path, MAX_SHARDS);
        const char **p = rc == VKS_OK ? realloc(names, (size_t)(n_names + 1) * sizeof *p) : NULL;
        if (rc == VKS_OK && !p) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
        if (rc != VKS_OK) break;
        names = p;
        names[n_names++] = shard;
    }
    char path[1024];
    for (int i = 0; i < n_names && rc == VKS_OK; i++) {
        rc = join(path, sizeof path, dir, names[i]);
        if (rc == VKS_OK) rc = add_shard(s, path);
    }
    free(names);
    json_decref(root);
    return rc;
}

/* Finds a tensor in exactly one shard. */
static int find_tensor(const hf_state *s, const char *what, const char *name, const vks_st_tensor **out) {
    *out = NULL;
    for (int i = 0; i < s->n; i++) {
        const vks_st_tensor *t = vks_st_find(s->files[i], name);
        if (t && *out) return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s appears in two shards", what, name);
        if (t) *out = t;
    }
    return VKS_OK;
}

static int bind(const hf_state *s, const char *what, const char *name, int64_t rows, int64_t cols, bool required,
                vks_tensor *t) {
    const vks_st_tensor *st;
    int rc = find_tensor(s, what, name, &st);
    if (rc != VKS_OK) return rc;
    if (!st) return required ? vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", what, name) : VKS_OK;
    bool vec_ok = rows == 1 && st->n_dims == 1 && st->shape[0] == cols;
    bool mat_ok = st->n_dims == 2 && st->shape[0] == rows && st->shape[1] == cols;
    if (!vec_ok && !mat_ok)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has a shape that disagrees with config.json ([%lld, %lld])",
                             what, name, (long long)rows, (long long)cols);
    if (st->dtype == VKS_DTYPE_COUNT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s has unsupported dtype %s", what, name, st->dtype_name);
    *t = (vks_tensor){st->dtype, rows, cols, st->data};
    return vks_check_bound_tensor(what, name, t, false);
}

static int64_t hf_n_tensors(const hf_state *s) {
    int64_t n = 0;
    for (int i = 0; i < s->n; i++) n += vks_st_n_tensors(s->files[i]);
    return n;
}

/* Tensor i counted across the shards in order. */
static const void *hf_tensor_data(const void *ctx, int64_t i, const char **name) {
    const hf_state *s = ctx;
    for (int f = 0; f < s->n; f++) {
        int64_t n = vks_st_n_tensors(s->files[f]);
        if (i < n) {
            const vks_st_tensor *t = vks_st_tensor_at(s->files[f], i);
            *name = t ? t->name : NULL;
            return t ? t->data : NULL;
        }
        i -= n;
    }
    *name = NULL;
    return NULL;
}

/* Every tensor of the checkpoint is used, and every weight is finite. */
static int check_weights(const vks_model *m, const hf_state *s) {
    int rc = vks_model_check_unused(m, m->path, hf_n_tensors(s), hf_tensor_data, s);
    return rc == VKS_OK ? vks_model_check_finite(m, m->path) : rc;
}

/* Binds every tensor the schema lists for the config (biases when config.json
 * says attention_bias). */
static int bind_model(vks_model *m, const hf_state *s, bool bias) {
    const vks_model_config *c = &m->cfg;
    const char *what = m->path;
    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    vks_schema_item *items = NULL;
    int n = 0, rc = m->layers ? vks_schema_list_alloc(c, bias, &items, &n)
                              : vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", what);
    char name[MAX_NAME];
    for (int i = 0; i < n && rc == VKS_OK; i++) {
        vks_schema_name(&items[i], VKS_NAME_HF, name, sizeof name);
        rc = bind(s, what, name, items[i].rows, items[i].cols, true, vks_model_slot(m, &items[i]));
    }
    free(items);
    if (c->shared_classifier) m->classifier = m->tok_emb;
    if (rc == VKS_OK) rc = vks_model_check_tensors(m, what);
    return rc == VKS_OK ? check_weights(m, s) : rc;
}

/* Splits path into the model directory and the weights to open. */
static int open_weights(const char *path, char *dir, size_t dir_cap, hf_state *s) {
    char p[1024];
    if (is_dir(path)) {
        snprintf(dir, dir_cap, "%s", path);
        int rc = join(p, sizeof p, dir, "model.safetensors.index.json");
        if (rc == VKS_OK && exists(p)) return open_sharded(s, dir, p);
        if (rc == VKS_OK) rc = join(p, sizeof p, dir, "model.safetensors");
        return rc == VKS_OK ? add_shard(s, p) : rc;
    }
    snprintf(dir, dir_cap, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, dir_cap, ".");
    return add_shard(s, path);
}

int vks_model_load_safetensors(const char *path, vks_model **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_model_load_safetensors: NULL argument");
    *out = NULL;
    vks_model *m = vks_model_alloc();
    hf_state *s = calloc(1, sizeof *s);
    if (!m || !s) {
        free(s);
        vks_model_free(m);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    }
    m->format_state = s;
    m->format_free = hf_state_free;
    snprintf(m->path, sizeof m->path, "%s", path);
    char cfg_path[1100];
    vks_hf_config hc;
    int rc = open_weights(path, m->dir, sizeof m->dir, s);
    if (rc == VKS_OK) rc = join(cfg_path, sizeof cfg_path, m->dir, "config.json");
    if (rc == VKS_OK) rc = vks_hf_config_load(cfg_path, &hc);
    if (rc == VKS_OK) {
        m->cfg = hc.cfg;
        m->bos_id = hc.bos_id < hc.cfg.vocab_size ? hc.bos_id : -1;
        m->eos_id = hc.eos_id < hc.cfg.vocab_size ? hc.eos_id : -1;
        snprintf(m->arch, sizeof m->arch, "%s", hc.arch);
        rc = bind_model(m, s, hc.attention_bias);
    }
    if (rc != VKS_OK) {
        vks_model_free(m);
        return rc;
    }
    *out = m;
    return VKS_OK;
}

/* ---- writing ---- */

typedef struct {
    vks_st_write_tensor *t;
    void **owned;
    size_t n, cap;
} st_list;

static int list_add(st_list *l, const char *name, const vks_tensor *src, bool vector, vks_dtype dt) {
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 64;
        vks_st_write_tensor *t = realloc(l->t, cap * sizeof *t);
        if (t) l->t = t;
        void **o = realloc(l->owned, cap * sizeof *o);
        if (o) l->owned = o;
        if (!t || !o) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
        l->cap = cap;
    }
    size_t n = (size_t)src->rows * (size_t)src->cols;
    void *buf = malloc(n * vks_dtype_size(dt));
    char *nm = strdup(name);
    if (!buf || !nm) {
        free(buf);
        free(nm);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory encoding %s", name);
    }
    vks_quantize(dt, src->data, buf, n);
    vks_st_write_tensor *t = &l->t[l->n];
    memset(t, 0, sizeof *t);
    t->name = nm;
    t->dtype = dt;
    t->n_dims = vector ? 1 : 2; /* vectors are 1-D in HF */
    t->shape[0] = t->n_dims == 1 ? src->cols : src->rows;
    t->shape[1] = src->cols;
    t->data = buf;
    l->owned[l->n++] = buf;
    return VKS_OK;
}

static void list_free(st_list *l) {
    for (size_t i = 0; i < l->n; i++) {
        free(l->owned[i]);
        free((void *)l->t[i].name);
    }
    free(l->t);
    free(l->owned);
}

static int write_weights(const vks_model *m, FILE *f, const char *file, vks_dtype dt) {
    st_list l = {0};
    vks_schema_item *items = NULL;
    int n = 0, rc = vks_schema_list_alloc(&m->cfg, vks_model_has_bias(m), &items, &n);
    char name[MAX_NAME];
    for (int i = 0; i < n && rc == VKS_OK; i++) {
        vks_schema_name(&items[i], VKS_NAME_HF, name, sizeof name);
        rc = list_add(&l, name, vks_model_slot_const(m, &items[i]), items[i].s->rows == VKS_EXT_ONE, dt);
    }
    free(items);
    if (rc == VKS_OK) rc = vks_st_write_stream(f, file, l.t, l.n);
    list_free(&l);
    return rc;
}

/* Removes the tokenizer files of the other kinds (vks_tokenizer_dir_files),
 * which a directory rewritten with a new tokenizer may still hold: the loader
 * would read a stale tokenizer.json before a new tokenizer.gguf. */
static int remove_other_tokenizers(const char *dir, const char *const written[2]) {
    static const char *const all[] = {VKS_TOKENIZER_JSON, VKS_TOKENIZER_CONFIG_JSON, VKS_TOKENIZER_GGUF,
                                      VKS_TOKENIZER_BIN};
    char p[1100];
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
        if ((written[0] && !strcmp(all[i], written[0])) || (written[1] && !strcmp(all[i], written[1]))) continue;
        int rc = join(p, sizeof p, dir, all[i]);
        if (rc != VKS_OK) return rc;
        if (unlink(p) != 0 && errno != ENOENT)
            return vks_set_error(VKS_ERR_IO, "%s: cannot remove the old tokenizer: %s", p, strerror(errno));
    }
    return VKS_OK;
}

/* model.safetensors and config.json (and with tok its tokenizer files, in the
 * form of its kind: vks_tokenizer_dir_files), committed as a set: on any
 * failure none is placed (and an existing set stays as it was). */
static int write_hf_files(const vks_model *f32, const vks_hf_config *hc, const char *dir, vks_dtype dt,
                          const vks_tokenizer *tok) {
    const char *names[4] = {"model.safetensors", "config.json", NULL, NULL};
    size_t n = 2 + (size_t)vks_tokenizer_dir_files(tok, &names[2]);
    char paths[4][1100];
    int rc = VKS_OK;
    for (size_t i = 0; i < n && rc == VKS_OK; i++) rc = join(paths[i], sizeof paths[i], dir, names[i]);
    if (rc != VKS_OK) return rc;
    vks_outfile o[4] = {{0}}; /* weights first: config.json is what marks a model directory */
    for (size_t i = 0; i < n && rc == VKS_OK; i++) rc = vks_outfile_open(&o[i], paths[i], 0666);
    if (rc == VKS_OK) rc = write_weights(f32, o[0].f, paths[0], dt);
    if (rc == VKS_OK) rc = vks_hf_config_write_stream(o[1].f, paths[1], hc, dt);
    if (rc == VKS_OK && tok) {
        FILE *const f[2] = {o[2].f, n > 3 ? o[3].f : NULL};
        const char *const p[2] = {paths[2], n > 3 ? paths[3] : NULL};
        rc = vks_tokenizer_save_dir_files(tok, f, p);
    }
    if (rc != VKS_OK) {
        for (size_t i = 0; i < n; i++) vks_outfile_abort(&o[i]);
        return rc;
    }
    rc = vks_outfile_commit_all(o, n, false);
    if (rc == VKS_OK && tok) rc = remove_other_tokenizers(dir, &names[2]);
    return rc;
}

/* A sharded checkpoint's index would keep shadowing a new model.safetensors. */
static int refuse_sharded_dir(const char *dir) {
    char p[1100];
    int rc = join(p, sizeof p, dir, "model.safetensors.index.json");
    if (rc == VKS_OK && exists(p))
        rc = vks_set_error(VKS_ERR_ARG, "%s: holds a sharded checkpoint (model.safetensors.index.json); "
                                        "write to another directory", dir);
    return rc;
}

int vks_model_save_safetensors(const vks_model *m, const char *dir, const vks_model_save_options *opt) {
    if (!m || !dir) return vks_set_error(VKS_ERR_ARG, "vks_model_save_safetensors: NULL argument");
    vks_dtype dt = opt ? opt->dtype : VKS_DTYPE_F32;
    if (vks_dtype_size(dt) == 0)
        return vks_set_error(VKS_ERR_ARG, "%s: safetensors holds f32, f16 or bf16, not %s", dir, vks_dtype_name(dt));
    if (opt && opt->tokenizer_path)
        return vks_set_error(VKS_ERR_ARG, "%s: a tokenizer file is only embedded in GGUF; pass the tokenizer", dir);
    int rc = refuse_sharded_dir(dir);
    if (rc != VKS_OK) return rc;
    bool created = mkdir(dir, 0777) == 0;
    if (!created && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    vks_model *f32 = NULL;
    rc = vks_model_copy_f32(m, VKS_ROPE_HALF, &f32);
    if (rc == VKS_OK) {
        vks_hf_config hc = {.cfg = f32->cfg, .bos_id = m->bos_id, .eos_id = m->eos_id,
                            .attention_bias = vks_model_has_bias(m)};
        snprintf(hc.arch, sizeof hc.arch, "%s", m->arch);
        rc = write_hf_files(f32, &hc, dir, dt, opt ? opt->tokenizer : NULL);
    }
    vks_model_free(f32);
    if (rc != VKS_OK && created) rmdir(dir); /* nothing of a failed write stays behind */
    return rc;
}
