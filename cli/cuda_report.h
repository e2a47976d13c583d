/* cuda_report.h — `kiln build --target cuda --report`'s device part (cuda_report.c): model.cu's
 * kernels compiled by NVRTC (driver/nvrtc.h) for every GPU the program is built for, on
 * all cores, and what ptxas says of each kernel: registers, spilled bytes, stack frame and
 * shared memory. A kernel that spills or has a stack frame runs from local memory, slow on
 * a GPU; the tests require none (tests/test_cuda_nvrtc.c). */
#ifndef KILN_CLI_CUDA_REPORT_H
#define KILN_CLI_CUDA_REPORT_H

#include <stddef.h>

#include "../codegen/cuda_device.h"
#include "../driver/nvrtc.h"
#include "../util/util.h"

/* The CUBIN architectures of --target cuda (build.h's BUILD_NVCC_ARCH: the A100, the
 * H100/H200). */
#define CUDA_REPORT_NARCH 2
extern const char *const cuda_report_arch[CUDA_REPORT_NARCH];

typedef struct {
    NvrtcKernelReport *kernels; /* every architecture's, in turn */
    int nkernels;
    int kernels_per_arch[CUDA_REPORT_NARCH];
    int nglobal;       /* __global__ definitions in model.cu (a template once) */
    int ntemplates;    /* of which templates */
    int ninstances;    /* template kernels' instances launched */
    int spilling;      /* kernel reports (one an architecture) with register spills */
    int stack;         /* kernel reports with a stack frame */
    double seconds;    /* NVRTC's wall time, the pieces on all cores */
    int npieces;       /* NVRTC programs per architecture */
    int cached;        /* (piece, architecture) pairs read from the cache */
} CudaReport;

/* A CUDA file whose kernels NVRTC compiles: model.cu, the runtime's device.cu, ... */
typedef struct {
    const char *file;    /* its name in messages: "model.cu" */
    const char *options; /* its own NVRTC options, space-separated ("--fmad=false"), or "" */
    CudaDeviceSource src;
} CudaUnit;

/* One piece of a file's kernels compiled for one architecture. */
typedef struct {
    int unit, piece;
    const char *arch;  /* cuda_report_arch's */
    char *image;       /* the CUBIN */
    size_t size;
    char *ptx;         /* the PTX of the same compile (compute_80 for sm_80) */
    size_t ptx_size;
    char **names;      /* its kernels as the host launches them */
    char **lowered;    /* and as the CUBIN names them */
    int nnames;
} CudaPieceImage;

typedef struct {
    CudaPieceImage *pieces; /* by architecture, then file, then piece */
    int npieces;
    CudaReport report;      /* of every file's kernels */
} CudaCompiled;

/* Compiles the files' kernels for cuda_report_arch, in pieces on all cores, each cached.
 * 0, or -1 with NVRTC's messages in err. */
int cuda_units_compile(const CudaUnit *units, int nunits, CudaCompiled *c, StrBuf *err);
void cuda_compiled_free(CudaCompiled *c);

/* Compiles model.cu's device code (cuda_device.h) for cuda_report_arch: in pieces, on all
 * cores, each piece's CUBIN and report cached ($XDG_CACHE_HOME/kiln/cuda, as the C
 * pieces' objects are). 0, or -1 with NVRTC's messages in err. */
int cuda_report_compile(const char *model_cu, size_t len, const char *file_name, CudaReport *r, StrBuf *err);
/* The table, a line per kernel, and a last line on spills. */
void cuda_report_format(const CudaReport *r, StrBuf *out);
void cuda_report_free(CudaReport *r);

#endif
