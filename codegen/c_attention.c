/* c_attention.c — the C target's fused attention kernels: one function per kernel of the
 * attention ops (ir/ops.h; fusion puts an attention's output and log-sum-exp in one kernel,
 * its three gradients in another), calling runtime/kiln_attention.h with the attention's
 * sizes and contiguous strides. An output no kernel reads is passed as NULL: the runtime
 * skips it (the log-sum-exp of an evaluation step, the gradient of an operand that needs
 * none). */
#include <string.h>

#include "c_internal.h"

bool cg_is_attention(Op op) { return op == OP_ATTENTION || op == OP_ATTENTION_LSE || op == OP_ATTENTION_GRAD; }

/* Strides in elements over (batch, head, row, column) of a contiguous [..., heads, rows,
 * cols] tensor: "{heads * rows * cols, rows * cols, cols, 1}". */
static void put_strides(StrBuf *o, const Graph *g, Dim heads, Dim rows, Dim cols)
{
    sb_puts(o, "{");
    cg_dim(o, g, heads);
    sb_puts(o, " * ");
    cg_dim(o, g, rows);
    sb_puts(o, " * ");
    cg_dim(o, g, cols);
    sb_puts(o, ", ");
    cg_dim(o, g, rows);
    sb_puts(o, " * ");
    cg_dim(o, g, cols);
    sb_puts(o, ", ");
    cg_dim(o, g, cols);
    sb_puts(o, ", 1}");
}

void cg_attention_struct(Cg *c, NodeId id, const char *mask_var)
{
    const Graph *g = c->g;
    StrBuf *o = c->o;
    const Node *n = N(c, id);
    const int64_t *at = ir_attrs(g, id);
    const Node *q = N(c, ir_input(g, id, 0)), *k = N(c, ir_input(g, id, 1)), *v = N(c, ir_input(g, id, 2));
    const int r = q->shape.rank;
    const Dim H = q->shape.d[r - 3], KV = k->shape.d[r - 3], T = q->shape.d[r - 2], S = k->shape.d[r - 2], D = q->shape.d[r - 1],
              DV = v->shape.d[r - 1];
    static const char *const masks[ATTN_MASK_COUNT] = {"KILN_ATTN_NONE", "KILN_ATTN_CAUSAL", "KILN_ATTN_KEEP", "KILN_ATTN_DROP", "KILN_ATTN_ADD"};
    sb_puts(o, "    const kiln_attention a = {.B = ");
    for (int i = 0; i < r - 3; i++) {
        if (i) sb_puts(o, " * ");
        cg_dim(o, g, q->shape.d[i]);
    }
    if (r == 3) sb_puts(o, "1");
    sb_puts(o, ", .H = ");
    cg_dim(o, g, H);
    sb_puts(o, ", .kv_heads = ");
    cg_dim(o, g, KV);
    sb_puts(o, ", .T = ");
    cg_dim(o, g, T);
    sb_puts(o, ", .S = ");
    cg_dim(o, g, S);
    sb_puts(o, ", .D = ");
    cg_dim(o, g, D);
    sb_puts(o, ", .DV = ");
    cg_dim(o, g, DV);
    sb_puts(o, ",\n                              .q_st = ");
    put_strides(o, g, H, T, D);
    sb_puts(o, ", .k_st = ");
    put_strides(o, g, KV, S, D);
    sb_puts(o, ", .v_st = ");
    put_strides(o, g, KV, S, DV);
    sb_puts(o, ", .o_st = ");
    put_strides(o, g, H, T, DV);
    sb_puts(o, ",\n                              .scale = ");
    cg_literal(o, n->fattr[0], DT_F32);
    sb_printf(o, ", .mask = %s", at[0] >= 0 && at[0] < ATTN_MASK_COUNT ? masks[at[0]] : "KILN_ATTN_NONE");
    if (at[0] == ATTN_MASK_KEEP || at[0] == ATTN_MASK_DROP) sb_printf(o, ", .mask_bool = %s", mask_var);
    if (at[0] == ATTN_MASK_ADD) sb_printf(o, ", .mask_add = %s", mask_var);
    if (at[0] == ATTN_MASK_KEEP || at[0] == ATTN_MASK_DROP || at[0] == ATTN_MASK_ADD) {
        sb_puts(o, ", .mask_st = ");
        put_strides(o, g, H, T, S);
    }
    if (n->fattr[1] > 0) {
        sb_puts(o, ",\n                              .dropout = ");
        cg_literal(o, n->fattr[1], DT_F32);
        sb_printf(o, ", .seed = seed, .step = step, .stream = %lld", (long long)at[1]);
    }
    sb_puts(o, "};\n");
}

/* The member of kernel k that is op (attention_grad: of operand `which`), or IR_NONE. */
static NodeId member(const Cg *c, int32_t k, Op op, int which)
{
    const Kernel *K = &c->fp.kernels[k];
    for (int32_t i = 0; i < K->count; i++) {
        const NodeId m = c->fp.members[K->first + i];
        if (N(c, m)->op == op && (op != OP_ATTENTION_GRAD || ir_attrs(c->g, m)[2] == which)) return m;
    }
    return IR_NONE;
}

static const char *const operand_names[7] = {"q", "k", "v", "mask", "lse", "dout", "delta"};

/* The name of operand j of an attention op with or without a mask operand. */
static const char *operand_name(bool has_mask, uint32_t j) { return operand_names[!has_mask && j >= 3 ? j + 1 : j]; }

void cg_emit_attention_kernel(Cg *c, int32_t k, void (*name)(Cg *c, NodeId id, StrBuf *b))
{
    const NodeId id = c->fp.kernels[k].anchor;
    const Node *n = N(c, id);
    const Graph *g = c->g;
    StrBuf *o = c->o;
    const bool grad = n->op == OP_ATTENTION_GRAD, has_mask = grad ? n->ninputs == 7 : n->ninputs == 4;
    const size_t start = o->len;
    cg_single_comment(c, id);
    sb_puts(o, "KILN_KERNEL void ");
    name(c, id, o);
    sb_puts(o, "(const int64_t *s");
    for (uint32_t j = 0; j < n->ninputs; j++)
        sb_printf(o, ", const %s *restrict %s", cg_ctype((DType)N(c, ir_input(g, id, (int)j))->dtype), operand_name(has_mask, j));
    if (n->fattr[1] > 0) sb_puts(o, ", uint64_t seed, uint64_t step");
    if (grad) sb_puts(o, ", float *restrict dq, float *restrict dk, float *restrict dv");
    else sb_puts(o, ", float *restrict out, float *restrict lse");
    sb_puts(o, ")\n{\n");
    cg_declare_syms(c, id);
    cg_attention_struct(c, id, "mask");
    if (grad) {
        sb_puts(o, "    kiln_attention_bwd(&a, q, k, v, lse, dout, delta, dq, dk, dv);\n");
    } else {
        sb_puts(o, "    kiln_attention_fwd(&a, q, k, v, out, lse);\n");
    }
    sb_puts(o, "}\n\n");
    cg_prune_unused(o, start, false);
}

void cg_emit_attention_call(Cg *c, int32_t k, void (*name)(Cg *c, NodeId id, StrBuf *b))
{
    const NodeId id = c->fp.kernels[k].anchor;
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_puts(o, "    ");
    name(c, id, o);
    sb_puts(o, "(io->syms");
    for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, ", v%d", ir_input(c->g, id, (int)j));
    if (n->fattr[1] > 0) sb_puts(o, ", io->seed, io->step");
    const bool grad = n->op == OP_ATTENTION_GRAD;
    for (int w = 0; w < (grad ? 3 : 2); w++) {
        const NodeId m = member(c, k, grad ? OP_ATTENTION_GRAD : w ? OP_ATTENTION_LSE : OP_ATTENTION, w);
        if (m == IR_NONE || !c->fp.stored[m]) sb_puts(o, ", NULL");
        else sb_printf(o, ", v%d", m);
    }
    sb_printf(o, "); KILN_MARK(io, %d);", k);
    if (n->name) sb_printf(o, " /* %s */", ir_node_name(c->g, id));
    sb_putc(o, '\n');
}
