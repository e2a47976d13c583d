/* activations.c — PyTorch's activation functions and small elementwise compositions as
 * expansions into primitive IR ops: the functional forms (silu, elu, ...) and the
 * activation modules (SiLU(), ELU(), ...) both build through comp_activation, so the two
 * spellings cannot drift apart. Also floor division and remainder (// and %), tril/triu
 * and flip. Branches that are not taken are kept finite (exp of where(x > 0, 0, x), not of
 * x), so a where() never multiplies a zero gradient by an infinity; the same condition picks
 * both, so the gradient at the switch point is PyTorch's. Each function returns IR_NONE
 * when the builder rejects a step (its message is in b->err). */
#include "internal.h"

#include <math.h>

#define TRY(x)                              \
    do {                                    \
        if ((x) == IR_NONE) return IR_NONE; \
    } while (0)

static DType dtype_of(IrBuilder *b, NodeId x) { return (DType)b->g->nodes[x].dtype; }

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

/* softplus(x) = log(1 + exp(beta x)) / beta, and x itself where beta x > threshold, as
 * PyTorch computes it; exp's argument is capped at the threshold so the untaken branch
 * stays finite. */
static NodeId softplus(IrBuilder *b, NodeId x, double beta, double threshold)
{
    NodeId bx = beta == 1.0 ? x : sc(b, OP_MUL, x, beta);
    NodeId big = sc(b, OP_GT, bx, threshold);
    NodeId capped = sel(b, big, bx == IR_NONE ? IR_NONE : ir_b_full(b, threshold, dtype_of(b, bx), &b->g->nodes[bx].shape), bx);
    NodeId l = un(b, OP_LOG, sc(b, OP_ADD, un(b, OP_EXP, capped), 1.0));
    if (beta != 1.0) l = sc(b, OP_DIV, l, beta);
    return sel(b, big, x, l);
}

NodeId comp_activation(IrBuilder *b, ActKind k, NodeId x, double a0, double a1)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    switch (k) {
    case ACT_RELU: return un(b, OP_RELU, x);
    case ACT_SIGMOID: return un(b, OP_SIGMOID, x);
    case ACT_TANH: return un(b, OP_TANH, x);
    case ACT_GELU_TANH: return comp_gelu_tanh(b, x);
    case ACT_GELU: /* exact: x/2 (1 + erf(x / sqrt 2)), PyTorch's default */
        return bin(b, OP_MUL, sc(b, OP_MUL, x, 0.5), sc(b, OP_ADD, un(b, OP_ERF, sc(b, OP_MUL, x, 1.0 / sqrt(2.0))), 1.0));
    case ACT_SILU: return bin(b, OP_MUL, x, un(b, OP_SIGMOID, x));
    case ACT_LEAKY_RELU: /* x > 0 ? x : slope x; the gradient at 0 is slope, as PyTorch's */
        return sel(b, sc(b, OP_GT, x, 0.0), x, sc(b, OP_MUL, x, a0));
    case ACT_ELU: { /* x > 0 ? x : alpha (exp(x) - 1); the gradient at 0 is alpha, as PyTorch's */
        NodeId pos = sc(b, OP_GT, x, 0.0);
        NodeId z = sel(b, pos, x == IR_NONE ? IR_NONE : ir_b_const(b, 0.0, dtype_of(b, x)), x);
        NodeId neg = sc(b, OP_MUL, sc(b, OP_SUB, un(b, OP_EXP, z), 1.0), a0);
        return sel(b, pos, x, neg);
    }
    case ACT_SOFTPLUS: return softplus(b, x, a0, a1);
    case ACT_MISH: return bin(b, OP_MUL, x, un(b, OP_TANH, softplus(b, x, 1.0, 20.0)));
    case ACT_HARDSWISH: /* x relu6(x + 3) / 6 */
        return bin(b, OP_MUL, x, sc(b, OP_DIV, sc(b, OP_MIN, sc(b, OP_MAX, sc(b, OP_ADD, x, 3.0), 0.0), 6.0), 6.0));
    case ACT_HARDSIGMOID: return sc(b, OP_DIV, sc(b, OP_MIN, sc(b, OP_MAX, sc(b, OP_ADD, x, 3.0), 0.0), 6.0), 6.0);
    }
    return IR_NONE;
}

/* x // y (floor) and x % y (the sign of y), as Python and PyTorch define them: floats
 * directly; integers through f64 and back (exact below 2^53). */
NodeId comp_floor_divide(IrBuilder *b, NodeId x, NodeId y, bool remainder)
{
    DType t = ir_promote(dtype_of(b, x), dtype_of(b, y));
    if (t == DT_BOOL) t = DT_I64;
    DType ct = ir_dtype_is_float(t) ? t : DT_F64;
    NodeId xf = ir_b_cast(b, x, ct);
    NodeId yf = xf == IR_NONE ? IR_NONE : ir_b_cast(b, y, ct);
    NodeId q = un(b, OP_FLOOR, bin(b, OP_DIV, xf, yf));
    NodeId r = remainder ? bin(b, OP_SUB, xf, bin(b, OP_MUL, yf, q)) : q;
    TRY(r);
    return ct == t ? r : ir_b_cast(b, r, t);
}

/* tril (upper = false) keeps x[..., i, j] where j - i <= diagonal, triu where j - i >=
 * diagonal; the rest is zero. */
NodeId comp_tri(IrBuilder *b, NodeId x, int64_t diagonal, bool upper)
{
    Shape xs = b->g->nodes[x].shape;
    if (xs.rank < 2) {
        if (b->err) sb_printf(b->err, "%s: expected a tensor of rank 2 or more, found rank %d", upper ? "triu" : "tril", xs.rank);
        return IR_NONE;
    }
    Dim d[2] = {xs.d[xs.rank - 2], xs.d[xs.rank - 1]};
    Shape m = ir_shape_make(2, d);
    NodeId i = ir_b_iota(b, &m, 0, DT_I64);
    NodeId j = i == IR_NONE ? IR_NONE : ir_b_iota(b, &m, 1, DT_I64);
    NodeId jd = sc(b, OP_SUB, j, (double)diagonal);
    NodeId keep = bin(b, upper ? OP_GE : OP_LE, jd, i);
    NodeId zero = keep == IR_NONE ? IR_NONE : ir_b_const(b, 0.0, dtype_of(b, x));
    return sel(b, keep, x, zero);
}

/* Reverses axis `axis` (of constant size): a gather of the rows n-1 .. 0 with the axis
 * moved to the front, and back. */
NodeId comp_flip(IrBuilder *b, NodeId x, int axis)
{
    Shape xs = b->g->nodes[x].shape;
    Dim n = xs.d[axis];
    if (!ir_dim_is_const(n)) {
        if (b->err) sb_printf(b->err, "flip: axis %d has a symbolic size; flip an axis of fixed size", axis);
        return IR_NONE;
    }
    if (n.k <= 1) return x;
    int perm[IR_MAX_RANK], inv[IR_MAX_RANK];
    perm[0] = axis;
    for (int i = 0, k = 1; i < xs.rank; i++)
        if (i != axis) perm[k++] = i;
    for (int i = 0; i < xs.rank; i++) inv[perm[i]] = i;
    NodeId front = axis ? ir_b_permute(b, x, perm) : x;
    TRY(front);
    Shape is = ir_shape_make(1, &n);
    NodeId idx = ir_b_iota(b, &is, 0, DT_I64);
    TRY(idx);
    idx = comp_scalar_op(b, OP_SUB, idx, (double)(n.k - 1), true);
    TRY(idx);
    idx = ir_b_check_index(b, idx, n.k, "flip");
    NodeId r = idx == IR_NONE ? IR_NONE : ir_b_gather(b, front, idx);
    TRY(r);
    return axis ? ir_b_permute(b, r, inv) : r;
}
