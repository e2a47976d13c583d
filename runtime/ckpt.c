/* ckpt.c — checkpoints in the safetensors format (https://github.com/huggingface/safetensors),
 * so that a Kiln model's weights load directly in PyTorch/transformers and back.
 *
 * Layout: u64 little-endian N, then N bytes of UTF-8 JSON, then the tensor data. The JSON
 * maps "__metadata__" to an object of strings and each tensor name to
 * {"dtype":"F32","shape":[2,3],"data_offsets":[begin,end]}, offsets relative to the data.
 *
 * Writing produces the bytes the reference (Rust) implementation would for the same
 * tensors in the same order: compact JSON as serde_json prints it (same string escapes),
 * "__metadata__" first and only when there is metadata, offsets contiguous from 0 in the
 * order given, header padded with spaces to a multiple of 8. The file is replaced
 * atomically (temporary file beside it, fsync, rename, fsync of the directory) so that a
 * crash or a full disk never leaves a half-written checkpoint in place of a good one.
 *
 * Reading loads the whole file and validates everything before handing out a tensor:
 * header length, UTF-8, JSON syntax (a small recursive-descent parser with a nesting
 * limit, \uXXXX escapes and surrogate pairs, duplicate keys rejected), dtypes, shapes
 * against byte sizes, and data offsets that cover the data exactly, without gaps or
 * overlaps. We are stricter than the Rust reader in one respect: a tensor entry may hold
 * only dtype, shape and data_offsets (the spec's fields), so a typo is not silently ignored.
 *
 * Tensor data points into the loaded file, which is placed in memory so that the data
 * section is 16-byte aligned; a tensor whose offset is not a multiple of its element
 * size (possible: offsets are contiguous in the writer's order) is copied to an aligned
 * block instead, so callers may always read the data as the dtype's C type. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt_internal.h"

#define MAX_HEADER 100000000u   /* the Rust reader's limit on N */
#define MAX_DEPTH 64            /* JSON nesting; the format itself needs 3 */
#define MAX_VALUES (1 << 22)    /* JSON values in a header (~1M for a 100k-tensor model) */

/* A name for a message: quoted, control characters escaped, long names shortened, so
 * that a hostile or binary name cannot garble the message. */
static const char *quote(char buf[100], const char *s)
{
    size_t o = 0;
    buf[o++] = '\'';
    for (; *s && o < 90; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, 100 - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (*s) o += (size_t)snprintf(buf + o, 100 - o, "...");
    buf[o++] = '\'';
    buf[o] = 0;
    return buf;
}

static const char *const st_dtype[KRT_DTYPE_COUNT] = {"BOOL", "U8", "I32", "I64", "F16", "BF16", "F32", "F64"};
/* Other dtypes of the format, named in messages as unsupported rather than unknown. */
static const char *const st_other[] = {"I8", "I16", "U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                       "F6_E2M3", "F6_E3M2", "F4", "C64"};

/* Index of the first byte that is not part of valid UTF-8 (overlong forms, surrogates
 * and code points above U+10FFFF are invalid), or n. */
static size_t utf8_check(const unsigned char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i], cp, min;
        size_t len;
        if (c < 0x80) {
            i++;
            continue;
        }
        if ((c & 0xE0) == 0xC0) len = 2, cp = c & 0x1F, min = 0x80;
        else if ((c & 0xF0) == 0xE0) len = 3, cp = c & 0x0F, min = 0x800;
        else if ((c & 0xF8) == 0xF0) len = 4, cp = c & 0x07, min = 0x10000;
        else return i;
        if (n - i < len) return i;
        for (size_t k = 1; k < len; k++) {
            if ((s[i + k] & 0xC0) != 0x80) return i;
            cp = cp << 6 | (s[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return i;
        i += len;
    }
    return n;
}

static bool utf8_ok(const char *s)
{
    size_t n = strlen(s);
    return utf8_check((const unsigned char *)s, n) == n;
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The first duplicate among n strings, NULL if none; sorts s (O(n log n)). */
static const char *find_duplicate(const char **s, int n)
{
    if (n < 2) return NULL;
    qsort(s, (size_t)n, sizeof *s, cmp_str);
    for (int i = 1; i < n; i++)
        if (strcmp(s[i - 1], s[i]) == 0) return s[i];
    return NULL;
}

/* ================================ writing ================================ */

typedef struct {
    char *p;
    size_t len, cap;
    bool oom;
} sbuf;

static void sb_add(sbuf *b, const char *s, size_t n)
{
    if (!b->oom && b->len + n + 1 > b->cap) {
        size_t cap = n < SIZE_MAX / 4 - b->len ? 2 * (b->len + n) + 256 : 0;
        char *p = cap ? realloc(b->p, cap) : NULL;
        b->oom = !p;
        if (p) b->p = p, b->cap = cap;
    }
    if (b->oom) return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

static void sb_u64(sbuf *b, uint64_t v)
{
    char tmp[24];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    sb_add(b, tmp, (size_t)n);
}

/* A JSON string exactly as serde_json writes it: \" \\ \b \f \n \r \t, \u00xx (lowercase
 * hex) for the other control characters, every other byte (UTF-8 included) as is. */
static void sb_json_string(sbuf *b, const char *s)
{
    sb_add(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        sb_add(b, run, (size_t)(s - run));
        run = s + 1;
        char esc[8];
        switch (c) {
        case '"': sb_add(b, "\\\"", 2); break;
        case '\\': sb_add(b, "\\\\", 2); break;
        case '\b': sb_add(b, "\\b", 2); break;
        case '\f': sb_add(b, "\\f", 2); break;
        case '\n': sb_add(b, "\\n", 2); break;
        case '\r': sb_add(b, "\\r", 2); break;
        case '\t': sb_add(b, "\\t", 2); break;
        default:
            snprintf(esc, sizeof esc, "\\u%04x", c);
            sb_add(b, esc, 6);
        }
    }
    sb_add(b, run, (size_t)(s - run));
    sb_add(b, "\"", 1);
}

/* Checks the arguments and computes each tensor's byte size; nothing is written unless
 * all of them are valid. */
static krt_status check_write_args(const char *path, const krt_st_tensor *t, int n, const krt_st_meta *meta, int nmeta,
                                   uint64_t *sizes, krt_error *err)
{
    char q[100];
    uint64_t total = 0;
    for (int i = 0; i < n; i++) {
        const krt_st_tensor *x = &t[i];
        if (!x->name) return krt_fail(err, KRT_EINVAL, "%s: tensor %d has no name", path, i);
        if (!utf8_ok(x->name))
            return krt_fail(err, KRT_EINVAL, "%s: tensor %d: name %s is not valid UTF-8", path, i, quote(q, x->name));
        if (strcmp(x->name, "__metadata__") == 0)
            return krt_fail(err, KRT_EINVAL, "%s: tensor %d: the name \"__metadata__\" is reserved for metadata", path, i);
        if ((unsigned)x->dtype >= KRT_DTYPE_COUNT)
            return krt_fail(err, KRT_EINVAL, "%s: tensor %s: invalid dtype %d", path, quote(q, x->name), (int)x->dtype);
        if (x->rank < 0 || x->rank > KRT_MAX_RANK)
            return krt_fail(err, KRT_EINVAL, "%s: tensor %s: invalid rank %d", path, quote(q, x->name), x->rank);
        uint64_t bytes = krt_dtype_size(x->dtype);
        for (int d = 0; d < x->rank; d++) {
            if (x->dims[d] < 0)
                return krt_fail(err, KRT_EINVAL, "%s: tensor %s: negative dimension %lld", path, quote(q, x->name),
                            (long long)x->dims[d]);
            uint64_t dim = (uint64_t)x->dims[d];
            if (dim != 0 && bytes > UINT64_MAX / dim)
                return krt_fail(err, KRT_EINVAL, "%s: tensor %s: too large", path, quote(q, x->name));
            bytes *= dim;
        }
        if (bytes > UINT64_MAX - total || bytes > (uint64_t)SIZE_MAX)
            return krt_fail(err, KRT_EINVAL, "%s: tensor %s: the tensors are too large", path, quote(q, x->name));
        total += bytes;
        if (bytes > 0 && !x->data) return krt_fail(err, KRT_EINVAL, "%s: tensor %s has no data", path, quote(q, x->name));
        sizes[i] = bytes;
    }
    for (int i = 0; i < nmeta; i++) {
        if (!meta[i].key || !meta[i].value) return krt_fail(err, KRT_EINVAL, "%s: metadata entry %d is NULL", path, i);
        if (!utf8_ok(meta[i].key) || !utf8_ok(meta[i].value))
            return krt_fail(err, KRT_EINVAL, "%s: metadata %s is not valid UTF-8", path,
                        quote(q, utf8_ok(meta[i].key) ? meta[i].value : meta[i].key));
    }
    /* Duplicates would make a file every reader refuses. */
    const char **names = malloc(((size_t)(n > nmeta ? n : nmeta) + 1) * sizeof *names);
    if (!names) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    const char *dup = find_duplicate(names, n);
    krt_status st = dup ? krt_fail(err, KRT_EINVAL, "%s: two tensors are named %s", path, quote(q, dup)) : KRT_OK;
    for (int i = 0; i < nmeta; i++) names[i] = meta[i].key;
    if (!dup && (dup = find_duplicate(names, nmeta)))
        st = krt_fail(err, KRT_EINVAL, "%s: metadata key %s appears twice", path, quote(q, dup));
    free(names);
    return st;
}

static int write_all(int fd, const void *data, size_t len)
{
    const char *p = data;
    while (len > 0) {
        size_t chunk = len < ((size_t)1 << 30) ? len : (size_t)1 << 30;
        ssize_t w = write(fd, p, chunk);
        if (w < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (w == 0) return EIO;
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

/* Makes the rename durable: without it a crash can bring back the old directory entry. */
static krt_status sync_dir(const char *path, krt_error *err)
{
    const char *slash = strrchr(path, '/');
    char *dir = slash ? malloc((size_t)(slash - path) + 2) : NULL;
    if (slash && !dir) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    if (dir) {
        size_t len = slash == path ? 1 : (size_t)(slash - path);
        memcpy(dir, path, len);
        dir[len] = 0;
    }
    int fd = open(dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = fd < 0 ? errno : (fsync(fd) < 0 ? errno : 0);
    if (fd >= 0) close(fd);
    free(dir);
    /* Some file systems cannot sync a directory (EINVAL); nothing more can be done there. */
    if (e && e != EINVAL && e != EROFS)
        return krt_fail_errno(err, e, path, "written, but syncing its directory failed (the new file may not survive a crash)");
    return KRT_OK;
}

static krt_status write_atomic(const char *path, const char *header, size_t hlen, const krt_st_tensor *t, const uint64_t *sizes,
                               int n, krt_error *err)
{
    static atomic_uint counter;
    size_t tlen = strlen(path) + 48;
    char *tmp = malloc(tlen);
    if (!tmp) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    int fd = -1;
    for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
        snprintf(tmp, tlen, "%s.tmp-%ld-%u", path, (long)getpid(), atomic_fetch_add(&counter, 1u));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST && errno != EINTR) break;
    }
    if (fd < 0) {
        krt_status st = krt_fail_errno(err, errno, path, "cannot create a temporary file beside it");
        free(tmp);
        return st;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)((uint64_t)hlen >> (8 * i));
    int e = write_all(fd, len8, 8);
    if (!e) e = write_all(fd, header, hlen);
    for (int i = 0; i < n && !e; i++)
        if (sizes[i]) e = write_all(fd, t[i].data, (size_t)sizes[i]);
    const char *what = "writing failed";
    if (!e && fsync(fd) < 0) e = errno, what = "syncing failed";
    /* close can report a deferred write error (NFS), so it is checked too. */
    if (close(fd) < 0 && !e) e = errno, what = "closing failed";
    if (!e && rename(tmp, path) < 0) e = errno, what = "cannot replace it";
    if (e) {
        unlink(tmp);
        free(tmp);
        return krt_fail_errno(err, e, path, what);
    }
    free(tmp);
    return sync_dir(path, err);
}

/* Checksums (docs/formats.md, "Checkpoint files"): metadata "crc32:NAME" holds the CRC-32
 * (zlib's, as Python's zlib.crc32) of tensor NAME's bytes, as 8 lowercase hex digits;
 * "crc32:__metadata__" that of the other metadata entries, sorted bytewise by key, each
 * as key, NUL, value, NUL. */
#define CRC_PREFIX "crc32:"
#define CRC_META CRC_PREFIX "__metadata__"

static bool is_crc_key(const char *key) { return strncmp(key, CRC_PREFIX, sizeof CRC_PREFIX - 1) == 0; }

static uint32_t crc_bytes(uint32_t crc, const void *data, size_t n)
{
    return n ? (uint32_t)crc32_z(crc, (const Bytef *)data, n) : crc; /* zlib: a NULL buffer resets */
}

static int cmp_meta_key(const void *a, const void *b)
{
    return strcmp(((const krt_st_meta *)a)->key, ((const krt_st_meta *)b)->key);
}

/* The checksum of the entries of meta that are not checksums; false when out of memory. */
static bool meta_crc(const krt_st_meta *meta, int nmeta, uint32_t *out)
{
    krt_st_meta *sorted = malloc(((size_t)nmeta + 1) * sizeof *sorted);
    if (!sorted) return false;
    int n = 0;
    for (int i = 0; i < nmeta; i++)
        if (!is_crc_key(meta[i].key)) sorted[n++] = meta[i];
    qsort(sorted, (size_t)n, sizeof *sorted, cmp_meta_key);
    uint32_t crc = crc_bytes(0, NULL, 0);
    for (int i = 0; i < n; i++) {
        crc = crc_bytes(crc, sorted[i].key, strlen(sorted[i].key) + 1);
        crc = crc_bytes(crc, sorted[i].value, strlen(sorted[i].value) + 1);
    }
    free(sorted);
    *out = crc;
    return true;
}

/* Writes the file; with `checked`, the checksums are added to the metadata. */
static krt_status write_file(const char *path, const krt_st_tensor *tensors, int n, const krt_st_meta *user_meta, int nuser,
                             bool checked, krt_error *err)
{
    if (!path || !*path) return krt_fail(err, KRT_EINVAL, "safetensors: no file name");
    if (n < 0 || nuser < 0 || (n > 0 && !tensors) || (nuser > 0 && !user_meta) || (checked && n > INT_MAX - 1 - nuser))
        return krt_fail(err, KRT_EINVAL, "%s: invalid tensor or metadata list", path);
    uint64_t *sizes = malloc(((size_t)n + 1) * sizeof *sizes);
    if (!sizes) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    krt_status st = check_write_args(path, tensors, n, user_meta, nuser, sizes, err);
    const krt_st_meta *meta = user_meta;
    int nmeta = nuser;
    krt_st_meta *all = NULL;
    char *hex = NULL, **keys = NULL;
    if (st == KRT_OK && checked) {
        char q[100];
        for (int i = 0; i < nuser && st == KRT_OK; i++)
            if (is_crc_key(user_meta[i].key))
                st = krt_fail(err, KRT_EINVAL, "%s: metadata key %s is reserved for checksums", path, quote(q, user_meta[i].key));
        all = malloc(((size_t)nuser + (size_t)n + 1) * sizeof *all);
        hex = malloc(((size_t)n + 1) * 9);
        keys = calloc((size_t)n + 1, sizeof *keys);
        if (st == KRT_OK && (!all || !hex || !keys)) st = krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
        for (int i = 0; i < nuser && st == KRT_OK; i++) all[i] = user_meta[i];
        uint32_t mcrc = 0;
        if (st == KRT_OK && !meta_crc(user_meta, nuser, &mcrc)) st = krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
        for (int i = 0; i <= n && st == KRT_OK; i++) {
            const char *name = i < n ? tensors[i].name : "__metadata__";
            size_t len = sizeof CRC_PREFIX + strlen(name);
            if (!(keys[i] = malloc(len))) {
                st = krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
                break;
            }
            snprintf(keys[i], len, "%s%s", CRC_PREFIX, name);
            uint32_t crc = i < n ? crc_bytes(crc_bytes(0, NULL, 0), tensors[i].data, (size_t)sizes[i]) : mcrc;
            snprintf(hex + 9 * i, 9, "%08x", (unsigned)crc);
            all[nuser + i] = (krt_st_meta){keys[i], hex + 9 * i};
        }
        meta = all;
        nmeta = nuser + n + 1;
    }
    sbuf h = {0};
    if (st == KRT_OK) {
        sb_add(&h, "{", 1);
        if (nmeta > 0) {
            sb_str(&h, "\"__metadata__\":{");
            for (int i = 0; i < nmeta; i++) {
                if (i) sb_add(&h, ",", 1);
                sb_json_string(&h, meta[i].key);
                sb_add(&h, ":", 1);
                sb_json_string(&h, meta[i].value);
            }
            sb_add(&h, "}", 1);
        }
        uint64_t offset = 0;
        for (int i = 0; i < n; i++) {
            const krt_st_tensor *x = &tensors[i];
            if (i || nmeta > 0) sb_add(&h, ",", 1);
            sb_json_string(&h, x->name);
            sb_str(&h, ":{\"dtype\":\"");
            sb_str(&h, st_dtype[x->dtype]);
            sb_str(&h, "\",\"shape\":[");
            for (int d = 0; d < x->rank; d++) {
                if (d) sb_add(&h, ",", 1);
                sb_u64(&h, (uint64_t)x->dims[d]);
            }
            sb_str(&h, "],\"data_offsets\":[");
            sb_u64(&h, offset);
            sb_add(&h, ",", 1);
            offset += sizes[i];
            sb_u64(&h, offset);
            sb_str(&h, "]}");
        }
        sb_add(&h, "}", 1);
        while (!h.oom && h.len % 8) sb_add(&h, " ", 1); /* as the Rust writer: data 8-aligned */
        if (h.oom) st = krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
        else st = write_atomic(path, h.p, h.len, tensors, sizes, n, err);
    }
    free(h.p);
    free(sizes);
    for (int i = 0; keys && i <= n; i++) free(keys[i]);
    free(keys);
    free(hex);
    free(all);
    return st;
}

krt_status krt_safetensors_write(const char *path, const krt_st_tensor *tensors, int n, const krt_st_meta *meta, int nmeta,
                                 krt_error *err)
{
    return write_file(path, tensors, n, meta, nmeta, false, err);
}

krt_status krt_safetensors_write_checked(const char *path, const krt_st_tensor *tensors, int n, const krt_st_meta *meta, int nmeta,
                                         krt_error *err)
{
    return write_file(path, tensors, n, meta, nmeta, true, err);
}

/* ================================ reading ================================ */

/* The JSON tree: nodes in one array, linked by index (first child, next sibling), so
 * that it costs one allocation that grows. Strings are decoded in place in the header
 * (a decoded string is never longer than its source), so names and metadata need no
 * copies: they live in the loaded file's buffer. */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };

typedef struct {
    int kind;
    bool uint_ok;    /* J_NUM: a non-negative integer that fits in 64 bits, in u */
    int n;           /* J_ARR, J_OBJ: children */
    int first, next; /* first child; next sibling (-1: none) */
    uint64_t u;
    const char *s;   /* J_STR */
    const char *key; /* the key of an object's member */
} jv;

typedef struct {
    unsigned char *t; /* the header */
    size_t n, i;
    jv *v;
    int nv, cap;
    bool oom;
    char msg[160]; /* the first error */
    size_t at;     /* where it was found */
} jparser;

static void *jerr(jparser *p, const char *fmt, ...)
{
    if (!p->msg[0]) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(p->msg, sizeof p->msg, fmt, ap);
        va_end(ap);
        p->at = p->i;
    }
    return NULL;
}

static int jfail(jparser *p, const char *msg)
{
    jerr(p, "%s", msg);
    return -1;
}

static void skip_ws(jparser *p)
{
    while (p->i < p->n && (p->t[p->i] == ' ' || p->t[p->i] == '\t' || p->t[p->i] == '\n' || p->t[p->i] == '\r')) p->i++;
}

static bool at_char(jparser *p, char c) { return p->i < p->n && p->t[p->i] == (unsigned char)c; }

static int hex4(const unsigned char *s)
{
    int v = 0;
    for (int k = 0; k < 4; k++) {
        int c = s[k], d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* At the opening quote. Each escape is read entirely before its decoded bytes are
 * written, and the output never passes the read position. The header was checked to
 * be UTF-8, so other bytes are copied as they are. */
static const char *parse_string(jparser *p)
{
    char *out = (char *)p->t + ++p->i, *o = out;
    for (;;) {
        if (p->i >= p->n) return jerr(p, "unterminated string");
        unsigned char c = p->t[p->i];
        if (c == '"') break;
        if (c < 0x20) return jerr(p, "control character 0x%02x in a string (it must be escaped)", c);
        if (c != '\\') {
            *o++ = (char)c;
            p->i++;
            continue;
        }
        unsigned char e = p->n - p->i >= 2 ? p->t[p->i + 1] : 0;
        const char *simple = e ? strchr("\"\\/bfnrt", e) : NULL;
        if (simple) {
            *o++ = "\"\\/\b\f\n\r\t"[simple - "\"\\/bfnrt"];
            p->i += 2;
            continue;
        }
        if (e != 'u') return jerr(p, "invalid escape '\\%c'", e >= 0x20 && e < 0x7f ? e : '?');
        int cp = p->n - p->i >= 6 ? hex4(p->t + p->i + 2) : -1;
        if (cp < 0) return jerr(p, "invalid \\u escape (four hex digits expected)");
        if (cp >= 0xDC00 && cp <= 0xDFFF) return jerr(p, "invalid \\u escape (lone low surrogate)");
        p->i += 6;
        if (cp >= 0xD800 && cp <= 0xDBFF) {
            const unsigned char *l = p->t + p->i;
            int lo = p->n - p->i >= 6 && l[0] == '\\' && l[1] == 'u' ? hex4(l + 2) : -1;
            if (lo < 0xDC00 || lo > 0xDFFF) return jerr(p, "invalid \\u escape (high surrogate without a low one)");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            p->i += 6;
        }
        if (cp == 0) return jerr(p, "\\u0000 in a string is not supported (names are C strings)");
        int len = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; /* UTF-8 encoding */
        for (int k = len - 1; k > 0; k--, cp >>= 6) o[k] = (char)(0x80 | (cp & 0x3F));
        o[0] = (char)((len == 1 ? 0 : (0xF00 >> len) & 0xFF) | cp);
        o += len;
    }
    p->i++;
    *o = 0; /* at most where the closing quote was */
    return out;
}

static bool is_digit(jparser *p) { return p->i < p->n && p->t[p->i] >= '0' && p->t[p->i] <= '9'; }

static int parse_number(jparser *p, int self)
{
    bool neg = at_char(p, '-'), overflow = false, plain = true;
    p->i += neg;
    if (!is_digit(p)) return jfail(p, "invalid number");
    uint64_t u = 0;
    if (at_char(p, '0')) p->i++; /* and no digits may follow it */
    else
        for (; is_digit(p); p->i++) {
            unsigned d = (unsigned)(p->t[p->i] - '0');
            overflow |= u > (UINT64_MAX - d) / 10;
            u = u * 10 + d;
        }
    if (at_char(p, '.')) {
        p->i++;
        plain = false;
        if (!is_digit(p)) return jfail(p, "invalid number (digits expected after '.')");
        while (is_digit(p)) p->i++;
    }
    if (at_char(p, 'e') || at_char(p, 'E')) {
        p->i++;
        plain = false;
        if (at_char(p, '+') || at_char(p, '-')) p->i++;
        if (!is_digit(p)) return jfail(p, "invalid number (digits expected in the exponent)");
        while (is_digit(p)) p->i++;
    }
    p->v[self].kind = J_NUM;
    p->v[self].uint_ok = !neg && plain && !overflow;
    p->v[self].u = p->v[self].uint_ok ? u : 0;
    return self;
}

static int parse_value(jparser *p, int depth);

/* The first duplicate key of object `obj`, NULL if none. */
static const char *duplicate_key(jparser *p, int obj)
{
    const char **keys = malloc(((size_t)p->v[obj].n + 1) * sizeof *keys);
    if (!keys) {
        p->oom = true;
        return NULL;
    }
    int n = 0;
    for (int c = p->v[obj].first; c >= 0; c = p->v[c].next) keys[n++] = p->v[c].key;
    const char *dup = find_duplicate(keys, n);
    free(keys);
    return dup;
}

static int parse_container(jparser *p, int self, int depth)
{
    bool obj = at_char(p, '{');
    char close = obj ? '}' : ']';
    if (depth >= MAX_DEPTH) return jerr(p, "nested more than %d levels deep", MAX_DEPTH), -1;
    p->i++;
    p->v[self].kind = obj ? J_OBJ : J_ARR;
    skip_ws(p);
    if (at_char(p, close)) {
        p->i++;
        return self;
    }
    for (int prev = -1;;) {
        const char *key = NULL;
        skip_ws(p);
        if (obj) {
            if (!at_char(p, '"')) return jfail(p, "expected a string key");
            if (!(key = parse_string(p))) return -1;
            skip_ws(p);
            if (!at_char(p, ':')) return jfail(p, "expected ':' after a key");
            p->i++;
        }
        int c = parse_value(p, depth + 1);
        if (c < 0) return -1;
        p->v[c].key = key;
        *(prev < 0 ? &p->v[self].first : &p->v[prev].next) = c;
        prev = c;
        p->v[self].n++;
        skip_ws(p);
        if (at_char(p, close)) break;
        if (!at_char(p, ',')) return jfail(p, obj ? "expected ',' or '}'" : "expected ',' or ']'");
        p->i++;
    }
    p->i++;
    const char *dup = obj ? duplicate_key(p, self) : NULL;
    char q[100];
    if (p->oom) return jfail(p, "out of memory");
    if (dup) return jerr(p, "duplicate key %s in an object", quote(q, dup)), -1;
    return self;
}

static int parse_value(jparser *p, int depth)
{
    skip_ws(p);
    if (p->i >= p->n) return jfail(p, "unexpected end of the header");
    if (p->nv == p->cap) {
        if (p->cap >= MAX_VALUES) return jerr(p, "more than %d JSON values", MAX_VALUES), -1;
        int cap = p->cap ? 2 * p->cap : 256;
        jv *v = realloc(p->v, (size_t)cap * sizeof *v);
        if (!v) return p->oom = true, jfail(p, "out of memory");
        p->v = v;
        p->cap = cap;
    }
    int self = p->nv++;
    p->v[self] = (jv){.first = -1, .next = -1};
    unsigned char c = p->t[p->i];
    static const char *const lit[] = {"null", "false", "true"};
    switch (c) {
    case '{':
    case '[': return parse_container(p, self, depth);
    case '"': {
        const char *s = parse_string(p);
        p->v[self].kind = J_STR;
        p->v[self].s = s;
        return s ? self : -1;
    }
    case 'n':
    case 'f':
    case 't': {
        int k = c == 'n' ? 0 : c == 'f' ? 1 : 2;
        size_t len = strlen(lit[k]);
        if (p->n - p->i < len || memcmp(p->t + p->i, lit[k], len) != 0) return jfail(p, "invalid literal");
        p->i += len;
        p->v[self].kind = k == 0 ? J_NULL : J_BOOL;
        return self;
    }
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p, self);
        if (c >= 0x20 && c < 0x7f) return jerr(p, "unexpected character '%c'", c), -1;
        return jerr(p, "unexpected byte 0x%02x", c), -1;
    }
}

typedef struct {
    const char *name;
    const krt_st_tensor *t;
} named;

struct krt_safetensors {
    unsigned char *buf;      /* the whole file, at buf + shift; data section 16-aligned */
    krt_st_tensor *tensors;  /* header order */
    int count;
    named *by_name;          /* sorted by name, for find */
    krt_st_meta *meta;
    int nmeta;
    unsigned char *realigned; /* aligned copies of tensors misaligned in the file */
};

static krt_status check_length(const char *path, uint64_t n, uint64_t size, krt_error *err)
{
    if (n > size - 8 && n > MAX_HEADER)
        return krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (header length %llu is larger than the file)", path,
                    (unsigned long long)n);
    if (n > size - 8)
        return krt_fail(err, KRT_EFORMAT, "%s: truncated: the header is %llu bytes long, the file has only %llu after the length",
                    path, (unsigned long long)n, (unsigned long long)(size - 8));
    if (n > MAX_HEADER)
        return krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (header length %llu exceeds the limit of %u bytes)", path,
                    (unsigned long long)n, MAX_HEADER);
    if (n < 2)
        return krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (header length %llu is too small)", path, (unsigned long long)n);
    return KRT_OK;
}

/* Reads the whole file; checks the header length. On success *hlen is N, *size the
 * file's size, and st->buf + *shift the file's first byte. */
static krt_status load_file(const char *path, krt_safetensors *st, uint64_t *hlen, uint64_t *size, size_t *shift,
                            krt_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return krt_fail_errno(err, errno, path, "cannot open");
    struct stat sb;
    unsigned char len8[8];
    krt_status rc = KRT_OK;
    if (fstat(fileno(f), &sb) < 0) rc = krt_fail_errno(err, errno, path, "cannot stat");
    else if (!S_ISREG(sb.st_mode)) rc = krt_fail(err, KRT_EIO, "%s: not a regular file", path);
    else if ((*size = (uint64_t)sb.st_size) < 8)
        rc = krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (%llu bytes, too short even for the header length)", path,
                  (unsigned long long)*size);
    else if (fread(len8, 1, 8, f) != 8) rc = krt_fail(err, KRT_EIO, "%s: read error", path);
    if (rc == KRT_OK) {
        *hlen = 0;
        for (int i = 7; i >= 0; i--) *hlen = *hlen << 8 | len8[i];
        rc = check_length(path, *hlen, *size, err);
    }
    if (rc == KRT_OK && (*size > (uint64_t)SIZE_MAX - 32 || !(st->buf = malloc((size_t)*size + 16))))
        rc = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %llu bytes", path, (unsigned long long)*size);
    if (rc == KRT_OK) {
        /* Place the file so that its data section (at 8 + N) starts on a 16-byte boundary. */
        *shift = (16 - ((uintptr_t)st->buf + 8 + (uintptr_t)*hlen) % 16) % 16;
        unsigned char *base = st->buf + *shift;
        memcpy(base, len8, 8);
        size_t want = (size_t)*size - 8;
        if (fread(base + 8, 1, want, f) != want)
            rc = ferror(f) ? krt_fail_errno(err, errno ? errno : EIO, path, "read error")
                           : krt_fail(err, KRT_EIO, "%s: the file became shorter while it was read", path);
    }
    fclose(f);
    return rc;
}

/* One tensor entry of the header: node `at` of tree V. */
static krt_status parse_tensor(const char *path, const jv *V, int at, krt_st_tensor *t, uint64_t off[2], krt_error *err)
{
    char q[100], q2[100];
    const char *name = V[at].key;
    if (V[at].kind != J_OBJ)
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: expected an object with dtype, shape and data_offsets", path,
                    quote(q, name));
    const jv *dtype = NULL, *shape = NULL, *offs = NULL;
    for (int k = V[at].first; k >= 0; k = V[k].next) {
        const char *f = V[k].key;
        if (strcmp(f, "dtype") == 0) dtype = &V[k];
        else if (strcmp(f, "shape") == 0) shape = &V[k];
        else if (strcmp(f, "data_offsets") == 0) offs = &V[k];
        else
            return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: unknown field %s (expected only dtype, shape and data_offsets)",
                        path, quote(q, name), quote(q2, f));
    }
    const char *missing = !dtype ? "dtype" : !shape ? "shape" : !offs ? "data_offsets" : NULL;
    if (missing) return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: missing \"%s\"", path, quote(q, name), missing);
    t->name = name;
    if (dtype->kind != J_STR) return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: dtype is not a string", path, quote(q, name));
    int dt = -1;
    for (int k = 0; k < KRT_DTYPE_COUNT; k++)
        if (strcmp(dtype->s, st_dtype[k]) == 0) dt = k;
    if (dt < 0) {
        for (size_t k = 0; k < sizeof st_other / sizeof *st_other; k++)
            if (strcmp(dtype->s, st_other[k]) == 0)
                return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: dtype %s is not supported by the Kiln runtime", path,
                            quote(q, name), st_other[k]);
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: unknown dtype %s", path, quote(q, name), quote(q2, dtype->s));
    }
    t->dtype = (krt_dtype)dt;
    if (shape->kind != J_ARR)
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: shape is not an array", path, quote(q, name));
    if (shape->n > KRT_MAX_RANK)
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: rank %d is more than the runtime supports (%d)", path, quote(q, name),
                    shape->n, KRT_MAX_RANK);
    t->rank = shape->n;
    uint64_t bytes = krt_dtype_size(t->dtype);
    int d = 0;
    for (int k = shape->first; k >= 0; k = V[k].next, d++) {
        const jv *x = &V[k];
        if (x->kind != J_NUM || !x->uint_ok || x->u > (uint64_t)INT64_MAX)
            return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: shape must hold non-negative integers", path, quote(q, name));
        t->dims[d] = (int64_t)x->u;
        if (x->u != 0 && bytes > UINT64_MAX / x->u)
            return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: shape is impossibly large", path, quote(q, name));
        bytes *= x->u;
    }
    const jv *b = offs->kind == J_ARR && offs->n == 2 ? &V[offs->first] : NULL, *e = b ? &V[b->next] : NULL;
    if (!b || b->kind != J_NUM || !b->uint_ok || e->kind != J_NUM || !e->uint_ok)
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: data_offsets must be two non-negative integers [begin, end]", path,
                    quote(q, name));
    off[0] = b->u;
    off[1] = e->u;
    if (off[1] < off[0])
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: data_offsets [%llu, %llu] end before they begin", path, quote(q, name),
                    (unsigned long long)off[0], (unsigned long long)off[1]);
    if (off[1] - off[0] != bytes)
        return krt_fail(err, KRT_EFORMAT, "%s: tensor %s: its shape and dtype %s need %llu bytes, data_offsets [%llu, %llu] hold %llu",
                    path, quote(q, name), st_dtype[dt], (unsigned long long)bytes, (unsigned long long)off[0],
                    (unsigned long long)off[1], (unsigned long long)(off[1] - off[0]));
    return KRT_OK;
}

/* A tensor's place in the data, for the coverage check. */
typedef struct {
    uint64_t begin, end;
    int index;
} place;

static int cmp_place(const void *a, const void *b)
{
    const place *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->index - y->index;
}

static int cmp_named(const void *a, const void *b)
{
    return strcmp(((const named *)a)->name, ((const named *)b)->name);
}

/* The spec requires the tensors to cover the data exactly: sorted by offset, each one
 * begins where the previous one ended, and the last one ends at the end of the file. */
static krt_status check_coverage(const char *path, const krt_st_tensor *t, place *pl, int count, uint64_t data_len,
                                 krt_error *err)
{
    char q[100], q2[100];
    uint64_t max_end = 0;
    for (int i = 0; i < count; i++)
        if (pl[i].end > max_end) max_end = pl[i].end;
    if (max_end > data_len)
        return krt_fail(err, KRT_EFORMAT, "%s: truncated: header says %llu bytes of tensor data, file has %llu", path,
                    (unsigned long long)max_end, (unsigned long long)data_len);
    qsort(pl, (size_t)count, sizeof *pl, cmp_place);
    uint64_t at = 0;
    for (int i = 0; i < count; i++) {
        const place *x = &pl[i];
        if (x->begin > at)
            return krt_fail(err, KRT_EFORMAT, "%s: bytes %llu..%llu of the data belong to no tensor (a gap before tensor %s)", path,
                        (unsigned long long)at, (unsigned long long)x->begin, quote(q, t[x->index].name));
        if (x->begin < at)
            return krt_fail(err, KRT_EFORMAT, "%s: tensors %s [%llu, %llu] and %s [%llu, %llu] overlap", path,
                        quote(q, t[pl[i - 1].index].name), (unsigned long long)pl[i - 1].begin,
                        (unsigned long long)pl[i - 1].end, quote(q2, t[x->index].name), (unsigned long long)x->begin,
                        (unsigned long long)x->end);
        at = x->end;
    }
    if (at < data_len)
        return krt_fail(err, KRT_EFORMAT, "%s: %llu bytes after the last tensor belong to no tensor (the header describes %llu bytes "
                    "of data, the file has %llu)", path, (unsigned long long)(data_len - at), (unsigned long long)at,
                    (unsigned long long)data_len);
    return KRT_OK;
}

/* The tensors and metadata of the parsed header (node 0 of V, an object). */
static krt_status build(const char *path, krt_safetensors *st, const jv *V, const unsigned char *data, uint64_t data_len,
                        krt_error *err)
{
    int meta_at = -1;
    for (int k = V[0].first; k >= 0; k = V[k].next)
        if (strcmp(V[k].key, "__metadata__") == 0) meta_at = k;
    int count = V[0].n - (meta_at >= 0);
    if (meta_at >= 0) {
        const jv *m = &V[meta_at];
        if (m->kind != J_OBJ && m->kind != J_NULL)
            return krt_fail(err, KRT_EFORMAT, "%s: __metadata__ is not an object of strings", path);
        if (!(st->meta = calloc((size_t)m->n + 1, sizeof *st->meta))) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
        for (int k = m->kind == J_OBJ ? m->first : -1; k >= 0; k = V[k].next) {
            char q[100];
            if (V[k].kind != J_STR)
                return krt_fail(err, KRT_EFORMAT, "%s: __metadata__: the value of %s is not a string", path, quote(q, V[k].key));
            st->meta[st->nmeta++] = (krt_st_meta){V[k].key, V[k].s};
        }
    }
    st->tensors = calloc((size_t)count + 1, sizeof *st->tensors);
    place *pl = malloc(((size_t)count + 1) * sizeof *pl);
    st->by_name = malloc(((size_t)count + 1) * sizeof *st->by_name);
    if (!st->tensors || !pl || !st->by_name) {
        free(pl);
        return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    }
    krt_status rc = KRT_OK;
    for (int k = V[0].first, i = 0; k >= 0 && rc == KRT_OK; k = V[k].next) {
        if (k == meta_at) continue;
        uint64_t off[2] = {0, 0};
        rc = parse_tensor(path, V, k, &st->tensors[i], off, err);
        pl[i] = (place){off[0], off[1], i};
        i++;
    }
    if (rc == KRT_OK) rc = check_coverage(path, st->tensors, pl, count, data_len, err);
    /* Misaligned tensors get an aligned copy (16-byte slots). */
    size_t extra = 0;
    for (int i = 0; i < count && rc == KRT_OK; i++) {
        size_t sz = krt_dtype_size(st->tensors[pl[i].index].dtype);
        if (pl[i].begin % sz) extra += (size_t)(pl[i].end - pl[i].begin + 15) / 16 * 16;
    }
    if (rc == KRT_OK && extra && !(st->realigned = malloc(extra))) rc = krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    size_t at = 0;
    for (int i = 0; i < count && rc == KRT_OK; i++) {
        krt_st_tensor *t = &st->tensors[pl[i].index];
        size_t len = (size_t)(pl[i].end - pl[i].begin);
        t->data = data + pl[i].begin;
        if (pl[i].begin % krt_dtype_size(t->dtype)) {
            memcpy(st->realigned + at, t->data, len);
            t->data = st->realigned + at;
            at += (len + 15) / 16 * 16;
        }
    }
    free(pl);
    if (rc != KRT_OK) return rc;
    st->count = count;
    /* Names are the header's keys, already known to be distinct. */
    for (int i = 0; i < count; i++) st->by_name[i] = (named){st->tensors[i].name, &st->tensors[i]};
    qsort(st->by_name, (size_t)count, sizeof *st->by_name, cmp_named);
    return KRT_OK;
}

/* 8 lowercase or uppercase hex digits. */
static bool parse_crc(const char *s, uint32_t *v)
{
    *v = 0;
    for (int i = 0; i < 8; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        *v = *v << 4 | (uint32_t)d;
    }
    return s[8] == 0;
}

/* Checks the checksums of a file that has them: every tensor's and the metadata's must be
 * there and match. A file without any (written elsewhere, or by an older Kiln) passes. */
static krt_status verify_checksums(const char *path, const krt_safetensors *st, krt_error *err)
{
    char q[100];
    int tensor_crcs = 0;
    const char *meta_value = NULL;
    bool *has = calloc((size_t)st->count + 1, sizeof *has); /* tensors with a checksum */
    if (!has) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    krt_status rc = KRT_OK;
    for (int i = 0; i < st->nmeta && rc == KRT_OK; i++) {
        const krt_st_meta *m = &st->meta[i];
        if (!is_crc_key(m->key)) continue;
        const char *name = m->key + sizeof CRC_PREFIX - 1;
        uint32_t want;
        if (!parse_crc(m->value, &want)) {
            rc = krt_fail(err, KRT_EFORMAT, "%s: __metadata__: the checksum %s is not 8 hexadecimal digits", path, quote(q, m->key));
            break;
        }
        if (!strcmp(name, "__metadata__")) {
            meta_value = m->value;
            continue;
        }
        const krt_st_tensor *t = krt_safetensors_find(st, name);
        if (!t) {
            rc = krt_fail(err, KRT_EFORMAT, "%s: __metadata__ has a checksum for tensor %s, which the file does not hold (corrupted)", path,
                          quote(q, name));
            break;
        }
        uint64_t bytes = krt_dtype_size(t->dtype);
        for (int d = 0; d < t->rank; d++) bytes *= (uint64_t)t->dims[d];
        uint32_t got = crc_bytes(crc_bytes(0, NULL, 0), t->data, (size_t)bytes);
        if (got != want)
            rc = krt_fail(err, KRT_EFORMAT, "%s: tensor %s does not match its checksum (CRC-32 %08x, stored %08x): the file is corrupted",
                          path, quote(q, name), (unsigned)got, (unsigned)want);
        has[t - st->tensors] = true;
        tensor_crcs++; /* metadata keys are distinct: each tensor is counted once */
    }
    for (int i = 0; rc == KRT_OK && (tensor_crcs || meta_value) && i < st->count; i++)
        if (!has[i])
            rc = krt_fail(err, KRT_EFORMAT, "%s: tensor %s has no checksum, though the file has checksums (corrupted)", path,
                          quote(q, st->tensors[i].name));
    free(has);
    if (rc != KRT_OK || (!tensor_crcs && !meta_value)) return rc;
    if (!meta_value) return krt_fail(err, KRT_EFORMAT, "%s: the metadata has tensor checksums but no \"%s\" (corrupted)", path, CRC_META);
    uint32_t want, got;
    parse_crc(meta_value, &want);
    if (!meta_crc(st->meta, st->nmeta, &got)) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    if (got != want)
        return krt_fail(err, KRT_EFORMAT, "%s: the metadata does not match its checksum (CRC-32 %08x, stored %08x): it was edited or is corrupted",
                        path, (unsigned)got, (unsigned)want);
    return KRT_OK;
}

static krt_status parse_loaded(const char *path, krt_safetensors *st, uint64_t hlen, uint64_t size, size_t shift,
                               krt_safetensors **out, krt_error *err);

krt_status krt_safetensors_read(const char *path, krt_safetensors **out, krt_error *err)
{
    if (out) *out = NULL;
    if (!path || !out) return krt_fail(err, KRT_EINVAL, "safetensors: NULL %s", path ? "result pointer" : "file name");
    krt_safetensors *st = calloc(1, sizeof *st);
    if (!st) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    uint64_t hlen = 0, size = 0;
    size_t shift = 0;
    krt_status rc = load_file(path, st, &hlen, &size, &shift, err);
    if (rc != KRT_OK) {
        krt_safetensors_free(st);
        return rc;
    }
    return parse_loaded(path, st, hlen, size, shift, out, err);
}

krt_status krt_safetensors_parse(const char *name, const void *data, size_t size, krt_safetensors **out, krt_error *err)
{
    if (out) *out = NULL;
    if (!name || !out || (!data && size)) return krt_fail(err, KRT_EINVAL, "safetensors: NULL %s", name ? "data or result pointer" : "name");
    if (size < 8)
        return krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (%zu bytes, too short even for the header length)", name, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | ((const unsigned char *)data)[i];
    krt_status rc = check_length(name, hlen, size, err);
    if (rc != KRT_OK) return rc;
    krt_safetensors *st = calloc(1, sizeof *st);
    if (!st || size > SIZE_MAX - 32 || !(st->buf = malloc(size + 16))) {
        free(st);
        return krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", name, size);
    }
    /* As load_file: the data section (at 8 + N) on a 16-byte boundary. */
    size_t shift = (16 - ((uintptr_t)st->buf + 8 + (uintptr_t)hlen) % 16) % 16;
    memcpy(st->buf + shift, data, size);
    return parse_loaded(name, st, hlen, size, shift, out, err);
}

/* The rest of a read, once the file is in st->buf + shift (its length checked): the
 * header, the tensors, the checksums. Frees st on failure. */
static krt_status parse_loaded(const char *path, krt_safetensors *st, uint64_t hlen, uint64_t size, size_t shift,
                               krt_safetensors **out, krt_error *err)
{
    krt_status rc;
    unsigned char *hdr = st->buf + shift + 8;
    size_t bad_at = utf8_check(hdr, (size_t)hlen);
    if (bad_at != hlen) {
        rc = krt_fail(err, KRT_EFORMAT, "%s: the header is not valid UTF-8 (at header byte %zu)", path, bad_at);
        goto bad;
    }
    if (hdr[0] != '{') {
        rc = krt_fail(err, KRT_EFORMAT, "%s: not a safetensors file (the header does not start with '{')", path);
        goto bad;
    }
    jparser p = {.t = hdr, .n = (size_t)hlen};
    if (parse_value(&p, 0) == 0) {
        skip_ws(&p); /* the padding */
        if (p.i < p.n) jerr(&p, "unexpected data after the JSON object");
    }
    if (p.msg[0]) {
        rc = krt_fail(err, p.oom ? KRT_ENOMEM : KRT_EFORMAT, "%s: bad JSON in the header at byte %zu: %s", path, p.at, p.msg);
        free(p.v);
        goto bad;
    }
    /* hlen + 8 <= size was checked; the header's strings were decoded in place. */
    rc = build(path, st, p.v, hdr + hlen, size - 8 - hlen, err);
    free(p.v);
    if (rc == KRT_OK) rc = verify_checksums(path, st, err);
    if (rc != KRT_OK) goto bad;
    *out = st;
    return KRT_OK;
bad:
    krt_safetensors_free(st);
    return rc;
}

int krt_safetensors_count(const krt_safetensors *st) { return st ? st->count : 0; }

const krt_st_tensor *krt_safetensors_tensor(const krt_safetensors *st, int i)
{
    return st && i >= 0 && i < st->count ? &st->tensors[i] : NULL;
}

const krt_st_tensor *krt_safetensors_find(const krt_safetensors *st, const char *name)
{
    if (!st || !name) return NULL;
    named key = {name, NULL};
    const named *hit = bsearch(&key, st->by_name, (size_t)st->count, sizeof *st->by_name, cmp_named);
    return hit ? hit->t : NULL;
}

const char *krt_safetensors_meta(const krt_safetensors *st, const char *key)
{
    if (!st || !key) return NULL;
    for (int i = 0; i < st->nmeta; i++)
        if (strcmp(st->meta[i].key, key) == 0) return st->meta[i].value;
    return NULL;
}

int krt_safetensors_meta_count(const krt_safetensors *st) { return st ? st->nmeta : 0; }

const krt_st_meta *krt_safetensors_meta_entry(const krt_safetensors *st, int i)
{
    return st && i >= 0 && i < st->nmeta ? &st->meta[i] : NULL;
}

void krt_safetensors_free(krt_safetensors *st)
{
    if (!st) return;
    free(st->buf);
    free(st->tensors);
    free(st->by_name);
    free(st->meta);
    free(st->realigned);
    free(st);
}
