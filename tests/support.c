/* support.c — see support.h. */
#include "support.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

const char *support_path(const char *relpath)
{
    static char buf[4096];
    snprintf(buf, sizeof buf, "%s/%s", KILN_SOURCE_DIR, relpath);
    return buf;
}

char *support_read(const char *relpath, size_t *len)
{
    StrBuf err;
    sb_init(&err);
    size_t n = 0;
    char *text = util_read_file(support_path(relpath), &n, &err);
    sb_free(&err);
    if (len) *len = n;
    return text;
}

Model *support_compile_file(const char *relpath, GraphMode mode, Diag *d)
{
    size_t len;
    char *text = support_read(relpath, &len);
    cr_assert(text, "cannot read %s", relpath);
    diag_init(d, NULL);
    Model *m = frontend_compile(d, relpath, text, len, mode);
    free(text);
    cr_assert(m, "%s failed to compile:\n%s", relpath, d->out.data ? d->out.data : "");
    return m;
}

int support_run_kiln(const char *args, StrBuf *out)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "'%s' %s", KILN_BINARY, args);
    return support_run(cmd, out);
}

int support_run(const char *cmdline, StrBuf *out)
{
    StrBuf cmd;
    sb_init(&cmd);
    sb_printf(&cmd, "%s 2>&1", cmdline);
    FILE *p = popen(cmd.data, "r");
    sb_free(&cmd);
    if (!p) return -1;
    char chunk[4096];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, p)) > 0) sb_putn(out, chunk, n);
    int status = pclose(p);
    if (status == -1 || !WIFEXITED(status)) return -1;
    return WEXITSTATUS(status);
}

int support_build_in_temp(const char *tag, const char *model, const char *name, char *dir, size_t dirsize, StrBuf *out)
{
    snprintf(dir, dirsize, "/tmp/kiln-%s-XXXXXX", tag);
    if (!mkdtemp(dir)) return -1;
    StrBuf args;
    sb_init(&args);
    sb_printf(&args, "build %s -o %s/%s", support_path(model), dir, name);
    int rc = support_run_kiln(args.data, out);
    sb_free(&args);
    return rc;
}

void support_remove_dir(const char *dir)
{
    StrBuf cmd, out;
    sb_init(&cmd);
    sb_init(&out);
    sb_printf(&cmd, "rm -rf '%s'", dir);
    support_run(cmd.data, &out);
    sb_free(&cmd);
    sb_free(&out);
}

bool support_write_npy(const char *path, const char *descr, int64_t rows, int64_t cols, const double *v)
{
    char header[128];
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    int n = cols > 0 ? snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld, %lld), }", descr,
                                (long long)rows, (long long)cols)
                     : snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%lld,), }", descr,
                                (long long)rows);
    int total = (10 + n + 1 + 63) / 64 * 64; /* magic, version, length, header, '\n' */
    uint16_t hlen = (uint16_t)(total - 10);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xff, f);
    fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)n, f);
    for (int i = 10 + n; i < total - 1; i++) fputc(' ', f);
    fputc('\n', f);
    int64_t count = rows * (cols > 0 ? cols : 1);
    for (int64_t i = 0; i < count; i++) {
        if (descr[1] == 'f') {
            float x = (float)v[i];
            fwrite(&x, sizeof x, 1, f);
        } else {
            int64_t x = (int64_t)v[i];
            fwrite(&x, sizeof x, 1, f);
        }
    }
    return fclose(f) == 0;
}

int support_run_in(const char *dir, const char *cmd, StrBuf *out)
{
    char full[4096];
    out->len = 0;
    if (out->data) out->data[0] = 0;
    snprintf(full, sizeof full, "cd %s || exit 99; %s", dir, cmd);
    return support_run(full, out);
}

const char *support_listing(const char *dir)
{
    static char out[2048];
    char *names[64];
    int n = 0;
    DIR *d = opendir(dir);
    cr_assert(d, "cannot list %s", dir);
    for (struct dirent *e; (e = readdir(d)) && n < 64;)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(names[j], names[i]) < 0) {
                char *t = names[i];
                names[i] = names[j];
                names[j] = t;
            }
    out[0] = 0;
    for (int i = 0; i < n; i++) {
        if (i) strcat(out, "|");
        strncat(out, names[i], 100);
        free(names[i]);
    }
    return out;
}

SupportPtxas support_ptxas_summary(const char *out)
{
    SupportPtxas r = {0, 0, 0, 0};
    if (!out) return r;
    for (const char *s = out; (s = strstr(s, "bytes stack frame")); s++) {
        const char *line = s;
        while (line > out && line[-1] != '\n') line--;
        int a, b, e;
        if (sscanf(line, " %d bytes stack frame, %d bytes spill stores, %d bytes spill loads", &a, &b, &e) == 3) {
            r.kernels++;
            r.spilling += b || e;
            r.stack += a != 0;
        }
    }
    for (const char *s = out; (s = strstr(s, "Used ")); s++) {
        int regs;
        if (sscanf(s, "Used %d registers", &regs) == 1 && regs > r.max_registers) r.max_registers = regs;
    }
    return r;
}

/* A u8 IDX file: `rank` dims, the values a linear congruential sequence (labels < 10). */
void support_write_idx(const char *path, int rank, const uint32_t *dims, bool labels)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    unsigned char head[4] = {0, 0, 8, (unsigned char)rank};
    fwrite(head, 1, 4, f);
    size_t n = 1;
    for (int i = 0; i < rank; i++) {
        unsigned char d[4] = {(unsigned char)(dims[i] >> 24), (unsigned char)(dims[i] >> 16), (unsigned char)(dims[i] >> 8),
                              (unsigned char)dims[i]};
        fwrite(d, 1, 4, f);
        n *= dims[i];
    }
    uint32_t r = labels ? 7u : 12345u;
    for (size_t i = 0; i < n; i++) {
        r = r * 1103515245u + 12345u;
        fputc(labels ? (int)((r >> 16) % 10) : (int)((r >> 16) & 0xff), f);
    }
    fclose(f);
}

/* Text for the language models: words drawn from a short list. */
void support_write_text(const char *path)
{
    static const char *const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and",
                                        "runs", "away", "into", "night", "Q:", "A:", "why", "not"};
    FILE *f = fopen(path, "w");
    cr_assert(f, "cannot write %s", path);
    uint32_t r = 99;
    for (int i = 0; i < 4000; i++) {
        r = r * 1103515245u + 12345u;
        fprintf(f, "%s%s", words[(r >> 16) % (sizeof words / sizeof *words)], i % 12 == 11 ? ".\n" : " ");
    }
    fclose(f);
}

void support_write_training_data(const char *dir)
{
    char path[4200];
    const uint32_t img[3] = {384, 28, 28}, lab[1] = {384};
    snprintf(path, sizeof path, "%s/img.idx", dir);
    support_write_idx(path, 3, img, false);
    snprintf(path, sizeof path, "%s/lab.idx", dir);
    support_write_idx(path, 1, lab, true);
    snprintf(path, sizeof path, "%s/text.txt", dir);
    support_write_text(path);
}

int support_log_losses(const char *path, double *v, int cap)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[4096];
    int n = 0;
    while (n < cap && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "\"loss\": ");
        if (p) v[n++] = strtod(p + 8, NULL);
    }
    fclose(f);
    return n;
}
