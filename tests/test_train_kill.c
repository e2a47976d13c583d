/* test_train_kill.c — fault injection: a training program killed (SIGKILL) at random
 * moments while it saves a checkpoint after every step, then resumed, ends exactly where
 * an uninterrupted run ends, every time (docs/training.md, "Checkpoints").
 *
 * The model is tiny (its step takes microseconds), so nearly all of a run's time is spent
 * writing, syncing and publishing checkpoints, and a kill at a random moment of the run
 * lands in one. Each trial: start the run, kill it after a random fraction of an
 * uninterrupted run's time, check that the directory holds nothing but complete, verified
 * checkpoints (or none yet), resume (or start afresh when none was published), and compare
 * the final checkpoint with the uninterrupted run's. 20 trials of a 20-step run. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "ckpt_compare.h"
#include "support.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-kill-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(kill, .init = setup, .fini = teardown, .timeout = 240);

#define STEPS 20
#define TRIALS 20

static const char *at(const char *rel)
{
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, rel);
    return buf[k];
}

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Starts ./k with its output discarded, in the test directory; returns its pid. */
static pid_t start(const char *ckdir)
{
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int null = open("/dev/null", O_WRONLY);
        if (null < 0 || chdir(dir) != 0) _exit(99);
        dup2(null, 1);
        dup2(null, 2);
        char every[16];
        snprintf(every, sizeof every, "%d", 1);
        execl("./k", "./k", "--checkpoint-dir", ckdir, "--checkpoint-every", every, (char *)NULL);
        _exit(98);
    }
    return pid;
}

/* The step that ckdir/latest names, or -1. */
static int latest_step(const char *ckdir)
{
    char rel[64], line[64] = "";
    snprintf(rel, sizeof rel, "%s/latest", ckdir);
    FILE *f = fopen(at(rel), "r");
    if (!f) return -1;
    size_t n = fread(line, 1, sizeof line - 1, f);
    fclose(f);
    line[n] = 0;
    return strncmp(line, "step-", 5) ? -1 : atoi(line + 5);
}

/* Whether a name in the checkpoint directory is a leftover of a save cut short. */
static int leftovers(const char *ckdir)
{
    DIR *d = opendir(at(ckdir));
    if (!d) return 0;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) n++;
    closedir(d);
    return n;
}

/* After a kill: the checkpoint the directory would resume from, if any, is complete and
 * verifies (checksums, one step, one run). Returns its step, or -1 when there is none. */
static int64_t check_published(const char *ckdir)
{
    char found[4096], path[4200];
    int64_t step;
    krt_error err;
    if (krt_ckpt_find(at(ckdir), found, sizeof found, &step, NULL, &err) != KRT_OK) return -1;
    const char *files[] = {"model.safetensors", "train_state.safetensors"};
    const char *steps[2] = {NULL, NULL}, *runs[2] = {NULL, NULL};
    krt_safetensors *st[2] = {NULL, NULL};
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof path, "%s/%s", found, files[i]);
        cr_assert_eq(krt_safetensors_read(path, &st[i], &err), KRT_OK, "after a kill: %s", err.msg);
        steps[i] = krt_safetensors_meta(st[i], "step");
        runs[i] = krt_safetensors_meta(st[i], "run_id");
        cr_assert(steps[i] && runs[i], "%s has no step or run id", path);
        cr_expect_eq(atoll(steps[i]), step, "%s is of step %s, its directory of %lld", path, steps[i], (long long)step);
    }
    cr_expect_str_eq(steps[0], steps[1], "%s: a model and a state of two steps", found);
    cr_expect_str_eq(runs[0], runs[1], "%s: a model and a state of two runs", found);
    krt_safetensors_free(st[0]);
    krt_safetensors_free(st[1]);
    return step;
}

Test(kill, killed_while_checkpointing_and_resumed_ends_as_an_uninterrupted_run)
{
    /* 40 samples of 4 features, 3 classes; 10 steps of 4 per epoch, shuffled; dropout, so
     * that the random streams must resume exactly too. */
    double x[40 * 4], y[40];
    for (int i = 0; i < 40; i++) {
        y[i] = i % 3;
        for (int j = 0; j < 4; j++) x[i * 4 + j] = (j == i % 3 ? 1.0 : 0.0) + 0.1 * ((i * 7 + j * 3) % 5);
    }
    cr_assert(support_write_npy(at("x.npy"), "<f4", 40, 4, x));
    cr_assert(support_write_npy(at("y.npy"), "<i8", 40, 0, y));
    const char *model = "model k\n"
                        "fc1 = Linear(4, 8)\n"
                        "drop = Dropout(0.2)\n"
                        "fc2 = Linear(8, 3)\n"
                        "forward(x: f32[B, 4]) -> logits {\n"
                        "    logits = fc2(drop(relu(fc1(x))))\n"
                        "}\n"
                        "loss(logits, y: i64[B]) = cross_entropy(logits, y)\n"
                        "train {\n"
                        "    data = npy(x = \"x.npy\", y = \"y.npy\")\n"
                        "    optimizer = AdamW(lr = 0.01)\n"
                        "    batch = 4\n"
                        "    steps = 20\n"
                        "}\n";
    FILE *f = fopen(at("k.kiln"), "w");
    cr_assert(f);
    fputs(model, f);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "build %s -o %s", at("k.kiln"), at("k"));
    cr_assert_eq(support_run_kiln(args, &out), 0, "kiln build failed:\n%s", out.data);

    /* The uninterrupted run, timed (the faster of two: the first starts cold): kills fall
     * within its duration. */
    double full_time = 1e9;
    pid_t pid;
    int status;
    for (int i = 0; i < 2; i++) {
        double t0 = now();
        pid = start("full");
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        if (now() - t0 < full_time) full_time = now() - t0;
        cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the uninterrupted run failed (status %d)", status);
    }
    char want[2][64];
    snprintf(want[0], sizeof want[0], "full/step-%08d/model.safetensors", STEPS);
    snprintf(want[1], sizeof want[1], "full/step-%08d/train_state.safetensors", STEPS);

    uint64_t r = 0x9E3779B97F4A7C15u; /* a fixed sequence of kill moments */
    int mid_run = 0, cut_saves = 0, none_yet = 0, retries = 0;
    for (int trial = 0; trial < TRIALS; trial++) {
        char ck[32], cmd[256];
        snprintf(ck, sizeof ck, "k%02d", trial);
        /* A step after which to strike, and a moment within the next checkpoint's save. */
        r = r * 6364136223846793005u + 1442695040888963407u;
        int after = 1 + (int)((r >> 33) % (STEPS - 1)); /* 1 to STEPS - 1 */
        r = r * 6364136223846793005u + 1442695040888963407u;
        double u = (double)(r >> 11) / 9007199254740992.0;
        /* A run that ends before the kill (saves got faster than measured: the disk is
         * shared) is started again and struck sooner, up to 6 times. */
        bool killed = false;
        for (int attempt = 0; attempt < 6 && !killed; attempt++) {
            snprintf(cmd, sizeof cmd, "rm -rf %s", ck);
            run(cmd, &out);
            pid = start(ck);
            bool exited = false;
            for (double give_up = now() + 60; !exited && latest_step(ck) < after && now() < give_up;) {
                exited = waitpid(pid, &status, WNOHANG) == pid;
                nanosleep(&(struct timespec){0, 100000}, NULL);
            }
            if (!exited) {
                struct timespec d = {0, (long)(u * full_time / STEPS / (1 << attempt) * 1e9)};
                nanosleep(&d, NULL);
                kill(pid, SIGKILL);
                cr_assert_eq(waitpid(pid, &status, 0), pid);
            }
            killed = WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
            if (!killed) retries++;
        }
        mid_run += killed;
        cut_saves += killed && leftovers(ck) > 0;
        int64_t published = check_published(ck);
        none_yet += published < 0;
        /* Resume (or start afresh when nothing was published), to the end. */
        snprintf(cmd, sizeof cmd, "timeout 120 ./k --checkpoint-dir %s --checkpoint-every 1%s%s", ck, published >= 0 ? " --resume " : "",
                 published >= 0 ? ck : "");
        int rc = run(cmd, &out);
        cr_assert_eq(rc, 0, "trial %d (killed after step %d + %.0f%% of a save, checkpoint of step %lld published): `%s` failed:\n%s", trial, after, 100 * u,
                     (long long)published, cmd, out.data);
        for (int i = 0; i < 2; i++) {
            char got[64];
            snprintf(got, sizeof got, "%s/%s", ck, strchr(want[i], '/') + 1);
            const char *why = ckpt_difference(at(got), at(want[i]));
            cr_expect(!why, "trial %d (killed after step %d + %.0f%% of a save, checkpoint of step %lld published): the resumed run differs: %s", trial, after, 100 * u,
                      (long long)published, why);
        }
        cr_expect_eq(leftovers(ck), 0, "trial %d: leftovers of the killed save stay in %s", trial, ck);
        snprintf(cmd, sizeof cmd, "rm -rf %s", ck);
        run(cmd, &out);
    }
    /* Every kill hit a running program (after `after` steps, so with a checkpoint to
     * resume from); most of them cut a save short, leaving its temporary files. */
    cr_log_info("%d of %d kills hit a running program (%d runs ended first and were struck again sooner), %d cut a save short "
                "(leftovers); uninterrupted run %.3f s",
                mid_run, TRIALS, retries, cut_saves, full_time);
    cr_expect_eq(mid_run, TRIALS, "only %d of %d kills hit a running program (run of %.3f s)", mid_run, TRIALS, full_time);
    cr_expect_eq(none_yet, 0, "%d kills found no checkpoint published", none_yet);
    sb_free(&out);
}
