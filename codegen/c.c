/* c.c — the C target: the numerical reference for generated code.
 *
 * One C file per model: the parameter, input and symbol tables, then one static function
 * per computing node ("kernel") with a comment giving its op, shapes and the model line it
 * came from, then a train step and an eval step that call the kernels in order. Matmuls go
 * through cblas_sgemm; everything else is plain loops the C compiler vectorises. Memory:
 * parameters, gradients and buffers come from the caller's slabs; activations from one
 * arena whose offsets are planned here by liveness (first fit), so a step never
 * allocates. Reshape and detach are views (no copy). Fusion comes later (passes/fusion.c);
 * until then a kernel is one node. */
#include "c_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>



static const char *krt_dtype_c(DType t)
{
    static const char *names[DT_COUNT] = {"KRT_BOOL", "KRT_U8", "KRT_I32", "KRT_I64", "KRT_F16", "KRT_BF16", "KRT_F32", "KRT_F64"};
    return t < DT_COUNT ? names[t] : "KRT_F32";
}


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
        cg_literal(o, n->fattr[0], (DType)n->dtype);
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
    /* Kernels that do not use every declared name stay warning-free. */
    sb_puts(c->o, "    (void)s;\n");
    kernel_body(c, id);
    sb_puts(c->o, "}\n\n");
}

/* A C string literal with escapes. */
static void pointer_decl(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const char *t = cg_ctype((DType)n->dtype);
    StrBuf *o = c->o;
    switch ((MemKind)c->mp.kind[id]) {
    case MEM_CALLER:
        if (n->op == OP_INPUT) sb_printf(o, "    const %s *v%d = io->inputs[%d];\n", t, id, c->input_index[id]);
        else if (ir_attrs(c->g, id)[1])
            sb_printf(o, "    %s *v%d = io->params + %lld; /* %s */\n", t, id, (long long)c->param_off[id], ir_node_name(c->g, id));
        else
            sb_printf(o, "    %s *v%d = (%s *)(io->buffers + %lld); /* %s */\n", t, id, t, (long long)c->buffer_off[id],
                      ir_node_name(c->g, id));
        break;
    case MEM_ARENA: sb_printf(o, "    %s *v%d = (%s *)(io->arena + %lld);\n", t, id, t, (long long)c->mp.offset[id]); break;
    case MEM_GRAD: {
        const char *name = ir_str(c->g, c->g->outputs[c->mp.offset[id]].name);
        NodeId p = ir_find_named(c->g, OP_PARAM, name);
        sb_printf(o, "    %s *v%d = io->grads + %lld; /* gradient of %s */\n", t, id, (long long)c->param_off[p], name);
        break;
    }
    case MEM_VIEW: sb_printf(o, "    %s *v%d = (%s *)v%d; /* a view */\n", t, id, t, ir_input(c->g, id, 0)); break;
    case MEM_NONE: break;
    }
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

/* The step's index checks, in call order: what they check, where, and the limit, for the
 * program's error message when one fails. */
static int emit_index_checks(Cg *c, const char *prefix)
{
    StrBuf *o = c->o;
    int count = 0;
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        if (K->kind != KERNEL_SINGLE || N(c, K->anchor)->op != OP_CHECK_INDEX) continue;
        const Node *n = N(c, K->anchor);
        if (!count++) sb_printf(o, "static const kiln_index_check %s_index_checks[] = {\n", prefix);
        sb_puts(o, "    {");
        cg_c_string(o, ir_node_name(c->g, K->anchor));
        sb_printf(o, ", %u, %u, %lld},\n", n->loc.line, n->loc.col, (long long)ir_attrs(c->g, K->anchor)[0]);
    }
    if (count) sb_puts(o, "};\n\n");
    return count;
}

/* Copies n elements of node id's value to a destination expression. */
static void emit_copy_out(Cg *c, NodeId id, const char *dst, const char *dst_type)
{
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_printf(o, "    memcpy(%s, v%d, sizeof(*v%d) * (size_t)(", dst, id, id);
    cg_numel(c, &n->shape);
    sb_puts(o, "));\n");
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
        if (n->shape.rank > 6 && n->op != OP_RESHAPE) {
            sb_printf(err, "%s:%u: error: the C target supports tensors up to rank 6 (node %%%d)", g->nfiles ? g->files[0] : "?",
                      n->loc.line, i);
            return -1;
        }
    }
    return 0;
}

/* Parameter layout shared by both graphs: trainable f32 in the slab, buffers by bytes. */
typedef struct {
    int64_t *param_off, *buffer_off;
    int *input_index;
} Layout;

static void layout_for(const Graph *g, const Graph *ref, Layout *l)
{
    l->param_off = xcalloc((size_t)g->nnodes + 1, sizeof *l->param_off);
    l->buffer_off = xcalloc((size_t)g->nnodes + 1, sizeof *l->buffer_off);
    l->input_index = xcalloc((size_t)g->nnodes + 1, sizeof *l->input_index);
    int64_t po = 0, bo = 0;
    int ni = 0;
    for (NodeId i = 0; i < ref->nnodes; i++) {
        const Node *n = &ref->nodes[i];
        if (n->op == OP_INPUT) {
            NodeId j = ir_find_named(g, OP_INPUT, ir_node_name(ref, i));
            if (j != IR_NONE) l->input_index[j] = ni;
            ni++;
        }
        if (n->op != OP_PARAM) continue;
        NodeId j = ir_find_named(g, OP_PARAM, ir_node_name(ref, i));
        int64_t count = ir_shape_max_numel(ref, &n->shape);
        if (ir_attrs(ref, i)[1]) {
            if (j != IR_NONE) l->param_off[j] = po;
            po += count;
        } else {
            if (j != IR_NONE) l->buffer_off[j] = bo;
            bo += (count * ir_dtype_size((DType)n->dtype) + 7) / 8 * 8;
        }
    }
}

static void layout_free(Layout *l)
{
    free(l->param_off);
    free(l->buffer_off);
    free(l->input_index);
}

static void cg_free(Cg *c)
{
    fusion_free(&c->fp);
    memplan_free(&c->mp);
    free(c->fused_name); /* the names belong to c->shared_name */
    c->fused_name = NULL;
}

static void emit_gemm_info(Cg *c, const Graph *g, const char *prefix, bool table);

/* The step's kernels in call order, for the program's --profile (KILN_MARK(io, k) after
 * kernel k's call): the function it calls, what it computes, the model line. */
static void emit_kernel_table(Cg *c, const char *prefix)
{
    StrBuf *o = c->o, b;
    sb_init(&b);
    sb_printf(o, "static const kiln_kernel_info %s_kernels[] = {\n", prefix);
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        const Node *n = N(c, K->anchor);
        sb_puts(o, "    {");
        sb_free(&b);
        if (K->kind == KERNEL_SINGLE) kernel_name(c, K->anchor, &b);
        else sb_puts(&b, c->fused_name[k]);
        cg_c_string(o, b.data);
        sb_puts(o, ", ");
        sb_free(&b);
        if (K->kind == KERNEL_SINGLE) {
            sb_printf(&b, "%s over %s", ir_op_info[n->op].name, cg_ctype((DType)n->dtype));
            ir_shape_format(&b, c->g, &n->shape);
        } else {
            cg_kernel_title(c, k, &b);
        }
        cg_c_string(o, b.data);
        sb_printf(o, ", %u},\n", n->loc.line);
    }
    if (!c->fp.nkernels) sb_puts(o, "    {\"\", \"\", 0},\n");
    sb_puts(o, "};\n\n");
    sb_free(&b);
}

/* Emits the kernels and the step function of one graph. */
static int64_t emit_graph(Cg *c, const Graph *g, const Graph *ref, const char *prefix, bool train)
{
    Layout l;
    layout_for(g, ref, &l);
    c->g = g;
    c->prefix = prefix;
    c->param_off = l.param_off;
    c->buffer_off = l.buffer_off;
    c->input_index = l.input_index;
    fusion_plan(g, &c->fp);
    memplan_run(g, &c->fp, &c->mp);
    c->fused_name = xcalloc((size_t)c->fp.nkernels + 1, sizeof *c->fused_name);
    StrBuf *o = c->o;
    size_t graph_at = o->len;
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        if (train) {
            GROW(c->kernel_at, c->capkernel_at, c->nkernel_at + 1);
            c->kernel_at[c->nkernel_at++] = o->len;
        }
        if (K->kind == KERNEL_SINGLE) emit_kernel(c, K->anchor);
        else cg_emit_fused_kernel(c, k);
    }
    if (train) c->step_at = o->len;
    c->kernel_bytes += o->len - graph_at;
    sb_printf(o, "/* The %s step: %d kernels, %lld bytes of activations at the largest sizes. */\n",
              train ? "training" : "evaluation", c->fp.nkernels, (long long)c->mp.arena_bytes);
    int nchecks = emit_index_checks(c, prefix);
    c->ncheck = 0;
    sb_printf(o, "static void %s_step(kiln_step_io *io)\n{\n", prefix);
    sb_puts(o, "    io->index_error = NULL;\n");
    if (nchecks) sb_puts(o, "    int64_t bad; /* the first index out of range, or -1 */\n");
    for (int sy = 0; sy < g->nsyms; sy++)
        sb_printf(o, "    const int64_t %s = io->syms[%d];\n    (void)%s;\n", g->syms[sy].name, sy, g->syms[sy].name);
    for (NodeId i = 0; i < g->nnodes; i++) pointer_decl(c, i);
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        if (K->kind == KERNEL_SINGLE) emit_call(c, K->anchor, k);
        else cg_emit_fused_call(c, k);
    }
    int metric = 0, fwd = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        const Output *out = &g->outputs[k];
        NodeId v = out->node;
        switch ((OutputKind)out->kind) {
        case OUT_LOSS:
            sb_printf(o, "    io->loss = v%d[0];\n", v);
            break;
        case OUT_METRIC:
            sb_printf(o, "    io->metrics[%d] = v%d[0];\n", metric++, v);
            break;
        case OUT_GRAD: {
            if (!train) break;
            NodeId p = ir_find_named(g, OP_PARAM, ir_str(g, out->name));
            NodeId r = fusion_root(g, &c->fp, v);
            if (c->mp.kind[r] == MEM_GRAD && c->mp.offset[r] == k) break; /* written there by its kernel */
            char dst[64];
            snprintf(dst, sizeof dst, "io->grads + %lld", (long long)l.param_off[p]);
            sb_printf(o, "    /* gradient of %s */\n", ir_str(g, out->name));
            emit_copy_out(c, v, dst, "float *");
            break;
        }
        case OUT_UPDATE: {
            NodeId p = ir_find_named(g, OP_PARAM, ir_str(g, out->name));
            char dst[64];
            snprintf(dst, sizeof dst, "v%d", p);
            sb_printf(o, "    /* new value of %s */\n", ir_str(g, out->name));
            char ty[32];
            snprintf(ty, sizeof ty, "%s *", cg_ctype((DType)N(c, p)->dtype));
            emit_copy_out(c, v, dst, ty);
            break;
        }
        case OUT_FORWARD: {
            char dst[64], ty[32];
            snprintf(dst, sizeof dst, "io->outputs[%d]", fwd);
            snprintf(ty, sizeof ty, "%s *", cg_ctype((DType)N(c, v)->dtype));
            sb_printf(o, "    if (io->outputs && io->outputs[%d])\n    ", fwd);
            fwd++;
            emit_copy_out(c, v, dst, ty);
            break;
        }
        default: break;
        }
    }
    sb_puts(o, "}\n\n");
    emit_kernel_table(c, prefix);
    c->nkernels[!train] = c->fp.nkernels;
    int64_t arena = c->mp.arena_bytes;
    emit_gemm_info(c, g, prefix, train); /* the plan says which operands BLAS reads transposed */
    layout_free(&l);
    cg_free(c);
    return arena;
}

/* The FLOP count of a graph's matrix products at the current symbols, and (train graph)
 * the distinct product shapes at the bounds, for benchmarks. */
static void emit_gemm_info(Cg *c, const Graph *g, const char *prefix, bool table)
{
    StrBuf *o = c->o;
    sb_printf(o, "static double %s_gemm_flops(const int64_t *s)\n{\n    double flops = 0;\n    (void)s;\n", prefix);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_MATMUL) continue;
        int r = n->shape.rank;
        const Node *b = &g->nodes[ir_input(g, i, 1)];
        sb_puts(o, "    flops += 2.0");
        for (int k = 0; k < r; k++) {
            sb_puts(o, " * (double)(");
            Dim d = n->shape.d[k];
            if (d.nsym == 0) sb_printf(o, "%lld", (long long)d.k);
            else {
                if (d.k != 1) sb_printf(o, "%lld * ", (long long)d.k);
                for (int q = 0; q < d.nsym; q++) sb_printf(o, "%ss[%d]", q ? " * " : "", d.sym[q]);
            }
            sb_puts(o, ")");
        }
        Dim kd = b->shape.d[r - 2];
        sb_puts(o, " * (double)(");
        if (kd.nsym == 0 || kd.k != 1) sb_printf(o, "%lld%s", (long long)kd.k, kd.nsym ? " * " : "");
        for (int q = 0; q < kd.nsym; q++) sb_printf(o, "%ss[%d]", q ? " * " : "", kd.sym[q]);
        sb_printf(o, "); /* %%%d */\n", i);
    }
    sb_puts(o, "    return flops;\n}\n\n");
    if (!table) return;
    sb_printf(o, "static const kiln_gemm_shape %s_gemms[] = {\n", prefix);
    int64_t(*seen)[6] = xmalloc(((size_t)g->nnodes + 1) * sizeof *seen);
    int *count = xcalloc((size_t)g->nnodes + 1, sizeof *count);
    int nseen = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_MATMUL) continue;
        int r = n->shape.rank;
        int64_t key[6] = {1, ir_dim_max(g, n->shape.d[r - 2]), ir_dim_max(g, n->shape.d[r - 1]),
                          ir_dim_max(g, g->nodes[ir_input(g, i, 1)].shape.d[r - 2]), 0, 0};
        for (int k = 0; k < r - 2; k++) key[0] *= ir_dim_max(g, n->shape.d[k]);
        for (int q = 0; q < 2; q++) {
            FusionLayout lay;
            bool trans = false;
            NodeId x = ir_input(g, i, q);
            if (fusion_layout(g, &c->fp, x, &lay) && fusion_gemm_operand(g, &lay, x, &trans)) key[4 + q] = trans;
        }
        int j = 0;
        while (j < nseen && memcmp(seen[j], key, sizeof key)) j++;
        if (j == nseen) memcpy(seen[nseen++], key, sizeof key);
        count[j]++;
    }
    for (int j = 0; j < nseen; j++)
        sb_printf(o, "    {%lld, %lld, %lld, %lld, %s, %s, %d},\n", (long long)seen[j][0], (long long)seen[j][1],
                  (long long)seen[j][2], (long long)seen[j][3], seen[j][4] ? "true" : "false", seen[j][5] ? "true" : "false",
                  count[j]);
    if (!nseen) sb_puts(o, "    {0, 0, 0, 0, false, false, 0},\n");
    sb_puts(o, "};\n\n");
    c->ngemms = nseen;
    free(seen);
    free(count);
}

int64_t codegen_arena_bytes(const Graph *g)
{
    FusionPlan f;
    MemPlan m;
    fusion_plan(g, &f);
    memplan_run(g, &f, &m);
    int64_t a = m.arena_bytes;
    memplan_free(&m);
    fusion_free(&f);
    return a;
}

/* Identifies the model's computation for checkpoints: the graph without source locations,
 * so editing comments or building from another directory keeps checkpoints usable. */
static uint64_t graph_hash(const Graph *g0)
{
    Graph *g = ir_graph_clone(g0);
    for (NodeId i = 0; i < g->nnodes; i++) memset(&g->nodes[i].loc, 0, sizeof g->nodes[i].loc);
    for (int i = 0; i < g->nfiles; i++) free(g->files[i]);
    g->nfiles = 0;
    StrBuf t;
    sb_init(&t);
    ir_print(g, &t);
    ir_graph_free(g);
    uint64_t h = util_hash_string(t.data ? t.data : "");
    sb_free(&t);
    return h;
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

int codegen_c(const Graph *train, const Graph *eval, const char *source_path, char *const *recipe_kv, int nrecipe,
              StrBuf *out, StrBuf *err)
{
    if (check_supported(train, err) || check_supported(eval, err)) return -1;
    Cg c;
    memset(&c, 0, sizeof c);
    c.o = out;
    c.err = err;
    c.source = source_path;
    cg_read_lines(&c, source_path);
    const Graph *g = train;
    sb_printf(out, "/* %s — generated by kiln %s from %s. Do not edit: edit the model and rebuild.\n"
                   " *\n"
                   " * Every kernel below is a group of operations of the model's graph (kiln ir --after\n"
                   " * fusion lists them), with its shapes and the model line it comes from. */\n"
                   "/* Without OpenMP (--cflags -fno-openmp) the pragmas are ignored: one thread. */\n"
                   "#pragma GCC diagnostic ignored \"-Wunknown-pragmas\"\n"
                   "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n"
                   "#include \"kiln_gemm.h\"\n#include \"kiln_math.h\"\n#include \"kiln_model.h\"\n#include \"kiln_rng.h\"\n\n"
                   "/* kiln build compiles this file as two halves at once (-DKILN_PART=1 and 2, one per\n"
                   " * core); the first half's kernels are then shared with the second. As one file, every\n"
                   " * kernel is static. */\n"
                   "#ifdef KILN_PART\n#define KILN_KERNEL __attribute__((visibility(\"hidden\")))\n"
                   "#else\n#define KILN_KERNEL static\n#endif\n\n",
              g->name, KILN_VERSION, source_path);
    size_t tables_at = out->len;
    /* Tables. */
    sb_puts(out, "static const kiln_param params[] = {\n");
    int np = 0;
    int64_t po = 0, bo = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM) continue;
        bool trainable = ir_attrs(g, i)[1] != 0;
        int64_t count = ir_shape_max_numel(g, &n->shape);
        sb_printf(out, "    {\"%s\", %s, %d, {", ir_node_name(g, i), krt_dtype_c((DType)n->dtype), n->shape.rank);
        for (int k = 0; k < n->shape.rank; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)n->shape.d[k].k);
        static const char *inits[] = {"KILN_INIT_ZEROS", "KILN_INIT_ONES", "KILN_INIT_CONSTANT", "KILN_INIT_UNIFORM", "KILN_INIT_NORMAL"};
        sb_printf(out, "}, %lld, %lld, %s, %.17g, %.17g, %s, %s},\n", (long long)count, (long long)(trainable ? po : bo),
                  inits[ir_attrs(g, i)[0]], n->fattr[0], n->fattr[1], trainable ? "true" : "false",
                  trainable && n->shape.rank >= 2 ? "true" : "false");
        if (trainable) po += count;
        else bo += (count * ir_dtype_size((DType)n->dtype) + 7) / 8 * 8;
        np++;
    }
    sb_puts(out, "};\n\nstatic const kiln_input inputs[] = {\n");
    int ni = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_INPUT) continue;
        sb_printf(out, "    {\"%s\", %s, %d, {", ir_node_name(g, i), krt_dtype_c((DType)n->dtype), n->shape.rank);
        for (int k = 0; k < n->shape.rank; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)ir_dim_max(g, n->shape.d[k]));
        sb_puts(out, "}, {");
        for (int k = 0; k < n->shape.rank; k++) {
            Dim d = n->shape.d[k];
            sb_printf(out, "%s%d", k ? ", " : "", d.nsym == 1 && d.k == 1 ? d.sym[0] : -1);
        }
        sb_printf(out, "}, %lld},\n", (long long)(ir_dtype_is_float((DType)n->dtype) ? 0 : ir_index_range(g, i)));
        ni++;
    }
    sb_puts(out, "};\n\nstatic const kiln_symbol syms[] = {\n");
    for (int s = 0; s < g->nsyms; s++) sb_printf(out, "    {\"%s\", %lld},\n", g->syms[s].name, (long long)g->syms[s].max);
    if (!g->nsyms) sb_puts(out, "    {\"\", 0},\n");
    sb_puts(out, "};\n\nstatic const char *const metric_names[] = {");
    int nm = 0, no = 0;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_METRIC) sb_printf(out, "%s\"%s\"", nm++ ? ", " : "", ir_str(g, g->outputs[k].name));
    if (!nm) sb_puts(out, "NULL");
    sb_puts(out, "};\nstatic const char *const output_names[] = {");
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_FORWARD) sb_printf(out, "%s\"%s\"", no++ ? ", " : "", ir_str(g, g->outputs[k].name));
    if (!no) sb_puts(out, "NULL");
    sb_puts(out, "};\nstatic const krt_dtype output_dtypes[] = {");
    no = 0;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_FORWARD) sb_printf(out, "%s%s", no++ ? ", " : "", krt_dtype_c((DType)g->nodes[g->outputs[k].node].dtype));
    if (!no) sb_puts(out, "KRT_F32");
    sb_puts(out, "};\n\n");
    sb_puts(out, "static const kiln_recipe_entry recipe[] = {\n");
    for (int i = 0; i < nrecipe; i++) {
        sb_puts(out, "    {");
        cg_c_string(out, recipe_kv[2 * i]);
        sb_puts(out, ", ");
        cg_c_string(out, recipe_kv[2 * i + 1]);
        sb_puts(out, "},\n");
    }
    if (!nrecipe) sb_puts(out, "    {\"\", \"\"},\n");
    sb_puts(out, "};\n\n");
    int64_t train_arena = emit_graph(&c, train, train, "train", true);
    int64_t eval_arena = emit_graph(&c, eval, train, "eval", false);
    StrBuf source_literal;
    sb_init(&source_literal);
    cg_c_string(&source_literal, source_path);
    sb_printf(out, "const kiln_model kiln_model_def = {\n"
                   "    .name = \"%s\",\n    .source = %s,\n    .hash = \"%016llx\",\n"
                   "    .nparams = %d, .params = params, .nparam_floats = %lld, .buffer_bytes = %lld,\n"
                   "    .ninputs = %d, .inputs = inputs, .nsyms = %d, .syms = syms,\n"
                   "    .nmetrics = %d, .metric_names = metric_names,\n"
                   "    .noutputs = %d, .output_names = output_names, .output_dtypes = output_dtypes,\n"
                   "    .train_arena_bytes = %lld, .eval_arena_bytes = %lld,\n"
                   "    .nrecipe = %d, .recipe = recipe,\n"
                   "    .train_step = train_step, .eval_step = eval_step,\n"
                   "    .train_gemm_flops = train_gemm_flops, .eval_gemm_flops = eval_gemm_flops,\n"
                   "    .ntrain_gemms = %d, .train_gemms = train_gemms,\n"
                   "    .ntrain_kernels = %d, .train_kernels = train_kernels, .neval_kernels = %d, .eval_kernels = eval_kernels,\n};\n",
              g->name, source_literal.data, (unsigned long long)graph_hash(train), np, (long long)po, (long long)bo, ni, g->nsyms, nm, no,
              (long long)train_arena, (long long)eval_arena, nrecipe, c.ngemms, c.nkernels[0], c.nkernels[1]);
    sb_free(&source_literal);
    split_in_halves(&c, tables_at);
    cg_free_lines(&c);
    free(c.kernel_at);
    cg_free_shared(&c);
    return 0;
}
