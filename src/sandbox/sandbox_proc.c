/* sandbox_proc.c: long-lived programs (vks_sandbox.h vks_sandbox_proc): one
 * child started as sandbox.c starts a job, fed through a socket (a program
 * that died makes send fail with EPIPE, never SIGPIPE in this process: send
 * takes MSG_NOSIGNAL, write to a pipe would not), answers read line by line
 * from a pipe, standard error kept (its last bytes) for the messages. */
#define _GNU_SOURCE
#include "sandbox_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROC_ERR_KEEP 4096 /* the last bytes of standard error kept */

struct vks_sandbox_proc {
    pid_t pid;
    int in_fd, out_fd, err_fd;
    bool dead;
    int status;              /* its wait status once dead */
    char err[PROC_ERR_KEEP]; /* the last bytes of its standard error */
    size_t err_len;
    char command[256];       /* for messages */
};

static void close_fd(int *fd) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
}

int vks_sandbox_proc_start(const vks_sandbox_proc_spec *spec, const vks_sandbox_limits *limits, vks_sandbox_proc **out) {
    if (!spec || !spec->command || !*spec->command || !out) return vks_set_error(VKS_ERR_ARG, "sandbox: no command");
    *out = NULL;
    vks_sandbox_limits l;
    vks_sandbox_limits_fill(limits, &l);
    int rc = vks_sandbox_limits_check(&l);
    if (rc) return rc;
    if (spec->sandboxed && (rc = vks_sandbox_check())) return rc;
    vks_sandbox_proc *p = calloc(1, sizeof *p);
    if (!p) return vks_set_error(VKS_ERR_NOMEM, "sandbox: out of memory");
    p->in_fd = p->out_fd = p->err_fd = -1;
    vks_escape(spec->command, strlen(spec->command), p->command, sizeof p->command);
    vks_sandbox_launch c;
    vks_sandbox_launch_init(&c, &l, spec->sandboxed, true);
    const char *command[] = {"/usr/bin/sh", "-c", spec->command, NULL};
    const char *argv[SANDBOX_MAX_ARGS + 64];
    vks_sandbox_build_argv(&c, command, NULL, spec->dir, argv);
    int in_s[2] = {-1, -1}, out_p[2] = {-1, -1}, err_p[2] = {-1, -1};
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, in_s) || pipe2(out_p, O_CLOEXEC) || pipe2(err_p, O_CLOEXEC))
        rc = vks_set_error(VKS_ERR_IO, "sandbox: cannot make the program's pipes: %s", strerror(errno));
    pid_t pid = rc ? -1 : fork();
    if (!rc && pid < 0) rc = vks_set_error(VKS_ERR_IO, "sandbox: fork failed: %s", strerror(errno));
    if (pid == 0) vks_sandbox_child_exec(&c, argv, spec->dir, in_s[1], -1, out_p[1], err_p[1]);
    close_fd(&in_s[1]), close_fd(&out_p[1]), close_fd(&err_p[1]);
    if (rc) {
        close_fd(&in_s[0]), close_fd(&out_p[0]), close_fd(&err_p[0]);
        free(p);
        return rc;
    }
    shutdown(in_s[0], SHUT_RD);
    fcntl(out_p[0], F_SETFL, O_NONBLOCK);
    fcntl(err_p[0], F_SETFL, O_NONBLOCK);
    fcntl(in_s[0], F_SETFL, O_NONBLOCK);
    p->pid = pid, p->in_fd = in_s[0], p->out_fd = out_p[0], p->err_fd = err_p[0];
    *out = p;
    return VKS_OK;
}

/* Reads standard error (what is there) into the kept tail. */
static void drain_err(vks_sandbox_proc *p) {
    char buf[4096];
    for (;;) {
        ssize_t got = p->err_fd >= 0 ? read(p->err_fd, buf, sizeof buf) : -1;
        if (got < 0 && errno == EINTR) continue;
        if (got == 0) close_fd(&p->err_fd);
        if (got <= 0) return;
        size_t n = (size_t)got;
        if (n >= PROC_ERR_KEEP) {
            memcpy(p->err, buf + n - PROC_ERR_KEEP, PROC_ERR_KEEP);
            p->err_len = PROC_ERR_KEEP;
        } else {
            if (p->err_len + n > PROC_ERR_KEEP) {
                size_t drop = p->err_len + n - PROC_ERR_KEEP;
                memmove(p->err, p->err + drop, p->err_len - drop);
                p->err_len -= drop;
            }
            memcpy(p->err + p->err_len, buf, n);
            p->err_len += n;
        }
    }
}

static void kill_proc(vks_sandbox_proc *p) {
    if (p->dead) return;
    kill(-p->pid, SIGKILL);
    kill(p->pid, SIGKILL);
    while (waitpid(p->pid, &p->status, 0) < 0 && errno == EINTR) {
    }
    p->dead = true;
}

/* The error for a program that stopped answering: how it ended (killed when still running) and its last words. */
static int ended(vks_sandbox_proc *p, int code, const char *what) {
    bool was_running = !p->dead;
    if (was_running) {
        /* it may be exiting right now: a moment to report its own status rather than our SIGKILL */
        pid_t w = 0;
        for (int i = 0; i < 20 && (w = waitpid(p->pid, &p->status, WNOHANG)) == 0; i++) usleep(5000);
        if (w == p->pid || (w < 0 && errno == ECHILD)) p->dead = true;
    }
    bool killed_here = !p->dead;
    kill_proc(p);
    drain_err(p);
    char how[64] = "", err[600];
    if (!killed_here) {
        int st = p->status;
        if (WIFEXITED(st)) {
            int x = WEXITSTATUS(st);
            if (x > 128 && x < 128 + 65) snprintf(how, sizeof how, ": killed by SIG%s", sigabbrev_np(x - 128) ?: "?");
            else snprintf(how, sizeof how, ": exit status %d", x);
        } else if (WIFSIGNALED(st)) {
            snprintf(how, sizeof how, ": killed by SIG%s", sigabbrev_np(WTERMSIG(st)) ?: "?");
        }
    }
    vks_sandbox_last_line(p->err, p->err_len, err, sizeof err);
    return vks_set_error(code, "'%s' %s%s%s%s", p->command, what, how, err[0] ? "; its last words: " : "", err);
}

int vks_sandbox_proc_request(vks_sandbox_proc *p, const char *line, size_t len, double timeout_s, char **reply) {
    if (!p || !line || !reply || memchr(line, '\n', len) || !(timeout_s > 0))
        return vks_set_error(VKS_ERR_ARG, "sandbox: bad request");
    *reply = NULL;
    if (p->dead) return vks_set_error(VKS_ERR_IO, "'%s' is not running", p->command);
    /* anything on its standard output now was written outside a request */
    char peek;
    ssize_t early = read(p->out_fd, &peek, 1);
    if (early > 0) return ended(p, VKS_ERR_FORMAT, "wrote to standard output outside a request");
    if (early == 0) return ended(p, VKS_ERR_IO, "ended");
    size_t cap = 4096, got = 0, sent = 0, total = len + 1;
    char *buf = malloc(cap);
    if (!buf) return vks_set_error(VKS_ERR_NOMEM, "sandbox: out of memory");
    double deadline = vks_sandbox_now() + timeout_s;
    for (;;) {
        char *nl = got ? memchr(buf, '\n', got) : NULL;
        if (nl) {
            if ((size_t)(nl - buf) + 1 != got) {
                free(buf);
                return ended(p, VKS_ERR_FORMAT, "answered more than one line");
            }
            *nl = 0;
            *reply = buf;
            return VKS_OK;
        }
        double left = deadline - vks_sandbox_now();
        if (left <= 0) {
            free(buf);
            return ended(p, VKS_ERR_TIMEOUT, "gave no answer in time");
        }
        struct pollfd pfd[3] = {{p->out_fd, POLLIN, 0}, {p->err_fd, POLLIN, 0}, {sent < total ? p->in_fd : -1, POLLOUT, 0}};
        int pr = poll(pfd, 3, (int)(left * 1000) + 1);
        if (pr < 0 && errno != EINTR) break;
        if (pfd[1].revents) drain_err(p);
        if (pfd[2].revents & (POLLERR | POLLHUP)) {
            free(buf);
            return ended(p, VKS_ERR_IO, "stopped reading its input");
        }
        if (pfd[2].revents & POLLOUT) { /* the line, then its newline */
            const char *from = sent < len ? line + sent : "\n";
            size_t n = sent < len ? len - sent : 1;
            ssize_t w = send(p->in_fd, from, n, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (w > 0) sent += (size_t)w;
            else if (w < 0 && errno != EAGAIN && errno != EINTR) {
                free(buf);
                return ended(p, VKS_ERR_IO, "stopped reading its input");
            }
        }
        if (pfd[0].revents) {
            if (got + 4096 > cap) {
                if (cap > VKS_SANDBOX_MAX_REPLY) {
                    free(buf);
                    return ended(p, VKS_ERR_FORMAT, "answered a line longer than 1 MiB");
                }
                char *q = realloc(buf, cap * 2);
                if (!q) break;
                buf = q, cap *= 2;
            }
            ssize_t r = read(p->out_fd, buf + got, cap - got - 1);
            if (r == 0) {
                free(buf);
                return ended(p, VKS_ERR_IO, "ended");
            }
            if (r > 0) got += (size_t)r;
        }
    }
    free(buf);
    return ended(p, VKS_ERR_IO, "could not be read");
}

void vks_sandbox_proc_stop(vks_sandbox_proc *p) {
    if (!p) return;
    kill_proc(p);
    close_fd(&p->in_fd), close_fd(&p->out_fd), close_fd(&p->err_fd);
    free(p);
}
