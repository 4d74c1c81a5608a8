/* The collective latencies of `weft-bench coll`, written against MPI: WARMUP then ITERS
 * calls of COLLECTIVE on MPI_COMM_WORLD (all ranks released together by MPI_Barrier), each
 * rank timing its own calls; prints "LAT_US <us>" on rank 0: the largest of the ranks'
 * average times per call. BYTES as weft-bench coll reads it: the message of bcast, each
 * rank's block of allgather and alltoall, the vector of reduce and allreduce (64-bit
 * unsigned integers, summed; at least one); barrier ignores it.
 * Usage: mpirun -np N coll COLLECTIVE BYTES ITERS WARMUP */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 5) {
        if (me == 0) fprintf(stderr, "usage: coll COLLECTIVE BYTES ITERS WARMUP\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const char *coll = argv[1];
    long bytes = atol(argv[2]);
    int iters = atoi(argv[3]), warmup = atoi(argv[4]);
    long elems = bytes / 8 > 0 ? bytes / 8 : 1;
    unsigned char *a = calloc((size_t)n * (bytes > 0 ? bytes : 1), 1), *b = calloc((size_t)n * (bytes > 0 ? bytes : 1), 1);
    uint64_t *x = calloc((size_t)elems, 8), *y = calloc((size_t)elems, 8);
    for (long i = 0; i < elems; i++) x[i] = (uint64_t)me + 1;
    double start = MPI_Wtime();
    for (int it = 0; it < warmup + iters; it++) {
        if (it == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            start = MPI_Wtime();
        }
        if (!strcmp(coll, "barrier")) {
            MPI_Barrier(MPI_COMM_WORLD);
        } else if (!strcmp(coll, "bcast")) {
            MPI_Bcast(a, (int)bytes, MPI_BYTE, 0, MPI_COMM_WORLD);
        } else if (!strcmp(coll, "reduce")) {
            MPI_Reduce(x, y, (int)elems, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD);
        } else if (!strcmp(coll, "allreduce")) {
            MPI_Allreduce(x, y, (int)elems, MPI_UINT64_T, MPI_SUM, MPI_COMM_WORLD);
            if (y[0] != (uint64_t)n * (n + 1) / 2) {
                fprintf(stderr, "rank %d: allreduce gave %llu\n", me, (unsigned long long)y[0]);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        } else if (!strcmp(coll, "allgather")) {
            MPI_Allgather(a, (int)bytes, MPI_BYTE, b, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        } else if (!strcmp(coll, "alltoall")) {
            MPI_Alltoall(a, (int)bytes, MPI_BYTE, b, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
        } else {
            if (me == 0) fprintf(stderr, "unknown collective %s\n", coll);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    double mine = (MPI_Wtime() - start) * 1e6 / iters, worst = 0;
    MPI_Reduce(&mine, &worst, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (me == 0) printf("LAT_US %.3f\n", worst);
    free(a);
    free(b);
    free(x);
    free(y);
    MPI_Finalize();
    return 0;
}
