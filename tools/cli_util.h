/* Small helpers shared by the vkswarm subcommands: strict number parsing,
 * errors with exit status 2, JSON string output, progress on stderr. */
#ifndef VKS_CLI_UTIL_H
#define VKS_CLI_UTIL_H
#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "vkswarm/vks_prompt.h"

#define EXIT_BAD_INPUT 2

/* Prints "vkswarm: <msg>" on stderr and exits with `status` (cli_exit_now: the
 * stdout check, then _exit; no atexit handlers). */
_Noreturn void cli_die(int status, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prints "vkswarm: <msg>" on stderr, escaped like cli_die's: for notes that
 * carry names from files (architectures, paths). */
void cli_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "NAME: PATH\n" on stdout, the path escaped as in messages (one line whatever it holds). */
void cli_put_path_line(const char *name, const char *path);
/* --resume's notice on stderr (train sft and rl: the same words): the
 * checkpoint continued from, whose weights replace --model's, or none. */
void cli_on_resume_train(void *ctx, const char *checkpoint, int64_t step);
void cli_on_resume_rl(void *ctx, const char *checkpoint, int64_t step);
/* A clean stop (train sft and rl): cli_stop_install sets handlers for SIGINT,
 * SIGTERM and SIGUSR1 (which mpirun passes on to every rank) with sigaction; the first signal sets a flag
 * (volatile sig_atomic_t), says on stderr that the run stops after its step,
 * and restores the default action, so that a second one stops at once.
 * cli_stop_requested (the runs' stop_requested; ctx unused) reads the flag. */
#define EXIT_STOPPED 130
void cli_stop_install(void);
/* The rank is not the one that stops the run (rl across ranks: not the trainer): its first
 * signal says nothing (the trainer says it and tells this rank to stop). */
void cli_stop_quiet(void);
bool cli_stop_requested(void *ctx);
/* s as one shell word (quoted when it needs it; control bytes escaped). */
void cli_put_shell_word(FILE *f, const char *s);
/* Commands a message tells the user to run name the program as it was run
 * (main's argv[0]: build/vkswarm, /usr/local/bin/vkswarm; "vkswarm" until set). */
void cli_set_program(const char *argv0);
/* The program as one shell word. */
void cli_put_program(FILE *f);
/* "mpirun [--allow-run-as-root] --oversubscribe --mca btl tcp,self -np N
 * PROGRAM": a one-machine launch; the flag when running as root (euid 0),
 * which Open MPI refuses without it. */
void cli_put_mpirun(FILE *f, int np);
/* This process's MPI world rank as the launcher's environment gives it
 * (usable before MPI_Init), or -1 outside mpirun. */
int cli_world_rank(void);
/* Notes said once per job: true outside mpirun, else only on rank `speaker`. */
bool cli_rank_speaks(int speaker);
/* The line a cleanly stopped run ends with: "vkswarm: CMD: stopped at step N;
 * checkpoint CKPT; continue with: PROGRAM ARGS..." (each argument quoted for
 * a POSIX shell where it needs it). */
void cli_stop_line(const char *cmd, int64_t step, const char *checkpoint, int argc, const char *const *argv);
/* Installed first thing in main: at exit, stdout is flushed and closed and
 * any failed write to it (full disk, closed pipe) turns the exit status into
 * 1 with a one-line message, so results are never lost silently. */
void cli_guard_stdout(void);
/* Flushes stdout now; a failed write exits 1 with that one-line message. */
void cli_flush_stdout(void);
/* Flushes stdout now; on a failed write prints that one-line message (once)
 * and returns false, for a command that must still end in its own way. */
bool cli_stdout_ok(void);
/* _exit(status) (no atexit handlers, no MPI_Finalize) after the same stdout
 * check: a lost result still turns the status into 1 with a message. */
_Noreturn void cli_exit_now(int status);
/* A command-line mistake: prints one line, "vkswarm CMD: <msg> (see vkswarm
 * CMD --help)", and exits with status 2. */
_Noreturn void cli_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* getopt_long for a subcommand (argv[0] is its name) that never prints
 * getopt's own messages: an unknown or ambiguous option, a missing value or
 * a value given to a flag ends in cli_usage_error. Returns what getopt_long
 * returns otherwise. */
int cli_getopt(int argc, char **argv, const char *shortopts, const struct option *longopts, int *idx);
/* Writes s (len bytes) with terminal-active bytes escaped (vks_escape). */
void cli_put_escaped(FILE *f, const char *s, size_t len);
long cli_parse_long(const char *opt, const char *s, long lo, long hi);
double cli_parse_double(const char *opt, const char *s, double lo, double hi);
uint64_t cli_parse_u64(const char *opt, const char *s);
void cli_json_string(FILE *f, const char *s, size_t len);
double cli_now(void);

/* The chat flags of every command that gives a model prompts (vks_prompt.h):
 * --chat-template NAME, --system TEXT, --no-think (generate and tokenize take
 * these alone). */
#define CLI_CHAT_LONG_OPTIONS                                                                                     \
    {"chat-template", required_argument, 0, 0}, {"system", required_argument, 0, 0}, {"no-think", no_argument, 0, 0}
/* The prompt-format flags of rl, eval and tasks filter: the chat flags,
 * --user-template TEXT, --think-template TEXT, and --think-tokens N (eval and
 * tasks filter: the think sentence's budget; rl: length_targets), which
 * cli_prompt_option leaves to the command. */
#define CLI_PROMPT_LONG_OPTIONS                                                                                   \
    CLI_CHAT_LONG_OPTIONS, {"user-template", required_argument, 0, 0}, {"think-template", required_argument, 0, 0}, \
        {"think-tokens", required_argument, 0, 0}
/* Applies prompt flag `name` (value val) to f; false when name is not one.
 * A bad value is a usage error of cmd naming the flag. */
bool cli_prompt_option(vks_prompt_format *f, const char *cmd, const char *name, const char *val);
/* The prompt format shown once at the start: "vkswarm: CMD: prompt: TEXT"
 * on stderr, TEXT (the first prompt as rendered, no BOS) escaped on one
 * line. ctx is the command's name (a const char *). */
void cli_show_prompt(void *ctx, const char *text, size_t len);
struct vks_tokenizer;
/* vks_prompt_check_tokenizer (exit 2 with its message), then, for
 * --chat-template model (prompt.chat_template: model), one note on stderr
 * (said by rank `speaker` under mpirun): the file the template came from, the
 * family it was mapped to, and its default system message (kept, or replaced
 * by the one given). */
void cli_check_prompt(const char *cmd, const vks_prompt_format *f, const struct vks_tokenizer *tok, int speaker);

/* A progress line on stderr (step, rate, ETA), redrawn at most 4 times a second. */
typedef struct { const char *what; double start, last; bool tty; } cli_progress;
void cli_progress_start(cli_progress *p, const char *what);
void cli_progress_update(cli_progress *p, long done, long total, const char *unit);
void cli_progress_end(cli_progress *p, long done, const char *unit);
#endif
