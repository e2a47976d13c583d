/* report.c — what a program's plans say about its memory (kiln build --report, kiln check)
 * and `kiln ir --after fusion|memplan`'s listing. Everything here reads the plans that
 * kiln_compile computed; nothing is planned again. */
#include "kiln.h"

#include <stdlib.h>

#include <string.h>

#include "../passes/attention.h"

const char *kiln_precision_name(DType t) { return t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : "fp32"; }

/* Parameters, gradients, optimizer moments and buffers (the slabs), in bytes. */
int64_t kiln_slab_bytes(const Graph *g, const Recipe *recipe, int64_t *params_out, int64_t *buffers_out, int *moments_out,
                        const char **opt_out)
{
    int64_t params = 0, buffers = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_PARAM) continue;
        int64_t bytes = ir_shape_max_numel(g, &g->nodes[i].shape) * ir_dtype_size((DType)g->nodes[i].dtype);
        if (ir_attrs(g, i)[1]) params += bytes;
        else buffers += bytes;
    }
    const RecipeValue *opt = recipe_get(recipe, "optimizer");
    const char *name = opt && opt->kind == RV_CALL && opt->str ? opt->str : "";
    int moments = !strcmp(name, "Adam") || !strcmp(name, "AdamW") ? 2 : !strcmp(name, "SGD") ? 1 : 0;
    if (params_out) *params_out = params;
    if (buffers_out) *buffers_out = buffers;
    if (moments_out) *moments_out = moments;
    if (opt_out) *opt_out = name;
    return params * (2 + moments) + buffers;
}

void kiln_checkpointed_blocks(int32_t blocks, int32_t nblocks, bool cheap, const char *suffix, StrBuf *out)
{
    if (cheap) sb_puts(out, nblocks ? "cheap values recomputed, " : "cheap values recomputed; ");
    if (!nblocks) sb_puts(out, "the model has no block to checkpoint");
    else if (nblocks == 1) sb_printf(out, "the model's one block %scheckpointed%s", blocks ? "" : "not ", suffix);
    else if (!blocks) sb_printf(out, "none of the model's %d blocks checkpointed%s", nblocks, suffix);
    else sb_printf(out, "%d of the model's %d blocks checkpointed%s", blocks, nblocks, suffix);
}

/* An inference program has no training step: its weights and the steps' arenas. */
static void attention_report(const KilnProgram *p, const Graph *g, int width, StrBuf *out);

static void infer_report(const KilnProgram *p, StrBuf *out)
{
    int64_t params, buffers;
    kiln_slab_bytes(p->train.graph, &p->model->recipe, &params, &buffers, NULL, NULL);
    const int64_t ea = p->eval.plan.mem.arena_bytes, pa = p->predict.plan.mem.arena_bytes;
    sb_printf(out, "memory at the bounds (bytes):\n"
                   "  parameters          %14lld\n  buffers             %14lld\n"
                   "  activations eval    %14lld  (with the loss's inputs: loss and metrics)\n"
                   "  activations predict %14lld  (the forward alone; one arena of the larger size serves both)\n"
                   "  total               %14lld\n",
              (long long)params, (long long)buffers, (long long)ea, (long long)pa, (long long)(params + buffers + (ea > pa ? ea : pa)));
    attention_report(p, p->predict.graph ? p->predict.graph : p->eval.graph, 20, out); /* fused or found in the forward */
    const Graph *decode = p->decode.graph;
    if (decode) { /* what --generate adds: its own arena and the caches, batch 1 */
        int64_t cache = 0;
        for (NodeId i = 0; i < decode->nnodes; i++)
            if (decode->nodes[i].op == OP_INPUT && !strncmp(ir_node_name(decode, i), "decode.", 7) && decode->nodes[i].shape.rank == 4)
                cache += ir_shape_max_numel(decode, &decode->nodes[i].shape) * 4;
        sb_printf(out, "  generation (--generate, batch 1): decode step activations %lld, key/value cache %lld\n",
                  (long long)p->decode.plan.mem.arena_bytes, (long long)cache);
    } else if (p->decode_why) {
        sb_printf(out, "  generation (--generate): by full recomputation (%s)\n", p->decode_why);
    }
}

int kiln_fused_attentions(const Graph *g)
{
    int n = 0;
    for (NodeId i = 0; i < g->nnodes; i++) n += g->nodes[i].op == OP_ATTENTION && !(g->nodes[i].flags & NODE_RECOMPUTED);
    return n;
}

/* One attention of the report: what it computes, its probabilities' shape. */
typedef struct {
    Loc at;
    AttnMask mask;
    int64_t heads, kv_heads;
    double dropout;
    DType dtype;
    Shape probs; /* [..., H, T, S] */
} AttnLine;

/* Lines for the attentions, one per source line ("(x12)" for a block's twelve). */
static void attention_lines(const Graph *g, const AttnLine *a, int n, bool fused, StrBuf *out)
{
    bool *done = xcalloc((size_t)n + 1, sizeof *done);
    static const char *const masks[] = {"no mask", "causal", "bool mask", "bool mask (masked_fill)", "added mask"};
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        int same = 0;
        for (int j = i; j < n; j++)
            if (!done[j] && !memcmp(&a[j].at, &a[i].at, sizeof a[i].at)) done[j] = true, same++;
        StrBuf sh;
        sb_init(&sh);
        ir_shape_format(&sh, g, &a[i].probs);
        sb_printf(out, "    %s:%u", a[i].at.line && g->nfiles ? g->files[a[i].at.file < (uint32_t)g->nfiles ? a[i].at.file : 0] : "?",
                  (unsigned)a[i].at.line);
        if (same > 1) sb_printf(out, " (x%d)", same);
        sb_printf(out, ": %s, %lld heads", masks[a[i].mask < ATTN_MASK_COUNT ? a[i].mask : 0], (long long)a[i].heads);
        if (a[i].kv_heads != a[i].heads) sb_printf(out, " over %lld key/value heads", (long long)a[i].kv_heads);
        if (a[i].dropout > 0) sb_printf(out, ", dropout %g", a[i].dropout);
        if (fused) sb_printf(out, ", fused: no %s %s probabilities stored\n", ir_dtype_name(a[i].dtype), sh.data ? sh.data : "");
        else sb_printf(out, ", probabilities %s %s\n", ir_dtype_name(a[i].dtype), sh.data ? sh.data : "");
        sb_free(&sh);
    }
    free(done);
}

/* The attentions of the training graph, a line per source line: those fused (the attention
 * pass) and what that saved, those found but computed as written (--attention unfused, or
 * a form the pass declines) and the bytes of their T×T probabilities. */
static void attention_report(const KilnProgram *p, const Graph *g, int width, StrBuf *out)
{
    const int nf = kiln_fused_attentions(g);
    if (nf) {
        AttnLine *a = xcalloc((size_t)nf, sizeof *a);
        int k = 0;
        int64_t probs = 0;
        for (NodeId i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->op != OP_ATTENTION || (n->flags & NODE_RECOMPUTED)) continue;
            const Shape *q = &g->nodes[ir_input(g, i, 0)].shape, *kk = &g->nodes[ir_input(g, i, 1)].shape;
            const int r = q->rank;
            a[k] = (AttnLine){.at = n->loc, .mask = (AttnMask)ir_attrs(g, i)[0], .heads = ir_dim_max(g, q->d[r - 3]),
                              .kv_heads = ir_dim_max(g, kk->d[r - 3]), .dropout = n->fattr[1], .dtype = DT_F32, .probs = *q};
            a[k].probs.d[r - 1] = kk->d[r - 2];
            probs += ir_shape_max_numel(g, &a[k].probs) * 4;
            k++;
        }
        if (p->unfused_arena >= 0)
            sb_printf(out, "  %-*s%14lld  (%d fused: the training activations saved; %lld planned with --attention unfused)\n", width, "attention",
                      (long long)(p->unfused_arena - p->train.plan.mem.arena_bytes), nf, (long long)p->unfused_arena);
        else
            sb_printf(out, "  %-*s%14lld  (%d fused: the bytes of the probabilities not stored)\n", width, "attention", (long long)probs, nf);
        attention_lines(g, a, nf, true, out);
        free(a);
    }
    AttentionMatch *m;
    const int n = attention_find(g, &m);
    if (!n) return;
    AttnLine *a = xcalloc((size_t)n, sizeof *a);
    int64_t bytes = 0;
    for (int i = 0; i < n; i++) {
        const Node *pr = &g->nodes[m[i].probs];
        bytes += ir_shape_max_numel(g, &pr->shape) * ir_dtype_size((DType)pr->dtype);
        a[i] = (AttnLine){.at = g->nodes[m[i].out].loc, .mask = m[i].mask, .heads = m[i].heads, .kv_heads = m[i].kv_heads,
                          .dropout = m[i].dropout, .dtype = (DType)pr->dtype, .probs = pr->shape};
    }
    int large = 0; /* over the target's kernels' head size */
    for (int i = 0; i < n && p->attention_max_head; i++) {
        const Shape *q = &g->nodes[m[i].q].shape, *v = &g->nodes[m[i].v].shape;
        large += ir_dim_max(g, q->d[q->rank - 1]) > p->attention_max_head || ir_dim_max(g, v->d[v->rank - 1]) > p->attention_max_head;
    }
    StrBuf why;
    sb_init(&why);
    if (large)
        sb_printf(&why, " (%d with a head size over %lld, the CUDA kernels' largest)", large, (long long)p->attention_max_head);
    sb_printf(out, "  %-*s%14lld  (%d found, computed unfused%s: the bytes of their probabilities)\n", width, "attention", (long long)bytes, n,
              why.data ? why.data : "");
    sb_free(&why);
    attention_lines(g, a, n, false, out);
    free(a);
    free(m);
}

void kiln_memory_report(const KilnProgram *p, bool infer, StrBuf *out)
{
    if (infer) {
        infer_report(p, out);
        return;
    }
    const Graph *g = p->train.graph;
    int64_t params, buffers;
    int moments;
    const char *name;
    kiln_slab_bytes(g, &p->model->recipe, &params, &buffers, &moments, &name);
    const int64_t train_arena = p->train.plan.mem.arena_bytes, eval_arena = p->eval.plan.mem.arena_bytes;
    sb_puts(out, "memory at the bounds (bytes):\n");
    sb_printf(out, "  parameters        %14lld\n", (long long)params);
    sb_printf(out, "  gradients         %14lld\n", (long long)params);
    sb_printf(out, "  optimizer state   %14lld  (%s: %d per parameter%s)\n", (long long)params * moments, *name ? name : "none",
              moments, moments == 1 ? ", momentum buffer if used" : "");
    sb_printf(out, "  buffers           %14lld\n", (long long)buffers);
    if (p->precision.half != DT_F32)
        sb_printf(out, "  activations train %14lld  (mixed precision: %s)\n", (long long)train_arena, kiln_precision_name(p->precision.half));
    else sb_printf(out, "  activations train %14lld\n", (long long)train_arena);
    if (p->plain.graph) { /* checkpoint(...): what it saves and what it costs */
        double all, again;
        remat_matmul_flops(g, &all, &again);
        int64_t copies = 0;
        for (NodeId i = 0; i < g->nnodes; i++) copies += (g->nodes[i].flags & NODE_RECOMPUTED) && g->nodes[i].ckpt;
        const int64_t plain_arena = p->plain.plan.mem.arena_bytes;
        sb_printf(out, "    without remat   %14lld  (recomputing: %.2fx the activations; %lld value%s recomputed, %.3g GFLOP of\n"
                       "                                     matrix products again, +%.1f%% of the step's %.3g GFLOP)\n",
                  (long long)plain_arena, plain_arena ? (double)train_arena / (double)plain_arena : 0.0, (long long)copies,
                  copies == 1 ? "" : "s", again / 1e9, all > again ? 100.0 * again / (all - again) : 0.0, (all - again) / 1e9);
    }
    StrBuf blocks;
    sb_init(&blocks);
    const RematOptions *plan = &p->remat;
    if (p->memory_budget) {
        kiln_checkpointed_blocks(plan->blocks, plan->nblocks, plan->cheap, " for it", &blocks);
        sb_printf(out, "    memory budget   %14lld  (%s)\n", (long long)p->memory_budget, blocks.data);
    }
    if (plan->want_floor) { /* the floor of --memory-budget, found without failing builds */
        blocks.len = 0;
        kiln_checkpointed_blocks(plan->floor_blocks, plan->nblocks, plan->floor_cheap, "", &blocks);
        sb_printf(out, "    smallest plan   %14lld  (the least a --memory-budget can reach, %lld in total: %s)\n", (long long)plan->floor_arena,
                  (long long)(params * (2 + moments) + buffers + plan->floor_arena + eval_arena), blocks.data);
    }
    sb_free(&blocks);
    attention_report(p, g, 18, out);
    sb_printf(out, "  activations eval  %14lld\n", (long long)eval_arena);
    sb_printf(out, "  total             %14lld\n", (long long)(params * (2 + moments) + buffers + train_arena + eval_arena));
}

void kiln_print_plan(const Graph *g, const GraphPlan *plan, bool memory, StrBuf *out)
{
    ir_print(g, out);
    StrBuf listing;
    sb_init(&listing);
    fusion_print(g, &plan->fusion, &listing);
    if (memory) {
        const MemPlan *mp = &plan->mem;
        sb_printf(out, "# activation arena: %lld bytes at the largest sizes\n", (long long)mp->arena_bytes);
        for (NodeId i = 0; i < g->nnodes; i++)
            if (mp->kind[i] == MEM_ARENA) {
                sb_printf(out, "# %%%d at %lld, %lld bytes", i, (long long)mp->offset[i], (long long)memplan_node_bytes(g, i));
                if (mp->inplace_of[i] != IR_NONE) sb_printf(out, ", in place of %%%d", mp->inplace_of[i]);
                sb_puts(out, "\n");
            } else if (mp->kind[i] == MEM_GRAD) {
                sb_printf(out, "# %%%d in the gradient slab: gradient of %s\n", i, ir_str(g, g->outputs[mp->offset[i]].name));
            }
    }
    sb_puts(out, "\n");
    sb_puts(out, listing.data ? listing.data : "");
    sb_free(&listing);
}
