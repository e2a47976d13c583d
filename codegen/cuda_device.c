/* cuda_device.c — cuda_device.h: the device code cut out of model.cu's text for NVRTC. */
#include "cuda_device.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static bool ident_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

/* The end of the top-level definition starting at s[i] (one past its last line's newline):
 * its braces counted outside comments and literals, up to the line on which they close, or
 * the line of a ';' outside any brace. 0 when the text ends first. */
static size_t definition_end(const char *s, size_t len, size_t i)
{
    int depth = 0;
    bool opened = false;
    for (size_t k = i; k < len; k++) {
        const char c = s[k];
        if (c == '/' && k + 1 < len && s[k + 1] == '*') {
            const char *e = strstr(s + k + 2, "*/");
            if (!e || (size_t)(e - s) >= len) return 0;
            k = (size_t)(e - s) + 1;
        } else if (c == '/' && k + 1 < len && s[k + 1] == '/') {
            while (k < len && s[k] != '\n') k++;
            k--; /* the newline is looked at next */
        } else if (c == '"' || c == '\'') {
            for (k++; k < len && s[k] != c; k++)
                if (s[k] == '\\') k++;
            if (k >= len) return 0;
        } else if (c == '{') {
            depth++;
            opened = true;
        } else if (c == '}') {
            if (--depth < 0) return 0;
        }
        if ((opened && depth == 0 && c == '}') || (!opened && depth == 0 && c == ';')) {
            const char *nl = memchr(s + k, '\n', len - k);
            return nl ? (size_t)(nl - s) + 1 : len;
        }
    }
    return 0;
}

/* The name of the function whose signature is sig: the identifier before the '(' that
 * matches the signature's last ')'. */
static char *function_name(const char *sig)
{
    const char *close = strrchr(sig, ')');
    if (!close) return NULL;
    int depth = 0;
    const char *p = close;
    for (; p >= sig; p--) {
        if (*p == ')') depth++;
        else if (*p == '(' && --depth == 0) break;
    }
    if (p <= sig) return NULL;
    const char *e = p;
    while (e > sig && isspace((unsigned char)e[-1])) e--;
    const char *b = e;
    while (b > sig && ident_char(b[-1])) b--;
    return b < e ? xstrndup(b, (size_t)(e - b)) : NULL;
}

static void add_name(CudaDeviceSource *out, const char *s, size_t n)
{
    for (int i = 0; i < out->nnames; i++)
        if (strlen(out->names[i]) == n && !memcmp(out->names[i], s, n)) return;
    out->names = xrealloc(out->names, (size_t)(out->nnames + 1) * sizeof *out->names);
    out->names[out->nnames++] = xstrndup(s, n);
}

/* The instances name<...> of a template kernel that the host text launches. */
static void template_instances(CudaDeviceSource *out, const StrBuf *host, const char *name)
{
    const size_t nl = strlen(name);
    for (const char *p = host->data ? strstr(host->data, name) : NULL; p; p = strstr(p + 1, name)) {
        if ((p > host->data && ident_char(p[-1])) || p[nl] != '<') continue;
        int depth = 0;
        const char *q = p + nl;
        for (; *q; q++) {
            if (*q == '<') depth++;
            else if (*q == '>' && --depth == 0) break;
            else if (*q == ';' || *q == '\n') break;
        }
        if (*q == '>') add_name(out, p, (size_t)(q + 1 - p));
    }
}

int cuda_device_source(const char *s, size_t len, const char *file_name, CudaDeviceSource *out, StrBuf *err)
{
    memset(out, 0, sizeof *out);
    sb_init(&out->text);
    sb_init(&out->common);
    sb_init(&out->host);
    StrBuf host;
    sb_init(&host);
    char **templates = NULL;
    int ntemplates = 0;
    int line = 1, rc = 0;
    for (size_t i = 0; i < len;) {
        const char *l = s + i;
        const char *nl = memchr(l, '\n', len - i);
        const size_t next = nl ? (size_t)(nl - s) + 1 : len;
        if (l[0] == '#') { /* a directive, and its continuation lines: the host's, and but for the C library's includes (kiln_cuda.h stands in for them) the device's too */
            size_t end = next;
            while (end >= 2 && end < len && s[end - 1] == '\n' && s[end - 2] == '\\') {
                const char *n2 = memchr(s + end, '\n', len - end);
                end = n2 ? (size_t)(n2 - s) + 1 : len;
            }
            if (strncmp(l, "#include <", 10))
                for (int k = 0; k < 2; k++) {
                    StrBuf *b = k ? &out->common : &out->text;
                    sb_printf(b, "#line %d \"%s\"\n", line, file_name);
                    sb_putn(b, l, end - i);
                }
            sb_printf(&out->host, "#line %d \"%s\"\n", line, file_name);
            sb_putn(&out->host, l, end - i);
            for (size_t k = i; k < end; k++) line += s[k] == '\n';
            i = end;
            continue;
        }
        if (!strncmp(l, "/*", 2)) { /* a comment between definitions */
            const char *e = strstr(l + 2, "*/");
            size_t end = e && (size_t)(e - s) < len ? (size_t)(e - s) + 2 : len;
            for (size_t k = i; k < end; k++) line += s[k] == '\n';
            i = end;
            continue;
        }
        if (isspace((unsigned char)l[0])) { /* blank lines, the rest of a comment's line */
            line += nl != NULL;
            i = next;
            continue;
        }
        const size_t end = definition_end(s, len, i);
        if (!end) {
            sb_printf(err, "%s:%d: the definition starting here does not end (an unbalanced brace or an unterminated comment or literal)",
                      file_name, line);
            rc = -1;
            break;
        }
        size_t sl = strcspn(l, "{;");
        if (sl > end - i) sl = end - i;
        char *sig = xstrndup(l, sl);
        const bool global = strstr(sig, "__global__") != NULL;
        if (global || strstr(sig, "__device__")) {
            sb_printf(&out->text, "#line %d \"%s\"\n", line, file_name);
            sb_putn(&out->text, l, end - i);
            if (global) out->nkernels++;
            const bool is_template = !strncmp(sig, "template", 8);
            StrBuf piece;
            sb_init(&piece);
            sb_printf(&piece, "#line %d \"%s\"\n", line, file_name);
            sb_putn(&piece, l, end - i);
            if (global && !is_template) {
                out->kernels = xrealloc(out->kernels, (size_t)(out->nkernel_texts + 1) * sizeof *out->kernels);
                out->kernels[out->nkernel_texts++] = sb_take(&piece);
                char *kname = function_name(sig);
                if (kname) {
                    out->kernel_names = xrealloc(out->kernel_names, (size_t)(out->nkernel_names + 1) * sizeof *out->kernel_names);
                    out->kernel_names[out->nkernel_names++] = kname;
                }
            } else {
                sb_putn(&out->common, piece.data, piece.len);
            }
            sb_free(&piece);
            if (global) { /* the host declares it: its type gives a launch's parameters */
                sb_printf(&out->host, "#line %d \"%s\"\n", line, file_name);
                sb_puts(&out->host, sig);
                while (out->host.len && (out->host.data[out->host.len - 1] == '\n' || out->host.data[out->host.len - 1] == ' ')) out->host.len--;
                sb_puts(&out->host, ";\n");
            }
            char *name = global && is_template ? function_name(sig) : NULL;
            if (name) {
                out->ntemplates++;
                templates = xrealloc(templates, (size_t)(ntemplates + 1) * sizeof *templates);
                templates[ntemplates++] = name;
            }
        } else {
            sb_putn(&host, l, end - i);
            sb_printf(&out->host, "#line %d \"%s\"\n", line, file_name);
            sb_putn(&out->host, l, end - i);
        }
        free(sig);
        for (size_t k = i; k < end; k++) line += s[k] == '\n';
        i = end;
    }
    for (int t = 0; t < ntemplates; t++) {
        if (!rc) template_instances(out, &host, templates[t]);
        free(templates[t]);
    }
    free(templates);
    sb_free(&host);
    if (rc) cuda_device_source_free(out);
    return rc;
}

void cuda_device_source_free(CudaDeviceSource *s)
{
    sb_free(&s->text);
    sb_free(&s->common);
    sb_free(&s->host);
    for (int i = 0; i < s->nkernel_texts; i++) free(s->kernels[i]);
    free(s->kernels);
    for (int i = 0; i < s->nkernel_names; i++) free(s->kernel_names[i]);
    free(s->kernel_names);
    for (int i = 0; i < s->nnames; i++) free(s->names[i]);
    free(s->names);
    memset(s, 0, sizeof *s);
}
