/* cli_util.c: small helpers of every subcommand: messages and exits, option parsing, numbers, JSON strings, progress, the stdout check. */
#include "cli_util.h"
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdarg.h>
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_tokenizer.h"

static bool stdout_reported; /* the one message about stdout was printed */

static void report_stdout(int e) {
    if (!stdout_reported) fprintf(stderr, "vkswarm: writing results to stdout failed: %s\n", strerror(e));
    stdout_reported = true;
    fflush(stderr);
}

static _Noreturn void stdout_failed(int e, int status) {
    report_stdout(e);
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
    if (e) stdout_failed(e, 1);
}

void cli_guard_stdout(void) { atexit(check_stdout); }

void cli_flush_stdout(void) {
    int e = stdout_error(false);
    if (e) stdout_failed(e, 1);
}

bool cli_stdout_ok(void) {
    int e = stdout_error(false);
    if (e) report_stdout(e);
    return e == 0;
}

_Noreturn void cli_exit_now(int status) {
    int e = stdout_error(false);
    if (e) stdout_failed(e, status);
    fflush(stderr);
    _exit(status);
}

/* Whether s[0, n) is a label of a message's prefix: a command or role name
 * such as "rl", "train plan" or "verifier rank 3" (words of lower-case
 * letters, digits and spaces), never a file name. */
static bool is_label(const char *s, size_t n) {
    return n > 0 && n <= 40 && strspn(s, "abcdefghijklmnopqrstuvwxyz0123456789 ") >= n && s[0] != ' ';
}

/* Drops a label that the message already carries ("vkswarm: rl: rl: x",
 * "vkswarm rl: rl: x", "vkswarm: rl: inference rank 2: rl: x" all lose the
 * second "rl: "): the command adds its name, and so does the library's
 * message it prints. Labels are the ": "-separated parts before the text;
 * "vkswarm CMD" counts as "vkswarm" and "CMD". */
static void drop_repeated_labels(char *msg) {
    const char *seen[16];
    size_t seen_n[16];
    int n_seen = 0;
    char *p = msg;
    for (char *end; (end = strstr(p, ": ")) && n_seen < 16; ) {
        size_t n = (size_t)(end - p);
        bool repeat = false;
        for (int i = 0; i < n_seen && !repeat; i++) repeat = seen_n[i] == n && !memcmp(seen[i], p, n);
        if (repeat) { /* cut "LABEL: " out */
            memmove(p, end + 2, strlen(end + 2) + 1);
            continue;
        }
        if (p == msg && !strncmp(p, "vkswarm ", 8)) { /* "vkswarm CMD" */
            seen[n_seen] = p, seen_n[n_seen++] = 7;
            seen[n_seen] = p + 8, seen_n[n_seen++] = n - 8;
        } else if (is_label(p, n)) seen[n_seen] = p, seen_n[n_seen++] = n;
        else break; /* the text itself (a file name, a sentence): labels end here */
        p = end + 2;
    }
}

/* "vkswarm[ CMD]: <msg>" on stderr. Messages carry strings from files:
 * nothing reaches the terminal raw. */
__attribute__((format(printf, 2, 0))) static void put_message(const char *cmd, const char *fmt, va_list ap) {
    char msg[2048], esc[4096];
    int n = snprintf(msg, sizeof msg, "vkswarm%s%s: ", cmd ? " " : "", cmd ? cmd : "");
    if (n < 0 || (size_t)n >= sizeof msg) n = 0;
    vsnprintf(msg + n, sizeof msg - (size_t)n, fmt, ap);
    drop_repeated_labels(msg);
    vks_escape(msg, strlen(msg), esc, sizeof esc);
    fprintf(stderr, "%s\n", esc);
}

__attribute__((format(printf, 2, 3))) static void put_line(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_message(cmd, fmt, ap);
    va_end(ap);
}

_Noreturn void cli_die(int status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_message(NULL, fmt, ap);
    va_end(ap);
    /* _exit, not exit: the command ends here with whatever it holds (a model,
     * a device), and LeakSanitizer's check at exit would report those as
     * leaks whenever the compiler kept their pointers only in registers (the
     * ASan build's CLI tests failed that way at random paths) */
    cli_exit_now(status);
}

void cli_note(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    put_message(NULL, fmt, ap);
    va_end(ap);
}

_Noreturn void cli_usage_error(const char *cmd, const char *fmt, ...) {
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    put_line(cmd, "%s (see vkswarm %s --help)", what, cmd);
    cli_exit_now(EXIT_BAD_INPUT);
}

/* Why getopt_long refused `arg` (argv[optind - 1]), a long option. */
static _Noreturn void bad_long_option(const char *cmd, const char *arg, const struct option *longopts) {
    const char *name = arg + 2, *eq = strchr(name, '=');
    size_t len = eq ? (size_t)(eq - name) : strlen(name);
    int matches = 0;
    const struct option *hit = NULL;
    for (const struct option *o = longopts; o->name; o++) {
        if (strncmp(o->name, name, len) != 0) continue;
        if (strlen(o->name) == len) { hit = o; matches = 1; break; } /* an exact name wins */
        hit = o;
        matches++;
    }
    if (matches == 0) cli_usage_error(cmd, "unknown option '--%.*s'", (int)len, name);
    if (matches > 1) cli_usage_error(cmd, "ambiguous option '--%.*s'", (int)len, name);
    if (eq && hit->has_arg == no_argument) cli_usage_error(cmd, "option '--%s' takes no value", hit->name);
    cli_usage_error(cmd, "option '--%.*s' is not valid here", (int)len, name);
}

int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts, int *idx) {
    char opts[64];
    snprintf(opts, sizeof opts, ":%s", shortopts); /* ':' tells a missing value from an unknown option */
    opterr = 0;
    int c = getopt_long(argc, argv, opts, longopts, idx);
    if (c != '?' && c != ':') return c;
    const char *cmd = argv[0];
    const char *arg = optind > 0 && optind <= argc ? argv[optind - 1] : "";
    if (optopt && (optopt & 0xff) == optopt && strncmp(arg, "--", 2) != 0) {
        if (c == ':') cli_usage_error(cmd, "option '-%c' needs a value", optopt);
        cli_usage_error(cmd, "unknown option '-%c'", optopt);
    }
    if (c == ':') cli_usage_error(cmd, "option '%s' needs a value", arg);
    if (strncmp(arg, "--", 2) == 0) bad_long_option(cmd, arg, longopts);
    cli_usage_error(cmd, "unknown option '%s'", arg);
}

void cli_put_path_line(const char *name, const char *path) {
    printf("%s: ", name);
    cli_put_escaped(stdout, path, strlen(path));
    putchar('\n');
}

static volatile sig_atomic_t stop_signal, stop_quiet;
/* SIGUSR1 is the one mpirun passes on to every rank (`vkswarm mpirun` turns Ctrl-C into it) */
static const int stop_signals[] = {SIGINT, SIGTERM, SIGUSR1};

static void on_stop_signal(int sig) {
    stop_signal = sig;
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) sigaction(stop_signals[i], &dfl, NULL);
    static const char msg[] = "vkswarm: stopping after this step, with a checkpoint (a second signal stops at once)\n";
    if (stop_quiet) return;
    ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1); /* async-signal-safe */
    (void)n;
}

void cli_stop_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    for (size_t i = 0; i < sizeof stop_signals / sizeof stop_signals[0]; i++) sigaction(stop_signals[i], &sa, NULL);
}

void cli_stop_quiet(void) { stop_quiet = 1; }

bool cli_stop_requested(void *ctx) {
    (void)ctx;
    return stop_signal != 0;
}

/* s as one POSIX shell word: as it is when it needs no quoting, else in single quotes. */
void cli_put_shell_word(FILE *f, const char *s) {
    size_t n = strlen(s);
    if (n && strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./:=,+@%") == n) {
        cli_put_escaped(f, s, n);
        return;
    }
    fputc('\'', f);
    for (const char *p = s; *p;) {
        size_t run = strcspn(p, "'");
        cli_put_escaped(f, p, run);
        p += run;
        if (*p == '\'') fputs("'\\''", f), p++;
    }
    fputc('\'', f);
}

static const char *program = "vkswarm";

void cli_set_program(const char *argv0) {
    if (argv0 && *argv0) program = argv0;
}

void cli_put_program(FILE *f) { cli_put_shell_word(f, program); }

void cli_put_mpirun(FILE *f, int np) {
    /* Open MPI refuses to start as root without the flag */
    fprintf(f, "mpirun%s --oversubscribe --mca btl tcp,self -np %d ", geteuid() == 0 ? " --allow-run-as-root" : "", np);
    cli_put_program(f);
}

int cli_world_rank(void) {
    const char *names[] = {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const char *v = getenv(names[i]);
        char *end;
        long r = v && *v ? strtol(v, &end, 10) : -1;
        if (v && *v && !*end && r >= 0 && r < (1L << 30)) return (int)r;
    }
    return -1;
}

bool cli_rank_speaks(int speaker) {
    int r = cli_world_rank();
    return r < 0 || r == speaker;
}

void cli_stop_line(const char *cmd, int64_t step, const char *checkpoint, int argc, const char *const *argv) {
    fflush(stdout);
    fprintf(stderr, "vkswarm: %s: stopped at step %lld; checkpoint ", cmd, (long long)step);
    cli_put_escaped(stderr, checkpoint, strlen(checkpoint));
    fputs("; continue with: ", stderr);
    cli_put_program(stderr);
    for (int i = 0; i < argc; i++) {
        fputc(' ', stderr);
        cli_put_shell_word(stderr, argv[i]);
    }
    fputc('\n', stderr);
}

static void on_resume(const char *cmd, const char *checkpoint, int64_t step) {
    if (checkpoint)
        cli_note("%s: --resume: continuing from %s (resumed from step %lld): its weights and optimizer state replace "
                 "the start model's (--model or --init gives only the shape)", cmd, checkpoint, (long long)step);
    else cli_note("%s: --resume: the output directory holds no checkpoint: a fresh run from the start model", cmd);
}

void cli_on_resume_train(void *ctx, const char *checkpoint, int64_t step) {
    (void)ctx;
    on_resume("train", checkpoint, step);
}

void cli_on_resume_rl(void *ctx, const char *checkpoint, int64_t step) {
    (void)ctx;
    on_resume("rl", checkpoint, step);
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

/* One character of a JSON string: escapes for quotes, backslashes and control
 * characters (C0, DEL, C1, and U+2028/2029, which JavaScript reads as line
 * ends); each byte of invalid UTF-8 becomes U+FFFD. Returns the bytes used. */
static size_t json_char(FILE *f, const char *s, size_t len) {
    uint32_t cp;
    size_t n = vks_utf8_decode(s, len, &cp);
    if (n == 0) {
        fputs("\\ufffd", f);
        return 1;
    }
    if (cp == '"' || cp == '\\') fprintf(f, "\\%c", (int)cp);
    else if (cp == '\n') fputs("\\n", f);
    else if (cp == '\r') fputs("\\r", f);
    else if (cp == '\t') fputs("\\t", f);
    else if (cp < 0x20 || (cp >= 0x7f && cp <= 0x9f) || cp == 0x2028 || cp == 0x2029) fprintf(f, "\\u%04x", (unsigned)cp);
    else fwrite(s, 1, n, f);
    return n;
}

void cli_json_string(FILE *f, const char *s, size_t len) {
    fputc('"', f);
    for (size_t i = 0; i < len;) i += json_char(f, s + i, len - i);
    fputc('"', f);
}

double cli_now(void) { return vks_seconds_now(); }

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

bool cli_prompt_option(vks_prompt_format *f, const char *cmd, const char *name, const char *val) {
    static const char *const flags[][2] = {{"chat-template", "chat_template"}, {"system", "system"},
                                           {"user-template", "user_template"}, {"think-template", "think_template"},
                                           {"no-think", "think"}};
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (strcmp(name, flags[i][0])) continue;
        char flag[32];
        snprintf(flag, sizeof flag, "--%s", name);
        if (vks_prompt_set(f, flags[i][1], strcmp(name, "no-think") ? val : "false", flag))
            cli_usage_error(cmd, "%s", vks_last_error());
        return true;
    }
    return false;
}

void cli_check_prompt(const char *cmd, const vks_prompt_format *f, const vks_tokenizer *tok, int speaker) {
    if (vks_prompt_check_tokenizer(f, tok)) cli_die(EXIT_BAD_INPUT, "%s", vks_last_error());
    if (strcmp(f->chat_template, "model") || !cli_rank_speaks(speaker)) return;
    const char *tmpl = vks_tokenizer_chat_template(tok); /* recognised: checked above */
    char *system = NULL;
    if (vks_chat_default_system(tmpl, &system)) cli_die(1, "%s", vks_last_error());
    const char *family = vks_chat_template_family(tmpl), *file = vks_tokenizer_chat_template_file(tok);
    if (!system) cli_note("%s: chat template: %s: family %s, no default system message", cmd, file, family);
    else if (f->system[0])
        cli_note("%s: chat template: %s: family %s, its default system message replaced by the one given", cmd, file,
                 family);
    else cli_note("%s: chat template: %s: family %s, default system message kept: \"%s\"", cmd, file, family, system);
    free(system);
}

void cli_show_prompt(void *ctx, const char *text, size_t len) {
    fprintf(stderr, "vkswarm: %s: prompt: ", ctx ? (const char *)ctx : "?");
    cli_put_escaped(stderr, text, len);
    fputc('\n', stderr);
}
