/* import.c — `kiln import FILE.onnx -o NAME.kiln` (issue 39): the ONNX model read and
 * translated by onnx/ (onnx.h), the Kiln model file written, and its weights beside it as
 * NAME.safetensors (float32, under the parameters' names in the file). Each is written
 * atomically (a temporary file renamed), the weights first: a model file written always
 * has its weights beside it, and an error in reading or translating writes neither. */
#include "import.h"

#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../onnx/onnx.h"
#include "../runtime/kiln_rt.h"

/* NAME of NAME.kiln: a Kiln identifier (letters, digits, _), or "imported". */
static char *model_name(const char *out)
{
    char *copy = xstrdup(out), *base = basename(copy);
    char *dot = strrchr(base, '.');
    if (dot) *dot = 0;
    StrBuf b;
    sb_init(&b);
    for (const char *p = base; *p; p++) sb_putc(&b, (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ? *p : '_');
    if (!b.len || (b.data[0] >= '0' && b.data[0] <= '9')) sb_puts(&b, "_imported");
    free(copy);
    return sb_take(&b);
}

/* NAME.safetensors beside NAME.kiln. */
static char *weights_path(const char *out)
{
    const size_t n = strlen(out);
    StrBuf b;
    sb_init(&b);
    if (n > 5 && !strcmp(out + n - 5, ".kiln")) sb_putn(&b, out, n - 5);
    else sb_puts(&b, out);
    sb_puts(&b, ".safetensors");
    return sb_take(&b);
}

static int write_weights(const char *path, const OnnxWeights *w, StrBuf *err)
{
    krt_st_tensor *t = xcalloc((size_t)w->n + 1, sizeof *t);
    float **data = xcalloc((size_t)w->n + 1, sizeof *data);
    for (int32_t i = 0; i < w->n; i++) {
        const OnnxWeight *x = &w->t[i];
        data[i] = xmalloc((size_t)(x->n ? x->n : 1) * sizeof **data);
        for (int64_t k = 0; k < x->n; k++) data[i][k] = (float)x->values[k];
        t[i] = (krt_st_tensor){.name = x->name, .dtype = KRT_F32, .rank = x->rank, .data = data[i]};
        memcpy(t[i].dims, x->dims, (size_t)x->rank * sizeof *x->dims);
    }
    const krt_st_meta meta[] = {{"format", "pt"}, {"producer", "kiln import"}};
    krt_error e;
    const krt_status s = krt_safetensors_write(path, t, (int)w->n, meta, 2, &e);
    if (s != KRT_OK) sb_printf(err, "kiln import: error: %s", e.msg);
    for (int32_t i = 0; i < w->n; i++) free(data[i]);
    free(data);
    free(t);
    return s == KRT_OK ? 0 : -1;
}

int cli_import(const char *onnx_path, const char *out)
{
    StrBuf err, text;
    sb_init(&err);
    sb_init(&text);
    OnnxModel m;
    OnnxWeights w = {0};
    char *name = model_name(out), *wpath = weights_path(out);
    int rc = onnx_read(onnx_path, &m, &err);
    if (!rc) {
        const OnnxImportOptions o = {.name = name, .source = onnx_path};
        rc = onnx_import(&m, &o, &text, &w, &err);
    }
    if (!rc) rc = write_weights(wpath, &w, &err);
    if (rc) fprintf(stderr, "%s\n", err.data ? err.data : "kiln import: error");
    else if (cli_write_atomic(out, text.data ? text.data : "", text.len)) rc = -1;
    else fprintf(stderr, "kiln: wrote %s (%zu bytes) and %s (%d tensors)\n", out, text.len, wpath, (int)w.n);
    onnx_weights_free(&w);
    onnx_free(&m);
    free(name);
    free(wpath);
    sb_free(&err);
    sb_free(&text);
    return rc ? 1 : 0;
}
