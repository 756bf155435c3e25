/* fileio.c: files written whole or not at all (temporary name, fsync, rename),
 * and read whole. */
#include "vkswarm/vks_common.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void outfile_release(vks_outfile *o) {
    free(o->path);
    free(o->tmp);
    o->f = NULL;
    o->path = o->tmp = NULL;
}

/* stdio on top of fd, or closes fd and removes `created` (when not NULL). */
static int attach_stream(vks_outfile *o, int fd, const char *created) {
    o->f = fdopen(fd, "wb");
    if (o->f) return VKS_OK;
    close(fd);
    if (created) unlink(created);
    int rc = vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", o->path);
    outfile_release(o);
    return rc;
}

/* A device or FIFO (/dev/null, /dev/stdout) cannot be replaced: it is
 * written in place, with no temporary. */
static int open_special(vks_outfile *o) {
    int fd = open(o->path, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        int rc = vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", o->path, strerror(errno));
        outfile_release(o);
        return rc;
    }
    return attach_stream(o, fd, NULL);
}

/* A name no other writer (thread or process) picks: pid + counter, created
 * exclusively, so a stale or hostile file of that name is never reused. */
static int open_temporary(vks_outfile *o, unsigned mode) {
    static atomic_uint counter;
    size_t n = strlen(o->path) + 48;
    o->tmp = malloc(n);
    if (!o->tmp) {
        outfile_release(o);
        return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    }
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(o->tmp, n, "%s.tmp-%ld-%u", o->path, (long)getpid(), atomic_fetch_add(&counter, 1));
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) {
            int rc = vks_set_error(VKS_ERR_IO, "%s: cannot create: %s", o->path, strerror(errno));
            outfile_release(o);
            return rc;
        }
        return attach_stream(o, fd, o->tmp);
    }
    int rc = vks_set_error(VKS_ERR_IO, "%s: cannot find a free temporary name", o->path);
    outfile_release(o);
    return rc;
}

int vks_outfile_open(vks_outfile *o, const char *path, unsigned mode) {
    if (!o) return vks_set_error(VKS_ERR_ARG, "vks_outfile_open: no handle");
    memset(o, 0, sizeof *o);
    if (!path || !*path) return vks_set_error(VKS_ERR_ARG, "output file: empty path");
    struct stat st;
    bool exists = stat(path, &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) return vks_set_error(VKS_ERR_IO, "%s: is a directory", path);
    o->path = strdup(path);
    if (!o->path) return vks_set_error(VKS_ERR_NOMEM, "out of memory");
    if (exists && (S_ISCHR(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode))) return open_special(o);
    return open_temporary(o, mode);
}

/* fsync of the directory makes the rename itself durable. */
static void sync_parent_dir(const char *path) {
    char *copy = strdup(path);
    if (!copy) return;
    int fd = open(dirname(copy), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        fsync(fd);
        close(fd);
    }
    free(copy);
}

/* Checks earlier writes, flushes, syncs and closes o->f; returns 0 or an errno. */
static int sync_and_close(vks_outfile *o) {
    int e = 0;
    if (ferror(o->f)) e = EIO; /* the failed write's errno is gone: callers report it themselves */
    if (!e && fflush(o->f) != 0) e = errno;
    if (!e && o->tmp && fsync(fileno(o->f)) != 0 && errno != EINVAL) e = errno;
    if (fclose(o->f) != 0 && !e) e = errno;
    o->f = NULL;
    return e;
}

/* Links the temporary to its final name only when that name is free. */
static int place_new(const vks_outfile *o) {
    if (link(o->tmp, o->path) == 0) return 0;
    int e = errno;
    if (e != EPERM && e != ENOTSUP && e != EOPNOTSUPP) return e;
    /* a file system without hard links: check, then rename */
    struct stat st;
    if (lstat(o->path, &st) == 0) return EEXIST;
    return rename(o->tmp, o->path) == 0 ? 0 : errno;
}

static int place(const vks_outfile *o, bool noreplace) {
    if (!o->tmp) return 0; /* written in place */
    if (!noreplace) return rename(o->tmp, o->path) == 0 ? 0 : errno;
    int e = place_new(o);
    if (e == 0) unlink(o->tmp); /* after link(): the temporary is a second name */
    return e;
}

static int commit_failed(vks_outfile *o, size_t n, size_t bad, int e) {
    char *path = o[bad].path;
    o[bad].path = NULL; /* keep the name for the message */
    for (size_t i = 0; i < n; i++) vks_outfile_abort(&o[i]);
    int rc = e == EEXIST ? vks_set_error(VKS_ERR_IO, "%s: exists (not overwritten)", path)
                         : vks_set_error(VKS_ERR_IO, "%s: write failed: %s", path, strerror(e));
    free(path);
    return rc;
}

int vks_outfile_commit_all(vks_outfile *o, size_t n, bool noreplace) {
    if (!o) return vks_set_error(VKS_ERR_ARG, "vks_outfile_commit_all: no files");
    for (size_t i = 0; i < n; i++)
        if (!o[i].f) {
            for (size_t j = 0; j < n; j++) vks_outfile_abort(&o[j]);
            return vks_set_error(VKS_ERR_ARG, "vks_outfile_commit_all: file %zu not open", i);
        }
    for (size_t i = 0; i < n; i++) {
        int e = sync_and_close(&o[i]);
        if (e) return commit_failed(o, n, i, e);
    }
    for (size_t i = 0; i < n; i++) {
        int e = place(&o[i], noreplace);
        if (e) {
            /* new names placed so far are ours: take them back (replaced ones cannot be) */
            for (size_t j = 0; noreplace && j < i; j++)
                if (o[j].tmp) unlink(o[j].path);
            return commit_failed(o, n, i, e);
        }
    }
    for (size_t i = 0; i < n; i++) {
        if (o[i].tmp) sync_parent_dir(o[i].path);
        outfile_release(&o[i]);
    }
    return VKS_OK;
}

int vks_outfile_commit(vks_outfile *o) { return vks_outfile_commit_all(o, 1, false); }

int vks_outfile_finish(vks_outfile *o, bool ok) {
    if (ok) return vks_outfile_commit(o);
    int e = errno ? errno : EIO;
    int rc = vks_set_error(VKS_ERR_IO, "%s: write failed: %s", o && o->path ? o->path : "output file", strerror(e));
    vks_outfile_abort(o);
    return rc;
}

void vks_outfile_abort(vks_outfile *o) {
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    outfile_release(o);
}

int vks_file_read_all(const char *path, size_t most, char **out, size_t *len) {
    if (!path || !out || !len) return vks_set_error(VKS_ERR_ARG, "vks_file_read_all: NULL argument");
    *out = NULL, *len = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return vks_set_error(VKS_ERR_IO, "%s: cannot open", path);
    /* the buffer grows to at most most + 1 bytes: one byte more says the file is too large */
    size_t cap = most < (1 << 16) ? most + 1 : 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t got = 1; buf && got;) {
        if (n == cap) {
            size_t grown = cap > most / 2 ? most + 1 : cap * 2;
            char *nb = cap <= most ? realloc(buf, grown) : NULL;
            if (!nb) { free(buf); buf = NULL; break; }
            buf = nb;
            cap = grown;
        }
        got = fread(buf + n, 1, cap - n, f);
        n += got;
    }
    int read_errno = ferror(f) ? (errno ? errno : EIO) : 0; /* EISDIR for a directory */
    fclose(f);
    if (buf && n > most) { free(buf); buf = NULL; }
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "%s: too large to read", path);
    if (read_errno) {
        free(buf);
        return vks_set_error(VKS_ERR_IO, "%s: cannot read: %s", path, strerror(read_errno));
    }
    *out = buf, *len = n;
    return VKS_OK;
}

int vks_open_read(const char *path, int flags) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | flags);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        int fl = fcntl(fd, F_GETFL);
        if (fl != -1) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    }
    return fd;
}

int vks_fopen_regular(const char *path, FILE **out) {
    if (!path || !out) return vks_set_error(VKS_ERR_ARG, "vks_fopen_regular: NULL argument");
    *out = NULL;
    int fd = vks_open_read(path, 0);
    if (fd < 0) {
        int e = errno;
        vks_set_error(VKS_ERR_IO, "%s: cannot open: %s", path, strerror(e));
        errno = e;
        return VKS_ERR_IO;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return vks_set_error(VKS_ERR_FORMAT, "%s: not a regular file", path);
    }
    *out = fdopen(fd, "rb");
    if (*out) return VKS_OK;
    close(fd);
    return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
}
