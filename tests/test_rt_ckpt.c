/* test_rt_ckpt.c — safetensors checkpoints (runtime/ckpt.c): round trips of every dtype
 * and rank, the exact bytes the writer produces (what the Rust implementation writes for
 * the same tensors; checked once by hand against safetensors 0.8.0, which wrote identical
 * bytes), rejection of corrupted files with messages that say what is wrong,
 * and atomic replacement: a failed write leaves the previous file as it was and no
 * temporary file behind.
 *
 * Every test works in its own directory under /tmp, removed at the end. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "support.h"
#include "../runtime/kiln_rt.h"

/* ---- helpers ---- */

static char g_dir[64];

static const char *mkdir_tmp(void)
{
    strcpy(g_dir, "/tmp/kiln_ckpt_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp");
    return g_dir;
}

static const char *in_dir(const char *name)
{
    static char buf[4][600];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_dir, name);
    return buf[k];
}

static void rm_tmp(void)
{
    DIR *d = opendir(g_dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        const char *p = in_dir(e->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    closedir(d);
    rmdir(g_dir);
}

static bool contains(const unsigned char *hay, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; i + k <= n; i++)
        if (memcmp(hay + i, needle, k) == 0) return true;
    return false;
}

static void put_file(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static unsigned char *get_file(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot read %s", path);
    unsigned char *buf = malloc(1 << 20);
    *n = fread(buf, 1, 1 << 20, f);
    fclose(f);
    return buf;
}

/* A safetensors file from its header text (unpadded) and data. */
static void put_st(const char *path, const char *json, const void *data, size_t dlen)
{
    size_t h = strlen(json);
    unsigned char *buf = malloc(8 + h + dlen + 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(buf + 8, json, h);
    if (dlen) memcpy(buf + 8 + h, data, dlen);
    put_file(path, buf, 8 + h + dlen);
    free(buf);
}

#define T(nm, dt, rk, data, ...) ((krt_st_tensor){nm, dt, rk, {__VA_ARGS__}, data})

/* ---- round trips ---- */

Test(ckpt, round_trip_every_dtype_and_rank)
{
    mkdir_tmp();
    static const int64_t shapes[5][4] = {{0}, {3}, {2, 3}, {2, 1, 3}, {1, 2, 2, 3}};
    krt_st_tensor t[KRT_DTYPE_COUNT * 5 + 2];
    unsigned char *bufs[KRT_DTYPE_COUNT * 5 + 2];
    char names[KRT_DTYPE_COUNT * 5 + 2][32];
    int n = 0;
    for (int dt = 0; dt < KRT_DTYPE_COUNT; dt++)
        for (int rank = 0; rank <= 4; rank++, n++) {
            t[n] = (krt_st_tensor){names[n], (krt_dtype)dt, rank, {0}, NULL};
            int64_t count = 1;
            for (int d = 0; d < rank; d++) count *= (t[n].dims[d] = shapes[rank][d]);
            size_t bytes = (size_t)count * krt_dtype_size((krt_dtype)dt);
            bufs[n] = malloc(bytes);
            for (size_t i = 0; i < bytes; i++)
                bufs[n][i] = dt == KRT_BOOL ? (unsigned char)(i % 2) : (unsigned char)(i * 37 + (size_t)n);
            t[n].data = bufs[n];
            snprintf(names[n], sizeof names[n], "layer.%s.r%d", krt_dtype_name((krt_dtype)dt), rank);
        }
    t[n++] = T("empty", KRT_F32, 1, NULL, 0);
    t[n++] = T("empty.3d", KRT_I64, 3, NULL, 2, 0, 3);
    const krt_st_meta meta[3] = {{"format", "pt"}, {"kiln.step", "1234"}, {"odd \"key\"\\", "multi\nline \xc3\xa9"}};
    krt_error err = {0};
    const char *path = in_dir("all.safetensors");
    cr_assert_eq(krt_safetensors_write(path, t, n, meta, 3, &err), KRT_OK, "%s", err.msg);
    cr_expect_str_eq(support_listing(g_dir), "all.safetensors");

    krt_safetensors *st = NULL;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_safetensors_count(st), n);
    for (int i = 0; i < n; i++) {
        const krt_st_tensor *r = krt_safetensors_tensor(st, i);
        cr_assert(r);
        cr_expect_str_eq(r->name, t[i].name, "order kept");
        cr_expect_eq(r->dtype, t[i].dtype, "%s", t[i].name);
        cr_expect_eq(r->rank, t[i].rank, "%s", t[i].name);
        int64_t count = 1;
        for (int d = 0; d < t[i].rank; d++) {
            cr_expect_eq(r->dims[d], t[i].dims[d], "%s dim %d", t[i].name, d);
            count *= t[i].dims[d];
        }
        size_t bytes = (size_t)count * krt_dtype_size(t[i].dtype);
        cr_expect(bytes == 0 || memcmp(r->data, t[i].data, bytes) == 0, "%s: data differs", t[i].name);
        /* Offsets are contiguous in this order, so many are misaligned in the file; the
         * reader must still hand out aligned data. */
        cr_expect((uintptr_t)r->data % krt_dtype_size(r->dtype) == 0, "%s: misaligned data", t[i].name);
        cr_expect_eq(krt_safetensors_find(st, t[i].name), r);
    }
    cr_expect_null(krt_safetensors_tensor(st, -1));
    cr_expect_null(krt_safetensors_tensor(st, n));
    cr_expect_null(krt_safetensors_find(st, "missing"));
    cr_expect_null(krt_safetensors_find(st, NULL));
    cr_expect_str_eq(krt_safetensors_meta(st, "format"), "pt");
    cr_expect_str_eq(krt_safetensors_meta(st, "kiln.step"), "1234");
    cr_expect_str_eq(krt_safetensors_meta(st, "odd \"key\"\\"), "multi\nline \xc3\xa9");
    cr_expect_null(krt_safetensors_meta(st, "absent"));
    krt_safetensors_free(st);
    for (int i = 0; i < KRT_DTYPE_COUNT * 5; i++) free(bufs[i]);
    rm_tmp();
}

Test(ckpt, exact_byte_layout)
{
    mkdir_tmp();
    const float a[2] = {1.0f, 2.0f};
    const unsigned char b[3] = {1, 2, 3};
    krt_st_tensor t[2] = {T("a", KRT_F32, 1, a, 2), T("b", KRT_U8, 1, b, 3)};
    const krt_st_meta meta[1] = {{"format", "pt"}};
    krt_error err;
    const char *path = in_dir("small.safetensors");
    cr_assert_eq(krt_safetensors_write(path, t, 2, meta, 1, &err), KRT_OK, "%s", err.msg);
    /* 138 bytes of JSON + 6 spaces = 144 = 0x90; data: 1.0f 2.0f little-endian, 1 2 3. */
    static const char want[] = "\x90\0\0\0\0\0\0\0"
                               "{\"__metadata__\":{\"format\":\"pt\"},"
                               "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                               "\"b\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[8,11]}}      "
                               "\x00\x00\x80\x3f\x00\x00\x00\x40\x01\x02\x03";
    size_t n;
    unsigned char *got = get_file(path, &n);
    cr_assert_eq(n, sizeof want - 1);
    cr_expect(memcmp(got, want, n) == 0, "bytes differ:\n%.*s", (int)n - 8, (const char *)got + 8);
    free(got);

    /* No tensors, no metadata: "{}" padded to 8. */
    cr_assert_eq(krt_safetensors_write(path, NULL, 0, NULL, 0, &err), KRT_OK, "%s", err.msg);
    got = get_file(path, &n);
    cr_assert_eq(n, 16);
    cr_expect(memcmp(got, "\x08\0\0\0\0\0\0\0{}      ", 16) == 0);
    free(got);
    krt_safetensors *st;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_expect_eq(krt_safetensors_count(st), 0);
    krt_safetensors_free(st);
    rm_tmp();
}

/* Replaces the first occurrence of `from` in the file by `to` (same length). */
static void patch_file(const char *path, const char *from, const char *to)
{
    size_t n, k = strlen(from);
    cr_assert_eq(strlen(to), k);
    unsigned char *b = get_file(path, &n);
    size_t i = 0;
    while (i + k <= n && memcmp(b + i, from, k)) i++;
    cr_assert(i + k <= n, "%s: '%s' not found", path, from);
    memcpy(b + i, to, k);
    put_file(path, b, n);
    free(b);
}

/* Flips bits `mask` of the byte at `offset` from the end of the file. */
static void flip_from_end(const char *path, size_t offset, unsigned char mask)
{
    size_t n;
    unsigned char *b = get_file(path, &n);
    cr_assert(offset < n);
    b[n - 1 - offset] ^= mask;
    put_file(path, b, n);
    free(b);
}

static void expect_corrupt(const char *path, const char *want)
{
    krt_safetensors *st = (krt_safetensors *)1;
    krt_error err;
    krt_status rc = krt_safetensors_read(path, &st, &err);
    cr_expect_eq(rc, KRT_EFORMAT, "%s was read", path);
    cr_expect_null(st);
    cr_expect(strstr(err.msg, path) == err.msg && strstr(err.msg, want), "expected '%s', got: %s", want, err.msg);
    if (rc == KRT_OK) krt_safetensors_free(st);
}

Test(ckpt, checksums_are_written_and_verified)
{
    mkdir_tmp();
    const int32_t v[2] = {1, 2};
    const float w[2] = {1.0f, 2.0f};
    krt_st_tensor t[2] = {T("v", KRT_I32, 1, v, 2), T("w", KRT_F32, 1, w, 2)};
    const krt_st_meta meta[1] = {{"step", "5"}};
    krt_error err;
    const char *path = in_dir("c.safetensors"), *copy = in_dir("d.safetensors");
    cr_assert_eq(krt_safetensors_write_checked(path, t, 1, meta, 1, &err), KRT_OK, "%s", err.msg);
    /* zlib.crc32(struct.pack('<2i', 1, 2)) and zlib.crc32(b'step\0' b'5\0'), after the
     * caller's metadata. */
    size_t n;
    unsigned char *got = get_file(path, &n);
    cr_expect(contains(got, n, "{\"__metadata__\":{\"step\":\"5\",\"crc32:v\":\"0381177c\",\"crc32:__metadata__\":\"4883c008\"},\"v\":"),
              "header: %.*s", (int)n - 8, (const char *)got + 8);
    free(got);
    krt_safetensors *st;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_expect_eq(((const int32_t *)krt_safetensors_find(st, "v")->data)[1], 2);
    cr_assert_eq(krt_safetensors_meta_count(st), 3);
    cr_expect_str_eq(krt_safetensors_meta_entry(st, 1)->key, "crc32:v");
    cr_expect_null(krt_safetensors_meta_entry(st, 3));
    krt_safetensors_free(st);
    /* The metadata in another order (safetensors' Python writer keeps it in a hash map)
     * verifies the same. */
    put_st(copy, "{\"__metadata__\":{\"crc32:__metadata__\":\"4883c008\",\"crc32:v\":\"0381177c\",\"step\":\"5\"},"
                 "\"v\":{\"dtype\":\"I32\",\"shape\":[2],\"data_offsets\":[0,8]}}",
           v, sizeof v);
    cr_assert_eq(krt_safetensors_read(copy, &st, &err), KRT_OK, "%s", err.msg);
    krt_safetensors_free(st);

    /* Any flipped bit of the data: a low bit of an integer, an exponent bit of a float. */
    char cmd[1300];
    cr_assert_eq(krt_safetensors_write_checked(path, t, 2, meta, 1, &err), KRT_OK, "%s", err.msg);
    snprintf(cmd, sizeof cmd, "cp %s %s", path, copy);
    cr_assert_eq(system(cmd), 0);
    flip_from_end(copy, 0, 0x40); /* 2.0f = 00 00 00 40: its exponent */
    expect_corrupt(copy, "tensor 'w' does not match its checksum (CRC-32 ");
    cr_assert_eq(system(cmd), 0);
    flip_from_end(copy, 8 + 3, 0x01); /* v[1] = 2 becomes 3 */
    expect_corrupt(copy, "tensor 'v' does not match its checksum");
    /* Edited metadata, a checksum that is not one, a tensor without or a stray checksum. */
    cr_assert_eq(system(cmd), 0);
    patch_file(copy, "\"step\":\"5\"", "\"step\":\"6\"");
    expect_corrupt(copy, "the metadata does not match its checksum (CRC-32 ");
    cr_assert_eq(system(cmd), 0);
    patch_file(copy, "crc32:v\":\"0381177c", "crc32:v\":\"0381177g");
    expect_corrupt(copy, "__metadata__: the checksum 'crc32:v' is not 8 hexadecimal digits");
    cr_assert_eq(system(cmd), 0);
    patch_file(copy, "\"crc32:v\"", "\"crc32:x\"");
    expect_corrupt(copy, "__metadata__ has a checksum for tensor 'x', which the file does not hold");
    cr_assert_eq(system(cmd), 0);
    patch_file(copy, "\"crc32:v\"", "\"xrc32:v\"");
    expect_corrupt(copy, "tensor 'v' has no checksum, though the file has checksums");
    cr_assert_eq(system(cmd), 0);
    patch_file(copy, "\"crc32:__metadata__\"", "\"xrc32:__metadata__\"");
    expect_corrupt(copy, "the metadata has tensor checksums but no \"crc32:__metadata__\"");

    /* Without checksums (a file written elsewhere) a changed byte cannot be seen. */
    cr_assert_eq(krt_safetensors_write(path, t, 2, meta, 1, &err), KRT_OK, "%s", err.msg);
    flip_from_end(path, 0, 0x40);
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    krt_safetensors_free(st);
    /* The writer keeps the crc32: names for itself. */
    const krt_st_meta taken[1] = {{"crc32:v", "0"}};
    cr_expect_eq(krt_safetensors_write_checked(path, t, 1, taken, 1, &err), KRT_EINVAL);
    cr_expect(strstr(err.msg, "metadata key 'crc32:v' is reserved for checksums"), "%s", err.msg);
    rm_tmp();
}

Test(ckpt, names_are_escaped_as_serde_json_does)
{
    mkdir_tmp();
    /* quote, backslash, 'n', newline, 0x01, DEL, e-acute, tab, BS, FF, CR, 0x1f, emoji */
    const char *name = "q\"b\\n\nc\x01\x7f\xc3\xa9\t\b\f\r\x1f\xf0\x9f\x98\x80";
    const char *json = "\"q\\\"b\\\\n\\nc\\u0001\x7f\xc3\xa9\\t\\b\\f\\r\\u001f\xf0\x9f\x98\x80\"";
    const int32_t v = 7;
    krt_st_tensor t = T(name, KRT_I32, 0, &v, 0);
    krt_error err;
    const char *path = in_dir("esc.safetensors");
    cr_assert_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_OK, "%s", err.msg);
    size_t n;
    unsigned char *got = get_file(path, &n);
    cr_expect(contains(got, n, json), "header: %.*s", (int)n - 8, (const char *)got + 8);
    free(got);
    krt_safetensors *st;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_expect_str_eq(krt_safetensors_tensor(st, 0)->name, name);
    cr_expect_eq(*(const int32_t *)krt_safetensors_find(st, name)->data, 7);
    krt_safetensors_free(st);
    rm_tmp();
}

Test(ckpt, reads_files_written_by_others)
{
    /* Pretty-printed JSON, escapes the writer never emits (\/, \u of 1, 2 and 3 UTF-8
     * bytes, a surrogate pair), header order different from the data order, an F32 at an
     * odd offset, no padding. */
    mkdir_tmp();
    const char *json = "{\n  \"w\\/\\u00e9\\ud83d\\ude00\" : { \"shape\" : [ 2 ], \"dtype\" : \"F32\",\n"
                       "    \"data_offsets\" : [ 3, 11 ] },\n"
                       "  \"__metadata__\": {\"k\": \"v\\u0041\\u20AC\"},\n"
                       "  \"b\": {\"dtype\": \"BOOL\", \"shape\": [3], \"data_offsets\": [0, 3]}\n}\n \t";
    unsigned char data[11] = {1, 0, 1};
    const float w[2] = {-1.5f, 1e30f};
    memcpy(data + 3, w, 8);
    const char *path = in_dir("foreign.safetensors");
    put_st(path, json, data, sizeof data);
    krt_safetensors *st;
    krt_error err;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(krt_safetensors_count(st), 2);
    const krt_st_tensor *t = krt_safetensors_tensor(st, 0);
    cr_expect_str_eq(t->name, "w/\xc3\xa9\xf0\x9f\x98\x80");
    cr_expect_eq(t->dtype, KRT_F32);
    cr_expect((uintptr_t)t->data % 4 == 0);
    cr_expect(((const float *)t->data)[0] == -1.5f && ((const float *)t->data)[1] == 1e30f);
    cr_expect_str_eq(krt_safetensors_tensor(st, 1)->name, "b");
    cr_expect(memcmp(krt_safetensors_find(st, "b")->data, "\1\0\1", 3) == 0);
    cr_expect_str_eq(krt_safetensors_meta(st, "k"), "vA\xe2\x82\xac");
    krt_safetensors_free(st);
    rm_tmp();
}

/* ---- corrupted files ---- */

static void expect_refused(const char *path, krt_status code, const char *needle)
{
    krt_safetensors *st = (krt_safetensors *)1;
    krt_error err = {0};
    krt_status got = krt_safetensors_read(path, &st, &err);
    cr_expect_eq(got, code, "%s: got %s (%s)", needle, krt_status_name(got), err.msg);
    cr_expect_null(st, "%s: no result on failure", needle);
    cr_expect(strncmp(err.msg, path, strlen(path)) == 0, "message does not name the file: %s", err.msg);
    cr_expect(strstr(err.msg, needle), "message '%s' lacks '%s'", err.msg, needle);
    if (got == KRT_OK) krt_safetensors_free(st);
}

#define A8 "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"

Test(ckpt, rejects_corrupted_files)
{
    mkdir_tmp();
    const char *p = in_dir("bad.safetensors");
    static const unsigned char data[16] = {0};
    struct {
        const char *json; /* NULL: raw bytes below */
        size_t dlen;
        const char *needle;
    } cases[] = {
        {"{" A8 ",}", 8, "expected a string key"},
        {"{" A8, 8, "bad JSON in the header at byte 53: expected ',' or '}'"},
        {"{" A8 "} x", 8, "unexpected data after the JSON object"},
        {"[" A8 "]", 8, "does not start with '{'"},
        {"{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown dtype 'F33'"},
        {"{\"a\":{\"dtype\":\"I16\",\"shape\":[4],\"data_offsets\":[0,8]}}", 8, "dtype I16 is not supported"},
        {"{" A8 ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'a' [0, 8] and 'b' [4, 12] overlap"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 8,
         "truncated: header says 16 bytes of tensor data, file has 8"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "bytes 0..4 of the data belong to no tensor"},
        {"{" A8 "}", 12, "4 bytes after the last tensor belong to no tensor"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}", 8, "need 12 bytes, data_offsets [0, 8] hold 8"},
        {"{" A8 "," A8 "}", 8, "duplicate key 'a'"},
        {"{\"a\":{\"dtyp\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "unknown field 'dtyp'"},
        {"{\"a\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "missing \"dtype\""},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}}", 8, "shape must hold non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}}", 8, "shape must hold non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", 8, "non-negative integers"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[4611686018427387904,4],\"data_offsets\":[0,8]}}", 8, "impossibly large"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}}", 8, "rank 9"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,0]}}", 8, "end before they begin"},
        {"{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,8]}}", 8, "two non-negative integers"},
        {"{\"a\":5}", 0, "expected an object"},
        {"{\"a\":{\"dtype\":7,\"shape\":[2],\"data_offsets\":[0,8]}}", 8, "dtype is not a string"},
        {"{\"__metadata__\":{\"k\":1}," A8 "}", 8, "the value of 'k' is not a string"},
        {"{\"__metadata__\":[]," A8 "}", 8, "__metadata__ is not an object"},
        {"{\"a\xff\":1}", 0, "not valid UTF-8"},
        {"{\"a\xc0\x80\":1}", 0, "not valid UTF-8"}, /* overlong NUL */
        {"{\"\\ud800x\":1}", 0, "high surrogate without a low one"},
        {"{\"\\udc00\":1}", 0, "lone low surrogate"},
        {"{\"\\u12g4\":1}", 0, "four hex digits"},
        {"{\"\\q\":1}", 0, "invalid escape"},
        {"{\"a\\u0000b\":1}", 0, "\\u0000"},
        {"{\"a\nb\":1}", 0, "control character 0x0a"},
        {"{\"a", 0, "unterminated string"},
        {"{\"a\":tru}", 0, "invalid literal"},
        {"{\"a\":01}", 0, "expected ',' or '}'"},
        {"{\"a\":-}", 0, "invalid number"},
        {"{\"a\":1.}", 0, "digits expected after '.'"},
        {"{\"a\":1e}", 0, "digits expected in the exponent"},
        {"{\"a\" 1}", 0, "expected ':'"},
        {"{\"a\":[1 2]}", 0, "expected ',' or ']'"},
        {"{\"a\":@}", 0, "unexpected character '@'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        put_st(p, cases[i].json, data, cases[i].dlen);
        expect_refused(p, KRT_EFORMAT, cases[i].needle);
    }

    /* Deep nesting is refused, not a stack overflow. */
    char deep[4200] = "{\"__metadata__\":";
    for (int i = 0; i < 2000; i++) strcat(deep, "[");
    put_st(p, deep, NULL, 0);
    expect_refused(p, KRT_EFORMAT, "nested more than 64 levels deep");

    /* Broken header lengths. */
    put_file(p, "", 0);
    expect_refused(p, KRT_EFORMAT, "too short");
    put_file(p, "\x05\0\0", 3);
    expect_refused(p, KRT_EFORMAT, "too short");
    put_file(p, "model.safetensors is not text", 29);
    expect_refused(p, KRT_EFORMAT, "not a safetensors file (header length 7022007287093161837 is larger than the file)");
    put_file(p, "\x01\0\0\0\0\0\0\0{}", 10);
    expect_refused(p, KRT_EFORMAT, "header length 1 is too small");
    put_file(p, "\0\0\0\0\0\0\0\0{}", 10);
    expect_refused(p, KRT_EFORMAT, "header length 0 is too small");
    put_file(p, "\x40\0\0\0\0\0\0\0{\"a\":", 13);
    expect_refused(p, KRT_EFORMAT, "truncated: the header is 64 bytes long, the file has only 5");
    /* Over the 100 MB limit, yet within the (sparse) file. */
    FILE *f = fopen(p, "wb");
    cr_assert(f);
    fwrite("\x01\xe1\xf5\x05\0\0\0\0{", 1, 9, f); /* 100000001 */
    cr_assert_eq(fseek(f, 100000020, SEEK_SET), 0);
    fputc(' ', f);
    fclose(f);
    expect_refused(p, KRT_EFORMAT, "exceeds the limit of 100000000 bytes");

    /* Not files at all. */
    expect_refused(in_dir("absent.safetensors"), KRT_EIO, "No such file");
    expect_refused(g_dir, KRT_EIO, "not a regular file");
    krt_error err;
    cr_expect_eq(krt_safetensors_read(p, NULL, &err), KRT_EINVAL);
    rm_tmp();
}

/* A valid small file cut at every length, and with every byte replaced by a few
 * values: nothing crashes (ASan watches), every cut file is refused. */
Test(ckpt, truncations_and_mutations)
{
    mkdir_tmp();
    const double x[3] = {1, 2, 3};
    const int64_t y[1] = {-1};
    krt_st_tensor t[2] = {T("x", KRT_F64, 2, x, 1, 3), T("y", KRT_I64, 0, y, 0)};
    const krt_st_meta meta[1] = {{"m", "v"}};
    const char *good = in_dir("good.safetensors"), *p = in_dir("cut.safetensors");
    krt_error err;
    cr_assert_eq(krt_safetensors_write(good, t, 2, meta, 1, &err), KRT_OK, "%s", err.msg);
    size_t n;
    unsigned char *bytes = get_file(good, &n);
    for (size_t len = 0; len < n; len++) {
        put_file(p, bytes, len);
        krt_safetensors *st = NULL;
        krt_status s = krt_safetensors_read(p, &st, &err);
        cr_expect_eq(s, KRT_EFORMAT, "cut at %zu: %s", len, krt_status_name(s));
        cr_expect_null(st);
    }
    static const unsigned char subst[] = {0x00, 0xff, '"', '{', '9', ' ', '\\', 0x80};
    int accepted = 0;
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < sizeof subst; k++) {
            unsigned char saved = bytes[i];
            bytes[i] = subst[k];
            put_file(p, bytes, n);
            bytes[i] = saved;
            krt_safetensors *st = NULL;
            krt_status s = krt_safetensors_read(p, &st, &err);
            cr_expect(s == KRT_OK || s == KRT_EFORMAT, "byte %zu = %#x: %s", i, subst[k], krt_status_name(s));
            if (s == KRT_OK) {
                accepted++;
                for (int j = 0; j < krt_safetensors_count(st); j++) cr_expect(krt_safetensors_tensor(st, j)->name);
                krt_safetensors_free(st);
            }
        }
    cr_expect(accepted > 0, "changes to the data section stay readable");
    free(bytes);
    rm_tmp();
}

/* ---- writing: arguments and atomicity ---- */

static const unsigned char OLD[] = "previous checkpoint";

static void expect_old_intact(const char *path)
{
    size_t n;
    unsigned char *got = get_file(path, &n);
    cr_expect(n == sizeof OLD && memcmp(got, OLD, n) == 0, "the previous file was changed");
    free(got);
}

Test(ckpt, write_rejects_bad_arguments)
{
    mkdir_tmp();
    const char *path = in_dir("m.safetensors");
    put_file(path, OLD, sizeof OLD);
    const float v[4] = {0};
    struct {
        krt_st_tensor t[2];
        int n;
        const char *needle;
    } cases[] = {
        {{T("a", (krt_dtype)42, 1, v, 1)}, 1, "invalid dtype 42"},
        {{T("a", KRT_F32, 1, v, -1)}, 1, "negative dimension -1"},
        {{T("a", KRT_F32, 9, v, 1)}, 1, "invalid rank 9"},
        {{T(NULL, KRT_F32, 1, v, 1)}, 1, "tensor 0 has no name"},
        {{T("__metadata__", KRT_F32, 1, v, 1)}, 1, "reserved"},
        {{T("a", KRT_F32, 1, v, 1), T("a", KRT_F32, 1, v, 1)}, 2, "two tensors are named 'a'"},
        {{T("a", KRT_F32, 1, NULL, 2)}, 1, "'a' has no data"},
        {{T("bad\xff", KRT_F32, 1, v, 1)}, 1, "not valid UTF-8"},
        {{T("huge", KRT_F64, 3, v, 1 << 30, 1 << 30, 1 << 30)}, 1, "too large"},
    };
    krt_error err;
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        err.msg[0] = 0;
        cr_expect_eq(krt_safetensors_write(path, cases[i].t, cases[i].n, NULL, 0, &err), KRT_EINVAL, "case %zu", i);
        cr_expect(strstr(err.msg, cases[i].needle), "message '%s' lacks '%s'", err.msg, cases[i].needle);
    }
    krt_st_tensor ok = T("a", KRT_F32, 1, v, 4);
    const krt_st_meta dup[2] = {{"k", "1"}, {"k", "2"}}, null_value[1] = {{"k", NULL}};
    cr_expect_eq(krt_safetensors_write(path, &ok, 1, dup, 2, &err), KRT_EINVAL);
    cr_expect(strstr(err.msg, "metadata key 'k' appears twice"), "%s", err.msg);
    cr_expect_eq(krt_safetensors_write(path, &ok, 1, null_value, 1, &err), KRT_EINVAL);
    cr_expect_eq(krt_safetensors_write(path, NULL, 1, NULL, 0, &err), KRT_EINVAL);
    cr_expect_eq(krt_safetensors_write(NULL, &ok, 1, NULL, 0, &err), KRT_EINVAL);
    cr_expect_eq(krt_safetensors_write(path, &ok, -1, NULL, 0, &err), KRT_EINVAL);
    expect_old_intact(path);
    cr_expect_str_eq(support_listing(g_dir), "m.safetensors");
    rm_tmp();
}

Test(ckpt, write_replaces_the_previous_file)
{
    mkdir_tmp();
    const char *path = in_dir("m.safetensors");
    put_file(path, OLD, sizeof OLD);
    const int32_t v1[2] = {1, 2}, v2[3] = {3, 4, 5};
    krt_st_tensor t = T("v", KRT_I32, 1, v1, 2);
    krt_error err;
    cr_assert_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_OK, "%s", err.msg);
    t = T("v", KRT_I32, 1, v2, 3);
    cr_assert_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_OK, "%s", err.msg);
    krt_safetensors *st;
    cr_assert_eq(krt_safetensors_read(path, &st, &err), KRT_OK, "%s", err.msg);
    cr_expect_eq(krt_safetensors_find(st, "v")->dims[0], 3);
    cr_expect(memcmp(krt_safetensors_find(st, "v")->data, v2, sizeof v2) == 0);
    krt_safetensors_free(st);
    cr_expect_str_eq(support_listing(g_dir), "m.safetensors");
    /* A bare file name is written in the current directory (and that directory synced). */
    char cwd[512];
    cr_assert(getcwd(cwd, sizeof cwd));
    cr_assert_eq(chdir(g_dir), 0);
    cr_expect_eq(krt_safetensors_write("bare.safetensors", &t, 1, NULL, 0, &err), KRT_OK, "%s", err.msg);
    cr_assert_eq(chdir(cwd), 0);
    cr_expect_str_eq(support_listing(g_dir), "bare.safetensors|m.safetensors");
    rm_tmp();
}

Test(ckpt, write_failure_missing_directory)
{
    mkdir_tmp();
    const char *path = in_dir("no/such/dir/m.safetensors");
    const float v[1] = {1};
    krt_st_tensor t = T("v", KRT_F32, 1, v, 1);
    krt_error err;
    cr_expect_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_EIO);
    cr_expect(strstr(err.msg, path) == err.msg && strstr(err.msg, "No such file or directory"), "%s", err.msg);
    cr_expect_str_eq(support_listing(g_dir), "");
    rm_tmp();
}

Test(ckpt, write_failure_at_rename_removes_the_temporary)
{
    /* The destination is a directory: everything is written, then rename fails. */
    mkdir_tmp();
    const char *path = in_dir("m.safetensors");
    cr_assert_eq(mkdir(path, 0755), 0);
    const float v[1] = {1};
    krt_st_tensor t = T("v", KRT_F32, 1, v, 1);
    krt_error err;
    cr_expect_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_EIO);
    cr_expect(strstr(err.msg, "cannot replace it"), "%s", err.msg);
    cr_expect_str_eq(support_listing(g_dir), "m.safetensors");
    struct stat sb;
    cr_expect(stat(path, &sb) == 0 && S_ISDIR(sb.st_mode));
    rm_tmp();
}

Test(ckpt, write_failure_mid_file_keeps_the_old_one)
{
    /* A file-size limit makes write() fail part way, as a full disk would (even as root). */
    mkdir_tmp();
    const char *path = in_dir("m.safetensors");
    put_file(path, OLD, sizeof OLD);
    size_t count = 1 << 16;
    float *big = calloc(count, sizeof *big);
    krt_st_tensor t = T("big", KRT_F32, 1, big, (int64_t)count);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {100000, 100000};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    krt_error err;
    cr_expect_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_EIO);
    cr_expect(strstr(err.msg, "writing failed: File too large"), "%s", err.msg);
    expect_old_intact(path);
    cr_expect_str_eq(support_listing(g_dir), "m.safetensors");
    free(big);
    rm_tmp();
}

Test(ckpt, write_failure_read_only_directory)
{
    if (geteuid() == 0) cr_skip_test("root ignores directory permissions");
    mkdir_tmp();
    const char *path = in_dir("m.safetensors");
    put_file(path, OLD, sizeof OLD);
    cr_assert_eq(chmod(g_dir, 0555), 0);
    const float v[1] = {1};
    krt_st_tensor t = T("v", KRT_F32, 1, v, 1);
    krt_error err;
    cr_expect_eq(krt_safetensors_write(path, &t, 1, NULL, 0, &err), KRT_EIO);
    cr_expect(strstr(err.msg, "Permission denied"), "%s", err.msg);
    chmod(g_dir, 0755);
    expect_old_intact(path);
    cr_expect_str_eq(support_listing(g_dir), "m.safetensors");
    rm_tmp();
}
