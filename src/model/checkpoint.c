/* checkpoint.c: training checkpoints (vks_checkpoint.h): the parameter
 * layout, writing a checkpoint directory atomically (HF model through the
 * safetensors writer, Adam moments, tokenizer files, state.json last) and
 * loading one back as hostile input. Directory housekeeping (latest, keep N)
 * is in checkpoint_dir.c. */
#define _GNU_SOURCE /* renameat2 */
#include "vkswarm/vks_checkpoint.h"
#include "model/checkpoint_internal.h"
#include "model/model_internal.h"
#include "vkswarm/vks_safetensors.h"
#include "vkswarm/vks_tokenizer.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <sodium.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_STATE_BYTES (1 << 20)
#define FORMAT_NAME "vkswarm-checkpoint"
#define FORMAT_VERSION 1

/* ---- the layout: the schema's order (vks_ref_params'), with the Hugging Face names ---- */

int vks_param_layout_create(const vks_model_config *cfg, bool has_bias, vks_param_layout **out) {
    if (!cfg || !out) return vks_set_error(VKS_ERR_ARG, "vks_param_layout_create: NULL argument");
    *out = NULL;
    int rc = vks_model_config_check(cfg, "parameter layout");
    if (rc != VKS_OK) return rc;
    int n = vks_schema_list(cfg, has_bias, NULL, 0);
    vks_param_layout *l = calloc(1, sizeof *l);
    if (l) l->tensors = calloc((size_t)n, sizeof *l->tensors);
    if (!l || !l->tensors) {
        vks_param_layout_free(l);
        return vks_set_error(VKS_ERR_NOMEM, "parameter layout: out of memory");
    }
    l->cfg = *cfg;
    l->has_bias = has_bias;
    l->n_tensors = n;
    for (int i = 0; i < n; i++) {
        vks_param_info *t = &l->tensors[i];
        vks_schema_list_nth(cfg, has_bias, i, &t->item);
        vks_schema_name(&t->item, VKS_NAME_INTERNAL, t->name, sizeof t->name);
        t->rows = t->item.rows;
        t->cols = t->item.cols;
        t->offset = l->n_values;
        l->n_values += (size_t)t->rows * (size_t)t->cols;
    }
    *out = l;
    return VKS_OK;
}

void vks_param_layout_free(vks_param_layout *l) {
    if (!l) return;
    free(l->tensors);
    free(l);
}

const vks_param_info *vks_param_layout_find(const vks_param_layout *l, const char *name) {
    for (int i = 0; l && name && i < l->n_tensors; i++)
        if (!strcmp(l->tensors[i].name, name)) return &l->tensors[i];
    return NULL;
}

/* The model tensor of layout entry t (and its Hugging Face name in hf). */
static vks_tensor *model_slot(vks_model *m, const vks_param_info *t, char *hf, size_t cap) {
    vks_schema_name(&t->item, VKS_NAME_HF, hf, cap);
    return vks_model_slot(m, &t->item);
}

bool vks_param_config_same(const vks_model_config *a, const vks_model_config *b) {
    if (!a || !b) return false;
    return a->dim == b->dim && a->hidden_dim == b->hidden_dim && a->n_layers == b->n_layers &&
           a->n_heads == b->n_heads && a->n_kv_heads == b->n_kv_heads && a->vocab_size == b->vocab_size &&
           a->head_dim == b->head_dim && a->kv_dim == b->kv_dim && a->shared_classifier == b->shared_classifier &&
           a->qk_norm == b->qk_norm;
}

int vks_param_layout_gather(const vks_param_layout *l, const vks_model *m, float *block) {
    if (!l || !m || !block || !m->layers) return vks_set_error(VKS_ERR_ARG, "vks_param_layout_gather: NULL argument");
    if (!vks_param_config_same(&l->cfg, &m->cfg) || l->has_bias != vks_model_has_bias(m))
        return vks_set_error(VKS_ERR_ARG, "%s: the model's shape differs from the parameter layout's", m->path);
    char hf[128];
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *t = &l->tensors[i];
        const vks_tensor *src = model_slot((vks_model *)m, t, hf, sizeof hf);
        if (!src || !src->data || src->rows != t->rows || src->cols != t->cols)
            return vks_set_error(VKS_ERR_ARG, "%s: tensor %s is missing or shaped unlike the layout", m->path, t->name);
        for (int64_t r = 0; r < t->rows; r++)
            vks_tensor_row_f32(src, r, block + t->offset + (size_t)r * (size_t)t->cols);
    }
    return VKS_OK;
}

int vks_param_layout_scatter(const vks_param_layout *l, const float *block, vks_model *m) {
    if (!l || !m || !block || !m->layers) return vks_set_error(VKS_ERR_ARG, "vks_param_layout_scatter: NULL argument");
    if (!vks_param_config_same(&l->cfg, &m->cfg) || l->has_bias != vks_model_has_bias(m))
        return vks_set_error(VKS_ERR_ARG, "%s: the model's shape differs from the parameter layout's", m->path);
    char hf[128];
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *t = &l->tensors[i];
        vks_tensor *dst = model_slot(m, t, hf, sizeof hf);
        if (!dst || !dst->data || dst->dtype != VKS_DTYPE_F32 || dst->rows != t->rows || dst->cols != t->cols)
            return vks_set_error(VKS_ERR_ARG, "%s: tensor %s is not f32 or shaped unlike the layout", m->path, t->name);
        /* an f32 model made by vks_model_create_f32 owns its weights */
        memcpy((float *)(uintptr_t)dst->data, block + t->offset, sizeof(float) * (size_t)(t->rows * t->cols));
    }
    return VKS_OK;
}

/* A vks_model whose tensors are views into block (f32, not owned). */
static int model_view(const vks_param_layout *l, const float *block, const char *arch, int bos, int eos,
                      const char *name, vks_model **out) {
    vks_model *m = vks_model_alloc();
    if (!m) return VKS_ERR_NOMEM;
    m->cfg = l->cfg;
    m->bos_id = bos;
    m->eos_id = eos;
    snprintf(m->arch, sizeof m->arch, "%s", arch ? arch : "llama");
    snprintf(m->path, sizeof m->path, "%s", name);
    m->layers = calloc((size_t)l->cfg.n_layers, sizeof *m->layers);
    if (!m->layers) {
        vks_model_free(m);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", name);
    }
    char hf[128];
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *t = &l->tensors[i];
        vks_tensor *slot = model_slot(m, t, hf, sizeof hf);
        *slot = (vks_tensor){VKS_DTYPE_F32, t->rows, t->cols, block + t->offset};
    }
    if (l->cfg.shared_classifier) m->classifier = m->tok_emb;
    *out = m;
    return VKS_OK;
}

/* ---- files: size and BLAKE2b-256 ---- */

static const char *const ckpt_files[] = {"model.safetensors", "config.json", VKS_TOKENIZER_JSON,
                                         VKS_TOKENIZER_CONFIG_JSON, VKS_TOKENIZER_GGUF, VKS_TOKENIZER_BIN,
                                         "optimizer.safetensors", "adapter_model.safetensors",
                                         "adapter_config.json"};
#define N_CKPT_FILES (sizeof ckpt_files / sizeof ckpt_files[0])

bool vks_ckpt_known_file(const char *name) {
    if (!strcmp(name, "state.json")) return true;
    for (size_t i = 0; i < N_CKPT_FILES; i++)
        if (!strcmp(name, ckpt_files[i])) return true;
    return false;
}

static int join(char *out, size_t cap, const char *dir, const char *name) {
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

/* Size and hash of a regular file (not followed through a link). *exists is
 * false when there is no such file. */
static int hash_file(const char *path, bool *exists, uint64_t *size, uint8_t hash[32]) {
    *exists = false;
    int fd = vks_open_read(path, O_NOFOLLOW); /* a FIFO must not block: refused below */
    if (fd < 0 && errno == ENOENT) return VKS_OK;
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file", path);
    }
    if (sodium_init() < 0) {
        close(fd);
        return vks_set_error(VKS_ERR_NOMEM, "%s: libsodium failed to start", path);
    }
    crypto_generichash_state hs;
    crypto_generichash_init(&hs, NULL, 0, 32);
    static _Thread_local uint8_t buf[1 << 16];
    uint64_t total = 0;
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) {
        crypto_generichash_update(&hs, buf, (unsigned long long)n);
        total += (uint64_t)n;
    }
    int e = errno;
    close(fd);
    if (n < 0) return vks_set_error(VKS_ERR_IO, "%s: read failed: %s", path, strerror(e));
    crypto_generichash_final(&hs, hash, 32);
    *exists = true;
    *size = total;
    return VKS_OK;
}

/* {"name": {"bytes": N, "blake2b": hex}} for every checkpoint file in dir. */
static int manifest(const char *dir, json_t *files) {
    char path[4096], hex[65];
    for (size_t i = 0; i < N_CKPT_FILES; i++) {
        bool exists;
        uint64_t size;
        uint8_t hash[32];
        int rc = join(path, sizeof path, dir, ckpt_files[i]);
        if (rc == VKS_OK) rc = hash_file(path, &exists, &size, hash);
        if (rc != VKS_OK) return rc;
        if (!exists) continue;
        vks_hash_hex(hash, hex);
        if (json_object_set_new(files, ckpt_files[i], json_pack("{s:I,s:s}", "bytes", (json_int_t)size, "blake2b", hex)))
            return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    }
    return VKS_OK;
}

/* ---- writing ---- */

/* The first tensor of a block holding NaN or Inf, or NULL. */
static const char *nonfinite_tensor(const vks_param_layout *l, const float *block) {
    for (int i = 0; i < l->n_tensors; i++) {
        const float *p = block + l->tensors[i].offset;
        size_t n = (size_t)l->tensors[i].rows * (size_t)l->tensors[i].cols;
        for (size_t k = 0; k < n; k++)
            if (!isfinite(p[k])) return l->tensors[i].name;
    }
    return NULL;
}

static int check_data(const char *dir, const vks_checkpoint_data *c) {
    if (dir && c && c->lora) return vks_ckpt_lora_check(dir, c);
    if (!dir || !c || !c->layout || !c->weights || (!c->adam_m != !c->adam_v))
        return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_save: missing weights, or only one Adam moment");
    if (c->state.step < 0 || c->state.tokens_seen < 0 || c->state.data.epoch < 0 || c->state.data.index < 0)
        return vks_set_error(VKS_ERR_ARG, "%s: negative step, token count or data position", dir);
    const float *blocks[3] = {c->weights, c->adam_m, c->adam_v};
    const char *what[3] = {"weights", "Adam m", "Adam v"};
    for (int b = 0; b < 3; b++) {
        const char *bad = blocks[b] ? nonfinite_tensor(c->layout, blocks[b]) : NULL;
        if (bad) return vks_set_error(VKS_ERR_ARG, "%s: the %s of tensor %s hold NaN or Inf", dir, what[b], bad);
    }
    return VKS_OK;
}

/* The moments as one list: "exp_avg.<hf>" then "exp_avg_sq.<hf>" per tensor,
 * from f32 copies in half-split RoPE order (the model file's row order). */
static int write_optimizer(const char *path, const vks_checkpoint_data *c, const vks_model *m_half,
                           const vks_model *v_half) {
    const vks_param_layout *l = c->layout;
    vks_st_write_tensor *t = calloc((size_t)l->n_tensors * 2, sizeof *t);
    char (*names)[160] = calloc((size_t)l->n_tensors * 2, sizeof *names);
    int rc = t && names ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    char hf[128];
    for (int i = 0; i < l->n_tensors && rc == VKS_OK; i++)
        for (int k = 0; k < 2; k++) {
            const vks_tensor *src = model_slot((vks_model *)(k ? v_half : m_half), &l->tensors[i], hf, sizeof hf);
            vks_st_write_tensor *w = &t[2 * i + k];
            snprintf(names[2 * i + k], sizeof names[0], "%s.%s", k ? "exp_avg_sq" : "exp_avg", hf);
            w->name = names[2 * i + k];
            w->dtype = VKS_DTYPE_F32;
            w->n_dims = l->tensors[i].item.s->rows == VKS_EXT_ONE ? 1 : 2;
            w->shape[0] = w->n_dims == 1 ? src->cols : src->rows;
            w->shape[1] = src->cols;
            w->data = src->data;
        }
    vks_outfile o;
    if (rc == VKS_OK) rc = vks_outfile_open(&o, path, 0666);
    if (rc == VKS_OK) {
        rc = vks_st_write_stream(o.f, path, t, (size_t)l->n_tensors * 2);
        if (rc == VKS_OK) rc = vks_outfile_commit(&o);
        else vks_outfile_abort(&o);
    }
    free(names);
    free(t);
    return rc;
}

static int save_optimizer(const char *dir, const vks_checkpoint_data *c) {
    if (!c->adam_m) return VKS_OK;
    char path[4096];
    vks_model *views[2] = {NULL, NULL}, *half[2] = {NULL, NULL};
    int rc = join(path, sizeof path, dir, "optimizer.safetensors");
    const float *blocks[2] = {c->adam_m, c->adam_v};
    for (int k = 0; k < 2 && rc == VKS_OK; k++) {
        rc = model_view(c->layout, blocks[k], c->arch, c->bos_id, c->eos_id, path, &views[k]);
        if (rc == VKS_OK) rc = vks_model_copy_f32(views[k], VKS_ROPE_HALF, &half[k]);
    }
    if (rc == VKS_OK) rc = write_optimizer(path, c, half[0], half[1]);
    for (int k = 0; k < 2; k++) {
        vks_model_free(views[k]);
        vks_model_free(half[k]);
    }
    return rc;
}

static int copy_file(const char *src, const char *dst) {
    FILE *in = NULL;
    int rc = vks_fopen_regular(src, &in);
    if (rc != VKS_OK) return rc;
    vks_outfile o;
    rc = vks_outfile_open(&o, dst, 0666);
    if (rc != VKS_OK) {
        fclose(in);
        return rc;
    }
    char buf[1 << 14];
    size_t n;
    bool ok = true;
    while (ok && (n = fread(buf, 1, sizeof buf, in)) > 0) ok = fwrite(buf, 1, n, o.f) == n;
    bool read_failed = ferror(in);
    fclose(in);
    if (read_failed) {
        vks_outfile_abort(&o);
        return vks_set_error(VKS_ERR_IO, "%s: read failed", src);
    }
    return vks_outfile_finish(&o, ok);
}

static int copy_tokenizer(const char *dir, const char *from) {
    if (!from) return VKS_OK;
    const char *names[2] = {"tokenizer.json", "tokenizer_config.json"};
    char src[4096], dst[4096];
    int rc = VKS_OK;
    for (int i = 0; i < 2 && rc == VKS_OK; i++) {
        rc = join(src, sizeof src, from, names[i]);
        if (rc == VKS_OK) rc = join(dst, sizeof dst, dir, names[i]);
        if (rc != VKS_OK) break;
        if (i == 1 && access(src, F_OK) != 0) break; /* tokenizer_config.json is optional */
        rc = copy_file(src, dst);
    }
    return rc;
}

/* Unsigned 64-bit values are strings: JSON integers stop at 2^63 in jansson. */
static json_t *u64_json(uint64_t v) {
    char s[24];
    snprintf(s, sizeof s, "%" PRIu64, v);
    return json_string(s);
}

static json_t *state_json(const vks_ckpt_state *s) {
    return json_pack(
        "{s:s,s:i,s:I,s:I,s:o,s:{s:o,s:I,s:I,s:s},s:{s:o,s:o},s:{s:f,s:f,s:f,s:f,s:f,s:f},"
        "s:{s:f,s:f,s:i,s:i,s:b}}",
        "format", FORMAT_NAME, "version", FORMAT_VERSION, "step", (json_int_t)s->step, "tokens_seen",
        (json_int_t)s->tokens_seen, "seed", u64_json(s->seed), "data", "seed", u64_json(s->data.seed), "epoch",
        (json_int_t)s->data.epoch, "index", (json_int_t)s->data.index, "hash", s->data_hash, "rng", "key",
        u64_json(s->rng_key), "counter", u64_json(s->rng_counter), "optimizer", "lr", s->adam.lr, "beta1",
        s->adam.beta1, "beta2", s->adam.beta2, "eps", s->adam.eps, "weight_decay", s->adam.weight_decay, "grad_clip",
        s->grad_clip, "schedule", "lr", s->schedule.lr, "min_lr", s->schedule.min_lr, "warmup_steps",
        s->schedule.warmup_steps, "total_steps", s->schedule.total_steps, "cosine", s->schedule.cosine);
}

/* state.json: the state, the manifest of the files already in dir, "complete". */
static int save_state(const char *dir, const vks_ckpt_state *s) {
    char path[4096];
    int rc = join(path, sizeof path, dir, "state.json");
    if (rc != VKS_OK) return rc;
    if (strlen(s->data_hash) != 0 && strlen(s->data_hash) != 64)
        return vks_set_error(VKS_ERR_ARG, "%s: data_hash must be 64 hex digits or empty", path);
    json_t *root = state_json(s), *files = json_object(), *extra = NULL;
    if (!root || !files) rc = vks_set_error(VKS_ERR_NOMEM, "%s: cannot build JSON", path);
    if (rc == VKS_OK && s->extra_json) {
        extra = json_loads(s->extra_json, JSON_REJECT_DUPLICATES, NULL);
        if (!json_is_object(extra)) rc = vks_set_error(VKS_ERR_ARG, "%s: extra_json is not a JSON object", path);
        else json_object_set(root, "extra", extra);
    }
    if (rc == VKS_OK) rc = manifest(dir, files);
    if (rc == VKS_OK && (json_object_set(root, "files", files) || json_object_set_new(root, "complete", json_true())))
        rc = vks_set_error(VKS_ERR_NOMEM, "%s: cannot build JSON", path);
    vks_outfile o;
    if (rc == VKS_OK) rc = vks_outfile_open(&o, path, 0666);
    if (rc == VKS_OK) {
        bool ok = json_dumpf(root, o.f, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17)) == 0 &&
                  putc('\n', o.f) != EOF;
        rc = vks_outfile_finish(&o, ok);
    }
    json_decref(extra);
    json_decref(files);
    json_decref(root);
    return rc;
}

static int write_all(const char *tmp, const vks_checkpoint_data *c) {
    if (c->lora) {
        int rc = vks_ckpt_lora_write(tmp, c);
        if (rc == VKS_OK) rc = save_state(tmp, &c->state);
        return rc == VKS_OK ? vks_ckpt_sync_dir(tmp) : rc;
    }
    vks_model *view = NULL;
    vks_model_save_options opt = c->save ? *c->save : (vks_model_save_options){0};
    opt.dtype = VKS_DTYPE_F32; /* the masters, exactly */
    int rc = model_view(c->layout, c->weights, c->arch, c->bos_id, c->eos_id, tmp, &view);
    if (rc == VKS_OK) rc = vks_model_save_safetensors(view, tmp, &opt);
    vks_model_free(view);
    if (rc == VKS_OK) rc = save_optimizer(tmp, c);
    if (rc == VKS_OK) rc = copy_tokenizer(tmp, c->tokenizer_dir);
    if (rc == VKS_OK) rc = save_state(tmp, &c->state);
    if (rc == VKS_OK) rc = vks_ckpt_sync_dir(tmp);
    return rc;
}

static int make_temp_dir(const char *dir, char *tmp, size_t cap) {
    static atomic_uint counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        if ((size_t)snprintf(tmp, cap, "%s.tmp-%ld-%u", dir, (long)getpid(), atomic_fetch_add(&counter, 1)) >= cap)
            return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
        if (mkdir(tmp, 0777) == 0) return VKS_OK;
        if (errno != EEXIST) return vks_set_error(VKS_ERR_IO, "%s: cannot create a directory beside it: %s", dir, strerror(errno));
    }
    return vks_set_error(VKS_ERR_IO, "%s: cannot find a free temporary name", dir);
}

/* Puts the finished temporary at dir: a plain rename when dir is new, else an
 * atomic exchange (a rename aside where the file system cannot exchange)
 * and the old checkpoint removed. */
static int place_dir(const char *tmp, const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) {
        if (rename(tmp, dir) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot rename into place: %s", dir, strerror(errno));
        return VKS_OK;
    }
    /* Once the new checkpoint is in place the save has succeeded: an old one
     * that cannot be removed stays under its temporary name, which a later
     * vks_checkpoint_prune removes when this process has ended. */
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dir, RENAME_EXCHANGE) == 0) { /* tmp now names the old one */
        vks_ckpt_remove_dir(tmp);
        return VKS_OK;
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return vks_set_error(VKS_ERR_IO, "%s: cannot replace: %s", dir, strerror(errno));
    char old[4200];
    snprintf(old, sizeof old, "%s.old-%ld-0", dir, (long)getpid());
    if (rename(dir, old) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot move aside: %s", dir, strerror(errno));
    if (rename(tmp, dir) != 0) {
        int e = errno;
        rename(old, dir);
        return vks_set_error(VKS_ERR_IO, "%s: cannot rename into place: %s", dir, strerror(e));
    }
    vks_ckpt_remove_dir(old);
    return VKS_OK;
}

/* An existing dir may be replaced only when it is a checkpoint-shaped directory. */
static int check_replaceable(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0) return VKS_OK;
    if (!S_ISDIR(st.st_mode)) return vks_set_error(VKS_ERR_IO, "%s: exists and is not a directory", dir);
    int r = vks_ckpt_only_our_files(dir);
    if (r < 0) return r;
    if (!r) return vks_set_error(VKS_ERR_IO, "%s: exists and holds files that are not a checkpoint's (not replaced)", dir);
    char state[4200];
    snprintf(state, sizeof state, "%s/state.json", dir);
    if (lstat(state, &st) != 0) /* only a writer's rename makes step-N: without state.json it is not ours */
        return vks_set_error(VKS_ERR_IO, "%s: exists and is not a complete checkpoint (no state.json; not replaced)", dir);
    return VKS_OK;
}

int vks_checkpoint_save(const char *dir_arg, const vks_checkpoint_data *c) {
    char dir[4096];
    int rc = check_data(dir_arg, c);
    if (rc == VKS_OK && (size_t)snprintf(dir, sizeof dir, "%s", dir_arg) >= sizeof dir)
        rc = vks_set_error(VKS_ERR_ARG, "%s: path too long", dir_arg);
    if (rc != VKS_OK) return rc;
    for (size_t n = strlen(dir); n > 1 && dir[n - 1] == '/'; n--) dir[n - 1] = '\0'; /* "out/step-1/": beside it, not in it */
    rc = check_replaceable(dir);
    if (rc != VKS_OK) return rc;
    char tmp[4200];
    rc = make_temp_dir(dir, tmp, sizeof tmp);
    if (rc != VKS_OK) return rc;
    rc = write_all(tmp, c);
    if (rc == VKS_OK) rc = place_dir(tmp, dir);
    else vks_ckpt_remove_dir(tmp); /* ours entirely: nothing of a failed write stays */
    if (rc == VKS_OK) rc = vks_ckpt_sync_parent(dir);
    return rc;
}

/* ---- loading ---- */

typedef struct {
    const char *path; /* state.json, for messages */
    json_t *root;
} state_reader;

static int bad_field(const state_reader *r, const char *key, const char *problem) {
    return vks_set_error(VKS_ERR_FORMAT, "%s: \"%s\" %s", r->path, key, problem);
}

static int get_i64(const state_reader *r, json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return bad_field(r, key, "is missing or not an integer");
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi) return bad_field(r, key, "is out of range");
    *out = x;
    return VKS_OK;
}

static int get_int(const state_reader *r, json_t *o, const char *key, int *out) {
    int64_t x = 0;
    int rc = get_i64(r, o, key, 0, INT32_MAX, &x);
    *out = (int)x;
    return rc;
}

static int get_u64(const state_reader *r, json_t *o, const char *key, uint64_t *out) {
    const char *s = json_string_value(json_object_get(o, key));
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > 20 || strspn(s, "0123456789") != n) return bad_field(r, key, "is not a decimal string");
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE) return bad_field(r, key, "is out of range");
    *out = (uint64_t)v;
    return VKS_OK;
}

static int get_real(const state_reader *r, json_t *o, const char *key, double lo, double hi, double *out) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v)) return bad_field(r, key, "is missing or not a number");
    double x = json_number_value(v);
    if (!isfinite(x) || x < lo || x > hi) return bad_field(r, key, "is out of range");
    *out = x;
    return VKS_OK;
}

static json_t *get_object(const state_reader *r, json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    if (!json_is_object(v)) bad_field(r, key, "is missing or not an object");
    return json_is_object(v) ? v : NULL;
}

static int read_data_position(const state_reader *r, vks_ckpt_state *s) {
    json_t *d = get_object(r, r->root, "data");
    if (!d) return VKS_ERR_FORMAT;
    int rc = get_u64(r, d, "seed", &s->data.seed);
    if (rc == VKS_OK) rc = get_i64(r, d, "epoch", 0, UINT32_MAX, &s->data.epoch);
    if (rc == VKS_OK) rc = get_i64(r, d, "index", 0, INT64_MAX, &s->data.index);
    const char *hash = json_string_value(json_object_get(d, "hash"));
    uint8_t bytes[32];
    if (rc == VKS_OK && (!hash || (hash[0] && vks_hash_parse_hex(hash, bytes) != 0)))
        rc = bad_field(r, "hash", "is not 64 hex digits or empty");
    if (rc == VKS_OK) snprintf(s->data_hash, sizeof s->data_hash, "%s", hash);
    return rc;
}

static int read_optimizer(const state_reader *r, vks_ckpt_state *s) {
    json_t *o = get_object(r, r->root, "optimizer"), *sc = o ? get_object(r, r->root, "schedule") : NULL;
    if (!sc) return VKS_ERR_FORMAT;
    int rc = get_real(r, o, "lr", 0, 1e9, &s->adam.lr);
    if (rc == VKS_OK) rc = get_real(r, o, "beta1", 0, 1, &s->adam.beta1);
    if (rc == VKS_OK) rc = get_real(r, o, "beta2", 0, 1, &s->adam.beta2);
    if (rc == VKS_OK) rc = get_real(r, o, "eps", 0, 1e9, &s->adam.eps);
    if (rc == VKS_OK) rc = get_real(r, o, "weight_decay", 0, 1e9, &s->adam.weight_decay);
    if (rc == VKS_OK) rc = get_real(r, o, "grad_clip", -1e300, 1e300, &s->grad_clip);
    if (rc == VKS_OK) rc = get_real(r, sc, "lr", 0, 1e9, &s->schedule.lr);
    if (rc == VKS_OK) rc = get_real(r, sc, "min_lr", 0, 1e9, &s->schedule.min_lr);
    if (rc == VKS_OK) rc = get_int(r, sc, "warmup_steps", &s->schedule.warmup_steps);
    if (rc == VKS_OK) rc = get_int(r, sc, "total_steps", &s->schedule.total_steps);
    json_t *cos = json_object_get(sc, "cosine");
    if (rc == VKS_OK && !json_is_boolean(cos)) rc = bad_field(r, "cosine", "is not true or false");
    if (rc == VKS_OK) s->schedule.cosine = json_is_true(cos);
    return rc;
}

static int read_header(const state_reader *r) {
    const char *format = json_string_value(json_object_get(r->root, "format"));
    if (!format || strcmp(format, FORMAT_NAME) != 0)
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a vkswarm checkpoint state (\"format\")", r->path);
    int64_t version = 0;
    int rc = get_i64(r, r->root, "version", 0, INT32_MAX, &version);
    if (rc == VKS_OK && version != FORMAT_VERSION)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: checkpoint version %lld (this build reads %d)", r->path,
                           (long long)version, FORMAT_VERSION);
    if (rc == VKS_OK && !json_is_true(json_object_get(r->root, "complete")))
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: the checkpoint is not complete", r->path);
    return rc;
}

/* Every field of state.json but the file list; extra_json into *extra. */
static int read_state(const state_reader *r, vks_ckpt_state *s, char **extra) {
    int rc = read_header(r);
    if (rc == VKS_OK) rc = get_i64(r, r->root, "step", 0, VKS_CKPT_MAX_STEP, &s->step);
    if (rc == VKS_OK) rc = get_i64(r, r->root, "tokens_seen", 0, INT64_MAX, &s->tokens_seen);
    if (rc == VKS_OK) rc = get_u64(r, r->root, "seed", &s->seed);
    if (rc == VKS_OK) rc = read_data_position(r, s);
    json_t *rng = rc == VKS_OK ? get_object(r, r->root, "rng") : NULL;
    if (rc == VKS_OK) rc = rng ? get_u64(r, rng, "key", &s->rng_key) : VKS_ERR_FORMAT;
    if (rc == VKS_OK) rc = get_u64(r, rng, "counter", &s->rng_counter);
    if (rc == VKS_OK) rc = read_optimizer(r, s);
    json_t *x = json_object_get(r->root, "extra");
    if (rc == VKS_OK && x && !json_is_object(x)) rc = bad_field(r, "extra", "is not an object");
    if (rc == VKS_OK && x && !(*extra = json_dumps(x, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17))))
        rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", r->path);
    s->extra_json = *extra;
    return rc;
}

/* Every file state.json lists has its size and hash; model.safetensors and
 * config.json must be listed (lora: adapter_model.safetensors and
 * adapter_config.json). *has_optimizer: optimizer.safetensors is. */
static int verify_files(const state_reader *r, const char *dir, bool lora, bool *has_optimizer) {
    json_t *files = get_object(r, r->root, "files");
    if (!files) return VKS_ERR_FORMAT;
    bool has_model = json_object_get(files, "model.safetensors") && json_object_get(files, "config.json");
    bool has_adapter = json_object_get(files, "adapter_model.safetensors") && json_object_get(files, "adapter_config.json");
    if (lora && !has_adapter)
        return vks_set_error(VKS_ERR_FORMAT, "%s: lists no adapter_model.safetensors and adapter_config.json: %s", r->path,
                             has_model ? "a full fine-tuning checkpoint, not a LoRA run's" : "not a LoRA checkpoint");
    if (!lora && !has_model)
        return vks_set_error(VKS_ERR_FORMAT, "%s: lists no model.safetensors and config.json%s", r->path,
                             has_adapter ? ": a LoRA run's checkpoint (an adapter), not a full model's" : "");
    *has_optimizer = json_object_get(files, "optimizer.safetensors") != NULL;
    const char *name;
    json_t *v;
    json_object_foreach(files, name, v) {
        if (!vks_ckpt_known_file(name) || !strcmp(name, "state.json"))
            return vks_set_error(VKS_ERR_FORMAT, "%s: lists an unknown file '%s'", r->path, name);
        json_t *bytes = json_object_get(v, "bytes");
        const char *hex = json_string_value(json_object_get(v, "blake2b"));
        uint8_t want[32], got[32];
        if (!json_is_integer(bytes) || json_integer_value(bytes) < 0 || !hex || vks_hash_parse_hex(hex, want) != 0)
            return vks_set_error(VKS_ERR_FORMAT, "%s: the entry of %s needs \"bytes\" and a \"blake2b\" hash", r->path, name);
        char path[4096];
        bool exists;
        uint64_t size = 0;
        int rc = join(path, sizeof path, dir, name);
        if (rc == VKS_OK) rc = hash_file(path, &exists, &size, got);
        if (rc != VKS_OK) return rc;
        if (!exists) return vks_set_error(VKS_ERR_FORMAT, "%s: missing (listed in state.json)", path);
        if (size != (uint64_t)json_integer_value(bytes))
            return vks_set_error(VKS_ERR_FORMAT, "%s: %llu bytes, state.json says %lld (truncated or changed)", path,
                                 (unsigned long long)size, (long long)json_integer_value(bytes));
        if (sodium_memcmp(want, got, 32) != 0)
            return vks_set_error(VKS_ERR_FORMAT, "%s: contents differ from the hash in state.json (corrupt)", path);
    }
    return VKS_OK;
}

static int read_state_file(const char *path, json_t **root) {
    *root = NULL;
    int fd = vks_open_read(path, O_NOFOLLOW); /* a FIFO must not block: refused below */
    if (fd < 0 && errno == ENOENT)
        return vks_set_error(VKS_ERR_FORMAT, "%s: missing: not a complete checkpoint", path);
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    char *buf = NULL;
    int rc = VKS_OK;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size > MAX_STATE_BYTES)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file of at most 1 MiB", path);
    if (rc == VKS_OK && !(buf = malloc((size_t)st.st_size + 1))) rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (rc == VKS_OK && read(fd, buf, (size_t)st.st_size) != (ssize_t)st.st_size)
        rc = vks_set_error(VKS_ERR_IO, "%s: read failed", path);
    close(fd);
    const char *nul = rc == VKS_OK ? memchr(buf, 0, (size_t)st.st_size) : NULL;
    if (nul) rc = vks_set_error(VKS_ERR_FORMAT, "%s: a NUL byte at offset %zu", path, (size_t)(nul - buf));
    json_error_t err;
    if (rc == VKS_OK && !(*root = json_loadb(buf, (size_t)st.st_size, JSON_REJECT_DUPLICATES, &err)))
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: bad JSON (incomplete?): %s", path, err.text);
    if (rc == VKS_OK && !json_is_object(*root)) rc = vks_set_error(VKS_ERR_FORMAT, "%s: not a JSON object", path);
    free(buf);
    return rc;
}

/* One moment tensor: f32, the model file's shape convention, finite (and >= 0 for v). */
static int load_moment(const vks_st_file *f, const char *path, const char *name, const vks_param_info *t,
                       bool nonneg, float *dst) {
    const vks_st_tensor *st = vks_st_find(f, name);
    if (!st) return vks_set_error(VKS_ERR_FORMAT, "%s: missing tensor %s", path, name);
    bool vec = st->n_dims == 1 && t->rows == 1 && st->shape[0] == t->cols;
    bool mat = st->n_dims == 2 && st->shape[0] == t->rows && st->shape[1] == t->cols;
    if (st->dtype != VKS_DTYPE_F32 || (!vec && !mat))
        return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s is not f32 [%lld, %lld]", path, name, (long long)t->rows,
                             (long long)t->cols);
    size_t n = (size_t)t->rows * (size_t)t->cols;
    memcpy(dst, st->data, n * sizeof(float));
    for (size_t i = 0; i < n; i++)
        if (!isfinite(dst[i]) || (nonneg && dst[i] < 0))
            return vks_set_error(VKS_ERR_FORMAT, "%s: tensor %s holds %s", path, name,
                                 isfinite(dst[i]) ? "a negative second moment" : "NaN or Inf");
    return VKS_OK;
}

/* K of vks_checkpoint_load's bound |m| <= K sqrt(v) after `steps` Adam
 * updates (infinite when the betas allow no bound). */
double vks_ckpt_moment_bound(const vks_ckpt_state *s) {
    double b1 = s->adam.beta1, b2 = s->adam.beta2;
    if (b2 >= 1 || (b2 == 0 && b1 > 0)) return INFINITY; /* (resuming runs refuse betas other than theirs) */
    double r = b1 > 0 ? b1 * b1 / b2 : 0, t = (double)s->step;
    double sum = r == 1 ? t : (1 - pow(r, t)) / (1 - r); /* sum_{k<t} r^k */
    return (1 - b1) / sqrt(1 - b2) * sqrt(sum);
}

/* Moments a run of state.step steps could have made: 1e-3 relative for f32
 * rounding, and MOMENT_FLOOR for squares of gradients below 1e-19 that
 * flush to 0 in v (m then stays below ~1e-18; an update from m this small
 * over eps is below 1e-7 lr). */
#define MOMENT_FLOOR VKS_CKPT_MOMENT_FLOOR
static int check_moment_sizes(const vks_checkpoint *c, const char *path) {
    double k = vks_ckpt_moment_bound(&c->state) * (1 + 1e-3);
    if (!(k < INFINITY)) return VKS_OK;
    for (int t = 0; t < c->layout->n_tensors; t++) {
        const vks_param_info *p = &c->layout->tensors[t];
        for (size_t i = p->offset; i < p->offset + (size_t)p->rows * (size_t)p->cols; i++)
            if (fabs((double)c->adam_m[i]) > k * sqrt((double)c->adam_v[i]) + MOMENT_FLOOR)
                return vks_set_error(VKS_ERR_FORMAT,
                                     "%s: the first moment of %s is %.3g where %lld Adam steps (betas %g, %g) allow at "
                                     "most %.3g (corrupt)",
                                     path, p->name, (double)c->adam_m[i], (long long)c->state.step, c->state.adam.beta1,
                                     c->state.adam.beta2, k * sqrt((double)c->adam_v[i]) + MOMENT_FLOOR);
    }
    return VKS_OK;
}

static int load_moments(vks_checkpoint *c, const vks_model *model, const char *dir) {
    char path[4096];
    int rc = join(path, sizeof path, dir, "optimizer.safetensors");
    vks_st_file *f = NULL;
    if (rc == VKS_OK) rc = vks_st_open(path, &f);
    if (rc != VKS_OK) return rc;
    const vks_param_layout *l = c->layout;
    if (vks_st_n_tensors(f) != 2 * (int64_t)l->n_tensors)
        rc = vks_set_error(VKS_ERR_FORMAT, "%s: %lld tensors, the model needs %d", path, (long long)vks_st_n_tensors(f),
                           2 * l->n_tensors);
    c->adam_m = rc == VKS_OK ? malloc(l->n_values * sizeof(float)) : NULL;
    c->adam_v = rc == VKS_OK ? malloc(l->n_values * sizeof(float)) : NULL;
    if (rc == VKS_OK && (!c->adam_m || !c->adam_v)) rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    char hf[128], name[160];
    for (int i = 0; i < l->n_tensors && rc == VKS_OK; i++) {
        const vks_param_info *t = &l->tensors[i];
        model_slot((vks_model *)model, t, hf, sizeof hf);
        snprintf(name, sizeof name, "exp_avg.%s", hf);
        rc = load_moment(f, path, name, t, false, c->adam_m + t->offset);
        snprintf(name, sizeof name, "exp_avg_sq.%s", hf);
        if (rc == VKS_OK) rc = load_moment(f, path, name, t, true, c->adam_v + t->offset);
    }
    vks_st_close(f);
    if (rc == VKS_OK) rc = check_moment_sizes(c, path);
    return rc;
}

static int load_model(vks_checkpoint *c, const char *dir, bool has_optimizer) {
    vks_model *m = NULL;
    char path[4096];
    /* the file, not the directory: a model.safetensors.index.json put beside
     * it would send the reader to shards that state.json does not vouch for */
    int rc = join(path, sizeof path, dir, "model.safetensors");
    if (rc == VKS_OK) rc = vks_model_load_safetensors(path, &m);
    if (rc == VKS_OK) rc = vks_param_layout_create(&m->cfg, vks_model_has_bias(m), &c->layout);
    if (rc == VKS_OK && !(c->weights = malloc(c->layout->n_values * sizeof(float))))
        rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", dir);
    if (rc == VKS_OK) rc = vks_param_layout_gather(c->layout, m, c->weights);
    if (rc == VKS_OK && has_optimizer) rc = load_moments(c, m, dir);
    if (rc == VKS_OK) {
        snprintf(c->arch, sizeof c->arch, "%s", m->arch);
        c->bos_id = m->bos_id;
        c->eos_id = m->eos_id;
    }
    vks_model_free(m);
    return rc;
}

/* A directory named step-N holds the state of step N. */
static int check_step_name(const char *dir, const char *state_path, int64_t step) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && dir[b - 1] != '/') b--;
    char name[256];
    int64_t named = 0;
    if (n - b >= sizeof name) return VKS_OK;
    memcpy(name, dir + b, n - b);
    name[n - b] = '\0';
    if (!vks_ckpt_step_name(name, &named) || named == step) return VKS_OK;
    return vks_set_error(VKS_ERR_FORMAT, "%s: \"step\" is %lld, the directory's name says %lld", state_path,
                         (long long)step, (long long)named);
}

/* Either kind: base NULL for a full model's checkpoint. */
static int load_any(const char *dir, const vks_model *base, vks_checkpoint **out) {
    if (!dir || !out) return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_load: NULL argument");
    *out = NULL;
    vks_checkpoint *c = calloc(1, sizeof *c);
    if (!c) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    char path[4096];
    char *extra = NULL;
    bool has_optimizer = false;
    state_reader r = {path, NULL};
    int rc = join(path, sizeof path, dir, "state.json");
    if (rc == VKS_OK) rc = read_state_file(path, &r.root);
    if (rc == VKS_OK) rc = read_state(&r, &c->state, &extra);
    if (rc == VKS_OK) rc = check_step_name(dir, path, c->state.step);
    if (rc == VKS_OK) rc = verify_files(&r, dir, base != NULL, &has_optimizer);
    json_decref(r.root);
    if (rc == VKS_OK) rc = base ? vks_ckpt_lora_load(c, dir, base, has_optimizer) : load_model(c, dir, has_optimizer);
    if (rc != VKS_OK) {
        vks_checkpoint_free(c); /* extra, once read, is c->state.extra_json */
        return rc;
    }
    *out = c;
    return VKS_OK;
}

int vks_checkpoint_load(const char *dir, vks_checkpoint **out) { return load_any(dir, NULL, out); }

int vks_checkpoint_load_lora(const char *dir, const vks_model *base, vks_checkpoint **out) {
    if (!base) return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_load_lora: NULL base");
    return load_any(dir, base, out);
}

void vks_checkpoint_free(vks_checkpoint *c) {
    if (!c) return;
    vks_lora_adapter_free(c->lora);
    vks_param_layout_free(c->layout);
    free(c->weights);
    free(c->adam_m);
    free(c->adam_v);
    free((char *)c->state.extra_json);
    free(c);
}
