/* cuda_gemm.c — the CUDA target's choice of a cuBLASLt epilogue for a matrix product, and its
 * call (cuda.c writes the rest of a GEMM kernel: the cublasSgemm / cublasGemmEx path and the
 * epilogue kernel, which stay as the fallback).
 *
 * Why: a product followed by its bias and activation as a separate elementwise kernel reads
 * and writes the product's memory twice more than cuBLASLt's fused epilogue, which adds the
 * bias (along D's rows: a Linear layer's out-features) and applies relu or tanh-GELU while
 * the tile is in registers. The fusion plan's GEMM kernel says what the epilogue is; this
 * file takes it to cuBLASLt only when cuBLASLt computes exactly the values the plan stores:
 *   - the product itself is read by nothing but the kernel's own members (cuBLASLt never
 *     writes it);
 *   - the stored members are the bias add (BIAS), the relu of it (RELU_BIAS), the tanh-GELU
 *     of it (GELU_BIAS), or the GELU with its input stored for the backward pass
 *     (GELU_AUX_BIAS: the aux buffer is the arena value the backward reads);
 *   - or the residual add of the bias add, or of the product alone (a transformer block's
 *     x + proj(...)): cuBLASLt reads the residual as C with beta 1 (BIAS, DEFAULT);
 *   - mixed precision: a stored value may be the half copy (bf16/fp16, the operands' type)
 *     of the bias add or activation, or of the product alone (DEFAULT), what the next
 *     products read: D, and aux, in that type, rounded to nearest even as the cast does;
 *   - the bias runs along the product's last axis, from one float32 vector read in place.
 *   - GELU's backward of the product (DGELU, its input read as aux), recognised by value
 *     (below), not by shape.
 * Anything else stays as today, and the launch function says why in a comment: relu's mask
 * stored for the backward (cuBLASLt's RELU_AUX is a bit mask in its own layout, which only
 * its DRELU epilogue reads), an erf GELU, batched or permuted products.
 * The GELU recognised is the expansion frontend writes for gelu(x, tanh), in its order
 * (x * 0.5 * (1 + tanh((x + x^3 * 0.044715) * sqrt(2 / pi)))), which is also the order the
 * emulator's cuBLASLt computes it in: under cuda-emu the same bits as the epilogue kernel.
 * A residual is added before the bias there, (AB + C) + bias, where the epilogue kernel adds
 * it after: an ulp or so apart, as the GPU's own order is. */
#include "cuda_internal.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static NodeId skip_reshapes(const Graph *g, NodeId x)
{
    while (g->nodes[x].op == OP_RESHAPE) x = ir_input(g, x, 0);
    return x;
}

/* Is x (through reshapes and broadcasts) the constant v, as a float? */
static bool is_const(const Graph *g, NodeId x, double v)
{
    while (g->nodes[x].op == OP_RESHAPE || g->nodes[x].op == OP_EXPAND) x = ir_input(g, x, 0);
    return g->nodes[x].op == OP_CONST && (float)g->nodes[x].fattr[0] == (float)v;
}

/* Is n a binary op `op` of a and b, in either order (a commutative op gives the same bits)?
 * Sets *other to the operand that is not a (when a is given) . */
static bool binary(const Graph *g, NodeId n, Op op, NodeId a, NodeId *other)
{
    if (g->nodes[n].op != op) return false;
    NodeId x = ir_input(g, n, 0), y = ir_input(g, n, 1);
    if (x == a) {
        *other = y;
        return true;
    }
    if (y == a) {
        *other = x;
        return true;
    }
    return false;
}

/* Is n a binary op `op` of the constant v and another operand (set in *other)? */
static bool with_const(const Graph *g, NodeId n, Op op, double v, NodeId *other)
{
    if (g->nodes[n].op != op) return false;
    for (int side = 0; side < 2; side++)
        if (is_const(g, ir_input(g, n, side), v)) {
            *other = ir_input(g, n, 1 - side);
            return true;
        }
    return false;
}

/* Is node o tanh-GELU of x, as gelu(x, tanh) expands: x * 0.5 * (1 + tanh((x + x*x*x *
 * 0.044715) * 0.7978845608028654))? */
static bool is_tanh_gelu(const Graph *g, NodeId o, NodeId x)
{
    if (g->nodes[o].op != OP_MUL) return false;
    for (int side = 0; side < 2; side++) {
        NodeId half = ir_input(g, o, side), rest = ir_input(g, o, 1 - side), c, th, u, s, q, cube, sq;
        if (!binary(g, half, OP_MUL, x, &c) || !is_const(g, c, 0.5)) continue;
        /* rest = tanh(u) + 1 */
        if (!with_const(g, rest, OP_ADD, 1.0, &th) || g->nodes[th].op != OP_TANH) continue;
        u = ir_input(g, th, 0);
        /* u = s * sqrt(2 / pi), s = x + q, q = cube * 0.044715, cube = (x * x) * x */
        if (!with_const(g, u, OP_MUL, 0.7978845608028654, &s) || !binary(g, s, OP_ADD, x, &q)) continue;
        if (!with_const(g, q, OP_MUL, 0.044715, &cube) || !binary(g, cube, OP_MUL, x, &sq) || !binary(g, sq, OP_MUL, x, &c) || c != x) continue;
        return true;
    }
    return false;
}

/* Does a node outside kernel L (or a graph output) read the product mm? */
static bool read_outside(const CgKernel *L, NodeId mm)
{
    const Graph *g = L->g;
    for (NodeId v = 0; v < g->nnodes; v++) {
        const uint8_t role = L->f->role[v];
        if (role == ROLE_VIEW || role == ROLE_STRIDED || cg_in_kernel(L, v)) continue;
        for (uint32_t j = 0; j < g->nodes[v].ninputs; j++)
            if (fusion_root(g, L->f, ir_input(g, v, (int)j)) == mm) return true;
    }
    for (int q = 0; q < g->noutputs; q++)
        if (fusion_root(g, L->f, g->outputs[q].node) == mm) return true;
    return false;
}

static bool why(CudaLtPlan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static bool why(CudaLtPlan *p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why, sizeof p->why, fmt, ap);
    va_end(ap);
    return p->epilogue != CUDA_LT_NONE;
}

static Dim numel(const Shape *s)
{
    Dim n = ir_dim_const(1);
    for (int a = 0; a < s->rank; a++)
        if (!ir_dim_mul(n, s->d[a], &n)) return ir_dim_const(-1);
    return n;
}

/* Does the product of L read x (through views) as A or B? */
static bool reads_operand(const CgKernel *L, NodeId x)
{
    const NodeId mm = L->K->anchor;
    for (int side = 0; side < 2; side++)
        if (fusion_root(L->g, L->f, ir_input(L->g, mm, side)) == x) return true;
    return false;
}

/* Is a member of L the residual add of x: x (through reshapes) plus a float32 value of as
 * many elements, stored and read in place in the same order (through reshapes only, no
 * broadcast or permutation)? Sets *res to the add and *r to that value: cuBLASLt's C, added
 * with beta 1 (D = AB + C, then the bias). */
static bool residual_add(const CgKernel *L, NodeId x, NodeId *res, NodeId *r)
{
    const Graph *g = L->g;
    for (int i = 1; i < L->K->count; i++) {
        const NodeId v = CG_MEMBER(L, i);
        if (g->nodes[v].op != OP_ADD) continue;
        for (int side = 0; side < 2; side++) {
            const NodeId a = ir_input(g, v, side), b = ir_input(g, v, 1 - side);
            if (skip_reshapes(g, a) != x) continue;
            const NodeId base = skip_reshapes(g, b);
            if (fusion_root(g, L->f, b) != base || g->nodes[base].dtype != DT_F32 || base == x) continue;
            bool loaded = false;
            for (int q = 0; q < L->nreads; q++) loaded |= L->reads[q] == base;
            const Dim nb = numel(&g->nodes[base].shape), nv = numel(&g->nodes[v].shape);
            if (!loaded || nb.k < 0 || !ir_dim_eq(nb, nv)) continue;
            *res = v;
            *r = base;
            return true;
        }
    }
    return false;
}

/* ---- GELU's backward (DGELU) ----
 * Autodiff writes the tanh-GELU's derivative as a dozen elementwise nodes, which fusion puts
 * in the epilogue of the product dY W that computes their incoming gradient. cuBLASLt's
 * DGELU epilogue computes D = (AB) * gelu'(aux) with aux the GELU's input. Rather than match
 * autodiff's expansion node by node (any rewrite of it would silently stop the match), the
 * stored value is taken for a function of the product and one elementwise operand and
 * evaluated (in double, with the interpreter's arithmetic) at points that tell the two
 * apart; it is DGELU when it equals m * gelu'(x) at every one of them. */

typedef struct {
    const CgKernel *L;
    NodeId mm, x;  /* the product, and the one other elementwise operand (IR_NONE: none yet) */
    uint8_t *seen; /* per node: evaluable, and in order[] */
    NodeId *order; /* the evaluable nodes, each after its operands */
    int n, depth;
} Probe;

/* Can f(m, x) be evaluated from node v: elementwise arithmetic of the product (through
 * reshapes), one operand read at the element itself (through widening casts) and
 * constants? Sets pr->x, and appends v (after its operands) to pr->order. */
static bool probe_ok(Probe *pr, NodeId v)
{
    const CgKernel *L = pr->L;
    const Graph *g = L->g;
    if (pr->seen[v]) return true;
    if (++pr->depth > 1000) return false;
    const Node *n = &g->nodes[v];
    bool ok;
    const NodeId r = fusion_root(g, L->f, v);
    if (v == pr->mm || n->op == OP_CONST) {
        ok = true;
    } else if (n->op == OP_RESHAPE) {
        ok = probe_ok(pr, ir_input(g, v, 0));
    } else if (n->op == OP_EXPAND) { /* a broadcast: only of a constant */
        ok = g->nodes[fusion_root(g, L->f, ir_input(g, v, 0))].op == OP_CONST;
    } else if (!cg_in_kernel(L, r) && !cg_recomputed_here(L, r)) { /* loaded */
        ok = r == v && L->f->role[r] != ROLE_INLINE && (pr->x == IR_NONE || pr->x == r);
        if (ok) pr->x = r;
    } else if (n->op == OP_CAST) { /* widening: exact */
        ok = n->dtype == DT_F32 && probe_ok(pr, ir_input(g, v, 0));
    } else {
        const unsigned flags = ir_op_info[n->op].flags;
        ok = n->dtype == DT_F32 && (((flags & OPF_UNARY) && n->ninputs == 1 && probe_ok(pr, ir_input(g, v, 0))) ||
                                    ((flags & OPF_BINARY) && n->ninputs == 2 && probe_ok(pr, ir_input(g, v, 0)) &&
                                     probe_ok(pr, ir_input(g, v, 1))));
    }
    pr->depth--;
    if (!ok) return false;
    pr->seen[v] = 1;
    pr->order[pr->n++] = v;
    return true;
}

/* f(m, x) at every node of pr->order, in double, with the interpreter's arithmetic. */
static void probe_values(const Probe *pr, double m, double x, double *val)
{
    const Graph *g = pr->L->g;
    for (int i = 0; i < pr->n; i++) {
        const NodeId v = pr->order[i];
        const Node *n = &g->nodes[v];
        if (v == pr->mm) val[v] = m;
        else if (v == pr->x) val[v] = x;
        else if (n->op == OP_CONST) val[v] = n->fattr[0];
        else if (n->op == OP_EXPAND) val[v] = g->nodes[fusion_root(g, pr->L->f, ir_input(g, v, 0))].fattr[0];
        else if (n->op == OP_RESHAPE || n->op == OP_CAST) val[v] = val[ir_input(g, v, 0)];
        else if (ir_op_info[n->op].flags & OPF_UNARY) val[v] = interp_unary((Op)n->op, val[ir_input(g, v, 0)]);
        else val[v] = interp_binary((Op)n->op, val[ir_input(g, v, 0)], val[ir_input(g, v, 1)]);
    }
}

/* The tanh-GELU's derivative. */
static double gelu_grad(double x)
{
    const double k = 0.7978845608028654, c = 0.044715, t = tanh(k * (x + c * x * x * x));
    return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * k * (1 + 3 * c * x * x);
}

/* Is y (stored, or what a stored half copy copies) the product times gelu'(x) for one
 * elementwise operand x (set in *aux)? */
static bool is_dgelu(const CgKernel *L, NodeId y, NodeId *aux)
{
    const size_t nn = (size_t)L->g->nnodes + 1;
    Probe pr = {.L = L, .mm = L->K->anchor, .x = IR_NONE, .seen = xcalloc(nn, 1), .order = xcalloc(nn, sizeof(NodeId))};
    double *val = xcalloc(nn, sizeof *val);
    bool ok = probe_ok(&pr, y) && pr.x != IR_NONE;
    if (ok) {
        const Dim nx = numel(&L->g->nodes[pr.x].shape), nm = numel(&L->g->nodes[pr.mm].shape);
        ok = nx.k >= 0 && ir_dim_eq(nx, nm);
    }
    static const double xs[] = {-7.5, -3.1, -1.7, -0.9, -0.31, -0.02, 0, 0.013, 0.27, 0.8, 1.45, 2.2, 3.9, 6.4};
    static const double ms[] = {1.0, -0.37, 2.5};
    for (size_t i = 0; ok && i < sizeof xs / sizeof *xs; i++)
        for (size_t j = 0; ok && j < sizeof ms / sizeof *ms; j++) {
            probe_values(&pr, ms[j], xs[i], val);
            const double want = ms[j] * gelu_grad(xs[i]);
            ok = fabs(val[y] - want) <= 1e-9 * (1 + fabs(want));
        }
    if (ok) *aux = pr.x;
    free(pr.seen);
    free(pr.order);
    free(val);
    return ok;
}

/* ", D in bf16" / ", D in fp16" for a half-precision D, "" for float32 */
static const char *d_in(DType t) { return t == DT_BF16 ? ", D in bf16" : t == DT_F16 ? ", D in fp16" : ""; }

/* D is the residual add p->res, the only value stored: epilogue e (DEFAULT, or BIAS with the
 * bias), unless the sum is written in place of something cuBLASLt reads. */
static bool residual_epilogue(const CgKernel *L, CudaLtPlan *p, CudaLtEpilogue e)
{
    const NodeId in = L->c->mp.inplace_of[p->res];
    if (in != IR_NONE && in != L->K->anchor && in != p->residual) return why(p, "its result is written in place of %%%d", in);
    if (in == p->residual && reads_operand(L, p->residual))
        return why(p, "its result is written in place of %%%d, which the product reads", in);
    p->out = p->res;
    p->epilogue = e;
    return why(p, "%sthe residual add %%%d is the only value stored: cuBLASLt adds %%%d as C (beta 1)",
               e == CUDA_LT_BIAS ? "bias, and " : "", p->res, p->residual);
}

bool cuda_gemm_lt_plan(const CgKernel *L, CudaLtPlan *p)
{
    const Graph *g = L->g;
    const Kernel *K = L->K;
    const NodeId mm = K->anchor;
    memset(p, 0, sizeof *p);
    p->epilogue = CUDA_LT_NONE;
    p->add = p->act = p->bias = p->out = p->aux = p->res = p->residual = IR_NONE;
    if (K->kind != KERNEL_GEMM) return why(p, "not a matrix product");
    if (K->written != IR_NONE) return why(p, "the product is written permuted: no epilogue");
    if (K->summed != IR_NONE) return why(p, "products summed over a batch: no epilogue");
    if (L->rank != 2) return why(p, "a batched product (cuBLASLt's strided batches are not used for epilogues yet)");
    bool any = false;
    for (int i = 0; i < L->nstores; i++) any |= L->stores[i] != mm;
    if (!any) return why(p, "no epilogue");
    if (read_outside(L, mm)) return why(p, "the product itself is read by another kernel, and a fused epilogue never stores it");
    /* the bias add: the product (through reshapes) plus a broadcast vector along the last axis */
    for (int i = 1; i < K->count; i++) {
        const NodeId v = CG_MEMBER(L, i);
        if (g->nodes[v].op != OP_ADD) continue;
        for (int side = 0; side < 2; side++) {
            const NodeId x = ir_input(g, v, side), b = ir_input(g, v, 1 - side);
            if (skip_reshapes(g, x) != mm) continue;
            const Shape *s = &g->nodes[v].shape;
            const NodeId e = skip_reshapes(g, b);
            if (g->nodes[e].op != OP_EXPAND || s->rank < 1 || fusion_first_kept_axis(g, e) != g->nodes[e].shape.rank - 1 ||
                !ir_dim_eq(s->d[s->rank - 1], g->nodes[mm].shape.d[1]))
                continue;
            /* the vector itself: stored (a parameter, or a kernel's value), read in place */
            const NodeId base = fusion_root(g, L->f, ir_input(g, e, 0));
            const Shape *bs = &g->nodes[base].shape;
            bool loaded = false;
            for (int r = 0; r < L->nreads; r++) loaded |= L->reads[r] == base;
            if (!loaded || g->nodes[base].dtype != DT_F32 || bs->rank != 1 || !ir_dim_eq(bs->d[0], s->d[s->rank - 1])) continue;
            p->add = v;
            p->bias = base;
        }
        if (p->add != IR_NONE) break;
    }
    const DType ab = (DType)g->nodes[ir_input(g, mm, 0)].dtype;
    if (p->add == IR_NONE) {
        /* the one value stored besides the product, if one */
        NodeId out = IR_NONE;
        int others = 0;
        for (int i = 0; i < L->nstores; i++)
            if (L->stores[i] != mm) {
                out = L->stores[i];
                others++;
            }
        const Node *o = others == 1 ? &g->nodes[out] : NULL;
        const bool half = o && o->op == OP_CAST && o->dtype == ab && ab != DT_F32; /* a half copy, D in that type */
        /* no bias: the product's half copy alone (DEFAULT) */
        if (half && skip_reshapes(g, ir_input(g, out, 0)) == mm) {
            const NodeId in = L->c->mp.inplace_of[out];
            if (in != IR_NONE && in != mm) return why(p, "its result is written in place of %%%d", in);
            p->out = out;
            p->half_out = true;
            p->epilogue = CUDA_LT_DEFAULT;
            return why(p, "the product's half copy %%%d is the only value stored%s", out, d_in(ab));
        }
        /* no bias: GELU's backward of the product (DGELU, its input as aux) */
        if (o) {
            const NodeId y = half ? ir_input(g, out, 0) : out;
            NodeId x;
            if ((half || o->dtype == DT_F32) && g->nodes[y].dtype == DT_F32 && is_dgelu(L, y, &x)) {
                if (g->nodes[x].dtype != o->dtype)
                    return why(p, "GELU's backward: its input %%%d is %s and its result %%%d %s, and cuBLASLt's aux has D's type",
                               x, ir_dtype_name(g->nodes[x].dtype), out, ir_dtype_name(o->dtype));
                const NodeId in = L->c->mp.inplace_of[out];
                if (in != IR_NONE && in != mm) return why(p, "its result is written in place of %%%d", in);
                p->out = out;
                p->aux = x;
                p->half_out = half;
                p->epilogue = CUDA_LT_DGELU;
                return why(p, "GELU's backward of the product, %%%d%s; its input %%%d is read as aux", out,
                           d_in((DType)o->dtype), x);
            }
        }
        /* no bias: a residual add of the product alone (DEFAULT, the residual as C) */
        if (!residual_add(L, mm, &p->res, &p->residual))
            return why(p, "its epilogue has no bias add along the product's last axis, nor a residual add");
        for (int i = 0; i < L->nstores; i++)
            if (L->stores[i] != mm && L->stores[i] != p->res)
                return why(p, "%%%d (%s) is stored too, which no cuBLASLt epilogue computes", L->stores[i],
                           ir_op_info[g->nodes[L->stores[i]].op].name);
        return residual_epilogue(L, p, CUDA_LT_DEFAULT);
    }
    /* a residual add of the bias add: (AB + C) + bias, C the residual */
    residual_add(L, p->add, &p->res, &p->residual);
    /* the activation of the bias add, if any member is one */
    for (int i = 1; i < K->count && p->act == IR_NONE; i++) {
        const NodeId v = CG_MEMBER(L, i);
        if (g->nodes[v].op == OP_RELU && ir_input(g, v, 0) == p->add) {
            p->act = v;
            p->relu = true;
        } else if (is_tanh_gelu(g, v, p->add)) {
            p->act = v;
        }
    }
    /* what the kernel stores of the bias add and its activation: each as itself (float32)
     * or as its half-precision copy (a cast, mixed precision: what the next products read,
     * or an activation kept for the backward pass) */
    NodeId add_f32 = IR_NONE, add_half = IR_NONE, act_f32 = IR_NONE, act_half = IR_NONE;
    for (int i = 0; i < L->nstores; i++) {
        const NodeId v = L->stores[i];
        const Node *n = &g->nodes[v];
        if (v == mm) continue;
        const bool cast = n->op == OP_CAST && (n->dtype == DT_BF16 || n->dtype == DT_F16);
        const NodeId of = cast ? ir_input(g, v, 0) : v;
        if (cast && (of == p->add || (of == p->act && of != IR_NONE)) && n->dtype != ab)
            return why(p, "%%%d is stored as %s, and cuBLASLt's D is float32 or the operands' type (%s)", of,
                       ir_dtype_name(n->dtype), ir_dtype_name(ab));
        if (v == p->res) continue;
        if (of == p->add) *(cast ? &add_half : &add_f32) = v;
        else if (of == p->act && of != IR_NONE) *(cast ? &act_half : &act_f32) = v;
        else if (p->relu && n->op == OP_GT)
            return why(p, "relu's mask (%%%d) is stored for the backward pass: cuBLASLt's RELU_AUX mask is bits in its own "
                          "layout that only its DRELU epilogue reads, so relu stays in the epilogue kernel",
                       v);
        else return why(p, "%%%d (%s) is stored too, which no cuBLASLt epilogue computes", v, ir_op_info[n->op].name);
    }
    if (add_f32 != IR_NONE && add_half != IR_NONE)
        return why(p, "%%%d is stored both as float32 and as its half copy %%%d, and cuBLASLt writes one", p->add, add_half);
    if (act_f32 != IR_NONE && act_half != IR_NONE)
        return why(p, "%%%d is stored both as float32 and as its half copy %%%d, and cuBLASLt writes one", p->act, act_half);
    const NodeId add_stored = add_f32 != IR_NONE ? add_f32 : add_half, act_stored = act_f32 != IR_NONE ? act_f32 : act_half;
    const char *act = p->relu ? "relu" : "tanh-GELU";
    bool res_stored = false;
    for (int i = 0; i < L->nstores; i++) res_stored |= p->res != IR_NONE && L->stores[i] == p->res;
    if (res_stored) { /* BIAS with C: the residual sum is all that is stored */
        if (add_stored != IR_NONE || act_stored != IR_NONE)
            return why(p, "%%%d is stored besides the residual add %%%d, and cuBLASLt writes one value",
                       add_stored != IR_NONE ? add_stored : act_stored, p->res);
        return residual_epilogue(L, p, CUDA_LT_BIAS);
    }
    p->res = p->residual = IR_NONE; /* a residual add not stored: computed by another kernel */
    if (act_stored != IR_NONE && add_stored != IR_NONE && p->relu)
        return why(p, "the pre-activation %%%d is stored too, and cuBLASLt keeps relu's input only as a bit mask", p->add);
    /* D's type, and aux's: cuBLASLt's aux has D's type */
    const NodeId out = act_stored != IR_NONE ? act_stored : add_stored;
    if (act_stored != IR_NONE && add_stored != IR_NONE && g->nodes[out].dtype != g->nodes[add_stored].dtype)
        return why(p, "the GELU's input %%%d is stored as %s and its output %%%d as %s, and cuBLASLt's aux has D's type",
                   add_stored, ir_dtype_name(g->nodes[add_stored].dtype), out, ir_dtype_name(g->nodes[out].dtype));
    /* cuBLASLt writes D and aux while reading A, B and the bias: none may share memory */
    const NodeId inplace[2] = {L->c->mp.inplace_of[out], act_stored != IR_NONE && add_stored != IR_NONE ? L->c->mp.inplace_of[add_stored] : IR_NONE};
    for (int i = 0; i < 2; i++)
        if (inplace[i] != IR_NONE && inplace[i] != mm) return why(p, "its result is written in place of %%%d", inplace[i]);
    p->out = out;
    p->half_out = g->nodes[out].dtype != DT_F32;
    const char *as = d_in((DType)g->nodes[out].dtype);
    if (act_stored == IR_NONE) {
        p->epilogue = CUDA_LT_BIAS;
        return why(p, "the bias add is the only value stored%s", as);
    }
    if (p->relu) {
        p->epilogue = CUDA_LT_RELU_BIAS;
        return why(p, "bias, then relu, and only the relu is stored%s", as);
    }
    if (add_stored != IR_NONE) {
        p->epilogue = CUDA_LT_GELU_AUX_BIAS;
        p->aux = add_stored;
        return why(p, "bias, then %s%s; the backward pass reads the GELU's input %%%d, which cuBLASLt writes as aux", act, as,
                   add_stored);
    }
    p->epilogue = CUDA_LT_GELU_BIAS;
    return why(p, "bias, then %s, and only the GELU is stored%s", act, as);
}

const char *cuda_gemm_half_type(const Graph *g, NodeId mm)
{
    switch (g->nodes[ir_input(g, mm, 0)].dtype) {
    case DT_BF16: return "CUDA_R_16BF";
    case DT_F16: return "CUDA_R_16F";
    default: return NULL;
    }
}

const char *cuda_gemm_lt_name(CudaLtEpilogue e)
{
    switch (e) {
    case CUDA_LT_NONE: return "none";
    case CUDA_LT_DEFAULT: return "CUBLASLT_EPILOGUE_DEFAULT";
    case CUDA_LT_BIAS: return "CUBLASLT_EPILOGUE_BIAS";
    case CUDA_LT_RELU_BIAS: return "CUBLASLT_EPILOGUE_RELU_BIAS";
    case CUDA_LT_GELU_BIAS: return "CUBLASLT_EPILOGUE_GELU_BIAS";
    case CUDA_LT_GELU_AUX_BIAS: return "CUBLASLT_EPILOGUE_GELU_AUX_BIAS";
    case CUDA_LT_DGELU: return "CUBLASLT_EPILOGUE_DGELU";
    }
    return "none";
}

/* Wrapped as a comment: " * " before each line of text of at most ~88 columns. */
static void comment_text(StrBuf *o, const char *head, const char *text)
{
    sb_printf(o, "    /* %s", head);
    int col = 7 + (int)strlen(head);
    const char *w = text;
    while (*w) {
        const char *e = strchr(w, ' ');
        int len = e ? (int)(e - w) : (int)strlen(w);
        if (col + len + 1 > 100) {
            sb_puts(o, "\n     *");
            col = 6;
        }
        sb_printf(o, " %.*s", len, w);
        col += len + 1;
        w += len;
        while (*w == ' ') w++;
    }
    sb_puts(o, " */\n");
}

bool cuda_gemm_emit_lt(CgKernel *L, const CgOperand *A, const CgOperand *B)
{
    StrBuf *o = L->c->o;
    CudaLtPlan p;
    const char *half = cuda_gemm_half_type(L->g, L->K->anchor), *blas = half ? "cublasGemmEx" : "cublasSgemm";
    if (!cuda_gemm_lt_plan(L, &p)) {
        if (!strcmp(p.why, "no epilogue")) {
            sb_printf(o, "    /* %s: the product alone, no epilogue */\n", blas);
            return false;
        }
        char head[96];
        snprintf(head, sizeof head, "%s, then the epilogue kernel: no cuBLASLt epilogue, as", blas);
        comment_text(o, head, p.why);
        return false;
    }
    char head[128];
    snprintf(head, sizeof head, "cuBLASLt with %s:", cuda_gemm_lt_name(p.epilogue));
    comment_text(o, head, p.why);
    StrBuf offa, offb;
    sb_init(&offa);
    sb_init(&offb);
    cg_gemm_operand_offset(L, A, 0, "0", "0", &offa);
    cg_gemm_operand_offset(L, B, 0, "0", "0", &offb);
    char aux[32] = "nullptr", bias[32] = "nullptr", res[32] = "nullptr";
    if (p.aux != IR_NONE) snprintf(aux, sizeof aux, p.epilogue == CUDA_LT_DGELU ? "(void *)p%d" : "y%d", p.aux);
    if (p.bias != IR_NONE) snprintf(bias, sizeof bias, "p%d", p.bias);
    if (p.residual != IR_NONE) snprintf(res, sizeof res, "p%d", p.residual);
    const char *dtype = p.half_out ? half : "CUDA_R_32F";
    /* row-major out (M x N) is column-major out^T = B^T A^T, as the cuBLAS call below */
    sb_printf(o,
              "    const %s *a_lt = p%d + (%s), *b_lt = p%d + (%s);\n"
              "    static kiln_lt_gemm lt; /* descriptors, layouts, algorithm: made at the first call, kept */\n"
              "    if (kiln_lt_aligned(a_lt, b_lt, %s, y%d, %s, %s) &&\n"
              "        kiln_lt_matmul(&lt, %s, %s, %s, %s, %s, (int)N, (int)M, (int)K, b_lt, ldb, a_lt, lda, %s, y%d, ldc, %s, %s, stream)) {\n",
              half ? "uint16_t" : "float", A->lay.base, offa.data, B->lay.base, offb.data, res, p.out, bias, aux,
              cuda_gemm_lt_name(p.epilogue), half ? half : "CUDA_R_32F", dtype, B->trans ? "CUBLAS_OP_T" : "CUBLAS_OP_N",
              A->trans ? "CUBLAS_OP_T" : "CUBLAS_OP_N", res, p.out, bias, aux);
    sb_printf(o, "        return;\n    }\n"
                 "    /* a pointer not 16-byte aligned (a parameter's place in its slab need not be), or no\n"
                 "     * cuBLASLt algorithm for this epilogue and types: %s into the product's memory,\n"
                 "     * then the epilogue kernel */\n", blas);
    sb_free(&offa);
    sb_free(&offb);
    return true;
}

/* ---- the bias gradient as the weight gradient's epilogue (BGRADB) ----
 * A Linear layer's backward computes dW = dY^T X (a product reading dY transposed in place)
 * and db = dY summed over its rows (a column-sum kernel of its own). cuBLASLt's BGRADB sums
 * the product's B operand over k while it reads it: in cuBLAS's column-major terms the
 * row-major dW is B^T A^T with B = dY^T, so the sum over k is db. The column-sum kernel is
 * then not launched; when a pointer is not aligned, the product's launch function runs
 * cublasSgemm and then that kernel, as before. Only when the column sum is a kernel alone
 * (one member, a sum over every leading axis of a stored value), nothing but the step's
 * outputs reads it (a parameter's gradient), and no gradient bucket is sent after it. */

/* Is kernel k a column sum alone: a float32 sum over every leading axis of a stored value
 * (*x) that nothing reads (is_read marks what is read)? The value is float32, or half
 * precision (mixed precision: a gradient's half copy, which the products read too) widened
 * by the kernel's other member, its cast to float32: the widening is exact, so the sum is
 * the same as over a float32 copy. */
static bool column_sum(const Cg *c, int32_t k, const uint8_t *is_read, NodeId *x_out)
{
    const Graph *g = c->g;
    const FusionPlan *f = &c->fp;
    const Kernel *S = &f->kernels[k];
    if (S->kind != KERNEL_LOOP || (S->count != 1 && S->count != 2)) return false;
    const NodeId v = f->members[S->first + S->count - 1];
    const int r = S->shape.rank;
    if (g->nodes[v].op != OP_REDUCE_SUM || f->cls[v] != CLASS_ROW || !f->stored[v] || g->nodes[v].dtype != DT_F32 || r < 2 ||
        S->axes != ((uint64_t)1 << (r - 1)) - 1 || is_read[v])
        return false;
    NodeId in = ir_input(g, v, 0);
    if (S->count == 2) { /* the widening of a half-precision value, read by the sum alone */
        const NodeId w = f->members[S->first];
        const Node *cast = &g->nodes[w];
        if (in != w || cast->op != OP_CAST || cast->dtype != DT_F32 || f->stored[w]) return false;
        in = ir_input(g, w, 0);
        const DType t = (DType)g->nodes[in].dtype;
        if (t != DT_BF16 && t != DT_F16) return false;
    }
    const NodeId x = skip_reshapes(g, in);
    if (fusion_root(g, f, in) != x || (S->count == 1 && g->nodes[x].dtype != DT_F32)) return false;
    *x_out = x;
    return true;
}

/* Is GEMM kernel j a product x^T (x's rows along k) times anything, with no epilogue? */
static bool reads_transposed(const Cg *c, int32_t j, NodeId x)
{
    const Graph *g = c->g;
    const FusionPlan *f = &c->fp;
    const Kernel *P = &f->kernels[j];
    if (P->kind != KERNEL_GEMM || P->count != 1 || P->written != IR_NONE || P->summed != IR_NONE) return false;
    const NodeId mm = P->anchor;
    const Node *m = &g->nodes[mm];
    if (m->dtype != DT_F32 || m->shape.rank != 2) return false;
    const NodeId xa = ir_input(g, mm, 0);
    FusionLayout lay;
    bool trans;
    if (!fusion_layout(g, f, xa, &lay) || !fusion_gemm_operand(g, &lay, xa, &trans) || !trans || lay.base != x || lay.nterms)
        return false;
    const Shape *xs = &g->nodes[x].shape;
    Dim rows = ir_dim_const(1);
    for (int a = 0; a < xs->rank - 1; a++)
        if (!ir_dim_mul(rows, xs->d[a], &rows)) return false;
    const Dim width = xs->d[xs->rank - 1];
    return ir_dim_eq(m->shape.d[0], width) && ir_dim_eq(g->nodes[xa].shape.d[1], rows) &&
           ir_dim_eq(lay.stride[0], ir_dim_const(1)) && ir_dim_eq(lay.stride[1], width);
}

void cuda_gemm_plan_bgrad(Cg *c)
{
    const Graph *g = c->g;
    const FusionPlan *f = &c->fp;
    c->cuda_bgrad = xmalloc(sizeof *c->cuda_bgrad * (size_t)(f->nkernels + 1));
    uint8_t *is_read = xcalloc((size_t)g->nnodes + 1, 1);
    for (int32_t k = 0; k < f->nkernels; k++) c->cuda_bgrad[k] = -1;
    /* a sum read by any node, or a forward output (copied after its kernel) */
    for (NodeId u = 0; u < g->nnodes; u++)
        for (uint32_t q = 0; q < g->nodes[u].ninputs; q++)
            if (f->role[u] != ROLE_VIEW) is_read[fusion_root(g, f, ir_input(g, u, (int)q))] = 1;
    for (int q = 0; q < g->noutputs; q++)
        if (g->outputs[q].kind == OUT_FORWARD) is_read[fusion_root(g, f, g->outputs[q].node)] = 1;
    for (int32_t k = 0; k < f->nkernels && c->bucket_bytes <= 0; k++) {
        NodeId x;
        if (!column_sum(c, k, is_read, &x)) continue;
        for (int32_t j = k + 1; j < f->nkernels; j++)
            if (c->cuda_bgrad[j] < 0 && reads_transposed(c, j, x)) {
                c->cuda_bgrad[k] = j;
                c->cuda_bgrad[j] = k;
                break;
            }
    }
    free(is_read);
}

void cuda_gemm_free_bgrad(Cg *c)
{
    free(c->cuda_bgrad);
    c->cuda_bgrad = NULL;
}

NodeId cuda_gemm_bgrad_summed(const Cg *c, NodeId sum)
{
    NodeId in = ir_input(c->g, sum, 0);
    if (c->g->nodes[in].op == OP_CAST && !c->fp.stored[in]) in = ir_input(c->g, in, 0); /* the kernel's widening */
    return fusion_root(c->g, &c->fp, in);
}

int32_t cuda_gemm_bgrad_taker(const Cg *c, int32_t k, NodeId *sum)
{
    if (!c->cuda_bgrad || c->fp.kernels[k].kind != KERNEL_LOOP || c->cuda_bgrad[k] < 0) return -1;
    if (sum) *sum = c->fp.members[c->fp.kernels[k].first + c->fp.kernels[k].count - 1];
    return c->cuda_bgrad[k];
}

int32_t cuda_gemm_bgrad_source(const Cg *c, int32_t j, NodeId *sum)
{
    if (!c->cuda_bgrad || c->fp.kernels[j].kind != KERNEL_GEMM || c->cuda_bgrad[j] < 0) return -1;
    const int32_t k = c->cuda_bgrad[j];
    if (sum) *sum = c->fp.members[c->fp.kernels[k].first + c->fp.kernels[k].count - 1];
    return k;
}

bool cuda_gemm_emit_bgrad(CgKernel *L, const CgOperand *A, const CgOperand *B)
{
    StrBuf *o = L->c->o;
    NodeId v;
    const int32_t k = cuda_gemm_bgrad_source(L->c, L->k, &v);
    if (k < 0) return false;
    const NodeId x = cuda_gemm_bgrad_summed(L->c, v), mm = L->K->anchor;
    char text[240];
    snprintf(text, sizeof text,
             "the bias gradient %%%d, kernel %d's column sums of %%%d, is summed over k from this product's A (%%%d "
             "transposed) while it reads it",
             v, k, x, x);
    comment_text(o, "cuBLASLt with CUBLASLT_EPILOGUE_BGRADB:", text);
    StrBuf offa, offb;
    sb_init(&offa);
    sb_init(&offb);
    cg_gemm_operand_offset(L, A, 0, "0", "0", &offa);
    cg_gemm_operand_offset(L, B, 0, "0", "0", &offb);
    const char *half = cuda_gemm_half_type(L->g, mm);
    sb_printf(o,
              "    const %s *a_lt = p%d + (%s), *b_lt = p%d + (%s);\n"
              "    static kiln_lt_gemm lt; /* descriptors, layouts, algorithm: made at the first call, kept */\n"
              "    if (kiln_lt_aligned(a_lt, b_lt, nullptr, y%d, y%d, nullptr) &&\n"
              "        kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_BGRADB, %s, CUDA_R_32F, %s, %s, (int)N, (int)M, (int)K, b_lt, ldb, a_lt, lda, nullptr, y%d, ldc, y%d, nullptr, stream)) {\n"
              "        return;\n    }\n"
              "    /* a pointer not 16-byte aligned (a gradient's place in its slab need not be), or no\n"
              "     * cuBLASLt algorithm for it: %s, then kernel %d's column sums */\n",
              half ? "uint16_t" : "float", A->lay.base, offa.data, B->lay.base, offb.data, mm, v, half ? half : "CUDA_R_32F",
              B->trans ? "CUBLAS_OP_T" : "CUBLAS_OP_N", A->trans ? "CUBLAS_OP_T" : "CUBLAS_OP_N", mm, v,
              half ? "cublasGemmEx" : "cublasSgemm", k);
    sb_free(&offa);
    sb_free(&offb);
    return true;
}

void cuda_gemm_emit_bgrad_fallback(CgKernel *L)
{
    NodeId v;
    const int32_t k = cuda_gemm_bgrad_source(L->c, L->k, &v);
    if (k < 0) return;
    const NodeId x = cuda_gemm_bgrad_summed(L->c, v);
    sb_printf(L->c->o, "    %s_k%d_rows_launch(s, p%d, y%d, stream); /* the bias gradient, as kernel %d */\n", L->c->prefix, k, x, v, k);
}
