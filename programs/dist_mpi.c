/* dist_mpi.c — dist.h on MPI: the processes of a program built with kiln build
 * --distributed and started by `mpirun -np N PROG` train one model data-parallel
 * (docs/distributed.md).
 *
 * Every rank reads the same seeded order of the data (the cursor is global, so checkpoints
 * do not depend on the number of ranks) and computes its share of the recipe's batch,
 * which stays the global batch. The step's loss is a mean over the samples, so a rank's
 * gradients are the mean over its share: scaled by share / batch, they sum over the ranks
 * to the mean over the global batch, what one process computes (but for the order of the
 * additions). The loss and metrics go to rank 0, which adds them in rank order. The
 * gradients' sum is the transport's (dist_mpi.h): MPI's in host memory (dist_grads_mpi.c)
 * or NCCL's in device memory (dist_nccl.cu); this file is everything else.
 *
 * Only the thread that calls main() calls MPI (MPI_THREAD_FUNNELED): the hooks run
 * between the step's kernels, whose OpenMP regions have joined.
 *
 * Faults: MPI and mpirun stop every rank when one dies (mpirun names it); a rank that
 * hangs would leave the others waiting forever in a collective, so every wait here polls
 * with a deadline (--dist-timeout). Past it, the ranks that are waiting say so to rank 0,
 * which names the ranks that did not: those are the hung ones (wait_for). */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dist_mpi.h"

extern const kiln_model kiln_model_def;
static const kiln_model *M = &kiln_model_def;

#define DEFAULT_TIMEOUT 300.0 /* seconds: beyond an evaluation or checkpoint of rank 0 */
#define TAG_METRICS 1701
#define TAG_STUCK 1702

static int rank, nranks;
static bool deterministic;
static double timeout_s = DEFAULT_TIMEOUT;
static float weight = 1; /* this rank's share of the batch / the batch */
static int64_t share_first, share_count;
static double wait_total;
static double *metrics_in, *metrics_out;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* One message naming this rank, then every rank stops (mpirun's exit status is 1). */
#define fail tm_mpi_fail
void tm_mpi_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: error: rank %d of %d: ", M->name, rank, nranks);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    fflush(stderr);
    fflush(stdout);
    tm_grads_abort();
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1); /* not reached: MPI_Abort does not return */
}

/* The work waited for: MPI requests, or the transport's own (an event's query). */
typedef struct {
    int (*done)(void *arg);
    void *arg;
} Work;

typedef struct {
    MPI_Request *r;
    int n;
} Requests;

static int requests_done(void *arg)
{
    Requests *q = arg;
    int done = 0;
    MPI_Testall(q->n, q->r, &done, MPI_STATUSES_IGNORE);
    return done;
}

/* Polls until done or the deadline: 1 when done. */
static int poll_until(Work w, double deadline)
{
    for (long spins = 0;; spins++) {
        if (w.done(w.arg)) return 1;
        if ((spins & 255) == 0 && now() > deadline) return 0;
        sched_yield();
    }
}

/* Waits for the work, so that a rank that never comes cannot hang this one. Past the
 * deadline, a rank other than 0 tells rank 0 that it is stuck too and waits for rank 0 to
 * stop everyone; rank 0 gives the others as long again to say so, and names those that did
 * not: they are hung (or dead without MPI noticing). A rank 0 that never answers is named
 * by the others. */
static void wait_work(Work w, const char *what)
{
    if (poll_until(w, now() + timeout_s)) return;
    if (rank != 0) {
        int me = rank;
        MPI_Request told;
        MPI_Isend(&me, 1, MPI_INT, 0, TAG_STUCK, MPI_COMM_WORLD, &told);
        MPI_Request_free(&told); /* a small message: sent eagerly, nothing to wait for */
        if (poll_until(w, now() + timeout_s)) return; /* late, but it came */
        fail("%s did not complete within %g s, and rank 0 has not answered: rank 0 is hung or too slow (--dist-timeout SECONDS "
             "waits longer)",
             what, timeout_s);
    }
    int *stuck = calloc((size_t)nranks, sizeof *stuck), *from = calloc((size_t)nranks, sizeof *from);
    MPI_Request *q = calloc((size_t)nranks, sizeof *q);
    if (!stuck || !from || !q) fail("%s did not complete within %g s", what, timeout_s);
    for (int k = 1; k < nranks; k++) MPI_Irecv(&from[k], 1, MPI_INT, k, TAG_STUCK, MPI_COMM_WORLD, &q[k]);
    const double deadline = now() + timeout_s;
    for (int waiting = nranks - 1; waiting > 0 && now() < deadline;) {
        if (w.done(w.arg)) { /* late, but it came: the stuck messages are left unread (they carry nothing) */
            for (int k = 1; k < nranks; k++)
                if (!stuck[k]) MPI_Cancel(&q[k]), MPI_Request_free(&q[k]);
            free(stuck), free(from), free(q);
            return;
        }
        for (int k = 1; k < nranks; k++) {
            int got = 0;
            if (!stuck[k]) MPI_Test(&q[k], &got, MPI_STATUS_IGNORE);
            if (got) stuck[k] = 1, waiting--;
        }
        sched_yield();
    }
    char names[512] = "";
    size_t o = 0;
    int hung = 0;
    for (int k = 1; k < nranks && o + 16 < sizeof names; k++)
        if (!stuck[k]) o += (size_t)snprintf(names + o, sizeof names - o, "%s%d", hung++ ? ", " : "", k);
    if (hung)
        fail("%s did not complete within %g s: rank%s %s did not answer (hung, or too slow: --dist-timeout SECONDS waits longer)", what,
             timeout_s, hung > 1 ? "s" : "", names);
    fail("%s did not complete within %g s, and every other rank waits too (--dist-timeout SECONDS waits longer)", what, timeout_s);
}

static void wait_for(MPI_Request *r, int n, const char *what)
{
    Requests q = {r, n};
    wait_work((Work){requests_done, &q}, what);
}

void tm_mpi_wait(MPI_Request *r, int n, const char *what) { wait_for(r, n, what); }
void tm_mpi_wait_until(int (*done)(void *arg), void *arg, const char *what) { wait_work((Work){done, arg}, what); }
int tm_mpi_rank(void) { return rank; }
int tm_mpi_size(void) { return nranks; }
int tm_mpi_deterministic(void) { return deterministic; }
double tm_mpi_now(void) { return now(); }

/* ---- hashes: the handshake and the check of shared state ---- */

static uint64_t mix(uint64_t h, uint64_t x)
{
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    h *= 0xff51afd7ed558ccdull;
    return h ^ (h >> 33);
}

static uint64_t hash_string(uint64_t h, const char *s)
{
    for (; s && *s; s++) h = mix(h, (unsigned char)*s);
    return mix(h, 0);
}

static uint64_t hash_bytes(uint64_t h, const void *p, int64_t n)
{
    const unsigned char *b = p;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, b + i, 8);
        h = mix(h, w);
    }
    for (; i < n; i++) h = mix(h, b[i]);
    return h;
}

/* What must be the same on every rank: the model (its graph's hash), the build (sizes,
 * kernels, buckets: another kiln or other build flags give another) and the options. */
typedef struct {
    uint64_t model, build, options;
    char name[64];
} Hello;

static uint64_t build_hash(void)
{
    uint64_t h = mix(0, (uint64_t)M->nparam_floats);
    h = mix(h, (uint64_t)M->buffer_bytes);
    h = mix(h, (uint64_t)M->train_arena_bytes);
    h = mix(h, (uint64_t)M->eval_arena_bytes);
    for (int k = 0; k < M->ntrain_kernels; k++) {
        h = hash_string(h, M->train_kernels[k].function);
        h = mix(h, M->train_kernels[k].line);
    }
    for (int b = 0; b < M->nbuckets; b++) {
        h = mix(h, (uint64_t)M->buckets[b].offset);
        h = mix(h, (uint64_t)M->buckets[b].count);
        h = mix(h, (uint64_t)M->buckets[b].ready);
    }
    return h;
}

static void handshake(int argc, char **argv)
{
    Hello me, *all = calloc((size_t)nranks, sizeof *all);
    if (!all) fail("out of memory");
    memset(&me, 0, sizeof me);
    me.model = strtoull(M->hash, NULL, 16);
    me.build = build_hash();
    me.options = 0;
    for (int i = 1; i < argc; i++) me.options = hash_string(me.options, argv[i]);
    snprintf(me.name, sizeof me.name, "%s", M->name);
    MPI_Request r;
    MPI_Iallgather(&me, (int)sizeof me, MPI_BYTE, all, (int)sizeof me, MPI_BYTE, MPI_COMM_WORLD, &r);
    wait_for(&r, 1, "the handshake at start");
    for (int k = 1; k < nranks; k++) {
        const Hello ok = all[k], zk = all[0], *o = &ok, *z = &zk; /* copies: `all` is freed before the message */
        const char *why = o->model != z->model ? "another model" : o->build != z->build ? "another build" : o->options != z->options ? "other options" : NULL;
        if (!why) continue;
        if (rank != 0) { /* rank 0 says it and stops everyone */
            MPI_Request never;
            MPI_Ibarrier(MPI_COMM_WORLD, &never);
            wait_for(&never, 1, "the refused handshake");
        }
        free(all);
        if (o->model != z->model)
            fail("rank %d runs another model (%s, hash %016llx) than rank 0 (%s, hash %016llx): start every rank with the same program", k, o->name,
                 (unsigned long long)o->model, z->name, (unsigned long long)z->model);
        if (o->build != z->build)
            fail("rank %d runs another build of %s than rank 0 (its sizes, kernels or gradient buckets differ): build one program with "
                 "kiln build --distributed and start it on every rank",
                 k, z->name);
        fail("rank %d was started with other options than rank 0: give every rank the same options", k);
    }
    free(all);
}

/* ---- start ---- */

int tm_dist_init(int *argc, char **argv)
{
    int provided = 0;
    if (MPI_Init_thread(argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "%s: error: MPI_Init failed\n", M->name);
        return 1;
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    /* Rank 0 alone prints progress, evaluations and samples; errors stay on every rank's stderr. */
    if (rank != 0 && !freopen("/dev/null", "w", stdout)) fail("cannot discard standard output: %s", strerror(errno));
    handshake(*argc, argv); /* before anything is parsed: options are compared whole */
    int n = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--deterministic")) {
            deterministic = true;
        } else if (!strcmp(a, "--dist-timeout")) {
            char *end = NULL;
            errno = 0;
            double v = i + 1 < *argc ? strtod(argv[i + 1], &end) : NAN;
            if (i + 1 >= *argc || end == argv[i + 1] || *end || errno || !(v >= 1 && v <= 1e6)) {
                fprintf(stderr, "%s: error: --dist-timeout %s: give the seconds a rank waits for the others, from 1 to 1000000\n", M->name,
                        i + 1 < *argc ? argv[i + 1] : "(nothing)");
                return 2;
            }
            timeout_s = v;
            i++;
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    argv[n] = NULL;
    metrics_in = calloc((size_t)(2 + M->nmetrics) * (size_t)nranks, sizeof *metrics_in);
    metrics_out = calloc((size_t)(2 + M->nmetrics), sizeof *metrics_out);
    if (!metrics_in || !metrics_out) fail("out of memory");
    tm_grads_init();
    return -1;
}

void tm_dist_usage(FILE *f)
{
    fprintf(f, "  %-22s %s\n", "--deterministic", "sum gradients in a fixed order: bitwise-reproducible runs for a number of ranks");
    fprintf(f, "  %-22s %s\n", "--dist-timeout S", "stop when a rank has not answered for S seconds (default 300)");
}

int tm_dist_rank(void) { return rank; }
int tm_dist_size(void) { return nranks; }

void tm_dist_share(int64_t batch, int64_t *first, int64_t *count)
{
    int64_t q = batch / nranks, rem = batch % nranks;
    *first = rank * q + (rank < rem ? rank : rem);
    *count = q + (rank < rem);
}

const char *tm_dist_describe(int64_t batch)
{
    static char s[96];
    int64_t q = batch / nranks;
    const char *ranks = nranks == 1 ? "rank" : "ranks";
    if (batch % nranks == 0) snprintf(s, sizeof s, "%d %s × batch %lld", nranks, ranks, (long long)q);
    else snprintf(s, sizeof s, "%d %s × batch %lld-%lld", nranks, ranks, (long long)q, (long long)q + 1);
    return s;
}

/* ---- shared state ---- */

static void broadcast(void *p, int64_t bytes, const char *what)
{
    for (int64_t at = 0; at < bytes; at += 1 << 30) {
        int64_t n = bytes - at < (1 << 30) ? bytes - at : (1 << 30);
        MPI_Request r;
        MPI_Ibcast((char *)p + at, (int)n, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
        wait_for(&r, 1, what);
    }
}

void tm_dist_share_state(float *params, int64_t nparam_floats, unsigned char *buffers, int64_t buffer_bytes, float *const *slabs,
                         int nslabs, int64_t *counters, int ncounters)
{
    const int64_t slab = (int64_t)sizeof(float) * nparam_floats;
    broadcast(params, slab, "the broadcast of rank 0's parameters");
    broadcast(buffers, buffer_bytes, "the broadcast of rank 0's buffers");
    for (int k = 0; k < nslabs; k++)
        if (slabs[k]) broadcast(slabs[k], slab, "the broadcast of rank 0's optimizer state");
    broadcast(counters, (int64_t)sizeof *counters * ncounters, "the broadcast of rank 0's position in training");
    uint64_t mine = hash_bytes(hash_bytes(1, params, slab), buffers, buffer_bytes), *all = calloc((size_t)nranks, sizeof *all);
    if (!all) fail("out of memory");
    MPI_Request r;
    MPI_Iallgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD, &r);
    wait_for(&r, 1, "the check of the broadcast parameters");
    for (int k = 1; k < nranks; k++)
        if (all[k] != all[0]) {
            unsigned long long h0 = (unsigned long long)all[0], hk = (unsigned long long)all[k];
            free(all);
            fail("rank %d's parameters differ from rank 0's after the broadcast (hash %016llx, rank 0's %016llx)", k, hk, h0);
        }
    free(all);
}

/* ---- gradients: the transport's ---- */

void tm_dist_attach(kiln_step_io *io, int64_t batch, int64_t accumulate)
{
    tm_dist_share(batch, &share_first, &share_count);
    if (batch < nranks) /* every rank computes at least one sample; a step of none has no mean */
        fail("the batch of %lld is smaller than the %d ranks: give --batch %d or more, or start fewer ranks", (long long)batch, nranks, nranks);
    weight = (float)((double)share_count / (double)batch);
    tm_grads_attach(io, accumulate, weight);
}

void tm_dist_reduce_grads(float *g, int64_t n)
{
    const double t0 = now();
    tm_grads_reduce(g, n);
    wait_total += now() - t0;
}

/* ---- loss and metrics ---- */

void tm_dist_global_metrics(kiln_step_io *io, int64_t step)
{
    const int n = 2 + M->nmetrics;
    double *in = metrics_in, *out = metrics_out, *own = in; /* rank 0: its own, then the others' */
    own[0] = (double)step;
    own[1] = (double)weight * io->loss;
    for (int k = 0; k < M->nmetrics; k++) own[2 + k] = (double)weight * io->metrics[k];
    char what[96];
    snprintf(what, sizeof what, "the loss of step %lld", (long long)step + 1);
    if (rank == 0) {
        MPI_Request *r = calloc((size_t)nranks, sizeof *r);
        if (!r) fail("out of memory");
        for (int k = 1; k < nranks; k++) {
            MPI_Irecv(in + (size_t)k * n, n, MPI_DOUBLE, k, TAG_METRICS, MPI_COMM_WORLD, &r[k - 1]);
        }
        wait_for(r, nranks - 1, what);
        for (int k = 1; k < nranks; k++)
            if (in[(size_t)k * n] != (double)step)
                fail("rank %d is at step %.0f, rank 0 at step %lld", k, in[(size_t)k * n] + 1, (long long)step + 1);
        for (int j = 0; j < n; j++) { /* in rank order: the same sums on every run */
            double s = in[j];
            for (int k = 1; k < nranks; k++) s += in[(size_t)k * n + j];
            out[j] = s;
        }
        out[0] = (double)step;
        for (int k = 1; k < nranks; k++) MPI_Isend(out, n, MPI_DOUBLE, k, TAG_METRICS, MPI_COMM_WORLD, &r[k - 1]);
        wait_for(r, nranks - 1, what);
        free(r);
    } else {
        MPI_Request r[2];
        MPI_Isend(own, n, MPI_DOUBLE, 0, TAG_METRICS, MPI_COMM_WORLD, &r[0]);
        MPI_Irecv(out, n, MPI_DOUBLE, 0, TAG_METRICS, MPI_COMM_WORLD, &r[1]);
        wait_for(r, 2, what);
    }
    io->loss = out[1];
    for (int k = 0; k < M->nmetrics; k++) io->metrics[k] = out[2 + k];
}

/* ---- benchmarks and the end ---- */

double tm_dist_wait_seconds(void)
{
    double s = wait_total;
    wait_total = 0;
    return s;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double tm_dist_allreduce_ms(float *g, int64_t n, int reps)
{
    double t[32];
    if (reps > 32) reps = 32;
    tm_grads_zero(g, n);
    for (int i = 0; i < reps; i++) {
        MPI_Request r;
        MPI_Ibarrier(MPI_COMM_WORLD, &r);
        wait_for(&r, 1, "the barrier before timing the all-reduce");
        double t0 = now();
        tm_dist_reduce_grads(g, n);
        t[i] = 1e3 * (now() - t0);
    }
    tm_dist_wait_seconds();
    qsort(t, (size_t)reps, sizeof *t, cmp_double);
    return reps ? t[reps / 2] : 0;
}

int tm_dist_finish(int rc)
{
    fflush(stdout);
    fflush(stderr);
    if (rc != 0) { /* the other ranks may wait for this one: stop them */
        tm_grads_abort();
        MPI_Abort(MPI_COMM_WORLD, rc);
    }
    tm_grads_free();
    free(metrics_in);
    free(metrics_out);
    MPI_Finalize();
    return 0;
}
