/* attention.c — attention.h: attention recognised in primitive ops.
 *
 * From each matmul(P, V) backwards: P is softmax over its last axis as the frontend
 * expands it (e / expand(reduce_sum(e)), e = exp(x - expand(detach(reduce_max(x))))),
 * possibly after dropout (where(random >= p, x, 0) * 1/(1-p)); x is the scores, possibly
 * masked (where(keep, s, -inf), where(drop, -inf, s), or s + mask) and scaled by constants
 * (before or after the product, multiplied or divided); the scores are matmul(Q, Kᵀ) with
 * Kᵀ a transpose of the last two axes of K. K and V may repeat fewer heads (GQA:
 * reshape(expand(reshape(k)))). Anything else between these steps, or a softmax over
 * another axis, and it is not attention: the match is declined. Mixed precision's casts
 * between float types are seen through. */
#include "attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const Node *node(const Graph *g, NodeId i) { return &g->nodes[i]; }
static int op(const Graph *g, NodeId i) { return i == IR_NONE ? -1 : g->nodes[i].op; }
static NodeId in(const Graph *g, NodeId i, int k) { return ir_input(g, i, k); }

/* Through reshape and expand (a broadcast constant or mask). */
static NodeId unbroadcast(const Graph *g, NodeId i)
{
    while (op(g, i) == OP_RESHAPE || op(g, i) == OP_EXPAND) i = in(g, i, 0);
    return i;
}

/* Through the precision pass's casts between float types (mixed precision's half copies). */
static NodeId uncast(const Graph *g, NodeId i)
{
    while (op(g, i) == OP_CAST && ir_dtype_is_float((DType)node(g, i)->dtype) && ir_dtype_is_float((DType)node(g, in(g, i, 0))->dtype)) i = in(g, i, 0);
    return i;
}

/* A constant's value (through broadcasts): false when i is not one. */
static bool constant(const Graph *g, NodeId i, double *value)
{
    i = unbroadcast(g, i);
    if (op(g, i) != OP_CONST) return false;
    *value = node(g, i)->fattr[0];
    return true;
}

/* The last axis of a reduction with keepdim, alone. */
static bool reduces_last(const Graph *g, NodeId r)
{
    const int rank = node(g, r)->shape.rank;
    return rank > 0 && ir_attrs(g, r)[0] == (int64_t)(UINT64_C(1) << (rank - 1));
}

/* softmax(x) over the last axis, as comp_softmax writes it: x, or IR_NONE. */
static NodeId softmax_input(const Graph *g, NodeId p)
{
    if (op(g, p) != OP_DIV) return IR_NONE;
    const NodeId e = in(g, p, 0), sum = in(g, p, 1);
    if (op(g, e) != OP_EXP || op(g, sum) != OP_EXPAND || op(g, in(g, sum, 0)) != OP_REDUCE_SUM) return IR_NONE;
    const NodeId rs = in(g, sum, 0);
    if (in(g, rs, 0) != e || !reduces_last(g, rs)) return IR_NONE;
    const NodeId z = in(g, e, 0);
    if (op(g, z) != OP_SUB) return IR_NONE;
    const NodeId x = in(g, z, 0), mx = in(g, z, 1);
    if (op(g, mx) != OP_EXPAND || op(g, in(g, mx, 0)) != OP_DETACH) return IR_NONE;
    const NodeId rm = in(g, in(g, mx, 0), 0);
    if (op(g, rm) != OP_REDUCE_MAX || in(g, rm, 0) != x || !reduces_last(g, rm)) return IR_NONE;
    return x;
}

/* dropout(x, p) as comp_dropout writes it: x with *rate set, else p itself. */
static NodeId undropout(const Graph *g, NodeId p, double *rate, NodeId *random)
{
    double f, zero, at;
    if (op(g, p) != OP_MUL || !constant(g, in(g, p, 1), &f)) return p;
    const NodeId w = in(g, p, 0);
    if (op(g, w) != OP_WHERE || !constant(g, in(g, w, 2), &zero) || zero != 0) return p;
    const NodeId keep = in(g, w, 0);
    if (op(g, keep) != OP_GE || op(g, in(g, keep, 0)) != OP_RANDOM_UNIFORM || !constant(g, in(g, keep, 1), &at)) return p;
    if (at <= 0 || at >= 1 || fabs(f * (1 - at) - 1) > 1e-6) return p;
    *rate = at;
    *random = in(g, keep, 0);
    return in(g, w, 1);
}

/* The axis, counted from the end (-1: the last), along which a position index varies: an
 * iota (through broadcasts), or a 1-D iota (arange) reshaped with one axis not of size 1;
 * 0 when n is neither. */
static int varies_along(const Graph *g, NodeId n)
{
    while (op(g, n) == OP_EXPAND) n = in(g, n, 0);
    if (op(g, n) == OP_IOTA) return (int)ir_attrs(g, n)[0] - node(g, n)->shape.rank;
    if (op(g, n) != OP_RESHAPE || op(g, in(g, n, 0)) != OP_IOTA || node(g, in(g, n, 0))->shape.rank != 1) return 0;
    const Shape *s = &node(g, n)->shape;
    int axis = 0, count = 0;
    for (int i = 0; i < s->rank; i++)
        if (!ir_dim_is_const(s->d[i]) || s->d[i].k != 1) axis = i - s->rank, count++;
    return count == 1 ? axis : 0;
}

/* Whether a bool mask (through broadcasts) compares the query's position i (axis -2) with
 * the key's j (axis -1) so that it is true where j <= i (keep) or, drop, where j > i. */
static bool causal_compare(const Graph *g, NodeId m, bool drop)
{
    m = unbroadcast(g, m);
    const int o = op(g, m);
    if (drop && o == OP_NOT) return causal_compare(g, in(g, m, 0), false);
    if (o != OP_GE && o != OP_LE && o != OP_GT && o != OP_LT) return false;
    const int a = varies_along(g, in(g, m, 0)), b = varies_along(g, in(g, m, 1));
    if (!drop) return (o == OP_GE && a == -2 && b == -1) || (o == OP_LE && a == -1 && b == -2); /* i >= j, j <= i */
    return (o == OP_GT && a == -1 && b == -2) || (o == OP_LT && a == -2 && b == -1);             /* j > i, i < j */
}

static bool causal(const Graph *g, NodeId m) { return causal_compare(g, m, false); }
static bool causal_drop(const Graph *g, NodeId m) { return causal_compare(g, m, true); }

/* The scores with their mask taken off: sets the mask's kind and node. */
static NodeId unmask(const Graph *g, NodeId x, AttentionMatch *m)
{
    double v;
    if (op(g, x) == OP_WHERE) {
        const NodeId c = in(g, x, 0), a = in(g, x, 1), b = in(g, x, 2);
        if (constant(g, b, &v) && isinf(v) && v < 0) { /* where(keep, s, -inf) */
            m->mask = causal(g, c) ? ATTN_MASK_CAUSAL : ATTN_MASK_KEEP;
            m->mask_node = m->mask == ATTN_MASK_KEEP ? unbroadcast(g, c) : IR_NONE;
            return a;
        }
        if (constant(g, a, &v) && isinf(v) && v < 0) { /* masked_fill(s, drop, -inf) */
            if (causal_drop(g, c)) m->mask = ATTN_MASK_CAUSAL, m->mask_node = IR_NONE;
            else m->mask = ATTN_MASK_DROP, m->mask_node = unbroadcast(g, c);
            return b;
        }
        return IR_NONE;
    }
    if (op(g, x) == OP_ADD) { /* s + mask: the mask is the operand that is not a scaled product */
        const NodeId a = in(g, x, 0), b = in(g, x, 1);
        const bool a_scores = op(g, a) == OP_MATMUL || op(g, a) == OP_MUL || op(g, a) == OP_DIV;
        m->mask = ATTN_MASK_ADD;
        m->mask_node = unbroadcast(g, a_scores ? b : a);
        return a_scores ? a : b;
    }
    m->mask = ATTN_MASK_NONE;
    m->mask_node = IR_NONE;
    return x;
}

/* x times or divided by constants: x, the factor multiplied into *scale. */
static NodeId unscale(const Graph *g, NodeId x, double *scale)
{
    for (;;) {
        double c;
        if (op(g, x) == OP_MUL && constant(g, in(g, x, 1), &c)) *scale *= c, x = in(g, x, 0);
        else if (op(g, x) == OP_MUL && constant(g, in(g, x, 0), &c)) *scale *= c, x = in(g, x, 1);
        else if (op(g, x) == OP_DIV && constant(g, in(g, x, 1), &c) && c != 0) *scale /= c, x = in(g, x, 0);
        else return x;
    }
}

/* Kᵀ as a permute that moves its operand's last axis (the head size) to the second last:
 * K = the operand laid out by the permutation with its last two entries swapped
 * (simplify merges a transpose of the heads with kᵀ's). Its operand, or IR_NONE. */
static NodeId untranspose(const Graph *g, NodeId t)
{
    if (op(g, t) != OP_PERMUTE || node(g, t)->shape.rank < 2) return IR_NONE;
    const int r = node(g, t)->shape.rank;
    const int64_t *p = ir_attrs(g, t);
    return p[r - 2] == r - 1 ? in(g, t, 0) : IR_NONE; /* the head size is the operand's last axis, as in k.transpose(-2, -1) */
}

/* k or v [B, H, S, D] repeating the heads of [B, KVH, S, D] (llama's repeat_kv:
 * reshape(expand(reshape(x, [B, KVH, 1, S, D]), [B, KVH, G, S, D]), [B, H, S, D])): the
 * fewer heads, else x. */
static NodeId unrepeat(const Graph *g, NodeId x)
{
    if (op(g, x) != OP_RESHAPE || op(g, in(g, x, 0)) != OP_EXPAND || op(g, in(g, in(g, x, 0), 0)) != OP_RESHAPE) return x;
    const NodeId inner = in(g, in(g, in(g, x, 0), 0), 0);
    const Shape *s = &node(g, x)->shape, *k = &node(g, inner)->shape;
    if (s->rank != k->rank || s->rank < 3) return x;
    const int h = s->rank - 3; /* the heads' axis */
    if (!ir_dim_is_const(s->d[h]) || !ir_dim_is_const(k->d[h]) || k->d[h].k <= 0 || s->d[h].k % k->d[h].k) return x;
    return inner;
}

static bool match(const Graph *g, NodeId out, AttentionMatch *m)
{
    memset(m, 0, sizeof *m);
    if (op(g, out) != OP_MATMUL || node(g, out)->shape.rank < 2) return false;
    m->out = out;
    m->v = in(g, out, 1);
    m->random = IR_NONE;
    NodeId p = undropout(g, uncast(g, in(g, out, 0)), &m->dropout, &m->random);
    const NodeId x = softmax_input(g, p);
    if (x == IR_NONE) return false;
    m->probs = in(g, out, 0);
    m->scale = 1;
    NodeId s = unmask(g, x, m);
    if (s == IR_NONE) return false;
    s = uncast(g, unscale(g, uncast(g, s), &m->scale));
    if (op(g, s) != OP_MATMUL) return false;
    m->scores = s;
    NodeId q = uncast(g, in(g, s, 0)), kt = uncast(g, in(g, s, 1));
    q = uncast(g, unscale(g, q, &m->scale));
    kt = uncast(g, unscale(g, kt, &m->scale));
    const NodeId k = untranspose(g, kt);
    if (k == IR_NONE) return false;
    m->q = q, m->kt = kt, m->k = k;
    m->k_heads = unrepeat(g, k), m->v_heads = unrepeat(g, m->v);
    /* the shapes: q [..., T, D], kᵀ [..., D, S], v [..., S, Dv] */
    const Shape *qs = &node(g, q)->shape, *ks = &node(g, kt)->shape, *vs = &node(g, m->v)->shape;
    if (qs->rank != ks->rank || qs->rank != vs->rank) return false;
    const int r = qs->rank;
    m->heads = r >= 3 && ir_dim_is_const(qs->d[r - 3]) ? qs->d[r - 3].k : 1;
    const Shape *kh = &node(g, m->k_heads)->shape;
    m->kv_heads = r >= 3 && ir_dim_is_const(kh->d[r - 3]) ? kh->d[r - 3].k : m->heads;
    if (m->mask == ATTN_MASK_ADD && !ir_dtype_is_float((DType)node(g, m->mask_node)->dtype)) return false;
    return true;
}

int attention_find(const Graph *g, AttentionMatch **out)
{
    *out = NULL;
    int n = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        AttentionMatch m;
        if (g->nodes[i].op != OP_MATMUL || !match(g, i, &m)) continue;
        *out = xrealloc(*out, (size_t)(n + 1) * sizeof **out);
        (*out)[n++] = m;
    }
    return n;
}
