/* kemu_internal.h — what the emulator's C files share: the sticky error state, the record
 * of allocations, configuration read from the environment. Not for generated code. */
#ifndef KEMU_INTERNAL_H
#define KEMU_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "kemu_runtime.h"

/* Records err as the last error (and as the sticky error when sticky), formats the message
 * "kiln cuda-emu: error: ..." into the last-error text and prints it unless quiet.
 * Returns err. */
cudaError_t kemu_fail(cudaError_t err, int sticky, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Sets the last error without a message (for the plain argument errors of the API, whose
 * name says enough). Returns err. */
cudaError_t kemu_set_error(cudaError_t err);
/* The sticky error, cudaSuccess when there is none. */
cudaError_t kemu_sticky_error(void);

/* What an address is: in no allocation, in device memory, in pinned host memory. */
enum { KEMU_MEM_NONE = 0, KEMU_MEM_DEVICE = 1, KEMU_MEM_PINNED = 2 };
/* The kind of memory that holds [ptr, ptr + size) entirely (size 0: ptr itself, or one
 * past the end of an allocation); KEMU_MEM_NONE when no allocation holds the range. */
int kemu_memory_kind(const void *ptr, size_t size);

/* NULL (the default stream) or a live stream from cudaStreamCreate. */
int kemu_stream_valid(cudaStream_t stream);

/* Order of block threads, from kemu_set_order or the environment. */
kemu_order kemu_order_now(uint64_t *seed);
/* Per-kernel dynamic shared memory limit set with cudaFuncSetAttribute (0: default). */
size_t kemu_kernel_dynamic_limit(const void *kernel);

/* Shared-memory limits of the emulated device: 48 KiB per block without opting in; the
 * opt-in maximum is the A100's (sm_80), the smaller of the two targets, so that what runs
 * under the emulator fits both. */
#define KEMU_SHARED_DEFAULT_LIMIT 49152u
#define KEMU_SHARED_OPTIN_LIMIT 166912u
#define KEMU_MAX_THREADS_PER_BLOCK 1024u

/* A broken invariant of the emulator itself, not the program's misuse (that is a
 * kemu_fail, or a stop with its own message): file:line, then abort(). The compiler's
 * KILN_UNREACHABLE (util/util.h), without depending on util/. */
#define KEMU_UNREACHABLE()                                                                               \
    (fprintf(stderr, "kiln cuda-emu: internal error at %s:%d: unreachable code reached\n", __FILE__, __LINE__), \
     abort())

void kemu_stats_add(uint64_t blocks, uint64_t threads, uint64_t barriers, uint64_t shuffles,
                    uint64_t switches);
void kemu_stats_reset(void);

#endif
