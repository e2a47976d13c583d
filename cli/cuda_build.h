/* cuda_build.h — kiln build --target cuda through NVRTC and Clang (cuda_build.c). */
#ifndef KILN_CLI_CUDA_BUILD_H
#define KILN_CLI_CUDA_BUILD_H

#include <stdbool.h>

#include "progress.h"
#include "../util/util.h"

/* Compiles model_cu (in the build's scratch directory, where the intermediate files go)
 * into the GPU program prog: the kernels by NVRTC, the host code by cxx (NULL: Clang in
 * this process) against the toolkit's headers, linked with the CUDA libraries (infer: the
 * inference program's driver; distributed: MPI ranks and NCCL). 0, or -1 with the output
 * of what failed in *log. */
int build_cuda_nvrtc(const char *model_cu, const char *prog, const char *cxx, const char *extra_flags, bool infer, bool distributed, StrBuf *log,
                     BuildProgress *pg);
#endif
