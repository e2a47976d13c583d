/* programs.h — the entries of the programs' own code (programs/): a built program's main
 * calls its entry with its kiln_model_def; the kiln command calls it with the model it
 * compiled into its own process (kiln train and kiln run: the JIT, cli/jit_train.c). Each
 * runs one model once per process (the run's state is its file's). Returns the exit
 * status; argv[0] is the program's name. */
#ifndef KILN_PROGRAMS_H
#define KILN_PROGRAMS_H

#include "kiln_model.h"

/* The training program (train_main.c). krt_fast_environment comes first, in the caller:
 * a built program's main passes it its own argv (it may re-execute the program); the
 * kiln command sets the environment itself. */
int kiln_train_main(const kiln_model *m, int argc, char **argv);
/* The inference program (infer_main.c, kiln build --infer), likewise. */
int kiln_infer_main(const kiln_model *m, int argc, char **argv);

#endif
