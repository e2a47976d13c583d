/* onnx.h — ONNX models for `kiln import` (issue 39): a model file read through protobuf-c
 * (the C code generated from third_party/onnx/onnx.proto at build time) and checked, so
 * that what reads it after may trust every name, shape and byte count; then translated
 * into an ordinary Kiln model file and its weights (onnx/import.c).
 *
 * A malformed file — truncated protobuf, a graph whose nodes read names nothing defines
 * or that form a cycle, an initializer whose bytes do not match its shape and type, a
 * dimension too large — is one error naming the file and what is wrong, never a crash. */
#ifndef KILN_ONNX_H
#define KILN_ONNX_H

#include <stdbool.h>
#include <stdint.h>

#include "../util/util.h"
#include "onnx.pb-c.h"

/* The ONNX opsets Kiln reads (the default domain's). */
#define ONNX_OPSET_MIN 6
#define ONNX_OPSET_MAX 21
/* The largest tensor Kiln reads: 2^31 elements (8 GiB of float32). */
#define ONNX_MAX_ELEMENTS ((int64_t)1 << 31)

typedef struct {
    Onnx__ModelProto *proto; /* protobuf-c's, whole */
    const Onnx__GraphProto *graph;
    int64_t opset;           /* the default domain's */
    /* the graph's nodes in an order where each reads only what is defined before it (the
     * file's order when it is one, as ONNX requires) */
    int32_t *order;
    StrMap initializer; /* name -> index in graph->initializer */
    StrMap produced;    /* a node output's name -> index of its node */
    StrMap input;       /* a graph input's name (not an initializer) -> index in graph->input */
} OnnxModel;

/* Reads and checks the ONNX model file at path: 0, or -1 with the error in err
 * ("FILE: error: ..."). */
int onnx_read(const char *path, OnnxModel *m, StrBuf *err);
void onnx_free(OnnxModel *m);

/* The element type of ONNX data type t (TensorProto.DataType) Kiln reads: its size in
 * bytes and name, or 0 for a type it does not read. */
int onnx_type_size(int32_t t);
const char *onnx_type_name(int32_t t);
/* The elements of a tensor of those dims (each >= 0): -1 when over ONNX_MAX_ELEMENTS. */
int64_t onnx_numel(const int64_t *dims, size_t n);
/* Initializer t's elements as float64 (any type Kiln reads, from raw_data or the typed
 * fields): a new array of onnx_numel elements, or NULL when it has none. */
double *onnx_tensor_values(const Onnx__TensorProto *t);

/* ---- import.c: the graph as a Kiln model file ---- */

typedef struct {
    const char *name;   /* the model's name (its `model` line) */
    const char *source; /* the ONNX file, cited in the file and in errors */
} OnnxImportOptions;

/* One parameter of the imported model: its Kiln name, shape and float values. */
typedef struct {
    char *name;
    int rank;
    int64_t dims[8];
    double *values;
    int64_t n;
} OnnxWeight;

typedef struct {
    OnnxWeight *t;
    int32_t n, cap;
} OnnxWeights;

/* The Kiln model file of m into out and its parameters' values into w: 0, or -1 with one
 * error naming the node, its operator and what Kiln cannot express ("FILE: error: node
 * 'NAME' (OP): ..."). */
int onnx_import(const OnnxModel *m, const OnnxImportOptions *o, StrBuf *out, OnnxWeights *w, StrBuf *err);
void onnx_weights_free(OnnxWeights *w);

#endif
