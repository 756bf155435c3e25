/* exchange_blame: the start-up blame cascade, made deterministic (3 ranks).
 * Rank 1 delivers its part of two exchanges (tags A and B) to rank 0 only and
 * then goes silent, as a rank stopped right after an exchange whose sends to
 * rank 2 were still waiting for a connection. Rank 0 gets through A and waits
 * on rank 2 in B; rank 2 is still in A, waiting on rank 1. Rank 0 times out
 * first (shorter timeout) and must name rank 1, the rank everyone waits for,
 * not rank 2, which is alive and waiting. Each rank prints its error on stdout
 * ("rank R: MESSAGE") and leaves without MPI_Finalize (requests are pending).
 * Usage: mpirun -np 3 exchange_blame */
#include <stdio.h>
#include <unistd.h>
#include "vkswarm/vks_common.h"
#include "vkswarm/vks_mpi.h"

enum { TAG_A = 150, TAG_B = 151 };

static void report(int rank, int rc) {
    printf("rank %d: %s\n", rank, rc ? vks_last_error() : "ok");
    fflush(stdout);
}

int main(void) {
    int rank, size, mine = 0, all[3];
    vks_mpi_start(VKS_MPI_THREADS_SINGLE, &rank, &size);
    if (size != 3) {
        fprintf(stderr, "exchange_blame: run with 3 ranks\n");
        _exit(2);
    }
    mine = rank;
    double leave_at = vks_seconds_now() + 7; /* every rank has printed by then (a leaving rank ends the job) */
    if (rank == 1) { /* its parts reach rank 0 only, then silence */
        MPI_Send(&mine, sizeof mine, MPI_BYTE, 0, TAG_A, MPI_COMM_WORLD);
        MPI_Send(&mine, sizeof mine, MPI_BYTE, 0, TAG_B, MPI_COMM_WORLD);
    } else if (rank == 0) {
        report(rank, vks_mpi_exchange(MPI_COMM_WORLD, &mine, all, sizeof mine, TAG_A, 4.0, "exchange A"));
        report(rank, vks_mpi_exchange(MPI_COMM_WORLD, &mine, all, sizeof mine, TAG_B, 1.0, "exchange B"));
    } else {
        report(rank, vks_mpi_exchange(MPI_COMM_WORLD, &mine, all, sizeof mine, TAG_A, 3.0, "exchange A"));
    }
    while (vks_seconds_now() < leave_at) usleep(10000);
    _exit(0);
}
