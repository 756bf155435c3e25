/* cli_mpi.h: how a command ends an MPI job. The library (mpi/) reports
 * errors and never ends the process; these are the command's decisions. */
#ifndef VKS_CLI_MPI_H
#define VKS_CLI_MPI_H
#include <stddef.h>
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
/* The join line "PORT@SERVER" of a run open to joins (its DIR/join.uri) from
 * `run`, the file or the line itself, named as option `opt` of command `cmd`
 * in errors (bad input: exit 2). */
void cli_read_join_line(const char *cmd, const char *opt, const char *run, char *port, size_t port_cap, char *server,
                        size_t server_cap);
#endif
