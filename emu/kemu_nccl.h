/* kemu_nccl.h — the NCCL API subset of Kiln's CUDA emulator, for the distributed CUDA
 * program's gradient transport (programs/dist_nccl.cu) built with --target cuda-emu.
 *
 * Real NCCL cannot run without a GPU; this one runs the same calls over MPI on the
 * emulator's device memory (host memory), so that the program's buckets, events and
 * streams are exercised in CI. The names, types and enum values are NCCL's (nccl.h 2.x),
 * so that either build means the same. Semantics kept: a communicator is one rank of
 * nranks that all called ncclCommInitRank with the unique id rank 0 made (checked: a
 * rank whose id differs is refused); buffers must be device memory; the work is
 * stream-ordered as the emulator's other stream work is (done at once, in call order);
 * an all-reduce sums in rank order (rank 0's values, plus rank 1's, ...), so its results
 * are deterministic; an all-gather moves every rank's buffer, in rank order. Only float32
 * and float64 are emulated, and the sum (what Kiln uses); other types and operations are
 * refused with ncclInvalidArgument and a message.
 *
 * Needs MPI started (MPI_Init) before ncclCommInitRank: the emulated communicator is a
 * duplicate of MPI_COMM_WORLD. In libkiln_cuda_emu_nccl.a, apart from the emulator, so
 * that programs without MPI link none. */
#ifndef KEMU_NCCL_H
#define KEMU_NCCL_H

#include <stddef.h>

#include "kemu_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0
#define NCCL_VERSION_CODE 22800
#define NCCL_UNIQUE_ID_BYTES 128

typedef struct kemu_nccl_comm *ncclComm_t;
typedef struct {
    char internal[NCCL_UNIQUE_ID_BYTES];
} ncclUniqueId;

typedef enum {
    ncclSuccess = 0,
    ncclUnhandledCudaError = 1,
    ncclSystemError = 2,
    ncclInternalError = 3,
    ncclInvalidArgument = 4,
    ncclInvalidUsage = 5,
    ncclRemoteError = 6,
    ncclInProgress = 7,
    ncclNumResults = 8
} ncclResult_t;

typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;

typedef enum {
    ncclInt8 = 0, ncclChar = 0,
    ncclUint8 = 1,
    ncclInt32 = 2, ncclInt = 2,
    ncclUint32 = 3,
    ncclInt64 = 4,
    ncclUint64 = 5,
    ncclFloat16 = 6, ncclHalf = 6,
    ncclFloat32 = 7, ncclFloat = 7,
    ncclFloat64 = 8, ncclDouble = 8,
    ncclBfloat16 = 9
} ncclDataType_t;

ncclResult_t ncclGetVersion(int *version);
ncclResult_t ncclGetUniqueId(ncclUniqueId *uniqueId);
ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *asyncError);
ncclResult_t ncclCommCount(const ncclComm_t comm, int *count);
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank);
const char *ncclGetErrorString(ncclResult_t result);
const char *ncclGetLastError(ncclComm_t comm);
ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count, ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
/* recvbuff: the nranks' sendcount elements, in rank order. */
ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount, ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
/* Between these, collectives are queued and run at ncclGroupEnd, in call order. */
ncclResult_t ncclGroupStart(void);
ncclResult_t ncclGroupEnd(void);

#ifdef __cplusplus
}
#endif

#endif
