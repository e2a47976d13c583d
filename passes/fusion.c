/* fusion.c — kernel grouping: which nodes share one generated loop nest (see passes.h).
 *
 * Greedy, in node order (a topological order): each fusible node tries to join the
 * kernel of one of its operands, newest first, and otherwise starts its own. A node may
 * join when
 *   - its element count is the kernel's (a full member) or, in a kernel that reduces
 *     over some axes, the kernel's row count (a row member);
 *   - every operand it reads from outside the kernel can be read there: a stored tensor at
 *     the same linear index, a broadcast of a stored tensor whose broadcast axes line up
 *     with a suffix of the kernel's shape, a constant, an iota or random numbers;
 *   - no kernel it reads from depends on the kernel already (that would be a cycle).
 * Reductions fix the kernel's reduced axes; a second set of axes starts a new kernel,
 * except a sum of the row values over everything (a loss mean), which is accumulated across
 * rows. A GEMM kernel takes only full elementwise members (its epilogue).
 *
 * Why greedy: the graphs are small (thousands of nodes) and the patterns we care about
 * (softmax, layer norm, cross-entropy, their gradients, epilogues) are chains that the
 * first fit finds; a cost model can replace it when a benchmark asks. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t *first, *list; /* users of node v: list[first[v] .. first[v + 1]) */
    bool *output;
} Users; /* a graph output counts as a reader too */

/* Readers of v, a graph output counted as one. */
static int32_t readers(const Users *U, NodeId v) { return U->first[v + 1] - U->first[v] + U->output[v]; }

typedef struct {
    const Graph *g;
    FusionPlan *p;
    int32_t cap_kernels;
    /* per kernel, while grouping */
    NodeId **mem;
    int32_t *nmem, *capmem;
    int32_t **deps; /* kernels it reads from */
    int32_t *ndeps, *capdeps;
    bool *has_rows; /* has row or total members: its axes are fixed */
    Users users;
    /* DFS marks, and the walk's stack (one per kernel at most; kept between walks: a
     * 40,000-layer chain asks hundreds of thousands of times) */
    int32_t *mark, *stack;
    int32_t stamp;
} Fuser;

/* ---- shapes ---- */

/* Element count as a monomial: constant factor and per-symbol exponents. */
typedef struct {
    int64_t k;
    uint8_t e[64];
} Numel;

static Numel numel_of(const Shape *s, uint64_t skip_axes)
{
    Numel n = {1, {0}};
    for (int i = 0; i < s->rank; i++) {
        if (skip_axes >> i & 1) continue;
        n.k *= s->d[i].k;
        for (int q = 0; q < s->d[i].nsym; q++) n.e[s->d[i].sym[q] & 63]++;
    }
    return n;
}

static bool numel_eq(Numel a, Numel b) { return a.k == b.k && !memcmp(a.e, b.e, sizeof a.e); }

static bool is_one(Dim d) { return d.nsym == 0 && d.k == 1; }

/* Do dims [from, rank(e)) of e equal the last dims of s? (Coordinates of those axes are
 * then the same at every linear index, since both are row-major.) With max_suffix >= 0 the
 * suffix may be at most that long (GEMM kernels know only the last two coordinates). */
static bool suffix_aligned(const Shape *s, const Shape *e, int from, int max_suffix)
{
    int len = e->rank - from;
    if (len <= 0) return true;
    if (len > s->rank || (max_suffix >= 0 && len > max_suffix)) return false;
    for (int k = 0; k < len; k++)
        if (!ir_dim_eq(e->d[from + k], s->d[s->rank - len + k])) return false;
    return true;
}

/* ---- node kinds ---- */

static bool is_elementwise(const Graph *g, NodeId id)
{
    unsigned f = ir_op_info[g->nodes[id].op].flags;
    return ((f & (OPF_UNARY | OPF_BINARY)) || g->nodes[id].op == OP_WHERE) && g->nodes[id].op != OP_DETACH;
}

NodeId fusion_root(const Graph *g, const FusionPlan *p, NodeId id)
{
    while (p->role[id] == ROLE_VIEW || p->role[id] == ROLE_STRIDED) id = ir_input(g, id, 0);
    if (g->nodes[id].op == OP_ATTENTION && p->role[id] == ROLE_KERNEL && p->kernel_of[id] >= 0 && p->kernels[p->kernel_of[id]].written != IR_NONE)
        return p->kernels[p->kernel_of[id]].written; /* its output lives in the permute's memory */
    return id;
}

/* Is a read of root r from kernel k a broadcast (recomputed from the expand's operand)?
 * True for inline expands and for expands computed as members of another kernel: a reader
 * elsewhere reads the small operand instead of a stored full-size copy. */
bool fusion_is_broadcast(const Graph *g, const FusionPlan *p, NodeId r, int32_t k, NodeId reader)
{
    if (g->nodes[r].op != OP_EXPAND || g->nodes[reader].op == OP_MATMUL || p->kernels[k].kind == KERNEL_SINGLE) return false;
    if (p->role[r] == ROLE_INLINE) return true;
    return p->role[r] == ROLE_KERNEL && p->kernel_of[r] != k && p->kernels[p->kernel_of[r]].kind == KERNEL_LOOP;
}

int fusion_first_kept_axis(const Graph *g, NodeId e)
{
    const Shape *xs = &g->nodes[ir_input(g, e, 0)].shape, *es = &g->nodes[e].shape;
    for (int a = 0; a < xs->rank; a++)
        if (!is_one(xs->d[a]) || is_one(es->d[a])) return a;
    return xs->rank;
}

/* ---- kernels ---- */

static int32_t new_kernel(Fuser *f, KernelKind kind, NodeId anchor, const Shape *shape, uint64_t axes)
{
    FusionPlan *p = f->p;
    if (p->nkernels == f->cap_kernels) {
        f->cap_kernels = f->cap_kernels ? 2 * f->cap_kernels : 64;
        size_t n = (size_t)f->cap_kernels;
        p->kernels = xrealloc(p->kernels, n * sizeof *p->kernels);
        f->mem = xrealloc(f->mem, n * sizeof *f->mem);
        f->nmem = xrealloc(f->nmem, n * sizeof *f->nmem);
        f->capmem = xrealloc(f->capmem, n * sizeof *f->capmem);
        f->deps = xrealloc(f->deps, n * sizeof *f->deps);
        f->ndeps = xrealloc(f->ndeps, n * sizeof *f->ndeps);
        f->capdeps = xrealloc(f->capdeps, n * sizeof *f->capdeps);
        f->has_rows = xrealloc(f->has_rows, n * sizeof *f->has_rows);
        f->mark = xrealloc(f->mark, n * sizeof *f->mark);
        f->stack = xrealloc(f->stack, n * sizeof *f->stack);
    }
    int32_t k = p->nkernels++;
    p->kernels[k] = (Kernel){.kind = (uint8_t)kind, .anchor = anchor, .shape = *shape, .axes = axes, .written = IR_NONE, .summed = IR_NONE};
    f->mem[k] = NULL;
    f->nmem[k] = f->capmem[k] = 0;
    f->deps[k] = NULL;
    f->ndeps[k] = f->capdeps[k] = 0;
    f->has_rows[k] = false;
    f->mark[k] = 0;
    return k;
}

static void add_member(Fuser *f, int32_t k, NodeId id, MemberClass cls)
{
    GROW(f->mem[k], f->capmem[k], f->nmem[k] + 1);
    f->mem[k][f->nmem[k]++] = id;
    f->p->role[id] = ROLE_KERNEL;
    f->p->kernel_of[id] = k;
    f->p->cls[id] = (uint8_t)cls;
    if (cls != CLASS_FULL) f->has_rows[k] = true;
}

static void add_dep(Fuser *f, int32_t k, int32_t on)
{
    if (on < 0 || on == k) return;
    for (int32_t i = 0; i < f->ndeps[k]; i++)
        if (f->deps[k][i] == on) return;
    GROW(f->deps[k], f->capdeps[k], f->ndeps[k] + 1);
    f->deps[k][f->ndeps[k]++] = on;
}

/* Does kernel `from` depend, through any chain of reads, on kernel `to`? */
static bool reaches(Fuser *f, int32_t from, int32_t to)
{
    if (from < 0) return false;
    f->stamp++;
    int32_t *stack = f->stack;
    int32_t top = 0;
    stack[top++] = from;
    f->mark[from] = f->stamp;
    bool found = false;
    while (top && !found) {
        int32_t k = stack[--top];
        if (k == to) found = true;
        for (int32_t i = 0; i < f->ndeps[k] && !found; i++) {
            int32_t d = f->deps[k][i];
            if (f->mark[d] != f->stamp) {
                f->mark[d] = f->stamp;
                stack[top++] = d;
            }
        }
    }
    return found;
}

/* Makes an inline node a kernel of its own (a consumer cannot recompute it). */
static void materialise(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    if (f->p->role[id] != ROLE_INLINE) return;
    int32_t k = new_kernel(f, KERNEL_SINGLE, id, &g->nodes[id].shape, 0);
    add_member(f, k, id, CLASS_FULL);
    for (uint32_t j = 0; j < g->nodes[id].ninputs; j++) {
        NodeId r = fusion_root(g, f->p, ir_input(g, id, (int)j));
        materialise(f, r);
        add_dep(f, k, f->p->kernel_of[r]);
    }
}

/* The kernels an external read of root r makes kernel k depend on (r itself, or what an
 * inline broadcast reads). Returns false when r cannot be read inside kernel k as a
 * member of class cls. */
static bool readable(Fuser *f, int32_t k, NodeId r, MemberClass cls, NodeId reader, int32_t *dep)
{
    const Graph *g = f->g;
    const FusionPlan *p = f->p;
    const Kernel *K = &p->kernels[k];
    const Node *n = &g->nodes[r];
    int max_suffix = K->kind == KERNEL_GEMM ? 2 : -1;
    *dep = -1;
    if (p->role[r] == ROLE_KERNEL && !fusion_is_broadcast(g, p, r, k, reader)) {
        if (p->kernel_of[r] == k) return false; /* handled by the caller */
        *dep = p->kernel_of[r];
        return true;
    }
    if (p->role[r] == ROLE_MEMORY) return true;
    /* inline, or a broadcast */
    switch ((Op)n->op) {
    case OP_CONST: return true;
    case OP_IOTA: return cls == CLASS_FULL && suffix_aligned(&K->shape, &n->shape, (int)ir_attrs(g, r)[0], max_suffix);
    case OP_RANDOM_UNIFORM: return cls != CLASS_TOTAL;
    case OP_EXPAND: {
        NodeId x = ir_input(g, r, 0);
        NodeId q = fusion_root(g, p, x);
        if (p->role[q] == ROLE_INLINE && g->nodes[q].op != OP_CONST) return false;
        if (p->role[r] == ROLE_KERNEL && reaches(f, p->kernel_of[r], k)) return false;
        if (p->role[q] == ROLE_KERNEL) {
            if (p->kernel_of[q] == k) return false;
            *dep = p->kernel_of[q];
        }
        int first = fusion_first_kept_axis(g, r);
        if (first == g->nodes[x].shape.rank) return true; /* a scalar broadcast */
        return cls == CLASS_FULL && suffix_aligned(&K->shape, &n->shape, first, max_suffix);
    }
    default: return false;
    }
}

/* Can node n (elementwise or reduction) join kernel k? Sets *cls. On success also
 * records the dependencies. */
/* A copy that the backward pass recomputes (remat.c) never joins a kernel of values that
 * are not copies: in a forward kernel it would be computed, and kept, in the forward
 * pass. A copy starts a kernel of its own (the copies come right before the backward
 * node that first reads them), and the backward nodes after it may join that kernel: a
 * recomputed exponential is computed in the kernel of the gradient that reads it. */
static bool same_pass(const Fuser *f, int32_t k, NodeId id)
{
    const Graph *g = f->g;
    return !(g->nodes[id].flags & NODE_RECOMPUTED) || (g->nodes[f->p->kernels[k].anchor].flags & NODE_RECOMPUTED);
}

/* Is node id the fp32 widening of a half-precision value that kernel k computes? It is
 * computed where it is read instead: beside the narrowing it would be stored in fp32 for
 * its readers in other kernels (a bias gradient summing a gradient's half copy), which is
 * what the half copy is there to avoid. */
static bool widens_member(const Fuser *f, int32_t k, NodeId id)
{
    const Graph *g = f->g;
    const Node *n = &g->nodes[id];
    if (n->op != OP_CAST || n->dtype != DT_F32) return false;
    const NodeId r = fusion_root(g, f->p, ir_input(g, id, 0));
    const DType from = (DType)g->nodes[r].dtype;
    return (from == DT_BF16 || from == DT_F16) && f->p->role[r] == ROLE_KERNEL && f->p->kernel_of[r] == k;
}

static bool try_join(Fuser *f, int32_t k, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    Kernel *K = &p->kernels[k];
    const Node *n = &g->nodes[id];
    if (K->kind == KERNEL_SINGLE || K->written != IR_NONE || K->summed != IR_NONE || !same_pass(f, k, id)) return false;
    if (widens_member(f, k, id)) return false;
    Numel full = numel_of(&K->shape, 0), rows = numel_of(&K->shape, K->axes);
    Numel mine = numel_of(&n->shape, 0);
    MemberClass cls;
    uint64_t new_axes = K->axes;
    if (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX) {
        if (K->kind != KERNEL_LOOP) return false;
        NodeId x = ir_input(g, id, 0);
        NodeId r = fusion_root(g, p, x);
        if (p->role[r] != ROLE_KERNEL || p->kernel_of[r] != k) return false;
        uint64_t axes = (uint64_t)ir_attrs(g, id)[0];
        const Shape *xs = &g->nodes[x].shape;
        if (p->cls[r] == CLASS_ROW) {
            /* a sum over every row: a total */
            Numel one = {1, {0}};
            if (n->op != OP_REDUCE_SUM || !numel_eq(mine, one)) return false;
            cls = CLASS_TOTAL;
        } else if (p->cls[r] == CLASS_FULL) {
            /* the reduced axes in the kernel's terms */
            uint64_t a_s = 0;
            if (ir_shape_eq(xs, &K->shape)) {
                a_s = axes;
            } else {
                int lo = xs->rank;
                while (lo > 0 && (axes >> (lo - 1) & 1)) lo--;
                if (axes != (((uint64_t)1 << xs->rank) - 1) - (((uint64_t)1 << lo) - 1)) return false; /* not trailing */
                if (!suffix_aligned(&K->shape, xs, lo, -1)) return false;
                int len = xs->rank - lo;
                for (int a = K->shape.rank - len; a < K->shape.rank; a++) a_s |= (uint64_t)1 << a;
            }
            if (f->has_rows[k] && a_s != K->axes) return false;
            if (!f->has_rows[k] && K->axes && a_s != K->axes) return false;
            if (numel_eq(numel_of(&K->shape, a_s), full)) return false; /* reduces only size-1 axes */
            new_axes = a_s;
            cls = CLASS_ROW;
        } else {
            return false;
        }
    } else {
        if (numel_eq(mine, full)) cls = CLASS_FULL;
        else if (K->kind == KERNEL_LOOP && f->has_rows[k] && numel_eq(mine, rows)) cls = CLASS_ROW;
        else return false;
        /* An elementwise node that would be ambiguous between the two (rows == elements) was
         * refused above by the reduction's check. */
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId r = fusion_root(g, p, ir_input(g, id, (int)j));
            if (p->role[r] == ROLE_KERNEL && p->kernel_of[r] == k) {
                if (p->cls[r] != cls) return false;
                continue;
            }
            int32_t dep;
            if (!readable(f, k, r, cls, id, &dep)) return false;
            if (dep >= 0 && reaches(f, dep, k)) return false;
        }
    }
    if (cls == CLASS_ROW) K->axes = new_axes;
    add_member(f, k, id, cls);
    for (uint32_t j = 0; j < n->ninputs; j++) {
        NodeId r = fusion_root(g, p, ir_input(g, id, (int)j));
        int32_t dep = -1;
        if (!(p->role[r] == ROLE_KERNEL && p->kernel_of[r] == k)) readable(f, k, r, cls, id, &dep);
        add_dep(f, k, dep);
    }
    return true;
}

/* An expand of a row member, back to the kernel's full shape: a full member whose value
 * is its row's. */
static bool try_join_expand(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    NodeId x = ir_input(g, id, 0);
    NodeId r = fusion_root(g, p, x);
    if (p->role[r] != ROLE_KERNEL || p->kernel_of[r] < 0) return false;
    int32_t k = p->kernel_of[r];
    const Kernel *K = &p->kernels[k];
    if (K->kind != KERNEL_LOOP || p->cls[r] != CLASS_ROW || !same_pass(f, k, id)) return false;
    const Shape *xs = &g->nodes[x].shape, *s = &K->shape;
    if (!ir_shape_eq(&g->nodes[id].shape, s) || xs->rank != s->rank) return false;
    for (int a = 0; a < s->rank; a++) {
        bool reduced = K->axes >> a & 1;
        if (reduced ? !is_one(xs->d[a]) : !ir_dim_eq(xs->d[a], s->d[a])) return false;
    }
    add_member(f, k, id, CLASS_FULL);
    return true;
}

/* A new loop kernel for n, reading its operands from outside. */
static void start_loop(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    const Node *n = &g->nodes[id];
    bool reduce = n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX;
    const Shape *s = reduce ? &g->nodes[ir_input(g, id, 0)].shape : &n->shape;
    uint64_t axes = reduce ? (uint64_t)ir_attrs(g, id)[0] : 0;
    int32_t k = new_kernel(f, KERNEL_LOOP, id, s, axes);
    MemberClass cls = reduce ? CLASS_ROW : CLASS_FULL;
    for (uint32_t j = 0; j < n->ninputs; j++) {
        NodeId r = fusion_root(g, p, ir_input(g, id, (int)j));
        int32_t dep;
        /* a reduction reads its operand as a full value */
        if (!readable(f, k, r, reduce ? CLASS_FULL : cls, id, &dep)) {
            materialise(f, r);
            readable(f, k, r, CLASS_FULL, id, &dep);
        }
        add_dep(f, k, dep);
    }
    if (reduce && numel_eq(numel_of(s, axes), numel_of(s, 0))) {
        /* over size-1 axes only: the identity, a full member */
        p->kernels[k].axes = 0;
        cls = CLASS_FULL;
    }
    add_member(f, k, id, cls);
}

/* A permute whose operand is a matrix product nothing else reads: BLAS writes the product
 * in the permuted order (attention's heads back to [B, T, H, D], and their gradients)
 * instead of a kernel copying it. */
static bool try_join_written(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    NodeId mm = ir_input(g, id, 0);
    if (g->nodes[mm].op != OP_MATMUL || p->role[mm] != ROLE_KERNEL || readers(&f->users, mm) != 1) return false;
    int32_t k = p->kernel_of[mm];
    Kernel *K = &p->kernels[k];
    Dim stride[IR_MAX_RANK];
    bool swapped;
    if (K->kind != KERNEL_GEMM || f->nmem[k] != 1 || K->written != IR_NONE || !same_pass(f, k, id) ||
        !fusion_gemm_output(g, mm, id, stride, &swapped))
        return false;
    add_member(f, k, id, CLASS_FULL);
    p->kernels[k].written = id;
    return true;
}

/* A permute of a fused attention's output (its heads back to [B, T, H, DV]) that the
 * attention kernel writes instead of the output itself, when the output's other readers are
 * its backward kernels, which read it there by strides: one tensor kept, not two. */
static bool try_join_attention_written(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    const NodeId o = ir_input(g, id, 0);
    if (g->nodes[o].op != OP_ATTENTION || p->role[o] != ROLE_KERNEL || f->users.output[o]) return false;
    const int32_t k = p->kernel_of[o];
    if (p->kernels[k].kind != KERNEL_SINGLE || p->kernels[k].written != IR_NONE || !same_pass(f, k, id)) return false;
    for (int32_t i = f->users.first[o]; i < f->users.first[o + 1]; i++) {
        const NodeId u = f->users.list[i];
        if (u == id) continue;
        if (g->nodes[u].op != OP_ATTENTION_GRAD) return false;
        for (uint32_t j = 0; j < g->nodes[u].ninputs; j++)
            if (ir_input(g, u, (int)j) == o && j != g->nodes[u].ninputs - 3) return false; /* read as anything but its out */
    }
    FusionLayout L = {.base = id, .rank = g->nodes[o].shape.rank};
    bool swapped;
    Dim st[4];
    if (!fusion_gemm_output(g, o, id, L.stride, &swapped) || swapped || !fusion_attention_operand(g, &L, o, false, st)) return false;
    add_member(f, k, id, CLASS_FULL);
    p->kernels[k].written = id;
    return true;
}

/* A sum over every batch axis of a batched product that nothing else reads (the weight
 * gradient of a convolution: one product per image, then summed): BLAS adds each product
 * into the sum (beta 1), and the products, B times the size of the sum, are never stored. */
static bool try_join_summed(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    FusionPlan *p = f->p;
    NodeId mm = ir_input(g, id, 0);
    const Node *m = &g->nodes[mm];
    if (m->op != OP_MATMUL || p->role[mm] != ROLE_KERNEL || readers(&f->users, mm) != 1 || m->shape.rank < 3) return false;
    int32_t k = p->kernel_of[mm];
    Kernel *K = &p->kernels[k];
    uint64_t batch_axes = (UINT64_C(1) << (m->shape.rank - 2)) - 1;
    if (K->kind != KERNEL_GEMM || f->nmem[k] != 1 || K->written != IR_NONE || K->summed != IR_NONE || !same_pass(f, k, id) ||
        (uint64_t)ir_attrs(g, id)[0] != batch_axes)
        return false;
    add_member(f, k, id, CLASS_FULL);
    K->summed = id;
    return true;
}

static void start_single(Fuser *f, NodeId id, KernelKind kind)
{
    const Graph *g = f->g;
    int32_t k = new_kernel(f, kind, id, &g->nodes[id].shape, 0);
    for (uint32_t j = 0; j < g->nodes[id].ninputs; j++) {
        NodeId r = fusion_root(g, f->p, ir_input(g, id, (int)j));
        materialise(f, r);
        add_dep(f, k, f->p->kernel_of[r]);
    }
    add_member(f, k, id, CLASS_FULL);
}

/* The attention ops of one attention share a kernel: its output and log-sum-exp (one
 * forward pass computes both), its three gradients (one backward pass). Joins id to the
 * kernel of a sibling (same operands and attributes) when there is one. */
static bool join_attention(Fuser *f, NodeId id)
{
    const Graph *g = f->g;
    const Node *n = &g->nodes[id];
    const bool grad = n->op == OP_ATTENTION_GRAD;
    for (int32_t k = f->p->nkernels - 1; k >= 0; k--) {
        const NodeId a = f->p->kernels[k].anchor;
        const Node *s = &g->nodes[a];
        if (f->p->kernels[k].kind != KERNEL_SINGLE || (s->op == OP_ATTENTION_GRAD) != grad ||
            (s->op != OP_ATTENTION && s->op != OP_ATTENTION_LSE && !grad) || !ir_same_attention(g, a, id))
            continue;
        bool same = true;
        for (int32_t m = 0; m < f->nmem[k] && same; m++) /* one member per output */
            same = g->nodes[f->mem[k][m]].op != n->op || (grad && ir_attrs(g, f->mem[k][m])[2] != ir_attrs(g, id)[2]);
        if (!same) continue;
        add_member(f, k, id, CLASS_FULL);
        return true;
    }
    return false;
}

static int cmp_node(const void *a, const void *b)
{
    NodeId x = *(const NodeId *)a, y = *(const NodeId *)b;
    return (x > y) - (x < y);
}

/* Orders kernels so that each follows the kernels it reads: repeatedly the ready kernel
 * whose first member comes first in the graph. */
static void order_kernels(Fuser *f)
{
    FusionPlan *p = f->p;
    int32_t nk = p->nkernels;
    int32_t *pending = xcalloc((size_t)nk + 1, sizeof *pending);
    int32_t **users = xcalloc((size_t)nk + 1, sizeof *users);
    int32_t *nusers = xcalloc((size_t)nk + 1, sizeof *nusers), *capusers = xcalloc((size_t)nk + 1, sizeof *capusers);
    for (int32_t k = 0; k < nk; k++)
        for (int32_t i = 0; i < f->ndeps[k]; i++) {
            int32_t d = f->deps[k][i];
            pending[k]++;
            GROW(users[d], capusers[d], nusers[d] + 1);
            users[d][nusers[d]++] = k;
        }
    /* ready set as a binary heap keyed by first member */
    int32_t *heap = xmalloc(((size_t)nk + 1) * sizeof *heap), nheap = 0;
#define KEY(k) (f->mem[k][0])
#define SWAP(a, b) do { int32_t t_ = heap[a]; heap[a] = heap[b]; heap[b] = t_; } while (0)
    int32_t *order = xmalloc(((size_t)nk + 1) * sizeof *order), norder = 0;
    for (int32_t k = 0; k < nk; k++)
        if (!pending[k]) {
            heap[nheap] = k;
            for (int32_t i = nheap++; i > 0 && KEY(heap[(i - 1) / 2]) > KEY(heap[i]); i = (i - 1) / 2) SWAP(i, (i - 1) / 2);
        }
    while (nheap) {
        int32_t k = heap[0];
        heap[0] = heap[--nheap];
        for (int32_t i = 0;;) {
            int32_t l = 2 * i + 1, r = l + 1, m = i;
            if (l < nheap && KEY(heap[l]) < KEY(heap[m])) m = l;
            if (r < nheap && KEY(heap[r]) < KEY(heap[m])) m = r;
            if (m == i) break;
            SWAP(i, m);
            i = m;
        }
        order[norder++] = k;
        for (int32_t u = 0; u < nusers[k]; u++) {
            int32_t c = users[k][u];
            if (--pending[c] == 0) {
                heap[nheap] = c;
                for (int32_t i = nheap++; i > 0 && KEY(heap[(i - 1) / 2]) > KEY(heap[i]); i = (i - 1) / 2) SWAP(i, (i - 1) / 2);
            }
        }
    }
#undef KEY
#undef SWAP
    /* norder == nk: joins never create cycles (checked in try_join). */
    Kernel *kernels = xmalloc(((size_t)nk + 1) * sizeof *kernels);
    int32_t *renum = xmalloc(((size_t)nk + 1) * sizeof *renum);
    int32_t total = 0;
    for (int32_t k = 0; k < nk; k++) total += f->nmem[k];
    p->members = xmalloc(((size_t)total + 1) * sizeof *p->members);
    int32_t at = 0;
    for (int32_t i = 0; i < norder; i++) {
        int32_t k = order[i];
        renum[k] = i;
        kernels[i] = p->kernels[k];
        kernels[i].first = at;
        kernels[i].count = f->nmem[k];
        qsort(f->mem[k], (size_t)f->nmem[k], sizeof(NodeId), cmp_node);
        memcpy(p->members + at, f->mem[k], (size_t)f->nmem[k] * sizeof(NodeId));
        at += f->nmem[k];
    }
    for (int32_t id = 0; id < p->nnodes; id++)
        if (p->kernel_of[id] >= 0) p->kernel_of[id] = renum[p->kernel_of[id]];
    free(p->kernels);
    p->kernels = kernels;
    for (int32_t k = 0; k < nk; k++) free(users[k]);
    free(users);
    free(nusers);
    free(capusers);
    free(pending);
    free(heap);
    free(order);
    free(renum);
}

/* Marks what must be written to memory: values read by another kernel (directly, through
 * views, or through an inline broadcast) and graph outputs. */
static void mark_stored(const Graph *g, FusionPlan *p)
{
    for (NodeId id = 0; id < g->nnodes; id++) {
        if (p->role[id] != ROLE_KERNEL) continue;
        int32_t k = p->kernel_of[id];
        const Node *n = &g->nodes[id];
        if (p->kernels[k].kind == KERNEL_GEMM && n->op == OP_MATMUL && p->kernels[k].written == IR_NONE &&
            p->kernels[k].summed == IR_NONE)
            p->stored[id] = 1; /* BLAS writes it */
        if (p->cls[id] == CLASS_TOTAL) p->stored[id] = 1;
        for (uint32_t j = 0; j < n->ninputs; j++) {
            NodeId r = fusion_root(g, p, ir_input(g, id, (int)j));
            if (fusion_is_broadcast(g, p, r, k, id)) r = fusion_root(g, p, ir_input(g, r, 0));
            if (p->role[r] == ROLE_KERNEL && p->kernel_of[r] != k) p->stored[r] = 1;
        }
    }
    for (int32_t o = 0; o < g->noutputs; o++) {
        NodeId r = fusion_root(g, p, g->outputs[o].node);
        if (p->role[r] == ROLE_KERNEL) p->stored[r] = 1;
    }
}

/* ---- recomputation ---- */

/* Is operand root q loaded, not computed, by a kernel that recomputes its reader? */
static bool recompute_leaf(const FusionPlan *p, NodeId q) { return p->role[q] != ROLE_KERNEL || p->stored[q]; }

/* Above this many operations (a transcendental function counts as RECOMPUTE_CALL) a value
 * is stored once rather than recomputed by every kernel that reads it. GELU's backward
 * values from the stored pre-activation cost about 16. */
#define RECOMPUTE_MAX 24
#define RECOMPUTE_CALL 6

/* Broadcast operands of a recomputed value, which its readers must be able to read; and
 * the values of its cone counted so far (each costs at least 1, so at most RECOMPUTE_MAX). */
#define RECOMPUTE_BROADCASTS 4
typedef struct {
    NodeId list[RECOMPUTE_BROADCASTS];
    int n;
    NodeId counted[RECOMPUTE_MAX + 1];
    int ncounted;
} Broadcasts;

/* The cost of computing member r of kernel k from values another kernel can load at the
 * same linear index (stored values, inputs, parameters, constants) or as a broadcast of a
 * constant or a stored value (collected in *bc: the readers must be able to read them), or
 * -1 when that is not possible: a row value, random numbers, a view BLAS reads in place.
 * A value the cone reads twice is computed once (the reader's code names it once), so it is
 * counted once: counted as a tree, 1 - tanh(u)^2 from a half-precision pre-activation cost
 * 31 and GELU's backward went through memory in bf16. */
static int recompute_cost(const Graph *g, const FusionPlan *p, NodeId r, int32_t k, Broadcasts *bc)
{
    for (int c = 0; c < bc->ncounted; c++)
        if (bc->counted[c] == r) return 0;
    const Node *n = &g->nodes[r];
    if (!is_elementwise(g, r) || (ir_op_info[n->op].flags & OPF_RANDOM)) return -1;
    if (p->role[r] != ROLE_KERNEL || p->kernel_of[r] != k || p->cls[r] != CLASS_FULL) return -1;
    /* A narrowing cast (mixed precision's half-precision copy of an activation) is there to
     * be stored: readers computing it, or a value computed from it, again would keep the
     * wide value alive in its place (gpt2-124m in bf16: each attention output's fp32
     * product, 151 MB, through the backward pass). */
    if (n->op == OP_CAST && ir_dtype_size((DType)n->dtype) < ir_dtype_size((DType)g->nodes[ir_input(g, r, 0)].dtype)) return -1;
    int cost = 1;
    switch ((Op)n->op) {
    case OP_EXP:
    case OP_LOG:
    case OP_TANH:
    case OP_SIGMOID:
    case OP_ERF:
    case OP_SIN:
    case OP_COS:
    case OP_POW: cost = RECOMPUTE_CALL; break;
    default: break;
    }
    for (uint32_t j = 0; j < n->ninputs; j++) {
        NodeId x = ir_input(g, r, (int)j);
        for (NodeId v = x; v != fusion_root(g, p, v); v = ir_input(g, v, 0))
            if (p->role[v] == ROLE_STRIDED) return -1;
        NodeId q = fusion_root(g, p, x);
        if (fusion_is_broadcast(g, p, q, k, r)) {
            /* Only for loop kernels' values: a GEMM epilogue's value recomputed from its
             * product and a broadcast bias would keep the product alive instead (gpt's
             * arena 129 -> 146 MB with it). */
            if (p->kernels[k].kind != KERNEL_LOOP) return -1;
            NodeId src = fusion_root(g, p, ir_input(g, q, 0));
            bool loaded = p->role[src] == ROLE_INLINE ? g->nodes[src].op == OP_CONST : recompute_leaf(p, src);
            if (!loaded || bc->n == RECOMPUTE_BROADCASTS) return -1;
            bc->list[bc->n++] = q;
            continue;
        }
        if (p->role[q] == ROLE_INLINE) {
            /* An iota is computed from the reader's coordinates: its readers must have
             * them (broadcast_readable checks it, as for a broadcast). A cross-entropy's
             * one-hot mask, eq(iota, targets), is then computed where it is read, not
             * stored (gpt2-124m: 206 MB of bool at the arena's peak). */
            if (g->nodes[q].op == OP_IOTA && p->kernels[k].kind == KERNEL_LOOP && bc->n < RECOMPUTE_BROADCASTS) {
                bc->list[bc->n++] = q;
                continue;
            }
            if (g->nodes[q].op != OP_CONST) return -1;
            continue;
        }
        if (recompute_leaf(p, q)) continue;
        int c = recompute_cost(g, p, q, k, bc);
        if (c < 0) return -1;
        cost += c;
        if (cost > RECOMPUTE_MAX) return -1;
    }
    if (bc->ncounted == RECOMPUTE_MAX + 1) return -1;
    bc->counted[bc->ncounted++] = r;
    return cost;
}

/* Can reader u, a member of another kernel than r's, compute r itself? Element for element
 * in a loop kernel or a GEMM epilogue, not as a reduction's operand. Views of r pass their
 * readers on. */
static bool reads_recomputable(const Graph *g, const FusionPlan *p, const Users *U, NodeId v, int32_t k)
{
    if (U->output[v]) return false;
    for (int32_t i = U->first[v]; i < U->first[v + 1]; i++) {
        NodeId u = U->list[i];
        if (p->role[u] == ROLE_VIEW) {
            if (!reads_recomputable(g, p, U, u, k)) return false;
            continue;
        }
        if (p->role[u] != ROLE_KERNEL) return false;
        int32_t ku = p->kernel_of[u];
        if (ku == k) continue;
        const Node *n = &g->nodes[u];
        if (p->kernels[ku].kind == KERNEL_SINGLE || n->op == OP_MATMUL || p->cls[u] != CLASS_FULL) return false;
        if (!is_elementwise(g, u)) return false;
    }
    return true;
}

/* Can every reader of v outside kernel k (through views) read expand e as a broadcast, or
 * the inline iota e from its coordinates (as readable() lets a kernel read one): its kept
 * axes a suffix of the reader kernel's shape (of the last two in a GEMM epilogue)? */
static bool broadcast_readable(const Graph *g, const FusionPlan *p, const Users *U, NodeId v, int32_t k, NodeId e)
{
    const bool iota = g->nodes[e].op == OP_IOTA;
    const int first = iota ? (int)ir_attrs(g, e)[0] : fusion_first_kept_axis(g, e);
    const bool scalar = !iota && first == g->nodes[ir_input(g, e, 0)].shape.rank;
    for (int32_t i = U->first[v]; i < U->first[v + 1]; i++) {
        NodeId u = U->list[i];
        if (p->role[u] == ROLE_VIEW) {
            if (!broadcast_readable(g, p, U, u, k, e)) return false;
            continue;
        }
        int32_t ku = p->kernel_of[u];
        if (ku == k) continue;
        const Kernel *K = &p->kernels[ku];
        if (!iota && !fusion_is_broadcast(g, p, e, ku, u)) return false;
        if (!scalar && !suffix_aligned(&K->shape, &g->nodes[e].shape, first, K->kind == KERNEL_GEMM ? 2 : -1)) return false;
    }
    return true;
}

/* Marks r, a member of kernel k, and the unstored values it is computed from as recomputed
 * (broadcasts are read, not recomputed). */
static void mark_cone(const Graph *g, FusionPlan *p, NodeId r, int32_t k)
{
    p->recomputed[r] = 1;
    for (uint32_t j = 0; j < g->nodes[r].ninputs; j++) {
        NodeId q = fusion_root(g, p, ir_input(g, r, (int)j));
        if (!recompute_leaf(p, q) && !fusion_is_broadcast(g, p, q, k, r)) mark_cone(g, p, q, k);
    }
}

/* Stored elementwise members that every other reader can compute itself, cheaply, become
 * recomputed and are no longer stored. In node order, so that a value's operands are
 * decided first (a recomputed operand is recomputed along with it). */
static void mark_recomputed(const Graph *g, FusionPlan *p, const Users *U)
{
    for (NodeId id = 0; id < g->nnodes; id++) {
        if (p->role[id] != ROLE_KERNEL || !p->stored[id]) continue;
        int32_t k = p->kernel_of[id];
        if (p->kernels[k].kind == KERNEL_SINGLE || g->nodes[id].op == OP_MATMUL) continue;
        if (!reads_recomputable(g, p, U, id, k)) continue;
        Broadcasts bc = {.n = 0};
        bool readable_broadcasts = recompute_cost(g, p, id, k, &bc) >= 0;
        for (int b = 0; b < bc.n && readable_broadcasts; b++) readable_broadcasts = broadcast_readable(g, p, U, id, k, bc.list[b]);
        if (readable_broadcasts) {
            p->stored[id] = 0;
            mark_cone(g, p, id, k);
            continue;
        }
        /* A widening cast of a narrower member (amax's mask of ties, bool to float): store
         * the narrow value instead, and the readers cast it; a quarter of the bytes. */
        const Node *n = &g->nodes[id];
        if (n->op != OP_CAST) continue;
        NodeId q = fusion_root(g, p, ir_input(g, id, 0));
        if (p->role[q] != ROLE_KERNEL || p->kernel_of[q] != k || p->cls[q] != CLASS_FULL || p->stored[q]) continue;
        if (ir_dtype_size((DType)g->nodes[q].dtype) >= ir_dtype_size((DType)n->dtype)) continue;
        p->stored[q] = 1;
        p->stored[id] = 0;
        p->recomputed[id] = 1;
    }
}

/* Loop kernels none of whose values is stored any more (every reader recomputes them) are
 * dropped: their members have no kernel (kernel_of -1) and are computed where they are
 * read. */
static void drop_unstored_kernels(FusionPlan *p)
{
    int32_t *renum = xmalloc(((size_t)p->nkernels + 1) * sizeof *renum), nk = 0, at = 0;
    for (int32_t k = 0; k < p->nkernels; k++) {
        Kernel K = p->kernels[k];
        bool stores = K.kind != KERNEL_LOOP;
        for (int32_t i = 0; i < K.count && !stores; i++) stores = p->stored[p->members[K.first + i]];
        renum[k] = stores ? nk : -1;
        if (!stores) continue;
        memmove(p->members + at, p->members + K.first, (size_t)K.count * sizeof *p->members);
        K.first = at;
        at += K.count;
        p->kernels[nk++] = K;
    }
    for (NodeId id = 0; id < p->nnodes; id++)
        if (p->kernel_of[id] >= 0) p->kernel_of[id] = renum[p->kernel_of[id]];
    p->nkernels = nk;
    free(renum);
}

/* ---- strided views ---- */

/* Do all readers of v, through reshapes, detaches and other strided views, take it as a
 * matrix-product operand that BLAS can read in place, or as an operand the fused attention
 * kernel reads by strides? */
bool fusion_attention_strided_operand(const Graph *g, NodeId op, int j, bool *mask)
{
    const Node *n = &g->nodes[op];
    const int64_t kind = ir_attrs(g, op)[0];
    const bool has_mask = kind == ATTN_MASK_KEEP || kind == ATTN_MASK_DROP || kind == ATTN_MASK_ADD;
    *mask = has_mask && j == 3;
    return j < 3 || *mask || (n->op == OP_ATTENTION_GRAD && (j == (int)n->ninputs - 3 || j == (int)n->ninputs - 1)); /* out, dout */
}

static bool read_in_place(const Graph *g, const FusionPlan *p, const Users *U, NodeId v)
{
    if (U->output[v]) return false;
    for (int32_t i = U->first[v]; i < U->first[v + 1]; i++) {
        NodeId u = U->list[i];
        Op op = (Op)g->nodes[u].op;
        if (op == OP_RESHAPE || op == OP_DETACH) {
            if (!read_in_place(g, p, U, u)) return false;
        } else if (op == OP_MATMUL) {
            FusionLayout L;
            bool trans;
            if (!fusion_layout(g, p, v, &L) || !fusion_gemm_operand(g, &L, v, &trans)) return false;
        } else if (op == OP_ATTENTION || op == OP_ATTENTION_LSE || op == OP_ATTENTION_GRAD) {
            FusionLayout L;
            Dim st[4];
            bool mask;
            for (uint32_t j = 0; j < g->nodes[u].ninputs; j++)
                if (ir_input(g, u, (int)j) == v && (!fusion_attention_strided_operand(g, u, (int)j, &mask) || !fusion_layout(g, p, v, &L) ||
                                                    !fusion_attention_operand(g, &L, v, mask, st)))
                    return false;
        } else if (!((op == OP_PERMUTE || op == OP_SLICE || op == OP_EXPAND) && p->role[u] == ROLE_STRIDED)) {
            return false;
        }
    }
    return true;
}

/* Permutes and slices whose every reader is a matrix product that can read them in place
 * become strided views: no kernel, no memory. A candidate that some reader cannot take is
 * dropped (it becomes a copy kernel) and the rest re-checked until nothing changes. */
static void users_build(const Graph *g, Users *U)
{
    size_t nn = (size_t)g->nnodes + 1;
    U->first = xcalloc(nn + 1, sizeof *U->first);
    U->output = xcalloc(nn, sizeof *U->output);
    int32_t total = 0;
    for (NodeId id = 0; id < g->nnodes; id++) total += (int32_t)g->nodes[id].ninputs;
    U->list = xmalloc(((size_t)total + 1) * sizeof *U->list);
    for (NodeId id = 0; id < g->nnodes; id++)
        for (uint32_t j = 0; j < g->nodes[id].ninputs; j++) U->first[ir_input(g, id, (int)j) + 1]++;
    for (NodeId v = 0; v < g->nnodes; v++) U->first[v + 1] += U->first[v];
    int32_t *fill = xmalloc(nn * sizeof *fill);
    memcpy(fill, U->first, (size_t)g->nnodes * sizeof *fill);
    for (NodeId id = 0; id < g->nnodes; id++)
        for (uint32_t j = 0; j < g->nodes[id].ninputs; j++) {
            NodeId x = ir_input(g, id, (int)j);
            U->list[fill[x]++] = id;
        }
    free(fill);
    for (int32_t o = 0; o < g->noutputs; o++) U->output[g->outputs[o].node] = true;
}

static void users_free(Users *U)
{
    free(U->first);
    free(U->list);
    free(U->output);
}

static void plan_strided(const Graph *g, FusionPlan *p, const Users *U)
{
    for (NodeId id = 0; id < g->nnodes; id++)
        if (g->nodes[id].op == OP_PERMUTE || g->nodes[id].op == OP_SLICE || g->nodes[id].op == OP_EXPAND)
            p->role[id] = ROLE_STRIDED;
    for (bool changed = true; changed;) {
        changed = false;
        for (NodeId id = 0; id < g->nnodes; id++)
            if (p->role[id] == ROLE_STRIDED && !read_in_place(g, p, U, id)) {
                p->role[id] = ROLE_MEMORY; /* decided by the grouping below */
                changed = true;
            }
    }
}

/* Is a node's candidate kernel a tried before b? The newest first, except that a GEMM
 * comes before a kernel of values copied for the backward pass (NODE_RECOMPUTED: mixed
 * precision's GELU, recomputed from its half-precision pre-activation): the gradient then
 * joins the product's epilogue, computed while the block is in cache, and reads the
 * copies, which mark_recomputed computes again there from what they read when they are
 * cheap (as in fp32, where the same values are the forward kernel's), instead of the
 * copies' kernel starting the chain and the product's output going through memory. */
static bool candidate_before(const Fuser *f, NodeId id, int32_t a, int32_t b)
{
    const Graph *g = f->g;
    const Kernel *ka = &f->p->kernels[a], *kb = &f->p->kernels[b];
    if (!(g->nodes[id].flags & NODE_RECOMPUTED)) {
        const bool copies_a = g->nodes[ka->anchor].flags & NODE_RECOMPUTED, copies_b = g->nodes[kb->anchor].flags & NODE_RECOMPUTED;
        if (ka->kind == KERNEL_GEMM && copies_b) return true;
        if (kb->kind == KERNEL_GEMM && copies_a) return false;
    }
    return a > b;
}

void fusion_plan(const Graph *g, FusionPlan *p)
{
    memset(p, 0, sizeof *p);
    size_t nn = (size_t)g->nnodes + 1;
    p->nnodes = g->nnodes;
    p->role = xcalloc(nn, 1);
    p->cls = xcalloc(nn, 1);
    p->stored = xcalloc(nn, 1);
    p->recomputed = xcalloc(nn, 1);
    p->kernel_of = xmalloc(nn * sizeof *p->kernel_of);
    for (NodeId i = 0; i < g->nnodes; i++) p->kernel_of[i] = -1;
    Fuser f = {.g = g, .p = p};
    users_build(g, &f.users);
    plan_strided(g, p, &f.users);
    for (NodeId id = 0; id < g->nnodes; id++) {
        const Node *n = &g->nodes[id];
        if (p->role[id] == ROLE_STRIDED) continue;
        switch ((Op)n->op) {
        case OP_INPUT:
        case OP_PARAM:
        case OP_LOSS_SCALE: p->role[id] = ROLE_MEMORY; continue; /* the scale: read from the step's io */
        case OP_RESHAPE:
        case OP_DETACH: p->role[id] = ROLE_VIEW; continue;
        case OP_CONST:
        case OP_IOTA:
        case OP_RANDOM_UNIFORM: p->role[id] = ROLE_INLINE; continue;
        case OP_EXPAND:
            if (!try_join_expand(&f, id)) p->role[id] = ROLE_INLINE;
            continue;
        case OP_MATMUL: start_single(&f, id, KERNEL_GEMM); continue;
        case OP_ATTENTION:
        case OP_ATTENTION_LSE:
        case OP_ATTENTION_GRAD:
            if (!join_attention(&f, id)) start_single(&f, id, KERNEL_SINGLE);
            continue;
        case OP_PERMUTE:
            if (try_join_written(&f, id) || try_join_attention_written(&f, id)) continue;
            break;
        case OP_REDUCE_SUM:
            if (try_join_summed(&f, id)) continue;
            break;
        default: break;
        }
        if (is_elementwise(g, id) || n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX) {
            /* the kernels of the operands, newest first */
            int32_t cand[4];
            int nc = 0;
            for (uint32_t j = 0; j < n->ninputs && j < 4; j++) {
                NodeId r = fusion_root(g, p, ir_input(g, id, (int)j));
                if (p->role[r] != ROLE_KERNEL) continue;
                int32_t k = p->kernel_of[r];
                bool dup = false;
                for (int c = 0; c < nc; c++) dup |= cand[c] == k;
                if (!dup) cand[nc++] = k;
            }
            for (int a = 0; a < nc; a++)
                for (int b = a + 1; b < nc; b++)
                    if (candidate_before(&f, id, cand[b], cand[a])) {
                        int32_t t = cand[a];
                        cand[a] = cand[b];
                        cand[b] = t;
                    }
            bool joined = false;
            for (int c = 0; c < nc && !joined; c++) joined = try_join(&f, cand[c], id);
            if (!joined) start_loop(&f, id);
            continue;
        }
        start_single(&f, id, KERNEL_SINGLE);
    }
    /* Graph outputs that are inline values get a kernel to compute them into memory. */
    for (int32_t o = 0; o < g->noutputs; o++) materialise(&f, fusion_root(g, p, g->outputs[o].node));
    order_kernels(&f);
    mark_stored(g, p);
    mark_recomputed(g, p, &f.users);
    const int32_t grouped = p->nkernels; /* the grouping's arrays, before any is dropped */
    drop_unstored_kernels(p);
    for (int32_t k = 0; k < grouped; k++) {
        free(f.mem[k]);
        free(f.deps[k]);
    }
    free(f.mem);
    free(f.nmem);
    free(f.capmem);
    free(f.deps);
    free(f.ndeps);
    free(f.capdeps);
    free(f.has_rows);
    free(f.mark);
    free(f.stack);
    users_free(&f.users);
}

void fusion_free(FusionPlan *p)
{
    free(p->kernels);
    free(p->members);
    free(p->role);
    free(p->cls);
    free(p->kernel_of);
    free(p->stored);
    free(p->recomputed);
    memset(p, 0, sizeof *p);
}

/* ---- listing ---- */

/* What a loop kernel computes, for the listing: the classic patterns by their ops. */
static const char *loop_label(const Graph *g, const FusionPlan *p, const Kernel *K)
{
    int sums = 0, maxes = 0, exps = 0, logs = 0, sqrts = 0, totals = 0;
    for (int32_t i = 0; i < K->count; i++) {
        NodeId id = p->members[K->first + i];
        switch ((Op)g->nodes[id].op) {
        case OP_REDUCE_SUM:
            if (p->cls[id] == CLASS_TOTAL) totals++;
            else sums++;
            break;
        case OP_REDUCE_MAX: maxes++; break;
        case OP_EXP: exps++; break;
        case OP_LOG: logs++; break;
        case OP_SQRT: sqrts++; break;
        default: break;
        }
    }
    if (maxes && exps && logs) return totals ? "log-softmax with a total (cross-entropy)" : "log-softmax (cross-entropy)";
    if (maxes && exps) return "softmax";
    if (sums >= 2 && sqrts) return "normalisation (layer norm)";
    if (sums && K->axes && !(K->axes >> (K->shape.rank - 1) & 1)) return "column sums (bias gradients)";
    if (sums >= 2) return "row reductions (normalisation gradient)";
    if (sums || maxes) return "row reduction";
    return "elementwise";
}

static void print_axes(StrBuf *o, uint64_t axes)
{
    sb_puts(o, "[");
    bool first = true;
    for (int a = 0; a < 64; a++)
        if (axes >> a & 1) {
            sb_printf(o, "%s%d", first ? "" : ", ", a);
            first = false;
        }
    sb_puts(o, "]");
}

void fusion_print(const Graph *g, const FusionPlan *p, StrBuf *o)
{
    int loops = 0, gemms = 0, singles = 0, fused_nodes = 0;
    for (int32_t k = 0; k < p->nkernels; k++) {
        const Kernel *K = &p->kernels[k];
        loops += K->kind == KERNEL_LOOP;
        gemms += K->kind == KERNEL_GEMM;
        singles += K->kind == KERNEL_SINGLE;
        fused_nodes += K->count;
    }
    sb_printf(o, "# %d kernel%s for %d computing node%s: %d loop, %d GEMM, %d single-node\n", p->nkernels, p->nkernels == 1 ? "" : "s",
              fused_nodes, fused_nodes == 1 ? "" : "s", loops, gemms, singles);
    for (int32_t k = 0; k < p->nkernels; k++) {
        const Kernel *K = &p->kernels[k];
        const Node *a = &g->nodes[K->anchor];
        sb_printf(o, "kernel %d ", k);
        if (K->kind == KERNEL_LOOP) {
            sb_printf(o, "loop %s", ir_dtype_name((DType)a->dtype));
            ir_shape_format(o, g, &K->shape);
            if (K->axes) {
                sb_puts(o, " rows over axes ");
                print_axes(o, K->axes);
            }
            sb_printf(o, ": %s", loop_label(g, p, K));
        } else if (K->kind == KERNEL_GEMM) {
            sb_puts(o, "gemm f32");
            ir_shape_format(o, g, &K->shape);
            sb_puts(o, K->written != IR_NONE || K->summed != IR_NONE ? ": matmul" : K->count > 1 ? ": matmul with epilogue" : ": matmul");
            if (K->written != IR_NONE) sb_printf(o, " written permuted as %%%d", K->written);
            if (K->summed != IR_NONE) sb_printf(o, " summed over the batch as %%%d", K->summed);
            for (int j = 0; j < 2; j++) {
                NodeId x = ir_input(g, K->anchor, j);
                FusionLayout L;
                bool trans;
                if (!fusion_layout(g, p, x, &L) || fusion_is_contiguous(g, &L, x)) continue;
                sb_printf(o, "; %s = %%%d in place from ", j ? "B" : "A", x);
                fusion_layout_format(o, g, &L);
                if (fusion_gemm_operand(g, &L, x, &trans) && trans) sb_puts(o, " transposed");
            }
        } else if (a->op == OP_ATTENTION || a->op == OP_ATTENTION_LSE || a->op == OP_ATTENTION_GRAD) {
            sb_printf(o, "%s: fused, %s", ir_op_info[a->op].name, a->op == OP_ATTENTION_GRAD ? "the probabilities recomputed" : "no [T, S] tensor");
            if (K->written != IR_NONE) sb_printf(o, "; written permuted as %%%d", K->written);
            for (uint32_t j = 0; j < a->ninputs; j++) { /* the operands read in place by strides */
                const NodeId x = ir_input(g, K->anchor, (int)j);
                FusionLayout L;
                if (p->role[x] != ROLE_STRIDED || !fusion_layout(g, p, x, &L)) continue;
                sb_printf(o, "; %%%d in place from ", x);
                fusion_layout_format(o, g, &L);
            }
        } else {
            sb_printf(o, "%s", ir_op_info[a->op].name);
        }
        if (a->loc.line && g->nfiles) sb_printf(o, " @%s:%u", g->files[a->loc.file < (uint32_t)g->nfiles ? a->loc.file : 0], a->loc.line);
        sb_putc(o, '\n');
        for (int32_t i = 0; i < K->count; i++) {
            NodeId id = p->members[K->first + i];
            const Node *n = &g->nodes[id];
            static const char *cls[] = {"full", "row", "total"};
            sb_printf(o, "    %%%d = %s", id, ir_op_info[n->op].name);
            for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, "%s%%%d", j ? ", " : " ", ir_input(g, id, (int)j));
            sb_printf(o, " : %s", ir_dtype_name((DType)n->dtype));
            ir_shape_format(o, g, &n->shape);
            if (K->kind == KERNEL_LOOP) sb_printf(o, " %s", cls[p->cls[id]]);
            if (p->stored[id]) sb_puts(o, " stored");
            if (p->recomputed[id] && !p->stored[id]) sb_puts(o, " recomputed by its readers");
            sb_putc(o, '\n');
        }
    }
    bool any = false;
    for (NodeId id = 0; id < g->nnodes; id++) {
        if (p->role[id] != ROLE_KERNEL || p->kernel_of[id] >= 0) continue;
        const Node *n = &g->nodes[id];
        sb_printf(o, "%s    %%%d = %s", any ? "" : "computed only where read (no kernel stores them):\n", id, ir_op_info[n->op].name);
        for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, "%s%%%d", j ? ", " : " ", ir_input(g, id, (int)j));
        sb_printf(o, " : %s", ir_dtype_name((DType)n->dtype));
        ir_shape_format(o, g, &n->shape);
        sb_putc(o, '\n');
        any = true;
    }
}
