/* lib_build.c — turns a generated model.c into an embeddable C library (kiln build
 * --lib -o DIR): DIR/MODEL.h, DIR/libMODEL.a and DIR/libMODEL.so. The model's two halves
 * are compiled position-independent with no profiling marks (KILN_NO_PROFILE: no clock
 * in the run path); lib_gen (programs/lib_gen.c, linked with them) reads the model's own
 * tables and writes the header and the API glue; then the model, the glue and the
 * library runtime (lib_run.c, lib_weights.c) are linked into one relocatable object in
 * which objcopy keeps only the API global, so that the kernels, the tables and the
 * runtime's names cannot clash with the caller's or with another model's library. The
 * archive holds that object; the shared library is it linked with OpenBLAS and libgomp.
 * The outputs are built in the scratch directory and moved into DIR at the end: a failed
 * build leaves DIR as it was. docs/library.md. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "build.h"

/* Appends "mv -f SCRATCH_FILE DIR/NAME" to cmd. */
static void move_into(StrBuf *cmd, const char *file, const char *dir, const char *name)
{
    StrBuf to;
    sb_init(&to);
    sb_printf(&to, "%s/%s", dir, name);
    sb_printf(cmd, "mv -f %s ", file);
    build_shell_word(cmd, to.data);
    sb_free(&to);
}

int build_library(const char *model_c, const char *dir, const char *name, const char *extra_cflags, StrBuf *log, BuildProgress *pg)
{
    char abs_dir[PATH_MAX];
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        sb_printf(log, "%s: cannot create the directory: %s", dir, strerror(errno));
        return -1;
    }
    if (!realpath(dir, abs_dir)) {
        sb_printf(log, "%s: %s", dir, strerror(errno));
        return -1;
    }
    const char *cc = getenv("CC");
    if (!cc || !*cc) cc = KILN_DEFAULT_CC;
    const char *slash = strrchr(model_c, '/');
    StrBuf scratch, flags, cmd, file;
    sb_init(&scratch);
    sb_init(&flags);
    sb_init(&cmd);
    sb_init(&file);
    sb_printf(&scratch, "%.*s", slash ? (int)(slash - model_c) : 1, slash ? model_c : ".");
    sb_printf(&flags, "%s %s -std=c11 ", cc, KILN_DEFAULT_CFLAGS);
    if (extra_cflags && *extra_cflags) sb_printf(&flags, "%s ", extra_cflags);
    sb_puts(&flags, "-fPIC -fvisibility=hidden -DKILN_NO_PROFILE -I");
    build_shell_word(&flags, KILN_RUNTIME_DIR);
    /* in the scratch directory, where the names below are Kiln's own (build.c removes them) */
    sb_puts(&cmd, "cd ");
    build_shell_word(&cmd, scratch.data);
    /* the two halves at once (KILN_PART, as a program's), then lib_gen and the glue */
    sb_printf(&cmd, "&& { ( %s-DKILN_PART=1 -c model.c -o model1.o 2>&1; s=$?; " PROGRESS_SH_DONE "; exit $s ) & "
                    "%s-DKILN_PART=2 -c model.c -o model2.o 2>&1; second=$?; " PROGRESS_SH_DONE "; wait $!; first=$?; "
                    "[ $first = 0 ] && [ $second = 0 ]; } && " PROGRESS_SH_STAGE("making the library") " && %s model1.o model2.o ",
              flags.data, flags.data, flags.data);
    build_shell_word(&cmd, KILN_LIB_RUN);
    build_shell_word(&cmd, KILN_LIB_GEN);
    sb_puts(&cmd, "-o lib_gen ");
    build_shell_word(&cmd, KILN_RUNTIME_LIB);
    build_shell_word(&cmd, KILN_BLAS_LIB);
    sb_printf(&cmd, "%s %s -lz -lm -lpthread 2>&1 && ", KILN_DEFAULT_LDFLAGS, KILN_OPENMP_LIBS);
    sb_printf(&cmd, "./lib_gen '%s' lib.h lib.c lib.syms && %s-c lib.c -o lib.o 2>&1 && ", KILN_VERSION, flags.data);
    /* one object, only the API global */
    sb_printf(&cmd, "%s -r -o lib_all.o model1.o model2.o lib.o ", KILN_LD);
    build_shell_word(&cmd, KILN_LIB_RUN);
    build_shell_word(&cmd, KILN_LIB_WEIGHTS);
    sb_printf(&cmd, "2>&1 && %s --keep-global-symbols=lib.syms lib_all.o lib_model.o 2>&1 && ", KILN_OBJCOPY);
    sb_printf(&cmd, "rm -f lib.a && %s rcs lib.a lib_model.o 2>&1 && ", KILN_AR);
    sb_printf(&cmd, "%s -shared -Wl,-soname,lib%s.so -o lib.so lib_model.o ", cc, name);
    build_shell_word(&cmd, KILN_BLAS_LIB);
    sb_printf(&cmd, "%s %s -lm 2>&1 && ", KILN_DEFAULT_LDFLAGS, KILN_OPENMP_LIBS);
    /* into DIR, the three together */
    sb_printf(&file, "%s.h", name);
    move_into(&cmd, "lib.h", abs_dir, file.data);
    sb_free(&file);
    sb_printf(&file, "lib%s.a", name);
    sb_puts(&cmd, "&& ");
    move_into(&cmd, "lib.a", abs_dir, file.data);
    sb_free(&file);
    sb_printf(&file, "lib%s.so", name);
    sb_puts(&cmd, "&& ");
    move_into(&cmd, "lib.so", abs_dir, file.data);
    progress_stage(pg, 2, "compiling model.c with %s", strrchr(cc, '/') ? strrchr(cc, '/') + 1 : cc);
    int rc = build_run_logged(cmd.data, log, "library build", pg);
    sb_free(&scratch);
    sb_free(&flags);
    sb_free(&cmd);
    sb_free(&file);
    return rc;
}
