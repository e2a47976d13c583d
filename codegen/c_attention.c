/* c_attention.c — the fused attention kernels' arguments, for both targets, and the C
 * target's kernels. Fusion puts an attention's output and log-sum-exp in one kernel, its
 * gradients in another; each is described to the runtime by a kiln_attention
 * (runtime/kiln_attention_desc.h): the attention's sizes and each operand's strides where
 * it lies (q, k and v in the qkv projection's memory; the output in the permute back to
 * [B, T, H, D]). The C target calls runtime/kiln_attention.h with it; the CUDA target
 * (cuda_attention.c) launches runtime/cuda/kiln_cuda_attention.h's kernels. An output no
 * kernel reads is passed as NULL: the runtime skips it (the log-sum-exp of an evaluation
 * step, the gradient of an operand that needs none). */
#include <stdio.h>
#include <string.h>

#include "c_internal.h"

bool cg_is_attention(Op op) { return op == OP_ATTENTION || op == OP_ATTENTION_LSE || op == OP_ATTENTION_GRAD; }

/* Row-major strides over (batch, head, row, column) of a [..., heads, rows, cols] tensor. */
static void contiguous_strides(const Shape *s, Dim *st)
{
    const int r = s->rank;
    st[3] = ir_dim_const(1);
    for (int a = 2; a >= 0; a--)
        if (!ir_dim_mul(st[a + 1], s->d[r - 3 + a], &st[a])) st[a] = ir_dim_const(0);
    if (r == 3) st[0] = ir_dim_const(0);
}

/* The memory an attention's output is written to: the permute its kernel writes
 * (Kernel.written) by strides, else its own, contiguous. */
static void output_layout(const Cg *c, NodeId o, FusionLayout *L, Dim *st)
{
    const Graph *g = c->g;
    const NodeId wr = c->fp.kernel_of[o] >= 0 ? c->fp.kernels[c->fp.kernel_of[o]].written : IR_NONE;
    bool swapped;
    memset(L, 0, sizeof *L);
    L->base = wr;
    L->rank = g->nodes[o].shape.rank;
    if (wr != IR_NONE && fusion_gemm_output(g, o, wr, L->stride, &swapped) && fusion_attention_operand(g, L, o, false, st)) return;
    L->base = o;
    contiguous_strides(&g->nodes[o].shape, st);
}

/* Where operand j of attention op id lies: its layout (base, offset) and its strides over
 * (batch, head, row, column). Fusion let the kernel read q, k, v, the mask, out and dout by
 * strides (fusion_attention_operand); the rest are stored contiguous. */
static void operand_layout(const Cg *c, NodeId id, int j, FusionLayout *L, Dim *st)
{
    const Graph *g = c->g;
    const NodeId x = ir_input(g, id, j);
    if (g->nodes[x].op == OP_ATTENTION && c->fp.role[x] == ROLE_KERNEL) { /* the backward's out */
        output_layout(c, x, L, st);
        return;
    }
    bool mask;
    if (fusion_layout(g, &c->fp, x, L) && fusion_attention_strided_operand(g, id, j, &mask) && fusion_attention_operand(g, L, x, mask, st))
        return;
    if (!fusion_layout(g, &c->fp, x, L)) { /* a stored value (fusion made it one) */
        memset(L, 0, sizeof *L);
        L->base = x;
    }
    contiguous_strides(&g->nodes[x].shape, st);
}

/* The next field of the struct: a designated initializer (C) or an assignment (C++, whose
 * designators must follow the declaration's order). `wrap`: the C form starts a line. */
static void field(StrBuf *o, bool cxx, bool *first, bool wrap, const char *name)
{
    if (cxx) sb_printf(o, "%s    a.%s = ", *first ? "    kiln_attention a = {};\n" : ";\n", name);
    else sb_printf(o, "%s.%s = ", *first ? "    const kiln_attention a = {" : wrap ? ",\n                              " : ", ", name);
    *first = false;
}

/* A stride field: `{s0, s1, s2, s3}` (C), or its four assignments (C++). */
static void put_strides(StrBuf *o, const Graph *g, bool cxx, bool *first, bool wrap, const char *name, const Dim *st)
{
    if (!cxx) {
        field(o, cxx, first, wrap, name);
        sb_puts(o, "{");
    }
    for (int a = 0; a < 4; a++) {
        if (cxx) {
            char f[16];
            snprintf(f, sizeof f, "%s[%d]", name, a);
            field(o, cxx, first, false, f);
        } else if (a) {
            sb_puts(o, ", ");
        }
        cg_dim(o, g, st[a]);
    }
    if (!cxx) sb_puts(o, "}");
}

void cg_attention_struct(Cg *c, NodeId id, const char *mask_var, bool cxx)
{
    const Graph *g = c->g;
    StrBuf *o = c->o;
    const Node *n = N(c, id);
    const int64_t *at = ir_attrs(g, id);
    const Node *q = N(c, ir_input(g, id, 0)), *k = N(c, ir_input(g, id, 1)), *v = N(c, ir_input(g, id, 2));
    const int r = q->shape.rank;
    const bool grad = n->op == OP_ATTENTION_GRAD, has_mask = at[0] == ATTN_MASK_KEEP || at[0] == ATTN_MASK_DROP || at[0] == ATTN_MASK_ADD;
    static const char *const masks[ATTN_MASK_COUNT] = {"KILN_ATTN_NONE", "KILN_ATTN_CAUSAL", "KILN_ATTN_KEEP", "KILN_ATTN_DROP", "KILN_ATTN_ADD"};
    bool first = true;
    field(o, cxx, &first, false, "B");
    for (int i = 0; i < r - 3; i++) {
        if (i) sb_puts(o, " * ");
        cg_dim(o, g, q->shape.d[i]);
    }
    if (r == 3) sb_puts(o, "1");
    static const char *const fields[] = {"H", "T", "D", "kv_heads", "S"};
    const Dim dims[] = {q->shape.d[r - 3], q->shape.d[r - 2], q->shape.d[r - 1], k->shape.d[r - 3], k->shape.d[r - 2]};
    for (int i = 0; i < 5; i++) {
        field(o, cxx, &first, false, fields[i]);
        cg_dim(o, g, dims[i]);
    }
    field(o, cxx, &first, false, "DV");
    cg_dim(o, g, v->shape.d[r - 1]);
    /* the strides of q, k, v and (forward) out or (backward) dout */
    static const char *const st_names[] = {"q_st", "k_st", "v_st"};
    FusionLayout L;
    Dim st[4];
    for (int j = 0; j < 3; j++) {
        operand_layout(c, id, j, &L, st);
        put_strides(o, g, cxx, &first, true, st_names[j], st);
    }
    if (grad) operand_layout(c, id, (int)n->ninputs - 3, &L, st); /* out, as the forward wrote it */
    else output_layout(c, id, &L, st);
    put_strides(o, g, cxx, &first, false, "o_st", st);
    if (grad) {
        operand_layout(c, id, (int)n->ninputs - 1, &L, st);
        put_strides(o, g, cxx, &first, false, "do_st", st);
    }
    if (grad) { /* dq, dk, dv: the kernel's own, contiguous in q's, k's, v's shapes */
        static const char *const d_names[] = {"dq_st", "dk_st", "dv_st"};
        for (int j = 0; j < 3; j++) {
            Dim ds[4];
            contiguous_strides(&N(c, ir_input(g, id, j))->shape, ds);
            put_strides(o, g, cxx, &first, true, d_names[j], ds);
        }
    }
    field(o, cxx, &first, true, "scale");
    cg_literal(o, n->fattr[0], DT_F32);
    field(o, cxx, &first, false, "mask");
    sb_puts(o, at[0] >= 0 && at[0] < ATTN_MASK_COUNT ? masks[at[0]] : "KILN_ATTN_NONE");
    if (has_mask) {
        operand_layout(c, id, 3, &L, st);
        field(o, cxx, &first, false, at[0] == ATTN_MASK_ADD ? "mask_add" : "mask_bool");
        sb_puts(o, mask_var);
        put_strides(o, g, cxx, &first, false, "mask_st", st);
    }
    if (n->fattr[1] > 0) {
        field(o, cxx, &first, true, "dropout");
        cg_literal(o, n->fattr[1], DT_F32);
        field(o, cxx, &first, false, "seed");
        sb_puts(o, "seed");
        field(o, cxx, &first, false, "step");
        sb_puts(o, "step");
        field(o, cxx, &first, false, "stream");
        sb_printf(o, "%lld", (long long)at[1]);
    }
    sb_puts(o, cxx ? ";\n" : "};\n");
}

NodeId cg_attention_operand_base(const Cg *c, NodeId id, int j)
{
    FusionLayout L;
    Dim st[4];
    operand_layout(c, id, j, &L, st);
    return L.base;
}

/* The pointer to operand j's first element: its base's parameter plus the layout's offset. */
void cg_attention_operand_pointer(Cg *c, NodeId id, int j, const char *name)
{
    FusionLayout L;
    Dim st[4];
    operand_layout(c, id, j, &L, st);
    sb_puts(c->o, name);
    for (int t = 0; t < L.nterms; t++) {
        sb_puts(c->o, t ? " + " : " + (");
        cg_dim(c->o, c->g, L.offset[t]);
    }
    if (L.nterms) sb_puts(c->o, ")");
}

/* The member of kernel k that is op (attention_grad: of operand `which`), or IR_NONE. */
NodeId cg_attention_member(const Cg *c, int32_t k, Op op, int which)
{
    const Kernel *K = &c->fp.kernels[k];
    for (int32_t i = 0; i < K->count; i++) {
        const NodeId m = c->fp.members[K->first + i];
        if (N(c, m)->op == op && (op != OP_ATTENTION_GRAD || ir_attrs(c->g, m)[2] == which)) return m;
    }
    return IR_NONE;
}

static const char *const operand_names[7] = {"q", "k", "v", "mask", "out", "lse", "dout"};

/* The name of operand j of an attention op with or without a mask operand. */
const char *cg_attention_operand_name(bool has_mask, uint32_t j) { return operand_names[!has_mask && j >= 3 ? j + 1 : j]; }

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
        sb_printf(o, ", const %s *restrict %s", cg_ctype((DType)N(c, ir_input(g, id, (int)j))->dtype), cg_attention_operand_name(has_mask, j));
    if (n->fattr[1] > 0) sb_puts(o, ", uint64_t seed, uint64_t step");
    const bool added = ir_attrs(g, id)[0] == ATTN_MASK_ADD;
    if (grad) sb_printf(o, ", float *restrict dq, float *restrict dk, float *restrict dv%s", added ? ", float *restrict dmask" : "");
    else sb_puts(o, ", float *restrict out, float *restrict lse");
    sb_puts(o, ")\n{\n");
    cg_declare_syms(c, id);
    if (has_mask) {
        sb_printf(o, "    const %s *mask_at = ", cg_ctype((DType)N(c, ir_input(g, id, 3))->dtype));
        cg_attention_operand_pointer(c, id, 3, "mask");
        sb_puts(o, ";\n");
    }
    cg_attention_struct(c, id, "mask_at", false);
    sb_printf(o, "    kiln_attention_%s(&a", grad ? "bwd" : "fwd");
    for (uint32_t j = 0; j < n->ninputs; j++) {
        if (has_mask && j == 3) continue; /* in the struct */
        sb_puts(o, ", ");
        cg_attention_operand_pointer(c, id, (int)j, cg_attention_operand_name(has_mask, j));
    }
    sb_puts(o, grad ? (added ? ", dq, dk, dv, dmask);\n" : ", dq, dk, dv, NULL);\n") : ", out, lse);\n");
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
    for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, ", v%d", cg_attention_operand_base(c, id, (int)j)); /* the memory each operand's layout reads */
    if (n->fattr[1] > 0) sb_puts(o, ", io->seed, io->step");
    const bool grad = n->op == OP_ATTENTION_GRAD;
    const int outputs = grad ? (ir_attrs(c->g, id)[0] == ATTN_MASK_ADD ? 4 : 3) : 2;
    for (int w = 0; w < outputs; w++) {
        const NodeId m = cg_attention_member(c, k, grad ? OP_ATTENTION_GRAD : w ? OP_ATTENTION_LSE : OP_ATTENTION, w);
        const NodeId wr = c->fp.kernels[k].written;
        if (!grad && !w && wr != IR_NONE) sb_printf(o, ", v%d", wr); /* the output, permuted */
        else if (m == IR_NONE || !c->fp.stored[m]) sb_puts(o, ", NULL");
        else sb_printf(o, ", v%d", m);
    }
    sb_printf(o, "); KILN_MARK(io, %d);", k);
    if (n->name) sb_printf(o, " /* %s */", ir_node_name(c->g, id));
    sb_putc(o, '\n');
}
