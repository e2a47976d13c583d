/* kernel.h — the kernel-body generator that the targets share (kernel.c).
 *
 * What a fused kernel of passes/fusion.c computes, independent of how a target iterates:
 * which stored values it loads and which it writes, each member's scalar expression at one
 * element (t<id>) or one row (w<id>), the operands' index arithmetic (broadcasts, iotas),
 * which members a pass over a row needs, and the reduction structure (stages: each row
 * reduction needs one pass over the row after the reductions it depends on). A target
 * prints these statements inside its own iteration: the C target (c_loops.c) in loop
 * nests with OpenMP, the CUDA target (cuda.c) in grid-stride loops. The statements use the
 * syntax C and CUDA C++ share; where the two differ (math functions, random numbers),
 * Cg.target picks the spelling. */
#ifndef KILN_CODEGEN_KERNEL_H
#define KILN_CODEGEN_KERNEL_H

#include "../passes/passes.h"
#include "codegen.h"

typedef enum { CG_TARGET_C, CG_TARGET_CUDA } CgTarget;

/* What a kernel computes for its module (names.c): its forward pass, its backward pass, or
 * a checkpointed forward computed again for the backward pass. */
typedef enum { CG_ROLE_FORWARD, CG_ROLE_BACKWARD, CG_ROLE_RECOMPUTE } CgRole;

/* One kernel's call of a function under its provisional name (names.c). */
typedef struct {
    char *function, *launcher; /* CUDA: the kernel's launcher; NULL in C */
    char *prefix;              /* its graph's: "train", "eval", ... */
    char *scope, *type;        /* its module's path and type ("" outside any module) */
    char *word;                /* what it computes: its value's variable, else its operation */
    char *op;                  /* its operation ("matmul" for a product) */
    const char *suffix;        /* what of the kernel the function is: "", "_epilogue" */
    CgRole role;
} CgNameUse;

/* The record of a file's kernel functions, named when the file is done. */
typedef struct {
    CgNameUse *use;
    int32_t n, cap;
    char **merge_from, **merge_to; /* CUDA: kernels found to have the same code as another */
    int32_t nmerge, capmerge;
} CgNames;

/* The generator's state for one output file. The fields after `source` serve the C
 * target's file layout (function sharing, profile tables, the file's halves). */
typedef struct {
    const Graph *g;
    StrBuf *o;
    StrBuf *err;
    const char *prefix; /* "train" or "eval": kernel names */
    CgTarget target;
    FusionPlan fp;
    MemPlan mp;
    int64_t *param_off, *buffer_off; /* per node: offsets in the caller's slabs */
    int *input_index;
    StrMap param_named; /* the graph's parameters by name (cg_layout_for) */
    /* Per-node scratch arrays that each kernel's generator borrows (CgKernel.avail, needed,
     * kept, staged) and hands back all zero: allocated once per graph, since a fresh
     * nnodes-sized array per kernel made code generation quadratic in the model's size.
     * Freed by cg_layout_free. */
    struct {
        size_t n;  /* elements of each array: the graph's nodes + 1 */
        bool lent; /* to the kernel being generated (one at a time) */
        int32_t *avail;
        uint8_t *needed, *kept, *staged, *first, *later, *hoisted;
    } scratch;
    char **lines; /* source lines, for comments */
    int nlines;
    const char *source;
    int ngemms;
    /* Fused kernels with the same code (up to the names of their values) share one
     * function, across layers and between the train and eval graphs: */
    StrMap shared;        /* canonical code -> index in shared_code */
    char **shared_code, **shared_name;
    int nshared, capshared;
    /* the canonical code of a kernel's text before pruning -> index in shared_code: a
     * kernel equal to an earlier one before pruning is equal after, so it skips pruning */
    StrMap shared_raw;
    char **shared_raw_code;
    int nshared_raw, capshared_raw;
    char **fused_name;    /* per kernel of the current graph: the function it calls */
    /* Where each kernel of the training graph starts in the output, and where its step
     * function starts: the points at which the file may be cut in two halves. */
    size_t *kernel_at, step_at, kernel_bytes;
    int nkernel_at, capkernel_at;
    int nkernels[2]; /* of the training and evaluation steps: the profile tables */
    /* An inference program's file (codegen_c_infer): no training step; an evaluation step
     * and a predict step (the forward alone), and the tables only they need. */
    bool infer;
    int npredict_kernels;
    int64_t predict_arena;
    /* A language model's decode step (frontend/decode.c), emitted after the predict step:
     * whether there is one, its kernels and arena. */
    bool decoding, has_decode;
    int ndecode_kernels, ndecode_inputs, ndecode_outputs, ndecode_syms;
    int64_t decode_arena;
    char *decode_why; /* why a language model has no decode step, or NULL */
    int ncheck;      /* index checks called so far in the step being written */
    int nchecks_max; /* the most index checks of one step (the CUDA device's memory for them) */
    /* A distributed program's gradient buckets (buckets.c): their largest size in bytes
     * (0: not distributed, no buckets) and the plan of the training step. */
    int64_t bucket_bytes;
    uint64_t model_hash; /* CodegenInput.model_hash */
    struct CgBucket *buckets;
    int nbuckets, capbuckets;
    /* CUDA, per kernel of the graph being written: the kernel paired with it by a BGRADB
     * epilogue (a column-sum kernel and the weight gradient's product; cuda_gemm.c), -1 for
     * none; NULL: no pairs */
    int32_t *cuda_bgrad;
    CgNames names; /* the kernel functions' users, for their names (names.c) */
} Cg;

/* A gradient bucket: `count` floats of the gradient slab from `offset`, final after
 * kernel `ready` (nkernels: after the step's copies); the names of its first and last
 * parameters, for comments. */
typedef struct CgBucket {
    int64_t offset, count;
    int ready;
    const char *first, *last;
} CgBucket;

static inline const Node *N(const Cg *c, NodeId id) { return &c->g->nodes[id]; }

/* ---- scalar text, both targets ---- */

/* The C type a dtype is stored as (bf16 and f16: uint16_t bits; kiln_half.h). */
const char *cg_ctype(DType t);
/* The dtype a value is computed in (f32 for half precision), and its C type. */
DType cg_compute_dtype(DType t);
const char *cg_value_ctype(DType t);
/* Appends the computed value of a stored element (a C lvalue of dtype t), and the stored
 * form of a computed value (rounded already: the conversion is exact). */
void cg_load(StrBuf *b, DType t, const char *stored);
void cg_store(StrBuf *b, DType t, const char *value);
/* cg_store of the local that fmt ("t%d", "w%d") names for node id. */
void cg_store_local(StrBuf *b, const Graph *g, NodeId id, const char *fmt);
/* `y<id>[at] = <local>;` at indent, the local (fmt: "t%d") converted to the stored dtype. */
void cg_store_line(StrBuf *o, const char *indent, const Graph *g, NodeId id, const char *at, const char *fmt);
/* A dim as an expression over the symbols' names (declared in each kernel). */
void cg_dim(StrBuf *b, const Graph *g, Dim d);
void cg_literal(StrBuf *b, double v, DType t);
/* Whether node id can never be NaN, as far as its operands show (call with depth 0). */
bool cg_never_nan(const Graph *g, NodeId id, int depth);
/* The expression of elementwise node id applied to operand expressions a, b, w. */
void cg_elementwise_expr(Cg *c, NodeId id, const char *a, const char *b, const char *w);
/* s as a C string literal, quoted and escaped. */
void cg_c_string(StrBuf *b, const char *s);
/* Reads the model file's lines into c->lines, for comments (none when it cannot be read). */
void cg_read_lines(Cg *c, const char *path);
void cg_free_lines(Cg *c);
/* " * FILE:LINE: source text" of a node, for kernel comments (nothing without a line). */
void cg_source_line(Cg *c, NodeId id);

/* ---- a fused loop or GEMM kernel ---- */

/* How the C target iterates (the CUDA target maps the same structure to threads):
 *   FLAT    one loop over all elements (no member needs a coordinate);
 *   ROWS    a loop over rows and one over the elements of a row (only the last coordinate
 *           is needed, as j);
 *   COLUMNS reductions over leading axes (bias gradients) whose results nothing else in
 *           the kernel uses: memory order, accumulating into the outputs column by column;
 *   NESTED  one loop per axis, with every coordinate c<axis>;
 *   GEMM    a matrix product and its epilogue. */
enum { CG_LOOP_FLAT, CG_LOOP_ROWS, CG_LOOP_COLUMNS, CG_LOOP_NESTED, CG_LOOP_GEMM };

typedef struct {
    Cg *c;
    const Graph *g;
    const FusionPlan *f;
    const Kernel *K;
    int32_t k;
    int rank;
    uint64_t inner;   /* axes of the inner loops */
    uint64_t coords;  /* axes whose coordinates members use */
    int mode;         /* CG_LOOP_* */
    int32_t *avail;   /* per node: the stage after which a member can be computed */
    uint8_t *needed;  /* per node: scratch */
    NodeId *reads;    /* roots loaded from memory */
    int nreads, capreads;
    NodeId *stores;   /* members written to memory */
    int nstores;
    int nstages;
    /* The pass over a row being written (1 ... nstages + 1; 0 outside rows): a stored
     * member that an earlier pass wrote is read back, not computed again. */
    int pass;
    bool random;
    /* C target, nested mode with tiny inner axes (2x2 pooling windows): the axis whose
     * iterations are SIMD lanes, each running the whole row body; -1 when the innermost
     * loop is (set by c_loops.c). */
    int lane;
    /* C target: where the body of the open block of lanes starts in the output (c_loops.c's
     * open_lane_block), to write it again for the row's last block. */
    size_t lane_body;
    /* Values of other kernels that this one computes again instead of loading (fusion.c's
     * recomputed members and the unstored values they need), in node order. */
    NodeId *remat;
    int nremat, capremat;
    NodeId *work; /* cg_need()'s work list */
    int capwork;
    /* CUDA, a vectorised elementwise kernel's four lanes (cuda.c): when set, a float32 value
     * loaded at element i (p<id>[i], a product's y<id>[i]) is lane k of the float4 q<id>,
     * kiln_lane(q<id>, k), loaded four at a time, and lane_loaded[id] is set; other loads
     * stay p<id>[...]. */
    uint8_t *lane_loaded;
    /* C target, rows mode (c_loops.c): full members that an earlier pass over the row
     * computed and kept in a buffer of the row's, keep<id>[kept_index], which later passes
     * read instead of computing them again (a softmax's exponentials, whose stored copy is
     * rounded to half precision); NULL when none. */
    uint8_t *kept;
    char kept_index[16];
    /* C target, rows mode: half-precision copies (narrowing casts no member reads) stored by
     * a pass that sums in lanes: the pass writes the cast's fp32 operand to a row buffer,
     * staged<id>[kept_index], and the final pass over the row stores it; NULL when none. */
    uint8_t *staged;
    /* C target, rows and nested modes (c_loops.c): a broadcast operand whose coordinates are
     * all outer ones (a row's statistic, a per-row scale) is loaded once at the row's start,
     * `const T b<id> = ...;` appended to *hoisted, and read as b<id> in the row's loops
     * (hoisted_done[id] set). In the loops GCC could not hoist such a load past the row's
     * stores (OpenMP's outlined function loses restrict), and partial-redundancy elimination
     * then kept it in the loop's latch, which kept the loop from vectorising. NULL otherwise. */
    StrBuf *hoisted;
    uint8_t *hoisted_done;
    NodeId *hoisted_ids; /* the nodes hoisted_done marks, to clear them after the row */
    int nhoisted, caphoisted;
    /* C target (c_loops.c): a stored half-precision copy of a float32 value is converted
     * from that value (cg_store_member), so the copy's own rounded float is computed only
     * where a member reads it (cg_need_store). */
    bool copies_from_operand;
} CgKernel;

#define CG_MEMBER(L, i) ((L)->f->members[(L)->K->first + (i)])

static inline bool cg_in_kernel(const CgKernel *L, NodeId r)
{
    return L->f->role[r] == ROLE_KERNEL && L->f->kernel_of[r] == L->k;
}
/* Is r another kernel's value that this kernel computes itself? */
static inline bool cg_recomputed_here(const CgKernel *L, NodeId r)
{
    return L->f->role[r] == ROLE_KERNEL && L->f->kernel_of[r] != L->k && L->f->recomputed[r];
}
static inline bool cg_dim_is_one(Dim d) { return d.nsym == 0 && d.k == 1; }
static inline int cg_popcount64(uint64_t x)
{
    int n = 0;
    for (; x; x &= x - 1) n++;
    return n;
}

/* Are the kernel's reduced axes the trailing ones? Then a row is W contiguous elements:
 * element j of row `row` is i = row * W + j. */
bool cg_axes_trailing(const CgKernel *L);
/* Are the reduced axes the leading ones, the kernel's only row members stored sums or
 * maxima, in one stage (CG_LOOP_COLUMNS when no member needs a coordinate)? */
bool cg_columns_shape(const CgKernel *L);
/* `const int64_t c<a> = var / (S<b> * ...) % S<a>;` for each axis a of `want`, where var is
 * a row-major flat index over the axes of `span` (dims S<a>, declared by the target): the
 * product runs over span's later axes; span's first axis needs no modulo. A CUDA thread
 * derives its element's coordinates so: from i (span: every axis), or from the row index
 * (the outer axes) and the position j in the row (the reduced axes). */
void cg_coordinates(const CgKernel *L, uint64_t want, uint64_t span, const char *var, const char *indent);
/* Analyses kernel k of c->fp: loads, stores, coordinates used, stages, the loop mode. */
void cg_kernel_setup(CgKernel *L, Cg *c, int32_t k);
void cg_kernel_teardown(CgKernel *L);
/* The all-zero per-node array *slot of the pool (Cg.scratch), allocated on first use; the
 * borrower sets entries of kernel L's members, reads, stores and recomputed values only
 * (cg_kernel_teardown clears those), or clears its own. */
uint8_t *cg_scratch(CgKernel *L, uint8_t **slot);
/* Frees the pool. */
void cg_scratch_free(Cg *c);
/* The value of operand x of member `reader` in a full (row == false) or row context: a
 * local (t<id>, w<id>), a literal, a coordinate, a random number or a load p<id>[...],
 * indexed by i (full), row, or coordinates c<axis>. */
void cg_operand(CgKernel *L, NodeId x, NodeId reader, bool row, StrBuf *b);
/* `const T t<id> = ...;` (w<id> for a row value) for a member, its operands in scope. */
void cg_member_value(CgKernel *L, NodeId id, bool row, const char *indent);
/* `y<id>[i] = ...;` for a full member: its value t<id>, or for a half-precision copy (a cast
 * of a float32 value) that value converted once (C target). */
void cg_store_member(CgKernel *L, const char *indent, NodeId id);
/* cg_need for what storing member id reads: the member, or the operand it is a
 * half-precision copy of (CgKernel.copies_from_operand). */
void cg_need_store(CgKernel *L, NodeId id);
/* Marks the full members needed to compute full member id; cg_clear_needed forgets them. */
void cg_need(CgKernel *L, NodeId id);
void cg_clear_needed(CgKernel *L);
/* The body of an element iteration: the needed full members, in order. */
void cg_emit_needed(CgKernel *L, const char *indent);
/* A kernel whose reductions run over leading axes (CG_LOOP_COLUMNS), at element i of
 * column `row`: cg_need_columns marks what an element needs; cg_emit_column_element
 * computes it, stores the stored full members and adds each row member's operand into
 * its accumulator, named acc, the member's id and acc_suffix ("a%d" in a CUDA thread's
 * registers, "y%d[row]" in the C target's output). */
void cg_need_columns(CgKernel *L);
void cg_emit_column_element(CgKernel *L, const char *indent, const char *acc, const char *acc_suffix);
/* The reduction structure of a row (CG_LOOP_ROWS, CG_LOOP_NESTED): passes 1 ... nstages
 * over the row's elements each accumulate the row reductions of their stage, then the row
 * values that depend on them are computed; pass nstages + 1 writes the stored full values
 * that need every stage. A target prints each pass as its own loop (C) or block-wide
 * reduction (CUDA); which members each pass computes is decided here. */
/* Is member id a row reduction (sum or max) accumulated in this pass? */
bool cg_reduced_in_pass(const CgKernel *L, NodeId id, int pass);
/* Is member id a stored full value written in this pass? */
bool cg_stored_in_pass(const CgKernel *L, NodeId id, int pass);
/* Marks (cg_need) the full members this pass computes; false when it has nothing to do. */
bool cg_need_pass(CgKernel *L, int pass);
/* What fused kernel k is, in a few words: "matrix product over float[T*B, 384]". */
void cg_kernel_title(Cg *c, int32_t k, StrBuf *o);
/* The comment above a kernel: its title, members, values computed again, model line. */
void cg_kernel_comment(CgKernel *L);

/* ---- matrix products (GEMM kernels) ---- */

/* A matrix-product operand as BLAS reads it: its base pointer, transposed or not, and
 * the strides of its axes (a strided view of the base, or the base's own rows). */
typedef struct {
    FusionLayout lay;
    bool trans;
} CgOperand;
/* The layout of operand x of the kernel's matrix product (aborts when fusion made one
 * that BLAS cannot read: a bug there). */
void cg_gemm_operand(CgKernel *L, NodeId x, CgOperand *op);
/* The offset of an operand's element (c_0, ..., c_{r-3}, row, col): its offset terms plus
 * the batch coordinates (c<axis>), `row` and `col` (expressions) times their strides. */
void cg_gemm_operand_offset(CgKernel *L, const CgOperand *op, int nbatch, const char *row, const char *col, StrBuf *b);
/* A comment line naming the operand and how it is read: "A = %11 float[B, 784]: the memory of %10". */
void cg_gemm_operand_comment(CgKernel *L, const char *name, NodeId x, const CgOperand *op);
/* `const int ld<name> = (int)kiln_blas_ld(stride, cols);`: the stride between the rows of
 * the matrix as stored (kiln_blas_ld: runtime/kiln_gemm.h, and model.cu's own). */
void cg_gemm_operand_ld(CgKernel *L, const char *name, NodeId x, const CgOperand *op);

/* The product of a kernel whose product is written permuted (K->written): its layout in
 * the written node's memory (C: base, strides, and trans when its rows are the memory's
 * columns), a comment line and `const int ldc = ...;` (M and N declared). */
void cg_gemm_output(CgKernel *L, CgOperand *C);

/* ---- single-node kernels (KERNEL_SINGLE of the fusion plan) ----
 * One node each; its index arithmetic is written here once for both targets, over names
 * the target declares with the functions below: the output's dims Y<k> and strides Ys<k>,
 * the input's X<k> and Xs<k>, the output element's coordinates c<k> and flat index i,
 * operands x0, x1, ... and the output y. The C target loops over the coordinates; the
 * CUDA target derives them from its thread's flat index. */

/* The fused attention kernels' arguments (c_attention.c), for both targets: is op one of
 * the attention ops; `const kiln_attention a = {...};` (C) or `kiln_attention a = {};` and
 * its fields assigned (cxx) for attention op id (runtime/kiln_attention_desc.h), the mask
 * read from mask_var; the pointer to operand j's first element, `name` plus its offset;
 * the node whose memory operand j reads; the member of kernel k that is op (attention_grad:
 * of operand `which`), or IR_NONE; the name of operand j (q, k, v, mask, out, lse, dout). */
bool cg_is_attention(Op op);
void cg_attention_struct(Cg *c, NodeId id, const char *mask_var, bool cxx);
void cg_attention_operand_pointer(Cg *c, NodeId id, int j, const char *name);
NodeId cg_attention_operand_base(const Cg *c, NodeId id, int j);
NodeId cg_attention_member(const Cg *c, int32_t k, Op op, int which);
const char *cg_attention_operand_name(bool has_mask, uint32_t j);

/* The comment above a single-node kernel: its op, shapes and model line. */
void cg_single_comment(Cg *c, NodeId id);
/* The number of elements of s, as an expression. */
void cg_numel(Cg *c, const Shape *s);
/* `const int64_t P0 = ..., P1 = ...;` naming the dims of a shape. */
void cg_declare_dims(Cg *c, const char *prefix, const Shape *s);
/* Row-major strides of a shape named by dims prefix: `const int64_t Xs0 = X1 * X2, ...`. */
void cg_declare_strides(Cg *c, const char *dims, int rank);
/* Is op a copy each of whose output elements is one statement at its coordinates (iota,
 * expand, permute, slice, pad)? */
bool cg_single_is_copy(Op op);
/* The copy's dims and strides (Y, X). */
void cg_copy_declare(Cg *c, NodeId id);
/* `y[i] = ...;` of copy id at coordinates c<k>, indented by in (pad: a block). */
void cg_copy_element(Cg *c, NodeId id, int in);
/* concat: input k's element i (coordinates c<d> in its own shape) stored at its place in
 * y, its offset along the axis `off`: `y[c0 * Ys0 + (off + c1) * Ys1] = x1[i];`. */
void cg_concat_element(Cg *c, NodeId id, uint32_t k, int in);
/* check_index: the condition that index value v (an expression) is out of range. */
void cg_check_index_cond(Cg *c, NodeId id, const char *v, char *cond, size_t size);
/* argmax: the input's dims X<k>, and `outer` and `inner` (the axes before and after). */
void cg_argmax_declare(Cg *c, NodeId id);
/* argmax: the search along the axis for outer index a and inner index b: y[a * inner + b]. */
void cg_argmax_row(Cg *c, NodeId id, int in);
/* gather: `rows` (indices) and `width` (elements per row of the table). */
void cg_gather_declare(Cg *c, NodeId id);
/* gather: where index r's row of the table starts, `x0 + (int64_t)x1[r] * width`. */
void cg_gather_source(Cg *c);
/* scatter_add: `n` (outputs), `rows` (indices) and `width` (elements per row). */
void cg_scatter_add_declare(Cg *c, NodeId id);
/* scatter_add: source row r's element j added into its row of y. */
void cg_scatter_add_element(Cg *c, int in);
/* unfold/fold (im2col): the image's Nb, C, H, W, the window KH, KW, strides SH, SW,
 * dilations DH, DW, and the output positions OH, OW, L = OH * OW. */
void cg_im2col_declare(Cg *c, NodeId id);
/* The column matrix's row of (channel ch, window position ki, kj). */
void cg_im2col_row(Cg *c, int in);
/* The image element `pix` (with pix) and the column matrix element `col` of image b,
 * channel ch, window position ki, kj, output position oh, ow (row declared). */
void cg_im2col_index(Cg *c, bool pix, int in);

/* ---- the host side of a model, for both targets (host.c) ---- */

typedef struct {
    int nparams, ninputs, nmetrics, noutputs;
    int64_t nparam_floats, buffer_bytes;
} CgModelCounts;

/* Per node of g: offsets of parameters and buffers in the caller's slabs, index of inputs,
 * in the reference graph's order (the training graph's, for both steps). */
void cg_layout_for(Cg *c, const Graph *g, const Graph *ref);
void cg_layout_free(Cg *c);
/* The step function of the planned graph c->g (c->fp, c->mp, the layout), calling kernel k
 * with call(c, k). */
void cg_emit_step(Cg *c, bool train, void (*call)(Cg *c, int32_t k));
/* The step's kernel table (name: the function kernel k calls) and matrix-product figures. */
void cg_emit_kernel_table(Cg *c, void (*name)(Cg *c, int32_t k, StrBuf *b));
void cg_emit_gemm_info(Cg *c, bool table);
/* The tables of kiln_model (parameters, inputs, symbols, metric and output names, recipe),
 * then, after both steps, kiln_model_def. */
void cg_emit_model_tables(Cg *c, const Graph *g, const struct kiln_recipe *recipe, CgModelCounts *n);
void cg_emit_model_def(Cg *c, const Graph *train, const CgModelCounts *n, int64_t train_arena, int64_t eval_arena);
/* buckets.c — with c->bucket_bytes, the training step's gradient buckets (c->buckets) from
 * its plan; the hooks to call after kernel k (k = nkernels: after the copies); their table
 * train_buckets, after the step. */
void cg_plan_buckets(Cg *c);
void cg_emit_bucket_hooks(Cg *c, int32_t k);
void cg_emit_bucket_table(Cg *c);
/* An inference program's tables (c->infer), before kiln_model_def: which inputs the
 * forward reads, and each forward output's dtype and shape; train is the reference graph
 * (inputs and outputs in its order), predict the forward-only graph. */
void cg_emit_infer_tables(Cg *c, const Graph *train, const Graph *predict);
/* The decode step's tables: its inputs beyond the model's (the past position, the caches)
 * and its outputs (the forward's, then the caches' new rows); the reason the model has no
 * decode step when `why` is not empty. */
void cg_emit_decode_tables(Cg *c, const Graph *train, const Graph *decode, const char *why);

/* prune.c: drops the integer declarations and `(void)x;` statements of the functions in
 * o after start that nothing reads; with cxx (CUDA), the names of unread parameters too. */
void cg_prune_unused(StrBuf *o, size_t start, bool cxx);
/* prune.c: keeps one of each set of __global__ kernels of model.cu with the same code, the
 * launches of the others calling it; returns how many went. */
int cg_share_cuda_kernels(StrBuf *o, CgNames *names);
/* c_loops.c: a kernel's code without its comments, its values' names numbered by first use. */
void cg_canonical_code(const char *src, StrBuf *out);
/* Copies n bytes of text to r with each identifier that renames maps to i replaced by names[i]. */
void cg_put_renamed(StrBuf *r, const char *text, size_t n, const StrMap *renames, char *const *names);

/* names.c: the node whose module names kernel k (of its members' modules, the one most
 * belong to; the anchor when it is in it), and the kernel's role for that module. */
NodeId cg_kernel_scope_node(const Cg *c, int32_t k);
CgRole cg_kernel_role(const Cg *c, int32_t k, uint32_t scope);
/* Kernel k of the graph being written calls function (and, in CUDA, its launcher); suffix
 * (a string literal) names a function that is a part of the kernel, e.g. "_epilogue". */
void cg_names_record(Cg *c, int32_t k, const char *function, const char *launcher, const char *suffix);
/* CUDA: the kernel function gone has the same code as kept and is replaced by it. */
void cg_names_merge(CgNames *r, const char *gone, const char *kept);
/* Renames the recorded functions in the finished file o. */
void cg_names_apply(CgNames *r, StrBuf *o);
void cg_names_free(CgNames *r);
/* host.c: appends s as part of a C identifier ("h.3.ln_2" -> "h3_ln_2"). */
void cg_ident_part(StrBuf *b, const char *s);

#endif
