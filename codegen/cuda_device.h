/* cuda_device.h — the device code of a generated model.cu, for NVRTC (cuda_device.c), and
 * the names of its kernels, which model.cu's module table lists (cuda.c).
 * model.cu stays one readable file, kernels beside their launchers; NVRTC compiles the
 * kernels alone: the file's preprocessor directives (the C library's #include lines left
 * out: kiln_cuda.h gives NVRTC what the kernels use of it), then every __global__ and
 * __device__ function in the file's order, each after a #line of model.cu, so that
 * NVRTC's and ptxas's messages name model.cu's lines. The runtime's own CUDA files
 * (device.cu, dist_nccl.cu) are cut the same way. A kernel template is compiled for the arguments the
 * host launches it with: those are NVRTC's name expressions ("kiln_sum_parts<float>"). */
#ifndef KILN_CODEGEN_CUDA_DEVICE_H
#define KILN_CODEGEN_CUDA_DEVICE_H

#include <stddef.h>

#include "../util/util.h"

typedef struct {
    StrBuf text;   /* the device source */
    /* the same, in pieces that compile on their own: what every piece needs first (the
     * includes, the __device__ functions, the kernel templates), then each kernel */
    StrBuf common;
    char **kernels;
    int nkernel_texts;
    char **names;  /* the template kernels' instances the host launches */
    char **kernel_names; /* the other kernels', in the file's order */
    int nkernel_names;
    /* the host source: the file without its __device__ functions, each kernel declared
     * rather than defined, for a C++ compiler (kiln_cuda.h's KILN_CUDA_DRIVER) */
    StrBuf host;
    int nnames;
    int nkernels;   /* __global__ definitions (a template counts once) */
    int ntemplates; /* of which templates */
} CudaDeviceSource;

/* Cuts the device source out of model.cu's text (as codegen/cuda.c writes it: every
 * definition starts at column 0). 0, or -1 with the reason in err (text it does not
 * recognise: an unbalanced brace). */
int cuda_device_source(const char *model_cu, size_t len, const char *file_name, CudaDeviceSource *out, StrBuf *err);
void cuda_device_source_free(CudaDeviceSource *s);

#endif
