/* data.c — the data half of the runtime (kiln_rt.h): loaders for IDX (plain or gzip),
 * NumPy .npy, text corpora selected by glob, and Kiln token files. The datasets that turn
 * loaded arrays into batches, and their prefetch thread, are in prefetch.c.
 *
 * Why it is written this way: a generated training program trusts these functions with
 * files it did not produce (a half-finished download, a file of another format), so every
 * header field is validated against the file's real size before anything is allocated
 * from it, and every problem is a krt_status with a message naming the file. Nothing here
 * prints, exits or keeps global state. */
#define ZLIB_CONST
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <glob.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "rt_internal.h"

/* ---- files ---- */

/* Opens a regular file for reading and gives its size. O_NONBLOCK so that a FIFO named by
 * mistake cannot block the open forever; it is cleared again for the reads. */
static krt_status open_regular(const char *path, int *fd_out, size_t *size, krt_error *err)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK);
    if (fd < 0) return krt_fail(err, KRT_EIO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return krt_fail(err, KRT_EIO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return krt_fail(err, KRT_EIO, "%s: not a regular file", path);
    }
    int flags = fcntl(fd, F_GETFL);
    if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
    *fd_out = fd;
    *size = (size_t)st.st_size;
    return KRT_OK;
}

/* Reads up to n bytes, retrying short reads; returns the count (< n only at end of file)
 * or -1 with errno set. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
    size_t have = 0;
    while (have < n) {
        ssize_t r = read(fd, (char *)buf + have, n - have);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) break;
        have += (size_t)r;
    }
    return (ssize_t)have;
}

/* a * b into *out unless it overflows int64 (both non-negative). */
static bool mul_ok(int64_t a, int64_t b, int64_t *out)
{
    if (a != 0 && b > INT64_MAX / a) return false;
    *out = a * b;
    return true;
}

static void dims_text(char *buf, size_t cap, const int64_t *dims, int rank)
{
    size_t len = 0;
    buf[0] = '\0';
    if (rank == 0) snprintf(buf, cap, "a scalar");
    for (int i = 0; i < rank && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, "%s%lld", i ? "x" : "", (long long)dims[i]);
}

static uint32_t be32(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint64_t le_u(const unsigned char *p, int n)
{
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* ---- a byte source: a plain file, or a gzip file inflated on the fly ----
 * inflate() is used rather than gzread() because gzread() reports a cut-off stream as a
 * plain end of file and loses the count of the bytes decoded in the failing call; here a
 * cut stream is told apart from a short but complete one, and counted exactly. */
typedef struct {
    const char *path;
    int fd;
    bool gz;
    unsigned char *zraw; /* the whole compressed file */
    size_t zlen, zpos;   /* zpos: next byte not yet given to zs */
    z_stream zs;
    bool zinit, zend; /* zend: the current gzip member is complete */
    bool cut;         /* the gzip stream ended in the middle */
    unsigned char *whole; /* or the data, inflated whole (inflate_whole.c) */
    size_t whole_len, whole_pos;
    /* a gzip file's inflated copy (data_cache.c): read in its place, up to `left` bytes
     * (the footer after them is the cache's); or, once the file loaded, written */
    bool copy, store;
    size_t left;
    char entry[4200];
    uint64_t key;
} Src;

static void src_close(Src *s)
{
    if (s->zinit) inflateEnd(&s->zs);
    free(s->zraw);
    free(s->whole);
    if (s->fd >= 0) close(s->fd);
}

static krt_status src_open(Src *s, const char *path, size_t *size, krt_error *err)
{
    memset(s, 0, sizeof *s);
    s->path = path;
    s->fd = -1;
    krt_status st = open_regular(path, &s->fd, size, err);
    if (st) return st;
    unsigned char magic[2];
    if (pread(s->fd, magic, 2, 0) == 2 && magic[0] == 0x1f && magic[1] == 0x8b) {
        if (krt_data_cache_entry(path, s->fd, s->entry, sizeof s->entry, &s->key)) {
            int cfd = krt_data_cache_open(s->entry, s->key, &s->left);
            if (cfd >= 0) {
                close(s->fd);
                s->fd = cfd;
                s->copy = true;
                *size = s->left;
                return KRT_OK;
            }
            s->store = true;
        }
        s->gz = true;
        s->zlen = *size;
        s->zraw = malloc(s->zlen ? s->zlen : 1);
        if (!s->zraw) return krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu compressed bytes", path, s->zlen);
        ssize_t r = read_full(s->fd, s->zraw, s->zlen);
        if (r < 0 || (size_t)r != s->zlen) return krt_fail(err, KRT_EIO, "%s: read error: %s", path, r < 0 ? strerror(errno) : "file shrank");
        if (krt_inflate_whole(s->zraw, s->zlen, &s->whole, &s->whole_len)) {
            free(s->zraw);
            s->zraw = NULL;
            return KRT_OK;
        }
        if (inflateInit2(&s->zs, 15 + 16) != Z_OK) return krt_fail(err, KRT_ENOMEM, "%s: cannot start zlib", path);
        s->zinit = true;
    }
    return KRT_OK;
}

/* Reads up to n bytes into dst; *got < n only at the end of the data (s->cut tells a
 * gzip stream that stopped in the middle). Corrupt gzip data is an error. */
static krt_status src_read(Src *s, void *dst, size_t n, size_t *got, krt_error *err)
{
    *got = 0;
    if (!s->gz) {
        if (s->copy && n > s->left) n = s->left;
        ssize_t r = read_full(s->fd, dst, n);
        if (r < 0) return krt_fail(err, KRT_EIO, "%s: read error: %s", s->path, strerror(errno));
        *got = (size_t)r;
        if (s->copy) s->left -= *got;
        return KRT_OK;
    }
    if (s->whole) { /* a complete stream: its end is the clean end */
        *got = n < s->whole_len - s->whole_pos ? n : s->whole_len - s->whole_pos;
        memcpy(dst, s->whole + s->whole_pos, *got);
        s->whole_pos += *got;
        return KRT_OK;
    }
    unsigned char *out = dst;
    while (*got < n) {
        if (s->zs.avail_in == 0 && s->zpos < s->zlen) { /* avail_in is 32-bit: feed in slices */
            size_t k = s->zlen - s->zpos < (1u << 30) ? s->zlen - s->zpos : (1u << 30);
            s->zs.next_in = s->zraw + s->zpos;
            s->zs.avail_in = (uInt)k;
            s->zpos += k;
        }
        if (s->zend) {
            if (s->zs.avail_in == 0) break; /* the clean end */
            /* Another gzip member may follow (gzip allows concatenation); anything else is junk. */
            if (s->zs.avail_in < 2 || s->zs.next_in[0] != 0x1f || s->zs.next_in[1] != 0x8b)
                return krt_fail(err, KRT_EFORMAT, "%s: corrupt gzip file: garbage after the compressed data", s->path);
            inflateReset(&s->zs);
            s->zend = false;
        }
        size_t want = n - *got < (1u << 30) ? n - *got : (1u << 30);
        s->zs.next_out = out + *got;
        s->zs.avail_out = (uInt)want;
        int r = inflate(&s->zs, Z_NO_FLUSH);
        *got += want - s->zs.avail_out;
        if (r == Z_STREAM_END) s->zend = true;
        else if (r == Z_BUF_ERROR && s->zs.avail_in == 0 && s->zpos == s->zlen) {
            s->cut = true; /* needs more input and there is none */
            break;
        } else if (r == Z_MEM_ERROR) return krt_fail(err, KRT_ENOMEM, "%s: out of memory in zlib", s->path);
        else if (r != Z_OK && r != Z_BUF_ERROR)
            return krt_fail(err, KRT_EFORMAT, "%s: corrupt gzip data: %s", s->path, s->zs.msg ? s->zs.msg : "inflate failed");
    }
    return KRT_OK;
}

/* ---- IDX ---- */

krt_status krt_idx_load(const char *path, krt_array *out, krt_error *err)
{
    if (!path || !out) return krt_fail(err, KRT_EINVAL, "krt_idx_load: NULL %s", path ? "output" : "path");
    memset(out, 0, sizeof *out);
    size_t fsize;
    Src s;
    krt_status st = src_open(&s, path, &fsize, err);
    unsigned char *raw = NULL, *conv = NULL;
    if (st) goto done;

    unsigned char hdr[4 + 4 * KRT_MAX_RANK];
    size_t got;
    if ((st = src_read(&s, hdr, 4, &got, err))) goto done;
    if (got < 4) {
        st = krt_fail(err, KRT_EFORMAT, "%s: truncated: %zu bytes, shorter than an IDX header", path, got);
        goto done;
    }
    if (hdr[0] || hdr[1]) {
        st = krt_fail(err, KRT_EFORMAT, "%s: not an IDX file (magic %02x %02x %02x %02x, expected 00 00 type rank)", path,
                  hdr[0], hdr[1], hdr[2], hdr[3]);
        goto done;
    }
    /* Element type: source bytes and the dtype it loads as. i8 and i16 widen to i32
     * because the runtime has no narrower signed type. */
    int esize;
    krt_dtype dt;
    switch (hdr[2]) {
    case 0x08: esize = 1, dt = KRT_U8; break;
    case 0x09: esize = 1, dt = KRT_I32; break;
    case 0x0B: esize = 2, dt = KRT_I32; break;
    case 0x0C: esize = 4, dt = KRT_I32; break;
    case 0x0D: esize = 4, dt = KRT_F32; break;
    case 0x0E: esize = 8, dt = KRT_F64; break;
    default: st = krt_fail(err, KRT_EFORMAT, "%s: unsupported IDX element type 0x%02X", path, hdr[2]); goto done;
    }
    int rank = hdr[3];
    if (rank < 1 || rank > KRT_MAX_RANK) {
        st = krt_fail(err, KRT_EFORMAT, "%s: IDX rank %d is out of range 1..%d", path, rank, KRT_MAX_RANK);
        goto done;
    }
    size_t hlen = 4 + 4 * (size_t)rank;
    if ((st = src_read(&s, hdr + 4, hlen - 4, &got, err))) goto done;
    if (got < hlen - 4) {
        st = krt_fail(err, KRT_EFORMAT, "%s: truncated: the header ends after %zu of its %zu bytes", path, 4 + got, hlen);
        goto done;
    }
    int64_t count = 1, nbytes;
    for (int i = 0; i < rank; i++) {
        out->dims[i] = be32(hdr + 4 + 4 * i);
        if (!mul_ok(count, out->dims[i], &count)) count = -1;
        if (count < 0) break;
    }
    char dtext[200];
    dims_text(dtext, sizeof dtext, out->dims, rank);
    int64_t outbytes;
    if (count < 0 || !mul_ok(count, esize, &nbytes) || !mul_ok(count, (int64_t)krt_dtype_size(dt), &outbytes) ||
        (uint64_t)outbytes > SIZE_MAX) {
        st = krt_fail(err, KRT_EFORMAT, "%s: header dims %s overflow", path, dtext);
        goto done;
    }
    const char *says = "truncated: header says";
    if (!s.gz && fsize - hlen != (size_t)nbytes) { /* check before allocating anything */
        bool shrt = fsize - hlen < (size_t)nbytes;
        st = krt_fail(err, KRT_EFORMAT, "%s: %s %s (%lld bytes of data) but the file has %zu bytes of data", path,
                  shrt ? says : "trailing data: header says", dtext, (long long)nbytes, fsize - hlen);
        goto done;
    }
    /* Grow the buffer as data arrives, so a corrupt gzip header claiming terabytes costs
     * nothing before it is found out. */
    size_t cap = s.gz ? ((size_t)nbytes < (1u << 20) ? (size_t)nbytes : (1u << 20)) : (size_t)nbytes, have = 0;
    raw = malloc(cap ? cap : 1);
    if (!raw) {
        st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", path, cap);
        goto done;
    }
    for (;;) {
        if ((st = src_read(&s, raw + have, cap - have, &got, err))) goto done;
        have += got;
        if (have < cap || cap == (size_t)nbytes) break;
        size_t ncap = cap * 2 < (size_t)nbytes ? cap * 2 : (size_t)nbytes;
        unsigned char *g = realloc(raw, ncap);
        if (!g) {
            st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", path, ncap);
            goto done;
        }
        raw = g, cap = ncap;
    }
    if (have < (size_t)nbytes) {
        st = krt_fail(err, KRT_EFORMAT, "%s: %s %s (%lld bytes of data) but the decompressed file has %zu%s", path, says,
                  dtext, (long long)nbytes, have, s.cut ? " (the gzip stream is cut off)" : " (the gzip stream ends there)");
        goto done;
    }
    unsigned char extra;
    if ((st = src_read(&s, &extra, 1, &got, err))) goto done;
    if (got) {
        st = krt_fail(err, KRT_EFORMAT, "%s: trailing data: header says %s (%lld bytes of data) but the data goes on", path,
                  dtext, (long long)nbytes);
        goto done;
    }
    if (s.cut) { /* all the data arrived, but not the gzip trailer that checks it */
        st = krt_fail(err, KRT_EFORMAT, "%s: truncated: the gzip stream is cut off after the data (its check is missing)", path);
        goto done;
    }
    if (s.store) krt_data_cache_store(s.entry, s.key, hdr, hlen, raw, (size_t)nbytes); /* the next load reads this */
    /* IDX is big-endian; convert to host order (and widen i8/i16). */
    if (esize == 1 && dt == KRT_U8) {
        out->data = raw, raw = NULL;
    } else if (esize == 4 || esize == 8) {
        for (int64_t i = 0; i < count; i++) {
            unsigned char *p = raw + i * esize;
            if (esize == 4) {
                uint32_t v = be32(p);
                memcpy(p, &v, 4);
            } else {
                uint64_t v = (uint64_t)be32(p) << 32 | be32(p + 4);
                memcpy(p, &v, 8);
            }
        }
        out->data = raw, raw = NULL;
    } else {
        conv = malloc(count ? (size_t)outbytes : 1);
        if (!conv) {
            st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %lld bytes", path, (long long)outbytes);
            goto done;
        }
        int32_t *o = (int32_t *)conv;
        for (int64_t i = 0; i < count; i++)
            o[i] = esize == 1 ? (int8_t)raw[i] : (int16_t)(uint16_t)(raw[2 * i] << 8 | raw[2 * i + 1]);
        out->data = conv, conv = NULL;
    }
    out->dtype = dt;
    out->rank = rank;
    out->nbytes = (size_t)outbytes;
    st = krt_ok(err);
done:
    free(raw);
    free(conv);
    if (st) memset(out, 0, sizeof *out);
    if (s.path) src_close(&s);
    return st;
}

/* ---- NumPy .npy ---- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r') p++;
    return p;
}

/* A Python string literal without escapes ('...' or "..."); NULL if p is not one. */
static const char *parse_str(const char *p, char *buf, size_t cap)
{
    char q = *p;
    if (q != '\'' && q != '"') return NULL;
    size_t n = 0;
    for (p++; *p != q; p++) {
        if (!*p || *p == '\\' || n + 1 >= cap) return NULL;
        buf[n++] = *p;
    }
    buf[n] = '\0';
    return p + 1;
}

/* The header is a Python dict literal, e.g. {'descr': '<f4', 'fortran_order': False,
 * 'shape': (3, 4), }. Only this grammar is accepted: a str key with a str, bool or
 * tuple-of-int value; the key order is free. Returns NULL on success or what is wrong. */
static const char *npy_header(const char *p, char *descr, size_t dcap, int *fortran, int *rank, int64_t *dims)
{
    bool seen_d = false, seen_f = false, seen_s = false;
    p = skip_ws(p);
    if (*p++ != '{') return "the header is not a dict";
    for (;;) {
        char key[32];
        p = skip_ws(p);
        if (*p == '}') break;
        if (!(p = parse_str(p, key, sizeof key))) return "a header key is not a string";
        p = skip_ws(p);
        if (*p++ != ':') return "':' missing in the header";
        p = skip_ws(p);
        if (!strcmp(key, "descr")) {
            if (!(p = parse_str(p, descr, dcap))) return "unsupported dtype (structured or malformed 'descr')";
            seen_d = true;
        } else if (!strcmp(key, "fortran_order")) {
            if (!strncmp(p, "False", 5)) *fortran = 0, p += 5;
            else if (!strncmp(p, "True", 4)) *fortran = 1, p += 4;
            else return "'fortran_order' is not True or False";
            seen_f = true;
        } else if (!strcmp(key, "shape")) {
            if (*p++ != '(') return "'shape' is not a tuple";
            *rank = 0;
            for (;;) { /* (), (n,), (a, b) and (a, b,) */
                p = skip_ws(p);
                if (*p == ')') break;
                if (*p < '0' || *p > '9') return "'shape' holds something other than integers";
                if (*rank == KRT_MAX_RANK) return "'shape' has more than 8 dimensions";
                int64_t v = 0;
                for (; *p >= '0' && *p <= '9'; p++) {
                    if (v > (INT64_MAX - 9) / 10) return "a 'shape' dimension overflows";
                    v = v * 10 + (*p - '0');
                }
                if (*p == 'L') p++; /* written by Python 2 */
                dims[(*rank)++] = v;
                p = skip_ws(p);
                if (*p == ',') p++;
                else if (*p != ')') return "malformed 'shape' tuple";
            }
            p++;
            seen_s = true;
        } else {
            return "unknown key in the header";
        }
        p = skip_ws(p);
        if (*p == ',') p++;
        else if (*p != '}') return "malformed header dict";
    }
    if (*skip_ws(p + 1)) return "text after the header dict";
    if (!seen_d || !seen_f || !seen_s) return "the header lacks 'descr', 'fortran_order' or 'shape'";
    return NULL;
}

krt_status krt_npy_load(const char *path, krt_array *out, krt_error *err)
{
    if (!path || !out) return krt_fail(err, KRT_EINVAL, "krt_npy_load: NULL %s", path ? "output" : "path");
    memset(out, 0, sizeof *out);
    int fd;
    size_t fsize;
    krt_status st = open_regular(path, &fd, &fsize, err);
    if (st) return st;
    char *hdr = NULL;
    unsigned char pre[12];
    ssize_t r = read_full(fd, pre, sizeof pre);
    if (r < 0) {
        st = krt_fail(err, KRT_EIO, "%s: read error: %s", path, strerror(errno));
        goto done;
    }
    if (r < 10 || memcmp(pre, "\x93NUMPY", 6) != 0) {
        st = krt_fail(err, KRT_EFORMAT, "%s: not a .npy file (too short, or no \\x93NUMPY magic)", path);
        goto done;
    }
    if (pre[6] < 1 || pre[6] > 3) {
        st = krt_fail(err, KRT_EFORMAT, "%s: unsupported .npy format version %d.%d", path, pre[6], pre[7]);
        goto done;
    }
    /* Version 1 has a u16 header length, 2 and 3 a u32 (3 only allows UTF-8 in it). */
    size_t pl = pre[6] == 1 ? 10 : 12;
    if ((size_t)r < pl) {
        st = krt_fail(err, KRT_EFORMAT, "%s: truncated in the .npy preamble", path);
        goto done;
    }
    size_t hlen = (size_t)le_u(pre + 8, pre[6] == 1 ? 2 : 4);
    if (hlen > fsize - pl) {
        st = krt_fail(err, KRT_EFORMAT, "%s: truncated: header of %zu bytes but the file has %zu after the preamble", path, hlen,
                  fsize - pl);
        goto done;
    }
    if (!(hdr = malloc(hlen + 1)) ) {
        st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for the header", path);
        goto done;
    }
    if (pread(fd, hdr, hlen, (off_t)pl) != (ssize_t)hlen) {
        st = krt_fail(err, KRT_EIO, "%s: read error in the header", path);
        goto done;
    }
    hdr[hlen] = '\0';
    if (strlen(hdr) != hlen) {
        st = krt_fail(err, KRT_EFORMAT, "%s: NUL byte in the .npy header", path);
        goto done;
    }
    char descr[32];
    int fortran = 0;
    const char *why = npy_header(hdr, descr, sizeof descr, &fortran, &out->rank, out->dims);
    if (why) {
        st = krt_fail(err, KRT_EFORMAT, "%s: %s", path, why);
        goto done;
    }
    static const struct { const char *descr; krt_dtype dt; } types[] = {
        {"|b1", KRT_BOOL}, {"|u1", KRT_U8}, {"<u1", KRT_U8}, {"<i4", KRT_I32},
        {"<i8", KRT_I64},  {"<f4", KRT_F32}, {"<f8", KRT_F64},
    };
    int t = -1;
    for (int i = 0; i < (int)(sizeof types / sizeof types[0]); i++)
        if (!strcmp(descr, types[i].descr)) t = i;
    if (t < 0) {
        st = krt_fail(err, KRT_EFORMAT, "%s: unsupported dtype '%s' (supported: |b1 |u1 <i4 <i8 <f4 <f8)", path, descr);
        goto done;
    }
    if (fortran) {
        st = krt_fail(err, KRT_EFORMAT, "%s: fortran_order is True; only C order is supported", path);
        goto done;
    }
    out->dtype = types[t].dt;
    char dtext[200];
    dims_text(dtext, sizeof dtext, out->dims, out->rank);
    int64_t count = 1, nbytes;
    for (int i = 0; i < out->rank && count >= 0; i++)
        if (!mul_ok(count, out->dims[i], &count)) count = -1;
    if (count < 0 || !mul_ok(count, (int64_t)krt_dtype_size(out->dtype), &nbytes) || (uint64_t)nbytes > SIZE_MAX) {
        st = krt_fail(err, KRT_EFORMAT, "%s: shape %s overflows", path, dtext);
        goto done;
    }
    size_t have = fsize - pl - hlen;
    if (have != (size_t)nbytes) {
        st = krt_fail(err, KRT_EFORMAT, "%s: %s: shape %s of %s (%lld bytes of data) but the file has %zu bytes of data", path,
                  have < (size_t)nbytes ? "truncated" : "trailing data", dtext, descr, (long long)nbytes, have);
        goto done;
    }
    if (!(out->data = malloc(nbytes ? (size_t)nbytes : 1))) {
        st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %lld bytes", path, (long long)nbytes);
        goto done;
    }
    if (pread(fd, out->data, (size_t)nbytes, (off_t)(pl + hlen)) != (ssize_t)nbytes) {
        st = krt_fail(err, KRT_EIO, "%s: read error in the data", path);
        goto done;
    }
    /* Little-endian data is already in host order on every platform this targets; bools
     * are normalized to 0/1 so that later arithmetic on them is well defined. */
    if (out->dtype == KRT_BOOL)
        for (int64_t i = 0; i < count; i++) ((unsigned char *)out->data)[i] = ((unsigned char *)out->data)[i] != 0;
    out->nbytes = (size_t)nbytes;
    st = krt_ok(err);
done:
    free(hdr);
    close(fd);
    if (st) krt_array_free(out);
    return st;
}

/* ---- text by glob ---- */

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

krt_status krt_text_load(const char *pattern, const char *exclude, krt_array *out, krt_error *err)
{
    if (!pattern || !out) return krt_fail(err, KRT_EINVAL, "krt_text_load: NULL %s", pattern ? "output" : "pattern");
    memset(out, 0, sizeof *out);
    glob_t g;
    /* GLOB_NOSORT + strcmp: byte order whatever the locale, so the same files always give
     * the same bytes (glob's own sort follows LC_COLLATE). */
    int gr = glob(pattern, GLOB_NOSORT, NULL, &g);
    if (gr == GLOB_NOMATCH) {
        globfree(&g);
        return krt_fail(err, KRT_EIO, "%s: no file matches", pattern);
    }
    if (gr != 0) {
        globfree(&g);
        return krt_fail(err, gr == GLOB_NOSPACE ? KRT_ENOMEM : KRT_EIO, "%s: cannot read the directories it names", pattern);
    }
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, cmp_str);
    unsigned char *buf = NULL;
    size_t len = 0, files = 0;
    krt_status st = KRT_OK;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        const char *p = g.gl_pathv[i], *base = strrchr(p, '/');
        base = base ? base + 1 : p;
        if (exclude && *exclude && fnmatch(exclude, base, 0) == 0) continue;
        struct stat sb;
        /* Directories (and other non-regular files: a FIFO would block) are skipped;
         * symbolic links are followed. */
        if (stat(p, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
        int fd;
        size_t size;
        if ((st = open_regular(p, &fd, &size, err))) break;
        if (size > SIZE_MAX - len - 1) {
            close(fd);
            st = krt_fail(err, KRT_ENOMEM, "%s: the matching files are too large", pattern);
            break;
        }
        unsigned char *nb = realloc(buf, len + size + 1);
        if (!nb) {
            close(fd);
            st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", pattern, len + size);
            break;
        }
        buf = nb;
        ssize_t r = read_full(fd, buf + len, size);
        int e = errno;
        close(fd);
        if (r < 0 || (size_t)r != size) {
            st = krt_fail(err, KRT_EIO, "%s: %s", p, r < 0 ? strerror(e) : "file shrank while being read");
            break;
        }
        len += size;
        files++;
    }
    globfree(&g);
    if (!st && !files)
        st = krt_fail(err, KRT_EIO, "%s: no regular file matches%s%s%s", pattern, exclude && *exclude ? " once '" : "",
                  exclude && *exclude ? exclude : "", exclude && *exclude ? "' is excluded" : "");
    else if (!st && !len) st = krt_fail(err, KRT_EFORMAT, "%s: the %zu matching files are empty", pattern, files);
    if (st) {
        free(buf);
        return st;
    }
    out->dtype = KRT_U8;
    out->rank = 1;
    out->dims[0] = (int64_t)len;
    out->data = buf;
    out->nbytes = len;
    return krt_ok(err);
}

/* ---- token files (docs/formats.md) ---- */

#define TOK_MAGIC "KILNTOK1"
#define TOK_HEADER 24 /* magic 8, width 4, reserved 4, count 8 */

krt_status krt_tokens_load(const char *path, krt_array *out, krt_error *err)
{
    if (!path || !out) return krt_fail(err, KRT_EINVAL, "krt_tokens_load: NULL %s", path ? "output" : "path");
    memset(out, 0, sizeof *out);
    int fd;
    size_t fsize;
    krt_status st = open_regular(path, &fd, &fsize, err);
    if (st) return st;
    unsigned char h[TOK_HEADER];
    ssize_t r = read_full(fd, h, sizeof h);
    if (r < 0) st = krt_fail(err, KRT_EIO, "%s: read error: %s", path, strerror(errno));
    else if (r < 8 || memcmp(h, TOK_MAGIC, 8) != 0) st = krt_fail(err, KRT_EFORMAT, "%s: not a token file (no KILNTOK1 magic)", path);
    else if (r < TOK_HEADER) st = krt_fail(err, KRT_EFORMAT, "%s: truncated: the header ends after %zd bytes", path, r);
    if (st) goto done;
    uint32_t width = (uint32_t)le_u(h + 8, 4), reserved = (uint32_t)le_u(h + 12, 4);
    uint64_t count = le_u(h + 16, 8);
    if (width != 2 && width != 4) {
        st = krt_fail(err, KRT_EFORMAT, "%s: token width %u (expected 2 or 4)", path, width);
        goto done;
    }
    if (reserved != 0) {
        st = krt_fail(err, KRT_EFORMAT, "%s: reserved header field is %u, not 0 (a newer format?)", path, reserved);
        goto done;
    }
    if (count > (uint64_t)INT64_MAX / 4 || count * 4 > SIZE_MAX || count * width != fsize - TOK_HEADER) {
        st = krt_fail(err, KRT_EFORMAT, "%s: %s: header says %llu tokens of %u bytes but the file has %zu bytes of tokens", path,
                  count > (fsize - TOK_HEADER) / width ? "truncated" : "trailing data", (unsigned long long)count, width,
                  fsize - TOK_HEADER);
        goto done;
    }
    int32_t *t = malloc(count ? (size_t)count * 4 : 1);
    if (!t) {
        st = krt_fail(err, KRT_ENOMEM, "%s: out of memory for %llu tokens", path, (unsigned long long)count);
        goto done;
    }
    out->data = t;
    unsigned char *raw = (unsigned char *)t;
    /* Read into the start of the buffer and widen in place from the back, so that no
     * second buffer is needed. */
    r = read_full(fd, raw, (size_t)count * width);
    if (r < 0 || (uint64_t)r != count * width) {
        st = krt_fail(err, KRT_EIO, "%s: read error: %s", path, r < 0 ? strerror(errno) : "file shrank");
        goto done;
    }
    for (uint64_t i = count; i-- > 0;) {
        uint64_t v = le_u(raw + i * width, (int)width);
        if (v > INT32_MAX) {
            st = krt_fail(err, KRT_EFORMAT, "%s: token %llu at index %llu does not fit i32", path, (unsigned long long)v,
                      (unsigned long long)i);
            goto done;
        }
        t[i] = (int32_t)v;
    }
    out->dtype = KRT_I32;
    out->rank = 1;
    out->dims[0] = (int64_t)count;
    out->nbytes = (size_t)count * 4;
    st = krt_ok(err);
done:
    close(fd);
    if (st) krt_array_free(out);
    return st;
}

/* ---- any format, by content ---- */

krt_status krt_read_whole(const char *path, void **bytes, size_t *len, krt_error *err)
{
    int fd;
    size_t size;
    *bytes = NULL, *len = 0;
    krt_status st = open_regular(path, &fd, &size, err);
    if (st) return st;
    unsigned char *b = malloc(size + 1);
    if (!b) {
        close(fd);
        return krt_fail(err, KRT_ENOMEM, "%s: out of memory for %zu bytes", path, size);
    }
    const ssize_t r = read_full(fd, b, size);
    const int e = errno;
    close(fd);
    if (r < 0 || (size_t)r != size) {
        free(b);
        return krt_fail(err, KRT_EIO, "%s: read error: %s", path, r < 0 ? strerror(e) : "the file changed size");
    }
    *bytes = b, *len = size;
    return KRT_OK;
}

krt_status krt_array_load(const char *path, krt_array *out, krt_error *err)
{
    if (!path || !out) return krt_fail(err, KRT_EINVAL, "krt_array_load: NULL %s", path ? "output" : "path");
    memset(out, 0, sizeof *out);
    int fd;
    size_t fsize;
    krt_status st = open_regular(path, &fd, &fsize, err);
    if (st) return st;
    unsigned char m[8] = {0};
    ssize_t r = read_full(fd, m, sizeof m);
    int e = errno;
    close(fd);
    if (r < 0) return krt_fail(err, KRT_EIO, "%s: read error: %s", path, strerror(e));
    if (r >= 6 && !memcmp(m, "\x93NUMPY", 6)) return krt_npy_load(path, out, err);
    if (r >= 8 && !memcmp(m, TOK_MAGIC, 8)) return krt_tokens_load(path, out, err);
    if (r >= 2 && ((m[0] == 0x1f && m[1] == 0x8b) || (r >= 4 && !m[0] && !m[1]))) return krt_idx_load(path, out, err);
    const size_t pl = strlen(path);
    if (pl > 3 && !strcmp(path + pl - 3, ".pb")) return krt_tensorproto_load(path, out, err); /* protobuf has no magic: by name */
    char first[40] = "";
    for (ssize_t i = 0, o = 0; i < r && i < 4; i++) o += snprintf(first + o, sizeof first - (size_t)o, "%s%02x", i ? " " : "", m[i]);
    return krt_fail(err, KRT_EFORMAT,
                    "%s: not a data file of a format Kiln reads (tried IDX: 00 00 type rank; gzip-compressed IDX: 1f 8b; NumPy .npy: "
                    "\\x93NUMPY; Kiln token file: KILNTOK1; ONNX TensorProto: a name ending .pb); %s%s",
                    path, r ? "it starts with " : "", r ? first : "the file is empty");
}

static krt_status write_fail(krt_error *err, const char *path, const char *what, int e)
{
    return krt_fail(err, e == ENOSPC || e == EDQUOT ? KRT_ENOSPC : KRT_EIO, "%s: %s: %s", path, what, strerror(e));
}

static bool write_all(int fd, const unsigned char *p, size_t n)
{
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w < 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

krt_status krt_tokens_write(const char *path, const int32_t *tokens, int64_t count, int width, krt_error *err)
{
    if (!path) return krt_fail(err, KRT_EINVAL, "krt_tokens_write: NULL path");
    if (width != 2 && width != 4) return krt_fail(err, KRT_EINVAL, "%s: token width %d (expected 2 or 4)", path, width);
    if (count < 0 || (count > 0 && !tokens)) return krt_fail(err, KRT_EINVAL, "%s: bad token count %lld", path, (long long)count);
    int64_t max = width == 2 ? 65535 : INT32_MAX;
    for (int64_t i = 0; i < count; i++) /* all checks before the file is touched */
        if (tokens[i] < 0 || tokens[i] > max)
            return krt_fail(err, KRT_EINVAL, "%s: token %d at index %lld does not fit in %d bytes (0..%lld)", path, tokens[i],
                        (long long)i, width, (long long)max);
    /* Atomic replace: write a temporary file next to the target (rename is only atomic
     * within a file system), fsync it, rename it over the target, fsync the directory. */
    static atomic_uint serial;
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 64);
    if (!tmp) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    int fd = -1;
    for (int tries = 0; fd < 0 && tries < 100; tries++) {
        snprintf(tmp, plen + 64, "%s.tmp.%ld.%u", path, (long)getpid(), atomic_fetch_add(&serial, 1));
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0666); /* 0666 & ~umask, as a plain create would */
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        krt_status st = write_fail(err, path, "cannot create a temporary file", errno);
        free(tmp);
        return st;
    }
    unsigned char buf[1 << 14];
    memcpy(buf, TOK_MAGIC, 8);
    for (int i = 0; i < 4; i++) buf[8 + i] = (unsigned char)((uint32_t)width >> 8 * i), buf[12 + i] = 0;
    for (int i = 0; i < 8; i++) buf[16 + i] = (unsigned char)((uint64_t)count >> 8 * i);
    size_t n = TOK_HEADER;
    bool good = true;
    for (int64_t i = 0; good && i <= count; i++) {
        if (n + 4 > sizeof buf || i == count) {
            good = write_all(fd, buf, n);
            n = 0;
        }
        if (i == count) break;
        for (int b = 0; b < width; b++) buf[n++] = (unsigned char)((uint32_t)tokens[i] >> 8 * b);
    }
    krt_status st = KRT_OK;
    if (!good) st = write_fail(err, path, "write failed", errno);
    else if (fsync(fd) != 0) st = write_fail(err, path, "fsync failed", errno);
    if (close(fd) != 0 && !st) st = write_fail(err, path, "close failed", errno);
    if (!st && rename(tmp, path) != 0) st = write_fail(err, path, "cannot rename the temporary file over it", errno);
    if (st) {
        unlink(tmp);
        free(tmp);
        return st;
    }
    free(tmp);
    /* Best effort: make the rename itself durable. The new file is already in place, so a
     * failure here is not reported as a failed write. */
    char *dir = strdup(path);
    if (dir) {
        char *slash = strrchr(dir, '/');
        const char *d = slash ? (slash == dir ? "/" : (*slash = '\0', dir)) : ".";
        int dfd = open(d, O_RDONLY | O_DIRECTORY);
        if (dfd >= 0) {
            fsync(dfd);
            close(dfd);
        }
        free(dir);
    }
    return krt_ok(err);
}

/* ---- writing .npy ---- */

krt_status krt_npy_write(const char *path, krt_dtype dtype, int rank, const int64_t *dims, const void *data, krt_error *err)
{
    static const char *const descr[KRT_DTYPE_COUNT] = {"|b1", "|u1", "<i4", "<i8", "<f2", NULL, "<f4", "<f8"};
    if (!path || rank < 0 || rank > KRT_MAX_RANK || (unsigned)dtype >= KRT_DTYPE_COUNT || !descr[dtype])
        return krt_fail(err, KRT_EINVAL, "krt_npy_write: %s", path ? "a dtype .npy cannot hold, or a bad rank" : "NULL path");
    char shape[KRT_MAX_RANK * 24 + 8];
    size_t o = 0;
    int64_t count = 1;
    for (int d = 0; d < rank; d++) {
        o += (size_t)snprintf(shape + o, sizeof shape - o, "%lld%s", (long long)dims[d], rank == 1 ? "," : d + 1 < rank ? ", " : "");
        count *= dims[d];
    }
    shape[o] = 0;
    /* Format 1.0: magic, version, u16 header length; the header padded with spaces to a
     * multiple of 64 bytes in all, ending with a newline. */
    char header[512];
    int hl = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }", descr[dtype], shape);
    int total = 10 + hl + 1;
    int pad = (64 - total % 64) % 64;
    memset(header + hl, ' ', (size_t)pad);
    header[hl + pad] = '\n';
    hl += pad + 1;
    unsigned char pre[10] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0, (unsigned char)(hl & 0xff), (unsigned char)(hl >> 8)};
    size_t tl = strlen(path) + 32;
    char *tmp = malloc(tl);
    if (!tmp) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", path);
    snprintf(tmp, tl, "%s.tmp%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        krt_status s = krt_fail_errno(err, errno, path, "cannot create");
        free(tmp);
        return s;
    }
    size_t bytes = (size_t)count * krt_dtype_size(dtype);
    bool ok = fwrite(pre, 1, 10, f) == 10 && fwrite(header, 1, (size_t)hl, f) == (size_t)hl && (!bytes || fwrite(data, 1, bytes, f) == bytes);
    int e = errno;
    if (fclose(f) != 0 && ok) {
        ok = false;
        e = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = false;
        e = errno;
    }
    if (!ok) {
        unlink(tmp);
        free(tmp);
        return krt_fail_errno(err, e ? e : EIO, path, "writing failed");
    }
    free(tmp);
    return KRT_OK;
}
