/* import_fold.c — kiln import's constant folding: a node whose inputs are all constants
 * (initializers, Constants, the static shapes Shape gives, what earlier folds computed)
 * and whose operator is one of shape arithmetic's is computed here, at import, and never
 * written: PyTorch's exporter builds Reshape's and Expand's shapes from Shape, Gather,
 * Unsqueeze, Concat, Equal, Where and ConstantOfShape, and Kiln's shapes are static. The
 * result is a constant like any other: folded where read as a shape, a parameter where
 * read as a tensor. At most ONNX_FOLD_MAX elements. */
#include "import_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define ONNX_FOLD_MAX 65536

static bool is_int(int32_t t)
{
    return t == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 || t == ONNX__TENSOR_PROTO__DATA_TYPE__INT8 ||
           t == ONNX__TENSOR_PROTO__DATA_TYPE__UINT8;
}

/* The flat index in x (broadcast to out's shape) of out's element i. */
static int64_t source_index(const Val *x, int rank, const int64_t *dims, int64_t i)
{
    int64_t at = 0, stride = 1;
    for (int a = rank - 1; a >= 0; a--) {
        const int64_t c = i % dims[a];
        i /= dims[a];
        const int xa = x->rank - rank + a;
        if (xa >= 0) {
            if (x->dims[xa] != 1) at += c * stride;
            stride *= x->dims[xa];
        }
    }
    return at;
}

/* The node's output k as a constant of the given shape, type and values (taken). */
static void constant_k(Imp *im, size_t k, int rank, const int64_t *dims, int32_t type, double *values, int64_t n)
{
    Val *v = imp_add_val(im, im->node->output[k]);
    v->expr = imp_identifier(im, "p_", im->node->output[k]);
    v->source = im->node->output[k];
    v->rank = rank;
    memcpy(v->dims, dims, (size_t)rank * sizeof *dims);
    v->dtype = type;
    v->values = values ? values : xcalloc(1, sizeof *values);
    v->nvalues = n;
}

static void constant(Imp *im, int rank, const int64_t *dims, int32_t type, double *values, int64_t n)
{
    constant_k(im, 0, rank, dims, type, values, n);
}

/* Split of a constant vector (a shape) into its outputs. */
static int fold_split(Imp *im, const Val *a)
{
    const Onnx__NodeProto *n = im->node;
    if (a->rank != 1 || imp_norm_axis(imp_attr_int(n, "axis", 0), 1) != 0 || n->n_output > 16) return 0;
    int64_t sizes[16];
    int k = imp_attr_ints(n, "split", sizes, 16);
    if (k < 0 && n->n_input > 1) k = imp_const_ints(im, 1, sizes, 16);
    if (k < 0) {
        if (!n->n_output || a->nvalues % (int64_t)n->n_output) return 0;
        k = (int)n->n_output;
        for (int i = 0; i < k; i++) sizes[i] = a->nvalues / k;
    }
    int64_t total = 0;
    for (int i = 0; i < k; i++) total += sizes[i] >= 0 ? sizes[i] : -1;
    if (k != (int)n->n_output || total != a->nvalues) return 0;
    for (int i = 0, at = 0; i < k; at += (int)sizes[i], i++) {
        double *v = xmalloc((size_t)(sizes[i] + 1) * sizeof *v);
        memcpy(v, a->values + at, (size_t)sizes[i] * sizeof *v);
        const int64_t d[1] = {sizes[i]};
        constant_k(im, (size_t)i, 1, d, a->dtype, v, sizes[i]);
    }
    return 1;
}

static double binary_value(const char *op, double a, double b, bool ints)
{
    if (!strcmp(op, "Add")) return a + b;
    if (!strcmp(op, "Sub")) return a - b;
    if (!strcmp(op, "Mul")) return a * b;
    if (!strcmp(op, "Div")) return ints ? (b ? trunc(a / b) : 0) : a / b;
    if (!strcmp(op, "Equal")) return a == b;
    if (!strcmp(op, "Less")) return a < b;
    if (!strcmp(op, "Greater")) return a > b;
    return a < b ? a : b; /* Min */
}

int imp_fold(Imp *im)
{
    const Onnx__NodeProto *n = im->node;
    static const char *const foldable[] = {"Add",   "Sub",       "Mul",    "Div",   "Equal",  "Less",   "Greater", "Min",
                                           "Where", "Unsqueeze", "Squeeze", "Concat", "Gather", "Cast",   "Neg",     "Identity",
                                           "Expand", "Range",    "Slice",  "Reshape", "ConstantOfShape", "Split", NULL};
    int k = 0;
    while (foldable[k] && strcmp(foldable[k], n->op_type)) k++;
    if (!foldable[k] || (n->n_output != 1 && strcmp(n->op_type, "Split")) || !n->n_input) return 0;
    for (size_t j = 0; j < n->n_input; j++) {
        const Val *x = imp_operand(im, j);
        if (n->input[j][0] && (!x || !x->values)) return 0;
    }
    const char *op = n->op_type;
    Val *a = imp_operand(im, 0), *b = n->n_input > 1 ? imp_operand(im, 1) : NULL;
    if (!strcmp(op, "Split")) return fold_split(im, a);
    int rank = a->rank;
    int64_t dims[MAX_RANK];
    memcpy(dims, a->dims, sizeof dims);
    if (!strcmp(op, "Add") || !strcmp(op, "Sub") || !strcmp(op, "Mul") || !strcmp(op, "Div") || !strcmp(op, "Equal") || !strcmp(op, "Less") ||
        !strcmp(op, "Greater") || !strcmp(op, "Min")) {
        if (!b || !imp_broadcast(a, b, &rank, dims)) return 0;
        const int64_t count = imp_numel(dims, rank, 1);
        if (count > ONNX_FOLD_MAX) return 0;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        const bool ints = is_int(a->dtype) && is_int(b->dtype);
        for (int64_t i = 0; i < count; i++)
            v[i] = binary_value(op, a->values[source_index(a, rank, dims, i)], b->values[source_index(b, rank, dims, i)], ints);
        const bool cmp = !strcmp(op, "Equal") || !strcmp(op, "Less") || !strcmp(op, "Greater");
        constant(im, rank, dims, cmp ? ONNX__TENSOR_PROTO__DATA_TYPE__BOOL : a->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "Where")) {
        Val *c = a, *x = b, *y = imp_operand(im, 2);
        Val xy = *x;
        if (!y || !imp_broadcast(x, y, &xy.rank, xy.dims) || !imp_broadcast(&xy, c, &rank, dims)) return 0;
        const int64_t count = imp_numel(dims, rank, 1);
        if (count > ONNX_FOLD_MAX) return 0;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++)
            v[i] = c->values[source_index(c, rank, dims, i)] ? x->values[source_index(x, rank, dims, i)] : y->values[source_index(y, rank, dims, i)];
        constant(im, rank, dims, x->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "Cast") || !strcmp(op, "Neg") || !strcmp(op, "Identity")) {
        const int32_t to = !strcmp(op, "Cast") ? (int32_t)imp_attr_int(n, "to", a->dtype) : a->dtype;
        double *v = xmalloc((size_t)(a->nvalues + 1) * sizeof *v);
        for (int64_t i = 0; i < a->nvalues; i++) {
            double x = !strcmp(op, "Neg") ? -a->values[i] : a->values[i];
            if (to == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL) x = x != 0;
            else if (is_int(to)) x = trunc(x);
            else if (to == ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT) x = (float)x;
            v[i] = x;
        }
        constant(im, rank, dims, to, v, a->nvalues);
        return 1;
    }
    if (!strcmp(op, "Unsqueeze") || !strcmp(op, "Squeeze") || !strcmp(op, "Reshape")) {
        int64_t ax[MAX_RANK];
        int na = 0;
        if (!strcmp(op, "Reshape")) {
            na = imp_const_ints(im, 1, ax, MAX_RANK);
            if (na < 0) return 0;
            int64_t known = 1;
            int infer = -1;
            for (int i = 0; i < na; i++) {
                if (ax[i] == 0) ax[i] = i < a->rank ? a->dims[i] : 1;
                if (ax[i] == -1) infer = i;
                else known *= ax[i];
            }
            if (infer >= 0) ax[infer] = known ? a->nvalues / known : 0;
            rank = na;
            memcpy(dims, ax, (size_t)na * sizeof *ax);
        } else {
            na = im->m->opset < 13 ? imp_attr_ints(n, "axes", ax, MAX_RANK) : (b ? imp_const_ints(im, 1, ax, MAX_RANK) : -1);
            const bool un = !strcmp(op, "Unsqueeze");
            if (un && na < 0) return 0;
            const int r = un ? a->rank + na : a->rank;
            bool pick[2 * MAX_RANK] = {0};
            for (int i = 0; i < na; i++) {
                const int x = imp_norm_axis(ax[i], r);
                if (x < 0 || x >= r || r > MAX_RANK) return 0;
                pick[x] = true;
            }
            rank = 0;
            for (int x = 0, i = 0; x < r; x++) {
                if (un) dims[rank++] = pick[x] ? 1 : a->dims[i++];
                else if (!(na < 0 ? a->dims[x] == 1 : pick[x])) dims[rank++] = a->dims[x];
            }
        }
        if (imp_numel(dims, rank, 1) != a->nvalues) return 0;
        double *v = xmalloc((size_t)(a->nvalues + 1) * sizeof *v);
        memcpy(v, a->values, (size_t)a->nvalues * sizeof *v);
        constant(im, rank, dims, a->dtype, v, a->nvalues);
        return 1;
    }
    if (!strcmp(op, "Concat")) { /* along one axis: the inputs' blocks in turn */
        const int axis = imp_norm_axis(imp_attr_int(n, "axis", 0), a->rank);
        if (axis < 0 || axis >= a->rank) return 0;
        dims[axis] = 0;
        for (size_t j = 0; j < n->n_input; j++) dims[axis] += imp_operand(im, j)->dims[axis];
        const int64_t count = imp_numel(dims, rank, 1);
        if (count > ONNX_FOLD_MAX) return 0;
        int64_t outer = 1;
        for (int x = 0; x < axis; x++) outer *= dims[x];
        double *v = xmalloc((size_t)(count + 1) * sizeof *v), *p = v;
        for (int64_t o = 0; o < outer; o++)
            for (size_t j = 0; j < n->n_input; j++) {
                const Val *x = imp_operand(im, j);
                const int64_t block = x->nvalues / (outer ? outer : 1);
                memcpy(p, x->values + o * block, (size_t)block * sizeof *p);
                p += block;
            }
        constant(im, rank, dims, a->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "Gather") && a->rank == 1 && b->rank <= 1) { /* entries of a vector (a shape) */
        const int64_t count = b->nvalues;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++) {
            int64_t at = (int64_t)b->values[i];
            at = at < 0 ? at + a->nvalues : at;
            if (at < 0 || at >= a->nvalues) {
                free(v);
                return 0;
            }
            v[i] = a->values[at];
        }
        constant(im, b->rank, b->dims, a->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "Slice") && a->rank == 1 && im->m->opset >= 10) { /* of a vector (a shape), forward */
        int64_t s, e, st = 1;
        if (imp_const_ints(im, 1, &s, 1) != 1 || imp_const_ints(im, 2, &e, 1) != 1) return 0;
        if (imp_operand(im, 4) && imp_const_ints(im, 4, &st, 1) != 1) return 0;
        const int64_t len = a->nvalues;
        s = s < 0 ? s + len : s, e = e < 0 ? e + len : e;
        s = s < 0 ? 0 : s > len ? len : s, e = e < 0 ? 0 : e > len ? len : e;
        if (st <= 0 || e < s) return 0;
        const int64_t count = (e - s + st - 1) / st;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++) v[i] = a->values[s + i * st];
        const int64_t d[1] = {count};
        constant(im, 1, d, a->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "Expand")) {
        int64_t shape[MAX_RANK];
        const int ns = imp_const_ints(im, 1, shape, MAX_RANK);
        Val s = {.rank = ns};
        if (ns < 0) return 0;
        memcpy(s.dims, shape, sizeof shape);
        if (!imp_broadcast(a, &s, &rank, dims)) return 0;
        const int64_t count = imp_numel(dims, rank, 1);
        if (count > ONNX_FOLD_MAX) return 0;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++) v[i] = a->values[source_index(a, rank, dims, i)];
        constant(im, rank, dims, a->dtype, v, count);
        return 1;
    }
    if (!strcmp(op, "ConstantOfShape")) {
        int64_t shape[MAX_RANK];
        const int ns = imp_const_ints(im, 0, shape, MAX_RANK);
        if (ns < 0) return 0;
        const int64_t count = imp_numel(shape, ns, 1);
        if (count < 0 || count > ONNX_FOLD_MAX) return 0;
        double value = 0;
        int32_t type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        const Onnx__AttributeProto *at = imp_attr(n, "value");
        if (at && at->t) {
            double *x = onnx_tensor_values(at->t);
            if (!x) return 0;
            value = x[0], type = at->t->data_type;
            free(x);
        }
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++) v[i] = value;
        constant(im, ns, shape, type, v, count);
        return 1;
    }
    if (!strcmp(op, "Range") && a->nvalues == 1 && b && b->nvalues == 1 && imp_operand(im, 2) && imp_operand(im, 2)->nvalues == 1) {
        const double start = a->values[0], limit = b->values[0], delta = imp_operand(im, 2)->values[0];
        if (!delta) return 0;
        const double c = ceil((limit - start) / delta);
        const int64_t count = c > 0 ? (int64_t)c : 0;
        if (count > ONNX_FOLD_MAX) return 0;
        double *v = xmalloc((size_t)(count + 1) * sizeof *v);
        for (int64_t i = 0; i < count; i++) v[i] = start + (double)i * delta;
        const int64_t d[1] = {count};
        constant(im, 1, d, a->dtype, v, count);
        return 1;
    }
    return 0;
}
