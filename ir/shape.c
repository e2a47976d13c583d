/* shape.c — symbolic dims (k * B * T ...) and shapes: equality, products, exact division,
 * evaluation at a symbol's bound or a run's value, and formatting for diagnostics. */
#include "ir.h"

#include <string.h>

Dim ir_dim_const(int64_t k)
{
    Dim d;
    memset(&d, 0, sizeof d);
    d.k = k;
    return d;
}

Dim ir_dim_sym(int sym)
{
    Dim d = ir_dim_const(1);
    d.nsym = 1;
    d.sym[0] = (uint8_t)sym;
    return d;
}

bool ir_dim_is_const(Dim d) { return d.nsym == 0; }

bool ir_dim_eq(Dim a, Dim b)
{
    if (a.k != b.k || a.nsym != b.nsym) return false;
    return !memcmp(a.sym, b.sym, a.nsym);
}

bool ir_dim_mul(Dim a, Dim b, Dim *out)
{
    if (a.nsym + b.nsym > IR_MAX_DIM_SYMS) return false;
    if (a.k != 0 && b.k != 0 && (a.k > IR_MAX_ELEMENTS / b.k)) return false;
    Dim r = ir_dim_const(a.k * b.k);
    if (r.k == 0) { *out = r; return true; }
    /* Merge the two sorted symbol lists. */
    int i = 0, j = 0;
    while (i < a.nsym || j < b.nsym) {
        if (j >= b.nsym || (i < a.nsym && a.sym[i] <= b.sym[j])) r.sym[r.nsym++] = a.sym[i++];
        else r.sym[r.nsym++] = b.sym[j++];
    }
    *out = r;
    return true;
}

bool ir_dim_div(Dim a, Dim b, Dim *out)
{
    if (b.k == 0 || a.k % b.k != 0) return false;
    Dim r = ir_dim_const(a.k / b.k);
    /* Remove each symbol of b from a (multiset difference). */
    uint8_t left[IR_MAX_DIM_SYMS];
    int nleft = a.nsym;
    memcpy(left, a.sym, a.nsym);
    for (int j = 0; j < b.nsym; j++) {
        int found = -1;
        for (int i = 0; i < nleft; i++)
            if (left[i] == b.sym[j]) { found = i; break; }
        if (found < 0) return false;
        memmove(left + found, left + found + 1, (size_t)(nleft - found - 1));
        nleft--;
    }
    r.nsym = (uint8_t)nleft;
    memcpy(r.sym, left, (size_t)nleft);
    *out = r;
    return true;
}

int64_t ir_dim_max(const Graph *g, Dim d)
{
    int64_t v = d.k;
    for (int i = 0; i < d.nsym; i++) {
        int64_t m = d.sym[i] < g->nsyms ? g->syms[d.sym[i]].max : 0;
        if (m != 0 && v > IR_MAX_ELEMENTS / m) return -1;
        v *= m;
    }
    return v;
}

int64_t ir_dim_eval(Dim d, const int64_t *symvals)
{
    int64_t v = d.k;
    for (int i = 0; i < d.nsym; i++) v *= symvals[d.sym[i]];
    return v;
}

void ir_dim_format(StrBuf *b, const Graph *g, Dim d)
{
    if (d.nsym == 0) { sb_printf(b, "%lld", (long long)d.k); return; }
    if (d.k != 1) sb_printf(b, "%lld*", (long long)d.k);
    for (int i = 0; i < d.nsym; i++) {
        if (i) sb_putc(b, '*');
        if (g && d.sym[i] < g->nsyms) sb_puts(b, g->syms[d.sym[i]].name);
        else sb_printf(b, "$%d", d.sym[i]);
    }
}

Shape ir_shape_make(int rank, const Dim *d)
{
    Shape s;
    memset(&s, 0, sizeof s);
    s.rank = (uint8_t)rank;
    for (int i = 0; d && i < rank; i++) s.d[i] = d[i];
    return s;
}

bool ir_shape_eq(const Shape *a, const Shape *b)
{
    if (a->rank != b->rank) return false;
    for (int i = 0; i < a->rank; i++)
        if (!ir_dim_eq(a->d[i], b->d[i])) return false;
    return true;
}

bool ir_shape_numel(const Shape *s, Dim *out)
{
    Dim n = ir_dim_const(1);
    for (int i = 0; i < s->rank; i++)
        if (!ir_dim_mul(n, s->d[i], &n)) return false;
    *out = n;
    return true;
}

int64_t ir_shape_max_numel(const Graph *g, const Shape *s)
{
    int64_t n = 1;
    for (int i = 0; i < s->rank; i++) {
        int64_t d = ir_dim_max(g, s->d[i]);
        if (d < 0 || (d != 0 && n > IR_MAX_ELEMENTS / d)) return -1;
        n *= d;
    }
    return n;
}

void ir_shape_format(StrBuf *b, const Graph *g, const Shape *s)
{
    sb_putc(b, '[');
    for (int i = 0; i < s->rank; i++) {
        if (i) sb_puts(b, ", ");
        ir_dim_format(b, g, s->d[i]);
    }
    sb_putc(b, ']');
}
