/* c.c — the C target: the numerical reference for generated code.
 *
 * One C file per model: the parameter, input and symbol tables, then one static function
 * per computing node ("kernel") with a comment giving its op, shapes and the model line it
 * came from, then a train step and an eval step that call the kernels in order (the tables
 * and the steps are host.c's, which the CUDA target shares). Matmuls go
 * through cblas_sgemm; everything else is plain loops the C compiler vectorises. Memory:
 * parameters, gradients and buffers come from the caller's slabs; activations from one
 * arena whose offsets are planned here by liveness (first fit), so a step never
 * allocates. Reshape and detach are views (no copy). Fusion comes later (passes/fusion.c);
 * until then a kernel is one node. */
#include "c_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>




/* ---- kernel text ---- */

/* Declares `const int64_t B = s[0], ...` for the symbols used by the node and operands. */
void cg_declare_syms(Cg *c, NodeId id)
{
    uint64_t used = 0;
    const Node *n = N(c, id);
    for (int i = 0; i < n->shape.rank; i++)
        for (int k = 0; k < n->shape.d[i].nsym; k++) used |= UINT64_C(1) << n->shape.d[i].sym[k];
    for (uint32_t j = 0; j < n->ninputs; j++) {
        const Node *x = N(c, ir_input(c->g, id, (int)j));
        for (int i = 0; i < x->shape.rank; i++)
            for (int k = 0; k < x->shape.d[i].nsym; k++) used |= UINT64_C(1) << x->shape.d[i].sym[k];
    }
    for (int s = 0; s < c->g->nsyms; s++)
        if (used >> s & 1) sb_printf(c->o, "    const int64_t %s = s[%d];\n", c->g->syms[s].name, s);
}

bool cg_may_parallel(const Cg *c, const Shape *s)
{
    const int64_t n = ir_shape_max_numel(c->g, s);
    return n < 0 || n >= PARALLEL_MIN;
}


/* Nested loops over a shape with coordinates c0.. and a running index i. */
static void open_loops(Cg *c, const char *dims, int rank, int indent)
{
    for (int d = 0; d < rank; d++)
        sb_printf(c->o, "%*sfor (int64_t c%d = 0; c%d < %s%d; c%d++)\n", indent + 4 * d, "", d, d, dims, d, d);
}

/* Loops over a row-major shape named by dims prefix (its strides declared), shared between
 * the threads when it has PARALLEL_MIN elements or more, the innermost marked for SIMD,
 * with the element's index i. Returns the indentation of the body, which the caller writes
 * before calling close_par_loops. A copy of an image or a concatenation slot is a pass over
 * memory that one thread alone leaves half the bandwidth of a 2-core machine unused. */
static int open_par_loops(Cg *c, const char *dims, const Shape *s, int indent)
{
    StrBuf *o = c->o;
    const int rank = s->rank;
    if (!rank) {
        sb_printf(o, "%*s{\n%*sconst int64_t i = 0;\n", indent, "", indent + 4, "");
        return indent + 4;
    }
    const bool parallel = cg_may_parallel(c, s);
    if (parallel) {
        sb_printf(o, "%*s#pragma omp parallel for%s", indent, "", rank == 1 ? " simd" : "");
        if (rank > 2) sb_printf(o, " collapse(%d)", rank - 1);
        sb_puts(o, " if (");
        for (int d = 0; d < rank; d++) sb_printf(o, "%s%s%d", d ? " * " : "", dims, d);
        sb_printf(o, " >= %d)\n", PARALLEL_MIN);
    }
    for (int d = 0; d < rank; d++) {
        if (d == rank - 1 && (rank > 1 || !parallel)) sb_printf(o, "%*s#pragma omp simd\n", indent + 4 * d, "");
        sb_printf(o, "%*sfor (int64_t c%d = 0; c%d < %s%d; c%d++)%s\n", indent + 4 * d, "", d, d, dims, d, d, d == rank - 1 ? " {" : "");
    }
    sb_printf(o, "%*sconst int64_t i = ", indent + 4 * rank, "");
    for (int d = 0; d < rank; d++) sb_printf(o, "%sc%d * %ss%d", d ? " + " : "", d, dims, d);
    sb_puts(o, ";\n");
    return indent + 4 * rank;
}

static void close_par_loops(Cg *c, int rank, int indent)
{
    sb_printf(c->o, "%*s}\n", indent + 4 * (rank ? rank - 1 : 0), "");
}

static void kernel_body(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const Graph *g = c->g;
    const int64_t *at = ir_attrs(g, id);
    StrBuf *o = c->o;
    int r = n->shape.rank;
    const char *t = cg_ctype((DType)n->dtype);
    Op op = (Op)n->op;
    const Node *x = n->ninputs ? N(c, ir_input(g, id, 0)) : NULL;
    switch (op) {
    case OP_CONST:
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_puts(o, ";\n    for (int64_t i = 0; i < n; i++)\n        y[i] = ");
        StrBuf lit;
        sb_init(&lit);
        cg_literal(&lit, n->fattr[0], (DType)n->dtype);
        cg_store(o, (DType)n->dtype, lit.data);
        sb_free(&lit);
        sb_puts(o, ";\n");
        break;
    case OP_IOTA:
    case OP_EXPAND:
    case OP_PERMUTE:
    case OP_PAD:
    case OP_SLICE: {
        cg_copy_declare(c, id);
        cg_copy_element(c, id, open_par_loops(c, "Y", &n->shape, 4));
        close_par_loops(c, r, 4);
        break;
    }
    case OP_CONCAT: {
        int ax = (int)at[0];
        cg_declare_dims(c, "Y", &n->shape);
        cg_declare_strides(c, "Y", r);
        sb_puts(o, "    int64_t off = 0;\n");
        for (uint32_t k = 0; k < n->ninputs; k++) {
            const Node *xk = N(c, ir_input(g, id, (int)k));
            char pre[24];
            snprintf(pre, sizeof pre, "X%u_", k);
            cg_declare_dims(c, pre, &xk->shape);
            sb_puts(o, "    {\n    ");
            cg_declare_strides(c, pre, r);
            cg_concat_element(c, id, k, open_par_loops(c, pre, &xk->shape, 8));
            close_par_loops(c, r, 8);
            sb_printf(o, "        off += %s%d;\n    }\n", pre, ax);
        }
        break;
    }
    case OP_REDUCE_SUM:
    case OP_REDUCE_MAX: {
        uint64_t axes = (uint64_t)at[0];
        cg_declare_dims(c, "X", &x->shape);
        cg_declare_dims(c, "Y", &n->shape);
        cg_declare_strides(c, "Y", r);
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_printf(o, ";\n    for (int64_t j = 0; j < n; j++)\n        y[j] = %s;\n", op == OP_REDUCE_SUM ? "0" : "-INFINITY");
        sb_puts(o, "    int64_t i = 0;\n");
        open_loops(c, "X", r, 4);
        sb_printf(o, "%*s{\n", 4 + 4 * r, "");
        sb_printf(o, "%*sconst int64_t j = ", 8 + 4 * r, "");
        bool first = true;
        for (int k = 0; k < r; k++)
            if (!(axes >> k & 1)) {
                sb_printf(o, "%sc%d * Ys%d", first ? "" : " + ", k, k);
                first = false;
            }
        if (first) sb_puts(o, "0");
        sb_puts(o, ";\n");
        if (op == OP_REDUCE_SUM) sb_printf(o, "%*sy[j] += x0[i++];\n", 8 + 4 * r, "");
        else sb_printf(o, "%*sconst %s v = x0[i++];\n%*sif (v > y[j] || v != v) y[j] = v;\n", 8 + 4 * r, "", t, 8 + 4 * r, "");
        sb_printf(o, "%*s}\n", 4 + 4 * r, "");
        break;
    }
    case OP_ARGMAX:
        cg_argmax_declare(c, id);
        sb_puts(o, "    for (int64_t a = 0; a < outer; a++)\n"
                   "        for (int64_t b = 0; b < inner; b++) {\n");
        cg_argmax_row(c, id, 12);
        sb_puts(o, "        }\n");
        break;
    case OP_CHECK_INDEX: {
        /* One compare per index, OR-ed into a flag: no branch in the loop, which GCC
         * vectorises. An index out of range is stored as 0, so that no kernel ever reads
         * out of bounds; the step stops after this kernel anyway. */
        char cond[160];
        cg_check_index_cond(c, id, "x0[i]", cond, sizeof cond);
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_printf(o, ";\n    int outside = 0;\n"
                     "    #pragma omp simd reduction(|:outside)\n"
                     "    for (int64_t i = 0; i < n; i++) {\n"
                     "        const int out = %s;\n"
                     "        outside |= out;\n"
                     "        y[i] = out ? 0 : x0[i];\n"
                     "    }\n"
                     "    *bad = -1;\n"
                     "    for (int64_t i = 0; outside && i < n; i++)\n"
                     "        if (%s) {\n"
                     "            *bad = i;\n"
                     "            break;\n"
                     "        }\n",
                  cond, cond);
        break;
    }
    case OP_GATHER:
        cg_gather_declare(c, id);
        sb_puts(o, "    for (int64_t r = 0; r < rows; r++)\n        memcpy(y + r * width, ");
        cg_gather_source(c);
        sb_puts(o, ", sizeof(*y) * (size_t)width);\n");
        break;
    case OP_SCATTER_ADD:
        cg_scatter_add_declare(c, id);
        sb_puts(o, "    memset(y, 0, sizeof(*y) * (size_t)n);\n"
                   "    for (int64_t r = 0; r < rows; r++)\n"
                   "        for (int64_t j = 0; j < width; j++)\n");
        cg_scatter_add_element(c, 12);
        break;
    case OP_MATMUL: {
        /* y[b] = x0[b] @ x1[b] for each batch b, through BLAS. */
        const Node *yb = N(c, ir_input(g, id, 1));
        sb_puts(o, "    const int64_t batch = 1");
        for (int k = 0; k < r - 2; k++) {
            sb_puts(o, " * ");
            cg_dim(o, g, n->shape.d[k]);
        }
        sb_puts(o, ", M = ");
        cg_dim(o, g, n->shape.d[r - 2]);
        sb_puts(o, ", N = ");
        cg_dim(o, g, n->shape.d[r - 1]);
        sb_puts(o, ", K = ");
        cg_dim(o, g, yb->shape.d[r - 2]);
        sb_printf(o, ";\n    for (int64_t b = 0; b < batch; b++)\n"
                     "        cblas_%cgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)M, (int)N, (int)K, 1, x0 + b * M * K, (int)K,\n"
                     "                    x1 + b * K * N, (int)N, 0, y + b * M * N, (int)N);\n",
                  n->dtype == DT_F64 ? 'd' : 's');
        break;
    }
    case OP_UNFOLD:
    case OP_FOLD: {
        cg_im2col_declare(c, id);
        /* each (image, channel) is one thread's: its plane of the image, its rows of the
         * columns */
        sb_printf(o, "    #pragma omp parallel for collapse(2) if (Nb * C * KH * KW * L >= %d)\n", PARALLEL_MIN);
        sb_puts(o, "    for (int64_t b = 0; b < Nb; b++)\n"
                   "        for (int64_t ch = 0; ch < C; ch++) {\n");
        if (op == OP_FOLD) sb_puts(o, "            memset(y + (b * C + ch) * H * W, 0, sizeof(*y) * (size_t)(H * W));\n");
        sb_puts(o, "            for (int64_t ki = 0; ki < KH; ki++)\n"
                   "                for (int64_t kj = 0; kj < KW; kj++) {\n");
        cg_im2col_row(c, 20);
        sb_puts(o, "                    for (int64_t oh = 0; oh < OH; oh++)\n"
                   "                        #pragma omp simd\n"
                   "                        for (int64_t ow = 0; ow < OW; ow++) {\n");
        cg_im2col_index(c, true, 28);
        if (op == OP_UNFOLD) sb_puts(o, "                            y[col] = x0[pix];\n");
        else sb_puts(o, "                            y[pix] += x0[col];\n");
        sb_puts(o, "                        }\n                }\n        }\n");
        break;
    }
    case OP_RANDOM_UNIFORM:
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_printf(o, ";\n    for (int64_t i = 0; i < n; i++)\n        y[i] = kiln_rng_uniform24(seed, step, %lld, (uint64_t)i);\n",
                  (long long)at[0]);
        break;
    default:
        break;
    }
}

static void kernel_name(Cg *c, NodeId id, StrBuf *b)
{
    sb_printf(b, "%s_%d_%s", c->prefix, id, ir_op_info[N(c, id)->op].name);
}

static void emit_kernel(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const char *t = cg_ctype((DType)n->dtype);
    const size_t start = c->o->len;
    cg_single_comment(c, id);
    sb_puts(c->o, "KILN_KERNEL void ");
    kernel_name(c, id, c->o);
    sb_puts(c->o, "(const int64_t *s");
    for (uint32_t k = 0; k < n->ninputs; k++) {
        NodeId x = ir_input(c->g, id, (int)k);
        sb_printf(c->o, ", const %s *restrict x%u", cg_ctype((DType)N(c, x)->dtype), k);
    }
    if (n->op == OP_RANDOM_UNIFORM) sb_puts(c->o, ", uint64_t seed, uint64_t step");
    sb_printf(c->o, ", %s *restrict y", t);
    if (n->op == OP_CHECK_INDEX) sb_puts(c->o, ", int64_t *bad");
    sb_puts(c->o, ")\n{\n");
    cg_declare_syms(c, id);
    kernel_body(c, id);
    sb_puts(c->o, "}\n\n");
    cg_prune_unused(c->o, start, false); /* the symbols it does not read */
}

static void emit_call(Cg *c, NodeId id, int32_t k)
{
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_puts(o, "    ");
    kernel_name(c, id, o);
    sb_puts(o, "(io->syms");
    for (uint32_t j = 0; j < n->ninputs; j++) {
        NodeId x = ir_input(c->g, id, (int)j);
        sb_printf(o, ", v%d", x);
    }
    if (n->op == OP_RANDOM_UNIFORM) sb_puts(o, ", io->seed, io->step");
    sb_printf(o, ", v%d", id);
    if (n->op == OP_CHECK_INDEX) {
        sb_printf(o, ", &bad); KILN_MARK(io, %d);\n", k);
        sb_printf(o, "    if (bad >= 0) { /* %s */\n"
                     "        io->index_error = &%s_index_checks[%d];\n"
                     "        io->index_value = (int64_t)v%d[bad];\n"
                     "        return;\n"
                     "    }\n",
                  ir_node_name(c->g, id), c->prefix, c->ncheck++, ir_input(c->g, id, 0));
        return;
    }
    sb_printf(o, "); KILN_MARK(io, %d);", k);
    if (n->name && n->op != OP_INPUT && n->op != OP_PARAM) sb_printf(o, " /* %s */", ir_node_name(c->g, id));
    sb_putc(o, '\n');
}

static int check_supported(const Graph *g, StrBuf *err)
{
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (!cg_ctype((DType)n->dtype)) {
            sb_printf(err, "%s:%u: error: the C target does not support %s tensors yet (node %%%d %s)",
                      g->nfiles ? g->files[0] : "?", n->loc.line, ir_dtype_name((DType)n->dtype), i, ir_op_info[n->op].name);
            return -1;
        }
        /* Half-precision values are computed in elementwise kernels (as floats) and moved by
         * the copying kernels; the rest would accumulate or fill in 16 bits. */
        bool half = n->dtype == DT_BF16 || n->dtype == DT_F16;
        bool half_in = n->ninputs && (g->nodes[ir_input(g, i, 0)].dtype == DT_BF16 || g->nodes[ir_input(g, i, 0)].dtype == DT_F16);
        if ((half && (n->op == OP_REDUCE_SUM || n->op == OP_REDUCE_MAX || n->op == OP_MATMUL || n->op == OP_SCATTER_ADD ||
                      n->op == OP_FOLD || n->op == OP_PAD || n->op == OP_IOTA || n->op == OP_RANDOM_UNIFORM)) ||
            (half_in && n->op == OP_ARGMAX)) {
            sb_printf(err, "%s:%u: error: the C target computes %s values in elementwise operations only, not %s (node %%%d): "
                           "convert to f32 first (f32(x))",
                      g->nfiles ? g->files[0] : "?", n->loc.line, ir_dtype_name(half ? (DType)n->dtype : (DType)g->nodes[ir_input(g, i, 0)].dtype),
                      ir_op_info[n->op].name, i);
            return -1;
        }
        if (n->shape.rank > 6 && n->op != OP_RESHAPE) {
            sb_printf(err, "%s:%u: error: the C target supports tensors up to rank 6 (node %%%d)", g->nfiles ? g->files[0] : "?",
                      n->loc.line, i);
            return -1;
        }
    }
    return 0;
}

static void cg_free(Cg *c)
{
    memset(&c->fp, 0, sizeof c->fp); /* the caller's plan (emit_graph) */
    memset(&c->mp, 0, sizeof c->mp);
    free(c->fused_name); /* the names belong to c->shared_name */
    c->fused_name = NULL;
}

/* Emits the kernels and the step function of one graph. */
/* Kernel k's call in the step. */
static void emit_kernel_call(Cg *c, int32_t k)
{
    const Kernel *K = &c->fp.kernels[k];
    if (K->kind == KERNEL_SINGLE && cg_is_attention((Op)N(c, K->anchor)->op)) cg_emit_attention_call(c, k, kernel_name);
    else if (K->kind == KERNEL_SINGLE) emit_call(c, K->anchor, k);
    else cg_emit_fused_call(c, k);
}

/* The function kernel k calls, for the profile table. */
static void kernel_function(Cg *c, int32_t k, StrBuf *b)
{
    const Kernel *K = &c->fp.kernels[k];
    if (K->kind == KERNEL_SINGLE) kernel_name(c, K->anchor, b);
    else sb_puts(b, c->fused_name[k]);
}

/* Emits the kernels and the step function of one graph. */
/* `first`: the file's first graph, whose kernels may go into the first half (KILN_PART). */
static int64_t emit_graph(Cg *c, const CodegenGraph *cgg, const Graph *ref, const char *prefix, bool train, bool first)
{
    const Graph *g = cgg->graph;
    KILN_ASSERT_MSG(cgg->plan && cgg->plan->placed, "codegen needs the graph's plan (the pipeline's fusion and memplan)");
    cg_layout_for(c, g, ref);
    c->g = g;
    c->prefix = prefix;
    c->fp = cgg->plan->fusion; /* the pipeline's plan, read only: cg_free lets go of it */
    c->mp = cgg->plan->mem;
    c->fused_name = xcalloc((size_t)c->fp.nkernels + 1, sizeof *c->fused_name);
    StrBuf *o = c->o;
    size_t graph_at = o->len;
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        if (first) {
            GROW(c->kernel_at, c->capkernel_at, c->nkernel_at + 1);
            c->kernel_at[c->nkernel_at++] = o->len;
        }
        if (K->kind == KERNEL_SINGLE && cg_is_attention((Op)N(c, K->anchor)->op)) cg_emit_attention_kernel(c, k, kernel_name);
        else if (K->kind == KERNEL_SINGLE) emit_kernel(c, K->anchor);
        else cg_emit_fused_kernel(c, k);
    }
    if (first) c->step_at = o->len;
    c->kernel_bytes += o->len - graph_at;
    StrBuf fn;
    sb_init(&fn);
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        sb_free(&fn);
        kernel_function(c, k, &fn);
        cg_names_record(c, k, fn.data, NULL, "");
    }
    sb_free(&fn);
    cg_emit_step(c, train, emit_kernel_call);
    cg_emit_kernel_table(c, kernel_function);
    if (c->decoding) c->ndecode_kernels = c->fp.nkernels;
    else if (c->infer && !first) c->npredict_kernels = c->fp.nkernels;
    else c->nkernels[!train] = c->fp.nkernels;
    int64_t arena = c->mp.arena_bytes;
    cg_emit_gemm_info(c, train); /* the plan says which operands BLAS reads transposed */
    cg_layout_free(c);
    cg_free(c);
    return arena;
}

/* Marks the file's two halves for KILN_PART: the first is the training graph's kernels up
 * to 60% of all kernels' bytes (what the compiler spends its time on); the second is
 * everything else (tables, the remaining kernels, the step functions, the evaluation
 * graph's own kernels), with declarations of the first half's kernels. Compiling the halves
 * at the same time halves the wall time of `kiln build` on two cores. The 60% balances the
 * halves' compile times for gpt (2.9 s and 2.7 s on one core each), cnn (1.8 s, 1.5 s) and
 * gpt2-124m (3.5 s, 3.0 s); at 55% gpt's second half took 3.8 s to the first's 2.7 s. */
static void split_in_halves(Cg *c, size_t tables_at)
{
    StrBuf *o = c->o;
    if (!c->nkernel_at) return;
    size_t first = c->kernel_at[0], cut = c->step_at, half = first + c->kernel_bytes * 3 / 5;
    for (int k = 1; k < c->nkernel_at; k++)
        if (c->kernel_at[k] >= half) {
            cut = c->kernel_at[k];
            break;
        }
    StrBuf r;
    sb_init(&r);
    sb_putn(&r, o->data, tables_at);
    sb_puts(&r, "#if KILN_PART != 1\n");
    sb_putn(&r, o->data + tables_at, first - tables_at);
    sb_puts(&r, "#endif /* KILN_PART != 1 */\n\n#if KILN_PART != 2\n");
    sb_putn(&r, o->data + first, cut - first);
    sb_puts(&r, "#endif /* KILN_PART != 2 */\n\n#if KILN_PART != 1\n");
    sb_puts(&r, "/* The kernels above, for the second half when it is compiled alone. */\n");
    static const char sig[] = "KILN_KERNEL void ";
    for (const char *p = strstr(o->data + first, sig); p && p < o->data + cut; p = strstr(p + 1, sig)) {
        const char *body = strstr(p, ")\n{\n");
        if (!body) break;
        sb_putn(&r, p, (size_t)(body - p) + 1);
        sb_puts(&r, ";\n");
    }
    sb_putc(&r, '\n');
    sb_putn(&r, o->data + cut, o->len - cut);
    sb_puts(&r, "#endif /* KILN_PART != 1 */\n");
    sb_free(o);
    *o = r;
}

/* The file's header, up to the tables. */
static bool has_attention(const Graph *g)
{
    for (NodeId i = 0; g && i < g->nnodes; i++)
        if (cg_is_attention((Op)g->nodes[i].op)) return true;
    return false;
}

/* attention: a graph has fused attention kernels (kiln_attention.h). */
static void emit_header(Cg *c, const Graph *g, const char *source_path, bool attention)
{
    sb_printf(c->o, "/* %s — generated by kiln %s from %s. Do not edit: edit the model and rebuild.\n"
                   " *\n"
                   " * Every kernel below is a group of operations of the model's graph (kiln ir --after\n"
                   " * fusion lists them), with its shapes and the model line it comes from. */\n"
                   "/* Without OpenMP (--cflags -fno-openmp) the pragmas are ignored: one thread. */\n"
                   "#pragma GCC diagnostic ignored \"-Wunknown-pragmas\"\n"
                   "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
                   "#include \"kiln_gemm.h\"\n#include \"kiln_half.h\"\n#include \"kiln_math.h\"\n#include \"kiln_model.h\"\n#include \"kiln_rng.h\"\n\n"
                   "/* kiln build compiles this file as two halves at once (-DKILN_PART=1 and 2, one per\n"
                   " * core); the first half's kernels are then shared with the second. As one file, every\n"
                   " * kernel is static. */\n"
                   "#ifdef KILN_PART\n#define KILN_KERNEL __attribute__((visibility(\"hidden\")))\n"
                   "#else\n#define KILN_KERNEL static\n#endif\n\n",
              g->name, KILN_VERSION, source_path);
    if (attention) sb_puts(c->o, "#include \"kiln_attention.h\"\n\n");
}

static void cg_init(Cg *c, StrBuf *out, StrBuf *err, const char *source_path)
{
    memset(c, 0, sizeof *c);
    c->o = out;
    c->err = err;
    c->source = source_path;
    cg_read_lines(c, source_path);
}

static void cg_done(Cg *c)
{
    cg_free_lines(c);
    free(c->kernel_at);
    cg_free_shared(c);
    cg_names_free(&c->names);
    free(c->buckets);
}

int codegen_c_train(const CodegenInput *in, StrBuf *out, StrBuf *err)
{
    const Graph *train = in->train.graph, *eval = in->eval.graph, *decode = in->decode.graph;
    if (check_supported(train, err) || check_supported(eval, err) || (decode && check_supported(decode, err))) return -1;
    Cg c;
    cg_init(&c, out, err, in->source_path);
    c.bucket_bytes = in->bucket_bytes;
    emit_header(&c, train, in->source_path, has_attention(train) || has_attention(eval) || has_attention(decode));
    size_t tables_at = out->len;
    CgModelCounts counts;
    cg_emit_model_tables(&c, train, in->recipe, &counts);
    int64_t train_arena = emit_graph(&c, &in->train, train, "train", true, true);
    int64_t eval_arena = emit_graph(&c, &in->eval, train, "eval", false, false);
    if (decode) { /* the samples printed at each evaluation */
        c.decoding = c.has_decode = true;
        c.decode_arena = emit_graph(&c, &in->decode, train, "decode", false, false);
        c.decoding = false;
        cg_emit_decode_tables(&c, train, decode, NULL);
    }
    c.model_hash = in->model_hash;
    cg_emit_model_def(&c, train, &counts, train_arena, eval_arena);
    split_in_halves(&c, tables_at);
    cg_prune_unused(out, tables_at, false); /* the step functions' unread symbols */
    cg_names_apply(&c.names, out);
    cg_done(&c);
    return 0;
}

int codegen_c_infer(const CodegenInput *in, StrBuf *out, StrBuf *err)
{
    const Graph *train = in->train.graph, *eval = in->eval.graph, *predict = in->predict.graph, *decode = in->decode.graph;
    if (check_supported(eval, err) || check_supported(predict, err) || (decode && check_supported(decode, err))) return -1;
    Cg c;
    cg_init(&c, out, err, in->source_path);
    c.infer = true;
    emit_header(&c, train, in->source_path, has_attention(eval) || has_attention(predict) || has_attention(decode));
    size_t tables_at = out->len;
    CgModelCounts counts;
    cg_emit_model_tables(&c, train, in->recipe, &counts);
    int64_t eval_arena = emit_graph(&c, &in->eval, train, "eval", false, true);
    c.predict_arena = emit_graph(&c, &in->predict, train, "predict", false, false);
    if (decode) {
        c.decoding = c.has_decode = true;
        c.decode_arena = emit_graph(&c, &in->decode, train, "decode", false, false);
        c.decoding = false;
    }
    cg_emit_infer_tables(&c, train, predict);
    cg_emit_decode_tables(&c, train, decode, in->decode_why);
    c.model_hash = in->model_hash;
    cg_emit_model_def(&c, train, &counts, 0, eval_arena);
    split_in_halves(&c, tables_at);
    cg_prune_unused(out, tables_at, false); /* the step functions' unread symbols */
    cg_names_apply(&c.names, out);
    cg_done(&c);
    return 0;
}
