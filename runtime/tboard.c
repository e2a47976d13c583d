/* tboard.c — TensorBoard event files, as torch.utils.tensorboard's SummaryWriter writes
 * them, for the training program's --tensorboard DIR.
 *
 * A file DIR/events.out.tfevents.<seconds>.<host>.<pid> of TFRecords (little-endian
 * uint64 length, masked CRC32C of the length, the data, masked CRC32C of the data), each
 * an `Event` protobuf (tensorboard/compat/proto/event.proto): first the file_version
 * "brain.Event:2" event, then events of wall_time, step and a Summary of one Value: a
 * scalar's simple_value, or a text as the text plugin's DT_STRING tensor (what
 * SummaryWriter.add_text writes); and a SessionLog START where a resumed run begins. The
 * few messages are encoded here by hand: a varint and length-delimited encoder is shorter
 * than a protobuf dependency (protobuf-c) and its generated code.
 *
 * Events collect in memory and are written when flushed. A write that fails (full disk,
 * file-size limit) cuts the file back to its last whole record, so that it stays readable,
 * reports the failure once and turns the writer off: the caller warns and trains on. */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

/* ---- CRC32C (Castagnoli, reflected polynomial 0x82F63B78), as TFRecord frames use ---- */

/* table[i]: the CRC of byte i alone, the reflected polynomial applied 8 times. */
static const uint32_t crc32c_table[256] = {
    0x00000000, 0xf26b8303, 0xe13b70f7, 0x1350f3f4, 0xc79a971f, 0x35f1141c,
    0x26a1e7e8, 0xd4ca64eb, 0x8ad958cf, 0x78b2dbcc, 0x6be22838, 0x9989ab3b,
    0x4d43cfd0, 0xbf284cd3, 0xac78bf27, 0x5e133c24, 0x105ec76f, 0xe235446c,
    0xf165b798, 0x030e349b, 0xd7c45070, 0x25afd373, 0x36ff2087, 0xc494a384,
    0x9a879fa0, 0x68ec1ca3, 0x7bbcef57, 0x89d76c54, 0x5d1d08bf, 0xaf768bbc,
    0xbc267848, 0x4e4dfb4b, 0x20bd8ede, 0xd2d60ddd, 0xc186fe29, 0x33ed7d2a,
    0xe72719c1, 0x154c9ac2, 0x061c6936, 0xf477ea35, 0xaa64d611, 0x580f5512,
    0x4b5fa6e6, 0xb93425e5, 0x6dfe410e, 0x9f95c20d, 0x8cc531f9, 0x7eaeb2fa,
    0x30e349b1, 0xc288cab2, 0xd1d83946, 0x23b3ba45, 0xf779deae, 0x05125dad,
    0x1642ae59, 0xe4292d5a, 0xba3a117e, 0x4851927d, 0x5b016189, 0xa96ae28a,
    0x7da08661, 0x8fcb0562, 0x9c9bf696, 0x6ef07595, 0x417b1dbc, 0xb3109ebf,
    0xa0406d4b, 0x522bee48, 0x86e18aa3, 0x748a09a0, 0x67dafa54, 0x95b17957,
    0xcba24573, 0x39c9c670, 0x2a993584, 0xd8f2b687, 0x0c38d26c, 0xfe53516f,
    0xed03a29b, 0x1f682198, 0x5125dad3, 0xa34e59d0, 0xb01eaa24, 0x42752927,
    0x96bf4dcc, 0x64d4cecf, 0x77843d3b, 0x85efbe38, 0xdbfc821c, 0x2997011f,
    0x3ac7f2eb, 0xc8ac71e8, 0x1c661503, 0xee0d9600, 0xfd5d65f4, 0x0f36e6f7,
    0x61c69362, 0x93ad1061, 0x80fde395, 0x72966096, 0xa65c047d, 0x5437877e,
    0x4767748a, 0xb50cf789, 0xeb1fcbad, 0x197448ae, 0x0a24bb5a, 0xf84f3859,
    0x2c855cb2, 0xdeeedfb1, 0xcdbe2c45, 0x3fd5af46, 0x7198540d, 0x83f3d70e,
    0x90a324fa, 0x62c8a7f9, 0xb602c312, 0x44694011, 0x5739b3e5, 0xa55230e6,
    0xfb410cc2, 0x092a8fc1, 0x1a7a7c35, 0xe811ff36, 0x3cdb9bdd, 0xceb018de,
    0xdde0eb2a, 0x2f8b6829, 0x82f63b78, 0x709db87b, 0x63cd4b8f, 0x91a6c88c,
    0x456cac67, 0xb7072f64, 0xa457dc90, 0x563c5f93, 0x082f63b7, 0xfa44e0b4,
    0xe9141340, 0x1b7f9043, 0xcfb5f4a8, 0x3dde77ab, 0x2e8e845f, 0xdce5075c,
    0x92a8fc17, 0x60c37f14, 0x73938ce0, 0x81f80fe3, 0x55326b08, 0xa759e80b,
    0xb4091bff, 0x466298fc, 0x1871a4d8, 0xea1a27db, 0xf94ad42f, 0x0b21572c,
    0xdfeb33c7, 0x2d80b0c4, 0x3ed04330, 0xccbbc033, 0xa24bb5a6, 0x502036a5,
    0x4370c551, 0xb11b4652, 0x65d122b9, 0x97baa1ba, 0x84ea524e, 0x7681d14d,
    0x2892ed69, 0xdaf96e6a, 0xc9a99d9e, 0x3bc21e9d, 0xef087a76, 0x1d63f975,
    0x0e330a81, 0xfc588982, 0xb21572c9, 0x407ef1ca, 0x532e023e, 0xa145813d,
    0x758fe5d6, 0x87e466d5, 0x94b49521, 0x66df1622, 0x38cc2a06, 0xcaa7a905,
    0xd9f75af1, 0x2b9cd9f2, 0xff56bd19, 0x0d3d3e1a, 0x1e6dcdee, 0xec064eed,
    0xc38d26c4, 0x31e6a5c7, 0x22b65633, 0xd0ddd530, 0x0417b1db, 0xf67c32d8,
    0xe52cc12c, 0x1747422f, 0x49547e0b, 0xbb3ffd08, 0xa86f0efc, 0x5a048dff,
    0x8ecee914, 0x7ca56a17, 0x6ff599e3, 0x9d9e1ae0, 0xd3d3e1ab, 0x21b862a8,
    0x32e8915c, 0xc083125f, 0x144976b4, 0xe622f5b7, 0xf5720643, 0x07198540,
    0x590ab964, 0xab613a67, 0xb831c993, 0x4a5a4a90, 0x9e902e7b, 0x6cfbad78,
    0x7fab5e8c, 0x8dc0dd8f, 0xe330a81a, 0x115b2b19, 0x020bd8ed, 0xf0605bee,
    0x24aa3f05, 0xd6c1bc06, 0xc5914ff2, 0x37faccf1, 0x69e9f0d5, 0x9b8273d6,
    0x88d28022, 0x7ab90321, 0xae7367ca, 0x5c18e4c9, 0x4f48173d, 0xbd23943e,
    0xf36e6f75, 0x0105ec76, 0x12551f82, 0xe03e9c81, 0x34f4f86a, 0xc69f7b69,
    0xd5cf889d, 0x27a40b9e, 0x79b737ba, 0x8bdcb4b9, 0x988c474d, 0x6ae7c44e,
    0xbe2da0a5, 0x4c4623a6, 0x5f16d052, 0xad7d5351,
};

uint32_t krt_crc32c(uint32_t crc, const void *data, size_t n)
{
    const uint32_t *t = crc32c_table;
    const unsigned char *p = data;
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = t[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
    return ~crc;
}

uint32_t krt_crc32c_masked(const void *data, size_t n)
{
    uint32_t crc = krt_crc32c(0, data, n);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static void put_le(unsigned char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++) p[i] = (unsigned char)(v >> 8 * i);
}

void krt_tfrecord_frame(uint64_t n, const void *data, unsigned char header[12], unsigned char footer[4])
{
    put_le(header, n, 8);
    put_le(header + 8, krt_crc32c_masked(header, 8), 4);
    put_le(footer, krt_crc32c_masked(data, (size_t)n), 4);
}

/* ---- protobuf encoding: a growing byte buffer ---- */

typedef struct {
    unsigned char *p;
    size_t n, cap;
    bool oom;
} Buf;

static void put(Buf *b, const void *data, size_t n)
{
    if (b->oom) return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n) cap *= 2;
        unsigned char *p = realloc(b->p, cap);
        if (!p) {
            b->oom = true;
            return;
        }
        b->p = p, b->cap = cap;
    }
    memcpy(b->p + b->n, data, n);
    b->n += n;
}

static void varint(Buf *b, uint64_t v)
{
    unsigned char t[10];
    int n = 0;
    do {
        t[n] = (unsigned char)(v & 0x7f);
        v >>= 7;
        if (v) t[n] |= 0x80;
        n++;
    } while (v);
    put(b, t, (size_t)n);
}

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_BYTES = 2, WIRE_FIXED32 = 5 };

static void key(Buf *b, int field, int wire) { varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void field_bytes(Buf *b, int field, const void *data, size_t n)
{
    key(b, field, WIRE_BYTES);
    varint(b, n);
    put(b, data, n);
}

static void field_string(Buf *b, int field, const char *s) { field_bytes(b, field, s, strlen(s)); }

/* A nested message: its bytes are in `m` (encoded first, as its length precedes them). */
static void field_message(Buf *b, int field, const Buf *m)
{
    if (m->oom) b->oom = true;
    field_bytes(b, field, m->p, m->n);
}

static void field_varint(Buf *b, int field, uint64_t v)
{
    key(b, field, WIRE_VARINT);
    varint(b, v);
}

/* A fixed-width field: the value's n bytes (4 or 8), little-endian. */
static void field_fixed(Buf *b, int field, uint64_t bits, int n)
{
    unsigned char t[8];
    put_le(t, bits, n);
    key(b, field, n == 8 ? WIRE_FIXED64 : WIRE_FIXED32);
    put(b, t, (size_t)n);
}

static void field_double(Buf *b, int field, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    field_fixed(b, field, bits, 8);
}

static void field_float(Buf *b, int field, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    field_fixed(b, field, bits, 4);
}

/* Field numbers of event.proto, summary.proto, tensor.proto and tensor_shape.proto. */
enum {
    EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5, EVENT_SESSION_LOG = 7,
    SESSION_LOG_STATUS = 1, SESSION_LOG_START = 1,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1, VALUE_SIMPLE_VALUE = 2, VALUE_TENSOR = 8, VALUE_METADATA = 9,
    METADATA_PLUGIN_DATA = 1, PLUGIN_NAME = 1,
    TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8, DT_STRING = 7,
    SHAPE_DIM = 2, DIM_SIZE = 1,
};

/* ---- the writer ---- */

struct krt_tboard {
    int fd;
    char path[4096];
    Buf pending;      /* framed records not yet written */
    off_t written;    /* the file's length: whole records only */
    bool failed;      /* a write failed: the writer does nothing more */
    bool oom;         /* an event could not be encoded for want of memory */
    double last_flush;
};

static double wall_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Frames one encoded Event into the pending records. */
static void add_record(krt_tboard *w, Buf *event)
{
    if (event->oom) w->oom = true;
    unsigned char header[12], footer[4];
    if (!w->oom) {
        krt_tfrecord_frame(event->n, event->p, header, footer);
        put(&w->pending, header, 12);
        put(&w->pending, event->p, event->n);
        put(&w->pending, footer, 4);
        if (w->pending.oom) w->oom = true;
    }
    free(event->p);
}

/* An Event of the current wall time and `step`: its fields before the `what` one. */
static Buf event_begin(int64_t step)
{
    Buf e = {0};
    field_double(&e, EVENT_WALL_TIME, wall_now());
    if (step) field_varint(&e, EVENT_STEP, (uint64_t)step);
    return e;
}

/* Creates dir and its parents, as SummaryWriter's os.makedirs(exist_ok=True). */
static krt_status make_dirs(const char *dir, krt_error *err)
{
    char p[4096];
    if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p) return krt_fail(err, KRT_EINVAL, "%s: the path is too long", dir);
    for (char *s = p + 1;; s++) {
        char c = *s;
        if (c != '/' && c) continue;
        *s = 0;
        if (mkdir(p, 0777) && errno != EEXIST) return krt_fail_errno(err, errno, p, "cannot create the directory");
        *s = c;
        if (!c) break;
    }
    struct stat sb;
    if (stat(dir, &sb) || !S_ISDIR(sb.st_mode)) return krt_fail(err, KRT_EIO, "%s: not a directory", dir);
    return krt_ok(err);
}

/* The time in the file's name: now, or a second after the newest event file in dir when
 * that is not earlier (a run resumed within the second). TensorBoard reads a directory's
 * files in the order of their names, and a resumed run's must come after the run's. */
static long name_time(const char *dir)
{
    static const char prefix[] = "events.out.tfevents.";
    long now = (long)time(NULL);
    DIR *d = opendir(dir);
    if (!d) return now;
    for (struct dirent *e; (e = readdir(d));) {
        if (strncmp(e->d_name, prefix, sizeof prefix - 1)) continue;
        long t = strtol(e->d_name + sizeof prefix - 1, NULL, 10);
        if (t >= now && t < now + 1000000) now = t + 1;
    }
    closedir(d);
    return now;
}

krt_status krt_tboard_open(const char *dir, krt_tboard **out, krt_error *err)
{
    *out = NULL;
    krt_status s = make_dirs(dir, err);
    if (s != KRT_OK) return s;
    krt_tboard *w = calloc(1, sizeof *w);
    if (!w) return krt_fail(err, KRT_ENOMEM, "%s: out of memory", dir);
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1)) strcpy(host, "localhost");
    host[sizeof host - 1] = 0;
    long now = name_time(dir);
    /* A name taken (a process of the same id on a machine of the same name) gets a suffix. */
    w->fd = -1;
    for (int k = 0; k < 100 && w->fd < 0; k++) {
        char suffix[16] = "";
        if (k) snprintf(suffix, sizeof suffix, ".%d", k);
        int len = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010ld.%s.%ld%s", dir, now, host, (long)getpid(), suffix);
        if (len >= (int)sizeof w->path) {
            free(w);
            return krt_fail(err, KRT_EINVAL, "%s: the path is too long", dir);
        }
        w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (w->fd < 0 && errno != EEXIST) break;
    }
    if (w->fd < 0) {
        s = krt_fail_errno(err, errno, w->path, "cannot create the TensorBoard event file");
        free(w);
        return s;
    }
    Buf e = event_begin(0);
    field_string(&e, EVENT_FILE_VERSION, "brain.Event:2");
    add_record(w, &e);
    s = krt_tboard_flush(w, err);
    if (s != KRT_OK) { /* no file is left behind */
        unlink(w->path);
        krt_tboard_close(w, NULL);
        return s;
    }
    *out = w;
    return KRT_OK;
}

const char *krt_tboard_path(const krt_tboard *w) { return w->path; }

void krt_tboard_scalar(krt_tboard *w, int64_t step, const char *tag, double value)
{
    if (!w || w->failed) return;
    Buf v = {0}, sum = {0};
    field_string(&v, VALUE_TAG, tag);
    /* Beyond float's range the conversion is undefined: infinity, as it would round. */
    field_float(&v, VALUE_SIMPLE_VALUE, value > FLT_MAX ? INFINITY : value < -FLT_MAX ? -INFINITY : (float)value);
    field_message(&sum, SUMMARY_VALUE, &v);
    Buf e = event_begin(step);
    field_message(&e, EVENT_SUMMARY, &sum);
    free(v.p);
    free(sum.p);
    add_record(w, &e);
}

void krt_tboard_text(krt_tboard *w, int64_t step, const char *tag, const char *text)
{
    if (!w || w->failed) return;
    /* The text plugin's metadata (its PluginData content, TextPluginData of version 0, is
     * empty), a tensor of one string, as SummaryWriter.add_text writes it. */
    Buf plugin = {0}, meta = {0}, dim = {0}, shape = {0}, tensor = {0}, v = {0}, sum = {0};
    field_string(&plugin, PLUGIN_NAME, "text");
    field_message(&meta, METADATA_PLUGIN_DATA, &plugin);
    field_varint(&dim, DIM_SIZE, 1);
    field_message(&shape, SHAPE_DIM, &dim);
    field_varint(&tensor, TENSOR_DTYPE, DT_STRING);
    field_message(&tensor, TENSOR_SHAPE, &shape);
    field_string(&tensor, TENSOR_STRING_VAL, text);
    field_string(&v, VALUE_TAG, tag);
    field_message(&v, VALUE_METADATA, &meta);
    field_message(&v, VALUE_TENSOR, &tensor);
    field_message(&sum, SUMMARY_VALUE, &v);
    Buf e = event_begin(step);
    field_message(&e, EVENT_SUMMARY, &sum);
    Buf *parts[] = {&plugin, &meta, &dim, &shape, &tensor, &v, &sum};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) free(parts[i]->p);
    add_record(w, &e);
}

void krt_tboard_code(krt_tboard *w, int64_t step, const char *tag, const char *text)
{
    if (!w || w->failed) return;
    size_t n = strlen(text), lines = 1;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    char *md = malloc(n + 4 * lines + 1), *p = md;
    if (!md) {
        w->oom = true;
        return;
    }
    for (size_t i = 0; i <= n; i++) {
        if (i == 0 || text[i - 1] == '\n') memcpy(p, "    ", 4), p += 4;
        *p++ = text[i];
    }
    krt_tboard_text(w, step, tag, md);
    free(md);
}

void krt_tboard_restart(krt_tboard *w, int64_t step)
{
    if (!w || w->failed) return;
    Buf log = {0};
    field_varint(&log, SESSION_LOG_STATUS, SESSION_LOG_START);
    Buf e = event_begin(step);
    field_message(&e, EVENT_SESSION_LOG, &log);
    free(log.p);
    add_record(w, &e);
}

/* Writes the pending records; on failure cuts the file back to its whole records. */
krt_status krt_tboard_flush(krt_tboard *w, krt_error *err)
{
    if (!w || w->failed) return krt_ok(err);
    w->last_flush = wall_now();
    if (w->oom) {
        w->failed = true;
        return krt_fail(err, KRT_ENOMEM, "%s: out of memory for TensorBoard events", w->path);
    }
    size_t done = 0;
    while (done < w->pending.n) {
        ssize_t k = write(w->fd, w->pending.p + done, w->pending.n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : ENOSPC;
            w->failed = true;
            /* Back to the whole records; should that fail too, readers stop at the torn one. */
            if (ftruncate(w->fd, w->written)) {
            }
            return krt_fail_errno(err, e, w->path, "cannot write TensorBoard events");
        }
        done += (size_t)k;
    }
    w->written += (off_t)done;
    w->pending.n = 0;
    return krt_ok(err);
}

krt_status krt_tboard_flush_every(krt_tboard *w, double seconds, krt_error *err)
{
    if (!w || w->failed || wall_now() - w->last_flush < seconds) return krt_ok(err);
    return krt_tboard_flush(w, err);
}

krt_status krt_tboard_close(krt_tboard *w, krt_error *err)
{
    if (!w) return krt_ok(err);
    krt_status s = krt_tboard_flush(w, err);
    if (close(w->fd) && s == KRT_OK && !w->failed) s = krt_fail_errno(err, errno, w->path, "cannot write TensorBoard events");
    free(w->pending.p);
    free(w);
    return s;
}
