/* weights.c — a model's weights from a safetensors file, by name: what an inference
 * program loads (--weights, or the file embedded in it) and what `kiln build
 * --embed-weights` checks before it embeds a file. Names and layouts are PyTorch's
 * state_dict keys and layouts, so a file saved by Kiln or by PyTorch (safetensors.torch
 * .save_file(model.state_dict(), ...)) loads as it is. Every problem names the tensor: one
 * the model has and the file lacks, one of another dtype or shape, one the file has and
 * the model does not (a state_dict of another model; silently dropping it would hide that). */
#include "kiln_model.h"
#include "rt_internal.h"

#include <stdio.h>
#include <string.h>

static void shape_text(char *buf, size_t cap, krt_dtype t, int rank, const int64_t *dims)
{
    size_t o = (size_t)snprintf(buf, cap, "%s[", krt_dtype_name(t));
    for (int d = 0; d < rank && o < cap; d++) o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)dims[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

krt_status kiln_weights_check(const kiln_param *params, int nparams, const krt_safetensors *st, const char *path, krt_error *err)
{
    for (int i = 0; i < nparams; i++) {
        const kiln_param *p = &params[i];
        const krt_st_tensor *x = krt_safetensors_find(st, p->name);
        if (!x) return krt_fail(err, KRT_EMISMATCH, "%s: no tensor '%s' (the model's %s)", path, p->name, p->trainable ? "parameter" : "buffer");
        bool ok = x->dtype == p->dtype && x->rank == p->rank;
        for (int d = 0; ok && d < p->rank; d++) ok = x->dims[d] == p->dims[d];
        if (!ok) {
            char want[160], got[160];
            shape_text(want, sizeof want, p->dtype, p->rank, p->dims);
            shape_text(got, sizeof got, x->dtype, x->rank, x->dims);
            return krt_fail(err, KRT_EMISMATCH, "%s: tensor '%s' is %s, the model's is %s", path, p->name, got, want);
        }
    }
    int n = krt_safetensors_count(st);
    for (int i = 0; i < n; i++) {
        const krt_st_tensor *x = krt_safetensors_tensor(st, i);
        int k = 0;
        while (k < nparams && strcmp(params[k].name, x->name)) k++;
        if (k == nparams) return krt_fail(err, KRT_EMISMATCH, "%s: tensor '%s' is not a parameter or buffer of the model", path, x->name);
    }
    return KRT_OK;
}

krt_status kiln_weights_load(const kiln_model *m, const krt_safetensors *st, const char *path, float *params, unsigned char *buffers,
                             krt_error *err)
{
    krt_status s = kiln_weights_check(m->params, m->nparams, st, path, err);
    if (s != KRT_OK) return s;
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param *p = &m->params[i];
        const krt_st_tensor *x = krt_safetensors_find(st, p->name);
        memcpy(p->trainable ? (void *)(params + p->offset) : (void *)(buffers + p->offset), x->data, (size_t)p->count * krt_dtype_size(p->dtype));
    }
    return KRT_OK;
}
