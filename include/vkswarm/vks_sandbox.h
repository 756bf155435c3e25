/* vks_sandbox.h: running untrusted programs (a completion's code, a user's
 * reward program) under bubblewrap (src/sandbox/): no network, a read-only
 * system (/usr), a private size-bounded /tmp, its own PID, IPC and UTS
 * namespaces, and limits on CPU seconds, memory, processes, file size, output
 * and wall-clock time. Run as root, the sandbox drops to the user nobody
 * first (the kernel does not count root's processes against a limit). The
 * only code that starts processes. */
#ifndef VKS_SANDBOX_H
#define VKS_SANDBOX_H
#include "vks_common.h"

#include <stdbool.h>

#define VKS_SANDBOX_MAX_JOBS 1000000           /* jobs in one vks_sandbox_run */
#define VKS_SANDBOX_MAX_FILE (16u << 20)       /* bytes of the program file written into the sandbox */
#define VKS_SANDBOX_MAX_INPUT (64u << 20)      /* bytes of a job's standard input */
#define VKS_SANDBOX_ERR_KEEP 2048              /* bytes of standard error kept (the first ones) */

typedef struct {
    double wall_s;         /* wall-clock seconds before the sandbox is killed (0: 10) */
    double cpu_s;          /* CPU seconds (RLIMIT_CPU, rounded up; 0: wall_s) */
    int64_t memory_bytes;  /* address space (RLIMIT_AS; 0: 512 MiB) */
    int64_t file_bytes;    /* largest file written, and the size of /tmp (0: 16 MiB) */
    int64_t output_bytes;  /* standard output kept; more ends the run as VKS_SANDBOX_OUTPUT (0: 1 MiB) */
    int processes;         /* processes and threads inside (RLIMIT_NPROC; 0: 32) */
} vks_sandbox_limits;

typedef struct {
    const char *const *argv;   /* the command inside the sandbox (argv[0] an absolute path, e.g. /usr/bin/python3) */
    const char *file_name;     /* NULL, or a file written to /tmp/NAME first (the working directory is /tmp) */
    const char *file_data;
    size_t file_len;
    const char *input;         /* standard input (NULL: empty) */
    size_t input_len;
} vks_sandbox_job;

typedef enum {
    VKS_SANDBOX_EXITED,   /* ended by itself: code is its exit status */
    VKS_SANDBOX_SIGNALED, /* killed by signal `code` (SIGXCPU: the CPU limit) */
    VKS_SANDBOX_TIMEOUT,  /* still running at wall_s: killed */
    VKS_SANDBOX_OUTPUT,   /* wrote more than output_bytes: killed */
} vks_sandbox_end;

typedef struct {
    vks_sandbox_end end;
    int code;
    char *out;            /* standard output (NUL-terminated; at most output_bytes kept) */
    size_t out_len;
    char *err;            /* the first VKS_SANDBOX_ERR_KEEP bytes of standard error (NUL-terminated) */
    size_t err_len;
    double wall_s;
} vks_sandbox_result;

/* Whether a sandbox can be set up here (runs `true` in one): VKS_OK, or an
 * error saying why (bubblewrap missing, user namespaces refused: bwrap's own
 * words). Checked once per process; later calls return the first answer. */
int vks_sandbox_check(void);
/* Runs jobs[0..n), at most `parallel` at once (0: the online cores), each in
 * its own sandbox with limits l (NULL: the defaults), and fills results[0..n)
 * (free them with vks_sandbox_results_free). An error only when a sandbox
 * could not be started; what a program does inside (crash, time out, flood)
 * is its result. */
int vks_sandbox_run(const vks_sandbox_job *jobs, int n, const vks_sandbox_limits *l, int parallel,
                    vks_sandbox_result *results);
void vks_sandbox_results_free(vks_sandbox_result *results, int n);
/* A long-lived program (a reward program): started once, then asked one
 * line at a time, each answer one line within a timeout. In a sandbox as
 * above (its wall_s and cpu_s unused: each request has its own timeout; run
 * as root it stays root, without capabilities, so that its directory can be
 * bound wherever it is: its process limit then does not apply), or, with
 * sandboxed false, run as it is (the memory and file limits only). */
typedef struct vks_sandbox_proc vks_sandbox_proc;
typedef struct {
    const char *command;   /* run by /usr/bin/sh -c */
    const char *dir;       /* the working directory; sandboxed, bound read-only at its own path (NULL: /tmp) */
    bool sandboxed;
} vks_sandbox_proc_spec;
#define VKS_SANDBOX_MAX_REPLY (1 << 20) /* bytes of one answer line */
int vks_sandbox_proc_start(const vks_sandbox_proc_spec *spec, const vks_sandbox_limits *l, vks_sandbox_proc **out);
/* Sends line (len bytes, no newline in it; one is added) and reads one line
 * back within timeout_s: *reply (malloc'd, NUL-terminated, without the
 * newline). Errors, each saying what the program did: VKS_ERR_TIMEOUT (no
 * answer in time), VKS_ERR_IO (it ended: how, and its standard error's last
 * line), VKS_ERR_FORMAT (an answer longer than VKS_SANDBOX_MAX_REPLY, or
 * output written outside a request). After an error the program is stopped:
 * start it again. */
int vks_sandbox_proc_request(vks_sandbox_proc *p, const char *line, size_t len, double timeout_s, char **reply);
/* Kills it (and everything it started) and waits for it. NULL is fine. */
void vks_sandbox_proc_stop(vks_sandbox_proc *p);
/* One line for a result that did not exit with status 0, e.g. "timed out after
 * 2 s", "killed by SIGXCPU (the CPU limit)", "exit status 1: <stderr's last line>". */
void vks_sandbox_describe(const vks_sandbox_result *r, const vks_sandbox_limits *l, char *buf, size_t cap);
#endif
