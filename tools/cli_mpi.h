/* cli_mpi.h: how a command ends an MPI job. The library (mpi/) reports
 * errors and never ends the process; these are the command's decisions. */
#ifndef VKS_CLI_MPI_H
#define VKS_CLI_MPI_H
#include "vkswarm/vks_mpi.h"

/* Flushes stdout and stderr and ends every rank of the job with `status`
 * (MPI_Abort): for errors after which MPI_Finalize would wait forever. */
_Noreturn void cli_mpi_abort(int status);
/* The exit status of an MPI-side error code: 3 for a silent rank
 * (VKS_ERR_TIMEOUT) or one that refused its part (VKS_ERR_PEER), 2 for bad input from a rank or file, 1 otherwise. */
int cli_mpi_status(int rc);
/* vks_mpi_stuck_fn for the start-up and finalize watchdogs: prints
 * "vkswarm: <message>" and ends this process with status 3. */
void cli_mpi_stuck(const char *message);
#endif
