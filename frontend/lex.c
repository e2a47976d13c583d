/* lex.c — the tokenizer for *.kiln files.
 *
 * One linear pass over the bytes, no backtracking, so a 10 MB file or a 1 MB line costs
 * the same per byte as a small model. Line structure matters to the grammar (a statement
 * ends at a newline), but a newline inside ( ) or [ ] is only whitespace so that long calls
 * can be wrapped; braces delimit blocks of statements and so never hide newlines. The lexer
 * never stops at an error: a bad byte run is reported once and skipped, a bad literal still
 * becomes a token, so the parser sees the rest of the file and can report its own errors. */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

/* More errors than this from one file are almost always one cause (a binary file, a wrong
 * encoding); the rest would only bury the first, useful one. */
#define LEX_MAX_ERRORS 20
/* Keeps token offsets within uint32_t and the token array well within int32_t. */
#define LEX_MAX_SOURCE ((size_t)256 << 20)
/* strtod on an unbounded digit string is not linear in every libc; no real literal needs
 * more than a few dozen digits. */
#define LEX_MAX_NUMBER 512

static const char *const token_desc[TOK_COUNT] = {
#define TOK_DESC(e, desc) [TOK_##e] = desc,
    KILN_TOKENS(TOK_DESC)
#undef TOK_DESC
};

const char *lex_token_desc(TokKind k)
{
    return (unsigned)k < TOK_COUNT ? token_desc[k] : "token";
}

static const struct {
    const char *text;
    uint8_t len;
    uint8_t kind;
} keywords[] = {
    {"model", 5, TOK_KW_MODEL},     {"module", 6, TOK_KW_MODULE}, {"const", 5, TOK_KW_CONST},
    {"dim", 3, TOK_KW_DIM},         {"forward", 7, TOK_KW_FORWARD}, {"loss", 4, TOK_KW_LOSS},
    {"metric", 6, TOK_KW_METRIC},   {"init", 4, TOK_KW_INIT},     {"train", 5, TOK_KW_TRAIN},
    {"return", 6, TOK_KW_RETURN},   {"for", 3, TOK_KW_FOR},       {"in", 2, TOK_KW_IN},
    {"and", 3, TOK_KW_AND},         {"or", 2, TOK_KW_OR},         {"not", 3, TOK_KW_NOT},
    {"if", 2, TOK_KW_IF},           {"else", 4, TOK_KW_ELSE},
};

typedef struct {
    Diag *d;
    uint16_t file;
    const char *src;
    size_t len, pos;
    uint32_t line;
    size_t line_start;
    int nerrors;
    int depth; /* open ( and [ */
    Token *toks;
    int32_t ntoks, cap;
} Lexer;

static bool is_digit(int c) { return c >= '0' && c <= '9'; }
static bool is_ident_start(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
static bool is_ident_char(int c) { return is_ident_start(c) || is_digit(c); }

/* The byte at pos+off, or 0 past the end (the source copy is NUL-terminated, but an
 * explicit bound keeps reads obviously safe). */
static int peek(const Lexer *lx, size_t off)
{
    return lx->pos + off < lx->len ? (unsigned char)lx->src[lx->pos + off] : 0;
}

static Loc loc_at(const Lexer *lx, size_t at)
{
    Loc l = {lx->file, lx->line, (uint32_t)(at - lx->line_start + 1)};
    return l;
}

static void lex_error(Lexer *lx, size_t at, const char *fmt, ...) KILN_PRINTF(3, 4);
static void lex_error(Lexer *lx, size_t at, const char *fmt, ...)
{
    if (lx->nerrors++ >= LEX_MAX_ERRORS) return;
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(lx->d, DIAG_ERROR, loc_at(lx, at), fmt, ap);
    va_end(ap);
}

static Token *push_tok(Lexer *lx, TokKind kind, size_t start, size_t len)
{
    GROW(lx->toks, lx->cap, (int64_t)lx->ntoks + 1);
    Token *t = &lx->toks[lx->ntoks++];
    memset(t, 0, sizeof *t);
    t->kind = (uint8_t)kind;
    t->loc = loc_at(lx, start);
    t->start = (uint32_t)start;
    t->len = (uint32_t)len;
    return t;
}

/* Blank lines, comment lines and ';;' all collapse into one statement end, and nothing
 * before the first token can end a statement, so the parser never sees empty statements. */
static void push_newline(Lexer *lx, size_t at)
{
    if (lx->ntoks > 0 && lx->toks[lx->ntoks - 1].kind != TOK_NEWLINE) push_tok(lx, TOK_NEWLINE, at, 1);
}

/* Length of the curly double quote (U+201C or U+201D, as UTF-8) at pos+off, or 0. Text
 * pasted from a document has them where '"' belongs; they get a string token of their own
 * so that one wrong quote is one error, not a cascade. */
static size_t curly_quote(const Lexer *lx, size_t off)
{
    int last = peek(lx, off + 2);
    return peek(lx, off) == 0xE2 && peek(lx, off + 1) == 0x80 && (last == 0x9C || last == 0x9D) ? 3 : 0;
}

/* A word: identifier characters and non-ASCII bytes (a UTF-8 letter inside a name).
 * Returns its end; *ascii tells whether it has any ASCII identifier character. */
static size_t word_end(const Lexer *lx, size_t from, bool *ascii)
{
    *ascii = false;
    size_t e = from;
    while (e < lx->len) {
        unsigned char c = (unsigned char)lx->src[e];
        if (is_ident_char(c)) *ascii = true;
        else if (c < 0x80 || curly_quote(lx, e - lx->pos)) break;
        e++;
    }
    return e;
}

static void lex_word(Lexer *lx)
{
    size_t s = lx->pos;
    bool ascii;
    lx->pos = word_end(lx, s, &ascii);
    size_t n = lx->pos - s;
    TokKind kind = TOK_IDENT;
    bool non_ascii = false;
    for (size_t i = 0; i < n; i++) non_ascii |= (unsigned char)lx->src[s + i] >= 0x80;
    if (non_ascii) {
        /* One error for the whole name, and a name token so that the parser carries on. */
        lex_error(lx, s, "non-ASCII character in name '%.*s%s' (names use A-Z, a-z, 0-9 and _)",
                  (int)(n > 40 ? 40 : n), lx->src + s, n > 40 ? "..." : "");
    } else {
        for (size_t i = 0; i < sizeof keywords / sizeof *keywords; i++)
            if (keywords[i].len == n && !memcmp(keywords[i].text, lx->src + s, n)) {
                kind = (TokKind)keywords[i].kind;
                break;
            }
    }
    push_tok(lx, kind, s, n);
}

static void lex_number(Lexer *lx)
{
    size_t s = lx->pos;
    /* Right after a '.', only digits: `h.0.attn` and `h.1.2` index layer lists, and a
     * fraction can never follow a '.' in valid code. */
    bool after_dot = lx->ntoks > 0 && lx->toks[lx->ntoks - 1].kind == TOK_DOT;
    bool is_int = true;
    while (is_digit(peek(lx, 0))) lx->pos++;
    if (!after_dot) {
        if (peek(lx, 0) == '.' && is_digit(peek(lx, 1))) {
            lx->pos++;
            while (is_digit(peek(lx, 0))) lx->pos++;
            is_int = false;
        }
        if (peek(lx, 0) == 'e' || peek(lx, 0) == 'E') {
            size_t q = 1;
            if (peek(lx, q) == '+' || peek(lx, q) == '-') q++;
            if (is_digit(peek(lx, q))) {
                lx->pos += q;
                while (is_digit(peek(lx, 0))) lx->pos++;
                is_int = false;
            }
        }
    }
    size_t n = lx->pos - s;
    if (is_ident_start(peek(lx, 0))) {
        /* `28x` or `1e`: one error for the whole word instead of a number then a name. */
        while (is_ident_char(peek(lx, 0))) lx->pos++;
        size_t bad = lx->pos - s;
        lex_error(lx, s, "invalid number '%.*s%s'", (int)(bad > 40 ? 40 : bad), lx->src + s,
                  bad > 40 ? "..." : "");
    }
    Token *t = push_tok(lx, TOK_NUMBER, s, lx->pos - s);
    t->is_int = is_int;
    if (is_int) {
        int64_t v = 0;
        bool overflow = false;
        for (size_t i = 0; i < n; i++) {
            int dig = lx->src[s + i] - '0';
            if (v > (INT64_MAX - dig) / 10) {
                overflow = true;
                break;
            }
            v = v * 10 + dig;
        }
        if (overflow) {
            lex_error(lx, s, "integer literal too large");
            v = INT64_MAX;
        }
        t->ival = v;
        t->num = (double)v;
    } else if (n > LEX_MAX_NUMBER) {
        lex_error(lx, s, "number literal too long");
    } else {
        char buf[LEX_MAX_NUMBER + 1];
        memcpy(buf, lx->src + s, n);
        buf[n] = 0;
        t->num = strtod(buf, NULL);
        if (t->num >= -9.2e18 && t->num <= 9.2e18) t->ival = (int64_t)t->num;
    }
}

/* The token keeps the raw text, quotes included; the parser resolves the escapes. A
 * string opened by a curly quote (reported here) may also close with one. */
static void lex_string(Lexer *lx)
{
    size_t s = lx->pos;
    size_t open = curly_quote(lx, 0);
    if (open)
        lex_error(lx, s, "unexpected character '%.3s' (U+%04X): strings use straight quotes \"...\"",
                  lx->src + s, peek(lx, 2) == 0x9C ? 0x201C : 0x201D);
    lx->pos += open ? open : 1;
    for (;;) {
        int c = peek(lx, 0);
        if (lx->pos >= lx->len || c == '\n') {
            lex_error(lx, s, "unterminated string");
            break;
        }
        if (c == '"' || (open && curly_quote(lx, 0))) {
            lx->pos += c == '"' ? 1 : 3;
            break;
        }
        if (c == '\\') {
            int e = peek(lx, 1);
            if (e == '"' || e == '\\' || e == 'n' || e == 't') {
                lx->pos += 2;
                continue;
            }
            if (lx->pos + 1 >= lx->len || e == '\n' || e == '\r') {
                lx->pos++;
                lex_error(lx, s, "unterminated string");
                break;
            }
            if (e > 32 && e < 127)
                lex_error(lx, lx->pos, "unknown escape '\\%c' in string (use \\\" \\\\ \\n or \\t)", e);
            else
                lex_error(lx, lx->pos, "unknown escape '\\' + byte 0x%02X in string", (unsigned)e);
            lx->pos += 2;
            continue;
        }
        if (c == 0) lex_error(lx, lx->pos, "unexpected byte 0x00 in string");
        lx->pos++;
    }
    push_tok(lx, TOK_STRING, s, lx->pos - s);
}

/* The single- or double-byte operator at pos, or -1. */
static int operator_at(const Lexer *lx, int *width)
{
    int c = peek(lx, 0), c1 = peek(lx, 1);
    *width = 1;
    switch (c) {
    case '(': return TOK_LPAREN;
    case ')': return TOK_RPAREN;
    case '[': return TOK_LBRACKET;
    case ']': return TOK_RBRACKET;
    case '{': return TOK_LBRACE;
    case '}': return TOK_RBRACE;
    case ',': return TOK_COMMA;
    case ':': return TOK_COLON;
    case '.': if (c1 == '.' && peek(lx, 2) == '.') { *width = 3; return TOK_ELLIPSIS; } return TOK_DOT;
    case '+': return TOK_PLUS;
    case '/': if (c1 == '/') { *width = 2; return TOK_FLOORDIV; } return TOK_SLASH;
    case '%': return TOK_PERCENT;
    case '@': return TOK_AT;
    case '-': if (c1 == '>') { *width = 2; return TOK_ARROW; } return TOK_MINUS;
    case '*': if (c1 == '*') { *width = 2; return TOK_POW; } return TOK_STAR;
    case '=': if (c1 == '=') { *width = 2; return TOK_EQ; } return TOK_ASSIGN;
    case '<': if (c1 == '=') { *width = 2; return TOK_LE; } return TOK_LT;
    case '>': if (c1 == '=') { *width = 2; return TOK_GE; } return TOK_GT;
    case '!': if (c1 == '=') { *width = 2; return TOK_NE; } return -1;
    default: return -1;
    }
}

/* Whether the byte at pos can start anything (a token, whitespace, a comment); the
 * complement is what a bad-byte run consists of. */
static bool starts_something(const Lexer *lx)
{
    int c = peek(lx, 0), w;
    if (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '#' || c == ';' || c == '"') return true;
    if (is_ident_char(c)) return true;
    return operator_at(lx, &w) >= 0;
}

/* A run of bad bytes, reported once. Non-ASCII bytes belong to it unless they are part of a
 * word with ASCII letters (a misspelt name, lexed by lex_word) or a curly quote. */
static void lex_bad_bytes(Lexer *lx)
{
    size_t s = lx->pos;
    int c = peek(lx, 0);
    while (lx->pos < lx->len) {
        if (peek(lx, 0) >= 0x80) {
            bool ascii;
            size_t e = word_end(lx, lx->pos, &ascii);
            if (ascii || e == lx->pos) break;
            lx->pos = e;
        } else if (starts_something(lx)) {
            break;
        } else {
            lx->pos++;
        }
    }
    if (lx->pos == s) lx->pos++; /* always make progress */
    if (c > 32 && c < 127)
        lex_error(lx, s, "unexpected character '%c'", c);
    else
        lex_error(lx, s, "unexpected byte 0x%02X", (unsigned)c);
}

int32_t lex_source(Diag *d, uint16_t file, Token **out)
{
    Lexer lx;
    memset(&lx, 0, sizeof lx);
    lx.d = d;
    lx.file = file;
    lx.line = 1;
    if (file < d->nsources) {
        lx.src = d->sources[file].text;
        lx.len = d->sources[file].len;
    }
    /* A UTF-8 byte-order mark, as some Windows editors write, is not part of the text. */
    if (lx.len >= 3 && !memcmp(lx.src, "\xEF\xBB\xBF", 3)) lx.pos = 3;
    if (lx.len > LEX_MAX_SOURCE) {
        Loc none = {file, 0, 0};
        diag_error(d, none, "source file too large (%zu bytes; the limit is %zu)", lx.len, LEX_MAX_SOURCE);
        lx.len = 0;
    }
    while (lx.pos < lx.len) {
        int c = peek(&lx, 0), width;
        if (c == ' ' || c == '\t' || c == '\r') {
            lx.pos++;
        } else if (c == '\n') {
            if (lx.depth == 0) push_newline(&lx, lx.pos);
            lx.pos++;
            lx.line++;
            lx.line_start = lx.pos;
        } else if (c == '#') {
            const char *nl = memchr(lx.src + lx.pos, '\n', lx.len - lx.pos);
            lx.pos = nl ? (size_t)(nl - lx.src) : lx.len;
        } else if (c == ';') {
            push_newline(&lx, lx.pos);
            lx.pos++;
        } else if (is_digit(c)) {
            lex_number(&lx);
        } else if (c == '"' || curly_quote(&lx, 0)) {
            lex_string(&lx);
        } else if (is_ident_start(c)) {
            lex_word(&lx);
        } else if (c >= 0x80) {
            bool ascii;
            word_end(&lx, lx.pos, &ascii);
            if (ascii) lex_word(&lx);
            else lex_bad_bytes(&lx);
        } else {
            int kind = operator_at(&lx, &width);
            if (kind < 0) {
                lex_bad_bytes(&lx);
                continue;
            }
            push_tok(&lx, (TokKind)kind, lx.pos, (size_t)width);
            lx.pos += (size_t)width;
            if (kind == TOK_LPAREN || kind == TOK_LBRACKET) {
                lx.depth++;
            } else if (kind == TOK_RPAREN || kind == TOK_RBRACKET) {
                if (lx.depth > 0) lx.depth--;
            } else if (kind == TOK_LBRACE || kind == TOK_RBRACE) {
                /* Braces never occur inside ( ) or [ ] in valid code, so one here means a
                 * bracket was left open: forget it, or the rest of the file would become a
                 * single line and one typo would hide every later error. */
                lx.depth = 0;
            }
        }
    }
    /* End of file is reported just after the last real token, where whatever is missing
     * would have to go, rather than on an empty line after the final newline. */
    Loc eof_loc = {file, 1, 1};
    for (int32_t i = lx.ntoks - 1; i >= 0; i--)
        if (lx.toks[i].kind != TOK_NEWLINE) {
            eof_loc = lx.toks[i].loc;
            eof_loc.col += lx.toks[i].len;
            break;
        }
    Token *eof = push_tok(&lx, TOK_EOF, lx.len, 0);
    eof->loc = eof_loc;
    *out = lx.toks;
    return lx.ntoks;
}
