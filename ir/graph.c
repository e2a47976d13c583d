/* graph.c — the Graph container: nodes, operand and attribute pools, interned strings,
 * symbols, source files and outputs, plus the op/dtype/init tables' accessors. */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

const OpInfo ir_op_info[OP_COUNT] = {
#define OP_ROW(e, name, arity, flags, attrs) [OP_##e] = {name, arity, flags, attrs},
    KILN_OPS(OP_ROW)
#undef OP_ROW
};

static const struct {
    const char *name;
    int size;
    bool is_float, is_int;
} dtype_info[DT_COUNT] = {
#define DT_ROW(e, name, size, is_float, is_int) [DT_##e] = {name, size, is_float, is_int},
    KILN_DTYPES(DT_ROW)
#undef DT_ROW
};

static const char *const attn_mask_names[ATTN_MASK_COUNT] = {"none", "causal", "keep", "drop", "add"};
const char *ir_attn_mask_name(int64_t m) { return m >= 0 && m < ATTN_MASK_COUNT ? attn_mask_names[m] : "?"; }
int ir_attn_mask_from_name(const char *s, size_t n)
{
    for (int m = 0; m < ATTN_MASK_COUNT; m++)
        if (strlen(attn_mask_names[m]) == n && !memcmp(attn_mask_names[m], s, n)) return m;
    return -1;
}
static const char *const attn_grad_names[4] = {"q", "k", "v", "mask"};
const char *ir_attn_grad_name(int64_t which) { return which >= 0 && which < 4 ? attn_grad_names[which] : "?"; }

const char *ir_dtype_name(DType t) { return t < DT_COUNT ? dtype_info[t].name : "?"; }
int ir_dtype_size(DType t) { return t < DT_COUNT ? dtype_info[t].size : 0; }
bool ir_dtype_is_float(DType t) { return t < DT_COUNT && dtype_info[t].is_float; }
bool ir_dtype_is_int(DType t) { return t < DT_COUNT && dtype_info[t].is_int; }

int ir_dtype_from_name(const char *s, size_t n)
{
    for (int t = 0; t < DT_COUNT; t++)
        if (strlen(dtype_info[t].name) == n && !memcmp(dtype_info[t].name, s, n)) return t;
    return -1;
}

static const struct {
    const char *name;
    int nargs;
} init_info[INIT_COUNT] = {
#define IN_ROW(e, name, nargs) [INIT_##e] = {name, nargs},
    KILN_INITS(IN_ROW)
#undef IN_ROW
};

const char *ir_init_name(InitKind k) { return k < INIT_COUNT ? init_info[k].name : "?"; }
int ir_init_nargs(InitKind k) { return k < INIT_COUNT ? init_info[k].nargs : 0; }

int ir_init_from_name(const char *s, size_t n)
{
    for (int k = 0; k < INIT_COUNT; k++)
        if (strlen(init_info[k].name) == n && !memcmp(init_info[k].name, s, n)) return k;
    return -1;
}

const char *ir_output_kind_name(OutputKind k)
{
    static const char *names[OUT_KIND_COUNT] = {"output", "loss", "metric", "update", "grad"};
    return k < OUT_KIND_COUNT ? names[k] : "?";
}

Graph *ir_graph_new(const char *name)
{
    Graph *g = xcalloc(1, sizeof *g);
    g->name = xstrdup(name ? name : "model");
    g->mode = MODE_TRAIN;
    GROW(g->strings, g->strings_cap, 1);
    g->strings[0] = 0;
    g->nstrings = 1;
    return g;
}

void ir_graph_free(Graph *g)
{
    if (!g) return;
    free(g->name);
    free(g->nodes);
    free(g->operands);
    free(g->attrs);
    free(g->strings);
    free(g->intern_slots);
    for (int i = 0; i < g->nsyms; i++) free(g->syms[i].name);
    for (int i = 0; i < g->nfiles; i++) free(g->files[i]);
    free(g->files);
    free(g->outputs);
    free(g);
}

NodeId ir_add_node(Graph *g, Op op, DType dtype, const Shape *shape, const NodeId *inputs, int ninputs,
                   const int64_t *attrs, int nattrs, Loc loc)
{
    /* Copy first: shape, inputs or attrs may point into this graph's arrays, which the
     * growth below can move. */
    Shape sh;
    memset(&sh, 0, sizeof sh);
    if (shape) sh = *shape;
    NodeId in_copy[8];
    NodeId *in_heap = NULL;
    if (ninputs > 8) {
        in_heap = xmalloc((size_t)ninputs * sizeof *in_heap);
        memcpy(in_heap, inputs, (size_t)ninputs * sizeof *in_heap);
        inputs = in_heap;
    } else if (ninputs) {
        memcpy(in_copy, inputs, (size_t)ninputs * sizeof *in_copy);
        inputs = in_copy;
    }
    int64_t attr_copy[2 * IR_MAX_RANK];
    if (nattrs > 0 && nattrs <= 2 * IR_MAX_RANK) {
        memcpy(attr_copy, attrs, (size_t)nattrs * sizeof *attrs);
        attrs = attr_copy;
    }
    GROW(g->nodes, g->nodes_cap, (int64_t)g->nnodes + 1);
    GROW(g->operands, g->operands_cap, (int64_t)g->noperands + ninputs);
    GROW(g->attrs, g->attrs_cap, (int64_t)g->nattrs + nattrs);
    Node *n = &g->nodes[g->nnodes];
    memset(n, 0, sizeof *n);
    n->op = (uint16_t)op;
    n->dtype = (uint8_t)dtype;
    n->shape = sh;
    n->ninputs = (uint32_t)ninputs;
    n->inputs = (uint32_t)g->noperands;
    if (ninputs) memcpy(g->operands + g->noperands, inputs, (size_t)ninputs * sizeof *inputs);
    g->noperands += ninputs;
    n->nattrs = (uint32_t)nattrs;
    n->attrs = (uint32_t)g->nattrs;
    if (nattrs) memcpy(g->attrs + g->nattrs, attrs, (size_t)nattrs * sizeof *attrs);
    g->nattrs += nattrs;
    n->loc = loc;
    free(in_heap);
    return g->nnodes++;
}

static void intern_index(Graph *g, uint32_t off)
{
    uint32_t mask = g->intern_cap - 1, i = (uint32_t)util_hash_string(g->strings + off) & mask;
    while (g->intern_slots[i]) i = (i + 1) & mask;
    g->intern_slots[i] = off;
    g->intern_n++;
}

/* (Re)builds the hash index over all strings, at twice the size needed. */
static void intern_rebuild(Graph *g, uint32_t want)
{
    uint32_t count = 0;
    for (int32_t off = 1; off < g->nstrings; off += (int32_t)strlen(g->strings + off) + 1) count++;
    if (want < count + 1) want = count + 1;
    free(g->intern_slots);
    g->intern_cap = 16;
    while (g->intern_cap < 2 * want) g->intern_cap *= 2;
    g->intern_slots = xcalloc(g->intern_cap, sizeof *g->intern_slots);
    g->intern_n = 0;
    for (int32_t off = 1; off < g->nstrings;) {
        intern_index(g, (uint32_t)off);
        off += (int32_t)strlen(g->strings + off) + 1;
    }
}

uint32_t ir_intern(Graph *g, const char *s)
{
    if (!s || !*s) return 0;
    if (!g->intern_slots) intern_rebuild(g, 16);
    uint32_t mask = g->intern_cap - 1, i = (uint32_t)util_hash_string(s) & mask;
    for (; g->intern_slots[i]; i = (i + 1) & mask)
        if (!strcmp(g->strings + g->intern_slots[i], s)) return g->intern_slots[i];
    size_t len = strlen(s);
    /* s may point into g->strings (a name being copied): copy it before growing. */
    char *copy = xstrndup(s, len);
    GROW(g->strings, g->strings_cap, (int64_t)g->nstrings + (int64_t)len + 1);
    uint32_t off = (uint32_t)g->nstrings;
    memcpy(g->strings + off, copy, len + 1);
    free(copy);
    g->nstrings += (int32_t)len + 1;
    if ((g->intern_n + 1) * 2 > g->intern_cap) intern_rebuild(g, g->intern_n + 1);
    else intern_index(g, off);
    return off;
}

const char *ir_node_name(const Graph *g, NodeId id) { return g->strings + g->nodes[id].name; }
void ir_set_name(Graph *g, NodeId id, const char *name) { g->nodes[id].name = ir_intern(g, name); }

void ir_copy_scope(Graph *g, NodeId dst, const Graph *from, NodeId src)
{
    const Node *n = &from->nodes[src];
    uint32_t off = 0, type = 0;
    const Loc loc = n->scope_loc;
    if (n->scope) { /* from may be g: interning moves its strings (and n) */
        char *path = xstrdup(ir_str(from, n->scope)), *ty = xstrdup(ir_str(from, n->scope_type));
        off = ir_intern(g, path);
        type = *ty ? ir_intern(g, ty) : 0;
        free(path);
        free(ty);
    }
    g->nodes[dst].scope = off;
    g->nodes[dst].scope_loc = loc;
    g->nodes[dst].scope_type = type;
}

int ir_find_symbol(const Graph *g, const char *name)
{
    for (int i = 0; i < g->nsyms; i++)
        if (!strcmp(g->syms[i].name, name)) return i;
    return -1;
}

int ir_add_symbol(Graph *g, const char *name, int64_t max)
{
    int i = ir_find_symbol(g, name);
    if (i >= 0) return i;
    if (g->nsyms >= IR_MAX_SYMS) return -1;
    g->syms[g->nsyms].name = xstrdup(name);
    g->syms[g->nsyms].max = max;
    return g->nsyms++;
}

uint16_t ir_add_file(Graph *g, const char *path)
{
    for (int i = 0; i < g->nfiles; i++)
        if (!strcmp(g->files[i], path)) return (uint16_t)i;
    GROW(g->files, g->files_cap, (int64_t)g->nfiles + 1);
    g->files[g->nfiles] = xstrdup(path);
    return (uint16_t)g->nfiles++;
}

void ir_add_output(Graph *g, OutputKind kind, const char *name, NodeId node)
{
    GROW(g->outputs, g->outputs_cap, (int64_t)g->noutputs + 1);
    Output *o = &g->outputs[g->noutputs++];
    o->name = ir_intern(g, name);
    o->node = node;
    o->kind = (uint8_t)kind;
}

NodeId ir_find_named(const Graph *g, Op op, const char *name)
{
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == op && !strcmp(ir_node_name(g, i), name)) return i;
    return IR_NONE;
}

void ir_index_named(const Graph *g, Op op, StrMap *m)
{
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == op && strmap_get(m, ir_node_name(g, i), -1) < 0) strmap_put(m, ir_node_name(g, i), i);
}

static void *dup_array(const void *p, size_t n)
{
    if (!n) return NULL;
    void *q = xmalloc(n);
    memcpy(q, p, n);
    return q;
}

Graph *ir_graph_clone(const Graph *g)
{
    Graph *c = xcalloc(1, sizeof *c);
    *c = *g;
    c->name = xstrdup(g->name);
    c->nodes = dup_array(g->nodes, (size_t)g->nnodes * sizeof *g->nodes);
    c->nodes_cap = g->nnodes;
    c->operands = dup_array(g->operands, (size_t)g->noperands * sizeof *g->operands);
    c->operands_cap = g->noperands;
    c->attrs = dup_array(g->attrs, (size_t)g->nattrs * sizeof *g->attrs);
    c->attrs_cap = g->nattrs;
    c->strings = dup_array(g->strings, (size_t)g->nstrings);
    c->strings_cap = g->nstrings;
    c->intern_slots = NULL; /* rebuilt on first use */
    c->intern_cap = c->intern_n = 0;
    for (int i = 0; i < g->nsyms; i++) c->syms[i].name = xstrdup(g->syms[i].name);
    c->files = g->nfiles ? xmalloc((size_t)g->nfiles * sizeof *c->files) : NULL;
    for (int i = 0; i < g->nfiles; i++) c->files[i] = xstrdup(g->files[i]);
    c->files_cap = g->nfiles;
    c->outputs = dup_array(g->outputs, (size_t)g->noutputs * sizeof *g->outputs);
    c->outputs_cap = g->noutputs;
    return c;
}

/* See ir.h. */
int64_t ir_index_range(const Graph *g, NodeId in)
{
    int64_t best = INT64_MAX;
    bool *reach = xcalloc((size_t)g->nnodes, sizeof *reach);
    reach[in] = true;
    for (NodeId i = in + 1; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        bool from_input = false;
        for (uint32_t k = 0; k < n->ninputs; k++) from_input |= reach[ir_input(g, i, (int)k)];
        if (!from_input) continue;
        if (n->op == OP_CHECK_INDEX && ir_attrs(g, i)[0] < best) best = ir_attrs(g, i)[0];
        if (n->op == OP_CAST || n->op == OP_RESHAPE || n->op == OP_EXPAND || n->op == OP_PERMUTE || n->op == OP_SLICE ||
            n->op == OP_CHECK_INDEX) {
            reach[i] = true;
            continue;
        }
        if (n->op == OP_GATHER && reach[ir_input(g, i, 1)]) {
            int64_t rows = ir_dim_max(g, g->nodes[ir_input(g, i, 0)].shape.d[0]);
            if (rows > 0 && rows < best) best = rows;
        }
        if (n->op == OP_EQ || n->op == OP_NE) {
            /* The other side traced back through shape ops to an iota: its axis size. */
            NodeId other = reach[ir_input(g, i, 0)] ? ir_input(g, i, 1) : ir_input(g, i, 0);
            while (g->nodes[other].op == OP_EXPAND || g->nodes[other].op == OP_RESHAPE || g->nodes[other].op == OP_CAST)
                other = ir_input(g, other, 0);
            if (g->nodes[other].op == OP_IOTA) {
                int64_t axis = ir_attrs(g, other)[0];
                int64_t c = ir_dim_max(g, g->nodes[other].shape.d[axis]);
                if (c > 0 && c < best) best = c;
            }
        }
    }
    free(reach);
    return best != INT64_MAX ? best : 0;
}

bool ir_same_attention(const Graph *g, NodeId a, NodeId b)
{
    const Node *x = &g->nodes[a], *y = &g->nodes[b];
    if (x->ninputs != y->ninputs || x->nattrs < 2 || y->nattrs < 2 || x->fattr[0] != y->fattr[0] || x->fattr[1] != y->fattr[1] ||
        ir_attrs(g, a)[0] != ir_attrs(g, b)[0] || ir_attrs(g, a)[1] != ir_attrs(g, b)[1])
        return false;
    for (uint32_t k = 0; k < x->ninputs; k++)
        if (ir_input(g, a, (int)k) != ir_input(g, b, (int)k)) return false;
    return true;
}
