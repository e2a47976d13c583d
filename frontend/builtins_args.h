/* builtins_args.h — what the built-in modules' files share (builtins.c, builtins_rnn.c):
 * their arguments read and checked against their ranges, shapes, members and child
 * modules. Static inline: each file takes what it uses. */
#ifndef KILN_FRONTEND_BUILTINS_ARGS_H
#define KILN_FRONTEND_BUILTINS_ARGS_H

#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static inline Inst *I(Lower *L, int32_t inst) { return &L->insts[inst]; }
static inline AstId arg_at(Lower *L, int32_t inst, int i, AstId dflt)
{
    AstId a = I(L, inst)->args_at[i];
    return a > 0 ? a : dflt;
}

/* Integer argument i of inst, checked to lie in [lo, hi]. */
static inline bool arg_int(Lower *L, int32_t inst, int i, AstId at, int64_t lo, int64_t hi, int64_t *out)
{
    const BuiltinModule *bm = I(L, inst)->builtin;
    AstId where = arg_at(L, inst, i, at);
    StrBuf what;
    sb_init(&what);
    sb_printf(&what, "%s(%s)", bm->name, bm->args[i]);
    bool ok = value_int(L, I(L, inst)->args[i], where, what.data, out);
    if (ok && (*out < lo || *out > hi)) {
        lower_error(L, where, "%s must be between %lld and %lld, found %lld", what.data, (long long)lo, (long long)hi,
                    (long long)*out);
        ok = false;
    }
    sb_free(&what);
    return ok;
}

static inline bool arg_num(Lower *L, int32_t inst, int i, AstId at, double lo, double hi, double *out)
{
    const BuiltinModule *bm = I(L, inst)->builtin;
    AstId where = arg_at(L, inst, i, at);
    bool ok = value_number(L, I(L, inst)->args[i], where, bm->args[i], out);
    if (ok && !(*out >= lo && *out <= hi)) {
        lower_error(L, where, "%s(%s) must be between %g and %g, found %g", bm->name, bm->args[i], lo, hi, *out);
        ok = false;
    }
    return ok;
}

static inline bool arg_bool(Lower *L, int32_t inst, int i, AstId at, bool *out)
{
    return value_bool(L, I(L, inst)->args[i], arg_at(L, inst, i, at), I(L, inst)->builtin->args[i], out);
}

#define MAXD (INT64_C(1) << 31)

/* Whether argument i was written in the model file (not its default): the binder records
 * where each argument came from, and the call itself for a default. */
static inline bool arg_written(Lower *L, int32_t inst, int i, AstId call)
{
    AstId a = I(L, inst)->args_at[i];
    return a > 0 && a != call;
}

/* A sentinel default (0 = "as PyTorch's None") must not be written: it would be taken for
 * the default instead of meaning what it says. */
static inline bool no_written_zero(Lower *L, int32_t inst, int i, AstId at, int64_t v, const char *meaning)
{
    if (v != 0 || !arg_written(L, inst, i, at)) return true;
    const BuiltinModule *bm = I(L, inst)->builtin;
    lower_error(L, arg_at(L, inst, i, at), "%s(%s) must be at least 1, found 0 (leave it out for %s)", bm->name, bm->args[i], meaning);
    return false;
}

static inline Shape shape1(int64_t a) { Dim d[1] = {ir_dim_const(a)}; return ir_shape_make(1, d); }
static inline Shape shape2(int64_t a, int64_t b) { Dim d[2] = {ir_dim_const(a), ir_dim_const(b)}; return ir_shape_make(2, d); }

static inline NodeId member_node(Lower *L, int32_t inst, const char *name)
{
    Value *v = inst_member(L, inst, name);
    return v && v->kind == V_TENSOR ? v->node : IR_NONE;
}

/* One tensor input, checked. */
static inline NodeId one_input(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    if (nargs != 1) {
        lower_error(L, at, "%s '%s' takes 1 input, found %d", I(L, inst)->type, I(L, inst)->path, nargs);
        return IR_NONE;
    }
    return lower_tensor_arg(L, args[0], at, I(L, inst)->type);
}

static inline Value result(Lower *L, NodeId r, AstId at) { return r == IR_NONE ? lower_builder_error(L, at) : value_tensor(r); }

/* Creates a child built-in module (e.g. MLP's c_fc) with numeric arguments. */
static inline int32_t child(Lower *L, int32_t parent, const char *name, const char *type, const double *args, int nargs, AstId at)
{
    const BuiltinModule *bm = builtin_find(type);
    int32_t id = lower_inst_new(L, parent, name, type, I(L, parent)->loc);
    L->insts[id].builtin = bm;
    L->insts[id].scope = I(L, parent)->scope;
    for (int i = 0; i < BUILTIN_MAX_ARGS && bm->args[i]; i++) {
        Value v;
        if (i < nargs) v = value_num(args[i], args[i] == floor(args[i]));
        else if (!strcmp(bm->defaults[i], "true") || !strcmp(bm->defaults[i], "false"))
            v = (Value){.kind = V_BOOL, .num = bm->defaults[i][0] == 't', .node = IR_NONE};
        else v = value_num(strtod(bm->defaults[i], NULL), !strpbrk(bm->defaults[i], ".eE"));
        L->insts[id].args[i] = v;
        L->insts[id].args_at[i] = 0;
    }
    if (!bm->create(L, id, at)) return -1;
    Value mv = {.kind = V_MODULE, .idx = id, .node = IR_NONE};
    lower_add_member(L, parent, name, mv);
    return id;
}

static inline Value apply_child(Lower *L, int32_t parent, const char *name, NodeId x, AstId at)
{
    Value *m = inst_member(L, parent, name);
    Value in = value_tensor(x);
    return I(L, m->idx)->builtin->apply(L, m->idx, &in, 1, at);
}


/* builtins_rnn.c: LSTM and GRU */
bool builtin_rnn_create(Lower *L, int32_t inst, AstId at);
Value builtin_rnn_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at);

#endif
