/* test_infer.c — inference programs (kiln build --infer, programs/infer_main.c) against the
 * training program and PyTorch, on Fashion-MNIST's test set:
 *   - mlp and cnn trained a few steps, then the inference program over the 10,000 test
 *     images with their labels: its loss and accuracy are the training program's --eval
 *     over the same samples at the same batch (printed alike, %.6g); its logits with
 *     labels (the evaluation step) and without (the predict step) are the same bits;
 *   - batch 1 and batch 64 (and stdin) give the same logits, to BLAS's rounding: OpenBLAS
 *     sums a product of another shape in another order (sgemv for one row, its small-
 *     matrix kernels for small ones), so the bits may differ by an ulp or two;
 *   - weights embedded in the program (--embed-weights) give the bits of --weights;
 *   - a state_dict PyTorch saved loads, and the logits are PyTorch's within 1e-5 (skipped
 *     without torch);
 *   - bad inputs (tests/infer/bad, written by gen_bad.py) and bad weights (missing,
 *     mis-shaped, extra tensors) and flags: one clear message each, a non-zero status, no
 *     crash. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

#define IMAGES "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
#define LABELS "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-infer-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(infer, .init = setup, .fini = teardown, .timeout = 300);

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

/* Runs cmd in dir; fails the test unless it exits 0. Returns its output (static). */
static const char *ok(const char *cmd)
{
    static StrBuf out;
    sb_free(&out);
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit status %d:\n%s", cmd, rc, out.data ? out.data : "");
    return out.data ? out.data : "";
}

/* kiln build MODEL [extra] -o dir/NAME */
static void build(const char *model, const char *extra, const char *name)
{
    StrBuf args, out;
    sb_init(&args);
    sb_init(&out);
    sb_printf(&args, "build %s %s -o %s/%s", support_path(model), extra, dir, name);
    int rc = support_run_kiln(args.data, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args.data, out.data ? out.data : "");
    sb_free(&args);
    sb_free(&out);
}

/* A float32 .npy written by the inference program. */
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

static void expect_same_bits(const char *x, const char *y)
{
    krt_array a = load_npy(x), b = load_npy(y);
    cr_assert_eq(a.rank, b.rank);
    for (int d = 0; d < a.rank; d++) cr_assert_eq(a.dims[d], b.dims[d]);
    cr_expect_eq(memcmp(a.data, b.data, a.nbytes), 0, "%s and %s differ", x, y);
    krt_array_free(&a);
    krt_array_free(&b);
}

static double max_diff(const char *x, const char *y)
{
    krt_array a = load_npy(x), b = load_npy(y);
    cr_assert_eq(krt_array_count(&a), krt_array_count(&b));
    double worst = 0;
    for (int64_t i = 0; i < krt_array_count(&a); i++) {
        double d = fabs((double)((const float *)a.data)[i] - ((const float *)b.data)[i]);
        worst = d > worst || isnan(d) ? d : worst;
    }
    krt_array_free(&a);
    krt_array_free(&b);
    return worst;
}

/* The value after `key ` on the line of out that starts with `line` (a static copy). */
static const char *field(const char *out, const char *line, const char *key)
{
    static char buf[4][64];
    static int k;
    k = (k + 1) % 4;
    const char *l = strstr(out, line);
    cr_assert(l, "no line '%s' in:\n%s", line, out);
    const char *f = strstr(l, key);
    cr_assert(f, "no '%s' in:\n%s", key, l);
    f += strlen(key);
    size_t n = strcspn(f, " ,}\n");
    snprintf(buf[k], sizeof buf[k], "%.*s", (int)n, f);
    return buf[k];
}

/* Runs cmd, which must fail with `status` and print `message` (on stderr), no sanitizer
 * report and no signal. */
static void fails(const char *cmd, int status, const char *message)
{
    StrBuf out;
    sb_init(&out);
    int rc = run(cmd, &out);
    const char *o = out.data ? out.data : "";
    cr_expect_eq(rc, status, "%s: exit status %d, expected %d:\n%s", cmd, rc, status, o);
    cr_expect(strstr(o, message) != NULL, "%s: expected '%s' in:\n%s", cmd, message, o);
    cr_expect(!strstr(o, "Sanitizer") && !strstr(o, "runtime error"), "%s:\n%s", cmd, o);
    sb_free(&out);
}

/* fails(), after a command that prepares its files. */
static void fails_with(const char *cmd, const char *prepare, int status, const char *message)
{
    if (prepare) ok(prepare);
    fails(cmd, status, message);
}

/* The first n images and labels of the test set as IDX files in dir (images.idx,
 * labels.idx: uncompressed, the counts in their headers n). */
static void test_set_head(int n)
{
    char path[128], cmd[512];
    const unsigned char images[16] = {0, 0, 8, 3, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n, 0, 0, 0, 28, 0, 0, 0, 28};
    const unsigned char labels[8] = {0, 0, 8, 1, (unsigned char)(n >> 24), (unsigned char)(n >> 16), (unsigned char)(n >> 8), (unsigned char)n};
    snprintf(path, sizeof path, "%s/images.idx", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(images, 1, 16, f) == 16 && fclose(f) == 0);
    snprintf(path, sizeof path, "%s/labels.idx", dir);
    f = fopen(path, "wb");
    cr_assert(f && fwrite(labels, 1, 8, f) == 8 && fclose(f) == 0);
    snprintf(cmd, sizeof cmd, "gzip -dc %s | tail -c +17 | head -c %d >> images.idx && gzip -dc %s | tail -c +9 | head -c %d >> labels.idx",
             IMAGES, n * 28 * 28, LABELS, n);
    ok(cmd);
}

/* Trains `name` a few steps, then checks the inference program against the training
 * program's evaluation of the test set (its first n samples: all 10,000, or fewer for a
 * model whose forward is slow) and the batch/stdin/embedding equalities. */
static void trained_model_matches(const char *name, int steps, int n)
{
    char model[64], cmd[2048], images[128], labels[128], head[64];
    if (n < 10000) {
        test_set_head(n);
        snprintf(images, sizeof images, "images.idx");
        snprintf(labels, sizeof labels, "labels.idx");
    } else {
        snprintf(images, sizeof images, "%s", IMAGES);
        snprintf(labels, sizeof labels, "%s", LABELS);
    }
    snprintf(head, sizeof head, "%d samples:", n);
    snprintf(model, sizeof model, "models/%s.kiln", name);
    build(model, "", "train");
    build(model, "--infer", "infer");
    snprintf(cmd, sizeof cmd, "./train --steps %d --batch 32 --checkpoint-dir ck --eval-batches 1", steps);
    ok(cmd);
    snprintf(cmd, sizeof cmd, "./train --resume ck --eval --batch 64 --eval-data image=%s --eval-data label=%s --log eval.jsonl", images, labels);
    ok(cmd);
    const char *log = ok("cat eval.jsonl");
    char loss[64], acc[64];
    snprintf(loss, sizeof loss, "%s", field(log, "{", "\"eval_loss\": "));
    snprintf(acc, sizeof acc, "%s", field(log, "{", "\"eval_accuracy\": "));

    /* with the labels: the evaluation step, over the same samples in batches of 64 */
    snprintf(cmd, sizeof cmd, "./infer --weights ck --batch 64 --data image=%s --data label=%s --quiet --output l64.npy", images, labels);
    const char *out = ok(cmd);
    cr_expect_str_eq(field(out, head, "loss "), loss, "%s", out);
    cr_expect_str_eq(field(out, head, "accuracy "), acc, "%s", out);
    /* without: the predict step; the same kernels up to the logits */
    snprintf(cmd, sizeof cmd, "./infer --weights ck --batch 64 --data image=%s --quiet --output p64.npy", images);
    ok(cmd);
    expect_same_bits("l64.npy", "p64.npy");
    krt_array a = load_npy("p64.npy");
    cr_expect_eq(a.rank, 2);
    cr_expect_eq(a.dims[0], n);
    cr_expect_eq(a.dims[1], 10);
    krt_array_free(&a);
    /* the weights of a step directory, or of its model.safetensors, are the same */
    snprintf(cmd, sizeof cmd, "./infer --weights ck/$(cat ck/latest)/model.safetensors --batch 64 --data image=%s --quiet --output f64.npy", images);
    ok(cmd);
    expect_same_bits("p64.npy", "f64.npy");

    /* batch 1, and the bound (the last batch smaller), without rebuilding */
    if (SUPPORT_REPEAT_RUNS) { /* n steps of batch 1: a numerical verdict (support.h) */
        snprintf(cmd, sizeof cmd, "./infer --weights ck --batch 1 --data image=%s --quiet --output p1.npy", images);
        ok(cmd);
        double d1 = max_diff("p64.npy", "p1.npy");
        cr_expect(d1 <= 1e-4, "batch 1 vs 64: %g", d1);
    }
    snprintf(cmd, sizeof cmd, "./infer --weights ck --data image=%s --quiet --output pmax.npy", images);
    ok(cmd);
    double dmax = max_diff("p64.npy", "pmax.npy");
    cr_expect(dmax <= 1e-4, "batch bound vs 64: %g", dmax);
    /* stdin */
    snprintf(cmd, sizeof cmd, "gzip -dcf < %s | ./infer --weights ck --batch 64 --data image=- --quiet --output s64.npy", images);
    ok(cmd);
    expect_same_bits("p64.npy", "s64.npy");

    /* embedded weights: the same bits, with no file at run time */
    snprintf(cmd, sizeof cmd, "--infer --embed-weights %s/ck", dir);
    build(model, cmd, "embedded");
    snprintf(cmd, sizeof cmd, "mv ck ck.moved && ./embedded --batch 64 --data image=%s --quiet --output e64.npy && mv ck.moved ck", images);
    ok(cmd);
    expect_same_bits("p64.npy", "e64.npy");

    /* top-k: the likeliest class is the logits' argmax */
    snprintf(cmd, sizeof cmd, "./infer --weights ck --batch 64 --data image=%s --top-k 3", images);
    out = ok(cmd);
    char last[32];
    snprintf(last, sizeof last, "\n%d:  ", n - 1);
    cr_expect(strstr(out, last) != NULL, "%.300s", out);
    krt_array p = load_npy("p64.npy");
    const float *l = p.data;
    int best = 0;
    for (int c = 1; c < 10; c++) best = l[c] > l[best] ? c : best;
    char first[32];
    snprintf(first, sizeof first, "0:  %d ", best);
    cr_expect(!strncmp(out, first, strlen(first)), "expected '%s', got %.60s", first, out);
    krt_array_free(&p);
}

Test(infer, mlp_matches_training_eval) { trained_model_matches("mlp", 20, 10000); }

/* the first 1,000 test images: cnn's forward over all 10,000, nine times, took 40 s */
Test(infer, cnn_matches_training_eval) { trained_model_matches("cnn", 5, 1000); }

/* A language model reads a text as the training program does: windows of T tokens and
 * their targets. The training program evaluates on the last 10% of its text (the recipe's
 * val = 0.1); the inference program, given exactly those bytes, prints the same loss. */
Test(infer, gpt_text_windows)
{
    build("models/gpt.kiln", "", "train");
    build("models/gpt.kiln", "--infer", "infer");
    ok("head -c 40000 /usr/share/games/fortunes/computers > corpus.txt && tail -c 4000 corpus.txt > val.txt");
    ok("./train --data corpus.txt --steps 2 --checkpoint-dir ck --sample-tokens 0 --log train.jsonl");
    char loss[64];
    snprintf(loss, sizeof loss, "%s", field(ok("grep eval_loss train.jsonl"), "{", "\"eval_loss\": "));
    const char *out = ok("./infer --weights ck --data val.txt --output logits.npy");
    cr_expect_str_eq(field(out, "31 samples:", "loss "), loss, "%s", out);
    krt_array a = load_npy("logits.npy");
    cr_expect(a.rank == 3 && a.dims[0] == 31 && a.dims[1] == 128 && a.dims[2] == 256, "logits %lld x %lld x %lld", (long long)a.dims[0],
              (long long)a.dims[1], (long long)a.dims[2]);
    krt_array_free(&a);
    ok("./infer --weights ck --data - --output stdin.npy < val.txt");
    expect_same_bits("logits.npy", "stdin.npy");
    fails_with("./infer --weights ck --data short.txt", "echo 'too short' > short.txt", 1, "short.txt: ");
    fails_with("./infer --weights ck --data idx=val.txt", NULL, 1, "val.txt: not a data file of a format Kiln reads");
}

/* PyTorch's state_dict (tests/infer/torch_ref.py) and PyTorch's logits. */
static void matches_pytorch(const char *name)
{
    char model[64], cmd[1024];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 %s %s . 256", support_path("tests/infer/torch_ref.py"), name);
    int rc = run(cmd, &out);
    if (rc == 3) cr_skip_test("no PyTorch: %s", out.data ? out.data : "");
    cr_assert_eq(rc, 0, "%s:\n%s", cmd, out.data ? out.data : "");
    sb_free(&out);
    snprintf(model, sizeof model, "models/%s.kiln", name);
    build(model, "--infer", "infer");
    snprintf(cmd, sizeof cmd, "./infer --weights %s.safetensors --data image=images.npy --quiet --output kiln.npy", name);
    ok(cmd);
    char ref[64];
    snprintf(ref, sizeof ref, "%s_logits.npy", name);
    double d = max_diff("kiln.npy", ref);
    cr_expect(d <= 1e-5, "%s: Kiln's logits differ from PyTorch's by %g", name, d);
}

Test(infer, mlp_pytorch_state_dict) { matches_pytorch("mlp"); }

Test(infer, cnn_pytorch_state_dict) { matches_pytorch("cnn"); }

/* mlp's weights, written here: zeros but for a pattern, all that the bad-input runs need. */
static void write_weights(const char *rel, const char *drop, const char *reshape, const char *extra)
{
    static const struct {
        const char *name;
        int rank;
        int64_t dims[2];
    } P[] = {{"fc1.weight", 2, {256, 784}}, {"fc1.bias", 1, {256}}, {"fc2.weight", 2, {256, 256}},
             {"fc2.bias", 1, {256}},        {"fc3.weight", 2, {10, 256}}, {"fc3.bias", 1, {10}}};
    krt_st_tensor t[8];
    int n = 0;
    static float data[256 * 784];
    for (int i = 0; i < 256 * 784; i++) data[i] = (float)((i % 13) - 6) / 100;
    for (int i = 0; i < 6; i++) {
        if (drop && !strcmp(drop, P[i].name)) continue;
        t[n] = (krt_st_tensor){P[i].name, KRT_F32, P[i].rank, {P[i].dims[0], P[i].dims[1]}, data};
        if (reshape && !strcmp(reshape, P[i].name)) {
            t[n].dims[0] = P[i].dims[1];
            t[n].dims[1] = P[i].dims[0];
        }
        n++;
    }
    if (extra) t[n++] = (krt_st_tensor){extra, KRT_F32, 1, {4}, data};
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    krt_error err;
    cr_assert_eq(krt_safetensors_write(path, t, n, NULL, 0, &err), KRT_OK, "%s", err.msg);
}

/* kiln emit --infer: the evaluation and predict steps, the forward's tables, no training
 * step; the predict step reads no label. */
Test(infer, emit_has_no_training_step)
{
    char args[512];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "emit %s --infer -o %s/c", support_path("models/mlp.kiln"), dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    sb_free(&out);
    const char *c = ok("cat c/model.c");
    cr_expect(strstr(c, "static void eval_step(kiln_step_io *io)"));
    cr_expect(strstr(c, "static void predict_step(kiln_step_io *io)"));
    cr_expect(!strstr(c, "train_step"), "an inference program's model.c has a training step");
    cr_expect(!strstr(c, "io->grads"), "an inference program's model.c writes gradients");
    cr_expect(strstr(c, "static const bool forward_inputs[] = {true, false};"));
    cr_expect(strstr(c, "{\"logits\", KRT_F32, 2, {128, 10}, {0, -1}, 0},"));
}

#define BAD(f) "--data image=" KILN_SOURCE_DIR "/tests/infer/bad/" f

Test(infer, bad_inputs_weights_and_flags)
{
    build("models/mlp.kiln", "--infer", "infer");
    write_weights("w.safetensors", NULL, NULL, NULL);
    ok("./infer --weights w.safetensors --data image=" KILN_SOURCE_DIR "/tests/infer/bad/image_2.idx --quiet");
    /* input files */
    fails("./infer --weights w.safetensors " BAD("image_32x32.idx"), 1,
          "image_32x32.idx: input 'image' takes u8[N, 28, 28] per file, this file holds u8[3, 32, 32]");
    fails("./infer --weights w.safetensors " BAD("image_truncated.npy"), 1, "image_truncated.npy: truncated");
    fails("./infer --weights w.safetensors " BAD("image_truncated.npy"), 1, "(input 'image' takes u8[N, 28, 28])");
    fails("./infer --weights w.safetensors " BAD("image_truncated.idx.gz"), 1, "image_truncated.idx.gz: truncated");
    fails("./infer --weights w.safetensors " BAD("image_f4.npy"), 1,
          "image_f4.npy: input 'image' takes integers (u8[N, 28, 28]), this file holds f32[2, 28, 28]");
    fails("./infer --weights w.safetensors " BAD("image_flat.npy"), 1,
          "image_flat.npy: input 'image' takes u8[N, 28, 28] per file, this file holds u8[2, 784]");
    fails("./infer --weights w.safetensors " BAD("image_empty.idx"), 1, "image_empty.idx: no samples (0 rows) of input 'image'");
    fails("./infer --weights w.safetensors " BAD("not_data.txt"), 1, "not_data.txt: not a data file of a format Kiln reads");
    fails("./infer --weights w.safetensors --data image=- < " KILN_SOURCE_DIR "/tests/infer/bad/image_flat.npy", 1,
          "stdin: input 'image' takes u8[N, 28, 28] per file, this file holds u8[2, 784]");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --data label=" KILN_SOURCE_DIR "/tests/infer/bad/label_3.idx", 1,
          "label_3.idx: 3 samples of input 'label', but");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --data label=" KILN_SOURCE_DIR "/tests/infer/bad/label_11.idx", 1,
          "label_11.idx: value 11 at element 1 of input 'label' is out of range [0, 10)");
    fails("./infer --weights w.safetensors " BAD("no_such_file.idx"), 1, "no_such_file.idx");
    fails("./infer --weights w.safetensors --data label=" LABELS, 1, "no --data image=PATH: the forward reads input 'image', u8[N, 28, 28]");
    /* weights */
    write_weights("missing.safetensors", "fc3.bias", NULL, NULL);
    write_weights("misshaped.safetensors", NULL, "fc1.weight", NULL);
    write_weights("extra.safetensors", NULL, NULL, "fc4.weight");
    fails("./infer --weights missing.safetensors " BAD("image_2.idx"), 1, "missing.safetensors: no tensor 'fc3.bias' (the model's parameter)");
    fails("./infer --weights misshaped.safetensors " BAD("image_2.idx"), 1,
          "misshaped.safetensors: tensor 'fc1.weight' is f32[784, 256], the model's is f32[256, 784]");
    fails("./infer --weights extra.safetensors " BAD("image_2.idx"), 1,
          "extra.safetensors: tensor 'fc4.weight' is not a parameter or buffer of the model");
    fails("./infer --weights " KILN_SOURCE_DIR "/tests/infer/bad/not_data.txt " BAD("image_2.idx"), 1, "not_data.txt: not a safetensors file");
    fails("./infer --weights nowhere " BAD("image_2.idx"), 1, "nowhere");
    fails("./infer " BAD("image_2.idx"), 1, "no weights: give --weights DIR|FILE");
    /* flags */
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --batch 0", 2, "--batch 0: give a whole number from 1 to 128");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --batch 129", 2, "--batch 129: give a whole number from 1 to 128");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --top-k 3 --quiet", 2, "--top-k and --quiet");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " --top-k 11", 2, "--top-k 11: output 'logits' has 10 classes");
    fails("./infer --weights w.safetensors --data imgae=x", 2, "--data imgae=x: the model has no input 'imgae' (its inputs: image, label)");
    fails("./infer --weights w.safetensors " BAD("image_2.idx") " " BAD("image_2.idx"), 2, "input 'image' is already read from");
    fails("./infer --weights w.safetensors extra", 2, "unexpected argument 'extra'");
    /* the compiler */
    StrBuf out;
    sb_init(&out);
    char args[512];
    /* (--infer --target cuda|cuda-emu: tests/test_cuda_infer.c) */
    snprintf(args, sizeof args, "build %s --embed-weights %s/w.safetensors -o %s/x", support_path("models/mlp.kiln"), dir, dir);
    cr_expect_eq(support_run_kiln(args, &out), 2);
    cr_expect(strstr(out.data, "only inference programs embed weights (add --infer)"), "%s", out.data);
    sb_free(&out);
    snprintf(args, sizeof args, "build %s --infer --embed-weights %s/misshaped.safetensors -o %s/x", support_path("models/mlp.kiln"), dir, dir);
    cr_expect_eq(support_run_kiln(args, &out), 1);
    cr_expect(strstr(out.data, "tensor 'fc1.weight' is f32[784, 256], the model's is f32[256, 784]"), "%s", out.data);
    sb_free(&out);
}
