/* composite.c — composite layers as expansions into primitive IR ops.
 *
 * Softmax, cross-entropy, GELU, layer norm, dropout, convolution and pooling are not
 * opaque kernels: they are built here from the primitives of ir/ops.h, so autodiff derives
 * their gradients from the primitive rules and fusion sees through them. Each function
 * returns IR_NONE when the builder rejects a step (its message is in b->err). */
#include "internal.h"

#include <math.h>

#define TRY(x)                            \
    do {                                  \
        if ((x) == IR_NONE) return IR_NONE; \
    } while (0)

static const Shape *shape_of(IrBuilder *b, NodeId x) { return &b->g->nodes[x].shape; }
static DType dtype_of(IrBuilder *b, NodeId x) { return (DType)b->g->nodes[x].dtype; }

static bool is_integral(double s) { return s == floor(s) && fabs(s) < 9e15; }

NodeId comp_scalar_op(IrBuilder *b, Op op, NodeId x, double s, bool scalar_left)
{
    DType t = dtype_of(b, x);
    DType ct = t;
    if (!ir_dtype_is_float(t)) {
        if (!is_integral(s) || isinf(s)) ct = DT_F32;
        else if (t == DT_BOOL && !(ir_op_info[op].flags & OPF_LOGIC)) ct = DT_I64;
    }
    /* The constant takes x's shape directly, so the IR reads `const 255.0 : f32[B, 784]`
     * rather than a scalar followed by reshape and expand. */
    NodeId c = ir_b_full(b, s, ct, shape_of(b, x));
    TRY(c);
    return scalar_left ? ir_b_binary(b, op, c, x) : ir_b_binary(b, op, x, c);
}

/* Product of the sizes of the axes in mask, as a tensor of x's dtype (symbolic sizes such
 * as B become a cast of a reduce over ones would; here they are rejected by the caller). */
static NodeId count_of(IrBuilder *b, NodeId x, uint64_t axes, DType t)
{
    const Shape *s = shape_of(b, x);
    Dim n = ir_dim_const(1);
    for (int i = 0; i < s->rank; i++)
        if (axes >> i & 1) ir_dim_mul(n, s->d[i], &n);
    if (ir_dim_is_const(n)) return ir_b_const(b, (double)n.k, t);
    /* A symbolic count (e.g. the batch size B): the sum of ones over just those axes,
     * which evaluates to the actual size at run time. */
    Shape only = ir_shape_make(0, NULL);
    for (int i = 0; i < s->rank; i++)
        if (axes >> i & 1) only.d[only.rank++] = s->d[i];
    NodeId ones = ir_b_full(b, 1.0, t, &only);
    TRY(ones);
    return ir_b_reduce(b, OP_REDUCE_SUM, ones, (UINT64_C(1) << only.rank) - 1, false);
}

NodeId comp_mean(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, x, axes, keepdim);
    TRY(s);
    NodeId n = count_of(b, x, axes, dtype_of(b, x));
    TRY(n);
    return ir_b_binary(b, OP_DIV, s, n);
}

NodeId comp_var(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim, bool unbiased)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId m = comp_mean(b, x, axes, true);
    TRY(m);
    NodeId d = ir_b_binary(b, OP_SUB, x, m);
    TRY(d);
    NodeId sq = ir_b_binary(b, OP_MUL, d, d);
    TRY(sq);
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, sq, axes, keepdim);
    TRY(s);
    NodeId n = count_of(b, x, axes, dtype_of(b, x));
    TRY(n);
    if (unbiased) {
        n = comp_scalar_op(b, OP_SUB, n, 1.0, false);
        TRY(n);
    }
    return ir_b_binary(b, OP_DIV, s, n);
}

NodeId comp_softmax(IrBuilder *b, NodeId x, int axis)
{
    axis = ir_b_axis(b, "softmax", axis, shape_of(b, x)->rank);
    if (axis < 0) return IR_NONE;
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    uint64_t m = UINT64_C(1) << axis;
    /* Subtracting the row maximum keeps exp() finite; it does not change the result, so it
     * is detached: its gradient is exactly zero and autodiff need not compute it. */
    NodeId mx = ir_b_reduce(b, OP_REDUCE_MAX, x, m, true);
    TRY(mx);
    mx = ir_b_unary(b, OP_DETACH, mx);
    TRY(mx);
    NodeId z = ir_b_binary(b, OP_SUB, x, mx);
    TRY(z);
    NodeId e = ir_b_unary(b, OP_EXP, z);
    TRY(e);
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, e, m, true);
    TRY(s);
    return ir_b_binary(b, OP_DIV, e, s);
}

NodeId comp_logsumexp(IrBuilder *b, NodeId x, int axis, bool keepdim)
{
    axis = ir_b_axis(b, "logsumexp", axis, shape_of(b, x)->rank);
    if (axis < 0) return IR_NONE;
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    uint64_t m = UINT64_C(1) << axis;
    NodeId mx = ir_b_reduce(b, OP_REDUCE_MAX, x, m, true);
    TRY(mx);
    mx = ir_b_unary(b, OP_DETACH, mx); /* a stabiliser: see comp_softmax */
    TRY(mx);
    NodeId z = ir_b_binary(b, OP_SUB, x, mx);
    TRY(z);
    NodeId e = ir_b_unary(b, OP_EXP, z);
    TRY(e);
    NodeId s = ir_b_reduce(b, OP_REDUCE_SUM, e, m, true);
    TRY(s);
    NodeId l = ir_b_unary(b, OP_LOG, s);
    TRY(l);
    NodeId r = ir_b_binary(b, OP_ADD, l, mx);
    TRY(r);
    if (keepdim) return r;
    Shape out = *shape_of(b, r);
    for (int i = axis; i < out.rank - 1; i++) out.d[i] = out.d[i + 1];
    out.rank--;
    return ir_b_reshape(b, r, &out);
}

NodeId comp_log_softmax(IrBuilder *b, NodeId x, int axis)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId l = comp_logsumexp(b, x, axis, true);
    TRY(l);
    return ir_b_binary(b, OP_SUB, x, l);
}

NodeId comp_gelu_tanh(IrBuilder *b, NodeId x)
{
    /* 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), PyTorch's approximate='tanh'. */
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId x2 = ir_b_binary(b, OP_MUL, x, x);
    TRY(x2);
    NodeId x3 = ir_b_binary(b, OP_MUL, x2, x);
    TRY(x3);
    NodeId c3 = comp_scalar_op(b, OP_MUL, x3, 0.044715, false);
    TRY(c3);
    NodeId in = ir_b_binary(b, OP_ADD, x, c3);
    TRY(in);
    NodeId sc = comp_scalar_op(b, OP_MUL, in, sqrt(2.0 / KILN_PI), false);
    TRY(sc);
    NodeId t = ir_b_unary(b, OP_TANH, sc);
    TRY(t);
    NodeId one = comp_scalar_op(b, OP_ADD, t, 1.0, false);
    TRY(one);
    NodeId hx = comp_scalar_op(b, OP_MUL, x, 0.5, false);
    TRY(hx);
    return ir_b_binary(b, OP_MUL, hx, one);
}

NodeId comp_cross_entropy(IrBuilder *b, NodeId logits, NodeId target)
{
    /* Copies: building nodes may move the node array. */
    Shape lshape = *shape_of(b, logits), tshape = *shape_of(b, target);
    const Shape *ls = &lshape, *ts = &tshape;
    if (!ir_dtype_is_int(dtype_of(b, target))) {
        if (b->err)
            sb_printf(b->err, "cross_entropy: the target must hold integer class indices, found %s",
                      ir_dtype_name(dtype_of(b, target)));
        return IR_NONE;
    }
    bool ok = ls->rank >= 1 && ts->rank == ls->rank - 1;
    for (int i = 0; ok && i < ts->rank; i++) ok = ir_dim_eq(ls->d[i], ts->d[i]);
    if (!ok) {
        if (b->err) {
            sb_puts(b->err, "cross_entropy: target shape ");
            ir_shape_format(b->err, b->g, ts);
            sb_puts(b->err, " must equal the logits shape ");
            ir_shape_format(b->err, b->g, ls);
            sb_puts(b->err, " without its last (class) axis");
        }
        return IR_NONE;
    }
    if (!ir_dtype_is_float(dtype_of(b, logits))) logits = ir_b_cast(b, logits, DT_F32);
    int c = ls->rank - 1;
    /* loss = mean(logsumexp(logits) - logits[target]); the pick is a one-hot product, a
     * primitive pattern that fusion turns back into an indexed load. */
    NodeId lse = comp_logsumexp(b, logits, c, false);
    TRY(lse);
    NodeId classes = ir_b_iota(b, ls, c, DT_I64);
    TRY(classes);
    /* A class index out of range would silently select no logit: the step stops instead. */
    target = ir_b_check_index(b, target, ir_dim_max(b->g, ls->d[c]), "cross_entropy target");
    TRY(target);
    Shape ts1 = *ts;
    ts1.d[ts1.rank++] = ir_dim_const(1);
    NodeId t1 = ir_b_reshape(b, target, &ts1);
    TRY(t1);
    NodeId hot = ir_b_binary(b, OP_EQ, classes, t1);
    TRY(hot);
    NodeId hotf = ir_b_cast(b, hot, dtype_of(b, logits));
    NodeId prod = ir_b_binary(b, OP_MUL, logits, hotf);
    TRY(prod);
    NodeId picked = ir_b_reduce(b, OP_REDUCE_SUM, prod, UINT64_C(1) << c, false);
    TRY(picked);
    NodeId nll = ir_b_binary(b, OP_SUB, lse, picked);
    TRY(nll);
    return comp_mean(b, nll, (UINT64_C(1) << ts->rank) - 1, false);
}

NodeId comp_mse(IrBuilder *b, NodeId x, NodeId y)
{
    NodeId d = ir_b_binary(b, OP_SUB, x, y);
    TRY(d);
    NodeId sq = ir_b_binary(b, OP_MUL, d, d);
    TRY(sq);
    return comp_mean(b, sq, (UINT64_C(1) << shape_of(b, sq)->rank) - 1, false);
}

NodeId comp_dropout(IrBuilder *b, NodeId x, double p, bool train)
{
    if (!train || p == 0.0) return x;
    if (p >= 1.0) return comp_scalar_op(b, OP_MUL, x, 0.0, false);
    /* keep = u >= p with a counter-based u, scaled by 1/(1-p) as PyTorch does. The mask is
     * a pure function of (seed, step, stream, element), so backward can recompute it. */
    NodeId u = ir_b_random_uniform(b, shape_of(b, x), DT_F32);
    TRY(u);
    NodeId keep = comp_scalar_op(b, OP_GE, u, p, false);
    TRY(keep);
    NodeId zero = ir_b_const(b, 0.0, dtype_of(b, x));
    TRY(zero);
    NodeId kept = ir_b_where(b, keep, x, zero);
    TRY(kept);
    return comp_scalar_op(b, OP_MUL, kept, 1.0 / (1.0 - p), false);
}

NodeId comp_layer_norm(IrBuilder *b, NodeId x, NodeId weight, NodeId bias, int nnorm, double eps)
{
    int r = shape_of(b, x)->rank;
    if (nnorm < 1 || nnorm > r) {
        if (b->err) sb_printf(b->err, "layer_norm: cannot normalise the last %d ax%s of a rank-%d tensor", nnorm, nnorm == 1 ? "is" : "es", r);
        return IR_NONE;
    }
    uint64_t axes = ((UINT64_C(1) << nnorm) - 1) << (r - nnorm);
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    NodeId m = comp_mean(b, x, axes, true);
    TRY(m);
    NodeId d = ir_b_binary(b, OP_SUB, x, m);
    TRY(d);
    NodeId sq = ir_b_binary(b, OP_MUL, d, d);
    TRY(sq);
    NodeId v = comp_mean(b, sq, axes, true);
    TRY(v);
    NodeId ve = comp_scalar_op(b, OP_ADD, v, eps, false);
    TRY(ve);
    NodeId sd = ir_b_unary(b, OP_SQRT, ve);
    TRY(sd);
    NodeId y = ir_b_binary(b, OP_DIV, d, sd);
    TRY(y);
    if (weight != IR_NONE) {
        y = ir_b_binary(b, OP_MUL, y, weight);
        TRY(y);
    }
    if (bias != IR_NONE) y = ir_b_binary(b, OP_ADD, y, bias);
    return y;
}

NodeId comp_linear(IrBuilder *b, NodeId x, NodeId weight, NodeId bias)
{
    NodeId wt = ir_b_transpose(b, weight, 0, 1);
    TRY(wt);
    NodeId y = ir_b_matmul(b, x, wt);
    TRY(y);
    return bias == IR_NONE ? y : ir_b_binary(b, OP_ADD, y, bias);
}

NodeId comp_conv2d(IrBuilder *b, NodeId x, NodeId w, NodeId bias, const int stride[2], const int pad[2], const int pad_hi[2],
                   const int dilation[2], int groups)
{
    Shape xshape = *shape_of(b, x), wshape = *shape_of(b, w);
    const Shape *xs = &xshape, *ws = &wshape;
    if (xs->rank != 4) {
        if (b->err) {
            sb_puts(b->err, "conv2d: expected an input of shape [N, C, H, W], found ");
            ir_shape_format(b->err, b->g, xs);
        }
        return IR_NONE;
    }
    Dim cin = ws->d[1];
    if (groups > 1 && !ir_dim_mul(cin, ir_dim_const(groups), &cin)) return IR_NONE;
    if (!ir_dim_eq(xs->d[1], cin)) {
        if (b->err) {
            sb_puts(b->err, "conv2d: input channels differ: input ");
            ir_shape_format(b->err, b->g, xs);
            sb_puts(b->err, ", weight ");
            ir_shape_format(b->err, b->g, ws);
        }
        return IR_NONE;
    }
    int64_t kh = ws->d[2].k, kw = ws->d[3].k;
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    int64_t lo[4] = {0, 0, pad[0], pad[1]}, hi[4] = {0, 0, pad_hi[0], pad_hi[1]};
    NodeId xp = ir_b_pad(b, x, lo, hi, 0.0);
    TRY(xp);
    /* im2col + one GEMM per image: [O, C*KH*KW] @ [N, C*KH*KW, L] -> [N, O, L]. */
    NodeId cols = ir_b_unfold(b, xp, (int)kh, (int)kw, stride[0], stride[1], dilation[0], dilation[1]);
    TRY(cols);
    NodeId y;
    if (groups <= 1) {
        Shape wf = ir_shape_make(2, NULL);
        wf.d[0] = ws->d[0];
        wf.d[1] = shape_of(b, cols)->d[1];
        NodeId w2 = ir_b_reshape(b, w, &wf);
        TRY(w2);
        y = ir_b_matmul(b, w2, cols);
        TRY(y);
    } else {
        /* groups: the unfolded rows of group g are contiguous (row c*KH*KW + ...), so one
         * batched product per group, [G, O/G, C/G*KH*KW] @ [N, G, C/G*KH*KW, L] */
        Shape cs = *shape_of(b, cols);
        int64_t kk = cs.d[1].k / groups, og = ws->d[0].k / groups;
        Dim c4[4] = {cs.d[0], ir_dim_const(groups), ir_dim_const(kk), cs.d[2]};
        Dim w3[3] = {ir_dim_const(groups), ir_dim_const(og), ir_dim_const(kk)};
        Shape cs4 = ir_shape_make(4, c4), ws3 = ir_shape_make(3, w3);
        NodeId cg = ir_b_reshape(b, cols, &cs4);
        TRY(cg);
        NodeId wg = ir_b_reshape(b, w, &ws3);
        TRY(wg);
        y = ir_b_matmul(b, wg, cg);
        TRY(y);
        Dim o3[3] = {cs.d[0], ws->d[0], cs.d[2]};
        Shape os3 = ir_shape_make(3, o3);
        y = ir_b_reshape(b, y, &os3);
        TRY(y);
    }
    if (bias != IR_NONE) {
        /* added to the product's [N, O, L] (bias [O, 1]), not to the image it is reshaped
         * into: a broadcast over the product's last two axes is a GEMM epilogue */
        Shape bs = ir_shape_make(2, NULL);
        bs.d[0] = ws->d[0];
        bs.d[1] = ir_dim_const(1);
        NodeId b2 = ir_b_reshape(b, bias, &bs);
        TRY(b2);
        y = ir_b_binary(b, OP_ADD, y, b2);
        TRY(y);
    }
    Shape pshape = *shape_of(b, xp);
    const Shape *ps = &pshape;
    int64_t oh = (ps->d[2].k - (int64_t)dilation[0] * (kh - 1) - 1) / stride[0] + 1;
    int64_t ow = (ps->d[3].k - (int64_t)dilation[1] * (kw - 1) - 1) / stride[1] + 1;
    Shape out = ir_shape_make(4, NULL);
    out.d[0] = xs->d[0];
    out.d[1] = ws->d[0];
    out.d[2] = ir_dim_const(oh);
    out.d[3] = ir_dim_const(ow);
    return ir_b_reshape(b, y, &out);
}

/* Pooling whose windows tile the image (stride = kernel, no padding, the usual 2x2): the
 * windows are axes of a reshape, [N, C, OH, k, OW, k], reduced where they lie — no unfold
 * copy of the windows, and the gradient stays elementwise. Rows and columns past the last
 * whole window are dropped, as PyTorch does. */
static NodeId pool_tiles(IrBuilder *b, NodeId x, bool max, int k)
{
    const Shape *xs = shape_of(b, x);
    int64_t oh = xs->d[2].k / k, ow = xs->d[3].k / k;
    if (oh * k != xs->d[2].k) x = ir_b_slice(b, x, 2, 0, oh * k, 1);
    TRY(x);
    if (ow * k != shape_of(b, x)->d[3].k) x = ir_b_slice(b, x, 3, 0, ow * k, 1);
    TRY(x);
    Shape tiles = ir_shape_make(6, NULL);
    tiles.d[0] = shape_of(b, x)->d[0];
    tiles.d[1] = shape_of(b, x)->d[1];
    tiles.d[2] = ir_dim_const(oh);
    tiles.d[3] = ir_dim_const(k);
    tiles.d[4] = ir_dim_const(ow);
    tiles.d[5] = ir_dim_const(k);
    NodeId t = ir_b_reshape(b, x, &tiles);
    TRY(t);
    uint64_t axes = (uint64_t)1 << 3 | (uint64_t)1 << 5;
    return max ? ir_b_reduce_max_first(b, t, axes, false) : comp_mean(b, t, axes, false);
}

NodeId comp_pool2d(IrBuilder *b, NodeId x, bool max, int k, int stride, int pad)
{
    Shape xshape = *shape_of(b, x);
    const Shape *xs = &xshape;
    const char *what = max ? "MaxPool2d" : "AvgPool2d";
    if (xs->rank != 4) {
        if (b->err) {
            sb_printf(b->err, "%s: expected an input of shape [N, C, H, W], found ", what);
            ir_shape_format(b->err, b->g, xs);
        }
        return IR_NONE;
    }
    if (pad < 0 || pad * 2 > k) {
        if (b->err) sb_printf(b->err, "%s: padding %d must be at most half the kernel size %d", what, pad, k);
        return IR_NONE;
    }
    if (ir_dim_is_const(xs->d[2]) && ir_dim_is_const(xs->d[3]) && (k > xs->d[2].k + 2 * pad || k > xs->d[3].k + 2 * pad)) {
        if (b->err)
            sb_printf(b->err, "%s: kernel %dx%d is larger than the input's %lldx%lld (after padding %d)", what, k, k,
                      (long long)xs->d[2].k, (long long)xs->d[3].k, pad);
        return IR_NONE;
    }
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    if (stride == k && pad == 0 && ir_dim_is_const(xs->d[2]) && ir_dim_is_const(xs->d[3]))
        return pool_tiles(b, x, max, k);
    /* Max pooling pads with -inf so padding never wins; average pooling counts padding
     * as zeros (PyTorch's count_include_pad=True default). */
    int64_t lo[4] = {0, 0, pad, pad}, hi[4] = {0, 0, pad, pad};
    NodeId xp = ir_b_pad(b, x, lo, hi, max ? -INFINITY : 0.0);
    TRY(xp);
    Shape pshape = *shape_of(b, xp);
    const Shape *ps = &pshape;
    Dim nc;
    if (!ir_dim_mul(ps->d[0], ps->d[1], &nc)) return IR_NONE;
    Shape flat = ir_shape_make(4, NULL);
    flat.d[0] = nc;
    flat.d[1] = ir_dim_const(1);
    flat.d[2] = ps->d[2];
    flat.d[3] = ps->d[3];
    NodeId xf = ir_b_reshape(b, xp, &flat);
    TRY(xf);
    NodeId cols = ir_b_unfold(b, xf, k, k, stride, stride, 1, 1);
    TRY(cols);
    NodeId r = max ? ir_b_reduce_max_first(b, cols, 2, false) : comp_mean(b, cols, 2, false);
    TRY(r);
    int64_t oh = (ps->d[2].k - k) / stride + 1, ow = (ps->d[3].k - k) / stride + 1;
    Shape out = ir_shape_make(4, NULL);
    out.d[0] = xs->d[0];
    out.d[1] = xs->d[1];
    out.d[2] = ir_dim_const(oh);
    out.d[3] = ir_dim_const(ow);
    return ir_b_reshape(b, r, &out);
}

/* Pooling with PyTorch's other options: per-axis kernel, stride, padding and dilation
 * (index 0 height, 1 width), ceil_mode (a last window that starts inside the input or its
 * left padding, the rows past the padded input padded away) and count_include_pad = false
 * (average over the input elements of a window only). The average divides the window sums
 * by the same windows' sums over a [1, 1, H, W] mask of what counts, so every divisor is
 * PyTorch's. */
NodeId comp_pool2d_ex(IrBuilder *b, NodeId x, bool max, const int k[2], const int st[2], const int pad[2], const int dil[2], bool ceil_mode,
                      bool count_pad)
{
    Shape xshape = *shape_of(b, x);
    const char *what = max ? "MaxPool2d" : "AvgPool2d";
    if (xshape.rank != 4 || !ir_dim_is_const(xshape.d[2]) || !ir_dim_is_const(xshape.d[3])) {
        if (b->err) {
            sb_printf(b->err, "%s: expected an input of shape [N, C, H, W] with a fixed height and width, found ", what);
            ir_shape_format(b->err, b->g, &xshape);
        }
        return IR_NONE;
    }
    int64_t out[2], extra[2];
    for (int i = 0; i < 2; i++) {
        int64_t n = xshape.d[2 + i].k, span = (int64_t)dil[i] * (k[i] - 1) + 1;
        if (pad[i] < 0 || pad[i] * 2 > k[i]) {
            if (b->err) sb_printf(b->err, "%s: padding %d must be at most half the kernel size %d", what, pad[i], k[i]);
            return IR_NONE;
        }
        int64_t room = n + 2 * pad[i] - span;
        if (room < 0) {
            if (b->err) sb_printf(b->err, "%s: the window (%lld) is larger than the padded input (%lld)", what, (long long)span, (long long)(n + 2 * pad[i]));
            return IR_NONE;
        }
        out[i] = (ceil_mode ? (room + st[i] - 1) / st[i] : room / st[i]) + 1;
        if (ceil_mode && (out[i] - 1) * st[i] >= n + pad[i]) out[i]--;
        extra[i] = (out[i] - 1) * st[i] + span - (n + 2 * pad[i]);
        if (extra[i] < 0) extra[i] = 0;
    }
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    int64_t lo[4] = {0, 0, pad[0], pad[1]}, hi[4] = {0, 0, pad[0] + extra[0], pad[1] + extra[1]};
    NodeId xp = ir_b_pad(b, x, lo, hi, max ? -INFINITY : 0.0);
    TRY(xp);
    Shape ps = *shape_of(b, xp);
    Dim nc;
    if (!ir_dim_mul(ps.d[0], ps.d[1], &nc)) return IR_NONE;
    Dim fd[4] = {nc, ir_dim_const(1), ps.d[2], ps.d[3]};
    Shape flat = ir_shape_make(4, fd);
    NodeId xf = ir_b_reshape(b, xp, &flat);
    TRY(xf);
    NodeId cols = ir_b_unfold(b, xf, k[0], k[1], st[0], st[1], dil[0], dil[1]);
    TRY(cols);
    /* [NC, L]; max pooling's gradient goes to each window's first maximum, as PyTorch's */
    NodeId r = max ? ir_b_reduce_max_first(b, cols, 2, false) : ir_b_reduce(b, OP_REDUCE_SUM, cols, 2, false);
    TRY(r);
    if (!max) {
        Dim md[4] = {ir_dim_const(1), ir_dim_const(1), xshape.d[2], xshape.d[3]};
        Shape ms = ir_shape_make(4, md);
        NodeId ones = ir_b_full(b, 1.0, dtype_of(b, x), &ms);
        TRY(ones);
        int64_t lo2[4] = {0, 0, pad[0], pad[1]}, hi2[4] = {0, 0, pad[0], pad[1]}, z[4] = {0, 0, 0, 0}, hx[4] = {0, 0, extra[0], extra[1]};
        NodeId m = ir_b_pad(b, ones, lo2, hi2, count_pad ? 1.0 : 0.0);
        TRY(m);
        m = ir_b_pad(b, m, z, hx, 0.0);
        TRY(m);
        NodeId mc = ir_b_unfold(b, m, k[0], k[1], st[0], st[1], dil[0], dil[1]);
        TRY(mc);
        NodeId cnt = ir_b_reduce(b, OP_REDUCE_SUM, mc, 2, false); /* [1, L] */
        TRY(cnt);
        r = ir_b_binary(b, OP_DIV, r, cnt);
        TRY(r);
    }
    Dim od[4] = {xshape.d[0], xshape.d[1], ir_dim_const(out[0]), ir_dim_const(out[1])};
    Shape os = ir_shape_make(4, od);
    return ir_b_reshape(b, r, &os);
}
