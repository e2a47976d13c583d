/* build.c — turns a generated model.c into a training program with the system C
 * compiler: model.c + the runtime's train_main.c, linked against the runtime library,
 * OpenBLAS, OpenMP (libgomp), zlib, libm and pthreads. The compiler is $CC (default: the
 * one Kiln was built with) and flags are overridable, so users can build with their own
 * toolchain. The default flags (KILN_GENERATED_CFLAGS in CMakeLists.txt) are fast ones:
 * -O3 -march=native -fopenmp; --cflags comes after them, so its flags win. */
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "build.h"

/* Appends s as one single-quoted shell word. */
static void shell_word(StrBuf *b, const char *s)
{
    sb_putc(b, '\'');
    for (; *s; s++) {
        if (*s == '\'') sb_puts(b, "'\\''");
        else sb_putc(b, *s);
    }
    sb_puts(b, "' ");
}

int build_program(const char *model_c, const char *prog, const char *extra_cflags, StrBuf *log)
{
    const char *cc = getenv("CC");
    if (!cc || !*cc) cc = KILN_DEFAULT_CC;
    StrBuf cmd;
    sb_init(&cmd);
    sb_printf(&cmd, "%s %s -std=c11 ", cc, KILN_DEFAULT_CFLAGS);
    if (extra_cflags && *extra_cflags) sb_printf(&cmd, "%s ", extra_cflags);
    sb_puts(&cmd, "-I");
    shell_word(&cmd, KILN_RUNTIME_DIR);
    shell_word(&cmd, model_c);
    shell_word(&cmd, KILN_RUNTIME_DIR "/train_main.c");
    sb_puts(&cmd, "-o ");
    shell_word(&cmd, prog);
    shell_word(&cmd, KILN_RUNTIME_LIB);
    shell_word(&cmd, KILN_BLAS_LIB);
    /* libgomp by name too: the runtime's loops need it even when --cflags says -fno-openmp. */
    sb_printf(&cmd, "%s -lz -lm -lpthread 2>&1", KILN_OPENMP_LIBS);
    FILE *p = popen(cmd.data, "r");
    if (!p) {
        sb_printf(log, "cannot run the C compiler: %s", cmd.data);
        sb_free(&cmd);
        return -1;
    }
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) sb_putn(log, chunk, n);
    int status = pclose(p);
    int rc = status == 0 ? 0 : -1;
    if (rc) sb_printf(log, "\nthe C compiler failed (%s)", cmd.data);
    sb_free(&cmd);
    return rc;
}
