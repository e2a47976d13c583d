/* print.c — the deterministic text form of a graph (grammar in docs/ir.md).
 *
 * The text form is what tests compare, what `kiln --emit=ir` shows and what ir_read parses
 * back, so it must be exact (doubles round-trip, every string is quoted unambiguously) and
 * stable (the same graph always prints the same bytes). The printer is also used on graphs
 * that fail ir_verify, to show what went wrong, so it never trusts an index: anything out
 * of range is printed in a visibly invalid form instead of being read. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

/* A word printed without quotes: an identifier that may also contain dots (PyTorch keys
 * such as fc1.weight). Everything else is quoted, so no name can collide with syntax. */
static bool is_bare_word(const char *s)
{
    if (!s || !((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_')) return false;
    for (const char *p = s + 1; *p; p++) {
        char c = *p;
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* A file path printed bare in a location: common path characters only, never ':' (which
 * separates the line and column), never a leading '#' (the index form) or quote. */
static bool is_bare_path(const char *s)
{
    if (!s || !*s || *s == '#') return false;
    for (const char *p = s; *p; p++) {
        char c = *p;
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || strchr("_./+-~,=", c)))
            return false;
    }
    return true;
}

static void put_quoted(StrBuf *b, const char *s)
{
    static const char hex[] = "0123456789abcdef";
    sb_putc(b, '"');
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p == '"' || *p == '\\') {
            sb_putc(b, '\\');
            sb_putc(b, (char)*p);
        } else if (*p < 32 || *p >= 127) {
            char e[4] = {'\\', 'x', hex[*p >> 4], hex[*p & 15]};
            sb_putn(b, e, 4);
        } else {
            sb_putc(b, (char)*p);
        }
    }
    sb_putc(b, '"');
}

static void put_word(StrBuf *b, const char *s)
{
    if (is_bare_word(s)) sb_puts(b, s);
    else put_quoted(b, s);
}

static void put_double(StrBuf *b, double v)
{
    char buf[64];
    util_format_double(buf, sizeof buf, v);
    sb_puts(b, buf);
}

static const char *safe_str(const Graph *g, uint32_t off)
{
    return off < (uint32_t)g->nstrings ? g->strings + off : "\x01<bad string offset>";
}

static void put_dim(StrBuf *b, const Graph *g, Dim d)
{
    if (d.nsym == 0) { sb_printf(b, "%lld", (long long)d.k); return; }
    if (d.k != 1) sb_printf(b, "%lld*", (long long)d.k);
    for (int i = 0; i < d.nsym && i < IR_MAX_DIM_SYMS; i++) {
        if (i) sb_putc(b, '*');
        if (d.sym[i] < g->nsyms) put_word(b, g->syms[d.sym[i]].name);
        else sb_printf(b, "$%d", d.sym[i]); /* unreadable on purpose: the graph is invalid */
    }
}

static void put_type(StrBuf *b, const Graph *g, const Node *n)
{
    if (n->dtype < DT_COUNT) sb_puts(b, ir_dtype_name((DType)n->dtype));
    else sb_printf(b, "dtype%d", n->dtype);
    sb_putc(b, '[');
    for (int i = 0; i < n->shape.rank && i < IR_MAX_RANK; i++) {
        if (i) sb_puts(b, ", ");
        put_dim(b, g, n->shape.d[i]);
    }
    if (n->shape.rank > IR_MAX_RANK) sb_printf(b, ", ...rank %d", n->shape.rank);
    sb_putc(b, ']');
}

static void put_int_list(StrBuf *b, const int64_t *a, int n)
{
    sb_putc(b, '[');
    for (int i = 0; i < n; i++) sb_printf(b, "%s%lld", i ? ", " : "", (long long)a[i]);
    sb_putc(b, ']');
}

/* Whether the node's attribute count fits its layout's own syntax. A node whose count
 * does not (only possible in an invalid graph) gets the raw form attrs=[...]. */
static bool attrs_fit(OpAttrs layout, uint32_t nattrs)
{
    switch (layout) {
    case ATTRS_NONE: case ATTRS_INPUT: case ATTRS_CONST: return nattrs == 0;
    case ATTRS_AXIS: case ATTRS_STREAM: case ATTRS_LIMIT: return nattrs == 1;
    case ATTRS_AXES: return nattrs == 1 || nattrs == 2; /* reduce_max's `first` */
    case ATTRS_PARAM: return nattrs == 2 || nattrs == 3;
    case ATTRS_SLICE: return nattrs == 4;
    case ATTRS_WINDOW: return nattrs == 6;
    case ATTRS_PERM: return true;
    case ATTRS_PAD: return nattrs % 2 == 0;
    case ATTRS_ATTENTION: return nattrs == 2;
    case ATTRS_ATTENTION_GRAD: return nattrs == 3;
    }
    return false;
}

static void put_attrs(StrBuf *b, const Graph *g, const Node *n, const int64_t *a)
{
    OpAttrs layout = ir_op_info[n->op].attrs;
    if (layout == ATTRS_INPUT || layout == ATTRS_PARAM) {
        sb_putc(b, ' ');
        put_quoted(b, safe_str(g, n->name));
    }
    if (!attrs_fit(layout, n->nattrs)) {
        sb_puts(b, " attrs=");
        put_int_list(b, a, (int)n->nattrs);
        return;
    }
    switch (layout) {
    case ATTRS_NONE: case ATTRS_INPUT: break;
    case ATTRS_PARAM: {
        if (a[0] >= 0 && a[0] < INIT_COUNT) {
            InitKind k = (InitKind)a[0];
            sb_printf(b, " init=%s", ir_init_name(k));
            int nargs = ir_init_nargs(k);
            if (nargs > 0) {
                sb_putc(b, '(');
                for (int i = 0; i < nargs; i++) {
                    if (i) sb_puts(b, ", ");
                    put_double(b, n->fattr[i]);
                }
                sb_putc(b, ')');
            }
        } else {
            sb_printf(b, " init=?%lld", (long long)a[0]);
        }
        if (a[1] == 1) sb_puts(b, " trainable");
        else if (a[1] == 0) sb_puts(b, " buffer");
        else sb_printf(b, " trainable=%lld", (long long)a[1]);
        if (n->nattrs == 3) sb_printf(b, " zero_row=%lld", (long long)a[2]);
        break;
    }
    case ATTRS_CONST: sb_putc(b, ' '); put_double(b, n->fattr[0]); break;
    case ATTRS_AXIS: sb_printf(b, " axis=%lld", (long long)a[0]); break;
    case ATTRS_STREAM: sb_printf(b, " stream=%lld", (long long)a[0]); break;
    case ATTRS_LIMIT: sb_printf(b, " limit=%lld", (long long)a[0]); break;
    case ATTRS_AXES: {
        uint64_t mask = (uint64_t)a[0];
        sb_puts(b, " axes=[");
        bool first = true;
        for (int i = 0; i < 64; i++)
            if (mask >> i & 1) {
                sb_printf(b, "%s%d", first ? "" : ", ", i);
                first = false;
            }
        sb_putc(b, ']');
        if (n->nattrs == 2) {
            if (a[1] == 1) sb_puts(b, " first");
            else sb_printf(b, " first=%lld", (long long)a[1]);
        }
        break;
    }
    case ATTRS_PERM: sb_puts(b, " perm="); put_int_list(b, a, (int)n->nattrs); break;
    case ATTRS_SLICE:
        sb_printf(b, " axis=%lld start=%lld end=", (long long)a[0], (long long)a[1]);
        if (a[2] == IR_SLICE_END) sb_puts(b, "end");
        else sb_printf(b, "%lld", (long long)a[2]);
        sb_printf(b, " step=%lld", (long long)a[3]);
        break;
    case ATTRS_PAD: {
        int r = (int)n->nattrs / 2;
        sb_puts(b, " lo=");
        put_int_list(b, a, r);
        sb_puts(b, " hi=");
        put_int_list(b, r ? a + r : a, r);
        sb_puts(b, " value=");
        put_double(b, n->fattr[0]);
        break;
    }
    case ATTRS_WINDOW:
        sb_printf(b, " kernel=[%lld, %lld] stride=[%lld, %lld] dilation=[%lld, %lld]", (long long)a[0],
                  (long long)a[1], (long long)a[2], (long long)a[3], (long long)a[4], (long long)a[5]);
        break;
    case ATTRS_ATTENTION:
    case ATTRS_ATTENTION_GRAD:
        if (a[0] >= 0 && a[0] < ATTN_MASK_COUNT) sb_printf(b, " mask=%s", ir_attn_mask_name(a[0]));
        else sb_printf(b, " mask=%lld", (long long)a[0]);
        sb_puts(b, " scale=");
        put_double(b, n->fattr[0]);
        sb_puts(b, " dropout=");
        put_double(b, n->fattr[1]);
        sb_printf(b, " stream=%lld", (long long)a[1]);
        if (layout == ATTRS_ATTENTION_GRAD) {
            if (a[2] >= 0 && a[2] < 4) sb_printf(b, " grad=%s", ir_attn_grad_name(a[2]));
            else sb_printf(b, " grad=%lld", (long long)a[2]);
        }
        break;
    }
}

static void put_loc(StrBuf *b, const Graph *g, Loc loc)
{
    if (loc.line == 0) return;
    sb_puts(b, " @");
    if (loc.file < g->nfiles && g->files[loc.file]) {
        const char *path = g->files[loc.file];
        if (is_bare_path(path)) sb_puts(b, path);
        else put_quoted(b, path);
    } else {
        sb_printf(b, "#%u", loc.file); /* a file index the graph's table does not hold */
    }
    sb_printf(b, ":%u:%u", loc.line, loc.col);
}

static void put_node(StrBuf *b, const Graph *g, NodeId id)
{
    const Node *n = &g->nodes[id];
    sb_printf(b, "%%%d = ", id);
    if (n->op >= OP_COUNT) {
        sb_printf(b, "?op%u", n->op);
    } else {
        sb_puts(b, ir_op_info[n->op].name);
        bool in_range = (uint64_t)n->inputs + n->ninputs <= (uint64_t)g->noperands;
        for (uint32_t i = 0; i < n->ninputs && in_range; i++)
            sb_printf(b, "%s%%%d", i ? ", " : " ", g->operands[n->inputs + i]);
        if (!in_range) sb_printf(b, " ?operands(%u at %u)", n->ninputs, n->inputs);
        if ((uint64_t)n->attrs + n->nattrs <= (uint64_t)g->nattrs) put_attrs(b, g, n, n->nattrs ? g->attrs + n->attrs : NULL);
        else sb_printf(b, " ?attrs(%u at %u)", n->nattrs, n->attrs);
    }
    sb_puts(b, " : ");
    put_type(b, g, n);
    bool named_leaf = n->op < OP_COUNT &&
                      (ir_op_info[n->op].attrs == ATTRS_INPUT || ir_op_info[n->op].attrs == ATTRS_PARAM);
    if (n->name && !named_leaf) {
        sb_putc(b, ' ');
        put_quoted(b, safe_str(g, n->name));
    }
    if (n->ckpt >= IR_CKPT_AUTO) sb_printf(b, " block=%d", n->ckpt - IR_CKPT_AUTO);
    else if (n->ckpt) sb_printf(b, " ckpt=%d", n->ckpt);
    if (n->flags & NODE_RECOMPUTED) sb_puts(b, " recomputed");
    put_loc(b, g, n->loc);
    sb_putc(b, '\n');
}

void ir_print(const Graph *g, StrBuf *out)
{
    sb_puts(out, "kiln-ir 1\ngraph ");
    put_word(out, g->name ? g->name : "");
    sb_printf(out, " mode=%s\n", g->mode == MODE_EVAL ? "eval" : g->mode == MODE_TRAIN ? "train" : g->mode == MODE_DECODE ? "decode" : "?");
    for (int32_t i = 0; i < g->nfiles; i++) {
        sb_puts(out, "file ");
        put_quoted(out, g->files[i]);
        sb_putc(out, '\n');
    }
    for (int32_t i = 0; i < g->nsyms && i < IR_MAX_SYMS; i++) {
        sb_puts(out, "sym ");
        put_word(out, g->syms[i].name);
        sb_printf(out, " <= %lld\n", (long long)g->syms[i].max);
    }
    for (NodeId id = 0; id < g->nnodes; id++) put_node(out, g, id);
    for (int32_t i = 0; i < g->noutputs; i++) {
        const Output *o = &g->outputs[i];
        sb_puts(out, ir_output_kind_name((OutputKind)o->kind));
        sb_putc(out, ' ');
        put_word(out, safe_str(g, o->name));
        sb_printf(out, " = %%%d\n", o->node);
    }
}

uint64_t ir_hash(const Graph *g0, const char *extra)
{
    Graph *g = ir_graph_clone(g0);
    for (NodeId i = 0; i < g->nnodes; i++) memset(&g->nodes[i].loc, 0, sizeof g->nodes[i].loc);
    for (int i = 0; i < g->nfiles; i++) free(g->files[i]);
    g->nfiles = 0;
    StrBuf t;
    sb_init(&t);
    ir_print(g, &t);
    ir_graph_free(g);
    if (extra) sb_puts(&t, extra);
    const uint64_t h = util_hash_string(t.data ? t.data : "");
    sb_free(&t);
    return h;
}
