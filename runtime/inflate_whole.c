/* inflate_whole.c — a gzip file inflated in one call by libdeflate, where the machine has
 * it (Debian's libdeflate0; scripts/deps.sh installs it), for data.c's gzip sources.
 *
 * libdeflate inflates a whole member 2.5 times as fast as zlib's streaming inflate():
 * Fashion-MNIST's 26 MB of training images, 95 ms against 240, most of a first
 * `kiln train models/mlp.kiln`'s time to its first step. It is opened with dlopen, so a
 * program (or a library's user) links nothing more and runs as before where it is absent.
 * Only the plain case takes this path: one member, a trailer whose size (ISIZE) holds the
 * data, at most KRT_INFLATE_WHOLE_MAX bytes (larger ones stream through zlib rather than
 * be held whole). Anything else, a corrupt or cut stream included, returns false and
 * goes through zlib, which says what is wrong with it. The library's handle and functions
 * are the only state, found once. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#include "rt_internal.h"

#define KRT_INFLATE_WHOLE_MAX (1ull << 30)

/* libdeflate's API (libdeflate.h, stable since 1.0 under the soname libdeflate.so.0),
 * declared here so that building Kiln does not need its header */
struct libdeflate_decompressor;
enum { LIBDEFLATE_SUCCESS = 0 };
static struct {
    struct libdeflate_decompressor *(*alloc)(void);
    int (*gzip_ex)(struct libdeflate_decompressor *, const void *, size_t, void *, size_t, size_t *, size_t *);
    void (*release)(struct libdeflate_decompressor *);
} lib;
static pthread_once_t lib_once = PTHREAD_ONCE_INIT;

static void lib_open(void)
{
    void *h = dlopen("libdeflate.so.0", RTLD_NOW | RTLD_LOCAL);
    if (!h) return;
    lib.alloc = (struct libdeflate_decompressor * (*)(void)) dlsym(h, "libdeflate_alloc_decompressor");
    lib.gzip_ex = (int (*)(struct libdeflate_decompressor *, const void *, size_t, void *, size_t, size_t *, size_t *))dlsym(
        h, "libdeflate_gzip_decompress_ex");
    lib.release = (void (*)(struct libdeflate_decompressor *))dlsym(h, "libdeflate_free_decompressor");
    if (!lib.alloc || !lib.gzip_ex || !lib.release) lib.alloc = NULL; /* not the library we know: zlib then */
}

bool krt_inflate_whole(const unsigned char *in, size_t n, unsigned char **out, size_t *out_len)
{
    *out = NULL;
    *out_len = 0;
    if (n < 18) return false; /* shorter than a gzip header and trailer */
    /* ISIZE: the data's size mod 2^32, little-endian in the last 4 bytes. DEFLATE expands
     * at most 1032:1, so a larger claim is corrupt (zlib will say so). */
    const size_t isize = (size_t)in[n - 4] | (size_t)in[n - 3] << 8 | (size_t)in[n - 2] << 16 | (size_t)in[n - 1] << 24;
    if (isize > KRT_INFLATE_WHOLE_MAX || isize / 1032 > n) return false;
    pthread_once(&lib_once, lib_open);
    if (!lib.alloc) return false;
    struct libdeflate_decompressor *d = lib.alloc();
    unsigned char *buf = malloc(isize ? isize : 1);
    bool ok = false;
    if (d && buf) {
        size_t used = 0, made = 0;
        /* the whole file one member: what it used is all of it, what it made all of ISIZE */
        ok = lib.gzip_ex(d, in, n, buf, isize, &used, &made) == LIBDEFLATE_SUCCESS && used == n && made == isize;
    }
    if (d) lib.release(d);
    if (!ok) {
        free(buf);
        return false;
    }
    *out = buf;
    *out_len = isize;
    return true;
}
