/* cache_entry.h — the entries of kiln's caches on disk (cache_entry.c): the C pieces'
 * objects (objcache.h) and the CUDA kernels' CUBINs and ptxas reports (cuda_report.h).
 * An entry is a whole file, its content then a footer (magic, the content's length, its
 * hash), written under a temporary name and renamed into place, so that concurrent builds
 * write whole entries or none; one whose footer does not hold is removed when read. The
 * bytes stored are counted in DIR/.size, under a lock, which evicts the least recently
 * used entries when the total passes $KILN_CACHE_MAX_BYTES (runtime/rt_internal.h). */
#ifndef KILN_CLI_CACHE_ENTRY_H
#define KILN_CLI_CACHE_ENTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../util/util.h"

#define CACHE_ENTRY_FOOTER_BYTES 24 /* magic, the content's length, its hash */

/* $XDG_CACHE_HOME/kiln/SUB (else ~/.cache/kiln/SUB), created: malloc'd, or NULL when
 * there is no cache (the bound is 0, no home, not writable). */
char *cache_dir(const char *sub);
/* An entry's content when its footer says it is whole (elf: and it is an ELF file); NULL
 * (and the entry removed) when not, NULL when absent. malloc'd, its length in *len. */
char *cache_entry_read(const char *path, size_t *len, bool elf);
/* Writes an entry under a temporary name (idx tells concurrent writers of one process
 * apart), then renames it into place. 0 when it did. */
int cache_entry_store(const char *path, const char *data, size_t len, int idx);
/* Counts `added` bytes stored into dir and keeps it within max. */
void cache_account(const char *dir, long long added, long long max);
/* A whole file (malloc'd, NUL after its end), or NULL. */
char *cache_read_file(const char *path, size_t *len);
int cache_write_file(const char *path, const char *data, size_t len);
uint64_t cache_hash64(const void *data, size_t n);

#endif
