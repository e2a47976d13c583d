/* ckpt_compare.h — whether two checkpoint files hold the same training state, for the
 * tests that require a resumed (or killed and resumed) run to end exactly where an
 * uninterrupted one does. The files' bytes differ in the run id (a resumed run is a run of
 * its own) and so in the metadata's checksum; everything else must be equal: every tensor
 * (name, dtype, shape, bytes) and every other metadata value Kiln writes. */
#ifndef KILN_TESTS_CKPT_COMPARE_H
#define KILN_TESTS_CKPT_COMPARE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "../runtime/kiln_rt.h"

/* NULL when the files at paths a and b hold the same state (with metadata, or the tensors
 * alone), else what differs (a static buffer). */
static inline const char *ckpt_compare(const char *a, const char *b, bool metadata);

/* The tensors of two checkpoint files alone: NULL when they are the same bits. */
static inline const char *ckpt_tensor_difference(const char *a, const char *b) { return ckpt_compare(a, b, false); }

static inline const char *ckpt_difference(const char *a, const char *b) { return ckpt_compare(a, b, true); }

/* Writes the message into why; one too long for it (a long path, or a reader's error
 * message of up to 4 KiB) is cut and ends in "...". */
static inline void ckpt_say(char *why, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static inline void ckpt_say(char *why, size_t size, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(why, size, fmt, ap);
    va_end(ap);
    if (n < 0) snprintf(why, size, "(the difference cannot be formatted)");
    else if ((size_t)n >= size && size > 4) memcpy(why + size - 4, "...", 4);
}

static inline const char *ckpt_compare(const char *a, const char *b, bool metadata)
{
    static char why[1200];
    static const char *const keys[] = {"format",  "kiln_model",     "kiln_hash",  "step",
                                       "epoch",   "position",       "seed",       "optimizer_step",
                                       "batches", "loss_scale",     "loss_scale_growth_tracker", "loss_scale_skipped"};
    krt_safetensors *x = NULL, *y = NULL;
    krt_error err;
    why[0] = 0;
    if (krt_safetensors_read(a, &x, &err) != KRT_OK || krt_safetensors_read(b, &y, &err) != KRT_OK) {
        ckpt_say(why, sizeof why, "%s", err.msg);
    } else if (krt_safetensors_count(x) != krt_safetensors_count(y)) {
        ckpt_say(why, sizeof why, "%s has %d tensors, %s %d", a, krt_safetensors_count(x), b, krt_safetensors_count(y));
    } else {
        for (int i = 0; !why[0] && i < krt_safetensors_count(x); i++) {
            const krt_st_tensor *t = krt_safetensors_tensor(x, i), *u = krt_safetensors_find(y, t->name);
            size_t bytes = krt_dtype_size(t->dtype);
            for (int d = 0; d < t->rank; d++) bytes *= (size_t)t->dims[d];
            if (!u || u->dtype != t->dtype || u->rank != t->rank || memcmp(u->dims, t->dims, sizeof t->dims[0] * (size_t)t->rank) ||
                memcmp(t->data, u->data, bytes))
                ckpt_say(why, sizeof why, "tensor '%s' differs between %s and %s", t->name, a, b);
        }
        for (size_t k = 0; metadata && !why[0] && k < sizeof keys / sizeof keys[0]; k++) {
            const char *v = krt_safetensors_meta(x, keys[k]), *w = krt_safetensors_meta(y, keys[k]);
            if ((v || w) && (!v || !w || strcmp(v, w)))
                ckpt_say(why, sizeof why, "metadata '%s' is %s in %s, %s in %s", keys[k], v ? v : "missing", a, w ? w : "missing", b);
        }
    }
    krt_safetensors_free(x);
    krt_safetensors_free(y);
    return why[0] ? why : NULL;
}

#endif
