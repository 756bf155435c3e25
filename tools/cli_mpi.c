/* cli_mpi.c: ending an MPI job (the one thing in tools/ that calls MPI), and reading a run's join line (see cli_mpi.h). */
#define _POSIX_C_SOURCE 200809L
#include "cli_mpi.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "cli_util.h"
#include "vkswarm/vks_common.h"

_Noreturn void cli_mpi_abort(int status) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);
}

int cli_mpi_status(int rc) {
    if (rc == VKS_ERR_TIMEOUT || rc == VKS_ERR_PEER) return 3;
    if (rc == VKS_ERR_FORMAT || rc == VKS_ERR_ARG) return EXIT_BAD_INPUT;
    return 1;
}

void cli_mpi_stuck(const char *message) {
    fprintf(stderr, "vkswarm: %s\n", message);
    fflush(stderr);
    _exit(3);
}

void cli_read_join_line(const char *cmd, const char *opt, const char *run, char *port, size_t port_cap, char *server, size_t server_cap) {
    char *text = NULL;
    size_t len = 0;
    struct stat st;
    if (stat(run, &st) == 0) {
        if (vks_file_read_all(run, 8192, &text, &len)) cli_die(EXIT_BAD_INPUT, "%s: %s", cmd, vks_last_error());
    } else {
        text = strdup(run);
        if (!text) cli_die(1, "%s: out of memory", cmd);
        len = strlen(text);
    }
    len = strnlen(text, len);
    text[strcspn(text, "\r\n")] = 0;
    char *at = strchr(text, '@');
    if (!at || at == text || !at[1] || (size_t)(at - text) >= port_cap || strlen(at + 1) >= server_cap) {
        char shown[600];
        vks_escape(run, strlen(run), shown, sizeof shown);
        cli_note("%s: %s %s: %s", cmd, opt, shown, stat(run, &st) == 0
                 ? "not a join line (PORT@SERVER, as the run's DIR/join.uri holds)"
                 : "no such file, nor a join line (PORT@SERVER): the run removes DIR/join.uri when it ends");
        free(text);
        cli_exit_now(EXIT_BAD_INPUT);
    }
    *at = 0;
    snprintf(port, port_cap, "%s", text);
    snprintf(server, server_cap, "%s", at + 1);
    free(text);
}

