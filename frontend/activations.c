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

/* scaled_dot_product_attention(q, k, v): softmax(q k^T * scale + mask) v, as PyTorch 2's
 * F.scaled_dot_product_attention: a bool mask keeps the positions where it is true, a float
 * mask is added; is_causal keeps key j <= query i (top-left aligned). mask: IR_NONE or a
 * node; dropout_p applies in train mode. */
NodeId comp_attention(IrBuilder *b, NodeId q, NodeId k, NodeId v, NodeId mask, bool causal, double scale, double dropout_p, bool train)
{
    if (!ir_dtype_is_float(dtype_of(b, q))) q = ir_b_cast(b, q, DT_F32);
    TRY(q);
    Shape qs = b->g->nodes[q].shape, ks = b->g->nodes[k].shape;
    if (qs.rank < 2 || ks.rank < 2) {
        if (b->err) sb_printf(b->err, "scaled_dot_product_attention: query and key need rank 2 or more ([..., L, E] and [..., S, E])");
        return IR_NONE;
    }
    NodeId kt = ir_b_transpose(b, k, -2, -1);
    NodeId att = kt == IR_NONE ? IR_NONE : ir_b_matmul(b, q, kt);
    att = sc(b, OP_MUL, att, scale);
    TRY(att);
    Shape as = b->g->nodes[att].shape;
    if (causal) {
        Dim d[2] = {as.d[as.rank - 2], as.d[as.rank - 1]};
        Shape m = ir_shape_make(2, d);
        NodeId i = ir_b_iota(b, &m, 0, DT_I64);
        NodeId j = i == IR_NONE ? IR_NONE : ir_b_iota(b, &m, 1, DT_I64);
        mask = bin(b, OP_LE, j, i);
        TRY(mask);
    }
    if (mask != IR_NONE && b->g->nodes[mask].dtype == DT_BOOL) {
        NodeId ninf = ir_b_const(b, -INFINITY, dtype_of(b, att));
        att = sel(b, mask, att, ninf);
    } else if (mask != IR_NONE) {
        att = bin(b, OP_ADD, att, mask);
    }
    TRY(att);
    att = comp_softmax(b, att, as.rank - 1);
    TRY(att);
    att = comp_dropout(b, att, dropout_p, train);
    TRY(att);
    return ir_b_matmul(b, att, v);
}

/* cumsum along axis: a product with an upper-triangular matrix of ones over that axis
 * (moved last and back), so autodiff and the matmul kernels see through it; the axis must
 * have a fixed size. */
NodeId comp_cumsum(IrBuilder *b, NodeId x, int axis)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    Shape xs = b->g->nodes[x].shape;
    Dim n = xs.d[axis];
    if (!ir_dim_is_const(n)) {
        if (b->err) sb_printf(b->err, "cumsum: axis %d has a symbolic size; cumsum along an axis of fixed size", axis);
        return IR_NONE;
    }
    int last = xs.rank - 1;
    NodeId xt = axis == last ? x : ir_b_transpose(b, x, axis, last);
    TRY(xt);
    Dim d[2] = {n, n};
    Shape m = ir_shape_make(2, d);
    NodeId i = ir_b_iota(b, &m, 0, DT_I64);
    NodeId j = i == IR_NONE ? IR_NONE : ir_b_iota(b, &m, 1, DT_I64);
    NodeId tri = bin(b, OP_LE, i, j); /* out[j] = sum over i <= j of x[i] */
    NodeId u = tri == IR_NONE ? IR_NONE : ir_b_cast(b, tri, dtype_of(b, xt));
    NodeId r = u == IR_NONE ? IR_NONE : ir_b_matmul(b, xt, u);
    TRY(r);
    return axis == last ? r : ir_b_transpose(b, r, axis, last);
}

/* Rotary position embeddings as LLaMA applies them (Hugging Face's rotate_half form) to
 * x[..., T, D]: with theta_i = base^(-2i/D) for i < D/2 and angle = t * theta_i,
 * x * cos + rotate_half(x) * sin, where rotate_half(x) = concat(-x2, x1) of its halves and
 * cos, sin repeat the D/2 angles twice. Positions t count along axis -2 from 0, or are
 * `positions` ([T] integers; a decode graph's P + arange(T)) when it is not IR_NONE. */
NodeId comp_rotary(IrBuilder *b, NodeId x, double base, NodeId positions)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    Shape xs = b->g->nodes[x].shape;
    if (xs.rank < 2 || !ir_dim_is_const(xs.d[xs.rank - 1]) || xs.d[xs.rank - 1].k % 2) {
        if (b->err) sb_printf(b->err, "rotary: expected [..., T, D] with an even, fixed D");
        return IR_NONE;
    }
    int64_t dm = xs.d[xs.rank - 1].k, h = dm / 2;
    Dim td[2] = {xs.d[xs.rank - 2], ir_dim_const(h)};
    Shape ts = ir_shape_make(2, td);
    DType t = dtype_of(b, x);
    /* angle[t, i] = t * base^(-2i / D), then [angle, angle] along the last axis */
    NodeId pos = IR_NONE;
    if (positions == IR_NONE) {
        pos = ir_b_iota(b, &ts, 0, t);
    } else {
        Dim cd[2] = {td[0], ir_dim_const(1)};
        Shape column = ir_shape_make(2, cd);
        pos = ir_b_reshape(b, ir_b_cast(b, positions, t), &column);
        pos = pos == IR_NONE ? IR_NONE : ir_b_expand(b, pos, &ts);
    }
    /* the frequencies' index: over [1, D/2] for given positions, so that no iota spans the
     * sequence (a decode graph's check: frontend/decode.c) */
    Dim rd[2] = {ir_dim_const(1), ir_dim_const(h)};
    Shape row = ir_shape_make(2, rd);
    NodeId col = pos == IR_NONE ? IR_NONE : ir_b_iota(b, positions == IR_NONE ? &ts : &row, 1, t);
    NodeId inv = un(b, OP_EXP, sc(b, OP_MUL, col, -2.0 * log(base) / (double)dm));
    NodeId ang = bin(b, OP_MUL, pos, inv);
    TRY(ang);
    NodeId twice[2] = {ang, ang};
    NodeId ang2 = ir_b_concat(b, twice, 2, 1);
    NodeId cs = un(b, OP_COS, ang2), sn = un(b, OP_SIN, ang2);
    TRY(cs);
    TRY(sn);
    NodeId x1 = ir_b_slice(b, x, xs.rank - 1, 0, h, 1);
    NodeId x2 = x1 == IR_NONE ? IR_NONE : ir_b_slice(b, x, xs.rank - 1, h, dm, 1);
    NodeId parts[2] = {un(b, OP_NEG, x2), x1};
    TRY(parts[0]);
    NodeId rot = ir_b_concat(b, parts, 2, xs.rank - 1);
    return bin(b, OP_ADD, bin(b, OP_MUL, x, cs), bin(b, OP_MUL, rot, sn));
}
