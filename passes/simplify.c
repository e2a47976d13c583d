/* simplify.c — constant folding, algebraic identities, CSE and dead-node elimination.
 *
 * Requires: a verified graph. Guarantees: an equivalent verified graph (the interpreter
 * gives the same outputs on every input) whose nodes are renumbered densely in the same
 * topological order; no node is unreachable from an output; no two nodes compute the same
 * value. The rewrites:
 *   folding      unary ops, casts, reshape/expand of a constant fill, and binary ops of two
 *                fills become one fill (`const 2.0 : f32[B, 10]`)
 *   identities   x + 0, x - 0, x * 1, x / 1, 0 + x, 1 * x -> x; neg(neg(x)) -> x;
 *                cast/reshape/expand/permute to what x already is -> x;
 *                reshape(reshape(x)) -> reshape(x); permute(permute(x)) -> one permute
 *                (or x); expand(expand(x)) -> expand(x)
 *   concat       pad(a) + pad(b) with zeros over adjacent ranges of one axis ->
 *                pad(concat(a, b)) (the gradient of split)
 *   transposes   permute(a @ b) swapping the last two axes, where nothing else reads the
 *                product -> permute(b) @ permute(a): BLAS reads the operands transposed in
 *                place (fusion's strided views) instead of a kernel copying the product
 *   CSE          identical op, dtype, shape, operands and attributes -> one node
 *   DCE          drop nodes no output depends on
 * x * 0 is not folded: it is NaN when x is inf or NaN, and Kiln keeps IEEE semantics.
 * It runs a forward sweep building a new graph (operands always precede their users, so
 * every operand is already rewritten), then a reverse sweep for liveness. */
#include "passes.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *in;
    int32_t *uses;    /* per old node: readers, outputs counted */
    Graph *out;
    NodeId *map;      /* old id -> new id */
    NodeId *table;    /* open-addressing hash of new nodes for CSE */
    size_t tcap;
} Simp;

static uint64_t mix(uint64_t h, uint64_t v) { return (h ^ v) * UINT64_C(0x100000001b3); }

static uint64_t node_hash(const Graph *g, NodeId id)
{
    const Node *n = &g->nodes[id];
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    h = mix(h, n->op);
    h = mix(h, n->dtype);
    h = mix(h, n->shape.rank);
    for (int i = 0; i < n->shape.rank; i++) {
        h = mix(h, (uint64_t)n->shape.d[i].k);
        for (int s = 0; s < n->shape.d[i].nsym; s++) h = mix(h, n->shape.d[i].sym[s]);
    }
    for (uint32_t i = 0; i < n->ninputs; i++) h = mix(h, (uint64_t)ir_input(g, id, (int)i));
    for (uint32_t i = 0; i < n->nattrs; i++) h = mix(h, (uint64_t)ir_attrs(g, id)[i]);
    /* Inputs and parameters differ by name alone: without it every same-shape parameter
     * (a stack of identical layers) would share one probe chain, and CSE be quadratic. */
    if (n->op == OP_INPUT || n->op == OP_PARAM) h = mix(h, n->name);
    uint64_t f[2];
    memcpy(f, n->fattr, sizeof f);
    h = mix(mix(h, f[0]), f[1]);
    /* The multiply carries only upward, and the table takes the low bits: fold the high
     * bits down (MurmurHash3's finaliser) so that values differing above them spread. */
    h ^= h >> 33;
    h *= UINT64_C(0xff51afd7ed558ccd);
    h ^= h >> 33;
    return h;
}

static bool same_node(const Graph *g, NodeId a, NodeId b)
{
    const Node *x = &g->nodes[a], *y = &g->nodes[b];
    if (x->op != y->op || x->dtype != y->dtype || x->ninputs != y->ninputs || x->nattrs != y->nattrs) return false;
    if (!ir_shape_eq(&x->shape, &y->shape) || memcmp(x->fattr, y->fattr, sizeof x->fattr)) return false;
    if (x->ninputs && memcmp(ir_inputs(g, a), ir_inputs(g, b), x->ninputs * sizeof(NodeId))) return false;
    if (x->nattrs && memcmp(ir_attrs(g, a), ir_attrs(g, b), x->nattrs * sizeof(int64_t))) return false;
    /* Inputs and parameters are distinct by name even when everything else matches. */
    if ((x->op == OP_INPUT || x->op == OP_PARAM) && x->name != y->name) return false;
    return true;
}

static void table_grow(Simp *s);

/* Returns an existing equal node, or registers id and returns it. */
static NodeId cse(Simp *s, NodeId id)
{
    Graph *g = s->out;
    if ((size_t)g->nnodes * 2 >= s->tcap) table_grow(s);
    size_t mask = s->tcap - 1, h = (size_t)node_hash(g, id) & mask;
    while (s->table[h] != IR_NONE) {
        if (same_node(g, s->table[h], id)) return s->table[h];
        h = (h + 1) & mask;
    }
    s->table[h] = id;
    return id;
}

static void table_grow(Simp *s)
{
    NodeId *old = s->table;
    size_t oldcap = s->tcap;
    s->tcap = oldcap ? oldcap * 2 : 1024;
    s->table = xmalloc(s->tcap * sizeof *s->table);
    for (size_t i = 0; i < s->tcap; i++) s->table[i] = IR_NONE;
    size_t mask = s->tcap - 1;
    for (size_t i = 0; i < oldcap; i++) {
        if (old[i] == IR_NONE) continue;
        size_t h = (size_t)node_hash(s->out, old[i]) & mask;
        while (s->table[h] != IR_NONE) h = (h + 1) & mask;
        s->table[h] = old[i];
    }
    free(old);
}

static bool is_fill(const Graph *g, NodeId id, double *v)
{
    if (g->nodes[id].op != OP_CONST) return false;
    *v = g->nodes[id].fattr[0];
    return true;
}

static bool is_fill_of(const Graph *g, NodeId id, double want)
{
    double v;
    return is_fill(g, id, &v) && v == want;
}

/* Folding uses the interpreter's own elementwise semantics, so a folded constant is exactly
 * the value the unfolded graph computes. Integer division is not folded: the interpreter
 * checks it for zero at run time. */
static double fold_value(Op op, DType t, double x, double y, bool binary)
{
    double r = binary ? interp_binary(op, x, y) : interp_unary(op, x);
    interp_normalise(t, &r, 1);
    return r;
}

static NodeId emit_fill(Simp *s, double v, DType t, const Shape *shape, Loc loc)
{
    NodeId id = ir_add_node(s->out, OP_CONST, t, shape, NULL, 0, NULL, 0, loc);
    s->out->nodes[id].fattr[0] = v;
    return cse(s, id);
}

static bool swaps_last_two(const int64_t *perm, int rank)
{
    if (rank < 2 || perm[rank - 1] != rank - 2 || perm[rank - 2] != rank - 1) return false;
    for (int k = 0; k < rank - 2; k++)
        if (perm[k] != k) return false;
    return true;
}

/* permute(x, perm) in the new graph: x itself for the identity, one permute for a permute
 * of a permute. */
static NodeId emit_permute(Simp *s, NodeId x, const int64_t *perm, int rank, Loc loc)
{
    Graph *o = s->out;
    const Node *xn = &o->nodes[x];
    bool identity = true;
    for (int k = 0; k < rank; k++) identity &= perm[k] == (int64_t)k;
    if (identity) return x;
    NodeId inner = x;
    int64_t comp[IR_MAX_RANK];
    memcpy(comp, perm, (size_t)rank * sizeof *comp);
    if (xn->op == OP_PERMUTE) {
        /* permute(permute(z, p), q)[i] = z[p[q[i]]] */
        inner = ir_input(o, x, 0);
        const int64_t *p = ir_attrs(o, x);
        bool id2 = true;
        for (int k = 0; k < rank; k++) {
            comp[k] = p[perm[k]];
            id2 &= comp[k] == (int64_t)k;
        }
        if (id2) return inner;
    }
    Shape sh = o->nodes[inner].shape;
    for (int k = 0; k < rank; k++) sh.d[k] = o->nodes[inner].shape.d[comp[k]];
    return cse(s, ir_add_node(o, OP_PERMUTE, (DType)xn->dtype, &sh, &inner, 1, comp, rank, loc));
}

/* The axis a zero pad pads (along one axis only, by constants), or -1. */
static int pad_axis(const Graph *o, NodeId id, int64_t *lo, int64_t *hi, int64_t *len)
{
    const Node *n = &o->nodes[id];
    if (n->op != OP_PAD || n->fattr[0] != 0.0) return -1;
    const int64_t *a = ir_attrs(o, id);
    int r = n->shape.rank, axis = -1;
    for (int k = 0; k < r; k++)
        if (a[k] || a[r + k]) {
            if (axis >= 0 || a[k] < 0 || a[r + k] < 0) return -1;
            axis = k;
        }
    if (axis < 0) return -1;
    Dim d = o->nodes[ir_input(o, id, 0)].shape.d[axis];
    if (d.nsym) return -1;
    *lo = a[axis], *hi = a[r + axis], *len = d.k;
    return axis;
}

/* pad(a) + pad(b) with zeros, where a and b fill adjacent ranges of one axis, is a pad of
 * concat(a, b) (or the concat itself): one copy instead of two padded ones and an add,
 * as autodiff writes the gradient of split (attention's q, k, v). Nested concats on the
 * same axis flatten. */
static NodeId sum_of_pads(Simp *s, NodeId x, NodeId y, Loc loc)
{
    Graph *o = s->out;
    int64_t lo1, hi1, n1, lo2, hi2, n2;
    int ax = pad_axis(o, x, &lo1, &hi1, &n1);
    if (ax < 0 || pad_axis(o, y, &lo2, &hi2, &n2) != ax) return IR_NONE;
    if (lo2 < lo1) {
        NodeId t = x;
        x = y, y = t;
        int64_t q;
        q = lo1, lo1 = lo2, lo2 = q;
        q = hi1, hi1 = hi2, hi2 = q;
        q = n1, n1 = n2, n2 = q;
    }
    if (lo1 + n1 != lo2) return IR_NONE;
    NodeId parts[64];
    int np = 0;
    NodeId halves[2] = {ir_input(o, x, 0), ir_input(o, y, 0)};
    for (int h = 0; h < 2; h++) {
        NodeId v = halves[h];
        const Node *vn = &o->nodes[v];
        if (vn->op == OP_CONCAT && ir_attrs(o, v)[0] == ax && np + (int)vn->ninputs <= 64) {
            for (uint32_t k = 0; k < vn->ninputs; k++) parts[np++] = ir_input(o, v, (int)k);
        } else {
            if (np == 64) return IR_NONE;
            parts[np++] = v;
        }
    }
    const Node *xn = &o->nodes[x];
    Shape cs = xn->shape;
    cs.d[ax] = ir_dim_const(n1 + n2);
    int64_t axis = ax;
    NodeId cat = cse(s, ir_add_node(o, OP_CONCAT, (DType)xn->dtype, &cs, parts, np, &axis, 1, loc));
    if (lo1 == 0 && hi2 == 0) return cat;
    int r = xn->shape.rank;
    int64_t pads[2 * IR_MAX_RANK] = {0};
    pads[ax] = lo1;
    pads[r + ax] = hi2;
    NodeId pad = ir_add_node(o, OP_PAD, (DType)xn->dtype, &xn->shape, &cat, 1, pads, 2 * r, loc);
    o->nodes[pad].fattr[0] = 0.0;
    return cse(s, pad);
}

/* Tries the rewrites for old node `old` (n) whose operands are already mapped to ins[];
 * returns the new node it becomes, or IR_NONE to copy it unchanged. */
static NodeId rewrite(Simp *s, NodeId old, const Node *n, const NodeId *ins, const int64_t *attrs)
{
    Graph *o = s->out;
    Op op = (Op)n->op;
    DType t = (DType)n->dtype;
    unsigned flags = ir_op_info[op].flags;
    double v0, v1;
    NodeId x = n->ninputs > 0 ? ins[0] : IR_NONE, y = n->ninputs > 1 ? ins[1] : IR_NONE;
    const Node *xn = x != IR_NONE ? &o->nodes[x] : NULL;
    bool same_as_x = xn && xn->dtype == t && ir_shape_eq(&xn->shape, &n->shape);

    if ((flags & OPF_UNARY) && is_fill(o, x, &v0)) return emit_fill(s, fold_value(op, t, v0, 0, false), t, &n->shape, n->loc);
    if ((op == OP_RESHAPE || op == OP_EXPAND) && is_fill(o, x, &v0)) return emit_fill(s, v0, t, &n->shape, n->loc);
    if ((flags & OPF_BINARY) && is_fill(o, x, &v0) && is_fill(o, y, &v1) && !(op == OP_DIV && !ir_dtype_is_float(t)))
        return emit_fill(s, fold_value(op, t, v0, v1, true), t, &n->shape, n->loc);
    switch (op) {
    case OP_ADD: {
        if (is_fill_of(o, y, 0.0)) return x;
        if (is_fill_of(o, x, 0.0)) return y;
        NodeId r = sum_of_pads(s, x, y, n->loc);
        if (r != IR_NONE) return r;
        break;
    }
    case OP_SUB:
        if (is_fill_of(o, y, 0.0)) return x;
        break;
    case OP_MUL:
        if (is_fill_of(o, y, 1.0)) return x;
        if (is_fill_of(o, x, 1.0)) return y;
        break;
    case OP_DIV:
        if (ir_dtype_is_float(t) && is_fill_of(o, y, 1.0)) return x;
        break;
    case OP_NEG:
        if (xn->op == OP_NEG) return ir_input(o, x, 0);
        break;
    case OP_CAST:
    case OP_EXPAND:
        if (same_as_x) return x;
        if (op == OP_EXPAND && xn->op == OP_EXPAND) {
            NodeId inner = ir_input(o, x, 0);
            return cse(s, ir_add_node(o, OP_EXPAND, t, &n->shape, &inner, 1, NULL, 0, n->loc));
        }
        break;
    case OP_RESHAPE:
        if (same_as_x) return x;
        if (xn->op == OP_RESHAPE) {
            NodeId inner = ir_input(o, x, 0);
            if (ir_shape_eq(&o->nodes[inner].shape, &n->shape)) return inner;
            return cse(s, ir_add_node(o, OP_RESHAPE, t, &n->shape, &inner, 1, NULL, 0, n->loc));
        }
        break;
    case OP_PERMUTE: {
        NodeId m = ir_input(s->in, old, 0);
        if (xn->op == OP_MATMUL && s->uses[m] == 1 && swaps_last_two(attrs, (int)n->nattrs)) {
            /* (a @ b)^T = b^T @ a^T: the transposes become BLAS flags (fusion's strided
             * views) instead of a copy of the product; weight gradients are such */
            NodeId a = emit_permute(s, ir_input(o, x, 1), attrs, (int)n->nattrs, n->loc);
            NodeId b = emit_permute(s, ir_input(o, x, 0), attrs, (int)n->nattrs, n->loc);
            NodeId ab[2] = {a, b};
            return cse(s, ir_add_node(o, OP_MATMUL, t, &n->shape, ab, 2, NULL, 0, n->loc));
        }
        bool identity = true;
        for (uint32_t k = 0; k < n->nattrs; k++) identity &= attrs[k] == (int64_t)k;
        if (identity || xn->op == OP_PERMUTE) return emit_permute(s, x, attrs, (int)n->nattrs, n->loc);
        break;
    }
    default:
        break;
    }
    return IR_NONE;
}

/* Copies the live nodes of g (reachable from outputs) into a fresh graph. */
static Graph *eliminate_dead(const Graph *g)
{
    bool *live = xcalloc((size_t)g->nnodes + 1, sizeof *live);
    for (int32_t k = 0; k < g->noutputs; k++) live[g->outputs[k].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--) {
        if (!live[i]) continue;
        for (uint32_t k = 0; k < g->nodes[i].ninputs; k++) live[ir_input(g, i, (int)k)] = true;
    }
    /* Inputs and parameters stay even when unused: they are the model's interface. */
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_INPUT || g->nodes[i].op == OP_PARAM) live[i] = true;
    Graph *o = ir_graph_new(g->name);
    o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(o, g->files[i]);
    NodeId *map = xmalloc((size_t)g->nnodes * sizeof *map + 1);
    for (NodeId i = 0; i < g->nnodes; i++) {
        map[i] = IR_NONE;
        if (!live[i]) continue;
        const Node *n = &g->nodes[i];
        NodeId ins[64];
        NodeId *in = n->ninputs <= 64 ? ins : xmalloc(n->ninputs * sizeof *in);
        for (uint32_t k = 0; k < n->ninputs; k++) in[k] = map[ir_input(g, i, (int)k)];
        NodeId id = ir_add_node(o, (Op)n->op, (DType)n->dtype, &n->shape, in, (int)n->ninputs, ir_attrs(g, i),
                                (int)n->nattrs, n->loc);
        if (in != ins) free(in);
        Node *m = &o->nodes[id];
        m->fattr[0] = n->fattr[0];
        m->fattr[1] = n->fattr[1];
        m->ckpt = n->ckpt;
        m->flags = n->flags;
        ir_copy_scope(o, id, g, i);
        if (n->name) ir_set_name(o, id, ir_str(g, n->name));
        map[i] = id;
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), map[g->outputs[k].node]);
    free(map);
    free(live);
    return o;
}

void pass_simplify(Graph *g)
{
    Simp s;
    memset(&s, 0, sizeof s);
    s.in = g;
    s.uses = xcalloc((size_t)g->nnodes + 1, sizeof *s.uses);
    for (NodeId i = 0; i < g->nnodes; i++)
        for (uint32_t k = 0; k < g->nodes[i].ninputs; k++) s.uses[ir_input(g, i, (int)k)]++;
    for (int32_t k = 0; k < g->noutputs; k++) s.uses[g->outputs[k].node]++;
    s.out = ir_graph_new(g->name);
    s.out->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(s.out, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(s.out, g->files[i]);
    s.map = xmalloc((size_t)g->nnodes * sizeof *s.map + 1);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        NodeId ins[64];
        NodeId *in = n->ninputs <= 64 ? ins : xmalloc(n->ninputs * sizeof *in);
        for (uint32_t k = 0; k < n->ninputs; k++) in[k] = s.map[ir_input(g, i, (int)k)];
        const NodeId before = s.out->nnodes;
        NodeId r = rewrite(&s, i, n, in, ir_attrs(g, i));
        /* nodes a rewrite made stay in the checkpoint(...) region of the node they replace
         * (remat.c recomputes the region's nodes; a composed permute left outside would keep
         * the region's values alive for the backward pass) */
        for (NodeId q = before; r != IR_NONE && q < s.out->nnodes; q++) {
            if (!s.out->nodes[q].ckpt) s.out->nodes[q].ckpt = n->ckpt;
            if (!s.out->nodes[q].scope) ir_copy_scope(s.out, q, g, i);
            s.out->nodes[q].flags |= n->flags & NODE_BACKWARD; /* and in its pass */
        }
        if (r == IR_NONE) {
            r = ir_add_node(s.out, (Op)n->op, (DType)n->dtype, &n->shape, in, (int)n->ninputs, ir_attrs(g, i), (int)n->nattrs,
                            n->loc);
            Node *m = &s.out->nodes[r];
            m->fattr[0] = n->fattr[0];
            m->fattr[1] = n->fattr[1];
            m->ckpt = n->ckpt;
            m->flags = n->flags;
            ir_copy_scope(s.out, r, g, i);
            if (n->name) ir_set_name(s.out, r, ir_str(g, n->name));
            r = cse(&s, r); /* a duplicate left behind is removed with the dead nodes */
        } else if (n->name && !s.out->nodes[r].name && s.out->nodes[r].op != OP_INPUT && s.out->nodes[r].op != OP_PARAM) {
            ir_set_name(s.out, r, ir_str(g, n->name));
        }
        if (in != ins) free(in);
        s.map[i] = r;
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(s.out, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), s.map[g->outputs[k].node]);
    Graph *live = eliminate_dead(s.out);
    ir_graph_free(s.out);
    free(s.map);
    free(s.table);
    free(s.uses);
    /* Replace g's contents with the result. */
    Graph tmp = *g;
    *g = *live;
    *live = tmp;
    ir_graph_free(live);
}
