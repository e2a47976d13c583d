/* kiln_cuda_model.h — what the CUDA target's model.cu calls besides its own kernels: the
 * device context its steps run in (device.cu). The training program (train_main.c) sees
 * the GPU as a kiln_device (kiln_model.h) and keeps parameters, gradients, optimizer state,
 * buffers and activations in device memory; a step's inputs and outputs stay in host
 * memory, and the step moves them:
 *
 *   kiln_cuda_begin        the step's stream, cuBLAS handle and room for the parts of
 *                          totals; the next set of staging buffers (two sets, used in turn)
 *   kiln_cuda_input        input k: host memory -> pinned staging -> the device, an
 *                          asynchronous copy on the copy stream that the step's stream waits
 *                          for
 *   (the kernels)          launched on the step's stream; index checks write their first
 *                          bad position and its value to kiln_cuda_checks(ctx) + 2 * i
 *   kiln_cuda_read_scalar  the loss and metrics into pinned host memory
 *   kiln_cuda_finish       one synchronisation; the first failed index check, in step order,
 *                          becomes io->index_error
 *   kiln_cuda_scalar       the values read, for io->loss and io->metrics
 *
 * Compiled by nvcc for the GPU, or by the host C++ compiler with -DKILN_CUDA_EMU for the
 * emulator, as model.cu is. */
#ifndef KILN_CUDA_MODEL_H
#define KILN_CUDA_MODEL_H

#include "kiln_cuda.h"

/* Room for 16 totals of 512 blocks' double-precision parts. */
#define KILN_CUDA_PARTIALS_BYTES 65536
#define KILN_CUDA_TOTAL_BLOCKS 512

#if !defined(__CUDACC_RTC__) /* the host side (NVRTC compiles the kernels alone) */
#include "kiln_cuda_lt.h"
#include "kiln_model.h"

/* The GPU as the training program's device (model.cu's kiln_model_def names it). */
extern "C" const kiln_device kiln_cuda_device;

typedef struct {
    cudaStream_t stream;
    cublasHandle_t blas;
    /* KILN_CUDA_PARTIALS_BYTES of device memory, allocated at start: a kernel with a total
     * over rows (a loss) writes each block's part there, and kiln_sum_parts adds them in
     * block order, the same bits every run */
    void *partials;
} kiln_cuda_step;

kiln_cuda_step kiln_cuda_begin(void *ctx);
/* The step's stream, without starting a step: the gradient transport of a distributed
 * program (dist_nccl.cu) orders its all-reduces after the step's kernels with events on it,
 * and the update's kernels after the all-reduces. */
cudaStream_t kiln_cuda_stream(void *ctx);
const void *kiln_cuda_input(void *ctx, int k, const void *host, int64_t bytes);
/* fp16's loss scale (io->loss_scale) in device memory, copied on the step's stream. */
const float *kiln_cuda_loss_scale(void *ctx, float scale);
int64_t *kiln_cuda_checks(void *ctx);
void kiln_cuda_read_scalar(void *ctx, int slot, const void *device_value, size_t bytes);
void kiln_cuda_finish(void *ctx, kiln_step_io *io, const kiln_index_check *checks, int nchecks);
const void *kiln_cuda_scalar(void *ctx, int slot);

/* Before a matrix product's cuBLAS calls: a failed call names the kernel and its model line
 * (KILN_CUBLAS_CHECK prints the last kernel and site). */
#define KILN_CUDA_NOW_AT(kernel, site) (kiln_cuda_last_kernel = (kernel), kiln_cuda_last_site = (site))

/* --profile: the kernel's time is known once it has run, so the step waits for it before
 * marking it (profiled steps are not the timed ones). */
#define KILN_CUDA_MARK(io, k, stream)                       \
    do {                                                    \
        if ((io)->profile) {                                \
            KILN_CUDA_SYNC(stream);                         \
            kiln_profile_mark((io)->profile, (k));          \
        }                                                   \
    } while (0)

#endif /* the host side */

#endif
