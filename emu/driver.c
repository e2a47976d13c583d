/* driver.c — kemu_driver.h: modules, their functions and launches through the driver API.
 * A module is a copy of the image's table (the image may go away after the load), on a
 * list of the loaded ones that handles are checked against; a function is a pointer to one
 * of its module's kernels. The kernels a program launches by name are registered at its
 * start; the module of them all (KEMU_ALL_MODULE_MAGIC) and a CUBIN's module are made from
 * that registry. */
#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <dlfcn.h>
#include <elf.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kemu_driver.h"
#include "kemu_internal.h"

struct CUmod_st {
    int count;
    kemu_kernel *kernels;
    int owns_names; /* a CUBIN's: the names are copies */
    struct CUmod_st *next; /* the loaded modules, a list: a handle is checked against it */
};

static struct CUmod_st *loaded;
static pthread_mutex_t loaded_lock = PTHREAD_MUTEX_INITIALIZER;

/* The runtime's last error back to what it was before a driver call reported one (kemu_fail
 * records its message that way); a sticky error stays whatever it was. */
static void restore_last_error(cudaError_t pending)
{
    cudaGetLastError();
    if (pending != cudaSuccess) kemu_set_error(pending);
}

/* A failed driver call: the message recorded and printed as the emulator's others are
 * (kemu_last_error_message), but not left as the runtime's last error (cudaGetLastError),
 * which the driver API does not set; a sticky error stays. Returns code. */
static CUresult fail(CUresult code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static CUresult fail(CUresult code, const char *fmt, ...)
{
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    const cudaError_t pending = cudaPeekAtLastError();
    kemu_fail(cudaErrorInvalidValue, 0, "%s", text);
    restore_last_error(pending);
    return code;
}

/* The driver's code for a runtime error the emulator reported (the values that differ). */
static CUresult driver_code(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return CUDA_SUCCESS;
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration: return CUDA_ERROR_INVALID_VALUE;
    case cudaErrorMemoryAllocation: return CUDA_ERROR_OUT_OF_MEMORY;
    case cudaErrorInvalidResourceHandle: return CUDA_ERROR_INVALID_HANDLE;
    case cudaErrorIllegalAddress: return CUDA_ERROR_ILLEGAL_ADDRESS;
    case cudaErrorLaunchOutOfResources: return CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES;
    case cudaErrorLaunchFailure: return CUDA_ERROR_LAUNCH_FAILED;
    case cudaErrorNotSupported: return CUDA_ERROR_NOT_SUPPORTED;
    default: return CUDA_ERROR_UNKNOWN;
    }
}

static struct {
    kemu_kernel *kernels;
    int count;
} registry;

int kemu_register_kernels(const kemu_kernel *kernels, int count)
{
    pthread_mutex_lock(&loaded_lock);
    kemu_kernel *grown = realloc(registry.kernels, (size_t)(registry.count + count + 1) * sizeof *grown);
    if (grown) {
        memcpy(grown + registry.count, kernels, (size_t)count * sizeof *kernels);
        registry.kernels = grown;
        registry.count += count;
    }
    pthread_mutex_unlock(&loaded_lock);
    return count;
}

/* a equals b but for white space */
static int same_name(const char *a, const char *b)
{
    for (;;) {
        while (*a == ' ') a++;
        while (*b == ' ') b++;
        if (*a != *b) return 0;
        if (!*a) return 1;
        a++, b++;
    }
}

/* The registered kernel a mangled name demangles to: "void sum<float>(float const*, ...)"
 * names "sum<float>". */
static const kemu_kernel *registered_by_mangled(const char *mangled)
{
    typedef char *(*demangle_fn)(const char *, char *, size_t *, int *);
    demangle_fn demangle = (demangle_fn)dlsym(RTLD_DEFAULT, "__cxa_demangle"); /* the C++ runtime's, which programs that launch by name link */
    int status = -1;
    char *d = demangle ? demangle(mangled, NULL, NULL, &status) : NULL;
    if (!d || status != 0) {
        free(d);
        return NULL;
    }
    int depth = 0;
    char *open = NULL, *start = d;
    for (char *p = d; *p && !open; p++) {
        if (*p == '<') depth++;
        else if (*p == '>') depth--;
        else if (*p == '(' && depth == 0) open = p;
        else if (*p == ' ' && depth == 0) start = p + 1; /* after a template's return type */
    }
    const kemu_kernel *k = NULL;
    if (open) {
        *open = 0;
        for (int i = 0; i < registry.count && !k; i++)
            if (same_name(registry.kernels[i].name, start)) k = &registry.kernels[i];
    }
    free(d);
    return k;
}

/* A CUBIN's function symbols that are registered kernels, as a module's table (under
 * loaded_lock). 0, or a message in why. */
static int cubin_kernels(const unsigned char *im, kemu_kernel **out, int *count, char *why, size_t cap)
{
    const Elf64_Ehdr *eh = (const Elf64_Ehdr *)im;
    if (eh->e_ident[EI_CLASS] != ELFCLASS64 || eh->e_machine != 190 /* EM_CUDA */ || eh->e_shentsize != sizeof(Elf64_Shdr) || eh->e_shnum == 0 ||
        eh->e_shoff == 0 || eh->e_shnum > 65000) {
        snprintf(why, cap, "an ELF image that is not a 64-bit CUBIN");
        return -1;
    }
    const Elf64_Shdr *sh = (const Elf64_Shdr *)(im + eh->e_shoff);
    *out = calloc((size_t)registry.count + 1, sizeof **out);
    *count = 0;
    for (int s = 0; s < eh->e_shnum; s++) {
        if (sh[s].sh_type != SHT_SYMTAB || sh[s].sh_entsize != sizeof(Elf64_Sym) || sh[s].sh_link >= eh->e_shnum) continue;
        const Elf64_Sym *sym = (const Elf64_Sym *)(im + sh[s].sh_offset);
        const char *names = (const char *)(im + sh[sh[s].sh_link].sh_offset);
        const size_t names_len = sh[sh[s].sh_link].sh_size;
        for (size_t i = 0; i < sh[s].sh_size / sizeof *sym; i++) {
            if (ELF64_ST_TYPE(sym[i].st_info) != STT_FUNC || sym[i].st_name >= names_len) continue;
            const char *name = names + sym[i].st_name;
            if (!memchr(name, 0, names_len - sym[i].st_name)) continue;
            const kemu_kernel *k = registered_by_mangled(name);
            if (!k || !*out) continue;
            int dup = 0;
            for (int j = 0; j < *count; j++) dup |= !strcmp((*out)[j].name, name);
            if (dup || *count >= registry.count) continue;
            (*out)[*count] = *k;
            (*out)[*count].name = strdup(name);
            ++*count;
        }
    }
    return 0;
}

CUresult cuModuleLoadData(CUmodule *module, const void *image)
{
    if (!module) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleLoadData: NULL module");
    *module = NULL;
    if (image && (!memcmp(image, KEMU_ALL_MODULE_MAGIC, 8) || !memcmp(image, ELFMAG, SELFMAG))) {
        struct CUmod_st *m = calloc(1, sizeof *m);
        char why[128] = "";
        int rc = -1;
        pthread_mutex_lock(&loaded_lock);
        if (!m) {
        } else if (image && !memcmp(image, ELFMAG, SELFMAG)) {
            rc = cubin_kernels(image, &m->kernels, &m->count, why, sizeof why);
            m->owns_names = 1;
        } else if ((m->kernels = calloc((size_t)registry.count + 1, sizeof *m->kernels))) {
            memcpy(m->kernels, registry.kernels, (size_t)registry.count * sizeof *m->kernels);
            m->count = registry.count;
            rc = 0;
        }
        if (!rc) {
            m->next = loaded;
            loaded = m;
        }
        pthread_mutex_unlock(&loaded_lock);
        if (rc) {
            if (m) free(m->kernels);
            free(m);
            return fail(why[0] ? CUDA_ERROR_INVALID_IMAGE : CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadData: %s", why[0] ? why : "out of host memory");
        }
        *module = m;
        return CUDA_SUCCESS;
    }
    const kemu_module_image *im = image;
    if (!im || memcmp(im->magic, KEMU_MODULE_MAGIC, 8) || im->count < 0 || (im->count && !im->kernels)) {
        return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: the image is neither an emulator module (the table of "
                                             "the kernels compiled into a cuda-emu program) nor a CUBIN");
    }
    for (int i = 0; i < im->count; i++) {
        const kemu_kernel *k = &im->kernels[i];
        if (!k->name || !k->kernel || !k->launch || k->nparams < 0 || (k->nparams && (!k->sizes || !k->offsets))) {
            return fail(CUDA_ERROR_INVALID_IMAGE, "cuModuleLoadData: entry %d of the module is incomplete", i);
        }
    }
    struct CUmod_st *m = calloc(1, sizeof *m);
    kemu_kernel *copy = calloc((size_t)im->count + 1, sizeof *copy);
    if (!m || !copy) {
        free(m);
        free(copy);
        return fail(CUDA_ERROR_OUT_OF_MEMORY, "cuModuleLoadData: out of host memory");
    }
    memcpy(copy, im->kernels, (size_t)im->count * sizeof *copy);
    m->count = im->count;
    m->kernels = copy;
    pthread_mutex_lock(&loaded_lock);
    m->next = loaded;
    loaded = m;
    pthread_mutex_unlock(&loaded_lock);
    *module = m;
    return CUDA_SUCCESS;
}

/* Whether m is a loaded module (compared, never read, so that any handle can be asked). */
static int module_valid(CUmodule m)
{
    pthread_mutex_lock(&loaded_lock);
    const struct CUmod_st *p = loaded;
    while (p && p != m) p = p->next;
    pthread_mutex_unlock(&loaded_lock);
    return p != NULL;
}

CUresult cuModuleUnload(CUmodule module)
{
    pthread_mutex_lock(&loaded_lock);
    struct CUmod_st **p = &loaded;
    while (*p && *p != module) p = &(*p)->next;
    const int found = *p != NULL;
    if (found) *p = module->next;
    pthread_mutex_unlock(&loaded_lock);
    if (!found) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleUnload: not a loaded module (unloaded already?)");
    if (module->owns_names)
        for (int i = 0; i < module->count; i++) free((char *)module->kernels[i].name);
    free(module->kernels);
    free(module);
    return CUDA_SUCCESS;
}

CUresult cuModuleGetFunction(CUfunction *function, CUmodule module, const char *name)
{
    if (!function || !name) return fail(CUDA_ERROR_INVALID_VALUE, "cuModuleGetFunction: NULL %s", function ? "name" : "function");
    *function = NULL;
    if (!module_valid(module)) return fail(CUDA_ERROR_INVALID_HANDLE, "cuModuleGetFunction('%s'): not a loaded module", name);
    for (int i = 0; i < module->count; i++)
        if (!strcmp(module->kernels[i].name, name)) {
            *function = (CUfunction)(void *)&module->kernels[i];
            return CUDA_SUCCESS;
        }
    return fail(CUDA_ERROR_NOT_FOUND, "cuModuleGetFunction: no kernel '%s' in the module (it has %d)", name, module->count);
}

/* The kernel a function handle points to: one of a live module's. */
static const kemu_kernel *function_kernel(CUfunction f)
{
    return (const kemu_kernel *)(void *)f;
}

CUresult cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ, unsigned int blockDimX,
                        unsigned int blockDimY, unsigned int blockDimZ, unsigned int sharedMemBytes, CUstream hStream, void **kernelParams,
                        void **extra)
{
    const kemu_kernel *k = function_kernel(f);
    if (!k) return fail(CUDA_ERROR_INVALID_HANDLE, "cuLaunchKernel: NULL function");
    if (!kernelParams == !extra)
        return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): give the arguments either as kernelParams or in extra, %s",
                                     k->name, kernelParams ? "not both" : "one of them");
    void *local[64];
    void **params = kernelParams;
    if (extra) { /* one buffer: CU_LAUNCH_PARAM_BUFFER_POINTER, p, CU_LAUNCH_PARAM_BUFFER_SIZE, &n, CU_LAUNCH_PARAM_END */
        char *buf = NULL;
        size_t *size = NULL;
        for (int i = 0; i < 16 && extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
            if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = extra[i + 1];
            else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = extra[i + 1];
            else return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): an unknown key in extra", k->name);
        }
        if (!buf || !size)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): extra without the buffer's %s", k->name, buf ? "size" : "pointer");
        if (*size != k->bytes)
            return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): the parameter buffer has %zu bytes, the kernel's %d parameters take %zu",
                        k->name, *size, k->nparams, k->bytes);
        if (k->nparams > (int)(sizeof local / sizeof *local))
            return fail(CUDA_ERROR_NOT_SUPPORTED, "cuLaunchKernel('%s'): over 64 parameters", k->name);
        for (int i = 0; i < k->nparams; i++) local[i] = buf + k->offsets[i];
        params = local;
    } else {
        for (int i = 0; i < k->nparams; i++)
            if (!params[i])
                return fail(CUDA_ERROR_INVALID_VALUE, "cuLaunchKernel('%s'): kernelParams[%d] is NULL (the kernel has %d parameters)",
                                             k->name, i, k->nparams);
    }
    dim3 grid = {gridDimX, gridDimY, gridDimZ}, block = {blockDimX, blockDimY, blockDimZ};
    const cudaError_t pending = cudaPeekAtLastError();
    const cudaError_t e = k->launch(k->kernel, k->name, params, grid, block, sharedMemBytes, (cudaStream_t)hStream);
    if (e != cudaSuccess) restore_last_error(pending); /* the driver's error, not the runtime's (a sticky one stays) */
    return driver_code(e);
}

static const struct {
    CUresult code;
    const char *name, *text;
} codes[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS", "an illegal memory access was encountered"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult describe(CUresult error, const char **out, int text)
{
    if (!out) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof codes / sizeof *codes; i++)
        if (codes[i].code == error) {
            *out = text ? codes[i].text : codes[i].name;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult cuGetErrorName(CUresult error, const char **name) { return describe(error, name, 0); }
CUresult cuGetErrorString(CUresult error, const char **text) { return describe(error, text, 1); }
