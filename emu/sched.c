/* sched.c — runs a kernel launch on the CPU with the GPU's synchronisation semantics.
 *
 * Each thread of a block is a fiber on a small stack of its own (switched by a few lines of
 * x86-64 assembly, or by ucontext elsewhere); stacks are mapped once per host thread and
 * reused by every later block and launch, and a thread holds one only from its start to
 * its end. The scheduler runs the block's runnable fibers one after another (a "pass"); a
 * fiber runs until it reaches a synchronisation point and switches back, or until it ends,
 * when the next thread of the pass, if it has not started, runs on in its place (no switch:
 * a block without barriers costs a call per thread):
 *   - __syncthreads: the barrier opens when every thread of the block waits at the same
 *     one. Threads that exited while others wait, or threads waiting at different
 *     barriers, are a misuse the emulator reports (on a GPU: a hang or undefined results).
 *   - a warp shuffle: when the 32 lanes of a warp all wait at the same shuffle, the
 *     scheduler exchanges their values (each lane gets its source lane's) and they go on.
 *     A lane that exited or waits elsewhere is reported, as is a shuffle in a partial warp.
 * Within a pass the fibers run in forward, reverse or seeded-shuffled order; blocks of a
 * grid likewise. A correct kernel gives the same result in every order, a kernel with a
 * missing barrier (reading shared memory another thread has not written yet) does not.
 *
 * Shared memory is one arena per host thread: the launch's dynamic bytes first, then each
 * static __shared__ declaration as the block first reaches it. Every region is filled with
 * 0xFF bytes (NaN) at the start of a block, as leftover garbage would be on the GPU, and
 * followed by a red zone that is checked when the block ends (poisoned for ASan as well, so
 * a sanitizer build stops at the faulty access itself). Blocks run one at a time on the
 * calling host thread: results are deterministic, atomics included.
 *
 * ASan needs to be told about stack switches (__sanitizer_start/finish_switch_fiber),
 * otherwise it takes a fiber's stack for a stack overflow of the host thread. */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE, MAP_STACK */

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include "kemu_internal.h"
#include "kemu_thread.h"

#if defined(__SANITIZE_ADDRESS__)
#define KEMU_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KEMU_ASAN 1
#endif
#endif
#ifndef KEMU_ASAN
#define KEMU_ASAN 0
#endif
#if KEMU_ASAN
#include <dlfcn.h>
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define KEMU_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define KEMU_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define KEMU_POISON(p, n) ((void)(p), (void)(n))
#define KEMU_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* The hand-written stack switch exists for x86-64 (see ctx_to_fiber). */
#if defined(__x86_64__)
#define KEMU_ASM_SWITCH 1
#else
#define KEMU_ASM_SWITCH 0
#endif

__thread uint3 kemu_thread_idx;
__thread uint3 kemu_block_idx;
__thread dim3 kemu_block_dim;
__thread dim3 kemu_grid_dim;

enum { FIB_NEW, FIB_READY, FIB_BARRIER, FIB_SHFL, FIB_DONE };

typedef struct {
    void *sp;       /* saved stack pointer (the assembly switch) */
    ucontext_t *uc; /* saved context (the ucontext switch), apart: it is 1 KB, the rest 100 bytes */
    unsigned char *stack; /* lowest address of its stack, above the guard page; NULL until it starts */
    int state;
    uint3 tid;
    const char *file; /* where it waits (barrier or shuffle) */
    int line;
    int shfl_kind, shfl_arg;
    unsigned shfl_size;
    unsigned char shfl_in[8], shfl_out[8];
#if KEMU_ASAN
    void *fake_stack;
#endif
} Fiber;

/* A static __shared__ declaration's place in the arena for the current block. */
typedef struct {
    const void *site;
    size_t offset, size;
    const char *name, *file;
    int line;
} SharedDecl;

#define KEMU_MAX_SHARED_DECLS 64
#define KEMU_REDZONE 32 /* bytes after every shared region */
#define KEMU_REDZONE_BYTE 0xA5
#define KEMU_GARBAGE_BYTE 0xFF

typedef struct {
    void *sched_sp;
    ucontext_t sched_uc;
    int use_ucontext; /* switch with swapcontext (KILN_CUDA_EMU_SWITCH=ucontext, or no x86-64) */
#if KEMU_ASAN
    const void *sched_bottom;
    size_t sched_size;
#endif
    Fiber *fibers;
    ucontext_t *contexts; /* fibers[i].uc */
    unsigned cap; /* fibers (and stacks) allocated */
    unsigned char *stack_map;
    size_t map_bytes, stack_size, stride;
    unsigned *order;
    unsigned next; /* the pass's next place in order */
    unsigned char **free_stacks; /* stacks no running or waiting fiber holds, last freed on top */
    unsigned nfree;
    Fiber *cur;       /* the fiber running now, NULL in the scheduler */
    int dirty_stacks; /* a block was abandoned: its fibers' stacks may hold ASan poison */

    /* the launch */
    const char *name, *file;
    int line;
    kemu_body_fn body;
    void *ctx;
    unsigned nthreads;
    kemu_order order_mode;
    uint64_t seed, launch_no, block_no;
    int failed;
    cudaError_t fail_err;

    /* shared memory of the current block */
    unsigned char *smem;
    size_t smem_cap, smem_top, dyn_bytes, static_bytes, total_limit;
    SharedDecl decls[KEMU_MAX_SHARED_DECLS];
    unsigned ndecls;

    uint64_t barriers, shuffles, switches;
} Emu;

static __thread Emu *tls_emu;
static pthread_key_t emu_key;
static pthread_once_t emu_key_once = PTHREAD_ONCE_INIT;

static void emu_free(void *p)
{
    Emu *e = p;
    if (!e) return;
    if (e->stack_map) munmap(e->stack_map, e->map_bytes);
    free(e->fibers);
    free(e->contexts);
    free(e->order);
    free(e->free_stacks);
    free(e->smem);
    free(e);
}

static void emu_key_make(void) { (void)pthread_key_create(&emu_key, emu_free); }

static Emu *emu_get(void)
{
    if (tls_emu) return tls_emu;
    pthread_once(&emu_key_once, emu_key_make);
    Emu *e = calloc(1, sizeof *e);
    if (!e) return NULL;
    /* Room for the largest opt-in shared memory plus alignment and red zones of every
     * declaration. */
    e->smem_cap = KEMU_SHARED_OPTIN_LIMIT + (KEMU_MAX_SHARED_DECLS + 1) * (KEMU_REDZONE + 64);
    e->smem = malloc(e->smem_cap);
    if (!e->smem) {
        free(e);
        return NULL;
    }
    tls_emu = e;
    pthread_setspecific(emu_key, e);
    return e;
}

static size_t align_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* Fiber stacks: 256 KiB each (1 MiB under ASan, whose frames are larger), reserved but
 * committed only as touched; KILN_CUDA_EMU_STACK_KB overrides. A guard page below each
 * turns a stack overflow into a fault instead of silent corruption of the next stack. */
static size_t stack_bytes(void)
{
    size_t kb = KEMU_ASAN ? 1024 : 256;
    const char *s = getenv("KILN_CUDA_EMU_STACK_KB");
    if (s && *s) {
        long v = strtol(s, NULL, 10);
        if (v >= 16 && v <= 65536) kb = (size_t)v;
    }
    return kb * 1024;
}

/* getcontext returns twice, as setjmp does; called from a function of its own so that the
 * compiler need not keep the caller's loop variables out of registers. */
static __attribute__((noinline)) int init_context(ucontext_t *uc) { return getcontext(uc); }

static int ensure_fibers(Emu *e, unsigned n)
{
    if (n <= e->cap) return 0;
    unsigned cap = 32;
    while (cap < n) cap *= 2;
    if (e->stack_map) munmap(e->stack_map, e->map_bytes);
    free(e->fibers);
    free(e->contexts);
    free(e->order);
    free(e->free_stacks);
    e->stack_map = NULL;
    e->cap = 0;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    e->stack_size = align_up(stack_bytes(), page);
    e->stride = e->stack_size + page;
    e->map_bytes = e->stride * cap;
    e->fibers = calloc(cap, sizeof *e->fibers);
    e->contexts = calloc(cap, sizeof *e->contexts);
    e->order = calloc(cap, sizeof *e->order);
    e->free_stacks = calloc(cap, sizeof *e->free_stacks);
    void *map = mmap(NULL, e->map_bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (!e->fibers || !e->contexts || !e->order || !e->free_stacks || map == MAP_FAILED) {
        if (map != MAP_FAILED) munmap(map, e->map_bytes);
        free(e->fibers);
        free(e->contexts);
        free(e->order);
        free(e->free_stacks);
        e->fibers = NULL;
        e->contexts = NULL;
        e->order = NULL;
        e->free_stacks = NULL;
        return -1;
    }
    e->stack_map = map;
    for (unsigned i = 0; i < cap; i++) {
        mprotect(e->stack_map + (size_t)i * e->stride, page, PROT_NONE);
        /* Once: later starts only re-make the saved context (makecontext). */
        e->fibers[i].uc = &e->contexts[i];
        if (init_context(e->fibers[i].uc) != 0) return -1;
    }
    e->cap = cap;
    return 0;
}

/* ---- messages ---------------------------------------------------------------------- */

static int waits_at(const Fiber *f, int state, const char *file, int line)
{
    return f->state == state && (!file || (f->line == line && strcmp(f->file, file) == 0));
}

/* Appends to buf the linear thread ids in [lo, hi) whose fiber is in state (and, when file
 * is not NULL, waits at file:line), as ranges "0-31, 64"; after 8 ranges, "..." and the
 * count. Returns how many threads matched. */
static unsigned describe(const Emu *e, unsigned lo, unsigned hi, int state, const char *file, int line, char *buf,
                         size_t size)
{
    size_t len = strlen(buf);
    unsigned ranges = 0, count = 0;
    for (unsigned i = lo; i < hi; i++) {
        if (!waits_at(&e->fibers[i], state, file, line)) continue;
        unsigned j = i;
        while (j + 1 < hi && waits_at(&e->fibers[j + 1], state, file, line)) j++;
        count += j - i + 1;
        if (ranges++ < 8 && len + 32 < size)
            len += (size_t)snprintf(buf + len, size - len, j > i ? "%s%u-%u" : "%s%u", ranges > 1 ? ", " : "", i, j);
        i = j;
    }
    if (ranges > 8 && len + 48 < size) snprintf(buf + len, size - len, ", ... (%u threads)", count);
    return count;
}

/* Appends "; label: threads" when any thread of [lo, hi) is in state. */
static void section(const Emu *e, unsigned lo, unsigned hi, int state, const char *label, char *buf, size_t size)
{
    size_t len = strlen(buf);
    snprintf(buf + len, size - len, "; %s: ", label);
    if (describe(e, lo, hi, state, NULL, 0, buf, size) == 0) buf[len] = 0;
}

static void where(const Emu *e, char *buf, size_t size)
{
    snprintf(buf, size, "kernel '%s' (launched at %s:%d), block (%u,%u,%u) of (%u,%u,%u), %u threads",
             e->name, e->file, e->line, kemu_block_idx.x, kemu_block_idx.y, kemu_block_idx.z,
             kemu_grid_dim.x, kemu_grid_dim.y, kemu_grid_dim.z, e->nthreads);
}

/* ---- switching ---------------------------------------------------------------------- */

#if KEMU_ASAN
/* libc's own swapcontext, not ASan's interceptor of it: the interceptor prints a warning
 * (which the sanitizer test run counts as a report) and clears the shadow of the whole
 * target stack at every switch, forgetting the red zones of the frames a waiting fiber has
 * on it. Every switch here is annotated with __sanitizer_start/finish_switch_fiber, which
 * is what ASan needs to follow fibers. */
typedef int (*swapcontext_fn)(ucontext_t *, const ucontext_t *);
static swapcontext_fn real_swapcontext;
static pthread_once_t real_swapcontext_once = PTHREAD_ONCE_INIT;

static void find_real_swapcontext(void)
{
    void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
    void *fn = libc ? dlsym(libc, "swapcontext") : NULL;
    memcpy(&real_swapcontext, &fn, sizeof fn);
    if (!real_swapcontext) real_swapcontext = swapcontext;
}

static int kemu_swapcontext(ucontext_t *from, const ucontext_t *to)
{
    pthread_once(&real_swapcontext_once, find_real_swapcontext);
    return real_swapcontext(from, to);
}
#define swapcontext kemu_swapcontext
#endif

/* Two ways to switch stacks. swapcontext saves and restores the signal mask with a system
 * call each way, about 0.2 us: a softmax over 1024 rows of 1024 took 3.2 s, most of it in
 * rt_sigprocmask. On x86-64 a switch is instead the System V callee-saved registers and the
 * stack pointer (kemu_switch_x86_64, a few nanoseconds); fibers never touch the signal mask.
 * Nor the SSE and x87 control words: device code has no global rounding mode to set, so
 * every fiber runs with the host thread's, and the switch leaves them alone (fldcw and
 * ldmxcsr at every switch made a gpt training step 2.7 times slower on an AMD EPYC).
 * ucontext stays for other machines, and on x86-64 with KILN_CUDA_EMU_SWITCH=ucontext
 * (tested, and the way out should a platform enforce shadow stacks, which a hand-made
 * switch would break). */
#if KEMU_ASM_SWITCH
/* Saves the current registers on the current stack and its pointer in *save_sp, then
 * continues on to_sp where an earlier switch (or make_context) left registers. */
void kemu_switch_x86_64(void **save_sp, void *to_sp);
__asm__(".text\n"
        ".globl kemu_switch_x86_64\n"
        ".hidden kemu_switch_x86_64\n"
        ".type kemu_switch_x86_64, @function\n"
        "kemu_switch_x86_64:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size kemu_switch_x86_64, .-kemu_switch_x86_64\n");
#endif

static void fiber_main(void);

static void ctx_to_fiber(Emu *e, Fiber *f)
{
#if KEMU_ASM_SWITCH
    if (!e->use_ucontext) {
        kemu_switch_x86_64(&e->sched_sp, f->sp);
        return;
    }
#endif
    swapcontext(&e->sched_uc, f->uc);
}

static void ctx_to_scheduler(Emu *e, Fiber *f)
{
#if KEMU_ASM_SWITCH
    if (!e->use_ucontext) {
        kemu_switch_x86_64(&f->sp, e->sched_sp);
        return;
    }
#endif
    swapcontext(f->uc, &e->sched_uc);
}

/* A fresh context on f's stack that starts in fiber_main. */
static void ctx_make(Emu *e, Fiber *f)
{
#if KEMU_ASM_SWITCH
    if (!e->use_ucontext) {
        /* What kemu_switch_x86_64 pops: six registers, the address it returns to
         * (fiber_main), above it a null return address for fiber_main, which never
         * returns; fiber_main starts with the stack pointer 8 past a 16-byte boundary, as
         * after a call. */
        uintptr_t top = ((uintptr_t)(f->stack + e->stack_size)) & ~(uintptr_t)15;
        uint64_t *sp = (uint64_t *)top;
        *--sp = 0;
        void (*entry)(void) = fiber_main;
        uint64_t entry_bits;
        memcpy(&entry_bits, &entry, sizeof entry_bits);
        *--sp = entry_bits;
        for (int i = 0; i < 6; i++) *--sp = 0;
        f->sp = sp;
        return;
    }
#endif
    f->uc->uc_stack.ss_sp = f->stack;
    f->uc->uc_stack.ss_size = e->stack_size;
    f->uc->uc_link = NULL;
    makecontext(f->uc, fiber_main, 0);
}

/* Runs f until a fiber switches back to the scheduler: f, or the last thread of its chain
 * (fiber_main); returns that fiber. */
static Fiber *switch_in(Emu *e, Fiber *f)
{
    e->cur = f;
    kemu_thread_idx = f->tid;
    e->switches++;
#if KEMU_ASAN
    void *fake = NULL;
    __sanitizer_start_switch_fiber(&fake, f->stack, e->stack_size);
    ctx_to_fiber(e, f);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    ctx_to_fiber(e, f);
#endif
    Fiber *back = e->cur;
    e->cur = NULL;
    return back;
}

/* Back to the scheduler; returns when the scheduler resumes the fiber (never when it is
 * exiting: then ASan is told to drop the fiber's fake stack). */
static void switch_out(Emu *e, Fiber *f, int exiting)
{
#if KEMU_ASAN
    __sanitizer_start_switch_fiber(exiting ? NULL : &f->fake_stack, e->sched_bottom, e->sched_size);
    ctx_to_scheduler(e, f);
    __sanitizer_finish_switch_fiber(f->fake_stack, &e->sched_bottom, &e->sched_size);
#else
    (void)exiting;
    ctx_to_scheduler(e, f);
#endif
}

/* A thread that finishes hands its stack to the next thread of the pass when that one has
 * not started yet, and calls the body again for it without a switch: the same order and
 * the same semantics as a switch to the scheduler and a fresh fiber, at the cost of a
 * call. In a kernel without barriers or shuffles a whole block is one such chain. */
static void fiber_main(void)
{
    Emu *e = tls_emu;
#if KEMU_ASAN
    __sanitizer_finish_switch_fiber(NULL, &e->sched_bottom, &e->sched_size);
#endif
    for (;;) {
        e->body(e->ctx);
        Fiber *f = e->cur;
        f->state = FIB_DONE;
        while (e->next < e->nthreads && e->fibers[e->order[e->next]].state != FIB_NEW &&
               e->fibers[e->order[e->next]].state != FIB_READY)
            e->next++; /* the scheduler skips these too */
        if (e->failed || e->next == e->nthreads || e->fibers[e->order[e->next]].state != FIB_NEW) {
            switch_out(e, f, 1); /* the scheduler takes back the stack and goes on */
            KEMU_UNREACHABLE(); /* a finished fiber is never resumed */
        }
        Fiber *g = &e->fibers[e->order[e->next++]];
        g->stack = f->stack;
        f->stack = NULL;
        g->state = FIB_READY;
        e->cur = g;
        kemu_thread_idx = g->tid;
    }
}

static Fiber *start_fiber(Emu *e, Fiber *f)
{
    f->stack = e->free_stacks[--e->nfree];
#if KEMU_ASAN
    /* An abandoned block left its frames' red zones poisoned on these stacks. */
    if (e->dirty_stacks) KEMU_UNPOISON(f->stack, e->stack_size);
#endif
    ctx_make(e, f);
    f->state = FIB_READY;
    return switch_in(e, f);
}

/* A misuse found inside a thread (shared memory over the limit, a shuffle in a partial
 * warp): the launch fails, the block is abandoned, this fiber never resumes. */
static void thread_fail(Emu *e, cudaError_t err, const char *what)
{
    char w[512];
    where(e, w, sizeof w);
    uint3 t = kemu_thread_idx;
    kemu_fail(err, 1, "%s, thread (%u,%u,%u): %s", w, t.x, t.y, t.z, what);
    e->failed = 1;
    e->fail_err = err;
    Fiber *f = e->cur;
    f->state = FIB_DONE;
    switch_out(e, f, 1);
    KEMU_UNREACHABLE(); /* switch_out never comes back to a failed thread */
}

static Emu *current_thread(const char *what)
{
    Emu *e = tls_emu;
    if (!e || !e->cur) {
        fprintf(stderr, "kiln cuda-emu: error: %s called outside a kernel\n", what);
        abort(); /* the program's bug, not the emulator's: a device call has no error to return */
    }
    return e;
}

/* ---- what a thread calls ------------------------------------------------------------- */

void kemu_syncthreads(const char *file, int line)
{
    Emu *e = current_thread("__syncthreads");
    Fiber *f = e->cur;
    f->state = FIB_BARRIER;
    f->file = file;
    f->line = line;
    switch_out(e, f, 0);
}

void kemu_shfl(int kind, const void *in, void *out, unsigned size, int arg, const char *file, int line)
{
    Emu *e = current_thread("a warp shuffle");
    Fiber *f = e->cur;
    unsigned lane0 = (unsigned)(f - e->fibers) / 32 * 32;
    if (lane0 + 32 > e->nthreads) {
        char msg[256];
        snprintf(msg, sizeof msg,
                 "warp shuffle at %s:%d in a partial warp (threads %u-%u of a %u-thread block): "
                 "KILN_SHFL_* exchange among 32 lanes; make the block size a multiple of 32",
                 file, line, lane0, e->nthreads - 1, e->nthreads);
        thread_fail(e, cudaErrorLaunchFailure, msg);
    }
    memcpy(f->shfl_in, in, size);
    f->shfl_kind = kind;
    f->shfl_arg = arg;
    f->shfl_size = size;
    f->state = FIB_SHFL;
    f->file = file;
    f->line = line;
    switch_out(e, f, 0);
    memcpy(out, f->shfl_out, size);
}

static void put_region(Emu *e, size_t offset, size_t size)
{
    memset(e->smem + offset, KEMU_GARBAGE_BYTE, size);
    memset(e->smem + offset + size, KEMU_REDZONE_BYTE, KEMU_REDZONE);
    KEMU_POISON(e->smem + offset + size, KEMU_REDZONE);
}

void *kemu_shared_static(const void *site, size_t size, size_t align, const char *name, const char *file,
                         int line)
{
    Emu *e = current_thread("a __shared__ declaration");
    for (unsigned i = 0; i < e->ndecls; i++)
        if (e->decls[i].site == site) return e->smem + e->decls[i].offset;
    char msg[512];
    if (e->ndecls == KEMU_MAX_SHARED_DECLS) {
        snprintf(msg, sizeof msg, "more than %d __shared__ declarations (at %s:%d)", KEMU_MAX_SHARED_DECLS,
                 file, line);
        thread_fail(e, cudaErrorLaunchOutOfResources, msg);
    }
    if (e->static_bytes + size > KEMU_SHARED_DEFAULT_LIMIT ||
        e->static_bytes + size + e->dyn_bytes > e->total_limit) {
        snprintf(msg, sizeof msg,
                 "shared memory over the limit: __shared__ '%s' (%s:%d, %zu bytes) brings the block to "
                 "%zu bytes of static and %zu of dynamic shared memory; the limit is %zu bytes (static at "
                 "most %u)",
                 name, file, line, size, e->static_bytes + size, e->dyn_bytes, e->total_limit,
                 KEMU_SHARED_DEFAULT_LIMIT);
        thread_fail(e, cudaErrorLaunchOutOfResources, msg);
    }
    size_t a = align < 16 ? 16 : align;
    size_t offset = align_up(e->smem_top, a);
    SharedDecl *d = &e->decls[e->ndecls++];
    d->site = site;
    d->offset = offset;
    d->size = size;
    d->name = name;
    d->file = file;
    d->line = line;
    e->static_bytes += size;
    e->smem_top = offset + size + KEMU_REDZONE;
    put_region(e, offset, size);
    return e->smem + offset;
}

void *kemu_shared_dynamic(void)
{
    Emu *e = current_thread("a dynamic __shared__ declaration");
    return e->smem;
}

/* ---- the block scheduler ------------------------------------------------------------- */

static uint64_t splitmix(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static void make_order(Emu *e, unsigned pass)
{
    unsigned n = e->nthreads;
    for (unsigned i = 0; i < n; i++) e->order[i] = e->order_mode == KEMU_ORDER_REVERSE ? n - 1 - i : i;
    if (e->order_mode != KEMU_ORDER_SHUFFLE) return;
    uint64_t s = e->seed ^ (e->launch_no * 0xD1B54A32D192ED03ull) ^ (e->block_no * 0x8CB92BA72F3D8DD7ull) ^ pass;
    for (unsigned i = n - 1; i > 0; i--) {
        unsigned j = (unsigned)(splitmix(&s) % (i + 1));
        unsigned t = e->order[i];
        e->order[i] = e->order[j];
        e->order[j] = t;
    }
}

static int same_site(const Fiber *a, const Fiber *b)
{
    return a->line == b->line && (a->file == b->file || strcmp(a->file, b->file) == 0);
}

static void block_fail(Emu *e, const char *what)
{
    char w[512];
    where(e, w, sizeof w);
    kemu_fail(cudaErrorLaunchFailure, 1, "%s: %s", w, what);
    e->failed = 1;
    e->fail_err = cudaErrorLaunchFailure;
}

/* Exchanges the values of every warp whose 32 lanes all wait at a shuffle; returns how many
 * warps went on, -1 after reporting lanes of one warp at different shuffles. */
static int release_warps(Emu *e)
{
    int released = 0;
    for (unsigned w = 0; w + 32 <= e->nthreads; w += 32) {
        Fiber *lanes = &e->fibers[w];
        int all = 1;
        for (unsigned l = 0; l < 32 && all; l++) all = lanes[l].state == FIB_SHFL;
        if (!all) continue;
        for (unsigned l = 1; l < 32; l++) {
            if (same_site(&lanes[l], &lanes[0]) && lanes[l].shfl_kind == lanes[0].shfl_kind &&
                lanes[l].shfl_size == lanes[0].shfl_size)
                continue;
            char msg[1024];
            snprintf(msg, sizeof msg,
                     "warp %u: lanes wait at different warp shuffles: lane 0 at %s:%d, lane %u at %s:%d "
                     "(every lane of a warp must reach the same KILN_SHFL_*)",
                     w / 32, lanes[0].file, lanes[0].line, l, lanes[l].file, lanes[l].line);
            block_fail(e, msg);
            return -1;
        }
        for (unsigned l = 0; l < 32; l++) {
            int arg = lanes[l].shfl_arg;
            int src;
            switch (lanes[l].shfl_kind) {
            case KEMU_SHFL_DOWN: src = (int)l + arg; break;
            case KEMU_SHFL_UP: src = (int)l - arg; break;
            case KEMU_SHFL_XOR: src = (int)l ^ arg; break;
            default: src = arg & 31; break;
            }
            if (src < 0 || src > 31) src = (int)l;
            memcpy(lanes[l].shfl_out, lanes[src].shfl_in, lanes[l].shfl_size);
        }
        for (unsigned l = 0; l < 32; l++) lanes[l].state = FIB_READY;
        e->shuffles++;
        released++;
    }
    return released;
}

/* Nothing can run and not every thread has finished: says why. */
static void diagnose_stuck(Emu *e)
{
    char msg[2048] = "";
    unsigned n = e->nthreads;
    /* A warp partly at a shuffle first: it is the more specific mistake. */
    for (unsigned w = 0; w + 32 <= n; w += 32) {
        const Fiber *at = NULL;
        for (unsigned l = 0; l < 32 && !at; l++)
            if (e->fibers[w + l].state == FIB_SHFL) at = &e->fibers[w + l];
        if (!at) continue;
        snprintf(msg, sizeof msg, "warp shuffle at %s:%d not reached by the whole warp %u: lanes waiting there: ",
                 at->file, at->line, w / 32);
        describe(e, w, w + 32, FIB_SHFL, at->file, at->line, msg, sizeof msg);
        section(e, w, w + 32, FIB_DONE, "exited", msg, sizeof msg);
        section(e, w, w + 32, FIB_BARRIER, "waiting at a __syncthreads", msg, sizeof msg);
        size_t len = strlen(msg);
        for (unsigned l = 0; l < 32; l++) {
            const Fiber *f = &e->fibers[w + l];
            if (f->state != FIB_SHFL || same_site(f, at)) continue;
            snprintf(msg + len, sizeof msg - len, "; lane %u waits at another shuffle, at %s:%d", l, f->file, f->line);
            len = strlen(msg);
            break;
        }
        snprintf(msg + len, sizeof msg - len, " (threads are numbered x + blockDim.x * (y + blockDim.y * z))");
        block_fail(e, msg);
        return;
    }
    const Fiber *at = NULL;
    for (unsigned i = 0; i < n && !at; i++)
        if (e->fibers[i].state == FIB_BARRIER) at = &e->fibers[i];
    if (!at) { /* cannot happen: nothing waits, yet not all are done */
        block_fail(e, "internal error: the block is stuck with no thread waiting");
        return;
    }
    const Fiber *other = NULL;
    for (unsigned i = 0; i < n && !other; i++)
        if (e->fibers[i].state == FIB_BARRIER && !same_site(&e->fibers[i], at)) other = &e->fibers[i];
    if (other) {
        snprintf(msg, sizeof msg, "barrier divergence: threads wait at different __syncthreads: at %s:%d threads ",
                 at->file, at->line);
        describe(e, 0, n, FIB_BARRIER, at->file, at->line, msg, sizeof msg);
        size_t len = strlen(msg);
        snprintf(msg + len, sizeof msg - len, "; at %s:%d threads ", other->file, other->line);
        describe(e, 0, n, FIB_BARRIER, other->file, other->line, msg, sizeof msg);
    } else {
        unsigned waiting = 0;
        for (unsigned i = 0; i < n; i++) waiting += e->fibers[i].state == FIB_BARRIER;
        snprintf(msg, sizeof msg,
                 "barrier divergence: __syncthreads at %s:%d reached by %u of %u threads; threads that exited "
                 "without reaching it: ",
                 at->file, at->line, waiting, n);
        describe(e, 0, n, FIB_DONE, NULL, 0, msg, sizeof msg);
    }
    size_t len = strlen(msg);
    snprintf(msg + len, sizeof msg - len,
             " (every thread of a block must reach every __syncthreads; threads are numbered x + blockDim.x * "
             "(y + blockDim.y * z))");
    block_fail(e, msg);
}

/* Red zones of every shared region still intact? */
static void check_shared(Emu *e)
{
    for (unsigned i = 0; i <= e->ndecls; i++) {
        size_t off = i == 0 ? 0 : e->decls[i - 1].offset;
        size_t size = i == 0 ? e->dyn_bytes : e->decls[i - 1].size;
        unsigned char *rz = e->smem + off + size;
        KEMU_UNPOISON(rz, KEMU_REDZONE);
        for (unsigned k = 0; k < KEMU_REDZONE; k++) {
            if (rz[k] == KEMU_REDZONE_BYTE) continue;
            char msg[512];
            if (i == 0)
                snprintf(msg, sizeof msg,
                         "wrote past the end of dynamic shared memory (%zu bytes given at launch): byte %u past "
                         "the end was changed",
                         size, k);
            else
                snprintf(msg, sizeof msg,
                         "wrote past the end of __shared__ '%s' (%s:%d, %zu bytes): byte %u past the end was "
                         "changed",
                         e->decls[i - 1].name, e->decls[i - 1].file, e->decls[i - 1].line, size, k);
            block_fail(e, msg);
            return;
        }
    }
}

static void run_block(Emu *e)
{
    unsigned n = e->nthreads;
    dim3 b = kemu_block_dim;
    for (unsigned i = 0; i < n; i++) {
        Fiber *f = &e->fibers[i];
        f->state = FIB_NEW;
        f->tid.x = i % b.x;
        f->tid.y = i / b.x % b.y;
        f->tid.z = i / (b.x * b.y);
        f->file = "";
        f->line = 0;
        f->stack = NULL;
    }
    /* Shared memory: the dynamic bytes at the start of the arena, static regions later. */
    KEMU_UNPOISON(e->smem, e->smem_cap);
    e->ndecls = 0;
    e->static_bytes = 0;
    put_region(e, 0, e->dyn_bytes);
    e->smem_top = e->dyn_bytes + KEMU_REDZONE;

    /* Stacks are handed out as threads start and taken back as they finish, the last one
     * freed first: a block whose threads run to the end without waiting (elementwise
     * kernels) runs every thread on the same stack, warm in the cache, instead of touching
     * a cold page of another stack for each thread. */
    const size_t page = e->stride - e->stack_size;
    e->nfree = n;
    for (unsigned i = 0; i < n; i++) e->free_stacks[i] = e->stack_map + (size_t)(n - 1 - i) * e->stride + page;

    for (unsigned pass = 0;; pass++) {
        make_order(e, pass);
        for (e->next = 0; e->next < n;) {
            Fiber *f = &e->fibers[e->order[e->next++]], *back;
            if (f->state == FIB_NEW)
                back = start_fiber(e, f);
            else if (f->state == FIB_READY)
                back = switch_in(e, f);
            else
                continue;
            if (e->failed) return;
            if (back->state == FIB_DONE) {
                e->free_stacks[e->nfree++] = back->stack;
                back->stack = NULL;
            }
        }
        /* Every fiber has run until it finished or waits. */
        unsigned done = 0, barrier = 0;
        for (unsigned i = 0; i < n; i++) {
            done += e->fibers[i].state == FIB_DONE;
            barrier += e->fibers[i].state == FIB_BARRIER;
        }
        if (done == n) break;
        int released = release_warps(e);
        if (released < 0) return;
        if (released > 0) continue;
        if (barrier == n) {
            int same = 1;
            for (unsigned i = 1; i < n && same; i++) same = same_site(&e->fibers[i], &e->fibers[0]);
            if (same) {
                for (unsigned i = 0; i < n; i++) e->fibers[i].state = FIB_READY;
                e->barriers++;
                continue;
            }
        }
        diagnose_stuck(e);
        return;
    }
    check_shared(e);
}

void kemu_report_launch_error(cudaError_t error, const char *name, const char *file, int line, const char *what)
{
    /* An illegal address is sticky on a GPU; so it is here. */
    kemu_fail(error, 1, "kernel '%s' (launched at %s:%d): %s", name, file, line, what);
}

static uint64_t gcd64(uint64_t a, uint64_t b)
{
    while (b) {
        uint64_t t = a % b;
        a = b;
        b = t;
    }
    return a;
}

static int check_dims(const char *name, const char *file, int line, dim3 grid, dim3 block)
{
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (block.x == 0 || block.y == 0 || block.z == 0 || block.x > 1024 || block.y > 1024 || block.z > 64 ||
        threads > KEMU_MAX_THREADS_PER_BLOCK) {
        kemu_fail(cudaErrorInvalidConfiguration, 0,
                  "kernel '%s' (launched at %s:%d): block (%u,%u,%u) = %llu threads; a block has 1 to %u "
                  "threads, at most (1024,1024,64) in each dimension",
                  name, file, line, block.x, block.y, block.z, (unsigned long long)threads,
                  KEMU_MAX_THREADS_PER_BLOCK);
        return -1;
    }
    if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 || grid.z > 65535) {
        kemu_fail(cudaErrorInvalidConfiguration, 0,
                  "kernel '%s' (launched at %s:%d): grid (%u,%u,%u) out of range: 1 to (2^31-1, 65535, 65535)",
                  name, file, line, grid.x, grid.y, grid.z);
        return -1;
    }
    return 0;
}

cudaError_t kemu_launch(const void *kernel, const char *name, const char *file, int line, dim3 grid, dim3 block,
                        size_t shared_bytes, cudaStream_t stream, kemu_body_fn body, void *ctx)
{
    cudaError_t sticky = kemu_sticky_error();
    if (sticky != cudaSuccess) return kemu_set_error(sticky);
    if (!kemu_stream_valid(stream))
        return kemu_fail(cudaErrorInvalidResourceHandle, 0, "kernel '%s' (launched at %s:%d): invalid stream",
                         name, file, line);
    if (check_dims(name, file, line, grid, block) != 0) return cudaErrorInvalidConfiguration;
    size_t attr = kemu_kernel_dynamic_limit(kernel);
    size_t dyn_limit = attr ? attr : KEMU_SHARED_DEFAULT_LIMIT;
    if (shared_bytes > dyn_limit)
        return kemu_fail(cudaErrorInvalidValue, 0,
                         "kernel '%s' (launched at %s:%d): %zu bytes of dynamic shared memory, over the limit of "
                         "%zu (above 48 KiB, raise it with cudaFuncSetAttribute("
                         "cudaFuncAttributeMaxDynamicSharedMemorySize), up to %u)",
                         name, file, line, shared_bytes, dyn_limit, KEMU_SHARED_OPTIN_LIMIT);
    Emu *e = emu_get();
    if (!e) return kemu_fail(cudaErrorMemoryAllocation, 0, "out of host memory for the emulator");
    if (e->cur) {
        fprintf(stderr, "kiln cuda-emu: error: kernel '%s' launched from inside a kernel (%s:%d): dynamic "
                        "parallelism is not part of the dialect\n", name, file, line);
        abort(); /* the dialect's rule 5: nvcc (without -rdc) refuses it, so does the emulator */
    }
    unsigned n = block.x * block.y * block.z;
    if (ensure_fibers(e, n) != 0)
        return kemu_fail(cudaErrorMemoryAllocation, 0, "kernel '%s': cannot allocate %u fiber stacks", name, n);

    e->name = name;
    e->file = file;
    e->line = line;
    e->body = body;
    e->ctx = ctx;
    e->nthreads = n;
    e->failed = 0;
    e->dyn_bytes = shared_bytes;
    e->total_limit = attr ? KEMU_SHARED_OPTIN_LIMIT : KEMU_SHARED_DEFAULT_LIMIT;
    e->order_mode = kemu_order_now(&e->seed);
    /* Read at every launch (no fiber is suspended between launches), so that a test can
     * run the same kernels with both switches. */
    const char *sw = getenv("KILN_CUDA_EMU_SWITCH");
    e->use_ucontext = !KEMU_ASM_SWITCH || (sw && strcmp(sw, "ucontext") == 0);
    e->launch_no++;
    e->barriers = e->shuffles = e->switches = 0;
    kemu_block_dim = block;
    kemu_grid_dim = grid;

    uint64_t nblocks = (uint64_t)grid.x * grid.y * grid.z;
    /* Block order: forward, reverse, or an affine permutation k -> (a k + c) mod nblocks
     * with a coprime to nblocks (seeded): every block once, no table. */
    uint64_t s = e->seed ^ (e->launch_no * 0xA0761D6478BD642Full);
    uint64_t a = 1, c = 0;
    if (e->order_mode == KEMU_ORDER_SHUFFLE && nblocks > 1) {
        do a = splitmix(&s) % nblocks; while (a == 0 || gcd64(a, nblocks) != 1);
        c = splitmix(&s) % nblocks;
    }
    uint64_t blocks_run = 0;
    for (uint64_t k = 0; k < nblocks && !e->failed; k++) {
        uint64_t lin = k;
        if (e->order_mode == KEMU_ORDER_REVERSE) lin = nblocks - 1 - k;
        if (e->order_mode == KEMU_ORDER_SHUFFLE) lin = (uint64_t)(((unsigned __int128)a * k + c) % nblocks);
        kemu_block_idx.x = (unsigned)(lin % grid.x);
        kemu_block_idx.y = (unsigned)(lin / grid.x % grid.y);
        kemu_block_idx.z = (unsigned)(lin / ((uint64_t)grid.x * grid.y));
        e->block_no = lin;
        run_block(e);
        blocks_run++;
    }
    if (e->failed) e->dirty_stacks = 1;
    kemu_stats_add(blocks_run, blocks_run * n, e->barriers, e->shuffles, e->switches);
    return e->failed ? e->fail_err : cudaSuccess;
}
