/* instantiate.c — the model's module tree: each member expression of the root module
 * (a built-in or user module call, a repetition `[M(...) for N]`, a Parameter) becomes a
 * module instance with its parameters under their PyTorch state_dict names and the init
 * rules that apply to them. Split from lower.c, which evaluates forward, loss and metrics
 * over the instances made here. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- instantiation ---- */

void lower_collect_init_rules(Lower *L, const AstId *items, int32_t n, int32_t owner)
{
    for (int32_t k = 0; k < n; k++) {
        AstId it = items[k];
        if (ast_node(L->ast, it)->kind != AST_INIT) continue;
        GROW(L->rules, L->rules_cap, L->nrules + 1);
        InitRule *r = &L->rules[L->nrules++];
        r->pattern = ast_str(L->ast, it);
        r->expr = ast_kid(L->ast, it, 0);
        r->at = it;
        r->owner = owner;
        r->matches = 0;
        r->failed = false;
    }
}

static bool is_function_name(const char *name)
{
    int n;
    const char *const *fns = functions_names(&n);
    for (int i = 0; i < n; i++)
        if (!strcmp(fns[i], name)) return true;
    return false;
}

/* An unknown name where a module type is expected: suggest only module types. */
static void unknown_module(Lower *L, const char *type, AstId at)
{
    if (is_function_name(type)) {
        lower_error(L, at, "'%s' is a function, not a module: call it in forward (`x = %s(x)`) instead of making it a member",
                    type, type);
        return;
    }
    const char *best = NULL;
    int bestd = 1000, n;
    StrBuf all;
    sb_init(&all);
    const BuiltinModule *mods = builtin_all(&n);
    for (int i = 0; i < n; i++) {
        lower_consider(mods[i].name, type, &best, &bestd);
        sb_printf(&all, "%s%s", i ? ", " : "", mods[i].name);
    }
    const AstNode *rn = ast_node(L->ast, L->ast->root);
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, L->ast->root, k);
        if (ast_node(L->ast, it)->kind != AST_MODULE) continue;
        lower_consider(ast_str(L->ast, it), type, &best, &bestd);
        sb_printf(&all, ", %s", ast_str(L->ast, it));
    }
    size_t len = strlen(type);
    if (best && (bestd <= (len <= 3 ? 1 : len <= 6 ? 2 : 3) || util_edit_distance_nocase(best, type) == 0))
        lower_error(L, at, "unknown module '%s' (did you mean '%s'?)", type, best);
    else lower_error(L, at, "unknown module '%s'; modules: %s", type, all.data);
    sb_free(&all);
}

static AstId find_user_module(Lower *L, const char *name)
{
    AstId root = L->ast->root;
    const AstNode *rn = ast_node(L->ast, root);
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, root, k);
        if (ast_node(L->ast, it)->kind == AST_MODULE && !strcmp(ast_str(L->ast, it), name)) return it;
    }
    return AST_NONE;
}


/* Creates the member `name` of instance `parent` from expression e (a module call, a
 * repetition, or Parameter(...)). */
Value lower_instantiate(Lower *L, int32_t parent, const char *name, AstId e)
{
    if (L->ninsts >= LOWER_MAX_INSTANCES) {
        lower_error(L, e, "more than %d module instances", LOWER_MAX_INSTANCES);
        return value_error();
    }
    const AstNode *n = ast_node(L->ast, e);
    Scope *ps = L->insts[parent].scope;
    if (n->kind == AST_COMPREHENSION) {
        int64_t count;
        AstId ce = ast_kid(L->ast, e, 1);
        if (!value_int(L, lower_expr(L, ps, parent, ce), ce, "repeat count", &count)) return value_error();
        if (count < 0 || count > LOWER_MAX_REPEAT) {
            lower_error(L, ce, "repeat count %lld must be between 0 and %d", (long long)count, LOWER_MAX_REPEAT);
            return value_error();
        }
        Value *elems = xmalloc((size_t)(count ? count : 1) * sizeof *elems);
        int32_t before = L->ninsts;
        for (int64_t i = 0; i < count; i++) {
            /* The elements are the same expression, so the first one tells how many
             * instances each makes: a nesting that would pass the limit is refused before
             * the rest are built (it took seconds and gigabytes to reach the limit). */
            if (i == 1 && (int64_t)(L->ninsts - before) * (count - 1) > (int64_t)LOWER_MAX_INSTANCES - L->ninsts) {
                lower_error(L, e, "more than %d module instances: %lld repetitions of %d instances each", LOWER_MAX_INSTANCES, (long long)count,
                            L->ninsts - before);
                free(elems);
                return value_error();
            }
            char idx[32];
            snprintf(idx, sizeof idx, "%lld", (long long)i);
            /* Members of the list are named "h.0", "h.1", ... like nn.ModuleList. */
            StrBuf full;
            sb_init(&full);
            sb_printf(&full, "%s.%s", name, idx);
            int errors = L->d->nerrors;
            elems[i] = lower_instantiate(L, parent, full.data, ast_kid(L->ast, e, 0));
            sb_free(&full);
            if (elems[i].kind == V_ERROR || L->d->nerrors > errors) {
                free(elems);
                return value_error();
            }
        }
        Value list = {.kind = V_LIST, .node = IR_NONE, .idx = L->nseq, .count = (int32_t)count};
        for (int64_t i = 0; i < count; i++) lower_seq_push(L, elems[i]);
        free(elems);
        return list;
    }
    if (n->kind != AST_CALL || ast_node(L->ast, ast_kid(L->ast, e, 0))->kind != AST_NAME) {
        lower_error(L, e, "a member must be a module, e.g. `fc = Linear(784, 256)`, a repetition `[Block(C) for 4]`, or Parameter(...)");
        return value_error();
    }
    AstId callee = ast_kid(L->ast, e, 0);
    const char *type = ast_str(L->ast, callee);
    if (!strcmp(type, "Parameter") || !strcmp(type, "Buffer")) {
        /* Parameter(dims..., init = normal(0, 0.02)): dims are evaluated, the initialiser
         * is read as an initialiser (like an `init` rule), not as a function call. */
        bool buffer = type[0] == 'B';
        Shape s = ir_shape_make(0, NULL);
        AstId init = AST_NONE;
        for (int k = 1; k < n->nkids; k++) {
            AstId a = ast_kid(L->ast, e, k);
            if (ast_node(L->ast, a)->kind == AST_KWARG) {
                if (strcmp(ast_str(L->ast, a), "init")) {
                    lower_error(L, a, "%s has no argument '%s'; it takes sizes and init = ...", type, ast_str(L->ast, a));
                    return value_error();
                }
                if (init != AST_NONE) {
                    lower_error(L, a, "%s: argument 'init' is given twice", type);
                    return value_error();
                }
                init = ast_kid(L->ast, a, 0);
                continue;
            }
            int64_t d;
            if (s.rank >= IR_MAX_RANK) {
                lower_error(L, a, "%s: rank exceeds %d", type, IR_MAX_RANK);
                return value_error();
            }
            if (!value_int(L, lower_expr(L, ps, parent, a), a, type, &d)) return value_error();
            if (d < 0 || d > IR_MAX_DIM) {
                lower_error(L, a, "%s: size %lld is out of range (0 to 2^32)", type, (long long)d);
                return value_error();
            }
            s.d[s.rank++] = ir_dim_const(d);
        }
        InitKind kind = INIT_ZEROS;
        double a0 = 0, a1 = 0;
        if (init != AST_NONE) {
            InitRule tmp = {.pattern = "", .expr = init, .at = e, .owner = parent};
            if (!lower_eval_init(L, &tmp, &s, &kind, &a0, &a1)) return value_error();
        }
        NodeId p = lower_param(L, parent, name, &s, kind, a0, a1, !buffer, e);
        if (p == IR_NONE) return value_error();
        Value v = value_tensor(p);
        v.count = -1; /* lower_param already made it a member */
        return v;
    }
    if (!strcmp(type, "Sequential")) return builtin_sequential(L, parent, name, e);
    const BuiltinModule *bm = builtin_find(type);
    AstId def = bm ? AST_NONE : find_user_module(L, type);
    if (!bm && def == AST_NONE) {
        unknown_module(L, type, callee);
        return value_error();
    }
    if (bm) {
        BoundArgs ba;
        StrBuf sig;
        sb_init(&sig);
        for (int i = 0; i < BUILTIN_MAX_ARGS && bm->args[i]; i++)
            sb_printf(&sig, "%s%s%s%s", i ? ", " : "", bm->args[i], bm->defaults[i] ? "=" : "", bm->defaults[i] ? bm->defaults[i] : "");
        bool ok = lower_bind_args(L, ps, parent, e, type, sig.data ? sig.data : "", &ba);
        sb_free(&sig);
        if (!ok) return value_error();
        int32_t m = lower_inst_new(L, parent, name, type, n->loc);
        L->insts[m].builtin = bm;
        L->insts[m].scope = ps;
        for (int i = 0; i < ba.n && i < BUILTIN_MAX_ARGS; i++) L->insts[m].args[i] = ba.v[i];
        for (int i = 0; i < ba.n && i < BUILTIN_MAX_ARGS; i++) L->insts[m].args_at[i] = ba.at[i]; /* where, for errors */
        if (!bm->create(L, m, e)) return value_error();
        return (Value){.kind = V_MODULE, .idx = m, .node = IR_NONE};
    }
    /* A user module: bind arguments, then instantiate its body. */
    for (int32_t i = 0; i < L->ninst_stack; i++)
        if (L->inst_stack[i] == def) {
            StrBuf chain;
            sb_init(&chain);
            for (int32_t j = i; j < L->ninst_stack; j++) sb_printf(&chain, "%s -> ", ast_str(L->ast, L->inst_stack[j]));
            sb_puts(&chain, type);
            lower_error(L, e, "module %s contains itself: %s", type, chain.data);
            sb_free(&chain);
            return value_error();
        }
    if (L->ninst_stack >= MAX_MODULE_DEPTH) {
        lower_error(L, e, "modules nested deeper than %d", MAX_MODULE_DEPTH);
        return value_error();
    }
    const AstNode *dn = ast_node(L->ast, def);
    StrBuf sig;
    sb_init(&sig);
    for (int i = 0; i < dn->aux; i++) {
        AstId p = ast_kid(L->ast, def, i);
        sb_printf(&sig, "%s%s%s", i ? ", " : "", ast_str(L->ast, p), ast_node(L->ast, p)->aux == 2 ? "=none" : "");
    }
    BoundArgs ba;
    if (dn->aux > CALL_MAX_ARGS) {
        sb_free(&sig);
        lower_error(L, def, "module %s has more than %d arguments", type, CALL_MAX_ARGS);
        return value_error();
    }
    bool ok = lower_bind_args(L, ps, parent, e, type, sig.data ? sig.data : "", &ba);
    sb_free(&sig);
    if (!ok) return value_error();
    int32_t m = lower_inst_new(L, parent, name, type, n->loc);
    Scope *ms = lower_scope_new(L, L->globals, true);
    L->insts[m].scope = ms;
    L->insts[m].def = def;
    for (int i = 0; i < dn->aux; i++) {
        AstId p = ast_kid(L->ast, def, i);
        Value v = ba.v[i];
        if (!ba.given[i] && ast_node(L->ast, p)->aux == 2) v = lower_expr(L, ms, -1, ast_kid(L->ast, p, 0));
        lower_scope_set(ms, ast_str(L->ast, p), v);
    }
    GROW(L->inst_stack, L->inst_stack_cap, L->ninst_stack + 1);
    L->inst_stack[L->ninst_stack++] = def;
    lower_module_body(L, m, def, dn->aux);
    L->ninst_stack--;
    return (Value){.kind = V_MODULE, .idx = m, .node = IR_NONE};
}

/* Members and forward of a module body (or the file), in order; its constants were
 * evaluated with its `if`s (cond.c). */
void lower_instantiate_items(Lower *L, int32_t inst, const AstId *items, int32_t n)
{
    for (int32_t k = 0; k < n; k++) {
        AstId it = items[k];
        const AstNode *in = ast_node(L->ast, it);
        const char *name = ast_str(L->ast, it);
        if (in->kind == AST_MEMBER) {
            if (inst_member(L, inst, name)) {
                lower_error(L, it, "member '%s' is defined twice", name);
                continue;
            }
            Value v = lower_instantiate(L, inst, name, ast_kid(L->ast, it, 0));
            if (v.kind == V_TENSOR && v.count == -1) continue; /* Parameter: already added */
            lower_add_member(L, inst, name, v);
        } else if (in->kind == AST_FORWARD && inst != 0) {
            if (L->insts[inst].forward != AST_NONE) lower_error(L, it, "module %s has two forward definitions", L->insts[inst].type);
            else L->insts[inst].forward = it;
        }
    }
}

