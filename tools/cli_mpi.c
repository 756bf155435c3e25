/* cli_mpi.c: ending an MPI job, the one thing in tools/ that calls MPI (see cli_mpi.h). */
#include "cli_mpi.h"
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
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
