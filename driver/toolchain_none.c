/* toolchain_none.c — toolchain.h where Kiln was built without Clang's libraries: builds
 * use the external C compiler ($CC, or the one Kiln was built with). */
#include "toolchain.h"
#include "../util/util.h"

bool toolchain_available(void) { return false; }

const char *toolchain_version(void) { return "none"; }

static const char no_clang[] = "kiln: this kiln was built without Clang's libraries (llvm-16-dev, libclang-16-dev, liblld-16-dev): "
                               "set CC to a C compiler";

int toolchain_run(const char *const *args, int nargs, char **log)
{
    (void)args, (void)nargs;
    *log = xstrdup(no_clang);
    return -1;
}

int toolchain_keep_globals(const char *in, const char *out, const char *syms_file, char **log)
{
    (void)in, (void)out, (void)syms_file;
    *log = xstrdup(no_clang);
    return -1;
}

int toolchain_archive(const char *out, const char *const *members, int nmembers, char **log)
{
    (void)out, (void)members, (void)nmembers;
    *log = xstrdup(no_clang);
    return -1;
}
