/* import.c — onnx.h's onnx_import: a checked ONNX graph (read.c) written as an ordinary Kiln
 * model file, one statement per node in the graph's order with the node's name and operator
 * in a comment, and its initializers as the model's parameters (their values returned for
 * the weights file).
 *
 * Shapes are the importer's own, inferred node by node from the graph's inputs: Kiln's are
 * static but for the batch, so every shape argument (Reshape's, Unsqueeze's axes, a pool's
 * window) is folded to numbers here, and axis 0 of a graph input whose size is symbolic is
 * Kiln's batch B. Initializers read as shapes or axes are folded; those read as tensors
 * become parameters (one element: a number in the expression), under their own names in
 * holder modules where they are PyTorch state_dict paths (fc1.weight), else `p_NAME`. An
 * operator, an attribute or a shape Kiln cannot express is one error naming the node, the
 * operator and what is missing — never a model that computes something else. The
 * operators are import_ops.c's. */
#include "import_internal.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *const imp_keywords[] = {"model", "module", "const", "dim", "forward", "loss", "metric", "init", "train", "return", "for",
                                    "in",    "and",    "or",    "not", "if",      "else", "B",      "inf",  "pi",    NULL};

void imp_take(Imp *im, StrMap *m, const char *name)
{
    GROW(im->owned, im->capowned, im->nowned + 1);
    char *c = xstrdup(name);
    im->owned[im->nowned++] = c;
    strmap_put(m, c, 1);
}

/* A fresh Kiln identifier from an ONNX name: prefix, then its letters, digits and _. */
char *imp_identifier(Imp *im, const char *prefix, const char *name)
{
    StrBuf b;
    sb_init(&b);
    sb_puts(&b, prefix);
    for (const char *p = name; *p; p++) {
        const char c = isalnum((unsigned char)*p) ? *p : '_';
        if (c == '_' && b.len && b.data[b.len - 1] == '_') continue;
        sb_putc(&b, c);
    }
    while (b.len > 1 && b.data[b.len - 1] == '_') b.data[--b.len] = 0;
    if (!b.len) sb_puts(&b, "v");
    for (int k = 0; imp_keywords[k]; k++)
        if (!strcmp(b.data, imp_keywords[k])) sb_puts(&b, "_");
    char *s = sb_take(&b);
    for (int n = 2; strmap_get(&im->names, s, 0); n++) {
        sb_printf(&b, "%s_%d", s, n);
        if (!strmap_get(&im->names, b.data, 0)) {
            free(s);
            s = sb_take(&b);
            break;
        }
        b.len = 0;
    }
    sb_free(&b);
    imp_take(im, &im->names, s);
    return s;
}

int imp_refuse(Imp *im, const char *fmt, ...) KILN_PRINTF(2, 3);
int imp_refuse(Imp *im, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_printf(im->err, "%s: error: %s: ", im->path, im->node_label ? im->node_label : "the graph");
    sb_vprintf(im->err, fmt, ap);
    va_end(ap);
    return -1;
}

Val *imp_add_val(Imp *im, const char *onnx_name)
{
    GROW(im->v, im->cap, im->nv + 1);
    Val *v = im->v[im->nv] = xcalloc(1, sizeof *v);
    strmap_put(&im->vals, onnx_name, im->nv++);
    return v;
}

Val *imp_val(Imp *im, const char *onnx_name)
{
    const int32_t i = strmap_get(&im->vals, onnx_name, -1);
    return i < 0 ? NULL : im->v[i];
}

/* ---- attributes ---- */

const Onnx__AttributeProto *imp_attr(const Onnx__NodeProto *n, const char *name)
{
    for (size_t i = 0; i < n->n_attribute; i++)
        if (!strcmp(n->attribute[i]->name, name)) return n->attribute[i];
    return NULL;
}

int64_t imp_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt)
{
    const Onnx__AttributeProto *a = imp_attr(n, name);
    return a && a->has_i ? a->i : dflt;
}

double imp_attr_float(const Onnx__NodeProto *n, const char *name, double dflt)
{
    const Onnx__AttributeProto *a = imp_attr(n, name);
    return a && a->has_f ? a->f : dflt;
}

/* An ints attribute into out (at most cap): its count, or -1 when absent. */
int imp_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int cap)
{
    const Onnx__AttributeProto *a = imp_attr(n, name);
    if (!a) return -1;
    const int k = (int)(a->n_ints < (size_t)cap ? a->n_ints : (size_t)cap);
    for (int i = 0; i < k; i++) out[i] = a->ints[i];
    return k;
}

/* ---- values ---- */

/* Operand j of the node (NULL when absent or optional and left out). */
Val *imp_operand(Imp *im, size_t j)
{
    return j < im->node->n_input && im->node->input[j][0] ? imp_val(im, im->node->input[j]) : NULL;
}

/* A constant operand's integer values (shape, axes, pads...) into out: the count, or -1
 * when the operand is not a constant. */
int imp_const_ints(Imp *im, size_t j, int64_t *out, int cap)
{
    Val *x = imp_operand(im, j);
    if (!x || !x->values || x->nvalues > cap) return -1;
    for (int64_t i = 0; i < x->nvalues; i++) { /* INT64_MAX/MIN (a slice to the end) held as doubles of 2^63: clamped */
        const double v = x->values[i];
        out[i] = v >= 9.2e18 ? INT64_MAX : v <= -9.2e18 ? INT64_MIN : (int64_t)v;
    }
    return (int)x->nvalues;
}

/* Can initializer `name` keep its name, a state_dict path of identifiers (fc1.weight,
 * layer1.conv1.weight), in holder modules? Claims it if so: its first segment is not a
 * name the file uses otherwise, and it is neither a prefix of a path held nor one of them
 * a prefix of it. */
static bool claim_path(Imp *im, const char *name)
{
    int segs = 0;
    for (const char *p = name; *p; segs++) {
        const char *e = strchr(p, '.');
        const size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!n || !(isalpha((unsigned char)p[0]) || p[0] == '_')) return false;
        for (size_t i = 0; i < n; i++)
            if (!isalnum((unsigned char)p[i]) && p[i] != '_') return false;
        for (int k = 0; imp_keywords[k]; k++)
            if (strlen(imp_keywords[k]) == n && !strncmp(p, imp_keywords[k], n)) return false;
        p = e ? e + 1 : p + n;
        if (e && !*p) return false;
    }
    if (segs < 2) return false;
    const size_t first = strcspn(name, ".");
    char top[256];
    if (first >= sizeof top) return false;
    snprintf(top, sizeof top, "%.*s", (int)first, name);
    if (strmap_get(&im->names, top, 0) && !strmap_get(&im->holder, top, 0)) return false;
    const size_t len = strlen(name);
    for (int32_t i = 0; i < im->nheld; i++) {
        const char *h = im->held[i].path;
        const size_t hl = strlen(h);
        if ((hl < len && !strncmp(name, h, hl) && name[hl] == '.') || (len < hl && !strncmp(h, name, len) && h[len] == '.')) return false;
    }
    imp_take(im, &im->names, top);
    imp_take(im, &im->holder, top);
    return true;
}

/* The holder module of prefix (a held path's dotted prefix) and the ones inside it, each
 * before its user: `module P_layer1_conv1() { weight = Parameter(...) ... }`. */
static void emit_holder(Imp *im, StrBuf *out, const char *prefix)
{
    const size_t pl = strlen(prefix);
    StrBuf body;
    sb_init(&body);
    StrMap seen;
    memset(&seen, 0, sizeof seen);
    for (int32_t i = 0; i < im->nheld; i++) {
        const char *h = im->held[i].path;
        if (strncmp(h, prefix, pl) || h[pl] != '.') continue;
        const char *child = h + pl + 1, *dot = strchr(child, '.');
        char seg[256];
        snprintf(seg, sizeof seg, "%.*s", (int)(dot ? (size_t)(dot - child) : strlen(child)), child);
        if (strmap_get(&seen, seg, 0)) continue;
        imp_take(im, &seen, seg);
        if (!dot) {
            sb_printf(&body, "    %s = %s\n", seg, im->held[i].decl);
            continue;
        }
        char sub[600];
        snprintf(sub, sizeof sub, "%s.%s", prefix, seg);
        emit_holder(im, out, sub);
        sb_printf(&body, "    %s = P_", seg);
        for (const char *c = sub; *c; c++) sb_putc(&body, *c == '.' ? '_' : *c);
        sb_puts(&body, "()\n");
    }
    sb_puts(out, "module P_");
    for (const char *c = prefix; *c; c++) sb_putc(out, *c == '.' ? '_' : *c);
    sb_printf(out, "() {\n%s    forward(x) { return x }\n}\n", body.data ? body.data : "");
    strmap_free(&seen);
    sb_free(&body);
}

/* The holders, and a member for each top one: `fc1 = P_fc1()`. */
static void emit_holders(Imp *im, StrBuf *out)
{
    StrMap seen;
    memset(&seen, 0, sizeof seen);
    for (int32_t i = 0; i < im->nheld; i++) {
        char top[256];
        snprintf(top, sizeof top, "%.*s", (int)strcspn(im->held[i].path, "."), im->held[i].path);
        if (strmap_get(&seen, top, 0)) continue;
        imp_take(im, &seen, top);
        emit_holder(im, out, top);
        sb_printf(out, "%s = P_%s()\n", top, top);
    }
    if (im->nheld) sb_putc(out, '\n');
    strmap_free(&seen);
}

/* The Kiln expression of operand j: a parameter declared on first use, or a number. */
const char *imp_use(Imp *im, size_t j)
{
    Val *x = imp_operand(im, j);
    if (!x) return "";
    if ((x->init || x->values) && !x->declared) { /* a constant read as a tensor: a parameter */
        x->declared = true;
        if (x->nvalues == 1 && x->rank == 0) { /* a scalar: a number */
            char num[64];
            util_format_double(num, sizeof num, x->values[0]);
            free(x->expr);
            x->expr = xstrdup(num);
            return x->expr;
        }
        StrBuf decl;
        sb_init(&decl);
        sb_puts(&decl, "Parameter(");
        for (int a = 0; a < x->rank; a++) sb_printf(&decl, "%s%lld", a ? ", " : "", (long long)x->dims[a]);
        sb_puts(&decl, ")");
        const bool named = x->init && x->source == x->init->name;
        if (named && claim_path(im, x->init->name)) { /* in a holder module, under its own name */
            free(x->expr);
            x->expr = xstrdup(x->init->name);
            GROW(im->held, im->capheld, im->nheld + 1);
            im->held[im->nheld].path = xstrdup(x->expr);
            im->held[im->nheld++].decl = sb_take(&decl);
        } else {
            sb_printf(&im->members, "%s = %s  # %s'%s'\n", x->expr, decl.data, named ? "initializer " : "", x->source);
        }
        sb_free(&decl);
        GROW(im->w->t, im->w->cap, im->w->n + 1);
        OnnxWeight *wt = &im->w->t[im->w->n++];
        wt->name = xstrdup(x->expr);
        wt->rank = x->rank;
        memcpy(wt->dims, x->dims, sizeof wt->dims);
        wt->values = x->values;
        wt->n = x->nvalues;
        /* parameters are float32: an integer or bool constant is cast back where read */
        const char *cast = x->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__BOOL    ? "bool"
                           : x->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__INT64 ? "i64"
                           : x->dtype == ONNX__TENSOR_PROTO__DATA_TYPE__INT32 ? "i32"
                                                                              : NULL;
        if (cast) {
            StrBuf c;
            sb_init(&c);
            sb_printf(&c, "%s(%s)", cast, x->expr);
            free(x->expr);
            x->expr = sb_take(&c);
        }
    }
    return x->expr;
}

void imp_dims_text(StrBuf *b, const int64_t *d, int rank)
{
    for (int a = 0; a < rank; a++) {
        if (a) sb_puts(b, ", ");
        if (d[a] == BATCH) sb_puts(b, "B");
        else sb_printf(b, "%lld", (long long)d[a]);
    }
}

/* Output k of the node: its value, named from its ONNX name, with the given shape. */
Val *imp_result(Imp *im, size_t k, int rank, const int64_t *dims)
{
    const char *name = im->node->output[k];
    Val *v = imp_add_val(im, name);
    v->expr = imp_identifier(im, "v_", name);
    v->rank = rank;
    memcpy(v->dims, dims, (size_t)rank * sizeof *dims);
    return v;
}

/* `NAME = ` of output k, then the caller's expression, then the comment and newline. */
void imp_statement_start(Imp *im, const Val *v) { sb_printf(&im->body, "    %s = ", v->expr); }
void imp_statement_end(Imp *im)
{
    const Onnx__NodeProto *n = im->node;
    sb_printf(&im->body, "  # %s%s%s\n", n->name && n->name[0] ? n->name : "", n->name && n->name[0] ? ": " : "", n->op_type);
}

/* ---- shapes ---- */

int64_t imp_numel(const int64_t *d, int rank, int64_t batch)
{
    int64_t e = 1;
    for (int a = 0; a < rank; a++) e *= d[a] == BATCH ? batch : d[a];
    return e;
}

/* NumPy broadcasting of a and b into out: false when they do not broadcast. */
bool imp_broadcast(const Val *a, const Val *b, int *rank, int64_t *out)
{
    const int r = a->rank > b->rank ? a->rank : b->rank;
    for (int i = 0; i < r; i++) {
        const int ia = a->rank - r + i, ib = b->rank - r + i;
        const int64_t x = ia >= 0 ? a->dims[ia] : 1, y = ib >= 0 ? b->dims[ib] : 1;
        if (x == y || y == 1) out[i] = x;
        else if (x == 1) out[i] = y;
        else return false;
    }
    *rank = r;
    return true;
}

int imp_norm_axis(int64_t axis, int rank) { return (int)(axis < 0 ? axis + rank : axis); }

/* ---- the graph ---- */

/* Do the graph's inputs or declared outputs not share axis 0, all sizes fixed? Then the
 * model takes each input whole, as one sample ([1, ...] in the file, a leading axis the
 * program reads samples along), and writes each output so: a fixed model's A [2, 3] + B [3]. */
static bool whole_tensors(const Imp *im)
{
    const Onnx__GraphProto *g = im->m->graph;
    int64_t first = -1;
    bool differ = false;
    for (size_t pass = 0; pass < 2; pass++) {
        const size_t n = pass ? g->n_output : g->n_input;
        for (size_t i = 0; i < n; i++) {
            const Onnx__ValueInfoProto *v = pass ? g->output[i] : g->input[i];
            if (!pass && strmap_get(&im->m->initializer, v->name, -1) >= 0) continue;
            const Onnx__TypeProto *t = v->type;
            if (!t || !t->tensor_type || !t->tensor_type->shape) {
                if (pass) continue; /* an output of undeclared shape: what the import infers */
                return false;
            }
            const Onnx__TensorShapeProto *sh = t->tensor_type->shape;
            for (size_t a = 0; a < sh->n_dim; a++)
                if (sh->dim[a]->value_case != ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE || sh->dim[a]->dim_value < 1) return false;
            const int64_t d0 = sh->n_dim ? sh->dim[0]->dim_value : -2;
            if (first == -1) first = d0;
            else differ |= d0 != first;
        }
    }
    return differ;
}

static int declare_inputs(Imp *im, StrBuf *sig)
{
    const Onnx__GraphProto *g = im->m->graph;
    bool any = false;
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *in = g->input[i];
        if (strmap_get(&im->m->initializer, in->name, -1) >= 0) continue;
        const Onnx__TypeProto *t = in->type;
        if (!t || !t->tensor_type || !t->tensor_type->shape)
            return imp_refuse(im, "graph input '%s' is not a tensor of known rank", in->name);
        const Onnx__TypeProto__Tensor *tt = t->tensor_type;
        static const struct {
            int32_t type;
            const char *kiln;
        } types[] = {{ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT, "f32"}, {ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE, "f64"},
                     {ONNX__TENSOR_PROTO__DATA_TYPE__INT64, "i64"}, {ONNX__TENSOR_PROTO__DATA_TYPE__INT32, "i32"},
                     {ONNX__TENSOR_PROTO__DATA_TYPE__BOOL, "bool"}, {ONNX__TENSOR_PROTO__DATA_TYPE__UINT8, "u8"}};
        const char *kt = NULL;
        for (size_t k = 0; k < sizeof types / sizeof *types; k++)
            if (types[k].type == tt->elem_type) kt = types[k].kiln;
        if (!kt) return imp_refuse(im, "graph input '%s' is %s, which Kiln does not read", in->name, onnx_type_name(tt->elem_type));
        if (tt->shape->n_dim > MAX_RANK) return imp_refuse(im, "graph input '%s' has rank %zu (at most %d)", in->name, tt->shape->n_dim, MAX_RANK);
        Val *v = imp_add_val(im, in->name);
        v->expr = imp_identifier(im, "", in->name[0] && isalpha((unsigned char)in->name[0]) ? in->name : "input");
        v->rank = (int)tt->shape->n_dim;
        for (int a = 0; a < v->rank; a++) {
            const Onnx__TensorShapeProto__Dimension *d = tt->shape->dim[a];
            if (d->value_case == ONNX__TENSOR_SHAPE_PROTO__DIMENSION__VALUE_DIM_VALUE && d->dim_value > 0) v->dims[a] = d->dim_value;
            else if (a == 0) v->dims[a] = BATCH;
            else return imp_refuse(im, "graph input '%s': axis %d's size is symbolic (only axis 0, the batch, may be)", in->name, a);
        }
        if (im->whole) { /* `NAME: T[1, dims]` read, `v_NAME = reshape(NAME, dims)` used */
            sb_printf(sig, "%s%s: %s[1%s", any ? ", " : "", v->expr, kt, v->rank ? ", " : "");
            imp_dims_text(sig, v->dims, v->rank);
            sb_puts(sig, "]");
            char *inner = imp_identifier(im, "v_", in->name);
            sb_printf(&im->body, "    %s = reshape(%s%s", inner, v->expr, v->rank ? ", " : ", 1");
            imp_dims_text(&im->body, v->dims, v->rank);
            sb_puts(&im->body, ")  # the input whole\n");
            free(v->expr);
            v->expr = inner;
            if (!v->rank) v->rank = 1, v->dims[0] = 1;
            any = true;
            continue;
        }
        /* every input sample by sample: axis 0 the first input's */
        const Val *first = im->v[0];
        if (!v->rank || (any && v->dims[0] != first->dims[0]))
            return imp_refuse(im, "graph input '%s' does not have axis 0 of the first input (%lld) as its axis 0: Kiln's inference programs read every input sample by sample",
                          in->name, (long long)(first->dims[0] == BATCH ? -1 : first->dims[0]));
        sb_printf(sig, "%s%s: %s[", any ? ", " : "", v->expr, kt);
        imp_dims_text(sig, v->dims, v->rank);
        sb_puts(sig, "]");
        any = true;
    }
    if (!any) return imp_refuse(im, "the graph has no inputs besides its initializers");
    return 0;
}

static void declare_initializers(Imp *im)
{
    const Onnx__GraphProto *g = im->m->graph;
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        Val *v = imp_add_val(im, t->name);
        v->init = t;
        v->source = t->name;
        v->dtype = t->data_type;
        v->expr = imp_identifier(im, "p_", t->name);
        v->rank = (int)t->n_dims;
        for (size_t a = 0; a < t->n_dims && a < MAX_RANK; a++) v->dims[a] = t->dims[a];
        v->values = onnx_tensor_values(t);
        v->nvalues = onnx_numel(t->dims, t->n_dims);
        if (!v->values) { /* empty: nothing to read */
            v->values = xcalloc(1, sizeof *v->values);
            v->nvalues = 0;
        }
    }
}

int onnx_import(const OnnxModel *m, const OnnxImportOptions *o, StrBuf *out, OnnxWeights *w, StrBuf *err)
{
    Imp im;
    memset(&im, 0, sizeof im);
    im.m = m, im.path = o->source, im.out = out, im.err = err, im.w = w;
    memset(w, 0, sizeof *w);
    sb_init(&im.members);
    sb_init(&im.body);
    StrBuf sig;
    sb_init(&sig);
    im.whole = whole_tensors(&im);
    int rc = declare_inputs(&im, &sig);
    if (!rc) declare_initializers(&im);
    for (size_t k = 0; !rc && k < m->graph->n_node; k++) {
        im.node = m->graph->node[m->order[k]];
        free(im.node_label);
        StrBuf l;
        sb_init(&l);
        sb_printf(&l, "node '%s' (%s)", im.node->name && im.node->name[0] ? im.node->name : "(unnamed)", im.node->op_type);
        im.node_label = sb_take(&l);
        if (im.node->domain && im.node->domain[0] && strcmp(im.node->domain, "ai.onnx")) {
            rc = imp_refuse(&im, "operator domain '%s' (Kiln reads the default ONNX domain)", im.node->domain);
            break;
        }
        rc = imp_node(&im);
    }
    /* the outputs: each with the batch axis first, as an inference program writes them */
    StrBuf outs;
    sb_init(&outs);
    for (size_t i = 0; !rc && i < m->graph->n_output; i++) {
        free(im.node_label);
        im.node_label = NULL;
        Val *v = imp_val(&im, m->graph->output[i]->name);
        if (!v || v->values) {
            rc = imp_refuse(&im, "graph output '%s' is a constant (Kiln's outputs are computed from the inputs)", m->graph->output[i]->name);
            break;
        }
        if (im.whole) { /* the output whole: a leading axis of one sample */
            char *o1 = imp_identifier(&im, "out_", m->graph->output[i]->name);
            sb_printf(&im.body, "    %s = reshape(%s, 1%s", o1, v->expr, v->rank ? ", " : "");
            imp_dims_text(&im.body, v->dims, v->rank);
            sb_puts(&im.body, ")  # the output whole\n");
            sb_printf(&outs, "%s%s", i ? ", " : "", o1);
            free(o1);
            continue;
        }
        if (!v->rank || v->dims[0] != im.v[0]->dims[0]) {
            rc = imp_refuse(&im, "graph output '%s' does not have the batch (axis 0 of the inputs) as its axis 0: Kiln's inference programs write "
                             "outputs sample by sample",
                        m->graph->output[i]->name);
            break;
        }
        sb_printf(&outs, "%s%s", i ? ", " : "", v->expr);
    }
    if (!rc) {
        sb_printf(out,
                  "# %s — imported by kiln import from %s (ONNX IR version %lld, opset %lld%s%s).\n"
                  "# One statement per ONNX node, its name and operator in the comment; the initializers are\n"
                  "# the parameters p_NAME (their ONNX names beside them), in the .safetensors beside this file.\n"
                  "model %s\n\n",
                  o->name, o->source, (long long)m->proto->ir_version, (long long)m->opset, m->proto->producer_name && m->proto->producer_name[0] ? ", from " : "",
                  m->proto->producer_name ? m->proto->producer_name : "", o->name);
        emit_holders(&im, out);
        if (im.members.len) sb_printf(out, "%s\n", im.members.data);
        sb_printf(out, "forward(%s) -> %s {\n%s}\n\n", sig.data, outs.data, im.body.data ? im.body.data : "");
        const int first = (int)strcspn(outs.data, ","); /* the first output's name */
        sb_printf(out, "# kiln build needs a loss: this one only lets an inference program build; replace it\n"
                       "# (and add a train section) to train the model.\n"
                       "loss(%.*s) = mean(f32(%.*s))\n",
                  first, outs.data, first, outs.data);
    }
    /* the weights keep the values; the table lets go of the rest */
    for (int32_t i = 0; i < im.nv; i++) {
        free(im.v[i]->expr);
        bool kept = false;
        for (int32_t k = 0; k < w->n; k++) kept |= w->t[k].values == im.v[i]->values;
        if (!kept) free(im.v[i]->values);
        free(im.v[i]);
    }
    free(im.v);
    for (int32_t i = 0; i < im.nheld; i++) free(im.held[i].path), free(im.held[i].decl);
    free(im.held);
    strmap_free(&im.holder);
    free(im.node_label);
    strmap_free(&im.names);
    for (int32_t i = 0; i < im.nowned; i++) free(im.owned[i]);
    free(im.owned);
    strmap_free(&im.vals);
    sb_free(&im.members);
    sb_free(&im.body);
    sb_free(&sig);
    sb_free(&outs);
    if (rc) onnx_weights_free(w);
    return rc;
}

void onnx_weights_free(OnnxWeights *w)
{
    for (int32_t i = 0; i < w->n; i++) {
        free(w->t[i].name);
        free(w->t[i].values);
    }
    free(w->t);
    memset(w, 0, sizeof *w);
}
