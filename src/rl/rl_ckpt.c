/* rl_ckpt.c: a trainer's state as a checkpoint, and the output directory of a
 * training run (rl_internal.h), shared by the SFT run and the RL run. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>
#include "rl_internal.h"
#include "vkswarm/vks_metrics.h"

#define LOCK_NAME "vkswarm.lock"

int vks_rl_move_set(vks_trainer *t, const vks_param_layout *l, vks_param_kind set, float *block, bool to_block) {
    for (int i = 0; i < l->n_tensors; i++) {
        const vks_param_info *p = &l->tensors[i];
        int ti = vks_trainer_find_tensor(t, p->name);
        if (ti < 0) return vks_set_error(VKS_ERR_FORMAT, "checkpoint: its tensor %s is not the model's", p->name);
        int rc = to_block ? vks_trainer_read(t, set, ti, block + p->offset) : vks_trainer_write(t, set, ti, block + p->offset);
        if (rc) return rc;
    }
    return VKS_OK;
}

/* A failed save leaves the checkpoints before it as they were: says which one a resume would take. */
static int save_failed(int rc, const char *out_dir, const char *dir) {
    char why[1024], kept[4096];
    snprintf(why, sizeof why, "%s", vks_last_error());
    bool found = false;
    if (vks_checkpoint_latest(out_dir, kept, sizeof kept, &found) != VKS_OK) found = false;
    if (found)
        return vks_set_error(rc, "%s (checkpoint %s not saved, nothing of it left; %s is as it was, and --resume "
                             "continues from it)", why, dir, kept);
    return vks_set_error(rc, "%s (checkpoint %s not saved, nothing of it left; %s holds no earlier checkpoint)", why,
                         dir, out_dir);
}

int vks_rl_save_trainer(vks_trainer *t, const vks_param_layout *l, const vks_model *m,
                        const struct vks_tokenizer *tok, const vks_ckpt_state *state, const char *out_dir, int keep,
                        char *dir, size_t cap) {
    size_t n = l->n_values;
    float *w = malloc(sizeof *w * n), *mo = malloc(sizeof *mo * n), *v = malloc(sizeof *v * n);
    int rc = w && mo && v ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "checkpoint: out of host memory");
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_PARAMS, w, true);
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_ADAM_M, mo, true);
    if (!rc) rc = vks_rl_move_set(t, l, VKS_SET_ADAM_V, v, true);
    vks_model_save_options save = {.dtype = VKS_DTYPE_F32, .tokenizer = tok};
    vks_checkpoint_data c = {.layout = l, .weights = w, .adam_m = mo, .adam_v = v, .arch = m->arch,
                             .bos_id = m->bos_id, .eos_id = m->eos_id, .save = &save, .state = *state};
    if (!rc) rc = vks_checkpoint_step_dir(out_dir, state->step, dir, cap);
    if (!rc && (rc = vks_checkpoint_save(dir, &c))) rc = save_failed(rc, out_dir, dir);
    /* only what this run wrote: never a checkpoint newer than the one just saved */
    if (!rc && keep > 0) rc = vks_checkpoint_prune(out_dir, keep, state->step, NULL);
    free(w);
    free(mo);
    free(v);
    return rc;
}

int vks_rl_move_lora_set(vks_trainer *t, vks_param_kind set, float *block, size_t n, bool to_block) {
    size_t at = 0;
    for (int i = 0; i < vks_trainer_n_tensors(t); i++) {
        vks_train_tensor_info info;
        int rc = vks_trainer_tensor_info(t, i, &info);
        size_t count = rc ? 0 : (size_t)(info.rows * info.cols);
        if (!rc && count > n - at) rc = vks_set_error(VKS_ERR_FORMAT, "checkpoint: fewer values than the adapter's");
        if (!rc) rc = to_block ? vks_trainer_read(t, set, i, block + at) : vks_trainer_write(t, set, i, block + at);
        if (rc) return rc;
        at += count;
    }
    return at == n ? VKS_OK : vks_set_error(VKS_ERR_FORMAT, "checkpoint: more values than the adapter's");
}

int vks_rl_save_lora(vks_trainer *t, vks_lora_adapter *a, const vks_ckpt_state *state, const char *out_dir, int keep,
                     char *dir, size_t cap) {
    const vks_lora_config *lc = vks_lora_adapter_config(a);
    int64_t n = vks_lora_param_count(vks_lora_adapter_base_config(a), lc->rank, lc->targets);
    /* the trained final norm (modules_to_save): exported into a below, its moments here */
    if (vks_trainer_find_tensor(t, "norm") >= 0) n += vks_lora_adapter_base_config(a)->dim;
    float *mo = n > 0 ? malloc(sizeof *mo * (size_t)n) : NULL, *v = n > 0 ? malloc(sizeof *v * (size_t)n) : NULL;
    int rc = mo && v ? VKS_OK : vks_set_error(VKS_ERR_NOMEM, "checkpoint: out of host memory");
    if (!rc) rc = vks_trainer_export_lora(t, a);
    if (!rc) rc = vks_rl_move_lora_set(t, VKS_SET_ADAM_M, mo, (size_t)n, true);
    if (!rc) rc = vks_rl_move_lora_set(t, VKS_SET_ADAM_V, v, (size_t)n, true);
    vks_checkpoint_data c = {.adam_m = mo, .adam_v = v, .state = *state, .lora = a};
    if (!rc) rc = vks_checkpoint_step_dir(out_dir, state->step, dir, cap);
    if (!rc && (rc = vks_checkpoint_save(dir, &c))) rc = save_failed(rc, out_dir, dir);
    if (!rc && keep > 0) rc = vks_checkpoint_prune(out_dir, keep, state->step, NULL);
    free(mo);
    free(v);
    return rc;
}

int vks_rl_close_metrics(vks_metrics *m, int rc) {
    if (!rc) return vks_metrics_close(m);
    char why[2048];
    snprintf(why, sizeof why, "%s", vks_last_error());
    vks_metrics_close(m);
    return vks_set_error(rc, "%s", why);
}

/* ---- the output directory ---- */

/* The holder's "pid N on host H" from the lock file, printable ASCII only. */
static void read_holder(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    size_t len = n > 0 ? (size_t)n : 0;
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) len--;
    for (size_t i = 0; i < len; i++)
        if (buf[i] < 0x20 || buf[i] > 0x7e) buf[i] = '?';
    buf[len] = '\0';
    if (!len) snprintf(buf, cap, "pid and host not yet recorded");
}

static int write_holder(int fd, const char *path) {
    char host[256] = "", text[400];
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    int n = snprintf(text, sizeof text, "pid %ld on host %s\n", (long)getpid(), host);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)n, 0) != n)
        return vks_set_error(VKS_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return VKS_OK;
}

int vks_rl_out_lock(vks_rl_out_dir *d, const char *out) {
    d->fd = -1;
    struct stat st;
    if (mkdir(out, 0777) != 0 && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create the directory: %s", out, strerror(errno));
    if (stat(out, &st) != 0 || !S_ISDIR(st.st_mode)) return vks_set_error(VKS_ERR_ARG, "%s: not a directory", out);
    if ((size_t)snprintf(d->lock, sizeof d->lock, "%s/%s", out, LOCK_NAME) >= sizeof d->lock)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", out);
    for (int attempt = 0; attempt < 16; attempt++) {
        int fd = open(d->lock, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
        if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", d->lock, strerror(errno));
        if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
            int e = errno;
            char holder[256];
            if (e == EWOULDBLOCK) read_holder(fd, holder, sizeof holder);
            close(fd);
            if (e == EWOULDBLOCK)
                return vks_set_error(VKS_ERR_ARG, "%s: another run is writing there (%s): wait for it to end, or choose "
                                     "another --out", out, holder);
            return vks_set_error(VKS_ERR_IO, "%s: cannot lock: %s", d->lock, strerror(e));
        }
        struct stat a, b; /* the lock still names this file (its holder removes it when it ends) */
        if (fstat(fd, &a) == 0 && stat(d->lock, &b) == 0 && a.st_ino == b.st_ino && a.st_dev == b.st_dev) {
            int rc = write_holder(fd, d->lock);
            if (rc) {
                close(fd);
                return rc;
            }
            d->fd = fd;
            return VKS_OK;
        }
        close(fd);
    }
    return vks_set_error(VKS_ERR_IO, "%s: cannot lock (it keeps being replaced)", d->lock);
}

void vks_rl_out_unlock(vks_rl_out_dir *d) {
    if (d->fd < 0) return;
    unlink(d->lock);
    close(d->fd);
    d->fd = -1;
}

static bool empty_dir(DIR *parent, const char *name) {
    int fd = openat(dirfd(parent), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        if (fd >= 0) close(fd);
        return false;
    }
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d)) != NULL) empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
    closedir(d);
    return empty;
}

/* step-<digits>: a checkpoint's name (complete or not). */
static bool step_name(const char *name) {
    return !strncmp(name, "step-", 5) && name[5] && strspn(name + 5, "0123456789") == strlen(name + 5);
}

int vks_rl_out_check_fresh(const char *out, const char *const *outputs, bool resuming) {
    DIR *d = opendir(out);
    if (!d) return errno == ENOENT ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: cannot open directory: %s", out, strerror(errno));
    struct dirent *e;
    int rc = VKS_OK;
    while (!rc && (e = readdir(d)) != NULL) {
        if (resuming) { /* the run's own files, but a step-N that is no checkpoint is not its */
            if (step_name(e->d_name))
                rc = vks_set_error(VKS_ERR_ARG, "%s: holds %s, which is not a complete checkpoint (no state.json): "
                                   "nothing to resume; remove it or choose another --out", out, e->d_name);
            continue;
        }
        bool earlier = !strncmp(e->d_name, "step-", 5);
        for (int i = 0; outputs[i] && !earlier; i++) earlier = !strcmp(e->d_name, outputs[i]) && !empty_dir(d, e->d_name);
        if (earlier)
            rc = vks_set_error(VKS_ERR_ARG, "%s: holds %s from an earlier run, which a fresh run would overwrite: "
                               "--resume continues that run; to start afresh, remove it or choose another --out", out,
                               e->d_name);
    }
    closedir(d);
    return rc;
}

int vks_rl_ckpt_check_shape(const vks_model *had, const vks_model *want, const char *dir, const char *who) {
    if (vks_param_config_same(&had->cfg, &want->cfg) && had->cfg.seq_len == want->cfg.seq_len) return VKS_OK;
    return vks_set_error(VKS_ERR_ARG, "%s: %s is a checkpoint of another model (dim %d, %d layers, context %d; this "
                         "run's: dim %d, %d layers, context %d)", who, dir, had->cfg.dim, had->cfg.n_layers,
                         had->cfg.seq_len, want->cfg.dim, want->cfg.n_layers, want->cfg.seq_len);
}

/* ---- what kind of run made a checkpoint ---- */

bool vks_rl_ckpt_is_rl(const vks_checkpoint *ck) {
    json_t *o = ck->state.extra_json ? json_loads(ck->state.extra_json, JSON_REJECT_DUPLICATES, NULL) : NULL;
    bool rl = json_object_get(o, "rl_task") != NULL;
    json_decref(o);
    return rl;
}

int vks_rl_ckpt_check_kind(const vks_checkpoint *ck, const char *dir, bool want_rl) {
    bool rl = vks_rl_ckpt_is_rl(ck), sft = ck->state.data_hash[0] != '\0';
    if (want_rl && sft && !rl)
        return vks_set_error(VKS_ERR_ARG, "rl: %s is a train sft checkpoint, not an RL run's: start an RL run from it "
                             "with --model (and another --out)", dir);
    if (!want_rl && rl)
        return vks_set_error(VKS_ERR_ARG, "sft: %s is an RL run's checkpoint (vkswarm rl), not train sft's: continue it "
                             "with vkswarm rl --resume", dir);
    if (!want_rl && !sft)
        return vks_set_error(VKS_ERR_ARG, "sft: %s records no training data (no data hash): not a train sft checkpoint", dir);
    return VKS_OK;
}

int vks_rl_ckpt_check_betas(const vks_checkpoint *ck, const char *dir, const char *who, double beta1, double beta2) {
    if (ck->state.adam.beta1 == beta1 && ck->state.adam.beta2 == beta2) return VKS_OK;
    return vks_set_error(VKS_ERR_ARG, "%s: %s was trained with Adam betas %g, %g, this run uses %g, %g", who, dir,
                         ck->state.adam.beta1, ck->state.adam.beta2, beta1, beta2);
}
