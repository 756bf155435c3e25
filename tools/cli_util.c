#include "cli_util.h"
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include "vkswarm/vks_common.h"

static int die_status; /* the status cli_die is exiting with, for the stdout check */

static bool stdout_reported; /* the one message about stdout was printed */

static _Noreturn void stdout_failed(int e, int status) {
    if (!stdout_reported) fprintf(stderr, "vkswarm: writing results to stdout failed: %s\n", strerror(e));
    stdout_reported = true;
    fflush(stderr);
    _exit(status ? status : 1);
}

/* 0, or the errno of a failed write to stdout (EIO when it is gone). */
static int stdout_error(bool close_it) {
    int e = 0;
    if (fflush(stdout) != 0) e = errno ? errno : EIO;
    if (!e && ferror(stdout)) e = EIO;
    if (close_it && fclose(stdout) != 0 && !e) e = errno ? errno : EIO;
    return e;
}

static void check_stdout(void) {
    int e = stdout_error(true);
    if (e) stdout_failed(e, die_status);
}

void cli_guard_stdout(void) { atexit(check_stdout); }

void cli_flush_stdout(void) {
    int e = stdout_error(false);
    if (e) stdout_failed(e, 1);
}

_Noreturn void cli_exit_now(int status) {
    int e = stdout_error(false);
    if (e) stdout_failed(e, status);
    fflush(stderr);
    _exit(status);
}

_Noreturn void cli_die(int status, const char *fmt, ...) {
    char msg[2048], esc[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Messages carry strings from files: nothing reaches the terminal raw. */
    vks_escape(msg, strlen(msg), esc, sizeof esc);
    fprintf(stderr, "vkswarm: %s\n", esc);
    die_status = status;
    exit(status);
}

void cli_put_escaped(FILE *f, const char *s, size_t len) {
    char buf[1024];
    while (len > 0) {
        /* whole characters per chunk: cut only after a byte that starts no sequence */
        size_t n = len < 200 ? len : 200;
        while (n < len && n > 1 && ((unsigned char)s[n] & 0xc0) == 0x80) n--;
        vks_escape(s, n, buf, sizeof buf);
        fputs(buf, f);
        s += n;
        len -= n;
    }
}

long cli_parse_long(const char *opt, const char *s, long lo, long hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        cli_die(EXIT_BAD_INPUT, "%s: '%s' is not an integer in [%ld, %ld]", opt, s, lo, hi);
    return v;
}

double cli_parse_double(const char *opt, const char *s, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v) || v < lo || v > hi)
        cli_die(EXIT_BAD_INPUT, "%s: '%s' is not a number in [%g, %g]", opt, s, lo, hi);
    return v;
}

uint64_t cli_parse_u64(const char *opt, const char *s) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-') cli_die(EXIT_BAD_INPUT, "%s: '%s' is not a non-negative integer", opt, s);
    return v;
}

void cli_json_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c == '\n') fputs("\\n", f);
        else if (c == '\r') fputs("\\r", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_start(cli_progress *p, const char *what) {
    p->what = what;
    p->start = p->last = cli_now();
    p->tty = isatty(STDERR_FILENO);
}

void cli_progress_update(cli_progress *p, long done, long total, const char *unit) {
    double now = cli_now();
    if (now - p->last < (p->tty ? 0.25 : 5.0)) return;
    p->last = now;
    double rate = done / (now - p->start + 1e-9);
    double eta = rate > 0 && total > done ? (double)(total - done) / rate : 0;
    fprintf(stderr, "%s%s: %ld/%ld %s, %.1f %s/s, ETA %.0fs%s", p->tty ? "\r" : "", p->what, done, total, unit, rate,
            unit, eta, p->tty ? "   " : "\n");
}

void cli_progress_end(cli_progress *p, long done, const char *unit) {
    double dt = cli_now() - p->start;
    fprintf(stderr, "%s%s: %ld %s in %.2fs (%.1f %s/s)          \n", p->tty ? "\r" : "", p->what, done, unit, dt,
            done / (dt + 1e-9), unit);
}
