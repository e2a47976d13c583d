/* parse.c — the recursive-descent parser from tokens to the Ast (grammar: docs/language.md).
 *
 * Robustness rules that shape the code:
 *  - Errors put the parser in panic mode: the first error is reported, everything up to the
 *    next statement boundary is skipped (sync), and parsing resumes, so one run shows many
 *    independent mistakes. A statement or item with an error is left out of the tree, which
 *    keeps every node in the Ast well formed for the later stages.
 *  - Every place where the tree can grow deeper (brackets, prefix operators, '**', binary
 *    and postfix chains, blocks) goes through enter(), so both the C stack here and the
 *    height of the tree that later stages walk recursively stay bounded by AST_MAX_DEPTH.
 *  - Children are collected on one scratch stack and copied into Ast.kids when a node is
 *    complete, so kids of a node are contiguous without a per-node allocation. */
#include "frontend.h"

#include <stdlib.h>
#include <string.h>

#define PARSE_MAX_ERRORS 100

static const char *const kind_names[AST_KIND_COUNT] = {
    "file", "model", "const", "dim", "module", "param", "member", "forward", "loss",
    "metric", "init", "train", "key", "assign", "return", "for", "number", "string",
    "name", "list", "comprehension", "unary", "binary", "call", "kwarg", "index",
    "slice", "attr", "type", "ellipsis", "if", "block",
};
_Static_assert(sizeof kind_names / sizeof *kind_names == AST_KIND_COUNT, "kind_names out of date");

const char *ast_kind_name(AstKind k)
{
    return (unsigned)k < AST_KIND_COUNT ? kind_names[k] : "?";
}

typedef struct {
    Diag *d;
    Ast *a;
    const char *src;
    const Token *toks;
    int32_t ntoks, pos;
    AstId *scratch;
    int32_t nscratch, scratch_cap;
    int depth;
    bool panic; /* an error was reported; unwinding to the next statement boundary */
    bool stop;  /* too many errors: treat the rest of the file as absent */
    int nerrors;
    int32_t last_err_tok; /* one report per token, however many rules fail on it */
} Parser;

typedef void (*ItemFn)(Parser *p);

/* ---- tokens ---- */

static const Token *cur(const Parser *p) { return &p->toks[p->pos]; }
static TokKind kind_at(const Parser *p, int off)
{
    int64_t i = (int64_t)p->pos + off;
    return (TokKind)p->toks[i < p->ntoks ? i : p->ntoks - 1].kind;
}
static bool at(const Parser *p, TokKind k) { return cur(p)->kind == k; }
static void advance(Parser *p)
{
    if (p->pos < p->ntoks - 1) p->pos++;
}
static bool accept(Parser *p, TokKind k)
{
    if (!at(p, k)) return false;
    advance(p);
    return true;
}

/* Keywords that only start items at the top level; elsewhere they are ordinary names, so
 * `mean(x, dim = 1)` or `loss = cross_entropy(...)` inside a forward block work. */
static bool is_soft_keyword(TokKind k)
{
    return k == TOK_KW_LOSS || k == TOK_KW_TRAIN || k == TOK_KW_INIT || k == TOK_KW_DIM ||
           k == TOK_KW_MODEL || k == TOK_KW_METRIC || k == TOK_KW_FORWARD;
}
static bool is_name(TokKind k) { return k == TOK_IDENT || is_soft_keyword(k); }

/* How a token is shown after "found": its text when short, else what it is. */
static const char *found_desc(const Parser *p, const Token *t, char *buf, size_t bufsz)
{
    const char *text = p->src + t->start;
    if (t->kind == TOK_IDENT || t->kind == TOK_NUMBER) {
        if (t->len <= 32) {
            snprintf(buf, bufsz, "'%.*s'", (int)t->len, text);
            return buf;
        }
        return t->kind == TOK_IDENT ? "a long name" : "a long number";
    }
    if (t->kind == TOK_STRING) {
        bool plain = t->len <= 32;
        for (uint32_t i = 0; plain && i < t->len; i++)
            if ((unsigned char)text[i] < 32 || (unsigned char)text[i] >= 127) plain = false;
        if (!plain) return "a string";
        snprintf(buf, bufsz, "%.*s", (int)t->len, text);
        return buf;
    }
    return lex_token_desc((TokKind)t->kind);
}

/* ---- errors ---- */

/* Length of the quote at s (of a string ending at end): 1 for '"', 3 for a curly double
 * quote, which the lexer reported but still made a string. */
static int quote_len(const char *s, const char *end)
{
    if (s < end && *s == '"') return 1;
    return end - s >= 3 && !memcmp(s, "\xE2\x80", 2) && (s[2] == '\x9C' || s[2] == '\x9D') ? 3 : 0;
}

/* Whether a STRING token has its closing quote (the lexer reported it if not). */
static bool string_closed(const Parser *p, const Token *t)
{
    const char *s = p->src + t->start, *end = s + t->len;
    s += quote_len(s, end);
    while (s < end && !quote_len(s, end)) s += *s == '\\' ? 2 : 1;
    return s < end;
}

/* An unterminated string swallows the rest of its line (often a ',' or ')'), so errors
 * after it on the same statement are consequences, not news. */
static bool after_bad_string(const Parser *p, int32_t tok)
{
    for (int32_t i = tok - 1, n = 0; i >= 0 && n < 64 && p->toks[i].kind != TOK_NEWLINE; i--, n++)
        if (p->toks[i].kind == TOK_STRING && !string_closed(p, &p->toks[i])) return true;
    return false;
}

static void report_at(Parser *p, int32_t tok, bool panic, const char *fmt, va_list ap)
{
    bool quiet = p->panic || p->stop || tok == p->last_err_tok || after_bad_string(p, tok);
    if (panic) p->panic = true;
    if (quiet) return;
    p->last_err_tok = tok;
    diag_vreport(p->d, DIAG_ERROR, p->toks[tok].loc, fmt, ap);
    if (++p->nerrors >= PARSE_MAX_ERRORS) {
        p->stop = true;
        p->panic = true;
        p->pos = p->ntoks - 1;
    }
}

/* Reports at the current token and starts unwinding. */
static void syntax_error(Parser *p, const char *fmt, ...) KILN_PRINTF(2, 3);
static void syntax_error(Parser *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_at(p, p->pos, true, fmt, ap);
    va_end(ap);
}

/* Reports at token `tok`; without `panic` the construct is still well formed and parsing
 * simply goes on. */
static void error_at(Parser *p, int32_t tok, bool panic, const char *fmt, ...) KILN_PRINTF(4, 5);
static void error_at(Parser *p, int32_t tok, bool panic, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    report_at(p, tok, panic, fmt, ap);
    va_end(ap);
}

static void error_expected(Parser *p, const char *what)
{
    char buf[64];
    syntax_error(p, "expected %s, found %s", what, found_desc(p, cur(p), buf, sizeof buf));
}

static bool expect(Parser *p, TokKind k, const char *after)
{
    if (accept(p, k)) return true;
    char buf[64];
    syntax_error(p, "expected %s%s%s, found %s", lex_token_desc(k), after ? " " : "", after ? after : "",
                 found_desc(p, cur(p), buf, sizeof buf));
    return false;
}

/* Consumes the closing bracket of `open` (a token index) or reports where it was opened. */
static bool expect_close(Parser *p, TokKind close, int32_t open)
{
    if (accept(p, close)) return true;
    char buf[64];
    const Token *o = &p->toks[open];
    syntax_error(p, "expected %s to close %s at %u:%u, found %s", lex_token_desc(close),
                 lex_token_desc((TokKind)o->kind), o->loc.line, o->loc.col,
                 found_desc(p, cur(p), buf, sizeof buf));
    return false;
}

/* One more level of nesting; false (with the error reported) when that is too deep. `chain`
 * marks a flat operator chain, whose fix is different from that of nested brackets. */
static bool enter(Parser *p, bool chain)
{
    if (p->depth >= AST_MAX_DEPTH) {
        syntax_error(p, "nesting deeper than %d levels%s", AST_MAX_DEPTH,
                     chain ? " (split this long expression into several statements)" : "");
        return false;
    }
    p->depth++;
    return true;
}

/* Whether token i begins a physical line and looks like the start of an item (top level) or
 * of a statement or module item (inside braces). Only reachable without a NEWLINE token in
 * between when a '(' or '[' was left open, and then it is the best place to resume. */
static bool restart_point(const Parser *p, int32_t i, bool top)
{
    if (i <= 0 || p->toks[i].loc.line == p->toks[i - 1].loc.line || p->toks[i - 1].kind == TOK_NEWLINE)
        return false;
    TokKind k = (TokKind)p->toks[i].kind, next = (TokKind)p->toks[i + 1 < p->ntoks ? i + 1 : i].kind;
    if (k == TOK_KW_CONST || k == TOK_KW_FORWARD || k == TOK_KW_INIT || k == TOK_KW_IF) return true;
    if (top)
        return k == TOK_KW_DIM || k == TOK_KW_MODULE || k == TOK_KW_LOSS || k == TOK_KW_METRIC ||
               k == TOK_KW_TRAIN || k == TOK_KW_MODEL || (k == TOK_IDENT && next == TOK_ASSIGN);
    return k == TOK_KW_RETURN || k == TOK_KW_FOR || (is_name(k) && (next == TOK_ASSIGN || next == TOK_COMMA));
}

/* Skips to the next statement boundary at this brace level: past a NEWLINE, or up to (not
 * past) the '}' that closes the current block, or up to a restart point after `from` (the
 * first token of the failed statement). At the top level there is no block to close, so a
 * stray '}' is skipped too. */
static void sync(Parser *p, bool top, int32_t from)
{
    /* An error on a later line than the statement start, with no NEWLINE in between: that
     * line is probably a statement of its own, joined to this one by an unclosed bracket. */
    int32_t i = p->pos;
    while (i - 1 > from && p->toks[i - 1].loc.line == p->toks[p->pos].loc.line) i--;
    if (i > from && !at(p, TOK_EOF) && restart_point(p, i, top)) {
        p->pos = i;
        p->panic = false;
        return;
    }
    int braces = 0;
    for (;;) {
        TokKind k = (TokKind)cur(p)->kind;
        if (k == TOK_EOF) break;
        if (braces == 0 && p->pos > from && restart_point(p, p->pos, top)) break;
        if (k == TOK_LBRACE) {
            braces++;
        } else if (k == TOK_RBRACE) {
            if (braces == 0 && !top) break;
            if (braces > 0) braces--;
        } else if (k == TOK_NEWLINE && braces == 0) {
            advance(p);
            break;
        }
        advance(p);
    }
    p->panic = false;
}

/* A statement or item ends at a NEWLINE, or just before the '}' of its block, or at EOF. */
static void end_line(Parser *p)
{
    if (accept(p, TOK_NEWLINE) || at(p, TOK_RBRACE) || at(p, TOK_EOF)) return;
    /* A new physical line without a NEWLINE token means a bracket opened earlier was never
     * closed; that is already reported, so a second error here would only be noise. */
    if (p->pos > 0 && cur(p)->loc.line != p->toks[p->pos - 1].loc.line) return;
    error_expected(p, "end of line");
}

/* ---- building nodes ---- */

static AstId new_node(Parser *p, AstKind kind, Loc loc)
{
    Ast *a = p->a;
    GROW(a->nodes, a->nodes_cap, (int64_t)a->nnodes + 1);
    AstNode *n = &a->nodes[a->nnodes];
    memset(n, 0, sizeof *n);
    n->kind = (uint8_t)kind;
    n->loc = loc;
    n->str = -1;
    n->kids = a->nkids;
    return a->nnodes++;
}

static void set_str(Parser *p, AstId id, const char *s, size_t n)
{
    Ast *a = p->a;
    GROW(a->strs, a->strs_cap, (int64_t)a->nstrs + 1);
    a->strs[a->nstrs] = xstrndup(s, n);
    a->nodes[id].str = a->nstrs++;
}

static void set_tok_str(Parser *p, AstId id, const Token *t) { set_str(p, id, p->src + t->start, t->len); }

static void push(Parser *p, AstId id)
{
    GROW(p->scratch, p->scratch_cap, (int64_t)p->nscratch + 1);
    p->scratch[p->nscratch++] = id;
}

/* Moves scratch[base..] into the kids of id. */
static void finish(Parser *p, AstId id, int32_t base)
{
    Ast *a = p->a;
    int32_t n = p->nscratch - base;
    GROW(a->kids, a->kids_cap, (int64_t)a->nkids + n);
    if (n > 0) memcpy(a->kids + a->nkids, p->scratch + base, (size_t)n * sizeof *a->kids);
    a->nodes[id].kids = a->nkids;
    a->nodes[id].nkids = n;
    a->nkids += n;
    p->nscratch = base;
}

/* A node whose kids are scratch[base..]. */
static AstId make(Parser *p, AstKind kind, Loc loc, int32_t base)
{
    AstId id = new_node(p, kind, loc);
    finish(p, id, base);
    return id;
}

/* A node with kid x (and y, for BINARY). */
static AstId node2(Parser *p, AstKind kind, Loc loc, uint8_t op, AstId x, AstId y)
{
    int32_t base = p->nscratch;
    push(p, x);
    if (kind == AST_BINARY) push(p, y);
    AstId id = make(p, kind, loc, base);
    p->a->nodes[id].op = op;
    return id;
}

/* ---- expressions ---- */

static AstId parse_expr(Parser *p);
static AstId parse_unary(Parser *p);
static AstId parse_named(Parser *p, AstKind kind, const char *what);

static AstId parse_number(Parser *p)
{
    const Token *t = cur(p);
    AstId id = new_node(p, AST_NUMBER, t->loc);
    AstNode *n = &p->a->nodes[id];
    n->num = t->num;
    n->ival = t->ival;
    n->aux = t->is_int;
    advance(p);
    return id;
}

static AstId parse_string(Parser *p)
{
    const Token *t = cur(p);
    const char *s = p->src + t->start, *end = p->src + t->start + t->len;
    s += quote_len(s, end);
    StrBuf b;
    sb_init(&b);
    /* The lexer reported any bad escape or unterminated string; decode what is there. */
    while (s < end && !quote_len(s, end)) {
        if (*s == '\\' && s + 1 < end) {
            char e = s[1];
            if (e == 'n') sb_putc(&b, '\n');
            else if (e == 't') sb_putc(&b, '\t');
            else if (e == '"' || e == '\\') sb_putc(&b, e);
            else sb_putn(&b, s, 2);
            s += 2;
            continue;
        }
        if (*s) sb_putc(&b, *s);
        s++;
    }
    AstId id = new_node(p, AST_STRING, t->loc);
    set_str(p, id, b.data ? b.data : "", b.len);
    sb_free(&b);
    advance(p);
    return id;
}

/* '[' already current: a list or a comprehension. */
static AstId parse_bracket(Parser *p)
{
    int32_t open = p->pos, base = p->nscratch;
    Loc loc = cur(p)->loc;
    if (!enter(p, false)) return AST_NONE;
    advance(p);
    AstKind kind = AST_LIST;
    if (!at(p, TOK_RBRACKET)) {
        push(p, parse_expr(p));
        if (p->panic) return AST_NONE;
        if (accept(p, TOK_KW_FOR)) {
            kind = AST_COMPREHENSION;
            push(p, parse_expr(p));
        } else {
            while (!p->panic && accept(p, TOK_COMMA) && !at(p, TOK_RBRACKET)) push(p, parse_expr(p));
        }
    }
    if (p->panic || !expect_close(p, TOK_RBRACKET, open)) return AST_NONE;
    p->depth--;
    return make(p, kind, loc, base);
}

static AstId parse_primary(Parser *p)
{
    const Token *t = cur(p);
    if (t->kind == TOK_NUMBER) return parse_number(p);
    if (t->kind == TOK_STRING) return parse_string(p);
    if (is_name((TokKind)t->kind)) return parse_named(p, AST_NAME, NULL);
    if (t->kind == TOK_LPAREN) {
        int32_t open = p->pos;
        if (!enter(p, false)) return AST_NONE;
        advance(p);
        AstId e = parse_expr(p);
        if (p->panic || !expect_close(p, TOK_RPAREN, open)) return AST_NONE;
        p->depth--;
        return e;
    }
    if (t->kind == TOK_LBRACKET) return parse_bracket(p);
    error_expected(p, "an expression");
    return AST_NONE;
}

/* '(' current; callee already parsed. */
static AstId parse_call(Parser *p, AstId callee)
{
    int32_t open = p->pos;
    advance(p);
    int32_t base = p->nscratch;
    push(p, callee);
    while (!at(p, TOK_RPAREN)) {
        AstId arg;
        if (is_name(kind_at(p, 0)) && kind_at(p, 1) == TOK_ASSIGN) {
            const Token *name = cur(p);
            p->pos += 2;
            AstId v = parse_expr(p);
            if (p->panic) return AST_NONE;
            arg = node2(p, AST_KWARG, name->loc, 0, v, AST_NONE);
            set_tok_str(p, arg, name);
        } else {
            arg = parse_expr(p);
            if (p->panic) return AST_NONE;
        }
        push(p, arg);
        if (!accept(p, TOK_COMMA)) break;
    }
    if (!expect_close(p, TOK_RPAREN, open)) return AST_NONE;
    return make(p, AST_CALL, p->a->nodes[callee].loc, base);
}

/* An expression, or AST_NONE where a slice part is omitted. */
static AstId slice_part(Parser *p)
{
    return at(p, TOK_COLON) || at(p, TOK_COMMA) || at(p, TOK_RBRACKET) ? AST_NONE : parse_expr(p);
}

/* subscript := '...' | expr | [expr] ':' [expr] [ ':' [expr] ] */
static AstId parse_subscript(Parser *p)
{
    Loc loc = cur(p)->loc;
    if (accept(p, TOK_ELLIPSIS)) return make(p, AST_ELLIPSIS, loc, p->nscratch);
    int32_t base = p->nscratch;
    AstId start = at(p, TOK_COLON) ? AST_NONE : parse_expr(p);
    if (p->panic || !at(p, TOK_COLON)) return start;
    push(p, start);
    advance(p);
    push(p, slice_part(p));
    push(p, !p->panic && accept(p, TOK_COLON) ? slice_part(p) : AST_NONE);
    return p->panic ? AST_NONE : make(p, AST_SLICE, loc, base);
}

/* '[' current; base already parsed. */
static AstId parse_index(Parser *p, AstId of)
{
    int32_t open = p->pos, base = p->nscratch;
    Loc loc = cur(p)->loc;
    advance(p);
    push(p, of);
    do push(p, parse_subscript(p));
    while (!p->panic && accept(p, TOK_COMMA));
    if (p->panic || !expect_close(p, TOK_RBRACKET, open)) return AST_NONE;
    return make(p, AST_INDEX, loc, base);
}

static AstId parse_postfix(Parser *p)
{
    AstId e = parse_primary(p);
    int levels = 0;
    while (!p->panic) {
        TokKind k = (TokKind)cur(p)->kind;
        if (k != TOK_LPAREN && k != TOK_LBRACKET && k != TOK_DOT) break;
        if (!enter(p, true)) break;
        levels++;
        if (k == TOK_LPAREN) {
            e = parse_call(p, e);
        } else if (k == TOK_LBRACKET) {
            e = parse_index(p, e);
        } else {
            advance(p);
            const Token *t = cur(p);
            if (!is_name((TokKind)t->kind) && !(t->kind == TOK_NUMBER && t->is_int)) {
                error_expected(p, "an attribute name or index after '.'");
                break;
            }
            e = node2(p, AST_ATTR, t->loc, 0, e, AST_NONE);
            set_tok_str(p, e, t);
            advance(p);
        }
    }
    p->depth -= levels;
    return p->panic ? AST_NONE : e;
}

/* power := postfix [ '**' unary ]: right-associative through unary, and tighter than a
 * unary minus on its left, so -x**2 is -(x**2) and 2**-1 works. */
static AstId parse_power(Parser *p)
{
    AstId x = parse_postfix(p);
    if (p->panic || !at(p, TOK_POW)) return p->panic ? AST_NONE : x;
    const Token *op = cur(p);
    if (!enter(p, false)) return AST_NONE;
    advance(p);
    AstId y = parse_unary(p);
    p->depth--;
    if (p->panic) return AST_NONE;
    return node2(p, AST_BINARY, op->loc, TOK_POW, x, y);
}

static AstId parse_unary(Parser *p)
{
    if (!at(p, TOK_MINUS) && !at(p, TOK_PLUS)) return parse_power(p);
    const Token *op = cur(p);
    if (!enter(p, false)) return AST_NONE;
    advance(p);
    AstId x = parse_unary(p);
    p->depth--;
    if (p->panic) return AST_NONE;
    return node2(p, AST_UNARY, op->loc, op->kind, x, AST_NONE);
}

static bool is_binop(TokKind k, int level)
{
    switch (level) {
    case 0: return k == TOK_KW_OR;
    case 1: return k == TOK_KW_AND;
    case 2: return k == TOK_PLUS || k == TOK_MINUS;
    case 3: return k == TOK_STAR || k == TOK_SLASH || k == TOK_FLOORDIV || k == TOK_PERCENT || k == TOK_AT;
    default: return k == TOK_EQ || k == TOK_NE || k == TOK_LT || k == TOK_LE || k == TOK_GT || k == TOK_GE;
    }
}

static AstId parse_not(Parser *p);
static AstId parse_binary(Parser *p, int level);

/* The operand of each left-associative level: 0 or, 1 and, 2 additive, 3 term. */
static AstId parse_operand(Parser *p, int level)
{
    switch (level) {
    case 0: return parse_binary(p, 1);
    case 1: return parse_not(p);
    case 2: return parse_binary(p, 3);
    default: return parse_unary(p);
    }
}

static AstId parse_binary(Parser *p, int level)
{
    AstId l = parse_operand(p, level);
    int levels = 0;
    while (!p->panic && is_binop((TokKind)cur(p)->kind, level)) {
        const Token *op = cur(p);
        if (!enter(p, true)) break;
        advance(p);
        levels++;
        AstId r = parse_operand(p, level);
        if (p->panic) break;
        l = node2(p, AST_BINARY, op->loc, op->kind, l, r);
    }
    p->depth -= levels;
    return p->panic ? AST_NONE : l;
}

/* comparison := additive [ cmp additive ]; non-associative, because `a < b < c` would mean
 * (a < b) < c, a comparison of a bool, which is never what the writer meant. */
static AstId parse_comparison(Parser *p)
{
    AstId l = parse_binary(p, 2);
    if (p->panic || !is_binop((TokKind)cur(p)->kind, 4)) return p->panic ? AST_NONE : l;
    const Token *op = cur(p);
    if (!enter(p, false)) return AST_NONE;
    advance(p);
    AstId r = parse_binary(p, 2);
    p->depth--;
    if (p->panic) return AST_NONE;
    if (is_binop((TokKind)cur(p)->kind, 4)) {
        syntax_error(p, "comparison operators cannot be chained; add parentheses");
        return AST_NONE;
    }
    return node2(p, AST_BINARY, op->loc, op->kind, l, r);
}

static AstId parse_not(Parser *p)
{
    if (!at(p, TOK_KW_NOT)) return parse_comparison(p);
    const Token *op = cur(p);
    if (!enter(p, false)) return AST_NONE;
    advance(p);
    AstId x = parse_not(p);
    p->depth--;
    if (p->panic) return AST_NONE;
    return node2(p, AST_UNARY, op->loc, TOK_KW_NOT, x, AST_NONE);
}

static AstId parse_expr(Parser *p) { return parse_binary(p, 0); }

/* ---- declarations shared by items ---- */

/* The current token if it is a name (consumed), else NULL with "expected <what>". */
static const Token *take_name(Parser *p, const char *what)
{
    const Token *t = cur(p);
    if (!is_name((TokKind)t->kind)) {
        error_expected(p, what);
        return NULL;
    }
    advance(p);
    return t;
}

/* A name token (identifiers, and the soft keywords) made into a node of `kind`, or
 * AST_NONE with an error mentioning `what`. */
static AstId parse_named(Parser *p, AstKind kind, const char *what)
{
    const Token *t = take_name(p, what);
    if (!t) return AST_NONE;
    AstId id = new_node(p, kind, t->loc);
    set_tok_str(p, id, t);
    return id;
}

static const char *const dtype_list = "bool, u8, i32, i64, f16, bf16, f32 or f64";

/* The dtype a mistyped name most likely meant, or NULL: the names of other frameworks
 * first, then a swap of two neighbouring characters ('f23'), then a small edit distance. */
static const char *suggest_dtype(const char *name)
{
    static const char *const aliases[][2] = {
        {"float", "f32"}, {"float32", "f32"}, {"double", "f64"}, {"float64", "f64"}, {"half", "f16"},
        {"float16", "f16"}, {"bfloat16", "bf16"}, {"int", "i32"}, {"int32", "i32"}, {"long", "i64"},
        {"int64", "i64"}, {"uint8", "u8"}, {"byte", "u8"}, {"boolean", "bool"},
    };
    for (size_t i = 0; i < sizeof aliases / sizeof *aliases; i++)
        if (!strcmp(name, aliases[i][0])) return aliases[i][1];
    size_t n = strlen(name);
    for (int t = 0; t < DT_COUNT; t++) {
        const char *dt = ir_dtype_name((DType)t);
        if (strlen(dt) != n) continue;
        for (size_t i = 0; i + 1 < n; i++)
            if (name[i] == dt[i + 1] && name[i + 1] == dt[i] && !memcmp(name, dt, i) &&
                !strcmp(name + i + 2, dt + i + 2))
                return dt;
    }
    const char *best = NULL;
    int best_d = n <= 2 ? 2 : 3; /* one past the largest distance worth suggesting */
    for (int t = 0; t < DT_COUNT; t++) {
        int dist = util_edit_distance(name, ir_dtype_name((DType)t));
        if (dist < best_d) best_d = dist, best = ir_dtype_name((DType)t);
    }
    return best;
}

/* type := dtype '[' [ expr { ',' expr } ] ']' */
static AstId parse_type(Parser *p)
{
    const Token *t = cur(p);
    if (t->kind != TOK_IDENT) {
        error_expected(p, "a type such as f32[B, 784]");
        return AST_NONE;
    }
    int dt = ir_dtype_from_name(p->src + t->start, t->len);
    if (dt < 0) {
        /* An unknown dtype does not disturb the structure, so keep parsing and report
         * what follows too; the node gets a placeholder dtype. */
        char name[40];
        snprintf(name, sizeof name, "%.*s", (int)(t->len < 32 ? t->len : 32), p->src + t->start);
        const char *best = suggest_dtype(name);
        if (best)
            error_at(p, p->pos, false, "unknown dtype '%s' (did you mean '%s'?)", name, best);
        else
            error_at(p, p->pos, false, "unknown dtype '%s' (expected %s)", name, dtype_list);
        dt = DT_F32;
    }
    advance(p);
    int32_t open = p->pos;
    if (!at(p, TOK_LBRACKET)) {
        char buf[64];
        syntax_error(p, "expected '[' after the dtype (a scalar is written f32[]), found %s",
                     found_desc(p, cur(p), buf, sizeof buf));
        return AST_NONE;
    }
    advance(p);
    int32_t base = p->nscratch;
    if (!at(p, TOK_RBRACKET)) {
        do {
            AstId e = parse_expr(p);
            if (p->panic) return AST_NONE;
            push(p, e);
        } while (accept(p, TOK_COMMA));
    }
    if (!expect_close(p, TOK_RBRACKET, open)) return AST_NONE;
    AstId id = new_node(p, AST_TYPE, t->loc);
    p->a->nodes[id].aux = dt;
    finish(p, id, base);
    return id;
}

/* Completes an item, statement or parameter: a node from scratch[base..], named after
 * `name` when given, pushed onto scratch as a kid of what encloses it. */
static AstId emit(Parser *p, AstKind kind, Loc loc, int32_t base, const Token *name, int32_t aux)
{
    AstId id = make(p, kind, loc, base);
    if (name) set_tok_str(p, id, name);
    p->a->nodes[id].aux = aux;
    push(p, id);
    return id;
}

/* '(' params ')' pushing PARAM nodes; module parameters take defaults, forward and loss
 * parameters take types. Returns the count, or -1 after an error. */
static int parse_params(Parser *p, bool module, const char *after)
{
    int32_t open = p->pos;
    if (!expect(p, TOK_LPAREN, after)) return -1;
    int n = 0;
    while (!at(p, TOK_RPAREN)) {
        const Token *name = take_name(p, "a parameter name");
        if (!name) return -1;
        int32_t base = p->nscratch;
        int aux = 0;
        if (module && accept(p, TOK_ASSIGN)) {
            push(p, parse_expr(p));
            aux = 2;
        } else if (!module && accept(p, TOK_COLON)) {
            push(p, parse_type(p));
            aux = 1;
        }
        if (p->panic) return -1;
        emit(p, AST_PARAM, name->loc, base, name, aux);
        n++;
        if (!accept(p, TOK_COMMA)) break;
    }
    return expect_close(p, TOK_RPAREN, open) ? n : -1;
}

/* Whether the current token starts an item that only exists at the top level (and is not
 * a soft keyword used as a name, as in `loss = ...`). */
static bool starts_top_item(const Parser *p)
{
    TokKind k = kind_at(p, 0), next = kind_at(p, 1);
    if (k == TOK_KW_MODULE) return true;
    bool top_only = k == TOK_KW_DIM || k == TOK_KW_LOSS || k == TOK_KW_METRIC || k == TOK_KW_TRAIN ||
                    k == TOK_KW_MODEL;
    return top_only && next != TOK_ASSIGN && next != TOK_COMMA;
}

/* '{' { item } '}' with per-item recovery; items push their nodes onto scratch. */
static bool parse_braced(Parser *p, ItemFn item, const char *after)
{
    int32_t open = p->pos;
    if (!at(p, TOK_LBRACE)) return expect(p, TOK_LBRACE, after);
    /* Checked before the '{' is consumed, so that sync() counts it and skips to its '}'. */
    if (!enter(p, false)) return false;
    advance(p);
    int depth = p->depth;
    for (;;) {
        while (accept(p, TOK_NEWLINE)) {}
        if (accept(p, TOK_RBRACE)) break;
        if (at(p, TOK_EOF)) {
            expect_close(p, TOK_RBRACE, open);
            p->depth = depth - 1;
            return false;
        }
        if (starts_top_item(p)) {
            /* Most likely this block's '}' is missing: end the block here so that the item
             * and everything after it are parsed as written. */
            char buf[64];
            const Token *o = &p->toks[open];
            error_at(p, p->pos, false,
                     "expected '}' to close '{' at %u:%u, found %s (which starts a top-level item)",
                     o->loc.line, o->loc.col, found_desc(p, cur(p), buf, sizeof buf));
            break;
        }
        int32_t mark = p->nscratch, pos = p->pos;
        item(p);
        if (p->panic) {
            p->nscratch = mark;
            sync(p, false, pos);
        }
        p->depth = depth;
        if (p->pos == pos && !at(p, TOK_RBRACE)) advance(p);
    }
    p->depth = depth - 1;
    return true;
}

/* ---- statements ---- */

static void parse_stmt(Parser *p);

/* expr { ',' expr } pushed onto scratch. */
static void parse_expr_list(Parser *p)
{
    do push(p, parse_expr(p));
    while (!p->panic && accept(p, TOK_COMMA));
}

static void parse_for(Parser *p)
{
    Loc loc = cur(p)->loc;
    advance(p);
    const Token *var = take_name(p, "a loop variable after 'for'");
    if (!var || !expect(p, TOK_KW_IN, "after the loop variable")) return;
    int32_t base = p->nscratch;
    push(p, parse_expr(p));
    if (!p->panic && parse_braced(p, parse_stmt, "after the loop's iterable"))
        emit(p, AST_FOR, loc, base, var, 0);
}

/* if := 'if' expr block [ 'else' ( if | block ) ]: a module item or a statement (`item`
 * parses what the branches hold). The 'else' may start the next line. */
static void parse_if(Parser *p, ItemFn item)
{
    Loc loc = cur(p)->loc;
    if (!enter(p, false)) return;
    advance(p);
    int32_t base = p->nscratch;
    push(p, parse_expr(p));
    for (int branch = 0; !p->panic && branch < 2; branch++) {
        int32_t bbase = p->nscratch;
        Loc bloc = cur(p)->loc;
        if (branch == 1) {
            int32_t save = p->pos;
            while (accept(p, TOK_NEWLINE)) {}
            if (!accept(p, TOK_KW_ELSE)) {
                p->pos = save;
                break;
            }
            bloc = cur(p)->loc;
            if (at(p, TOK_KW_IF)) {
                parse_if(p, item);
                if (p->panic) break;
                push(p, make(p, AST_BLOCK, bloc, bbase));
                continue;
            }
        }
        if (!parse_braced(p, item, branch ? "after 'else'" : "after the condition of 'if'")) break;
        push(p, make(p, AST_BLOCK, bloc, bbase));
    }
    p->depth--;
    if (!p->panic) emit(p, AST_IF, loc, base, NULL, 0);
}

static void parse_stmt(Parser *p)
{
    Loc loc = cur(p)->loc;
    int32_t base = p->nscratch;
    if (at(p, TOK_KW_FOR)) {
        parse_for(p);
        return;
    }
    if (at(p, TOK_KW_IF)) {
        parse_if(p, parse_stmt);
        return;
    }
    if (accept(p, TOK_KW_RETURN)) {
        parse_expr_list(p);
        end_line(p);
        if (!p->panic) emit(p, AST_RETURN, loc, base, NULL, 0);
        return;
    }
    TokKind next = kind_at(p, 1);
    if (!is_name((TokKind)cur(p)->kind) || (next != TOK_ASSIGN && next != TOK_COMMA)) {
        error_expected(p, "a statement: `name = expr`, `return`, `for` or `if`");
        return;
    }
    int n = 0;
    do push(p, parse_named(p, AST_NAME, "a name to assign to")), n++;
    while (!p->panic && accept(p, TOK_COMMA));
    if (p->panic || !expect(p, TOK_ASSIGN, "after the assignment targets")) return;
    push(p, parse_expr(p));
    if (!p->panic) end_line(p);
    if (!p->panic) emit(p, AST_ASSIGN, loc, base, NULL, n);
}

/* ---- items ---- */

/* name '=' expr NL as a node of `kind` holding the value: member, metric, train key. */
static void parse_binding(Parser *p, AstKind kind, const char *what)
{
    const Token *name = take_name(p, what);
    if (!name || !expect(p, TOK_ASSIGN, "after the name")) return;
    int32_t vtok = p->pos, base = p->nscratch;
    AstId v = parse_expr(p);
    if (p->panic) return;
    if (kind == AST_MEMBER && p->a->nodes[v].kind != AST_CALL && p->a->nodes[v].kind != AST_COMPREHENSION) {
        /* Members are layers; the checker and lowering rely on this shape. */
        error_at(p, vtok, true,
                 "a member must be a layer: `name = Layer(...)` or `name = [Layer(...) for n]` "
                 "(use `const` for a value)");
        return;
    }
    push(p, v);
    end_line(p);
    if (!p->panic) emit(p, kind, name->loc, base, name, 0);
}

static void parse_member(Parser *p) { parse_binding(p, AST_MEMBER, "a member name"); }
static void parse_train_item(Parser *p) { parse_binding(p, AST_KEY, "a training setting `name = value`"); }

static void parse_metric(Parser *p)
{
    advance(p);
    parse_binding(p, AST_METRIC, "a metric name after 'metric'");
}

static void parse_const(Parser *p)
{
    advance(p);
    do {
        const Token *name = take_name(p, "a constant name after 'const'");
        if (!name || !expect(p, TOK_ASSIGN, "after the constant name")) return;
        int32_t base = p->nscratch;
        push(p, parse_expr(p));
        if (p->panic) return;
        emit(p, AST_CONST, name->loc, base, name, 0);
    } while (accept(p, TOK_COMMA));
    end_line(p);
}

static void parse_dim(Parser *p)
{
    advance(p);
    const Token *name = take_name(p, "a dimension name after 'dim'");
    if (!name) return;
    int32_t base = p->nscratch;
    if (accept(p, TOK_LE)) push(p, parse_expr(p));
    if (!p->panic) end_line(p);
    if (!p->panic) emit(p, AST_DIM, name->loc, base, name, 0);
}

static void parse_forward(Parser *p)
{
    Loc loc = cur(p)->loc;
    advance(p);
    int32_t base = p->nscratch;
    int np = parse_params(p, false, "after 'forward'"), no = 0;
    if (np < 0) return;
    if (accept(p, TOK_ARROW)) {
        do push(p, parse_named(p, AST_NAME, "an output name after '->'")), no++;
        while (!p->panic && accept(p, TOK_COMMA));
        if (p->panic) return;
    }
    if (!parse_braced(p, parse_stmt, "to start the forward body")) return;
    AstId id = emit(p, AST_FORWARD, loc, base, NULL, np);
    p->a->nodes[id].aux2 = no;
}

static void parse_loss(Parser *p)
{
    Loc loc = cur(p)->loc;
    advance(p);
    int32_t base = p->nscratch;
    int np = parse_params(p, false, "after 'loss'");
    if (np < 0) return;
    if (at(p, TOK_ASSIGN)) {
        Loc rloc = cur(p)->loc;
        int32_t rbase = p->nscratch;
        advance(p);
        push(p, parse_expr(p));
        if (!p->panic) end_line(p);
        if (p->panic) return;
        emit(p, AST_RETURN, rloc, rbase, NULL, 0);
    } else if (!at(p, TOK_LBRACE)) {
        error_expected(p, "'=' or '{' after the loss parameters");
        return;
    } else if (!parse_braced(p, parse_stmt, NULL)) {
        return;
    }
    emit(p, AST_LOSS, loc, base, NULL, np);
}

/* pattern := seg { '.' seg }, seg := name | integer | '*', kept as the text written. */
static void parse_init(Parser *p)
{
    advance(p);
    Loc loc = cur(p)->loc;
    StrBuf pat;
    sb_init(&pat);
    do {
        const Token *t = cur(p);
        if (!is_name((TokKind)t->kind) && !(t->kind == TOK_NUMBER && t->is_int) && t->kind != TOK_STAR) {
            error_expected(p, "a parameter name, index or '*' in the init pattern");
            break;
        }
        if (pat.len) sb_putc(&pat, '.');
        sb_putn(&pat, p->src + t->start, t->len);
        advance(p);
    } while (accept(p, TOK_DOT));
    int32_t base = p->nscratch;
    if (!p->panic && expect(p, TOK_ASSIGN, "after the init pattern")) push(p, parse_expr(p));
    if (!p->panic) end_line(p);
    if (!p->panic) {
        AstId id = emit(p, AST_INIT, loc, base, NULL, 0);
        set_str(p, id, pat.data, pat.len);
    }
    sb_free(&pat);
}

static void parse_train(Parser *p)
{
    Loc loc = cur(p)->loc;
    advance(p);
    int32_t base = p->nscratch;
    if (parse_braced(p, parse_train_item, "after 'train'")) emit(p, AST_TRAIN, loc, base, NULL, 0);
}

static void parse_module_item(Parser *p)
{
    TokKind k = (TokKind)cur(p)->kind;
    if (k == TOK_KW_CONST) parse_const(p);
    else if (k == TOK_KW_FORWARD) parse_forward(p);
    else if (k == TOK_KW_INIT) parse_init(p);
    else if (k == TOK_KW_IF) parse_if(p, parse_module_item);
    else if (k == TOK_IDENT && kind_at(p, 1) == TOK_ASSIGN) parse_member(p);
    else {
        char buf[64];
        syntax_error(p,
                     "expected a module item: const, member `name = Layer(...)`, forward, init or if; found %s",
                     found_desc(p, cur(p), buf, sizeof buf));
    }
}

static void parse_module(Parser *p)
{
    advance(p);
    const Token *name = take_name(p, "a module name after 'module'");
    if (!name) return;
    int32_t base = p->nscratch;
    int np = parse_params(p, true, "after the module name");
    if (np >= 0 && parse_braced(p, parse_module_item, "to start the module body"))
        emit(p, AST_MODULE, name->loc, base, name, np);
}

/* The branches of an `if` at the top level choose members and init rules (the file's
 * constants, sizes, forward and loss are one each). */
static void parse_top_branch_item(Parser *p)
{
    TokKind k = (TokKind)cur(p)->kind;
    if (k == TOK_KW_INIT) parse_init(p);
    else if (k == TOK_KW_IF) parse_if(p, parse_top_branch_item);
    else if (k == TOK_IDENT && kind_at(p, 1) == TOK_ASSIGN) parse_member(p);
    else {
        char buf[64];
        syntax_error(p, "expected a member `name = Layer(...)`, init or if in an `if` at the top level; found %s",
                     found_desc(p, cur(p), buf, sizeof buf));
    }
}

static void parse_model(Parser *p)
{
    advance(p);
    const Token *name = take_name(p, "a model name after 'model'");
    if (!name) return;
    end_line(p);
    if (!p->panic) emit(p, AST_MODEL, name->loc, p->nscratch, name, 0);
}

static void parse_top_item(Parser *p)
{
    switch (cur(p)->kind) {
    case TOK_KW_CONST: parse_const(p); return;
    case TOK_KW_DIM: parse_dim(p); return;
    case TOK_KW_MODULE: parse_module(p); return;
    case TOK_KW_FORWARD: parse_forward(p); return;
    case TOK_KW_LOSS: parse_loss(p); return;
    case TOK_KW_METRIC: parse_metric(p); return;
    case TOK_KW_INIT: parse_init(p); return;
    case TOK_KW_TRAIN: parse_train(p); return;
    case TOK_KW_IF: parse_if(p, parse_top_branch_item); return;
    case TOK_KW_MODEL: syntax_error(p, "'model' must be the first line of the file"); return;
    case TOK_IDENT:
        if (kind_at(p, 1) == TOK_ASSIGN) {
            parse_member(p);
            return;
        }
        break;
    default: break;
    }
    char buf[64];
    syntax_error(p,
                 "expected an item at top level: const, dim, module, member `name = Layer(...)`, forward, "
                 "loss, metric, init, train or if; found %s",
                 found_desc(p, cur(p), buf, sizeof buf));
}

static AstId parse_file(Parser *p)
{
    int32_t base = p->nscratch;
    if (at(p, TOK_KW_MODEL)) {
        parse_model(p);
        if (p->panic) sync(p, true, 0);
    }
    for (;;) {
        while (accept(p, TOK_NEWLINE)) {}
        if (at(p, TOK_EOF)) break;
        int32_t mark = p->nscratch, pos = p->pos;
        parse_top_item(p);
        if (p->panic) {
            p->nscratch = mark;
            sync(p, true, pos);
        }
        p->depth = 0;
        if (p->pos == pos) advance(p);
    }
    Loc loc = {p->a->file, 1, 1};
    AstId id = new_node(p, AST_FILE, loc);
    finish(p, id, base);
    return id;
}

Ast *ast_parse(Diag *d, uint16_t file)
{
    Ast *a = xcalloc(1, sizeof *a);
    a->file = file;
    Token *toks = NULL;
    Parser p;
    memset(&p, 0, sizeof p);
    p.ntoks = lex_source(d, file, &toks);
    p.toks = toks;
    p.d = d;
    p.a = a;
    p.src = file < d->nsources ? d->sources[file].text : "";
    p.last_err_tok = -1;
    a->root = parse_file(&p);
    free(toks);
    free(p.scratch);
    return a;
}

void ast_free(Ast *a)
{
    if (!a) return;
    for (int32_t i = 0; i < a->nstrs; i++) free(a->strs[i]);
    free(a->strs);
    free(a->nodes);
    free(a->kids);
    free(a);
}

/* ---- dump ---- */

static void dump_string(StrBuf *out, const char *s)
{
    sb_putc(out, '"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') sb_putc(out, '\\'), sb_putc(out, (char)c);
        else if (c == '\n') sb_puts(out, "\\n");
        else if (c == '\t') sb_puts(out, "\\t");
        else if (c < 32 || c == 127) sb_printf(out, "\\x%02X", c);
        else sb_putc(out, (char)c);
    }
    sb_putc(out, '"');
}

/* An operator token as its bare symbol: "'+'" becomes "+". */
static void dump_op(StrBuf *out, TokKind op)
{
    const char *d = lex_token_desc(op);
    size_t n = strlen(d);
    if (n >= 2 && d[0] == '\'') sb_putn(out, d + 1, n - 2);
    else sb_puts(out, d);
}

static void dump(const Ast *a, AstId id, StrBuf *out, int depth)
{
    if (id < 0 || id >= a->nnodes) {
        sb_putc(out, '-');
        return;
    }
    if (depth > 4 * AST_MAX_DEPTH + 100) { /* only reachable on a tree not made by ast_parse */
        sb_puts(out, "...");
        return;
    }
    const AstNode *n = &a->nodes[id];
    sb_printf(out, "(%s", ast_kind_name((AstKind)n->kind));
    switch (n->kind) {
    case AST_NUMBER:
        if (n->aux) {
            sb_printf(out, " %lld", (long long)n->ival);
        } else {
            char buf[64];
            util_format_double(buf, sizeof buf, n->num);
            sb_printf(out, " %s", buf);
        }
        break;
    case AST_STRING:
        sb_putc(out, ' ');
        dump_string(out, ast_str(a, id));
        break;
    case AST_UNARY:
    case AST_BINARY:
        sb_putc(out, ' ');
        dump_op(out, (TokKind)n->op);
        break;
    case AST_TYPE:
        sb_printf(out, " %s", n->aux >= 0 && n->aux < DT_COUNT ? ir_dtype_name((DType)n->aux) : "?");
        break;
    case AST_ATTR: break; /* name after the base, as written */
    default:
        if (n->str >= 0) sb_printf(out, " %s", ast_str(a, id));
        break;
    }
    for (int32_t i = 0; i < n->nkids; i++) {
        sb_putc(out, ' ');
        dump(a, ast_kid(a, id, i), out, depth + 1);
    }
    if (n->kind == AST_ATTR) sb_printf(out, " %s", ast_str(a, id));
    sb_putc(out, ')');
}

void ast_dump(const Ast *a, AstId id, StrBuf *out) { dump(a, id, out, 0); }
