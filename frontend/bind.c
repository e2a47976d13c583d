/* bind.c — binding call arguments to signatures, and parameter initialisation.
 *
 * Every function, built-in module and initialiser declares its arguments as a signature
 * string ("x, axis|dim=-1, keepdim=false, *rest"), so unknown, repeated and missing
 * arguments all get the same clear messages. Parameters are created here with their
 * PyTorch default init, overridden by the `init` rules that match them. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- argument binding ---- */

static bool parse_default(const char *text, Value *out)
{
    if (!strcmp(text, "none")) { *out = value_none(); return true; }
    /* a string default ("mean") is shown in messages; the function reads it as not given */
    if (text[0] == '"') { *out = value_none(); return true; }
    if (!strcmp(text, "true") || !strcmp(text, "false")) {
        *out = (Value){.kind = V_BOOL, .num = text[0] == 't', .node = IR_NONE};
        return true;
    }
    char *end;
    double v = strtod(text, &end);
    *out = value_num(v, !strpbrk(text, ".eEn"));
    return *end == 0;
}

/* Splits a signature into its parameters; each entry is "name|alias" and an optional
 * default. Returns the count, or -1 for a malformed signature (a Kiln bug). */
typedef struct {
    char names[3][24];
    int nnames;
    char dflt[24];
    bool has_default, rest;
} SigParam;

/* NumPy's `axis` and PyTorch's `dim` (and `axes`/`dims`) name the same thing: whichever a
 * signature declares, the other is accepted too, so every function that takes an axis
 * takes both spellings without each signature having to list them. */
static void add_axis_alias(SigParam *q)
{
    static const char *const pairs[][2] = {{"axis", "dim"}, {"axes", "dims"}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++)
        for (int side = 0; side < 2; side++) {
            bool has = false, other = false;
            for (int i = 0; i < q->nnames; i++) {
                has |= !strcmp(q->names[i], pairs[k][side]);
                other |= !strcmp(q->names[i], pairs[k][!side]);
            }
            if (has && !other && q->nnames < 3) strcpy(q->names[q->nnames++], pairs[k][!side]);
        }
}

static int parse_sig(const char *sig, SigParam *ps, int max)
{
    int n = 0;
    const char *p = sig;
    while (*p && n < max) {
        while (*p == ' ' || *p == ',') p++;
        if (!*p) break;
        SigParam *q = &ps[n];
        memset(q, 0, sizeof *q);
        if (*p == '*') { q->rest = true; p++; }
        for (;;) {
            size_t len = strcspn(p, "|=, ");
            if (len >= sizeof q->names[0] || q->nnames >= 3) return -1;
            memcpy(q->names[q->nnames++], p, len);
            p += len;
            if (*p != '|') break;
            p++;
        }
        add_axis_alias(q);
        if (*p == '=') {
            p++;
            size_t len = strcspn(p, ", ");
            if (len >= sizeof q->dflt) return -1;
            memcpy(q->dflt, p, len);
            q->has_default = true;
            p += len;
        }
        n++;
    }
    return n;
}

/* The signature as a user writes the call, into out: "leaky_relu(x, negative_slope=0.01)"
 * (first names only, aliases left out). */
static void sig_format(StrBuf *out, const char *fname, const SigParam *ps, int np)
{
    sb_printf(out, "%s(", fname);
    for (int i = 0; i < np; i++)
        sb_printf(out, "%s%s%s%s%s", i ? ", " : "", ps[i].rest ? "*" : "", ps[i].names[0], ps[i].has_default ? "=" : "",
                  ps[i].has_default ? ps[i].dflt : "");
    sb_puts(out, ")");
}

static int sig_index(const SigParam *ps, int n, const char *name)
{
    for (int i = 0; i < n; i++)
        for (int k = 0; k < ps[i].nnames; k++)
            if (!ps[i].rest && !strcmp(ps[i].names[k], name)) return i;
    return -1;
}

bool lower_bind_args(Lower *L, Scope *s, int32_t inst, AstId call, const char *fname, const char *sig,
                     BoundArgs *out)
{
    SigParam ps[CALL_MAX_ARGS];
    int np = parse_sig(sig, ps, CALL_MAX_ARGS);
    memset(out, 0, sizeof *out);
    if (np < 0) {
        lower_error(L, call, "internal error: bad signature for %s", fname);
        return false;
    }
    out->n = np;
    int rest = -1;
    for (int i = 0; i < np; i++) {
        out->at[i] = call;
        if (ps[i].rest) rest = i;
    }
    const AstNode *cn = ast_node(L->ast, call);
    int npos = 0;
    bool ok = true, seen_kw = false;
    if (L->method_self) { /* x.f(a): x is f's first argument */
        if (np > 0 && ps[0].rest) {
            out->rest_at[0] = call;
            out->rest[out->nrest++] = *L->method_self;
        } else if (np > 0) {
            out->v[0] = *L->method_self;
            out->at[0] = call;
            out->given[0] = true;
            npos = 1;
        }
        L->method_self = NULL;
    }
    for (int k = 1; k < cn->nkids; k++) {
        AstId a = ast_kid(L->ast, call, k);
        const AstNode *an = ast_node(L->ast, a);
        if (an->kind == AST_KWARG) {
            seen_kw = true;
            const char *kw = ast_str(L->ast, a);
            int i = sig_index(ps, np, kw);
            if (i < 0) {
                const char *best = NULL;
                int bestd = 1000;
                StrBuf names;
                sb_init(&names);
                for (int j = 0; j < np; j++) {
                    if (ps[j].rest) continue;
                    lower_consider(ps[j].names[0], kw, &best, &bestd);
                    sb_printf(&names, "%s%s", names.len ? ", " : "", ps[j].names[0]);
                }
                if (bestd <= 2)
                    lower_error(L, a, "%s has no argument '%s' (did you mean '%s'?)", fname, kw, best);
                else {
                    names.len = 0;
                    sig_format(&names, fname, ps, np);
                    lower_error(L, a, "%s has no argument '%s' (expected %s)", fname, kw, names.data);
                }
                sb_free(&names);
                ok = false;
                continue;
            }
            if (out->given[i]) {
                const char *prev = out->at[i] >= 0 && ast_node(L->ast, out->at[i])->kind == AST_KWARG ? ast_str(L->ast, out->at[i]) : "";
                if (prev[0] && strcmp(prev, kw))
                    lower_error(L, a, "%s: '%s' and '%s' name the same argument; give one of them", fname, prev, kw);
                else
                    lower_error(L, a, "%s: argument '%s' is given twice", fname, ps[i].names[0]);
                ok = false;
                continue;
            }
            out->v[i] = lower_expr(L, s, inst, ast_kid(L->ast, a, 0));
            out->at[i] = a;
            out->given[i] = true;
            continue;
        }
        if (seen_kw) {
            lower_error(L, a, "%s: a positional argument cannot follow keyword arguments", fname);
            ok = false;
            continue;
        }
        Value v = lower_expr(L, s, inst, a);
        if (npos < np && !ps[npos].rest) {
            out->v[npos] = v;
            out->at[npos] = a;
            out->given[npos] = true;
            npos++;
        } else if (rest >= 0 && npos >= rest) {
            if (out->nrest >= (int)(sizeof out->rest / sizeof out->rest[0])) {
                lower_error(L, a, "%s: too many arguments", fname);
                return false;
            }
            out->rest_at[out->nrest] = a;
            out->rest[out->nrest++] = v;
        } else {
            int maxpos = rest >= 0 ? rest : np, total = 0;
            for (int j = 1; j < cn->nkids; j++) total += ast_node(L->ast, ast_kid(L->ast, call, j))->kind != AST_KWARG;
            StrBuf sg;
            sb_init(&sg);
            sig_format(&sg, fname, ps, np);
            if (maxpos == 0) lower_error(L, a, "%s takes no positional arguments, found %d (expected %s)", fname, total, sg.data);
            else
                lower_error(L, a, "%s takes at most %d positional argument%s, found %d (expected %s)", fname, maxpos, maxpos == 1 ? "" : "s",
                            total, sg.data);
            sb_free(&sg);
            return false;
        }
    }
    for (int i = 0; i < np; i++) {
        if (out->given[i] || ps[i].rest) continue;
        if (ps[i].has_default) {
            parse_default(ps[i].dflt, &out->v[i]);
            continue;
        }
        StrBuf sg;
        sb_init(&sg);
        sig_format(&sg, fname, ps, np);
        lower_error(L, call, "%s: missing argument '%s' (expected %s)", fname, ps[i].names[0], sg.data);
        sb_free(&sg);
        ok = false;
    }
    for (int i = 0; i < np; i++)
        if (out->v[i].kind == V_ERROR && (out->given[i])) ok = false;
    for (int i = 0; i < out->nrest; i++)
        if (out->rest[i].kind == V_ERROR) ok = false;
    return ok;
}

/* ---- parameters and init rules ---- */

/* Does `pattern` (segments with '*', or "Type.name") match param `name` of instance `inst`
 * relative to the rule's owner? */
static bool rule_matches(Lower *L, const InitRule *r, int32_t inst, const char *pname)
{
    /* The owner must be the instance or one of its ancestors. */
    int32_t up = inst;
    while (up >= 0 && up != r->owner) up = L->insts[up].parent;
    if (up < 0) return false;
    const char *pat = r->pattern;
    const char *dot = strchr(pat, '.');
    /* "Type.param": every instance of a module type below the owner. */
    if (dot && !strchr(dot + 1, '.') && pat[0] >= 'A' && pat[0] <= 'Z') {
        size_t tl = (size_t)(dot - pat);
        return strlen(L->insts[inst].type) == tl && !strncmp(L->insts[inst].type, pat, tl) && !strcmp(dot + 1, pname);
    }
    /* Relative path of the parameter from the owner. */
    const char *ipath = L->insts[inst].path, *opath = L->insts[r->owner].path;
    size_t ol = strlen(opath);
    const char *rel = ipath + ol;
    if (*rel == '.') rel++;
    StrBuf full;
    sb_init(&full);
    sb_printf(&full, "%s%s%s", rel, *rel ? "." : "", pname);
    const char *p = pat, *q = full.data;
    bool match = true;
    while (match) {
        size_t pl = strcspn(p, "."), ql = strcspn(q, ".");
        if (!(pl == 1 && p[0] == '*') && !(pl == ql && !strncmp(p, q, pl))) match = false;
        p += pl;
        q += ql;
        if (!*p || !*q) {
            match = match && !*p && !*q;
            break;
        }
        p++;
        q++;
    }
    sb_free(&full);
    return match;
}

/* PyTorch's fan_in and fan_out (torch.nn.init._calculate_fan_in_and_fan_out). */
static void fans(const Shape *s, double *fan_in, double *fan_out)
{
    double receptive = 1;
    for (int i = 2; i < s->rank; i++) receptive *= (double)s->d[i].k;
    *fan_in = s->rank >= 2 ? (double)s->d[1].k * receptive : (s->rank == 1 ? (double)s->d[0].k : 1);
    *fan_out = s->rank >= 1 ? (double)s->d[0].k * receptive : 1;
}

/* Evaluates an init expression (normal(0, 0.02), zeros, xavier_uniform(), ...) for a
 * parameter of shape s; false after reporting an error. */
bool lower_eval_init(Lower *L, const InitRule *r, const Shape *s, InitKind *kind, double *a0, double *a1)
{
    AstId e = r->expr;
    const AstNode *n = ast_node(L->ast, e);
    const char *fname;
    if (n->kind == AST_NAME) fname = ast_str(L->ast, e);
    else if (n->kind == AST_CALL && ast_node(L->ast, ast_kid(L->ast, e, 0))->kind == AST_NAME)
        fname = ast_str(L->ast, ast_kid(L->ast, e, 0));
    else {
        lower_error(L, e, "expected an initialiser such as normal(0, 0.02), uniform(-a, a), zeros, ones, constant(v)");
        return false;
    }
    static const struct {
        const char *name, *sig;
    } inits[] = {
        {"zeros", ""}, {"ones", ""}, {"constant", "value"}, {"uniform", "a=0.0, b=1.0"},
        {"normal", "mean=0.0, std=1.0"}, {"xavier_uniform", "gain=1.0"}, {"xavier_normal", "gain=1.0"},
        {"kaiming_uniform", "a=0.0"}, {"kaiming_normal", "a=0.0"},
    };
    int which = -1;
    for (int i = 0; i < (int)(sizeof inits / sizeof inits[0]); i++)
        if (!strcmp(inits[i].name, fname)) which = i;
    if (which < 0) {
        const char *best = NULL;
        int bestd = 1000;
        for (int i = 0; i < (int)(sizeof inits / sizeof inits[0]); i++) lower_consider(inits[i].name, fname, &best, &bestd);
        if (bestd <= 3) lower_error(L, e, "unknown initialiser '%s' (did you mean '%s'?)", fname, best);
        else lower_error(L, e, "unknown initialiser '%s'; known: zeros, ones, constant, uniform, normal, xavier_uniform, xavier_normal, kaiming_uniform, kaiming_normal", fname);
        return false;
    }
    BoundArgs ba;
    memset(&ba, 0, sizeof ba);
    if (n->kind == AST_CALL) {
        if (!lower_bind_args(L, L->insts[r->owner].scope, r->owner, e, fname, inits[which].sig, &ba)) return false;
    } else {
        if (inits[which].sig[0] && !strchr(inits[which].sig, '=')) {
            lower_error(L, e, "%s needs arguments", fname);
            return false;
        }
        SigParam ps[4];
        int np = parse_sig(inits[which].sig, ps, 4);
        for (int i = 0; i < np; i++) parse_default(ps[i].dflt, &ba.v[i]);
        ba.n = np;
    }
    double v[2] = {0, 0};
    for (int i = 0; i < ba.n; i++)
        if (!value_number(L, ba.v[i], ba.at[i] >= 0 ? ba.at[i] : e, fname, &v[i])) return false;
    double fi, fo;
    fans(s, &fi, &fo);
    switch (which) {
    case 0: *kind = INIT_ZEROS; break;
    case 1: *kind = INIT_ONES; break;
    case 2: *kind = INIT_CONSTANT, *a0 = v[0]; break;
    case 3: *kind = INIT_UNIFORM, *a0 = v[0], *a1 = v[1]; break;
    case 4: *kind = INIT_NORMAL, *a0 = v[0], *a1 = v[1]; break;
    case 5: { double bd = v[0] * sqrt(6.0 / (fi + fo)); *kind = INIT_UNIFORM, *a0 = -bd, *a1 = bd; break; }
    case 6: *kind = INIT_NORMAL, *a0 = 0, *a1 = v[0] * sqrt(2.0 / (fi + fo)); break;
    case 7: { double bd = sqrt(2.0 / (1 + v[0] * v[0])) * sqrt(3.0 / fi); *kind = INIT_UNIFORM, *a0 = -bd, *a1 = bd; break; }
    case 8: *kind = INIT_NORMAL, *a0 = 0, *a1 = sqrt(2.0 / (1 + v[0] * v[0])) / sqrt(fi); break;
    }
    if ((*kind == INIT_NORMAL && !(*a1 >= 0)) || (*kind == INIT_UNIFORM && !(*a0 <= *a1)) || !isfinite(*a0) || !isfinite(*a1)) {
        lower_error(L, e, "%s: invalid arguments (%g, %g): need std >= 0, a <= b, finite values", fname, *a0, *a1);
        return false;
    }
    return true;
}

NodeId lower_param(Lower *L, int32_t inst, const char *name, const Shape *s, InitKind init, double a0, double a1,
                   bool trainable, AstId at)
{
    return lower_param_zero_row(L, inst, name, s, init, a0, a1, trainable, -1, at);
}

NodeId lower_param_zero_row(Lower *L, int32_t inst, const char *name, const Shape *s, InitKind init, double a0, double a1,
                            bool trainable, int64_t zero_row, AstId at)
{
    /* The outermost matching rule wins: the user of a module overrides its defaults. */
    const InitRule *rule = NULL;
    int32_t chain[MAX_MODULE_DEPTH + 2];
    int nchain = 0;
    for (int32_t up = inst; up >= 0 && nchain < MAX_MODULE_DEPTH + 2; up = L->insts[up].parent) chain[nchain++] = up;
    for (int c = nchain - 1; c >= 0 && !rule; c--)
        for (int32_t i = L->nrules - 1; i >= 0; i--) {
            InitRule *r = &L->rules[i];
            if (r->owner == chain[c] && rule_matches(L, r, inst, name)) {
                r->matches++;
                if (!rule) rule = r;
            }
        }
    if (rule && rule->failed) return IR_NONE; /* reported once, at its first parameter */
    if (rule && !lower_eval_init(L, rule, s, &init, &a0, &a1)) {
        ((InitRule *)rule)->failed = true;
        return IR_NONE;
    }
    StrBuf full;
    sb_init(&full);
    sb_printf(&full, "%s%s%s", L->insts[inst].path, L->insts[inst].path[0] ? "." : "", name);
    Loc saved = L->b.loc;
    L->b.loc = lower_loc(L, at);
    NodeId p = ir_b_param_zero_row(&L->b, full.data, s, init, a0, a1, trainable, zero_row);
    L->b.loc = saved;
    sb_free(&full);
    if (p == IR_NONE) lower_builder_error(L, at);
    else lower_add_member(L, inst, name, value_tensor(p));
    return p;
}
