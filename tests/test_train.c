/* test_train.c — training executables end to end: mlp.kiln trains on a Fashion-MNIST
 * subset (loss falls, accuracy passes a bound), resume is bit-identical to an
 * uninterrupted run, and every bad input gives one clear message and a non-zero exit
 * without replacing a good checkpoint. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "ckpt_compare.h"
#include "support.h"

static char dir[64];
static char prog[128];

/* Runs a command in the test's directory. */
static int run(const char *cmd, StrBuf *out)
{
    char full[4096];
    snprintf(full, sizeof full, "cd %s || exit 99; %s", dir, cmd);
    return support_run(full, out);
}

static bool have_fashion_mnist(void)
{
    return access("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz", R_OK) == 0;
}

static void setup(void)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("train", "models/mlp.kiln", "mlp", dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build failed:\n%s", out.data);
    sb_free(&out);
    snprintf(prog, sizeof prog, "%s/mlp", dir);
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(train, .init = setup, .fini = teardown, .timeout = 300);

static double last_number_after(const char *text, const char *key)
{
    const char *p = NULL, *q = text;
    while ((q = strstr(q, key))) p = q++;
    return p ? strtod(p + strlen(key), NULL) : -1;
}

Test(train, mlp_learns_fashion_mnist)
{
    if (!have_fashion_mnist()) cr_skip_test("dataset-fashion-mnist is not installed");
    StrBuf out;
    sb_init(&out);
    int rc = run("./mlp --steps 150 --limit 8000 --eval-every 150 --eval-batches 20 --log log.jsonl", &out);
    cr_assert_eq(rc, 0, "%s", out.data);
    double first = last_number_after(strstr(out.data, "step 50/") ? strstr(out.data, "step 50/") : out.data, "loss ");
    double acc = last_number_after(out.data, "accuracy ");
    cr_expect(acc > 0.72, "accuracy after 150 steps is %g:\n%s", acc, out.data);
    FILE *f = fopen(strcat(strcpy((char[256]){0}, dir), "/log.jsonl"), "r");
    cr_assert(f, "no metrics log");
    char line[512];
    double l0 = -1, ln = -1;
    while (fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\": ");
        if (!p) continue;
        double v = strtod(p + 8, NULL);
        if (l0 < 0) l0 = v;
        ln = v;
    }
    fclose(f);
    cr_expect(l0 > 1.5 && ln < l0 - 0.8, "the loss did not fall: first %g, last %g (%g)", l0, ln, first);
    sb_free(&out);
}

static char *slurp(const char *rel, size_t *n)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    StrBuf err;
    sb_init(&err);
    char *d = util_read_file(path, n, &err);
    sb_free(&err);
    return d;
}

/* A file of the newest checkpoint in ckdir (the one ckdir/latest names), or NULL. */
static char *latest_file(const char *ckdir, const char *file, size_t *n)
{
    char rel[256];
    snprintf(rel, sizeof rel, "%s/latest", ckdir);
    size_t len;
    char *name = slurp(rel, &len);
    if (!name) return NULL;
    name[strcspn(name, "\n")] = 0;
    snprintf(rel, sizeof rel, "%s/%s/%s", ckdir, name, file);
    free(name);
    return slurp(rel, n);
}

Test(train, resume_is_bit_identical)
{
    if (!have_fashion_mnist()) cr_skip_test("dataset-fashion-mnist is not installed");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./mlp --steps 40 --limit 3000 --checkpoint-dir a --eval-every 1000", &out), 0, "%s", out.data);
    cr_assert_eq(run("./mlp --steps 20 --limit 3000 --checkpoint-dir b --eval-every 1000", &out), 0, "%s", out.data);
    cr_assert_eq(run("./mlp --steps 40 --limit 3000 --checkpoint-dir b --resume b --eval-every 1000", &out), 0, "%s", out.data);
    const char *files[] = {"model.safetensors", "train_state.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[512], b[512];
        snprintf(a, sizeof a, "%s/a/step-00000040/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/b/step-00000040/%s", dir, files[i]);
        const char *why = ckpt_difference(a, b);
        cr_expect(!why, "40 steps differ from 20 + resume + 20: %s", why);
    }
    sb_free(&out);
}

/* mlp.kiln with its optimizer replaced by `optimizer`, built as dir/NAME. */
static void build_mlp_with(const char *optimizer, const char *name)
{
    size_t len;
    char *text = support_read("models/mlp.kiln", &len);
    cr_assert(text);
    const char *old = "AdamW(lr = 1e-3, weight_decay = 0.01)";
    char *at = strstr(text, old);
    cr_assert(at, "models/mlp.kiln changed: no '%s'", old);
    char path[256];
    snprintf(path, sizeof path, "%s/%s.kiln", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fprintf(f, "%.*s%s%s", (int)(at - text), text, optimizer, at + strlen(old));
    fclose(f);
    free(text);
    char args[1024];
    snprintf(args, sizeof args, "build %s -o %s/%s", path, dir, name);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln %s:\n%s", args, out.data);
    sb_free(&out);
}

/* Issue 20's optimizers: 6 steps, and 3 + resume + 3, give the same checkpoint bit for bit
 * (weights and every state tensor, named as torch.optim names them). */
Test(train, new_optimizers_resume_bit_identically)
{
    if (!have_fashion_mnist()) cr_skip_test("dataset-fashion-mnist is not installed");
    static const struct {
        const char *optimizer, *state; /* state: a tensor the training state must hold */
    } cases[] = {
        {"RMSprop(lr = 1e-3, momentum = 0.9, centered = true, weight_decay = 0.01)", "grad_avg.fc1.weight"},
        {"RMSprop(lr = 1e-3)", "square_avg.fc2.bias"},
        {"Adagrad(lr = 0.01, lr_decay = 0.01, initial_accumulator_value = 0.1, weight_decay = 0.01)", "sum.fc1.weight"},
        {"Adam(lr = 1e-3, amsgrad = true)", "max_exp_avg_sq.fc1.weight"},
        {"AdamW(lr = 1e-3, amsgrad = true)", "max_exp_avg_sq.fc3.bias"},
        {"Lion(lr = 1e-4, weight_decay = 0.1)", "exp_avg.fc1.weight"},
    };
    StrBuf out;
    sb_init(&out);
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char name[32], cmd[1024];
        snprintf(name, sizeof name, "opt%zu", i);
        build_mlp_with(cases[i].optimizer, name);
        snprintf(cmd, sizeof cmd,
                 "./%s --steps 6 --limit 1000 --checkpoint-dir %s-a --eval-every 1000 --eval-batches 1 && "
                 "./%s --steps 3 --limit 1000 --checkpoint-dir %s-b --eval-every 1000 --eval-batches 1 && "
                 "./%s --steps 6 --limit 1000 --checkpoint-dir %s-b --resume %s-b --eval-every 1000 --eval-batches 1",
                 name, name, name, name, name, name, name);
        cr_assert_eq(run(cmd, &out), 0, "%s: %s", cases[i].optimizer, out.data);
        const char *files[] = {"model.safetensors", "train_state.safetensors"};
        for (int k = 0; k < 2; k++) {
            char a[512], b[512];
            snprintf(a, sizeof a, "%s/%s-a/step-00000006/%s", dir, name, files[k]);
            snprintf(b, sizeof b, "%s/%s-b/step-00000006/%s", dir, name, files[k]);
            const char *why = ckpt_difference(a, b);
            cr_expect(!why, "%s: 6 steps differ from 3 + resume + 3: %s", cases[i].optimizer, why);
        }
        char st[512];
        snprintf(st, sizeof st, "%s/%s-a/step-00000006/train_state.safetensors", dir, name);
        krt_safetensors *s = NULL;
        krt_error err;
        cr_assert_eq(krt_safetensors_read(st, &s, &err), KRT_OK, "%s", err.msg);
        cr_expect(krt_safetensors_find(s, cases[i].state), "%s: %s has no '%s'", cases[i].optimizer, st, cases[i].state);
        krt_safetensors_free(s);
    }
    sb_free(&out);
}

/* Each bad input: exit status non-zero and a message containing `want`. */
static void expect_error(const char *cmd, const char *want)
{
    StrBuf out;
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_expect(rc != 0 && rc != -1, "`%s` should fail cleanly, exit %d:\n%s", cmd, rc, out.data);
    cr_expect(strstr(out.data, want) != NULL, "`%s`: expected a message containing '%s', got:\n%s", cmd, want, out.data);
    sb_free(&out);
}

Test(train, bad_inputs)
{
    expect_error("./mlp --frobnicate 1", "unknown option '--frobnicate'");
    expect_error("./mlp --steps many", "--steps: 'many' is not a number");
    expect_error("./mlp --batch 100000", "at most 128");
    expect_error("./mlp --data image=/nonexistent/images.gz --steps 1", "/nonexistent/images.gz");
    /* A truncated data file. */
    FILE *f = fopen(strcat(strcpy((char[256]){0}, dir), "/trunc.gz"), "wb");
    cr_assert(f);
    const unsigned char hdr[] = {0, 0, 8, 3, 0, 0, 0, 10, 0, 0, 0, 28, 0, 0, 0, 28, 1, 2, 3};
    fwrite(hdr, 1, sizeof hdr, f);
    fclose(f);
    expect_error("./mlp --data image=trunc.gz --steps 1", "trunc.gz");
    if (!have_fashion_mnist()) return;
    /* Labels out of range: images given as labels (values up to 255, 10 classes). */
    expect_error("./mlp --data label=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz --steps 1", "rank");
    /* Checkpoints: a good one, then a truncated copy and a foreign file are refused. */
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./mlp --steps 2 --limit 1000 --checkpoint-dir good --eval-every 1000", &out), 0, "%s", out.data);
    cr_assert_eq(run("mkdir bad && head -c 1000 good/step-00000002/model.safetensors > bad/model.safetensors && "
                     "cp good/step-00000002/train_state.safetensors bad/", &out), 0);
    expect_error("./mlp --steps 4 --limit 1000 --resume bad", "bad/model.safetensors");
    cr_assert_eq(run("mkdir foreign && echo 'not a checkpoint at all' > foreign/model.safetensors", &out), 0);
    expect_error("./mlp --steps 4 --limit 1000 --resume foreign", "foreign/model.safetensors");
    expect_error("./mlp --steps 4 --limit 1000 --resume nowhere", "nowhere: cannot open the checkpoint directory");
    /* Saving into an unwritable place fails with a message and leaves the good one. */
    size_t n0;
    char *before = latest_file("good", "model.safetensors", &n0);
    cr_assert_eq(run("chmod a-w good", &out), 0);
    if (geteuid() != 0) expect_error("./mlp --steps 2 --limit 1000 --checkpoint-dir good --eval-every 1000", "good");
    cr_assert_eq(run("chmod u+w good", &out), 0);
    size_t n1;
    char *after = latest_file("good", "model.safetensors", &n1);
    cr_expect(after && n0 == n1 && !memcmp(before, after, n0), "the good checkpoint was changed");
    free(before);
    free(after);
    sb_free(&out);
}

Test(train, diverging_loss_names_the_step)
{
    if (!have_fashion_mnist()) cr_skip_test("dataset-fashion-mnist is not installed");
    expect_error("./mlp --steps 50 --limit 2000 --lr 1e30 --eval-every 1000", "at step");
}

Test(train, ctrl_c_saves_a_checkpoint)
{
    if (!have_fashion_mnist()) cr_skip_test("dataset-fashion-mnist is not installed");
    StrBuf out;
    sb_init(&out);
    /* Start a long run, interrupt it once training is under way. */
    int rc = run("./mlp --steps 100000 --limit 3000 --checkpoint-dir ck --eval-every 100000 > run.log 2>&1 & pid=$!; "
                 "for i in $(seq 100); do grep -q 'step ' run.log 2>/dev/null && break; sleep 0.1; done; "
                 "kill -INT $pid; wait $pid; echo exit=$?; cat run.log",
                 &out);
    cr_assert_eq(rc, 0, "%s", out.data);
    cr_expect(strstr(out.data, "exit=130"), "the program should exit 130 after Ctrl-C:\n%s", out.data);
    /* "saving a checkpoint in ck", or "its checkpoint is saved in ck" when the signal came
     * while the step's own checkpoint was being saved. */
    cr_expect(strstr(out.data, "interrupted at step ") && strstr(out.data, "checkpoint") && strstr(out.data, " in ck\n"), "%s", out.data);
    size_t n;
    char *ck = latest_file("ck", "model.safetensors", &n);
    cr_expect(ck && n > 1000000, "no checkpoint after Ctrl-C");
    free(ck);
    sb_free(&out);
}

Test(train, kiln_tokens_writes_a_token_file)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("mkdir txt && printf 'ab' > txt/a.txt && printf 'c\\n' > txt/b.txt && printf 'zz' > txt/skip.dat", &out), 0);
    char args[512];
    snprintf(args, sizeof args, "tokens '%s/txt/*' --exclude '*.dat' -o %s/t.tok", dir, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    snprintf(args, sizeof args, "%s/t.tok", dir);
    krt_array a;
    krt_error err;
    cr_assert_eq(krt_tokens_load(args, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_array_count(&a), 4);
    const int32_t *t = a.data;
    cr_expect(t[0] == 'a' && t[1] == 'b' && t[2] == 'c' && t[3] == '\n');
    krt_array_free(&a);
    out.len = 0;
    cr_expect_eq(support_run_kiln("tokens '/nonexistent/*' -o /tmp/x.tok", &out), 1);
    cr_expect(strstr(out.data, "/nonexistent/*"), "%s", out.data);
    sb_free(&out);
}

/* A tiny byte-level GPT (with dropout) on a small text: it learns, resume is exact with
 * dropout on, and language-model data errors are clear. */
static const char *tiny_gpt =
    "model tiny\n"
    "const V = 256, block = 16, C = 32\n"
    "dim T <= block\n"
    "wte = Embedding(V, C)\n"
    "wpe = Embedding(block, C)\n"
    "ln = LayerNorm(C)\n"
    "attn = CausalSelfAttention(C, 2, dropout = 0.1)\n"
    "mlp = MLP(C, 4 * C, dropout = 0.1)\n"
    "ln_f = LayerNorm(C)\n"
    "forward(idx: i32[B, T]) -> logits {\n"
    "    x = wte(idx) + wpe(arange(T))\n"
    "    x = x + attn(ln(x))\n"
    "    x = x + mlp(ln(x))\n"
    "    logits = ln_f(x) @ transpose(wte.weight)\n"
    "}\n"
    "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
    "train {\n"
    "    data = text(\"corpus/*.txt\", input = idx, target = targets, val = 0.1)\n"
    "    optimizer = AdamW(lr = 3e-3)\n"
    "    batch = 8\n"
    "    steps = 150\n"
    "    eval = every(steps = 150)\n"
    "    sample = generate(tokens = 20, prompt = \"the \")\n"
    "}\n";

static void build_tiny_gpt(void)
{
    StrBuf out;
    sb_init(&out);
    char path[256];
    snprintf(path, sizeof path, "%s/tiny.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(tiny_gpt, f);
    fclose(f);
    /* A repetitive text a small model can learn quickly. */
    cr_assert_eq(run("mkdir corpus && for i in $(seq 400); do echo 'the quick brown fox jumps over the lazy dog'; done > corpus/a.txt", &out), 0);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s/tiny", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    sb_free(&out);
}

Test(train, tiny_gpt_learns_and_resumes_exactly_with_dropout)
{
    build_tiny_gpt();
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --log lm.jsonl --checkpoint-dir full", &out), 0, "%s", out.data);
    const char *ev = strstr(out.data, "eval at step 150 (");
    double val = ev ? last_number_after(ev, "): loss ") : -1;
    cr_expect(val > 0 && val < 1.5, "validation loss after 150 steps is %g:\n%s", val, out.data);
    cr_expect(strstr(out.data, "sample at step 150: the "), "no sample printed:\n%s", out.data);
    out.len = 0;
    cr_assert_eq(run("./tiny --steps 70 --checkpoint-dir half && ./tiny --resume half --checkpoint-dir half", &out), 0, "%s", out.data);
    char a[512], b[512];
    snprintf(a, sizeof a, "%s/full/step-00000150/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/half/step-00000150/model.safetensors", dir);
    const char *why = ckpt_difference(a, b);
    cr_expect(!why, "150 steps differ from 70 + resume + 80 (dropout must be reproducible): %s", why);
    sb_free(&out);
}

Test(train, language_model_data_errors)
{
    build_tiny_gpt();
    expect_error("./tiny --data 'nothing/*.txt'", "nothing/*.txt");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("mkdir short && printf 'tiny' > short/a.txt", &out), 0);
    expect_error("./tiny --data 'short/*.txt'", "shorter than one window");
    sb_free(&out);
}

Test(train, token_beyond_vocabulary_is_an_error)
{
    /* The tiny GPT reading a token file whose token 300 is beyond its 256 symbols. */
    char text[4096], path[256], tok[256];
    snprintf(text, sizeof text, "%s", tiny_gpt);
    char *at = strstr(text, "text(\"corpus/*.txt\"");
    cr_assert(at);
    char rest[4096];
    snprintf(rest, sizeof rest, "%s", strchr(at, ','));
    snprintf(at, sizeof text - (size_t)(at - text), "tokens(\"big.tok\"%s", rest);
    snprintf(path, sizeof path, "%s/tok.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text, f);
    fclose(f);
    int32_t tokens[200];
    for (int i = 0; i < 200; i++) tokens[i] = i == 150 ? 300 : i % 50;
    snprintf(tok, sizeof tok, "%s/big.tok", dir);
    krt_error err;
    cr_assert_eq(krt_tokens_write(tok, tokens, 200, 2, &err), KRT_OK, "%s", err.msg);
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s/tok", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    expect_error("./tok", "token 300 at position 150 is not below the vocabulary size 256");
    sb_free(&out);
}

/* kiln emit/build --report: the memory plan's slabs for mlp.kiln, exact for the parameters
 * (269,322 floats) and AdamW's two moments, and a non-empty activation arena. */
Test(train, memory_report)
{
    char tmp[] = "/tmp/kiln-report-XXXXXX";
    cr_assert(mkdtemp(tmp));
    char args[256];
    snprintf(args, sizeof args, "emit models/mlp.kiln -o %s --report", tmp);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "parameters               1077288"), "%s", out.data);
    cr_expect(strstr(out.data, "gradients                1077288"), "%s", out.data);
    long long train = 0;
    const char *t = strstr(out.data, "activations train");
    cr_assert(t, "%s", out.data);
    sscanf(t + strlen("activations train"), "%lld", &train);
    cr_expect(train > 0, "%s", out.data);
    sb_free(&out);
    support_remove_dir(tmp);
}
