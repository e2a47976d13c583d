/* nccl.c — the emulator's NCCL (kemu_nccl.h): communicators and all-reduces over MPI, on
 * the emulator's device memory, so that a distributed CUDA program built with --target
 * cuda-emu runs the very code that calls NCCL on GPUs.
 *
 * An all-reduce gathers every rank's buffer (MPI_Allgather on the communicator's own
 * duplicate of MPI_COMM_WORLD, so that it never matches the program's other MPI traffic),
 * then each rank adds them in rank order: the same bits on every rank and every run, as
 * --deterministic's reduce-scatter gives on the C target (N times the buffer in scratch
 * memory: fine for an emulator); an all-gather is MPI_Allgather. Like the emulator's other
 * stream work they run at once, when called: the stream's earlier work has already run. Only the thread that called
 * MPI_Init calls in (the program's main thread), as MPI_THREAD_FUNNELED requires. */
#include <mpi.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kemu_internal.h"
#include "kemu_nccl.h"

struct kemu_nccl_comm {
    MPI_Comm mpi;
    int rank, nranks;
    int aborted;
};

static char last_error[512];

static ncclResult_t nccl_fail(ncclResult_t r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static ncclResult_t nccl_fail(ncclResult_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return r;
}

ncclResult_t ncclGetVersion(int *version)
{
    if (!version) return nccl_fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return last_error;
}

/* An id no other job makes: the process, the clock and a counter; ncclCommInitRank checks
 * that every rank got the same one (the broadcast the program must do). */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    static unsigned counter;
    if (!id) return nccl_fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
    memset(id, 0, sizeof *id);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal, sizeof id->internal, "kemu-nccl %ld %lld.%09ld %u", (long)getpid(), (long long)ts.tv_sec, ts.tv_nsec, counter++);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (!comm) return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: comm is NULL");
    *comm = NULL;
    int started = 0, world_rank = 0, world_size = 0;
    MPI_Initialized(&started);
    if (!started)
        return nccl_fail(ncclInvalidUsage, "ncclCommInitRank: the emulator's NCCL runs over MPI: call MPI_Init before it (the program is "
                                           "started by mpirun)");
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    if (nranks != world_size || rank != world_rank)
        return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: rank %d of %d, but the emulator's communicators are MPI_COMM_WORLD's (rank %d of %d)",
                         rank, nranks, world_rank, world_size);
    if (id.internal[0] == 0)
        return nccl_fail(ncclInvalidArgument, "ncclCommInitRank: the unique id is empty (ncclGetUniqueId on rank 0, then broadcast it)");
    struct kemu_nccl_comm *c = calloc(1, sizeof *c);
    if (!c) return nccl_fail(ncclSystemError, "ncclCommInitRank: out of host memory");
    MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    c->rank = rank;
    c->nranks = nranks;
    /* every rank must hold rank 0's id: a rank that made its own is in another clique */
    ncclUniqueId root = id;
    MPI_Bcast(&root, (int)sizeof root, MPI_BYTE, 0, c->mpi);
    int same = !memcmp(&root, &id, sizeof id), all_same = 0;
    MPI_Allreduce(&same, &all_same, 1, MPI_INT, MPI_LAND, c->mpi);
    if (!all_same) {
        MPI_Comm_free(&c->mpi);
        free(c);
        return nccl_fail(ncclInvalidUsage, "ncclCommInitRank: %s",
                         same ? "another rank was given another unique id than rank 0's" : "this rank's unique id is not rank 0's (broadcast rank 0's)");
    }
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    if (!comm->aborted) MPI_Comm_free(&comm->mpi);
    free(comm);
    return ncclSuccess;
}

/* Real NCCL stops its kernels in flight; here nothing is ever in flight. The MPI
 * communicator is left as it is: the caller is about to stop the job (MPI_Abort). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm) return ncclSuccess;
    comm->aborted = 1;
    free(comm);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (!comm || !async_error) return nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
    *async_error = ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count) return nccl_fail(ncclInvalidArgument, "ncclCommCount: comm or count is NULL");
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank) return nccl_fail(ncclInvalidArgument, "ncclCommUserRank: comm or rank is NULL");
    *rank = comm->rank;
    return ncclSuccess;
}

/* ---- all-reduce ---- */

typedef struct {
    bool gather; /* ncclAllGather, else ncclAllReduce */
    const void *send;
    void *recv;
    size_t count;
    ncclDataType_t type;
    ncclComm_t comm;
} Op;

static int group_depth;
static Op *queued;
static size_t nqueued, queue_cap;

static ncclResult_t run(const Op *op)
{
    const size_t esize = op->type == ncclFloat32 ? 4 : 8, bytes = op->count * esize;
    const int n = op->comm->nranks;
    if (op->count == 0) return ncclSuccess;
    if (op->count > (size_t)INT32_MAX / 8)
        return nccl_fail(ncclInvalidArgument, "%s: %zu elements: the emulator takes at most %d per call", op->gather ? "ncclAllGather" : "ncclAllReduce",
                         op->count, INT32_MAX / 8);
    if (op->gather) {
        MPI_Allgather(op->send, (int)bytes, MPI_BYTE, op->recv, (int)bytes, MPI_BYTE, op->comm->mpi);
        return ncclSuccess;
    }
    unsigned char *all = malloc(bytes * (size_t)n);
    if (!all) return nccl_fail(ncclSystemError, "ncclAllReduce: out of host memory for %zu bytes of scratch", bytes * (size_t)n);
    MPI_Allgather(op->send, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, op->comm->mpi);
    if (op->type == ncclFloat32) {
        const float *a = (const float *)all;
        float *out = op->recv;
        for (size_t i = 0; i < op->count; i++) { /* rank 0's, then rank 1's, ...: one order */
            float s = a[i];
            for (int r = 1; r < n; r++) s += a[(size_t)r * op->count + i];
            out[i] = s;
        }
    } else {
        const double *a = (const double *)all;
        double *out = op->recv;
        for (size_t i = 0; i < op->count; i++) {
            double s = a[i];
            for (int r = 1; r < n; r++) s += a[(size_t)r * op->count + i];
            out[i] = s;
        }
    }
    free(all);
    return ncclSuccess;
}

/* Checks and runs (or queues, in a group) an all-reduce or all-gather. */
static ncclResult_t enqueue(const char *fn, Op o, cudaStream_t stream)
{
    if (!o.comm || o.comm->aborted) return nccl_fail(ncclInvalidArgument, "%s: the communicator is NULL or aborted", fn);
    if (o.type != ncclFloat32 && o.type != ncclFloat64)
        return nccl_fail(ncclInvalidArgument, "%s: the emulator takes float32 and float64 only, not data type %d", fn, (int)o.type);
    if (!kemu_stream_valid(stream)) return nccl_fail(ncclInvalidArgument, "%s: the stream is not a live stream", fn);
    const size_t bytes = o.count * (o.type == ncclFloat32 ? 4 : 8), out = o.gather ? bytes * (size_t)o.comm->nranks : bytes;
    if (o.count && (kemu_memory_kind(o.send, bytes) != KEMU_MEM_DEVICE || kemu_memory_kind(o.recv, out) != KEMU_MEM_DEVICE))
        return nccl_fail(ncclInvalidArgument, "%s: %zu bytes at %p -> %zu at %p are not all device memory (cudaMalloc): NCCL moves device "
                                              "buffers",
                         fn, bytes, o.send, out, o.recv);
    if (group_depth == 0) return run(&o);
    if (nqueued == queue_cap) {
        size_t cap = queue_cap ? 2 * queue_cap : 16;
        Op *q = realloc(queued, cap * sizeof *q);
        if (!q) return nccl_fail(ncclSystemError, "ncclAllReduce: out of host memory");
        queued = q, queue_cap = cap;
    }
    queued[nqueued++] = o;
    return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream)
{
    if (op != ncclSum) return nccl_fail(ncclInvalidArgument, "ncclAllReduce: the emulator sums only (ncclSum), not operation %d", (int)op);
    return enqueue("ncclAllReduce", (Op){false, send, recv, count, type, comm}, stream);
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t count, ncclDataType_t type, ncclComm_t comm, cudaStream_t stream)
{
    return enqueue("ncclAllGather", (Op){true, send, recv, count, type, comm}, stream);
}

ncclResult_t ncclGroupStart(void)
{
    group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (group_depth == 0) return nccl_fail(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
    if (--group_depth > 0) return ncclSuccess;
    ncclResult_t r = ncclSuccess;
    for (size_t i = 0; i < nqueued && r == ncclSuccess; i++) r = run(&queued[i]);
    nqueued = 0;
    free(queued);
    queued = NULL;
    queue_cap = 0;
    return r;
}
