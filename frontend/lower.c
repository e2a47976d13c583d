/* lower.c — checks a parsed model and lowers it to the IR.
 *
 * Lowering is elaboration: the root module's members are instantiated (built-in or user
 * modules, repeated with `[M(...) for N]`), which creates every parameter under its PyTorch
 * state_dict name with its init; then forward, loss and metrics are evaluated with
 * compile-time values (numbers, symbolic sizes, module instances) and tensors built through
 * the checked IR builder. Errors carry the source location and lowering goes on after
 * them (with an error value that silences follow-on errors), so a file's problems are all
 * reported at once. Declarations (consts, dims, modules, members) are checked in check.c. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>


/* ---- values and errors ---- */

Value value_num(double v, bool is_int)
{
    Value r = {.kind = V_NUM, .num = v, .is_int = is_int, .node = IR_NONE};
    return r;
}

Value value_tensor(NodeId n)
{
    Value r = {.kind = n == IR_NONE ? V_ERROR : V_TENSOR, .node = n};
    return r;
}

Value value_error(void)
{
    Value r = {.kind = V_ERROR, .node = IR_NONE};
    return r;
}

Value value_none(void)
{
    Value r = {.kind = V_NONE, .node = IR_NONE};
    return r;
}

Loc lower_loc(Lower *L, AstId at)
{
    if (at < 0 || at >= L->ast->nnodes) {
        Loc l = {L->ast->file, 0, 0};
        return l;
    }
    return L->ast->nodes[at].loc;
}

void lower_error(Lower *L, AstId at, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    diag_vreport(L->d, DIAG_ERROR, lower_loc(L, at), fmt, ap);
    va_end(ap);
    L->failed = true;
}

Value lower_builder_error(Lower *L, AstId at)
{
    /* Only the first message: a failed composite may have collected several. */
    const char *msg = L->err.len ? L->err.data : "invalid operation";
    lower_error(L, at, "%s", msg);
    L->err.len = 0;
    if (L->err.data) L->err.data[0] = 0;
    return value_error();
}

static const char *kind_desc(Value v)
{
    switch ((ValueKind)v.kind) {
    case V_ERROR: return "an error";
    case V_NONE: return "nothing";
    case V_NUM: return v.is_int ? "an integer" : "a number";
    case V_DIM: return "a size";
    case V_STR: return "a string";
    case V_TENSOR: return "a tensor";
    case V_MODULE: return "a module";
    case V_LIST: return "a list of modules";
    case V_TUPLE: return "a list";
    case V_BOOL: return "a boolean";
    }
    return "a value";
}

bool value_is_scalar_number(Value v) { return v.kind == V_NUM || v.kind == V_BOOL; }

bool value_int(Lower *L, Value v, AstId at, const char *what, int64_t *out)
{
    if (v.kind == V_ERROR) return false;
    if (v.kind == V_DIM && ir_dim_is_const(v.dim)) { *out = v.dim.k; return true; }
    if (v.kind == V_NUM && v.num == floor(v.num) && fabs(v.num) < 9.2e18) { *out = (int64_t)v.num; return true; }
    if (v.kind == V_NUM) lower_error(L, at, "%s: expected an integer, found %g", what, v.num);
    else lower_error(L, at, "%s: expected an integer, found %s", what, kind_desc(v));
    return false;
}

bool value_number(Lower *L, Value v, AstId at, const char *what, double *out)
{
    if (v.kind == V_ERROR) return false;
    if (v.kind == V_NUM || v.kind == V_BOOL) { *out = v.num; return true; }
    if (v.kind == V_DIM && ir_dim_is_const(v.dim)) { *out = (double)v.dim.k; return true; }
    lower_error(L, at, "%s: expected a number, found %s", what, kind_desc(v));
    return false;
}

bool value_bool(Lower *L, Value v, AstId at, const char *what, bool *out)
{
    if (v.kind == V_ERROR) return false;
    if (v.kind == V_BOOL || v.kind == V_NUM) { *out = v.num != 0; return true; }
    lower_error(L, at, "%s: expected true or false, found %s", what, kind_desc(v));
    return false;
}

NodeId lower_as_tensor(Lower *L, Value v, DType like)
{
    if (v.kind == V_TENSOR) return v.node;
    if (v.kind == V_NUM || v.kind == V_BOOL) {
        DType t = v.kind == V_BOOL ? DT_BOOL : v.is_int ? (ir_dtype_is_float(like) ? like : DT_I64)
                                                        : (ir_dtype_is_float(like) ? like : DT_F32);
        return ir_b_const(&L->b, v.num, t);
    }
    if (v.kind == V_DIM) {
        if (ir_dim_is_const(v.dim)) return ir_b_const(&L->b, (double)v.dim.k, ir_dtype_is_float(like) ? like : DT_I64);
        /* A symbolic size as a tensor: the sum of ones over an iota of that length. */
        Shape s = ir_shape_make(1, &v.dim);
        NodeId ones = ir_b_full(&L->b, 1.0, DT_I64, &s);
        if (ones == IR_NONE) return IR_NONE;
        return ir_b_reduce(&L->b, OP_REDUCE_SUM, ones, 1, false);
    }
    return IR_NONE;
}

NodeId lower_tensor_arg(Lower *L, Value v, AstId at, const char *what)
{
    if (v.kind == V_ERROR) return IR_NONE;
    if (v.kind == V_TENSOR || v.kind == V_NUM || v.kind == V_BOOL || v.kind == V_DIM) {
        NodeId n = lower_as_tensor(L, v, DT_F32);
        if (n == IR_NONE) lower_builder_error(L, at);
        return n;
    }
    lower_error(L, at, "%s: expected a tensor, found %s", what, kind_desc(v));
    return IR_NONE;
}

/* ---- scopes ---- */

Scope *lower_scope_new(Lower *L, Scope *parent, bool boundary)
{
    Scope *s = xcalloc(1, sizeof *s);
    s->parent = parent;
    s->boundary = boundary;
    GROW(L->scopes, L->scopes_cap, L->nscopes + 1);
    L->scopes[L->nscopes++] = s;
    return s;
}

static void scope_free(Scope *s)
{
    strmap_free(&s->index);
    for (int32_t i = 0; i < s->n; i++) free(s->names[i]);
    free(s->names);
    free(s->vals);
    free(s);
}

static Value *scope_find_here(Scope *s, const char *name)
{
    int32_t i = strmap_get(&s->index, name, -1);
    return i >= 0 ? &s->vals[i] : NULL;
}

void lower_scope_set(Scope *s, const char *name, Value v)
{
    Value *old = scope_find_here(s, name);
    if (old) { *old = v; return; }
    GROW(s->names, s->names_cap, s->n + 1);
    GROW(s->vals, s->vals_cap, s->n + 1);
    s->names[s->n] = xstrdup(name);
    strmap_put(&s->index, s->names[s->n], s->n);
    s->vals[s->n++] = v;
}

/* ---- instances ---- */

int32_t lower_inst_new(Lower *L, int32_t parent, const char *name, const char *type, Loc loc)
{
    GROW(L->insts, L->insts_cap, L->ninsts + 1);
    Inst *in = &L->insts[L->ninsts];
    memset(in, 0, sizeof *in);
    if (parent < 0 || !L->insts[parent].path[0]) in->path = xstrdup(name);
    else {
        StrBuf p;
        sb_init(&p);
        sb_printf(&p, "%s.%s", L->insts[parent].path, name);
        in->path = sb_take(&p);
    }
    in->type = xstrdup(type);
    in->def = AST_NONE;
    in->forward = AST_NONE;
    in->parent = parent;
    in->loc = loc;
    return L->ninsts++;
}

Value *inst_member(Lower *L, int32_t inst, const char *name)
{
    if (inst < 0) return NULL;
    Inst *in = &L->insts[inst];
    int32_t i = strmap_get(&in->member_index, name, -1);
    return i >= 0 ? &in->members[i].v : NULL;
}

void lower_add_member(Lower *L, int32_t inst, const char *name, Value v)
{
    Inst *in = &L->insts[inst];
    GROW(in->members, in->members_cap, in->nmembers + 1);
    in->members[in->nmembers].name = xstrdup(name);
    strmap_put(&in->member_index, in->members[in->nmembers].name, in->nmembers);
    in->members[in->nmembers++].v = v;
}

int32_t lower_seq_push(Lower *L, Value v)
{
    GROW(L->seq, L->seq_cap, L->nseq + 1);
    L->seq[L->nseq] = v;
    return L->nseq++;
}

/* ---- name lookup and suggestions ---- */

static Value *lookup(Lower *L, Scope *s, int32_t inst, const char *name)
{
    bool members_checked = false;
    for (; s; s = s->parent) {
        if (s->boundary && !members_checked) {
            Value *m = inst_member(L, inst, name);
            if (m) return m;
            members_checked = true;
        }
        Value *v = scope_find_here(s, name);
        if (v) return v;
    }
    return members_checked ? NULL : inst_member(L, inst, name);
}

Value *lower_lookup(Lower *L, Scope *s, int32_t inst, const char *name) { return lookup(L, s, inst, name); }

void lower_consider(const char *cand, const char *name, const char **best, int *bestd)
{
    int dist = util_edit_distance(cand, name);
    if (dist < *bestd) { *bestd = dist; *best = cand; }
}

/* The visible name (or function or module name) closest to `name`, or NULL. */
static const char *suggest(Lower *L, Scope *s, int32_t inst, const char *name, bool calls)
{
    const char *best = NULL;
    int bestd = 1000;
    for (Scope *t = s; t; t = t->parent)
        for (int32_t i = 0; i < t->n; i++) lower_consider(t->names[i], name, &best, &bestd);
    if (inst >= 0)
        for (int32_t i = 0; i < L->insts[inst].nmembers; i++) lower_consider(L->insts[inst].members[i].name, name, &best, &bestd);
    if (calls) {
        int n;
        const char *const *fns = functions_names(&n);
        for (int i = 0; i < n; i++) lower_consider(fns[i], name, &best, &bestd);
        const BuiltinModule *mods = builtin_all(&n);
        for (int i = 0; i < n; i++) lower_consider(mods[i].name, name, &best, &bestd);
    }
    size_t len = strlen(name);
    int limit = len <= 3 ? 1 : len <= 6 ? 2 : 3;
    return bestd <= limit ? best : NULL;
}

static void unknown_name(Lower *L, Scope *s, int32_t inst, const char *name, AstId at, bool call)
{
    if (lower_unset_error(L, s, inst, name, at)) return;
    size_t len = strlen(name);
    if (len > 40) {
        lower_error(L, at, "unknown %s '%.40s...' (%zu characters)", call ? "function or module" : "name", name, len);
        return;
    }
    const char *sug = suggest(L, s, inst, name, call);
    if (sug) lower_error(L, at, "unknown %s '%s' (did you mean '%s'?)", call ? "function or module" : "name", name, sug);
    else lower_error(L, at, "unknown %s '%s'", call ? "function or module" : "name", name);
}

/* ---- expressions ---- */

static Value binary_numbers(Lower *L, AstId e, int op, Value a, Value b)
{
    bool ints = a.is_int && b.is_int;
    double x = a.num, y = b.num, r = 0;
    switch (op) {
    case TOK_PLUS: r = x + y; break;
    case TOK_MINUS: r = x - y; break;
    case TOK_STAR: r = x * y; break;
    case TOK_SLASH:
        if (y == 0) {
            lower_error(L, e, "division by zero in a constant expression");
            return value_error();
        }
        r = x / y;
        ints = false;
        break;
    case TOK_POW: r = pow(x, y); ints = ints && y >= 0; break;
    case TOK_FLOORDIV:
    case TOK_PERCENT: /* Python's: floor division, and a remainder with the sign of y */
        if (y == 0) {
            lower_error(L, e, "%s by zero in a constant expression", op == TOK_FLOORDIV ? "floor division" : "modulo");
            return value_error();
        }
        if (ints && fabs(x) < 9e15 && fabs(y) < 9e15) {
            int64_t xi = (int64_t)x, yi = (int64_t)y, q = xi / yi;
            if (xi % yi != 0 && (xi < 0) != (yi < 0)) q--;
            r = op == TOK_FLOORDIV ? (double)q : (double)(xi - q * yi);
        } else {
            double q = floor(x / y);
            r = op == TOK_FLOORDIV ? q : x - y * q;
        }
        break;
    case TOK_EQ: return (Value){.kind = V_BOOL, .num = x == y, .node = IR_NONE};
    case TOK_NE: return (Value){.kind = V_BOOL, .num = x != y, .node = IR_NONE};
    case TOK_LT: return (Value){.kind = V_BOOL, .num = x < y, .node = IR_NONE};
    case TOK_LE: return (Value){.kind = V_BOOL, .num = x <= y, .node = IR_NONE};
    case TOK_GT: return (Value){.kind = V_BOOL, .num = x > y, .node = IR_NONE};
    case TOK_GE: return (Value){.kind = V_BOOL, .num = x >= y, .node = IR_NONE};
    case TOK_KW_AND: return (Value){.kind = V_BOOL, .num = x != 0 && y != 0, .node = IR_NONE};
    case TOK_KW_OR: return (Value){.kind = V_BOOL, .num = x != 0 || y != 0, .node = IR_NONE};
    default:
        lower_error(L, e, "operator %s is not defined on numbers", lex_token_desc((TokKind)op));
        return value_error();
    }
    if (ints && fabs(r) > 9.2e18) {
        lower_error(L, e, "integer overflow in a constant expression");
        return value_error();
    }
    return value_num(r, ints);
}

static Value binary_dims(Lower *L, AstId e, int op, Value a, Value b)
{
    Dim da = a.kind == V_DIM ? a.dim : ir_dim_const((int64_t)a.num);
    Dim db = b.kind == V_DIM ? b.dim : ir_dim_const((int64_t)b.num);
    bool ints_a = a.kind == V_DIM || a.is_int, ints_b = b.kind == V_DIM || b.is_int;
    Value r = {.kind = V_DIM, .node = IR_NONE};
    if (op == TOK_STAR && ints_a && ints_b) {
        if (ir_dim_mul(da, db, &r.dim)) return r;
    } else if (op == TOK_SLASH && ints_a && ints_b) {
        if (ir_dim_div(da, db, &r.dim)) return r;
    } else if ((op == TOK_EQ || op == TOK_NE) && ints_a && ints_b) {
        /* the same size is equal to itself; any other comparison with a symbolic size is
         * decided only when the model runs */
        bool eq = ir_dim_eq(da, db);
        if (eq || (ir_dim_is_const(da) && ir_dim_is_const(db))) return (Value){.kind = V_BOOL, .num = op == TOK_EQ ? eq : !eq, .node = IR_NONE};
        StrBuf t;
        sb_init(&t);
        ir_dim_format(&t, L->g, ir_dim_is_const(da) ? db : da);
        sb_puts(&t, " with ");
        ir_dim_format(&t, L->g, ir_dim_is_const(da) ? da : db);
        lower_error(L, e, "cannot compare the symbolic size %s when the model is compiled: its value is known only when it runs", t.data);
        sb_free(&t);
        return value_error();
    }
    StrBuf t;
    sb_init(&t);
    ir_dim_format(&t, L->g, da);
    sb_printf(&t, " %s ", lex_token_desc((TokKind)op));
    ir_dim_format(&t, L->g, db);
    lower_error(L, e, "symbolic sizes support only * and exact /; cannot compute %s", t.data);
    sb_free(&t);
    return value_error();
}

static Op token_op(int tok)
{
    switch (tok) {
    case TOK_PLUS: return OP_ADD;
    case TOK_MINUS: return OP_SUB;
    case TOK_STAR: return OP_MUL;
    case TOK_SLASH: return OP_DIV;
    case TOK_POW: return OP_POW;
    case TOK_EQ: return OP_EQ;
    case TOK_NE: return OP_NE;
    case TOK_LT: return OP_LT;
    case TOK_LE: return OP_LE;
    case TOK_GT: return OP_GT;
    case TOK_GE: return OP_GE;
    case TOK_KW_AND: return OP_AND;
    case TOK_KW_OR: return OP_OR;
    default: return OP_COUNT;
    }
}

static Value lower_binary(Lower *L, Scope *s, int32_t inst, AstId e)
{
    const AstNode *n = ast_node(L->ast, e);
    AstId ea = ast_kid(L->ast, e, 0), eb = ast_kid(L->ast, e, 1);
    Value a = lower_expr(L, s, inst, ea), b = lower_expr(L, s, inst, eb);
    if (a.kind == V_ERROR || b.kind == V_ERROR) return value_error();
    int op = n->op;
    if (value_is_scalar_number(a) && value_is_scalar_number(b)) return binary_numbers(L, e, op, a, b);
    /* x == none, mode != "nearest": decided when the model is compiled (conditions of `if`) */
    if ((op == TOK_EQ || op == TOK_NE) && (a.kind == V_NONE || b.kind == V_NONE || (a.kind == V_STR && b.kind == V_STR))) {
        bool eq = a.kind == b.kind && (a.kind == V_NONE || !strcmp(a.str, b.str));
        return (Value){.kind = V_BOOL, .num = op == TOK_EQ ? eq : !eq, .node = IR_NONE};
    }
    bool da = a.kind == V_DIM || (a.kind == V_NUM && a.is_int), db = b.kind == V_DIM || (b.kind == V_NUM && b.is_int);
    if ((a.kind == V_DIM || b.kind == V_DIM) && da && db) return binary_dims(L, e, op, a, b);
    bool ta = a.kind == V_TENSOR || a.kind == V_NUM || a.kind == V_BOOL || a.kind == V_DIM;
    bool tb = b.kind == V_TENSOR || b.kind == V_NUM || b.kind == V_BOOL || b.kind == V_DIM;
    if (!ta || !tb) {
        lower_error(L, e, "operator %s cannot be applied to %s and %s", lex_token_desc((TokKind)op), kind_desc(a), kind_desc(b));
        return value_error();
    }
    L->b.loc = n->loc;
    if (op == TOK_AT) {
        if (a.kind != V_TENSOR || b.kind != V_TENSOR) {
            lower_error(L, e, "'@' needs two tensors, found %s and %s", kind_desc(a), kind_desc(b));
            return value_error();
        }
        NodeId r = ir_b_matmul(&L->b, a.node, b.node);
        return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
    }
    if (op == TOK_FLOORDIV || op == TOK_PERCENT) {
        /* a number takes the tensor's dtype, as for the other operators (comp_scalar_op) */
        DType like = a.kind == V_TENSOR ? (DType)L->g->nodes[a.node].dtype : b.kind == V_TENSOR ? (DType)L->g->nodes[b.node].dtype : DT_I64;
        bool fa = a.kind == V_NUM && !a.is_int, fb = b.kind == V_NUM && !b.is_int;
        if ((fa || fb) && !ir_dtype_is_float(like)) like = DT_F32;
        NodeId x = a.kind == V_TENSOR ? a.node : lower_as_tensor(L, a, like);
        NodeId y = b.kind == V_TENSOR ? b.node : lower_as_tensor(L, b, like);
        if (x != IR_NONE && a.kind == V_NUM && a.is_int && !ir_dtype_is_float(like)) x = ir_b_cast(&L->b, x, like);
        if (y != IR_NONE && b.kind == V_NUM && b.is_int && !ir_dtype_is_float(like)) y = ir_b_cast(&L->b, y, like);
        NodeId r = x == IR_NONE || y == IR_NONE ? IR_NONE : comp_floor_divide(&L->b, x, y, op == TOK_PERCENT);
        return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
    }
    Op iop = token_op(op);
    if (iop == OP_COUNT) {
        lower_error(L, e, "operator %s is not defined on tensors", lex_token_desc((TokKind)op));
        return value_error();
    }
    NodeId r;
    if (a.kind == V_TENSOR && b.kind != V_TENSOR && b.kind != V_DIM) r = comp_scalar_op(&L->b, iop, a.node, b.num, false);
    else if (b.kind == V_TENSOR && a.kind != V_TENSOR && a.kind != V_DIM) r = comp_scalar_op(&L->b, iop, b.node, a.num, true);
    else {
        NodeId x = lower_as_tensor(L, a, b.kind == V_TENSOR ? (DType)L->g->nodes[b.node].dtype : DT_I64);
        NodeId y = lower_as_tensor(L, b, a.kind == V_TENSOR ? (DType)L->g->nodes[a.node].dtype : DT_I64);
        if (x == IR_NONE || y == IR_NONE) return lower_builder_error(L, e);
        if ((iop == OP_AND || iop == OP_OR) &&
            (L->g->nodes[x].dtype != DT_BOOL || L->g->nodes[y].dtype != DT_BOOL)) {
            lower_error(L, e, "'%s' needs bool tensors (comparisons), found %s and %s", op == TOK_KW_AND ? "and" : "or",
                        ir_dtype_name((DType)L->g->nodes[x].dtype), ir_dtype_name((DType)L->g->nodes[y].dtype));
            return value_error();
        }
        r = ir_b_binary(&L->b, iop, x, y);
    }
    return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
}

/* x[subscripts] as PyTorch indexes: integers (the axis dropped), slices, `none` or `None` (a
 * new axis of size 1, any number of them; Python's capital is taken here only, where PyTorch
 * code has it verbatim) and one `...` standing for the axes no other subscript
 * takes. Lowered as a slice per indexed axis, then one reshape to the result's shape. */
static Value index_tensor(Lower *L, Scope *s, int32_t inst, AstId e, NodeId x)
{
    const AstNode *n = ast_node(L->ast, e);
    int nsub = n->nkids - 1, rank = L->g->nodes[x].shape.rank, consumed = 0, ellipsis = -1;
    enum { SUB_INT, SUB_SLICE, SUB_NEW, SUB_ELLIPSIS };
    uint8_t kind[AST_MAX_DEPTH];
    int64_t ival[AST_MAX_DEPTH];
    if (nsub > AST_MAX_DEPTH) {
        lower_error(L, e, "too many indices (%d)", nsub);
        return value_error();
    }
    for (int k = 0; k < nsub; k++) {
        AstId sub = ast_kid(L->ast, e, k + 1);
        AstKind sk = (AstKind)ast_node(L->ast, sub)->kind;
        if (sk == AST_ELLIPSIS) {
            if (ellipsis >= 0) {
                lower_error(L, sub, "an index has at most one '...' (it stands for every axis the others do not index)");
                return value_error();
            }
            ellipsis = k;
            kind[k] = SUB_ELLIPSIS;
        } else if (sk == AST_SLICE) {
            kind[k] = SUB_SLICE;
            consumed++;
        } else if (sk == AST_NAME && !strcmp(ast_str(L->ast, sub), "None") && !lookup(L, s, inst, "None")) {
            kind[k] = SUB_NEW; /* x[:, None] is PyTorch's documented spelling, copied as written */
        } else {
            Value v = lower_expr(L, s, inst, sub);
            if (v.kind == V_ERROR) return v;
            if (v.kind == V_NONE) kind[k] = SUB_NEW;
            else {
                if (!value_int(L, v, sub, "index", &ival[k])) return value_error();
                kind[k] = SUB_INT;
                consumed++;
            }
        }
    }
    if (consumed > rank) {
        lower_error(L, e, "too many indices (%d) for a tensor of rank %d", consumed, rank);
        return value_error();
    }
    int ell_axes = rank - consumed; /* axes `...` stands for (at the end when there is none) */
    Dim out[AST_MAX_DEPTH + IR_MAX_RANK];
    int nout = 0, axis = 0;
    L->b.loc = n->loc;
    for (int k = 0; k <= nsub; k++) {
        if (k == nsub || kind[k] == SUB_ELLIPSIS) { /* the untouched axes */
            if (k == nsub && ellipsis >= 0) break;
            for (int j = 0; j < ell_axes; j++) out[nout++] = L->g->nodes[x].shape.d[axis++];
            continue;
        }
        AstId sub = ast_kid(L->ast, e, k + 1);
        if (kind[k] == SUB_NEW) {
            out[nout++] = ir_dim_const(1);
            continue;
        }
        if (kind[k] == SUB_SLICE) {
            int64_t v[3] = {0, IR_SLICE_END, 1};
            for (int j = 0; j < 3; j++) {
                AstId part = ast_kid(L->ast, sub, j);
                if (part == AST_NONE) continue;
                if (!value_int(L, lower_expr(L, s, inst, part), part, "slice bound", &v[j])) return value_error();
            }
            L->b.loc = n->loc;
            x = ir_b_slice(&L->b, x, axis, v[0], v[1], v[2]);
            if (x == IR_NONE) return lower_builder_error(L, e);
            out[nout++] = L->g->nodes[x].shape.d[axis++];
            continue;
        }
        int64_t i = ival[k];
        Dim d = L->g->nodes[x].shape.d[axis];
        if (ir_dim_is_const(d) && (i >= d.k || i < -d.k)) {
            lower_error(L, sub, "index %lld is out of range for axis %d of size %lld", (long long)i, axis, (long long)d.k);
            return value_error();
        }
        if (i < 0 && ir_dim_is_const(d)) i += d.k;
        x = ir_b_slice(&L->b, x, axis, i, i + 1, 1);
        if (x == IR_NONE) return lower_builder_error(L, e);
        axis++;
    }
    if (nout > IR_MAX_RANK) {
        lower_error(L, e, "this index gives a tensor of rank %d; at most %d axes", nout, IR_MAX_RANK);
        return value_error();
    }
    Shape sh = L->g->nodes[x].shape;
    bool same = sh.rank == nout;
    for (int i = 0; same && i < nout; i++) same = ir_dim_eq(sh.d[i], out[i]);
    if (same) return value_tensor(x);
    Shape os = ir_shape_make(nout, out);
    x = ir_b_reshape(&L->b, x, &os);
    return x == IR_NONE ? lower_builder_error(L, e) : value_tensor(x);
}

static Value lower_index(Lower *L, Scope *s, int32_t inst, AstId e)
{
    const AstNode *n = ast_node(L->ast, e);
    Value base = lower_expr(L, s, inst, ast_kid(L->ast, e, 0));
    if (base.kind == V_ERROR) return base;
    if (base.kind == V_LIST || base.kind == V_TUPLE) {
        int64_t i;
        if (n->nkids != 2 || ast_node(L->ast, ast_kid(L->ast, e, 1))->kind == AST_SLICE ||
            ast_node(L->ast, ast_kid(L->ast, e, 1))->kind == AST_ELLIPSIS) {
            lower_error(L, e, "a list takes one integer index");
            return value_error();
        }
        Value iv = lower_expr(L, s, inst, ast_kid(L->ast, e, 1));
        if (!value_int(L, iv, ast_kid(L->ast, e, 1), "index", &i)) return value_error();
        if (i < 0) i += base.count;
        if (i < 0 || i >= base.count) {
            lower_error(L, e, "index %lld is out of range for a list of %d", (long long)i, base.count);
            return value_error();
        }
        return L->seq[base.idx + i];
    }
    if (base.kind != V_TENSOR) {
        lower_error(L, e, "cannot index %s", kind_desc(base));
        return value_error();
    }
    return index_tensor(L, s, inst, e, base.node);
}

static Value lower_stmts(Lower *L, Scope *s, int32_t inst, AstId parent, int first, bool *returned);

/* Applies module instance `m` to the arguments of CALL e. */
static Value apply_module(Lower *L, Scope *s, int32_t inst, int32_t m, AstId e)
{
    const AstNode *n = ast_node(L->ast, e);
    Inst *mi = &L->insts[m];
    Value args[8];
    int nargs = 0;
    for (int k = 1; k < n->nkids; k++) {
        AstId a = ast_kid(L->ast, e, k);
        if (ast_node(L->ast, a)->kind == AST_KWARG) {
            lower_error(L, a, "module '%s' takes its inputs by position, not by name", mi->path);
            return value_error();
        }
        if (nargs >= 8) {
            lower_error(L, a, "module '%s' called with too many inputs", mi->path);
            return value_error();
        }
        args[nargs] = lower_expr(L, s, inst, a);
        if (args[nargs].kind == V_ERROR) return value_error();
        nargs++;
    }
    L->b.loc = n->loc;
    return lower_apply_module_value(L, m, args, nargs, e);
}

static Value apply_module_body(Lower *L, int32_t m, const Value *args, int nargs, AstId e);

Value lower_apply_module_value(Lower *L, int32_t m, const Value *args, int nargs, AstId e)
{
    Inst *mi = &L->insts[m];
    /* the nodes the call builds belong to the module (Node.scope), at the call's line */
    const uint32_t saved_scope = L->b.scope;
    const Loc saved_scope_loc = L->b.scope_loc;
    const uint32_t saved_scope_type = L->b.scope_type;
    L->b.scope = ir_intern(L->b.g, mi->path);
    L->b.scope_type = ir_intern(L->b.g, mi->type);
    L->b.scope_loc = ast_node(L->ast, e)->loc;
    L->b.scope_loc.file = 0; /* the graph's own file table: index 0 is this file */
    Value r = apply_module_body(L, m, args, nargs, e);
    L->b.scope = saved_scope;
    L->b.scope_loc = saved_scope_loc;
    L->b.scope_type = saved_scope_type;
    return r;
}

static Value apply_module_body(Lower *L, int32_t m, const Value *args, int nargs, AstId e)
{
    Inst *mi = &L->insts[m];
    if (mi->builtin) return mi->builtin->apply(L, m, args, nargs, e);
    AstId fwd = mi->forward;
    if (fwd == AST_NONE) {
        lower_error(L, e, "module '%s' (%s) has no forward", mi->path, mi->type);
        return value_error();
    }
    const AstNode *fn = ast_node(L->ast, fwd);
    if (nargs != fn->aux) {
        lower_error(L, e, "module %s's forward takes %d input%s, found %d", mi->type, fn->aux, fn->aux == 1 ? "" : "s", nargs);
        return value_error();
    }
    if (L->depth >= MAX_MODULE_DEPTH) {
        lower_error(L, e, "modules nested deeper than %d", MAX_MODULE_DEPTH);
        return value_error();
    }
    /* a call of one of the model's own modules from forward: a region that a memory budget
     * may checkpoint (passes/remat.c), unless the model checkpoints it itself */
    const int32_t saved_ckpt = L->b.ckpt;
    if (L->depth == 0 && L->b.ckpt == 0 && L->next_auto < IR_CKPT_AUTO - 1) L->b.ckpt = IR_CKPT_AUTO + ++L->next_auto;
    L->depth++;
    int saved_loops = L->loop_depth; /* a module's own body is not inside the caller's loop */
    L->loop_depth = 0;
    Scope *local = lower_scope_new(L, mi->scope, false);
    for (int i = 0; i < nargs; i++) lower_scope_set(local, ast_str(L->ast, ast_kid(L->ast, fwd, i)), args[i]);
    bool returned = false;
    Value r = lower_stmts(L, local, m, fwd, fn->aux + fn->aux2, &returned);
    L->loop_depth = saved_loops;
    L->depth--;
    L->b.ckpt = saved_ckpt;
    if (!returned && r.kind != V_ERROR) {
        lower_error(L, fwd, "forward of module %s does not return a value", mi->type);
        return value_error();
    }
    return r;
}

/* The attribute `attr` of a value (AST_ATTR e): a module's member, a list's element by
 * number, and of a tensor: .T (the last two axes swapped), .shape (a list of its sizes,
 * numbers or symbolic, so x.shape[0] is B), .ndim. */
static Value attr_of(Lower *L, AstId e, Value base)
{
    const AstNode *n = ast_node(L->ast, e);
    const char *attr = ast_str(L->ast, e);
    if (base.kind == V_ERROR) return base;
    if (base.kind == V_MODULE) {
        Value *m = inst_member(L, base.idx, attr);
        if (m) return *m;
        Inst *bi = &L->insts[base.idx];
        const char *best = NULL;
        int bestd = 1000;
        for (int32_t i = 0; i < bi->nmembers; i++) lower_consider(bi->members[i].name, attr, &best, &bestd);
        if (best && bestd <= 2) lower_error(L, e, "module '%s' (%s) has no member '%s' (did you mean '%s'?)", bi->path, bi->type, attr, best);
        else lower_error(L, e, "module '%s' (%s) has no member '%s'", bi->path, bi->type, attr);
        return value_error();
    }
    if (base.kind == V_LIST) {
        char *end;
        long i = strtol(attr, &end, 10);
        if (*end || i < 0 || i >= base.count) {
            lower_error(L, e, "'%s' is not an index of a list of %d modules", attr, base.count);
            return value_error();
        }
        return L->seq[base.idx + i];
    }
    if (base.kind == V_TENSOR && !strcmp(attr, "shape")) return functions_shape_tuple(L, base.node);
    if (base.kind == V_TENSOR && !strcmp(attr, "ndim")) return value_num(L->g->nodes[base.node].shape.rank, true);
    if (base.kind == V_TENSOR && !strcmp(attr, "T")) {
        L->b.loc = n->loc;
        NodeId r = ir_b_transpose(&L->b, base.node, -2, -1);
        return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
    }
    lower_error(L, e, "%s has no attribute '%s'", kind_desc(base), attr);
    return value_error();
}

static Value lower_call(Lower *L, Scope *s, int32_t inst, AstId e)
{
    AstId callee = ast_kid(L->ast, e, 0);
    const AstNode *cn = ast_node(L->ast, callee);
    if (cn->kind == AST_NAME) {
        const char *name = ast_str(L->ast, callee);
        Value *v = lookup(L, s, inst, name);
        if (v && v->kind == V_MODULE) return apply_module(L, s, inst, v->idx, e);
        if (v && v->kind != V_ERROR) {
            lower_error(L, callee, "'%s' is %s, not a function or module", name, kind_desc(*v));
            return value_error();
        }
        if (v) return value_error();
        Value out;
        if (!strcmp(name, "Parameter") || !strcmp(name, "Buffer")) {
            lower_error(L, callee, "%s(...) creates a parameter and can only be a member (`w = %s(10)`), not part of an expression",
                        name, name);
            return value_error();
        }
        if (functions_call(L, s, inst, name, e, &out)) return out;
        if (builtin_find(name)) {
            lower_error(L, callee, "module %s must be created as a member (`name = %s(...)`) and then called by its name", name, name);
            return value_error();
        }
        unknown_name(L, s, inst, name, callee, true);
        return value_error();
    }
    Value f;
    if (cn->kind == AST_ATTR) {
        /* x.mean(1), x.view(B, -1), x.transpose(0, 1): a function called with the tensor
         * as its first argument; m.fc(x): a member module */
        Value base = lower_expr(L, s, inst, ast_kid(L->ast, callee, 0));
        if (base.kind == V_ERROR) return base;
        if (base.kind == V_TENSOR) return functions_method(L, s, inst, e, ast_str(L->ast, callee), base);
        f = attr_of(L, callee, base);
    } else f = lower_expr(L, s, inst, callee);
    if (f.kind == V_MODULE) return apply_module(L, s, inst, f.idx, e);
    if (f.kind != V_ERROR) lower_error(L, callee, "%s cannot be called", kind_desc(f));
    return value_error();
}

Value lower_expr(Lower *L, Scope *s, int32_t inst, AstId e)
{
    if (e < 0) return value_error();
    const AstNode *n = ast_node(L->ast, e);
    switch ((AstKind)n->kind) {
    case AST_NUMBER: return value_num(n->aux ? (double)n->ival : n->num, n->aux != 0);
    case AST_STRING: return (Value){.kind = V_STR, .str = ast_str(L->ast, e), .node = IR_NONE};
    case AST_NAME: {
        const char *name = ast_str(L->ast, e);
        Value *v = lookup(L, s, inst, name);
        if (v) return *v;
        if (!strcmp(name, "true") || !strcmp(name, "false"))
            return (Value){.kind = V_BOOL, .num = name[0] == 't', .node = IR_NONE};
        if (!strcmp(name, "inf")) return value_num(INFINITY, false);
        if (!strcmp(name, "pi")) return value_num(KILN_PI, false);
        if (!strcmp(name, "none")) return value_none();
        if (!strcmp(name, "True") || !strcmp(name, "False") || !strcmp(name, "None")) {
            lower_error(L, e, "unknown name '%s' (did you mean '%s'? Kiln writes true, false and none in lower case)", name,
                        name[0] == 'T' ? "true" : name[0] == 'F' ? "false" : "none");
            return value_error();
        }
        unknown_name(L, s, inst, name, e, false);
        return value_error();
    }
    case AST_UNARY: {
        Value x = lower_expr(L, s, inst, ast_kid(L->ast, e, 0));
        if (x.kind == V_ERROR) return x;
        if (n->op == TOK_PLUS) return x;
        if (n->op == TOK_KW_NOT) {
            if (x.kind == V_BOOL || x.kind == V_NUM) return (Value){.kind = V_BOOL, .num = x.num == 0, .node = IR_NONE};
            if (x.kind == V_NONE) return (Value){.kind = V_BOOL, .num = 1, .node = IR_NONE};
            if (x.kind == V_TENSOR) {
                L->b.loc = n->loc;
                NodeId r = ir_b_unary(&L->b, OP_NOT, x.node);
                return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
            }
        } else {
            if (x.kind == V_NUM) return value_num(-x.num, x.is_int);
            if (x.kind == V_TENSOR) {
                L->b.loc = n->loc;
                NodeId r = ir_b_unary(&L->b, OP_NEG, x.node);
                return r == IR_NONE ? lower_builder_error(L, e) : value_tensor(r);
            }
        }
        lower_error(L, e, "operator %s cannot be applied to %s", lex_token_desc((TokKind)n->op), kind_desc(x));
        return value_error();
    }
    case AST_BINARY: return lower_binary(L, s, inst, e);
    case AST_CALL: return lower_call(L, s, inst, e);
    case AST_INDEX: return lower_index(L, s, inst, e);
    case AST_ATTR: return attr_of(L, e, lower_expr(L, s, inst, ast_kid(L->ast, e, 0)));
    case AST_LIST: {
        Value t = {.kind = V_TUPLE, .node = IR_NONE, .count = n->nkids};
        Value tmp[64];
        if (n->nkids > 64) {
            lower_error(L, e, "lists are limited to 64 elements here");
            return value_error();
        }
        for (int k = 0; k < n->nkids; k++) {
            tmp[k] = lower_expr(L, s, inst, ast_kid(L->ast, e, k));
            if (tmp[k].kind == V_ERROR) return value_error();
        }
        t.idx = L->nseq;
        for (int k = 0; k < n->nkids; k++) lower_seq_push(L, tmp[k]);
        return t;
    }
    case AST_COMPREHENSION:
        lower_error(L, e, "a repeated module `[M(...) for N]` can only be a member, not part of an expression");
        return value_error();
    default:
        lower_error(L, e, "expected an expression, found %s", ast_kind_name((AstKind)n->kind));
        return value_error();
    }
}

/* ---- statements ---- */

static void name_new_nodes(Lower *L, NodeId from, Value v, const char *name)
{
    if (v.kind != V_TENSOR || v.node < from) return;
    Node *nd = &L->g->nodes[v.node];
    if (!nd->name && nd->op != OP_INPUT && nd->op != OP_PARAM) ir_set_name(L->g, v.node, name);
}

static Value lower_stmts(Lower *L, Scope *s, int32_t inst, AstId parent, int first, bool *returned)
{
    const AstNode *pn = ast_node(L->ast, parent);
    for (int k = first; k < pn->nkids; k++) {
        AstId st = ast_kid(L->ast, parent, k);
        const AstNode *sn = ast_node(L->ast, st);
        NodeId mark = L->g->nnodes;
        switch ((AstKind)sn->kind) {
        case AST_ASSIGN: {
            int nt = sn->aux;
            Value v = lower_expr(L, s, inst, ast_kid(L->ast, st, nt));
            if (nt == 1) {
                const char *name = ast_str(L->ast, ast_kid(L->ast, st, 0));
                if (v.kind == V_TUPLE) {
                    lower_error(L, st, "this produces %d values; assign them to %d names (`a, b = ...`)", v.count, v.count);
                    v = value_error();
                }
                name_new_nodes(L, mark, v, name);
                lower_scope_set(s, name, v);
                break;
            }
            if (v.kind != V_TUPLE || v.count != nt) {
                if (v.kind == V_TUPLE) lower_error(L, st, "the value has %d elements but %d names are assigned", v.count, nt);
                else if (v.kind != V_ERROR) lower_error(L, st, "%d names are assigned but the value is %s", nt, kind_desc(v));
                for (int i = 0; i < nt; i++) lower_scope_set(s, ast_str(L->ast, ast_kid(L->ast, st, i)), value_error());
                break;
            }
            for (int i = 0; i < nt; i++) {
                const char *name = ast_str(L->ast, ast_kid(L->ast, st, i));
                name_new_nodes(L, mark, L->seq[v.idx + i], name);
                lower_scope_set(s, name, L->seq[v.idx + i]);
            }
            break;
        }
        case AST_RETURN: {
            *returned = true;
            if (L->loop_depth > 0) {
                lower_error(L, st, "`return` inside a `for` loop is not supported; assign in the loop and return after it");
                return value_error();
            }
            if (k + 1 < pn->nkids) lower_error(L, ast_kid(L->ast, parent, k + 1), "statement after return is never run");
            if (sn->nkids == 1) return lower_expr(L, s, inst, ast_kid(L->ast, st, 0));
            Value t = {.kind = V_TUPLE, .node = IR_NONE, .count = sn->nkids};
            Value tmp[16];
            if (sn->nkids > 16) {
                lower_error(L, st, "at most 16 values can be returned");
                return value_error();
            }
            for (int i = 0; i < sn->nkids; i++) tmp[i] = lower_expr(L, s, inst, ast_kid(L->ast, st, i));
            t.idx = L->nseq;
            for (int i = 0; i < sn->nkids; i++) lower_seq_push(L, tmp[i]);
            return t;
        }
        case AST_FOR: {
            AstId it = ast_kid(L->ast, st, 0);
            Value iv = lower_expr(L, s, inst, it);
            const char *var = ast_str(L->ast, st);
            if (iv.kind == V_ERROR) break;
            int64_t count;
            if (iv.kind == V_LIST || iv.kind == V_TUPLE) count = iv.count;
            else if (iv.kind == V_NUM && iv.is_int && iv.num >= 0 && iv.num <= LOWER_MAX_REPEAT) count = (int64_t)iv.num;
            else {
                lower_error(L, it, "`for` iterates over a list of modules or a count, found %s", kind_desc(iv));
                break;
            }
            L->loop_depth++;
            for (int64_t i = 0; i < count && !L->failed; i++) {
                Value elem = iv.kind == V_NUM ? value_num((double)i, true) : L->seq[iv.idx + i];
                lower_scope_set(s, var, elem);
                bool ret = false;
                lower_stmts(L, s, inst, st, 1, &ret);
                if (ret) {
                    *returned = true; /* reported at the return; no second "does not return" */
                    break;
                }
            }
            L->loop_depth--;
            break;
        }
        case AST_IF: {
            /* decided now: only the branch taken is lowered (cond.c) */
            int b = lower_if_branch(L, s, inst, ast_kid(L->ast, st, 0));
            lower_if_not_taken(L, s, inst, st, b);
            AstId taken = b < 0 ? AST_NONE : b ? ast_kid(L->ast, st, 1) : sn->nkids > 2 ? ast_kid(L->ast, st, 2) : AST_NONE;
            if (taken == AST_NONE) break;
            bool ret = false;
            Value r = lower_stmts(L, s, inst, taken, 0, &ret);
            if (ret) { /* `if c { return a }` then `return b`: b is not lowered when c holds */
                *returned = true;
                return r;
            }
            break;
        }
        default:
            lower_error(L, st, "expected a statement, found %s", ast_kind_name((AstKind)sn->kind));
            break;
        }
    }
    return value_none();
}

/* ---- inputs ---- */

static bool lower_type(Lower *L, AstId ty, Shape *s, int first_input)
{
    const AstNode *tn = ast_node(L->ast, ty);
    *s = ir_shape_make(0, NULL);
    if (tn->nkids > IR_MAX_RANK) {
        lower_error(L, ty, "rank %d exceeds the maximum of %d", tn->nkids, IR_MAX_RANK);
        return false;
    }
    for (int k = 0; k < tn->nkids; k++) {
        AstId de = ast_kid(L->ast, ty, k);
        const AstNode *dn = ast_node(L->ast, de);
        if (dn->kind == AST_NAME && !lookup(L, L->globals, 0, ast_str(L->ast, de))) {
            const char *sym = ast_str(L->ast, de);
            /* An undeclared name as the leading dim of an input is the batch size. */
            if (k == 0 && first_input) {
                if (L->batch <= 0) {
                    lower_error(L, de, "size '%s' has no bound: set `batch` in the train section or declare `dim %s <= N`", sym, sym);
                    return false;
                }
                int id = ir_add_symbol(L->g, sym, L->batch);
                if (id < 0) {
                    lower_error(L, de, "too many symbolic sizes (at most %d)", IR_MAX_SYMS);
                    return false;
                }
                Value dv = {.kind = V_DIM, .dim = ir_dim_sym(id), .node = IR_NONE};
                lower_scope_set(L->globals, sym, dv);
                s->d[s->rank++] = dv.dim;
                continue;
            }
            lower_error(L, de, "unknown size '%s': declare it with `dim %s <= N` or `const %s = N`", sym, sym, sym);
            return false;
        }
        Value v = lower_expr(L, L->globals, 0, de);
        if (v.kind == V_DIM) {
            s->d[s->rank++] = v.dim;
            continue;
        }
        int64_t d;
        if (!value_int(L, v, de, "dimension", &d)) return false;
        if (d < 0 || d > IR_MAX_DIM) {
            lower_error(L, de, "dimension %lld is out of range (0 to 2^32)", (long long)d);
            return false;
        }
        s->d[s->rank++] = ir_dim_const(d);
    }
    return true;
}

static Value make_input(Lower *L, AstId param, bool first)
{
    const AstNode *pn = ast_node(L->ast, param);
    const char *name = ast_str(L->ast, param);
    if (ir_find_named(L->g, OP_INPUT, name) != IR_NONE) {
        lower_error(L, param, "input '%s' is declared twice", name);
        return value_error();
    }
    AstId ty = ast_kid(L->ast, param, 0);
    Shape s;
    if (!lower_type(L, ty, &s, first)) return value_error();
    L->b.loc = pn->loc;
    NodeId id = ir_b_input(&L->b, name, (DType)ast_node(L->ast, ty)->aux, &s);
    return id == IR_NONE ? lower_builder_error(L, param) : value_tensor(id);
}

/* ---- the whole model ---- */

static bool is_scalar_shape(const Shape *s)
{
    for (int i = 0; i < s->rank; i++)
        if (!ir_dim_is_const(s->d[i]) || s->d[i].k != 1) return false;
    return true;
}

static NodeId scalar_output(Lower *L, Value v, AstId at, const char *what)
{
    if (v.kind == V_ERROR) {
        if (!L->failed) lower_error(L, at, "internal error: %s has no value", what);
        return IR_NONE;
    }
    if (v.kind != V_TENSOR) {
        lower_error(L, at, "%s must be a tensor, found %s", what, kind_desc(v));
        return IR_NONE;
    }
    const Node *n = &L->g->nodes[v.node];
    if (!is_scalar_shape(&n->shape)) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &n->shape);
        lower_error(L, at, "%s must be a scalar, found shape %s (reduce it with mean(...) or sum(...))", what, t.data);
        sb_free(&t);
        return IR_NONE;
    }
    NodeId id = v.node;
    if (!ir_dtype_is_float((DType)n->dtype)) id = ir_b_cast(&L->b, id, DT_F32);
    if (L->g->nodes[id].shape.rank) {
        Shape s0 = ir_shape_make(0, NULL);
        id = ir_b_reshape(&L->b, id, &s0);
    }
    return id;
}

static void lower_model(Lower *L, AstId forward, AstId loss, AstId train)
{
    AstId root = L->ast->root;
    /* Inputs first, in declaration order: forward's, then the loss's typed ones. */
    Scope *fs = lower_scope_new(L, L->globals, false);
    const AstNode *fn = forward != AST_NONE ? ast_node(L->ast, forward) : NULL;
    if (fn)
        for (int i = 0; i < fn->aux; i++) {
            AstId p = ast_kid(L->ast, forward, i);
            if (ast_node(L->ast, p)->aux != 1) {
                lower_error(L, p, "input '%s' of forward needs a type, e.g. `%s: f32[B, 784]`", ast_str(L->ast, p), ast_str(L->ast, p));
                lower_scope_set(fs, ast_str(L->ast, p), value_error());
                continue;
            }
            lower_scope_set(fs, ast_str(L->ast, p), make_input(L, p, i == 0));
        }
    const AstNode *ln = loss != AST_NONE ? ast_node(L->ast, loss) : NULL;
    Scope *ls = lower_scope_new(L, L->globals, false);
    if (ln)
        for (int i = 0; i < ln->aux; i++) {
            AstId p = ast_kid(L->ast, loss, i);
            if (ast_node(L->ast, p)->aux == 1) lower_scope_set(ls, ast_str(L->ast, p), make_input(L, p, false));
        }
    (void)train;

    /* Parameters: the root's members, in order (state_dict order). */
    L->insts[0].scope = L->globals;
    GROW(L->inst_stack, L->inst_stack_cap, 1);
    lower_module_body(L, 0, root, 0);
    for (int32_t i = 0; i < L->nrules; i++)
        if (L->rules[i].matches == 0 && !L->failed)
            lower_error(L, L->rules[i].at, "init pattern '%s' matches no parameter", L->rules[i].pattern);

    if (!fn) {
        lower_error(L, root, "the model has no forward: add `forward(x: f32[B, N]) -> y { ... }`");
        return;
    }
    bool returned = false;
    Value ret = lower_stmts(L, fs, 0, forward, fn->aux + fn->aux2, &returned);
    /* Forward's outputs. One that failed (its error already reported) is an error value,
     * so that the loss and metrics are still checked for their own mistakes but what
     * uses it is not reported again. */
    Scope *outs = lower_scope_new(L, L->globals, false);
    bool outputs_unknown = false; /* forward failed before its outputs could be named */
    if (fn->aux2 == 0) {
        if (!returned) {
            lower_error(L, forward, "forward has no outputs: name them (`forward(...) -> logits`) or `return` a value");
            outputs_unknown = true;
        } else if (ret.kind == V_TENSOR) {
            ir_add_output(L->g, OUT_FORWARD, "output", ret.node);
            lower_scope_set(outs, "output", ret);
        } else {
            if (ret.kind != V_ERROR) lower_error(L, forward, "forward must return a tensor, found %s", kind_desc(ret));
            lower_scope_set(outs, "output", value_error());
        }
    } else {
        if (returned) lower_error(L, forward, "forward names its outputs with `->`; use assignments, not `return`");
        for (int i = 0; i < fn->aux2; i++) {
            AstId on = ast_kid(L->ast, forward, fn->aux + i);
            const char *name = ast_str(L->ast, on);
            Value *v = scope_find_here(fs, name);
            if (!v && lower_unset_error(L, fs, 0, name, on)) {
            } else if (!v) lower_error(L, on, "output '%s' is never assigned in forward", name);
            else if (v->kind == V_ERROR) {
                /* Errors are reported where they happen; this guards against a silent one. */
                if (!L->failed) lower_error(L, on, "internal error: output '%s' has no value", name);
            } else if (v->kind != V_TENSOR) lower_error(L, on, "output '%s' is %s, not a tensor", name, kind_desc(*v));
            else {
                ir_add_output(L->g, OUT_FORWARD, name, v->node);
                lower_scope_set(outs, name, *v);
                continue;
            }
            lower_scope_set(outs, name, value_error());
        }
    }

    /* Loss: untyped parameters are forward outputs, typed ones are extra inputs. */
    if (ln) {
        for (int i = 0; i < ln->aux; i++) {
            AstId p = ast_kid(L->ast, loss, i);
            if (ast_node(L->ast, p)->aux == 1) continue;
            const char *name = ast_str(L->ast, p);
            Value *v = scope_find_here(outs, name);
            if (!v && outputs_unknown) {
                lower_scope_set(ls, name, value_error());
                continue;
            }
            if (!v) {
                StrBuf names;
                sb_init(&names);
                for (int32_t j = 0; j < outs->n; j++) sb_printf(&names, "%s%s", j ? ", " : "", outs->names[j]);
                lower_error(L, p, "loss input '%s' is not an output of forward (outputs: %s); give it a type to make it a data input",
                            name, names.len ? names.data : "none");
                sb_free(&names);
                lower_scope_set(ls, name, value_error());
                continue;
            }
            lower_scope_set(ls, name, *v);
        }
        returned = false;
        Value lv = lower_stmts(L, ls, 0, loss, ln->aux, &returned);
        if (!returned && !L->failed) lower_error(L, loss, "loss does not return a value");
        NodeId l = scalar_output(L, lv, loss, "the loss");
        if (l != IR_NONE) ir_add_output(L->g, OUT_LOSS, "loss", l);
        /* A loss that failed is an error value for the metrics, not an unknown name. */
        lower_scope_set(ls, "loss", l != IR_NONE ? value_tensor(l) : value_error());
    }
    /* Metrics see forward outputs, loss inputs and the loss. */
    const AstNode *rn = ast_node(L->ast, root);
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, root, k);
        if (ast_node(L->ast, it)->kind != AST_METRIC) continue;
        Scope *ms = lower_scope_new(L, ls, false);
        for (int32_t j = 0; j < outs->n; j++)
            if (!scope_find_here(ls, outs->names[j])) lower_scope_set(ms, outs->names[j], outs->vals[j]);
        L->b.loc = ast_node(L->ast, it)->loc;
        Value mv = lower_expr(L, ms, 0, ast_kid(L->ast, it, 0));
        StrBuf what;
        sb_init(&what);
        sb_printf(&what, "metric '%s'", ast_str(L->ast, it));
        NodeId m = scalar_output(L, mv, ast_kid(L->ast, it, 0), what.data);
        sb_free(&what);
        if (m != IR_NONE) ir_add_output(L->g, OUT_METRIC, ast_str(L->ast, it), m);
    }
}

/* Top-level declarations: consts and dims (check.c validated names and duplicates). */
static void lower_globals(Lower *L)
{
    AstId root = L->ast->root;
    const AstNode *rn = ast_node(L->ast, root);
    for (int k = 0; k < rn->nkids; k++) {
        AstId it = ast_kid(L->ast, root, k);
        const AstNode *in = ast_node(L->ast, it);
        const char *name = ast_str(L->ast, it);
        if (in->kind == AST_CONST) {
            Value v = lower_expr(L, L->globals, -1, ast_kid(L->ast, it, 0));
            if (v.kind == V_TENSOR) {
                lower_error(L, it, "const '%s' must be a number known at compile time", name);
                v = value_error();
            }
            lower_scope_set(L->globals, name, v);
        } else if (in->kind == AST_DIM) {
            int64_t bound = -1;
            if (in->nkids == 1) {
                AstId be = ast_kid(L->ast, it, 0);
                if (!value_int(L, lower_expr(L, L->globals, -1, be), be, "dim bound", &bound)) continue;
                if (bound < 1 || bound > IR_MAX_DIM) {
                    lower_error(L, be, "dim '%s' bound must be between 1 and 2^32, found %lld", name, (long long)bound);
                    continue;
                }
            } else if (L->batch > 0) bound = L->batch;
            if (bound < 1) {
                lower_error(L, it, "dim '%s' needs a bound: `dim %s <= N`", name, name);
                continue;
            }
            int id = ir_add_symbol(L->g, name, bound);
            if (id < 0) {
                lower_error(L, it, "too many symbolic sizes (at most %d)", IR_MAX_SYMS);
                continue;
            }
            lower_scope_set(L->globals, name, (Value){.kind = V_DIM, .dim = ir_dim_sym(id), .node = IR_NONE});
        }
    }
}

bool check_declarations(Lower *L, AstId *forward, AstId *loss, AstId *train, const char **model_name);

/* NaN the compiler can see before anything runs: a constant that is NaN, and a division
 * by a constant zero (a mean over an empty slice, an unbiased variance of one element,
 * x / 0), which makes every element inf or NaN. Warnings: the model is valid, but a user
 * would rather hear it from `kiln check` than from a loss of nan after the first step. */
/* The value of a node that is a constant fill, folded through moves and arithmetic on
 * constants (a variance's n - 1); false when it is not one (depth-limited). */
static bool constant_value(const Graph *g, NodeId id, int depth, double *v)
{
    const Node *n = &g->nodes[id];
    if (depth > 8) return false;
    switch ((Op)n->op) {
    case OP_CONST: *v = n->fattr[0]; return true;
    case OP_RESHAPE: case OP_EXPAND: case OP_CAST: return constant_value(g, ir_input(g, id, 0), depth + 1, v);
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_DIV: {
        double a, b;
        if (!constant_value(g, ir_input(g, id, 0), depth + 1, &a) || !constant_value(g, ir_input(g, id, 1), depth + 1, &b)) return false;
        *v = interp_binary((Op)n->op, a, b);
        return true;
    }
    default: return false;
    }
}

static void warn_visible_nan(Lower *L, uint16_t file)
{
    const Graph *g = L->g;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        Loc loc = n->loc;
        loc.file = file;
        if (!loc.line) continue;
        if (n->op == OP_CONST && isnan(n->fattr[0])) {
            diag_report(L->d, DIAG_WARNING, loc, "this value is NaN: every result that depends on it is NaN");
        } else if (n->op == OP_DIV && ir_dtype_is_float((DType)n->dtype)) {
            double y;
            if (constant_value(g, ir_input(g, i, 1), 0, &y) && y == 0)
                diag_report(L->d, DIAG_WARNING, loc,
                            "division by zero: every element is inf or NaN at run time (a mean over an empty slice, a "
                            "variance of one element, or a division by 0)");
        }
    }
}

/* Lowers the parsed file `ast` (registered with d as `file`) in `mode`. With recipe, the
 * train section is checked into it (errors of both reported in one run); without, the
 * recipe is the caller's, already checked. NULL with diagnostics on error. */
static Graph *lower_ast(Diag *d, Ast *ast, const char *path, GraphMode mode, Recipe *recipe)
{
    Lower L;
    memset(&L, 0, sizeof L);
    L.d = d;
    L.ast = ast;
    sb_init(&L.err);
    AstId forward = AST_NONE, loss = AST_NONE, train = AST_NONE;
    const char *model_name = NULL;
    bool ok = check_declarations(&L, &forward, &loss, &train, &model_name);
    Graph *out = NULL;
    if (ok) {
        L.g = ir_graph_new(model_name);
        L.g->mode = (uint8_t)mode;
        ir_add_file(L.g, path);
        L.b.g = L.g;
        L.b.err = &L.err;
        L.b.loc.file = 0;
        L.batch = recipe_batch_hint(ast, train);
        L.globals = lower_scope_new(&L, NULL, true);
        lower_inst_new(&L, -1, "", model_name, ast_node(ast, ast->root)->loc);
        lower_globals(&L);
        if (!L.failed) lower_model(&L, forward, loss, train);
        if (!L.failed) warn_visible_nan(&L, ast_node(ast, ast->root)->loc.file);
        /* The graph's locations use the graph's own file table (index 0 = this file). */
        for (NodeId i = 0; i < L.g->nnodes; i++) L.g->nodes[i].loc.file = 0;
        if (!L.failed) {
            StrBuf verr;
            sb_init(&verr);
            if (ir_verify(L.g, &verr)) {
                diag_error(d, ast_node(ast, ast->root)->loc, "internal error: the lowered graph is invalid:\n%s", verr.data);
                L.failed = true;
            }
            sb_free(&verr);
        }
        if (!L.failed) {
            /* the decode graph's inputs are not the data's (the recipe was checked with the eval graph) */
            if (!recipe || recipe_check(recipe, ast, train, mode == MODE_DECODE ? NULL : L.g, d)) {
                out = L.g;
                L.g = NULL;
            }
        } else if (recipe) {
            /* Report the recipe's own errors too: one run shows all of a file's problems.
             * Without a valid graph, data loaders' input names are not checked. */
            recipe_check(recipe, ast, train, NULL, d);
        }
        ir_graph_free(L.g);
    }
    for (int32_t i = 0; i < L.ninsts; i++) {
        free(L.insts[i].path);
        free(L.insts[i].type);
        for (int32_t j = 0; j < L.insts[i].nmembers; j++) free(L.insts[i].members[j].name);
        free(L.insts[i].members);
        strmap_free(&L.insts[i].member_index);
    }
    free(L.insts);
    free(L.seq);
    free(L.rules);
    for (int32_t i = 0; i < L.nunset; i++) free(L.unset[i].name);
    free(L.unset);
    free(L.inst_stack);
    for (int32_t i = 0; i < L.nscopes; i++) scope_free(L.scopes[i]);
    free(L.scopes);
    sb_free(&L.err);
    return out;
}

Model *frontend_compile(Diag *d, const char *path, const char *text, size_t len, GraphMode mode)
{
    int errors_before = d->nerrors;
    uint16_t file = diag_add_source(d, path, text, len);
    Ast *ast = ast_parse(d, file);
    if (d->nerrors > errors_before) {
        ast_free(ast);
        return NULL;
    }
    Model *m = xcalloc(1, sizeof *m);
    m->graph = lower_ast(d, ast, path, mode, &m->recipe);
    if (!m->graph) {
        recipe_free(&m->recipe);
        free(m);
        ast_free(ast);
        return NULL;
    }
    m->ast = ast;
    m->path = xstrdup(path);
    return m;
}

Graph *frontend_lower(Diag *d, const Model *m, GraphMode mode)
{
    return lower_ast(d, m->ast, m->path, mode, NULL);
}

void frontend_model_free(Model *m)
{
    if (!m) return;
    ir_graph_free(m->graph);
    recipe_free(&m->recipe);
    ast_free(m->ast);
    free(m->path);
    free(m);
}
