/* build.c — the checked IR builder. Everything built from user input goes through here:
 * each function validates its operands, inserts the implicit conversions the language
 * promises (NumPy broadcasting as explicit reshape + expand, PyTorch-like dtype promotion)
 * and returns IR_NONE with a message naming both shapes instead of ever building a node
 * that ir_verify() would reject. */
#include "ir.h"

#include <string.h>

static const Node *nd(IrBuilder *b, NodeId id) { return &b->g->nodes[id]; }

static NodeId add(IrBuilder *b, Op op, DType t, const Shape *s, const NodeId *in, int nin,
                  const int64_t *attrs, int nattrs)
{
    NodeId id = ir_add_node(b->g, op, t, s, in, nin, attrs, nattrs, b->loc);
    b->g->nodes[id].ckpt = b->ckpt;
    b->g->nodes[id].scope = b->scope;
    b->g->nodes[id].scope_loc = b->scope_loc;
    b->g->nodes[id].scope_type = b->scope_type;
    return id;
}

static NodeId fail(IrBuilder *b, const char *fmt, ...) KILN_PRINTF(2, 3);
static NodeId fail(IrBuilder *b, const char *fmt, ...)
{
    if (b->err && b->err->len == 0) { /* the first failure is the cause; keep it */
        va_list ap;
        va_start(ap, fmt);
        sb_vprintf(b->err, fmt, ap);
        va_end(ap);
    }
    return IR_NONE;
}

/* Formats a shape into a small rotating set of buffers, for messages naming two shapes. */
static const char *shp(IrBuilder *b, const Shape *s)
{
    static char bufs[4][256];
    static int next;
    StrBuf t;
    sb_init(&t);
    ir_shape_format(&t, b->g, s);
    char *out = bufs[next++ & 3];
    snprintf(out, 256, "%s", t.data);
    sb_free(&t);
    return out;
}

static bool check_size(IrBuilder *b, const Shape *s, const char *what)
{
    if (s->rank > IR_MAX_RANK) {
        fail(b, "%s: rank %d exceeds the maximum of %d", what, s->rank, IR_MAX_RANK);
        return false;
    }
    for (int i = 0; i < s->rank; i++) {
        if (s->d[i].k < 0) {
            fail(b, "%s: negative dimension %lld", what, (long long)s->d[i].k);
            return false;
        }
        int64_t m = ir_dim_max(b->g, s->d[i]);
        if (m < 0 || m > IR_MAX_DIM) {
            fail(b, "%s: dimension %d is too large (the limit is %lld)", what, i, (long long)IR_MAX_DIM);
            return false;
        }
    }
    int64_t n = ir_shape_max_numel(b->g, s);
    if (n < 0 || n > IR_MAX_ELEMENTS) {
        fail(b, "%s: tensor %s has too many elements (the limit is 2^40)", what, shp(b, s));
        return false;
    }
    return true;
}

int ir_b_axis(IrBuilder *b, const char *what, int64_t axis, int rank)
{
    if (axis < -rank || axis >= rank || rank == 0) {
        fail(b, "%s: axis %lld is out of range for a tensor of rank %d", what, (long long)axis, rank);
        return -1;
    }
    return (int)(axis < 0 ? axis + rank : axis);
}

/* ---- leaves ---- */

NodeId ir_b_input(IrBuilder *b, const char *name, DType t, const Shape *s)
{
    if (!check_size(b, s, name)) return IR_NONE;
    NodeId id = add(b, OP_INPUT, t, s, NULL, 0, NULL, 0);
    ir_set_name(b->g, id, name);
    return id;
}

NodeId ir_b_param(IrBuilder *b, const char *name, const Shape *s, InitKind init, double a0, double a1, bool trainable)
{
    return ir_b_param_zero_row(b, name, s, init, a0, a1, trainable, -1);
}

NodeId ir_b_param_zero_row(IrBuilder *b, const char *name, const Shape *s, InitKind init, double a0, double a1, bool trainable,
                           int64_t zero_row)
{
    if (!check_size(b, s, name)) return IR_NONE;
    for (int i = 0; i < s->rank; i++)
        if (!ir_dim_is_const(s->d[i])) return fail(b, "parameter %s: dimensions must be numbers, found %s", name, shp(b, s));
    if (zero_row >= 0 && (s->rank < 1 || zero_row >= s->d[0].k))
        return fail(b, "parameter %s: zero row %lld is outside %s", name, (long long)zero_row, shp(b, s));
    int64_t attrs[3] = {init, trainable, zero_row};
    NodeId id = add(b, OP_PARAM, DT_F32, s, NULL, 0, attrs, zero_row >= 0 ? 3 : 2);
    b->g->nodes[id].fattr[0] = a0;
    b->g->nodes[id].fattr[1] = a1;
    ir_set_name(b->g, id, name);
    return id;
}

NodeId ir_b_full(IrBuilder *b, double v, DType t, const Shape *s)
{
    if (!check_size(b, s, "constant")) return IR_NONE;
    NodeId id = add(b, OP_CONST, t, s, NULL, 0, NULL, 0);
    b->g->nodes[id].fattr[0] = v;
    return id;
}

NodeId ir_b_const(IrBuilder *b, double v, DType t)
{
    Shape s = ir_shape_make(0, NULL);
    return ir_b_full(b, v, t, &s);
}

NodeId ir_b_iota(IrBuilder *b, const Shape *s, int axis, DType t)
{
    if (!check_size(b, s, "arange")) return IR_NONE;
    int64_t a = axis;
    return add(b, OP_IOTA, t, s, NULL, 0, &a, 1);
}

NodeId ir_b_random_uniform(IrBuilder *b, const Shape *s, DType t)
{
    if (!check_size(b, s, "random")) return IR_NONE;
    int64_t stream = ++b->next_stream;
    return add(b, OP_RANDOM_UNIFORM, t, s, NULL, 0, &stream, 1);
}

NodeId ir_b_loss_scale(IrBuilder *b)
{
    Shape s = ir_shape_make(0, NULL);
    return add(b, OP_LOSS_SCALE, DT_F32, &s, NULL, 0, NULL, 0);
}

/* ---- elementwise ---- */

DType ir_promote(DType a, DType b)
{
    if (a == b) return a;
    bool fa = ir_dtype_is_float(a), fb = ir_dtype_is_float(b);
    if (fa && fb) {
        if ((a == DT_F16 && b == DT_BF16) || (a == DT_BF16 && b == DT_F16)) return DT_F32;
        return a > b ? a : b;
    }
    if (fa) return a;
    if (fb) return b;
    return a > b ? a : b; /* bool < u8 < i32 < i64 in enum order */
}

NodeId ir_b_cast(IrBuilder *b, NodeId x, DType t)
{
    if (nd(b, x)->dtype == t) return x;
    Shape s = nd(b, x)->shape;
    return add(b, OP_CAST, t, &s, &x, 1, NULL, 0);
}

NodeId ir_b_unary(IrBuilder *b, Op op, NodeId x)
{
    unsigned f = ir_op_info[op].flags;
    DType t = nd(b, x)->dtype;
    if ((f & OPF_FLOAT) && !ir_dtype_is_float(t)) {
        x = ir_b_cast(b, x, DT_F32);
        t = DT_F32;
    }
    if ((f & OPF_LOGIC) && t != DT_BOOL)
        return fail(b, "%s: expected a bool tensor, found %s", ir_op_info[op].name, ir_dtype_name(t));
    if (op == OP_NEG && t == DT_BOOL) return fail(b, "neg: cannot negate a bool tensor; use 'not'");
    Shape s = nd(b, x)->shape;
    return add(b, op, t, &s, &x, 1, NULL, 0);
}

/* NumPy broadcast of two shapes; false when incompatible. */
static bool broadcast_shapes(const Shape *a, const Shape *c, Shape *out)
{
    int r = a->rank > c->rank ? a->rank : c->rank;
    Shape s = ir_shape_make(r, NULL);
    for (int i = 0; i < r; i++) {
        int ia = a->rank - r + i, ic = c->rank - r + i;
        Dim da = ia >= 0 ? a->d[ia] : ir_dim_const(1);
        Dim dc = ic >= 0 ? c->d[ic] : ir_dim_const(1);
        bool one_a = ir_dim_is_const(da) && da.k == 1, one_c = ir_dim_is_const(dc) && dc.k == 1;
        if (ir_dim_eq(da, dc) || one_c) s.d[i] = da;
        else if (one_a) s.d[i] = dc;
        else return false;
    }
    *out = s;
    return true;
}

NodeId ir_b_expand(IrBuilder *b, NodeId x, const Shape *s)
{
    const Shape *xs = &nd(b, x)->shape;
    if (ir_shape_eq(xs, s)) return x;
    Shape bs;
    if (xs->rank > s->rank || !broadcast_shapes(xs, s, &bs) || !ir_shape_eq(&bs, s))
        return fail(b, "cannot broadcast %s to %s", shp(b, xs), shp(b, s));
    if (xs->rank < s->rank) {
        /* Add leading size-1 dims first, so expand itself is rank-preserving. */
        Shape r = ir_shape_make(s->rank, NULL);
        int lead = s->rank - xs->rank;
        for (int i = 0; i < s->rank; i++) r.d[i] = i < lead ? ir_dim_const(1) : xs->d[i - lead];
        x = ir_b_reshape(b, x, &r);
        if (ir_shape_eq(&r, s)) return x;
    }
    if (!check_size(b, s, "broadcast")) return IR_NONE;
    return add(b, OP_EXPAND, nd(b, x)->dtype, s, &x, 1, NULL, 0);
}

NodeId ir_b_binary(IrBuilder *b, Op op, NodeId x, NodeId y)
{
    unsigned f = ir_op_info[op].flags;
    DType tx = nd(b, x)->dtype, ty = nd(b, y)->dtype;
    DType t = ir_promote(tx, ty);
    if (f & OPF_LOGIC) t = DT_BOOL;
    else if ((f & OPF_FLOAT) && !ir_dtype_is_float(t)) t = DT_F32;
    else if (op == OP_DIV && !ir_dtype_is_float(t)) t = DT_F32; /* true division, like PyTorch */
    else if (t == DT_BOOL && (op == OP_ADD || op == OP_SUB || op == OP_MUL)) t = DT_I64;
    Shape s;
    if (!broadcast_shapes(&nd(b, x)->shape, &nd(b, y)->shape, &s))
        return fail(b, "%s: shapes cannot be broadcast together: %s and %s", ir_op_info[op].name,
                    shp(b, &nd(b, x)->shape), shp(b, &nd(b, y)->shape));
    if (!check_size(b, &s, ir_op_info[op].name)) return IR_NONE;
    x = ir_b_cast(b, x, t);
    y = ir_b_cast(b, y, t);
    x = ir_b_expand(b, x, &s);
    if (x == IR_NONE) return IR_NONE;
    y = ir_b_expand(b, y, &s);
    if (y == IR_NONE) return IR_NONE;
    NodeId in[2] = {x, y};
    return add(b, op, (f & OPF_COMPARE) ? DT_BOOL : t, &s, in, 2, NULL, 0);
}

NodeId ir_b_where(IrBuilder *b, NodeId c, NodeId x, NodeId y)
{
    if (nd(b, c)->dtype != DT_BOOL)
        return fail(b, "where: the condition must be bool (a comparison), found %s", ir_dtype_name(nd(b, c)->dtype));
    Shape s1, s;
    if (!broadcast_shapes(&nd(b, x)->shape, &nd(b, y)->shape, &s1) || !broadcast_shapes(&s1, &nd(b, c)->shape, &s))
        return fail(b, "where: shapes cannot be broadcast together: %s, %s and %s", shp(b, &nd(b, c)->shape),
                    shp(b, &nd(b, x)->shape), shp(b, &nd(b, y)->shape));
    if (!check_size(b, &s, "where")) return IR_NONE;
    DType t = ir_promote(nd(b, x)->dtype, nd(b, y)->dtype);
    NodeId in[3] = {ir_b_expand(b, c, &s), ir_b_expand(b, ir_b_cast(b, x, t), &s), ir_b_expand(b, ir_b_cast(b, y, t), &s)};
    if (in[0] == IR_NONE || in[1] == IR_NONE || in[2] == IR_NONE) return IR_NONE;
    return add(b, OP_WHERE, t, &s, in, 3, NULL, 0);
}

/* ---- reductions ---- */

static NodeId drop_axes(IrBuilder *b, NodeId x, uint64_t axes)
{
    const Shape *xs = &nd(b, x)->shape;
    Shape r = ir_shape_make(0, NULL);
    for (int i = 0; i < xs->rank; i++)
        if (!(axes >> i & 1)) r.d[r.rank++] = xs->d[i];
    return ir_b_reshape(b, x, &r);
}

static NodeId reduce(IrBuilder *b, Op op, NodeId x, uint64_t axes, bool keepdim, bool first)
{
    const Shape *xs = &nd(b, x)->shape;
    if (xs->rank == 0) return x;
    axes &= (UINT64_C(1) << xs->rank) - 1;
    if (!axes) return x;
    if (nd(b, x)->dtype == DT_BOOL) x = ir_b_cast(b, x, op == OP_REDUCE_SUM ? DT_I64 : DT_U8);
    Shape s = nd(b, x)->shape;
    for (int i = 0; i < s.rank; i++)
        if (axes >> i & 1) s.d[i] = ir_dim_const(1);
    int64_t a[2] = {(int64_t)axes, 1};
    NodeId r = add(b, op, nd(b, x)->dtype, &s, &x, 1, a, first ? 2 : 1);
    return keepdim ? r : drop_axes(b, r, axes);
}

NodeId ir_b_reduce(IrBuilder *b, Op op, NodeId x, uint64_t axes, bool keepdim) { return reduce(b, op, x, axes, keepdim, false); }

NodeId ir_b_reduce_max_first(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim)
{
    return reduce(b, OP_REDUCE_MAX, x, axes, keepdim, true);
}

NodeId ir_b_argmax(IrBuilder *b, NodeId x, int axis, bool keepdim)
{
    const Shape *xs = &nd(b, x)->shape;
    axis = ir_b_axis(b, "argmax", axis, xs->rank);
    if (axis < 0) return IR_NONE;
    Shape s = *xs;
    s.d[axis] = ir_dim_const(1);
    int64_t a = axis;
    NodeId r = add(b, OP_ARGMAX, DT_I64, &s, &x, 1, &a, 1);
    return keepdim ? r : drop_axes(b, r, UINT64_C(1) << axis);
}

/* ---- data movement ---- */

NodeId ir_b_reshape(IrBuilder *b, NodeId x, const Shape *s)
{
    const Shape *xs = &nd(b, x)->shape;
    if (ir_shape_eq(xs, s)) return x;
    Dim n1, n2;
    if (!ir_shape_numel(xs, &n1) || !ir_shape_numel(s, &n2) || !ir_dim_eq(n1, n2)) {
        StrBuf t;
        sb_init(&t);
        if (ir_shape_numel(xs, &n1)) ir_dim_format(&t, b->g, n1);
        sb_puts(&t, " vs ");
        if (ir_shape_numel(s, &n2)) ir_dim_format(&t, b->g, n2);
        fail(b, "reshape: cannot reshape %s to %s: element counts differ (%s)", shp(b, xs), shp(b, s), t.data);
        sb_free(&t);
        return IR_NONE;
    }
    if (!check_size(b, s, "reshape")) return IR_NONE;
    /* Reshape of a reshape is one reshape: keeps dumps short and is always valid. */
    if (nd(b, x)->op == OP_RESHAPE) x = ir_input(b->g, x, 0);
    if (ir_shape_eq(&nd(b, x)->shape, s)) return x;
    return add(b, OP_RESHAPE, nd(b, x)->dtype, s, &x, 1, NULL, 0);
}

NodeId ir_b_permute(IrBuilder *b, NodeId x, const int *perm)
{
    const Shape *xs = &nd(b, x)->shape;
    int64_t p[IR_MAX_RANK];
    unsigned seen = 0;
    bool identity = true;
    Shape s = ir_shape_make(xs->rank, NULL);
    for (int i = 0; i < xs->rank; i++) {
        int a = perm[i] < 0 ? perm[i] + xs->rank : perm[i];
        if (a < 0 || a >= xs->rank || (seen >> a & 1)) {
            char list[128];
            size_t o = 0;
            for (int k = 0; k < xs->rank && o + 16 < sizeof list; k++)
                o += (size_t)snprintf(list + o, sizeof list - o, "%s%d", k ? ", " : "", perm[k]);
            list[o] = 0;
            return fail(b, "permute: (%s) is not a permutation of the %d axes of %s", list, xs->rank, shp(b, xs));
        }
        seen |= 1u << a;
        p[i] = a;
        s.d[i] = xs->d[a];
        identity &= a == i;
    }
    if (identity) return x;
    return add(b, OP_PERMUTE, nd(b, x)->dtype, &s, &x, 1, p, xs->rank);
}

NodeId ir_b_transpose(IrBuilder *b, NodeId x, int a0, int a1)
{
    int r = nd(b, x)->shape.rank;
    if (r < 2) return fail(b, "transpose: needs a tensor of rank 2 or more, found %s", shp(b, &nd(b, x)->shape));
    a0 = ir_b_axis(b, "transpose", a0, r);
    if (a0 < 0) return IR_NONE;
    a1 = ir_b_axis(b, "transpose", a1, r);
    if (a1 < 0) return IR_NONE;
    int perm[IR_MAX_RANK];
    for (int i = 0; i < r; i++) perm[i] = i;
    perm[a0] = a1;
    perm[a1] = a0;
    return ir_b_permute(b, x, perm);
}

NodeId ir_b_slice(IrBuilder *b, NodeId x, int axis, int64_t start, int64_t end, int64_t step)
{
    const Shape *xs = &nd(b, x)->shape;
    axis = ir_b_axis(b, "slice", axis, xs->rank);
    if (axis < 0) return IR_NONE;
    Dim d = xs->d[axis];
    if (step < 1) return fail(b, "slice: step must be positive, found %lld", (long long)step);
    Shape s = *xs;
    if (!ir_dim_is_const(d)) {
        if (start == 0 && end == IR_SLICE_END && step == 1) return x;
        StrBuf t;
        sb_init(&t);
        ir_dim_format(&t, b->g, d);
        fail(b, "slice: axis %d has symbolic size %s; only a full slice ':' is supported on it", axis, t.data);
        sb_free(&t);
        return IR_NONE;
    }
    int64_t n = d.k;
    if (start < 0) start += n;
    if (end != IR_SLICE_END && end < 0) end += n;
    if (end == IR_SLICE_END || end > n) end = n;
    if (start < 0 || start > n)
        return fail(b, "slice: start %lld is out of range for axis %d of size %lld", (long long)start, axis, (long long)n);
    if (end < start) end = start;
    if (start == 0 && end == n && step == 1) return x;
    s.d[axis] = ir_dim_const((end - start + step - 1) / step);
    int64_t a[4] = {axis, start, end == n ? IR_SLICE_END : end, step};
    return add(b, OP_SLICE, nd(b, x)->dtype, &s, &x, 1, a, 4);
}

static bool dim_add(Dim a, Dim c, Dim *out)
{
    if (a.nsym != c.nsym || memcmp(a.sym, c.sym, a.nsym)) return false;
    *out = a;
    out->k = a.k + c.k;
    return true;
}

NodeId ir_b_concat(IrBuilder *b, const NodeId *xs, int n, int axis)
{
    if (n < 1) return fail(b, "concat: needs at least one tensor");
    if (n == 1) return xs[0];
    const Shape *s0 = &nd(b, xs[0])->shape;
    axis = ir_b_axis(b, "concat", axis, s0->rank);
    if (axis < 0) return IR_NONE;
    DType t = nd(b, xs[0])->dtype;
    for (int i = 1; i < n; i++) t = ir_promote(t, nd(b, xs[i])->dtype);
    Shape s = *s0;
    NodeId in[64];
    if (n > 64) return fail(b, "concat: at most 64 tensors at once");
    for (int i = 0; i < n; i++) {
        const Shape *si = &nd(b, xs[i])->shape;
        bool ok = si->rank == s0->rank;
        for (int k = 0; ok && k < s0->rank; k++)
            if (k != axis && !ir_dim_eq(si->d[k], s0->d[k])) ok = false;
        if (!ok) return fail(b, "concat: shapes differ outside axis %d: %s and %s", axis, shp(b, s0), shp(b, si));
        if (i > 0 && !dim_add(s.d[axis], si->d[axis], &s.d[axis]))
            return fail(b, "concat: cannot add sizes of axis %d of %s and %s", axis, shp(b, s0), shp(b, si));
        in[i] = ir_b_cast(b, xs[i], t);
    }
    if (!check_size(b, &s, "concat")) return IR_NONE;
    int64_t a = axis;
    return add(b, OP_CONCAT, t, &s, in, n, &a, 1);
}

NodeId ir_b_pad(IrBuilder *b, NodeId x, const int64_t *lo, const int64_t *hi, double value)
{
    const Shape *xs = &nd(b, x)->shape;
    int64_t a[2 * IR_MAX_RANK];
    Shape s = *xs;
    bool any = false;
    for (int i = 0; i < xs->rank; i++) {
        if (lo[i] < 0 || hi[i] < 0 || lo[i] > IR_MAX_DIM || hi[i] > IR_MAX_DIM)
            return fail(b, "pad: padding must be between 0 and 2^32, found %lld and %lld", (long long)lo[i], (long long)hi[i]);
        if (!lo[i] && !hi[i]) { a[i] = a[xs->rank + i] = 0; continue; }
        if (!ir_dim_is_const(xs->d[i])) return fail(b, "pad: cannot pad symbolic axis %d of %s", i, shp(b, xs));
        s.d[i].k += lo[i] + hi[i];
        a[i] = lo[i];
        a[xs->rank + i] = hi[i];
        any = true;
    }
    if (!any) return x;
    if (!check_size(b, &s, "pad")) return IR_NONE;
    NodeId id = add(b, OP_PAD, nd(b, x)->dtype, &s, &x, 1, a, 2 * xs->rank);
    b->g->nodes[id].fattr[0] = value;
    return id;
}

/* See ir.h. The values an index can take are followed back through ops that only move or
 * widen them. */
bool ir_index_in_range(const Graph *g, NodeId idx, int64_t limit)
{
    for (;;) {
        const Node *n = &g->nodes[idx];
        if (n->dtype == DT_U8 && limit >= 256) return true;
        switch ((Op)n->op) {
        case OP_CHECK_INDEX: return ir_attrs(g, idx)[0] <= limit;
        case OP_IOTA: return ir_dim_max(g, n->shape.d[ir_attrs(g, idx)[0]]) <= limit;
        case OP_CONST: return n->fattr[0] >= 0 && n->fattr[0] < (double)limit;
        case OP_RESHAPE: case OP_EXPAND: case OP_PERMUTE: case OP_SLICE: case OP_DETACH: break;
        case OP_CAST: {
            DType from = (DType)g->nodes[ir_input(g, idx, 0)].dtype, to = (DType)n->dtype;
            /* u8 -> i32 -> i64 keep every value; anything else may wrap or truncate */
            if (!ir_dtype_is_int(from) || !ir_dtype_is_int(to) || ir_dtype_size(from) > ir_dtype_size(to)) return false;
            break;
        }
        default: return false;
        }
        idx = ir_input(g, idx, 0);
    }
}

NodeId ir_b_check_index(IrBuilder *b, NodeId idx, int64_t limit, const char *what)
{
    if (!ir_dtype_is_int(nd(b, idx)->dtype))
        return fail(b, "%s: indices must be integers, found %s", what, ir_dtype_name(nd(b, idx)->dtype));
    if (limit < 1 || limit > IR_MAX_DIM) return fail(b, "%s: %lld rows cannot be indexed", what, (long long)limit);
    if (ir_index_in_range(b->g, idx, limit)) return idx;
    NodeId id = add(b, OP_CHECK_INDEX, nd(b, idx)->dtype, &nd(b, idx)->shape, &idx, 1, &limit, 1);
    ir_set_name(b->g, id, what);
    return id;
}

NodeId ir_b_gather(IrBuilder *b, NodeId table, NodeId idx)
{
    const Shape *ts = &nd(b, table)->shape, *is = &nd(b, idx)->shape;
    if (!ir_dtype_is_int(nd(b, idx)->dtype))
        return fail(b, "gather: indices must be integers, found %s", ir_dtype_name(nd(b, idx)->dtype));
    if (ts->rank < 1) return fail(b, "gather: the table must have rank 1 or more");
    if (!ir_dim_is_const(ts->d[0]) || !ir_index_in_range(b->g, idx, ts->d[0].k))
        return fail(b, "gather: internal error: the indices are not checked against the table's %s rows (ir_b_check_index)", shp(b, ts));
    if (is->rank + ts->rank - 1 > IR_MAX_RANK) return fail(b, "gather: result rank exceeds %d", IR_MAX_RANK);
    Shape s = *is;
    for (int i = 1; i < ts->rank; i++) s.d[s.rank++] = ts->d[i];
    if (!check_size(b, &s, "gather")) return IR_NONE;
    NodeId in[2] = {table, idx};
    return add(b, OP_GATHER, nd(b, table)->dtype, &s, in, 2, NULL, 0);
}

NodeId ir_b_scatter_add(IrBuilder *b, NodeId idx, NodeId src, Dim rows)
{
    const Shape *is = &nd(b, idx)->shape, *ss = &nd(b, src)->shape;
    if (!ir_dtype_is_int(nd(b, idx)->dtype)) return fail(b, "scatter_add: indices must be integers");
    bool ok = ss->rank >= is->rank;
    for (int i = 0; ok && i < is->rank; i++) ok = ir_dim_eq(is->d[i], ss->d[i]);
    if (!ok) return fail(b, "scatter_add: source %s does not start with the index shape %s", shp(b, ss), shp(b, is));
    if (!ir_dim_is_const(rows) || !ir_index_in_range(b->g, idx, rows.k))
        return fail(b, "scatter_add: internal error: the indices are not checked against the result's rows (ir_b_check_index)");
    Shape s = ir_shape_make(1, &rows);
    for (int i = is->rank; i < ss->rank; i++) s.d[s.rank++] = ss->d[i];
    if (!check_size(b, &s, "scatter_add")) return IR_NONE;
    NodeId in[2] = {idx, src};
    return add(b, OP_SCATTER_ADD, nd(b, src)->dtype, &s, in, 2, NULL, 0);
}

NodeId ir_b_attention(IrBuilder *b, Op op, const NodeId *operands, int n, AttnMask mask, double scale, double dropout,
                      int64_t stream, int which)
{
    const bool grad = op == OP_ATTENTION_GRAD, has_mask = mask == ATTN_MASK_KEEP || mask == ATTN_MASK_DROP || mask == ATTN_MASK_ADD;
    if ((op != OP_ATTENTION && op != OP_ATTENTION_LSE && !grad) || n != (has_mask ? 4 : 3) + (grad ? 3 : 0) ||
        (grad && (which < 0 || which > 3 || (which == 3 && mask != ATTN_MASK_ADD))))
        return fail(b, "attention: %d operands do not fit op %s with mask %s", n, op < OP_COUNT ? ir_op_info[op].name : "?", ir_attn_mask_name(mask));
    const Node *q = nd(b, operands[0]), *v = nd(b, operands[2]);
    const int r = q->shape.rank;
    if (r < 3 || v->shape.rank != r) return fail(b, "attention: q %s and v %s must have one rank >= 3", shp(b, &q->shape), shp(b, &v->shape));
    Shape s = grad ? nd(b, operands[which])->shape : q->shape;
    if (op == OP_ATTENTION) s.d[r - 1] = v->shape.d[r - 1];
    if (op == OP_ATTENTION_LSE) s.d[r - 1] = ir_dim_const(1);
    const int64_t attrs[3] = {mask, stream, which};
    const NodeId id = add(b, op, (DType)q->dtype, &s, operands, n, attrs, grad ? 3 : 2);
    b->g->nodes[id].fattr[0] = scale;
    b->g->nodes[id].fattr[1] = dropout;
    return id;
}

NodeId ir_b_matmul(IrBuilder *b, NodeId x, NodeId y)
{
    Shape xs0 = nd(b, x)->shape, ys0 = nd(b, y)->shape;
    if (xs0.rank == 0 || ys0.rank == 0)
        return fail(b, "matmul: operands must have rank 1 or more, found %s @ %s", shp(b, &xs0), shp(b, &ys0));
    DType t = ir_promote(nd(b, x)->dtype, nd(b, y)->dtype);
    if (!ir_dtype_is_float(t)) t = DT_F32;
    x = ir_b_cast(b, x, t);
    y = ir_b_cast(b, y, t);
    /* PyTorch's rules for 1-D operands: a vector on the left is a row, on the right a
     * column, and the added dim is removed from the result. */
    bool xvec = xs0.rank == 1, yvec = ys0.rank == 1;
    Shape xs = xs0, ys = ys0;
    if (xvec) { xs = ir_shape_make(2, NULL); xs.d[0] = ir_dim_const(1); xs.d[1] = xs0.d[0]; x = ir_b_reshape(b, x, &xs); }
    if (yvec) { ys = ir_shape_make(2, NULL); ys.d[0] = ys0.d[0]; ys.d[1] = ir_dim_const(1); y = ir_b_reshape(b, y, &ys); }
    Dim k1 = xs.d[xs.rank - 1], k2 = ys.d[ys.rank - 2];
    if (!ir_dim_eq(k1, k2))
        return fail(b, "matmul: inner dimensions differ: %s @ %s", shp(b, &xs0), shp(b, &ys0));
    Dim m = xs.d[xs.rank - 2], n = ys.d[ys.rank - 1];
    Shape out;
    NodeId r;
    if (ys.rank == 2 && xs.rank > 2) {
        /* [..., M, K] @ [K, N]: one GEMM over the flattened rows, no broadcast copy of y. */
        Dim rows = ir_dim_const(1);
        for (int i = 0; i < xs.rank - 1; i++)
            if (!ir_dim_mul(rows, xs.d[i], &rows)) return fail(b, "matmul: %s has too many symbolic dims", shp(b, &xs0));
        Shape flat = ir_shape_make(2, NULL);
        flat.d[0] = rows;
        flat.d[1] = k1;
        NodeId xf = ir_b_reshape(b, x, &flat);
        Shape fo = ir_shape_make(2, NULL);
        fo.d[0] = rows;
        fo.d[1] = n;
        if (!check_size(b, &fo, "matmul")) return IR_NONE;
        NodeId in[2] = {xf, y};
        r = add(b, OP_MATMUL, t, &fo, in, 2, NULL, 0);
        out = xs;
        out.d[out.rank - 1] = n;
        r = ir_b_reshape(b, r, &out);
    } else {
        Shape xb = ir_shape_make(xs.rank - 2, xs.d), yb = ir_shape_make(ys.rank - 2, ys.d), bb;
        if (!broadcast_shapes(&xb, &yb, &bb))
            return fail(b, "matmul: batch dimensions cannot be broadcast: %s @ %s", shp(b, &xs0), shp(b, &ys0));
        if (bb.rank + 2 > IR_MAX_RANK) return fail(b, "matmul: rank exceeds %d", IR_MAX_RANK);
        Shape xe = bb, ye = bb;
        xe.d[xe.rank++] = m;
        xe.d[xe.rank++] = k1;
        ye.d[ye.rank++] = k1;
        ye.d[ye.rank++] = n;
        x = ir_b_expand(b, x, &xe);
        y = ir_b_expand(b, y, &ye);
        if (x == IR_NONE || y == IR_NONE) return IR_NONE;
        out = bb;
        out.d[out.rank++] = m;
        out.d[out.rank++] = n;
        if (!check_size(b, &out, "matmul")) return IR_NONE;
        NodeId in[2] = {x, y};
        r = add(b, OP_MATMUL, t, &out, in, 2, NULL, 0);
    }
    if (xvec || yvec) {
        Shape fin = nd(b, r)->shape;
        Shape s = ir_shape_make(0, NULL);
        for (int i = 0; i < fin.rank; i++) {
            if (xvec && i == fin.rank - 2) continue;
            if (yvec && i == fin.rank - 1) continue;
            s.d[s.rank++] = fin.d[i];
        }
        r = ir_b_reshape(b, r, &s);
    }
    return r;
}

static bool window_ok(IrBuilder *b, const char *what, int kh, int kw, int sh, int sw, int dh, int dw)
{
    if (kh < 1 || kw < 1 || sh < 1 || sw < 1 || dh < 1 || dw < 1 || kh > 4096 || kw > 4096 || sh > 4096 || sw > 4096 ||
        dh > 4096 || dw > 4096) {
        fail(b, "%s: kernel, stride and dilation must be between 1 and 4096", what);
        return false;
    }
    return true;
}

/* Output size of a window along one axis, or -1 when the window does not fit. */
static int64_t window_out(int64_t in, int k, int s, int d)
{
    int64_t span = (int64_t)d * (k - 1) + 1;
    return in < span ? -1 : (in - span) / s + 1;
}

NodeId ir_b_unfold(IrBuilder *b, NodeId x, int kh, int kw, int sh, int sw, int dh, int dw)
{
    const Shape *xs = &nd(b, x)->shape;
    if (xs->rank != 4) return fail(b, "unfold: expected a [N, C, H, W] tensor, found %s", shp(b, xs));
    if (!window_ok(b, "unfold", kh, kw, sh, sw, dh, dw)) return IR_NONE;
    if (!ir_dim_is_const(xs->d[1]) || !ir_dim_is_const(xs->d[2]) || !ir_dim_is_const(xs->d[3]))
        return fail(b, "unfold: channels and spatial dims must be numbers, found %s", shp(b, xs));
    int64_t oh = window_out(xs->d[2].k, kh, sh, dh), ow = window_out(xs->d[3].k, kw, sw, dw);
    if (oh < 1 || ow < 1)
        return fail(b, "window %dx%d (dilation %d, %d) does not fit in the input %s", kh, kw, dh, dw, shp(b, xs));
    Shape s = ir_shape_make(3, NULL);
    s.d[0] = xs->d[0];
    s.d[1] = ir_dim_const(xs->d[1].k * kh * kw);
    s.d[2] = ir_dim_const(oh * ow);
    if (!check_size(b, &s, "unfold")) return IR_NONE;
    int64_t a[6] = {kh, kw, sh, sw, dh, dw};
    return add(b, OP_UNFOLD, nd(b, x)->dtype, &s, &x, 1, a, 6);
}

NodeId ir_b_fold(IrBuilder *b, NodeId x, const Shape *out, int kh, int kw, int sh, int sw, int dh, int dw)
{
    const Shape *xs = &nd(b, x)->shape;
    if (!window_ok(b, "fold", kh, kw, sh, sw, dh, dw)) return IR_NONE;
    if (out->rank != 4 || xs->rank != 3) return fail(b, "fold: expected [N, C*KH*KW, L] to [N, C, H, W]");
    for (int i = 1; i < 4; i++)
        if (!ir_dim_is_const(out->d[i])) return fail(b, "fold: channels and spatial dims must be numbers");
    int64_t oh = window_out(out->d[2].k, kh, sh, dh), ow = window_out(out->d[3].k, kw, sw, dw);
    if (oh < 1 || ow < 1 || !ir_dim_eq(xs->d[0], out->d[0]) || !ir_dim_eq(xs->d[1], ir_dim_const(out->d[1].k * kh * kw)) ||
        !ir_dim_eq(xs->d[2], ir_dim_const(oh * ow)))
        return fail(b, "fold: %s does not unfold from %s with a %dx%d window", shp(b, xs), shp(b, out), kh, kw);
    int64_t a[6] = {kh, kw, sh, sw, dh, dw};
    return add(b, OP_FOLD, nd(b, x)->dtype, out, &x, 1, a, 6);
}

int64_t ir_param_zero_row(const Graph *g, NodeId p)
{
    const Node *n = &g->nodes[p];
    if (n->op != OP_PARAM || n->nattrs < 3 || (uint64_t)n->attrs + 3 > (uint64_t)g->nattrs) return -1;
    return ir_attrs(g, p)[2];
}
