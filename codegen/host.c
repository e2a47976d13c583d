/* host.c — the host side of a generated model, shared by the C and the CUDA target: the
 * tables that describe it to the programs that run it (kiln_model, runtime/kiln_model.h:
 * parameters, inputs, sizes, metrics, outputs, the recipe, the kernels, the matrix
 * products) and the step functions that call its kernels in the fusion plan's order.
 *
 * The two targets' steps are the same function with the same pointers into the same
 * planned memory (parameter slabs, the activation arena); they differ in how a kernel is
 * called (a C function, or a launch on the step's stream: the caller's `call`), in where
 * the inputs come from (the CUDA step copies each from host memory to the device first),
 * in how the loss and metrics come back (read from device memory after the step's one
 * synchronisation) and in how index checks stop a step (the C step returns at the first
 * that fails; the CUDA step, which cannot stop what it has launched, has each check replace
 * bad indices by 0 so that no kernel reads out of bounds, and reports the first failed
 * check in step order once it has synchronised). */
#include "kernel.h"
#include "../runtime/kiln_recipe.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *krt_dtype_c(DType t)
{
    static const char *names[DT_COUNT] = {"KRT_BOOL", "KRT_U8", "KRT_I32", "KRT_I64", "KRT_F16", "KRT_BF16", "KRT_F32", "KRT_F64"};
    return t < DT_COUNT ? names[t] : "KRT_F32";
}

static bool cuda(const Cg *c) { return c->target == CG_TARGET_CUDA; }

/* ---- layout ---- */

void cg_layout_for(Cg *c, const Graph *g, const Graph *ref)
{
    c->param_off = xcalloc((size_t)g->nnodes + 1, sizeof *c->param_off);
    c->buffer_off = xcalloc((size_t)g->nnodes + 1, sizeof *c->buffer_off);
    c->input_index = xcalloc((size_t)g->nnodes + 1, sizeof *c->input_index);
    memset(&c->param_named, 0, sizeof c->param_named);
    ir_index_named(g, OP_PARAM, &c->param_named);
    StrMap inputs = {0}, ref_inputs = {0};
    ir_index_named(g, OP_INPUT, &inputs);
    ir_index_named(ref, OP_INPUT, &ref_inputs);
    int64_t po = 0, bo = 0;
    int ni = 0;
    for (NodeId i = 0; i < ref->nnodes; i++) {
        const Node *n = &ref->nodes[i];
        if (n->op == OP_INPUT) {
            NodeId j = strmap_get(&inputs, ir_node_name(ref, i), IR_NONE);
            if (j != IR_NONE) c->input_index[j] = ni;
            ni++;
        }
        if (n->op != OP_PARAM) continue;
        NodeId j = strmap_get(&c->param_named, ir_node_name(ref, i), IR_NONE);
        int64_t count = ir_shape_max_numel(ref, &n->shape);
        if (ir_attrs(ref, i)[1]) {
            if (j != IR_NONE) c->param_off[j] = po;
            po += count;
        } else {
            if (j != IR_NONE) c->buffer_off[j] = bo;
            bo += (count * ir_dtype_size((DType)n->dtype) + 7) / 8 * 8;
        }
    }
    /* A decode step's own inputs (the past position, the caches) follow the model's, in
     * the graph's order. */
    for (NodeId j = 0; j < g->nnodes; j++)
        if (g->nodes[j].op == OP_INPUT && strmap_get(&ref_inputs, ir_node_name(g, j), IR_NONE) == IR_NONE) c->input_index[j] = ni++;
    strmap_free(&inputs);
    strmap_free(&ref_inputs);
}

void cg_layout_free(Cg *c)
{
    free(c->param_off);
    free(c->buffer_off);
    free(c->input_index);
    c->param_off = c->buffer_off = NULL;
    c->input_index = NULL;
    strmap_free(&c->param_named);
    cg_scratch_free(c);
}

/* ---- the step ---- */

/* The comment before kernel k's call: the module path (or, outside any module, the
 * variable the anchor's value is assigned to), forward or backward, and the line of the
 * layer: where the module is called in the model file. */
static void emit_call_comment(Cg *c, int32_t k)
{
    static const char *const role_name[] = {"forward", "backward", "recomputed"};
    const NodeId id = cg_kernel_scope_node(c, k);
    const Node *n = N(c, id);
    const char *what = n->scope ? ir_str(c->g, n->scope) : ir_node_name(c->g, id);
    if (!*what) what = ir_op_info[n->op].name;
    const Loc loc = n->scope ? n->scope_loc : n->loc;
    sb_printf(c->o, "    // %s %s", what, role_name[cg_kernel_role(c, k, n->scope)]);
    if (loc.line && loc.file < c->g->nfiles) {
        const char *file = c->g->files[loc.file], *slash = strrchr(file, '/');
        sb_printf(c->o, " \u2014 %s:%u", slash ? slash + 1 : file, loc.line);
    }
    sb_puts(c->o, "\n");
}

/* Does any node or output of the step's graph read node id? */
static bool read_in_step(const Cg *c, NodeId id)
{
    const Graph *g = c->g;
    for (NodeId i = 0; i < g->nnodes; i++)
        for (uint32_t k = 0; k < g->nodes[i].ninputs; k++)
            if (ir_input(g, i, (int)k) == id) return true;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].node == id) return true;
    return false;
}

/* A decode step's key/value cache (an input "decode.NAME" of rank > 1, and the output of
 * the same name: its new rows): on the GPU the caches stay in device memory from token to
 * token (runtime/generate.c allocates them there), read in place and written by device
 * copies, where the other inputs and outputs cross from and to the host. */
static bool device_cache(const Cg *c, const char *name, NodeId id)
{
    return cuda(c) && c->decoding && !strncmp(name, "decode.", 7) && N(c, id)->shape.rank > 1;
}

/* Appends to *ids (one each; named[] marks them, all zero before) the values the code in b
 * names: v<id> as a whole identifier. */
static void names_in(const StrBuf *b, int32_t nnodes, uint8_t *named, NodeId **ids, int32_t *nids, int32_t *cap)
{
    const char *s = b->data ? b->data : "";
    for (size_t i = 0; s[i]; i++) {
        if (s[i] != 'v' || (i && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '_'))) continue;
        size_t j = i + 1;
        long id = 0;
        while (isdigit((unsigned char)s[j]) && id <= nnodes) id = id * 10 + (s[j++] - '0');
        if (j > i + 1 && !isalnum((unsigned char)s[j]) && s[j] != '_' && id < nnodes && !named[id]) {
            named[id] = 1;
            GROW(*ids, *cap, *nids + 1);
            (*ids)[(*nids)++] = (NodeId)id;
        }
        i = j - 1;
    }
}

/* Appends s as part of a C identifier: "h.3.ln_2" -> "h3_ln_2" (a dot before a digit is
 * dropped, other characters that cannot be in one are '_', never two in a row). */
void cg_ident_part(StrBuf *b, const char *s)
{
    for (; *s; s++) {
        if (*s == '.' && isdigit((unsigned char)s[1])) continue;
        const char ch = isalnum((unsigned char)*s) ? *s : '_';
        if (ch == '_' && (!b->len || b->data[b->len - 1] == '_')) continue;
        sb_putn(b, &ch, 1);
    }
    while (b->len && b->data[b->len - 1] == '_') b->data[--b->len] = 0;
}

/* Names the step may not give a value: the step's own variables, C keywords, op names
 * (math functions such as exp). */
static bool reserved_name(const Cg *c, const char *s)
{
    static const char *const words[] = {"io", "s", "cs", "stream", "blas", "checks", "bad", "auto", "break", "case", "char",
                                        "const", "continue", "default", "do", "double", "else", "enum", "extern", "float",
                                        "for", "goto", "if", "inline", "int", "long", "register", "restrict", "return",
                                        "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
                                        "unsigned", "void", "volatile", "while", "bool", "true", "false", "memcpy", "NULL"};
    for (size_t i = 0; i < sizeof words / sizeof *words; i++)
        if (!strcmp(s, words[i])) return true;
    for (int op = 0; op < OP_COUNT; op++)
        if (!strcmp(s, ir_op_info[op].name)) return true;
    for (int i = 0; i < c->g->nsyms; i++)
        if (!strcmp(s, c->g->syms[i].name)) return true;
    const size_t np = strlen(c->prefix);
    return !strncmp(s, c->prefix, np) && s[np] == '_'; /* the step's kernels */
}

/* The step's name of each value: from what it is (an input's, a parameter's name; a
 * gradient's parameter), else from the module it is computed in (Node.scope) and the
 * variable it is assigned to or its op, "_bwd" for the backward pass's; "_2", "_3", ...
 * where names would repeat. Owned by the caller (free each, then the array). */
static char **value_names(const Cg *c)
{
    const Graph *g = c->g;
    char **names = xcalloc((size_t)g->nnodes + 1, sizeof *names);
    StrMap used = {0}, next = {0};
    struct {
        char *name;
        int32_t k;
    } *bases = NULL;
    int32_t nbases = 0;
    StrBuf b;
    sb_init(&b);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = N(c, i);
        sb_free(&b);
        if (n->op == OP_INPUT || n->op == OP_PARAM) cg_ident_part(&b, ir_node_name(g, i));
        else if (c->mp.kind[i] == MEM_GRAD) {
            cg_ident_part(&b, ir_str(g, g->outputs[c->mp.offset[i]].name));
            sb_puts(&b, "_grad");
        } else {
            if (n->scope) {
                cg_ident_part(&b, ir_str(g, n->scope));
                sb_puts(&b, "_");
            }
            const char *var = ir_node_name(g, i);
            cg_ident_part(&b, *var ? var : ir_op_info[n->op].name);
            if (n->flags & NODE_BACKWARD) sb_puts(&b, "_bwd");
        }
        if (!b.len || isdigit((unsigned char)b.data[0]) || reserved_name(c, b.data)) {
            StrBuf t;
            sb_init(&t);
            sb_printf(&t, "%s%s%s", b.len && !isdigit((unsigned char)b.data[0]) ? "" : "v", b.data ? b.data : "", b.len ? "_out" : "");
            sb_free(&b);
            b = t;
        }
        if (strmap_get(&used, b.data, 0)) {
            /* the next suffix to try for this name is kept: linear in the number of values
             * even when thousands are named x */
            int32_t slot = strmap_get(&next, b.data, -1);
            if (slot < 0) {
                slot = nbases++;
                bases = xrealloc(bases, (size_t)nbases * sizeof *bases);
                bases[slot].name = xstrdup(b.data);
                bases[slot].k = 2;
                strmap_put(&next, bases[slot].name, slot);
            }
            const size_t base = b.len;
            do {
                b.len = base;
                b.data[base] = 0;
                sb_printf(&b, "_%d", bases[slot].k++);
            } while (strmap_get(&used, b.data, 0));
        }
        names[i] = xstrdup(b.data);
        strmap_put(&used, names[i], 1);
    }
    sb_free(&b);
    strmap_free(&used);
    strmap_free(&next);
    for (int32_t i = 0; i < nbases; i++) free(bases[i].name);
    free(bases);
    return names;
}

/* Appends text to o with each value v<id> under its name. */
static void put_renamed(StrBuf *o, const StrBuf *text, char *const *names, int32_t nnodes)
{
    const char *s = text->data ? text->data : "";
    size_t i = 0, from = 0;
    for (; s[i]; i++) {
        if (s[i] != 'v' || (i && (isalnum((unsigned char)s[i - 1]) || s[i - 1] == '_'))) continue;
        size_t j = i + 1;
        long id = 0;
        while (isdigit((unsigned char)s[j]) && id <= nnodes) id = id * 10 + (s[j++] - '0');
        if (j > i + 1 && !isalnum((unsigned char)s[j]) && s[j] != '_' && id < nnodes) {
            sb_putn(o, s + from, i - from);
            sb_puts(o, names[id]);
            from = j;
        }
        i = j - 1;
    }
    sb_putn(o, s + from, i - from);
}

static void pointer_decl(Cg *c, NodeId id)
{
    const Node *n = N(c, id);
    const char *t = cg_ctype((DType)n->dtype);
    StrBuf *o = c->o;
    switch ((MemKind)c->mp.kind[id]) {
    case MEM_CALLER:
        if (n->op == OP_INPUT && cuda(c) && !read_in_step(c, id)) {
            /* an inference program's predict step has the loss's inputs but does not read
             * them (the caller gives none): nothing to copy */
            sb_printf(o, "    /* input %s: not read by this step */\n", ir_node_name(c->g, id));
        } else if (n->op == OP_INPUT && device_cache(c, ir_node_name(c->g, id), id)) {
            sb_printf(o, "    const %s *v%d = (const %s *)io->inputs[%d]; /* the cache, in device memory */\n", t, id, t, c->input_index[id]);
        } else if (n->op == OP_INPUT && cuda(c)) {
            int k = c->input_index[id];
            sb_printf(o, "    const %s *v%d = (const %s *)kiln_cuda_input(io->device, %d, io->inputs[%d], (int64_t)sizeof(%s) * (", t, id, t,
                      k, k, t);
            cg_numel(c, &n->shape);
            sb_puts(o, ")); /* the batch's copy on the device */\n");
        } else if (n->op == OP_INPUT) {
            sb_printf(o, "    const %s *v%d = io->inputs[%d];\n", t, id, c->input_index[id]);
        } else if (n->op == OP_LOSS_SCALE && cuda(c)) {
            sb_printf(o, "    const float *v%d = kiln_cuda_loss_scale(io->device, io->loss_scale); /* the backward pass's seed, on the device */\n", id);
        } else if (n->op == OP_LOSS_SCALE) {
            sb_printf(o, "    const float *v%d = &io->loss_scale; /* the loss scale: the backward pass's seed */\n", id);
        } else if (ir_attrs(c->g, id)[1]) {
            sb_printf(o, "    %s *v%d = io->params + %lld; /* %s */\n", t, id, (long long)c->param_off[id], ir_node_name(c->g, id));
        } else {
            sb_printf(o, "    %s *v%d = (%s *)(io->buffers + %lld); /* %s */\n", t, id, t, (long long)c->buffer_off[id],
                      ir_node_name(c->g, id));
        }
        break;
    case MEM_ARENA:
        sb_printf(o, "    %s *v%d = (%s *)(io->arena + %lld); /* ", t, id, t, (long long)c->mp.offset[id]);
        ir_shape_format(o, c->g, &n->shape);
        sb_puts(o, " */\n");
        break;
    case MEM_GRAD: {
        const char *name = ir_str(c->g, c->g->outputs[c->mp.offset[id]].name);
        NodeId p = strmap_get(&c->param_named, name, IR_NONE);
        sb_printf(o, "    %s *v%d = io->grads + %lld; /* gradient of %s */\n", t, id, (long long)c->param_off[p], name);
        break;
    }
    case MEM_VIEW:
        sb_printf(o, "    %s *v%d = (%s *)v%d; /* a view: ", t, id, t, ir_input(c->g, id, 0));
        ir_shape_format(o, c->g, &n->shape);
        sb_puts(o, " */\n");
        break;
    case MEM_NONE: break;
    }
}

/* The step's index checks, in call order: what they check, where, and the limit, for the
 * program's error message when one fails. */
static int emit_index_checks(Cg *c, const char *prefix)
{
    StrBuf *o = c->o;
    int count = 0;
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        if (K->kind != KERNEL_SINGLE || N(c, K->anchor)->op != OP_CHECK_INDEX) continue;
        const Node *n = N(c, K->anchor);
        if (!count++) sb_printf(o, "static const kiln_index_check %s_index_checks[] = {\n", prefix);
        sb_puts(o, "    {");
        cg_c_string(o, ir_node_name(c->g, K->anchor));
        sb_printf(o, ", %u, %u, %lld},\n", n->loc.line, n->loc.col, (long long)ir_attrs(c->g, K->anchor)[0]);
    }
    if (count) sb_puts(o, "};\n\n");
    return count;
}

/* Copies node id's value to a destination expression: memcpy on the host; on the device
 * a copy on the step's stream, into device memory (gradients, buffers) or host memory
 * (forward outputs). */
static void emit_copy_out(Cg *c, NodeId id, const char *dst, const char *kind)
{
    const Node *n = N(c, id);
    StrBuf *o = c->o;
    if (cuda(c)) sb_printf(o, "    KILN_CUDA_CHECK(cudaMemcpyAsync(%s, v%d, sizeof(*v%d) * (size_t)(", dst, id, id);
    else sb_printf(o, "    memcpy(%s, v%d, sizeof(*v%d) * (size_t)(", dst, id, id);
    cg_numel(c, &n->shape);
    if (cuda(c)) sb_printf(o, "), %s, stream));\n", kind);
    else sb_puts(o, "));\n");
}

/* Forward output number fwd (graph output q) into the caller's buffer, if it gave one. */
static void emit_forward_copy(Cg *c, int32_t q, int fwd)
{
    char dst[64];
    const char *name = ir_str(c->g, c->g->outputs[q].name);
    const bool cache = device_cache(c, name, c->g->outputs[q].node);
    snprintf(dst, sizeof dst, "io->outputs[%d]", fwd);
    sb_printf(c->o, "    if (io->outputs && io->outputs[%d]) /* output %s%s */\n    ", fwd, name, cache ? ": the new rows of its cache" : "");
    emit_copy_out(c, c->g->outputs[q].node, dst, cache ? "cudaMemcpyDeviceToDevice" : "cudaMemcpyDeviceToHost");
}

static int cmp_node(const void *a, const void *b)
{
    const NodeId x = *(const NodeId *)a, y = *(const NodeId *)b;
    return x < y ? -1 : x > y;
}

/* Appends body to o after the declarations of the pointers it names (a named view's
 * viewed value too; with `all_inputs`, every input and the loss scale: the CUDA step copies
 * them), each value under its name. named[] is all zero before and after. */
static void emit_with_pointers(Cg *c, const StrBuf *body, char *const *names, uint8_t *named, bool all_inputs)
{
    const Graph *g = c->g;
    NodeId *ids = NULL;
    int32_t nids = 0, cap = 0;
    names_in(body, g->nnodes, named, &ids, &nids, &cap);
    for (int32_t i = 0; i < nids; i++) { /* grows: a view of a view */
        const NodeId v = ids[i];
        if (c->mp.kind[v] != MEM_VIEW) continue;
        const NodeId x = ir_input(g, v, 0);
        if (named[x]) continue;
        named[x] = 1;
        GROW(ids, cap, nids + 1);
        ids[nids++] = x;
    }
    for (NodeId i = 0; i < g->nnodes && all_inputs; i++)
        if (!named[i] && (N(c, i)->op == OP_INPUT || N(c, i)->op == OP_LOSS_SCALE)) {
            named[i] = 1;
            GROW(ids, cap, nids + 1);
            ids[nids++] = i;
        }
    qsort(ids, (size_t)nids, sizeof *ids, cmp_node); /* in node order: a view after what it views */
    StrBuf *const o = c->o;
    StrBuf pointers;
    sb_init(&pointers);
    c->o = &pointers;
    for (int32_t i = 0; i < nids; i++) {
        pointer_decl(c, ids[i]);
        named[ids[i]] = 0;
    }
    c->o = o;
    put_renamed(o, &pointers, names, g->nnodes);
    put_renamed(o, body, names, g->nnodes);
    sb_free(&pointers);
    free(ids);
}

/* The most kernel calls in one function of a C step: the step of a model of thousands of
 * layers as one function of tens of thousands of calls took Clang and GCC time quadratic
 * in its length (register allocation, code sinking: 24 s of a 32 s build for a chain of
 * 2,000 Linear layers); a longer step calls parts of this many kernels, each a function of
 * its own, in the same order. */
#define STEP_PART_KERNELS 256

/* Each kernel's forward outputs (next[q]: the kernel's next one, in output order; -1 ends),
 * so that the step finds them without a search among all outputs (two per parameter in a
 * training step) per kernel; fwd[q]: the output's number among the forward ones. */
typedef struct {
    int32_t *first, *next;
    int *fwd;
} ForwardOuts;

static ForwardOuts forward_outs(const Cg *c)
{
    const Graph *g = c->g;
    ForwardOuts f = {xmalloc(((size_t)c->fp.nkernels + 1) * sizeof *f.first), xmalloc(((size_t)g->noutputs + 1) * sizeof *f.next),
                     xmalloc(((size_t)g->noutputs + 1) * sizeof *f.fwd)};
    for (int32_t k = 0; k < c->fp.nkernels; k++) f.first[k] = -1;
    for (int32_t q = 0, fwd = 0; q < g->noutputs; q++)
        if (g->outputs[q].kind == OUT_FORWARD) f.fwd[q] = fwd++;
    for (int32_t q = g->noutputs - 1; q >= 0; q--) {
        if (g->outputs[q].kind != OUT_FORWARD) continue;
        const int32_t k = c->fp.kernel_of[fusion_root(g, &c->fp, g->outputs[q].node)];
        if (k < 0 || k >= c->fp.nkernels) continue;
        f.next[q] = f.first[k];
        f.first[k] = q;
    }
    return f;
}

/* The calls of kernels [from, to) into c->o: each kernel's comment and call, the gradient
 * buckets it finishes, and the forward outputs it computes, copied out as soon as it has
 * run (their memory is then free for the rest of the step: memplan.c). */
static void emit_calls(Cg *c, int32_t from, int32_t to, void (*call)(Cg *c, int32_t k), bool buckets, const ForwardOuts *fo)
{
    for (int32_t k = from; k < to; k++) {
        emit_call_comment(c, k);
        call(c, k);
        if (buckets) cg_emit_bucket_hooks(c, k);
        for (int32_t q = fo->first[k]; q >= 0; q = fo->next[q]) emit_forward_copy(c, q, fo->fwd[q]);
    }
}

static void emit_sym_decls(Cg *c)
{
    const Graph *g = c->g;
    for (int sy = 0; sy < g->nsyms; sy++)
        sb_printf(c->o, "    const int64_t %s = io->syms[%d];\n    (void)%s;\n", g->syms[sy].name, sy, g->syms[sy].name);
}

/* A C step of more than STEP_PART_KERNELS kernels: its parts, functions of their own
 * (noinline: a static function called once is inlined back otherwise), and in body the
 * calls of them, each followed by a return when one of its index checks failed. */
static void emit_step_parts(Cg *c, int nparts, StrBuf *body, char *const *names, uint8_t *named, void (*call)(Cg *c, int32_t k),
                            bool buckets, const ForwardOuts *fo)
{
    StrBuf *const o = c->o;
    for (int part = 0; part < nparts; part++) {
        const int32_t from = part * STEP_PART_KERNELS;
        const int32_t to = from + STEP_PART_KERNELS < c->fp.nkernels ? from + STEP_PART_KERNELS : c->fp.nkernels;
        const int checks_before = c->ncheck;
        StrBuf calls;
        sb_init(&calls);
        c->o = &calls;
        emit_calls(c, from, to, call, buckets, fo);
        c->o = o;
        sb_printf(o, "/* The %s step's kernels %d to %d (part %d of %d). */\n", c->prefix, from, to - 1, part + 1, nparts);
        sb_printf(o, "__attribute__((noinline)) static void %s_step_part%d(kiln_step_io *io)\n{\n", c->prefix, part + 1);
        if (c->ncheck > checks_before) sb_puts(o, "    int64_t bad; /* the first index out of range, or -1 */\n");
        emit_sym_decls(c);
        emit_with_pointers(c, &calls, names, named, false);
        sb_puts(o, "}\n\n");
        sb_free(&calls);
        sb_printf(body, "    %s_step_part%d(io);\n", c->prefix, part + 1);
        if (c->ncheck > checks_before) sb_puts(body, "    if (io->index_error) return;\n");
    }
}

void cg_emit_step(Cg *c, bool train, void (*call)(Cg *c, int32_t k))
{
    const Graph *g = c->g;
    const char *prefix = c->prefix;
    StrBuf *o = c->o;
    const int nparts = cuda(c) || c->fp.nkernels <= STEP_PART_KERNELS ? 1 : (c->fp.nkernels + STEP_PART_KERNELS - 1) / STEP_PART_KERNELS;
    StrBuf title;
    sb_init(&title);
    sb_printf(&title, "/* The %s: %d kernels, %lld bytes of activations at the largest sizes. */\n",
              train                        ? "training step"
              : c->decoding                ? "decode step (T new tokens after P cached ones, batch 1)"
              : !strcmp(prefix, "predict") ? "predict step (the forward to the outputs, without the loss)"
                                           : "evaluation step",
              c->fp.nkernels,
              (long long)c->mp.arena_bytes);
    if (nparts == 1) sb_puts(o, title.data);
    int nchecks = emit_index_checks(c, prefix);
    c->ncheck = 0;
    char **names = value_names(c);
    uint8_t *named = xcalloc((size_t)g->nnodes + 1, 1);
    const bool buckets = train && c->bucket_bytes > 0;
    if (buckets) cg_plan_buckets(c);
    ForwardOuts fo = forward_outs(c);
    /* the body first, into its own buffer: the step then declares only the pointers it
     * names (a fused kernel's intermediate values have memory of their own in no step) */
    StrBuf body;
    sb_init(&body);
    if (nparts > 1) {
        emit_step_parts(c, nparts, &body, names, named, call, buckets, &fo);
        sb_puts(o, title.data);
    }
    sb_free(&title);
    sb_printf(o, "static void %s_step(kiln_step_io *io)\n{\n", prefix);
    sb_puts(o, "    io->index_error = NULL;\n");
    if (cuda(c)) {
        sb_puts(o, "    const kiln_cuda_step cs = kiln_cuda_begin(io->device); /* its stream and cuBLAS handle */\n"
                   "    cudaStream_t stream = cs.stream;\n"
                   "    cublasHandle_t blas = cs.blas;\n"
                   "    (void)blas;\n");
        if (nchecks) sb_puts(o, "    int64_t *checks = kiln_cuda_checks(io->device); /* per check: first bad position (-1: none), value */\n");
    } else if (nchecks && nparts == 1) {
        sb_puts(o, "    int64_t bad; /* the first index out of range, or -1 */\n");
    }
    emit_sym_decls(c);
    StrBuf *const decls = o;
    c->o = o = &body;
    if (nparts == 1) emit_calls(c, 0, c->fp.nkernels, call, buckets, &fo);
    free(fo.first);
    free(fo.next);
    free(fo.fwd);
    int metric = 0, fwd = 0;
    for (int32_t k = 0; k < g->noutputs; k++) {
        const Output *out = &g->outputs[k];
        NodeId v = out->node;
        switch ((OutputKind)out->kind) {
        case OUT_LOSS:
            if (cuda(c)) sb_printf(o, "    kiln_cuda_read_scalar(io->device, 0, v%d, sizeof *v%d);\n", v, v);
            else sb_printf(o, "    io->loss = v%d[0];\n", v);
            break;
        case OUT_METRIC:
            if (cuda(c)) sb_printf(o, "    kiln_cuda_read_scalar(io->device, %d, v%d, sizeof *v%d);\n", 1 + metric++, v, v);
            else sb_printf(o, "    io->metrics[%d] = v%d[0];\n", metric++, v);
            break;
        case OUT_GRAD: {
            if (!train) break;
            NodeId p = strmap_get(&c->param_named, ir_str(g, out->name), IR_NONE);
            NodeId r = fusion_root(g, &c->fp, v);
            if (c->mp.kind[r] == MEM_GRAD && c->mp.offset[r] == k) break; /* written there by its kernel */
            char dst[64];
            snprintf(dst, sizeof dst, "io->grads + %lld", (long long)c->param_off[p]);
            sb_printf(o, "    /* gradient of %s */\n", ir_str(g, out->name));
            emit_copy_out(c, v, dst, "cudaMemcpyDeviceToDevice");
            break;
        }
        case OUT_UPDATE: {
            NodeId p = strmap_get(&c->param_named, ir_str(g, out->name), IR_NONE);
            char dst[64];
            snprintf(dst, sizeof dst, "v%d", p);
            sb_printf(o, "    /* new value of %s */\n", ir_str(g, out->name));
            emit_copy_out(c, v, dst, "cudaMemcpyDeviceToDevice");
            break;
        }
        case OUT_FORWARD: /* copied after its kernel, unless no kernel computes it */
            if (c->fp.kernel_of[fusion_root(g, &c->fp, v)] < 0) emit_forward_copy(c, k, fwd);
            fwd++;
            break;
        default: break;
        }
    }
    if (buckets) cg_emit_bucket_hooks(c, c->fp.nkernels);
    if (cuda(c)) {
        if (nchecks) sb_printf(o, "    kiln_cuda_finish(io->device, io, %s_index_checks, %d); /* waits for the step */\n", prefix, nchecks);
        else sb_puts(o, "    kiln_cuda_finish(io->device, io, NULL, 0); /* waits for the step */\n");
        metric = 0;
        for (int32_t k = 0; k < g->noutputs; k++) {
            const Output *out = &g->outputs[k];
            const char *t = cg_ctype((DType)N(c, out->node)->dtype);
            if (out->kind == OUT_LOSS) sb_printf(o, "    io->loss = *(const %s *)kiln_cuda_scalar(io->device, 0);\n", t);
            if (out->kind == OUT_METRIC)
                sb_printf(o, "    io->metrics[%d] = *(const %s *)kiln_cuda_scalar(io->device, %d);\n", metric, t, metric + 1), metric++;
        }
    }
    c->o = o = decls;
    emit_with_pointers(c, &body, names, named, cuda(c));
    for (NodeId i = 0; i < g->nnodes; i++) free(names[i]);
    free(names);
    free(named);
    sb_free(&body);
    sb_puts(o, "}\n\n");
    if (buckets) cg_emit_bucket_table(c);
    c->nchecks_max = nchecks > c->nchecks_max ? nchecks : c->nchecks_max;
}

/* ---- tables ---- */

/* The step's kernels in call order, for the program's --profile (a mark after kernel k's
 * call): the function it calls, what it computes, the model line. */
void cg_emit_kernel_table(Cg *c, void (*name)(Cg *c, int32_t k, StrBuf *b))
{
    StrBuf *o = c->o, b;
    sb_init(&b);
    sb_printf(o, "static const kiln_kernel_info %s_kernels[] = {\n", c->prefix);
    for (int32_t k = 0; k < c->fp.nkernels; k++) {
        const Kernel *K = &c->fp.kernels[k];
        const Node *n = N(c, K->anchor);
        sb_puts(o, "    {");
        sb_free(&b);
        name(c, k, &b);
        cg_c_string(o, b.data);
        sb_puts(o, ", ");
        sb_free(&b);
        if (K->kind == KERNEL_SINGLE) {
            sb_printf(&b, "%s over %s", ir_op_info[n->op].name, cg_ctype((DType)n->dtype));
            ir_shape_format(&b, c->g, &n->shape);
        } else {
            cg_kernel_title(c, k, &b);
        }
        cg_c_string(o, b.data);
        sb_printf(o, ", %u},\n", n->loc.line);
    }
    if (!c->fp.nkernels) sb_puts(o, "    {\"\", \"\", 0},\n");
    sb_puts(o, "};\n\n");
    sb_free(&b);
}

/* The FLOP count of a graph's matrix products at the current symbols, and (train graph)
 * the distinct product shapes at the bounds, for benchmarks. */
/* " * (double)(dim)", the dim in terms of the symbols' values s[]. */
static void put_dim_factor(StrBuf *t, Dim d)
{
    sb_puts(t, " * (double)(");
    if (d.nsym == 0 || d.k != 1) sb_printf(t, "%lld%s", (long long)d.k, d.nsym ? " * " : "");
    for (int q = 0; q < d.nsym; q++) sb_printf(t, "%ss[%d]", q ? " * " : "", d.sym[q]);
    sb_puts(t, ")");
}

/* The products a fused attention kernel stands for, as the unfused graph would count them
 * (its recomputation of q kᵀ in the backward not counted): forward q kᵀ and P v, 2 T S (D +
 * DV) per head; backward dP, dV, dQ and dK, twice that. False for other nodes and for the
 * kernel's members after its first. */
static bool attention_flops(const Cg *c, NodeId i, StrBuf *t)
{
    const Graph *g = c->g;
    const Node *n = &g->nodes[i];
    if ((n->op != OP_ATTENTION && n->op != OP_ATTENTION_LSE && n->op != OP_ATTENTION_GRAD) || c->fp.kernel_of[i] < 0 ||
        c->fp.kernels[c->fp.kernel_of[i]].anchor != i)
        return false;
    const Shape *q = &g->nodes[ir_input(g, i, 0)].shape, *k = &g->nodes[ir_input(g, i, 1)].shape, *v = &g->nodes[ir_input(g, i, 2)].shape;
    const int r = q->rank;
    sb_puts(t, n->op == OP_ATTENTION_GRAD ? "4.0" : "2.0");
    for (int a = 0; a < r - 1; a++) put_dim_factor(t, q->d[a]);
    put_dim_factor(t, k->d[r - 2]);
    Dim width = ir_dim_const(q->d[r - 1].k + v->d[r - 1].k);
    if (q->d[r - 1].nsym || v->d[r - 1].nsym) return false; /* head sizes are fixed (the frontend's) */
    put_dim_factor(t, width);
    return true;
}

void cg_emit_gemm_info(Cg *c, bool table)
{
    const Graph *g = c->g;
    const char *prefix = c->prefix;
    StrBuf *o = c->o;
    sb_printf(o, "static double %s_gemm_flops(const int64_t *s)\n{\n    double flops = 0;\n    (void)s;\n", prefix);
    /* one line per distinct product shape, times how many there are (every layer of a deep
     * model has the same: one line each made a function as long as the model); the sums of
     * whole numbers below 2^53 are exact in any order */
    StrMap terms = {0};
    char **text = NULL;
    NodeId *first = NULL;
    int32_t *times = NULL, nterms = 0, cap = 0;
    StrBuf t;
    sb_init(&t);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        t.len = 0;
        if (n->op == OP_MATMUL) {
            int r = n->shape.rank;
            sb_puts(&t, "2.0");
            for (int k = 0; k < r; k++) put_dim_factor(&t, n->shape.d[k]);
            put_dim_factor(&t, g->nodes[ir_input(g, i, 1)].shape.d[r - 2]);
        } else if (!attention_flops(c, i, &t)) {
            continue;
        }
        int32_t j = strmap_get(&terms, t.data, -1);
        if (j < 0) {
            j = nterms++;
            GROW(text, cap, nterms);
            first = xrealloc(first, (size_t)cap * sizeof *first);
            times = xrealloc(times, (size_t)cap * sizeof *times);
            text[j] = xstrdup(t.data);
            first[j] = i;
            times[j] = 0;
            strmap_put(&terms, text[j], j);
        }
        times[j]++;
    }
    for (int32_t j = 0; j < nterms; j++) {
        if (times[j] == 1) sb_printf(o, "    flops += %s; /* %%%d */\n", text[j], first[j]);
        else sb_printf(o, "    flops += %d.0 * %s; /* %%%d and %d more of its shape */\n", times[j], text[j], first[j], times[j] - 1);
        free(text[j]);
    }
    sb_free(&t);
    strmap_free(&terms);
    free(text);
    free(first);
    free(times);
    sb_puts(o, "    return flops;\n}\n\n");
    if (!table) return;
    sb_printf(o, "static const kiln_gemm_shape %s_gemms[] = {\n", prefix);
    int64_t(*seen)[6] = xmalloc(((size_t)g->nnodes + 1) * sizeof *seen);
    int *count = xcalloc((size_t)g->nnodes + 1, sizeof *count);
    int nseen = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_MATMUL) continue;
        int r = n->shape.rank;
        int64_t key[6] = {1, ir_dim_max(g, n->shape.d[r - 2]), ir_dim_max(g, n->shape.d[r - 1]),
                          ir_dim_max(g, g->nodes[ir_input(g, i, 1)].shape.d[r - 2]), 0, 0};
        for (int k = 0; k < r - 2; k++) key[0] *= ir_dim_max(g, n->shape.d[k]);
        for (int q = 0; q < 2; q++) {
            FusionLayout lay;
            bool trans = false;
            NodeId x = ir_input(g, i, q);
            if (fusion_layout(g, &c->fp, x, &lay) && fusion_gemm_operand(g, &lay, x, &trans)) key[4 + q] = trans;
        }
        int j = 0;
        while (j < nseen && memcmp(seen[j], key, sizeof key)) j++;
        if (j == nseen) memcpy(seen[nseen++], key, sizeof key);
        count[j]++;
    }
    for (int j = 0; j < nseen; j++)
        sb_printf(o, "    {%lld, %lld, %lld, %lld, %s, %s, %d},\n", (long long)seen[j][0], (long long)seen[j][1],
                  (long long)seen[j][2], (long long)seen[j][3], seen[j][4] ? "true" : "false", seen[j][5] ? "true" : "false",
                  count[j]);
    if (!nseen) sb_puts(o, "    {0, 0, 0, 0, false, false, 0},\n");
    sb_puts(o, "};\n\n");
    c->ngemms = nseen;
    free(seen);
    free(count);
}

/* ---- the recipe: kiln_recipe (runtime/kiln_recipe.h) as a C initialiser ----
 * Every field, in declaration order (model.cu is C++, whose designated initialisers keep
 * it): numbers exactly (the shortest text that reads back as the same double), calls and
 * choices by their enum names, strings escaped, lists as arrays emitted before. */
static void recipe_str(StrBuf *o, const char *s)
{
    if (s) cg_c_string(o, s);
    else sb_puts(o, "NULL");
}

static void recipe_num(StrBuf *o, double v)
{
    char num[64];
    util_format_double(num, sizeof num, v); /* the shortest text that reads back as v */
    sb_puts(o, num);
}

static void recipe_call(StrBuf *o, int32_t id)
{
#define CALL_ENUM_NAME(key, call, args, map, doc) "KILN_RECIPE_CALL_" #key "_" #call,
    static const char *const names[] = {KILN_RECIPE_CALLS(CALL_ENUM_NAME) ""};
#undef CALL_ENUM_NAME
    sb_puts(o, id >= 0 && id < KILN_RECIPE_NCALLS ? names[id] : "KILN_RECIPE_CALL_NONE");
}

#define EMIT_INT(o, name, v, ch) sb_printf(o, "    ." #name " = %lld,\n", (long long)(v))
#define EMIT_NUM(o, name, v, ch) (sb_puts(o, "    ." #name " = "), recipe_num(o, v), sb_puts(o, ",\n"))
#define EMIT_BOOL(o, name, v, ch) sb_printf(o, "    ." #name " = %s,\n", (v) ? "true" : "false")
#define EMIT_STR(o, name, v, ch) (sb_puts(o, "    ." #name " = "), recipe_str(o, v), sb_puts(o, ",\n"))
#define EMIT_PAIR(o, name, v, ch)                                                                                                 \
    (sb_puts(o, "    ." #name " = {"), recipe_num(o, (v)[0]), sb_puts(o, ", "), recipe_num(o, (v)[1]), sb_puts(o, "},\n"))
#define EMIT_NAME(o, name, v, ch) EMIT_NAME_##ch(o, name, v)
#define EMIT_CHOICE(o, name, list, v) sb_printf(o, "    ." #name " = KILN_RECIPE_" #list "_%s,\n", kiln_recipe_##list##_name(v))
#define EMIT_NAME_none(o, name, v) EMIT_STR(o, name, v, none)
#define EMIT_NAME_precision(o, name, v) EMIT_CHOICE(o, name, precision, v)
#define EMIT_NAME_weight_rounding(o, name, v) EMIT_CHOICE(o, name, weight_rounding, v)
#define EMIT_NAME_decay(o, name, v) EMIT_CHOICE(o, name, decay, v)
#define EMIT_NAME_anneal_strategy(o, name, v) EMIT_CHOICE(o, name, anneal_strategy, v)
#define EMIT_CALL(o, name, v, ch) (sb_puts(o, "    ." #name " = "), recipe_call(o, v), sb_puts(o, ",\n"))
#define EMIT_DATA(o, name, v, ch)                                                                                                 \
    EMIT_CALL(o, name, v, ch);                                                                                                    \
    if (r->name##_files.n) sb_printf(o, "    ." #name "_files = {recipe_" #name "_files, %d},\n", (int)r->name##_files.n);        \
    else sb_puts(o, "    ." #name "_files = {NULL, 0},\n")
#define EMIT_GROUPS(o, name, v, ch)                                                                                               \
    if (r->name.n) sb_printf(o, "    ." #name " = {recipe_groups, %d},\n", (int)r->name.n);                                       \
    else sb_puts(o, "    ." #name " = {NULL, 0},\n")
#define EMIT_SCALE(o, name, v, ch)                                                                                                \
    if ((v) == KILN_RECIPE_LOSS_SCALE_STATIC) sb_puts(o, "    ." #name " = KILN_RECIPE_LOSS_SCALE_STATIC,\n");                    \
    else sb_printf(o, "    ." #name " = KILN_RECIPE_loss_scale_%s,\n", kiln_recipe_loss_scale_name(v));                         \
    EMIT_NUM(o, name##_value, r->name##_value, ch)

static void recipe_files(StrBuf *o, const char *name, const kiln_recipe_files *f)
{
    if (!f->n) return;
    sb_printf(o, "static const kiln_recipe_file recipe_%s_files[] = {\n", name);
    for (int32_t i = 0; i < f->n; i++) {
        sb_puts(o, "    {");
        recipe_str(o, f->v[i].input);
        sb_puts(o, ", ");
        recipe_str(o, f->v[i].path);
        sb_puts(o, "},\n");
    }
    sb_puts(o, "};\n");
}

static void emit_recipe(StrBuf *o, const kiln_recipe *recipe)
{
    const kiln_recipe *r = recipe;
    recipe_files(o, "data", &r->data_files);
    recipe_files(o, "eval_data", &r->eval_data_files);
    for (int32_t k = 0; k < r->groups.n; k++) {
        const kiln_recipe_group *g = &r->groups.v[k];
        if (!g->nparams) continue;
        sb_printf(o, "static const char *const recipe_group%d_params[] = {", (int)k);
        for (int32_t i = 0; i < g->nparams; i++) {
            if (i) sb_puts(o, ", ");
            recipe_str(o, g->params[i]);
        }
        sb_puts(o, "};\n");
    }
    if (r->groups.n) {
        sb_puts(o, "static const kiln_recipe_group recipe_groups[] = {\n");
        for (int32_t k = 0; k < r->groups.n; k++) {
            const kiln_recipe_group *g = &r->groups.v[k];
            sb_puts(o, "    {");
            recipe_str(o, g->pattern);
            sb_printf(o, ", %s, %s, ", g->has_lr ? "true" : "false", g->has_weight_decay ? "true" : "false");
            recipe_num(o, g->lr);
            sb_puts(o, ", ");
            recipe_num(o, g->weight_decay);
            if (g->nparams) sb_printf(o, ", recipe_group%d_params, %d},\n", (int)k, (int)g->nparams);
            else sb_puts(o, ", NULL, 0},\n");
        }
        sb_puts(o, "};\n");
    }
    sb_puts(o, "static const kiln_recipe recipe = {\n");
#define EMIT_KEY(key, kind, d, lo, hi, ch, completed, doc) EMIT_##kind(o, key, r->key, ch);
#define EMIT_FIELD(name, kind, ch, unset) EMIT_##kind(o, name, r->name, ch);
    KILN_RECIPE_KEYS(EMIT_KEY)
    KILN_RECIPE_FIELDS(EMIT_FIELD)
#undef EMIT_KEY
#undef EMIT_FIELD
    sb_puts(o, "};\n\n");
}

void cg_emit_model_tables(Cg *c, const Graph *g, const kiln_recipe *recipe, CgModelCounts *n)
{
    StrBuf *out = c->o;
    memset(n, 0, sizeof *n);
    sb_puts(out, "static const kiln_param params[] = {\n");
    int64_t po = 0, bo = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *p = &g->nodes[i];
        if (p->op != OP_PARAM) continue;
        bool trainable = ir_attrs(g, i)[1] != 0;
        int64_t count = ir_shape_max_numel(g, &p->shape);
        sb_printf(out, "    {\"%s\", %s, %d, {", ir_node_name(g, i), krt_dtype_c((DType)p->dtype), p->shape.rank);
        for (int k = 0; k < p->shape.rank; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)p->shape.d[k].k);
        static const char *inits[] = {"KILN_INIT_ZEROS", "KILN_INIT_ONES", "KILN_INIT_CONSTANT", "KILN_INIT_UNIFORM", "KILN_INIT_NORMAL"};
        int64_t zr = ir_param_zero_row(g, i), row = zr >= 0 ? count / p->shape.d[0].k : 0;
        sb_printf(out, "}, %lld, %lld, %s, %.17g, %.17g, %s, %s, %lld, %lld},\n", (long long)count, (long long)(trainable ? po : bo),
                  inits[ir_attrs(g, i)[0]], p->fattr[0], p->fattr[1], trainable ? "true" : "false",
                  trainable && p->shape.rank >= 2 ? "true" : "false", (long long)(zr * row), (long long)(zr * row + row));
        if (trainable) po += count;
        else bo += (count * ir_dtype_size((DType)p->dtype) + 7) / 8 * 8;
        n->nparams++;
    }
    n->nparam_floats = po;
    n->buffer_bytes = bo;
    sb_puts(out, "};\n\nstatic const kiln_input inputs[] = {\n");
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *x = &g->nodes[i];
        if (x->op != OP_INPUT) continue;
        sb_printf(out, "    {\"%s\", %s, %d, {", ir_node_name(g, i), krt_dtype_c((DType)x->dtype), x->shape.rank);
        for (int k = 0; k < x->shape.rank; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)ir_dim_max(g, x->shape.d[k]));
        sb_puts(out, "}, {");
        for (int k = 0; k < x->shape.rank; k++) {
            Dim d = x->shape.d[k];
            sb_printf(out, "%s%d", k ? ", " : "", d.nsym == 1 && d.k == 1 ? d.sym[0] : -1);
        }
        sb_printf(out, "}, %lld},\n", (long long)(ir_dtype_is_float((DType)x->dtype) ? 0 : ir_index_range(g, i)));
        n->ninputs++;
    }
    sb_puts(out, "};\n\nstatic const kiln_symbol syms[] = {\n");
    for (int s = 0; s < g->nsyms; s++) sb_printf(out, "    {\"%s\", %lld},\n", g->syms[s].name, (long long)g->syms[s].max);
    if (!g->nsyms) sb_puts(out, "    {\"\", 0},\n");
    sb_puts(out, "};\n\nstatic const char *const metric_names[] = {");
    int nm = 0, no = 0;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_METRIC) sb_printf(out, "%s\"%s\"", nm++ ? ", " : "", ir_str(g, g->outputs[k].name));
    if (!nm) sb_puts(out, "NULL");
    sb_puts(out, "};\nstatic const char *const output_names[] = {");
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_FORWARD) sb_printf(out, "%s\"%s\"", no++ ? ", " : "", ir_str(g, g->outputs[k].name));
    if (!no) sb_puts(out, "NULL");
    sb_puts(out, "};\nstatic const krt_dtype output_dtypes[] = {");
    no = 0;
    for (int32_t k = 0; k < g->noutputs; k++)
        if (g->outputs[k].kind == OUT_FORWARD) sb_printf(out, "%s%s", no++ ? ", " : "", krt_dtype_c((DType)g->nodes[g->outputs[k].node].dtype));
    if (!no) sb_puts(out, "KRT_F32");
    sb_puts(out, "};\n\n");
    n->nmetrics = nm;
    n->noutputs = no;
    emit_recipe(out, recipe);
}

/* A tensor's shape as kiln_input's dims (at the bounds) and sym (the symbol a dim is, -1
 * for a number). */
static void shape_fields(StrBuf *out, const Graph *g, const Shape *s)
{
    sb_printf(out, "%d, {", s->rank);
    for (int k = 0; k < s->rank; k++) sb_printf(out, "%s%lld", k ? ", " : "", (long long)ir_dim_max(g, s->d[k]));
    sb_puts(out, "}, {");
    for (int k = 0; k < s->rank; k++) {
        Dim d = s->d[k];
        sb_printf(out, "%s%d", k ? ", " : "", d.nsym == 1 && d.k == 1 ? d.sym[0] : -1);
    }
    sb_puts(out, "}");
}

void cg_emit_infer_tables(Cg *c, const Graph *train, const Graph *predict)
{
    StrBuf *out = c->o;
    bool *read = xcalloc((size_t)predict->nnodes + 1, sizeof *read);
    for (NodeId i = 0; i < predict->nnodes; i++)
        for (uint32_t k = 0; k < predict->nodes[i].ninputs; k++) read[ir_input(predict, i, (int)k)] = true;
    for (int32_t k = 0; k < predict->noutputs; k++) read[predict->outputs[k].node] = true;
    sb_puts(out, "/* Per input: whether the forward (the predict step) reads it; the others only the loss\n"
                 " * and metrics. */\nstatic const bool forward_inputs[] = {");
    int ni = 0;
    for (NodeId i = 0; i < train->nnodes; i++) {
        if (train->nodes[i].op != OP_INPUT) continue;
        NodeId j = ir_find_named(predict, OP_INPUT, ir_node_name(train, i));
        sb_printf(out, "%s%s", ni++ ? ", " : "", j != IR_NONE && read[j] ? "true" : "false");
    }
    if (!ni) sb_puts(out, "false");
    free(read);
    sb_puts(out, "};\n\n/* The forward's outputs: dtype and shape (dims at the bounds; sym: the symbol a dim is). */\n"
                 "static const kiln_input output_info[] = {\n");
    int no = 0;
    for (int32_t k = 0; k < train->noutputs; k++) {
        const Output *o = &train->outputs[k];
        if (o->kind != OUT_FORWARD) continue;
        const Node *n = &train->nodes[o->node];
        sb_printf(out, "    {\"%s\", %s, ", ir_str(train, o->name), krt_dtype_c((DType)n->dtype));
        shape_fields(out, train, &n->shape);
        sb_puts(out, ", 0},\n");
        no++;
    }
    if (!no) sb_puts(out, "    {\"\", KRT_F32, 0, {0}, {0}, 0},\n");
    sb_puts(out, "};\n\n");
}

static void io_entry(StrBuf *out, const Graph *g, const char *name, NodeId id)
{
    const Node *n = &g->nodes[id];
    sb_puts(out, "    {");
    cg_c_string(out, name);
    sb_printf(out, ", %s, ", krt_dtype_c((DType)n->dtype));
    shape_fields(out, g, &n->shape);
    sb_puts(out, ", 0},\n");
}

void cg_emit_decode_tables(Cg *c, const Graph *train, const Graph *decode, const char *why)
{
    StrBuf *out = c->o;
    int ni = 0, no = 0;
    if (decode) {
        sb_puts(out, "/* The decode step's inputs after the model's: the number of cached positions P, then\n"
                     " * each attention's cached keys and values [KV, B, H, hd] (time-major; KV = P + T). */\n"
                     "static const kiln_input decode_inputs[] = {\n");
        for (NodeId j = 0; j < decode->nnodes; j++)
            if (decode->nodes[j].op == OP_INPUT && ir_find_named(train, OP_INPUT, ir_node_name(decode, j)) == IR_NONE) {
                io_entry(out, decode, ir_node_name(decode, j), j);
                ni++;
            }
        if (!ni) sb_puts(out, "    {\"\", KRT_F32, 0, {0}, {0}, 0}, /* none: a forward without positions or attention */\n");
        sb_puts(out, "};\n\n/* The decode step's outputs: the forward's and each cache's new rows [T, B, H, hd]. */\n"
                     "static const kiln_input decode_outputs[] = {\n");
        for (int32_t k = 0; k < decode->noutputs; k++)
            if (decode->outputs[k].kind == OUT_FORWARD) {
                io_entry(out, decode, ir_str(decode, decode->outputs[k].name), decode->outputs[k].node);
                no++;
            }
        sb_puts(out, "};\n\n");
        sb_printf(out, "static const kiln_symbol decode_syms[] = {\n");
        for (int k = 0; k < decode->nsyms; k++) sb_printf(out, "    {\"%s\", %lld},\n", decode->syms[k].name, (long long)decode->syms[k].max);
        sb_puts(out, "};\n\n");
    }
    c->ndecode_inputs = ni;
    c->ndecode_outputs = no;
    c->ndecode_syms = decode ? decode->nsyms : 0;
    free(c->decode_why);
    c->decode_why = NULL;
    if (why && *why) c->decode_why = xstrdup(why);
}


void cg_emit_model_def(Cg *c, const Graph *train, const CgModelCounts *n, int64_t train_arena, int64_t eval_arena)
{
    StrBuf *out = c->o;
    StrBuf source_literal;
    sb_init(&source_literal);
    cg_c_string(&source_literal, c->source);
    const unsigned long long hash = (unsigned long long)(c->model_hash ? c->model_hash : ir_hash(train, NULL)) /* the driver's, or (tests) the graph's */;
    if (cuda(c))
        sb_printf(out, "/* The model, as the %s program sees it: its steps run on the GPU (device.cu). */\n"
                       "extern \"C\" ",
                  c->infer ? "inference" : "training");
    StrBuf decode_fields;
    sb_init(&decode_fields);
    if (c->has_decode)
        sb_printf(&decode_fields, "    .decode_step = decode_step, .decode_gemm_flops = decode_gemm_flops, .decode_arena_bytes = %lld,\n"
                                  "    .ndecode_kernels = %d, .decode_kernels = decode_kernels,\n"
                                  "    .ndecode_syms = %d, .decode_syms = decode_syms,\n"
                                  "    .ndecode_inputs = %d, .decode_inputs = decode_inputs,\n"
                                  "    .ndecode_outputs = %d, .decode_outputs = decode_outputs,\n",
                  (long long)c->decode_arena, c->ndecode_kernels, c->ndecode_syms, c->ndecode_inputs, c->ndecode_outputs);
    if (cuda(c) && !c->has_decode) /* C++ (g++ -Wextra): every field given, in order */
        sb_puts(&decode_fields, "    .decode_step = NULL, .decode_gemm_flops = NULL, .decode_arena_bytes = 0, .ndecode_kernels = 0,\n"
                                "    .decode_kernels = NULL, .ndecode_syms = 0, .decode_syms = NULL, .ndecode_inputs = 0, .decode_inputs = NULL,\n"
                                "    .ndecode_outputs = 0, .decode_outputs = NULL,\n");
    if (c->decode_why) {
        sb_puts(&decode_fields, "    .decode_unsupported = ");
        cg_c_string(&decode_fields, c->decode_why);
        sb_puts(&decode_fields, ",\n");
    }
    if (cuda(c) && !c->decode_why) sb_puts(&decode_fields, "    .decode_unsupported = NULL,\n");
    if (cuda(c)) sb_puts(&decode_fields, "    .nbuckets = 0, .buckets = NULL,\n"); /* inference programs run on one process */
    free(c->decode_why);
    c->decode_why = NULL;
    if (c->infer) {
        /* An inference program: the evaluation and predict steps, no training step; on the
         * CUDA target they run on the GPU (C++: the fields in declaration order, the
         * training step's given as none, as g++ -Wextra wants every field before the last
         * one given). */
        StrBuf device;
        sb_init(&device);
        sb_printf(&device, "    .nindex_checks = %d, .device = &kiln_cuda_device,\n", c->nchecks_max);
        sb_printf(out, "const kiln_model kiln_model_def = {\n"
                       "    .name = \"%s\",\n    .source = %s,\n    .hash = \"%016llx\",\n"
                       "    .nparams = %d, .params = params, .nparam_floats = %lld, .buffer_bytes = %lld,\n"
                       "    .ninputs = %d, .inputs = inputs, .nsyms = %d, .syms = syms,\n"
                       "    .nmetrics = %d, .metric_names = metric_names,\n"
                       "    .noutputs = %d, .output_names = output_names, .output_dtypes = output_dtypes,\n"
                       "    %s.eval_arena_bytes = %lld,\n"
                       "    .recipe = &recipe,\n"
                       "    %s.eval_step = eval_step, %s.eval_gemm_flops = eval_gemm_flops,\n"
                       "    %s.neval_kernels = %d, %s.eval_kernels = eval_kernels,\n"
                       "%s"
                       "    .predict_step = predict_step, .predict_gemm_flops = predict_gemm_flops,\n"
                       "    .predict_arena_bytes = %lld, .npredict_kernels = %d, .predict_kernels = predict_kernels,\n"
                       "    .forward_inputs = forward_inputs, .outputs = output_info,\n",
                  train->name, source_literal.data, hash, n->nparams, (long long)n->nparam_floats, (long long)n->buffer_bytes,
                  n->ninputs, train->nsyms, n->nmetrics, n->noutputs, cuda(c) ? ".train_arena_bytes = 0, " : "", (long long)eval_arena,
                  cuda(c) ? ".train_step = NULL, " : "", cuda(c) ? ".train_gemm_flops = NULL, " : "",
                  cuda(c) ? ".ntrain_gemms = 0, .train_gemms = NULL, .ntrain_kernels = 0, " : "", c->nkernels[1],
                  cuda(c) ? ".train_kernels = NULL, " : "", cuda(c) ? device.data : "", (long long)c->predict_arena, c->npredict_kernels);
        sb_free(&device);
        sb_printf(out, "%s};\n", decode_fields.data ? decode_fields.data : "");
        sb_free(&decode_fields);
        (void)train_arena;
        sb_free(&source_literal);
        return;
    }
    sb_printf(out, "const kiln_model kiln_model_def = {\n"
                   "    .name = \"%s\",\n    .source = %s,\n    .hash = \"%016llx\",\n"
                   "    .nparams = %d, .params = params, .nparam_floats = %lld, .buffer_bytes = %lld,\n"
                   "    .ninputs = %d, .inputs = inputs, .nsyms = %d, .syms = syms,\n"
                   "    .nmetrics = %d, .metric_names = metric_names,\n"
                   "    .noutputs = %d, .output_names = output_names, .output_dtypes = output_dtypes,\n"
                   "    .train_arena_bytes = %lld, .eval_arena_bytes = %lld,\n"
                   "    .recipe = &recipe,\n"
                   "    .train_step = train_step, .eval_step = eval_step,\n"
                   "    .train_gemm_flops = train_gemm_flops, .eval_gemm_flops = eval_gemm_flops,\n"
                   "    .ntrain_gemms = %d, .train_gemms = train_gemms,\n",
              train->name, source_literal.data, hash, n->nparams, (long long)n->nparam_floats, (long long)n->buffer_bytes, n->ninputs,
              train->nsyms, n->nmetrics, n->noutputs, (long long)train_arena, (long long)eval_arena, c->ngemms);
    StrBuf buckets; /* a distributed program's gradient buckets, after the decode fields (kiln_model.h's order) */
    sb_init(&buckets);
    if (c->bucket_bytes > 0) sb_printf(&buckets, "    .nbuckets = %d, .buckets = train_buckets,\n", c->nbuckets);
    if (!cuda(c))
        sb_printf(out, "    .ntrain_kernels = %d, .train_kernels = train_kernels, .neval_kernels = %d, .eval_kernels = eval_kernels,\n%s%s};\n",
                  c->nkernels[0], c->nkernels[1], decode_fields.data ? decode_fields.data : "", buckets.data ? buckets.data : "");
    else /* C++: designated initializers in declaration order */
        sb_printf(out, "    .ntrain_kernels = %d, .neval_kernels = %d, .train_kernels = train_kernels, .eval_kernels = eval_kernels,\n"
                       "    .nindex_checks = %d,\n    .device = &kiln_cuda_device,\n%s};\n",
                  c->nkernels[0], c->nkernels[1], c->nchecks_max, buckets.data ? buckets.data : "");
    sb_free(&buckets);
    sb_free(&decode_fields);
    sb_free(&source_literal);
}
