/* dist.h — the processes a training program runs as: one (dist_single.c, every program
 * built without --distributed), or N started by mpirun (dist_mpi.c, kiln build
 * --distributed; docs/distributed.md). train_main.c and train_bench.c call these at the
 * few points where data-parallel training differs from one process: the batch is split,
 * rank 0's state is shared, the loss, metrics and gradients are summed over the ranks,
 * and only rank 0 writes logs and checkpoints (the other ranks' standard output is
 * discarded). A failure of the processes themselves (a rank dead, hung or running another
 * build) is reported here, naming the rank, and stops every rank: these calls return only
 * when all went well. Not part of the runtime library: linked into each program. */
#ifndef KILN_DIST_H
#define KILN_DIST_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "kiln_model.h"

/* Starts the processes and removes this file's own flags from argv (--deterministic,
 * --dist-timeout SECONDS): then checks that every rank runs the same model, build and
 * options. -1 to go on, else the exit status (a bad flag: 2). */
int tm_dist_init(int *argc, char **argv);
/* The help lines of those flags (none for one process). */
void tm_dist_usage(FILE *f);
int tm_dist_rank(void);
int tm_dist_size(void);
/* This rank's share of a global batch: samples [*first, *first + *count). Ranks take
 * batch / N samples each, the first batch % N ranks one more. */
void tm_dist_share(int64_t batch, int64_t *first, int64_t *count);
/* "2 ranks × batch 64" (or "3 ranks × batch 42-43") for the start line; "" alone. */
const char *tm_dist_describe(int64_t batch);
/* Rank 0's training state to every rank: parameters, buffers, the optimizer's slabs
 * (those not NULL), and `ncounters` whole numbers (step, cursor, ...); then a hash of
 * parameters and buffers compared on every rank. */
void tm_dist_share_state(float *params, int64_t nparam_floats, unsigned char *buffers, int64_t buffer_bytes, float *const *slabs,
                         int nslabs, int64_t *counters, int ncounters);
/* Before the steps: the gradient bucket hook on io when a step's gradients are the
 * update's (accumulate 1), so that their all-reduce overlaps the backward; the weight
 * of this rank's gradients in the global mean (its share of the batch). */
void tm_dist_attach(kiln_step_io *io, int64_t batch, int64_t accumulate);
/* After a micro-batch's step: io->loss and io->metrics become the global batch's (the
 * ranks' means weighted by their shares), the same on every rank. */
void tm_dist_global_metrics(kiln_step_io *io, int64_t step);
/* Before the update: g (n floats: the step's gradients, or the accumulated ones) becomes
 * the gradient of the global batch on every rank. */
void tm_dist_reduce_grads(float *g, int64_t n);
/* Benchmarks: seconds the update waited for the all-reduce since the last call (then
 * reset), and the median milliseconds of `reps` whole all-reduces of g outside a step
 * (g is overwritten). */
double tm_dist_wait_seconds(void);
double tm_dist_allreduce_ms(float *g, int64_t n, int reps);
/* The program's exit: status rc; a failure on one rank stops every rank. */
int tm_dist_finish(int rc);

#endif
