/* fuse_attention.c — the attention pass: each attention that attention_find recognises in
 * the lowered graph (the built-ins and attention written out of primitives) is replaced by
 * one `attention` op and its `attention_lse`, so that autodiff differentiates it as a whole
 * (attention_grad: the probabilities recomputed from the log-sum-exp, never stored) and no
 * [..., T, S] tensor of scores or probabilities is planned (issue 38).
 *
 * It runs first, on the graph as lowered (before autodiff, so the backward pass is built
 * from the fused op; before precision, so the match sees f32). The unfused nodes are left
 * for the next simplify to drop: anything else that reads them (a model returning its
 * attention weights) keeps them, and computes them unfused as before.
 *
 * A match is fused when its operands fit the op (ops.h): q [..., H, T, D], k and v with
 * the same batch axes and key/value heads dividing H, all f32; a bool mask or an added
 * float one (which may need a gradient: a learned bias). k enters the op as [..., KV, S, D],
 * kᵀ's operand permuted back (a view the kernel reads in place where the layout allows).
 * On a target whose kernels take head sizes up to a limit (CUDA's: 128), a larger or
 * symbolic one stays unfused, and the pass's note says how many. Anything else stays
 * unfused. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

#include "attention.h"

typedef struct {
    const Graph *g;
    Graph *o;
    NodeId *map;
    int64_t max_head; /* the target's largest head size (0: any) */
    int nlarge;       /* attentions left unfused for a larger (or symbolic) one */
} Fuse;

static NodeId copy_node(Fuse *f, NodeId i)
{
    const Graph *g = f->g;
    const Node *n = &g->nodes[i];
    NodeId ins[8];
    NodeId *in = n->ninputs <= 8 ? ins : xmalloc(n->ninputs * sizeof *in);
    for (uint32_t k = 0; k < n->ninputs; k++) in[k] = f->map[ir_input(g, i, (int)k)];
    NodeId id = ir_add_node(f->o, (Op)n->op, (DType)n->dtype, &n->shape, in, (int)n->ninputs, ir_attrs(g, i), (int)n->nattrs, n->loc);
    if (in != ins) free(in);
    Node *m = &f->o->nodes[id];
    m->fattr[0] = n->fattr[0];
    m->fattr[1] = n->fattr[1];
    m->ckpt = n->ckpt;
    m->flags = n->flags;
    ir_copy_scope(f->o, id, g, i);
    if (n->name) ir_set_name(f->o, id, ir_str(g, n->name));
    return id;
}

/* The mask as the scores' where or add reads it ([..., T, S], the scores' shape): the
 * operand of that node that is not the scores. */
static NodeId mask_operand(const Graph *g, const AttentionMatch *m, NodeId softmax_in)
{
    const Node *x = &g->nodes[softmax_in];
    if (m->mask == ATTN_MASK_KEEP || m->mask == ATTN_MASK_DROP) return x->op == OP_WHERE ? ir_input(g, softmax_in, 0) : IR_NONE;
    if (m->mask != ATTN_MASK_ADD || x->op != OP_ADD) return IR_NONE;
    /* the operand whose broadcasts lead to the mask node attention_find found */
    for (int k = 0; k < 2; k++) {
        NodeId y = ir_input(g, softmax_in, k);
        while (y != m->mask_node && (g->nodes[y].op == OP_RESHAPE || g->nodes[y].op == OP_EXPAND)) y = ir_input(g, y, 0);
        if (y == m->mask_node) return ir_input(g, softmax_in, k);
    }
    return IR_NONE;
}

/* softmax's input (the masked, scaled scores) of a match: P = exp(x - max) / sum, possibly
 * with dropout after it. */
static NodeId softmax_input_of(const Graph *g, const AttentionMatch *m)
{
    NodeId p = ir_input(g, m->out, 0);
    if (m->dropout > 0) p = ir_input(g, ir_input(g, p, 0), 1); /* mul(where(keep, p, 0), 1/(1-rate)) */
    const NodeId e = ir_input(g, p, 0); /* div(e, sum) */
    return ir_input(g, ir_input(g, e, 0), 0); /* exp(sub(x, max)) */
}

/* k as [..., S, D] from kᵀ = permute(k, perm): k permuted by perm with its last two entries
 * swapped; the identity returns k. */
static NodeId k_rows(Fuse *f, IrBuilder *b, const AttentionMatch *m, int r)
{
    int perm[IR_MAX_RANK];
    const int64_t *p = ir_attrs(f->g, m->kt);
    bool identity = true;
    for (int i = 0; i < r; i++) {
        perm[i] = (int)p[i];
        if (i == r - 2) perm[i] = (int)p[r - 1];
        if (i == r - 1) perm[i] = (int)p[r - 2];
        identity &= perm[i] == i;
    }
    return identity ? f->map[m->k] : ir_b_permute(b, f->map[m->k], perm);
}

static bool same_dims(const Shape *a, const Shape *b, int from, int to)
{
    for (int i = from; i < to; i++)
        if (!ir_dim_eq(a->d[i], b->d[i])) return false;
    return true;
}

/* The fused attention of match m in the new graph, or IR_NONE when it does not fit. */
/* Is head size d a constant the target's kernels take? */
static bool head_fits(Dim d, int64_t max_head) { return ir_dim_is_const(d) && d.k >= 1 && d.k <= max_head; }

static NodeId fuse(Fuse *f, const AttentionMatch *m, StrBuf *err)
{
    const Graph *g = f->g;
    const Node *out = &g->nodes[m->out], *q = &g->nodes[m->q];
    const int r = q->shape.rank;
    if (r < 3 || out->dtype != DT_F32 || q->dtype != DT_F32 || g->nodes[m->k].dtype != DT_F32 || g->nodes[m->v].dtype != DT_F32) return IR_NONE;
    if (g->nodes[m->kt].op != OP_PERMUTE || (int)g->nodes[m->kt].shape.rank != r || g->nodes[m->v].shape.rank != r) return IR_NONE;
    if (m->dropout > 0 && (m->random == IR_NONE || g->nodes[m->random].op != OP_RANDOM_UNIFORM)) return IR_NONE;
    NodeId mask = IR_NONE;
    if (m->mask == ATTN_MASK_KEEP || m->mask == ATTN_MASK_DROP || m->mask == ATTN_MASK_ADD) {
        mask = mask_operand(g, m, softmax_input_of(g, m));
        if (mask == IR_NONE || g->nodes[mask].dtype != (m->mask == ATTN_MASK_ADD ? DT_F32 : DT_BOOL)) return IR_NONE;
    }
    IrBuilder b = {.g = f->o, .loc = out->loc, .ckpt = out->ckpt, .err = err};
    b.scope = out->scope ? ir_intern(f->o, ir_str(g, out->scope)) : 0;
    b.scope_loc = out->scope_loc;
    b.scope_type = out->scope_type ? ir_intern(f->o, ir_str(g, out->scope_type)) : 0;
    /* k and v: the fewer heads of a grouped-query repeat when both have them and k needs no
     * permute to be [..., KV, S, D]; else the repeated ones */
    NodeId k = k_rows(f, &b, m, r), v = f->map[m->v];
    const bool grouped = m->k_heads != m->k && m->v_heads != m->v && k == f->map[m->k] &&
                         ir_dim_eq(g->nodes[m->k_heads].shape.d[r - 3], g->nodes[m->v_heads].shape.d[r - 3]);
    if (grouped) k = f->map[m->k_heads], v = f->map[m->v_heads];
    if (k == IR_NONE) return IR_NONE;
    const Shape *qs = &q->shape, *ks = &f->o->nodes[k].shape, *vs = &f->o->nodes[v].shape;
    if (ks->rank != r || vs->rank != r || !same_dims(qs, ks, 0, r - 3) || !same_dims(qs, vs, 0, r - 3) || !ir_dim_eq(ks->d[r - 3], vs->d[r - 3]) ||
        !ir_dim_eq(ks->d[r - 2], vs->d[r - 2]) || !ir_dim_eq(qs->d[r - 1], ks->d[r - 1]))
        return IR_NONE;
    if (f->max_head && !(head_fits(qs->d[r - 1], f->max_head) && head_fits(vs->d[r - 1], f->max_head))) {
        f->nlarge++;
        return IR_NONE;
    }
    if (!ir_dim_eq(qs->d[r - 3], ks->d[r - 3]) &&
        !(ir_dim_is_const(qs->d[r - 3]) && ir_dim_is_const(ks->d[r - 3]) && ks->d[r - 3].k > 0 && qs->d[r - 3].k % ks->d[r - 3].k == 0))
        return IR_NONE;
    NodeId ops[4] = {f->map[m->q], k, v, mask == IR_NONE ? IR_NONE : f->map[mask]};
    const int n = mask == IR_NONE ? 3 : 4;
    const int64_t stream = m->dropout > 0 ? ir_attrs(g, m->random)[0] : 0;
    const double rate = m->dropout > 0 ? m->dropout : 0;
    NodeId a = ir_b_attention(&b, OP_ATTENTION, ops, n, m->mask, m->scale, rate, stream, 0);
    if (a == IR_NONE) return IR_NONE;
    /* its log-sum-exp beside it: the backward pass reads it (simplify drops it otherwise) */
    ir_b_attention(&b, OP_ATTENTION_LSE, ops, n, m->mask, m->scale, rate, stream, 0);
    if (out->name) ir_set_name(f->o, a, ir_str(g, out->name));
    return a;
}

int pass_fuse_attention(Graph *g, int64_t max_head, int *nfused, int *nlarge, StrBuf *err)
{
    *nfused = *nlarge = 0;
    AttentionMatch *matches = NULL;
    const int nm = attention_find(g, &matches);
    if (!nm) return 0;
    Fuse f = {.g = g, .max_head = max_head};
    int32_t *match_of = xmalloc((size_t)g->nnodes * sizeof *match_of);
    for (NodeId i = 0; i < g->nnodes; i++) match_of[i] = -1;
    for (int k = 0; k < nm; k++) match_of[matches[k].out] = k;
    f.o = ir_graph_new(g->name);
    f.o->mode = g->mode;
    for (int i = 0; i < g->nsyms; i++) ir_add_symbol(f.o, g->syms[i].name, g->syms[i].max);
    for (int i = 0; i < g->nfiles; i++) ir_add_file(f.o, g->files[i]);
    f.map = xmalloc((size_t)g->nnodes * sizeof *f.map);
    StrBuf why;
    sb_init(&why);
    for (NodeId i = 0; i < g->nnodes; i++) {
        NodeId r = match_of[i] >= 0 ? fuse(&f, &matches[match_of[i]], &why) : IR_NONE;
        if (r != IR_NONE) ++*nfused;
        f.map[i] = r != IR_NONE ? r : copy_node(&f, i);
    }
    *nlarge = f.nlarge;
    for (int32_t k = 0; k < g->noutputs; k++)
        ir_add_output(f.o, (OutputKind)g->outputs[k].kind, ir_str(g, g->outputs[k].name), f.map[g->outputs[k].node]);
    int rc = 0;
    if (why.len) { /* the builder refused a node the checks above let through: a bug here */
        sb_printf(err, "internal error: the attention pass built an invalid node: %s", why.data);
        rc = -1;
    }
    sb_free(&why);
    Graph tmp = *g;
    *g = *f.o;
    *f.o = tmp;
    ir_graph_free(f.o);
    free(f.map);
    free(match_of);
    free(matches);
    return rc;
}
