/* test_dist.c — data-parallel training on MPI (kiln build --distributed, docs/distributed.md):
 * N ranks with the recipe's batch split across them train to the weights one process
 * trains to; --deterministic runs are bitwise reproducible; a checkpoint of 2 ranks resumes
 * on 1 and one of 1 on 2; a hung or killed rank stops the others with a message naming it
 * within a bound; ranks of another model, build or options are refused at start.
 *
 * The oracle is the program built without --distributed, one process on the whole batch.
 * Summing the ranks' gradients adds in another order than one process's matrix products
 * do, so the weights agree to rounding, not bitwise: within 1e-5 relative, as the norm of
 * the difference of all parameters over the norm of all parameters. Not per tensor: gpt's
 * attention key biases have a gradient that is exactly zero in exact arithmetic (softmax
 * ignores a constant added to every key), so theirs is rounding noise, which AdamW turns
 * into full-size steps; after 20 steps they differ by 5e-5 of their own norm (4e-7
 * absolute) while the whole model differs by 1e-7.
 *
 * OpenMPI refuses root without OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) and more ranks than cores
 * without --oversubscribe; both are given. The programs are built once per run of this
 * binary, into a directory named for the runner's pid (Criterion's workers are its
 * children), removed when all tests are done. */
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

/* SUPPORT_MPIRUN (support.h): in the ASan build, the ranks run without LeakSanitizer: OpenMPI's components, unloaded
 * by MPI_Finalize, leave allocations that LSan can neither free nor name ("<unknown
 * module>"), so no suppression matches them. ASan's other checks and UBSan stay on, and
 * the same training code is leak-checked in the one-process runs. */
/* Small runs: a few thousand samples, 20 steps of a small batch. */
#define MLP_ARGS " --steps 20 --batch 64 --limit 4000 --eval-every 1000 --eval-batches 2 "
#define GPT_ARGS " --steps 20 --batch 8 --limit 400 --eval-every 1000 --eval-batches 2 "

static char dir[96];

static const char *at(const char *rel)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, rel);
    return buf[k];
}

static bool have_mpirun(void)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_run("command -v mpirun", &out);
    sb_free(&out);
    return rc == 0;
}

/* Builds `model` into dir/name once per run (with extra kiln build flags). */
static void build(const char *model, const char *name, const char *flags)
{
    struct stat st;
    if (stat(at(name), &st) == 0) return;
    StrBuf out;
    sb_init(&out);
    char args[1024];
    snprintf(args, sizeof args, "build %s %s -o %s", model, flags, at(name));
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args, out.data);
    sb_free(&out);
}

static void setup(void)
{
    if (!have_mpirun()) cr_skip_test("mpirun is not installed (scripts/deps.sh installs openmpi-bin)");
    snprintf(dir, sizeof dir, "/tmp/kiln-dist-%ld", (long)getppid());
    mkdir(dir, 0700);
    build("models/mlp.kiln", "mlp", "");
    build("models/mlp.kiln", "mlp_d", "--distributed");
}

ReportHook(POST_ALL)(struct criterion_global_stats *stats)
{
    (void)stats;
    snprintf(dir, sizeof dir, "/tmp/kiln-dist-%ld", (long)getpid());
    support_remove_dir(dir);
}

TestSuite(dist, .init = setup, .timeout = 300);

/* Runs cmd in dir; its output in out (emptied first). */
static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

static int runf(StrBuf *out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int runf(StrBuf *out, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    return run(cmd, out);
}

/* The difference between the tensors of two checkpoint files, |a - b| / |b| over all of
 * them (L2 norms); -1 when they hold other tensors. *bitwise: all bits equal. */
static double weights_difference(const char *a, const char *b, bool *bitwise)
{
    krt_safetensors *x = NULL, *y = NULL;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(a, &x, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_safetensors_read(b, &y, &err), KRT_OK, "%s", err.msg);
    double worst = krt_safetensors_count(x) == krt_safetensors_count(y) ? 0 : -1, diff = 0, norm = 0;
    *bitwise = worst == 0;
    for (int i = 0; worst >= 0 && i < krt_safetensors_count(x); i++) {
        const krt_st_tensor *t = krt_safetensors_tensor(x, i), *u = krt_safetensors_find(y, t->name);
        if (!u || u->dtype != t->dtype || t->dtype != KRT_F32) {
            worst = -1;
            break;
        }
        int64_t n = 1;
        for (int d = 0; d < t->rank; d++) n *= t->dims[d];
        const float *p = t->data, *q = u->data;
        for (int64_t e = 0; e < n; e++) {
            diff += ((double)p[e] - q[e]) * ((double)p[e] - q[e]);
            norm += (double)q[e] * q[e];
            if (p[e] != q[e]) *bitwise = false;
        }
    }
    if (worst >= 0) worst = norm > 0 ? sqrt(diff / norm) : sqrt(diff);
    krt_safetensors_free(x);
    krt_safetensors_free(y);
    return worst;
}

static void assert_close(const char *a, const char *b)
{
    bool bitwise;
    double d = weights_difference(at(a), at(b), &bitwise);
    cr_assert(d >= 0 && d <= 1e-5, "%s and %s differ by %g relative (at most 1e-5)", a, b, d);
}

Test(dist, mlp_two_ranks_train_what_one_process_trains)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./mlp" MLP_ARGS "--checkpoint-dir one", &out), 0, "%s", out.data);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_d" MLP_ARGS "--checkpoint-dir two --log two.jsonl --tensorboard tb", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "steps of 64 (2 ranks × batch 32)"), "the start line states the split:\n%s", out.data);
    cr_assert(strstr(out.data, "eval at step 20 ("), "%s", out.data);
    /* Rank 0 alone prints and logs (--tensorboard too): one start line, one eval line, 20 log lines plus the eval's. */
    cr_assert(!strstr(strstr(out.data, "parameters") + 1, "parameters"), "one start line:\n%s", out.data);
    cr_assert_eq(run("grep -c . two.jsonl", &out), 0);
    cr_assert_eq(atoi(out.data), 21, "log lines: %s", out.data);
    cr_assert_eq(run("ls tb | grep -c tfevents", &out), 0);
    cr_assert_eq(atoi(out.data), 1, "rank 0 alone writes TensorBoard events: %s", out.data);
    assert_close("one/step-00000020/model.safetensors", "two/step-00000020/model.safetensors");
    /* One rank (bound to one core, so one thread) trains the plain program's weights bit for
     * bit: nothing depends on the thread count. */
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 1 ./mlp_d" MLP_ARGS "--checkpoint-dir onerank", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "steps of 64 (1 rank × batch 64)"), "the start line states the split:\n%s", out.data);
    bool bitwise;
    const double d = weights_difference(at("one/step-00000020/model.safetensors"), at("onerank/step-00000020/model.safetensors"), &bitwise);
    cr_expect(bitwise, "one rank and the plain program differ by %g relative", d);
    /* 3 ranks, a batch they do not divide (22, 21, 21 samples): weighted by their shares. */
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 3 ./mlp_d" MLP_ARGS "--checkpoint-dir three", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "(3 ranks × batch 21-22)"), "%s", out.data);
    assert_close("one/step-00000020/model.safetensors", "three/step-00000020/model.safetensors");
    sb_free(&out);
}

Test(dist, deterministic_runs_are_bitwise_reproducible)
{
    StrBuf out;
    sb_init(&out);
    for (int i = 0; i < 2; i++) {
        int rc = runf(&out, SUPPORT_MPIRUN "-np 2 ./mlp_d --deterministic" MLP_ARGS "--checkpoint-dir det%d", i);
        cr_assert_eq(rc, 0, "%s", out.data);
    }
    bool bitwise;
    double d = weights_difference(at("det0/step-00000020/model.safetensors"), at("det1/step-00000020/model.safetensors"), &bitwise);
    cr_assert(bitwise, "two --deterministic runs differ by %g", d);
    cr_assert_eq(run("./mlp" MLP_ARGS "--checkpoint-dir one", &out), 0, "%s", out.data);
    assert_close("one/step-00000020/model.safetensors", "det0/step-00000020/model.safetensors");
    sb_free(&out);
}

Test(dist, gpt_two_ranks_train_what_one_process_trains, .timeout = 300)
{
    build("models/gpt.kiln", "gpt", "--bound T=32");
    build("models/gpt.kiln", "gpt_d", "--bound T=32 --distributed --bucket-size 256KiB"); /* several buckets */
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./gpt" GPT_ARGS "--checkpoint-dir one", &out), 0, "%s", out.data);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./gpt_d" GPT_ARGS "--checkpoint-dir two", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "(2 ranks × batch 4)"), "%s", out.data);
    assert_close("one/step-00000020/model.safetensors", "two/step-00000020/model.safetensors");
    sb_free(&out);
}

Test(dist, checkpoints_move_between_rank_counts)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run("./mlp" MLP_ARGS "--checkpoint-dir one", &out), 0, "%s", out.data);
    /* 2 ranks for 10 steps, then 1 process to step 20 */
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_d" MLP_ARGS "--steps 10 --checkpoint-dir a", &out), 0, "%s", out.data);
    cr_assert_eq(run("./mlp" MLP_ARGS "--checkpoint-dir a --resume a", &out), 0, "%s", out.data);
    assert_close("one/step-00000020/model.safetensors", "a/step-00000020/model.safetensors");
    /* 1 process for 10 steps, then 2 ranks to step 20 */
    cr_assert_eq(run("./mlp" MLP_ARGS "--steps 10 --checkpoint-dir b", &out), 0, "%s", out.data);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_d" MLP_ARGS "--checkpoint-dir b --resume b", &out), 0, "%s", out.data);
    assert_close("one/step-00000020/model.safetensors", "b/step-00000020/model.safetensors");
    sb_free(&out);
}

/* Starts 2 ranks of a long run, waits until they train (the log has a line), sends `sig`
 * to rank `victim`, and returns mpirun's exit status; *seconds: from the signal to the end. */
static int fault(int victim, const char *sig, StrBuf *out, double *seconds)
{
    int rc = runf(out,
                  "rm -f f.log; (" SUPPORT_MPIRUN "-np 2 ./mlp_d --dist-timeout 2 --steps 1000000 --limit 4000 --batch 64 --eval-every 1000000 "
                  "--checkpoint-every 1000000 --checkpoint-dir f --log f.log > f.out 2>&1 & m=$!; "
                  "n=0; while [ ! -s f.log ] && [ $n -lt 600 ]; do sleep 0.1; n=$((n+1)); done; "
                  "for p in $(pgrep -P $m); do tr '\\0' '\\n' < /proc/$p/environ | grep -qx OMPI_COMM_WORLD_RANK=%d && kill -%s $p; done; "
                  "s=$(date +%%s%%N); wait $m; rc=$?; e=$(date +%%s%%N); echo \"seconds $(( (e - s) / 1000000 ))\"; exit $rc); rc=$?; "
                  "cat f.out; exit $rc",
                  victim, sig);
    const char *s = strstr(out->data, "seconds ");
    *seconds = s ? atof(s + 8) / 1000 : 1e9;
    return rc;
}

Test(dist, a_hung_rank_is_named_and_stops_the_others)
{
    StrBuf out;
    sb_init(&out);
    double seconds;
    int rc = fault(1, "STOP", &out, &seconds);
    cr_assert_neq(rc, 0, "%s", out.data);
    cr_assert(strstr(out.data, "rank 1 did not answer (hung, or too slow"), "rank 0 names the hung rank:\n%s", out.data);
    cr_assert(seconds < 20, "stopped after %g s (timeout 2 s):\n%s", seconds, out.data);
    rc = fault(0, "STOP", &out, &seconds);
    cr_assert_neq(rc, 0, "%s", out.data);
    cr_assert(strstr(out.data, "rank 0 is hung or too slow"), "the others name a hung rank 0:\n%s", out.data);
    cr_assert(seconds < 20, "stopped after %g s:\n%s", seconds, out.data);
    cr_assert_neq(run("pgrep -f '^./mlp_d --dist-timeout'", &out), 0, "no rank is left: %s", out.data);
    sb_free(&out);
}

Test(dist, a_killed_rank_stops_the_others)
{
    StrBuf out;
    sb_init(&out);
    double seconds;
    int rc = fault(1, "KILL", &out, &seconds);
    cr_assert_neq(rc, 0, "%s", out.data);
    cr_assert(strstr(out.data, "rank 1") && strstr(out.data, "signal 9"), "mpirun names the dead rank:\n%s", out.data);
    cr_assert(seconds < 20, "stopped after %g s:\n%s", seconds, out.data);
    sb_free(&out);
}

Test(dist, ranks_of_another_model_build_or_options_are_refused)
{
    build("models/mlp.kiln", "mlp_d64", "--distributed --bucket-size 64KiB");
    StrBuf out;
    sb_init(&out);
    /* the same layers, another activation: another graph, so another model */
    cr_assert_eq(run("sed 's/x = relu(fc2(x))/x = gelu(fc2(x))/' " KILN_SOURCE_DIR "/models/mlp.kiln > mlp2.kiln", &out), 0);
    build(at("mlp2.kiln"), "mlp2_d", "--distributed");
    int rc = run(SUPPORT_MPIRUN "-np 1 ./mlp_d --steps 5 --limit 4000 --checkpoint-dir x : -np 1 ./mlp2_d --steps 5 --limit 4000 --checkpoint-dir x", &out);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(out.data, "mlp: error: rank 0 of 2: rank 1 runs another model"), "%s", out.data);
    rc = run(SUPPORT_MPIRUN "-np 1 ./mlp_d --steps 5 --limit 4000 --checkpoint-dir x : -np 1 ./mlp_d64 --steps 5 --limit 4000 --checkpoint-dir x", &out);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(out.data, "rank 1 runs another build of mlp than rank 0"), "%s", out.data);
    rc = run(SUPPORT_MPIRUN "-np 1 ./mlp_d --steps 5 --limit 4000 --checkpoint-dir x : -np 1 ./mlp_d --steps 6 --limit 4000 --checkpoint-dir x", &out);
    cr_assert_neq(rc, 0);
    cr_assert(strstr(out.data, "rank 1 was started with other options than rank 0"), "%s", out.data);
    struct stat st;
    cr_assert_neq(stat(at("x"), &st), 0, "a refused run writes nothing");
    sb_free(&out);
}

Test(dist, bad_flags_are_errors)
{
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(run(SUPPORT_MPIRUN "-np 2 ./mlp_d --dist-timeout 0", &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "--dist-timeout 0: give the seconds a rank waits for the others, from 1 to 1000000"), "%s", out.data);
    cr_assert_neq(run(SUPPORT_MPIRUN "-np 3 ./mlp_d --batch 2 --steps 1 --limit 100", &out), 0, "%s", out.data);
    cr_assert(strstr(out.data, "the batch of 2 is smaller than the 3 ranks: give --batch 3 or more"), "%s", out.data);
    cr_assert_eq(run("./mlp --deterministic", &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "unknown option '--deterministic'"), "%s", out.data);
    cr_assert_eq(run("ASAN_OPTIONS=\"$ASAN_OPTIONS:detect_leaks=0\" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 ./mlp_d --help", &out), 0, "%s", out.data); /* alone, without mpirun: one rank */
    cr_assert(strstr(out.data, "--dist-timeout S"), "%s", out.data);
    sb_free(&out);
    sb_init(&out);
    cr_assert_eq(support_run_kiln("build models/mlp.kiln --bucket-size 1MiB -o /tmp/x", &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "--bucket-size sizes the gradient buckets of distributed programs: add --distributed"), "%s", out.data);
    sb_free(&out);
    sb_init(&out);
    cr_assert_eq(support_run_kiln("build models/mlp.kiln --distributed --bucket-size 2x -o /tmp/x", &out), 2, "%s", out.data);
    cr_assert(strstr(out.data, "--bucket-size: '2x' is not a size"), "%s", out.data);
    sb_free(&out);
}
