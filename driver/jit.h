/* jit.h — running generated code in the kiln process: `kiln train` without an executable.
 * The objects `kiln build` links into a program (the same compiler, flags and so the same
 * code: cli/objcache.h compiles and caches them) are linked by LLVM's ORC LLJIT into this
 * process instead: their calls to the runtime, OpenBLAS, libm, zlib and OpenMP resolve to
 * what the kiln process has loaded. Objects are given in memory. jit_orc.cpp is this on
 * LLVM 16; jit_none.c says there is none (a kiln without Clang's libraries). C++ behind a C
 * interface. */
#ifndef KILN_JIT_H
#define KILN_JIT_H

#include <stdbool.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Whether this kiln can JIT (it was built with Clang's and LLVM's libraries). */
bool jit_available(void);

/* Object code in memory (malloc'd; jit_object_free). */
typedef struct {
    char *data;
    size_t size;
} JitObject;

void jit_object_free(JitObject *obj);

/* Whether data[0..size) is an object the JIT can link: an ELF object for this machine
 * without thread-local storage (which the JIT cannot give code it links). 0, or -1 and
 * *log says why. */
int jit_check_object(const void *data, size_t size, char **log);

typedef struct KilnJit KilnJit;

/* A JIT for this process's CPU (its model and features, as -march=native), whose code
 * resolves undefined symbols in this process's global symbols. NULL with *log. */
KilnJit *jit_new(char **log);
/* Adds an ELF object (copied; name is for messages). 0, or -1 with *log. */
int jit_add_object(KilnJit *j, const char *name, const void *data, size_t size, char **log);
/* Loads a shared library into this process for the JIT'd code (dlopen RTLD_GLOBAL, kept
 * until exit). 0, or -1 with *log. */
int jit_load_library(const char *path, char **log);
/* The address of symbol `name` of the objects added, linking them on the first lookup (a
 * symbol none of them or the process defines is an error here). NULL with *log. */
void *jit_lookup(KilnJit *j, const char *name, char **log);
/* Frees the JIT and the code it linked. */
void jit_free(KilnJit *j);

#ifdef __cplusplus
}
#endif

#endif
