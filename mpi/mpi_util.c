/* Start, stop and share values across the world (see vks_mpi.h). */
#include "vks_mpi.h"
#include <limits.h>
#include <stdlib.h>

void vks_mpi_start(bool worker_thread, int *rank, int *size) {
    int provided;
    MPI_Init_thread(NULL, NULL, worker_thread ? MPI_THREAD_FUNNELED : MPI_THREAD_SINGLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
}

void vks_mpi_stop(void) { MPI_Finalize(); }

_Noreturn void vks_mpi_abort(int status) {
    MPI_Abort(MPI_COMM_WORLD, status);
    exit(status);
}

MPI_Comm vks_mpi_world(void) { return MPI_COMM_WORLD; }

void vks_mpi_bcast(void *buf, size_t bytes, int root) {
    MPI_Bcast(buf, bytes > INT_MAX ? INT_MAX : (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
}

void vks_mpi_allgather(const void *mine, void *all, size_t bytes) {
    int n = bytes > INT_MAX ? INT_MAX : (int)bytes;
    MPI_Allgather(mine, n, MPI_BYTE, all, n, MPI_BYTE, MPI_COMM_WORLD);
}
