/* cuda.c — the CUDA target: model.cu in Kiln's restricted dialect (runtime/cuda/kiln_cuda.h,
 * docs/cuda.md), which nvcc compiles for the GPU and g++ -DKILN_CUDA_EMU for the emulator.
 *
 * What each fused kernel computes comes from kernel.c, as for the C target; this file adds
 * what is the GPU's own: the threads that run it and the host function that launches it.
 * So far it writes
 *   - elementwise kernels (loop kernels without reduced axes) as grid-stride loops: each
 *     thread computes elements i, i + gridDim.x * blockDim.x, ..., deriving from i the
 *     coordinates the members need (broadcast loads, iotas);
 *   - row reductions (softmax, layer norm, cross-entropy's one-hot, pooling windows, batch
 *     norm's statistics, their backward kernels; members may need coordinates, which each
 *     thread derives from the row index and its position in the row): one block per row,
 *     kernel.c's passes over the row as block-strided loops, each followed by block-wide
 *     sums or maxima (warp shuffles, then shared memory); rows of at most 32 elements
 *     (pooling windows, a classifier's logits) one thread per row, walking it in the C
 *     target's order; reduced axes that are not the trailing ones find each element from its
 *     coordinates; a kernel with a total over all rows (a loss): each block takes a
 *     contiguous run of rows in order and writes its part, kiln_sum_parts adds the parts in
 *     block order (deterministic);
 *   - reductions over leading axes (bias gradients, cross-entropy's gradient summed over
 *     the batch; members may need coordinates, from the column and the position down it):
 *     one thread per column;
 *   - float32 matrix products: cublasSgemm into the product's memory (a batch:
 *     cublasSgemmStridedBatched over the batch axes whose strides nest, a loop over the
 *     others; a product written permuted goes straight into the
 *     permuted memory; products summed over a batch, a convolution's weight gradient, are
 *     added into the sum in batch order with beta 1), then the epilogue (bias, activation,
 *     ...) as an elementwise kernel over the product; a bias (+ relu or tanh-GELU) that
 *     cuBLASLt computes exactly goes into its fused epilogue instead (cuda_gemm.c);
 *   - single-node kernels (index checks, argmax, gathers, scatter-adds, copies, im2col)
 *     from kernel.c's index arithmetic: one thread per output element (per column for a
 *     scatter-add, one block for an index check), sums in the C target's order
 *     (cuda_single.c);
 *   - fused attention: wrappers of runtime/cuda/kiln_cuda_attention.h's kernels and their
 *     launchers (cuda_attention.c).
 * Double-precision matrix products are refused with an error naming the kernel and its
 * model line: never code that computes something else. Random numbers (dropout) are
 * kiln_rng.h's counter-based ones, drawn by element index as the C target draws them, in
 * every kind of kernel: the same masks. */
#include "cuda_device.h"
#include "cuda_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool columns_kernel(const CgKernel *L);

/* What the target cannot write yet, in a few words ("row reduction"), or NULL. */
static const char *unsupported_kind(const CgKernel *L)
{
    const Kernel *K = L->K;
    if (K->kind == KERNEL_GEMM) {
        const Graph *g = L->g;
        if (g->nodes[K->anchor].dtype != DT_F32) return "non-float32 matrix product";
        if (K->written == IR_NONE && K->summed == IR_NONE && !L->f->stored[K->anchor]) return "matrix product with an unstored result";
        return NULL;
    }
    if (K->kind == KERNEL_SINGLE) {
        const Op op = (Op)L->g->nodes[K->anchor].op;
        if (cg_is_attention(op)) return cuda_attention_unsupported(L->c, K->anchor);
        return cuda_single_supported(op) ? NULL : ir_op_info[op].name;
    }
    return NULL;
}

/* Is L a reduction over leading axes written one thread per column (the C target's
 * CG_LOOP_COLUMNS, or its nested loops when members need coordinates)? */
static bool columns_kernel(const CgKernel *L)
{
    return L->mode == CG_LOOP_COLUMNS || (L->mode == CG_LOOP_NESTED && L->K->axes && !cg_axes_trailing(L) && cg_columns_shape(L));
}

static void kernel_name(const CgKernel *L, StrBuf *b)
{
    sb_printf(b, "%s_k%d_%s", L->c->prefix, L->k, L->mode == CG_LOOP_GEMM ? "gemm" : L->K->axes ? "rows" : "map");
}

/* "models/mlp.kiln:12: x = relu(fc1(x))": the model line, for launch sites and errors. */
void cuda_model_line(Cg *c, NodeId id, StrBuf *b)
{
    const Node *n = N(c, id);
    sb_printf(b, "%s:%u", c->source, n->loc.line);
    if (n->loc.line && (int)n->loc.line <= c->nlines) {
        const char *line = c->lines[n->loc.line - 1];
        while (*line == ' ') line++;
        sb_printf(b, ": %.100s", line);
    }
}

static bool has_total(const CgKernel *L);

/* The symbols by value, then the kernel's loads and stores: its parameters. */
static void parameters(CgKernel *L, StrBuf *o, bool host)
{
    const Graph *g = L->g;
    bool any = false;
    if (host) {
        sb_puts(o, "const int64_t *s");
        any = true;
    } else {
        for (int sy = 0; sy < g->nsyms; sy++, any = true) sb_printf(o, "%sint64_t %s", any ? ", " : "", g->syms[sy].name);
    }
    /* an output written in place of an input (memplan) shares its memory: no __restrict__ */
    for (int i = 0; i < L->nreads; i++) {
        bool shared = false;
        for (int j = 0; j < L->nstores; j++) shared |= L->c->mp.inplace_of[L->stores[j]] == L->reads[i];
        sb_printf(o, "%sconst %s *%sp%d", any ? ", " : "", cg_ctype((DType)g->nodes[L->reads[i]].dtype),
                  shared || host ? "" : "__restrict__ ", L->reads[i]);
        any = true;
    }
    for (int i = 0; i < L->nstores; i++) {
        sb_printf(o, "%s%s *%sy%d", any ? ", " : "", cg_ctype((DType)g->nodes[L->stores[i]].dtype),
                  L->c->mp.inplace_of[L->stores[i]] != IR_NONE || host ? "" : "__restrict__ ", L->stores[i]);
        any = true;
    }
    if (L->random) sb_printf(o, "%suint64_t seed, uint64_t step", any ? ", " : ""); /* dropout's counter-based numbers */
    if (has_total(L)) sb_puts(o, ", void *partials"); /* the blocks' parts of the totals */
    NodeId bgrad;
    if (host && cuda_gemm_bgrad_source(L->c, L->k, &bgrad) >= 0) sb_printf(o, ", float *y%d", bgrad); /* BGRADB's output */
    if (host) sb_puts(o, L->mode == CG_LOOP_GEMM ? ", cudaStream_t stream, cublasHandle_t blas" : ", cudaStream_t stream");
}

/* The kernel's comment with its launch shape, its signature and its dims S0, S1, .... */
static void kernel_head(CgKernel *L, const char *launch)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    cg_kernel_comment(L);
    /* the comment ends with the close of the comment: the launch shape goes before it */
    o->len -= 4;
    o->data[o->len] = 0;
    sb_printf(o, "\n * Launch: %s */\n", launch);
    sb_printf(o, "__global__ void __launch_bounds__(%d) ", CUDA_MAP_BLOCK);
    kernel_name(L, o);
    sb_puts(o, L->mode == CG_LOOP_GEMM ? "_epilogue(" : "(");
    parameters(L, o, false);
    sb_puts(o, ")\n{\n");
    if (L->rank) {
        sb_puts(o, "    const int64_t ");
        for (int a = 0; a < L->rank; a++) {
            sb_printf(o, "%sS%d = ", a ? ", " : "", a);
            cg_dim(o, g, L->K->shape.d[a]);
        }
        sb_puts(o, ";\n");
    }
}

/* Elements per vectorised load and store: float4, 16 bytes. */
#define CUDA_VECTOR 4

/* The statements of one lane of a vectorised elementwise kernel (element i = 4q + k):
 * its coordinate along the last axis (the others are the lanes' own: scalar_reason), then
 * kernel.c's scalar statements for the results, with
 * every float32 value loaded at element i itself read as kiln_lane(q<id>, k); those go to
 * loads (in node order). Returns how many. */
static int lane_body(CgKernel *L, NodeId mm, StrBuf *body, NodeId *loads)
{
    const Graph *g = L->g;
    StrBuf *saved = L->c->o;
    cg_clear_needed(L);
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm) cg_need(L, L->stores[i]);
    L->lane_loaded = xcalloc((size_t)g->nnodes + 1, 1);
    L->c->o = body;
    const int last = L->rank - 1;
    if (L->coords >> last & 1) sb_printf(body, "            const int64_t c%d = l%d + k;\n", last, last);
    cg_emit_needed(L, "            ");
    L->c->o = saved;
    int n = 0;
    for (NodeId id = 0; id < g->nnodes; id++)
        if (L->lane_loaded[id]) loads[n++] = id;
    free(L->lane_loaded);
    L->lane_loaded = NULL;
    return n;
}

/* Why elementwise kernel L is not vectorised, or NULL when it is. Vectorised, each thread
 * takes four consecutive elements at a time and loads and stores every float32 array at
 * the element itself as one float4; operands read by coordinates (a broadcast along the
 * loop, an iota) and arrays of other dtypes are read and written one element at a time
 * in the four lanes, as in the scalar loop. So there must be such a float32 array; and
 * coordinates are derived once per four elements (64-bit divisions are calls on a GPU,
 * four per element group spill registers), so that only the last axis's differs. */
static const char *scalar_reason(CgKernel *L)
{
    const Graph *g = L->g;
    const NodeId mm = L->mode == CG_LOOP_GEMM ? L->K->anchor : IR_NONE;
    if (!L->rank) return "a single element";
    /* the lanes' coordinates from the first lane's, without dividing again: only the last
     * one differs, by k, when the last axis is a fixed multiple of 4 */
    const Dim d = L->K->shape.d[L->rank - 1];
    if (L->coords && (d.nsym || d.k % CUDA_VECTOR))
        return "an operand is read by coordinates (a broadcast, an iota) and the last axis is not a fixed multiple of 4";
    /* sinf's and cosf's exact reduction of large arguments keeps a small array in local
     * memory: a second copy of the kernel's body (the lanes) gave those kernels a stack frame
     * on sm_80 too (llama's rotary tables, small kernels: nothing to gain) */
    for (int32_t i = 0; i < L->K->count; i++) {
        const Op op = (Op)g->nodes[CG_MEMBER(L, i)].op;
        if (op == OP_SIN || op == OP_COS) return "it calls sinf or cosf, whose exact reduction of large arguments keeps an array in local memory";
    }
    for (int i = 0; i < L->nremat; i++)
        if (g->nodes[L->remat[i]].op == OP_SIN || g->nodes[L->remat[i]].op == OP_COS)
            return "it calls sinf or cosf, whose exact reduction of large arguments keeps an array in local memory";
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm && g->nodes[L->stores[i]].dtype == DT_F32) return NULL;
    StrBuf body;
    sb_init(&body);
    NodeId *loads = xcalloc((size_t)g->nnodes + 1, sizeof *loads);
    const int n = lane_body(L, mm, &body, loads);
    sb_free(&body);
    free(loads);
    return n ? NULL : "no float32 array is read or written at the element itself (only other dtypes, or values found from coordinates)";
}

/* The vectorised loop of an elementwise kernel (see scalar_reason); the scalar loop after
 * it takes what it leaves. */
static void emit_vector_loop(CgKernel *L, NodeId mm)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    StrBuf body;
    sb_init(&body);
    NodeId *loads = xcalloc((size_t)g->nnodes + 1, sizeof *loads);
    const int nloads = lane_body(L, mm, &body, loads);
    sb_puts(o, "    /* Four elements at a time (float4: 16-byte loads and stores) when every float4 pointer\n"
               "     * is 16-byte aligned, as the arena's 64-byte offsets and cudaMalloc's memory are (a\n"
               "     * parameter's place in its slab need not be); the scalar loop below takes the last\n"
               "     * n % 4 elements, or all of them otherwise. */\n"
               "    const bool aligned = (");
    int nptr = 0;
    for (int i = 0; i < nloads; i++) sb_printf(o, "%s(uintptr_t)%c%d", nptr++ ? " | " : "", loads[i] == mm ? 'y' : 'p', loads[i]);
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm && g->nodes[L->stores[i]].dtype == DT_F32) sb_printf(o, "%s(uintptr_t)y%d", nptr++ ? " | " : "", L->stores[i]);
    sb_printf(o, ") %% 16 == 0;\n"
                 "    const int64_t n4 = aligned ? n / %d : 0;\n"
                 "    for (int64_t q = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; q < n4; q += (int64_t)gridDim.x * blockDim.x) {\n",
              CUDA_VECTOR);
    for (int i = 0; i < nloads; i++) {
        const NodeId id = loads[i];
        sb_printf(o, "        const float4 q%d = reinterpret_cast<const float4 *>(%c%d)[q]; /* elements 4q ... 4q + 3 */\n", id,
                  id == mm ? 'y' : 'p', id);
    }
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm && g->nodes[L->stores[i]].dtype == DT_F32) sb_printf(o, "        float4 r%d = make_float4(0, 0, 0, 0);\n", L->stores[i]);
    const int last = L->rank - 1;
    const uint64_t others = L->coords & ~((uint64_t)1 << last);
    if (L->coords) {
        sb_puts(o, "        /* the four elements' coordinates: the same but along the last axis (a multiple of 4) */\n");
        cg_coordinates(L, others, (((uint64_t)1 << L->rank) - 1), "(4 * q)", "        ");
    }
    if (L->coords >> last & 1) sb_printf(o, "        const int64_t l%d = 4 * q %% S%d; /* the first element's */\n", last, last);
    sb_puts(o, "        KILN_NO_UNROLL /* one lane's values live at a time, as in the scalar loop */\n"
               "        for (int k = 0; k < 4; k++) {\n"
               "            const int64_t i = 4 * q + k;\n");
    sb_puts(o, body.data ? body.data : "");
    for (int i = 0; i < L->nstores; i++) {
        const NodeId id = L->stores[i];
        if (id == mm) continue;
        if (g->nodes[id].dtype == DT_F32) sb_printf(o, "            kiln_set_lane(r%d, k, t%d);\n", id, id);
        else {
            sb_printf(o, "            y%d[i] = ", id);
            cg_store_local(o, g, id, "t%d");
            sb_puts(o, "; /* not float32: one element */\n");
        }
    }
    sb_puts(o, "        }\n");
    for (int i = 0; i < L->nstores; i++) {
        const NodeId id = L->stores[i];
        if (id != mm && g->nodes[id].dtype == DT_F32)
            sb_printf(o, "        reinterpret_cast<float4 *>(y%d)[q] = r%d;\n", id, id);
    }
    sb_puts(o, "    }\n");
    sb_free(&body);
    free(loads);
}

static void emit_map_kernel(CgKernel *L)
{
    StrBuf *o = L->c->o;
    const bool gemm = L->mode == CG_LOOP_GEMM;
    /* a GEMM kernel's epilogue: the product is in memory (cuBLAS wrote it), its consumers
     * run as an elementwise kernel over it */
    const NodeId mm = gemm ? L->K->anchor : IR_NONE;
    const char *scalar = scalar_reason(L);
    StrBuf launch;
    sb_init(&launch);
    CudaLtPlan lt;
    const bool fused = gemm && cuda_gemm_lt_plan(L, &lt);
    if (fused)
        sb_printf(&launch, "cuBLASLt computes the product with %s (the host function\n"
                           " * below); this kernel runs only when a pointer is not 16-byte aligned or cuBLASLt has no\n"
                           " * algorithm for it, after %s: blocks of 256 threads, a grid-stride loop over the elements.",
                  cuda_gemm_lt_name(lt.epilogue), cuda_gemm_half_type(L->g, mm) ? "cublasGemmEx" : "cublasSgemm");
    else sb_puts(&launch, gemm ? "cuBLAS writes the product (the host function below), then this epilogue runs\n"
                            " * over its elements: blocks of 256 threads, a grid-stride loop over the elements."
                          : "blocks of 256 threads, a grid-stride loop over the elements (each thread takes\n"
                            " * every gridDim.x * blockDim.x-th one, from its own index).");
    if (scalar) sb_printf(&launch, "\n * Not vectorised: %s.", scalar);
    else sb_puts(&launch, "\n * Vectorised: each thread takes four consecutive elements at a time (the grid is sized\n"
                          " * for n / 4), loading and storing each float32 array at the element itself as one float4;\n"
                          " * operands read by coordinates (broadcasts) and other dtypes, one element at a time.");
    kernel_head(L, launch.data);
    sb_free(&launch);
    /* the product's operands (the first reads): cuBLAS reads them, not this kernel */
    sb_puts(o, "    const int64_t n = ");
    if (!L->rank) sb_puts(o, "1");
    for (int a = 0; a < L->rank; a++) sb_printf(o, "%sS%d", a ? " * " : "", a);
    sb_puts(o, ";\n");
    const bool vector = !scalar;
    if (vector) emit_vector_loop(L, mm);
    cg_clear_needed(L);
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm) cg_need(L, L->stores[i]);
    sb_printf(o, "    for (int64_t i = %sblockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {\n",
              vector ? "4 * n4 + " : "");
    cg_coordinates(L, L->coords, L->rank ? (((uint64_t)1 << L->rank) - 1) : 0, "i", "        ");
    cg_emit_needed(L, "        ");
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm) cg_store_line(o, "        ", L->g, L->stores[i], "i", "t%d");
    sb_puts(o, "    }\n}\n\n");
}

/* How a row kernel spreads its rows over threads. */
typedef enum {
    ROWS_PER_BLOCK, /* one block per row: each thread takes every blockDim.x-th element */
    ROWS_PER_THREAD /* one thread per row, walking it in order (short rows: a pooling window) */
} RowSpread;

/* Rows of at most this many elements (known when the model is compiled) go one per thread:
 * a block of 256 threads would leave most of them idle and pay for two barriers per pass. */
#define CUDA_ROW_THREAD_MAX 32

/* One thread per row: its row length is a constant no larger than CUDA_ROW_THREAD_MAX, and
 * no total over the rows needs them taken in order by one block. */
static RowSpread row_spread(const CgKernel *L)
{
    if (has_total(L)) return ROWS_PER_BLOCK;
    int64_t w = 1;
    for (int a = 0; a < L->rank; a++) {
        if (!(L->inner >> a & 1)) continue;
        Dim d = L->K->shape.d[a];
        if (d.nsym) return ROWS_PER_BLOCK;
        w *= d.k;
    }
    return w <= CUDA_ROW_THREAD_MAX ? ROWS_PER_THREAD : ROWS_PER_BLOCK;
}

/* Whether a block's threads share each row (kiln_block_sum): rows not one per thread, and
 * not a column kernel's; its launch has row_threads' block size. */
static bool block_per_row(const CgKernel *L)
{
    return !columns_kernel(L) && (has_total(L) || (L->K->axes && row_spread(L) == ROWS_PER_BLOCK));
}

/* Pass s over a row: the accumulators, the loop over the row's elements (the needed
 * members, the partial reductions, the stores of the pass), the row's results. When the
 * reduced axes are not the trailing ones (`strided`), element j of the row is at
 * base + c<a> * Ss<a> summed over the reduced axes a, their coordinates from j. */
static void emit_row_pass(CgKernel *L, int s, RowSpread spread, bool strided, const char *indent, const char *in)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (!cg_reduced_in_pass(L, id, s)) continue;
        const char *ty = cg_ctype((DType)g->nodes[id].dtype);
        if (g->nodes[id].op == OP_REDUCE_SUM) sb_printf(o, "%s%s a%d = 0;\n", indent, ty, id);
        else sb_printf(o, "%s%s a%d = -INFINITY;\n%sint nan%d = 0;\n", indent, ty, id, indent, id);
    }
    if (spread == ROWS_PER_THREAD) sb_printf(o, "%sfor (int64_t j = 0; j < W; j++) {\n", indent);
    else sb_printf(o, "%sfor (int64_t j = threadIdx.x; j < W; j += blockDim.x) {\n", indent);
    if (strided) {
        cg_coordinates(L, L->inner, L->inner, "j", in);
        sb_printf(o, "%sconst int64_t i = base", in);
        for (int a = 0; a < L->rank; a++)
            if (L->inner >> a & 1) sb_printf(o, " + c%d * Ss%d", a, a);
        sb_puts(o, ";\n");
    } else {
        sb_printf(o, "%sconst int64_t i = row * W + j;\n", in);
        /* the coordinates of the reduced axes, from the position in the row */
        cg_coordinates(L, L->coords & L->inner, L->inner, "j", in);
    }
    cg_emit_needed(L, in);
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (!cg_reduced_in_pass(L, id, s)) continue;
        StrBuf v;
        sb_init(&v);
        cg_operand(L, ir_input(g, id, 0), id, false, &v);
        if (g->nodes[id].op == OP_REDUCE_SUM) sb_printf(o, "%sa%d += %s;\n", in, id, v.data);
        else if (cg_never_nan(g, ir_input(g, id, 0), 0))
            sb_printf(o, "%s{\n%s    const %s v = %s;\n%s    a%d = v > a%d ? v : a%d;\n%s}\n", in, in,
                      cg_ctype((DType)g->nodes[id].dtype), v.data, in, id, id, id, in);
        else
            sb_printf(o, "%s{\n%s    const %s v = %s;\n%s    a%d = v > a%d ? v : a%d;\n%s    nan%d |= v != v;\n%s}\n", in, in,
                      cg_ctype((DType)g->nodes[id].dtype), v.data, in, id, id, id, in, id, in);
        sb_free(&v);
    }
    for (int i = 0; i < L->nstores; i++)
        if (cg_stored_in_pass(L, L->stores[i], s)) cg_store_line(o, in, g, L->stores[i], "i", "t%d");
    sb_printf(o, "%s}\n", indent);
    /* the row's results: a thread's own, or the block's (the same in every thread) */
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (!cg_reduced_in_pass(L, id, s)) continue;
        const char *ty = cg_ctype((DType)g->nodes[id].dtype);
        if (spread == ROWS_PER_THREAD) {
            if (g->nodes[id].op == OP_REDUCE_SUM) sb_printf(o, "%sconst %s w%d = a%d;\n", indent, ty, id, id);
            else sb_printf(o, "%sconst %s w%d = nan%d ? NAN : a%d;\n", indent, ty, id, id, id);
        } else if (g->nodes[id].op == OP_REDUCE_SUM) {
            sb_printf(o, "%sconst %s w%d = kiln_block_sum(a%d);\n", indent, ty, id, id);
        } else {
            sb_printf(o, "%sconst %s m%d = kiln_block_max(a%d);\n", indent, ty, id, id);
            sb_printf(o, "%sconst %s w%d = kiln_block_max(nan%d) ? NAN : m%d;\n", indent, ty, id, id, id);
        }
    }
}

/* The product of the dims of the inner axes (or of the others): S<a> names, or with
 * `values` the dims themselves (host code). */
static void dims_product(StrBuf *o, const CgKernel *L, bool inner, bool values)
{
    bool any = false;
    for (int a = 0; a < L->rank; a++) {
        if ((L->inner >> a & 1) != inner) continue;
        sb_puts(o, any ? " * " : "");
        Dim d = L->K->shape.d[a];
        bool paren = values && d.nsym && (d.k != 1 || d.nsym > 1);
        if (!values) sb_printf(o, "S%d", a);
        else {
            sb_puts(o, paren ? "(" : "");
            cg_dim(o, L->g, d);
            sb_puts(o, paren ? ")" : "");
        }
        any = true;
    }
    if (!any) sb_puts(o, "1");
}

static bool has_total(const CgKernel *L)
{
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) return true;
    return false;
}

/* The launch's block size for a kernel whose block shares each row: as many warps as the
 * row has elements, up to 256 threads. A row of 40 elements takes 64 threads, not 256 of
 * which 216 would only wait at the barriers of every block reduction. */
static void row_threads(const CgKernel *L, StrBuf *o)
{
    sb_puts(o, "    const int64_t W = ");
    dims_product(o, L, true, true);
    sb_printf(o, "; /* a row's elements */\n"
                 "    const int threads = W >= %d ? %d : W <= 32 ? 32 : (int)(W + 31) / 32 * 32;\n",
              CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
}

/* Reductions over leading axes whose results nothing else in the kernel uses (bias
 * gradients, CG_LOOP_COLUMNS): one thread per column walks down its H elements in order,
 * as the C target does, so the sums are the same bits; neighbouring threads read
 * neighbouring elements. */
static void emit_columns_kernel(CgKernel *L)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    kernel_head(L, "one thread per column (blocks of 256, a grid-stride loop over the columns); each\n"
                   " * thread walks down the rows of its column in order, accumulating in registers.");
    sb_puts(o, "    const int64_t H = ");
    dims_product(o, L, true, false);
    sb_puts(o, ", R = ");
    dims_product(o, L, false, false);
    sb_puts(o, ";\n    for (int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; row < R; row += (int64_t)gridDim.x * blockDim.x) {\n");
    /* coordinates that members use: of the other axes from the column, of the reduced
     * axes from h (element i = h * R + row) */
    const uint64_t outer = (L->rank ? (((uint64_t)1 << L->rank) - 1) : 0) & ~L->inner;
    cg_coordinates(L, L->coords & outer, outer, "row", "        ");
    cg_need_columns(L);
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (L->f->cls[id] == CLASS_ROW)
            sb_printf(o, "        %s a%d = %s;\n", cg_ctype((DType)g->nodes[id].dtype), id,
                      g->nodes[id].op == OP_REDUCE_SUM ? "0" : "-INFINITY");
    }
    sb_puts(o, "        for (int64_t h = 0; h < H; h++) {\n            const int64_t i = h * R + row;\n");
    cg_coordinates(L, L->coords & L->inner, L->inner, "h", "            ");
    cg_emit_column_element(L, "            ", "a", "");
    sb_puts(o, "        }\n");
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        if (L->f->cls[id] == CLASS_ROW) cg_store_line(o, "        ", L->g, id, "row", "a%d");
    }
    sb_puts(o, "    }\n}\n\n");
}

/* A row reduction kernel: kernel.c's passes over each row (cg_need_pass) as loops over
 * the row's elements. With one block per row, each thread takes every blockDim.x-th
 * element and block-wide reductions combine the threads' partial results, so that every
 * thread then holds the row values (w<id>), as the C target's row loop does; with one
 * thread per row (short rows), the thread walks the row in the C target's order, the same
 * sums. The reduced axes are the trailing ones (a row is W contiguous elements) or any
 * others (pooling windows, a convolution's bias gradient over the batch and the pixels):
 * then each element's offset comes from its coordinates. */
static void emit_rows_kernel(CgKernel *L)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    const RowSpread spread = row_spread(L);
    const bool strided = !cg_axes_trailing(L);
    kernel_head(L, has_total(L) ? "blocks of 256 threads (at most KILN_CUDA_TOTAL_BLOCKS), each taking a contiguous\n"
                                  " * run of rows in order and writing its part of the total to `partials`; kiln_sum_parts\n"
                                  " * then adds the parts in block order, so that the total is the same bits every run. In\n"
                                  " * each pass over a row, thread t takes elements t, t + blockDim.x, ..., then the block\n"
                                  " * combines the threads' partial sums or maxima (kiln_block_sum, kiln_block_max)."
                   : spread == ROWS_PER_THREAD ? "one thread per row (the rows are short: blocks of 256 threads, a grid-stride loop\n"
                                                 " * over the rows); each pass walks the row's elements in order, as the C target does."
                                               : "one block of 256 threads per row (a grid-stride loop over the rows); in each\n"
                                                 " * pass over the row, thread t takes elements t, t + blockDim.x, ..., then the block\n"
                                                 " * combines the threads' partial sums or maxima (kiln_block_sum, kiln_block_max).");
    sb_puts(o, "    const int64_t R = ");
    dims_product(o, L, false, false);
    sb_puts(o, ", W = ");
    dims_product(o, L, true, false);
    sb_puts(o, ";\n");
    if (strided) { /* row-major strides of the kernel's shape: element offsets from coordinates */
        cg_declare_strides(L->c, "S", L->rank);
    }
    for (int i = 0, t = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) {
            const char *ty = cg_ctype((DType)g->nodes[L->stores[i]].dtype);
            sb_printf(o, "    %s tot%d = 0;\n", ty, L->stores[i]);
            sb_printf(o, "    %s *parts%d = (%s *)((char *)partials + %d * KILN_CUDA_TOTAL_BLOCKS * 8);\n", ty, L->stores[i], ty, t++);
        }
    if (has_total(L))
        sb_puts(o, "    for (int64_t row = R * blockIdx.x / gridDim.x; row < R * (blockIdx.x + 1) / gridDim.x; row++) {\n");
    else if (spread == ROWS_PER_THREAD)
        sb_puts(o, "    for (int64_t row = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; row < R; row += (int64_t)gridDim.x * blockDim.x) {\n");
    else sb_puts(o, "    for (int64_t row = blockIdx.x; row < R; row += gridDim.x) {\n");
    const char *indent = "        ", *in = "            ";
    /* the coordinates of the other axes, from the row index (all of them for an offset) */
    const uint64_t outer = (L->rank ? (((uint64_t)1 << L->rank) - 1) : 0) & ~L->inner;
    cg_coordinates(L, strided ? outer : L->coords & outer, outer, "row", indent);
    if (strided) {
        sb_printf(o, "%sconst int64_t base = 0", indent);
        for (int a = 0; a < L->rank; a++)
            if (outer >> a & 1) sb_printf(o, " + c%d * Ss%d", a, a);
        sb_puts(o, "; /* the row's first element */\n");
    }
    for (int s = 0; s <= L->nstages + 1; s++) {
        L->pass = s;
        if (s > 0 && cg_need_pass(L, s)) emit_row_pass(L, s, spread, strided, indent, in);
        for (int32_t i = 0; i < L->K->count; i++) {
            NodeId id = CG_MEMBER(L, i);
            const Node *n = &g->nodes[id];
            if (L->f->cls[id] == CLASS_ROW && L->avail[id] == s && n->op != OP_REDUCE_SUM && n->op != OP_REDUCE_MAX)
                cg_member_value(L, id, true, indent);
        }
    }
    L->pass = 0;
    char first[64]; /* the thread that stores a row's results */
    snprintf(first, sizeof first, "%s%s", indent, spread == ROWS_PER_THREAD ? "" : "if (threadIdx.x == 0) ");
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_ROW) cg_store_line(o, first, g, L->stores[i], "row", "w%d");
    for (int i = 0; i < L->nstores; i++) {
        NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_TOTAL) continue;
        sb_printf(o, "%stot%d += ", indent, id);
        cg_operand(L, ir_input(g, id, 0), id, true, o);
        sb_puts(o, ";\n");
    }
    sb_puts(o, "    }\n");
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL)
            sb_printf(o, "    if (threadIdx.x == 0) parts%d[blockIdx.x] = tot%d;\n", L->stores[i], L->stores[i]);
    sb_puts(o, "}\n\n");
}

/* Is d the constant 0 (a batch axis that an operand broadcasts)? */
static bool dim_is_zero(Dim d) { return d.nsym == 0 && d.k == 0; }

/* Do batch axes a and a + 1 of an operand with these strides walk its memory as one axis:
 * the stride of a is the stride of a + 1 times the dim of a + 1 (or both are 0)? */
static bool strides_nest(Dim outer, Dim inner, Dim n)
{
    if (dim_is_zero(inner)) return dim_is_zero(outer);
    Dim p;
    return ir_dim_mul(inner, n, &p) && ir_dim_eq(p, outer);
}

/* The stride, in elements, between consecutive products of an operand along batch axis a. */
static void batch_stride(CgKernel *L, const CgOperand *X, int a, StrBuf *o)
{
    Dim st = X->lay.stride[a];
    sb_puts(o, "(long long)(");
    cg_dim(o, L->g, st);
    sb_puts(o, ")");
}

/* The operands of a product in cuBLAS's column-major order: row-major C (M x N) is
 * column-major C^T = B^T A^T, so B goes first, each transposed where the C target's BLAS call
 * transposes it; where C's rows are the memory's columns (written permuted), column-major
 * C = A B, each operand transposed where the C target's is not. */
typedef struct {
    const CgOperand *op[2];
    const char *trans[2], *ld[2], *off[2], *stride[2], *m, *n;
} CublasOrder;

static CublasOrder cublas_order(const CgOperand *A, const CgOperand *B, bool permuted, const char *offa, const char *offb,
                                const char *sa, const char *sb)
{
    const bool t = permuted;
    CublasOrder c = {{t ? A : B, t ? B : A}, {NULL, NULL}, {t ? "lda" : "ldb", t ? "ldb" : "lda"}, {t ? offa : offb, t ? offb : offa},
                     {t ? sa : sb, t ? sb : sa}, t ? "M" : "N", t ? "N" : "M"};
    for (int i = 0; i < 2; i++) c.trans[i] = c.op[i]->trans != t ? "CUBLAS_OP_T" : "CUBLAS_OP_N";
    return c;
}

/* A batch of products (attention's q k^T and its product with v, per batch element and
 * head) as cublasSgemmStridedBatched calls: the trailing batch axes whose strides nest in
 * every operand (a row-major product always does) are one call of their products; the
 * leading ones that do not, a loop around it. cuBLAS computes each product as cublasSgemm
 * would: the same sums. */
static void emit_strided_batched(CgKernel *L, const CgOperand *A, const CgOperand *B, const CgOperand *C, NodeId y)
{
    StrBuf *o = L->c->o;
    const int nbatch = L->rank - 2;
    const bool permuted = L->K->written != IR_NONE;
    int q = nbatch - 1; /* the first axis of the run of one call */
    while (q > 0) {
        const Dim n = L->K->shape.d[q];
        if (!strides_nest(A->lay.stride[q - 1], A->lay.stride[q], n) || !strides_nest(B->lay.stride[q - 1], B->lay.stride[q], n) ||
            (permuted && !strides_nest(C->lay.stride[q - 1], C->lay.stride[q], n)))
            break;
        q--;
    }
    /* the offsets of the run's first product: its batch coordinates from q on are 0 */
    CgOperand a0 = *A, b0 = *B, c0 = *C;
    for (int k = q; k < nbatch; k++) a0.lay.stride[k] = b0.lay.stride[k] = c0.lay.stride[k] = ir_dim_const(0);
    StrBuf offa, offb, offc, sa, sb, sc;
    sb_init(&offa);
    sb_init(&offb);
    sb_init(&offc);
    sb_init(&sa);
    sb_init(&sb);
    sb_init(&sc);
    cg_gemm_operand_offset(L, &a0, nbatch, "0", "0", &offa);
    cg_gemm_operand_offset(L, &b0, nbatch, "0", "0", &offb);
    batch_stride(L, A, nbatch - 1, &sa);
    batch_stride(L, B, nbatch - 1, &sb);
    if (permuted) {
        cg_gemm_operand_offset(L, &c0, nbatch, "0", "0", &offc);
        batch_stride(L, C, nbatch - 1, &sc);
    } else {
        sb_puts(&offc, q ? "ob * count * M * N" : "0");
        sb_puts(&sc, "(long long)(M * N)");
    }
    sb_puts(o, "    /* the batch: ");
    if (q) sb_printf(o, "its axes from %d on as one strided-batched call (their strides nest),\n     * a loop over the others */\n", q);
    else sb_puts(o, "one strided-batched call of all its products (their strides nest) */\n");
    sb_puts(o, "    const int64_t count = 1");
    for (int k = q; k < nbatch; k++) sb_printf(o, " * S%d", k);
    sb_puts(o, ";\n");
    const char *in = "";
    if (q) {
        const uint64_t outer = ((uint64_t)1 << q) - 1;
        sb_puts(o, "    for (int64_t ob = 0; ob < batch / count; ob++) {\n");
        cg_coordinates(L, outer, outer, "ob", "        ");
        in = "    ";
    }
    const CublasOrder c = cublas_order(A, B, C->trans, offa.data, offb.data, sa.data, sb.data);
    const char *half = cuda_gemm_half_type(L->g, L->K->anchor);
    if (!half)
        sb_printf(o, "    %sKILN_CUBLAS_CHECK(cublasSgemmStridedBatched(blas, %s, %s, (int)%s, (int)%s, (int)K, &one,\n"
                     "    %s    p%d + (%s), %s, %s, p%d + (%s), %s, %s, &zero,\n"
                     "    %s    y%d + (%s), ldc, %s, (int)count));\n",
                  in, c.trans[0], c.trans[1], c.m, c.n, in, c.op[0]->lay.base, c.off[0], c.ld[0], c.stride[0], c.op[1]->lay.base,
                  c.off[1], c.ld[1], c.stride[1], in, y, offc.data, sc.data);
    else /* half-precision operands: the tensor cores, accumulated in float32 */
        sb_printf(o, "    %sKILN_CUBLAS_CHECK(cublasGemmStridedBatchedEx(blas, %s, %s, (int)%s, (int)%s, (int)K, &one,\n"
                     "    %s    p%d + (%s), %s, %s, %s, p%d + (%s), %s, %s, %s, &zero,\n"
                     "    %s    y%d + (%s), CUDA_R_32F, ldc, %s, (int)count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));\n",
                  in, c.trans[0], c.trans[1], c.m, c.n, in, c.op[0]->lay.base, c.off[0], half, c.ld[0], c.stride[0],
                  c.op[1]->lay.base, c.off[1], half, c.ld[1], c.stride[1], in, y, offc.data, sc.data);
    if (q) sb_puts(o, "    }\n");
    sb_free(&offa);
    sb_free(&offb);
    sb_free(&offc);
    sb_free(&sa);
    sb_free(&sb);
    sb_free(&sc);
}

/* The product of a GEMM kernel through cuBLAS, into the product's memory. cuBLAS is
 * column-major: the row-major C = A B (M x N) is the column-major C^T = B^T A^T, and a
 * row-major operand read as column-major is its transpose, so B goes first, each operand
 * transposed where the C target's BLAS call transposes it. Returns whether an epilogue
 * kernel follows (a stored member besides the product). */
static bool emit_gemm_call(CgKernel *L)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    NodeId mm = L->K->anchor, xa = ir_input(g, mm, 0), xb = ir_input(g, mm, 1);
    const int r = L->rank, nbatch = r - 2;
    const uint64_t batch_axes = nbatch ? ((uint64_t)1 << nbatch) - 1 : 0;
    CgOperand A, B;
    cg_gemm_operand(L, xa, &A);
    cg_gemm_operand(L, xb, &B);
    if (nbatch) { /* the batch's dims, for its coordinates */
        sb_puts(o, "    const int64_t ");
        for (int a = 0; a < nbatch; a++) {
            sb_printf(o, "%sS%d = ", a ? ", " : "", a);
            cg_dim(o, g, L->K->shape.d[a]);
        }
        sb_puts(o, ";\n");
    }
    sb_puts(o, "    const int64_t batch = 1");
    for (int a = 0; a < nbatch; a++) sb_printf(o, " * S%d", a);
    sb_puts(o, ", M = ");
    cg_dim(o, g, L->K->shape.d[r - 2]);
    sb_puts(o, ", N = ");
    cg_dim(o, g, L->K->shape.d[r - 1]);
    sb_puts(o, ", K = ");
    cg_dim(o, g, g->nodes[xb].shape.d[r - 2]);
    const NodeId sum = L->K->summed;
    if (sum != IR_NONE) /* an empty batch sums to zero */
        sb_printf(o, ";\n    if (M == 0 || N == 0) return;\n"
                     "    if (batch == 0) {\n"
                     "        KILN_CUDA_CHECK(cudaMemsetAsync(y%d, 0, (size_t)(M * N) * sizeof *y%d, stream));\n"
                     "        return;\n"
                     "    }\n",
                  sum, sum);
    else sb_puts(o, ";\n    if (batch == 0 || M == 0 || N == 0) return;\n");
    cg_gemm_operand_comment(L, "A", xa, &A);
    cg_gemm_operand_comment(L, "B", xb, &B);
    cg_gemm_operand_ld(L, "a", xa, &A);
    cg_gemm_operand_ld(L, "b", xb, &B);
    const NodeId wr = L->K->written;
    CgOperand C = {.trans = false};
    if (wr != IR_NONE) cg_gemm_output(L, &C); /* straight into the permuted memory of %wr, as the C target */
    else sb_puts(o, "    const int ldc = (int)kiln_blas_ld(N, N);\n");
    if (wr == IR_NONE && sum == IR_NONE && !nbatch && !cuda_gemm_emit_bgrad(L, &A, &B)) cuda_gemm_emit_lt(L, &A, &B); /* cuda_gemm.c */
    sb_puts(o, "    const float one = 1, zero = 0;\n"
               "    KILN_CUBLAS_CHECK(cublasSetStream(blas, stream));\n");
    const NodeId y = wr != IR_NONE ? wr : sum != IR_NONE ? sum : mm;
    if (sum != IR_NONE || !nbatch) {
        /* one product, or products summed over the batch (a convolution's weight gradient):
         * added into the sum in batch order, as the C target adds them, beta 0 for the
         * first and 1 after */
        if (sum != IR_NONE) {
            sb_printf(o, "    /* C = %%%d ", sum);
            sb_puts(o, cg_ctype((DType)g->nodes[sum].dtype));
            ir_shape_format(o, g, &g->nodes[sum].shape);
            sb_puts(o, ": the products summed over the batch, none stored */\n"
                       "    for (int64_t b = 0; b < batch; b++) {\n"
                       "        const float beta = b ? one : zero;\n");
            cg_coordinates(L, batch_axes, batch_axes, "b", "        ");
        }
        StrBuf offa, offb, offc;
        sb_init(&offa);
        sb_init(&offb);
        sb_init(&offc);
        cg_gemm_operand_offset(L, &A, nbatch, "0", "0", &offa);
        cg_gemm_operand_offset(L, &B, nbatch, "0", "0", &offb);
        if (wr != IR_NONE) cg_gemm_operand_offset(L, &C, nbatch, "0", "0", &offc);
        else sb_puts(&offc, "0");
        const char *in = sum != IR_NONE ? "    " : "";
        const char *half = cuda_gemm_half_type(g, mm);
        const CublasOrder c = cublas_order(&A, &B, C.trans, offa.data, offb.data, NULL, NULL);
        const char *beta = sum != IR_NONE ? "&beta" : "&zero";
        if (!half)
            sb_printf(o, "    %sKILN_CUBLAS_CHECK(cublasSgemm(blas, %s, %s, (int)%s, (int)%s, (int)K, &one, p%d + (%s), %s, p%d + (%s), %s, %s,\n"
                         "    %s                              y%d + (%s), ldc));\n",
                      in, c.trans[0], c.trans[1], c.m, c.n, c.op[0]->lay.base, c.off[0], c.ld[0], c.op[1]->lay.base, c.off[1], c.ld[1],
                      beta, in, y, offc.data);
        else /* half-precision operands: the tensor cores, accumulated in float32 */
            sb_printf(o, "    %sKILN_CUBLAS_CHECK(cublasGemmEx(blas, %s, %s, (int)%s, (int)%s, (int)K, &one, p%d + (%s), %s, %s,\n"
                         "    %s                               p%d + (%s), %s, %s, %s, y%d + (%s), CUDA_R_32F, ldc,\n"
                         "    %s                               CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));\n",
                      in, c.trans[0], c.trans[1], c.m, c.n, c.op[0]->lay.base, c.off[0], half, c.ld[0], in, c.op[1]->lay.base,
                      c.off[1], half, c.ld[1], beta, y, offc.data, in);
        if (sum != IR_NONE) sb_puts(o, "    }\n");
        cuda_gemm_emit_bgrad_fallback(L);
        sb_free(&offa);
        sb_free(&offb);
        sb_free(&offc);
    } else {
        emit_strided_batched(L, &A, &B, &C, y);
    }
    if (wr != IR_NONE || sum != IR_NONE) return false; /* no epilogue (fusion.c): the permute or the sum is the store */
    for (int i = 0; i < L->nstores; i++)
        if (L->stores[i] != mm) return true;
    return false;
}

/* The host function that launches kernel L on `grid` blocks (an expression of n, the
 * elements, and R, the rows). */
static void emit_launcher(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    sb_printf(o, "/* Launches kernel %d on stream: s holds the symbols' values (host memory), the\n"
                 " * pointers are device memory. */\nvoid ",
              L->k);
    kernel_name(L, o);
    sb_puts(o, "_launch(");
    parameters(L, o, true);
    sb_puts(o, ")\n{\n");
    for (int sy = 0; sy < g->nsyms; sy++) sb_printf(o, "    const int64_t %s = s[%d];\n", g->syms[sy].name, sy);
    sb_puts(o, "    const int64_t n = ");
    if (!L->rank) sb_puts(o, "1");
    for (int a = 0; a < L->rank; a++) {
        Dim d = L->K->shape.d[a];
        bool paren = d.nsym && d.k != 1;
        sb_puts(o, a ? " * " : "");
        sb_puts(o, paren ? "(" : "");
        cg_dim(o, g, d);
        sb_puts(o, paren ? ")" : "");
    }
    sb_puts(o, ";\n");
    bool epilogue = true;
    if (L->mode == CG_LOOP_GEMM) epilogue = emit_gemm_call(L);
    if (!epilogue) {
        sb_puts(o, "}\n\n");
        return;
    }
    if (columns_kernel(L)) { /* one thread per column */
        sb_puts(o, "    const int64_t columns = ");
        dims_product(o, L, false, true);
        sb_printf(o, ";\n    const int64_t blocks = (columns + %d - 1) / %d;\n", CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
    } else if (has_total(L)) { /* runs of rows; a block with none still writes its part, 0 */
        sb_puts(o, "    const int64_t R = ");
        dims_product(o, L, false, true);
        sb_puts(o, ";\n    const int64_t blocks = R < 1 ? 1 : R < KILN_CUDA_TOTAL_BLOCKS ? R : KILN_CUDA_TOTAL_BLOCKS;\n");
        row_threads(L, o);
    } else if (L->K->axes && row_spread(L) == ROWS_PER_THREAD) { /* one thread per row */
        sb_puts(o, "    const int64_t rows = ");
        dims_product(o, L, false, true);
        sb_printf(o, ";\n    const int64_t blocks = (rows + %d - 1) / %d;\n", CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
    } else if (L->K->axes) { /* one block per row; a row of no elements still has its sum, 0 */
        sb_puts(o, "    const int64_t blocks = ");
        dims_product(o, L, false, true);
        sb_puts(o, ";\n");
        row_threads(L, o);
    } else if (!scalar_reason(L)) { /* four elements per thread (emit_vector_loop) */
        sb_printf(o, "    const int64_t blocks = ((n + 3) / 4 + %d - 1) / %d; /* four elements a thread */\n", CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
    } else {
        sb_printf(o, "    const int64_t blocks = (n + %d - 1) / %d;\n", CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
    }
    sb_puts(o, "    if (blocks == 0) return;\n");
    sb_printf(o, "    const int grid = blocks < %d ? (int)blocks : %d;\n", CUDA_MAP_GRID_MAX, CUDA_MAP_GRID_MAX);
    StrBuf site;
    sb_init(&site);
    cuda_model_line(c, L->K->anchor, &site);
    sb_puts(o, "    KILN_LAUNCH_AT(");
    cg_c_string(o, site.data);
    sb_free(&site);
    sb_puts(o, ", ");
    kernel_name(L, o);
    sb_puts(o, L->mode == CG_LOOP_GEMM ? "_epilogue" : "");
    if (block_per_row(L)) sb_puts(o, ", grid, threads, 0, stream");
    else sb_printf(o, ", grid, %d, 0, stream", CUDA_MAP_BLOCK);
    for (int sy = 0; sy < g->nsyms; sy++) sb_printf(o, ", %s", g->syms[sy].name);
    for (int i = 0; i < L->nreads; i++) sb_printf(o, ", p%d", L->reads[i]);
    for (int i = 0; i < L->nstores; i++) sb_printf(o, ", y%d", L->stores[i]);
    if (L->random) sb_puts(o, ", seed, step");
    if (has_total(L)) sb_puts(o, ", partials");
    sb_puts(o, ");\n");
    /* the totals: the blocks' parts in block order */
    for (int i = 0, t = 0; i < L->nstores; i++) {
        NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_TOTAL) continue;
        const char *ty = cg_ctype((DType)g->nodes[id].dtype);
        sb_puts(o, "    KILN_LAUNCH_AT(");
        StrBuf at;
        sb_init(&at);
        cuda_model_line(c, L->K->anchor, &at);
        cg_c_string(o, at.data);
        sb_free(&at);
        sb_printf(o, ", kiln_sum_parts<%s>, 1, 32, 0, stream, (const %s *)((char *)partials + %d * KILN_CUDA_TOTAL_BLOCKS * 8), grid, y%d);\n",
                  ty, ty, t++, id);
    }
    sb_puts(o, "}\n\n");
}

/* ---- the step (host.c writes it; these are the target's parts) ---- */

/* The function kernel k launches, for the profile table. */
static void kernel_function(Cg *c, int32_t k, StrBuf *b)
{
    CgKernel L;
    cg_kernel_setup(&L, c, k);
    if (L.K->kind == KERNEL_SINGLE) cuda_single_name(c, k, L.K->anchor, b);
    else kernel_name(&L, b);
    cg_kernel_teardown(&L);
}

/* Kernel k's launch in the step, on the step's stream, then its profile mark. */
static void emit_kernel_call(Cg *c, int32_t k)
{
    CgKernel L;
    cg_kernel_setup(&L, c, k);
    StrBuf *o = c->o;
    const Node *n = N(c, L.K->anchor);
    sb_puts(o, "    ");
    if (L.K->kind == KERNEL_SINGLE && cg_is_attention((Op)n->op)) {
        StrBuf fn;
        sb_init(&fn);
        cuda_single_name(c, k, L.K->anchor, &fn);
        o->len -= 4; /* cuda_emit_attention_call indents */
        o->data[o->len] = 0;
        cuda_emit_attention_call(c, k, fn.data);
        sb_free(&fn);
    } else if (L.K->kind == KERNEL_SINGLE) {
        cuda_single_name(c, k, L.K->anchor, o);
        sb_puts(o, "_launch(io->syms");
        for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, ", v%d", ir_input(c->g, L.K->anchor, (int)j));
        sb_printf(o, ", v%d", L.K->anchor);
        if (n->op == OP_CHECK_INDEX) sb_printf(o, ", checks + %d", 2 * c->ncheck++);
        sb_puts(o, ", stream);");
    } else {
        if (L.mode == CG_LOOP_GEMM) { /* its cuBLAS calls' errors name it */
            StrBuf site;
            sb_init(&site);
            cuda_model_line(c, L.K->anchor, &site);
            sb_puts(o, "KILN_CUDA_NOW_AT(\"");
            kernel_name(&L, o);
            sb_puts(o, "\", ");
            cg_c_string(o, site.data);
            sb_puts(o, ");\n    ");
            sb_free(&site);
        }
        NodeId bgrad;
        const int32_t taker = cuda_gemm_bgrad_taker(c, k, &bgrad);
        if (taker >= 0) sb_printf(o, "/* %%%d: kernel %d's cuBLASLt epilogue (BGRADB) sums it */", bgrad, taker);
        else kernel_name(&L, o);
        if (taker < 0) sb_puts(o, "_launch(io->syms");
        for (int i = 0; i < L.nreads && taker < 0; i++) sb_printf(o, ", v%d", L.reads[i]);
        for (int i = 0; i < L.nstores && taker < 0; i++) sb_printf(o, ", v%d", L.stores[i]);
        if (cuda_gemm_bgrad_source(c, k, &bgrad) >= 0) sb_printf(o, ", v%d", bgrad);
        if (L.random && taker < 0) sb_puts(o, ", io->seed, io->step");
        if (has_total(&L) && taker < 0) sb_puts(o, ", cs.partials");
        if (taker < 0) sb_puts(o, L.mode == CG_LOOP_GEMM ? ", stream, blas);" : ", stream);");
    }
    sb_printf(o, " KILN_CUDA_MARK(io, %d, stream);", k);
    if (n->op == OP_CHECK_INDEX) sb_printf(o, " /* %s: bad indices become 0 */", ir_node_name(c->g, L.K->anchor));
    else if (n->name && n->op != OP_INPUT && n->op != OP_PARAM) sb_printf(o, " /* %s */", ir_node_name(c->g, L.K->anchor));
    sb_putc(o, '\n');
    cg_kernel_teardown(&L);
}

/* The kernels of one graph; -1 with the error for the first one not supported yet. */
static int emit_graph(Cg *c, const CodegenGraph *cgg, const Graph *ref, const char *prefix, const char *step, bool partial, int64_t *arena)
{
    const Graph *g = cgg->graph;
    KILN_ASSERT_MSG(cgg->plan && cgg->plan->placed, "codegen needs the graph's plan (the pipeline's fusion and memplan)");
    c->g = g;
    c->prefix = prefix;
    cg_layout_for(c, g, ref);
    c->fp = cgg->plan->fusion; /* the pipeline's plan, read only: let go of below */
    c->mp = cgg->plan->mem;
    cuda_gemm_plan_bgrad(c); /* bias gradients summed by their weight gradient's product */
    int rc = 0;
    bool *epilogue_of = xcalloc((size_t)c->fp.nkernels + 1, 1); /* a product's kernel after cuBLAS */
    for (int32_t k = 0; k < c->fp.nkernels && !rc; k++) {
        CgKernel L;
        cg_kernel_setup(&L, c, k);
        const char *kind = unsupported_kind(&L);
        if (!kind && L.K->kind == KERNEL_SINGLE && cg_is_attention((Op)N(c, L.K->anchor)->op)) {
            StrBuf fn, site;
            sb_init(&fn);
            sb_init(&site);
            cuda_single_name(c, k, L.K->anchor, &fn);
            cuda_model_line(c, L.K->anchor, &site);
            cuda_emit_attention_kernel(c, k, fn.data, site.data);
            sb_free(&fn);
            sb_free(&site);
        } else if (!kind && L.K->kind == KERNEL_SINGLE) {
            cuda_emit_single_kernel(c, k, L.K->anchor);
            cuda_emit_single_launcher(c, k, L.K->anchor);
        } else if (!kind) {
            bool epilogue = false;
            for (int i = 0; i < L.nstores && L.K->written == IR_NONE && L.K->summed == IR_NONE; i++) epilogue |= L.stores[i] != L.K->anchor;
            epilogue_of[k] = L.mode == CG_LOOP_GEMM && epilogue;
            if (L.mode == CG_LOOP_GEMM && !epilogue) cg_kernel_comment(&L);
            else if (columns_kernel(&L)) emit_columns_kernel(&L);
            else if (L.K->axes) emit_rows_kernel(&L);
            else emit_map_kernel(&L);
            emit_launcher(&L);
        } else {
            StrBuf title, line;
            sb_init(&title);
            sb_init(&line);
            if (L.K->kind == KERNEL_SINGLE) { /* the title of a loop kernel would call it elementwise */
                const Node *n = N(c, L.K->anchor);
                sb_printf(&title, "%%%d %s to %s", L.K->anchor, ir_op_info[n->op].name, cg_ctype((DType)n->dtype));
                ir_shape_format(&title, g, &n->shape);
            } else {
                cg_kernel_title(c, k, &title);
            }
            cuda_model_line(c, L.K->anchor, &line);
            if (partial) {
                sb_printf(c->o, "/* kernel %d: %s — not written: --target cuda does not support %s kernels yet\n * %s */\n\n", k,
                          title.data, kind, line.data);
            } else {
                sb_printf(c->err, "%s:%u: error: --target cuda does not support %s kernels yet (kernel %d of the %s step, %s: %s)",
                          c->source, N(c, L.K->anchor)->loc.line, kind, k, step, title.data, line.data);
                rc = -1;
            }
            sb_free(&title);
            sb_free(&line);
        }
        cg_kernel_teardown(&L);
    }
    StrBuf fn, launcher;
    sb_init(&fn);
    sb_init(&launcher);
    for (int32_t k = 0; k < c->fp.nkernels && !rc; k++) {
        sb_free(&fn);
        sb_free(&launcher);
        kernel_function(c, k, &fn);
        sb_printf(&launcher, "%s_launch", fn.data);
        cg_names_record(c, k, fn.data, launcher.data, "");
        const NodeId anchor = c->fp.kernels[k].anchor;
        if (c->fp.kernels[k].kind == KERNEL_SINGLE && cg_is_attention((Op)N(c, anchor)->op) &&
            (N(c, anchor)->op == OP_ATTENTION_GRAD || ir_attrs(c->g, anchor)[0] != ATTN_MASK_CAUSAL)) { /* its second kernel */
            const char *second = N(c, anchor)->op == OP_ATTENTION_GRAD ? "_dq" : "_combine";
            sb_puts(&fn, second);
            cg_names_record(c, k, fn.data, NULL, second);
        }
        if (!epilogue_of[k]) continue;
        sb_puts(&fn, "_epilogue");
        cg_names_record(c, k, fn.data, NULL, "_epilogue");
    }
    free(epilogue_of);
    sb_free(&fn);
    sb_free(&launcher);
    if (!rc && !partial) { /* the host side: the step that launches them, its tables */
        const bool train = !strcmp(prefix, "train");
        cg_emit_step(c, train, emit_kernel_call);
        cg_emit_kernel_table(c, kernel_function);
        if (!strcmp(prefix, "predict")) c->npredict_kernels = c->fp.nkernels;
        else if (c->decoding) c->ndecode_kernels = c->fp.nkernels;
        else c->nkernels[!train] = c->fp.nkernels;
        cg_emit_gemm_info(c, train);
    }
    *arena = c->mp.arena_bytes;
    cg_layout_free(c);
    cuda_gemm_free_bgrad(c);
    memset(&c->fp, 0, sizeof c->fp);
    memset(&c->mp, 0, sizeof c->mp);
    return rc;
}

/* Starts model.cu: checks that the target supports every dtype of g (the graph whose
 * steps the file holds), then the file's comment, includes and the block-wide helpers
 * every kind of kernel uses. -1 with the error in err. */
static int begin_file(Cg *c, const Graph *g, const Graph *train, const char *source_path, bool partial, bool infer, bool attention,
                      StrBuf *out, StrBuf *err)
{
    memset(c, 0, sizeof *c);
    c->infer = infer;
    c->o = out;
    c->err = err;
    c->source = source_path;
    c->target = CG_TARGET_CUDA;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (!cg_ctype((DType)g->nodes[i].dtype)) {
            sb_printf(err, "%s:%u: error: --target cuda does not support %s tensors yet (node %%%d %s)", source_path,
                      g->nodes[i].loc.line, ir_dtype_name((DType)g->nodes[i].dtype), i, ir_op_info[g->nodes[i].op].name);
            return -1;
        }
    cg_read_lines(c, source_path);
    sb_printf(out, "/* %s — CUDA generated by kiln %s from %s. Do not edit: edit the model and rebuild.\n"
                   " *\n"
                   " * Every kernel below is a group of operations of the model's graph (kiln ir --after\n"
                   " * fusion lists them), with its shapes and the model line it comes from, written in\n"
                   " * Kiln's CUDA dialect (docs/cuda.md): nvcc compiles it for the GPU, g++ -DKILN_CUDA_EMU\n"
                   " * for the CUDA emulator.%s */\n",
              train->name, KILN_VERSION, source_path,
              c->infer ? "\n *\n * An inference program's model (kiln build --infer): the evaluation step and the\n"
                         " * forward alone (the predict step), no training step" : "");
    if (partial) sb_puts(out, "/* Partial: kernels that --target cuda cannot write yet are left out (tests only). */\n");
    else /* the module table at the end lists them */
        sb_puts(out, "/* The kernels are launched by name, from the table at the end of this file: a program loads\n"
                     " * them as a module and launches them through the driver API (docs/cuda.md). */\n"
                     "#define KILN_CUDA_BY_NAME 1\n");
    sb_puts(out, "#include <math.h>\n#include <stdint.h>\n#include <string.h>\n\n#include \"kiln_cuda_model.h\"\n#include \"kiln_half.h\"\n"
                 "#include \"kiln_rng.h\"\n\n");
    if (attention) sb_puts(out, "#include \"kiln_cuda_attention.h\"\n\n");
    sb_puts(out, "/* The leading dimension cuBLAS needs (runtime/kiln_gemm.h's, for the host). */\n"
                 "static inline int64_t kiln_blas_ld(int64_t stride, int64_t cols) { return stride >= cols && stride > 0 ? stride : cols > 1 ? cols : 1; }\n\n");
    sb_puts(out, "/* The sum and the maximum of v over the block, returned to every thread: each warp\n"
                 " * combines its lanes with shuffles, lane 0 of each writes the warp's result to shared\n"
                 " * memory, and every thread combines the warps' results in the same order (the same bits\n"
                 " * in every thread). blockDim.x is a multiple of 32; every thread of the block calls it. */\n"
                 "template <typename T> static __device__ T kiln_block_sum(T v)\n{\n"
                 "    KILN_SHARED(T, warp_sums, [32]);\n"
                 "    for (int o = 16; o > 0; o /= 2) v += KILN_SHFL_XOR(v, o);\n"
                 "    __syncthreads(); /* the last call's readers are done with warp_sums */\n"
                 "    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;\n"
                 "    __syncthreads();\n"
                 "    T s = warp_sums[0];\n"
                 "    for (int w = 1; w < (int)blockDim.x / 32; w++) s += warp_sums[w];\n"
                 "    return s;\n}\n\n"
                 "template <typename T> static __device__ T kiln_block_max(T v)\n{\n"
                 "    KILN_SHARED(T, warp_maxes, [32]);\n"
                 "    for (int o = 16; o > 0; o /= 2) {\n"
                 "        const T u = KILN_SHFL_XOR(v, o);\n"
                 "        v = u > v ? u : v;\n"
                 "    }\n"
                 "    __syncthreads();\n"
                 "    if (threadIdx.x % 32 == 0) warp_maxes[threadIdx.x / 32] = v;\n"
                 "    __syncthreads();\n"
                 "    T m = warp_maxes[0];\n"
                 "    for (int w = 1; w < (int)blockDim.x / 32; w++) m = warp_maxes[w] > m ? warp_maxes[w] : m;\n"
                 "    return m;\n}\n\n"
                 "/* A total's parts, one per block of the kernel that computed it (each block summed a\n"
                 " * contiguous run of rows in order), added in block order by one thread: the same bits\n"
                 " * whatever the order the blocks ran in. */\n"
                 "template <typename T> __global__ void __launch_bounds__(32) kiln_sum_parts(const T *parts, int n, T *total)\n{\n"
                 "    if (threadIdx.x != 0) return;\n"
                 "    T s = 0;\n"
                 "    for (int b = 0; b < n; b++) s += parts[b];\n"
                 "    total[0] = s;\n}\n\n"
                 "/* Lane k of four elements loaded or stored at once (the vectorised elementwise\n"
                 " * kernels): selects, no memory. */\n"
                 "static __device__ inline float kiln_lane(float4 v, int k) { return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w; }\n"
                 "static __device__ inline void kiln_set_lane(float4 &v, int k, float x)\n{\n"
                 "    v.x = k == 0 ? x : v.x;\n    v.y = k == 1 ? x : v.y;\n    v.z = k == 2 ? x : v.z;\n    v.w = k == 3 ? x : v.w;\n}\n\n"
                 "template <typename T> static __device__ T kiln_block_min(T v)\n{\n"
                 "    KILN_SHARED(T, warp_mins, [32]);\n"
                 "    for (int o = 16; o > 0; o /= 2) {\n"
                 "        const T u = KILN_SHFL_XOR(v, o);\n"
                 "        v = u < v ? u : v;\n"
                 "    }\n"
                 "    __syncthreads();\n"
                 "    if (threadIdx.x % 32 == 0) warp_mins[threadIdx.x / 32] = v;\n"
                 "    __syncthreads();\n"
                 "    T m = warp_mins[0];\n"
                 "    for (int w = 1; w < (int)blockDim.x / 32; w++) m = warp_mins[w] < m ? warp_mins[w] : m;\n"
                 "    return m;\n}\n\n");
    return 0;
}

/* The end of a whole model.cu: its kernels by name (every __global__ function, a
 * template's for each instance the host launches), the module a program loads them from
 * (kiln_cuda.h's KILN_CUDA_MODULE). */
static void emit_module_table(StrBuf *out)
{
    CudaDeviceSource s;
    StrBuf err;
    sb_init(&err);
    const int rc = cuda_device_source(out->data ? out->data : "", out->len, "model.cu", &s, &err);
    KILN_ASSERT_MSG(rc == 0, "codegen's own model.cu does not cut into device code: %s", err.data ? err.data : "");
    sb_free(&err);
    sb_puts(out, "\n/* The kernels by the names a program finds them under in its module: NVRTC's CUBIN on a\n"
                 " * GPU, the table of the kernels compiled into a cuda-emu program. */\n"
                 "#define KILN_MODEL_KERNELS(X) \\\n");
    for (int i = 0; i < s.nkernel_names; i++) sb_printf(out, "    X(%s) \\\n", s.kernel_names[i]);
    for (int i = 0; i < s.nnames; i++) sb_printf(out, "    X(%s) \\\n", s.names[i]);
    sb_puts(out, "    /* end */\nKILN_CUDA_MODULE(KILN_MODEL_KERNELS);\n");
    cuda_device_source_free(&s);
}

/* Has any of the graphs fused attention kernels (kiln_cuda_attention.h)? */
static bool has_attention(const Graph *const *gs, int n)
{
    for (int i = 0; i < n; i++)
        for (NodeId id = 0; gs[i] && id < gs[i]->nnodes; id++)
            if (cg_is_attention((Op)gs[i]->nodes[id].op)) return true;
    return false;
}

int codegen_cuda(const CodegenInput *in, StrBuf *out, StrBuf *err)
{
    const Graph *train = in->train.graph, *decode = in->decode.graph;
    const bool partial = in->partial;
    Cg c;
    const Graph *graphs[] = {train, in->eval.graph, decode};
    if (begin_file(&c, train, train, in->source_path, partial, false, has_attention(graphs, 3), out, err)) return -1;
    c.bucket_bytes = in->bucket_bytes;
    int64_t train_arena = 0, eval_arena = 0;
    int rc = emit_graph(&c, &in->train, train, "train", "training", partial, &train_arena);
    if (!rc) rc = emit_graph(&c, &in->eval, train, "eval", "evaluation", partial, &eval_arena);
    if (!rc && decode && !partial) { /* the samples printed at each evaluation */
        c.decoding = c.has_decode = true;
        rc = emit_graph(&c, &in->decode, train, "decode", "decode", false, &c.decode_arena);
        c.decoding = false;
    }
    if (!rc && !partial) {
        /* the model's tables, as the C target writes them: the same checkpoints */
        CgModelCounts counts;
        cg_emit_model_tables(&c, train, in->recipe, &counts);
        if (decode) cg_emit_decode_tables(&c, train, decode, NULL);
        c.model_hash = in->model_hash;
        cg_emit_model_def(&c, train, &counts, train_arena, eval_arena);
    }
    cg_free_lines(&c);
    free(c.buckets);
    if (!rc) { /* each kernel declares what it reads; identical kernels are one */
        cg_prune_unused(out, 0, true);
        cg_share_cuda_kernels(out, &c.names);
        cg_names_apply(&c.names, out);
        if (!partial) emit_module_table(out);
    }
    cg_names_free(&c.names);
    return rc;
}

/* As codegen_c_infer, in CUDA: the evaluation step, the predict step and a language
 * model's decode step, each kernel written and launched as in a training program's
 * model.cu, with the inference tables; the device (device.cu) is the training program's. */
int codegen_cuda_infer(const CodegenInput *in, StrBuf *out, StrBuf *err)
{
    const Graph *train = in->train.graph, *eval = in->eval.graph, *predict = in->predict.graph, *decode = in->decode.graph;
    Cg c;
    const Graph *graphs[] = {eval, predict, decode};
    if (begin_file(&c, eval, train, in->source_path, false, true, has_attention(graphs, 3), out, err)) return -1;
    int64_t eval_arena = 0;
    int rc = emit_graph(&c, &in->eval, train, "eval", "evaluation", false, &eval_arena);
    if (!rc) rc = emit_graph(&c, &in->predict, train, "predict", "predict", false, &c.predict_arena);
    if (!rc && decode) { /* --generate: the caches stay in device memory (host.c) */
        c.decoding = c.has_decode = true;
        rc = emit_graph(&c, &in->decode, train, "decode", "decode", false, &c.decode_arena);
        c.decoding = false;
    }
    if (!rc) {
        CgModelCounts counts;
        cg_emit_model_tables(&c, train, in->recipe, &counts);
        cg_emit_infer_tables(&c, train, predict);
        cg_emit_decode_tables(&c, train, decode, in->decode_why);
        c.model_hash = in->model_hash;
        cg_emit_model_def(&c, train, &counts, 0, eval_arena);
    }
    cg_free_lines(&c);
    if (!rc) {
        cg_prune_unused(out, 0, true);
        cg_share_cuda_kernels(out, &c.names);
        cg_names_apply(&c.names, out);
        emit_module_table(out);
    }
    cg_names_free(&c.names);
    return rc;
}
