/* sandbox_internal.h: starting one sandboxed (or plain) child, shared by the
 * batch runner (sandbox.c) and long-lived programs (sandbox_proc.c). */
#ifndef VKS_SANDBOX_INTERNAL_H
#define VKS_SANDBOX_INTERNAL_H
#include "vkswarm/vks_sandbox.h"

#include <stdbool.h>
#include <sys/resource.h>
#include <sys/types.h>

#define SANDBOX_MAX_ARGS 64          /* arguments of a command */
#define SANDBOX_EXEC_FAILED 127      /* the child's status when it could not be started */

/* Everything the forked child needs, prepared before fork (it may call async-signal-safe functions only). */
typedef struct {
    bool sandboxed;      /* false: the command runs as it is, in `dir`, with the memory and file limits only */
    char bwrap[4096];
    char tmp_size[32], nproc_cmd[128];
    uid_t uid;           /* nobody's, when run as root */
    gid_t gid;
    bool drop;           /* run as root: become nobody */
    bool cpu_limit;      /* false (long-lived programs): no RLIMIT_CPU, each request has a timeout instead */
    /* drop: true for jobs run as root; long-lived programs stay root (see vks_sandbox_launch_init) */
    struct rlimit as, cpu, fsize, nofile, core;
} vks_sandbox_launch;

double vks_sandbox_now(void);
/* Zeros become the defaults (vks_sandbox.h); then checked. */
void vks_sandbox_limits_fill(const vks_sandbox_limits *in, vks_sandbox_limits *l);
int vks_sandbox_limits_check(const vks_sandbox_limits *l);
void vks_sandbox_find_bwrap(char *out, size_t cap);
/* A memfd (close-on-exec) holding data at offset 0; -1 on failure (errno set). */
int vks_sandbox_memfd(const char *name, const void *data, size_t len);
/* long_lived: a reward program (no RLIMIT_CPU; as root it is not made nobody: it runs in its task
 * file's directory, which bubblewrap, run as nobody, could not reach under a directory closed to
 * others such as /root, so its process limit does not apply there) */
void vks_sandbox_launch_init(vks_sandbox_launch *c, const vks_sandbox_limits *l, bool sandboxed, bool long_lived);
/* The child's argv (pointers into c and the arguments; argv needs SANDBOX_MAX_ARGS + 64 entries):
 * bwrap's options, the file from fd 3 to file_dest when not NULL, dir bound read-only at its own
 * path and made the working directory when not NULL (else /tmp), then command. Unsandboxed:
 * command alone. */
int vks_sandbox_build_argv(const vks_sandbox_launch *c, const char *const *command, const char *file_dest,
                           const char *dir, const char **argv);
/* The forked child: standard streams from in_fd/out_w/err_w, file_fd at 3 (or -1), the limits,
 * nobody as root, exec. Never returns. */
void vks_sandbox_child_exec(const vks_sandbox_launch *c, const char **argv, const char *dir, int in_fd, int file_fd,
                            int out_w, int err_w) __attribute__((noreturn));
/* The last non-blank line of text (at most 200 bytes), escaped for a terminal. */
void vks_sandbox_last_line(const char *text, size_t len, char *out, size_t cap);
#endif
