/* toolchain.h — the C compiler and linker inside Kiln: Clang's and lld's libraries
 * (toolchain_clang.cpp), so that `kiln build` needs no cc, gcc, clang or ld on the machine
 * and starts no process to compile a model. A build gives the same command line it would
 * give clang; Clang's driver turns it into its jobs as the clang command does (the
 * compiler's cc1 invocation, the link line with the C runtime's start files and library
 * paths), and each job runs here: compiles in Clang's CompilerInstance, links in lld.
 * Without Clang's libraries at build time (KILN_HAVE_CLANG 0) only the external compiler
 * is there. C++ behind a C interface: the rest of Kiln stays C. */
#ifndef KILN_TOOLCHAIN_H
#define KILN_TOOLCHAIN_H

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether Kiln was built with Clang and lld as libraries. */
bool toolchain_available(void);
/* "clang 16.0.6 (in process)" */
const char *toolchain_version(void);
/* Runs what `clang ARGS...` would run (args without the program name), in this process:
 * compiles with -c, or compiles and links. *log: NULL, or the diagnostics and the
 * linker's messages (malloc'd; the caller frees). Returns 0, or -1 (*log says why).
 * Compiles may run on several threads at once; links are serialised (lld keeps one
 * context per process). */
int toolchain_run(const char *const *args, int nargs, char **log);

#ifdef __cplusplus
}
#endif

#endif
