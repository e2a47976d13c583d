/* data_cache.c — kiln's caches on disk: their bound and eviction (krt_cache_*, which kiln's
 * object cache uses too), and inflated copies of gzip data files, so that a second run
 * starts at once.
 *
 * Inflating Fashion-MNIST's 26 MB of gzip (70,000 images) takes zlib 0.3 s, which was all
 * of a warm `kiln train models/mlp.kiln`'s time to its first step. The first load of a
 * gzip IDX file writes what it inflated (the plain IDX file) to
 * $XDG_CACHE_HOME/kiln/data (else ~/.cache/kiln/data), named by the hash of the source's
 * real path, device, inode, size and modification and change times to the nanosecond: a
 * changed source is another entry. Later loads read the copy as a plain IDX file, with the
 * plain file's checks. An entry ends in a footer (magic, the content's length, the key's
 * hash) checked before it is used; one that fails the check is removed and the source
 * inflated again. Entries are written under a temporary name and renamed into place
 * (concurrent runs write whole entries or none), only after the source loaded without an
 * error, and the least recently used go when the directory passes $KILN_CACHE_MAX_BYTES
 * (default 2G, the bound of kiln's object cache; 0: no copies). Any failure to write one
 * leaves the load as it was: the cache only ever saves time. */
#define _GNU_SOURCE /* realpath, utimensat */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "rt_internal.h"

static const char footer_magic[8] = {'K', 'I', 'L', 'N', 'I', 'D', 'X', '1'};
#define FOOTER_BYTES 24

long long krt_cache_max_bytes(void)
{
    const char *s = getenv("KILN_CACHE_MAX_BYTES");
    long long v = 2LL << 30;
    if (s && *s) {
        char *end;
        long long n = strtoll(s, &end, 10);
        if (end != s && n >= 0) {
            v = n;
            if (*end == 'k' || *end == 'K') v <<= 10;
            else if (*end == 'm' || *end == 'M') v <<= 20;
            else if (*end == 'g' || *end == 'G') v <<= 30;
        }
    }
    return v;
}

/* FNV-1a, 64 bits, from h */
static uint64_t fnv(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ULL;
    return h;
}

/* The directory, created when missing; false when there is none (no $HOME, the bound 0). */
static bool cache_dir(char *dir, size_t cap)
{
    if (krt_cache_max_bytes() <= 0) return false;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    int n;
    if (xdg && *xdg) n = snprintf(dir, cap, "%s/kiln/data", xdg);
    else if (home && *home) n = snprintf(dir, cap, "%s/.cache/kiln/data", home);
    else return false;
    if (n < 0 || (size_t)n >= cap) return false;
    for (char *q = dir + 1; *q; q++)
        if (*q == '/') {
            *q = 0;
            mkdir(dir, 0755);
            *q = '/';
        }
    mkdir(dir, 0755);
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode) && access(dir, W_OK) == 0;
}

bool krt_data_cache_entry(const char *path, int fd, char *entry, size_t cap, uint64_t *key)
{
    struct stat st;
    char real[PATH_MAX], dir[PATH_MAX];
    if (fstat(fd, &st) != 0 || !realpath(path, real) || !cache_dir(dir, sizeof dir)) return false;
    uint64_t h1 = fnv(0xcbf29ce484222325ULL, real, strlen(real)), h2 = fnv(0x84222325cbf29ce4ULL, real, strlen(real));
    const int64_t fields[] = {(int64_t)st.st_dev, (int64_t)st.st_ino, (int64_t)st.st_size, (int64_t)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                              (int64_t)st.st_ctim.tv_sec, st.st_ctim.tv_nsec};
    h1 = fnv(h1, fields, sizeof fields);
    h2 = fnv(h2 ^ h1, fields, sizeof fields);
    *key = h1;
    int n = snprintf(entry, cap, "%s/%016llx%016llx.idx", dir, (unsigned long long)h1, (unsigned long long)h2);
    return n > 0 && (size_t)n < cap;
}

int krt_data_cache_open(const char *entry, uint64_t key, size_t *len)
{
    int fd = open(entry, O_RDONLY);
    if (fd < 0) return -1;
    struct stat st;
    unsigned char f[FOOTER_BYTES];
    uint64_t n = 0, k = 0;
    bool ok = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size >= FOOTER_BYTES &&
              pread(fd, f, sizeof f, st.st_size - FOOTER_BYTES) == (ssize_t)sizeof f && !memcmp(f, footer_magic, 8);
    if (ok) {
        memcpy(&n, f + 8, 8);
        memcpy(&k, f + 16, 8);
        ok = n == (uint64_t)st.st_size - FOOTER_BYTES && k == key;
    }
    if (!ok) {
        close(fd);
        unlink(entry); /* entries are renamed into place whole: this one will never be right */
        return -1;
    }
    futimens(fd, NULL); /* recently used */
    *len = (size_t)n;
    return fd;
}

typedef struct {
    char *name;
    long long size;
    struct timespec mtime;
} Entry;

static int by_age(const void *a, const void *b)
{
    const Entry *x = a, *y = b;
    if (x->mtime.tv_sec != y->mtime.tv_sec) return x->mtime.tv_sec < y->mtime.tv_sec ? -1 : 1;
    return x->mtime.tv_nsec < y->mtime.tv_nsec ? -1 : x->mtime.tv_nsec > y->mtime.tv_nsec;
}

long long krt_cache_evict(const char *dir, long long max)
{
    DIR *d = opendir(dir);
    if (!d) return 0;
    Entry *v = NULL;
    size_t n = 0, cap = 0;
    long long total = 0;
    time_t now = time(NULL);
    char path[2 * PATH_MAX];
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        int len = snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (len < 0 || (size_t)len >= sizeof path) continue;
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (strstr(e->d_name, ".tmp.")) {
            if (now - st.st_mtime > 3600) unlink(path);
            continue;
        }
        if (n == cap) {
            Entry *g = realloc(v, (cap = cap ? 2 * cap : 16) * sizeof *v);
            if (!g) break;
            v = g;
        }
        char *name = strdup(e->d_name);
        if (!name) break;
        v[n++] = (Entry){name, (long long)st.st_size, st.st_mtim};
        total += st.st_size;
    }
    closedir(d);
    if (total > max) {
        qsort(v, n, sizeof *v, by_age);
        for (size_t i = 0; i < n && total > max; i++) {
            int len = snprintf(path, sizeof path, "%s/%s", dir, v[i].name);
            if (len > 0 && (size_t)len < sizeof path && unlink(path) == 0) total -= v[i].size;
        }
    }
    for (size_t i = 0; i < n; i++) free(v[i].name);
    free(v);
    return total;
}

static bool write_all(int fd, const void *data, size_t n)
{
    const char *p = data;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return false;
        p += w, n -= (size_t)w;
    }
    return true;
}

void krt_data_cache_store(const char *entry, uint64_t key, const void *head, size_t head_len, const void *body, size_t body_len)
{
    char tmp[2 * PATH_MAX];
    int len = snprintf(tmp, sizeof tmp, "%s.tmp.%ld", entry, (long)getpid());
    if (len < 0 || (size_t)len >= sizeof tmp) return;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    unsigned char f[FOOTER_BYTES];
    uint64_t n = head_len + body_len;
    memcpy(f, footer_magic, 8);
    memcpy(f + 8, &n, 8);
    memcpy(f + 16, &key, 8);
    bool ok = write_all(fd, head, head_len) && write_all(fd, body, body_len) && write_all(fd, f, sizeof f);
    ok = close(fd) == 0 && ok;
    if (!ok || rename(tmp, entry) != 0) {
        unlink(tmp);
        return;
    }
    char dir[2 * PATH_MAX];
    len = snprintf(dir, sizeof dir, "%s", entry);
    char *slash = len > 0 && (size_t)len < sizeof dir ? strrchr(dir, '/') : NULL;
    if (slash) {
        *slash = 0;
        krt_cache_evict(dir, krt_cache_max_bytes());
    }
}
