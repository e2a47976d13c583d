/* test_cuda_train.c — the CUDA target's training programs against the C target's, without a
 * GPU: `kiln build --target cuda-emu` compiles the same model.cu and the same CUDA host
 * runtime (runtime/cuda/device.cu) that --target cuda compiles with nvcc, against Kiln's
 * CUDA emulator. For mlp, cnn and gpt (its attention fused, as both targets compute it by
 * default, and as written):
 *   - N steps give the C program's losses within 1e-4 relative, step by step, and its
 *     evaluation loss;
 *   - a run resumed from its own checkpoint halfway ends with the same checkpoint, bit for
 *     bit, as the run that did not stop;
 *   - the shuffled and reversed thread orders give the forward order's losses exactly;
 *   - a checkpoint of the CUDA program resumes in the C program (same file format, same
 *     model hash), and the C program's in the CUDA program.
 * The sanitizer build runs the shuffled order only, no resume across targets and gpt with
 * dropout only: repeated runs of the same code for a numerical verdict (tests/support.h,
 * SUPPORT_REPEAT_RUNS).
 * --target cuda builds (NVRTC and Clang), and the program says that there is no GPU and
 * exits 1 on a machine without one; on a GPU it has no CUBIN for, it compiles its kernels
 * with NVRTC (played by the emulator). Sizes are cut for CI's time (cnn at batch 8, gpt at T 32,
 * batch 2). */
#define _DEFAULT_SOURCE /* mkstemps */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../cli/build.h"
#include "ckpt_compare.h"
#include "support.h"

#ifndef KILN_NVCC
#define KILN_NVCC ""
#endif

typedef struct {
    const char *model, *build_flags, *run_flags;
    int steps;
    double tol; /* the losses' relative difference from the C program's: 1e-4 unless set */
    const char *counted; /* a log value that must be equal in both and reach 1 or more (or NULL) */
} Case;

static const Case mlp_case = {"mlp", "", "--batch 32 --eval-batches 2", 20, 0, NULL};
static const Case cnn_case = {"cnn", "", "--batch 8 --eval-batches 1", 5, 0, NULL};
static const Case gpt_case = {"gpt", "--bound T=32", "--batch 2 --eval-batches 1 --sample-tokens 0", 5, 0, NULL};

static void build(const char *dir, const Case *t, const char *target, const char *name)
{
    char args[1024];
    StrBuf out;
    sb_init(&out);
    if (t->model[0] == '/') /* a model file the test wrote */
        snprintf(args, sizeof args, "build %s %s --target %s -o %s/%s", t->model, t->build_flags, target, dir, name);
    else
        snprintf(args, sizeof args, "build %s/models/%s.kiln %s --target %s -o %s/%s", KILN_SOURCE_DIR, t->model, t->build_flags, target, dir, name);
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args, out.data ? out.data : "");
    sb_free(&out);
}

/* Runs dir/prog with the case's flags plus `extra`, in dir; fails the test unless it exits 0. */
static void run(const char *dir, const char *env, const char *prog, const Case *t, const char *extra)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s ./%s %s %s", env, prog, t->run_flags, extra);
    StrBuf out;
    sb_init(&out);
    int rc = support_run_in(dir, cmd, &out);
    cr_assert_eq(rc, 0, "%s (in %s) exited %d:\n%s", cmd, dir, rc, out.data ? out.data : "");
    sb_free(&out);
}

/* The "loss" (or "eval_loss") values of a JSONL log, in order; returns how many. */
static int losses(const char *path, const char *key, double *v, int cap)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "no log %s", path);
    char line[4096], pat[64];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, pat);
        if (p && (p == line || p[-1] != '_')) v[n++] = strtod(p + strlen(pat), NULL);
    }
    fclose(f);
    return n;
}

/* dir/ck/<newest step>/file */
static void newest(char *buf, size_t cap, const char *dir, const char *ck, const char *file)
{
    char d[512], found[4096];
    int64_t step;
    krt_error err;
    snprintf(d, sizeof d, "%s/%s", dir, ck);
    cr_assert_eq(krt_ckpt_find(d, found, sizeof found, &step, NULL, &err), KRT_OK, "%s", err.msg);
    snprintf(buf, cap, "%s/%s", found, file);
}

static void same_losses(const char *a, const char *b, const char *key, double tol, int want)
{
    double x[256], y[256];
    int n = losses(a, key, x, 256), m = losses(b, key, y, 256);
    cr_assert_eq(n, m, "%s has %d %s values, %s %d", a, n, key, b, m);
    cr_assert(want < 0 || n == want, "%s has %d %s values, not %d", a, n, key, want);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        double rel = fabs(x[i] - y[i]) / fmax(fabs(x[i]), 1e-30);
        cr_expect(rel <= tol, "%s %d: %.9g in %s, %.9g in %s (relative difference %.3g > %.3g)", key, i + 1, x[i], a, y[i], b, rel, tol);
        worst = rel > worst ? rel : worst;
    }
    /* the logs hold 6 significant digits: 0 means equal to that precision */
    printf("%s vs %s: %d %s values, worst relative difference %.3g\n", strrchr(a, '/') + 1, strrchr(b, '/') + 1, n, key, worst);
    fflush(stdout);
}

static void train_against_c(const Case *t)
{
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/kiln-cudatrain-%s-XXXXXX", t->model[0] == '/' ? "file" : t->model);
    cr_assert(mkdtemp(dir));
    build(dir, t, "c", "prog-c");
    build(dir, t, "cuda-emu", "prog-emu");
    char extra[512], path[512], other[512];
    const int n = t->steps, half = t->steps / 2;
    /* the whole run, each program */
    snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-c --log c.log", n);
    run(dir, "", "prog-c", t, extra);
    snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-emu --log emu.log", n);
    run(dir, "", "prog-emu", t, extra);
    snprintf(path, sizeof path, "%s/c.log", dir);
    snprintf(other, sizeof other, "%s/emu.log", dir);
    const double tol = t->tol > 0 ? t->tol : 1e-4;
    same_losses(path, other, "loss", tol, n);
    same_losses(path, other, "eval_loss", tol, 1);
    if (t->counted) {
        same_losses(path, other, t->counted, 0, n);
        double v[256];
        const int m = losses(path, t->counted, v, 256);
        cr_expect(m > 0 && v[m - 1] >= 1, "%s: %s never reaches 1", path, t->counted);
    }
    /* other thread orders: the same bits */
    static const char *const orders[] = {"shuffle", "reverse"};
    for (int i = 0; i < (SUPPORT_REPEAT_RUNS ? 2 : 1); i++) {
        char env[64];
        snprintf(env, sizeof env, "KILN_CUDA_EMU_ORDER=%s", orders[i]);
        snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-%s --log %s.log", n, orders[i], orders[i]);
        run(dir, env, "prog-emu", t, extra);
        snprintf(path, sizeof path, "%s/%s.log", dir, orders[i]);
        same_losses(other, path, "loss", 0, n);
        same_losses(other, path, "eval_loss", 0, 1);
        char a[4200], b[4200], ck[64];
        snprintf(ck, sizeof ck, "ck-%s", orders[i]);
        newest(a, sizeof a, dir, "ck-emu", "model.safetensors");
        newest(b, sizeof b, dir, ck, "model.safetensors");
        const char *why = ckpt_difference(a, b);
        cr_expect(!why, "order %s: %s", orders[i], why);
    }
    /* stopped halfway and resumed: the same final checkpoint, bit for bit */
    snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-half", half);
    run(dir, "", "prog-emu", t, extra);
    snprintf(extra, sizeof extra, "--steps %d --resume ck-half --checkpoint-dir ck-half --log resumed.log", n);
    run(dir, "", "prog-emu", t, extra);
    static const char *const files[] = {"model.safetensors", "train_state.safetensors"};
    for (int f = 0; f < 2; f++) {
        char a[4200], b[4200];
        newest(a, sizeof a, dir, "ck-emu", files[f]);
        newest(b, sizeof b, dir, "ck-half", files[f]);
        const char *why = ckpt_difference(a, b);
        cr_expect(!why, "resumed at step %d: %s", half, why);
    }
    /* across targets: the CUDA program's checkpoint in the C program, and back */
    if (!SUPPORT_REPEAT_RUNS) {
        support_remove_dir(dir);
        return;
    }
    snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-emu-half", half);
    run(dir, "", "prog-emu", t, extra);
    snprintf(extra, sizeof extra, "--steps %d --resume ck-emu-half --checkpoint-dir ck-emu-half --log c-from-emu.log", n);
    run(dir, "", "prog-c", t, extra);
    snprintf(extra, sizeof extra, "--steps %d --checkpoint-dir ck-c-half", half);
    run(dir, "", "prog-c", t, extra);
    snprintf(extra, sizeof extra, "--steps %d --resume ck-c-half --checkpoint-dir ck-c-half --log emu-from-c.log", n);
    run(dir, "", "prog-emu", t, extra);
    snprintf(path, sizeof path, "%s/c-from-emu.log", dir);
    snprintf(other, sizeof other, "%s/emu-from-c.log", dir);
    same_losses(path, other, "loss", tol, n - half);
    support_remove_dir(dir);
}

Test(cuda_train, mlp_trains_as_the_c_program, .timeout = 600) { train_against_c(&mlp_case); }

Test(cuda_train, cnn_trains_as_the_c_program, .timeout = 600) { train_against_c(&cnn_case); }

/* The sanitizer build trains gpt with dropout only (below): the same program but for
 * dropout's kernels, and test_cuda_codegen's gpt_kernels runs every kernel of this one
 * sanitized. */
Test(cuda_train, gpt_trains_as_the_c_program, .timeout = 600)
{
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: gpt_with_dropout_trains_as_the_c_program covers this program (support.h)");
    train_against_c(&gpt_case);
}

/* llama: attention written out of rotary and scaled_dot_product_attention, grouped-query
 * heads (4 over 2): the fused kernels read the fewer key/value heads on both targets. */
Test(cuda_train, llama_trains_as_the_c_program, .timeout = 600)
{
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: gpt_with_dropout covers the fused attention's kernels (support.h)");
    Case t = gpt_case;
    t.model = "llama";
    train_against_c(&t);
}

/* Attention as written (--attention unfused) on both targets: the CUDA program's batched
 * products and softmax kernels, which the fused kernels replace by default. */
Test(cuda_train, gpt_unfused_attention_trains_as_the_c_program, .timeout = 600)
{
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: test_cuda_codegen's gpt_kernels covers these kernels (support.h)");
    Case t = gpt_case;
    t.build_flags = "--bound T=32 --attention unfused";
    train_against_c(&t);
}

/* gpt with dropout in attention and MLP (0.1): the CUDA kernels draw the C program's
 * counter-based numbers, element for element, so the runs agree as without dropout, and a
 * resumed run draws what the uninterrupted one drew. */
Test(cuda_train, gpt_with_dropout_trains_as_the_c_program, .timeout = 600)
{
    size_t len;
    char *text = support_read("models/gpt.kiln", &len);
    cr_assert(text);
    StrBuf m;
    sb_init(&m);
    for (const char *p = text; *p;) {
        if (!strncmp(p, "CausalSelfAttention(C, H)", 25)) {
            sb_puts(&m, "CausalSelfAttention(C, H, dropout = 0.1)");
            p += 25;
        } else if (!strncmp(p, "MLP(C, 4 * C)", 13)) {
            sb_puts(&m, "MLP(C, 4 * C, dropout = 0.1)");
            p += 13;
        } else {
            sb_putc(&m, *p++);
        }
    }
    cr_assert(strstr(m.data, "dropout = 0.1)") && strstr(strstr(m.data, "dropout = 0.1)") + 1, "dropout = 0.1)"), "models/gpt.kiln changed");
    char path[] = "/tmp/kiln-gptdrop-XXXXXX.kiln";
    int fd = mkstemps(path, 5);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, m.data, m.len), (ssize_t)m.len);
    close(fd);
    Case t = gpt_case;
    t.model = path;
    train_against_c(&t);
    unlink(path);
    sb_free(&m);
    free(text);
}

/* Mixed precision: the precision pass's program (half-precision activations, matrix
 * products of widened copies) on the device as on the host, and fp16's loss scaling with
 * its unscale, norm and skipped steps on the device (device.cu) as train_main.c does them
 * on the host; the scale and its counters resume across targets. */
Test(cuda_train, gpt_bf16_trains_as_the_c_program, .timeout = 600)
{
    /* the sanitizer build: test_cuda_codegen's gpt_bf16_kernels runs every kernel of this
     * program sanitized, and mlp_fp16 below the device's half-precision host paths */
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: gpt_bf16_kernels and mlp_fp16 cover this program (support.h)");
    Case t = gpt_case;
    t.build_flags = "--bound T=32 --precision bf16";
    train_against_c(&t);
}

/* fp16 from a loss scale of 2^40: the first steps overflow, are skipped and back off, then
 * the scale doubles after every 3 clean steps; the same steps skipped as by the C program. */
static void mlp_variant(const char *old, const char *new_text, int steps, const char *counted);
Test(cuda_train, mlp_fp16_trains_as_the_c_program, .timeout = 600)
{
    mlp_variant("    batch     = 128\n",
                "    batch     = 128\n    precision = fp16\n    loss_scale_init = 2 ** 40\n    loss_scale_growth_interval = 3\n", 20,
                "skipped_steps");
}

/* mlp with `old` of its file replaced by new_text, trained `steps` steps as above. */
static void mlp_variant(const char *old, const char *new_text, int steps, const char *counted)
{
    size_t len;
    char *text = support_read("models/mlp.kiln", &len);
    cr_assert(text);
    char *at = strstr(text, old);
    cr_assert(at, "models/mlp.kiln changed: no '%s'", old);
    char path[] = "/tmp/kiln-mlpvar-XXXXXX.kiln";
    int fd = mkstemps(path, 5);
    cr_assert(fd >= 0);
    FILE *f = fdopen(fd, "w");
    cr_assert(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, new_text, at + strlen(old));
    fclose(f);
    Case t = mlp_case;
    t.model = path;
    t.steps = steps;
    t.counted = counted;
    train_against_c(&t);
    unlink(path);
    free(text);
}

/* mlp with the optimizer replaced: the device's kernels of issue 20's optimizers
 * (device.cu, sharing optim_elem.h with the host) against the C program, and resumed. */
static void mlp_with_optimizer(const char *optimizer)
{
    mlp_variant("AdamW(lr = 1e-3, weight_decay = 0.01)", optimizer, 6, NULL);
}

Test(cuda_train, mlp_rmsprop_centered_momentum_as_the_c_program, .timeout = 600)
{
    mlp_with_optimizer("RMSprop(lr = 1e-3, momentum = 0.9, centered = true, weight_decay = 0.01)");
}
Test(cuda_train, mlp_adagrad_as_the_c_program, .timeout = 600)
{
    mlp_with_optimizer("Adagrad(lr = 0.01, lr_decay = 0.01, initial_accumulator_value = 0.1, weight_decay = 0.01)");
}
Test(cuda_train, mlp_adamw_amsgrad_as_the_c_program, .timeout = 600) { mlp_with_optimizer("AdamW(lr = 1e-3, amsgrad = true)"); }
Test(cuda_train, mlp_lion_as_the_c_program, .timeout = 600) { mlp_with_optimizer("Lion(lr = 1e-4, weight_decay = 0.1)"); }

/* --target cuda: nvcc builds the program (sm_80 and sm_90); without a GPU it says so. */
/* With no compiler or linker on PATH, kiln builds an emulated program in its own process
 * (cli/emu_build.c: Clang as C++17, lld); it trains to the same bits as the program the
 * external C++ compiler builds (--cc: the external compilers, g++ for model.cu). */
Test(cuda_train, emulated_program_built_in_process_as_with_gxx, .timeout = 600)
{
    if (!KILN_IN_PROCESS_DEFAULT) cr_skip_test("kiln was built without Clang's libraries");
    char dir[128], cmd[2048];
    snprintf(dir, sizeof dir, "/tmp/kiln-cudatrain-ip-XXXXXX");
    cr_assert(mkdtemp(dir));
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "env PATH=/nonexistent %s build %s/models/mlp.kiln --target cuda-emu -o %s/prog-ip", KILN_BINARY, KILN_SOURCE_DIR,
             dir);
    cr_assert_eq(support_run(cmd, &out), 0, "%s:\n%s", cmd, out.data ? out.data : "");
    out.len = 0;
    snprintf(cmd, sizeof cmd, "build %s/models/mlp.kiln --target cuda-emu --cc %s -o %s/prog-ex", KILN_SOURCE_DIR, KILN_CC, dir);
    cr_assert_eq(support_run_kiln(cmd, &out), 0, "kiln %s:\n%s", cmd, out.data ? out.data : "");
    sb_free(&out);
    run(dir, "", "prog-ip", &mlp_case, "--steps 6 --checkpoint-dir ck-ip");
    run(dir, "", "prog-ex", &mlp_case, "--steps 6 --checkpoint-dir ck-ex");
    char a[512], b[512];
    newest(a, sizeof a, dir, "ck-ip", "model.safetensors");
    newest(b, sizeof b, dir, "ck-ex", "model.safetensors");
    const char *why = ckpt_tensor_difference(a, b);
    cr_expect(!why, "the in-process emulated build trains otherwise than g++'s: %s", why);
    support_remove_dir(dir);
}

/* A GPU the program has no CUBIN for (the emulator plays an sm_86): the program compiles
 * its embedded kernels with NVRTC for exactly that architecture, says so before the run,
 * caches the CUBIN and reads it the next time; KILN_CUDA_JIT=1 takes the same path on a
 * GPU it has CUBINs for; a damaged cache entry is compiled again. The emulator runs the
 * CUBIN's kernels by their names: the losses are the default run's, bit for bit. */
static void run_logged(const char *dir, const char *env, const char *log, StrBuf *out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s ./prog-emu %s --steps 3 --checkpoint-dir ck --log %s", env, mlp_case.run_flags, log);
    out->len = 0;
    const int rc = support_run_in(dir, cmd, out);
    cr_assert_eq(rc, 0, "%s:\n%s", cmd, out->data ? out->data : "");
}

Test(cuda_train, nvrtc_compiles_the_kernels_for_a_gpu_without_cubins, .timeout = 600)
{
    if (!*KILN_NVCC) cr_skip_test("no CUDA toolkit: no NVRTC");
    char dir[] = "/tmp/kiln-cudajit-XXXXXX";
    cr_assert(mkdtemp(dir));
    build(dir, &mlp_case, "cuda-emu", "prog-emu");
    StrBuf out;
    sb_init(&out);
    char env[1024], a[600], b[600];
    run_logged(dir, "", "default.jsonl", &out);
    cr_expect(!strstr(out.data, "NVRTC"), "%s", out.data);
    snprintf(env, sizeof env, "XDG_CACHE_HOME=%s/cache KILN_CUDA_EMU_ARCH=sm_86", dir);
    run_logged(dir, env, "jit.jsonl", &out);
    cr_expect(strstr(out.data, "mlp: the kernels compiled for this GPU (sm_86) by NVRTC") && strstr(out.data, "the program carrying no CUBIN for it; cached in "),
              "%s", out.data);
    snprintf(a, sizeof a, "%s/default.jsonl", dir);
    snprintf(b, sizeof b, "%s/jit.jsonl", dir);
    same_losses(a, b, "loss", 0, 3);
    run_logged(dir, env, "jit2.jsonl", &out);
    cr_expect(strstr(out.data, "mlp: the kernels compiled earlier for this GPU (sm_86) by NVRTC") && strstr(out.data, "; read from "), "%s", out.data);
    /* every entry damaged: compiled again */
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "for f in '%s'/cache/kiln/cuda-jit/*.cubin; do head -c 100 \"$f\" > \"$f.x\" && mv \"$f.x\" \"$f\"; done", dir);
    StrBuf sh;
    sb_init(&sh);
    cr_assert_eq(support_run(cmd, &sh), 0, "%s", sh.data);
    sb_free(&sh);
    run_logged(dir, env, "jit3.jsonl", &out);
    cr_expect(strstr(out.data, "mlp: the kernels compiled for this GPU (sm_86)"), "%s", out.data);
    snprintf(b, sizeof b, "%s/jit3.jsonl", dir);
    same_losses(a, b, "loss", 0, 3);
    if (SUPPORT_REPEAT_RUNS) {
        snprintf(env, sizeof env, "XDG_CACHE_HOME=%s/cache KILN_CUDA_JIT=1", dir);
        run_logged(dir, env, "forced.jsonl", &out);
        cr_expect(strstr(out.data, "mlp: the kernels compiled for this GPU (sm_80) by NVRTC") && strstr(out.data, "(KILN_CUDA_JIT=1)"), "%s", out.data);
        snprintf(env, sizeof env, "KILN_CACHE_MAX_BYTES=0 KILN_CUDA_EMU_ARCH=sm_90");
        run_logged(dir, env, "jit4.jsonl", &out); /* sm_90: the program's own */
        cr_expect(!strstr(out.data, "NVRTC"), "%s", out.data);
        snprintf(env, sizeof env, "KILN_CACHE_MAX_BYTES=0 KILN_CUDA_EMU_ARCH=sm_75");
        run_logged(dir, env, "jit5.jsonl", &out);
        cr_expect(strstr(out.data, "(sm_75) by NVRTC") && strstr(out.data, "not cached (no cache directory)"), "%s", out.data);
    }
    /* an architecture NVRTC does not know: the program stops before training, saying why */
    char cmd2[1024];
    snprintf(cmd2, sizeof cmd2, "KILN_CACHE_MAX_BYTES=0 KILN_CUDA_EMU_ARCH=sm_990 ./prog-emu %s --steps 1 --checkpoint-dir ck", mlp_case.run_flags);
    out.len = 0;
    cr_expect_eq(support_run_in(dir, cmd2, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "failed on model.cu's kernels for sm_990") && !strstr(out.data, "step 1/1"), "%s", out.data);
    sb_free(&out);
    support_remove_dir(dir);
}

Test(cuda_train, gpu_program_without_a_gpu_says_so, .timeout = 600)
{
    if (!*KILN_NVCC) {
        cr_skip_test("no CUDA toolkit: --target cuda cannot be built here");
    }
    if (!SUPPORT_RUN_NVCC) cr_skip_test("the GPU program is built and run in the optimised build (tests/support.h)");
    char dir[] = "/tmp/kiln-cudagpu-XXXXXX";
    cr_assert(mkdtemp(dir));
    build(dir, &mlp_case, "cuda", "prog-gpu");
    StrBuf out;
    sb_init(&out);
    int rc = support_run_in(dir, "./prog-gpu --steps 1", &out);
    const char *msg = out.data ? out.data : "";
    if (rc == 0) {
        /* a machine with a GPU: it trained */
        cr_expect(strstr(msg, "step 1/1"), "%s", msg);
    } else {
        cr_expect_eq(rc, 1, "%s", msg);
        cr_expect(strstr(msg, "mlp: error: no CUDA GPU"), "%s", msg);
        cr_expect(!strstr(msg, "step 1/1"), "%s", msg);
    }
    sb_free(&out);
    support_remove_dir(dir);
}

/* A model that does not fit the GPU's free memory is refused before it starts, with both
 * figures (the emulator plays a 48 MiB GPU: KILN_CUDA_EMU_MEMORY). */
Test(cuda_train, a_model_too_big_for_the_gpu_is_refused_with_both_figures, .timeout = 300)
{
    char dir[] = "/tmp/kiln-cudamem-XXXXXX";
    cr_assert(mkdtemp(dir));
    build(dir, &mlp_case, "cuda-emu", "prog-emu");
    StrBuf out;
    sb_init(&out);
    int rc = support_run_in(dir, "KILN_CUDA_EMU_MEMORY=48M ./prog-emu --steps 1 --checkpoint-dir ck", &out);
    const char *msg = out.data ? out.data : "";
    cr_expect_eq(rc, 1, "%s", msg);
    cr_expect(strstr(msg, "mlp: error: the model needs ") && strstr(msg, " MiB more device memory") && strstr(msg, "MiB free of 48.0 MiB"),
              "%s", msg);
    cr_expect(!strstr(msg, "step 1/1"), "%s", msg);
    /* with enough memory it trains */
    rc = support_run_in(dir, "KILN_CUDA_EMU_MEMORY=1G ./prog-emu --steps 1 --batch 8 --eval-batches 1 --checkpoint-dir ck", &out);
    cr_expect_eq(rc, 0, "%s", out.data ? out.data : "");
    sb_free(&out);
    support_remove_dir(dir);
}
