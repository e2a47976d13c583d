/* remat.c — activation checkpointing: the backward pass recomputes the values of a
 * checkpoint(...) region instead of keeping them from the forward pass.
 *
 * Requires: a verified graph after autodiff and simplify (forward and backward nodes; the
 * forward nodes built inside checkpoint(...) carry their region's number in Node.ckpt).
 * Guarantees: every backward read of a value computed inside a region reads a copy of it
 * (Node.flags has NODE_RECOMPUTED), computed from the region's inputs, which are kept;
 * the copies of a region come right before the first backward node that reads one of
 * them, so that kernel order (fusion.c: ready kernels in node order) runs them during the
 * backward pass and memplan frees the originals after their last forward reader. What a
 * region keeps is then its inputs and outputs only. ir_verify() holds.
 *
 * Forward nodes are those the forward outputs, the loss, the metrics and the buffer
 * updates depend on; every other node is the backward pass's. Not copied: parameters and
 * inputs, a region's outputs (values that forward nodes outside the region read: the next
 * region's input is kept anyway) and values outside any region. A copy computes exactly
 * what the original did: the same ops on the same operands, random numbers included
 * (kiln_rng.h's generator is counter-based: a copy of a dropout mask draws the same
 * numbers), so trained weights are bit-identical with and without checkpoint(...).
 *
 * Simplify must not run after this pass: CSE would merge the copies back. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *g;
    Graph *o;
    bool *forward;     /* per node: a forward node */
    bool *region_out;  /* per node: a region's value that a forward node outside it reads */
    bool *wanted;      /* per node: a backward node reads a copy of it (transitively) */
    NodeId *map;       /* old node -> new graph */
    NodeId *copy;      /* old node -> its copy in the new graph (IR_NONE: none yet) */
    bool *emitted;     /* per region: its copies are in the new graph */
} Remat;

/* Is x a value that the backward pass reads a copy of instead of the original? */
static bool copied(const Remat *r, NodeId x)
{
    const Node *n = &r->g->nodes[x];
    return r->forward[x] && n->ckpt > 0 && !r->region_out[x] && n->op != OP_PARAM && n->op != OP_INPUT;
}

static void mark_forward(Remat *r)
{
    const Graph *g = r->g;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_GRAD) r->forward[g->outputs[k].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--)
        if (r->forward[i])
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) r->forward[ir_input(g, i, (int)j)] = true;
}

/* A region's outputs, and the values whose copies backward nodes read, with the values
 * inside the region that those copies are computed from. */
static void mark_wanted(Remat *r)
{
    const Graph *g = r->g;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (!r->forward[i]) continue;
        for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            if (g->nodes[x].ckpt > 0 && g->nodes[x].ckpt != g->nodes[i].ckpt) r->region_out[x] = true;
        }
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_GRAD && g->nodes[g->outputs[k].node].ckpt > 0) r->region_out[g->outputs[k].node] = true;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (r->forward[i]) continue;
        for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            if (copied(r, x)) r->wanted[x] = true;
        }
    }
    for (NodeId i = g->nnodes - 1; i >= 0; i--)
        if (r->wanted[i])
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
                NodeId x = ir_input(g, i, (int)j);
                if (copied(r, x) && g->nodes[x].ckpt == g->nodes[i].ckpt) r->wanted[x] = true;
            }
}

/* Node i of the old graph into the new one; its operands are the new graph's (copies
 * where `recompute`). */
static NodeId emit(Remat *r, NodeId i, bool recompute)
{
    const Graph *g = r->g;
    const Node *n = &g->nodes[i];
    NodeId ins[64];
    NodeId *in = n->ninputs <= 64 ? ins : xmalloc(n->ninputs * sizeof *in);
    for (uint32_t k = 0; k < n->ninputs; k++) {
        NodeId x = ir_input(g, i, (int)k);
        in[k] = (recompute || !r->forward[i]) && r->copy[x] != IR_NONE ? r->copy[x] : r->map[x];
    }
    NodeId id = ir_add_node(r->o, (Op)n->op, (DType)n->dtype, &n->shape, in, (int)n->ninputs, ir_attrs(g, i), (int)n->nattrs, n->loc);
    if (in != ins) free(in);
    Node *m = &r->o->nodes[id];
    m->fattr[0] = n->fattr[0];
    m->fattr[1] = n->fattr[1];
    m->ckpt = n->ckpt;
    m->flags = (uint8_t)(n->flags | (recompute ? NODE_RECOMPUTED : 0));
    if (n->name) ir_set_name(r->o, id, ir_str(g, n->name));
    return id;
}

/* The copies of region c, in node order (each after the copies it reads). */
static void emit_region(Remat *r, int32_t c)
{
    const Graph *g = r->g;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (r->wanted[i] && g->nodes[i].ckpt == c) r->copy[i] = emit(r, i, true);
    r->emitted[c] = true;
}

int pass_remat(Graph *g, RematStats *stats)
{
    Remat r = {.g = g};
    size_t nn = (size_t)g->nnodes + 1;
    int32_t nregions = 0;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].ckpt > nregions) nregions = g->nodes[i].ckpt;
    if (stats) memset(stats, 0, sizeof *stats);
    if (!nregions) return 0;
    r.forward = xcalloc(nn, 1);
    r.region_out = xcalloc(nn, 1);
    r.wanted = xcalloc(nn, 1);
    r.map = xmalloc(nn * sizeof *r.map);
    r.copy = xmalloc(nn * sizeof *r.copy);
    r.emitted = xcalloc((size_t)nregions + 1, 1);
    for (NodeId i = 0; i < g->nnodes; i++) r.map[i] = r.copy[i] = IR_NONE;
    mark_forward(&r);
    mark_wanted(&r);
    r.o = ir_graph_new(g->name);
    r.o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(r.o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(r.o, g->files[i]);
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (!r.forward[i]) /* a backward node: the copies it reads first */
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
                NodeId x = ir_input(g, i, (int)j);
                if (r.wanted[x] && !r.emitted[g->nodes[x].ckpt]) emit_region(&r, g->nodes[x].ckpt);
            }
        r.map[i] = emit(&r, i, false);
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(r.o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), r.map[g->outputs[k].node]);
    if (stats) {
        stats->regions = nregions;
        for (NodeId i = 0; i < g->nnodes; i++) stats->recomputed += r.copy[i] != IR_NONE;
    }
    free(r.forward);
    free(r.region_out);
    free(r.wanted);
    free(r.map);
    free(r.copy);
    free(r.emitted);
    Graph tmp = *g;
    *g = *r.o;
    *r.o = tmp;
    ir_graph_free(r.o);
    return 0;
}
