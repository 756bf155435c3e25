/* Placeholder until the first MPI role lands. */ typedef int vks_mpi_placeholder;
