/* cuda_embed.h — the files of a CUDA program as NVRTC units (cuda_report.h), and the table
 * of their device code a program carries (runtime/cuda/kiln_cuda_embedded.h), written by
 * cuda_embed.c: for a GPU program model.cu's (cuda_build.c), the runtime's device.cu's and
 * dist_nccl.cu's (compiled once, when Kiln is built: cuda_runtime_gen.c); for a cuda-emu
 * program one table of all its files, its images the emulator's. */
#ifndef KILN_CLI_CUDA_EMBED_H
#define KILN_CLI_CUDA_EMBED_H

#include <stdbool.h>

#include "cuda_report.h"

/* The files: a program's model.cu, the runtime's device.cu (its optimizer with
 * --fmad=false, so that it rounds as the host's), the NCCL transport of a distributed one. */
enum { CUDA_UNIT_MODEL, CUDA_UNIT_DEVICE, CUDA_UNIT_DIST };
/* The tables' symbols (kiln_cuda_embedded.h). */
#define CUDA_EMBED_MODEL_TABLE "kiln_cuda_embedded_code"
#define CUDA_EMBED_DEVICE_TABLE "kiln_cuda_device_code"
#define CUDA_EMBED_DIST_TABLE "kiln_cuda_dist_code"

/* Reads and cuts one file (model_cu: the path of CUDA_UNIT_MODEL's). 0, or -1 with a
 * message. */
int cuda_embed_read_unit(int which, const char *model_cu, CudaUnit *u, StrBuf *log);
/* -1 with a message when two files define a kernel of one name (kernels are found by name). */
int cuda_embed_check_names(const CudaUnit *units, int nunits, StrBuf *log);
/* Writes dir/TABLE.cpp defining the table TABLE, with its files beside it in dir
 * (TABLE_image*.cubin|ptx, TABLE_source*.cu, read by .incbin when it is compiled).
 * compiled: NVRTC's pieces of the units; NULL for a cuda-emu program. 0, or -1. */
int cuda_embed_write_table(const char *dir, const char *table, const CudaUnit *units, int nunits, const CudaCompiled *compiled, StrBuf *log);
/* Writes dir/kiln_cuda_embedded_code.cpp for a cuda-emu program of model_cu. */
int cuda_embed_emulated(const char *model_cu, bool distributed, const char *dir, StrBuf *log);
int cuda_embed_write_file(const char *path, const void *data, size_t n, StrBuf *log);

#endif
