/* vks_mpi.h: the few MPI calls the command-line tools need (start, stop,
 * share a value), so that MPI is called only from mpi/. */
#ifndef VKS_MPI_H
#define VKS_MPI_H
#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>

/* MPI_Init_thread (FUNNELED when a GPU worker thread exists) on the world. */
void vks_mpi_start(bool worker_thread, int *rank, int *size);
void vks_mpi_stop(void);
/* Stops every rank of the job with this exit status. */
_Noreturn void vks_mpi_abort(int status);
/* The world communicator, for the mpi/ modules' entry points. */
MPI_Comm vks_mpi_world(void);
void vks_mpi_bcast(void *buf, size_t bytes, int root);
void vks_mpi_allgather(const void *mine, void *all, size_t bytes);
#endif
