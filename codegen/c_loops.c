/* c_loops.c — the C target's fused kernels: loop nests and GEMMs with epilogues.
 *
 * What each kernel computes (its members' statements, loads, stores and reduction stages)
 * comes from kernel.c; this file prints the iteration around it. Loop shapes (kernel.h's
 * CG_LOOP_*), from cheapest to most general: flat, rows, columns, nested. A GEMM kernel
 * computes its matrix product with cblas_sgemm in blocks of rows, and runs its epilogue
 * over each block while it is in cache. Outer loops are shared between threads with
 * OpenMP when the kernel is large enough to pay for it; inner loops are marked for SIMD. */
#include "../runtime/kiln_math.h" /* KILN_SUM_LANES */
#include "c_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- loop nests ---- */

/* The last axis of the run of adjacent inner axes from a that can share one loop: none
 * of their coordinates is used. */
static int run_end(const CgKernel *L, int a)
{
    if (L->coords >> a & 1) return a;
    int b = a;
    while (b + 1 < L->rank && (L->inner >> (b + 1) & 1) && !(L->coords >> (b + 1) & 1)) b++;
    return b;
}

/* The number of loops open_inner opens in nested mode. */
static int nested_loops(const CgKernel *L)
{
    int n = 0;
    for (int a = 0; a < L->rank; a++)
        if (L->inner >> a & 1) {
            a = run_end(L, a);
            n++;
        }
    return n;
}

/* How open_inner lays out the element loop of a row that has sums in it. Every sum of the C
 * target is taken in one order, whatever kernel it is fused into (activation checkpointing
 * trains bit-identically only so): element k of the row, k counted over the reduced axes
 * in row-major order, goes to accumulator lane k % KILN_SUM_LANES, each lane adds its
 * elements in order, and KILN_LANES_SUM adds the lanes as a fixed tree (kiln_math.h). An
 * `omp simd reduction` would leave that order to the compiler's vectoriser, which splits
 * a sum one way where the loop body vectorises and another (or not at all) where it does
 * not, so the same sum came out differently in two kernels. */
enum inner_layout {
    INNER_PLAIN,   /* no sums: one loop per run of axes, as memory allows */
    INNER_BLOCKED, /* one loop, in blocks of KILN_SUM_LANES: `lane` is the loop's, SIMD */
    INNER_INDEXED, /* several loops (or the lane-axis nest): `lane` from the coordinates */
};

/* Opens the element loop of a row (rows and nested modes) and defines i (and the
 * coordinates of the inner axes; `lane` unless the layout is INNER_PLAIN). Returns the
 * number of braces to close. */
/* A block of lanes is at most KILN_SUM_LANES iterations: one vector of that width. Clang
 * would otherwise interleave two vectors (or pick 16 lanes on AVX-512) and run every block of
 * 8 in its scalar remainder loop; GCC ignores the pragma. */
#define LANES_PRAGMA "#pragma clang loop vectorize_width(8) interleave_count(1)"

/* The element loop of a row in blocks of lanes (INNER_BLOCKED). Whole blocks run a loop of
 * exactly KILN_SUM_LANES iterations: one vector, the lanes' accumulators in a register. With
 * one loop of `lanes` iterations for every block, Clang kept the accumulators in memory and
 * ran each block through a vector loop's checks: gpt's attention softmax took 1.3x GCC's
 * time. A row whose width is a multiple of KILN_SUM_LANES has only whole blocks; one that
 * may end in a shorter block runs that block in a loop of `lanes` iterations with its own
 * copy of the body (close_lane_block); one narrower than a block, only that loop. The
 * lanes add in the same order in every form. Writes the lines up to the body (which starts
 * with `var`'s definition); L->lane_body: where the body starts when it is to be copied,
 * else (size_t)-1. */
static void open_lane_block(CgKernel *L, const char *pragma, const char *indent, const char *extent, const char *var)
{
    StrBuf *o = L->c->o;
    bool fixed = true;
    int64_t wmax = 1;
    for (int a = 0; a < L->rank; a++)
        if (L->inner >> a & 1) {
            const Dim d = L->K->shape.d[a];
            fixed &= ir_dim_is_const(d);
            const int64_t m = ir_dim_max(L->g, d);
            wmax = m < 1 || wmax > INT64_MAX / m ? INT64_MAX : wmax * m;
        }
    const bool whole = wmax >= KILN_SUM_LANES, last = !fixed || wmax % KILN_SUM_LANES;
    L->lane_body = (size_t)-1;
    sb_printf(o, "%sfor (int64_t j0 = 0; j0 < %s; j0 += KILN_SUM_LANES) {\n", indent, extent);
    if (whole && last) {
        sb_printf(o, "%s    const int64_t lanes = %s - j0 < KILN_SUM_LANES ? %s - j0 : KILN_SUM_LANES;\n", indent, extent, extent);
        sb_printf(o, "%s    if (lanes == KILN_SUM_LANES) {\n", indent);
    } else {
        sb_printf(o, "%s    { /* %s */\n", indent, whole ? "whole blocks only: the width is a multiple of KILN_SUM_LANES" : "one block, narrower");
        if (last) sb_printf(o, "%s        const int64_t lanes = %s - j0;\n", indent, extent);
    }
    if (pragma) sb_printf(o, "%s        %s\n%s        " LANES_PRAGMA "\n", indent, pragma, indent);
    sb_printf(o, "%s        for (int lane = 0; lane < %s; lane++) {\n", indent, whole ? "KILN_SUM_LANES" : "lanes");
    if (whole && last) L->lane_body = o->len;
    sb_printf(o, "%s            const int64_t %s = j0 + lane;\n", indent, var);
}

/* Closes open_lane_block's loops; where the last block may be shorter, its loop follows
 * with the same body again (scalar: at most KILN_SUM_LANES - 1 elements a row). */
static void close_lane_block(CgKernel *L, const char *indent)
{
    StrBuf *o = L->c->o;
    StrBuf body;
    sb_init(&body);
    if (L->lane_body != (size_t)-1) sb_putn(&body, o->data + L->lane_body, o->len - L->lane_body);
    sb_printf(o, "%s        }\n", indent);
    if (L->lane_body != (size_t)-1) {
        sb_printf(o, "%s    } else { /* the row's last block, shorter */\n", indent);
        sb_printf(o, "%s        #pragma clang loop vectorize(disable) interleave(disable)\n", indent);
        sb_printf(o, "%s        for (int lane = 0; lane < lanes; lane++) {\n", indent);
        sb_putn(o, body.data ? body.data : "", body.len);
        sb_printf(o, "%s        }\n", indent);
    }
    sb_printf(o, "%s    }\n%s}\n", indent, indent);
    sb_free(&body);
}

/* Whether the element loop is open_lane_block's: blocks of lanes over one loop (rows mode,
 * or a nest whose inner axes are one run). */
static bool lane_blocked(CgKernel *L, enum inner_layout layout)
{
    return layout == INNER_BLOCKED && (L->mode == CG_LOOP_ROWS || nested_loops(L) == 1);
}

static int open_inner(CgKernel *L, const char *pragma, const char *indent, enum inner_layout layout)
{
    StrBuf *o = L->c->o;
    if (L->mode == CG_LOOP_ROWS) {
        char var[16];
        if (L->coords >> (L->rank - 1) & 1) snprintf(var, sizeof var, "c%d", L->rank - 1);
        else snprintf(var, sizeof var, "j");
        if (layout != INNER_PLAIN) {
            open_lane_block(L, pragma, indent, "W", var);
            sb_printf(o, "%s            const int64_t i = row * W + %s;\n", indent, var);
            return 3;
        }
        if (pragma) sb_printf(o, "%s%s\n", indent, pragma);
        sb_printf(o, "%sfor (int64_t %s = 0; %s < W; %s++) {\n", indent, var, var, var);
        sb_printf(o, "%s    const int64_t i = row * W + %s;\n", indent, var);
        return 1;
    }
    /* nested: one loop per run of adjacent inner axes whose coordinates no member uses
     * (memory-contiguous, so one loop), one per other inner axis */
    int depth = 0, nloops = nested_loops(L), seen = 0;
    const bool blocked = lane_blocked(L, layout);
    StrBuf idx, k;
    sb_init(&idx);
    sb_init(&k);
    for (int a = 0; a < L->rank; a++) {
        if (!(L->inner >> a & 1)) {
            sb_printf(&idx, "%sc%d * Ss%d", idx.len ? " + " : "", a, a);
            continue;
        }
        int b = run_end(L, a);
        char var[16], extent[128];
        snprintf(var, sizeof var, "%c%d", b == a ? 'c' : 'm', a);
        int at = snprintf(extent, sizeof extent, "S%d", a);
        for (int q = a + 1; q <= b && at < (int)sizeof extent; q++) at += snprintf(extent + at, sizeof extent - (size_t)at, " * S%d", q);
        /* k, the element's number in the row: ((v0 * E1 + v1) * E2 + v2) ... */
        if (k.len) {
            StrBuf t;
            sb_init(&t);
            sb_printf(&t, "(%s) * (%s) + %s", k.data, extent, var);
            sb_free(&k);
            k = t;
        } else {
            sb_puts(&k, var);
        }
        const bool last = ++seen == nloops;
        if (blocked) {
            open_lane_block(L, pragma, indent, extent, var);
            depth = 3;
        } else {
            /* an indexed row's loop carries its lanes from one element to the next: not SIMD */
            if (last && pragma && layout == INNER_PLAIN) sb_printf(o, "%s%*s%s\n", indent, 4 * depth, "", pragma);
            sb_printf(o, "%s%*sfor (int64_t %s = 0; %s < %s; %s++) {\n", indent, 4 * depth, "", var, var, extent, var);
            depth++;
        }
        sb_printf(&idx, "%s%s * Ss%d", idx.len ? " + " : "", var, b);
        a = b;
    }
    sb_printf(o, "%s%*sconst int64_t i = %s;\n", indent, 4 * depth, "", idx.len ? idx.data : "0");
    if (layout == INNER_INDEXED || (layout == INNER_BLOCKED && !blocked))
        sb_printf(o, "%s%*sconst int lane = (int)((%s) %% KILN_SUM_LANES);\n", indent, 4 * depth, "", k.len ? k.data : "0");
    sb_free(&idx);
    sb_free(&k);
    return depth;
}

static void close_braces(StrBuf *o, int n, const char *indent)
{
    for (int d = n - 1; d >= 0; d--) sb_printf(o, "%s%*s}\n", indent, 4 * d, "");
}

/* The inner indentation after open_inner. */
static void inner_indent(CgKernel *L, const char *indent, enum inner_layout layout, char *buf, size_t n)
{
    int depth = lane_blocked(L, layout) ? 3 /* open_lane_block's loop, if and loop */ : L->mode == CG_LOOP_ROWS ? 1 : nested_loops(L);
    snprintf(buf, n, "%s%*s", indent, 4 * depth, "");
}

/* A row's buffer of kept values holds at most this many elements (16 KiB of floats on the
 * thread's stack); longer rows compute them again. */
#define ROW_KEEP_MAX 4096

/* Rows mode: the full members worth keeping in a buffer of the row's between passes (a
 * transcendental function's value, which its kernel does not store as it is: a softmax's
 * exponential, whose stored copy is rounded to half precision), computed by the pass right
 * after their stage and needed again by a later one; and the narrow stores staged in a row
 * buffer (below). Sets L->kept and L->staged (NULL for none) and declares the buffers. */
static void plan_row_keep(CgKernel *L, const char *indent)
{
    const Graph *g = L->g;
    if (L->mode != CG_LOOP_ROWS || L->lane >= 0 || !L->nstages) return;
    int64_t wmax = 1;
    for (int a = 0; a < L->rank; a++)
        if (L->inner >> a & 1) {
            const int64_t d = ir_dim_max(g, L->K->shape.d[a]);
            if (d < 1 || wmax > ROW_KEEP_MAX / d) return;
            wmax *= d;
        }
    /* needed by the pass after its stage, by another (the pool's: cleared below) */
    uint8_t *first = cg_scratch(L, &L->c->scratch.first), *later = cg_scratch(L, &L->c->scratch.later);
    for (int pass = 1; pass <= L->nstages + 1; pass++) {
        L->pass = pass;
        cg_need_pass(L, pass);
        for (int32_t i = 0; i < L->K->count; i++) {
            NodeId id = CG_MEMBER(L, i);
            if (!L->needed[id]) continue;
            if (L->avail[id] + 1 == pass) first[id] = 1;
            else later[id] = 1;
        }
    }
    L->pass = 0;
    for (int32_t i = 0; i < L->K->count; i++) {
        NodeId id = CG_MEMBER(L, i);
        const Op op = (Op)g->nodes[id].op;
        const bool costly = op == OP_EXP || op == OP_LOG || op == OP_TANH || op == OP_ERF || op == OP_SIGMOID || op == OP_POW;
        if (!costly || L->f->cls[id] != CLASS_FULL || L->f->stored[id] || !first[id] || !later[id]) continue;
        if (!L->kept) L->kept = cg_scratch(L, &L->c->scratch.kept);
        L->kept[id] = 1;
        sb_printf(L->c->o, "%s%s keep%d[%lld]; /* kept between the passes over the row */\n", indent,
                  cg_value_ctype((DType)g->nodes[id].dtype), id, (long long)wmax);
    }
    for (int32_t i = 0; i < L->K->count; i++) first[CG_MEMBER(L, i)] = later[CG_MEMBER(L, i)] = 0;
    /* A pass that sums in lanes stores its half-precision copies (a narrowing cast that no
     * member reads) in the final pass over the row, from a row buffer of the fp32 values:
     * in the lanes' loop, a 16-bit store beside the 32-bit arithmetic made GCC vectorise it
     * at a quarter of the width (gpt's softmax in bf16 took 2.8x its fp32 time; 1.4x
     * staged). The buffer holds the cast's operand; rounding it once more to the same
     * format gives the same bits (round to nearest even is idempotent). */
    for (int pass = 1; pass <= L->nstages; pass++) {
        bool sums = false;
        for (int32_t i = 0; i < L->K->count; i++) {
            NodeId id = CG_MEMBER(L, i);
            sums |= cg_reduced_in_pass(L, id, pass) && g->nodes[id].op == OP_REDUCE_SUM;
        }
        for (int i = 0; i < L->nstores && sums; i++) {
            const NodeId id = L->stores[i];
            const Node *n = &g->nodes[id];
            if (!cg_stored_in_pass(L, id, pass) || n->op != OP_CAST || (n->dtype != DT_BF16 && n->dtype != DT_F16)) continue;
            const NodeId x = fusion_root(g, L->f, ir_input(g, id, 0));
            if (g->nodes[x].dtype != DT_F32 || !cg_in_kernel(L, x) || L->f->cls[x] != CLASS_FULL) continue;
            bool read = false;
            for (int32_t m = 0; m < L->K->count && !read; m++)
                for (uint32_t j = 0; j < g->nodes[CG_MEMBER(L, m)].ninputs; j++)
                    read |= fusion_root(g, L->f, ir_input(g, CG_MEMBER(L, m), (int)j)) == id;
            if (read) continue;
            if (!L->staged) L->staged = cg_scratch(L, &L->c->scratch.staged);
            L->staged[id] = 1;
            sb_printf(L->c->o, "%sfloat staged%d[%lld]; /* stored by the final pass */\n", indent, id, (long long)wmax);
        }
    }
    /* the element's position in the row: open_inner's loop variable */
    if (L->coords >> (L->rank - 1) & 1) snprintf(L->kept_index, sizeof L->kept_index, "c%d", L->rank - 1);
    else snprintf(L->kept_index, sizeof L->kept_index, "j");
}

/* Per row: the reduction stages, row values, the final pass and the row stores. */
static void emit_row_passes(CgKernel *L, const char *indent);

/* A row's passes, after the loads that are the same for the whole row (CgKernel.hoisted). */
static void emit_row_body(CgKernel *L, const char *indent)
{
    StrBuf body, hoisted, *out = L->c->o;
    sb_init(&body);
    sb_init(&hoisted);
    L->c->o = &body;
    L->hoisted = &hoisted;
    L->hoisted_done = cg_scratch(L, &L->c->scratch.hoisted);
    emit_row_passes(L, indent);
    L->c->o = out;
    for (const char *line = hoisted.data; line && *line;) {
        const char *end = strchr(line, '\n');
        sb_printf(out, "%s%.*s\n", indent, (int)(end - line), line);
        line = end + 1;
    }
    if (body.data) sb_puts(out, body.data);
    for (int i = 0; i < L->nhoisted; i++) L->hoisted_done[L->hoisted_ids[i]] = 0;
    L->nhoisted = 0;
    L->hoisted_done = NULL;
    L->hoisted = NULL;
    sb_free(&body);
    sb_free(&hoisted);
}

static void emit_row_passes(CgKernel *L, const char *indent)
{
    const Graph *g = L->g;
    StrBuf *o = L->c->o;
    char in[128];
    plan_row_keep(L, indent);
    for (int s = 0; s <= L->nstages; s++) {
        if (s > 0) {
            L->pass = s;
            StrBuf red;
            sb_init(&red);
            cg_need_pass(L, s); /* a staged copy needs its operand, not itself (cg_need_store) */
            for (int32_t i = 0; i < L->K->count; i++) {
                NodeId id = CG_MEMBER(L, i);
                const Node *n = &g->nodes[id];
                if (!cg_reduced_in_pass(L, id, s)) continue;
                const char *t = cg_ctype((DType)n->dtype);
                if (n->op == OP_REDUCE_SUM) sb_printf(o, "%s%s a%d[KILN_SUM_LANES] = {0};\n", indent, t, id);
                else sb_printf(o, "%s%s a%d[KILN_SUM_LANES] = KILN_LANES_NEG_INF;\n", indent, t, id);
                /* a NaN anywhere makes the maximum NaN, as in PyTorch: a flag per lane
                 * beside the maximum, which the comparison drops NaNs from */
                if (n->op == OP_REDUCE_MAX && !cg_never_nan(g, ir_input(g, id, 0), 0))
                    sb_printf(o, "%sint nan%d[KILN_SUM_LANES] = {0};\n", indent, id);
                sb_printf(&red, "%sa%d", red.len ? ", " : "", id);
            }
            /* sums and maxima in lanes (enum inner_layout), in SIMD blocks where the row is one loop */
            const enum inner_layout layout = !red.len ? INNER_PLAIN : L->lane >= 0 ? INNER_INDEXED : INNER_BLOCKED;
            inner_indent(L, indent, layout, in, sizeof in);
            int braces = open_inner(L, L->lane >= 0 ? NULL : "#pragma omp simd", indent, layout);
            cg_emit_needed(L, in);
            for (int32_t i = 0; i < L->K->count && L->kept; i++) {
                NodeId id = CG_MEMBER(L, i);
                if (L->kept[id] && L->needed[id] && L->avail[id] + 1 == s) sb_printf(o, "%skeep%d[%s] = t%d;\n", in, id, L->kept_index, id);
            }
            for (int32_t i = 0; i < L->K->count; i++) {
                NodeId id = CG_MEMBER(L, i);
                const Node *n = &g->nodes[id];
                if (!cg_reduced_in_pass(L, id, s)) continue;
                StrBuf v;
                sb_init(&v);
                cg_operand(L, ir_input(g, id, 0), id, false, &v);
                if (n->op == OP_REDUCE_SUM) sb_printf(o, "%sa%d[lane] += %s;\n", in, id, v.data);
                else if (cg_never_nan(g, ir_input(g, id, 0), 0))
                    sb_printf(o, "%s{\n%s    const %s v = %s;\n%s    a%d[lane] = v > a%d[lane] ? v : a%d[lane];\n%s}\n", in, in,
                              cg_ctype((DType)n->dtype), v.data, in, id, id, id, in);
                else
                    sb_printf(o, "%s{\n%s    const %s v = %s;\n%s    a%d[lane] = v > a%d[lane] ? v : a%d[lane];\n%s    nan%d[lane] |= v != v;\n%s}\n",
                              in, in, cg_ctype((DType)n->dtype), v.data, in, id, id, id, in, id, in);
                sb_free(&v);
            }
            for (int i = 0; i < L->nstores; i++) {
                const NodeId id = L->stores[i];
                if (!cg_stored_in_pass(L, id, s)) continue;
                if (L->staged && L->staged[id])
                    sb_printf(o, "%sstaged%d[%s] = t%d;\n", in, id, L->kept_index, fusion_root(g, L->f, ir_input(g, id, 0)));
                else cg_store_member(L, in, id);
            }
            if (lane_blocked(L, layout)) close_lane_block(L, indent);
            else close_braces(o, braces, indent);
            sb_free(&red);
            for (int32_t i = 0; i < L->K->count; i++) {
                NodeId id = CG_MEMBER(L, i);
                const Node *n = &g->nodes[id];
                if (L->f->cls[id] != CLASS_ROW || L->avail[id] != s) continue;
                if (n->op == OP_REDUCE_SUM) sb_printf(o, "%sconst %s w%d = KILN_LANES_SUM(a%d);\n", indent, cg_ctype((DType)n->dtype), id, id);
                if (n->op == OP_REDUCE_MAX && cg_never_nan(g, ir_input(g, id, 0), 0))
                    sb_printf(o, "%sconst %s w%d = KILN_LANES_MAX(a%d);\n", indent, cg_ctype((DType)n->dtype), id, id);
                else if (n->op == OP_REDUCE_MAX)
                    sb_printf(o, "%sconst %s w%d = KILN_LANES_ANY(nan%d) ? NAN : KILN_LANES_MAX(a%d);\n", indent, cg_ctype((DType)n->dtype), id,
                              id, id);
            }
        }
        for (int32_t i = 0; i < L->K->count; i++) {
            NodeId id = CG_MEMBER(L, i);
            const Node *n = &g->nodes[id];
            if (L->f->cls[id] == CLASS_ROW && L->avail[id] == s && n->op != OP_REDUCE_SUM && n->op != OP_REDUCE_MAX)
                cg_member_value(L, id, true, indent);
        }
    }
    /* the final pass: full values other kernels read, and the staged stores */
    L->pass = L->nstages + 1;
    if (cg_need_pass(L, L->pass) || L->staged) {
        inner_indent(L, indent, INNER_PLAIN, in, sizeof in);
        int braces = open_inner(L, L->lane >= 0 ? NULL : "#pragma omp simd", indent, INNER_PLAIN);
        cg_emit_needed(L, in);
        for (int i = 0; i < L->nstores; i++) {
            const NodeId id = L->stores[i];
            if (cg_stored_in_pass(L, id, L->pass)) cg_store_member(L, in, id);
            if (!L->staged || !L->staged[id]) continue;
            sb_printf(o, "%sy%d[i] = ", in, id);
            char staged[64];
            snprintf(staged, sizeof staged, "staged%d[%s]", id, L->kept_index);
            cg_store(o, (DType)g->nodes[id].dtype, staged);
            sb_puts(o, ";\n");
        }
        close_braces(o, braces, indent);
    }
    for (int i = 0; i < L->nstores; i++) {
        NodeId id = L->stores[i];
        if (L->f->cls[id] == CLASS_ROW) cg_store_line(o, indent, L->g, id, "row", "w%d");
        if (L->f->cls[id] == CLASS_TOTAL) {
            sb_printf(o, "%stot%d += ", indent, id);
            cg_operand(L, ir_input(g, id, 0), id, true, o);
            sb_puts(o, ";\n");
        }
    }
    L->pass = 0;
}

/* ---- kernels ---- */

static void kernel_name(Cg *c, int32_t k, StrBuf *b)
{
    const Kernel *K = &c->fp.kernels[k];
    sb_printf(b, "%s_k%d_%s", c->prefix, k, K->kind == KERNEL_GEMM ? "gemm" : K->axes ? "rows" : "map");
}

/* Inner loops this short run no faster as SIMD loops than as unrolled code. */
#define LANE_INNER_MAX 16

/* In nested mode, a loop nest whose inner axes are few elements (a 2x2 pooling window:
 * rows of 4, or a map over [.., 14, 2] whose last axis is 2) wastes the SIMD unit on
 * its innermost loop. Instead the last outer axis becomes the loop marked for SIMD, and
 * each of its iterations runs the whole row body: one window per lane. GCC vectorises
 * that loop only where it unrolls the short inner loops first (it does for a small row
 * body; cnn's pooling forward stays scalar, unrolled); either way no loop of 2 iterations
 * is set up per row. Returns that axis and, for a map kernel, moves the short trailing
 * axes into the inner loops; -1 to keep the nest. */
static int lane_axis(CgKernel *L)
{
    const Shape *s = &L->K->shape;
    uint64_t inner = L->inner;
    int64_t span = 1;
    if (!L->K->axes) {
        /* a map: the trailing axes, while their elements fit in a short unrolled loop */
        inner = 0;
        for (int a = L->rank - 1; a > 0 && ir_dim_is_const(s->d[a]) && span * s->d[a].k <= LANE_INNER_MAX / 2; a--) {
            span *= s->d[a].k;
            inner |= (uint64_t)1 << a;
        }
        if (!inner || !ir_dim_is_const(s->d[L->rank - 1]) || s->d[L->rank - 1].k > 4) return -1;
    } else {
        for (int a = 0; a < L->rank; a++) {
            if (!(inner >> a & 1)) continue;
            if (!ir_dim_is_const(s->d[a])) return -1;
            span *= s->d[a].k;
        }
        if (span > LANE_INNER_MAX) return -1;
    }
    int lane = L->rank - 1;
    while (lane >= 0 && (inner >> lane & 1)) lane--;
    if (lane < 0 || (ir_dim_is_const(s->d[lane]) && s->d[lane].k < 4)) return -1;
    L->inner = inner;
    return lane;
}

static void signature(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    sb_puts(o, "KILN_KERNEL void ");
    kernel_name(c, L->k, o);
    sb_puts(o, "(const int64_t *s");
    /* an output written in place of an input (memplan) shares its memory: no restrict */
    for (int i = 0; i < L->nreads; i++) {
        bool shared = false;
        for (int j = 0; j < L->nstores; j++) shared |= c->mp.inplace_of[L->stores[j]] == L->reads[i];
        sb_printf(o, ", const %s *%sp%d", cg_ctype((DType)g->nodes[L->reads[i]].dtype), shared ? "" : "restrict ", L->reads[i]);
    }
    for (int i = 0; i < L->nstores; i++)
        sb_printf(o, ", %s *%sy%d", cg_ctype((DType)g->nodes[L->stores[i]].dtype),
                  c->mp.inplace_of[L->stores[i]] != IR_NONE ? "" : "restrict ", L->stores[i]);
    if (L->random) sb_puts(o, ", uint64_t seed, uint64_t step");
    sb_puts(o, ")\n{\n");
    for (int sy = 0; sy < g->nsyms; sy++) sb_printf(o, "    const int64_t %s = s[%d];\n", g->syms[sy].name, sy);
    cg_declare_dims(c, "S", &L->K->shape);
}

/* Reductions over the leading axes, in memory order: each thread takes a block of columns
 * (its share, kiln_column_block) and walks down the rows, accumulating in lanes as a row's
 * sum does (enum inner_layout: element h of a column in lane h % KILN_SUM_LANES, the lanes
 * added as a fixed tree), so that a bias gradient has the same bits whether it is summed
 * here or in a kernel of rows, and whatever the block's width. */
static void emit_columns(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    sb_puts(o, "    const int64_t H = 1");
    for (int a = 0; a < L->rank; a++)
        if (L->K->axes >> a & 1) sb_printf(o, " * S%d", a);
    sb_puts(o, ", R = 1");
    for (int a = 0; a < L->rank; a++)
        if (!(L->K->axes >> a & 1)) sb_printf(o, " * S%d", a);
    sb_puts(o, ";\n");
    if (cg_may_parallel(c, &L->K->shape)) {
        sb_printf(o, "    const int64_t CB = kiln_column_block(R, H * R >= %d ? kiln_threads() : 1);\n", PARALLEL_MIN);
        sb_printf(o, "    #pragma omp parallel for if (H * R >= %d)\n", PARALLEL_MIN);
    } else {
        sb_puts(o, "    const int64_t CB = kiln_column_block(R, 1);\n");
    }
    sb_puts(o, "    for (int64_t r0 = 0; r0 < R; r0 += CB) {\n"
               "        const int64_t r1 = R - r0 < CB ? R : r0 + CB;\n");
    for (int i = 0; i < L->nstores; i++) {
        NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_ROW) continue;
        const char *t = cg_ctype((DType)g->nodes[id].dtype);
        if (g->nodes[id].op == OP_REDUCE_SUM) {
            sb_printf(o, "        %s a%d[KILN_SUM_LANES][KILN_COLUMN_BLOCK_MAX] = {{0}};\n", t, id);
        } else {
            sb_printf(o, "        %s a%d[KILN_SUM_LANES][KILN_COLUMN_BLOCK_MAX];\n", t, id);
            sb_printf(o, "        for (int lane = 0; lane < KILN_SUM_LANES; lane++)\n"
                         "            for (int j = 0; j < KILN_COLUMN_BLOCK_MAX; j++) a%d[lane][j] = -INFINITY;\n", id);
        }
    }
    sb_puts(o, "        for (int64_t h = 0; h < H; h++) {\n"
               "            const int lane = (int)(h % KILN_SUM_LANES);\n");
    /* the reduced axes' coordinates, which broadcast loads index by (kernel.c's mode choice) */
    cg_coordinates(L, L->coords & L->K->axes, L->K->axes, "h", "            ");
    sb_puts(o, "            #pragma omp simd\n"
               "            for (int64_t row = r0; row < r1; row++) {\n"
               "                const int64_t i = h * R + row;\n");
    cg_need_columns(L);
    cg_emit_column_element(L, "                ", "a", "[lane][row - r0]");
    sb_puts(o, "            }\n        }\n"
               "        for (int64_t row = r0; row < r1; row++) {\n");
    for (int i = 0; i < L->nstores; i++) {
        NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_ROW) continue;
        if (g->nodes[id].op == OP_REDUCE_SUM) {
            sb_printf(o, "            y%d[row] = KILN_LANES_SUM_AT(a%d, row - r0);\n", id, id);
        } else { /* the lanes' maximum, NaN if any lane saw one */
            sb_printf(o, "            %s m = a%d[0][row - r0];\n", cg_ctype((DType)g->nodes[id].dtype), id);
            sb_printf(o, "            for (int lane = 1; lane < KILN_SUM_LANES; lane++)\n"
                         "                if (a%d[lane][row - r0] > m || a%d[lane][row - r0] != a%d[lane][row - r0]) m = a%d[lane][row - r0];\n"
                         "            y%d[row] = m;\n", id, id, id, id, id);
        }
    }
    sb_puts(o, "        }\n    }\n");
}

/* A kernel's totals (sums of every row to one value) shared between threads: an OpenMP
 * reduction adds the threads' partial sums in an order of its own, so the total would
 * depend on the number of threads. Instead the rows (`count` of them, from `lo` to `hi`
 * in each chunk) are cut into KILN_TOTAL_CHUNKS chunks by the shape alone, the threads
 * share the chunks, each chunk sums its rows in order, and the chunks' sums are added in
 * order: the same bits whatever the threads. */
static void open_total_chunks(CgKernel *L, const char *count, const char *work)
{
    StrBuf *o = L->c->o;
    const Graph *g = L->g;
    sb_printf(o, "    #pragma omp parallel for if (%s >= %d)\n", work, PARALLEL_MIN);
    sb_puts(o, "    for (int64_t chunk = 0; chunk < KILN_TOTAL_CHUNKS; chunk++) {\n");
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) sb_printf(o, "        %s tot%d = 0;\n", cg_ctype((DType)g->nodes[L->stores[i]].dtype), L->stores[i]);
    sb_printf(o, "        const int64_t lo = %s * chunk / KILN_TOTAL_CHUNKS, hi = %s * (chunk + 1) / KILN_TOTAL_CHUNKS;\n", count, count);
}

static void close_total_chunks(CgKernel *L)
{
    StrBuf *o = L->c->o;
    const Graph *g = L->g;
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) sb_printf(o, "        part%d[chunk] = tot%d;\n", L->stores[i], L->stores[i]);
    sb_puts(o, "    }\n");
    for (int i = 0; i < L->nstores; i++) {
        const NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_TOTAL) continue;
        sb_printf(o, "    %s tot%d = 0;\n", cg_ctype((DType)g->nodes[id].dtype), id);
        sb_printf(o, "    for (int chunk = 0; chunk < KILN_TOTAL_CHUNKS; chunk++) tot%d += part%d[chunk];\n", id, id);
    }
}

/* The row index of a nested kernel from its loops' coordinates. */
static void nested_row(CgKernel *L, const char *indent)
{
    StrBuf *o = L->c->o;
    sb_printf(o, "%sconst int64_t row = 0", indent);
    for (int a = 0; a < L->rank; a++) {
        if (L->inner >> a & 1) continue;
        sb_printf(o, " + c%d", a);
        for (int b = a + 1; b < L->rank; b++)
            if (!(L->inner >> b & 1)) sb_printf(o, " * S%d", b);
    }
    sb_puts(o, ";\n");
}

/* A nested kernel with totals, shared between threads in chunks (open_total_chunks): of
 * the outer loops' iterations, or of the lane axis where there is no outer loop. */
static void emit_nested_chunked(CgKernel *L, int nouter, const char *reduction, const char *work)
{
    StrBuf *o = L->c->o;
    if (nouter) {
        sb_puts(o, "    const int64_t outer = 1");
        for (int a = 0; a < L->rank; a++)
            if (!(L->inner >> a & 1) && a != L->lane) sb_printf(o, " * S%d", a);
        sb_puts(o, ";\n");
        open_total_chunks(L, "outer", work);
        sb_puts(o, "        for (int64_t oi = lo; oi < hi; oi++) {\n            int64_t q = oi;\n");
        for (int a = L->rank - 1; a >= 0; a--) {
            if (L->inner >> a & 1 || a == L->lane) continue;
            sb_printf(o, "            const int64_t c%d = q %% S%d;\n            q /= S%d;\n", a, a, a);
        }
        const char *indent = "            ";
        if (L->lane >= 0) {
            sb_printf(o, "            #pragma omp simd%s\n", reduction);
            sb_printf(o, "            for (int64_t c%d = 0; c%d < S%d; c%d++) {\n", L->lane, L->lane, L->lane, L->lane);
            indent = "                ";
        }
        nested_row(L, indent);
        emit_row_body(L, indent);
        if (L->lane >= 0) sb_puts(o, "            }\n");
        sb_puts(o, "        }\n");
    } else {
        char lane[32];
        snprintf(lane, sizeof lane, "S%d", L->lane);
        open_total_chunks(L, lane, work);
        sb_printf(o, "        #pragma omp simd%s\n", reduction);
        sb_printf(o, "        for (int64_t c%d = lo; c%d < hi; c%d++) {\n", L->lane, L->lane, L->lane);
        nested_row(L, "            ");
        emit_row_body(L, "            ");
        sb_puts(o, "        }\n");
    }
    close_total_chunks(L);
}

static void emit_loop_kernel(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    signature(L);
    const bool parallel = cg_may_parallel(c, &L->K->shape);
    StrBuf tot;
    sb_init(&tot);
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) sb_printf(&tot, "%stot%d", tot.len ? ", " : "", L->stores[i]);
    /* totals of a kernel the threads may share are summed in chunks (open_total_chunks) */
    const bool chunked = tot.len && parallel && L->mode != CG_LOOP_FLAT && L->mode != CG_LOOP_COLUMNS &&
                         (L->mode == CG_LOOP_ROWS || L->rank - cg_popcount64(L->inner) > 0);
    for (int i = 0; i < L->nstores; i++) {
        const NodeId id = L->stores[i];
        if (L->f->cls[id] != CLASS_TOTAL) continue;
        if (chunked) sb_printf(o, "    %s part%d[KILN_TOTAL_CHUNKS];\n", cg_ctype((DType)g->nodes[id].dtype), id);
        else sb_printf(o, "    %s tot%d = 0;\n", cg_ctype((DType)g->nodes[id].dtype), id);
    }
    char reduction[600] = "";
    if (tot.len) snprintf(reduction, sizeof reduction, " reduction(+: %s)", tot.data);
    if (L->mode == CG_LOOP_FLAT) {
        sb_puts(o, "    const int64_t n = ");
        cg_numel(c, &L->K->shape);
        if (parallel) sb_printf(o, ";\n    #pragma omp parallel for simd if (n >= %d)\n", PARALLEL_MIN);
        else sb_puts(o, ";\n    #pragma omp simd\n");
        sb_puts(o, "    for (int64_t i = 0; i < n; i++) {\n");
        cg_clear_needed(L);
        for (int i = 0; i < L->nstores; i++) cg_need_store(L, L->stores[i]);
        cg_emit_needed(L, "        ");
        for (int i = 0; i < L->nstores; i++) cg_store_member(L, "        ", L->stores[i]);
        sb_puts(o, "    }\n");
    } else if (L->mode == CG_LOOP_ROWS) {
        sb_puts(o, "    const int64_t R = 1");
        for (int a = 0; a < L->rank; a++)
            if (!(L->inner >> a & 1)) sb_printf(o, " * S%d", a);
        sb_puts(o, ", W = 1");
        for (int a = 0; a < L->rank; a++)
            if (L->inner >> a & 1) sb_printf(o, " * S%d", a);
        sb_puts(o, ";\n");
        if (chunked) {
            open_total_chunks(L, "R", "R * W");
            sb_puts(o, "        for (int64_t row = lo; row < hi; row++) {\n");
            emit_row_body(L, "            ");
            sb_puts(o, "        }\n");
            close_total_chunks(L);
        } else {
            if (parallel) sb_printf(o, "    #pragma omp parallel for if (R * W >= %d)\n", PARALLEL_MIN);
            sb_puts(o, "    for (int64_t row = 0; row < R; row++) {\n");
            emit_row_body(L, "        ");
            sb_puts(o, "    }\n");
        }
    } else if (L->mode == CG_LOOP_COLUMNS) {
        emit_columns(L);
    } else {
        cg_declare_strides(c, "S", L->rank);
        /* the outer loops: every axis but the inner ones and the lane axis */
        int nloops = L->rank - cg_popcount64(L->inner), nouter = nloops - (L->lane >= 0);
        /* the element count, for the pragmas' thresholds only: written out there, as a
         * variable would be unused where the pragmas are ignored (without OpenMP) */
        char work[16 * IR_MAX_RANK] = "1";
        for (int a = 0; a < L->rank; a++)
            snprintf(work + (a ? strlen(work) : 0), sizeof work - (a ? strlen(work) : 0), "%sS%d", a ? " * " : "", a);
        if (chunked) {
            emit_nested_chunked(L, nouter, reduction, work);
        } else {
            /* no totals here, or the loops stay on one thread: a reduction clause of `simd` alone */
            if (nouter && parallel) sb_printf(o, "    #pragma omp parallel for collapse(%d) if (%s >= %d)\n", nouter, work, PARALLEL_MIN);
            int depth = 0;
            for (int a = 0; a < L->rank; a++) {
                if (L->inner >> a & 1 || a == L->lane) continue;
                sb_printf(o, "    %*sfor (int64_t c%d = 0; c%d < S%d; c%d++)%s\n", 4 * depth, "", a, a, a, a, depth == nloops - 1 ? " {" : "");
                depth++;
            }
            if (L->lane >= 0) {
                if (nouter) sb_printf(o, "    %*s#pragma omp simd%s\n", 4 * depth, "", reduction);
                else if (parallel) sb_printf(o, "    #pragma omp parallel for simd if (%s >= %d)\n", work, PARALLEL_MIN);
                else sb_printf(o, "    #pragma omp simd%s\n", reduction);
                sb_printf(o, "    %*sfor (int64_t c%d = 0; c%d < S%d; c%d++) {\n", 4 * depth, "", L->lane, L->lane, L->lane, L->lane);
            }
            if (!nloops) sb_puts(o, "    {\n");
            char indent[96];
            snprintf(indent, sizeof indent, "    %*s", 4 * (nloops ? nloops : 1), "");
            nested_row(L, indent);
            emit_row_body(L, indent);
            sb_printf(o, "    %*s}\n", 4 * (nloops ? nloops - 1 : 0), "");
        }
    }
    for (int i = 0; i < L->nstores; i++)
        if (L->f->cls[L->stores[i]] == CLASS_TOTAL) cg_store_line(o, "    ", g, L->stores[i], "0", "tot%d");
    sb_free(&tot);
    sb_puts(o, "}\n\n");
}

/* The bounds of a task's block of C (kiln_gemm_split): rows m0 + [0, mb), columns
 * n0 + [0, nb); a task past the edge does nothing. */
static void block_bounds(StrBuf *o, const char *block)
{
    sb_printf(o, "        const int64_t m0 = %s / sp.col_blocks * sp.rows, n0 = %s %% sp.col_blocks * sp.cols;\n", block, block);
    sb_puts(o, "        const int64_t mb = M - m0 < sp.rows ? M - m0 : sp.rows, nb = N - n0 < sp.cols ? N - n0 : sp.cols;\n"
               "        if (mb <= 0 || nb <= 0) continue;\n");
}

/* The batch coordinates c0 ... c<nbatch-1> of product b, row-major over S0, S1, .... */
static void batch_coords(StrBuf *o, int nbatch, const char *indent)
{
    if (nbatch > 1) sb_printf(o, "%sint64_t q = b;\n", indent);
    for (int k = nbatch - 1; k >= 0; k--) {
        if (k) sb_printf(o, "%sconst int64_t c%d = q %% S%d;\n%sq /= S%d;\n", indent, k, k, indent, k);
        else sb_printf(o, "%sconst int64_t c0 = %s;\n", indent, nbatch > 1 ? "q" : "b");
    }
}

/* The batch's products summed: the threads share blocks of the sum, cut by its shape alone,
 * and each block adds the batch's products into itself in batch order (BLAS beta 1 after
 * the first), so the sum does not depend on the number of threads. */
/* The runtime's product of a GEMM kernel's operands (kiln_gemm.h): sgemm, dgemm, or the
 * panel-widening product of half-precision operands, accumulated in float. */
static const char *gemm_fn(const Graph *g, NodeId mm)
{
    switch (g->nodes[ir_input(g, mm, 0)].dtype) {
    case DT_F64: return "kiln_dgemm";
    case DT_BF16: return "kiln_bf16gemm";
    case DT_F16: return "kiln_f16gemm";
    default: return "kiln_sgemm";
    }
}

static void emit_gemm_summed(CgKernel *L, const CgOperand *A, const CgOperand *B, const char *f, int nbatch)
{
    StrBuf *o = L->c->o;
    const Graph *g = L->g;
    NodeId sum = L->K->summed;
    sb_printf(o, "    /* C = %%%d %s", sum, cg_ctype((DType)g->nodes[sum].dtype));
    ir_shape_format(o, g, &g->nodes[sum].shape);
    sb_puts(o, ": the products summed over the batch, none stored */\n"
               "    const int ldc = (int)kiln_blas_ld(N, N);\n"
               "    /* the threads share blocks of rows or columns of the sum, cut by its shape alone\n"
               "     * (kiln_gemm_plan); each block adds the batch's products into itself in order, so the\n"
               "     * sum is the same whatever the number of threads */\n"
               "    const kiln_gemm_split sp = kiln_gemm_plan(1, M, N, K * batch, 0);\n"
               "    const int blas_threads = sp.parallel ? kiln_blas_serial_begin() : 0;\n"
               "    #pragma omp parallel for schedule(static) if (sp.parallel)\n"
               "    for (int64_t block = 0; block < sp.tasks; block++) {\n");
    block_bounds(o, "block");
    sb_printf(o, "        if (batch == 0) /* an empty batch sums to zero */\n"
                 "            for (int64_t m = m0; m < m0 + mb; m++)\n"
                 "                memset(y%d + (m * N + n0), 0, sizeof(*y%d) * (size_t)nb);\n"
                 "        for (int64_t b = 0; b < batch; b++) {\n",
              sum, sum);
    batch_coords(o, nbatch, "            ");
    StrBuf offa, offb;
    sb_init(&offa);
    sb_init(&offb);
    cg_gemm_operand_offset(L, A, nbatch, "m0", "0", &offa);
    cg_gemm_operand_offset(L, B, nbatch, "0", "n0", &offb);
    sb_printf(o, "            %s_beta(%s, %s, mb, nb, K, p%d + (%s), lda, p%d + (%s), ldb, b ? 1 : 0, y%d + (m0 * N + n0), ldc);\n",
              f, A->trans ? "CblasTrans" : "CblasNoTrans", B->trans ? "CblasTrans" : "CblasNoTrans", A->lay.base, offa.data,
              B->lay.base, offb.data, sum);
    sb_free(&offa);
    sb_free(&offb);
    sb_puts(o, "        }\n    }\n    if (sp.parallel) kiln_blas_serial_end(blas_threads);\n}\n\n");
}

static void emit_gemm_kernel(CgKernel *L)
{
    Cg *c = L->c;
    StrBuf *o = c->o;
    const Graph *g = L->g;
    NodeId mm = L->K->anchor;
    NodeId xa = ir_input(g, mm, 0), xb = ir_input(g, mm, 1);
    CgOperand A, B;
    cg_gemm_operand(L, xa, &A);
    cg_gemm_operand(L, xb, &B);
    signature(L);
    int r = L->rank, nbatch = r - 2;
    const char *f = gemm_fn(g, mm);
    sb_puts(o, "    const int64_t batch = 1");
    for (int k = 0; k < nbatch; k++) sb_printf(o, " * S%d", k);
    sb_printf(o, ", M = S%d, N = S%d, K = ", r - 2, r - 1);
    cg_dim(o, g, g->nodes[xb].shape.d[r - 2]);
    sb_puts(o, ";\n");
    cg_gemm_operand_comment(L, "A", xa, &A);
    cg_gemm_operand_comment(L, "B", xb, &B);
    cg_gemm_operand_ld(L, "a", xa, &A);
    cg_gemm_operand_ld(L, "b", xb, &B);
    NodeId wr = L->K->written;
    if (L->K->summed != IR_NONE) {
        emit_gemm_summed(L, &A, &B, f, nbatch);
        return;
    }
    bool epilogue = false; /* an epilogue member is stored */
    for (int i = 0; i < L->nstores && wr == IR_NONE; i++) epilogue |= L->stores[i] != mm;
    CgOperand C = {.trans = false};
    if (wr != IR_NONE) {
        cg_gemm_output(L, &C);
    } else {
        sb_puts(o, "    const int ldc = (int)kiln_blas_ld(N, N);\n");
    }
    sb_printf(o, "    /* the threads share the work: the products of the batch side by side, or blocks of\n"
                 "     * rows or columns of each product%s */\n"
                 "    const kiln_gemm_split sp = kiln_gemm_plan(batch, M, N, K, %d);\n"
                 "    const int blas_threads = sp.parallel ? kiln_blas_serial_begin() : 0;\n"
                 "    #pragma omp parallel for schedule(static) if (sp.parallel)\n"
                 "    for (int64_t task = 0; task < sp.tasks; task++) {\n"
                 "        const int64_t b = task / sp.blocks, block = task %% sp.blocks;\n",
              epilogue ? " (kiln_gemm_plan); each block's epilogue runs\n     * while the block is in cache" : " (kiln_gemm_plan)",
              epilogue);
    block_bounds(o, "block");
    if (nbatch) batch_coords(o, nbatch, "        ");
    StrBuf offa, offb, offc;
    sb_init(&offa);
    sb_init(&offb);
    sb_init(&offc);
    cg_gemm_operand_offset(L, &A, nbatch, "m0", "0", &offa);
    cg_gemm_operand_offset(L, &B, nbatch, "0", "n0", &offb);
    if (wr != IR_NONE) cg_gemm_operand_offset(L, &C, nbatch, "m0", "n0", &offc);
    else sb_printf(&offc, "(b * M + m0) * N + n0");
    NodeId pa = A.lay.base, pb = B.lay.base, pc = wr != IR_NONE ? wr : mm;
    if (!C.trans)
        sb_printf(o, "        %s(%s, %s, mb, nb, K, p%d + (%s), lda, p%d + (%s), ldb, y%d + (%s), ldc);\n", f,
                  A.trans ? "CblasTrans" : "CblasNoTrans", B.trans ? "CblasTrans" : "CblasNoTrans", pa, offa.data, pb,
                  offb.data, pc, offc.data);
    else
        sb_printf(o, "        %s(%s, %s, nb, mb, K, p%d + (%s), ldb, p%d + (%s), lda, y%d + (%s), ldc);\n", f,
                  B.trans ? "CblasNoTrans" : "CblasTrans", A.trans ? "CblasNoTrans" : "CblasTrans", pb, offb.data, pa,
                  offa.data, pc, offc.data);
    sb_free(&offa);
    sb_free(&offb);
    sb_free(&offc);
    if (epilogue) {
        sb_printf(o, "        for (int64_t c%d = m0; c%d < m0 + mb; c%d++) {\n", r - 2, r - 2, r - 2);
        sb_puts(o, "            #pragma omp simd\n");
        sb_printf(o, "            for (int64_t c%d = n0; c%d < n0 + nb; c%d++) {\n", r - 1, r - 1, r - 1);
        sb_printf(o, "                const int64_t i = (b * M + c%d) * N + c%d;\n", r - 2, r - 1);
        cg_clear_needed(L);
        for (int i = 0; i < L->nstores; i++)
            if (L->stores[i] != mm) cg_need_store(L, L->stores[i]);
        cg_emit_needed(L, "                ");
        for (int i = 0; i < L->nstores; i++)
            if (L->stores[i] != mm) cg_store_member(L, "                ", L->stores[i]);
        sb_puts(o, "            }\n        }\n");
    }
    sb_puts(o, "    }\n    if (sp.parallel) kiln_blas_serial_end(blas_threads);\n}\n\n");
}

/* ---- sharing ---- */

static bool is_value_name(const char *id, size_t n)
{
    /* a prefix of letters, then digits only */
    static const char *const prefixes[] = {"p", "y", "t", "w", "a", "b", "q", "r", "tot", "part", "keep", "staged", "nan"};
    size_t l = 0;
    while (l < n && !(id[l] >= '0' && id[l] <= '9')) l++;
    if (l == 0 || l == n) return false;
    for (size_t i = l; i < n; i++)
        if (!(id[i] >= '0' && id[i] <= '9')) return false;
    for (size_t q = 0; q < sizeof prefixes / sizeof *prefixes; q++)
        if (prefixes[q][0] == id[0] && !strncmp(id, prefixes[q], l) && prefixes[q][l] == 0) return true;
    return false;
}

static bool ident_char(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_' || (ch >= '0' && ch <= '9'); }

/* The code of a kernel without its comments, with the names of values (p85, t96, ...)
 * numbered by first appearance: equal for the same kernel in every layer. */
void cg_canonical_code(const char *src, StrBuf *out)
{
    StrMap names = {0};
    char **owned = NULL;
    int nowned = 0, capowned = 0;
    for (const char *s = src; *s;) {
        if (s[0] == '/' && s[1] == '*') {
            const char *e = strstr(s + 2, "*/");
            s = e ? e + 2 : s + strlen(s);
            continue;
        }
        if (ident_char(*s)) {
            const char *b = s;
            bool number = *s >= '0' && *s <= '9';
            while (ident_char(*s) || (number && *s == '.')) s++;
            size_t n = (size_t)(s - b);
            if (!number && is_value_name(b, n)) {
                char key[64], *k = n < sizeof key ? key : xmalloc(n + 1);
                memcpy(k, b, n);
                k[n] = 0;
                int32_t v = strmap_get(&names, k, -1);
                if (v < 0) {
                    v = (int32_t)names.n;
                    GROW(owned, capowned, nowned + 1);
                    owned[nowned] = k == key ? xstrdup(key) : k;
                    strmap_put(&names, owned[nowned++], v);
                } else if (k != key) {
                    free(k);
                }
                sb_printf(out, "$%d", v);
            } else {
                sb_putn(out, b, n);
            }
            continue;
        }
        const char *b = s; /* up to the next name, number or comment */
        while (*s && !ident_char(*s) && !(s[0] == '/' && s[1] == '*')) s++;
        sb_putn(out, b, (size_t)(s - b));
    }
    for (int i = 0; i < nowned; i++) free(owned[i]);
    free(owned);
    strmap_free(&names);
}

void cg_free_shared(Cg *c)
{
    strmap_free(&c->shared_raw);
    for (int i = 0; i < c->nshared_raw; i++) free(c->shared_raw_code[i]);
    free(c->shared_raw_code);
    c->shared_raw_code = NULL;
    c->nshared_raw = c->capshared_raw = 0;
    strmap_free(&c->shared);
    for (int i = 0; i < c->nshared; i++) {
        free(c->shared_code[i]);
        free(c->shared_name[i]);
    }
    free(c->shared_code);
    free(c->shared_name);
    c->nshared = c->capshared = 0;
}

/* Writes the kernel's function, unless a kernel with the same code already has one: then
 * the call uses that function (the step function's comment says so). */
void cg_emit_fused_kernel(Cg *c, int32_t k)
{
    StrBuf text, name, code;
    sb_init(&text);
    sb_init(&name);
    sb_init(&code);
    kernel_name(c, k, &name);
    StrBuf *out = c->o;
    c->o = &text;
    CgKernel L;
    cg_kernel_setup(&L, c, k);
    L.copies_from_operand = true; /* cg_store_member */
    if (L.mode == CG_LOOP_NESTED) L.lane = lane_axis(&L);
    cg_kernel_comment(&L);
    if (L.mode == CG_LOOP_GEMM) emit_gemm_kernel(&L);
    else emit_loop_kernel(&L);
    cg_kernel_teardown(&L);
    c->o = out;
    /* A kernel whose code before pruning equals an earlier kernel's (names of values
     * aside) prunes to that kernel's code too: pruning reads only which names are used,
     * and a renaming of the values maps one text's uses to the other's. Most kernels of a
     * model repeat a layer's (gpt2-124m: 676 kernels, 131 functions), and pruning them
     * all was a third of code generation. */
    StrBuf raw;
    sb_init(&raw);
    const char *after = strstr(text.data, name.data);
    cg_canonical_code(after ? after + name.len : text.data, &raw);
    int32_t j = strmap_get(&c->shared_raw, raw.data, -1);
    const bool raw_twin = j >= 0;
    if (!raw_twin) {
        cg_prune_unused(&text, 0, false); /* before the comparison: unread names make no difference */
        /* the key: the code after the function's name */
        after = strstr(text.data, name.data);
        cg_canonical_code(after ? after + name.len : text.data, &code);
        j = strmap_get(&c->shared, code.data, -1);
    }
    if (j >= 0) {
        c->fused_name[k] = c->shared_name[j];
        sb_free(&code);
    } else {
        GROW(c->shared_code, c->capshared, c->nshared + 1);
        c->shared_name = xrealloc(c->shared_name, (size_t)c->capshared * sizeof *c->shared_name);
        j = c->nshared++;
        c->shared_code[j] = code.data; /* the map's key: owned here */
        c->shared_name[j] = xstrdup(name.data);
        strmap_put(&c->shared, c->shared_code[j], j);
        c->fused_name[k] = c->shared_name[j];
        sb_puts(out, text.data);
    }
    if (!raw_twin) {
        GROW(c->shared_raw_code, c->capshared_raw, c->nshared_raw + 1);
        c->shared_raw_code[c->nshared_raw] = sb_take(&raw); /* the map's key: owned here */
        strmap_put(&c->shared_raw, c->shared_raw_code[c->nshared_raw++], j);
    }
    sb_free(&raw);
    sb_free(&text);
    sb_free(&name);
}

void cg_emit_fused_call(Cg *c, int32_t k)
{
    CgKernel L;
    cg_kernel_setup(&L, c, k);
    StrBuf *o = c->o;
    sb_printf(o, "    %s(io->syms", c->fused_name[k]);
    for (int i = 0; i < L.nreads; i++) sb_printf(o, ", v%d", L.reads[i]);
    for (int i = 0; i < L.nstores; i++) sb_printf(o, ", v%d", L.stores[i]);
    if (L.random) sb_puts(o, ", io->seed, io->step");
    sb_printf(o, "); KILN_MARK(io, %d);", k);
    StrBuf own;
    sb_init(&own);
    kernel_name(c, k, &own);
    if (strcmp(own.data, c->fused_name[k])) sb_printf(o, " /* kernel %d: the same code */", k);
    sb_puts(o, "\n");
    sb_free(&own);
    cg_kernel_teardown(&L);
}
