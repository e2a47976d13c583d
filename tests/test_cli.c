/* test_cli.c — the `kiln` command's handling of its output paths: `kiln build -o PROG`,
 * `kiln emit -o DIR` and `kiln ir -o FILE` name a missing directory, an unwritable one,
 * or an output that is a directory (or not one) in one line, exit 2 (the command line is
 * wrong), and do so before anything is compiled: never "the C compiler failed" with its
 * command line. */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-cli-XXXXXX");
    cr_assert(mkdtemp(dir), "cannot make a temporary directory");
}

static void teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "chmod -R u+w '%s'", dir);
    StrBuf out;
    sb_init(&out);
    support_run(cmd, &out);
    sb_free(&out);
    support_remove_dir(dir);
}

TestSuite(cli, .init = setup, .fini = teardown, .timeout = 60);

/* Runs `kiln CMD models/mlp.kiln -o OUT` (OUT relative to the test's directory unless
 * absolute); expects exit status 2 and one line containing `want`. */
static void expect_output_error(const char *cmd, const char *out_rel, const char *want)
{
    char args[1024];
    if (out_rel[0] == '/') snprintf(args, sizeof args, "%s %s -o %s", cmd, support_path("models/mlp.kiln"), out_rel);
    else snprintf(args, sizeof args, "%s %s -o %s/%s", cmd, support_path("models/mlp.kiln"), dir, out_rel);
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln(args, &out);
    const char *text = out.data ? out.data : "";
    cr_expect_eq(rc, 2, "kiln %s: expected exit status 2, found %d:\n%s", args, rc, text);
    cr_expect(strstr(text, want) != NULL, "kiln %s: expected a message containing \"%s\", found:\n%s", args, want, text);
    cr_expect(!strstr(text, "C compiler") && !strstr(text, "collect2"), "kiln %s: reported as a compiler failure:\n%s", args, text);
    const char *nl = strchr(text, '\n');
    cr_expect(nl && !nl[1], "kiln %s: expected one line, found:\n%s", args, text);
    sb_free(&out);
}

static void make_file(const char *rel)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot create %s", path);
    fclose(f);
}

static void make_dir(const char *rel, mode_t mode)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    cr_assert_eq(mkdir(path, 0755), 0, "cannot create %s", path);
    cr_assert_eq(chmod(path, mode), 0);
}

/* A directory this process cannot create files in: a read-only one of ours, or for root
 * (whom permission bits do not stop) /sys when it refuses; NULL when there is none. */
static const char *unwritable_dir(char *buf, size_t n)
{
    make_dir("ro", 0555);
    const char *cands[2];
    snprintf(buf, n, "%s/ro", dir);
    cands[0] = buf;
    cands[1] = "/sys";
    for (int i = 0; i < 2; i++) {
        char probe[256];
        snprintf(probe, sizeof probe, "%s/.probe-%ld", cands[i], (long)getpid());
        int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
        if (fd < 0) return cands[i];
        close(fd);
        unlink(probe);
    }
    return NULL;
}

Test(cli, build_into_a_missing_directory)
{
    expect_output_error("build", "missing/prog", "-o ");
    expect_output_error("build", "missing/prog", "the directory '");
    expect_output_error("build", "missing/prog", "missing' does not exist");
}

Test(cli, build_onto_a_directory)
{
    make_dir("out", 0755);
    expect_output_error("build", "out", "out: is a directory; name the file to write");
}

Test(cli, build_under_a_file)
{
    make_file("plain");
    expect_output_error("build", "plain/prog", "plain' is not a directory");
}

Test(cli, build_into_an_unwritable_directory)
{
    char buf[128];
    const char *ro = unwritable_dir(buf, sizeof buf);
    if (!ro) cr_skip_test("no unwritable directory to try (root on a system whose /sys accepts files)");
    char out[256], want[256];
    snprintf(out, sizeof out, "%s/prog", ro);
    snprintf(want, sizeof want, "cannot write in the directory '%s'", ro);
    expect_output_error("build", out, want);
}

Test(cli, emit_into_a_missing_parent)
{
    expect_output_error("emit", "missing/gen", "missing' does not exist");
}

Test(cli, emit_onto_a_file)
{
    make_file("plain");
    expect_output_error("emit", "plain", "plain: exists and is not a directory");
}

Test(cli, emit_into_an_unwritable_directory)
{
    char buf[128];
    const char *ro = unwritable_dir(buf, sizeof buf);
    if (!ro) cr_skip_test("no unwritable directory to try (root on a system whose /sys accepts files)");
    expect_output_error("emit", ro, "cannot write in this directory");
}

Test(cli, ir_into_a_missing_directory)
{
    expect_output_error("ir", "missing/mlp.ir", "missing' does not exist");
}

/* The checks let good outputs through: emit creates its directory, ir writes its file. */
Test(cli, good_outputs_are_written)
{
    char args[512];
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "emit %s -o %s/gen", support_path("models/mlp.kiln"), dir);
    cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    snprintf(args, sizeof args, "ir %s -o %s/mlp.ir", support_path("models/mlp.kiln"), dir);
    cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    char path[256];
    snprintf(path, sizeof path, "%s/gen/model.c", dir);
    cr_expect_eq(access(path, R_OK), 0, "emit wrote no %s", path);
    snprintf(path, sizeof path, "%s/mlp.ir", dir);
    cr_expect_eq(access(path, R_OK), 0, "ir wrote no %s", path);
    sb_free(&out);
}

/* A build interrupted while the C compiler runs leaves no scratch directory behind: the
 * signal handler removes it (SIGTERM), and the next build removes one whose process was
 * killed outright (SIGKILL). The builds use TMPDIR=DIR/tmp, so that other builds running
 * at the same time do not matter; the script says whether the scratch directory was seen
 * during the build, and whether it is still there after. */
static void interrupted_build(const char *sig, bool rebuild)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "export TMPDIR='%s/tmp'; mkdir -p \"$TMPDIR\"; '%s' build '%s' -o '%s/gpt' >/dev/null 2>&1 & pid=$!; seen=no; "
             "for i in $(seq 200); do ls -d \"$TMPDIR\"/kiln-build-$pid-* >/dev/null 2>&1 && pgrep -P $pid >/dev/null && seen=yes && break; "
             "sleep 0.05; done; echo seen=$seen; "
             "sleep 0.3; kill -%s $pid; wait $pid; %s%s%s%s sleep 0.2; "
             "if ls -d \"$TMPDIR\"/kiln-build-* >/dev/null 2>&1; then echo left; else echo removed; fi",
             dir, KILN_BINARY, support_path("models/gpt.kiln"), dir, sig, rebuild ? "'" : "", rebuild ? KILN_BINARY : "",
             rebuild ? "' build models/mlp.kiln -o \"$TMPDIR/../mlp\" >/dev/null 2>&1;" : "", "");
    StrBuf out;
    sb_init(&out);
    char full[4200];
    snprintf(full, sizeof full, "cd '%s' && %s", support_path(""), cmd);
    support_run(full, &out);
    const char *text = out.data ? out.data : "";
    cr_expect(strstr(text, "seen=yes"), "the build's scratch directory never appeared in $TMPDIR: %s", text);
    cr_expect(strstr(text, "removed"), "after kill -%s%s: %s", sig, rebuild ? " and another build" : "", text);
    sb_free(&out);
}

Test(cli, a_terminated_build_removes_its_scratch_directory) { interrupted_build("TERM", false); }

Test(cli, the_next_build_removes_a_killed_builds_scratch_directory) { interrupted_build("KILL", true); }
