/* functions.c — the functions a model can call: activations, reductions, losses, shape
 * functions, casts, where, arange and checkpoint(...). One table maps each name to its
 * signature (bound by lower_bind_args, so unknown or missing arguments get one clear
 * message) and to the code that expands it into IR through the builder, composite.c,
 * activations.c, losses.c or tensorops.c. Every function taking a tensor first is also a
 * tensor method (x.mean(1), functions_method). Math functions on plain numbers are
 * evaluated at compile time (0.02 / sqrt(2 * L)). */
#include "internal.h"

#include <math.h>
#include <string.h>

typedef Value (*FnImpl)(Lower *L, const BoundArgs *a, AstId call, int variant);

typedef struct {
    const char *name;
    const char *sig;
    FnImpl impl;
    int variant;
} Function;

static Value done(Lower *L, NodeId r, AstId at) { return r == IR_NONE ? lower_builder_error(L, at) : value_tensor(r); }

static NodeId tensor(Lower *L, const BoundArgs *a, int i, const char *fn)
{
    return lower_tensor_arg(L, a->v[i], a->at[i], fn);
}

static int rank_of(Lower *L, NodeId x) { return L->g->nodes[x].shape.rank; }

/* An axis argument (number, or none = all axes) as a bitmask over rank r. */
static bool axes_arg(Lower *L, const BoundArgs *a, int i, int r, const char *fn, uint64_t *mask)
{
    Value v = a->v[i];
    if (v.kind == V_NONE) {
        *mask = r ? (UINT64_C(1) << r) - 1 : 0;
        return true;
    }
    *mask = 0;
    int n = v.kind == V_TUPLE ? v.count : 1;
    for (int k = 0; k < n; k++) {
        Value e = v.kind == V_TUPLE ? L->seq[v.idx + k] : v;
        int64_t ax;
        if (!value_int(L, e, a->at[i], fn, &ax)) return false;
        int norm = ir_b_axis(&L->b, fn, ax, r);
        if (norm < 0) {
            lower_builder_error(L, a->at[i]);
            return false;
        }
        *mask |= UINT64_C(1) << norm;
    }
    return true;
}

static bool int_arg(Lower *L, const BoundArgs *a, int i, const char *fn, int64_t *out)
{
    return value_int(L, a->v[i], a->at[i], fn, out);
}

/* An axis argument for a tensor of rank r, normalised (negative counts from the end);
 * checked as int64 so that 2^32 + 1 is an error, not axis 1. */
static bool axis_arg(Lower *L, const BoundArgs *a, int i, const char *fn, int rank, int *out)
{
    int64_t v;
    if (!int_arg(L, a, i, fn, &v)) return false;
    int ax = ir_b_axis(&L->b, fn, v, rank);
    if (ax < 0) {
        lower_builder_error(L, a->at[i]);
        return false;
    }
    *out = ax;
    return true;
}

/* ---- elementwise ---- */

static const struct {
    const char *name;
    Op op;
    double (*num)(double);
} unary_fns[] = {
    {"exp", OP_EXP, exp}, {"log", OP_LOG, log}, {"sqrt", OP_SQRT, sqrt}, {"tanh", OP_TANH, tanh},
    {"abs", OP_ABS, fabs}, {"sigmoid", OP_SIGMOID, NULL}, {"relu", OP_RELU, NULL},
    {"erf", OP_ERF, erf}, {"sin", OP_SIN, sin}, {"cos", OP_COS, cos},
};

static Value fn_unary(Lower *L, const BoundArgs *a, AstId call, int v)
{
    Value x = a->v[0];
    if (x.kind == V_NUM && unary_fns[v].num) {
        double r = unary_fns[v].num(x.num);
        if (!isfinite(r) && isfinite(x.num)) {
            lower_error(L, call, "%s(%g) is not a finite number", unary_fns[v].name, x.num);
            return value_error();
        }
        return value_num(r, false);
    }
    if (x.kind == V_NUM) {
        double r = v == 5 ? 1 / (1 + exp(-x.num)) : (x.num > 0 ? x.num : 0);
        return value_num(r, false);
    }
    NodeId t = tensor(L, a, 0, unary_fns[v].name);
    if (t == IR_NONE) return value_error();
    return done(L, ir_b_unary(&L->b, unary_fns[v].op, t), call);
}

static Value fn_gelu(Lower *L, const BoundArgs *a, AstId call, int v)
{
    /* PyTorch's default is the exact (erf) form; approximate = "tanh" is GPT-2's. */
    bool tanh_form = false;
    Value ap = a->v[1];
    if (ap.kind == V_STR && !strcmp(ap.str, "tanh")) tanh_form = true;
    else if (ap.kind != V_NONE && !(ap.kind == V_STR && !strcmp(ap.str, "none"))) {
        lower_error(L, a->at[1], "gelu: approximate must be \"none\" (the exact erf form, the default) or \"tanh\"");
        return value_error();
    }
    NodeId t = tensor(L, a, 0, "gelu");
    return t == IR_NONE ? value_error() : done(L, comp_activation(&L->b, tanh_form ? ACT_GELU_TANH : ACT_GELU, t, 0, 0), call);
}

/* silu, leaky_relu, elu, softplus, mish, hardswish, hardsigmoid (activations.c) */
static Value fn_act(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {[ACT_SILU] = "silu", [ACT_LEAKY_RELU] = "leaky_relu", [ACT_ELU] = "elu",
                                  [ACT_SOFTPLUS] = "softplus", [ACT_MISH] = "mish", [ACT_HARDSWISH] = "hardswish",
                                  [ACT_HARDSIGMOID] = "hardsigmoid"};
    NodeId x = tensor(L, a, 0, names[v]);
    if (x == IR_NONE) return value_error();
    double p[2] = {0, 0};
    for (int i = 1; i < a->n && i < 3; i++)
        if (!value_number(L, a->v[i], a->at[i], names[v], &p[i - 1])) return value_error();
    if (v == ACT_SOFTPLUS && !(p[0] != 0 && isfinite(p[0]))) {
        lower_error(L, a->at[1], "softplus: beta must be a finite number other than 0, found %g", p[0]);
        return value_error();
    }
    return done(L, comp_activation(&L->b, (ActKind)v, x, p[0], p[1]), call);
}

static Value fn_binary(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const Op ops[] = {OP_MAX, OP_MIN, OP_POW};
    static const char *names[] = {"maximum", "minimum", "pow"};
    if (value_is_scalar_number(a->v[0]) && value_is_scalar_number(a->v[1])) {
        double x = a->v[0].num, y = a->v[1].num;
        return value_num(v == 0 ? fmax(x, y) : v == 1 ? fmin(x, y) : pow(x, y), a->v[0].is_int && a->v[1].is_int && v < 2);
    }
    NodeId x = tensor(L, a, 0, names[v]), y = tensor(L, a, 1, names[v]);
    if (x == IR_NONE || y == IR_NONE) return value_error();
    return done(L, ir_b_binary(&L->b, ops[v], x, y), call);
}

static Value fn_clamp(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "clamp");
    if (x == IR_NONE) return value_error();
    if (a->v[1].kind == V_NONE && a->v[2].kind == V_NONE) {
        lower_error(L, call, "clamp: give min, max or both (without either it would do nothing)");
        return value_error();
    }
    if (a->v[1].kind != V_NONE) {
        double lo;
        if (!value_number(L, a->v[1], a->at[1], "clamp(min)", &lo)) return value_error();
        x = comp_scalar_op(&L->b, OP_MAX, x, lo, false);
        if (x == IR_NONE) return lower_builder_error(L, call);
    }
    if (a->v[2].kind != V_NONE) {
        double hi;
        if (!value_number(L, a->v[2], a->at[2], "clamp(max)", &hi)) return value_error();
        x = comp_scalar_op(&L->b, OP_MIN, x, hi, false);
    }
    return done(L, x, call);
}

static Value fn_where(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId c = tensor(L, a, 0, "where");
    if (c == IR_NONE) return value_error();
    DType like = DT_F32;
    for (int i = 1; i < 3; i++)
        if (a->v[i].kind == V_TENSOR) like = (DType)L->g->nodes[a->v[i].node].dtype;
    NodeId x = lower_as_tensor(L, a->v[1], like), y = lower_as_tensor(L, a->v[2], like);
    if (x == IR_NONE || y == IR_NONE) {
        lower_error(L, call, "where: the branches must be tensors or numbers");
        return value_error();
    }
    return done(L, ir_b_where(&L->b, c, x, y), call);
}

static Value fn_detach(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "detach");
    return x == IR_NONE ? value_error() : done(L, ir_b_unary(&L->b, OP_DETACH, x), call);
}

static Value fn_cast(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, ir_dtype_name((DType)v));
    return x == IR_NONE ? value_error() : done(L, ir_b_cast(&L->b, x, (DType)v), call);
}

/* ---- softmax family and losses ---- */

static Value fn_softmax(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"softmax", "log_softmax", "logsumexp"};
    NodeId x = tensor(L, a, 0, names[v]);
    int axis;
    if (x == IR_NONE || !axis_arg(L, a, 1, names[v], rank_of(L, x), &axis)) return value_error();
    if (v == 0) return done(L, comp_softmax(&L->b, x, axis), call);
    if (v == 1) return done(L, comp_log_softmax(&L->b, x, axis), call);
    bool keep;
    if (!value_bool(L, a->v[2], a->at[2], "logsumexp(keepdim)", &keep)) return value_error();
    return done(L, comp_logsumexp(&L->b, x, axis, keep), call);
}

/* reduction = "mean" | "sum" | "none" (PyTorch's) */
static bool reduction_arg(Lower *L, const BoundArgs *a, int i, const char *fn, LossReduction *r)
{
    Value v = a->v[i];
    if (!a->given[i]) *r = LOSS_MEAN; /* the signature's "none" only stands for not written */
    else if (v.kind == V_STR && !strcmp(v.str, "mean")) *r = LOSS_MEAN;
    else if (v.kind == V_STR && !strcmp(v.str, "sum")) *r = LOSS_SUM;
    else if (v.kind == V_STR && !strcmp(v.str, "none")) *r = LOSS_NONE;
    else {
        lower_error(L, a->at[i], "%s: reduction must be \"mean\" (the default), \"sum\" or \"none\" (strings, as in PyTorch)", fn);
        return false;
    }
    return true;
}

/* True when target shape t is input shape x without its axis k. */
static bool shape_without_axis(const Shape *x, const Shape *t, int k)
{
    if (t->rank != x->rank - 1) return false;
    for (int i = 0, j = 0; i < x->rank; i++) {
        if (i == k) continue;
        if (!ir_dim_eq(x->d[i], t->d[j++])) return false;
    }
    return true;
}

/* The class axis of cross_entropy's or nll_loss's input x (its argument axis, at index ai):
 * written, or else found from the target's shape: PyTorch's axis 1 of [N, C, d1, ...] with
 * targets [N, d1, ...], or the last axis of [..., C] with targets [...] (the two agree for
 * [N, C]); when a target fits both, the axis must be written. -1 after an error. */
static int class_axis(Lower *L, const BoundArgs *a, int ai, NodeId x, NodeId y, const char *name, AstId call)
{
    Shape xs = L->g->nodes[x].shape, ts = L->g->nodes[y].shape;
    int last = xs.rank - 1;
    if (a->v[ai].kind != V_NONE) {
        int ax;
        if (!axis_arg(L, a, ai, name, xs.rank, &ax)) return -1;
        if (ir_dtype_is_int((DType)L->g->nodes[y].dtype) && !shape_without_axis(&xs, &ts, ax)) {
            StrBuf t, s;
            sb_init(&t);
            sb_init(&s);
            ir_shape_format(&t, L->g, &ts);
            ir_shape_format(&s, L->g, &xs);
            lower_error(L, a->at[ai], "%s: target shape %s must equal the input shape %s without its class axis %d", name, t.data,
                        s.data, ax);
            sb_free(&t);
            sb_free(&s);
            return -1;
        }
        return ax;
    }
    if (xs.rank < 3 || ts.rank != xs.rank - 1 || !ir_dtype_is_int((DType)L->g->nodes[y].dtype)) return last;
    bool one = shape_without_axis(&xs, &ts, 1), end = shape_without_axis(&xs, &ts, last);
    if (one != end) return one ? 1 : last;
    StrBuf t, s; /* both forms fit, or neither: say which shapes */
    sb_init(&t);
    sb_init(&s);
    ir_shape_format(&t, L->g, &ts);
    ir_shape_format(&s, L->g, &xs);
    if (one)
        lower_error(L, call,
                    "%s: target shape %s fits the input shape %s with the classes on axis 1 (PyTorch's [N, C, d1, ...]) and on the "
                    "last axis: write axis = 1 or axis = -1",
                    name, t.data, s.data);
    else
        lower_error(L, call,
                    "%s: target shape %s must equal the input shape %s without its class axis: axis 1 (PyTorch's [N, C, d1, ...] "
                    "with targets [N, d1, ...]) or the last",
                    name, t.data, s.data);
    sb_free(&t);
    sb_free(&s);
    return -1;
}

/* x with axis moved last (the other axes in order) */
static NodeId axis_last(Lower *L, NodeId x, int axis)
{
    int rank = L->g->nodes[x].shape.rank;
    if (axis == rank - 1) return x;
    int perm[IR_MAX_RANK];
    for (int i = 0, j = 0; i < rank; i++)
        if (i != axis) perm[j++] = i;
    perm[rank - 1] = axis;
    return ir_b_permute(&L->b, x, perm);
}

/* cross_entropy(input, probabilities): a float target of the input's shape holds class
 * probabilities (PyTorch >= 1.10). The classes are on axis 1 as PyTorch's (axis 0 of a
 * single sample [C]); with three axes or more the last would fit as well (Kiln's [B, T, V]),
 * so the call must say which with `axis`. ignore_index has no meaning here (PyTorch
 * refuses it too). */
static Value cross_entropy_probs(Lower *L, const BoundArgs *a, AstId call, NodeId x, NodeId y)
{
    Shape xs = L->g->nodes[x].shape, ts = L->g->nodes[y].shape;
    bool same = xs.rank == ts.rank && xs.rank >= 1;
    for (int i = 0; same && i < xs.rank; i++) same = ir_dim_eq(xs.d[i], ts.d[i]);
    if (!same) {
        StrBuf t, sx;
        sb_init(&t);
        sb_init(&sx);
        ir_shape_format(&t, L->g, &ts);
        ir_shape_format(&sx, L->g, &xs);
        lower_error(L, a->at[1],
                    "cross_entropy: a float target (%s) holds class probabilities and must have the input's shape %s, found %s "
                    "(class indices are integers)",
                    ir_dtype_name((DType)L->g->nodes[y].dtype), sx.data, t.data);
        sb_free(&t);
        sb_free(&sx);
        return value_error();
    }
    if (a->v[2].kind != V_NONE) {
        lower_error(L, a->at[2], "cross_entropy: ignore_index does not apply to class probabilities (a float target), as in PyTorch");
        return value_error();
    }
    int axis;
    if (a->v[6].kind != V_NONE) {
        if (!axis_arg(L, a, 6, "cross_entropy", xs.rank, &axis)) return value_error();
    } else if (xs.rank <= 2) axis = xs.rank - 1;
    else {
        lower_error(L, call,
                    "cross_entropy: class probabilities of %d axes may have their classes on axis 1 (PyTorch's [N, C, d1, ...]) "
                    "or the last: write axis = 1 or axis = -1",
                    xs.rank);
        return value_error();
    }
    LossReduction r;
    double smoothing = 0;
    if (!reduction_arg(L, a, 3, "cross_entropy", &r) ||
        !value_number(L, a->v[4], a->at[4], "cross_entropy(label_smoothing)", &smoothing))
        return value_error();
    if (!(smoothing >= 0 && smoothing <= 1)) {
        lower_error(L, a->at[4], "cross_entropy: label_smoothing must be between 0 and 1, found %g", smoothing);
        return value_error();
    }
    NodeId w = a->v[5].kind == V_NONE ? IR_NONE : tensor(L, a, 5, "cross_entropy");
    if (a->v[5].kind != V_NONE && w == IR_NONE) return value_error();
    x = axis_last(L, x, axis);
    y = x == IR_NONE ? IR_NONE : axis_last(L, y, axis);
    if (y == IR_NONE) return lower_builder_error(L, call);
    return done(L, comp_cross_entropy_probs(&L->b, x, y, w, smoothing, r), call);
}

/* cross_entropy (0) and nll_loss (1): ignore_index (none: every target counts; PyTorch's
 * default is -100), label_smoothing (cross_entropy), reduction, weight, and the class axis
 * (class_axis: PyTorch's axis 1 or the last), moved last; mse (2) as before */
static Value fn_loss(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"cross_entropy", "nll_loss", "mse"};
    const char *name = names[v];
    NodeId x = tensor(L, a, 0, name), y = tensor(L, a, 1, name);
    if (x == IR_NONE || y == IR_NONE) return value_error();
    if (v == 2) return done(L, comp_mse(&L->b, x, y), call);
    if (v == 0 && ir_dtype_is_float((DType)L->g->nodes[y].dtype)) return cross_entropy_probs(L, a, call, x, y);
    int axis = class_axis(L, a, v == 0 ? 6 : 5, x, y, name, call);
    if (axis < 0) return value_error();
    x = axis_last(L, x, axis);
    if (x == IR_NONE) return lower_builder_error(L, call);
    LossReduction r;
    if (!reduction_arg(L, a, 3, name, &r)) return value_error();
    int64_t ignore = 0;
    bool has_ignore = a->v[2].kind != V_NONE;
    if (has_ignore && !int_arg(L, a, 2, name, &ignore)) return value_error();
    double smoothing = 0;
    if (v == 0 && !value_number(L, a->v[4], a->at[4], "cross_entropy(label_smoothing)", &smoothing)) return value_error();
    if (!(smoothing >= 0 && smoothing <= 1)) {
        lower_error(L, a->at[4], "cross_entropy: label_smoothing must be between 0 and 1, found %g", smoothing);
        return value_error();
    }
    int wi = v == 0 ? 5 : 4;
    NodeId w = a->v[wi].kind == V_NONE ? IR_NONE : tensor(L, a, wi, name);
    if (a->v[wi].kind != V_NONE && w == IR_NONE) return value_error();
    if (v == 0 && !has_ignore && smoothing == 0 && r == LOSS_MEAN && w == IR_NONE) return done(L, comp_cross_entropy(&L->b, x, y), call);
    if (v == 0) {
        if (!ir_dtype_is_int((DType)L->g->nodes[y].dtype)) /* the message names cross_entropy */
            return done(L, comp_cross_entropy(&L->b, x, y), call);
        x = comp_log_softmax(&L->b, x, -1);
        if (x == IR_NONE) return lower_builder_error(L, call);
    }
    return done(L, comp_nll(&L->b, x, y, w, has_ignore, ignore, smoothing, r, name), call);
}

static Value fn_kl_div(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "kl_div"), t = tensor(L, a, 1, "kl_div");
    bool logt;
    if (x == IR_NONE || t == IR_NONE || !value_bool(L, a->v[3], a->at[3], "kl_div(log_target)", &logt)) return value_error();
    LossReduction r = LOSS_MEAN;
    bool batchmean = a->given[2] && a->v[2].kind == V_STR && !strcmp(a->v[2].str, "batchmean");
    if (!batchmean && !reduction_arg(L, a, 2, "kl_div", &r)) return value_error();
    return done(L, comp_kl_div(&L->b, x, t, logt, r, batchmean), call);
}

/* l1_loss (0), smooth_l1_loss (1, beta), huber_loss (2, delta) */
static Value fn_regression_loss(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"l1_loss", "smooth_l1_loss", "huber_loss"};
    NodeId x = tensor(L, a, 0, names[v]), y = tensor(L, a, 1, names[v]);
    LossReduction r;
    if (x == IR_NONE || y == IR_NONE || !reduction_arg(L, a, 2, names[v], &r)) return value_error();
    double beta = 0;
    if (v && !value_number(L, a->v[3], a->at[3], names[v], &beta)) return value_error();
    if (v && !(beta >= 0 && (v == 1 || beta > 0) && isfinite(beta))) {
        lower_error(L, a->at[3], "%s: %s must be %s, found %g", names[v], v == 1 ? "beta" : "delta", v == 1 ? "at least 0" : "positive", beta);
        return value_error();
    }
    return done(L, comp_regression_loss(&L->b, v, x, y, beta, r), call);
}

static Value fn_bce_logits(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const char *fn = "binary_cross_entropy_with_logits";
    NodeId x = tensor(L, a, 0, fn), y = tensor(L, a, 1, fn);
    NodeId w = a->v[2].kind == V_NONE ? IR_NONE : tensor(L, a, 2, fn);
    NodeId pw = a->v[3].kind == V_NONE ? IR_NONE : tensor(L, a, 3, fn);
    LossReduction r;
    if (x == IR_NONE || y == IR_NONE || (a->v[2].kind != V_NONE && w == IR_NONE) || (a->v[3].kind != V_NONE && pw == IR_NONE) ||
        !reduction_arg(L, a, 4, fn, &r))
        return value_error();
    return done(L, comp_bce_logits(&L->b, x, y, w, pw, r), call);
}

static Value fn_dropout(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "dropout");
    double p;
    if (x == IR_NONE || !value_number(L, a->v[1], a->at[1], "dropout(p)", &p)) return value_error();
    if (!(p >= 0 && p <= 1)) {
        lower_error(L, a->at[1], "dropout: p must be between 0 and 1, found %g", p);
        return value_error();
    }
    return done(L, comp_dropout(&L->b, x, p, L->g->mode == MODE_TRAIN), call);
}

static Value fn_one_hot(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "one_hot");
    int64_t n;
    if (x == IR_NONE || !int_arg(L, a, 1, "one_hot", &n)) return value_error();
    if (n < 1 || n > IR_MAX_DIM) {
        lower_error(L, a->at[1], "one_hot: num_classes must be between 1 and 2^32, found %lld", (long long)n);
        return value_error();
    }
    Shape s = L->g->nodes[x].shape;
    if (s.rank >= IR_MAX_RANK) {
        lower_error(L, call, "one_hot: rank exceeds %d", IR_MAX_RANK);
        return value_error();
    }
    int64_t count = ir_shape_max_numel(L->g, &s);
    if (count < 0 || count > IR_MAX_ELEMENTS / n) {
        StrBuf t;
        sb_init(&t);
        Shape r = s;
        r.d[r.rank++] = ir_dim_const(n);
        ir_shape_format(&t, L->g, &r);
        lower_error(L, call, "one_hot: the result %s has too many elements (the limit is 2^40)", t.data);
        sb_free(&t);
        return value_error();
    }
    Shape s1 = s;
    s1.d[s1.rank++] = ir_dim_const(1);
    s.d[s.rank++] = ir_dim_const(n);
    /* PyTorch raises for a class out of range; an all-zero row would be a silent error */
    x = ir_b_check_index(&L->b, x, n, "one_hot");
    if (x == IR_NONE) return lower_builder_error(L, call);
    NodeId xi = ir_b_reshape(&L->b, x, &s1);
    NodeId cls = ir_b_iota(&L->b, &s, s.rank - 1, (DType)L->g->nodes[x].dtype);
    if (xi == IR_NONE || cls == IR_NONE) return lower_builder_error(L, call);
    NodeId eq = ir_b_binary(&L->b, OP_EQ, cls, xi);
    return eq == IR_NONE ? lower_builder_error(L, call) : done(L, ir_b_cast(&L->b, eq, DT_F32), call);
}

/* ---- reductions ---- */

static Value fn_reduce(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"sum", "mean", "max", "min", "var", "std", "amax", "amin"};
    NodeId x = tensor(L, a, 0, names[v]);
    uint64_t axes;
    bool keep;
    if (x == IR_NONE || !axes_arg(L, a, 1, rank_of(L, x), names[v], &axes) ||
        !value_bool(L, a->v[2], a->at[2], "keepdim", &keep))
        return value_error();
    IrBuilder *b = &L->b;
    switch (v) {
    case 0: return done(L, ir_b_reduce(b, OP_REDUCE_SUM, x, axes, keep), call);
    case 1: return done(L, comp_mean(b, x, axes, keep), call);
    case 2: case 3: case 6: case 7: {
        /* As PyTorch: max(x, dim) and min(x, dim) send the gradient to the first extreme
         * element; amax, amin and a whole-tensor max() or min() split it among ties.
         * min(x) = -max(-x) keeps the primitive set small. */
        bool first = v < 6 && a->v[1].kind != V_NONE, is_min = v == 3 || v == 7;
        NodeId n = is_min ? ir_b_unary(b, OP_NEG, x) : x;
        NodeId m = n == IR_NONE ? IR_NONE : first ? ir_b_reduce_max_first(b, n, axes, keep) : ir_b_reduce(b, OP_REDUCE_MAX, n, axes, keep);
        return done(L, m == IR_NONE || !is_min ? m : ir_b_unary(b, OP_NEG, m), call);
    }
    default: {
        bool unbiased;
        if (!value_bool(L, a->v[3], a->at[3], v == 4 ? "var(unbiased)" : "std(unbiased)", &unbiased)) return value_error();
        NodeId r = comp_var(b, x, axes, keep, unbiased);
        return done(L, v == 4 || r == IR_NONE ? r : ir_b_unary(b, OP_SQRT, r), call);
    }
    }
}

static Value fn_argmax(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "argmax");
    int axis;
    bool keep;
    if (x == IR_NONE || !axis_arg(L, a, 1, "argmax", rank_of(L, x), &axis) || !value_bool(L, a->v[2], a->at[2], "keepdim", &keep))
        return value_error();
    return done(L, ir_b_argmax(&L->b, x, axis, keep), call);
}

/* ---- shapes ---- */

/* Collects dims from values (numbers, symbolic sizes, or one list of them); -1 marks the
 * inferred one when allowed, and is reported otherwise. */
static bool dims_from(Lower *L, const Value *vals, int nv, const AstId *ats, int nats, const char *fn, bool allow_infer, Dim *dims,
                      int *n, int *infer)
{
    AstId at0 = nats > 0 ? ats[0] : AST_NONE;
    if (nv == 1 && vals[0].kind == V_TUPLE) {
        nv = vals[0].count;
        vals = &L->seq[vals[0].idx];
        nats = 1;
    }
    if (nv > IR_MAX_RANK) {
        lower_error(L, at0, "%s: rank %d exceeds the maximum of %d", fn, nv, IR_MAX_RANK);
        return false;
    }
    *infer = -1;
    for (int i = 0; i < nv; i++) {
        AstId at = ats[i < nats ? i : 0];
        if (vals[i].kind == V_DIM) {
            dims[i] = vals[i].dim;
            continue;
        }
        int64_t d;
        if (!value_int(L, vals[i], at, fn, &d)) return false;
        if (d == -1 && allow_infer) {
            if (*infer >= 0) {
                lower_error(L, at, "%s: only one dimension can be -1", fn);
                return false;
            }
            *infer = i;
            dims[i] = ir_dim_const(1);
            continue;
        }
        if (d < 0 || d > IR_MAX_DIM) {
            lower_error(L, at, "%s: dimension %lld is out of range", fn, (long long)d);
            return false;
        }
        dims[i] = ir_dim_const(d);
    }
    *n = nv;
    return true;
}

/* Dims from rest arguments or a single list argument; -1 marks the inferred one. */
static bool dims_arg(Lower *L, const BoundArgs *a, const char *fn, Dim *dims, int *n, int *infer)
{
    return dims_from(L, a->rest, a->nrest, a->rest_at, a->nrest, fn, true, dims, n, infer);
}

static Value fn_reshape(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "reshape");
    if (x == IR_NONE) return value_error();
    Dim dims[IR_MAX_RANK];
    int n, infer;
    if (!dims_arg(L, a, "reshape", dims, &n, &infer)) return value_error();
    Shape s = ir_shape_make(n, dims);
    if (infer >= 0) {
        Dim total, known;
        if (!ir_shape_numel(&L->g->nodes[x].shape, &total) || !ir_shape_numel(&s, &known) || !ir_dim_div(total, known, &s.d[infer])) {
            StrBuf t;
            sb_init(&t);
            ir_shape_format(&t, L->g, &L->g->nodes[x].shape);
            lower_error(L, call, "reshape: cannot infer the -1 dimension: %s does not divide evenly", t.data);
            sb_free(&t);
            return value_error();
        }
    }
    return done(L, ir_b_reshape(&L->b, x, &s), call);
}

static Value fn_flatten(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "flatten");
    int64_t s0, e0;
    if (x == IR_NONE || !int_arg(L, a, 1, "flatten", &s0) || !int_arg(L, a, 2, "flatten", &e0)) return value_error();
    const Shape *xs = &L->g->nodes[x].shape;
    int st = ir_b_axis(&L->b, "flatten", s0, xs->rank), en = ir_b_axis(&L->b, "flatten", e0, xs->rank);
    if (st < 0 || en < 0) return lower_builder_error(L, call);
    if (en < st) {
        lower_error(L, call, "flatten: start axis %d is after end axis %d", st, en);
        return value_error();
    }
    Shape s = ir_shape_make(0, NULL);
    for (int i = 0; i < st; i++) s.d[s.rank++] = xs->d[i];
    Dim p = ir_dim_const(1);
    for (int i = st; i <= en; i++)
        if (!ir_dim_mul(p, xs->d[i], &p)) {
            lower_error(L, call, "flatten: too many symbolic sizes in one dimension");
            return value_error();
        }
    s.d[s.rank++] = p;
    for (int i = en + 1; i < xs->rank; i++) s.d[s.rank++] = xs->d[i];
    return done(L, ir_b_reshape(&L->b, x, &s), call);
}

static Value fn_transpose(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "transpose");
    int a0, a1;
    if (x == IR_NONE || !axis_arg(L, a, 1, "transpose", rank_of(L, x), &a0) ||
        !axis_arg(L, a, 2, "transpose", rank_of(L, x), &a1))
        return value_error();
    return done(L, ir_b_transpose(&L->b, x, a0, a1), call);
}

static Value fn_permute(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "permute");
    if (x == IR_NONE) return value_error();
    Dim dims[IR_MAX_RANK];
    int n, infer;
    if (!dims_arg(L, a, "permute", dims, &n, &infer)) return value_error();
    int r = rank_of(L, x);
    if (n != r || infer >= 0) {
        lower_error(L, call, "permute: expected %d ax%s for a tensor of rank %d, found %d", r, r == 1 ? "is" : "es", r, n);
        return value_error();
    }
    int perm[IR_MAX_RANK];
    for (int i = 0; i < n; i++) perm[i] = (int)dims[i].k;
    return done(L, ir_b_permute(&L->b, x, perm), call);
}

static Value fn_unsqueeze(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, v ? "squeeze" : "unsqueeze");
    if (x == IR_NONE) return value_error();
    const Shape *xs = &L->g->nodes[x].shape;
    Shape s = ir_shape_make(0, NULL);
    if (!v) {
        int64_t ax;
        if (!int_arg(L, a, 1, "unsqueeze", &ax)) return value_error();
        int norm = ir_b_axis(&L->b, "unsqueeze", ax, xs->rank + 1);
        if (norm < 0) return lower_builder_error(L, a->at[1]);
        if (xs->rank >= IR_MAX_RANK) {
            lower_error(L, call, "unsqueeze: rank exceeds %d", IR_MAX_RANK);
            return value_error();
        }
        for (int i = 0; i <= xs->rank; i++) s.d[s.rank++] = i == norm ? ir_dim_const(1) : xs->d[i < norm ? i : i - 1];
    } else {
        uint64_t axes;
        if (!axes_arg(L, a, 1, xs->rank, "squeeze", &axes)) return value_error();
        for (int i = 0; i < xs->rank; i++) {
            bool one = ir_dim_is_const(xs->d[i]) && xs->d[i].k == 1;
            if ((axes >> i & 1) && one) continue;
            if ((axes >> i & 1) && a->v[1].kind != V_NONE) {
                lower_error(L, a->at[1], "squeeze: axis %d has size other than 1", i);
                return value_error();
            }
            s.d[s.rank++] = xs->d[i];
        }
    }
    return done(L, ir_b_reshape(&L->b, x, &s), call);
}

static Value make_tuple(Lower *L, const NodeId *parts, int n)
{
    Value t = {.kind = V_TUPLE, .node = IR_NONE, .idx = L->nseq, .count = n};
    for (int i = 0; i < n; i++) {
        GROW(L->seq, L->seq_cap, L->nseq + 1);
        L->seq[L->nseq++] = value_tensor(parts[i]);
    }
    return t;
}

static Value fn_split(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const char *fn = v ? "chunk" : "split";
    NodeId x = tensor(L, a, 0, fn);
    int64_t axis;
    if (x == IR_NONE || !int_arg(L, a, 2, fn, &axis)) return value_error();
    const Shape *xs = &L->g->nodes[x].shape;
    int ax = ir_b_axis(&L->b, fn, axis, xs->rank);
    if (ax < 0) return lower_builder_error(L, a->at[2]);
    Dim d = xs->d[ax];
    if (!ir_dim_is_const(d)) {
        lower_error(L, call, "%s: axis %d has a symbolic size; split along a fixed-size axis", fn, ax);
        return value_error();
    }
    int64_t sizes[64];
    int n = 0;
    Value sv = a->v[1];
    if (sv.kind == V_TUPLE) {
        int64_t total = 0;
        for (int i = 0; i < sv.count && i < 64; i++) {
            if (!value_int(L, L->seq[sv.idx + i], a->at[1], fn, &sizes[n])) return value_error();
            if (sizes[n] < 0) {
                lower_error(L, a->at[1], "%s: negative size", fn);
                return value_error();
            }
            total += sizes[n++];
        }
        if (total != d.k) {
            lower_error(L, a->at[1], "%s: sizes add up to %lld but axis %d has size %lld", fn, (long long)total, ax, (long long)d.k);
            return value_error();
        }
    } else {
        int64_t k;
        if (!int_arg(L, a, 1, fn, &k)) return value_error();
        if (k < 1) {
            lower_error(L, a->at[1], "%s: expected a positive number, found %lld", fn, (long long)k);
            return value_error();
        }
        /* split(x, size) as torch.split: pieces of `size`; chunk(x, n): n pieces. */
        int64_t size = v ? (d.k + k - 1) / k : k;
        if (size < 1) size = 1;
        if ((d.k + size - 1) / size > 64) {
            lower_error(L, a->at[1], "%s: more than 64 pieces", fn);
            return value_error();
        }
        for (int64_t s = 0; s < d.k; s += size) sizes[n++] = s + size <= d.k ? size : d.k - s;
    }
    NodeId parts[64];
    int64_t start = 0;
    for (int i = 0; i < n; i++) {
        parts[i] = ir_b_slice(&L->b, x, ax, start, start + sizes[i], 1);
        if (parts[i] == IR_NONE) return lower_builder_error(L, call);
        start += sizes[i];
    }
    return make_tuple(L, parts, n);
}

static Value fn_concat(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const Value *vals = a->rest;
    int n = a->nrest;
    if (n == 1 && vals[0].kind == V_TUPLE) {
        n = vals[0].count;
        vals = &L->seq[vals[0].idx];
    }
    NodeId xs[64];
    if (n < 1 || n > 64) {
        lower_error(L, call, "concat: expected between 1 and 64 tensors, found %d", n);
        return value_error();
    }
    for (int i = 0; i < n; i++) {
        xs[i] = lower_tensor_arg(L, vals[i], call, "concat");
        if (xs[i] == IR_NONE) return value_error();
    }
    int axis;
    if (!axis_arg(L, a, 1, "concat", rank_of(L, xs[0]), &axis)) return value_error(); /* slot 0 is *xs */
    return done(L, ir_b_concat(&L->b, xs, n, axis), call);
}

static Value fn_slice(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "slice");
    int axis;
    int64_t start, end = IR_SLICE_END, step;
    if (x == IR_NONE || !axis_arg(L, a, 1, "slice", rank_of(L, x), &axis) || !int_arg(L, a, 2, "slice", &start) ||
        !int_arg(L, a, 4, "slice", &step))
        return value_error();
    if (a->v[3].kind != V_NONE && !int_arg(L, a, 3, "slice", &end)) return value_error();
    return done(L, ir_b_slice(&L->b, x, axis, start, end, step), call);
}

static Value fn_arange(Lower *L, const BoundArgs *a, AstId call, int v)
{
    Dim d;
    if (a->v[0].kind == V_DIM) d = a->v[0].dim;
    else {
        int64_t n;
        if (!int_arg(L, a, 0, "arange", &n)) return value_error();
        if (n < 0 || n > IR_MAX_DIM) {
            lower_error(L, a->at[0], "arange: length %lld is out of range", (long long)n);
            return value_error();
        }
        d = ir_dim_const(n);
    }
    Shape s = ir_shape_make(1, &d);
    /* the decode graph's positions continue after the cached ones (frontend/decode.c) */
    NodeId pos = L->g->mode == MODE_DECODE ? decode_positions(L, d) : IR_NONE;
    return done(L, pos != IR_NONE ? pos : ir_b_iota(&L->b, &s, 0, DT_I64), call);
}

static Value fn_matmul(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "matmul"), y = tensor(L, a, 1, "matmul");
    return x == IR_NONE || y == IR_NONE ? value_error() : done(L, ir_b_matmul(&L->b, x, y), call);
}

/* ---- creation, masks, shapes ---- */

/* zeros(*size), ones(*size), full(size, fill_value): f32 for zeros and ones; full takes its
 * dtype from the value (an integer gives i64, true/false bool), as torch.full does. */
static Value fn_fill(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"zeros", "ones", "full"};
    Dim dims[IR_MAX_RANK];
    int n, infer;
    bool ok = v < 2 ? dims_from(L, a->rest, a->nrest, a->rest_at, a->nrest, names[v], false, dims, &n, &infer)
                    : dims_from(L, &a->v[0], 1, &a->at[0], 1, names[v], false, dims, &n, &infer);
    if (!ok) return value_error();
    double val = v == 1 ? 1.0 : 0.0;
    DType t = DT_F32;
    if (v == 2) {
        if (a->v[1].kind == V_BOOL) t = DT_BOOL, val = a->v[1].num;
        else if (!value_number(L, a->v[1], a->at[1], "full(fill_value)", &val)) return value_error();
        else if (a->v[1].is_int) t = DT_I64;
    }
    Shape s = ir_shape_make(n, dims);
    return done(L, ir_b_full(&L->b, val, t, &s), call);
}

/* zeros_like(x), ones_like(x), full_like(x, fill_value): x's shape and dtype. */
static Value fn_fill_like(Lower *L, const BoundArgs *a, AstId call, int v)
{
    static const char *names[] = {"zeros_like", "ones_like", "full_like"};
    NodeId x = tensor(L, a, 0, names[v]);
    if (x == IR_NONE) return value_error();
    double val = v == 1 ? 1.0 : 0.0;
    if (v == 2 && !value_number(L, a->v[1], a->at[1], "full_like(fill_value)", &val)) return value_error();
    Shape s = L->g->nodes[x].shape;
    return done(L, ir_b_full(&L->b, val, (DType)L->g->nodes[x].dtype, &s), call);
}

static Value fn_tri(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, v ? "triu" : "tril");
    int64_t d;
    if (x == IR_NONE || !int_arg(L, a, 1, v ? "triu" : "tril", &d)) return value_error();
    return done(L, comp_tri(&L->b, x, d, v), call);
}

/* masked_fill(x, mask, value) = where(mask, value, x), value in x's dtype. */
static Value fn_masked_fill(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "masked_fill"), m = tensor(L, a, 1, "masked_fill");
    if (x == IR_NONE || m == IR_NONE) return value_error();
    if (L->g->nodes[m].dtype != DT_BOOL) {
        lower_error(L, a->at[1], "masked_fill: the mask must be bool (a comparison), found %s", ir_dtype_name((DType)L->g->nodes[m].dtype));
        return value_error();
    }
    DType t = (DType)L->g->nodes[x].dtype;
    NodeId val;
    if (a->v[2].kind == V_TENSOR) val = a->v[2].node;
    else {
        double f;
        if (!value_number(L, a->v[2], a->at[2], "masked_fill(value)", &f)) return value_error();
        val = ir_b_const(&L->b, f, t);
    }
    if (val == IR_NONE) return lower_builder_error(L, call);
    return done(L, ir_b_where(&L->b, m, val, x), call);
}

/* expand(x, *size) as Tensor.expand: -1 keeps a size; new axes go in front. */
static Value fn_expand(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "expand");
    if (x == IR_NONE) return value_error();
    const Value *vals = a->rest;
    int nv = a->nrest;
    if (nv == 1 && vals[0].kind == V_TUPLE) {
        nv = vals[0].count;
        vals = &L->seq[vals[0].idx];
    }
    Shape xs = L->g->nodes[x].shape;
    if (nv < xs.rank || nv > IR_MAX_RANK) {
        lower_error(L, call, "expand: expected between %d and %d sizes for a tensor of rank %d, found %d", xs.rank, IR_MAX_RANK,
                    xs.rank, nv);
        return value_error();
    }
    Shape s = ir_shape_make(nv, NULL), s1 = ir_shape_make(nv, NULL);
    for (int i = 0; i < nv; i++) {
        int xi = i - (nv - xs.rank);
        s1.d[i] = xi >= 0 ? xs.d[xi] : ir_dim_const(1);
        AstId at = a->nrest == nv ? a->rest_at[i] : call;
        if (vals[i].kind == V_DIM) {
            s.d[i] = vals[i].dim;
            continue;
        }
        int64_t d;
        if (!value_int(L, vals[i], at, "expand", &d)) return value_error();
        if (d == -1 && xi >= 0) s.d[i] = xs.d[xi];
        else if (d < 0 || d > IR_MAX_DIM) {
            lower_error(L, at, "expand: size %lld is out of range (-1 keeps an existing size, not a new one)", (long long)d);
            return value_error();
        } else s.d[i] = ir_dim_const(d);
    }
    NodeId r = nv == xs.rank ? x : ir_b_reshape(&L->b, x, &s1);
    return done(L, r == IR_NONE ? IR_NONE : ir_b_expand(&L->b, r, &s), call);
}

static Value fn_flip(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "flip");
    uint64_t axes;
    if (x == IR_NONE || !axes_arg(L, a, 1, rank_of(L, x), "flip", &axes)) return value_error();
    for (int i = 0; i < rank_of(L, x) && x != IR_NONE; i++)
        if (axes >> i & 1) x = comp_flip(&L->b, x, i);
    return done(L, x, call);
}

/* stack(xs, dim) = concat of the tensors each with a new axis dim. */
static Value fn_stack(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const Value *vals = a->rest;
    int n = a->nrest;
    if (n == 1 && vals[0].kind == V_TUPLE) {
        n = vals[0].count;
        vals = &L->seq[vals[0].idx];
    }
    NodeId xs[64];
    if (n < 1 || n > 64) {
        lower_error(L, call, "stack: expected between 1 and 64 tensors, found %d", n);
        return value_error();
    }
    for (int i = 0; i < n; i++) {
        xs[i] = lower_tensor_arg(L, vals[i], call, "stack");
        if (xs[i] == IR_NONE) return value_error();
    }
    Shape s0 = L->g->nodes[xs[0]].shape;
    if (s0.rank >= IR_MAX_RANK) {
        lower_error(L, call, "stack: rank exceeds %d", IR_MAX_RANK);
        return value_error();
    }
    int axis;
    if (!axis_arg(L, a, 1, "stack", s0.rank + 1, &axis)) return value_error();
    for (int i = 0; i < n; i++) {
        Shape si = L->g->nodes[xs[i]].shape;
        if (!ir_shape_eq(&si, &s0)) {
            StrBuf t;
            sb_init(&t);
            ir_shape_format(&t, L->g, &s0);
            sb_puts(&t, " and ");
            ir_shape_format(&t, L->g, &si);
            lower_error(L, call, "stack: the tensors must have the same shape, found %s", t.data);
            sb_free(&t);
            return value_error();
        }
        Shape u = ir_shape_make(0, NULL);
        for (int k = 0; k <= si.rank; k++) u.d[u.rank++] = k == axis ? ir_dim_const(1) : si.d[k < axis ? k : k - 1];
        xs[i] = ir_b_reshape(&L->b, xs[i], &u);
        if (xs[i] == IR_NONE) return lower_builder_error(L, call);
    }
    return done(L, ir_b_concat(&L->b, xs, n, axis), call);
}

/* ---- attention, cumsum, rotary, gather, functional layers ---- */

static Value fn_sdpa(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const char *fn = "scaled_dot_product_attention";
    NodeId q = tensor(L, a, 0, fn), k = tensor(L, a, 1, fn), val = tensor(L, a, 2, fn);
    if (q == IR_NONE || k == IR_NONE || val == IR_NONE) return value_error();
    NodeId mask = a->v[3].kind == V_NONE ? IR_NONE : tensor(L, a, 3, fn);
    double p, scale;
    bool causal;
    if ((a->v[3].kind != V_NONE && mask == IR_NONE) || !value_number(L, a->v[4], a->at[4], fn, &p) ||
        !value_bool(L, a->v[5], a->at[5], fn, &causal))
        return value_error();
    if (!(p >= 0 && p <= 1)) {
        lower_error(L, a->at[4], "%s: dropout_p must be between 0 and 1, found %g", fn, p);
        return value_error();
    }
    if (causal && mask != IR_NONE) {
        lower_error(L, a->at[5], "%s: give attn_mask or is_causal = true, not both (as PyTorch)", fn);
        return value_error();
    }
    const Shape *qs = &L->g->nodes[q].shape;
    if (qs->rank < 1 || !ir_dim_is_const(qs->d[qs->rank - 1])) {
        lower_error(L, a->at[0], "%s: the query's last axis (the embedding) must have a fixed size", fn);
        return value_error();
    }
    scale = 1.0 / sqrt((double)qs->d[qs->rank - 1].k);
    if (a->v[6].kind != V_NONE && !value_number(L, a->v[6], a->at[6], fn, &scale)) return value_error();
    NodeId y;
    if (L->g->mode == MODE_DECODE && causal && decode_sdpa(L, q, k, val, scale, &y)) /* frontend/decode.c: over the cache */
        return y == IR_NONE ? lower_builder_error(L, call) : done(L, y, call);
    return done(L, comp_attention(&L->b, q, k, val, mask, causal, scale, p, L->g->mode == MODE_TRAIN), call);
}

static Value fn_cumsum(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "cumsum");
    int axis;
    if (x == IR_NONE || !axis_arg(L, a, 1, "cumsum", rank_of(L, x), &axis)) return value_error();
    return done(L, comp_cumsum(&L->b, x, axis), call);
}

static Value fn_rotary(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "rotary");
    double base;
    if (x == IR_NONE || !value_number(L, a->v[1], a->at[1], "rotary(base)", &base)) return value_error();
    if (!(base > 1 && isfinite(base))) {
        lower_error(L, a->at[1], "rotary: base must be a number above 1, found %g", base);
        return value_error();
    }
    const Shape *xs = &L->g->nodes[x].shape;
    /* a decode graph's absolute positions P + arange(T) (frontend/decode.c) */
    const NodeId pos = L->g->mode == MODE_DECODE && xs->rank >= 2 ? decode_positions(L, xs->d[xs->rank - 2]) : IR_NONE;
    return done(L, comp_rotary(&L->b, x, base, pos), call);
}

/* torch.gather(x, dim, index): out[..., j, ...] = x[..., index[..., j, ...], ...] along dim,
 * the other sizes of index equal to x's; a one-hot product over that axis. */
static Value fn_gather(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "gather"), idx = tensor(L, a, 2, "gather");
    int axis;
    if (x == IR_NONE || idx == IR_NONE || !axis_arg(L, a, 1, "gather", rank_of(L, x), &axis)) return value_error();
    Shape xs = L->g->nodes[x].shape, is = L->g->nodes[idx].shape;
    bool ok = ir_dtype_is_int((DType)L->g->nodes[idx].dtype) && is.rank == xs.rank && xs.rank < IR_MAX_RANK && ir_dim_is_const(xs.d[axis]);
    for (int i = 0; ok && i < xs.rank; i++) ok = i == axis || ir_dim_eq(xs.d[i], is.d[i]);
    if (!ok) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        sb_puts(&t, " and index ");
        ir_shape_format(&t, L->g, &is);
        lower_error(L, call, "gather: expected an integer index of the input's rank and sizes except along dim (of fixed size), found %s",
                    t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    int last = xs.rank - 1;
    NodeId xt = axis == last ? x : ir_b_transpose(b, x, axis, last);
    NodeId it = axis == last ? idx : ir_b_transpose(b, idx, axis, last);
    if (xt == IR_NONE || it == IR_NONE) return lower_builder_error(L, call);
    it = ir_b_check_index(b, it, xs.d[axis].k, "gather index");
    if (it == IR_NONE) return lower_builder_error(L, call);
    Shape its = L->g->nodes[it].shape, xts = L->g->nodes[xt].shape;
    Shape hot = its, i1 = its, x1 = xts;
    hot.d[hot.rank++] = xs.d[axis];           /* [..., k, n] */
    i1.d[i1.rank++] = ir_dim_const(1);        /* [..., k, 1] */
    x1.d[x1.rank - 1] = ir_dim_const(1);      /* [..., 1, n] */
    x1.d[x1.rank++] = xs.d[axis];
    NodeId cls = ir_b_iota(b, &hot, hot.rank - 1, (DType)L->g->nodes[it].dtype);
    NodeId eq = cls == IR_NONE ? IR_NONE : ir_b_binary(b, OP_EQ, cls, ir_b_reshape(b, it, &i1));
    NodeId xf = ir_dtype_is_float((DType)L->g->nodes[xt].dtype) ? xt : ir_b_cast(b, xt, DT_F64);
    NodeId prod = eq == IR_NONE || xf == IR_NONE ? IR_NONE : ir_b_binary(b, OP_MUL, ir_b_reshape(b, xf, &x1), ir_b_cast(b, eq, (DType)L->g->nodes[xf].dtype));
    NodeId r = prod == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, prod, UINT64_C(1) << (hot.rank - 1), false);
    if (r != IR_NONE && xf != xt) r = ir_b_cast(b, r, (DType)L->g->nodes[xt].dtype);
    if (r != IR_NONE && axis != last) r = ir_b_transpose(b, r, axis, last);
    return done(L, r, call);
}

/* linear(x, weight, bias = none) as F.linear: weight [out, in] */
static Value fn_linear(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "linear"), w = tensor(L, a, 1, "linear");
    NodeId bias = a->v[2].kind == V_NONE ? IR_NONE : tensor(L, a, 2, "linear");
    if (x == IR_NONE || w == IR_NONE || (a->v[2].kind != V_NONE && bias == IR_NONE)) return value_error();
    if (L->g->nodes[w].shape.rank != 2) {
        lower_error(L, a->at[1], "linear: the weight must be [out_features, in_features]");
        return value_error();
    }
    return done(L, comp_linear(&L->b, x, w, bias), call);
}

/* layer_norm(x, normalized_shape, weight = none, bias = none, eps = 1e-5) as F.layer_norm:
 * over the trailing axes normalized_shape names (a size or a list of sizes) */
static Value fn_layer_norm(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "layer_norm");
    if (x == IR_NONE) return value_error();
    Dim dims[IR_MAX_RANK];
    int n, infer;
    double eps;
    if (!dims_from(L, &a->v[1], 1, &a->at[1], 1, "layer_norm(normalized_shape)", false, dims, &n, &infer) ||
        !value_number(L, a->v[4], a->at[4], "layer_norm(eps)", &eps))
        return value_error();
    Shape xs = L->g->nodes[x].shape;
    bool ok = n >= 1 && n <= xs.rank;
    for (int i = 0; ok && i < n; i++) ok = ir_dim_eq(xs.d[xs.rank - n + i], dims[i]);
    if (!ok) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, a->at[1], "layer_norm: normalized_shape must be the input's last sizes, found input %s", t.data);
        sb_free(&t);
        return value_error();
    }
    NodeId w = a->v[2].kind == V_NONE ? IR_NONE : tensor(L, a, 2, "layer_norm");
    NodeId bias = a->v[3].kind == V_NONE ? IR_NONE : tensor(L, a, 3, "layer_norm");
    if ((a->v[2].kind != V_NONE && w == IR_NONE) || (a->v[3].kind != V_NONE && bias == IR_NONE)) return value_error();
    return done(L, comp_layer_norm(&L->b, x, w, bias, n, eps), call);
}

/* A size per spatial axis: a number, or a list of two */
static bool pair_arg(Lower *L, const BoundArgs *a, int i, const char *fn, int64_t lo, int64_t hi, int out[2])
{
    Value v = a->v[i];
    for (int k = 0; k < 2; k++) {
        Value e = v.kind == V_TUPLE ? (v.count == 2 ? L->seq[v.idx + k] : value_error()) : v;
        int64_t n;
        if (e.kind == V_ERROR) {
            lower_error(L, a->at[i], "%s: expected a number or a list of two", fn);
            return false;
        }
        if (!value_int(L, e, a->at[i], fn, &n)) return false;
        if (n < lo || n > hi) {
            lower_error(L, a->at[i], "%s: sizes must be between %lld and %lld, found %lld", fn, (long long)lo, (long long)hi, (long long)n);
            return false;
        }
        out[k] = (int)n;
    }
    return true;
}

/* max_pool2d(x, kernel_size, stride = none, padding = 0, dilation = 1, ceil_mode = false) and
 * avg_pool2d(x, kernel_size, stride = none, padding = 0, ceil_mode = false,
 * count_include_pad = true) as F.max_pool2d and F.avg_pool2d */
static Value fn_pool(Lower *L, const BoundArgs *a, AstId call, int v)
{
    const char *fn = v ? "avg_pool2d" : "max_pool2d";
    NodeId x = tensor(L, a, 0, fn);
    int k[2], st[2], pad[2], dil[2] = {1, 1};
    bool ceil_mode, count_pad = true;
    if (x == IR_NONE || !pair_arg(L, a, 1, fn, 1, 1024, k) || !pair_arg(L, a, 3, fn, 0, 512, pad) ||
        !value_bool(L, a->v[v ? 4 : 5], a->at[v ? 4 : 5], fn, &ceil_mode) || (!v && !pair_arg(L, a, 4, fn, 1, 1024, dil)) ||
        (v && !value_bool(L, a->v[5], a->at[5], fn, &count_pad)))
        return value_error();
    if (a->v[2].kind == V_NONE) st[0] = k[0], st[1] = k[1];
    else if (!pair_arg(L, a, 2, fn, 1, 1024, st)) return value_error();
    bool plain = k[0] == k[1] && st[0] == st[1] && pad[0] == pad[1] && dil[0] == 1 && dil[1] == 1 && !ceil_mode && count_pad;
    if (plain) return done(L, comp_pool2d(&L->b, x, !v, k[0], st[0], pad[0]), call);
    return done(L, comp_pool2d_ex(&L->b, x, !v, k, st, pad, dil, ceil_mode, count_pad), call);
}

static Value fn_einsum(Lower *L, const BoundArgs *a, AstId call, int v)
{
    if (a->v[0].kind != V_STR) {
        lower_error(L, a->at[0], "einsum: the first argument is the equation, a string such as \"bij,bjk->bik\"");
        return value_error();
    }
    const Value *vals = a->rest;
    int n = a->nrest;
    if (n == 1 && vals[0].kind == V_TUPLE) {
        n = vals[0].count;
        vals = &L->seq[vals[0].idx];
    }
    NodeId xs[8];
    if (n < 1 || n > 8) {
        lower_error(L, call, "einsum: expected between 1 and 8 operands, found %d", n);
        return value_error();
    }
    for (int i = 0; i < n; i++) {
        xs[i] = lower_tensor_arg(L, vals[i], call, "einsum");
        if (xs[i] == IR_NONE) return value_error();
    }
    return done(L, comp_einsum(&L->b, a->v[0].str, xs, n), call);
}

bool lower_interp_mode(Lower *L, Value mode, Value align, AstId at, const char *what, bool *bilinear, bool *aligned)
{
    *bilinear = false;
    *aligned = false;
    if (mode.kind == V_STR && !strcmp(mode.str, "bilinear")) *bilinear = true;
    else if (mode.kind != V_NONE && !(mode.kind == V_STR && !strcmp(mode.str, "nearest"))) {
        lower_error(L, at, "%s: mode must be \"nearest\" or \"bilinear\"", what);
        return false;
    }
    if (align.kind == V_NONE) return true;
    if (!*bilinear) {
        lower_error(L, at, "%s: align_corners is for mode = \"bilinear\" (as in PyTorch)", what);
        return false;
    }
    return value_bool(L, align, at, what, aligned);
}

bool lower_interp_size(Lower *L, Value size, Value scale, AstId at, const char *what, NodeId x, int64_t out[2])
{
    const Shape *xs = &L->g->nodes[x].shape;
    if (xs->rank != 4 || !ir_dim_is_const(xs->d[2]) || !ir_dim_is_const(xs->d[3])) {
        lower_error(L, at, "%s: expected [N, C, H, W] with a fixed height and width", what);
        return false;
    }
    if ((size.kind == V_NONE) == (scale.kind == V_NONE)) {
        lower_error(L, at, "%s: give size or scale_factor (one of the two)", what);
        return false;
    }
    Value v = size.kind != V_NONE ? size : scale;
    for (int i = 0; i < 2; i++) {
        Value e = v.kind == V_TUPLE ? (v.count == 2 ? L->seq[v.idx + i] : value_error()) : v;
        double f;
        if (e.kind == V_ERROR) {
            lower_error(L, at, "%s: expected a number or a list of two", what);
            return false;
        }
        if (!value_number(L, e, at, what, &f)) return false;
        double o = size.kind != V_NONE ? f : floor((double)xs->d[2 + i].k * f);
        if (!(o >= 1 && o <= 65536) || (size.kind != V_NONE && o != floor(o))) {
            lower_error(L, at, "%s: the output size must be a whole number between 1 and 65536, found %g", what, o);
            return false;
        }
        out[i] = (int64_t)o;
    }
    return true;
}

static Value fn_interpolate(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "interpolate");
    int64_t o[2];
    bool bil, al;
    if (x == IR_NONE || !lower_interp_size(L, a->v[1], a->v[2], call, "interpolate", x, o) ||
        !lower_interp_mode(L, a->v[3], a->v[4], call, "interpolate", &bil, &al))
        return value_error();
    return done(L, comp_interpolate(&L->b, x, o[0], o[1], bil, al), call);
}

/* topk(x, k, dim = -1, largest = true) -> (values, indices), largest first as PyTorch's
 * sorted result: k rounds of max and argmax, each taking the winner out (with -inf) for
 * the next; ties go to the first index. */
static Value fn_topk(Lower *L, const BoundArgs *a, AstId call, int v)
{
    NodeId x = tensor(L, a, 0, "topk");
    int64_t k;
    int axis;
    bool largest;
    if (x == IR_NONE || !int_arg(L, a, 1, "topk", &k) || !axis_arg(L, a, 2, "topk", rank_of(L, x), &axis) ||
        !value_bool(L, a->v[3], a->at[3], "topk(largest)", &largest))
        return value_error();
    Shape xs = L->g->nodes[x].shape;
    if (!ir_dim_is_const(xs.d[axis]) || k < 1 || k > xs.d[axis].k || k > 64) {
        lower_error(L, a->at[1], "topk: k must be between 1 and the size of a fixed axis (and at most 64), found %lld", (long long)k);
        return value_error();
    }
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    NodeId cur = largest || x == IR_NONE ? x : ir_b_unary(b, OP_NEG, x);
    NodeId vals[64], idxs[64];
    Shape is = L->g->nodes[x].shape;
    NodeId pos = ir_b_iota(b, &is, axis, DT_I64);
    NodeId ninf = ir_b_const(b, -INFINITY, (DType)L->g->nodes[x].dtype);
    if (cur == IR_NONE || pos == IR_NONE || ninf == IR_NONE) return lower_builder_error(L, call);
    for (int64_t j = 0; j < k; j++) {
        /* the gradient of a value goes to the element at the index returned (argmax's
         * first maximum), as PyTorch's does */
        vals[j] = ir_b_reduce_max_first(b, cur, UINT64_C(1) << axis, true);
        idxs[j] = ir_b_argmax(b, cur, axis, true);
        if (vals[j] == IR_NONE || idxs[j] == IR_NONE) return lower_builder_error(L, call);
        if (j + 1 < k) {
            NodeId hit = ir_b_binary(b, OP_EQ, pos, idxs[j]);
            cur = hit == IR_NONE ? IR_NONE : ir_b_where(b, hit, ninf, cur);
            if (cur == IR_NONE) return lower_builder_error(L, call);
        }
    }
    NodeId vv = ir_b_concat(b, vals, (int)k, axis), ii = ir_b_concat(b, idxs, (int)k, axis);
    if (vv != IR_NONE && !largest) vv = ir_b_unary(b, OP_NEG, vv);
    if (vv == IR_NONE || ii == IR_NONE) return lower_builder_error(L, call);
    NodeId parts[2] = {vv, ii};
    return make_tuple(L, parts, 2);
}

static const Function functions[] = {
    {"exp", "x", fn_unary, 0}, {"log", "x", fn_unary, 1}, {"sqrt", "x", fn_unary, 2}, {"tanh", "x", fn_unary, 3},
    {"abs", "x", fn_unary, 4}, {"sigmoid", "x", fn_unary, 5}, {"relu", "x", fn_unary, 6},
    {"erf", "x", fn_unary, 7}, {"sin", "x", fn_unary, 8}, {"cos", "x", fn_unary, 9},
    {"gelu", "x, approximate=none", fn_gelu, 0},
    {"silu", "x", fn_act, ACT_SILU}, {"leaky_relu", "x, negative_slope=0.01", fn_act, ACT_LEAKY_RELU},
    {"elu", "x, alpha=1.0", fn_act, ACT_ELU}, {"softplus", "x, beta=1.0, threshold=20.0", fn_act, ACT_SOFTPLUS},
    {"mish", "x", fn_act, ACT_MISH}, {"hardswish", "x", fn_act, ACT_HARDSWISH}, {"hardsigmoid", "x", fn_act, ACT_HARDSIGMOID},
    {"maximum", "x, y", fn_binary, 0}, {"minimum", "x, y", fn_binary, 1}, {"pow", "x, y", fn_binary, 2},
    {"clamp", "x, min=none, max=none", fn_clamp, 0},
    {"where", "condition, x, y", fn_where, 0},
    {"f32", "x", fn_cast, DT_F32}, {"f64", "x", fn_cast, DT_F64}, {"f16", "x", fn_cast, DT_F16},
    {"bf16", "x", fn_cast, DT_BF16}, {"i32", "x", fn_cast, DT_I32}, {"i64", "x", fn_cast, DT_I64},
    {"u8", "x", fn_cast, DT_U8}, {"bool", "x", fn_cast, DT_BOOL},
    {"softmax", "x, axis|dim=-1", fn_softmax, 0}, {"log_softmax", "x, axis|dim=-1", fn_softmax, 1},
    {"logsumexp", "x, axis|dim=-1, keepdim=false", fn_softmax, 2},
    {"cross_entropy", "input|logits, target, ignore_index=none, reduction=\"mean\", label_smoothing=0.0, weight=none, axis=none", fn_loss, 0},
    {"nll_loss", "input, target, ignore_index=none, reduction=\"mean\", weight=none, axis=none", fn_loss, 1},
    {"kl_div", "input, target, reduction=\"mean\", log_target=false", fn_kl_div, 0},
    {"mse", "input, target", fn_loss, 2}, {"mse_loss", "input, target", fn_loss, 2},
    {"l1_loss", "input, target, reduction=\"mean\"", fn_regression_loss, 0},
    {"smooth_l1_loss", "input, target, reduction=\"mean\", beta=1.0", fn_regression_loss, 1},
    {"huber_loss", "input, target, reduction=\"mean\", delta=1.0", fn_regression_loss, 2},
    {"binary_cross_entropy_with_logits", "input, target, weight=none, pos_weight=none, reduction=\"mean\"", fn_bce_logits, 0},
    {"dropout", "x, p=0.5", fn_dropout, 0}, {"one_hot", "x, num_classes", fn_one_hot, 0},
    {"sum", "x, axis|dim=none, keepdim=false", fn_reduce, 0}, {"mean", "x, axis|dim=none, keepdim=false", fn_reduce, 1},
    {"max", "x, axis|dim=none, keepdim=false", fn_reduce, 2}, {"min", "x, axis|dim=none, keepdim=false", fn_reduce, 3},
    {"amax", "x, axis|dim=none, keepdim=false", fn_reduce, 6}, {"amin", "x, axis|dim=none, keepdim=false", fn_reduce, 7},
    {"var", "x, axis|dim=none, keepdim=false, unbiased=true", fn_reduce, 4},
    {"std", "x, axis|dim=none, keepdim=false, unbiased=true", fn_reduce, 5},
    {"argmax", "x, axis|dim=-1, keepdim=false", fn_argmax, 0},
    {"reshape", "x, *shape", fn_reshape, 0}, {"view", "x, *shape", fn_reshape, 0},
    {"flatten", "x, start|start_dim=1, end|end_dim=-1", fn_flatten, 0},
    {"transpose", "x, dim0=-2, dim1=-1", fn_transpose, 0}, {"permute", "x, *axes", fn_permute, 0},
    {"unsqueeze", "x, axis|dim", fn_unsqueeze, 0}, {"squeeze", "x, axis|dim=none", fn_unsqueeze, 1},
    {"split", "x, size, axis|dim=-1", fn_split, 0}, {"chunk", "x, chunks, axis|dim=-1", fn_split, 1},
    {"concat", "*xs, axis|dim=0", fn_concat, 0}, {"cat", "*xs, axis|dim=0", fn_concat, 0},
    {"slice", "x, axis|dim, start=0, end=none, step=1", fn_slice, 0},
    {"zeros", "*size", fn_fill, 0}, {"ones", "*size", fn_fill, 1}, {"full", "size, fill_value", fn_fill, 2},
    {"zeros_like", "x|input", fn_fill_like, 0}, {"ones_like", "x|input", fn_fill_like, 1},
    {"full_like", "x|input, fill_value", fn_fill_like, 2},
    {"tril", "x|input, diagonal=0", fn_tri, 0}, {"triu", "x|input, diagonal=0", fn_tri, 1},
    {"masked_fill", "x|input, mask, value", fn_masked_fill, 0}, {"expand", "x, *size", fn_expand, 0},
    {"flip", "x|input, dims", fn_flip, 0}, {"stack", "*xs|tensors, axis|dim=0", fn_stack, 0},
    {"scaled_dot_product_attention", "query, key, value, attn_mask=none, dropout_p=0.0, is_causal=false, scale=none", fn_sdpa, 0},
    {"cumsum", "x|input, dim", fn_cumsum, 0}, {"rotary", "x, base=10000.0", fn_rotary, 0},
    {"gather", "x|input, dim, index", fn_gather, 0},
    {"linear", "input, weight, bias=none", fn_linear, 0},
    {"layer_norm", "input, normalized_shape, weight=none, bias=none, eps=1e-5", fn_layer_norm, 0},
    {"max_pool2d", "input, kernel_size, stride=none, padding=0, dilation=1, ceil_mode=false", fn_pool, 0},
    {"avg_pool2d", "input, kernel_size, stride=none, padding=0, ceil_mode=false, count_include_pad=true", fn_pool, 1},
    {"topk", "x|input, k, dim=-1, largest=true", fn_topk, 0},
    {"einsum", "equation, *operands", fn_einsum, 0},
    {"interpolate", "input, size=none, scale_factor=none, mode=\"nearest\", align_corners=none", fn_interpolate, 0},
    {"arange", "n", fn_arange, 0}, {"matmul", "x, y", fn_matmul, 0}, {"detach", "x", fn_detach, 0},
};

#define NFUNCTIONS ((int)(sizeof functions / sizeof functions[0]))

const char *const *functions_names(int *n)
{
    static const char *names[NFUNCTIONS + 1];
    for (int i = 0; i < NFUNCTIONS; i++) names[i] = functions[i].name;
    names[NFUNCTIONS] = "checkpoint";
    *n = NFUNCTIONS + 1;
    return names;
}

const char *functions_signature(const char *name)
{
    for (int i = 0; i < NFUNCTIONS; i++)
        if (!strcmp(functions[i].name, name)) return functions[i].sig;
    return NULL;
}

bool functions_call(Lower *L, Scope *s, int32_t inst, const char *name, AstId call, Value *out)
{
    const AstNode *cn = ast_node(L->ast, call);
    if (!strcmp(name, "checkpoint")) {
        /* The nodes built for the argument form one region that the backward pass may
         * recompute instead of storing (the remat pass reads Node.ckpt). */
        if (cn->nkids != 2 || ast_node(L->ast, ast_kid(L->ast, call, 1))->kind == AST_KWARG) {
            lower_error(L, call, "checkpoint takes one expression, e.g. checkpoint(block(x))");
            *out = value_error();
            return true;
        }
        int32_t saved = L->b.ckpt;
        L->b.ckpt = ++L->next_ckpt;
        *out = lower_expr(L, s, inst, ast_kid(L->ast, call, 1));
        L->b.ckpt = saved;
        return true;
    }
    for (int i = 0; i < NFUNCTIONS; i++) {
        if (strcmp(functions[i].name, name)) continue;
        BoundArgs ba;
        if (!lower_bind_args(L, s, inst, call, name, functions[i].sig, &ba)) {
            *out = value_error();
            return true;
        }
        L->b.loc = cn->loc;
        *out = functions[i].impl(L, &ba, call, functions[i].variant);
        return true;
    }
    return false;
}

/* x.shape: a list of the sizes, numbers or symbolic (so x.shape[0] can be B) */
Value functions_shape_tuple(Lower *L, NodeId x)
{
    const Shape sh = L->g->nodes[x].shape;
    Value t = {.kind = V_TUPLE, .node = IR_NONE, .idx = L->nseq, .count = sh.rank};
    for (int i = 0; i < sh.rank; i++)
    {
        GROW(L->seq, L->seq_cap, L->nseq + 1);
        L->seq[L->nseq++] = ir_dim_is_const(sh.d[i]) ? value_num((double)sh.d[i].k, true) : (Value){.kind = V_DIM, .dim = sh.d[i], .node = IR_NONE};
    }
    return t;
}

/* Tensor methods PyTorch users write: every function taking a tensor first (x.mean(1),
 * x.softmax(-1), x.masked_fill(m, 0)), and the casts by PyTorch's names (x.float()). */
Value functions_method(Lower *L, Scope *s, int32_t inst, AstId e, const char *name, Value self)
{
    static const char *const aliases[][2] = {{"float", "f32"}, {"double", "f64"}, {"half", "f16"}, {"bfloat16", "bf16"},
                                             {"long", "i64"}, {"int", "i32"}, {"byte", "u8"}, {"size", "size"}};
    const char *fname = name;
    for (size_t i = 0; i < sizeof aliases / sizeof aliases[0]; i++)
        if (!strcmp(name, aliases[i][0])) fname = aliases[i][1];
    if (!strcmp(fname, "size")) { /* x.size() is x.shape, x.size(i) its size i */
        BoundArgs ba;
        L->method_self = &self;
        bool bound = lower_bind_args(L, s, inst, e, "size", "x, dim=none", &ba);
        L->method_self = NULL;
        if (!bound) return value_error();
        Value shape = functions_shape_tuple(L, self.node);
        if (ba.v[1].kind == V_NONE) return shape;
        int64_t i;
        if (!value_int(L, ba.v[1], ba.at[1], "size", &i)) return value_error();
        int axis = ir_b_axis(&L->b, "size", i, shape.count);
        return axis < 0 ? lower_builder_error(L, e) : L->seq[shape.idx + axis];
    }
    Value out;
    if (!strcmp(fname, "checkpoint")) { /* not a function of a tensor: checkpoint(expr) */
        lower_error(L, e, "checkpoint is not a tensor method: write checkpoint(expression)");
        return value_error();
    }
    L->method_self = &self;
    bool known = functions_call(L, s, inst, fname, e, &out);
    L->method_self = NULL;
    if (known) return out;
    int nf;
    const char *const *names = functions_names(&nf);
    const char *best = NULL;
    int bestd = 1000;
    for (int i = 0; i < nf; i++) lower_consider(names[i], name, &best, &bestd);
    if (best && bestd <= 2) lower_error(L, e, "a tensor has no method '%s' (did you mean '%s'?)", name, best);
    else lower_error(L, e, "a tensor has no method '%s'", name);
    return value_error();
}
