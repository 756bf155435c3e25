/* sandbox_launch.c: starting one child under bubblewrap (or, for a reward
 * program the user runs unsandboxed, as it is): limits, argv, the child's side
 * of fork (sandbox_internal.h). Why the limits are set where they are:
 * sandbox.c's opening comment. */
#define _GNU_SOURCE
#include "sandbox_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define SANDBOX_NOFILE 256           /* open files inside */

double vks_sandbox_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void vks_sandbox_limits_fill(const vks_sandbox_limits *in, vks_sandbox_limits *l) {
    *l = in ? *in : (vks_sandbox_limits){0};
    if (!(l->wall_s > 0)) l->wall_s = 10;
    if (!(l->cpu_s > 0)) l->cpu_s = l->wall_s;
    if (l->memory_bytes <= 0) l->memory_bytes = 512ll << 20;
    if (l->file_bytes <= 0) l->file_bytes = 16ll << 20;
    if (l->output_bytes <= 0) l->output_bytes = 1ll << 20;
    if (l->processes <= 0) l->processes = 32;
}

int vks_sandbox_limits_check(const vks_sandbox_limits *l) {
    if (!(l->wall_s <= 86400) || !(l->cpu_s <= 86400))
        return vks_set_error(VKS_ERR_ARG, "sandbox: a time limit above one day");
    if (l->memory_bytes < (16ll << 20) || l->memory_bytes > (1ll << 40))
        return vks_set_error(VKS_ERR_ARG, "sandbox: memory limit %lld bytes is not 16 MiB to 1 TiB",
                             (long long)l->memory_bytes);
    if (l->file_bytes > (1ll << 34) || l->output_bytes > (1ll << 30) || l->processes > 4096)
        return vks_set_error(VKS_ERR_ARG, "sandbox: a file, output or process limit too large");
    return VKS_OK;
}

/* bwrap's path, looked up once on PATH (the child may not search: not async-signal-safe). */
void vks_sandbox_find_bwrap(char *out, size_t cap) {
    const char *path = getenv("PATH");
    snprintf(out, cap, "/usr/bin/bwrap");
    if (!path) return;
    char dir[4096];
    while (*path) {
        size_t n = strcspn(path, ":");
        if (n && n < sizeof dir) {
            memcpy(dir, path, n);
            dir[n] = 0;
            char cand[4200];
            snprintf(cand, sizeof cand, "%s/bwrap", dir);
            if (strlen(cand) < cap && access(cand, X_OK) == 0) {
                memcpy(out, cand, strlen(cand) + 1);
                return;
            }
        }
        path += n + (path[n] == ':');
    }
}


/* A memfd holding data (for bwrap's --file, or standard input), at offset 0. */
int vks_sandbox_memfd(const char *name, const void *data, size_t len) {
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0) return -1;
    const char *p = data;
    while (len) {
        ssize_t w = write(fd, p, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            close(fd);
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    if (lseek(fd, 0, SEEK_SET) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

void vks_sandbox_launch_init(vks_sandbox_launch *c, const vks_sandbox_limits *l, bool sandboxed, bool long_lived) {
    memset(c, 0, sizeof *c);
    c->sandboxed = sandboxed;
    c->cpu_limit = !long_lived;
    vks_sandbox_find_bwrap(c->bwrap, sizeof c->bwrap);
    snprintf(c->tmp_size, sizeof c->tmp_size, "%lld", (long long)l->file_bytes);
    /* dash's ulimit names the process limit -p, bash's -u (-p is bash's pipe size) */
    snprintf(c->nproc_cmd, sizeof c->nproc_cmd, "{ ulimit -u %d || ulimit -p %d; } 2>/dev/null || exit 125; exec \"$@\"",
             l->processes, l->processes);
    c->drop = sandboxed && !long_lived && geteuid() == 0;
    c->uid = 65534;
    c->gid = 65534;
    if (c->drop) {
        struct passwd pw, *res = NULL;
        char buf[1024];
        if (getpwnam_r("nobody", &pw, buf, sizeof buf, &res) == 0 && res) {
            c->uid = pw.pw_uid;
            c->gid = pw.pw_gid;
        }
    }
    rlim_t cpu = (rlim_t)ceil(l->cpu_s);
    c->as = (struct rlimit){(rlim_t)l->memory_bytes, (rlim_t)l->memory_bytes};
    c->cpu = (struct rlimit){cpu, cpu + 1};
    c->fsize = (struct rlimit){(rlim_t)l->file_bytes, (rlim_t)l->file_bytes};
    c->nofile = (struct rlimit){SANDBOX_NOFILE, SANDBOX_NOFILE};
    c->core = (struct rlimit){0, 0};
}

int vks_sandbox_build_argv(const vks_sandbox_launch *c, const char *const *command, const char *file_dest,
                           const char *dir, const char **argv) {
    int n = 0;
    if (c->sandboxed) {
        const char *fixed[] = {c->bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
                               "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp", "--setenv", "LANG",
                               "C.UTF-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--ro-bind", "/usr", "/usr",
                               "--symlink", "usr/bin", "/bin", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64",
                               "/lib64", "--symlink", "usr/sbin", "/sbin", "--proc", "/proc", "--dev", "/dev",
                               "--size", c->tmp_size, "--tmpfs", "/tmp"};
        for (size_t i = 0; i < sizeof fixed / sizeof fixed[0]; i++) argv[n++] = fixed[i];
        if (file_dest) argv[n++] = "--file", argv[n++] = "3", argv[n++] = file_dest;
        if (dir) argv[n++] = "--ro-bind", argv[n++] = dir, argv[n++] = dir;
        const char *tail[] = {"--remount-ro", "/dev", "--remount-ro", "/", "--chdir", dir ? dir : "/tmp",
                              "/usr/bin/sh", "-c", c->nproc_cmd, "sh"};
        for (size_t i = 0; i < sizeof tail / sizeof tail[0]; i++) argv[n++] = tail[i];
    }
    for (int i = 0; command[i] && i < SANDBOX_MAX_ARGS; i++) argv[n++] = command[i];
    argv[n] = NULL;
    return n;
}

static const char exec_failed_msg[] = "vkswarm sandbox: cannot start the program\n";

void vks_sandbox_child_exec(const vks_sandbox_launch *c, const char **argv, const char *dir, int in_fd, int file_fd,
                            int out_w, int err_w) {
    setpgid(0, 0);
    if (dup2(in_fd, 0) < 0 || dup2(out_w, 1) < 0 || dup2(err_w, 2) < 0) _exit(SANDBOX_EXEC_FAILED);
    if (file_fd >= 0) {
        if (file_fd == 3) fcntl(3, F_SETFD, 0);
        else if (dup2(file_fd, 3) < 0) _exit(SANDBOX_EXEC_FAILED);
    }
    close_range(file_fd >= 0 ? 4 : 3, ~0u, 0);
    signal(SIGPIPE, SIG_DFL);
    if (chdir(!c->sandboxed && dir ? dir : "/") != 0) _exit(SANDBOX_EXEC_FAILED);
    if (setrlimit(RLIMIT_AS, &c->as) || (c->cpu_limit && setrlimit(RLIMIT_CPU, &c->cpu)) ||
        setrlimit(RLIMIT_FSIZE, &c->fsize) || setrlimit(RLIMIT_NOFILE, &c->nofile) || setrlimit(RLIMIT_CORE, &c->core))
        _exit(SANDBOX_EXEC_FAILED);
    if (c->drop && (setgroups(0, NULL) || setgid(c->gid) || setuid(c->uid))) _exit(SANDBOX_EXEC_FAILED);
    execv(argv[0], (char *const *)argv);
    ssize_t w = write(2, exec_failed_msg, sizeof exec_failed_msg - 1);
    (void)w;
    _exit(SANDBOX_EXEC_FAILED);
}
