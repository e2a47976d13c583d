/* rt_internal.h — helpers the runtime's files share and generated programs do not see. */
#ifndef KILN_RT_INTERNAL_H
#define KILN_RT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln_rt.h"

/* The whole regular file at path in *bytes (malloc'd, *len bytes) (data.c). */
krt_status krt_read_whole(const char *path, void **bytes, size_t *len, krt_error *err);
/* Fills err (when not NULL) with code and a formatted message; returns code. */
krt_status krt_fail(krt_error *err, krt_status code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* A failed system call on path: "PATH: WHAT: strerror(e)", KRT_ENOSPC with "(disk full)"
 * for a full disk or quota, KRT_EIO otherwise. */
krt_status krt_fail_errno(krt_error *err, int e, const char *path, const char *what);
/* Clears err; returns KRT_OK. */
krt_status krt_ok(krt_error *err);

/* Kiln's caches on disk (data_cache.c; kiln's object cache, cli/objcache.c, uses them too):
 * their bound, $KILN_CACHE_MAX_BYTES (default 2G; suffixes K, M, G; 0: no cache), and the
 * eviction of a cache directory's least recently used entries (by modification time, to
 * the nanosecond; names starting '.' are not entries) until it holds at most keep bytes,
 * with temporary files (".tmp." in the name) an hour old. Returns the bytes it then holds. */
long long krt_cache_max_bytes(void);
long long krt_cache_evict(const char *dir, long long keep);
/* Inflated copies of gzip data files (data_cache.c). The entry's path for the source at
 * path, open as fd, and its key: false when there is no cache (no $HOME, the bound 0).
 * An entry's content opened for reading (its length in *len), -1 when it is missing or
 * damaged (then removed). A new entry of head then body, written whole or not at all. */
bool krt_data_cache_entry(const char *path, int fd, char *entry, size_t cap, uint64_t *key);
int krt_data_cache_open(const char *entry, uint64_t key, size_t *len);
void krt_data_cache_store(const char *entry, uint64_t key, const void *head, size_t head_len, const void *body, size_t body_len);
/* A gzip file of n bytes inflated whole by libdeflate (inflate_whole.c): true with the data
 * in *out (malloc'd) when it is one well-formed member of at most 1 GiB and libdeflate is
 * there; false otherwise, for zlib's streaming inflate to read it and tell what is wrong. */
bool krt_inflate_whole(const unsigned char *in, size_t n, unsigned char **out, size_t *out_len);

#endif
