/* nvrtc.c — nvrtc.h: NVRTC through dlopen, and ptxas's report read out of its log.
 *
 * The library is the toolkit's (KILN_NVRTC_LIB, the path CMake found), opened once, by the
 * first thread that needs it; its functions are looked up by the names and types of the
 * toolkit's nvrtc.h, which this file is compiled against (KILN_HAVE_NVRTC). */
#define _GNU_SOURCE
#include "nvrtc.h"

#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../util/util.h"

#if KILN_HAVE_NVRTC
#include <dlfcn.h>
#include <nvrtc.h>

static struct {
    const char *(*error_string)(nvrtcResult);
    nvrtcResult (*version)(int *, int *);
    nvrtcResult (*create)(nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *);
    nvrtcResult (*destroy)(nvrtcProgram *);
    nvrtcResult (*compile)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*ptx_size)(nvrtcProgram, size_t *);
    nvrtcResult (*ptx)(nvrtcProgram, char *);
    nvrtcResult (*cubin_size)(nvrtcProgram, size_t *);
    nvrtcResult (*cubin)(nvrtcProgram, char *);
    nvrtcResult (*log_size)(nvrtcProgram, size_t *);
    nvrtcResult (*log)(nvrtcProgram, char *);
    nvrtcResult (*add_name)(nvrtcProgram, const char *);
    nvrtcResult (*lowered_name)(nvrtcProgram, const char *, const char **);
    bool ok;
    const char *why;
    char version_text[32];
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

#define LOOK_UP(field, name)                                     \
    do {                                                         \
        *(void **)&lib.field = dlsym(h, name);                   \
        if (!lib.field) {                                        \
            lib.why = "the NVRTC library lacks " name;           \
            return;                                              \
        }                                                        \
    } while (0)

static void lib_open(void)
{
    lib.why = "cannot open the CUDA Toolkit's NVRTC library (" KILN_NVRTC_LIB ")";
    void *h = dlopen(KILN_NVRTC_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    LOOK_UP(error_string, "nvrtcGetErrorString");
    LOOK_UP(version, "nvrtcVersion");
    LOOK_UP(create, "nvrtcCreateProgram");
    LOOK_UP(destroy, "nvrtcDestroyProgram");
    LOOK_UP(compile, "nvrtcCompileProgram");
    LOOK_UP(ptx_size, "nvrtcGetPTXSize");
    LOOK_UP(ptx, "nvrtcGetPTX");
    LOOK_UP(cubin_size, "nvrtcGetCUBINSize");
    LOOK_UP(cubin, "nvrtcGetCUBIN");
    LOOK_UP(log_size, "nvrtcGetProgramLogSize");
    LOOK_UP(log, "nvrtcGetProgramLog");
    LOOK_UP(add_name, "nvrtcAddNameExpression");
    LOOK_UP(lowered_name, "nvrtcGetLoweredName");
    int major = 0, minor = 0;
    lib.version(&major, &minor);
    snprintf(lib.version_text, sizeof lib.version_text, "NVRTC %d.%d", major, minor);
    lib.ok = true;
    lib.why = NULL;
}

bool nvrtc_available(const char **why)
{
    pthread_once(&lib_once, lib_open);
    if (why) *why = lib.why;
    return lib.ok;
}

const char *nvrtc_version(void) { return nvrtc_available(NULL) ? lib.version_text : ""; }

int nvrtc_compile(const char *source, const char *file_name, const char *arch, const char *const *options, int noptions,
                  const char *const *names, int nnames, NvrtcOutput *out)
{
    memset(out, 0, sizeof *out);
    const char *why;
    if (!nvrtc_available(&why)) {
        out->log = xstrdup(why);
        return -1;
    }
    StrBuf text;
    sb_init(&text);
    nvrtcProgram prog;
    nvrtcResult r = lib.create(&prog, source, file_name, 0, NULL, NULL);
    if (r != NVRTC_SUCCESS) {
        sb_printf(&text, "NVRTC cannot create a program: %s", lib.error_string(r));
        out->log = sb_take(&text);
        return -1;
    }
    for (int i = 0; i < nnames && r == NVRTC_SUCCESS; i++) r = lib.add_name(prog, names[i]);
    const bool cubin = !strncmp(arch, "sm_", 3);
    char **argv = xcalloc((size_t)noptions + 4, sizeof *argv);
    int argc = 0;
    StrBuf a;
    sb_init(&a);
    sb_printf(&a, "--gpu-architecture=%s", arch);
    argv[argc++] = sb_take(&a);
    argv[argc++] = xstrdup("-std=c++17");
    if (cubin) argv[argc++] = xstrdup("--ptxas-options=-v");
    for (int i = 0; i < noptions; i++) argv[argc++] = xstrdup(options[i]);
    if (r == NVRTC_SUCCESS) r = lib.compile(prog, argc, (const char *const *)argv);
    for (int i = 0; i < argc; i++) free(argv[i]);
    free(argv);
    size_t n = 0;
    if (lib.log_size(prog, &n) == NVRTC_SUCCESS && n > 1) {
        char *l = xmalloc(n);
        if (lib.log(prog, l) == NVRTC_SUCCESS) sb_putn(&text, l, strnlen(l, n));
        free(l);
    }
    int rc = 0;
    if (r != NVRTC_SUCCESS) {
        if (!text.len) sb_printf(&text, "%s", lib.error_string(r));
        rc = -1;
    } else {
        n = 0;
        r = cubin ? lib.cubin_size(prog, &n) : lib.ptx_size(prog, &n);
        out->image = xmalloc(n ? n : 1);
        out->size = n;
        if (r == NVRTC_SUCCESS) r = cubin ? lib.cubin(prog, out->image) : lib.ptx(prog, out->image);
        if (r == NVRTC_SUCCESS && cubin && lib.ptx_size(prog, &n) == NVRTC_SUCCESS && n) {
            out->ptx = xmalloc(n);
            out->ptx_size = n;
            if (lib.ptx(prog, out->ptx) != NVRTC_SUCCESS) {
                free(out->ptx);
                out->ptx = NULL;
                out->ptx_size = 0;
            }
        }
        if (r == NVRTC_SUCCESS && nnames) {
            out->lowered = xcalloc((size_t)nnames, sizeof *out->lowered);
            for (int i = 0; i < nnames && r == NVRTC_SUCCESS; i++) {
                const char *low = NULL;
                r = lib.lowered_name(prog, names[i], &low);
                out->lowered[out->nlowered++] = xstrdup(r == NVRTC_SUCCESS && low ? low : "");
            }
        }
        if (r != NVRTC_SUCCESS) {
            sb_printf(&text, "%sNVRTC: %s", text.len ? "\n" : "", lib.error_string(r));
            rc = -1;
        }
    }
    lib.destroy(&prog);
    out->log = text.len ? sb_take(&text) : NULL;
    sb_free(&text);
    return rc;
}

#else /* no CUDA Toolkit when Kiln was built */

bool nvrtc_available(const char **why)
{
    if (why) *why = "Kiln was built without a CUDA Toolkit (cmake finds one with find_package(CUDAToolkit)), so without NVRTC";
    return false;
}

const char *nvrtc_version(void) { return ""; }

int nvrtc_compile(const char *source, const char *file_name, const char *arch, const char *const *options, int noptions,
                  const char *const *names, int nnames, NvrtcOutput *out)
{
    (void)source, (void)file_name, (void)arch, (void)options, (void)noptions, (void)names, (void)nnames;
    memset(out, 0, sizeof *out);
    const char *why;
    nvrtc_available(&why);
    out->log = xstrdup(why);
    return -1;
}

#endif

void nvrtc_output_free(NvrtcOutput *o)
{
    free(o->image);
    free(o->ptx);
    free(o->log);
    for (int i = 0; i < o->nlowered; i++) free(o->lowered[i]);
    free(o->lowered);
    memset(o, 0, sizeof *o);
}

/* ---- ptxas's report ---- */

/* A builtin type's one-letter code in a mangled name, as C spells it (NULL: another). */
static const char *builtin_type(char c)
{
    switch (c) {
    case 'f': return "float";
    case 'd': return "double";
    case 'i': return "int";
    case 'j': return "unsigned";
    case 'l': return "long";
    case 'm': return "unsigned long";
    case 'x': return "long long";
    case 'y': return "unsigned long long";
    case 's': return "short";
    case 't': return "unsigned short";
    case 'a': return "signed char";
    case 'h': return "unsigned char";
    case 'c': return "char";
    case 'b': return "bool";
    default: return NULL;
    }
}

/* The kernel's name as the source spells it: _Z13train_wpe_fwdllPKf... -> train_wpe_fwd,
 * _Z14kiln_sum_partsIfEv... -> kiln_sum_parts<float>; an extern "C" name as it is. */
static char *source_name(const char *mangled)
{
    if (strncmp(mangled, "_Z", 2) || !isdigit((unsigned char)mangled[2])) return xstrdup(mangled);
    char *end;
    long n = strtol(mangled + 2, &end, 10);
    if (n <= 0 || (long)strlen(end) < n) return xstrdup(mangled);
    StrBuf b;
    sb_init(&b);
    sb_putn(&b, end, (size_t)n);
    const char *p = end + n;
    if (*p == 'I') { /* template arguments: builtin types spelled out, anything else as "..." */
        sb_putc(&b, '<');
        for (p++; *p && *p != 'E'; p++) {
            const char *t = builtin_type(*p);
            if (b.data[b.len - 1] != '<') sb_puts(&b, ", ");
            if (!t) {
                sb_puts(&b, "...");
                break;
            }
            sb_puts(&b, t);
        }
        sb_putc(&b, '>');
    }
    return sb_take(&b);
}

/* The number before `what` in line, or -1. */
static long number_before(const char *line, size_t len, const char *what)
{
    const size_t wl = strlen(what);
    for (const char *p = line; p + wl <= line + len; p++) {
        if (memcmp(p, what, wl)) continue;
        const char *q = p;
        while (q > line && q[-1] == ' ') q--;
        const char *d = q;
        while (d > line && isdigit((unsigned char)d[-1])) d--;
        if (d < q) return strtol(d, NULL, 10);
    }
    return -1;
}

int nvrtc_report(const char *log, NvrtcKernelReport **v)
{
    *v = NULL;
    int n = 0;
    NvrtcKernelReport *cur = NULL;
    for (const char *line = log; line && *line;) {
        size_t len = strcspn(line, "\n");
        static const char entry[] = "Compiling entry function '";
        const char *e = strstr(line, entry);
        if (e && e < line + len) {
            const char *name = e + sizeof entry - 1, *q = memchr(name, '\'', (size_t)(line + len - name));
            if (q) {
                *v = xrealloc(*v, (size_t)(n + 1) * sizeof **v);
                cur = &(*v)[n++];
                memset(cur, 0, sizeof *cur);
                char *mangled = xstrndup(name, (size_t)(q - name));
                cur->name = source_name(mangled);
                free(mangled);
                const char *a = strstr(q, "for '");
                if (a && a < line + len) {
                    a += 5;
                    size_t al = strcspn(a, "'\n");
                    snprintf(cur->arch, sizeof cur->arch, "%.*s", (int)al, a);
                }
            }
        } else if (cur) {
            long x;
            if ((x = number_before(line, len, "bytes stack frame")) >= 0) cur->stack = x;
            if ((x = number_before(line, len, "bytes spill stores")) >= 0) cur->spill_stores = x;
            if ((x = number_before(line, len, "bytes spill loads")) >= 0) cur->spill_loads = x;
            if ((x = number_before(line, len, "registers")) >= 0) cur->registers = (int)x;
            if ((x = number_before(line, len, "barriers")) >= 0) cur->barriers = (int)x;
            if ((x = number_before(line, len, "bytes smem")) >= 0) cur->shared = x;
        }
        line += len;
        if (*line) line++;
    }
    return n;
}

void nvrtc_report_free(NvrtcKernelReport *v, int n)
{
    for (int i = 0; i < n; i++) free(v[i].name);
    free(v);
}
