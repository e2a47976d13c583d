/* interp.c — the reference interpreter: executes a Graph node by node in double precision.
 *
 * It is the oracle that gradient checks and every generated kernel are compared against,
 * so it is written to be obviously right rather than fast: one straightforward loop per
 * op, a generic N-d walk for the data-movement ops, and a check of every shape and
 * attribute it relies on, so that a malformed graph yields an error message instead of an
 * out-of-bounds access.
 *
 * Values. Every value is held as doubles whatever its dtype. Float dtypes (f16, bf16, f32,
 * f64) are NOT rounded to their width, so gradient checks see true derivatives. Integer
 * and bool dtypes hold exact integers: after every op, and on interp_set, values of those
 * dtypes are converted as a store into a real tensor of that dtype would convert them:
 *   bool  x != 0 (so NaN is true);
 *   u8    truncate toward zero, then wrap mod 256;
 *   i32   truncate toward zero, then wrap to two's complement (like C's i64 -> i32);
 *   i64   truncate toward zero, saturating at [-2^63, 2^63 - 1024] (the largest double
 *         below 2^63): a double cannot hold i64 values above 2^53 exactly anyway;
 *   NaN and infinities become 0 for u8/i32/i64 (C leaves those conversions undefined).
 * So integer arithmetic wraps as it would on the device (i32 2147483647 + 1 = -2^31).
 *
 * Shapes. Every node's dims are evaluated at ip->symvals (each symbol's max unless
 * interp_set_symbol changed it). A leaf's value is stored with the dims in force when it
 * was set; running with different dims is an error rather than a silent reinterpretation.
 *
 * Documented choices where ops.h leaves room: argmax returns the first NaN if there is
 * one (as torch.argmax does), else the first maximum; max/min/reduce_max propagate NaN
 * (torch.maximum); sign(NaN) = NaN; relu follows ops.h literally (x > 0 ? x : 0, so
 * relu(NaN) = 0); reduce_max over an empty axis gives -inf; argmax over an empty axis 0;
 * slice requires 0 <= start and 0 <= end (end beyond the dim is clamped to it). */
#include "ir.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "../util/rng.h"

/* ---- dtype conversion ---- */

static double wrap_int(double x, double mod, double lo)
{
    if (!isfinite(x)) return 0.0;
    double r = fmod(trunc(x), mod); /* exact for every finite double */
    if (r < lo) r += mod;
    if (r >= lo + mod) r -= mod;
    return r + 0.0; /* -0.0 -> +0.0: integers have no negative zero */
}

static double to_dtype(DType t, double x)
{
    switch (t) {
    case DT_BOOL: return x != 0 ? 1.0 : 0.0;
    case DT_U8: return wrap_int(x, 256.0, 0.0);
    case DT_I32: return wrap_int(x, 4294967296.0, -2147483648.0);
    case DT_I64:
        if (isnan(x)) return 0.0;
        x = trunc(x);
        if (x >= 0x1p63) return 0x1p63 - 1024.0;
        if (x < -0x1p63) return -0x1p63;
        return x + 0.0;
    default: return x;
    }
}

/* x (first rounded to f32) rounded to bf16 stochastically with u, uniform in [0, 1) with 24
 * random bits (kiln_rng_uniform24): away from zero when the 16 random bits floor(u * 2^16)
 * reach 2^16 less the distance from x to the bf16 value toward zero, in units of 2^-16 of
 * the step between the two (kiln_half.h adds the bits to x's low 16 bits instead; the test
 * checks that the two agree). The probability of rounding away is that distance: the
 * expected result is x. */
double interp_round_stochastic(double x, double u)
{
    x = (double)(float)x;
    if (x == 0 || !isfinite(x)) return x;
    int e = ilogb(x);
    if (e < -126) e = -126;
    const double q = ldexp(1.0, e - 7);
    const double toward = trunc(x / q) * q, m = fabs(x - toward) / q * 65536.0; /* an integer */
    double r = floor(u * 65536.0) + m >= 65536.0 ? toward + copysign(q, x) : toward;
    if (fabs(r) > 0x1.fep127) r = copysign(INFINITY, x);
    return r;
}

/* x rounded to the nearest value of a half-precision dtype (bf16: 8 significant bits and
 * f32's exponent range; f16: 11 bits, normals from 2^-14, largest 65504), ties to even,
 * beyond the largest to infinity. x is first rounded to f32, as the generated code holds
 * it, so the two round the same way (kiln_half.h). */
static double round_half(DType t, double x)
{
    x = (double)(float)x;
    if (x == 0 || !isfinite(x)) return x;
    const int bits = t == DT_BF16 ? 8 : 11, emin = t == DT_BF16 ? -126 : -14;
    const double largest = t == DT_BF16 ? 0x1.fep127 : 65504.0;
    int e = ilogb(x);
    if (e < emin) e = emin;
    const double q = ldexp(1.0, e - (bits - 1));
    double r = nearbyint(x / q) * q; /* the default rounding: to nearest, ties to even */
    if (fabs(r) > largest) r = copysign(INFINITY, x);
    return r;
}

void interp_normalise(DType t, double *v, int64_t n)
{
    if (t == DT_BF16 || t == DT_F16) {
        for (int64_t i = 0; i < n; i++) v[i] = round_half(t, v[i]);
        return;
    }
    if (ir_dtype_is_float(t)) return;
    for (int64_t i = 0; i < n; i++) v[i] = to_dtype(t, v[i]);
}

/* ---- errors ---- */

static void put_where(Interp *ip, NodeId id)
{
    const Node *nd = &ip->g->nodes[id];
    const char *name = nd->op < OP_COUNT ? ir_op_info[nd->op].name : "?";
    sb_printf(&ip->err, "%s at node %%%d", name, (int)id);
    if (nd->loc.line) {
        const char *file = nd->loc.file < ip->g->nfiles ? ip->g->files[nd->loc.file] : "?";
        sb_printf(&ip->err, " (%s:%u:%u)", file, (unsigned)nd->loc.line, (unsigned)nd->loc.col);
    }
    sb_puts(&ip->err, ": ");
}

static int fail(Interp *ip, NodeId id, const char *fmt, ...) KILN_PRINTF(3, 4);
static int fail(Interp *ip, NodeId id, const char *fmt, ...)
{
    put_where(ip, id);
    va_list ap;
    va_start(ap, fmt);
    sb_vprintf(&ip->err, fmt, ap);
    va_end(ap);
    return -1;
}

static void put_dims(StrBuf *b, const ITensor *t)
{
    sb_putc(b, '[');
    for (int i = 0; i < t->rank; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)t->dims[i]);
    sb_putc(b, ']');
}

/* ---- tensors and N-d walks ---- */

static bool same_dims(const ITensor *a, const ITensor *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] != b->dims[i]) return false;
    return true;
}

static void strides(const ITensor *t, int64_t *st)
{
    int64_t s = 1;
    for (int i = t->rank - 1; i >= 0; i--) {
        st[i] = s;
        s *= t->dims[i];
    }
}

/* Walks the row-major index space of `dims` while tracking the offset of the same index
 * in another tensor laid out with strides st (0 for a broadcast axis). It replaces the
 * per-op index arithmetic of expand, permute, slice, concat and reductions by one loop
 * that is easy to check once. */
typedef struct {
    int rank;
    int64_t dims[IR_MAX_RANK], idx[IR_MAX_RANK], st[IR_MAX_RANK];
    int64_t off;
} Walk;

static void walk_init(Walk *w, const ITensor *t, const int64_t *st, int64_t base)
{
    memset(w, 0, sizeof *w);
    w->rank = t->rank;
    memcpy(w->dims, t->dims, sizeof w->dims);
    if (st) memcpy(w->st, st, sizeof w->st);
    w->off = base;
}

static void walk_next(Walk *w)
{
    for (int i = w->rank - 1; i >= 0; i--) {
        w->off += w->st[i];
        if (++w->idx[i] < w->dims[i]) return;
        w->off -= w->st[i] * w->dims[i];
        w->idx[i] = 0;
    }
}

/* a * b for non-negative a, b; false when it exceeds IR_MAX_ELEMENTS (so never overflows). */
static bool mul_ok(int64_t a, int64_t b, int64_t *r)
{
    if (a < 0 || b < 0 || (a != 0 && b > IR_MAX_ELEMENTS / a)) return false;
    *r = a * b;
    return true;
}

/* Evaluates the node's shape at the current symbol values. Besides the element count, the
 * product of the non-zero dims is bounded too, so that strides can never overflow even
 * when a zero dim makes the tensor empty. */
static int eval_shape(Interp *ip, NodeId id, ITensor *t)
{
    const Graph *g = ip->g;
    const Shape *s = &g->nodes[id].shape;
    memset(t, 0, sizeof *t);
    if (s->rank > IR_MAX_RANK) return fail(ip, id, "rank %d exceeds %d", s->rank, IR_MAX_RANK);
    t->rank = s->rank;
    int64_t n = 1, nz = 1;
    bool ok = true;
    for (int i = 0; i < s->rank && ok; i++) {
        Dim d = s->d[i];
        if (d.nsym > IR_MAX_DIM_SYMS) return fail(ip, id, "malformed dim %d", i);
        /* Check each factor first: ir_dim_eval itself does not guard against overflow. */
        int64_t v = d.k;
        ok = v >= -IR_MAX_DIM && v <= IR_MAX_DIM;
        for (int j = 0; j < d.nsym && ok; j++) {
            if (d.sym[j] >= g->nsyms) return fail(ip, id, "dim %d uses unknown symbol %d", i, d.sym[j]);
            int64_t sv = ip->symvals[d.sym[j]];
            ok = sv >= 0 && (sv == 0 || llabs(v) <= IR_MAX_ELEMENTS / sv);
            if (ok) v *= sv;
        }
        if (ok) t->dims[i] = ir_dim_eval(d, ip->symvals);
        ok = ok && t->dims[i] >= 0 && t->dims[i] <= IR_MAX_DIM;
        ok = ok && mul_ok(n, t->dims[i], &n) && mul_ok(nz, t->dims[i] ? t->dims[i] : 1, &nz);
    }
    if (!ok) {
        StrBuf b;
        sb_init(&b);
        ir_shape_format(&b, g, s);
        int rc = fail(ip, id, "shape %s is negative or has more than 2^40 elements at the current symbol values", b.data);
        sb_free(&b);
        return rc;
    }
    t->n = n;
    return 0;
}

static const char *leaf_kind(Op op) { return op == OP_INPUT ? "input" : "param"; }

/* ---- elementwise maths ---- */

double interp_unary(Op op, double x)
{
    switch (op) {
    case OP_NEG: return -x;
    case OP_ABS: return fabs(x);
    case OP_SIGN: return isnan(x) ? x : (x > 0) - (x < 0);
    case OP_EXP: return exp(x);
    case OP_LOG: return log(x);
    case OP_SQRT: return sqrt(x);
    case OP_TANH: return tanh(x);
    /* Two forms so that exp never overflows to inf/inf. */
    case OP_SIGMOID: return x >= 0 ? 1.0 / (1.0 + exp(-x)) : exp(x) / (1.0 + exp(x));
    case OP_RELU: return x > 0 || isnan(x) ? x : 0.0; /* NaN propagates, as in PyTorch */
    case OP_ERF: return erf(x);
    case OP_SIN: return sin(x);
    case OP_COS: return cos(x);
    case OP_FLOOR: return floor(x);
    case OP_NOT: return x == 0 ? 1.0 : 0.0;
    default: return x; /* cast and detach: identity here (a cast converts in the normalise() that follows every op) */
    }
}

double interp_binary(Op op, double x, double y)
{
    switch (op) {
    case OP_ADD: return x + y;
    case OP_SUB: return x - y;
    case OP_MUL: return x * y;
    case OP_DIV: return x / y;
    case OP_MAX: return isnan(x) || isnan(y) ? NAN : x > y ? x : y;
    case OP_MIN: return isnan(x) || isnan(y) ? NAN : x < y ? x : y;
    case OP_POW: return pow(x, y);
    case OP_EQ: return x == y;
    case OP_NE: return x != y;
    case OP_LT: return x < y;
    case OP_LE: return x <= y;
    case OP_GT: return x > y;
    case OP_GE: return x >= y;
    case OP_AND: return x != 0 && y != 0;
    case OP_OR: return x != 0 || y != 0;
    case OP_ROUND_STOCHASTIC: return interp_round_stochastic(x, y);
    default: return NAN;
    }
}

/* ---- ops with structure ---- */

static int run_reduce(Interp *ip, NodeId id, const ITensor *x, ITensor *o, uint64_t mask, bool is_max)
{
    if (x->rank != o->rank || (x->rank < 64 && (mask >> x->rank) != 0))
        return fail(ip, id, "axes 0x%llx do not fit rank %d", (unsigned long long)mask, x->rank);
    int64_t ost[IR_MAX_RANK];
    strides(o, ost);
    for (int i = 0; i < x->rank; i++) {
        bool red = (mask >> i) & 1;
        if (o->dims[i] != (red ? 1 : x->dims[i])) return fail(ip, id, "output shape does not match the reduction");
        if (red) ost[i] = 0;
    }
    if (is_max)
        for (int64_t e = 0; e < o->n; e++) o->data[e] = -INFINITY;
    Walk w;
    walk_init(&w, x, ost, 0);
    for (int64_t e = 0; e < x->n; e++, walk_next(&w)) {
        double v = x->data[e], *acc = &o->data[w.off];
        if (!is_max) *acc += v;
        else if (isnan(v) || v > *acc) *acc = v; /* once NaN, nothing compares greater */
    }
    return 0;
}

static int run_argmax(Interp *ip, NodeId id, const ITensor *x, ITensor *o, int64_t axis)
{
    if (axis < 0 || axis >= x->rank || o->rank != x->rank) return fail(ip, id, "axis %lld out of range", (long long)axis);
    for (int i = 0; i < x->rank; i++)
        if (o->dims[i] != (i == axis ? 1 : x->dims[i])) return fail(ip, id, "output shape does not match the input");
    int64_t xst[IR_MAX_RANK];
    strides(x, xst);
    int64_t len = x->dims[axis], step = xst[axis];
    Walk w;
    walk_init(&w, o, xst, 0);
    for (int64_t e = 0; e < o->n; e++, walk_next(&w)) {
        int64_t best = 0;
        double bv = len ? x->data[w.off] : 0;
        for (int64_t k = 1; k < len && !isnan(bv); k++) {
            double v = x->data[w.off + k * step];
            if (isnan(v) || v > bv) best = k, bv = v;
        }
        o->data[e] = (double)best;
    }
    return 0;
}

static int run_permute(Interp *ip, NodeId id, const ITensor *x, ITensor *o, const int64_t *perm)
{
    int64_t xst[IR_MAX_RANK], st[IR_MAX_RANK];
    bool seen[IR_MAX_RANK] = {false};
    if (x->rank != o->rank) return fail(ip, id, "rank differs from the input");
    strides(x, xst);
    for (int i = 0; i < o->rank; i++) {
        int64_t p = perm[i];
        if (p < 0 || p >= x->rank || seen[p]) return fail(ip, id, "attrs are not a permutation");
        seen[p] = true;
        if (o->dims[i] != x->dims[p]) return fail(ip, id, "output shape does not match the permuted input");
        st[i] = xst[p];
    }
    Walk w;
    walk_init(&w, o, st, 0);
    for (int64_t e = 0; e < o->n; e++, walk_next(&w)) o->data[e] = x->data[w.off];
    return 0;
}

static int run_slice(Interp *ip, NodeId id, const ITensor *x, ITensor *o, const int64_t *a)
{
    int64_t axis = a[0], start = a[1], end = a[2], step = a[3];
    if (axis < 0 || axis >= x->rank || o->rank != x->rank) return fail(ip, id, "axis %lld out of range", (long long)axis);
    if (start < 0 || end < 0 || step < 1)
        return fail(ip, id, "unsupported slice %lld:%lld:%lld", (long long)start, (long long)end, (long long)step);
    int64_t dim = x->dims[axis], stop = end > dim ? dim : end; /* IR_SLICE_END > any dim */
    int64_t count = stop > start ? (stop - start - 1) / step + 1 : 0;
    for (int i = 0; i < x->rank; i++)
        if (o->dims[i] != (i == axis ? count : x->dims[i]))
            return fail(ip, id, "output shape does not match the slice (%lld elements of %lld along axis %lld)",
                        (long long)count, (long long)dim, (long long)axis);
    if (o->n == 0) return 0;
    int64_t st[IR_MAX_RANK];
    strides(x, st);
    int64_t base = start * st[axis];
    if (count > 1) st[axis] *= step; /* step < dim here, so this cannot overflow */
    Walk w;
    walk_init(&w, o, st, base);
    for (int64_t e = 0; e < o->n; e++, walk_next(&w)) o->data[e] = x->data[w.off];
    return 0;
}

static int run_concat(Interp *ip, NodeId id, const ITensor *const *xs, int nx, ITensor *o, int64_t axis)
{
    if (axis < 0 || axis >= o->rank) return fail(ip, id, "axis %lld out of range", (long long)axis);
    int64_t ost[IR_MAX_RANK], at = 0;
    strides(o, ost);
    for (int k = 0; k < nx; k++) {
        const ITensor *x = xs[k];
        if (x->rank != o->rank) return fail(ip, id, "operand %d has rank %d, not %d", k, x->rank, o->rank);
        for (int i = 0; i < o->rank; i++)
            if (i != axis && x->dims[i] != o->dims[i]) return fail(ip, id, "operand %d does not match the output", k);
        if (x->dims[axis] > o->dims[axis] - at) return fail(ip, id, "operands exceed the output along the axis");
        Walk w;
        walk_init(&w, x, ost, at * ost[axis]);
        for (int64_t e = 0; e < x->n; e++, walk_next(&w)) o->data[w.off] = x->data[e];
        at += x->dims[axis];
    }
    if (at != o->dims[axis]) return fail(ip, id, "operands do not fill the output along the axis");
    return 0;
}

static int run_pad(Interp *ip, NodeId id, const ITensor *x, ITensor *o, const int64_t *lo, const int64_t *hi, double fill)
{
    if (x->rank != o->rank) return fail(ip, id, "rank differs from the input");
    for (int i = 0; i < o->rank; i++)
        if (llabs(lo[i]) > IR_MAX_DIM || llabs(hi[i]) > IR_MAX_DIM || o->dims[i] != x->dims[i] + lo[i] + hi[i])
            return fail(ip, id, "output shape does not match the padding");
    int64_t xst[IR_MAX_RANK];
    strides(x, xst);
    Walk w;
    walk_init(&w, o, NULL, 0);
    /* Per element, map the output index back into the input; negative pads (crops) fall
     * out of the same rule. */
    for (int64_t e = 0; e < o->n; e++, walk_next(&w)) {
        int64_t off = 0;
        bool inside = true;
        for (int i = 0; i < o->rank && inside; i++) {
            int64_t c = w.idx[i] - lo[i];
            inside = c >= 0 && c < x->dims[i];
            if (inside) off += c * xst[i];
        }
        o->data[e] = inside ? x->data[off] : fill;
    }
    return 0;
}

static int bad_index(Interp *ip, NodeId id, double v, int64_t rows)
{
    return fail(ip, id, "index %.17g out of range [0, %lld)", v, (long long)rows);
}

/* gather and scatter_add share the layout: idx[I...] selects rows of a [rows, R...] tensor;
 * `data` is [I..., R...]. */
static int run_gather_scatter(Interp *ip, NodeId id, const ITensor *idx, const ITensor *table, const ITensor *data,
                              double *out, bool scatter)
{
    if (table->rank < 1 || data->rank != idx->rank + table->rank - 1)
        return fail(ip, id, "operand ranks do not match");
    for (int i = 0; i < idx->rank; i++)
        if (data->dims[i] != idx->dims[i]) return fail(ip, id, "leading dims differ from the index");
    int64_t rowsize = 1;
    for (int i = 1; i < table->rank; i++) {
        if (data->dims[idx->rank + i - 1] != table->dims[i]) return fail(ip, id, "row dims do not match");
        rowsize *= table->dims[i];
    }
    int64_t rows = table->dims[0];
    for (int64_t k = 0; k < idx->n; k++) {
        double v = idx->data[k];
        if (!(v >= 0 && v < (double)rows)) return bad_index(ip, id, v, rows);
        int64_t r = (int64_t)v;
        if (scatter)
            for (int64_t j = 0; j < rowsize; j++) out[r * rowsize + j] += data->data[k * rowsize + j];
        else
            memcpy(out + k * rowsize, table->data + r * rowsize, (size_t)rowsize * sizeof *out);
    }
    return 0;
}

static int run_matmul(Interp *ip, NodeId id, const ITensor *x, const ITensor *y, ITensor *o)
{
    int r = o->rank;
    if (r < 2 || x->rank != r || y->rank != r) return fail(ip, id, "operands must have the output's rank (>= 2)");
    int64_t batch = 1;
    for (int i = 0; i < r - 2; i++) {
        if (x->dims[i] != o->dims[i] || y->dims[i] != o->dims[i]) return fail(ip, id, "batch dims differ");
        batch *= o->dims[i];
    }
    int64_t M = x->dims[r - 2], K = x->dims[r - 1], N = y->dims[r - 1];
    if (y->dims[r - 2] != K || o->dims[r - 2] != M || o->dims[r - 1] != N)
        return fail(ip, id, "inner or outer dims do not match");
    /* i-k-j order: the inner loop runs along contiguous rows of y and out. No skipping of
     * zeros, so that 0 * inf still gives NaN. */
    for (int64_t b = 0; b < batch; b++) {
        const double *xb = x->data + b * M * K, *yb = y->data + b * K * N;
        double *ob = o->data + b * M * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t k = 0; k < K; k++) {
                double a = xb[m * K + k];
                const double *yr = yb + k * N;
                double *orow = ob + m * N;
                for (int64_t n = 0; n < N; n++) orow[n] += a * yr[n];
            }
    }
    return 0;
}

/* unfold (fold = false): img [N, C, H, W] -> cols [N, C*KH*KW, OH*OW];
 * fold (fold = true): cols -> img, summing where windows overlap. One loop nest for both
 * makes them adjoint by construction: each (img element, cols element) pair is visited
 * once, copied one way or accumulated the other. */
static int run_window(Interp *ip, NodeId id, ITensor *img, ITensor *cols, const int64_t *a, bool fold)
{
    int64_t KH = a[0], KW = a[1], SH = a[2], SW = a[3], DH = a[4], DW = a[5];
    for (int i = 0; i < 6; i++)
        if (a[i] < 1 || a[i] > IR_MAX_DIM) return fail(ip, id, "window attrs must be in [1, 2^32]");
    if (img->rank != 4 || cols->rank != 3) return fail(ip, id, "expects [N, C, H, W] and [N, C*KH*KW, L]");
    int64_t N = img->dims[0], C = img->dims[1], H = img->dims[2], W = img->dims[3], span_h, span_w, R, L;
    if (!mul_ok(KH - 1, DH, &span_h) || !mul_ok(KW - 1, DW, &span_w) || !mul_ok(KH, KW, &R) || !mul_ok(R, C, &R))
        return fail(ip, id, "window too large");
    int64_t OH = H > span_h ? (H - span_h - 1) / SH + 1 : 0;
    int64_t OW = W > span_w ? (W - span_w - 1) / SW + 1 : 0;
    L = OH * OW; /* <= H * W */
    if (cols->dims[0] != N || cols->dims[1] != R || cols->dims[2] != L)
        return fail(ip, id, "[N, C*KH*KW, OH*OW] should be [%lld, %lld, %lld]", (long long)N, (long long)R, (long long)L);
    for (int64_t n = 0; n < N; n++)
        for (int64_t c = 0; c < C; c++)
            for (int64_t i = 0; i < KH; i++)
                for (int64_t j = 0; j < KW; j++) {
                    int64_t row = (c * KH + i) * KW + j;
                    double *col = cols->data + (n * R + row) * L;
                    const int64_t plane = (n * C + c) * H;
                    for (int64_t oh = 0; oh < OH; oh++)
                        for (int64_t ow = 0; ow < OW; ow++) {
                            int64_t h = oh * SH + i * DH, w = ow * SW + j * DW;
                            double *px = img->data + (plane + h) * W + w;
                            if (fold) *px += col[oh * OW + ow];
                            else col[oh * OW + ow] = *px;
                        }
                }
    return 0;
}

/* ---- per-node evaluation ---- */

/* Attribute count an op reads, so that a short attr list is an error, not an overread. */
static int64_t attrs_needed(const Node *nd)
{
    switch (ir_op_info[nd->op].attrs) {
    case ATTRS_PARAM: case ATTRS_AXIS: case ATTRS_AXES: case ATTRS_STREAM: return 1;
    case ATTRS_PERM: return nd->shape.rank;
    case ATTRS_SLICE: return 4;
    case ATTRS_PAD: return 2 * (int64_t)nd->shape.rank;
    case ATTRS_WINDOW: return 6;
    case ATTRS_ATTENTION: return 2;
    case ATTRS_ATTENTION_GRAD: return 3;
    default: return 0;
    }
}

static int check_leaf(Interp *ip, NodeId id, const ITensor *want)
{
    const ITensor *v = &ip->vals[id];
    const char *kind = leaf_kind((Op)ip->g->nodes[id].op), *name = ir_node_name(ip->g, id);
    if (!v->data) {
        sb_printf(&ip->err, "%s '%s' has no value", kind, name);
        return -1;
    }
    if (!same_dims(v, want)) {
        sb_printf(&ip->err, "%s '%s' was set with shape ", kind, name);
        put_dims(&ip->err, v);
        sb_puts(&ip->err, " but has shape ");
        put_dims(&ip->err, want);
        sb_puts(&ip->err, " at the current symbol values; set it again");
        return -1;
    }
    return 0;
}

static int eval_node(Interp *ip, NodeId id)
{
    const Graph *g = ip->g;
    const Node *nd = &g->nodes[id];
    if (nd->op >= OP_COUNT || nd->dtype >= DT_COUNT) return fail(ip, id, "unknown op or dtype");
    Op op = (Op)nd->op;
    int arity = ir_op_info[op].arity;
    if (arity >= 0 ? nd->ninputs != (uint32_t)arity : nd->ninputs < 1)
        return fail(ip, id, "wrong number of operands (%u)", nd->ninputs);
    if ((int64_t)nd->nattrs < attrs_needed(nd)) return fail(ip, id, "too few attributes (%u)", nd->nattrs);
    if ((int64_t)nd->inputs + nd->ninputs > g->noperands || (int64_t)nd->attrs + nd->nattrs > g->nattrs)
        return fail(ip, id, "operand or attribute list out of range");
    const ITensor *in[3] = {NULL, NULL, NULL};
    for (uint32_t i = 0; i < nd->ninputs; i++) {
        NodeId x = ir_input(g, id, (int)i);
        if (x < 0 || x >= id) return fail(ip, id, "operand %u (%%%d) is not an earlier node", i, (int)x);
        if (i < 3) in[i] = &ip->vals[x];
    }
    ITensor t;
    if (eval_shape(ip, id, &t) < 0) return -1;
    if (op == OP_INPUT || op == OP_PARAM) return check_leaf(ip, id, &t);

    const int64_t *a = ir_attrs(g, id);
    ITensor *o = &ip->vals[id];
    *o = t;
    o->data = xcalloc((size_t)(t.n ? t.n : 1), sizeof *o->data);
    unsigned flags = ir_op_info[op].flags;
    if (flags & (OPF_UNARY | OPF_BINARY) || op == OP_WHERE) {
        for (uint32_t i = 0; i < nd->ninputs; i++)
            if (!same_dims(in[i], o)) return fail(ip, id, "operand %u does not have the output's shape", i);
    }
    int rc = 0;
    switch (op) {
    case OP_INPUT: case OP_PARAM: break; /* handled above */
    case OP_CONST:
        for (int64_t e = 0; e < o->n; e++) o->data[e] = nd->fattr[0];
        break;
    case OP_IOTA: {
        if (a[0] < 0 || a[0] >= o->rank) return fail(ip, id, "axis %lld out of range", (long long)a[0]);
        Walk w;
        walk_init(&w, o, NULL, 0);
        for (int64_t e = 0; e < o->n; e++, walk_next(&w)) o->data[e] = (double)w.idx[a[0]];
        break;
    }
    case OP_LOSS_SCALE: o->data[0] = (double)(float)ip->loss_scale; break;
    case OP_RANDOM_UNIFORM:
        for (int64_t e = 0; e < o->n; e++)
            o->data[e] = kiln_rng_uniform24(ip->seed, ip->step, (uint64_t)a[0], (uint64_t)e);
        break;
    case OP_NEG: case OP_ABS: case OP_SIGN: case OP_EXP: case OP_LOG: case OP_SQRT: case OP_TANH:
    case OP_SIGMOID: case OP_RELU: case OP_ERF: case OP_SIN: case OP_COS: case OP_FLOOR:
    case OP_NOT: case OP_CAST: case OP_DETACH:
        for (int64_t e = 0; e < o->n; e++) o->data[e] = interp_unary(op, in[0]->data[e]);
        break;
    case OP_DIV:
        if (!ir_dtype_is_float((DType)nd->dtype)) {
            for (int64_t e = 0; e < o->n; e++) {
                if (in[1]->data[e] == 0) return fail(ip, id, "integer division by zero");
                o->data[e] = trunc(in[0]->data[e] / in[1]->data[e]); /* exact below 2^53 */
            }
            break;
        }
        /* fall through */
    case OP_ADD: case OP_SUB: case OP_MUL: case OP_MAX: case OP_MIN: case OP_POW:
    case OP_EQ: case OP_NE: case OP_LT: case OP_LE: case OP_GT: case OP_GE: case OP_AND: case OP_OR:
    case OP_ROUND_STOCHASTIC:
        for (int64_t e = 0; e < o->n; e++) o->data[e] = interp_binary(op, in[0]->data[e], in[1]->data[e]);
        break;
    case OP_WHERE:
        for (int64_t e = 0; e < o->n; e++) o->data[e] = in[0]->data[e] != 0 ? in[1]->data[e] : in[2]->data[e];
        break;
    case OP_REDUCE_SUM: case OP_REDUCE_MAX:
        rc = run_reduce(ip, id, in[0], o, (uint64_t)a[0], op == OP_REDUCE_MAX);
        break;
    case OP_ARGMAX: rc = run_argmax(ip, id, in[0], o, a[0]); break;
    case OP_RESHAPE:
        if (in[0]->n != o->n) return fail(ip, id, "element counts differ (%lld vs %lld)", (long long)in[0]->n, (long long)o->n);
        if (o->n) memcpy(o->data, in[0]->data, (size_t)o->n * sizeof *o->data);
        break;
    case OP_EXPAND: {
        const ITensor *x = in[0];
        int64_t st[IR_MAX_RANK];
        if (x->rank != o->rank) return fail(ip, id, "rank differs from the input");
        strides(x, st);
        for (int i = 0; i < o->rank; i++) {
            if (x->dims[i] == 1) st[i] = 0;
            else if (x->dims[i] != o->dims[i]) return fail(ip, id, "dim %d is neither 1 nor the output's", i);
        }
        Walk w;
        walk_init(&w, o, st, 0);
        for (int64_t e = 0; e < o->n; e++, walk_next(&w)) o->data[e] = x->data[w.off];
        break;
    }
    case OP_PERMUTE: rc = run_permute(ip, id, in[0], o, a); break;
    case OP_SLICE: rc = run_slice(ip, id, in[0], o, a); break;
    case OP_CONCAT: {
        int nx = (int)nd->ninputs;
        const ITensor **xs = xmalloc((size_t)nx * sizeof *xs);
        for (int k = 0; k < nx; k++) xs[k] = &ip->vals[ir_input(g, id, k)];
        rc = run_concat(ip, id, xs, nx, o, a[0]);
        free(xs);
        break;
    }
    case OP_PAD: rc = run_pad(ip, id, in[0], o, a, a + o->rank, nd->fattr[0]); break;
    case OP_CHECK_INDEX:
        for (int64_t e = 0; e < o->n; e++) {
            double v = in[0]->data[e];
            if (!(v >= 0 && v < (double)a[0])) {
                const char *what = ir_node_name(g, id);
                return fail(ip, id, "%s%sindex %.17g out of range [0, %lld)", what, *what ? ": " : "", v, (long long)a[0]);
            }
            o->data[e] = v;
        }
        break;
    case OP_GATHER: rc = run_gather_scatter(ip, id, in[1], in[0], o, o->data, false); break;
    case OP_SCATTER_ADD: rc = run_gather_scatter(ip, id, in[0], o, in[1], o->data, true); break;
    case OP_MATMUL: rc = run_matmul(ip, id, in[0], in[1], o); break;
    case OP_UNFOLD: rc = run_window(ip, id, (ITensor *)in[0], o, a, false); break;
    case OP_FOLD: rc = run_window(ip, id, o, (ITensor *)in[0], a, true); break;
    case OP_ATTENTION: case OP_ATTENTION_LSE: case OP_ATTENTION_GRAD: {
        const ITensor *xs[7];
        if (nd->ninputs > 7) return fail(ip, id, "too many operands (%u)", nd->ninputs);
        for (uint32_t k = 0; k < nd->ninputs; k++) xs[k] = &ip->vals[ir_input(g, id, (int)k)];
        StrBuf why;
        sb_init(&why);
        rc = interp_attention(g, id, xs, (int)nd->ninputs, o, ip->seed, ip->step, &why);
        if (rc < 0) fail(ip, id, "%s", why.data);
        sb_free(&why);
        break;
    }
    case OP_COUNT: break;
    }
    if (rc < 0) return rc;
    interp_normalise((DType)nd->dtype, o->data, o->n);
    return 0;
}

/* ---- API ---- */

void interp_init(Interp *ip, const Graph *g)
{
    memset(ip, 0, sizeof *ip);
    ip->g = g;
    ip->loss_scale = 1;
    for (int i = 0; i < g->nsyms; i++) ip->symvals[i] = g->syms[i].max;
    ip->vals = xcalloc((size_t)(g->nnodes ? g->nnodes : 1), sizeof *ip->vals);
    sb_init(&ip->err);
}

void interp_free(Interp *ip)
{
    if (ip->vals)
        for (NodeId i = 0; i < ip->g->nnodes; i++) free(ip->vals[i].data);
    free(ip->vals);
    sb_free(&ip->err);
    memset(ip, 0, sizeof *ip);
}

int interp_set_symbol(Interp *ip, const char *name, int64_t value)
{
    int s = ir_find_symbol(ip->g, name);
    if (s < 0 || value < 0 || value > ip->g->syms[s].max) return -1;
    ip->symvals[s] = value;
    return 0;
}

static void set_leaf(Interp *ip, NodeId leaf, const ITensor *t, double *data)
{
    free(ip->vals[leaf].data);
    ip->vals[leaf] = *t;
    ip->vals[leaf].data = data;
}

/* Only INPUT and PARAM nodes can be set; data == NULL clears the value. The data is
 * converted to the leaf's dtype (see the top of this file). A shape that cannot be
 * evaluated leaves the leaf without a value, so the next run reports it. */
void interp_set(Interp *ip, NodeId leaf, const double *data)
{
    if (leaf < 0 || leaf >= ip->g->nnodes) return;
    const Node *nd = &ip->g->nodes[leaf];
    if (nd->op != OP_INPUT && nd->op != OP_PARAM) return;
    ITensor t;
    size_t errlen = ip->err.len;
    int rc = eval_shape(ip, leaf, &t);
    ip->err.len = errlen; /* the failure resurfaces, with its message, in interp_run */
    if (ip->err.data) ip->err.data[errlen] = 0;
    if (rc < 0 || !data) {
        set_leaf(ip, leaf, &t, NULL);
        return;
    }
    double *v = xmalloc((size_t)(t.n ? t.n : 1) * sizeof *v);
    if (t.n) memcpy(v, data, (size_t)t.n * sizeof *v);
    interp_normalise((DType)nd->dtype, v, t.n);
    set_leaf(ip, leaf, &t, v);
}

/* Fills each param without a value from its init kind and arguments. The frontend has
 * already turned PyTorch's default initialisers into these (e.g. nn.Linear's weight into
 * uniform(-1/sqrt(in), 1/sqrt(in))), so the values follow PyTorch's distributions, but not
 * PyTorch's random stream: element e of param P is a pure function of (seed, FNV-1a 64 of
 * P's state_dict key, e), so it depends neither on node order nor on other params. */
void interp_init_params(Interp *ip, uint64_t seed)
{
    const Graph *g = ip->g;
    for (NodeId id = 0; id < g->nnodes; id++) {
        const Node *nd = &g->nodes[id];
        if (nd->op != OP_PARAM || ip->vals[id].data || nd->nattrs < 1) continue;
        if ((int64_t)nd->attrs + 1 > g->nattrs) continue;
        int64_t kind = ir_attrs(g, id)[0];
        if (kind < 0 || kind >= INIT_COUNT) continue; /* stays unset: interp_run reports it */
        ITensor t;
        size_t errlen = ip->err.len;
        int rc = eval_shape(ip, id, &t);
        ip->err.len = errlen;
        if (ip->err.data) ip->err.data[errlen] = 0;
        if (rc < 0) continue;
        uint64_t key = kiln_rng_name_key(ir_node_name(g, id));
        double a0 = nd->fattr[0], a1 = nd->fattr[1];
        double *v = xmalloc((size_t)(t.n ? t.n : 1) * sizeof *v);
        for (int64_t e = 0; e < t.n; e++) {
            switch ((InitKind)kind) {
            case INIT_ZEROS: v[e] = 0; break;
            case INIT_ONES: v[e] = 1; break;
            case INIT_CONSTANT: v[e] = a0; break;
            case INIT_UNIFORM: v[e] = a0 + (a1 - a0) * kiln_rng_uniform53(seed, key, 0, (uint64_t)e); break;
            case INIT_NORMAL: v[e] = a0 + a1 * kiln_rng_normal(seed, key, 0, (uint64_t)e); break;
            case INIT_COUNT: v[e] = 0; break;
            }
        }
        int64_t zr = ir_param_zero_row(g, id); /* Embedding's padding_idx row */
        if (zr >= 0 && t.rank >= 1 && zr < t.dims[0]) {
            int64_t row = t.n / t.dims[0];
            for (int64_t e = zr * row; e < (zr + 1) * row; e++) v[e] = 0;
        }
        interp_normalise((DType)nd->dtype, v, t.n);
        set_leaf(ip, id, &t, v);
    }
}

int interp_run(Interp *ip)
{
    const Graph *g = ip->g;
    ip->err.len = 0;
    if (ip->err.data) ip->err.data[0] = 0;
    for (NodeId id = 0; id < g->nnodes; id++) {
        uint16_t op = g->nodes[id].op;
        if (op == OP_INPUT || op == OP_PARAM) continue;
        free(ip->vals[id].data);
        memset(&ip->vals[id], 0, sizeof ip->vals[id]);
    }
    for (NodeId id = 0; id < g->nnodes; id++)
        if (eval_node(ip, id) < 0) return -1;
    return 0;
}

const ITensor *interp_value(const Interp *ip, NodeId id)
{
    if (id < 0 || id >= ip->g->nnodes) return NULL;
    return &ip->vals[id];
}
