/* autodiff.c — reverse-mode differentiation of the loss.
 *
 * Requires: a verified forward graph with one OUT_LOSS output (a float scalar).
 * Guarantees: the graph additionally holds the backward nodes and one OUT_GRAD output per
 * trainable parameter (named like the parameter; a parameter the loss does not depend on
 * gets an explicit zero), and optionally per float input; ir_verify() holds.
 *
 * One vector-Jacobian rule per primitive op, in one switch over the op table. Rules are
 * built from primitive ops through the checked builder, so the backward graph is ordinary
 * IR that simplify, fusion and codegen treat like the forward. Choices at
 * non-differentiable points are documented here and in docs/ir.md:
 *   relu'(0) = 0 (as PyTorch); abs'(0) = 0; sign, comparisons, argmax, iota, random and
 *   integer values have no gradient; max/min of two equal values split the gradient
 *   evenly (as torch.maximum); reduce_max splits it evenly among tied maxima (as
 *   torch.amax), or with its `first` attribute sends it to the first maximal element
 *   (as torch.max(x, dim) and max pooling); pow's gradient w.r.t. the exponent is 0
 *   where the base is <= 0.
 * Broadcasting is explicit in the IR (expand), so undoing it is expand's rule: a sum over
 * the expanded axes. The gradient of checkpoint(f(x)) is that of f(x): regions are only
 * marks on nodes. */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    Graph *g;
    IrBuilder b;
    NodeId *adj;   /* adjoint of each forward node, IR_NONE = zero */
    bool *needs;   /* does the node depend on something we differentiate? */
    int32_t nfwd;
    StrBuf *err;
    bool failed;
} Ad;

static Shape shape_of(Ad *a, NodeId x) { return a->g->nodes[x].shape; }
static DType dtype_of(Ad *a, NodeId x) { return (DType)a->g->nodes[x].dtype; }

/* The builder never fails on well-formed backward graphs; if it does, that is a bug in a
 * rule, reported with the forward node's location rather than crashing. */
static NodeId ok(Ad *a, NodeId n)
{
    if (n == IR_NONE) a->failed = true;
    return n;
}

static NodeId full_like(Ad *a, NodeId x, double v)
{
    Shape s = shape_of(a, x);
    return ok(a, ir_b_full(&a->b, v, dtype_of(a, x), &s));
}

static NodeId bin(Ad *a, Op op, NodeId x, NodeId y)
{
    if (x == IR_NONE || y == IR_NONE) return IR_NONE;
    return ok(a, ir_b_binary(&a->b, op, x, y));
}

static NodeId un(Ad *a, Op op, NodeId x) { return x == IR_NONE ? IR_NONE : ok(a, ir_b_unary(&a->b, op, x)); }

static NodeId cast_to(Ad *a, NodeId x, DType t) { return x == IR_NONE ? IR_NONE : ok(a, ir_b_cast(&a->b, x, t)); }

static NodeId scalar_op(Ad *a, Op op, NodeId x, double v)
{
    return x == IR_NONE ? IR_NONE : bin(a, op, x, full_like(a, x, v));
}

static NodeId where_(Ad *a, NodeId c, NodeId x, NodeId y)
{
    if (c == IR_NONE || x == IR_NONE || y == IR_NONE) return IR_NONE;
    return ok(a, ir_b_where(&a->b, c, x, y));
}

static void accumulate(Ad *a, NodeId target, NodeId contrib)
{
    if (contrib == IR_NONE || !a->needs[target]) return;
    Shape ts = shape_of(a, target), cs = shape_of(a, contrib);
    if (!ir_shape_eq(&ts, &cs) || dtype_of(a, contrib) != dtype_of(a, target)) {
        if (a->err && !a->err->len) sb_printf(a->err, "internal error: gradient of node %%%d has the wrong shape or dtype", target);
        a->failed = true;
        return;
    }
    a->adj[target] = a->adj[target] == IR_NONE ? contrib : bin(a, OP_ADD, a->adj[target], contrib);
}

/* Gradient of a strided slice: put g back at positions start, start+step, ... of a zero
 * tensor of the input's size along `axis`, by interleaving zeros with reshape and pad. */
static NodeId unslice(Ad *a, NodeId g, int axis, int64_t start, int64_t step, int64_t dim)
{
    Shape gs = shape_of(a, g);
    int64_t n = gs.d[axis].k, r = gs.rank;
    NodeId x = g;
    int64_t len = n;
    if (step > 1) {
        if (r + 1 > IR_MAX_RANK) {
            a->failed = true;
            return IR_NONE;
        }
        Shape s1 = ir_shape_make(0, NULL);
        for (int i = 0; i < r; i++) {
            s1.d[s1.rank++] = gs.d[i];
            if (i == axis) s1.d[s1.rank++] = ir_dim_const(1);
        }
        x = ok(a, ir_b_reshape(&a->b, x, &s1));
        int64_t lo[IR_MAX_RANK] = {0}, hi[IR_MAX_RANK] = {0};
        hi[axis + 1] = step - 1;
        x = x == IR_NONE ? IR_NONE : ok(a, ir_b_pad(&a->b, x, lo, hi, 0.0));
        Shape s2 = gs;
        s2.d[axis] = ir_dim_const(n * step);
        x = x == IR_NONE ? IR_NONE : ok(a, ir_b_reshape(&a->b, x, &s2));
        len = n * step;
        if (len > dim - start) {
            x = x == IR_NONE ? IR_NONE : ok(a, ir_b_slice(&a->b, x, axis, 0, dim - start, 1));
            len = dim - start;
        }
    }
    if (x == IR_NONE) return IR_NONE;
    int64_t lo[IR_MAX_RANK] = {0}, hi[IR_MAX_RANK] = {0};
    lo[axis] = start;
    hi[axis] = dim - start - len;
    return ok(a, ir_b_pad(&a->b, x, lo, hi, 0.0));
}

/* The one-hot mask of the first maximal element of x (in row-major order over the reduced
 * axes) for each element of m = reduce_max(x, axes): of the elements equal to m, the one
 * whose negated position is largest. (Where m is NaN no element equals it and every one
 * gets the gradient, which is NaN anyway; x != x in the mask would cost cnn's pooling
 * kernel 2.5x its time, as the compiler no longer vectorizes it.) The negated positions
 * are built by Horner's rule from where(hit, 0, -inf), so that every node reads a value of
 * the kernel that computes the hits and fusion keeps them there, with the reduction, as
 * the second pass of the forward kernel (a chain from iotas alone would start a kernel of
 * its own, in the backward pass). Positions are f32 where they are exact (windows up to
 * 2^24 elements; a symbolic size counts at its largest, which keeps the order), f64 beyond. */
static NodeId first_maximum(Ad *a, NodeId x, NodeId m, uint64_t axes)
{
    Shape xs = shape_of(a, x);
    NodeId me = ok(a, ir_b_expand(&a->b, m, &xs));
    NodeId hit = bin(a, OP_EQ, x, me);
    int64_t count = 1;
    for (int k = 0; k < xs.rank; k++)
        if (axes >> k & 1) {
            int64_t d = ir_dim_max(a->g, xs.d[k]);
            count = d < 1 || count > (INT64_C(1) << 53) / d ? INT64_C(1) << 53 : count * d;
        }
    DType pt = count <= INT64_C(1) << 24 ? DT_F32 : DT_F64;
    NodeId zero = ok(a, ir_b_full(&a->b, 0.0, pt, &xs)), low = ok(a, ir_b_full(&a->b, -INFINITY, pt, &xs));
    NodeId cand = where_(a, hit, zero, low); /* -(i_1 d_2 d_3 ... + i_2 d_3 ... + ... + i_r) */
    bool outer = true;
    for (int k = 0; k < xs.rank && cand != IR_NONE; k++) {
        if (!(axes >> k & 1)) continue;
        if (!outer) cand = scalar_op(a, OP_MUL, cand, (double)ir_dim_max(a->g, xs.d[k]));
        cand = bin(a, OP_SUB, cand, ok(a, ir_b_iota(&a->b, &xs, k, pt)));
        outer = false;
    }
    NodeId best = cand == IR_NONE ? IR_NONE : ok(a, ir_b_reduce(&a->b, OP_REDUCE_MAX, cand, axes, true));
    NodeId beste = best == IR_NONE ? IR_NONE : ok(a, ir_b_expand(&a->b, best, &xs));
    return bin(a, OP_EQ, cand, beste);
}

/* Applies the vector-Jacobian rule of node i with output adjoint g. */
/* The attention_lse of attention node i: its sibling in the forward graph (the attention
 * pass builds one beside every attention), else built here. */
static NodeId attention_lse_of(Ad *a, NodeId i)
{
    const Graph *g = a->g;
    const Node *n = &g->nodes[i];
    for (NodeId j = 0; j < a->nfwd; j++)
        if (g->nodes[j].op == OP_ATTENTION_LSE && ir_same_attention(g, j, i)) return j;
    NodeId ops[4];
    for (uint32_t k = 0; k < n->ninputs && k < 4; k++) ops[k] = ir_input(g, i, (int)k);
    const int64_t *at = ir_attrs(g, i);
    return ok(a, ir_b_attention(&a->b, OP_ATTENTION_LSE, ops, (int)n->ninputs, (AttnMask)at[0], n->fattr[0], n->fattr[1], at[1], 0));
}

/* attention's rule: dq, dk, dv (and an added mask's gradient, when it needs one) by
 * attention_grad from the forward's output and log-sum-exp. */
static void attention_rule(Ad *a, NodeId i, NodeId dout)
{
    const Node n = a->g->nodes[i];
    const int64_t mask = ir_attrs(a->g, i)[0], stream = ir_attrs(a->g, i)[1];
    NodeId ops[7];
    for (uint32_t k = 0; k < n.ninputs && k < 4; k++) ops[k] = ir_input(a->g, i, (int)k);
    const int nin = (int)n.ninputs;
    ops[nin] = i;
    ops[nin + 1] = attention_lse_of(a, i);
    ops[nin + 2] = dout;
    if (a->failed) return;
    for (int w = 0; w < (mask == ATTN_MASK_ADD ? 4 : 3); w++) /* a bool mask has no gradient */
        if (a->needs[ops[w]])
            accumulate(a, ops[w], ok(a, ir_b_attention(&a->b, OP_ATTENTION_GRAD, ops, nin + 3, (AttnMask)mask, n.fattr[0], n.fattr[1], stream, w)));
}

static void backprop(Ad *a, NodeId i)
{
    Node n = a->g->nodes[i]; /* a copy: building nodes may move the array */
    NodeId g = a->adj[i];
    NodeId x = n.ninputs > 0 ? ir_input(a->g, i, 0) : IR_NONE;
    NodeId y = n.ninputs > 1 ? ir_input(a->g, i, 1) : IR_NONE;
    int64_t at[2 * IR_MAX_RANK];
    memcpy(at, ir_attrs(a->g, i), (size_t)n.nattrs * sizeof *at);
    a->b.loc = n.loc;
    a->b.scope = n.scope; /* the backward of the forward node's module */
    a->b.scope_loc = n.scope_loc;
    a->b.scope_type = n.scope_type;
    switch ((Op)n.op) {
    case OP_INPUT:
    case OP_PARAM:
    case OP_CONST:
    case OP_IOTA:
    case OP_RANDOM_UNIFORM:
    case OP_LOSS_SCALE:
        break;
    case OP_NEG: accumulate(a, x, un(a, OP_NEG, g)); break;
    case OP_ABS: accumulate(a, x, bin(a, OP_MUL, g, un(a, OP_SIGN, x))); break;
    case OP_SIGN:
    case OP_DETACH:
    case OP_CHECK_INDEX: /* integer indices */
        break;
    case OP_EXP: accumulate(a, x, bin(a, OP_MUL, g, i)); break;
    case OP_LOG: accumulate(a, x, bin(a, OP_DIV, g, x)); break;
    case OP_SQRT: accumulate(a, x, bin(a, OP_DIV, g, scalar_op(a, OP_MUL, i, 2.0))); break;
    case OP_TANH: {
        NodeId one_minus = bin(a, OP_SUB, full_like(a, i, 1.0), bin(a, OP_MUL, i, i));
        accumulate(a, x, bin(a, OP_MUL, g, one_minus));
        break;
    }
    case OP_SIGMOID: {
        NodeId d = bin(a, OP_MUL, i, bin(a, OP_SUB, full_like(a, i, 1.0), i));
        accumulate(a, x, bin(a, OP_MUL, g, d));
        break;
    }
    case OP_RELU: accumulate(a, x, where_(a, bin(a, OP_GT, x, full_like(a, x, 0.0)), g, full_like(a, g, 0.0))); break;
    case OP_ERF: { /* d erf(x) = 2/sqrt(pi) exp(-x^2) */
        NodeId e = un(a, OP_EXP, un(a, OP_NEG, bin(a, OP_MUL, x, x)));
        accumulate(a, x, bin(a, OP_MUL, g, scalar_op(a, OP_MUL, e, 1.1283791670955126)));
        break;
    }
    case OP_SIN: accumulate(a, x, bin(a, OP_MUL, g, un(a, OP_COS, x))); break;
    case OP_COS: accumulate(a, x, un(a, OP_NEG, bin(a, OP_MUL, g, un(a, OP_SIN, x)))); break;
    case OP_FLOOR: break; /* piecewise constant: zero almost everywhere, as in PyTorch */
    case OP_NOT: break;
    case OP_CAST:
    case OP_ROUND_STOCHASTIC: /* a rounding: as a cast's, the gradient passes to x (none to the noise) */
        if (ir_dtype_is_float(dtype_of(a, x))) accumulate(a, x, cast_to(a, g, dtype_of(a, x)));
        break;
    case OP_ADD:
        accumulate(a, x, g);
        accumulate(a, y, g);
        break;
    case OP_SUB:
        accumulate(a, x, g);
        if (a->needs[y]) accumulate(a, y, un(a, OP_NEG, g));
        break;
    case OP_MUL:
        if (a->needs[x]) accumulate(a, x, bin(a, OP_MUL, g, y));
        if (a->needs[y]) accumulate(a, y, bin(a, OP_MUL, g, x));
        break;
    case OP_DIV:
        if (a->needs[x]) accumulate(a, x, bin(a, OP_DIV, g, y));
        if (a->needs[y]) accumulate(a, y, un(a, OP_NEG, bin(a, OP_DIV, bin(a, OP_MUL, g, i), y)));
        break;
    case OP_MAX:
    case OP_MIN: {
        /* x wins where it is strictly larger (smaller for min); ties split evenly. */
        NodeId wins = cast_to(a, bin(a, n.op == OP_MAX ? OP_GT : OP_LT, x, y), (DType)n.dtype);
        NodeId tie = scalar_op(a, OP_MUL, cast_to(a, bin(a, OP_EQ, x, y), (DType)n.dtype), 0.5);
        NodeId gx = bin(a, OP_MUL, g, bin(a, OP_ADD, wins, tie));
        accumulate(a, x, gx);
        if (a->needs[y]) accumulate(a, y, bin(a, OP_SUB, g, gx));
        break;
    }
    case OP_POW: {
        if (a->needs[x]) {
            NodeId d = bin(a, OP_MUL, y, bin(a, OP_POW, x, scalar_op(a, OP_SUB, y, 1.0)));
            accumulate(a, x, bin(a, OP_MUL, g, d));
        }
        if (a->needs[y]) {
            NodeId pos = bin(a, OP_GT, x, full_like(a, x, 0.0));
            NodeId safe = where_(a, pos, x, full_like(a, x, 1.0));
            NodeId d = bin(a, OP_MUL, i, un(a, OP_LOG, safe));
            accumulate(a, y, where_(a, pos, bin(a, OP_MUL, g, d), full_like(a, g, 0.0)));
        }
        break;
    }
    case OP_EQ:
    case OP_NE:
    case OP_LT:
    case OP_LE:
    case OP_GT:
    case OP_GE:
    case OP_AND:
    case OP_OR:
    case OP_ARGMAX:
        break;
    case OP_WHERE: {
        NodeId c = ir_input(a->g, i, 0), t = ir_input(a->g, i, 1), f = ir_input(a->g, i, 2);
        NodeId zero = full_like(a, g, 0.0);
        if (a->needs[t]) accumulate(a, t, where_(a, c, g, zero));
        if (a->needs[f]) accumulate(a, f, where_(a, c, zero, g));
        break;
    }
    case OP_REDUCE_SUM: {
        Shape xs = shape_of(a, x);
        accumulate(a, x, ok(a, ir_b_expand(&a->b, g, &xs)));
        break;
    }
    case OP_REDUCE_MAX: {
        Shape xs = shape_of(a, x);
        if (n.nattrs == 2) { /* `first`: all of it to the first maximum */
            NodeId first = first_maximum(a, x, i, (uint64_t)at[0]);
            NodeId spread = g == IR_NONE ? IR_NONE : ok(a, ir_b_expand(&a->b, g, &xs));
            accumulate(a, x, where_(a, first, spread, spread == IR_NONE ? IR_NONE : full_like(a, spread, 0.0)));
            break;
        }
        NodeId mask = cast_to(a, bin(a, OP_EQ, x, ok(a, ir_b_expand(&a->b, i, &xs))), (DType)n.dtype);
        NodeId count = mask == IR_NONE ? IR_NONE : ok(a, ir_b_reduce(&a->b, OP_REDUCE_SUM, mask, (uint64_t)at[0], true));
        NodeId share = bin(a, OP_DIV, g, count);
        NodeId spread = share == IR_NONE ? IR_NONE : ok(a, ir_b_expand(&a->b, share, &xs));
        accumulate(a, x, bin(a, OP_MUL, spread, mask));
        break;
    }
    case OP_RESHAPE: {
        Shape xs = shape_of(a, x);
        accumulate(a, x, ok(a, ir_b_reshape(&a->b, g, &xs)));
        break;
    }
    case OP_EXPAND: {
        Shape xs = shape_of(a, x);
        uint64_t axes = 0;
        for (int k = 0; k < xs.rank; k++)
            if (!ir_dim_eq(xs.d[k], n.shape.d[k])) axes |= UINT64_C(1) << k;
        accumulate(a, x, ok(a, ir_b_reduce(&a->b, OP_REDUCE_SUM, g, axes, true)));
        break;
    }
    case OP_PERMUTE: {
        int inv[IR_MAX_RANK];
        for (uint32_t k = 0; k < n.nattrs; k++) inv[at[k]] = (int)k;
        accumulate(a, x, ok(a, ir_b_permute(&a->b, g, inv)));
        break;
    }
    case OP_SLICE: {
        Shape xs = shape_of(a, x);
        int64_t dim = xs.d[at[0]].k;
        accumulate(a, x, unslice(a, g, (int)at[0], at[1], at[3], dim));
        break;
    }
    case OP_CONCAT: {
        int axis = (int)at[0];
        int64_t off = 0;
        for (uint32_t k = 0; k < n.ninputs; k++) {
            NodeId xk = ir_input(a->g, i, (int)k);
            int64_t len = shape_of(a, xk).d[axis].k;
            if (a->needs[xk]) accumulate(a, xk, ok(a, ir_b_slice(&a->b, g, axis, off, off + len, 1)));
            off += len;
        }
        break;
    }
    case OP_PAD: {
        NodeId r = g;
        int rank = n.shape.rank;
        for (int k = 0; k < rank && r != IR_NONE; k++)
            if (at[k] || at[rank + k]) r = ok(a, ir_b_slice(&a->b, r, k, at[k], at[k] + shape_of(a, x).d[k].k, 1));
        accumulate(a, x, r);
        break;
    }
    case OP_GATHER:
        accumulate(a, x, ok(a, ir_b_scatter_add(&a->b, y, g, shape_of(a, x).d[0])));
        break;
    case OP_SCATTER_ADD:
        accumulate(a, y, ok(a, ir_b_gather(&a->b, g, x)));
        break;
    case OP_MATMUL: {
        int r = n.shape.rank;
        if (a->needs[x]) {
            NodeId yt = ok(a, ir_b_transpose(&a->b, y, r - 2, r - 1));
            accumulate(a, x, yt == IR_NONE ? IR_NONE : ok(a, ir_b_matmul(&a->b, g, yt)));
        }
        if (a->needs[y]) {
            NodeId xt = ok(a, ir_b_transpose(&a->b, x, r - 2, r - 1));
            accumulate(a, y, xt == IR_NONE ? IR_NONE : ok(a, ir_b_matmul(&a->b, xt, g)));
        }
        break;
    }
    case OP_UNFOLD: {
        Shape xs = shape_of(a, x);
        accumulate(a, x, ok(a, ir_b_fold(&a->b, g, &xs, (int)at[0], (int)at[1], (int)at[2], (int)at[3], (int)at[4], (int)at[5])));
        break;
    }
    case OP_FOLD:
        accumulate(a, x, ok(a, ir_b_unfold(&a->b, g, (int)at[0], (int)at[1], (int)at[2], (int)at[3], (int)at[4], (int)at[5])));
        break;
    case OP_ATTENTION: attention_rule(a, i, g); break;
    case OP_ATTENTION_LSE:
    case OP_ATTENTION_GRAD:
        /* read only by the backward pass the attention rule builds: no second derivatives */
        if (a->err && !a->err->len)
            sb_printf(a->err, "%s:%u:%u: error: no gradient rule for op '%s' (a value only the backward pass reads)",
                      a->g->nfiles ? a->g->files[0] : "?", n.loc.line, n.loc.col, ir_op_info[n.op].name);
        a->failed = true;
        break;
    case OP_COUNT:
        /* No default: -Wswitch flags a new op without a rule at compile time, and a bad
         * op value is an error naming it, never a silently zero gradient. */
        if (a->err && !a->err->len)
            sb_printf(a->err, "%s:%u:%u: error: no gradient rule for op '%s'", a->g->nfiles ? a->g->files[0] : "?",
                      n.loc.line, n.loc.col, n.op < OP_COUNT ? ir_op_info[n.op].name : "?");
        a->failed = true;
        break;
    }
}

static bool differentiable(const Graph *g, NodeId i, const bool *needs, bool wrt_inputs)
{
    const Node *n = &g->nodes[i];
    if (!ir_dtype_is_float((DType)n->dtype)) return false;
    if (n->op == OP_PARAM) return ir_attrs(g, i)[1] != 0;
    if (n->op == OP_INPUT) return wrt_inputs;
    for (uint32_t k = 0; k < n->ninputs; k++)
        if (needs[ir_input(g, i, (int)k)]) return true;
    return false;
}

int pass_autodiff(Graph *g, const AutodiffOptions *opt, StrBuf *err)
{
    NodeId loss = IR_NONE;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_LOSS) loss = g->outputs[k].node;
    if (loss == IR_NONE) {
        sb_printf(err, "%s: error: the model has no loss to differentiate: add `loss(...) = ...`",
                  g->nfiles ? g->files[0] : g->name);
        return -1;
    }
    Ad a;
    memset(&a, 0, sizeof a);
    a.g = g;
    a.err = err;
    a.nfwd = g->nnodes;
    a.b.g = g;
    a.b.err = err;
    a.adj = xmalloc((size_t)a.nfwd * sizeof *a.adj);
    a.needs = xcalloc((size_t)a.nfwd, sizeof *a.needs);
    for (NodeId i = 0; i < a.nfwd; i++) {
        a.adj[i] = IR_NONE;
        a.needs[i] = differentiable(g, i, a.needs, opt && opt->wrt_inputs);
    }
    if (a.needs[loss]) {
        a.b.loc = g->nodes[loss].loc;
        if (opt && opt->scale_loss && g->nodes[loss].shape.rank == 0) {
            /* d(S * loss)/d(loss) = S: the whole backward pass in scaled units */
            NodeId s = ok(&a, ir_b_loss_scale(&a.b));
            a.adj[loss] = dtype_of(&a, loss) == DT_F32 ? s : cast_to(&a, s, dtype_of(&a, loss));
        } else a.adj[loss] = full_like(&a, loss, 1.0);
    }
    for (NodeId i = a.nfwd - 1; i >= 0 && !a.failed; i--)
        if (a.adj[i] != IR_NONE && a.needs[i]) backprop(&a, i);
    for (NodeId i = 0; i < a.nfwd && !a.failed; i++) {
        const Node *n = &g->nodes[i];
        bool want = (n->op == OP_PARAM && ir_attrs(g, i)[1]) ||
                    (n->op == OP_INPUT && opt && opt->wrt_inputs && ir_dtype_is_float((DType)n->dtype));
        if (!want) continue;
        NodeId grad = a.adj[i];
        if (grad == IR_NONE) {
            /* The loss does not depend on it: an explicit zero, as an optimizer expects. */
            a.b.loc = n->loc;
            a.b.scope = n->scope;
            a.b.scope_loc = n->scope_loc;
            a.b.scope_type = n->scope_type;
            grad = full_like(&a, i, 0.0);
        }
        char *name = xstrdup(ir_node_name(g, i));
        ir_add_output(g, OUT_GRAD, name, grad);
        free(name);
    }
    for (NodeId i = a.nfwd; i < g->nnodes; i++) g->nodes[i].flags |= NODE_BACKWARD;
    free(a.adj);
    free(a.needs);
    if (a.failed) {
        if (!err->len) sb_puts(err, "internal error: autodiff built an invalid node");
        return -1;
    }
    return 0;
}
