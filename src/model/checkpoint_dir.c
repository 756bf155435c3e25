/* checkpoint_dir.c: checkpoint directories on disk (vks_checkpoint.h): the
 * names this code gives them, the latest complete one, keeping the last N,
 * and removing only directories that hold nothing but what it writes. */
#include "vkswarm/vks_checkpoint.h"
#include "model/checkpoint_internal.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define STEP_DIGITS 9 /* step-000000123; more digits past 999999999 */

/* ---- names ---- */

static size_t count_digits(const char *s) { return strspn(s, "0123456789"); }

/* "<digits>-<digits>" to the end of s (a writer's pid and counter). */
static bool pid_suffix(const char *s, long *pid) {
    size_t a = count_digits(s);
    if (a == 0 || a > 9 || s[a] != '-') return false;
    size_t b = count_digits(s + a + 1);
    if (b == 0 || b > 10 || s[a + 1 + b] != '\0') return false;
    *pid = strtol(s, NULL, 10);
    return true;
}

typedef enum { NAME_OTHER, NAME_FINAL, NAME_TEMP, NAME_OLD } name_kind;

/* step-<9+ digits>, and the writer's step-N.tmp-<pid>-<n> and step-N.old-<pid>-<n>. */
static name_kind parse_name(const char *name, int64_t *step, long *pid) {
    if (strncmp(name, "step-", 5) != 0) return NAME_OTHER;
    const char *d = name + 5;
    size_t n = count_digits(d);
    if (n < STEP_DIGITS || n > 18) return NAME_OTHER;
    *step = strtoll(d, NULL, 10);
    const char *rest = d + n;
    if (*rest == '\0') return NAME_FINAL;
    if (!strncmp(rest, ".tmp-", 5) && pid_suffix(rest + 5, pid)) return NAME_TEMP;
    if (!strncmp(rest, ".old-", 5) && pid_suffix(rest + 5, pid)) return NAME_OLD;
    return NAME_OTHER;
}

/* A checkpoint file, or vks_outfile's temporary of one (<name>.tmp-<pid>-<n>). */
static bool our_file_name(const char *name) {
    if (vks_ckpt_known_file(name)) return true;
    const char *t = strstr(name, ".tmp-");
    long pid;
    if (!t || !pid_suffix(t + 5, &pid)) return false;
    char base[64];
    size_t n = (size_t)(t - name);
    if (n >= sizeof base) return false;
    memcpy(base, name, n);
    base[n] = '\0';
    return vks_ckpt_known_file(base);
}

bool vks_ckpt_step_name(const char *name, int64_t *step) {
    long pid;
    return parse_name(name, step, &pid) == NAME_FINAL;
}

int vks_checkpoint_step_dir(const char *out_dir, int64_t step, char *buf, size_t cap) {
    if (!out_dir || !buf || step < 0) return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_step_dir: bad argument");
    if ((size_t)snprintf(buf, cap, "%s/step-%0*lld", out_dir, STEP_DIGITS, (long long)step) >= cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", out_dir);
    return VKS_OK;
}

/* ---- removing only what is ours ---- */

/* Calls fn(dirfd, name) for every entry but . and ..; stops at a non-zero result. */
static int each_entry(const char *dir, int (*fn)(int dfd, const char *name)) {
    DIR *d = opendir(dir);
    if (!d) return vks_set_error(VKS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int r = 0;
    struct dirent *e;
    while (r == 0 && (e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        r = fn(dirfd(d), e->d_name);
    }
    closedir(d);
    return r;
}

static int foreign_entry(int dfd, const char *name) {
    struct stat st;
    if (!our_file_name(name)) return 1;
    if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode)) return 1;
    return 0;
}

int vks_ckpt_only_our_files(const char *dir) {
    int r = each_entry(dir, foreign_entry);
    return r < 0 ? r : r == 0;
}

static int unlink_entry(int dfd, const char *name) {
    if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT) return 0;
    return vks_set_error(VKS_ERR_IO, "%s: cannot remove: %s", name, strerror(errno));
}

int vks_ckpt_remove_dir(const char *dir) {
    struct stat st;
    if (lstat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return 0;
    int r = vks_ckpt_only_our_files(dir);
    if (r <= 0) return r;
    r = each_entry(dir, unlink_entry);
    if (r < 0) return vks_error_prefix(r, "%s", dir);
    if (rmdir(dir) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot remove: %s", dir, strerror(errno));
    return 1;
}

int vks_ckpt_sync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd) == 0 || errno == EINVAL ? VKS_OK : vks_set_error(VKS_ERR_IO, "%s: fsync failed: %s", dir, strerror(errno));
    close(fd);
    return rc;
}

int vks_ckpt_sync_parent(const char *path) {
    char *copy = strdup(path);
    if (!copy) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    int rc = vks_ckpt_sync_dir(dirname(copy));
    free(copy);
    return rc;
}

/* ---- scanning an output directory ---- */

typedef struct {
    int64_t step;
    name_kind kind;
    long pid;
    char name[256];
} entry;

typedef struct {
    entry *e;
    size_t n, cap;
} entry_list;

static int list_checkpoints(const char *out_dir, entry_list *l) {
    DIR *d = opendir(out_dir);
    if (!d) return vks_set_error(VKS_ERR_IO, "%s: cannot open directory: %s", out_dir, strerror(errno));
    struct dirent *de;
    int rc = VKS_OK;
    while (rc == VKS_OK && (de = readdir(d)) != NULL) {
        entry x = {0};
        x.kind = parse_name(de->d_name, &x.step, &x.pid);
        struct stat st;
        if (x.kind == NAME_OTHER || strlen(de->d_name) >= sizeof x.name ||
            fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
            continue;
        snprintf(x.name, sizeof x.name, "%s", de->d_name);
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 16;
            entry *p = realloc(l->e, cap * sizeof *p);
            if (!p) {
                rc = vks_set_error(VKS_ERR_NOMEM, "out of memory");
                break;
            }
            l->e = p;
            l->cap = cap;
        }
        l->e[l->n++] = x;
    }
    closedir(d);
    return rc;
}

static int newest_first(const void *a, const void *b) {
    const entry *x = a, *y = b;
    return x->step < y->step ? 1 : x->step > y->step ? -1 : strcmp(x->name, y->name);
}

static bool has_state(const char *out_dir, const char *name) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s/state.json", out_dir, name);
    return lstat(p, &st) == 0 && S_ISREG(st.st_mode);
}

int vks_checkpoint_latest(const char *out_dir, char *buf, size_t cap, bool *found) {
    if (!out_dir || !buf || !found) return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_latest: NULL argument");
    *found = false;
    struct stat st;
    if (lstat(out_dir, &st) != 0 && errno == ENOENT) return VKS_OK; /* no directory: no checkpoint */
    entry_list l = {0};
    int rc = list_checkpoints(out_dir, &l);
    if (rc == VKS_OK && l.n > 1) qsort(l.e, l.n, sizeof *l.e, newest_first);
    for (size_t i = 0; i < l.n && rc == VKS_OK && !*found; i++) {
        if (l.e[i].kind != NAME_FINAL || !has_state(out_dir, l.e[i].name)) continue;
        if ((size_t)snprintf(buf, cap, "%s/%s", out_dir, l.e[i].name) >= cap)
            rc = vks_set_error(VKS_ERR_ARG, "%s: path too long", out_dir);
        else *found = true;
    }
    free(l.e);
    return rc;
}

/* A writer's leftover: its process is gone (and it is not this one). */
static bool abandoned(const entry *e) {
    if (e->kind != NAME_TEMP && e->kind != NAME_OLD) return false;
    if (e->pid == (long)getpid()) return false;
    return kill((pid_t)e->pid, 0) != 0 && errno == ESRCH;
}

int vks_checkpoint_prune(const char *out_dir, int keep, int64_t through_step, int *n_removed) {
    if (n_removed) *n_removed = 0;
    if (!out_dir || keep < 1) return vks_set_error(VKS_ERR_ARG, "vks_checkpoint_prune: keep must be at least 1");
    entry_list l = {0};
    int rc = list_checkpoints(out_dir, &l);
    if (rc == VKS_OK && l.n > 1) qsort(l.e, l.n, sizeof *l.e, newest_first);
    int kept = 0;
    char path[4096];
    for (size_t i = 0; i < l.n && rc == VKS_OK; i++) {
        const entry *e = &l.e[i];
        if (e->kind == NAME_FINAL && !has_state(out_dir, e->name)) continue; /* not a complete checkpoint: not ours */
        if (e->kind == NAME_FINAL && e->step > through_step) continue;      /* newer than the caller's: not its */
        bool drop = e->kind == NAME_FINAL ? kept++ >= keep : abandoned(e);
        if (!drop) continue;
        snprintf(path, sizeof path, "%s/%s", out_dir, e->name);
        int r = vks_ckpt_remove_dir(path);
        if (r < 0) rc = r;
        if (r == 1 && n_removed) ++*n_removed;
    }
    free(l.e);
    return rc;
}
