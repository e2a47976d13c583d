/* modules.cpp — kiln_cuda_embedded.h: a CUDA program's kernels, loaded for the GPU that is
 * there and found by the names the host launches them by.
 *
 * The choice, made once when the device opens:
 *   1. the program's CUBINs for the device's compute capability (sm_80, sm_90);
 *   2. otherwise, or with KILN_CUDA_JIT=1, each file's embedded device source compiled by
 *      NVRTC (opened with dlopen: the driver does not ship it, the toolkit does) for exactly
 *      that architecture, with the options the build used, and cached by the hash of the
 *      source, options, architecture and NVRTC version, so that only the first run on a
 *      new GPU pays for it;
 *   3. without NVRTC, the compute_80 PTX, which the driver compiles itself.
 * Every path but the first prints a line saying which it took. The same code runs under
 * the emulator (cuda-emu: KILN_CUDA_EMU_ARCH plays another GPU), whose images are its own
 * tables and which runs a CUBIN's kernels by their names.
 *
 * Compiled with the program's host code: against the toolkit's cuda.h for a GPU program
 * (KILN_CUDA_DRIVER), against the emulator's headers for cuda-emu (KILN_CUDA_EMU). */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln_cuda.h"
#include "kiln_cuda_embedded.h"

/* A program's tables: model.cu's (or, under the emulator, all its files'), and in a GPU
 * program the runtime's own, compiled when Kiln was built. A program with none (a test's
 * own .cu under the emulator) finds its kernels among those the emulator has registered. */
extern "C" const kiln_cuda_embedded kiln_cuda_embedded_code __attribute__((weak));
extern "C" const kiln_cuda_embedded kiln_cuda_device_code __attribute__((weak));
extern "C" const kiln_cuda_embedded kiln_cuda_dist_code __attribute__((weak));

namespace {

/* The driver API's calls: a GPU program takes them from the driver through cudart
 * (cudaGetDriverEntryPointByVersion), so that it does not link libcuda and starts, to say
 * there is no GPU, where there is no driver; the emulator's are its own. */
struct Driver {
    CUresult (*load)(CUmodule *, const void *);
    CUresult (*get_function)(CUfunction *, CUmodule, const char *);
    CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, void **, void **);
    CUresult (*error_name)(CUresult, const char **);
    CUresult (*error_string)(CUresult, const char **);
};
Driver cu;

bool driver_open(char *why, size_t cap)
{
#if defined(KILN_CUDA_EMU)
    (void)why, (void)cap;
    cu.load = cuModuleLoadData;
    cu.get_function = cuModuleGetFunction;
    cu.launch = cuLaunchKernel;
    cu.error_name = cuGetErrorName;
    cu.error_string = cuGetErrorString;
    return true;
#else
    const struct {
        const char *name;
        void **fn;
    } syms[] = {{"cuModuleLoadData", (void **)&cu.load},      {"cuModuleGetFunction", (void **)&cu.get_function},
                {"cuLaunchKernel", (void **)&cu.launch},      {"cuGetErrorName", (void **)&cu.error_name},
                {"cuGetErrorString", (void **)&cu.error_string}};
    for (const auto &s : syms) {
        cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
        if (cudaGetDriverEntryPointByVersion(s.name, s.fn, 12000, cudaEnableDefault, &q) != cudaSuccess || q != cudaDriverEntryPointSuccess || !*s.fn) {
            cudaGetLastError();
            snprintf(why, cap, "the CUDA driver has no %s (a driver for CUDA 12 or newer is needed)", s.name);
            return false;
        }
    }
    return true;
#endif
}

/* One table's modules. */
struct Table {
    const kiln_cuda_embedded *e;
    bool jit;            /* one module per file, names from `lowered` */
    CUmodule *modules;   /* by image (CUBIN, PTX), or by file (JIT) */
    int *image_of;       /* kernel -> its module's index (CUBIN, PTX) */
    char **lowered;      /* kernel -> its name in the JIT's module */
};

struct Loaded {
    bool done;
    const char *error; /* NULL, or `message` */
    const char *note;
    char message[1024];
    Table tables[3];
    int ntables;
};

Loaded loaded;
Table *table; /* the one being loaded */
pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* ---- NVRTC, opened at run time ---- */

typedef int (*nvrtc_create_t)(void **, const char *, const char *, int, const char *const *, const char *const *);
struct Nvrtc {
    bool ok;
    int (*version)(int *, int *);
    nvrtc_create_t create;
    int (*destroy)(void **);
    int (*compile)(void *, int, const char *const *);
    int (*cubin_size)(void *, size_t *);
    int (*cubin)(void *, char *);
    int (*log_size)(void *, size_t *);
    int (*log)(void *, char *);
    int (*add_name)(void *, const char *);
    int (*lowered_name)(void *, const char *, const char **);
    char version_text[32];
};

bool nvrtc_open(Nvrtc *n, char *why, size_t cap)
{
    static const char *const names[] = {
#ifdef KILN_NVRTC_LIB
        KILN_NVRTC_LIB,
#endif
        "libnvrtc.so", "libnvrtc.so.13", "libnvrtc.so.12"};
    void *h = nullptr;
    for (size_t i = 0; i < sizeof names / sizeof *names && !h; i++) h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, cap, "NVRTC (libnvrtc.so, the CUDA Toolkit's) cannot be opened");
        return false;
    }
#define KILN_NVRTC_SYM(field, name)                                                         \
    if (!(*(void **)&n->field = dlsym(h, name))) {                                          \
        snprintf(why, cap, "the NVRTC library found lacks %s", name);                       \
        return false;                                                                       \
    }
    KILN_NVRTC_SYM(version, "nvrtcVersion")
    KILN_NVRTC_SYM(create, "nvrtcCreateProgram")
    KILN_NVRTC_SYM(destroy, "nvrtcDestroyProgram")
    KILN_NVRTC_SYM(compile, "nvrtcCompileProgram")
    KILN_NVRTC_SYM(cubin_size, "nvrtcGetCUBINSize")
    KILN_NVRTC_SYM(cubin, "nvrtcGetCUBIN")
    KILN_NVRTC_SYM(log_size, "nvrtcGetProgramLogSize")
    KILN_NVRTC_SYM(log, "nvrtcGetProgramLog")
    KILN_NVRTC_SYM(add_name, "nvrtcAddNameExpression")
    KILN_NVRTC_SYM(lowered_name, "nvrtcGetLoweredName")
#undef KILN_NVRTC_SYM
    int major = 0, minor = 0;
    n->version(&major, &minor);
    snprintf(n->version_text, sizeof n->version_text, "NVRTC %d.%d", major, minor);
    n->ok = true;
    return true;
}

/* ---- the JIT's cache: "KJITCUB1", the kernels' lowered names each ending in NUL, then
 * the CUBIN ---- */

uint64_t fnv1a(uint64_t h, const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

/* The cache directory (made if missing), or false when there is none ($HOME unset, or
 * KILN_CACHE_MAX_BYTES=0). */
bool cache_dir(char *dir, size_t cap)
{
    const char *max = getenv("KILN_CACHE_MAX_BYTES");
    if (max && !strcmp(max, "0")) return false;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char base[4096];
    if (xdg && *xdg == '/') snprintf(base, sizeof base, "%s", xdg);
    else if (home && *home) snprintf(base, sizeof base, "%s/.cache", home);
    else return false;
    const char *parts[] = {"", "/kiln", "/kiln/cuda-jit"};
    for (const char *p : parts) {
        if ((size_t)snprintf(dir, cap, "%s%s", base, p) >= cap) return false;
        if (mkdir(dir, 0777) != 0 && errno != EEXIST) return false;
    }
    return true;
}

char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return nullptr;
    char *buf = nullptr;
    if (fseek(f, 0, SEEK_END) == 0) {
        long n = ftell(f);
        if (n > 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = (char *)malloc((size_t)n)) && fread(buf, 1, (size_t)n, f) != (size_t)n) {
            free(buf);
            buf = nullptr;
        }
        *len = n > 0 ? (size_t)n : 0;
    }
    fclose(f);
    return buf;
}

/* The entry's CUBIN, its names into lowered[] (malloc'd): whether it was whole. */
bool cache_read(const char *path, int nnames, char **lowered, char **cubin, size_t *cubin_len)
{
    size_t len = 0;
    char *bytes = read_file(path, &len);
    if (!bytes || len < 8 || memcmp(bytes, "KJITCUB1", 8)) {
        free(bytes);
        return false;
    }
    size_t at = 8;
    int k = 0;
    for (; k < nnames; k++) {
        const char *z = (const char *)memchr(bytes + at, 0, len - at);
        if (!z) break;
        lowered[k] = strdup(bytes + at);
        at = (size_t)(z - bytes) + 1;
    }
    if (k < nnames || len - at < 4 || memcmp(bytes + at, "\x7f" "ELF", 4)) {
        for (int i = 0; i < k; i++) free(lowered[i]), lowered[i] = nullptr;
        free(bytes);
        return false;
    }
    *cubin_len = len - at;
    *cubin = (char *)malloc(*cubin_len);
    memcpy(*cubin, bytes + at, *cubin_len);
    free(bytes);
    return true;
}

void cache_write(const char *path, int nnames, char *const *lowered, const char *cubin, size_t cubin_len)
{
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.%ld.tmp", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return;
    bool ok = fwrite("KJITCUB1", 1, 8, f) == 8;
    for (int i = 0; i < nnames && ok; i++) ok = fwrite(lowered[i], 1, strlen(lowered[i]) + 1, f) == strlen(lowered[i]) + 1;
    ok = ok && fwrite(cubin, 1, cubin_len, f) == cubin_len;
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp, path) != 0) unlink(tmp);
}

/* The options string's words, in place (at most cap). */
int split_words(char *s, const char **words, int cap)
{
    int n = 0;
    for (char *p = strtok(s, " "); p && n < cap; p = strtok(nullptr, " ")) words[n++] = p;
    return n;
}

/* One file's kernels compiled by NVRTC for sm (or read from the cache); its module loaded
 * and the names of its kernels (those of `unit`) set in L->lowered. Returns false with the
 * reason in L->message. `from_cache` says which. */
bool jit_unit(Nvrtc *nv, const kiln_cuda_embedded *e, int unit, int sm, CUmodule *module, bool *from_cache)
{
    const kiln_cuda_unit *u = &e->units[unit];
    int nnames = 0;
    for (int k = 0; k < e->nkernels; k++) nnames += e->kernels[k].unit == unit;
    char **low = (char **)calloc((size_t)nnames + 1, sizeof *low);
    char arch[32];
    snprintf(arch, sizeof arch, "--gpu-architecture=sm_%d", sm);
    uint64_t h = 0xcbf29ce484222325ull;
    h = fnv1a(h, nv->version_text, strlen(nv->version_text) + 1);
    h = fnv1a(h, arch, strlen(arch) + 1);
    h = fnv1a(h, u->options, strlen(u->options) + 1);
    for (int k = 0; k < e->nkernels; k++)
        if (e->kernels[k].unit == unit) h = fnv1a(h, e->kernels[k].name, strlen(e->kernels[k].name) + 1);
    h = fnv1a(h, u->source, strlen(u->source));
    char dir[4096], path[4200];
    const bool cached = cache_dir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/%016llx-sm_%d.cubin", dir, (unsigned long long)h, sm);
    char *cubin = nullptr;
    size_t cubin_len = 0;
    *from_cache = cached && cache_read(path, nnames, low, &cubin, &cubin_len);
    bool ok = true;
    if (!*from_cache) {
        void *prog = nullptr;
        if (nv->create(&prog, u->source, u->file, 0, nullptr, nullptr) != 0) {
            snprintf(loaded.message, sizeof loaded.message, "NVRTC cannot create a program of %s's kernels", u->file);
            free(low);
            return false;
        }
        for (int k = 0; k < e->nkernels; k++)
            if (e->kernels[k].unit == unit) nv->add_name(prog, e->kernels[k].name);
        char *opts = strdup(u->options);
        const char *words[34];
        words[0] = arch;
        words[1] = "-std=c++17";
        int nw = 2 + split_words(opts, words + 2, 32);
        int r = nv->compile(prog, nw, words);
        free(opts);
        if (r != 0) {
            size_t n = 0;
            char *log = nullptr;
            if (nv->log_size(prog, &n) == 0 && n > 1 && (log = (char *)malloc(n))) nv->log(prog, log);
            snprintf(loaded.message, sizeof loaded.message, "%s failed on %s's kernels for sm_%d: %.700s", nv->version_text, u->file, sm,
                     log ? log : "");
            free(log);
            ok = false;
        } else {
            ok = nv->cubin_size(prog, &cubin_len) == 0 && (cubin = (char *)malloc(cubin_len ? cubin_len : 1)) && nv->cubin(prog, cubin) == 0;
            int j = 0;
            for (int k = 0; k < e->nkernels && ok; k++) {
                if (e->kernels[k].unit != unit) continue;
                const char *l = nullptr;
                ok = nv->lowered_name(prog, e->kernels[k].name, &l) == 0 && l;
                if (ok) low[j++] = strdup(l);
            }
            if (!ok) snprintf(loaded.message, sizeof loaded.message, "%s compiled %s's kernels for sm_%d but gave no CUBIN or names", nv->version_text, u->file, sm);
            else if (cached) cache_write(path, nnames, low, cubin, cubin_len);
        }
        nv->destroy(&prog);
    }
    if (ok) {
        CUresult r = cu.load(module, cubin);
        if (r != CUDA_SUCCESS) {
            const char *text = "";
            cu.error_string(r, &text);
            snprintf(loaded.message, sizeof loaded.message, "the CUBIN NVRTC made of %s's kernels for sm_%d does not load: %s", u->file, sm, text ? text : "");
            ok = false;
        }
    }
    free(cubin);
    for (int k = 0, j = 0; k < e->nkernels; k++)
        if (e->kernels[k].unit == unit) table->lowered[k] = ok ? low[j] : nullptr, j++;
    if (!ok)
        for (int j = 0; j < nnames; j++) free(low[j]);
    free(low);
    return ok;
}

/* The images of sm (80, 90, or -80 for PTX) loaded: false when the program has none, or
 * with the reason in L->message when one fails to load. */
bool load_images(const kiln_cuda_embedded *e, int sm, bool *failed)
{
    int n = 0;
    for (int i = 0; i < e->nimages; i++) n += e->images[i].sm == sm;
    if (!n) return false;
    table->modules = (CUmodule *)calloc((size_t)e->nimages, sizeof *table->modules);
    for (int i = 0; i < e->nimages; i++) {
        const kiln_cuda_image *im = &e->images[i];
        if (im->sm != sm) continue;
        CUresult r = cu.load(&table->modules[i], im->begin);
        if (r != CUDA_SUCCESS) {
            const char *text = "";
            cu.error_string(r, &text);
            snprintf(loaded.message, sizeof loaded.message, "%s's kernels (piece %d, %s_%d) do not load: %s", e->units[im->unit].file, im->piece,
                     sm < 0 ? "compute" : "sm", sm < 0 ? -sm : sm, text ? text : "");
            *failed = true;
            return true;
        }
    }
    table->image_of = (int *)calloc((size_t)e->nkernels + 1, sizeof *table->image_of);
    for (int k = 0; k < e->nkernels; k++) {
        table->image_of[k] = -1;
        for (int i = 0; i < e->nimages; i++)
            if (e->images[i].sm == sm && (e->images[i].unit < 0 || e->images[i].unit == e->kernels[k].unit) &&
                (e->images[i].piece < 0 || e->images[i].piece == e->kernels[k].piece))
                table->image_of[k] = i;
    }
    return true;
}

/* Whether the table has images for sm (or the emulator's, for any). */
bool has_images(const kiln_cuda_embedded *e, int sm)
{
    for (int i = 0; i < e->nimages; i++)
        if (e->images[i].sm == sm || e->images[i].sm == 0) return true;
    return false;
}

/* How one table's kernels came (1 CUBIN, 2 NVRTC, 3 NVRTC from the cache, 4 PTX), or 0
 * with the reason in loaded.message. */
int load_table(const kiln_cuda_embedded *e, int sm, bool forced, Nvrtc *nv, bool nvrtc_ok)
{
    bool failed = false;
    /* 1. the CUBINs for this GPU (the emulator's tables, for the emulator) */
    if (!forced && (load_images(e, sm, &failed) || load_images(e, 0, &failed))) return failed ? 0 : 1;
    /* 2. NVRTC, for exactly this GPU */
    if (e->nunits && nvrtc_ok) {
        table->jit = true;
        table->modules = (CUmodule *)calloc((size_t)e->nunits, sizeof *table->modules);
        table->lowered = (char **)calloc((size_t)e->nkernels + 1, sizeof *table->lowered);
        int from_cache = 0;
        for (int u = 0; u < e->nunits; u++) {
            bool c = false;
            if (!jit_unit(nv, e, u, sm, &table->modules[u], &c)) return 0;
            from_cache += c;
        }
        return from_cache == e->nunits ? 3 : 2;
    }
    /* 3. the PTX, compiled by the driver */
    if (sm >= 80 && load_images(e, -80, &failed)) return failed ? 0 : 4;
    return -1;
}

void load(void)
{
    const kiln_cuda_embedded *found[3] = {&kiln_cuda_embedded_code, &kiln_cuda_device_code, &kiln_cuda_dist_code};
    for (const kiln_cuda_embedded *e : found)
        if (e) loaded.tables[loaded.ntables++].e = e;
#if defined(KILN_CUDA_EMU)
    static kiln_cuda_image all = {-1, -1, 0, (const unsigned char *)KEMU_ALL_MODULE_MAGIC, nullptr};
    static const kiln_cuda_embedded none = {0, nullptr, 1, &all, 0, nullptr, "the emulator"};
    if (!loaded.ntables) loaded.tables[loaded.ntables++].e = &none;
#else
    if (!loaded.ntables) {
        loaded.error = "this program carries no kernels (kiln_cuda_embedded_code)";
        return;
    }
#endif
    int dev = 0, major = 0, minor = 0;
    cudaError_t st = cudaFree(nullptr); /* the primary context, current for the driver API */
    if (st == cudaSuccess) st = cudaGetDevice(&dev);
    if (st == cudaSuccess) st = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    if (st == cudaSuccess) st = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    if (st != cudaSuccess) {
        snprintf(loaded.message, sizeof loaded.message, "the GPU's compute capability cannot be read: %s", cudaGetErrorString(st));
        loaded.error = loaded.message;
        return;
    }
    if (!driver_open(loaded.message, sizeof loaded.message)) {
        loaded.error = loaded.message;
        return;
    }
    const int sm = major * 10 + minor;
    const char *force = getenv("KILN_CUDA_JIT");
    const bool forced = force && *force && strcmp(force, "0");
    Nvrtc nv;
    memset(&nv, 0, sizeof nv);
    char why[256] = "";
    bool nvrtc_tried = false, nvrtc_ok = false;
    int how[3] = {0, 0, 0}, worst = 1;
    for (int t = 0; t < loaded.ntables; t++) {
        table = &loaded.tables[t];
        const bool want_nvrtc = forced || !has_images(table->e, sm);
        if (want_nvrtc && !nvrtc_tried) nvrtc_tried = true, nvrtc_ok = nvrtc_open(&nv, why, sizeof why);
        how[t] = load_table(table->e, sm, forced, &nv, nvrtc_ok);
        if (how[t] == 0) {
            loaded.error = loaded.message;
            return;
        }
        if (how[t] < 0) {
            snprintf(loaded.message, sizeof loaded.message, "this program has kernels for sm_80 and sm_90 (and PTX for compute_80), none for this GPU (sm_%d), and %s",
                     sm, why[0] ? why : "NVRTC cannot be used");
            loaded.error = loaded.message;
            return;
        }
        if (how[t] > worst) worst = how[t];
    }
    if (worst == 1) return;
    char dir[4096];
    const bool cached = cache_dir(dir, sizeof dir);
    bool all_cached = true;
    for (int t = 0; t < loaded.ntables; t++) all_cached &= how[t] != 2;
    if (worst == 4)
        snprintf(loaded.message, sizeof loaded.message, "the kernels compiled for this GPU (sm_%d) by the driver from the program's compute_80 PTX%s%s%s", sm,
                 forced ? " (KILN_CUDA_JIT=1, but " : " (", why[0] ? why : "no NVRTC", ")");
    else
        snprintf(loaded.message, sizeof loaded.message, "the kernels %s for this GPU (sm_%d) by %s%s%s%.400s%s", all_cached ? "compiled earlier" : "compiled", sm,
                 nv.version_text, forced ? " (KILN_CUDA_JIT=1)" : ", the program carrying no CUBIN for it",
                 cached ? (all_cached ? "; read from " : "; cached in ") : "", cached ? dir : "", cached ? "" : "; not cached (no cache directory)");
    loaded.note = loaded.message;
}

} // namespace

extern "C" const char *kiln_cuda_modules_load(const char **note)
{
    pthread_mutex_lock(&lock);
    if (!loaded.done) {
        load();
        loaded.done = true;
    }
    pthread_mutex_unlock(&lock);
    if (note) *note = loaded.error ? nullptr : loaded.note;
    return loaded.error;
}

extern "C" int kiln_cuda_function(void **function, const char *name)
{
    *function = nullptr;
    if (kiln_cuda_modules_load(nullptr)) return CUDA_ERROR_INVALID_IMAGE;
    CUfunction f = nullptr;
    CUresult r = CUDA_ERROR_NOT_FOUND;
    for (int t = 0; t < loaded.ntables && r == CUDA_ERROR_NOT_FOUND && !f; t++) {
        const Table *tb = &loaded.tables[t];
        const kiln_cuda_embedded *e = tb->e;
        if (!e->nkernels && !tb->jit) { /* the emulator's registered kernels */
            r = cu.get_function(&f, tb->modules[0], name);
            continue;
        }
        for (int k = 0; k < e->nkernels; k++) {
            if (strcmp(e->kernels[k].name, name)) continue;
            if (tb->jit) r = cu.get_function(&f, tb->modules[e->kernels[k].unit], tb->lowered[k]);
            else if (tb->image_of[k] >= 0)
                r = cu.get_function(&f, tb->modules[tb->image_of[k]], e->kernels[k].lowered ? e->kernels[k].lowered : name);
            break;
        }
    }
    *function = (void *)f;
    return r;
}

extern "C" int kiln_cuda_launch(void *function, const unsigned grid[3], const unsigned block[3], unsigned shared_bytes, void *stream, void **extra)
{
    if (!cu.launch) return CUDA_ERROR_NOT_INITIALIZED;
    return cu.launch((CUfunction)function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes, (CUstream)stream, nullptr, extra);
}

extern "C" void kiln_cuda_error_text(int code, const char **name, const char **text)
{
    *name = *text = "";
    if (cu.error_name) cu.error_name((CUresult)code, name);
    if (cu.error_string) cu.error_string((CUresult)code, text);
    if (!*name) *name = "";
    if (!*text) *text = "";
}
