/* train_ckpt.c — the training program's checkpoints: writing a step's two files
 * (model.safetensors with PyTorch's state_dict names; train_state.safetensors with the
 * optimizer's moments and every counter a resumed run needs) into a step directory that is
 * published whole (ckpt_dir.c), and reading them back with every metadata field checked,
 * alone and against the other file: a resumed run continues bit for bit, and a file that
 * is not such a checkpoint is refused with the file and the field named. Part of the
 * training program, beside train_main.c (with the model kiln_train_main was given). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kiln_model.h"
#include "kiln_rng.h"
#include "train_internal.h"

void tm_ckpt_new_run(tm_run *r)
{
    uint64_t x = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&x, sizeof x, 1, f) != 1) x = 0;
    if (f) fclose(f);
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x = kiln_rng_mix(x ^ kiln_rng_mix((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec) ^ ((uint64_t)getpid() << 32));
    snprintf(r->run_id, sizeof r->run_id, "%016llx", (unsigned long long)x);
}

/* Moment slab k of the optimizer state (NULL when the optimizer has none) and the prefix of
 * its tensors in train_state.safetensors: one naming for saving and loading. */
static float *moment_slab(const tm_run *r, const krt_optim_state *st, int k, const char **prefix)
{
    *prefix = krt_optim_slab_name(r->oc, k);
    return !*prefix ? NULL : k == 0 ? st->m : k == 1 ? st->v : st->w;
}

/* Writes the two files of the checkpoint of `step` into dir (a temporary directory of
 * krt_ckpt_begin). Both carry the step in their metadata, so that resuming can refuse a
 * model and a training state of different steps. */
static int write_checkpoint_files(const tm_run *r, const char *dir, const float *params, const unsigned char *buffers, const krt_optim_state *st,
                                  const krt_cursor *cur, int64_t step)
{
    krt_error err;
    krt_st_tensor *t = calloc((size_t)tm_model()->nparams * (KRT_OPTIM_SLABS + 1) + 1, sizeof *t);
    char **names = calloc((size_t)tm_model()->nparams * KRT_OPTIM_SLABS + 1, sizeof *names);
    if (!t || !names) {
        free(t);
        free(names);
        return tm_die("out of memory");
    }
    int n = 0;
    for (int i = 0; i < tm_model()->nparams; i++) {
        const kiln_param *p = &tm_model()->params[i];
        krt_st_tensor *x = &t[n++];
        x->name = p->name;
        x->dtype = p->dtype;
        x->rank = p->rank;
        memcpy(x->dims, p->dims, sizeof x->dims);
        x->data = p->trainable ? (const void *)(params + p->offset) : (const void *)(buffers + p->offset);
    }
    char hash[64], stepbuf[32], epoch[32], pos[32], seed[32], ostep[32], nbatches[32];
    snprintf(hash, sizeof hash, "%s", tm_model()->hash);
    snprintf(stepbuf, sizeof stepbuf, "%lld", (long long)step);
    snprintf(epoch, sizeof epoch, "%lld", (long long)cur->epoch);
    snprintf(pos, sizeof pos, "%lld", (long long)cur->position);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)cur->seed);
    snprintf(ostep, sizeof ostep, "%lld", (long long)st->step);
    snprintf(nbatches, sizeof nbatches, "%lld", (long long)r->batches_drawn);
    krt_st_meta meta[] = {{"format", "pt"}, {"kiln_model", tm_model()->name}, {"kiln_hash", hash}, {"step", stepbuf}, {"run_id", r->run_id}};
    char path[4200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (krt_safetensors_write_checked(path, t, n, meta, 5, &err) != KRT_OK) {
        free(t);
        free(names);
        return tm_die("%s", err.msg);
    }
    /* Optimizer moments, one tensor per parameter and moment, and the training position. */
    int m = 0;
    bool oom = false;
    for (int i = 0; i < tm_model()->nparams && !oom; i++) {
        const kiln_param *p = &tm_model()->params[i];
        if (!p->trainable) continue;
        for (int k = 0; k < KRT_OPTIM_SLABS; k++) {
            const char *prefix;
            float *slab = moment_slab(r, st, k, &prefix);
            if (!slab) continue;
            size_t len = strlen(p->name) + strlen(prefix) + 2;
            names[m] = malloc(len);
            if (!names[m]) {
                oom = true;
                break;
            }
            snprintf(names[m], len, "%s.%s", prefix, p->name);
            krt_st_tensor *x = &t[m];
            x->name = names[m++];
            x->dtype = KRT_F32;
            x->rank = p->rank;
            memcpy(x->dims, p->dims, sizeof x->dims);
            x->data = slab + p->offset;
        }
    }
    krt_st_meta smeta[8 + KRT_SCALER_META] = {{"kiln_hash", hash}, {"step", stepbuf}, {"run_id", r->run_id},         {"epoch", epoch},
                                              {"position", pos},   {"seed", seed},     {"optimizer_step", ostep}, {"batches", nbatches}};
    char scaler[KRT_SCALER_META][32];
    if (r->scaler) krt_scaler_meta(r->scaler, scaler, smeta + 8);
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    krt_status s = oom ? KRT_ENOMEM : krt_safetensors_write_checked(path, t, m, smeta, r->scaler ? 8 + KRT_SCALER_META : 8, &err);
    for (int i = 0; i < m; i++) free(names[i]);
    free(names);
    free(t);
    if (oom) return tm_die("%s: out of memory", path);
    if (s != KRT_OK) return tm_die("%s", err.msg);
    return 0;
}

/* One checkpoint, all or nothing: both files into a temporary directory, published as
 * dir/step-NNNNNNNN and named by dir/latest, then all but the newest `keep` deleted. */
int tm_ckpt_save(const tm_run *r, const char *dir, int64_t keep, const float *params, const unsigned char *buffers,
                 const krt_optim_state *st, const krt_cursor *cur, int64_t step)
{
    krt_error err;
    char tmp[4096];
    int failed = 0;
    if (krt_ckpt_begin(dir, step, tmp, sizeof tmp, &err) != KRT_OK) failed = tm_die("%s", err.msg);
    else if (write_checkpoint_files(r, tmp, params, buffers, st, cur, step)) failed = 1;
    else if (krt_ckpt_publish(dir, tmp, step, &err) != KRT_OK) failed = tm_die("%s", err.msg);
    if (failed) {
        /* Nothing of this checkpoint is published: the previous one stands. */
        krt_ckpt_discard(tmp);
        char found[4096];
        int64_t at;
        if (krt_ckpt_find(dir, found, sizeof found, &at, NULL, &err) == KRT_OK)
            fprintf(stderr, "%s: the checkpoint of step %lld was not saved; the newest checkpoint is still %s (--resume %s continues from it)\n",
                    tm_model()->name, (long long)step, found, dir);
        else
            fprintf(stderr, "%s: the checkpoint of step %lld was not saved; %s holds no checkpoint\n", tm_model()->name, (long long)step, dir);
        return 1;
    }
    /* The new checkpoint is in place: a failure to delete an old one is only reported. */
    if (krt_ckpt_prune(dir, step, (int)keep, &err) != KRT_OK) fprintf(stderr, "%s: warning: %s\n", tm_model()->name, err.msg);
    return 0;
}

/* A metadata value for a message: quoted, shortened, control characters escaped. */
static const char *shown(char buf[64], const char *s)
{
    size_t o = 0;
    buf[o++] = '"';
    for (; *s && o < 44; s++) {
        unsigned char c = (unsigned char)*s;
        if (c < 0x20 || c == 0x7f) o += (size_t)snprintf(buf + o, 64 - o, "\\x%02x", c);
        else buf[o++] = (char)c;
    }
    if (*s) o += (size_t)snprintf(buf + o, 64 - o, "...");
    buf[o++] = '"';
    buf[o] = 0;
    return buf;
}

/* A whole number of a checkpoint's metadata, written as Kiln writes it (decimal digits, no
 * sign, no leading zero), from lo to hi (`why` says where the bound comes from). A missing
 * key leaves *v as it is, or is an error when required. */
static int meta_count(const krt_safetensors *f, const char *path, const char *key, bool required, int64_t lo, int64_t hi,
                      const char *why, int64_t *v)
{
    const char *s = krt_safetensors_meta(f, key);
    if (!s) return required ? tm_die("%s: the metadata has no '%s' (it is not the checkpoint of a Kiln training run)", path, key) : 0;
    size_t len = strlen(s);
    bool ok = len >= 1 && len <= 19 && (s[0] != '0' || len == 1);
    uint64_t n = 0;
    for (size_t i = 0; ok && i < len; i++) {
        ok = s[i] >= '0' && s[i] <= '9';
        n = n * 10 + (uint64_t)(s[i] - '0');
    }
    if (!ok || n < (uint64_t)lo || n > (uint64_t)hi) {
        char b[64];
        if (lo == hi) return tm_die("%s: the metadata's '%s' is %s, but must be %lld%s", path, key, shown(b, s), (long long)lo, why);
        return tm_die("%s: the metadata's '%s' is %s, not a whole number from %lld to %lld%s", path, key, shown(b, s), (long long)lo,
                   (long long)hi, why);
    }
    *v = (int64_t)n;
    return 0;
}

/* The run id of a checkpoint file into id (empty when it has none, as files of older
 * Kiln versions or written elsewhere): 16 hexadecimal digits. */
static int meta_run_id(const krt_safetensors *f, const char *path, char id[17])
{
    const char *s = krt_safetensors_meta(f, "run_id");
    id[0] = 0;
    if (!s) return 0;
    bool ok = strlen(s) == 16;
    for (int i = 0; ok && i < 16; i++) ok = (s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f');
    char b[64];
    if (!ok) return tm_die("%s: the metadata's 'run_id' is %s, not 16 hexadecimal digits", path, shown(b, s));
    memcpy(id, s, 17);
    return 0;
}

/* Loads the newest checkpoint in dir into the parameters, buffers, optimizer state and
 * cursor, *step and r->batches_drawn. Both files are read whole and verified (checksums, when
 * they have them), and every field of their metadata is checked, alone and against the
 * other file and the directory's name: a refusal names the file and the field. */
int tm_ckpt_load(tm_run *r, const char *dir, int64_t accumulate, float *params, unsigned char *buffers, krt_optim_state *st,
                 krt_cursor *cur, int64_t *step)
{
    krt_error err;
    char found[4096], path[4200], spath[4200];
    int64_t named = -1;
    bool stale = false;
    if (krt_ckpt_find(dir, found, sizeof found, &named, &stale, &err) != KRT_OK) return tm_die("%s", err.msg);
    if (stale) fprintf(stderr, "%s: warning: %s/latest names a checkpoint that is not there; resuming from %s\n", tm_model()->name, dir, found);
    krt_safetensors *w = NULL, *s = NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", found);
    snprintf(spath, sizeof spath, "%s/train_state.safetensors", found);
    if (krt_safetensors_read(path, &w, &err) != KRT_OK) return tm_die("%s", err.msg);
    const char *h = krt_safetensors_meta(w, "kiln_hash");
    if (!h || strcmp(h, tm_model()->hash)) {
        tm_die("%s: this checkpoint belongs to another model (hash %s, this model is %s)", path, h ? h : "none", tm_model()->hash);
        krt_safetensors_free(w); /* after the message: h points into it */
        return 1;
    }
    int64_t model_step = -1; /* files of Kiln before the step was in the model's metadata have none */
    char model_run[17], state_run[17];
    if (meta_count(w, path, "step", false, 0, MAX_STEP, "", &model_step) || meta_run_id(w, path, model_run)) {
        krt_safetensors_free(w);
        return 1;
    }
    if (kiln_weights_load(tm_model(), w, path, params, buffers, &err) != KRT_OK) { /* by name, as inference programs (weights.c) */
        krt_safetensors_free(w);
        return tm_die("%s", err.msg);
    }
    krt_safetensors_free(w);
    if (krt_safetensors_read(spath, &s, &err) != KRT_OK) return tm_die("%s", err.msg);
    const char *sh = krt_safetensors_meta(s, "kiln_hash");
    if (!sh || strcmp(sh, tm_model()->hash)) {
        krt_safetensors_free(s);
        return tm_die("%s: this training state belongs to another model", spath);
    }
    int64_t sstep = 0, ostep = -1, nb = -1, epoch = 0, position = 0, seed = (int64_t)cur->seed;
    int bad = meta_count(s, spath, "step", true, 0, MAX_STEP, "", &sstep) || meta_run_id(s, spath, state_run);
    if (!bad && model_step >= 0 && model_step != sstep)
        bad = tm_die("%s is of step %lld but %s is of step %lld: the two files of a checkpoint must be of one step", path,
                  (long long)model_step, spath, (long long)sstep);
    if (!bad && strcmp(model_run, state_run))
        bad = tm_die("%s is of run %s but %s is of run %s: the two files of a checkpoint must be of one run", path,
                  *model_run ? model_run : "(none)", spath, *state_run ? state_run : "(none)");
    if (!bad && named >= 0 && named != sstep)
        bad = tm_die("%s: the checkpoint's files are of step %lld, not of the step its directory is named for (%lld)", found, (long long)sstep,
                  (long long)named);
    /* The optimizer takes one step per training step; each step draws `accumulate`
     * batches (1 to 65536); an epoch takes at least one batch. */
    if (!bad && r->scaler && krt_scaler_load(r->scaler, s, spath, sstep, &err) != KRT_OK) bad = tm_die("%s", err.msg);
    const int64_t taken = sstep - (r->scaler ? r->scaler->skipped : 0); /* loss scaling skips the steps that overflowed */
    if (!bad)
        bad = meta_count(s, spath, "optimizer_step", false, taken, taken,
                         taken < sstep ? " (one step per training step not skipped)" : " (the optimizer takes one step per training step)", &ostep) ||
              meta_count(s, spath, "batches", false, sstep, sstep * MAX_ACCUMULATE, " (each step draws 1 to 65536 batches)", &nb);
    if (!bad) {
        int64_t most = nb >= 0 ? nb : sstep * accumulate;
        bad = meta_count(s, spath, "epoch", false, 0, most,
                         nb >= 0 ? " (an epoch takes at least one of the 'batches' drawn)" : " (an epoch takes at least one batch of a step)", &epoch) ||
              meta_count(s, spath, "position", false, 0, INT64_MAX, "", &position) ||
              meta_count(s, spath, "seed", false, 0, (int64_t)1e18, " (--seed's range)", &seed);
    }
    for (int i = 0; !bad && i < tm_model()->nparams; i++) {
        const kiln_param *p = &tm_model()->params[i];
        if (!p->trainable) continue;
        for (int k = 0; k < KRT_OPTIM_SLABS && !bad; k++) {
            const char *prefix;
            float *slab = moment_slab(r, st, k, &prefix);
            if (!slab) continue;
            char name[1024];
            snprintf(name, sizeof name, "%s.%s", prefix, p->name);
            const krt_st_tensor *x = krt_safetensors_find(s, name);
            if (!x || x->dtype != KRT_F32) {
                bad = tm_die("%s: optimizer state '%s' is missing", spath, name);
                break;
            }
            int64_t count = 1;
            for (int d = 0; d < x->rank; d++) count *= x->dims[d];
            if (count != p->count) {
                bad = tm_die("%s: optimizer state '%s' has another shape than the parameter", spath, name);
                break;
            }
            memcpy(slab + p->offset, x->data, sizeof(float) * (size_t)p->count);
        }
    }
    if (!bad) {
        *step = sstep;
        cur->epoch = epoch;
        cur->position = position;
        cur->seed = (uint64_t)seed;
        st->step = ostep >= 0 ? ostep : taken;
        r->batches_drawn = nb >= 0 ? nb : sstep * accumulate;
    }
    krt_safetensors_free(s);
    return bad ? 1 : 0;
}
