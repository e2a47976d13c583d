/* test_cuda_nvrtc.c — the CUDA target's kernels through NVRTC in the kiln process
 * (driver/nvrtc.h, codegen/cuda_device.h, cli/cuda_report.h), no GPU needed:
 *   - every model of models/ (training in fp32, bf16 and fp16, inference, a distributed
 *     program) has its device code cut out of model.cu and compiled by NVRTC for sm_80 and
 *     sm_90; every kernel of model.cu is in ptxas's report for both, none spills registers,
 *     and none has a stack frame but llama's sinf/cosf kernels (their exact argument
 *     reduction keeps a small array in local memory); and each builds into a GPU program
 *     with no nvcc on PATH (kiln build --target cuda: NVRTC and the Clang inside kiln);
 *   - kiln build --target cuda --report prints the table, a line per kernel;
 *   - the pieces' CUBINs and reports are cached: a second compile reads them all, a
 *     changed kernel recompiles its piece (and the next, when its boundary moved);
 *   - the device source keeps model.cu's line numbers (NVRTC's errors name model.cu's
 *     lines), and a file it cannot cut is an error, not a crash;
 *   - ptxas's report is read as ptxas writes it;
 *   - model.cu's host source (its kernels declared, launched by name through the driver
 *     API: kiln_cuda.h's KILN_CUDA_DRIVER) compiles as C++ against the toolkit's headers.
 * The sanitizer build compiles mlp alone: NVRTC's verdict is not the sanitizers' business. */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../codegen/cuda_device.h"
#include "../cli/cuda_report.h"
#include "support.h"

static bool have_nvrtc(void)
{
    const char *why;
    return nvrtc_available(&why);
}

/* A cache of this test's own (XDG_CACHE_HOME), so that NVRTC compiles what it is asked to;
 * removed by the caller with support_remove_dir. */
static char *own_cache(void)
{
    char *dir = xstrdup("/tmp/kiln-nvrtcc-XXXXXX");
    cr_assert(mkdtemp(dir));
    setenv("XDG_CACHE_HOME", dir, 1);
    return dir;
}

/* model.cu of `kiln emit FILE --target cuda FLAGS` (malloc'd). */
static char *emit_cuda(const char *model, const char *flags, size_t *len)
{
    char dir[] = "/tmp/kiln-nvrtc-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024], path[1100];
    snprintf(args, sizeof args, "emit %s/models/%s.kiln --target cuda %s -o %s/out", KILN_SOURCE_DIR, model, flags, dir);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln %s: %s", args, out.data ? out.data : "");
    sb_free(&out);
    snprintf(path, sizeof path, "%s/out/model.cu", dir);
    StrBuf err;
    sb_init(&err);
    char *text = util_read_file(path, len, &err);
    cr_assert(text, "%s", err.data);
    sb_free(&err);
    support_remove_dir(dir);
    return text;
}

static void check_model(const char *model, const char *flags)
{
    size_t len;
    char *text = emit_cuda(model, flags, &len);
    CudaReport r;
    StrBuf err;
    sb_init(&err);
    int rc = cuda_report_compile(text, len, "model.cu", &r, &err);
    cr_assert_eq(rc, 0, "%s %s: %s", model, flags, err.data ? err.data : "");
    /* every kernel: the __global__ definitions, a template's once per instance launched */
    const int want = r.nglobal - r.ntemplates + r.ninstances;
    int stack = 0, spilling = 0, max_regs = 0;
    for (int i = 0; i < r.nkernels; i++) {
        const NvrtcKernelReport *k = &r.kernels[i];
        cr_expect_gt(k->registers, 0, "%s %s: %s (%s) without registers", model, flags, k->name, k->arch);
        spilling += k->spill_stores > 0 || k->spill_loads > 0;
        stack += k->stack > 0;
        if (k->registers > max_regs) max_regs = k->registers;
        if (k->stack) cr_expect(strstr(k->name, "sin") || strstr(k->name, "cos"), "%s %s: %s has a stack frame", model, flags, k->name);
    }
    printf("nvrtc %s %s: %d kernels for sm_80 and sm_90 in %.2f s, %d spilling, %d with a stack frame, at most %d registers\n", model, flags,
           r.kernels_per_arch[0], r.seconds, spilling, stack, max_regs);
    for (int k = 0; k < CUDA_REPORT_NARCH; k++)
        cr_expect_eq(r.kernels_per_arch[k], want, "%s %s: %d kernels in ptxas's report for %s, model.cu has %d", model, flags, r.kernels_per_arch[k],
                     cuda_report_arch[k], want);
    cr_expect_eq(spilling, 0, "%s %s: %d kernels spill", model, flags, spilling);
    if (strcmp(model, "llama")) cr_expect_eq(stack, 0, "%s %s", model, flags);
    else cr_expect_leq(stack, 8, "%s %s: %d kernel reports with a stack frame", model, flags, stack);
    cuda_report_free(&r);
    sb_free(&err);
    free(text);
}

/* PATH without the directories that hold nvcc (malloc'd). */
static char *path_without_nvcc(void)
{
    const char *path = getenv("PATH");
    StrBuf out;
    sb_init(&out);
    for (const char *p = path ? path : ""; *p;) {
        const size_t n = strcspn(p, ":");
        char probe[4200];
        snprintf(probe, sizeof probe, "%.*s/nvcc", (int)n, p);
        if (n && access(probe, X_OK) != 0) sb_printf(&out, "%s%.*s", out.len ? ":" : "", (int)n, p);
        p += n + (p[n] == ':');
    }
    return out.data ? sb_take(&out) : xstrdup("/usr/bin:/bin");
}

/* kiln build --target cuda FLAGS of the model, with no nvcc on PATH, builds (that the
 * program starts: test_cuda_train's gpu_program_without_a_gpu_says_so). */
static void build_without_nvcc(const char *model, const char *flags, const char *dir)
{
    char *path = path_without_nvcc();
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "PATH='%s' '%s' build '%s/models/%s.kiln' --target cuda %s -o '%s/prog' 2>&1", path, KILN_BINARY, KILN_SOURCE_DIR, model,
             flags, dir);
    free(path);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run(cmd, &out), 0, "kiln build %s --target cuda %s without nvcc:\n%s", model, flags, out.data ? out.data : "");
    printf("built %s %s --target cuda without nvcc\n", model, flags);
    sb_free(&out);
}

Test(cuda_nvrtc, every_model_compiles_for_sm80_and_sm90_without_spills, .timeout = 1200)
{
    if (!have_nvrtc()) cr_skip_test("no NVRTC: Kiln was built without a CUDA toolkit");
    char *cache = own_cache();
    char dir[] = "/tmp/kiln-nvrtcb-XXXXXX";
    cr_assert(mkdtemp(dir));
    /* every variant's kernels, then its program built without nvcc (model.cu's pieces from
     * the cache the first filled) */
    static const char *const models[] = {"mlp", "cnn", "gpt", "gpt2-124m", "llama"};
    static const char *const variants[] = {"", "--infer", "--distributed", "--precision bf16", "--precision fp16"};
    for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        for (size_t v = 0; v < sizeof variants / sizeof *variants; v++) {
            if (SUPPORT_SANITIZED && (m > 0 || v > 2)) break;
            if (!strcmp(models[m], "gpt2-124m") && v > 2) continue; /* its kernels are gpt's, wider */
            check_model(models[m], variants[v]);
            build_without_nvcc(models[m], variants[v], dir);
        }
    support_remove_dir(dir);
    support_remove_dir(cache);
    free(cache);
}

Test(cuda_nvrtc, pieces_are_cached_and_a_changed_kernel_compiles_alone, .timeout = 300)
{
    if (!have_nvrtc()) cr_skip_test("no NVRTC: Kiln was built without a CUDA toolkit");
    char *cache = own_cache();
    size_t len;
    char *text = emit_cuda("gpt", "", &len);
    CudaReport r[3];
    StrBuf err;
    sb_init(&err);
    cr_assert_eq(cuda_report_compile(text, len, "model.cu", &r[0], &err), 0, "%s", err.data);
    cr_assert_eq(cuda_report_compile(text, len, "model.cu", &r[1], &err), 0, "%s", err.data);
    const int tasks = r[0].npieces * CUDA_REPORT_NARCH;
    cr_expect_gt(r[0].npieces, 1, "gpt's kernels in one piece");
    cr_expect_eq(r[0].cached, 0);
    cr_expect_eq(r[1].cached, tasks, "%d of %d from the cache", r[1].cached, tasks);
    cr_assert_eq(r[1].nkernels, r[0].nkernels);
    for (int i = 0; i < r[0].nkernels; i++) {
        cr_expect_str_eq(r[1].kernels[i].name, r[0].kernels[i].name);
        cr_expect_eq(r[1].kernels[i].registers, r[0].kernels[i].registers, "%s", r[0].kernels[i].name);
    }
    /* one kernel changed (a statement more): its piece is compiled again for each
     * architecture; lines added above the others (their #line) change nothing */
    const char *k = strstr(text, "train_wpe_fwd(");
    cr_assert(k, "no train_wpe_fwd in gpt's model.cu");
    const char *body = strstr(k, "\n{\n");
    cr_assert(body);
    StrBuf changed;
    sb_init(&changed);
    sb_puts(&changed, "/* a comment\n   of two lines */\n");
    sb_putn(&changed, text, (size_t)(body + 3 - text));
    sb_puts(&changed, "    if (blockDim.x == 0) return;\n");
    sb_puts(&changed, body + 3);
    cr_assert_eq(cuda_report_compile(changed.data, changed.len, "model.cu", &r[2], &err), 0, "%s", err.data);
    /* its piece, and the next when the kernel's hash made it a boundary before or after */
    const int compiled = tasks - r[2].cached;
    cr_expect(compiled == CUDA_REPORT_NARCH || compiled == 2 * CUDA_REPORT_NARCH, "%d of %d from the cache after one kernel changed", r[2].cached,
              tasks);
    for (int i = 0; i < 3; i++) cuda_report_free(&r[i]);
    sb_free(&changed);
    sb_free(&err);
    free(text);
    support_remove_dir(cache);
    free(cache);
}

Test(cuda_nvrtc, build_report_has_a_line_per_kernel, .timeout = 300)
{
    if (!have_nvrtc()) cr_skip_test("no NVRTC: Kiln was built without a CUDA toolkit");
    if (!SUPPORT_RUN_NVCC) cr_skip_test("the sanitizer build: the GPU program is built in the optimised build");
    char dir[] = "/tmp/kiln-nvrtcb-XXXXXX";
    cr_assert(mkdtemp(dir));
    char *cache = own_cache();
    char args[1024];
    snprintf(args, sizeof args, "build %s/models/mlp.kiln --target cuda --report -o %s/prog", KILN_SOURCE_DIR, dir);
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln(args, &out);
    const char *text = out.data ? out.data : "";
    cr_assert_eq(rc, 0, "%s", text);
    cr_expect(strstr(text, "kiln: device code: 18 kernels compiled by NVRTC "), "%s", text);
    cr_expect(strstr(text, " for sm_80 and sm_90 in "), "%s", text);
    cr_expect(strstr(text, "\n  train_Linear_fwd_epilogue "), "%s", text);
    cr_expect(strstr(text, "\n  kiln_sum_parts<float> "), "%s", text);
    cr_expect(strstr(text, "no kernel spills registers or has a stack frame\n"), "%s", text);
    cr_expect(strstr(text, ", 0 pieces of "), "%s", text);
    /* the recipe changed, not the model: no kernel compiled again */
    char model[256], cmd[2400];
    snprintf(model, sizeof model, "%s/mlp-lr.kiln", dir);
    snprintf(cmd, sizeof cmd, "sed 's/lr = 1e-3/lr = 2e-3/' '%s/models/mlp.kiln' > '%s' && grep -q 'lr = 2e-3' '%s'", KILN_SOURCE_DIR, model, model);
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data);
    out.len = 0;
    snprintf(args, sizeof args, "build %s --target cuda --report -o %s/prog", model, dir);
    rc = support_run_kiln(args, &out);
    text = out.data ? out.data : "";
    cr_assert_eq(rc, 0, "%s", text);
    const char *p = strstr(text, " pieces of ");
    cr_assert(p, "%s", text);
    const char *q = p;
    while (q > text && q[-1] >= '0' && q[-1] <= '9') q--;
    cr_expect_eq(atoi(q), atoi(p + strlen(" pieces of ")), "a recipe-only change compiled kernels again:\n%s", text);
    sb_free(&out);
    support_remove_dir(dir);
    support_remove_dir(cache);
    free(cache);
}

Test(cuda_nvrtc, device_source_keeps_model_lines_and_refuses_what_it_cannot_cut)
{
    const char *cu = "/* a model */\n"
                     "#include <math.h>\n"
                     "#include \"kiln_cuda_model.h\"\n"
                     "\n"
                     "template <typename T> __global__ void __launch_bounds__(32) sum(const T *a, T *b)\n"
                     "{\n"
                     "    b[0] = a[0]; /* } in a comment */\n"
                     "}\n"
                     "static void host(void)\n"
                     "{\n"
                     "    const char *s = \"{ in a string\";\n"
                     "    KILN_LAUNCH_AT(s, sum<float>, 1, 32, 0, 0, (const float *)0, (float *)0);\n"
                     "    KILN_LAUNCH_AT(s, sum<double>, 1, 32, 0, 0, (const double *)0, (double *)0);\n"
                     "    KILN_LAUNCH_AT(s, sum<float>, 1, 32, 0, 0, (const float *)0, (float *)0);\n"
                     "}\n"
                     "static __device__ inline float twice(float x) { return 2 * x; }\n"
                     "__global__ void __launch_bounds__(256) k(float *y)\n"
                     "{\n"
                     "    y[threadIdx.x] = twice(y[threadIdx.x]);\n"
                     "}\n"
                     "static const int table[] = {1, 2};\n";
    CudaDeviceSource s;
    StrBuf err;
    sb_init(&err);
    cr_assert_eq(cuda_device_source(cu, strlen(cu), "model.cu", &s, &err), 0, "%s", err.data);
    const char *t = s.text.data;
    cr_expect(!strstr(t, "<math.h>"), "%s", t);
    cr_expect(strstr(t, "#line 3 \"model.cu\"\n#include \"kiln_cuda_model.h\""), "%s", t);
    cr_expect(strstr(t, "#line 5 \"model.cu\"\ntemplate <typename T> __global__"), "%s", t);
    cr_expect(strstr(t, "#line 16 \"model.cu\"\nstatic __device__ inline float twice"), "%s", t);
    cr_expect(strstr(t, "#line 17 \"model.cu\"\n__global__ void __launch_bounds__(256) k(float *y)"), "%s", t);
    cr_expect(!strstr(t, "host(") && !strstr(t, "table"), "%s", t);
    cr_expect_eq(s.nkernels, 2);
    cr_expect_eq(s.ntemplates, 1);
    cr_assert_eq(s.nnames, 2);
    cr_expect_str_eq(s.names[0], "sum<float>");
    cr_expect_str_eq(s.names[1], "sum<double>");
    cuda_device_source_free(&s);
    /* a definition that never ends */
    const char *bad = "__global__ void k(float *y)\n{\n    y[0] = 1;\n";
    cr_expect_eq(cuda_device_source(bad, strlen(bad), "model.cu", &s, &err), -1);
    cr_expect(strstr(err.data, "model.cu:1: ") && strstr(err.data, "does not end"), "%s", err.data);
    sb_free(&err);
    /* NVRTC's error names model.cu's line */
    if (!have_nvrtc()) return;
    const char *broken = "#include \"kiln_cuda_model.h\"\n\n\n__global__ void k(float *y)\n{\n    y[0] = undefined_name;\n}\n";
    cr_assert_eq(cuda_device_source(broken, strlen(broken), "model.cu", &s, &err), 0);
    NvrtcOutput o;
    const char *const options[] = {"-I" KILN_SOURCE_DIR "/runtime/cuda", "-I" KILN_SOURCE_DIR "/runtime"};
    cr_expect_eq(nvrtc_compile(s.text.data, "model.cu", "sm_90", options, 2, NULL, 0, &o), -1);
    cr_expect(o.log && strstr(o.log, "model.cu(6)") && strstr(o.log, "undefined_name"), "%s", o.log ? o.log : "(no log)");
    nvrtc_output_free(&o);
    cuda_device_source_free(&s);
}

Test(cuda_nvrtc, ptxas_report_is_read_as_ptxas_writes_it)
{
    const char *log = "ptxas info    : 0 bytes gmem\n"
                      "ptxas info    : Compiling entry function '_Z13train_wpe_fwdllPKfPKlPf' for 'sm_90'\n"
                      "ptxas info    : Function properties for _Z13train_wpe_fwdllPKfPKlPf\n"
                      "ptxas         .     16 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads\n"
                      "ptxas info    : Used 30 registers, used 1 barriers, 128 bytes smem\n"
                      "ptxas info    : Compile time = 14.050 ms\n"
                      "ptxas info    : Compiling entry function '_Z14kiln_sum_partsIfEvPKT_iPS0_' for 'sm_80'\n"
                      "ptxas info    : Function properties for _Z14kiln_sum_partsIfEvPKT_iPS0_\n"
                      "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                      "ptxas info    : Used 38 registers, used 0 barriers, 400 bytes cmem[0]\n"
                      "ptxas info    : Compiling entry function 'plain_c_kernel' for 'sm_90'\n";
    NvrtcKernelReport *v;
    int n = nvrtc_report(log, &v);
    cr_assert_eq(n, 3);
    cr_expect_str_eq(v[0].name, "train_wpe_fwd");
    cr_expect_str_eq(v[0].arch, "sm_90");
    cr_expect_eq(v[0].registers, 30);
    cr_expect_eq(v[0].barriers, 1);
    cr_expect_eq(v[0].stack, 16);
    cr_expect_eq(v[0].spill_stores, 8);
    cr_expect_eq(v[0].spill_loads, 12);
    cr_expect_eq(v[0].shared, 128);
    cr_expect_str_eq(v[1].name, "kiln_sum_parts<float>");
    cr_expect_str_eq(v[1].arch, "sm_80");
    cr_expect_eq(v[1].registers, 38);
    cr_expect_eq(v[1].shared, 0);
    cr_expect_str_eq(v[2].name, "plain_c_kernel");
    cr_expect_eq(v[2].registers, 0);
    nvrtc_report_free(v, n);
    cr_expect_eq(nvrtc_report("", &v), 0);
    nvrtc_report_free(v, 0);
}

/* The host half of a GPU program whose kernels NVRTC compiles: model.cu without its device
 * functions, the kernels declared, compiled by the host C++ compiler against the toolkit's
 * headers with KILN_CUDA_DRIVER (kiln_cuda.h: launches by name through cuLaunchKernel). */
Test(cuda_nvrtc, host_source_compiles_against_the_driver_api, .timeout = 600)
{
    if (!have_nvrtc()) cr_skip_test("no CUDA toolkit");
    if (!SUPPORT_RUN_NVCC) cr_skip_test("the sanitizer build: the host compiler's verdict is the plain build's");
    static const struct {
        const char *model, *flags;
    } cases[] = {{"mlp", ""}, {"cnn", "--precision bf16"}, {"gpt", ""}, {"gpt", "--infer"}, {"llama", "--precision fp16"}};
    char dir[] = "/tmp/kiln-nvrtch-XXXXXX";
    cr_assert(mkdtemp(dir));
    StrBuf inc;
    sb_init(&inc);
    for (const char *p = KILN_CUDA_INCLUDE_DIRS; *p;) { /* CMake's list: ';' between */
        size_t n = strcspn(p, ";");
        if (n) sb_printf(&inc, "-I'%.*s' ", (int)n, p);
        p += n + (p[n] == ';');
    }
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t len;
        char *text = emit_cuda(cases[c].model, cases[c].flags, &len);
        CudaDeviceSource s;
        StrBuf err, out;
        sb_init(&err);
        sb_init(&out);
        cr_assert_eq(cuda_device_source(text, len, "model.cu", &s, &err), 0, "%s", err.data);
        cr_expect(!strstr(s.host.data, "__device__"), "%s %s: a device function in the host source", cases[c].model, cases[c].flags);
        char path[256], cmd[2048];
        snprintf(path, sizeof path, "%s/host%zu.cpp", dir, c);
        FILE *f = fopen(path, "w");
        cr_assert(f);
        fwrite(s.host.data, 1, s.host.len, f);
        fclose(f);
        snprintf(cmd, sizeof cmd, "'%s' -std=c++17 -fsyntax-only -Wall -Werror -DKILN_CUDA_DRIVER -I'%s/runtime/cuda' -I'%s/runtime' %s '%s' 2>&1", KILN_CXX,
                 KILN_SOURCE_DIR, KILN_SOURCE_DIR, inc.data ? inc.data : "", path);
        cr_expect_eq(support_run(cmd, &out), 0, "%s %s: the host source does not compile:\n%s", cases[c].model, cases[c].flags, out.data ? out.data : "");
        cuda_device_source_free(&s);
        sb_free(&err);
        sb_free(&out);
        free(text);
    }
    sb_free(&inc);
    support_remove_dir(dir);
}
