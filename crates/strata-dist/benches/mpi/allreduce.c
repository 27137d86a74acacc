/* MPI_Allreduce (float, MPI_SUM) timed the way `cargo xtask bench allreduce` times
 * strata's allreduce: for each size, a loop of allreduces on the same buffers, timed by
 * each rank with MPI_Wtime after a warm-up and a barrier; the slowest rank's time counts.
 * Built by the bench with `mpicc -O2`, run with `mpirun -n 2 --mca btl self,vader`.
 *
 * usage: allreduce <target seconds per loop> <loops per size> <bytes>[:<iterations>]...
 * (with iterations given, the loop is not calibrated). Prints, from rank 0, one line per
 * timed loop:
 *   RESULT <bytes> <separate|inplace> <loop> <iterations> <seconds>
 * and exits non-zero if a result differs from the host golden. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, nranks;

/* n allreduces of `count` floats: separate send/receive buffers, or in place on `a`. */
static void loop(float *a, float *b, int count, long n, int inplace) {
    for (long i = 0; i < n; i++) {
        if (inplace)
            MPI_Allreduce(MPI_IN_PLACE, a, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        else
            MPI_Allreduce(a, b, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
}

/* Seconds of the slowest rank for a barrier-aligned loop of n allreduces. */
static double timed(float *a, float *b, int count, long n, int inplace) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    loop(a, b, count, n, inplace);
    double dt = MPI_Wtime() - t0, worst;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return worst;
}

/* One allreduce of rank-dependent data against the host golden. */
static int check(float *a, float *b, int count, int inplace) {
    for (int i = 0; i < count; i++) a[i] = (float)((rank + 1) * (i % 13));
    loop(a, b, count, 1, inplace);
    float *r = inplace ? a : b;
    float k = (float)(nranks * (nranks + 1) / 2);
    for (int i = 0; i < count; i++) {
        if (r[i] != k * (float)(i % 13)) {
            fprintf(stderr, "rank %d: element %d is %g, expected %g\n", rank, i, r[i],
                    k * (float)(i % 13));
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    if (argc < 4) {
        if (rank == 0) fprintf(stderr, "usage: %s <seconds> <loops> <bytes>...\n", argv[0]);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    double target = atof(argv[1]);
    int loops = atoi(argv[2]);
    int bad = 0;
    for (int s = 3; s < argc; s++) {
        char *colon;
        long bytes = strtol(argv[s], &colon, 10);
        long given = *colon == ':' ? atol(colon + 1) : 0;
        int count = (int)(bytes / 4);
        float *a, *b;
        if (posix_memalign((void **)&a, 4096, bytes) || posix_memalign((void **)&b, 4096, bytes))
            MPI_Abort(MPI_COMM_WORLD, 3);
        for (int inplace = 0; inplace < 2; inplace++) {
            bad |= check(a, b, count, inplace);
            memset(a, 0, bytes);
            memset(b, 0, bytes);
            /* Calibrate (this is also the first warm-up): double the loop until it takes
             * 50 ms, then size it to `target` seconds. Every rank uses the slowest time. */
            long iters = given;
            if (iters <= 0) {
                long n = 1;
                double dt;
                while ((dt = timed(a, b, count, n, inplace)) < 0.05) n *= 2;
                iters = (long)(target / (dt / n)) + 1;
            }
            for (int l = 0; l < loops; l++) {
                loop(a, b, count, iters / 10 + 1, inplace); /* warm-up */
                double secs = timed(a, b, count, iters, inplace);
                if (rank == 0)
                    printf("RESULT %ld %s %d %ld %.9f\n", bytes, inplace ? "inplace" : "separate",
                           l, iters, secs);
                fflush(stdout);
            }
        }
        free(a);
        free(b);
    }
    int any;
    MPI_Allreduce(&bad, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    MPI_Finalize();
    return any;
}
