/* train_internal.h — what train_main.c (the training program's main) shares with the
 * other files of the training program (train_bench.c): its error exit, the recipe as
 * flags override it, and the step's update. Not part of the runtime library: these are
 * the program's own, linked with kiln_model_def. */
#ifndef KILN_TRAIN_INTERNAL_H
#define KILN_TRAIN_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "kiln_model.h"

/* One message "MODEL: error: ..." on stderr; returns 1 (the exit status). */
int tm_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* After a step: its index error, if any, reported with `when` and the step; 1 if so. */
int tm_index_failed(const kiln_step_io *io, const char *when, int64_t step);
/* The recipe's value of key (flags override it), or dflt. */
const char *tm_recipe(const char *key, const char *dflt);
/* The gradients of this micro-batch added into the accumulated ones. */
void tm_accumulate_grads(void);
/* The optimizer step after step `step` (0-based); the gradient norm when want_norm, the
 * learning rate used in *lr. */
double tm_apply_update(int64_t step, bool want_norm, double *lr);
/* The loss scale of the next training step (kiln_step_io.loss_scale): 1 without scaling. */
float tm_loss_scale(void);
/* The index of the batch symbol among the model's symbols. */
int tm_batch_symbol(void);

/* --bench-steps N (train_bench.c): N timed training steps and the eval step on random
 * inputs, one `bench: {...}` JSON line; --profile's per-kernel table. Returns the exit
 * status. */
int tm_bench(kiln_step_io *io, int64_t batch, int64_t n, int64_t accumulate);

#endif
