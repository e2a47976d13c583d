/* dist_nccl.cu — the gradient transport of a distributed CUDA program (kiln build --target
 * cuda --distributed; dist_mpi.h): the gradients are in device memory and NCCL sums them,
 * the same compile-time buckets as the C target's MPI transport (codegen/buckets.c), with
 * the same scaling, on a stream of their own so that they overlap the rest of the backward.
 *
 * MPI starts the processes and does everything else (dist_mpi.c: handshake, broadcast of
 * rank 0's state, metrics, timeouts); NCCL is bootstrapped over it, as llm.c does: rank 0
 * makes the unique id, MPI broadcasts it, every rank joins with ncclCommInitRank on the GPU
 * of its local rank (OMPI_COMM_WORLD_LOCAL_RANK, or its rank among the processes sharing
 * its memory).
 *
 * One bucket, from the step's hook (KILN_BUCKET_READY, right after the launch of the kernel
 * that finishes its gradients):
 *
 *   compute stream   ... kernel `ready` ─ event ready[b] ─ more backward kernels ...
 *                                               │
 *   comm stream           wait ready[b] ─ scale by this rank's share ─ ncclAllReduce(sum)
 *
 * Before the update, an event recorded on the comm stream after the last all-reduce is
 * waited for by the compute stream (the update's kernels come after the sums) and polled by
 * the host with --dist-timeout's deadline: a rank hung inside NCCL is named as one hung in
 * MPI is, then this rank's communicator is aborted (ncclCommAbort) and MPI stops the job.
 * Each rank's gradients are scaled by its share of the batch before the sum, as on the
 * C target: for 2 ranks of equal shares (x 0.5, exact) the same bits as the C transport's
 * when the per-rank gradients are.
 *
 * --deterministic: NCCL promises no order of additions in its all-reduce, so each bucket is
 * gathered instead (ncclAllGather: every rank's scaled copy, moved, not added) into
 * scratch device memory of N times the largest bucket, and a kernel adds the copies in rank
 * order: the C target's --deterministic sum, bitwise the same on every run.
 *
 * Compiled by nvcc against NCCL for the GPU, or by the host C++ compiler with
 * -DKILN_CUDA_EMU against the emulator's NCCL (emu/kemu_nccl.h: the same calls over MPI,
 * summing in rank order), as model.cu is. */
#include <stdlib.h>
#include <string.h>

extern "C" void tm_nccl_cuda_error(void);
#define KILN_CUDA_ON_ERROR() tm_nccl_cuda_error()

#define KILN_CUDA_BY_NAME 1 /* under the emulator too: the launches a GPU program makes */
#include "kiln_cuda_model.h"
#ifndef __CUDACC_RTC__ /* the host's: NVRTC compiles the kernels alone */
#include "dist_mpi.h"
#ifdef KILN_CUDA_EMU
#include "../emu/kemu_nccl.h"
#else
#include <nccl.h>
#endif
#endif

#define BLOCK 256
#define GRID_MAX 65535

static const kiln_model *M = &kiln_model_def;
static int rank, nranks, gpu;
static float weight = 1;
static ncclComm_t comm;
static cudaStream_t comm_stream;
static cudaEvent_t *ready; /* per bucket: the compute stream's point after the kernel that finishes it */
static cudaEvent_t done;   /* the comm stream's point after the last all-reduce */
static int started;
static void *ctx;          /* the device context (io->device): its compute stream */
static bool deterministic;
static float *gathered;    /* --deterministic: every rank's copy of the bucket being summed */

/* A CUDA failure reported by KILN_CUDA_CHECK or KILN_LAUNCH here: stop every rank. */
extern "C" void tm_nccl_cuda_error(void) { tm_mpi_fail("a CUDA call of the gradient all-reduce failed (above)"); }

static const char *bucket_words(int b)
{
    static char s[160];
    if (b < 0) return "";
    const kiln_grad_bucket *k = &M->buckets[b];
    snprintf(s, sizeof s, " of gradient bucket %d of %d (%lld floats from offset %lld)", b, M->nbuckets, (long long)k->count,
             (long long)k->offset);
    return s;
}

static void nccl_check(ncclResult_t r, const char *call, const char *doing, int b)
{
    if (r == ncclSuccess) return;
    const char *detail = comm ? ncclGetLastError(comm) : "";
    tm_mpi_fail("NCCL: %s, %s%s: %s%s%s (ncclResult_t %d; NCCL_DEBUG=WARN says more)", call, doing, bucket_words(b), ncclGetErrorString(r),
                detail && *detail ? ": " : "", detail ? detail : "", (int)r);
}

static void cuda_check(cudaError_t e, const char *call, const char *doing, int b)
{
    if (e == cudaSuccess) return;
    tm_mpi_fail("CUDA: %s, %s%s: %s (%s)", call, doing, bucket_words(b), cudaGetErrorString(e), cudaGetErrorName(e));
}

/* g *= w: this rank's share of the batch. Launch: grid-stride, one element per thread and turn. */
__global__ void __launch_bounds__(BLOCK) kiln_dist_share(float *g, int64_t n, float w)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) g[i] = g[i] * w;
}

/* --deterministic: out[i] = the sum of the n ranks' copies parts[r * count + i], added in
 * rank order (the C target's order). Launch: grid-stride, one element per thread and turn. */
__global__ void __launch_bounds__(BLOCK) kiln_dist_sum_ranks(const float *parts, int64_t count, int n, float *out)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < count; i += (int64_t)gridDim.x * blockDim.x) {
        float s = parts[i];
        for (int r = 1; r < n; r++) s += parts[(int64_t)r * count + i];
        out[i] = s;
    }
}

static int local_rank(void)
{
    const char *s = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    if (s && *s) return atoi(s);
    MPI_Comm local;
    int r = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &local);
    MPI_Comm_rank(local, &r);
    MPI_Comm_free(&local);
    return r;
}

void tm_grads_init(void)
{
    rank = tm_mpi_rank();
    nranks = tm_mpi_size();
    deterministic = tm_mpi_deterministic();
    int count = 0;
    cudaError_t st = cudaGetDeviceCount(&count);
    if (st != cudaSuccess || count < 1) {
        if (st != cudaSuccess)
            tm_mpi_fail("no CUDA GPU can be used: %s (%s). This program was built with --target cuda; --target cuda-emu builds the same "
                        "model.cu to run on the CPU",
                        cudaGetErrorString(st), cudaGetErrorName(st));
        tm_mpi_fail("no CUDA GPU found. This program was built with --target cuda; --target cuda-emu builds the same model.cu to run on the CPU");
    }
    const int local = local_rank();
#ifdef KILN_CUDA_EMU
    gpu = 0; /* every emulating process has a device of its own */
    (void)local;
#else
    if (local >= count) /* NCCL refuses two ranks of one communicator on one GPU */
        tm_mpi_fail("this is process %d on its machine, which has %d GPU%s: start at most one rank per GPU (mpirun -np, or "
                    "--map-by ppr:%d:node across machines)",
                    local + 1, count, count > 1 ? "s" : "", count);
    gpu = local;
#endif
    cuda_check(cudaSetDevice(gpu), "cudaSetDevice", "choosing this rank's GPU", -1);
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (rank == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", "making the communicator's id on rank 0", -1);
    MPI_Request r;
    MPI_Ibcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD, &r);
    tm_mpi_wait(&r, 1, "the broadcast of NCCL's unique id");
    nccl_check(ncclCommInitRank(&comm, nranks, id, rank), "ncclCommInitRank", "joining the communicator of every rank", -1);
    cuda_check(cudaStreamCreateWithFlags(&comm_stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags", "making the all-reduce's stream", -1);
    cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreateWithFlags", "making the all-reduce's event", -1);
}

static int grid_for(int64_t n)
{
    int64_t blocks = (n + BLOCK - 1) / BLOCK;
    return blocks < 1 ? 1 : blocks > GRID_MAX ? GRID_MAX : (int)blocks;
}

static void start_bucket(float *g, int b)
{
    const kiln_grad_bucket *k = &M->buckets[b];
    float *p = g + k->offset;
    cuda_check(cudaEventRecord(ready[b], kiln_cuda_stream(ctx)), "cudaEventRecord", "marking the end of the step's work on the gradients", b);
    cuda_check(cudaStreamWaitEvent(comm_stream, ready[b], 0), "cudaStreamWaitEvent", "ordering the all-reduce after the gradients", b);
    if (weight != 1.0f)
        KILN_LAUNCH_AT("gradient bucket: this rank's share of the batch", kiln_dist_share, grid_for(k->count), BLOCK, 0, comm_stream, p,
                       k->count, weight);
    if (!deterministic) {
        nccl_check(ncclAllReduce(p, p, (size_t)k->count, ncclFloat, ncclSum, comm, comm_stream), "ncclAllReduce", "starting the sum", b);
    } else { /* one bucket at a time in `gathered`: the comm stream runs them in order */
        nccl_check(ncclAllGather(p, gathered, (size_t)k->count, ncclFloat, comm, comm_stream), "ncclAllGather", "gathering every rank's copy", b);
        KILN_LAUNCH_AT("gradient bucket: the ranks' copies added in rank order", kiln_dist_sum_ranks, grid_for(k->count), BLOCK, 0,
                       comm_stream, gathered, k->count, nranks, p);
    }
    started++;
}

static void bucket_hook(kiln_step_io *io, int b)
{
    if (b != started) tm_mpi_fail("the training step finished gradient bucket %d before bucket %d", b, started);
    start_bucket(io->grads, b);
}

void tm_grads_attach(kiln_step_io *io, int64_t accumulate, float w)
{
    weight = w;
    if (!io->device) tm_mpi_fail("the NCCL transport needs the CUDA device's context (a program built with --target cuda)");
    ctx = io->device;
    const int nb = M->nbuckets;
    if (!ready) {
        ready = (cudaEvent_t *)calloc((size_t)nb + 1, sizeof *ready);
        if (!ready) tm_mpi_fail("out of memory");
        int64_t most = 0;
        for (int b = 0; b < nb; b++) {
            cuda_check(cudaEventCreateWithFlags(&ready[b], cudaEventDisableTiming), "cudaEventCreateWithFlags", "making its event", b);
            most = M->buckets[b].count > most ? M->buckets[b].count : most;
        }
        if (deterministic)
            cuda_check(cudaMalloc((void **)&gathered, sizeof(float) * (size_t)(most * nranks + 1)), "cudaMalloc",
                       "allocating --deterministic's copies of a bucket from every rank", -1);
    }
    io->bucket_ready = accumulate == 1 && nb > 0 ? bucket_hook : NULL;
}

/* Polled by dist_mpi.c's wait: the sums are done, or still running; a failure of NCCL (a
 * peer gone, a network error) or of CUDA stops this rank with its message. */
static int sums_done(void *arg)
{
    (void)arg;
    ncclResult_t async = ncclSuccess;
    nccl_check(ncclCommGetAsyncError(comm, &async), "ncclCommGetAsyncError", "waiting for the sums", -1);
    if (async != ncclSuccess && async != ncclInProgress) nccl_check(async, "ncclAllReduce", "summing the gradients", -1);
    cudaError_t e = cudaEventQuery(done);
    if (e == cudaErrorNotReady) return 0;
    cuda_check(e, "cudaEventQuery", "waiting for the sums of the gradients", -1);
    return 1;
}

void tm_grads_reduce(float *g, int64_t n)
{
    (void)n;
    const int nb = M->nbuckets;
    if (started == 0) /* after accumulation: the sum of the K micro-batches, at once */
        for (int b = 0; b < nb; b++) start_bucket(g, b);
    if (started != nb) tm_mpi_fail("the training step started %d of its %d gradient buckets", started, nb);
    cuda_check(cudaEventRecord(done, comm_stream), "cudaEventRecord", "marking the end of the sums", -1);
    cuda_check(cudaStreamWaitEvent(kiln_cuda_stream(ctx), done, 0), "cudaStreamWaitEvent", "ordering the update after the sums", -1);
    tm_mpi_wait_until(sums_done, NULL, "the all-reduce of the gradients (NCCL)");
    started = 0;
}

void tm_grads_zero(float *g, int64_t n)
{
    cudaStream_t s = kiln_cuda_stream(ctx);
    cuda_check(cudaMemsetAsync(g, 0, sizeof(float) * (size_t)n, s), "cudaMemsetAsync", "zeroing the gradients to time the all-reduce", -1);
    cuda_check(cudaStreamSynchronize(s), "cudaStreamSynchronize", "zeroing the gradients to time the all-reduce", -1);
}

void tm_grads_abort(void)
{
    ncclComm_t c = comm;
    comm = NULL; /* once: a failure while aborting must not come back here */
    if (c) ncclCommAbort(c);
}

void tm_grads_free(void)
{
    if (comm) {
        cudaStreamSynchronize(comm_stream);
        ncclCommDestroy(comm);
        comm = NULL;
    }
    if (ready)
        for (int b = 0; b < M->nbuckets; b++)
            if (ready[b]) cudaEventDestroy(ready[b]);
    free(ready);
    ready = NULL;
    if (gathered) cudaFree(gathered);
    gathered = NULL;
    if (done) cudaEventDestroy(done);
    if (comm_stream) cudaStreamDestroy(comm_stream);
}

/* The kernels by name (kiln_cuda.h's KILN_CUDA_MODULE). */
#define KILN_DIST_KERNELS(X) X(kiln_dist_share) X(kiln_dist_sum_ranks)
KILN_CUDA_MODULE(KILN_DIST_KERNELS);
