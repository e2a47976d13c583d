/* ckpt_dir.c — the checkpoint directory of a training run: one directory per checkpoint,
 * published all-or-nothing, the newest K kept (docs/training.md, "Checkpoints").
 *
 *   DIR/step-00001234/model.safetensors, train_state.safetensors   one checkpoint
 *   DIR/latest                                                      "step-00001234\n"
 *
 * Why this shape: a checkpoint is two files that must come from the same step. Each one
 * is written into a temporary directory (DIR/.step-00001234.tmp.PID), which is renamed
 * into place only when both are complete and synced, so a step-* directory is always
 * complete; the pointer file is then replaced atomically (temporary file, fsync, rename,
 * fsync of DIR), so a crash at any moment leaves `latest` naming a complete checkpoint
 * (the previous or the new one). Older checkpoints are deleted only after that, each
 * first renamed out of the step-* namespace so that a half-deleted one is never taken for
 * a checkpoint. Nothing here prints; every problem is a krt_status naming the path. */
#define _GNU_SOURCE /* renameat2 (RENAME_EXCHANGE), nftw */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "rt_internal.h"

#define POINTER "latest"
#define MODEL_FILE "model.safetensors"
#define STATE_FILE "train_state.safetensors"

/* The step of a checkpoint directory's name "step-" + digits, or -1. */
static int64_t step_of_name(const char *name)
{
    if (strncmp(name, "step-", 5)) return -1;
    const char *p = name + 5;
    if (!*p || strlen(p) > 18) return -1; /* 18 digits always fit int64_t */
    int64_t v = 0;
    for (; *p; p++) {
        if (*p < '0' || *p > '9') return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static void step_name(char *buf, size_t cap, int64_t step) { snprintf(buf, cap, "step-%08lld", (long long)step); }

static krt_status path_join(char *out, size_t cap, const char *dir, const char *name, krt_error *err)
{
    if ((size_t)snprintf(out, cap, "%s/%s", dir, name) >= cap) return krt_fail(err, KRT_EINVAL, "%s/%s: path too long", dir, name);
    return KRT_OK;
}

/* fsync of a directory, so that the entries renamed into it survive a crash. File systems
 * that cannot sync a directory (EINVAL) are accepted as they are. */
static krt_status sync_path(const char *path, krt_error *err)
{
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int e = fd < 0 ? errno : (fsync(fd) < 0 ? errno : 0);
    if (fd >= 0) close(fd);
    if (e && e != EINVAL && e != EROFS) return krt_fail_errno(err, e, path, "cannot sync the directory");
    return KRT_OK;
}

static int remove_entry(const char *path, const struct stat *sb, int type, struct FTW *ftw)
{
    (void)sb, (void)type, (void)ftw;
    return remove(path) ? errno : 0;
}

/* Removes a file or a directory tree (without following symbolic links); 0 or an errno. */
static int remove_tree(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0) return errno == ENOENT ? 0 : errno;
    if (!S_ISDIR(st.st_mode)) return unlink(path) ? errno : 0;
    int r = nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return r < 0 ? errno : r;
}

static bool is_regular(const char *dir, const char *name)
{
    char path[4096];
    struct stat st;
    return (size_t)snprintf(path, sizeof path, "%s/%s", dir, name) < sizeof path && stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* A directory holding both files of a checkpoint. */
static bool complete(const char *path) { return is_regular(path, MODEL_FILE) && is_regular(path, STATE_FILE); }

/* A leftover of a process that is gone: ".step-N.tmp.PID", ".step-N.old.PID",
 * ".step-N.del.PID" or ".latest.tmp.PID". */
static bool stale_leftover(const char *name)
{
    if (strncmp(name, ".step-", 6) && strncmp(name, "." POINTER ".tmp.", sizeof POINTER + 5)) return false;
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name) return false;
    const char *kind = dot - 4;
    if (kind < name || (strncmp(kind, ".tmp", 4) && strncmp(kind, ".old", 4) && strncmp(kind, ".del", 4))) return false;
    char *end;
    long pid = strtol(dot + 1, &end, 10);
    if (*end || pid <= 0) return false;
    return pid == (long)getpid() || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

/* Removes the leftovers of processes that are gone (and this one's) from dir. */
static void remove_leftovers(const char *dir)
{
    DIR *d = opendir(dir);
    for (struct dirent *x; d && (x = readdir(d));) {
        char path[4096];
        if (stale_leftover(x->d_name) && path_join(path, sizeof path, dir, x->d_name, NULL) == KRT_OK) remove_tree(path);
    }
    if (d) closedir(d);
}

/* mkdir -p of dir's parents: a run must not be lost at its first save for want of
 * `runs/exp1/` (PyTorch Lightning's and os.makedirs' behaviour). */
static int make_parents(const char *dir)
{
    char path[4096];
    size_t n = strlen(dir);
    if (n >= sizeof path) return ENAMETOOLONG;
    memcpy(path, dir, n + 1);
    for (size_t i = 1; i < n; i++) {
        if (path[i] != '/' || path[i - 1] == '/') continue;
        path[i] = 0;
        if (mkdir(path, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            path[i] = '/';
            return e;
        }
        path[i] = '/';
    }
    return 0;
}

krt_status krt_ckpt_prepare(const char *dir, krt_error *err)
{
    if (!dir || !*dir) return krt_fail(err, KRT_EINVAL, "checkpoint directory: the path is empty");
    if (mkdir(dir, 0777) != 0 && errno == ENOENT) {
        int pe = make_parents(dir);
        if (pe) return krt_fail_errno(err, pe, dir, "cannot create the checkpoint directory's parents");
    }
    if (mkdir(dir, 0777) != 0) {
        int e = errno;
        struct stat st;
        if (e != EEXIST) return krt_fail_errno(err, e, dir, "cannot create the checkpoint directory");
        if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return krt_fail(err, KRT_EIO, "%s: cannot hold checkpoints: it exists and is not a directory", dir);
    }
    /* Permissions alone do not say it (read-only mounts, ACLs, root): create a file. */
    char probe[4096];
    if ((size_t)snprintf(probe, sizeof probe, "%s/.kiln-write-test.%ld", dir, (long)getpid()) >= sizeof probe)
        return krt_fail(err, KRT_EINVAL, "%s: path too long", dir);
    int fd = open(probe, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return krt_fail_errno(err, errno, dir, "cannot write checkpoints into this directory");
    int e = write(fd, "k", 1) == 1 ? 0 : errno ? errno : EIO;
    close(fd);
    unlink(probe);
    if (e) return krt_fail_errno(err, e, dir, "cannot write checkpoints into this directory");
    /* A run that saves nothing (already complete, stopped early) still clears them. */
    remove_leftovers(dir);
    return krt_ok(err);
}

krt_status krt_ckpt_begin(const char *dir, int64_t step, char *tmp, size_t cap, krt_error *err)
{
    if (!dir || !tmp || step < 0) return krt_fail(err, KRT_EINVAL, "krt_ckpt_begin: bad arguments");
    char name[64];
    snprintf(name, sizeof name, ".step-%08lld.tmp.%ld", (long long)step, (long)getpid());
    krt_status s = path_join(tmp, cap, dir, name, err);
    if (s) return s;
    remove_tree(tmp); /* left by an earlier failed attempt of this process */
    if (mkdir(tmp, 0777) != 0) return krt_fail_errno(err, errno, tmp, "cannot create the checkpoint's temporary directory");
    return krt_ok(err);
}

void krt_ckpt_discard(const char *tmp)
{
    if (tmp && *tmp) remove_tree(tmp);
}

/* Replaces `pointer` by a file holding `text`: temporary file, fsync, rename, fsync of dir. */
static krt_status write_pointer(const char *dir, const char *text, krt_error *err)
{
    char path[4096], tmp[4200];
    krt_status s = path_join(path, sizeof path, dir, POINTER, err);
    if (s) return s;
    snprintf(tmp, sizeof tmp, "%s/.%s.tmp.%ld", dir, POINTER, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0) return krt_fail_errno(err, errno, path, "cannot create a temporary file beside it");
    size_t len = strlen(text);
    int e = write(fd, text, len) == (ssize_t)len ? 0 : errno ? errno : EIO;
    const char *what = "writing failed";
    if (!e && fsync(fd) < 0) e = errno, what = "syncing failed";
    if (close(fd) < 0 && !e) e = errno, what = "closing failed";
    if (!e && rename(tmp, path) < 0) e = errno, what = "cannot replace it";
    if (e) {
        unlink(tmp);
        return krt_fail_errno(err, e, path, what);
    }
    return sync_path(dir, err);
}

krt_status krt_ckpt_publish(const char *dir, const char *tmp, int64_t step, krt_error *err)
{
    char name[64], target[4096], aside[4200];
    step_name(name, sizeof name, step);
    krt_status s = path_join(target, sizeof target, dir, name, err);
    if (s) return s;
    if (!complete(tmp)) return krt_fail(err, KRT_EINVAL, "%s: not a complete checkpoint (it needs %s and %s)", tmp, MODEL_FILE, STATE_FILE);
    if ((s = sync_path(tmp, err))) return s;
    if (rename(tmp, target) != 0) {
        int e = errno;
        if (e != EEXIST && e != ENOTEMPTY) return krt_fail_errno(err, e, target, "cannot move the checkpoint into place");
        /* A checkpoint of the same step is there (an earlier run's): swap the two
         * atomically, so that the name always holds a complete checkpoint, then delete the
         * old one. Without RENAME_EXCHANGE (some file systems), move the old one aside
         * first; a crash in between leaves `latest` naming nothing, and resuming falls
         * back to the highest complete step directory. */
        if (renameat2(AT_FDCWD, tmp, AT_FDCWD, target, RENAME_EXCHANGE) == 0) {
            remove_tree(tmp);
        } else {
            snprintf(aside, sizeof aside, "%s/.%s.old.%ld", dir, name, (long)getpid());
            remove_tree(aside);
            if (rename(target, aside) != 0) return krt_fail_errno(err, errno, target, "cannot replace the checkpoint of the same step");
            if (rename(tmp, target) != 0) {
                e = errno;
                rename(aside, target); /* put the old one back */
                return krt_fail_errno(err, e, target, "cannot move the checkpoint into place");
            }
            remove_tree(aside);
        }
    }
    if ((s = sync_path(dir, err))) return s;
    char text[80];
    snprintf(text, sizeof text, "%s\n", name);
    if ((s = write_pointer(dir, text, err))) return s;
    return krt_ok(err);
}

typedef struct {
    int64_t step;
    char name[64];
} Entry;

static int cmp_desc(const void *a, const void *b)
{
    int64_t x = ((const Entry *)a)->step, y = ((const Entry *)b)->step;
    return x > y ? -1 : x < y;
}

/* The step-* directories of dir, highest step first (*n of them; NULL and 0 when none). */
static krt_status list_steps(const char *dir, Entry **out, int *n, krt_error *err)
{
    *out = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return krt_fail_errno(err, errno, dir, "cannot open the checkpoint directory");
    int cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        int64_t s = step_of_name(e->d_name);
        if (s < 0 || strlen(e->d_name) >= sizeof(*out)->name) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 16;
            Entry *g = realloc(*out, (size_t)cap * sizeof *g);
            if (!g) {
                closedir(d);
                free(*out);
                *out = NULL;
                *n = 0;
                return krt_fail(err, KRT_ENOMEM, "%s: out of memory", dir);
            }
            *out = g;
        }
        (*out)[*n].step = s;
        memcpy((*out)[*n].name, e->d_name, strlen(e->d_name) + 1); /* fits: checked above */
        (*n)++;
    }
    closedir(d);
    if (*n) qsort(*out, (size_t)*n, sizeof **out, cmp_desc);
    return KRT_OK;
}

/* Deletes dir/name: renamed out of the step-* names first, so that a deletion cut short
 * leaves no partial checkpoint under a checkpoint's name. */
static krt_status delete_checkpoint(const char *dir, const char *name, krt_error *err)
{
    char path[4096], gone[4200];
    krt_status s = path_join(path, sizeof path, dir, name, err);
    if (s) return s;
    snprintf(gone, sizeof gone, "%s/.%s.del.%ld", dir, name, (long)getpid());
    remove_tree(gone);
    if (rename(path, gone) != 0) return krt_fail_errno(err, errno, path, "cannot remove the old checkpoint");
    int e = remove_tree(gone);
    if (e) return krt_fail_errno(err, e, gone, "cannot remove the old checkpoint");
    return KRT_OK;
}

krt_status krt_ckpt_prune(const char *dir, int64_t step, int keep, krt_error *err)
{
    if (!dir || keep < 1) return krt_fail(err, KRT_EINVAL, "krt_ckpt_prune: keep must be at least 1");
    Entry *e;
    int n;
    krt_status s = list_steps(dir, &e, &n, err);
    if (s) return s;
    /* Kept: `step` and the keep - 1 highest steps below it. A step above it was left by an
     * earlier run (or by this run before it was resumed from an earlier checkpoint), and
     * would otherwise be taken for the newest when `latest` is lost. */
    int below = 0;
    krt_status first = KRT_OK;
    for (int i = 0; i < n; i++) {
        if (e[i].step == step) continue;
        if (e[i].step < step && below < keep - 1) {
            below++;
            continue;
        }
        if ((s = delete_checkpoint(dir, e[i].name, err)) && !first) first = s;
    }
    free(e);
    /* Files of the old layout (the two files directly in DIR) are older than any step-*. */
    static const char *const legacy[] = {MODEL_FILE, STATE_FILE};
    for (int i = 0; i < 2; i++) {
        char path[4096];
        if (path_join(path, sizeof path, dir, legacy[i], NULL) == KRT_OK && unlink(path) != 0 && errno != ENOENT && !first)
            first = krt_fail_errno(err, errno, path, "cannot remove the old checkpoint file");
    }
    remove_leftovers(dir);
    return first ? first : krt_ok(err);
}

krt_status krt_ckpt_find(const char *dir, char *found, size_t cap, int64_t *step, bool *stale_pointer, krt_error *err)
{
    *step = -1;
    if (stale_pointer) *stale_pointer = false;
    if (!dir || !*dir) return krt_fail(err, KRT_EINVAL, "--resume: the checkpoint directory is empty");
    struct stat st;
    if (stat(dir, &st) != 0) return krt_fail_errno(err, errno, dir, "cannot open the checkpoint directory");
    if (!S_ISDIR(st.st_mode)) return krt_fail(err, KRT_EIO, "%s: not a checkpoint directory (not a directory)", dir);
    char path[4096];
    krt_status s = path_join(path, sizeof path, dir, POINTER, err);
    if (s) return s;
    FILE *f = fopen(path, "r");
    if (f) {
        char line[128] = "";
        size_t got = fread(line, 1, sizeof line - 1, f);
        fclose(f);
        line[got] = 0;
        size_t len = strcspn(line, "\n");
        bool one_line = line[len] == 0 || line[len + 1] == 0;
        line[len] = 0;
        int64_t at = step_of_name(line);
        if (at < 0 || !one_line)
            return krt_fail(err, KRT_EFORMAT, "%s: not a checkpoint pointer (expected one line naming a step-NNNNNNNN directory)", path);
        if ((s = path_join(found, cap, dir, line, err))) return s;
        if (complete(found)) {
            *step = at;
            return krt_ok(err);
        }
        if (stale_pointer) *stale_pointer = true; /* gone: fall back as if there were no pointer */
    } else if (errno != ENOENT) {
        return krt_fail_errno(err, errno, path, "cannot read the checkpoint pointer");
    }
    Entry *e;
    int n;
    if ((s = list_steps(dir, &e, &n, err))) return s;
    for (int i = 0; i < n; i++) {
        if (path_join(found, cap, dir, e[i].name, NULL) == KRT_OK && complete(found)) {
            *step = e[i].step;
            free(e);
            return krt_ok(err);
        }
    }
    free(e);
    if (is_regular(dir, MODEL_FILE) || is_regular(dir, STATE_FILE)) { /* the old layout: the files in DIR */
        if ((size_t)snprintf(found, cap, "%s", dir) >= cap) return krt_fail(err, KRT_EINVAL, "%s: path too long", dir);
        return krt_ok(err);
    }
    return krt_fail(err, KRT_EIO, "%s: no checkpoint in this directory (no %s pointer, no complete step-NNNNNNNN directory, no %s)", dir,
                    POINTER, MODEL_FILE);
}
