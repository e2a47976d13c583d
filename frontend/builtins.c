/* builtins.c — the built-in modules, named and laid out like torch.nn's, so parameter
 * names are PyTorch state_dict keys and a checkpoint moves between Kiln and PyTorch
 * without conversion. Each module creates its parameters with PyTorch's default
 * initialisation (see docs/language.md) and applies itself by expanding into primitive
 * ops through composite.c; nothing here is an opaque kernel. */
#include "builtins_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- Conv2d, Conv1d ---- */

/* Argument i as a size per spatial axis: one integer for all n axes, or a list of n
 * (Conv2d's kernel_size = [3, 5], as PyTorch's tuples). */
static bool arg_sizes(Lower *L, int32_t inst, int i, AstId at, int64_t lo, int64_t hi, int n, int64_t *out)
{
    Value v = I(L, inst)->args[i];
    if (v.kind != V_TUPLE) {
        if (!arg_int(L, inst, i, at, lo, hi, &out[0])) return false;
        for (int k = 1; k < n; k++) out[k] = out[0];
        return true;
    }
    const BuiltinModule *bm = I(L, inst)->builtin;
    AstId where = arg_at(L, inst, i, at);
    if (v.count != n) {
        lower_error(L, where, "%s(%s) takes one integer or a list of %d, found a list of %d", bm->name, bm->args[i], n, v.count);
        return false;
    }
    char what[80];
    snprintf(what, sizeof what, "%s(%s)", bm->name, bm->args[i]);
    for (int k = 0; k < n; k++) {
        if (!value_int(L, L->seq[v.idx + k], where, what, &out[k])) return false;
        if (out[k] < lo || out[k] > hi) {
            lower_error(L, where, "%s must be between %lld and %lld, found %lld", what, (long long)lo, (long long)hi, (long long)out[k]);
            return false;
        }
    }
    return true;
}

/* kernel, stride, padding (before and after: "same" can be uneven), dilation and groups
 * of a ConvNd (n = 1 or 2); padding = "valid" is 0, "same" keeps the size (stride 1) */
static bool conv_args(Lower *L, int32_t inst, AstId at, int n, int64_t k[2], int64_t st[2], int64_t pad[2], int64_t pad_hi[2],
                      int64_t dil[2], int64_t *groups)
{
    if (!arg_sizes(L, inst, 2, at, 1, 1024, n, k) || !arg_sizes(L, inst, 3, at, 1, 1024, n, st) ||
        !arg_sizes(L, inst, 5, at, 1, 1024, n, dil) || !arg_int(L, inst, 6, at, 1, MAXD, groups))
        return false;
    k[1] = n == 2 ? k[1] : 1; /* unused */
    Value pv = I(L, inst)->args[4];
    if (pv.kind == V_STR) {
        bool same = !strcmp(pv.str, "same");
        if (!same && strcmp(pv.str, "valid")) {
            lower_error(L, arg_at(L, inst, 4, at), "%s(padding) must be a size, a list of sizes, \"same\" or \"valid\"", I(L, inst)->type);
            return false;
        }
        for (int i = 0; i < n; i++) {
            if (same && st[i] != 1) {
                lower_error(L, arg_at(L, inst, 4, at), "%s: padding = \"same\" needs stride 1 (as in PyTorch)", I(L, inst)->type);
                return false;
            }
            int64_t total = same ? dil[i] * (k[i] - 1) : 0;
            pad[i] = total / 2; /* PyTorch puts the odd one after */
            pad_hi[i] = total - pad[i];
        }
        return true;
    }
    if (!arg_sizes(L, inst, 4, at, 0, 1024, n, pad)) return false;
    for (int i = 0; i < n; i++) pad_hi[i] = pad[i];
    return true;
}

static bool conv_create(Lower *L, int32_t inst, AstId at)
{
    int n = I(L, inst)->type[4] == '1' ? 1 : 2;
    int64_t cin, cout, k[2], st[2], pad[2], hi[2], dil[2], groups;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &cin) || !arg_int(L, inst, 1, at, 1, MAXD, &cout) ||
        !conv_args(L, inst, at, n, k, st, pad, hi, dil, &groups) || !arg_bool(L, inst, 7, at, &bias))
        return false;
    if (cin % groups || cout % groups) {
        lower_error(L, arg_at(L, inst, 6, at), "%s: in_channels %lld and out_channels %lld must both be divisible by groups %lld",
                    I(L, inst)->type, (long long)cin, (long long)cout, (long long)groups);
        return false;
    }
    int64_t fan = cin / groups * k[0] * (n == 2 ? k[1] : 1);
    double bound = 1.0 / sqrt((double)fan);
    Dim d[4] = {ir_dim_const(cout), ir_dim_const(cin / groups), ir_dim_const(k[0]), ir_dim_const(k[1])};
    Shape w = ir_shape_make(2 + n, d), b = shape1(cout);
    if (lower_param(L, inst, "weight", &w, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, inst, "bias", &b, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    return true;
}

static Value conv_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int n = I(L, inst)->type[4] == '1' ? 1 : 2;
    int64_t k[2], st[2], pad[2], hi[2], dil[2], groups;
    conv_args(L, inst, at, n, k, st, pad, hi, dil, &groups);
    NodeId w = member_node(L, inst, "weight"), bias = member_node(L, inst, "bias");
    if (n == 2) {
        int s2[2] = {(int)st[0], (int)st[1]}, p2[2] = {(int)pad[0], (int)pad[1]}, h2[2] = {(int)hi[0], (int)hi[1]};
        int d2[2] = {(int)dil[0], (int)dil[1]};
        return result(L, comp_conv2d(&L->b, x, w, bias, s2, p2, h2, d2, (int)groups), at);
    }
    /* Conv1d: [N, C, L] as an image of one row, [N, C, 1, L], with a [O, C, 1, K] kernel. */
    Shape xs = L->g->nodes[x].shape, ws = L->g->nodes[w].shape;
    if (xs.rank != 3 || !ir_dim_eq(xs.d[1], ir_dim_const(ws.d[1].k * groups))) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, at, "Conv1d '%s' expects [N, %lld, L], found %s", I(L, inst)->path, (long long)(ws.d[1].k * groups), t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    Dim x4[4] = {xs.d[0], xs.d[1], ir_dim_const(1), xs.d[2]}, w4[4] = {ws.d[0], ws.d[1], ir_dim_const(1), ws.d[2]};
    Shape xs4 = ir_shape_make(4, x4), ws4 = ir_shape_make(4, w4);
    NodeId xr = ir_b_reshape(b, x, &xs4), wr = ir_b_reshape(b, w, &ws4);
    if (xr == IR_NONE || wr == IR_NONE) return lower_builder_error(L, at);
    int s2[2] = {1, (int)st[0]}, p2[2] = {0, (int)pad[0]}, h2[2] = {0, (int)hi[0]}, d2[2] = {1, (int)dil[0]};
    NodeId y = comp_conv2d(b, xr, wr, bias, s2, p2, h2, d2, (int)groups);
    if (y == IR_NONE) return lower_builder_error(L, at);
    Shape ys = L->g->nodes[y].shape;
    Dim o3[3] = {ys.d[0], ys.d[1], ys.d[3]};
    Shape os = ir_shape_make(3, o3);
    return result(L, ir_b_reshape(b, y, &os), at);
}

/* ---- pooling ---- */

/* MaxPool2d(kernel_size, stride, padding, dilation, ceil_mode) and AvgPool2d(kernel_size,
 * stride, padding, ceil_mode, count_include_pad), as PyTorch orders them; sizes are a
 * number or a list of two. */
typedef struct {
    int k[2], st[2], pad[2], dil[2];
    bool ceil_mode, count_pad;
} PoolArgs;

static bool pool_args(Lower *L, int32_t inst, AstId at, bool creating, PoolArgs *p)
{
    bool max = I(L, inst)->type[0] == 'M';
    int64_t k[2], st[2], pad[2], dil[2] = {1, 1};
    if (!arg_sizes(L, inst, 0, at, 1, 1024, 2, k) || !arg_sizes(L, inst, 1, at, 0, 1024, 2, st) ||
        (creating && !no_written_zero(L, inst, 1, at, st[0] && st[1] ? 1 : 0, "the kernel size")) || !arg_sizes(L, inst, 2, at, 0, 512, 2, pad))
        return false;
    if (max && !arg_sizes(L, inst, 3, at, 1, 1024, 2, dil)) return false;
    if (!arg_bool(L, inst, max ? 4 : 3, at, &p->ceil_mode)) return false;
    p->count_pad = true;
    if (!max && !arg_bool(L, inst, 4, at, &p->count_pad)) return false;
    for (int i = 0; i < 2; i++) {
        p->k[i] = (int)k[i];
        p->st[i] = (int)(st[i] ? st[i] : k[i]); /* stride 0 stands for PyTorch's None: the kernel size */
        p->pad[i] = (int)pad[i];
        p->dil[i] = (int)dil[i];
    }
    return true;
}

static bool pool_create(Lower *L, int32_t inst, AstId at)
{
    PoolArgs p;
    return pool_args(L, inst, at, true, &p);
}

static Value pool_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    PoolArgs p;
    pool_args(L, inst, at, false, &p);
    bool max = I(L, inst)->type[0] == 'M';
    bool plain = p.k[0] == p.k[1] && p.st[0] == p.st[1] && p.pad[0] == p.pad[1] && p.dil[0] == 1 && p.dil[1] == 1 && !p.ceil_mode &&
                 p.count_pad;
    if (plain) return result(L, comp_pool2d(&L->b, x, max, p.k[0], p.st[0], p.pad[0]), at);
    return result(L, comp_pool2d_ex(&L->b, x, max, p.k, p.st, p.pad, p.dil, p.ceil_mode, p.count_pad), at);
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
    bool one_d = !strcmp(I(L, inst)->type, "BatchNorm1d"); /* [N, C] or [N, C, L] */
    int rank = xs->rank;
    if ((one_d ? rank != 2 && rank != 3 : rank != 4) || !ir_dim_eq(xs->d[1], L->g->nodes[rm].shape.d[0])) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        long long c = (long long)L->g->nodes[rm].shape.d[0].k;
        if (one_d) lower_error(L, at, "BatchNorm1d '%s' expects [N, %lld] or [N, %lld, L], found %s", I(L, inst)->path, c, c, t.data);
        else lower_error(L, at, "BatchNorm2d '%s' expects [N, %lld, H, W], found %s", I(L, inst)->path, c, t.data);
        sb_free(&t);
        return value_error();
    }
    double eps, mom;
    arg_num(L, inst, 1, at, 0, 1, &eps);
    arg_num(L, inst, 2, at, 0, 1, &mom);
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    Dim cd[4] = {ir_dim_const(1), L->g->nodes[rm].shape.d[0], ir_dim_const(1), ir_dim_const(1)};
    Shape c11 = ir_shape_make(rank, cd);
    NodeId mean, var;
    if (L->g->mode == MODE_TRAIN) {
        /* Batch statistics (biased variance) normalise; the running statistics are updated
         * with the unbiased variance, exactly as torch.nn.BatchNorm2d does in train(). */
        uint64_t axes = ((UINT64_C(1) << rank) - 1) & ~UINT64_C(2); /* every axis but the channels' */
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

/* normalized_shape: one size, or a list of the trailing sizes (PyTorch's tuple) */
static bool ln_shape(Lower *L, int32_t inst, AstId at, Shape *s)
{
    Value v = I(L, inst)->args[0];
    *s = ir_shape_make(0, NULL);
    int n = v.kind == V_TUPLE ? v.count : 1;
    if (n < 1 || n > IR_MAX_RANK) {
        lower_error(L, arg_at(L, inst, 0, at), "LayerNorm(normalized_shape) takes a size or a list of 1 to %d sizes", IR_MAX_RANK);
        return false;
    }
    for (int i = 0; i < n; i++) {
        int64_t c;
        if (v.kind != V_TUPLE) {
            if (!arg_int(L, inst, 0, at, 1, MAXD, &c)) return false;
        } else if (!value_int(L, L->seq[v.idx + i], arg_at(L, inst, 0, at), "LayerNorm(normalized_shape)", &c)) return false;
        else if (c < 1 || c > MAXD) {
            lower_error(L, arg_at(L, inst, 0, at), "LayerNorm(normalized_shape) sizes must be between 1 and %lld, found %lld", (long long)MAXD,
                        (long long)c);
            return false;
        }
        s->d[s->rank++] = ir_dim_const(c);
    }
    return true;
}

static bool ln_create(Lower *L, int32_t inst, AstId at)
{
    Shape s;
    double eps;
    bool affine, bias;
    if (!ln_shape(L, inst, at, &s) || !arg_num(L, inst, 1, at, 0, 1, &eps) || !arg_bool(L, inst, 2, at, &affine) ||
        !arg_bool(L, inst, 3, at, &bias))
        return false;
    if (!affine && arg_written(L, inst, 3, at)) {
        lower_error(L, arg_at(L, inst, 3, at), "LayerNorm(bias) has no effect with elementwise_affine = false (there are no parameters)");
        return false;
    }
    if (affine && lower_param(L, inst, "weight", &s, INIT_ONES, 0, 0, true, at) == IR_NONE) return false;
    if (affine && bias && lower_param(L, inst, "bias", &s, INIT_ZEROS, 0, 0, true, at) == IR_NONE) return false;
    return true;
}

static Value ln_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    Shape s;
    double eps;
    ln_shape(L, inst, at, &s);
    arg_num(L, inst, 1, at, 0, 1, &eps);
    const Shape *xs = &L->g->nodes[x].shape;
    bool ok = xs->rank >= s.rank;
    for (int i = 0; ok && i < s.rank; i++) ok = ir_dim_eq(xs->d[xs->rank - s.rank + i], s.d[i]);
    if (!ok) {
        StrBuf t, w;
        sb_init(&t);
        sb_init(&w);
        ir_shape_format(&t, L->g, xs);
        ir_shape_format(&w, L->g, &s);
        if (s.rank == 1)
            lower_error(L, at, "LayerNorm '%s' normalises a last axis of %lld, found %s", I(L, inst)->path, (long long)s.d[0].k, t.data);
        else lower_error(L, at, "LayerNorm '%s' normalises last axes of %s, found %s", I(L, inst)->path, w.data, t.data);
        sb_free(&t);
        sb_free(&w);
        return value_error();
    }
    return result(L, comp_layer_norm(&L->b, x, member_node(L, inst, "weight"), member_node(L, inst, "bias"), s.rank, eps), at);
}

/* ---- Embedding ---- */

/* padding_idx (argument i: Embedding's 2, EmbeddingBag's 3), normalised as PyTorch's: none
 * gives -1, a negative one counts from the end, outside [-n, n) is an error. */
static bool emb_padding(Lower *L, int32_t inst, int i, AstId at, int64_t n, int64_t *pad)
{
    *pad = -1;
    if (I(L, inst)->args[i].kind == V_NONE) return true;
    if (!arg_int(L, inst, i, at, -n, n - 1, pad)) return false;
    if (*pad < 0) *pad += n;
    return true;
}

static int emb_padding_arg(Lower *L, int32_t inst) { return strcmp(I(L, inst)->builtin->name, "Embedding") ? 3 : 2; }

/* weight [n, dim] ~ N(0, 1), its padding_idx row zeros (also under an init rule: the row is
 * the module's, as PyTorch's reset_parameters zeroes it) */
static bool emb_create(Lower *L, int32_t inst, AstId at)
{
    int64_t n, dim, pad;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &n) || !arg_int(L, inst, 1, at, 1, MAXD, &dim) ||
        !emb_padding(L, inst, emb_padding_arg(L, inst), at, n, &pad))
        return false;
    Shape w = shape2(n, dim);
    return lower_param_zero_row(L, inst, "weight", &w, INIT_NORMAL, 0, 1, true, pad, at) != IR_NONE;
}

/* The rows of weight [n, d] looked up by x; with a padding row, that row is read through a
 * detach (where(row != pad, weight, detach(weight))): the same values, and no gradient to
 * it from the lookup, as PyTorch's padding_idx. */
static NodeId emb_lookup(Lower *L, int32_t inst, NodeId x, AstId at, int64_t pad)
{
    NodeId weight = member_node(L, inst, "weight");
    IrBuilder *b = &L->b;
    int64_t n = L->g->nodes[weight].shape.d[0].k;
    char what[300];
    snprintf(what, sizeof what, "%s '%s'", I(L, inst)->builtin->name, I(L, inst)->path);
    x = ir_b_check_index(b, x, n, what);
    if (x == IR_NONE) return IR_NONE;
    if (pad >= 0) {
        Shape rs = shape2(n, 1);
        NodeId rows = ir_b_iota(b, &rs, 0, DT_I64);
        NodeId keep = rows == IR_NONE ? IR_NONE : comp_scalar_op(b, OP_NE, rows, (double)pad, false);
        NodeId fixed = ir_b_unary(b, OP_DETACH, weight);
        if (keep == IR_NONE || fixed == IR_NONE) return IR_NONE;
        weight = ir_b_where(b, keep, weight, fixed);
        if (weight == IR_NONE) return IR_NONE;
    }
    return ir_b_gather(b, weight, x);
}

static bool emb_indices(Lower *L, int32_t inst, NodeId x, AstId at)
{
    if (ir_dtype_is_int((DType)L->g->nodes[x].dtype)) return true;
    lower_error(L, at, "%s '%s' needs integer indices, found %s", I(L, inst)->builtin->name, I(L, inst)->path,
                ir_dtype_name((DType)L->g->nodes[x].dtype));
    return false;
}

static Value emb_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE || !emb_indices(L, inst, x, at)) return value_error();
    int64_t pad;
    emb_padding(L, inst, 2, at, L->g->nodes[member_node(L, inst, "weight")].shape.d[0].k, &pad);
    return result(L, emb_lookup(L, inst, x, at, pad), at);
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
    NodeId y = IR_NONE;
    if (L->g->mode == MODE_DECODE && decode_attention(L, I(L, inst)->path, heads, hd, &y)) /* frontend/decode.c */
        goto project;
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
    y = att == IR_NONE ? IR_NONE : ir_b_matmul(b, att, heads[2]);
project:
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

/* ---- activation modules, Identity, Flatten ---- */

static const struct {
    const char *name;
    ActKind kind;
} act_modules[] = {
    {"ReLU", ACT_RELU}, {"Sigmoid", ACT_SIGMOID}, {"Tanh", ACT_TANH}, {"GELU", ACT_GELU}, {"SiLU", ACT_SILU},
    {"LeakyReLU", ACT_LEAKY_RELU}, {"ELU", ACT_ELU}, {"Softplus", ACT_SOFTPLUS}, {"Mish", ACT_MISH},
    {"Hardswish", ACT_HARDSWISH}, {"Hardsigmoid", ACT_HARDSIGMOID},
};

static int act_index(const char *type)
{
    for (int i = 0; i < (int)(sizeof act_modules / sizeof act_modules[0]); i++)
        if (!strcmp(act_modules[i].name, type)) return i;
    return -1;
}

/* The module's numeric arguments (negative_slope, alpha, beta and threshold), checked;
 * GELU's approximate: "none" or "tanh". */
static bool act_args(Lower *L, int32_t inst, AstId at, ActKind *k, double p[2])
{
    const BuiltinModule *bm = I(L, inst)->builtin;
    *k = act_modules[act_index(bm->name)].kind;
    p[0] = p[1] = 0;
    if (*k == ACT_GELU) {
        Value v = I(L, inst)->args[0];
        if (v.kind == V_STR && !strcmp(v.str, "tanh")) *k = ACT_GELU_TANH;
        else if (v.kind != V_NONE && !(v.kind == V_STR && !strcmp(v.str, "none"))) {
            lower_error(L, arg_at(L, inst, 0, at), "GELU(approximate) must be \"none\" (the exact erf form, the default) or \"tanh\"");
            return false;
        }
        return true;
    }
    for (int i = 0; i < 2 && bm->args[i]; i++)
        if (!arg_num(L, inst, i, at, -1e30, 1e30, &p[i])) return false;
    if (*k == ACT_SOFTPLUS && p[0] == 0) {
        lower_error(L, arg_at(L, inst, 0, at), "Softplus(beta) must not be 0");
        return false;
    }
    return true;
}

static bool act_create(Lower *L, int32_t inst, AstId at)
{
    ActKind k;
    double p[2];
    return act_args(L, inst, at, &k, p);
}

static Value act_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    ActKind k;
    double p[2];
    act_args(L, inst, at, &k, p);
    return result(L, comp_activation(&L->b, k, x, p[0], p[1]), at);
}

static bool nothing_create(Lower *L, int32_t inst, AstId at) { return true; }

static Value identity_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    return x == IR_NONE ? value_error() : value_tensor(x);
}

static bool flatten_create(Lower *L, int32_t inst, AstId at)
{
    int64_t a, b;
    return arg_int(L, inst, 0, at, -IR_MAX_RANK, IR_MAX_RANK - 1, &a) && arg_int(L, inst, 1, at, -IR_MAX_RANK, IR_MAX_RANK - 1, &b);
}

static Value flatten_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t a0, b0;
    arg_int(L, inst, 0, at, -IR_MAX_RANK, IR_MAX_RANK - 1, &a0);
    arg_int(L, inst, 1, at, -IR_MAX_RANK, IR_MAX_RANK - 1, &b0);
    const Shape xs = L->g->nodes[x].shape;
    int st = ir_b_axis(&L->b, "Flatten", a0, xs.rank), en = ir_b_axis(&L->b, "Flatten", b0, xs.rank);
    if (st < 0 || en < 0) return lower_builder_error(L, at);
    if (en < st) {
        lower_error(L, at, "Flatten '%s': start_dim %d is after end_dim %d", I(L, inst)->path, st, en);
        return value_error();
    }
    Shape s = ir_shape_make(0, NULL);
    for (int i = 0; i < st; i++) s.d[s.rank++] = xs.d[i];
    Dim p = ir_dim_const(1);
    for (int i = st; i <= en; i++)
        if (!ir_dim_mul(p, xs.d[i], &p)) {
            lower_error(L, at, "Flatten '%s': too many symbolic sizes in one dimension", I(L, inst)->path);
            return value_error();
        }
    s.d[s.rank++] = p;
    for (int i = en + 1; i < xs.rank; i++) s.d[s.rank++] = xs.d[i];
    return result(L, ir_b_reshape(&L->b, x, &s), at);
}

/* ---- RMSNorm, GroupNorm ---- */

static bool rms_create(Lower *L, int32_t inst, AstId at)
{
    int64_t c;
    bool affine;
    double eps = 0;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &c) || !arg_bool(L, inst, 2, at, &affine)) return false;
    if (I(L, inst)->args[1].kind != V_NONE && !arg_num(L, inst, 1, at, 0, 1, &eps)) return false;
    Shape s = shape1(c);
    return !affine || lower_param(L, inst, "weight", &s, INIT_ONES, 0, 0, true, at) != IR_NONE;
}

static Value rms_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t c;
    arg_int(L, inst, 0, at, 1, MAXD, &c);
    /* eps = None is PyTorch's torch.finfo(x.dtype).eps: float32's */
    double eps = 1.1920928955078125e-07;
    if (I(L, inst)->args[1].kind != V_NONE) arg_num(L, inst, 1, at, 0, 1, &eps);
    const Shape *xs = &L->g->nodes[x].shape;
    if (xs->rank == 0 || !ir_dim_eq(xs->d[xs->rank - 1], ir_dim_const(c))) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, xs);
        lower_error(L, at, "RMSNorm '%s' normalises a last axis of %lld, found %s", I(L, inst)->path, (long long)c, t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    /* x / sqrt(mean(x^2) + eps) * weight */
    int r = L->g->nodes[x].shape.rank;
    NodeId ms = comp_mean(b, ir_b_binary(b, OP_MUL, x, x), UINT64_C(1) << (r - 1), true);
    NodeId rms = ms == IR_NONE ? IR_NONE : ir_b_unary(b, OP_SQRT, comp_scalar_op(b, OP_ADD, ms, eps, false));
    NodeId y = rms == IR_NONE ? IR_NONE : ir_b_binary(b, OP_DIV, x, rms);
    NodeId w = member_node(L, inst, "weight");
    if (y != IR_NONE && w != IR_NONE) y = ir_b_binary(b, OP_MUL, y, w);
    return result(L, y, at);
}

static bool gn_create(Lower *L, int32_t inst, AstId at)
{
    int64_t g, c;
    double eps;
    bool affine;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &g) || !arg_int(L, inst, 1, at, 1, MAXD, &c) || !arg_num(L, inst, 2, at, 0, 1, &eps) ||
        !arg_bool(L, inst, 3, at, &affine))
        return false;
    if (c % g) {
        lower_error(L, arg_at(L, inst, 1, at), "GroupNorm: num_channels %lld is not divisible by num_groups %lld", (long long)c, (long long)g);
        return false;
    }
    Shape s = shape1(c);
    if (affine && (lower_param(L, inst, "weight", &s, INIT_ONES, 0, 0, true, at) == IR_NONE ||
                   lower_param(L, inst, "bias", &s, INIT_ZEROS, 0, 0, true, at) == IR_NONE))
        return false;
    return true;
}

static Value gn_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t g, c;
    double eps;
    arg_int(L, inst, 0, at, 1, MAXD, &g);
    arg_int(L, inst, 1, at, 1, MAXD, &c);
    arg_num(L, inst, 2, at, 0, 1, &eps);
    Shape xs = L->g->nodes[x].shape;
    Dim rest = ir_dim_const(c / g);
    bool ok = xs.rank >= 2 && ir_dim_eq(xs.d[1], ir_dim_const(c));
    for (int i = 2; ok && i < xs.rank; i++) ok = ir_dim_mul(rest, xs.d[i], &rest);
    if (!ok) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, at, "GroupNorm '%s' expects [N, %lld, ...], found %s", I(L, inst)->path, (long long)c, t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    /* [N, C, ...] -> [N, G, C/G * ...], normalised over its last axis (biased variance),
     * then back, with a per-channel affine */
    Dim gd[3] = {xs.d[0], ir_dim_const(g), rest};
    Shape gs = ir_shape_make(3, gd);
    NodeId xg = ir_b_reshape(b, x, &gs);
    NodeId y = xg == IR_NONE ? IR_NONE : comp_layer_norm(b, xg, IR_NONE, IR_NONE, 1, eps);
    y = y == IR_NONE ? IR_NONE : ir_b_reshape(b, y, &xs);
    NodeId w = member_node(L, inst, "weight"), bb = member_node(L, inst, "bias");
    Dim cd[IR_MAX_RANK];
    for (int i = 0; i < xs.rank; i++) cd[i] = ir_dim_const(i == 1 ? c : 1);
    Shape c1 = ir_shape_make(xs.rank, cd);
    if (y != IR_NONE && w != IR_NONE) y = ir_b_binary(b, OP_MUL, y, ir_b_reshape(b, w, &c1));
    if (y != IR_NONE && bb != IR_NONE) y = ir_b_binary(b, OP_ADD, y, ir_b_reshape(b, bb, &c1));
    return result(L, y, at);
}

/* ---- AdaptiveAvgPool2d (output sizes that divide the input's) ---- */

static bool adaptive_create(Lower *L, int32_t inst, AstId at)
{
    int64_t o[2];
    return arg_sizes(L, inst, 0, at, 1, MAXD, 2, o);
}

static Value adaptive_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t o[2];
    arg_sizes(L, inst, 0, at, 1, MAXD, 2, o);
    Shape xs = L->g->nodes[x].shape;
    bool ok = xs.rank == 4 || xs.rank == 3;
    int h = xs.rank - 2;
    for (int i = 0; ok && i < 2; i++)
        ok = (o[i] == 1 && ir_dim_is_const(xs.d[h + i])) || (ir_dim_is_const(xs.d[h + i]) && xs.d[h + i].k % o[i] == 0);
    if (!ok) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, at,
                    "AdaptiveAvgPool2d '%s': output %lldx%lld must divide the input's fixed height and width, found %s (PyTorch's "
                    "uneven windows are not supported)",
                    I(L, inst)->path, (long long)o[0], (long long)o[1], t.data);
        sb_free(&t);
        return value_error();
    }
    /* [..., OH, H/OH, OW, W/OW], averaged over the window axes */
    Shape ts = ir_shape_make(0, NULL);
    for (int i = 0; i < h; i++) ts.d[ts.rank++] = xs.d[i];
    for (int i = 0; i < 2; i++) {
        ts.d[ts.rank++] = ir_dim_const(o[i]);
        ts.d[ts.rank++] = ir_dim_const(xs.d[h + i].k / o[i]);
    }
    IrBuilder *b = &L->b;
    NodeId t = ir_b_reshape(b, x, &ts);
    uint64_t axes = UINT64_C(1) << (h + 1) | UINT64_C(1) << (h + 3);
    return result(L, t == IR_NONE ? IR_NONE : comp_mean(b, t, axes, false), at);
}

/* ---- Sequential: its modules, applied in order (built by lower.c's instantiate) ---- */

static Value seq_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    if (nargs != 1) {
        lower_error(L, at, "Sequential '%s' takes 1 input, found %d", I(L, inst)->path, nargs);
        return value_error();
    }
    Value v = args[0];
    for (int32_t i = 0; i < I(L, inst)->nmembers && v.kind != V_ERROR; i++) {
        Value m = I(L, inst)->members[i].v;
        if (m.kind != V_MODULE) continue;
        v = lower_apply_module_value(L, m.idx, &v, 1, at);
    }
    return v;
}

/* ---- MultiheadAttention (nn.MultiheadAttention's parameters and layout) ---- */

static bool mha_create(Lower *L, int32_t inst, AstId at)
{
    int64_t e, h;
    double p;
    bool bias, bf;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &e) || !arg_int(L, inst, 1, at, 1, 4096, &h) || !arg_num(L, inst, 2, at, 0, 1, &p) ||
        !arg_bool(L, inst, 3, at, &bias) || !arg_bool(L, inst, 4, at, &bf))
        return false;
    if (e % h) {
        lower_error(L, arg_at(L, inst, 1, at), "MultiheadAttention: embed_dim %lld is not divisible by num_heads %lld", (long long)e,
                    (long long)h);
        return false;
    }
    /* in_proj_weight: xavier_uniform over [3E, E]; in_proj_bias and out_proj.bias zeros;
     * out_proj.weight as a Linear's, as torch.nn.MultiheadAttention._reset_parameters */
    double xb = sqrt(6.0 / (double)(e + 3 * e)), lb = 1.0 / sqrt((double)e);
    Shape w = shape2(3 * e, e), b3 = shape1(3 * e), ow = shape2(e, e), ob = shape1(e);
    if (lower_param(L, inst, "in_proj_weight", &w, INIT_UNIFORM, -xb, xb, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, inst, "in_proj_bias", &b3, INIT_ZEROS, 0, 0, true, at) == IR_NONE) return false;
    int32_t op = lower_inst_new(L, inst, "out_proj", "Linear", I(L, inst)->loc);
    L->insts[op].builtin = builtin_find("Linear");
    L->insts[op].scope = I(L, inst)->scope;
    L->insts[op].args[0] = value_num((double)e, true);
    L->insts[op].args[1] = value_num((double)e, true);
    L->insts[op].args[2] = (Value){.kind = V_BOOL, .num = bias, .node = IR_NONE};
    if (lower_param(L, op, "weight", &ow, INIT_UNIFORM, -lb, lb, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, op, "bias", &ob, INIT_ZEROS, 0, 0, true, at) == IR_NONE) return false;
    lower_add_member(L, inst, "out_proj", (Value){.kind = V_MODULE, .idx = op, .node = IR_NONE});
    return true;
}

/* m(query, key, value) -> (output, weights averaged over the heads), as PyTorch returns
 * them: y, w = attn(x, x, x). [L, N, E] inputs, or [N, L, E] with batch_first. */
static Value mha_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    if (nargs != 3) {
        lower_error(L, at, "MultiheadAttention '%s' takes 3 inputs (query, key, value), found %d", I(L, inst)->path, nargs);
        return value_error();
    }
    int64_t e, h;
    double p;
    bool bf;
    arg_int(L, inst, 0, at, 1, MAXD, &e);
    arg_int(L, inst, 1, at, 1, 4096, &h);
    arg_num(L, inst, 2, at, 0, 1, &p);
    arg_bool(L, inst, 4, at, &bf);
    IrBuilder *b = &L->b;
    NodeId in[3];
    for (int i = 0; i < 3; i++) {
        in[i] = lower_tensor_arg(L, args[i], at, "MultiheadAttention");
        if (in[i] == IR_NONE) return value_error();
        const Shape *xs = &L->g->nodes[in[i]].shape;
        if (xs->rank != 3 || !ir_dim_eq(xs->d[2], ir_dim_const(e))) {
            StrBuf t;
            sb_init(&t);
            ir_shape_format(&t, L->g, xs);
            lower_error(L, at, "MultiheadAttention '%s' expects %s inputs, found %s", I(L, inst)->path, bf ? "[N, L, E]" : "[L, N, E]", t.data);
            sb_free(&t);
            return value_error();
        }
        if (!bf) in[i] = ir_b_transpose(b, in[i], 0, 1); /* [N, L, E] */
        if (in[i] == IR_NONE) return lower_builder_error(L, at);
    }
    NodeId w = member_node(L, inst, "in_proj_weight"), bias = member_node(L, inst, "in_proj_bias");
    int64_t hd = e / h;
    NodeId heads[3];
    int perm[4] = {0, 2, 1, 3};
    for (int i = 0; i < 3; i++) {
        NodeId wi = ir_b_slice(b, w, 0, i * e, (i + 1) * e, 1);
        NodeId bi = bias == IR_NONE ? IR_NONE : ir_b_slice(b, bias, 0, i * e, (i + 1) * e, 1);
        NodeId pr = wi == IR_NONE ? IR_NONE : comp_linear(b, in[i], wi, bi);
        if (pr == IR_NONE) return lower_builder_error(L, at);
        Shape ps = L->g->nodes[pr].shape;
        Dim hs[4] = {ps.d[0], ps.d[1], ir_dim_const(h), ir_dim_const(hd)};
        Shape split = ir_shape_make(4, hs);
        NodeId r = ir_b_reshape(b, pr, &split);
        heads[i] = r == IR_NONE ? IR_NONE : ir_b_permute(b, r, perm); /* [N, H, L, hd] */
        if (heads[i] == IR_NONE) return lower_builder_error(L, at);
    }
    NodeId kt = ir_b_transpose(b, heads[1], 2, 3);
    NodeId att = kt == IR_NONE ? IR_NONE : ir_b_matmul(b, heads[0], kt);
    att = att == IR_NONE ? IR_NONE : comp_scalar_op(b, OP_MUL, att, 1.0 / sqrt((double)hd), false);
    att = att == IR_NONE ? IR_NONE : comp_softmax(b, att, 3);
    att = att == IR_NONE ? IR_NONE : comp_dropout(b, att, p, L->g->mode == MODE_TRAIN);
    NodeId y = att == IR_NONE ? IR_NONE : ir_b_matmul(b, att, heads[2]);
    y = y == IR_NONE ? IR_NONE : ir_b_permute(b, y, perm);
    if (y == IR_NONE) return lower_builder_error(L, at);
    Shape ys = L->g->nodes[y].shape;
    Dim od[3] = {ys.d[0], ys.d[1], ir_dim_const(e)};
    Shape out = ir_shape_make(3, od);
    y = ir_b_reshape(b, y, &out);
    if (y == IR_NONE) return lower_builder_error(L, at);
    Value pr = apply_child(L, inst, "out_proj", y, at);
    if (pr.kind != V_TENSOR) return value_error();
    NodeId o = bf ? pr.node : ir_b_transpose(b, pr.node, 0, 1);
    NodeId avg = comp_mean(b, att, 2, false); /* [N, L, S] */
    if (o == IR_NONE || avg == IR_NONE) return lower_builder_error(L, at);
    Value t = {.kind = V_TUPLE, .node = IR_NONE, .idx = L->nseq, .count = 2};
    GROW(L->seq, L->seq_cap, L->nseq + 2);
    L->seq[L->nseq++] = value_tensor(o);
    L->seq[L->nseq++] = value_tensor(avg);
    return t;
}

/* ---- Upsample, EmbeddingBag ---- */

static bool upsample_create(Lower *L, int32_t inst, AstId at)
{
    bool bil, al;
    Inst *in = I(L, inst);
    if ((in->args[0].kind == V_NONE) == (in->args[1].kind == V_NONE)) {
        lower_error(L, at, "Upsample: give size or scale_factor (one of the two)");
        return false;
    }
    return lower_interp_mode(L, in->args[2], in->args[3], arg_at(L, inst, 2, at), "Upsample", &bil, &al);
}

static Value upsample_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    Inst *in = I(L, inst);
    int64_t o[2];
    bool bil, al;
    if (!lower_interp_size(L, in->args[0], in->args[1], at, "Upsample", x, o) ||
        !lower_interp_mode(L, in->args[2], in->args[3], at, "Upsample", &bil, &al))
        return value_error();
    return result(L, comp_interpolate(&L->b, x, o[0], o[1], bil, al), at);
}

static bool bag_mode(Lower *L, int32_t inst, AstId at, int *mode)
{
    Value v = I(L, inst)->args[2];
    *mode = 0;
    if (v.kind == V_NONE || (v.kind == V_STR && !strcmp(v.str, "mean"))) return true;
    if (v.kind == V_STR && !strcmp(v.str, "sum")) *mode = 1;
    else if (v.kind == V_STR && !strcmp(v.str, "max")) *mode = 2;
    else {
        lower_error(L, arg_at(L, inst, 2, at), "EmbeddingBag(mode) must be \"mean\", \"sum\" or \"max\"");
        return false;
    }
    return true;
}

static bool bag_create(Lower *L, int32_t inst, AstId at)
{
    int mode;
    return bag_mode(L, inst, at, &mode) && emb_create(L, inst, at);
}

/* EmbeddingBag on bags of one size, [B, N] indices (PyTorch's 2-D input, no offsets). With
 * padding_idx, PyTorch leaves that index out of its bag: the sum and the max are over the
 * others, the mean divides by their count, and a bag of nothing but padding gives zeros. */
static Value bag_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE || !emb_indices(L, inst, x, at)) return value_error();
    if (L->g->nodes[x].shape.rank != 2) {
        lower_error(L, at, "EmbeddingBag '%s' takes [B, N] indices (bags of N), found rank %d", I(L, inst)->path,
                    L->g->nodes[x].shape.rank);
        return value_error();
    }
    int mode;
    int64_t pad;
    bag_mode(L, inst, at, &mode);
    emb_padding(L, inst, 3, at, L->g->nodes[member_node(L, inst, "weight")].shape.d[0].k, &pad);
    IrBuilder *b = &L->b;
    NodeId e = emb_lookup(L, inst, x, at, pad);
    if (e == IR_NONE) return result(L, e, at);
    if (pad < 0) {
        if (mode == 0) return result(L, comp_mean(b, e, 2, false), at);
        return result(L, mode == 1 ? ir_b_reduce(b, OP_REDUCE_SUM, e, 2, false) : ir_b_reduce_max_first(b, e, 2, false), at);
    }
    /* keep [B, N, 1]: the entries that count */
    Shape ks = L->g->nodes[x].shape;
    ks.d[ks.rank++] = ir_dim_const(1);
    NodeId xi = ir_b_cast(b, x, DT_I64);
    NodeId keep = xi == IR_NONE ? IR_NONE : comp_scalar_op(b, OP_NE, xi, (double)pad, false);
    keep = keep == IR_NONE ? IR_NONE : ir_b_reshape(b, keep, &ks);
    NodeId keepf = keep == IR_NONE ? IR_NONE : ir_b_cast(b, keep, DT_F32);
    NodeId cnt = keepf == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, keepf, 2, false); /* [B, 1] */
    NodeId zero = ir_b_const(b, 0.0, DT_F32);
    if (cnt == IR_NONE || zero == IR_NONE) return result(L, IR_NONE, at);
    if (mode == 2) {
        NodeId low = ir_b_const(b, -INFINITY, DT_F32);
        NodeId m = low == IR_NONE ? IR_NONE : ir_b_where(b, keep, e, low);
        m = m == IR_NONE ? IR_NONE : ir_b_reduce_max_first(b, m, 2, false);
        NodeId some = comp_scalar_op(b, OP_GT, cnt, 0.0, false);
        return result(L, m == IR_NONE || some == IR_NONE ? IR_NONE : ir_b_where(b, some, m, zero), at);
    }
    NodeId s = ir_b_where(b, keep, e, zero);
    s = s == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, s, 2, false);
    if (mode == 1 || s == IR_NONE) return result(L, s, at);
    NodeId one = ir_b_const(b, 1.0, DT_F32);
    NodeId den = one == IR_NONE ? IR_NONE : ir_b_binary(b, OP_MAX, cnt, one);
    return result(L, den == IR_NONE ? IR_NONE : ir_b_binary(b, OP_DIV, s, den), at);
}

/* ---- ConvTranspose2d: the adjoint of Conv2d, a product then fold ---- */

static bool convt_args(Lower *L, int32_t inst, AstId at, int64_t k[2], int64_t st[2], int64_t pad[2], int64_t opad[2], int64_t dil[2],
                       int64_t *groups)
{
    if (!arg_sizes(L, inst, 2, at, 1, 1024, 2, k) || !arg_sizes(L, inst, 3, at, 1, 1024, 2, st) ||
        !arg_sizes(L, inst, 4, at, 0, 1024, 2, pad) || !arg_sizes(L, inst, 5, at, 0, 1024, 2, opad) ||
        !arg_int(L, inst, 6, at, 1, 1, groups) || !arg_sizes(L, inst, 8, at, 1, 1024, 2, dil))
        return false;
    for (int i = 0; i < 2; i++)
        if (opad[i] >= st[i] && opad[i] >= dil[i]) {
            lower_error(L, arg_at(L, inst, 5, at), "ConvTranspose2d: output_padding must be smaller than stride or dilation (as PyTorch)");
            return false;
        }
    return true;
}

static bool convt_create(Lower *L, int32_t inst, AstId at)
{
    int64_t cin, cout, k[2], st[2], pad[2], opad[2], dil[2], groups;
    bool bias;
    if (!arg_int(L, inst, 0, at, 1, MAXD, &cin) || !arg_int(L, inst, 1, at, 1, MAXD, &cout) ||
        !convt_args(L, inst, at, k, st, pad, opad, dil, &groups) || !arg_bool(L, inst, 7, at, &bias))
        return false;
    /* weight [in, out, kh, kw]; PyTorch's fan_in is weight.size(1) * kh * kw */
    double bound = 1.0 / sqrt((double)(cout * k[0] * k[1]));
    Dim d[4] = {ir_dim_const(cin), ir_dim_const(cout), ir_dim_const(k[0]), ir_dim_const(k[1])};
    Shape w = ir_shape_make(4, d), b = shape1(cout);
    if (lower_param(L, inst, "weight", &w, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    if (bias && lower_param(L, inst, "bias", &b, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
    return true;
}

static Value convt_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t k[2], st[2], pad[2], opad[2], dil[2], groups;
    convt_args(L, inst, at, k, st, pad, opad, dil, &groups);
    NodeId w = member_node(L, inst, "weight"), bias = member_node(L, inst, "bias");
    Shape xs = L->g->nodes[x].shape, ws = L->g->nodes[w].shape;
    if (xs.rank != 4 || !ir_dim_eq(xs.d[1], ws.d[0]) || !ir_dim_is_const(xs.d[2]) || !ir_dim_is_const(xs.d[3])) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, at, "ConvTranspose2d '%s' expects [N, %lld, H, W] (H and W fixed), found %s", I(L, inst)->path, (long long)ws.d[0].k,
                    t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    /* [Cout*KH*KW, Cin] @ [N, Cin, H*W] -> [N, Cout*KH*KW, H*W], folded onto the full output,
     * then padding cropped from it (output_padding adds rows and columns at the end) */
    int64_t cout = ws.d[1].k, h = xs.d[2].k, wd = xs.d[3].k;
    Dim w2d[2] = {ws.d[0], ir_dim_const(cout * k[0] * k[1])};
    Shape w2s = ir_shape_make(2, w2d);
    NodeId w2 = ir_b_reshape(b, w, &w2s);
    NodeId wt = w2 == IR_NONE ? IR_NONE : ir_b_transpose(b, w2, 0, 1);
    Dim x3d[3] = {xs.d[0], xs.d[1], ir_dim_const(h * wd)};
    Shape x3s = ir_shape_make(3, x3d);
    NodeId x3 = x == IR_NONE ? IR_NONE : ir_b_reshape(b, x, &x3s);
    NodeId cols = wt == IR_NONE || x3 == IR_NONE ? IR_NONE : ir_b_matmul(b, wt, x3);
    if (cols == IR_NONE) return lower_builder_error(L, at);
    int64_t fh = (h - 1) * st[0] + dil[0] * (k[0] - 1) + 1 + opad[0], fw = (wd - 1) * st[1] + dil[1] * (k[1] - 1) + 1 + opad[1];
    if (fh - 2 * pad[0] < 1 || fw - 2 * pad[1] < 1) {
        lower_error(L, at, "ConvTranspose2d '%s': padding leaves no output", I(L, inst)->path);
        return value_error();
    }
    Dim fd[4] = {xs.d[0], ir_dim_const(cout), ir_dim_const(fh), ir_dim_const(fw)};
    Shape fs = ir_shape_make(4, fd);
    NodeId y = ir_b_fold(b, cols, &fs, (int)k[0], (int)k[1], (int)st[0], (int)st[1], (int)dil[0], (int)dil[1]);
    if (y != IR_NONE && pad[0]) y = ir_b_slice(b, y, 2, pad[0], fh - pad[0], 1);
    if (y != IR_NONE && pad[1]) y = ir_b_slice(b, y, 3, pad[1], fw - pad[1], 1);
    if (y != IR_NONE && bias != IR_NONE) {
        Dim bd[4] = {ir_dim_const(1), ir_dim_const(cout), ir_dim_const(1), ir_dim_const(1)};
        Shape bs = ir_shape_make(4, bd);
        y = ir_b_binary(b, OP_ADD, y, ir_b_reshape(b, bias, &bs));
    }
    return result(L, y, at);
}

/* Sequential(Linear(784, 32), ReLU(), ...) as member `name` of parent: its modules are
 * members "0", "1", ... (state_dict keys net.0.weight, as nn.Sequential's), applied in order
 * by seq_apply. Called by lower.c's lower_instantiate for the call e. */
Value builtin_sequential(Lower *L, int32_t parent, const char *name, AstId e)
{
    const AstNode *n = ast_node(L->ast, e);
    Scope *ps = L->insts[parent].scope;
    const char *type = "Sequential";
    int32_t m = lower_inst_new(L, parent, name, type, n->loc);
    L->insts[m].builtin = builtin_find(type);
    L->insts[m].scope = ps;
    if (n->nkids < 2) {
        lower_error(L, e, "Sequential needs at least one module, e.g. Sequential(Linear(784, 32), ReLU())");
        return value_error();
    }
    for (int k = 1; k < n->nkids; k++) {
        AstId a = ast_kid(L->ast, e, k);
        if (ast_node(L->ast, a)->kind == AST_KWARG) {
            lower_error(L, a, "Sequential takes modules by position, e.g. Sequential(Linear(784, 32), ReLU())");
            return value_error();
        }
        const AstNode *an = ast_node(L->ast, a);
        if (an->kind != AST_CALL || ast_node(L->ast, ast_kid(L->ast, a, 0))->kind != AST_NAME) {
            lower_error(L, a, "Sequential takes modules, e.g. Linear(784, 32) or ReLU()");
            return value_error();
        }
        const char *mt = ast_str(L->ast, ast_kid(L->ast, a, 0));
        if (!strcmp(mt, "Parameter") || !strcmp(mt, "Buffer")) {
            lower_error(L, a, "Sequential takes modules, not %s(...)", mt);
            return value_error();
        }
        char idx[16];
        snprintf(idx, sizeof idx, "%d", k - 1);
        int errors = L->d->nerrors;
        Value v = lower_instantiate(L, m, idx, a);
        if (v.kind != V_MODULE || L->d->nerrors > errors) return value_error();
        lower_add_member(L, m, idx, v);
    }
    return (Value){.kind = V_MODULE, .idx = m, .node = IR_NONE};
}

/* ---- the table ---- */

static const BuiltinModule builtins[] = {
    {"Linear", {"in_features", "out_features", "bias"}, {NULL, NULL, "true"},
     "y = x @ weight.T + bias; weight [out, in] and bias ~ U(-1/sqrt(in), 1/sqrt(in))", linear_create, linear_apply},
    {"Conv2d", {"in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"},
     {NULL, NULL, NULL, "1", "0", "1", "1", "true"},
     "2-D convolution (unfold + matmul); weight [out, in, kh, kw] and bias ~ U(-1/sqrt(in*kh*kw), +)", conv_create, conv_apply},
    {"Conv1d", {"in_channels", "out_channels", "kernel_size", "stride", "padding", "dilation", "groups", "bias"},
     {NULL, NULL, NULL, "1", "0", "1", "1", "true"},
     "1-D convolution over [N, C, L] (as Conv2d over one row); weight [out, in, k] and bias ~ U(-1/sqrt(in*k), +)", conv_create,
     conv_apply},
    {"MaxPool2d", {"kernel_size", "stride", "padding", "dilation", "ceil_mode"}, {NULL, "0", "0", "1", "false"},
     "max over k x k windows; stride defaults to the kernel size", pool_create, pool_apply},
    {"AvgPool2d", {"kernel_size", "stride", "padding", "ceil_mode", "count_include_pad"}, {NULL, "0", "0", "false", "true"},
     "mean over k x k windows (padding counted unless count_include_pad = false); stride defaults to the kernel size", pool_create,
     pool_apply},
    {"ConvTranspose2d", {"in_channels", "out_channels", "kernel_size", "stride", "padding", "output_padding", "groups", "bias", "dilation"},
     {NULL, NULL, NULL, "1", "0", "0", "1", "true", "1"},
     "transposed 2-D convolution (matmul + fold); weight [in, out, kh, kw], bias ~ U(-1/sqrt(out*kh*kw), +)", convt_create, convt_apply},
    {"BatchNorm2d", {"num_features", "eps", "momentum", "affine"}, {NULL, "1e-5", "0.1", "true"},
     "batch statistics in train mode, running statistics in eval; weight ones, bias zeros", bn_create, bn_apply},
    {"BatchNorm1d", {"num_features", "eps", "momentum", "affine"}, {NULL, "1e-5", "0.1", "true"},
     "over [N, C] or [N, C, L]: batch statistics in train mode, running statistics in eval", bn_create, bn_apply},
    {"GroupNorm", {"num_groups", "num_channels", "eps", "affine"}, {NULL, NULL, "1e-5", "true"},
     "normalises groups of channels of [N, C, ...]; weight ones, bias zeros per channel", gn_create, gn_apply},
    {"RMSNorm", {"normalized_shape", "eps", "elementwise_affine"}, {NULL, "none", "true"},
     "x / sqrt(mean(x^2, last axis) + eps) * weight; eps none = float32's epsilon; weight ones", rms_create, rms_apply},
    {"AdaptiveAvgPool2d", {"output_size"}, {NULL}, "mean over windows of H/OH x W/OW (output sizes dividing the input's)",
     adaptive_create, adaptive_apply},
    {"MultiheadAttention", {"embed_dim", "num_heads", "dropout", "bias", "batch_first"}, {NULL, NULL, "0.0", "true", "false"},
     "nn.MultiheadAttention: in_proj_weight [3E, E], in_proj_bias, out_proj; m(q, k, v) gives (output, weights)", mha_create,
     mha_apply},
    {"Upsample", {"size", "scale_factor", "mode", "align_corners"}, {"none", "none", "none", "none"},
     "nearest or bilinear interpolation of [N, C, H, W] (mode none = \"nearest\")", upsample_create, upsample_apply},
    {"EmbeddingBag", {"num_embeddings", "embedding_dim", "mode", "padding_idx"}, {NULL, NULL, "none", "none"},
     "mean (mode none), sum or max of the embeddings of each bag of a [B, N] input, padding_idx left out; weight ~ N(0, 1)",
     bag_create, bag_apply},
    {"LSTM", {"input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"},
     {NULL, NULL, "1", "true", "false", "0.0", "false"},
     "nn.LSTM unrolled over a fixed T from zero states: y, (h_n, c_n) = lstm(x); gates i, f, g, o; bidirectional: *_reverse",
     builtin_rnn_create, builtin_rnn_apply},
    {"GRU", {"input_size", "hidden_size", "num_layers", "bias", "batch_first", "dropout", "bidirectional"},
     {NULL, NULL, "1", "true", "false", "0.0", "false"},
     "nn.GRU unrolled over a fixed T from a zero state: y, h_n = gru(x); gates r, z, n; bidirectional: *_reverse", builtin_rnn_create,
     builtin_rnn_apply},
    {"ReLU", {NULL}, {NULL}, "relu(x)", nothing_create, act_apply},
    {"Sigmoid", {NULL}, {NULL}, "sigmoid(x)", nothing_create, act_apply},
    {"Tanh", {NULL}, {NULL}, "tanh(x)", nothing_create, act_apply},
    {"GELU", {"approximate"}, {"none"}, "gelu(x, approximate)", act_create, act_apply},
    {"SiLU", {NULL}, {NULL}, "silu(x) = x sigmoid(x)", nothing_create, act_apply},
    {"LeakyReLU", {"negative_slope"}, {"0.01"}, "leaky_relu(x, negative_slope)", act_create, act_apply},
    {"ELU", {"alpha"}, {"1.0"}, "elu(x, alpha)", act_create, act_apply},
    {"Softplus", {"beta", "threshold"}, {"1.0", "20.0"}, "softplus(x, beta, threshold)", act_create, act_apply},
    {"Mish", {NULL}, {NULL}, "mish(x) = x tanh(softplus(x))", nothing_create, act_apply},
    {"Hardswish", {NULL}, {NULL}, "hardswish(x) = x relu6(x + 3) / 6", nothing_create, act_apply},
    {"Hardsigmoid", {NULL}, {NULL}, "hardsigmoid(x) = relu6(x + 3) / 6", nothing_create, act_apply},
    {"Identity", {NULL}, {NULL}, "x", nothing_create, identity_apply},
    {"Flatten", {"start_dim", "end_dim"}, {"1", "-1"}, "flatten(x, start_dim, end_dim)", flatten_create, flatten_apply},
    {"Sequential", {NULL}, {NULL}, "its modules applied in order; members named 0, 1, ... as nn.Sequential's", nothing_create, seq_apply},
    {"LayerNorm", {"normalized_shape", "eps", "elementwise_affine", "bias"}, {NULL, "1e-5", "true", "true"},
     "normalises the last axis; weight ones, bias zeros", ln_create, ln_apply},
    {"Embedding", {"num_embeddings", "embedding_dim", "padding_idx"}, {NULL, NULL, "none"},
     "weight[idx]; weight ~ N(0, 1), the padding_idx row zeros and without gradient", emb_create, emb_apply},
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
