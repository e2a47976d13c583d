/* memplan.c — activation memory: liveness-based offsets in one arena (see passes.h).
 *
 * A stored value is live from the kernel that computes it to the last kernel that reads
 * it (directly, through views, through a broadcast recomputed inside the reader, or through
 * a value the reader recomputes from it), or to the end for graph outputs. Kernels run in
 * FusionPlan order; at each, its outputs are placed first, then the values it was the last
 * reader of are released, so an output never shares bytes with an input of the same kernel.
 *
 * Two placements of the same lifetimes are made and the smaller arena kept: first fit as
 * the kernels run, and, once every lifetime is known, the largest blocks first, each at the
 * lowest offset free over its whole lifetime (greedy by size, as TFLite's planner). First fit
 * leaves holes where a large value later finds no room (gpt2-124m in bf16: 5.19 GB of arena
 * for a peak of 5.03 GB live); placing the largest first packs them. */
#include "passes.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int64_t off, size;
} Block;

int64_t memplan_node_bytes(const Graph *g, NodeId id)
{
    int64_t n = ir_shape_max_numel(g, &g->nodes[id].shape);
    int64_t b = n * ir_dtype_size((DType)g->nodes[id].dtype);
    return (b + 63) / 64 * 64;
}

typedef struct {
    Block *list;
    int n, cap;
    int64_t top;
} FreeList;

static int64_t alloc_block(FreeList *fl, int64_t size)
{
    for (int i = 0; i < fl->n; i++) {
        Block *b = &fl->list[i];
        if (b->size >= size) {
            int64_t off = b->off;
            b->off += size;
            b->size -= size;
            if (!b->size) {
                memmove(b, b + 1, (size_t)(fl->n - i - 1) * sizeof *b);
                fl->n--;
            }
            return off;
        }
    }
    /* Grow the arena, reusing a free block that ends at the top. */
    if (fl->n && fl->list[fl->n - 1].off + fl->list[fl->n - 1].size == fl->top) {
        int64_t off = fl->list[fl->n - 1].off;
        fl->n--;
        fl->top = off + size;
        return off;
    }
    int64_t off = fl->top;
    fl->top += size;
    return off;
}

static void free_block(FreeList *fl, int64_t off, int64_t size)
{
    int i = 0;
    while (i < fl->n && fl->list[i].off < off) i++;
    GROW(fl->list, fl->cap, fl->n + 1);
    memmove(fl->list + i + 1, fl->list + i, (size_t)(fl->n - i) * sizeof *fl->list);
    fl->list[i] = (Block){off, size};
    fl->n++;
    if (i + 1 < fl->n && fl->list[i].off + fl->list[i].size == fl->list[i + 1].off) {
        fl->list[i].size += fl->list[i + 1].size;
        memmove(fl->list + i + 1, fl->list + i + 2, (size_t)(fl->n - i - 2) * sizeof *fl->list);
        fl->n--;
    }
    if (i > 0 && fl->list[i - 1].off + fl->list[i - 1].size == fl->list[i].off) {
        fl->list[i - 1].size += fl->list[i].size;
        memmove(fl->list + i, fl->list + i + 1, (size_t)(fl->n - i - 1) * sizeof *fl->list);
        fl->n--;
    }
}

/* The stored value a read of node x by kernel k stands for (through views and broadcasts). */
static NodeId read_root(const Graph *g, const FusionPlan *f, NodeId x, int32_t k, NodeId reader)
{
    NodeId r = fusion_root(g, f, x);
    if (fusion_is_broadcast(g, f, r, k, reader)) r = fusion_root(g, f, ir_input(g, r, 0));
    return r;
}

typedef struct {
    NodeId *list;
    int n, cap;
} Reads;

/* Root r as kernel k reads it: a value another kernel computed but did not store (it is
 * recomputed here, fusion.c) stands for the values it is computed from. */
static void add_read(const Graph *g, const FusionPlan *f, NodeId r, int32_t k, Reads *rd)
{
    if (f->role[r] == ROLE_KERNEL && f->kernel_of[r] != k && f->recomputed[r]) {
        for (uint32_t q = 0; q < g->nodes[r].ninputs; q++) add_read(g, f, read_root(g, f, ir_input(g, r, (int)q), k, r), k, rd);
        return;
    }
    GROW(rd->list, rd->cap, rd->n + 1);
    rd->list[rd->n++] = r;
}

/* The stored values kernel k reads (with repeats). */
static void kernel_reads(const Graph *g, const FusionPlan *f, int32_t k, Reads *rd)
{
    const Kernel *K = &f->kernels[k];
    rd->n = 0;
    for (int32_t j = 0; j < K->count; j++) {
        NodeId id = f->members[K->first + j];
        for (uint32_t q = 0; q < g->nodes[id].ninputs; q++) add_read(g, f, read_root(g, f, ir_input(g, id, (int)q), k, id), k, rd);
    }
}

/* An input of elementwise loop kernel k whose bytes output `out` can take: stored in the
 * arena, read last by k, read only element for element (not as a broadcast), and of the
 * same element size and count. IR_NONE when there is none. */
static NodeId inplace_input(const Graph *g, const FusionPlan *f, const MemPlan *m, int32_t k, NodeId out,
                            const int32_t *last, const bool *taken)
{
    const Kernel *K = &f->kernels[k];
    if (K->kind != KERNEL_LOOP || K->axes || f->cls[out] != CLASS_FULL) return IR_NONE;
    int64_t size = ir_dtype_size((DType)g->nodes[out].dtype), bytes = memplan_node_bytes(g, out);
    Dim n_out;
    if (!ir_shape_numel(&g->nodes[out].shape, &n_out)) return IR_NONE;
    for (int32_t j = 0; j < K->count; j++) {
        NodeId id = f->members[K->first + j];
        for (uint32_t q = 0; q < g->nodes[id].ninputs; q++) {
            NodeId x = ir_input(g, id, (int)q);
            NodeId r = fusion_root(g, f, x);
            if (fusion_is_broadcast(g, f, r, k, id) || m->kind[r] != MEM_ARENA || f->kernel_of[r] == k) continue;
            if (last[r] != k || taken[r] || memplan_node_bytes(g, r) != bytes) continue;
            if (ir_dtype_size((DType)g->nodes[r].dtype) != size) continue;
            Dim n_r;
            if (!ir_shape_numel(&g->nodes[r].shape, &n_r) || !ir_dim_eq(n_r, n_out)) continue;
            /* every read of r in the kernel must be element for element */
            bool plain = true;
            for (int32_t j2 = 0; j2 < K->count && plain; j2++) {
                NodeId id2 = f->members[K->first + j2];
                for (uint32_t q2 = 0; q2 < g->nodes[id2].ninputs; q2++) {
                    NodeId r2 = fusion_root(g, f, ir_input(g, id2, (int)q2));
                    if (r2 == r) continue;
                    if (fusion_is_broadcast(g, f, r2, k, id2) && fusion_root(g, f, ir_input(g, r2, 0)) == r) plain = false;
                }
            }
            if (plain) return r;
        }
    }
    return IR_NONE;
}

/* A block of the arena: a value's bytes, and those of the values that take them in place,
 * from the kernel that places it to the kernel that releases it (both included). */
typedef struct {
    int64_t size, off;
    int32_t born, died;
} Life;

typedef struct {
    Life *list;
    int32_t n, cap;
} Lives;

static int by_size(const void *a, const void *b)
{
    const Life *x = *(Life *const *)a, *y = *(Life *const *)b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    return x->born < y->born ? -1 : x->born > y->born;
}

/* Blocks beyond which the arena keeps first fit alone: placing by size compares each block
 * with those placed before it (quadratic; 8192 blocks, a model of some 130 layers, take
 * about 0.05 s), and `kiln check` stays linear in the layers of a huge model (test_scale). */
#define PLACE_BY_SIZE_MAX 8192

/* Greedy by size: each block, largest first, at the lowest offset where no placed block of
 * an overlapping lifetime is; sets every off and returns the arena's size. The placed
 * blocks are kept in order of offset, so one walk finds the first gap. */
static int64_t place_by_size(Lives *lv)
{
    const int32_t n = lv->n;
    Life **order = xmalloc(((size_t)n + 1) * sizeof *order), **placed = xmalloc(((size_t)n + 1) * sizeof *placed);
    for (int32_t i = 0; i < n; i++) order[i] = &lv->list[i];
    qsort(order, (size_t)n, sizeof *order, by_size);
    int64_t top = 0;
    int32_t nplaced = 0;
    for (int32_t i = 0; i < n; i++) {
        Life *b = order[i];
        int64_t off = 0;
        for (int32_t j = 0; j < nplaced; j++) {
            const Life *q = placed[j];
            if (q->born > b->died || b->born > q->died) continue; /* never alive together */
            if (q->off >= off + b->size) break;                    /* the gap before it fits */
            if (q->off + q->size > off) off = q->off + q->size;
        }
        b->off = off;
        if (off + b->size > top) top = off + b->size;
        int32_t at = nplaced; /* after the blocks at lower or equal offsets */
        while (at > 0 && placed[at - 1]->off > off) at--;
        memmove(placed + at + 1, placed + at, (size_t)(nplaced - at) * sizeof *placed);
        placed[at] = b;
        nplaced++;
    }
    free(order);
    free(placed);
    return top;
}

void memplan_run(const Graph *g, const FusionPlan *f, MemPlan *m)
{
    size_t nn = (size_t)g->nnodes + 1;
    m->kind = xcalloc(nn, 1);
    m->offset = xcalloc(nn, sizeof *m->offset);
    m->inplace_of = xmalloc(nn * sizeof *m->inplace_of);
    for (NodeId i = 0; i < g->nnodes; i++) m->inplace_of[i] = IR_NONE;
    int32_t *last = xmalloc(nn * sizeof *last);
    for (NodeId i = 0; i < g->nnodes; i++) {
        last[i] = -1;
        switch ((NodeRole)f->role[i]) {
        case ROLE_MEMORY: m->kind[i] = MEM_CALLER; break;
        case ROLE_VIEW: m->kind[i] = MEM_VIEW; break;
        case ROLE_KERNEL: m->kind[i] = f->stored[i] ? MEM_ARENA : MEM_NONE; break;
        case ROLE_INLINE: m->kind[i] = MEM_NONE; break;
        case ROLE_STRIDED: m->kind[i] = MEM_NONE; break; /* matrix products read its base */
        }
    }
    /* A view of a value that lives only in registers, or of a strided view, has no memory
     * of its own either. */
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (m->kind[i] != MEM_VIEW) continue;
        NodeId v = i;
        while (f->role[v] == ROLE_VIEW) v = ir_input(g, v, 0);
        if (f->role[v] == ROLE_STRIDED || m->kind[v] == MEM_NONE) m->kind[i] = MEM_NONE;
    }
    /* A gradient computed by a kernel lives in the caller's gradient slab: written once
     * by its kernel, read there by any later kernel, never shared. */
    for (int32_t o = 0; o < g->noutputs; o++) {
        NodeId r = fusion_root(g, f, g->outputs[o].node);
        if (g->outputs[o].kind == OUT_GRAD && m->kind[r] == MEM_ARENA && g->nodes[r].dtype == DT_F32) {
            m->kind[r] = MEM_GRAD;
            m->offset[r] = o;
        }
    }
    Reads rd = {0};
    for (int32_t k = 0; k < f->nkernels; k++) {
        kernel_reads(g, f, k, &rd);
        for (int i = 0; i < rd.n; i++) {
            NodeId r = rd.list[i];
            if (m->kind[r] == MEM_ARENA && f->kernel_of[r] != k && last[r] < k) last[r] = k;
        }
    }
    /* The step's results live to its end, but for the forward outputs: the step copies
     * each out right after the kernel that computes it (codegen/host.c), and nothing keeps
     * it after its last reader (a training step's logits are not held through the
     * backward pass for a copy that the caller usually does not ask for). */
    for (int32_t o = 0; o < g->noutputs; o++) {
        NodeId r = fusion_root(g, f, g->outputs[o].node);
        if (g->outputs[o].kind != OUT_FORWARD || f->kernel_of[r] < 0) last[r] = f->nkernels;
    }
    FreeList fl = {0};
    bool *taken = xcalloc(nn, sizeof *taken);
    Lives lv = {0};
    int32_t *life = xmalloc(nn * sizeof *life); /* per arena value: its block's index in lv */
    for (NodeId i = 0; i < g->nnodes; i++) life[i] = -1;
    for (int32_t k = 0; k < f->nkernels; k++) {
        const Kernel *K = &f->kernels[k];
        for (int32_t j = 0; j < K->count; j++) {
            NodeId id = f->members[K->first + j];
            if (m->kind[id] != MEM_ARENA) continue;
            NodeId r = inplace_input(g, f, m, k, id, last, taken);
            if (r != IR_NONE) {
                m->offset[id] = m->offset[r];
                m->inplace_of[id] = r;
                taken[r] = true;
                last[r] = -2; /* its bytes now belong to id */
                life[id] = life[r];
            } else {
                const int64_t bytes = memplan_node_bytes(g, id);
                m->offset[id] = alloc_block(&fl, bytes);
                GROW(lv.list, lv.cap, lv.n + 1);
                lv.list[lv.n] = (Life){bytes, 0, k, f->nkernels};
                life[id] = lv.n++;
            }
        }
        kernel_reads(g, f, k, &rd);
        for (int i = 0; i < rd.n; i++) {
            NodeId r = rd.list[i];
            if (m->kind[r] == MEM_ARENA && last[r] == k) {
                free_block(&fl, m->offset[r], memplan_node_bytes(g, r));
                last[r] = -2; /* released */
                if (life[r] >= 0) lv.list[life[r]].died = k;
            }
        }
        for (int32_t j = 0; j < K->count; j++) {
            NodeId id = f->members[K->first + j];
            /* stored but never read (cannot happen for stored values; kept safe) */
            if (m->kind[id] == MEM_ARENA && last[id] == -1) {
                free_block(&fl, m->offset[id], memplan_node_bytes(g, id));
                last[id] = -2;
                if (life[id] >= 0) lv.list[life[id]].died = k;
            }
        }
    }
    m->arena_bytes = fl.top;
    const int64_t packed = lv.n <= PLACE_BY_SIZE_MAX ? place_by_size(&lv) : fl.top;
    if (packed < fl.top) {
        m->arena_bytes = packed;
        for (NodeId i = 0; i < g->nnodes; i++)
            if (m->kind[i] == MEM_ARENA && life[i] >= 0) m->offset[i] = lv.list[life[i]].off;
    }
    free(lv.list);
    free(life);
    free(rd.list);
    free(fl.list);
    free(last);
    free(taken);
}

void memplan_free(MemPlan *m)
{
    free(m->kind);
    free(m->offset);
    free(m->inplace_of);
    memset(m, 0, sizeof *m);
}

int64_t memplan_arena_of(const Graph *g)
{
    FusionPlan f;
    MemPlan m;
    fusion_plan(g, &f);
    memplan_run(g, &f, &m);
    const int64_t bytes = m.arena_bytes;
    fusion_free(&f);
    memplan_free(&m);
    return bytes;
}
