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
 * Compiles may run on several threads at once; links run one at a time, each in a child
 * process forked for it (lld 16 cannot link twice in one process), and only once the
 * caller's compiles have finished. */
int toolchain_run(const char *const *args, int nargs, char **log);
/* `objcopy --keep-global-symbols=SYMS IN OUT` with LLVM's objcopy library: OUT is the ELF
 * object IN with every defined global symbol made local but those named in syms_file
 * (one a line; '#' starts a comment). `ar rcs OUT MEMBERS...` with LLVM's archive writer:
 * a new archive (GNU format, with its symbol table; no time stamps or owners). Both
 * return 0, or -1 with *log saying why (malloc'd; the caller frees; NULL on success). */
int toolchain_keep_globals(const char *in, const char *out, const char *syms_file, char **log);
int toolchain_archive(const char *out, const char *const *members, int nmembers, char **log);

#ifdef __cplusplus
}
#endif

#endif
