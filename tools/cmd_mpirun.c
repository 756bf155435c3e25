/* vkswarm mpirun: runs mpirun with the given arguments so that Ctrl-C is a
 * clean stop. Open MPI's mpirun (4.1) does not pass SIGINT on: it takes it as
 * "abort" (SIGCONT, SIGTERM one second later, SIGKILL one second after that),
 * too soon for the trainer to save its step. It does pass SIGUSR1 on to every
 * rank, which vkswarm's ranks take as the stop (cli_stop_install). So mpirun
 * runs in a process group of its own, where the terminal's Ctrl-C does not
 * reach it; the first Ctrl-C (or SIGTERM, SIGHUP) here becomes SIGUSR1 to
 * mpirun, a second one mpirun's own SIGINT (the abort). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli_util.h"
#include "commands.h"

static const char mpirun_usage[] =
    "usage: vkswarm mpirun [MPIRUN OPTIONS] PROGRAM [ARGS] [: ...]\n"
    "Runs Open MPI's mpirun with these arguments, unchanged, and makes Ctrl-C a clean stop: the first\n"
    "Ctrl-C (or SIGTERM, SIGHUP) sends mpirun SIGUSR1, which it passes on to every rank; a vkswarm rl\n"
    "trainer then finishes its step, saves a checkpoint, tells every rank to stop and exits 130\n"
    "(continue with the same command and --resume). A second Ctrl-C sends mpirun SIGINT: Open MPI's\n"
    "abort, every rank killed within about 2 s. Plain mpirun takes the first Ctrl-C as that abort.\n"
    "Exit status: mpirun's (128 + N when a signal N ended it). mpirun is looked up in PATH\n"
    "(VKSWARM_MPIRUN=PATH names another). See docs/multi-machine.md \"7. Stopping cleanly\".\n";

static volatile sig_atomic_t child_pid, signals_seen;

/* async-signal-safe: kill and write only */
static void forward(int sig) {
    (void)sig;
    int n = ++signals_seen;
    if (child_pid <= 0) return;
    static const char first[] = "vkswarm: mpirun: stopping cleanly: SIGUSR1 to every rank (the trainer saves its step; "
                                "Ctrl-C again ends the job at once)\n";
    static const char again[] = "vkswarm: mpirun: SIGINT to mpirun: Open MPI ends every rank now\n";
    ssize_t w = n == 1 ? write(STDERR_FILENO, first, sizeof first - 1) : write(STDERR_FILENO, again, sizeof again - 1);
    (void)w;
    kill((pid_t)child_pid, n == 1 ? SIGUSR1 : SIGINT);
}

static void run_child(const char *mpirun, char **args, const sigset_t *mask) {
    setpgid(0, 0); /* the terminal's signals reach the parent only */
    signal(SIGINT, SIG_DFL), signal(SIGTERM, SIG_DFL), signal(SIGHUP, SIG_DFL);
    sigprocmask(SIG_SETMASK, mask, NULL); /* exec keeps the mask */
    execvp(mpirun, args);
    fprintf(stderr, "vkswarm: mpirun: cannot run %s: %s\n", mpirun, strerror(errno));
    _exit(127);
}

int cmd_mpirun(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(mpirun_usage, stdout);
        return 0;
    }
    if (argc < 2) cli_usage_error("mpirun", "no mpirun arguments (see vkswarm mpirun --help)");
    const char *mpirun = getenv("VKSWARM_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    char **args = calloc((size_t)argc + 1, sizeof *args);
    if (!args) cli_die(1, "mpirun: out of memory");
    args[0] = (char *)mpirun;
    for (int i = 1; i < argc; i++) args[i] = argv[i];
    fflush(NULL);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = forward;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL), sigaction(SIGTERM, &sa, NULL), sigaction(SIGHUP, &sa, NULL);
    /* a signal before child_pid is set waits, blocked, until it is */
    sigset_t block, old;
    sigemptyset(&block);
    sigaddset(&block, SIGINT), sigaddset(&block, SIGTERM), sigaddset(&block, SIGHUP);
    sigprocmask(SIG_BLOCK, &block, &old);
    pid_t pid = fork();
    if (pid < 0) cli_die(1, "mpirun: fork: %s", strerror(errno));
    if (pid == 0) run_child(mpirun, args, &old);
    setpgid(pid, pid); /* as the child does: whichever runs first */
    child_pid = pid;
    sigprocmask(SIG_SETMASK, &old, NULL);
    int status;
    while (waitpid(pid, &status, 0) < 0)
        if (errno != EINTR) cli_die(1, "mpirun: waitpid: %s", strerror(errno));
    free(args);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
