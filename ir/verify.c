/* verify.c — checks every structural and typing invariant of a graph.
 *
 * Passes run it after every rewrite and the reader runs it on every parsed graph, so a
 * broken invariant is caught next to the pass that broke it rather than as a wrong number
 * in generated code. It must never crash on a corrupt graph (that is exactly when it runs),
 * so it checks indices before following them and only applies an op's typing rules once
 * the node and its operands are structurally sound; that also keeps one broken node from
 * producing a cascade of follow-on messages. Each problem is one line naming the node, the
 * op and what is wrong, with both shapes where shapes disagree. */
#include "ir.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *g;
    StrBuf *err;
    int count;
    bool *usable;     /* per node: op, dtype and shape are well formed */
    StrBuf fmt[4];    /* ring of scratch buffers for formatting shapes into messages */
    int next_fmt;
} V;

static void vproblem(V *v, const char *prefix, const char *fmt, va_list ap)
{
    v->count++;
    sb_puts(v->err, prefix);
    sb_vprintf(v->err, fmt, ap);
    sb_putc(v->err, '\n');
}

static void problem(V *v, NodeId id, const char *fmt, ...) KILN_PRINTF(3, 4);
static void problem(V *v, NodeId id, const char *fmt, ...)
{
    char prefix[64];
    const Node *n = &v->g->nodes[id];
    if (n->op < OP_COUNT) snprintf(prefix, sizeof prefix, "node %%%d (%s): ", id, ir_op_info[n->op].name);
    else snprintf(prefix, sizeof prefix, "node %%%d: ", id);
    va_list ap;
    va_start(ap, fmt);
    vproblem(v, prefix, fmt, ap);
    va_end(ap);
}

static void graph_problem(V *v, const char *fmt, ...) KILN_PRINTF(2, 3);
static void graph_problem(V *v, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vproblem(v, "", fmt, ap);
    va_end(ap);
}

/* Formats a (well-formed) shape into one of the scratch buffers; valid until four more
 * shapes have been formatted, which is more than any one message uses. */
static const char *shp(V *v, const Shape *s)
{
    StrBuf *b = &v->fmt[v->next_fmt++ & 3];
    b->len = 0;
    ir_shape_format(b, v->g, s);
    return b->data;
}

static const char *dim_str(V *v, Dim d)
{
    StrBuf *b = &v->fmt[v->next_fmt++ & 3];
    b->len = 0;
    ir_dim_format(b, v->g, d);
    return b->data;
}

static const char *dt(uint8_t t) { return ir_dtype_name((DType)t); }

static const Node *operand(const V *v, NodeId id, int i) { return &v->g->nodes[ir_input(v->g, id, i)]; }

/* ---- structure ---- */

static bool check_shape(V *v, NodeId id, const Shape *s)
{
    if (s->rank > IR_MAX_RANK) {
        problem(v, id, "rank %d exceeds the maximum %d", s->rank, IR_MAX_RANK);
        return false;
    }
    bool ok = true;
    for (int i = 0; i < s->rank; i++) {
        Dim d = s->d[i];
        if (d.nsym > IR_MAX_DIM_SYMS) {
            problem(v, id, "dim %d has %d symbols, more than %d", i, d.nsym, IR_MAX_DIM_SYMS);
            ok = false;
            continue;
        }
        bool syms_ok = true;
        for (int j = 0; j < d.nsym; j++) {
            if (d.sym[j] >= v->g->nsyms) {
                problem(v, id, "dim %d refers to undefined symbol $%d", i, d.sym[j]);
                syms_ok = false;
            } else if (j > 0 && d.sym[j] < d.sym[j - 1]) {
                /* Dims are compared by representation, so only the sorted form is valid. */
                problem(v, id, "dim %d is not canonical: its symbols are not sorted", i);
                syms_ok = false;
            }
        }
        if (!syms_ok) { ok = false; continue; }
        if (d.k < 0) {
            problem(v, id, "dim %d is negative (%lld)", i, (long long)d.k);
            ok = false;
        } else if (d.nsym > 0 && d.k == 0) {
            problem(v, id, "dim %d is not canonical: a zero coefficient on symbols", i);
            ok = false;
        } else {
            int64_t m = ir_dim_max(v->g, d);
            if (m < 0 || m > IR_MAX_DIM) {
                problem(v, id, "dim %d (%s) can exceed the largest dim 2^32", i, dim_str(v, d));
                ok = false;
            }
        }
    }
    if (ok) {
        int64_t n = ir_shape_max_numel(v->g, s);
        if (n < 0 || n > IR_MAX_ELEMENTS)
            problem(v, id, "%s can hold more than 2^40 elements", shp(v, s));
    }
    return ok;
}

/* How many attributes the op's layout needs; -1 when it cannot be known (bad rank). */
static int want_attrs(OpAttrs layout, int rank)
{
    switch (layout) {
    case ATTRS_NONE: case ATTRS_INPUT: case ATTRS_CONST: return 0;
    case ATTRS_AXIS: case ATTRS_AXES: case ATTRS_STREAM: case ATTRS_LIMIT: return 1;
    case ATTRS_PARAM: return 2;
    case ATTRS_SLICE: return 4;
    case ATTRS_WINDOW: return 6;
    case ATTRS_PERM: return rank <= IR_MAX_RANK ? rank : -1;
    case ATTRS_PAD: return rank <= IR_MAX_RANK ? 2 * rank : -1;
    case ATTRS_ATTENTION: return 2;
    case ATTRS_ATTENTION_GRAD: return 3;
    }
    return -1;
}

/* ---- per-op typing rules (node and operands are structurally sound here) ---- */

static void expect_shape(V *v, NodeId id, const Shape *want)
{
    const Shape *s = &v->g->nodes[id].shape;
    if (!ir_shape_eq(s, want)) problem(v, id, "shape is %s, expected %s", shp(v, s), shp(v, want));
}

static void expect_dtype(V *v, NodeId id, uint8_t want)
{
    uint8_t t = v->g->nodes[id].dtype;
    if (t != want) problem(v, id, "dtype is %s, expected %s", dt(t), dt(want));
}

static void need_float(V *v, NodeId id, uint8_t t, const char *what)
{
    if (!ir_dtype_is_float((DType)t)) problem(v, id, "%s must be floating point, got %s", what, dt(t));
}

static bool axis_ok(V *v, NodeId id, int64_t axis, int rank)
{
    if (axis >= 0 && axis < rank) return true;
    problem(v, id, "axis %lld is out of range for rank %d", (long long)axis, rank);
    return false;
}

/* Element count as coefficient and per-symbol exponents: exact whatever the number of
 * symbols, where a Dim can hold only IR_MAX_DIM_SYMS of them. */
static bool numel_sig(const Shape *s, int64_t *k, uint8_t cnt[IR_MAX_SYMS])
{
    memset(cnt, 0, IR_MAX_SYMS);
    *k = 1;
    for (int i = 0; i < s->rank; i++) {
        Dim d = s->d[i];
        if (d.k != 0 && *k > INT64_MAX / d.k) return false;
        *k *= d.k;
        for (int j = 0; j < d.nsym; j++) cnt[d.sym[j]]++;
    }
    return true;
}

static bool dim_add(Dim a, Dim b, Dim *out)
{
    if (a.nsym != b.nsym || memcmp(a.sym, b.sym, a.nsym) || a.k > IR_MAX_ELEMENTS || b.k > IR_MAX_ELEMENTS)
        return false;
    *out = a;
    out->k = a.k + b.k;
    return true;
}

static void check_leaf(V *v, NodeId id, const int64_t *a)
{
    const Graph *g = v->g;
    const Node *n = &g->nodes[id];
    switch ((Op)n->op) {
    case OP_INPUT:
        if (!n->name) problem(v, id, "input has no name");
        break;
    case OP_PARAM:
        if (!n->name) problem(v, id, "param has no name");
        if (a[0] < 0 || a[0] >= INIT_COUNT) problem(v, id, "unknown init kind %lld", (long long)a[0]);
        if (a[1] != 0 && a[1] != 1) problem(v, id, "trainable flag is %lld, expected 0 or 1", (long long)a[1]);
        if (n->nattrs == 3 && (a[2] < 0 || n->shape.rank < 1 || a[2] >= n->shape.d[0].k))
            problem(v, id, "zero row %lld is outside axis 0", (long long)a[2]);
        break;
    case OP_IOTA: axis_ok(v, id, a[0], n->shape.rank); break;
    case OP_LOSS_SCALE:
        if (n->dtype != DT_F32 || n->shape.rank != 0) problem(v, id, "loss_scale is an f32 scalar (rank 0)");
        break;
    case OP_RANDOM_UNIFORM:
        need_float(v, id, n->dtype, "result");
        if (a[0] < 0) problem(v, id, "stream %lld is negative", (long long)a[0]);
        break;
    default: break;
    }
}

static void check_elementwise(V *v, NodeId id)
{
    const Node *n = &v->g->nodes[id];
    const OpInfo *info = &ir_op_info[n->op];
    const Node *x = operand(v, id, 0);
    if (info->flags & OPF_BINARY) {
        const Node *y = operand(v, id, 1);
        if (!ir_shape_eq(&x->shape, &y->shape)) {
            problem(v, id, "operand shapes differ: %s vs %s", shp(v, &x->shape), shp(v, &y->shape));
            return;
        }
        if (x->dtype != y->dtype) {
            problem(v, id, "operand dtypes differ: %s vs %s", dt(x->dtype), dt(y->dtype));
            return;
        }
    }
    expect_shape(v, id, &x->shape);
    if (n->op == OP_ROUND_STOCHASTIC) {
        /* an f32 value and a uniform [0, 1) of the same shape: bf16 rounded stochastically */
        if (x->dtype != DT_F32) problem(v, id, "operand must be f32, got %s", dt(x->dtype));
        expect_dtype(v, id, DT_BF16);
        return;
    }
    if (n->op != OP_CAST) expect_dtype(v, id, (info->flags & OPF_COMPARE) ? DT_BOOL : x->dtype);
    if (info->flags & OPF_FLOAT) need_float(v, id, x->dtype, "operand");
    if ((info->flags & OPF_LOGIC) && x->dtype != DT_BOOL)
        problem(v, id, "operand must be bool, got %s", dt(x->dtype));
}

static void check_where(V *v, NodeId id)
{
    const Node *n = &v->g->nodes[id];
    for (int i = 0; i < 3; i++) {
        const Node *x = operand(v, id, i);
        if (!ir_shape_eq(&x->shape, &n->shape))
            problem(v, id, "operand %d shape %s differs from the result shape %s", i, shp(v, &x->shape),
                    shp(v, &n->shape));
    }
    if (operand(v, id, 0)->dtype != DT_BOOL) problem(v, id, "condition must be bool, got %s", dt(operand(v, id, 0)->dtype));
    for (int i = 1; i < 3; i++)
        if (operand(v, id, i)->dtype != n->dtype)
            problem(v, id, "operand %d dtype %s differs from the result dtype %s", i, dt(operand(v, id, i)->dtype),
                    dt(n->dtype));
}

static void check_reduce(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    const Node *x = operand(v, id, 0);
    int r = x->shape.rank;
    uint64_t mask;
    if (n->op == OP_ARGMAX) {
        if (!axis_ok(v, id, a[0], r)) return;
        mask = UINT64_C(1) << a[0];
        expect_dtype(v, id, DT_I64);
    } else {
        mask = (uint64_t)a[0];
        if (n->nattrs == 2 && a[1] != 1) problem(v, id, "reduce_max's tie rule must be 1 (first), got %lld", (long long)a[1]);
        if (mask >> r) {
            problem(v, id, "axes mask 0x%llx names axes beyond the operand rank %d", (unsigned long long)mask, r);
            return;
        }
        expect_dtype(v, id, x->dtype);
    }
    Shape want = x->shape;
    for (int i = 0; i < r; i++)
        if (mask >> i & 1) want.d[i] = ir_dim_const(1);
    expect_shape(v, id, &want);
}

static void check_reshape(V *v, NodeId id)
{
    const Node *n = &v->g->nodes[id];
    const Node *x = operand(v, id, 0);
    expect_dtype(v, id, x->dtype);
    int64_t k1, k2;
    uint8_t c1[IR_MAX_SYMS], c2[IR_MAX_SYMS];
    bool ok1 = numel_sig(&x->shape, &k1, c1), ok2 = numel_sig(&n->shape, &k2, c2);
    if (!ok1 || !ok2 || k1 != k2 || (k1 != 0 && memcmp(c1, c2, sizeof c1)))
        problem(v, id, "element counts differ: %s vs %s", shp(v, &x->shape), shp(v, &n->shape));
}

static void check_expand(V *v, NodeId id)
{
    const Node *n = &v->g->nodes[id];
    const Node *x = operand(v, id, 0);
    expect_dtype(v, id, x->dtype);
    if (x->shape.rank != n->shape.rank) {
        problem(v, id, "rank differs from the operand's: %s vs %s", shp(v, &n->shape), shp(v, &x->shape));
        return;
    }
    for (int i = 0; i < n->shape.rank; i++) {
        Dim d = x->shape.d[i];
        if (!ir_dim_eq(d, n->shape.d[i]) && !(ir_dim_is_const(d) && d.k == 1)) {
            problem(v, id, "cannot expand %s to %s: dim %d is neither 1 nor equal", shp(v, &x->shape),
                    shp(v, &n->shape), i);
            return;
        }
    }
}

static void check_permute(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    const Node *x = operand(v, id, 0);
    int r = n->shape.rank;
    expect_dtype(v, id, x->dtype);
    if (x->shape.rank != r) {
        problem(v, id, "rank differs from the operand's: %s vs %s", shp(v, &n->shape), shp(v, &x->shape));
        return;
    }
    bool seen[IR_MAX_RANK] = {false};
    for (int i = 0; i < r; i++) {
        if (a[i] < 0 || a[i] >= r || seen[a[i]]) {
            problem(v, id, "perm is not a permutation of 0..%d (entry %d is %lld)", r - 1, i, (long long)a[i]);
            return;
        }
        seen[a[i]] = true;
    }
    Shape want = x->shape;
    for (int i = 0; i < r; i++) want.d[i] = x->shape.d[a[i]];
    expect_shape(v, id, &want);
}

static void check_slice(V *v, NodeId id, const int64_t *a)
{
    const Node *x = operand(v, id, 0);
    int64_t axis = a[0], start = a[1], end = a[2], step = a[3];
    expect_dtype(v, id, x->dtype);
    if (!axis_ok(v, id, axis, x->shape.rank)) return;
    if (start < 0) { problem(v, id, "start %lld is negative", (long long)start); return; }
    if (step < 1) { problem(v, id, "step %lld must be at least 1", (long long)step); return; }
    Dim d = x->shape.d[axis];
    Shape want = x->shape;
    if (!ir_dim_is_const(d)) {
        if (start != 0 || end != IR_SLICE_END || step != 1) {
            problem(v, id, "axis %lld has symbolic size %s, which can only be sliced whole", (long long)axis,
                    dim_str(v, d));
            return;
        }
    } else {
        int64_t e = end == IR_SLICE_END ? d.k : end;
        if (e > d.k) {
            problem(v, id, "end %lld is beyond the size %lld of axis %lld", (long long)e, (long long)d.k,
                    (long long)axis);
            return;
        }
        if (start > e) {
            problem(v, id, "start %lld is after end %lld", (long long)start, (long long)e);
            return;
        }
        want.d[axis] = ir_dim_const(e == start ? 0 : (e - start - 1) / step + 1); /* no overflow for huge steps */
    }
    expect_shape(v, id, &want);
}

static void check_concat(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    int r = n->shape.rank;
    if (!axis_ok(v, id, a[0], r)) return;
    int axis = (int)a[0];
    Dim sum = ir_dim_const(0);
    for (uint32_t i = 0; i < n->ninputs; i++) {
        const Node *x = operand(v, id, (int)i);
        if (x->dtype != n->dtype) {
            problem(v, id, "operand %u dtype %s differs from the result dtype %s", i, dt(x->dtype), dt(n->dtype));
            return;
        }
        if (x->shape.rank != r) {
            problem(v, id, "operand %u shape %s has a different rank from the result %s", i, shp(v, &x->shape),
                    shp(v, &n->shape));
            return;
        }
        for (int j = 0; j < r; j++)
            if (j != axis && !ir_dim_eq(x->shape.d[j], n->shape.d[j])) {
                problem(v, id, "operand %u shape %s differs from the result %s off the concat axis", i,
                        shp(v, &x->shape), shp(v, &n->shape));
                return;
            }
        Dim xd = x->shape.d[axis];
        if (i == 0) sum = xd;
        else if (!dim_add(sum, xd, &sum)) {
            problem(v, id, "cannot add the axis sizes %s and %s", dim_str(v, sum), dim_str(v, xd));
            return;
        }
    }
    if (!ir_dim_eq(sum, n->shape.d[axis]))
        problem(v, id, "axis %d has size %s, but the operands add up to %s", axis, dim_str(v, n->shape.d[axis]),
                dim_str(v, sum));
}

static void check_pad(V *v, NodeId id, const int64_t *a)
{
    const Node *x = operand(v, id, 0);
    int r = x->shape.rank;
    expect_dtype(v, id, x->dtype);
    if (r != v->g->nodes[id].shape.rank) {
        problem(v, id, "rank differs from the operand's: %s vs %s", shp(v, &v->g->nodes[id].shape), shp(v, &x->shape));
        return;
    }
    Shape want = x->shape;
    for (int i = 0; i < r; i++) {
        int64_t lo = a[i], hi = a[r + i];
        if (lo < 0 || hi < 0 || lo > IR_MAX_DIM || hi > IR_MAX_DIM) {
            problem(v, id, "padding lo=%lld hi=%lld on axis %d is negative or too large", (long long)lo,
                    (long long)hi, i);
            return;
        }
        if (lo == 0 && hi == 0) continue;
        if (!ir_dim_is_const(x->shape.d[i])) {
            problem(v, id, "cannot pad axis %d of symbolic size %s", i, dim_str(v, x->shape.d[i]));
            return;
        }
        want.d[i] = ir_dim_const(x->shape.d[i].k + lo + hi);
    }
    expect_shape(v, id, &want);
}

static void check_index(V *v, NodeId id, const int64_t *a)
{
    const Node *x = operand(v, id, 0);
    if (!ir_dtype_is_int((DType)x->dtype)) problem(v, id, "checks integer indices, got %s", dt(x->dtype));
    expect_dtype(v, id, x->dtype);
    expect_shape(v, id, &x->shape);
    if (a[0] < 1 || a[0] > IR_MAX_DIM) problem(v, id, "limit is %lld, expected 1 to 2^32", (long long)a[0]);
}

static void check_gather(V *v, NodeId id)
{
    const Node *table = operand(v, id, 0), *idx = operand(v, id, 1);
    if (!ir_dtype_is_int((DType)idx->dtype)) problem(v, id, "index dtype must be an integer type, got %s", dt(idx->dtype));
    expect_dtype(v, id, table->dtype);
    if (table->shape.rank < 1 || idx->shape.rank + table->shape.rank - 1 > IR_MAX_RANK) {
        problem(v, id, "cannot gather %s rows by %s indices", shp(v, &table->shape), shp(v, &idx->shape));
        return;
    }
    Shape want = idx->shape;
    for (int i = 1; i < table->shape.rank; i++) want.d[want.rank++] = table->shape.d[i];
    expect_shape(v, id, &want);
}

static void check_scatter_add(V *v, NodeId id)
{
    const Node *n = &v->g->nodes[id];
    const Node *idx = operand(v, id, 0), *src = operand(v, id, 1);
    if (!ir_dtype_is_int((DType)idx->dtype)) problem(v, id, "index dtype must be an integer type, got %s", dt(idx->dtype));
    expect_dtype(v, id, src->dtype);
    int ir = idx->shape.rank;
    bool prefix = src->shape.rank >= ir;
    for (int i = 0; prefix && i < ir; i++) prefix = ir_dim_eq(idx->shape.d[i], src->shape.d[i]);
    if (!prefix) {
        problem(v, id, "source shape %s does not start with the index shape %s", shp(v, &src->shape),
                shp(v, &idx->shape));
        return;
    }
    if (n->shape.rank < 1 || n->shape.rank != 1 + src->shape.rank - ir) {
        problem(v, id, "shape %s does not match source %s scattered by index %s", shp(v, &n->shape),
                shp(v, &src->shape), shp(v, &idx->shape));
        return;
    }
    Shape want = n->shape; /* rows (dim 0) are free: the table size is chosen by the caller */
    for (int i = ir; i < src->shape.rank; i++) want.d[1 + i - ir] = src->shape.d[i];
    expect_shape(v, id, &want);
}

static void check_matmul(V *v, NodeId id)
{
    const Node *x = operand(v, id, 0), *y = operand(v, id, 1);
    int r = x->shape.rank;
    if (x->dtype != y->dtype) {
        problem(v, id, "operand dtypes differ: %s vs %s", dt(x->dtype), dt(y->dtype));
        return;
    }
    need_float(v, id, x->dtype, "operand");
    /* half-precision operands accumulate in f32 (mixed precision, passes/precision.c) */
    expect_dtype(v, id, x->dtype == DT_BF16 || x->dtype == DT_F16 ? DT_F32 : x->dtype);
    if (r < 2 || y->shape.rank != r) {
        problem(v, id, "operands must have the same rank >= 2: %s @ %s", shp(v, &x->shape), shp(v, &y->shape));
        return;
    }
    for (int i = 0; i < r - 2; i++)
        if (!ir_dim_eq(x->shape.d[i], y->shape.d[i])) {
            problem(v, id, "batch dims differ: %s @ %s", shp(v, &x->shape), shp(v, &y->shape));
            return;
        }
    if (!ir_dim_eq(x->shape.d[r - 1], y->shape.d[r - 2])) {
        problem(v, id, "inner dimensions differ: %s @ %s", shp(v, &x->shape), shp(v, &y->shape));
        return;
    }
    Shape want = x->shape;
    want.d[r - 1] = y->shape.d[r - 1];
    expect_shape(v, id, &want);
}

/* The attention ops (ops.h): q [..., H, T, D], k [..., KV, S, D], v [..., KV, S, DV], the
 * mask [..., H, T, S] when its kind has one; attention_grad's out, lse and dout after them. */
static void check_attention(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    const bool grad = n->op == OP_ATTENTION_GRAD;
    if (a[0] < 0 || a[0] >= ATTN_MASK_COUNT) {
        problem(v, id, "mask kind %lld is not one of none, causal, keep, drop, add", (long long)a[0]);
        return;
    }
    const bool has_mask = a[0] == ATTN_MASK_KEEP || a[0] == ATTN_MASK_DROP || a[0] == ATTN_MASK_ADD;
    const uint32_t want = (has_mask ? 4u : 3u) + (grad ? 3u : 0u);
    if (n->ninputs != want) {
        problem(v, id, "expects %u operands with mask=%s, got %u", want, ir_attn_mask_name(a[0]), n->ninputs);
        return;
    }
    if (a[1] < 0) problem(v, id, "stream is %lld, expected 0 or more", (long long)a[1]);
    if (!isfinite(n->fattr[0])) problem(v, id, "scale is not finite");
    if (!(n->fattr[1] >= 0 && n->fattr[1] < 1)) problem(v, id, "dropout rate is not in [0, 1)");
    if (grad && (a[2] < 0 || a[2] > 3 || (a[2] == 3 && a[0] != ATTN_MASK_ADD)))
        problem(v, id, "grad is %lld, expected 0 (q), 1 (k), 2 (v) or, with mask=add, 3 (the mask)", (long long)a[2]);
    const Node *q = operand(v, id, 0), *k = operand(v, id, 1), *val = operand(v, id, 2);
    need_float(v, id, q->dtype, "q");
    if (k->dtype != q->dtype || val->dtype != q->dtype) {
        problem(v, id, "q, k and v dtypes differ: %s, %s, %s", dt(q->dtype), dt(k->dtype), dt(val->dtype));
        return;
    }
    const int r = q->shape.rank;
    if (r < 3 || k->shape.rank != r || val->shape.rank != r) {
        problem(v, id, "q, k and v must have one rank >= 3: %s, %s, %s", shp(v, &q->shape), shp(v, &k->shape), shp(v, &val->shape));
        return;
    }
    const Dim *qd = q->shape.d, *kd = k->shape.d, *vd = val->shape.d;
    bool ok = true;
    for (int i = 0; i < r - 3; i++) ok &= ir_dim_eq(qd[i], kd[i]) && ir_dim_eq(qd[i], vd[i]);
    ok &= ir_dim_eq(kd[r - 3], vd[r - 3]) && ir_dim_eq(kd[r - 2], vd[r - 2]) && ir_dim_eq(qd[r - 1], kd[r - 1]);
    /* the query heads: the key/value heads' count, or a constant multiple of it */
    ok &= ir_dim_eq(qd[r - 3], kd[r - 3]) || (ir_dim_is_const(qd[r - 3]) && ir_dim_is_const(kd[r - 3]) && kd[r - 3].k > 0 &&
                                              qd[r - 3].k % kd[r - 3].k == 0);
    if (!ok) {
        problem(v, id, "q %s, k %s, v %s are not [..., H, T, D], [..., KV, S, D], [..., KV, S, DV] with KV dividing H",
                shp(v, &q->shape), shp(v, &k->shape), shp(v, &val->shape));
        return;
    }
    Shape rows = q->shape; /* [..., H, T, 1] */
    rows.d[r - 1] = ir_dim_const(1);
    Shape out = q->shape; /* [..., H, T, DV] */
    out.d[r - 1] = vd[r - 1];
    if (has_mask) {
        const Node *m = operand(v, id, 3);
        Shape ms = q->shape;
        ms.d[r - 1] = kd[r - 2];
        if (!ir_shape_eq(&m->shape, &ms)) problem(v, id, "mask shape is %s, expected %s", shp(v, &m->shape), shp(v, &ms));
        if (a[0] == ATTN_MASK_ADD ? m->dtype != q->dtype : m->dtype != DT_BOOL)
            problem(v, id, "mask dtype is %s, expected %s", dt(m->dtype), a[0] == ATTN_MASK_ADD ? dt(q->dtype) : "bool");
    }
    if (grad) {
        const int at = has_mask ? 4 : 3;
        const Node *o = operand(v, id, at), *lse = operand(v, id, at + 1), *dout = operand(v, id, at + 2);
        if (!ir_shape_eq(&o->shape, &out) || !ir_shape_eq(&lse->shape, &rows) || !ir_shape_eq(&dout->shape, &out))
            problem(v, id, "out %s, lse %s, dout %s: expected %s, %s, %s", shp(v, &o->shape), shp(v, &lse->shape),
                    shp(v, &dout->shape), shp(v, &out), shp(v, &rows), shp(v, &out));
        if (o->dtype != q->dtype || lse->dtype != q->dtype || dout->dtype != q->dtype)
            problem(v, id, "out, lse and dout must be %s, got %s, %s, %s", dt(q->dtype), dt(o->dtype), dt(lse->dtype), dt(dout->dtype));
        expect_dtype(v, id, q->dtype);
        if (a[2] >= 0 && a[2] <= 2 + has_mask) expect_shape(v, id, &operand(v, id, (int)a[2])->shape);
        return;
    }
    expect_dtype(v, id, q->dtype);
    expect_shape(v, id, n->op == OP_ATTENTION_LSE ? &rows : &out);
}

/* Unfold and fold share the window arithmetic; img is the 4-D side, cols the 3-D one. */
static void check_window(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    const Node *x = operand(v, id, 0);
    bool unfold = n->op == OP_UNFOLD;
    const Shape *img = unfold ? &x->shape : &n->shape, *cols = unfold ? &n->shape : &x->shape;
    expect_dtype(v, id, x->dtype);
    for (int i = 0; i < 6; i++)
        if (a[i] < 1 || a[i] > IR_MAX_DIM) {
            problem(v, id, "window attribute %d is %lld, expected at least 1", i, (long long)a[i]);
            return;
        }
    if (img->rank != 4 || cols->rank != 3) {
        problem(v, id, "expects a 4-D image and 3-D columns, got %s and %s", shp(v, img), shp(v, cols));
        return;
    }
    Dim h = img->d[2], w = img->d[3];
    if (!ir_dim_is_const(h) || !ir_dim_is_const(w)) {
        problem(v, id, "image height and width must be constants, got %s", shp(v, img));
        return;
    }
    int64_t kh = a[0], kw = a[1], sh = a[2], sw = a[3], dh = a[4], dw = a[5];
    /* dh*(kh-1)+1 <= H, written so that nothing overflows for absurd attributes. */
    if ((kh > 1 && dh > (h.k - 1) / (kh - 1)) || (kw > 1 && dw > (w.k - 1) / (kw - 1)) || h.k < 1 || w.k < 1) {
        problem(v, id, "window %lldx%lld with dilation %lldx%lld does not fit in %s", (long long)kh, (long long)kw,
                (long long)dh, (long long)dw, shp(v, img));
        return;
    }
    int64_t oh = (h.k - (dh * (kh - 1) + 1)) / sh + 1, ow = (w.k - (dw * (kw - 1) + 1)) / sw + 1;
    Shape want = *cols;
    want.d[0] = img->d[0];
    if (!ir_dim_mul(img->d[1], ir_dim_const(kh), &want.d[1]) || !ir_dim_mul(want.d[1], ir_dim_const(kw), &want.d[1]) ||
        !ir_dim_mul(ir_dim_const(oh), ir_dim_const(ow), &want.d[2])) {
        problem(v, id, "window sizes overflow for %s", shp(v, img));
        return;
    }
    if (ir_shape_eq(cols, &want)) return;
    if (unfold) problem(v, id, "shape is %s, expected %s", shp(v, cols), shp(v, &want));
    else problem(v, id, "operand shape is %s, expected %s for result %s", shp(v, cols), shp(v, &want), shp(v, img));
}

static void check_op(V *v, NodeId id, const int64_t *a)
{
    const Node *n = &v->g->nodes[id];
    unsigned flags = ir_op_info[n->op].flags;
    if (flags & OPF_LEAF) { check_leaf(v, id, a); return; }
    if (flags & (OPF_UNARY | OPF_BINARY)) { check_elementwise(v, id); return; }
    switch ((Op)n->op) {
    case OP_WHERE: check_where(v, id); break;
    case OP_REDUCE_SUM: case OP_REDUCE_MAX: case OP_ARGMAX: check_reduce(v, id, a); break;
    case OP_RESHAPE: check_reshape(v, id); break;
    case OP_EXPAND: check_expand(v, id); break;
    case OP_PERMUTE: check_permute(v, id, a); break;
    case OP_SLICE: check_slice(v, id, a); break;
    case OP_CONCAT: check_concat(v, id, a); break;
    case OP_PAD: check_pad(v, id, a); break;
    case OP_CHECK_INDEX: check_index(v, id, a); break;
    case OP_GATHER: check_gather(v, id); break;
    case OP_SCATTER_ADD: check_scatter_add(v, id); break;
    case OP_MATMUL: check_matmul(v, id); break;
    case OP_UNFOLD: case OP_FOLD: check_window(v, id, a); break;
    case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_GRAD: check_attention(v, id, a); break;
    default: break;
    }
}

static void check_node(V *v, NodeId id)
{
    const Graph *g = v->g;
    const Node *n = &g->nodes[id];
    if (n->op >= OP_COUNT) {
        problem(v, id, "unknown op %u", n->op);
        return;
    }
    const OpInfo *info = &ir_op_info[n->op];
    bool ok = true;
    if (n->dtype >= DT_COUNT) {
        problem(v, id, "invalid dtype %u", n->dtype);
        ok = false;
    }
    if (!check_shape(v, id, &n->shape)) ok = false;
    if (n->name >= (uint32_t)g->nstrings) problem(v, id, "name offset %u is out of range", n->name);
    if (n->ckpt < 0) problem(v, id, "checkpoint region %d is negative", n->ckpt);
    if (n->scope >= (uint32_t)g->nstrings) problem(v, id, "module path offset %u is out of range", n->scope);
    if (n->scope_type >= (uint32_t)g->nstrings) problem(v, id, "module type offset %u is out of range", n->scope_type);
    else if (n->scope && n->scope_loc.file >= g->nfiles) problem(v, id, "module call's file %u is out of range", n->scope_loc.file);
    if ((uint64_t)n->inputs + n->ninputs > (uint64_t)g->noperands) {
        problem(v, id, "operand list (%u at %u) is out of range", n->ninputs, n->inputs);
        return;
    }
    if ((uint64_t)n->attrs + n->nattrs > (uint64_t)g->nattrs) {
        problem(v, id, "attribute list (%u at %u) is out of range", n->nattrs, n->attrs);
        return;
    }
    v->usable[id] = ok;

    bool args_ok = true;
    if (info->arity >= 0 && n->ninputs != (uint32_t)info->arity) {
        problem(v, id, "expects %d operand%s, got %u", info->arity, info->arity == 1 ? "" : "s", n->ninputs);
        args_ok = false;
    } else if (info->arity < 0 && n->ninputs < 1) {
        problem(v, id, "expects at least 1 operand, got 0");
        args_ok = false;
    }
    for (uint32_t i = 0; i < n->ninputs; i++) {
        NodeId x = ir_input(g, id, (int)i);
        if (x < 0 || x >= id) {
            problem(v, id, "operand %u is %%%d, which is not an earlier node", i, x);
            args_ok = false;
        } else if (!v->usable[x]) {
            args_ok = false; /* already reported at x */
        }
    }
    int want = want_attrs(info->attrs, n->shape.rank);
    if (info->attrs == ATTRS_PARAM && n->nattrs == 3) want = 3; /* with a zero row */
    if (n->op == OP_REDUCE_MAX && n->nattrs == 2) want = 2;      /* with its tie rule */
    if (want >= 0 && n->nattrs != (uint32_t)want) {
        problem(v, id, "expects %d attribute%s, got %u", want, want == 1 ? "" : "s", n->nattrs);
        return;
    }
    if (ok && args_ok && want >= 0) check_op(v, id, n->nattrs ? ir_attrs(g, id) : NULL);
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* Reports names used twice by inputs, by params or by outputs of one kind. Names are
 * interned, so equal names have equal offsets and sorting (kind, offset) keys finds them. */
static void check_duplicates(V *v)
{
    const Graph *g = v->g;
    int64_t cap = (int64_t)g->nnodes + g->noutputs;
    uint64_t *keys = xmalloc((size_t)(cap ? cap : 1) * sizeof *keys);
    int64_t n = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *x = &g->nodes[i];
        if ((x->op == OP_INPUT || x->op == OP_PARAM) && x->name && x->name < (uint32_t)g->nstrings)
            keys[n++] = (uint64_t)x->op << 32 | x->name;
    }
    for (int32_t i = 0; i < g->noutputs; i++) {
        const Output *o = &g->outputs[i];
        if (o->name && o->name < (uint32_t)g->nstrings) keys[n++] = (uint64_t)(OP_COUNT + o->kind) << 32 | o->name;
    }
    qsort(keys, (size_t)n, sizeof *keys, cmp_u64);
    for (int64_t i = 1; i < n; i++) {
        if (keys[i] != keys[i - 1] || (i > 1 && keys[i] == keys[i - 2])) continue;
        unsigned what = (unsigned)(keys[i] >> 32);
        const char *name = g->strings + (uint32_t)keys[i];
        if (what < OP_COUNT) graph_problem(v, "%s name '%s' is used by more than one node", ir_op_info[what].name, name);
        else graph_problem(v, "%s '%s': the name is used by more than one %s output",
                           ir_output_kind_name((OutputKind)(what - OP_COUNT)), name,
                           ir_output_kind_name((OutputKind)(what - OP_COUNT)));
    }
    free(keys);
}

static void check_outputs(V *v)
{
    const Graph *g = v->g;
    for (int32_t i = 0; i < g->noutputs; i++) {
        const Output *o = &g->outputs[i];
        const char *name = o->name < (uint32_t)g->nstrings ? g->strings + o->name : "?";
        if (o->kind >= OUT_KIND_COUNT) {
            graph_problem(v, "output #%d '%s': invalid kind %d", i, name, o->kind);
            continue;
        }
        const char *kind = ir_output_kind_name((OutputKind)o->kind);
        if (o->name >= (uint32_t)g->nstrings) { graph_problem(v, "%s #%d: name offset is out of range", kind, i); continue; }
        if (!o->name) graph_problem(v, "%s '': an output needs a name", kind);
        if (o->node < 0 || o->node >= g->nnodes) {
            graph_problem(v, "%s '%s': refers to %%%d, which is not a node", kind, name, o->node);
            continue;
        }
        if (o->kind != OUT_LOSS || !v->usable[o->node]) continue;
        const Node *n = &g->nodes[o->node];
        bool scalar = true;
        for (int j = 0; j < n->shape.rank; j++)
            scalar = scalar && ir_dim_is_const(n->shape.d[j]) && n->shape.d[j].k == 1;
        if (!scalar || !ir_dtype_is_float((DType)n->dtype))
            graph_problem(v, "%s '%s': must be a floating-point scalar, but %%%d is %s%s", kind, name, o->node,
                          dt(n->dtype), shp(v, &n->shape));
    }
}

int ir_verify(const Graph *g, StrBuf *err)
{
    V v;
    memset(&v, 0, sizeof v);
    v.g = g;
    v.err = err;
    for (int i = 0; i < 4; i++) sb_init(&v.fmt[i]);
    if (g->mode != MODE_TRAIN && g->mode != MODE_EVAL && g->mode != MODE_DECODE) graph_problem(&v, "graph: invalid mode %d", g->mode);
    if (g->nsyms < 0 || g->nsyms > IR_MAX_SYMS) {
        graph_problem(&v, "graph: symbol count %d is out of range", g->nsyms);
        return v.count; /* every dim check would index the table out of range */
    }
    for (int i = 0; i < g->nsyms; i++)
        if (!g->syms[i].name) {
            graph_problem(&v, "symbol $%d has no name", i);
            return v.count; /* formatting any dim could read the missing name */
        }
    for (int i = 0; i < g->nsyms; i++) {
        const Symbol *s = &g->syms[i];
        if (s->max < 1 || s->max > IR_MAX_DIM)
            graph_problem(&v, "symbol '%s': bound %lld is not between 1 and 2^32", s->name, (long long)s->max);
        for (int j = 0; j < i; j++)
            if (g->syms[j].name && !strcmp(g->syms[j].name, s->name))
                graph_problem(&v, "symbol '%s': declared twice ($%d and $%d)", s->name, j, i);
    }
    v.usable = xcalloc((size_t)(g->nnodes > 0 ? g->nnodes : 1), sizeof *v.usable);
    for (NodeId id = 0; id < g->nnodes; id++) check_node(&v, id);
    check_outputs(&v);
    check_duplicates(&v);
    free(v.usable);
    for (int i = 0; i < 4; i++) sb_free(&v.fmt[i]);
    return v.count;
}
