/* ir.h — Kiln's intermediate representation: one Graph of nodes in a growable array.
 *
 * Operands are 32-bit node indices, never pointers, and always refer to earlier nodes, so
 * the node array is a topological order and per-pass data can live in dense side arrays
 * indexed by NodeId. Every node has a dtype, a shape whose dims may be symbolic (B, T, B*T),
 * and the source location it came from. The op table is in ops.h.
 *
 * This header is the whole layer's interface: graph construction (graph.c), shapes and
 * symbolic dims (shape.c), the checked builder that composite layers use (build.c), the
 * text printer and reader (print.c, read.c), the Graphviz printer (dot.c), the verifier
 * (verify.c) and the double-precision reference interpreter (interp.c). */
#ifndef KILN_IR_H
#define KILN_IR_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../util/util.h"
#include "ops.h"

#define IR_MAX_RANK 8
#define IR_MAX_DIM_SYMS 4
#define IR_MAX_SYMS 64
#define IR_NONE (-1)
/* Largest element count of one tensor and largest single dim: far beyond any real model,
 * small enough that size arithmetic in int64 can never overflow. */
#define IR_MAX_ELEMENTS (INT64_C(1) << 40)
#define IR_MAX_DIM (INT64_C(1) << 32)
#define IR_SLICE_END INT64_MAX

typedef int32_t NodeId;

/* ---- dtypes ---- */
#define KILN_DTYPES(DT)              \
    DT(BOOL, "bool", 1, 0, 0)        \
    DT(U8, "u8", 1, 0, 1)            \
    DT(I32, "i32", 4, 0, 1)          \
    DT(I64, "i64", 8, 0, 1)          \
    DT(F16, "f16", 2, 1, 0)          \
    DT(BF16, "bf16", 2, 1, 0)        \
    DT(F32, "f32", 4, 1, 0)          \
    DT(F64, "f64", 8, 1, 0)

typedef enum {
#define DT_ENUM(e, name, size, is_float, is_int) DT_##e,
    KILN_DTYPES(DT_ENUM)
#undef DT_ENUM
    DT_COUNT
} DType;

const char *ir_dtype_name(DType t);
int ir_dtype_size(DType t);
bool ir_dtype_is_float(DType t);
bool ir_dtype_is_int(DType t); /* integer, not bool */
/* Returns the dtype named s (length n), or -1. */
int ir_dtype_from_name(const char *s, size_t n);

/* An attention's mask kind by name ("none", "causal", "keep", "drop", "add"; "?" out of
 * range), the kind of a name (-1: none), and attention_grad's `which` ("q", "k", "v",
 * "mask"). */
const char *ir_attn_mask_name(int64_t m);
int ir_attn_mask_from_name(const char *s, size_t n);
const char *ir_attn_grad_name(int64_t which);

/* ---- parameter initialisation (PyTorch's default distributions) ---- */
#define KILN_INITS(IN)           \
    IN(ZEROS, "zeros", 0)        \
    IN(ONES, "ones", 0)          \
    IN(CONSTANT, "constant", 1)  \
    IN(UNIFORM, "uniform", 2)    \
    IN(NORMAL, "normal", 2)

typedef enum {
#define IN_ENUM(e, name, nargs) INIT_##e,
    KILN_INITS(IN_ENUM)
#undef IN_ENUM
    INIT_COUNT
} InitKind;

const char *ir_init_name(InitKind k);
int ir_init_nargs(InitKind k);
int ir_init_from_name(const char *s, size_t n);

/* ---- symbolic dims ----
 * A dim is k * sym[0] * ... * sym[nsym-1]: a constant when nsym == 0, a symbol such as B
 * when k == 1, nsym == 1, or a product such as B*T from a reshape. Symbols are sorted, so
 * equal dims have equal representations. */
typedef struct {
    int64_t k;
    uint8_t nsym;
    uint8_t sym[IR_MAX_DIM_SYMS];
} Dim;

typedef struct {
    uint8_t rank;
    Dim d[IR_MAX_RANK];
} Shape;

typedef struct {
    char *name;
    int64_t max; /* largest value, fixed at build time; memory is planned for it */
} Symbol;

/* ---- nodes and graphs ---- */
typedef struct {
    uint16_t op;        /* Op */
    uint8_t dtype;      /* DType */
    uint8_t flags;      /* NODE_* */
    int32_t ckpt;       /* checkpoint region (from checkpoint(...)), 0 = none */
    uint32_t ninputs;
    uint32_t inputs;    /* index of the first operand in Graph.operands */
    uint32_t nattrs;
    uint32_t attrs;     /* index of the first attribute in Graph.attrs */
    double fattr[2];
    Shape shape;
    Loc loc;
    uint32_t name;      /* offset in Graph.strings; 0 = none. Input/param name, or the
                           source variable a value was assigned to (for readable dumps) */
    uint32_t scope;     /* offset in Graph.strings of the module path of the innermost
                           module call that built it ("h.3.ln_2"); 0 = the model's own
                           forward. Only for readable generated code: no pass reads it */
    Loc scope_loc;      /* where that module is called (the layer's line) */
    uint32_t scope_type; /* offset in Graph.strings of that module's type ("LayerNorm"); 0
                            with scope 0. Names the kernels several layers share */
} Node;

/* Node.ckpt from IR_CKPT_AUTO up: a call of one of the model's own modules in forward
 * (a block), which the remat pass checkpoints only when a memory budget asks for it;
 * below it, a checkpoint(...) of the model file, always recomputed. */
#define IR_CKPT_AUTO 0x1000000

/* Node.flags */
enum {
    /* a copy of a checkpointed forward value that the backward pass computes again instead
     * of keeping the original (passes/remat.c); fusion keeps such copies out of the
     * original's kernels */
    NODE_RECOMPUTED = 1,
    /* built by the decode graph's cached attention or positions, which the frontend's
     * check of the decode graph exempts (frontend/decode.c; cleared by the check) */
    NODE_DECODE_CACHED = 2,
    /* built by autodiff: the backward pass of the forward node's module (Node.scope) */
    NODE_BACKWARD = 4
};

typedef enum {
    OUT_FORWARD, /* an output of forward() */
    OUT_LOSS,    /* the scalar training loss */
    OUT_METRIC,  /* a declared metric */
    OUT_UPDATE,  /* new value of a buffer (e.g. BatchNorm running statistics) */
    OUT_GRAD,    /* gradient of a parameter (autodiff) */
    OUT_KIND_COUNT
} OutputKind;

typedef struct {
    uint32_t name; /* offset in Graph.strings */
    NodeId node;
    uint8_t kind;  /* OutputKind */
} Output;

/* MODE_DECODE: eval mode, with a language model's forward lowered for incremental
 * decoding against a key/value cache (frontend/decode.c). */
typedef enum { MODE_TRAIN, MODE_EVAL, MODE_DECODE } GraphMode;

typedef struct {
    char *name; /* the model name */
    uint8_t mode; /* GraphMode: dropout and batch norm lower differently */
    Node *nodes;
    int32_t nnodes, nodes_cap;
    NodeId *operands;
    int32_t noperands, operands_cap;
    int64_t *attrs;
    int32_t nattrs, attrs_cap;
    char *strings; /* NUL-separated names; offset 0 is the empty string */
    int32_t nstrings, strings_cap;
    uint32_t *intern_slots; /* hash index of strings (offsets; 0 = empty), built lazily */
    uint32_t intern_cap, intern_n;
    Symbol syms[IR_MAX_SYMS];
    int32_t nsyms;
    char **files; /* source file paths, indexed by Loc.file */
    int32_t nfiles, files_cap;
    Output *outputs;
    int32_t noutputs, outputs_cap;
} Graph;

Graph *ir_graph_new(const char *name);
void ir_graph_free(Graph *g);
/* Adds a node; operands and attrs are copied. Returns its id. No checking: use the builder
 * (IrBuilder) for anything built from user input, and ir_verify() after every pass. */
NodeId ir_add_node(Graph *g, Op op, DType dtype, const Shape *shape, const NodeId *inputs, int ninputs,
                   const int64_t *attrs, int nattrs, Loc loc);
static inline Node *ir_node(Graph *g, NodeId id) { return &g->nodes[id]; }
/* NULL when the graph has no operands (attrs) at all: NULL + 0 is undefined behaviour. */
static inline const NodeId *ir_inputs(const Graph *g, NodeId id) { return g->operands ? g->operands + g->nodes[id].inputs : NULL; }
static inline NodeId ir_input(const Graph *g, NodeId id, int i) { return g->operands[g->nodes[id].inputs + (uint32_t)i]; }
static inline const int64_t *ir_attrs(const Graph *g, NodeId id) { return g->attrs ? g->attrs + g->nodes[id].attrs : NULL; }
uint32_t ir_intern(Graph *g, const char *s); /* adds a string, returns its offset */
static inline const char *ir_str(const Graph *g, uint32_t off) { return g->strings + off; }
const char *ir_node_name(const Graph *g, NodeId id); /* "" when unnamed */
void ir_set_name(Graph *g, NodeId id, const char *name);
/* Copies node src's module path and call location (Node.scope) from graph from to node dst
 * of g: for passes that rebuild a graph. Files must have the same indices in both. */
void ir_copy_scope(Graph *g, NodeId dst, const Graph *from, NodeId src);
/* Adds (or finds) a symbol; returns its index or -1 when the table is full. */
int ir_add_symbol(Graph *g, const char *name, int64_t max);
int ir_find_symbol(const Graph *g, const char *name);
uint16_t ir_add_file(Graph *g, const char *path); /* finds or adds */
void ir_add_output(Graph *g, OutputKind kind, const char *name, NodeId node);
const char *ir_output_kind_name(OutputKind k);
/* Are attention ops a and b (attention, attention_lse, attention_grad) of one attention:
 * the same operands, scale, dropout, mask kind and stream? (Fusion computes such siblings
 * in one kernel.) */
bool ir_same_attention(const Graph *g, NodeId a, NodeId b);
/* Node with the given name and op (INPUT/PARAM), or IR_NONE. */
NodeId ir_find_named(const Graph *g, Op op, const char *name);
/* Every node of op by name into m (the first of a name, as ir_find_named finds it): for
 * looking up many names in linear time. The keys are g's strings: the map is valid while g
 * does not change. */
void ir_index_named(const Graph *g, Op op, StrMap *m);
/* Deep copy. */
Graph *ir_graph_clone(const Graph *g);
/* Valid values of an integer input are [0, range): found from its uses (rows of a table
 * it indexes with gather, classes of a one-hot it is compared with); 0 when no use bounds it. */
int64_t ir_index_range(const Graph *g, NodeId input);

/* ---- shapes (shape.c) ---- */
Dim ir_dim_const(int64_t k);
Dim ir_dim_sym(int sym);
bool ir_dim_is_const(Dim d);
bool ir_dim_eq(Dim a, Dim b);
/* Product; false when it would need more than IR_MAX_DIM_SYMS symbols or overflow. */
bool ir_dim_mul(Dim a, Dim b, Dim *out);
/* Exact quotient a / b; false when b does not divide a. */
bool ir_dim_div(Dim a, Dim b, Dim *out);
/* Value of the dim with symbols at their maximum. */
int64_t ir_dim_max(const Graph *g, Dim d);
/* Value of the dim for given symbol values (indexed by symbol). */
int64_t ir_dim_eval(Dim d, const int64_t *symvals);
void ir_dim_format(StrBuf *b, const Graph *g, Dim d); /* "784", "B", "B*T", "4*B" */
Shape ir_shape_make(int rank, const Dim *d);
bool ir_shape_eq(const Shape *a, const Shape *b);
/* Element count, symbolic; false on overflow of the representation. */
bool ir_shape_numel(const Shape *s, Dim *out);
int64_t ir_shape_max_numel(const Graph *g, const Shape *s); /* -1 on overflow */
void ir_shape_format(StrBuf *b, const Graph *g, const Shape *s); /* "[B, 28, 28]" */

/* ---- the checked builder (build.c) ----
 * Every function checks its operands and returns IR_NONE with a message in *err (which
 * names both shapes, e.g. "matmul: inner dimensions differ: [B, 784] @ [256, 10]") instead
 * of building an invalid node. Composite layers are built from these. */
typedef struct {
    Graph *g;
    Loc loc;      /* stamped on every node built */
    int32_t ckpt; /* checkpoint region stamped on every node built */
    uint32_t scope; /* module path (Node.scope), its call's location and its type, stamped likewise */
    Loc scope_loc;
    uint32_t scope_type;
    StrBuf *err;
    int32_t next_stream; /* for random_uniform streams */
} IrBuilder;

NodeId ir_b_input(IrBuilder *b, const char *name, DType t, const Shape *s);
NodeId ir_b_param(IrBuilder *b, const char *name, const Shape *s, InitKind init, double a0, double a1, bool trainable);
/* The same with row zero_row (on axis 0) initialised to zeros whatever the init (Embedding's
 * padding_idx); -1: none, as ir_b_param. The row is the param's optional third attr. */
NodeId ir_b_param_zero_row(IrBuilder *b, const char *name, const Shape *s, InitKind init, double a0, double a1, bool trainable,
                           int64_t zero_row);
/* A param's zero row (ir_b_param_zero_row), or -1 when it has none. */
int64_t ir_param_zero_row(const Graph *g, NodeId p);
NodeId ir_b_const(IrBuilder *b, double v, DType t);
NodeId ir_b_full(IrBuilder *b, double v, DType t, const Shape *s);
NodeId ir_b_iota(IrBuilder *b, const Shape *s, int axis, DType t);
NodeId ir_b_random_uniform(IrBuilder *b, const Shape *s, DType t);
/* The step's loss scale (an f32 scalar the program passes in; ops.h). */
NodeId ir_b_loss_scale(IrBuilder *b);
NodeId ir_b_unary(IrBuilder *b, Op op, NodeId x);
NodeId ir_b_cast(IrBuilder *b, NodeId x, DType t);
/* Binary elementwise with NumPy broadcasting and dtype promotion (ir_promote): operands are
 * cast, reshaped and expanded as needed. */
NodeId ir_b_binary(IrBuilder *b, Op op, NodeId x, NodeId y);
NodeId ir_b_where(IrBuilder *b, NodeId c, NodeId x, NodeId y);
/* Reduces the axes in mask; keepdim false removes them with a reshape. */
NodeId ir_b_reduce(IrBuilder *b, Op op, NodeId x, uint64_t axes, bool keepdim);
/* reduce_max whose gradient goes to the first maximal element (its `first` attribute) */
NodeId ir_b_reduce_max_first(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim);
NodeId ir_b_argmax(IrBuilder *b, NodeId x, int axis, bool keepdim);
NodeId ir_b_reshape(IrBuilder *b, NodeId x, const Shape *s);
NodeId ir_b_expand(IrBuilder *b, NodeId x, const Shape *s); /* NumPy rules: may add leading dims */
NodeId ir_b_permute(IrBuilder *b, NodeId x, const int *perm);
NodeId ir_b_transpose(IrBuilder *b, NodeId x, int a0, int a1);
NodeId ir_b_slice(IrBuilder *b, NodeId x, int axis, int64_t start, int64_t end, int64_t step);
NodeId ir_b_concat(IrBuilder *b, const NodeId *xs, int n, int axis);
NodeId ir_b_pad(IrBuilder *b, NodeId x, const int64_t *lo, const int64_t *hi, double value);
/* Indices checked against [0, limit) when the step runs (check_index, named `what`, e.g.
 * "Embedding 'emb'", for the error message), or idx itself when its values are in range by
 * construction (ir_index_in_range). */
NodeId ir_b_check_index(IrBuilder *b, NodeId idx, int64_t limit, const char *what);
/* Can idx hold only values in [0, limit)? True for an arange of at most limit values, u8
 * values with limit >= 256, a check_index against limit or less, and moves and widening
 * casts of those. */
bool ir_index_in_range(const Graph *g, NodeId idx, int64_t limit);
/* gather and scatter_add take indices that ir_index_in_range proves valid (usually through
 * ir_b_check_index), so that no index built from user input is used unchecked. */
NodeId ir_b_gather(IrBuilder *b, NodeId table, NodeId idx);
NodeId ir_b_scatter_add(IrBuilder *b, NodeId idx, NodeId src, Dim rows);
/* Matmul with broadcasting of batch dims; a 1-D operand is treated as PyTorch does. */
NodeId ir_b_matmul(IrBuilder *b, NodeId x, NodeId y);
/* An attention op (ops.h): attention, attention_lse (operands q, k, v [, mask]) or
 * attention_grad (q, k, v [, mask], out, lse, dout; `which` 0 q, 1 k, 2 v, 3 an added mask,
 * else ignored);
 * the result's shape and dtype from the operands. The verifier checks the rest. */
NodeId ir_b_attention(IrBuilder *b, Op op, const NodeId *operands, int n, AttnMask mask, double scale, double dropout,
                      int64_t stream, int which);
NodeId ir_b_unfold(IrBuilder *b, NodeId x, int kh, int kw, int sh, int sw, int dh, int dw);
NodeId ir_b_fold(IrBuilder *b, NodeId x, const Shape *out, int kh, int kw, int sh, int sw, int dh, int dw);
/* Dtype both operands are converted to by a binary op (PyTorch-like promotion). */
DType ir_promote(DType a, DType b);
/* Normalises a possibly negative axis; -1 with a message in *err when out of range. */
int ir_b_axis(IrBuilder *b, const char *what, int64_t axis, int rank);

/* ---- text form, DOT and verification ---- */
/* Deterministic text form: see docs/ir.md. ir_read(ir_print(g)) == g. */
void ir_print(const Graph *g, StrBuf *out);
/* A hash of the graph's text form without source locations and file names, and `extra`
 * (NULL: nothing): the same computation hashes the same wherever its file is. */
uint64_t ir_hash(const Graph *g, const char *extra);
/* Parses the text form; NULL with diagnostics (file = path given) on error. */
Graph *ir_read(const char *text, size_t len, const char *path, Diag *d);
void ir_print_dot(const Graph *g, StrBuf *out);
/* Checks every invariant (operand order, arity, dtypes, shapes, attrs); returns the number
 * of problems found, each described on its own line in *err. */
int ir_verify(const Graph *g, StrBuf *err);

/* ---- the reference interpreter (interp.c) ----
 * Executes a graph in double precision: every value, whatever its dtype, is held as
 * doubles (integer dtypes hold exact integers; f32 and f64 are not rounded to their
 * width, so that gradient checks see true derivatives; bf16 and f16 are rounded, through
 * f32, to nearest even, as the generated code rounds them: passes/precision.c). Slow
 * and obviously right: it is the oracle for gradient checks and for every generated
 * kernel. */
typedef struct {
    int rank;
    int64_t dims[IR_MAX_RANK];
    int64_t n;
    double *data; /* row-major; NULL until computed or set */
} ITensor;

typedef struct {
    const Graph *g;
    int64_t symvals[IR_MAX_SYMS]; /* concrete symbol values; default: each symbol's max */
    ITensor *vals;                /* one per node */
    uint64_t seed, step;          /* for random_uniform */
    double loss_scale;            /* the value of loss_scale nodes (interp_init: 1) */
    StrBuf err;
} Interp;

void interp_init(Interp *ip, const Graph *g);
void interp_free(Interp *ip);
/* Sets a symbol's value for this run; -1 when unknown or above its max. */
int interp_set_symbol(Interp *ip, const char *name, int64_t value);
/* Sets the value of a leaf (input or param); data holds the node's element count at the
 * current symbol values. The data is copied. */
void interp_set(Interp *ip, NodeId leaf, const double *data);
/* Initialises every param that has no value yet, as PyTorch does (docs/language.md lists
 * the distribution each built-in uses), from a counter-based generator keyed by seed. */
void interp_init_params(Interp *ip, uint64_t seed);
/* Evaluates every node; 0 on success, -1 with a message in ip->err (a missing input, an
 * index out of range, a symbol value that makes a shape invalid). */
int interp_run(Interp *ip);
const ITensor *interp_value(const Interp *ip, NodeId id);
/* The interpreter's elementwise semantics, shared with constant folding so that a folded
 * value is exactly what the interpreter would compute: an op on doubles, then the value
 * stored as dtype t holds it (truncated and wrapped for integers). */
double interp_unary(Op op, double x);
double interp_binary(Op op, double x, double y);
/* x rounded to bf16 stochastically by u in [0, 1): round_stochastic's value. */
double interp_round_stochastic(double x, double u);
void interp_normalise(DType t, double *v, int64_t n);
/* The attention ops' evaluation (interp_attention.c): in[] its operands, o zeroed with the
 * node's dims; 0, or -1 with the reason in err. */
int interp_attention(const Graph *g, NodeId id, const ITensor *const *in, int nin, ITensor *o, uint64_t seed, uint64_t step, StrBuf *err);

#endif
