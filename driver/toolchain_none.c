/* toolchain_none.c — toolchain.h where Kiln was built without Clang's libraries: builds
 * use the external C compiler ($CC, or the one Kiln was built with). */
#include "toolchain.h"
#include "../util/util.h"

bool toolchain_available(void) { return false; }

const char *toolchain_version(void) { return "none"; }

int toolchain_run(const char *const *args, int nargs, char **log)
{
    (void)args, (void)nargs;
    *log = xstrdup("kiln: this kiln was built without Clang's libraries (llvm-16-dev, libclang-16-dev, liblld-16-dev): "
                   "set CC to a C compiler");
    return -1;
}
