/* tensor_pb.c — ONNX TensorProto files (`.pb`, as the ONNX test suites and many tools write
 * one tensor) read as a krt_array, so that an inference program takes them as it takes
 * .npy (issue 39). Parsed by protobuf-c with the C generated from third_party/onnx/onnx.proto,
 * then checked: the type one Kiln reads, dims within KRT_MAX_RANK and non-negative, the
 * data's bytes (raw) or values (typed fields) exactly the shape's. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_rt.h"
#include "onnx.pb-c.h"
#include "rt_internal.h"

/* The Kiln dtype of ONNX data type t, or -1. */
static int dtype_of(int32_t t)
{
    switch (t) {
    case ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT: return KRT_F32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__DOUBLE: return KRT_F64;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT64: return KRT_I64;
    case ONNX__TENSOR_PROTO__DATA_TYPE__INT32: return KRT_I32;
    case ONNX__TENSOR_PROTO__DATA_TYPE__UINT8: return KRT_U8;
    case ONNX__TENSOR_PROTO__DATA_TYPE__BOOL: return KRT_BOOL;
    default: return -1;
    }
}

/* How many values the typed field of dtype d holds. */
static size_t typed_count(const Onnx__TensorProto *t, krt_dtype d)
{
    return d == KRT_F32 ? t->n_float_data : d == KRT_F64 ? t->n_double_data : d == KRT_I64 ? t->n_int64_data : t->n_int32_data;
}

/* The typed field's n values into out, as dtype d (u8 and bool live in int32_data). */
static void typed_values(const Onnx__TensorProto *t, krt_dtype d, void *out, size_t n)
{
    if (d == KRT_F32) memcpy(out, t->float_data, n * sizeof(float));
    else if (d == KRT_F64) memcpy(out, t->double_data, n * sizeof(double));
    else if (d == KRT_I64) memcpy(out, t->int64_data, n * sizeof(int64_t));
    else if (d == KRT_I32) memcpy(out, t->int32_data, n * sizeof(int32_t));
    else
        for (size_t i = 0; i < n; i++) ((uint8_t *)out)[i] = (uint8_t)t->int32_data[i];
}

krt_status krt_tensorproto_load(const char *path, krt_array *out, krt_error *err)
{
    memset(out, 0, sizeof *out);
    size_t len;
    void *bytes = NULL;
    krt_status st = krt_read_whole(path, &bytes, &len, err);
    if (st) return st;
    Onnx__TensorProto *t = onnx__tensor_proto__unpack(NULL, len, bytes);
    free(bytes);
    if (!t) return krt_fail(err, KRT_EFORMAT, "%s: not an ONNX TensorProto (.pb): the file does not parse as one (truncated, or another format)", path);
    const int d = dtype_of(t->data_type);
    int64_t n = 1;
    st = KRT_OK;
    if (d < 0) st = krt_fail(err, KRT_EFORMAT, "%s: a TensorProto of ONNX type %d (Kiln reads float, double, int64, int32, uint8 and bool)", path, t->data_type);
    else if (t->has_data_location && t->data_location == ONNX__TENSOR_PROTO__DATA_LOCATION__EXTERNAL)
        st = krt_fail(err, KRT_EFORMAT, "%s: the TensorProto's data is in an external file", path);
    else if (t->n_dims > KRT_MAX_RANK) st = krt_fail(err, KRT_EFORMAT, "%s: a TensorProto of rank %zu (at most %d)", path, t->n_dims, KRT_MAX_RANK);
    for (size_t i = 0; !st && i < t->n_dims; i++) {
        if (t->dims[i] < 0 || (t->dims[i] && n > ((int64_t)1 << 40) / t->dims[i]))
            st = krt_fail(err, KRT_EFORMAT, "%s: dimension %zu of the TensorProto is %lld", path, i, (long long)t->dims[i]);
        else n *= t->dims[i];
    }
    if (!st) {
        const size_t size = krt_dtype_size((krt_dtype)d);
        out->dtype = (krt_dtype)d;
        out->rank = t->n_dims ? (int)t->n_dims : 1; /* a scalar: one sample */
        for (size_t i = 0; i < t->n_dims; i++) out->dims[i] = t->dims[i];
        if (!t->n_dims) out->dims[0] = 1;
        out->nbytes = (size_t)n * size;
        out->data = malloc(out->nbytes + 1);
        if (!out->data) st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", path, out->nbytes);
        else if (t->has_raw_data) {
            if (t->raw_data.len != out->nbytes)
                st = krt_fail(err, KRT_EFORMAT, "%s: the TensorProto's raw data is %zu bytes, not the %zu of its shape and type", path, t->raw_data.len, out->nbytes);
            else memcpy(out->data, t->raw_data.data, out->nbytes);
        } else {
            const size_t have = typed_count(t, out->dtype);
            if (have != (size_t)n) st = krt_fail(err, KRT_EFORMAT, "%s: the TensorProto holds %zu values, not the %lld of its shape", path, have, (long long)n);
            else typed_values(t, out->dtype, out->data, have);
        }
        if (st) krt_array_free(out);
    }
    onnx__tensor_proto__free_unpacked(t, NULL);
    return st;
}
