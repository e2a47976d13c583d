/* recipe.c — the `train { ... }` section: checked against the schema and completed with
 * defaults. The schema (every key, data loader, optimizer, schedule and argument) is
 * expanded from runtime/kiln_recipe.h's tables, the one declaration the generated programs
 * read too; anything else is an error with its location and the nearest known name, never
 * a silent default. Data loaders must name inputs the model really has. The schema is also
 * what `kiln check` prints and what docs/language.md lists. */
#include "internal.h"
#include "../runtime/kiln_recipe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef enum { A_NUM, A_INT, A_STR, A_NAME, A_BOOL, A_PAIR } ArgKind;

/* The tables below are expanded from runtime/kiln_recipe.h, the one declaration of the
 * recipe that the generated programs read too. */
typedef struct {
    const char *name;
    uint8_t kind;       /* ArgKind */
    const char *dflt;   /* NULL = required; "" = optional with no value */
    double lo, hi;
    const char *choices; /* A_NAME: space-separated allowed values, or "" (a model input's name) */
} ArgSpec;

typedef struct {
    const char *key, *name; /* the key that takes it, the call's name */
    const ArgSpec *args;
    bool input_map; /* keyword arguments are model inputs mapped to file paths */
    const char *doc;
} CallSpec;

typedef struct {
    const char *key;
    uint8_t kind;        /* ArgKind, or A_CALL below */
    const char *dflt;    /* NULL = no default (absent unless written) */
    double lo, hi;
    const char *choices;
    const char *doc;
} KeySpec;

#define A_CALL 100
#define A_DATA A_CALL  /* a call whose input-map calls name files (kiln_recipe's KEY_files) */
#define A_GROUPS 101 /* a list of group(...) calls */
#define A_SCALE 102  /* loss_scale: dynamic, none or a number (a static scale) */
#define MAX_SCALE KILN_RECIPE_MAX_SCALE
#define INF KILN_RECIPE_INF
#define END {NULL, 0, NULL, 0, 0, NULL}
#define CHOICE_WORD(list, name) #name " "
#define CHOICES(list) ("" KILN_RECIPE_CHOICES_##list(CHOICE_WORD))

#define ARG_SPEC(key, arg, kind, dflt, lo, hi, ch) {#arg, A_##kind, dflt, lo, hi, CHOICES(ch)},
#define CALL_ARGS(key, call, args, map, doc) static const ArgSpec args_##key##_##call[] = {KILN_RECIPE_ARGS_##args(ARG_SPEC) END};
KILN_RECIPE_CALLS(CALL_ARGS)
#define CALL_SPEC(key, call, args, map, doc) {#key, #call, args_##key##_##call, map, doc},
static const CallSpec all_calls[] = {KILN_RECIPE_CALLS(CALL_SPEC){NULL, NULL, NULL, false, NULL}};

/* Keys whose default depends on other keys are not completed in the checked recipe (the
 * typed one starts from the default: recipe_typed). */
#define KEY_SPEC(key, kind, dflt, lo, hi, ch, completed, doc) {#key, A_##kind, (completed) ? (dflt) : NULL, lo, hi, CHOICES(ch), doc},
static const KeySpec keys[] = {KILN_RECIPE_KEYS(KEY_SPEC)};

/* The calls key ks takes: all_calls from its first, while the key is ks's. */
static const CallSpec *key_calls(const KeySpec *ks)
{
    for (const CallSpec *c = all_calls; c->name; c++)
        if (!strcmp(c->key, ks->key)) return c;
    return &all_calls[KILN_RECIPE_NCALLS]; /* the terminator */
}
#define FOR_CALLS(c, ks) for (const CallSpec *c = key_calls(ks); c->name && !strcmp(c->key, (ks)->key); c++)
#define NKEYS ((int)(sizeof keys / sizeof keys[0]))

/* ---- helpers ---- */

/* The known name closest to `name`: a case-insensitive match first (Adamw -> AdamW, not
 * Adam), then the smallest edit distance within a third of the length. */
static const char *nearest(const char *name, const char *const *cands, int n)
{
    for (int i = 0; i < n; i++)
        if (util_edit_distance_nocase(cands[i], name) == 0) return cands[i];
    const char *best = NULL;
    int bestd = 1000;
    for (int i = 0; i < n; i++) {
        int d = util_edit_distance(cands[i], name);
        if (d < bestd) bestd = d, best = cands[i];
    }
    size_t len = strlen(name);
    return bestd <= (len <= 4 ? 1 : len <= 8 ? 2 : 3) ? best : NULL;
}

static const char *ast_desc(const Ast *a, AstId e)
{
    switch ((AstKind)ast_node(a, e)->kind) {
    case AST_STRING: return "a string";
    case AST_NAME: return "a name";
    case AST_CALL: return "a call";
    case AST_LIST: return "a list";
    case AST_NUMBER: return "a number";
    default: return "an expression";
    }
}

/* Prints a range bound: integers in full (16777216, not 1.67772e+07). */
static void fmt_bound(char *buf, size_t n, double v)
{
    if (v == floor(v) && fabs(v) < 1e18) snprintf(buf, n, "%.0f", v);
    else snprintf(buf, n, "%g", v);
}

static bool in_choices(const char *choices, const char *v)
{
    size_t n = strlen(v);
    for (const char *p = choices; *p;) {
        size_t l = strcspn(p, " ");
        if (l == n && !strncmp(p, v, n)) return true;
        p += l;
        while (*p == ' ') p++;
    }
    return false;
}

static void free_value(RecipeValue *v)
{
    free(v->key);
    free(v->str);
    for (int32_t i = 0; i < v->nargs; i++) free_value(&v->args[i]);
    free(v->args);
}

static RecipeValue *push(RecipeValue **arr, int32_t *n)
{
    *arr = xrealloc(*arr, (size_t)(*n + 1) * sizeof **arr);
    RecipeValue *v = &(*arr)[(*n)++];
    memset(v, 0, sizeof *v);
    return v;
}

/* Constant-folds a simple expression (numbers, + - * / **, unary minus). */
static bool fold_number(const Ast *a, AstId e, double *out, bool *is_int)
{
    const AstNode *n = ast_node(a, e);
    if (n->kind == AST_NUMBER) {
        *out = n->aux ? (double)n->ival : n->num;
        *is_int = n->aux != 0;
        return true;
    }
    if (n->kind == AST_UNARY && n->op == TOK_MINUS) {
        if (!fold_number(a, ast_kid(a, e, 0), out, is_int)) return false;
        *out = -*out;
        return true;
    }
    if (n->kind == AST_BINARY) {
        double x, y;
        bool ix, iy;
        if (!fold_number(a, ast_kid(a, e, 0), &x, &ix) || !fold_number(a, ast_kid(a, e, 1), &y, &iy)) return false;
        *is_int = ix && iy;
        switch (n->op) {
        case TOK_PLUS: *out = x + y; return true;
        case TOK_MINUS: *out = x - y; return true;
        case TOK_STAR: *out = x * y; return true;
        case TOK_SLASH: *is_int = false; *out = x / y; return y != 0;
        case TOK_POW: *out = pow(x, y); return true;
        default: return false;
        }
    }
    return false;
}

/* Converts expression e to a value of the given kind, reporting errors at e. */
static bool convert(const Ast *a, AstId e, uint8_t kind, double lo, double hi, const char *choices, const char *what,
                    RecipeValue *out, Diag *d)
{
    const AstNode *n = ast_node(a, e);
    out->loc = n->loc;
    switch ((ArgKind)kind) {
    case A_NUM:
    case A_INT: {
        double v;
        bool is_int;
        if (!fold_number(a, e, &v, &is_int)) {
            diag_error(d, n->loc, "%s: expected %s, found %s", what, kind == A_INT ? "an integer" : "a number", ast_desc(a, e));
            return false;
        }
        if (kind == A_INT && !is_int && v != floor(v)) {
            diag_error(d, n->loc, "%s: expected an integer, found %g", what, v);
            return false;
        }
        if (!(v >= lo && v <= hi)) {
            char l[32], h[32], x[32];
            fmt_bound(l, sizeof l, lo);
            fmt_bound(h, sizeof h, hi);
            fmt_bound(x, sizeof x, v);
            if (hi >= INF) diag_error(d, n->loc, "%s: %s is out of range (at least %s)", what, x, l);
            else diag_error(d, n->loc, "%s: %s is out of range [%s, %s]", what, x, l, h);
            return false;
        }
        out->kind = RV_NUM;
        out->num = v;
        out->is_int = kind == A_INT;
        return true;
    }
    case A_STR:
        if (n->kind != AST_STRING) {
            diag_error(d, n->loc, "%s: expected a string in double quotes, found %s", what, ast_desc(a, e));
            return false;
        }
        out->kind = RV_STR;
        out->str = xstrdup(ast_str(a, e));
        return true;
    case A_NAME:
    case A_BOOL: {
        if (n->kind != AST_NAME && n->kind != AST_STRING) {
            diag_error(d, n->loc, "%s: expected %s, found %s", what, kind == A_BOOL ? "true or false" : "a name", ast_desc(a, e));
            return false;
        }
        const char *s = ast_str(a, e);
        if (kind == A_BOOL) {
            if (strcmp(s, "true") && strcmp(s, "false")) {
                if (!strcmp(s, "True") || !strcmp(s, "False")) /* Python's spelling */
                    diag_error(d, n->loc, "%s: expected true or false, found '%s' (did you mean '%s'? Kiln writes them in lower case)", what, s,
                               s[0] == 'T' ? "true" : "false");
                else diag_error(d, n->loc, "%s: expected true or false, found '%s'", what, s);
                return false;
            }
            out->kind = RV_BOOL;
            out->num = s[0] == 't';
            return true;
        }
        if (choices && *choices && !in_choices(choices, s)) {
            diag_error(d, n->loc, "%s: unknown value '%s'; expected one of: %.*s", what, s, (int)strlen(choices) - 1, choices);
            return false;
        }
        out->kind = RV_NAME;
        out->str = xstrdup(s);
        return true;
    }
    case A_PAIR: {
        if (n->kind != AST_LIST || n->nkids != 2) {
            diag_error(d, n->loc, "%s: expected two numbers, e.g. [0.9, 0.95]", what);
            return false;
        }
        out->kind = RV_LIST;
        for (int i = 0; i < 2; i++)
            if (!convert(a, ast_kid(a, e, i), A_NUM, lo, hi, NULL, what, push(&out->args, &out->nargs), d)) return false;
        return true;
    }
    }
    return false;
}

/* Default value of an argument, from its schema text. */
static void set_default(RecipeValue *v, uint8_t kind, const char *dflt)
{
    v->is_default = true;
    switch ((ArgKind)kind) {
    case A_NUM:
    case A_INT:
        v->kind = RV_NUM;
        v->num = strtod(dflt, NULL);
        v->is_int = kind == A_INT;
        break;
    case A_STR: v->kind = RV_STR; v->str = xstrdup(dflt); break;
    case A_NAME: v->kind = RV_NAME; v->str = xstrdup(dflt); break;
    case A_BOOL: v->kind = RV_BOOL; v->num = dflt[0] == 't'; break;
    case A_PAIR: {
        v->kind = RV_LIST;
        char *end;
        double x = strtod(dflt, &end), y = strtod(end, NULL);
        RecipeValue *e0 = push(&v->args, &v->nargs);
        e0->kind = RV_NUM, e0->num = x, e0->key = xstrdup("");
        RecipeValue *e1 = push(&v->args, &v->nargs);
        e1->kind = RV_NUM, e1->num = y, e1->key = xstrdup("");
        break;
    }
    }
}

static void fill_call_defaults(RecipeValue *v, const CallSpec *cs)
{
    for (const ArgSpec *as = cs->args; as->name; as++) {
        if (!as->dflt || !as->dflt[0] || recipe_arg(v, as->name)) continue;
        RecipeValue *arg = push(&v->args, &v->nargs);
        arg->key = xstrdup(as->name);
        set_default(arg, as->kind, as->dflt);
    }
}

/* The model's data inputs in order (forward's, then the loss's typed ones): from the
 * lowered graph, or, when lowering failed (no graph), as the file declares them, so that
 * one mistake in forward does not make every data loader's input look unknown. An
 * untyped forward parameter (an error reported by lowering) is known but needs no file. */
typedef struct {
    const char **names;
    bool *required;
    int n;
} Inputs;

static void inputs_add(Inputs *in, const char *name, bool required)
{
    in->names = xrealloc(in->names, (size_t)(in->n + 1) * sizeof *in->names);
    in->required = xrealloc(in->required, (size_t)(in->n + 1) * sizeof *in->required);
    in->names[in->n] = name;
    in->required[in->n++] = required;
}

static void inputs_collect(Inputs *in, const Ast *a, const Graph *g)
{
    memset(in, 0, sizeof *in);
    if (g) {
        for (NodeId i = 0; i < g->nnodes; i++)
            if (g->nodes[i].op == OP_INPUT) inputs_add(in, ir_node_name(g, i), true);
        return;
    }
    AstId fwd = AST_NONE, loss = AST_NONE;
    const AstNode *rn = ast_node(a, a->root);
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(a, a->root, k);
        if (ast_node(a, it)->kind == AST_FORWARD && fwd == AST_NONE) fwd = it;
        if (ast_node(a, it)->kind == AST_LOSS && loss == AST_NONE) loss = it;
    }
    for (int s = 0; s < 2; s++) {
        AstId sig = s ? loss : fwd;
        if (sig == AST_NONE) continue;
        for (int i = 0; i < ast_node(a, sig)->aux; i++) {
            AstId p = ast_kid(a, sig, i);
            bool typed = ast_node(a, p)->aux == 1;
            if (s == 0 || typed) inputs_add(in, ast_str(a, p), typed);
        }
    }
}

static void inputs_free(Inputs *in)
{
    free(in->names);
    free(in->required);
}

static int input_index(const Inputs *in, const char *name)
{
    for (int i = 0; name && i < in->n; i++)
        if (!strcmp(in->names[i], name)) return i;
    return -1;
}

static bool check_call(const Ast *a, AstId e, const KeySpec *ks, const Inputs *in, RecipeValue *out, Diag *d)
{
    const AstNode *n = ast_node(a, e);
    AstId callee = n->kind == AST_CALL ? ast_kid(a, e, 0) : e;
    const char *fname = ast_node(a, callee)->kind == AST_NAME ? ast_str(a, callee) : NULL;
    const char *names[16];
    int nc = 0;
    FOR_CALLS(c, ks) if (nc < 16) names[nc++] = c->name;
    StrBuf list;
    sb_init(&list);
    for (int i = 0; i < nc; i++) sb_printf(&list, "%s%s", i ? ", " : "", names[i]);
    const CallSpec *cs = NULL;
    FOR_CALLS(c, ks) if (fname && !strcmp(c->name, fname)) cs = c;
    if (!cs) {
        const char *near = fname ? nearest(fname, names, nc) : NULL;
        if (!fname) diag_error(d, n->loc, "%s: expected one of %s, e.g. %s(...)", ks->key, list.data, names[0]);
        else if (near) diag_error(d, ast_node(a, callee)->loc, "unknown %s '%s' (did you mean '%s'?)", ks->key, fname, near);
        else diag_error(d, ast_node(a, callee)->loc, "unknown %s '%s'; expected one of: %s", ks->key, fname, list.data);
        sb_free(&list);
        return false;
    }
    sb_free(&list);
    out->kind = RV_CALL;
    out->str = xstrdup(cs->name);
    out->loc = n->loc;
    bool ok = true;
    int npos = 0;
    for (int k = 1; n->kind == AST_CALL && k < n->nkids; k++) {
        AstId arg = ast_kid(a, e, k);
        const AstNode *an = ast_node(a, arg);
        const char *kw = an->kind == AST_KWARG ? ast_str(a, arg) : NULL;
        AstId val = kw ? ast_kid(a, arg, 0) : arg;
        const ArgSpec *as = NULL;
        if (!kw) {
            int i = 0;
            for (const ArgSpec *s = cs->args; s->name; s++, i++)
                if (i == npos) as = s;
            npos++;
            if (!as || cs->input_map) {
                diag_error(d, an->loc, "%s(...): too many positional arguments%s", cs->name,
                           cs->input_map ? "; name each model input: input = \"path\"" : "");
                ok = false;
                continue;
            }
        } else {
            for (const ArgSpec *s = cs->args; s->name; s++)
                if (!strcmp(s->name, kw)) as = s;
        }
        if (!as && cs->input_map && input_index(in, kw) >= 0) {
            /* A model input mapped to its file. */
            RecipeValue *v = push(&out->args, &out->nargs);
            v->key = xstrdup(kw);
            if (!convert(a, val, A_STR, 0, 0, NULL, kw, v, d)) ok = false;
            continue;
        }
        if (!as) {
            const char *cands[32];
            int ncand = 0;
            for (const ArgSpec *s = cs->args; s->name && ncand < 32; s++) cands[ncand++] = s->name;
            for (int i = 0; cs->input_map && i < in->n && ncand < 32; i++) cands[ncand++] = in->names[i];
            const char *near = nearest(kw, cands, ncand);
            StrBuf takes;
            sb_init(&takes);
            for (const ArgSpec *sp = cs->args; sp->name; sp++) sb_printf(&takes, "%s%s", takes.len ? ", " : "", sp->name);
            if (cs->input_map && !near)
                diag_error(d, an->loc, "%s(...): '%s' is not an input of the model", cs->name, kw);
            else if (near) diag_error(d, an->loc, "%s(...) has no argument '%s' (did you mean '%s'?)", cs->name, kw, near);
            else diag_error(d, an->loc, "%s(...) has no argument '%s'; it takes: %s", cs->name, kw, takes.data);
            sb_free(&takes);
            ok = false;
            continue;
        }
        if (recipe_arg(out, as->name)) {
            diag_error(d, an->loc, "%s(...): argument '%s' is given twice", cs->name, as->name);
            ok = false;
            continue;
        }
        RecipeValue *v = push(&out->args, &out->nargs);
        v->key = xstrdup(as->name);
        StrBuf what;
        sb_init(&what);
        sb_printf(&what, "%s(%s)", cs->name, as->name);
        if (!convert(a, val, as->kind, as->lo, as->hi, as->choices, what.data, v, d)) ok = false;
        else if (as->kind == A_NAME && !*as->choices && input_index(in, v->str) < 0) {
            diag_error(d, v->loc, "%s: '%s' is not an input of the model", what.data, v->str);
            ok = false;
        }
        sb_free(&what);
    }
    for (const ArgSpec *as = cs->args; ok && as->name; as++)
        if (!as->dflt && !recipe_arg(out, as->name)) {
            diag_error(d, n->loc, "%s(...): missing argument '%s'", cs->name, as->name);
            ok = false;
        }
    if (ok && cs->input_map) {
        /* Every input of the model must come from a file. */
        for (int i = 0; i < in->n; i++) {
            if (!in->required[i] || recipe_arg(out, in->names[i])) continue;
            diag_error(d, n->loc, "%s(...): no file for model input '%s'", cs->name, in->names[i]);
            ok = false;
        }
    }
    /* every(steps = N) alone acts by steps only: its epochs default to 0, not 1, so that
     * the completed recipe (kiln check) says what runs; steps and epochs act both when
     * both are non-zero. */
    const RecipeValue *steps = ok && !strcmp(cs->name, "every") ? recipe_arg(out, "steps") : NULL;
    if (steps && steps->num != 0 && !recipe_arg(out, "epochs")) {
        RecipeValue *v = push(&out->args, &out->nargs);
        v->key = xstrdup("epochs");
        set_default(v, A_INT, "0");
    }
    if (ok) fill_call_defaults(out, cs);
    return ok;
}

int64_t recipe_batch_hint(const Ast *a, AstId train)
{
    if (train == AST_NONE) return 64;
    const AstNode *tn = ast_node(a, train);
    for (int k = 0; k < tn->nkids; k++) {
        AstId key = ast_kid(a, train, k);
        if (strcmp(ast_str(a, key), "batch")) continue;
        double v;
        bool is_int;
        /* An invalid batch is reported by recipe_check; bound the symbol meanwhile. */
        if (fold_number(a, ast_kid(a, key, 0), &v, &is_int) && v >= 1 && v <= (1 << 24)) return (int64_t)v;
        return 64;
    }
    return 64;
}

static bool is_call(const RecipeValue *v, const char *name)
{
    return v && v->kind == RV_CALL && !strcmp(v->str, name);
}

/* The optimizer's arguments together, as PyTorch's constructors check them (SGD:
 * Nesterov needs momentum and no dampening; Adam: 0 <= beta < 1), plus what would be
 * accepted but do nothing (dampening without momentum, decay = ... without weight decay)
 * and eps = 0, which turns the update of any parameter whose gradient is 0 into 0/0. The
 * training program checks the same after its flags (runtime/optim.c). */
static bool check_optimizer(const RecipeValue *opt, Diag *d)
{
    bool ok = true;
    const char *k = opt->str;
    const RecipeValue *wd = recipe_arg(opt, "weight_decay"), *decay = recipe_arg(opt, "decay");
    if (!strcmp(k, "SGD")) {
        const RecipeValue *mom = recipe_arg(opt, "momentum"), *damp = recipe_arg(opt, "dampening"),
                          *nest = recipe_arg(opt, "nesterov");
        if (nest->num && mom->num <= 0) {
            diag_error(d, nest->loc, "SGD: nesterov = true needs a momentum > 0, found momentum = %g (e.g. momentum = 0.9)", mom->num);
            ok = false;
        }
        if (nest->num && damp->num != 0) {
            diag_error(d, damp->loc, "SGD: nesterov = true needs dampening = 0, found dampening = %g", damp->num);
            ok = false;
        } else if (!nest->num && damp->num != 0 && mom->num == 0) {
            diag_error(d, damp->loc, "SGD: dampening = %g has no effect without momentum (momentum = 0)", damp->num);
            ok = false;
        }
    } else {
        const RecipeValue *betas = recipe_arg(opt, "betas"), *eps = recipe_arg(opt, "eps");
        for (int i = 0; betas && i < 2 && i < betas->nargs; i++)
            if (!(betas->args[i].num < 1)) {
                diag_error(d, betas->args[i].loc, "%s(betas): beta%d = %g must be below 1 (0 <= beta < 1)", k, i + 1, betas->args[i].num);
                ok = false;
            }
        if (eps && !(eps->num > 0)) {
            diag_error(d, eps->loc, "%s(eps): must be greater than 0, found %g (the update of a parameter whose gradient is 0 would be 0/0)", k,
                       eps->num);
            ok = false;
        }
    }
    const RecipeValue *lr = recipe_arg(opt, "lr");
    if (!(lr->num > 0)) {
        diag_error(d, lr->loc, "%s(lr): the learning rate must be greater than 0, found %g", k, lr->num);
        ok = false;
    }
    if (!decay->is_default && wd->num == 0) {
        diag_error(d, decay->loc, "%s: decay = %s has no effect: weight_decay is 0", k, decay->str);
        ok = false;
    }
    return ok;
}

/* Loss scaling acts in fp16 training only (bf16 and fp32 have fp32's exponent range: no
 * gradient to keep from underflowing), and loss_scale_init and _growth_interval only for a
 * dynamic scale: anything else would be accepted and do nothing. The precision here is
 * the recipe's; kiln build --precision checks the same against its own (cli/main.c). */
static bool check_loss_scale(const Recipe *r, Diag *d)
{
    const RecipeValue *prec = recipe_get(r, "precision"), *scale = recipe_get(r, "loss_scale");
    const RecipeValue *init = recipe_get(r, "loss_scale_init"), *interval = recipe_get(r, "loss_scale_growth_interval");
    const bool fp16 = prec && prec->str && recipe_precision_dtype(prec->str) == DT_F16;
    bool ok = true;
    if (scale && scale->kind == RV_NUM && !(scale->num > 0)) {
        diag_error(d, scale->loc, "loss_scale: a static scale must be greater than 0, found %g", scale->num);
        ok = false;
    } else if (scale && !fp16 && !(scale->kind == RV_NAME && !strcmp(scale->str, "none"))) {
        diag_error(d, scale->loc, "loss_scale applies to fp16 training only (precision = fp16); precision = %s keeps fp32's exponent "
                   "range and scales nothing (remove loss_scale, or write loss_scale = none)", prec ? prec->str : "fp32");
        ok = false;
    }
    if (init && !(init->num > 0)) {
        diag_error(d, init->loc, "loss_scale_init: the scale must be greater than 0, found %g", init->num);
        ok = false;
    }
    const bool dynamic = fp16 && (!scale || (scale->kind == RV_NAME && !strcmp(scale->str, "dynamic")));
    const RecipeValue *extra[2] = {init, interval};
    for (int i = 0; i < 2 && ok; i++) {
        if (!extra[i] || dynamic) continue;
        if (!fp16)
            diag_error(d, extra[i]->loc, "%s has no effect: loss scaling applies to fp16 training only (precision = %s)", extra[i]->key,
                       prec ? prec->str : "fp32");
        else diag_error(d, extra[i]->loc, "%s has no effect: it sets the dynamic scale, and loss_scale is %s", extra[i]->key,
                        scale->kind == RV_NUM ? "a static number" : "none");
        ok = false;
    }
    return ok;
}

/* onecycle(max_lr = X) sets every parameter's rate, from X / div_factor up to X, as
 * PyTorch's OneCycleLR overwrites each param group's lr: an optimizer lr or a group lr
 * written beside it would be ignored. */
static bool check_max_lr(const Recipe *r, Diag *d)
{
    const RecipeValue *sched = recipe_get(r, "schedule"), *opt = recipe_get(r, "optimizer"), *groups = recipe_get(r, "groups");
    const RecipeValue *max_lr = is_call(sched, "onecycle") ? recipe_arg(sched, "max_lr") : NULL;
    if (!max_lr) return true;
    if (!(max_lr->num > 0)) {
        diag_error(d, max_lr->loc, "onecycle(max_lr): the peak learning rate must be greater than 0, found %g", max_lr->num);
        return false;
    }
    const RecipeValue *lr = opt && opt->kind == RV_CALL ? recipe_arg(opt, "lr") : NULL;
    if (lr && !lr->is_default) {
        diag_error(d, lr->loc, "%s(lr) has no effect: onecycle(max_lr = %g) sets the learning rate (from max_lr / div_factor up to max_lr, "
                   "as OneCycleLR overwrites the optimizer's); leave one of the two out", opt->str, max_lr->num);
        return false;
    }
    for (int32_t i = 0; groups && groups->kind == RV_LIST && i < groups->nargs; i++) {
        const RecipeValue *glr = recipe_arg(&groups->args[i], "lr");
        if (glr) {
            diag_error(d, glr->loc, "group(lr) has no effect: onecycle(max_lr = %g) sets every parameter's learning rate (leave max_lr "
                       "out to peak at each group's lr)", max_lr->num);
            return false;
        }
    }
    return true;
}

/* Keys and arguments that each pass the schema but together would be ignored by the
 * training program, or refused by it only after it loaded the data. Errors point at the
 * value written in the file that has no effect or conflicts. */
static bool check_combinations(const Recipe *r, const Inputs *in, Diag *d)
{
    bool ok = true;
    const RecipeValue *opt = recipe_get(r, "optimizer");
    if (opt && opt->kind == RV_CALL && !check_optimizer(opt, d)) ok = false;
    const RecipeValue *steps = recipe_get(r, "steps"), *epochs = recipe_get(r, "epochs");
    if (steps && epochs && !epochs->is_default) {
        diag_error(d, epochs->loc, "epochs = %.0f has no effect: steps = %.0f is given and overrides it; keep one of the two", epochs->num,
                   steps->num);
        ok = false;
    }
    if (!check_loss_scale(r, d)) ok = false;
    if (!check_max_lr(r, d)) ok = false;
    const RecipeValue *rounding = recipe_get(r, "weight_rounding"), *prec = recipe_get(r, "precision");
    if (rounding && rounding->str && !strcmp(rounding->str, "stochastic") && !(prec && prec->str && recipe_precision_dtype(prec->str) == DT_BF16)) {
        diag_error(d, rounding->loc, "weight_rounding = stochastic applies to bf16 training only (precision = bf16); precision = %s has no "
                   "bf16 copies of the weights to round", prec && prec->str ? prec->str : "fp32");
        ok = false;
    }
    const RecipeValue *data = recipe_get(r, "data"), *eval_data = recipe_get(r, "eval_data"), *sample = recipe_get(r, "sample");
    bool lm = is_call(data, "text") || is_call(data, "tokens");
    if (eval_data) {
        const RecipeValue *eval_val = recipe_arg(eval_data, "val"), *val = data ? recipe_arg(data, "val") : NULL;
        if (lm) {
            diag_error(d, eval_data->loc, "eval_data has no effect with %s(...) data, which evaluates on its val split (val = ...)", data->str);
            ok = false;
        } else if (eval_val && !eval_val->is_default) {
            diag_error(d, eval_val->loc, "eval_data: val = %g has no effect: all of eval_data is evaluated", eval_val->num);
            ok = false;
        } else if (val && !val->is_default && val->num > 0) {
            diag_error(d, val->loc, "%s(val): val = %g has no effect: eval_data is given and replaces the val split", data->str, val->num);
            ok = false;
        }
    }
    if (lm) {
        /* The training program feeds each window to the first input and the next tokens to
         * the second: input and target must name them, in that order. */
        const RecipeValue *input = recipe_arg(data, "input"), *target = recipe_arg(data, "target");
        if (in->n != 2) {
            diag_error(d, data->loc, "%s(...) data feeds a model with two inputs (tokens and their targets); this model has %d", data->str,
                       in->n);
            ok = false;
        } else if (strcmp(input->str, in->names[0])) {
            diag_error(d, input->loc, "%s(input): the token windows go to the model's first input '%s', found '%s'", data->str, in->names[0],
                       input->str);
            ok = false;
        } else if (strcmp(target->str, in->names[1])) {
            diag_error(d, target->loc, "%s(target): the next tokens go to the model's second input '%s', found '%s'", data->str,
                       in->names[1], target->str);
            ok = false;
        }
    }
    if (sample && data && !lm) {
        diag_error(d, sample->loc, "sample = generate(...) is for language models trained on text(...) or tokens(...) data; data is %s(...)",
                   data->str);
        ok = false;
    } else if (sample && lm && recipe_arg(data, "val")->num == 0) {
        diag_error(d, sample->loc, "sample = generate(...) prints at each evaluation, but %s(..., val = 0) keeps no data to evaluate",
                   data->str);
        ok = false;
    }
    return ok;
}

/* Does `pat` (dotted segments, '*' for any one segment, as init rules) match `name`? */
static bool pattern_matches(const char *pat, const char *name)
{
    for (;;) {
        size_t pl = strcspn(pat, "."), nl = strcspn(name, ".");
        if (!(pl == 1 && pat[0] == '*') && !(pl == nl && !strncmp(pat, name, pl))) return false;
        pat += pl;
        name += nl;
        if (!*pat || !*name) return !*pat && !*name;
        pat++;
        name++;
    }
}

/* The model's trainable parameters, by state_dict name (none when lowering failed). */
typedef struct {
    const char **names;
    int n;
} Params;

/* groups = [group("PATTERN", lr = ..., weight_decay = ...), ...]: each group takes the
 * trainable parameters its pattern matches that no earlier group took (the first matching
 * group wins), listed in its `params` argument for the training program. A group that
 * sets nothing, or takes no parameter, would do nothing: an error. */
static bool check_groups(const Ast *a, AstId e, const KeySpec *ks, const Inputs *in, const Params *ps, RecipeValue *out, Diag *d)
{
    const AstNode *n = ast_node(a, e);
    out->loc = n->loc;
    if (n->kind != AST_LIST) {
        diag_error(d, n->loc, "groups: expected a list of groups, e.g. [group(\"*.bias\", weight_decay = 0)], found %s", ast_desc(a, e));
        return false;
    }
    out->kind = RV_LIST;
    bool ok = true;
    char *taken = calloc((size_t)ps->n + 1, 1);
    for (int k = 0; k < n->nkids; k++) {
        AstId ge = ast_kid(a, e, k);
        RecipeValue *g = push(&out->args, &out->nargs);
        if (!check_call(a, ge, ks, in, g, d)) {
            ok = false;
            continue;
        }
        const RecipeValue *pat = recipe_arg(g, "pattern"), *lr = recipe_arg(g, "lr"), *wd = recipe_arg(g, "weight_decay");
        if (!lr && !wd) {
            diag_error(d, g->loc, "group(\"%s\") sets neither lr nor weight_decay: it would change nothing", pat->str);
            ok = false;
            continue;
        }
        if (lr && !(lr->num > 0)) {
            diag_error(d, lr->loc, "group(lr): the learning rate must be greater than 0, found %g", lr->num);
            ok = false;
            continue;
        }
        if (!ps->names) continue; /* lowering failed: reported there */
        StrBuf list;
        sb_init(&list);
        bool earlier = false;
        for (int i = 0; i < ps->n; i++) {
            if (!pattern_matches(pat->str, ps->names[i])) continue;
            if (taken[i]) {
                earlier = true;
                continue;
            }
            taken[i] = 1;
            sb_printf(&list, "%s%s", list.len ? "," : "", ps->names[i]);
        }
        if (!list.len) {
            if (earlier)
                diag_error(d, pat->loc, "group(\"%s\"): every parameter it matches is in an earlier group (the first matching group wins)",
                           pat->str);
            else {
                StrBuf all;
                sb_init(&all);
                for (int i = 0; i < ps->n; i++) sb_printf(&all, "%s%s", i ? ", " : "", ps->names[i]);
                diag_error(d, pat->loc, "group(\"%s\"): the pattern matches no parameter of the model (its parameters: %s)", pat->str,
                           all.len ? all.data : "none");
                sb_free(&all);
            }
            ok = false;
        } else {
            const Loc at = pat->loc; /* push moves g->args, and pat with them */
            RecipeValue *pv = push(&g->args, &g->nargs);
            pv->key = xstrdup("params");
            pv->kind = RV_STR;
            pv->str = xstrdup(list.data);
            pv->loc = at;
        }
        sb_free(&list);
    }
    free(taken);
    return ok;
}

static bool check_recipe(Recipe *r, const Ast *a, AstId train, const Inputs *in, const Params *ps, Diag *d)
{
    bool ok = true;
    const char *names[NKEYS];
    for (int i = 0; i < NKEYS; i++) names[i] = keys[i].key;
    const AstNode *tn = train != AST_NONE ? ast_node(a, train) : NULL;
    for (int k = 0; tn && k < tn->nkids; k++) {
        AstId key = ast_kid(a, train, k);
        const char *name = ast_str(a, key);
        const KeySpec *ks = NULL;
        for (int i = 0; i < NKEYS; i++)
            if (!strcmp(keys[i].key, name)) ks = &keys[i];
        Loc loc = ast_node(a, key)->loc;
        if (!ks) {
            const char *near = nearest(name, names, NKEYS);
            if (near) diag_error(d, loc, "unknown train key '%s' (did you mean '%s'?)", name, near);
            else {
                StrBuf all;
                sb_init(&all);
                for (int i = 0; i < NKEYS; i++) sb_printf(&all, "%s%s", i ? ", " : "", names[i]);
                diag_error(d, loc, "unknown train key '%s'; known keys: %s", name, all.data);
                sb_free(&all);
            }
            ok = false;
            continue;
        }
        if (recipe_get(r, name)) {
            diag_error(d, loc, "train key '%s' is given twice", name);
            ok = false;
            continue;
        }
        RecipeValue *v = push(&r->entries, &r->n);
        v->key = xstrdup(name);
        AstId val = ast_kid(a, key, 0);
        const AstKind vk = (AstKind)ast_node(a, val)->kind;
        const uint8_t kind = ks->kind == A_SCALE ? (vk == AST_NAME || vk == AST_STRING ? A_NAME : A_NUM) : ks->kind;
        bool good = kind == A_CALL     ? check_call(a, val, ks, in, v, d)
                    : kind == A_GROUPS ? check_groups(a, val, ks, in, ps, v, d)
                                       : convert(a, val, kind, ks->lo, ks->hi, ks->choices, name, v, d);
        if (!good) {
            ok = false;
            free_value(v);
            r->n--;
        }
    }
    const RecipeValue *budget = recipe_get(r, "memory_budget");
    int64_t budget_bytes;
    if (budget && (!util_parse_size(budget->str, &budget_bytes) || budget_bytes <= 0)) {
        diag_error(d, budget->loc, "memory_budget = \"%s\" is not a size (e.g. \"1.5GiB\", \"800MiB\", \"2GB\", \"4096\")", budget->str);
        ok = false;
    }
    if (!ok) return false;
    /* Defaults for everything not written, so the full recipe is explicit. */
    for (int i = 0; i < NKEYS; i++) {
        const KeySpec *ks = &keys[i];
        if (!ks->dflt || !ks->dflt[0] || recipe_get(r, ks->key)) continue;
        RecipeValue *v = push(&r->entries, &r->n);
        v->key = xstrdup(ks->key);
        if (ks->kind == A_CALL) {
            const CallSpec *cs = NULL;
            FOR_CALLS(c, ks) if (!strcmp(c->name, ks->dflt)) cs = c;
            v->kind = RV_CALL;
            v->is_default = true;
            v->str = xstrdup(cs->name);
            fill_call_defaults(v, cs);
        } else set_default(v, ks->kind, ks->dflt);
    }
    return check_combinations(r, in, d);
}

/* The training program reads `batch` samples into the leading dimension of the model's
 * inputs: a batch written in the train section must fit the first input's leading size,
 * a symbol's bound (`dim B <= 8` with batch = 16 built a program that refused its own
 * recipe) or a fixed size (`const B = 4` with batch = 16 trained on mismatched rows). */
static bool check_batch(const Ast *a, AstId train, const Graph *g, const Recipe *r, Diag *d)
{
    const RecipeValue *bv = recipe_get(r, "batch");
    AstId key = AST_NONE;
    const AstNode *tn = train != AST_NONE ? ast_node(a, train) : NULL;
    for (int k = 0; tn && k < tn->nkids; k++)
        if (!strcmp(ast_str(a, ast_kid(a, train, k)), "batch")) key = ast_kid(a, train, k);
    NodeId first = IR_NONE;
    for (NodeId i = 0; g && i < g->nnodes && first == IR_NONE; i++)
        if (g->nodes[i].op == OP_INPUT) first = i;
    if (!bv || bv->kind != RV_NUM || key == AST_NONE || first == IR_NONE || g->nodes[first].shape.rank == 0) return true;
    int64_t batch = (int64_t)bv->num;
    Dim lead = g->nodes[first].shape.d[0];
    Loc loc = ast_node(a, ast_kid(a, key, 0))->loc;
    const char *name = ir_node_name(g, first);
    if (lead.nsym == 1 && lead.k == 1) {
        const Symbol *sym = &g->syms[lead.sym[0]];
        if (batch <= sym->max) return true;
        diag_error(d, loc,
                   "batch = %lld is larger than the bound of '%s' (%lld), the leading size of the first input '%s': "
                   "write `dim %s <= %lld` or a smaller batch",
                   (long long)batch, sym->name, (long long)sym->max, name, sym->name, (long long)batch);
        return false;
    }
    if (lead.nsym == 0 && lead.k != batch) {
        diag_error(d, loc,
                   "batch = %lld, but the first input '%s' has a fixed leading size %lld: the training program reads batch "
                   "samples into it; write `batch = %lld`, or give '%s' a symbolic batch size such as [B, ...]",
                   (long long)batch, name, (long long)lead.k, (long long)lead.k, name);
        return false;
    }
    return true;
}

bool recipe_check(Recipe *r, const Ast *a, AstId train, const Graph *g, Diag *d)
{
    memset(r, 0, sizeof *r);
    Inputs in;
    inputs_collect(&in, a, g);
    Params ps = {NULL, 0};
    int32_t nparams = 0; /* counted first: one allocation, not one per parameter (linear time) */
    for (NodeId i = 0; g && i < g->nnodes; i++) nparams += g->nodes[i].op == OP_PARAM && ir_attrs(g, i)[1] != 0;
    if (nparams) ps.names = xmalloc((size_t)nparams * sizeof *ps.names);
    for (NodeId i = 0; g && i < g->nnodes; i++)
        if (g->nodes[i].op == OP_PARAM && ir_attrs(g, i)[1] != 0) ps.names[ps.n++] = ir_node_name(g, i);
    bool ok = check_recipe(r, a, train, &in, &ps, d);
    free(ps.names);
    inputs_free(&in);
    return check_batch(a, train, g, r, d) && ok;
}

void recipe_schema(StrBuf *out)
{
    for (int i = 0; i < NKEYS; i++) {
        sb_printf(out, "%s\n", keys[i].key);
        FOR_CALLS(c, &keys[i]) {
            if (c->input_map) sb_printf(out, "%s=%s.INPUT\n", keys[i].key, c->name);
            for (const ArgSpec *as = c->args; as->name; as++) sb_printf(out, "%s=%s.%s\n", keys[i].key, c->name, as->name);
        }
    }
}

void recipe_free(Recipe *r)
{
    for (int32_t i = 0; i < r->n; i++) free_value(&r->entries[i]);
    free(r->entries);
    memset(r, 0, sizeof *r);
}

int recipe_precision_dtype(const char *name)
{
    if (!strcmp(name, "fp32") || !strcmp(name, "f32")) return DT_F32;
    if (!strcmp(name, "bf16")) return DT_BF16;
    if (!strcmp(name, "fp16") || !strcmp(name, "f16")) return DT_F16;
    return -1;
}

const RecipeValue *recipe_get(const Recipe *r, const char *key)
{
    for (int32_t i = 0; i < r->n; i++)
        if (!strcmp(r->entries[i].key, key)) return &r->entries[i];
    return NULL;
}

const RecipeValue *recipe_arg(const RecipeValue *call, const char *key)
{
    for (int32_t i = 0; i < call->nargs; i++)
        if (call->args[i].key && !strcmp(call->args[i].key, key)) return &call->args[i];
    return NULL;
}

double recipe_num(const Recipe *r, const char *key, double dflt)
{
    const RecipeValue *v = recipe_get(r, key);
    return v && v->kind == RV_NUM ? v->num : dflt;
}

static void print_value(const RecipeValue *v, StrBuf *out)
{
    char num[64];
    switch ((RecipeValueKind)v->kind) {
    case RV_NUM:
        if (v->is_int) snprintf(num, sizeof num, "%.0f", v->num);
        else snprintf(num, sizeof num, "%g", v->num);
        sb_puts(out, num);
        break;
    case RV_STR: sb_printf(out, "\"%s\"", v->str); break;
    case RV_NAME: sb_puts(out, v->str); break;
    case RV_BOOL: sb_puts(out, v->num ? "true" : "false"); break;
    case RV_LIST:
    case RV_CALL:
        if (v->kind == RV_CALL) sb_puts(out, v->str);
        sb_putc(out, v->kind == RV_CALL ? '(' : '[');
        for (int32_t i = 0; i < v->nargs; i++) {
            if (i) sb_puts(out, ", ");
            if (v->kind == RV_CALL && v->args[i].key && v->args[i].key[0]) sb_printf(out, "%s = ", v->args[i].key);
            print_value(&v->args[i], out);
        }
        sb_putc(out, v->kind == RV_CALL ? ')' : ']');
        break;
    }
}

void recipe_print(const Recipe *r, StrBuf *out)
{
    for (int32_t i = 0; i < r->n; i++) {
        sb_printf(out, "  %-11s = ", r->entries[i].key);
        print_value(&r->entries[i], out);
        sb_puts(out, r->entries[i].is_default ? "   (default)\n" : "\n");
    }
}
