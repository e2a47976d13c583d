/* dist_single.c — dist.h for a program built without --distributed: one process, rank 0
 * of 1, which takes the whole batch and whose sums over the ranks are its own values.
 * Kept apart from dist_mpi.c so that such programs neither link MPI nor pay MPI_Init
 * (docs/distributed.md has the measurement). */
#include "dist.h"

int tm_dist_init(int *argc, char **argv)
{
    (void)argc;
    (void)argv;
    return -1;
}

void tm_dist_usage(FILE *f) { (void)f; }
int tm_dist_rank(void) { return 0; }
int tm_dist_size(void) { return 1; }

void tm_dist_share(int64_t batch, int64_t *first, int64_t *count)
{
    *first = 0;
    *count = batch;
}

const char *tm_dist_describe(int64_t batch)
{
    (void)batch;
    return "";
}

void tm_dist_share_state(float *params, int64_t nparam_floats, unsigned char *buffers, int64_t buffer_bytes, float *const *slabs,
                         int nslabs, int64_t *counters, int ncounters)
{
    (void)params, (void)nparam_floats, (void)buffers, (void)buffer_bytes, (void)slabs, (void)nslabs, (void)counters, (void)ncounters;
}

void tm_dist_attach(kiln_step_io *io, int64_t batch, int64_t accumulate) { (void)io, (void)batch, (void)accumulate; }
void tm_dist_global_metrics(kiln_step_io *io, int64_t step) { (void)io, (void)step; }
void tm_dist_reduce_grads(float *g, int64_t n) { (void)g, (void)n; }
double tm_dist_wait_seconds(void) { return 0; }

double tm_dist_allreduce_ms(float *g, int64_t n, int reps)
{
    (void)g, (void)n, (void)reps;
    return 0;
}

int tm_dist_finish(int rc) { return rc; }
