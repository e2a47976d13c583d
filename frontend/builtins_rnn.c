/* builtins_rnn.c — the recurrent built-in modules, LSTM and GRU, as torch.nn's: unrolled
 * over a fixed sequence length from zero states, PyTorch's gate order and parameter names
 * (weight_ih_l0, ..._reverse), so a state_dict moves between Kiln and PyTorch. Split from
 * builtins.c, whose table names them. */
#include "builtins_args.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- LSTM, GRU: unrolled over a fixed sequence length, PyTorch's gates and names ---- */

static bool rnn_lstm(Lower *L, int32_t inst) { return I(L, inst)->type[0] == 'L'; }

static bool rnn_args(Lower *L, int32_t inst, AstId at, int64_t *in, int64_t *hid, int64_t *layers, bool *bias, bool *bf, double *p,
                     int *dirs)
{
    bool bidir;
    if (!arg_int(L, inst, 0, at, 1, MAXD, in) || !arg_int(L, inst, 1, at, 1, MAXD, hid) || !arg_int(L, inst, 2, at, 1, 64, layers) ||
        !arg_bool(L, inst, 3, at, bias) || !arg_bool(L, inst, 4, at, bf) || !arg_num(L, inst, 5, at, 0, 1, p) ||
        !arg_bool(L, inst, 6, at, &bidir))
        return false;
    *dirs = bidir ? 2 : 1;
    return true;
}

/* The name of one of layer l's parameters in direction d (1: PyTorch's "_reverse"). */
static void rnn_name(char *buf, size_t n, const char *what, int64_t l, int d)
{
    snprintf(buf, n, "%s_l%lld%s", what, (long long)l, d ? "_reverse" : "");
}

bool builtin_rnn_create(Lower *L, int32_t inst, AstId at)
{
    int64_t in, hid, layers;
    bool bias, bf;
    double p;
    int dirs;
    if (!rnn_args(L, inst, at, &in, &hid, &layers, &bias, &bf, &p, &dirs)) return false;
    int64_t g = rnn_lstm(L, inst) ? 4 : 3;
    double bound = 1.0 / sqrt((double)hid); /* every weight and bias ~ U(-1/sqrt(H), 1/sqrt(H)) */
    static const char *const what[4] = {"weight_ih", "weight_hh", "bias_ih", "bias_hh"};
    for (int64_t l = 0; l < layers; l++)
        for (int d = 0; d < dirs; d++) /* PyTorch's order: a layer's forward parameters, then its _reverse ones */
            for (int k = 0; k < (bias ? 4 : 2); k++) {
                char name[64];
                rnn_name(name, sizeof name, what[k], l, d);
                Shape s = k == 0 ? shape2(g * hid, l ? dirs * hid : in) : k == 1 ? shape2(g * hid, hid) : shape1(g * hid);
                if (lower_param(L, inst, name, &s, INIT_UNIFORM, -bound, bound, true, at) == IR_NONE) return false;
            }
    return true;
}

static NodeId cols(IrBuilder *b, NodeId x, int64_t from, int64_t to) { return x == IR_NONE ? IR_NONE : ir_b_slice(b, x, 1, from, to, 1); }
static NodeId add2(IrBuilder *b, NodeId x, NodeId y) { return x == IR_NONE || y == IR_NONE ? IR_NONE : ir_b_binary(b, OP_ADD, x, y); }
static NodeId mul2(IrBuilder *b, NodeId x, NodeId y) { return x == IR_NONE || y == IR_NONE ? IR_NONE : ir_b_binary(b, OP_MUL, x, y); }
static NodeId act1(IrBuilder *b, Op op, NodeId x) { return x == IR_NONE ? IR_NONE : ir_b_unary(b, op, x); }

/* One direction d of layer l over x [N, T, In] from zero states: the outputs [N, T, H] (step
 * t's at position t, also in reverse, where the steps run from T - 1 down to 0), and the
 * final h and c [1, N, H] (the reverse direction's are those after step 0). outs holds T. */
static NodeId rnn_direction(Lower *L, int32_t inst, NodeId x, int64_t l, int d, int64_t T, int64_t hid, Dim n, NodeId *outs,
                            NodeId *h_last, NodeId *c_last)
{
    IrBuilder *b = &L->b;
    bool lstm = rnn_lstm(L, inst);
    int64_t g = lstm ? 4 : 3;
    char name[64];
    rnn_name(name, sizeof name, "weight_ih", l, d);
    NodeId wih = member_node(L, inst, name);
    rnn_name(name, sizeof name, "weight_hh", l, d);
    NodeId whh = member_node(L, inst, name);
    rnn_name(name, sizeof name, "bias_ih", l, d);
    NodeId bih = member_node(L, inst, name);
    rnn_name(name, sizeof name, "bias_hh", l, d);
    NodeId bhh = member_node(L, inst, name);
    Dim hd[2] = {n, ir_dim_const(hid)}, h3d[3] = {n, ir_dim_const(1), ir_dim_const(hid)};
    Dim s3d[3] = {ir_dim_const(1), n, ir_dim_const(hid)}, gd[2] = {n, ir_dim_const(g * hid)};
    Shape hs = ir_shape_make(2, hd), h3 = ir_shape_make(3, h3d), s3 = ir_shape_make(3, s3d), gs = ir_shape_make(2, gd);
    NodeId xw = comp_linear(b, x, wih, bih); /* [N, T, G*H], every step at once */
    NodeId h = ir_b_full(b, 0.0, DT_F32, &hs), c = h;
    for (int64_t k = 0; k < T && xw != IR_NONE && h != IR_NONE; k++) {
        int64_t t = d ? T - 1 - k : k;
        NodeId xt = ir_b_slice(b, xw, 1, t, t + 1, 1);
        xt = xt == IR_NONE ? IR_NONE : ir_b_reshape(b, xt, &gs);
        NodeId hw = comp_linear(b, h, whh, bhh);
        if (lstm) { /* gates i, f, g, o */
            NodeId gt = add2(b, xt, hw);
            NodeId ig = act1(b, OP_SIGMOID, cols(b, gt, 0, hid)), fg = act1(b, OP_SIGMOID, cols(b, gt, hid, 2 * hid));
            NodeId gg = act1(b, OP_TANH, cols(b, gt, 2 * hid, 3 * hid)), og = act1(b, OP_SIGMOID, cols(b, gt, 3 * hid, 4 * hid));
            c = add2(b, mul2(b, fg, c), mul2(b, ig, gg));
            h = mul2(b, og, act1(b, OP_TANH, c));
        } else { /* gates r, z, n: n = tanh(x_n + r (W_hn h + b_hn)), h = (1 - z) n + z h */
            NodeId rg = act1(b, OP_SIGMOID, add2(b, cols(b, xt, 0, hid), cols(b, hw, 0, hid)));
            NodeId zg = act1(b, OP_SIGMOID, add2(b, cols(b, xt, hid, 2 * hid), cols(b, hw, hid, 2 * hid)));
            NodeId ng = act1(b, OP_TANH, add2(b, cols(b, xt, 2 * hid, 3 * hid), mul2(b, rg, cols(b, hw, 2 * hid, 3 * hid))));
            NodeId omz = zg == IR_NONE ? IR_NONE : comp_scalar_op(b, OP_SUB, zg, 1.0, true);
            h = add2(b, mul2(b, omz, ng), mul2(b, zg, h));
        }
        outs[t] = h == IR_NONE ? IR_NONE : ir_b_reshape(b, h, &h3);
        if (outs[t] == IR_NONE) h = IR_NONE;
    }
    if (xw == IR_NONE || h == IR_NONE || (lstm && c == IR_NONE)) return IR_NONE;
    *h_last = ir_b_reshape(b, h, &s3);
    *c_last = lstm ? ir_b_reshape(b, c, &s3) : IR_NONE;
    if (*h_last == IR_NONE || (lstm && *c_last == IR_NONE)) return IR_NONE;
    return ir_b_concat(b, outs, (int)T, 1); /* [N, T, H] */
}

/* m(x) -> (output, (h_n, c_n)) for LSTM, (output, h_n) for GRU, from zero initial states:
 * x [T, N, I] (or [N, T, I] with batch_first), output [T, N, D*H], h_n [D*layers, N, H]
 * (D = 2 with bidirectional: each layer's output is its forward and reverse outputs
 * concatenated on the last axis, h_n and c_n hold layer l's forward state at 2l and its
 * reverse state at 2l + 1, as PyTorch). */
Value builtin_rnn_apply(Lower *L, int32_t inst, const Value *args, int nargs, AstId at)
{
    NodeId x = one_input(L, inst, args, nargs, at);
    if (x == IR_NONE) return value_error();
    int64_t in, hid, layers;
    bool bias, bf, lstm = rnn_lstm(L, inst);
    double p;
    int dirs;
    rnn_args(L, inst, at, &in, &hid, &layers, &bias, &bf, &p, &dirs);
    Shape xs = L->g->nodes[x].shape;
    int ta = bf ? 1 : 0;
    if (xs.rank != 3 || !ir_dim_eq(xs.d[2], ir_dim_const(in)) || !ir_dim_is_const(xs.d[ta]) || xs.d[ta].k > 4096) {
        StrBuf t;
        sb_init(&t);
        ir_shape_format(&t, L->g, &xs);
        lower_error(L, at, "%s '%s' expects %s with a fixed sequence length T (at most 4096), found %s", I(L, inst)->type,
                    I(L, inst)->path, bf ? "[N, T, input_size]" : "[T, N, input_size]", t.data);
        sb_free(&t);
        return value_error();
    }
    IrBuilder *b = &L->b;
    if (!ir_dtype_is_float((DType)L->g->nodes[x].dtype)) x = ir_b_cast(b, x, DT_F32);
    if (!bf && x != IR_NONE) x = ir_b_transpose(b, x, 0, 1); /* [N, T, I] */
    if (x == IR_NONE) return lower_builder_error(L, at);
    int64_t T = xs.d[ta].k;
    Dim n = xs.d[bf ? 0 : 1];
    NodeId *outs = xmalloc(sizeof(NodeId) * (size_t)T);
    NodeId hn[128], cn[128];
    Value r = value_error();
    for (int64_t l = 0; l < layers; l++) {
        NodeId y[2];
        for (int d = 0; d < dirs; d++) {
            y[d] = rnn_direction(L, inst, x, l, d, T, hid, n, outs, &hn[l * dirs + d], &cn[l * dirs + d]);
            if (y[d] == IR_NONE) goto done;
        }
        x = dirs == 1 ? y[0] : ir_b_concat(b, y, 2, 2); /* [N, T, D*H] */
        if (x == IR_NONE) goto done;
        if (l + 1 < layers) x = comp_dropout(b, x, p, L->g->mode == MODE_TRAIN); /* between layers, as PyTorch */
        if (x == IR_NONE) goto done;
    }
    {
        NodeId out = bf ? x : ir_b_transpose(b, x, 0, 1);
        int nstates = (int)(layers * dirs);
        NodeId h_n = ir_b_concat(b, hn, nstates, 0), c_n = lstm ? ir_b_concat(b, cn, nstates, 0) : IR_NONE;
        if (out == IR_NONE || h_n == IR_NONE || (lstm && c_n == IR_NONE)) goto done;
        r = (Value){.kind = V_TUPLE, .node = IR_NONE, .count = 2};
        Value second = value_tensor(h_n);
        if (lstm) {
            second = (Value){.kind = V_TUPLE, .node = IR_NONE, .idx = L->nseq, .count = 2};
            GROW(L->seq, L->seq_cap, L->nseq + 2);
            L->seq[L->nseq++] = value_tensor(h_n);
            L->seq[L->nseq++] = value_tensor(c_n);
        }
        r.idx = L->nseq;
        GROW(L->seq, L->seq_cap, L->nseq + 2);
        L->seq[L->nseq++] = value_tensor(out);
        L->seq[L->nseq++] = second;
    }
done:
    free(outs);
    return r.kind == V_ERROR ? lower_builder_error(L, at) : r;
}

