/* test_cuda_infer.c — inference programs of the CUDA target (kiln build --infer --target
 * cuda|cuda-emu) against the C target's, without a GPU: --target cuda-emu compiles the same
 * model.cu and the same device runtime that --target cuda compiles with nvcc.
 *   - mlp and cnn trained a few steps by the C training program: over a few hundred test
 *     images with their labels, the CUDA program prints the C program's loss and accuracy
 *     line, character for character, and its logits are the C program's within 1e-5
 *     relative (to the largest logit); without the labels (the predict step) the logits are
 *     the evaluation step's bits; batch 1 agrees with batch 64; weights embedded in the
 *     program (--embed-weights) give the bits of --weights;
 *   - gpt (T bound 32) over a small text: the same loss line, logits within 1e-5; --generate
 *     (the decode step on the device, its caches in device memory) writes the C program's
 *     text, sampled and greedy, past the context too (test_generate.c checks the C
 *     program's against full recomputation);
 *   - kiln emit --infer --target cuda: the two steps on the device, no training step, the
 *     predict step copies no label to the device;
 *   - bad inputs, weights and flags: the C program's messages and exit statuses;
 *   - with nvcc: every model of the training programs' nvcc test compiles as an inference
 *     model.cu for sm_90 with -Xptxas -v and no spills, and a GPU program on this machine
 *     (no GPU) says so and exits 1.
 * Sizes are cut for CI's time: 300 images (cnn 100), 5 to 20 training steps, gpt at T 32,
 * and the nvcc check compiles the kernels alone (-cubin: no host compilation). */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

#ifndef KILN_NVCC
#define KILN_NVCC ""
#endif

#define IMAGES "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
#define LABELS "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-cudainfer-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(cuda_infer, .init = setup, .fini = teardown, .timeout = 300);

/* Runs cmd in dir; fails the test unless it exits 0. Returns its output (static). */
static const char *ok(const char *cmd)
{
    static StrBuf out;
    sb_free(&out);
    sb_init(&out);
    int rc = support_run_in(dir, cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit status %d:\n%s", cmd, rc, out.data ? out.data : "");
    return out.data ? out.data : "";
}

/* Runs cmd, which must fail with `status` and print `message`, with no sanitizer report. */
static void fails(const char *cmd, int status, const char *message)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_run_in(dir, cmd, &out);
    const char *o = out.data ? out.data : "";
    cr_expect_eq(rc, status, "%s: exit status %d, expected %d:\n%s", cmd, rc, status, o);
    cr_expect(strstr(o, message) != NULL, "%s: expected '%s' in:\n%s", cmd, message, o);
    cr_expect(!strstr(o, "Sanitizer") && !strstr(o, "runtime error"), "%s:\n%s", cmd, o);
    sb_free(&out);
}

/* kiln build MODEL extra -o dir/NAME */
static void build(const char *model, const char *extra, const char *name)
{
    char args[1024];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "build %s %s -o %s/%s", support_path(model), extra, dir, name);
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args, out.data ? out.data : "");
    sb_free(&out);
}

static krt_array load_npy(const char *rel)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    krt_array a;
    krt_error err;
    cr_assert_eq(krt_npy_load(path, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dtype, KRT_F32, "%s", rel);
    return a;
}

/* The largest difference between two outputs relative to the largest magnitude of the
 * first (a NaN anywhere counts as infinitely different). */
static double relative_diff(const char *x, const char *y)
{
    krt_array a = load_npy(x), b = load_npy(y);
    cr_assert_eq(a.rank, b.rank);
    for (int d = 0; d < a.rank; d++) cr_assert_eq(a.dims[d], b.dims[d], "%s and %s: axis %d", x, y, d);
    const float *p = a.data, *q = b.data;
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < krt_array_count(&a); i++) {
        double d = fabs((double)p[i] - q[i]);
        if (isnan(d)) d = INFINITY;
        worst = d > worst ? d : worst;
        scale = fabs(p[i]) > scale ? fabs(p[i]) : scale;
    }
    krt_array_free(&a);
    krt_array_free(&b);
    return scale > 0 ? worst / scale : worst;
}

static void expect_same_bits(const char *x, const char *y)
{
    krt_array a = load_npy(x), b = load_npy(y);
    cr_assert_eq(a.nbytes, b.nbytes);
    cr_expect_eq(memcmp(a.data, b.data, a.nbytes), 0, "%s and %s differ", x, y);
    krt_array_free(&a);
    krt_array_free(&b);
}

/* The first `n` test images and labels as dir/images.npy and dir/labels.npy. */
static void test_subset(int64_t n)
{
    krt_array img, lab;
    krt_error err;
    cr_assert_eq(krt_array_load(IMAGES, &img, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_array_load(LABELS, &lab, &err), KRT_OK, "%s", err.msg);
    char path[256];
    int64_t dims[3] = {n, 28, 28};
    snprintf(path, sizeof path, "%s/images.npy", dir);
    cr_assert_eq(krt_npy_write(path, KRT_U8, 3, dims, img.data, &err), KRT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/labels.npy", dir);
    cr_assert_eq(krt_npy_write(path, KRT_U8, 1, dims, lab.data, &err), KRT_OK, "%s", err.msg);
    krt_array_free(&img);
    krt_array_free(&lab);
}

/* The line "N samples: loss L  accuracy A" of an inference program's output. */
static const char *summary(const char *out)
{
    static char line[4][256];
    static int k;
    k = (k + 1) % 4;
    const char *l = strstr(out, " samples: loss ");
    cr_assert(l, "no loss line in:\n%s", out);
    while (l > out && l[-1] != '\n') l--;
    snprintf(line[k], sizeof line[k], "%.*s", (int)strcspn(l, "\n"), l);
    return line[k];
}

/* Trains `name` a few steps (the C program), then the CUDA inference program (emulated)
 * against the C one on the same checkpoint. */
static void classifier_matches_c(const char *name, int steps, int batch, int64_t images)
{
    char model[64], cmd[1024];
    snprintf(model, sizeof model, "models/%s.kiln", name);
    build(model, "", "train");
    build(model, "--infer", "infer-c");
    build(model, "--infer --target cuda-emu", "infer-cuda");
    test_subset(images);
    snprintf(cmd, sizeof cmd, "./train --steps %d --batch %d --checkpoint-dir ck --eval-batches 1", steps, batch);
    ok(cmd);

    /* the evaluation step: loss, accuracy and logits */
    char c_line[256];
    snprintf(c_line, sizeof c_line, "%s",
             summary(ok("./infer-c --weights ck --batch 64 --data image=images.npy --data label=labels.npy --quiet --output c.npy")));
    const char *cuda_line =
        summary(ok("./infer-cuda --weights ck --batch 64 --data image=images.npy --data label=labels.npy --quiet --output l64.npy"));
    cr_expect_str_eq(cuda_line, c_line);
    double d = relative_diff("c.npy", "l64.npy");
    printf("%s: cuda-emu vs C inference: '%s', logits within %.3g relative\n", name, cuda_line, d);
    cr_expect(d <= 1e-5, "%s: the CUDA program's logits differ from the C program's by %g relative", name, d);

    /* the predict step (no labels): the evaluation step's logits */
    ok("./infer-cuda --weights ck --batch 64 --data image=images.npy --quiet --output p64.npy");
    expect_same_bits("l64.npy", "p64.npy");
    /* batch 1, without rebuilding */
    ok("./infer-cuda --weights ck --batch 1 --data image=images.npy --quiet --output p1.npy");
    d = relative_diff("p64.npy", "p1.npy");
    cr_expect(d <= 1e-5, "%s: batch 1 vs 64: %g relative", name, d);
    /* top-k lines, as the C program's */
    const char *top = ok("./infer-cuda --weights ck --batch 64 --data image=images.npy --top-k 3 | head -3");
    char cuda_top[512];
    snprintf(cuda_top, sizeof cuda_top, "%s", top);
    cr_expect_str_eq(ok("./infer-c --weights ck --batch 64 --data image=images.npy --top-k 3 | head -3"), cuda_top);

    /* embedded weights: the bits of --weights, with no file at run time */
    snprintf(cmd, sizeof cmd, "--infer --target cuda-emu --embed-weights %s/ck", dir);
    build(model, cmd, "embedded");
    ok("mv ck ck.moved && ./embedded --batch 64 --data image=images.npy --quiet --output e64.npy; s=$?; mv ck.moved ck; exit $s");
    expect_same_bits("p64.npy", "e64.npy");
}

Test(cuda_infer, mlp_matches_the_c_program) { classifier_matches_c("mlp", 20, 32, 300); }

Test(cuda_infer, cnn_matches_the_c_program) { classifier_matches_c("cnn", 5, 8, 100); }

/* A language model's windows of a text: the C program's loss line and logits. */
Test(cuda_infer, gpt_text_loss_matches_the_c_program)
{
    build("models/gpt.kiln", "--bound T=32", "train");
    build("models/gpt.kiln", "--bound T=32 --infer", "infer-c");
    build("models/gpt.kiln", "--bound T=32 --infer --target cuda-emu", "infer-cuda");
    ok("head -c 20000 /usr/share/games/fortunes/computers > corpus.txt && tail -c 400 corpus.txt > val.txt");
    ok("./train --data corpus.txt --steps 2 --batch 4 --checkpoint-dir ck --sample-tokens 0 --eval-batches 1");
    char c_line[256];
    snprintf(c_line, sizeof c_line, "%s", summary(ok("./infer-c --weights ck --data val.txt --output c.npy")));
    const char *cuda_line = summary(ok("./infer-cuda --weights ck --data val.txt --output cuda.npy"));
    cr_expect_str_eq(cuda_line, c_line);
    double d = relative_diff("c.npy", "cuda.npy");
    printf("gpt: cuda-emu vs C inference: '%s', logits within %.3g relative\n", cuda_line, d);
    cr_expect(d <= 1e-5, "gpt: the CUDA program's logits differ from the C program's by %g relative", d);
    fails("./infer-cuda --weights ck --data val.txt --top-k 2", 2, "--top-k: no output of gpt is a classifier's");

    /* --generate on the device, its key/value caches in device memory: the C program's
     * text, token for token, sampled and greedy; a 19-byte prompt and 16 tokens cross the
     * context of 32, where both compute the window again for each token. */
    static const char *const modes[] = {"--temperature 0.8 --top-k 40 --seed 7", "--temperature 0"};
    for (int m = 0; m < (SUPPORT_REPEAT_RUNS ? 2 : 1); m++) { /* greedy: the same code (support.h) */
        char cmd[512], c_text[512];
        snprintf(cmd, sizeof cmd, "(./infer-c --weights ck --generate --prompt 'Computers are handy' --tokens 16 %s 2>gen.err)", modes[m]);
        snprintf(c_text, sizeof c_text, "%s", ok(cmd));
        snprintf(cmd, sizeof cmd, "(./infer-cuda --weights ck --generate --prompt 'Computers are handy' --tokens 16 %s 2>gen.err)", modes[m]);
        cr_expect_str_eq(ok(cmd), c_text, "gpt --generate %s: the CUDA program's text is not the C program's", modes[m]);
        cr_expect(strstr(ok("cat gen.err"), "(key/value cache)"), "%s", ok("cat gen.err"));
    }
}

/* A cache longer than 256 keys: the decode step's fused attention splits the keys in
 * ranges, a block each, and combines them (runtime/cuda/kiln_cuda_attention.h). gpt with a
 * context of 320, greedy for 300 tokens: the C program's text. */
Test(cuda_infer, gpt_long_cache_split_matches_the_c_program)
{
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: test_cuda_attention's decode_step_long_cache_split covers the kernels (support.h)");
    size_t len;
    char *text = support_read("models/gpt.kiln", &len);
    cr_assert(text);
    char *at = strstr(text, "const block = 128");
    cr_assert(at, "models/gpt.kiln changed");
    memcpy(at, "const block = 320", 17);
    char path[128];
    snprintf(path, sizeof path, "%s/long.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fwrite(text, 1, len, f);
    fclose(f);
    free(text);
    char args[1024];
    StrBuf out;
    sb_init(&out);
    static const char *const builds[][2] = {{"", "train"}, {"--infer", "infer-c"}, {"--infer --target cuda-emu", "infer-cuda"}};
    for (int b = 0; b < 3; b++) {
        snprintf(args, sizeof args, "build %s %s -o %s/%s", path, builds[b][0], dir, builds[b][1]);
        cr_assert_eq(support_run_kiln(args, &out), 0, "kiln %s:\n%s", args, out.data ? out.data : "");
    }
    sb_free(&out);
    ok("head -c 20000 /usr/share/games/fortunes/computers > corpus.txt");
    ok("./train --data corpus.txt --steps 2 --batch 1 --checkpoint-dir ck --sample-tokens 0 --eval-batches 1");
    char c_text[4096];
    snprintf(c_text, sizeof c_text, "%s", ok("(./infer-c --weights ck --generate --prompt 'Computers' --tokens 300 --temperature 0 2>gen.err)"));
    cr_expect_gt(strlen(c_text), 250, "%s", c_text);
    cr_expect_str_eq(ok("(./infer-cuda --weights ck --generate --prompt 'Computers' --tokens 300 --temperature 0 2>gen.err)"), c_text,
                     "the CUDA program's text is not the C program's");
    cr_expect(strstr(ok("cat gen.err"), "(key/value cache)"), "%s", ok("cat gen.err"));
}

/* kiln emit --infer --target cuda: what model.cu holds. */
Test(cuda_infer, emit_writes_the_two_steps_for_the_device)
{
    char args[512];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "emit %s --infer --target cuda -o %s/cu", support_path("models/mlp.kiln"), dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    sb_free(&out);
    const char *cu = ok("cat cu/model.cu");
    cr_expect(strstr(cu, "static void eval_step(kiln_step_io *io)"));
    cr_expect(strstr(cu, "static void predict_step(kiln_step_io *io)"));
    /* the predict step's launches; its kernels are the evaluation step's (the same code) */
    cr_expect(strstr(cu, "void predict_cast_fwd_launch(") && strstr(cu, "KILN_LAUNCH_AT(") && strstr(cu, ", eval_cast_fwd, "),
              "the predict step's kernels");
    cr_expect(!strstr(cu, "__global__ void __launch_bounds__(256) predict_"), "a predict kernel the same as an evaluation kernel");
    cr_expect(!strstr(cu, "void train_step") && !strstr(cu, "io->grads"), "an inference program's model.cu has a training step");
    cr_expect(strstr(cu, ".train_step = NULL, .eval_step = eval_step,"));
    cr_expect(strstr(cu, "static const bool forward_inputs[] = {true, false};"));
    cr_expect(strstr(cu, ".device = &kiln_cuda_device,"));
    /* the predict step leaves the labels alone; the evaluation step copies them */
    const char *predict = strstr(cu, "static void predict_step");
    cr_assert(predict);
    cr_expect(strstr(predict, "/* input label: not read by this step */"), "%.2000s", predict);
    cr_expect(!strstr(predict, "kiln_cuda_input(io->device, 1,"), "%.2000s", predict);
    const char *eval = strstr(cu, "static void eval_step");
    cr_assert(eval);
    cr_expect(strstr(eval, "kiln_cuda_input(io->device, 1,"));
}

#define BAD(f) "--data image=" KILN_SOURCE_DIR "/tests/infer/bad/" f

/* Bad inputs, weights and flags: the C program's messages (tests/test_infer.c runs them
 * all there; the input and weight checks are infer_main.c's, before the device). */
Test(cuda_infer, bad_inputs_and_weights_as_the_c_program)
{
    build("models/mlp.kiln", "--infer --target cuda-emu", "infer");
    fails("./infer --weights nowhere " BAD("image_2.idx"), 1, "nowhere");
    fails("./infer " BAD("image_2.idx"), 1, "no weights: give --weights DIR|FILE");
    fails("./infer --weights " KILN_SOURCE_DIR "/tests/infer/bad/not_data.txt " BAD("image_2.idx"), 1, "not_data.txt: not a safetensors file");
    build("models/mlp.kiln", "", "train");
    ok("./train --steps 1 --batch 2 --checkpoint-dir ck --eval-batches 1");
    fails("./infer --weights ck " BAD("image_32x32.idx"), 1,
          "image_32x32.idx: input 'image' takes u8[N, 28, 28] per file, this file holds u8[3, 32, 32]");
    fails("./infer --weights ck " BAD("image_truncated.idx.gz"), 1, "image_truncated.idx.gz: truncated");
    fails("./infer --weights ck " BAD("image_2.idx") " --data label=" KILN_SOURCE_DIR "/tests/infer/bad/label_11.idx", 1,
          "label_11.idx: value 11 at element 1 of input 'label' is out of range [0, 10)");
    fails("./infer --weights ck " BAD("image_2.idx") " --batch 129", 2, "--batch 129: give a whole number from 1 to 128");
    fails("./infer --weights ck --data imgae=x", 2, "--data imgae=x: the model has no input 'imgae' (its inputs: image, label)");
    /* the device's memory: the emulator plays a 1 MiB GPU, too small for mlp's weights */
    fails("KILN_CUDA_EMU_MEMORY=1M ./infer --weights ck " BAD("image_2.idx"), 1, "MiB free");
}

/* The GPU inference program (its kernels by NVRTC: test_cuda_nvrtc checks every model's
 * for spills) says that there is no GPU. */
Test(cuda_infer, gpu_program_without_a_gpu_says_so, .timeout = 300)
{
    if (!*KILN_NVCC) cr_skip_test("no CUDA toolkit");
    build("models/mlp.kiln", "--infer --target cuda", "gpu");
    test_subset(2);
    fails("./gpu --weights nowhere --data image=images.npy", 1, "no CUDA GPU");
}
