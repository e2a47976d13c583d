/* build.c — turns a generated model.c into a training program with the system C
 * compiler: model.c + the runtime's train_main.c, linked against the runtime library,
 * OpenBLAS, OpenMP (libgomp), zlib, libm and pthreads. The compiler is $CC (default: the
 * one Kiln was built with) and flags are overridable, so users can build with their own
 * toolchain. The default flags (KILN_GENERATED_CFLAGS in CMakeLists.txt) are fast ones:
 * -O3 -march=native -fopenmp; --cflags comes after them, so its flags win. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

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

void build_fingerprint(StrBuf *key)
{
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (f) {
        char line[8192];
        int model = 0, flags = 0;
        while ((!model || !flags) && fgets(line, sizeof line, f)) {
            if (!model && !strncmp(line, "model name", 10)) {
                model = 1;
                sb_puts(key, line);
            }
            if (!flags && !strncmp(line, "flags", 5)) {
                flags = 1;
                sb_puts(key, line);
            }
        }
        fclose(f);
    }
    const char *files[] = {KILN_RUNTIME_LIB, KILN_RUNTIME_DIR "/train_main.c", KILN_RUNTIME_DIR "/kiln_model.h"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        struct stat st;
        if (stat(files[i], &st) == 0) sb_printf(key, "|%lld.%lld", (long long)st.st_size, (long long)st.st_mtime);
    }
}

/* Compiles the model and the driver at the same time (two compilers, one per core of a
 * small machine), then links them. The objects go next to model_c and are removed. */
int build_program(const char *model_c, const char *prog, const char *extra_cflags, StrBuf *log)
{
    const char *cc = getenv("CC");
    if (!cc || !*cc) cc = KILN_DEFAULT_CC;
    StrBuf flags, cmd, obj_model, obj_main;
    sb_init(&flags);
    sb_init(&cmd);
    sb_init(&obj_model);
    sb_init(&obj_main);
    sb_printf(&flags, "%s %s -std=c11 ", cc, KILN_DEFAULT_CFLAGS);
    if (extra_cflags && *extra_cflags) sb_printf(&flags, "%s ", extra_cflags);
    sb_puts(&flags, "-I");
    shell_word(&flags, KILN_RUNTIME_DIR);
    const char *slash = strrchr(model_c, '/');
    int dirlen = slash ? (int)(slash - model_c + 1) : 0;
    sb_printf(&obj_model, "%.*smodel.o", dirlen, model_c);
    sb_printf(&obj_main, "%.*strain_main.o", dirlen, model_c);
    /* sh: the model in the background, the driver in the foreground, then the link */
    sb_printf(&cmd, "%s-c ", flags.data);
    shell_word(&cmd, model_c);
    sb_puts(&cmd, "-o ");
    shell_word(&cmd, obj_model.data);
    sb_printf(&cmd, "2>&1 & %s-c ", flags.data);
    shell_word(&cmd, KILN_RUNTIME_DIR "/train_main.c");
    sb_puts(&cmd, "-o ");
    shell_word(&cmd, obj_main.data);
    sb_printf(&cmd, "2>&1; main=$?; wait $!; model=$?; [ $main = 0 ] && [ $model = 0 ] && %s", flags.data);
    shell_word(&cmd, obj_model.data);
    shell_word(&cmd, obj_main.data);
    sb_puts(&cmd, "-o ");
    shell_word(&cmd, prog);
    shell_word(&cmd, KILN_RUNTIME_LIB);
    shell_word(&cmd, KILN_BLAS_LIB);
    /* libgomp by name too: the runtime's loops need it even when --cflags says -fno-openmp. */
    sb_printf(&cmd, "%s -lz -lm -lpthread 2>&1", KILN_OPENMP_LIBS);
    FILE *p = popen(cmd.data, "r");
    if (!p) {
        sb_printf(log, "cannot run the C compiler: %s", cmd.data);
        sb_free(&flags);
        sb_free(&cmd);
        sb_free(&obj_model);
        sb_free(&obj_main);
        return -1;
    }
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) sb_putn(log, chunk, n);
    int status = pclose(p);
    int rc = status == 0 ? 0 : -1;
    if (rc) sb_printf(log, "\nthe C compiler failed (%s)", cmd.data);
    unlink(obj_model.data);
    unlink(obj_main.data);
    sb_free(&flags);
    sb_free(&cmd);
    sb_free(&obj_model);
    sb_free(&obj_main);
    return rc;
}
