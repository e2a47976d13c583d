/* cuda_single.c — the CUDA target's single-node kernels (KERNEL_SINGLE of the fusion plan:
 * index checks, argmax, gathers, scatter-adds, copies, concat, im2col and its fold): the
 * index arithmetic is kernel.c's, as for the C target; here each gets its threads and its
 * launcher. */
#include "cuda_internal.h"

#include <stdio.h>
#include <string.h>

/* ---- single-node kernels (KERNEL_SINGLE) ----
 * Their index arithmetic is kernel.c's (cg_copy_element, cg_argmax_row, ...), as for the C
 * target; here each gets its threads. Every output element is written by one thread, and
 * every sum is taken in the C target's order, so the results are the C target's bits: no
 * atomics. */

bool cuda_single_supported(Op op)
{
    return cg_single_is_copy(op) || op == OP_CONCAT || op == OP_CHECK_INDEX || op == OP_ARGMAX || op == OP_GATHER ||
           op == OP_SCATTER_ADD || op == OP_UNFOLD || op == OP_FOLD;
}

void cuda_single_name(Cg *c, int32_t k, NodeId id, StrBuf *b)
{
    sb_printf(b, "%s_k%d_%s", c->prefix, k, ir_op_info[N(c, id)->op].name);
}

/* The symbols by value (kernel) or s (host), the operands x<j>, the output y, and the
 * position of the first bad index of a check. */
static void single_parameters(Cg *c, NodeId id, StrBuf *o, bool host)
{
    const Graph *g = c->g;
    const Node *n = N(c, id);
    bool any = false;
    if (host) {
        sb_puts(o, "const int64_t *s");
        any = true;
    } else {
        for (int sy = 0; sy < g->nsyms; sy++, any = true) sb_printf(o, "%sint64_t %s", any ? ", " : "", g->syms[sy].name);
    }
    /* an output written in place of an input (memplan) shares its memory: no __restrict__ */
    const char *restrict_ = host || c->mp.inplace_of[id] != IR_NONE ? "" : "__restrict__ ";
    for (uint32_t j = 0; j < n->ninputs; j++, any = true)
        sb_printf(o, "%sconst %s *%sx%u", any ? ", " : "", cg_ctype((DType)N(c, ir_input(g, id, (int)j))->dtype), restrict_, j);
    sb_printf(o, "%s%s *%sy", any ? ", " : "", cg_ctype((DType)n->dtype), restrict_);
    if (n->op == OP_CHECK_INDEX) sb_puts(o, ", int64_t *bad");
    if (host) sb_puts(o, ", cudaStream_t stream");
}

/* Does text use the name c<k> (a coordinate)? */
static bool uses_coordinate(const char *text, int k)
{
    char name[16];
    snprintf(name, sizeof name, "c%d", k);
    size_t len = strlen(name);
    for (const char *p = strstr(text, name); p; p = strstr(p + 1, name)) {
        bool start = p == text || !(p[-1] == '_' || (p[-1] >= 'a' && p[-1] <= 'z') || (p[-1] >= 'A' && p[-1] <= 'Z') || (p[-1] >= '0' && p[-1] <= '9'));
        bool end = !(p[len] >= '0' && p[len] <= '9') && p[len] != '_';
        if (start && end) return true;
    }
    return false;
}

/* A grid-stride loop over `count` elements with index i, the coordinates the statement
 * uses (c<k> = i / <dims>s<k> % <dims><k>, a row-major shape named dims), then the
 * statement, already printed into `stmt`. */
static void grid_stride(Cg *c, const char *count, const char *dims, int rank, const char *stmt)
{
    StrBuf *o = c->o;
    sb_printf(o, "    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < %s; i += (int64_t)gridDim.x * blockDim.x) {\n",
              count);
    for (int k = 0; k < rank; k++) {
        if (!uses_coordinate(stmt, k)) continue;
        sb_printf(o, "        const int64_t c%d = i / %ss%d", k, dims, k);
        if (k) sb_printf(o, " %% %s%d", dims, k);
        sb_puts(o, ";\n");
    }
    sb_printf(o, "%s    }\n", stmt);
}

/* The statement(s) that cg_* prints, into a buffer of their own. */
typedef struct {
    StrBuf text, *saved;
} Capture;
static void capture_begin(Cg *c, Capture *cap)
{
    sb_init(&cap->text);
    cap->saved = c->o;
    c->o = &cap->text;
}
static void capture_end(Cg *c, Capture *cap) { c->o = cap->saved; }

static const char *single_launch(Op op)
{
    switch (op) {
    case OP_CHECK_INDEX:
        return "one block of 256 threads for all the indices: thread t checks indices t,\n"
               " * t + blockDim.x, ... (storing 0 in place of an index out of range, so that no kernel\n"
               " * reads out of bounds) and keeps the first bad one it saw; the block takes their minimum\n"
               " * (kiln_block_min) and thread 0 writes it to *bad, or -1: the first bad position, found\n"
               " * without atomics. The host reads *bad back after the launch (docs/cuda.md).";
    case OP_ARGMAX:
        return "one thread per output element (blocks of 256, a grid-stride loop): it walks\n"
               " * the axis in order, as the C target does.";
    case OP_GATHER:
        return "one thread per output element (blocks of 256, a grid-stride loop): element j\n"
               " * of row r is element j of the table's row x1[r].";
    case OP_SCATTER_ADD:
        return "the launch function zeroes y (cudaMemsetAsync), then one thread per column j\n"
               " * of the output (blocks of 256, a grid-stride loop) adds the source rows into it in\n"
               " * index order, as the C target does: deterministic, the C target's bits, no atomics\n"
               " * (parallel over the columns only: correct, not yet fast for long index lists).";
    case OP_FOLD:
        return "one thread per image element (blocks of 256, a grid-stride loop): it sums the\n"
               " * column elements that overlap it, window position by window position, in the C\n"
               " * target's order (no atomics).";
    case OP_UNFOLD:
        return "one thread per column-matrix element (blocks of 256, a grid-stride loop): it\n"
               " * copies the image element under it.";
    case OP_CONCAT:
        return "blocks of 256 threads; for each input in turn, a grid-stride loop over its\n"
               " * elements copies each to its place in the output.";
    default:
        return "one thread per output element (blocks of 256, a grid-stride loop), which derives\n"
               " * its coordinates from its flat index.";
    }
}

void cuda_emit_single_kernel(Cg *c, int32_t k, NodeId id)
{
    const Graph *g = c->g;
    const Node *n = N(c, id);
    const Op op = (Op)n->op;
    const int r = n->shape.rank;
    StrBuf *o = c->o;
    cg_single_comment(c, id);
    o->len -= 4; /* before the comment's close: the launch shape */
    o->data[o->len] = 0;
    sb_printf(o, "\n * Launch: %s */\n", single_launch(op));
    sb_printf(o, "__global__ void __launch_bounds__(%d) ", CUDA_MAP_BLOCK);
    cuda_single_name(c, k, id, o);
    sb_putc(o, '(');
    single_parameters(c, id, o, false);
    sb_puts(o, ")\n{\n");
    Capture cap;
    if (cg_single_is_copy(op)) {
        cg_copy_declare(c, id);
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_puts(o, ";\n");
        capture_begin(c, &cap);
        cg_copy_element(c, id, 8);
        capture_end(c, &cap);
        grid_stride(c, "n", "Y", r, cap.text.data);
        sb_free(&cap.text);
    } else if (op == OP_CONCAT) {
        const int ax = (int)ir_attrs(g, id)[0];
        cg_declare_dims(c, "Y", &n->shape);
        cg_declare_strides(c, "Y", r);
        sb_puts(o, "    int64_t off = 0; /* where the input's slot starts along the axis */\n");
        for (uint32_t j = 0; j < n->ninputs; j++) {
            const Node *xj = N(c, ir_input(g, id, (int)j));
            char pre[24], count[80];
            snprintf(pre, sizeof pre, "X%u_", j);
            snprintf(count, sizeof count, "%s%d * %ss0", pre, 0, pre);
            cg_declare_dims(c, pre, &xj->shape);
            cg_declare_strides(c, pre, r);
            capture_begin(c, &cap);
            cg_concat_element(c, id, j, 8);
            capture_end(c, &cap);
            grid_stride(c, r ? count : "1", pre, r, cap.text.data);
            sb_free(&cap.text);
            sb_printf(o, "    off += %s%d;\n", pre, ax);
        }
    } else if (op == OP_CHECK_INDEX) {
        char cond[160];
        cg_check_index_cond(c, id, "x0[i]", cond, sizeof cond);
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &n->shape);
        sb_printf(o, ";\n    int64_t first = n; /* this thread's first bad position, or n */\n"
                     "    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {\n"
                     "        const int out = %s;\n"
                     "        if (out && first == n) first = i;\n"
                     "        y[i] = out ? 0 : x0[i];\n"
                     "    }\n"
                     "    first = kiln_block_min(first);\n"
                     "    if (threadIdx.x == 0) { /* the position and the value, for the error message */\n"
                     "        bad[0] = first < n ? first : -1;\n"
                     "        bad[1] = first < n ? (int64_t)x0[first] : 0;\n"
                     "    }\n",
                  cond);
    } else if (op == OP_ARGMAX) {
        cg_argmax_declare(c, id);
        sb_puts(o, "    for (int64_t e = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; e < outer * inner; e += (int64_t)gridDim.x * blockDim.x) {\n"
                   "        const int64_t a = e / inner, b = e % inner;\n");
        cg_argmax_row(c, id, 8);
        sb_puts(o, "    }\n");
    } else if (op == OP_GATHER) {
        cg_gather_declare(c, id);
        sb_printf(o, "    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < rows * width; i += (int64_t)gridDim.x * blockDim.x) {\n"
                     "        const int64_t r = i / width, j = i %% width;\n"
                     "        const %s *row = ",
                  cg_ctype((DType)n->dtype));
        cg_gather_source(c);
        sb_puts(o, ";\n        y[i] = row[j];\n    }\n");
    } else if (op == OP_SCATTER_ADD) {
        cg_scatter_add_declare(c, id);
        sb_puts(o, "    for (int64_t j = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; j < width; j += (int64_t)gridDim.x * blockDim.x)\n"
                   "        for (int64_t r = 0; r < rows; r++)\n");
        cg_scatter_add_element(c, 12);
    } else { /* unfold, fold */
        cg_im2col_declare(c, id);
        if (op == OP_UNFOLD) {
            sb_puts(o, "    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < Nb * C * KH * KW * L; i += (int64_t)gridDim.x * blockDim.x) {\n"
                       "        const int64_t ow = i % OW, oh = i / OW % OH, kj = i / L % KW, ki = i / (L * KW) % KH;\n"
                       "        const int64_t ch = i / (L * KW * KH) % C, b = i / (L * KW * KH * C);\n");
            cg_im2col_row(c, 8);
            cg_im2col_index(c, true, 8);
            sb_puts(o, "        y[col] = x0[pix]; /* col == i */\n    }\n");
        } else {
            sb_printf(o, "    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < Nb * C * H * W; i += (int64_t)gridDim.x * blockDim.x) {\n"
                         "        const int64_t w = i %% W, h = i / W %% H, ch = i / (H * W) %% C, b = i / (H * W * C);\n"
                         "        %s sum = 0;\n"
                         "        for (int64_t ki = 0; ki < KH; ki++)\n"
                         "            for (int64_t kj = 0; kj < KW; kj++) {\n"
                         "                /* the output position whose window puts (ki, kj) on (h, w), if any */\n"
                         "                const int64_t th = h - ki * DH, tw = w - kj * DW;\n"
                         "                if (th < 0 || tw < 0 || th %% SH || tw %% SW || th / SH >= OH || tw / SW >= OW) continue;\n"
                         "                const int64_t oh = th / SH, ow = tw / SW;\n",
                      cg_ctype((DType)n->dtype));
            cg_im2col_row(c, 16);
            cg_im2col_index(c, false, 16);
            sb_puts(o, "                sum += x0[col];\n            }\n        y[i] = sum;\n    }\n");
        }
    }
    sb_puts(o, "}\n\n");
}

/* The host function that launches single-node kernel k. */
void cuda_emit_single_launcher(Cg *c, int32_t k, NodeId id)
{
    const Graph *g = c->g;
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_printf(o, "/* Launches kernel %d on stream: s holds the symbols' values (host memory), the\n"
                 " * pointers are device memory%s. */\nvoid ",
              k, n->op == OP_CHECK_INDEX ? " (bad: two int64_t, the first bad position or -1, and its value)" : "");
    cuda_single_name(c, k, id, o);
    sb_puts(o, "_launch(");
    single_parameters(c, id, o, true);
    sb_puts(o, ")\n{\n");
    for (int sy = 0; sy < g->nsyms; sy++) sb_printf(o, "    const int64_t %s = s[%d];\n", g->syms[sy].name, sy);
    if (n->op == OP_CHECK_INDEX) {
        sb_puts(o, "    const int grid = 1; /* even for no indices: *bad = -1 */\n");
    } else {
        if (n->op == OP_SCATTER_ADD) { /* a thread per column */
            cg_scatter_add_declare(c, id);
            sb_puts(o, "    if (n == 0) return;\n"
                       "    KILN_CUDA_CHECK(cudaMemsetAsync(y, 0, (size_t)n * sizeof *y, stream)); /* all threads, then the sums */\n"
                       "    const int64_t count = width;\n");
        } else {
            sb_puts(o, "    const int64_t count = ");
            cg_numel(c, &n->shape);
            sb_puts(o, ";\n");
        }
        sb_printf(o, "    const int64_t blocks = (count + %d - 1) / %d;\n    if (blocks == 0) return;\n", CUDA_MAP_BLOCK, CUDA_MAP_BLOCK);
    }
    if (n->op != OP_CHECK_INDEX) sb_printf(o, "    const int grid = blocks < %d ? (int)blocks : %d;\n", CUDA_MAP_GRID_MAX, CUDA_MAP_GRID_MAX);
    StrBuf site;
    sb_init(&site);
    cuda_model_line(c, id, &site);
    sb_puts(o, "    KILN_LAUNCH_AT(");
    cg_c_string(o, site.data);
    sb_free(&site);
    sb_puts(o, ", ");
    cuda_single_name(c, k, id, o);
    sb_printf(o, ", grid, %d, 0, stream", CUDA_MAP_BLOCK);
    for (int sy = 0; sy < g->nsyms; sy++) sb_printf(o, ", %s", g->syms[sy].name);
    for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, ", x%u", j);
    sb_puts(o, n->op == OP_CHECK_INDEX ? ", y, bad);\n}\n\n" : ", y);\n}\n\n");
}
