/* check.c — checks the declarations of a parsed model before anything is lowered: one
 * model name, unique names for constants, sizes, modules, members and metrics, no
 * redefinition of a built-in module, at most one forward, loss and train section, module
 * arguments that are distinct. Everything found is reported, so one run shows all of a
 * file's declaration errors; lowering (lower.c) then only sees a well-formed file. */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *name;
    AstId at;
    const char *what;
} Decl;

/* A set of declared names (no fixed capacity: large generated models stay correct). */
typedef struct {
    Decl *decls;
    int32_t n, cap;
    StrMap index;
} Decls;

static void decls_free(Decls *ds)
{
    free(ds->decls);
    strmap_free(&ds->index);
}

static const char *article(const char *what) { return strchr("aeiou", what[0]) ? "an" : "a"; }

/* Reports a duplicate of name, else records it. */
static void declare(Lower *L, Decls *ds, const char *name, AstId at, const char *what)
{
    int32_t i = strmap_get(&ds->index, name, -1);
    if (i >= 0) {
        lower_error(L, at, "%s '%s' is already defined as %s %s", what, name, article(ds->decls[i].what), ds->decls[i].what);
        diag_note(L->d, ast_node(L->ast, ds->decls[i].at)->loc, "'%s' was first defined here", name);
        return;
    }
    GROW(ds->decls, ds->cap, ds->n + 1);
    ds->decls[ds->n] = (Decl){name, at, what};
    strmap_put(&ds->index, name, ds->n++);
}

/* The items of a module body from `first`. Names inside the branches of an `if` are not
 * declared: both branches may define the same member (`proj = Linear(C, D)` or
 * `proj = Identity()`); the branch taken is checked when it is instantiated. */
static void check_module_items(Lower *L, AstId mod, AstId container, int first, Decls *decls, AstId *fwd, bool branch)
{
    const AstNode *cn = ast_node(L->ast, container);
    for (int k = first; k < cn->nkids; k++) {
        AstId it = ast_kid(L->ast, container, k);
        const AstNode *in = ast_node(L->ast, it);
        switch ((AstKind)in->kind) {
        case AST_CONST: if (!branch) declare(L, decls, ast_str(L->ast, it), it, "constant"); break;
        case AST_MEMBER: if (!branch) declare(L, decls, ast_str(L->ast, it), it, "member"); break;
        case AST_FORWARD:
            if (*fwd != AST_NONE && !branch) lower_error(L, it, "module %s has more than one forward", ast_str(L->ast, mod));
            if (*fwd == AST_NONE || !branch) *fwd = it;
            if (in->aux2 > 0) lower_error(L, it, "a module's forward returns its result with `return`, not `->`");
            break;
        case AST_INIT: break;
        case AST_IF:
            for (int j = 1; j < in->nkids; j++) check_module_items(L, mod, ast_kid(L->ast, it, j), 0, decls, fwd, true);
            break;
        default:
            lower_error(L, it, "%s is not allowed inside a module (only const, members, forward, init and if)",
                        ast_kind_name((AstKind)in->kind));
            break;
        }
    }
}

static void check_module(Lower *L, AstId mod)
{
    const AstNode *mn = ast_node(L->ast, mod);
    Decls decls = {0};
    for (int i = 0; i < mn->aux; i++) {
        AstId p = ast_kid(L->ast, mod, i);
        declare(L, &decls, ast_str(L->ast, p), p, "module argument");
    }
    AstId fwd = AST_NONE;
    check_module_items(L, mod, mod, mn->aux, &decls, &fwd, false);
    if (fwd == AST_NONE) lower_error(L, mod, "module %s has no forward", ast_str(L->ast, mod));
    decls_free(&decls);
}

bool check_declarations(Lower *L, AstId *forward, AstId *loss, AstId *train, const char **model_name);
bool check_declarations(Lower *L, AstId *forward, AstId *loss, AstId *train, const char **model_name)
{
    AstId root = L->ast->root;
    const AstNode *rn = ast_node(L->ast, root);
    Decls decls = {0}, modules = {0}, metrics = {0}, inputs = {0};
    AstId model = AST_NONE;
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, root, k);
        const AstNode *in = ast_node(L->ast, it);
        const char *name = ast_str(L->ast, it);
        switch ((AstKind)in->kind) {
        case AST_MODEL:
            if (model != AST_NONE) lower_error(L, it, "the model name is given twice");
            else if (k != 0) lower_error(L, it, "`model NAME` must be the first line of the file");
            model = it;
            break;
        case AST_CONST: declare(L, &decls, name, it, "constant"); break;
        case AST_DIM: declare(L, &decls, name, it, "size"); break;
        case AST_MEMBER: declare(L, &decls, name, it, "member"); break;
        case AST_MODULE:
            if (builtin_find(name)) lower_error(L, it, "module %s redefines a built-in module; choose another name", name);
            else declare(L, &modules, name, it, "module");
            check_module(L, it);
            break;
        case AST_FORWARD:
            if (*forward != AST_NONE) lower_error(L, it, "the model has more than one forward");
            *forward = it;
            break;
        case AST_LOSS:
            if (*loss != AST_NONE) lower_error(L, it, "the model has more than one loss");
            *loss = it;
            break;
        case AST_TRAIN:
            if (*train != AST_NONE) lower_error(L, it, "the model has more than one train section");
            *train = it;
            break;
        case AST_METRIC:
            if (!strcmp(name, "loss")) lower_error(L, it, "metric 'loss' would hide the loss; choose another name");
            else declare(L, &metrics, name, it, "metric");
            break;
        case AST_INIT: break;
        case AST_IF: break; /* members and init rules (parse.c); the branch taken is checked when instantiated */
        default: lower_error(L, it, "%s is not allowed at the top level", ast_kind_name((AstKind)in->kind)); break;
        }
    }
    /* Forward and loss inputs are distinct names. */
    AstId sigs[2] = {*forward, *loss};
    for (int s = 0; s < 2; s++) {
        if (sigs[s] == AST_NONE) continue;
        const AstNode *fn = ast_node(L->ast, sigs[s]);
        for (int i = 0; i < fn->aux; i++) {
            AstId p = ast_kid(L->ast, sigs[s], i);
            if (s == 1 && ast_node(L->ast, p)->aux != 1) continue; /* forward outputs */
            declare(L, &inputs, ast_str(L->ast, p), p, "input");
        }
    }
    if (*forward == AST_NONE)
        lower_error(L, model, "the model has no forward: add `forward(x: f32[B, N]) -> y { ... }`");
    decls_free(&decls);
    decls_free(&modules);
    decls_free(&metrics);
    decls_free(&inputs);
    *model_name = model != AST_NONE ? ast_str(L->ast, model) : "model";
    return !L->failed;
}
