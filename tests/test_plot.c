/* test_plot.c — `kiln plot`: two small logs drawn to PNG (read back with cairo: its size,
 * curves in the plot area, both runs' colours) and to SVG; the bad logs of
 * tests/bad/plot/ (NAME.jsonl, its first stderr line in NAME.expected) and bad command
 * lines are one clear message and status 1 or 2, never a crash; and the JSON lines reader
 * (cli/jsonl.c) on mutated and truncated lines, where the sanitizer build checks that it
 * reads nothing outside the line. */
#include <cairo.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/jsonl.h"
#include "../cli/plot.h"
#include "support.h"

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-plot-XXXXXX");
    cr_assert(mkdtemp(dir), "cannot make a temporary directory");
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(plot, .init = setup, .fini = teardown, .timeout = 60);

/* A log as train_main.c writes it: a training line per step (loss, lr, the metric
 * accuracy), an evaluation line every 20 steps. `scale` sets the run apart. */
static void write_log(const char *name, double scale, bool warmup)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    for (int s = 1; s <= 100; s++) {
        double loss = scale * (2.3 * exp(-s / 30.0) + 0.3) + 0.05 * sin(s);
        double lr = warmup && s < 20 ? 1e-3 * s / 20 : 1e-3 * (0.5 + 0.5 * cos(3.14159265358979 * s / 100));
        fprintf(f, "{\"step\": %d, \"epoch\": 1, \"loss\": %.6g, \"lr\": %.6g, \"grad_norm\": %s, \"accuracy\": %.6g}\n", s, loss, lr,
                s == 7 ? "null" : "1.5", 1 - loss / 3);
        if (s % 20 == 0) fprintf(f, "{\"step\": %d, \"eval_loss\": %.6g, \"eval_accuracy\": %.6g}\n", s, loss * 1.1, 1 - loss / 2.8);
    }
    fclose(f);
}

static int plot(const char *args, StrBuf *out)
{
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "plot %s", args);
    out->len = 0;
    if (out->data) out->data[0] = 0;
    return support_run_kiln(cmd, out);
}

/* Pixels of the image within `tol` (sum of channel differences) of colour rgb, in the
 * rectangle [x0, x1) x [y0, y1). */
static int count_near(cairo_surface_t *s, unsigned rgb, int tol, int x0, int y0, int x1, int y1)
{
    const unsigned char *d = cairo_image_surface_get_data(s);
    int stride = cairo_image_surface_get_stride(s), n = 0;
    for (int y = y0; y < y1; y++)
        for (int x = x0; x < x1; x++) {
            uint32_t px = *(const uint32_t *)(d + y * stride + x * 4);
            int dr = abs((int)(px >> 16 & 255) - (int)(rgb >> 16 & 255)), dg = abs((int)(px >> 8 & 255) - (int)(rgb >> 8 & 255)),
                db = abs((int)(px & 255) - (int)(rgb & 255));
            n += dr + dg + db <= tol;
        }
    return n;
}

Test(plot, two_runs_to_png_and_svg)
{
    write_log("a.jsonl", 1.0, true);
    write_log("b.jsonl", 1.4, false);
    StrBuf out;
    sb_init(&out);
    char args[512];
    snprintf(args, sizeof args, "%s/a.jsonl %s/b.jsonl --metric accuracy -o %s/curves.png", dir, dir, dir);
    int rc = plot(args, &out);
    cr_assert_eq(rc, 0, "kiln plot failed (%d):\n%s", rc, out.data);
    char png[256];
    snprintf(png, sizeof png, "%s/curves.png", dir);
    cairo_surface_t *s = cairo_image_surface_create_from_png(png);
    cr_assert_eq(cairo_surface_status(s), CAIRO_STATUS_SUCCESS, "the PNG does not decode: %s", cairo_status_to_string(cairo_surface_status(s)));
    int w = cairo_image_surface_get_width(s), h = cairo_image_surface_get_height(s);
    /* three panels: loss, learning rate, accuracy */
    cr_expect_eq(w, PLOT_WIDTH);
    cr_expect_eq(h, PLOT_TITLE_H + PLOT_LOSS_H + 2 * PLOT_PANEL_H + PLOT_BOTTOM_H, "height %d", h);
    cairo_surface_flush(s);
    /* the loss panel's plot area, inside its frame */
    int x0 = PLOT_MARGIN_LEFT + 4, x1 = PLOT_WIDTH - PLOT_MARGIN_RIGHT - 4, y0 = PLOT_TITLE_H + 12, y1 = PLOT_TITLE_H + PLOT_LOSS_H - 56;
    int area = (x1 - x0) * (y1 - y0);
    int white = count_near(s, 0xffffff, 0, x0, y0, x1, y1);
    cr_expect(white < area - 500, "the plot area is blank: %d of %d pixels white", white, area);
    cr_expect(white > area / 2, "the plot area is mostly drawn over: %d of %d pixels white", white, area);
    static const unsigned pal[] = PLOT_PALETTE;
    int c0 = count_near(s, pal[0], 24, x0, y0, x1, y1), c1 = count_near(s, pal[1], 24, x0, y0, x1, y1);
    cr_expect(c0 > 100 && c1 > 100, "expected the curves of both runs in their colours: %d pixels of the first, %d of the second", c0, c1);
    /* and in each further panel */
    for (int p = 0; p < 2; p++) {
        int py0 = PLOT_TITLE_H + PLOT_LOSS_H + p * PLOT_PANEL_H + 12, py1 = py0 + PLOT_PANEL_H - 64;
        int n0 = count_near(s, pal[0], 24, x0, py0, x1, py1), n1 = count_near(s, pal[1], 24, x0, py0, x1, py1);
        cr_expect(n0 > 50 && n1 > 50, "panel %d: %d and %d pixels of the runs' colours", p + 1, n0, n1);
    }
    cairo_surface_destroy(s);

    snprintf(args, sizeof args, "%s/a.jsonl %s/b.jsonl --log-y -o %s/curves.svg", dir, dir, dir);
    rc = plot(args, &out);
    cr_assert_eq(rc, 0, "kiln plot to SVG failed (%d):\n%s", rc, out.data);
    char svg[256];
    snprintf(svg, sizeof svg, "%s/curves.svg", dir);
    FILE *f = fopen(svg, "r");
    cr_assert(f);
    StrBuf text;
    sb_init(&text);
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) sb_putn(&text, chunk, n);
    fclose(f);
    cr_expect(text.len > 2000 && !strncmp(text.data, "<?xml", 5) && strstr(text.data, "<svg") && strstr(text.data, "</svg>"),
              "not an SVG document (%zu bytes)", text.len);
    cr_expect(strstr(text.data, "width=\"960") != NULL, "the SVG is not 960 wide");
    /* no temporary file left beside the images */
    const char *names = support_listing(dir);
    cr_expect_str_eq(names, "a.jsonl|b.jsonl|curves.png|curves.svg");
    sb_free(&text);
    sb_free(&out);
}

/* One training line, nothing else: a curve of one point is still drawn (a dot). */
Test(plot, one_point)
{
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/one.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\": 1, \"loss\": 2.5, \"lr\": 0.001}", f); /* no newline at the end: complete JSON */
    fclose(f);
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "%s -o %s/one.png", path, dir);
    cr_expect_eq(plot(args, &out), 0, "%s", out.data);
    sb_free(&out);
}

/* A run still writing its log (or killed mid-line): the cut last line is left out with a
 * warning, the rest drawn. A cut line that is not the last is an error. */
Test(plot, incomplete_last_line)
{
    char path[256], args[512];
    snprintf(path, sizeof path, "%s/live.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\": 1, \"loss\": 2.5, \"lr\": 0.001}\n{\"step\": 2, \"loss\": 2.4, \"lr\": 0.001}\n{\"step\": 3, \"lo", f);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    snprintf(args, sizeof args, "%s -o %s/live.png", path, dir);
    cr_expect_eq(plot(args, &out), 0, "%s", out.data);
    cr_expect(strstr(out.data, "live.jsonl:3: warning: the last line is incomplete"), "%s", out.data);
    sb_free(&out);
}

/* The bad logs of the corpus: exit 1 and the expected first line. */
Test(plot, bad_logs)
{
    DIR *d = opendir(support_path("tests/bad/plot"));
    cr_assert(d, "no tests/bad/plot");
    struct dirent *e;
    int cases = 0;
    StrBuf out;
    sb_init(&out);
    while ((e = readdir(d))) {
        size_t len = strlen(e->d_name);
        if (len < 7 || strcmp(e->d_name + len - 6, ".jsonl")) continue;
        char rel[300], expected_path[300], args[700];
        snprintf(rel, sizeof rel, "tests/bad/plot/%s", e->d_name);
        snprintf(expected_path, sizeof expected_path, "tests/bad/plot/%.*s.expected", (int)(len - 6), e->d_name);
        size_t elen;
        char *expected = support_read(expected_path, &elen);
        cr_expect(expected, "%s has no .expected file", rel);
        if (!expected) continue;
        expected[strcspn(expected, "\n")] = 0;
        snprintf(args, sizeof args, "%s -o %s/bad.png", rel, dir);
        int rc = plot(args, &out);
        const char *text = out.data ? out.data : "";
        size_t first = strcspn(text, "\n");
        cr_expect(rc == 1, "%s: expected exit status 1, found %d:\n%s", rel, rc, text);
        cr_expect(strlen(expected) == first && !strncmp(text, expected, first), "%s: expected\n  %s\nfound\n  %.*s", rel, expected, (int)first, text);
        free(expected);
        cases++;
    }
    closedir(d);
    cr_expect(cases >= 10, "only %d bad logs found", cases);
    cr_expect(!support_listing(dir)[0], "a bad log left files: %s", support_listing(dir));
    sb_free(&out);
}

/* Bad command lines and the logs they name: one message, nothing written. */
Test(plot, bad_command_lines)
{
    write_log("a.jsonl", 1.0, true);
    char path[256];
    snprintf(path, sizeof path, "%s/zero.jsonl", dir);
    FILE *f = fopen(path, "w");
    fputs("{\"step\": 1, \"loss\": 1.5}\n{\"step\": 2, \"loss\": 0}\n", f);
    fclose(f);
    struct {
        const char *args; /* %1$s: the directory */
        int rc;
        const char *want;
    } cases[] = {
        {"%1$s/missing.jsonl -o %1$s/x.png", 1, "missing.jsonl: error: cannot open the log: No such file or directory"},
        {"%1$s/a.jsonl -o %1$s/x.jpg", 2, "x.jpg: the image's format comes from its extension, .png or .svg; this one has '.jpg'"},
        {"%1$s/a.jsonl -o %1$s/x", 2, "the image's format comes from its extension, .png or .svg; this one has none"},
        {"%1$s/a.jsonl --metric f1 -o %1$s/x.png", 2, "kiln plot: error: --metric f1: no log has it (their metrics: grad_norm, accuracy)"},
        {"%1$s/a.jsonl --metric accuracy,bleu -o %1$s/x.png", 2, "--metric bleu: no log has it"},
        {"%1$s/zero.jsonl --log-y -o %1$s/x.png", 1, "zero.jsonl:2: error: --log-y: loss 0 is not positive"},
        {"%1$s/a.jsonl -o %1$s/nodir/x.png", 1, "-o %1$s/nodir/x.png: cannot create the image: No such file or directory"},
        {"%1$s/a.jsonl", 2, "plot needs an output image: -o OUT.png or -o OUT.svg"},
        {"-o %1$s/x.png", 2, "no log given"},
        {"%1$s/a.jsonl --metric -o %1$s/x.png", 2, "kiln plot: error: --metric needs a value: NAME"},
        {"%1$s/a.jsonl --log-x -o %1$s/x.png", 2, "unknown option '--log-x' (did you mean '--log-y'?)"},
    };
    StrBuf out;
    sb_init(&out);
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[600], want[300];
        snprintf(args, sizeof args, cases[i].args, dir);
        snprintf(want, sizeof want, cases[i].want, dir);
        int rc = plot(args, &out);
        const char *text = out.data ? out.data : "";
        cr_expect_eq(rc, cases[i].rc, "kiln plot %s: expected status %d, found %d:\n%s", args, cases[i].rc, rc, text);
        size_t first = strcspn(text, "\n");
        cr_expect(strstr(text, want) && (size_t)(strstr(text, want) - text) < first, "kiln plot %s: expected a first line with\n  %s\nfound\n%s", args, want, text);
    }
    cr_expect_str_eq(support_listing(dir), "a.jsonl|zero.jsonl");
    sb_free(&out);
}

/* The reader on every prefix of valid lines and on random mutations of them: it returns
 * 0 or -1 with a column inside the line (plus one: the end), and never reads outside it
 * (each input is a copy of exactly its length, which ASan bounds). */
Test(plot, jsonl_reader_mutations)
{
    static const char *const lines[] = {
        "{\"step\": 12, \"epoch\": 1, \"loss\": 2.5e-3, \"lr\": -0.0003, \"grad_norm\": null, \"skipped\": false}",
        "{\"a\\u00e9\\ud83d\\ude00\\n\": \"x\\\"y\", \"n\": [1, [2, {\"k\": true}], {}], \"m\": {\"x\": []}, \"z\": -nan, \"w\": inf}",
    };
    JsonlObject obj = {0};
    char msg[256];
    int col;
    double v;
    cr_assert_eq(jsonl_parse(lines[0], strlen(lines[0]), &obj, &col, msg, sizeof msg), 0, "%s at %d", msg, col);
    cr_expect_eq(obj.n, 6);
    cr_expect(jsonl_number(&obj, "loss", &v) && v == 2.5e-3);
    cr_expect(jsonl_number(&obj, "lr", &v) && v == -0.0003);
    cr_expect(!jsonl_number(&obj, "grad_norm", &v));
    cr_assert_eq(jsonl_parse(lines[1], strlen(lines[1]), &obj, &col, msg, sizeof msg), 0, "%s at %d", msg, col);
    cr_expect_eq(obj.n, 5);
    cr_expect_str_eq(obj.fields[0].key, "a\xc3\xa9\xf0\x9f\x98\x80\n");
    cr_expect(jsonl_number(&obj, "z", &v) && isnan(v));
    cr_expect(jsonl_number(&obj, "w", &v) && isinf(v));
    static const char *const bad[] = {"", "{", "{\"a\"", "{\"a\":", "{\"a\":1", "{\"a\":1,}", "{\"a\":01}", "{\"a\":1.}", "{\"a\":1e}",
                                      "{\"a\":\"\\x\"}", "{\"a\":\"\\ud800\"}", "{\"a\":tru}", "{\"a\":nul}", "{a:1}", "[1]", "{\"a\":1} 2",
                                      "{\"a\":\"\x01\"}", "{\"a\":-}", "{\"a\":[1,]}", "{\"a\":{\"b\"}}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        col = 0;
        cr_expect_eq(jsonl_parse(bad[i], strlen(bad[i]), &obj, &col, msg, sizeof msg), -1, "accepted: %s", bad[i]);
        cr_expect(col >= 1 && (size_t)col <= strlen(bad[i]) + 1, "%s: column %d", bad[i], col);
    }
    /* nesting deeper than the reader goes: an error, not a stack overflow */
    size_t deep = 100000;
    char *d = malloc(deep + 8);
    memcpy(d, "{\"a\":", 5);
    memset(d + 5, '[', deep);
    cr_expect_eq(jsonl_parse(d, deep + 5, &obj, &col, msg, sizeof msg), -1);
    cr_expect(strstr(msg, "nested"), "%s", msg);
    free(d);
    srand(34);
    for (int round = 0; round < 20000; round++) {
        const char *src = lines[round % 2];
        size_t len = strlen(src);
        size_t cut = round < 400 ? (size_t)round % (len + 1) : len;
        char *buf = malloc(cut ? cut : 1);
        memcpy(buf, src, cut);
        if (round >= 400)
            for (int k = 0; k < 1 + rand() % 4; k++) buf[rand() % cut] = (char)(rand() % 256);
        col = 0;
        int rc = jsonl_parse(buf, cut, &obj, &col, msg, sizeof msg);
        cr_assert(rc == 0 || (rc == -1 && col >= 1 && (size_t)col <= cut + 1), "round %d: rc %d, column %d of %zu", round, rc, col, cut);
        free(buf);
    }
    jsonl_free(&obj);
}
