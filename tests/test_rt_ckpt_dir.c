/* test_rt_ckpt_dir.c — checkpoint directories (runtime/ckpt_dir.c): each checkpoint is a
 * step directory published whole and named by DIR/latest, the newest K are kept, resuming
 * finds the newest complete one (through the pointer, without it, or in the old layout of
 * the two files directly in DIR), and a directory that cannot take checkpoints is found
 * out before training. Every test works in its own directory under /tmp. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"
#include "../runtime/kiln_rt.h"

static char g_dir[64];

static void setup(void)
{
    strcpy(g_dir, "/tmp/kiln_ckdir_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp");
}

static void teardown(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'; rm -rf '%s'", g_dir, g_dir);
    if (system(cmd) != 0) fprintf(stderr, "cannot remove %s\n", g_dir);
}

TestSuite(ckdir, .init = setup, .fini = teardown);

/* dir/name in one of 4 rotating buffers: copy a result that must outlive 3 more calls. */
static const char *in_dir(const char *name)
{
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static const char *get(const char *path)
{
    static char buf[256];
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    return buf;
}

/* One checkpoint of `step` in dir, as the training program writes it: both files in the
 * temporary directory, published, pruned to `keep`. Its files hold "model N" and "state N". */
static void save(const char *dir, int64_t step, int keep)
{
    char tmp[512], path[600], text[64];
    krt_error err;
    cr_assert_eq(krt_ckpt_begin(dir, step, tmp, sizeof tmp, &err), KRT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    snprintf(text, sizeof text, "model %lld", (long long)step);
    put(path, text);
    snprintf(path, sizeof path, "%s/train_state.safetensors", tmp);
    snprintf(text, sizeof text, "state %lld", (long long)step);
    put(path, text);
    cr_assert_eq(krt_ckpt_publish(dir, tmp, step, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_ckpt_prune(dir, step, keep, &err), KRT_OK, "%s", err.msg);
}

/* A complete step directory made by hand (as an earlier run left it). */
static void make_step(const char *dir, const char *name)
{
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    cr_assert_eq(mkdir(path, 0755), 0, "%s", path);
    snprintf(path, sizeof path, "%s/%s/model.safetensors", dir, name);
    put(path, "old model");
    snprintf(path, sizeof path, "%s/%s/train_state.safetensors", dir, name);
    put(path, "old state");
}

static const char *find(const char *dir, int64_t *step, bool *stale)
{
    static char found[600];
    krt_error err;
    cr_assert_eq(krt_ckpt_find(dir, found, sizeof found, step, stale, &err), KRT_OK, "%s", err.msg);
    return found;
}

Test(ckdir, keeps_the_newest_k_and_points_at_the_newest)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    krt_error err;
    cr_assert_eq(krt_ckpt_prepare(dir, &err), KRT_OK, "%s", err.msg);
    for (int64_t s = 1; s <= 5; s++) save(dir, s * 10, 2);
    cr_expect_str_eq(support_listing(dir), "latest|step-00000040|step-00000050");
    cr_expect_str_eq(get(in_dir("ck/latest")), "step-00000050\n");
    cr_expect_str_eq(get(in_dir("ck/step-00000050/model.safetensors")), "model 50");
    cr_expect_str_eq(get(in_dir("ck/step-00000040/train_state.safetensors")), "state 40");
    save(dir, 60, 1);
    cr_expect_str_eq(support_listing(dir), "latest|step-00000060");
    save(dir, 70, 3);
    save(dir, 123456789, 3); /* more than 8 digits: ordered by number, not by name */
    cr_expect_str_eq(support_listing(dir), "latest|step-00000060|step-00000070|step-123456789");
    int64_t step;
    cr_expect_str_eq(find(dir, &step, NULL), in_dir("ck/step-123456789"));
    cr_expect_eq(step, 123456789);
}

Test(ckdir, a_checkpoint_of_the_same_step_is_replaced_whole)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    krt_error err;
    cr_assert_eq(krt_ckpt_prepare(dir, &err), KRT_OK, "%s", err.msg);
    make_step(dir, "step-00000003");
    save(dir, 3, 2);
    cr_expect_str_eq(support_listing(dir), "latest|step-00000003");
    cr_expect_str_eq(get(in_dir("ck/step-00000003/model.safetensors")), "model 3");
    cr_expect_str_eq(get(in_dir("ck/step-00000003/train_state.safetensors")), "state 3");
}

Test(ckdir, an_earlier_runs_later_steps_and_old_layout_files_are_removed)
{
    /* A fresh run in a directory of a longer earlier run, in both layouts. */
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    make_step(dir, "step-00000100");
    make_step(dir, "step-00000200");
    make_step(dir, "step-00000002");
    put(in_dir("ck/model.safetensors"), "legacy");
    put(in_dir("ck/train_state.safetensors"), "legacy");
    put(in_dir("ck/notes.txt"), "the user's"); /* not a checkpoint: left alone */
    save(dir, 5, 2);
    cr_expect_str_eq(support_listing(dir), "latest|notes.txt|step-00000002|step-00000005");
    save(dir, 6, 2);
    cr_expect_str_eq(support_listing(dir), "latest|notes.txt|step-00000005|step-00000006");
}

Test(ckdir, leftovers_of_a_crashed_run_are_never_taken_and_are_removed)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    /* A temporary directory of a process that is gone (no pid is that large), complete
     * but never published, and a half-written pointer's temporary file. */
    make_step(dir, ".step-00000009.tmp.2147483646");
    put(in_dir("ck/.latest.tmp.2147483646"), "step-00000009\n");
    make_step(dir, "step-00000004");
    int64_t step;
    cr_expect_str_eq(find(dir, &step, NULL), in_dir("ck/step-00000004"));
    cr_expect_eq(step, 4);
    save(dir, 5, 2);
    cr_expect_str_eq(support_listing(dir), "latest|step-00000004|step-00000005");
    /* Preparing the directory for a run removes them too, whether or not it saves: a
     * killed run's deletion of an old checkpoint, its temporary directory and pointer. */
    make_step(dir, ".step-00000003.del.2147483646");
    make_step(dir, ".step-00000006.tmp.2147483646");
    put(in_dir("ck/.latest.tmp.2147483646"), "step-00000006\n");
    krt_error err;
    cr_assert_eq(krt_ckpt_prepare(dir, &err), KRT_OK, "%s", err.msg);
    cr_expect_str_eq(support_listing(dir), "latest|step-00000004|step-00000005");
}

Test(ckdir, find_follows_the_pointer_then_falls_back)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    krt_error err;
    cr_assert_eq(krt_ckpt_prepare(dir, &err), KRT_OK, "%s", err.msg);
    save(dir, 7, 3);
    save(dir, 8, 3);
    make_step(dir, "step-00000009"); /* complete, but not published: the pointer wins */
    int64_t step;
    bool stale;
    cr_expect_str_eq(find(dir, &step, &stale), in_dir("ck/step-00000008"));
    cr_expect(step == 8 && !stale);
    /* Without the pointer: the highest complete step directory. */
    cr_assert_eq(unlink(in_dir("ck/latest")), 0);
    cr_assert_eq(unlink(in_dir("ck/step-00000009/train_state.safetensors")), 0); /* incomplete */
    cr_expect_str_eq(find(dir, &step, &stale), in_dir("ck/step-00000008"));
    cr_expect(step == 8 && !stale);
    /* A pointer to a checkpoint that is gone: the same, and said. */
    put(in_dir("ck/latest"), "step-00000042\n");
    cr_expect_str_eq(find(dir, &step, &stale), in_dir("ck/step-00000008"));
    cr_expect(step == 8 && stale);
    /* A pointer that is not one is an error naming it. */
    const char *bad[] = {"garbage\n", "../step-00000008\n", "step-00000008\nstep-00000007\n", ""};
    for (int i = 0; i < 4; i++) {
        put(in_dir("ck/latest"), bad[i]);
        char found[600];
        cr_expect_eq(krt_ckpt_find(dir, found, sizeof found, &step, &stale, &err), KRT_EFORMAT, "pointer '%s'", bad[i]);
        cr_expect(strstr(err.msg, in_dir("ck/latest")) == err.msg, "%s", err.msg);
    }
}

Test(ckdir, find_reads_the_old_layout_and_names_what_is_missing)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("old"));
    cr_assert_eq(mkdir(dir, 0755), 0);
    put(in_dir("old/model.safetensors"), "m");
    put(in_dir("old/train_state.safetensors"), "s");
    int64_t step;
    cr_expect_str_eq(find(dir, &step, NULL), dir);
    cr_expect_eq(step, -1);
    /* A step directory given directly is the same: the two files in it. */
    make_step(g_dir, "step-00000003");
    cr_expect_str_eq(find(in_dir("step-00000003"), &step, NULL), in_dir("step-00000003"));
    krt_error err;
    char found[600];
    cr_assert_eq(mkdir(in_dir("empty"), 0755), 0);
    cr_expect_eq(krt_ckpt_find(in_dir("empty"), found, sizeof found, &step, NULL, &err), KRT_EIO);
    cr_expect(strstr(err.msg, in_dir("empty")) == err.msg && strstr(err.msg, "no checkpoint in this directory"), "%s", err.msg);
    cr_expect_eq(krt_ckpt_find(in_dir("nowhere"), found, sizeof found, &step, NULL, &err), KRT_EIO);
    cr_expect(strstr(err.msg, in_dir("nowhere")) == err.msg && strstr(err.msg, "No such file"), "%s", err.msg);
    put(in_dir("file"), "x");
    cr_expect_eq(krt_ckpt_find(in_dir("file"), found, sizeof found, &step, NULL, &err), KRT_EIO);
    cr_expect(strstr(err.msg, "not a directory"), "%s", err.msg);
}

Test(ckdir, prepare_refuses_what_cannot_take_checkpoints)
{
    krt_error err;
    /* missing parents are created, as mkdir -p does */
    cr_expect_eq(krt_ckpt_prepare(in_dir("no/parent"), &err), KRT_OK, "%s", err.msg);
    struct stat st;
    cr_expect(stat(in_dir("no/parent"), &st) == 0 && S_ISDIR(st.st_mode), "no/parent was not created");
    put(in_dir("file"), "x");
    cr_expect_eq(krt_ckpt_prepare(in_dir("file"), &err), KRT_EIO);
    cr_expect(strstr(err.msg, "not a directory"), "%s", err.msg);
    cr_expect_eq(krt_ckpt_prepare(in_dir("file/ck"), &err), KRT_EIO);
    cr_expect(strstr(err.msg, in_dir("file/ck")) == err.msg, "%s", err.msg);
    cr_expect_eq(krt_ckpt_prepare("", &err), KRT_EINVAL);
    /* It creates one level and leaves nothing in it. */
    cr_expect_eq(krt_ckpt_prepare(in_dir("ck"), &err), KRT_OK, "%s", err.msg);
    cr_expect_str_eq(support_listing(in_dir("ck")), "");
    if (geteuid() == 0) return; /* root writes anywhere */
    cr_assert_eq(chmod(in_dir("ck"), 0555), 0);
    cr_expect_eq(krt_ckpt_prepare(in_dir("ck"), &err), KRT_EIO);
    cr_expect(strstr(err.msg, "Permission denied"), "%s", err.msg);
}

Test(ckdir, publish_refuses_an_incomplete_checkpoint)
{
    char dir[600];
    snprintf(dir, sizeof dir, "%s", in_dir("ck"));
    krt_error err;
    cr_assert_eq(krt_ckpt_prepare(dir, &err), KRT_OK, "%s", err.msg);
    char tmp[512], path[600];
    cr_assert_eq(krt_ckpt_begin(dir, 1, tmp, sizeof tmp, &err), KRT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/model.safetensors", tmp);
    put(path, "m");
    cr_expect_eq(krt_ckpt_publish(dir, tmp, 1, &err), KRT_EINVAL);
    krt_ckpt_discard(tmp);
    cr_expect_str_eq(support_listing(dir), "");
    cr_expect_eq(krt_ckpt_prune(dir, 1, 0, &err), KRT_EINVAL);
}
