/* test_rt_tboard.c — TensorBoard event files (runtime/tboard.c): CRC32C against its known
 * vectors and a bitwise reference, TFRecord framing byte for byte, the events' protobuf
 * bytes, and a full disk (a file-size limit) reported once with the file left readable.
 * That TensorBoard itself reads the files is tests/test_train_run.c's check. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

static char g_dir[64];

static void setup(void)
{
    strcpy(g_dir, "/tmp/kiln_tboard_XXXXXX");
    cr_assert(mkdtemp(g_dir), "mkdtemp");
}

static void teardown(void) { support_remove_dir(g_dir); }

TestSuite(tboard, .init = setup, .fini = teardown);

/* CRC32C bit by bit, from the polynomial: the reference for the table-driven one. */
static uint32_t crc32c_bitwise(const unsigned char *p, size_t n)
{
    uint32_t crc = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int k = 0; k < 8; k++) crc = crc & 1 ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
    }
    return ~crc;
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

static uint64_t le64(const unsigned char *p) { return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32; }

static uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

Test(tboard, crc32c_known_vectors)
{
    cr_expect_eq(krt_crc32c(0, "123456789", 9), 0xE3069283u);
    cr_expect_eq(krt_crc32c(0, "", 0), 0u);
    /* RFC 3720 (iSCSI), B.4: 32 bytes of zeros, of ones, ascending, descending. */
    unsigned char b[32];
    memset(b, 0, 32);
    cr_expect_eq(krt_crc32c(0, b, 32), 0x8A9136AAu);
    memset(b, 0xff, 32);
    cr_expect_eq(krt_crc32c(0, b, 32), 0x62A8AB43u);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)i;
    cr_expect_eq(krt_crc32c(0, b, 32), 0x46DD794Eu);
    for (int i = 0; i < 32; i++) b[i] = (unsigned char)(31 - i);
    cr_expect_eq(krt_crc32c(0, b, 32), 0x113FDB5Cu);
    /* Every byte value, split anywhere, as the bitwise reference. */
    unsigned char all[1000];
    for (int i = 0; i < 1000; i++) all[i] = (unsigned char)(i * 7 + i / 256);
    cr_expect_eq(krt_crc32c(0, all, 1000), crc32c_bitwise(all, 1000));
    cr_expect_eq(krt_crc32c(krt_crc32c(0, all, 333), all + 333, 667), crc32c_bitwise(all, 1000));
    cr_expect_eq(krt_crc32c_masked("123456789", 9), masked(0xE3069283u));
}

Test(tboard, a_record_is_framed_as_tfrecord)
{
    const char data[] = "brain";
    unsigned char h[12], f[4];
    krt_tfrecord_frame(5, data, h, f);
    const unsigned char len[8] = {5, 0, 0, 0, 0, 0, 0, 0};
    cr_expect_eq(memcmp(h, len, 8), 0, "the length, uint64 little-endian");
    cr_expect_eq(le32(h + 8), masked(crc32c_bitwise(len, 8)));
    cr_expect_eq(le32(f), masked(crc32c_bitwise((const unsigned char *)data, 5)));
    /* A length of more than one byte: its low byte first. */
    unsigned char big[300] = {1};
    krt_tfrecord_frame(300, big, h, f);
    cr_expect(le64(h) == 300 && h[0] == 0x2c && h[1] == 1, "%02x %02x", h[0], h[1]);
    cr_expect_eq(le32(f), masked(crc32c_bitwise(big, 300)));
}

/* The records of an event file, each checked for its frame: their data, in order. */
typedef struct {
    int n;
    unsigned char *data[64];
    size_t len[64];
    unsigned char *file;
    size_t size;
} Records;

static void read_records(const char *path, Records *r)
{
    memset(r, 0, sizeof *r);
    FILE *fp = fopen(path, "rb");
    cr_assert(fp, "%s", path);
    fseek(fp, 0, SEEK_END);
    r->size = (size_t)ftell(fp);
    fseek(fp, 0, SEEK_SET);
    r->file = malloc(r->size + 1);
    cr_assert_eq(fread(r->file, 1, r->size, fp), r->size);
    fclose(fp);
    for (size_t at = 0; at < r->size;) {
        cr_assert(at + 12 <= r->size && r->n < 64, "a torn header at byte %zu", at);
        uint64_t n = le64(r->file + at);
        cr_assert_eq(le32(r->file + at + 8), masked(crc32c_bitwise(r->file + at, 8)), "header CRC of record %d", r->n);
        cr_assert(at + 12 + n + 4 <= r->size, "record %d is torn", r->n);
        unsigned char *d = r->file + at + 12;
        cr_assert_eq(le32(d + n), masked(crc32c_bitwise(d, (size_t)n)), "data CRC of record %d", r->n);
        r->data[r->n] = d, r->len[r->n++] = (size_t)n;
        at += 12 + n + 4;
    }
}

/* The one event file in g_dir/sub. */
static const char *event_file(const char *sub)
{
    static char path[512];
    char dir[256];
    snprintf(dir, sizeof dir, "%s/%s", g_dir, sub);
    const char *names = support_listing(dir);
    cr_assert(!strncmp(names, "events.out.tfevents.", 20) && !strchr(names, '|'), "%s: %s", dir, names);
    snprintf(path, sizeof path, "%s/%s", dir, names);
    return path;
}

/* The bytes of an Event after its wall_time (field 1, a double: key 0x09 and 8 bytes). */
static void expect_event(const Records *r, int k, const unsigned char *want, size_t n)
{
    cr_assert(k < r->n);
    cr_expect_eq(r->data[k][0], 0x09, "record %d starts with wall_time", k);
    cr_expect_eq(r->len[k], 9 + n, "record %d: %zu bytes, want %zu", k, r->len[k], 9 + n);
    cr_expect(r->len[k] == 9 + n && !memcmp(r->data[k] + 9, want, n), "record %d's bytes", k);
}

Test(tboard, events_are_the_protobufs_summarywriter_writes)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/runs/a", g_dir); /* parents created */
    krt_tboard *w;
    krt_error err;
    cr_assert_eq(krt_tboard_open(dir, &w, &err), KRT_OK, "%s", err.msg);
    krt_tboard_scalar(w, 7, "a/b", 0.5);
    krt_tboard_text(w, 300, "s", "hi");
    krt_tboard_restart(w, 21);
    krt_tboard_code(w, 1, "c", "a\n*b*\n");
    cr_assert_eq(krt_tboard_close(w, &err), KRT_OK, "%s", err.msg);
    Records r;
    read_records(event_file("runs/a"), &r);
    cr_assert_eq(r.n, 5);
    /* file_version (field 3) "brain.Event:2". */
    static const unsigned char version[] = {0x1a, 13, 'b', 'r', 'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't', ':', '2'};
    expect_event(&r, 0, version, sizeof version);
    /* step 7 (field 2), summary (5) { value (1) { tag (1) "a/b", simple_value (2) 0.5f } }. */
    static const unsigned char scalar[] = {0x10, 7, 0x2a, 12, 0x0a, 10, 0x0a, 3, 'a', '/', 'b', 0x15, 0, 0, 0, 0x3f};
    expect_event(&r, 1, scalar, sizeof scalar);
    /* step 300 (a two-byte varint), summary { value { tag "s", metadata (9) { plugin_data (1)
     * { plugin_name (1) "text" } }, tensor (8) { dtype (1) DT_STRING = 7, tensor_shape (2)
     * { dim (2) { size (1) 1 } }, string_val (8) "hi" } } }. */
    static const unsigned char text[] = {0x10, 0xac, 0x02, 0x2a, 29,  0x0a, 27,   0x0a, 1,    's',  0x4a, 8,   0x0a, 6,   0x0a, 4,   't',
                                         'e',  'x',  't',  0x42, 12,  0x08, 7,    0x12, 4,    0x12, 2,    0x08, 1,   0x42, 2,   'h', 'i'};
    expect_event(&r, 2, text, sizeof text);
    /* step 21, session_log (7) { status (1) START = 1 }. */
    static const unsigned char restart[] = {0x10, 21, 0x3a, 2, 0x08, 1};
    expect_event(&r, 3, restart, sizeof restart);
    /* A code block: each line indented by four spaces, the last (empty) one too. */
    static const char code[] = "\x42\x12    a\n    *b*\n    ";
    cr_expect(r.len[4] > sizeof code && !memcmp(r.data[4] + r.len[4] - (sizeof code - 1), code, sizeof code - 1), "the code block");
    free(r.file);
}

/* TensorBoard reads a directory's files in name order: a resumed run's file must sort
 * after the run's, even when written within the same second by a smaller process id. */
Test(tboard, a_later_file_sorts_after_the_earlier_ones)
{
    char path[256];
    long later = (long)time(NULL) + 5; /* a clock set back, or a run of the same second */
    snprintf(path, sizeof path, "%s/events.out.tfevents.%010ld.host.99999999", g_dir, later);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
    krt_tboard *w;
    krt_error err;
    cr_assert_eq(krt_tboard_open(g_dir, &w, &err), KRT_OK, "%s", err.msg);
    const char *name = strrchr(krt_tboard_path(w), '/') + 1;
    cr_expect(strcmp(name, path + strlen(g_dir) + 1) > 0, "%s sorts before %s", name, path);
    cr_expect_eq(strtol(name + 20, NULL, 10), later + 1, "%s", name);
    krt_tboard_close(w, NULL);
}

Test(tboard, a_directory_that_cannot_be_made_is_an_error)
{
    char path[256];
    snprintf(path, sizeof path, "%s/file", g_dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fclose(f);
    krt_tboard *w = NULL;
    krt_error err;
    cr_expect_neq(krt_tboard_open(path, &w, &err), KRT_OK);
    cr_expect(strstr(err.msg, path) && !w, "%s", err.msg);
    snprintf(path, sizeof path, "%s/file/sub", g_dir);
    cr_expect_neq(krt_tboard_open(path, &w, &err), KRT_OK);
    cr_expect(strstr(err.msg, "cannot create the directory"), "%s", err.msg);
}

/* A write beyond the file-size limit (as a full disk) fails once; the file is cut back to
 * its whole records, and what follows is dropped without another report. */
Test(tboard, a_failed_write_is_reported_once_and_leaves_whole_records)
{
    signal(SIGXFSZ, SIG_IGN); /* EFBIG instead of the signal, as the training program */
    struct rlimit lim = {1000, 1000};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    krt_tboard *w;
    krt_error err;
    cr_assert_eq(krt_tboard_open(g_dir, &w, &err), KRT_OK, "%s", err.msg);
    krt_tboard_scalar(w, 1, "train/loss", 1.0);
    cr_assert_eq(krt_tboard_flush(w, &err), KRT_OK, "%s", err.msg);
    for (int i = 2; i < 100; i++) krt_tboard_scalar(w, i, "train/loss", 1.0 / i);
    cr_expect_neq(krt_tboard_flush(w, &err), KRT_OK);
    cr_expect(strstr(err.msg, "cannot write TensorBoard events") && strstr(err.msg, "events.out.tfevents."), "%s", err.msg);
    krt_tboard_scalar(w, 100, "train/loss", 0.01);
    cr_expect_eq(krt_tboard_flush(w, &err), KRT_OK, "reported once");
    cr_expect_eq(krt_tboard_close(w, &err), KRT_OK, "reported once");
    Records r;
    read_records(event_file("."), &r);
    cr_expect_eq(r.n, 2, "the version and the first scalar: %d records", r.n);
    free(r.file);
}
