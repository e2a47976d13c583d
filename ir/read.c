/* read.c — parses the text form written by print.c (grammar in docs/ir.md) back into a
 * Graph.
 *
 * The text form lets tests and users write graphs by hand and lets every pass be tested on
 * its own, so the reader treats its input as untrusted: every byte is checked against the
 * end of its line, every number against overflow, every reference against what has been
 * defined so far, and nothing is built that the verifier has not accepted. It stops at the
 * first syntax error (later lines would only produce follow-on noise), reports in the
 * usual `path:line:col: error:` form with the offending token, and frees everything. */
#include "ir.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Diag *d;
    uint16_t file;
    const char *text, *text_end;
    const char *line, *end, *p; /* the current line [line, end) and the cursor */
    uint32_t lineno;
    bool failed;
    Graph *g;
    Loc *node_loc; /* where each node, output and symbol was defined, for verifier messages */
    int32_t node_loc_cap;
    Loc *out_loc;
    int32_t out_loc_cap;
    Loc sym_loc[IR_MAX_SYMS];
    NodeId *ops;
    int32_t ops_cap;
    int64_t *list; /* the integer list being parsed */
    int32_t list_cap, nlist;
    int64_t *attrs;
    int32_t attrs_cap, nattrs;
    StrBuf s1, s2; /* parsed strings */
} Parser;

/* ---- errors ---- */

static Loc loc_at(const Parser *P, const char *at)
{
    Loc l = {P->file, P->lineno, (uint32_t)(at - P->line) + 1};
    return l;
}

static void error_at(Parser *P, const char *at, const char *fmt, ...) KILN_PRINTF(3, 4);
static void error_at(Parser *P, const char *at, const char *fmt, ...)
{
    if (P->failed) return; /* only the first error: the rest would be follow-on noise */
    P->failed = true;
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(P->d, DIAG_ERROR, loc_at(P, at), fmt, ap);
    va_end(ap);
}

static bool is_alpha(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_'; }
static bool is_digit(char c) { return c >= '0' && c <= '9'; }
static bool is_word_char(char c) { return is_alpha(c) || is_digit(c) || c == '.'; }
static bool is_number_char(char c) { return is_alpha(c) || is_digit(c) || c == '.' || c == '+' || c == '-'; }

/* Describes the token at `at` for "found ..." in messages, quoting it safely. */
static const char *describe(const Parser *P, const char *at, char *buf, size_t bufsz)
{
    if (at >= P->end) return "end of line";
    const char *e = at + 1;
    if (*at == '"') {
        while (e < P->end && *e != '"') e += (*e == '\\' && e + 1 < P->end) ? 2 : 1;
        if (e < P->end) e++;
    } else if (is_number_char(*at) || *at == '%') {
        while (e < P->end && is_number_char(*e)) e++;
    }
    size_t o = 0;
    buf[o++] = '\'';
    for (const char *c = at; c < e && o + 8 < bufsz; c++) {
        if (c - at >= 24) { memcpy(buf + o, "...", 3); o += 3; break; }
        unsigned char u = (unsigned char)*c;
        if (u >= 32 && u < 127) buf[o++] = (char)u;
        else o += (size_t)snprintf(buf + o, bufsz - o, "\\x%02x", u);
    }
    buf[o++] = '\'';
    buf[o] = 0;
    return buf;
}

static void expected(Parser *P, const char *what)
{
    char buf[96];
    error_at(P, P->p, "expected %s, found %s", what, describe(P, P->p, buf, sizeof buf));
}

/* The closest name within edit distance 2, for "did you mean"; NULL when none is close. */
static const char *suggest(const char *word, const char *const *names, int n)
{
    const char *best = NULL;
    int bestd = 3;
    for (int i = 0; i < n; i++) {
        int dist = util_edit_distance(word, names[i]);
        if (dist < bestd && dist < (int)strlen(word)) best = names[i], bestd = dist;
    }
    return best;
}

static void unknown(Parser *P, const char *at, const char *what, const char *word, const char *const *names, int n)
{
    const char *s = suggest(word, names, n);
    if (s) error_at(P, at, "unknown %s '%s' (did you mean '%s'?)", what, word, s);
    else error_at(P, at, "unknown %s '%s'", what, word);
}

/* ---- lexical helpers; all bounded by the end of the line ---- */

static void skip_ws(Parser *P)
{
    while (P->p < P->end && (*P->p == ' ' || *P->p == '\t')) P->p++;
}

/* Consumes the literal s (after blanks) when it is next. */
static bool lit(Parser *P, const char *s)
{
    skip_ws(P);
    size_t n = strlen(s);
    if ((size_t)(P->end - P->p) < n || memcmp(P->p, s, n)) return false;
    P->p += n;
    return true;
}

static bool expect(Parser *P, const char *s, const char *what)
{
    if (lit(P, s)) return true;
    expected(P, what);
    return false;
}

/* Consumes keyword w when it is next as a whole word. */
static bool keyword(Parser *P, const char *w)
{
    skip_ws(P);
    size_t n = strlen(w);
    if ((size_t)(P->end - P->p) < n || memcmp(P->p, w, n) || (P->p + n < P->end && is_word_char(P->p[n])))
        return false;
    P->p += n;
    return true;
}

/* Copies the bare word [A-Za-z_][A-Za-z0-9_.]* at the cursor into buf (truncated with
 * "..." past 64 bytes, so that messages stay short); false when there is none. */
static bool bare_word(Parser *P, char *buf, size_t bufsz, const char **start)
{
    skip_ws(P);
    *start = P->p;
    if (P->p >= P->end || !is_alpha(*P->p)) return false;
    const char *e = P->p;
    while (e < P->end && is_word_char(*e)) e++;
    size_t n = (size_t)(e - P->p);
    if (n + 1 > bufsz) {
        memcpy(buf, P->p, bufsz - 4);
        memcpy(buf + bufsz - 4, "...", 4);
    } else {
        memcpy(buf, P->p, n);
        buf[n] = 0;
    }
    P->p = e;
    return true;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A quoted string with \" \\ \xNN escapes, at the cursor. */
static bool string(Parser *P, StrBuf *out)
{
    const char *open = P->p;
    out->len = 0;
    sb_putn(out, "", 0);
    P->p++;
    while (P->p < P->end && *P->p != '"') {
        unsigned char c = (unsigned char)*P->p;
        if (c == '\\') {
            char e = P->p + 1 < P->end ? P->p[1] : 0;
            if (e == '"' || e == '\\') {
                sb_putc(out, e);
                P->p += 2;
                continue;
            }
            int hi = P->p + 2 < P->end ? hexval(P->p[2]) : -1, lo = P->p + 3 < P->end ? hexval(P->p[3]) : -1;
            if (e != 'x' || hi < 0 || lo < 0) {
                error_at(P, P->p, "invalid escape in string (use \\\", \\\\ or \\xNN)");
                return false;
            }
            if (hi == 0 && lo == 0) {
                error_at(P, P->p, "a string cannot contain a NUL byte");
                return false;
            }
            sb_putc(out, (char)(hi * 16 + lo));
            P->p += 4;
            continue;
        }
        if (c < 32) {
            error_at(P, P->p, "control byte 0x%02x in string (write it as \\x%02x)", c, c);
            return false;
        }
        sb_putc(out, (char)c);
        P->p++;
    }
    if (P->p >= P->end) {
        error_at(P, open, "unterminated string");
        return false;
    }
    P->p++;
    return true;
}

/* A name: a bare word or a quoted string. */
static bool name(Parser *P, StrBuf *out, const char *what)
{
    skip_ws(P);
    if (P->p < P->end && *P->p == '"') return string(P, out);
    if (P->p < P->end && is_alpha(*P->p)) {
        const char *e = P->p;
        while (e < P->end && is_word_char(*e)) e++;
        out->len = 0;
        sb_putn(out, P->p, (size_t)(e - P->p));
        P->p = e;
        return true;
    }
    expected(P, what);
    return false;
}

static bool integer(Parser *P, int64_t *out, const char *what)
{
    skip_ws(P);
    const char *s = P->p;
    bool neg = P->p < P->end && *P->p == '-';
    const char *q = P->p + neg;
    if (q >= P->end || !is_digit(*q)) {
        expected(P, what);
        return false;
    }
    uint64_t v = 0, limit = neg ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    for (; q < P->end && is_digit(*q); q++) {
        unsigned dgt = (unsigned)(*q - '0');
        if (v > (limit - dgt) / 10) {
            error_at(P, s, "integer out of range");
            return false;
        }
        v = v * 10 + dgt;
    }
    if (q < P->end && is_word_char(*q)) {
        P->p = s;
        expected(P, what);
        return false;
    }
    P->p = q;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return true;
}

static bool integer_in(Parser *P, int64_t *out, int64_t lo, int64_t hi, const char *what)
{
    skip_ws(P);
    const char *s = P->p;
    if (!integer(P, out, what)) return false;
    if (*out < lo || *out > hi) {
        error_at(P, s, "%s %lld is out of range", what, (long long)*out);
        return false;
    }
    return true;
}

static bool number(Parser *P, double *out, const char *what)
{
    skip_ws(P);
    const char *e = P->p;
    while (e < P->end && is_number_char(*e)) e++;
    size_t n = (size_t)(e - P->p);
    char buf[72];
    if (n == 0 || n >= sizeof buf) {
        expected(P, what);
        return false;
    }
    memcpy(buf, P->p, n);
    buf[n] = 0;
    char *stop;
    errno = 0;
    double v = strtod(buf, &stop);
    /* Overflow to inf is an error; underflow to a subnormal or zero is what was written. */
    if (*stop || stop == buf || (errno == ERANGE && (v > 1 || v < -1))) {
        expected(P, what);
        return false;
    }
    *out = v;
    P->p = e;
    return true;
}

/* '[' int, ... ']' into P->list. */
static bool int_list(Parser *P, const char *what)
{
    P->nlist = 0;
    if (!expect(P, "[", what)) return false;
    if (lit(P, "]")) return true;
    for (;;) {
        int64_t v;
        if (!integer(P, &v, "an integer")) return false;
        GROW(P->list, P->list_cap, (int64_t)P->nlist + 1);
        P->list[P->nlist++] = v;
        if (lit(P, "]")) return true;
        if (!expect(P, ",", "',' or ']' in the list")) return false;
    }
}

static void push_attr(Parser *P, int64_t v)
{
    GROW(P->attrs, P->attrs_cap, (int64_t)P->nattrs + 1);
    P->attrs[P->nattrs++] = v;
}

static bool keyed_int(Parser *P, const char *key, int64_t *v)
{
    char what[48];
    snprintf(what, sizeof what, "'%s'", key);
    if (!expect(P, key, what)) return false;
    return integer(P, v, "an integer");
}

static bool keyed_list(Parser *P, const char *key, int want)
{
    char what[48];
    snprintf(what, sizeof what, "'%s[...]'", key);
    if (!expect(P, key, what)) return false;
    skip_ws(P);
    const char *at = P->p;
    if (!int_list(P, "'['")) return false;
    if (want >= 0 && P->nlist != want) {
        error_at(P, at, "%s needs %d values, got %d", key, want, P->nlist);
        return false;
    }
    return true;
}

static bool at_line_end(Parser *P)
{
    skip_ws(P);
    return P->p >= P->end;
}

static bool expect_eol(Parser *P)
{
    if (at_line_end(P)) return true;
    expected(P, "end of line");
    return false;
}

/* ---- shapes and locations ---- */

static bool dim(Parser *P, Dim *out)
{
    skip_ws(P);
    const char *start = P->p;
    Dim r = ir_dim_const(1);
    for (int nf = 0;; nf++) {
        skip_ws(P);
        const char *at = P->p;
        Dim f;
        if (P->p < P->end && (is_digit(*P->p) || *P->p == '-')) {
            int64_t v;
            if (!integer(P, &v, "a dim")) return false;
            skip_ws(P);
            bool alone = nf == 0 && !(P->p < P->end && *P->p == '*');
            if (alone) { *out = ir_dim_const(v); return true; } /* may be invalid: the verifier says why */
            if (v < 0) { error_at(P, at, "negative factor %lld in a dim", (long long)v); return false; }
            f = ir_dim_const(v);
        } else {
            if (!name(P, &P->s2, "a dim (an integer or a symbol)")) return false;
            int s = ir_find_symbol(P->g, P->s2.data);
            if (s < 0) {
                error_at(P, at, "unknown symbol '%s' in shape (declare it with 'sym %s <= N')", P->s2.data, P->s2.data);
                return false;
            }
            f = ir_dim_sym(s);
        }
        if (!ir_dim_mul(r, f, &r)) {
            error_at(P, start, "dim is too large or has more than %d symbols", IR_MAX_DIM_SYMS);
            return false;
        }
        if (!lit(P, "*")) break;
    }
    *out = r;
    return true;
}

static bool type(Parser *P, uint8_t *dtype, Shape *shape)
{
    char buf[72];
    const char *at;
    skip_ws(P);
    at = P->p;
    const char *e = P->p;
    while (e < P->end && (is_alpha(*e) || is_digit(*e))) e++;
    if (e == P->p) {
        expected(P, "a dtype");
        return false;
    }
    size_t n = (size_t)(e - P->p);
    int t = ir_dtype_from_name(P->p, n);
    if (t < 0) {
        if (n > 64) n = 64;
        memcpy(buf, P->p, n);
        buf[n] = 0;
        const char *names[DT_COUNT];
        for (int i = 0; i < DT_COUNT; i++) names[i] = ir_dtype_name((DType)i);
        unknown(P, at, "dtype", buf, names, DT_COUNT);
        return false;
    }
    P->p = e;
    *dtype = (uint8_t)t;
    memset(shape, 0, sizeof *shape);
    if (P->p >= P->end || *P->p != '[') {
        expected(P, "'[' after the dtype");
        return false;
    }
    P->p++;
    if (lit(P, "]")) return true;
    for (;;) {
        skip_ws(P);
        const char *dat = P->p;
        if (shape->rank >= IR_MAX_RANK) {
            error_at(P, dat, "more than %d dims", IR_MAX_RANK);
            return false;
        }
        if (!dim(P, &shape->d[shape->rank])) return false;
        shape->rank++;
        if (lit(P, "]")) return true;
        if (!expect(P, ",", "',' or ']' in the shape")) return false;
    }
}

static const char *bare_path_end(const char *p, const char *end)
{
    while (p < end && (is_alpha(*p) || is_digit(*p) || strchr("./+-~,=", *p) != NULL) && *p) p++;
    return p;
}

static bool location(Parser *P, Loc *loc)
{
    const char *at = P->p;
    int64_t v;
    if (P->p < P->end && *P->p == '#') {
        P->p++;
        if (!integer_in(P, &v, 0, UINT16_MAX, "file index")) return false;
        loc->file = (uint16_t)v;
    } else {
        if (P->p < P->end && *P->p == '"') {
            if (!string(P, &P->s2)) return false;
        } else {
            const char *e = bare_path_end(P->p, P->end);
            if (e == P->p) {
                expected(P, "a file path after '@'");
                return false;
            }
            P->s2.len = 0;
            sb_putn(&P->s2, P->p, (size_t)(e - P->p));
            P->p = e;
        }
        int f = -1;
        for (int i = 0; i < P->g->nfiles && f < 0; i++)
            if (!strcmp(P->g->files[i], P->s2.data)) f = i;
        if (f < 0) {
            error_at(P, at, "unknown file '%s' in location (declare it with a 'file' line)", P->s2.data);
            return false;
        }
        loc->file = (uint16_t)f;
    }
    if (P->p >= P->end || *P->p != ':') {
        expected(P, "':LINE:COL' after the file");
        return false;
    }
    P->p++;
    if (!integer_in(P, &v, 1, UINT32_MAX, "line number")) return false;
    loc->line = (uint32_t)v;
    if (P->p >= P->end || *P->p != ':') {
        expected(P, "':COL' after the line");
        return false;
    }
    P->p++;
    if (!integer_in(P, &v, 0, UINT32_MAX, "column")) return false;
    loc->col = (uint32_t)v;
    return true;
}

/* ---- lines ---- */

static bool ref(Parser *P, NodeId limit, NodeId cur, NodeId *out)
{
    skip_ws(P);
    const char *at = P->p;
    if (P->p >= P->end || *P->p != '%') {
        expected(P, "a node reference like %3");
        return false;
    }
    P->p++;
    int64_t v;
    if (P->p >= P->end || !is_digit(*P->p)) {
        P->p = at;
        expected(P, "a node reference like %3");
        return false;
    }
    if (!integer(P, &v, "a node number")) return false;
    if (v >= limit) {
        if (cur >= 0) error_at(P, at, "operand %%%lld is not defined before node %%%d", (long long)v, cur);
        else error_at(P, at, "output refers to %%%lld, which is not defined", (long long)v);
        return false;
    }
    *out = (NodeId)v;
    return true;
}

static bool param_attrs(Parser *P, double *fattr)
{
    if (!expect(P, "init=", "'init=' for param")) return false;
    char buf[72];
    const char *at;
    if (!bare_word(P, buf, sizeof buf, &at)) {
        expected(P, "an init kind");
        return false;
    }
    int k = ir_init_from_name(buf, strlen(buf));
    if (k < 0) {
        const char *names[INIT_COUNT];
        for (int i = 0; i < INIT_COUNT; i++) names[i] = ir_init_name((InitKind)i);
        unknown(P, at, "init kind", buf, names, INIT_COUNT);
        return false;
    }
    int nargs = ir_init_nargs((InitKind)k);
    if (nargs > 0 || (P->p < P->end && *P->p == '(')) {
        if (P->p >= P->end || *P->p != '(') {
            expected(P, "'(' and the init arguments");
            return false;
        }
        P->p++;
        int got = 0;
        if (!lit(P, ")")) {
            for (;;) {
                skip_ws(P);
                const char *aat = P->p;
                double v;
                if (!number(P, &v, "a number")) return false;
                if (got >= nargs) {
                    error_at(P, aat, "init '%s' takes %d argument%s", buf, nargs, nargs == 1 ? "" : "s");
                    return false;
                }
                fattr[got++] = v;
                if (lit(P, ")")) break;
                if (!expect(P, ",", "',' or ')'")) return false;
            }
        }
        if (got != nargs) {
            error_at(P, at, "init '%s' takes %d argument%s, got %d", buf, nargs, nargs == 1 ? "" : "s", got);
            return false;
        }
    }
    push_attr(P, k);
    if (keyword(P, "trainable")) push_attr(P, 1);
    else if (keyword(P, "buffer")) push_attr(P, 0);
    else {
        expected(P, "'trainable' or 'buffer'");
        return false;
    }
    if (lit(P, "zero_row=")) {
        int64_t row;
        if (!integer(P, &row, "an integer")) return false;
        push_attr(P, row);
    }
    return true;
}

/* The attributes of op in its layout's syntax, or the raw form attrs=[...]. */
static bool node_attrs(Parser *P, Op op, double *fattr)
{
    const OpInfo *info = &ir_op_info[op];
    P->nattrs = 0;
    int64_t v;
    skip_ws(P);
    if (lit(P, "attrs=")) {
        if (!int_list(P, "'['")) return false;
        for (int i = 0; i < P->nlist; i++) push_attr(P, P->list[i]);
        return true;
    }
    switch (info->attrs) {
    case ATTRS_NONE: case ATTRS_INPUT: return true;
    case ATTRS_PARAM: return param_attrs(P, fattr);
    case ATTRS_CONST: return number(P, &fattr[0], "the constant's value");
    case ATTRS_AXIS:
        if (!keyed_int(P, "axis=", &v)) return false;
        push_attr(P, v);
        return true;
    case ATTRS_STREAM:
        if (!keyed_int(P, "stream=", &v)) return false;
        push_attr(P, v);
        return true;
    case ATTRS_LIMIT:
        if (!keyed_int(P, "limit=", &v)) return false;
        push_attr(P, v);
        return true;
    case ATTRS_AXES: {
        if (!expect(P, "axes=", "'axes=[...]'")) return false;
        skip_ws(P);
        const char *at = P->p;
        if (!int_list(P, "'['")) return false;
        uint64_t mask = 0;
        for (int i = 0; i < P->nlist; i++) {
            if (P->list[i] < 0 || P->list[i] > 63 || (mask >> P->list[i] & 1)) {
                error_at(P, at, "axis %lld is out of range or listed twice", (long long)P->list[i]);
                return false;
            }
            mask |= UINT64_C(1) << P->list[i];
        }
        push_attr(P, (int64_t)mask);
        if (lit(P, "first=")) { /* reduce_max's tie rule; verify checks the value */
            if (!integer(P, &v, "an integer")) return false;
            push_attr(P, v);
        } else if (keyword(P, "first")) {
            push_attr(P, 1);
        }
        return true;
    }
    case ATTRS_PERM:
        if (!keyed_list(P, "perm=", -1)) return false;
        for (int i = 0; i < P->nlist; i++) push_attr(P, P->list[i]);
        return true;
    case ATTRS_SLICE:
        if (!keyed_int(P, "axis=", &v)) return false;
        push_attr(P, v);
        if (!keyed_int(P, "start=", &v)) return false;
        push_attr(P, v);
        if (!expect(P, "end=", "'end='")) return false;
        if (keyword(P, "end")) v = IR_SLICE_END;
        else if (!integer(P, &v, "an integer or 'end'")) return false;
        push_attr(P, v);
        if (!keyed_int(P, "step=", &v)) return false;
        push_attr(P, v);
        return true;
    case ATTRS_PAD: {
        if (!keyed_list(P, "lo=", -1)) return false;
        for (int i = 0; i < P->nlist; i++) push_attr(P, P->list[i]);
        int nlo = P->nlist;
        if (!keyed_list(P, "hi=", nlo)) return false;
        for (int i = 0; i < P->nlist; i++) push_attr(P, P->list[i]);
        if (!expect(P, "value=", "'value='")) return false;
        return number(P, &fattr[0], "the padding value");
    }
    case ATTRS_ATTENTION:
    case ATTRS_ATTENTION_GRAD: {
        if (!expect(P, "mask=", "'mask='")) return false;
        const char *at = P->p;
        int m = -1;
        for (int k = 0; k < ATTN_MASK_COUNT && m < 0; k++)
            if (keyword(P, ir_attn_mask_name(k))) m = k;
        if (m < 0) {
            error_at(P, at, "expected a mask kind (none, causal, keep, drop or add)");
            return false;
        }
        push_attr(P, m);
        skip_ws(P);
        if (!expect(P, "scale=", "'scale='") || !number(P, &fattr[0], "the scale")) return false;
        skip_ws(P);
        if (!expect(P, "dropout=", "'dropout='") || !number(P, &fattr[1], "the dropout rate")) return false;
        if (!keyed_int(P, "stream=", &v)) return false;
        push_attr(P, v);
        if (info->attrs == ATTRS_ATTENTION_GRAD) {
            skip_ws(P);
            if (!expect(P, "grad=", "'grad='")) return false;
            at = P->p;
            int w = keyword(P, "q") ? 0 : keyword(P, "k") ? 1 : keyword(P, "v") ? 2 : keyword(P, "mask") ? 3 : -1;
            if (w < 0) {
                error_at(P, at, "expected the operand the gradient is of (q, k, v or mask)");
                return false;
            }
            push_attr(P, w);
        }
        return true;
    }
    case ATTRS_WINDOW: {
        static const char *const keys[3] = {"kernel=", "stride=", "dilation="};
        for (int k = 0; k < 3; k++) {
            if (!keyed_list(P, keys[k], 2)) return false;
            push_attr(P, P->list[0]);
            push_attr(P, P->list[1]);
        }
        return true;
    }
    }
    return true;
}

static void node_line(Parser *P)
{
    Graph *g = P->g;
    const char *at = P->p;
    NodeId id;
    P->p++;
    int64_t v;
    if (P->p >= P->end || !is_digit(*P->p) || !integer(P, &v, "a node number")) {
        if (!P->failed) {
            P->p = at;
            expected(P, "a node definition like %3 = ...");
        }
        return;
    }
    if (v != g->nnodes) {
        error_at(P, at, "expected node %%%d here (nodes are numbered in order), found %%%lld", g->nnodes, (long long)v);
        return;
    }
    id = (NodeId)v;
    if (!expect(P, "=", "'=' after the node number")) return;

    char opname[72];
    const char *opat;
    skip_ws(P);
    opat = P->p;
    const char *e = P->p;
    while (e < P->end && (is_alpha(*e) || is_digit(*e))) e++;
    if (e == P->p) {
        expected(P, "an op name");
        return;
    }
    size_t n = (size_t)(e - P->p);
    int op = -1;
    for (int i = 0; i < OP_COUNT && op < 0; i++)
        if (strlen(ir_op_info[i].name) == n && !memcmp(ir_op_info[i].name, P->p, n)) op = i;
    if (op < 0) {
        if (n > 64) n = 64;
        memcpy(opname, P->p, n);
        opname[n] = 0;
        const char *names[OP_COUNT];
        for (int i = 0; i < OP_COUNT; i++) names[i] = ir_op_info[i].name;
        unknown(P, opat, "op", opname, names, OP_COUNT);
        return;
    }
    P->p = e;

    int32_t nops = 0;
    skip_ws(P);
    if (P->p < P->end && *P->p == '%') {
        for (;;) {
            NodeId x;
            if (!ref(P, id, id, &x)) return;
            GROW(P->ops, P->ops_cap, (int64_t)nops + 1);
            P->ops[nops++] = x;
            if (!lit(P, ",")) break;
        }
        skip_ws(P);
        if (P->p < P->end && *P->p == '%') {
            expected(P, "',' between operands");
            return;
        }
    }
    OpAttrs layout = ir_op_info[op].attrs;
    bool named_leaf = layout == ATTRS_INPUT || layout == ATTRS_PARAM;
    if (named_leaf && !name(P, &P->s1, op == OP_INPUT ? "the input's name" : "the param's name")) return;
    double fattr[2] = {0, 0};
    if (!node_attrs(P, (Op)op, fattr)) return;
    if (!expect(P, ":", "':' before the type")) return;
    uint8_t dtype;
    Shape shape;
    if (!type(P, &dtype, &shape)) return;

    bool has_name = named_leaf;
    skip_ws(P);
    if (P->p < P->end && *P->p == '"') {
        if (named_leaf) {
            error_at(P, P->p, "the name of %s %%%d goes right after the op", ir_op_info[op].name, id);
            return;
        }
        if (!string(P, &P->s1)) return;
        has_name = true;
    }
    int64_t ckpt = 0;
    if (lit(P, "ckpt=") && !integer_in(P, &ckpt, INT32_MIN, IR_CKPT_AUTO - 1, "checkpoint region")) return;
    if (lit(P, "block=")) {
        if (!integer_in(P, &ckpt, 1, INT32_MAX - IR_CKPT_AUTO, "module call (block)")) return;
        ckpt += IR_CKPT_AUTO;
    }
    const bool recomputed = lit(P, "recomputed");
    Loc loc = {0, 0, 0};
    skip_ws(P);
    if (P->p < P->end && *P->p == '@') {
        P->p++;
        if (!location(P, &loc)) return;
    }
    if (!expect_eol(P)) return;

    ir_add_node(g, (Op)op, (DType)dtype, &shape, P->ops, nops, P->attrs, P->nattrs, loc);
    Node *nd = &g->nodes[id];
    nd->fattr[0] = fattr[0];
    nd->fattr[1] = fattr[1];
    nd->ckpt = (int32_t)ckpt;
    if (recomputed) nd->flags |= NODE_RECOMPUTED;
    if (has_name) nd->name = ir_intern(g, P->s1.data);
    GROW(P->node_loc, P->node_loc_cap, (int64_t)id + 1);
    P->node_loc[id] = loc_at(P, at);
}

static void sym_line(Parser *P, const char *at)
{
    skip_ws(P);
    const char *nat = P->p;
    if (!name(P, &P->s1, "a symbol name")) return;
    if (ir_find_symbol(P->g, P->s1.data) >= 0) {
        error_at(P, nat, "symbol '%s' is declared twice", P->s1.data);
        return;
    }
    if (P->g->nsyms >= IR_MAX_SYMS) {
        error_at(P, nat, "too many symbols (at most %d)", IR_MAX_SYMS);
        return;
    }
    int64_t max;
    if (!expect(P, "<=", "'<=' and the symbol's bound") || !integer(P, &max, "the symbol's bound") || !expect_eol(P))
        return;
    int s = ir_add_symbol(P->g, P->s1.data, max);
    P->sym_loc[s] = loc_at(P, at);
}

static void file_line(Parser *P)
{
    skip_ws(P);
    const char *at = P->p;
    if (!name(P, &P->s1, "a quoted file path") || !expect_eol(P)) return;
    for (int i = 0; i < P->g->nfiles; i++)
        if (!strcmp(P->g->files[i], P->s1.data)) {
            error_at(P, at, "file \"%s\" is declared twice", P->s1.data);
            return;
        }
    if (P->g->nfiles > UINT16_MAX) {
        error_at(P, at, "too many files");
        return;
    }
    ir_add_file(P->g, P->s1.data);
}

static void output_line(Parser *P, OutputKind kind, const char *at)
{
    NodeId x;
    if (!name(P, &P->s1, "the output's name") || !expect(P, "=", "'=' after the output's name") ||
        !ref(P, P->g->nnodes, -1, &x) || !expect_eol(P))
        return;
    ir_add_output(P->g, kind, P->s1.data, x);
    GROW(P->out_loc, P->out_loc_cap, P->g->noutputs);
    P->out_loc[P->g->noutputs - 1] = loc_at(P, at);
}

static void graph_line(Parser *P)
{
    if (!keyword(P, "graph")) {
        expected(P, "the 'graph NAME mode=train|eval' line");
        return;
    }
    if (!name(P, &P->s1, "the graph's name") || !expect(P, "mode=", "'mode='")) return;
    GraphMode mode;
    if (keyword(P, "train")) mode = MODE_TRAIN;
    else if (keyword(P, "eval")) mode = MODE_EVAL;
    else if (keyword(P, "decode")) mode = MODE_DECODE;
    else {
        expected(P, "'train' or 'eval'");
        return;
    }
    if (!expect_eol(P)) return;
    P->g = ir_graph_new(P->s1.data);
    P->g->mode = (uint8_t)mode;
}

static void statement(Parser *P)
{
    const char *at = P->p;
    if (*P->p == '%') { node_line(P); return; }
    static const char *const kws[] = {"file", "sym", "output", "loss", "metric", "update", "grad"};
    char buf[72];
    const char *wat;
    if (!bare_word(P, buf, sizeof buf, &wat)) {
        expected(P, "a node, 'file', 'sym' or an output line");
        return;
    }
    if (!strcmp(buf, "file")) { file_line(P); return; }
    if (!strcmp(buf, "sym")) { sym_line(P, at); return; }
    for (int k = 0; k < OUT_KIND_COUNT; k++)
        if (!strcmp(buf, ir_output_kind_name((OutputKind)k))) { output_line(P, (OutputKind)k, at); return; }
    if (!strcmp(buf, "graph")) { error_at(P, wat, "a second 'graph' line"); return; }
    unknown(P, wat, "statement", buf, kws, (int)(sizeof kws / sizeof *kws));
}

/* Maps a verifier message back to the line it is about, by the prefix the verifier puts
 * on it ("node %5 (add): ", "loss 'x': ", "symbol 'B': "); the file itself otherwise. */
static Loc verify_loc(const Parser *P, const char *msg, size_t len)
{
    const Graph *g = P->g;
    Loc none = {P->file, 0, 0};
    if (len > 6 && !memcmp(msg, "node %", 6)) {
        long long id = 0;
        for (size_t i = 6; i < len && is_digit(msg[i]) && id < INT32_MAX; i++) id = id * 10 + (msg[i] - '0');
        return id < g->nnodes ? P->node_loc[id] : none;
    }
    StrBuf b;
    sb_init(&b);
    Loc l = none;
    for (int32_t i = 0; i < g->noutputs && !l.line; i++) {
        b.len = 0;
        sb_printf(&b, "%s '%s': ", ir_output_kind_name((OutputKind)g->outputs[i].kind), ir_str(g, g->outputs[i].name));
        if (b.len <= len && !memcmp(msg, b.data, b.len)) l = P->out_loc[i];
    }
    for (int i = 0; i < g->nsyms && !l.line; i++) {
        b.len = 0;
        sb_printf(&b, "symbol '%s': ", g->syms[i].name);
        if (b.len <= len && !memcmp(msg, b.data, b.len)) l = P->sym_loc[i];
    }
    sb_free(&b);
    return l;
}

static bool verify(Parser *P)
{
    StrBuf err;
    sb_init(&err);
    int n = ir_verify(P->g, &err);
    for (const char *s = err.data, *end = n ? err.data + err.len : NULL; n && s < end;) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        if (!nl) nl = end;
        diag_error(P->d, verify_loc(P, s, (size_t)(nl - s)), "%.*s", (int)(nl - s), s);
        s = nl + 1;
    }
    sb_free(&err);
    return n == 0;
}

Graph *ir_read(const char *text, size_t len, const char *path, Diag *d)
{
    Parser P;
    memset(&P, 0, sizeof P);
    P.d = d;
    if (!text) text = "", len = 0;
    P.file = diag_add_source(d, path ? path : "<ir>", text, len);
    P.text = text;
    P.text_end = text + len;
    sb_init(&P.s1);
    sb_init(&P.s2);
    sb_putn(&P.s1, "", 0);
    sb_putn(&P.s2, "", 0);
    int state = 0; /* 0: before the header, 1: before the graph line, 2: body */
    for (const char *s = text; s < P.text_end && !P.failed;) {
        const char *nl = memchr(s, '\n', (size_t)(P.text_end - s));
        const char *next = nl ? nl + 1 : P.text_end;
        P.line = P.p = s;
        P.end = nl ? nl : P.text_end;
        if (P.end > P.line && P.end[-1] == '\r') P.end--;
        P.lineno++;
        s = next;
        skip_ws(&P);
        if (P.p >= P.end || *P.p == '#') continue;
        if (state == 0) {
            int64_t version;
            const char *vat = P.p;
            if (!keyword(&P, "kiln-ir")) {
                expected(&P, "the header 'kiln-ir 1'");
            } else {
                skip_ws(&P);
                vat = P.p;
                if (integer(&P, &version, "the format version") && expect_eol(&P) && version != 1)
                    error_at(&P, vat, "unsupported kiln-ir version %lld (this reader knows 1)", (long long)version);
            }
            state = 1;
        } else if (state == 1) {
            graph_line(&P);
            state = 2;
        } else {
            statement(&P);
        }
    }
    if (!P.failed && state < 2) {
        Loc l = {P.file, P.lineno ? P.lineno : 1, 1};
        diag_error(d, l, "%s", state == 0 ? "missing the header 'kiln-ir 1'" : "missing the 'graph NAME mode=...' line");
        P.failed = true;
    }
    bool ok = !P.failed && verify(&P);
    free(P.node_loc);
    free(P.out_loc);
    free(P.ops);
    free(P.list);
    free(P.attrs);
    sb_free(&P.s1);
    sb_free(&P.s2);
    if (!ok) {
        ir_graph_free(P.g);
        return NULL;
    }
    return P.g;
}
