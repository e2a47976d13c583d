/* main.c — the `kiln` command: check a model, print its IR (text or Graphviz), and the
 * help and version texts. Exit status: 0 success, 1 the model has errors (diagnostics on
 * stderr), 2 the command line is wrong. Output files are written atomically (a temp file,
 * fsync, rename), so an interrupted or failed run never leaves a truncated file behind. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../frontend/frontend.h"

static const char *usage_main =
    "usage: kiln COMMAND [options]\n"
    "\n"
    "Kiln compiles model files (*.kiln) into IR, and later into training programs.\n"
    "\n"
    "commands:\n"
    "  check FILE        parse and check a model; print its parameters, inputs, outputs and recipe\n"
    "  ir FILE           print the model's IR as text (or Graphviz DOT with --dot)\n"
    "\n"
    "options:\n"
    "  -h, --help        show this help (kiln COMMAND --help for a command's options)\n"
    "  --version         print the version\n";

static const char *usage_check =
    "usage: kiln check FILE [--mode train|eval]\n"
    "\n"
    "Parses and checks FILE. Prints every parameter (state_dict name, shape, count, init),\n"
    "the total parameter count, the inputs and outputs, symbolic sizes and the training\n"
    "recipe with its defaults. Exits 0 when the model is valid, 1 with diagnostics if not.\n"
    "\n"
    "options:\n"
    "  --mode train|eval  graph to build (default train: dropout on, batch statistics)\n";

static const char *usage_ir =
    "usage: kiln ir FILE [--dot] [-o OUT] [--mode train|eval]\n"
    "\n"
    "Prints the IR of FILE's forward, loss and metrics in Kiln's text form (docs/ir.md),\n"
    "or as a Graphviz graph with --dot (render with: dot -Tsvg OUT -o graph.svg).\n"
    "\n"
    "options:\n"
    "  --dot              print Graphviz DOT instead of text\n"
    "  -o, --output OUT   write to OUT (atomically) instead of standard output\n"
    "  --mode train|eval  graph to build (default train)\n";

typedef struct {
    const char *file;
    const char *output;
    bool dot;
    GraphMode mode;
} Options;

static int usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "kiln%s%s: error: ", cmd ? " " : "", cmd ? cmd : "");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n%s", cmd && !strcmp(cmd, "check") ? usage_check : cmd && !strcmp(cmd, "ir") ? usage_ir : usage_main);
    return 2;
}

/* Parses the options of `cmd`; returns -1 to continue, else an exit status. */
static int parse_options(const char *cmd, int argc, char **argv, Options *o, const char *usage)
{
    memset(o, 0, sizeof *o);
    o->mode = MODE_TRAIN;
    bool ir = !strcmp(cmd, "ir");
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--mode")) {
            if (i + 1 >= argc) return usage_error(cmd, "--mode needs a value: train or eval%s", "");
            const char *m = argv[++i];
            if (!strcmp(m, "train")) o->mode = MODE_TRAIN;
            else if (!strcmp(m, "eval")) o->mode = MODE_EVAL;
            else return usage_error(cmd, "--mode must be train or eval, not '%s'", m);
        } else if (ir && !strcmp(a, "--dot")) {
            o->dot = true;
        } else if (ir && (!strcmp(a, "-o") || !strcmp(a, "--output"))) {
            if (i + 1 >= argc) return usage_error(cmd, "%s needs a file name", a);
            o->output = argv[++i];
        } else if (a[0] == '-' && a[1]) {
            return usage_error(cmd, "unknown option '%s'", a);
        } else if (o->file) {
            return usage_error(cmd, "more than one model file given ('%s')", a);
        } else {
            o->file = a;
        }
    }
    if (!o->file) return usage_error(cmd, "no model file given%s", "");
    return -1;
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

static int cmd_check_or_ir(const char *cmd, int argc, char **argv)
{
    bool ir = !strcmp(cmd, "ir");
    Options o;
    int rc = parse_options(cmd, argc, argv, &o, ir ? usage_ir : usage_check);
    if (rc >= 0) return rc;
    Diag d;
    diag_init(&d, stderr);
    Model *m = load(&o, &d);
    if (!m) {
        if (d.nerrors) fprintf(stderr, "kiln: %d error%s in %s\n", d.nerrors, d.nerrors == 1 ? "" : "s", o.file);
        diag_free(&d);
        return 1;
    }
    StrBuf out;
    sb_init(&out);
    if (!ir) print_check(m, o.file, &out);
    else if (o.dot) ir_print_dot(m->graph, &out);
    else ir_print(m->graph, &out);
    rc = 0;
    if (o.output) rc = write_atomic(o.output, out.data ? out.data : "", out.len);
    else if (out.len && fwrite(out.data, 1, out.len, stdout) != out.len) rc = 1;
    sb_free(&out);
    frontend_model_free(m);
    diag_free(&d);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fputs(usage_main, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help") || !strcmp(cmd, "help")) {
        fputs(usage_main, stdout);
        return 0;
    }
    if (!strcmp(cmd, "--version") || !strcmp(cmd, "version")) {
        printf("kiln %s\n", KILN_VERSION);
        return 0;
    }
    if (!strcmp(cmd, "check") || !strcmp(cmd, "ir")) return cmd_check_or_ir(cmd, argc - 2, argv + 2);
    static const char *commands[] = {"check", "ir", "help", "version"};
    const char *best = NULL;
    int bestd = 1000;
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) {
        int dist = util_edit_distance(commands[i], cmd);
        if (dist < bestd) bestd = dist, best = commands[i];
    }
    if (cmd[0] == '-') return usage_error(NULL, "unknown option '%s'; commands: check, ir", cmd);
    if (bestd <= 2) {
        fprintf(stderr, "kiln: error: unknown command '%s' (did you mean '%s'?)\n", cmd, best);
        return 2;
    }
    return usage_error(NULL, "unknown command '%s'; commands: check, ir", cmd);
}
