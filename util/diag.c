/* diag.c — diagnostics: `file:line:col: error: message`, then the source line and a caret
 * under the column. Every layer reports through one Diag so that several errors in one file
 * are all shown (up to max_errors) and tests can read exactly what a user would see. */
#include "util.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

void diag_init(Diag *d, FILE *echo)
{
    memset(d, 0, sizeof *d);
    sb_init(&d->out);
    d->echo = echo;
    d->max_errors = 20;
}

void diag_free(Diag *d)
{
    for (int32_t i = 0; i < d->nsources; i++) {
        free(d->sources[i].path);
        free(d->sources[i].text);
    }
    free(d->sources);
    sb_free(&d->out);
}

uint16_t diag_add_source(Diag *d, const char *path, const char *text, size_t len)
{
    if (d->nsources >= UINT16_MAX) return 0;
    GROW(d->sources, d->sources_cap, d->nsources + 1);
    DiagSource *s = &d->sources[d->nsources];
    s->path = xstrdup(path);
    s->text = xstrndup(text ? text : "", text ? len : 0);
    s->len = text ? len : 0;
    return (uint16_t)d->nsources++;
}

const char *diag_source_path(const Diag *d, uint16_t file)
{
    return file < d->nsources ? d->sources[file].path : "<unknown>";
}

/* Appends the source line of loc with a caret, printing control bytes and very long lines
 * in a bounded, readable way (a 1 MB line must not flood the terminal). */
static void put_source_line(StrBuf *b, const DiagSource *s, Loc loc)
{
    if (loc.line == 0) return;
    const char *p = s->text, *end = s->text + s->len;
    for (uint32_t line = 1; line < loc.line && p < end; p++)
        if (*p == '\n') line++;
    if (p > end) return;
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    size_t len = (size_t)(eol - p);
    if (len && p[len - 1] == '\r') len--; /* CRLF files: the CR is not part of the line */
    size_t col = loc.col ? loc.col - 1 : 0;
    if (col > len) col = len;
    /* Show a window of at most 100 bytes around the column. */
    size_t from = col > 60 ? col - 60 : 0;
    size_t to = from + 100 < len ? from + 100 : len;
    sb_puts(b, "    ");
    if (from > 0) sb_puts(b, "...");
    for (size_t i = from; i < to; i++) {
        unsigned char c = (unsigned char)p[i];
        sb_putc(b, (c == '\t' || (c >= 32 && c < 127) || c >= 128) ? (char)c : '?');
    }
    if (to < len) sb_puts(b, "...");
    sb_puts(b, "\n    ");
    if (from > 0) sb_puts(b, "   ");
    for (size_t i = from; i < col; i++) sb_putc(b, p[i] == '\t' ? '\t' : ' ');
    sb_puts(b, "^\n");
}

void diag_vreport(Diag *d, DiagLevel level, Loc loc, const char *fmt, va_list ap)
{
    if (level == DIAG_ERROR) {
        d->nerrors++;
        if (d->nerrors > d->max_errors) {
            d->suppressed++;
            return;
        }
    } else if (d->nerrors > d->max_errors) {
        return; /* notes attached to a suppressed error */
    }
    size_t start = d->out.len;
    const char *what = level == DIAG_ERROR ? "error" : level == DIAG_WARNING ? "warning" : "note";
    if (loc.file < d->nsources && loc.line > 0)
        sb_printf(&d->out, "%s:%u:%u: %s: ", d->sources[loc.file].path, loc.line, loc.col, what);
    else if (loc.file < d->nsources)
        sb_printf(&d->out, "%s: %s: ", d->sources[loc.file].path, what);
    else
        sb_printf(&d->out, "kiln: %s: ", what);
    size_t msg_start = d->out.len;
    sb_vprintf(&d->out, fmt, ap);
    /* One mistake must not flood the terminal (a 64 KB name quoted in full). */
    if (d->out.len - msg_start > 1000) {
        d->out.len = msg_start + 1000;
        d->out.data[d->out.len] = 0;
        sb_puts(&d->out, "...");
    }
    sb_putc(&d->out, '\n');
    if (level == DIAG_WARNING && start > 0) {
        /* A warning is reported once: a module's forward is lowered once per use, and a
         * command compiles a file in both modes. */
        char *line = xstrdup(d->out.data + start);
        d->out.data[start] = 0;
        bool seen = strstr(d->out.data, line) != NULL;
        d->out.data[start] = line[0];
        free(line);
        if (seen) {
            d->out.len = start;
            d->out.data[start] = 0;
            return;
        }
    }
    if (loc.file < d->nsources) put_source_line(&d->out, &d->sources[loc.file], loc);
    if (d->echo) {
        fwrite(d->out.data + start, 1, d->out.len - start, d->echo);
        fflush(d->echo);
    }
}

void diag_report(Diag *d, DiagLevel level, Loc loc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(d, level, loc, fmt, ap);
    va_end(ap);
}

void diag_finish(Diag *d)
{
    if (!d->suppressed) return;
    size_t start = d->out.len;
    sb_printf(&d->out, "kiln: %d more error%s not shown\n", d->suppressed, d->suppressed == 1 ? "" : "s");
    if (d->echo) fwrite(d->out.data + start, 1, d->out.len - start, d->echo);
    d->suppressed = 0;
}
