/* tensorops.c — einsum and interpolation (Upsample, interpolate) as expansions into
 * primitive IR ops. einsum is a broadcast product of its operands, each permuted to one
 * axis order, summed over the letters that are not in the output: general and differentiable,
 * but it materialises the whole product (use @ for large matrix products). Interpolation is
 * a product with a [out, in] matrix per spatial axis, built from iota like PyTorch's index
 * arithmetic (nearest, or bilinear with or without align_corners). Each function returns
 * IR_NONE when the builder rejects a step (its message is in b->err). */
#include "internal.h"

#include <math.h>
#include <string.h>

#define TRY(x)                              \
    do {                                    \
        if ((x) == IR_NONE) return IR_NONE; \
    } while (0)

static DType dtype_of(IrBuilder *b, NodeId x) { return (DType)b->g->nodes[x].dtype; }

static NodeId fail(IrBuilder *b, const char *msg)
{
    if (b->err) sb_puts(b->err, msg);
    return IR_NONE;
}

NodeId comp_einsum(IrBuilder *b, const char *eq, const NodeId *xs, int n)
{
    char ins[8][IR_MAX_RANK + 1], out[IR_MAX_RANK + 1];
    int nin = 0;
    const char *arrow = strstr(eq, "->");
    char clean[128];
    size_t k = 0;
    for (const char *p = eq; *p && k + 1 < sizeof clean; p++)
        if (*p != ' ') clean[k++] = *p;
    clean[k] = 0;
    if (strstr(clean, "...")) return fail(b, "einsum: '...' (broadcast dimensions) is not supported; name every axis");
    /* the operands' subscripts */
    const char *p = clean;
    for (;;) {
        size_t len = strcspn(p, ",-");
        if (nin >= 8 || len > IR_MAX_RANK) return fail(b, "einsum: at most 8 operands of rank at most 8");
        memcpy(ins[nin], p, len);
        ins[nin++][len] = 0;
        p += len;
        if (*p != ',') break;
        p++;
    }
    if (nin != n) {
        if (b->err) sb_printf(b->err, "einsum: the equation names %d operand%s, found %d", nin, nin == 1 ? "" : "s", n);
        return IR_NONE;
    }
    /* every letter once, its size */
    char letters[27];
    Dim sizes[26];
    int nl = 0;
    for (int i = 0; i < n; i++) {
        const Shape *s = &b->g->nodes[xs[i]].shape;
        if ((int)strlen(ins[i]) != s->rank) {
            if (b->err) sb_printf(b->err, "einsum: operand %d has rank %d but '%s' names %d axes", i, s->rank, ins[i], (int)strlen(ins[i]));
            return IR_NONE;
        }
        for (int a = 0; ins[i][a]; a++) {
            char c = ins[i][a];
            if (c < 'a' || c > 'z') return fail(b, "einsum: subscripts are lower-case letters a to z");
            if (strchr(ins[i] + a + 1, c)) return fail(b, "einsum: a letter repeated in one operand (a diagonal) is not supported");
            char *f = memchr(letters, c, (size_t)nl);
            if (!f) {
                letters[nl] = c;
                sizes[nl++] = s->d[a];
            } else if (!ir_dim_eq(sizes[f - letters], s->d[a])) {
                if (b->err) sb_printf(b->err, "einsum: the sizes of '%c' differ between the operands", c);
                return IR_NONE;
            }
        }
    }
    letters[nl] = 0;
    if (arrow) {
        const char *o = strstr(clean, "->") + 2;
        if (strlen(o) > IR_MAX_RANK) return fail(b, "einsum: an output of rank at most 8");
        strcpy(out, o);
        for (int a = 0; out[a]; a++)
            if (!memchr(letters, out[a], (size_t)nl) || strchr(out + a + 1, out[a])) {
                if (b->err) sb_printf(b->err, "einsum: output letter '%c' is not an operand's, or repeated", out[a]);
                return IR_NONE;
            }
    } else { /* implicit: the letters that appear once, in alphabetical order */
        int m = 0;
        for (char c = 'a'; c <= 'z'; c++) {
            int count = 0;
            for (int i = 0; i < n; i++) count += strchr(ins[i], c) != NULL;
            if (count == 1 && m < IR_MAX_RANK) out[m++] = c;
        }
        out[m] = 0;
    }
    /* canonical order: the output's letters, then the summed ones */
    char order[27];
    int no = (int)strlen(out);
    strcpy(order, out);
    for (int i = 0; i < nl; i++)
        if (!strchr(out, letters[i])) order[no++] = letters[i];
    order[no] = 0;
    if (no > IR_MAX_RANK) return fail(b, "einsum: at most 8 distinct letters");
    NodeId prod = IR_NONE;
    for (int i = 0; i < n; i++) {
        NodeId x = xs[i];
        if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
        TRY(x);
        /* permute the operand's axes into canonical order, then give it every letter */
        int perm[IR_MAX_RANK], r = 0;
        for (int c = 0; c < no; c++) {
            const char *f = strchr(ins[i], order[c]);
            if (f) perm[r++] = (int)(f - ins[i]);
        }
        bool ident = true;
        for (int a = 0; a < r; a++) ident = ident && perm[a] == a;
        if (!ident) x = ir_b_permute(b, x, perm);
        TRY(x);
        Shape full = ir_shape_make(no, NULL);
        for (int c = 0; c < no; c++) {
            const char *f = strchr(ins[i], order[c]);
            full.d[c] = f ? sizes[(char *)memchr(letters, order[c], (size_t)nl) - letters] : ir_dim_const(1);
        }
        x = ir_b_reshape(b, x, &full);
        TRY(x);
        prod = prod == IR_NONE ? x : ir_b_binary(b, OP_MUL, prod, x);
        TRY(prod);
    }
    int nout = (int)strlen(out);
    if (no == nout) {
        /* nothing summed: a size-1 axis of a missing letter was filled by broadcasting */
        Shape s = ir_shape_make(no, NULL);
        for (int c = 0; c < no; c++) s.d[c] = sizes[(char *)memchr(letters, order[c], (size_t)nl) - letters];
        return ir_shape_eq(&b->g->nodes[prod].shape, &s) ? prod : ir_b_expand(b, prod, &s);
    }
    uint64_t axes = 0;
    for (int c = nout; c < no; c++) axes |= UINT64_C(1) << c;
    return ir_b_reduce(b, OP_REDUCE_SUM, prod, axes, false);
}

/* The [out, in] interpolation matrix of one axis: nearest (src = floor(i * in / out)), or
 * linear, PyTorch's half-pixel src = max((i + 0.5) in / out - 0.5, 0) or, with
 * align_corners, src = i (in - 1) / (out - 1); weights 1 - l and l at floor(src) and
 * the next index (the last one repeated at the edge). */
static NodeId interp_matrix(IrBuilder *b, int64_t in, int64_t out, bool linear, bool align, DType t)
{
    Dim d[2] = {ir_dim_const(out), ir_dim_const(in)};
    Shape m = ir_shape_make(2, d);
    NodeId i = ir_b_iota(b, &m, 0, t);
    NodeId j = i == IR_NONE ? IR_NONE : ir_b_iota(b, &m, 1, t);
    TRY(j);
    double scale = (double)in / (double)out;
    NodeId src;
    if (!linear) src = comp_scalar_op(b, OP_MUL, i, scale, false);
    else if (align) src = comp_scalar_op(b, OP_MUL, i, out > 1 ? (double)(in - 1) / (double)(out - 1) : 0.0, false);
    else {
        src = comp_scalar_op(b, OP_SUB, comp_scalar_op(b, OP_MUL, comp_scalar_op(b, OP_ADD, i, 0.5, false), scale, false), 0.5, false);
        src = src == IR_NONE ? IR_NONE : comp_scalar_op(b, OP_MAX, src, 0.0, false);
    }
    TRY(src);
    NodeId i0 = ir_b_unary(b, OP_FLOOR, src);
    TRY(i0);
    i0 = comp_scalar_op(b, OP_MIN, i0, (double)(in - 1), false);
    TRY(i0);
    NodeId at0 = ir_b_binary(b, OP_EQ, j, i0);
    TRY(at0);
    if (!linear) return ir_b_cast(b, at0, t);
    NodeId i1 = comp_scalar_op(b, OP_MIN, comp_scalar_op(b, OP_ADD, i0, 1.0, false), (double)(in - 1), false);
    NodeId l = ir_b_binary(b, OP_SUB, src, i0);
    TRY(i1);
    TRY(l);
    NodeId at1 = ir_b_binary(b, OP_EQ, j, i1);
    NodeId w0 = ir_b_binary(b, OP_MUL, ir_b_cast(b, at0, t), comp_scalar_op(b, OP_SUB, l, 1.0, true));
    NodeId w1 = at1 == IR_NONE ? IR_NONE : ir_b_binary(b, OP_MUL, ir_b_cast(b, at1, t), l);
    TRY(w0);
    TRY(w1);
    return ir_b_binary(b, OP_ADD, w0, w1);
}

/* x[N, C, H, W] to [N, C, oh, ow]: Mh @ x @ Mw^T */
NodeId comp_interpolate(IrBuilder *b, NodeId x, int64_t oh, int64_t ow, bool bilinear, bool align)
{
    if (!ir_dtype_is_float(dtype_of(b, x))) x = ir_b_cast(b, x, DT_F32);
    TRY(x);
    Shape xs = b->g->nodes[x].shape;
    if (xs.rank != 4 || !ir_dim_is_const(xs.d[2]) || !ir_dim_is_const(xs.d[3]))
        return fail(b, "interpolate: expected [N, C, H, W] with a fixed height and width");
    NodeId mh = interp_matrix(b, xs.d[2].k, oh, bilinear, align, dtype_of(b, x));
    TRY(mh);
    NodeId mw = interp_matrix(b, xs.d[3].k, ow, bilinear, align, dtype_of(b, x));
    TRY(mw);
    NodeId y = ir_b_matmul(b, mh, x);
    TRY(y);
    NodeId mwt = ir_b_transpose(b, mw, 0, 1);
    TRY(mwt);
    return ir_b_matmul(b, y, mwt);
}
