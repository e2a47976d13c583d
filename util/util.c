/* util.c — allocation, buffers, file reading and number formatting shared by all layers. */
#include "util.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Out of memory is the machine's limit, not a bug in Kiln: a message and a failing exit
 * status, without the internal error's request to report it. */
static _Noreturn void out_of_memory(size_t n)
{
    fprintf(stderr, "kiln: out of memory (allocating %zu bytes)\n", n);
    exit(EXIT_FAILURE);
}

void util_internal_error(const char *file, int line, const char *fmt, ...)
{
    /* __FILE__ is the absolute path CMake compiles; the report names the source file as
     * it is in the repository. */
#ifdef KILN_SOURCE_ROOT
    const size_t root = strlen(KILN_SOURCE_ROOT);
    if (!strncmp(file, KILN_SOURCE_ROOT, root)) file += root;
#endif
    fflush(stdout);
    fprintf(stderr, "kiln: internal error at %s:%d: ", file, line);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, "\nkiln: this is a bug in Kiln, not in the model; please report it with the model file and the "
                    "command that stopped here\n");
    abort();
}

void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) out_of_memory(n);
    return p;
}

void *xcalloc(size_t n, size_t size)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) out_of_memory(n * size);
    return p;
}

void *xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) out_of_memory(n);
    return q;
}

char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

char *xstrndup(const char *s, size_t n)
{
    char *p = xmalloc(n + 1);
    memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void grow_array(void **p, size_t elem, int32_t *cap, int64_t need)
{
    if (need <= *cap) return;
    if (need > INT32_MAX) out_of_memory((size_t)need * elem);
    int64_t c = *cap ? *cap : 8;
    while (c < need) c *= 2;
    if (c > INT32_MAX) c = INT32_MAX;
    *p = xrealloc(*p, (size_t)c * elem);
    *cap = (int32_t)c;
}

void sb_init(StrBuf *b) { b->data = NULL, b->len = b->cap = 0; }
void sb_free(StrBuf *b) { free(b->data); sb_init(b); }

static void sb_reserve(StrBuf *b, size_t extra)
{
    if (b->len + extra + 1 <= b->cap) return;
    size_t c = b->cap ? b->cap : 64;
    while (c < b->len + extra + 1) c *= 2;
    b->data = xrealloc(b->data, c);
    b->cap = c;
}

void sb_putn(StrBuf *b, const char *s, size_t n)
{
    sb_reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void sb_putc(StrBuf *b, char c) { sb_putn(b, &c, 1); }
void sb_puts(StrBuf *b, const char *s) { sb_putn(b, s, strlen(s)); }

/* The conversions sb_vprintf formats itself: d i u x X s c and %%, with the flags '-' and
 * '0', a width in digits, "%.*s", and the lengths hh h l ll z. Code generation formats
 * hundreds of thousands of short lines with these alone; glibc's vsnprintf spent more on
 * its set-up than on them (a quarter of a warm rebuild's code generation). Any other
 * format goes to vsnprintf whole, so the text is always what printf would write. */
static bool fast_format(const char *f)
{
    for (; *f; f++) {
        if (*f != '%') continue;
        f++;
        while (*f == '-' || *f == '0') f++;
        while (*f >= '0' && *f <= '9') f++;
        bool star_precision = false;
        if (*f == '.') {
            if (f[1] != '*') return false;
            star_precision = true;
            f += 2;
        }
        if (*f == 'h' || *f == 'l') f += f[1] == *f ? 2 : 1;
        else if (*f == 'z') f++;
        if (star_precision ? *f != 's' : !*f || !strchr("diuxXsc%", *f)) return false;
    }
    return true;
}

/* Appends s[0..n) in a field of width (left-justified when left, else padded with pad). */
static void put_field(StrBuf *b, const char *s, size_t n, int width, bool left, char pad)
{
    size_t fill = width > 0 && (size_t)width > n ? (size_t)width - n : 0;
    sb_reserve(b, n + fill);
    char *d = b->data + b->len;
    if (!left && pad == '0' && fill && n && (*s == '-')) { /* the sign before the zeros */
        *d++ = *s++;
        n--;
    }
    if (!left) memset(d, pad, fill), d += fill;
    memcpy(d, s, n), d += n;
    if (left) memset(d, ' ', fill), d += fill;
    b->len = (size_t)(d - b->data);
}

static void fast_vprintf(StrBuf *b, const char *f, va_list ap)
{
    while (*f) {
        const char *lit = f;
        while (*f && *f != '%') f++;
        if (f > lit) {
            size_t n = (size_t)(f - lit);
            sb_reserve(b, n);
            memcpy(b->data + b->len, lit, n);
            b->len += n;
        }
        if (!*f) break;
        f++;
        bool left = false;
        char pad = ' ';
        for (; *f == '-' || *f == '0'; f++) {
            if (*f == '-') left = true;
            else pad = '0';
        }
        int width = 0;
        for (; *f >= '0' && *f <= '9'; f++) width = width * 10 + (*f - '0');
        int precision = -1;
        if (*f == '.') { /* ".*", before an s */
            precision = va_arg(ap, int);
            f += 2;
        }
        int size = 0; /* 1 long, 2 long long, 3 size_t, -1 short, -2 char (passed as int) */
        if (*f == 'h') {
            size = f[1] == 'h' ? -2 : -1;
            f -= size;
        } else if (*f == 'l') {
            size = f[1] == 'l' ? 2 : 1;
            f += size;
        } else if (*f == 'z') {
            size = 3;
            f++;
        }
        const char conv = *f++;
        if (left) pad = ' ';
        if (conv == '%') {
            put_field(b, "%", 1, 0, false, ' ');
        } else if (conv == 's') {
            const char *s = va_arg(ap, const char *);
            if (!s) s = "(null)";
            size_t n = precision >= 0 ? strnlen(s, (size_t)precision) : strlen(s);
            put_field(b, s, n, width, left, ' ');
        } else if (conv == 'c') {
            char c = (char)va_arg(ap, int);
            put_field(b, &c, 1, width, left, ' ');
        } else {
            char digits[32], *e = digits + sizeof digits, *d = e;
            unsigned long long u;
            bool negative = false;
            if (conv == 'd' || conv == 'i') {
                long long v = size == 2 ? va_arg(ap, long long) : size == 1 ? va_arg(ap, long) : size == 3 ? (long long)va_arg(ap, size_t) : va_arg(ap, int);
                if (size == -1) v = (short)v;
                if (size == -2) v = (signed char)v;
                negative = v < 0;
                u = negative ? 0ull - (unsigned long long)v : (unsigned long long)v;
            } else {
                u = size == 2 ? va_arg(ap, unsigned long long) : size == 1 ? va_arg(ap, unsigned long) : size == 3 ? va_arg(ap, size_t) : va_arg(ap, unsigned);
                if (size == -1) u = (unsigned short)u;
                if (size == -2) u = (unsigned char)u;
            }
            const unsigned base = conv == 'x' || conv == 'X' ? 16 : 10;
            const char *set = conv == 'X' ? "0123456789ABCDEF" : "0123456789abcdef";
            do {
                *--d = set[u % base];
                u /= base;
            } while (u);
            if (negative) *--d = '-';
            put_field(b, d, (size_t)(e - d), width, left, pad);
        }
    }
    sb_reserve(b, 0);
    b->data[b->len] = 0;
}

void sb_vprintf(StrBuf *b, const char *fmt, va_list ap)
{
    if (fast_format(fmt)) {
        fast_vprintf(b, fmt, ap);
        return;
    }
    /* one formatting where the text fits the room left (most lines do, with 128 bytes
     * kept free), a second one after growing where it does not */
    sb_reserve(b, 128);
    va_list ap2;
    va_copy(ap2, ap);
    const size_t room = b->cap - b->len;
    int n = vsnprintf(b->data + b->len, room, fmt, ap2);
    va_end(ap2);
    if (n < 0) {
        b->data[b->len] = 0;
        return;
    }
    if ((size_t)n >= room) {
        sb_reserve(b, (size_t)n);
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    }
    b->len += (size_t)n;
}

void sb_printf(StrBuf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(b, fmt, ap);
    va_end(ap);
}

char *sb_take(StrBuf *b)
{
    char *d = b->data ? b->data : xstrdup("");
    sb_init(b);
    return d;
}

char *util_read_file(const char *path, size_t *len, StrBuf *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        sb_printf(err, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    StrBuf b;
    sb_init(&b);
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) sb_putn(&b, chunk, n);
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        sb_printf(err, "%s: read error", path);
        sb_free(&b);
        return NULL;
    }
    *len = b.len;
    return sb_take(&b);
}

void util_format_double(char *out, size_t outsz, double v)
{
    if (isnan(v)) { snprintf(out, outsz, "nan"); return; }
    if (isinf(v)) { snprintf(out, outsz, v < 0 ? "-inf" : "inf"); return; }
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, outsz, "%.*g", prec, v);
        if (strtod(out, NULL) == v) break;
    }
    /* Keep a marker that this is a real number, so "2" and "2.0" read back the same way. */
    if (!strpbrk(out, ".eEn")) {
        size_t l = strlen(out);
        if (l + 2 < outsz) memcpy(out + l, ".0", 3);
    }
}

int util_edit_distance_nocase(const char *a, const char *b)
{
    char la[65], lb[65];
    size_t i;
    for (i = 0; a[i] && i < 64; i++) la[i] = (char)(a[i] >= 'A' && a[i] <= 'Z' ? a[i] + 32 : a[i]);
    la[i] = 0;
    for (i = 0; b[i] && i < 64; i++) lb[i] = (char)(b[i] >= 'A' && b[i] <= 'Z' ? b[i] + 32 : b[i]);
    lb[i] = 0;
    return util_edit_distance(la, lb);
}

int util_edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 64 || lb > 64) return 1000;
    int row[65];
    for (size_t j = 0; j <= lb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= lb; j++) {
            int up = row[j];
            int cost = a[i - 1] == b[j - 1] ? 0 : 1;
            int best = diag + cost;
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[lb];
}

uint64_t util_hash_string(const char *s)
{
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    for (; *s; s++) h = (h ^ (unsigned char)*s) * UINT64_C(0x100000001b3);
    return h;
}

void strmap_free(StrMap *m)
{
    free(m->keys);
    free(m->vals);
    memset(m, 0, sizeof *m);
}

static uint32_t strmap_slot(const StrMap *m, const char *key)
{
    uint32_t mask = m->cap - 1, i = (uint32_t)util_hash_string(key) & mask;
    while (m->keys[i] && strcmp(m->keys[i], key)) i = (i + 1) & mask;
    return i;
}

int32_t strmap_get(const StrMap *m, const char *key, int32_t dflt)
{
    if (!m->cap) return dflt;
    uint32_t i = strmap_slot(m, key);
    return m->keys[i] ? m->vals[i] : dflt;
}

void strmap_put(StrMap *m, const char *key, int32_t val)
{
    if ((m->n + 1) * 2 > m->cap) {
        StrMap bigger = {0};
        bigger.cap = m->cap ? m->cap * 2 : 16;
        bigger.keys = xcalloc(bigger.cap, sizeof *bigger.keys);
        bigger.vals = xcalloc(bigger.cap, sizeof *bigger.vals);
        for (uint32_t i = 0; i < m->cap; i++)
            if (m->keys[i]) {
                uint32_t j = strmap_slot(&bigger, m->keys[i]);
                bigger.keys[j] = m->keys[i];
                bigger.vals[j] = m->vals[i];
                bigger.n++;
            }
        strmap_free(m);
        *m = bigger;
    }
    uint32_t i = strmap_slot(m, key);
    if (!m->keys[i]) {
        m->keys[i] = key;
        m->n++;
    }
    m->vals[i] = val;
}

bool util_parse_size(const char *s, int64_t *bytes)
{
    if (!s || !*s) return false;
    char *end;
    const double v = strtod(s, &end);
    if (end == s || !(v > 0) || *s == '-' || *s == '+' || isspace((unsigned char)*s)) return false;
    static const struct {
        const char *unit;
        double scale;
    } units[] = {{"", 1},         {"B", 1},         {"K", 1024.0},   {"KiB", 1024.0}, {"KB", 1e3},
                 {"M", 1048576.0}, {"MiB", 1048576.0}, {"MB", 1e6},  {"G", 1073741824.0}, {"GiB", 1073741824.0},
                 {"GB", 1e9},      {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12}};
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
        if (strcmp(end, units[k].unit)) continue;
        const double b = v * units[k].scale;
        if (!(b >= 1 && b < 4611686018427387904.0)) return false;
        *bytes = (int64_t)b;
        return true;
    }
    return false;
}

void util_words_add(char ***v, int *n, const char *w)
{
    *v = xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
    (*v)[(*n)++] = xstrdup(w);
}

void util_words_split(const char *s, char ***v, int *n)
{
    while (s && *s) {
        while (*s == ' ' || *s == '\t' || *s == '\n') s++;
        size_t len = strcspn(s, " \t\n");
        if (!len) break;
        *v = xrealloc(*v, (size_t)(*n + 1) * sizeof **v);
        (*v)[(*n)++] = xstrndup(s, len);
        s += len;
    }
}

void util_words_free(char **v, int n)
{
    for (int i = 0; i < n; i++) free(v[i]);
    free(v);
}
