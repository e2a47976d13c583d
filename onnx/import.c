/* import.c — onnx.h's onnx_import: a checked ONNX graph (read.c) written as an ordinary Kiln
 * model file, one statement per node in the graph's order with the node's name and operator
 * in a comment, and its initializers as the model's parameters (their values returned for
 * the weights file).
 *
 * Shapes are the importer's own, inferred node by node from the graph's inputs: Kiln's are
 * static but for the batch, so every shape argument (Reshape's, Unsqueeze's axes, a pool's
 * window) is folded to numbers here, and axis 0 of a graph input whose size is symbolic is
 * Kiln's batch B. Initializers read as shapes or axes are folded; those read as tensors
 * become parameters `p_NAME` (one element: a number in the expression). An operator, an
 * attribute or a shape Kiln cannot express is one error naming the node, the operator and
 * what is missing — never a model that computes something else. */
#include "onnx.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RANK 8
#define BATCH (-1) /* a dim that is the batch B */

typedef struct {
    char *expr;              /* what the Kiln file calls it: an identifier or a number */
    int rank;
    int64_t dims[MAX_RANK];  /* BATCH for the batch */
    double *values;          /* a constant's elements (initializer, Constant), or NULL */
    int64_t nvalues;
    const Onnx__TensorProto *init; /* the initializer it is, or NULL */
    bool declared;           /* a parameter already declared for it */
    const char *source;      /* an initializer's name, or "Constant NAME" of a Constant's output */
} Val;

typedef struct {
    const OnnxModel *m;
    const char *path;
    StrBuf *out, members, body, *err;
    OnnxWeights *w;
    StrMap names; /* Kiln identifiers taken */
    StrMap vals;  /* ONNX name -> index in v */
    Val *v;
    int32_t nv, cap;
    /* parameters kept under their state_dict names (fc1.weight): a holder module per
     * prefix, as PyTorch's modules are */
    struct {
        char *path, *decl;
    } *held;
    int32_t nheld, capheld;
    StrMap holder; /* first segments the holders claimed */
    const Onnx__NodeProto *node; /* the node being written */
    char *node_label;            /* "node 'NAME' (OP)" */
} Imp;

static const char *const keywords[] = {"model", "module", "const", "dim", "forward", "loss", "metric", "init", "train", "return", "for", "in",
                                       "and", "or", "not", "if", "else", "B", "inf", "pi", NULL};

/* A fresh Kiln identifier from an ONNX name: prefix, then its letters, digits and _. */
static char *identifier(Imp *im, const char *prefix, const char *name)
{
    StrBuf b;
    sb_init(&b);
    sb_puts(&b, prefix);
    for (const char *p = name; *p; p++) {
        const char c = isalnum((unsigned char)*p) ? *p : '_';
        if (c == '_' && b.len && b.data[b.len - 1] == '_') continue;
        sb_putc(&b, c);
    }
    while (b.len > 1 && b.data[b.len - 1] == '_') b.data[--b.len] = 0;
    if (!b.len) sb_puts(&b, "v");
    for (int k = 0; keywords[k]; k++)
        if (!strcmp(b.data, keywords[k])) sb_puts(&b, "_");
    char *s = sb_take(&b);
    for (int n = 2; strmap_get(&im->names, s, 0); n++) {
        sb_printf(&b, "%s_%d", s, n);
        if (!strmap_get(&im->names, b.data, 0)) {
            free(s);
            s = sb_take(&b);
            break;
        }
        b.len = 0;
    }
    sb_free(&b);
    strmap_put(&im->names, s, 1);
    return s;
}

static int refuse(Imp *im, const char *fmt, ...) KILN_PRINTF(2, 3);
static int refuse(Imp *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_printf(im->err, "%s: error: %s: ", im->path, im->node_label ? im->node_label : "the graph");
    sb_vprintf(im->err, fmt, ap);
    va_end(ap);
    return -1;
}

static Val *add_val(Imp *im, const char *onnx_name)
{
    GROW(im->v, im->cap, im->nv + 1);
    Val *v = &im->v[im->nv];
    memset(v, 0, sizeof *v);
    strmap_put(&im->vals, onnx_name, im->nv++);
    return v;
}

static Val *val(Imp *im, const char *onnx_name)
{
    const int32_t i = strmap_get(&im->vals, onnx_name, -1);
    return i < 0 ? NULL : &im->v[i];
}

/* ---- attributes ---- */

static const Onnx__AttributeProto *attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (!strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}

static int64_t attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

static double attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
    const Onnx__AttributeProto *a = attr(n, name);
    return a && a->has_f ? a->f : dflt;
}

/* An ints attribute into out (at most cap): its count, or -1 when absent. */
static int attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int cap)
{
    const Onnx__AttributeProto *a = attr(n, name);
    if (!a) return -1;
    const int k = (int)(a->n_ints < (size_t)cap ? a->n_ints : (size_t)cap);
    for (int i = 0; i < k; i++) out[i] = a->ints[i];
    return k;
}

/* ---- values ---- */

/* Operand j of the node (NULL when absent or optional and left out). */
static Val *operand(Imp *im, size_t j)
{
    return j < im->node->n_input && im->node->input[j][0] ? val(im, im->node->input[j]) : NULL;
}

/* A constant operand's integer values (shape, axes, pads...) into out: the count, or -1
 * when the operand is not a constant. */
static int const_ints(Imp *im, size_t j, int64_t *out, int cap)
{
    Val *x = operand(im, j);
    if (!x || !x->values || x->nvalues > cap) return -1;
    for (int64_t i = 0; i < x->nvalues; i++) out[i] = (int64_t)x->values[i];
    return (int)x->nvalues;
}

/* Can initializer `name` keep its name, a state_dict path of identifiers (fc1.weight,
 * layer1.conv1.weight), in holder modules? Claims it if so: its first segment is not a
 * name the file uses otherwise, and it is neither a prefix of a path held nor one of them
 * a prefix of it. */
static bool claim_path(Imp *im, const char *name)
{
    int segs = 0;
    for (const char *p = name; *p; segs++) {
        const char *e = strchr(p, '.');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!n || !(isalpha((unsigned char)p[0]) || p[0] == '_')) return false;
        for (size_t i = 0; i < n; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '_') return false;
        for (int k = 0; keywords[k]; k++)
            if (strlen(keywords[k]) == n && !strncmp(p, keywords[k], n)) return false;
        p = e ? e + 1 : p + n;
        if (e && !*p) return false;
    }
    if (segs < 2) return false;
    const size_t first = strcspn(name, ".");
    char top[256];
    if (first >= sizeof top) return false;
    snprintf(top, sizeof top, "%.*s", (int)first, name);
    if (strmap_get(&im->names, top, 0) && !strmap_get(&im->holder, top, 0)) return false;
    const size_t len = strlen(name);
    for (int32_t i = 0; i < im->nheld; i++) {
        const char *h = im->held[i].path;
        const size_t hl = strlen(h);
        if ((hl < len && !strncmp(name, h, hl) && name[hl] == '.') || (len < hl && !strncmp(h, name, len) && h[len] == '.')) return false;
    }
    strmap_put(&im->names, top, 1);
    strmap_put(&im->holder, top, 1);
    return true;
}

/* The holder module of prefix (a held path's dotted prefix) and the ones inside it, each
 * before its user: `module P_layer1_conv1() { weight = Parameter(...) ... }`. */
static void emit_holder(Imp *im, StrBuf *out, const char *prefix)
{
    const size_t pl = strlen(prefix);
    StrBuf body;
    sb_init(&body);
    StrMap seen;
    memset(&seen, 0, sizeof seen);
    for (int32_t i = 0; i < im->nheld; i++) {
        const char *h = im->held[i].path;
        if (strncmp(h, prefix, pl) || h[pl] != '.') continue;
        const char *child = h + pl + 1, *dot = strchr(child, '.');
        char seg[256];
        snprintf(seg, sizeof seg, "%.*s", (int)(dot ? (size_t)(dot - child) : strlen(child)), child);
        if (strmap_get(&seen, seg, 0)) continue;
        strmap_put(&seen, seg, 1);
        if (!dot) {
            sb_printf(&body, "    %s = %s\n", seg, im->held[i].decl);
            continue;
        }
        char sub[600];
        snprintf(sub, sizeof sub, "%s.%s", prefix, seg);
        emit_holder(im, out, sub);
        sb_printf(&body, "    %s = P_", seg);
        for (const char *c = sub; *c; c++) sb_putc(&body, *c == '.' ? '_' : *c);
        sb_puts(&body, "()\n");
    }
    sb_puts(out, "module P_");
    for (const char *c = prefix; *c; c++) sb_putc(out, *c == '.' ? '_' : *c);
    sb_printf(out, "() {\n%s    forward(x) { return x }\n}\n", body.data ? body.data : "");
    strmap_free(&seen);
    sb_free(&body);
}

/* The holders, and a member for each top one: `fc1 = P_fc1()`. */
static void emit_holders(Imp *im, StrBuf *out)
{
    StrMap seen;
    memset(&seen, 0, sizeof seen);
    for (int32_t i = 0; i < im->nheld; i++) {
        char top[256];
        snprintf(top, sizeof top, "%.*s", (int)strcspn(im->held[i].path, "."), im->held[i].path);
        if (strmap_get(&seen, top, 0)) continue;
        strmap_put(&seen, top, 1);
        emit_holder(im, out, top);
        sb_printf(out, "%s = P_%s()\n", top, top);
    }
    if (im->nheld) sb_putc(out, '\n');
    strmap_free(&seen);
}

/* The Kiln expression of operand j: a parameter declared on first use, or a number. */
static const char *use(Imp *im, size_t j)
{
    Val *x = operand(im, j);
    if (!x) return "";
    if (x->init && !x->declared) {
        x->declared = true;
        if (x->nvalues == 1 && x->rank == 0) { /* a scalar: a number */
            char num[64];
            util_format_double(num, sizeof num, x->values[0]);
            free(x->expr);
            x->expr = xstrdup(num);
            return x->expr;
        }
        StrBuf decl;
        sb_init(&decl);
        sb_puts(&decl, "Parameter(");
        for (int a = 0; a < x->rank; a++) sb_printf(&decl, "%s%lld", a ? ", " : "", (long long)x->dims[a]);
        sb_puts(&decl, ")");
        if (x->source == x->init->name && claim_path(im, x->init->name)) { /* in a holder module, under its own name */
            free(x->expr);
            x->expr = xstrdup(x->init->name);
            GROW(im->held, im->capheld, im->nheld + 1);
            im->held[im->nheld].path = xstrdup(x->expr);
            im->held[im->nheld++].decl = sb_take(&decl);
        } else {
            sb_printf(&im->members, "%s = %s  # %s'%s'\n", x->expr, decl.data, x->source == x->init->name ? "initializer " : "", x->source);
        }
        sb_free(&decl);
        GROW(im->w->t, im->w->cap, im->w->n + 1);
        OnnxWeight *wt = &im->w->t[im->w->n++];
        wt->name = xstrdup(x->expr);
        wt->rank = x->rank;
        memcpy(wt->dims, x->dims, sizeof wt->dims);
        wt->values = x->values;
        wt->n = x->nvalues;
    }
    return x->expr;
}

static void dims_text(StrBuf *b, const int64_t *d, int rank)
{
    for (int a = 0; a < rank; a++) {
        if (a) sb_puts(b, ", ");
        if (d[a] == BATCH) sb_puts(b, "B");
        else sb_printf(b, "%lld", (long long)d[a]);
    }
}

/* Output k of the node: its value, named from its ONNX name, with the given shape. */
static Val *result(Imp *im, size_t k, int rank, const int64_t *dims)
{
    const char *name = im->node->output[k];
    Val *v = add_val(im, name);
    v->expr = identifier(im, "v_", name);
    v->rank = rank;
    memcpy(v->dims, dims, (size_t)rank * sizeof *dims);
    return v;
}

/* `NAME = ` of output k, then the caller's expression, then the comment and newline. */
static void statement_start(Imp *im, const Val *v) { sb_printf(&im->body, "    %s = ", v->expr); }
static void statement_end(Imp *im)
{
    const Onnx__NodeProto *n = im->node;
    sb_printf(&im->body, "  # %s%s%s\n", n->name && n->name[0] ? n->name : "", n->name && n->name[0] ? ": " : "", n->op_type);
}

/* ---- shapes ---- */

static int64_t numel(const int64_t *d, int rank, int64_t batch)
{
    int64_t e = 1;
    for (int a = 0; a < rank; a++) e *= d[a] == BATCH ? batch : d[a];
    return e;
}

/* NumPy broadcasting of a and b into out: false when they do not broadcast. */
static bool broadcast(const Val *a, const Val *b, int *rank, int64_t *out)
{
    const int r = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < r; i++) {
        const int ia = a->rank - r + i, ib = b->rank - r + i;
        const int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? b->dims[ib] : 1;
        if (x == y || y == 1) out[i] = x;
        else if (x == 1) out[i] = y;
        else return false;
    }
    *rank = r;
    return true;
}

static int norm_axis(int64_t axis, int rank) { return (int)(axis < 0 ? axis + rank : axis); }

/* ---- the operators ----
 * Each writes its node's statement(s) and records its outputs' shapes; -1 with refuse(). */

/* y = expr_prefix(x) suffix: an elementwise function of operand 0. */
static int unary(Imp *im, const char *fmt)
{
    Val *x = operand(im, 0);
    if (!x) return refuse(im, "no input");
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, x->dims);
    statement_start(im, y);
    sb_printf(&im->body, fmt, xe, xe, xe);
    statement_end(im);
    return 0;
}

/* Operand 1 of a binary op as broadcast against operand 0, by opset 6's legacy rule
 * (broadcast = 1: b aligned at `axis`, or at the end) or NumPy's. */
static int binary(Imp *im, const char *op)
{
    Val *a = operand(im, 0), *b = operand(im, 1);
    if (!a || !b) return refuse(im, "needs two inputs");
    const char *ae = use(im, 0), *be = use(im, 1);
    char *bexpr = xstrdup(be);
    Val bb = *b;
    const Onnx__AttributeProto *axis = attr(im->node, "axis");
    if (im->m->opset < 7 && attr_int(im->node, "broadcast", 0) && axis && b->rank) { /* legacy: b's axes from `axis` on */
        const int at = norm_axis(axis->i, a->rank);
        if (at < 0 || at + b->rank > a->rank) {
            free(bexpr);
            return refuse(im, "broadcast axis %lld does not fit", (long long)axis->i);
        }
        bb.rank = a->rank - at;
        for (int i = 0; i < bb.rank; i++) bb.dims[i] = i < b->rank ? b->dims[i] : 1;
        if (bb.rank != b->rank) {
            StrBuf r;
            sb_init(&r);
            sb_printf(&r, "reshape(%s, ", be);
            dims_text(&r, bb.dims, bb.rank);
            sb_puts(&r, ")");
            free(bexpr);
            bexpr = sb_take(&r);
        }
    }
    int rank;
    int64_t dims[MAX_RANK];
    if (!broadcast(a, &bb, &rank, dims)) {
        free(bexpr);
        return refuse(im, "its inputs' shapes do not broadcast");
    }
    Val *y = result(im, 0, rank, dims);
    statement_start(im, y);
    if (op[0] == '(') sb_printf(&im->body, op, ae, bexpr);
    else sb_printf(&im->body, "%s %s %s", ae, op, bexpr);
    statement_end(im);
    free(bexpr);
    return 0;
}

/* Sum, Max, Min of any number of inputs (NumPy broadcasting), in order. */
static int variadic(Imp *im, const char *fn)
{
    if (!im->node->n_input) return refuse(im, "no input");
    Val acc = *operand(im, 0);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, use(im, 0));
    for (size_t j = 1; j < im->node->n_input; j++) {
        Val *x = operand(im, j);
        if (!x || !broadcast(&acc, x, &acc.rank, acc.dims)) {
            sb_free(&e);
            return refuse(im, "its inputs' shapes do not broadcast");
        }
        char *prev = sb_take(&e);
        if (fn) sb_printf(&e, "%s(%s, %s)", fn, prev, use(im, j));
        else sb_printf(&e, "%s + %s", prev, use(im, j));
        free(prev);
    }
    Val *y = result(im, 0, acc.rank, acc.dims);
    statement_start(im, y);
    sb_puts(&im->body, e.data);
    statement_end(im);
    sb_free(&e);
    return 0;
}

static int op_clip(Imp *im)
{
    double lo = -INFINITY, hi = INFINITY;
    if (im->m->opset < 11) {
        lo = attr_float(im->node, "min", -INFINITY), hi = attr_float(im->node, "max", INFINITY);
    } else {
        for (int j = 1; j <= 2; j++) {
            Val *b = operand(im, (size_t)j);
            if (!b) continue;
            if (!b->values || b->nvalues != 1) return refuse(im, "its %s is not a constant", j == 1 ? "min" : "max");
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
    Val *a = operand(im, 0), *b = operand(im, 1);
    if (!a || !b || a->rank < 1 || b->rank < 1) return refuse(im, "needs two tensors of rank 1 or more");
    const char *ae = use(im, 0), *be = use(im, 1);
    int64_t dims[MAX_RANK];
    int rank;
    if (a->rank == 1 || b->rank == 1) return refuse(im, "a product with a vector (rank 1) is not supported yet");
    if (a->dims[a->rank - 1] != b->dims[b->rank - 2]) return refuse(im, "inner sizes differ");
    Val ab = *a, bb = *b;
    ab.rank -= 2, bb.rank -= 2;
    if (!broadcast(&ab, &bb, &rank, dims)) return refuse(im, "batch axes do not broadcast");
    dims[rank++] = a->dims[a->rank - 2];
    dims[rank++] = b->dims[b->rank - 1];
    Val *y = result(im, 0, rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "%s @ %s", ae, be);
    statement_end(im);
    return 0;
}

static int op_gemm(Imp *im)
{
    Val *a = operand(im, 0), *b = operand(im, 1), *c = operand(im, 2);
    if (!a || !b || a->rank != 2 || b->rank != 2) return refuse(im, "A and B must be matrices");
    const bool ta = attr_int(im->node, "transA", 0), tb = attr_int(im->node, "transB", 0);
    const double alpha = attr_float(im->node, "alpha", 1.0), beta = attr_float(im->node, "beta", 1.0);
    const char *ae = use(im, 0), *be = use(im, 1);
    const int64_t dims[2] = {a->dims[ta ? 1 : 0], b->dims[tb ? 0 : 1]};
    if (a->dims[ta ? 0 : 1] != b->dims[tb ? 1 : 0]) return refuse(im, "inner sizes differ");
    char *ce = c ? xstrdup(use(im, 2)) : NULL;
    Val *y = result(im, 0, 2, dims);
    statement_start(im, y);
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
    statement_end(im);
    free(ce);
    return 0;
}

/* reshape(x, dims) of operand 0 to the shape dims (the output's). */
static int reshape_to(Imp *im, int rank, const int64_t *dims)
{
    Val *x = operand(im, 0);
    if (numel(dims, rank, 7) != numel(x->dims, x->rank, 7)) return refuse(im, "the new shape has another number of elements");
    const char *xe = use(im, 0);
    Val *y = result(im, 0, rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "reshape(%s, ", xe);
    dims_text(&im->body, dims, rank);
    sb_puts(&im->body, ")");
    statement_end(im);
    return 0;
}

static int op_reshape(Imp *im)
{
    Val *x = operand(im, 0);
    int64_t shape[MAX_RANK + 1];
    int n;
    if (im->m->opset < 5) n = attr_ints(im->node, "shape", shape, MAX_RANK + 1);
    else n = const_ints(im, 1, shape, MAX_RANK + 1);
    if (!x || n < 0) return refuse(im, "its shape is not a constant (Kiln's shapes are static)");
    if (n > MAX_RANK) return refuse(im, "rank over %d", MAX_RANK);
    const bool allowzero = attr_int(im->node, "allowzero", 0);
    int infer = -1;
    int64_t known = 1;
    bool batch_kept = false; /* a 0 that copies the input's batch axis */
    bool is_batch[MAX_RANK] = {0};
    for (int a = 0; a < n; a++) {
        if (shape[a] == 0 && !allowzero) {
            if (a >= x->rank) return refuse(im, "a 0 in its shape past the input's rank");
            is_batch[a] = x->dims[a] == BATCH;
            batch_kept |= is_batch[a];
            shape[a] = is_batch[a] ? 1 : x->dims[a];
        }
        if (shape[a] == -1) {
            if (infer >= 0) return refuse(im, "two -1 in its shape");
            infer = a;
        } else if (shape[a] < 0) {
            return refuse(im, "a negative size in its shape");
        } else {
            known *= shape[a];
        }
    }
    /* the batch: kept where it was (a 0), else held alone by a -1 at axis 0 */
    const int64_t total = numel(x->dims, x->rank, 1);
    if (infer >= 0) {
        if (!known || total % known) return refuse(im, "its shape does not divide the input's elements");
        shape[infer] = total / known;
    }
    if (x->rank && x->dims[0] == BATCH && !batch_kept) {
        if (infer != 0 || shape[0] != 1) return refuse(im, "it folds the batch into another axis");
        shape[0] = BATCH;
    }
    for (int a = 0; a < n; a++)
        if (is_batch[a]) shape[a] = BATCH;
    return reshape_to(im, n, shape);
}

static int op_flatten(Imp *im)
{
    Val *x = operand(im, 0);
    const int axis = norm_axis(attr_int(im->node, "axis", 1), x->rank);
    if (axis < 0 || axis > x->rank) return refuse(im, "axis out of range");
    int64_t d[2] = {1, 1};
    for (int a = 0; a < x->rank; a++) {
        if (a < axis && x->dims[a] == BATCH) d[0] = axis == 1 ? BATCH : -2;
        else if (a < axis) d[0] *= x->dims[a];
        else if (x->dims[a] == BATCH) return refuse(im, "it folds the batch into another axis");
        else d[1] *= x->dims[a];
    }
    if (d[0] == -2) return refuse(im, "it folds the batch into another axis");
    return reshape_to(im, 2, d);
}

static int op_transpose(Imp *im)
{
    Val *x = operand(im, 0);
    int64_t perm[MAX_RANK], dims[MAX_RANK];
    int n = attr_ints(im->node, "perm", perm, MAX_RANK);
    if (n < 0) {
        n = x->rank;
        for (int a = 0; a < n; a++) perm[a] = n - 1 - a;
    }
    if (n != x->rank) return refuse(im, "perm does not have the input's rank");
    for (int a = 0; a < n; a++) {
        if (perm[a] < 0 || perm[a] >= n) return refuse(im, "perm out of range");
        dims[a] = x->dims[perm[a]];
    }
    const char *xe = use(im, 0);
    Val *y = result(im, 0, n, dims);
    statement_start(im, y);
    sb_printf(&im->body, "permute(%s", xe);
    for (int a = 0; a < n; a++) sb_printf(&im->body, ", %lld", (long long)perm[a]);
    sb_puts(&im->body, ")");
    statement_end(im);
    return 0;
}

/* Squeeze or Unsqueeze: the new shape, written as a reshape. */
static int op_squeeze(Imp *im, bool unsqueeze)
{
    Val *x = operand(im, 0);
    int64_t axes[MAX_RANK], dims[MAX_RANK];
    int n = im->m->opset < 13 ? attr_ints(im->node, "axes", axes, MAX_RANK) : const_ints(im, 1, axes, MAX_RANK);
    if (unsqueeze && n < 0) return refuse(im, "its axes are not constants");
    const int rank = unsqueeze ? x->rank + n : x->rank;
    bool pick[MAX_RANK * 2] = {0};
    for (int k = 0; k < n; k++) {
        const int a = norm_axis(axes[k], rank);
        if (a < 0 || a >= rank || rank > MAX_RANK) return refuse(im, "axis out of range");
        pick[a] = true;
    }
    int r = 0;
    if (unsqueeze) {
        for (int a = 0, i = 0; a < rank; a++) dims[r++] = pick[a] ? 1 : x->dims[i++];
    } else {
        for (int a = 0; a < x->rank; a++) {
            const bool drop = n < 0 ? x->dims[a] == 1 : pick[a];
            if (drop && x->dims[a] != 1) return refuse(im, "axis %d is not of size 1", a);
            if (!drop) dims[r++] = x->dims[a];
        }
    }
    return reshape_to(im, r, dims);
}

static int op_concat(Imp *im)
{
    Val *x0 = operand(im, 0);
    if (!x0) return refuse(im, "no input");
    const int axis = norm_axis(attr_int(im->node, "axis", 1), x0->rank);
    int64_t dims[MAX_RANK];
    memcpy(dims, x0->dims, sizeof dims);
    if (axis < 0 || axis >= x0->rank) return refuse(im, "axis out of range");
    dims[axis] = 0;
    StrBuf e;
    sb_init(&e);
    for (size_t j = 0; j < im->node->n_input; j++) {
        Val *x = operand(im, j);
        if (!x || x->rank != x0->rank || x->dims[axis] == BATCH) {
            sb_free(&e);
            return refuse(im, "its inputs do not concatenate along axis %d", axis);
        }
        dims[axis] += x->dims[axis];
        if (j && j % 15 == 0) { /* at most 16 tensors in one concat */
            char *prev = sb_take(&e);
            sb_printf(&e, "concat(%s, axis = %d)", prev, axis);
            free(prev);
        }
        sb_printf(&e, "%s%s", e.len ? ", " : "", use(im, j));
    }
    Val *y = result(im, 0, x0->rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "concat(%s, axis = %d)", e.data, axis);
    statement_end(im);
    sb_free(&e);
    return 0;
}

/* Softmax and LogSoftmax: before opset 13, over the input flattened to 2-D at `axis`. */
static int op_softmax(Imp *im, const char *fn)
{
    Val *x = operand(im, 0);
    const int axis = norm_axis(attr_int(im->node, "axis", im->m->opset < 13 ? 1 : -1), x->rank);
    if (axis < 0 || axis >= x->rank) return refuse(im, "axis out of range");
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, x->dims);
    statement_start(im, y);
    if (im->m->opset >= 13 || axis == x->rank - 1) {
        sb_printf(&im->body, "%s(%s, axis = %d)", fn, xe, axis);
    } else { /* the trailing axes as one */
        int64_t d[MAX_RANK];
        for (int a = 0; a < axis; a++) d[a] = x->dims[a];
        d[axis] = 1;
        for (int a = axis; a < x->rank; a++) {
            if (x->dims[a] == BATCH) return refuse(im, "it folds the batch into another axis");
            d[axis] *= x->dims[a];
        }
        sb_printf(&im->body, "reshape(%s(reshape(%s, ", fn, xe);
        dims_text(&im->body, d, axis + 1);
        sb_printf(&im->body, "), axis = -1), ");
        dims_text(&im->body, x->dims, x->rank);
        sb_puts(&im->body, ")");
    }
    statement_end(im);
    return 0;
}

static int op_reduce(Imp *im, const char *fn)
{
    Val *x = operand(im, 0);
    int64_t axes[MAX_RANK], dims[MAX_RANK];
    int n = attr_ints(im->node, "axes", axes, MAX_RANK);
    if (n < 0 && im->node->n_input > 1) n = const_ints(im, 1, axes, MAX_RANK);
    const bool keep = attr_int(im->node, "keepdims", 1);
    bool pick[MAX_RANK] = {0};
    if (n < 0 || (n == 0 && !attr_int(im->node, "noop_with_empty_axes", 0))) {
        n = x->rank;
        for (int a = 0; a < n; a++) axes[a] = a;
    }
    for (int k = 0; k < n; k++) {
        const int a = norm_axis(axes[k], x->rank);
        if (a < 0 || a >= x->rank) return refuse(im, "axis out of range");
        pick[a] = true;
    }
    int r = 0;
    for (int a = 0; a < x->rank; a++)
        if (!pick[a]) dims[r++] = x->dims[a];
        else if (keep) dims[r++] = 1;
    const char *xe = use(im, 0);
    Val *y = result(im, 0, r, dims);
    statement_start(im, y);
    sb_printf(&im->body, "%s(%s, axis = [", fn, xe);
    for (int a = 0, any = 0; a < x->rank; a++)
        if (pick[a]) sb_printf(&im->body, "%s%d", any++ ? ", " : "", a);
    sb_printf(&im->body, "], keepdim = %s)", keep ? "true" : "false");
    statement_end(im);
    return 0;
}

static int op_batchnorm(Imp *im)
{
    Val *x = operand(im, 0);
    if (!x || x->rank < 2) return refuse(im, "the input needs a channel axis");
    for (size_t j = 1; j < 5; j++)
        if (!operand(im, j) || operand(im, j)->rank != 1) return refuse(im, "scale, bias, mean and variance must be vectors");
    if (im->node->n_output > 1 && im->node->output[1][0]) return refuse(im, "training mode (running statistics as outputs) is not supported");
    char eps[64];
    util_format_double(eps, sizeof eps, attr_float(im->node, "epsilon", 1e-5));
    StrBuf cdims;
    sb_init(&cdims);
    sb_printf(&cdims, "%lld", (long long)x->dims[1]);
    for (int a = 2; a < x->rank; a++) sb_puts(&cdims, ", 1");
    const char *xe = use(im, 0);
    char *s = xstrdup(use(im, 1)), *b = xstrdup(use(im, 2)), *mn = xstrdup(use(im, 3)), *var = xstrdup(use(im, 4));
    Val *y = result(im, 0, x->rank, x->dims);
    statement_start(im, y);
    sb_printf(&im->body, "(%s - reshape(%s, %s)) * reshape(%s / sqrt(%s + %s), %s) + reshape(%s, %s)", xe, mn, cdims.data, s, var, eps, cdims.data, b,
              cdims.data);
    statement_end(im);
    free(s), free(b), free(mn), free(var);
    sb_free(&cdims);
    return 0;
}

static int op_prelu(Imp *im)
{
    Val *x = operand(im, 0), *s = operand(im, 1);
    if (!x || !s) return refuse(im, "needs two inputs");
    const char *xe = use(im, 0);
    char *se = xstrdup(use(im, 1));
    Val sb = *s;
    if (im->m->opset < 7 && s->rank == 1 && x->rank >= 2 && s->dims[0] == x->dims[1] && x->rank > 2) { /* one slope per channel */
        sb.rank = x->rank - 1;
        for (int a = 1; a < sb.rank; a++) sb.dims[a] = 1;
        StrBuf r;
        sb_init(&r);
        sb_printf(&r, "reshape(%s, ", se);
        dims_text(&r, sb.dims, sb.rank);
        sb_puts(&r, ")");
        free(se);
        se = sb_take(&r);
    }
    int rank;
    int64_t dims[MAX_RANK];
    if (!broadcast(x, &sb, &rank, dims) || rank != x->rank) {
        free(se);
        return refuse(im, "the slope does not broadcast to the input");
    }
    Val *y = result(im, 0, x->rank, x->dims);
    statement_start(im, y);
    sb_printf(&im->body, "where(%s >= 0, %s, %s * %s)", xe, xe, xe, se);
    statement_end(im);
    free(se);
    return 0;
}

/* A Constant node: its value, folded (a parameter where read as a tensor). */
static int op_constant(Imp *im)
{
    const Onnx__AttributeProto *a = attr(im->node, "value");
    if (!a || !a->t) return refuse(im, "only the `value` form of Constant is supported");
    const Onnx__TensorProto *t = a->t;
    if (!onnx_type_size(t->data_type)) return refuse(im, "its type is %s", onnx_type_name(t->data_type));
    if (t->n_dims > MAX_RANK || onnx_numel(t->dims, t->n_dims) < 0) return refuse(im, "its shape is too large");
    Val *v = add_val(im, im->node->output[0]);
    v->init = t;
    v->source = im->node->output[0]; /* a Constant's value: not a state_dict entry */
    v->expr = identifier(im, "p_", im->node->output[0]);
    v->rank = (int)t->n_dims;
    for (int k = 0; k < v->rank; k++) v->dims[k] = t->dims[k];
    v->nvalues = onnx_numel(t->dims, t->n_dims);
    v->values = onnx_tensor_values(t);
    if (!v->values) v->values = xcalloc(1, sizeof *v->values);
    size_t have = t->has_raw_data ? t->raw_data.len / (size_t)onnx_type_size(t->data_type) : t->n_float_data + t->n_int64_data + t->n_int32_data + t->n_double_data;
    if ((int64_t)have != v->nvalues) return refuse(im, "its value holds %zu elements, not the %lld of its shape", have, (long long)v->nvalues);
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
    if (attr_ints(im->node, "strides", v, 2) == nsp)
        for (int i = 0; i < nsp; i++) w->s[2 - nsp + i] = v[i];
    if (attr_ints(im->node, "dilations", v, 2) == nsp)
        for (int i = 0; i < nsp; i++) w->d[2 - nsp + i] = v[i];
    const Onnx__AttributeProto *ap = attr(im->node, "auto_pad");
    if (ap && ap->has_s && ap->s.len && strncmp((const char *)ap->s.data, "NOTSET", ap->s.len) && strncmp((const char *)ap->s.data, "VALID", ap->s.len))
        return refuse(im, "auto_pad %.*s is not supported yet (pads given explicitly are)", (int)ap->s.len, (const char *)ap->s.data);
    const int np = attr_ints(im->node, "pads", v, 4);
    if (np == 2 * nsp)
        for (int i = 0; i < nsp; i++) {
            if (v[i] != v[i + nsp]) return refuse(im, "asymmetric pads are not supported yet");
            w->p[2 - nsp + i] = v[i];
        }
    else if (np > 0) return refuse(im, "pads do not have two entries per spatial axis");
    return 0;
}

static int op_pool(Imp *im, bool max)
{
    Val *x = operand(im, 0);
    if (!x || x->rank < 3 || x->rank > 4) return refuse(im, "%dD pooling is not supported (1-D and 2-D are)", x ? x->rank - 2 : 0);
    int64_t kernel[2];
    if (attr_ints(im->node, "kernel_shape", kernel, 2) != x->rank - 2) return refuse(im, "kernel_shape does not match the input's rank");
    Window w;
    if (window(im, x, kernel, &w)) return -1;
    const bool ceil_mode = attr_int(im->node, "ceil_mode", 0), pad_counts = attr_int(im->node, "count_include_pad", 0);
    if (im->node->n_output > 1 && im->node->output[1][0]) return refuse(im, "the Indices output is not supported");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    for (int i = 0; i < x->rank - 2; i++) {
        const int j = 2 - (x->rank - 2) + i;
        const int64_t span = x->dims[2 + i] + 2 * w.p[j] - w.d[j] * (w.k[j] - 1) - 1;
        int64_t o = (ceil_mode ? (span + w.s[j] - 1) / w.s[j] : span / w.s[j]) + 1;
        if (ceil_mode && (o - 1) * w.s[j] >= x->dims[2 + i] + w.p[j]) o--; /* the last window starts inside */
        if (o < 1) return refuse(im, "the window is larger than the padded input");
        dims[2 + i] = o;
    }
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    const bool one_d = x->rank == 3;
    if (one_d) sb_puts(&im->body, "squeeze(");
    sb_printf(&im->body, "%s(%s%s%s, [%lld, %lld], stride = [%lld, %lld], padding = [%lld, %lld]", max ? "max_pool2d" : "avg_pool2d",
              one_d ? "unsqueeze(" : "", xe, one_d ? ", 2)" : "", (long long)w.k[0], (long long)w.k[1], (long long)w.s[0], (long long)w.s[1],
              (long long)w.p[0], (long long)w.p[1]);
    if (max) sb_printf(&im->body, ", dilation = [%lld, %lld]", (long long)w.d[0], (long long)w.d[1]);
    else if (w.d[0] != 1 || w.d[1] != 1) return refuse(im, "dilated average pooling is not supported");
    if (!max) sb_printf(&im->body, ", count_include_pad = %s", pad_counts ? "true" : "false");
    sb_printf(&im->body, ", ceil_mode = %s)%s", ceil_mode ? "true" : "false", one_d ? ", 2)" : "");
    statement_end(im);
    return 0;
}

static int op_global_pool(Imp *im, const char *fn)
{
    Val *x = operand(im, 0);
    if (!x || x->rank < 3) return refuse(im, "the input needs spatial axes");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    for (int a = 2; a < x->rank; a++) dims[a] = 1;
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "%s(%s, axis = [", fn, xe);
    for (int a = 2; a < x->rank; a++) sb_printf(&im->body, "%s%d", a > 2 ? ", " : "", a);
    sb_puts(&im->body, "], keepdim = true)");
    statement_end(im);
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
        for (int k = 0; ok && keywords[k]; k++) ok = strcmp(x, keywords[k]) != 0;
        if (ok && b) {
            char bn[300];
            snprintf(bn, sizeof bn, "%s.bias", x);
            ok = b->source == b->init->name && !strcmp(b->source, bn);
        }
        if (ok) {
            strmap_put(&im->names, x, 1);
            return xstrdup(x);
        }
    }
    return identifier(im, prefix, im->node->name && im->node->name[0] ? im->node->name : im->node->output[0]);
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

/* Conv, 1-D and 2-D: a Conv1d/Conv2d member whose weight and bias are the initializers. */
static int op_conv(Imp *im)
{
    Val *x = operand(im, 0), *wt = operand(im, 1), *b = operand(im, 2);
    if (!x || x->rank < 3 || x->rank > 4) return refuse(im, "%dD convolution is not supported (1-D and 2-D are)", x ? x->rank - 2 : 0);
    if (!wt || !wt->init || wt->rank != x->rank) return refuse(im, "its weight is not an initializer of the input's rank");
    if (b && !b->init) return refuse(im, "its bias is not an initializer");
    const int64_t groups = attr_int(im->node, "group", 1);
    Window w;
    if (window(im, x, wt->dims + 2, &w)) return -1;
    const int64_t cout = wt->dims[0], cin = wt->dims[1] * groups;
    if (x->dims[1] != cin) return refuse(im, "the weight expects %lld channels, the input has %lld", (long long)cin, (long long)x->dims[1]);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[1] = cout;
    for (int i = 0; i < x->rank - 2; i++) {
        const int j = 2 - (x->rank - 2) + i;
        dims[2 + i] = (x->dims[2 + i] + 2 * w.p[j] - w.d[j] * (w.k[j] - 1) - 1) / w.s[j] + 1;
        if (dims[2 + i] < 1) return refuse(im, "the kernel is larger than the padded input");
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
    member_weights(im, member, wt, b);
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "%s(%s)", member, xe);
    statement_end(im);
    free(member);
    return 0;
}

static int op_leaky(Imp *im)
{
    char fmt[128], a[64];
    util_format_double(a, sizeof a, attr_float(im->node, "alpha", 0.01));
    snprintf(fmt, sizeof fmt, "leaky_relu(%%s, negative_slope = %s)", a);
    return unary(im, fmt);
}

static int op_elu(Imp *im)
{
    char fmt[128], a[64];
    util_format_double(a, sizeof a, attr_float(im->node, "alpha", 1.0));
    snprintf(fmt, sizeof fmt, "elu(%%s, alpha = %s)", a);
    return unary(im, fmt);
}

static int op_selu(Imp *im)
{
    char fmt[200], a[64], g[64];
    util_format_double(a, sizeof a, attr_float(im->node, "alpha", 1.67326319217681884765625));
    util_format_double(g, sizeof g, attr_float(im->node, "gamma", 1.05070102214813232421875));
    snprintf(fmt, sizeof fmt, "%s * where(%%s > 0, %%s, %s * (exp(%%s) - 1))", g, a);
    return unary(im, fmt);
}

/* Pad: constant, reflect or edge, by concatenating pieces along each padded axis. */
static int op_pad(Imp *im)
{
    Val *x = operand(im, 0);
    if (!x) return refuse(im, "no input");
    int64_t pads[2 * MAX_RANK];
    const int np = im->m->opset < 11 ? attr_ints(im->node, "pads", pads, 2 * MAX_RANK) : const_ints(im, 1, pads, 2 * MAX_RANK);
    if (np != 2 * x->rank) return refuse(im, "its pads are not constants with two per axis");
    double value = attr_float(im->node, "value", 0.0);
    if (im->m->opset >= 11 && operand(im, 2)) {
        Val *c = operand(im, 2);
        if (!c->values || c->nvalues != 1) return refuse(im, "its constant value is not a constant");
        value = c->values[0];
    }
    const Onnx__AttributeProto *ma = attr(im->node, "mode");
    char mode[16] = "constant";
    if (ma && ma->has_s) snprintf(mode, sizeof mode, "%.*s", (int)ma->s.len, (const char *)ma->s.data);
    const bool reflect = !strcmp(mode, "reflect"), edge = !strcmp(mode, "edge");
    if (!reflect && !edge && strcmp(mode, "constant")) return refuse(im, "mode '%s' is not supported", mode);
    char num[64];
    util_format_double(num, sizeof num, value);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, use(im, 0));
    for (int a = 0; a < x->rank; a++) {
        const int64_t before = pads[a], after = pads[a + x->rank], n = dims[a];
        if (!before && !after) continue;
        if (before < 0 || after < 0) return sb_free(&e), refuse(im, "negative pads (cropping) are not supported yet");
        if (n == BATCH) return sb_free(&e), refuse(im, "it pads the batch axis");
        if (reflect && (before >= n || after >= n)) return sb_free(&e), refuse(im, "reflect pads of %lld on an axis of %lld", (long long)(before > after ? before : after), (long long)n);
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
                dims_text(&e, pd, x->rank);
                sb_puts(&e, ")");
            } else {
                sb_puts(&e, "full([");
                dims_text(&e, pd, x->rank);
                sb_printf(&e, "], %s%s)", num, strchr(num, '.') || strchr(num, 'e') || strchr(num, 'n') ? "" : ".0");
            }
            if (!side) sb_puts(&e, ", ");
        }
        sb_printf(&e, ", axis = %d)", a);
        free(cur);
        dims[a] = n + before + after;
    }
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_puts(&im->body, e.data);
    statement_end(im);
    sb_free(&e);
    return 0;
}

/* Split: the pieces, by `split` (attribute, input) or equal. */
static int op_split(Imp *im)
{
    Val *x = operand(im, 0);
    if (!x) return refuse(im, "no input");
    const int axis = norm_axis(attr_int(im->node, "axis", 0), x->rank);
    if (axis < 0 || axis >= x->rank) return refuse(im, "axis out of range");
    if (x->dims[axis] == BATCH) return refuse(im, "it splits the batch axis");
    const int n = (int)im->node->n_output;
    if (n < 1 || n > 16) return refuse(im, "%d outputs (at most 16)", n);
    int64_t sizes[16];
    int k = attr_ints(im->node, "split", sizes, 16);
    if (k < 0 && im->node->n_input > 1) k = const_ints(im, 1, sizes, 16);
    if (k < 0) {
        if (x->dims[axis] % n) return refuse(im, "axis %d's %lld does not split in %d", axis, (long long)x->dims[axis], n);
        for (int i = 0; i < n; i++) sizes[i] = x->dims[axis] / n;
        k = n;
    }
    int64_t total = 0;
    for (int i = 0; i < k; i++) total += sizes[i];
    if (k != n || total != x->dims[axis]) return refuse(im, "its sizes do not add up to the axis");
    const char *xe = use(im, 0);
    sb_puts(&im->body, "    ");
    for (int i = 0; i < n; i++) {
        int64_t dims[MAX_RANK];
        memcpy(dims, x->dims, sizeof dims);
        dims[axis] = sizes[i];
        Val *y = result(im, (size_t)i, x->rank, dims);
        sb_printf(&im->body, "%s%s", i ? ", " : "", y->expr);
    }
    sb_printf(&im->body, " = split(%s, [", xe);
    for (int i = 0; i < n; i++) sb_printf(&im->body, "%s%lld", i ? ", " : "", (long long)sizes[i]);
    sb_printf(&im->body, "], axis = %d)", axis);
    statement_end(im);
    return 0;
}

/* Slice: positive steps, each axis a slice. */
static int op_slice(Imp *im)
{
    Val *x = operand(im, 0);
    if (!x) return refuse(im, "no input");
    int64_t starts[MAX_RANK], ends[MAX_RANK], axes[MAX_RANK], steps[MAX_RANK];
    int n, na, ns;
    if (im->m->opset < 10) {
        n = attr_ints(im->node, "starts", starts, MAX_RANK);
        if (attr_ints(im->node, "ends", ends, MAX_RANK) != n) return refuse(im, "starts and ends differ in length");
        na = attr_ints(im->node, "axes", axes, MAX_RANK);
        ns = -1;
    } else {
        n = const_ints(im, 1, starts, MAX_RANK);
        if (const_ints(im, 2, ends, MAX_RANK) != n) return refuse(im, "its starts and ends are not constants of one length");
        na = operand(im, 3) ? const_ints(im, 3, axes, MAX_RANK) : -1;
        ns = operand(im, 4) ? const_ints(im, 4, steps, MAX_RANK) : -1;
        if ((operand(im, 3) && na < 0) || (operand(im, 4) && ns < 0)) return refuse(im, "its axes or steps are not constants");
    }
    if (n < 0) return refuse(im, "its starts are not constants");
    if (na < 0)
        for (int i = 0; i < n; i++) axes[i] = i;
    else if (na != n) return refuse(im, "axes and starts differ in length");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, use(im, 0));
    for (int i = 0; i < n; i++) {
        const int a = norm_axis(axes[i], x->rank);
        const int64_t step = ns < 0 ? 1 : steps[i];
        if (a < 0 || a >= x->rank) return sb_free(&e), refuse(im, "axis out of range");
        if (step <= 0) return sb_free(&e), refuse(im, "a step of %lld (Kiln slices forward)", (long long)step);
        const int64_t size = dims[a];
        if (size == BATCH) return sb_free(&e), refuse(im, "it slices the batch axis");
        int64_t s = starts[i] < 0 ? starts[i] + size : starts[i], t = ends[i] < 0 ? ends[i] + size : ends[i];
        s = s < 0 ? 0 : s > size ? size : s;
        t = t < 0 ? 0 : t > size ? size : t;
        if (t <= s) return sb_free(&e), refuse(im, "an empty slice of axis %d", a);
        char *cur = sb_take(&e);
        sb_printf(&e, "slice(%s, %d, start = %lld, end = %lld, step = %lld)", cur, a, (long long)s, (long long)t, (long long)step);
        free(cur);
        dims[a] = (t - s + step - 1) / step;
    }
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_puts(&im->body, e.data);
    statement_end(im);
    sb_free(&e);
    return 0;
}

/* Tile: each repeated axis a concatenation of copies. */
static int op_tile(Imp *im)
{
    Val *x = operand(im, 0);
    int64_t reps[MAX_RANK];
    if (!x || const_ints(im, 1, reps, MAX_RANK) != x->rank) return refuse(im, "its repeats are not constants, one per axis");
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    StrBuf e;
    sb_init(&e);
    sb_puts(&e, use(im, 0));
    for (int a = 0; a < x->rank; a++) {
        if (reps[a] == 1) continue;
        if (reps[a] < 1 || reps[a] > 16) return sb_free(&e), refuse(im, "a repeat of %lld (1 to 16)", (long long)reps[a]);
        if (dims[a] == BATCH) return sb_free(&e), refuse(im, "it repeats the batch axis");
        char *cur = sb_take(&e);
        sb_puts(&e, "concat(");
        for (int64_t r = 0; r < reps[a]; r++) sb_printf(&e, "%s%s", r ? ", " : "", cur);
        sb_printf(&e, ", axis = %d)", a);
        free(cur);
        dims[a] *= reps[a];
    }
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_puts(&im->body, e.data);
    statement_end(im);
    sb_free(&e);
    return 0;
}

/* Gather: rows of a matrix by an index tensor (an embedding), or one constant index. */
static int op_gather(Imp *im)
{
    Val *x = operand(im, 0), *idx = operand(im, 1);
    if (!x || !idx) return refuse(im, "needs two inputs");
    const int axis = norm_axis(attr_int(im->node, "axis", 0), x->rank);
    if (axis < 0 || axis >= x->rank) return refuse(im, "axis out of range");
    int64_t dims[MAX_RANK];
    if (idx->values && idx->rank == 0) { /* one index: a slice, the axis dropped */
        if (x->dims[axis] == BATCH) return refuse(im, "it indexes the batch axis");
        int64_t k = (int64_t)idx->values[0];
        k = k < 0 ? k + x->dims[axis] : k;
        if (k < 0 || k >= x->dims[axis]) return refuse(im, "index %lld out of range", (long long)k);
        int r = 0;
        for (int a = 0; a < x->rank; a++)
            if (a != axis) dims[r++] = x->dims[a];
        const char *xe = use(im, 0);
        Val *y = result(im, 0, r, dims);
        statement_start(im, y);
        sb_printf(&im->body, "reshape(slice(%s, %d, start = %lld, end = %lld), ", xe, axis, (long long)k, (long long)k + 1);
        dims_text(&im->body, dims, r);
        sb_puts(&im->body, ")");
        statement_end(im);
        return 0;
    }
    if (x->rank != 2 || axis != 0 || idx->values || idx->rank + 1 > MAX_RANK)
        return refuse(im, "only rows of a matrix by an index tensor (an embedding) or one constant index are supported");
    for (int a = 0; a < idx->rank; a++) dims[a] = idx->dims[a];
    dims[idx->rank] = x->dims[1];
    const char *xe = use(im, 0);
    char *ie = xstrdup(use(im, 1));
    Val *y = result(im, 0, idx->rank + 1, dims);
    statement_start(im, y);
    sb_printf(&im->body, "reshape(gather(%s, 0, expand(reshape(i64(%s), -1, 1), -1, %lld)), ", xe, ie, (long long)x->dims[1]);
    dims_text(&im->body, dims, idx->rank + 1);
    sb_puts(&im->body, ")");
    statement_end(im);
    free(ie);
    return 0;
}

static int op_instance_norm(Imp *im)
{
    Val *x = operand(im, 0);
    if (!x || x->rank < 3 || !operand(im, 1) || !operand(im, 2)) return refuse(im, "needs an input with spatial axes, a scale and a bias");
    char eps[64];
    util_format_double(eps, sizeof eps, attr_float(im->node, "epsilon", 1e-5));
    StrBuf axes, cd;
    sb_init(&axes);
    sb_init(&cd);
    for (int a = 2; a < x->rank; a++) sb_printf(&axes, "%s%d", a > 2 ? ", " : "", a);
    sb_printf(&cd, "%lld", (long long)x->dims[1]);
    for (int a = 2; a < x->rank; a++) sb_puts(&cd, ", 1");
    const char *xe = use(im, 0);
    char *s = xstrdup(use(im, 1)), *b = xstrdup(use(im, 2));
    Val *y = result(im, 0, x->rank, x->dims);
    statement_start(im, y);
    sb_printf(&im->body, "(%s - mean(%s, axis = [%s], keepdim = true)) / sqrt(var(%s, axis = [%s], keepdim = true, unbiased = false) + %s) * reshape(%s, %s) + reshape(%s, %s)",
              xe, xe, axes.data, xe, axes.data, eps, s, cd.data, b, cd.data);
    statement_end(im);
    free(s), free(b);
    sb_free(&axes);
    sb_free(&cd);
    return 0;
}

/* ConvTranspose, 2-D, one group: a ConvTranspose2d member whose weight and bias are the
 * initializers. */
static int op_conv_transpose(Imp *im)
{
    Val *x = operand(im, 0), *wt = operand(im, 1), *b = operand(im, 2);
    if (!x || x->rank != 4) return refuse(im, "only 2-D transposed convolutions are supported");
    if (!wt || !wt->init || wt->rank != 4) return refuse(im, "its weight is not an initializer of the input's rank");
    if (b && !b->init) return refuse(im, "its bias is not an initializer");
    if (attr_int(im->node, "group", 1) != 1) return refuse(im, "groups other than 1 are not supported");
    if (attr(im->node, "output_shape")) return refuse(im, "output_shape is not supported (pads and output_padding are)");
    Window w;
    if (window(im, x, wt->dims + 2, &w)) return -1;
    int64_t op[2] = {0, 0};
    attr_ints(im->node, "output_padding", op, 2);
    if (x->dims[1] != wt->dims[0]) return refuse(im, "the weight expects %lld channels, the input has %lld", (long long)wt->dims[0], (long long)x->dims[1]);
    int64_t dims[MAX_RANK];
    memcpy(dims, x->dims, sizeof dims);
    dims[1] = wt->dims[1];
    for (int i = 0; i < 2; i++) {
        dims[2 + i] = (x->dims[2 + i] - 1) * w.s[i] - 2 * w.p[i] + w.d[i] * (w.k[i] - 1) + op[i] + 1;
        if (dims[2 + i] < 1) return refuse(im, "the output would be empty");
    }
    char *member = layer_member(im, wt, b, "deconv_");
    sb_printf(&im->members,
              "%s = ConvTranspose2d(%lld, %lld, [%lld, %lld], stride = [%lld, %lld], padding = [%lld, %lld], output_padding = [%lld, %lld], "
              "dilation = [%lld, %lld], bias = %s)  # weight '%s'%s%s%s\n",
              member, (long long)wt->dims[0], (long long)wt->dims[1], (long long)w.k[0], (long long)w.k[1], (long long)w.s[0], (long long)w.s[1],
              (long long)w.p[0], (long long)w.p[1], (long long)op[0], (long long)op[1], (long long)w.d[0], (long long)w.d[1], b ? "true" : "false",
              wt->source, b ? ", bias '" : "", b ? b->source : "", b ? "'" : "");
    member_weights(im, member, wt, b);
    const char *xe = use(im, 0);
    Val *y = result(im, 0, x->rank, dims);
    statement_start(im, y);
    sb_printf(&im->body, "%s(%s)", member, xe);
    statement_end(im);
    free(member);
    return 0;
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
    const int64_t to = attr_int(im->node, "to", -1);
    for (size_t i = 0; i < sizeof casts / sizeof *casts; i++)
        if (casts[i].type == to) return unary(im, casts[i].fmt);
    return refuse(im, "a cast to %s", onnx_type_name((int32_t)to));
}

/* One node: its operator's writer, or the error that Kiln has none. */
static int import_node(Imp *im)
{
    const char *op = im->node->op_type;
    static const struct {
        const char *op, *fmt;
    } unaries[] = {{"Relu", "relu(%s)"}, {"Sigmoid", "sigmoid(%s)"}, {"Tanh", "tanh(%s)"}, {"Exp", "exp(%s)"}, {"Log", "log(%s)"},
                   {"Sqrt", "sqrt(%s)"}, {"Abs", "abs(%s)"}, {"Neg", "-%s"}, {"Erf", "erf(%s)"}, {"Reciprocal", "1.0 / %s"},
                   {"Softsign", "%s / (1.0 + abs(%s))"}, {"Softplus", "softplus(%s)"}, {"Identity", "%s"}, {"Floor", "%s // 1.0"}};
    for (size_t i = 0; i < sizeof unaries / sizeof *unaries; i++)
        if (!strcmp(op, unaries[i].op)) return unary(im, unaries[i].fmt);
    static const struct {
        const char *op, *sym;
    } binaries[] = {{"Add", "+"}, {"Sub", "-"}, {"Mul", "*"}, {"Div", "/"}, {"Pow", "(pow(%s, %s))"}};
    for (size_t i = 0; i < sizeof binaries / sizeof *binaries; i++)
        if (!strcmp(op, binaries[i].op)) return binary(im, binaries[i].sym);
    if (!strcmp(op, "Dropout")) {
        if (im->node->n_output > 1 && im->node->output[1][0]) return refuse(im, "its mask output is not supported");
        return unary(im, "%s");
    }
    if (!strcmp(op, "Sum")) return variadic(im, NULL);
    if (!strcmp(op, "Max")) return variadic(im, "maximum");
    if (!strcmp(op, "Min")) return variadic(im, "minimum");
    if (!strcmp(op, "Clip")) return op_clip(im);
    if (!strcmp(op, "Cast")) return op_cast(im);
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
    return refuse(im, "operator %s is not supported by kiln import yet", op);
}

/* ---- the graph ---- */

static int declare_inputs(Imp *im, StrBuf *sig)
{
    const Onnx__GraphProto *g = im->m->graph;
    bool any = false;
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *in = g->input[i];
        if (strmap_get(&im->m->initializer, in->name, -1) >= 0) continue;
        const Onnx__TypeProto *t = in->type;
        if (!t || !t->tensor_type || !t->tensor_type->shape)
            return refuse(im, "graph input '%s' is not a tensor of known rank", in->name);
        const Onnx__TypeProto__Tensor *tt = t->tensor_type;
        static const struct {
            int32_t type;
            const char *kiln;
        } types[] = {{ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, "f32"}, {ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE, "f64"},
                     {ONNX__TENSOR_PROTO__DATA_TYPE__INT64, "i64"}, {ONNX__TENSOR_PROTO__DATA_TYPE__INT32, "i32"},
                     {ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, "bool"}, {ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, "u8"}};
        const char *kt = NULL;
        for (size_t k = 0; k < sizeof types / sizeof *types; k++)
            if (types[k].type == tt->elem_type) kt = types[k].kiln;
        if (!kt) return refuse(im, "graph input '%s' is %s, which Kiln does not read", in->name, onnx_type_name(tt->elem_type));
        if (tt->shape->n_dim > MAX_RANK) return refuse(im, "graph input '%s' has rank %zu (at most %d)", in->name, tt->shape->n_dim, MAX_RANK);
        Val *v = add_val(im, in->name);
        v->expr = identifier(im, "", in->name[0] && isalpha((unsigned char)in->name[0]) ? in->name : "input");
        v->rank = (int)tt->shape->n_dim;
        for (int a = 0; a < v->rank; a++) {
            const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[a];
            if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && d->dim_value > 0) v->dims[a] = d->dim_value;
            else if (a == 0) v->dims[a] = BATCH;
            else return refuse(im, "graph input '%s': axis %d's size is symbolic (only axis 0, the batch, may be)", in->name, a);
        }
        /* every input sample by sample: axis 0 the first input's */
        const Val *first = &im->v[0];
        if (!v->rank || (any && v->dims[0] != first->dims[0]))
            return refuse(im, "graph input '%s' does not have axis 0 of the first input (%lld) as its axis 0: Kiln's inference programs read every input sample by sample",
                          in->name, (long long)(first->dims[0] == BATCH ? -1 : first->dims[0]));
        sb_printf(sig, "%s%s: %s[", any ? ", " : "", v->expr, kt);
        dims_text(sig, v->dims, v->rank);
        sb_puts(sig, "]");
        any = true;
    }
    if (!any) return refuse(im, "the graph has no inputs besides its initializers");
    return 0;
}

static void declare_initializers(Imp *im)
{
    const Onnx__GraphProto *g = im->m->graph;
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        Val *v = add_val(im, t->name);
        v->init = t;
        v->source = t->name;
        v->expr = identifier(im, "p_", t->name);
        v->rank = (int)t->n_dims;
        for (size_t a = 0; a < t->n_dims && a < MAX_RANK; a++) v->dims[a] = t->dims[a];
        v->values = onnx_tensor_values(t);
        v->nvalues = onnx_numel(t->dims, t->n_dims);
        if (!v->values) { /* empty: nothing to read */
            v->values = xcalloc(1, sizeof *v->values);
            v->nvalues = 0;
        }
    }
}

int onnx_import(const OnnxModel *m, const OnnxImportOptions *o, StrBuf *out, OnnxWeights *w, StrBuf *err)
{
    Imp im;
    memset(&im, 0, sizeof im);
    im.m = m, im.path = o->source, im.out = out, im.err = err, im.w = w;
    memset(w, 0, sizeof *w);
    sb_init(&im.members);
    sb_init(&im.body);
    StrBuf sig;
    sb_init(&sig);
    int rc = declare_inputs(&im, &sig);
    if (!rc) declare_initializers(&im);
    for (size_t k = 0; !rc && k < m->graph->n_node; k++) {
        im.node = m->graph->node[m->order[k]];
        free(im.node_label);
        StrBuf l;
        sb_init(&l);
        sb_printf(&l, "node '%s' (%s)", im.node->name && im.node->name[0] ? im.node->name : "(unnamed)", im.node->op_type);
        im.node_label = sb_take(&l);
        if (im.node->domain && im.node->domain[0] && strcmp(im.node->domain, "ai.onnx")) {
            rc = refuse(&im, "operator domain '%s' (Kiln reads the default ONNX domain)", im.node->domain);
            break;
        }
        rc = import_node(&im);
    }
    /* the outputs: each with the batch axis first, as an inference program writes them */
    StrBuf outs;
    sb_init(&outs);
    for (size_t i = 0; !rc && i < m->graph->n_output; i++) {
        free(im.node_label);
        im.node_label = NULL;
        Val *v = val(&im, m->graph->output[i]->name);
        if (!v || v->values) {
            rc = refuse(&im, "graph output '%s' is a constant (Kiln's outputs are computed from the inputs)", m->graph->output[i]->name);
            break;
        }
        if (!v->rank || v->dims[0] != im.v[0].dims[0]) {
            rc = refuse(&im, "graph output '%s' does not have the batch (axis 0 of the inputs) as its axis 0: Kiln's inference programs write "
                             "outputs sample by sample",
                        m->graph->output[i]->name);
            break;
        }
        sb_printf(&outs, "%s%s", i ? ", " : "", v->expr);
    }
    if (!rc) {
        sb_printf(out,
                  "# %s — imported by kiln import from %s (ONNX IR version %lld, opset %lld%s%s).\n"
                  "# One statement per ONNX node, its name and operator in the comment; the initializers are\n"
                  "# the parameters p_NAME (their ONNX names beside them), in the .safetensors beside this file.\n"
                  "model %s\n\n",
                  o->name, o->source, (long long)m->proto->ir_version, (long long)m->opset, m->proto->producer_name && m->proto->producer_name[0] ? ", from " : "",
                  m->proto->producer_name ? m->proto->producer_name : "", o->name);
        emit_holders(&im, out);
        if (im.members.len) sb_printf(out, "%s\n", im.members.data);
        sb_printf(out, "forward(%s) -> %s {\n%s}\n\n", sig.data, outs.data, im.body.data ? im.body.data : "");
        const Val *first = val(&im, m->graph->output[0]->name);
        sb_printf(out, "# kiln build needs a loss: this one only lets an inference program build; replace it\n"
                       "# (and add a train section) to train the model.\n"
                       "loss(%s) = mean(f32(%s))\n",
                  first->expr, first->expr);
    }
    /* the weights keep the values; the table lets go of the rest */
    for (int32_t i = 0; i < im.nv; i++) {
        free(im.v[i].expr);
        bool kept = false;
        for (int32_t k = 0; k < w->n; k++) kept |= w->t[k].values == im.v[i].values;
        if (!kept) free(im.v[i].values);
    }
    free(im.v);
    for (int32_t i = 0; i < im.nheld; i++) free(im.held[i].path), free(im.held[i].decl);
    free(im.held);
    strmap_free(&im.holder);
    free(im.node_label);
    strmap_free(&im.names);
    strmap_free(&im.vals);
    sb_free(&im.members);
    sb_free(&im.body);
    sb_free(&sig);
    sb_free(&outs);
    if (rc) onnx_weights_free(w);
    return rc;
}

void onnx_weights_free(OnnxWeights *w)
{
    for (int32_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].values);
    }
    free(w->t);
    memset(w, 0, sizeof *w);
}
