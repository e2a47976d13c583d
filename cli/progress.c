/* progress.c — the one-line progress of `kiln build` on a terminal (progress.h). The line
 * is rewritten with a carriage return and padded with spaces over the previous text
 * instead of an escape sequence, so that it works on any terminal. */
#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void draw(BuildProgress *p)
{
    if (!p || !p->on) return;
    char line[400];
    long s = (long)(now() - p->t0);
    int n = snprintf(line, sizeof line, "kiln: [%d/%d] %s", p->stage, p->nstages, p->what);
    if (p->pieces > 1 && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, ": %d of %d parts done", p->done, p->pieces);
    if (s >= 1 && n < (int)sizeof line) n += snprintf(line + n, sizeof line - (size_t)n, ", %ld s", s);
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    /* never wider than the terminal: a wrapped line cannot be rewritten */
    struct winsize ws;
    if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 8 && n >= ws.ws_col) n = ws.ws_col - 1;
    line[n] = 0;
    fprintf(stderr, "\r%s", line);
    for (size_t i = (size_t)n; i < p->shown; i++) fputc(' ', stderr);
    if (p->shown > (size_t)n) fprintf(stderr, "\r%s", line);
    fflush(stderr);
    p->shown = (size_t)n;
    p->shown_s = s;
}

void progress_init(BuildProgress *p, int nstages)
{
    memset(p, 0, sizeof *p);
    p->on = isatty(STDERR_FILENO) == 1;
    p->nstages = nstages;
    p->t0 = now();
}

void progress_stage(BuildProgress *p, int pieces, const char *fmt, ...)
{
    if (!p) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->what, sizeof p->what, fmt, ap);
    va_end(ap);
    if (p->stage < p->nstages) p->stage++;
    p->pieces = pieces;
    p->done = 0;
    p->t0 = now();
    draw(p);
}

void progress_piece_done(BuildProgress *p)
{
    if (!p) return;
    if (p->done < p->pieces) p->done++;
    draw(p);
}

void progress_tick(BuildProgress *p)
{
    if (p && p->on && (long)(now() - p->t0) != p->shown_s) draw(p);
}

void progress_clear(BuildProgress *p)
{
    if (!p || !p->on || !p->shown) return;
    fputc('\r', stderr);
    for (size_t i = 0; i < p->shown; i++) fputc(' ', stderr);
    fputc('\r', stderr);
    fflush(stderr);
    p->shown = 0;
}
