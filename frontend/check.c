/* check.c — checks the declarations of a parsed model before anything is lowered: one
 * model name, unique names for constants, sizes, modules, members and metrics, no
 * redefinition of a built-in module, at most one forward, loss and train section, module
 * arguments that are distinct. Everything found is reported, so one run shows all of a
 * file's declaration errors; lowering (lower.c) then only sees a well-formed file. */
#include "internal.h"

#include <string.h>

typedef struct {
    const char *name;
    AstId at;
    const char *what;
} Decl;

/* Reports a duplicate of name among decls[0..n), else appends it. */
static void declare(Lower *L, Decl *decls, int *n, int max, const char *name, AstId at, const char *what)
{
    for (int i = 0; i < *n; i++)
        if (!strcmp(decls[i].name, name)) {
            lower_error(L, at, "%s '%s' is already defined as a %s", what, name, decls[i].what);
            diag_note(L->d, ast_node(L->ast, decls[i].at)->loc, "'%s' was first defined here", name);
            return;
        }
    if (*n < max) decls[(*n)++] = (Decl){name, at, what};
}

static void check_module(Lower *L, AstId mod)
{
    const AstNode *mn = ast_node(L->ast, mod);
    Decl decls[256];
    int nd = 0;
    for (int i = 0; i < mn->aux; i++) {
        AstId p = ast_kid(L->ast, mod, i);
        declare(L, decls, &nd, 256, ast_str(L->ast, p), p, "module argument");
    }
    AstId fwd = AST_NONE;
    for (int k = mn->aux; k < mn->nkids; k++) {
        AstId it = ast_kid(L->ast, mod, k);
        const AstNode *in = ast_node(L->ast, it);
        switch ((AstKind)in->kind) {
        case AST_CONST: declare(L, decls, &nd, 256, ast_str(L->ast, it), it, "constant"); break;
        case AST_MEMBER: declare(L, decls, &nd, 256, ast_str(L->ast, it), it, "member"); break;
        case AST_FORWARD:
            if (fwd != AST_NONE) lower_error(L, it, "module %s has more than one forward", ast_str(L->ast, mod));
            fwd = it;
            if (in->aux2 > 0) lower_error(L, it, "a module's forward returns its result with `return`, not `->`");
            break;
        case AST_INIT: break;
        default:
            lower_error(L, it, "%s is not allowed inside a module (only const, members, forward and init)",
                        ast_kind_name((AstKind)in->kind));
            break;
        }
    }
    if (fwd == AST_NONE) lower_error(L, mod, "module %s has no forward", ast_str(L->ast, mod));
}

bool check_declarations(Lower *L, AstId *forward, AstId *loss, AstId *train, const char **model_name);
bool check_declarations(Lower *L, AstId *forward, AstId *loss, AstId *train, const char **model_name)
{
    AstId root = L->ast->root;
    const AstNode *rn = ast_node(L->ast, root);
    Decl decls[4096], modules[1024];
    int nd = 0, nm = 0;
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
        case AST_CONST: declare(L, decls, &nd, 4096, name, it, "constant"); break;
        case AST_DIM: declare(L, decls, &nd, 4096, name, it, "size"); break;
        case AST_MEMBER: declare(L, decls, &nd, 4096, name, it, "member"); break;
        case AST_MODULE:
            if (builtin_find(name)) lower_error(L, it, "module %s redefines a built-in module; choose another name", name);
            else declare(L, modules, &nm, 1024, name, it, "module");
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
            break;
        case AST_INIT: break;
        default: lower_error(L, it, "%s is not allowed at the top level", ast_kind_name((AstKind)in->kind)); break;
        }
    }
    /* Metric names are unique among themselves. */
    Decl metrics[256];
    int nmet = 0;
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, root, k);
        if (ast_node(L->ast, it)->kind == AST_METRIC) declare(L, metrics, &nmet, 256, ast_str(L->ast, it), it, "metric");
    }
    /* Forward and loss inputs are distinct names. */
    Decl inputs[64];
    int ni = 0;
    AstId sigs[2] = {*forward, *loss};
    for (int s = 0; s < 2; s++) {
        if (sigs[s] == AST_NONE) continue;
        const AstNode *fn = ast_node(L->ast, sigs[s]);
        for (int i = 0; i < fn->aux; i++) {
            AstId p = ast_kid(L->ast, sigs[s], i);
            if (s == 1 && ast_node(L->ast, p)->aux != 1) continue; /* forward outputs */
            declare(L, inputs, &ni, 64, ast_str(L->ast, p), p, "input");
        }
    }
    *model_name = model != AST_NONE ? ast_str(L->ast, model) : "model";
    return !L->failed;
}
