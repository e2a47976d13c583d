/* dot.c — the graph as Graphviz DOT, for looking at what a model lowered to and what a
 * pass did to it (`dot -Tsvg`). One box per node labelled with its id, op, key attributes,
 * dtype and shape; leaves get their own shapes and colours so that the data flowing in
 * (inputs), the learned state (params) and literals stand out; outputs are separate nodes.
 * Like the text printer it is used on broken graphs too, so it never follows a bad index. */
#include "ir.h"

/* Appends s to a DOT double-quoted string. Backslash starts an escape in DOT labels and
 * Graphviz insists on valid UTF-8, so backslashes are doubled and control bytes and every
 * non-ASCII byte are shown as a literal \xNN. */
static void put_esc(StrBuf *b, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') {
            sb_putc(b, '\\');
            sb_putc(b, (char)*p);
        } else if (*p < 32 || *p >= 127) {
            sb_printf(b, "\\\\x%02x", *p);
        } else {
            sb_putc(b, (char)*p);
        }
    }
}

static void put_double(StrBuf *b, double v)
{
    char buf[64];
    util_format_double(buf, sizeof buf, v);
    sb_puts(b, buf);
}

static const char *str_at(const Graph *g, uint32_t off) { return off < (uint32_t)g->nstrings ? g->strings + off : "?"; }

/* The attributes worth seeing in a picture, in the text form's notation (escaped). */
static void put_attrs(StrBuf *b, const Graph *g, const Node *n)
{
    if ((uint64_t)n->attrs + n->nattrs > (uint64_t)g->nattrs) return;
    const int64_t *a = n->nattrs ? g->attrs + n->attrs : NULL; /* NULL + 0 is undefined */
    StrBuf t;
    sb_init(&t);
    switch (ir_op_info[n->op].attrs) {
    case ATTRS_NONE: case ATTRS_INPUT: break;
    case ATTRS_PARAM:
        if (n->nattrs == 2) {
            sb_printf(&t, "%s", a[0] >= 0 && a[0] < INIT_COUNT ? ir_init_name((InitKind)a[0]) : "?");
            int nargs = a[0] >= 0 && a[0] < INIT_COUNT ? ir_init_nargs((InitKind)a[0]) : 0;
            for (int i = 0; i < nargs; i++) {
                sb_puts(&t, i ? ", " : "(");
                put_double(&t, n->fattr[i]);
            }
            if (nargs) sb_putc(&t, ')');
            sb_puts(&t, a[1] ? " trainable" : " buffer");
        }
        break;
    case ATTRS_CONST: put_double(&t, n->fattr[0]); break;
    case ATTRS_AXIS: case ATTRS_STREAM: case ATTRS_LIMIT:
        if (n->nattrs == 1)
            sb_printf(&t, "%s=%lld",
                      ir_op_info[n->op].attrs == ATTRS_AXIS ? "axis" : ir_op_info[n->op].attrs == ATTRS_STREAM ? "stream" : "limit",
                      (long long)a[0]);
        break;
    case ATTRS_AXES:
        if (n->nattrs >= 1) {
            sb_puts(&t, "axes=[");
            int k = 0;
            for (int i = 0; i < 64; i++)
                if ((uint64_t)a[0] >> i & 1) sb_printf(&t, "%s%d", k++ ? ", " : "", i);
            sb_putc(&t, ']');
            if (n->nattrs == 2) sb_puts(&t, " first");
        }
        break;
    case ATTRS_PERM:
        sb_puts(&t, "perm=[");
        for (uint32_t i = 0; i < n->nattrs; i++) sb_printf(&t, "%s%lld", i ? ", " : "", (long long)a[i]);
        sb_putc(&t, ']');
        break;
    case ATTRS_SLICE:
        if (n->nattrs == 4) {
            sb_printf(&t, "axis=%lld [%lld:", (long long)a[0], (long long)a[1]);
            if (a[2] != IR_SLICE_END) sb_printf(&t, "%lld", (long long)a[2]);
            sb_printf(&t, ":%lld]", (long long)a[3]);
        }
        break;
    case ATTRS_PAD:
        if (n->nattrs % 2 == 0) {
            uint32_t r = n->nattrs / 2;
            sb_puts(&t, "lo=[");
            for (uint32_t i = 0; i < r; i++) sb_printf(&t, "%s%lld", i ? ", " : "", (long long)a[i]);
            sb_puts(&t, "] hi=[");
            for (uint32_t i = 0; i < r; i++) sb_printf(&t, "%s%lld", i ? ", " : "", (long long)a[r + i]);
            sb_puts(&t, "] value=");
            put_double(&t, n->fattr[0]);
        }
        break;
    case ATTRS_ATTENTION:
    case ATTRS_ATTENTION_GRAD:
        if (n->nattrs >= 2) {
            sb_printf(&t, "mask=%s scale=", ir_attn_mask_name(a[0]));
            put_double(&t, n->fattr[0]);
            if (n->fattr[1] != 0) {
                sb_puts(&t, " dropout=");
                put_double(&t, n->fattr[1]);
            }
            if (n->nattrs == 3) sb_printf(&t, " grad=%s", ir_attn_grad_name(a[2]));
        }
        break;
    case ATTRS_WINDOW:
        if (n->nattrs == 6)
            sb_printf(&t, "kernel=%lldx%lld stride=%lldx%lld dilation=%lldx%lld", (long long)a[0], (long long)a[1],
                      (long long)a[2], (long long)a[3], (long long)a[4], (long long)a[5]);
        break;
    }
    if (t.len) {
        sb_puts(b, "\\n");
        put_esc(b, t.data);
    }
    sb_free(&t);
}

static void put_type(StrBuf *b, const Graph *g, const Node *n)
{
    StrBuf t;
    sb_init(&t);
    sb_puts(&t, n->dtype < DT_COUNT ? ir_dtype_name((DType)n->dtype) : "?");
    bool sane = n->shape.rank <= IR_MAX_RANK;
    for (int i = 0; sane && i < n->shape.rank; i++) sane = n->shape.d[i].nsym <= IR_MAX_DIM_SYMS;
    if (sane) ir_shape_format(&t, g, &n->shape);
    else sb_puts(&t, "[invalid shape]");
    put_esc(b, t.data);
    sb_free(&t);
}

static void put_node(StrBuf *b, const Graph *g, NodeId id)
{
    const Node *n = &g->nodes[id];
    bool known = n->op < OP_COUNT;
    sb_printf(b, "  n%d [label=\"%%%d ", id, id);
    if (known) sb_puts(b, ir_op_info[n->op].name);
    else sb_printf(b, "op%u", n->op);
    if (n->name) {
        sb_puts(b, " \\\"");
        put_esc(b, str_at(g, n->name));
        sb_puts(b, "\\\"");
    }
    if (known) put_attrs(b, g, n);
    sb_puts(b, "\\n");
    put_type(b, g, n);
    if (n->ckpt >= IR_CKPT_AUTO) sb_printf(b, "\\nblock=%d", n->ckpt - IR_CKPT_AUTO);
    else if (n->ckpt) sb_printf(b, "\\nckpt=%d", n->ckpt);
    if (n->flags & NODE_RECOMPUTED) sb_puts(b, "\\nrecomputed");
    sb_putc(b, '"');
    switch (known ? (Op)n->op : OP_COUNT) {
    case OP_INPUT: sb_puts(b, ", shape=ellipse, style=filled, fillcolor=\"#c6e2ff\""); break;
    case OP_PARAM: {
        bool trainable = n->nattrs >= 2 && (uint64_t)n->attrs + 2 <= (uint64_t)g->nattrs && g->attrs[n->attrs + 1];
        sb_printf(b, ", shape=box3d, style=filled, fillcolor=\"%s\"", trainable ? "#ffe4b5" : "#e0e0e0");
        break;
    }
    case OP_CONST: sb_puts(b, ", shape=plaintext, fontcolor=\"#555555\""); break;
    case OP_IOTA: case OP_RANDOM_UNIFORM: case OP_LOSS_SCALE: sb_puts(b, ", shape=box, style=\"rounded,filled\", fillcolor=\"#e8f5e9\""); break;
    default: sb_puts(b, ", shape=box"); break;
    }
    sb_puts(b, "];\n");
    if ((uint64_t)n->inputs + n->ninputs > (uint64_t)g->noperands) return;
    for (uint32_t i = 0; i < n->ninputs; i++) {
        NodeId x = g->operands[n->inputs + i];
        if (x < 0 || x >= g->nnodes) continue;
        sb_printf(b, "  n%d -> n%d", x, id);
        /* Operand order matters for sub, div, matmul, where...: number the edges. */
        if (n->ninputs > 1) sb_printf(b, " [label=\"%u\"]", i);
        sb_puts(b, ";\n");
    }
}

void ir_print_dot(const Graph *g, StrBuf *out)
{
    sb_puts(out, "digraph \"");
    put_esc(out, g->name ? g->name : "");
    sb_puts(out, "\" {\n  rankdir=TB;\n  node [fontname=\"monospace\", fontsize=10];\n"
                 "  edge [fontname=\"monospace\", fontsize=8];\n");
    for (NodeId id = 0; id < g->nnodes; id++) put_node(out, g, id);
    for (int32_t i = 0; i < g->noutputs; i++) {
        const Output *o = &g->outputs[i];
        sb_printf(out, "  out%d [label=\"%s ", i, ir_output_kind_name((OutputKind)o->kind));
        put_esc(out, str_at(g, o->name));
        sb_printf(out, "\", shape=doubleoctagon, style=filled, fillcolor=\"%s\"];\n",
                  o->kind == OUT_LOSS ? "#ffcdd2" : "#dcedc8");
        if (o->node >= 0 && o->node < g->nnodes) sb_printf(out, "  n%d -> out%d;\n", o->node, i);
    }
    sb_puts(out, "}\n");
}
