/* inspect.c — the commands that look at a model without building it: kiln check's
 * listing (parameters, inputs, outputs, sizes, recipe), kiln gradcheck's table and kiln
 * tokens. Printing only: the model comes from the frontend or kiln_compile. */
#define _XOPEN_SOURCE 700
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "inspect.h"
#include "options.h"
#include "../passes/passes.h"
#include "../runtime/kiln_rt.h"

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

void cli_print_check(const Graph *g, const Recipe *recipe, const char *file, StrBuf *out)
{
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
    recipe_print(recipe, out);
    sb_printf(out, "\n%d IR nodes; the model is valid.\n", g->nnodes);
}

int cli_gradcheck(const Options *o, const Graph *g)
{
    GradcheckOptions go = {.seed = o->seed, .tolerance = o->tolerance, .atol = o->atol, .samples = o->samples,
                           .sym_value = o->size, .wrt_inputs = o->inputs};
    GradcheckResult *res;
    int nres;
    StrBuf err;
    sb_init(&err);
    int failures = gradcheck_run(g, &go, &res, &nres, &err);
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
int cli_tokens(int argc, char **argv)
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

