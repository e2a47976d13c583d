/* cuda_embed.c — cuda_embed.h: a CUDA program's files as NVRTC units, and the table of
 * their device code (kiln_cuda_embedded.h) written as C++ with the CUBINs, PTX and
 * sources beside it for the assembler's .incbin. */
#define _DEFAULT_SOURCE /* realpath */
#include "cuda_embed.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The CUDA files of a program: model.cu, the runtime's device.cu (its optimizer without
 * contraction into fused multiply-adds, so that it rounds as the host's does), and the
 * NCCL transport of a distributed one. */
static const char *const unit_names[3] = {"model.cu", "device.cu", "dist_nccl.cu"};
static const char *const unit_paths[3] = {NULL, KILN_RUNTIME_DIR "/cuda/device.cu", KILN_PROGRAMS_DIR "/dist_nccl.cu"};
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

int cuda_embed_write_file(const char *path, const void *data, size_t n, StrBuf *log)
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

int cuda_embed_write_table(const char *dir, const char *table, const CudaUnit *units, int nunits, const CudaCompiled *compiled, StrBuf *log)
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
        sb_printf(&path, "%s/%s_source%d.cu", dir, table, u);
        rc = cuda_embed_write_file(path.data, whole, strlen(whole), log);
        free(whole);
        char sym[64];
        snprintf(sym, sizeof sym, "%s_source_%d", table, u);
        if (!rc) embed_file(&c, sym, path.data, true);
    }
    int nimages = 0;
    for (int i = 0; compiled && i < compiled->npieces && !rc; i++) {
        const CudaPieceImage *p = &compiled->pieces[i];
        for (int ptx = 0; ptx < 2 && !rc; ptx++) {
            if (ptx && (!p->ptx_size || strcmp(p->arch, "sm_80"))) continue;
            path.len = 0;
            sb_printf(&path, "%s/%s_image%d.%s", dir, table, nimages, ptx ? "ptx" : "cubin");
            rc = ptx ? cuda_embed_write_file(path.data, p->ptx, p->ptx_size, log) : cuda_embed_write_file(path.data, p->image, p->size, log);
            char sym[64];
            snprintf(sym, sizeof sym, "%s_image_%d", table, nimages++);
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
            sb_printf(&c, "    {%d, %d, %d, %s_image_%d, %s_image_%d_end},\n", p->unit, p->piece, sm, table, n, table, n);
            n++;
            if (p->ptx_size && !strcmp(p->arch, "sm_80")) {
                sb_printf(&c, "    {%d, %d, -%d, %s_image_%d, %s_image_%d_end},\n", p->unit, p->piece, sm, table, n, table, n);
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
        sb_printf(&c, ", (const char *)%s_source_%d},\n", table, u);
    }
    sb_printf(&c, "};\n\nextern \"C\" const kiln_cuda_embedded %s = {%d, units, %d, images, %d, kernels, ", table, nunits,
              compiled ? nimages : CUDA_REPORT_NARCH, nkernels);
    c_string(&c, compiled ? nvrtc_version() : "the emulator");
    sb_puts(&c, "};\n");
    path.len = 0;
    sb_printf(&path, "%s/%s.cpp", dir, table);
    rc = cuda_embed_write_file(path.data, c.data, c.len, log);
    sb_free(&c);
    sb_free(&path);
    return rc;
}

/* ---- the files ---- */

int cuda_embed_read_unit(int which, const char *model_cu, CudaUnit *u, StrBuf *log)
{
    memset(u, 0, sizeof *u);
    const char *path = which == CUDA_UNIT_MODEL ? model_cu : unit_paths[which];
    size_t len;
    char *text = util_read_file(path, &len, log);
    if (!text) return -1;
    u->file = unit_names[which];
    u->options = unit_options[which];
    const int rc = cuda_device_source(text, len, which == CUDA_UNIT_MODEL ? unit_names[which] : path, &u->src, log);
    free(text);
    return rc;
}

int cuda_embed_check_names(const CudaUnit *units, int nunits, StrBuf *log)
{
    for (int u = 0; u < nunits; u++)
        for (int k = 0; k < units[u].src.nkernel_names; k++)
            for (int v = 0; v < u; v++)
                for (int j = 0; j < units[v].src.nkernel_names; j++)
                    if (!strcmp(units[u].src.kernel_names[k], units[v].src.kernel_names[j])) {
                        sb_printf(log, "the kernel %s is defined in %s and in %s; a program's kernels are found by their names", units[u].src.kernel_names[k],
                                  units[v].file, units[u].file);
                        return -1;
                    }
    return 0;
}

int cuda_embed_emulated(const char *model_cu, bool distributed, const char *dir, StrBuf *log)
{
    CudaUnit units[3];
    const int nunits = distributed ? 3 : 2;
    int rc = 0, read = 0;
    for (; read < nunits && !rc; read++) rc = cuda_embed_read_unit(read, model_cu, &units[read], log);
    if (rc) read--;
    if (!rc) rc = cuda_embed_check_names(units, nunits, log);
    if (!rc) rc = cuda_embed_write_table(dir, CUDA_EMBED_MODEL_TABLE, units, nunits, NULL, log);
    for (int u = 0; u < read; u++) cuda_device_source_free(&units[u].src);
    return rc;
}
