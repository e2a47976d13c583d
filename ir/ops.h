/* ops.h — the op table: the single source of truth for every IR operation.
 *
 * Each row is OP(ENUM, "name", arity, flags, attribute layout). arity -1 means variadic.
 * The parser of the text form, the printer, the verifier, the interpreter, autodiff, fusion
 * and codegen all switch over this table, so adding an op starts here and the compiler
 * warns (-Wswitch) wherever it is not yet handled.
 *
 * Composite layers (softmax, layer norm, cross-entropy, GELU, attention, dropout, batch
 * norm, convolution) are expansions into primitive ops, so autodiff and fusion see through
 * them. The one exception is attention, which the attention pass (passes/fuse_attention.c)
 * replaces by the fused attention ops below once the frontend's expansion is recognised,
 * so that no [T, S] tensor of scores or probabilities is planned. Elementwise ops take operands of identical shape and dtype;
 * broadcasting is explicit (reshape + expand), inserted by the builder (ir/build.c).
 *
 * Semantics, per op (x, y, c: operands; out: the node; shapes are the node's shape):
 *   input            a named graph input (training data); name = input name
 *   param            a named parameter or buffer; name = PyTorch state_dict key;
 *                    attrs [init kind, trainable 0/1], fattr = init arguments
 *   const            every element = fattr[0] (usually rank 0, then expanded)
 *   iota             out[i0..ir] = i_axis (attrs [axis]); arange is iota of rank 1
 *   loss_scale       the step's loss scale S, an f32 scalar (rank 0) that the training
 *                    program passes in (kiln_step_io.loss_scale): fp16 training seeds the
 *                    backward pass with it instead of 1 (docs/precision.md), so every
 *                    gradient comes out multiplied by S; it has no gradient of its own
 *   random_uniform   counter-based uniform [0,1): element e of out =
 *                    rng_uniform(seed, step, attrs[0] = stream, e) (util/rng.h)
 *   neg abs sign exp log sqrt tanh sigmoid relu
 *                    elementwise maths; relu(x) = x > 0 ? x : 0 (NaN stays NaN); sign(0) = 0
 *   erf sin cos floor
 *                    the error function (exact GELU), sine and cosine (rotary embeddings),
 *                    and floor (integer // and %: through f64, exact below 2^53); floor's
 *                    gradient is zero
 *   not              logical not of a bool
 *   detach           identity whose gradient is zero (stop_gradient): marks values that
 *                    only stabilise a computation, such as softmax's max shift
 *   cast             convert to the node's dtype (floats to ints truncate toward zero;
 *                    to bool is x != 0; to u8/i32 wraps like C's conversion of i64)
 *   add sub mul div max min pow
 *                    elementwise arithmetic, same dtype in and out
 *   eq ne lt le gt ge
 *                    elementwise comparison; out dtype bool
 *   and or           elementwise logic on bool
 *   where            out = c ? x : y (c bool; x, y same dtype)
 *   reduce_sum reduce_max
 *                    reduce over the axes in bitmask attrs[0]; the reduced axes stay with
 *                    size 1 (keepdim), so the inverse is a plain expand. reduce_max may
 *                    carry attrs[1] = 1 (`first`): its gradient goes to the first maximal
 *                    element (row-major over the reduced axes), not split among ties
 *   argmax           index of the first maximum along axis attrs[0]; keepdim; dtype i64
 *   reshape          same elements in row-major order, the node's shape
 *   expand           broadcast size-1 dims to the node's shape (same rank)
 *   permute          out.shape[i] = x.shape[perm[i]], attrs = perm
 *   slice            attrs [axis, start, end, step]; end = IR_SLICE_END means "to the end"
 *   concat           variadic; attrs [axis]
 *   pad              attrs [lo_0..lo_{r-1}, hi_0..hi_{r-1}], fill value fattr[0]
 *   check_index      out = x (an integer tensor) when every element is in [0, limit), attrs
 *                    [limit]; otherwise the step stops with an error naming the node's
 *                    name (what is indexed, e.g. "Embedding 'emb'") and location. Every
 *                    gather index and one-hot class goes through one, so a computed index
 *                    can never read or write out of bounds (simplify drops the provable ones)
 *   gather           table[N, R...], idx int[I...] -> out[I..., R...] = table[idx[I...], R...]
 *   scatter_add      idx int[I...], src[I..., R...] -> out[N, R...], zero then
 *                    out[idx[I...], R...] += src[I..., R...]  (the adjoint of gather)
 *   matmul           x[..., M, K] @ y[..., K, N] -> out[..., M, N]; batch dims identical
 *   unfold           x[N, C, H, W] -> out[N, C*KH*KW, OH*OW] (PyTorch F.unfold order: row
 *                    c*KH*KW + i*KW + j, column oh*OW + ow); attrs [KH, KW, SH, SW, DH, DW];
 *                    no padding (pad first); OH = (H - DH*(KH-1) - 1) / SH + 1
 *   fold             the adjoint of unfold: x[N, C*KH*KW, OH*OW] -> out[N, C, H, W] (the
 *                    node's shape), overlapping windows summed; same attrs
 *   attention        q[..., H, T, D], k[..., KV, S, D], v[..., KV, S, DV] [, mask[..., H, T, S]]
 *                    -> out[..., H, T, DV] = dropout(softmax(q kᵀ · scale + mask)) v, query
 *                    head h reading key/value head h / (H / KV); attrs [mask kind (AttnMask),
 *                    dropout stream], fattr [scale, dropout rate]. Masks: causal keeps key
 *                    s <= query t (no operand), keep/drop a bool (true keeps/drops: -inf),
 *                    add a float added to the scaled scores. Dropout as the unfused graph's:
 *                    element ((b·H + h)·T + t)·S + s of random_uniform(stream) >= rate keeps
 *                    the probability, times 1 / (1 - rate). A row with every key masked is NaN
 *   attention_lse    the same operands and attrs -> [..., H, T, 1]: each row's log-sum-exp
 *                    of its masked, scaled scores (what the backward recomputes P from)
 *   attention_grad   q, k, v [, mask], out, lse, dout -> the gradient of the attention's
 *                    loss with respect to q, k, v or an added mask (attrs [mask kind, stream,
 *                    which: 0 q, 1 k, 2 v, 3 the mask], fattr as attention), its shape that
 *                    operand's; out and lse
 *                    the attention's and its attention_lse's values, dout out's gradient.
 *                    The three of one attention are computed by one kernel
 */
#ifndef KILN_IR_OPS_H
#define KILN_IR_OPS_H

/* Op flags. */
#define OPF_LEAF 0x01      /* no operands */
#define OPF_UNARY 0x02     /* elementwise, one operand */
#define OPF_BINARY 0x04    /* elementwise, two operands of identical shape and dtype */
#define OPF_COMPARE 0x08   /* result dtype is bool */
#define OPF_REDUCE 0x10    /* reduction with keepdim */
#define OPF_SHAPE 0x20     /* moves data without arithmetic */
#define OPF_FLOAT 0x40     /* operands must be floating point */
#define OPF_LOGIC 0x80     /* operands must be bool */
#define OPF_RANDOM 0x100   /* depends on the (seed, step) of the run */

/* How an op's integer/float attributes are laid out and printed. */
typedef enum {
    ATTRS_NONE,
    ATTRS_INPUT,   /* name only */
    ATTRS_PARAM,   /* name, [init kind, trainable], fattr = init args */
    ATTRS_CONST,   /* fattr[0] = value */
    ATTRS_AXIS,    /* [axis] */
    ATTRS_AXES,    /* [bitmask of axes] */
    ATTRS_PERM,    /* [perm_0 .. perm_{r-1}] */
    ATTRS_SLICE,   /* [axis, start, end, step] */
    ATTRS_PAD,     /* [lo.., hi..], fattr[0] = value */
    ATTRS_WINDOW,  /* [KH, KW, SH, SW, DH, DW] */
    ATTRS_STREAM,  /* [stream] */
    ATTRS_LIMIT,   /* [limit] */
    ATTRS_ATTENTION, /* [mask kind, stream], fattr = [scale, dropout] */
    ATTRS_ATTENTION_GRAD, /* [mask kind, stream, which], fattr = [scale, dropout] */
} OpAttrs;

/* An attention's mask (attention ops' attrs[0]; runtime/kiln_attention.h's KILN_ATTN_*). */
typedef enum {
    ATTN_MASK_NONE,
    ATTN_MASK_CAUSAL, /* key s <= query t, no operand */
    ATTN_MASK_KEEP,   /* a bool operand: true keeps the position */
    ATTN_MASK_DROP,   /* a bool operand: true drops it (masked_fill) */
    ATTN_MASK_ADD,    /* a float operand added to the scaled scores */
    ATTN_MASK_COUNT
} AttnMask;

#define KILN_OPS(OP)                                                            \
    OP(INPUT, "input", 0, OPF_LEAF, ATTRS_INPUT)                                \
    OP(PARAM, "param", 0, OPF_LEAF, ATTRS_PARAM)                                \
    OP(CONST, "const", 0, OPF_LEAF, ATTRS_CONST)                                \
    OP(IOTA, "iota", 0, OPF_LEAF, ATTRS_AXIS)                                   \
    OP(RANDOM_UNIFORM, "random_uniform", 0, OPF_LEAF | OPF_RANDOM, ATTRS_STREAM) \
    OP(LOSS_SCALE, "loss_scale", 0, OPF_LEAF, ATTRS_NONE)                       \
    OP(NEG, "neg", 1, OPF_UNARY, ATTRS_NONE)                                    \
    OP(ABS, "abs", 1, OPF_UNARY, ATTRS_NONE)                                    \
    OP(SIGN, "sign", 1, OPF_UNARY, ATTRS_NONE)                                  \
    OP(EXP, "exp", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                        \
    OP(LOG, "log", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                        \
    OP(SQRT, "sqrt", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                      \
    OP(TANH, "tanh", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                      \
    OP(SIGMOID, "sigmoid", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                \
    OP(RELU, "relu", 1, OPF_UNARY, ATTRS_NONE)                                  \
    OP(ERF, "erf", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                        \
    OP(SIN, "sin", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                        \
    OP(COS, "cos", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                        \
    OP(FLOOR, "floor", 1, OPF_UNARY | OPF_FLOAT, ATTRS_NONE)                    \
    OP(NOT, "not", 1, OPF_UNARY | OPF_LOGIC, ATTRS_NONE)                        \
    OP(DETACH, "detach", 1, OPF_UNARY, ATTRS_NONE)                              \
    OP(CAST, "cast", 1, OPF_UNARY, ATTRS_NONE)                                  \
    OP(ADD, "add", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(SUB, "sub", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(MUL, "mul", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(DIV, "div", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(MAX, "max", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(MIN, "min", 2, OPF_BINARY, ATTRS_NONE)                                   \
    OP(POW, "pow", 2, OPF_BINARY | OPF_FLOAT, ATTRS_NONE)                       \
    OP(EQ, "eq", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(NE, "ne", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(LT, "lt", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(LE, "le", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(GT, "gt", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(GE, "ge", 2, OPF_BINARY | OPF_COMPARE, ATTRS_NONE)                       \
    OP(AND, "and", 2, OPF_BINARY | OPF_LOGIC, ATTRS_NONE)                       \
    OP(OR, "or", 2, OPF_BINARY | OPF_LOGIC, ATTRS_NONE)                         \
    OP(ROUND_STOCHASTIC, "round_stochastic", 2, OPF_BINARY, ATTRS_NONE)         \
    OP(WHERE, "where", 3, 0, ATTRS_NONE)                                        \
    OP(REDUCE_SUM, "reduce_sum", 1, OPF_REDUCE, ATTRS_AXES)                     \
    OP(REDUCE_MAX, "reduce_max", 1, OPF_REDUCE, ATTRS_AXES)                     \
    OP(ARGMAX, "argmax", 1, OPF_REDUCE, ATTRS_AXIS)                             \
    OP(RESHAPE, "reshape", 1, OPF_SHAPE, ATTRS_NONE)                            \
    OP(EXPAND, "expand", 1, OPF_SHAPE, ATTRS_NONE)                              \
    OP(PERMUTE, "permute", 1, OPF_SHAPE, ATTRS_PERM)                            \
    OP(SLICE, "slice", 1, OPF_SHAPE, ATTRS_SLICE)                               \
    OP(CONCAT, "concat", -1, OPF_SHAPE, ATTRS_AXIS)                             \
    OP(PAD, "pad", 1, OPF_SHAPE, ATTRS_PAD)                                     \
    OP(CHECK_INDEX, "check_index", 1, 0, ATTRS_LIMIT)                           \
    OP(GATHER, "gather", 2, 0, ATTRS_NONE)                                      \
    OP(SCATTER_ADD, "scatter_add", 2, 0, ATTRS_NONE)                            \
    OP(MATMUL, "matmul", 2, OPF_FLOAT, ATTRS_NONE)                              \
    OP(UNFOLD, "unfold", 1, OPF_SHAPE, ATTRS_WINDOW)                            \
    OP(FOLD, "fold", 1, 0, ATTRS_WINDOW)                                        \
    OP(ATTENTION, "attention", -1, OPF_FLOAT | OPF_RANDOM, ATTRS_ATTENTION)     \
    OP(ATTENTION_LSE, "attention_lse", -1, OPF_FLOAT, ATTRS_ATTENTION)          \
    OP(ATTENTION_GRAD, "attention_grad", -1, OPF_FLOAT | OPF_RANDOM, ATTRS_ATTENTION_GRAD)

typedef enum {
#define OP_ENUM(e, name, arity, flags, attrs) OP_##e,
    KILN_OPS(OP_ENUM)
#undef OP_ENUM
    OP_COUNT
} Op;

typedef struct {
    const char *name;
    int arity;
    unsigned flags;
    OpAttrs attrs;
} OpInfo;

extern const OpInfo ir_op_info[OP_COUNT];

#endif
