/* prefetch.c — datasets and the batches drawn from them (kiln_rt.h, the second half of
 * the data section): samples that are rows of arrays or windows of a token stream, a
 * resumable cursor, seeded shuffling, element type conversion, and the background thread
 * that prepares the next batch while the current one trains. (The file loaders are in
 * data.c; they share nothing with this file but the public header.)
 *
 * Why it is written this way: a batch is a pure function of the cursor (seed, epoch,
 * position) — the epoch's order comes from a counter-based hash of (seed, epoch), never
 * from a generator whose state would have to be saved — so a checkpoint that stores the
 * cursor resumes the data stream exactly, and the prefetch thread, which simply calls
 * krt_dataset_next ahead of time, gives the same batches as direct calls. */
#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

/* a * b into *out unless it overflows int64 (both non-negative). */
static bool mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

/* ---- datasets ----
 * A dataset keeps shallow copies of the caller's krt_array headers: the data is not
 * copied (a training set may be most of the memory), so the arrays' data must outlive the
 * dataset. The only mutable state is the cached permutation, so a dataset must not be
 * used by two threads at once (a running prefetch owns it). */

struct krt_dataset {
    bool windows;       /* language-model windows over arrays[0]; else rows of arrays[0..n) */
    int n;              /* arrays held */
    krt_array *arrays;  /* shallow copies: the data stays the caller's */
    int64_t first;      /* first row, or first token */
    int64_t size;       /* samples per epoch */
    int64_t T;          /* window length */
    int64_t *elems;     /* elements per sample of each array of a sample (arity entries) */
    int64_t *perm;      /* the shuffled order of (perm_seed, perm_epoch), computed lazily */
    uint64_t perm_seed;
    int64_t perm_epoch; /* -1: none computed yet */
};

static krt_dataset *ds_new(int n, int arity)
{
    krt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) return NULL;
    ds->arrays = calloc((size_t)n, sizeof *ds->arrays);
    ds->elems = calloc((size_t)arity, sizeof *ds->elems);
    ds->n = n;
    ds->perm_epoch = -1;
    if (!ds->arrays || !ds->elems) {
        krt_dataset_free(ds);
        return NULL;
    }
    return ds;
}

/* What is wrong with a caller's array, or NULL. nbytes is checked because the dataset
 * reads rows straight out of data: a header promising more than was allocated would
 * turn into reads past the end. */
static const char *array_bad(const krt_array *a)
{
    if (a->dtype >= KRT_DTYPE_COUNT || a->rank < 0 || a->rank > KRT_MAX_RANK) return "bad dtype or rank";
    int64_t c = 1;
    for (int i = 0; i < a->rank; i++)
        if (a->dims[i] < 0 || !mul_ok(c, a->dims[i], &c)) return "bad dims";
    if (!mul_ok(c, (int64_t)krt_dtype_size(a->dtype), &c)) return "bad dims";
    if (c > 0 && !a->data) return "NULL data";
    if ((uint64_t)c > a->nbytes) return "nbytes is smaller than its dims need";
    return NULL;
}

krt_dataset *krt_dataset_rows(const krt_array *arrays, int n, int64_t first, int64_t count, krt_error *err)
{
    if (!arrays || n < 1) {
        krt_fail(err, KRT_EINVAL, "krt_dataset_rows: %s", arrays ? "no arrays" : "NULL arrays");
        return NULL;
    }
    for (int k = 0; k < n; k++) {
        const char *why = arrays[k].rank < 1 ? "rank 0 (rows need rank >= 1)" : array_bad(&arrays[k]);
        if (why) {
            krt_fail(err, KRT_EINVAL, "krt_dataset_rows: array %d: %s", k, why);
            return NULL;
        }
        if (arrays[k].dims[0] != arrays[0].dims[0]) {
            krt_fail(err, KRT_EMISMATCH, "krt_dataset_rows: array %d has %lld rows but array 0 has %lld", k,
                 (long long)arrays[k].dims[0], (long long)arrays[0].dims[0]);
            return NULL;
        }
    }
    if (first < 0 || count < 1 || count > arrays[0].dims[0] - first) {
        krt_fail(err, KRT_EINVAL, "krt_dataset_rows: rows [%lld, %lld + %lld) are not a non-empty range of the %lld rows",
             (long long)first, (long long)first, (long long)count, (long long)arrays[0].dims[0]);
        return NULL;
    }
    krt_dataset *ds = ds_new(n, n);
    if (!ds) {
        krt_fail(err, KRT_ENOMEM, "krt_dataset_rows: out of memory");
        return NULL;
    }
    for (int k = 0; k < n; k++) {
        ds->arrays[k] = arrays[k];
        ds->elems[k] = 1;
        for (int i = 1; i < arrays[k].rank; i++) ds->elems[k] *= arrays[k].dims[i];
    }
    ds->first = first;
    ds->size = count;
    krt_ok(err);
    return ds;
}

krt_dataset *krt_dataset_windows(const krt_array *stream, int64_t T, int64_t first, int64_t count, krt_error *err)
{
    const char *why = !stream ? "NULL" : stream->rank != 1 ? "not 1-D" : array_bad(stream);
    if (why) {
        krt_fail(err, KRT_EINVAL, "krt_dataset_windows: token stream: %s", why);
        return NULL;
    }
    if (T < 1 || first < 0 || count < 0 || count > stream->dims[0] - first) {
        krt_fail(err, KRT_EINVAL, "krt_dataset_windows: window %lld or tokens [%lld, %lld + %lld) out of range of %lld tokens",
             (long long)T, (long long)first, (long long)first, (long long)count, (long long)stream->dims[0]);
        return NULL;
    }
    /* Each window needs T inputs and, for its last target, one token more. */
    if (count < 2 || (count - 1) / T < 1) {
        krt_fail(err, KRT_EINVAL, "krt_dataset_windows: text of %lld tokens is shorter than one window of %lld+1",
             (long long)count, (long long)T);
        return NULL;
    }
    krt_dataset *ds = ds_new(1, 2);
    if (!ds) {
        krt_fail(err, KRT_ENOMEM, "krt_dataset_windows: out of memory");
        return NULL;
    }
    ds->windows = true;
    ds->arrays[0] = *stream;
    ds->elems[0] = ds->elems[1] = T;
    ds->T = T;
    ds->first = first;
    ds->size = (count - 1) / T;
    krt_ok(err);
    return ds;
}

int64_t krt_dataset_size(const krt_dataset *ds) { return ds ? ds->size : 0; }
int krt_dataset_arity(const krt_dataset *ds) { return ds ? (ds->windows ? 2 : ds->n) : 0; }

void krt_dataset_free(krt_dataset *ds)
{
    if (!ds) return;
    free(ds->arrays);
    free(ds->elems);
    free(ds->perm);
    free(ds);
}

/* Shuffling: a counter-based generator, so the order of epoch e depends on nothing but
 * (seed, e) — not on how many batches were drawn before, nor on the batch size. */
static uint64_t splitmix64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15u;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9u;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBu;
    return x ^ (x >> 31);
}

/* Uniform in [0, m), m >= 1, exactly: draws below 2^64 mod m are rejected, so r % m has
 * no bias; the draw counter makes the retries deterministic too. */
static uint64_t uniform_below(uint64_t key, uint64_t i, uint64_t m)
{
    uint64_t threshold = (0 - m) % m;
    for (uint64_t attempt = 0;; attempt++) {
        uint64_t r = splitmix64(key ^ splitmix64(i + attempt * 0xD1B54A32D192ED03u));
        if (r >= threshold) return r % m;
    }
}

static krt_status ensure_perm(krt_dataset *ds, uint64_t seed, int64_t epoch, krt_error *err)
{
    if (ds->perm && ds->perm_epoch == epoch && ds->perm_seed == seed) return KRT_OK;
    if (!ds->perm && !(ds->perm = malloc((size_t)ds->size * sizeof *ds->perm)))
        return krt_fail(err, KRT_ENOMEM, "krt_dataset_next: out of memory for a permutation of %lld samples", (long long)ds->size);
    uint64_t key = splitmix64(seed ^ splitmix64((uint64_t)epoch));
    for (int64_t i = 0; i < ds->size; i++) ds->perm[i] = i;
    for (int64_t i = ds->size - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = (int64_t)uniform_below(key, (uint64_t)i, (uint64_t)i + 1);
        int64_t t = ds->perm[i];
        ds->perm[i] = ds->perm[j];
        ds->perm[j] = t;
    }
    ds->perm_seed = seed;
    ds->perm_epoch = epoch;
    return KRT_OK;
}

static bool is_float(krt_dtype t) { return t == KRT_F16 || t == KRT_BF16 || t == KRT_F32 || t == KRT_F64; }

/* Converts n elements. Integer -> narrower integer keeps the low bits (as a C cast to an
 * unsigned type would, then reinterpreted); float -> integer truncates toward zero and
 * saturates at the target's range (NaN gives 0); anything -> bool is "!= 0"; f64 -> f32
 * beyond f32's range gives +-inf. f16 and bf16 are only copied, never converted.
 * (Documented for users in docs/formats.md.) */
static void convert(void *dst, krt_dtype dt, const void *src, krt_dtype st, int64_t n)
{
    if (dt == st) {
        memcpy(dst, src, (size_t)n * krt_dtype_size(dt));
        return;
    }
    for (int64_t i = 0; i < n; i++) {
        int64_t iv = 0;
        double fv = 0;
        switch (st) {
        case KRT_BOOL: case KRT_U8: iv = ((const uint8_t *)src)[i]; break;
        case KRT_I32: iv = ((const int32_t *)src)[i]; break;
        case KRT_I64: iv = ((const int64_t *)src)[i]; break;
        case KRT_F32: fv = ((const float *)src)[i]; break;
        case KRT_F64: fv = ((const double *)src)[i]; break;
        default: break;
        }
        if (is_float(st)) {
            if (dt == KRT_F32) {
                ((float *)dst)[i] = fv > FLT_MAX ? INFINITY : fv < -FLT_MAX ? -INFINITY : (float)fv;
                continue;
            }
            if (dt == KRT_F64) {
                ((double *)dst)[i] = fv;
                continue;
            }
            if (dt == KRT_BOOL) {
                ((uint8_t *)dst)[i] = fv != 0;
                continue;
            }
            double lo = dt == KRT_U8 ? 0 : dt == KRT_I32 ? INT32_MIN : -9223372036854775808.0;
            double hi = dt == KRT_U8 ? 255 : dt == KRT_I32 ? INT32_MAX : 9223372036854775807.0;
            fv = trunc(fv);
            iv = fv != fv ? 0 : fv <= lo ? (int64_t)lo : fv >= hi ? (dt == KRT_I64 ? INT64_MAX : (int64_t)hi) : (int64_t)fv;
        }
        switch (dt) {
        case KRT_BOOL: ((uint8_t *)dst)[i] = iv != 0; break;
        case KRT_U8: ((uint8_t *)dst)[i] = (uint8_t)iv; break;
        case KRT_I32: ((int32_t *)dst)[i] = (int32_t)(uint32_t)(uint64_t)iv; break;
        case KRT_I64: ((int64_t *)dst)[i] = iv; break;
        case KRT_F32: ((float *)dst)[i] = (float)iv; break;
        case KRT_F64: ((double *)dst)[i] = (double)iv; break;
        default: break;
        }
    }
}

/* Moves a cursor standing at the end of its epoch (or, with drop_last, before a final
 * partial batch) to the start of the next epoch. */
static bool cursor_roll(const krt_dataset *ds, krt_cursor *c, int64_t batch, bool drop_last)
{
    if (c->position == ds->size || (drop_last && ds->size - c->position < batch)) {
        if (c->epoch == INT64_MAX) return false;
        c->epoch++;
        c->position = 0;
    }
    return true;
}

static krt_status check_args(const krt_dataset *ds, const krt_cursor *cur, int64_t batch, bool drop_last,
                              const krt_dtype *dtypes, krt_error *err)
{
    if (!ds || !cur || !dtypes) return krt_fail(err, KRT_EINVAL, "krt_dataset_next: NULL dataset, cursor or dtypes");
    if (batch < 1) return krt_fail(err, KRT_EINVAL, "krt_dataset_next: batch size %lld is not positive", (long long)batch);
    if (drop_last && batch > ds->size)
        return krt_fail(err, KRT_EINVAL, "krt_dataset_next: batch of %lld with drop_last but the dataset has only %lld samples",
                    (long long)batch, (long long)ds->size);
    if (cur->epoch < 0 || cur->position < 0 || cur->position > ds->size)
        return krt_fail(err, KRT_EINVAL, "krt_dataset_next: cursor (epoch %lld, position %lld) is outside a dataset of %lld samples",
                    (long long)cur->epoch, (long long)cur->position, (long long)ds->size);
    for (int k = 0; k < krt_dataset_arity(ds); k++) {
        krt_dtype src = ds->arrays[ds->windows ? 0 : k].dtype, d = dtypes[k];
        if (d >= KRT_DTYPE_COUNT || (d != src && (d == KRT_F16 || d == KRT_BF16 || src == KRT_F16 || src == KRT_BF16)))
            return krt_fail(err, KRT_EINVAL, "krt_dataset_next: cannot convert array %d from %s to %s", k, krt_dtype_name(src),
                        krt_dtype_name(d));
    }
    return KRT_OK;
}

krt_status krt_dataset_next(krt_dataset *ds, krt_cursor *cur, int64_t batch, bool shuffle, bool drop_last, void *const *dst,
                            const krt_dtype *dtypes, int64_t *got, krt_error *err)
{
    krt_status st = check_args(ds, cur, batch, drop_last, dtypes, err);
    if (st) return st;
    int arity = krt_dataset_arity(ds);
    for (int k = 0; k < arity; k++)
        if (!dst || !dst[k]) return krt_fail(err, KRT_EINVAL, "krt_dataset_next: NULL destination for array %d", k);
    krt_cursor c = *cur; /* the caller's cursor changes only on success */
    if (!cursor_roll(ds, &c, batch, drop_last)) return krt_fail(err, KRT_EINVAL, "krt_dataset_next: epoch counter overflow");
    if (shuffle && (st = ensure_perm(ds, c.seed, c.epoch, err))) return st;
    int64_t take = ds->size - c.position < batch ? ds->size - c.position : batch;
    for (int64_t j = 0; j < take; j++) {
        int64_t s = shuffle ? ds->perm[c.position + j] : c.position + j;
        for (int k = 0; k < arity; k++) {
            if (ds->elems[k] == 0) continue; /* rows of zero elements: nothing to copy, data may be NULL */
            const krt_array *a = &ds->arrays[ds->windows ? 0 : k];
            /* rows: row first + s; windows: tokens from first + s*T, targets one later */
            int64_t at = ds->windows ? ds->first + s * ds->T + k : (ds->first + s) * ds->elems[k];
            size_t esz = krt_dtype_size(a->dtype), dsz = krt_dtype_size(dtypes[k]);
            convert((char *)dst[k] + (size_t)(j * ds->elems[k]) * dsz, dtypes[k], (const char *)a->data + (size_t)at * esz,
                    a->dtype, ds->elems[k]);
        }
    }
    c.position += take;
    cursor_roll(ds, &c, batch, drop_last); /* at INT64_MAX epochs the next call reports it */
    *cur = c;
    if (got) *got = take;
    return krt_ok(err);
}

/* ---- prefetch ----
 * Two internal slots (double buffering): the thread fills one while the caller copies the
 * other out. The thread owns the dataset (its permutation cache) and its own cursor while
 * it runs; the caller must not use the dataset until krt_prefetch_stop. A failed batch
 * parks the thread: the error stays in its slot and every later next returns it. */

typedef struct {
    void **buf; /* one buffer per array of a sample, room for `batch` samples */
    int64_t got;
    krt_cursor after;
    krt_status st;
    krt_error err;
} Slot;

struct krt_prefetch {
    krt_dataset *ds;
    int64_t batch;
    bool shuffle, drop_last;
    int arity;
    krt_dtype *dtypes;
    size_t *bytes; /* bytes per sample of each array, as converted */
    Slot slot[2];
    krt_cursor cur; /* the producer's; only the thread touches it once started */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int head;   /* the slot the caller takes next */
    int filled; /* slots ready, from head on */
    bool stop, parked;
    pthread_t thread;
};

static void *producer(void *arg)
{
    krt_prefetch *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && (p->filled == 2 || p->parked)) pthread_cond_wait(&p->cv, &p->mu);
        if (p->stop) break;
        Slot *s = &p->slot[(p->head + p->filled) % 2];
        /* The slot is not visible to the caller until filled counts it, so it is written
         * without the lock, while the caller copies the other slot. */
        pthread_mutex_unlock(&p->mu);
        s->st = krt_dataset_next(p->ds, &p->cur, p->batch, p->shuffle, p->drop_last, s->buf, p->dtypes, &s->got, &s->err);
        s->after = p->cur;
        pthread_mutex_lock(&p->mu);
        p->filled++;
        if (s->st) p->parked = true;
        pthread_cond_broadcast(&p->cv);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

static void prefetch_free(krt_prefetch *p)
{
    for (int i = 0; i < 2; i++) {
        for (int k = 0; p->slot[i].buf && k < p->arity; k++) free(p->slot[i].buf[k]);
        free(p->slot[i].buf);
    }
    free(p->dtypes);
    free(p->bytes);
    free(p);
}

krt_prefetch *krt_prefetch_start(krt_dataset *ds, krt_cursor cur, int64_t batch, bool shuffle, bool drop_last,
                                 const krt_dtype *dtypes, krt_error *err)
{
    /* Everything krt_dataset_next would refuse is refused here, so that a mistake shows at
     * start rather than at the first next. */
    if (check_args(ds, &cur, batch, drop_last, dtypes, err)) return NULL;
    krt_prefetch *p = calloc(1, sizeof *p);
    if (!p) goto nomem;
    p->ds = ds;
    p->cur = cur;
    p->batch = batch;
    p->shuffle = shuffle;
    p->drop_last = drop_last;
    p->arity = krt_dataset_arity(ds);
    p->dtypes = malloc((size_t)p->arity * sizeof *p->dtypes);
    p->bytes = malloc((size_t)p->arity * sizeof *p->bytes);
    if (!p->dtypes || !p->bytes) goto nomem;
    memcpy(p->dtypes, dtypes, (size_t)p->arity * sizeof *p->dtypes);
    for (int k = 0; k < p->arity; k++) {
        int64_t per, all;
        if (!mul_ok(ds->elems[k], (int64_t)krt_dtype_size(dtypes[k]), &per) || !mul_ok(per, batch, &all)) goto nomem;
        p->bytes[k] = (size_t)per;
    }
    for (int i = 0; i < 2; i++) {
        if (!(p->slot[i].buf = calloc((size_t)p->arity, sizeof *p->slot[i].buf))) goto nomem;
        for (int k = 0; k < p->arity; k++)
            if (!(p->slot[i].buf[k] = malloc(p->bytes[k] * (size_t)batch + 1))) goto nomem;
    }
    if (pthread_mutex_init(&p->mu, NULL)) goto nomem;
    if (pthread_cond_init(&p->cv, NULL)) {
        pthread_mutex_destroy(&p->mu);
        goto nomem;
    }
    int e = pthread_create(&p->thread, NULL, producer, p);
    if (e) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        prefetch_free(p);
        krt_fail(err, KRT_ENOMEM, "krt_prefetch_start: cannot start the prefetch thread: %s", strerror(e));
        return NULL;
    }
    krt_ok(err);
    return p;
nomem:
    if (p) prefetch_free(p);
    krt_fail(err, KRT_ENOMEM, "krt_prefetch_start: out of memory for two batches of %lld", (long long)batch);
    return NULL;
}

krt_status krt_prefetch_next(krt_prefetch *p, void *const *dst, int64_t *got, krt_cursor *after, krt_error *err)
{
    if (!p || !dst) return krt_fail(err, KRT_EINVAL, "krt_prefetch_next: NULL %s", p ? "destination" : "prefetch");
    pthread_mutex_lock(&p->mu);
    while (p->filled == 0) pthread_cond_wait(&p->cv, &p->mu);
    Slot *s = &p->slot[p->head];
    pthread_mutex_unlock(&p->mu);
    if (s->st) { /* the slot stays: the thread is parked and every later call says the same */
        if (err) *err = s->err;
        return s->st;
    }
    for (int k = 0; k < p->arity; k++) memcpy(dst[k], s->buf[k], p->bytes[k] * (size_t)s->got);
    if (got) *got = s->got;
    if (after) *after = s->after;
    pthread_mutex_lock(&p->mu);
    p->head = (p->head + 1) % 2;
    p->filled--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    return krt_ok(err);
}

void krt_prefetch_stop(krt_prefetch *p)
{
    if (!p) return;
    /* The thread notices stop between batches, so this waits for at most the batch being
     * produced. */
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    prefetch_free(p);
}
