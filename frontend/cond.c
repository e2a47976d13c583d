/* cond.c — compile-time `if`: in a module body (which members, constants, init rules and
 * forward the module has) and in forward and loss bodies (which statements run).
 *
 * The condition is decided when the model is compiled, from constants, module arguments
 * and sizes; only the branch taken is lowered, the other is parsed and nothing more. A
 * tensor condition is one error pointing at it (a per-element choice is `where`). A name
 * that only the branch not taken would define is remembered, so that a later use of it
 * says why it is missing instead of "unknown name". */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

/* The first node of expression e in the text (the caret of an error about all of it). */
static AstId leftmost(const Ast *a, AstId e)
{
    for (int guard = 0; guard < 4 * AST_MAX_DEPTH; guard++) {
        const AstNode *n = ast_node(a, e);
        bool postfix = n->kind == AST_CALL || n->kind == AST_INDEX || n->kind == AST_ATTR || (n->kind == AST_BINARY);
        if (!postfix || n->nkids == 0) break;
        e = ast_kid(a, e, 0);
    }
    return e;
}

int lower_if_branch(Lower *L, Scope *s, int32_t inst, AstId cond)
{
    Value v = lower_expr(L, s, inst, cond);
    switch ((ValueKind)v.kind) {
    case V_BOOL:
    case V_NUM: return v.num != 0;
    case V_NONE: return 0;
    case V_STR: return v.str[0] != 0;
    case V_ERROR: return -1; /* reported where it happened */
    case V_TENSOR:
        lower_error(L, leftmost(L->ast, cond),
                    "the condition of `if` is a tensor: `if` is decided when the model is compiled, from constants, module "
                    "arguments and sizes; use where(condition, a, b) to choose per element");
        return -1;
    case V_DIM: {
        StrBuf t;
        sb_init(&t);
        ir_dim_format(&t, L->g, v.dim);
        lower_error(L, cond, "the condition of `if` is the symbolic size %s, known only when the model runs; compare sizes "
                             "with ==, != or numbers of the model", t.data);
        sb_free(&t);
        return -1;
    }
    default:
        lower_error(L, cond, "the condition of `if` must be a number, a boolean or none (known when the model is compiled), "
                             "found %s", v.kind == V_MODULE ? "a module" : v.kind == V_LIST ? "a list of modules" : "a list");
        return -1;
    }
}

/* Calls fn for every name the items or statements of node (from kid `first`) define:
 * assignment targets, loop variables, members and constants, through nested `if`s and
 * loops. */
static void block_names(Lower *L, AstId node, int first, void (*fn)(Lower *L, const char *name, void *ctx), void *ctx)
{
    const AstNode *bn = ast_node(L->ast, node);
    for (int k = first; k < bn->nkids; k++) {
        AstId it = ast_kid(L->ast, node, k);
        const AstNode *in = ast_node(L->ast, it);
        switch ((AstKind)in->kind) {
        case AST_ASSIGN:
            for (int i = 0; i < in->aux; i++) fn(L, ast_str(L->ast, ast_kid(L->ast, it, i)), ctx);
            break;
        case AST_FOR:
            fn(L, ast_str(L->ast, it), ctx);
            block_names(L, it, 1, fn, ctx); /* the body: the kids after the iterable */
            break;
        case AST_IF:
            for (int j = 1; j < in->nkids; j++) block_names(L, ast_kid(L->ast, it, j), 0, fn, ctx);
            break;
        case AST_MEMBER:
        case AST_CONST: fn(L, ast_str(L->ast, it), ctx); break;
        default: break;
        }
    }
}

typedef struct {
    Scope *scope; /* NULL: members of inst */
    int32_t inst;
    AstId at;     /* the IF */
    int taken;    /* the branch taken: 1, 0, or -1 when the condition failed */
} UnsetCtx;

static void record_unset(Lower *L, const char *name, void *ctx)
{
    const UnsetCtx *c = ctx;
    if (c->scope) {
        if (c->taken < 0) {
            lower_scope_set(c->scope, name, value_error()); /* silent from here on */
            return;
        }
        if (lower_lookup(L, c->scope, c->inst, name)) return; /* defined before the if: it keeps that value */
    } else if (inst_member(L, c->inst, name)) return;
    GROW(L->unset, L->unset_cap, L->nunset + 1);
    L->unset[L->nunset++] = (UnsetName){.scope = c->scope, .inst = c->inst, .name = xstrdup(name), .at = c->at, .taken = c->taken};
}

void lower_if_not_taken(Lower *L, Scope *s, int32_t inst, AstId ifnode, int taken)
{
    UnsetCtx c = {.scope = s, .inst = inst, .at = ifnode, .taken = taken};
    const AstNode *n = ast_node(L->ast, ifnode);
    for (int j = 1; j < n->nkids; j++)
        if (taken < 0 || j != (taken ? 1 : 2)) block_names(L, ast_kid(L->ast, ifnode, j), 0, record_unset, &c);
}

bool lower_unset_error(Lower *L, Scope *s, int32_t inst, const char *name, AstId at)
{
    for (int32_t i = L->nunset - 1; i >= 0; i--) {
        const UnsetName *u = &L->unset[i];
        if (strcmp(u->name, name)) continue;
        bool visible = false;
        if (u->scope)
            for (Scope *t = s; t && !visible; t = t->parent) visible = t == u->scope;
        else visible = u->inst == inst;
        if (!visible) continue;
        if (u->taken < 0) {
            L->failed = true; /* its condition's error is the one reported */
            return true;
        }
        Loc l = ast_node(L->ast, u->at)->loc;
        lower_error(L, at, "'%s' is defined only in the branch of the `if` at %u:%u that is not taken (its condition is %s): define it "
                           "before the `if` or in both branches",
                    name, l.line, l.col, u->taken ? "true" : "false");
        return true;
    }
    return false;
}

/* Appends the items of container from `first` to *list, each `if` replaced by the items of
 * the branch it takes; constants of a module (the file's are globals, evaluated before) are
 * evaluated here, in order, so that the conditions after them can use them. */
static void resolve_items(Lower *L, int32_t inst, AstId container, int first, AstId **list, int32_t *n, int32_t *cap)
{
    const AstNode *cn = ast_node(L->ast, container);
    Scope *ms = L->insts[inst].scope;
    for (int k = first; k < cn->nkids; k++) {
        AstId it = ast_kid(L->ast, container, k);
        const AstNode *in = ast_node(L->ast, it);
        if (in->kind == AST_CONST && inst != 0) {
            lower_scope_set(ms, ast_str(L->ast, it), lower_expr(L, ms, inst, ast_kid(L->ast, it, 0)));
        } else if (in->kind == AST_IF) {
            int b = lower_if_branch(L, ms, inst, ast_kid(L->ast, it, 0));
            lower_if_not_taken(L, NULL, inst, it, b);
            if (b < 0) continue;
            AstId taken = b ? ast_kid(L->ast, it, 1) : in->nkids > 2 ? ast_kid(L->ast, it, 2) : AST_NONE;
            if (taken != AST_NONE) resolve_items(L, inst, taken, 0, list, n, cap);
        } else {
            GROW(*list, *cap, *n + 1);
            (*list)[(*n)++] = it;
        }
    }
}

void lower_module_body(Lower *L, int32_t inst, AstId container, int first)
{
    AstId *items = NULL;
    int32_t n = 0, cap = 0;
    resolve_items(L, inst, container, first, &items, &n, &cap);
    lower_collect_init_rules(L, items, n, inst);
    lower_instantiate_items(L, inst, items, n);
    free(items);
}
