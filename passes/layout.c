/* layout.c — strided views: where the elements of a permute, slice or reshape of stored
 * memory lie, so that a matrix product reads them in place (a BLAS transpose, a leading
 * dimension, a stride per batch) instead of a kernel first copying them into a
 * contiguous buffer. Attention's q/k/v slices and head permutes, and every transposed
 * weight or activation of a linear layer and its gradients, are such views.
 *
 * Strides and offsets are products of dims (ir/ir.h), so a layout holds for every value
 * the symbols take at run time; a view whose strides cannot be written that way (a
 * reshape that merges axes that are not adjacent in memory) is not a layout, and fusion
 * keeps a copy kernel for it. A broadcast (expand) has stride 0 along its new axes: a
 * convolution's weight, shared by every image of a batched product, is read once per
 * image instead of being copied B times. */
#include "passes.h"

#include <string.h>

static bool is_one(Dim d) { return d.nsym == 0 && d.k == 1; }

static bool in_chain(const Graph *g, const FusionPlan *p, NodeId id)
{
    Op op = (Op)g->nodes[id].op;
    if (op == OP_RESHAPE || op == OP_DETACH) return true;
    return (op == OP_PERMUTE || op == OP_SLICE || op == OP_EXPAND) && p->role[id] == ROLE_STRIDED;
}

/* Row-major strides of a contiguous shape. */
static bool contiguous(const Shape *s, Dim *st)
{
    Dim acc = ir_dim_const(1);
    for (int a = s->rank - 1; a >= 0; a--) {
        st[a] = acc;
        if (!ir_dim_mul(acc, s->d[a], &acc)) return false;
    }
    return true;
}

/* Strides of reshape x -> y given x's strides: each group of x's axes whose sizes
 * multiply to the sizes of a group of y's axes must be adjacent in memory. */
static bool reshape_strides(const Shape *xs, const Dim *xst, const Shape *ys, Dim *yst)
{
    int xi[IR_MAX_RANK], yi[IR_MAX_RANK], nx = 0, ny = 0;
    for (int a = 0; a < xs->rank; a++)
        if (!is_one(xs->d[a])) xi[nx++] = a;
    for (int a = 0; a < ys->rank; a++) {
        yst[a] = ir_dim_const(0); /* a size-1 axis: its coordinate is always 0 */
        if (!is_one(ys->d[a])) yi[ny++] = a;
    }
    int i = 0, j = 0;
    while (i < nx && j < ny) {
        int i0 = i, j0 = j;
        Dim px = xs->d[xi[i]], py = ys->d[yi[j]], q;
        while (!ir_dim_eq(px, py)) {
            if (ir_dim_div(py, px, &q) && i + 1 < nx) {
                if (!ir_dim_mul(px, xs->d[xi[++i]], &px)) return false;
            } else if (ir_dim_div(px, py, &q) && j + 1 < ny) {
                if (!ir_dim_mul(py, ys->d[yi[++j]], &py)) return false;
            } else {
                return false;
            }
        }
        for (int a = i0; a < i; a++) {
            Dim want;
            if (!ir_dim_mul(xst[xi[a + 1]], xs->d[xi[a + 1]], &want) || !ir_dim_eq(want, xst[xi[a]])) return false;
        }
        yst[yi[j]] = xst[xi[i]];
        for (int b = j - 1; b >= j0; b--)
            if (!ir_dim_mul(yst[yi[b + 1]], ys->d[yi[b + 1]], &yst[yi[b]])) return false;
        i++, j++;
    }
    return i == nx && j == ny;
}

bool fusion_layout(const Graph *g, const FusionPlan *p, NodeId x, FusionLayout *L)
{
    NodeId chain[64];
    int n = 0;
    NodeId id = x;
    while (in_chain(g, p, id)) {
        if (n == 64) return false;
        chain[n++] = id;
        id = ir_input(g, id, 0);
    }
    memset(L, 0, sizeof *L);
    L->base = id;
    const Shape *s = &g->nodes[id].shape;
    L->rank = s->rank;
    if (!contiguous(s, L->stride)) return false;
    for (int c = n - 1; c >= 0; c--) {
        NodeId v = chain[c];
        const Node *nd = &g->nodes[v];
        const int64_t *at = ir_attrs(g, v);
        Dim st[IR_MAX_RANK];
        switch ((Op)nd->op) {
        case OP_DETACH: break;
        case OP_PERMUTE:
            for (int a = 0; a < nd->shape.rank; a++) st[a] = L->stride[at[a]];
            memcpy(L->stride, st, sizeof st);
            break;
        case OP_SLICE: {
            int64_t axis = at[0], start = at[1], step = at[3];
            if (axis < 0 || axis >= nd->shape.rank || start < 0 || step < 1) return false;
            if (start) {
                if (L->nterms == FUSION_LAYOUT_TERMS) return false;
                Dim t = L->stride[axis];
                if (t.k > INT64_MAX / start) return false;
                t.k *= start;
                L->offset[L->nterms++] = t;
            }
            if (L->stride[axis].k > INT64_MAX / step) return false;
            L->stride[axis].k *= step;
            break;
        }
        case OP_EXPAND: { /* a broadcast axis repeats the same elements: stride 0 */
            const Shape *xs = &g->nodes[ir_input(g, v, 0)].shape;
            if (xs->rank != nd->shape.rank) return false;
            for (int a = 0; a < xs->rank; a++)
                if (is_one(xs->d[a]) && !is_one(nd->shape.d[a])) L->stride[a] = ir_dim_const(0);
            break;
        }
        case OP_RESHAPE:
            if (!reshape_strides(&g->nodes[ir_input(g, v, 0)].shape, L->stride, &nd->shape, st)) return false;
            memcpy(L->stride, st, sizeof st);
            break;
        default: return false;
        }
        L->rank = nd->shape.rank;
    }
    return true;
}

bool fusion_gemm_operand(const Graph *g, const FusionLayout *L, NodeId x, bool *trans)
{
    const Shape *s = &g->nodes[x].shape;
    if (s->rank < 2) return false;
    int r = s->rank - 2, c = s->rank - 1;
    Dim unit = ir_dim_const(1), zero = ir_dim_const(0);
    /* the other axis is the leading dimension: BLAS cannot repeat rows (stride 0) */
    if ((is_one(s->d[c]) || ir_dim_eq(L->stride[c], unit)) && (is_one(s->d[r]) || !ir_dim_eq(L->stride[r], zero))) {
        *trans = false;
        return true;
    }
    if ((is_one(s->d[r]) || ir_dim_eq(L->stride[r], unit)) && (is_one(s->d[c]) || !ir_dim_eq(L->stride[c], zero))) {
        *trans = true;
        return true;
    }
    return false;
}

bool fusion_gemm_output(const Graph *g, NodeId mm, NodeId pm, Dim *stride, bool *swapped)
{
    const Shape *ps = &g->nodes[pm].shape, *ms = &g->nodes[mm].shape;
    Dim pst[IR_MAX_RANK];
    if (g->nodes[pm].op != OP_PERMUTE || ms->rank < 2 || !contiguous(ps, pst)) return false;
    const int64_t *perm = ir_attrs(g, pm);
    for (int i = 0; i < ps->rank; i++) stride[perm[i]] = pst[i];
    int r = ms->rank - 2, c = ms->rank - 1;
    Dim unit = ir_dim_const(1);
    if (is_one(ms->d[c]) || ir_dim_eq(stride[c], unit)) {
        *swapped = false;
        return true;
    }
    if (is_one(ms->d[r]) || ir_dim_eq(stride[r], unit)) {
        *swapped = true;
        return true;
    }
    return false;
}

bool fusion_attention_operand(const Graph *g, const FusionLayout *L, NodeId x, bool mask, Dim *st)
{
    const Shape *s = &g->nodes[x].shape;
    const int r = s->rank;
    if (r < 3 || L->rank != r) return false;
    /* the batch axes as one: each axis's stride its inner neighbour's times its size */
    for (int a = 0; a + 1 < r - 3; a++) {
        Dim want;
        if (!is_one(s->d[a]) && (!ir_dim_mul(L->stride[a + 1], s->d[a + 1], &want) || !ir_dim_eq(want, L->stride[a]))) return false;
    }
    st[0] = r > 3 ? L->stride[r - 4] : ir_dim_const(0);
    for (int a = 0; a < 3; a++) st[a + 1] = L->stride[r - 3 + a];
    if (mask) return true;
    /* BLAS rows: unit column stride, a row stride that is not 0 */
    return (is_one(s->d[r - 1]) || ir_dim_eq(st[3], ir_dim_const(1))) && (is_one(s->d[r - 2]) || !ir_dim_eq(st[2], ir_dim_const(0)));
}

bool fusion_is_contiguous(const Graph *g, const FusionLayout *L, NodeId x)
{
    if (L->nterms) return false;
    Dim st[IR_MAX_RANK];
    const Shape *s = &g->nodes[x].shape;
    if (!contiguous(s, st)) return false;
    for (int a = 0; a < s->rank; a++)
        if (!is_one(s->d[a]) && !ir_dim_eq(st[a], L->stride[a])) return false;
    return true;
}

void fusion_layout_format(StrBuf *b, const Graph *g, const FusionLayout *L)
{
    sb_printf(b, "%%%d, strides [", L->base);
    for (int a = 0; a < L->rank; a++) {
        sb_puts(b, a ? ", " : "");
        ir_dim_format(b, g, L->stride[a]);
    }
    sb_puts(b, "]");
    if (!L->nterms) return;
    sb_puts(b, ", offset ");
    for (int t = 0; t < L->nterms; t++) {
        sb_puts(b, t ? " + " : "");
        ir_dim_format(b, g, L->offset[t]);
    }
}
