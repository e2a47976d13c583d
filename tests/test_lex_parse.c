/* test_lex_parse.c — the lexer and parser: every token kind, every grammar rule through
 * ast_dump, the exact wording of syntax errors, error recovery, the nesting limit, and
 * robustness on truncated, mutated and random input (run under ASan/UBSan too). The dump
 * strings here double as the reference for the S-expression format documented in parse.c. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../frontend/frontend.h"
#include "support.h"

static const char *const tok_names[TOK_COUNT] = {
#define TOK_NAME(e, desc) #e,
    KILN_TOKENS(TOK_NAME)
#undef TOK_NAME
};

static const char MLP[] =
    "# models/mlp.kiln — three-layer perceptron for Fashion-MNIST\n"
    "model mlp\n"
    "\n"
    "fc1 = Linear(784, 256)\n"
    "fc2 = Linear(256, 256)\n"
    "fc3 = Linear(256, 10)\n"
    "\n"
    "forward(image: u8[B, 28, 28]) -> logits {\n"
    "    x = flatten(f32(image) / 255)\n"
    "    x = relu(fc1(x))\n"
    "    x = relu(fc2(x))\n"
    "    logits = fc3(x)\n"
    "}\n"
    "\n"
    "loss(logits, label: u8[B]) = cross_entropy(logits, label)\n"
    "metric accuracy = mean(argmax(logits, axis = -1) == label)\n"
    "\n"
    "train {\n"
    "    data      = idx(image = \"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\", "
    "label = \"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\")\n"
    "    optimizer = AdamW(lr = 1e-3, weight_decay = 0.01)\n"
    "    batch     = 128\n"
    "    epochs    = 5\n"
    "}\n";

static const char MLP_DUMP[] =
    "(file (model mlp) (member fc1 (call (name Linear) (number 784) (number 256))) "
    "(member fc2 (call (name Linear) (number 256) (number 256))) "
    "(member fc3 (call (name Linear) (number 256) (number 10))) "
    "(forward (param image (type u8 (name B) (number 28) (number 28))) (name logits) "
    "(assign (name x) (call (name flatten) (binary / (call (name f32) (name image)) (number 255)))) "
    "(assign (name x) (call (name relu) (call (name fc1) (name x)))) "
    "(assign (name x) (call (name relu) (call (name fc2) (name x)))) "
    "(assign (name logits) (call (name fc3) (name x)))) "
    "(loss (param logits) (param label (type u8 (name B))) "
    "(return (call (name cross_entropy) (name logits) (name label)))) "
    "(metric accuracy (call (name mean) (binary == (call (name argmax) (name logits) "
    "(kwarg axis (unary - (number 1)))) (name label)))) "
    "(train (key data (call (name idx) "
    "(kwarg image (string \"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\")) "
    "(kwarg label (string \"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\")))) "
    "(key optimizer (call (name AdamW) (kwarg lr (number 0.001)) (kwarg weight_decay (number 0.01)))) "
    "(key batch (number 128)) (key epochs (number 5))))";

static const char GPT[] =
    "module Block(C, H) {\n"
    "    ln_1 = LayerNorm(C)\n"
    "    attn = CausalSelfAttention(C, H)\n"
    "    forward(x) {\n"
    "        x = x + attn(ln_1(x))\n"
    "        return x\n"
    "    }\n"
    "}\n"
    "h = [Block(C, H) for L]\n"
    "init h.*.attn.c_proj.weight = normal(0, 0.02 / sqrt(2 * L))\n"
    "forward(idx: i32[B, T]) -> logits {\n"
    "    x = wte(idx) + wpe(arange(T))\n"
    "    for block in h { x = checkpoint(block(x)) }\n"
    "    q, k, v = split(x, C, axis = -1)\n"
    "    y = x[:, :T - 1, ::2]\n"
    "    logits = x @ transpose(wte.weight)\n"
    "}\n";

static const char GPT_DUMP[] =
    "(file (module Block (param C) (param H) (member ln_1 (call (name LayerNorm) (name C))) "
    "(member attn (call (name CausalSelfAttention) (name C) (name H))) "
    "(forward (param x) (assign (name x) (binary + (name x) (call (name attn) (call (name ln_1) (name x))))) "
    "(return (name x)))) "
    "(member h (comprehension (call (name Block) (name C) (name H)) (name L))) "
    "(init h.*.attn.c_proj.weight (call (name normal) (number 0) (binary / (number 0.02) "
    "(call (name sqrt) (binary * (number 2) (name L)))))) "
    "(forward (param idx (type i32 (name B) (name T))) (name logits) "
    "(assign (name x) (binary + (call (name wte) (name idx)) (call (name wpe) (call (name arange) (name T))))) "
    "(for block (name h) (assign (name x) (call (name checkpoint) (call (name block) (name x))))) "
    "(assign (name q) (name k) (name v) (call (name split) (name x) (name C) (kwarg axis (unary - (number 1))))) "
    "(assign (name y) (index (name x) (slice - - -) (slice - (binary - (name T) (number 1)) -) "
    "(slice - - (number 2)))) "
    "(assign (name logits) (binary @ (name x) (call (name transpose) (attr (name wte) weight))))))";

/* ---- helpers ---- */

typedef struct {
    Diag d;
    uint16_t file;
    Token *toks;
    int32_t n;
} Lexed;

static void lex_n(Lexed *l, const char *src, size_t len)
{
    diag_init(&l->d, NULL);
    l->file = diag_add_source(&l->d, "t.kiln", src, len);
    l->n = lex_source(&l->d, l->file, &l->toks);
}
static void lex_str(Lexed *l, const char *src) { lex_n(l, src, strlen(src)); }
static void lex_done(Lexed *l)
{
    free(l->toks);
    diag_free(&l->d);
}

/* The token kinds of src as "IDENT DOT NUMBER EOF". */
static char *kinds_n(const char *src, size_t len, int *nerrors)
{
    Lexed l;
    lex_n(&l, src, len);
    StrBuf b;
    sb_init(&b);
    for (int32_t i = 0; i < l.n; i++) sb_printf(&b, "%s%s", i ? " " : "", tok_names[l.toks[i].kind]);
    if (nerrors) *nerrors = l.d.nerrors;
    lex_done(&l);
    return sb_take(&b);
}
static char *kinds(const char *src) { return kinds_n(src, strlen(src), NULL); }

#define ASSERT_KINDS(src, expected)                                \
    do {                                                           \
        char *got_ = kinds(src);                                   \
        cr_assert_str_eq(got_, expected, "lexing %s", src);       \
        free(got_);                                                \
    } while (0)

/* Parses src; returns the dump of the root and (if errs) everything reported. */
static char *parse_n(const char *src, size_t len, char **errs, int *nerrors)
{
    Diag d;
    diag_init(&d, NULL);
    uint16_t f = diag_add_source(&d, "t.kiln", src, len);
    Ast *a = ast_parse(&d, f);
    StrBuf b;
    sb_init(&b);
    ast_dump(a, a->root, &b);
    ast_free(a);
    if (errs) *errs = xstrdup(d.out.data ? d.out.data : "");
    if (nerrors) *nerrors = d.nerrors;
    diag_free(&d);
    return sb_take(&b);
}

/* The dump of a file that must parse without errors. */
static char *dump_ok(const char *src)
{
    char *errs;
    int n;
    char *out = parse_n(src, strlen(src), &errs, &n);
    cr_assert_eq(n, 0, "unexpected errors for %s:\n%s", src, errs);
    free(errs);
    return out;
}

#define ASSERT_DUMP(src, expected)                                \
    do {                                                          \
        char *got_ = dump_ok(src);                                \
        cr_assert_str_eq(got_, expected, "parsing %s", src);     \
        free(got_);                                               \
    } while (0)

/* The dump of `x = <expr>` inside a forward body, as just the value. */
static char *expr_dump(const char *expr)
{
    StrBuf src;
    sb_init(&src);
    sb_printf(&src, "forward() {\n    x = %s\n}\n", expr);
    char *full = dump_ok(src.data);
    sb_free(&src);
    const char *prefix = "(file (forward (assign (name x) ";
    cr_assert(strncmp(full, prefix, strlen(prefix)) == 0, "unexpected dump %s", full);
    size_t n = strlen(full) - strlen(prefix) - 3;
    char *out = xstrndup(full + strlen(prefix), n);
    free(full);
    return out;
}

#define ASSERT_EXPR(expr, expected)                               \
    do {                                                          \
        char *got_ = expr_dump(expr);                             \
        cr_assert_str_eq(got_, expected, "expression %s", expr); \
        free(got_);                                               \
    } while (0)

/* Everything reported for src, and the number of errors. */
static char *errors_of(const char *src, int *nerrors)
{
    char *errs;
    free(parse_n(src, strlen(src), &errs, nerrors));
    return errs;
}

/* The first line of what src reports, without the "t.kiln:" prefix. */
static char *first_error(const char *src)
{
    int n;
    char *errs = errors_of(src, &n);
    cr_assert(n > 0, "expected an error for %s", src);
    errs[strcspn(errs, "\n")] = 0;
    char *out = xstrdup(strncmp(errs, "t.kiln:", 7) == 0 ? errs + 7 : errs);
    free(errs);
    return out;
}

#define ASSERT_ERROR(src, expected)                              \
    do {                                                         \
        char *got_ = first_error(src);                           \
        cr_assert_str_eq(got_, expected, "source:\n%s", src);   \
        free(got_);                                              \
    } while (0)

/* Parses arbitrary bytes and checks that the tree is well formed: kids in range, -1 only
 * where a slice omits a part, and the dump terminates. */
static void parse_anything(const char *src, size_t len)
{
    Diag d;
    diag_init(&d, NULL);
    uint16_t f = diag_add_source(&d, "t.kiln", src, len);
    Ast *a = ast_parse(&d, f);
    cr_assert(a->root >= 0 && a->root < a->nnodes);
    cr_assert_eq(a->nodes[a->root].kind, AST_FILE);
    for (int32_t i = 0; i < a->nnodes; i++) {
        const AstNode *n = &a->nodes[i];
        cr_assert(n->kind < AST_KIND_COUNT);
        cr_assert(n->kids >= 0 && n->nkids >= 0 && n->kids + n->nkids <= a->nkids);
        for (int32_t k = 0; k < n->nkids; k++) {
            AstId kid = ast_kid(a, i, k);
            cr_assert(kid < a->nnodes);
            cr_assert(kid >= 0 || n->kind == AST_SLICE, "node %d (%s) has an absent kid", i,
                      ast_kind_name((AstKind)n->kind));
        }
    }
    StrBuf b;
    sb_init(&b);
    ast_dump(a, a->root, &b);
    sb_free(&b);
    ast_free(a);
    diag_finish(&d);
    diag_free(&d);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15u;
static uint32_t rnd(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state >> 32);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- lexer ---- */

Test(lex, operators)
{
    ASSERT_KINDS("( ) [ ] { } , : . = -> + - * / @ ** == != < <= > >=",
                 "LPAREN RPAREN LBRACKET RBRACKET LBRACE RBRACE COMMA COLON DOT ASSIGN ARROW PLUS MINUS "
                 "STAR SLASH AT POW EQ NE LT LE GT GE EOF");
    ASSERT_KINDS("a->b**c==d<=e>=f!=g", "IDENT ARROW IDENT POW IDENT EQ IDENT LE IDENT GE IDENT NE IDENT EOF");
    ASSERT_KINDS("***", "POW STAR EOF");
    ASSERT_KINDS("===", "EQ ASSIGN EOF");
    ASSERT_KINDS("- >", "MINUS GT EOF");
    ASSERT_KINDS("x[..., 0] h.0 ....", "IDENT LBRACKET ELLIPSIS COMMA NUMBER RBRACKET IDENT DOT NUMBER ELLIPSIS DOT EOF");
}

Test(lex, keywords_and_names)
{
    ASSERT_KINDS("model module const dim forward loss metric init train return for in and or not if else",
                 "KW_MODEL KW_MODULE KW_CONST KW_DIM KW_FORWARD KW_LOSS KW_METRIC KW_INIT KW_TRAIN "
                 "KW_RETURN KW_FOR KW_IN KW_AND KW_OR KW_NOT KW_IF KW_ELSE EOF");
    ASSERT_KINDS("models _x in_ for2 Dim x_1 _ NOT", "IDENT IDENT IDENT IDENT IDENT IDENT IDENT IDENT EOF");
}

Test(lex, numbers)
{
    Lexed l;
    lex_str(&l, "0 42 3.5 1e3 1E-3 2.5e+2 007 9223372036854775807");
    cr_assert_eq(l.d.nerrors, 0);
    cr_assert_eq(l.n, 9);
    const struct { bool is_int; double num; int64_t ival; uint32_t len; } want[] = {
        {true, 0, 0, 1},        {true, 42, 42, 2},   {false, 3.5, 3, 3},   {false, 1000, 1000, 3},
        {false, 1e-3, 0, 4},    {false, 250, 250, 6}, {true, 7, 7, 3},     {true, 9223372036854775807.0, INT64_MAX, 19},
    };
    for (int i = 0; i < 8; i++) {
        cr_assert_eq(l.toks[i].kind, TOK_NUMBER);
        cr_assert_eq(l.toks[i].is_int, want[i].is_int, "token %d", i);
        cr_assert_eq(l.toks[i].num, want[i].num, "token %d", i);
        cr_assert_eq(l.toks[i].len, want[i].len, "token %d", i);
        if (want[i].is_int) cr_assert_eq(l.toks[i].ival, want[i].ival, "token %d", i);
    }
    lex_done(&l);
}

Test(lex, number_edges)
{
    ASSERT_KINDS("h.0.attn", "IDENT DOT NUMBER DOT IDENT EOF");
    ASSERT_KINDS("h.1.2", "IDENT DOT NUMBER DOT NUMBER EOF");
    ASSERT_KINDS("0.5", "NUMBER EOF");
    ASSERT_KINDS("1.", "NUMBER DOT EOF");
    ASSERT_KINDS("1.x", "NUMBER DOT IDENT EOF");
    ASSERT_KINDS("2e", "NUMBER EOF"); /* reported as an invalid number */
    ASSERT_KINDS("3-1", "NUMBER MINUS NUMBER EOF");
    ASSERT_KINDS("1e-3-2", "NUMBER MINUS NUMBER EOF");
    Lexed l;
    lex_str(&l, "x.10");
    cr_assert_eq(l.toks[2].is_int, true);
    cr_assert_eq(l.toks[2].ival, 10);
    lex_done(&l);
}

Test(lex, integer_too_large)
{
    Lexed l;
    lex_str(&l, "x = 9223372036854775808");
    cr_assert_eq(l.d.nerrors, 1);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:5: error: integer literal too large\n"), "%s", l.d.out.data);
    cr_assert_eq(l.toks[2].ival, INT64_MAX);
    lex_done(&l);
    lex_str(&l, "99999999999999999999999999999999999999.5");
    cr_assert_eq(l.d.nerrors, 0, "a real literal may be large");
    lex_done(&l);
}

Test(lex, invalid_number_suffix)
{
    Lexed l;
    lex_str(&l, "x = 28x + 1");
    cr_assert_eq(l.d.nerrors, 1);
    cr_assert(strstr(l.d.out.data, "1:5: error: invalid number '28x'"), "%s", l.d.out.data);
    cr_assert_eq(l.n, 6, "the bad word is one token");
    lex_done(&l);
}

Test(lex, strings)
{
    Lexed l;
    lex_str(&l, "\"a b\" \"q\\\"\\\\\\n\\t\" \"\"");
    cr_assert_eq(l.d.nerrors, 0, "%s", l.d.out.data);
    cr_assert_eq(l.n, 4);
    cr_assert_eq(l.toks[0].kind, TOK_STRING);
    cr_assert_eq(l.toks[0].len, 5);
    cr_assert_eq(l.toks[1].len, 11);
    cr_assert_eq(l.toks[2].len, 2);
    lex_done(&l);
    ASSERT_EXPR("\"a \\\"b\\\" \\\\ c\\nd\\te\"", "(string \"a \\\"b\\\" \\\\ c\\nd\\te\")");
    ASSERT_EXPR("\"# not a comment ( [\"", "(string \"# not a comment ( [\")");
    ASSERT_EXPR("\"caf\xc3\xa9\"", "(string \"caf\xc3\xa9\")");
}

Test(lex, string_errors)
{
    Lexed l;
    lex_str(&l, "x = \"abc\ny = 1");
    cr_assert_eq(l.d.nerrors, 1);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:5: error: unterminated string\n"), "%s", l.d.out.data);
    ASSERT_KINDS("x = \"abc\ny = 1", "IDENT ASSIGN STRING NEWLINE IDENT ASSIGN NUMBER EOF");
    lex_done(&l);
    lex_str(&l, "\"abc");
    cr_assert(strstr(l.d.out.data, "1:1: error: unterminated string"), "%s", l.d.out.data);
    lex_done(&l);
    lex_str(&l, "\"abc\\");
    cr_assert(strstr(l.d.out.data, "1:1: error: unterminated string"), "%s", l.d.out.data);
    lex_done(&l);
    lex_str(&l, "\"a\\qb\" + 1");
    cr_assert_eq(l.d.nerrors, 1);
    cr_assert(strstr(l.d.out.data, "1:3: error: unknown escape '\\q' in string"), "%s", l.d.out.data);
    cr_assert_eq(l.n, 4, "the string still ends at its quote");
    lex_done(&l);
}

Test(lex, comments)
{
    ASSERT_KINDS("x # comment ( [ \" \xff\ny", "IDENT NEWLINE IDENT EOF");
    ASSERT_KINDS("# only a comment", "EOF");
    ASSERT_KINDS("# a\n# b\n\nx\n# c\n", "IDENT NEWLINE EOF");
    ASSERT_KINDS("f(a, # why\n  b)", "IDENT LPAREN IDENT COMMA IDENT RPAREN EOF");
}

Test(lex, newlines)
{
    ASSERT_KINDS("\n\n\nx\n\n\ny\n\n", "IDENT NEWLINE IDENT NEWLINE EOF");
    ASSERT_KINDS("f(a,\n b)\nc", "IDENT LPAREN IDENT COMMA IDENT RPAREN NEWLINE IDENT EOF");
    ASSERT_KINDS("[a,\n[b,\n c]]\nd", "LBRACKET IDENT COMMA LBRACKET IDENT COMMA IDENT RBRACKET RBRACKET NEWLINE IDENT EOF");
    ASSERT_KINDS("{\nx\n}", "LBRACE NEWLINE IDENT NEWLINE RBRACE EOF");
    ASSERT_KINDS("x; y;; z", "IDENT NEWLINE IDENT NEWLINE IDENT EOF");
    ASSERT_KINDS(";\n;x", "IDENT EOF");
    ASSERT_KINDS("f(a; b)", "IDENT LPAREN IDENT NEWLINE IDENT RPAREN EOF");
    ASSERT_KINDS("x\r\ny\r\n", "IDENT NEWLINE IDENT NEWLINE EOF");
    ASSERT_KINDS(")\nx", "RPAREN NEWLINE IDENT EOF"); /* a stray ')' does not go negative */
    /* An unclosed '(' is forgotten at a brace, so later lines keep their structure. */
    ASSERT_KINDS("x = f(a\n}\ny", "IDENT ASSIGN IDENT LPAREN IDENT RBRACE NEWLINE IDENT EOF");
}

Test(lex, locations)
{
    Lexed l;
    lex_str(&l, "ab  cd\n\tx = 1.5\r\n  \"s\" # c\n");
    cr_assert_eq(l.d.nerrors, 0);
    const struct { TokKind k; uint32_t line, col, start, len; } want[] = {
        {TOK_IDENT, 1, 1, 0, 2},   {TOK_IDENT, 1, 5, 4, 2},   {TOK_NEWLINE, 1, 7, 6, 1},
        {TOK_IDENT, 2, 2, 8, 1},   {TOK_ASSIGN, 2, 4, 10, 1}, {TOK_NUMBER, 2, 6, 12, 3},
        {TOK_NEWLINE, 2, 10, 16, 1}, {TOK_STRING, 3, 3, 19, 3}, {TOK_NEWLINE, 3, 10, 26, 1},
    };
    cr_assert_eq(l.n, 10);
    for (int i = 0; i < 9; i++) {
        cr_assert_eq(l.toks[i].kind, want[i].k, "token %d", i);
        cr_assert_eq(l.toks[i].loc.line, want[i].line, "token %d", i);
        cr_assert_eq(l.toks[i].loc.col, want[i].col, "token %d", i);
        cr_assert_eq(l.toks[i].start, want[i].start, "token %d", i);
        cr_assert_eq(l.toks[i].len, want[i].len, "token %d", i);
        cr_assert_eq(l.toks[i].loc.file, l.file);
    }
    /* End of file sits just after the last real token. */
    cr_assert_eq(l.toks[9].kind, TOK_EOF);
    cr_assert_eq(l.toks[9].loc.line, 3);
    cr_assert_eq(l.toks[9].loc.col, 6);
    lex_done(&l);
    lex_str(&l, "");
    cr_assert_eq(l.n, 1);
    cr_assert_eq(l.toks[0].kind, TOK_EOF);
    cr_assert_eq(l.toks[0].loc.line, 1);
    cr_assert_eq(l.toks[0].loc.col, 1);
    lex_done(&l);
}

Test(lex, bad_bytes)
{
    Lexed l;
    lex_str(&l, "x = $ 1 ! 2 `~?");
    cr_assert_eq(l.d.nerrors, 3, "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:5: error: unexpected character '$'\n"), "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:9: error: unexpected character '!'\n"), "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:13: error: unexpected character '`'\n"), "%s", l.d.out.data);
    lex_done(&l);
    ASSERT_KINDS("x = $ 1 ! 2", "IDENT ASSIGN NUMBER NUMBER EOF");

    const char bin[] = "a \xc3\xa9\x01\x00\xff b";
    lex_n(&l, bin, sizeof bin - 1);
    cr_assert_eq(l.d.nerrors, 1, "one report per run of bad bytes: %s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:3: error: unexpected byte 0xC3\n"), "%s", l.d.out.data);
    cr_assert_eq(l.n, 3);
    lex_done(&l);
}

Test(lex, unicode)
{
    /* A byte-order mark is skipped; columns stay byte columns. */
    Lexed l;
    lex_str(&l, "\xEF\xBB\xBFmodel m");
    cr_assert_eq(l.d.nerrors, 0, "%s", l.d.out.data);
    cr_assert_eq(l.toks[0].kind, TOK_KW_MODEL);
    cr_assert_eq(l.toks[0].loc.col, 4);
    lex_done(&l);
    /* A name with a non-ASCII letter is one error and one name token. */
    lex_str(&l, "gr\xC3\xB6\xC3\x9F" "e = f(\xC3\xBC" "ber)");
    cr_assert_eq(l.d.nerrors, 2, "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:1: error: non-ASCII character in name 'gr\xC3\xB6\xC3\x9F" "e' "
                                   "(names use A-Z, a-z, 0-9 and _)\n"), "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:13: error: non-ASCII character in name '\xC3\xBC" "ber'"), "%s",
              l.d.out.data);
    lex_done(&l);
    ASSERT_KINDS("gr\xC3\xB6\xC3\x9F" "e = f(\xC3\xBC" "ber)", "IDENT ASSIGN IDENT LPAREN IDENT RPAREN EOF");
    /* Non-ASCII bytes on their own are a bad-byte run, however they are mixed. */
    ASSERT_KINDS("a \xE2\x86\x92\x01\xC3\xA9 b", "IDENT IDENT EOF");
    /* Curly quotes make a string, reported once per string. */
    lex_str(&l, "idx(a = \xE2\x80\x9Cx.gz\xE2\x80\x9D, b = \"y\")");
    cr_assert_eq(l.d.nerrors, 1, "%s", l.d.out.data);
    cr_assert(strstr(l.d.out.data, "t.kiln:1:9: error: unexpected character '\xE2\x80\x9C' (U+201C): strings use "
                                   "straight quotes \"...\"\n"), "%s", l.d.out.data);
    lex_done(&l);
    ASSERT_KINDS("idx(a = \xE2\x80\x9Cx.gz\xE2\x80\x9D, b = \"y\")",
                 "IDENT LPAREN IDENT ASSIGN STRING COMMA IDENT ASSIGN STRING RPAREN EOF");
    char *errs;
    int n;
    const char *src = "const s = \xE2\x80\x9D" "a b\"\n";
    char *dump = parse_n(src, strlen(src), &errs, &n);
    cr_assert_eq(n, 1, "%s", errs);
    cr_assert_str_eq(dump, "(file (const s (string \"a b\")))");
    free(dump);
    free(errs);
}

Test(lex, error_cap)
{
    StrBuf b;
    sb_init(&b);
    for (int i = 0; i < 100; i++) sb_puts(&b, "x $ ");
    Lexed l;
    lex_str(&l, b.data);
    cr_assert_eq(l.d.nerrors, 20, "the lexer reports at most 20 errors per file");
    cr_assert_eq(l.n, 101);
    lex_done(&l);
    sb_free(&b);
}

Test(lex, token_desc)
{
    cr_assert_str_eq(lex_token_desc(TOK_EOF), "end of file");
    cr_assert_str_eq(lex_token_desc(TOK_NEWLINE), "end of line");
    cr_assert_str_eq(lex_token_desc(TOK_RPAREN), "')'");
    cr_assert_str_eq(lex_token_desc(TOK_KW_FORWARD), "'forward'");
    cr_assert_str_eq(lex_token_desc((TokKind)200), "token");
}

/* ---- parser: whole files ---- */

Test(parse, mlp_model) { ASSERT_DUMP(MLP, MLP_DUMP); }
Test(parse, module_example) { ASSERT_DUMP(GPT, GPT_DUMP); }

Test(parse, node_layout)
{
    Diag d;
    diag_init(&d, NULL);
    uint16_t f = diag_add_source(&d, "t.kiln", GPT, strlen(GPT));
    Ast *a = ast_parse(&d, f);
    cr_assert_eq(d.nerrors, 0);
    AstId mod = ast_kid(a, a->root, 0);
    cr_assert_eq(ast_node(a, mod)->kind, AST_MODULE);
    cr_assert_str_eq(ast_str(a, mod), "Block");
    cr_assert_eq(ast_node(a, mod)->aux, 2);
    cr_assert_eq(ast_node(a, mod)->loc.line, 1);
    cr_assert_eq(ast_node(a, mod)->loc.col, 8);
    AstId fwd = ast_kid(a, a->root, 3);
    const AstNode *fn = ast_node(a, fwd);
    cr_assert_eq(fn->kind, AST_FORWARD);
    cr_assert_eq(fn->aux, 1);
    cr_assert_eq(fn->aux2, 1);
    cr_assert_eq(fn->nkids, 1 + 1 + 5);
    AstId ty = ast_kid(a, ast_kid(a, fwd, 0), 0);
    cr_assert_eq(ast_node(a, ty)->kind, AST_TYPE);
    cr_assert_eq(ast_node(a, ty)->aux, DT_I32);
    AstId asg = ast_kid(a, fwd, 4); /* q, k, v = split(...) */
    cr_assert_eq(ast_node(a, asg)->aux, 3);
    cr_assert_eq(ast_node(a, asg)->loc.line, 14);
    cr_assert_eq(ast_node(a, asg)->loc.col, 5);
    AstId call = ast_kid(a, asg, 3);
    cr_assert_eq(ast_node(a, call)->kind, AST_CALL);
    cr_assert_eq(ast_node(a, call)->loc.col, 15, "a call sits at its callee");
    AstId neg = ast_kid(a, ast_kid(a, call, 3), 0);
    cr_assert_eq(ast_node(a, neg)->op, TOK_MINUS);
    AstId one = ast_kid(a, neg, 0);
    cr_assert_eq(ast_node(a, one)->aux, 1);
    cr_assert_eq(ast_node(a, one)->ival, 1);
    ast_free(a);
    diag_free(&d);
}

Test(parse, empty_and_blank_files)
{
    ASSERT_DUMP("", "(file)");
    ASSERT_DUMP("\n\n  \n# nothing\n", "(file)");
    ASSERT_DUMP("model m", "(file (model m))");
    ASSERT_DUMP("model m\n\n\n", "(file (model m))");
}

/* ---- parser: items ---- */

Test(parse, const_and_dim)
{
    ASSERT_DUMP("const C = 768\n", "(file (const C (number 768)))");
    ASSERT_DUMP("const a = 1, b = a * 2\n", "(file (const a (number 1)) (const b (binary * (name a) (number 2))))");
    ASSERT_DUMP("dim B\ndim T <= 1024\n", "(file (dim B) (dim T (number 1024)))");
    ASSERT_DUMP("dim T <= 4 * C", "(file (dim T (binary * (number 4) (name C))))");
}

Test(parse, modules)
{
    ASSERT_DUMP("module M() {}", "(file (module M))");
    ASSERT_DUMP("module M(C, p = 0.1, n = 2,) {\n  const k = C * 4\n  fc = Linear(C, k)\n"
                "  init fc.weight = zeros()\n  forward(x) { return fc(x) }\n}\n",
                "(file (module M (param C) (param p (number 0.1)) (param n (number 2)) (const k (binary * (name C) "
                "(number 4))) (member fc (call (name Linear) (name C) (name k))) (init fc.weight (call (name zeros))) "
                "(forward (param x) (return (call (name fc) (name x))))))");
    ASSERT_DUMP("module M(C) { fc = Linear(C, C) }", "(file (module M (param C) (member fc (call (name Linear) (name C) (name C)))))");
}

Test(parse, members)
{
    ASSERT_DUMP("fc1 = Linear(784, 256)", "(file (member fc1 (call (name Linear) (number 784) (number 256))))");
    ASSERT_DUMP("h = [Block(C, H) for 4]", "(file (member h (comprehension (call (name Block) (name C) (name H)) (number 4))))");
    ASSERT_DUMP("enc = nn.Encoder(d = 3)", "(file (member enc (call (attr (name nn) Encoder) (kwarg d (number 3)))))");
}

Test(parse, forwards)
{
    ASSERT_DUMP("forward() {}", "(file (forward))");
    ASSERT_DUMP("forward(a: f32[], b: bf16[B, T, 4 * C], c) -> y, z {\n  y, z = f(a, b)\n}",
                "(file (forward (param a (type f32)) (param b (type bf16 (name B) (name T) (binary * (number 4) (name C)))) "
                "(param c) (name y) (name z) (assign (name y) (name z) (call (name f) (name a) (name b)))))");
    ASSERT_DUMP("forward(x: bool[N]) {\n\n  y = x\n\n  return y, x\n}",
                "(file (forward (param x (type bool (name N))) (assign (name y) (name x)) (return (name y) (name x))))");
}

Test(parse, dtypes)
{
    const char *names[] = {"bool", "u8", "i32", "i64", "f16", "bf16", "f32", "f64"};
    for (int i = 0; i < 8; i++) {
        char src[64], want[96];
        snprintf(src, sizeof src, "forward(x: %s[2]) {}", names[i]);
        snprintf(want, sizeof want, "(file (forward (param x (type %s (number 2)))))", names[i]);
        ASSERT_DUMP(src, want);
    }
}

Test(parse, losses_metrics_inits_train)
{
    ASSERT_DUMP("loss(y) = mean(y)", "(file (loss (param y) (return (call (name mean) (name y)))))");
    ASSERT_DUMP("loss(p, t: i64[B]) {\n  e = p - t\n  return mean(e * e)\n}",
                "(file (loss (param p) (param t (type i64 (name B))) (assign (name e) (binary - (name p) (name t))) "
                "(return (call (name mean) (binary * (name e) (name e))))))");
    ASSERT_DUMP("metric acc = mean(a == b)", "(file (metric acc (call (name mean) (binary == (name a) (name b)))))");
    ASSERT_DUMP("init h.0.attn.weight = normal(0, 0.02)\ninit *.bias = zeros()\ninit w = ones()",
                "(file (init h.0.attn.weight (call (name normal) (number 0) (number 0.02))) "
                "(init *.bias (call (name zeros))) (init w (call (name ones))))");
    ASSERT_DUMP("train {}", "(file (train))");
    ASSERT_DUMP("train { batch = 64; epochs = 2 }\n",
                "(file (train (key batch (number 64)) (key epochs (number 2))))");
    ASSERT_DUMP("train {\n  schedule = cosine(warmup = 100)\n  loss = 1\n}",
                "(file (train (key schedule (call (name cosine) (kwarg warmup (number 100)))) (key loss (number 1))))");
}

/* ---- parser: statements ---- */

Test(parse, statements)
{
    ASSERT_DUMP("forward(x) { x = 1; y = 2 }", "(file (forward (param x) (assign (name x) (number 1)) (assign (name y) (number 2))))");
    ASSERT_DUMP("forward(x) {\n  for b in h {\n    for c in b.subs { x = c(x) }\n  }\n  return x\n}",
                "(file (forward (param x) (for b (name h) (for c (attr (name b) subs) (assign (name x) "
                "(call (name c) (name x))))) (return (name x))))");
    ASSERT_DUMP("forward(x) { for i in range(3) {} }", "(file (forward (param x) (for i (call (name range) (number 3)))))");
    ASSERT_DUMP("forward(x) {\n  loss = f(x)\n  dim = mean(x, dim = 1)\n}",
                "(file (forward (param x) (assign (name loss) (call (name f) (name x))) (assign (name dim) "
                "(call (name mean) (name x) (kwarg dim (number 1))))))");
}

Test(parse, compile_time_if)
{
    ASSERT_DUMP("forward(x) { if a { x = 1 } }", "(file (forward (param x) (if (name a) (block (assign (name x) (number 1))))))");
    ASSERT_DUMP("forward(x) {\n  if a > 1 and not b {\n    x = 1\n  } else {\n    return x\n  }\n}",
                "(file (forward (param x) (if (binary and (binary > (name a) (number 1)) (unary not (name b))) "
                "(block (assign (name x) (number 1))) (block (return (name x))))))");
    /* else if chains, and an else on the next line */
    ASSERT_DUMP("forward(x) {\n  if a { } else if b { x = 2 }\n  else { x = 3 }\n}",
                "(file (forward (param x) (if (name a) (block) (block (if (name b) (block (assign (name x) (number 2))) "
                "(block (assign (name x) (number 3))))))))");
    ASSERT_DUMP("module M(C, D) {\n  if C != D { proj = Linear(C, D); const k = 2 } else { init fc.weight = zeros() }\n"
                "  forward(x) { return x }\n}",
                "(file (module M (param C) (param D) (if (binary != (name C) (name D)) (block (member proj (call (name Linear) "
                "(name C) (name D))) (const k (number 2))) (block (init fc.weight (call (name zeros))))) (forward (param x) "
                "(return (name x)))))");
    ASSERT_DUMP("if WIDE { fc = Linear(4, 4) }", "(file (if (name WIDE) (block (member fc (call (name Linear) (number 4) (number 4))))))");
    ASSERT_ERROR("forward(x) { if a x = 1 }", "1:19: error: expected '{' after the condition of 'if', found 'x'");
    ASSERT_ERROR("forward(x) { else { x = 1 } }", "1:14: error: expected a statement: `name = expr`, `return`, `for` or `if`, found 'else'");
}

/* ---- parser: expressions ---- */

Test(expr, atoms)
{
    ASSERT_EXPR("784", "(number 784)");
    ASSERT_EXPR("0.5", "(number 0.5)");
    ASSERT_EXPR("1e-3", "(number 0.001)");
    ASSERT_EXPR("2.0", "(number 2.0)");
    ASSERT_EXPR("1e300", "(number 1e+300)");
    ASSERT_EXPR("\"a b\"", "(string \"a b\")");
    ASSERT_EXPR("abc", "(name abc)");
    ASSERT_EXPR("(((abc)))", "(name abc)");
    ASSERT_EXPR("dim", "(name dim)");
    ASSERT_EXPR("init + train + model + metric + forward + loss",
                "(binary + (binary + (binary + (binary + (binary + (name init) (name train)) (name model)) "
                "(name metric)) (name forward)) (name loss))");
}

Test(expr, arithmetic_precedence)
{
    ASSERT_EXPR("a + b * c", "(binary + (name a) (binary * (name b) (name c)))");
    ASSERT_EXPR("a * b + c", "(binary + (binary * (name a) (name b)) (name c))");
    ASSERT_EXPR("a - b - c", "(binary - (binary - (name a) (name b)) (name c))");
    ASSERT_EXPR("a / b / c", "(binary / (binary / (name a) (name b)) (name c))");
    ASSERT_EXPR("a / b * c @ d", "(binary @ (binary * (binary / (name a) (name b)) (name c)) (name d))");
    ASSERT_EXPR("x @ w + b", "(binary + (binary @ (name x) (name w)) (name b))");
    ASSERT_EXPR("(a + b) * c", "(binary * (binary + (name a) (name b)) (name c))");
    ASSERT_EXPR("a+-b", "(binary + (name a) (unary - (name b)))");
}

Test(expr, unary_and_power)
{
    ASSERT_EXPR("-x", "(unary - (name x))");
    ASSERT_EXPR("+x", "(unary + (name x))");
    ASSERT_EXPR("--x", "(unary - (unary - (name x)))");
    ASSERT_EXPR("-x ** 2", "(unary - (binary ** (name x) (number 2)))");
    ASSERT_EXPR("a ** b ** c", "(binary ** (name a) (binary ** (name b) (name c)))");
    ASSERT_EXPR("2 ** -1", "(binary ** (number 2) (unary - (number 1)))");
    ASSERT_EXPR("-a * b", "(binary * (unary - (name a)) (name b))");
    ASSERT_EXPR("a * b ** 2", "(binary * (name a) (binary ** (name b) (number 2)))");
    ASSERT_EXPR("x.w ** 2", "(binary ** (attr (name x) w) (number 2))");
    ASSERT_EXPR("f(x)[0] ** 2", "(binary ** (index (call (name f) (name x)) (number 0)) (number 2))");
}

Test(expr, logic_and_comparison)
{
    ASSERT_EXPR("a == b + 1", "(binary == (name a) (binary + (name b) (number 1)))");
    ASSERT_EXPR("a != b", "(binary != (name a) (name b))");
    ASSERT_EXPR("a < b", "(binary < (name a) (name b))");
    ASSERT_EXPR("a <= b", "(binary <= (name a) (name b))");
    ASSERT_EXPR("a > b", "(binary > (name a) (name b))");
    ASSERT_EXPR("a >= b", "(binary >= (name a) (name b))");
    ASSERT_EXPR("(a < b) < c", "(binary < (binary < (name a) (name b)) (name c))");
    ASSERT_EXPR("not a == b", "(unary not (binary == (name a) (name b)))");
    ASSERT_EXPR("not not a", "(unary not (unary not (name a)))");
    ASSERT_EXPR("not a and b or c", "(binary or (binary and (unary not (name a)) (name b)) (name c))");
    ASSERT_EXPR("a or b and c", "(binary or (name a) (binary and (name b) (name c)))");
    ASSERT_EXPR("a or b or c", "(binary or (binary or (name a) (name b)) (name c))");
    ASSERT_EXPR("a and b and c", "(binary and (binary and (name a) (name b)) (name c))");
    ASSERT_EXPR("a < b and c > d", "(binary and (binary < (name a) (name b)) (binary > (name c) (name d)))");
}

Test(expr, calls)
{
    ASSERT_EXPR("f()", "(call (name f))");
    ASSERT_EXPR("f(a, b,)", "(call (name f) (name a) (name b))");
    ASSERT_EXPR("f(a, k = 1)", "(call (name f) (name a) (kwarg k (number 1)))");
    ASSERT_EXPR("mean(x, dim = 1)", "(call (name mean) (name x) (kwarg dim (number 1)))");
    ASSERT_EXPR("f(loss = 1, init = 2, train = 3)",
                "(call (name f) (kwarg loss (number 1)) (kwarg init (number 2)) (kwarg train (number 3)))");
    ASSERT_EXPR("f(a == b)", "(call (name f) (binary == (name a) (name b)))");
    ASSERT_EXPR("f(x)(y)", "(call (call (name f) (name x)) (name y))");
    ASSERT_EXPR("f(\n  a,\n  b = 2\n)", "(call (name f) (name a) (kwarg b (number 2)))");
}

Test(expr, lists)
{
    ASSERT_EXPR("[]", "(list)");
    ASSERT_EXPR("[1]", "(list (number 1))");
    ASSERT_EXPR("[1, 2, 3,]", "(list (number 1) (number 2) (number 3))");
    ASSERT_EXPR("[[1], [a + b]]", "(list (list (number 1)) (list (binary + (name a) (name b))))");
    ASSERT_EXPR("[Block(C) for n * 2]", "(comprehension (call (name Block) (name C)) (binary * (name n) (number 2)))");
    ASSERT_EXPR("[1, 2][0]", "(index (list (number 1) (number 2)) (number 0))");
}

Test(expr, subscripts_and_slices)
{
    ASSERT_EXPR("x[0]", "(index (name x) (number 0))");
    ASSERT_EXPR("x[i, j + 1]", "(index (name x) (name i) (binary + (name j) (number 1)))");
    ASSERT_EXPR("x[:]", "(index (name x) (slice - - -))");
    ASSERT_EXPR("x[1:]", "(index (name x) (slice (number 1) - -))");
    ASSERT_EXPR("x[:2]", "(index (name x) (slice - (number 2) -))");
    ASSERT_EXPR("x[::2]", "(index (name x) (slice - - (number 2)))");
    ASSERT_EXPR("x[1:2:3]", "(index (name x) (slice (number 1) (number 2) (number 3)))");
    ASSERT_EXPR("x[1::]", "(index (name x) (slice (number 1) - -))");
    ASSERT_EXPR("x[-1:, :]", "(index (name x) (slice (unary - (number 1)) - -) (slice - - -))");
    ASSERT_EXPR("x[0][1]", "(index (index (name x) (number 0)) (number 1))");
    ASSERT_EXPR("x[..., 0]", "(index (name x) (ellipsis) (number 0))");
    ASSERT_EXPR("x[:, none, ...]", "(index (name x) (slice - - -) (name none) (ellipsis))");
}

Test(expr, attributes)
{
    ASSERT_EXPR("wte.weight", "(attr (name wte) weight)");
    ASSERT_EXPR("h.0.attn", "(attr (attr (name h) 0) attn)");
    ASSERT_EXPR("h.1.2", "(attr (attr (name h) 1) 2)");
    ASSERT_EXPR("a.b(c).d", "(attr (call (attr (name a) b) (name c)) d)");
    ASSERT_EXPR("x.dim", "(attr (name x) dim)");
}

/* ---- errors ---- */

Test(errors, messages)
{
    ASSERT_ERROR("forward(x) {\n    y = f(a, b\n}", "3:1: error: expected ')' to close '(' at 2:10, found '}'");
    ASSERT_ERROR("forward(x) { y = f(a; }", "1:21: error: expected ')' to close '(' at 1:19, found end of line");
    ASSERT_ERROR("const a = (1 + 2", "1:17: error: expected ')' to close '(' at 1:11, found end of file");
    ASSERT_ERROR("const a = [1, 2", "1:16: error: expected ']' to close '[' at 1:11, found end of file");
    ASSERT_ERROR("forward(x) {\n  foo(x)\n}",
                 "2:3: error: expected a statement: `name = expr`, `return`, `for` or `if`, found 'foo'");
    ASSERT_ERROR("forward(x) { 1 }", "1:14: error: expected a statement: `name = expr`, `return`, `for` or `if`, found '1'");
    ASSERT_ERROR("forward(x: f33[B]) {}", "1:12: error: unknown dtype 'f33' (did you mean 'f32'?)");
    ASSERT_ERROR("forward(x: bf61[B]) {}", "1:12: error: unknown dtype 'bf61' (did you mean 'bf16'?)");
    ASSERT_ERROR("forward(x: f23[B]) {}", "1:12: error: unknown dtype 'f23' (did you mean 'f32'?)");
    ASSERT_ERROR("forward(x: float[B]) {}", "1:12: error: unknown dtype 'float' (did you mean 'f32'?)");
    ASSERT_ERROR("forward(x: int64[B]) {}", "1:12: error: unknown dtype 'int64' (did you mean 'i64'?)");
    ASSERT_ERROR("forward(x: u9[B]) {}", "1:12: error: unknown dtype 'u9' (did you mean 'u8'?)");
    ASSERT_ERROR("forward(x: tensor[B]) {}",
                 "1:12: error: unknown dtype 'tensor' (expected bool, u8, i32, i64, f16, bf16, f32 or f64)");
    ASSERT_ERROR("forward(x: f32) {}", "1:15: error: expected '[' after the dtype (a scalar is written f32[]), found ')'");
    ASSERT_ERROR("const a = x < y < z", "1:17: error: comparison operators cannot be chained; add parentheses");
    ASSERT_ERROR("const a = x == y != z", "1:18: error: comparison operators cannot be chained; add parentheses");
    ASSERT_ERROR("x + 1",
                 "1:1: error: expected an item at top level: const, dim, module, member `name = Layer(...)`, "
                 "forward, loss, metric, init, train or if; found 'x'");
    ASSERT_ERROR("return 1",
                 "1:1: error: expected an item at top level: const, dim, module, member `name = Layer(...)`, "
                 "forward, loss, metric, init, train or if; found 'return'");
    ASSERT_ERROR("module M() { return 1 }",
                 "1:14: error: expected a module item: const, member `name = Layer(...)`, forward, init or if; found 'return'");
    ASSERT_ERROR("forward(x) {\n  y = x\n", "2:8: error: expected '}' to close '{' at 1:12, found end of file");
    ASSERT_ERROR("x = 3", "1:5: error: a member must be a layer: `name = Layer(...)` or `name = [Layer(...) for n]` "
                          "(use `const` for a value)");
    ASSERT_ERROR("const a = 1 2", "1:13: error: expected end of line, found '2'");
    ASSERT_ERROR("const a = f(1 2)", "1:15: error: expected ')' to close '(' at 1:12, found '2'");
    ASSERT_ERROR("const a = \"s\" \"t\"", "1:15: error: expected end of line, found \"t\"");
    ASSERT_ERROR("const = 1", "1:7: error: expected a constant name after 'const', found '='");
    ASSERT_ERROR("forward x", "1:9: error: expected '(' after 'forward', found 'x'");
    ASSERT_ERROR("forward(x) -> {}", "1:15: error: expected an output name after '->', found '{'");
    ASSERT_ERROR("forward(x) y", "1:12: error: expected '{' to start the forward body, found 'y'");
    ASSERT_ERROR("forward(1) {}", "1:9: error: expected a parameter name, found '1'");
    ASSERT_ERROR("loss(x) x", "1:9: error: expected '=' or '{' after the loss parameters, found 'x'");
    ASSERT_ERROR("forward() { for 1 in x {} }", "1:17: error: expected a loop variable after 'for', found '1'");
    ASSERT_ERROR("forward() { for i x {} }", "1:19: error: expected 'in' after the loop variable, found 'x'");
    ASSERT_ERROR("forward() { a, 1 = x }", "1:16: error: expected a name to assign to, found '1'");
    ASSERT_ERROR("forward() { a, b == x }", "1:18: error: expected '=' after the assignment targets, found '=='");
    ASSERT_ERROR("init a.(b) = 1", "1:8: error: expected a parameter name, index or '*' in the init pattern, found '('");
    ASSERT_ERROR("train { 1 }", "1:9: error: expected a training setting `name = value`, found '1'");
    ASSERT_ERROR("const a = x.(1)", "1:13: error: expected an attribute name or index after '.', found '('");
    ASSERT_ERROR("const a = x[]", "1:13: error: expected an expression, found ']'");
    ASSERT_ERROR("const a = ", "1:10: error: expected an expression, found end of file");
    ASSERT_ERROR("dim T\nmodel m", "2:1: error: 'model' must be the first line of the file");
    ASSERT_ERROR("}", "1:1: error: expected an item at top level: const, dim, module, member `name = Layer(...)`, "
                      "forward, loss, metric, init, train or if; found '}'");
}

Test(errors, caret_and_source_line)
{
    int n;
    char *errs = errors_of("forward(x) {\n    y = f(a, b\n}\n", &n);
    cr_assert_eq(n, 1);
    cr_assert_str_eq(errs, "t.kiln:3:1: error: expected ')' to close '(' at 2:10, found '}'\n    }\n    ^\n");
    free(errs);
}

Test(errors, recovery_reports_every_error)
{
    int n;
    char *errs = errors_of("fc1 = Linear(784 256)\n"
                           "forward(x) {\n"
                           "    y = relu(x +)\n"
                           "    z = y\n"
                           "    w = z z\n"
                           "    for b in h { q = ] }\n"
                           "}\n"
                           "loss(x) = mean(x)\n"
                           "metric = 3\n"
                           "train { lr = }\n",
                           &n);
    cr_assert_eq(n, 6, "%s", errs);
    cr_assert(strstr(errs, "t.kiln:1:18: error: expected ')' to close '(' at 1:13, found '256'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:3:17: error: expected an expression, found ')'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:5:11: error: expected end of line, found 'z'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:6:22: error: expected an expression, found ']'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:9:8: error: expected a metric name after 'metric', found '='"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:10:14: error: expected an expression, found '}'"), "%s", errs);
    free(errs);
}

Test(errors, recovery_keeps_good_items)
{
    char *errs;
    int n;
    const char *src = "a = Linear(1 2)\nb = Linear(3)\nforward(x) {\n  y = (\n  z = b(x)\n}\n";
    char *dump = parse_n(src, strlen(src), &errs, &n);
    cr_assert_eq(n, 2, "%s", errs);
    cr_assert_str_eq(dump, "(file (member b (call (name Linear) (number 3))) "
                           "(forward (param x) (assign (name z) (call (name b) (name x)))))");
    free(dump);
    free(errs);
}

Test(errors, unclosed_paren_does_not_swallow_the_file)
{
    int n;
    char *errs = errors_of("fc = Linear(3, 4\nforward(x) {\n  y = f(x\n  z = g(\n}\nloss(y) = 1 +\n", &n);
    cr_assert_eq(n, 4, "%s", errs);
    cr_assert(strstr(errs, "t.kiln:2:1: error: expected ')' to close '(' at 1:12, found 'forward'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:4:3: error: expected ')' to close '(' at 3:8, found 'z'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:5:1: error: expected an expression, found '}'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:6:14: error: expected an expression, found end of line"), "%s", errs);
    free(errs);
}

Test(errors, missing_close_brace_before_next_item)
{
    int n;
    char *errs;
    const char *src = "forward(x) -> y {\n  y = f(x)\n  for b in h {\n    y = b(y)\n\n"
                      "loss(y) = mean(y)\nmetric m = y\ntrain { loss = 1 }\n";
    char *dump = parse_n(src, strlen(src), &errs, &n);
    cr_assert_eq(n, 1, "%s", errs);
    cr_assert(strstr(errs, "t.kiln:6:1: error: expected '}' to close '{' at 3:14, found 'loss' "
                           "(which starts a top-level item)\n"), "%s", errs);
    cr_assert_str_eq(dump, "(file (forward (param x) (name y) (assign (name y) (call (name f) (name x))) "
                           "(for b (name h) (assign (name y) (call (name b) (name y))))) "
                           "(loss (param y) (return (call (name mean) (name y)))) (metric m (name y)) "
                           "(train (key loss (number 1))))");
    free(dump);
    free(errs);
    ASSERT_ERROR("module M() {\n  fc = Linear(1, 2)\nmodule N() {}\n",
                 "3:1: error: expected '}' to close '{' at 1:12, found 'module' (which starts a top-level item)");
}

Test(errors, nothing_after_an_unterminated_string)
{
    int n;
    char *errs = errors_of("train {\n  data = idx(image = \"a.gz,\n    label = \"b.gz\")\n  batch = 1\n}\n", &n);
    cr_assert_eq(n, 1, "%s", errs);
    cr_assert(strstr(errs, "t.kiln:2:22: error: unterminated string\n"), "%s", errs);
    free(errs);
}

Test(errors, stops_after_100)
{
    StrBuf b;
    sb_init(&b);
    for (int i = 0; i < 500; i++) sb_puts(&b, "x +\n");
    int n;
    char *errs = errors_of(b.data, &n);
    cr_assert_eq(n, 100);
    free(errs);
    sb_free(&b);
}

Test(errors, lexer_and_parser_errors_together)
{
    int n;
    char *errs = errors_of("fc = Linear(3, $4)\nforward(x) { y = x ! 2 }\n", &n);
    cr_assert(strstr(errs, "t.kiln:1:16: error: unexpected character '$'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:2:20: error: unexpected character '!'"), "%s", errs);
    cr_assert(strstr(errs, "t.kiln:2:22: error: expected end of line, found '2'"), "%s", errs);
    cr_assert_eq(n, 3, "%s", errs);
    free(errs);
}

/* ---- nesting limit ---- */

static char *repeat_wrap(const char *pre, const char *open, int n, const char *mid, const char *close,
                         const char *post)
{
    StrBuf b;
    sb_init(&b);
    sb_puts(&b, pre);
    for (int i = 0; i < n; i++) sb_puts(&b, open);
    sb_puts(&b, mid);
    for (int i = 0; i < n; i++) sb_puts(&b, close);
    sb_puts(&b, post);
    return sb_take(&b);
}

static int nerrors_of(const char *src, const char *must_contain)
{
    int n;
    char *errs = errors_of(src, &n);
    if (must_contain) cr_assert(strstr(errs, must_contain), "%.300s", errs);
    free(errs);
    return n;
}

Test(depth, parentheses)
{
    char *ok = repeat_wrap("const a = ", "(", 200, "1", ")", "\n");
    cr_assert_eq(nerrors_of(ok, NULL), 0);
    free(ok);
    char *deep = repeat_wrap("const a = ", "(", 201, "1", ")", "\nconst b = )\n");
    cr_assert_eq(nerrors_of(deep, "t.kiln:1:211: error: nesting deeper than 200 levels\n"), 2);
    free(deep);
    char *huge = repeat_wrap("const a = ", "(", 100000, "1", ")", "\n");
    cr_assert_eq(nerrors_of(huge, "nesting deeper than 200 levels"), 1);
    free(huge);
    char *unclosed = repeat_wrap("const a = ", "(", 100000, "1", "", "\n");
    cr_assert_eq(nerrors_of(unclosed, "nesting deeper than 200 levels"), 1);
    free(unclosed);
}

Test(depth, every_kind_of_nesting)
{
    const char *cases[][5] = {
        {"const a = ", "[", "1", "]", "\n"},
        {"const a = ", "f(", "1", ")", "\n"},
        {"const a = ", "x[", "1", "]", "\n"},
        {"const a = ", "-", "1", "", "\n"},
        {"const a = ", "not ", "1", "", "\n"},
        {"const a = ", "2 ** ", "1", "", "\n"},
        {"const a = ", "f(k = ", "1", ")", "\n"},
        {"forward() { ", "for i in h { ", "x = 1", " }", " }\n"},
        {"const a = ", "1 + ", "1", "", "\n"},
        {"const a = ", "1 or ", "1", "", "\n"},
        {"const a = x", ".a", "", "", "\n"},
        {"const a = f", "(1)", "", "", "\n"},
        {"const a = x", "[0]", "", "", "\n"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *src = repeat_wrap(cases[i][0], cases[i][1], 100000, cases[i][2], cases[i][3], cases[i][4]);
        int n = nerrors_of(src, "nesting deeper than 200 levels");
        cr_assert_eq(n, 1, "case %zu (%s)", i, cases[i][1]);
        free(src);
        char *fine = repeat_wrap(cases[i][0], cases[i][1], 50, cases[i][2], cases[i][3], cases[i][4]);
        cr_assert_eq(nerrors_of(fine, NULL), 0, "case %zu (%s) at depth 50", i, cases[i][1]);
        free(fine);
    }
    /* A flat chain is told how to fix it. */
    char *chain = repeat_wrap("const a = 1", " + 1", 1000, "", "", "\n");
    cr_assert_eq(nerrors_of(chain, "nesting deeper than 200 levels (split this long expression"), 1);
    free(chain);
}

Test(depth, braces)
{
    char *src = repeat_wrap("forward(x) ", "{", 100000, "", "}", "\nconst a = 1\n");
    cr_assert_eq(nerrors_of(src, NULL), 1);
    free(src);
    char *mod = repeat_wrap("module M() ", "{", 100000, "", "}", "\nconst a = )\n");
    cr_assert_eq(nerrors_of(mod, NULL), 2);
    free(mod);
}

/* ---- robustness ---- */

Test(robust, every_prefix_of_real_models)
{
    const char *models[] = {MLP, GPT};
    for (int m = 0; m < 2; m++) {
        size_t len = strlen(models[m]);
        for (size_t i = 0; i <= len; i++) parse_anything(models[m], i);
    }
}

Test(robust, every_suffix_and_single_byte_mutation)
{
    size_t len = strlen(GPT);
    char *buf = xmalloc(len + 1);
    const char repl[] = "\0\n{}()[]=:.,\"#;!x1*";
    for (size_t i = 0; i < len; i++) {
        parse_anything(GPT + i, len - i);
        for (size_t r = 0; r < sizeof repl - 1; r += 3) {
            memcpy(buf, GPT, len);
            buf[i] = repl[(r + i) % (sizeof repl - 1)];
            parse_anything(buf, len);
        }
        /* deletion */
        memcpy(buf, GPT, i);
        memcpy(buf + i, GPT + i + 1, len - i - 1);
        parse_anything(buf, len - 1);
    }
    free(buf);
}

Test(robust, random_bytes)
{
    char *buf = xmalloc(65536);
    for (int round = 0; round < 40; round++) {
        size_t len = rnd() % 65536;
        for (size_t i = 0; i < len; i++) buf[i] = (char)rnd();
        parse_anything(buf, len);
    }
    free(buf);
}

Test(robust, random_token_soup)
{
    static const char *const words[] = {
        "model", "module", "const", "dim", "forward", "loss", "metric", "init", "train", "return", "for", "in",
        "and", "or", "not", "x", "Linear", "1", "2.5", "\"s\"", "(", ")", "[", "]", "{", "}", ",", ":", ".",
        "=", "->", "+", "-", "*", "/", "@", "**", "==", "!=", "<", "<=", ">", ">=", "\n", ";", " ", "f32",
        "#c\n",
    };
    const size_t nwords = sizeof words / sizeof *words;
    StrBuf b;
    sb_init(&b);
    for (int round = 0; round < 300; round++) {
        b.len = 0;
        int n = (int)(rnd() % 400);
        for (int i = 0; i < n; i++) {
            sb_puts(&b, words[rnd() % nwords]);
            sb_putc(&b, ' ');
        }
        parse_anything(b.data ? b.data : "", b.len);
    }
    sb_free(&b);
}

Test(robust, big_inputs)
{
    /* A 1 MB line: one call with 200k arguments. */
    StrBuf b;
    sb_init(&b);
    sb_puts(&b, "fc = Linear(");
    for (int i = 0; i < 200000; i++) sb_puts(&b, "x_1, ");
    sb_puts(&b, "1)\n");
    double t0 = now();
    cr_assert_eq(nerrors_of(b.data, NULL), 0);
    sb_free(&b);
    /* A 10 MB file of real items. */
    sb_init(&b);
    while (b.len < (10u << 20)) sb_puts(&b, GPT);
    cr_assert_eq(nerrors_of(b.data, NULL), 0);
    /* The same 10 MB with an error on every item, and as one line of garbage. */
    for (size_t i = 0; i < b.len; i++)
        if (b.data[i] == '(' && i % 7 == 0) b.data[i] = '$';
    parse_anything(b.data, b.len);
    for (size_t i = 0; i < b.len; i++)
        if (b.data[i] == '\n') b.data[i] = ' ';
    parse_anything(b.data, b.len);
    sb_free(&b);
    /* Generous: linear time is a few hundred ms even under sanitizers; quadratic is minutes. */
    cr_assert_lt(now() - t0, 30.0);
}

Test(robust, invalid_file_index)
{
    Diag d;
    diag_init(&d, NULL);
    Ast *a = ast_parse(&d, 7);
    cr_assert_eq(a->nodes[a->root].kind, AST_FILE);
    cr_assert_eq(a->nodes[a->root].nkids, 0);
    ast_free(a);
    ast_free(NULL);
    diag_free(&d);
}

Test(dump, kind_names_and_absent)
{
    cr_assert_str_eq(ast_kind_name(AST_FILE), "file");
    cr_assert_str_eq(ast_kind_name(AST_COMPREHENSION), "comprehension");
    cr_assert_str_eq(ast_kind_name(AST_TYPE), "type");
    cr_assert_str_eq(ast_kind_name(AST_KIND_COUNT), "?");
    Ast a;
    memset(&a, 0, sizeof a);
    StrBuf b;
    sb_init(&b);
    ast_dump(&a, AST_NONE, &b);
    cr_assert_str_eq(b.data, "-");
    sb_free(&b);
}

Test(dump, string_escaping)
{
    ASSERT_EXPR("\"tab\\there\"", "(string \"tab\\there\")");
    /* A NUL in a string is reported and dropped; other control bytes are shown as \xNN. */
    const char src[] = "const s = \"a\x01" "b\"";
    char *errs;
    int n;
    char *dump = parse_n(src, sizeof src - 1, &errs, &n);
    cr_assert_eq(n, 0, "%s", errs);
    cr_assert_str_eq(dump, "(file (const s (string \"a\\x01b\")))");
    free(dump);
    free(errs);
    const char nul[] = "const s = \"a\0b\"";
    dump = parse_n(nul, sizeof nul - 1, &errs, &n);
    cr_assert_eq(n, 1, "%s", errs);
    cr_assert(strstr(errs, "1:13: error: unexpected byte 0x00 in string"), "%s", errs);
    cr_assert_str_eq(dump, "(file (const s (string \"ab\")))");
    free(dump);
    free(errs);
}
