/* plot.c — `kiln plot LOG... -o OUT.png|svg`: reads training logs (JSON lines written by a
 * training program's --log FILE, programs/train_main.c: training lines with step, loss, lr
 * and the model's metrics; evaluation lines with step, eval_loss and eval_METRIC) and draws
 * them with cairo: the loss panel (training solid, evaluation dashed with dots), the
 * learning rate's panel, one panel per --metric; one colour per log, a legend naming each
 * by file. A log that cannot be read is one message naming its file and line. */
#include "plot.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../util/util.h"
#include "jsonl.h"

typedef struct {
    double *x, *y;
    int n, cap;
} Series;

typedef struct {
    const char *path;
    const char *label; /* the file's name, or its path where two logs share a name */
    Series loss, eval_loss, lr;
    Series *metric, *eval_metric; /* per metric name */
    int lines;                    /* non-blank lines read */
} Run;

typedef struct {
    const char *ylabel;
    bool log_y;
    int nseries;
    const Series **series; /* at most two a run: training and evaluation */
    int *run_of;
    bool *eval_of;
} Panel;

#define PLOT_PI 3.14159265358979323846

/* ---- reading ---- */

static void series_add(Series *s, double x, double y)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->x = xrealloc(s->x, (size_t)s->cap * sizeof *s->x);
        s->y = xrealloc(s->y, (size_t)s->cap * sizeof *s->y);
    }
    s->x[s->n] = x;
    s->y[s->n++] = y;
}

static void series_free(Series *s)
{
    free(s->x);
    free(s->y);
}

typedef struct {
    double x, y;
    int order;
} Point;

static int cmp_point(const void *a, const void *b)
{
    const Point *p = a, *q = b;
    if (p->x != q->x) return p->x < q->x ? -1 : 1;
    return p->order - q->order;
}

/* Sorts by step; of several values for one step (a run resumed from an older checkpoint
 * appends the same steps again) the later line wins. */
static void series_settle(Series *s)
{
    if (s->n < 2) return;
    Point *p = xmalloc((size_t)s->n * sizeof *p);
    for (int i = 0; i < s->n; i++) p[i] = (Point){s->x[i], s->y[i], i};
    qsort(p, (size_t)s->n, sizeof *p, cmp_point);
    int m = 0;
    for (int i = 0; i < s->n; i++) {
        if (m && p[i].x == s->x[m - 1]) m--;
        s->x[m] = p[i].x;
        s->y[m++] = p[i].y;
    }
    s->n = m;
    free(p);
}

/* Keys of a log line that are not worth a --metric panel (grad_norm and loss_scale are:
 * --metric grad_norm draws the gradient norm). */
static bool bookkeeping(const char *k)
{
    static const char *const keys[] = {"step", "epoch", "loss", "lr", "skipped", "skipped_steps", "eval_loss"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        if (!strcmp(k, keys[i])) return true;
    return false;
}

/* Collects the metric names the logs have (for the message about an unknown one). */
static void note_metric(StrBuf *seen, const char *key)
{
    if (bookkeeping(key)) return;
    const char *name = !strncmp(key, "eval_", 5) ? key + 5 : key;
    if (!*name) return;
    /* seen is "|a|b|": look for |name| */
    StrBuf probe;
    sb_init(&probe);
    sb_printf(&probe, "|%s|", name);
    if (!seen->data || !strstr(seen->data, probe.data)) {
        if (!seen->len) sb_putc(seen, '|');
        sb_printf(seen, "%s|", name);
    }
    sb_free(&probe);
}

/* Reads one log into r. Returns 0, or 1 after a message. */
static int read_log(Run *r, char **metrics, int nmetrics, bool log_y, StrBuf *seen)
{
    FILE *f = fopen(r->path, "rb");
    if (!f) {
        fprintf(stderr, "%s: error: cannot open the log: %s\n", r->path, strerror(errno));
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    int lineno = 0, rc = 0;
    JsonlObject obj = {0};
    char msg[256];
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        bool complete = len > 0 && line[len - 1] == '\n';
        if (complete) len--;
        bool blank = true;
        for (ssize_t i = 0; i < len && blank; i++) blank = line[i] == ' ' || line[i] == '\t' || line[i] == '\r';
        if (blank) continue;
        r->lines++;
        int col;
        if (jsonl_parse(line, (size_t)len, &obj, &col, msg, sizeof msg)) {
            int c = fgetc(f);
            if (!complete && c == EOF) { /* the run is still writing it, or was killed mid-line */
                fprintf(stderr, "%s:%d: warning: the last line is incomplete (a run still writing, or killed): left out\n", r->path, lineno);
                break;
            }
            fprintf(stderr, "%s:%d:%d: error: %s\n", r->path, lineno, col, msg);
            rc = 1;
            break;
        }
        double step, v;
        if (!jsonl_number(&obj, "step", &step) || !isfinite(step)) continue;
        for (int i = 0; i < obj.n; i++)
            if (obj.fields[i].kind == JSONL_NUMBER) note_metric(seen, obj.fields[i].key);
        static const char *const losses[2] = {"loss", "eval_loss"};
        for (int e = 0; e < 2; e++)
            if (jsonl_number(&obj, losses[e], &v) && isfinite(v)) {
                if (log_y && v <= 0) {
                    fprintf(stderr, "%s:%d: error: --log-y: %s %g is not positive; draw this log without --log-y\n", r->path, lineno, losses[e], v);
                    rc = 1;
                    goto done;
                }
                series_add(e ? &r->eval_loss : &r->loss, step, v);
            }
        if (jsonl_number(&obj, "lr", &v) && isfinite(v)) series_add(&r->lr, step, v);
        for (int k = 0; k < nmetrics; k++) {
            char key[300];
            snprintf(key, sizeof key, "eval_%s", metrics[k]);
            if (jsonl_number(&obj, metrics[k], &v) && isfinite(v)) series_add(&r->metric[k], step, v);
            if (jsonl_number(&obj, key, &v) && isfinite(v)) series_add(&r->eval_metric[k], step, v);
        }
    }
    if (!rc && ferror(f)) {
        fprintf(stderr, "%s: error: cannot read the log: %s\n", r->path, strerror(errno));
        rc = 1;
    } else if (!rc && !r->lines) {
        fprintf(stderr, "%s: error: the log is empty (a training program writes one with --log FILE)\n", r->path);
        rc = 1;
    } else if (!rc && !r->loss.n && !r->eval_loss.n) {
        fprintf(stderr, "%s: error: no line of its %d has a step with a \"loss\" or an \"eval_loss\": not a training log (PROG --log FILE)\n",
                r->path, r->lines);
        rc = 1;
    }
done:
    jsonl_free(&obj);
    free(line);
    fclose(f);
    series_settle(&r->loss);
    series_settle(&r->eval_loss);
    series_settle(&r->lr);
    for (int k = 0; k < nmetrics; k++) {
        series_settle(&r->metric[k]);
        series_settle(&r->eval_metric[k]);
    }
    return rc;
}

/* ---- axes ---- */

typedef struct {
    double lo, hi; /* the data range shown (log10 of it on a log axis) */
    bool log;
    double ticks[32];
    int nticks;
    double step; /* between ticks: on a linear axis, and on a log axis of less than a decade
                  * or so, whose ticks are then evenly spaced values (0 on other log axes) */
} Axis;

static double nice_step(double range, int target)
{
    double raw = range / target, mag = pow(10, floor(log10(raw))), f = raw / mag;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * mag;
}

/* The axis of data in [lo, hi] (log: lo, hi > 0): padded, with ticks at round numbers. */
static void axis_make(Axis *a, double lo, double hi, bool log_scale, bool pad)
{
    a->log = log_scale;
    a->nticks = 0;
    if (log_scale) {
        lo = log10(lo);
        hi = log10(hi);
    }
    if (!(hi > lo)) {
        double d = log_scale ? 0.5 : fabs(lo) > 0 ? fabs(lo) * 0.5 : 1;
        lo -= d;
        hi += d;
    }
    if (pad) {
        double d = (hi - lo) * 0.05;
        lo -= d;
        hi += d;
    }
    a->lo = lo;
    a->hi = hi;
    if (log_scale) {
        /* decades, or 1-2-5 within them when the range spans few */
        static const double sub[3] = {1, 2, 5};
        int per = hi - lo < 2.2 ? 3 : 1;
        for (double k = floor(lo); k <= ceil(hi) && a->nticks < 32; k++)
            for (int s = 0; s < per && a->nticks < 32; s++) {
                double t = k + log10(sub[s]);
                if (t >= lo && t <= hi) a->ticks[a->nticks++] = t;
            }
        a->step = 0;
        if (a->nticks >= 3) return;
        /* too few: round values, evenly spaced, placed on the log scale */
        double vlo = pow(10, lo), vhi = pow(10, hi);
        a->step = nice_step(vhi - vlo, 5);
        a->nticks = 0;
        for (double t = ceil(vlo / a->step) * a->step; t <= vhi && a->nticks < 32; t += a->step)
            if (t > 0) a->ticks[a->nticks++] = log10(t);
        return;
    }
    a->step = nice_step(hi - lo, 6);
    if (!pad) { /* the step axis: from tick to tick */
        a->lo = lo = floor(lo / a->step + 1e-9) * a->step;
        a->hi = hi = ceil(hi / a->step - 1e-9) * a->step;
    }
    for (double t = ceil(lo / a->step) * a->step; t <= hi + a->step * 1e-9 && a->nticks < 32; t += a->step)
        a->ticks[a->nticks++] = fabs(t) < a->step * 1e-9 ? 0 : t;
}

/* A tick's label: fixed-point with as many decimals as the tick step needs (trailing
 * zeros dropped), or n.ne-k for very small or large values. */
static void tick_label(const Axis *a, double t, char *buf, size_t n)
{
    double v = a->log ? pow(10, t) : t;
    double big = a->log ? fabs(v) : fmax(fabs(a->lo), fabs(a->hi));
    double step = a->step > 0 ? a->step : fabs(v);
    if (a->log && a->step > 0) big = pow(10, a->hi);
    if (v != 0 && (big < 1e-4 || big >= 1e7)) {
        int digits = (int)fmax(0, fmin(6, ceil(log10(fabs(v) / step) - 1e-9)));
        snprintf(buf, n, "%.*e", digits, v);
        char *e = strchr(buf, 'e'); /* 5.0e-05 -> 5.0e-5 */
        if (e) {
            char *d = e + 1;
            if (*d == '+') memmove(d, d + 1, strlen(d));
            if (*d == '-') d++;
            while (d[0] == '0' && d[1]) memmove(d, d + 1, strlen(d));
        }
        return;
    }
    int decimals = (int)fmax(0, fmin(12, -floor(log10(step) + 1e-9)));
    snprintf(buf, n, "%.*f", decimals, v);
    if (strchr(buf, '.')) {
        char *end = buf + strlen(buf) - 1;
        while (*end == '0') *end-- = 0;
        if (*end == '.') *end = 0;
    }
    if (!strcmp(buf, "-0")) strcpy(buf, "0");
}

/* ---- drawing ---- */

static const unsigned palette[] = PLOT_PALETTE;
#define NCOLORS ((int)(sizeof palette / sizeof palette[0]))

static void set_rgb(cairo_t *cr, unsigned rgb)
{
    cairo_set_source_rgb(cr, (rgb >> 16 & 255) / 255.0, (rgb >> 8 & 255) / 255.0, (rgb & 255) / 255.0);
}

static void text_at(cairo_t *cr, const char *s, double x, double y, double align_x, double align_y)
{
    cairo_text_extents_t te;
    cairo_text_extents(cr, s, &te);
    cairo_move_to(cr, x - te.width * align_x - te.x_bearing, y - te.height * align_y - te.y_bearing);
    cairo_show_text(cr, s);
}

typedef struct {
    double x0, y0, w, h; /* the plot area */
} Box;

static double map_x(const Box *b, const Axis *a, double v) { return b->x0 + (v - a->lo) / (a->hi - a->lo) * b->w; }
static double map_y(const Box *b, const Axis *a, double v)
{
    if (a->log) v = log10(v);
    return b->y0 + b->h - (v - a->lo) / (a->hi - a->lo) * b->h;
}

/* faint: a training curve under evaluations (lighter, so that they show through it) */
static void draw_series(cairo_t *cr, const Box *b, const Axis *ax, const Axis *ay, const Series *s, unsigned rgb, bool eval, bool faint)
{
    if (!s->n) return;
    cairo_set_source_rgba(cr, (rgb >> 16 & 255) / 255.0, (rgb >> 8 & 255) / 255.0, (rgb & 255) / 255.0, faint ? 0.5 : 1);
    cairo_set_line_width(cr, eval ? 2.2 : 1.2);
    static const double dash[2] = {6, 4};
    cairo_set_dash(cr, dash, eval ? 2 : 0, 0);
    /* Many more points than pixel columns (a long run): each column's first, lowest,
     * highest and last point, in step order, draw the same picture as all of them (an
     * SVG of 200,000 steps: 4.8 MB -> a few hundred KB). */
    bool thin = s->n > 4 * (int)b->w;
    int i = 0;
    while (i < s->n) {
        double x = map_x(b, ax, s->x[i]);
        int col = (int)floor(x), j = i, lo = i, hi = i;
        if (thin)
            while (j + 1 < s->n && (int)floor(map_x(b, ax, s->x[j + 1])) == col) {
                j++;
                if (s->y[j] < s->y[lo]) lo = j;
                if (s->y[j] > s->y[hi]) hi = j;
            }
        int pick[4] = {i, lo < hi ? lo : hi, lo < hi ? hi : lo, j};
        for (int k = 0; k < 4; k++) {
            if (k && pick[k] == pick[k - 1]) continue;
            double px = map_x(b, ax, s->x[pick[k]]), py = map_y(b, ay, s->y[pick[k]]);
            if (pick[k]) cairo_line_to(cr, px, py);
            else cairo_move_to(cr, px, py);
        }
        i = j + 1;
    }
    if (s->n == 1) cairo_rel_line_to(cr, 0.01, 0); /* one point: the marker shows it */
    cairo_stroke(cr);
    cairo_set_dash(cr, dash, 0, 0);
    if (eval || s->n == 1)
        for (int k = 0; k < s->n && s->n <= 400; k++) {
            cairo_arc(cr, map_x(b, ax, s->x[k]), map_y(b, ay, s->y[k]), 3.5, 0, 2 * PLOT_PI);
            cairo_fill(cr);
        }
}

/* Frame, grid, ticks and labels of one panel; then its curves, clipped to it. */
static void draw_panel(cairo_t *cr, const Box *b, const Axis *ax, const Panel *p, const Run *runs)
{
    double lo = INFINITY, hi = -INFINITY;
    for (int i = 0; i < p->nseries; i++)
        for (int k = 0; k < p->series[i]->n; k++) {
            double v = p->series[i]->y[k];
            lo = fmin(lo, v);
            hi = fmax(hi, v);
        }
    if (!(lo <= hi)) lo = p->log_y ? 1 : 0, hi = p->log_y ? 10 : 1;
    Axis ay;
    axis_make(&ay, lo, hi, p->log_y, true);
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_rectangle(cr, b->x0, b->y0, b->w, b->h);
    cairo_fill(cr);
    char buf[64];
    cairo_set_font_size(cr, 12);
    cairo_set_line_width(cr, 1);
    for (int i = 0; i < ay.nticks; i++) {
        double y = round(b->y0 + b->h - (ay.ticks[i] - ay.lo) / (ay.hi - ay.lo) * b->h) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, b->x0, y);
        cairo_line_to(cr, b->x0 + b->w, y);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        cairo_move_to(cr, b->x0 - 5, y);
        cairo_line_to(cr, b->x0, y);
        cairo_stroke(cr);
        tick_label(&ay, ay.ticks[i], buf, sizeof buf);
        text_at(cr, buf, b->x0 - 8, y, 1, 0.5);
    }
    for (int i = 0; i < ax->nticks; i++) {
        double x = round(map_x(b, ax, ax->ticks[i])) + 0.5;
        cairo_set_source_rgb(cr, 0.9, 0.9, 0.9);
        cairo_move_to(cr, x, b->y0);
        cairo_line_to(cr, x, b->y0 + b->h);
        cairo_stroke(cr);
        cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
        cairo_move_to(cr, x, b->y0 + b->h);
        cairo_line_to(cr, x, b->y0 + b->h + 5);
        cairo_stroke(cr);
        tick_label(ax, ax->ticks[i], buf, sizeof buf);
        text_at(cr, buf, x, b->y0 + b->h + 8, 0.5, 0);
    }
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    cairo_rectangle(cr, b->x0 + 0.5, b->y0 + 0.5, b->w - 1, b->h - 1);
    cairo_stroke(cr);
    cairo_set_font_size(cr, 13);
    text_at(cr, "step", b->x0 + b->w / 2, b->y0 + b->h + 24, 0.5, 0);
    cairo_save(cr);
    cairo_translate(cr, b->x0 - 66, b->y0 + b->h / 2);
    cairo_rotate(cr, -PLOT_PI / 2);
    char label[128];
    snprintf(label, sizeof label, "%s%s", p->ylabel, p->log_y ? " (log scale)" : "");
    text_at(cr, label, 0, 0, 0.5, 0.5);
    cairo_restore(cr);
    cairo_save(cr);
    cairo_rectangle(cr, b->x0 + 1, b->y0 + 1, b->w - 2, b->h - 2);
    cairo_clip(cr);
    bool has_eval = false;
    for (int i = 0; i < p->nseries; i++) has_eval |= p->eval_of[i];
    for (int eval = 0; eval < 2; eval++) /* evaluations on top of the noisier training curves */
        for (int i = 0; i < p->nseries; i++)
            if (p->eval_of[i] == eval) draw_series(cr, b, ax, &ay, p->series[i], palette[p->run_of[i] % NCOLORS], eval, !eval && has_eval);
    cairo_restore(cr);
    (void)runs;
}

/* The legend, in the loss panel's top right corner: each run's colour and name, then the
 * two line styles when the logs have evaluations. */
static void draw_legend(cairo_t *cr, const Box *b, const Run *runs, int nruns, bool any_eval)
{
    cairo_set_font_size(cr, 12);
    double w = 0;
    for (int i = 0; i < nruns; i++) {
        cairo_text_extents_t te;
        cairo_text_extents(cr, runs[i].label, &te);
        w = fmax(w, te.x_advance);
    }
    w = fmax(w, 80) + 44;
    int rows = nruns + (any_eval ? 2 : 0);
    double h = rows * 18 + 10, x = b->x0 + b->w - w - 10, y = b->y0 + 10;
    cairo_set_source_rgba(cr, 1, 1, 1, 0.88);
    cairo_rectangle(cr, x, y, w, h);
    cairo_fill(cr);
    cairo_set_source_rgb(cr, 0.7, 0.7, 0.7);
    cairo_set_line_width(cr, 1);
    cairo_rectangle(cr, x + 0.5, y + 0.5, w, h);
    cairo_stroke(cr);
    static const double dash[2] = {6, 4};
    for (int i = 0; i < rows; i++) {
        double ry = y + 14 + i * 18;
        bool style = i >= nruns;
        if (style) cairo_set_source_rgb(cr, 0.35, 0.35, 0.35);
        else set_rgb(cr, palette[i % NCOLORS]);
        cairo_set_line_width(cr, style ? 1.6 : 3);
        cairo_set_dash(cr, dash, style && i == nruns + 1 ? 2 : 0, 0);
        cairo_move_to(cr, x + 8, ry - 4);
        cairo_line_to(cr, x + 34, ry - 4);
        cairo_stroke(cr);
        cairo_set_dash(cr, dash, 0, 0);
        if (style && i == nruns + 1) {
            cairo_arc(cr, x + 21, ry - 4, 2.8, 0, 2 * PLOT_PI);
            cairo_fill(cr);
        }
        cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
        cairo_move_to(cr, x + 40, ry);
        cairo_show_text(cr, style ? (i == nruns ? "training" : "evaluation") : runs[i].label);
    }
}

/* ---- the command ---- */

typedef struct {
    FILE *f;
    int err;
} Sink;

static cairo_status_t write_sink(void *closure, const unsigned char *data, unsigned int len)
{
    Sink *s = closure;
    if (fwrite(data, 1, len, s->f) != len) {
        if (!s->err) s->err = errno ? errno : EIO;
        return CAIRO_STATUS_WRITE_ERROR;
    }
    return CAIRO_STATUS_SUCCESS;
}

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), k = strlen(suffix);
    return n > k && !strcasecmp(s + n - k, suffix);
}

/* The metric names of every --metric (comma lists split, eval_ prefixes dropped). */
static char **split_metrics(const PlotOptions *o, int *n)
{
    *n = 0;
    int cap = 0;
    char **names = NULL;
    for (int i = 0; i < o->nmetrics; i++) {
        const char *s = o->metrics[i];
        while (*s) {
            size_t len = strcspn(s, ",");
            const char *name = s;
            if (len > 5 && !strncmp(name, "eval_", 5)) name += 5, len -= 5;
            if (len) {
                bool dup = false;
                for (int k = 0; k < *n; k++) dup |= strlen(names[k]) == len && !strncmp(names[k], name, len);
                if (!dup) {
                    if (*n == cap) names = xrealloc(names, (size_t)(cap = cap ? cap * 2 : 4) * sizeof *names);
                    names[*n] = xmalloc(len + 1);
                    memcpy(names[*n], name, len);
                    names[(*n)++][len] = 0;
                }
            }
            s += len;
            if (*s == ',') s++;
        }
    }
    return names;
}

static void add_series(Panel *p, const Series *s, int run, bool eval)
{
    if (!s->n) return;
    p->series[p->nseries] = s;
    p->run_of[p->nseries] = run;
    p->eval_of[p->nseries++] = eval;
}

static void draw(cairo_t *cr, const Run *runs, int nruns, Panel *panels, int npanels, double height)
{
    cairo_set_source_rgb(cr, 1, 1, 1);
    cairo_paint(cr);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    /* the step axis, shared by the panels */
    double lo = INFINITY, hi = -INFINITY;
    bool any_eval = false;
    for (int p = 0; p < npanels; p++)
        for (int i = 0; i < panels[p].nseries; i++) {
            const Series *s = panels[p].series[i];
            lo = fmin(lo, s->x[0]);
            hi = fmax(hi, s->x[s->n - 1]);
            any_eval |= panels[p].eval_of[i];
        }
    Axis ax;
    axis_make(&ax, lo, hi, false, false);
    /* the title */
    StrBuf title;
    sb_init(&title);
    sb_puts(&title, "Training curves: ");
    for (int i = 0; i < nruns; i++) sb_printf(&title, "%s%s", i ? ", " : "", runs[i].label);
    if (title.len > 90) {
        title.len = 0;
        sb_printf(&title, "Training curves: %d runs", nruns);
    }
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
    cairo_set_font_size(cr, 16);
    text_at(cr, title.data, PLOT_WIDTH / 2.0, PLOT_TITLE_H / 2.0 + 2, 0.5, 0.5);
    sb_free(&title);
    cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
    double y = PLOT_TITLE_H;
    for (int p = 0; p < npanels; p++) {
        double ph = p ? PLOT_PANEL_H : PLOT_LOSS_H;
        Box b = {PLOT_MARGIN_LEFT, y + 6, PLOT_WIDTH - PLOT_MARGIN_LEFT - PLOT_MARGIN_RIGHT, ph - 6 - 46};
        draw_panel(cr, &b, &ax, &panels[p], runs);
        if (!p) draw_legend(cr, &b, runs, nruns, any_eval);
        y += ph;
    }
    (void)height;
}

/* Writes the image to a temporary file beside OUT, then renames it: an interrupted or
 * failed run leaves no truncated image. Returns 0, or 1 after a message. */
static int write_image(const char *out, bool svg, const Run *runs, int nruns, Panel *panels, int npanels)
{
    int height = PLOT_TITLE_H + PLOT_LOSS_H + (npanels - 1) * PLOT_PANEL_H + PLOT_BOTTOM_H;
    size_t n = strlen(out) + 32;
    char *tmp = xmalloc(n);
    snprintf(tmp, n, "%s.tmp.%ld", out, (long)getpid());
    Sink sink = {fopen(tmp, "wb"), 0};
    if (!sink.f) {
        fprintf(stderr, "kiln plot: error: -o %s: cannot create the image: %s\n", out, strerror(errno));
        free(tmp);
        return 1;
    }
    cairo_surface_t *surf = svg ? cairo_svg_surface_create_for_stream(write_sink, &sink, PLOT_WIDTH, height)
                                : cairo_image_surface_create(CAIRO_FORMAT_RGB24, PLOT_WIDTH, height);
    cairo_t *cr = cairo_create(surf);
    draw(cr, runs, nruns, panels, npanels, height);
    cairo_status_t st = cairo_status(cr);
    cairo_destroy(cr);
    if (st == CAIRO_STATUS_SUCCESS && !svg) st = cairo_surface_write_to_png_stream(surf, write_sink, &sink);
    cairo_surface_finish(surf);
    if (st == CAIRO_STATUS_SUCCESS) st = cairo_surface_status(surf);
    cairo_surface_destroy(surf);
    int err = sink.err;
    if (fflush(sink.f) != 0 && !err) err = errno;
    if (!err && fsync(fileno(sink.f)) != 0) err = errno;
    if (fclose(sink.f) != 0 && !err) err = errno;
    if (!err && st == CAIRO_STATUS_SUCCESS && rename(tmp, out) != 0) err = errno;
    int rc = 0;
    if (err || st != CAIRO_STATUS_SUCCESS) {
        fprintf(stderr, "kiln plot: error: -o %s: cannot write the image: %s\n", out, err ? strerror(err) : cairo_status_to_string(st));
        unlink(tmp);
        rc = 1;
    }
    free(tmp);
    return rc;
}

int plot_run(const PlotOptions *o)
{
    bool svg = ends_with(o->output, ".svg");
    if (!svg && !ends_with(o->output, ".png")) {
        const char *dot = strrchr(o->output, '.'), *slash = strrchr(o->output, '/');
        fprintf(stderr, "kiln plot: error: -o %s: the image's format comes from its extension, .png or .svg; this one has %s%s%s\n",
                o->output, dot && (!slash || dot > slash) ? "'" : "", dot && (!slash || dot > slash) ? dot : "none",
                dot && (!slash || dot > slash) ? "'" : "");
        return 2;
    }
    int nmetrics;
    char **metrics = split_metrics(o, &nmetrics);
    int nruns = o->nfiles, rc = 0;
    Run *runs = xcalloc((size_t)nruns, sizeof *runs);
    StrBuf seen;
    sb_init(&seen);
    for (int i = 0; i < nruns && !rc; i++) {
        Run *r = &runs[i];
        r->path = o->files[i];
        const char *slash = strrchr(r->path, '/');
        r->label = slash && slash[1] ? slash + 1 : r->path;
        r->metric = xcalloc((size_t)nmetrics + 1, sizeof *r->metric);
        r->eval_metric = xcalloc((size_t)nmetrics + 1, sizeof *r->eval_metric);
        rc = read_log(r, metrics, nmetrics, o->log_y, &seen);
    }
    for (int i = 0; i < nruns && !rc; i++) /* two logs of one name: their paths tell them apart */
        for (int k = 0; k < nruns; k++)
            if (k != i && !strcmp(runs[i].label, runs[k].label)) runs[i].label = runs[i].path;
    for (int k = 0; k < nmetrics && !rc; k++) {
        bool found = false;
        for (int i = 0; i < nruns; i++) found |= runs[i].metric[k].n || runs[i].eval_metric[k].n;
        if (!found) {
            StrBuf have;
            sb_init(&have);
            for (const char *s = seen.data ? seen.data + 1 : ""; *s;) {
                size_t len = strcspn(s, "|");
                sb_printf(&have, "%s%.*s", have.len ? ", " : "", (int)len, s);
                s += len + (s[len] == '|');
            }
            fprintf(stderr, "kiln plot: error: --metric %s: no log has it (%s%s)\n", metrics[k], have.len ? "their metrics: " : "they have no metrics",
                    have.len ? have.data : "");
            sb_free(&have);
            rc = 2;
        }
    }
    if (!rc) {
        int npanels = 0;
        Panel *panels = xcalloc((size_t)nmetrics + 2, sizeof *panels);
        for (int p = 0; p < nmetrics + 2; p++) {
            panels[p].series = xcalloc((size_t)nruns * 2, sizeof *panels[p].series);
            panels[p].run_of = xcalloc((size_t)nruns * 2, sizeof *panels[p].run_of);
            panels[p].eval_of = xcalloc((size_t)nruns * 2, sizeof *panels[p].eval_of);
        }
        Panel *loss = &panels[npanels++];
        loss->ylabel = "loss";
        loss->log_y = o->log_y;
        Panel *lr = &panels[npanels];
        lr->ylabel = "learning rate";
        for (int i = 0; i < nruns; i++) {
            add_series(loss, &runs[i].loss, i, false);
            add_series(loss, &runs[i].eval_loss, i, true);
            add_series(lr, &runs[i].lr, i, false);
        }
        if (lr->nseries) npanels++;
        for (int k = 0; k < nmetrics; k++) {
            Panel *p = &panels[npanels++];
            p->ylabel = metrics[k];
            for (int i = 0; i < nruns; i++) {
                add_series(p, &runs[i].metric[k], i, false);
                add_series(p, &runs[i].eval_metric[k], i, true);
            }
        }
        rc = write_image(o->output, svg, runs, nruns, panels, npanels);
        if (!rc) fprintf(stderr, "kiln: wrote %s (%d run%s, %d panel%s)\n", o->output, nruns, nruns == 1 ? "" : "s", npanels, npanels == 1 ? "" : "s");
        for (int p = 0; p < nmetrics + 2; p++) {
            free(panels[p].series);
            free(panels[p].run_of);
            free(panels[p].eval_of);
        }
        free(panels);
    }
    for (int i = 0; i < nruns; i++) {
        series_free(&runs[i].loss);
        series_free(&runs[i].eval_loss);
        series_free(&runs[i].lr);
        for (int k = 0; k < nmetrics && runs[i].metric; k++) {
            series_free(&runs[i].metric[k]);
            series_free(&runs[i].eval_metric[k]);
        }
        free(runs[i].metric);
        free(runs[i].eval_metric);
    }
    for (int k = 0; k < nmetrics; k++) free(metrics[k]);
    free(metrics);
    free(runs);
    sb_free(&seen);
    return rc;
}
