/* kemu_thread.h — what a kernel's emulated thread calls: its indices, the block barrier,
 * the warp exchange and the block's shared memory. C declarations (sched.c defines them);
 * kemu_device.h wraps them in the CUDA spellings for kernel code. */
#ifndef KEMU_THREAD_H
#define KEMU_THREAD_H

#include <stddef.h>

#include "kemu_runtime.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The running thread's indices and its launch's shape. Thread-local variables that the
 * scheduler sets before it switches to a fiber: reading one costs what reading a built-in
 * register costs on the GPU, nearly nothing (a call would cost more than most kernels'
 * arithmetic). Only ever one host thread runs a given block. */
extern __thread uint3 kemu_thread_idx;
extern __thread uint3 kemu_block_idx;
extern __thread dim3 kemu_block_dim;
extern __thread dim3 kemu_grid_dim;

/* __syncthreads(): waits until every thread of the block reaches the same barrier. */
void kemu_syncthreads(const char *file, int line);

/* A warp exchange (shuffle). Every lane of the warp must arrive at the same shuffle; then
 * each reads the value (size bytes, at most 8) of its source lane: lane + arg (DOWN),
 * lane - arg (UP), lane ^ arg (XOR), arg (IDX), its own when the source is outside the
 * warp, as __shfl_*_sync with width 32 does. */
enum { KEMU_SHFL_DOWN, KEMU_SHFL_UP, KEMU_SHFL_XOR, KEMU_SHFL_IDX };
void kemu_shfl(int kind, const void *in, void *out, unsigned size, int arg, const char *file,
               int line);

/* A static __shared__ array: the block's copy of the declaration at site (any address
 * unique to the declaration), size bytes, allocated when the first thread of the block
 * reaches it, the same memory for every other thread. */
void *kemu_shared_static(const void *site, size_t size, size_t align, const char *name,
                         const char *file, int line);
/* The block's dynamic shared memory (the launch's shared_bytes). */
void *kemu_shared_dynamic(void);

#ifdef __cplusplus
}
#endif

#endif
