/* jit_train.h — `kiln train` and `kiln run` through the JIT (driver/jit.h): the model's
 * steps compiled into the kiln process and run there, without a program on disk. */
#ifndef KILN_CLI_JIT_TRAIN_H
#define KILN_CLI_JIT_TRAIN_H

#include <stdbool.h>

#include "../driver/kiln.h"

typedef struct {
    bool infer;               /* the inference program's model (kiln run), not training's */
    bool time_passes;         /* print where the time went (to stderr) */
    int argc;                 /* the program's flags (after FILE, kiln's own taken out) */
    char **argv;
    char **kiln_argv;         /* kiln's own (NULL-terminated), to re-execute it with OpenBLAS's
                               * kernels set, as a program re-executes itself (env.c) */
} JitTrainOptions;

/* Compiles p's model.c with Clang in this process into kiln build's objects (or reads them
 * from its cache, objcache.h), frees p, links the objects into this process and runs the training
 * program's kiln_train_main on them (the inference program's kiln_infer_main with
 * o->infer). Returns the exit status. */
int jit_train(KilnProgram *p, const JitTrainOptions *o);

#endif
