/* cache_entry.c — cache_entry.h: the entries of kiln's caches on disk (the C pieces'
 * objects, the CUDA kernels' CUBINs): whole files with a footer that proves them whole,
 * written under a temporary name and renamed into place, and a running total of their
 * bytes that keeps the directory within its bound. */
#define _XOPEN_SOURCE 700
#include "cache_entry.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/rt_internal.h" /* the caches' bound and eviction, shared with the runtime's */
#include "pieces.h"

static const char footer_magic[8] = {'K', 'I', 'L', 'N', 'O', 'B', 'J', '1'};

char *cache_dir(const char *sub)
{
    if (krt_cache_max_bytes() <= 0) return NULL;
    const char *cache = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    StrBuf d;
    sb_init(&d);
    if (cache && *cache) sb_printf(&d, "%s/kiln/%s", cache, sub);
    else if (home && *home) sb_printf(&d, "%s/.cache/kiln/%s", home, sub);
    else {
        sb_free(&d);
        return NULL;
    }
    for (char *q = d.data + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(d.data, 0755);
            *q = '/';
        }
    mkdir(d.data, 0755);
    struct stat st;
    if (stat(d.data, &st) != 0 || !S_ISDIR(st.st_mode) || access(d.data, W_OK) != 0) {
        sb_free(&d);
        return NULL;
    }
    return d.data;
}

/* ---- reading and writing files ---- */

char *cache_read_file(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return NULL;
    }
    size_t n = (size_t)st.st_size, got = 0;
    char *b = xmalloc(n + 1);
    while (got < n) {
        ssize_t r = read(fd, b + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != n) {
        free(b);
        return NULL;
    }
    b[n] = 0;
    *len = n;
    return b;
}

static int write_all(int fd, const char *data, size_t len)
{
    while (len) {
        ssize_t w = write(fd, data, len);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return -1;
        data += w;
        len -= (size_t)w;
    }
    return 0;
}

int cache_write_file(const char *path, const char *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    int rc = write_all(fd, data, len);
    if (close(fd) != 0) rc = -1;
    return rc;
}

uint64_t cache_hash64(const void *data, size_t n)
{
    uint64_t h[2] = {0, 0};
    pieces_hash128(data, n, h);
    return h[0];
}

/* A cache entry's object, when its footer says it is whole; *len its length. */
char *cache_entry_read(const char *path, size_t *len, bool elf)
{
    size_t n;
    char *b = cache_read_file(path, &n);
    if (!b) return NULL;
    uint64_t want_len, want_hash;
    if (n < CACHE_ENTRY_FOOTER_BYTES || memcmp(b + n - CACHE_ENTRY_FOOTER_BYTES, footer_magic, 8)) goto bad;
    memcpy(&want_len, b + n - 16, 8);
    memcpy(&want_hash, b + n - 8, 8);
    if (want_len != n - CACHE_ENTRY_FOOTER_BYTES || cache_hash64(b, want_len) != want_hash || want_len < 4 || (elf && memcmp(b, "\177ELF", 4))) goto bad;
    *len = (size_t)want_len;
    return b;
bad:
    free(b);
    unlink(path); /* whole entries are renamed into place: this one will never be right */
    return NULL;
}

/* Writes an entry under a temporary name, then renames it into place. 0 when it did. */
int cache_entry_store(const char *path, const char *obj, size_t len, int idx)
{
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld.%d", path, (long)getpid(), idx);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return -1;
    uint64_t n = len, h = cache_hash64(obj, len);
    char footer[CACHE_ENTRY_FOOTER_BYTES];
    memcpy(footer, footer_magic, 8);
    memcpy(footer + 8, &n, 8);
    memcpy(footer + 16, &h, 8);
    int rc = write_all(fd, obj, len);
    if (!rc) rc = write_all(fd, footer, sizeof footer);
    if (close(fd) != 0) rc = -1;
    if (rc || rename(tmp, path) != 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

/* Counts `added` bytes stored into the cache and keeps it within max. A scan of the whole
 * directory (a stat per entry: 30 ms at 13,000 entries, most of a rebuild after a change
 * of lr) runs only when the running total in dir/.size (bytes, and stores since the last
 * scan) says the bound is passed, every 256 stores (what an estimate misses: entries
 * dropped as damaged, a crashed build's files), or when there is no total yet; it then
 * evicts to 90% of max, so that the next builds need no scan. The total is read and written
 * under an exclusive lock: concurrent builds add up. */
void cache_account(const char *dir, long long added, long long max)
{
    char path[4400];
    snprintf(path, sizeof path, "%s/.size", dir);
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) {
        krt_cache_evict(dir, max);
        return;
    }
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {
    }
    char text[64] = "";
    ssize_t got = pread(fd, text, sizeof text - 1, 0);
    text[got > 0 ? got : 0] = 0;
    long long total = -1, stores = 0;
    if (sscanf(text, "%lld %lld", &total, &stores) != 2 || total < 0 || stores < 0) total = -1;
    long long now_total = total + added;
    if (total < 0 || now_total > max || stores + 1 >= 256) {
        now_total = krt_cache_evict(dir, max - max / 10);
        stores = 0;
    } else {
        stores++;
    }
    int len = snprintf(text, sizeof text, "%lld %lld\n", now_total, stores);
    if (ftruncate(fd, 0) != 0 || pwrite(fd, text, (size_t)len, 0) != len) unlink(path); /* no total: the next build scans */
    close(fd); /* (and the lock) */
}

