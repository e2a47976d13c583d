/* cuda_build.c — `kiln build --target cuda` without nvcc: the kernels of model.cu, of the
 * runtime's device.cu and (--distributed) of dist_nccl.cu compiled by NVRTC in this
 * process (cuda_report.h: in cached pieces on all cores) into CUBINs for sm_80 and sm_90
 * and compute_80 PTX, embedded in the program with a table of the kernels' names and each
 * file's device source (kiln_cuda_embedded.h); the files' host code, cut out of the same
 * text (cuda_device.h), compiled as C++ against the toolkit's headers, launching by name
 * through the driver API (kiln_cuda.h's KILN_CUDA_DRIVER), by Clang in this process (or
 * $CXX / --cc), and linked by lld with cudart, cuBLAS, cuBLASLt and NCCL (the driver API's
 * calls are found through cudart at run time: modules.cpp).
 *
 * cuda-emu programs carry the same table (build.c, emu_build.c: cuda_embed_emulated),
 * their images the emulator's tables of the kernels compiled into them, so that the
 * emulator runs the module loading a GPU program runs, its NVRTC path included. */
#define _DEFAULT_SOURCE /* realpath */
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../driver/toolchain.h"
#include "build.h"
#include "cuda_build.h"
#include "cuda_report.h"

/* The CUDA files of a program: model.cu, the runtime's device.cu (its optimizer without
 * contraction into fused multiply-adds, so that it rounds as the host's does), and the
 * NCCL transport of a distributed one. */
static const char *const unit_names[3] = {"model.cu", "device.cu", "dist_nccl.cu"};
static const char *const unit_options[3] = {"", "--fmad=false", "-I" KILN_PROGRAMS_DIR};

/* ---- each file's device source whole, its #include "..." files inlined ---- */

typedef struct {
    char **seen;
    int nseen;
} Seen;

static char *find_include(const char *name, const char *from_dir)
{
    const char *dirs[4] = {from_dir, KILN_RUNTIME_DIR "/cuda", KILN_RUNTIME_DIR, KILN_PROGRAMS_DIR};
    for (int i = 0; i < 4; i++) {
        if (!dirs[i]) continue;
        StrBuf p;
        sb_init(&p);
        sb_printf(&p, "%s/%s", dirs[i], name);
        char real[PATH_MAX];
        if (realpath(p.data, real)) {
            sb_free(&p);
            return xstrdup(real);
        }
        sb_free(&p);
    }
    return NULL;
}

static void inline_text(const char *text, const char *file, const char *dir, Seen *seen, StrBuf *out, int depth)
{
    int line = 1;
    for (const char *l = text; *l;) {
        const size_t n = strcspn(l, "\n");
        char name[512];
        const char *q = l;
        while (*q == ' ') q++;
        char *path = NULL;
        if (depth < 16 && !strncmp(q, "#include \"", 10) && sscanf(q + 10, "%511[^\"]", name) == 1) path = find_include(name, dir);
        if (path) {
            bool done = false;
            for (int i = 0; i < seen->nseen; i++) done |= !strcmp(seen->seen[i], path);
            if (!done) {
                seen->seen = xrealloc(seen->seen, (size_t)(seen->nseen + 1) * sizeof *seen->seen);
                seen->seen[seen->nseen++] = xstrdup(path);
                size_t len;
                StrBuf err;
                sb_init(&err);
                char *body = util_read_file(path, &len, &err);
                sb_free(&err);
                if (body) {
                    char *slash = strrchr(path, '/');
                    char *sub = xstrndup(path, slash ? (size_t)(slash - path) : 0);
                    sb_printf(out, "#line 1 \"%s\"\n", name);
                    inline_text(body, name, sub, seen, out, depth + 1);
                    sb_printf(out, "\n#line %d \"%s\"\n", line + 1, file);
                    free(sub);
                    free(body);
                }
            }
            free(path);
        } else {
            sb_putn(out, l, n);
            sb_putc(out, '\n');
        }
        l += n + (l[n] == '\n');
        line++;
    }
}

static char *whole_source(const CudaUnit *u, const char *dir)
{
    Seen seen = {0};
    StrBuf out;
    sb_init(&out);
    inline_text(u->src.text.data ? u->src.text.data : "", u->file, dir, &seen, &out, 0);
    for (int i = 0; i < seen.nseen; i++) free(seen.seen[i]);
    free(seen.seen);
    return sb_take(&out);
}

/* ---- the table (kiln_cuda_embedded.h), C++ ---- */

static void c_string(StrBuf *c, const char *s)
{
    sb_putc(c, '"');
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') sb_putc(c, '\\');
        if ((unsigned char)*s < 32) sb_printf(c, "\\%03o", (unsigned char)*s);
        else sb_putc(c, *s);
    }
    sb_putc(c, '"');
}

static bool path_ok(const char *p)
{
    for (; *p; p++)
        if (*p == '"' || *p == '\\' || (unsigned char)*p < 32) return false;
    return true;
}

/* sym and sym_end around the file's bytes (a NUL after them when nul). */
static void embed_file(StrBuf *c, const char *sym, const char *path, bool nul)
{
    sb_printf(c,
              "__asm__(\".section .rodata\\n.balign 16\\n.globl %s\\n.hidden %s\\n%s:\\n.incbin \\\"%s\\\"\\n%s.globl %s_end\\n.hidden %s_end\\n%s_end:\\n"
              ".previous\\n\");\nextern \"C\" const unsigned char %s[], %s_end[];\n",
              sym, sym, sym, path, nul ? ".byte 0\\n" : "", sym, sym, sym, sym, sym);
}

static int write_file(const char *path, const void *data, size_t n, StrBuf *log)
{
    FILE *f = fopen(path, "wb");
    bool ok = f && fwrite(data, 1, n, f) == n;
    if (f && fclose(f) != 0) ok = false;
    if (!ok) sb_printf(log, "cannot write %s", path);
    return ok ? 0 : -1;
}

/* The kernels' names of a unit, as cuda_report's pieces list them (for cuda-emu). */
static void table_kernels_emulated(const CudaUnit *units, int nunits, StrBuf *c)
{
    for (int u = 0; u < nunits; u++) {
        const CudaDeviceSource *s = &units[u].src;
        for (int k = 0; k < s->nkernel_names + s->nnames; k++) {
            sb_puts(c, "    {");
            c_string(c, k < s->nkernel_names ? s->kernel_names[k] : s->names[k - s->nkernel_names]);
            sb_printf(c, ", nullptr, %d, 0},\n", u);
        }
    }
}

/* Writes dir/embedded.cpp: the table, its images and sources beside it in dir. compiled:
 * NVRTC's pieces (a GPU program), or NULL: the emulator's. 0, or -1 with a message. */
static int write_table(const char *dir, const CudaUnit *units, int nunits, const CudaCompiled *compiled, StrBuf *log)
{
    if (!path_ok(dir)) {
        sb_printf(log, "the build directory %s has a quote, backslash or control character, which the assembler's .incbin cannot name", dir);
        return -1;
    }
    StrBuf c, path;
    sb_init(&c);
    sb_init(&path);
    sb_puts(&c, "/* The device code of this program: kiln_cuda_embedded.h. Written by kiln build. */\n#include \"kiln_cuda_embedded.h\"\n\n");
    int rc = 0;
    for (int u = 0; u < nunits && !rc; u++) {
        char *whole = whole_source(&units[u], KILN_RUNTIME_DIR "/cuda");
        path.len = 0;
        sb_printf(&path, "%s/source%d.cu", dir, u);
        rc = write_file(path.data, whole, strlen(whole), log);
        free(whole);
        char sym[64];
        snprintf(sym, sizeof sym, "kiln_cuda_source_%d", u);
        if (!rc) embed_file(&c, sym, path.data, true);
    }
    int nimages = 0;
    for (int i = 0; compiled && i < compiled->npieces && !rc; i++) {
        const CudaPieceImage *p = &compiled->pieces[i];
        for (int ptx = 0; ptx < 2 && !rc; ptx++) {
            if (ptx && (!p->ptx_size || strcmp(p->arch, "sm_80"))) continue;
            path.len = 0;
            sb_printf(&path, "%s/image%d.%s", dir, nimages, ptx ? "ptx" : "cubin");
            rc = ptx ? write_file(path.data, p->ptx, p->ptx_size, log) : write_file(path.data, p->image, p->size, log);
            char sym[64];
            snprintf(sym, sizeof sym, "kiln_cuda_image_%d", nimages++);
            if (!rc) embed_file(&c, sym, path.data, ptx); /* PTX is text, NUL-terminated */
        }
    }
    if (rc) {
        sb_free(&c);
        sb_free(&path);
        return rc;
    }
    sb_puts(&c, "\nstatic const kiln_cuda_image images[] = {\n");
    if (compiled) {
        for (int i = 0, n = 0; i < compiled->npieces; i++) {
            const CudaPieceImage *p = &compiled->pieces[i];
            const int sm = atoi(p->arch + 3);
            sb_printf(&c, "    {%d, %d, %d, kiln_cuda_image_%d, kiln_cuda_image_%d_end},\n", p->unit, p->piece, sm, n, n);
            n++;
            if (p->ptx_size && !strcmp(p->arch, "sm_80")) {
                sb_printf(&c, "    {%d, %d, -%d, kiln_cuda_image_%d, kiln_cuda_image_%d_end},\n", p->unit, p->piece, sm, n, n);
                n++;
            }
        }
    } else { /* the emulator's: every kernel compiled into the program, standing for the CUBINs */
        for (int k = 0; k < CUDA_REPORT_NARCH; k++)
            sb_printf(&c, "    {-1, -1, %d, (const unsigned char *)\"KEMUALL1\", nullptr},\n", atoi(cuda_report_arch[k] + 3));
    }
    sb_puts(&c, "};\n\nstatic const kiln_cuda_kernel kernels[] = {\n");
    int nkernels = 0;
    if (compiled) {
        for (int i = 0; i < compiled->npieces; i++) {
            const CudaPieceImage *p = &compiled->pieces[i];
            if (strcmp(p->arch, cuda_report_arch[0])) continue; /* the names are the same for every architecture */
            for (int k = 0; k < p->nnames; k++, nkernels++) {
                sb_puts(&c, "    {");
                c_string(&c, p->names[k]);
                sb_puts(&c, ", ");
                c_string(&c, p->lowered[k]);
                sb_printf(&c, ", %d, %d},\n", p->unit, p->piece);
            }
        }
    } else {
        table_kernels_emulated(units, nunits, &c);
        for (int u = 0; u < nunits; u++) nkernels += units[u].src.nkernel_names + units[u].src.nnames;
    }
    sb_puts(&c, "};\n\nstatic const kiln_cuda_unit units[] = {\n");
    for (int u = 0; u < nunits; u++) {
        sb_puts(&c, "    {");
        c_string(&c, units[u].file);
        sb_puts(&c, ", ");
        char **w = NULL; /* the options but -I: the source is whole */
        int nw = 0;
        util_words_split(units[u].options, &w, &nw);
        StrBuf kept;
        sb_init(&kept);
        for (int i = 0; i < nw; i++)
            if (strncmp(w[i], "-I", 2)) sb_printf(&kept, "%s%s", kept.len ? " " : "", w[i]);
        util_words_free(w, nw);
        c_string(&c, kept.data ? kept.data : "");
        sb_free(&kept);
        sb_printf(&c, ", (const char *)kiln_cuda_source_%d},\n", u);
    }
    sb_printf(&c, "};\n\nextern \"C\" const kiln_cuda_embedded kiln_cuda_embedded_code = {%d, units, %d, images, %d, kernels, ", nunits,
              compiled ? nimages : CUDA_REPORT_NARCH, nkernels);
    c_string(&c, compiled ? nvrtc_version() : "the emulator");
    sb_puts(&c, "};\n");
    path.len = 0;
    sb_printf(&path, "%s/embedded.cpp", dir);
    rc = write_file(path.data, c.data, c.len, log);
    sb_free(&c);
    sb_free(&path);
    return rc;
}

/* ---- the files ---- */

/* The units of a program: model.cu's text, device.cu's and dist_nccl.cu's, cut into their
 * device and host code. 0, or -1 with a message. */
static int read_units(const char *model_cu, bool distributed, CudaUnit *units, int *nunits, StrBuf *log)
{
    const char *paths[3] = {model_cu, KILN_RUNTIME_DIR "/cuda/device.cu", KILN_PROGRAMS_DIR "/dist_nccl.cu"};
    *nunits = distributed ? 3 : 2;
    memset(units, 0, 3 * sizeof *units);
    for (int u = 0; u < *nunits; u++) {
        size_t len;
        char *text = util_read_file(paths[u], &len, log);
        if (!text) {
            for (int k = 0; k < u; k++) cuda_device_source_free(&units[k].src);
            return -1;
        }
        units[u].file = unit_names[u];
        units[u].options = unit_options[u];
        const int rc = cuda_device_source(text, len, u ? paths[u] : unit_names[u], &units[u].src, log);
        free(text);
        if (rc) {
            for (int k = 0; k < u; k++) cuda_device_source_free(&units[k].src);
            return -1;
        }
    }
    /* one name, one kernel: the table finds kernels by name */
    for (int u = 0; u < *nunits; u++)
        for (int k = 0; k < units[u].src.nkernel_names; k++)
            for (int v = 0; v < u; v++)
                for (int j = 0; j < units[v].src.nkernel_names; j++)
                    if (!strcmp(units[u].src.kernel_names[k], units[v].src.kernel_names[j])) {
                        sb_printf(log, "the kernel %s is defined in %s and in %s; a program's kernels are found by their names", units[u].src.kernel_names[k],
                                  units[v].file, units[u].file);
                        for (int w = 0; w < *nunits; w++) cuda_device_source_free(&units[w].src);
                        return -1;
                    }
    return 0;
}

int cuda_embed_emulated(const char *model_cu, bool distributed, const char *dir, StrBuf *log)
{
    CudaUnit units[3];
    int nunits;
    if (read_units(model_cu, distributed, units, &nunits, log)) return -1;
    const int rc = write_table(dir, units, nunits, NULL, log);
    for (int u = 0; u < nunits; u++) cuda_device_source_free(&units[u].src);
    return rc;
}

/* ---- compiles and the link ---- */

typedef struct {
    char **args;
    int nargs;
    const char *cxx; /* an external compiler, or NULL: Clang in this process */
    int rc;
    char *log;
} Job;

static void *run_job(void *arg)
{
    Job *j = arg;
    if (!j->cxx) {
        j->rc = toolchain_run((const char *const *)j->args, j->nargs, &j->log);
        return NULL;
    }
    StrBuf cmd, out;
    sb_init(&cmd);
    sb_init(&out);
    build_shell_word(&cmd, j->cxx);
    for (int i = 0; i < j->nargs; i++) build_shell_word(&cmd, j->args[i]);
    sb_puts(&cmd, "2>&1");
    j->rc = build_run_logged(cmd.data, &out, "C++ compiler", NULL);
    j->log = out.data ? sb_take(&out) : NULL;
    sb_free(&out);
    sb_free(&cmd);
    return NULL;
}

static void add(Job *j, const char *w) { util_words_add(&j->args, &j->nargs, w); }
static void add_split(Job *j, const char *w) { util_words_split(w, &j->args, &j->nargs); }

static void compile_words(Job *j, const char *src, const char *obj, const char *extra_flags, bool dist)
{
    add_split(j, "-x c++ -std=c++17 -O2 -DKILN_CUDA_DRIVER");
    add_split(j, extra_flags ? extra_flags : "");
    add(j, "-I");
    add(j, KILN_RUNTIME_DIR "/cuda");
    add(j, "-I");
    add(j, KILN_RUNTIME_DIR);
    for (const char *p = KILN_CUDA_INCLUDE_DIRS; *p;) { /* CMake's list, '|' between */
        const size_t n = strcspn(p, "|");
        if (n) {
            char *d = xstrndup(p, n);
            add(j, "-isystem");
            add(j, d);
            free(d);
        }
        p += n + (p[n] == '|');
    }
    if (dist) { /* dist_nccl.cu's host code: its own directory's headers, MPI's and NCCL's */
        add(j, "-I");
        add(j, KILN_PROGRAMS_DIR);
        add_split(j, KILN_MPI_INCLUDES);
        add(j, "-isystem");
        add(j, KILN_NCCL_INCLUDE_DIR);
    }
    add(j, "-c");
    add(j, src);
    add(j, "-o");
    add(j, obj);
}

int build_cuda_nvrtc(const char *model_cu, const char *prog, const char *cxx, const char *extra_flags, bool infer, bool distributed, StrBuf *log,
                     BuildProgress *pg)
{
    const char *why;
    if (!nvrtc_available(&why)) {
        sb_printf(log, "--target cuda compiles its kernels with NVRTC: %s", why);
        return -1;
    }
    if (!KILN_CUDA_MODULES_LIB[0]) {
        sb_puts(log, "--target cuda needs the CUDA toolkit's headers and libraries, and Kiln was built without them (cmake finds them with "
                     "find_package(CUDAToolkit))");
        return -1;
    }
    if (!cxx && !toolchain_available()) cxx = KILN_CXX;
    const char *slash = strrchr(model_cu, '/');
    char *dir = slash ? xstrndup(model_cu, (size_t)(slash - model_cu)) : xstrdup(".");
    CudaUnit units[3];
    int nunits;
    if (read_units(model_cu, distributed, units, &nunits, log)) {
        free(dir);
        return -1;
    }
    /* the host code: its files, compiled on threads while NVRTC compiles the kernels */
    enum { MAXJOBS = 4 };
    Job jobs[MAXJOBS];
    memset(jobs, 0, sizeof jobs);
    char srcs[MAXJOBS][4200], objs[MAXJOBS][4200];
    memset(srcs, 0, sizeof srcs);
    memset(objs, 0, sizeof objs);
    int rc = 0;
    for (int u = 0; u < nunits && !rc; u++) {
        snprintf(srcs[u], sizeof srcs[u], "%s/host%d.cpp", dir, u);
        snprintf(objs[u], sizeof objs[u], "%s/host%d.o", dir, u);
        rc = write_file(srcs[u], units[u].src.host.data ? units[u].src.host.data : "", units[u].src.host.len, log);
        jobs[u].cxx = cxx;
        compile_words(&jobs[u], srcs[u], objs[u], extra_flags, u == 2);
    }
    pthread_t threads[MAXJOBS];
    bool started[MAXJOBS] = {false};
    progress_stage(pg, nunits + 2, "compiling the kernels with %s, the host code with %s", nvrtc_version(), cxx ? cxx : toolchain_version());
    for (int u = 0; u < nunits && !rc; u++) started[u] = pthread_create(&threads[u], NULL, run_job, &jobs[u]) == 0;
    CudaCompiled compiled;
    memset(&compiled, 0, sizeof compiled);
    const int nvrtc_rc = rc ? -1 : cuda_units_compile(units, nunits, &compiled, log);
    progress_piece_done(pg);
    for (int u = 0; u < nunits; u++) {
        if (started[u]) pthread_join(threads[u], NULL);
        else if (!rc) run_job(&jobs[u]);
        progress_piece_done(pg);
    }
    rc = rc || nvrtc_rc;
    for (int u = 0; u < nunits; u++) {
        if (jobs[u].log) sb_puts(log, jobs[u].log);
        if (jobs[u].rc && !rc) {
            sb_printf(log, "\nthe C++ compiler (%s) failed on %s's host code", cxx ? cxx : toolchain_version(), units[u].file);
            rc = -1;
        }
    }
    /* the table, with the CUBINs */
    const int tab = nunits;
    if (!rc) rc = write_table(dir, units, nunits, &compiled, log);
    if (!rc) {
        snprintf(srcs[tab], sizeof srcs[tab], "%s/embedded.cpp", dir);
        snprintf(objs[tab], sizeof objs[tab], "%s/embedded.o", dir);
        jobs[tab].cxx = cxx;
        compile_words(&jobs[tab], srcs[tab], objs[tab], "", false);
        run_job(&jobs[tab]);
        if (jobs[tab].log) sb_puts(log, jobs[tab].log);
        if (jobs[tab].rc) {
            sb_puts(log, "\nthe C++ compiler failed on the table of the program's kernels");
            rc = -1;
        }
        progress_piece_done(pg);
    }
    if (!rc) {
        progress_stage(pg, 0, "linking the program");
        Job link;
        memset(&link, 0, sizeof link);
        link.cxx = cxx;
        for (int i = 0; i <= nunits; i++) add(&link, objs[i]);
        add(&link, infer ? KILN_INFER_MAIN : KILN_TRAIN_MAIN);
        if (!infer) {
            add(&link, KILN_TRAIN_BENCH);
            add(&link, KILN_TRAIN_CKPT);
            add(&link, distributed ? KILN_DIST_MPI : KILN_DIST_SINGLE);
        }
        add(&link, "-o");
        add(&link, prog);
        add(&link, KILN_RUNTIME_LIB);
        add(&link, KILN_CUDA_MODULES_LIB);
        StrBuf w;
        sb_init(&w);
        if (distributed) {
            sb_printf(&w, "-L%s", KILN_NCCL_LIB_DIR);
            add(&link, w.data);
            w.len = 0;
            sb_printf(&w, "-Wl,-rpath,%s", KILN_NCCL_LIB_DIR);
            add(&link, w.data);
            add(&link, "-lnccl");
        }
        w.len = 0;
        sb_printf(&w, "-L%s", KILN_CUDA_LIB_DIR);
        add(&link, w.data);
        w.len = 0;
        sb_printf(&w, "-Wl,-rpath,%s", KILN_CUDA_LIB_DIR);
        add(&link, w.data);
        sb_free(&w);
        add_split(&link, "-lcublasLt -lcublas -lcudart"); /* not libcuda: modules.cpp finds the driver through cudart */
        if (distributed) add_split(&link, KILN_MPI_LIBS);
        add_split(&link, KILN_DEFAULT_LDFLAGS);
        add_split(&link, "-lstdc++ -fopenmp -lz -lm -lpthread -ldl");
        run_job(&link);
        if (link.log) sb_puts(log, link.log);
        if (link.rc) {
            sb_printf(log, "\nthe linker (%s) failed", cxx ? cxx : toolchain_version());
            rc = -1;
        }
        free(link.log);
        util_words_free(link.args, link.nargs);
    }
    for (int i = 0; i <= nunits; i++) {
        unlink(srcs[i]);
        unlink(objs[i]);
        free(jobs[i].log);
        util_words_free(jobs[i].args, jobs[i].nargs);
    }
    /* the table's files */
    StrBuf p;
    sb_init(&p);
    for (int u = 0; u < nunits; u++) {
        p.len = 0;
        sb_printf(&p, "%s/source%d.cu", dir, u);
        unlink(p.data);
    }
    for (int i = 0; i < 2 * compiled.npieces; i++) {
        p.len = 0;
        sb_printf(&p, "%s/image%d.cubin", dir, i);
        unlink(p.data);
        p.len = 0;
        sb_printf(&p, "%s/image%d.ptx", dir, i);
        unlink(p.data);
    }
    sb_free(&p);
    cuda_compiled_free(&compiled);
    for (int u = 0; u < nunits; u++) cuda_device_source_free(&units[u].src);
    free(dir);
    return rc;
}
