/* main.c — the `kiln` command: parses the flags of each command (options.c), calls
 * kiln_compile (driver/kiln.h) for everything that reads a model, and prints or writes
 * what it returns: kiln check's listing and memory plan, kiln ir's graphs, the generated
 * code (emit), a program or library (build, with build.c's compilers), and kiln train's
 * and kiln run's model, run in this process (the JIT, jit_train.c) or as a cached program.
 * Exit status: 0 success, 1 the model has errors (diagnostics on stderr),
 * 2 the command line is wrong. Output files are written atomically (a temp file, fsync,
 * rename), so an interrupted or failed run never leaves a truncated file behind. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../driver/kiln.h"
#include "../driver/jit.h"
#include "../driver/toolchain.h"
#include "build.h"
#include "cuda_report.h"
#include "inspect.h"
#include "jit_train.h"
#include "options.h"
#include "import.h"
#include "plot.h"

/* 0 when a file can be created in dir (tried, with a probe file that is removed: the
 * permission bits do not tell for root, read-only mounts or /sys), else the errno. */
static int dir_writable(const char *dir)
{
    size_t n = strlen(dir) + 48;
    char *probe = xmalloc(n);
    snprintf(probe, n, "%s/.kiln-probe-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return err;
}

/* Checks, before anything is compiled, that the output of `cmd` can be written: for a
 * file (build's program, ir's -o), that its directory exists and is writable and that it
 * is not a directory; for emit's directory, that it is a writable directory or that its
 * parent is (emit creates the last level only). Returns 0, or 2 after one message that
 * names the problem (instead of the C compiler's or the linker's). */
static int check_output(const char *cmd, const char *path, bool is_dir)
{
    struct stat st;
    int err;
    bool exists = stat(path, &st) == 0;
    if (exists && is_dir) {
        if (!S_ISDIR(st.st_mode)) {
            fprintf(stderr, "kiln %s: error: -o %s: exists and is not a directory\n", cmd, path);
            return 2;
        }
        if ((err = dir_writable(path))) {
            fprintf(stderr, "kiln %s: error: -o %s: cannot write in this directory: %s\n", cmd, path, strerror(err));
            return 2;
        }
        return 0;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln %s: error: -o %s: is a directory; name the file to write, e.g. -o %s%s%s\n", cmd, path, path,
                path[strlen(path) - 1] == '/' ? "" : "/", !strcmp(cmd, "build") ? "prog" : "out.txt");
        return 2;
    }
    /* The directory that holds path ("." when it has no slash). */
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrdup(path) : xstrdup(".");
    if (slash) dir[slash == path ? 1 : slash - path] = 0;
    int rc = 0;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "kiln %s: error: -o %s: the directory '%s' does not exist\n", cmd, path, dir);
        rc = 2;
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln %s: error: -o %s: '%s' is not a directory\n", cmd, path, dir);
        rc = 2;
    } else if ((err = dir_writable(dir))) {
        fprintf(stderr, "kiln %s: error: -o %s: cannot write in the directory '%s': %s\n", cmd, path, dir, strerror(err));
        rc = 2;
    }
    free(dir);
    return rc;
}

int cli_write_atomic(const char *path, const char *data, size_t len)
{
    size_t pl = strlen(path);
    char *tmp = xmalloc(pl + 32);
    snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "kiln: error: %s: cannot create: %s\n", path, strerror(errno));
        free(tmp);
        return 1;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;
        }
        off += (size_t)w;
    }
    int err = off < len ? errno : 0;
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        fprintf(stderr, "kiln: error: %s: cannot write: %s\n", path, strerror(err));
        unlink(tmp);
        free(tmp);
        return 1;
    }
    free(tmp);
    return 0;
}

/* The build options of a command line. */
static KilnOptions build_options(const char *cmd, const Options *o)
{
    return (KilnOptions){
        .path = o->file,
        .mode = o->mode,
        .bounds = o->bounds,
        .nbounds = o->nbounds,
        .target = o->cuda ? KILN_TARGET_CUDA : KILN_TARGET_C,
        .infer = o->infer || o->lib, /* a library runs the inference program's predict step */
        .precision = o->precision,
        .unfused_attention = o->unfused_attention,
        .weight_rounding = o->weight_rounding,
        .memory_budget = o->memory_budget,
        .bucket_bytes = o->distributed ? o->bucket_bytes : 0,
        .report = o->report,
        .smallest_plan = o->report,
        .time_passes = o->time_passes,
        .command = cmd,
        .diagnostics = stderr,
    };
}

/* Says why a compile failed (the diagnostics are already on stderr); the exit status. */
static int failed(const KilnOptions *ko, const KilnProgram *p, KilnStatus s, const StrBuf *err)
{
    if (err->len) fprintf(stderr, "%s\n", err->data);
    else if (p->diag.nerrors) fprintf(stderr, "kiln: %d error%s in %s\n", p->diag.nerrors, p->diag.nerrors == 1 ? "" : "s", ko->path);
    return s == KILN_ERR_USAGE ? 2 : 1;
}

/* Compiles the model: 0, or the exit status after saying why. */
static int compile(const KilnOptions *ko, KilnProgram **out)
{
    StrBuf err;
    sb_init(&err);
    KilnStatus s = kiln_compile(ko, out, &err);
    if ((*out)->notes.len) fputs((*out)->notes.data, stderr);
    int rc = s == KILN_OK ? 0 : failed(ko, *out, s, &err);
    sb_free(&err);
    return rc;
}

/* What a build prints on stderr besides errors: the memory report and the pass times.
 * pieces (may be NULL): what the C compiler compiled, and what came from its cache. */
static void print_build_info(const KilnProgram *p, double compile_seconds, const ObjResult *pieces)
{
    StrBuf what;
    sb_init(&what);
    if (pieces && pieces->npieces) {
        sb_puts(&what, ": ");
        objcache_describe(pieces, &what);
    }
    if (p->report.len) {
        fputs("kiln: ", stderr);
        fputs(p->report.data, stderr);
    }
    if (p->timing.len) {
        fputs(p->timing.data, stderr);
        if (compile_seconds > 0)
            fprintf(stderr, "%-10s %-8s %9.2f  %17s  %s%s\n", "compile", "all", compile_seconds * 1e3, "", "the target's compiler and linker",
                    what.data ? what.data : "");
    } else if (pieces && pieces->npieces && p->report.len == 0 && compile_seconds < 0) {
        fprintf(stderr, "kiln: %s\n", what.data + 2);
    }
    sb_free(&what);
}

/* --report --target cuda: the kernels as NVRTC compiles them for the GPUs (cuda_report.h).
 * 0, or 1 after a message. */
static int print_device_report(const KilnProgram *p)
{
    CudaReport r;
    StrBuf err, out;
    sb_init(&err);
    sb_init(&out);
    int rc = 0;
    if (cuda_report_compile(p->code.data ? p->code.data : "", p->code.len, p->code_name, &r, &err)) {
        fprintf(stderr, "kiln: error: %s\n", err.data ? err.data : "");
        rc = 1;
    } else {
        cuda_report_format(&r, &out);
        fprintf(stderr, "kiln: %s", out.data);
        cuda_report_free(&r);
    }
    sb_free(&err);
    sb_free(&out);
    return rc;
}

/* The build's progress line follows kiln_compile's stages. */
static void progress_at(void *ctx, const char *stage)
{
    progress_stage((BuildProgress *)ctx, 0, "%s", stage);
}

static int write_model_c(const char *dir, const char *name, const StrBuf *c, char **path_out)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln: error: %s: cannot create directory: %s\n", dir, strerror(errno));
        return 1;
    }
    size_t pl = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(pl);
    snprintf(path, pl, "%s/%s", dir, name);
    int rc = cli_write_atomic(path, c->data ? c->data : "", c->len);
    if (path_out && !rc) *path_out = path;
    else free(path);
    return rc;
}

/* Builds the program of p into prog. *stats (may be NULL): the pieces compiled and cached
 * (C programs). */
static int build_to(const Options *o, KilnProgram *p, const char *prog, BuildProgress *pg, ObjResult *stats)
{
    if (stats) memset(stats, 0, sizeof *stats);
    StrBuf log;
    sb_init(&log);
    int rc = 1;
    char dir[4096] = "";
    char *model_c = NULL;
    if (o->embed && build_embed_weights(o->embed, p->train.graph, o->cuda, &p->code)) goto done;
    if (build_tempdir_make(dir, sizeof dir)) {
        fprintf(stderr, "kiln: error: cannot create a temporary directory: %s\n", strerror(errno));
        dir[0] = 0;
        goto done;
    }
    if (write_model_c(dir, p->code_name, &p->code, &model_c)) goto done;
    int brc;
    if (o->lib) brc = build_library(model_c, prog, p->train.graph->name, o->cc, o->cflags, &log, pg);
    else if (o->cuda) brc = build_cuda_program(model_c, prog, o->emulated, o->nvcc, o->cc, o->cflags, o->infer, o->distributed, &log, pg);
    else {
        BuildProgramOptions bo = {.cc = o->cc, .cflags = o->cflags, .cpu = o->cpu, .infer = o->infer, .distributed = o->distributed, .pg = pg};
        brc = build_program(model_c, prog, &bo, &log, stats);
    }
    if (brc) {
        progress_clear(pg);
        if (brc == OBJCACHE_BAD_CPU) fprintf(stderr, "kiln build: error: %s\n", log.data);
        else fprintf(stderr, "kiln: error: building %s failed:\n%s\n", prog, log.data ? log.data : "");
        goto done;
    }
    rc = 0;
done:
    progress_clear(pg);
    if (dir[0]) build_tempdir_remove(dir);
    free(model_c);
    sb_free(&log);
    return rc;
}

/* kiln build and kiln emit. */
static int cmd_build(const char *cmd, const Options *o)
{
    /* on a terminal, one line that says what the build is doing: the passes, code
     * generation, the compilers (how many of their parts are done), the link */
    BuildProgress pg;
    progress_init(&pg, 4);
    const bool emit = !strcmp(cmd, "emit");
    if (o->cpu && (o->lib || o->cuda)) {
        fprintf(stderr, "kiln %s: error: --cpu is for C programs: a library (--lib) or --target cuda is built for the host's CPU\n", cmd);
        return 2;
    }
    KilnOptions ko = build_options(cmd, o);
    if (!emit && !o->report) { /* (--report prints during the passes: its lines would mix with the progress line) */
        ko.progress = progress_at;
        ko.progress_ctx = &pg;
    }
    KilnProgram *p;
    int rc = compile(&ko, &p);
    progress_clear(&pg);
    double seconds = 0;
    if (!rc && emit) {
        print_build_info(p, 0, NULL);
        rc = write_model_c(o->output, p->code_name, &p->code, NULL);
        if (!rc) fprintf(stderr, "kiln: wrote %s/%s (%zu bytes)\n", o->output, p->code_name, p->code.len);
    } else if (!rc) {
        if (p->report.len) print_build_info(p, -1, NULL), p->report.len = 0;
        if (o->report && o->cuda && !o->emulated) rc = print_device_report(p);
        const double t0 = pipeline_seconds();
        ObjResult pieces;
        memset(&pieces, 0, sizeof pieces);
        if (!rc) rc = build_to(o, p, o->output, &pg, &pieces);
        seconds = pipeline_seconds() - t0;
        if (p->timing.len) print_build_info(p, seconds, &pieces);
        else if (!rc && o->report) print_build_info(p, -1, &pieces); /* (its report is out already) */
        if (!rc) fprintf(stderr, "kiln: built %s\n", o->output);
    }
    kiln_program_free(p);
    return rc;
}

/* kiln train's and kiln run's own flags, taken out of the program's (anywhere after FILE):
 * --no-jit, --cc PATH (or --cc=PATH), --time-passes. -1 to go on, else the exit status. */
typedef struct {
    bool no_jit, time_passes;
    const char *cc;
} TrainFlags;

static int take_train_flags(const char *cmd, int *argc, char **argv, TrainFlags *t)
{
    int n = 0;
    for (int i = 0; i < *argc; i++) {
        if (!strcmp(argv[i], "--no-jit")) t->no_jit = true;
        else if (!strcmp(argv[i], "--time-passes")) t->time_passes = true;
        else if (!strcmp(argv[i], "--cc") || !strncmp(argv[i], "--cc=", 5)) {
            const char *v = argv[i][4] == '=' ? argv[i] + 5 : i + 1 < *argc ? argv[++i] : "";
            if (!*v) return cli_usage_error(cmd, "--cc needs a value: the C compiler to build the program with%s", "");
            t->cc = v;
        } else {
            argv[n++] = argv[i];
        }
    }
    *argc = n;
    return -1;
}

/* kiln train (and kiln run, infer: the inference program's): with Clang inside kiln, the
 * model is compiled into this process and run here (jit_train.c); with --no-jit, --cc or
 * $CC, the program is built and executed. The objects (objcache.h) or the program are cached
 * by the generated code and the compiler settings, so an unchanged model
 * starts at once. */
static int cmd_train(const char *cmd, const char *file, int argc, char **argv, char **kiln_argv)
{
    const bool infer = !strcmp(cmd, "run");
    TrainFlags tf = {0};
    int rc = take_train_flags(cmd, &argc, argv, &tf);
    if (rc >= 0) return rc;
    /* the recipe's precision and budget: the flags after the file are the program's */
    KilnOptions ko = {.path = file, .mode = MODE_TRAIN, .infer = infer, .command = cmd, .diagnostics = stderr, .time_passes = tf.time_passes};
    KilnProgram *p;
    rc = compile(&ko, &p);
    if (rc) {
        kiln_program_free(p);
        return rc;
    }
    if (p->timing.len) fputs(p->timing.data, stderr);
    const char *cc = build_c_compiler(tf.cc);
    const bool jit = !tf.no_jit && !cc && jit_available();
    if (jit) {
        JitTrainOptions jo = {.infer = infer, .time_passes = tf.time_passes, .argc = argc, .argv = argv, .kiln_argv = kiln_argv};
        return jit_train(p, &jo);
    }
    StrBuf key;
    sb_init(&key);
    sb_printf(&key, "%s|%s|%s|%s|", p->code.data, cc ? cc : toolchain_version(), KILN_VERSION, KILN_DEFAULT_CFLAGS);
    build_fingerprint(&key);
    uint64_t h = util_hash_string(key.data);
    sb_free(&key);
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    StrBuf dir;
    sb_init(&dir);
    if (cache && *cache) sb_printf(&dir, "%s/kiln", cache);
    else sb_printf(&dir, "%s/.cache/kiln", home && *home ? home : "/tmp");
    for (char *q = dir.data + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(dir.data, 0755);
            *q = '/';
        }
    mkdir(dir.data, 0755);
    StrBuf prog;
    sb_init(&prog);
    sb_printf(&prog, "%s/%s-%016llx", dir.data, p->train.graph->name, (unsigned long long)h);
    sb_free(&dir);
    if (access(prog.data, X_OK) != 0) {
        fprintf(stderr, "kiln: building %s\n", prog.data);
        /* The build writes to a temporary name first: an interrupted build never leaves a
         * broken program in the cache. */
        StrBuf tmp;
        sb_init(&tmp);
        sb_printf(&tmp, "%s.tmp%ld", prog.data, (long)getpid());
        Options o;
        memset(&o, 0, sizeof o);
        o.cc = tf.cc;
        o.infer = infer;
        BuildProgress pg;
        progress_init(&pg, 4);
        rc = build_to(&o, p, tmp.data, &pg, NULL);
        if (!rc && rename(tmp.data, prog.data) != 0) rc = 1;
        if (rc) unlink(tmp.data);
        sb_free(&tmp);
    }
    kiln_program_free(p);
    if (rc) {
        sb_free(&prog);
        return 1;
    }
    char **args = xcalloc((size_t)argc + 2, sizeof *args);
    args[0] = prog.data;
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    fflush(stdout);
    execv(prog.data, args);
    fprintf(stderr, "kiln: error: cannot run %s: %s\n", prog.data, strerror(errno));
    free(args);
    sb_free(&prog);
    return 1;
}

/* kiln check: the model as lowered, then the memory plan of the program kiln build would
 * make (training models). */
static int cmd_check(const Options *o, StrBuf *out)
{
    KilnOptions ko = build_options("check", o);
    ko.plan_only = ko.keep_lowered = ko.report = ko.smallest_plan = true;
    StrBuf err;
    sb_init(&err);
    KilnProgram *p;
    KilnStatus s = kiln_compile(&ko, &p, &err);
    int rc = 0;
    if (!p->lowered || s == KILN_ERR_USAGE) { /* the file did not lower, or a flag is wrong for it */
        rc = failed(&ko, p, s, &err);
    } else {
        cli_print_check(p->lowered, &p->model->recipe, o->file, out);
        if (p->lowered->mode == MODE_TRAIN) {
            if (s == KILN_OK) sb_puts(out, p->report.data);
            else sb_printf(out, "(no memory plan: %s)\n", err.len ? err.data : "the eval graph failed");
        }
    }
    sb_free(&err);
    kiln_program_free(p);
    return rc;
}

static int cmd_model(const char *cmd, int argc, char **argv)
{
    const bool ir = !strcmp(cmd, "ir");
    Options o;
    int rc = cli_parse_options(cmd, argc, argv, &o);
    cli_options_free(&o); /* plot's lists: not used here */
    if (rc >= 0) return rc;
    if (o.list_passes) {
        int n;
        const PassInfo *p = pipeline_passes(&n);
        for (int i = 0; i < n; i++) printf("%-10s %s\n", p[i].name, p[i].doc);
        return 0;
    }
    if (o.output && check_output(cmd, o.output, !strcmp(cmd, "emit") || o.lib)) return 2;
    if (!strcmp(cmd, "build") || !strcmp(cmd, "emit")) return cmd_build(cmd, &o);
    StrBuf out;
    sb_init(&out);
    if (!strcmp(cmd, "check")) {
        rc = cmd_check(&o, &out);
    } else { /* ir, gradcheck: the graph after a pass (ir --after), or as lowered */
        KilnOptions ko = build_options(cmd, &o);
        ko.stop_after = !ir ? "attention" : o.after ? o.after : o.stats ? "memplan" : "lower"; /* gradcheck: the fused attention too */
        ko.stats = o.stats;
        KilnProgram *p;
        rc = compile(&ko, &p);
        if (!rc && o.stats) fputs(p->stats.data ? p->stats.data : "", stderr);
        const Graph *g = p->train.graph;
        if (rc) ;
        else if (!ir) rc = cli_gradcheck(&o, g);
        else if (o.dot) ir_print_dot(g, &out);
        else if (o.after && (!strcmp(o.after, "fusion") || !strcmp(o.after, "memplan")))
            kiln_print_plan(g, &p->train.plan, !strcmp(o.after, "memplan"), &out);
        else ir_print(g, &out);
        kiln_program_free(p);
    }
    if (!rc && o.output) rc = cli_write_atomic(o.output, out.data ? out.data : "", out.len);
    else if (!rc && out.len && fwrite(out.data, 1, out.len, stdout) != out.len) rc = 1;
    sb_free(&out);
    return rc;
}

/* Prints the help of cmd (NULL: kiln's) to f. */
static void print_usage(const char *cmd, FILE *f)
{
    StrBuf u;
    sb_init(&u);
    cli_usage(cmd, &u);
    fputs(u.data, f);
    sb_free(&u);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(NULL, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        print_usage(NULL, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "check") || !strcmp(cmd, "ir") || !strcmp(cmd, "gradcheck") || !strcmp(cmd, "emit") || !strcmp(cmd, "build"))
        return cmd_model(cmd, argc - 2, argv + 2);
    if (!strcmp(cmd, "tokens")) return cli_tokens(argc - 2, argv + 2);
    if (!strcmp(cmd, "import")) {
        Options o;
        int rc = cli_parse_options(cmd, argc - 2, argv + 2, &o);
        if (rc < 0) rc = cli_import(o.file, o.output);
        cli_options_free(&o);
        return rc;
    }
    if (!strcmp(cmd, "plot")) {
        Options o;
        int rc = cli_parse_options(cmd, argc - 2, argv + 2, &o);
        if (rc < 0) {
            PlotOptions po = {.files = o.files, .nfiles = o.nfiles, .metrics = o.metrics, .nmetrics = o.nmetrics,
                              .output = o.output, .log_y = o.log_y};
            rc = plot_run(&po);
        }
        cli_options_free(&o);
        return rc;
    }
    if (!strcmp(cmd, "train") || !strcmp(cmd, "run")) {
        if (argc < 3 || argv[2][0] == '-') {
            if (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
                print_usage(cmd, stdout);
                return 0;
            }
            return cli_usage_error(cmd, "no model file given%s", "");
        }
        return cmd_train(cmd, argv[2], argc - 3, argv + 3, argv);
    }
    int ncmds;
    const CliCommand *cmds = cli_commands(&ncmds);
    StrBuf names;
    sb_init(&names);
    const char *best = NULL;
    int bestd = 1000;
    for (int i = 0; i < ncmds; i++) {
        sb_printf(&names, "%s%s", i ? ", " : "", cmds[i].name);
        int dist = util_edit_distance(cmds[i].name, cmd);
        if (dist < bestd) bestd = dist, best = cmds[i].name;
    }
    static const char *const extra[] = {"help", "version"};
    for (int i = 0; i < 2; i++) {
        int dist = util_edit_distance(extra[i], cmd);
        if (dist < bestd) bestd = dist, best = extra[i];
    }
    int rc;
    char msg[512];
    if (cmd[0] == '-') {
        snprintf(msg, sizeof msg, "unknown option '%.200s'; commands: %s", cmd, names.data);
        rc = cli_usage_error(NULL, "%s", msg);
    } else if (bestd <= 2) {
        fprintf(stderr, "kiln: error: unknown command '%s' (did you mean '%s'?)\n", cmd, best);
        rc = 2;
    } else {
        snprintf(msg, sizeof msg, "unknown command '%.200s'; commands: %s", cmd, names.data);
        rc = cli_usage_error(NULL, "%s", msg);
    }
    sb_free(&names);
    return rc;
}
