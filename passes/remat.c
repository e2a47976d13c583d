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
 * Under a memory budget (RematOptions.arena_budget: bytes of training activations) the
 * calls of the model's own modules from forward (blocks, Node.ckpt from IR_CKPT_AUTO) are
 * candidate regions too: each is planned alone (fusion and memplan of the graph with it
 * checkpointed), ranked by activation bytes saved per matrix-product FLOP recomputed, and
 * taken in that order until the plan fits (PyTorch's and Checkmate's trade-off, greedy).
 * If even every block checkpointed does not fit, the pass fails with the smallest figure;
 * RematOptions.want_floor asks for that figure (the least any budget can reach) anyway.
 *
 * Simplify must not run after this pass: CSE would merge the copies back. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *g;
    Graph *o;
    const int32_t *reg; /* per node: its region if that region is recomputed, else 0 */
    bool *forward;     /* per node: a forward node */
    bool *region_out;  /* per node: a region's value that a forward node outside it reads */
    bool *wanted;      /* per node: a backward node reads a copy of it (transitively) */
    NodeId *map;       /* old node -> new graph */
    NodeId *copy;      /* old node -> its copy in the new graph (IR_NONE: none yet) */
    bool *emitted;     /* per region: its copies are in the new graph */
    const bool *cheap; /* per node: a cheap value recomputed where the backward reads it (or NULL) */
} Remat;

/* Is x a value that the backward pass reads a copy of instead of the original? */
static bool copied(const Remat *r, NodeId x)
{
    const Node *n = &r->g->nodes[x];
    if (r->cheap && r->cheap[x]) return r->forward[x];
    return r->forward[x] && r->reg[x] > 0 && !r->region_out[x] && n->op != OP_PARAM && n->op != OP_INPUT;
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
            if (r->reg[x] > 0 && r->reg[x] != r->reg[i]) r->region_out[x] = true;
        }
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_GRAD && r->reg[g->outputs[k].node] > 0) r->region_out[g->outputs[k].node] = true;
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
                /* a region's copies read copies within the region; a cheap copy reads cheap copies */
                const bool cheap_chain = r->cheap && r->cheap[i] && r->cheap[x];
                if (copied(r, x) && (cheap_chain || (r->reg[x] == r->reg[i] && !(r->cheap && r->cheap[x])))) r->wanted[x] = true;
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
    ir_copy_scope(r->o, id, g, i);
    if (n->name) ir_set_name(r->o, id, ir_str(g, n->name));
    return id;
}

/* The copies of region c, in node order (each after the copies it reads). */
static void emit_region(Remat *r, int32_t c)
{
    const Graph *g = r->g;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (r->wanted[i] && r->reg[i] == c && !(r->cheap && r->cheap[i])) r->copy[i] = emit(r, i, true);
    r->emitted[c] = true;
}

/* The copy of cheap value x, after the copies of the cheap values it is computed from:
 * right before the backward node that first reads it, so that fusion can put it in that
 * node's kernel. */
static void emit_cheap(Remat *r, NodeId x)
{
    const Graph *g = r->g;
    for (uint32_t j = 0; j < g->nodes[x].ninputs; j++) {
        NodeId y = ir_input(g, x, (int)j);
        if (r->wanted[y] && r->cheap[y] && r->copy[y] == IR_NONE) emit_cheap(r, y);
    }
    r->copy[x] = emit(r, x, true);
}

/* The graph with the regions of `reg` and the cheap values of `cheap` (or NULL)
 * recomputed, as a new graph (g unchanged); the number of copies in *ncopies. */
static Graph *rematerialise(const Graph *g, const int32_t *reg, int32_t nregions, const bool *cheap, int32_t *ncopies, int32_t *nmoved)
{
    Remat r = {.g = g, .reg = reg, .cheap = cheap};
    size_t nn = (size_t)g->nnodes + 1;
    r.forward = xcalloc(nn, 1);
    r.region_out = xcalloc(nn, 1);
    r.wanted = xcalloc(nn, 1);
    r.map = xmalloc(nn * sizeof *r.map);
    r.copy = xmalloc(nn * sizeof *r.copy);
    r.emitted = xcalloc((size_t)nregions + 1, 1);
    for (NodeId i = 0; i < g->nnodes; i++) r.map[i] = r.copy[i] = IR_NONE;
    mark_forward(&r);
    /* a value built inside a recomputed region that only the backward pass reads (the
     * key matrix of attention, whose transpose the forward reads) is recomputed with its
     * region too, and not computed in the forward pass at all: otherwise it keeps the
     * region's values alive */
    bool *backward_only = xcalloc(nn, 1);
    for (NodeId i = 0; i < g->nnodes; i++)
        if (reg[i] > 0 && !r.forward[i]) backward_only[i] = r.forward[i] = true;
    mark_wanted(&r);
    r.o = ir_graph_new(g->name);
    r.o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(r.o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(r.o, g->files[i]);
    /* Copies are made for the backward pass proper, after the last forward node: a node
     * that only the backward pass reads but that is built in the forward pass (the key
     * matrix of attention, whose transpose the forward reads) reads the originals there. */
    /* (the values moved to the backward pass do not count: mixed precision's half copies of
     * a region's values can come after the first backward node) */
    NodeId forward_end = -1;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (r.forward[i] && !backward_only[i]) forward_end = i;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (!r.forward[i] && i > forward_end) /* a backward node: the copies it reads first */
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
                NodeId x = ir_input(g, i, (int)j);
                if (!r.wanted[x]) continue;
                if (cheap && cheap[x]) {
                    if (r.copy[x] == IR_NONE) emit_cheap(&r, x);
                } else if (!r.emitted[reg[x]]) {
                    emit_region(&r, reg[x]);
                }
            }
        if (!backward_only[i]) r.map[i] = emit(&r, i, false);
    }
    if (nmoved) {
        *nmoved = 0;
        for (NodeId i = 0; i < g->nnodes; i++) *nmoved += backward_only[i];
    }
    free(backward_only);
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(r.o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), r.map[g->outputs[k].node]);
    *ncopies = 0;
    for (NodeId i = 0; i < g->nnodes; i++) *ncopies += r.copy[i] != IR_NONE;
    free(r.forward);
    free(r.region_out);
    free(r.wanted);
    free(r.map);
    free(r.copy);
    free(r.emitted);
    return r.o;
}

/* ---- cheap values ----
 *
 * Under a memory budget, when checkpointing every block is not enough, the values that are cheap to compute again
 * (elementwise maths, views, casts, constants: JAX's `dots_saveable` keeps the others)
 * and that the backward pass reads are recomputed where it reads them instead of kept:
 * GELU's output from its input, a normalised row from the row and its statistics,
 * cross-entropy's exponentials from the logits and their row maxima. A copy reads the
 * originals of the values it is computed from; chains are at most CHEAP_DEPTH ops long,
 * so that a residual stream (one add per layer) is not recomputed from the embeddings. */
#define CHEAP_DEPTH 6

static bool cheap_op(const Node *n)
{
    const uint16_t f = ir_op_info[n->op].flags;
    if (n->op == OP_CHECK_INDEX || n->op == OP_PARAM || n->op == OP_INPUT) return false;
    return (f & (OPF_UNARY | OPF_BINARY | OPF_SHAPE)) || n->op == OP_WHERE || n->op == OP_CONST || n->op == OP_IOTA ||
           n->op == OP_RANDOM_UNIFORM;
}

/* Per node: a cheap value outside the recomputed regions (reg), of a short enough chain. */
static bool *cheap_values(const Graph *g, const int32_t *reg)
{
    bool *cheap = xcalloc((size_t)g->nnodes + 1, 1);
    int32_t *depth = xcalloc((size_t)g->nnodes + 1, sizeof *depth);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (reg[i] > 0 || !cheap_op(n)) continue;
        int32_t d = 0;
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            if (cheap[x] && depth[x] > d) d = depth[x];
        }
        depth[i] = d + 1;
        cheap[i] = depth[i] <= CHEAP_DEPTH;
    }
    free(depth);
    return cheap;
}

/* A candidate plan's training activations, counted for --time-passes. */
static int64_t candidate_arena(const Graph *g, int32_t *planned)
{
    (*planned)++;
    return memplan_arena_of(g);
}

void remat_matmul_flops(const Graph *g, double *all, double *recomputed)
{
    *all = *recomputed = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_MATMUL) continue;
        const Shape *a = &g->nodes[ir_input(g, i, 0)].shape;
        const Shape k = {.rank = 1, .d = {a->d[a->rank - 1]}};
        const double f = 2.0 * (double)ir_shape_max_numel(g, &n->shape) * (double)ir_shape_max_numel(g, &k);
        *all += f;
        if (n->flags & NODE_RECOMPUTED) *recomputed += f;
    }
}

/* Region numbers dense from 1: checkpoint(...) regions keep theirs, blocks follow them. */
typedef struct {
    int32_t *dense;    /* per node: its dense region, 0 = none */
    int32_t nexplicit; /* dense 1 ... nexplicit: checkpoint(...) regions */
    int32_t nregions;  /* then the blocks, up to nregions */
} Regions;

static void number_regions(const Graph *g, Regions *R)
{
    R->dense = xcalloc((size_t)g->nnodes + 1, sizeof *R->dense);
    int32_t maxexp = 0, maxauto = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const int32_t c = g->nodes[i].ckpt;
        if (c >= IR_CKPT_AUTO) maxauto = c - IR_CKPT_AUTO > maxauto ? c - IR_CKPT_AUTO : maxauto;
        else if (c > maxexp) maxexp = c;
    }
    R->nexplicit = maxexp;
    R->nregions = maxexp + maxauto;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const int32_t c = g->nodes[i].ckpt;
        R->dense[i] = c >= IR_CKPT_AUTO ? maxexp + (c - IR_CKPT_AUTO) : c > 0 ? c : 0;
    }
}

/* reg for the regions `on` (per dense region). */
static void select_regions(const Graph *g, const Regions *R, const bool *on, int32_t *reg)
{
    for (NodeId i = 0; i < g->nnodes; i++) reg[i] = R->dense[i] && on[R->dense[i]] ? R->dense[i] : 0;
}

static void replace_graph(Graph *g, Graph *o)
{
    Graph tmp = *g;
    *g = *o;
    *o = tmp;
    ir_graph_free(o);
}

/* Each block alone, checkpointed beside the regions `on` already has: bytes saved per
 * matrix-product FLOP recomputed, best first (ties in model order) into order[nb]. */
static void rank_blocks(const Graph *g, const Regions *R, bool *on, int32_t *reg, int64_t base_arena, int32_t *order, int32_t *planned)
{
    const int32_t nb = R->nregions - R->nexplicit;
    double *rank = xcalloc((size_t)nb + 1, sizeof *rank);
    int32_t nc;
    for (int32_t b = 0; b < nb; b++) {
        const int32_t c = R->nexplicit + 1 + b;
        on[c] = true;
        select_regions(g, R, on, reg);
        Graph *t = rematerialise(g, reg, R->nregions, NULL, &nc, NULL);
        double all, flops;
        remat_matmul_flops(t, &all, &flops);
        const double saved = (double)(base_arena - candidate_arena(t, planned));
        ir_graph_free(t);
        on[c] = false;
        rank[b] = saved / (flops > 0 ? flops : 1);
        order[b] = b;
    }
    for (int32_t a = 0; a < nb; a++)
        for (int32_t b = a + 1; b < nb; b++)
            if (rank[order[b]] > rank[order[a]]) {
                int32_t t = order[a];
                order[a] = order[b];
                order[b] = t;
            }
    free(rank);
}

/* A plan of the budget search: its activations, blocks and cheap values. */
typedef struct {
    int64_t arena;
    int32_t blocks;
    bool cheap;
} Plan;

/* The budget search from the regions `on` (base_arena its activations): the blocks in rank
 * order until the plan fits, then the cheap values, last: they cost more time than their
 * FLOPs say (the recomputed chains slow the backward kernels they join: gpt's step 1.7x
 * under a halfway budget with them, 1.0x without; bench/results/remat-*). `on` and the
 * returned plan are where it stops; *least is the smallest plan on the way, the figure to
 * give when none fits (checkpointing a block need not lower the peak). With a budget of 1
 * byte it goes the whole way: *least is then the smallest plan any budget can reach. */
static Plan search_budget(const Graph *g, const Regions *R, bool *on, int32_t *reg, const int32_t *order, int64_t budget,
                          int64_t base_arena, Plan *least, int32_t *planned)
{
    const int32_t nb = R->nregions - R->nexplicit;
    Plan at = {base_arena, 0, false};
    *least = at;
    int32_t nc;
    for (int32_t k = 0; k < nb && at.arena > budget; k++) {
        on[R->nexplicit + 1 + order[k]] = true;
        select_regions(g, R, on, reg);
        Graph *t = rematerialise(g, reg, R->nregions, NULL, &nc, NULL);
        at.arena = candidate_arena(t, planned);
        ir_graph_free(t);
        at.blocks++;
        if (at.arena < least->arena) *least = at;
    }
    if (at.arena > budget) {
        select_regions(g, R, on, reg);
        bool *c = cheap_values(g, reg);
        Graph *t = rematerialise(g, reg, R->nregions, c, &nc, NULL);
        const int64_t a = candidate_arena(t, planned);
        ir_graph_free(t);
        free(c);
        if (a < at.arena) {
            at.arena = a;
            at.cheap = true;
            if (a < least->arena) *least = at;
        }
    }
    return at;
}

int pass_remat(Graph *g, RematOptions *opt, RematStats *stats, StrBuf *err)
{
    RematStats st;
    memset(&st, 0, sizeof st);
    Regions R;
    number_regions(g, &R);
    const int32_t nb = R.nregions - R.nexplicit;
    bool *on = xcalloc((size_t)R.nregions + 1, 1);
    int32_t *reg = xmalloc(((size_t)g->nnodes + 1) * sizeof *reg);
    for (int32_t c = 1; c <= R.nexplicit; c++) on[c] = true; /* the model's checkpoint(...) */
    st.regions = R.nexplicit;
    int rc = 0;
    bool use_cheap = false, *cheap = NULL;
    const int64_t budget = opt ? opt->arena_budget : 0;
    const bool want_floor = opt && opt->want_floor;
    if (budget > 0 || want_floor) {
        select_regions(g, &R, on, reg);
        int32_t nc;
        Graph *base = rematerialise(g, reg, R.nregions, NULL, &nc, NULL);
        int64_t base_arena = candidate_arena(base, &st.candidates);
        ir_graph_free(base);
        st.arena_without_blocks = base_arena;
        int32_t *order = xmalloc(((size_t)nb + 1) * sizeof *order);
        bool ranked = false;
        Plan least = {base_arena, 0, false};
        if (budget > 0 && base_arena > budget) {
            rank_blocks(g, &R, on, reg, base_arena, order, &st.candidates);
            ranked = true;
            const Plan at = search_budget(g, &R, on, reg, order, budget, base_arena, &least, &st.candidates);
            st.blocks = at.blocks;
            use_cheap = at.cheap;
            if (at.arena > budget) {
                sb_printf(err, "the memory budget cannot be met: the smallest plan a budget can reach, %d of the model's %d block%s "
                               "checkpointed%s, takes %lld bytes (%.1f MiB) of training activations, %lld more than the budget leaves them",
                          least.blocks, nb, nb == 1 ? "" : "s", least.cheap ? " and cheap values recomputed" : "", (long long)least.arena,
                          (double)least.arena / 1048576.0, (long long)(least.arena - budget));
                opt->smallest_arena = least.arena;
                opt->blocks = least.blocks;
                opt->cheap = least.cheap;
                rc = -1;
            }
        }
        if (want_floor) { /* the search with nothing that fits, from the model's own regions */
            if (!rc) {
                bool *from = xcalloc((size_t)R.nregions + 1, 1);
                for (int32_t c = 1; c <= R.nexplicit; c++) from[c] = true;
                if (!ranked) rank_blocks(g, &R, from, reg, base_arena, order, &st.candidates);
                search_budget(g, &R, from, reg, order, 1, base_arena, &least, &st.candidates);
                free(from);
            }
            opt->floor_arena = least.arena;
            opt->floor_blocks = least.blocks;
            opt->floor_cheap = least.cheap;
        }
        free(order);
    }
    if (!rc) {
        select_regions(g, &R, on, reg);
        bool any = use_cheap;
        for (int32_t c = 1; c <= R.nregions; c++) any |= on[c];
        if (any) {
            cheap = use_cheap ? cheap_values(g, reg) : NULL;
            Graph *o = rematerialise(g, reg, R.nregions, cheap, &st.recomputed, &st.moved);
            free(cheap);
            replace_graph(g, o);
        }
        st.cheap = use_cheap;
    }
    free(on);
    free(reg);
    free(R.dense);
    if (opt) {
        opt->nblocks = nb;
        if (!rc) {
            opt->blocks = st.blocks;
            opt->cheap = use_cheap;
        }
    }
    if (stats) *stats = st;
    return rc;
}
