/* test_jit.c — `kiln train FILE` through the JIT (cli/jit_train.c, driver/jit_orc.cpp): the
 * model compiled by the Clang inside kiln and linked into the kiln process must train
 * exactly as the program `kiln build` writes with the same compiler and flags: the same
 * JSON-lines log (every loss, metric and gradient norm) and the same checkpoint, for mlp
 * and a small GPT; a second run starts from the cached objects and gives the same again;
 * --no-jit builds and runs the program; kiln run (the inference program through the JIT)
 * predicts and generates as the built inference program; bad input still gets one clean
 * error. Each side
 * trains a few steps of the data the test writes, on one thread. Needs Clang inside kiln:
 * skipped in a kiln without it (the sanitizer build). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "ckpt_compare.h"
#include "support.h"

static char dir[64];

static void setup(void)
{
    if (!KILN_IN_PROCESS_DEFAULT) return;
    snprintf(dir, sizeof dir, "/tmp/kiln-jit-XXXXXX");
    cr_assert(mkdtemp(dir));
    support_write_training_data(dir);
}

static void teardown(void)
{
    if (dir[0]) support_remove_dir(dir);
}

TestSuite(jit, .init = setup, .fini = teardown, .timeout = 240);

#define SKIP_WITHOUT_CLANG()                                                                                                       \
    do {                                                                                                                           \
        if (!KILN_IN_PROCESS_DEFAULT) cr_skip_test("this kiln has no Clang inside (the sanitizer build): no JIT");                   \
    } while (0)

/* kiln with no compiler chosen (so: Clang inside, and the JIT for train), its cache in dir */
#define KILN "env -u CC XDG_CACHE_HOME=cache '" KILN_BINARY "' "
#define IMAGES "--data image=img.idx --data label=lab.idx --eval-data image=img.idx --eval-data label=lab.idx"
#define TEXT "--sample-tokens 0 --data text.txt"
#define RUN "--steps 4 --eval-batches 1 --threads 1 --seed 1 "

/* A GPT as models/gpt.kiln, cut to one block of width 32 (seconds to compile). */
static const char tiny_gpt[] = "model tinygpt\n"
                               "const V = 256, block = 32, H = 2, C = 32\n"
                               "dim T <= block\n"
                               "wte = Embedding(V, C)\n"
                               "wpe = Embedding(block, C)\n"
                               "ln_1 = LayerNorm(C)\n"
                               "attn = CausalSelfAttention(C, H)\n"
                               "ln_2 = LayerNorm(C)\n"
                               "mlp = MLP(C, 4 * C)\n"
                               "ln_f = LayerNorm(C)\n"
                               "init Linear.weight = normal(0, 0.02)\n"
                               "init Linear.bias = zeros\n"
                               "init Embedding.weight = normal(0, 0.02)\n"
                               "forward(idx: i32[B, T]) -> logits {\n"
                               "    x = wte(idx) + wpe(arange(T))\n"
                               "    x = x + attn(ln_1(x))\n"
                               "    x = x + mlp(ln_2(x))\n"
                               "    logits = ln_f(x) @ transpose(wte.weight)\n"
                               "}\n"
                               "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
                               "train {\n"
                               "    data = text(\"text.txt\", input = idx, target = targets)\n"
                               "    optimizer = AdamW(lr = 3e-4, betas = [0.9, 0.95], weight_decay = 0.1)\n"
                               "    batch = 4\n"
                               "    clip = 1.0\n"
                               "    steps = 4\n"
                               "}\n";

static void write_tiny_gpt(void)
{
    char path[128];
    snprintf(path, sizeof path, "%s/tinygpt.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(tiny_gpt, f);
    fclose(f);
}

/* cmd in dir, all of its output in out */
static int run(const char *cmd, StrBuf *out)
{
    char whole[2200];
    snprintf(whole, sizeof whole, "{ %s ; } 2>&1", cmd);
    return support_run_in(dir, whole, out);
}

static char *read_text(const char *rel)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    StrBuf err;
    sb_init(&err);
    size_t len;
    char *s = util_read_file(path, &len, &err);
    cr_assert(s, "%s", err.data);
    sb_free(&err);
    return s;
}

/* The checkpoints of step 4 in dir/a and dir/b hold the same state (tensors and metadata
 * but the run id). */
static void same_checkpoints(const char *a, const char *b)
{
    static const char *const files[] = {"model.safetensors", "train_state.safetensors"};
    for (int f = 0; f < 2; f++) {
        char pa[256], pb[256];
        snprintf(pa, sizeof pa, "%s/%s/step-00000004/%s", dir, a, files[f]);
        snprintf(pb, sizeof pb, "%s/%s/step-00000004/%s", dir, b, files[f]);
        const char *why = ckpt_difference(pa, pb);
        cr_expect(!why, "%s", why);
    }
}

/* Builds `model` with kiln build and trains it RUN + flags, then trains it with kiln train
 * (the JIT) twice: first with a cache of its own (every piece compiled into kiln), then with
 * kiln build's objects from the cache: the three logs and checkpoints must be the same. */
static void jit_is_the_program(const char *model, const char *flags)
{
    StrBuf out;
    sb_init(&out);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, KILN "build '%s' -o prog && ./prog " RUN "%s --log built.jsonl --checkpoint-dir ck-built", model, flags);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    snprintf(cmd, sizeof cmd, "env -u CC XDG_CACHE_HOME=cache-jit '" KILN_BINARY "' train '%s' --time-passes " RUN "%s --log jit.jsonl --checkpoint-dir ck-jit",
             model, flags);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    cr_expect(strstr(out.data, "compile    jit") && strstr(out.data, " (0 cached)") && !strstr(out.data, "kiln: building"),
              "the first kiln train did not compile into kiln:\n%s", out.data);
    snprintf(cmd, sizeof cmd, KILN "train '%s' --time-passes " RUN "%s --log warm.jsonl --checkpoint-dir ck-warm", model, flags);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    cr_expect(strstr(out.data, "compile    jit") && strstr(out.data, "compiled 0 of "), "kiln train did not take kiln build's objects:\n%s", out.data);
    char *built = read_text("built.jsonl"), *jit = read_text("jit.jsonl"), *warm = read_text("warm.jsonl");
    cr_expect(strstr(built, "\"loss\""), "no losses logged:\n%s", built);
    cr_expect_str_eq(jit, built, "the JIT's log is not the program's");
    cr_expect_str_eq(warm, built, "the JIT's log from cached objects is not the program's");
    same_checkpoints("ck-built", "ck-jit");
    same_checkpoints("ck-built", "ck-warm");
    free(built), free(jit), free(warm);
    sb_free(&out);
}

Test(jit, mlp_trains_as_its_built_program)
{
    SKIP_WITHOUT_CLANG();
    jit_is_the_program(support_path("models/mlp.kiln"), IMAGES);
}

Test(jit, a_small_gpt_trains_as_its_built_program)
{
    SKIP_WITHOUT_CLANG();
    write_tiny_gpt();
    jit_is_the_program("tinygpt.kiln", TEXT);
}

/* Reads dir/rel whole (its bytes; *len). */
static char *read_bytes(const char *rel, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    StrBuf err;
    sb_init(&err);
    char *s = util_read_file(path, len, &err);
    cr_assert(s, "%s", err.data);
    sb_free(&err);
    return s;
}

/* kiln run (the inference program through the JIT) gives the built inference program's
 * outputs: mlp's predictions (.npy bytes, loss and accuracy) and the small GPT's generated
 * text, from weights kiln train wrote. */
Test(jit, run_infers_and_generates_as_the_built_program)
{
    SKIP_WITHOUT_CLANG();
    write_tiny_gpt();
    StrBuf out, built;
    sb_init(&out);
    sb_init(&built);
    char cmd[2048];
    const char *mlp = support_path("models/mlp.kiln");
    snprintf(cmd, sizeof cmd, KILN "train '%s' " RUN IMAGES " --checkpoint-dir ck-mlp && " KILN "train tinygpt.kiln " RUN TEXT
                              " --checkpoint-dir ck-gpt && " KILN "build --infer '%s' -o infer-mlp && " KILN "build --infer tinygpt.kiln -o infer-gpt",
             mlp, mlp);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
#define PREDICT "--weights ck-mlp --data image=img.idx --data label=lab.idx --quiet --output "
    cr_assert_eq(run("./infer-mlp " PREDICT "built.npy", &built), 0, "%s", built.data);
    snprintf(cmd, sizeof cmd, KILN "run '%s' " PREDICT "jit.npy", mlp);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    cr_expect(strstr(out.data, "accuracy"), "%s", out.data);
    cr_expect_str_eq(out.data, built.data, "kiln run's evaluation is not the program's");
    size_t na, nb;
    char *a = read_bytes("jit.npy", &na), *b = read_bytes("built.npy", &nb);
    cr_expect(na == nb && !memcmp(a, b, na), "kiln run's predictions are not the program's");
    free(a), free(b);
#define GENERATE "--weights ck-gpt --generate --prompt 'the ' --tokens 24 --seed 3"
    cr_assert_eq(run("./infer-gpt " GENERATE, &built), 0, "%s", built.data);
    cr_assert_eq(run(KILN "run tinygpt.kiln " GENERATE, &out), 0, "%s", out.data);
    /* the text; the line after it says how fast it came */
    char *speed_a = strstr(out.data, "\ntinygpt: "), *speed_b = strstr(built.data, "\ntinygpt: ");
    cr_assert(speed_a && speed_b, "no generation summary:\n%s\n%s", out.data, built.data);
    *speed_a = *speed_b = 0;
    cr_expect(strlen(built.data) > 24, "no text generated: %s", built.data);
    cr_expect_str_eq(out.data, built.data, "kiln run's generated text is not the program's");
    sb_free(&out);
    sb_free(&built);
}

/* The comparison can fail: another seed is another log. And --no-jit runs the program
 * (built into the cache) with the JIT's results. */
Test(jit, no_jit_builds_the_program_and_another_seed_differs)
{
    SKIP_WITHOUT_CLANG();
    StrBuf out;
    sb_init(&out);
    char cmd[2048];
    const char *mlp = support_path("models/mlp.kiln");
    snprintf(cmd, sizeof cmd, KILN "train '%s' " RUN IMAGES " --log jit.jsonl --checkpoint-dir ck-jit", mlp);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    snprintf(cmd, sizeof cmd, KILN "train '%s' --no-jit " RUN IMAGES " --log prog.jsonl --checkpoint-dir ck-prog", mlp);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    cr_expect(strstr(out.data, "kiln: building"), "--no-jit did not build a program:\n%s", out.data);
    snprintf(cmd, sizeof cmd, KILN "train '%s' " RUN IMAGES " --seed 2 --log seed2.jsonl --checkpoint-dir ck-seed2", mlp);
    cr_assert_eq(run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    char *jit = read_text("jit.jsonl"), *prog = read_text("prog.jsonl"), *seed2 = read_text("seed2.jsonl");
    cr_expect_str_eq(prog, jit, "kiln train --no-jit's log is not the JIT's");
    same_checkpoints("ck-prog", "ck-jit");
    cr_expect(strcmp(seed2, jit), "seeds 1 and 2 gave the same log: the comparison cannot fail");
    free(jit), free(prog), free(seed2);
    sb_free(&out);
}

/* Bad input through the JIT's path: one message and an exit status, no crash. */
Test(jit, bad_input_is_one_clean_error)
{
    SKIP_WITHOUT_CLANG();
    StrBuf out;
    sb_init(&out);
    char cmd[2048];
    static const char broken[] = "model broken\nforward(x: f32[B, 4]) -> y {\n    y = nosuchlayer(x)\n}\n";
    char path[128];
    snprintf(path, sizeof path, "%s/broken.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(broken, f);
    fclose(f);
    cr_expect_eq(run(KILN "train broken.kiln", &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "broken.kiln:3:") && strstr(out.data, "error"), "no located error:\n%s", out.data);
    cr_expect_eq(run(KILN "train missing.kiln", &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "missing.kiln") && strstr(out.data, "error"), "%s", out.data);
    const char *mlp = support_path("models/mlp.kiln");
    snprintf(cmd, sizeof cmd, KILN "train '%s' --cc", mlp);
    cr_expect_eq(run(cmd, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "--cc needs a value"), "%s", out.data);
    /* the program's own checks, in the kiln process */
    snprintf(cmd, sizeof cmd, KILN "train '%s' --steps 0 " IMAGES, mlp);
    cr_expect_eq(run(cmd, &out), 2, "%s", out.data);
    cr_expect(strstr(out.data, "mlp: error: --steps"), "%s", out.data);
    snprintf(cmd, sizeof cmd, KILN "train '%s' " RUN "--data image=nosuchfile.idx --data label=lab.idx", mlp);
    cr_expect_eq(run(cmd, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "nosuchfile.idx") && strstr(out.data, "error"), "%s", out.data);
    sb_free(&out);
}
