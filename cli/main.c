/* main.c — the `kiln` command: check a model, print its IR (text or Graphviz), and the
 * help and version texts. Exit status: 0 success, 1 the model has errors (diagnostics on
 * stderr), 2 the command line is wrong. Output files are written atomically (a temp file,
 * fsync, rename), so an interrupted or failed run never leaves a truncated file behind. */
#define _XOPEN_SOURCE 700
#include <errno.h>
#include <math.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "../codegen/codegen.h"
#include "build.h"
#include "options.h"
#include "plot.h"
#include "../runtime/kiln_model.h"
#include <sys/stat.h>

static void print_plan(const Graph *g, const char *after, StrBuf *out);


/* 0 when a file can be created in dir (tried, with a probe file that is removed: the
 * permission bits do not tell for root, read-only mounts or /sys), else the errno. */
static int dir_writable(const char *dir)
{
    size_t n = strlen(dir) + 48;
    char *probe = xmalloc(n);
    snprintf(probe, n, "%s/.kiln-probe-%ld", dir, (long)getpid());
    int fd = open(probe, O_WRONLY | O_CREAT | O_EXCL, 0600);
    int err = fd < 0 ? errno : 0;
    if (fd >= 0) {
        close(fd);
        unlink(probe);
    }
    free(probe);
    return err;
}

/* Checks, before anything is compiled, that the output of `cmd` can be written: for a
 * file (build's program, ir's -o), that its directory exists and is writable and that it
 * is not a directory; for emit's directory, that it is a writable directory or that its
 * parent is (emit creates the last level only). Returns 0, or 2 after one message that
 * names the problem (instead of the C compiler's or the linker's). */
static int check_output(const char *cmd, const char *path, bool is_dir)
{
    struct stat st;
    int err;
    bool exists = stat(path, &st) == 0;
    if (exists && is_dir) {
        if (!S_ISDIR(st.st_mode)) {
            fprintf(stderr, "kiln %s: error: -o %s: exists and is not a directory\n", cmd, path);
            return 2;
        }
        if ((err = dir_writable(path))) {
            fprintf(stderr, "kiln %s: error: -o %s: cannot write in this directory: %s\n", cmd, path, strerror(err));
            return 2;
        }
        return 0;
    }
    if (exists && S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln %s: error: -o %s: is a directory; name the file to write, e.g. -o %s%s%s\n", cmd, path, path,
                path[strlen(path) - 1] == '/' ? "" : "/", !strcmp(cmd, "build") ? "prog" : "out.txt");
        return 2;
    }
    /* The directory that holds path ("." when it has no slash). */
    const char *slash = strrchr(path, '/');
    char *dir = slash ? xstrdup(path) : xstrdup(".");
    if (slash) dir[slash == path ? 1 : slash - path] = 0;
    int rc = 0;
    if (stat(dir, &st) != 0) {
        fprintf(stderr, "kiln %s: error: -o %s: the directory '%s' does not exist\n", cmd, path, dir);
        rc = 2;
    } else if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "kiln %s: error: -o %s: '%s' is not a directory\n", cmd, path, dir);
        rc = 2;
    } else if ((err = dir_writable(dir))) {
        fprintf(stderr, "kiln %s: error: -o %s: cannot write in the directory '%s': %s\n", cmd, path, dir, strerror(err));
        rc = 2;
    }
    free(dir);
    return rc;
}

static Model *load(const Options *o, Diag *d)
{
    StrBuf err;
    sb_init(&err);
    size_t len = 0;
    char *text = util_read_file(o->file, &len, &err);
    if (!text) {
        fprintf(stderr, "kiln: error: %s\n", err.data);
        sb_free(&err);
        return NULL;
    }
    sb_free(&err);
    Model *m = frontend_compile(d, o->file, text, len, o->mode);
    free(text);
    diag_finish(d);
    return m;
}

/* Writes data to path via a temp file in the same directory, fsync and rename. */
static int write_atomic(const char *path, const char *data, size_t len)
{
    size_t pl = strlen(path);
    char *tmp = xmalloc(pl + 32);
    snprintf(tmp, pl + 32, "%s.tmp.%ld", path, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        fprintf(stderr, "kiln: error: %s: cannot create: %s\n", path, strerror(errno));
        free(tmp);
        return 1;
    }
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;
        }
        off += (size_t)w;
    }
    int err = off < len ? errno : 0;
    if (!err && fsync(fd) != 0) err = errno;
    if (close(fd) != 0 && !err) err = errno;
    if (!err && rename(tmp, path) != 0) err = errno;
    if (err) {
        fprintf(stderr, "kiln: error: %s: cannot write: %s\n", path, strerror(err));
        unlink(tmp);
        free(tmp);
        return 1;
    }
    free(tmp);
    return 0;
}

/* 1234567 -> "1,234,567" */
static const char *grouped(int64_t v, char *buf, size_t n)
{
    char raw[32];
    snprintf(raw, sizeof raw, "%lld", (long long)v);
    size_t len = strlen(raw), o = 0;
    for (size_t i = 0; i < len && o + 2 < n; i++) {
        buf[o++] = raw[i];
        size_t left = len - i - 1;
        if (left && left % 3 == 0 && raw[i] != '-') buf[o++] = ',';
    }
    buf[o] = 0;
    return buf;
}

static void format_init(const Graph *g, NodeId id, StrBuf *out)
{
    const Node *n = &g->nodes[id];
    InitKind k = (InitKind)ir_attrs(g, id)[0];
    sb_puts(out, ir_init_name(k));
    if (ir_init_nargs(k) == 1) sb_printf(out, "(%.6g)", n->fattr[0]);
    if (ir_init_nargs(k) == 2) sb_printf(out, "(%.6g, %.6g)", n->fattr[0], n->fattr[1]);
}

static void print_check(const Model *m, const char *file, StrBuf *out)
{
    const Graph *g = m->graph;
    char buf[64];
    sb_printf(out, "model %s (%s)\n\n", g->name, file);
    int64_t total = 0, buffers = 0;
    size_t w = 4;
    for (NodeId i = 0; i < g->nnodes; i++)
        if (g->nodes[i].op == OP_PARAM && strlen(ir_node_name(g, i)) > w) w = strlen(ir_node_name(g, i));
    sb_printf(out, "parameters:\n  %-*s  %-16s %12s  %s\n", (int)w, "name", "shape", "count", "init");
    for (int pass = 0; pass < 2; pass++) {
        bool any = false;
        for (NodeId i = 0; i < g->nnodes; i++) {
            const Node *n = &g->nodes[i];
            if (n->op != OP_PARAM || (ir_attrs(g, i)[1] != 0) != (pass == 0)) continue;
            if (pass == 1 && !any) sb_printf(out, "buffers (saved in checkpoints, not trained):\n");
            any = true;
            int64_t c = ir_shape_max_numel(g, &n->shape);
            if (pass == 0) total += c;
            else buffers += c;
            StrBuf shape, init;
            sb_init(&shape);
            sb_init(&init);
            ir_shape_format(&shape, g, &n->shape);
            if (n->dtype != DT_F32) sb_printf(&shape, " %s", ir_dtype_name((DType)n->dtype));
            format_init(g, i, &init);
            sb_printf(out, "  %-*s  %-16s %12s  %s\n", (int)w, ir_node_name(g, i), shape.data, grouped(c, buf, sizeof buf), init.data);
            sb_free(&shape);
            sb_free(&init);
        }
    }
    sb_printf(out, "total: %s parameters (%.2f MiB as f32)", grouped(total, buf, sizeof buf), (double)total * 4 / (1 << 20));
    if (buffers) sb_printf(out, ", %s buffer elements", grouped(buffers, buf, sizeof buf));
    sb_puts(out, "\n\ninputs:\n");
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_INPUT) continue;
        sb_printf(out, "  %-10s %s", ir_node_name(g, i), ir_dtype_name((DType)g->nodes[i].dtype));
        ir_shape_format(out, g, &g->nodes[i].shape);
        sb_putc(out, '\n');
    }
    sb_puts(out, "outputs:\n");
    for (int32_t i = 0; i < g->noutputs; i++) {
        const Output *o = &g->outputs[i];
        if (o->kind == OUT_UPDATE) continue;
        const Node *n = &g->nodes[o->node];
        sb_printf(out, "  %-10s %s", ir_str(g, o->name), ir_dtype_name((DType)n->dtype));
        ir_shape_format(out, g, &n->shape);
        sb_printf(out, "  (%s)\n", o->kind == OUT_FORWARD ? "forward" : ir_output_kind_name((OutputKind)o->kind));
    }
    if (g->nsyms) {
        sb_puts(out, "sizes:\n");
        for (int i = 0; i < g->nsyms; i++) sb_printf(out, "  %s <= %lld\n", g->syms[i].name, (long long)g->syms[i].max);
    }
    sb_puts(out, "train:\n");
    recipe_print(&m->recipe, out);
    sb_printf(out, "\n%d IR nodes; the model is valid.\n", g->nnodes);
}

static int cmd_gradcheck(const Options *o, Model *m)
{
    GradcheckOptions go = {.seed = o->seed, .tolerance = o->tolerance, .atol = o->atol, .samples = o->samples,
                           .sym_value = o->size, .wrt_inputs = o->inputs};
    GradcheckResult *res;
    int nres;
    StrBuf err;
    sb_init(&err);
    int failures = gradcheck_run(m->graph, &go, &res, &nres, &err);
    if (failures < 0) {
        fprintf(stderr, "%s\n", err.data);
        sb_free(&err);
        return 1;
    }
    size_t w = 9;
    for (int i = 0; i < nres; i++)
        if (strlen(res[i].name) > w) w = strlen(res[i].name);
    printf("gradcheck %s: seed %llu, sizes %lld, double precision\n", o->file, (unsigned long long)o->seed,
           (long long)o->size);
    if (o->atol > 0) printf("pass: |analytic - numeric| <= atol + rtol * |numeric|, rtol %g, atol %g\n", o->tolerance, o->atol);
    else
        printf("pass: |analytic - numeric| <= atol + rtol * |numeric|, rtol %g, atol = rounding noise "
               "100 * eps * max(|loss|, 1) / step\n", o->tolerance);
    printf("  %-*s  %7s  %11s  %11s  %11s  %s\n", (int)w, "parameter", "checked", "max |grad|", "max abs err",
           "max rel err", "verdict");
    int zero = 0, unchecked = 0;
    double worst = 0;
    for (int i = 0; i < nres; i++) {
        const GradcheckResult *r = &res[i];
        static const char *verdicts[] = {"ok", "FAIL", "gradient identically zero", "not checked"};
        printf("  %-*s  %7lld  %11.3e  %11.3e  ", (int)w, r->name, (long long)r->checked, r->max_abs_grad, r->max_abs_error);
        if (r->max_rel_error > 0 || r->verdict == GRADCHECK_PASS || r->verdict == GRADCHECK_FAIL)
            printf("%11.3e", r->max_rel_error);
        else printf("%11s", "-");
        printf("  %s\n", verdicts[r->verdict]);
        if (r->exhausted)
            printf("  %-*s  note: every element was tried; %lld could be checked, the steps of the other %lld all "
                   "cross a kink (relu at 0, a max tie, a flipping comparison)\n",
                   (int)w, "", (long long)r->checked, (long long)r->skipped);
        else if (r->checked < (o->samples < r->numel ? o->samples : r->numel) && r->checked > 0)
            printf("  %-*s  note: only %lld element%s could be checked: the steps of %lld other%s tried cross a kink\n",
                   (int)w, "", (long long)r->checked, r->checked == 1 ? "" : "s", (long long)r->skipped, r->skipped == 1 ? "" : "s");
        else if (r->skipped)
            printf("  %-*s  note: %lld sampled element%s within a step of a kink (relu at 0, a max tie, a flipping "
                   "comparison): replaced by others\n", (int)w, "", (long long)r->skipped, r->skipped == 1 ? "" : "s");
        if (r->detach_at)
            printf("  %-*s  note: a path from it to the loss is cut by detach at %s: its gradient is partial (or zero) "
                   "by design; finite differences hold the detached value fixed\n", (int)w, "", r->detach_at);
        zero += r->verdict == GRADCHECK_ZERO;
        unchecked += r->verdict == GRADCHECK_UNCHECKED;
        if (r->worst_ratio > worst) worst = r->worst_ratio;
    }
    printf("%s: %d of %d tensor%s pass%s", failures ? "FAIL" : "ok", nres - failures - unchecked, nres, nres == 1 ? "" : "s",
           nres - failures - unchecked == 1 ? "es" : "");
    if (zero) printf(" (%d with gradient identically zero)", zero);
    if (unchecked) printf("; %d not checked", unchecked);
    printf("; worst error %.3g of the allowed\n", worst);
    gradcheck_free(res, nres);
    sb_free(&err);
    return failures ? 1 : 0;
}

/* kiln tokens GLOB -o OUT [--exclude GLOB] [--width 2|4]: byte-level tokens of text files. */
static int cmd_tokens(int argc, char **argv)
{
    Options o;
    int rc = cli_parse_options("tokens", argc, argv, &o);
    cli_options_free(&o);
    if (rc >= 0) return rc;
    const char *pattern = o.file, *out = o.output, *exclude = o.exclude;
    int width = o.width;
    krt_array text;
    krt_error err;
    if (krt_text_load(pattern, exclude, &text, &err) != KRT_OK) {
        fprintf(stderr, "kiln: error: %s\n", err.msg);
        return 1;
    }
    int64_t n = krt_array_count(&text);
    int32_t *tokens = xmalloc(sizeof(int32_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) tokens[i] = ((const unsigned char *)text.data)[i];
    krt_status s = krt_tokens_write(out, tokens, n, width, &err);
    free(tokens);
    krt_array_free(&text);
    if (s != KRT_OK) {
        fprintf(stderr, "kiln: error: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "kiln: wrote %lld token%s to %s\n", (long long)n, n == 1 ? "" : "s", out);
    return 0;
}

/* Lowers symbol bounds ("T=64") in a graph: memory is planned for the new bound. */
static int apply_bounds(Graph *g, const char *const *bounds, int n, StrBuf *err)
{
    for (int i = 0; i < n; i++) {
        const char *eq = strchr(bounds[i], '=');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(eq - bounds[i]), bounds[i]);
        int s = ir_find_symbol(g, name);
        char *end;
        long long v = strtoll(eq + 1, &end, 10);
        if (s < 0) {
            sb_printf(err, "kiln: error: --bound %s: the model has no size '%s'", bounds[i], name);
            return -1;
        }
        if (*end || v < 1 || v > g->syms[s].max) {
            sb_printf(err, "kiln: error: --bound %s: must be between 1 and %s's bound %lld", bounds[i], name, (long long)g->syms[s].max);
            return -1;
        }
        g->syms[s].max = v;
    }
    return 0;
}

/* The generated C of the model: the training graph after every pass, and the eval graph. */
static const char *const *g_bounds;
static int g_nbounds;
static bool g_report;
static bool g_cuda; /* emit --target cuda */
static int64_t g_memory_budget; /* --memory-budget: bytes of training memory, 0 = none */
static const char *g_budget_from = "--memory-budget"; /* or the recipe's memory_budget */
static int32_t g_budget_blocks, g_budget_nblocks; /* what it checkpointed, of how many */
static bool g_budget_cheap;                       /* and whether cheap values are recomputed */
static bool g_infer; /* build --infer */
static PrecisionOptions g_precision = {.half = DT_F32}; /* --precision, else the recipe's precision */
static const char *g_precision_from = "precision"; /* or --precision */

static const char *precision_name(DType t) { return t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : "fp32"; }

/* The precision of the build: --precision when given, else the recipe's. */
static void set_precision(const Options *o, const Model *m)
{
    const RecipeValue *p = recipe_get(&m->recipe, "precision");
    const char *name = o->precision ? o->precision : p && p->str ? p->str : "fp32";
    g_precision_from = o->precision ? "--precision" : "precision =";
    int t = recipe_precision_dtype(name);
    g_precision.half = t < 0 ? DT_F32 : (DType)t;
}

/* The loss scaling of the build (after set_precision): the recipe's loss_scale, or by
 * default dynamic for fp16 training (GradScaler's defaults) and none otherwise. The recipe
 * check refused loss scaling keys that do nothing under the recipe's own precision; the
 * same keys under a --precision that is not fp16 are refused here. Returns 0, or 2 after
 * a message. */
static int set_loss_scale(const char *cmd, const Model *m)
{
    const RecipeValue *scale = recipe_get(&m->recipe, "loss_scale"), *init = recipe_get(&m->recipe, "loss_scale_init"),
                      *interval = recipe_get(&m->recipe, "loss_scale_growth_interval");
    const bool none = scale && scale->kind == RV_NAME && !strcmp(scale->str, "none");
    g_precision.scale_loss = false;
    if (g_precision.half != DT_F16) {
        const RecipeValue *extra = scale && !none ? scale : init ? init : interval;
        if (!extra) return 0;
        fprintf(stderr, "kiln %s: error: %s %s: the recipe's %s (line %u) applies to fp16 training only (give --precision fp16, or "
                        "remove it from the recipe)\n", cmd, g_precision_from, precision_name(g_precision.half), extra->key, extra->loc.line);
        return 2;
    }
    if (none || m->graph->mode != MODE_TRAIN || g_infer) return 0;
    g_precision.scale_loss = true; /* as the recipe's loss_scale says, from the table's defaults (kiln_recipe.h) */
    return 0;
}

/* The rounding of the weights' half-precision copies (after set_precision): --weight-rounding,
 * else the recipe's weight_rounding. Stochastic rounding is bf16's (fp32 has no copies to
 * round; fp16's would need a rounding of their own), for the training step only. Returns 0,
 * or 2 after a message. */
static int set_weight_rounding(const char *cmd, const Options *o, const Model *m)
{
    const RecipeValue *r = recipe_get(&m->recipe, "weight_rounding");
    const char *name = o->weight_rounding ? o->weight_rounding : r && r->str ? r->str : "nearest";
    g_precision.stochastic_weights = false;
    if (strcmp(name, "stochastic")) return 0;
    if (g_precision.half != DT_BF16) {
        fprintf(stderr, "kiln %s: error: %s stochastic applies to bf16 training only; %s %s has no half-precision weights to round that "
                        "way (give --precision bf16, or round to nearest)\n", cmd, o->weight_rounding ? "--weight-rounding" : "weight_rounding =",
                g_precision_from, precision_name(g_precision.half));
        return 2;
    }
    g_precision.stochastic_weights = m->graph->mode == MODE_TRAIN && !g_infer;
    return 0;
}

static int run_passes(Graph *g, const char *after, RematOptions *remat, StrBuf *stats, StrBuf *err)
{
    PipelineOptions opt = {.remat = remat, .precision = &g_precision};
    return pipeline_run_opts(g, after, &opt, stats, err);
}

static int64_t g_bucket_bytes; /* build --distributed: the gradient buckets' size (0: not distributed) */

static bool has_recomputed(const Graph *g)
{
    for (NodeId i = 0; i < g->nnodes; i++)
        if ((g->nodes[i].flags & NODE_RECOMPUTED) && g->nodes[i].ckpt) return true; /* not the precision pass's */
    return false;
}

/* The training graph of a model file without rematerialisation (autodiff and simplify
 * only), with the --bound settings applied: the plan checkpoint(...) is compared with. */
static Graph *graph_without_remat(const char *file, Diag *d)
{
    StrBuf err;
    sb_init(&err);
    size_t len;
    char *text = util_read_file(file, &len, &err);
    Model *m = text ? frontend_compile(d, file, text, len, MODE_TRAIN) : NULL;
    free(text);
    Graph *g = NULL;
    if (m && !apply_bounds(m->graph, g_bounds, g_nbounds, &err) && !run_passes(m->graph, "precision", NULL, NULL, &err)) {
        g = m->graph;
        m->graph = NULL;
    }
    if (m) frontend_model_free(m);
    sb_free(&err);
    return g;
}

/* Parameters, gradients, optimizer moments and buffers (the slabs), in bytes. */
static int64_t slab_bytes(const Model *train, int64_t *params_out, int64_t *buffers_out, int *moments_out, const char **opt_out)
{
    const Graph *g = train->graph;
    int64_t params = 0, buffers = 0;
    for (NodeId i = 0; i < g->nnodes; i++) {
        if (g->nodes[i].op != OP_PARAM) continue;
        int64_t bytes = ir_shape_max_numel(g, &g->nodes[i].shape) * ir_dtype_size((DType)g->nodes[i].dtype);
        if (ir_attrs(g, i)[1]) params += bytes;
        else buffers += bytes;
    }
    const RecipeValue *opt = recipe_get(&train->recipe, "optimizer");
    const char *name = opt && opt->kind == RV_CALL && opt->str ? opt->str : "";
    int moments = !strcmp(name, "Adam") || !strcmp(name, "AdamW") ? 2 : !strcmp(name, "SGD") ? 1 : 0;
    if (params_out) *params_out = params;
    if (buffers_out) *buffers_out = buffers;
    if (moments_out) *moments_out = moments;
    if (opt_out) *opt_out = name;
    return params * (2 + moments) + buffers;
}

/* What a plan of the budget search checkpoints, for messages, `suffix` after "checkpointed":
 * "cheap values recomputed, 2 of the model's 4 blocks checkpointed", "none of the model's 4
 * blocks checkpointed", "the model's one block checkpointed", "the model has no block ...". */
static void checkpointed_blocks(int32_t blocks, int32_t nblocks, bool cheap, const char *suffix, StrBuf *out)
{
    if (cheap) sb_puts(out, nblocks ? "cheap values recomputed, " : "cheap values recomputed; ");
    if (!nblocks) sb_puts(out, "the model has no block to checkpoint");
    else if (nblocks == 1) sb_printf(out, "the model's one block %scheckpointed%s", blocks ? "" : "not ", suffix);
    else if (!blocks) sb_printf(out, "none of the model's %d blocks checkpointed%s", nblocks, suffix);
    else sb_printf(out, "%d of the model's %d blocks checkpointed%s", blocks, nblocks, suffix);
}

/* `kiln build --report` and `kiln check`: the memory a training step of the program uses,
 * from the plan (train: the training graph after the pipeline; plain: the same without
 * rematerialisation, or NULL when nothing is recomputed; plan: what the remat pass found,
 * the smallest plan a budget can reach among it). */
static void print_memory_report(const Model *train, const Graph *eval, const Graph *plain, const RematOptions *plan, StrBuf *out)
{
    const Graph *g = train->graph;
    int64_t params, buffers;
    int moments;
    const char *name;
    slab_bytes(train, &params, &buffers, &moments, &name);
    int64_t train_arena = codegen_arena_bytes(g), eval_arena = codegen_arena_bytes(eval);
    sb_puts(out, "memory at the bounds (bytes):\n");
    sb_printf(out, "  parameters        %14lld\n", (long long)params);
    sb_printf(out, "  gradients         %14lld\n", (long long)params);
    sb_printf(out, "  optimizer state   %14lld  (%s: %d per parameter%s)\n", (long long)params * moments, *name ? name : "none",
              moments, moments == 1 ? ", momentum buffer if used" : "");
    sb_printf(out, "  buffers           %14lld\n", (long long)buffers);
    if (g_precision.half != DT_F32)
        sb_printf(out, "  activations train %14lld  (mixed precision: %s)\n", (long long)train_arena, precision_name(g_precision.half));
    else sb_printf(out, "  activations train %14lld\n", (long long)train_arena);
    if (plain) { /* checkpoint(...): what it saves and what it costs */
        double all, again;
        remat_matmul_flops(g, &all, &again);
        int64_t copies = 0;
        for (NodeId i = 0; i < g->nnodes; i++) copies += (g->nodes[i].flags & NODE_RECOMPUTED) && g->nodes[i].ckpt;
        const int64_t plain_arena = codegen_arena_bytes(plain);
        sb_printf(out, "    without remat   %14lld  (recomputing: %.2fx the activations; %lld value%s recomputed, %.3g GFLOP of\n"
                       "                                     matrix products again, +%.1f%% of the step's %.3g GFLOP)\n",
                  (long long)plain_arena, plain_arena ? (double)train_arena / (double)plain_arena : 0.0, (long long)copies,
                  copies == 1 ? "" : "s", again / 1e9,
                  all > again ? 100.0 * again / (all - again) : 0.0, (all - again) / 1e9);
    }
    StrBuf blocks;
    sb_init(&blocks);
    if (g_memory_budget) {
        checkpointed_blocks(g_budget_blocks, g_budget_nblocks, g_budget_cheap, " for it", &blocks);
        sb_printf(out, "    memory budget   %14lld  (%s)\n", (long long)g_memory_budget, blocks.data);
    }
    if (plan && plan->want_floor) { /* the floor of --memory-budget, found without failing builds */
        blocks.len = 0;
        checkpointed_blocks(plan->floor_blocks, plan->nblocks, plan->floor_cheap, "", &blocks);
        sb_printf(out, "    smallest plan   %14lld  (the least a --memory-budget can reach, %lld in total: %s)\n", (long long)plan->floor_arena,
                  (long long)(params * (2 + moments) + buffers + plan->floor_arena + eval_arena), blocks.data);
    }
    sb_free(&blocks);
    sb_printf(out, "  activations eval  %14lld\n", (long long)eval_arena);
    sb_printf(out, "  total             %14lld\n", (long long)(params * (2 + moments) + buffers + train_arena + eval_arena));
}

/* The eval graph of a model file, simplified, with the --bound settings applied. */
static Model *eval_model(const char *file, Diag *d, StrBuf *err)
{
    StrBuf e2;
    sb_init(&e2);
    size_t len;
    char *text = util_read_file(file, &len, &e2);
    sb_free(&e2);
    Model *eval = text ? frontend_compile(d, file, text, len, MODE_EVAL) : NULL;
    free(text);
    if (!eval) return NULL;
    pass_simplify(eval->graph);
    if (apply_bounds(eval->graph, g_bounds, g_nbounds, err)) {
        frontend_model_free(eval);
        return NULL;
    }
    return eval;
}

/* Runs the pass pipeline on the training graph as `kiln build` does: under the memory
 * budget (--memory-budget, else the recipe's memory_budget), if any, checkpointing blocks
 * until the plan fits; eval is the evaluation graph, whose arena counts against it. *plan:
 * what the remat pass found, with the smallest plan a budget can reach when want_floor
 * (for the report: it costs a plan of each block). */
static int plan_training(const char *file, Model *train, const Graph *eval, bool want_floor, RematOptions *plan, StrBuf *err)
{
    /* --memory-budget: what the training activations may take besides the slabs and the
     * evaluation step's activations */
    RematOptions remat = {.want_floor = want_floor};
    /* the recipe's memory_budget when the command line gives none (the flag overrides it,
     * as a training program's flags override its recipe) */
    const RecipeValue *budget = recipe_get(&train->recipe, "memory_budget");
    if (!g_memory_budget && budget && !g_infer && util_parse_size(budget->str, &g_memory_budget)) g_budget_from = "memory_budget";
    if (g_memory_budget) {
        const int64_t fixed = slab_bytes(train, NULL, NULL, NULL, NULL) + codegen_arena_bytes(eval);
        if (fixed >= g_memory_budget) {
            sb_printf(err, "%s: error: %s %lld bytes (%.1f MiB) is not more than the parameters, gradients, optimizer "
                           "state, buffers and evaluation activations alone (%lld bytes, %.1f MiB): recomputing activations cannot help",
                      file, g_budget_from, (long long)g_memory_budget, (double)g_memory_budget / 1048576.0, (long long)fixed, (double)fixed / 1048576.0);
            RematOptions floor = {.want_floor = true}; /* and the least a budget can reach */
            StrBuf e2;
            sb_init(&e2);
            if (!run_passes(train->graph, NULL, &floor, NULL, &e2))
                sb_printf(err, "; the smallest plan needs %lld bytes (%.1f MiB)", (long long)(fixed + floor.floor_arena),
                          (double)(fixed + floor.floor_arena) / 1048576.0);
            sb_free(&e2);
            return -1;
        }
        remat.arena_budget = g_memory_budget - fixed;
    }
    if (run_passes(train->graph, NULL, &remat, NULL, err) != 0) {
        if (remat.smallest_arena) { /* the budget, not the model: say so with the smallest figure */
            const int64_t fixed = g_memory_budget - remat.arena_budget, least = fixed + remat.smallest_arena;
            err->len = 0;
            err->data[0] = 0;
            if (remat.nblocks) {
                StrBuf blocks;
                sb_init(&blocks);
                checkpointed_blocks(remat.blocks, remat.nblocks, remat.cheap, "", &blocks);
                sb_printf(err, "%s: error: %s %lld bytes (%.1f MiB) cannot be met: the smallest plan a budget can reach, %s, "
                               "needs %lld bytes (%.1f MiB) of training memory",
                          file, g_budget_from, (long long)g_memory_budget, (double)g_memory_budget / 1048576.0, blocks.data,
                          (long long)least, (double)least / 1048576.0);
                sb_free(&blocks);
            } else
                sb_printf(err, "%s: error: %s %lld bytes (%.1f MiB) cannot be met: the model's forward calls none of its "
                               "own modules, so there is no block to checkpoint, and its plan needs %lld bytes (%.1f MiB) of training "
                               "memory (checkpoint(...) in the model file recomputes what it marks)",
                          file, g_budget_from, (long long)g_memory_budget, (double)g_memory_budget / 1048576.0, (long long)least,
                          (double)least / 1048576.0);
        }
        return -1;
    }
    g_budget_blocks = remat.blocks;
    g_budget_cheap = remat.cheap;
    g_budget_nblocks = remat.nblocks;
    if (plan) *plan = remat;
    if (g_memory_budget && !remat.nblocks && g_report) /* nothing to choose from: said, not silently ignored */
        fprintf(stderr, "kiln: %s: the model calls none of its own modules from forward: no block to checkpoint\n", g_budget_from);
    return 0;
}

/* A language model's decode graph for incremental generation (frontend/decode.c), as the
 * predict graph is made from the eval graph; NULL for other models, or with the reason in
 * *why when generation must recompute the whole window for each token. */
static Graph *decode_graph(const char *file, const Model *train, Diag *d, StrBuf *why, StrBuf *err)
{
    const RecipeValue *data = recipe_get(&train->recipe, "data");
    if (!data || !data->str || (strcmp(data->str, "text") && strcmp(data->str, "tokens"))) return NULL;
    size_t len;
    char *text = util_read_file(file, &len, err);
    Model *m = text ? frontend_compile(d, file, text, len, MODE_DECODE) : NULL;
    free(text);
    if (!m) { /* the eval graph of the same file lowered: a bug of decode.c, said as one */
        if (!err->len) sb_printf(err, "%s: internal error: the decode graph did not lower", file);
        return NULL;
    }
    Graph *g = NULL;
    bool same_syms = m->graph->nsyms >= train->graph->nsyms;
    for (int i = 0; same_syms && i < train->graph->nsyms; i++) same_syms = !strcmp(m->graph->syms[i].name, train->graph->syms[i].name);
    if (!same_syms) sb_puts(why, "its sizes are not the model's");
    else if (!apply_bounds(m->graph, g_bounds, g_nbounds, err) && !frontend_decode_check(m->graph, why)) g = codegen_predict_graph(m->graph);
    frontend_model_free(m);
    return g;
}

static int generate(const char *file, Model *train, Diag *d, StrBuf *c, StrBuf *err, BuildProgress *pg)
{
    if (!g_report) /* (--report prints during the passes: its lines would mix with the progress line) */
        progress_stage(pg, 0, "running the passes (autodiff, simplify, remat, fusion, memplan)");
    if (apply_bounds(train->graph, g_bounds, g_nbounds, err)) return -1;
    Model *eval = eval_model(file, d, err);
    if (!eval) return -1;
    RematOptions plan = {0};
    if (plan_training(file, train, eval->graph, g_report && !g_infer, &plan, err)) {
        frontend_model_free(eval);
        return -1;
    }
    if (g_report && g_infer) {
        /* an inference program has no training step: its weights and the steps' arenas */
        Graph *predict = codegen_predict_graph(eval->graph);
        int64_t params, buffers;
        slab_bytes(train, &params, &buffers, NULL, NULL);
        int64_t ea = codegen_arena_bytes(eval->graph), pa = codegen_arena_bytes(predict);
        fprintf(stderr, "kiln: memory at the bounds (bytes):\n"
                        "  parameters          %14lld\n  buffers             %14lld\n"
                        "  activations eval    %14lld  (with the loss's inputs: loss and metrics)\n"
                        "  activations predict %14lld  (the forward alone; one arena of the larger size serves both)\n"
                        "  total               %14lld\n",
                (long long)params, (long long)buffers, (long long)ea, (long long)pa, (long long)(params + buffers + (ea > pa ? ea : pa)));
        ir_graph_free(predict);
        StrBuf why;
        sb_init(&why);
        Graph *decode = decode_graph(file, train, d, &why, err);
        if (decode) { /* what --generate adds: its own arena and the caches, batch 1 */
            int64_t cache = 0;
            for (NodeId i = 0; i < decode->nnodes; i++)
                if (decode->nodes[i].op == OP_INPUT && !strncmp(ir_node_name(decode, i), "decode.", 7) && decode->nodes[i].shape.rank == 4)
                    cache += ir_shape_max_numel(decode, &decode->nodes[i].shape) * 4;
            fprintf(stderr, "  generation (--generate, batch 1): decode step activations %lld, key/value cache %lld\n",
                    (long long)codegen_arena_bytes(decode), (long long)cache);
            ir_graph_free(decode);
        } else if (why.len) {
            fprintf(stderr, "  generation (--generate): by full recomputation (%s)\n", why.data);
        }
        sb_free(&why);
    } else if (g_report) {
        StrBuf rep;
        sb_init(&rep);
        Graph *plain = has_recomputed(train->graph) ? graph_without_remat(file, d) : NULL;
        print_memory_report(train, eval->graph, plain, &plan, &rep);
        if (plain) ir_graph_free(plain);
        fprintf(stderr, "kiln: %s", rep.data);
        sb_free(&rep);
    }
    progress_stage(pg, 0, "generating %s code", g_cuda ? "CUDA" : "C");
    kiln_recipe recipe;
    recipe_typed(&train->recipe, &recipe);
    if (!g_precision.scale_loss || g_infer) recipe.loss_scale = KILN_RECIPE_loss_scale_none; /* the step scales no loss */
    int rc;
    if (g_infer) {
        Graph *predict = codegen_predict_graph(eval->graph);
        StrBuf why;
        sb_init(&why);
        Graph *decode = decode_graph(file, train, d, &why, err);
        rc = err->len ? -1
             : g_cuda ? codegen_cuda_infer(train->graph, eval->graph, predict, decode, why.data, file, &recipe, c, err)
                      : codegen_c_infer(train->graph, eval->graph, predict, decode, why.data, file, &recipe, c, err);
        if (decode) ir_graph_free(decode);
        sb_free(&why);
        ir_graph_free(predict);
    } else {
        /* the C target's training program samples through the decode step too; the CUDA
         * program's through its evaluation step, the window again for each token: a decode
         * step would make gpt2-124m's model.cu 40 % longer to compile (nvcc 31 s -> 45 s)
         * for a few tokens an evaluation, where the inference program has it */
        StrBuf why;
        sb_init(&why);
        Graph *decode = g_cuda ? NULL : decode_graph(file, train, d, &why, err);
        rc = err->len ? -1
             : g_cuda ? codegen_cuda(train->graph, eval->graph, decode, file, &recipe, g_bucket_bytes, false, c, err)
                      : codegen_c_train(train->graph, eval->graph, decode, file, &recipe, g_bucket_bytes, c, err);
        if (decode) ir_graph_free(decode);
        sb_free(&why);
    }
    recipe_typed_free(&recipe);
    frontend_model_free(eval);
    return rc;
}

static int write_model_c(const char *dir, const char *name, const StrBuf *c, char **path_out)
{
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kiln: error: %s: cannot create directory: %s\n", dir, strerror(errno));
        return 1;
    }
    size_t pl = strlen(dir) + strlen(name) + 2;
    char *path = xmalloc(pl);
    snprintf(path, pl, "%s/%s", dir, name);
    int rc = write_atomic(path, c->data ? c->data : "", c->len);
    if (path_out && !rc) *path_out = path;
    else free(path);
    return rc;
}

static int cmd_emit(const Options *o, Model *train, Diag *d)
{
    const char *name = o->cuda ? "model.cu" : "model.c";
    StrBuf err, c;
    sb_init(&err);
    sb_init(&c);
    int rc = generate(o->file, train, d, &c, &err, NULL) ? 1 : write_model_c(o->output, name, &c, NULL);
    if (!rc) fprintf(stderr, "kiln: wrote %s/%s (%zu bytes)\n", o->output, name, c.len);
    if (err.len) fprintf(stderr, "%s\n", err.data);
    sb_free(&err);
    sb_free(&c);
    return rc;
}

/* --embed-weights CKPT: checks the checkpoint's weights against the model's parameters
 * and buffers (as the program checks --weights), then appends to the generated C the
 * file's bytes (the assembler's .incbin, read when model.c is compiled) between the
 * symbols kiln_embedded_weights and kiln_embedded_weights_end, which infer_main.c reads.
 * Returns 0, or 1 after a message. */
static int embed_weights(const char *ckpt, const Graph *g, bool cuda, StrBuf *c)
{
    krt_error err;
    struct stat st;
    char found[4096], file[4200], real[PATH_MAX];
    if (stat(ckpt, &st) == 0 && S_ISDIR(st.st_mode)) {
        int64_t step;
        bool stale;
        if (krt_ckpt_find(ckpt, found, sizeof found, &step, &stale, &err) != KRT_OK) {
            fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
            return 1;
        }
        snprintf(file, sizeof file, "%s/model.safetensors", found);
    } else {
        snprintf(file, sizeof file, "%s", ckpt);
    }
    krt_safetensors *w = NULL;
    if (krt_safetensors_read(file, &w, &err) != KRT_OK) {
        fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
        return 1;
    }
    int np = 0;
    kiln_param *ps = xcalloc((size_t)g->nnodes + 1, sizeof *ps);
    for (NodeId i = 0; i < g->nnodes; i++) {
        const Node *n = &g->nodes[i];
        if (n->op != OP_PARAM) continue;
        kiln_param *p = &ps[np++];
        p->name = ir_node_name(g, i);
        p->dtype = (krt_dtype)n->dtype;
        p->rank = n->shape.rank;
        for (int k = 0; k < n->shape.rank; k++) p->dims[k] = n->shape.d[k].k;
        p->trainable = ir_attrs(g, i)[1] != 0;
    }
    krt_status s = kiln_weights_check(ps, np, w, file, &err);
    free(ps);
    krt_safetensors_free(w);
    if (s != KRT_OK) {
        fprintf(stderr, "kiln: error: --embed-weights: %s\n", err.msg);
        return 1;
    }
    if (!realpath(file, real)) {
        fprintf(stderr, "kiln: error: --embed-weights: %s: %s\n", file, strerror(errno));
        return 1;
    }
    for (const char *q = real; *q; q++)
        if (*q == '"' || *q == '\\' || (unsigned char)*q < 32) {
            fprintf(stderr, "kiln: error: --embed-weights: %s: the path has a quote, backslash or control character, which the assembler's .incbin cannot name; copy the file elsewhere\n", real);
            return 1;
        }
    /* model.cu (CUDA): the host compilation only (nvcc compiles the file once per GPU
     * architecture too, with __CUDA_ARCH__ set), and the name with C linkage, as
     * infer_main.c declares it */
    sb_printf(c, "\n#if %s\n"
                 "/* The weights, embedded by kiln build --embed-weights from %s (safetensors). */\n"
                 "__asm__(\".section .rodata\\n.balign 64\\n.globl kiln_embedded_weights\\nkiln_embedded_weights:\\n\"\n"
                 "        \".incbin \\\"%s\\\"\\n.globl kiln_embedded_weights_end\\nkiln_embedded_weights_end:\\n.previous\\n\");\n"
                 "%sconst char kiln_embedded_weights_name[] = \"%s\";\n#endif\n",
              cuda ? "!defined(__CUDA_ARCH__)" : "KILN_PART != 1", real, real, cuda ? "extern \"C\" " : "", real);
    return 0;
}

/* Builds the program into prog; with a cache directory, reuses a build of identical code. */
static int build_to(const Options *o, Model *train, Diag *d, const char *prog)
{
    StrBuf err, c, log;
    sb_init(&err);
    sb_init(&c);
    sb_init(&log);
    int rc = 1;
    char dir[4096] = "";
    char *model_c = NULL;
    /* on a terminal, one line that says what the build is doing: the passes, code
     * generation, the compilers (how many of their parts are done), the link */
    BuildProgress pg;
    progress_init(&pg, 4);
    if (generate(o->file, train, d, &c, &err, &pg)) goto done;
    if (o->embed && embed_weights(o->embed, train->graph, o->cuda, &c)) goto done;
    if (build_tempdir_make(dir, sizeof dir)) {
        fprintf(stderr, "kiln: error: cannot create a temporary directory: %s\n", strerror(errno));
        dir[0] = 0;
        goto done;
    }
    if (write_model_c(dir, o->cuda ? "model.cu" : "model.c", &c, &model_c)) goto done;
    if (o->lib ? build_library(model_c, prog, train->graph->name, o->cflags, &log, &pg)
               : o->cuda ? build_cuda_program(model_c, prog, o->emulated, o->cflags, o->infer, o->distributed, &log, &pg)
                         : build_program(model_c, prog, o->cflags, o->infer, o->distributed, &log, &pg)) {
        progress_clear(&pg);
        fprintf(stderr, "kiln: error: building %s failed:\n%s\n", prog, log.data ? log.data : "");
        goto done;
    }
    rc = 0;
done:
    progress_clear(&pg);
    if (err.len) fprintf(stderr, "%s\n", err.data);
    if (dir[0]) build_tempdir_remove(dir);
    free(model_c);
    sb_free(&err);
    sb_free(&c);
    sb_free(&log);
    return rc;
}

/* kiln train: the program is cached under a name derived from the generated code and
 * the compiler settings, so an unchanged model starts at once. */
static int cmd_train(const char *file, Model *train, Diag *d, int argc, char **argv)
{
    StrBuf err, c;
    sb_init(&err);
    sb_init(&c);
    Options o;
    memset(&o, 0, sizeof o);
    o.file = file;
    set_precision(&o, train); /* kiln train takes the recipe's (its flags are the program's) */
    if (set_loss_scale("train", train) || set_weight_rounding("train", &o, train)) return 2;
    if (generate(file, train, d, &c, &err, NULL)) {
        fprintf(stderr, "%s\n", err.data);
        return 1;
    }
    const char *cc = getenv("CC");
    StrBuf key;
    sb_init(&key);
    sb_printf(&key, "%s|%s|%s|%s|", c.data, cc ? cc : "", KILN_VERSION, KILN_DEFAULT_CFLAGS);
    build_fingerprint(&key);
    uint64_t h = util_hash_string(key.data);
    sb_free(&key);
    const char *cache = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    StrBuf dir;
    sb_init(&dir);
    if (cache && *cache) sb_printf(&dir, "%s/kiln", cache);
    else sb_printf(&dir, "%s/.cache/kiln", home && *home ? home : "/tmp");
    for (char *p = dir.data + 1; *p; p++)
        if (*p == '/') {
            *p = 0;
            mkdir(dir.data, 0755);
            *p = '/';
        }
    mkdir(dir.data, 0755);
    StrBuf prog;
    sb_init(&prog);
    sb_printf(&prog, "%s/%s-%016llx", dir.data, train->graph->name, (unsigned long long)h);
    int rc = 0;
    if (access(prog.data, X_OK) != 0) {
        fprintf(stderr, "kiln: building %s\n", prog.data);
        /* The build writes to a temporary name first: an interrupted build never leaves a
         * broken program in the cache. */
        StrBuf tmp;
        sb_init(&tmp);
        sb_printf(&tmp, "%s.tmp%ld", prog.data, (long)getpid());
        Model *again = NULL;
        {
            StrBuf e2;
            sb_init(&e2);
            size_t len;
            char *text = util_read_file(file, &len, &e2);
            sb_free(&e2);
            again = text ? frontend_compile(d, file, text, len, MODE_TRAIN) : NULL;
            free(text);
        }
        rc = again ? build_to(&o, again, d, tmp.data) : 1;
        frontend_model_free(again);
        if (!rc && rename(tmp.data, prog.data) != 0) rc = 1;
        if (rc) unlink(tmp.data);
        sb_free(&tmp);
    }
    sb_free(&err);
    sb_free(&c);
    sb_free(&dir);
    if (rc) {
        sb_free(&prog);
        return 1;
    }
    char **args = xcalloc((size_t)argc + 2, sizeof *args);
    args[0] = prog.data;
    for (int i = 0; i < argc; i++) args[i + 1] = argv[i];
    fflush(stdout);
    execv(prog.data, args);
    fprintf(stderr, "kiln: error: cannot run %s: %s\n", prog.data, strerror(errno));
    free(args);
    sb_free(&prog);
    return 1;
}

static int cmd_model(const char *cmd, int argc, char **argv)
{
    bool ir = !strcmp(cmd, "ir");
    Options o;
    int rc = cli_parse_options(cmd, argc, argv, &o);
    cli_options_free(&o); /* plot's lists: not used here */
    if (rc >= 0) return rc;
    if (o.list_passes) {
        int n;
        const PassInfo *p = pipeline_passes(&n);
        for (int i = 0; i < n; i++) printf("%-10s %s\n", p[i].name, p[i].doc);
        return 0;
    }
    if (o.output && check_output(cmd, o.output, !strcmp(cmd, "emit") || o.lib)) return 2;
    Diag d;
    diag_init(&d, stderr);
    Model *m = load(&o, &d);
    if (!m) {
        if (d.nerrors) fprintf(stderr, "kiln: %d error%s in %s\n", d.nerrors, d.nerrors == 1 ? "" : "s", o.file);
        diag_free(&d);
        return 1;
    }
    g_bounds = o.bounds;
    g_nbounds = o.nbounds;
    g_report = o.report;
    g_memory_budget = o.memory_budget;
    g_cuda = o.cuda;
    g_infer = o.infer || o.lib; /* a library runs the inference program's predict step */
    set_precision(&o, m);
    if (g_infer && o.precision && g_precision.half != DT_F32) { /* a flag that would change nothing: an error */
        fprintf(stderr, "kiln %s: error: --precision %s applies to training; inference programs (--infer, --lib) run in fp32\n", cmd,
                o.precision);
        frontend_model_free(m);
        diag_free(&d);
        return 2;
    }
    if (set_loss_scale(cmd, m) || set_weight_rounding(cmd, &o, m)) {
        frontend_model_free(m);
        diag_free(&d);
        return 2;
    }
    g_bucket_bytes = o.distributed ? o.bucket_bytes : 0;
    if (!strcmp(cmd, "build")) {
        rc = build_to(&o, m, &d, o.output);
        if (!rc) fprintf(stderr, "kiln: built %s\n", o.output);
        frontend_model_free(m);
        diag_free(&d);
        return rc;
    }
    if (!strcmp(cmd, "emit")) {
        rc = cmd_emit(&o, m, &d);
        frontend_model_free(m);
        diag_free(&d);
        return rc;
    }
    if (!strcmp(cmd, "gradcheck")) {
        rc = cmd_gradcheck(&o, m);
        frontend_model_free(m);
        diag_free(&d);
        return rc;
    }
    if (ir && (o.after || o.stats)) {
        StrBuf stats, err;
        sb_init(&stats);
        sb_init(&err);
        if (run_passes(m->graph, o.after, NULL, o.stats ? &stats : NULL, &err) != 0) {
            fprintf(stderr, "%s\n", err.data);
            sb_free(&stats);
            sb_free(&err);
            frontend_model_free(m);
            diag_free(&d);
            return 1;
        }
        if (o.stats) fputs(stats.data, stderr);
        sb_free(&stats);
        sb_free(&err);
    }
    StrBuf out;
    sb_init(&out);
    if (!ir) {
        print_check(m, o.file, &out);
        if (m->graph->mode == MODE_TRAIN) {
            /* the memory plan of the program `kiln build` would make */
            StrBuf err;
            sb_init(&err);
            Model *eval = eval_model(o.file, &d, &err);
            RematOptions plan = {0};
            if (eval && plan_training(o.file, m, eval->graph, true, &plan, &err)) {
                frontend_model_free(eval);
                eval = NULL;
            }
            Graph *plain = eval && has_recomputed(m->graph) ? graph_without_remat(o.file, &d) : NULL;
            if (eval) print_memory_report(m, eval->graph, plain, &plan, &out);
            else sb_printf(&out, "(no memory plan: %s)\n", err.len ? err.data : "the eval graph failed");
            if (plain) ir_graph_free(plain);
            frontend_model_free(eval);
            sb_free(&err);
        }
    }
    else if (o.dot) ir_print_dot(m->graph, &out);
    else if (o.after && (!strcmp(o.after, "fusion") || !strcmp(o.after, "memplan"))) print_plan(m->graph, o.after, &out);
    else ir_print(m->graph, &out);
    rc = 0;
    if (o.output) rc = write_atomic(o.output, out.data ? out.data : "", out.len);
    else if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len) rc = 1;
    sb_free(&out);
    frontend_model_free(m);
    diag_free(&d);
    return rc;
}

/* `kiln ir --after fusion|memplan`: the graph, then its kernels (and their memory). */
static void print_plan(const Graph *g, const char *after, StrBuf *out)
{
    ir_print(g, out);
    FusionPlan f;
    fusion_plan(g, &f);
    StrBuf listing;
    sb_init(&listing);
    fusion_print(g, &f, &listing);
    if (!strcmp(after, "memplan")) {
        MemPlan mp;
        memplan_run(g, &f, &mp);
        sb_printf(out, "# activation arena: %lld bytes at the largest sizes\n", (long long)mp.arena_bytes);
        for (NodeId i = 0; i < g->nnodes; i++)
            if (mp.kind[i] == MEM_ARENA) {
                sb_printf(out, "# %%%d at %lld, %lld bytes", i, (long long)mp.offset[i], (long long)memplan_node_bytes(g, i));
                if (mp.inplace_of[i] != IR_NONE) sb_printf(out, ", in place of %%%d", mp.inplace_of[i]);
                sb_puts(out, "\n");
            } else if (mp.kind[i] == MEM_GRAD) {
                sb_printf(out, "# %%%d in the gradient slab: gradient of %s\n", i, ir_str(g, g->outputs[mp.offset[i]].name));
            }
        memplan_free(&mp);
    }
    sb_puts(out, "\n");
    sb_puts(out, listing.data ? listing.data : "");
    sb_free(&listing);
    fusion_free(&f);
}

/* Prints the help of cmd (NULL: kiln's) to f. */
static void print_usage(const char *cmd, FILE *f)
{
    StrBuf u;
    sb_init(&u);
    cli_usage(cmd, &u);
    fputs(u.data, f);
    sb_free(&u);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        print_usage(NULL, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        print_usage(NULL, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "check") || !strcmp(cmd, "ir") || !strcmp(cmd, "gradcheck") || !strcmp(cmd, "emit") || !strcmp(cmd, "build"))
        return cmd_model(cmd, argc - 2, argv + 2);
    if (!strcmp(cmd, "tokens")) return cmd_tokens(argc - 2, argv + 2);
    if (!strcmp(cmd, "plot")) {
        Options o;
        int rc = cli_parse_options(cmd, argc - 2, argv + 2, &o);
        if (rc < 0) {
            PlotOptions po = {.files = o.files, .nfiles = o.nfiles, .metrics = o.metrics, .nmetrics = o.nmetrics,
                              .output = o.output, .log_y = o.log_y};
            rc = plot_run(&po);
        }
        cli_options_free(&o);
        return rc;
    }
    if (!strcmp(cmd, "train")) {
        if (argc < 3 || argv[2][0] == '-') {
            if (argc >= 3 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) {
                print_usage("train", stdout);
                return 0;
            }
            return cli_usage_error("train", "no model file given%s", "");
        }
        Options o;
        memset(&o, 0, sizeof o);
        o.file = argv[2];
        o.mode = MODE_TRAIN;
        Diag d;
        diag_init(&d, stderr);
        Model *m = load(&o, &d);
        int rc = m ? cmd_train(o.file, m, &d, argc - 3, argv + 3) : 1;
        frontend_model_free(m);
        diag_free(&d);
        return rc;
    }
    int ncmds;
    const CliCommand *cmds = cli_commands(&ncmds);
    StrBuf names;
    sb_init(&names);
    const char *best = NULL;
    int bestd = 1000;
    for (int i = 0; i < ncmds; i++) {
        sb_printf(&names, "%s%s", i ? ", " : "", cmds[i].name);
        int dist = util_edit_distance(cmds[i].name, cmd);
        if (dist < bestd) bestd = dist, best = cmds[i].name;
    }
    static const char *const extra[] = {"help", "version"};
    for (int i = 0; i < 2; i++) {
        int dist = util_edit_distance(extra[i], cmd);
        if (dist < bestd) bestd = dist, best = extra[i];
    }
    int rc;
    char msg[512];
    if (cmd[0] == '-') {
        snprintf(msg, sizeof msg, "unknown option '%.200s'; commands: %s", cmd, names.data);
        rc = cli_usage_error(NULL, "%s", msg);
    } else if (bestd <= 2) {
        fprintf(stderr, "kiln: error: unknown command '%s' (did you mean '%s'?)\n", cmd, best);
        rc = 2;
    } else {
        snprintf(msg, sizeof msg, "unknown command '%.200s'; commands: %s", cmd, names.data);
        rc = cli_usage_error(NULL, "%s", msg);
    }
    sb_free(&names);
    return rc;
}
