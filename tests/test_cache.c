/* test_cache.c — kiln build compiles model.c in pieces and caches their objects
 * (cli/pieces.c, cli/objcache.c): a second build compiles nothing, a change of the recipe
 * alone compiles no kernel, a change of one layer's width compiles some kernels but not all,
 * a corrupt or truncated entry is compiled again, two builds at once both succeed, and a
 * program from the cache trains to the same bits as one compiled afresh. A small model
 * written here (a two-layer perceptron on tests' own IDX data) keeps it to seconds; every
 * build uses a cache of its own ($XDG_CACHE_HOME in a temporary directory). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "support.h"

static const char model_text[] = "model tiny\n"
                                 "fc1 = Linear(784, %d)\n"
                                 "fc2 = Linear(%d, 10)\n"
                                 "forward(image: u8[B, 28, 28]) -> logits {\n"
                                 "    x = flatten(f32(image) / 255)\n"
                                 "    logits = fc2(relu(fc1(x)))\n"
                                 "}\n"
                                 "loss(logits, label: u8[B]) = cross_entropy(logits, label)\n"
                                 "train {\n"
                                 "    data      = idx(image = \"img.idx\", label = \"lab.idx\")\n"
                                 "    optimizer = AdamW(lr = %s, weight_decay = 0.01)\n"
                                 "    batch     = 32\n"
                                 "    steps     = 3\n"
                                 "}\n";

static const char train_flags[] = "--steps 3 --data image=img.idx --data label=lab.idx --eval-data image=img.idx --eval-data label=lab.idx --checkpoint-every 3";

/* What a build's --time-passes said it compiled. */
typedef struct {
    int compiled, total, cached, kernels, kernel_pieces;
    bool recipe, host;
} Counts;

static void write_model(const char *dir, int width, const char *lr)
{
    char path[256];
    snprintf(path, sizeof path, "%s/tiny.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fprintf(f, model_text, width, width, lr);
    fclose(f);
}

/* kiln build dir/tiny.kiln -o dir/PROG with the cache in dir/cache; the counts it printed. */
static Counts build(const char *dir, const char *prog)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' build '%s/tiny.kiln' -o '%s/%s' --time-passes 2>&1", dir, KILN_BINARY, dir, dir, prog);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    const char *text = out.data ? out.data : "";
    cr_assert_eq(rc, 0, "%s\n%s", cmd, text);
    Counts c;
    memset(&c, 0, sizeof c);
    const char *at = strstr(text, "compiled ");
    cr_assert(at && sscanf(at, "compiled %d of %d pieces (%d cached)", &c.compiled, &c.total, &c.cached) == 3, "no counts in:\n%s", text);
    const char *colon = strstr(at, "cached): ");
    if (colon) {
        cr_assert_eq(sscanf(colon, "cached): %d of %d kernel pieces", &c.kernels, &c.kernel_pieces), 2, "%s", text);
        const char *eol = strchr(colon, '\n');
        c.recipe = strstr(colon, "the recipe") && strstr(colon, "the recipe") < eol;
        c.host = strstr(colon, "the host code") && strstr(colon, "the host code") < eol;
    }
    sb_free(&out);
    return c;
}

/* Trains dir/PROG three steps into dir/ck-PROG; returns what it printed (caller frees),
 * the throughput columns left out. */
static char *train(const char *dir, const char *prog)
{
    char cmd[1024];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "./%s %s --checkpoint-dir ck-%s --threads 2 2>&1 | sed 's/ [0-9.]* samples\\/s.*//'", prog, train_flags, prog);
    int rc = support_run_in(dir, cmd, &out);
    cr_assert_eq(rc, 0, "%s\n%s", cmd, out.data ? out.data : "");
    return out.data ? out.data : xstrdup("");
}

/* Whether two files have the same bytes. */
static bool same_file(const char *a, const char *b)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "cmp -s '%s' '%s'", a, b);
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    sb_free(&out);
    return rc == 0;
}

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-cache-XXXXXX");
    cr_assert(mkdtemp(dir));
    support_write_training_data(dir);
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(cache, .init = setup, .fini = teardown);

Test(cache, rebuilds_compile_what_changed)
{
    write_model(dir, 64, "1e-3");
    Counts cold = build(dir, "cold");
    cr_expect_eq(cold.compiled, cold.total, "a cold build compiles every piece (%d of %d)", cold.compiled, cold.total);
    cr_expect_eq(cold.cached, 0);
    cr_expect(cold.kernel_pieces >= 1 && cold.recipe && cold.host, "kernel pieces %d, recipe %d, host %d", cold.kernel_pieces, cold.recipe,
              cold.host);
    /* Clang in kiln compiles one kernel a piece; an external compiler (the sanitizer
     * build's kiln has no Clang) about eight, so this model is two or three pieces there,
     * too few for a one-layer change to leave any of them alone */
    const bool one_kernel_a_piece = cold.kernel_pieces > 8;

    /* the same model again: nothing compiled; the program the same, to its bytes and bits */
    Counts warm = build(dir, "warm");
    cr_expect_eq(warm.compiled, 0, "a second build compiled %d pieces", warm.compiled);
    cr_expect_eq(warm.cached, cold.total);
    char a[256], b[256];
    snprintf(a, sizeof a, "%s/cold", dir);
    snprintf(b, sizeof b, "%s/warm", dir);
    cr_expect(same_file(a, b), "the program from the cache differs from the one compiled afresh");
    char *ta = train(dir, "cold"), *tb = train(dir, "warm");
    cr_expect_str_eq(ta, tb, "losses differ:\n%s\n%s", ta, tb);
    snprintf(a, sizeof a, "%s/ck-cold/step-00000003/model.safetensors", dir);
    snprintf(b, sizeof b, "%s/ck-warm/step-00000003/model.safetensors", dir);
    StrBuf out;
    sb_init(&out);
    char cmd[2048];
    /* the weights, past the header (whose metadata names the run) */
    snprintf(cmd, sizeof cmd, "cmp -s -i $((8 + $(od -An -tu8 -N8 '%s'))):$((8 + $(od -An -tu8 -N8 '%s'))) '%s' '%s'", a, b, a, b);
    cr_expect_eq(support_run(cmd, &out), 0, "the checkpoints' weights differ (%s, %s)", a, b);
    free(ta);
    free(tb);

    /* the recipe alone: its piece, no kernel, not the host code */
    write_model(dir, 64, "2e-3");
    Counts lr = build(dir, "lr");
    cr_expect_eq(lr.kernels, 0, "a change of lr compiled %d kernel pieces", lr.kernels);
    cr_expect(lr.recipe && !lr.host && lr.compiled == 1, "a change of lr compiled %d pieces (recipe %d, host %d)", lr.compiled, lr.recipe, lr.host);
    out.len = 0;
    cr_expect_eq(support_run_in(dir, "./lr --print-recipe | grep -x 'optimizer.lr = 0.002'", &out), 0, "%s", out.data ? out.data : "");

    /* one layer's width: some kernels, not all */
    write_model(dir, 48, "2e-3");
    Counts width = build(dir, "width");
    cr_expect(width.kernels > 0 && (width.kernels < width.kernel_pieces || !one_kernel_a_piece),
              "a change of fc1's width compiled %d of %d kernel pieces", width.kernels, width.kernel_pieces);
    sb_free(&out);
}

Test(cache, a_corrupt_entry_is_compiled_again)
{
    write_model(dir, 32, "1e-3");
    Counts cold = build(dir, "cold");
    /* one entry cut short, one with a byte changed, one emptied */
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "cd '%s/cache/kiln/obj' && set -- $(ls *.o | head -3) && [ $# = 3 ] && truncate -s 100 \"$1\" && "
             "printf 'X' | dd of=\"$2\" bs=1 seek=200 conv=notrunc 2>/dev/null && : > \"$3\"",
             dir);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data ? out.data : "");
    Counts again = build(dir, "again");
    cr_expect_eq(again.compiled, 3, "3 corrupt entries, %d pieces compiled", again.compiled);
    cr_expect_eq(again.cached, cold.total - 3);
    char *t = train(dir, "again");
    cr_expect(strstr(t, "step 3/3"), "%s", t);
    free(t);
    Counts healed = build(dir, "healed");
    cr_expect_eq(healed.compiled, 0, "the entries compiled again were not stored: %d compiled", healed.compiled);
    sb_free(&out);
}

Test(cache, two_builds_at_once)
{
    write_model(dir, 40, "1e-3");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "export XDG_CACHE_HOME='%s/cache'; '%s' build '%s/tiny.kiln' -o '%s/one' 2>one.err & a=$!; "
             "'%s' build '%s/tiny.kiln' -o '%s/two' 2>two.err & b=$!; wait $a; ra=$?; wait $b; rb=$?; "
             "echo \"rc $ra $rb\"; cat one.err two.err",
             dir, KILN_BINARY, dir, dir, KILN_BINARY, dir, dir);
    StrBuf out;
    sb_init(&out);
    support_run_in(dir, cmd, &out);
    cr_assert(out.data && strstr(out.data, "rc 0 0"), "%s", out.data ? out.data : "");
    char *one = train(dir, "one"), *two = train(dir, "two");
    cr_expect_str_eq(one, two);
    cr_expect(strstr(one, "step 3/3"), "%s", one);
    free(one);
    free(two);
    Counts after = build(dir, "after");
    cr_expect_eq(after.compiled, 0, "after two builds at once, a third compiled %d pieces", after.compiled);
    sb_free(&out);
}

/* --cpu NAME: -march=NAME, part of the key (a build for another CPU compiles every piece
 * again, and runs here); a name the compiler does not know is one line of error. */
Test(cache, cpu_names_the_target)
{
#if !defined(__x86_64__)
    cr_skip_test("x86-64-v3 names an x86-64 CPU");
#else
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) cr_skip_test("this CPU cannot run x86-64-v3 code");
#endif
    write_model(dir, 24, "1e-3");
    Counts native = build(dir, "native");
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' build '%s/tiny.kiln' -o '%s/v3' --cpu x86-64-v3 --time-passes 2>&1 | grep -o 'compiled [0-9]* of [0-9]*'",
             dir, KILN_BINARY, dir, dir);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data ? out.data : "");
    char want[64];
    snprintf(want, sizeof want, "compiled %d of %d\n", native.total, native.total);
    cr_expect_str_eq(out.data, want, "--cpu x86-64-v3 after a native build: every piece compiled again");
    char *t = train(dir, "v3");
    cr_expect(strstr(t, "step 3/3"), "%s", t);
    free(t);

    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' '%s' build '%s/tiny.kiln' -o '%s/bad' --cpu no-such-cpu", dir, KILN_BINARY, dir, dir);
    out.len = 0;
    cr_expect_eq(support_run(cmd, &out), 1, "%s", out.data);
    const char *text = out.data ? out.data : "";
    cr_expect(!strncmp(text, "kiln build: error: --cpu no-such-cpu: ", 38) && strstr(text, "does not know this CPU"), "%s", text);
    cr_expect(strchr(text, '\n') == text + strlen(text) - 1, "one line of error, not:\n%s", text);

    snprintf(cmd, sizeof cmd, "'%s' build '%s/tiny.kiln' -o '%s/bad' --cpu 'x;y' 2>&1 | head -1", KILN_BINARY, dir, dir);
    out.len = 0;
    support_run(cmd, &out);
    cr_expect(out.data && strstr(out.data, "--cpu 'x;y': not a CPU name"), "%s", out.data ? out.data : "");
    sb_free(&out);
}

/* $KILN_CACHE_MAX_BYTES: after a build the cache holds at most that much (the oldest
 * entries go first), and 0 turns the cache off. */
Test(cache, the_cache_keeps_to_its_bound)
{
    write_model(dir, 20, "1e-3");
    char cmd[1024];
    snprintf(cmd, sizeof cmd,
             "export XDG_CACHE_HOME='%s/cache'; KILN_CACHE_MAX_BYTES=300K '%s' build '%s/tiny.kiln' -o '%s/small' 2>&1 && "
             "du -sb --apparent-size \"$XDG_CACHE_HOME/kiln/obj\" | cut -f1 && ls \"$XDG_CACHE_HOME/kiln/obj\" | wc -l",
             dir, KILN_BINARY, dir, dir);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data ? out.data : "");
    long long bytes = -1, files = -1;
    const char *at = out.data ? strstr(out.data, "kiln: built") : NULL;
    cr_assert(at && sscanf(strchr(at, '\n') + 1, "%lld %lld", &bytes, &files) == 2, "%s", out.data ? out.data : "");
    cr_expect(bytes <= 300 * 1024 + 4096 && files > 0, "a 300K cache holds %lld bytes in %lld files", bytes, files);
    /* later builds keep a running total (obj/.size) instead of reading the directory each
     * time: still within the bound after builds of other widths and recipes */
    for (int w = 21; w < 26; w++) {
        write_model(dir, w, w % 2 ? "1e-3" : "2e-3");
        out.len = 0;
        cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data ? out.data : "");
        at = out.data ? strstr(out.data, "kiln: built") : NULL;
        cr_assert(at && sscanf(strchr(at, '\n') + 1, "%lld %lld", &bytes, &files) == 2, "%s", out.data ? out.data : "");
        cr_expect(bytes <= 300 * 1024 + 4096, "width %d: a 300K cache holds %lld bytes in %lld files", w, bytes, files);
    }

    snprintf(cmd, sizeof cmd, "export XDG_CACHE_HOME='%s/off'; KILN_CACHE_MAX_BYTES=0 '%s' build '%s/tiny.kiln' -o '%s/off' 2>&1 && ! [ -e \"$XDG_CACHE_HOME/kiln/obj\" ]",
             dir, KILN_BINARY, dir, dir);
    out.len = 0;
    cr_expect_eq(support_run(cmd, &out), 0, "KILN_CACHE_MAX_BYTES=0 made a cache: %s", out.data ? out.data : "");
    char *t = train(dir, "off");
    cr_expect(strstr(t, "step 3/3"), "%s", t);
    free(t);
    sb_free(&out);
}
