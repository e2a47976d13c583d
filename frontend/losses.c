/* losses.c — PyTorch's losses beyond plain cross-entropy and MSE, as expansions into
 * primitive IR ops: nll_loss and cross_entropy with ignore_index and label_smoothing,
 * l1_loss, smooth_l1_loss, huber_loss and binary_cross_entropy_with_logits (pos_weight,
 * weight), each with PyTorch's reduction ("mean", "sum", "none"). Classes are on the last
 * axis here: functions.c moves PyTorch's axis 1 of [N, C, d1, ...] there first. Each returns IR_NONE when the builder rejects a step
 * (its message is in b->err). */
#include "internal.h"

#include <math.h>

#define TRY(x)                              \
    do {                                    \
        if ((x) == IR_NONE) return IR_NONE; \
    } while (0)

static const Shape *shape_of(IrBuilder *b, NodeId x) { return &b->g->nodes[x].shape; }
static DType dtype_of(IrBuilder *b, NodeId x) { return (DType)b->g->nodes[x].dtype; }
static uint64_t all_axes(IrBuilder *b, NodeId x) { return (UINT64_C(1) << shape_of(b, x)->rank) - 1; }

static NodeId sc(IrBuilder *b, Op op, NodeId x, double s) { return x == IR_NONE ? IR_NONE : comp_scalar_op(b, op, x, s, false); }
static NodeId un(IrBuilder *b, Op op, NodeId x) { return x == IR_NONE ? IR_NONE : ir_b_unary(b, op, x); }
static NodeId bin(IrBuilder *b, Op op, NodeId x, NodeId y)
{
    return x == IR_NONE || y == IR_NONE ? IR_NONE : ir_b_binary(b, op, x, y);
}
static NodeId sel(IrBuilder *b, NodeId c, NodeId x, NodeId y)
{
    return c == IR_NONE || x == IR_NONE || y == IR_NONE ? IR_NONE : ir_b_where(b, c, x, y);
}

NodeId comp_reduce_loss(IrBuilder *b, NodeId l, LossReduction r)
{
    if (l == IR_NONE || r == LOSS_NONE) return l;
    if (r == LOSS_SUM) return ir_b_reduce(b, OP_REDUCE_SUM, l, all_axes(b, l), false);
    return comp_mean(b, l, all_axes(b, l), false);
}

/* Negative log-likelihood of log-probabilities logp[..., C] at target[...] (classes on the
 * last axis), with PyTorch's ignore_index (a target equal to it counts for nothing, and
 * the mean is over the others), label_smoothing eps (each term is
 * (1 - eps) (-logp[t]) + eps / C sum_c (-logp[c])) and class weights w[C] (IR_NONE: none):
 * -w[t] logp[t] + eps / C sum_c (-w[c] logp[c]), the mean divided by the sum of w[t]. */
NodeId comp_nll(IrBuilder *b, NodeId logp, NodeId target, NodeId weight, bool has_ignore, int64_t ignore_index, double smoothing,
                LossReduction r, const char *what)
{
    Shape lshape = *shape_of(b, logp), tshape = *shape_of(b, target);
    if (!ir_dtype_is_int(dtype_of(b, target))) {
        if (b->err) sb_printf(b->err, "%s: the target must hold integer class indices, found %s", what, ir_dtype_name(dtype_of(b, target)));
        return IR_NONE;
    }
    bool ok = lshape.rank >= 1 && tshape.rank == lshape.rank - 1;
    for (int i = 0; ok && i < tshape.rank; i++) ok = ir_dim_eq(lshape.d[i], tshape.d[i]);
    if (!ok) {
        if (b->err) {
            sb_printf(b->err, "%s: target shape ", what);
            ir_shape_format(b->err, b->g, &tshape);
            sb_puts(b->err, " must equal the input shape ");
            ir_shape_format(b->err, b->g, &lshape);
            sb_puts(b->err, " without its last (class) axis");
        }
        return IR_NONE;
    }
    if (!ir_dtype_is_float(dtype_of(b, logp))) logp = ir_b_cast(b, logp, DT_F32);
    TRY(logp);
    int c = lshape.rank - 1;
    NodeId valid = IR_NONE;
    if (has_ignore) {
        /* compared as i64 (an ignore_index of -100 against u8 targets would wrap), and
         * replaced by class 0 before the range check: it picks nothing that counts */
        target = ir_b_cast(b, target, DT_I64);
        valid = sc(b, OP_NE, target, (double)ignore_index);
        NodeId zero = valid == IR_NONE ? IR_NONE : ir_b_const(b, 0.0, DT_I64);
        target = sel(b, valid, target, zero);
        TRY(target);
    }
    target = ir_b_check_index(b, target, ir_dim_max(b->g, lshape.d[c]), what);
    TRY(target);
    Shape ts1 = tshape;
    ts1.d[ts1.rank++] = ir_dim_const(1);
    NodeId classes = ir_b_iota(b, &lshape, c, dtype_of(b, target));
    NodeId hot = bin(b, OP_EQ, classes, ir_b_reshape(b, target, &ts1));
    NodeId hotf = hot == IR_NONE ? IR_NONE : ir_b_cast(b, hot, dtype_of(b, logp));
    NodeId wl = logp, wt = IR_NONE; /* w[c] logp[c], and w[t] */
    if (weight != IR_NONE) {
        Shape ws = *shape_of(b, weight);
        if (ws.rank != 1 || !ir_dim_eq(ws.d[0], lshape.d[c])) {
            if (b->err) {
                sb_printf(b->err, "%s: weight must have one element per class, [", what);
                ir_dim_format(b->err, b->g, lshape.d[c]);
                sb_puts(b->err, "], found ");
                ir_shape_format(b->err, b->g, &ws);
            }
            return IR_NONE;
        }
        wl = bin(b, OP_MUL, logp, weight);
        wt = hotf == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, bin(b, OP_MUL, hotf, weight), UINT64_C(1) << c, false);
        TRY(wt);
    }
    NodeId picked = hotf == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, bin(b, OP_MUL, wl, hotf), UINT64_C(1) << c, false);
    NodeId l = un(b, OP_NEG, picked);
    if (smoothing > 0) {
        if (!ir_dim_is_const(lshape.d[c])) {
            if (b->err) sb_printf(b->err, "%s: label_smoothing needs a class axis of fixed size", what);
            return IR_NONE;
        }
        NodeId all = ir_b_reduce(b, OP_REDUCE_SUM, wl, UINT64_C(1) << c, false);
        l = bin(b, OP_ADD, sc(b, OP_MUL, l, 1.0 - smoothing), sc(b, OP_MUL, all, -smoothing / (double)lshape.d[c].k));
    }
    TRY(l);
    if (!has_ignore && wt == IR_NONE) return comp_reduce_loss(b, l, r);
    NodeId zero = ir_b_const(b, 0.0, dtype_of(b, l));
    if (has_ignore) {
        l = sel(b, valid, l, zero);
        if (wt != IR_NONE) wt = sel(b, valid, wt, zero);
    }
    TRY(l);
    if (r != LOSS_MEAN) return comp_reduce_loss(b, l, r);
    /* the mean over the targets that count, weighted by their class weights (NaN when none
     * counts, as PyTorch) */
    NodeId den = wt != IR_NONE ? wt : ir_b_cast(b, valid, dtype_of(b, l));
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, l, all_axes(b, l), false);
    NodeId cnt = den == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, den, all_axes(b, den), false);
    return bin(b, OP_DIV, s, cnt);
}

/* cross_entropy with class probabilities p[..., C] as the target (PyTorch >= 1.10; classes
 * on the last axis): -sum_c w[c] p'[c] log_softmax(logits)[c] per sample, p' = (1 - eps) p
 * + eps / C with label smoothing eps; the mean is over the samples (not divided by the
 * weights, as PyTorch's for this form). weight: [C] or IR_NONE. */
NodeId comp_cross_entropy_probs(IrBuilder *b, NodeId logits, NodeId probs, NodeId weight, double smoothing, LossReduction r)
{
    if (!ir_dtype_is_float(dtype_of(b, logits))) logits = ir_b_cast(b, logits, DT_F32);
    TRY(logits);
    if (dtype_of(b, probs) != dtype_of(b, logits)) probs = ir_b_cast(b, probs, dtype_of(b, logits));
    TRY(probs);
    Shape ls = *shape_of(b, logits);
    int c = ls.rank - 1;
    if (smoothing > 0) {
        if (!ir_dim_is_const(ls.d[c])) {
            if (b->err) sb_puts(b->err, "cross_entropy: label_smoothing needs a class axis of fixed size");
            return IR_NONE;
        }
        probs = sc(b, OP_ADD, sc(b, OP_MUL, probs, 1.0 - smoothing), smoothing / (double)ls.d[c].k);
    }
    if (weight != IR_NONE) {
        Shape ws = *shape_of(b, weight);
        if (ws.rank != 1 || !ir_dim_eq(ws.d[0], ls.d[c])) {
            if (b->err) {
                sb_puts(b->err, "cross_entropy: weight must have one element per class, [");
                ir_dim_format(b->err, b->g, ls.d[c]);
                sb_puts(b->err, "], found ");
                ir_shape_format(b->err, b->g, &ws);
            }
            return IR_NONE;
        }
        probs = bin(b, OP_MUL, probs, weight);
    }
    NodeId logp = comp_log_softmax(b, logits, c);
    NodeId picked = bin(b, OP_MUL, logp, probs);
    NodeId l = un(b, OP_NEG, picked == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, picked, UINT64_C(1) << c, false));
    return comp_reduce_loss(b, l, r);
}

/* l1 (kind 0): |d|; smooth_l1 (1): |d| < beta ? d^2 / (2 beta) : |d| - beta / 2; huber (2):
 * |d| < delta ? d^2 / 2 : delta (|d| - delta / 2); d = x - y. */
NodeId comp_regression_loss(IrBuilder *b, int kind, NodeId x, NodeId y, double beta, LossReduction r)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId d = bin(b, OP_SUB, x, y);
    NodeId a = un(b, OP_ABS, d);
    TRY(a);
    NodeId l = a;
    if (kind == 1 && beta > 0) {
        NodeId quad = sc(b, OP_MUL, bin(b, OP_MUL, d, d), 0.5 / beta);
        l = sel(b, sc(b, OP_LT, a, beta), quad, sc(b, OP_SUB, a, 0.5 * beta));
    } else if (kind == 2) {
        NodeId quad = sc(b, OP_MUL, bin(b, OP_MUL, d, d), 0.5);
        l = sel(b, sc(b, OP_LT, a, beta), quad, sc(b, OP_MUL, sc(b, OP_SUB, a, 0.5 * beta), beta));
    }
    return comp_reduce_loss(b, l, r);
}

/* PyTorch's binary_cross_entropy_with_logits: with lw = 1 + (pos_weight - 1) y,
 * (1 - y) x + lw (log(1 + exp(-|x|)) + max(-x, 0)), times weight. pos_weight and weight
 * (IR_NONE when absent) broadcast against x. */
NodeId comp_bce_logits(IrBuilder *b, NodeId x, NodeId y, NodeId weight, NodeId pos_weight, LossReduction r)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    if (!ir_dtype_is_float(dtype_of(b, y))) y = ir_b_cast(b, y, dtype_of(b, x));
    TRY(y);
    /* log(1 + exp(-x)) as log(1 + exp(-|x|)) + max(-x, 0), with both branches chosen by one
     * where(): smooth at 0 (gradient -1/2 there, as PyTorch's) and never exp of a large x */
    NodeId ge = sc(b, OP_GE, x, 0.0);
    NodeId negx = un(b, OP_NEG, x);
    NodeId z = sel(b, ge, negx, x);
    NodeId zero = ir_b_const(b, 0.0, dtype_of(b, x));
    NodeId soft = bin(b, OP_ADD, un(b, OP_LOG, sc(b, OP_ADD, un(b, OP_EXP, z), 1.0)), sel(b, ge, zero, negx));
    if (pos_weight != IR_NONE) soft = bin(b, OP_MUL, soft, sc(b, OP_ADD, bin(b, OP_MUL, sc(b, OP_SUB, pos_weight, 1.0), y), 1.0));
    NodeId l = bin(b, OP_ADD, bin(b, OP_MUL, comp_scalar_op(b, OP_SUB, y, 1.0, true), x), soft);
    if (weight != IR_NONE) l = bin(b, OP_MUL, l, weight);
    return comp_reduce_loss(b, l, r);
}

/* kl_div(input, target) as F.kl_div: input holds log-probabilities; the pointwise loss is
 * target (log target - input), 0 where target is 0 (log_target: exp(t) (t - input)).
 * batchmean divides the sum by the size of the first axis. */
NodeId comp_kl_div(IrBuilder *b, NodeId x, NodeId t, bool log_target, LossReduction r, bool batchmean)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    if (!ir_dtype_is_float(dtype_of(b, t))) t = ir_b_cast(b, t, dtype_of(b, x));
    TRY(t);
    NodeId l;
    if (log_target) l = bin(b, OP_MUL, un(b, OP_EXP, t), bin(b, OP_SUB, t, x));
    else {
        /* xlogy: the log's argument is 1 where t is 0, so neither it nor its gradient is NaN */
        NodeId pos = sc(b, OP_GT, t, 0.0);
        NodeId one = ir_b_const(b, 1.0, dtype_of(b, t)), zero = ir_b_const(b, 0.0, dtype_of(b, t));
        NodeId lt = un(b, OP_LOG, sel(b, pos, t, one));
        l = sel(b, pos, bin(b, OP_MUL, t, bin(b, OP_SUB, lt, x)), zero);
    }
    TRY(l);
    if (!batchmean) return comp_reduce_loss(b, l, r);
    NodeId s = comp_reduce_loss(b, l, LOSS_SUM);
    const Shape *ls = shape_of(b, l);
    if (ls->rank == 0) return s;
    NodeId n = ir_b_full(b, 1.0, dtype_of(b, l), &(Shape){.rank = 1, .d = {ls->d[0]}});
    n = n == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, n, 1, false);
    return bin(b, OP_DIV, s, n);
}
