/* test_cli.c — the `kiln` command's help, kept in step with its flag table and the docs
 * (and the training program's), and its handling of its output paths: `kiln build -o PROG`,
 * `kiln emit -o DIR` and `kiln ir -o FILE` name a missing directory, an unwritable one,
 * or an output that is a directory (or not one) in one line, exit 2 (the command line is
 * wrong), and do so before anything is compiled: never "the C compiler failed" with its
 * command line. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../cli/options.h"
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
 * killed outright (SIGKILL). The compiler is Clang inside kiln (model.c is in the
 * directory: it is compiling) or a child process. The builds use TMPDIR=DIR/tmp, so that other builds running
 * at the same time do not matter; the script says whether the scratch directory was seen
 * during the build, and whether it is still there after. */
static void interrupted_build(const char *sig, bool rebuild)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             /* an empty object cache of its own: the build compiles, and is still running */
             "export TMPDIR='%s/tmp' XDG_CACHE_HOME='%s/cache-%s'; mkdir -p \"$TMPDIR\"; '%s' build '%s' -o '%s/gpt' >/dev/null 2>&1 & pid=$!; seen=no; "
             "for i in $(seq 200); do ls -d \"$TMPDIR\"/kiln-build-$pid-*/model.c >/dev/null 2>&1 && seen=yes && break; "
             "sleep 0.05; done; echo seen=$seen; "
             "sleep 0.3; kill -%s $pid; wait $pid; %s%s%s%s sleep 0.2; "
             "if ls -d \"$TMPDIR\"/kiln-build-* >/dev/null 2>&1; then echo left; else echo removed; fi",
             dir, dir, sig, KILN_BINARY, support_path("models/gpt.kiln"), dir, sig, rebuild ? "'" : "", rebuild ? KILN_BINARY : "",
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

/* ---- help and docs in step with the flags that exist ----
 * The kiln command's flags are cli/options.c's table; the training program's are the
 * table `flags[]` of programs/train_main.c (read from the source, so that a row added
 * there is checked without changing this test) and a distributed program's own, printed by
 * tm_dist_usage in programs/dist_mpi.c. A flag must be in its command's --help and in the
 * docs; a --flag that a help text names must exist. */

/* Whether text has `flag` as a whole word: not followed by a letter, digit or '-', not
 * preceded by one (so --log is not found in --log-y or in --eval-batches' text). */
static bool has_flag_word(const char *text, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = text; (p = strstr(p, flag)); p++) {
        char before = p > text ? p[-1] : ' ', after = p[n];
        bool word = (after == 0 || !(isalnum((unsigned char)after) || after == '-' || after == '_')) &&
                    !(isalnum((unsigned char)before) || before == '-' || before == '_');
        if (word) return true;
    }
    return false;
}

/* The docs a flag may be described in: README.md and every docs/NAME.md (or the one file
 * `only`), concatenated. */
static char *read_docs(const char *only)
{
    StrBuf all;
    sb_init(&all);
    size_t len;
    char *readme = support_read("README.md", &len);
    cr_assert(readme, "no README.md");
    sb_puts(&all, readme);
    free(readme);
    if (only) {
        char *t = support_read(only, &len);
        cr_assert(t, "no %s", only);
        sb_puts(&all, t);
        free(t);
        return sb_take(&all);
    }
    DIR *d = opendir(support_path("docs"));
    cr_assert(d);
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n < 4 || strcmp(e->d_name + n - 3, ".md")) continue;
        char rel[300];
        snprintf(rel, sizeof rel, "docs/%s", e->d_name);
        char *t = support_read(rel, &len);
        if (t) sb_puts(&all, t);
        free(t);
    }
    closedir(d);
    return sb_take(&all);
}

/* The `--name` words of a text (help output), each once, into names (at most cap). */
static int flags_named_in(const char *text, char names[][48], int cap)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, "--")); p += 2) {
        if (p > text && (isalnum((unsigned char)p[-1]) || p[-1] == '-')) continue;
        size_t len = 2;
        while (isalnum((unsigned char)p[len]) || p[len] == '-' || p[len] == '_') len++;
        if (len == 2 || len >= 48) continue;
        bool seen = false;
        for (int i = 0; i < n; i++) seen |= strlen(names[i]) == len && !strncmp(names[i], p, len);
        if (seen || n == cap) continue;
        memcpy(names[n], p, len);
        names[n++][len] = 0;
    }
    return n;
}

/* The flags of the table whose rows start with {"--NAME" between `start` and the next
 * line "};" of the source file rel. */
static int flags_of_table(const char *rel, const char *start, char names[][48], int cap)
{
    size_t len;
    char *src = support_read(rel, &len);
    cr_assert(src, "no %s", rel);
    char *p = strstr(src, start);
    cr_assert(p, "%s: no '%s'", rel, start);
    char *end = strstr(p, "\n};");
    cr_assert(end, "%s: the table does not end", rel);
    *end = 0;
    int n = 0;
    for (char *q = p; (q = strstr(q, "{\"--")) && n < cap; q++) {
        size_t k = strcspn(q + 2, "\"");
        cr_assert(k < 48);
        memcpy(names[n], q + 2, k);
        names[n++][k] = 0;
    }
    free(src);
    return n;
}

/* The training program's flags: train_main.c's table and a distributed program's. */
static int program_flags(char names[][48], int cap, int *ndist)
{
    int n = flags_of_table("programs/train_main.c", "static const Flag flags[] = {", names, cap);
    cr_assert(n >= 20, "only %d flags found in train_main.c's table", n);
    size_t len;
    char *src = support_read("programs/dist_mpi.c", &len);
    cr_assert(src);
    char *p = strstr(src, "void tm_dist_usage(FILE *f)");
    cr_assert(p, "dist_mpi.c: no tm_dist_usage");
    char *end = strstr(p, "\n}");
    *end = 0;
    *ndist = 0;
    for (char *q = p; (q = strstr(q, "\"--")) && n < cap; q++) {
        size_t k = strcspn(q + 1, "\" ");
        memcpy(names[n], q + 1, k);
        names[n++][k] = 0;
        ++*ndist;
    }
    free(src);
    cr_assert(*ndist >= 1, "no flags found in tm_dist_usage");
    return n;
}

static char *kiln_help(const char *cmd)
{
    char args[64];
    snprintf(args, sizeof args, "%s --help", cmd ? cmd : "");
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln(args, &out);
    cr_assert_eq(rc, 0, "kiln %s: status %d\n%s", args, rc, out.data);
    return sb_take(&out);
}

Test(cli, every_flag_is_in_its_help_and_the_docs)
{
    int nflags, ncmds;
    const CliFlag *flags = cli_flags(&nflags);
    const CliCommand *cmds = cli_commands(&ncmds);
    char *docs = read_docs(NULL);
    for (int c = 0; c < ncmds; c++) {
        char *help = kiln_help(cmds[c].name);
        for (int i = 0; i < nflags; i++) {
            if (!(flags[i].commands & cmds[c].bit)) continue;
            cr_expect(has_flag_word(help, flags[i].name), "kiln %s --help does not list %s", cmds[c].name, flags[i].name);
            if (flags[i].alias) cr_expect(has_flag_word(help, flags[i].alias), "kiln %s --help does not list %s", cmds[c].name, flags[i].alias);
        }
        free(help);
    }
    for (int i = 0; i < nflags; i++) {
        cr_expect(flags[i].help && *flags[i].help, "%s has no help line", flags[i].name);
        cr_expect(has_flag_word(docs, flags[i].name), "%s (kiln %s) is in neither README.md nor docs/", flags[i].name,
                  cli_commands(&ncmds)[__builtin_ctz(flags[i].commands)].name);
    }
    for (int c = 0; c < ncmds; c++)
        cr_expect(strstr(docs, cmds[c].name), "the command %s is in neither README.md nor docs/", cmds[c].name);
    free(docs);
}

/* Every --flag a help text names exists: a kiln flag (of any command: help texts point
 * to each other), one of the training program's (kiln train passes them on), or --help and
 * --version. */
Test(cli, every_flag_a_help_names_exists)
{
    int nflags, ncmds, ndist;
    const CliFlag *flags = cli_flags(&nflags);
    const CliCommand *cmds = cli_commands(&ncmds);
    static char prog[128][48];
    int nprog = program_flags(prog, 128, &ndist);
    for (int c = -1; c < ncmds; c++) {
        char *help = kiln_help(c < 0 ? NULL : cmds[c].name);
        static char named[256][48];
        int n = flags_named_in(help, named, 256);
        for (int k = 0; k < n; k++) {
            bool known = !strcmp(named[k], "--help") || !strcmp(named[k], "--version");
            for (int i = 0; i < nflags && !known; i++) known = !strcmp(flags[i].name, named[k]);
            for (int i = 0; i < nprog && !known; i++) known = !strcmp(prog[i], named[k]);
            cr_expect(known, "kiln %s --help names %s, which no command has", c < 0 ? "" : cmds[c].name, named[k]);
        }
        free(help);
    }
}

/* The training program: PROG --help lists every flag of its table and nothing else, and
 * each is in README.md or docs/training.md (a distributed program's own: in README.md or
 * docs/distributed.md). */
Test(cli, the_training_programs_flags_are_in_its_help_and_the_docs, .timeout = 120)
{
    static char prog[128][48];
    int ndist;
    int n = program_flags(prog, 128, &ndist);
    StrBuf out;
    sb_init(&out);
    cr_assert_eq(support_run_kiln("train models/mlp.kiln --help", &out), 0, "%s", out.data);
    const char *help = strstr(out.data, "usage: ");
    cr_assert(help, "no usage in:\n%s", out.data);
    char *training = read_docs("docs/training.md"), *distributed = read_docs("docs/distributed.md");
    for (int i = 0; i < n; i++) {
        bool dist = i >= n - ndist;
        if (!dist) cr_expect(has_flag_word(help, prog[i]), "PROG --help does not list %s (programs/train_main.c)", prog[i]);
        cr_expect(has_flag_word(dist ? distributed : training, prog[i]), "the training program's %s is in neither README.md nor %s", prog[i],
                  dist ? "docs/distributed.md" : "docs/training.md");
    }
    static char named[256][48];
    int nn = flags_named_in(help, named, 256);
    for (int k = 0; k < nn; k++) {
        bool known = !strcmp(named[k], "--help");
        for (int i = 0; i < n && !known; i++) known = !strcmp(prog[i], named[k]);
        cr_expect(known, "PROG --help names %s, which is not in train_main.c's table", named[k]);
    }
    free(training);
    free(distributed);
    sb_free(&out);
}

/* ---- the progress line of kiln build ---- */

/* On a terminal (a pseudo-terminal made by script(1)), kiln build says what it is doing on
 * one line rewritten with carriage returns: the stages, the compiler's parts done. Not on
 * a pipe: there stderr has the one line it always had. */
Test(cli, build_progress_on_a_terminal_only, .timeout = 120)
{
    StrBuf out;
    sb_init(&out);
    if (support_run("command -v script", &out) != 0) cr_skip_test("no script(1) (util-linux) to make a terminal");
    char cmd[2048];
    /* an empty object cache: every piece is compiled */
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache' script -qec \"'%s' build '%s' -o '%s/tty-mlp'\" /dev/null </dev/null", dir, KILN_BINARY,
             support_path("models/mlp.kiln"), dir);
    out.len = 0;
    int rc = support_run(cmd, &out);
    const char *text = out.data ? out.data : "";
    cr_assert_eq(rc, 0, "%s\n%s", cmd, text);
    static const char *const want[] = {"\rkiln: [1/4] running the passes", "\rkiln: [2/4] generating C code",
                                       "\rkiln: [3/4] compiling ", " pieces of model.c with ", ": 1 of ", " parts done",
                                       "\rkiln: [4/4] linking the program", "kiln: built "};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++) cr_expect(strstr(text, want[i]), "no \"%s\" on the terminal:\n%s", want[i], text);
    /* the last line is the result alone: the progress line was blanked before it */
    const char *built = strstr(text, "kiln: built ");
    cr_expect(built && built > text && built[-1] == '\r', "the result does not start a clean line:\n%s", text);

    /* a narrow terminal: the line fits it, what the stage does shortened rather than the
     * parts done (a fresh cache, so that the pieces compile again) */
    snprintf(cmd, sizeof cmd, "XDG_CACHE_HOME='%s/cache-narrow' script -qec \"stty cols 60; '%s' build '%s' -o '%s/tty-mlp'\" /dev/null </dev/null",
             dir, KILN_BINARY, support_path("models/mlp.kiln"), dir);
    out.len = 0;
    cr_assert_eq(support_run(cmd, &out), 0, "%s\n%s", cmd, out.data);
    text = out.data ? out.data : "";
    cr_expect(strstr(text, " parts done"), "no parts done on a 60-column terminal:\n%s", text);
    for (const char *line = text; *line;) {
        size_t n = strcspn(line, "\r\n");
        cr_expect_lt(n, 60, "a line of %zu characters on a 60-column terminal: %.*s", n, (int)n, line);
        line += n;
        while (*line == '\r' || *line == '\n') line++;
    }

    snprintf(cmd, sizeof cmd, "'%s' build '%s' -o '%s/pipe-mlp' 2>&1 >/dev/null | cat", KILN_BINARY, support_path("models/mlp.kiln"), dir);
    out.len = 0;
    cr_assert_eq(support_run(cmd, &out), 0, "%s", out.data);
    char expect[256];
    snprintf(expect, sizeof expect, "kiln: built %s/pipe-mlp\n", dir);
    cr_expect_str_eq(out.data, expect, "not a terminal: expected only the result line");
    sb_free(&out);
}
