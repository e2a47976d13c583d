/* lib_build.c — turns a generated model.c into an embeddable C library (kiln build
 * --lib -o DIR): DIR/MODEL.h, DIR/libMODEL.a and DIR/libMODEL.so. The model is compiled
 * position-independent with no profiling marks (KILN_NO_PROFILE: no clock in the run
 * path); lib_gen (programs/lib_gen.c, linked with it) reads the model's own tables and
 * writes the header and the API glue; then the model, the glue and the library runtime
 * (lib_run.c, lib_weights.c) are linked into one relocatable object in which only the API
 * stays global, so that the kernels, the tables and the runtime's names cannot clash with
 * the caller's or with another model's library. The archive holds that object; the shared
 * library is it linked with OpenBLAS and OpenMP.
 *
 * Where Kiln has Clang and lld as libraries (toolchain.h) and no compiler is named (--cc,
 * $CC: build_c_compiler), no tool is run: model.c's pieces compile in this process through
 * the object cache (objcache.h), as a program's do, lld links lib_gen, the relocatable
 * object (-r) and the shared library, LLVM's objcopy library keeps the API global and its
 * archive writer makes the archive; OpenMP is then LLVM's libomp, which the shared
 * library names and the archive's caller links. Otherwise the named compiler, ld, objcopy
 * and ar run from one shell command line, the model's two halves (KILN_PART) at once, and
 * OpenMP is that compiler's. The outputs are built in the scratch directory and moved into
 * DIR at the end: a failed build leaves DIR as it was. docs/library.md. */
#define _DEFAULT_SOURCE /* realpath */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "../driver/toolchain.h"
#include "build.h"
#include "objcache.h"

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

static int build_library_external(const char *cc, const char *model_c, const char *abs_dir, const char *name, const char *extra_cflags, StrBuf *log,
                                  BuildProgress *pg)
{
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
    sb_printf(&cmd, "%s %s -lprotobuf-c -lz -lm -lpthread 2>&1 && ", KILN_DEFAULT_LDFLAGS, KILN_OPENMP_LIBS);
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

/* ---- in this process: Clang, lld and LLVM's objcopy and archive writer ---- */

/* A command line's words (util_words_*). */
typedef struct {
    char **v;
    int n;
} Words;

static void words_add(Words *w, const char *s) { util_words_add(&w->v, &w->n, s); }

/* Appends the tool's messages to log; on a failure, and what failed. Returns rc. */
static int take_log(int rc, char *text, const char *what, StrBuf *log)
{
    if (text) sb_puts(log, text);
    free(text);
    if (rc) sb_printf(log, "\n%s failed (in process: %s)", what, toolchain_version());
    return rc;
}

/* `clang WORDS` in this process; the words are used up (w is empty again). */
static int run_clang(Words *w, const char *what, StrBuf *log)
{
    char *text = NULL;
    int rc = toolchain_run((const char *const *)w->v, w->n, &text);
    util_words_free(w->v, w->n);
    *w = (Words){0};
    return take_log(rc, text, what, log);
}

/* Puts scratch file `from` at `to` (a name in DIR no one else uses): renamed, or copied
 * with its mode where DIR is on another file system. 0, or -1 with a message. */
static int stage_file(const char *from, const char *to, StrBuf *log)
{
    if (rename(from, to) == 0) return 0;
    if (errno != EXDEV) {
        sb_printf(log, "cannot move %s to %s: %s", from, to, strerror(errno));
        return -1;
    }
    FILE *in = fopen(from, "rb");
    struct stat st;
    int fd = in && fstat(fileno(in), &st) == 0 ? open(to, O_WRONLY | O_CREAT | O_TRUNC, st.st_mode & 0777) : -1;
    FILE *out = fd >= 0 ? fdopen(fd, "wb") : NULL;
    bool ok = in && out;
    char chunk[65536];
    size_t got;
    while (ok && (got = fread(chunk, 1, sizeof chunk, in)) > 0) ok = fwrite(chunk, 1, got, out) == got;
    ok = ok && !ferror(in);
    if (in) fclose(in);
    if (out) ok = fclose(out) == 0 && ok;
    else if (fd >= 0) close(fd);
    if (!ok) {
        sb_printf(log, "cannot copy %s to %s: %s", from, to, strerror(errno));
        unlink(to);
        return -1;
    }
    return 0;
}

/* The three outputs into DIR: each first under a temporary name there, then all renamed
 * (a failure before the renames leaves DIR as it was). */
static int move_outputs(const char *scratch, const char *abs_dir, const char *name, StrBuf *log)
{
    static const char *const from[3] = {"lib.h", "lib.a", "lib.so"};
    StrBuf src[3], tmp[3], dst[3];
    int rc = 0, staged = 0;
    for (int i = 0; i < 3; i++) {
        sb_init(&src[i]);
        sb_init(&tmp[i]);
        sb_init(&dst[i]);
        sb_printf(&src[i], "%s/%s", scratch, from[i]);
        if (i == 0) sb_printf(&dst[i], "%s/%s.h", abs_dir, name);
        else sb_printf(&dst[i], "%s/lib%s.%s", abs_dir, name, i == 1 ? "a" : "so");
        sb_printf(&tmp[i], "%s/.kiln-new-%ld-%s", abs_dir, (long)getpid(), from[i]);
    }
    for (; staged < 3 && !rc; staged += !rc) rc = stage_file(src[staged].data, tmp[staged].data, log);
    for (int i = 0; i < 3 && !rc; i++)
        if (rename(tmp[i].data, dst[i].data) != 0) {
            sb_printf(log, "cannot move %s to %s: %s", tmp[i].data, dst[i].data, strerror(errno));
            rc = -1;
        }
    for (int i = 0; i < 3; i++) {
        if (rc && i < staged) unlink(tmp[i].data);
        sb_free(&src[i]);
        sb_free(&tmp[i]);
        sb_free(&dst[i]);
    }
    return rc;
}

static int build_library_in_process(const char *model_c, const char *abs_dir, const char *name, const char *extra_cflags, StrBuf *log,
                                    BuildProgress *pg)
{
    size_t text_len;
    char *text = util_read_file(model_c, &text_len, log);
    if (!text) return -1;
    char scratch[PATH_MAX + 64];
    const char *slash = strrchr(model_c, '/');
    snprintf(scratch, sizeof scratch, "%.*s", slash ? (int)(slash - model_c) : 1, slash ? model_c : ".");
    StrBuf cflags;
    sb_init(&cflags);
    sb_printf(&cflags, "%s -fPIC -fvisibility=hidden -DKILN_NO_PROFILE", extra_cflags ? extra_cflags : "");
    /* the pieces as a program's, with the library's flags in their cache key */
    ObjOptions oo = {.cc = NULL, .cflags = cflags.data, .dir = scratch, .pg = pg};
    ObjResult objs;
    int rc = objcache_compile(text, text_len, &oo, &objs, log);
    free(text);
    char lib_gen[PATH_MAX + 80], lib_c[PATH_MAX + 80], lib_o[PATH_MAX + 80], all_o[PATH_MAX + 80], model_o[PATH_MAX + 80], syms[PATH_MAX + 80],
        lib_a[PATH_MAX + 80], lib_so[PATH_MAX + 80];
    snprintf(lib_gen, sizeof lib_gen, "%s/lib_gen", scratch);
    snprintf(lib_c, sizeof lib_c, "%s/lib.c", scratch);
    snprintf(lib_o, sizeof lib_o, "%s/lib.o", scratch);
    snprintf(all_o, sizeof all_o, "%s/lib_all.o", scratch);
    snprintf(model_o, sizeof model_o, "%s/lib_model.o", scratch);
    snprintf(syms, sizeof syms, "%s/lib.syms", scratch);
    snprintf(lib_a, sizeof lib_a, "%s/lib.a", scratch);
    snprintf(lib_so, sizeof lib_so, "%s/lib.so", scratch);
    Words flags = {0}, w = {0};
    objcache_flags(NULL, cflags.data, true, &flags.v, &flags.n);
    sb_free(&cflags);
    if (!rc) { /* lib_gen: the model's tables to the header and the glue */
        progress_stage(pg, 0, "making the library");
        for (int i = 0; i < flags.n; i++) words_add(&w, flags.v[i]);
        for (int i = 0; i < objs.nobjs; i++) words_add(&w, objs.objs[i]);
        const char *rest[] = {KILN_LIB_RUN, KILN_LIB_GEN, "-o", lib_gen, KILN_RUNTIME_LIB, KILN_BLAS_LIB, "-fopenmp", "-lprotobuf-c", "-lz", "-lm", "-lpthread"};
        for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) words_add(&w, rest[i]);
        rc = run_clang(&w, "linking lib_gen", log);
    }
    if (!rc) {
        StrBuf cmd;
        sb_init(&cmd);
        sb_puts(&cmd, "cd ");
        build_shell_word(&cmd, scratch);
        sb_printf(&cmd, "&& ./lib_gen '%s' lib.h lib.c lib.syms 2>&1", KILN_VERSION);
        rc = build_run_logged(cmd.data, log, "library's generator (lib_gen)", NULL);
        sb_free(&cmd);
    }
    if (!rc) {
        for (int i = 0; i < flags.n; i++) words_add(&w, flags.v[i]);
        const char *rest[] = {"-c", lib_c, "-o", lib_o};
        for (size_t i = 0; i < sizeof rest / sizeof *rest; i++) words_add(&w, rest[i]);
        rc = run_clang(&w, "compiling the library's glue (lib.c)", log);
    }
    if (!rc) { /* one object (ld -r), then only the API global */
        words_add(&w, "-r");
        words_add(&w, "-o");
        words_add(&w, all_o);
        for (int i = 0; i < objs.nobjs; i++) words_add(&w, objs.objs[i]);
        words_add(&w, lib_o);
        words_add(&w, KILN_LIB_RUN);
        words_add(&w, KILN_LIB_WEIGHTS);
        rc = run_clang(&w, "linking the library's object (-r)", log);
    }
    char *tool_log = NULL;
    if (!rc) rc = take_log(toolchain_keep_globals(all_o, model_o, syms, &tool_log), tool_log, "keeping only the API global (objcopy)", log);
    const char *members[] = {model_o};
    if (!rc) rc = take_log(toolchain_archive(lib_a, members, 1, &tool_log), tool_log, "writing the archive (ar)", log);
    if (!rc) { /* the shared library: LLVM's libomp, which it names (the driver's -fopenmp) */
        char soname[300];
        snprintf(soname, sizeof soname, "-Wl,-soname,lib%s.so", name);
        const char *all[] = {"-shared", soname, "-o", lib_so, model_o, KILN_BLAS_LIB, "-fopenmp", "-lm"};
        for (size_t i = 0; i < sizeof all / sizeof *all; i++) words_add(&w, all[i]);
        rc = run_clang(&w, "linking the shared library", log);
    }
    if (!rc) rc = move_outputs(scratch, abs_dir, name, log);
    util_words_free(flags.v, flags.n);
    for (int i = 0; i < objs.nobjs; i++) unlink(objs.objs[i]);
    objcache_result_free(&objs);
    return rc;
}

int build_library(const char *model_c, const char *dir, const char *name, const char *cc_flag, const char *extra_cflags, StrBuf *log, BuildProgress *pg)
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
    const char *cc = build_c_compiler(cc_flag);
    if (!cc) return build_library_in_process(model_c, abs_dir, name, extra_cflags, log, pg);
    return build_library_external(cc, model_c, abs_dir, name, extra_cflags, log, pg);
}
