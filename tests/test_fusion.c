/* test_fusion.c — the decisions of passes/fusion.c, layout.c and memplan.c on small IR
 * texts: which views BLAS reads in place (and with which strides), which products are
 * written permuted, which outputs take an input's bytes, and the arena's invariants: a
 * kernel's output never overlaps its inputs except where memplan says it is in place, nor
 * any value alive while it is written.
 * Numerical correctness of the same decisions is test_codegen's (generated C against the
 * interpreter). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "support.h"

#define HEADER "kiln-ir 1\ngraph t mode=train\n"

typedef struct {
    Graph *g;
    FusionPlan f;
    MemPlan m;
    Diag d;
} Planned;

static void plan(const char *body, Planned *p)
{
    StrBuf text;
    sb_init(&text);
    sb_printf(&text, HEADER "%s", body);
    diag_init(&p->d, NULL);
    p->g = ir_read(text.data, text.len, "t.ir", &p->d);
    cr_assert(p->g, "bad test IR:\n%s", p->d.out.data);
    fusion_plan(p->g, &p->f);
    memplan_run(p->g, &p->f, &p->m);
    sb_free(&text);
}

static void unplan(Planned *p)
{
    memplan_free(&p->m);
    fusion_free(&p->f);
    ir_graph_free(p->g);
    diag_free(&p->d);
}

/* The training graph of a model file after the pipeline (autodiff, simplify; precision for
 * a half dtype). */
static Graph *training_graph_as(const char *rel, DType half, bool unfused_attention)
{
    Diag d;
    Model *m = support_compile_file(rel, MODE_TRAIN, &d);
    StrBuf err;
    sb_init(&err);
    PrecisionOptions prec = {.half = half};
    PipelineOptions opt = {.precision = &prec, .unfused_attention = unfused_attention};
    cr_assert_eq(pipeline_run_opts(m->graph, NULL, &opt, NULL, &err), 0, "%s", err.data);
    Graph *g = ir_graph_clone(m->graph);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
    return g;
}

static Graph *training_graph_in(const char *rel, DType half) { return training_graph_as(rel, half, false); }
static Graph *training_graph(const char *rel) { return training_graph_in(rel, DT_F32); }

/* A model's training graph with its fusion and memory plans (attention fused or not). */
static Graph *planned_model_as(const char *rel, bool unfused_attention, FusionPlan *f, MemPlan *m)
{
    Graph *g = training_graph_as(rel, DT_F32, unfused_attention);
    fusion_plan(g, f);
    memplan_run(g, f, m);
    return g;
}

static Graph *planned_model(const char *rel, FusionPlan *f, MemPlan *m)
{
    Graph *g = training_graph(rel);
    fusion_plan(g, f);
    memplan_run(g, f, m);
    return g;
}

static void free_planned_model(Graph *g, FusionPlan *f, MemPlan *m)
{
    memplan_free(m);
    fusion_free(f);
    ir_graph_free(g);
}

static bool is_one(Dim d) { return d.nsym == 0 && d.k == 1; }

static void expect_strides(const Planned *p, NodeId x, NodeId base, const int64_t *want, int rank, int64_t offset)
{
    FusionLayout L;
    cr_assert(fusion_layout(p->g, &p->f, x, &L), "%%%d has no layout", x);
    cr_expect_eq(L.base, base, "%%%d: base %%%d, expected %%%d", x, L.base, base);
    cr_assert_eq(L.rank, rank);
    for (int a = 0; a < rank; a++) {
        if (is_one(p->g->nodes[x].shape.d[a])) continue;
        cr_expect(L.stride[a].nsym == 0 && L.stride[a].k == want[a], "%%%d axis %d: stride %lld, expected %lld", x, a,
                  (long long)L.stride[a].k, (long long)want[a]);
    }
    int64_t off = 0;
    for (int t = 0; t < L.nterms; t++) off += L.offset[t].k;
    cr_expect_eq(off, offset);
}

Test(strided, attention_heads_are_read_in_place)
{
    /* q and k of a [2, 3, 12] projection, two heads of 2: slices, reshapes and permutes */
    Planned p;
    plan("%0 = input \"x\" : f32[2, 3, 12]\n"
         "%1 = slice %0 axis=2 start=0 end=4 step=1 : f32[2, 3, 4]\n"
         "%2 = reshape %1 : f32[2, 3, 2, 2]\n%3 = permute %2 perm=[0, 2, 1, 3] : f32[2, 2, 3, 2]\n"
         "%4 = slice %0 axis=2 start=4 end=8 step=1 : f32[2, 3, 4]\n"
         "%5 = reshape %4 : f32[2, 3, 2, 2]\n%6 = permute %5 perm=[0, 2, 3, 1] : f32[2, 2, 2, 3]\n"
         "%7 = matmul %3, %6 : f32[2, 2, 3, 3]\noutput y = %7\n",
         &p);
    for (NodeId v = 1; v <= 6; v++)
        if (p.g->nodes[v].op != OP_RESHAPE) cr_expect_eq(p.f.role[v], ROLE_STRIDED, "%%%d is not a strided view", v);
    cr_expect_eq(p.f.nkernels, 1, "only the product is a kernel");
    expect_strides(&p, 3, 0, (int64_t[]){36, 2, 12, 1}, 4, 0);
    expect_strides(&p, 6, 0, (int64_t[]){36, 2, 1, 12}, 4, 4);
    bool trans;
    FusionLayout L;
    cr_assert(fusion_layout(p.g, &p.f, 6, &L) && fusion_gemm_operand(p.g, &L, 6, &trans));
    cr_expect(trans, "k^T is read transposed");
    cr_expect_eq(p.m.kind[3], MEM_NONE);
    unplan(&p);
}

Test(strided, views_blas_cannot_read_are_copied)
{
    Planned p;
    /* a step-2 slice has no unit stride; the permute is also read by an elementwise op */
    plan("%0 = input \"x\" : f32[3, 8]\n%1 = input \"w\" : f32[4, 5]\n"
         "%2 = slice %0 axis=1 start=0 end=8 step=2 : f32[3, 4]\n%3 = matmul %2, %1 : f32[3, 5]\n"
         "%4 = input \"z\" : f32[4, 3]\n%5 = permute %4 perm=[1, 0] : f32[3, 4]\n%6 = matmul %5, %1 : f32[3, 5]\n"
         "%7 = exp %5 : f32[3, 4]\noutput a = %3\noutput b = %6\noutput c = %7\n",
         &p);
    cr_expect_eq(p.f.role[2], ROLE_KERNEL);
    cr_expect_eq(p.f.role[5], ROLE_KERNEL);
    cr_expect(p.f.stored[5], "the copy is stored for the product");
    unplan(&p);
}

Test(strided, a_broadcast_batch_operand_has_stride_zero)
{
    Planned p;
    plan("%0 = input \"w\" : f32[4, 3]\n%1 = input \"x\" : f32[5, 3, 6]\n"
         "%2 = reshape %0 : f32[1, 4, 3]\n%3 = expand %2 : f32[5, 4, 3]\n%4 = matmul %3, %1 : f32[5, 4, 6]\noutput y = %4\n",
         &p);
    cr_expect_eq(p.f.role[3], ROLE_STRIDED);
    expect_strides(&p, 3, 0, (int64_t[]){0, 3, 1}, 3, 0);
    unplan(&p);
    /* a repeated row (stride 0 on the matrix's rows) is not something BLAS can read */
    plan("%0 = input \"v\" : f32[1, 3]\n%1 = input \"x\" : f32[3, 6]\n"
         "%2 = expand %0 : f32[4, 3]\n%3 = matmul %2, %1 : f32[4, 6]\noutput y = %3\n",
         &p);
    cr_expect_neq(p.f.role[2], ROLE_STRIDED);
    unplan(&p);
}

Test(written, a_permute_of_a_product_is_written_by_blas)
{
    Planned p;
    plan("%0 = input \"a\" : f32[2, 3, 4]\n%1 = input \"b\" : f32[2, 4, 5]\n%2 = matmul %0, %1 : f32[2, 3, 5]\n"
         "%3 = permute %2 perm=[1, 0, 2] : f32[3, 2, 5]\n%4 = exp %3 : f32[3, 2, 5]\noutput y = %4\n",
         &p);
    int32_t k = p.f.kernel_of[2];
    cr_assert(k >= 0);
    cr_expect_eq(p.f.kernels[k].written, 3);
    cr_expect_eq(p.f.kernel_of[3], k);
    cr_expect(!p.f.stored[2] && p.f.stored[3], "the permuted order is the only copy");
    unplan(&p);
}

/* Output `out` of kernel k does not overlap root r that k reads, or, when k computes r again
 * (recomputed: not stored), the stored values r is computed from. */
static void expect_apart(const Planned *p, int32_t k, NodeId out, NodeId r)
{
    const Graph *g = p->g;
    if (p->f.role[r] == ROLE_KERNEL && p->f.kernel_of[r] != k && p->f.recomputed[r]) {
        cr_expect(!p->f.stored[r] || p->m.kind[r] == MEM_ARENA, "%%%d", r);
        for (uint32_t q = 0; q < g->nodes[r].ninputs; q++) expect_apart(p, k, out, fusion_root(g, &p->f, ir_input(g, r, (int)q)));
        return;
    }
    if (p->m.kind[r] != MEM_ARENA || p->f.kernel_of[r] == k || p->m.inplace_of[out] == r) return;
    int64_t o0 = p->m.offset[out], o1 = o0 + memplan_node_bytes(g, out);
    int64_t r0 = p->m.offset[r], r1 = r0 + memplan_node_bytes(g, r);
    cr_expect(o1 <= r0 || r1 <= o0, "kernel %d: %%%d overlaps its input %%%d", k, out, r);
}

/* The value operand q of node `reader` reads in kernel k: its root, or for a broadcast the
 * root of what it broadcasts. */
static NodeId read_root(const Planned *p, int32_t k, NodeId reader, int q)
{
    NodeId r = fusion_root(p->g, &p->f, ir_input(p->g, reader, q));
    return fusion_is_broadcast(p->g, &p->f, r, k, reader) ? fusion_root(p->g, &p->f, ir_input(p->g, r, 0)) : r;
}

/* Every kernel's stored outputs and the values it reads lie in disjoint bytes, unless the
 * output is in place of that input. */
static void expect_no_overlap(const Planned *p)
{
    const Graph *g = p->g;
    for (int32_t k = 0; k < p->f.nkernels; k++) {
        const Kernel *K = &p->f.kernels[k];
        for (int32_t i = 0; i < K->count; i++) {
            NodeId out = p->f.members[K->first + i];
            if (p->m.kind[out] != MEM_ARENA) continue;
            for (int32_t j = 0; j < K->count; j++) {
                NodeId id = p->f.members[K->first + j];
                for (uint32_t q = 0; q < g->nodes[id].ninputs; q++) expect_apart(p, k, out, read_root(p, k, id, (int)q));
            }
        }
    }
}

Test(memplan, outputs_never_overlap_inputs_in_a_small_graph)
{
    Planned p;
    plan("%0 = input \"x\" : f32[4, 8]\n%1 = reduce_sum %0 axes=[1] : f32[4, 1]\n%2 = exp %0 : f32[4, 8]\n"
         "%3 = reduce_max %2 axes=[0] : f32[1, 8]\n%4 = neg %2 : f32[4, 8]\n%5 = mul %4, %4 : f32[4, 8]\n"
         "%6 = add %5, %0 : f32[4, 8]\n%7 = reduce_sum %6 axes=[0, 1] : f32[1, 1]\noutput y = %7\noutput m = %3\noutput s = %1\n",
         &p);
    expect_no_overlap(&p);
    unplan(&p);
}

/* Root r as kernel k reads it: the stored values themselves, or, for a value k computes
 * again, those it is computed from; each one's last reader raised to k. */
static void note_read(const Planned *p, int32_t k, NodeId r, int32_t *last)
{
    const Graph *g = p->g;
    if (p->f.role[r] == ROLE_KERNEL && p->f.kernel_of[r] != k && p->f.recomputed[r]) {
        for (uint32_t q = 0; q < g->nodes[r].ninputs; q++) note_read(p, k, read_root(p, k, r, (int)q), last);
        return;
    }
    if (p->m.kind[r] == MEM_ARENA && last[r] < k) last[r] = k;
}

/* Every value a kernel stores lies in bytes that no other value alive at that kernel (stored
 * before it, read at or after it, or a graph output) occupies, but for the value it takes the
 * place of: what the arena's placement, first fit or largest first, must keep. */
static void expect_live_values_apart(const Planned *p)
{
    const Graph *g = p->g;
    size_t nn = (size_t)g->nnodes + 1;
    int32_t *last = malloc(nn * sizeof *last);
    cr_assert(last);
    for (NodeId v = 0; v < g->nnodes; v++) last[v] = -1;
    for (int32_t k = 0; k < p->f.nkernels; k++) {
        const Kernel *K = &p->f.kernels[k];
        for (int32_t j = 0; j < K->count; j++) {
            NodeId id = p->f.members[K->first + j];
            for (uint32_t q = 0; q < g->nodes[id].ninputs; q++) note_read(p, k, read_root(p, k, id, (int)q), last);
        }
    }
    for (int32_t o = 0; o < g->noutputs; o++) {
        NodeId r = fusion_root(g, &p->f, g->outputs[o].node);
        if (p->m.kind[r] == MEM_ARENA && g->outputs[o].kind != OUT_FORWARD) last[r] = p->f.nkernels;
    }
    int bad = 0;
    for (NodeId out = 0; out < g->nnodes && bad < 5; out++) {
        if (p->m.kind[out] != MEM_ARENA) continue;
        const int32_t k = p->f.kernel_of[out];
        const int64_t o0 = p->m.offset[out], o1 = o0 + memplan_node_bytes(g, out);
        for (NodeId v = 0; v < g->nnodes && bad < 5; v++) {
            const int32_t kv = p->f.kernel_of[v]; /* the same kernel's other outputs are alive too */
            if (v == out || p->m.kind[v] != MEM_ARENA || kv > k || (kv < k && last[v] < k)) continue;
            NodeId chain = out; /* out, in place of ... of v: the same bytes by design */
            while (chain != IR_NONE && chain != v) chain = p->m.inplace_of[chain];
            if (chain == v) continue;
            const int64_t v0 = p->m.offset[v], v1 = v0 + memplan_node_bytes(g, v);
            if (o1 <= v0 || v1 <= o0) continue;
            cr_expect_fail("kernel %d writes %%%d over %%%d, alive from kernel %d to %d", k, out, v, p->f.kernel_of[v], last[v]);
            bad++;
        }
    }
    free(last);
}

static void expect_models_have_no_overlap(const char *path, DType half)
{
    Graph *g = training_graph_in(path, half);
    Planned p = {.g = g};
    fusion_plan(g, &p.f);
    memplan_run(g, &p.f, &p.m);
    int inplace = 0;
    for (NodeId i = 0; i < g->nnodes; i++) inplace += p.m.inplace_of[i] != IR_NONE;
    cr_log_info("%s: %d outputs in place", path, inplace);
    expect_no_overlap(&p);
    expect_live_values_apart(&p);
    memplan_free(&p.m);
    fusion_free(&p.f);
    ir_graph_free(g);
}

Test(memplan, reference_models_never_overlap_a_kernels_inputs)
{
    expect_models_have_no_overlap("models/mlp.kiln", DT_F32);
    expect_models_have_no_overlap("models/cnn.kiln", DT_F32);
    expect_models_have_no_overlap("models/gpt.kiln", DT_F32);
    expect_models_have_no_overlap("models/cnn.kiln", DT_BF16);
    expect_models_have_no_overlap("models/gpt.kiln", DT_BF16);
}

/* (cnn had one, its pooling gradient's division by the count of tied maxima, gone since
 * the gradient goes to the first maximum.) */
Test(memplan, gpt_has_outputs_in_place)
{
    FusionPlan f;
    MemPlan m;
    Graph *g = planned_model("models/gpt.kiln", &f, &m);
    int inplace = 0;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (m.inplace_of[i] != IR_NONE) {
            inplace++;
            NodeId r = m.inplace_of[i];
            cr_expect_eq(m.offset[i], m.offset[r]);
            cr_expect_eq(ir_dtype_size((DType)g->nodes[i].dtype), ir_dtype_size((DType)g->nodes[r].dtype));
            cr_expect_eq(f.kernels[f.kernel_of[i]].axes, 0, "in place only in elementwise kernels");
        }
    cr_expect_gt(inplace, 0);
    free_planned_model(g, &f, &m);
}

/* GELU's backward needs its tanh, 1 + tanh, 1 - tanh^2, x^2 and x / 2: the backward
 * kernels compute them again from the stored pre-activation instead of loading five
 * tensors, and whatever reads a recomputed value reads it element for element. */
Test(recompute, gelu_backward_values_are_recomputed_from_the_pre_activation)
{
    Graph *g = training_graph("models/gpt.kiln");
    FusionPlan f;
    fusion_plan(g, &f);
    int recomputed = 0;
    for (NodeId id = 0; id < g->nnodes; id++) {
        if (!f.recomputed[id]) continue;
        cr_expect_eq(f.role[id], ROLE_KERNEL);
        cr_expect_eq(f.cls[id], CLASS_FULL);
        if (f.stored[id]) continue;
        bool read_elsewhere = false;
        for (NodeId u = id + 1; u < g->nnodes; u++)
            for (uint32_t q = 0; q < g->nodes[u].ninputs; q++) {
                if (fusion_root(g, &f, ir_input(g, u, (int)q)) != id || f.role[u] != ROLE_KERNEL || f.kernel_of[u] == f.kernel_of[id])
                    continue;
                read_elsewhere = true;
                cr_expect_neq(f.kernels[f.kernel_of[u]].kind, KERNEL_SINGLE, "%%%d reads recomputed %%%d", u, id);
                cr_expect_eq(f.cls[u], CLASS_FULL, "%%%d reads recomputed %%%d", u, id);
            }
        if (read_elsewhere && g->nodes[id].op == OP_TANH) cr_log_info("tanh %%%d is recomputed", id);
        recomputed += read_elsewhere;
    }
    /* four layers, each with at least GELU's four backward values */
    cr_expect_geq(recomputed, 16, "%d values recomputed by other kernels", recomputed);
    fusion_free(&f);
    ir_graph_free(g);
}

/* Softmax's backward divides the gradient of its output by the broadcast row sum: a value
 * the backward row kernel recomputes, reading the sum as a broadcast, instead of a kernel of
 * its own storing it. A loop kernel left with nothing to store is dropped: every loop kernel
 * stores something, and a value without a kernel is recomputed wherever it is read. (gpt's
 * attention as written: fused, it has no softmax.) */
Test(recompute, values_with_broadcast_operands_are_recomputed_and_empty_kernels_dropped)
{
    FusionPlan f;
    MemPlan m;
    Graph *g = planned_model_as("models/gpt.kiln", true, &f, &m);
    for (int32_t k = 0; k < f.nkernels; k++) {
        const Kernel *K = &f.kernels[k];
        bool stores = false;
        for (int32_t i = 0; i < K->count; i++) stores |= f.stored[f.members[K->first + i]] != 0;
        cr_expect(stores || K->kind != KERNEL_LOOP, "loop kernel %d stores nothing", k);
    }
    int softmax_divs = 0;
    for (NodeId id = 0; id < g->nnodes; id++) {
        const Node *n = &g->nodes[id];
        if (f.role[id] == ROLE_KERNEL && f.kernel_of[id] < 0) {
            cr_expect(f.recomputed[id] && !f.stored[id], "%%%d has no kernel but is not recomputed", id);
            cr_expect_eq(m.kind[id], MEM_NONE, "%%%d has no kernel but has memory", id);
        }
        if (n->op != OP_DIV || n->shape.rank != 4 || g->nodes[ir_input(g, id, 1)].op != OP_EXPAND) continue;
        if (f.kernel_of[id] >= 0 && f.kernels[f.kernel_of[id]].kind == KERNEL_LOOP && f.kernels[f.kernel_of[id]].axes) continue;
        cr_expect(f.recomputed[id] && !f.stored[id] && f.kernel_of[id] < 0, "softmax gradient %%%d is stored by a kernel", id);
        softmax_divs++;
    }
    cr_expect_eq(softmax_divs, 4, "one softmax gradient division per layer is recomputed, found %d", softmax_divs);
    free_planned_model(g, &f, &m);
}

/* A parameter's gradient is written by its kernel straight into the caller's gradient
 * slab (MEM_GRAD, no copy at the end of the step), and takes no bytes of the arena. */
Test(memplan, gradients_are_written_into_the_gradient_slab)
{
    FusionPlan f;
    MemPlan m;
    Graph *g = planned_model("models/mlp.kiln", &f, &m);
    int grads = 0;
    for (int32_t o = 0; o < g->noutputs; o++) {
        if (g->outputs[o].kind != OUT_GRAD) continue;
        NodeId r = fusion_root(g, &f, g->outputs[o].node);
        cr_expect_eq(m.kind[r], MEM_GRAD, "gradient %s (%%%d)", ir_str(g, g->outputs[o].name), r);
        cr_expect_eq(m.offset[r], o);
        cr_expect_eq(m.inplace_of[r], IR_NONE);
        grads++;
    }
    cr_expect_eq(grads, 6, "mlp has three Linear layers");
    free_planned_model(g, &f, &m);
}

/* amax's backward (and a whole-tensor max()'s) needs the mask of its tied maxima as
 * floats: the forward kernel stores the mask as bytes and the backward kernel converts it
 * (a widening cast is recomputed by its readers from the narrow value, stored instead).
 * tests/gradcheck/extremes.kiln has four: amax, amin, max() and amin over every axis. */
Test(recompute, a_widening_cast_stores_the_narrow_value)
{
    Graph *g = training_graph("tests/gradcheck/extremes.kiln");
    FusionPlan f;
    fusion_plan(g, &f);
    int casts = 0;
    for (NodeId id = 0; id < g->nnodes; id++) {
        if (g->nodes[id].op != OP_CAST || !f.recomputed[id] || f.stored[id]) continue;
        NodeId q = fusion_root(g, &f, ir_input(g, id, 0));
        if (f.recomputed[q]) continue; /* the labels' one-hot: below */
        cr_expect(f.stored[q], "%%%d, the operand of recomputed cast %%%d, is stored", q, id);
        cr_expect_lt(ir_dtype_size((DType)g->nodes[q].dtype), ir_dtype_size((DType)g->nodes[id].dtype));
        casts++;
    }
    cr_expect_eq(casts, 4, "the four masks of tied maxima are stored narrow, found %d", casts);
    fusion_free(&f);
    ir_graph_free(g);
}

/* Cross-entropy's one-hot mask of the targets, eq(iota, targets), is computed where it is
 * read (the forward's sum and the backward's gradient) from the targets and the
 * coordinates: never stored (gpt2-124m: 206 MB of bool at the arena's peak). */
Test(recompute, the_one_hot_mask_is_computed_where_read)
{
    const char *models[] = {"models/mlp.kiln", "models/cnn.kiln", "models/gpt.kiln"};
    for (int i = 0; i < 3; i++) {
        Graph *g = training_graph(models[i]);
        FusionPlan f;
        fusion_plan(g, &f);
        int masks = 0;
        for (NodeId id = 0; id < g->nnodes; id++) {
            if (g->nodes[id].op != OP_EQ || g->nodes[id].dtype != DT_BOOL) continue;
            NodeId a = fusion_root(g, &f, ir_input(g, id, 0));
            if (g->nodes[a].op != OP_IOTA) continue;
            cr_expect(!f.stored[id], "%s: the one-hot mask %%%d is not stored", models[i], id);
            masks++;
        }
        cr_expect_geq(masks, 1, "%s: a one-hot mask (eq of an iota)", models[i]);
        fusion_free(&f);
        ir_graph_free(g);
    }
}

/* A convolution's weight gradient is one product per image summed over the batch: BLAS
 * accumulates the products into the sum, and the [B, O, C*k*k] products are never stored. */
Test(summed, conv_weight_gradients_are_accumulated_by_blas)
{
    Graph *g = training_graph("models/cnn.kiln");
    FusionPlan f;
    fusion_plan(g, &f);
    int summed = 0;
    for (int32_t k = 0; k < f.nkernels; k++) {
        const Kernel *K = &f.kernels[k];
        if (K->summed == IR_NONE) continue;
        cr_expect_eq(K->kind, KERNEL_GEMM);
        cr_expect_eq(K->count, 2, "kernel %d: the product and its sum, nothing else", k);
        cr_expect_not(f.stored[K->anchor], "kernel %d: the products %%%d are not stored", k, K->anchor);
        cr_expect(f.stored[K->summed], "kernel %d: the sum %%%d is stored", k, K->summed);
        cr_expect_eq(g->nodes[K->summed].op, OP_REDUCE_SUM);
        cr_expect_eq(ir_input(g, K->summed, 0), K->anchor);
        summed++;
    }
    cr_expect_eq(summed, 2, "conv1's and conv2's weight gradients");
    fusion_free(&f);
    ir_graph_free(g);
}
