/* read.c — onnx.h: an ONNX model file parsed by protobuf-c and checked before anything
 * reads it: the opset, every initializer's type, shape and bytes, every node's inputs
 * defined by a graph input, an initializer or another node (the nodes ordered so that each
 * comes after what it reads: a cycle is an error), every name defined once. */
#include "onnx.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int onnx_type_size(int32_t t)
{
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT:
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32:
        return 4;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64:
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE:
        return 8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8:
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL:
        return 1;
    default:
        return 0;
    }
}

const char *onnx_type_name(int32_t t)
{
    const ProtobufCEnumValue *v = protobuf_c_enum_descriptor_get_value(&onnx__tensor_proto__data_type__descriptor, t);
    return v ? v->name : "an unknown type";
}

int64_t onnx_numel(const int64_t *dims, size_t n)
{
    int64_t e = 1;
    for (size_t i = 0; i < n; i++) {
        if (dims[i] < 0) return -1;
        if (dims[i] && e > ONNX_MAX_ELEMENTS / dims[i]) return -1;
        e *= dims[i];
    }
    return e > ONNX_MAX_ELEMENTS ? -1 : e;
}

/* How many elements the typed field of t's type holds. */
static size_t typed_count(const Onnx__TensorProto *t)
{
    switch (t->data_type) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return t->n_float_data;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return t->n_int64_data;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return t->n_double_data;
    default: return t->n_int32_data; /* int32, uint8, int8, bool */
    }
}

double *onnx_tensor_values(const Onnx__TensorProto *t)
{
    const int64_t n = onnx_numel(t->dims, t->n_dims);
    if (n <= 0) return NULL;
    double *v = xmalloc((size_t)n * sizeof *v);
    const uint8_t *raw = t->has_raw_data ? t->raw_data.data : NULL;
    for (int64_t i = 0; i < n; i++) {
        switch (t->data_type) {
        case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: {
            float x;
            if (raw) memcpy(&x, raw + 4 * i, 4);
            else x = t->float_data[i];
            v[i] = x;
            break;
        }
        case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: {
            double x;
            if (raw) memcpy(&x, raw + 8 * i, 8);
            else x = t->double_data[i];
            v[i] = x;
            break;
        }
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: {
            int64_t x;
            if (raw) memcpy(&x, raw + 8 * i, 8);
            else x = t->int64_data[i];
            v[i] = (double)x;
            break;
        }
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: {
            int32_t x;
            if (raw) memcpy(&x, raw + 4 * i, 4);
            else x = t->int32_data[i];
            v[i] = x;
            break;
        }
        case ONNX__TENSOR_PROTO__DATA_TYPE__INT8:
            v[i] = raw ? (double)(int8_t)raw[i] : (double)(int8_t)t->int32_data[i];
            break;
        default: /* uint8, bool */
            v[i] = raw ? (double)raw[i] : (double)(uint8_t)t->int32_data[i];
            break;
        }
    }
    return v;
}

/* Checks a tensor's type, shape and data: NULL, or what is wrong (static). */
static const char *tensor_problem(const Onnx__TensorProto *t)
{
    static char why[200];
    if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        return "its data is in an external file (not supported: save the model with its weights inside)";
    if (t->segment) return "it is split into segments (not supported)";
    if (!onnx_type_size(t->data_type)) {
        snprintf(why, sizeof why, "its type is %s (Kiln reads float, double, int64, int32, int8, uint8 and bool)", onnx_type_name(t->data_type));
        return why;
    }
    for (size_t i = 0; i < t->n_dims; i++)
        if (t->dims[i] < 0) {
            snprintf(why, sizeof why, "dimension %zu is %lld", i, (long long)t->dims[i]);
            return why;
        }
    const int64_t n = onnx_numel(t->dims, t->n_dims);
    if (n < 0) return "it has more than 2^31 elements";
    const size_t want = (size_t)n;
    if (t->has_raw_data) {
        if (t->raw_data.len != want * (size_t)onnx_type_size(t->data_type)) {
            snprintf(why, sizeof why, "its raw data is %zu bytes, not the %zu its shape and type make", t->raw_data.len,
                     want * (size_t)onnx_type_size(t->data_type));
            return why;
        }
    } else if (typed_count(t) != want) {
        snprintf(why, sizeof why, "it holds %zu values, not the %zu of its shape", typed_count(t), want);
        return why;
    }
    return NULL;
}

static int fail(StrBuf *err, const char *path, const char *fmt, ...) KILN_PRINTF(3, 4);
static int fail(StrBuf *err, const char *path, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    sb_printf(err, "%s: error: ", path);
    sb_vprintf(err, fmt, ap);
    va_end(ap);
    return -1;
}

/* The nodes in an order where each reads only what comes before it (Kahn's, the file's
 * order among the ready ones). -1 with the error when some never become ready. */
static int order_nodes(OnnxModel *m, const char *path, StrBuf *err)
{
    const Onnx__GraphProto *g = m->graph;
    const size_t n = g->n_node;
    bool *done = xcalloc(n + 1, 1);
    m->order = xmalloc((n + 1) * sizeof *m->order);
    size_t placed = 0;
    StrMap ready_names; /* outputs produced so far */
    memset(&ready_names, 0, sizeof ready_names);
    for (bool progress = true; progress && placed < n;) {
        progress = false;
        for (size_t i = 0; i < n; i++) {
            if (done[i]) continue;
            const Onnx__NodeProto *nd = g->node[i];
            int32_t left = 0;
            for (size_t j = 0; j < nd->n_input; j++)
                if (nd->input[j][0] && strmap_get(&m->produced, nd->input[j], -1) >= 0 && strmap_get(&ready_names, nd->input[j], 0) == 0) left++;
            if (left) continue;
            done[i] = true, progress = true;
            m->order[placed++] = (int32_t)i;
            for (size_t j = 0; j < nd->n_output; j++)
                if (nd->output[j][0]) strmap_put(&ready_names, nd->output[j], 1);
        }
    }
    int rc = 0;
    if (placed < n) {
        size_t i = 0;
        while (done[i]) i++;
        const Onnx__NodeProto *nd = g->node[i];
        rc = fail(err, path, "the graph has a cycle: node '%s' (%s) reads what it helps compute", nd->name && nd->name[0] ? nd->name : "(unnamed)",
                  nd->op_type);
    }
    strmap_free(&ready_names);
    free(done);
    return rc;
}

int onnx_read(const char *path, OnnxModel *m, StrBuf *err)
{
    memset(m, 0, sizeof *m);
    size_t len;
    StrBuf rerr;
    sb_init(&rerr);
    char *bytes = util_read_file(path, &len, &rerr);
    if (!bytes) {
        sb_printf(err, "%s: error: %s", path, rerr.data ? rerr.data : "cannot read the file");
        sb_free(&rerr);
        return -1;
    }
    sb_free(&rerr);
    m->proto = onnx__model_proto__unpack(NULL, len, (const uint8_t *)bytes);
    free(bytes);
    if (!m->proto) return fail(err, path, "not an ONNX model: the file does not parse as an onnx.ModelProto (truncated, or another format)");
    const Onnx__ModelProto *mp = m->proto;
    if (!mp->graph) return fail(err, path, "the model has no graph");
    m->graph = mp->graph;
    const Onnx__GraphProto *g = m->graph;
    m->opset = -1;
    for (size_t i = 0; i < mp->n_opset_import; i++) {
        const Onnx__OperatorSetIdProto *o = mp->opset_import[i];
        if (!o->domain || !o->domain[0] || !strcmp(o->domain, "ai.onnx")) m->opset = o->version;
    }
    if (m->opset < 0) return fail(err, path, "the model imports no opset of the default ONNX domain");
    if (m->opset < ONNX_OPSET_MIN || m->opset > ONNX_OPSET_MAX)
        return fail(err, path, "opset %lld: Kiln reads opsets %d to %d", (long long)m->opset, ONNX_OPSET_MIN, ONNX_OPSET_MAX);
    /* names: initializers, graph inputs, node outputs, each defined once */
    for (size_t i = 0; i < g->n_initializer; i++) {
        const Onnx__TensorProto *t = g->initializer[i];
        if (!t->name || !t->name[0]) return fail(err, path, "initializer %zu has no name", i);
        const char *why = tensor_problem(t);
        if (why) return fail(err, path, "initializer '%s': %s", t->name, why);
        if (strmap_get(&m->initializer, t->name, -1) >= 0) return fail(err, path, "initializer '%s' is defined twice%s", t->name, "");
        strmap_put(&m->initializer, t->name, (int32_t)i);
    }
    for (size_t i = 0; i < g->n_input; i++) {
        const Onnx__ValueInfoProto *v = g->input[i];
        if (!v->name || !v->name[0]) return fail(err, path, "graph input %zu has no name", i);
        if (strmap_get(&m->initializer, v->name, -1) >= 0) continue; /* an initializer listed as an input (older exporters) */
        if (strmap_get(&m->input, v->name, -1) >= 0) return fail(err, path, "graph input '%s' is listed twice%s", v->name, "");
        strmap_put(&m->input, v->name, (int32_t)i);
    }
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        const char *nm = nd->name && nd->name[0] ? nd->name : nd->op_type;
        if (!nd->op_type || !nd->op_type[0]) return fail(err, path, "node %zu has no operator", i);
        for (size_t j = 0; j < nd->n_output; j++) {
            const char *o = nd->output[j];
            if (!o[0]) continue; /* an optional output left out */
            if (strmap_get(&m->produced, o, -1) >= 0 || strmap_get(&m->initializer, o, -1) >= 0 || strmap_get(&m->input, o, -1) >= 0)
                return fail(err, path, "'%s' is defined twice (again as an output of node '%s')", o, nm);
            strmap_put(&m->produced, o, (int32_t)i);
        }
    }
    for (size_t i = 0; i < g->n_node; i++) {
        const Onnx__NodeProto *nd = g->node[i];
        const char *nm = nd->name && nd->name[0] ? nd->name : nd->op_type;
        for (size_t j = 0; j < nd->n_input; j++) {
            const char *x = nd->input[j];
            if (x[0] && strmap_get(&m->produced, x, -1) < 0 && strmap_get(&m->initializer, x, -1) < 0 && strmap_get(&m->input, x, -1) < 0)
                return fail(err, path, "node '%s' reads '%s', which no input, initializer or node defines", nm, x);
        }
    }
    if (!g->n_output) return fail(err, path, "the graph has no outputs");
    for (size_t i = 0; i < g->n_output; i++) {
        const char *o = g->output[i]->name;
        if (!o || (strmap_get(&m->produced, o, -1) < 0 && strmap_get(&m->initializer, o, -1) < 0 && strmap_get(&m->input, o, -1) < 0))
            return fail(err, path, "graph output '%s' is not defined by any node, input or initializer", o ? o : "");
    }
    return order_nodes(m, path, err);
}

void onnx_free(OnnxModel *m)
{
    if (m->proto) onnx__model_proto__free_unpacked(m->proto, NULL);
    free(m->order);
    strmap_free(&m->initializer);
    strmap_free(&m->produced);
    strmap_free(&m->input);
    memset(m, 0, sizeof *m);
}
