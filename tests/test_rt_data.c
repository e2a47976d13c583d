/* test_rt_data.c — the runtime's data section (runtime/data.c, runtime/prefetch.c): the
 * IDX, .npy, text and token loaders, datasets, shuffling, cursors and prefetch.
 *
 * Every input is a small file written into a fresh temporary directory (mkdtemp) by the
 * test itself, so each error path is exercised on exactly the bytes that should trigger
 * it; the real Fashion-MNIST files and Debian's fortunes are checked too when installed.
 * What matters for errors is that they are reported (right code, a message naming the
 * file and the problem), never a crash: the ASan build runs these same tests. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "../runtime/kiln_rt.h"

#define FMNIST "/usr/share/datasets/fashion-mnist/"
#define FORTUNES "/usr/share/games/fortunes"

/* ---- a temporary directory per test ---- */

static char tdir[64], cdir[64];

/* the runtime's cache of inflated gzip files (data_cache.c) in a directory of the test's */
static void setup(void)
{
    strcpy(tdir, "/tmp/kiln_rt_data_XXXXXX");
    cr_assert_not_null(mkdtemp(tdir));
    strcpy(cdir, "/tmp/kiln_rt_cache_XXXXXX");
    cr_assert_not_null(mkdtemp(cdir));
    setenv("XDG_CACHE_HOME", cdir, 1);
    unsetenv("KILN_CACHE_MAX_BYTES");
}

static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[512];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) rm_tree(p);
        else unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

static void teardown(void)
{
    rm_tree(tdir);
    rm_tree(cdir);
}

TestSuite(rt_data, .init = setup, .fini = teardown, .timeout = 60);

/* Path of a file in the temporary directory (one of 4 rotating static buffers). */
static const char *tp(const char *name)
{
    static char bufs[4][256];
    static int i;
    char *b = bufs[i++ % 4];
    snprintf(b, 256, "%s/%s", tdir, name);
    return b;
}

static const char *put(const char *name, const void *bytes, size_t n)
{
    const char *p = tp(name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(bytes, 1, n, f), n);
    fclose(f);
    return p;
}

static const char *put_gz(const char *name, const void *bytes, size_t n)
{
    const char *p = tp(name);
    gzFile g = gzopen(p, "wb");
    cr_assert_not_null(g);
    cr_assert_eq(gzwrite(g, bytes, (unsigned)n), (int)n);
    cr_assert_eq(gzclose(g), Z_OK);
    return p;
}

static unsigned char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert_not_null(f);
    fseek(f, 0, SEEK_END);
    *n = (size_t)ftell(f);
    rewind(f);
    unsigned char *b = malloc(*n + 1);
    cr_assert_eq(fread(b, 1, *n, f), *n);
    fclose(f);
    return b;
}

/* An IDX header then data: type, rank, dims big-endian. Returns the byte count. */
static size_t idx_bytes(unsigned char *buf, int type, int rank, const uint32_t *dims, const void *data, size_t n)
{
    size_t k = 0;
    buf[k++] = 0, buf[k++] = 0, buf[k++] = (unsigned char)type, buf[k++] = (unsigned char)rank;
    for (int i = 0; i < rank; i++)
        for (int b = 3; b >= 0; b--) buf[k++] = (unsigned char)(dims[i] >> 8 * b);
    memcpy(buf + k, data, n);
    return k + n;
}

/* dtype, rank, dims and nbytes of a loaded array. */
#define CHECK_SHAPE(a, t, r, ...) check_shape(&(a), t, r, (int64_t[]){0, __VA_ARGS__})
static void check_shape(const krt_array *a, krt_dtype t, int rank, const int64_t *dims)
{
    cr_assert_eq(a->dtype, t, "dtype %s", krt_dtype_name(a->dtype));
    cr_assert_eq(a->rank, rank);
    for (int i = 0; i < rank; i++) cr_assert_eq(a->dims[i], dims[i + 1], "dim %d: %lld", i, (long long)a->dims[i]);
    cr_assert_eq(a->nbytes, (size_t)krt_array_count(a) * krt_dtype_size(t));
}

/* A call that must fail with `want`, its message holding every one of subs. */
static void expect_err(krt_status got, krt_status want, const krt_error *e, const char *const *subs, size_t n)
{
    cr_assert_eq(got, want, "status %s (%s)", krt_status_name(got), e->msg);
    cr_assert_eq(e->code, want);
    for (size_t i = 0; i < n; i++) cr_assert(strstr(e->msg, subs[i]), "message \"%s\" lacks \"%s\"", e->msg, subs[i]);
}
#define SUBS(...) (const char *[]){__VA_ARGS__}, sizeof((const char *[]){__VA_ARGS__}) / sizeof(const char *)
#define EXPECT_ERR(call, code, ...) expect_err((call), code, &err, SUBS(__VA_ARGS__))
/* A loader given `path` must fail with `code`, name the file, and leave the array empty. */
#define LOAD_ERR(load, path, code, ...)                                                                              \
    do {                                                                                                              \
        const char *p_ = (path);                                                                                      \
        krt_array a_;                                                                                                 \
        krt_error e_;                                                                                                 \
        expect_err(load(p_, &a_, &e_), code, &e_, SUBS(p_, __VA_ARGS__));                                             \
        cr_assert_null(a_.data);                                                                                      \
    } while (0)

/* ---- IDX ---- */

Test(rt_data, idx_u8_plain_and_gz)
{
    unsigned char px[6] = {0, 1, 2, 253, 254, 255}, buf[64];
    size_t n = idx_bytes(buf, 0x08, 2, (uint32_t[]){2, 3}, px, 6);
    const char *paths[2] = {put("a.idx", buf, n), put_gz("a.idx.gz", buf, n)};
    for (int i = 0; i < 2; i++) {
        krt_array a;
        krt_error err;
        cr_assert_eq(krt_idx_load(paths[i], &a, &err), KRT_OK, "%s", err.msg);
        CHECK_SHAPE(a, KRT_U8, 2, 2, 3);
        cr_assert_arr_eq(a.data, px, 6);
        krt_array_free(&a);
    }
}

/* Writes a 1-D IDX file of n elements (gzipped or not), loads it, checks dtype and shape. */
static krt_array idx_1d(bool gz, int type, uint32_t n, const void *be, size_t nb, krt_dtype want)
{
    unsigned char buf[128];
    size_t k = idx_bytes(buf, type, 1, &n, be, nb);
    krt_array a;
    krt_error err;
    cr_assert_eq(krt_idx_load(gz ? put_gz("1d.gz", buf, k) : put("1d", buf, k), &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, want, 1, n);
    return a;
}

Test(rt_data, idx_wider_types_are_big_endian)
{
    /* i8 and i16 widen to i32, sign-extended */
    krt_array a = idx_1d(false, 0x09, 3, (unsigned char[]){0x80, 0xFF, 0x7F}, 3, KRT_I32);
    cr_assert_arr_eq(a.data, ((int32_t[]){-128, -1, 127}), 12);
    krt_array_free(&a);
    a = idx_1d(false, 0x0B, 2, (unsigned char[]){0x80, 0x00, 0x01, 0x02}, 4, KRT_I32);
    cr_assert_arr_eq(a.data, ((int32_t[]){-32768, 258}), 8);
    krt_array_free(&a);
    a = idx_1d(true, 0x0C, 2, (unsigned char[]){0xFF, 0xFF, 0xFF, 0xFE, 0x01, 0x02, 0x03, 0x04}, 8, KRT_I32);
    cr_assert_arr_eq(a.data, ((int32_t[]){-2, 0x01020304}), 8);
    krt_array_free(&a);
    /* f32: 1.5 = 0x3FC00000, -2 = 0xC0000000; f64: 0.1 = 0x3FB999999999999A */
    a = idx_1d(true, 0x0D, 2, (unsigned char[]){0x3F, 0xC0, 0, 0, 0xC0, 0, 0, 0}, 8, KRT_F32);
    cr_assert_arr_eq(a.data, ((float[]){1.5f, -2.0f}), 8);
    krt_array_free(&a);
    a = idx_1d(false, 0x0E, 1, (unsigned char[]){0x3F, 0xB9, 0x99, 0x99, 0x99, 0x99, 0x99, 0x9A}, 8, KRT_F64);
    cr_assert_eq(((double *)a.data)[0], 0.1);
    krt_array_free(&a);
}

Test(rt_data, idx_truncated_and_trailing)
{
    unsigned char px[12] = {0}, buf[64];
    /* Header says 2x3 (6 bytes), file has 5, or 7. */
    size_t n = idx_bytes(buf, 0x08, 2, (uint32_t[]){2, 3}, px, 5);
    LOAD_ERR(krt_idx_load, put("short.idx", buf, n), KRT_EFORMAT, "truncated", "2x3 (6 bytes of data)", "has 5");
    LOAD_ERR(krt_idx_load, put_gz("short.idx.gz", buf, n), KRT_EFORMAT, "truncated", "2x3 (6 bytes of data)", "has 5");
    n = idx_bytes(buf, 0x08, 2, (uint32_t[]){2, 3}, px, 7);
    LOAD_ERR(krt_idx_load, put("long.idx", buf, n), KRT_EFORMAT, "trailing data", "2x3");
    LOAD_ERR(krt_idx_load, put_gz("long.idx.gz", buf, n), KRT_EFORMAT, "trailing data", "2x3");
    /* Header itself cut: rank 3 but only two dims present. */
    n = idx_bytes(buf, 0x08, 2, (uint32_t[]){2, 3}, px, 0);
    buf[3] = 3;
    LOAD_ERR(krt_idx_load, put("hdr.idx", buf, n), KRT_EFORMAT, "truncated", "header");
    LOAD_ERR(krt_idx_load, put("empty.idx", "", 0), KRT_EFORMAT, "truncated");
}

Test(rt_data, idx_gz_stream_cut_or_corrupt)
{
    /* Incompressible-ish data so the compressed stream is long enough to cut in the middle. */
    enum { N = 20000 };
    unsigned char *buf = malloc(N + 16), *data = malloc(N);
    uint32_t x = 12345;
    for (int i = 0; i < N; i++) data[i] = (unsigned char)((x = x * 1103515245u + 12345u) >> 24);
    size_t n = idx_bytes(buf, 0x08, 2, (uint32_t[]){100, 200}, data, N);
    size_t gzn;
    unsigned char *gz = slurp(put_gz("full.gz", buf, n), &gzn);
    krt_error err;
    krt_array a;
    LOAD_ERR(krt_idx_load, put("cut.gz", gz, gzn / 2), KRT_EFORMAT, "truncated", "100x200", "cut off");
    /* Only the gzip trailer's length field is missing: the data is all there but unchecked. */
    LOAD_ERR(krt_idx_load, put("cut8.gz", gz, gzn - 4), KRT_EFORMAT, "truncated", "cut off after the data");
    LOAD_ERR(krt_idx_load, put("cut3.gz", gz, 3), KRT_EFORMAT, "");
    gz[gzn / 2] ^= 0x55; /* corrupt: inflate's data error or the CRC check */
    LOAD_ERR(krt_idx_load, put("bad.gz", gz, gzn), KRT_EFORMAT, "");
    gz[gzn / 2] ^= 0x55;
    /* The trailer's CRC or size (ISIZE) wrong: a whole member inflated at once (libdeflate,
     * where the machine has it) is checked as zlib checks a stream, and the error is zlib's */
    gz[gzn - 8] ^= 1;
    LOAD_ERR(krt_idx_load, put("crc.gz", gz, gzn), KRT_EFORMAT, "");
    gz[gzn - 8] ^= 1;
    gz[gzn - 4] ^= 1;
    LOAD_ERR(krt_idx_load, put("isize.gz", gz, gzn), KRT_EFORMAT, "");
    gz[gzn - 4] ^= 1;
    cr_assert_eq(krt_idx_load(put("whole.gz", gz, gzn), &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, data, N);
    krt_array_free(&a);
    /* Two gzip members concatenated are one stream (as gzip -c a b does); junk after is not. */
    size_t half = 1000;
    size_t n1, n2;
    unsigned char *g1 = slurp(put_gz("m1.gz", buf, half), &n1), *g2 = slurp(put_gz("m2.gz", buf + half, n - half), &n2);
    unsigned char *cat = malloc(n1 + n2 + 4);
    memcpy(cat, g1, n1);
    memcpy(cat + n1, g2, n2);
    cr_assert_eq(krt_idx_load(put("cat.gz", cat, n1 + n2), &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, data, N);
    krt_array_free(&a);
    memcpy(cat + n1 + n2, "junk", 4);
    LOAD_ERR(krt_idx_load, put("junk.gz", cat, n1 + n2 + 4), KRT_EFORMAT, "garbage");
    free(buf), free(data), free(gz), free(g1), free(g2), free(cat);
}

/* The entries of the cache of inflated gzip files, in name order: their count, and each
 * one's size in sizes[] (at most 4). */
static int cache_entries(long long *sizes)
{
    char dir[128];
    snprintf(dir, sizeof dir, "%s/kiln/data", cdir);
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat st;
        cr_assert_eq(stat(p, &st), 0);
        if (n < 4) sizes[n] = (long long)st.st_size;
        n++;
    }
    if (d) closedir(d);
    return n;
}

/* The only entry's path (there must be one). */
static const char *cache_entry(void)
{
    static char p[512];
    char dir[128];
    snprintf(dir, sizeof dir, "%s/kiln/data", cdir);
    DIR *d = opendir(dir);
    cr_assert_not_null(d);
    struct dirent *e;
    p[0] = 0;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
    closedir(d);
    cr_assert(p[0]);
    return p;
}

/* A gzip IDX file's first load writes its inflated copy (the IDX bytes and a 24-byte
 * footer); the next loads read it and give the same array; a damaged copy is replaced; a
 * changed source is another entry; a file that does not load leaves none; the bound 0
 * keeps none. */
Test(rt_data, gzip_files_inflated_once)
{
    enum { N = 5000 };
    unsigned char *buf = malloc(N + 16), *data = malloc(N);
    for (int i = 0; i < N; i++) data[i] = (unsigned char)(i * 7 + i / 13);
    size_t n = idx_bytes(buf, 0x08, 2, (uint32_t[]){50, 100}, data, N);
    const char *path = put_gz("c.gz", buf, n);
    long long sizes[4];
    krt_array a;
    krt_error err;
    for (int round = 0; round < 3; round++) {
        cr_assert_eq(krt_idx_load(path, &a, &err), KRT_OK, "%s", err.msg);
        CHECK_SHAPE(a, KRT_U8, 2, 50, 100);
        cr_assert_arr_eq(a.data, data, N, "load %d", round);
        krt_array_free(&a);
        cr_assert_eq(cache_entries(sizes), 1);
        cr_assert_eq(sizes[0], (long long)n + 24, "the copy holds %lld bytes", sizes[0]);
        if (round == 1) cr_assert_eq(truncate(cache_entry(), (off_t)n), 0); /* damaged: the footer gone */
    }
    /* the copy is what is read: a copy with other data (and a right footer) gives it */
    char entry[512];
    snprintf(entry, sizeof entry, "%s", cache_entry());
    FILE *f = fopen(entry, "r+b");
    cr_assert_not_null(f);
    fseek(f, (long)(n - 1), SEEK_SET);
    fputc(0xAB, f);
    fclose(f);
    cr_assert_eq(krt_idx_load(path, &a, &err), KRT_OK, "%s", err.msg);
    cr_expect_eq(((unsigned char *)a.data)[N - 1], 0xAB, "the second load did not read the copy");
    krt_array_free(&a);
    /* a new source at the same path: its own entry, its own data */
    data[0] ^= 1;
    n = idx_bytes(buf, 0x08, 2, (uint32_t[]){50, 100}, data, N);
    path = put_gz("c.gz", buf, n);
    cr_assert_eq(krt_idx_load(path, &a, &err), KRT_OK, "%s", err.msg);
    cr_expect_arr_eq(a.data, data, N);
    krt_array_free(&a);
    cr_assert_eq(cache_entries(sizes), 2);
    /* a file that fails (cut in the middle) writes nothing */
    size_t gzn;
    unsigned char *gz = slurp(path, &gzn);
    LOAD_ERR(krt_idx_load, put("cut.gz", gz, gzn / 2), KRT_EFORMAT, "truncated");
    cr_assert_eq(cache_entries(sizes), 2);
    /* a bound below one copy keeps none; 0 makes no directory */
    setenv("KILN_CACHE_MAX_BYTES", "1K", 1);
    path = put_gz("d.gz", buf, n);
    cr_assert_eq(krt_idx_load(path, &a, &err), KRT_OK, "%s", err.msg);
    krt_array_free(&a);
    cr_assert_eq(cache_entries(sizes), 0, "a 1K cache holds %lld bytes", sizes[0]);
    char off[128];
    snprintf(off, sizeof off, "%s/off", cdir);
    setenv("XDG_CACHE_HOME", off, 1);
    setenv("KILN_CACHE_MAX_BYTES", "0", 1);
    cr_assert_eq(krt_idx_load(path, &a, &err), KRT_OK, "%s", err.msg);
    krt_array_free(&a);
    struct stat st;
    cr_expect_neq(stat(off, &st), 0, "KILN_CACHE_MAX_BYTES=0 made a cache directory");
    free(buf), free(data), free(gz);
}

Test(rt_data, idx_bad_headers)
{
    unsigned char buf[64], px[4] = {0};
    krt_error err;
    krt_array a;
    size_t n = idx_bytes(buf, 0x08, 1, (uint32_t[]){4}, px, 4);
    buf[1] = 1;
    LOAD_ERR(krt_idx_load, put("magic", buf, n), KRT_EFORMAT, "not an IDX file");
    n = idx_bytes(buf, 0x0A, 1, (uint32_t[]){4}, px, 4);
    LOAD_ERR(krt_idx_load, put("type", buf, n), KRT_EFORMAT, "element type 0x0A");
    n = idx_bytes(buf, 0x08, 0, NULL, px, 4);
    LOAD_ERR(krt_idx_load, put("rank0", buf, n), KRT_EFORMAT, "rank 0");
    buf[3] = 9;
    LOAD_ERR(krt_idx_load, put("rank9", buf, n), KRT_EFORMAT, "rank 9");
    /* Eight dims of 2^32-1: the product overflows; must be refused, not allocated. */
    uint32_t big[8] = {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u, ~0u};
    n = idx_bytes(buf, 0x0E, 8, big, px, 4);
    LOAD_ERR(krt_idx_load, put_gz("overflow.gz", buf, n), KRT_EFORMAT, "overflow");
    /* A gzip file claiming 2^40 bytes of data, holding 4: truncated, without a huge allocation. */
    n = idx_bytes(buf, 0x08, 2, (uint32_t[]){1u << 20, 1u << 20}, px, 4);
    LOAD_ERR(krt_idx_load, put_gz("huge.gz", buf, n), KRT_EFORMAT, "truncated", "1048576x1048576");
    EXPECT_ERR(krt_idx_load(tp("missing"), &a, &err), KRT_EIO, "missing", "cannot open");
    EXPECT_ERR(krt_idx_load(tdir, &a, &err), KRT_EIO, tdir, "not a regular file");
    EXPECT_ERR(krt_idx_load(NULL, &a, &err), KRT_EINVAL, "NULL");
}

static uint64_t sum_u8(const krt_array *a, int64_t from, int64_t n)
{
    uint64_t s = 0;
    for (int64_t i = from; i < from + n; i++) s += ((const uint8_t *)a->data)[i];
    return s;
}

Test(rt_data, fashion_mnist)
{
    if (access(FMNIST "train-images-idx3-ubyte.gz", R_OK) != 0) cr_skip_test("Fashion-MNIST is not installed");
    /* Expected sums computed once with Python's gzip module. */
    static const struct {
        const char *img, *lab;
        int64_t n;
        uint64_t first_sum, last_sum;
    } sets[] = {
        {FMNIST "train-images-idx3-ubyte.gz", FMNIST "train-labels-idx1-ubyte.gz", 60000, 76247, 16684},
        {FMNIST "t10k-images-idx3-ubyte.gz", FMNIST "t10k-labels-idx1-ubyte.gz", 10000, 33456, 24390},
    };
    for (int i = 0; i < 2; i++) {
        krt_array img, lab;
        krt_error err;
        cr_assert_eq(krt_idx_load(sets[i].img, &img, &err), KRT_OK, "%s", err.msg);
        CHECK_SHAPE(img, KRT_U8, 3, sets[i].n, 28, 28);
        cr_assert_eq(sum_u8(&img, 0, 784), sets[i].first_sum);
        cr_assert_eq(sum_u8(&img, (sets[i].n - 1) * 784, 784), sets[i].last_sum);
        cr_assert_eq(krt_idx_load(sets[i].lab, &lab, &err), KRT_OK, "%s", err.msg);
        CHECK_SHAPE(lab, KRT_U8, 1, sets[i].n);
        cr_assert_eq(((uint8_t *)lab.data)[0], 9);
        cr_assert_eq(((uint8_t *)lab.data)[sets[i].n - 1], 5);
        cr_assert_eq(sum_u8(&lab, 0, sets[i].n), (uint64_t)sets[i].n * 9 / 2); /* balanced classes */
        krt_array_free(&img);
        krt_array_free(&lab);
    }
}

/* ---- .npy ---- */

/* A .npy file: version, header dict (padded to 64 with spaces and '\n'), data. */
static const char *put_npy(const char *name, int version, const char *dict, const void *data, size_t n)
{
    unsigned char buf[1024];
    size_t pl = version == 1 ? 10 : 12, dl = strlen(dict);
    size_t hl = ((pl + dl + 1 + 63) / 64) * 64 - pl;
    memcpy(buf, "\x93NUMPY", 6);
    buf[6] = (unsigned char)version, buf[7] = 0;
    for (size_t i = 0; i < pl - 8; i++) buf[8 + i] = (unsigned char)(hl >> 8 * i);
    memcpy(buf + pl, dict, dl);
    memset(buf + pl + dl, ' ', hl - dl - 1);
    buf[pl + hl - 1] = '\n';
    if (n) memcpy(buf + pl + hl, data, n);
    return put(name, buf, pl + hl + n);
}

Test(rt_data, npy_dtypes_versions_shapes)
{
    krt_array a;
    krt_error err;
    float f[6] = {1, 2, 3, 4, 5, -6};
    for (int v = 1; v <= 3; v++) {
        const char *p = put_npy("f.npy", v, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", f, sizeof f);
        cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "v%d: %s", v, err.msg);
        CHECK_SHAPE(a, KRT_F32, 2, 2, 3);
        cr_assert_arr_eq(a.data, f, sizeof f);
        krt_array_free(&a);
    }
    /* Scalar shape (), any key order, double quotes. */
    double d = 2.5;
    const char *p = put_npy("s.npy", 1, "{\"shape\": (), \"fortran_order\": False, \"descr\": \"<f8\"}", &d, 8);
    cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, KRT_F64, 0, 0);
    cr_assert_eq(krt_array_count(&a), 1);
    cr_assert_eq(*(double *)a.data, 2.5);
    krt_array_free(&a);
    /* (n,), and Python 2's long suffix */
    int64_t i8[3] = {-1, 0, INT64_MAX};
    p = put_npy("i8.npy", 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3L,), }", i8, sizeof i8);
    cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, KRT_I64, 1, 3);
    cr_assert_arr_eq(a.data, i8, sizeof i8);
    krt_array_free(&a);
    int32_t i4[2] = {7, -7};
    p = put_npy("i4.npy", 2, "{'descr': '<i4', 'fortran_order': False, 'shape': (1, 2)}", i4, sizeof i4);
    cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dtype, KRT_I32);
    cr_assert_arr_eq(a.data, i4, sizeof i4);
    krt_array_free(&a);
    unsigned char u[3] = {0, 1, 2};
    const char *u1[2] = {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }",
                         "{'descr': '<u1', 'fortran_order': False, 'shape': (3,), }"};
    for (int i = 0; i < 2; i++) {
        cr_assert_eq(krt_npy_load(put_npy("u.npy", 1, u1[i], u, 3), &a, &err), KRT_OK, "%s", err.msg);
        cr_assert_eq(a.dtype, KRT_U8);
        cr_assert_arr_eq(a.data, u, 3);
        krt_array_free(&a);
    }
    p = put_npy("b.npy", 1, "{'descr': '|b1', 'fortran_order': False, 'shape': (3,), }", u, 3);
    cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dtype, KRT_BOOL);
    cr_assert_arr_eq(a.data, ((unsigned char[]){0, 1, 1}), 3); /* normalized */
    krt_array_free(&a);
    /* zero-size */
    p = put_npy("z.npy", 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }", NULL, 0);
    cr_assert_eq(krt_npy_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_array_count(&a), 0);
    krt_array_free(&a);
}

Test(rt_data, npy_errors)
{
    krt_array a;
    krt_error err;
    float f[4] = {0};
#define NPY(descr, fortran, shape) "{'descr': " descr ", 'fortran_order': " fortran ", 'shape': " shape ", }"
    static const struct {
        const char *dict;
        size_t n; /* data bytes */
        const char *want[4];
    } cases[] = {
        {NPY("'<c8'", "False", "(2,)"), 16, {"unsupported dtype '<c8'"}},
        {NPY("'>f4'", "False", "(2,)"), 8, {"unsupported dtype '>f4'"}},
        {NPY("[('a', '<f4')]", "False", "(2,)"), 8, {"unsupported dtype"}},
        {NPY("'<f4'", "True", "(2, 2)"), 16, {"fortran_order"}},
        {NPY("'<f4'", "False", "(2, 2)"), 12, {"truncated", "2x2", "16 bytes", "has 12"}},
        {NPY("'<f4'", "False", "(3,)"), 16, {"trailing data"}},
        {"{'descr': '<f4', 'fortran_order': False}", 16, {"lacks"}},
        {NPY("'<f4'", "False", "(2 2)"), 16, {"shape"}},
        {NPY("'<f4'", "False", "(-2,)"), 16, {"shape"}},
        {NPY("'<f4'", "False", "(1,1,1,1,1,1,1,1,1)"), 4, {"8 dimensions"}},
        {NPY("'<f8'", "False", "(4294967296, 4294967296, 4294967296)"), 4, {"overflow"}},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}", 4, {"unknown key"}},
        {"{'descr': '<f4', 'fortran_order': Maybe, 'shape': (1,)}", 4, {"fortran_order"}},
        {"[1, 2]", 4, {"not a dict"}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *p = put_npy("bad.npy", 1, cases[i].dict, f, cases[i].n);
        a.data = (void *)1;
        cr_assert_eq(krt_npy_load(p, &a, &err), KRT_EFORMAT, "case %zu: %s", i, err.msg);
        cr_assert_null(a.data);
        cr_assert(strstr(err.msg, p), "%s", err.msg);
        for (int k = 0; k < 4 && cases[i].want[k]; k++)
            cr_assert(strstr(err.msg, cases[i].want[k]), "case %zu: \"%s\" lacks \"%s\"", i, err.msg, cases[i].want[k]);
    }
    const char *p;
    p = put_npy("v4.npy", 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", f, 4);
    unsigned char *b;
    size_t n;
    b = slurp(p, &n);
    b[6] = 4;
    LOAD_ERR(krt_npy_load, put("v4.npy", b, n), KRT_EFORMAT, "version 4.0");
    b[6] = 2, b[8] = 0xFF, b[9] = 0xFF; /* header length beyond the file */
    LOAD_ERR(krt_npy_load, put("hlen.npy", b, n), KRT_EFORMAT, "truncated");
    b[0] = 'x';
    LOAD_ERR(krt_npy_load, put("magic.npy", b, n), KRT_EFORMAT, "not a .npy");
    LOAD_ERR(krt_npy_load, put("tiny.npy", "\x93NUMPY", 6), KRT_EFORMAT, "");
    free(b);
    EXPECT_ERR(krt_npy_load(tp("none.npy"), &a, &err), KRT_EIO, "none.npy");
}

/* ---- text ---- */

Test(rt_data, text_glob_exclude_sort)
{
    char pat[300];
    put("b.txt", "BB", 2);
    put("a.txt", "A", 1);
    put("c.dat", "index", 5);
    put("d", "ddd", 3);
    cr_assert_eq(mkdir(tp("e.dir"), 0755), 0); /* a directory matching the pattern is skipped */
    krt_array a;
    krt_error err;
    snprintf(pat, sizeof pat, "%s/*", tdir);
    cr_assert_eq(krt_text_load(pat, "*.dat", &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, KRT_U8, 1, 6);
    cr_assert_arr_eq(a.data, "ABBddd", 6);
    krt_array_free(&a);
    cr_assert_eq(krt_text_load(pat, NULL, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, "ABBindexddd", 11);
    krt_array_free(&a);
    cr_assert_eq(krt_text_load(pat, "", &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dims[0], 11);
    krt_array_free(&a);
    snprintf(pat, sizeof pat, "%s/*.txt", tdir);
    cr_assert_eq(krt_text_load(pat, NULL, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, "ABB", 3);
    krt_array_free(&a);
    snprintf(pat, sizeof pat, "%s/*.none", tdir);
    EXPECT_ERR(krt_text_load(pat, NULL, &a, &err), KRT_EIO, pat, "no file matches");
    snprintf(pat, sizeof pat, "%s/*", tdir);
    EXPECT_ERR(krt_text_load(pat, "*", &a, &err), KRT_EIO, pat, "no regular file matches", "'*' is excluded");
    snprintf(pat, sizeof pat, "%s/e.*", tdir);
    EXPECT_ERR(krt_text_load(pat, NULL, &a, &err), KRT_EIO, pat, "no regular file");
    put("empty1.z", "", 0);
    put("empty2.z", "", 0);
    snprintf(pat, sizeof pat, "%s/*.z", tdir);
    EXPECT_ERR(krt_text_load(pat, NULL, &a, &err), KRT_EFORMAT, pat, "empty");
    cr_assert_null(a.data);
}

Test(rt_data, text_fortunes)
{
    DIR *d = opendir(FORTUNES);
    if (!d) cr_skip_test("fortunes are not installed");
    /* Count the files independently: names without a dot, regular files. */
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) files += e->d_name[0] != '.' && !strchr(e->d_name, '.');
    closedir(d);
    krt_array a;
    krt_error err;
    cr_assert_eq(krt_text_load(FORTUNES "/*", "*.*", &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(files, 43);
    CHECK_SHAPE(a, KRT_U8, 1, 2576674);
    /* Sorted by name: "art" comes first. */
    size_t n;
    unsigned char *art = slurp(FORTUNES "/art", &n);
    cr_assert_arr_eq(a.data, art, n);
    free(art);
    krt_array_free(&a);
}

/* ---- token files ---- */

Test(rt_data, tokens_round_trip)
{
    int32_t t2[5] = {0, 1, 255, 256, 65535};
    int32_t t4[4] = {0, 65536, 123456789, INT32_MAX};
    krt_error err;
    krt_array a;
    const char *p = tp("t2.tok");
    cr_assert_eq(krt_tokens_write(p, t2, 5, 2, &err), KRT_OK, "%s", err.msg);
    size_t n;
    unsigned char *b = slurp(p, &n);
    cr_assert_eq(n, 24 + 10);
    cr_assert_arr_eq(b, "KILNTOK1\x02\0\0\0\0\0\0\0\x05\0\0\0\0\0\0\0\0\0\x01\0\xff\0\0\x01\xff\xff", 34);
    free(b);
    cr_assert_eq(krt_tokens_load(p, &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, KRT_I32, 1, 5);
    cr_assert_arr_eq(a.data, t2, sizeof t2);
    krt_array_free(&a);
    cr_assert_eq(krt_tokens_write(p, t4, 4, 4, &err), KRT_OK, "%s", err.msg); /* replaces */
    cr_assert_eq(krt_tokens_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dims[0], 4);
    cr_assert_arr_eq(a.data, t4, sizeof t4);
    krt_array_free(&a);
    cr_assert_eq(krt_tokens_write(tp("e.tok"), NULL, 0, 2, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_tokens_load(tp("e.tok"), &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dims[0], 0);
    krt_array_free(&a);
    /* A larger file crosses the writer's internal buffer several times. */
    enum { BIG = 100003 };
    int32_t *big = malloc(BIG * sizeof *big);
    for (int i = 0; i < BIG; i++) big[i] = (i * 7919) % 65536;
    cr_assert_eq(krt_tokens_write(tp("big.tok"), big, BIG, 2, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_tokens_load(tp("big.tok"), &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, big, BIG * sizeof *big);
    krt_array_free(&a);
    free(big);
    /* Nothing but the three token files is left: the temporaries were renamed away. */
    DIR *d = opendir(tdir);
    int files = 0;
    struct dirent *e;
    while ((e = readdir(d))) files += e->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(files, 3);
}

Test(rt_data, tokens_write_errors)
{
    krt_error err;
    const char *p = tp("x.tok");
    int32_t ok[1] = {7};
    cr_assert_eq(krt_tokens_write(p, ok, 1, 2, &err), KRT_OK, "%s", err.msg);
    EXPECT_ERR(krt_tokens_write(p, (int32_t[]){1, 65536}, 2, 2, &err), KRT_EINVAL, p, "65536", "index 1");
    EXPECT_ERR(krt_tokens_write(p, (int32_t[]){-1}, 1, 4, &err), KRT_EINVAL, p, "-1");
    EXPECT_ERR(krt_tokens_write(p, ok, 1, 3, &err), KRT_EINVAL, p, "width 3");
    EXPECT_ERR(krt_tokens_write(p, ok, 1, 8, &err), KRT_EINVAL, p, "width 8");
    EXPECT_ERR(krt_tokens_write(p, NULL, 2, 2, &err), KRT_EINVAL, p);
    EXPECT_ERR(krt_tokens_write(tp("nodir/x.tok"), ok, 1, 2, &err), KRT_EIO, "nodir/x.tok");
    /* The failed writes left the earlier file intact. */
    krt_array a;
    cr_assert_eq(krt_tokens_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(a.dims[0], 1);
    cr_assert_eq(((int32_t *)a.data)[0], 7);
    krt_array_free(&a);
}

Test(rt_data, tokens_load_errors)
{
    krt_error err;
    krt_array a;
    unsigned char h[40] = "KILNTOK1\x02\0\0\0\0\0\0\0\x03\0\0\0\0\0\0\0\x01\0\x02\0\x03\0";
    const char *p = put("ok.tok", h, 30);
    cr_assert_eq(krt_tokens_load(p, &a, &err), KRT_OK, "%s", err.msg);
    cr_assert_arr_eq(a.data, ((int32_t[]){1, 2, 3}), 12);
    krt_array_free(&a);
    LOAD_ERR(krt_tokens_load, put("short.tok", h, 29), KRT_EFORMAT, "truncated", "3 tokens");
    LOAD_ERR(krt_tokens_load, put("long.tok", h, 32), KRT_EFORMAT, "trailing data");
    LOAD_ERR(krt_tokens_load, put("hdr.tok", h, 20), KRT_EFORMAT, "truncated", "header");
    h[8] = 3;
    LOAD_ERR(krt_tokens_load, put("w3.tok", h, 30), KRT_EFORMAT, "width 3");
    h[8] = 2, h[12] = 1;
    LOAD_ERR(krt_tokens_load, put("res.tok", h, 30), KRT_EFORMAT, "reserved");
    h[12] = 0, h[23] = 0x80; /* count 2^63 + 3 */
    LOAD_ERR(krt_tokens_load, put("huge.tok", h, 30), KRT_EFORMAT, "truncated");
    h[23] = 0, h[8] = 4, h[16] = 1; /* one 4-byte token 0x80000000 */
    h[24] = 0, h[25] = 0, h[26] = 0, h[27] = 0x80;
    LOAD_ERR(krt_tokens_load, put("neg.tok", h, 28), KRT_EFORMAT, "2147483648", "does not fit");
    h[0] = 'X';
    LOAD_ERR(krt_tokens_load, put("magic.tok", h, 28), KRT_EFORMAT, "not a token file");
    EXPECT_ERR(krt_tokens_load(tp("none.tok"), &a, &err), KRT_EIO, "none.tok");
}

/* ---- any format (krt_array_load) ---- */

/* The reader is chosen by the first bytes, whatever the file's name says. */
Test(rt_data, array_load_chooses_the_reader_by_content)
{
    krt_array a;
    krt_error err;
    const uint8_t px[6] = {1, 2, 3, 4, 5, 6};
    unsigned char buf[64];
    size_t n = idx_bytes(buf, 0x08, 2, (uint32_t[]){2, 3}, px, 6);
    const char *idx = put("images.npy", buf, n); /* an IDX file named .npy */
    const char *gz = put_gz("images.idx", buf, n);
    const char *npy = put_npy("images.gz", 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (2, 3), }", px, 6);
    const int32_t toks[3] = {7, 8, 9};
    cr_assert_eq(krt_tokens_write(tp("t.idx"), toks, 3, 2, &err), KRT_OK, "%s", err.msg);
    const char *paths[3] = {idx, gz, npy};
    for (int i = 0; i < 3; i++) {
        cr_assert_eq(krt_array_load(paths[i], &a, &err), KRT_OK, "%s: %s", paths[i], err.msg);
        CHECK_SHAPE(a, KRT_U8, 2, 2, 3);
        cr_expect_eq(memcmp(a.data, px, 6), 0, "%s", paths[i]);
        krt_array_free(&a);
    }
    cr_assert_eq(krt_array_load(tp("t.idx"), &a, &err), KRT_OK, "%s", err.msg);
    CHECK_SHAPE(a, KRT_I32, 1, 3);
    cr_expect_eq(((int32_t *)a.data)[2], 9);
    krt_array_free(&a);
    /* Errors of the chosen reader are its own, naming the file. */
    buf[n - 1] = 0;
    LOAD_ERR(krt_array_load, put("cut.npy", buf, n - 2), KRT_EFORMAT, "truncated");
    /* None of the formats: the file, the formats tried and what it starts with. */
    LOAD_ERR(krt_array_load, put("x.npy", "PK\3\4zip", 7), KRT_EFORMAT, "not a data file of a format Kiln reads", "IDX", "gzip",
             ".npy", "KILNTOK1", "it starts with 50 4b 03 04");
    LOAD_ERR(krt_array_load, put("empty.idx", "", 0), KRT_EFORMAT, "the file is empty");
    LOAD_ERR(krt_array_load, tp("missing.idx"), KRT_EIO, "cannot open");
    LOAD_ERR(krt_array_load, tdir, KRT_EIO, "not a regular file");
}

/* ---- datasets ---- */

static krt_array arr(krt_dtype t, int rank, const int64_t *dims, void *data)
{
    krt_array a = {.dtype = t, .rank = rank, .data = data};
    memcpy(a.dims, dims, (size_t)rank * sizeof *dims);
    a.nbytes = (size_t)krt_array_count(&a) * krt_dtype_size(t);
    return a;
}

/* Rows of a [n, 2] i32 array holding (i, -i), and n u8 labels i % 256. */
typedef struct {
    int32_t *x;
    uint8_t *y;
    krt_array a[2];
} Rows;

static void rows_make(Rows *r, int64_t n)
{
    r->x = malloc((size_t)n * 2 * sizeof *r->x);
    r->y = malloc((size_t)n);
    for (int64_t i = 0; i < n; i++) r->x[2 * i] = (int32_t)i, r->x[2 * i + 1] = (int32_t)-i, r->y[i] = (uint8_t)i;
    r->a[0] = arr(KRT_I32, 2, (int64_t[]){n, 2}, r->x);
    r->a[1] = arr(KRT_U8, 1, (int64_t[]){n}, r->y);
}

static void rows_free(Rows *r) { free(r->x), free(r->y); }

static const krt_dtype I32_U8[2] = {KRT_I32, KRT_U8};

Test(rt_data, rows_sequential_partial_last_batch)
{
    Rows r;
    rows_make(&r, 20);
    krt_error err;
    krt_dataset *ds = krt_dataset_rows(r.a, 2, 5, 10, &err); /* rows 5..14 */
    cr_assert_not_null(ds, "%s", err.msg);
    cr_assert_eq(krt_dataset_size(ds), 10);
    cr_assert_eq(krt_dataset_arity(ds), 2);
    int32_t x[8];
    uint8_t y[4];
    void *dst[2] = {x, y};
    krt_cursor c = {.seed = 1};
    int64_t got;
    int64_t expect_got[] = {4, 4, 2, 4}, expect_pos[] = {4, 8, 0, 4}, expect_ep[] = {0, 0, 1, 1}, first_row[] = {5, 9, 13, 5};
    for (int b = 0; b < 4; b++) {
        cr_assert_eq(krt_dataset_next(ds, &c, 4, false, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
        cr_assert_eq(got, expect_got[b]);
        cr_assert_eq(c.position, expect_pos[b]);
        cr_assert_eq(c.epoch, expect_ep[b]);
        for (int j = 0; j < got; j++) {
            cr_assert_eq(x[2 * j], first_row[b] + j);
            cr_assert_eq(x[2 * j + 1], -(first_row[b] + j));
            cr_assert_eq(y[j], first_row[b] + j);
        }
    }
    /* drop_last: the partial batch is skipped and the cursor rolls over right away. */
    c = (krt_cursor){.seed = 1};
    int64_t dl_pos[] = {4, 0, 4, 0}, dl_ep[] = {0, 1, 1, 2};
    for (int b = 0; b < 4; b++) {
        cr_assert_eq(krt_dataset_next(ds, &c, 4, false, true, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
        cr_assert_eq(got, 4);
        cr_assert_eq(c.position, dl_pos[b]);
        cr_assert_eq(c.epoch, dl_ep[b]);
        cr_assert_eq(x[0], b % 2 ? 9 : 5);
    }
    /* A cursor left before a partial batch by a non-drop_last run is rolled by drop_last. */
    c = (krt_cursor){.epoch = 3, .position = 8};
    cr_assert_eq(krt_dataset_next(ds, &c, 4, false, true, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(x[0], 5);
    cr_assert_eq(c.epoch, 4);
    /* A cursor at the very end of an epoch starts the next. */
    c = (krt_cursor){.epoch = 0, .position = 10};
    cr_assert_eq(krt_dataset_next(ds, &c, 4, false, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(c.epoch, 1);
    cr_assert_eq(x[0], 5);
    krt_dataset_free(ds);
    rows_free(&r);
}

Test(rt_data, rows_errors)
{
    Rows r;
    rows_make(&r, 20);
    krt_error err;
    krt_array bad[2] = {r.a[0], r.a[1]};
    bad[1].dims[0] = 19;
    cr_assert_null(krt_dataset_rows(bad, 2, 0, 10, &err));
    cr_assert_eq(err.code, KRT_EMISMATCH);
    cr_assert(strstr(err.msg, "19 rows"), "%s", err.msg);
    cr_assert_null(krt_dataset_rows(r.a, 2, 15, 10, &err));
    cr_assert_eq(err.code, KRT_EINVAL);
    cr_assert_null(krt_dataset_rows(r.a, 2, -1, 5, &err));
    cr_assert_null(krt_dataset_rows(r.a, 2, 0, 0, &err));
    cr_assert_null(krt_dataset_rows(r.a, 0, 0, 5, &err));
    cr_assert_null(krt_dataset_rows(NULL, 1, 0, 5, &err));
    bad[1] = r.a[1], bad[1].nbytes = 3;
    cr_assert_null(krt_dataset_rows(bad, 2, 0, 5, &err));
    cr_assert(strstr(err.msg, "nbytes"), "%s", err.msg);
    bad[1] = r.a[1], bad[1].rank = 0;
    cr_assert_null(krt_dataset_rows(bad, 2, 0, 5, &err));
    cr_assert(strstr(err.msg, "rank 0"), "%s", err.msg);

    krt_dataset *ds = krt_dataset_rows(r.a, 2, 0, 20, &err);
    int32_t x[64];
    uint8_t y[32];
    void *dst[2] = {x, y};
    int64_t got;
    krt_cursor c = {0};
    EXPECT_ERR(krt_dataset_next(ds, &c, 0, false, false, dst, I32_U8, &got, &err), KRT_EINVAL, "batch size 0");
    EXPECT_ERR(krt_dataset_next(ds, &c, 21, false, true, dst, I32_U8, &got, &err), KRT_EINVAL, "drop_last", "20 samples");
    c.position = 21;
    EXPECT_ERR(krt_dataset_next(ds, &c, 4, false, false, dst, I32_U8, &got, &err), KRT_EINVAL, "cursor");
    cr_assert_eq(c.position, 21); /* unchanged on error */
    c.position = 0;
    EXPECT_ERR(krt_dataset_next(ds, &c, 4, false, false, dst, ((krt_dtype[]){KRT_F16, KRT_U8}), &got, &err), KRT_EINVAL,
               "i32 to f16");
    EXPECT_ERR(krt_dataset_next(ds, &c, 4, false, false, dst, ((krt_dtype[]){KRT_I32, 99}), &got, &err), KRT_EINVAL,
               "array 1");
    EXPECT_ERR(krt_dataset_next(ds, &c, 4, false, false, NULL, I32_U8, &got, &err), KRT_EINVAL, "NULL");
    EXPECT_ERR(krt_dataset_next(ds, &c, 4, false, false, (void *[]){x, NULL}, I32_U8, &got, &err), KRT_EINVAL,
               "NULL destination for array 1");
    /* The batch is larger than the dataset: without drop_last, the whole epoch at once. */
    cr_assert_eq(krt_dataset_next(ds, &c, 32, false, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(got, 20);
    cr_assert_eq(c.epoch, 1);
    krt_dataset_free(ds);
    krt_dataset_free(NULL);
    /* Rows of zero elements (no data at all) are still rows. */
    krt_array empty = arr(KRT_F32, 2, (int64_t[]){5, 0}, NULL);
    ds = krt_dataset_rows(&empty, 1, 0, 5, &err);
    cr_assert_not_null(ds, "%s", err.msg);
    c = (krt_cursor){0};
    cr_assert_eq(krt_dataset_next(ds, &c, 2, true, false, (void *[]){x}, (krt_dtype[]){KRT_F32}, &got, &err), KRT_OK);
    cr_assert_eq(got, 2);
    krt_dataset_free(ds);
    rows_free(&r);
}

/* The order of rows of one epoch, drawn in batches of `batch`. */
static void epoch_order(krt_dataset *ds, uint64_t seed, int64_t epoch, int64_t batch, int32_t *order)
{
    int64_t n = krt_dataset_size(ds), have = 0, got;
    int32_t *x = malloc((size_t)batch * 2 * sizeof *x);
    uint8_t *y = malloc((size_t)batch);
    void *dst[2] = {x, y};
    krt_cursor c = {.seed = seed, .epoch = epoch};
    krt_error err;
    while (have < n) {
        cr_assert_eq(krt_dataset_next(ds, &c, batch, true, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
        for (int64_t j = 0; j < got; j++) order[have + j] = x[2 * j];
        have += got;
    }
    cr_assert_eq(have, n);
    cr_assert_eq(c.epoch, epoch + 1);
    free(x), free(y);
}

Test(rt_data, shuffle_is_a_seeded_permutation)
{
    enum { N = 50 };
    Rows r;
    rows_make(&r, N);
    krt_error err;
    krt_dataset *ds = krt_dataset_rows(r.a, 2, 0, N, &err);
    int32_t o[4][N];
    epoch_order(ds, 42, 0, 7, o[0]);
    epoch_order(ds, 42, 1, 7, o[1]);
    epoch_order(ds, 43, 0, 7, o[2]);
    epoch_order(ds, 42, 0, 16, o[3]); /* the batch size does not change the order */
    for (int k = 0; k < 3; k++) {
        bool seen[N] = {0};
        for (int i = 0; i < N; i++) {
            cr_assert(o[k][i] >= 0 && o[k][i] < N);
            cr_assert(!seen[o[k][i]], "row %d twice", o[k][i]);
            seen[o[k][i]] = true;
        }
    }
    cr_assert_arr_eq(o[0], o[3], sizeof o[0]);
    cr_assert_arr_neq(o[0], o[1], sizeof o[0]);
    cr_assert_arr_neq(o[0], o[2], sizeof o[0]);
    int in_place = 0;
    for (int i = 0; i < N; i++) in_place += o[0][i] == i;
    cr_assert_lt(in_place, N / 2);
    /* The algorithm is pinned (docs/formats.md): a checkpoint written by one build must
     * resume the same order in the next. Computed with the Python transcription there. */
    int32_t pinned[N];
    epoch_order(ds, 42, 3, N, pinned);
    cr_assert_arr_eq(pinned, ((int32_t[]){43, 18, 13, 20, 36, 2, 41, 15, 7, 47}), 10 * sizeof(int32_t));
    /* Labels stay with their rows. */
    int32_t x[10];
    uint8_t y[5];
    krt_cursor c = {.seed = 9};
    int64_t got;
    cr_assert_eq(krt_dataset_next(ds, &c, 5, true, false, (void *[]){x, y}, I32_U8, &got, &err), KRT_OK);
    for (int j = 0; j < 5; j++) cr_assert(y[j] == x[2 * j] && x[2 * j + 1] == -x[2 * j]);
    krt_dataset_free(ds);
    rows_free(&r);
}

Test(rt_data, cursor_resume_is_exact)
{
    enum { N = 37, B = 8 };
    Rows r;
    rows_make(&r, N);
    krt_error err;
    krt_dataset *ds = krt_dataset_rows(r.a, 2, 0, N, &err);
    int32_t x[2 * B], after[3][2 * B];
    uint8_t y[B];
    void *dst[2] = {x, y};
    krt_cursor c = {.seed = 2024}, saved;
    int64_t got, gots[3];
    for (int b = 0; b < 7; b++) /* crosses an epoch boundary (37 = 4 * 8 + 5) */
        cr_assert_eq(krt_dataset_next(ds, &c, B, true, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
    saved = c;
    for (int b = 0; b < 3; b++) {
        cr_assert_eq(krt_dataset_next(ds, &c, B, true, false, dst, I32_U8, &gots[b], &err), KRT_OK, "%s", err.msg);
        memcpy(after[b], x, sizeof x);
    }
    krt_dataset_free(ds);
    /* A fresh dataset (a restarted program) from the saved cursor. */
    ds = krt_dataset_rows(r.a, 2, 0, N, &err);
    c = saved;
    for (int b = 0; b < 3; b++) {
        memset(x, 0xAB, sizeof x);
        cr_assert_eq(krt_dataset_next(ds, &c, B, true, false, dst, I32_U8, &got, &err), KRT_OK, "%s", err.msg);
        cr_assert_eq(got, gots[b]);
        cr_assert_arr_eq(x, after[b], (size_t)got * 2 * sizeof *x);
    }
    krt_dataset_free(ds);
    rows_free(&r);
}

Test(rt_data, conversions)
{
    double d[8] = {1.9, -1.9, 300.0, -5.0, NAN, 1e300, 0.0, 65.5};
    krt_array a = arr(KRT_F64, 2, (int64_t[]){8, 1}, d);
    krt_error err;
    krt_dataset *ds = krt_dataset_rows(&a, 1, 0, 8, &err);
    krt_cursor c = {0};
    int64_t got;
    uint8_t u8[8];
    int32_t i32[8];
    int64_t i64[8];
    float f32[8];
    cr_assert_eq(krt_dataset_next(ds, &c, 8, false, false, (void *[]){u8}, (krt_dtype[]){KRT_U8}, &got, &err), KRT_OK);
    cr_assert_arr_eq(u8, ((uint8_t[]){1, 0, 255, 0, 0, 255, 0, 65}), 8);
    cr_assert_eq(krt_dataset_next(ds, &c, 8, false, false, (void *[]){i32}, (krt_dtype[]){KRT_I32}, &got, &err), KRT_OK);
    cr_assert_arr_eq(i32, ((int32_t[]){1, -1, 300, -5, 0, INT32_MAX, 0, 65}), 32);
    cr_assert_eq(krt_dataset_next(ds, &c, 8, false, false, (void *[]){i64}, (krt_dtype[]){KRT_I64}, &got, &err), KRT_OK);
    cr_assert_arr_eq(i64, ((int64_t[]){1, -1, 300, -5, 0, INT64_MAX, 0, 65}), 64);
    cr_assert_eq(krt_dataset_next(ds, &c, 8, false, false, (void *[]){f32}, (krt_dtype[]){KRT_F32}, &got, &err), KRT_OK);
    cr_assert_eq(f32[0], 1.9f);
    cr_assert(isnan(f32[4]) && isinf(f32[5]) && f32[5] > 0);
    cr_assert_eq(krt_dataset_next(ds, &c, 8, false, false, (void *[]){u8}, (krt_dtype[]){KRT_BOOL}, &got, &err), KRT_OK);
    cr_assert_arr_eq(u8, ((uint8_t[]){1, 1, 1, 1, 1, 1, 0, 1}), 8);
    krt_dataset_free(ds);
    /* integers: u8 -> f32 (pixels), i32 -> u8 keeps the low bits, i32 -> i64 / f64 */
    int32_t iv[4] = {-1, 256, 257, 1 << 24};
    a = arr(KRT_I32, 1, (int64_t[]){4}, iv);
    ds = krt_dataset_rows(&a, 1, 0, 4, &err);
    double f64[4];
    cr_assert_eq(krt_dataset_next(ds, &c, 4, false, false, (void *[]){u8}, (krt_dtype[]){KRT_U8}, &got, &err), KRT_OK);
    cr_assert_arr_eq(u8, ((uint8_t[]){255, 0, 1, 0}), 4);
    cr_assert_eq(krt_dataset_next(ds, &c, 4, false, false, (void *[]){i64}, (krt_dtype[]){KRT_I64}, &got, &err), KRT_OK);
    cr_assert_arr_eq(i64, ((int64_t[]){-1, 256, 257, 1 << 24}), 32);
    cr_assert_eq(krt_dataset_next(ds, &c, 4, false, false, (void *[]){f64}, (krt_dtype[]){KRT_F64}, &got, &err), KRT_OK);
    cr_assert_arr_eq(f64, ((double[]){-1, 256, 257, 1 << 24}), 32);
    krt_dataset_free(ds);
    uint8_t px[3] = {0, 128, 255};
    a = arr(KRT_U8, 1, (int64_t[]){3}, px);
    ds = krt_dataset_rows(&a, 1, 0, 3, &err);
    cr_assert_eq(krt_dataset_next(ds, &c, 3, false, false, (void *[]){f32}, (krt_dtype[]){KRT_F32}, &got, &err), KRT_OK);
    cr_assert_arr_eq(f32, ((float[]){0, 128, 255}), 12);
    krt_dataset_free(ds);
}

Test(rt_data, windows)
{
    enum { N = 23, T = 4 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = 100 + i;
    krt_array s = arr(KRT_I32, 1, (int64_t[]){N}, tok);
    krt_error err;
    krt_dataset *ds = krt_dataset_windows(&s, T, 0, N, &err);
    cr_assert_not_null(ds, "%s", err.msg);
    cr_assert_eq(krt_dataset_size(ds), (N - 1) / T); /* 5 windows: the 23rd token is only a target */
    cr_assert_eq(krt_dataset_arity(ds), 2);
    int64_t in[3 * T], tg[3 * T], got;
    krt_cursor c = {0};
    const krt_dtype i64s[2] = {KRT_I64, KRT_I64};
    cr_assert_eq(krt_dataset_next(ds, &c, 3, false, false, (void *[]){in, tg}, i64s, &got, &err), KRT_OK, "%s", err.msg);
    for (int j = 0; j < 3 * T; j++) cr_assert(in[j] == 100 + j && tg[j] == 101 + j, "j %d: %lld %lld", j, (long long)in[j], (long long)tg[j]);
    cr_assert_eq(krt_dataset_next(ds, &c, 3, false, false, (void *[]){in, tg}, i64s, &got, &err), KRT_OK);
    cr_assert_eq(got, 2);
    cr_assert_eq(tg[2 * T - 1], 100 + 5 * T);
    /* Shuffled: every window once per epoch, each with its own targets. */
    bool seen[5] = {0};
    c = (krt_cursor){.seed = 5};
    for (int b = 0; b < 5; b++) {
        cr_assert_eq(krt_dataset_next(ds, &c, 1, true, false, (void *[]){in, tg}, i64s, &got, &err), KRT_OK);
        int w = (int)(in[0] - 100) / T;
        cr_assert_eq(in[0], 100 + w * T);
        cr_assert(!seen[w]);
        seen[w] = true;
        for (int j = 0; j < T; j++) cr_assert(in[j] == in[0] + j && tg[j] == in[j] + 1);
    }
    cr_assert_eq(c.epoch, 1);
    krt_dataset_free(ds);
    /* A sub-range (a validation split), u8 tokens converted to i32. */
    uint8_t b8[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    s = arr(KRT_U8, 1, (int64_t[]){10}, b8);
    ds = krt_dataset_windows(&s, 2, 4, 6, &err);
    cr_assert_not_null(ds, "%s", err.msg);
    cr_assert_eq(krt_dataset_size(ds), 2);
    int32_t i4[4], t4[4];
    c = (krt_cursor){0};
    cr_assert_eq(krt_dataset_next(ds, &c, 2, false, false, (void *[]){i4, t4}, (krt_dtype[]){KRT_I32, KRT_I32}, &got, &err),
                 KRT_OK);
    cr_assert_arr_eq(i4, ((int32_t[]){4, 5, 6, 7}), 16);
    cr_assert_arr_eq(t4, ((int32_t[]){5, 6, 7, 8}), 16);
    krt_dataset_free(ds);
    /* Too short: exactly T tokens is not enough, T + 1 is. */
    s = arr(KRT_I32, 1, (int64_t[]){N}, tok);
    cr_assert_null(krt_dataset_windows(&s, T, 0, T, &err));
    cr_assert_eq(err.code, KRT_EINVAL);
    cr_assert_str_eq(err.msg, "krt_dataset_windows: text of 4 tokens is shorter than one window of 4+1");
    ds = krt_dataset_windows(&s, T, 0, T + 1, &err);
    cr_assert_eq(krt_dataset_size(ds), 1);
    krt_dataset_free(ds);
    cr_assert_null(krt_dataset_windows(&s, 0, 0, N, &err));
    cr_assert_null(krt_dataset_windows(&s, T, 20, 10, &err));
    krt_array two = arr(KRT_I32, 2, (int64_t[]){1, N}, tok);
    cr_assert_null(krt_dataset_windows(&two, T, 0, N, &err));
    cr_assert(strstr(err.msg, "1-D"), "%s", err.msg);
}

/* ---- prefetch ---- */

Test(rt_data, prefetch_equals_direct_over_two_epochs)
{
    enum { N = 103, B = 10 };
    Rows r;
    rows_make(&r, N);
    krt_error err;
    for (int drop = 0; drop < 2; drop++) {
        krt_dataset *ds = krt_dataset_rows(r.a, 2, 0, N, &err), *ref = krt_dataset_rows(r.a, 2, 0, N, &err);
        krt_cursor start = {.seed = 77, .epoch = 3, .position = 4}, c = start, after;
        krt_prefetch *p = krt_prefetch_start(ds, start, B, true, drop, I32_U8, &err);
        cr_assert_not_null(p, "%s", err.msg);
        int32_t x[2 * B], xr[2 * B];
        uint8_t y[B], yr[B];
        int64_t got, gotr;
        while (c.epoch < 5 || (c.epoch == 5 && c.position < 4)) {
            cr_assert_eq(krt_prefetch_next(p, (void *[]){x, y}, &got, &after, &err), KRT_OK, "%s", err.msg);
            cr_assert_eq(krt_dataset_next(ref, &c, B, true, drop, (void *[]){xr, yr}, I32_U8, &gotr, &err), KRT_OK);
            cr_assert_eq(got, gotr);
            cr_assert(after.seed == c.seed && after.epoch == c.epoch && after.position == c.position);
            cr_assert_arr_eq(x, xr, (size_t)got * 2 * sizeof *x);
            cr_assert_arr_eq(y, yr, (size_t)got);
        }
        krt_prefetch_stop(p); /* with batches still queued */
        krt_dataset_free(ds);
        krt_dataset_free(ref);
    }
    rows_free(&r);
}

Test(rt_data, prefetch_stop_and_errors)
{
    /* Big rows so that a batch takes a moment: stop lands mid-production. */
    enum { N = 64, ROW = 1 << 16 };
    uint8_t *px = calloc(N, ROW);
    krt_array a = arr(KRT_U8, 2, (int64_t[]){N, ROW}, px);
    krt_error err;
    krt_dataset *ds = krt_dataset_rows(&a, 1, 0, N, &err);
    const krt_dtype f32[1] = {KRT_F32};
    for (int i = 0; i < 20; i++) {
        krt_prefetch *p = krt_prefetch_start(ds, (krt_cursor){.seed = (uint64_t)i}, 16, true, false, f32, &err);
        cr_assert_not_null(p, "%s", err.msg);
        if (i % 2) {
            float *buf = malloc(16 * (size_t)ROW * sizeof *buf);
            cr_assert_eq(krt_prefetch_next(p, (void *[]){buf}, NULL, NULL, &err), KRT_OK, "%s", err.msg);
            free(buf);
        }
        krt_prefetch_stop(p);
    }
    krt_prefetch_stop(NULL);
    /* Refused at start: what krt_dataset_next would refuse. */
    cr_assert_null(krt_prefetch_start(ds, (krt_cursor){0}, 0, false, false, f32, &err));
    cr_assert_eq(err.code, KRT_EINVAL);
    cr_assert_null(krt_prefetch_start(ds, (krt_cursor){0}, 65, false, true, f32, &err));
    cr_assert_null(krt_prefetch_start(ds, (krt_cursor){.position = 65}, 1, false, false, f32, &err));
    cr_assert_null(krt_prefetch_start(ds, (krt_cursor){0}, 1, false, false, (krt_dtype[]){KRT_BF16}, &err));
    cr_assert_null(krt_prefetch_start(NULL, (krt_cursor){0}, 1, false, false, f32, &err));
    /* An error in the thread reaches next, every time: the epoch counter cannot advance. */
    krt_prefetch *p = krt_prefetch_start(ds, (krt_cursor){.epoch = INT64_MAX, .position = N}, 1, false, false, f32, &err);
    cr_assert_not_null(p, "%s", err.msg);
    float *buf = malloc((size_t)ROW * sizeof *buf);
    for (int i = 0; i < 2; i++)
        EXPECT_ERR(krt_prefetch_next(p, (void *[]){buf}, NULL, NULL, &err), KRT_EINVAL, "epoch");
    krt_prefetch_stop(p);
    free(buf);
    krt_dataset_free(ds);
    free(px);
}
