/* fileio.c: files written whole or not at all (temporary name, fsync, rename). */
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

int vks_outfile_open(vks_outfile *o, const char *path, unsigned mode) {
    if (!o) return vks_set_error(VKS_ERR_ARG, "vks_outfile_open: no handle");
    memset(o, 0, sizeof *o);
    if (!path || !*path) return vks_set_error(VKS_ERR_ARG, "output file: empty path");
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return vks_set_error(VKS_ERR_IO, "%s: is a directory", path);
    size_t n = strlen(path) + 48;
    o->path = strdup(path);
    o->tmp = malloc(n);
    if (!o->path || !o->tmp) {
        outfile_release(o);
        return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
    }
    /* A name no other writer (thread or process) picks: pid + counter, created
     * exclusively, so a stale or hostile file of that name is never reused. */
    static atomic_uint counter;
    for (int attempt = 0; attempt < 100; attempt++) {
        snprintf(o->tmp, n, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&counter, 1));
        int fd = open(o->tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, (mode_t)mode);
        if (fd < 0 && errno == EEXIST) continue;
        if (fd < 0) {
            int e = errno;
            outfile_release(o);
            return vks_set_error(VKS_ERR_IO, "%s: cannot create: %s", path, strerror(e));
        }
        o->f = fdopen(fd, "wb");
        if (!o->f) {
            close(fd);
            unlink(o->tmp);
            outfile_release(o);
            return vks_set_error(VKS_ERR_NOMEM, "%s: out of memory", path);
        }
        return VKS_OK;
    }
    outfile_release(o);
    return vks_set_error(VKS_ERR_IO, "%s: cannot find a free temporary name", path);
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

int vks_outfile_commit(vks_outfile *o) {
    if (!o || !o->f) return vks_set_error(VKS_ERR_ARG, "vks_outfile_commit: file not open");
    int e = 0;
    if (ferror(o->f)) e = errno ? errno : EIO;
    if (!e && fflush(o->f) != 0) e = errno;
    if (!e && fsync(fileno(o->f)) != 0 && errno != EINVAL) e = errno;
    if (fclose(o->f) != 0 && !e) e = errno;
    o->f = NULL;
    if (!e && rename(o->tmp, o->path) != 0) e = errno;
    if (e) {
        unlink(o->tmp);
        int rc = vks_set_error(VKS_ERR_IO, "%s: write failed: %s", o->path, strerror(e));
        outfile_release(o);
        return rc;
    }
    sync_parent_dir(o->path);
    outfile_release(o);
    return VKS_OK;
}

void vks_outfile_abort(vks_outfile *o) {
    if (!o) return;
    if (o->f) fclose(o->f);
    if (o->tmp) unlink(o->tmp);
    outfile_release(o);
}
