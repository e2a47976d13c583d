/* jit_none.c — jit.h where Kiln was built without Clang's and LLVM's libraries (or the
 * sanitizer build, which leaves them out): no JIT, so `kiln train` builds and runs a
 * program with the external compiler. */
#include "jit.h"

#include <stdlib.h>

#include "../util/util.h"

static const char NO_JIT[] = "kiln: this kiln was built without LLVM's libraries (llvm-16-dev, libclang-16-dev): no JIT";

bool jit_available(void) { return false; }

void jit_object_free(JitObject *obj)
{
    free(obj->data);
    obj->data = NULL;
    obj->size = 0;
}

int jit_check_object(const void *data, size_t size, char **log)
{
    (void)data, (void)size;
    *log = xstrdup(NO_JIT);
    return -1;
}

KilnJit *jit_new(char **log)
{
    *log = xstrdup(NO_JIT);
    return NULL;
}

int jit_add_object(KilnJit *j, const char *name, const void *data, size_t size, char **log)
{
    (void)j, (void)name, (void)data, (void)size;
    *log = xstrdup(NO_JIT);
    return -1;
}

int jit_load_library(const char *path, char **log)
{
    (void)path;
    *log = xstrdup(NO_JIT);
    return -1;
}

void *jit_lookup(KilnJit *j, const char *name, char **log)
{
    (void)j, (void)name;
    *log = xstrdup(NO_JIT);
    return NULL;
}

void jit_free(KilnJit *j) { (void)j; }
