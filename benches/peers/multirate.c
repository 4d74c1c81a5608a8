/* The multirate loop of weft-bench (benches/src/multirate.rs) written against MPI, so that
 * an MPI library's rate is measured with the same pattern, pairs, window, size and
 * iterations: weft-bench multirate --peer openmpi|mpich builds it with mpicc and runs it
 * with mpirun beside weft.
 *
 * usage: multirate-mpi PATTERN MODE PAIRS SIZE WINDOW ITERATIONS COMM_PER_PAIR [LEVEL]
 *   PATTERN: pairwise | one-to-many | many-to-one | many-to-many
 *   MODE:    process  (2T ranks of one thread: senders 0..T, receivers T..2T)
 *            thread   (2 ranks of T threads, MPI_THREAD_MULTIPLE: senders on rank 0)
 *            hybrid-P (2P ranks: the T senders in blocks over ranks 0..P, the receivers
 *                      over P..2P, several threads a rank with MPI_THREAD_MULTIPLE)
 *   LEVEL:   needed   (the default: MPI_THREAD_SINGLE where a rank has one thread)
 *            multiple (MPI_THREAD_MULTIPLE in every mode: a library's thread safety, which
 *                      weft always has, paid by one thread a rank too)
 * Rank 0 prints "MSG_RATE <messages per second>": data messages over the time from the
 * first worker leaving the start barrier to the last one done.
 *
 * One iteration (per link sender -> receiver): the receiver pre-posts WINDOW receives and
 * sends a 1-byte ready; the sender waits for its readies, sends WINDOW messages to each of
 * its receivers and waits for them; the receiver waits for its receives and sends a 1-byte
 * ack, which the sender receives. */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { READY_TAG = 1 << 20, ACK_TAG = (1 << 20) + 1 };

static int pattern, per_side, per_rank, pairs, size, window, iterations, comm_per_pair;
static MPI_Comm *comms; /* per link (comm_per_pair) or all MPI_COMM_WORLD */

/* Whether sender i sends to receiver j. */
static int linked(int i, int j) {
    switch (pattern) {
    case 0: return i == j;
    case 1: return i == 0;
    case 2: return j == 0;
    default: return 1;
    }
}

/* World rank of sender i / receiver j (per_rank workers a rank, in blocks) and the data tag
 * of link (i, j). */
static int sender_rank(int i) { return i / per_rank; }
static int receiver_rank(int j) { return per_side + j / per_rank; }
static int link_tag(int i, int j) { return i * pairs + j; }
static MPI_Comm link_comm(int i, int j) { return comms[i * pairs + j]; }

struct worker {
    int sender, index;
    double t0, t1;
    pthread_t thread;
};

static void run_sender(int i, int iters) {
    char *buf = calloc((size_t)size + 1, 1), one = 0;
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)window * pairs);
    for (int it = 0; it < iters; it++) {
        for (int j = 0; j < pairs; j++)
            if (linked(i, j))
                MPI_Recv(&one, 1, MPI_CHAR, receiver_rank(j), READY_TAG + 2 * link_tag(i, j), link_comm(i, j), MPI_STATUS_IGNORE);
        int n = 0;
        for (int j = 0; j < pairs; j++)
            if (linked(i, j))
                for (int k = 0; k < window; k++)
                    MPI_Isend(buf, size, MPI_CHAR, receiver_rank(j), link_tag(i, j), link_comm(i, j), &reqs[n++]);
        MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        for (int j = 0; j < pairs; j++)
            if (linked(i, j))
                MPI_Recv(&one, 1, MPI_CHAR, receiver_rank(j), ACK_TAG + 2 * link_tag(i, j), link_comm(i, j), MPI_STATUS_IGNORE);
    }
    free(reqs);
    free(buf);
}

static void run_receiver(int j, int iters) {
    char *buf = calloc(((size_t)size + 1) * window * pairs, 1), one = 0;
    MPI_Request *reqs = malloc(sizeof(MPI_Request) * (size_t)window * pairs);
    for (int it = 0; it < iters; it++) {
        int n = 0;
        for (int i = 0; i < pairs; i++)
            if (linked(i, j))
                for (int k = 0; k < window; k++, n++)
                    MPI_Irecv(buf + (size_t)n * (size + 1), size, MPI_CHAR, sender_rank(i), link_tag(i, j), link_comm(i, j), &reqs[n]);
        for (int i = 0; i < pairs; i++)
            if (linked(i, j))
                MPI_Send(&one, 1, MPI_CHAR, sender_rank(i), READY_TAG + 2 * link_tag(i, j), link_comm(i, j));
        MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        for (int i = 0; i < pairs; i++)
            if (linked(i, j))
                MPI_Send(&one, 1, MPI_CHAR, sender_rank(i), ACK_TAG + 2 * link_tag(i, j), link_comm(i, j));
    }
    free(reqs);
    free(buf);
}

static pthread_barrier_t start;

static void *work(void *arg) {
    struct worker *w = arg;
    int warmup = iterations / 10 < 10 ? iterations / 10 : 10;
    if (w->sender)
        run_sender(w->index, warmup);
    else
        run_receiver(w->index, warmup);
    if (per_rank > 1)
        pthread_barrier_wait(&start);
    w->t0 = MPI_Wtime();
    if (w->sender)
        run_sender(w->index, iterations);
    else
        run_receiver(w->index, iterations);
    w->t1 = MPI_Wtime();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 8 && argc != 9) {
        fprintf(stderr, "usage: %s PATTERN MODE PAIRS SIZE WINDOW ITERATIONS COMM_PER_PAIR [needed|multiple]\n", argv[0]);
        return 2;
    }
    const char *names[] = {"pairwise", "one-to-many", "many-to-one", "many-to-many"};
    pattern = -1;
    for (int p = 0; p < 4; p++)
        if (!strcmp(argv[1], names[p]))
            pattern = p;
    pairs = atoi(argv[3]);
    per_side = !strcmp(argv[2], "thread") ? 1 : !strcmp(argv[2], "process") ? pairs : !strncmp(argv[2], "hybrid-", 7) ? atoi(argv[2] + 7) : -1;
    if (per_side > pairs)
        per_side = pairs;
    per_rank = per_side > 0 ? (pairs + per_side - 1) / per_side : 0;
    size = atoi(argv[4]);
    window = atoi(argv[5]);
    iterations = atoi(argv[6]);
    comm_per_pair = atoi(argv[7]);
    int always_multiple = argc == 9 && !strcmp(argv[8], "multiple");
    if (argc == 9 && !always_multiple && strcmp(argv[8], "needed")) {
        fprintf(stderr, "bad thread level %s (needed, multiple)\n", argv[8]);
        return 2;
    }
    if (pattern < 0 || per_side < 1 || pairs < 1 || size < 0 || window < 1 || iterations < 1) {
        fprintf(stderr, "bad arguments\n");
        return 2;
    }
    int provided, rank, nranks;
    int threaded = per_rank > 1, required = threaded || always_multiple ? MPI_THREAD_MULTIPLE : MPI_THREAD_SINGLE;
    MPI_Init_thread(&argc, &argv, required, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (nranks != 2 * per_side || provided < required) {
        if (rank == 0)
            fprintf(stderr, "needs %d ranks%s\n", 2 * per_side, required == MPI_THREAD_MULTIPLE ? " and MPI_THREAD_MULTIPLE" : "");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    comms = malloc(sizeof(MPI_Comm) * (size_t)pairs * pairs);
    for (int l = 0; l < pairs * pairs; l++) {
        comms[l] = MPI_COMM_WORLD;
        if (comm_per_pair)
            MPI_Comm_dup(MPI_COMM_WORLD, &comms[l]);
    }
    /* This rank's workers: the senders (or receivers) of its block. */
    int side_rank = rank < per_side ? rank : rank - per_side, first_worker = side_rank * per_rank;
    int workers = pairs - first_worker < per_rank ? pairs - first_worker : per_rank;
    struct worker *ws = calloc((size_t)workers, sizeof *ws);
    for (int k = 0; k < workers; k++) {
        ws[k].sender = rank < per_side;
        ws[k].index = first_worker + k;
    }
    /* A worker with no link (one-to-many: senders 1..T) still takes part in the timing. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (threaded) {
        pthread_barrier_init(&start, NULL, (unsigned)workers);
        for (int k = 0; k < workers; k++)
            pthread_create(&ws[k].thread, NULL, work, &ws[k]);
        for (int k = 0; k < workers; k++)
            pthread_join(ws[k].thread, NULL);
    } else {
        work(&ws[0]);
    }
    double t0 = ws[0].t0, t1 = ws[0].t1, first, last;
    for (int k = 1; k < workers; k++) {
        t0 = ws[k].t0 < t0 ? ws[k].t0 : t0;
        t1 = ws[k].t1 > t1 ? ws[k].t1 : t1;
    }
    MPI_Reduce(&t0, &first, 1, MPI_DOUBLE, MPI_MIN, 0, MPI_COMM_WORLD);
    MPI_Reduce(&t1, &last, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    long links = 0;
    for (int i = 0; i < pairs; i++)
        for (int j = 0; j < pairs; j++)
            links += linked(i, j);
    if (rank == 0)
        printf("MSG_RATE %.0f\n", (double)links * window * iterations / (last - first));
    if (comm_per_pair)
        for (int l = 0; l < pairs * pairs; l++)
            MPI_Comm_free(&comms[l]);
    free(comms);
    free(ws);
    MPI_Finalize();
    return 0;
}
