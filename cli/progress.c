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
    long s = (long)(now() - p->t0);
    char head[32], tail[96] = "";
    int nh = snprintf(head, sizeof head, "kiln: [%d/%d] ", p->stage, p->nstages), nt = 0;
    if (p->pieces > 1) nt += snprintf(tail + nt, sizeof tail - (size_t)nt, ": %d of %d parts done", p->done, p->pieces);
    if (s >= 1) nt += snprintf(tail + nt, sizeof tail - (size_t)nt, ", %ld s", s);
    /* never wider than the terminal (a wrapped line cannot be rewritten): what the stage
     * does is shortened, so that the parts done and the seconds stay in sight */
    int room = 399 - nh - nt, nw = (int)strlen(p->what);
    struct winsize ws;
    const int cols = ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 8 ? ws.ws_col : 0;
    if (cols) room = cols - 1 - nh - nt;
    if (room < 0) room = 0;
    if (nw > room) nw = room;
    char line[400];
    int n = snprintf(line, sizeof line, "%s%.*s%s", head, nw, p->what, tail);
    if (n >= (int)sizeof line) n = (int)sizeof line - 1;
    if (cols && n >= cols) n = cols - 1;
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
