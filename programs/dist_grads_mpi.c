/* dist_grads_mpi.c — the gradient transport of the C target's distributed programs
 * (dist_mpi.h): the gradients are in host memory and MPI sums them, one non-blocking
 * all-reduce per gradient bucket (codegen/buckets.c), started by the step's hook as soon as
 * the backward has finished a bucket and waited for before clipping and the optimizer.
 * Each rank's gradients are first scaled by its share of the batch, so that the sum is the
 * global batch's mean.
 *
 * --deterministic replaces MPI's all-reduce, whose order of additions MPI does not promise,
 * by a reduce-scatter in which each rank adds its part of every bucket in rank order, then
 * an all-gather: bitwise the same result on every run with the same number of ranks.
 *
 * OpenMPI progresses a non-blocking collective only inside MPI calls, so each hook also
 * tests the buckets in flight. */
#include <stdlib.h>
#include <string.h>

#include "dist_mpi.h"

static const kiln_model *M = &kiln_model_def;

static int rank, nranks;
static bool deterministic;
static float weight = 1;

/* The buckets of one step: started by the hooks (or all at once by tm_grads_reduce after
 * accumulation), completed by tm_grads_reduce. */
static MPI_Request *req_scatter, *req_gather;
static int started;
static int *chunk_len, *chunk_at; /* per bucket and rank: the rank's part (deterministic) */
static int *recv_len, *recv_at;   /* per bucket and rank: where this rank receives them */
static float *scratch;            /* per bucket: every rank's copy of this rank's part */
static int64_t *scratch_at;

void tm_grads_init(void)
{
    rank = tm_mpi_rank();
    nranks = tm_mpi_size();
    deterministic = tm_mpi_deterministic();
}

static void start_bucket(float *g, int b)
{
    const kiln_grad_bucket *k = &M->buckets[b];
    float *p = g + k->offset;
    const int64_t n = k->count;
    const float w = weight;
    if (w != 1.0f) {
        #pragma omp parallel for simd if (n >= 65536) schedule(simd: static)
        for (int64_t i = 0; i < n; i++) p[i] *= w;
    }
    if (!deterministic) {
        MPI_Iallreduce(MPI_IN_PLACE, p, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &req_scatter[b]);
    } else {
        const int *len = chunk_len + (size_t)b * nranks, *at = chunk_at + (size_t)b * nranks;
        const int *rl = recv_len + (size_t)b * nranks, *ra = recv_at + (size_t)b * nranks;
        MPI_Ialltoallv(p, len, at, MPI_FLOAT, scratch + scratch_at[b], rl, ra, MPI_FLOAT, MPI_COMM_WORLD, &req_scatter[b]);
    }
    started++;
    int done;
    MPI_Testall(started, req_scatter, &done, MPI_STATUSES_IGNORE); /* progress the buckets in flight */
}

static void bucket_hook(kiln_step_io *io, int b)
{
    if (b != started) tm_mpi_fail("the training step finished gradient bucket %d before bucket %d", b, started);
    start_bucket(io->grads, b);
}

void tm_grads_attach(kiln_step_io *io, int64_t accumulate, float w)
{
    weight = w;
    const int nb = M->nbuckets;
    if (!req_scatter) {
        req_scatter = calloc((size_t)nb + 1, sizeof *req_scatter);
        req_gather = calloc((size_t)nb + 1, sizeof *req_gather);
        scratch_at = calloc((size_t)nb + 1, sizeof *scratch_at);
        const size_t cells = (size_t)nb * (size_t)nranks + 1;
        chunk_len = calloc(cells, sizeof(int)), chunk_at = calloc(cells, sizeof(int));
        recv_len = calloc(cells, sizeof(int)), recv_at = calloc(cells, sizeof(int));
        if (!req_scatter || !req_gather || !scratch_at || !chunk_len || !chunk_at || !recv_len || !recv_at) tm_mpi_fail("out of memory");
        int64_t total = 0;
        for (int b = 0; b < nb; b++) {
            const int64_t count = M->buckets[b].count, q = count / nranks, rem = count % nranks;
            int *len = chunk_len + (size_t)b * nranks, *at = chunk_at + (size_t)b * nranks;
            for (int r = 0; r < nranks; r++) {
                len[r] = (int)(q + (r < rem));
                at[r] = (int)(r * q + (r < rem ? r : rem));
            }
            for (int r = 0; r < nranks; r++) { /* every rank's copy of this rank's part, in rank order */
                recv_len[(size_t)b * nranks + r] = len[rank];
                recv_at[(size_t)b * nranks + r] = r * len[rank];
            }
            scratch_at[b] = total;
            total += (int64_t)len[rank] * nranks;
        }
        if (deterministic && !(scratch = malloc(sizeof(float) * (size_t)(total + 1))))
            tm_mpi_fail("out of memory for %lld floats of reduction buffers", (long long)total);
    }
    io->bucket_ready = accumulate == 1 && nb > 0 ? bucket_hook : NULL;
}

void tm_grads_reduce(float *g, int64_t n)
{
    (void)n;
    const int nb = M->nbuckets;
    if (started == 0)
        for (int b = 0; b < nb; b++) start_bucket(g, b);
    if (started != nb) tm_mpi_fail("the training step started %d of its %d gradient buckets", started, nb);
    if (!deterministic) {
        tm_mpi_wait(req_scatter, nb, "the all-reduce of the gradients");
    } else {
        for (int b = 0; b < nb; b++) {
            tm_mpi_wait(&req_scatter[b], 1, "the reduce-scatter of the gradients");
            const int len = chunk_len[(size_t)b * nranks + rank];
            const float *s = scratch + scratch_at[b];
            float *mine = g + M->buckets[b].offset + chunk_at[(size_t)b * nranks + rank];
            for (int i = 0; i < len; i++) { /* rank 0's, then rank 1's, ...: one order on every run */
                float sum = s[i];
                for (int r = 1; r < nranks; r++) sum += s[(size_t)r * len + i];
                mine[i] = sum;
            }
            MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, g + M->buckets[b].offset, chunk_len + (size_t)b * nranks,
                            chunk_at + (size_t)b * nranks, MPI_FLOAT, MPI_COMM_WORLD, &req_gather[b]);
        }
        tm_mpi_wait(req_gather, nb, "the all-gather of the gradients");
    }
    started = 0;
}

void tm_grads_zero(float *g, int64_t n) { memset(g, 0, sizeof(float) * (size_t)n); }

void tm_grads_abort(void) {}

void tm_grads_free(void)
{
    free(req_scatter);
    free(req_gather);
    free(scratch_at);
    free(chunk_len);
    free(chunk_at);
    free(recv_len);
    free(recv_at);
    free(scratch);
}
