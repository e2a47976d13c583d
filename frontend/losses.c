/* losses.c — PyTorch's losses beyond plain cross-entropy and MSE, as expansions into
 * primitive IR ops: nll_loss and cross_entropy with ignore_index and label_smoothing,
 * l1_loss, smooth_l1_loss, huber_loss and binary_cross_entropy_with_logits (pos_weight,
 * weight), each with PyTorch's reduction ("mean", "sum", "none"). Classes are on the last
 * axis, as for Kiln's cross_entropy. Each returns IR_NONE when the builder rejects a step
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
 * the mean is over the others) and label_smoothing eps: each term is
 * (1 - eps) (-logp[t]) + eps / C sum_c (-logp[c]). */
NodeId comp_nll(IrBuilder *b, NodeId logp, NodeId target, bool has_ignore, int64_t ignore_index, double smoothing, LossReduction r,
                const char *what)
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
    NodeId picked = ir_b_reduce(b, OP_REDUCE_SUM, bin(b, OP_MUL, logp, ir_b_cast(b, hot, dtype_of(b, logp))), UINT64_C(1) << c, false);
    NodeId l = un(b, OP_NEG, picked);
    if (smoothing > 0) {
        if (!ir_dim_is_const(lshape.d[c])) {
            if (b->err) sb_printf(b->err, "%s: label_smoothing needs a class axis of fixed size", what);
            return IR_NONE;
        }
        NodeId all = ir_b_reduce(b, OP_REDUCE_SUM, logp, UINT64_C(1) << c, false);
        l = bin(b, OP_ADD, sc(b, OP_MUL, l, 1.0 - smoothing), sc(b, OP_MUL, all, -smoothing / (double)lshape.d[c].k));
    }
    TRY(l);
    if (!has_ignore) return comp_reduce_loss(b, l, r);
    NodeId vf = ir_b_cast(b, valid, dtype_of(b, l));
    NodeId zero = ir_b_const(b, 0.0, dtype_of(b, l));
    l = sel(b, valid, l, zero);
    TRY(l);
    if (r != LOSS_MEAN) return comp_reduce_loss(b, l, r);
    /* the mean over the targets that count (NaN when none does, as PyTorch) */
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, l, all_axes(b, l), false);
    NodeId cnt = vf == IR_NONE ? IR_NONE : ir_b_reduce(b, OP_REDUCE_SUM, vf, all_axes(b, vf), false);
    return bin(b, OP_DIV, s, cnt);
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
