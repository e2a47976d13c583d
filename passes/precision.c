/* precision.c — mixed precision: which values of the training graph are rounded to half
 * precision (bf16 or fp16), with every conversion an explicit cast node.
 *
 * Requires: a verified graph after autodiff and simplify (forward and backward nodes).
 * Guarantees, for PrecisionOptions.half = DT_BF16 or DT_F16 (DT_F32: the graph unchanged):
 *   - matrix products take half-precision inputs and accumulate in fp32, as under PyTorch's
 *     autocast: every operand of an f32 matmul, parameters included (autocast rounds the
 *     weights too), is read as cast<half>(v) of the value v it read, through the same views
 *     (in half precision), and the matmul is an f32 node of two half operands (ir/verify.c):
 *     "half inputs, fp32 accumulation". The C target widens the operands panel by panel
 *     inside its GEMM (runtime/kiln_gemm.h) and calls sgemm; the CUDA target hands the half
 *     arrays to cuBLAS's tensor cores with fp32 accumulation. No fp32 copy of an operand is
 *     stored; a parameter's half copy is made where the forward pass first reads it and
 *     again where the backward pass does (narrow_of);
 *   - activations kept for the backward pass are stored in half precision: every f32 value
 *     of the forward pass that a backward node reads is read there as
 *     cast<f32>(cast<half>(v)) (or, by a matrix product, as cast<half>(v)), so what lives
 *     from the forward to the backward pass is the half-precision copy (memplan frees v
 *     after its last forward reader). Kept in f32: parameters (the fp32 masters: the
 *     optimizer, the gradients and the checkpoints see only f32), inputs, constants,
 *     scalars, and row statistics (reductions and the elementwise values computed from them
 *     alone: the mean, variance, reciprocal standard deviation of a norm, a softmax's max
 *     and sum, a fused attention's log-sum-exp), which are small and precision-critical;
 *   - everything else (softmax, norms, losses, exp/log, reductions, the backward's
 *     elementwise arithmetic, the optimizer) computes in fp32 as before.
 * One cast<half> per value, right after it (a weight's: one per pass); one cast<f32> of it
 * for the backward pass, right before its first reader there, which fusion computes in the
 * readers' kernels (a load and a conversion, no kernel of its own), and the narrowing in
 * the producer's. gradcheck does not run this pass: it checks the exact graph in double
 * precision. ir_verify() holds. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const Graph *g;
    Graph *o;
    DType half;
    bool stochastic; /* the parameters' copies rounded stochastically (PrecisionOptions) */
    int64_t stream0; /* their noise: stream stream0 + the parameter's node id */
    NodeId *noise;   /* old parameter -> its random_uniform in the new graph, or IR_NONE */
    bool *forward; /* per node: the forward outputs, the loss or the metrics depend on it */
    bool *stat;    /* per node: a row statistic (see the header) */
    NodeId *map;   /* old node -> new graph */
    NodeId *narrow; /* old node -> its cast<half> in the new graph, or IR_NONE */
    NodeId *narrow_backward; /* old leaf -> the cast<half> the backward pass's products read */
    NodeId *widen; /* old forward value -> the cast<f32> of its half copy that the backward reads */
    NodeId *copy;  /* old forward node -> its copy for the backward pass, or IR_NONE */
    bool *half_read; /* per node: a backward value that a product reads in half precision */
    FusionPlan plan; /* of the graph before the pass: which values a kernel stores */
    PrecisionStats *st;
} Prec;

static bool is_view(Op op) { return op == OP_RESHAPE || op == OP_DETACH || op == OP_PERMUTE || op == OP_SLICE || op == OP_EXPAND; }

static bool is_leaf(Op op)
{
    return op == OP_PARAM || op == OP_INPUT || op == OP_CONST || op == OP_IOTA || op == OP_RANDOM_UNIFORM || op == OP_LOSS_SCALE;
}

/* The value a chain of views reads. */
static NodeId view_root(const Graph *g, NodeId x)
{
    while (is_view((Op)g->nodes[x].op)) x = ir_input(g, x, 0);
    return x;
}

/* The attention whose log-sum-exp attention_lse i is (ir_same_attention), or IR_NONE:
 * fusion computes both in one kernel. */
static NodeId lse_sibling(const Graph *g, NodeId i)
{
    const Node *n = &g->nodes[i];
    NodeId first = 0;
    for (uint32_t j = 0; j < n->ninputs; j++) first = ir_input(g, i, (int)j) > first ? ir_input(g, i, (int)j) : first;
    for (NodeId s = i - 1; s > first; s--)
        if (g->nodes[s].op == OP_ATTENTION && ir_same_attention(g, s, i)) return s;
    return IR_NONE;
}

/* What the forward outputs, the loss and the metrics depend on; and a fused attention's
 * log-sum-exp with its attention (one kernel computes both, from the same q, k, v: the
 * backward's half copies are for the backward's own reads). */
static void mark_forward(Prec *p)
{
    const Graph *g = p->g;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind != OUT_GRAD) p->forward[g->outputs[k].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--) {
        if (!p->forward[i] && g->nodes[i].op == OP_ATTENTION_LSE && !(g->nodes[i].flags & NODE_BACKWARD)) {
            const NodeId s = lse_sibling(g, i);
            p->forward[i] = s != IR_NONE && p->forward[s];
        }
        if (p->forward[i])
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) p->forward[ir_input(g, i, (int)j)] = true;
    }
}

/* Reductions, and elementwise values of reductions and constants only. */
static void mark_stats(Prec *p)
{
    const Graph *g = p->g;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        const OpInfo *info = &ir_op_info[n->op];
        if (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX || n->op == OP_ATTENTION_LSE) { /* a fused attention's log-sum-exp too */
            p->stat[i] = true;
            continue;
        }
        if (!(info->flags & (OPF_UNARY | OPF_BINARY)) && n->op != OP_WHERE && n->op != OP_RESHAPE) continue;
        bool any = false, all = true;
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            Op xop = (Op)g->nodes[x].op;
            if (xop == OP_CONST || (xop == OP_EXPAND && g->nodes[view_root(g, x)].op == OP_CONST)) continue;
            any = true;
            all = all && p->stat[x];
        }
        p->stat[i] = any && all;
    }
}

/* Node i of the old graph again, on new inputs, of dtype t. */
static NodeId add_typed(Prec *p, NodeId i, DType t, const NodeId *in)
{
    const Graph *g = p->g;
    const Node *n = &g->nodes[i];
    NodeId id = ir_add_node(p->o, (Op)n->op, t, &n->shape, in, (int)n->ninputs, ir_attrs(g, i), (int)n->nattrs, n->loc);
    Node *m = &p->o->nodes[id];
    m->fattr[0] = n->fattr[0];
    m->fattr[1] = n->fattr[1];
    m->ckpt = n->ckpt;
    m->flags = n->flags;
    ir_copy_scope(p->o, id, g, i);
    if (n->name) ir_set_name(p->o, id, ir_str(g, n->name));
    return id;
}

static NodeId add_like(Prec *p, NodeId i, const NodeId *in) { return add_typed(p, i, (DType)p->g->nodes[i].dtype, in); }

/* scope_of: the old graph's node whose module the cast belongs to (Node.scope) */
static NodeId add_cast(Prec *p, NodeId x, DType t, Loc loc, int32_t ckpt, NodeId scope_of)
{
    const Node *n = &p->o->nodes[x];
    Shape s = n->shape;
    NodeId id = ir_add_node(p->o, OP_CAST, t, &s, &x, 1, NULL, 0, loc);
    p->o->nodes[id].ckpt = ckpt;
    ir_copy_scope(p->o, id, p->g, scope_of);
    return id;
}

/* The half-precision copy of value x (old graph) that `reader` reads, made here where none
 * is yet: a gradient that a backward product reads (rounded in the kernel that computes
 * it), or a leaf (a parameter, an input). A leaf is narrowed where a pass first reads it,
 * once for the forward pass's products and once again for the backward pass's, so that no
 * half copy of the weights lives from the forward pass to the backward (gpt2-124m: 248 MB
 * of bf16 weights, which the f32 masters can give again at the cost of one more pass over
 * them). */
static NodeId narrow_of(Prec *p, NodeId x, NodeId reader)
{
    const Node *n = &p->g->nodes[x];
    NodeId *slot = is_leaf((Op)n->op) && !p->forward[reader] ? &p->narrow_backward[x] : &p->narrow[x];
    if (*slot != IR_NONE) return *slot;
    const Loc loc = p->g->nodes[reader].loc;
    const int32_t ckpt = p->forward[reader] ? p->g->nodes[reader].ckpt : 0;
    if (p->stochastic && n->op == OP_PARAM) {
        /* One noise per parameter and step, read by both passes' copies, which are then the
         * same bits: the backward pass differentiates the weights the forward pass used. */
        if (p->noise[x] == IR_NONE) {
            const int64_t stream = p->stream0 + x;
            p->noise[x] = ir_add_node(p->o, OP_RANDOM_UNIFORM, DT_F32, &n->shape, NULL, 0, &stream, 1, loc);
            ir_copy_scope(p->o, p->noise[x], p->g, reader);
        }
        const NodeId in[2] = {p->map[x], p->noise[x]};
        *slot = ir_add_node(p->o, OP_ROUND_STOCHASTIC, DT_BF16, &n->shape, in, 2, NULL, 0, loc);
        p->o->nodes[*slot].ckpt = ckpt;
        ir_copy_scope(p->o, *slot, p->g, reader);
    } else {
        *slot = add_cast(p, p->map[x], p->half, loc, ckpt, reader);
    }
    p->st->narrowed++;
    return *slot;
}

/* Operand x (old graph) of matrix product `reader`, in half precision: the views from its
 * root to x applied again, in half precision, to the root's half copy. */
static NodeId half_operand(Prec *p, NodeId x, NodeId reader)
{
    const Graph *g = p->g;
    if (is_view((Op)g->nodes[x].op)) {
        NodeId in = half_operand(p, ir_input(g, x, 0), reader);
        return add_typed(p, x, p->half, &in);
    }
    return narrow_of(p, x, reader);
}

/* Operand x (old graph) of backward node `reader` (not a matrix product) read through a
 * half-precision copy of its root: the views from the root to x applied again to
 * cast<f32>(cast<half>(root)), one widening shared by the backward pass's readers. Shared,
 * the recomputed values read from it start one kernel, not one each: with a widening per
 * reader, GELU's backward was four kernels storing four fp32 intermediates. */
static NodeId through_half(Prec *p, NodeId x, NodeId reader)
{
    const Graph *g = p->g;
    if (is_view((Op)g->nodes[x].op)) {
        NodeId in = through_half(p, ir_input(g, x, 0), reader);
        return add_like(p, x, &in);
    }
    if (p->widen[x] != IR_NONE) return p->widen[x];
    p->st->widened++;
    NodeId w = add_cast(p, narrow_of(p, x, reader), DT_F32, g->nodes[reader].loc, 0, reader);
    /* kept out of the forward kernel that computes the half copy (fusion.c): there it would
     * be stored in f32 until the backward pass reads it */
    p->o->nodes[w].flags |= NODE_RECOMPUTED;
    p->widen[x] = w;
    return w;
}

static NodeId backward_value(Prec *p, NodeId u, NodeId reader);

/* Operand x of backward node `reader`, a forward value: the value kernels store is read
 * through its half-precision copy; a cheap elementwise value that fusion would compute again
 * in the reading kernel (GELU's tanh from the stored pre-activation) is computed again
 * here, as a backward node, from the half-precision copies of what it is computed from.
 * Views are applied again on top. Row statistics, leaves and non-f32 values: as they are. */
typedef enum { BW_AS_IS, BW_COPY, BW_HALF } BackwardRead;

static BackwardRead backward_read(const Prec *p, NodeId u)
{
    const Graph *g = p->g;
    const Node *n = &g->nodes[u];
    const OpInfo *info = &ir_op_info[n->op];
    if (!p->forward[u] || is_leaf((Op)n->op)) return BW_AS_IS;
    /* A maximum is one of its operand's values, and the backward pass compares it with them
     * (max pooling's mask, eq(x, max)): it reads the maximum rounded as it reads the operand,
     * or no rounded element would equal the fp32 maximum, the mask would be empty and the
     * gradient 0/0 (cnn's first step: NaN). Rounding is monotonic: the rounded maximum is the
     * maximum of the rounded values. */
    if (n->op == OP_REDUCE_MAX && n->dtype == DT_F32 && !p->stat[ir_input(g, u, 0)]) return BW_HALF;
    if (p->stat[u]) return BW_AS_IS;
    const bool view = is_view((Op)n->op), elementwise = (info->flags & (OPF_UNARY | OPF_BINARY)) || n->op == OP_WHERE;
    const bool recomputed = p->plan.role[u] == ROLE_KERNEL && (!p->plan.stored[u] || p->plan.recomputed[u]);
    if (view || (elementwise && recomputed)) return BW_COPY;
    if (n->dtype != DT_F32 || ir_shape_max_numel(g, &n->shape) <= 1) return BW_AS_IS;
    if (n->op == OP_CAST && !ir_dtype_is_float((DType)g->nodes[ir_input(g, u, 0)].dtype)) return BW_AS_IS;
    return BW_HALF;
}

/* The forward values that backward_value reads through half-precision copies. */
static void mark_backward_reads(const Prec *p, NodeId u, bool *narrowed, bool *seen)
{
    if (seen[u]) return;
    seen[u] = true;
    BackwardRead how = backward_read(p, u);
    if (how == BW_HALF) narrowed[u] = true;
    if (how == BW_COPY)
        for (uint32_t k = 0; k < p->g->nodes[u].ninputs; k++) mark_backward_reads(p, ir_input(p->g, u, (int)k), narrowed, seen);
}

static NodeId backward_value(Prec *p, NodeId u, NodeId reader)
{
    const Graph *g = p->g;
    const Node *n = &g->nodes[u];
    BackwardRead how = backward_read(p, u);
    if (how == BW_AS_IS) return p->map[u];
    if (p->copy[u] != IR_NONE) return p->copy[u];
    if (how == BW_COPY) {
        NodeId ins[3];
        for (uint32_t k = 0; k < n->ninputs; k++) ins[k] = backward_value(p, ir_input(g, u, (int)k), u);
        NodeId c = add_like(p, u, ins);
        p->o->nodes[c].ckpt = 0;
        p->o->nodes[c].flags |= NODE_RECOMPUTED;
        p->copy[u] = c;
        p->st->copied++;
        return c;
    }
    return through_half(p, u, reader);
}

/* Does node i read its operands in half precision: an f32 matrix product? */
static bool reads_half(const Prec *p, NodeId i) { return p->g->nodes[i].op == OP_MATMUL && p->g->nodes[i].dtype == DT_F32; }

/* Does backward node i, a sum, read its operand x through the half-precision copy that the
 * backward products read? A gradient that products read in half precision is, under
 * autocast, a half-precision tensor (a product's output gradient), and a bias gradient is
 * its sum over the batch; reading the copy instead of the fp32 value halves what the sum
 * reads, and where the sum was the fp32 value's only other reader the fp32 value is no
 * longer stored at all (gpt's GELU backward then fuses into its product's epilogue, which
 * stores only the half copy). The rounding errors of the summed elements are independent
 * and the sum accumulates in fp32. Other backward readers (the residual stream's
 * gradient, elementwise arithmetic) keep reading the fp32 value. */
static bool sums_half_copy(const Prec *p, NodeId i, NodeId x)
{
    const Graph *g = p->g;
    const NodeId r = view_root(g, x);
    return g->nodes[i].op == OP_REDUCE_SUM && g->nodes[i].dtype == DT_F32 && !p->forward[i] && p->half_read[r];
}

/* Values that some reader takes in half precision: narrowed right after they are computed
 * (forward values; the backward pass's gradients are narrowed where a product first reads
 * them, narrow_of, and marked in p->half_read). */
static void mark_narrowed(Prec *p, bool *narrowed)
{
    const Graph *g = p->g;
    bool *seen = xcalloc((size_t)g->nnodes + 1, 1);
    for (NodeId i = 0; i < g->nnodes; i++)
        for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) {
            NodeId x = ir_input(g, i, (int)j);
            if (reads_half(p, i)) {
                const NodeId r = view_root(g, x);
                if (p->forward[r] && !is_leaf((Op)g->nodes[r].op)) narrowed[r] = true;
                if (!p->forward[r] && !is_leaf((Op)g->nodes[r].op) && g->nodes[r].dtype == DT_F32) p->half_read[r] = true;
            } else if (!p->forward[i] && p->forward[x]) {
                mark_backward_reads(p, x, narrowed, seen);
            }
        }
    free(seen);
}

/* g without the nodes no output depends on (the forward pass's views that the backward pass
 * read before it read them through half-precision copies), renumbered in the same order. */
static Graph *without_dead_nodes(const Graph *g)
{
    size_t nn = (size_t)g->nnodes + 1;
    bool *live = xcalloc(nn, 1);
    NodeId *map = xmalloc(nn * sizeof *map);
    for (int32_t k = 0; k < g->noutputs; k++) live[g->outputs[k].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0; i--)
        if (live[i])
            for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) live[ir_input(g, i, (int)j)] = true;
    Graph *o = ir_graph_new(g->name);
    o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(o, g->files[i]);
    NodeId ins[64];
    for (NodeId i = 0; i < g->nnodes; i++) {
        map[i] = IR_NONE;
        if (!live[i]) continue;
        const Node *n = &g->nodes[i];
        NodeId *in = n->ninputs <= 64 ? ins : xmalloc(n->ninputs * sizeof *in);
        for (uint32_t k = 0; k < n->ninputs; k++) in[k] = map[ir_input(g, i, (int)k)];
        map[i] = ir_add_node(o, (Op)n->op, (DType)n->dtype, &n->shape, in, (int)n->ninputs, ir_attrs(g, i), (int)n->nattrs, n->loc);
        if (in != ins) free(in);
        Node *m = &o->nodes[map[i]];
        m->fattr[0] = n->fattr[0];
        m->fattr[1] = n->fattr[1];
        m->ckpt = n->ckpt;
        m->flags = n->flags;
        ir_copy_scope(o, map[i], g, i);
        if (n->name) ir_set_name(o, map[i], ir_str(g, n->name));
    }
    for (int32_t k = 0; k < g->noutputs; k++) ir_add_output(o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), map[g->outputs[k].node]);
    free(live);
    free(map);
    return o;
}

int pass_precision(Graph *g, const PrecisionOptions *opt, PrecisionStats *stats, StrBuf *err)
{
    PrecisionStats st;
    memset(&st, 0, sizeof st);
    DType half = opt ? opt->half : DT_F32;
    if (half == DT_F32) {
        if (stats) *stats = st;
        return 0;
    }
    if (half != DT_BF16 && half != DT_F16) {
        sb_printf(err, "precision: %s is not a half-precision dtype (bf16 or f16)", ir_dtype_name(half));
        return -1;
    }
    if (opt->stochastic_weights && half != DT_BF16) {
        sb_printf(err, "precision: stochastic rounding of the weights is bf16's, not %s's", ir_dtype_name(half));
        return -1;
    }
    Prec p = {.g = g, .half = half, .st = &st, .stochastic = opt->stochastic_weights && g->mode == MODE_TRAIN};
    size_t nn = (size_t)g->nnodes + 1;
    p.forward = xcalloc(nn, 1);
    p.stat = xcalloc(nn, 1);
    p.half_read = xcalloc(nn, 1);
    bool *narrowed = xcalloc(nn, 1);
    p.map = xmalloc(nn * sizeof *p.map);
    p.narrow = xmalloc(nn * sizeof *p.narrow);
    p.narrow_backward = xmalloc(nn * sizeof *p.narrow_backward);
    p.widen = xmalloc(nn * sizeof *p.widen);
    p.copy = xmalloc(nn * sizeof *p.copy);
    p.noise = xmalloc(nn * sizeof *p.noise);
    for (NodeId i = 0; i < g->nnodes; i++) p.copy[i] = p.noise[i] = IR_NONE;
    /* the noise streams follow the graph's own (dropout's) */
    p.stream0 = 1;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_RANDOM_UNIFORM && ir_attrs(g, i)[0] >= p.stream0) p.stream0 = ir_attrs(g, i)[0] + 1;
    fusion_plan(g, &p.plan);
    for (NodeId i = 0; i < g->nnodes; i++) p.map[i] = p.narrow[i] = p.narrow_backward[i] = p.widen[i] = IR_NONE;
    mark_forward(&p);
    mark_stats(&p);
    mark_narrowed(&p, narrowed);
    p.o = ir_graph_new(g->name);
    p.o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(p.o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(p.o, g->files[i]);
    NodeId ins[64];
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        NodeId *in = n->ninputs <= 64 ? ins : xmalloc(n->ninputs * sizeof *in);
        for (uint32_t k = 0; k < n->ninputs; k++) {
            NodeId x = ir_input(g, i, (int)k);
            if (reads_half(&p, i)) in[k] = half_operand(&p, x, i);
            else if (sums_half_copy(&p, i, x)) in[k] = through_half(&p, x, i);
            else if (!p.forward[i] && p.forward[x]) in[k] = backward_value(&p, x, i);
            else in[k] = p.map[x];
        }
        p.map[i] = add_like(&p, i, in);
        if (in != ins) free(in);
        if (narrowed[i] && n->op == OP_UNFOLD && g->nodes[ir_input(g, i, 0)].dtype == DT_F32) {
            /* A convolution's windows are a copy of the image, 9 times its size at 3x3: their
             * half copy is unfolded from the image's half copy (the same values), so that the
             * fp32 windows are never written (cnn: 14 MB of them beside their 7 MB copy). */
            const NodeId image = narrow_of(&p, ir_input(g, i, 0), i);
            p.narrow[i] = add_typed(&p, i, half, &image);
        } else if (narrowed[i]) {
            p.narrow[i] = add_cast(&p, p.map[i], half, n->loc, n->ckpt, i);
            st.narrowed++;
        }
    }
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(p.o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), p.map[g->outputs[k].node]);
    Graph *live = without_dead_nodes(p.o);
    ir_graph_free(p.o);
    Graph tmp = *g;
    *g = *live;
    *live = tmp;
    ir_graph_free(live);
    free(p.forward);
    free(p.stat);
    free(p.half_read);
    free(narrowed);
    free(p.map);
    free(p.narrow);
    free(p.narrow_backward);
    free(p.widen);
    free(p.copy);
    free(p.noise);
    fusion_free(&p.plan);
    if (stats) *stats = st;
    return 0;
}
