/* nvrtc.h — NVRTC, the CUDA Toolkit's compiler as a library, in the kiln process: CUDA C++
 * to a CUBIN for one GPU (sm_80, sm_90), or to PTX for a virtual architecture (compute_80),
 * with ptxas's report of every kernel's registers, spills, stack and shared memory. No GPU
 * is needed. The library is opened with dlopen the first time it is used, from the toolkit
 * that CMake found, so that the kiln commands that compile no CUDA never load it and kiln
 * runs where the toolkit is absent (nvrtc_available says why not). Programs are
 * independent: compiles may run on several threads at once. */
#ifndef KILN_DRIVER_NVRTC_H
#define KILN_DRIVER_NVRTC_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char *image;    /* the CUBIN, or the PTX (NUL-terminated) */
    size_t size;
    char *ptx;      /* a CUBIN compile's PTX too, for the virtual architecture of the same number (compute_80 for sm_80) */
    size_t ptx_size;
    char *log;      /* NVRTC's messages and ptxas's report (NULL when there are none) */
    char **lowered; /* the name expressions' mangled names, in their order */
    int nlowered;
} NvrtcOutput;

/* Whether NVRTC can be used; false with the reason in *why (static text) when not. */
bool nvrtc_available(const char **why);
/* "NVRTC 13.0" (empty when not available). */
const char *nvrtc_version(void);
/* Compiles source (named file_name in messages) for arch: "sm_NN" gives a CUBIN (with
 * ptxas's -v report in the log), "compute_NN" PTX. options: more NVRTC options (-I DIR,
 * -D...). names: expressions naming template kernels to instantiate
 * ("kiln_sum_parts<float>"); out->lowered gives their mangled names. 0, or -1 with the
 * messages in out->log. */
int nvrtc_compile(const char *source, const char *file_name, const char *arch, const char *const *options, int noptions,
                  const char *const *names, int nnames, NvrtcOutput *out);
void nvrtc_output_free(NvrtcOutput *o);

/* One kernel of ptxas's report (its -v lines for the kernel's entry function). */
typedef struct {
    char *name;                 /* as the source spells it: the mangled name's identifier */
    char arch[16];              /* "sm_90" */
    int registers, barriers;
    long stack, spill_stores, spill_loads, shared; /* bytes */
} NvrtcKernelReport;

/* The kernels of a CUBIN compile's log, in the log's order. Returns how many (*v
 * malloc'd; free with nvrtc_report_free). */
int nvrtc_report(const char *log, NvrtcKernelReport **v);
void nvrtc_report_free(NvrtcKernelReport *v, int n);

#ifdef __cplusplus
}
#endif

#endif
