/* test_train_run.c — what a training program does with its recipe and flags, on a tiny
 * classifier whose data the test writes (no installed dataset needed; each run takes
 * milliseconds): checkpoints (the newest K in step directories named by `latest`, both
 * files of one step, the directory checked before training), the evaluation and
 * checkpoint schedules, `--eval`, a finished run resumed, the JSONL log, data files read
 * by their content, and every flag's value checked. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "ckpt_compare.h"
#include "support.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-run-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(run, .init = setup, .fini = teardown, .timeout = 120);

static const char *at(const char *rel)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, rel);
    return buf[k];
}

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

static void put(const char *rel, const void *data, size_t n)
{
    FILE *f = fopen(at(rel), "wb");
    cr_assert(f, "cannot write %s", rel);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

/* A u8 IDX file of rank 1 or 2. */
static void put_idx(const char *rel, const uint8_t *v, uint32_t rows, uint32_t cols)
{
    unsigned char buf[1024];
    size_t k = 0;
    int rank = cols ? 2 : 1;
    buf[k++] = 0, buf[k++] = 0, buf[k++] = 8, buf[k++] = (unsigned char)rank;
    uint32_t dims[2] = {rows, cols};
    for (int i = 0; i < rank; i++)
        for (int b = 3; b >= 0; b--) buf[k++] = (unsigned char)(dims[i] >> 8 * b);
    size_t n = (size_t)rows * (cols ? cols : 1);
    memcpy(buf + k, v, n);
    put(rel, buf, k + n);
}

/* The same array as a .npy file. */
static void put_npy(const char *rel, const uint8_t *v, uint32_t rows, uint32_t cols)
{
    char dict[128];
    snprintf(dict, sizeof dict, "{'descr': '|u1', 'fortran_order': False, 'shape': (%u, %u), }", rows, cols);
    unsigned char buf[1024];
    size_t dl = strlen(dict), hl = (10 + dl + 1 + 63) / 64 * 64 - 10; /* data aligned to 64 */
    memcpy(buf, "\x93NUMPY\x01\x00", 8);
    buf[8] = (unsigned char)hl, buf[9] = 0;
    memcpy(buf + 10, dict, dl);
    memset(buf + 10 + dl, ' ', hl - dl - 1);
    buf[10 + hl - 1] = '\n';
    memcpy(buf + 10 + hl, v, (size_t)rows * cols);
    put(rel, buf, 10 + hl + (size_t)rows * cols);
}

/* 40 training samples (10 steps of 4 per epoch) and 12 evaluation samples: feature y of
 * sample i is large for its class y = i % 3. */
static uint8_t X[40 * 4], Y[40];

static void write_data(void)
{
    uint32_t r = 12345;
    for (int i = 0; i < 40; i++) {
        Y[i] = (uint8_t)(i % 3);
        for (int j = 0; j < 4; j++) {
            r = r * 1103515245u + 12345u;
            X[i * 4 + j] = (uint8_t)((r >> 16) % 50 + (j == Y[i] ? 200 : 0));
        }
    }
    put_idx("x.idx", X, 40, 4);
    put_idx("y.idx", Y, 40, 0);
    put_idx("ex.idx", X, 12, 4);
    put_idx("ey.idx", Y, 12, 0);
}

/* Writes tiny.kiln with the given lines in its train section and builds ./tiny (with the
 * build flags `flags`). */
static void build_with(const char *train_lines, const char *flags)
{
    write_data();
    char text[2048];
    snprintf(text, sizeof text,
             "model tiny\n"
             "fc = Linear(4, 3)\n"
             "forward(x: u8[B, 4]) -> logits {\n"
             "    logits = fc(f32(x) / 255)\n"
             "}\n"
             "loss(logits, y: u8[B]) = cross_entropy(logits, y)\n"
             "metric accuracy = mean(argmax(logits) == y)\n"
             "train {\n"
             "    data = idx(x = \"x.idx\", y = \"y.idx\")\n"
             "    eval_data = idx(x = \"ex.idx\", y = \"ey.idx\")\n"
             "    optimizer = AdamW(lr = 0.01)\n"
             "    batch = 4\n"
             "    epochs = 5\n"
             "%s"
             "}\n",
             train_lines);
    put("tiny.kiln", text, strlen(text));
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s %s -o %s", at("tiny.kiln"), flags, at("tiny"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln build failed:\n%s", out.data);
    sb_free(&out);
}

static void build(const char *train_lines) { build_with(train_lines, ""); }

static char *slurp(const char *rel, size_t *n)
{
    StrBuf err;
    sb_init(&err);
    char *d = util_read_file(at(rel), n, &err);
    sb_free(&err);
    return d;
}

static bool exists(const char *rel) { return access(at(rel), F_OK) == 0; }

/* Names in a directory of the test, sorted, joined by '|'. */
static const char *listing(const char *rel)
{
    static StrBuf out; /* the previous listing's buffer is reused */
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -A %s | tr '\\n' '|'", rel);
    cr_assert_eq(run(cmd, &out), 0, "%s", out.data);
    return out.data ? out.data : "";
}

/* The "step" of a checkpoint file's metadata. */
static long long meta_step(const char *rel)
{
    krt_safetensors *st;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(at(rel), &st, &err), KRT_OK, "%s", err.msg);
    const char *s = krt_safetensors_meta(st, "step");
    long long v = s ? atoll(s) : -1;
    krt_safetensors_free(st);
    return v;
}

static int count(const char *text, const char *needle)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p++) n++;
    return n;
}

/* A command that must fail (status 1 or 2, no crash) with `want` in its output. */
static void expect_error(const char *cmd, const char *want)
{
    StrBuf out;
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_expect(rc == 1 || rc == 2, "`%s` should fail cleanly, exit %d:\n%s", cmd, rc, out.data);
    cr_expect(out.data && strstr(out.data, want), "`%s`: expected a message containing '%s', got:\n%s", cmd, want, out.data);
    sb_free(&out);
}

/* ---- checkpoints ---- */

Test(run, keeps_the_newest_k_checkpoints_each_of_one_step)
{
    build("    checkpoint = every(steps = 5, keep = 3)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny", &out), 0, "%s", out.data);
    cr_expect_str_eq(listing("checkpoints"), "latest|step-00000040|step-00000045|step-00000050|");
    size_t n;
    char *latest = slurp("checkpoints/latest", &n);
    cr_expect(latest && !strcmp(latest, "step-00000050\n"), "latest: %s", latest);
    free(latest);
    cr_expect_eq(meta_step("checkpoints/step-00000045/model.safetensors"), 45);
    cr_expect_eq(meta_step("checkpoints/step-00000045/train_state.safetensors"), 45);
    /* --checkpoint-keep overrides the recipe's keep. */
    cr_assert_eq(run("./tiny --checkpoint-dir one --checkpoint-keep 1 --steps 12", &out), 0, "%s", out.data);
    cr_expect_str_eq(listing("one"), "latest|step-00000012|");
    /* keep = 0 is refused by kiln check. */
    const char *keep0 = "model k\nfc = Linear(4, 3)\nforward(x: u8[B, 4]) -> y {\n    y = fc(f32(x))\n}\nloss(y) = sum(y)\n"
                        "train {\n    checkpoint = every(keep = 0)\n}\n";
    put("keep0.kiln", keep0, strlen(keep0));
    char args[512];
    snprintf(args, sizeof args, "check %s", at("keep0.kiln"));
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(strstr(out.data, "every(keep): 0 is out of range [1, 1000]"), "%s", out.data);
    sb_free(&out);
}

Test(run, resume_follows_latest_and_falls_back)
{
    build("    checkpoint = every(steps = 10, keep = 2)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --checkpoint-dir full", &out), 0, "%s", out.data);
    /* 50 steps at once, and 20 + 30 from `latest`: the same tensors and training state
     * (the run ids differ: a resumed run is a run of its own). */
    cr_assert_eq(run("./tiny --checkpoint-dir half --steps 20 && ./tiny --checkpoint-dir half --resume half", &out), 0, "%s", out.data);
    const char *files[] = {"model.safetensors", "train_state.safetensors"};
    for (int i = 0; i < 2; i++) {
        char a[128], b[128];
        snprintf(a, sizeof a, "full/step-00000050/%s", files[i]);
        snprintf(b, sizeof b, "half/step-00000050/%s", files[i]);
        const char *why = ckpt_difference(at(a), at(b));
        cr_expect(!why, "50 steps differ from 20 + resume + 30: %s", why);
    }
    /* Without the pointer: the highest complete step directory (40, not the later
     * temporary directory of a crashed save, which is never taken). */
    cr_assert_eq(run("cp -r full f2 && rm f2/latest && rm -r f2/step-00000050 && mkdir f2/.step-00000060.tmp.1 && "
                     "cp full/step-00000050/* f2/.step-00000060.tmp.1/ && ./tiny --resume f2 --steps 45 --checkpoint-dir f2",
                     &out),
                 0, "%s", out.data);
    cr_expect(strstr(out.data, "step 45/45"), "%s", out.data);
    cr_expect_eq(meta_step("f2/step-00000045/model.safetensors"), 45);
    /* The old layout, the two files directly in the directory, still resumes. */
    cr_assert_eq(run("mkdir old && cp full/step-00000040/* old/ && ./tiny --resume old --checkpoint-dir old", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "step 50/50"), "%s", out.data);
    cr_expect_str_eq(listing("old"), "latest|step-00000050|");
    sb_free(&out);
}

Test(run, a_model_and_a_state_of_different_steps_are_refused)
{
    build("    checkpoint = every(steps = 10, keep = 3)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny && mkdir mixed && cp checkpoints/step-00000040/model.safetensors mixed/ && "
                     "cp checkpoints/step-00000050/train_state.safetensors mixed/",
                     &out),
                 0, "%s", out.data);
    expect_error("./tiny --resume mixed --steps 60", "mixed/model.safetensors is of step 40 but mixed/train_state.safetensors is of step 50");
    /* A step directory whose files are of another step. */
    cr_assert_eq(run("mv checkpoints/step-00000040 checkpoints/step-00000041 && echo step-00000041 > checkpoints/latest", &out), 0);
    expect_error("./tiny --resume checkpoints --steps 60", "checkpoints/step-00000041: the checkpoint's files are of step 40");
    /* A training position beyond the data it resumes on (sample 28 of the first epoch). */
    cr_assert_eq(run("./tiny --steps 7 --checkpoint-dir p7", &out), 0, "%s", out.data);
    expect_error("./tiny --resume p7 --steps 9 --limit 8", "--resume p7: the checkpoint stands at sample 28 of an epoch, but the training data has 8");
    /* A pointer that is not one. */
    cr_assert_eq(run("echo ../elsewhere > checkpoints/latest", &out), 0);
    expect_error("./tiny --resume checkpoints --steps 60", "checkpoints/latest: not a checkpoint pointer");
    sb_free(&out);
}

/* Rewrites the checkpoint file `rel` with metadata `key` set to `value` (NULL: removed),
 * its checksums recomputed (`checked`) or left out, as a file written elsewhere has none. */
static void rewrite_meta(const char *rel, const char *key, const char *value, bool checked)
{
    krt_safetensors *st;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(at(rel), &st, &err), KRT_OK, "%s", err.msg);
    int n = krt_safetensors_count(st), nm = krt_safetensors_meta_count(st), k = 0;
    krt_st_tensor *t = calloc((size_t)n + 1, sizeof *t);
    krt_st_meta *m = calloc((size_t)nm + 2, sizeof *m);
    cr_assert(t && m);
    for (int i = 0; i < n; i++) t[i] = *krt_safetensors_tensor(st, i);
    bool done = !key;
    for (int i = 0; i < nm; i++) {
        const krt_st_meta *e = krt_safetensors_meta_entry(st, i);
        if (!strncmp(e->key, "crc32:", 6)) continue;
        if (key && !strcmp(e->key, key)) {
            if (value) m[k++] = (krt_st_meta){key, value};
            done = true;
        } else {
            m[k++] = *e;
        }
    }
    if (!done && value) m[k++] = (krt_st_meta){key, value};
    krt_status s = checked ? krt_safetensors_write_checked(at(rel), t, n, m, k, &err) : krt_safetensors_write(at(rel), t, n, m, k, &err);
    cr_assert_eq(s, KRT_OK, "%s", err.msg);
    free(t);
    free(m);
    krt_safetensors_free(st);
}

/* Flips bits `mask` of the last byte of a file (the data of its last tensor). */
static void flip_last_byte(const char *rel, unsigned char mask)
{
    size_t n;
    char *d = slurp(rel, &n);
    cr_assert(d && n > 0);
    d[n - 1] = (char)(d[n - 1] ^ mask);
    put(rel, d, n);
    free(d);
}

/* Replaces the first `from` in a file by `to`, of the same length. */
static void patch(const char *rel, const char *from, const char *to)
{
    size_t n, k = strlen(from);
    char *d = slurp(rel, &n);
    cr_assert(d && strlen(to) == k);
    char *p = d;
    while (p + k <= d + n && memcmp(p, from, k)) p++;
    cr_assert(p + k <= d + n, "%s has no '%s'", rel, from);
    memcpy(p, to, k);
    put(rel, d, n);
    free(d);
}

/* Resuming c must fail with `want` in the message and before training anything. */
static void expect_resume_refused(const char *want)
{
    StrBuf out;
    sb_init(&out);
    int rc = run("./tiny --resume c --steps 60 --checkpoint-dir c", &out);
    cr_expect(rc == 1 || rc == 2, "resuming should fail cleanly (%s), exit %d:\n%s", want, rc, out.data);
    cr_expect(out.data && strstr(out.data, want), "expected a message containing '%s', got:\n%s", want, out.data);
    cr_expect(out.data && !strstr(out.data, " parameters, "), "it trained:\n%s", out.data);
    sb_free(&out);
}

Test(run, corrupted_checkpoints_are_refused_by_name)
{
    build("    checkpoint = every(steps = 10, keep = 5)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny && ./tiny --checkpoint-dir other", &out), 0, "%s", out.data);
#define FRESH() cr_assert_eq(run("rm -rf c && cp -r checkpoints c", &out), 0, "%s", out.data)
    /* Every field, edited with the checksums made to match (or as a file written elsewhere
     * would be): checked alone, against the other file and against the directory. */
    static const struct {
        const char *file, *key, *value, *want;
    } edits[] = {
        {"train_state", "step", "001", "train_state.safetensors: the metadata's 'step' is \"001\", not a whole number from 0 to 1000000000000"},
        {"train_state", "step", "abc", "train_state.safetensors: the metadata's 'step' is \"abc\""},
        {"train_state", "step", "-5", "train_state.safetensors: the metadata's 'step' is \"-5\""},
        {"train_state", "step", "100000000000000000000", "train_state.safetensors: the metadata's 'step' is \"100000000000000000000\""},
        {"train_state", "step", "", "train_state.safetensors: the metadata's 'step' is \"\""},
        {"train_state", "step", NULL, "train_state.safetensors: the metadata has no 'step'"},
        {"train_state", "step", "40", "c/step-00000050/model.safetensors is of step 50 but c/step-00000050/train_state.safetensors is of step 40"},
        {"model", "step", "49", "c/step-00000050/model.safetensors is of step 49 but"},
        {"model", "step", "5x", "model.safetensors: the metadata's 'step' is \"5x\""},
        {"train_state", "optimizer_step", "0", "train_state.safetensors: the metadata's 'optimizer_step' is \"0\", but must be 50 (the optimizer takes one step per training step)"},
        {"train_state", "optimizer_step", "51", "the metadata's 'optimizer_step' is \"51\", but must be 50"},
        {"train_state", "epoch", "-3", "train_state.safetensors: the metadata's 'epoch' is \"-3\", not a whole number from 0 to 50"},
        {"train_state", "epoch", "99", "the metadata's 'epoch' is \"99\", not a whole number from 0 to 50"},
        {"train_state", "position", "2.5", "the metadata's 'position' is \"2.5\""},
        {"train_state", "seed", "abc", "the metadata's 'seed' is \"abc\""},
        {"train_state", "seed", "-1", "the metadata's 'seed' is \"-1\""},
        {"train_state", "batches", "49", "the metadata's 'batches' is \"49\", not a whole number from 50 to"},
        {"train_state", "run_id", "xyz", "train_state.safetensors: the metadata's 'run_id' is \"xyz\", not 16 hexadecimal digits"},
        {"train_state", "run_id", NULL, "train_state.safetensors is of run (none): the two files of a checkpoint must be of one run"},
        {"model", "kiln_hash", "0123456789abcdef", "model.safetensors: this checkpoint belongs to another model"},
    };
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        FRESH();
        char rel[128];
        snprintf(rel, sizeof rel, "c/step-00000050/%s.safetensors", edits[i].file);
        rewrite_meta(rel, edits[i].key, edits[i].value, i % 2 == 0);
        expect_resume_refused(edits[i].want);
    }
    /* A flipped bit anywhere: in a weight, in an exponent of the optimizer state, in the
     * metadata (edited in place). */
    FRESH();
    flip_last_byte("c/step-00000050/model.safetensors", 0x01);
    expect_resume_refused("c/step-00000050/model.safetensors: tensor 'fc.bias' does not match its checksum");
    FRESH();
    flip_last_byte("c/step-00000050/train_state.safetensors", 0x40);
    expect_resume_refused("c/step-00000050/train_state.safetensors: tensor 'exp_avg_sq.fc.bias' does not match its checksum");
    FRESH();
    patch("c/step-00000050/train_state.safetensors", "\"epoch\":\"5\"", "\"epoch\":\"4\"");
    expect_resume_refused("c/step-00000050/train_state.safetensors: the metadata does not match its checksum");
    /* The training state of another step, of another run of the same step. */
    FRESH();
    cr_assert_eq(run("cp checkpoints/step-00000040/train_state.safetensors c/step-00000050/", &out), 0);
    expect_resume_refused("c/step-00000050/model.safetensors is of step 50 but c/step-00000050/train_state.safetensors is of step 40");
    FRESH();
    cr_assert_eq(run("cp other/step-00000050/train_state.safetensors c/step-00000050/", &out), 0);
    expect_resume_refused("c/step-00000050/model.safetensors is of run ");
    expect_resume_refused("c/step-00000050/train_state.safetensors is of run ");
    /* A resumed run keeps its seed. */
    FRESH();
    expect_error("./tiny --resume c --steps 60 --seed 7", "--seed 7: the run in c has seed 0, which a resumed run keeps");
    /* Files without checksums (written elsewhere) resume, and continue exactly. */
    FRESH();
    rewrite_meta("c/step-00000040/model.safetensors", NULL, NULL, false);
    rewrite_meta("c/step-00000040/train_state.safetensors", NULL, NULL, false);
    cr_assert_eq(run("echo step-00000040 > c/latest && ./tiny --resume c --checkpoint-dir c", &out), 0, "%s", out.data);
    const char *why = ckpt_difference(at("c/step-00000050/model.safetensors"), at("checkpoints/step-00000050/model.safetensors"));
    cr_expect(!why, "%s", why);
#undef FRESH
    sb_free(&out);
}

Test(run, an_unusable_checkpoint_directory_fails_before_training)
{
    build("");
    StrBuf out;
    sb_init(&out);
    const char *dirs[] = {"afile/ck", "afile"};
    put("afile", "x", 1);
    for (int i = 0; i < 2; i++) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "./tiny --checkpoint-dir %s", dirs[i]);
        int rc = run(cmd, &out);
        cr_expect_eq(rc, 1, "%s", out.data);
        cr_expect(strstr(out.data, dirs[i]), "%s: %s", dirs[i], out.data);
        cr_expect(!strstr(out.data, "step ") && !strstr(out.data, "eval at"), "%s: it trained first:\n%s", dirs[i], out.data);
    }
    /* missing parents are created before training, as mkdir -p does */
    cr_expect_eq(run("./tiny --steps 1 --checkpoint-dir missing/parents/ck", &out), 0, "%s", out.data);
    cr_expect(strstr(listing("missing/parents/ck"), "latest"), "no checkpoint in missing/parents/ck: %s", listing("missing/parents/ck"));
    if (geteuid() != 0) {
        cr_assert_eq(run("mkdir ro && chmod a-w ro", &out), 0);
        expect_error("./tiny --checkpoint-dir ro", "ro: cannot write checkpoints into this directory: Permission denied");
    }
    sb_free(&out);
}

/* Under a file-size limit below 1 KiB (between the tiny model's two checkpoint files),
 * LLVM's OpenMP runtime cannot start: it registers itself in a 1 KiB shared-memory file
 * ("OMP: Error #179: Can't set size of SHM"). The program is built with the external
 * compiler (GCC's libgomp) for this test; with a real full disk both runtimes start. */
Test(run, a_failed_save_keeps_the_previous_checkpoint_and_stops)
{
    char flags[300];
    snprintf(flags, sizeof flags, "--cc %s", KILN_CC);
    build_with("", flags);
    StrBuf out, out2;
    sb_init(&out);
    sb_init(&out2);
    cr_assert_eq(run("./tiny --steps 5 --checkpoint-every 1 --checkpoint-dir ck && ./tiny --steps 10 --checkpoint-dir full", &out), 0, "%s",
                 out.data);
    /* A file-size limit between the sizes of the two files (about 400 and 770 bytes): the
     * next checkpoint's training state cannot be written, as on a full disk (even as root). */
    struct stat model, state;
    cr_assert(stat(at("ck/step-00000005/model.safetensors"), &model) == 0 && stat(at("ck/step-00000005/train_state.safetensors"), &state) == 0);
    cr_assert_lt(model.st_size + 64, state.st_size);
    struct rlimit old, lim;
    cr_assert_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    lim = (struct rlimit){(rlim_t)(model.st_size + state.st_size) / 2, old.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    int rc = run("./tiny --resume ck --steps 10 --checkpoint-every 1 --checkpoint-dir ck --log l.jsonl", &out);
    int rc2 = run("./tiny --steps 10 --checkpoint-dir none", &out2);
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    cr_expect_eq(rc, 1, "%s", out.data);
    cr_expect(strstr(out.data, "train_state.safetensors: writing failed: File too large"), "%s", out.data);
    cr_expect(strstr(out.data, "the checkpoint of step 6 was not saved; the newest checkpoint is still ck/step-00000005 (--resume ck continues from it)"),
              "%s", out.data);
    cr_expect_str_eq(listing("ck"), "latest|step-00000004|step-00000005|");
    size_t n;
    char *log = slurp("l.jsonl", &n);
    cr_expect(log && strstr(log, "{\"step\": 6,") && !strstr(log, "{\"step\": 7,"), "it did not stop at step 6:\n%s", log);
    free(log);
    /* The first checkpoint of a run. */
    cr_expect_eq(rc2, 1, "%s", out2.data);
    cr_expect(strstr(out2.data, "the checkpoint of step 10 was not saved; none holds no checkpoint"), "%s", out2.data);
    cr_expect_str_eq(listing("none"), "");
    /* With room again, the run resumes from step 5 and ends as one that never stopped. */
    cr_assert_eq(run("./tiny --resume ck --steps 10 --checkpoint-every 1 --checkpoint-dir ck", &out), 0, "%s", out.data);
    const char *why = ckpt_difference(at("ck/step-00000010/model.safetensors"), at("full/step-00000010/model.safetensors"));
    cr_expect(!why, "%s", why);
    sb_free(&out);
    sb_free(&out2);
}

/* ---- schedules, --eval, the end of a run ---- */

/* The steps of the "eval at step N" lines, joined by ','. */
static const char *eval_steps(const char *text)
{
    static char buf[256];
    buf[0] = 0;
    for (const char *p = text; (p = strstr(p, "eval at step ")); p++) {
        char num[24];
        snprintf(num, sizeof num, "%s%d", buf[0] ? "," : "", atoi(p + 13));
        strcat(buf, num);
    }
    return buf;
}

Test(run, eval_and_checkpoints_every_n_epochs_or_steps)
{
    build("    eval = every(epochs = 2)\n    checkpoint = every(epochs = 2, keep = 10)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny", &out), 0, "%s", out.data);
    cr_expect_str_eq(eval_steps(out.data), "20,40,50", "%s", out.data);
    cr_expect_str_eq(listing("checkpoints"), "latest|step-00000020|step-00000040|step-00000050|");
    /* --eval-every N: every N steps instead. */
    cr_assert_eq(run("./tiny --eval-every 15 --checkpoint-every 25 --checkpoint-dir c2", &out), 0, "%s", out.data);
    cr_expect_str_eq(eval_steps(out.data), "15,30,45,50", "%s", out.data);
    cr_expect_str_eq(listing("c2"), "latest|step-00000025|step-00000050|");
    /* Both counts in the recipe: both act; steps alone: steps only. */
    build("    eval = every(steps = 15, epochs = 2)\n    checkpoint = every(steps = 30, keep = 10)\n");
    cr_assert_eq(run("rm -r checkpoints && ./tiny", &out), 0, "%s", out.data);
    cr_expect_str_eq(eval_steps(out.data), "15,20,30,40,45,50", "%s", out.data);
    cr_expect_str_eq(listing("checkpoints"), "latest|step-00000030|step-00000050|");
    sb_free(&out);
}

/* The recipe's eval batches cut the evaluations during training short; --eval evaluates all
 * of the evaluation data unless --eval-batches says otherwise; every evaluation line and
 * JSONL record says how many samples it covered. */
Test(run, eval_lines_say_their_samples_and_eval_flag_takes_all_of_them)
{
    build("    eval = every(epochs = 5, batches = 1)\n");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --checkpoint-dir ck --log t.jsonl", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "eval at step 50 (4 samples): loss "), "%s", out.data);
    cr_assert_eq(run("./tiny --resume ck --eval --log e.jsonl", &out), 0, "%s", out.data);
    cr_expect(!strncmp(out.data, "eval at step 50 (12 samples): loss ", 35), "%s", out.data);
    cr_assert_eq(run("./tiny --resume ck --eval --eval-batches 2 --log e.jsonl", &out), 0, "%s", out.data);
    cr_expect(!strncmp(out.data, "eval at step 50 (8 samples): loss ", 34), "%s", out.data);
    cr_assert_eq(run("./tiny --resume ck --eval --eval-batches 1 --batch 1", &out), 0, "%s", out.data);
    cr_expect(!strncmp(out.data, "eval at step 50 (1 sample): loss ", 33), "%s", out.data);
    cr_assert_eq(run("./tiny --steps 1 --checkpoint-dir one", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, " training samples, 1 step of 4 (x1), "), "the start line counts its nouns:\n%s", out.data);
    size_t n;
    char *log = slurp("t.jsonl", &n);
    cr_assert(log, "no log");
    cr_expect(strstr(log, "\"eval_accuracy\": ") && strstr(log, ", \"samples\": 4}\n"), "%s", log);
    free(log);
    log = slurp("e.jsonl", &n);
    cr_assert(log, "no log");
    const char *second = strchr(log, '\n'), *all = strstr(log, ", \"samples\": 12}\n");
    cr_expect(all && all < second, "%s", log);
    cr_expect(second && strstr(second, ", \"samples\": 8}\n"), "%s", log);
    free(log);
    sb_free(&out);
}

Test(run, eval_flag_evaluates_and_exits)
{
    build("");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --checkpoint-dir ck", &out), 0, "%s", out.data);
    const char *trained = strstr(out.data, "eval at step 50 (12 samples): ");
    cr_assert(trained, "%s", out.data);
    char want[128];
    snprintf(want, sizeof want, "%.*s", (int)strcspn(trained, "\n"), trained);
    cr_assert_eq(run("./tiny --resume ck --eval --log e.jsonl", &out), 0, "%s", out.data);
    cr_expect(!strncmp(out.data, want, strlen(want)) && count(out.data, "\n") == 1, "expected only '%s', got:\n%s", want, out.data);
    size_t n;
    char *log = slurp("e.jsonl", &n);
    cr_assert(log, "no log");
    cr_expect(!strncmp(log, "{\"step\": 50, \"eval_loss\": ", 26) && strstr(log, "\"eval_accuracy\": ") && strstr(log, ", \"samples\": 12}\n") &&
                  count(log, "\n") == 1,
              "%s", log);
    free(log);
    cr_expect_str_eq(listing("ck"), "latest|step-00000040|step-00000050|"); /* nothing saved */
    /* Fresh weights: step 0. With --eval-data, on those files. */
    cr_assert_eq(run("./tiny --eval", &out), 0, "%s", out.data);
    cr_expect(!strncmp(out.data, "eval at step 0 (12 samples): loss ", 34), "%s", out.data);
    cr_expect(!exists("checkpoints"), "--eval made a checkpoint directory");
    cr_assert_eq(run("./tiny --resume ck --eval --eval-data x=x.idx --eval-data y=y.idx --eval-batches 1", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "eval at step 50 (4 samples): ") && strcmp(out.data, want), "%s", out.data);
    expect_error("./tiny --eval --steps 3", "--steps has no effect with --eval");
    expect_error("./tiny --eval --bench-steps 3", "--eval and --bench-steps");
    sb_free(&out);
}

Test(run, resuming_a_finished_run_says_it_is_complete)
{
    build("");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny", &out), 0, "%s", out.data);
    cr_assert_eq(run("./tiny --resume checkpoints", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "already complete (step 50 of 50)") && strstr(out.data, "--eval"), "%s", out.data);
    cr_expect(!strstr(out.data, "parameters"), "%s", out.data);
    /* --steps beyond it trains on. */
    cr_assert_eq(run("./tiny --resume checkpoints --steps 53", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "step 53/53"), "%s", out.data);
    sb_free(&out);
}

Test(run, log_has_the_gradient_norm_and_the_epoch_of_each_step)
{
    build("");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --log l.jsonl", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "step 50/50  epoch 5  "), "%s", out.data);
    size_t n;
    char *log = slurp("l.jsonl", &n);
    cr_assert(log);
    int steps = 0;
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        if (!strstr(line, "\"loss\"")) continue;
        steps++;
        double g = strtod(strstr(line, "\"grad_norm\": ") + 13, NULL);
        int epoch = atoi(strstr(line, "\"epoch\": ") + 9);
        cr_expect(g > 0, "no gradient norm without clipping: %s", line);
        cr_expect_eq(epoch, (steps - 1) / 10 + 1, "step %d is of epoch %d: %s", steps, (steps - 1) / 10 + 1, line);
    }
    cr_expect_eq(steps, 50);
    free(log);
    sb_free(&out);
}

/* ---- data files ---- */

Test(run, data_files_are_read_by_their_content)
{
    build("");
    put_npy("x.npy", X, 40, 4);
    StrBuf out;
    sb_init(&out);
    /* An .npy file where the recipe reads IDX, and IDX under a .npy name. */
    cr_assert_eq(run("./tiny --steps 3 --data x=x.npy", &out), 0, "%s", out.data);
    cr_assert_eq(run("cp y.idx y.npy && ./tiny --steps 3 --data y=y.npy", &out), 0, "%s", out.data);
    put("junk.idx", "PK\3\4junk", 8);
    expect_error("./tiny --steps 3 --data x=junk.idx", "junk.idx: not a data file of a format Kiln reads (tried IDX");
    expect_error("./tiny --steps 3 --data x=nothere.idx", "nothere.idx: cannot open");
    sb_free(&out);
}

/* A byte-level language model on the texts of corpus/, minus its *.dat files. */
static void build_lm(void)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("mkdir -p corpus && for i in $(seq 20); do echo 'the quick brown fox'; done > corpus/a.txt && "
                     "printf 'abcdefghijklmnopqrstuvwxyz0123456789' > corpus/long.dat && printf 'xyz' > corpus/short.dat",
                     &out),
                 0, "%s", out.data);
    const char *text = "model lm\nconst V = 256, block = 8, C = 8\ndim T <= block\nwte = Embedding(V, C)\nhead = Linear(C, V)\n"
                       "forward(idx: i32[B, T]) -> logits {\n    logits = head(wte(idx))\n}\n"
                       "loss(logits, targets: i32[B, T]) = cross_entropy(logits, targets)\n"
                       "train {\n    data = text(\"corpus/*\", exclude = \"*.dat\", input = idx, target = targets, val = 0.1)\n"
                       "    batch = 2\n    steps = 3\n}\n";
    put("lm.kiln", text, strlen(text));
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s", at("lm.kiln"), at("lm"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln build failed:\n%s", out.data);
    sb_free(&out);
}

Test(run, data_errors_name_the_file)
{
    build("");
    put_idx("none_x.idx", X, 0, 4);
    put_idx("none_y.idx", Y, 0, 0);
    put_idx("one_x.idx", X, 1, 4);
    put_idx("one_y.idx", Y, 1, 0);
    expect_error("./tiny --data x=none_x.idx --data y=none_y.idx", "none_x.idx: the training data has no samples (0 rows)");
    expect_error("./tiny --eval-data x=none_x.idx --eval-data y=none_y.idx", "none_x.idx: the evaluation data has no samples (0 rows)");
    expect_error("./tiny --data x=one_x.idx --data y=one_y.idx", "the training data has 1 sample, fewer than one batch of 4");
    build_lm();
    expect_error("./lm --data corpus/short.dat", "corpus/short.dat: text of 3 tokens is shorter than one window of 8+1");
}

Test(run, the_recipes_exclude_does_not_apply_to_data_given_by_flag)
{
    build_lm();
    StrBuf out;
    sb_init(&out);
    /* The recipe's glob leaves out *.dat; a *.dat file or glob given with --data is read. */
    cr_assert_eq(run("./lm", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "lm: 4352 parameters, 44 training samples"), "%s", out.data);
    cr_assert_eq(run("cat corpus/long.dat corpus/long.dat corpus/long.dat > corpus/longer.dat && ./lm --data corpus/longer.dat", &out), 0,
                 "%s", out.data);
    cr_expect(strstr(out.data, "lm: 4352 parameters, 12 training samples"), "%s", out.data);
    cr_assert_eq(run("./lm --data 'corpus/*.dat'", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "lm: 4352 parameters, 16 training samples"), "%s", out.data);
    sb_free(&out);
}

/* ---- flags ---- */

/* ---- TensorBoard event files ---- */

/* Checks the event files in tbdir with TensorBoard's own reader (tests/tboard/check_events.py
 * in the tests' Python environment, which scripts/deps.sh makes) against the JSONL log and
 * the printed samples of the same runs; its report in out. */
static void check_tensorboard(const char *tbdir, const char *log, const char *printed, StrBuf *out)
{
    const char *python = KILN_SOURCE_DIR "/.venv/bin/python";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "'%s' -c 'import tensorboard'", python);
    cr_assert_eq(run(cmd, out), 0, "TensorBoard's reader is missing: run scripts/deps.sh, which installs it in %s/.venv\n%s", KILN_SOURCE_DIR,
                 out->data);
    snprintf(cmd, sizeof cmd, "'%s' '%s' %s %s %s", python, support_path("tests/tboard/check_events.py"), tbdir, log, printed);
    cr_assert_eq(run(cmd, out), 0, "%s", out->data);
}

Test(run, tensorboard_reads_the_events_the_log_has)
{
    build("");
    StrBuf out;
    sb_init(&out);
    /* 25 steps, then, as after a crash that lost step 25's checkpoint, a resumed run from
     * step 20 to 30: the log has steps 21 to 25 twice, TensorBoard must show them once. */
    cr_assert_eq(run("./tiny --steps 25 --checkpoint-every 10 --checkpoint-keep 5 --log l.jsonl --tensorboard runs/a > printed.txt", &out), 0,
                 "%s", out.data);
    cr_assert_eq(run("rm -r checkpoints/step-00000025 && ./tiny --resume checkpoints --steps 30 --log l.jsonl --tensorboard runs/a >> printed.txt",
                     &out),
                 0, "%s", out.data);
    cr_expect_eq(count(listing("runs/a"), "events.out.tfevents."), 2, "a file for each run: %s", listing("runs/a"));
    check_tensorboard("runs/a", "l.jsonl", "printed.txt", &out);
    static const char *const seen[] = {"files: 2\n", "train/loss: 30 steps", "train/accuracy: 30 steps", "train/lr: 30 steps",
                                       "train/grad_norm: 30 steps", "train/samples_per_s: 30 steps", "eval/loss: 3 steps", "eval/accuracy: 3 steps"};
    for (size_t i = 0; i < sizeof seen / sizeof seen[0]; i++) cr_expect(strstr(out.data, seen[i]), "no '%s' in:\n%s", seen[i], out.data);
    /* --eval: its evaluation, at the checkpoint's step. */
    cr_assert_eq(run("./tiny --resume checkpoints --eval --log e.jsonl --tensorboard runs/e > e.txt", &out), 0, "%s", out.data);
    check_tensorboard("runs/e", "e.jsonl", "e.txt", &out);
    cr_expect(strstr(out.data, "eval/loss: 1 steps"), "%s", out.data);
    /* A language model's samples, as text. */
    build_lm();
    cr_assert_eq(run("./lm --eval-every 1 --sample-tokens 40 --prompt 'the ' --log lm.jsonl --tensorboard lmtb > lm.txt", &out), 0, "%s", out.data);
    check_tensorboard("lmtb", "lm.jsonl", "lm.txt", &out);
    cr_expect(strstr(out.data, "samples/text: 3 samples") && strstr(out.data, "train/tokens_per_s: 3 steps"), "%s", out.data);
    /* A prompt longer than the window (8) samples through the eval step, not the decode step. */
    cr_assert_eq(run("./lm --resume checkpoints --eval --sample-tokens 10 --prompt 'the quick brown ' --log lm2.jsonl --tensorboard lmtb2 > lm2.txt",
                     &out),
                 0, "%s", out.data);
    check_tensorboard("lmtb2", "lm2.jsonl", "lm2.txt", &out);
    cr_expect(strstr(out.data, "samples/text: 1 samples"), "%s", out.data);
    /* A write that fails (a file-size limit of 2 KiB, as a full disk) is one warning, and
     * the run trains to its end. */
    cr_assert_eq(run("ulimit -f 4; { ./tiny --tensorboard full >/dev/null; }", &out), 0, "%s", out.data);
    cr_expect(count(out.data, "warning") == 1 && strstr(out.data, "cannot write TensorBoard events: File too large; no more TensorBoard "
                                                                 "events are written, training goes on"),
              "one warning, got %d:\n%s", count(out.data, "warning"), out.data);
    cr_expect_eq(meta_step("checkpoints/step-00000050/model.safetensors"), 50);
    /* A directory that cannot be written is an error before training. */
    expect_error("touch afile && ./tiny --tensorboard afile", "tiny: error: --tensorboard: afile: not a directory");
    sb_free(&out);
}

Test(run, every_flag_value_is_checked)
{
    build("");
    static const char *const cases[][2] = {
        {"--steps 0", "--steps 0: give a whole number of steps, at least 1"},
        {"--steps -5", "--steps -5: give a whole number of steps, at least 1"},
        {"--steps 2.5", "--steps 2.5: give a whole number of steps"},
        {"--steps 99999999999999999999", "--steps 99999999999999999999: give a whole number of steps, at most"},
        {"--steps 5x", "--steps: '5x' is not a number"},
        {"--epochs 0", "--epochs 0: give a whole number of epochs, at least 1"},
        {"--batch 0", "--batch 0: give a whole number of samples, at least 1"},
        {"--batch 5", "--batch 5: the model was built for batches of at most 4"},
        {"--lr -1", "--lr -1: give a finite number, at least 0"},
        {"--lr nan", "--lr nan: give a finite number"},
        {"--lr inf", "--lr inf: give a finite number"},
        {"--seed -1", "--seed -1: give a whole number, at least 0"},
        {"--limit 0", "--limit 0: give a whole number of samples, at least 1"},
        {"--limit -3", "--limit -3: give a whole number of samples, at least 1"},
        {"--checkpoint-every -1", "--checkpoint-every -1: give a whole number of steps, at least 0"},
        {"--checkpoint-keep 0", "--checkpoint-keep 0: give a whole number of checkpoints, at least 1"},
        {"--eval-every 1.5", "--eval-every 1.5: give a whole number of steps"},
        {"--eval-batches -2", "--eval-batches -2: give a whole number of batches, at least 0"},
        {"--threads 0", "--threads 0: give a whole number of threads, at least 1"},
        {"--threads 4x", "--threads: '4x' is not a number"},
        {"--threads 100000", "--threads 100000: give a whole number of threads, at most 1024"},
        {"--threads 4294967297", "--threads 4294967297: give a whole number of threads, at most 1024"},
        {"--steps 0x10", "--steps: '0x10' is not a number"},
        {"--steps infinity", "--steps: 'infinity' is not a number"},
        {"--steps inf", "--steps inf: give a whole number of steps, at most 1000000000000"},
        {"--epochs -1", "--epochs -1: give a whole number of epochs, at least 1"},
        {"--epochs 1000000001", "--epochs 1000000001: give a whole number of epochs, at most 1000000000"},
        {"--eval-every -1", "--eval-every -1: give a whole number of steps, at least 0"},
        {"--batch 99999999999999999999", "--batch 99999999999999999999: give a whole number of samples, at most 16777216"},
        {"--seed 1e19", "--seed 1e19: give a whole number, at most 1000000000000000000"},
        {"--checkpoint-keep 1001", "--checkpoint-keep 1001: give a whole number of checkpoints, at most 1000"},
        {"--bench-steps 0", "--bench-steps 0: give a whole number of timed steps, at least 1"},
        {"--temperature nan", "--temperature nan: give a number from 0.001 to 100"},
        {"--temperature 0", "--temperature 0: give a number from 0.001 to 100"},
        {"--temperature -1", "--temperature -1: give a number from 0.001 to 100"},
        {"--top-k -1", "--top-k -1: give a whole number of tokens, at least 0"},
        {"--sample-tokens -1", "--sample-tokens -1: give a whole number of tokens, at least 0"},
        {"--sample-tokens 100001", "--sample-tokens 100001: give a whole number of tokens, at most 100000"},
        {"--checkpoint-dir ''", "--checkpoint-dir: the value is empty"},
        {"--log ''", "--log: the value is empty"},
        {"--resume ''", "--resume: the value is empty"},
        {"--data x=", "--data x=: the path is empty"},
        {"--data z=x.idx", "--data z=x.idx: the model has no input 'z' (its inputs: x, y)"},
        {"--data x.idx", "--data x.idx: give INPUT=PATH"},
        {"--eval-data w=x.idx", "--eval-data w=x.idx: the model has no input 'w'"},
        {"--temperature 0.5", "--temperature: only language models"},
        {"--sample-tokens 5", "--sample-tokens: only language models"},
        {"--prompt hi", "--prompt: only language models"},
        {"--top-k 3", "--top-k: only language models"},
        {"--steps=5", "unknown option '--steps=5' (give the value after a space: --steps 5"},
        {"extra", "unexpected argument 'extra'"},
        {"--steps", "--steps needs a value"},
        {"--profile", "--profile times the steps of a benchmark"},
        {"--eval-every 5 --eval-data x=ex.idx --eval-data y=ey.idx --data x=x.idx --limit 5 --eval", "--eval-every has no effect with --eval"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char cmd[512];
        snprintf(cmd, sizeof cmd, "./tiny %s", cases[i][0]);
        expect_error(cmd, cases[i][1]);
    }
    cr_expect(!exists("checkpoints"), "a refused flag still trained");
}

Test(run, threads_beyond_four_per_cpu_are_cut_with_a_note)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus * 4 >= 1024) cr_skip_test("%ld CPUs: 1024 threads are not beyond 4 per CPU", cpus);
    build("");
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./tiny --threads 1024 --steps 2", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "tiny: note: --threads 1024: ") && strstr(out.data, " threads (at most 4 per CPU)"), "%s", out.data);
    cr_expect(strstr(out.data, "step 2/2"), "%s", out.data);
    sb_free(&out);
}

Test(run, eval_flags_need_evaluation_data)
{
    /* No eval_data and no val split: nothing to evaluate on. */
    write_data();
    const char *text = "model tiny\nfc = Linear(4, 3)\nforward(x: u8[B, 4]) -> logits {\n    logits = fc(f32(x) / 255)\n}\n"
                       "loss(logits, y: u8[B]) = cross_entropy(logits, y)\n"
                       "train {\n    data = npy(x = \"x.idx\", y = \"y.idx\")\n    batch = 4\n}\n";
    put("noeval.kiln", text, strlen(text));
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s", at("noeval.kiln"), at("noeval"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    expect_error("./noeval --eval", "--eval: there is no evaluation data");
    expect_error("./noeval --eval-every 3", "--eval-every: there is no evaluation data");
    expect_error("./noeval --eval-batches 3", "--eval-batches: there is no evaluation data");
    expect_error("./noeval --eval --eval-data x=ex.idx", "the recipe's eval_data has no file for input 'y' (add y = \"...\" or --eval-data y=PATH)");
    /* The recipe says npy(...), the files are IDX: read by their content. */
    cr_assert_eq(run("./noeval --steps 2", &out), 0, "%s", out.data);
    cr_assert_eq(run("./noeval --eval --eval-data x=ex.idx --eval-data y=ey.idx", &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "eval at step 0 (12 samples): "), "%s", out.data);
    sb_free(&out);
}

/* Embedding(padding_idx) in the generated program: the row starts at zero (the C runtime's
 * initialisation) and stays zero through AdamW steps (no gradient; decay of zero is zero),
 * while the other rows move. Index 0 is in every sample (its three small features). */
Test(run, padding_idx_row_starts_at_zero_and_stays)
{
    write_data();
    const char *text = "model pad\nemb = Embedding(4, 3, padding_idx = 0)\nfc = Linear(12, 3)\n"
                       "forward(x: u8[B, 4]) -> logits {\n    logits = fc(flatten(emb(i32(x) // 64)))\n}\n"
                       "loss(logits, y: u8[B]) = cross_entropy(logits, y)\n"
                       "train {\n    data = idx(x = \"x.idx\", y = \"y.idx\")\n    optimizer = AdamW(lr = 0.05)\n    batch = 4\n"
                       "    steps = 6\n    checkpoint = every(steps = 6)\n}\n";
    put("pad.kiln", text, strlen(text));
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s", at("pad.kiln"), at("pad"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln build failed:\n%s", out.data);
    cr_assert_eq(run("./pad", &out), 0, "%s", out.data);
    krt_safetensors *st;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(at("checkpoints/step-00000006/model.safetensors"), &st, &err), KRT_OK, "%s", err.msg);
    const krt_st_tensor *w = krt_safetensors_find(st, "emb.weight");
    cr_assert(w && w->dtype == KRT_F32 && w->rank == 2 && w->dims[0] == 4 && w->dims[1] == 3);
    const float *v = w->data;
    for (int e = 0; e < 3; e++) cr_expect_eq(v[e], 0.0f, "emb.weight[0, %d] = %g", e, (double)v[e]);
    for (int e = 3; e < 12; e++) cr_expect_neq(v[e], 0.0f, "emb.weight[%d, %d]", e / 3, e % 3);
    krt_safetensors_free(st);
    sb_free(&out);
}

/* ---- data given by flag ---- */

/* A model whose train section names no data trains on the files --data gives (as a model
 * whose recipe names some trains on others); without them it says what is missing. */
Test(run, a_recipe_without_data_trains_on_the_data_flags)
{
    write_data();
    static const char text[] = "model nodata\n"
                               "fc = Linear(4, 3)\n"
                               "forward(x: u8[B, 4]) -> logits {\n"
                               "    logits = fc(f32(x) / 255)\n"
                               "}\n"
                               "loss(logits, y: u8[B]) = cross_entropy(logits, y)\n"
                               "train {\n"
                               "    optimizer = AdamW(lr = 0.01)\n"
                               "    batch = 4\n"
                               "}\n";
    put("nodata.kiln", text, sizeof text - 1);
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s", at("nodata.kiln"), at("nodata"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln build failed:\n%s", out.data);
    expect_error("./nodata --steps 2 --checkpoint-dir ck", "the model file's train section has no `data = ...`, and no --data was given");
    out.len = 0;
    int rc = run("./nodata --data x=x.idx --data y=y.idx --steps 2 --checkpoint-dir ck", &out);
    cr_expect_eq(rc, 0, "%s", out.data);
    cr_expect(out.data && strstr(out.data, "step 2/2"), "%s", out.data);
    cr_expect(exists("ck/latest"), "no checkpoint:\n%s", out.data);
    sb_free(&out);
}
