/* internal.h — what the frontend's files share and nothing outside frontend/ sees: the
 * lowering context, compile-time values, module instances, the composite layers built
 * from primitives (composite.c), the built-in modules (builtins.c), and the callable
 * functions (functions.c). */
#ifndef KILN_FRONTEND_INTERNAL_H
#define KILN_FRONTEND_INTERNAL_H

#include "frontend.h"

/* A value during lowering: a compile-time number, a symbolic size, a string, a tensor in
 * the graph, a module instance, a list of instances, or a tuple (from split). */
typedef enum { V_ERROR, V_NONE, V_NUM, V_DIM, V_STR, V_TENSOR, V_MODULE, V_LIST, V_TUPLE, V_BOOL } ValueKind;

typedef struct {
    uint8_t kind;   /* ValueKind */
    bool is_int;    /* V_NUM */
    double num;     /* V_NUM, V_BOOL */
    Dim dim;        /* V_DIM */
    NodeId node;    /* V_TENSOR */
    int32_t idx;    /* V_MODULE: instance; V_LIST/V_TUPLE: start in Lower.seq */
    int32_t count;  /* V_LIST/V_TUPLE: length */
    const char *str; /* V_STR (points into the AST) */
} Value;

typedef struct BuiltinModule BuiltinModule;
#define BUILTIN_MAX_ARGS 10 /* ConvTranspose2d's 9 */

/* A named member of a module instance: a parameter, submodule, list or constant. */
typedef struct {
    char *name;
    Value v;
} Member;

typedef struct {
    char *path;                   /* state_dict prefix: "" (root), "fc1", "h.0.attn" */
    char *type;                   /* "Linear", "Block", the model name for the root */
    AstId def;                    /* user module definition, or AST_NONE */
    const BuiltinModule *builtin; /* or NULL */
    Value args[BUILTIN_MAX_ARGS]; /* builtin arguments after defaults */
    AstId args_at[BUILTIN_MAX_ARGS];          /* where each was written (the call for a default; 0 for a child's) */
    Member *members;
    int32_t nmembers, members_cap;
    StrMap member_index; /* name -> index in members */
    int32_t parent;
    Loc loc;                      /* where it was instantiated */
    struct Scope *scope;          /* module arguments and constants */
    AstId forward;                /* user module: its FORWARD item */
} Inst;

/* An `init PATTERN = expr` rule, owned by the module instance whose body declared it. */
typedef struct {
    const char *pattern;
    AstId expr, at;
    int32_t owner;
    int32_t matches;
    bool failed; /* its initialiser was reported as invalid */
} InitRule;

/* A name that only a branch of an `if` not taken defines: a local of `scope`, or (scope
 * NULL) a member or constant of instance inst. A later use of it gets an error saying so;
 * taken < 0: the condition failed, and its error is the only one. */
typedef struct {
    struct Scope *scope;
    int32_t inst;
    char *name;
    AstId at; /* the IF */
    int taken;
} UnsetName;

/* Names visible in a forward body: locals over members over constants. */
typedef struct Scope {
    struct Scope *parent;
    bool boundary; /* the module scope: instance members are looked up just before it */
    char **names;
    Value *vals;
    int32_t n, names_cap, vals_cap;
    StrMap index; /* name -> index */
} Scope;

typedef struct {
    Diag *d;
    Ast *ast;
    Graph *g;
    IrBuilder b;
    StrBuf err;
    Inst *insts;
    int32_t ninsts, insts_cap;
    Value *seq; /* elements of lists and tuples */
    int32_t nseq, seq_cap;
    int depth;          /* module nesting, bounded against recursion */
    int loop_depth;     /* `for` loops being lowered */
    int32_t next_ckpt;
    int32_t next_auto;  /* module calls stamped IR_CKPT_AUTO + k (remat under a memory budget) */
    int64_t batch;      /* train.batch: the bound of the batch symbol */
    bool failed;
    Scope *globals;     /* consts and dims of the file */
    InitRule *rules;
    int32_t nrules, rules_cap;
    int32_t *inst_stack; /* user module definitions being instantiated, for recursion */
    int32_t ninst_stack, inst_stack_cap;
    Scope **scopes;     /* every scope made, freed at the end */
    Value *method_self; /* x of a method call x.f(...): bound as f's first argument */
    int32_t nscopes, scopes_cap;
    UnsetName *unset;   /* names of branches not taken (cond.c) */
    int32_t nunset, unset_cap;
} Lower;

/* Applies module instance m (built-in or user) to argument values. */
Value lower_apply_module_value(Lower *L, int32_t m, const Value *args, int nargs, AstId at);
/* Instantiates the member expression e (a module call, a repetition, Parameter) as member
 * `name` of instance parent. */
Value lower_instantiate(Lower *L, int32_t parent, const char *name, AstId e);
/* instantiate.c: the init rules among a module body's items (its `if`s resolved) for
 * instance owner, and its members and forward instantiated under inst */
void lower_collect_init_rules(Lower *L, const AstId *items, int32_t n, int32_t owner);
void lower_instantiate_items(Lower *L, int32_t inst, const AstId *items, int32_t n);
/* cond.c: compile-time `if`. The body of a module (or the file) from item `first`: its
 * constants and the conditions of its `if`s evaluated, then the init rules and members of
 * the branches taken. */
void lower_module_body(Lower *L, int32_t inst, AstId container, int first);
/* The branch an `if` takes, 1 (then) or 0 (else), from its condition cond evaluated in s:
 * a number, a boolean or none; -1 after an error (a tensor condition is one). */
int lower_if_branch(Lower *L, Scope *s, int32_t inst, AstId cond);
/* Remembers the names the branches of IF ifnode that are not taken define (every branch
 * when taken < 0: then locals of s become error values, so that nothing is reported
 * twice); s NULL: a module body's members and constants of inst. */
void lower_if_not_taken(Lower *L, Scope *s, int32_t inst, AstId ifnode, int taken);
/* When name, not found in s (or inst), is defined only in an `if` branch not taken: reports
 * that (silently fails when its condition failed) and returns true. */
bool lower_unset_error(Lower *L, Scope *s, int32_t inst, const char *name, AstId at);
/* The value of name visible in s inside instance inst, or NULL. */
Value *lower_lookup(Lower *L, Scope *s, int32_t inst, const char *name);
/* lower.c: scopes of names, and the sequence values of repetitions */
Scope *lower_scope_new(Lower *L, Scope *parent, bool boundary);
void lower_scope_set(Scope *s, const char *name, Value v);
int32_t lower_seq_push(Lower *L, Value v);
#define LOWER_MAX_REPEAT 100000    /* `[M(...) for N]`: N at most */
#define LOWER_MAX_INSTANCES 1000000 /* module instances in a model */
/* builtins.c: Sequential(modules...) as member `name` of parent */
Value builtin_sequential(Lower *L, int32_t parent, const char *name, AstId e);
/* decode.c, the decode graph (MODE_DECODE): arange(d) as absolute positions P + arange(d)
 * when d is the sequence length (else IR_NONE: an ordinary arange); the cached attention
 * over heads q, k, v [B, H, S, hd] of CausalSelfAttention `path`, false when it does not
 * apply (then the ordinary one, which frontend_decode_check rejects), else true with the
 * result [B, H, S, hd] in *out (IR_NONE on a builder error). */
NodeId decode_positions(Lower *L, Dim d);
bool decode_attention(Lower *L, const char *path, const NodeId heads[3], int64_t hd, NodeId *out);
/* The same for scaled_dot_product_attention(q, k, v, is_causal = true) with q, k, v [B, H, S,
 * hd] (k and v possibly repeating fewer heads, which the cache holds once), the cache named
 * after the calling module. */
bool decode_sdpa(Lower *L, NodeId q, NodeId k, NodeId v, double scale, NodeId *out);
/* Evaluates an expression in scope s inside module instance inst. */
Value lower_expr(Lower *L, Scope *s, int32_t inst, AstId e);

/* Arguments bound to a signature such as "x, axis|dim=-1, keepdim=false, *rest":
 * names with '|' aliases, defaults (numbers, true, false, none), and one '*' rest list. */
#define CALL_MAX_ARGS 12
typedef struct {
    Value v[CALL_MAX_ARGS];
    AstId at[CALL_MAX_ARGS]; /* where each came from (the call itself for defaults) */
    bool given[CALL_MAX_ARGS];
    int n;
    Value rest[IR_MAX_RANK * 2];
    AstId rest_at[IR_MAX_RANK * 2];
    int nrest;
} BoundArgs;
/* Evaluates and binds the arguments of CALL node `call`; false after reporting an error. */
bool lower_bind_args(Lower *L, Scope *s, int32_t inst, AstId call, const char *fname, const char *sig,
                     BoundArgs *out);
#define MAX_MODULE_DEPTH 32
/* Keeps in *best the candidate closest to name (for "did you mean" suggestions). */
void lower_consider(const char *cand, const char *name, const char **best, int *bestd);
/* Evaluates the initialiser of rule r for a parameter of shape s. */
bool lower_eval_init(Lower *L, const InitRule *r, const Shape *s, InitKind *kind, double *a0, double *a1);

/* Reads an integer / number / bool from a value, reporting at `at` when it is not one. */
bool value_int(Lower *L, Value v, AstId at, const char *what, int64_t *out);
bool value_number(Lower *L, Value v, AstId at, const char *what, double *out);
bool value_bool(Lower *L, Value v, AstId at, const char *what, bool *out);

/* Reports an error at the AST node's location and marks the lowering as failed. */
void lower_error(Lower *L, AstId at, const char *fmt, ...) KILN_PRINTF(3, 4);
/* Reports the builder's pending message (L->err) at `at`; returns an error value. */
Value lower_builder_error(Lower *L, AstId at);
Value value_num(double v, bool is_int);
Value value_tensor(NodeId n);
Value value_error(void);
Value value_none(void);
/* Source location of an AST node (file-level for AST_NONE). */
Loc lower_loc(Lower *L, AstId at);
/* Converts a number or size to a tensor (scalar constant of dtype like). */
NodeId lower_as_tensor(Lower *L, Value v, DType like);
bool value_is_scalar_number(Value v);

/* ---- composite layers (composite.c): expansions into primitives ---- */
NodeId comp_mean(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim);
NodeId comp_var(IrBuilder *b, NodeId x, uint64_t axes, bool keepdim, bool unbiased);
NodeId comp_softmax(IrBuilder *b, NodeId x, int axis);
NodeId comp_log_softmax(IrBuilder *b, NodeId x, int axis);
NodeId comp_logsumexp(IrBuilder *b, NodeId x, int axis, bool keepdim);
NodeId comp_gelu_tanh(IrBuilder *b, NodeId x);
NodeId comp_cross_entropy(IrBuilder *b, NodeId logits, NodeId target);
NodeId comp_mse(IrBuilder *b, NodeId x, NodeId y);
NodeId comp_dropout(IrBuilder *b, NodeId x, double p, bool train);
NodeId comp_layer_norm(IrBuilder *b, NodeId x, NodeId weight, NodeId bias, int nnorm, double eps);
NodeId comp_linear(IrBuilder *b, NodeId x, NodeId weight, NodeId bias);
/* pad: before each spatial axis, pad_hi: after it; groups as nn.Conv2d's (weight [O, C/groups, KH, KW]) */
NodeId comp_conv2d(IrBuilder *b, NodeId x, NodeId w, NodeId bias, const int stride[2], const int pad[2], const int pad_hi[2],
                   const int dilation[2], int groups);
NodeId comp_pool2d(IrBuilder *b, NodeId x, bool max, int k, int stride, int pad);
NodeId comp_pool2d_ex(IrBuilder *b, NodeId x, bool max, const int k[2], const int st[2], const int pad[2], const int dil[2], bool ceil_mode,
                      bool count_pad);
NodeId comp_scalar_op(IrBuilder *b, Op op, NodeId x, double s, bool scalar_left);

/* activations.c: PyTorch's activations (a0, a1: negative_slope, alpha, beta/threshold) */
typedef enum {
    ACT_RELU, ACT_SIGMOID, ACT_TANH, ACT_GELU, ACT_GELU_TANH, ACT_SILU, ACT_LEAKY_RELU, ACT_ELU,
    ACT_SOFTPLUS, ACT_MISH, ACT_HARDSWISH, ACT_HARDSIGMOID
} ActKind;
NodeId comp_activation(IrBuilder *b, ActKind k, NodeId x, double a0, double a1);
NodeId comp_floor_divide(IrBuilder *b, NodeId x, NodeId y, bool remainder);
NodeId comp_tri(IrBuilder *b, NodeId x, int64_t diagonal, bool upper);
NodeId comp_flip(IrBuilder *b, NodeId x, int axis);
NodeId comp_attention(IrBuilder *b, NodeId q, NodeId k, NodeId v, NodeId mask, bool causal, double scale, double dropout_p, bool train);
NodeId comp_cumsum(IrBuilder *b, NodeId x, int axis);
NodeId comp_rotary(IrBuilder *b, NodeId x, double base, NodeId positions);
/* tensorops.c */
NodeId comp_einsum(IrBuilder *b, const char *eq, const NodeId *xs, int n);
NodeId comp_interpolate(IrBuilder *b, NodeId x, int64_t oh, int64_t ow, bool bilinear, bool align);
/* interpolate's and Upsample's arguments to an output size (size, or floor(in * scale)) */
bool lower_interp_size(Lower *L, Value size, Value scale, AstId at, const char *what, NodeId x, int64_t out[2]);
bool lower_interp_mode(Lower *L, Value mode, Value align, AstId at, const char *what, bool *bilinear, bool *aligned);

/* losses.c: PyTorch's reduction, nll/cross-entropy options and the other losses */
typedef enum { LOSS_MEAN, LOSS_SUM, LOSS_NONE } LossReduction;
NodeId comp_reduce_loss(IrBuilder *b, NodeId l, LossReduction r);
NodeId comp_nll(IrBuilder *b, NodeId logp, NodeId target, NodeId weight, bool has_ignore, int64_t ignore_index, double smoothing,
                LossReduction r, const char *what);
NodeId comp_cross_entropy_probs(IrBuilder *b, NodeId logits, NodeId probs, NodeId weight, double smoothing, LossReduction r);
NodeId comp_kl_div(IrBuilder *b, NodeId x, NodeId t, bool log_target, LossReduction r, bool batchmean);
NodeId comp_regression_loss(IrBuilder *b, int kind, NodeId x, NodeId y, double beta, LossReduction r);
NodeId comp_bce_logits(IrBuilder *b, NodeId x, NodeId y, NodeId weight, NodeId pos_weight, LossReduction r);

/* ---- built-in modules (builtins.c) ---- */
struct BuiltinModule {
    const char *name;
    const char *args[BUILTIN_MAX_ARGS];     /* argument names, in positional order */
    const char *defaults[BUILTIN_MAX_ARGS]; /* NULL = required; else "1", "0.0", "true" */
    const char *doc;                        /* one line: what it computes and its init */
    /* Creates the parameters of inst (args already bound); false on error (reported). */
    bool (*create)(Lower *L, int32_t inst, AstId at);
    /* Applies the module to its call arguments. */
    Value (*apply)(Lower *L, int32_t inst, const Value *args, int nargs, AstId at);
};
const BuiltinModule *builtin_find(const char *name);
const BuiltinModule *builtin_all(int *n);

/* ---- lowering helpers used by builtins ---- */
/* Creates parameter `name` of inst with the given shape, applying init rules; returns it. */
NodeId lower_param(Lower *L, int32_t inst, const char *name, const Shape *s, InitKind init, double a0, double a1,
                   bool trainable, AstId at);
/* The same with row zero_row (axis 0) initialised to zeros whatever the init, an init rule's
 * included (Embedding's padding_idx); -1: none. */
NodeId lower_param_zero_row(Lower *L, int32_t inst, const char *name, const Shape *s, InitKind init, double a0, double a1,
                            bool trainable, int64_t zero_row, AstId at);
Value *inst_member(Lower *L, int32_t inst, const char *name);
/* Adds a module instance below parent (path parent.name) and a member to an instance. */
int32_t lower_inst_new(Lower *L, int32_t parent, const char *name, const char *type, Loc loc);
void lower_add_member(Lower *L, int32_t inst, const char *name, Value v);
NodeId lower_tensor_arg(Lower *L, Value v, AstId at, const char *what);

/* ---- callable functions (functions.c) ---- */
/* Lowers a call of a named built-in function; returns false when no function has that
 * name (so the caller can try modules and suggest names). */
bool functions_call(Lower *L, Scope *s, int32_t inst, const char *name, AstId call, Value *out);
/* x.f(...) on a tensor x: f's first argument is x (x.mean(1), x.float(), x.size(0)) */
Value functions_method(Lower *L, Scope *s, int32_t inst, AstId e, const char *name, Value self);
/* x.shape: a list of the sizes, numbers or symbolic sizes */
Value functions_shape_tuple(Lower *L, NodeId x);
/* The signature of function `name` ("x, axis|dim=-1, ..."), NULL when there is none. */
const char *functions_signature(const char *name);
/* All function names, for suggestions and docs. */
const char *const *functions_names(int *n);

#endif
