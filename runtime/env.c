/* env.c — fast defaults for a generated training program, with no environment variables
 * to set: the right OpenBLAS kernels, an OpenMP thread per CPU that spins briefly between
 * kernels, BLAS single-threaded inside the generated kernels' own tasks, and denormals
 * flushed to zero.
 *
 * OpenBLAS (DYNAMIC_ARCH) chooses its kernels and libgomp reads its wait settings
 * (GOMP_SPINCOUNT, OMP_WAIT_POLICY) when the libraries load, before main, so changing them takes a new process image:
 * krt_fast_environment sets what the user did not, marks the environment (KILN_ENV_READY)
 * and execs /proc/self/exe once with the same arguments. If the exec fails, the program
 * goes on as it is. A value the user set is never changed. Thread counts need no exec:
 * both libraries take them at run time. KILN_VERBOSE=1 prints one line saying what was
 * chosen (docs/training.md). */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#define KRT_X86 1
#endif

#include "kiln_rt.h"

/* OpenBLAS's extensions, weak: linked with another BLAS they are NULL and skipped. The
 * kiln command loads OpenBLAS only when it runs a model in its own process (kiln train's
 * JIT, after this file's environment is set), so BLAS_FN looks the names up in the process
 * when they were not linked. */
extern char *openblas_get_corename(void) __attribute__((weak));
extern char *openblas_get_config(void) __attribute__((weak));
extern int openblas_get_num_threads(void) __attribute__((weak));
extern void openblas_set_num_threads(int n) __attribute__((weak));
#define BLAS_FN(name) (name ? name : (__typeof__(&name))dlsym(RTLD_DEFAULT, #name))

#define MARKER "KILN_ENV_READY"

const char *krt_cpu_blas_core(void)
{
#ifdef KRT_X86
    __builtin_cpu_init();
    /* libgcc reports AVX/AVX-512 only when the OS saves their registers (XCR0). */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl"))
        return "SkylakeX";
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
    return NULL;
}

static bool in_list(const char *name, const char *const *list)
{
    for (; *list; list++)
        if (!strcasecmp(name, *list)) return true;
    return false;
}

/* 3: AVX-512 kernels, 2: AVX2, 1: a known older core, 0: a name we do not know (perhaps
 * newer than this file), which is never replaced. */
static int core_level(const char *name)
{
    static const char *const avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids", NULL};
    static const char *const avx2[] = {"Haswell", "Zen", NULL};
    static const char *const older[] = {"Prescott", "Core2", "Penryn", "Dunnington", "Nehalem", "Sandybridge", "Atom",
                                        "Katmai", "Coppermine", "Northwood", "Banias", "Athlon", "Opteron", "Opteron_SSE3",
                                        "Barcelona", "Nano", "Bobcat", "Bulldozer", "Piledriver", "Steamroller",
                                        "Excavator", "Unknown", NULL};
    if (!name) return 0;
    if (in_list(name, avx512)) return 3;
    if (in_list(name, avx2)) return 2;
    if (in_list(name, older)) return 1;
    return 0;
}

const char *krt_blas_core_upgrade(const char *current, const char *best)
{
    int have = core_level(current), want = core_level(best);
    return have > 0 && want > have ? best : NULL;
}

/* CPUs this process may run on. */
int krt_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

/* The first number of a thread-count variable ("4" or OpenMP's "4,2"), or 0. */
static int thread_value(const char *v)
{
    if (!v) return 0;
    char *end;
    long n = strtol(v, &end, 10);
    return end != v && n > 0 && n < 1 << 16 ? (int)n : 0;
}

/* Whether executing /proc/self/exe starts this program again: not when it was started
 * through the dynamic loader (`ld.so ./prog`) or under valgrind, where /proc/self/exe is
 * that tool, which would then run with the program's arguments. AT_EXECFN names the
 * program (the loader rewrites it) and is still valid at the start of main. */
static bool self_exe_is_program(void)
{
    const char *fn = (const char *)getauxval(AT_EXECFN);
    struct stat a, b;
    if (!fn || stat(fn, &a) != 0 || stat("/proc/self/exe", &b) != 0) return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

static bool set(const char *name)
{
    const char *v = getenv(name);
    return v && *v;
}

static bool verbose(void)
{
    const char *v = getenv("KILN_VERBOSE");
    return v && *v && strcmp(v, "0") != 0;
}

int krt_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

int krt_blas_threads(void)
{
    int (*get)(void) = BLAS_FN(openblas_get_num_threads);
    return get ? get() : 0;
}

/* The threads part of the report: "2 threads (BLAS single-threaded)", "1 thread" or
 * "4 threads, BLAS 2" (the OpenMP count first). */
static void print_threads(void)
{
    int o = krt_threads(), b = krt_blas_threads();
    fprintf(stderr, "%d thread%s", o, o == 1 ? "" : "s");
    if (b == 1 && o > 1) fprintf(stderr, " (BLAS single-threaded)");
    else if (b > 1) fprintf(stderr, ", BLAS %d", b);
}

void krt_omp_clear_stale_registration(void)
{
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/__KMP_REGISTERED_LIB_%ld_%ld", (long)getpid(), (long)getuid());
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_size == 0) unlink(path);
}

void krt_fast_environment(int argc, char **argv)
{
    krt_omp_clear_stale_registration(); /* before the first parallel region */
    /* What the libraries saw when this image loaded, before anything below changes it. */
    const bool ready = set(MARKER);
    const bool had_policy = set("OMP_WAIT_POLICY"), had_spin = set("GOMP_SPINCOUNT");
    /* How idle OpenMP threads wait, unless the user said: spinning for about 10,000 rounds
     * (0.1-0.3 ms here) before sleeping. The kernels of a step follow each other closely,
     * and waking a sleeping thread costs 20 us or more (an interrupt to another virtual
     * CPU), 10-16% of mlp's step with OMP_WAIT_POLICY=passive. A spinning thread takes no
     * CPU from BLAS, which has no threads of its own here (see below). */
    const bool set_spin = !had_policy && !had_spin;
    /* What kiln set: the names the previous image listed in the marker, then ours. */
    char kiln_set[256] = "";
    if (ready) {
        static const char *const names[] = {"OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOMP_SPINCOUNT",
                                            "OPENBLAS_CORETYPE", NULL};
        const char *listed = getenv(MARKER);
        for (int i = 0; names[i]; i++) {
            const char *at = strstr(listed, names[i]);
            size_t len = strlen(names[i]);
            if (at && (at == listed || at[-1] == ' ') && (at[len] == ' ' || !at[len]))
                strcat(strcat(kiln_set, *kiln_set ? " " : ""), names[i]);
        }
    }
#define NOTE(name) (strcat(kiln_set, *kiln_set ? " " name : name))

    /* OpenMP gets the threads: the user's count for either library, else every CPU. BLAS
     * is single-threaded unless the user says otherwise: generated kernels share each
     * product's blocks between the OpenMP threads themselves (kiln_gemm.h), and a BLAS
     * thread pool beside them would only spin (sched_yield) in their way. */
    const bool user_omp = set("OMP_NUM_THREADS");
    const bool user_blas = set("OPENBLAS_NUM_THREADS") || set("GOTO_NUM_THREADS");
    int n_omp = thread_value(getenv("OMP_NUM_THREADS"));
    int n_blas = thread_value(getenv(set("OPENBLAS_NUM_THREADS") ? "OPENBLAS_NUM_THREADS" : "GOTO_NUM_THREADS"));
    if (!n_omp) n_omp = n_blas ? n_blas : krt_cpus();
    if (!n_blas) n_blas = 1;
    char num[16];
    if (!user_omp) {
        snprintf(num, sizeof num, "%d", n_omp);
        setenv("OMP_NUM_THREADS", num, 1);
        NOTE("OMP_NUM_THREADS");
    }
    if (!user_blas) {
        snprintf(num, sizeof num, "%d", n_blas);
        setenv("OPENBLAS_NUM_THREADS", num, 1);
        NOTE("OPENBLAS_NUM_THREADS");
    }

    /* What needs a new image: libgomp's wait policy and OpenBLAS's kernels. */
    char *(*get_config)(void) = BLAS_FN(openblas_get_config), *(*get_core)(void) = BLAS_FN(openblas_get_corename);
    const char *config = get_config ? get_config() : NULL;
    const char *core = get_core ? get_core() : NULL;
    const char *better = krt_blas_core_upgrade(core, krt_cpu_blas_core());
    if (set("OPENBLAS_CORETYPE") || !config || !strstr(config, "DYNAMIC_ARCH")) better = NULL;
    int exec_error = 0; /* errno of a failed exec */
    const bool exec_wanted = argc > 0 && !ready && (set_spin || better); /* argc 0: the caller re-executes nothing */
    const bool exec_ok = exec_wanted && argc > 0 && argv && !argv[argc] && self_exe_is_program();
    if (exec_ok) {
        char before[sizeof kiln_set];
        memcpy(before, kiln_set, sizeof before);
        if (set_spin) {
            setenv("GOMP_SPINCOUNT", "10000", 0);
            NOTE("GOMP_SPINCOUNT");
        }
        if (better) {
            setenv("OPENBLAS_CORETYPE", better, 0);
            NOTE("OPENBLAS_CORETYPE");
        }
        setenv(MARKER, kiln_set, 1);
        fflush(NULL);
        execv("/proc/self/exe", argv);
        /* No exec (no /proc, a seccomp policy...): carry on in this image, as it is. */
        exec_error = errno ? errno : ENOEXEC;
        if (set_spin) unsetenv("GOMP_SPINCOUNT");
        if (better) unsetenv("OPENBLAS_CORETYPE");
        unsetenv(MARKER);
        memcpy(kiln_set, before, sizeof before);
    }
#undef NOTE

    /* Thread counts apply at run time; the user's values were read by the libraries. */
#ifdef _OPENMP
    if (!user_omp) omp_set_num_threads(n_omp);
#endif
    void (*set_blas)(int) = BLAS_FN(openblas_set_num_threads);
    if (!user_blas && set_blas) set_blas(n_blas);

    /* Flush denormals to zero (FTZ) and read them as zero (DAZ) before any OpenMP thread
     * exists, so that every worker inherits it. KILN_FTZ=0 keeps IEEE denormals. */
    const char *ftz = getenv("KILN_FTZ");
    bool flush = !(ftz && !strcmp(ftz, "0"));
#ifdef KRT_X86
    if (flush) {
        _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
        _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
    }
#else
    flush = false;
#endif

    if (verbose()) {
        fprintf(stderr, "kiln: ");
        print_threads();
        fprintf(stderr, ", BLAS core %s, OMP_WAIT_POLICY=%s, GOMP_SPINCOUNT=%s, denormals %s", core ? core : "unknown",
                had_policy ? getenv("OMP_WAIT_POLICY") : "unset", had_spin ? getenv("GOMP_SPINCOUNT") : "unset",
                flush ? "flushed to zero" : "kept");
        if (*kiln_set) fprintf(stderr, "; set by kiln: %s", kiln_set);
        if (exec_error) fprintf(stderr, " (re-executing failed: %s)", strerror(exec_error));
        else if (exec_wanted && !exec_ok) fprintf(stderr, " (not re-executed: /proc/self/exe is not this program)");
        fprintf(stderr, "\n");
    }
}

void krt_set_threads(int n)
{
    if (n < 1) return;
#ifdef _OPENMP
    omp_set_num_threads(n);
#endif
    if (verbose()) {
        fprintf(stderr, "kiln: --threads %d: ", n);
        print_threads();
        fprintf(stderr, "\n");
    }
}
