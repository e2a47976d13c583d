/* test_recipe.c — settings that are accepted but not implemented yet are said, not
 * ignored: the golden warnings of tests/warn/ (precision and checkpoint(...) have no effect
 * yet), printed once by `kiln check` and by `kiln build`. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "support.h"

/* ---- warnings: settings accepted but not implemented yet ---- */

static void check_warning_file(const char *name)
{
    char rel[256], args[1024];
    snprintf(rel, sizeof rel, "tests/warn/%s.expected", name);
    size_t n;
    char *want = support_read(rel, &n);
    cr_assert(want, "missing %s", rel);
    /* kiln check: exactly the expected lines on stderr (stdout is the model summary). */
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "( cd '%s' && '%s' check tests/warn/%s.kiln 2>&1 >/dev/null )", KILN_SOURCE_DIR, KILN_BINARY, name);
    int rc = support_run(args, &out);
    cr_expect_eq(rc, 0, "kiln check tests/warn/%s.kiln: exit %d:\n%s", name, rc, out.data);
    cr_expect_str_eq(out.data ? out.data : "", want, "kiln check tests/warn/%s.kiln: stderr differs from %s\nfound:\n%s", name, rel,
                     out.data ? out.data : "");
    /* kiln build: the same warnings, once, then the program. */
    char dir[] = "/tmp/kiln-warn-XXXXXX";
    cr_assert(mkdtemp(dir));
    sb_free(&out);
    sb_init(&out);
    snprintf(args, sizeof args, "cd '%s' && '%s' build tests/warn/%s.kiln -o %s/prog", KILN_SOURCE_DIR, KILN_BINARY, name, dir);
    rc = support_run(args, &out);
    StrBuf expect;
    sb_init(&expect);
    sb_printf(&expect, "%skiln: built %s/prog\n", want, dir);
    cr_expect_eq(rc, 0, "kiln build tests/warn/%s.kiln: exit %d:\n%s", name, rc, out.data);
    cr_expect_str_eq(out.data ? out.data : "", expect.data, "kiln build tests/warn/%s.kiln: output differs\nexpected:\n%s\nfound:\n%s",
                     name, expect.data, out.data ? out.data : "");
    sb_free(&expect);
    sb_free(&out);
    support_remove_dir(dir);
    free(want);
}

Test(warnings, precision_bf16_has_no_effect_yet) { check_warning_file("precision_bf16"); }
Test(warnings, precision_f32_needs_no_warning) { check_warning_file("precision_f32"); }
Test(warnings, checkpoint_in_forward_has_no_effect_yet) { check_warning_file("checkpoint_in_forward"); }
