/* cuda_attention.c — the CUDA target's fused attention kernels. A kernel of attention ops
 * (fusion: an attention's output and log-sum-exp in one, its gradients in another) becomes
 * model.cu's own __global__ functions, thin wrappers of runtime/cuda/kiln_cuda_attention.h's
 * block functions, so that NVRTC compiles them with the file, the program finds them by
 * name and the emulator runs them as it runs every kernel; and a launcher that describes
 * the attention (c_attention.c's kiln_attention, the same the C target passes: q, k and v
 * read in place where the qkv projection wrote them, the output written permuted) and
 * launches them. The forward splits a long cache's keys in ranges when its rows are few (a
 * decode step), their parts in the step's partials, combined by a second kernel; the
 * backward is two kernels: dK and dV per tile of keys, dQ per tile of queries (no atomics:
 * the same bits every run). */
#include "cuda_internal.h"

#include <stdio.h>
#include <string.h>

/* Dim d as a constant, or -1. */
static int64_t constant(Dim d) { return ir_dim_is_const(d) ? d.k : -1; }

/* The head sizes D and DV of attention op id. */
static void head_sizes(const Cg *c, NodeId id, int64_t *D, int64_t *DV)
{
    const Graph *g = c->g;
    const Shape *q = &g->nodes[ir_input(g, id, 0)].shape, *v = &g->nodes[ir_input(g, id, 2)].shape;
    *D = constant(q->d[q->rank - 1]);
    *DV = constant(v->d[v->rank - 1]);
}

const char *cuda_attention_unsupported(const Cg *c, NodeId id)
{
    const Graph *g = c->g;
    const Node *n = &g->nodes[id];
    for (uint32_t j = 0; j < n->ninputs; j++) {
        const DType t = (DType)g->nodes[ir_input(g, id, (int)j)].dtype;
        if (t != DT_F32 && !(j == 3 && t == DT_BOOL)) return "non-float32 attention";
    }
    int64_t D, DV;
    head_sizes(c, id, &D, &DV);
    if (D < 1 || DV < 1 || D > 128 || DV > 128) return "attention with a head size not a constant up to 128"; /* KILN_ATTN_MAX_HEAD */
    return NULL;
}

static bool has_mask(const Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    return n->op == OP_ATTENTION_GRAD ? n->ninputs == 7 : n->ninputs == 4;
}

static bool added_mask(const Cg *c, NodeId id) { return ir_attrs(c->g, id)[0] == ATTN_MASK_ADD; }

/* `const float *q, const float *k, ...`: the operands, as the launcher takes them. */
static void operand_parameters(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    for (uint32_t j = 0; j < n->ninputs; j++)
        sb_printf(c->o, ", const %s *%s", cg_ctype((DType)N(c, ir_input(c->g, id, (int)j))->dtype), cg_attention_operand_name(has_mask(c, id), j));
}

/* A __global__ wrapper of a block function of kiln_cuda_attention.h. */
static void wrapper(Cg *c, const char *name, const char *suffix, const char *params, const char *call)
{
    sb_printf(c->o, "__global__ void __launch_bounds__(KILN_ATTN_THREADS) %s%s(kiln_attention a, %s)\n{\n    %s;\n}\n\n", name, suffix, params, call);
}

void cuda_emit_attention_kernel(Cg *c, int32_t k, const char *name, const char *site)
{
    const NodeId id = c->fp.kernels[k].anchor;
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    const bool grad = n->op == OP_ATTENTION_GRAD, mask = has_mask(c, id), added = added_mask(c, id);
    int64_t D, DV;
    head_sizes(c, id, &D, &DV);
    const int pairs = (D > DV ? D : DV) <= 32 ? 8 : (D > DV ? D : DV) <= 64 ? 16 : 32; /* kiln_attn_kv_pairs */
    /* a causal forward has as many query tiles as key tiles: never split (kiln_attention_fwd_splits) */
    const bool splittable = !grad && ir_attrs(c->g, id)[0] != ATTN_MASK_CAUSAL;
    cg_single_comment(c, id);
    const char *in = "const float *q, const float *k, const float *v";
    char params[512], call[512];
    if (!grad) {
        sb_printf(o, "/* Launch: one block of KILN_ATTN_THREADS per (batch, head, tile of queries), the keys and\n"
                   " * values in tiles of 32 in shared memory (runtime/cuda/kiln_cuda_attention.h): the\n"
                   " * output and each row's log-sum-exp, no [T, S] tensor.%s */\n",
                  splittable ? " Few rows against many keys (a\n * decode step over its cache): a block per range of keys too, their parts in the step's\n"
                               " * partials, then _combine adds them in order." : "");
        snprintf(params, sizeof params, "%s, float *out, float *lse, float *part, int splits", in);
        wrapper(c, name, "", params, "kiln_attention_fwd_block(a, q, k, v, out, lse, part, splits)");
        if (splittable) wrapper(c, name, "_combine", "const float *part, int splits, float *out, float *lse", "kiln_attention_combine_block(a, part, splits, out, lse)");
    } else {
        sb_puts(o, "/* Launch: dK and dV, one block of KILN_ATTN_THREADS per (batch, key/value head, tile of\n"
                   " * 32 keys), over the queries of the heads sharing them; then dQ, one block per (batch,\n"
                   " * head, tile of queries). Both recompute the probabilities from the log-sum-exp\n"
                   " * (runtime/cuda/kiln_cuda_attention.h). */\n");
        snprintf(params, sizeof params, "%s, const float *out, const float *lse, const float *dout, float *dk, float *dv%s", in,
                 added ? ", float *dmask" : "");
        snprintf(call, sizeof call, "kiln_attention_dkv_block<%d>(a, q, k, v, out, lse, dout, dk, dv, %s)", pairs, added ? "dmask" : "nullptr");
        wrapper(c, name, "", params, call);
        snprintf(params, sizeof params, "%s, const float *out, const float *lse, const float *dout, float *dq", in);
        wrapper(c, name, "_dq", params, "kiln_attention_dq_block(a, q, k, v, out, lse, dout, dq)");
    }
    /* the launcher */
    sb_printf(o, "/* Launches kernel %d on stream: s holds the symbols' values (host memory), the pointers\n"
                 " * are device memory; an output nobody reads is nullptr and not written. */\nvoid %s_launch(const int64_t *s",
              k, name);
    operand_parameters(c, id);
    if (n->fattr[1] > 0) sb_puts(o, ", uint64_t seed, uint64_t step");
    sb_puts(o, grad ? (added ? ", float *dq, float *dk, float *dv, float *dmask" : ", float *dq, float *dk, float *dv")
                    : splittable ? ", float *out, float *lse, void *partials" : ", float *out, float *lse");
    sb_puts(o, ", cudaStream_t stream)\n{\n");
    for (int sy = 0; sy < c->g->nsyms; sy++) sb_printf(o, "    const int64_t %s = s[%d];\n", c->g->syms[sy].name, sy);
    if (mask) {
        sb_printf(o, "    const %s *mask_at = ", cg_ctype((DType)N(c, ir_input(c->g, id, 3))->dtype));
        cg_attention_operand_pointer(c, id, 3, "mask");
        sb_puts(o, ";\n");
    }
    cg_attention_struct(c, id, "mask_at", true);
    /* the operands' first elements, the kernels' arguments after a */
    StrBuf args;
    sb_init(&args);
    StrBuf *saved = c->o;
    c->o = &args;
    for (uint32_t j = 0; j < n->ninputs; j++) {
        if (mask && j == 3) continue; /* in the struct */
        sb_puts(&args, ", ");
        cg_attention_operand_pointer(c, id, (int)j, cg_attention_operand_name(mask, j));
    }
    c->o = saved;
    if (!grad) {
        sb_puts(o, "    const unsigned blocks = kiln_attention_fwd_blocks(&a);\n    if (blocks == 0) return;\n");
        if (!splittable) {
            sb_puts(o, "    KILN_LAUNCH_AT(");
            cg_c_string(o, site);
            sb_printf(o, ", %s, blocks, KILN_ATTN_THREADS, kiln_attention_fwd_smem(&a), stream, a%s, out, lse, nullptr, 1);\n}\n\n", name, args.data);
        } else {
            sb_puts(o, "    const int splits = kiln_attention_fwd_splits(&a, KILN_CUDA_PARTIALS_BYTES); /* key ranges: 1 but for a long cache */\n"
                       "    KILN_LAUNCH_AT(");
            cg_c_string(o, site);
            sb_printf(o, ", %s, blocks * splits, KILN_ATTN_THREADS, kiln_attention_fwd_smem(&a), stream, a%s, out, lse, (float *)partials, splits);\n",
                      name, args.data);
            sb_puts(o, "    if (splits > 1) {\n        KILN_LAUNCH_AT(");
            cg_c_string(o, site);
            sb_printf(o, ", %s_combine, kiln_attention_combine_blocks(&a), KILN_ATTN_THREADS, 0, stream, a, (const float *)partials, splits, out, "
                         "lse);\n    }\n}\n\n",
                      name);
        }
    } else {
        sb_printf(o, "    const unsigned kv_blocks = kiln_attention_dkv_blocks(&a), q_blocks = kiln_attention_fwd_blocks(&a);\n"
                     "    if (kv_blocks && (dk || dv%s)) {\n        KILN_LAUNCH_AT(",
                  added ? " || dmask" : "");
        cg_c_string(o, site);
        sb_printf(o, ", %s, kv_blocks, KILN_ATTN_THREADS, kiln_attention_dkv_smem(&a), stream, a%s, dk, dv%s);\n    }\n", name, args.data,
                  added ? ", dmask" : "");
        sb_puts(o, "    if (q_blocks && dq) {\n        KILN_LAUNCH_AT(");
        cg_c_string(o, site);
        sb_printf(o, ", %s_dq, q_blocks, KILN_ATTN_THREADS, kiln_attention_dq_smem(&a), stream, a%s, dq);\n    }\n}\n\n", name, args.data);
    }
    sb_free(&args);
}

void cuda_emit_attention_call(Cg *c, int32_t k, const char *name)
{
    const NodeId id = c->fp.kernels[k].anchor;
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    sb_printf(o, "    %s_launch(io->syms", name);
    for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(o, ", v%d", cg_attention_operand_base(c, id, (int)j)); /* the memory each reads */
    if (n->fattr[1] > 0) sb_puts(o, ", io->seed, io->step");
    const bool grad = n->op == OP_ATTENTION_GRAD;
    const int outputs = grad ? (added_mask(c, id) ? 4 : 3) : 2;
    for (int w = 0; w < outputs; w++) {
        const NodeId m = cg_attention_member(c, k, grad ? OP_ATTENTION_GRAD : w ? OP_ATTENTION_LSE : OP_ATTENTION, w);
        const NodeId wr = c->fp.kernels[k].written;
        if (!grad && !w && wr != IR_NONE) sb_printf(o, ", v%d", wr); /* the output, permuted */
        else if (m == IR_NONE || !c->fp.stored[m]) sb_puts(o, ", nullptr");
        else sb_printf(o, ", v%d", m);
    }
    sb_puts(o, !grad && ir_attrs(c->g, id)[0] != ATTN_MASK_CAUSAL ? ", cs.partials, stream);" : ", stream);");
}
