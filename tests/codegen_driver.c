/* codegen_driver.c — runs a generated model's steps on data from a file, for the tests
 * that compare generated C with the reference interpreter.
 *   usage: driver IN OUT
 * IN:  int64 nsyms, int64 syms[nsyms]; for each input its elements in its dtype at those
 *      sizes; float params[nparam_floats]; unsigned char buffers[buffer_bytes].
 * OUT: double loss, double metrics[nmetrics], float grads[nparam_floats] (train step),
 *      then double loss, double metrics[nmetrics] (eval step, from the same parameters). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kiln_model.h"

extern const kiln_model kiln_model_def;

static void *read_exact(FILE *f, size_t n)
{
    void *p = calloc(n ? n : 1, 1);
    if (!p || fread(p, 1, n, f) != n) {
        fprintf(stderr, "driver: short input\n");
        exit(2);
    }
    return p;
}

int main(int argc, char **argv)
{
    const kiln_model *m = &kiln_model_def;
    if (argc != 3) return 2;
    FILE *in = fopen(argv[1], "rb");
    if (!in) return 2;
    kiln_step_io io;
    memset(&io, 0, sizeof io);
    io.loss_scale = 1; /* fp16's loss scale: the interpreter's */
    int64_t nsyms;
    if (fread(&nsyms, sizeof nsyms, 1, in) != 1 || nsyms != m->nsyms) return 3;
    io.syms = calloc((size_t)nsyms + 1, sizeof *io.syms);
    io.metrics = calloc((size_t)m->nmetrics + 1, sizeof *io.metrics);
    if (nsyms && fread(io.syms, sizeof(int64_t), (size_t)nsyms, in) != (size_t)nsyms) return 3;
    const void **inputs = calloc((size_t)m->ninputs + 1, sizeof *inputs);
    for (int k = 0; k < m->ninputs; k++) {
        const kiln_input *x = &m->inputs[k];
        int64_t n = 1;
        for (int d = 0; d < x->rank; d++) n *= x->sym[d] >= 0 ? io.syms[x->sym[d]] : x->dims[d];
        inputs[k] = read_exact(in, (size_t)n * krt_dtype_size(x->dtype));
    }
    io.inputs = inputs;
    io.params = read_exact(in, sizeof(float) * (size_t)m->nparam_floats);
    io.buffers = read_exact(in, (size_t)m->buffer_bytes);
    fclose(in);
    io.grads = calloc((size_t)m->nparam_floats + 1, sizeof(float));
    unsigned char *saved = malloc((size_t)m->buffer_bytes + 1);
    memcpy(saved, io.buffers, (size_t)m->buffer_bytes);
    io.arena = malloc((size_t)(m->train_arena_bytes > m->eval_arena_bytes ? m->train_arena_bytes : m->eval_arena_bytes) + 64);
    m->train_step(&io);
    if (io.index_error) {
        fprintf(stderr, "driver: index %lld out of range [0, %lld) at line %u\n", (long long)io.index_value,
                (long long)io.index_error->limit, io.index_error->line);
        return 4;
    }
    FILE *out = fopen(argv[2], "wb");
    if (!out) return 2;
    fwrite(&io.loss, sizeof(double), 1, out);
    fwrite(io.metrics, sizeof(double), (size_t)m->nmetrics, out);
    fwrite(io.grads, sizeof(float), (size_t)m->nparam_floats, out);
    memcpy(io.buffers, saved, (size_t)m->buffer_bytes); /* eval sees the same state */
    m->eval_step(&io);
    fwrite(&io.loss, sizeof(double), 1, out);
    fwrite(io.metrics, sizeof(double), (size_t)m->nmetrics, out);
    int rc = fclose(out) == 0 ? 0 : 1;
    /* Everything is freed: the sanitizer builds check this program for leaks too. */
    for (int k = 0; k < m->ninputs; k++) free((void *)inputs[k]);
    free(inputs);
    free(io.syms);
    free(io.metrics);
    free(io.params);
    free(io.buffers);
    free(io.grads);
    free(saved);
    free(io.arena);
    return rc;
}
