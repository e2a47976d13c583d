/* train_internal.h — what train_main.c (the training program's main) shares with the
 * other files of the training program (train_bench.c, train_ckpt.c): its error exit, the
 * recipe as flags override it, the step's update and the checkpoints. Not part of the runtime library: these are
 * the program's own, linked with kiln_model_def (or into the kiln command, for its JIT). */
#ifndef KILN_TRAIN_INTERNAL_H
#define KILN_TRAIN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln_model.h"
#include "programs.h"

/* The model kiln_train_main was given. */
const kiln_model *tm_model(void);
/* One message "MODEL: error: ..." on stderr; returns 1 (the exit status). */
int tm_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* After a step: its index error, if any, reported with `when` and the step; 1 if so. */
int tm_index_failed(const kiln_step_io *io, const char *when, int64_t step);
/* Whether --profile was given (with --bench-steps: time each kernel). */
bool tm_bench_profile(void);
/* The gradients of this micro-batch added into the accumulated ones. */
void tm_accumulate_grads(void);
/* The optimizer step after step `step` (0-based); the gradient norm when want_norm, the
 * learning rate used in *lr. */
double tm_apply_update(int64_t step, bool want_norm, double *lr);
/* The loss scale of the next training step (kiln_step_io.loss_scale): 1 without scaling. */
float tm_loss_scale(void);
/* The index of the batch symbol among the model's symbols. */
int tm_batch_symbol(void);

/* ---- checkpoints (train_ckpt.c) ---- */

#define MAX_STEP 1000000000000LL /* --steps' bound */
#define MAX_ACCUMULATE 65536      /* the recipe's bound on accumulate */

/* What a run's checkpoints carry beside the model and the optimizer's state. */
typedef struct {
    const krt_optim_config *oc; /* names the optimizer's moment slabs */
    krt_loss_scaler *scaler;    /* fp16's loss scaler, or NULL without loss scaling */
    /* This run's id, in both files of each checkpoint it writes, so that a model and a
     * training state written by two runs (processes) are never taken for one checkpoint. A
     * resumed run is a run of its own: it gets a new id. */
    char run_id[17];
    /* Batches drawn from the training data since the run's first step (resumed runs
     * included): an epoch takes at least one, so the cursor's epoch is at most this. */
    int64_t batches_drawn;
} tm_run;

/* A new run id for r (random, with the time and the process). */
void tm_ckpt_new_run(tm_run *r);
/* One checkpoint of `step`, all or nothing: both files into a temporary directory,
 * published as dir/step-NNNNNNNN and named by dir/latest, then all but the newest `keep`
 * deleted. Returns 0, or 1 after its message (the previous checkpoint stands). */
int tm_ckpt_save(const tm_run *r, const char *dir, int64_t keep, const float *params, const unsigned char *buffers,
                 const krt_optim_state *st, const krt_cursor *cur, int64_t step);
/* The newest checkpoint in dir into the parameters, buffers, optimizer state and cursor,
 * *step and r->batches_drawn (and the loss scaler's state). Returns 0, or 1 after its
 * message naming the file and the field. */
int tm_ckpt_load(tm_run *r, const char *dir, int64_t accumulate, float *params, unsigned char *buffers, krt_optim_state *st,
                 krt_cursor *cur, int64_t *step);

/* --bench-steps N (train_bench.c): N timed training steps and the eval step on random
 * inputs, one `bench: {...}` JSON line; --profile's per-kernel table. Returns the exit
 * status. */
int tm_bench(kiln_step_io *io, int64_t batch, int64_t n, int64_t accumulate);

#endif
