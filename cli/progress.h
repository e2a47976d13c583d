/* progress.h — what a long `kiln build` is doing, on one line of stderr rewritten in place
 * ("kiln: [3/4] compiling model.cu with nvcc: 1 of 2 parts done, 41 s"), when stderr is a
 * terminal; nothing at all when it is not (logs, pipes, tests compare output). */
#ifndef KILN_CLI_PROGRESS_H
#define KILN_CLI_PROGRESS_H

#include <stdbool.h>
#include <stddef.h>

#include "../util/util.h"

typedef struct {
    bool on;          /* stderr is a terminal */
    int stage, nstages;
    char what[200];   /* what the stage does */
    int done, pieces; /* parts of the stage finished, of how many (0: one piece) */
    double t0;        /* when the stage began */
    long shown_s;     /* the seconds last drawn */
    size_t shown;     /* characters on the line now */
} BuildProgress;

/* Every function takes NULL (no progress) too. */
void progress_init(BuildProgress *p, int nstages);
/* The next stage: pieces parts (0 or 1: one), described by the format. */
void progress_stage(BuildProgress *p, int pieces, const char *fmt, ...) KILN_PRINTF(3, 4);
void progress_piece_done(BuildProgress *p);
/* Redraws when the elapsed second has changed. */
void progress_tick(BuildProgress *p);
/* Blanks the line, so that the next message starts on a clean one. */
void progress_clear(BuildProgress *p);

/* Marker lines the build's shell commands print among the compilers' output (build.c
 * filters them out of the log): a part finished; a new stage, its text after the space. */
#define PROGRESS_MARK "\001kiln:"
#define PROGRESS_SH_DONE "printf '\\001kiln:done\\n'"
#define PROGRESS_SH_STAGE(text) "printf '\\001kiln:stage " text "\\n'"

#endif
