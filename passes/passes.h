/* passes.h — graph-to-graph passes and the pipeline that runs them in order.
 *
 * Each pass is one file with one entry point that takes the Graph and leaves it valid
 * (ir_verify() holds after every pass; the pipeline checks it). The order is written once,
 * in pipeline.c. */
#ifndef KILN_PASSES_H
#define KILN_PASSES_H

#include "../ir/ir.h"

/* fuse_attention.c — the attention pass: every attention attention_find recognises (the
 * built-ins and attention written out of primitives) replaced by the fused `attention` op
 * and its `attention_lse` (ops.h), whose backward recomputes the probabilities instead of
 * storing them. Runs first, on the lowered graph. *nfused: how many were replaced. Renumbers
 * nodes; the unfused ones are left for simplify to drop. 0, or -1 with a message. */
int pass_fuse_attention(Graph *g, int64_t max_head, int *nfused, int *nlarge, StrBuf *err);

/* autodiff.c — reverse-mode differentiation of the scalar loss output with respect to
 * every trainable parameter (and, with wrt_inputs, every float input). Appends the
 * backward nodes to the graph and one OUT_GRAD output per parameter (named like it).
 * Returns 0, or -1 with a message (file:line:col: error: ...) in *err. */
typedef struct {
    bool wrt_inputs;
    /* Seed the backward pass with the step's loss scale (a loss_scale node) instead of 1:
     * fp16 training's loss scaling, every gradient multiplied by it (docs/precision.md). */
    bool scale_loss;
} AutodiffOptions;
int pass_autodiff(Graph *g, const AutodiffOptions *opt, StrBuf *err);

/* simplify.c — constant folding, algebraic identities, common-subexpression elimination
 * and dead-node elimination. Renumbers nodes; outputs keep their meaning. */
void pass_simplify(Graph *g);

/* precision.c — mixed precision as PyTorch's autocast: matrix products read half-precision
 * copies of their non-parameter operands (fp32 accumulation), forward activations that the
 * backward pass keeps are stored in half precision, everything else stays f32; every
 * conversion an explicit cast node (the file's header lists the rules). half = DT_F32
 * leaves the graph unchanged. Renumbers nodes; runs after simplify, before remat. */
typedef struct {
    DType half; /* DT_F32 (no change), DT_BF16 or DT_F16 */
    /* Loss scaling (fp16's loss_scale = dynamic or a number): the pipeline's autodiff then
     * seeds the backward pass with the program's loss scale (AutodiffOptions.scale_loss). */
    bool scale_loss;
    /* weight_rounding = stochastic (bf16 only): the training step's half-precision copies of
     * the parameters are rounded stochastically from the fp32 masters (round_stochastic with
     * noise keyed by the step), as llm.c's bf16 parameters; false: to nearest even. */
    bool stochastic_weights;
} PrecisionOptions;
typedef struct {
    int32_t narrowed; /* cast<half> nodes added */
    int32_t widened;  /* cast<f32> nodes added (one per kept value the backward pass reads) */
    int32_t copied;   /* forward values computed again in the backward pass from half copies */
} PrecisionStats;
/* 0, or -1 with a message in err (a dtype that is not half precision). */
int pass_precision(Graph *g, const PrecisionOptions *opt, PrecisionStats *stats, StrBuf *err);

/* remat.c — activation checkpointing: backward reads of the values computed inside a
 * checkpoint(...) region read copies recomputed from the region's inputs (NODE_RECOMPUTED).
 * Renumbers nodes; runs after simplify (whose CSE would merge the copies back). */
typedef struct {
    int64_t arena_budget;   /* bytes of training activations to fit (0: no budget) */
    int64_t smallest_arena; /* out, when the budget cannot be met: with every block checkpointed */
    int32_t nblocks;        /* out: the model's blocks (module calls from forward) */
    int32_t blocks;         /* out: how many of them were checkpointed for the budget */
    bool cheap;             /* out: cheap values (elementwise, views) recomputed for the budget */
    bool want_floor;        /* in: find the smallest plan any budget can reach (the floor_ fields) */
    int64_t floor_arena;    /* out: its training activations: blocks checkpointed, cheap values recomputed */
    int32_t floor_blocks;   /* out: the blocks it checkpoints */
    bool floor_cheap;       /* out: whether it recomputes the cheap values */
} RematOptions;
typedef struct {
    int32_t regions;              /* checkpoint(...) regions in the graph */
    int32_t blocks;               /* module calls checkpointed for the budget */
    int32_t recomputed;           /* nodes copied for the backward pass */
    int32_t moved;                /* of them: region values only the backward pass reads, no longer computed in the forward */
    bool cheap;                   /* cheap values recomputed for the budget (before any block) */
    int64_t arena_without_blocks; /* under a budget: the activations before any block */
    int32_t candidates;           /* graphs planned by the budget search (fusion and memplan of each) */
} RematStats;
/* 0, or -1 with the message in err when the budget cannot be met. */
int pass_remat(Graph *g, RematOptions *opt, RematStats *stats, StrBuf *err);
/* The matrix products' FLOPs of a graph at the bounds (2 M N K each), all of them and
 * those of the copies the pass made (NODE_RECOMPUTED). */
void remat_matmul_flops(const Graph *g, double *all, double *recomputed);



/* gradcheck.c — every parameter gradient of the training graph (from autodiff, run by the
 * interpreter in double precision) against central finite differences of the loss on a
 * sample of elements of every tensor. An element passes when
 *     |analytic - numeric| <= atol + rtol * |numeric|
 * (torch.autograd.gradcheck's criterion); differences whose window crosses a kink (relu
 * at 0, a max-pooling tie, a comparison that flips) are never used; detached values are
 * held fixed, as autodiff holds them. The file's header documents each choice. */
typedef struct {
    uint64_t seed;
    double tolerance;    /* rtol: the relative part of the allowed error */
    double atol;         /* absolute part; 0: the rounding noise of the difference,
                            100 * eps * max(|loss|, 1) / h for the step h used */
    int samples;         /* elements checked per tensor */
    int64_t sym_value;   /* value for every symbolic size (clamped to its bound) */
    bool wrt_inputs;     /* also check gradients of float inputs */
    const Graph *training; /* NULL: differentiate the forward graph here (autodiff, then
                              simplify); else the training graph whose gradient outputs
                              are checked (tests use it to prove a wrong gradient fails) */
} GradcheckOptions;

typedef enum {
    GRADCHECK_PASS,
    GRADCHECK_FAIL,
    GRADCHECK_ZERO,      /* analytic and numeric gradients at noise level: identically zero */
    GRADCHECK_UNCHECKED, /* every element tried crosses a kink: nothing could be compared */
} GradcheckVerdict;

typedef struct {
    char *name;
    GradcheckVerdict verdict;
    int64_t numel;         /* elements of the tensor */
    int64_t checked;
    int64_t skipped;       /* elements whose window crossed a kink, replaced by others */
    bool exhausted;        /* every element was tried and fewer than `samples` could be checked */
    double max_abs_grad;   /* largest |analytic| over the whole tensor */
    double max_abs_error;  /* largest |analytic - numeric| */
    double max_rel_error;  /* largest |analytic - numeric| / |numeric| where |numeric| > atol */
    double worst_ratio;    /* largest |analytic - numeric| / (atol + rtol |numeric|): > 1 fails */
    char *detach_at;       /* "file:line:col" of a detach that cuts a path from this tensor
                              to the loss (its gradient is partial by design), or NULL */
} GradcheckResult;

/* Runs the check on a forward graph (differentiated here unless opt->training is given).
 * Returns the number of tensors that FAIL, or -1 with a message in *err. */
int gradcheck_run(const Graph *forward, const GradcheckOptions *opt, GradcheckResult **results, int *nresults,
                  StrBuf *err);
void gradcheck_free(GradcheckResult *results, int n);

/* fusion.c — groups the nodes of a finished graph into kernels, the unit of generated code
 * (one function each). It does not change the graph; it decides, per node, how it is
 * computed:
 *   - a loop kernel: elementwise ops, broadcasts and reductions over one set of axes
 *     ("rows") in one loop nest: softmax, layer norm forward and backward, cross-entropy
 *     with its mean, bias-gradient sums. Values stay in registers; reductions that depend
 *     on earlier ones of the same row take another pass over the row (recomputing the
 *     cheap elementwise ops rather than storing them);
 *   - a GEMM kernel: a matrix product through BLAS followed by its elementwise consumers
 *     (bias, activation, residual add), applied to each block of rows while it is in cache;
 *   - a single-node kernel for everything else (gathers, concat, convolution windows, ...),
 *     except that the ops of one fused attention share one: its output and log-sum-exp,
 *     or its three gradients (members in node order, the anchor the first).
 * Reshapes and detaches are views of their operand's memory; constants, iotas, random
 * numbers and broadcasts of stored tensors are recomputed inside every kernel that reads
 * them. A node's value is stored to memory only when another kernel or a graph output reads
 * it, and a cheap elementwise value (GELU's tanh, its square, 1 + tanh) that other kernels
 * read element for element is recomputed there from the stored values it derives from
 * instead: a backward kernel then reads one stored tensor instead of five. Kernels are listed
 * in an order that respects their dependencies. */
typedef enum { KERNEL_SINGLE, KERNEL_LOOP, KERNEL_GEMM } KernelKind;
typedef enum {
    ROLE_MEMORY, /* input or parameter: the caller's memory */
    ROLE_VIEW,   /* reshape, detach: reads its operand's memory, no kernel */
    ROLE_INLINE, /* recomputed where it is used (const, iota, random, broadcast loads) */
    ROLE_KERNEL, /* computed by kernels[kernel_of[id]] */
    ROLE_STRIDED, /* permute, slice or expand read in place by matrix products only (layout.c) */
} NodeRole;
typedef enum { CLASS_FULL, CLASS_ROW, CLASS_TOTAL } MemberClass;

typedef struct {
    uint8_t kind;      /* KernelKind */
    NodeId anchor;     /* SINGLE: the node; GEMM: the matmul; LOOP: the node that set the shape */
    Shape shape;       /* iteration space: every member has its element count (CLASS_FULL) or,
                          reduced over `axes`, the row count (CLASS_ROW), or one (CLASS_TOTAL) */
    uint64_t axes;     /* LOOP: the reduced axes of `shape` (0: elementwise only) */
    int32_t first, count; /* members: FusionPlan.members[first .. first + count), ascending */
    NodeId written;    /* GEMM: a permute of the product that BLAS writes instead of the
                          product itself (fusion_gemm_output); SINGLE: a permute of a fused
                          attention's output that its kernel writes instead (fusion_root of
                          the output is then the permute); or IR_NONE */
    NodeId summed;     /* GEMM: the sum of the products over all batch axes (a convolution's
                          weight gradient), which BLAS accumulates (beta 1) instead of
                          storing each product, or IR_NONE */
} Kernel;

typedef struct {
    int32_t nnodes, nkernels;
    Kernel *kernels;    /* in execution order */
    NodeId *members;
    uint8_t *role;      /* NodeRole, per node */
    uint8_t *cls;       /* MemberClass of kernel members */
    int32_t *kernel_of; /* per node: index in kernels, or -1 */
    uint8_t *stored;    /* per node: its value is written to memory */
    uint8_t *recomputed; /* per node: an elementwise member that other kernels needing it
                            compute again, from stored values and constants, instead of
                            loading it: not stored for them */
} FusionPlan;

void fusion_plan(const Graph *g, FusionPlan *plan);
void fusion_free(FusionPlan *plan);
/* The root whose memory or value a node stands for: skips views (reshape, detach) and
 * strided views (which only matrix products read, through fusion_layout). */
NodeId fusion_root(const Graph *g, const FusionPlan *plan, NodeId id);
/* Does node `reader` of kernel k read root r as a broadcast of r's operand (recomputed,
 * not loaded)? Matrix products and single-node kernels read stored values only. */
bool fusion_is_broadcast(const Graph *g, const FusionPlan *plan, NodeId r, int32_t k, NodeId reader);
/* The first axis of expand e's operand that is not broadcast (its rank when all are): the
 * operand's axes from there on are coordinates of the reading kernel. */
int fusion_first_kept_axis(const Graph *g, NodeId e);
/* layout.c — a strided view of stored memory: element (c_0, ..., c_{rank-1}) of a value
 * is at base[sum of offset terms + sum c_a * stride[a]]; offsets and strides are products
 * of dims, valid for every value of the symbols. */
#define FUSION_LAYOUT_TERMS 8
typedef struct {
    NodeId base; /* the stored value (or parameter, input) the view reads */
    int rank;
    Dim stride[IR_MAX_RANK];
    int nterms;
    Dim offset[FUSION_LAYOUT_TERMS];
} FusionLayout;
/* The layout of node x through views and strided views; false when it has none. */
bool fusion_layout(const Graph *g, const FusionPlan *plan, NodeId x, FusionLayout *layout);
/* Can BLAS read operand x of a matrix product with this layout: a unit stride along its
 * columns (*trans = false) or its rows (*trans = true)? Batch axes may have any stride. */
bool fusion_gemm_operand(const Graph *g, const FusionLayout *layout, NodeId x, bool *trans);
/* Can BLAS write the product of matrix product mm straight into the memory of pm, a
 * permute of it (row-major in pm's shape)? Sets the strides of that memory per axis of the
 * product; *swapped when the rows, not the columns, have unit stride (BLAS then computes
 * the transposed product, b^T a^T). */
bool fusion_gemm_output(const Graph *g, NodeId mm, NodeId pm, Dim *stride, bool *swapped);
/* Can the fused attention kernel (runtime/kiln_attention.h) read operand x of an attention
 * op with this layout: strides over (batch, head, row, column) into st[4], the batch axes
 * mergeable into one, BLAS rows (unit column stride) unless it is the mask? */
bool fusion_attention_operand(const Graph *g, const FusionLayout *layout, NodeId x, bool mask, Dim *st);
/* Which operand positions of an attention op the kernel reads by strides (q, k, v, the
 * mask, the backward's out and dout), and whether position j is the mask. */
bool fusion_attention_strided_operand(const Graph *g, NodeId op, int j, bool *mask);
/* Is the layout plain row-major memory of x's shape? */
bool fusion_is_contiguous(const Graph *g, const FusionLayout *layout, NodeId x);
/* "%85, strides [384*T, 32, 384, 1], offset 128" */
void fusion_layout_format(StrBuf *b, const Graph *g, const FusionLayout *layout);
/* `kiln ir --after fusion`: the kernels with their members, one line each. */
void fusion_print(const Graph *g, const FusionPlan *plan, StrBuf *out);

/* memplan.c — where every stored value lives: one activation arena per graph, offsets
 * planned by liveness over the kernel order of a FusionPlan (first fit with coalescing;
 * values whose lifetimes do not overlap share bytes). A kernel's outputs never overlap its
 * inputs, except in place: an elementwise loop kernel (one pass, element i read and written
 * in the same iteration) writes an output over an input of the same element size and count
 * that nothing reads afterwards. Sizes are for the symbols' bounds, so a step never allocates. Parameters,
 * gradients, buffers and optimizer state are separate slabs laid out by the code
 * generator's tables. */
typedef enum { MEM_NONE, MEM_CALLER, MEM_ARENA, MEM_VIEW, MEM_GRAD } MemKind;
typedef struct {
    uint8_t *kind;       /* MemKind per node: MEM_CALLER for inputs and parameters; MEM_GRAD
                            for a parameter's gradient, which its kernel writes straight into
                            the caller's gradient slab instead of the arena (no copy) */
    int64_t *offset;     /* MEM_ARENA: byte offset; MEM_GRAD: the index of its output */
    NodeId *inplace_of;  /* per node: the operand whose bytes it overwrites (an elementwise
                            kernel's output taking the place of an input it is the last
                            reader of, element for element), or IR_NONE */
    int64_t arena_bytes; /* the peak */
} MemPlan;

void memplan_run(const Graph *g, const FusionPlan *f, MemPlan *m);
void memplan_free(MemPlan *m);
/* Bytes of a node's value at the symbols' bounds, rounded up to 64 (a cache line). */
int64_t memplan_node_bytes(const Graph *g, NodeId id);

/* A graph's plan: fusion's kernels and memplan's offsets, computed once by the pipeline's
 * last two stages and read by the code generators and the reports. */
typedef struct {
    FusionPlan fusion;
    MemPlan mem;
    bool fused, placed; /* which of the two were computed */
} GraphPlan;
void graph_plan_free(GraphPlan *p);
/* The training activations of a graph's plan at the symbols' bounds, for a graph that has
 * no plan yet (the remat pass's candidates, tests): fusion and memplan, the arena's size. */
int64_t memplan_arena_of(const Graph *g);

/* pipeline.c — the passes in order. */
typedef struct {
    const char *name;
    const char *doc;
} PassInfo;
/* Every stage, "lower" (the frontend's) first. */
const PassInfo *pipeline_passes(int *n);
bool pipeline_has_pass(const char *name);
/* The options of a pipeline run; NULL members are the defaults (no memory budget, f32). */
typedef struct {
    RematOptions *remat;
    const PrecisionOptions *precision;
    const char *from;      /* start after this pass (NULL: from the first) */
    bool forward_only;     /* an evaluation, predict or decode graph: no autodiff, precision, remat */
    bool unfused_attention; /* skip the attention pass: attention computed as written
                               (--attention unfused) */
    int64_t attention_max_head; /* the largest head size the target's fused kernels take
                                   (0: any); larger ones stay unfused */
    GraphPlan *plan;       /* out: fusion and memplan run into it (NULL: they run only when
                              `after` names them) */
    StrBuf *times;         /* --time-passes: one row per pass run (pipeline_time_row) */
    const char *graph_name; /* the graph's name in those rows: "train", "eval", ... */
} PipelineOptions;
/* Runs the passes in order from opt->from up to and including `after` (NULL: all; "lower":
 * none). With stats, appends one line per pass with node counts before and after to
 * *stats. Returns 0, or -1 with a message in *err (an unknown pass name, a failing pass,
 * or a verifier failure naming the pass). */
int pipeline_run_opts(Graph *g, const char *after, const PipelineOptions *opt, StrBuf *stats, StrBuf *err);
int pipeline_run(Graph *g, const char *after, StrBuf *stats, StrBuf *err);
/* A monotonic clock in seconds, and one row of the --time-passes table (the header first
 * when times is empty; nothing when times is NULL). */
double pipeline_seconds(void);
void pipeline_time_row(StrBuf *times, const char *pass, const char *graph, double seconds, int32_t before, int32_t after,
                       const char *note);

#endif
