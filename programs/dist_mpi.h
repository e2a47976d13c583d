/* dist_mpi.h — what dist_mpi.c (the processes: start, handshake, shared state, metrics,
 * faults) offers the gradient transport it is linked with, and what that transport
 * provides: dist_grads_mpi.c sums the buckets in host memory with MPI (the C target),
 * dist_nccl.cu in device memory with NCCL (--target cuda, and cuda-emu's emulated
 * NCCL). One copy of the handshake, broadcast and timeout logic serves both.
 * Internal to distributed programs; C and C++ (dist_nccl.cu includes it). */
#ifndef KILN_DIST_MPI_H
#define KILN_DIST_MPI_H

/* MPI's C API only: OpenMPI's and MPICH's headers pull in C++ bindings (a library of
 * their own) when included from C++ */
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include "dist.h"

#ifdef __cplusplus
extern "C" {
#endif

extern const kiln_model kiln_model_def;

/* dist_mpi.c's state, set by tm_dist_init */
int tm_mpi_rank(void);
int tm_mpi_size(void);
int tm_mpi_deterministic(void); /* --deterministic */
double tm_mpi_now(void);

/* One message naming this rank, then every rank stops (the transport's abort first). */
__attribute__((format(printf, 1, 2), noreturn)) void tm_mpi_fail(const char *fmt, ...);
/* Waits for n MPI requests, with the deadline of --dist-timeout: a rank that never comes
 * is named (dist_mpi.c's wait_for). */
void tm_mpi_wait(MPI_Request *r, int n, const char *what);
/* The same for any work: done(arg) is polled, 1 once it has completed. The NCCL transport
 * polls its completion event, so a rank hung inside NCCL is named as one hung in MPI. */
void tm_mpi_wait_until(int (*done)(void *arg), void *arg, const char *what);

/* ---- the gradient transport ---- */

/* After the handshake, before the device is opened (the NCCL transport picks this rank's
 * GPU and starts its communicator here). */
void tm_grads_init(void);
/* Before the steps: io's bucket hook (NULL when accumulate > 1: the sum then waits for
 * the K-th micro-batch) and this rank's weight in the global mean. */
void tm_grads_attach(kiln_step_io *io, int64_t accumulate, float weight);
/* Before the update: the buckets not yet started are started, then all are waited for. */
void tm_grads_reduce(float *g, int64_t n);
/* Zeroes n gradients (the benchmark's all-reduce of zeros), in the transport's memory. */
void tm_grads_zero(float *g, int64_t n);
/* A failure on this rank: stop the transport's work in flight (ncclCommAbort) so that
 * MPI_Abort is not kept waiting for it. Must not fail itself. */
void tm_grads_abort(void);
void tm_grads_free(void);

#ifdef __cplusplus
}
#endif

#endif
