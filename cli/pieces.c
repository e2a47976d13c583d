/* pieces.c — cuts a generated model.c into pieces that compile on their own (pieces.h).
 * model.c itself stays one readable file (kiln emit writes it as it is); the pieces are
 * cut out of its text here: the header (includes, the KILN_KERNEL macro), then
 *   - kernel pieces: the header and a group of kernels, grouped by the kernels' own code,
 *   - the recipe piece: the train section's kiln_recipe (lr, batch, steps...), so that a
 *     change of the recipe recompiles only this small piece of data,
 *   - the host piece: the rest (tables, the step functions, kiln_model_def), with a
 *     declaration of every kernel and of the recipe.
 * Every piece defines KILN_PART, so that KILN_KERNEL gives the kernels hidden visibility
 * and the pieces link into one program. */
#include "pieces.h"

#include <stdlib.h>
#include <string.h>

#include "../util/util.h"

/* ---- hashing ---- */

static uint64_t rotl64(uint64_t x, int r) { return x << r | x >> (64 - r); }

static uint64_t fmix64(uint64_t k)
{
    k ^= k >> 33;
    k *= UINT64_C(0xff51afd7ed558ccd);
    k ^= k >> 33;
    k *= UINT64_C(0xc4ceb9fe1a85ec53);
    k ^= k >> 33;
    return k;
}

/* MurmurHash3's x64 128-bit mixing over 16-byte blocks, from the state h. */
void pieces_hash128(const void *data, size_t n, uint64_t h[2])
{
    const unsigned char *p = data;
    const uint64_t c1 = UINT64_C(0x87c37b91114253d5), c2 = UINT64_C(0x4cf5ad432745937f);
    uint64_t h1 = h[0] ^ UINT64_C(0x9e3779b97f4a7c15), h2 = h[1];
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        uint64_t k1, k2;
        memcpy(&k1, p + i, 8);
        memcpy(&k2, p + i + 8, 8);
        h1 ^= rotl64(k1 * c1, 31) * c2;
        h1 = (rotl64(h1, 27) + h2) * 5 + 0x52dce729;
        h2 ^= rotl64(k2 * c2, 33) * c1;
        h2 = (rotl64(h2, 31) + h1) * 5 + 0x38495ab5;
    }
    unsigned char tail[16] = {0};
    memcpy(tail, p + i, n - i);
    uint64_t k1, k2;
    memcpy(&k1, tail, 8);
    memcpy(&k2, tail + 8, 8);
    h1 ^= rotl64(k1 * c1, 31) * c2;
    h2 ^= rotl64(k2 * c2, 33) * c1;
    h1 ^= (uint64_t)n;
    h2 ^= (uint64_t)n;
    h1 += h2;
    h2 += h1;
    h1 = fmix64(h1);
    h2 = fmix64(h2);
    h1 += h2;
    h2 += h1;
    h[0] = h1;
    h[1] = h2;
}

/* ---- comments ---- */

char *pieces_strip_comments(const char *s, size_t len, size_t *out_len)
{
    char *o = xmalloc(len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len;) {
        char ch = s[i];
        if (ch == '"' || ch == '\'') { /* a literal, escapes and all */
            o[k++] = s[i++];
            while (i < len && s[i] != ch && s[i] != '\n') {
                if (s[i] == '\\' && i + 1 < len) o[k++] = s[i++];
                o[k++] = s[i++];
            }
            if (i < len) o[k++] = s[i++];
        } else if (ch == '/' && i + 1 < len && s[i + 1] == '*') {
            i += 2;
            while (i < len && !(s[i] == '*' && i + 1 < len && s[i + 1] == '/')) {
                if (s[i] == '\n') o[k++] = '\n';
                i++;
            }
            i = i + 2 < len ? i + 2 : len;
            o[k++] = ' ';
        } else if (ch == '/' && i + 1 < len && s[i + 1] == '/') {
            while (i < len && s[i] != '\n') i++;
        } else {
            o[k++] = s[i++];
        }
    }
    o[k] = 0;
    *out_len = k;
    return o;
}

/* ---- splitting ---- */

static const char kernel_sig[] = "KILN_KERNEL void ";
static const char piece_prelude[] = "#define KILN_PART 2 /* a piece of model.c, compiled on its own (cli/pieces.c) */\n";

/* The start of the line after the one at p (or end). */
static const char *next_line(const char *p, const char *end)
{
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    return nl ? nl + 1 : end;
}

/* Where a kernel's leading comment starts, if the line before `at` ends a comment. */
static const char *comment_start(const char *begin, const char *at)
{
    if (at - begin < 3 || memcmp(at - 3, "*/\n", 3)) return at;
    for (const char *p = at - 3; p > begin; p--)
        if (p[0] == '/' && p[1] == '*' && (p == begin || p[-1] == '\n')) return p;
    return at;
}

static void add_piece(PieceSet *s, PieceKind kind, StrBuf *text, int nkernels)
{
    s->v = xrealloc(s->v, (size_t)(s->n + 1) * sizeof *s->v);
    Piece *p = &s->v[s->n++];
    p->kind = kind;
    p->len = text->len;
    p->text = text->data ? text->data : xstrdup("");
    p->nkernels = nkernels;
    p->cacheable = !strstr(p->text, ".incbin");
    sb_init(text);
}

static void whole(const char *model_c, size_t len, PieceSet *out)
{
    StrBuf b;
    sb_init(&b);
    sb_putn(&b, model_c, len);
    add_piece(out, PIECE_WHOLE, &b, 0);
}

bool pieces_group_ends(const char *p, const char *stop, int split, int n, int max)
{
    size_t len;
    char *code = pieces_strip_comments(p, (size_t)(stop - p), &len);
    uint64_t h[2] = {0, 0};
    pieces_hash128(code, len, h);
    free(code);
    return split <= 1 || h[0] % (uint64_t)split == 0 || n >= max;
}

/* The step's parts in the host text (codegen/host.c splits a step of over 256 kernels into
 * noinline functions `static void <step>_step_partN(kiln_step_io *io)`): a 10,000-layer
 * chain's host code was one piece of 200 parts, 25 s of one core. Moves each part, with
 * its leading comment, to *parts (made visible to the host piece), and puts its declaration
 * among the host's prototypes (*protos). */
static const char part_sig[] = "__attribute__((noinline)) static void ";

/* The host's tables that a step's parts read (its index checks: where a bad index is
 * reported), made visible to the parts' pieces: defined hidden rather than static in the
 * host piece, declared in the parts' header. */
static void share_step_tables(StrBuf *host, StrBuf *header)
{
    static const char def[] = "static const kiln_index_check ";
    StrBuf h;
    sb_init(&h);
    const char *copied = host->data;
    for (const char *p = strstr(host->data, def); p; p = strstr(p + 1, def)) {
        if (p != host->data && p[-1] != '\n') continue;
        const char *name = p + sizeof def - 1;
        const size_t n = strcspn(name, "[ ");
        sb_printf(header, "extern KILN_KERNEL const kiln_index_check %.*s[]; /* the host piece's */\n", (int)n, name);
        sb_putn(&h, copied, (size_t)(p - copied));
        sb_puts(&h, "KILN_KERNEL const kiln_index_check ");
        copied = name;
    }
    if (copied == host->data) {
        sb_free(&h);
        return;
    }
    sb_puts(&h, copied);
    sb_free(host);
    *host = h;
}

static void take_step_parts(StrBuf *host, StrBuf *protos, PieceSet *out, StrBuf *header, int split)
{
    if (!host->data || !strstr(host->data, "_step_part")) return;
    share_step_tables(host, header);
    StrBuf h, cur;
    sb_init(&h);
    sb_init(&cur);
    int ncur = 0;
    const char *copied = host->data, *end = host->data + host->len;
    for (const char *p = host->data; p < end;) {
        const char *open = NULL;
        if (!strncmp(p, part_sig, sizeof part_sig - 1)) {
            const char *paren = strstr(p, "(kiln_step_io *io)\n{\n"), *nl = strchr(p, '\n');
            const char *name = p + sizeof part_sig - 1;
            if (paren && paren < nl && strstr(name, "_step_part") && strstr(name, "_step_part") < paren) open = paren;
        }
        if (!open) {
            p = next_line(p, end);
            continue;
        }
        const char *close = strstr(open, "\n}\n");
        if (!close) break;
        const char *start = comment_start(copied, p), *stop = close + 3;
        const char *name = p + sizeof part_sig - 1;
        sb_putn(&h, copied, (size_t)(start - copied));
        copied = stop;
        sb_printf(protos, "KILN_KERNEL void %.*s(kiln_step_io *io);\n", (int)(open - name), name);
        if (!cur.len) sb_putn(&cur, header->data, header->len);
        sb_putn(&cur, start, (size_t)(p - start));
        sb_puts(&cur, "__attribute__((noinline)) KILN_KERNEL void ");
        sb_putn(&cur, name, (size_t)(stop - name));
        sb_putc(&cur, '\n');
        ncur++;
        if (pieces_group_ends(p, stop, split, ncur, PIECES_MAX_STEP_PARTS)) {
            add_piece(out, PIECE_STEP, &cur, 0);
            ncur = 0;
        }
        p = stop;
    }
    if (ncur) add_piece(out, PIECE_STEP, &cur, 0);
    sb_putn(&h, copied, (size_t)(end - copied));
    sb_free(host);
    sb_free(&cur);
    *host = h;
}

/* The recipe's definitions in the host text: `static const ... recipe...` at the start of
 * a line, each up to its "\n};\n". Moves them to *recipe (the struct made visible to the
 * host piece) and puts the struct's declaration in the host in their place. */
static void take_recipe(StrBuf *host, StrBuf *recipe)
{
    static const char def[] = "static const kiln_recipe recipe = {\n";
    char *at = strstr(host->data ? host->data : "", def);
    if (!at || (at != host->data && at[-1] != '\n')) return;
    /* the arrays it points to come just before it, with no blank line (codegen/host.c's
     * emit_recipe): from the line after the last blank one */
    char *first = at;
    for (char *p = at - 1; p > host->data; p--)
        if (p[0] == '\n' && p[-1] == '\n') {
            if (p + 1 < at && !strncmp(p + 1, "static const ", 13)) {
                const char *nl = strchr(p + 1, '\n'), *r = strstr(p + 1, " recipe_");
                if (r && r < nl) first = p + 1;
            }
            break;
        }
    char *end = strstr(at, "\n};\n");
    if (!end) return;
    end += 4;
    size_t a = (size_t)(first - host->data), d = (size_t)(at - host->data), e = (size_t)(end - host->data);
    sb_putn(recipe, host->data + a, d - a);
    sb_puts(recipe, "KILN_KERNEL const kiln_recipe recipe = {\n");
    sb_putn(recipe, host->data + d + strlen(def), e - d - strlen(def));
    StrBuf h;
    sb_init(&h);
    sb_putn(&h, host->data, a);
    sb_puts(&h, "extern KILN_KERNEL const kiln_recipe recipe; /* the recipe's piece */\n");
    sb_putn(&h, host->data + e, host->len - e);
    sb_free(host);
    *host = h;
}

static void split_text(const char *model_c, size_t len, int split, PieceSet *out);

void pieces_split(const char *model_c, size_t len, int split, PieceSet *out)
{
    /* the scans below (strstr) stop at a NUL: one at len */
    char *text = xstrndup(model_c, len);
    split_text(text, strlen(text), split, out);
    free(text);
}

static void split_text(const char *model_c, size_t len, int split, PieceSet *out)
{
    memset(out, 0, sizeof *out);
    const char *end = model_c + len;
    /* the header: up to the first KILN_PART guard */
    const char *body = NULL;
    for (const char *p = model_c; p < end; p = next_line(p, end))
        if (!strncmp(p, "#if KILN_PART", 13)) {
            body = p;
            break;
        }
    if (!body || !strstr(model_c, "#ifdef KILN_PART\n")) {
        whole(model_c, len, out);
        return;
    }
    StrBuf header, host, protos, cur;
    sb_init(&header);
    sb_init(&host);
    sb_init(&protos);
    sb_init(&cur);
    sb_puts(&header, piece_prelude);
    sb_putn(&header, model_c, (size_t)(body - model_c));
    StrBuf inc;
    sb_init(&inc);
    for (const char *p = model_c; p < body; p = next_line(p, body))
        if (!strncmp(p, "#include ", 9)) sb_putn(&inc, p, (size_t)(next_line(p, body) - p));
    out->includes = inc.data;
    int ncur = 0;
    const char *copied = body; /* host text not yet copied */
    for (const char *p = body; p < end;) {
        if (strncmp(p, kernel_sig, sizeof kernel_sig - 1)) {
            p = next_line(p, end);
            continue;
        }
        const char *semi = strstr(p, ");\n"), *open = strstr(p, ")\n{\n");
        if (!open || (semi && semi < open)) { /* a declaration: the host gets all of them anyway */
            const char *after = semi ? semi + 3 : end;
            sb_putn(&host, copied, (size_t)(p - copied));
            copied = p = after;
            continue;
        }
        const char *close = strstr(open, "\n}\n");
        if (!close) {
            sb_free(&header), sb_free(&host), sb_free(&protos), sb_free(&cur);
            pieces_free(out); /* (and the includes) */
            whole(model_c, len, out);
            return;
        }
        const char *start = comment_start(copied, p), *stop = close + 3;
        sb_putn(&host, copied, (size_t)(start - copied));
        copied = stop;
        sb_putn(&protos, p, (size_t)(open - p) + 1);
        sb_puts(&protos, ";\n");
        if (!cur.len) sb_putn(&cur, header.data, header.len);
        sb_putn(&cur, start, (size_t)(stop - start));
        sb_putc(&cur, '\n');
        ncur++;
        if (pieces_group_ends(p, stop, split, ncur, PIECES_MAX_KERNELS)) {
            add_piece(out, PIECE_KERNELS, &cur, ncur);
            ncur = 0;
        }
        p = stop;
    }
    if (ncur) add_piece(out, PIECE_KERNELS, &cur, ncur);
    sb_putn(&host, copied, (size_t)(end - copied));
    /* the step's parts, after the kernels: they call them (their prototypes come first) */
    StrBuf part_header;
    sb_init(&part_header);
    sb_putn(&part_header, header.data, header.len);
    if (protos.len) {
        sb_puts(&part_header, "/* the kernels, compiled in the other pieces */\n");
        sb_putn(&part_header, protos.data, protos.len);
    }
    take_step_parts(&host, &protos, out, &part_header, PIECES_SPLIT_STEP_PARTS);
    sb_free(&part_header);
    StrBuf recipe;
    sb_init(&recipe);
    take_recipe(&host, &recipe);
    if (recipe.len) { /* data of kiln_model.h's types: that header alone */
        StrBuf r;
        sb_init(&r);
        sb_puts(&r, piece_prelude);
        sb_puts(&r, "#include <stddef.h>\n#include \"kiln_model.h\"\n#define KILN_KERNEL __attribute__((visibility(\"hidden\")))\n\n");
        sb_putn(&r, recipe.data, recipe.len);
        add_piece(out, PIECE_RECIPE, &r, 0);
    }
    sb_free(&recipe);
    StrBuf h;
    sb_init(&h);
    sb_putn(&h, header.data, header.len);
    if (protos.len) {
        sb_puts(&h, "/* the kernels and the step's parts, compiled in the other pieces */\n");
        sb_putn(&h, protos.data, protos.len);
    }
    sb_putn(&h, host.data, host.len);
    add_piece(out, PIECE_HOST, &h, 0);
    sb_free(&header);
    sb_free(&host);
    sb_free(&protos);
    sb_free(&cur);
}

void pieces_free(PieceSet *s)
{
    for (int i = 0; i < s->n; i++) free(s->v[i].text);
    free(s->v);
    free(s->includes);
    memset(s, 0, sizeof *s);
}
