// api_compat.cu — host code over the whole API subset of the emulator, compiled both ways:
// by nvcc against the real CUDA 13 headers (tests/test_cuda_emu_nvcc.c) and by the host
// compiler against emu/ (the test library of tests/test_cuda_emu.c). Names,
// signatures and enum values that differ between the two break one of the builds: the
// static_asserts hold the real headers' values, the calls the real signatures. kt_api_tour
// runs the calls and checks the emulator's answers.
#include "kiln_cuda.h"

#include "kernels.h"

#include <stdint.h>
#include <string.h>

// Enum values (driver_types.h, cublas_api.h, cublasLt.h, library_types.h of CUDA 13.0).
static_assert(cudaSuccess == 0 && cudaErrorInvalidValue == 1 && cudaErrorMemoryAllocation == 2, "cudaError");
static_assert(cudaErrorInvalidConfiguration == 9 && cudaErrorInvalidDevice == 101, "cudaError");
static_assert(cudaErrorInvalidResourceHandle == 400 && cudaErrorNotReady == 600, "cudaError");
static_assert(cudaErrorIllegalAddress == 700 && cudaErrorLaunchOutOfResources == 701, "cudaError");
static_assert(cudaErrorLaunchFailure == 719 && cudaErrorNotSupported == 801, "cudaError");
static_assert(cudaMemcpyHostToHost == 0 && cudaMemcpyHostToDevice == 1 && cudaMemcpyDeviceToHost == 2 &&
                  cudaMemcpyDeviceToDevice == 3 && cudaMemcpyDefault == 4,
              "cudaMemcpyKind");
static_assert(cudaFuncAttributeMaxDynamicSharedMemorySize == 8, "cudaFuncAttribute");
static_assert(cudaDevAttrMultiProcessorCount == 16 && cudaDevAttrMaxSharedMemoryPerBlockOptin == 97, "cudaDeviceAttr");
static_assert(cudaStreamNonBlocking == 1 && cudaEventDisableTiming == 2, "flags");
static_assert(CUBLAS_STATUS_SUCCESS == 0 && CUBLAS_STATUS_NOT_INITIALIZED == 1 && CUBLAS_STATUS_INVALID_VALUE == 7 &&
                  CUBLAS_STATUS_EXECUTION_FAILED == 13 && CUBLAS_STATUS_NOT_SUPPORTED == 15,
              "cublasStatus_t");
static_assert(CUBLAS_OP_N == 0 && CUBLAS_OP_T == 1 && CUBLAS_OP_C == 2, "cublasOperation_t");
static_assert(CUBLAS_DEFAULT_MATH == 0 && CUBLAS_TF32_TENSOR_OP_MATH == 3, "cublasMath_t");
static_assert(CUBLAS_COMPUTE_32F == 68 && CUBLAS_COMPUTE_32F_FAST_TF32 == 77, "cublasComputeType_t");
static_assert(CUDA_R_32F == 0 && CUDA_R_16F == 2 && CUDA_R_16BF == 14, "cudaDataType");
static_assert(CUBLASLT_ORDER_COL == 0 && CUBLASLT_ORDER_ROW == 1, "cublasLtOrder_t");
static_assert(CUBLASLT_MATRIX_LAYOUT_TYPE == 0 && CUBLASLT_MATRIX_LAYOUT_ORDER == 1 && CUBLASLT_MATRIX_LAYOUT_LD == 4 &&
                  CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT == 5 && CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET == 6,
              "cublasLtMatrixLayoutAttribute_t");
static_assert(CUBLASLT_MATMUL_DESC_TRANSA == 3 && CUBLASLT_MATMUL_DESC_TRANSB == 4 &&
                  CUBLASLT_MATMUL_DESC_EPILOGUE == 7 && CUBLASLT_MATMUL_DESC_BIAS_POINTER == 8 &&
                  CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE == 10 && CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER == 11 &&
                  CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD == 12 && CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE == 26,
              "cublasLtMatmulDescAttributes_t");
static_assert(CUBLASLT_EPILOGUE_DEFAULT == 1 && CUBLASLT_EPILOGUE_RELU == 2 && CUBLASLT_EPILOGUE_BIAS == 4 &&
                  CUBLASLT_EPILOGUE_RELU_BIAS == 6 && CUBLASLT_EPILOGUE_GELU == 32 &&
                  CUBLASLT_EPILOGUE_GELU_BIAS == 36 && CUBLASLT_EPILOGUE_GELU_AUX == 160 &&
                  CUBLASLT_EPILOGUE_GELU_AUX_BIAS == 164,
              "cublasLtEpilogue_t");
static_assert(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES == 1, "cublasLtMatmulPreferenceAttributes_t");
// Layouts that host code may copy or put on the stack.
static_assert(sizeof(cublasLtMatmulAlgo_t) == 64 && sizeof(cublasLtMatrixLayoutOpaque_t) == 64 &&
                  sizeof(cublasLtMatmulDescOpaque_t) == 256 && sizeof(cublasLtMatmulPreferenceOpaque_t) == 64,
              "cuBLASLt opaque sizes");
static_assert(sizeof(dim3) == 12 && sizeof(uint3) == 12 && sizeof(float4) == 16 && alignof(float4) == 16 &&
                  sizeof(float2) == 8 && alignof(float2) == 8,
              "vector types");

// Every signature of the subset, by taking each function's address with the real type.
// (A function missing, or declared with another type, fails to compile.)
[[maybe_unused]] static void kt_signatures(void)
{
    cudaError_t (*malloc_)(void **, size_t) = cudaMalloc;
    cudaError_t (*free_)(void *) = cudaFree;
    cudaError_t (*malloc_host)(void **, size_t) = cudaMallocHost;
    cudaError_t (*host_alloc)(void **, size_t, unsigned int) = cudaHostAlloc;
    cudaError_t (*free_host)(void *) = cudaFreeHost;
    cudaError_t (*memcpy_)(void *, const void *, size_t, cudaMemcpyKind) = cudaMemcpy;
    cudaError_t (*memcpy_async)(void *, const void *, size_t, cudaMemcpyKind, cudaStream_t) = cudaMemcpyAsync;
    cudaError_t (*memset_)(void *, int, size_t) = cudaMemset;
    cudaError_t (*memset_async)(void *, int, size_t, cudaStream_t) = cudaMemsetAsync;
    cudaError_t (*stream_create)(cudaStream_t *) = cudaStreamCreate;
    cudaError_t (*stream_create_flags)(cudaStream_t *, unsigned int) = cudaStreamCreateWithFlags;
    cudaError_t (*stream_destroy)(cudaStream_t) = cudaStreamDestroy;
    cudaError_t (*stream_sync)(cudaStream_t) = cudaStreamSynchronize;
    cudaError_t (*stream_wait)(cudaStream_t, cudaEvent_t, unsigned int) = cudaStreamWaitEvent;
    cudaError_t (*event_create)(cudaEvent_t *) = cudaEventCreate;
    cudaError_t (*event_create_flags)(cudaEvent_t *, unsigned int) = cudaEventCreateWithFlags;
    cudaError_t (*event_destroy)(cudaEvent_t) = cudaEventDestroy;
    cudaError_t (*event_record)(cudaEvent_t, cudaStream_t) = cudaEventRecord;
    cudaError_t (*event_sync)(cudaEvent_t) = cudaEventSynchronize;
    cudaError_t (*event_elapsed)(float *, cudaEvent_t, cudaEvent_t) = cudaEventElapsedTime;
    cudaError_t (*last_error)(void) = cudaGetLastError;
    cudaError_t (*peek_error)(void) = cudaPeekAtLastError;
    const char *(*error_string)(cudaError_t) = cudaGetErrorString;
    const char *(*error_name)(cudaError_t) = cudaGetErrorName;
    cudaError_t (*device_sync)(void) = cudaDeviceSynchronize;
    cudaError_t (*device_count)(int *) = cudaGetDeviceCount;
    cudaError_t (*set_device)(int) = cudaSetDevice;
    cudaError_t (*get_device)(int *) = cudaGetDevice;
    cudaError_t (*mem_info)(size_t *, size_t *) = cudaMemGetInfo;
    cudaError_t (*device_attr)(int *, cudaDeviceAttr, int) = cudaDeviceGetAttribute;
    cublasStatus_t (*blas_create)(cublasHandle_t *) = cublasCreate;
    cublasStatus_t (*blas_destroy)(cublasHandle_t) = cublasDestroy;
    cublasStatus_t (*blas_stream)(cublasHandle_t, cudaStream_t) = cublasSetStream;
    cublasStatus_t (*blas_math)(cublasHandle_t, cublasMath_t) = cublasSetMathMode;
    cublasStatus_t (*sgemm)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const float *,
                            const float *, int, const float *, int, const float *, float *, int) = cublasSgemm;
    cublasStatus_t (*sgemm_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                    const float *, const float *, int, long long, const float *, int, long long,
                                    const float *, float *, int, long long, int) = cublasSgemmStridedBatched;
    cublasStatus_t (*lt_create)(cublasLtHandle_t *) = cublasLtCreate;
    cublasStatus_t (*lt_destroy)(cublasLtHandle_t) = cublasLtDestroy;
    cublasStatus_t (*layout_create)(cublasLtMatrixLayout_t *, cudaDataType, uint64_t, uint64_t, int64_t) =
        cublasLtMatrixLayoutCreate;
    cublasStatus_t (*layout_set)(cublasLtMatrixLayout_t, cublasLtMatrixLayoutAttribute_t, const void *, size_t) =
        cublasLtMatrixLayoutSetAttribute;
    cublasStatus_t (*desc_create)(cublasLtMatmulDesc_t *, cublasComputeType_t, cudaDataType_t) =
        cublasLtMatmulDescCreate;
    cublasStatus_t (*desc_set)(cublasLtMatmulDesc_t, cublasLtMatmulDescAttributes_t, const void *, size_t) =
        cublasLtMatmulDescSetAttribute;
    cublasStatus_t (*pref_create)(cublasLtMatmulPreference_t *) = cublasLtMatmulPreferenceCreate;
    cublasStatus_t (*pref_set)(cublasLtMatmulPreference_t, cublasLtMatmulPreferenceAttributes_t, const void *,
                               size_t) = cublasLtMatmulPreferenceSetAttribute;
    cublasStatus_t (*heuristic)(cublasLtHandle_t, cublasLtMatmulDesc_t, cublasLtMatrixLayout_t,
                                cublasLtMatrixLayout_t, cublasLtMatrixLayout_t, cublasLtMatrixLayout_t,
                                cublasLtMatmulPreference_t, int, cublasLtMatmulHeuristicResult_t[], int *) =
        cublasLtMatmulAlgoGetHeuristic;
    cublasStatus_t (*lt_matmul)(cublasLtHandle_t, cublasLtMatmulDesc_t, const void *, const void *,
                                cublasLtMatrixLayout_t, const void *, cublasLtMatrixLayout_t, const void *,
                                const void *, cublasLtMatrixLayout_t, void *, cublasLtMatrixLayout_t,
                                const cublasLtMatmulAlgo_t *, void *, size_t, cudaStream_t) = cublasLtMatmul;
    (void)malloc_, (void)free_, (void)malloc_host, (void)host_alloc, (void)free_host, (void)memcpy_;
    (void)memcpy_async, (void)memset_, (void)memset_async, (void)stream_create, (void)stream_create_flags;
    (void)stream_destroy, (void)stream_sync, (void)stream_wait, (void)event_create, (void)event_create_flags;
    (void)event_destroy, (void)event_record, (void)event_sync, (void)event_elapsed, (void)last_error;
    (void)peek_error, (void)error_string, (void)error_name, (void)device_sync, (void)device_count;
    (void)set_device, (void)get_device, (void)mem_info, (void)device_attr, (void)blas_create, (void)blas_destroy;
    (void)blas_stream, (void)blas_math, (void)sgemm, (void)sgemm_batched, (void)lt_create, (void)lt_destroy;
    (void)layout_create, (void)layout_set, (void)desc_create, (void)desc_set, (void)pref_create, (void)pref_set;
    (void)heuristic, (void)lt_matmul;
}

// Every field of the emulator's cudaDeviceProp exists in the real struct with a compatible
// type (the emulator's is a subset of the real one's fields).
[[maybe_unused]] static size_t kt_device_prop_fields(const cudaDeviceProp &p)
{
    return sizeof p.name + p.totalGlobalMem + p.sharedMemPerBlock + (size_t)p.regsPerBlock + (size_t)p.warpSize +
           p.memPitch + (size_t)p.maxThreadsPerBlock + (size_t)p.maxThreadsDim[2] + (size_t)p.maxGridSize[2] +
           p.totalConstMem + (size_t)p.major + (size_t)p.minor + (size_t)p.multiProcessorCount + (size_t)p.integrated +
           (size_t)p.canMapHostMemory + (size_t)p.concurrentKernels + (size_t)p.ECCEnabled + (size_t)p.asyncEngineCount +
           (size_t)p.unifiedAddressing + (size_t)p.memoryBusWidth + (size_t)p.l2CacheSize +
           (size_t)p.maxThreadsPerMultiProcessor + p.sharedMemPerMultiprocessor + (size_t)p.regsPerMultiprocessor +
           (size_t)p.managedMemory + p.sharedMemPerBlockOptin + (size_t)p.maxBlocksPerMultiProcessor;
}

#define KT_CHECK(cond)                  \
    do {                                \
        if (!(cond)) return __LINE__;   \
    } while (0)

extern "C" int kt_api_tour(void)
{
    int count = 0, device = -1;
    KT_CHECK(cudaGetDeviceCount(&count) == cudaSuccess && count >= 1);
    KT_CHECK(cudaSetDevice(0) == cudaSuccess && cudaGetDevice(&device) == cudaSuccess && device == 0);
    cudaDeviceProp prop;
    KT_CHECK(cudaGetDeviceProperties(&prop, 0) == cudaSuccess);
    KT_CHECK(prop.warpSize == 32 && prop.maxThreadsPerBlock == 1024 && prop.sharedMemPerBlock == 49152);
    KT_CHECK(prop.sharedMemPerBlockOptin >= 49152 && prop.multiProcessorCount > 0 && prop.major >= 8);
    int sms = 0;
    KT_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess &&
             sms == prop.multiProcessorCount);
    size_t free_bytes = 0, total_bytes = 0;
    KT_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess && total_bytes > 0 && free_bytes <= total_bytes);

    // Memory: device and pinned host, copies of every kind, sets.
    const int n = 1000;
    float *d1 = nullptr, *d2 = nullptr, *pinned = nullptr;
    KT_CHECK(cudaMalloc(&d1, n * sizeof(float)) == cudaSuccess && d1);
    KT_CHECK(cudaMalloc(&d2, n * sizeof(float)) == cudaSuccess && d2);
    KT_CHECK(((uintptr_t)d1 & 255) == 0);
    KT_CHECK(cudaMallocHost(&pinned, n * sizeof(float)) == cudaSuccess && pinned);
    float host[n], back[n];
    for (int i = 0; i < n; i++) host[i] = (float)i * 0.5f;
    cudaStream_t s;
    KT_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess);
    cudaEvent_t start, stop;
    KT_CHECK(cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess);
    KT_CHECK(cudaEventRecord(start, s) == cudaSuccess);
    KT_CHECK(cudaMemcpy(d1, host, n * sizeof(float), cudaMemcpyHostToDevice) == cudaSuccess);
    KT_CHECK(cudaMemcpyAsync(d2, d1, n * sizeof(float), cudaMemcpyDeviceToDevice, s) == cudaSuccess);
    KT_CHECK(cudaMemcpyAsync(pinned, d2, n * sizeof(float), cudaMemcpyDeviceToHost, s) == cudaSuccess);
    KT_CHECK(cudaMemcpy(back, pinned, n * sizeof(float), cudaMemcpyHostToHost) == cudaSuccess);
    KT_CHECK(cudaEventRecord(stop, s) == cudaSuccess);
    KT_CHECK(cudaStreamWaitEvent(0, stop, 0) == cudaSuccess);
    KT_CHECK(cudaEventSynchronize(stop) == cudaSuccess && cudaStreamSynchronize(s) == cudaSuccess);
    KT_CHECK(memcmp(host, back, sizeof host) == 0);
    float ms = -1.0f;
    KT_CHECK(cudaEventElapsedTime(&ms, start, stop) == cudaSuccess && ms >= 0.0f);
    KT_CHECK(cudaMemsetAsync(d1, 0, n * sizeof(float), s) == cudaSuccess);
    KT_CHECK(cudaMemcpy(back, d1, n * sizeof(float), cudaMemcpyDefault) == cudaSuccess);
    for (int i = 0; i < n; i++) KT_CHECK(back[i] == 0.0f);
    KT_CHECK(cudaMemset(d2, 0xFF, 4) == cudaSuccess);

    // Errors: the call fails, cudaGetLastError returns it once, then success.
    KT_CHECK(cudaSetDevice(7) == cudaErrorInvalidDevice);
    KT_CHECK(cudaPeekAtLastError() == cudaErrorInvalidDevice);
    KT_CHECK(cudaGetLastError() == cudaErrorInvalidDevice && cudaGetLastError() == cudaSuccess);
    KT_CHECK(strcmp(cudaGetErrorName(cudaErrorInvalidValue), "cudaErrorInvalidValue") == 0);
    KT_CHECK(cudaGetErrorString(cudaSuccess) != nullptr);

    // cuBLAS handle round trip on the stream, TF32 allowed.
    cublasHandle_t blas;
    KT_CHECK(cublasCreate(&blas) == CUBLAS_STATUS_SUCCESS);
    KT_CHECK(cublasSetStream(blas, s) == CUBLAS_STATUS_SUCCESS);
    KT_CHECK(cublasSetMathMode(blas, CUBLAS_TF32_TENSOR_OP_MATH) == CUBLAS_STATUS_SUCCESS);
    KT_CHECK(cublasDestroy(blas) == CUBLAS_STATUS_SUCCESS);

    KT_CHECK(cudaEventDestroy(start) == cudaSuccess && cudaEventDestroy(stop) == cudaSuccess);
    KT_CHECK(cudaStreamDestroy(s) == cudaSuccess);
    KT_CHECK(cudaFreeHost(pinned) == cudaSuccess);
    KT_CHECK(cudaFree(d1) == cudaSuccess && cudaFree(d2) == cudaSuccess);
    KT_CHECK(cudaDeviceSynchronize() == cudaSuccess);
    return 0;
}
