/* vkswarm mpirun: runs mpirun with the given arguments so that Ctrl-C is a
 * clean stop. Open MPI's mpirun (4.1) does not pass SIGINT on: it takes it as
 * "abort" (SIGCONT, SIGTERM one second later, SIGKILL one second after that),
 * too soon for the trainer to save its step. It does pass SIGUSR1 on to every
 * rank, which vkswarm's ranks take as the stop (cli_stop_install). So mpirun
 * runs in a process group of its own, where the terminal's Ctrl-C does not
 * reach it; the first Ctrl-C (or SIGTERM, SIGHUP) here becomes SIGUSR1 to
 * mpirun, a second one mpirun's own SIGINT (the abort). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include "cli_mpi.h"
#include "cli_util.h"
#include "commands.h"
#include "vkswarm/vks_common.h"

static const char mpirun_usage[] =
    "usage: vkswarm mpirun [--join | --join-run FILE] [MPIRUN OPTIONS] PROGRAM [ARGS] [: ...]\n"
    "Runs Open MPI's mpirun with these arguments, unchanged, and makes Ctrl-C a clean stop: the first\n"
    "Ctrl-C (or SIGTERM, SIGHUP) sends mpirun SIGUSR1, which it passes on to every rank; a vkswarm rl\n"
    "trainer then finishes its step, saves a checkpoint, tells every rank to stop and exits 130\n"
    "(continue with the same command and --resume). A second Ctrl-C sends mpirun SIGINT: Open MPI's\n"
    "abort, every rank killed within about 2 s. Plain mpirun takes the first Ctrl-C as that abort.\n"
    "Exit status: mpirun's (128 + N when a signal N ended it). mpirun is looked up in PATH\n"
    "(VKSWARM_MPIRUN=PATH names another). See docs/multi-machine.md \"7. Stopping cleanly\".\n"
    "When every rank on this machine has ended and mpirun has not within 5 s (Open MPI 4.1 can hang in its\n"
    "finalize after an abort), mpirun is ended and the status is the ranks' (the first non-zero exit).\n"
    "--join first starts Open MPI's ompi-server (the rendezvous that lets other machines connect to a\n"
    "running job; its URI in a temporary file) and gives mpirun --ompi-server file:FILE, so that\n"
    "`vkswarm rl --join` can open the run to joiners (docs \"Joining a run\"); ompi-server ends with\n"
    "mpirun, and if it dies first this says so (running ranks go on; later joins fail). ompi-server is\n"
    "looked up in PATH (VKSWARM_OMPI_SERVER=PATH names another).\n"
    "--join-run FILE gives mpirun --ompi-server with the ompi-server of the run whose DIR/join.uri (or\n"
    "the line in it) FILE is, so that a pipeline group joins it: vkswarm mpirun --join-run FILE -np S\n"
    "vkswarm join --run FILE.\n";

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

/* --join: ompi-server in a process group of its own (Ctrl-C is ours to pass on), its URI in
 * dir/uri; waits until the URI is written. Returns its pid. */
static pid_t start_ompi_server(char *dir, char *uri_path, size_t cap) {
    const char *server = getenv("VKSWARM_OMPI_SERVER");
    if (!server || !*server) server = "ompi-server";
    if (!mkdtemp(dir)) cli_die(1, "mpirun: --join: mkdtemp: %s", strerror(errno));
    snprintf(uri_path, cap, "%s/uri", dir);
    pid_t pid = fork();
    if (pid < 0) cli_die(1, "mpirun: --join: fork: %s", strerror(errno));
    if (pid == 0) {
        setpgid(0, 0);
        execlp(server, server, "--no-daemonize", "--report-uri", uri_path, (char *)NULL);
        fprintf(stderr, "vkswarm: mpirun: --join: cannot run %s: %s\n", server, strerror(errno));
        _exit(127);
    }
    for (int i = 0; i < 200; i++) { /* 10 s */
        struct stat st;
        if (stat(uri_path, &st) == 0 && st.st_size > 0) {
            usleep(20000); /* the line is written at once; let it finish */
            return pid;
        }
        int status;
        if (waitpid(pid, &status, WNOHANG) == pid) cli_die(1, "mpirun: --join: ompi-server exited before it was ready");
        usleep(50000);
    }
    kill(pid, SIGKILL);
    cli_die(1, "mpirun: --join: ompi-server wrote no URI within 10 s");
}

/* Open MPI 4.1.4's mpirun sometimes hangs after an abort with every local rank already ended: its main
 * thread in PMIx_server_finalize joining a progress thread that waits on a lock (tests/mpi/test_verifier.sh,
 * 2 runs in 40 on a loaded machine; NOTES.md). Its ranks are then zombies it never reaps. The local
 * children of `parent` from /proc: how many, how many ended, and the wait status mpirun would report (the
 * first non-zero exit, else the first signal, else 0; /proc/PID/stat field 52 holds it for a zombie). */
static int scan_children(pid_t parent, int *ended, int *status) {
    DIR *d = opendir("/proc");
    int n = 0, first_signal = 0;
    *ended = 0, *status = 0;
    if (!d) return 0;
    for (struct dirent *e; (e = readdir(d));) {
        char path[64], buf[1024];
        if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%.20s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = 0;
        char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
        char state = 0;
        long ppid = 0;
        if (!p || sscanf(p + 1, " %c %ld", &state, &ppid) != 2 || ppid != (long)parent) continue;
        n++;
        if (state != 'Z') continue;
        (*ended)++;
        int field = 3, code = 0; /* field 3 is the state, just after the name */
        for (char *t = p + 2; *t && field < 52; t++)
            if (*t == ' ') field++, code = field == 52 ? atoi(t + 1) : code;
        if (WIFEXITED(code) && WEXITSTATUS(code) && !*status) *status = code;
        if (WIFSIGNALED(code) && !first_signal) first_signal = code;
    }
    closedir(d);
    if (!*status) *status = first_signal;
    return n;
}

/* Whether mpirun `pid` has had only ended ranks for MPIRUN_HUNG_S (*since: when that began, -1: not now);
 * then it is ended here and *status is what its ranks said. */
#define MPIRUN_HUNG_S 5.0
static bool hung_after_ranks(pid_t pid, double *since, int *status) {
    int ended, code, n = scan_children(pid, &ended, &code);
    if (n == 0 || ended < n) {
        *since = -1;
        return false;
    }
    if (*since < 0) *since = vks_seconds_now();
    if (vks_seconds_now() - *since < MPIRUN_HUNG_S) return false;
    fprintf(stderr, "vkswarm: mpirun: every rank ended %.0f s ago but mpirun has not (Open MPI's hang in its "
                    "finalize after an abort): ending mpirun with its ranks' status\n", MPIRUN_HUNG_S);
    kill(pid, SIGKILL);
    int ignored;
    waitpid(pid, &ignored, 0);
    *status = code;
    return true;
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
    bool join = argc > 1 && !strcmp(argv[1], "--join");
    int join_run = argc > 1 && !strcmp(argv[1], "--join-run") ? 2 : 0; /* the option and its file */
    if (join_run && argc < 3) cli_usage_error("mpirun", "--join-run needs the run's DIR/join.uri");
    if (argc < 2 + join + join_run) cli_usage_error("mpirun", "no mpirun arguments (see vkswarm mpirun --help)");
    char port[1024], run_server[1024];
    if (join_run) cli_read_join_line("mpirun", "--join-run", argv[2], port, sizeof port, run_server, sizeof run_server);
    const char *mpirun = getenv("VKSWARM_MPIRUN");
    if (!mpirun || !*mpirun) mpirun = "mpirun";
    char **args = calloc((size_t)argc + 3, sizeof *args);
    if (!args) cli_die(1, "mpirun: out of memory");
    char dir[] = "/tmp/vkswarm-ompi-server-XXXXXX", uri[64], server_arg[80];
    pid_t server = join ? start_ompi_server(dir, uri, sizeof uri) : 0;
    int n = 0;
    args[n++] = (char *)mpirun;
    if (join) {
        snprintf(server_arg, sizeof server_arg, "file:%s", uri);
        args[n++] = "--ompi-server", args[n++] = server_arg;
    }
    if (join_run) args[n++] = "--ompi-server", args[n++] = run_server;
    for (int i = 1 + join + join_run; i < argc; i++) args[n++] = argv[i];
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
    double all_ended_since = -1;
    unsigned polls = 0;
    for (;;) { /* mpirun, and ompi-server should it die first */
        pid_t w = waitpid(-1, &status, WNOHANG);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) cli_die(1, "mpirun: waitpid: %s", strerror(errno));
        if (w == pid) break;
        if (w > 0 && w == server) {
            fprintf(stderr, "vkswarm: mpirun: ompi-server ended (%s %d): the running ranks go on; joins will fail\n",
                    WIFSIGNALED(status) ? "signal" : "status", WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
            server = 0;
        }
        if (w > 0) continue;
        if (++polls % 5 == 0 && hung_after_ranks(pid, &all_ended_since, &status)) break; /* once a second */
        usleep(200000);
    }
    if (server > 0) {
        kill(server, SIGTERM);
        int s2;
        for (int i = 0; i < 100 && waitpid(server, &s2, WNOHANG) == 0; i++) usleep(20000);
        kill(server, SIGKILL);
        waitpid(server, &s2, WNOHANG);
    }
    if (join) unlink(uri), rmdir(dir);
    free(args);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return WEXITSTATUS(status);
}
