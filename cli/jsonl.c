/* jsonl.c — the strict one-line JSON object reader of jsonl.h. Every read goes through
 * peek(), which checks the position against the length, so no input (truncated, binary,
 * NUL bytes, deep nesting) makes it read outside the line. */
#include "jsonl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../util/util.h"

#define MAX_DEPTH 64      /* nested arrays/objects skipped, at most this deep */
#define MAX_NUMBER 400    /* characters of one number */

typedef struct {
    const char *s;
    size_t len, pos;
    char *msg;
    size_t msgsize;
    int col;
} Parser;

/* The byte at pos + k, or -1 past the end. */
static int peek(const Parser *p, size_t k)
{
    return p->pos + k < p->len ? (unsigned char)p->s[p->pos + k] : -1;
}

static int fail(Parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->msg, p->msgsize, fmt, ap);
    va_end(ap);
    p->col = (int)(p->pos < (size_t)1 << 30 ? p->pos + 1 : (size_t)1 << 30);
    return -1;
}

/* What the byte at pos is, for messages. */
static const char *found(const Parser *p, char *buf, size_t n)
{
    int c = peek(p, 0);
    if (c < 0) return "the end of the line";
    if (c >= 0x21 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static void skip_space(Parser *p)
{
    int c;
    while ((c = peek(p, 0)) == ' ' || c == '\t' || c == '\r') p->pos++;
}

static int hex4(Parser *p, unsigned *out)
{
    unsigned v = 0;
    *out = 0; /* set on failure too: GCC at -O3 cannot tell that fail() returns nonzero */
    for (int k = 0; k < 4; k++) {
        int c = peek(p, 0);
        unsigned d;
        if (c >= '0' && c <= '9') d = (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') d = (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') d = (unsigned)(c - 'A' + 10);
        else return fail(p, "\\u needs four hexadecimal digits");
        v = v * 16 + d;
        p->pos++;
    }
    *out = v;
    return 0;
}

static void put_utf8(StrBuf *b, unsigned cp)
{
    if (cp < 0x80) sb_putc(b, (char)cp);
    else if (cp < 0x800) {
        sb_putc(b, (char)(0xc0 | cp >> 6));
        sb_putc(b, (char)(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
        sb_putc(b, (char)(0xe0 | cp >> 12));
        sb_putc(b, (char)(0x80 | (cp >> 6 & 0x3f)));
        sb_putc(b, (char)(0x80 | (cp & 0x3f)));
    } else {
        sb_putc(b, (char)(0xf0 | cp >> 18));
        sb_putc(b, (char)(0x80 | (cp >> 12 & 0x3f)));
        sb_putc(b, (char)(0x80 | (cp >> 6 & 0x3f)));
        sb_putc(b, (char)(0x80 | (cp & 0x3f)));
    }
}

/* A string at pos (its opening quote), decoded into out when out is not NULL. */
static int parse_string(Parser *p, StrBuf *out)
{
    p->pos++; /* " */
    for (;;) {
        int c = peek(p, 0);
        if (c < 0) return fail(p, "a string is not closed (no '\"' before the end of the line)");
        if (c == '"') {
            p->pos++;
            return 0;
        }
        if (c < 0x20) return fail(p, "control character 0x%02x in a string (JSON needs it escaped)", c);
        if (c != '\\') {
            if (out) sb_putc(out, (char)c);
            p->pos++;
            continue;
        }
        int e = peek(p, 1);
        p->pos += 2;
        const char *simple = e >= 0 ? strchr("\"\\/bfnrt", e) : NULL;
        if (e > 0 && simple) {
            static const char decoded[] = "\"\\/\b\f\n\r\t";
            if (out) sb_putc(out, decoded[simple - "\"\\/bfnrt"]);
            continue;
        }
        if (e != 'u') {
            p->pos -= 1;
            return fail(p, "unknown escape '\\%c' in a string", e >= 0x21 && e < 0x7f ? e : '?');
        }
        unsigned cp;
        if (hex4(p, &cp)) return -1;
        if (cp >= 0xd800 && cp < 0xdc00) { /* a high surrogate: its low half must follow */
            unsigned lo;
            if (peek(p, 0) != '\\' || peek(p, 1) != 'u') return fail(p, "\\u%04X (a UTF-16 high surrogate) is not followed by its low half", cp);
            p->pos += 2;
            if (hex4(p, &lo)) return -1;
            if (lo < 0xdc00 || lo >= 0xe000) return fail(p, "\\u%04X is not the low half of a UTF-16 surrogate pair", lo);
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
        } else if (cp >= 0xdc00 && cp < 0xe000) {
            return fail(p, "\\u%04X (a UTF-16 low surrogate) without its high half", cp);
        }
        if (out) put_utf8(out, cp);
    }
}

/* Case-insensitive match of word at pos + k, not followed by a letter or digit. */
static bool word_at(const Parser *p, size_t k, const char *w, bool any_case)
{
    size_t n = strlen(w);
    for (size_t i = 0; i < n; i++) {
        int c = peek(p, k + i);
        if (c < 0) return false;
        if (any_case ? (c | 0x20) != w[i] : c != w[i]) return false;
    }
    int next = peek(p, k + n);
    return !(next >= 0 && (next == '_' || (next >= '0' && next <= '9') || ((next | 0x20) >= 'a' && (next | 0x20) <= 'z')));
}

static bool is_digit(int c) { return c >= '0' && c <= '9'; }

/* A number at pos, JSON's grammar (or nan, inf, -inf, -nan, infinity). */
static int parse_number(Parser *p, double *out)
{
    size_t start = p->pos;
    bool neg = peek(p, 0) == '-';
    size_t k = neg ? 1 : 0;
    static const char *const words[] = {"infinity", "inf", "nan"};
    for (int w = 0; w < 3; w++)
        if (word_at(p, k, words[w], true)) {
            p->pos += k + strlen(words[w]);
            *out = w < 2 ? (neg ? -INFINITY : INFINITY) : NAN;
            return 0;
        }
    if (!is_digit(peek(p, k))) return fail(p, "expected a digit after '-'");
    if (peek(p, k) == '0' && is_digit(peek(p, k + 1))) {
        p->pos += k + 1;
        return fail(p, "a number has a leading zero (JSON does not allow it)");
    }
    while (is_digit(peek(p, k))) k++;
    if (peek(p, k) == '.') {
        k++;
        if (!is_digit(peek(p, k))) {
            p->pos += k;
            return fail(p, "expected a digit after the decimal point");
        }
        while (is_digit(peek(p, k))) k++;
    }
    if (peek(p, k) == 'e' || peek(p, k) == 'E') {
        k++;
        if (peek(p, k) == '+' || peek(p, k) == '-') k++;
        if (!is_digit(peek(p, k))) {
            p->pos += k;
            return fail(p, "expected a digit in the exponent");
        }
        while (is_digit(peek(p, k))) k++;
    }
    if (k > MAX_NUMBER) return fail(p, "a number of %zu characters (at most %d)", k, MAX_NUMBER);
    char buf[MAX_NUMBER + 1];
    memcpy(buf, p->s + start, k);
    buf[k] = 0;
    *out = strtod(buf, NULL);
    p->pos += k;
    return 0;
}

static int parse_value(Parser *p, int depth, JsonlKind *kind, double *num);

/* An array or object at pos, checked and skipped. */
static int skip_nested(Parser *p, int depth)
{
    if (depth >= MAX_DEPTH) return fail(p, "values nested more than %d deep", MAX_DEPTH);
    bool object = peek(p, 0) == '{';
    int close = object ? '}' : ']';
    p->pos++;
    skip_space(p);
    if (peek(p, 0) == close) {
        p->pos++;
        return 0;
    }
    char buf[16];
    for (;;) {
        JsonlKind kind;
        double num;
        if (object) {
            if (peek(p, 0) != '"') return fail(p, "expected a key (a string), found %s", found(p, buf, sizeof buf));
            if (parse_string(p, NULL)) return -1;
            skip_space(p);
            if (peek(p, 0) != ':') return fail(p, "expected ':' after a key, found %s", found(p, buf, sizeof buf));
            p->pos++;
            skip_space(p);
        }
        if (parse_value(p, depth + 1, &kind, &num)) return -1;
        skip_space(p);
        int c = peek(p, 0);
        if (c == close) {
            p->pos++;
            return 0;
        }
        if (c != ',') return fail(p, "expected ',' or '%c', found %s", close, found(p, buf, sizeof buf));
        p->pos++;
        skip_space(p);
    }
}

static int parse_value(Parser *p, int depth, JsonlKind *kind, double *num)
{
    int c = peek(p, 0);
    char buf[16];
    *num = 0;
    if (c == '"') {
        *kind = JSONL_STRING;
        return parse_string(p, NULL);
    }
    if (c == '{' || c == '[') {
        *kind = JSONL_NESTED;
        return skip_nested(p, depth);
    }
    if (word_at(p, 0, "true", false) || word_at(p, 0, "false", false)) {
        *kind = JSONL_BOOL;
        *num = c == 't';
        p->pos += c == 't' ? 4 : 5;
        return 0;
    }
    if (word_at(p, 0, "null", false)) {
        *kind = JSONL_NULL;
        p->pos += 4;
        return 0;
    }
    if (c == '-' || is_digit(c) || c == 'n' || c == 'N' || c == 'i' || c == 'I') {
        *kind = JSONL_NUMBER;
        size_t at = p->pos;
        if (parse_number(p, num) == 0) return 0;
        if (c == '-' || is_digit(c)) return -1;
        p->pos = at; /* a word that is no number: say so below */
    }
    return fail(p, "expected a value (a number, a string, true, false or null), found %s", found(p, buf, sizeof buf));
}

int jsonl_parse(const char *s, size_t len, JsonlObject *out, int *col, char *msg, size_t msgsize)
{
    Parser p = {.s = s, .len = len, .msg = msg, .msgsize = msgsize};
    char buf[16];
    jsonl_free(out);
    StrBuf key;
    sb_init(&key);
    int rc = -1;
    /* a UTF-8 byte order mark */
    if (peek(&p, 0) == 0xef && peek(&p, 1) == 0xbb && peek(&p, 2) == 0xbf) p.pos += 3;
    skip_space(&p);
    if (peek(&p, 0) != '{') {
        fail(&p, "expected a JSON object ('{'), found %s", found(&p, buf, sizeof buf));
        goto done;
    }
    p.pos++;
    skip_space(&p);
    if (peek(&p, 0) == '}') p.pos++;
    else
        for (;;) {
            if (peek(&p, 0) != '"') {
                fail(&p, "expected a key (a string), found %s", found(&p, buf, sizeof buf));
                goto done;
            }
            key.len = 0;
            if (key.data) key.data[0] = 0;
            if (parse_string(&p, &key)) goto done;
            skip_space(&p);
            if (peek(&p, 0) != ':') {
                fail(&p, "expected ':' after a key, found %s", found(&p, buf, sizeof buf));
                goto done;
            }
            p.pos++;
            skip_space(&p);
            JsonlField f = {0};
            if (parse_value(&p, 0, &f.kind, &f.num)) goto done;
            if (out->n == out->cap) {
                out->cap = out->cap ? out->cap * 2 : 8;
                out->fields = xrealloc(out->fields, (size_t)out->cap * sizeof *out->fields);
            }
            f.key = xstrdup(key.data ? key.data : "");
            out->fields[out->n++] = f;
            skip_space(&p);
            int c = peek(&p, 0);
            if (c == '}') {
                p.pos++;
                break;
            }
            if (c != ',') {
                fail(&p, "expected ',' or '}', found %s", found(&p, buf, sizeof buf));
                goto done;
            }
            p.pos++;
            skip_space(&p);
        }
    skip_space(&p);
    if (peek(&p, 0) >= 0) {
        fail(&p, "text after the object: %s", found(&p, buf, sizeof buf));
        goto done;
    }
    rc = 0;
done:
    sb_free(&key);
    if (rc) {
        *col = p.col;
        jsonl_free(out);
    }
    return rc;
}

bool jsonl_number(const JsonlObject *o, const char *key, double *out)
{
    for (int i = 0; i < o->n; i++)
        if (!strcmp(o->fields[i].key, key)) {
            if (o->fields[i].kind != JSONL_NUMBER) return false;
            *out = o->fields[i].num;
            return true;
        }
    return false;
}

void jsonl_free(JsonlObject *o)
{
    for (int i = 0; i < o->n; i++) free(o->fields[i].key);
    free(o->fields);
    o->fields = NULL;
    o->n = o->cap = 0;
}
