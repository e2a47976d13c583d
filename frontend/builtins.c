/* builtins.c — the built-in modules, named and laid out like torch.nn's, so parameter
 * names are PyTorch state_dict keys and a checkpoint moves between Kiln and PyTorch
 * without conversion. Each module creates its parameters with PyTorch's default
 * initialisation (see docs/language.md) and applies itself by expanding into primitive
 * ops through composite.c; nothing here is an opaque kernel. */
#include "internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static Inst *I(Lower *L, int32_t inst) { return &L->insts[inst]; }
static AstId arg_at(Lower *L, int32_t inst, int i, AstId dflt)
{
    AstId a = I(L, inst)->args[i].count;
    return a > 0 ? a : dflt;
}

/* Integer argument i of inst, checked to lie in [lo, hi]. */
static bool arg_int(Lower *L, int32_t inst, int i, AstId at, int64_t lo, int64_t hi, int64_t *out)
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

static bool arg_num(Lower *L, int32_t inst, int i, AstId at, double lo, double hi, double *out)
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

static bool arg_bool(Lower *L, int32_t inst, int i, AstId at, bool *out)
{
    return value_bool(L, I(L, inst)->args[i], arg_at(L, inst, i, at), I(L, inst)->builtin->args[i], out);
}

#define MAXD (INT64_C(1) << 31)

/* Whether argument i was written in the model file (not its default): the binder records
 * where each argument came from, and the call itself for a default. */
static bool arg_written(Lower *L, int32_t inst, int i, AstId call)
{
    AstId a = I(L, inst)->args[i].count;
    return a > 0 && a != call;
}

/* A sentinel default (0 = "as PyTorch's None") must not be written: it would be taken for
 * the default instead of meaning what it says. */
static bool no_written_zero(Lower *L, int32_t inst, int i, AstId at, int64_t v, const char *meaning)
{
    if (v != 0 || !arg_written(L, inst, i, at)) return true;
    const BuiltinModule *bm = I(L, inst)->builtin;
    lower_error(L, arg_at(L, inst, i, at), "%s(%s) must be at least 1, found 0 (leave it out for %s)", bm->name, bm->args[i], meaning);
    return false;
}

static Shape shape1(int64_t a) { Dim d[1] = {ir_dim_const(a)}; return ir_shape_make(1, d); }
static Shape shape2(int64_t a, int64_t b) { Dim d[2] = {ir_dim_const(a), ir_dim_const(b)}; return ir_shape_make(2, d); }

static NodeId member_node(Lower *L, int32_t inst, const char *name)
{
    Value *v = inst_member(L, inst, name);
    return v && v->kind == V_TENSOR ? v->node : IR_NONE;
}

/* One tensor input, checked. */
static NodeId one_input(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    if (nargs != 1) {
        lower_error(L, at, "%s '%s' takes 1 input, found %d", I(L, inst)->type, I(L, inst)->path, nargs);
        return IR_NONE;
    }
    return lower_tensor_arg(L, args[0], at, I(L, inst)->type);
}

static Value result(Lower *L, NodeId r, AstId at) { return r == IR_NONE ? lower_builder_error(L, at) : value_tensor(r); }

/* Creates a child built-in module (e.g. MLP's c_fc) with numeric arguments. */
static int32_t child(Lower *L, int32_t parent, const char *name, const char *type, const double *args, int nargs, AstId at)
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
        v.count = 0;
        L->insts[id].args[i] = v;
    }
    if (!bm->create(L, id, at)) return -1;
    Value mv = {.kind = V_MODULE, .idx = id, .node = IR_NONE};
    lower_add_member(L, parent, name, mv);
    return id;
}

static Value apply_child(Lower *L, int32_t parent, const char *name, NodeId x, AstId at)
{
    Value *m = inst_member(L, parent, name);
    Value in = value_tensor(x);
    return I(L, m->idx)->builtin->apply(L, m->idx, &in, 1, at);
}

/* ---- Linear ---- */

static bool linear_create(Lower *L, int32_t inst, AstId at)
{
    int64_t in, out;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &in) || !arg_int(L, inst, 1, at, 1, MAXD, &out) || !arg_bool(L, inst, 2, at, &bias))
        return false;
    /* kaiming_uniform_(a=sqrt(5)) reduces to U(-1/sqrt(in), 1/sqrt(in)); the bias uses the same bound. */
    double bound = 1.0 / sqrt((double)in);
    Shape w = shape2(out, in), b = shape1(out);
    if (lower_param(L, inst, "weight", &w, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, inst, "bias", &b, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    return true;
}

static Value linear_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    NodeId w = member_node(L, inst, "weight"), b = member_node(L, inst, "bias");
    const Shape *xs = &L->g->nodes[x].shape, *ws = &L->g->nodes[w].shape;
    if (xs->rank == 0 || !ir_dim_eq(xs->d[xs->rank - 1], ws->d[1])) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        lower_error(L, at, "%s '%s' expects inputs of shape [..., %lld], found %s", I(L, inst)->type, I(L, inst)->path,
                    (long long)ws->d[1].k, t.data);
        sb_free(&t);
        return value_error();
    }
    return result(L, comp_linear(&L->b, x, w, b), at);
}

/* ---- Conv2d ---- */

static bool conv_create(Lower *L, int32_t inst, AstId at)
{
    int64_t cin, cout, k, stride, pad, dil;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &cin) || !arg_int(L, inst, 1, at, 1, MAXD, &cout) ||
        !arg_int(L, inst, 2, at, 1, 1024, &k) || !arg_int(L, inst, 3, at, 1, 1024, &stride) ||
        !arg_int(L, inst, 4, at, 0, 1024, &pad) || !arg_int(L, inst, 5, at, 1, 1024, &dil) || !arg_bool(L, inst, 6, at, &bias))
        return false;
    double bound = 1.0 / sqrt((double)(cin * k * k));
    Dim d[4] = {ir_dim_const(cout), ir_dim_const(cin), ir_dim_const(k), ir_dim_const(k)};
    Shape w = ir_shape_make(4, d), b = shape1(cout);
    if (lower_param(L, inst, "weight", &w, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, inst, "bias", &b, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    return true;
}

static Value conv_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t stride, pad, dil;
    arg_int(L, inst, 3, at, 1, 1024, &stride);
    arg_int(L, inst, 4, at, 0, 1024, &pad);
    arg_int(L, inst, 5, at, 1, 1024, &dil);
    return result(L, comp_conv2d(&L->b, x, member_node(L, inst, "weight"), member_node(L, inst, "bias"), (int)stride, (int)pad, (int)dil), at);
}

/* ---- pooling ---- */

static bool pool_create(Lower *L, int32_t inst, AstId at)
{
    int64_t k, stride, pad;
    return arg_int(L, inst, 0, at, 1, 1024, &k) && arg_int(L, inst, 1, at, 0, 1024, &stride) &&
           no_written_zero(L, inst, 1, at, stride, "the kernel size") && arg_int(L, inst, 2, at, 0, 512, &pad);
}

static Value pool_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t k, stride, pad;
    arg_int(L, inst, 0, at, 1, 1024, &k);
    arg_int(L, inst, 1, at, 0, 1024, &stride);
    arg_int(L, inst, 2, at, 0, 512, &pad);
    bool max = I(L, inst)->type[0] == 'M';
    /* stride = 0 stands for PyTorch's stride=None: the kernel size. */
    return result(L, comp_pool2d(&L->b, x, max, (int)k, (int)(stride ? stride : k), (int)pad), at);
}

/* ---- BatchNorm2d ---- */

static bool bn_create(Lower *L, int32_t inst, AstId at)
{
    int64_t c;
    double eps, mom;
    bool affine;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &c) || !arg_num(L, inst, 1, at, 0, 1, &eps) || !arg_num(L, inst, 2, at, 0, 1, &mom) ||
        !arg_bool(L, inst, 3, at, &affine))
        return false;
    Shape s = shape1(c), s0 = ir_shape_make(0, NULL);
    if (affine && (lower_param(L, inst, "weight", &s, INIT_ONES, 0, 0, true, at) == IR_NONE ||
                   lower_param(L, inst, "bias", &s, INIT_ZEROS, 0, 0, true, at) == IR_NONE))
        return false;
    if (lower_param(L, inst, "running_mean", &s, INIT_ZEROS, 0, 0, false, at) == IR_NONE ||
        lower_param(L, inst, "running_var", &s, INIT_ONES, 0, 0, false, at) == IR_NONE)
        return false;
    NodeId nbt = lower_param(L, inst, "num_batches_tracked", &s0, INIT_ZEROS, 0, 0, false, at);
    if (nbt == IR_NONE) return false;
    L->g->nodes[nbt].dtype = DT_I64;
    return true;
}

static Value bn_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    const Shape *xs = &L->g->nodes[x].shape;
    NodeId rm = member_node(L, inst, "running_mean"), rv = member_node(L, inst, "running_var");
    if (xs->rank != 4 || !ir_dim_eq(xs->d[1], L->g->nodes[rm].shape.d[0])) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        lower_error(L, at, "BatchNorm2d '%s' expects [N, %lld, H, W], found %s", I(L, inst)->path,
                    (long long)L->g->nodes[rm].shape.d[0].k, t.data);
        sb_free(&t);
        return value_error();
    }
    double eps, mom;
    arg_num(L, inst, 1, at, 0, 1, &eps);
    arg_num(L, inst, 2, at, 0, 1, &mom);
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    Dim cd[4] = {ir_dim_const(1), L->g->nodes[rm].shape.d[0], ir_dim_const(1), ir_dim_const(1)};
    Shape c11 = ir_shape_make(4, cd);
    NodeId mean, var;
    if (L->g->mode == MODE_TRAIN) {
        /* Batch statistics (biased variance) normalise; the running statistics are updated
         * with the unbiased variance, exactly as torch.nn.BatchNorm2d does in train(). */
        uint64_t axes = 1 | 4 | 8;
        mean = comp_mean(b, x, axes, true);
        var = comp_var(b, x, axes, true, false);
        NodeId uvar = comp_var(b, x, axes, false, true);
        NodeId m1 = comp_mean(b, x, axes, false);
        if (mean == IR_NONE || var == IR_NONE || uvar == IR_NONE || m1 == IR_NONE) return lower_builder_error(L, at);
        NodeId nrm = ir_b_binary(b, OP_ADD, comp_scalar_op(b, OP_MUL, rm, 1 - mom, false), comp_scalar_op(b, OP_MUL, m1, mom, false));
        NodeId nrv = ir_b_binary(b, OP_ADD, comp_scalar_op(b, OP_MUL, rv, 1 - mom, false), comp_scalar_op(b, OP_MUL, uvar, mom, false));
        NodeId nbt = member_node(L, inst, "num_batches_tracked");
        NodeId nnbt = comp_scalar_op(b, OP_ADD, nbt, 1, false);
        if (nrm == IR_NONE || nrv == IR_NONE || nnbt == IR_NONE) return lower_builder_error(L, at);
        ir_add_output(L->g, OUT_UPDATE, ir_node_name(L->g, rm), nrm);
        ir_add_output(L->g, OUT_UPDATE, ir_node_name(L->g, rv), nrv);
        ir_add_output(L->g, OUT_UPDATE, ir_node_name(L->g, nbt), nnbt);
    } else {
        mean = ir_b_reshape(b, rm, &c11);
        var = ir_b_reshape(b, rv, &c11);
    }
    NodeId d = ir_b_binary(b, OP_SUB, x, mean);
    NodeId sd = ir_b_unary(b, OP_SQRT, comp_scalar_op(b, OP_ADD, var, eps, false));
    if (d == IR_NONE || sd == IR_NONE) return lower_builder_error(L, at);
    NodeId y = ir_b_binary(b, OP_DIV, d, sd);
    NodeId w = member_node(L, inst, "weight"), bb = member_node(L, inst, "bias");
    if (w != IR_NONE) y = ir_b_binary(b, OP_MUL, y, ir_b_reshape(b, w, &c11));
    if (bb != IR_NONE && y != IR_NONE) y = ir_b_binary(b, OP_ADD, y, ir_b_reshape(b, bb, &c11));
    return result(L, y, at);
}

/* ---- LayerNorm ---- */

static bool ln_create(Lower *L, int32_t inst, AstId at)
{
    int64_t c;
    double eps;
    bool affine, bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &c) || !arg_num(L, inst, 1, at, 0, 1, &eps) || !arg_bool(L, inst, 2, at, &affine) ||
        !arg_bool(L, inst, 3, at, &bias))
        return false;
    if (!affine && arg_written(L, inst, 3, at)) {
        lower_error(L, arg_at(L, inst, 3, at), "LayerNorm(bias) has no effect with elementwise_affine = false (there are no parameters)");
        return false;
    }
    Shape s = shape1(c);
    if (affine && lower_param(L, inst, "weight", &s, INIT_ONES, 0, 0, true, at) == IR_NONE) return false;
    if (affine && bias && lower_param(L, inst, "bias", &s, INIT_ZEROS, 0, 0, true, at) == IR_NONE) return false;
    return true;
}

static Value ln_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t c;
    double eps;
    arg_int(L, inst, 0, at, 1, MAXD, &c);
    arg_num(L, inst, 1, at, 0, 1, &eps);
    const Shape *xs = &L->g->nodes[x].shape;
    if (xs->rank == 0 || !ir_dim_eq(xs->d[xs->rank - 1], ir_dim_const(c))) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        lower_error(L, at, "LayerNorm '%s' normalises a last axis of %lld, found %s", I(L, inst)->path, (long long)c, t.data);
        sb_free(&t);
        return value_error();
    }
    return result(L, comp_layer_norm(&L->b, x, member_node(L, inst, "weight"), member_node(L, inst, "bias"), 1, eps), at);
}

/* ---- Embedding ---- */

static bool emb_create(Lower *L, int32_t inst, AstId at)
{
    int64_t n, dim;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &n) || !arg_int(L, inst, 1, at, 1, MAXD, &dim)) return false;
    Shape w = shape2(n, dim);
    return lower_param(L, inst, "weight", &w, INIT_NORMAL, 0, 1, true, at) != IR_NONE;
}

static Value emb_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    if (!ir_dtype_is_int((DType)L->g->nodes[x].dtype)) {
        lower_error(L, at, "Embedding '%s' needs integer indices, found %s", I(L, inst)->path,
                    ir_dtype_name((DType)L->g->nodes[x].dtype));
        return value_error();
    }
    NodeId weight = member_node(L, inst, "weight");
    char what[300];
    snprintf(what, sizeof what, "Embedding '%s'", I(L, inst)->path);
    x = ir_b_check_index(&L->b, x, L->g->nodes[weight].shape.d[0].k, what);
    return result(L, x == IR_NONE ? IR_NONE : ir_b_gather(&L->b, weight, x), at);
}

/* ---- Dropout ---- */

static bool dropout_create(Lower *L, int32_t inst, AstId at)
{
    double p;
    return arg_num(L, inst, 0, at, 0, 1, &p);
}

static Value dropout_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    double p;
    arg_num(L, inst, 0, at, 0, 1, &p);
    return result(L, comp_dropout(&L->b, x, p, L->g->mode == MODE_TRAIN), at);
}

/* ---- MLP (GPT-2's: c_fc, tanh-GELU, c_proj, dropout) ---- */

static bool mlp_create(Lower *L, int32_t inst, AstId at)
{
    int64_t in, hidden, out;
    double p;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &in) || !arg_int(L, inst, 1, at, 1, MAXD, &hidden) ||
        !arg_int(L, inst, 2, at, 0, MAXD, &out) || !no_written_zero(L, inst, 2, at, out, "in_features") ||
        !arg_num(L, inst, 3, at, 0, 1, &p) || !arg_bool(L, inst, 4, at, &bias))
        return false;
    if (!out) out = in;
    double a1[3] = {(double)in, (double)hidden, bias}, a2[3] = {(double)hidden, (double)out, bias};
    return child(L, inst, "c_fc", "Linear", a1, 3, at) >= 0 && child(L, inst, "c_proj", "Linear", a2, 3, at) >= 0;
}

static Value mlp_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    Value h = apply_child(L, inst, "c_fc", x, at);
    if (h.kind != V_TENSOR) return value_error();
    NodeId g = comp_gelu_tanh(&L->b, h.node);
    if (g == IR_NONE) return lower_builder_error(L, at);
    Value y = apply_child(L, inst, "c_proj", g, at);
    if (y.kind != V_TENSOR) return value_error();
    double p;
    arg_num(L, inst, 3, at, 0, 1, &p);
    return result(L, comp_dropout(&L->b, y.node, p, L->g->mode == MODE_TRAIN), at);
}

/* ---- CausalSelfAttention (GPT-2's: c_attn [3C], c_proj [C]) ---- */

static bool attn_create(Lower *L, int32_t inst, AstId at)
{
    int64_t c, h;
    double p;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &c) || !arg_int(L, inst, 1, at, 1, 4096, &h) || !arg_num(L, inst, 2, at, 0, 1, &p) ||
        !arg_bool(L, inst, 3, at, &bias))
        return false;
    if (c % h) {
        lower_error(L, arg_at(L, inst, 1, at), "CausalSelfAttention: embed_dim %lld is not divisible by num_heads %lld", (long long)c,
                    (long long)h);
        return false;
    }
    double a1[3] = {(double)c, (double)(3 * c), bias}, a2[3] = {(double)c, (double)c, bias};
    return child(L, inst, "c_attn", "Linear", a1, 3, at) >= 0 && child(L, inst, "c_proj", "Linear", a2, 3, at) >= 0;
}

static Value attn_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t c, h;
    double p;
    arg_int(L, inst, 0, at, 1, MAXD, &c);
    arg_int(L, inst, 1, at, 1, 4096, &h);
    arg_num(L, inst, 2, at, 0, 1, &p);
    const Shape *xs = &L->g->nodes[x].shape;
    if (xs->rank != 3 || !ir_dim_eq(xs->d[2], ir_dim_const(c))) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        lower_error(L, at, "CausalSelfAttention '%s' expects [B, T, %lld], found %s", I(L, inst)->path, (long long)c, t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    Dim B = xs->d[0], T = xs->d[1];
    int64_t hd = c / h;
    Value qkv = apply_child(L, inst, "c_attn", x, at);
    if (qkv.kind != V_TENSOR) return value_error();
    /* q, k, v: [B, T, C] each -> [B, H, T, hd]. */
    NodeId heads[3];
    Dim hs[4] = {B, T, ir_dim_const(h), ir_dim_const(hd)};
    Shape split = ir_shape_make(4, hs);
    int perm[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++) {
        NodeId part = ir_b_slice(b, qkv.node, 2, i * c, (i + 1) * c, 1);
        if (part == IR_NONE) return lower_builder_error(L, at);
        NodeId r = ir_b_reshape(b, part, &split);
        if (r == IR_NONE) return lower_builder_error(L, at);
        heads[i] = ir_b_permute(b, r, perm);
        if (heads[i] == IR_NONE) return lower_builder_error(L, at);
    }
    NodeId kt = ir_b_transpose(b, heads[1], 2, 3);
    NodeId att = kt == IR_NONE ? IR_NONE : ir_b_matmul(b, heads[0], kt);
    if (att == IR_NONE) return lower_builder_error(L, at);
    att = comp_scalar_op(b, OP_MUL, att, 1.0 / sqrt((double)hd), false);
    /* Causal mask: query i attends to keys j <= i. */
    Dim td[2] = {T, T};
    Shape tt = ir_shape_make(2, td);
    NodeId qi = ir_b_iota(b, &tt, 0, DT_I64), kj = ir_b_iota(b, &tt, 1, DT_I64);
    NodeId mask = ir_b_binary(b, OP_GE, qi, kj);
    NodeId ninf = ir_b_const(b, -INFINITY, DT_F32);
    if (att == IR_NONE || mask == IR_NONE || ninf == IR_NONE) return lower_builder_error(L, at);
    att = ir_b_where(b, mask, att, ninf);
    if (att == IR_NONE) return lower_builder_error(L, at);
    att = comp_softmax(b, att, 3);
    if (att == IR_NONE) return lower_builder_error(L, at);
    att = comp_dropout(b, att, p, L->g->mode == MODE_TRAIN);
    NodeId y = att == IR_NONE ? IR_NONE : ir_b_matmul(b, att, heads[2]);
    if (y == IR_NONE) return lower_builder_error(L, at);
    y = ir_b_permute(b, y, perm);
    Dim od[3] = {B, T, ir_dim_const(c)};
    Shape out = ir_shape_make(3, od);
    y = y == IR_NONE ? IR_NONE : ir_b_reshape(b, y, &out);
    if (y == IR_NONE) return lower_builder_error(L, at);
    Value pr = apply_child(L, inst, "c_proj", y, at);
    if (pr.kind != V_TENSOR) return value_error();
    return result(L, comp_dropout(b, pr.node, p, L->g->mode == MODE_TRAIN), at);
}

/* ---- the table ---- */

static const BuiltinModule builtins[] = {
    {"Linear", {"in_features", "out_features", "bias"}, {NULL, NULL, "true"},
     "y = x @ weight.T + bias; weight [out, in] and bias ~ U(-1/sqrt(in), 1/sqrt(in))", linear_create, linear_apply},
    {"Conv2d", {"in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "bias"},
     {NULL, NULL, NULL, "1", "0", "1", "true"},
     "2-D convolution (unfold + matmul); weight [out, in, k, k] and bias ~ U(-1/sqrt(in*k*k), +)", conv_create, conv_apply},
    {"MaxPool2d", {"kernel_size", "stride", "padding"}, {NULL, "0", "0"},
     "max over k x k windows; stride defaults to the kernel size", pool_create, pool_apply},
    {"AvgPool2d", {"kernel_size", "stride", "padding"}, {NULL, "0", "0"},
     "mean over k x k windows (padding counted); stride defaults to the kernel size", pool_create, pool_apply},
    {"BatchNorm2d", {"num_features", "eps", "momentum", "affine"}, {NULL, "1e-5", "0.1", "true"},
     "batch statistics in train mode, running statistics in eval; weight ones, bias zeros", bn_create, bn_apply},
    {"LayerNorm", {"normalized_shape", "eps", "elementwise_affine", "bias"}, {NULL, "1e-5", "true", "true"},
     "normalises the last axis; weight ones, bias zeros", ln_create, ln_apply},
    {"Embedding", {"num_embeddings", "embedding_dim"}, {NULL, NULL}, "weight[idx]; weight ~ N(0, 1)", emb_create, emb_apply},
    {"Dropout", {"p"}, {"0.5"}, "zeroes elements with probability p in train mode, scales by 1/(1-p)", dropout_create,
     dropout_apply},
    {"MLP", {"in_features", "hidden_features", "out_features", "dropout", "bias"}, {NULL, NULL, "0", "0.0", "true"},
     "c_proj(gelu_tanh(c_fc(x))) then dropout; GPT-2's MLP", mlp_create, mlp_apply},
    {"CausalSelfAttention", {"embed_dim", "num_heads", "dropout", "bias"}, {NULL, NULL, "0.0", "true"},
     "GPT-2 masked multi-head self-attention: c_attn [3C], c_proj [C]", attn_create, attn_apply},
};

const BuiltinModule *builtin_find(const char *name)
{
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (!strcmp(builtins[i].name, name)) return &builtins[i];
    return NULL;
}

const BuiltinModule *builtin_all(int *n)
{
    *n = (int)(sizeof builtins / sizeof builtins[0]);
    return builtins;
}
