/* objcache.h — compiles a generated model.c as pieces (pieces.h) on all cores, each piece's
 * object cached by the hash of its code, the compiler, its flags, the target CPU and the
 * runtime headers, so that a rebuild compiles only the pieces whose code changed. This is
 * the one entry point from generated C to objects: kiln build links what it returns, and a
 * JIT can load the same objects.
 *
 * The cache: $XDG_CACHE_HOME/kiln/obj, else ~/.cache/kiln/obj; one file per object (the
 * object, then a footer with its length and hash, checked on every read: a truncated or
 * corrupt entry is compiled again). Entries are written to a temporary name and renamed,
 * so builds running at once never read a half-written one. A hit refreshes the entry's
 * time; after a build that stored objects, the oldest entries go until the cache holds at
 * most $KILN_CACHE_MAX_BYTES (default 2 GiB; suffixes K, M, G; 0: no cache). */
#ifndef KILN_CLI_OBJCACHE_H
#define KILN_CLI_OBJCACHE_H

#include <stdbool.h>

#include "../util/util.h"
#include "progress.h"

typedef struct {
    const char *cc;     /* an external C compiler command; NULL: Clang in this process */
    const char *cflags; /* --cflags: after Kiln's flags */
    const char *cpu;    /* --cpu NAME: -march=NAME; NULL: the host's (-march=native) */
    const char *dir;    /* where the pieces' sources and objects go (a build's scratch dir) */
    int jobs;           /* compilers at once; 0: one per core */
    BuildProgress *pg;  /* may be NULL */
} ObjOptions;

typedef struct {
    char **objs; /* the objects, in dir, to link in this order */
    int nobjs;
    int compiled, cached;  /* pieces compiled, and taken from the cache */
    int kernels_compiled;  /* kernel pieces compiled, of kernel_pieces */
    int kernel_pieces, npieces;
    int step_compiled, step_pieces; /* pieces of a step's parts (a step of over 256 kernels) */
    bool recipe_compiled, host_compiled; /* (or the whole file, when it was one piece) */
} ObjResult;

/* Compiles model_c (the generated file's text) into objects in o->dir (piece0000.o, ...;
 * they stay until the caller removes them: build_tempdir_remove does). The kernels are
 * hidden symbols defined in one object and called from the host code's: a loader must put
 * all of r->objs in one link unit (one executable, or one JITDylib). Returns 0, or -1
 * with the compiler's messages in *log (those of the first piece that failed), or
 * OBJCACHE_BAD_CPU with one line in *log when the compiler does not know o->cpu. */
#define OBJCACHE_BAD_CPU (-2)
int objcache_compile(const char *model_c, size_t len, const ObjOptions *o, ObjResult *r, StrBuf *log);
void objcache_result_free(ObjResult *r);

/* "compiled 3 of 41 pieces (38 cached): 2 of 39 kernel pieces, the host code" */
void objcache_describe(const ObjResult *r, StrBuf *out);

/* The compile flags, as words: Kiln's defaults with -march=NAME for cpu (NULL: as they
 * are), then cflags. The in-process compiler adds -ffp-contract=off (build.c). */
void objcache_flags(const char *cpu, const char *cflags, bool in_process, char ***words, int *nwords);

#endif
