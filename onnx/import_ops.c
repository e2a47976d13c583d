/* import_ops.c — kiln import's operators (onnx.h, import.c): each writes its node's
 * statement(s) in Kiln and records its outputs' shapes, or refuses the node with one error
 * naming it, its operator and what Kiln cannot express. */
#include "import_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the operators ----
 * Each writes its node's statement(s) and records its outputs' shapes; -1 with imp_refuse(). */

/* `reshape(expr, dims)`, malloc'd. */
static char *reshaped(const char *expr, const int64_t *dims, int rank)
{
    StrBuf r;
    sb_init(&r);
    sb_printf(&r, "reshape(%s, ", expr);
    imp_dims_text(&r, dims, rank);
    sb_puts(&r, ")");
    return sb_take(&r);
}

/* Output 0, of shape dims, assigned the expression built in e (freed). */
static int assign(Imp *im, int rank, const int64_t *dims, StrBuf *e)
{
    Val *y = imp_result(im, 0, rank, dims);
    imp_statement_start(im, y);
    sb_puts(&im->body, e->data ? e->data : "");
    imp_statement_end(im);
    sb_free(e);
    return 0;
}

/* y = expr_prefix(x) suffix: an elementwise function of operand 0. */
static int unary(Imp *im, const char *fmt)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, fmt, xe, xe, xe);
    imp_statement_end(im);
    return 0;
}

/* Operand 1 of a binary op as broadcast against operand 0, by opset 6's legacy rule
 * (broadcast = 1: b aligned at `axis`, or at the end) or NumPy's. */
static int binary(Imp *im, const char *op)
{
    Val *a = imp_operand(im, 0), *b = imp_operand(im, 1);
    if (!a || !b) return imp_refuse(im, "needs two inputs");
    const char *ae = imp_use(im, 0), *be = imp_use(im, 1);
    char *bexpr = xstrdup(be);
    Val bb = *b;
    const Onnx__AttributeProto *axis = imp_attr(im->node, "axis");
    if (im->m->opset < 7 && imp_attr_int(im->node, "broadcast", 0) && axis && b->rank) { /* legacy: b's axes from `axis` on */
        const int at = imp_norm_axis(axis->i, a->rank);
        if (at < 0 || at + b->rank > a->rank) {
            free(bexpr);
            return imp_refuse(im, "broadcast axis %lld does not fit", (long long)axis->i);
        }
        bb.rank = a->rank - at;
        for (int i = 0; i < bb.rank; i++) bb.dims[i] = i < b->rank ? b->dims[i] : 1;
        if (bb.rank != b->rank) {
            free(bexpr);
            bexpr = reshaped(be, bb.dims, bb.rank);
        }
    }
    int rank;
    int64_t dims[MAX_RANK];
    if (!imp_broadcast(a, &bb, &rank, dims)) {
        free(bexpr);
        return imp_refuse(im, "its inputs' shapes do not broadcast");
    }
    Val *y = imp_result(im, 0, rank, dims);
    imp_statement_start(im, y);
    if (op[0] == '(') sb_printf(&im->body, op, ae, bexpr);
    else sb_printf(&im->body, "%s %s %s", ae, op, bexpr);
    imp_statement_end(im);
    free(bexpr);
    return 0;
}

/* Sum, Max, Min of any number of inputs (NumPy broadcasting), in order. */
static int variadic(Imp *im, const char *fn)
{
    if (!im->node->n_input) return imp_refuse(im, "no input");
    Val acc = *imp_operand(im, 0);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, imp_use(im, 0));
    for (size_t j = 1; j < im->node->n_input; j++) {
        Val *x = imp_operand(im, j);
        if (!x || !imp_broadcast(&acc, x, &acc.rank, acc.dims)) {
            sb_free(&e);
            return imp_refuse(im, "its inputs' shapes do not broadcast");
        }
        char *prev = sb_take(&e);
        if (fn) sb_printf(&e, "%s(%s, %s)", fn, prev, imp_use(im, j));
        else sb_printf(&e, "%s + %s", prev, imp_use(im, j));
        free(prev);
    }
    return assign(im, acc.rank, acc.dims, &e);
}

static int op_clip(Imp *im)
{
    double lo = -INFINITY, hi = INFINITY;
    if (im->m->opset < 11) {
        lo = imp_attr_float(im->node, "min", -INFINITY), hi = imp_attr_float(im->node, "max", INFINITY);
    } else {
        for (int j = 1; j <= 2; j++) {
            Val *b = imp_operand(im, (size_t)j);
            if (!b) continue;
            if (!b->values || b->nvalues != 1) return imp_refuse(im, "its %s is not a constant", j == 1 ? "min" : "max");
            *(j == 1 ? &lo : &hi) = b->values[0];
        }
    }
    char l[64] = "none", h[64] = "none";
    if (isfinite(lo)) util_format_double(l, sizeof l, lo);
    if (isfinite(hi)) util_format_double(h, sizeof h, hi);
    char fmt[200];
    snprintf(fmt, sizeof fmt, "clamp(%%s, min = %s, max = %s)", l, h);
    return unary(im, fmt);
}

static int op_matmul(Imp *im)
{
    Val *a = imp_operand(im, 0), *b = imp_operand(im, 1);
    if (!a || !b || a->rank < 1 || b->rank < 1) return imp_refuse(im, "needs two tensors of rank 1 or more");
    const char *ae = imp_use(im, 0), *be = imp_use(im, 1);
    int64_t dims[MAX_RANK];
    int rank;
    if (a->rank == 1 || b->rank == 1) return imp_refuse(im, "a product with a vector (rank 1) is not supported yet");
    if (a->dims[a->rank - 1] != b->dims[b->rank - 2]) return imp_refuse(im, "inner sizes differ");
    Val ab = *a, bb = *b;
    ab.rank -= 2, bb.rank -= 2;
    if (!imp_broadcast(&ab, &bb, &rank, dims)) return imp_refuse(im, "batch axes do not broadcast");
    dims[rank++] = a->dims[a->rank - 2];
    dims[rank++] = b->dims[b->rank - 1];
    Val *y = imp_result(im, 0, rank, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "%s @ %s", ae, be);
    imp_statement_end(im);
    return 0;
}

/* The member name of a layer whose weight (and bias) are initializers X.weight (X.bias),
 * X an identifier the file does not use otherwise: X, so that the weights file keeps
 * PyTorch's state_dict names; else a name from the node's. */
static char *layer_member(Imp *im, const Val *wt, const Val *b, const char *prefix)
{
    const char *w = wt->source;
    const size_t n = w && wt->source == wt->init->name ? strlen(w) : 0;
    if (n > 7 && !strcmp(w + n - 7, ".weight")) {
        char x[256];
        snprintf(x, sizeof x, "%.*s", (int)(n - 7), w);
        bool ok = n - 7 < sizeof x && (isalpha((unsigned char)x[0]) || x[0] == '_') && !strmap_get(&im->names, x, 0);
        for (const char *c = x; ok && *c; c++) ok = isalnum((unsigned char)*c) || *c == '_';
        for (int k = 0; ok && imp_keywords[k]; k++) ok = strcmp(x, imp_keywords[k]) != 0;
        if (ok && b) {
            char bn[300];
            snprintf(bn, sizeof bn, "%s.bias", x);
            ok = b->source == b->init->name && !strcmp(b->source, bn);
        }
        if (ok) {
            imp_take(im, &im->names, x);
            return xstrdup(x);
        }
    }
    return imp_identifier(im, prefix, im->node->name && im->node->name[0] ? im->node->name : im->node->output[0]);
}

/* A layer member's weight and bias (NULL: none) in the weights file, under its names. */
static void member_weights(Imp *im, const char *member, Val *wt, Val *b)
{
    for (int k = 0; k < (b ? 2 : 1); k++) {
        Val *p = k ? b : wt;
        GROW(im->w->t, im->w->cap, im->w->n + 1);
        OnnxWeight *t = &im->w->t[im->w->n++];
        StrBuf nm;
        sb_init(&nm);
        sb_printf(&nm, "%s.%s", member, k ? "bias" : "weight");
        t->name = sb_take(&nm);
        t->rank = p->rank;
        memcpy(t->dims, p->dims, sizeof t->dims);
        t->values = p->values;
        t->n = p->nvalues;
        p->declared = true;
    }
}

/* A layer member's weights (member_weights), then `y = member(x)` of operand 0, y of
 * shape dims; member freed. */
static int call_member(Imp *im, char *member, Val *wt, Val *b, int rank, const int64_t *dims)
{
    member_weights(im, member, wt, b);
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, rank, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "%s(%s)", member, xe);
    imp_statement_end(im);
    free(member);
    return 0;
}

/* A Gemm that is a Linear layer (B its weight [out, in], an initializer read transposed;
 * C its bias [out] or none; alpha and beta 1): a Linear member, named as the weights
 * are (fc1.weight: fc1), so that the imported model initialises and trains as one. */
static int linear_layer(Imp *im, Val *a, Val *w, Val *c)
{
    char *member = layer_member(im, w, c, "fc_");
    sb_printf(&im->members, "%s = Linear(%lld, %lld%s)  # weight '%s'%s%s%s\n", member, (long long)w->dims[1], (long long)w->dims[0],
              c ? "" : ", bias = false", w->source, c ? ", bias '" : "", c ? c->source : "", c ? "'" : "");
    const int64_t dims[2] = {a->dims[0], w->dims[0]};
    return call_member(im, member, w, c, 2, dims);
}

static int op_gemm(Imp *im)
{
    Val *a = imp_operand(im, 0), *b = imp_operand(im, 1), *c = imp_operand(im, 2);
    if (!a || !b || a->rank != 2 || b->rank != 2) return imp_refuse(im, "A and B must be matrices");
    const bool ta = imp_attr_int(im->node, "transA", 0), tb = imp_attr_int(im->node, "transB", 0);
    const double alpha = imp_attr_float(im->node, "alpha", 1.0), beta = imp_attr_float(im->node, "beta", 1.0);
    if (!ta && tb && alpha == 1.0 && (!c || beta == 1.0) && b->init && !b->declared && a->dims[1] == b->dims[1] &&
        (!c || (c->init && !c->declared && c->rank == 1 && c->dims[0] == b->dims[0])))
        return linear_layer(im, a, b, c);
    const char *ae = imp_use(im, 0), *be = imp_use(im, 1);
    const int64_t dims[2] = {a->dims[ta ? 1 : 0], b->dims[tb ? 0 : 1]};
    if (a->dims[ta ? 0 : 1] != b->dims[tb ? 1 : 0]) return imp_refuse(im, "inner sizes differ");
    char *ce = c && beta != 0.0 ? xstrdup(imp_use(im, 2)) : NULL; /* beta 0: C not read */
    Val *y = imp_result(im, 0, 2, dims);
    imp_statement_start(im, y);
    char num[64];
    if (alpha != 1.0) {
        util_format_double(num, sizeof num, alpha);
        sb_printf(&im->body, "%s * ", num);
    }
    sb_printf(&im->body, "(%s%s%s @ %s%s%s)", ta ? "transpose(" : "", ae, ta ? ")" : "", tb ? "transpose(" : "", be, tb ? ")" : "");
    if (ce && beta != 0.0) {
        if (beta != 1.0) util_format_double(num, sizeof num, beta);
        sb_printf(&im->body, " + %s%s%s", beta != 1.0 ? num : "", beta != 1.0 ? " * " : "", ce);
    }
    imp_statement_end(im);
    free(ce);
    return 0;
}

/* `fn(x, dims)` of operand 0, its output of shape dims (reshape, expand). */
static int to_shape(Imp *im, const char *fn, int rank, const int64_t *dims)
{
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, rank, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "%s(%s, ", fn, xe);
    imp_dims_text(&im->body, dims, rank);
    sb_puts(&im->body, ")");
    imp_statement_end(im);
    return 0;
}

/* reshape(x, dims) of operand 0 to the shape dims (the output's). */
static int reshape_to(Imp *im, int rank, const int64_t *dims)
{
    Val *x = imp_operand(im, 0);
    if (imp_numel(dims, rank, 7) != imp_numel(x->dims, x->rank, 7)) return imp_refuse(im, "the new shape has another number of elements");
    return to_shape(im, "reshape", rank, dims);
}

static int op_reshape(Imp *im)
{
    Val *x = imp_operand(im, 0);
    int64_t shape[MAX_RANK + 1];
    int n;
    if (im->m->opset < 5) n = imp_attr_ints(im->node, "shape", shape, MAX_RANK + 1);
    else n = imp_const_ints(im, 1, shape, MAX_RANK + 1);
    if (!x || n < 0) return imp_refuse(im, "its shape is not a constant (Kiln's shapes are static)");
    if (n > MAX_RANK) return imp_refuse(im, "rank over %d", MAX_RANK);
    const bool allowzero = imp_attr_int(im->node, "allowzero", 0);
    int infer = -1;
    int64_t known = 1;
    bool batch_kept = false; /* a 0 that copies the input's batch axis */
    bool is_batch[MAX_RANK] = {0};
    for (int a = 0; a < n; a++) {
        if (shape[a] == 0 && !allowzero) {
            if (a >= x->rank) return imp_refuse(im, "a 0 in its shape past the input's rank");
            is_batch[a] = x->dims[a] == BATCH;
            batch_kept |= is_batch[a];
            shape[a] = is_batch[a] ? 1 : x->dims[a];
        }
        if (shape[a] == -1) {
            if (infer >= 0) return imp_refuse(im, "two -1 in its shape");
            infer = a;
        } else if (shape[a] < 0) {
            return imp_refuse(im, "a negative size in its shape");
        } else {
            known *= shape[a];
        }
    }
    /* the batch: kept where it was (a 0), else held alone by a -1 at axis 0 */
    const int64_t total = imp_numel(x->dims, x->rank, 1);
    if (infer >= 0) {
        if (!known || total % known) return imp_refuse(im, "its shape does not divide the input's elements");
        shape[infer] = total / known;
    }
    if (x->rank && x->dims[0] == BATCH && !batch_kept) {
        if (infer != 0 || shape[0] != 1) return imp_refuse(im, "it folds the batch into another axis");
        shape[0] = BATCH;
    }
    for (int a = 0; a < n; a++)
        if (is_batch[a]) shape[a] = BATCH;
    return reshape_to(im, n, shape);
}

static int op_flatten(Imp *im)
{
    Val *x = imp_operand(im, 0);
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", 1), x->rank);
    if (axis < 0 || axis > x->rank) return imp_refuse(im, "axis out of range");
    int64_t d[2] = {1, 1};
    for (int a = 0; a < x->rank; a++) {
        if (a < axis && x->dims[a] == BATCH) d[0] = axis == 1 ? BATCH : -2;
        else if (a < axis) d[0] *= x->dims[a];
        else if (x->dims[a] == BATCH) return imp_refuse(im, "it folds the batch into another axis");
        else d[1] *= x->dims[a];
    }
    if (d[0] == -2) return imp_refuse(im, "it folds the batch into another axis");
    return reshape_to(im, 2, d);
}

static int op_transpose(Imp *im)
{
    Val *x = imp_operand(im, 0);
    int64_t perm[MAX_RANK], dims[MAX_RANK];
    int n = imp_attr_ints(im->node, "perm", perm, MAX_RANK);
    if (n < 0) {
        n = x->rank;
        for (int a = 0; a < n; a++) perm[a] = n - 1 - a;
    }
    if (n != x->rank) return imp_refuse(im, "perm does not have the input's rank");
    for (int a = 0; a < n; a++) {
        if (perm[a] < 0 || perm[a] >= n) return imp_refuse(im, "perm out of range");
        dims[a] = x->dims[perm[a]];
    }
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, n, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "permute(%s", xe);
    for (int a = 0; a < n; a++) sb_printf(&im->body, ", %lld", (long long)perm[a]);
    sb_puts(&im->body, ")");
    imp_statement_end(im);
    return 0;
}

/* Squeeze or Unsqueeze: the new shape, written as a reshape. */
static int op_squeeze(Imp *im, bool unsqueeze)
{
    Val *x = imp_operand(im, 0);
    int64_t axes[MAX_RANK], dims[MAX_RANK];
    int n = im->m->opset < 13 ? imp_attr_ints(im->node, "axes", axes, MAX_RANK) : imp_const_ints(im, 1, axes, MAX_RANK);
    if (unsqueeze && n < 0) return imp_refuse(im, "its axes are not constants");
    const int rank = unsqueeze ? x->rank + n : x->rank;
    bool pick[MAX_RANK * 2] = {0};
    for (int k = 0; k < n; k++) {
        const int a = imp_norm_axis(axes[k], rank);
        if (a < 0 || a >= rank || rank > MAX_RANK) return imp_refuse(im, "axis out of range");
        pick[a] = true;
    }
    int r = 0;
    if (unsqueeze) {
        for (int a = 0, i = 0; a < rank; a++) dims[r++] = pick[a] ? 1 : x->dims[i++];
    } else {
        for (int a = 0; a < x->rank; a++) {
            const bool drop = n < 0 ? x->dims[a] == 1 : pick[a];
            if (drop && x->dims[a] != 1) return imp_refuse(im, "axis %d is not of size 1", a);
            if (!drop) dims[r++] = x->dims[a];
        }
    }
    return reshape_to(im, r, dims);
}

static int op_concat(Imp *im)
{
    Val *x0 = imp_operand(im, 0);
    if (!x0) return imp_refuse(im, "no input");
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", 1), x0->rank);
    int64_t dims[MAX_RANK];
    memcpy(dims, x0->dims, sizeof dims);
    if (axis < 0 || axis >= x0->rank) return imp_refuse(im, "axis out of range");
    dims[axis] = 0;
    StrBuf e;
    sb_init(&e);
    for (size_t j = 0; j < im->node->n_input; j++) {
        Val *x = imp_operand(im, j);
        if (!x || x->rank != x0->rank || x->dims[axis] == BATCH) {
            sb_free(&e);
            return imp_refuse(im, "its inputs do not concatenate along axis %d", axis);
        }
        dims[axis] += x->dims[axis];
        if (j && j % 15 == 0) { /* at most 16 tensors in one concat */
            char *prev = sb_take(&e);
            sb_printf(&e, "concat(%s, axis = %d)", prev, axis);
            free(prev);
        }
        sb_printf(&e, "%s%s", e.len ? ", " : "", imp_use(im, j));
    }
    Val *y = imp_result(im, 0, x0->rank, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "concat(%s, axis = %d)", e.data, axis);
    imp_statement_end(im);
    sb_free(&e);
    return 0;
}

/* Softmax and LogSoftmax: before opset 13, over the input flattened to 2-D at `axis`. */
static int op_softmax(Imp *im, const char *fn)
{
    Val *x = imp_operand(im, 0);
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", im->m->opset < 13 ? 1 : -1), x->rank);
    if (axis < 0 || axis >= x->rank) return imp_refuse(im, "axis out of range");
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    if (im->m->opset >= 13 || axis == x->rank - 1) {
        sb_printf(&im->body, "%s(%s, axis = %d)", fn, xe, axis);
    } else { /* the trailing axes as one */
        int64_t d[MAX_RANK];
        for (int a = 0; a < axis; a++) d[a] = x->dims[a];
        d[axis] = 1;
        for (int a = axis; a < x->rank; a++) {
            if (x->dims[a] == BATCH) return imp_refuse(im, "it folds the batch into another axis");
            d[axis] *= x->dims[a];
        }
        sb_printf(&im->body, "reshape(%s(reshape(%s, ", fn, xe);
        imp_dims_text(&im->body, d, axis + 1);
        sb_printf(&im->body, "), axis = -1), ");
        imp_dims_text(&im->body, x->dims, x->rank);
        sb_puts(&im->body, ")");
    }
    imp_statement_end(im);
    return 0;
}

static int op_reduce(Imp *im, const char *fn)
{
    Val *x = imp_operand(im, 0);
    int64_t axes[MAX_RANK], dims[MAX_RANK];
    int n = imp_attr_ints(im->node, "axes", axes, MAX_RANK);
    if (n < 0 && im->node->n_input > 1) n = imp_const_ints(im, 1, axes, MAX_RANK);
    const bool keep = imp_attr_int(im->node, "keepdims", 1);
    bool pick[MAX_RANK] = {0};
    if (n < 0 || (n == 0 && !imp_attr_int(im->node, "noop_with_empty_axes", 0))) {
        n = x->rank;
        for (int a = 0; a < n; a++) axes[a] = a;
    }
    for (int k = 0; k < n; k++) {
        const int a = imp_norm_axis(axes[k], x->rank);
        if (a < 0 || a >= x->rank) return imp_refuse(im, "axis out of range");
        pick[a] = true;
    }
    int r = 0;
    for (int a = 0; a < x->rank; a++)
        if (!pick[a]) dims[r++] = x->dims[a];
        else if (keep) dims[r++] = 1;
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, r, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "%s(%s, axis = [", fn, xe);
    for (int a = 0, any = 0; a < x->rank; a++)
        if (pick[a]) sb_printf(&im->body, "%s%d", any++ ? ", " : "", a);
    sb_printf(&im->body, "], keepdim = %s)", keep ? "true" : "false");
    imp_statement_end(im);
    return 0;
}

static int op_batchnorm(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 2) return imp_refuse(im, "the input needs a channel axis");
    for (size_t j = 1; j < 5; j++)
        if (!imp_operand(im, j) || imp_operand(im, j)->rank != 1) return imp_refuse(im, "scale, bias, mean and variance must be vectors");
    if (im->node->n_output > 1 && im->node->output[1][0]) return imp_refuse(im, "training mode (running statistics as outputs) is not supported");
    char eps[64];
    util_format_double(eps, sizeof eps, imp_attr_float(im->node, "epsilon", 1e-5));
    StrBuf cdims;
    sb_init(&cdims);
    sb_printf(&cdims, "%lld", (long long)x->dims[1]);
    for (int a = 2; a < x->rank; a++) sb_puts(&cdims, ", 1");
    const char *xe = imp_use(im, 0);
    char *s = xstrdup(imp_use(im, 1)), *b = xstrdup(imp_use(im, 2)), *mn = xstrdup(imp_use(im, 3)), *var = xstrdup(imp_use(im, 4));
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "(%s - reshape(%s, %s)) * reshape(%s / sqrt(%s + %s), %s) + reshape(%s, %s)", xe, mn, cdims.data, s, var, eps, cdims.data, b,
              cdims.data);
    imp_statement_end(im);
    free(s), free(b), free(mn), free(var);
    sb_free(&cdims);
    return 0;
}

static int op_prelu(Imp *im)
{
    Val *x = imp_operand(im, 0), *s = imp_operand(im, 1);
    if (!x || !s) return imp_refuse(im, "needs two inputs");
    const char *xe = imp_use(im, 0);
    char *se = xstrdup(imp_use(im, 1));
    Val sb = *s;
    if (im->m->opset < 7 && s->rank == 1 && x->rank >= 2 && s->dims[0] == x->dims[1] && x->rank > 2) { /* one slope per channel */
        sb.rank = x->rank - 1;
        for (int a = 1; a < sb.rank; a++) sb.dims[a] = 1;
        char *r = reshaped(se, sb.dims, sb.rank);
        free(se);
        se = r;
    }
    int rank;
    int64_t dims[MAX_RANK];
    if (!imp_broadcast(x, &sb, &rank, dims) || rank != x->rank) {
        free(se);
        return imp_refuse(im, "the slope does not broadcast to the input");
    }
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "where(%s >= 0, %s, %s * %s)", xe, xe, xe, se);
    imp_statement_end(im);
    free(se);
    return 0;
}

/* A Constant node: its value, folded (a parameter where read as a tensor). */
static int op_constant(Imp *im)
{
    const Onnx__AttributeProto *a = imp_attr(im->node, "value");
    if (!a || !a->t) return imp_refuse(im, "only the `value` form of Constant is supported");
    const Onnx__TensorProto *t = a->t;
    if (!onnx_type_size(t->data_type)) return imp_refuse(im, "its type is %s", onnx_type_name(t->data_type));
    if (t->n_dims > MAX_RANK || onnx_numel(t->dims, t->n_dims) < 0) return imp_refuse(im, "its shape is too large");
    Val *v = imp_add_val(im, im->node->output[0]);
    v->init = t;
    v->source = im->node->output[0]; /* a Constant's value: not a state_dict entry */
    v->dtype = t->data_type;
    v->expr = imp_identifier(im, "p_", im->node->output[0]);
    v->rank = (int)t->n_dims;
    for (int k = 0; k < v->rank; k++) v->dims[k] = t->dims[k];
    v->nvalues = onnx_numel(t->dims, t->n_dims);
    v->values = onnx_tensor_values(t);
    if (!v->values) v->values = xcalloc(1, sizeof *v->values);
    size_t have = t->has_raw_data ? t->raw_data.len / (size_t)onnx_type_size(t->data_type) : t->n_float_data + t->n_int64_data + t->n_int32_data + t->n_double_data;
    if ((int64_t)have != v->nvalues) return imp_refuse(im, "its value holds %zu elements, not the %lld of its shape", have, (long long)v->nvalues);
    return 0;
}

/* A 2-D window (pooling, convolution) of a node over a rank-4 input: kernel, strides,
 * dilations and symmetric pads, from its attributes. */
typedef struct {
    int64_t k[2], s[2], d[2], p[2];
} Window;

static int window(Imp *im, const Val *x, const int64_t *kernel, Window *w)
{
    const int nsp = x->rank - 2;
    int64_t v[4];
    for (int i = 0; i < 2; i++) w->k[i] = 1, w->s[i] = 1, w->d[i] = 1, w->p[i] = 0;
    for (int i = 0; i < nsp; i++) w->k[2 - nsp + i] = kernel[i];
    if (imp_attr_ints(im->node, "strides", v, 2) == nsp)
        for (int i = 0; i < nsp; i++) w->s[2 - nsp + i] = v[i];
    if (imp_attr_ints(im->node, "dilations", v, 2) == nsp)
        for (int i = 0; i < nsp; i++) w->d[2 - nsp + i] = v[i];
    const Onnx__AttributeProto *ap = imp_attr(im->node, "auto_pad");
    if (ap && ap->has_s && ap->s.len && strncmp((const char *)ap->s.data, "NOTSET", ap->s.len) && strncmp((const char *)ap->s.data, "VALID", ap->s.len))
        return imp_refuse(im, "auto_pad %.*s is not supported yet (pads given explicitly are)", (int)ap->s.len, (const char *)ap->s.data);
    const int np = imp_attr_ints(im->node, "pads", v, 4);
    if (np == 2 * nsp)
        for (int i = 0; i < nsp; i++) {
            if (v[i] != v[i + nsp]) return imp_refuse(im, "asymmetric pads are not supported yet");
            w->p[2 - nsp + i] = v[i];
        }
    else if (np > 0) return imp_refuse(im, "pads do not have two entries per spatial axis");
    return 0;
}

static int op_pool(Imp *im, bool max)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 3 || x->rank > 4) return imp_refuse(im, "%dD pooling is not supported (1-D and 2-D are)", x ? x->rank - 2 : 0);
    int64_t kernel[2];
    if (imp_attr_ints(im->node, "kernel_shape", kernel, 2) != x->rank - 2) return imp_refuse(im, "kernel_shape does not match the input's rank");
    Window w;
    if (window(im, x, kernel, &w)) return -1;
    const bool ceil_mode = imp_attr_int(im->node, "ceil_mode", 0), pad_counts = imp_attr_int(im->node, "count_include_pad", 0);
    if (im->node->n_output > 1 && im->node->output[1][0]) return imp_refuse(im, "the Indices output is not supported");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    for (int i = 0; i < x->rank - 2; i++) {
        const int j = 2 - (x->rank - 2) + i;
        const int64_t span = x->dims[2 + i] + 2 * w.p[j] - w.d[j] * (w.k[j] - 1) - 1;
        int64_t o = (ceil_mode ? (span + w.s[j] - 1) / w.s[j] : span / w.s[j]) + 1;
        if (ceil_mode && (o - 1) * w.s[j] >= x->dims[2 + i] + w.p[j]) o--; /* the last window starts inside */
        if (o < 1) return imp_refuse(im, "the window is larger than the padded input");
        dims[2 + i] = o;
    }
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, x->rank, dims);
    imp_statement_start(im, y);
    const bool one_d = x->rank == 3;
    if (one_d) sb_puts(&im->body, "squeeze(");
    sb_printf(&im->body, "%s(%s%s%s, [%lld, %lld], stride = [%lld, %lld], padding = [%lld, %lld]", max ? "max_pool2d" : "avg_pool2d",
              one_d ? "unsqueeze(" : "", xe, one_d ? ", 2)" : "", (long long)w.k[0], (long long)w.k[1], (long long)w.s[0], (long long)w.s[1],
              (long long)w.p[0], (long long)w.p[1]);
    if (max) sb_printf(&im->body, ", dilation = [%lld, %lld]", (long long)w.d[0], (long long)w.d[1]);
    else if (w.d[0] != 1 || w.d[1] != 1) return imp_refuse(im, "dilated average pooling is not supported");
    if (!max) sb_printf(&im->body, ", count_include_pad = %s", pad_counts ? "true" : "false");
    sb_printf(&im->body, ", ceil_mode = %s)%s", ceil_mode ? "true" : "false", one_d ? ", 2)" : "");
    imp_statement_end(im);
    return 0;
}

static int op_global_pool(Imp *im, const char *fn)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 3) return imp_refuse(im, "the input needs spatial axes");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    for (int a = 2; a < x->rank; a++) dims[a] = 1;
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, x->rank, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "%s(%s, axis = [", fn, xe);
    for (int a = 2; a < x->rank; a++) sb_printf(&im->body, "%s%d", a > 2 ? ", " : "", a);
    sb_puts(&im->body, "], keepdim = true)");
    imp_statement_end(im);
    return 0;
}

/* Conv, 1-D and 2-D: a Conv1d/Conv2d member whose weight and bias are the initializers. */
static int op_conv(Imp *im)
{
    Val *x = imp_operand(im, 0), *wt = imp_operand(im, 1), *b = imp_operand(im, 2);
    if (!x || x->rank < 3 || x->rank > 4) return imp_refuse(im, "%dD convolution is not supported (1-D and 2-D are)", x ? x->rank - 2 : 0);
    if (!wt || !wt->init || wt->rank != x->rank) return imp_refuse(im, "its weight is not an initializer of the input's rank");
    if (b && !b->init) return imp_refuse(im, "its bias is not an initializer");
    const int64_t groups = imp_attr_int(im->node, "group", 1);
    Window w;
    if (window(im, x, wt->dims + 2, &w)) return -1;
    const int64_t cout = wt->dims[0], cin = wt->dims[1] * groups;
    if (x->dims[1] != cin) return imp_refuse(im, "the weight expects %lld channels, the input has %lld", (long long)cin, (long long)x->dims[1]);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[1] = cout;
    for (int i = 0; i < x->rank - 2; i++) {
        const int j = 2 - (x->rank - 2) + i;
        dims[2 + i] = (x->dims[2 + i] + 2 * w.p[j] - w.d[j] * (w.k[j] - 1) - 1) / w.s[j] + 1;
        if (dims[2 + i] < 1) return imp_refuse(im, "the kernel is larger than the padded input");
    }
    char *member = layer_member(im, wt, b, "conv_");
    const bool two = x->rank == 4;
    sb_printf(&im->members, "%s = Conv%dd(%lld, %lld, ", member, two ? 2 : 1, (long long)cin, (long long)cout);
    if (two) sb_printf(&im->members, "[%lld, %lld], stride = [%lld, %lld], padding = [%lld, %lld], dilation = [%lld, %lld]", (long long)w.k[0],
                       (long long)w.k[1], (long long)w.s[0], (long long)w.s[1], (long long)w.p[0], (long long)w.p[1], (long long)w.d[0],
                       (long long)w.d[1]);
    else sb_printf(&im->members, "%lld, stride = %lld, padding = %lld, dilation = %lld", (long long)w.k[1], (long long)w.s[1], (long long)w.p[1],
                   (long long)w.d[1]);
    sb_printf(&im->members, ", groups = %lld, bias = %s)  # weight '%s'%s%s%s\n", (long long)groups, b ? "true" : "false", wt->source,
              b ? ", bias '" : "", b ? b->source : "", b ? "'" : "");
    return call_member(im, member, wt, b, x->rank, dims);
}

static int op_leaky(Imp *im)
{
    char fmt[128], a[64];
    util_format_double(a, sizeof a, imp_attr_float(im->node, "alpha", 0.01));
    snprintf(fmt, sizeof fmt, "leaky_relu(%%s, negative_slope = %s)", a);
    return unary(im, fmt);
}

static int op_elu(Imp *im)
{
    char fmt[128], a[64];
    util_format_double(a, sizeof a, imp_attr_float(im->node, "alpha", 1.0));
    snprintf(fmt, sizeof fmt, "elu(%%s, alpha = %s)", a);
    return unary(im, fmt);
}

static int op_selu(Imp *im)
{
    char fmt[200], a[64], g[64];
    util_format_double(a, sizeof a, imp_attr_float(im->node, "alpha", 1.67326319217681884765625));
    util_format_double(g, sizeof g, imp_attr_float(im->node, "gamma", 1.05070102214813232421875));
    snprintf(fmt, sizeof fmt, "%s * where(%%s > 0, %%s, %s * (exp(%%s) - 1))", g, a);
    return unary(im, fmt);
}

/* Pad: constant, reflect or edge, by concatenating pieces along each padded axis. */
static int op_pad(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    int64_t pads[2 * MAX_RANK];
    const int np = im->m->opset < 11 ? imp_attr_ints(im->node, "pads", pads, 2 * MAX_RANK) : imp_const_ints(im, 1, pads, 2 * MAX_RANK);
    if (np != 2 * x->rank) return imp_refuse(im, "its pads are not constants with two per axis");
    double value = imp_attr_float(im->node, "value", 0.0);
    if (im->m->opset >= 11 && imp_operand(im, 2)) {
        Val *c = imp_operand(im, 2);
        if (!c->values || c->nvalues != 1) return imp_refuse(im, "its constant value is not a constant");
        value = c->values[0];
    }
    const Onnx__AttributeProto *ma = imp_attr(im->node, "mode");
    char mode[16] = "constant";
    if (ma && ma->has_s) snprintf(mode, sizeof mode, "%.*s", (int)ma->s.len, (const char *)ma->s.data);
    const bool reflect = !strcmp(mode, "reflect"), edge = !strcmp(mode, "edge");
    if (!reflect && !edge && strcmp(mode, "constant")) return imp_refuse(im, "mode '%s' is not supported", mode);
    char num[64];
    util_format_double(num, sizeof num, value);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, imp_use(im, 0));
    for (int a = 0; a < x->rank; a++) {
        const int64_t before = pads[a], after = pads[a + x->rank], n = dims[a];
        if (!before && !after) continue;
        if (before < 0 || after < 0) return sb_free(&e), imp_refuse(im, "negative pads (cropping) are not supported yet");
        if (n == BATCH) return sb_free(&e), imp_refuse(im, "it pads the batch axis");
        if (reflect && (before >= n || after >= n)) return sb_free(&e), imp_refuse(im, "reflect pads of %lld on an axis of %lld", (long long)(before > after ? before : after), (long long)n);
        char *cur = sb_take(&e);
        sb_puts(&e, "concat(");
        for (int side = 0; side < 2; side++) { /* the piece before, the input, the piece after */
            const int64_t p = side ? after : before;
            if (side) sb_puts(&e, cur);
            if (!p) continue;
            if (side) sb_puts(&e, ", ");
            int64_t pd[MAX_RANK];
            memcpy(pd, dims, sizeof pd);
            pd[a] = p;
            if (reflect) sb_printf(&e, "flip(slice(%s, %d, start = %lld, end = %lld), [%d])", cur, a, (long long)(side ? n - 1 - p : 1),
                                   (long long)(side ? n - 1 : p + 1), a);
            else if (edge) {
                sb_printf(&e, "expand(slice(%s, %d, start = %lld, end = %lld), ", cur, a, (long long)(side ? n - 1 : 0), (long long)(side ? n : 1));
                imp_dims_text(&e, pd, x->rank);
                sb_puts(&e, ")");
            } else {
                sb_puts(&e, "full([");
                imp_dims_text(&e, pd, x->rank);
                sb_printf(&e, "], %s%s)", num, strchr(num, '.') || strchr(num, 'e') || strchr(num, 'n') ? "" : ".0");
            }
            if (!side) sb_puts(&e, ", ");
        }
        sb_printf(&e, ", axis = %d)", a);
        free(cur);
        dims[a] = n + before + after;
    }
    return assign(im, x->rank, dims, &e);
}

/* Split: the pieces, by `split` (attribute, input) or equal. */
static int op_split(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", 0), x->rank);
    if (axis < 0 || axis >= x->rank) return imp_refuse(im, "axis out of range");
    if (x->dims[axis] == BATCH) return imp_refuse(im, "it splits the batch axis");
    const int n = (int)im->node->n_output;
    if (n < 1 || n > 16) return imp_refuse(im, "%d outputs (at most 16)", n);
    int64_t sizes[16];
    int k = imp_attr_ints(im->node, "split", sizes, 16);
    if (k < 0 && im->node->n_input > 1) k = imp_const_ints(im, 1, sizes, 16);
    if (k < 0) {
        if (x->dims[axis] % n) return imp_refuse(im, "axis %d's %lld does not split in %d", axis, (long long)x->dims[axis], n);
        for (int i = 0; i < n; i++) sizes[i] = x->dims[axis] / n;
        k = n;
    }
    int64_t total = 0;
    for (int i = 0; i < k; i++) total += sizes[i];
    if (k != n || total != x->dims[axis]) return imp_refuse(im, "its sizes do not add up to the axis");
    const char *xe = imp_use(im, 0);
    sb_puts(&im->body, "    ");
    for (int i = 0; i < n; i++) {
        int64_t dims[MAX_RANK];
        memcpy(dims, x->dims, sizeof dims);
        dims[axis] = sizes[i];
        Val *y = imp_result(im, (size_t)i, x->rank, dims);
        sb_printf(&im->body, "%s%s", i ? ", " : "", y->expr);
    }
    sb_printf(&im->body, " = split(%s, [", xe);
    for (int i = 0; i < n; i++) sb_printf(&im->body, "%s%lld", i ? ", " : "", (long long)sizes[i]);
    sb_printf(&im->body, "], axis = %d)", axis);
    imp_statement_end(im);
    return 0;
}

/* Slice: positive steps, each axis a slice. */
static int op_slice(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    int64_t starts[MAX_RANK], ends[MAX_RANK], axes[MAX_RANK], steps[MAX_RANK];
    int n, na, ns;
    if (im->m->opset < 10) {
        n = imp_attr_ints(im->node, "starts", starts, MAX_RANK);
        if (imp_attr_ints(im->node, "ends", ends, MAX_RANK) != n) return imp_refuse(im, "starts and ends differ in length");
        na = imp_attr_ints(im->node, "axes", axes, MAX_RANK);
        ns = -1;
    } else {
        n = imp_const_ints(im, 1, starts, MAX_RANK);
        if (imp_const_ints(im, 2, ends, MAX_RANK) != n) return imp_refuse(im, "its starts and ends are not constants of one length");
        na = imp_operand(im, 3) ? imp_const_ints(im, 3, axes, MAX_RANK) : -1;
        ns = imp_operand(im, 4) ? imp_const_ints(im, 4, steps, MAX_RANK) : -1;
        if ((imp_operand(im, 3) && na < 0) || (imp_operand(im, 4) && ns < 0)) return imp_refuse(im, "its axes or steps are not constants");
    }
    if (n < 0) return imp_refuse(im, "its starts are not constants");
    if (na < 0)
        for (int i = 0; i < n; i++) axes[i] = i;
    else if (na != n) return imp_refuse(im, "axes and starts differ in length");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, imp_use(im, 0));
    for (int i = 0; i < n; i++) {
        const int a = imp_norm_axis(axes[i], x->rank);
        const int64_t step = ns < 0 ? 1 : steps[i];
        if (a < 0 || a >= x->rank) return sb_free(&e), imp_refuse(im, "axis out of range");
        if (step <= 0) return sb_free(&e), imp_refuse(im, "a step of %lld (Kiln slices forward)", (long long)step);
        const int64_t size = dims[a];
        if (size == BATCH) return sb_free(&e), imp_refuse(im, "it slices the batch axis");
        int64_t s = starts[i] < 0 ? starts[i] + size : starts[i], t = ends[i] < 0 ? ends[i] + size : ends[i];
        s = s < 0 ? 0 : s > size ? size : s;
        t = t < 0 ? 0 : t > size ? size : t;
        if (t <= s) return sb_free(&e), imp_refuse(im, "an empty slice of axis %d", a);
        char *cur = sb_take(&e);
        sb_printf(&e, "slice(%s, %d, start = %lld, end = %lld, step = %lld)", cur, a, (long long)s, (long long)t, (long long)step);
        free(cur);
        dims[a] = (t - s + step - 1) / step;
    }
    return assign(im, x->rank, dims, &e);
}

/* Tile: each repeated axis a concatenation of copies. */
static int op_tile(Imp *im)
{
    Val *x = imp_operand(im, 0);
    int64_t reps[MAX_RANK];
    if (!x || imp_const_ints(im, 1, reps, MAX_RANK) != x->rank) return imp_refuse(im, "its repeats are not constants, one per axis");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, imp_use(im, 0));
    for (int a = 0; a < x->rank; a++) {
        if (reps[a] == 1) continue;
        if (reps[a] < 1 || reps[a] > 16) return sb_free(&e), imp_refuse(im, "a repeat of %lld (1 to 16)", (long long)reps[a]);
        if (dims[a] == BATCH) return sb_free(&e), imp_refuse(im, "it repeats the batch axis");
        char *cur = sb_take(&e);
        sb_puts(&e, "concat(");
        for (int64_t r = 0; r < reps[a]; r++) sb_printf(&e, "%s%s", r ? ", " : "", cur);
        sb_printf(&e, ", axis = %d)", a);
        free(cur);
        dims[a] *= reps[a];
    }
    return assign(im, x->rank, dims, &e);
}

/* Gather: rows of a matrix by an index tensor (an embedding), or one constant index. */
static int op_gather(Imp *im)
{
    Val *x = imp_operand(im, 0), *idx = imp_operand(im, 1);
    if (!x || !idx) return imp_refuse(im, "needs two inputs");
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", 0), x->rank);
    if (axis < 0 || axis >= x->rank) return imp_refuse(im, "axis out of range");
    int64_t dims[MAX_RANK];
    if (idx->values && idx->rank == 0) { /* one index: a slice, the axis dropped */
        if (x->dims[axis] == BATCH) return imp_refuse(im, "it indexes the batch axis");
        int64_t k = (int64_t)idx->values[0];
        k = k < 0 ? k + x->dims[axis] : k;
        if (k < 0 || k >= x->dims[axis]) return imp_refuse(im, "index %lld out of range", (long long)k);
        int r = 0;
        for (int a = 0; a < x->rank; a++)
            if (a != axis) dims[r++] = x->dims[a];
        const char *xe = imp_use(im, 0);
        Val *y = imp_result(im, 0, r, dims);
        imp_statement_start(im, y);
        sb_printf(&im->body, "reshape(slice(%s, %d, start = %lld, end = %lld), ", xe, axis, (long long)k, (long long)k + 1);
        imp_dims_text(&im->body, dims, r);
        sb_puts(&im->body, ")");
        imp_statement_end(im);
        return 0;
    }
    if (x->rank != 2 || axis != 0 || idx->values || idx->rank + 1 > MAX_RANK)
        return imp_refuse(im, "only rows of a matrix by an index tensor (an embedding) or one constant index are supported");
    for (int a = 0; a < idx->rank; a++) dims[a] = idx->dims[a];
    dims[idx->rank] = x->dims[1];
    const char *xe = imp_use(im, 0);
    char *ie = xstrdup(imp_use(im, 1));
    Val *y = imp_result(im, 0, idx->rank + 1, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "reshape(gather(%s, 0, expand(reshape(i64(%s), -1, 1), -1, %lld)), ", xe, ie, (long long)x->dims[1]);
    imp_dims_text(&im->body, dims, idx->rank + 1);
    sb_puts(&im->body, ")");
    imp_statement_end(im);
    free(ie);
    return 0;
}

static int op_instance_norm(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 3 || !imp_operand(im, 1) || !imp_operand(im, 2)) return imp_refuse(im, "needs an input with spatial axes, a scale and a bias");
    char eps[64];
    util_format_double(eps, sizeof eps, imp_attr_float(im->node, "epsilon", 1e-5));
    StrBuf axes, cd;
    sb_init(&axes);
    sb_init(&cd);
    for (int a = 2; a < x->rank; a++) sb_printf(&axes, "%s%d", a > 2 ? ", " : "", a);
    sb_printf(&cd, "%lld", (long long)x->dims[1]);
    for (int a = 2; a < x->rank; a++) sb_puts(&cd, ", 1");
    const char *xe = imp_use(im, 0);
    char *s = xstrdup(imp_use(im, 1)), *b = xstrdup(imp_use(im, 2));
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "(%s - mean(%s, axis = [%s], keepdim = true)) / sqrt(var(%s, axis = [%s], keepdim = true, unbiased = false) + %s) * reshape(%s, %s) + reshape(%s, %s)",
              xe, xe, axes.data, xe, axes.data, eps, s, cd.data, b, cd.data);
    imp_statement_end(im);
    free(s), free(b);
    sb_free(&axes);
    sb_free(&cd);
    return 0;
}

/* ConvTranspose, 2-D, one group: a ConvTranspose2d member whose weight and bias are the
 * initializers. */
static int op_conv_transpose(Imp *im)
{
    Val *x = imp_operand(im, 0), *wt = imp_operand(im, 1), *b = imp_operand(im, 2);
    if (!x || x->rank != 4) return imp_refuse(im, "only 2-D transposed convolutions are supported");
    if (!wt || !wt->init || wt->rank != 4) return imp_refuse(im, "its weight is not an initializer of the input's rank");
    if (b && !b->init) return imp_refuse(im, "its bias is not an initializer");
    if (imp_attr_int(im->node, "group", 1) != 1) return imp_refuse(im, "groups other than 1 are not supported");
    if (imp_attr(im->node, "output_shape")) return imp_refuse(im, "output_shape is not supported (pads and output_padding are)");
    Window w;
    if (window(im, x, wt->dims + 2, &w)) return -1;
    int64_t op[2] = {0, 0};
    imp_attr_ints(im->node, "output_padding", op, 2);
    if (x->dims[1] != wt->dims[0]) return imp_refuse(im, "the weight expects %lld channels, the input has %lld", (long long)wt->dims[0], (long long)x->dims[1]);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[1] = wt->dims[1];
    for (int i = 0; i < 2; i++) {
        dims[2 + i] = (x->dims[2 + i] - 1) * w.s[i] - 2 * w.p[i] + w.d[i] * (w.k[i] - 1) + op[i] + 1;
        if (dims[2 + i] < 1) return imp_refuse(im, "the output would be empty");
    }
    char *member = layer_member(im, wt, b, "deconv_");
    sb_printf(&im->members,
              "%s = ConvTranspose2d(%lld, %lld, [%lld, %lld], stride = [%lld, %lld], padding = [%lld, %lld], output_padding = [%lld, %lld], "
              "dilation = [%lld, %lld], bias = %s)  # weight '%s'%s%s%s\n",
              member, (long long)wt->dims[0], (long long)wt->dims[1], (long long)w.k[0], (long long)w.k[1], (long long)w.s[0], (long long)w.s[1],
              (long long)w.p[0], (long long)w.p[1], (long long)op[0], (long long)op[1], (long long)w.d[0], (long long)w.d[1], b ? "true" : "false",
              wt->source, b ? ", bias '" : "", b ? b->source : "", b ? "'" : "");
    return call_member(im, member, wt, b, x->rank, dims);
}

/* Where(cond, x, y): the three broadcast. */
static int op_where(Imp *im)
{
    Val *c = imp_operand(im, 0), *x = imp_operand(im, 1), *y = imp_operand(im, 2);
    if (!c || !x || !y) return imp_refuse(im, "needs three inputs");
    Val xy = *x;
    if (!imp_broadcast(x, y, &xy.rank, xy.dims) || !imp_broadcast(&xy, c, &xy.rank, xy.dims)) return imp_refuse(im, "its inputs do not broadcast");
    char *ce = xstrdup(imp_use(im, 0)), *xe = xstrdup(imp_use(im, 1));
    const char *ye = imp_use(im, 2);
    Val *r = imp_result(im, 0, xy.rank, xy.dims);
    imp_statement_start(im, r);
    sb_printf(&im->body, "where(%s, %s, %s)", ce, xe, ye);
    imp_statement_end(im);
    free(ce), free(xe);
    return 0;
}

/* Expand(x, shape): x broadcast to the shape (a constant). */
static int op_expand(Imp *im)
{
    Val *x = imp_operand(im, 0);
    int64_t shape[MAX_RANK];
    const int n = imp_const_ints(im, 1, shape, MAX_RANK);
    if (!x || n < 0) return imp_refuse(im, "its shape is not a constant");
    Val s = {.rank = n};
    memcpy(s.dims, shape, sizeof shape);
    int rank;
    int64_t dims[MAX_RANK];
    if (!imp_broadcast(x, &s, &rank, dims)) return imp_refuse(im, "the input does not broadcast to the shape");
    return to_shape(im, "expand", rank, dims);
}

/* Shape(x) of a static shape: a constant, folded where it is read. */
static int op_shape(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    for (int a = 0; a < x->rank; a++)
        if (x->dims[a] == BATCH) return imp_refuse(im, "the shape holds the batch, whose size is not known when importing (export with a fixed batch)");
    if (imp_attr(im->node, "start") || imp_attr(im->node, "end")) return imp_refuse(im, "start and end are not supported");
    Val *v = imp_add_val(im, im->node->output[0]);
    v->expr = imp_identifier(im, "v_", im->node->output[0]);
    v->rank = 1;
    v->dims[0] = x->rank;
    v->nvalues = x->rank;
    v->dtype = ONNX__TENSOR_PROTO__DATA_TYPE__INT64;
    v->source = im->node->output[0];
    v->values = xcalloc((size_t)x->rank + 1, sizeof *v->values);
    for (int a = 0; a < x->rank; a++) v->values[a] = (double)x->dims[a];
    return 0;
}

/* ConstantOfShape(shape): full(shape, value), the shape a constant. */
static int op_constant_of_shape(Imp *im)
{
    int64_t shape[MAX_RANK];
    const int n = imp_const_ints(im, 0, shape, MAX_RANK);
    if (n < 0) return imp_refuse(im, "its shape is not a constant");
    double value = 0;
    const Onnx__AttributeProto *a = imp_attr(im->node, "value");
    if (a && a->t) {
        double *v = onnx_tensor_values(a->t);
        if (!v || onnx_numel(a->t->dims, a->t->n_dims) != 1) {
            free(v);
            return imp_refuse(im, "its value is not one number");
        }
        value = v[0];
        free(v);
    }
    for (int i = 0; i < n; i++)
        if (shape[i] < 1) return imp_refuse(im, "an empty or negative size in its shape");
    char num[64];
    util_format_double(num, sizeof num, value);
    Val *y = imp_result(im, 0, n, shape);
    imp_statement_start(im, y);
    sb_puts(&im->body, "full([");
    imp_dims_text(&im->body, shape, n);
    sb_printf(&im->body, "], %s%s)", num, strchr(num, '.') || strchr(num, 'e') || strchr(num, 'n') ? "" : ".0");
    imp_statement_end(im);
    return 0;
}

/* LayerNormalization (opset 17) over the axes from `axis` on, scale and bias read. */
static int op_layer_norm(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || !imp_operand(im, 1)) return imp_refuse(im, "needs an input and a scale");
    if (im->node->n_output > 1 && (im->node->output[1][0] || (im->node->n_output > 2 && im->node->output[2][0])))
        return imp_refuse(im, "its mean and inverse deviation outputs are not supported");
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", -1), x->rank);
    if (axis < 1 || axis >= x->rank) return imp_refuse(im, "axis out of range (the batch axis cannot be normalised over)");
    char eps[64];
    util_format_double(eps, sizeof eps, imp_attr_float(im->node, "epsilon", 1e-5));
    const char *xe = imp_use(im, 0);
    char *se = xstrdup(imp_use(im, 1)), *be = imp_operand(im, 2) ? xstrdup(imp_use(im, 2)) : NULL;
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "layer_norm(%s, [", xe);
    imp_dims_text(&im->body, x->dims + axis, x->rank - axis);
    sb_printf(&im->body, "], weight = %s%s%s, eps = %s)", se, be ? ", bias = " : "", be ? be : "", eps);
    imp_statement_end(im);
    free(se), free(be);
    return 0;
}

static int op_hard_sigmoid(Imp *im)
{
    char fmt[200], a[64], b[64];
    util_format_double(a, sizeof a, imp_attr_float(im->node, "alpha", 0.2));
    util_format_double(b, sizeof b, imp_attr_float(im->node, "beta", 0.5));
    snprintf(fmt, sizeof fmt, "clamp(%s * %%s + %s, min = 0.0, max = 1.0)", a, b);
    return unary(im, fmt);
}

static int op_gelu(Imp *im)
{
    const Onnx__AttributeProto *a = imp_attr(im->node, "approximate");
    const bool tanh_ = a && a->has_s && a->s.len == 4 && !memcmp(a->s.data, "tanh", 4);
    return unary(im, tanh_ ? "gelu(%s, approximate = \"tanh\")" : "gelu(%s)");
}

/* ArgMax and ArgMin: the first extreme (select_last_index 0). */
static int op_argmax(Imp *im, bool min)
{
    Val *x = imp_operand(im, 0);
    if (!x) return imp_refuse(im, "no input");
    if (imp_attr_int(im->node, "select_last_index", 0)) return imp_refuse(im, "select_last_index is not supported");
    const int axis = imp_norm_axis(imp_attr_int(im->node, "axis", 0), x->rank);
    const bool keep = imp_attr_int(im->node, "keepdims", 1);
    if (axis < 0 || axis >= x->rank) return imp_refuse(im, "axis out of range");
    int64_t dims[MAX_RANK];
    int r = 0;
    for (int a = 0; a < x->rank; a++)
        if (a != axis) dims[r++] = x->dims[a];
        else if (keep) dims[r++] = 1;
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, r, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "argmax(%s%s, axis = %d, keepdim = %s)", min ? "-" : "", xe, axis, keep ? "true" : "false");
    imp_statement_end(im);
    return 0;
}

/* Resize of the last two axes (4-D): nearest with PyTorch's interpolate's coordinates
 * (asymmetric, floor), or linear (half_pixel, pytorch_half_pixel, align_corners); the
 * output size from `sizes` or `scales`, constants. */
static int op_resize(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank != 4) return imp_refuse(im, "only 4-D inputs ([N, C, H, W]) are supported");
    char mode[32] = "nearest", coords[40] = "half_pixel", nearest[32] = "round_prefer_floor";
    const struct {
        const char *name;
        char *out;
    } strs[] = {{"mode", mode}, {"coordinate_transformation_mode", coords}, {"nearest_mode", nearest}};
    for (int i = 0; i < 3; i++) {
        const Onnx__AttributeProto *a = imp_attr(im->node, strs[i].name);
        if (a && a->has_s) snprintf(strs[i].out, 32, "%.*s", (int)(a->s.len < 31 ? a->s.len : 31), (const char *)a->s.data);
    }
    if (im->m->opset < 11) snprintf(coords, sizeof coords, "asymmetric");
    int64_t dims[4];
    memcpy(dims, x->dims, sizeof dims);
    double scales[4];
    int64_t sizes[4];
    Val *sc = imp_operand(im, im->m->opset < 11 ? 1 : 2), *sz = im->m->opset < 11 ? NULL : imp_operand(im, 3);
    if (sz && sz->nvalues) {
        if (imp_const_ints(im, 3, sizes, 4) != 4) return imp_refuse(im, "its sizes are not 4 constants");
        dims[2] = sizes[2], dims[3] = sizes[3];
        if (sizes[0] != x->dims[0] || sizes[1] != x->dims[1]) return imp_refuse(im, "it resizes the batch or channel axis");
    } else if (sc && sc->values && sc->nvalues == 4) {
        for (int i = 0; i < 4; i++) scales[i] = sc->values[i];
        if (scales[0] != 1 || scales[1] != 1) return imp_refuse(im, "it scales the batch or channel axis");
        dims[2] = (int64_t)floor((double)x->dims[2] * scales[2]), dims[3] = (int64_t)floor((double)x->dims[3] * scales[3]);
    } else {
        return imp_refuse(im, "neither its scales nor its sizes are 4 constants");
    }
    if (dims[2] < 1 || dims[3] < 1 || x->dims[2] == BATCH) return imp_refuse(im, "an empty output");
    const char *how;
    if (!strcmp(mode, "nearest")) {
        if (strcmp(coords, "asymmetric") || (im->m->opset >= 11 && strcmp(nearest, "floor")))
            return imp_refuse(im, "nearest with %s coordinates and %s rounding (Kiln's is PyTorch's: asymmetric, floor)", coords, nearest);
        how = "mode = \"nearest\"";
    } else if (!strcmp(mode, "linear")) {
        if (!strcmp(coords, "align_corners")) how = "mode = \"bilinear\", align_corners = true";
        else if (!strcmp(coords, "half_pixel") || !strcmp(coords, "pytorch_half_pixel")) how = "mode = \"bilinear\", align_corners = false";
        else return imp_refuse(im, "linear with %s coordinates", coords);
    } else {
        return imp_refuse(im, "mode %s (nearest and linear are supported)", mode);
    }
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, 4, dims);
    imp_statement_start(im, y);
    sb_printf(&im->body, "interpolate(%s, size = [%lld, %lld], %s)", xe, (long long)dims[2], (long long)dims[3], how);
    imp_statement_end(im);
    return 0;
}

/* LRN across channels (odd sizes): x / (bias + alpha · mean of x² over the window)^beta, the
 * window's sum an average pool over the channel axis (the spatial axes flattened). */
static int op_lrn(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 3) return imp_refuse(im, "needs an input with channels and spatial axes");
    const int64_t size = imp_attr_int(im->node, "size", 0);
    if (size < 1 || size % 2 == 0) return imp_refuse(im, "a window of %lld channels (odd sizes are supported)", (long long)size);
    int64_t spatial = 1;
    for (int a = 2; a < x->rank; a++) {
        if (x->dims[a] == BATCH) return imp_refuse(im, "a symbolic spatial axis");
        spatial *= x->dims[a];
    }
    char alpha[64], beta[64], bias[64];
    util_format_double(alpha, sizeof alpha, imp_attr_float(im->node, "alpha", 1e-4));
    util_format_double(beta, sizeof beta, imp_attr_float(im->node, "beta", 0.75));
    util_format_double(bias, sizeof bias, imp_attr_float(im->node, "bias", 1.0));
    const char *xe = imp_use(im, 0);
    Val *y = imp_result(im, 0, x->rank, x->dims);
    imp_statement_start(im, y);
    StrBuf d;
    sb_init(&d);
    imp_dims_text(&d, x->dims, x->rank);
    char d0[32];
    if (x->dims[0] == BATCH) snprintf(d0, sizeof d0, "B");
    else snprintf(d0, sizeof d0, "%lld", (long long)x->dims[0]);
    sb_printf(&im->body, "%s / pow(%s + %s * reshape(avg_pool2d(reshape(%s * %s, %s, 1, %lld, %lld), [%lld, 1], stride = [1, 1], padding = [%lld, 0], "
                         "count_include_pad = true), %s), %s)",
              xe, bias, alpha, xe, xe, d0, (long long)x->dims[1], (long long)spatial, (long long)size,
              (long long)(size - 1) / 2, d.data, beta);
    imp_statement_end(im);
    sb_free(&d);
    return 0;
}

/* Trilu: tril or triu of the last two axes, the diagonal a constant. */
static int op_trilu(Imp *im)
{
    Val *x = imp_operand(im, 0);
    if (!x || x->rank < 2) return imp_refuse(im, "needs a matrix or a batch of them");
    int64_t k = 0;
    if (imp_operand(im, 1) && imp_const_ints(im, 1, &k, 1) != 1) return imp_refuse(im, "its diagonal k is not a constant");
    char fmt[80];
    snprintf(fmt, sizeof fmt, "%s(%%s, diagonal = %lld)", imp_attr_int(im->node, "upper", 1) ? "triu" : "tril", (long long)k);
    return unary(im, fmt);
}

/* Cast to the types Kiln has. */
static int op_cast(Imp *im)
{
    static const struct {
        int32_t type;
        const char *fmt;
    } casts[] = {{ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, "f32(%s)"}, {ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE, "f64(%s)"},
                 {ONNX__TENSOR_PROTO__DATA_TYPE__INT64, "i64(%s)"}, {ONNX__TENSOR_PROTO__DATA_TYPE__INT32, "i32(%s)"},
                 {ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, "u8(%s)"},  {ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, "bool(%s)"},
                 {ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT16, "f16(%s)"}, {ONNX__TENSOR_PROTO__DATA_TYPE__BFLOAT16, "bf16(%s)"}};
    const int64_t to = imp_attr_int(im->node, "to", -1);
    for (size_t i = 0; i < sizeof casts / sizeof *casts; i++)
        if (casts[i].type == to) return unary(im, casts[i].fmt);
    return imp_refuse(im, "a cast to %s", onnx_type_name((int32_t)to));
}

/* One node: its operator's writer, or the error that Kiln has none. */
int imp_node(Imp *im)
{
    if (imp_fold(im)) return 0; /* shape arithmetic on constants, done here */
    const char *op = im->node->op_type;
    static const struct {
        const char *op, *fmt;
    } unaries[] = {{"Relu", "relu(%s)"}, {"Sigmoid", "sigmoid(%s)"}, {"Tanh", "tanh(%s)"}, {"Exp", "exp(%s)"}, {"Log", "log(%s)"},
                   {"Sqrt", "sqrt(%s)"}, {"Abs", "abs(%s)"}, {"Neg", "-%s"}, {"Erf", "erf(%s)"}, {"Reciprocal", "1.0 / %s"},
                   {"Softsign", "%s / (1.0 + abs(%s))"}, {"Softplus", "softplus(%s)"}, {"Identity", "%s"}, {"Floor", "%s // 1.0"},
                   {"Sin", "sin(%s)"}, {"Cos", "cos(%s)"}, {"Not", "not %s"}, {"HardSwish", "hardswish(%s)"}};
    for (size_t i = 0; i < sizeof unaries / sizeof *unaries; i++)
        if (!strcmp(op, unaries[i].op)) return unary(im, unaries[i].fmt);
    static const struct {
        const char *op, *sym;
    } binaries[] = {{"Add", "+"},     {"Sub", "-"},        {"Mul", "*"},  {"Div", "/"},  {"Pow", "(pow(%s, %s))"},     {"Equal", "=="},
                    {"Less", "<"},     {"Greater", ">"},    {"LessOrEqual", "<="},         {"GreaterOrEqual", ">="},
                    {"And", "and"},    {"Or", "or"}};
    for (size_t i = 0; i < sizeof binaries / sizeof *binaries; i++)
        if (!strcmp(op, binaries[i].op)) return binary(im, binaries[i].sym);
    if (!strcmp(op, "Dropout")) {
        if (im->node->n_output > 1 && im->node->output[1][0]) return imp_refuse(im, "its mask output is not supported");
        return unary(im, "%s");
    }
    if (!strcmp(op, "Sum")) return variadic(im, NULL);
    if (!strcmp(op, "Max")) return variadic(im, "maximum");
    if (!strcmp(op, "Min")) return variadic(im, "minimum");
    if (!strcmp(op, "Clip")) return op_clip(im);
    if (!strcmp(op, "Cast")) return op_cast(im);
    if (!strcmp(op, "Where")) return op_where(im);
    if (!strcmp(op, "Trilu")) return op_trilu(im);
    if (!strcmp(op, "Resize") || (!strcmp(op, "Upsample") && im->m->opset < 10)) return op_resize(im);
    if (!strcmp(op, "LRN")) return op_lrn(im);
    if (!strcmp(op, "Expand")) return op_expand(im);
    if (!strcmp(op, "Shape")) return op_shape(im);
    if (!strcmp(op, "ConstantOfShape")) return op_constant_of_shape(im);
    if (!strcmp(op, "LayerNormalization")) return op_layer_norm(im);
    if (!strcmp(op, "HardSigmoid")) return op_hard_sigmoid(im);
    if (!strcmp(op, "Gelu")) return op_gelu(im);
    if (!strcmp(op, "ArgMax")) return op_argmax(im, false);
    if (!strcmp(op, "ArgMin")) return op_argmax(im, true);
    if (!strcmp(op, "LeakyRelu")) return op_leaky(im);
    if (!strcmp(op, "Elu")) return op_elu(im);
    if (!strcmp(op, "Selu")) return op_selu(im);
    if (!strcmp(op, "PRelu")) return op_prelu(im);
    if (!strcmp(op, "MatMul")) return op_matmul(im);
    if (!strcmp(op, "Gemm")) return op_gemm(im);
    if (!strcmp(op, "Reshape")) return op_reshape(im);
    if (!strcmp(op, "Flatten")) return op_flatten(im);
    if (!strcmp(op, "Transpose")) return op_transpose(im);
    if (!strcmp(op, "Squeeze")) return op_squeeze(im, false);
    if (!strcmp(op, "Unsqueeze")) return op_squeeze(im, true);
    if (!strcmp(op, "Concat")) return op_concat(im);
    if (!strcmp(op, "Softmax")) return op_softmax(im, "softmax");
    if (!strcmp(op, "LogSoftmax")) return op_softmax(im, "log_softmax");
    if (!strcmp(op, "ReduceMean")) return op_reduce(im, "mean");
    if (!strcmp(op, "ReduceSum")) return op_reduce(im, "sum");
    if (!strcmp(op, "ReduceMax")) return op_reduce(im, "amax");
    if (!strcmp(op, "ReduceMin")) return op_reduce(im, "amin");
    if (!strcmp(op, "BatchNormalization")) return op_batchnorm(im);
    if (!strcmp(op, "Constant")) return op_constant(im);
    if (!strcmp(op, "MaxPool")) return op_pool(im, true);
    if (!strcmp(op, "AveragePool")) return op_pool(im, false);
    if (!strcmp(op, "GlobalAveragePool")) return op_global_pool(im, "mean");
    if (!strcmp(op, "GlobalMaxPool")) return op_global_pool(im, "amax");
    if (!strcmp(op, "Conv")) return op_conv(im);
    if (!strcmp(op, "ConvTranspose")) return op_conv_transpose(im);
    if (!strcmp(op, "Pad")) return op_pad(im);
    if (!strcmp(op, "Split")) return op_split(im);
    if (!strcmp(op, "Slice")) return op_slice(im);
    if (!strcmp(op, "Tile")) return op_tile(im);
    if (!strcmp(op, "Gather")) return op_gather(im);
    if (!strcmp(op, "InstanceNormalization")) return op_instance_norm(im);
    return imp_refuse(im, "operator %s is not supported by kiln import yet", op);
}

