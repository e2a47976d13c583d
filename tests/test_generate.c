/* test_generate.c — text generation by inference programs (--generate; frontend/decode.c,
 * runtime/generate.c):
 *   - gpt, trained two steps: the incremental text (the decode step and its key/value
 *     cache) is the text of full recomputation (--generate-full, the predict step over the
 *     whole window for each token) byte for byte, with sampling, greedy, top-k and top-p,
 *     and past the context of 128 tokens (where both recompute the sliding window);
 *   - the same seed gives the same text, another seed another; greedy (temperature 0),
 *     top-k 1 and a tiny top-p all give the likeliest token and so one text whatever the seed;
 *   - llama.kiln writes its own attention (rotary embeddings, grouped-query heads): it
 *     generates with the cache too, its text --generate-full's;
 *   - bad flags and a model that is not a language model: exit status 2 and a message. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-generate-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(generate, .init = setup, .fini = teardown, .timeout = 300);

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

static const char *ok(const char *cmd)
{
    static StrBuf out;
    sb_free(&out);
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit status %d:\n%s", cmd, rc, out.data ? out.data : "");
    return out.data ? out.data : "";
}

static void build(const char *model, const char *extra, const char *name)
{
    StrBuf args, out;
    sb_init(&args);
    sb_init(&out);
    sb_printf(&args, "build %s %s -o %s/%s", model[0] == '/' ? model : support_path(model), extra, dir, name);
    int rc = support_run_kiln(args.data, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args.data, out.data ? out.data : "");
    sb_free(&args);
    sb_free(&out);
}

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

/* The text (stdout) of ./infer with `flags`, into file `name`; returns it (static). */
static const char *text(const char *flags, const char *name)
{
    static char buf[4][4096];
    static int k;
    k = (k + 1) % 4;
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "./infer --weights ck %s > %s && cat %s", flags, name, name);
    snprintf(buf[k], sizeof buf[k], "%s", ok(cmd));
    return buf[k];
}

/* Incremental and full recomputation give the same bytes for these flags. */
static void same_both_ways(const char *flags)
{
    char a[512], b[512];
    snprintf(a, sizeof a, "--generate %s", flags);
    snprintf(b, sizeof b, "--generate-full %s", flags);
    const char *x = text(a, "cached.txt");
    const char *y = text(b, "full.txt");
    cr_expect_str_eq(x, y, "%s: incremental and full recomputation differ", flags);
    ok("cmp cached.txt full.txt");
}

static void train_two_steps(const char *model)
{
    build(model, "", "train");
    build(model, "--infer", "infer");
    ok("head -c 40000 /usr/share/games/fortunes/computers > corpus.txt");
    ok("./train --data corpus.txt --steps 2 --checkpoint-dir ck --sample-tokens 0");
}

Test(generate, gpt_incremental_equals_full)
{
    train_two_steps("models/gpt.kiln");
    same_both_ways("--prompt 'Q: What is' --tokens 40 --seed 1");
    same_both_ways("--prompt 'Q: What is a computer' --tokens 200 --seed 7 --temperature 1"); /* 220 > 128: past the context */
    same_both_ways("--prompt 'A' --tokens 60 --temperature 0");
    same_both_ways("--prompt 'Q: ' --tokens 60 --top-k 5 --seed 3");
    same_both_ways("--prompt 'Q: ' --tokens 60 --top-k 0 --temperature 1 --seed 3"); /* all tokens */
    same_both_ways("--prompt 'Q: ' --tokens 60 --top-p 0.8 --seed 3");
    same_both_ways("--prompt 'Q: ' --tokens 60 --top-k 20 --top-p 0.5 --temperature 1.5 --seed 11");

    /* Seeds: the same text for the same one, another for another. */
    const char *a = text("--generate --prompt 'Q: ' --tokens 80 --seed 5 --temperature 1", "a.txt");
    const char *b = text("--generate --prompt 'Q: ' --tokens 80 --seed 5 --temperature 1", "b.txt");
    const char *c = text("--generate --prompt 'Q: ' --tokens 80 --seed 6 --temperature 1", "c.txt");
    cr_expect_str_eq(a, b);
    cr_expect_str_neq(a, c);
    cr_expect_eq(strlen(a), 3 + 80 + 1, "the prompt, 80 bytes and a newline: %zu", strlen(a));
    cr_expect_eq(strncmp(a, "Q: ", 3), 0, "%s", a);

    /* The likeliest token each time: greedy, top-k 1 and a tiny top-p agree, whatever the seed. */
    const char *g = text("--generate --prompt 'Q: ' --tokens 50 --temperature 0 --seed 1", "g.txt");
    cr_expect_str_eq(text("--generate --prompt 'Q: ' --tokens 50 --top-k 1 --seed 2", "k.txt"), g);
    cr_expect_str_eq(text("--generate --prompt 'Q: ' --tokens 50 --top-p 1e-9 --seed 3", "p.txt"), g);
    cr_expect_str_neq(text("--generate --prompt 'Q: ' --tokens 50 --top-k 50 --temperature 1 --seed 3", "t.txt"), g);

    /* The recipe's sample settings are the defaults: tokens = 200 after its prompt "Q: ". */
    cr_expect_eq(strlen(text("--generate --seed 1", "r.txt")), 3 + 200 + 1);

    fails("./infer --weights ck --generate --prompt ''", 2, "--prompt: the value is empty");
    fails("./infer --weights ck --generate --prompt \"$(head -c 129 corpus.txt)\"", 2, "longer than the model's context of 128");
    fails("./infer --weights ck --generate --prompt x --tokens 0", 2, "--tokens 0: give a whole number");
    fails("./infer --weights ck --generate --prompt x --temperature -1", 2, "--temperature -1: give a number");
    fails("./infer --weights ck --generate --prompt x --top-p 0", 2, "--top-p 0: give a number above 0");
    fails("./infer --weights ck --generate --prompt x --top-p 1.5", 2, "--top-p 1.5");
    fails("./infer --weights ck --generate --prompt x --seed abc", 2, "--seed abc");
    fails("./infer --weights ck --prompt x", 2, "go with --generate");
    fails("./infer --weights ck --generate --prompt x --data corpus.txt", 2, "do not go with it");
    fails("./infer --weights ck --generate --prompt x --tokens", 2, "--tokens needs a value");
    fails("./infer --weights ck --data corpus.txt --top-k 0", 2, "--top-k 0: give a whole number from 1");
}

/* llama writes its own attention (scaled_dot_product_attention over rotary-embedded q and
 * k, 4 query heads over 2 key/value heads): it generates with the cache too, no notice. */
Test(generate, llama_incremental_equals_full)
{
    train_two_steps("models/llama.kiln");
    const char *note = ok("./infer --weights ck --generate --prompt 'Q: ' --tokens 30 --seed 2 2> note.txt > /dev/null; cat note.txt");
    cr_expect(!strstr(note, "full recomputation"), "%s", note);
    same_both_ways("--prompt 'Q: ' --tokens 30 --seed 2");
    same_both_ways("--prompt 'Q: What is a computer' --tokens 200 --seed 7 --temperature 1"); /* past the context */
    same_both_ways("--prompt 'A' --tokens 60 --temperature 0");
}

/* A language model without attention or positions: its decode step has no cache and no
 * past position, and must still equal recomputation. */
Test(generate, bigram_without_cache)
{
    ok("mkdir corpus && for i in $(seq 200); do echo 'the quick brown fox jumps over the lazy dog'; done > corpus/a.txt");
    static const char lm[] = "model lm\n"
                             "dim T <= 8\n"
                             "wte = Embedding(256, 16)\n"
                             "head = Linear(16, 256)\n"
                             "forward(idx: i32[B, T]) -> logits {\n    logits = head(wte(idx))\n}\n"
                             "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
                             "train {\n    data = text(\"corpus/*.txt\", input = idx, target = targets)\n"
                             "    batch = 4\n    steps = 20\n    sample = generate(tokens = 20)\n}\n";
    char path[128];
    snprintf(path, sizeof path, "%s/lm.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(lm, f);
    fclose(f);
    build(path, "", "train");
    build(path, "--infer", "infer");
    cr_expect(strstr(ok("./train --checkpoint-dir ck"), "sample at step 20: \n"), "no sample");
    same_both_ways("--prompt 'the qu' --tokens 30 --seed 4");
}

Test(generate, not_a_language_model)
{
    build("models/mlp.kiln", "--infer", "infer");
    fails("./infer --generate --prompt x", 2, "only language models");
}
