/* util.h — the small base layer every other layer uses: checked allocation, a growable
 * byte buffer, and diagnostics in the `file:line:col: error: message` form with the source
 * line and a caret. Kept free of IR knowledge so the frontend, the IR reader and the CLI
 * can share one way of reporting errors. */
#ifndef KILN_UTIL_H
#define KILN_UTIL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define KILN_VERSION "0.1.0"
#define KILN_PI 3.14159265358979323846

#if defined(__GNUC__)
#define KILN_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define KILN_PRINTF(a, b)
#endif

/* ---- internal errors ----
 * A broken invariant of Kiln itself (not bad input, which is a diagnostic): one message
 * with the file and line of the check, a request to report it, then abort() (so a core
 * dump or a debugger stops there). The only place the compiler calls abort(). Unlike
 * assert(), the condition is always evaluated (no NDEBUG): a check may have effects the
 * code after it needs (codegen's fusion_layout fills the layout it checks). */
_Noreturn void util_internal_error(const char *file, int line, const char *fmt, ...) KILN_PRINTF(3, 4);
#define KILN_ASSERT(cond) ((cond) ? (void)0 : util_internal_error(__FILE__, __LINE__, "assertion failed: %s", #cond))
/* KILN_ASSERT_MSG(cond, "fmt", ...): the same with a message saying what went wrong. */
#define KILN_ASSERT_MSG(cond, ...) ((cond) ? (void)0 : util_internal_error(__FILE__, __LINE__, __VA_ARGS__))
#define KILN_UNREACHABLE() util_internal_error(__FILE__, __LINE__, "unreachable code reached")

/* Allocation that never returns NULL: out of memory exits with a message, since no caller
 * could do anything better and silently continuing would corrupt output. */
void *xmalloc(size_t n);
void *xcalloc(size_t n, size_t size);
void *xrealloc(void *p, size_t n);
char *xstrdup(const char *s);
char *xstrndup(const char *s, size_t n);
/* Grows *p (an array of elem-sized items with capacity *cap) to hold at least need items. */
void grow_array(void **p, size_t elem, int32_t *cap, int64_t need);
#define GROW(arr, cap, need) grow_array((void **)&(arr), sizeof(*(arr)), &(cap), (need))

/* A growable NUL-terminated byte buffer. */
typedef struct {
    char *data;
    size_t len, cap;
} StrBuf;
void sb_init(StrBuf *b);
void sb_free(StrBuf *b);
void sb_putc(StrBuf *b, char c);
void sb_puts(StrBuf *b, const char *s);
void sb_putn(StrBuf *b, const char *s, size_t n);
void sb_printf(StrBuf *b, const char *fmt, ...) KILN_PRINTF(2, 3);
void sb_vprintf(StrBuf *b, const char *fmt, va_list ap);
char *sb_take(StrBuf *b); /* returns the data (caller frees) and resets the buffer */

/* Reads a whole file. Returns NULL and fills err (a static-free message) on failure. */
char *util_read_file(const char *path, size_t *len, StrBuf *err);

/* Formats a double so that it reads back to the same value, shortest form first. */
void util_format_double(char *out, size_t outsz, double v);

/* Levenshtein distance, capped: used for "did you mean" suggestions. */
int util_edit_distance(const char *a, const char *b);
/* The same, ignoring ASCII case: 0 means the names differ only in case. */
int util_edit_distance_nocase(const char *a, const char *b);
/* A size in bytes as people write it: "1.5GiB", "800MiB", "512M" (binary: K, M, G, T and
 * KiB ... TiB), "2GB" (decimal: KB, MB, GB, TB), "4096" or "4096B". False unless the
 * whole string is one such size, positive and below 2^62. */
bool util_parse_size(const char *s, int64_t *bytes);

/* ---- source locations and diagnostics ---- */
typedef struct {
    uint16_t file; /* index into the Diag's source table */
    uint32_t line; /* 1-based; 0 = unknown */
    uint32_t col;  /* 1-based, in bytes */
} Loc;

typedef struct {
    char *path;
    char *text;
    size_t len;
} DiagSource;

typedef enum { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } DiagLevel;

typedef struct {
    DiagSource *sources;
    int32_t nsources, sources_cap;
    StrBuf out;      /* everything reported, in order */
    FILE *echo;      /* when set, each diagnostic is also written here as it is reported */
    int nerrors;
    int max_errors;  /* after this many errors, further ones are counted but not printed */
    int suppressed;
} Diag;

void diag_init(Diag *d, FILE *echo);
void diag_free(Diag *d);
/* Registers a source text (copied) and returns its file index for Loc.file. */
uint16_t diag_add_source(Diag *d, const char *path, const char *text, size_t len);
const char *diag_source_path(const Diag *d, uint16_t file);
void diag_report(Diag *d, DiagLevel level, Loc loc, const char *fmt, ...) KILN_PRINTF(4, 5);
void diag_vreport(Diag *d, DiagLevel level, Loc loc, const char *fmt, va_list ap);
#define diag_error(d, loc, ...) diag_report((d), DIAG_ERROR, (loc), __VA_ARGS__)
#define diag_note(d, loc, ...) diag_report((d), DIAG_NOTE, (loc), __VA_ARGS__)
/* Writes the "N more errors not shown" line if any were suppressed. */
void diag_finish(Diag *d);

/* A string -> int32 hash map. Keys are not copied: they must outlive the map (they point
 * at names the caller owns). Used wherever a name is looked up among many, so that large
 * models stay linear time. */
typedef struct {
    const char **keys;
    int32_t *vals;
    uint32_t cap, n;
} StrMap;
void strmap_free(StrMap *m);
/* Value for key, or dflt. */
int32_t strmap_get(const StrMap *m, const char *key, int32_t dflt);
/* Sets key's value (replacing an existing one). */
void strmap_put(StrMap *m, const char *key, int32_t val);
/* Lists of words (a command line's arguments), malloc'd: append one, append each
 * white-space separated word of s (no shell quoting), free them all. */
void util_words_add(char ***v, int *n, const char *w);
void util_words_split(const char *s, char ***v, int *n);
void util_words_free(char **v, int n);
uint64_t util_hash_string(const char *s);

#endif
