/* prune.c — the generated functions declare only the names they use.
 *
 * The kernel generators declare every symbol (T, B), every dim (S0, S1) and every
 * coordinate (c0, c1) a kernel might read, since which ones its members read is known only
 * once its statements are written. Rather than mark the rest `(void)x;` (noise in model.c:
 * hundreds of lines), this pass reads each function once it is written and drops the
 * integer declarations that nothing in their scope reads, repeatedly (S0 may be read only
 * by an unused c0), and every `(void)x;` statement. In C++ (the CUDA target) a parameter
 * nothing reads loses its name, which keeps the signature (and -Wextra quiet); C11 needs
 * the name, which -Wall does not mind. Only the declarations of pure integer expressions go:
 * the generated code computes the same values. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "c_internal.h"

typedef struct {
    char **line;  /* the function's lines (without '\n'); NULL: removed */
    char **code;  /* the same, comments and strings blanked to spaces */
    int n;
} Lines;

static bool ident_char(char ch) { return (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'; }

/* code[] from line[]: comments and string and character literals become spaces. */
static void blank(Lines *f)
{
    bool comment = false;
    for (int i = 0; i < f->n; i++) {
        free(f->code[i]);
        f->code[i] = NULL;
        if (!f->line[i]) continue;
        char *s = xstrdup(f->line[i]);
        for (size_t j = 0; s[j];) {
            if (comment) {
                if (s[j] == '*' && s[j + 1] == '/') {
                    s[j] = s[j + 1] = ' ';
                    j += 2;
                    comment = false;
                } else {
                    s[j++] = ' ';
                }
            } else if (s[j] == '/' && s[j + 1] == '*') {
                s[j] = s[j + 1] = ' ';
                j += 2;
                comment = true;
            } else if (s[j] == '/' && s[j + 1] == '/') {
                while (s[j]) s[j++] = ' ';
            } else if (s[j] == '"' || s[j] == '\'') {
                const char q = s[j];
                s[j++] = ' ';
                while (s[j] && s[j] != q) {
                    if (s[j] == '\\' && s[j + 1]) s[j++] = ' ';
                    s[j++] = ' ';
                }
                if (s[j]) s[j++] = ' ';
            } else {
                j++;
            }
        }
        f->code[i] = s;
    }
}

/* Whether `name` is read after position `at` of line `li` until its block closes, the
 * `(void)name;` statements aside (they are going). */
static bool used_after(const Lines *f, int li, size_t at, const char *name, size_t len)
{
    int depth = 0;
    const char first = name[0];
    for (int i = li; i < f->n; i++) {
        const char *s = f->code[i];
        if (!s) continue;
        size_t j = i == li ? at : 0;
        const char *t = s + j;
        while (*t == ' ') t++;
        if (!strncmp(t, "(void)", 6)) continue; /* a (void) line names without reading */
        for (; s[j]; j++) {
            const char ch = s[j];
            if (ch == '{') depth++;
            else if (ch == '}' && --depth < 0) return false;
            else if (ch == first && (j == 0 || !ident_char(s[j - 1])) && !strncmp(s + j, name, len) && !ident_char(s[j + len])) return true;
        }
    }
    return false;
}

/* Whether code line s is only `(void)x;` statements. */
static bool void_line(const char *s)
{
    bool any = false;
    for (;;) {
        while (*s == ' ') s++;
        if (!*s) return any;
        if (strncmp(s, "(void)", 6)) return false;
        s += 6;
        if (!ident_char(*s)) return false;
        while (ident_char(*s)) s++;
        if (*s++ != ';') return false;
        any = true;
    }
}

/* A pure integer initializer: no assignment, increment or decrement. */
static bool pure(const char *s, size_t from, size_t to)
{
    for (size_t j = from; j < to; j++) {
        if ((s[j] == '+' || s[j] == '-') && j + 1 < to && (s[j + 1] == s[j] || s[j + 1] == '=')) return false;
        if (s[j] == '=' && j + 1 < to && s[j + 1] != '=' && (j == from || !strchr("=<>!", s[j - 1]))) return false;
    }
    return true;
}

/* Drops the unread declarators of an integer declaration at line li; returns whether it
 * changed anything. */
static bool prune_declaration(Lines *f, int li)
{
    static const char *const types[] = {"const int64_t ", "int64_t ", "const int "};
    const char *s = f->code[li];
    size_t at = 0;
    while (s[at] == ' ') at++;
    size_t head = 0;
    for (size_t t = 0; t < sizeof types / sizeof *types && !head; t++)
        if (!strncmp(s + at, types[t], strlen(types[t]))) head = at + strlen(types[t]);
    if (!head) return false;
    /* the declarators, split at the top level's commas */
    size_t from[16], to[16], semi = 0;
    int nd = 0, depth = 0;
    from[0] = head;
    for (size_t j = head; s[j]; j++) {
        if (s[j] == '(' || s[j] == '[') depth++;
        else if (s[j] == ')' || s[j] == ']') depth--;
        else if (depth == 0 && (s[j] == ',' || s[j] == ';')) {
            if (nd == 16) return false;
            to[nd++] = j;
            if (s[j] == ';') {
                semi = j;
                break;
            }
            from[nd] = j + 1;
        }
    }
    if (!semi) return false;
    for (size_t j = semi + 1; s[j]; j++)
        if (s[j] != ' ') return false;
    bool keep[16], changed = false;
    for (int d = 0; d < nd; d++) {
        size_t b = from[d];
        while (s[b] == ' ') b++;
        size_t e = b;
        while (ident_char(s[e])) e++;
        size_t r = e;
        while (s[r] == ' ') r++;
        keep[d] = true;
        if (e == b || (s[r] != '=' && r != to[d]) || !pure(s, r + 1, to[d])) continue;
        char name[128];
        if (e - b >= sizeof name) continue;
        memcpy(name, s + b, e - b);
        name[e - b] = 0;
        keep[d] = used_after(f, li, to[d], name, e - b);
        changed |= !keep[d];
    }
    if (!changed) return false;
    /* the same line with the kept declarators (the original's text, comment and all), and
     * its blanked code cut the same way (the two are the same length, column for column) */
    size_t x[16]; /* where each kept declarator's text starts: the first's after its spaces */
    bool any = false;
    for (int d = 0; d < nd; d++) {
        x[d] = from[d];
        if (!keep[d]) continue;
        while (!any && f->line[li][x[d]] == ' ') x[d]++;
        any = true;
    }
    char **v[2] = {&f->line[li], &f->code[li]};
    for (int k = 0; k < 2; k++) {
        const char *o = *v[k];
        StrBuf b;
        sb_init(&b);
        sb_putn(&b, o, head);
        bool first = true;
        for (int d = 0; d < nd; d++) {
            if (!keep[d]) continue;
            sb_puts(&b, first ? "" : ",");
            sb_putn(&b, o + x[d], to[d] - x[d]);
            first = false;
        }
        sb_puts(&b, o + semi);
        if (!any) sb_free(&b);
        free(*v[k]);
        *v[k] = any ? b.data : NULL;
    }
    return true;
}

/* C++: the names of the parameters of signature line li that nothing in the body reads. */
static void unname_parameters(Lines *f, int li)
{
    const char *s = f->code[li];
    size_t close = strlen(s);
    while (close && s[close - 1] != ')') close--;
    if (!close) return;
    close--;
    size_t open = close;
    for (int depth = 0; open > 0; open--) {
        if (s[open] == ')') depth++;
        else if (s[open] == '(' && --depth == 0) break;
    }
    if (s[0] == ' ' || s[open] != '(') return; /* not a whole signature on one line */
    StrBuf b;
    sb_init(&b);
    size_t copied = 0;
    for (size_t p = open + 1; p < close;) {
        size_t q = p;
        for (int depth = 0; q < close && (depth || s[q] != ','); q++) depth += s[q] == '(' ? 1 : s[q] == ')' ? -1 : 0;
        size_t e = q;
        while (e > p && s[e - 1] == ' ') e--;
        size_t n = e;
        while (n > p && ident_char(s[n - 1])) n--;
        bool named = n > p && n < e && (s[n - 1] == ' ' || s[n - 1] == '*');
        if (named && !used_after(f, li + 1, 0, s + n, e - n)) {
            size_t cut = n;
            while (cut > p && s[cut - 1] == ' ') cut--;
            sb_putn(&b, f->line[li] + copied, cut - copied);
            copied = e;
        }
        p = q + 1;
    }
    if (!copied) {
        sb_free(&b);
        return;
    }
    sb_puts(&b, f->line[li] + copied);
    free(f->line[li]);
    f->line[li] = b.data;
}

/* Prunes the function whose lines are f (its signature first, "{" second, "}" last). */
static void prune_function(Lines *f, bool cxx)
{
    blank(f);
    for (int i = 2; i < f->n; i++)
        if (f->code[i] && void_line(f->code[i])) {
            free(f->line[i]);
            free(f->code[i]);
            f->line[i] = f->code[i] = NULL;
        }
    /* prune_declaration keeps code[] in step with line[]: no blanking again */
    for (bool changed = true; changed;) {
        changed = false;
        for (int i = 2; i < f->n; i++)
            if (f->code[i] && prune_declaration(f, i)) changed = true;
    }
    if (cxx) unname_parameters(f, 0);
}

void cg_prune_unused(StrBuf *o, size_t start, bool cxx)
{
    StrBuf r;
    sb_init(&r);
    sb_putn(&r, o->data, start);
    const char *p = o->data + start;
    while (*p) {
        /* a function: a line that is "{" after its signature's line, to the next "}" line */
        const char *open = strstr(p, "\n{\n");
        const char *close = open ? strstr(open, "\n}\n") : NULL;
        if (!close) break;
        const char *sig = open;
        while (sig > p && sig[-1] != '\n') sig--;
        sb_putn(&r, p, (size_t)(sig - p));
        Lines f = {0};
        for (const char *l = sig; l <= close;) {
            const char *e = strchr(l, '\n');
            f.line = xrealloc(f.line, (size_t)(f.n + 1) * sizeof *f.line);
            f.line[f.n] = xmalloc((size_t)(e - l) + 1);
            memcpy(f.line[f.n], l, (size_t)(e - l));
            f.line[f.n][e - l] = 0;
            f.n++;
            l = e + 1;
        }
        /* the "}" line */
        f.line = xrealloc(f.line, (size_t)(f.n + 1) * sizeof *f.line);
        f.line[f.n++] = xstrdup("}");
        f.code = xcalloc((size_t)f.n, sizeof *f.code);
        prune_function(&f, cxx);
        for (int i = 0; i < f.n; i++) {
            if (f.line[i]) sb_printf(&r, "%s\n", f.line[i]);
            free(f.line[i]);
            free(f.code[i]);
        }
        free(f.line);
        free(f.code);
        p = close + 3;
    }
    sb_puts(&r, p);
    sb_free(o);
    *o = r;
}

/* The name of the __global__ kernel whose signature starts line s (NULL if none), in b. */
static bool kernel_signature(const char *s, StrBuf *b)
{
    static const char head[] = "__global__ void __launch_bounds__(";
    if (strncmp(s, head, sizeof head - 1)) return false;
    const char *p = strchr(s + sizeof head - 1, ')');
    if (!p) return false;
    p++;
    while (*p == ' ') p++;
    const char *e = p;
    while (ident_char(*e)) e++;
    if (e == p || *e != '(') return false;
    sb_putn(b, p, (size_t)(e - p));
    return true;
}

/* Copies text to r with the identifiers that renames maps replaced by names[]. */
void cg_put_renamed(StrBuf *r, const char *text, size_t n, const StrMap *renames, char *const *names)
{
    char tok[256];
    for (size_t j = 0; j < n;) {
        if (!ident_char(text[j]) || (j && ident_char(text[j - 1]))) {
            sb_putc(r, text[j++]);
            continue;
        }
        size_t e = j;
        while (e < n && ident_char(text[e])) e++;
        int32_t v = -1;
        if (e - j < sizeof tok && renames->n) {
            memcpy(tok, text + j, e - j);
            tok[e - j] = 0;
            v = strmap_get(renames, tok, -1);
        }
        if (v >= 0) sb_puts(r, names[v]);
        else sb_putn(r, text + j, e - j);
        j = e;
    }
}

int cg_share_cuda_kernels(StrBuf *o, CgNames *record)
{
    StrMap codes = {0}, renames = {0};
    char **owned = NULL, **names = NULL;
    int nowned = 0, capowned = 0, nnames = 0, capnames = 0, gone = 0;
    StrBuf r;
    sb_init(&r);
    const char *p = o->data, *copied = p;
    for (const char *line = p; *line;) {
        const char *next = strchr(line, '\n');
        next = next ? next + 1 : line + strlen(line);
        StrBuf name;
        sb_init(&name);
        const char *end = kernel_signature(line, &name) ? strstr(line, "\n}\n") : NULL;
        if (!end) {
            sb_free(&name);
            line = next;
            continue;
        }
        end += 3;
        StrBuf text, code;
        sb_init(&text);
        sb_init(&code);
        /* the key: the kernel without its name (its launch bounds included) */
        const char *at = strstr(line, name.data);
        sb_putn(&text, line, (size_t)(at - line));
        sb_putn(&text, at + name.len, (size_t)(end - at - name.len));
        cg_canonical_code(text.data, &code);
        sb_free(&text);
        int32_t j = strmap_get(&codes, code.data, -1);
        if (j < 0) { /* the first of its code: kept (with its launches renamed in it) */
            GROW(owned, capowned, nowned + 2);
            owned[nowned++] = code.data;
            GROW(names, capnames, nnames + 1);
            names[nnames] = name.data;
            strmap_put(&codes, code.data, nnames++);
            cg_put_renamed(&r, copied, (size_t)(end - copied), &renames, names);
        } else { /* the same code: gone, with the comment before it; its launches call the first */
            const char *from = line;
            if (from - 3 >= copied && !strncmp(from - 3, "*/\n", 3)) {
                const char *c = from - 3;
                while (c > copied && strncmp(c, "/*", 2)) c--;
                while (c > copied && c[-1] != '\n') c--;
                from = c;
            }
            cg_put_renamed(&r, copied, (size_t)(from - copied), &renames, names);
            GROW(owned, capowned, nowned + 2);
            owned[nowned++] = name.data;
            strmap_put(&renames, name.data, j);
            if (record) cg_names_merge(record, name.data, names[j]);
            sb_free(&code);
            if (*end == '\n') end++; /* the blank line after it */
            gone++;
        }
        copied = line = end;
    }
    cg_put_renamed(&r, copied, strlen(copied), &renames, names);
    for (int i = 0; i < nowned; i++) free(owned[i]);
    for (int i = 0; i < nnames; i++) free(names[i]);
    free(owned);
    free(names);
    strmap_free(&codes);
    strmap_free(&renames);
    sb_free(o);
    *o = r;
    return gone;
}
