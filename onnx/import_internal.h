/* import_internal.h — what onnx/import.c (the graph, names and values) and
 * onnx/import_ops.c (the operators) share: the importer's state and its helpers. */
#ifndef KILN_ONNX_IMPORT_INTERNAL_H
#define KILN_ONNX_IMPORT_INTERNAL_H

#include "onnx.h"

#define MAX_RANK 8
#define BATCH (-1) /* a dim that is the batch B */

typedef struct {
    char *expr;              /* what the Kiln file calls it: an identifier or a number */
    int rank;
    int64_t dims[MAX_RANK];  /* BATCH for the batch */
    double *values;          /* a constant's elements (initializer, Constant), or NULL */
    int64_t nvalues;
    const Onnx__TensorProto *init; /* the initializer it is, or NULL */
    bool declared;           /* a parameter already declared for it */
    const char *source;      /* an initializer's name, or the output name of a Constant (or a fold) */
    int32_t dtype;           /* a constant's ONNX type (TensorProto.DataType) */
} Val;

typedef struct {
    const OnnxModel *m;
    const char *path;
    StrBuf *out, members, body, *err;
    bool whole; /* the inputs or outputs do not share axis 0: each a whole tensor, one sample */
    OnnxWeights *w;
    StrMap names; /* Kiln identifiers taken */
    StrMap vals;  /* ONNX name -> index in v */
    Val **v;      /* each allocated alone: a Val * stays valid as more are added */
    int32_t nv, cap;
    /* parameters kept under their state_dict names (fc1.weight): a holder module per
     * prefix, as PyTorch's modules are */
    struct {
        char *path, *decl;
    } *held;
    int32_t nheld, capheld;
    StrMap holder; /* first segments the holders claimed */
    char **owned;  /* the maps' keys (a StrMap keeps pointers): freed at the end */
    int32_t nowned, capowned;
    const Onnx__NodeProto *node; /* the node being written */
    char *node_label;            /* "node 'NAME' (OP)" */
} Imp;


/* Kiln's keywords, which no name in the file may be (import.c). */
extern const char *const imp_keywords[];

/* Puts a copy of name in map m (kept until the import ends: a StrMap keeps pointers). */
void imp_take(Imp *im, StrMap *m, const char *name);
/* A fresh Kiln identifier from an ONNX name: prefix, then its letters, digits and _. */
char *imp_identifier(Imp *im, const char *prefix, const char *name);
/* The error "FILE: error: node 'NAME' (OP): ..." (-1). */
int imp_refuse(Imp *im, const char *fmt, ...) KILN_PRINTF(2, 3);
Val *imp_add_val(Imp *im, const char *onnx_name);
Val *imp_val(Imp *im, const char *onnx_name);
/* The node's attribute `name` (NULL when absent), as an int, a float or ints (their
 * count, or -1 when absent). */
const Onnx__AttributeProto *imp_attr(const Onnx__NodeProto *n, const char *name);
int64_t imp_attr_int(const Onnx__NodeProto *n, const char *name, int64_t dflt);
double imp_attr_float(const Onnx__NodeProto *n, const char *name, double dflt);
int imp_attr_ints(const Onnx__NodeProto *n, const char *name, int64_t *out, int cap);
/* Operand j of the node (NULL when absent); a constant operand's integers (the count, or
 * -1 when it is not a constant); its Kiln expression, a parameter declared on first use. */
Val *imp_operand(Imp *im, size_t j);
int imp_const_ints(Imp *im, size_t j, int64_t *out, int cap);
const char *imp_use(Imp *im, size_t j);
/* A shape's dims as Kiln writes them ("B, 3, 28"). */
void imp_dims_text(StrBuf *b, const int64_t *d, int rank);
/* Output k of the node, named from its ONNX name, with the given shape; the statement
 * that assigns it: `    NAME = `, the caller's expression, then the node's comment. */
Val *imp_result(Imp *im, size_t k, int rank, const int64_t *dims);
void imp_statement_start(Imp *im, const Val *v);
void imp_statement_end(Imp *im);
/* Elements of a shape (the batch counted as `batch`); NumPy broadcasting (false when the
 * shapes do not broadcast); an axis made non-negative. */
int64_t imp_numel(const int64_t *d, int rank, int64_t batch);
bool imp_broadcast(const Val *a, const Val *b, int *rank, int64_t *out);
int imp_norm_axis(int64_t axis, int rank);

/* import_ops.c: the node's statement(s) by its operator, or the error that Kiln has none. */
int imp_node(Imp *im);
/* import_fold.c: the node computed at import, its output a constant, when its inputs are
 * constants and its operator shape arithmetic's: 1, else 0 (the node is written). */
int imp_fold(Imp *im);

#endif
