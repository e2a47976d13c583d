/* frontend.h — the model language: lexer, parser (AST), checker and lowering to the IR.
 *
 * The pipeline is  text --lex--> tokens --parse--> Ast --check+lower--> Graph.
 * The grammar is in docs/language.md. Every stage reports through a Diag and never stops
 * at the first error: the lexer skips bad bytes, the parser resynchronises at the next
 * statement, the checker keeps going with an error value. Nothing the user writes may
 * crash, hang or leak: recursion depth, token counts and sizes are all bounded. */
#ifndef KILN_FRONTEND_H
#define KILN_FRONTEND_H

#include "../ir/ir.h"

/* ---- tokens ---- */
#define KILN_TOKENS(T)                                   \
    T(EOF, "end of file") T(NEWLINE, "end of line")      \
    T(IDENT, "name") T(NUMBER, "number") T(STRING, "string") \
    T(LPAREN, "'('") T(RPAREN, "')'") T(LBRACKET, "'['") T(RBRACKET, "']'") \
    T(LBRACE, "'{'") T(RBRACE, "'}'") T(COMMA, "','") T(COLON, "':'") T(DOT, "'.'") \
    T(ASSIGN, "'='") T(ARROW, "'->'") T(PLUS, "'+'") T(MINUS, "'-'") T(STAR, "'*'") \
    T(SLASH, "'/'") T(FLOORDIV, "'//'") T(PERCENT, "'%'") T(AT, "'@'") T(POW, "'**'") T(EQ, "'=='") T(NE, "'!='") T(LT, "'<'") \
    T(LE, "'<='") T(GT, "'>'") T(GE, "'>='") T(ELLIPSIS, "'...'") \
    /* keywords */ \
    T(KW_MODEL, "'model'") T(KW_MODULE, "'module'") T(KW_CONST, "'const'") T(KW_DIM, "'dim'") \
    T(KW_FORWARD, "'forward'") T(KW_LOSS, "'loss'") T(KW_METRIC, "'metric'") T(KW_INIT, "'init'") \
    T(KW_TRAIN, "'train'") T(KW_RETURN, "'return'") T(KW_FOR, "'for'") T(KW_IN, "'in'") \
    T(KW_AND, "'and'") T(KW_OR, "'or'") T(KW_NOT, "'not'") T(KW_IF, "'if'") T(KW_ELSE, "'else'")

typedef enum {
#define TOK_ENUM(e, desc) TOK_##e,
    KILN_TOKENS(TOK_ENUM)
#undef TOK_ENUM
    TOK_COUNT
} TokKind;

typedef struct {
    uint8_t kind;  /* TokKind */
    bool is_int;   /* NUMBER: written without '.', exponent or suffix */
    Loc loc;
    uint32_t start, len; /* byte range in the source text */
    double num;    /* NUMBER value */
    int64_t ival;  /* NUMBER value when is_int (saturated: a too-large literal is an error) */
} Token;

const char *lex_token_desc(TokKind k);
/* Tokenizes source `file` of d. NEWLINE tokens are produced only outside ( ) and [ ];
 * ';' also ends a statement; '#' starts a comment to end of line. Returns the number of
 * tokens (the last is EOF); errors are reported to d and the bad bytes skipped. */
int32_t lex_source(Diag *d, uint16_t file, Token **out);

/* ---- the AST ----
 * Nodes live in one array and refer to their children by index (kids), like the IR.
 * Layout of each kind (kids are indices into Ast.nodes, -1 = absent):
 *   FILE        kids: items
 *   MODEL       str: model name
 *   CONST       str: name; kids: [value]                ('const a = 1, b = 2' gives two)
 *   DIM         str: name; kids: [bound] or []          ('dim T <= 128')
 *   MODULE      str: name; aux: nparams; kids: [PARAM x nparams, items...]
 *   PARAM       str: name; aux: 0 bare, 1 typed, 2 default; kids: [] | [TYPE] | [default expr]
 *   MEMBER      str: name; kids: [CALL or COMPREHENSION]
 *   FORWARD     aux: nparams; aux2: noutputs; kids: [PARAM x nparams, NAME x noutputs, stmts...]
 *   LOSS        aux: nparams; kids: [PARAM x nparams, stmts...]   ('loss(..) = e' becomes RETURN e)
 *   METRIC      str: name; kids: [expr]
 *   INIT        str: the pattern as written, e.g. "h.*.attn.c_proj.weight"; kids: [expr]
 *   TRAIN       kids: KEY...
 *   KEY         str: key; kids: [expr]
 *   ASSIGN      aux: ntargets; kids: [NAME x ntargets, value]
 *   RETURN      kids: values
 *   FOR         str: loop variable; kids: [iterable expr, stmts...]
 *   NUMBER      num, ival, aux: 1 when an integer literal
 *   STRING      str: the contents (escapes \" \\ \n \t resolved)
 *   NAME        str: identifier
 *   LIST        kids: elements                           ('[1, 2, 3]')
 *   COMPREHENSION kids: [element expr, count expr]       ('[Block(C, H) for 4]')
 *   UNARY       op: TOK_MINUS | TOK_PLUS | TOK_KW_NOT; kids: [x]
 *   BINARY      op: the operator token; kids: [a, b]
 *   CALL        kids: [callee, args...]; an arg is an expr or a KWARG
 *   KWARG       str: name; kids: [value]
 *   INDEX       kids: [base, subscripts...]; a subscript is an expr, a SLICE or an ELLIPSIS
 *   ELLIPSIS    no kids                              ('...' in a subscript: the axes not indexed)
 *   IF          kids: [cond, BLOCK then] or [cond, BLOCK then, BLOCK else]   (a module item or a
 *               statement; 'else if' is an else BLOCK holding one IF)
 *   BLOCK       kids: the items or statements of a branch
 *   SLICE       kids: [start, stop, step], each -1 when omitted
 *   ATTR        str: attribute name; kids: [base]   ('wte.weight', 'h.0' gives ATTR "0")
 *   TYPE        aux: DType; kids: dims (exprs)       ('u8[B, 28, 28]')
 */
#define KILN_AST_KINDS(A) \
    A(FILE) A(MODEL) A(CONST) A(DIM) A(MODULE) A(PARAM) A(MEMBER) A(FORWARD) A(LOSS) \
    A(METRIC) A(INIT) A(TRAIN) A(KEY) A(ASSIGN) A(RETURN) A(FOR) A(NUMBER) A(STRING) \
    A(NAME) A(LIST) A(COMPREHENSION) A(UNARY) A(BINARY) A(CALL) A(KWARG) A(INDEX) \
    A(SLICE) A(ATTR) A(TYPE) A(ELLIPSIS) A(IF) A(BLOCK)

typedef enum {
#define AST_ENUM(e) AST_##e,
    KILN_AST_KINDS(AST_ENUM)
#undef AST_ENUM
    AST_KIND_COUNT
} AstKind;

typedef int32_t AstId;
#define AST_NONE (-1)

typedef struct {
    uint8_t kind; /* AstKind */
    uint8_t op;   /* TokKind for UNARY/BINARY */
    int32_t aux, aux2;
    Loc loc;
    int32_t str;  /* index into Ast.strs, -1 = none */
    double num;
    int64_t ival;
    int32_t kids, nkids; /* kids: index of the first child in Ast.kids */
} AstNode;

typedef struct {
    AstNode *nodes;
    int32_t nnodes, nodes_cap;
    AstId *kids;
    int32_t nkids, kids_cap;
    char **strs;
    int32_t nstrs, strs_cap;
    AstId root; /* the FILE node */
    uint16_t file;
} Ast;

const char *ast_kind_name(AstKind k);
/* Parses source `file` of d. Always returns an Ast (possibly partial); syntax errors are
 * reported to d. Nesting deeper than AST_MAX_DEPTH is an error, never a stack overflow. */
#define AST_MAX_DEPTH 200
Ast *ast_parse(Diag *d, uint16_t file);
void ast_free(Ast *a);
static inline const AstNode *ast_node(const Ast *a, AstId id) { return &a->nodes[id]; }
static inline AstId ast_kid(const Ast *a, AstId id, int i) { return a->kids[a->nodes[id].kids + i]; }
static inline const char *ast_str(const Ast *a, AstId id) { return a->nodes[id].str >= 0 ? a->strs[a->nodes[id].str] : ""; }
/* One-line S-expression of a subtree, for tests: (call (name relu) (name x)). */
void ast_dump(const Ast *a, AstId id, StrBuf *out);

/* ---- the training recipe (recipe.c) ----
 * The `train { ... }` section, checked against a schema (every key, loader, optimizer,
 * schedule and argument is known; types are checked) and completed with defaults, so
 * `kiln check` can print the full recipe and later stages read typed values. */
typedef enum { RV_NUM, RV_STR, RV_NAME, RV_BOOL, RV_CALL, RV_LIST } RecipeValueKind;

typedef struct RecipeValue {
    char *key;      /* the key or keyword-argument name; "" for positional args */
    uint8_t kind;   /* RecipeValueKind */
    bool is_int;
    bool is_default; /* filled in from the schema, not written by the user */
    double num;
    char *str;      /* RV_STR contents, RV_NAME identifier, RV_CALL function name */
    struct RecipeValue *args; /* RV_CALL arguments, RV_LIST elements */
    int32_t nargs;
    Loc loc;
} RecipeValue;

typedef struct {
    RecipeValue *entries;
    int32_t n;
} Recipe;

/* Checks the TRAIN item (AST_NONE: no train section, all defaults) against the schema;
 * `g` supplies the model's input names, which data loaders must cover. */
bool recipe_check(Recipe *r, const Ast *a, AstId train, const Graph *g, Diag *d);
void recipe_free(Recipe *r);
/* Every item of the schema, one a line: each key ("batch") and each argument of each call
 * it takes ("optimizer=SGD.momentum"; "data=idx.INPUT" stands for the model's inputs of a
 * loader that maps each input to a file). For the test that shows each has an effect. */
void recipe_schema(StrBuf *out);
const RecipeValue *recipe_get(const Recipe *r, const char *key);
/* The dtype a precision name stands for (the recipe's precision, kiln build --precision):
 * fp32/f32 DT_F32, bf16 DT_BF16, fp16/f16 DT_F16; -1 for any other name. */
int recipe_precision_dtype(const char *name);
const RecipeValue *recipe_arg(const RecipeValue *call, const char *key);
double recipe_num(const Recipe *r, const char *key, double dflt);
void recipe_print(const Recipe *r, StrBuf *out);
/* The checked recipe as runtime/kiln_recipe.h's typed struct, what model.c carries: every
 * key and call argument in its field, absent ones at the table's defaults. Strings point
 * into r (which must outlive *out); free the arrays with recipe_typed_free. r NULL: every
 * key at its default. */
struct kiln_recipe;
void recipe_typed(const Recipe *r, struct kiln_recipe *out);
void recipe_typed_free(struct kiln_recipe *r);
/* Value of `batch` written in the train section, or 0, read straight from the AST (the
 * batch bounds the batch symbol before the recipe is checked). */
int64_t recipe_batch_hint(const Ast *a, AstId train);

/* ---- whole-file compilation (lower.c) ---- */
typedef struct {
    Graph *graph;   /* forward, loss, metrics (and buffer updates) in the given mode */
    Recipe recipe;
    Ast *ast;
    char *path;     /* the source's name, as given */
} Model;

/* Parses, checks and lowers source `path`; NULL with diagnostics on error. The text is
 * registered with d. */
Model *frontend_compile(Diag *d, const char *path, const char *text, size_t len, GraphMode mode);
/* The same file lowered again in another mode (the evaluation or decode graph of a
 * training build), from the model's parsed and checked AST: the file is read and parsed
 * once per build. NULL with diagnostics on error. */
Graph *frontend_lower(Diag *d, const Model *m, GraphMode mode);
/* Whether the decode graph g (frontend_compile in MODE_DECODE, before any pass) computes a
 * language model's forward exactly for tokens after cached ones: every op of the forward
 * besides the cached attention and positions treats each position alone. 0, or -1 with
 * the reason in *why (the program then generates by full recomputation). Sets the cache
 * symbol KV's bound to the sequence's (call it after --bound). decode.c. */
int frontend_decode_check(Graph *g, StrBuf *why);
void frontend_model_free(Model *m);

#endif
