/* On-disk version store: DIR/v<N>/model.bin, DIR/current -> v<N>. A version
 * is assembled in DIR/.v<N>.partial/ and becomes visible only through the
 * atomic rename of a new `current` symlink over the old one. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "vkswarm/vks_shard.h"

#define PATH_CAP 4096

static int join(char *out, size_t cap, const char *dir, const char *fmt, uint64_t v) {
    char name[64];
    snprintf(name, sizeof name, fmt, v);
    if (snprintf(out, cap, "%s/%s", dir, name) >= (int)cap) return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

/* Parses "v<digits>" (no sign, no leading zero, fits u64, > 0). */
static bool parse_version_name(const char *s, uint64_t *v) {
    if (s[0] != 'v' || s[1] < '1' || s[1] > '9') return false;
    uint64_t x = 0;
    for (const char *p = s + 1; *p; p++) {
        if (*p < '0' || *p > '9' || x > (UINT64_MAX - 9) / 10) return false;
        x = x * 10 + (uint64_t)(*p - '0');
    }
    *v = x;
    return true;
}

int vks_store_current(const char *dir, uint64_t *version) {
    if (!dir || !version) return vks_set_error(VKS_ERR_ARG, "store: null argument");
    *version = 0;
    char link[PATH_CAP], target[256];
    if (snprintf(link, sizeof link, "%s/current", dir) >= (int)sizeof link)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    ssize_t n = readlink(link, target, sizeof target - 1);
    if (n < 0) {
        if (errno == ENOENT) return VKS_OK;
        return vks_set_error(VKS_ERR_IO, "%s: cannot read (%s)", link, strerror(errno));
    }
    target[n] = 0;
    if (!parse_version_name(target, version))
        return vks_set_error(VKS_ERR_FORMAT, "%s: points to '%s', not a version", link, target);
    return VKS_OK;
}

int vks_store_path(const char *dir, uint64_t version, char *out, size_t cap) {
    if (!dir || !out) return vks_set_error(VKS_ERR_ARG, "store: null argument");
    if (version == 0) {
        if (snprintf(out, cap, "%s/current/%s", dir, VKS_STORE_FILE) >= (int)cap)
            return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
        return VKS_OK;
    }
    char d[PATH_CAP];
    int rc = join(d, sizeof d, dir, "v%" PRIu64, version);
    if (rc) return rc;
    if (snprintf(out, cap, "%s/%s", d, VKS_STORE_FILE) >= (int)cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

/* Removes a version directory: only plain files inside, then the directory.
 * A symlink or other non-directory in its place is removed itself, never
 * followed (a hostile store could point one at another directory). */
static void remove_version_dir(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (!S_ISDIR(st.st_mode)) {
        unlink(path);
        return;
    }
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char f[PATH_CAP];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        if (snprintf(f, sizeof f, "%s/%s", path, e->d_name) < (int)sizeof f) unlink(f);
    }
    closedir(d);
    rmdir(path);
}

/* Parses ".v<N>.partial" (a staging directory) into *v. */
static bool parse_stage_name(const char *s, uint64_t *v) {
    static const char suffix[] = ".partial";
    size_t n = strlen(s), k = sizeof suffix - 1;
    char name[32];
    if (s[0] != '.' || n <= k + 1 || n - 1 - k >= sizeof name || strcmp(s + n - k, suffix)) return false;
    memcpy(name, s + 1, n - 1 - k);
    name[n - 1 - k] = 0;
    return parse_version_name(name, v);
}

/* ".current.<N>.tmp": a symlink left by a switch that was interrupted. */
static bool is_switch_leftover(const char *s) {
    static const char prefix[] = ".current.", suffix[] = ".tmp";
    size_t n = strlen(s), p = sizeof prefix - 1, k = sizeof suffix - 1;
    if (n <= p + k || strncmp(s, prefix, p) || strcmp(s + n - k, suffix)) return false;
    for (size_t i = p; i < n - k; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

void vks_store_sweep(const char *dir) {
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) return;
    char names[64][64];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 64) {
        uint64_t v;
        size_t len = strlen(e->d_name);
        if ((parse_stage_name(e->d_name, &v) || is_switch_leftover(e->d_name)) && len < sizeof names[0])
            memcpy(names[n++], e->d_name, len + 1);
    }
    closedir(d);
    char p[PATH_CAP];
    for (int i = 0; i < n; i++)
        if (snprintf(p, sizeof p, "%s/%s", dir, names[i]) < (int)sizeof p) remove_version_dir(p);
}

int vks_store_stage(const char *dir, uint64_t version, char *out, size_t cap) {
    if (!dir || !out || version == 0) return vks_set_error(VKS_ERR_ARG, "store: bad argument");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return vks_set_error(VKS_ERR_IO, "%s: cannot create (%s)", dir, strerror(errno));
    char d[PATH_CAP];
    int rc = join(d, sizeof d, dir, ".v%" PRIu64 ".partial", version);
    if (rc) return rc;
    vks_store_sweep(dir); /* stale stages of interrupted transfers, this version's included */
    if (mkdir(d, 0755) != 0) return vks_set_error(VKS_ERR_IO, "%s: cannot create (%s)", d, strerror(errno));
    if (snprintf(out, cap, "%s/%s", d, VKS_STORE_FILE) >= (int)cap)
        return vks_set_error(VKS_ERR_ARG, "%s: path too long", dir);
    return VKS_OK;
}

int vks_store_write(const char *dir, uint64_t version, const uint8_t *data, size_t len) {
    if (!data && len) return vks_set_error(VKS_ERR_ARG, "store: null data");
    char path[PATH_CAP];
    int rc = vks_store_stage(dir, version, path, sizeof path);
    if (rc) return rc;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return vks_set_error(VKS_ERR_IO, "%s: cannot create (%s)", path, strerror(errno));
    size_t done = 0;
    while (done < len) {
        ssize_t w = write(fd, data + done, len - done > (1u << 30) ? (1u << 30) : len - done);
        if (w <= 0) break;
        done += (size_t)w;
    }
    bool ok = done == len && fsync(fd) == 0;
    if (close(fd) != 0 || !ok) {
        vks_store_abort(dir, version);
        return vks_set_error(VKS_ERR_IO, "%s: write failed (%s)", path, strerror(errno));
    }
    return VKS_OK;
}

void vks_store_abort(const char *dir, uint64_t version) {
    char d[PATH_CAP];
    if (dir && join(d, sizeof d, dir, ".v%" PRIu64 ".partial", version) == VKS_OK) remove_version_dir(d);
}

static void fsync_dir(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
}

static int cmp_u64_desc(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* Removes v<N> directories beyond the newest `keep`. */
static void prune(const char *dir, int keep) {
    DIR *d = opendir(dir);
    if (!d) return;
    uint64_t vs[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        uint64_t v;
        if (parse_version_name(e->d_name, &v)) vs[n++] = v;
    }
    closedir(d);
    qsort(vs, (size_t)n, sizeof vs[0], cmp_u64_desc);
    char p[PATH_CAP];
    for (int i = keep; i < n; i++)
        if (join(p, sizeof p, dir, "v%" PRIu64, vs[i]) == VKS_OK) remove_version_dir(p);
}

int vks_store_commit(const char *dir, uint64_t version, int keep) {
    if (!dir || version == 0 || keep < 1) return vks_set_error(VKS_ERR_ARG, "store: bad argument");
    char stage[PATH_CAP], final[PATH_CAP], tmp[PATH_CAP], cur[PATH_CAP], target[64];
    int rc = join(stage, sizeof stage, dir, ".v%" PRIu64 ".partial", version);
    if (!rc) rc = join(final, sizeof final, dir, "v%" PRIu64, version);
    if (!rc) rc = join(tmp, sizeof tmp, dir, ".current.%" PRIu64 ".tmp", version);
    if (!rc) rc = join(cur, sizeof cur, dir, "current", 0);
    if (rc) return rc;
    snprintf(target, sizeof target, "v%" PRIu64, version);
    remove_version_dir(final); /* leftover of an earlier, never switched-to attempt */
    if (rename(stage, final) != 0)
        return vks_set_error(VKS_ERR_IO, "%s: cannot move into place (%s)", stage, strerror(errno));
    unlink(tmp);
    if (symlink(target, tmp) != 0 || rename(tmp, cur) != 0) {
        unlink(tmp);
        return vks_set_error(VKS_ERR_IO, "%s: cannot switch to %s (%s)", cur, target, strerror(errno));
    }
    fsync_dir(dir);
    prune(dir, keep);
    return VKS_OK;
}

int vks_store_read_current(const char *dir, uint64_t *version, uint8_t **data, size_t *len) {
    if (!dir || !version || !data || !len) return vks_set_error(VKS_ERR_ARG, "store: null argument");
    *data = NULL;
    *len = 0;
    int rc = vks_store_current(dir, version);
    if (rc || *version == 0) return rc;
    char path[PATH_CAP];
    rc = vks_store_path(dir, *version, path, sizeof path);
    if (rc) return rc;
    int fd = vks_open_read(path, 0); /* a FIFO must not block: refused below */
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return vks_set_error(VKS_ERR_IO, "%s: cannot open (%s)", path, strerror(errno));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file", path);
    }
    size_t n = (size_t)st.st_size;
    uint8_t *b = malloc(n ? n : 1);
    size_t got = 0;
    while (b && got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (!b || got != n) {
        free(b);
        return vks_set_error(b ? VKS_ERR_IO : VKS_ERR_NOMEM, "%s: cannot read %zu bytes", path, n);
    }
    *data = b;
    *len = n;
    return VKS_OK;
}
