/* The all-to-all round of `weft-bench alltoall`, written against MPI: every rank posts
 * MPI_Irecv from every other rank, MPI_Isend of SIZE bytes to every other rank (destinations
 * starting after itself), MPI_Waitall; payloads stamped with (source, round) and checked.
 * Prints "ROUND_US <us>" on rank 0: wall time of ROUNDS timed rounds (after WARMUP, all
 * ranks released by MPI_Barrier) per round.
 * Usage: mpirun -np N alltoall SIZE ROUNDS WARMUP */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int me, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (argc < 4) {
        if (me == 0) fprintf(stderr, "usage: alltoall SIZE ROUNDS WARMUP\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    long size = atol(argv[1]);
    int rounds = atoi(argv[2]), warmup = atoi(argv[3]);
    if (size < 2) size = 2;
    /* A buffer per peer and direction, each its own allocation, as weft's rounds have them
     * (one Vec each): the kernel's copy of a rendezvous runs at the speed the two buffers'
     * relative alignment allows, so both programs get their buffers the same way. */
    unsigned char **sbuf = malloc(sizeof(unsigned char *) * n), **rbuf = malloc(sizeof(unsigned char *) * n);
    for (int p = 0; p < n; p++) {
        sbuf[p] = calloc((size_t)size, 1);
        rbuf[p] = calloc((size_t)size, 1);
    }
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * 2 * n);
    double start = MPI_Wtime();
    for (int round = 0; round < warmup + rounds; round++) {
        if (round == warmup) {
            MPI_Barrier(MPI_COMM_WORLD);
            start = MPI_Wtime();
        }
        int k = 0;
        for (int p = 0; p < n; p++)
            if (p != me) MPI_Irecv(rbuf[p], (int)size, MPI_BYTE, p, 1, MPI_COMM_WORLD, &reqs[k++]);
        for (int step = 1; step < n; step++) {
            int p = (me + step) % n;
            unsigned char *b = sbuf[p];
            b[0] = (unsigned char)me;
            b[size - 1] = (unsigned char)round;
            MPI_Isend(b, (int)size, MPI_BYTE, p, 1, MPI_COMM_WORLD, &reqs[k++]);
        }
        MPI_Waitall(k, reqs, MPI_STATUSES_IGNORE);
        for (int p = 0; p < n; p++) {
            if (p == me) continue;
            unsigned char *b = rbuf[p];
            if (b[0] != (unsigned char)p || b[size - 1] != (unsigned char)round) {
                fprintf(stderr, "rank %d round %d: wrong message from %d\n", me, round, p);
                MPI_Abort(MPI_COMM_WORLD, 1);
            }
        }
    }
    double elapsed = MPI_Wtime() - start;
    MPI_Barrier(MPI_COMM_WORLD);
    if (me == 0) printf("ROUND_US %.3f\n", elapsed * 1e6 / rounds);
    for (int p = 0; p < n; p++) {
        free(sbuf[p]);
        free(rbuf[p]);
    }
    free(sbuf);
    free(rbuf);
    free(reqs);
    MPI_Finalize();
    return 0;
}
