/* test_bad.c — the bad-input corpus: nothing a user writes may crash kiln, hang it, or
 * leak under ASan, and every mistake gets a diagnostic at the right place.
 *
 * tests/bad/NAME.kiln is a model with one or more deliberate mistakes (or raw bytes:
 * empty, binary, a 1 MB line, deep nesting; the large ones are written by
 * tests/bad/gen_large.py and committed). tests/bad/NAME.expected holds exactly the first
 * line `kiln check tests/bad/NAME.kiln` prints on stderr. An optional tests/bad/NAME.all
 * lists every `error:` line, in order, for the files that check that several mistakes
 * are all reported. Each file is one parameterized test, run from the repository root
 * with a time limit; it must exit with status 1 (errors in the model), never with a
 * signal, a timeout or a sanitizer report. tests/bad/pending/ holds inputs that show a
 * compiler problem still to fix (see its README.md); it is not scanned. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "support.h"

#define BAD_DIR "tests/bad"
#define MIN_CORPUS 40
#define TIME_LIMIT_S 20
/* Exit statuses the sanitizers are told to use for a report, so that a report can never
 * pass for status 1 (ASan's default exitcode is 1, and so is the status of a leak found
 * at exit, which comes after the first line was printed correctly). */
#define ASAN_STATUS 86
#define UBSAN_STATUS 87

typedef struct {
    char name[128]; /* NAME of tests/bad/NAME.kiln */
} BadCase;

static int cmp_names(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool has_suffix(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcmp(s + n - k, suffix);
}

/* Sorted NAMEs of the files BAD_DIR/NAME<suffix>; *n gets the count. NULL when the
 * directory cannot be read. */
static char **list_names(const char *suffix, size_t *n)
{
    *n = 0;
    DIR *dir = opendir(support_path(BAD_DIR));
    if (!dir) return NULL;
    size_t cap = 16;
    char **names = malloc(cap * sizeof *names);
    struct dirent *e;
    while ((e = readdir(dir))) {
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, suffix)) continue;
        if (*n == cap) names = realloc(names, (cap *= 2) * sizeof *names);
        size_t len = strlen(e->d_name) - strlen(suffix);
        names[*n] = malloc(len + 1);
        memcpy(names[*n], e->d_name, len);
        names[(*n)++][len] = 0;
    }
    closedir(dir);
    qsort(names, *n, sizeof *names, cmp_names);
    return names;
}

static void free_names(char **names, size_t n)
{
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
}

static bool in_list(char **names, size_t n, const char *name)
{
    return bsearch(&name, names, n, sizeof *names, cmp_names) != NULL;
}

/* Runs `kiln check BAD_DIR/NAME.kiln` from the repository root under `timeout`,
 * capturing stderr only (stdout is discarded). Returns the raw wait status, or -1 when
 * the command could not be started. */
static int run_check(const char *name, StrBuf *err)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "cd '%s' && ASAN_OPTIONS=\"${ASAN_OPTIONS:+$ASAN_OPTIONS:}exitcode=%d:detect_leaks=1\" "
             "UBSAN_OPTIONS=\"${UBSAN_OPTIONS:+$UBSAN_OPTIONS:}exitcode=%d:halt_on_error=1:print_stacktrace=1\" "
             "timeout %d '%s' check '" BAD_DIR "/%s.kiln' 2>&1 >/dev/null",
             KILN_SOURCE_DIR, ASAN_STATUS, UBSAN_STATUS, TIME_LIMIT_S, KILN_BINARY, name);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    char chunk[4096];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, p)) > 0) sb_putn(err, chunk, got);
    return pclose(p);
}

/* What a wait status other than a clean exit 1 means, for the failure message. */
static void describe_status(int status, char *buf, size_t n)
{
    if (status == -1) {
        snprintf(buf, n, "could not be started");
    } else if (WIFSIGNALED(status)) {
        snprintf(buf, n, "was killed by signal %d (a crash)", WTERMSIG(status));
    } else if (!WIFEXITED(status)) {
        snprintf(buf, n, "ended abnormally (wait status 0x%x)", (unsigned)status);
    } else {
        int code = WEXITSTATUS(status);
        if (code == 0) snprintf(buf, n, "exited 0: the model was accepted as valid");
        else if (code == 124) snprintf(buf, n, "did not finish within %d s (a hang)", TIME_LIMIT_S);
        else if (code == ASAN_STATUS) snprintf(buf, n, "exited %d: AddressSanitizer or LeakSanitizer reported an error or a leak", code);
        else if (code == UBSAN_STATUS) snprintf(buf, n, "exited %d: UndefinedBehaviorSanitizer reported an error", code);
        else if (code > 128) snprintf(buf, n, "was killed by signal %d (a crash)", code - 128);
        else snprintf(buf, n, "exited %d instead of 1", code);
    }
}

/* The first line of text (without its newline), as a new string. */
static char *first_line(const char *text)
{
    size_t len = strcspn(text, "\n");
    char *s = malloc(len + 1);
    memcpy(s, text, len);
    s[len] = 0;
    return s;
}

/* The lines of text that contain ": error: ", each ending in '\n', as one new string. */
static char *error_lines(const char *text)
{
    StrBuf b;
    sb_init(&b);
    for (const char *p = text; *p;) {
        size_t len = strcspn(p, "\n");
        const char *hit = strstr(p, ": error: ");
        if (hit && hit < p + len) {
            sb_putn(&b, p, len);
            sb_putc(&b, '\n');
        }
        p += len;
        if (*p) p++;
    }
    return b.data ? sb_take(&b) : calloc(1, 1);
}

/* ---- the corpus as a whole ---- */

Test(bad_corpus, is_complete_and_consistent)
{
    size_t nk, ne, na;
    char **kiln = list_names(".kiln", &nk);
    char **expected = list_names(".expected", &ne);
    char **all = list_names(".all", &na);
    cr_assert(kiln && expected && all, "cannot read the directory %s", support_path(BAD_DIR));
    cr_expect_geq(nk, MIN_CORPUS, "%s holds %zu models; the corpus must keep at least %d", BAD_DIR, nk, MIN_CORPUS);
    for (size_t i = 0; i < nk; i++)
        cr_expect(in_list(expected, ne, kiln[i]), "%s/%s.kiln has no %s.expected", BAD_DIR, kiln[i], kiln[i]);
    for (size_t i = 0; i < ne; i++)
        cr_expect(in_list(kiln, nk, expected[i]), "%s/%s.expected has no %s.kiln", BAD_DIR, expected[i], expected[i]);
    for (size_t i = 0; i < na; i++)
        cr_expect(in_list(kiln, nk, all[i]), "%s/%s.all has no %s.kiln", BAD_DIR, all[i], all[i]);
    for (size_t i = 0; i < nk; i++) {
        char rel[512];
        /* Names go into a shell command between single quotes. */
        cr_expect(!strpbrk(kiln[i], "'\\\"$`") && strlen(kiln[i]) < sizeof ((BadCase *)0)->name,
                  "%s/%s.kiln: use a plain file name", BAD_DIR, kiln[i]);
        /* Hand-written models say what is wrong in a first-line comment; raw_* files are
         * the ones whose bytes are the point (empty, binary, generated). */
        if (!strncmp(kiln[i], "raw_", 4)) continue;
        snprintf(rel, sizeof rel, "%s/%s.kiln", BAD_DIR, kiln[i]);
        size_t len;
        char *text = support_read(rel, &len);
        cr_expect(text && len > 2 && text[0] == '#' && text[1] == ' ',
                  "%s must start with a `# comment` saying what is wrong", rel);
        free(text);
    }
    for (size_t i = 0; i < ne; i++) {
        char rel[512];
        snprintf(rel, sizeof rel, "%s/%s.expected", BAD_DIR, expected[i]);
        size_t len;
        char *text = support_read(rel, &len);
        cr_expect(text && len > 1 && text[len - 1] == '\n' && memchr(text, '\n', len) == text + len - 1,
                  "%s must hold exactly one line, ending in a newline", rel);
        free(text);
    }
    free_names(kiln, nk);
    free_names(expected, ne);
    free_names(all, na);
}

/* ---- one test per file ---- */

static void free_cases(struct criterion_test_params *crp)
{
    cr_free(crp->params);
}

ParameterizedTestParameters(bad, check)
{
    size_t n;
    char **names = list_names(".kiln", &n);
    BadCase *cases = cr_malloc(sizeof *cases * (n ? n : 1));
    size_t k = 0;
    for (size_t i = 0; names && i < n; i++) {
        if (strlen(names[i]) >= sizeof cases[k].name) continue; /* reported by is_complete_and_consistent */
        memset(&cases[k], 0, sizeof cases[k]);
        strcpy(cases[k++].name, names[i]);
    }
    if (names) free_names(names, n);
    return cr_make_param_array(BadCase, cases, k, free_cases);
}

ParameterizedTest(BadCase *c, bad, check)
{
    const char *name = c->name;
    char rel[512];
    snprintf(rel, sizeof rel, "%s/%s.expected", BAD_DIR, name);
    size_t len;
    char *expected = support_read(rel, &len);
    cr_assert(expected, "%s/%s.kiln: missing %s", BAD_DIR, name, rel);
    char *want = first_line(expected);

    StrBuf err;
    sb_init(&err);
    int status = run_check(name, &err);
    const char *out = err.data ? err.data : "";
    if (status == -1 || !WIFEXITED(status) || WEXITSTATUS(status) != 1) {
        char why[160];
        describe_status(status, why, sizeof why);
        cr_expect_fail("kiln check %s/%s.kiln %s; stderr began:\n%.3000s", BAD_DIR, name, why, out);
    }
    /* With ASAN_OPTIONS=log_path the reports go to files; by default they come here. */
    cr_expect(!strstr(out, "Sanitizer") && !strstr(out, "runtime error:"),
              "kiln check %s/%s.kiln: sanitizer report:\n%.3000s", BAD_DIR, name, out);
    char *got = first_line(out);
    cr_expect_str_eq(got, want, "kiln check %s/%s.kiln: first line differs\n  expected: %.600s\n  found:    %.600s",
                     BAD_DIR, name, want, got);

    snprintf(rel, sizeof rel, "%s/%s.all", BAD_DIR, name);
    char *all = support_read(rel, &len);
    if (all) {
        char *errors = error_lines(out);
        cr_expect_str_eq(errors, all, "kiln check %s/%s.kiln: the errors differ from %s\n  expected:\n%.2000s  found:\n%.2000s",
                         BAD_DIR, name, rel, all, errors);
        free(errors);
        free(all);
    }
    free(got);
    free(want);
    free(expected);
    sb_free(&err);
}
