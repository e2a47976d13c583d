/* kernel.c — the kernel-body generator that the C and CUDA targets share (kernel.h).
 *
 * A loop kernel (passes/fusion.c) iterates over its shape S. Full members are values at
 * one element (locals t<id>), row members values at one row (w<id>: S reduced over the
 * kernel's axes), totals sums over all rows (tot<id>). Per row, each reduction stage is one
 * pass over the row's elements that recomputes the full values it needs, then the row
 * values that depend on it are computed; a last pass writes the full values other kernels
 * read. This file decides all of that, and prints each member's scalar statement; the
 * targets print the iteration around the statements. */
#include "kernel.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *cg_ctype(DType t)
{
    switch (t) {
    case DT_BOOL: return "uint8_t";
    case DT_U8: return "uint8_t";
    case DT_I32: return "int32_t";
    case DT_I64: return "int64_t";
    case DT_F16: return "uint16_t"; /* IEEE binary16 bits: kiln_half.h */
    case DT_BF16: return "uint16_t"; /* the top half of a float: kiln_half.h */
    case DT_F32: return "float";
    case DT_F64: return "double";
    default: return NULL;
    }
}

/* Half-precision values are stored as 16 bits and computed as floats (kiln_half.h). */
static bool is_half(DType t) { return t == DT_F16 || t == DT_BF16; }

DType cg_compute_dtype(DType t) { return is_half(t) ? DT_F32 : t; }

const char *cg_value_ctype(DType t) { return cg_ctype(cg_compute_dtype(t)); }

void cg_load(StrBuf *b, DType t, const char *stored)
{
    if (t == DT_BF16) sb_printf(b, "kiln_bf16_to_f32(%s)", stored);
    else if (t == DT_F16) sb_printf(b, "kiln_f16_to_f32(%s)", stored);
    else sb_puts(b, stored);
}

void cg_store(StrBuf *b, DType t, const char *value)
{
    if (t == DT_BF16) sb_printf(b, "kiln_f32_to_bf16(%s)", value); /* exact: the value is rounded already */
    else if (t == DT_F16) sb_printf(b, "kiln_f32_to_f16(%s)", value);
    else sb_puts(b, value);
}

void cg_store_local(StrBuf *b, const Graph *g, NodeId id, const char *fmt)
{
    char local[32];
    snprintf(local, sizeof local, fmt, id);
    cg_store(b, (DType)g->nodes[id].dtype, local);
}

void cg_store_line(StrBuf *o, const char *indent, const Graph *g, NodeId id, const char *at, const char *fmt)
{
    sb_printf(o, "%sy%d[%s] = ", indent, id, at);
    cg_store_local(o, g, id, fmt);
    sb_puts(o, ";\n");
}

/* A C expression for a dim, using the symbols' names (declared in each kernel). */
void cg_dim(StrBuf *b, const Graph *g, Dim d)
{
    if (d.nsym == 0) {
        sb_printf(b, "%lld", (long long)d.k);
        return;
    }
    if (d.k != 1) sb_printf(b, "%lld * ", (long long)d.k);
    for (int i = 0; i < d.nsym; i++) sb_printf(b, "%s%s", i ? " * " : "", g->syms[d.sym[i]].name);
}

/* Whether node id is a finite number (finite, and nonzero with nonzero) on every element,
 * as far as constants, coordinates and integers show it; false when unknown. */
static bool finite_value(const Graph *g, NodeId id, bool nonzero, int depth)
{
    const Node *n = &g->nodes[id];
    if (depth > 32) return false;
    switch ((Op)n->op) {
    case OP_CONST: {
        double v = n->fattr[0], big = n->dtype == DT_F32 || n->dtype == DT_F64 ? 3.4e38 : 65504;
        return !isnan(v) && fabs(v) <= big && (!nonzero || v != 0);
    }
    case OP_IOTA: return !nonzero && (n->dtype == DT_F32 || n->dtype == DT_F64 || !ir_dtype_is_float((DType)n->dtype));
    case OP_EXPAND: case OP_RESHAPE: return finite_value(g, ir_input(g, id, 0), nonzero, depth + 1);
    default: return false;
    }
}

/* Whether node id can never be NaN (an integer, or a float built from non-NaN values by
 * operations that make no NaN of them), as far as a look at its operands shows; false
 * when unknown. A maximum over such a value needs no NaN flag beside it, which costs the
 * loop its vectorization (the negated positions of autodiff's first-maximum rule). */
bool cg_never_nan(const Graph *g, NodeId id, int depth)
{
    const Node *n = &g->nodes[id];
    if (!ir_dtype_is_float((DType)n->dtype)) return true;
    if (depth > 32) return false;
    NodeId a = n->ninputs > 0 ? ir_input(g, id, 0) : IR_NONE, b = n->ninputs > 1 ? ir_input(g, id, 1) : IR_NONE;
    switch ((Op)n->op) {
    case OP_CONST: return !isnan(n->fattr[0]);
    case OP_IOTA: return true;
    case OP_EXPAND: case OP_RESHAPE: case OP_NEG: return cg_never_nan(g, a, depth + 1);
    case OP_CAST: return !ir_dtype_is_float((DType)g->nodes[a].dtype);
    case OP_WHERE: return cg_never_nan(g, b, depth + 1) && cg_never_nan(g, ir_input(g, id, 2), depth + 1);
    case OP_ADD: case OP_SUB: /* inf - inf is the only NaN of two non-NaN values */
        return (cg_never_nan(g, a, depth + 1) && finite_value(g, b, false, depth + 1)) ||
               (finite_value(g, a, false, depth + 1) && cg_never_nan(g, b, depth + 1));
    case OP_MUL: /* and 0 * inf */
        return (cg_never_nan(g, a, depth + 1) && finite_value(g, b, true, depth + 1)) ||
               (finite_value(g, a, true, depth + 1) && cg_never_nan(g, b, depth + 1));
    default: return false;
    }
}

void cg_literal(StrBuf *b, double v, DType t)
{
    if (ir_dtype_is_float(t)) {
        if (isnan(v)) sb_puts(b, "NAN");
        else if (isinf(v)) sb_puts(b, v < 0 ? "-INFINITY" : "INFINITY");
        else {
            char buf[64];
            util_format_double(buf, sizeof buf, v);
            sb_printf(b, "%s%s", buf, t == DT_F32 || is_half(t) ? "f" : "");
        }
    } else {
        sb_printf(b, "(%s)%lld", cg_ctype(t), (long long)v);
    }
}



static const char *fsuffix(DType t) { return t == DT_F32 ? "f" : ""; }

/* The expression of an elementwise op on operand expressions a, b, w (where). */
void cg_elementwise_expr(Cg *c, NodeId id, const char *a, const char *b, const char *w)
{
    const Node *n = N(c, id);
    DType in = cg_compute_dtype((DType)N(c, ir_input(c->g, id, 0))->dtype);
    const char *f = fsuffix(in);
    bool fl = ir_dtype_is_float(in);
    /* kiln_math.h's vectorisable functions are host code: CUDA has its own expf, tanhf */
    bool cuda = c->target == CG_TARGET_CUDA;
    StrBuf *o = c->o;
    switch ((Op)n->op) {
    case OP_NEG: sb_printf(o, "-%s", a); break;
    case OP_ABS:
        if (fl) sb_printf(o, "fabs%s(%s)", f, a);
        else sb_printf(o, "(%s < 0 ? -%s : %s)", a, a, a);
        break;
    case OP_SIGN: sb_printf(o, "(%s > 0) - (%s < 0)", a, a); break;
    case OP_EXP:
        if (in == DT_F32) sb_printf(o, "%s(%s)", cuda ? "expf" : "kiln_expf", a); /* vectorises: kiln_math.h */
        else sb_printf(o, "exp(%s)", a);
        break;
    case OP_LOG: sb_printf(o, "log%s(%s)", f, a); break;
    case OP_SQRT: sb_printf(o, "sqrt%s(%s)", f, a); break;
    case OP_TANH:
        if (in == DT_F32) sb_printf(o, "%s(%s)", cuda ? "tanhf" : "kiln_tanhf", a);
        else sb_printf(o, "tanh(%s)", a);
        break;
    case OP_SIGMOID: {
        const char *e = in == DT_F32 ? (cuda ? "expf" : "kiln_expf") : "exp";
        sb_printf(o, "%s >= 0 ? 1 / (1 + %s(-%s)) : %s(%s) / (1 + %s(%s))", a, e, a, e, a, e, a);
        break;
    }
    case OP_RELU: /* NaN propagates, as in PyTorch */
        if (fl) sb_printf(o, "%s > 0 || %s != %s ? %s : 0", a, a, a, a);
        else sb_printf(o, "%s > 0 ? %s : 0", a, a);
        break;
    case OP_ERF: sb_printf(o, "erf%s(%s)", f, a); break; /* C99 <math.h> and CUDA: erff, erf */
    case OP_SIN: sb_printf(o, "sin%s(%s)", f, a); break;
    case OP_COS: sb_printf(o, "cos%s(%s)", f, a); break;
    case OP_FLOOR: sb_printf(o, "floor%s(%s)", f, a); break;
    case OP_NOT: sb_printf(o, "!%s", a); break;
    case OP_DETACH: sb_puts(o, a); break;
    case OP_CAST:
        if (n->dtype == DT_BOOL) sb_printf(o, "%s != 0", a);
        else if (n->dtype == DT_BF16) sb_printf(o, "kiln_bf16_round(%s)", a);
        else if (n->dtype == DT_F16) sb_printf(o, "kiln_f16_round(%s)", a);
        else sb_printf(o, "(%s)%s", cg_ctype((DType)n->dtype), a);
        break;
    case OP_ADD: sb_printf(o, "%s + %s", a, b); break;
    case OP_SUB: sb_printf(o, "%s - %s", a, b); break;
    case OP_MUL: sb_printf(o, "%s * %s", a, b); break;
    case OP_DIV: sb_printf(o, "%s / %s", a, b); break;
    case OP_MAX:
    case OP_MIN: {
        const char *cmp = n->op == OP_MAX ? ">" : "<";
        if (fl) sb_printf(o, "%s %s %s || %s != %s ? %s : %s", a, cmp, b, a, a, a, b); /* NaN wins */
        else sb_printf(o, "%s %s %s ? %s : %s", a, cmp, b, a, b);
        break;
    }
    case OP_POW: sb_printf(o, "pow%s(%s, %s)", f, a, b); break;
    case OP_EQ: sb_printf(o, "%s == %s", a, b); break;
    case OP_NE: sb_printf(o, "%s != %s", a, b); break;
    case OP_LT: sb_printf(o, "%s < %s", a, b); break;
    case OP_LE: sb_printf(o, "%s <= %s", a, b); break;
    case OP_GT: sb_printf(o, "%s > %s", a, b); break;
    case OP_GE: sb_printf(o, "%s >= %s", a, b); break;
    case OP_AND: sb_printf(o, "%s && %s", a, b); break;
    case OP_OR: sb_printf(o, "%s || %s", a, b); break;
    case OP_ROUND_STOCHASTIC: sb_printf(o, "kiln_bf16_round_stochastic(%s, %s)", a, b); break;
    case OP_WHERE:
        if (cg_compute_dtype((DType)n->dtype) == DT_F32 && !cuda) sb_printf(o, "kiln_selectf(%s, %s, %s)", a, b, w); /* kiln_math.h */
        else if (n->dtype == DT_F64 && !cuda) sb_printf(o, "kiln_select(%s, %s, %s)", a, b, w);
        else sb_printf(o, "%s ? %s : %s", a, b, w);
        break;
    default: break;
    }
}

void cg_c_string(StrBuf *b, const char *s)
{
    sb_putc(b, '"');
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') sb_printf(b, "\\%c", ch);
        else if (ch < 32 || ch >= 127) sb_printf(b, "\\%03o", ch);
        else sb_putc(b, (char)ch);
    }
    sb_putc(b, '"');
}

void cg_read_lines(Cg *c, const char *path)
{
    StrBuf err;
    sb_init(&err);
    size_t len;
    char *text = util_read_file(path, &len, &err);
    sb_free(&err);
    c->lines = NULL;
    c->nlines = 0;
    if (!text) return;
    int32_t cap = 0;
    char *p = text;
    for (;;) {
        char *nl = strchr(p, '\n');
        GROW(c->lines, cap, c->nlines + 1);
        c->lines[c->nlines++] = xstrndup(p, nl ? (size_t)(nl - p) : strlen(p));
        if (!nl) break;
        p = nl + 1;
    }
    free(text);
}

void cg_free_lines(Cg *c)
{
    for (int i = 0; i < c->nlines; i++) free(c->lines[i]);
    free(c->lines);
    c->lines = NULL;
    c->nlines = 0;
}

void cg_source_line(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    if (n->loc.line) {
        sb_printf(o, "\n * %s:%u", c->source, n->loc.line);
        if ((int)n->loc.line <= c->nlines) {
            const char *line = c->lines[n->loc.line - 1];
            while (*line == ' ') line++;
            /* Keep the comment valid C whatever the model line holds. */
            sb_puts(o, ": ");
            for (const char *p = line; *p && p - line < 100; p++) {
                if (p[0] == '*' && p[1] == '/') { sb_puts(o, "* /"); p++; continue; }
                sb_putc(o, (unsigned char)*p < 32 ? ' ' : *p);
            }
        }
    }
}


/* ---- what a fused kernel computes ---- */

/* A value computed in this kernel, full (t<id>) or row (w<id>). */
static bool local_value(const CgKernel *L, NodeId r) { return cg_in_kernel(L, r) || cg_recomputed_here(L, r); }

static void add_read(CgKernel *L, NodeId r)
{
    for (int i = 0; i < L->nreads; i++)
        if (L->reads[i] == r) return;
    /* grown: a member may read any number of operands (a concat of many) */
    GROW(L->reads, L->capreads, L->nreads + 1);
    L->reads[L->nreads++] = r;
}

/* Collects loads, coordinates and random use of operand x. */
static void scan_operand(CgKernel *L, NodeId x, NodeId reader)
{
    const Graph *g = L->g;
    NodeId r = fusion_root(g, L->f, x);
    if (cg_in_kernel(L, r)) return;
    if (cg_recomputed_here(L, r)) {
        for (int i = 0; i < L->nremat; i++)
            if (L->remat[i] == r) return;
        GROW(L->remat, L->capremat, L->nremat + 1);
        int i = L->nremat++;
        for (; i > 0 && L->remat[i - 1] > r; i--) L->remat[i] = L->remat[i - 1];
        L->remat[i] = r;
        for (uint32_t j = 0; j < g->nodes[r].ninputs; j++) scan_operand(L, ir_input(g, r, (int)j), r);
        return;
    }
    int off = L->rank - g->nodes[r].shape.rank;
    if (fusion_is_broadcast(g, L->f, r, L->k, reader)) {
        NodeId q = fusion_root(g, L->f, ir_input(g, r, 0));
        if (L->f->role[q] == ROLE_INLINE) return; /* a constant */
        add_read(L, q);
        const Shape *xs = &g->nodes[ir_input(g, r, 0)].shape, *es = &g->nodes[r].shape;
        for (int a = fusion_first_kept_axis(g, r); a < xs->rank; a++)
            if (!(cg_dim_is_one(xs->d[a]) && !cg_dim_is_one(es->d[a]))) L->coords |= (uint64_t)1 << (a + off);
        return;
    }
    if (L->f->role[r] == ROLE_INLINE) {
        if (g->nodes[r].op == OP_IOTA) L->coords |= (uint64_t)1 << (ir_attrs(g, r)[0] + off);
        if (g->nodes[r].op == OP_RANDOM_UNIFORM) L->random = true;
        return;
    }
    add_read(L, r);
}

/* ---- expressions ---- */

/* C product of dims [from, rank) of a shape: a row-major stride. */
static void stride_c(StrBuf *b, const Graph *g, const Shape *s, int from)
{
    bool any = false;
    for (int a = from; a < s->rank; a++) {
        if (cg_dim_is_one(s->d[a])) continue;
        sb_puts(b, any ? " * " : "");
        cg_dim(b, g, s->d[a]);
        any = true;
    }
    if (!any) sb_puts(b, "1");
}

/* The value of operand x in a full (row == false) or row context. */
void cg_operand(CgKernel *L, NodeId x, NodeId reader, bool row, StrBuf *b)
{
    const Graph *g = L->g;
    NodeId r = fusion_root(g, L->f, x);
    if (local_value(L, r)) {
        sb_printf(b, cg_in_kernel(L, r) && L->f->cls[r] == CLASS_ROW ? "w%d" : "t%d", r);
        return;
    }
    int off = L->rank - g->nodes[r].shape.rank;
    if (fusion_is_broadcast(g, L->f, r, L->k, reader)) {
        NodeId x0 = ir_input(g, r, 0);
        NodeId q = fusion_root(g, L->f, x0);
        if (L->f->role[q] == ROLE_INLINE) {
            cg_literal(b, g->nodes[q].fattr[0], (DType)g->nodes[q].dtype);
            return;
        }
        const Shape *xs = &g->nodes[x0].shape, *es = &g->nodes[r].shape;
        StrBuf at;
        sb_init(&at);
        StrBuf *outer = b;
        b = &at;
        sb_printf(b, "p%d[", q);
        bool any = false;
        uint64_t used = 0; /* the coordinates the index reads */
        for (int a = fusion_first_kept_axis(g, r); a < xs->rank; a++) {
            if (cg_dim_is_one(xs->d[a]) && !cg_dim_is_one(es->d[a])) continue;
            if (cg_dim_is_one(xs->d[a])) continue; /* size 1 in both: coordinate 0 */
            sb_printf(b, "%sc%d * (", any ? " + " : "", a + off);
            stride_c(b, g, xs, a + 1);
            sb_puts(b, ")");
            any = true;
            used |= (uint64_t)1 << (a + off);
        }
        sb_puts(b, any ? "]" : "0]");
        if (L->hoisted && L->lane < 0 && !(used & L->inner)) { /* the same for the whole row */
            if (!L->hoisted_done[r]) {
                L->hoisted_done[r] = 1;
                GROW(L->hoisted_ids, L->caphoisted, L->nhoisted + 1);
                L->hoisted_ids[L->nhoisted++] = r;
                sb_printf(L->hoisted, "const %s b%d = ", cg_value_ctype((DType)g->nodes[q].dtype), r);
                cg_load(L->hoisted, (DType)g->nodes[q].dtype, at.data);
                sb_puts(L->hoisted, ";\n");
            }
            sb_printf(outer, "b%d", r);
        } else {
            cg_load(outer, (DType)g->nodes[q].dtype, at.data);
        }
        sb_free(&at);
        return;
    }
    if (L->f->role[r] == ROLE_INLINE) {
        const Node *n = &g->nodes[r];
        switch ((Op)n->op) {
        case OP_CONST: cg_literal(b, n->fattr[0], (DType)n->dtype); return;
        case OP_IOTA: sb_printf(b, "(%s)c%lld", cg_ctype((DType)n->dtype), (long long)(ir_attrs(g, r)[0] + off)); return;
        case OP_RANDOM_UNIFORM:
            sb_printf(b, "kiln_rng_uniform24(seed, step, %lld, (uint64_t)%s)", (long long)ir_attrs(g, r)[0], row ? "row" : "i");
            return;
        default: break;
        }
    }
    if (L->lane_loaded && !row && g->nodes[r].dtype == DT_F32) {
        L->lane_loaded[r] = 1;
        sb_printf(b, "kiln_lane(q%d, k)", r);
        return;
    }
    char at[48];
    snprintf(at, sizeof at, "p%d[%s]", r, row ? "row" : "i");
    cg_load(b, (DType)g->nodes[r].dtype, at);
}

/* Is stored member id a half-precision copy (a cast to bf16/fp16) of the float32 value *x? */
static bool half_copy(const CgKernel *L, NodeId id, NodeId *x)
{
    const Graph *g = L->g;
    const Node *n = &g->nodes[id];
    if (!L->copies_from_operand || n->op != OP_CAST || (n->dtype != DT_BF16 && n->dtype != DT_F16)) return false;
    *x = ir_input(g, id, 0);
    return g->nodes[*x].dtype == DT_F32;
}

void cg_store_member(CgKernel *L, const char *indent, NodeId id)
{
    NodeId x;
    if (!half_copy(L, id, &x)) {
        cg_store_line(L->c->o, indent, L->g, id, "i", "t%d");
        return;
    }
    /* its operand converted once: converting the copy's rounded float, t<id>, again would
     * give the same bits for twice the work (fp16's conversions are a dozen operations) */
    StrBuf v;
    sb_init(&v);
    cg_operand(L, x, id, false, &v);
    sb_printf(L->c->o, "%sy%d[i] = ", indent, id);
    cg_store(L->c->o, (DType)L->g->nodes[id].dtype, v.data);
    sb_puts(L->c->o, ";\n");
    sb_free(&v);
}

void cg_need_store(CgKernel *L, NodeId id)
{
    NodeId x;
    if (!half_copy(L, id, &x)) {
        cg_need(L, id);
        return;
    }
    const NodeId r = fusion_root(L->g, L->f, x);
    if ((cg_in_kernel(L, r) && L->f->cls[r] == CLASS_FULL) || cg_recomputed_here(L, r)) cg_need(L, r);
}

/* Whether full member id was stored by an earlier pass over the current row. */
static bool written_before(const CgKernel *L, NodeId id)
{
    return L->pass && L->f->stored[id] && L->f->cls[id] == CLASS_FULL && L->avail[id] + 1 < L->pass;
}

/* Whether full member id was kept in the row's buffer by an earlier pass (CgKernel.kept). */
static bool kept_before(const CgKernel *L, NodeId id) { return L->kept && L->kept[id] && L->pass && L->avail[id] + 1 < L->pass; }

/* `const T t<id> = ...;` for a member, its operands already in scope. */
void cg_member_value(CgKernel *L, NodeId id, bool row, const char *indent)
{
    const Graph *g = L->g;
    Cg *c = L->c;
    const Node *n = &g->nodes[id];
    StrBuf *o = c->o;
    sb_printf(o, "%sconst %s %c%d = ", indent, cg_value_ctype((DType)n->dtype), row ? 'w' : 't', id);
    if (n->op == OP_MATMUL && L->lane_loaded && n->dtype == DT_F32) { /* the product, four at a time */
        L->lane_loaded[id] = 1;
        sb_printf(o, "kiln_lane(q%d, k);\n", id);
        return;
    }
    if (!row && kept_before(L, id)) {
        sb_printf(o, "keep%d[%s];\n", id, L->kept_index);
        return;
    }
    if (n->op == OP_MATMUL || (!row && written_before(L, id))) {
        char at[32];
        snprintf(at, sizeof at, "y%d[i]", id);
        cg_load(o, (DType)n->dtype, at);
        sb_puts(o, ";\n");
        return;
    }
    if (n->op == OP_EXPAND || n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX) { /* a row value, or an identity */
        cg_operand(L, ir_input(g, id, 0), id, row, o);
        sb_puts(o, ";\n");
        return;
    }
    StrBuf ops[3];
    for (uint32_t j = 0; j < 3; j++) {
        sb_init(&ops[j]);
        if (j < n->ninputs) cg_operand(L, ir_input(g, id, (int)j), id, row, &ops[j]);
        else sb_puts(&ops[j], "");
    }
    /* a half-precision result is rounded to its dtype, as the interpreter rounds it (a cast
     * rounds by itself) */
    const char *round = n->op == OP_CAST || n->op == OP_ROUND_STOCHASTIC ? NULL : n->dtype == DT_BF16 ? "kiln_bf16_round" : n->dtype == DT_F16 ? "kiln_f16_round" : NULL;
    if (round) sb_printf(o, "%s(", round);
    cg_elementwise_expr(c, id, ops[0].data, ops[1].data, ops[2].data);
    if (round) sb_putc(o, ')');
    for (int j = 0; j < 3; j++) sb_free(&ops[j]);
    sb_puts(o, ";\n");
}

/* Marks the full members needed to compute full member id. A work list, not recursion:
 * a chain of 200,000 elementwise ops in one kernel is as deep. */
void cg_need(CgKernel *L, NodeId id)
{
    if (L->needed[id]) return;
    L->needed[id] = 1;
    int n = 0;
    GROW(L->work, L->capwork, n + 1);
    L->work[n++] = id;
    while (n) {
        NodeId v = L->work[--n];
        const Node *nd = &L->g->nodes[v];
        if (nd->op == OP_MATMUL || written_before(L, v) || kept_before(L, v)) continue;
        for (uint32_t j = 0; j < nd->ninputs; j++) {
            NodeId r = fusion_root(L->g, L->f, ir_input(L->g, v, (int)j));
            if (L->needed[r] || !((cg_in_kernel(L, r) && L->f->cls[r] == CLASS_FULL) || cg_recomputed_here(L, r))) continue;
            L->needed[r] = 1;
            GROW(L->work, L->capwork, n + 1);
            L->work[n++] = r;
        }
    }
}

void cg_clear_needed(CgKernel *L)
{
    for (int32_t i = 0; i < L->K->count; i++) L->needed[CG_MEMBER(L, i)] = 0;
    for (int i = 0; i < L->nremat; i++) L->needed[L->remat[i]] = 0;
}

/* The body of an element loop: the needed full members, in order. */
void cg_emit_needed(CgKernel *L, const char *indent)
{
    /* recomputed values depend only on loads and on each other */
    for (int i = 0; i < L->nremat; i++)
        if (L->needed[L->remat[i]]) cg_member_value(L, L->remat[i], false, indent);
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (L->needed[id] && L->f->cls[id] == CLASS_FULL) cg_member_value(L, id, false, indent);
    }
}

void cg_need_columns(CgKernel *L)
{
    const Graph *g = L->g;
    cg_clear_needed(L);
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (L->f->cls[id] == CLASS_FULL && L->f->stored[id]) cg_need(L, id);
        if (L->f->cls[id] == CLASS_ROW) {
            NodeId r = fusion_root(g, L->f, ir_input(g, id, 0));
            if (cg_in_kernel(L, r)) cg_need(L, r);
        }
    }
}

void cg_emit_column_element(CgKernel *L, const char *indent, const char *acc, const char *acc_suffix)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    cg_emit_needed(L, indent);
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (L->f->cls[id] == CLASS_FULL && L->f->stored[id]) {
            sb_printf(o, "%sy%d[i] = ", indent, id);
            cg_store_local(o, g, id, "t%d");
            sb_puts(o, ";\n");
        }
        if (L->f->cls[id] != CLASS_ROW) continue;
        StrBuf v;
        sb_init(&v);
        cg_operand(L, ir_input(g, id, 0), id, false, &v);
        if (g->nodes[id].op == OP_REDUCE_SUM) sb_printf(o, "%s%s%d%s += %s;\n", indent, acc, id, acc_suffix, v.data);
        else
            sb_printf(o, "%s{\n%s    const %s v = %s;\n%s    if (v > %s%d%s || v != v) %s%d%s = v;\n%s}\n", indent, indent,
                      cg_ctype((DType)g->nodes[id].dtype), v.data, indent, acc, id, acc_suffix, acc, id, acc_suffix, indent);
        sb_free(&v);
    }
}

bool cg_axes_trailing(const CgKernel *L)
{
    uint64_t axes = L->K->axes, all = L->rank ? (((uint64_t)1 << L->rank) - 1) : 0;
    int lo = L->rank;
    while (lo > 0 && (axes >> (lo - 1) & 1)) lo--;
    return axes == (all & ~(((uint64_t)1 << lo) - 1));
}

bool cg_columns_shape(const CgKernel *L)
{
    /* leading axes reduced, and the kernel's only row members are stored reductions */
    const uint64_t axes = L->K->axes;
    int hi = 0;
    while (hi < L->rank && (axes >> hi & 1)) hi++;
    if (!axes || axes != (((uint64_t)1 << hi) - 1) || L->nstages != 1) return false;
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        const Node *n = &L->g->nodes[id];
        if (L->f->cls[id] == CLASS_FULL && L->avail[id]) return false;
        if (L->f->cls[id] == CLASS_TOTAL) return false;
        if (L->f->cls[id] == CLASS_ROW && (!L->f->stored[id] || (n->op != OP_REDUCE_SUM && n->op != OP_REDUCE_MAX))) return false;
    }
    return true;
}

void cg_coordinates(const CgKernel *L, uint64_t want, uint64_t span, const char *var, const char *indent)
{
    StrBuf *o = L->c->o;
    bool first = true; /* the first axis of span: var is below its dim, no modulo */
    for (int a = 0; a < L->rank; a++) {
        if (!(span >> a & 1)) continue;
        if (want >> a & 1) {
            sb_printf(o, "%sconst int64_t c%d = %s", indent, a, var);
            bool any = false;
            for (int b = a + 1; b < L->rank; b++) {
                if (!(span >> b & 1)) continue;
                sb_printf(o, "%sS%d", any ? " * " : " / (", b);
                any = true;
            }
            sb_puts(o, any ? ")" : "");
            if (!first) sb_printf(o, " %% S%d", a);
            sb_puts(o, ";\n");
        }
        first = false;
    }
}

void cg_kernel_setup(CgKernel *L, Cg *c, int32_t k)
{
    memset(L, 0, sizeof *L);
    L->c = c;
    L->g = c->g;
    L->f = &c->fp;
    L->k = k;
    L->K = &c->fp.kernels[k];
    L->rank = L->K->shape.rank;
    const size_t nn = (size_t)c->g->nnodes + 1;
    if (c->scratch.n != nn) cg_scratch_free(c); /* another graph's */
    KILN_ASSERT_MSG(!c->scratch.lent, "two kernels set up at once share one scratch pool");
    c->scratch.n = nn;
    c->scratch.lent = true;
    if (!c->scratch.avail) c->scratch.avail = xcalloc(nn, sizeof *c->scratch.avail);
    L->avail = c->scratch.avail;
    L->needed = cg_scratch(L, &c->scratch.needed);
    L->stores = xmalloc(((size_t)L->K->count + 1) * sizeof *L->stores);
    const Graph *g = L->g;
    if (L->K->kind == KERNEL_GEMM) {
        NodeId mm = L->K->anchor;
        add_read(L, fusion_root(g, L->f, ir_input(g, mm, 0)));
        add_read(L, fusion_root(g, L->f, ir_input(g, mm, 1)));
    }
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        const Node *n = &g->nodes[id];
        if (L->f->stored[id]) L->stores[L->nstores++] = id;
        if (n->op == OP_MATMUL) continue;
        for (uint32_t j = 0; j < n->ninputs; j++) scan_operand(L, ir_input(g, id, (int)j), id);
        /* stages */
        int32_t a = 0;
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId r = fusion_root(g, L->f, ir_input(g, id, (int)j));
            if (cg_in_kernel(L, r) && L->avail[r] > a) a = L->avail[r];
        }
        bool reduce = (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX) && L->f->cls[id] == CLASS_ROW;
        L->avail[id] = reduce ? a + 1 : a;
        if (reduce && a + 1 > L->nstages) L->nstages = a + 1;
    }
    uint64_t axes = L->K->axes;
    uint64_t last = L->rank ? (uint64_t)1 << (L->rank - 1) : 0;
    if (L->K->kind == KERNEL_GEMM) {
        L->mode = CG_LOOP_GEMM;
    } else if (!axes) {
        L->inner = last;
        L->mode = !L->coords ? CG_LOOP_FLAT : (L->coords & ~last) ? CG_LOOP_NESTED : CG_LOOP_ROWS;
    } else {
        L->inner = axes;
        bool rows_ok = cg_axes_trailing(L) && !(L->coords & ~last) && (!(L->coords & last) || cg_popcount64(axes) == 1);
        /* columns: members may read by the coordinates of the reduced (leading) axes, which
         * the walk down a column derives from its position h (a norm's statistics broadcast
         * along the row in its weight gradient); those of the column's axes would be a
         * division per element of the vectorised row */
        bool columns_ok = !(L->coords & ~axes) && cg_columns_shape(L);
        L->mode = rows_ok ? CG_LOOP_ROWS : columns_ok ? CG_LOOP_COLUMNS : CG_LOOP_NESTED;
    }
    L->lane = -1; /* the C target may choose one (c_loops.c) */
}

uint8_t *cg_scratch(CgKernel *L, uint8_t **slot)
{
    if (!*slot) *slot = xcalloc(L->c->scratch.n, 1);
    return *slot;
}

void cg_scratch_free(Cg *c)
{
    free(c->scratch.avail);
    free(c->scratch.needed);
    free(c->scratch.kept);
    free(c->scratch.staged);
    free(c->scratch.first);
    free(c->scratch.later);
    free(c->scratch.hoisted);
    memset(&c->scratch, 0, sizeof c->scratch);
}

/* Zeroes node id's entries of the pool's arrays that kernel L used. */
static void clear_scratch(CgKernel *L, NodeId id)
{
    L->avail[id] = 0;
    L->needed[id] = 0;
    if (L->kept) L->kept[id] = 0;
    if (L->staged) L->staged[id] = 0;
}

void cg_kernel_teardown(CgKernel *L)
{
    for (int32_t i = 0; i < L->K->count; i++) clear_scratch(L, CG_MEMBER(L, i));
    for (int i = 0; i < L->nremat; i++) clear_scratch(L, L->remat[i]);
    for (int i = 0; i < L->nreads; i++) clear_scratch(L, L->reads[i]);
    for (int i = 0; i < L->nstores; i++) clear_scratch(L, L->stores[i]);
    L->c->scratch.lent = false;
    free(L->work);
    free(L->reads);
    free(L->stores);
    free(L->remat);
    free(L->hoisted_ids);
}

void cg_kernel_title(Cg *c, int32_t k, StrBuf *o)
{
    const Kernel *K = &c->fp.kernels[k];
    const Graph *g = c->g;
    if (K->kind == KERNEL_GEMM) sb_puts(o, "matrix product");
    else sb_puts(o, K->axes ? "row reductions" : "elementwise");
    sb_printf(o, " over %s", cg_ctype((DType)g->nodes[K->anchor].dtype));
    ir_shape_format(o, g, &K->shape);
    if (K->axes) {
        sb_puts(o, ", rows reduced over axes");
        for (int a = 0; a < K->shape.rank; a++)
            if (K->axes >> a & 1) sb_printf(o, " %d", a);
    }
}

void cg_kernel_comment(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    sb_printf(o, "/* kernel %d: ", L->k);
    cg_kernel_title(c, L->k, o);
    sb_puts(o, "\n");
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        const Node *n = &g->nodes[id];
        sb_printf(o, " *   %%%d %s", id, ir_op_info[n->op].name);
        for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, "%s%%%d", j ? ", " : " ", ir_input(g, id, (int)j));
        sb_printf(o, " -> %s", cg_ctype((DType)n->dtype));
        ir_shape_format(o, g, &n->shape);
        if (L->f->stored[id]) sb_puts(o, " (stored)");
        if (L->f->recomputed[id] && !L->f->stored[id]) sb_puts(o, " (recomputed by its readers)");
        sb_puts(o, "\n");
    }
    if (L->nremat) sb_puts(o, " * computed again here instead of loaded:\n");
    for (int i = 0; i < L->nremat; i++) {
        NodeId id = L->remat[i];
        const Node *n = &g->nodes[id];
        sb_printf(o, " *   %%%d %s", id, ir_op_info[n->op].name);
        for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, "%s%%%d", j ? ", " : " ", ir_input(g, id, (int)j));
        sb_printf(o, " -> %s", cg_ctype((DType)n->dtype));
        ir_shape_format(o, g, &n->shape);
        if (L->f->kernel_of[id] >= 0) sb_printf(o, " (kernel %d's)\n", L->f->kernel_of[id]);
        else sb_puts(o, " (computed only where read)\n");
    }
    sb_puts(o, " *");
    cg_source_line(c, L->K->anchor);
    sb_puts(o, " */\n");
}

/* ---- the passes over a row ---- */

bool cg_reduced_in_pass(const CgKernel *L, NodeId id, int pass)
{
    const Node *n = &L->g->nodes[id];
    return L->f->cls[id] == CLASS_ROW && L->avail[id] == pass && (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX);
}

/* A stored full value is written by the first pass after the stages it needs: then no
 * further pass over the row is spent on it (the last pass writes those that need them all). */
bool cg_stored_in_pass(const CgKernel *L, NodeId id, int pass)
{
    return L->f->stored[id] && L->f->cls[id] == CLASS_FULL && L->avail[id] == pass - 1;
}

bool cg_need_pass(CgKernel *L, int pass)
{
    cg_clear_needed(L);
    bool any = false;
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (!cg_reduced_in_pass(L, id, pass)) continue;
        NodeId r = fusion_root(L->g, L->f, ir_input(L->g, id, 0));
        if (cg_in_kernel(L, r)) cg_need(L, r);
        any = true;
    }
    for (int i = 0; i < L->nstores; i++)
        if (cg_stored_in_pass(L, L->stores[i], pass)) {
            cg_need_store(L, L->stores[i]);
            any = true;
        }
    return any;
}

/* ---- matrix products ---- */

void cg_gemm_operand(CgKernel *L, NodeId x, CgOperand *op)
{
    /* fusion only makes views that BLAS can read; anything else is a bug there */
    KILN_ASSERT_MSG(fusion_layout(L->g, L->f, x, &op->lay) && fusion_gemm_operand(L->g, &op->lay, x, &op->trans),
                    "matrix operand %%%d has no BLAS layout", x);
}

/* The offset of an operand's element (c_0, ..., c_{r-3}, row, col): its offset terms plus
 * the batch coordinates (c<axis>), `row` and `col` (expressions) times their strides. */
void cg_gemm_operand_offset(CgKernel *L, const CgOperand *op, int nbatch, const char *row, const char *col, StrBuf *b)
{
    bool any = false;
    for (int t = 0; t < op->lay.nterms; t++) {
        sb_puts(b, any ? " + " : "");
        cg_dim(b, L->g, op->lay.offset[t]);
        any = true;
    }
    for (int a = 0; a <= nbatch + 1; a++) {
        Dim st = op->lay.stride[a];
        const char *at = a == nbatch ? row : col;
        if ((st.nsym == 0 && st.k == 0) || (a >= nbatch && !strcmp(at, "0"))) continue;
        sb_puts(b, any ? " + " : "");
        if (a < nbatch) sb_printf(b, "c%d", a);
        else sb_puts(b, at);
        if (!cg_dim_is_one(st)) {
            bool paren = st.nsym + (st.k != 1) > 1;
            sb_puts(b, paren ? " * (" : " * ");
            cg_dim(b, L->g, st);
            sb_puts(b, paren ? ")" : "");
        }
        any = true;
    }
    if (!any) sb_puts(b, "0");
}

void cg_gemm_operand_comment(CgKernel *L, const char *name, NodeId x, const CgOperand *op)
{
    StrBuf *o = L->c->o;
    const Graph *g = L->g;
    sb_printf(o, "    /* %s = %%%d %s", name, x, cg_ctype((DType)g->nodes[x].dtype));
    ir_shape_format(o, g, &g->nodes[x].shape);
    if (fusion_is_contiguous(g, &op->lay, x)) {
        if (op->lay.base != x) sb_printf(o, ": the memory of %%%d", op->lay.base);
    } else {
        sb_puts(o, ": read in place from ");
        fusion_layout_format(o, g, &op->lay);
    }
    sb_puts(o, op->trans ? " (transposed) */\n" : " */\n");
}

/* The leading dimension BLAS needs: the stride between rows of the matrix as stored. */
void cg_gemm_operand_ld(CgKernel *L, const char *name, NodeId x, const CgOperand *op)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    const Shape *s = &g->nodes[x].shape;
    int r = s->rank - 2, c = s->rank - 1;
    /* stored rows run along the columns' axis when transposed */
    int along = op->trans ? c : r, other = op->trans ? r : c;
    sb_printf(o, "    const int ld%s = (int)kiln_blas_ld(", name);
    cg_dim(o, g, op->lay.stride[along]);
    sb_puts(o, ", ");
    cg_dim(o, g, s->d[other]);
    sb_puts(o, ");\n");
}

void cg_gemm_output(CgKernel *L, CgOperand *C)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    NodeId mm = L->K->anchor, wr = L->K->written;
    const int r = L->rank;
    memset(C, 0, sizeof *C);
    /* the product goes straight into the permuted memory of %wr */
    KILN_ASSERT_MSG(fusion_gemm_output(g, mm, wr, C->lay.stride, &C->trans), "product %%%d cannot be written as %%%d", mm, wr);
    C->lay.base = wr;
    C->lay.rank = r;
    sb_printf(o, "    /* C = %%%d, written in the order of %%%d %s", mm, wr, cg_ctype((DType)g->nodes[wr].dtype));
    ir_shape_format(o, g, &g->nodes[wr].shape);
    sb_puts(o, C->trans ? ": computed as B^T A^T, whose rows are its columns */\n" : " */\n");
    sb_puts(o, "    const int ldc = (int)kiln_blas_ld(");
    cg_dim(o, g, C->lay.stride[C->trans ? r - 1 : r - 2]);
    sb_printf(o, ", %s);\n", C->trans ? "M" : "N");
}

/* ---- single-node kernels ---- */

/* Comment: op, shapes, then the model file, line and its text. */
void cg_single_comment(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_printf(o, "/* %%%d %s: %s", id, ir_op_info[n->op].name, ir_dtype_name((DType)n->dtype));
    ir_shape_format(o, c->g, &n->shape);
    if (n->ninputs) {
        sb_puts(o, " <- ");
        for (uint32_t k = 0; k < n->ninputs && k < 4; k++) {
            const Node *x = N(c, ir_input(c->g, id, (int)k));
            if (k) sb_puts(o, ", ");
            sb_puts(o, ir_dtype_name((DType)x->dtype));
            ir_shape_format(o, c->g, &x->shape);
        }
        if (n->ninputs > 4) sb_puts(o, ", ...");
    }
    cg_source_line(c, id);
    sb_puts(o, " */\n");
}

void cg_numel(Cg *c, const Shape *s)
{
    if (!s->rank) {
        sb_puts(c->o, "1");
        return;
    }
    for (int i = 0; i < s->rank; i++) {
        if (i) sb_puts(c->o, " * ");
        Dim d = s->d[i];
        if (d.nsym && d.k != 1) sb_putc(c->o, '(');
        cg_dim(c->o, c->g, d);
        if (d.nsym && d.k != 1) sb_putc(c->o, ')');
    }
}

void cg_declare_dims(Cg *c, const char *prefix, const Shape *s)
{
    if (!s->rank) return;
    sb_puts(c->o, "    const int64_t ");
    for (int i = 0; i < s->rank; i++) {
        sb_printf(c->o, "%s%s%d = ", i ? ", " : "", prefix, i);
        cg_dim(c->o, c->g, s->d[i]);
    }
    sb_puts(c->o, ";\n");
}

void cg_declare_strides(Cg *c, const char *dims, int rank)
{
    if (!rank) return;
    sb_puts(c->o, "    const int64_t ");
    for (int i = 0; i < rank; i++) {
        sb_printf(c->o, "%s%ss%d = 1", i ? ", " : "", dims, i);
        for (int j = i + 1; j < rank; j++) sb_printf(c->o, " * %s%d", dims, j);
    }
    sb_puts(c->o, ";\n");
}

bool cg_single_is_copy(Op op)
{
    return op == OP_IOTA || op == OP_EXPAND || op == OP_PERMUTE || op == OP_PAD || op == OP_SLICE;
}

void cg_copy_declare(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const Node *x = n->ninputs ? N(c, ir_input(c->g, id, 0)) : NULL;
    cg_declare_dims(c, "Y", &n->shape);
    if (x) {
        cg_declare_dims(c, "X", &x->shape);
        cg_declare_strides(c, "X", x->shape.rank);
    }
    cg_declare_strides(c, "Y", n->shape.rank);
}

void cg_copy_element(Cg *c, NodeId id, int in)
{
    const Node *n = N(c, id);
    const Graph *g = c->g;
    const int64_t *at = ir_attrs(g, id);
    StrBuf *o = c->o;
    const int r = n->shape.rank;
    const Node *x = n->ninputs ? N(c, ir_input(g, id, 0)) : NULL;
    sb_printf(o, "%*s", in, "");
    switch ((Op)n->op) {
    case OP_IOTA: sb_printf(o, "y[i] = (%s)c%lld;\n", cg_ctype((DType)n->dtype), (long long)at[0]); break;
    case OP_PERMUTE: {
        /* y[c] = x at coordinates (c_{inv[a]}) for input axis a */
        int coord_of_axis[IR_MAX_RANK];
        for (int k = 0; k < r; k++) coord_of_axis[at[k]] = k;
        sb_puts(o, "y[i] = x0[");
        if (!r) sb_puts(o, "0");
        for (int k = 0; k < r; k++) sb_printf(o, "%sc%d * Xs%d", k ? " + " : "", coord_of_axis[k], k);
        sb_puts(o, "];\n");
        break;
    }
    case OP_EXPAND: {
        sb_puts(o, "y[i] = x0[");
        bool first = true;
        for (int k = 0; k < r; k++) {
            if (ir_dim_eq(x->shape.d[k], n->shape.d[k]) || !(ir_dim_is_const(x->shape.d[k]) && x->shape.d[k].k == 1)) {
                sb_printf(o, "%sc%d * Xs%d", first ? "" : " + ", k, k);
                first = false;
            }
        }
        sb_puts(o, first ? "0];\n" : "];\n");
        break;
    }
    case OP_SLICE: {
        int ax = (int)at[0];
        sb_puts(o, "y[i] = x0[");
        for (int k = 0; k < r; k++) {
            if (k == ax) sb_printf(o, "%s(%lld + c%d * %lld) * Xs%d", k ? " + " : "", (long long)at[1], k, (long long)at[3], k);
            else sb_printf(o, "%sc%d * Xs%d", k ? " + " : "", k, k);
        }
        sb_puts(o, "];\n");
        break;
    }
    case OP_PAD:
        sb_puts(o, "{\n");
        for (int k = 0; k < r; k++) sb_printf(o, "%*sconst int64_t u%d = c%d - %lld;\n", in + 4, "", k, k, (long long)at[k]);
        sb_printf(o, "%*sy[i] = ", in + 4, "");
        for (int k = 0; k < r; k++) sb_printf(o, "%su%d >= 0 && u%d < X%d", k ? " && " : "(", k, k, k);
        sb_puts(o, r ? ") ? x0[" : "1 ? x0[");
        for (int k = 0; k < r; k++) sb_printf(o, "%su%d * Xs%d", k ? " + " : "", k, k);
        sb_puts(o, r ? "] : " : "0] : ");
        cg_literal(o, n->fattr[0], (DType)n->dtype);
        sb_printf(o, ";\n%*s}\n", in, "");
        break;
    default: break;
    }
}

void cg_concat_element(Cg *c, NodeId id, uint32_t k, int in)
{
    const int r = N(c, id)->shape.rank, ax = (int)ir_attrs(c->g, id)[0];
    StrBuf *o = c->o;
    sb_printf(o, "%*sy[", in, "");
    for (int d = 0; d < r; d++) sb_printf(o, "%s%sc%d%s * Ys%d", d ? " + " : "", d == ax ? "(off + " : "", d, d == ax ? ")" : "", d);
    sb_printf(o, "] = x%u[i];\n", k);
}

void cg_check_index_cond(Cg *c, NodeId id, const char *v, char *cond, size_t size)
{
    const Node *n = N(c, id);
    int64_t limit = ir_attrs(c->g, id)[0];
    bool may_be_negative = n->dtype != DT_U8;
    bool may_be_large = n->dtype == DT_I64 || (n->dtype == DT_I32 && limit <= INT32_MAX) || (n->dtype == DT_U8 && limit < 256);
    if (may_be_negative && may_be_large) snprintf(cond, size, "(%s < 0) | (%s >= %lld)", v, v, (long long)limit);
    else if (may_be_negative) snprintf(cond, size, "%s < 0", v);
    else snprintf(cond, size, "%s >= %lld", v, (long long)limit);
}

void cg_argmax_declare(Cg *c, NodeId id)
{
    const Node *x = N(c, ir_input(c->g, id, 0));
    const int ax = (int)ir_attrs(c->g, id)[0];
    StrBuf *o = c->o;
    cg_declare_dims(c, "X", &x->shape);
    sb_puts(o, "    int64_t outer = 1, inner = 1;\n");
    for (int k = 0; k < ax; k++) sb_printf(o, "    outer *= X%d;\n", k);
    for (int k = ax + 1; k < x->shape.rank; k++) sb_printf(o, "    inner *= X%d;\n", k);
}

void cg_argmax_row(Cg *c, NodeId id, int in)
{
    const Node *x = N(c, ir_input(c->g, id, 0));
    const int ax = (int)ir_attrs(c->g, id)[0];
    /* the first maximum; a NaN wins over numbers, the first NaN over later ones */
    sb_printf(c->o,
              "%*sconst %s *row = x0 + a * X%d * inner + b;\n"
              "%*sint64_t best = 0;\n"
              "%*sfor (int64_t k = 1; k < X%d; k++)\n"
              "%*s    if (row[k * inner] > row[best * inner] || (row[k * inner] != row[k * inner] && row[best * inner] == row[best * inner])) best = k;\n"
              "%*sy[a * inner + b] = best;\n",
              in, "", cg_ctype((DType)x->dtype), ax, in, "", in, "", ax, in, "", in, "");
}

void cg_gather_declare(Cg *c, NodeId id)
{
    const Graph *g = c->g;
    const Node *x = N(c, ir_input(g, id, 0)), *idx = N(c, ir_input(g, id, 1));
    StrBuf *o = c->o;
    sb_puts(o, "    const int64_t rows = ");
    cg_numel(c, &idx->shape);
    sb_puts(o, ", width = 1");
    for (int k = 1; k < x->shape.rank; k++) {
        sb_puts(o, " * ");
        cg_dim(o, g, x->shape.d[k]);
    }
    sb_puts(o, ";\n");
}

void cg_gather_source(Cg *c)
{
    sb_puts(c->o, "x0 + (int64_t)x1[r] * width");
}

void cg_scatter_add_declare(Cg *c, NodeId id)
{
    const Graph *g = c->g;
    const Node *n = N(c, id), *x = N(c, ir_input(g, id, 0)), *src = N(c, ir_input(g, id, 1));
    StrBuf *o = c->o;
    sb_puts(o, "    const int64_t n = ");
    cg_numel(c, &n->shape);
    sb_puts(o, ", rows = ");
    cg_numel(c, &x->shape);
    sb_puts(o, ", width = 1");
    for (int k = x->shape.rank; k < src->shape.rank; k++) {
        sb_puts(o, " * ");
        cg_dim(o, g, src->shape.d[k]);
    }
    sb_puts(o, ";\n");
}

void cg_scatter_add_element(Cg *c, int in)
{
    sb_printf(c->o, "%*sy[(int64_t)x0[r] * width + j] += x1[r * width + j];\n", in, "");
}

void cg_im2col_declare(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const int64_t *at = ir_attrs(c->g, id);
    const Shape *img = n->op == OP_UNFOLD ? &N(c, ir_input(c->g, id, 0))->shape : &n->shape;
    StrBuf *o = c->o;
    sb_puts(o, "    const int64_t Nb = ");
    cg_dim(o, c->g, img->d[0]);
    sb_printf(o, ", C = %lld, H = %lld, W = %lld;\n", (long long)img->d[1].k, (long long)img->d[2].k, (long long)img->d[3].k);
    sb_printf(o, "    const int64_t KH = %lld, KW = %lld, SH = %lld, SW = %lld, DH = %lld, DW = %lld;\n", (long long)at[0],
              (long long)at[1], (long long)at[2], (long long)at[3], (long long)at[4], (long long)at[5]);
    sb_puts(o, "    const int64_t OH = (H - DH * (KH - 1) - 1) / SH + 1, OW = (W - DW * (KW - 1) - 1) / SW + 1, L = OH * OW;\n");
}

void cg_im2col_row(Cg *c, int in)
{
    sb_printf(c->o, "%*sconst int64_t row = (ch * KH + ki) * KW + kj;\n", in, "");
}

void cg_im2col_index(Cg *c, bool pix, int in)
{
    if (pix) sb_printf(c->o, "%*sconst int64_t pix = ((b * C + ch) * H + oh * SH + ki * DH) * W + ow * SW + kj * DW;\n", in, "");
    sb_printf(c->o, "%*sconst int64_t col = (b * C * KH * KW + row) * L + oh * OW + ow;\n", in, "");
}
