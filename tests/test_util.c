/* test_util.c — the base layer: sb_printf writes what snprintf writes, through its own
 * formatter or glibc's; the failure paths: KILN_ASSERT / KILN_UNREACHABLE report an
 * internal error with the file and line of the check (relative to the repository) and
 * abort; running out of memory exits with a message that is not an internal error. Each
 * failure case runs in a child process, whose stderr and end the test reads. */
#include <criterion/criterion.h>

#include <limits.h>

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../util/util.h"

typedef struct {
    int status;
    char err[4096];
} Child;

/* Runs fn(arg) in a child process with stderr captured. */
static Child run_child(void (*fn)(int), int arg)
{
    Child c = {0};
    int fd[2];
    cr_assert_eq(pipe(fd), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fd[0]);
        dup2(fd[1], 2);
        /* no core file for the deliberate aborts below */
        signal(SIGABRT, SIG_DFL);
        fn(arg);
        _exit(0);
    }
    close(fd[1]);
    size_t n = 0;
    ssize_t r;
    while (n < sizeof c.err - 1 && (r = read(fd[0], c.err + n, sizeof c.err - 1 - n)) > 0) n += (size_t)r;
    c.err[n] = 0;
    close(fd[0]);
    cr_assert_eq(waitpid(pid, &c.status, 0), pid);
    return c;
}

/* The lines of the checks that fail, which the reports must name. */
enum { LINE_ASSERT = __LINE__ + 3 };
static void failing_assert(int x)
{
    KILN_ASSERT(x == 2);
}

enum { LINE_ASSERT_MSG = __LINE__ + 3 };
static void failing_assert_msg(int x)
{
    KILN_ASSERT_MSG(x == 2, "node %%%d has no layout", x);
}

enum { LINE_UNREACHABLE = __LINE__ + 8 };
static int unreachable_default(int x)
{
    switch (x) {
    case 0: return 10;
    case 1: return 20;
    default: break;
    }
    KILN_UNREACHABLE();
}

static void failing_unreachable(int x) { (void)unreachable_default(x); }

static void passing_checks(int x)
{
    KILN_ASSERT(x == 1);
    KILN_ASSERT_MSG(x + 1 == 2, "not reported: %d", x);
    if (unreachable_default(x) != 20) _exit(3);
}

static void expect_internal_error(Child c, int line, const char *what)
{
    cr_expect(WIFSIGNALED(c.status) && WTERMSIG(c.status) == SIGABRT, "the child did not abort (status %#x): %s", c.status, c.err);
    char want[256];
    /* the path as in the repository, not the absolute one of the build */
    snprintf(want, sizeof want, "kiln: internal error at tests/test_util.c:%d: %s\n", line, what);
    cr_expect(!strncmp(c.err, want, strlen(want)), "stderr:\n%s\nwanted it to begin with:\n%s", c.err, want);
    cr_expect(strstr(c.err, "this is a bug in Kiln"), "no request to report it:\n%s", c.err);
}

Test(util_internal_error, assert_reports_condition_and_line)
{
    expect_internal_error(run_child(failing_assert, 1), LINE_ASSERT, "assertion failed: x == 2");
}

Test(util_internal_error, assert_msg_reports_message)
{
    expect_internal_error(run_child(failing_assert_msg, 7), LINE_ASSERT_MSG, "node %7 has no layout");
}

Test(util_internal_error, unreachable_reports_line)
{
    expect_internal_error(run_child(failing_unreachable, 5), LINE_UNREACHABLE, "unreachable code reached");
}

Test(util_internal_error, passing_checks_are_silent)
{
    Child c = run_child(passing_checks, 1);
    cr_expect(WIFEXITED(c.status) && WEXITSTATUS(c.status) == 0, "status %#x: %s", c.status, c.err);
    cr_expect_str_eq(c.err, "");
}

#ifndef __SANITIZE_ADDRESS__ /* AddressSanitizer stops an impossible malloc itself */
static void allocate_too_much(int x) { (void)xmalloc(SIZE_MAX - (size_t)x); }

Test(util_internal_error, out_of_memory_is_not_an_internal_error)
{
    Child c = run_child(allocate_too_much, 1);
    cr_expect(WIFEXITED(c.status) && WEXITSTATUS(c.status) == EXIT_FAILURE, "status %#x: %s", c.status, c.err);
    cr_expect(strstr(c.err, "kiln: out of memory (allocating "), "%s", c.err);
    cr_expect(!strstr(c.err, "internal error"), "%s", c.err);
}
#endif

/* sb_printf against snprintf, formats of its own formatter's set (util.c) and beyond it */
#define SAME_AS_SNPRINTF(...)                                                                                                \
    do {                                                                                                                     \
        StrBuf b;                                                                                                            \
        sb_init(&b);                                                                                                         \
        sb_puts(&b, "<");                                                                                                    \
        sb_printf(&b, __VA_ARGS__);                                                                                          \
        char want[512] = "<";                                                                                                \
        snprintf(want + 1, sizeof want - 1, __VA_ARGS__);                                                                   \
        cr_expect_str_eq(b.data, want);                                                                                      \
        cr_expect_eq(b.len, strlen(want));                                                                                   \
        sb_free(&b);                                                                                                         \
    } while (0)

Test(util_strbuf, sb_printf_writes_what_snprintf_writes)
{
    SAME_AS_SNPRINTF("plain text");
    SAME_AS_SNPRINTF("%s", "");
    SAME_AS_SNPRINTF("%d %i %u", -5, INT_MIN, 4000000000u);
    SAME_AS_SNPRINTF("%5d|%-5d|%05d|%3d", -42, -42, -42, 12345);
    SAME_AS_SNPRINTF("%ld %lld %zu %lu %lli %zd", LONG_MIN, LLONG_MIN, (size_t)-1, ULONG_MAX, -99LL, (size_t)12345);
    SAME_AS_SNPRINTF("%x %X %08x %hhx %hx %hd %hhd %hhu", 255, 255, 0xabc, -1, -1, 70000, 200, 300);
    SAME_AS_SNPRINTF("%lx %llx %zx %lX", 0xfffffffffUL, 0x123456789abcULL, (size_t)77, 0xbeefUL);
    SAME_AS_SNPRINTF("%s|%10s|%-10s|%.*s|%.*s|%.*s", "ab", "ab", "ab", 3, "abcdef", 10, "ab", 0, "abc");
    SAME_AS_SNPRINTF("%c%c%5c%-3c|", 'a', 'b', 'c', 'd');
    SAME_AS_SNPRINTF("100%% %d%%", 5);
    /* beyond the set: glibc's */
    SAME_AS_SNPRINTF("%g %.17g %+d % d %*d %e %.3f", 1.5, 0.1, 5, 5, 4, 3, 1e-7, 2.0 / 3);
    char long_text[300];
    memset(long_text, 'x', sizeof long_text - 1);
    long_text[sizeof long_text - 1] = 0;
    SAME_AS_SNPRINTF("[%s] %d", long_text, 7); /* longer than the room kept free */
}
