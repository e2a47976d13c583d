/* names.c — the names of the generated kernel functions, taken from the model: the module
 * path and role of the layer a kernel computes (train_h3_ln_2_fwd), or, for a function
 * several layers share, what those layers have in common: their module type
 * (train_LayerNorm_fwd) or their path with the varying index dropped (train_h_attn_bwd).
 *
 * A function's users are known only once the whole file is written (the C target shares a
 * function as it writes the next kernel with the same code, the CUDA target after the file
 * is done, cg_share_cuda_kernels), so the generators write provisional names (train_k11_rows,
 * unique in the file), record here which kernel calls which function (cg_names_record), and
 * cg_names_apply renames them in the finished text. */
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "kernel.h"

/* ---- what a kernel computes ---- */

static int cmp_u32(const void *a, const void *b)
{
    const uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

NodeId cg_kernel_scope_node(const Cg *c, int32_t k)
{
    const Kernel *K = &c->fp.kernels[k];
    const NodeId *m = c->fp.members + K->first;
    /* sorted, so that a kernel of many members (a chain of 50,000 ops) takes n log n */
    uint32_t *sc = xmalloc((size_t)K->count * sizeof *sc + 1);
    for (int32_t i = 0; i < K->count; i++) sc[i] = N(c, m[i])->scope;
    qsort(sc, (size_t)K->count, sizeof *sc, cmp_u32);
    uint32_t best = 0;
    int32_t best_n = 0;
    for (int32_t i = 0, j; i < K->count; i = j) {
        for (j = i; j < K->count && sc[j] == sc[i]; j++) {}
        if (sc[i] && j - i >= best_n) best = sc[i], best_n = j - i;
    }
    free(sc);
    if (N(c, K->anchor)->scope == best) return K->anchor;
    for (int32_t i = K->count - 1; i >= 0; i--)
        if (N(c, m[i])->scope == best) return m[i];
    return K->anchor;
}

CgRole cg_kernel_role(const Cg *c, int32_t k, uint32_t scope)
{
    const Kernel *K = &c->fp.kernels[k];
    int back = 0, again = 0, all = 0;
    for (int32_t i = 0; i < K->count; i++) {
        const Node *m = N(c, c->fp.members[K->first + i]);
        if (m->scope != scope) continue;
        all++;
        back += (m->flags & NODE_BACKWARD) != 0;
        again += (m->flags & NODE_RECOMPUTED) != 0;
    }
    return 2 * back > all ? CG_ROLE_BACKWARD : 2 * again > all ? CG_ROLE_RECOMPUTE : CG_ROLE_FORWARD;
}

static const char *const role_word[] = {"fwd", "bwd", "recompute"};

/* ---- the record ---- */

/* name relative to the module path scope ("h.0.attn.c_attn.weight" in "h.0.attn":
 * "c_attn.weight"), or NULL where it is not in it. */
static const char *in_module(const char *name, const char *scope)
{
    const size_t n = strlen(scope);
    if (!n) return name;
    return !strncmp(name, scope, n) && name[n] == '.' ? name + n + 1 : NULL;
}

static bool view_or_cast(Op op)
{
    return op == OP_RESHAPE || op == OP_DETACH || op == OP_PERMUTE || op == OP_SLICE || op == OP_EXPAND || op == OP_CAST;
}

/* What kernel k computes, for its name: the gradient of a parameter it writes
 * ("c_attn_weight_grad"), else the submodule whose weights it reads ("c_attn": a Linear's
 * product, forward or backward), else the last variable of its module it assigns (its
 * result), else its operation ("matmul" for a product); id: the node of its module. Owned by the caller. */
static char *kernel_word(const Cg *c, int32_t k, NodeId id)
{
    const Kernel *K = &c->fp.kernels[k];
    const Graph *g = c->g;
    const char *scope = ir_str(g, N(c, id)->scope);
    const char *read = NULL;
    for (int32_t i = 0; i < K->count; i++) {
        const NodeId m = c->fp.members[K->first + i];
        if (c->mp.kind && c->mp.kind[m] == MEM_GRAD) {
            const char *rel = in_module(ir_str(g, g->outputs[c->mp.offset[m]].name), scope);
            if (rel) {
                StrBuf b;
                sb_init(&b);
                sb_printf(&b, "%s_grad", rel);
                return b.data;
            }
        }
        for (uint32_t j = 0; j < N(c, m)->ninputs && !read; j++) {
            NodeId x = ir_input(g, m, (int)j);
            /* through views and casts: a product reads transpose(weight), or its bf16 copy */
            for (int hop = 0; hop < 8 && N(c, x)->ninputs && view_or_cast((Op)N(c, x)->op); hop++) x = ir_input(g, x, 0);
            const char *rel = N(c, x)->op == OP_PARAM ? in_module(ir_node_name(g, x), scope) : NULL;
            if (rel && strchr(rel, '.')) read = rel; /* a submodule's, not the module's own */
        }
    }
    if (read) return xstrndup(read, (size_t)(strrchr(read, '.') - read));
    /* the last variable assigned in the module, the kernel's result where it has one */
    for (int32_t i = K->count - 1; i >= 0; i--) {
        const NodeId m = c->fp.members[K->first + i];
        const Node *n = N(c, m);
        if (n->scope == N(c, id)->scope && n->op != OP_INPUT && n->op != OP_PARAM && *ir_node_name(g, m))
            return xstrdup(ir_node_name(g, m));
    }
    return xstrdup(K->kind == KERNEL_GEMM ? "matmul" : ir_op_info[N(c, id)->op].name);
}

void cg_names_record(Cg *c, int32_t k, const char *function, const char *launcher, const char *suffix)
{
    CgNames *r = &c->names;
    GROW(r->use, r->cap, r->n + 1);
    CgNameUse *u = &r->use[r->n++];
    memset(u, 0, sizeof *u);
    const NodeId id = cg_kernel_scope_node(c, k);
    const Node *n = N(c, id);
    u->function = xstrdup(function);
    u->launcher = launcher ? xstrdup(launcher) : NULL;
    u->suffix = suffix;
    u->prefix = xstrdup(c->prefix);
    u->scope = xstrdup(ir_str(c->g, n->scope));
    u->type = xstrdup(n->scope ? ir_str(c->g, n->scope_type) : "");
    u->word = kernel_word(c, k, id);
    u->op = xstrdup(c->fp.kernels[k].kind == KERNEL_GEMM ? "matmul" : ir_op_info[N(c, c->fp.kernels[k].anchor)->op].name);
    u->role = cg_kernel_role(c, k, n->scope);
}

void cg_names_merge(CgNames *r, const char *gone, const char *kept)
{
    GROW(r->merge_from, r->capmerge, r->nmerge + 1);
    r->merge_to = xrealloc(r->merge_to, (size_t)r->capmerge * sizeof *r->merge_to);
    r->merge_from[r->nmerge] = xstrdup(gone);
    r->merge_to[r->nmerge++] = xstrdup(kept);
}

void cg_names_free(CgNames *r)
{
    for (int32_t i = 0; i < r->n; i++) {
        CgNameUse *u = &r->use[i];
        free(u->function);
        free(u->launcher);
        free(u->prefix);
        free(u->scope);
        free(u->type);
        free(u->word);
        free(u->op);
    }
    for (int32_t i = 0; i < r->nmerge; i++) {
        free(r->merge_from[i]);
        free(r->merge_to[i]);
    }
    free(r->use);
    free(r->merge_from);
    free(r->merge_to);
    memset(r, 0, sizeof *r);
}

/* ---- the names ---- */

/* Strings this file allocates while naming, freed at the end. */
typedef struct {
    char **v;
    int32_t n, cap;
} Owned;

static char *own(Owned *o, char *s)
{
    GROW(o->v, o->cap, o->n + 1);
    o->v[o->n++] = s;
    return s;
}

/* One function, or (for a CUDA launcher of a shared kernel) one use: its users are the
 * uses from `first` along next[]. */
typedef struct {
    const char *provisional;
    int32_t first, last, nuses;
    char *name;
} Group;

/* "h.0.attn" and "h.1.attn" -> "h.attn": the components all paths have in common, where
 * they differ only in indices. False where they differ otherwise. */
static bool common_path(const CgNames *r, const int32_t *next, int32_t first, StrBuf *out)
{
    const char *p0 = r->use[first].scope;
    int n0 = 1;
    for (const char *s = p0; *s; s++) n0 += *s == '.';
    for (int comp = 0; comp < n0; comp++) {
        /* component comp of each path */
        const char *want = NULL;
        size_t wlen = 0;
        bool same = true, indices = true;
        for (int32_t u = first; u >= 0; u = next[u]) {
            const char *s = r->use[u].scope;
            for (int i = 0; i < comp && s; i++) {
                s = strchr(s, '.');
                if (s) s++;
            }
            if (!s || !*r->use[u].scope) return false;
            const char *e = strchr(s, '.');
            size_t len = e ? (size_t)(e - s) : strlen(s);
            if (comp == n0 - 1 && e) return false; /* a longer path */
            if (!want) want = s, wlen = len;
            else if (len != wlen || strncmp(s, want, len)) same = false;
            for (size_t i = 0; i < len; i++) indices &= isdigit((unsigned char)s[i]) != 0;
            indices &= len > 0;
        }
        if (!same && !indices) return false;
        if (same) {
            if (out->len) sb_putc(out, '.');
            sb_putn(out, want, wlen);
        }
    }
    return out->len > 0;
}

/* The name's parts common to all users of group g: prefix, module part, word, role. */
static void group_name(const CgNames *r, const int32_t *next, const Group *g, bool with_word, StrBuf *b)
{
    const CgNameUse *u0 = &r->use[g->first];
    bool same_scope = true, same_type = *u0->type != 0, same_role = true, same_word = true, same_op = true;
    for (int32_t u = next[g->first]; u >= 0; u = next[u]) {
        const CgNameUse *x = &r->use[u];
        same_scope &= !strcmp(x->scope, u0->scope);
        same_type &= !strcmp(x->type, u0->type);
        same_role &= x->role == u0->role;
        same_word &= !strcmp(x->word, u0->word);
        same_op &= !strcmp(x->op, u0->op);
    }
    sb_puts(b, u0->prefix);
    StrBuf part;
    sb_init(&part);
    if (same_scope) sb_puts(&part, u0->scope);
    else if (same_type) sb_puts(&part, u0->type);
    else common_path(r, next, g->first, &part);
    if (part.len) {
        sb_putc(b, '_');
        cg_ident_part(b, part.data);
    }
    /* outside any module the word says what it is */
    const char *word = same_word ? u0->word : !part.len && same_op ? u0->op : NULL;
    if (!with_word && part.len) word = NULL;
    if (word) {
        sb_putc(b, '_');
        cg_ident_part(b, word);
    }
    /* a gradient's name says its pass */
    const size_t wl = word ? strlen(word) : 0;
    if (same_role && !(wl > 5 && !strcmp(word + wl - 5, "_grad"))) sb_printf(b, "_%s", role_word[u0->role]);
    sb_free(&part);
}

/* Names each group (with suffix): the short name (module and role) where no other group
 * has the same, else the long one (with the word), then "_2", "_3", ... where names still
 * repeat. taken: the names in use (keys owned by the caller); the new ones are added. */
static void name_groups(const CgNames *r, const int32_t *next, Group *gs, int32_t n, const char *suffix, StrMap *taken,
                        Owned *owned)
{
    char **shorts = xcalloc((size_t)n + 1, sizeof *shorts);
    StrMap count = {0};
    StrBuf b;
    sb_init(&b);
    for (int32_t i = 0; i < n; i++) {
        sb_free(&b);
        group_name(r, next, &gs[i], false, &b);
        sb_puts(&b, r->use[gs[i].first].suffix);
        sb_puts(&b, suffix);
        shorts[i] = xstrdup(b.data);
        strmap_put(&count, shorts[i], strmap_get(&count, shorts[i], 0) + 1);
    }
    for (int32_t i = 0; i < n; i++) {
        sb_free(&b);
        if (strmap_get(&count, shorts[i], 0) == 1) sb_puts(&b, shorts[i]);
        else {
            group_name(r, next, &gs[i], true, &b);
            sb_puts(&b, r->use[gs[i].first].suffix);
            sb_puts(&b, suffix);
        }
        const size_t base = b.len;
        for (int k = 2; strmap_get(taken, b.data, 0); k++) {
            b.len = base;
            b.data[base] = 0;
            sb_printf(&b, "_%d", k);
        }
        gs[i].name = own(owned, xstrdup(b.data));
        strmap_put(taken, gs[i].name, 1);
    }
    for (int32_t i = 0; i < n; i++) free(shorts[i]);
    free(shorts);
    strmap_free(&count);
    sb_free(&b);
}

static bool ident_char(char ch) { return isalnum((unsigned char)ch) || ch == '_'; }

/* The identifiers of text that start with one of the uses' prefixes: names a kernel may not
 * take (the step functions, the tables). Owned copies go to *owned. */
static void reserve_identifiers(const CgNames *r, const char *text, StrMap *taken, Owned *owned)
{
    /* the prefixes: one per graph, so a handful */
    const char *prefix[8];
    int nprefix = 0;
    for (int32_t u = 0; u < r->n; u++) {
        bool known = false;
        for (int i = 0; i < nprefix && !known; i++) known = !strcmp(prefix[i], r->use[u].prefix);
        if (!known && nprefix < 8) prefix[nprefix++] = r->use[u].prefix;
    }
    for (size_t j = 0; text[j];) {
        if (!ident_char(text[j]) || (j && ident_char(text[j - 1]))) {
            j++;
            continue;
        }
        size_t e = j;
        while (ident_char(text[e])) e++;
        bool ours = false;
        for (int i = 0; i < nprefix && !ours; i++) {
            const size_t np = strlen(prefix[i]);
            ours = e - j > np && !strncmp(text + j, prefix[i], np) && text[j + np] == '_';
        }
        if (ours) {
            char *id = xstrndup(text + j, e - j);
            if (strmap_get(taken, id, 0)) free(id);
            else strmap_put(taken, own(owned, id), 1);
        }
        j = e;
    }
}

void cg_names_apply(CgNames *r, StrBuf *o)
{
    if (!r->n) return;
    /* the provisional names that go: the functions, their launchers, the merged kernels */
    StrMap provisional = {0}, merged = {0}, group_of = {0}, taken = {0}, rename = {0};
    for (int32_t i = 0; i < r->n; i++) {
        strmap_put(&provisional, r->use[i].function, 1);
        if (r->use[i].launcher) strmap_put(&provisional, r->use[i].launcher, 1);
    }
    for (int32_t i = 0; i < r->nmerge; i++) {
        strmap_put(&provisional, r->merge_from[i], 1);
        strmap_put(&merged, r->merge_from[i], i);
    }
    Owned owned = {0};
    StrMap reserved = {0};
    reserve_identifiers(r, o->data ? o->data : "", &reserved, &owned);
    for (int32_t i = 0; i < owned.n; i++)
        if (!strmap_get(&provisional, owned.v[i], 0)) strmap_put(&taken, owned.v[i], 1);
    /* the functions, each with its uses */
    int32_t *next = xmalloc((size_t)r->n * sizeof *next + 1);
    Group *fn = xcalloc((size_t)r->n + 1, sizeof *fn);
    int32_t nfn = 0;
    for (int32_t u = 0; u < r->n; u++) {
        const char *f = r->use[u].function;
        for (int32_t m; (m = strmap_get(&merged, f, -1)) >= 0 && strcmp(r->merge_to[m], f);) f = r->merge_to[m];
        int32_t g = strmap_get(&group_of, f, -1);
        next[u] = -1;
        if (g < 0) {
            g = nfn++;
            fn[g] = (Group){.provisional = f, .first = u, .last = u, .nuses = 1};
            strmap_put(&group_of, f, g);
        } else {
            next[fn[g].last] = u;
            fn[g].last = u;
            fn[g].nuses++;
        }
    }
    name_groups(r, next, fn, nfn, "", &taken, &owned);
    /* CUDA's launchers, one per use: a function's own launcher is named after it, a
     * shared kernel's launchers after each use */
    int32_t *solo = xmalloc((size_t)r->n * sizeof *solo + 1); /* next[] of one-use groups */
    Group *launch = xcalloc((size_t)r->n + 1, sizeof *launch);
    int32_t nlaunch = 0;
    for (int32_t u = 0; u < r->n; u++) solo[u] = -1;
    for (int32_t g = 0; g < nfn; g++) {
        const int32_t u = fn[g].first;
        if (fn[g].nuses > 1 || !r->use[u].launcher) continue;
        StrBuf b;
        sb_init(&b);
        sb_printf(&b, "%s_launch", fn[g].name);
        launch[nlaunch++] = (Group){.provisional = r->use[u].launcher, .first = u, .last = u, .nuses = 1, .name = own(&owned, b.data)};
        strmap_put(&taken, b.data, 1);
    }
    Group *shared_launch = launch + nlaunch;
    int32_t nshared = 0;
    for (int32_t g = 0; g < nfn; g++)
        for (int32_t u = fn[g].first; u >= 0 && fn[g].nuses > 1; u = next[u])
            if (r->use[u].launcher) shared_launch[nshared++] = (Group){.provisional = r->use[u].launcher, .first = u, .last = u, .nuses = 1};
    name_groups(r, solo, shared_launch, nshared, "_launch", &taken, &owned);
    nlaunch += nshared;
    /* provisional -> final, then the text */
    int32_t nnames = 0;
    char **names = xmalloc((size_t)(r->n * 2 + r->nmerge + 1) * sizeof *names);
    for (int32_t g = 0; g < nfn; g++) {
        strmap_put(&rename, fn[g].provisional, nnames);
        names[nnames++] = fn[g].name;
    }
    for (int32_t u = 0; u < r->n; u++) { /* a merged kernel's provisional name */
        if (strmap_get(&rename, r->use[u].function, -1) >= 0) continue;
        const char *f = r->use[u].function;
        for (int32_t m; (m = strmap_get(&merged, f, -1)) >= 0 && strcmp(r->merge_to[m], f);) f = r->merge_to[m];
        strmap_put(&rename, r->use[u].function, strmap_get(&rename, f, -1));
    }
    for (int32_t i = 0; i < nlaunch; i++) {
        strmap_put(&rename, launch[i].provisional, nnames);
        names[nnames++] = launch[i].name;
    }
    StrBuf out;
    sb_init(&out);
    cg_put_renamed(&out, o->data ? o->data : "", o->len, &rename, names);
    sb_free(o);
    *o = out;
    free(names);
    free(solo);
    free(launch);
    free(fn);
    free(next);
    for (int32_t i = 0; i < owned.n; i++) free(owned.v[i]);
    free(owned.v);
    strmap_free(&provisional);
    strmap_free(&merged);
    strmap_free(&group_of);
    strmap_free(&taken);
    strmap_free(&rename);
    strmap_free(&reserved);
}
