/* lib_run.c — the run path of an embeddable library (kiln build --lib): the generated
 * predict step (the forward in eval mode, fused and arena-planned as in an inference
 * program) on the caller's inputs, weights, workspace and output buffers. Everything the
 * step needs besides them (the symbols' values, the input and output pointer tables, the
 * step's io) is on this call's stack, so instances share nothing and two threads may run
 * two instances at once. No allocation, no I/O, no environment: the thread count is the
 * caller's argument, applied to the calling thread's OpenMP setting for this call only.
 * docs/library.md. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "kiln_lib.h"

/* Stack tables of a step; a model with more inputs, outputs or symbols is refused. */
#define LIB_MAX_SLOTS 64

int kiln_lib_fail(char *msg, size_t cap, int code, const char *fmt, ...)
{
    if (msg && cap) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, cap, fmt, ap);
        va_end(ap);
    }
    return code;
}

int64_t kiln_lib_buffers_at(const kiln_model *m)
{
    return (m->nparam_floats * (int64_t)sizeof(float) + KILN_LIB_ALIGN - 1) / KILN_LIB_ALIGN * KILN_LIB_ALIGN;
}

int64_t kiln_lib_weights_bytes(const kiln_model *m)
{
    int64_t b = kiln_lib_buffers_at(m) + m->buffer_bytes;
    return b > 0 ? b : KILN_LIB_ALIGN; /* a model without weights still has a non-empty buffer */
}

int kiln_lib_batch_symbol(const kiln_model *m)
{
    for (int k = 0; k < m->ninputs; k++)
        if (m->forward_inputs[k] && m->inputs[k].rank) return m->inputs[k].sym[0];
    return -1;
}

int kiln_lib_check_memory(const kiln_model *m, const void *weights, size_t weights_bytes, const void *workspace, size_t workspace_bytes,
                          char *msg, size_t cap)
{
    const int64_t want_w = kiln_lib_weights_bytes(m), want_ws = m->predict_arena_bytes;
    if (!weights || !workspace) return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the weights or the workspace memory is NULL", m->name);
    if ((uintptr_t)weights % KILN_LIB_ALIGN || (uintptr_t)workspace % KILN_LIB_ALIGN)
        return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the weights and the workspace memory must be aligned to %d bytes", m->name,
                             KILN_LIB_ALIGN);
    if ((int64_t)weights_bytes < want_w)
        return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the weights memory is %zu bytes, the model's weights take %lld", m->name,
                             weights_bytes, (long long)want_w);
    if ((int64_t)workspace_bytes < want_ws)
        return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the workspace is %zu bytes, the forward's activations take %lld", m->name,
                             workspace_bytes, (long long)want_ws);
    return KILN_LIB_OK;
}

int kiln_lib_run(const kiln_model *m, unsigned char *weights, unsigned char *workspace, int threads, int64_t batch,
                 const void *const *inputs, void *const *outputs, char *msg, size_t cap)
{
    if (m->ninputs > LIB_MAX_SLOTS || m->noutputs > LIB_MAX_SLOTS || m->nsyms > LIB_MAX_SLOTS)
        return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: more than %d inputs, outputs or symbols", m->name, LIB_MAX_SLOTS);
    const int bs = kiln_lib_batch_symbol(m);
    const int64_t bound = bs >= 0 ? m->syms[bs].max : 1;
    if (batch < 1 || batch > bound)
        return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: batch %lld: give 1 to %lld samples", m->name, (long long)batch, (long long)bound);
    if (threads < 1) return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: %d threads: give 1 or more", m->name, threads);
    const void *in[LIB_MAX_SLOTS];
    void *out[LIB_MAX_SLOTS];
    int64_t syms[LIB_MAX_SLOTS];
    for (int k = 0; k < m->ninputs; k++) {
        in[k] = m->forward_inputs[k] ? inputs[k] : NULL;
        if (m->forward_inputs[k] && !in[k]) return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: input '%s' is NULL", m->name, m->inputs[k].name);
    }
    for (int k = 0; k < m->noutputs; k++) {
        out[k] = outputs[k];
        if (!out[k]) return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the buffer of output '%s' is NULL", m->name, m->output_names[k]);
    }
    for (int s = 0; s < m->nsyms; s++) syms[s] = m->syms[s].max;
    if (bs >= 0) syms[bs] = batch;
    kiln_step_io io;
    memset(&io, 0, sizeof io);
    io.params = (float *)(void *)weights;
    io.buffers = weights + kiln_lib_buffers_at(m);
    io.inputs = in;
    io.syms = syms;
    io.arena = workspace;
    io.outputs = out;
#ifdef _OPENMP
    const int before = omp_get_max_threads();
    omp_set_num_threads(threads);
#endif
    m->predict_step(&io);
#ifdef _OPENMP
    omp_set_num_threads(before);
#endif
    if (io.index_error) {
        const kiln_index_check *c = io.index_error;
        return kiln_lib_fail(msg, cap, KILN_LIB_EINDEX, "%s:%u:%u: %s: index %lld out of range [0, %lld)", m->source, c->line, c->col, c->what,
                             (long long)io.index_value, (long long)c->limit);
    }
    return KILN_LIB_OK;
}
