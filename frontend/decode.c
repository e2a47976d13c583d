/* decode.c — the decode graph of a language model: its forward lowered a second time
 * (MODE_DECODE) to process S new tokens at positions [P, P + S) against cached keys and
 * values, for incremental generation (docs/inference.md#generation).
 *
 * Why a second lowering rather than a rewrite of the eval graph: the frontend knows where
 * attention and positions are (CausalSelfAttention, arange of the sequence length); after
 * lowering they are anonymous matmuls and iotas. Two things lower differently:
 *   - arange(T), T the sequence symbol, becomes the absolute positions P + arange(T), P the
 *     graph input `decode.past` (i64[1]);
 *   - each built-in CausalSelfAttention, and each causal scaled_dot_product_attention over
 *     the sequence (attention a model writes itself, rotary embeddings before it: rotary
 *     takes the absolute positions too; grouped-query heads cached once, not repeated),
 *     reads its cache, the inputs `decode.PATH.k` and `decode.PATH.v` (f32[KV, B, KVH,
 *     hd], time-major, KV = P + S the keys in view), whose
 *     rows [P, P + S) it replaces by the new keys and values (a select, so the graph stays
 *     functional), and outputs the new rows as `decode.PATH.k` and `.v` ([S, B, H, hd]),
 *     which the program writes into the cache at row P. Time-major makes the prefix [0, KV)
 *     of a batch-1 cache one contiguous tensor with a symbolic length.
 * Everything else is the eval forward, which is only right if it treats every position
 * alone. frontend_decode_check proves that from the graph (no op of the forward outside
 * the two rewrites mixes positions) or says why not; the program then generates by full
 * recomputation. Nodes the rewrites build carry NODE_DECODE_CACHED until the check. */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PAST_INPUT "decode.past"

static NodeId first_input(const Graph *g)
{
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_INPUT) return i;
    return IR_NONE;
}

/* The sequence symbol: axis 1 of the forward's first input (a language model's tokens,
 * [B, T]); -1 when that is not a plain symbol. */
static int seq_sym(const Graph *g)
{
    NodeId i = first_input(g);
    if (i == IR_NONE) return -1;
    const Node *n = &g->nodes[i];
    if (n->shape.rank < 2 || n->shape.d[1].nsym != 1 || n->shape.d[1].k != 1) return -1;
    return n->shape.d[1].sym[0];
}

static bool is_seq(Dim d, int t)
{
    for (int k = 0; k < d.nsym; k++)
        if (d.sym[k] == t) return true;
    return false;
}

static void mark_from(Graph *g, NodeId first)
{
    for (NodeId i = first; i < g->nnodes; i++) g->nodes[i].flags |= NODE_DECODE_CACHED;
}

static NodeId past_input(Lower *L)
{
    NodeId p = ir_find_named(L->g, OP_INPUT, PAST_INPUT);
    if (p != IR_NONE) return p;
    Dim one = ir_dim_const(1);
    Shape s = ir_shape_make(1, &one);
    return ir_b_input(&L->b, PAST_INPUT, DT_I64, &s);
}

NodeId decode_positions(Lower *L, Dim d)
{
    int t = seq_sym(L->g);
    if (t < 0 || d.nsym != 1 || d.k != 1 || d.sym[0] != t) return IR_NONE;
    NodeId first = L->g->nnodes;
    Shape s = ir_shape_make(1, &d);
    NodeId iota = ir_b_iota(&L->b, &s, 0, DT_I64), past = past_input(L);
    NodeId pos = iota == IR_NONE || past == IR_NONE ? IR_NONE : ir_b_binary(&L->b, OP_ADD, iota, past);
    if (pos != IR_NONE) mark_from(L->g, first);
    return pos;
}

/* The cache symbol KV (P + S keys in view), added once with the sequence's bound. */
static int kv_sym(Graph *g, int t)
{
    int k = ir_find_symbol(g, "KV");
    return k >= 0 ? k : ir_add_symbol(g, "KV", g->syms[t].max);
}

/* The keys (or values) in view, [B, H, KV, hd]: the cache's rows before P, the new ones
 * (head-major [B, H, S, hd]) from P on. Adds the cache input and the new-rows output. */
static NodeId cached(Lower *L, const char *path, const char *which, NodeId fresh, Dim kv, NodeId past)
{
    IrBuilder *b = &L->b;
    const Shape fsv = L->g->nodes[fresh].shape, *fs = &fsv; /* a copy: building nodes moves the array */
    char name[512];
    snprintf(name, sizeof name, "decode.%s.%s", path, which);
    int tm[4] = {2, 0, 1, 3};
    NodeId rows = ir_b_permute(b, fresh, tm); /* [S, B, H, hd] */
    if (rows == IR_NONE) return IR_NONE;
    ir_add_output(L->g, OUT_FORWARD, name, rows);
    Dim cd[4] = {kv, fs->d[0], fs->d[1], fs->d[3]};
    Shape cs = ir_shape_make(4, cd);
    NodeId cache = ir_b_input(b, name, DT_F32, &cs);
    Shape ks = ir_shape_make(1, &kv);
    NodeId t = ir_b_iota(b, &ks, 0, DT_I64);
    NodeId rel = t == IR_NONE ? IR_NONE : ir_b_binary(b, OP_SUB, t, past);
    NodeId zero = ir_b_const(b, 0, DT_I64);
    if (cache == IR_NONE || rel == IR_NONE || zero == IR_NONE) return IR_NONE;
    NodeId is_new = ir_b_binary(b, OP_GE, rel, zero);
    /* Row t of the view is new row t - P: a product with the one-hot [KV, S] (exact: one
     * term is the value, the others +0), which no caller's sizes can make read out of
     * bounds, unlike a gather. */
    Dim od[2] = {kv, fs->d[2]};
    Shape os = ir_shape_make(2, od);
    NodeId col = ir_b_iota(b, &os, 1, DT_I64);
    Dim rd[2] = {kv, ir_dim_const(1)};
    Shape rs = ir_shape_make(2, rd);
    NodeId rel2 = ir_b_reshape(b, rel, &rs);
    NodeId hit = col == IR_NONE || rel2 == IR_NONE ? IR_NONE : ir_b_binary(b, OP_EQ, col, rel2);
    NodeId onehot = hit == IR_NONE ? IR_NONE : ir_b_cast(b, hit, DT_F32);
    Dim flat[2] = {fs->d[2], fs->d[0]};
    if (!ir_dim_mul(flat[1], fs->d[1], &flat[1]) || !ir_dim_mul(flat[1], fs->d[3], &flat[1])) return IR_NONE;
    Shape flats = ir_shape_make(2, flat);
    NodeId rows2 = ir_b_reshape(b, rows, &flats);
    NodeId got = onehot == IR_NONE || rows2 == IR_NONE ? IR_NONE : ir_b_matmul(b, onehot, rows2); /* [KV, B*H*hd] */
    got = got == IR_NONE ? IR_NONE : ir_b_reshape(b, got, &cs);
    Dim md[4] = {kv, ir_dim_const(1), ir_dim_const(1), ir_dim_const(1)};
    Shape ms = ir_shape_make(4, md);
    NodeId sel = is_new == IR_NONE ? IR_NONE : ir_b_reshape(b, is_new, &ms);
    NodeId all = sel == IR_NONE || got == IR_NONE ? IR_NONE : ir_b_where(b, sel, got, cache);
    int hm[4] = {1, 2, 0, 3};
    return all == IR_NONE ? IR_NONE : ir_b_permute(b, all, hm);
}

/* x [B, H, S, D] repeating the heads of [B, KVH, S, D] (repeat_kv: reshape(expand(reshape(
 * x, [B, KVH, 1, S, D]), [B, KVH, G, S, D]), [B, H, S, D])): the fewer heads into *fewer
 * and G, else x and 1. */
static NodeId unrepeat(const Graph *g, NodeId x, int64_t *groups)
{
    *groups = 1;
    const Node *r = &g->nodes[x];
    if (r->op != OP_RESHAPE || r->shape.rank != 4) return x;
    const NodeId e = ir_input(g, x, 0), i = ir_input(g, e, 0);
    if (g->nodes[e].op != OP_EXPAND || g->nodes[i].op != OP_RESHAPE || g->nodes[e].shape.rank != 5) return x;
    const NodeId fewer = ir_input(g, i, 0);
    const Shape *es = &g->nodes[e].shape, *fs = &g->nodes[fewer].shape;
    if (fs->rank != 4 || !ir_dim_eq(fs->d[0], es->d[0]) || !ir_dim_eq(fs->d[1], es->d[1]) || !ir_dim_eq(fs->d[2], es->d[3]) ||
        !ir_dim_eq(fs->d[3], es->d[4]) || !ir_dim_is_const(es->d[2]) || !ir_dim_eq(g->nodes[i].shape.d[2], ir_dim_const(1)))
        return x;
    *groups = es->d[2].k;
    return fewer;
}

/* x [B, KVH, KV, D] with each head repeated g times: [B, KVH * g, KV, D]. */
static NodeId repeat_heads(IrBuilder *b, NodeId x, int64_t g)
{
    if (g == 1) return x;
    const Shape xs = b->g->nodes[x].shape;
    Dim d5[5] = {xs.d[0], xs.d[1], ir_dim_const(1), xs.d[2], xs.d[3]}, heads;
    Shape s5 = ir_shape_make(5, d5);
    NodeId r = ir_b_reshape(b, x, &s5);
    s5.d[2] = ir_dim_const(g);
    r = r == IR_NONE ? IR_NONE : ir_b_expand(b, r, &s5);
    if (r == IR_NONE || !ir_dim_mul(xs.d[1], ir_dim_const(g), &heads)) return IR_NONE;
    Dim d4[4] = {xs.d[0], heads, xs.d[2], xs.d[3]};
    Shape s4 = ir_shape_make(4, d4);
    return ir_b_reshape(b, r, &s4);
}

/* Causal attention of q [B, H, S, hd] over the cache of `path`: keys and values [B, KVH,
 * S, hd] (the new rows; KVH dividing H, each read by H / KVH query heads) with the cached
 * ones before position P; false when q is not over the sequence. */
static bool cached_attention(Lower *L, const char *path, NodeId q, NodeId k, NodeId v, int64_t groups, double scale, NodeId *out)
{
    Graph *g = L->g;
    IrBuilder *b = &L->b;
    *out = IR_NONE;
    int t = seq_sym(g);
    const Shape qsv = g->nodes[q].shape, *qs = &qsv; /* a copy, as nodes are added */
    if (qs->rank != 4) return false;
    Dim S = qs->d[2];
    if (t < 0 || S.nsym != 1 || S.k != 1 || S.sym[0] != t) return false; /* not over the sequence: the check says so */
    int ks = kv_sym(g, t);
    if (ks < 0) return false;
    NodeId first = g->nnodes;
    Dim kv = ir_dim_sym(ks);
    NodeId past = past_input(L);
    NodeId keys = past == IR_NONE ? IR_NONE : cached(L, path, "k", k, kv, past);
    NodeId vals = keys == IR_NONE ? IR_NONE : cached(L, path, "v", v, kv, past);
    keys = keys == IR_NONE ? IR_NONE : repeat_heads(b, keys, groups);
    vals = vals == IR_NONE ? IR_NONE : repeat_heads(b, vals, groups);
    NodeId kt = vals == IR_NONE ? IR_NONE : ir_b_transpose(b, keys, 2, 3);
    NodeId att = kt == IR_NONE ? IR_NONE : ir_b_matmul(b, q, kt); /* [B, H, S, KV] */
    if (att == IR_NONE) return true;
    att = comp_scalar_op(b, OP_MUL, att, scale, false);
    /* Causal mask: query i, at position P + i, attends to keys j <= P + i. */
    Dim md[2] = {S, kv};
    Shape ms = ir_shape_make(2, md);
    NodeId qi = ir_b_iota(b, &ms, 0, DT_I64), kj = ir_b_iota(b, &ms, 1, DT_I64);
    NodeId qpos = qi == IR_NONE ? IR_NONE : ir_b_binary(b, OP_ADD, qi, past);
    NodeId mask = qpos == IR_NONE || kj == IR_NONE ? IR_NONE : ir_b_binary(b, OP_LE, kj, qpos);
    NodeId ninf = ir_b_const(b, -INFINITY, DT_F32);
    if (att == IR_NONE || mask == IR_NONE || ninf == IR_NONE) return true;
    att = ir_b_where(b, mask, att, ninf);
    att = att == IR_NONE ? IR_NONE : comp_softmax(b, att, 3);
    *out = att == IR_NONE ? IR_NONE : ir_b_matmul(b, att, vals); /* [B, H, S, hd] */
    if (*out != IR_NONE) mark_from(g, first);
    return true;
}

bool decode_attention(Lower *L, const char *path, const NodeId heads[3], int64_t hd, NodeId *out)
{
    return cached_attention(L, path, heads[0], heads[1], heads[2], 1, 1.0 / sqrt((double)hd), out);
}

bool decode_sdpa(Lower *L, NodeId q, NodeId k, NodeId v, double scale, NodeId *out)
{
    const Graph *g = L->g;
    *out = IR_NONE;
    if (g->nodes[q].shape.rank != 4 || g->nodes[k].shape.rank != 4 || g->nodes[v].shape.rank != 4 || g->nodes[q].dtype != DT_F32 ||
        g->nodes[k].dtype != DT_F32 || g->nodes[v].dtype != DT_F32)
        return false;
    int64_t gk, gv;
    NodeId kh = unrepeat(g, k, &gk), vh = unrepeat(g, v, &gv);
    if (gk != gv) kh = k, vh = v, gk = 1; /* repeated differently: cache them as they are */
    /* the cache's name: the module that calls it ("layers.0.attention"), numbered when it
     * calls attention more than once */
    const char *scope = L->b.scope ? ir_str(g, L->b.scope) : "sdpa";
    char path[400], name[440];
    snprintf(path, sizeof path, "%s", scope);
    for (int n = 2; ; n++) {
        snprintf(name, sizeof name, "decode.%s.k", path);
        if (ir_find_named(g, OP_INPUT, name) == IR_NONE) break;
        snprintf(path, sizeof path, "%s.%d", scope, n);
    }
    return cached_attention(L, path, q, kh, vh, gk, scale, out);
}

/* ---- the check ---- */

/* The product of shape s's dims after axis a. */
static bool dims_after(const Shape *s, int a, Dim *out)
{
    Dim p = ir_dim_const(1);
    for (int i = a + 1; i < s->rank; i++)
        if (!ir_dim_mul(p, s->d[i], &p)) return false;
    *out = p;
    return true;
}

static int seq_axis(const Shape *s, int t)
{
    for (int i = 0; i < s->rank; i++)
        if (is_seq(s->d[i], t)) return i;
    return -1;
}

/* Why node i, which depends on positions through axis `t`, would mix positions; NULL
 * when it treats each alone. */
static const char *mixes_positions(const Graph *g, NodeId i, int t)
{
    const Node *n = &g->nodes[i];
    const int64_t *at = ir_attrs(g, i);
    const Node *x = n->ninputs ? &g->nodes[ir_input(g, i, 0)] : NULL;
    int seen = 0;
    for (int a = 0; a < n->shape.rank; a++) seen += is_seq(n->shape.d[a], t);
    if (seen > 1) return "a tensor with two sequence axes (attention that is not the built-in CausalSelfAttention)";
    switch ((Op)n->op) {
    case OP_IOTA:
        return seen ? "positions other than arange of the sequence length" : NULL;
    case OP_REDUCE_SUM:
    case OP_REDUCE_MAX:
        for (int a = 0; a < x->shape.rank; a++)
            if ((at[0] >> a & 1) && is_seq(x->shape.d[a], t)) return "a reduction over the sequence";
        return NULL;
    case OP_ARGMAX:
        return is_seq(x->shape.d[at[0]], t) ? "an argmax over the sequence" : NULL;
    case OP_MATMUL:
        return x->shape.rank && is_seq(x->shape.d[x->shape.rank - 1], t) ? "a matrix product over the sequence" : NULL;
    case OP_SLICE:
    case OP_CONCAT:
        return is_seq(n->shape.d[at[0]], t) ? "a slice or concatenation along the sequence" : NULL;
    case OP_PAD:
        for (int a = 0; a < n->shape.rank; a++)
            if (is_seq(n->shape.d[a], t) && (at[a] || at[n->shape.rank + a])) return "padding along the sequence";
        return NULL;
    case OP_GATHER:
        return is_seq(x->shape.d[0], t) ? "a gather from the sequence" : NULL;
    case OP_SCATTER_ADD:
        return is_seq(n->shape.d[0], t) ? "a scatter into the sequence" : NULL;
    case OP_UNFOLD:
    case OP_FOLD:
        return seq_axis(&x->shape, t) >= 0 || seen ? "a convolution window over the sequence" : NULL;
    case OP_RESHAPE: {
        /* Each position's block of elements must stay whole: the same count after the
         * sequence's axis on both sides. */
        int ai = seq_axis(&x->shape, t), ao = seq_axis(&n->shape, t);
        Dim pi, po;
        if (ai < 0 && ao < 0) return NULL;
        if (ai < 0 || ao < 0 || !dims_after(&x->shape, ai, &pi) || !dims_after(&n->shape, ao, &po) || !ir_dim_eq(pi, po))
            return "a reshape that regroups the sequence";
        return NULL;
    }
    default: return NULL;
    }
}

int frontend_decode_check(Graph *g, StrBuf *why)
{
    int t = seq_sym(g), bad = 0;
    if (t < 0) {
        sb_puts(why, "the forward's first input is not [B, T] tokens with T a symbol");
        bad = 1;
    }
    int k = ir_find_symbol(g, "KV");
    if (!bad && k >= 0) g->syms[k].max = g->syms[t].max; /* after --bound */
    /* Generation continues one text: the step and its caches are planned for batch 1. */
    NodeId tokens = first_input(g);
    if (!bad && g->nodes[tokens].shape.d[0].nsym == 1 && g->nodes[tokens].shape.d[0].k == 1) g->syms[g->nodes[tokens].shape.d[0].sym[0]].max = 1;
    bool *live = xcalloc((size_t)g->nnodes + 1, sizeof *live);
    for (int32_t o = 0; o < g->noutputs; o++)
        if (g->outputs[o].kind == OUT_FORWARD) live[g->outputs[o].node] = true;
    for (NodeId i = g->nnodes - 1; i >= 0 && !bad; i--) {
        if (!live[i]) continue;
        for (uint32_t j = 0; j < g->nodes[i].ninputs; j++) live[ir_input(g, i, (int)j)] = true;
        const char *m = g->nodes[i].flags & NODE_DECODE_CACHED ? NULL : mixes_positions(g, i, t);
        if (m) {
            sb_printf(why, "%s:%u: %s", g->nfiles ? g->files[0] : "?", g->nodes[i].loc.line, m);
            bad = 1;
        }
    }
    for (NodeId i = 0; i < g->nnodes; i++)
        if (live[i] && g->nodes[i].op == OP_INPUT && strncmp(ir_node_name(g, i), "decode.", 7) && i != first_input(g) && !bad) {
            sb_printf(why, "the forward reads input '%s' besides the tokens", ir_node_name(g, i));
            bad = 1;
        }
    free(live);
    for (NodeId i = 0; i < g->nnodes; i++) g->nodes[i].flags &= (uint8_t)~NODE_DECODE_CACHED;
    return bad ? -1 : 0;
}
