/* Start-up of an MPI job, as weft-bench startup measures weft's (benches/src/startup.rs):
 * each rank times MPI_Init followed by a barrier; rank 0 prints the slowest rank's time as
 * "STARTUP_MAX_US <us>" and the mean of the ranks' CPU time until then (user + system of
 * the whole process, loading included) as "STARTUP_CPU_US <us>", and the mean of the part
 * of it used before main (the dynamic loader, the libraries' constructors) as
 * "STARTUP_LOAD_US <us>". */
#include <mpi.h>
#include <stdio.h>
#include <sys/resource.h>
#include <time.h>

static double cpu_us(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 + ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

int main(int argc, char **argv) {
    double loaded = cpu_us();
    double t0 = now_us();
    MPI_Init(&argc, &argv);
    MPI_Barrier(MPI_COMM_WORLD);
    double us = now_us() - t0, slowest = 0, cpu_sum = 0, loaded_sum = 0;
    double cpu = cpu_us();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Reduce(&us, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&cpu, &cpu_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&loaded, &loaded_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0)
        printf("STARTUP_MAX_US %.0f\nSTARTUP_CPU_US %.0f\nSTARTUP_LOAD_US %.0f\n", slowest, cpu_sum / size, loaded_sum / size);
    MPI_Finalize();
    return 0;
}
