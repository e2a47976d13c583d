/* lib_weights.c — binds an embeddable library's weights (kiln build --lib) from a
 * safetensors file that the caller holds in memory, or from the file embedded in the
 * library. The inference program's reader (ckpt.c) allocates its tables and reads files;
 * a library may do neither, so this reads the header in place: the JSON is walked again
 * for each question (which is the model's largest header, a few hundred tensors, in well
 * under a millisecond) instead of being parsed into allocated tables. The rules are the
 * inference program's --weights rules (weights.c), with its messages: names and layouts
 * are PyTorch's, every tensor of the model must be there with its dtype and shape, and the
 * file must hold no other; a tensor's CRC-32 checksum ("crc32:NAME" in the metadata, as
 * Kiln writes them) is verified where the file has one. The whole file is checked before
 * a byte is copied, so a bad file leaves the instance's weights as they were. */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "kiln_lib.h"

/* Longest tensor name (a state_dict key) and metadata key this reader compares. */
#define NAME_CAP 512

static const char *const st_dtype[KRT_DTYPE_COUNT] = {"BOOL", "U8", "I32", "I64", "F16", "BF16", "F32", "F64"};
/* As messages name them (krt_dtype_name's, which lives beside file I/O in core.c). */
static const char *const dtype_name[KRT_DTYPE_COUNT] = {"bool", "u8", "i32", "i64", "f16", "bf16", "f32", "f64"};
static const unsigned dtype_bytes[KRT_DTYPE_COUNT] = {1, 1, 4, 8, 2, 2, 4, 8};

/* ---- the JSON header, read in place ---- */

typedef struct {
    const char *p, *end;
} Cur;

static void skip_ws(Cur *c)
{
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r')) c->p++;
}

static bool take(Cur *c, char ch)
{
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return true;
    }
    return false;
}

static int hex4(const char *p)
{
    int v = 0;
    for (int i = 0; i < 4; i++) {
        char h = p[i];
        int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | d;
    }
    return v;
}

/* A JSON string, decoded into buf (NUL-terminated; NULL: skipped). False when it is not a
 * valid string or does not fit. */
static bool read_string(Cur *c, char *buf, size_t cap)
{
    if (!take(c, '"')) return false;
    size_t n = 0;
    while (c->p < c->end && *c->p != '"') {
        unsigned char ch = (unsigned char)*c->p++;
        unsigned long cp = ch;
        if (ch < 0x20) return false;
        if (ch == '\\') {
            if (c->p >= c->end) return false;
            char e = *c->p++;
            switch (e) {
            case '"': case '\\': case '/': cp = (unsigned char)e; break;
            case 'b': cp = '\b'; break;
            case 'f': cp = '\f'; break;
            case 'n': cp = '\n'; break;
            case 'r': cp = '\r'; break;
            case 't': cp = '\t'; break;
            case 'u': {
                int h = c->end - c->p >= 4 ? hex4(c->p) : -1;
                if (h < 0) return false;
                c->p += 4;
                cp = (unsigned long)h;
                if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
                    int l = c->end - c->p >= 6 && c->p[0] == '\\' && c->p[1] == 'u' ? hex4(c->p + 2) : -1;
                    if (l < 0xDC00 || l >= 0xE000) return false;
                    c->p += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + ((unsigned long)l - 0xDC00);
                } else if (cp >= 0xDC00 && cp < 0xE000) {
                    return false;
                }
                break;
            }
            default: return false;
            }
        }
        /* UTF-8 of the code point (raw bytes of the file pass as they are) */
        unsigned char u[4];
        int len = 0;
        if (ch != '\\' || cp < 0x80) u[len++] = (unsigned char)cp;
        else if (cp < 0x800) {
            u[len++] = (unsigned char)(0xC0 | cp >> 6);
            u[len++] = (unsigned char)(0x80 | (cp & 0x3F));
        } else if (cp < 0x10000) {
            u[len++] = (unsigned char)(0xE0 | cp >> 12);
            u[len++] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
            u[len++] = (unsigned char)(0x80 | (cp & 0x3F));
        } else {
            u[len++] = (unsigned char)(0xF0 | cp >> 18);
            u[len++] = (unsigned char)(0x80 | (cp >> 12 & 0x3F));
            u[len++] = (unsigned char)(0x80 | (cp >> 6 & 0x3F));
            u[len++] = (unsigned char)(0x80 | (cp & 0x3F));
        }
        if (buf) {
            if (n + (size_t)len >= cap) return false;
            memcpy(buf + n, u, (size_t)len);
        }
        n += (size_t)len;
    }
    if (c->p >= c->end) return false;
    c->p++;
    if (buf) buf[n] = 0;
    return true;
}

static bool read_uint(Cur *c, uint64_t *v)
{
    skip_ws(c);
    if (c->p >= c->end || *c->p < '0' || *c->p > '9') return false;
    uint64_t x = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        unsigned d = (unsigned)(*c->p++ - '0');
        if (x > (UINT64_MAX - d) / 10) return false;
        x = x * 10 + d;
    }
    *v = x;
    return true;
}

/* Skips any JSON value, nested up to a fixed depth (a safetensors header nests two). */
static bool skip_value(Cur *c, int depth)
{
    skip_ws(c);
    if (c->p >= c->end || depth > 16) return false;
    char ch = *c->p;
    if (ch == '"') return read_string(c, NULL, 0);
    if (ch == '{' || ch == '[') {
        const char close = ch == '{' ? '}' : ']';
        c->p++;
        if (take(c, close)) return true;
        do {
            if (ch == '{' && (!read_string(c, NULL, 0) || !take(c, ':'))) return false;
            if (!skip_value(c, depth + 1)) return false;
        } while (take(c, ','));
        return take(c, close);
    }
    /* a number, true, false or null */
    const char *from = c->p;
    while (c->p < c->end && ((*c->p && strchr("+-.eE", *c->p)) || (*c->p >= '0' && *c->p <= '9') || (*c->p >= 'a' && *c->p <= 'z'))) c->p++;
    return c->p > from;
}

/* One member of an object: *first says whether it is the first. 1: key and the value's
 * cursor (positioned at it, which the walk then skips); 0: the object's end; -1: bad JSON. */
typedef struct {
    Cur c;
    bool first;
} Walk;

static int walk_next(Walk *w, char *key, size_t cap, Cur *value)
{
    if (w->first) {
        w->first = false;
        if (take(&w->c, '}')) return 0;
    } else {
        if (take(&w->c, '}')) return 0;
        if (!take(&w->c, ',')) return -1;
    }
    if (!read_string(&w->c, key, cap) || !take(&w->c, ':')) return -1;
    skip_ws(&w->c);
    *value = w->c;
    return skip_value(&w->c, 1) ? 1 : -1;
}

static bool walk_start(Walk *w, Cur c)
{
    w->c = c;
    w->first = true;
    return take(&w->c, '{');
}

/* ---- the file ---- */

typedef struct {
    Cur json;                    /* the header */
    const unsigned char *data;   /* the tensors' bytes */
    uint64_t data_size;
    const char *name;            /* for messages */
} File;

typedef struct {
    char dtype_text[24];
    int dtype; /* krt_dtype, -1: one the model cannot have */
    int rank;
    int64_t dims[KRT_MAX_RANK];
    uint64_t begin, end;
} Tensor;

static bool read_tensor(Cur c, Tensor *t)
{
    Walk w;
    char key[32];
    Cur v;
    bool has_dtype = false, has_shape = false, has_offsets = false;
    if (!walk_start(&w, c)) return false;
    int r;
    while ((r = walk_next(&w, key, sizeof key, &v)) == 1) {
        if (!strcmp(key, "dtype")) {
            if (!read_string(&v, t->dtype_text, sizeof t->dtype_text)) return false;
            t->dtype = -1;
            for (int d = 0; d < KRT_DTYPE_COUNT; d++)
                if (!strcmp(t->dtype_text, st_dtype[d])) t->dtype = d;
            has_dtype = true;
        } else if (!strcmp(key, "shape")) {
            t->rank = 0;
            if (!take(&v, '[')) return false;
            if (!take(&v, ']')) {
                do {
                    uint64_t d;
                    if (t->rank >= KRT_MAX_RANK || !read_uint(&v, &d) || d > (uint64_t)INT64_MAX) return false;
                    t->dims[t->rank++] = (int64_t)d;
                } while (take(&v, ','));
                if (!take(&v, ']')) return false;
            }
            has_shape = true;
        } else if (!strcmp(key, "data_offsets")) {
            if (!take(&v, '[') || !read_uint(&v, &t->begin) || !take(&v, ',') || !read_uint(&v, &t->end) || !take(&v, ']')) return false;
            has_offsets = true;
        }
    }
    return r == 0 && has_dtype && has_shape && has_offsets;
}

/* The header's framing: an 8-byte little-endian length, then that many bytes of JSON. */
static int open_file(const void *bytes, size_t size, const char *name, File *f, char *msg, size_t cap)
{
    const unsigned char *b = bytes;
    if (!b) return kiln_lib_fail(msg, cap, KILN_LIB_EINVAL, "%s: the buffer is NULL", name);
    if (size < 8) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: %zu bytes: not a safetensors file (truncated)", name, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | b[i];
    if (hlen < 2 || hlen > size - 8)
        return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: its header is %llu bytes, the buffer %zu: not a safetensors file, or truncated",
                             name, (unsigned long long)hlen, size);
    f->json.p = (const char *)b + 8;
    f->json.end = f->json.p + hlen;
    f->data = b + 8 + hlen;
    f->data_size = size - 8 - hlen;
    f->name = name;
    return KILN_LIB_OK;
}

static uint64_t tensor_bytes(const Tensor *t)
{
    uint64_t n = t->dtype >= 0 ? dtype_bytes[t->dtype] : 0;
    for (int d = 0; d < t->rank; d++) {
        if (t->dims[d] && n > UINT64_MAX / (uint64_t)t->dims[d]) return UINT64_MAX;
        n *= (uint64_t)t->dims[d];
    }
    return n;
}

/* Every member of the header well-formed: tensors with known dtypes, their bytes inside
 * the buffer and of their shape's size; __metadata__ an object of strings. */
static int check_header(const File *f, char *msg, size_t cap)
{
    Walk w;
    char key[NAME_CAP];
    Cur v;
    int r;
    if (!walk_start(&w, f->json)) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: the header is not a JSON object", f->name);
    while ((r = walk_next(&w, key, sizeof key, &v)) == 1) {
        if (!strcmp(key, "__metadata__")) {
            Walk m;
            char mk[NAME_CAP];
            Cur mv;
            int q;
            if (!walk_start(&m, v)) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: __metadata__ is not an object", f->name);
            while ((q = walk_next(&m, mk, sizeof mk, &mv)) == 1)
                if (!read_string(&mv, NULL, 0)) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: __metadata__ '%s' is not a string", f->name, mk);
            if (q < 0) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: __metadata__ is not valid JSON", f->name);
            continue;
        }
        Tensor t;
        if (!read_tensor(v, &t))
            return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: tensor '%s': not a dtype, shape and data_offsets", f->name, key);
        if (t.dtype < 0) continue; /* reported as not the model's, or of another dtype, below */
        if (t.begin > t.end || t.end > f->data_size)
            return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: tensor '%s' lies at bytes [%llu, %llu) of %llu: the file is truncated or corrupted",
                                 f->name, key, (unsigned long long)t.begin, (unsigned long long)t.end, (unsigned long long)f->data_size);
        if (t.end - t.begin != tensor_bytes(&t))
            return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: tensor '%s' has %llu bytes, its dtype and shape take %llu", f->name, key,
                                 (unsigned long long)(t.end - t.begin), (unsigned long long)tensor_bytes(&t));
    }
    if (r < 0) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: the header is not valid JSON (a corrupted or foreign file)", f->name);
    return KILN_LIB_OK;
}

/* Tensor `name`: how many times the header has it (the last one in *t). */
static int find_tensor(const File *f, const char *name, Tensor *t)
{
    Walk w;
    char key[NAME_CAP];
    Cur v;
    int n = 0;
    walk_start(&w, f->json);
    while (walk_next(&w, key, sizeof key, &v) == 1)
        if (strcmp(key, "__metadata__") && !strcmp(key, name) && read_tensor(v, t)) n++;
    return n;
}

/* The metadata's "crc32:NAME" as a number: 1, 0 when there is none, -1 when it is not 8
 * hexadecimal digits. */
static int find_crc(const File *f, const char *name, uint32_t *crc)
{
    Walk w, m;
    char key[NAME_CAP], value[16];
    Cur v, mv;
    walk_start(&w, f->json);
    while (walk_next(&w, key, sizeof key, &v) == 1) {
        if (strcmp(key, "__metadata__")) continue;
        walk_start(&m, v);
        while (walk_next(&m, key, sizeof key, &mv) == 1) {
            if (strncmp(key, "crc32:", 6) || strcmp(key + 6, name)) continue;
            if (!read_string(&mv, value, sizeof value) || strlen(value) != 8) return -1;
            int hi = hex4(value), lo = hex4(value + 4);
            if (hi < 0 || lo < 0) return -1;
            *crc = (uint32_t)hi << 16 | (uint32_t)lo;
            return 1;
        }
    }
    return 0;
}

/* CRC-32 (zlib's), with a table on the caller's stack: no static state. */
static uint32_t crc32_of(const uint32_t *table, const unsigned char *p, uint64_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (uint64_t i = 0; i < n; i++) c = table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static void shape_text(char *buf, size_t cap, const char *dtype, int rank, const int64_t *dims)
{
    size_t o = 0;
    int w = snprintf(buf, cap, "%s[", dtype);
    o = w > 0 ? (size_t)w : 0;
    for (int d = 0; d < rank && o < cap; d++) {
        w = snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)dims[d]);
        o += w > 0 ? (size_t)w : 0;
    }
    if (o < cap) snprintf(buf + o, cap - o, "]");
}

int kiln_lib_bind(const kiln_model *m, unsigned char *weights, const void *file, size_t size, const char *name, char *msg, size_t cap)
{
    File f = {{NULL, NULL}, NULL, 0, name};
    int rc = open_file(file, size, name, &f, msg, cap);
    if (rc || (rc = check_header(&f, msg, cap))) return rc;
    uint32_t table[256];
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        table[i] = c;
    }
    /* every tensor of the model, once, of its dtype and shape, matching its checksum */
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param *p = &m->params[i];
        Tensor t;
        int n = find_tensor(&f, p->name, &t);
        if (n == 0)
            return kiln_lib_fail(msg, cap, KILN_LIB_EMISMATCH, "%s: no tensor '%s' (the model's %s)", name, p->name,
                                 p->trainable ? "parameter" : "buffer");
        if (n > 1) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: tensor '%s' is in the header %d times", name, p->name, n);
        bool ok = t.dtype == (int)p->dtype && t.rank == p->rank;
        for (int d = 0; ok && d < p->rank; d++) ok = t.dims[d] == p->dims[d];
        if (!ok) {
            char want[160], got[160];
            shape_text(want, sizeof want, dtype_name[p->dtype], p->rank, p->dims);
            shape_text(got, sizeof got, t.dtype >= 0 ? dtype_name[t.dtype] : t.dtype_text, t.rank, t.dims);
            return kiln_lib_fail(msg, cap, KILN_LIB_EMISMATCH, "%s: tensor '%s' is %s, the model's is %s", name, p->name, got, want);
        }
        uint32_t want;
        int has = find_crc(&f, p->name, &want);
        if (has < 0) return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT, "%s: __metadata__: the checksum of '%s' is not 8 hexadecimal digits", name, p->name);
        if (has) {
            uint32_t got = crc32_of(table, f.data + t.begin, t.end - t.begin);
            if (got != want)
                return kiln_lib_fail(msg, cap, KILN_LIB_EFORMAT,
                                     "%s: tensor '%s' does not match its checksum (CRC-32 %08x, stored %08x): the file is corrupted", name, p->name,
                                     (unsigned)got, (unsigned)want);
        }
    }
    /* and nothing else */
    Walk w;
    char key[NAME_CAP];
    Cur v;
    walk_start(&w, f.json);
    while (walk_next(&w, key, sizeof key, &v) == 1) {
        if (!strcmp(key, "__metadata__")) continue;
        int k = 0;
        while (k < m->nparams && strcmp(m->params[k].name, key)) k++;
        if (k == m->nparams) return kiln_lib_fail(msg, cap, KILN_LIB_EMISMATCH, "%s: tensor '%s' is not a parameter or buffer of the model", name, key);
    }
    const int64_t buffers_at = kiln_lib_buffers_at(m);
    for (int i = 0; i < m->nparams; i++) {
        const kiln_param *p = &m->params[i];
        Tensor t;
        find_tensor(&f, p->name, &t);
        unsigned char *dst = p->trainable ? weights + p->offset * (int64_t)sizeof(float) : weights + buffers_at + p->offset;
        memcpy(dst, f.data + t.begin, (size_t)(t.end - t.begin));
    }
    return KILN_LIB_OK;
}
