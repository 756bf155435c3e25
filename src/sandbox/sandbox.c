/* sandbox.c: untrusted programs under bubblewrap (vks_sandbox.h).
 *
 * Each job is one `bwrap` child: its own namespaces (--unshare-all: no
 * network, PID 1 of its own so that everything it started dies with it), /usr
 * read-only, / and /dev remounted read-only, /tmp a tmpfs of file_bytes. The
 * limits are rlimits: address space, CPU seconds, file size, open files and
 * core dumps are set before bwrap starts; the process limit is set inside, by
 * the shell that starts the program, because RLIMIT_NPROC counts per user in
 * each user namespace: set outside, it would count every process of that user
 * on the machine. Run as root, the child becomes `nobody` first, since the
 * kernel never applies RLIMIT_NPROC to root. The parent polls each job's
 * standard output and error, ends a job past its wall clock or output bound
 * with SIGKILL (bwrap's --die-with-parent then takes the namespace down), and
 * runs up to `parallel` jobs at once.
 *
 * Between fork and exec the child calls async-signal-safe functions only (the
 * process may run other threads: OpenBLAS, the Vulkan driver): everything it
 * needs is prepared before fork. */
#define _GNU_SOURCE
#include "sandbox_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SANDBOX_DRAIN_S 1.0          /* after the job ended: how long its pipes may stay open */

/* What one running job holds. */
typedef struct {
    int job;             /* index into jobs[], -1: free */
    pid_t pid;
    int out_fd, err_fd;
    double start, ended; /* ended: when it was reaped (0: running) */
    bool reaped, killed;
    vks_sandbox_end kill_end;
    size_t out_cap;
} slot;

static int start_job(const vks_sandbox_launch *c, const vks_sandbox_job *job, slot *s) {
    char file_dest[300];
    const char *argv[SANDBOX_MAX_ARGS + 64];
    int n_args = 0;
    while (job->argv && job->argv[n_args]) n_args++;
    if (!job->argv || n_args == 0 || n_args > SANDBOX_MAX_ARGS)
        return vks_set_error(VKS_ERR_ARG, "sandbox: a command needs 1 to %d arguments", SANDBOX_MAX_ARGS);
    if (job->file_name) {
        const char *f = job->file_name;
        if (!*f || strchr(f, '/') || strlen(f) > 255 || !strcmp(f, ".") || !strcmp(f, ".."))
            return vks_set_error(VKS_ERR_ARG, "sandbox: a file name must be one path component");
        if (job->file_len > VKS_SANDBOX_MAX_FILE) return vks_set_error(VKS_ERR_ARG, "sandbox: program file too large");
        snprintf(file_dest, sizeof file_dest, "/tmp/%s", f);
    }
    if (job->input_len > VKS_SANDBOX_MAX_INPUT) return vks_set_error(VKS_ERR_ARG, "sandbox: standard input too large");
    vks_sandbox_build_argv(c, job->argv, job->file_name ? file_dest : NULL, NULL, argv);

    int in_fd = vks_sandbox_memfd("vks-stdin", job->input ? job->input : "", job->input ? job->input_len : 0);
    int file_fd = job->file_name ? vks_sandbox_memfd("vks-file", job->file_data ? job->file_data : "", job->file_len) : -1;
    int out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    int rc = VKS_OK;
    if (in_fd < 0 || (job->file_name && file_fd < 0) || pipe2(out_p, O_CLOEXEC) || pipe2(err_p, O_CLOEXEC))
        rc = vks_set_error(VKS_ERR_IO, "sandbox: cannot set up a job's files: %s", strerror(errno));
    pid_t pid = rc ? -1 : fork();
    if (!rc && pid < 0) rc = vks_set_error(VKS_ERR_IO, "sandbox: fork failed: %s", strerror(errno));
    if (pid == 0) vks_sandbox_child_exec(c, argv, NULL, in_fd, file_fd, out_p[1], err_p[1]);
    if (in_fd >= 0) close(in_fd);
    if (file_fd >= 0) close(file_fd);
    if (out_p[1] >= 0) close(out_p[1]);
    if (err_p[1] >= 0) close(err_p[1]);
    if (rc) {
        if (out_p[0] >= 0) close(out_p[0]);
        if (err_p[0] >= 0) close(err_p[0]);
        return rc;
    }
    fcntl(out_p[0], F_SETFL, O_NONBLOCK);
    fcntl(err_p[0], F_SETFL, O_NONBLOCK);
    s->pid = pid;
    s->out_fd = out_p[0];
    s->err_fd = err_p[0];
    s->start = vks_sandbox_now();
    s->ended = 0;
    s->reaped = s->killed = false;
    s->out_cap = 0;
    return VKS_OK;
}

static void kill_job(slot *s, vks_sandbox_end why) {
    if (s->reaped || s->killed) return;
    kill(-s->pid, SIGKILL);
    kill(s->pid, SIGKILL);
    s->killed = true;
    s->kill_end = why;
}

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

/* Reads what is there; false at EOF or error. */
static bool read_out(slot *s, vks_sandbox_result *r, const vks_sandbox_limits *l) {
    char buf[65536];
    for (;;) {
        ssize_t got = read(s->out_fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno == EAGAIN;
        if (got == 0) return false;
        size_t room = (size_t)l->output_bytes - r->out_len, take = (size_t)got < room ? (size_t)got : room;
        if (take) {
            if (r->out_len + take + 1 > s->out_cap) {
                size_t cap = s->out_cap ? s->out_cap : 4096;
                while (cap < r->out_len + take + 1) cap *= 2;
                char *p = realloc(r->out, cap);
                if (!p) { /* keep what fits; the job is ended as over its output */
                    kill_job(s, VKS_SANDBOX_OUTPUT);
                    return false;
                }
                r->out = p;
                s->out_cap = cap;
            }
            memcpy(r->out + r->out_len, buf, take);
            r->out_len += take;
            r->out[r->out_len] = 0;
        }
        if ((size_t)got > take) {
            kill_job(s, VKS_SANDBOX_OUTPUT);
            return false;
        }
    }
}

static bool read_err(slot *s, vks_sandbox_result *r) {
    char buf[8192];
    for (;;) {
        ssize_t got = read(s->err_fd, buf, sizeof buf);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) return errno == EAGAIN;
        if (got == 0) return false;
        size_t room = VKS_SANDBOX_ERR_KEEP - r->err_len, take = (size_t)got < room ? (size_t)got : room;
        memcpy(r->err + r->err_len, buf, take);
        r->err_len += take;
        r->err[r->err_len] = 0;
    }
}

static void finish(slot *s, vks_sandbox_result *r, int status) {
    r->wall_s = vks_sandbox_now() - s->start;
    if (s->killed) {
        r->end = s->kill_end;
        r->code = SIGKILL;
    } else if (WIFSIGNALED(status)) {
        r->end = VKS_SANDBOX_SIGNALED;
        r->code = WTERMSIG(status);
    } else {
        int code = WEXITSTATUS(status);
        /* bwrap reports its command's death by signal S as status 128 + S */
        r->end = code > 128 && code < 128 + 65 ? VKS_SANDBOX_SIGNALED : VKS_SANDBOX_EXITED;
        r->code = r->end == VKS_SANDBOX_SIGNALED ? code - 128 : code;
    }
}

/* One pass over the running slots: poll, read, enforce bounds, reap. Returns how many finished. */
static int step(slot *slots, int n_slots, vks_sandbox_result *results, const vks_sandbox_limits *l) {
    struct pollfd pfd[2 * 256];
    int map[2 * 256], np = 0;
    double t = vks_sandbox_now(), wait_s = 0.1;
    for (int i = 0; i < n_slots; i++) {
        slot *s = &slots[i];
        if (s->job < 0) continue;
        if (s->out_fd >= 0) pfd[np] = (struct pollfd){s->out_fd, POLLIN, 0}, map[np++] = i;
        if (s->err_fd >= 0) pfd[np] = (struct pollfd){s->err_fd, POLLIN, 0}, map[np++] = i;
        if (!s->reaped) {
            double left = s->start + l->wall_s - t;
            if (left < wait_s) wait_s = left > 0 ? left : 0;
            /* its pipes are closed: it is most likely exiting, and nothing will wake poll when it has */
            if (s->out_fd < 0 && s->err_fd < 0 && wait_s > 0.001) wait_s = 0.001;
        }
    }
    int pr = poll(pfd, (nfds_t)np, (int)(wait_s * 1000) + 1);
    for (int k = 0; pr > 0 && k < np; k++) {
        if (!pfd[k].revents) continue;
        slot *s = &slots[map[k]];
        vks_sandbox_result *r = &results[s->job];
        if (pfd[k].fd == s->out_fd && !read_out(s, r, l)) close_fd(&s->out_fd);
        else if (pfd[k].fd == s->err_fd && !read_err(s, r)) close_fd(&s->err_fd);
    }
    int done = 0;
    t = vks_sandbox_now();
    for (int i = 0; i < n_slots; i++) {
        slot *s = &slots[i];
        if (s->job < 0) continue;
        if (!s->reaped && t - s->start > l->wall_s) kill_job(s, VKS_SANDBOX_TIMEOUT);
        if (!s->reaped) {
            int status = 0;
            pid_t w = waitpid(s->pid, &status, WNOHANG);
            if (w == s->pid || (w < 0 && errno == ECHILD)) {
                s->reaped = true;
                s->ended = t;
                finish(s, &results[s->job], status);
            }
        }
        /* a program that passed its pipes to something still alive is not waited for long */
        if (s->reaped && t - s->ended > SANDBOX_DRAIN_S) {
            close_fd(&s->out_fd);
            close_fd(&s->err_fd);
        }
        if (s->reaped && s->out_fd < 0 && s->err_fd < 0) {
            s->job = -1;
            done++;
        }
    }
    return done;
}

int vks_sandbox_run(const vks_sandbox_job *jobs, int n, const vks_sandbox_limits *limits, int parallel,
                    vks_sandbox_result *results) {
    if ((!jobs && n) || (!results && n) || n < 0 || n > VKS_SANDBOX_MAX_JOBS || parallel < 0)
        return vks_set_error(VKS_ERR_ARG, "sandbox: bad arguments");
    vks_sandbox_limits l;
    vks_sandbox_limits_fill(limits, &l);
    int rc = vks_sandbox_limits_check(&l);
    if (rc) return rc;
    if (parallel == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        parallel = cores > 0 ? (int)cores : 1;
    }
    if (parallel > 256) parallel = 256;
    if (parallel > n) parallel = n > 0 ? n : 1;
    memset(results, 0, sizeof *results * (size_t)n);
    for (int i = 0; i < n; i++) {
        results[i].err = calloc(VKS_SANDBOX_ERR_KEEP + 1, 1);
        if (!results[i].err) {
            vks_sandbox_results_free(results, i);
            return vks_set_error(VKS_ERR_NOMEM, "sandbox: out of memory");
        }
    }
    vks_sandbox_launch c;
    vks_sandbox_launch_init(&c, &l, true, false);
    slot slots[256];
    for (int i = 0; i < parallel; i++) slots[i] = (slot){.job = -1, .out_fd = -1, .err_fd = -1};
    int next = 0, done = 0, running = 0;
    while (done < n) {
        for (int i = 0; i < parallel && next < n && !rc; i++)
            if (slots[i].job < 0) {
                rc = start_job(&c, &jobs[next], &slots[i]);
                if (!rc) slots[i].job = next++, running++;
            }
        if (running == 0) break; /* a failed start, and nothing left to reap */
        for (int i = 0; rc && i < parallel; i++) /* after a failed start, the others end too */
            if (slots[i].job >= 0) kill_job(&slots[i], VKS_SANDBOX_TIMEOUT);
        int d = step(slots, parallel, results, &l);
        done += d;
        running -= d;
    }
    if (rc) {
        vks_sandbox_results_free(results, n);
        memset(results, 0, sizeof *results * (size_t)n);
    }
    return rc;
}

void vks_sandbox_results_free(vks_sandbox_result *results, int n) {
    for (int i = 0; results && i < n; i++) {
        free(results[i].out);
        free(results[i].err);
        results[i].out = results[i].err = NULL;
    }
}

static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;
static int check_rc = 1; /* 1: not checked yet */
static char check_msg[512];

int vks_sandbox_check(void) {
    pthread_mutex_lock(&check_lock);
    if (check_rc == 1) {
        const char *argv[] = {"/usr/bin/true", NULL};
        vks_sandbox_job job = {.argv = argv};
        vks_sandbox_limits l = {.wall_s = 20};
        vks_sandbox_result r;
        check_rc = vks_sandbox_run(&job, 1, &l, 1, &r);
        bool run_ok = check_rc == VKS_OK;
        if (check_rc) snprintf(check_msg, sizeof check_msg, "%s", vks_last_error());
        else if (r.end != VKS_SANDBOX_EXITED || r.code != 0) {
            char why[300];
            vks_sandbox_describe(&r, &l, why, sizeof why);
            char bwrap[4096];
            vks_sandbox_find_bwrap(bwrap, sizeof bwrap);
            bool missing = access(bwrap, X_OK) != 0;
            snprintf(check_msg, sizeof check_msg, "the sandbox cannot be set up here: %s%s", why,
                     missing ? " (bubblewrap is not installed: apt install bubblewrap)"
                             : " (bubblewrap needs user namespaces: see docs/tasks.md)");
            check_rc = VKS_ERR_IO;
        }
        if (run_ok) vks_sandbox_results_free(&r, 1);
    }
    int rc = check_rc;
    pthread_mutex_unlock(&check_lock);
    return rc ? vks_set_error(rc, "%s", check_msg) : VKS_OK;
}

/* The last non-blank line of text, escaped for a terminal. */
void vks_sandbox_last_line(const char *text, size_t len, char *out, size_t cap) {
    while (len && (text[len - 1] == '\n' || text[len - 1] == '\r' || text[len - 1] == ' ')) len--;
    size_t start = len;
    while (start && text[start - 1] != '\n') start--;
    size_t n = len - start > 200 ? 200 : len - start;
    vks_escape(text + start, n, out, cap);
}

void vks_sandbox_describe(const vks_sandbox_result *r, const vks_sandbox_limits *limits, char *buf, size_t cap) {
    vks_sandbox_limits l;
    vks_sandbox_limits_fill(limits, &l);
    char err[600];
    vks_sandbox_last_line(r->err ? r->err : "", r->err ? r->err_len : 0, err, sizeof err);
    switch (r->end) {
    case VKS_SANDBOX_TIMEOUT: snprintf(buf, cap, "timed out (wall clock, %.3g s)", l.wall_s); break;
    case VKS_SANDBOX_OUTPUT:
        snprintf(buf, cap, "wrote more than %lld bytes of output", (long long)l.output_bytes);
        break;
    case VKS_SANDBOX_SIGNALED: {
        const char *name = sigabbrev_np(r->code);
        snprintf(buf, cap, "killed by SIG%s%s", name ? name : "?",
                 r->code == SIGXCPU ? " (over the CPU time limit)" : "");
        break;
    }
    default:
        if (r->code == 0) snprintf(buf, cap, "exit status 0");
        else snprintf(buf, cap, "exit status %d%s%s", r->code, err[0] ? ": " : "", err);
    }
}
