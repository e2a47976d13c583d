/* kiln_lib.h — what the generated glue of an embeddable library (kiln build --lib, the
 * MODEL_lib.c that lib_gen.c writes) calls: binding weights from a safetensors file held
 * in memory (lib_weights.c) and running the predict step in caller memory (lib_run.c).
 * Both are generic over the model's kiln_model table, so the per-model glue is only thin
 * wrappers with the model's names and types. Nothing here allocates, reads files or the
 * environment, or keeps state between calls: every byte it touches is the caller's. These
 * symbols are made local to the library's one object when it is built (objcopy), so two
 * models' libraries link into one program. docs/library.md. */
#ifndef KILN_LIB_H
#define KILN_LIB_H

#include <stddef.h>
#include <stdint.h>

#include "kiln_model.h"

/* Status codes; the generated header names them MODEL_OK, MODEL_EINVAL, ... */
enum {
    KILN_LIB_OK = 0,
    KILN_LIB_EINVAL = 1,    /* a bad argument: NULL, a batch outside 1..bound, memory too small or misaligned */
    KILN_LIB_EFORMAT = 2,   /* the weights buffer is not a safetensors file: truncated, corrupted, bad header */
    KILN_LIB_EMISMATCH = 3, /* a tensor missing, of another dtype or shape, or not the model's */
    KILN_LIB_EUNBOUND = 4,  /* run before any weights were bound */
    KILN_LIB_EINDEX = 5,    /* an index computed from the inputs is out of range (an embedding's token) */
};

/* The alignment of the caller's weights and workspace memory (a cache line). */
#define KILN_LIB_ALIGN 64

/* Bytes of the weights memory: the trainable parameters (f32), then the buffers (batch
 * norm's running statistics) at the next KILN_LIB_ALIGN boundary. */
int64_t kiln_lib_buffers_at(const kiln_model *m);
int64_t kiln_lib_weights_bytes(const kiln_model *m);
/* The batch symbol (the first axis of the first input the forward reads), or -1. */
int kiln_lib_batch_symbol(const kiln_model *m);

/* Writes "fmt..." into msg (up to cap bytes, always terminated when cap > 0) and returns
 * code. */
int kiln_lib_fail(char *msg, size_t cap, int code, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Checks the caller's memory for an instance: non-NULL, aligned, at least the sizes. */
int kiln_lib_check_memory(const kiln_model *m, const void *weights, size_t weights_bytes, const void *workspace, size_t workspace_bytes,
                          char *msg, size_t cap);

/* Copies the model's parameters and buffers from `file` (size bytes of a safetensors file;
 * `name` stands for it in messages) into `weights`, by name, as an inference program's
 * --weights does (Kiln's or PyTorch's state_dict: every tensor of the model with its dtype
 * and shape, nothing else; tensors' CRC-32 checksums verified where the file has them).
 * Everything is checked before anything is copied: on an error `weights` is unchanged. */
int kiln_lib_bind(const kiln_model *m, unsigned char *weights, const void *file, size_t size, const char *name, char *msg, size_t cap);

/* Runs the predict step on `batch` samples: inputs[k] for each input the forward reads
 * (batch-major, C order, the other symbols at their bounds), outputs[k] for each output.
 * `threads` OpenMP threads on the calling thread (its setting is restored). */
int kiln_lib_run(const kiln_model *m, unsigned char *weights, unsigned char *workspace, int threads, int64_t batch,
                 const void *const *inputs, void *const *outputs, char *msg, size_t cap);

#endif
