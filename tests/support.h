/* support.h — helpers shared by the Criterion tests: reading files of the source tree and
 * running the built `kiln` command, capturing what it prints. */
#ifndef KILN_TESTS_SUPPORT_H
#define KILN_TESTS_SUPPORT_H

#include <stddef.h>

#include "../util/util.h"

/* Reads KILN_SOURCE_DIR/relpath; NULL when missing. */
char *support_read(const char *relpath, size_t *len);
/* Runs `KILN_BINARY args` with stdout and stderr captured together into out; returns the
 * exit status (or -1 when it was killed by a signal). */
int support_run_kiln(const char *args, StrBuf *out);
/* Runs a shell command line with stdout and stderr captured into out; returns the exit
 * status, or -1 when it was killed by a signal. */
int support_run(const char *cmdline, StrBuf *out);
/* Absolute path of a file in the source tree (static buffer, valid until the next call). */
const char *support_path(const char *relpath);

#endif
