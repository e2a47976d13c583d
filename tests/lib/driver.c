/* driver.c — test_lib's program over a library that kiln build --lib made, for models of
 * one input and one output (mlp, cnn: an image to logits; gpt: tokens to logits). It is
 * compiled per model with -DMODEL=mlp -DUPPER=MLP -DIN_T=uint8_t -DOUT_T=float. The
 * driver, not the library, reads and writes files: the library only sees memory.
 * W is a safetensors file, or `embedded` for the library's own (--embed-weights).
 *   driver run W.safetensors IN.raw N BATCH THREADS OUT.raw
 *       all N samples of IN.raw (raw IN_T, batch-major) in batches of BATCH, the outputs
 *       to OUT.raw (raw OUT_T)
 *   driver two W1 W2 IN.raw N BATCH THREADS OUT1.raw OUT2.raw
 *       two instances with the two weights, run at the same time from two threads, each
 *       over all N samples three times (each time the same bits, else exit status 3)
 *   driver bind W.safetensors [CUT]
 *       binds W (its first CUT bytes when given) and prints "status N: MESSAGE"
 *   driver misuse
 *       NULL, misaligned or short memory, a run before bind, batches 0 and bound + 1 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STR2(x) #x
#define STR(x) STR2(x)
#define CAT2(a, b) a##b
#define CAT(a, b) CAT2(a, b)
#include STR(MODEL.h)

#define API(f) CAT(MODEL, f)
#define K(name) CAT(UPPER, name)

typedef API(_instance) instance;

static unsigned char *read_all(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)size + 1);
    *n = b ? fread(b, 1, (size_t)size, f) : 0;
    fclose(f);
    return b;
}

static void *aligned(size_t n)
{
    void *p = NULL;
    return posix_memalign(&p, K(_ALIGN), n ? n : 1) ? NULL : p;
}

/* An instance with its own weights and workspace, bound to file w; exits on a failure. */
static instance make(const char *w)
{
    instance m;
    char msg[512];
    size_t n = 0;
    if (API(_init)(&m, aligned(K(_WEIGHTS_BYTES)), K(_WEIGHTS_BYTES), aligned(K(_WORKSPACE_BYTES)), K(_WORKSPACE_BYTES), msg, sizeof msg))
        fprintf(stderr, "%s: %s\n", w, msg), exit(1);
    if (!strcmp(w, "embedded")) {
#if K(_HAS_EMBEDDED_WEIGHTS)
        if (API(_bind_embedded)(&m, msg, sizeof msg)) fprintf(stderr, "embedded: %s\n", msg), exit(1);
        return m;
#else
        fprintf(stderr, "the library has no embedded weights\n"), exit(1);
#endif
    }
    unsigned char *file = read_all(w, &n);
    if (!file) fprintf(stderr, "cannot read %s\n", w), exit(1);
    if (API(_bind)(&m, file, n, msg, sizeof msg)) fprintf(stderr, "%s: %s\n", w, msg), exit(1);
    free(file); /* the weights were copied */
    return m;
}

typedef struct {
    instance *m;
    const IN_T *in;
    OUT_T *out;
    long n, batch;
    int rc;
} Job;

static int run_all(instance *m, const IN_T *in, OUT_T *out, long n, long batch)
{
    char msg[512];
    for (long i = 0; i < n; i += batch) {
        long b = n - i < batch ? n - i : batch;
        int rc = API(_run)(m, b, in + i * IN_ELEMS, out + i * OUT_ELEMS, msg, sizeof msg);
        if (rc) return fprintf(stderr, "run: status %d: %s\n", rc, msg), rc;
    }
    return 0;
}

static void *job(void *arg)
{
    Job *j = arg;
    OUT_T *again = malloc(sizeof(OUT_T) * (size_t)(j->n * OUT_ELEMS));
    j->rc = run_all(j->m, j->in, j->out, j->n, j->batch);
    for (int r = 0; r < 2 && !j->rc && again; r++) {
        j->rc = run_all(j->m, j->in, again, j->n, j->batch);
        if (!j->rc && memcmp(again, j->out, sizeof(OUT_T) * (size_t)(j->n * OUT_ELEMS))) j->rc = 3;
    }
    free(again);
    return NULL;
}

static int write_all(const char *path, const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f)) return fprintf(stderr, "cannot write %s\n", path), 1;
    return 0;
}

static int misuse(void)
{
    instance m;
    char msg[512];
    unsigned char *w = aligned(K(_WEIGHTS_BYTES) + K(_ALIGN)), *ws = aligned(K(_WORKSPACE_BYTES));
    IN_T *in = calloc((size_t)(K(_BATCH_MAX) + 1) * IN_ELEMS, sizeof *in);
    OUT_T *out = calloc((size_t)(K(_BATCH_MAX) + 1) * OUT_ELEMS, sizeof *out);
    int rc;
    msg[0] = 0;
#define SHOW(what, call) (rc = (call), printf("%s %d: %s\n", what, rc, msg), msg[0] = 0)
    SHOW("null", API(_init)(&m, NULL, K(_WEIGHTS_BYTES), ws, K(_WORKSPACE_BYTES), msg, sizeof msg));
    SHOW("misaligned", API(_init)(&m, w + 1, K(_WEIGHTS_BYTES), ws, K(_WORKSPACE_BYTES), msg, sizeof msg));
    SHOW("short", API(_init)(&m, w, K(_WEIGHTS_BYTES), ws, K(_WORKSPACE_BYTES) - 1, msg, sizeof msg));
    SHOW("init", API(_init)(&m, w, K(_WEIGHTS_BYTES), ws, K(_WORKSPACE_BYTES), NULL, 0));
    SHOW("unbound", API(_run)(&m, 1, in, out, msg, sizeof msg));
    m.bound = 1; /* as if bound: the batch is checked before anything runs */
    SHOW("batch 0", API(_run)(&m, 0, in, out, msg, sizeof msg));
    SHOW("batch over", API(_run)(&m, K(_BATCH_MAX) + 1, in, out, msg, sizeof msg));
    SHOW("threads 0", API(_set_threads)(&m, 0));
    SHOW("null input", API(_run)(&m, 1, NULL, out, msg, sizeof msg));
#undef SHOW
    printf("workspace %zu %zu %zu\n", API(_workspace_bytes)(0), API(_workspace_bytes)(1), API(_workspace_bytes)(K(_BATCH_MAX) + 1));
    free(w);
    free(ws);
    free(in);
    free(out);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc >= 2 && !strcmp(argv[1], "misuse")) return misuse();
    if (argc >= 3 && !strcmp(argv[1], "bind")) {
        instance m;
        char msg[512] = "";
        size_t n = 0;
        unsigned char *file = read_all(argv[2], &n);
        if (!file) return fprintf(stderr, "cannot read %s\n", argv[2]), 1;
        if (argc > 3 && (size_t)atol(argv[3]) < n) n = (size_t)atol(argv[3]);
        int rc = API(_init)(&m, aligned(K(_WEIGHTS_BYTES)), K(_WEIGHTS_BYTES), aligned(K(_WORKSPACE_BYTES)), K(_WORKSPACE_BYTES), msg, sizeof msg);
        if (!rc) rc = API(_bind)(&m, file, n, msg, sizeof msg);
        printf("status %d: %s\n", rc, msg);
        free(file);
        free(m.weights);
        free(m.workspace);
        return 0;
    }
    if (argc == 8 && !strcmp(argv[1], "run")) {
        instance m = make(argv[2]);
        size_t bytes = 0;
        long n = atol(argv[4]), batch = atol(argv[5]);
        API(_set_threads)(&m, atoi(argv[6]));
        IN_T *in = (IN_T *)read_all(argv[3], &bytes);
        OUT_T *out = malloc(sizeof(OUT_T) * (size_t)(n * OUT_ELEMS));
        if (!in || bytes < sizeof(IN_T) * (size_t)(n * IN_ELEMS)) return fprintf(stderr, "%s: too short\n", argv[3]), 1;
        int rc = run_all(&m, in, out, n, batch);
        if (!rc) rc = write_all(argv[7], out, sizeof(OUT_T) * (size_t)(n * OUT_ELEMS));
        free(in);
        free(out);
        free(m.weights);
        free(m.workspace);
        return rc;
    }
    if (argc == 10 && !strcmp(argv[1], "two")) {
        instance m[2] = {make(argv[2]), make(argv[3])};
        size_t bytes = 0;
        long n = atol(argv[5]), batch = atol(argv[6]);
        for (int i = 0; i < 2; i++) API(_set_threads)(&m[i], atoi(argv[7]));
        IN_T *in = (IN_T *)read_all(argv[4], &bytes);
        if (!in || bytes < sizeof(IN_T) * (size_t)(n * IN_ELEMS)) return fprintf(stderr, "%s: too short\n", argv[4]), 1;
        Job j[2];
        pthread_t t[2];
        for (int i = 0; i < 2; i++) {
            j[i] = (Job){&m[i], in, malloc(sizeof(OUT_T) * (size_t)(n * OUT_ELEMS)), n, batch, 0};
            if (pthread_create(&t[i], NULL, job, &j[i])) return fprintf(stderr, "pthread_create failed\n"), 1;
        }
        int rc = 0;
        for (int i = 0; i < 2; i++) {
            pthread_join(t[i], NULL);
            rc = rc ? rc : j[i].rc;
        }
        for (int i = 0; i < 2 && !rc; i++) rc = write_all(argv[8 + i], j[i].out, sizeof(OUT_T) * (size_t)(n * OUT_ELEMS));
        for (int i = 0; i < 2; i++) {
            free(j[i].out);
            free(m[i].weights);
            free(m[i].workspace);
        }
        free(in);
        return rc;
    }
    fprintf(stderr, "usage: driver run|two|bind|misuse ...\n");
    return 2;
}
