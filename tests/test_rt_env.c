/* test_rt_env.c — a training program's fast defaults (runtime/env.c): started with no
 * environment variables it runs with GOMP_SPINCOUNT=10000, an OpenMP thread per CPU,
 * single-threaded BLAS and OpenBLAS kernels that match the CPU (re-executing itself once
 * to get them); a value the user set is never changed; --threads sets OpenMP's count;
 * nothing is printed unless KILN_VERBOSE=1. The choice of kernels is also checked on its
 * own, and end to end with a stand-in OpenBLAS that reports an old core. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

Test(env, core_upgrade_only_from_known_older_cores)
{
    cr_expect_str_eq(krt_blas_core_upgrade("Prescott", "SkylakeX"), "SkylakeX");
    cr_expect_str_eq(krt_blas_core_upgrade("Haswell", "SkylakeX"), "SkylakeX");
    cr_expect_str_eq(krt_blas_core_upgrade("ZEN", "SkylakeX"), "SkylakeX"); /* names are case-insensitive */
    cr_expect_str_eq(krt_blas_core_upgrade("Sandybridge", "Haswell"), "Haswell");
    cr_expect_str_eq(krt_blas_core_upgrade("Nehalem", "Haswell"), "Haswell");
    cr_expect_null(krt_blas_core_upgrade("SkylakeX", "SkylakeX"));
    cr_expect_null(krt_blas_core_upgrade("Cooperlake", "SkylakeX"));  /* as fast: left alone */
    cr_expect_null(krt_blas_core_upgrade("SkylakeX", "Haswell"));     /* never a downgrade */
    cr_expect_null(krt_blas_core_upgrade("Zen", "Haswell"));
    cr_expect_null(krt_blas_core_upgrade("Zen7", "SkylakeX"));        /* unknown: maybe newer */
    cr_expect_null(krt_blas_core_upgrade(NULL, "SkylakeX"));
    cr_expect_null(krt_blas_core_upgrade("Prescott", NULL));          /* a CPU without AVX2 */
}

/* libomp's registration file of this process's pid: an empty one is a leftover that would
 * crash libomp with SIGBUS (krt_omp_clear_stale_registration removes it); one with content
 * is left to libomp. */
Test(env, empty_libomp_registration_of_this_pid_is_removed)
{
    char path[96];
    snprintf(path, sizeof path, "/dev/shm/__KMP_REGISTERED_LIB_%ld_%ld", (long)getpid(), (long)getuid());
    FILE *f = fopen(path, "w");
    if (!f) cr_skip_test("no /dev/shm");
    fclose(f);
    krt_omp_clear_stale_registration();
    cr_expect_neq(access(path, F_OK), 0, "the empty %s is still there", path);
    f = fopen(path, "w");
    cr_assert(f);
    fputs("0x1234-cafe-libomp.so", f);
    fclose(f);
    krt_omp_clear_stale_registration();
    cr_expect_eq(access(path, F_OK), 0, "a registration with content was removed");
    unlink(path);
}

Test(env, cpu_core_follows_the_cpu_features)
{
    const char *best = krt_cpu_blas_core();
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (avx512) cr_expect_str_eq(best, "SkylakeX");
    else if (avx2) cr_expect_str_eq(best, "Haswell");
    else cr_expect_null(best);
#else
    cr_expect_null(best);
#endif
}

/* ---- end to end, with models/mlp.kiln ---- */

static char dir[64];

static void setup(void)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("env", "models/mlp.kiln", "mlp", dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build failed:\n%s", out.data);
    sb_free(&out);
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(env_program, .init = setup, .fini = teardown, .timeout = 120);

/* Runs `VARS ./mlp ARGS` in the test directory with none of the variables env.c reads
 * inherited from the test's own environment; returns what it printed. */
static char *run_mlp(const char *vars, const char *args)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "cd %s && env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OPENBLAS_CORETYPE -u OMP_NUM_THREADS -u OPENBLAS_NUM_THREADS "
             "-u GOTO_NUM_THREADS -u KILN_ENV_READY -u KILN_VERBOSE -u KILN_FTZ %s ./mlp %s",
             dir, vars, args);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    cr_assert_eq(rc, 0, "`%s` failed (%d):\n%s", cmd, rc, out.data ? out.data : "");
    return out.data ? out.data : calloc(1, 1);
}

/* The report line "kiln: ..." of a KILN_VERBOSE=1 run. */
static char *report_of(char *out)
{
    char *line = strstr(out, "kiln: ");
    cr_assert(line, "no kiln: line in:\n%s", out);
    char *end = strchr(line, '\n');
    if (end) *end = 0;
    return line;
}

/* Whether the program's BLAS core (after "BLAS core ") is among those of the CPU's best. */
static bool core_is_fast(const char *report, const char *best)
{
    const char *p = strstr(report, "BLAS core ");
    if (!p) return false;
    p += strlen("BLAS core ");
    const char *avx512[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    const char *avx2[] = {"Haswell", "Zen"};
    for (int i = 0; i < 3; i++)
        if (!strncmp(p, avx512[i], strlen(avx512[i]))) return true;
    if (!strcmp(best, "Haswell"))
        for (int i = 0; i < 2; i++)
            if (!strncmp(p, avx2[i], strlen(avx2[i]))) return true;
    return false;
}

Test(env_program, defaults_without_any_variable)
{
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    char *out = run_mlp("KILN_VERBOSE=1", "--help");
    char *r = report_of(out);
    cr_expect(strstr(r, "OMP_WAIT_POLICY=unset, GOMP_SPINCOUNT=10000"), "%s", r);
    cr_expect(strstr(r, "set by kiln: OMP_NUM_THREADS OPENBLAS_NUM_THREADS GOMP_SPINCOUNT"), "%s", r);
    cr_expect(!strstr(r, "re-executing failed"), "%s", r);
    cr_expect(strstr(r, "denormals flushed to zero"), "%s", r);
    /* A thread per CPU (the affinity mask may hold fewer than are online), BLAS's one. */
    int n = atoi(r + strlen("kiln: "));
    cr_expect(n >= 1 && n <= ncpu && strstr(r, " thread"), "%s", r);
    if (n > 1) cr_expect(strstr(r, " threads (BLAS single-threaded)"), "%s", r);
    const char *best = krt_cpu_blas_core();
    if (best) cr_expect(core_is_fast(r, best), "this CPU runs %s kernels, but: %s", best, r);
    free(out);
    /* Without KILN_VERBOSE nothing is added to the output. */
    out = run_mlp("", "--help");
    cr_expect(!strstr(out, "kiln:"), "%s", out);
    cr_expect(strstr(out, "--threads N"), "%s", out);
    free(out);
    if (!best) cr_skip_test("this CPU has neither AVX-512 nor AVX2: BLAS kernels not checked");
}

Test(env_program, user_values_are_kept)
{
    char *out = run_mlp("KILN_VERBOSE=1 OMP_WAIT_POLICY=active OPENBLAS_CORETYPE=Prescott OMP_NUM_THREADS=1 KILN_FTZ=0",
                        "--help");
    char *r = report_of(out);
    cr_expect(strstr(r, "kiln: 1 thread,"), "%s", r);
    cr_expect(strstr(r, "BLAS core Prescott"), "%s", r);
    cr_expect(strstr(r, "OMP_WAIT_POLICY=active"), "%s", r);
    cr_expect(strstr(r, "denormals kept"), "%s", r);
    /* BLAS single-threaded whatever the OpenMP count; nothing that needs a new image was set. */
    cr_expect(strstr(r, "set by kiln: OPENBLAS_NUM_THREADS") && !strstr(r, "GOMP_SPINCOUNT OPENBLAS"), "%s", r);
    cr_expect(strstr(r, "GOMP_SPINCOUNT=unset"), "%s", r);
    free(out);
    /* KILN_ENV_READY (set by the first image) means: never re-execute. */
    out = run_mlp("KILN_VERBOSE=1 KILN_ENV_READY=1", "--help");
    r = report_of(out);
    cr_expect(strstr(r, "OMP_WAIT_POLICY=unset"), "%s", r);
    free(out);
    /* --threads sets OpenMP's count; BLAS stays single-threaded, or as the user set it. */
    out = run_mlp("KILN_VERBOSE=1 OMP_NUM_THREADS=2", "--threads 1 --help");
    cr_expect(strstr(out, "kiln: --threads 1: 1 thread\n"), "%s", out);
    free(out);
    out = run_mlp("KILN_VERBOSE=1 OPENBLAS_NUM_THREADS=2", "--threads 3 --help");
    cr_expect(strstr(out, "kiln: --threads 3: 3 threads, BLAS 2\n"), "%s", out);
    free(out);
}

Test(env_program, started_through_the_loader_it_does_not_reexecute)
{
    /* /proc/self/exe is then the loader: executing it would run the loader with the
     * program's arguments. The program goes on without the new image. */
    const char *ld = "/lib64/ld-linux-x86-64.so.2";
    if (access(ld, X_OK) != 0) cr_skip_test("no %s", ld);
    char vars[256];
    snprintf(vars, sizeof vars, "KILN_VERBOSE=1 %s", ld);
    char *out = run_mlp(vars, "--help");
    cr_expect(strstr(out, "usage: mlp"), "%s", out);
    char *r = report_of(out);
    cr_expect(strstr(r, "OMP_WAIT_POLICY=unset") && strstr(r, "not re-executed"), "%s", r);
    free(out);
}

/* A stand-in for openblas_get_corename (LD_PRELOAD) that reports the old Prescott core
 * unless OPENBLAS_CORETYPE is set, as OpenBLAS does on CPUs it does not know. */
static const char *shim_c = "#define _GNU_SOURCE\n"
                            "#include <dlfcn.h>\n"
                            "#include <stdlib.h>\n"
                            "char *openblas_get_corename(void);\n"
                            "char *openblas_get_corename(void)\n"
                            "{\n"
                            "    if (!getenv(\"OPENBLAS_CORETYPE\")) return \"Prescott\";\n"
                            "    char *(*real)(void) = (char *(*)(void))dlsym(RTLD_NEXT, \"openblas_get_corename\");\n"
                            "    return real ? real() : \"none\";\n"
                            "}\n";

Test(env_program, old_blas_core_is_replaced_once)
{
    const char *best = krt_cpu_blas_core();
    if (!best) cr_skip_test("this CPU has neither AVX-512 nor AVX2: no faster OpenBLAS kernels to choose");
    char path[256], cmd[1024];
    snprintf(path, sizeof path, "%s/shim.c", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(shim_c, f);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "%s -shared -fPIC -o %s/shim.so %s -ldl", KILN_CC, dir, path);
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data);
    sb_free(&out);
    /* An ASan program wants its runtime first; the stand-in has none to conflict with. */
    snprintf(cmd, sizeof cmd, "KILN_VERBOSE=1 LD_PRELOAD=%s/shim.so ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0", dir);
    char *text = run_mlp(cmd, "--help");
    char *r = report_of(text);
    cr_expect(strstr(r, "GOMP_SPINCOUNT OPENBLAS_CORETYPE"), "OPENBLAS_CORETYPE was not set: %s", r);
    cr_expect(core_is_fast(r, best), "this CPU runs %s kernels, but: %s", best, r);
    free(text);
    /* The user's choice of the old core stands. */
    text = run_mlp("KILN_VERBOSE=1 OPENBLAS_CORETYPE=Prescott", "--help");
    cr_expect(strstr(report_of(text), "BLAS core Prescott"), "%s", text);
    free(text);
}
