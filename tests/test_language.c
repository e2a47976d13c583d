/* test_language.c — what a PyTorch user types is accepted and means what it means there:
 * `axis =` and `dim =` for every function that takes an axis, PyTorch's indexing
 * (ellipsis, new axes), cross_entropy with class probabilities, and compile-time `if`.
 * Each compiles small models through the frontend and compares the graphs, the shapes
 * or the values the interpreter computes with what the PyTorch spelling means. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/internal.h"
#include "../passes/passes.h"
#include "support.h"

static Model *compile_text(const char *text, GraphMode mode, Diag *d)
{
    diag_init(d, NULL);
    return frontend_compile(d, "test.kiln", text, strlen(text), mode);
}

/* The model "forward(inputs) -> y { body }" with loss sum(y) (y float). */
static void model_text(char *buf, size_t size, const char *inputs, const char *body)
{
    snprintf(buf, size, "model t\ndim B <= 3\nforward(%s) -> y {\n    %s\n}\nloss(y) = sum(f32(y))\n", inputs, body);
}

/* Compiles forward(inputs) { body } and returns its printed graph (NULL and the
 * diagnostics in *err when it does not compile; free both). */
static char *graph_of(const char *inputs, const char *body, char **err)
{
    char text[2048];
    model_text(text, sizeof text, inputs, body);
    Diag d;
    Model *m = compile_text(text, MODE_TRAIN, &d);
    char *out = NULL;
    if (m) {
        StrBuf sb;
        sb_init(&sb);
        ir_print(m->graph, &sb);
        out = xstrndup(sb.data, sb.len);
        sb_free(&sb);
        frontend_model_free(m);
    }
    if (err) *err = xstrndup(d.out.data ? d.out.data : "", d.out.len);
    diag_free(&d);
    return out;
}

/* The first error the model gives ("" when it compiles). */
static char *first_error_of(const char *inputs, const char *body)
{
    char *err;
    char *g = graph_of(inputs, body, &err);
    free(g);
    char *e = strstr(err, "error: ");
    char *r = xstrndup(e ? e : "", e ? strcspn(e, "\n") : 0);
    free(err);
    return r;
}

/* ---- axis = and dim = ---- */

/* Every function that takes an axis, written with AXIS where the keyword goes. */
static const struct {
    const char *fname, *inputs, *body;
} axis_calls[] = {
    {"sum", "x: f32[2, 3, 4]", "y = sum(x, AXIS = 1)"},
    {"mean", "x: f32[2, 3, 4]", "y = mean(x, AXIS = [0, 2], keepdim = true)"},
    {"max", "x: f32[2, 3, 4]", "y = max(x, AXIS = -1)"},
    {"min", "x: f32[2, 3, 4]", "y = min(x, AXIS = 0)"},
    {"amax", "x: f32[2, 3, 4]", "y = amax(x, AXIS = [0, 2])"},
    {"amin", "x: f32[2, 3, 4]", "y = amin(x, AXIS = 1, keepdim = true)"},
    {"var", "x: f32[2, 3, 4]", "y = var(x, AXIS = 1)"},
    {"std", "x: f32[2, 3, 4]", "y = std(x, AXIS = 2, unbiased = false)"},
    {"argmax", "x: f32[2, 3, 4]", "y = argmax(x, AXIS = 1)"},
    {"softmax", "x: f32[2, 3, 4]", "y = softmax(x, AXIS = 1)"},
    {"log_softmax", "x: f32[2, 3, 4]", "y = log_softmax(x, AXIS = 0)"},
    {"logsumexp", "x: f32[2, 3, 4]", "y = logsumexp(x, AXIS = 1)"},
    {"unsqueeze", "x: f32[2, 3, 4]", "y = unsqueeze(x, AXIS = 1)"},
    {"squeeze", "x: f32[2, 1, 4]", "y = squeeze(x, AXIS = 1)"},
    {"split", "x: f32[2, 6]", "a, b = split(x, 3, AXIS = 1)\n y = a * b"},
    {"chunk", "x: f32[4, 6]", "a, b = chunk(x, 2, AXIS = 0)\n y = a * b"},
    {"concat", "x: f32[2, 3]", "y = concat(x, x, AXIS = 1)"},
    {"cat", "x: f32[2, 3]", "y = cat(x, x * 2, AXIS = 0)"},
    {"stack", "x: f32[2, 3]", "y = stack(x, x, AXIS = 1)"},
    {"slice", "x: f32[4, 6]", "y = slice(x, AXIS = 1, start = 1, end = 5, step = 2)"},
    {"cumsum", "x: f32[3, 4]", "y = cumsum(x, AXIS = 1)"},
    {"gather", "x: f32[3, 4], t: i64[3, 2]", "y = gather(x, AXIS = 1, index = t)"},
    {"topk", "x: f32[3, 5]", "v, i = topk(x, 2, AXIS = 1)\n y = v"},
    {"flip", "x: f32[3, 5]", "y = flip(x, AXES = [0, 1])"},
    {"cross_entropy", "x: f32[2, 4, 4], t: i64[2, 4]", "y = cross_entropy(x, t, AXIS = 1)"},
    {"nll_loss", "x: f32[2, 4, 4], t: i64[2, 4]", "y = nll_loss(log_softmax(x, 1), t, AXIS = -1)"},
    {"size", "x: f32[3, 5]", "y = zeros(x.size(AXIS = 1))"},
};
#define NAXIS_CALLS (sizeof axis_calls / sizeof axis_calls[0])

/* body with AXIS (or AXES) replaced by the given spelling */
static void spell(char *out, size_t size, const char *body, const char *axis, const char *axes)
{
    size_t o = 0;
    for (const char *p = body; *p && o + 8 < size;) {
        const char *with = !strncmp(p, "AXIS", 4) ? axis : !strncmp(p, "AXES", 4) ? axes : NULL;
        if (with) {
            o += (size_t)snprintf(out + o, size - o, "%s", with);
            p += 4;
        } else out[o++] = *p++;
    }
    out[o] = 0;
}

/* body with its `AXIS = v` written `axis = v, dim = v` (AXES: axes and dims) */
static void twice(char *out, size_t size, const char *body)
{
    const char *at = strstr(body, "AXIS");
    bool plural = !at;
    if (!at) at = strstr(body, "AXES");
    const char *v = at + 4, *p = v;
    int depth = 0;
    for (; *p && !(depth == 0 && (*p == ',' || *p == ')')); p++) depth += (*p == '[' || *p == '(') - (*p == ']');
    snprintf(out, size, "%.*s%s%.*s, %s%.*s%s", (int)(at - body), body, plural ? "axes" : "axis", (int)(p - v), v,
             plural ? "dims" : "dim", (int)(p - v), v, p);
}

Test(axis, both_spellings_give_the_same_graph)
{
    for (size_t i = 0; i < NAXIS_CALLS; i++) {
        char a[512], b[512], both[600];
        spell(a, sizeof a, axis_calls[i].body, "axis", "axes");
        spell(b, sizeof b, axis_calls[i].body, "dim", "dims");
        char *ea, *eb;
        char *ga = graph_of(axis_calls[i].inputs, a, &ea), *gb = graph_of(axis_calls[i].inputs, b, &eb);
        cr_expect(ga, "%s: `%s` is refused:\n%s", axis_calls[i].fname, a, ea);
        cr_expect(gb, "%s: `%s` is refused:\n%s", axis_calls[i].fname, b, eb);
        if (ga && gb) cr_expect_str_eq(ga, gb, "%s: `%s` and `%s` differ", axis_calls[i].fname, a, b);
        /* both at once: one error that names the two */
        twice(both, sizeof both, axis_calls[i].body);
        char *e = first_error_of(axis_calls[i].inputs, both);
        cr_expect(strstr(e, "name the same argument; give one of them"), "%s: `%s` gives: %s", axis_calls[i].fname, both, e);
        free(e);
        free(ga);
        free(gb);
        free(ea);
        free(eb);
    }
}

/* The list above holds every function whose signature takes an axis: one added later is
 * tested here (or this fails until it is). */
Test(axis, every_function_with_an_axis_is_listed)
{
    int n;
    const char *const *names = functions_names(&n);
    for (int i = 0; i < n; i++) {
        const char *sig = functions_signature(names[i]);
        if (!sig) continue;
        bool takes = false;
        for (const char *p = sig; *p; p += strcspn(p, "|=, "), p += strspn(p, "|=, ")) {
            size_t len = strcspn(p, "|=, ");
            if ((len == 4 && !strncmp(p, "axis", 4)) || (len == 3 && !strncmp(p, "dim", 3)) ||
                (len == 4 && (!strncmp(p, "axes", 4) || !strncmp(p, "dims", 4))))
                takes = true;
        }
        if (!takes) continue;
        bool listed = false;
        for (size_t k = 0; k < NAXIS_CALLS; k++) listed |= !strcmp(axis_calls[k].fname, names[i]);
        cr_expect(listed, "%s takes an axis (%s) but is not in axis_calls", names[i], sig);
    }
}

/* ---- indexing: `...` and `none` ---- */

/* The shape of y = expr ("[B, 3]"), or the first error. */
static char *shape_of(const char *inputs, const char *expr)
{
    char body[512], text[2048];
    snprintf(body, sizeof body, "y = %s", expr);
    model_text(text, sizeof text, inputs, body);
    Diag d;
    Model *m = compile_text(text, MODE_TRAIN, &d);
    char *r;
    if (!m) {
        char *e = strstr(d.out.data, "error: ");
        r = xstrndup(e, strcspn(e, "\n"));
    } else {
        StrBuf sb;
        sb_init(&sb);
        for (int32_t i = 0; i < m->graph->noutputs; i++)
            if (!strcmp(ir_str(m->graph, m->graph->outputs[i].name), "y")) ir_shape_format(&sb, m->graph, &m->graph->nodes[m->graph->outputs[i].node].shape);
        r = xstrndup(sb.data, sb.len);
        sb_free(&sb);
        frontend_model_free(m);
    }
    diag_free(&d);
    return r;
}

Test(index, ellipsis_and_new_axes_as_pytorch)
{
    static const struct {
        const char *expr, *shape; /* torch.zeros(B, 3, 4, 5)[...].shape */
    } cases[] = {
        {"x[..., 0]", "[B, 3, 4]"},
        {"x[..., 1:3]", "[B, 3, 4, 2]"},
        {"x[:, ..., 2]", "[B, 3, 4]"},
        {"x[:, 0, ...]", "[B, 4, 5]"},
        {"x[:, 1, ..., 0]", "[B, 4]"},
        {"x[...]", "[B, 3, 4, 5]"},
        {"x[..., :, :, :, :]", "[B, 3, 4, 5]"},
        {"x[:, none]", "[B, 1, 3, 4, 5]"},
        {"x[none]", "[1, B, 3, 4, 5]"},
        {"x[..., none]", "[B, 3, 4, 5, 1]"},
        {"x[:, none, 0, none, ..., none, 1:4:2]", "[B, 1, 1, 4, 1, 2]"},
        {"x[none, none, :, 2]", "[1, 1, B, 4, 5]"},
        {"x[:, :, :, :, none]", "[B, 3, 4, 5, 1]"},
        {"x[:, -1, ..., -2]", "[B, 4]"},
        {"x.mean(-1)[..., none] * x", "[B, 3, 4, 5]"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = shape_of("x: f32[B, 3, 4, 5]", cases[i].expr);
        cr_expect_str_eq(got, cases[i].shape, "%s: %s, PyTorch gives %s", cases[i].expr, got, cases[i].shape);
        free(got);
    }
}

Test(index, bad_uses_are_one_error)
{
    static const struct {
        const char *expr, *error;
    } cases[] = {
        {"x[..., 0, ...]", "at most one '...'"},
        {"x[0, 1, 2, 3, 4]", "too many indices (5) for a tensor of rank 4"},
        {"x[..., 0, 1, 2, 3, 4]", "too many indices (5) for a tensor of rank 4"},
        {"x[none, :, :, :, :, 0]", "too many indices (5) for a tensor of rank 4"},
        {"x[:, none, none, none, none, none]", "at most 8 axes"},
        {"x[:, 0.5]", "index"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = shape_of("x: f32[B, 3, 4, 5]", cases[i].expr);
        cr_expect(strstr(got, cases[i].error), "%s: %s (expected %s)", cases[i].expr, got, cases[i].error);
        free(got);
    }
}

/* ---- compile-time if ---- */

/* The parameter names of a model, space-separated ("" and the first error when it does
 * not compile). */
static char *params_of(const char *text)
{
    Diag d;
    Model *m = compile_text(text, MODE_TRAIN, &d);
    StrBuf sb;
    sb_init(&sb);
    if (!m) {
        const char *e = strstr(d.out.data, "error: ");
        sb_putn(&sb, e, strcspn(e, "\n"));
    } else {
        for (NodeId i = 0; i < m->graph->nnodes; i++)
            if (m->graph->nodes[i].op == OP_PARAM) sb_printf(&sb, "%s%s", sb.len ? " " : "", ir_node_name(m->graph, i));
        frontend_model_free(m);
    }
    diag_free(&d);
    char *r = xstrndup(sb.data ? sb.data : "", sb.len);
    sb_free(&sb);
    return r;
}

/* A module whose parameters and forward follow its arguments, as `if self.proj is not
 * None` does in PyTorch. */
static const char *const block_module =
    "module Block(C, D, bias = true, norm = none) {\n"
    "    if bias { scale = Parameter(D, init = ones) }\n"
    "    if C != D {\n"
    "        proj = Linear(C, D, bias = false)\n"
    "    } else if C >= 16 and not bias {\n"
    "        proj = Linear(C, D)\n"
    "    }\n"
    "    if norm == \"layer\" { ln = LayerNorm(D) }\n"
    "    else if norm != none { const unknown = 1 }\n"
    "    fc = Linear(C, D, bias = bias)\n"
    "    forward(x) {\n"
    "        y = fc(x)\n"
    "        if bias { y = y * scale }\n"
    "        if C != D or (C >= 16 and not bias) { x = proj(x) }\n"
    "        if norm == \"layer\" {\n"
    "            return ln(x + y)\n"
    "        }\n"
    "        return x + y\n"
    "    }\n"
    "}\n";

Test(cond, parameters_follow_the_module_arguments)
{
    static const struct {
        const char *args, *params;
    } cases[] = {
        {"4, 8", "m.scale m.proj.weight m.fc.weight m.fc.bias"},
        {"8, 8", "m.scale m.fc.weight m.fc.bias"},
        {"8, 8, bias = false", "m.fc.weight"},
        {"16, 16, bias = false", "m.proj.weight m.proj.bias m.fc.weight"},
        {"16, 16, norm = \"layer\"", "m.scale m.ln.weight m.ln.bias m.fc.weight m.fc.bias"},
        {"4, 6, false, \"layer\"", "m.proj.weight m.ln.weight m.ln.bias m.fc.weight"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[4096];
        const char *c = strchr(cases[i].args, ',');
        int cin = atoi(cases[i].args);
        (void)c;
        snprintf(text, sizeof text, "model t\n%sm = Block(%s)\nforward(x: f32[B, %d]) -> y { y = m(x) }\nloss(y) = sum(y)\ntrain { batch = 2 }\n",
                 block_module, cases[i].args, cin);
        char *got = params_of(text);
        cr_expect_str_eq(got, cases[i].params, "Block(%s): %s", cases[i].args, got);
        free(got);
    }
}

/* The branch not taken is parsed, not lowered: its shapes, names and calls are not checked. */
Test(cond, the_branch_not_taken_is_not_checked)
{
    char *e = first_error_of("x: f32[B, 4]",
                             "if 1 > 2 {\n y = x @ x + undefined_name(x, dims = 3)\n } else if false {\n y = Linear(3)\n } else {\n y = x * 2\n }");
    cr_expect_str_eq(e, "", "%s", e);
    free(e);
    e = first_error_of("x: f32[B, 4]", "y = x\n if true { y = x @ x }");
    cr_expect(strstr(e, "matmul: inner dimensions differ"), "the branch taken is checked: %s", e);
    free(e);
}

Test(cond, return_in_a_branch)
{
    char text[4096];
    snprintf(text, sizeof text,
             "model t\nmodule Skip(C, D) {\n fc = Linear(C, D)\n forward(x) {\n  if C == D { return x }\n  return fc(x)\n }\n}\n"
             "a = Skip(4, 4)\nb = Skip(4, 2)\nforward(x: f32[B, 4]) -> y { y = b(a(x)) }\nloss(y) = sum(y)\ntrain { batch = 2 }\n");
    char *got = params_of(text);
    cr_expect_str_eq(got, "a.fc.weight a.fc.bias b.fc.weight b.fc.bias", "%s", got);
    free(got);
    char *s = shape_of("x: f32[B, 4]", "x\n if x.shape[1] == 4 { y = x[:, none] } else { y = x }");
    cr_expect_str_eq(s, "[B, 1, 4]", "%s", s);
    free(s);
}

Test(cond, bad_conditions_and_names_are_one_error_each)
{
    static const struct {
        const char *body, *error;
    } cases[] = {
        {"y = x\n if x > 0 { y = x * 2 }", "the condition of `if` is a tensor"},
        {"if x.sum() > 0 { y = x } else { y = -x }\n y = y * 2", "use where(condition, a, b)"},
        {"if x.shape[0] == 2 { y = x } else { y = x }", "cannot compare the symbolic size B with 2"},
        {"if false { z = x }\n y = z", "'z' is defined only in the branch of the `if` at 4:5 that is not taken (its condition is false)"},
        {"if true { y = x } else { z = x }\n y = z + y", "'z' is defined only in the branch of the `if` at 4:5 that is not taken (its condition is true)"},
        {"if \"\" { y = x }", "'y' is defined only in the branch"},
        {"if 2 { y = x } else { }", ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *err;
        char *g = graph_of("x: f32[B, 4]", cases[i].body, &err);
        int n = 0;
        for (const char *p = err; (p = strstr(p, "error: ")); p++) n++;
        if (!cases[i].error[0]) cr_expect(g && n == 0, "`%s`: %s", cases[i].body, err);
        else {
            cr_expect(strstr(err, cases[i].error), "`%s`: expected %s in:\n%s", cases[i].body, cases[i].error, err);
            cr_expect_eq(n, 1, "`%s`: %d errors:\n%s", cases[i].body, n, err);
        }
        free(g);
        free(err);
    }
}

/* ---- all of it in one model: tests/lang/pytorch_style.kiln ---- */

#define STYLE_MODEL "tests/lang/pytorch_style.kiln"

Test(model, pytorch_style_parameters_and_gradients)
{
    Diag d;
    Model *m = support_compile_file(STYLE_MODEL, MODE_TRAIN, &d);
    StrBuf names;
    sb_init(&names);
    for (NodeId i = 0; i < m->graph->nnodes; i++)
        if (m->graph->nodes[i].op == OP_PARAM) sb_printf(&names, "%s%s", names.len ? " " : "", ir_node_name(m->graph, i));
    cr_expect_str_eq(names.data, "a.scale a.proj.weight a.fc.weight a.fc.bias b.fc.weight head.weight head.bias", "%s", names.data);
    sb_free(&names);
    GradcheckOptions o = {.seed = 5, .tolerance = 1e-6, .samples = 1 << 20, .sym_value = 3, .wrt_inputs = true};
    GradcheckResult *res;
    int n;
    StrBuf err;
    sb_init(&err);
    int fails = gradcheck_run(m->graph, &o, &res, &n, &err);
    cr_assert_geq(fails, 0, "%s", err.data);
    cr_expect_gt(n, 0, "nothing was checked");
    for (int i = 0; i < n; i++) {
        cr_expect_neq(res[i].verdict, GRADCHECK_FAIL, "gradient of %s fails (relative error %g)", res[i].name, res[i].max_rel_error);
        cr_expect_gt(res[i].checked, 0, "no element of %s could be checked", res[i].name);
    }
    gradcheck_free(res, n);
    sb_free(&err);
    frontend_model_free(m);
    diag_free(&d);
}

/* `kiln check` lists the parameters of the branches taken: Block(4, 8) has a scale and a
 * projection, Block(8, 8, bias = false) neither. */
Test(model, pytorch_style_kiln_check)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln("check " STYLE_MODEL, &out);
    cr_assert_eq(rc, 0, "%s", out.data);
    cr_expect(strstr(out.data, "a.scale ") && strstr(out.data, "a.proj.weight ") && strstr(out.data, "b.fc.weight "), "%s", out.data);
    cr_expect(!strstr(out.data, "b.scale") && !strstr(out.data, "b.proj") && !strstr(out.data, "b.fc.bias"), "%s", out.data);
    cr_expect(strstr(out.data, "onecycle(max_lr = 0.1,"), "%s", out.data);
    sb_free(&out);
}

/* Built and trained ten steps from its recipe: finite losses, and onecycle's rates from
 * max_lr (0.1 / 25 at the first step, 0.1 at the third, as OneCycleLR); with --lr 0.3,
 * from 0.3. */
Test(model, pytorch_style_trains, .timeout = 120)
{
    char dir[64];
    StrBuf out;
    sb_init(&out);
    int rc = support_build_in_temp("lang", STYLE_MODEL, "style", dir, sizeof dir, &out);
    cr_assert_eq(rc, 0, "kiln build failed:\n%s", out.data);
    double x[32], p[24];
    for (int i = 0; i < 32; i++) x[i] = (i * 7 % 11) / 11.0 - 0.4;
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++) p[r * 3 + c] = c == r % 3 ? 0.6 : 0.2;
    char path[128];
    snprintf(path, sizeof path, "%s/x.npy", dir);
    cr_assert(support_write_npy(path, "<f4", 8, 4, x));
    snprintf(path, sizeof path, "%s/p.npy", dir);
    cr_assert(support_write_npy(path, "<f4", 8, 3, p));
    /* the recipe's max_lr, then --lr, which sets the peak instead */
    static const struct {
        const char *cmd, *log;
        double peak;
    } runs[] = {{"./style", "log.jsonl", 0.1}, {"./style --lr 0.3 --log log2.jsonl", "log2.jsonl", 0.3}};
    for (int k = 0; k < 2; k++) {
        rc = support_run_in(dir, runs[k].cmd, &out);
        cr_expect_eq(rc, 0, "%s: exit %d:\n%s", runs[k].cmd, rc, out.data);
        snprintf(path, sizeof path, "%s/%s", dir, runs[k].log);
        FILE *f = fopen(path, "r");
        cr_assert(f, "no log:\n%s", out.data);
        char line[1024];
        int steps = 0;
        double first_lr = -1, peak = 0;
        while (fgets(line, sizeof line, f)) {
            const char *l = strstr(line, "\"loss\": "), *lr = strstr(line, "\"lr\": ");
            if (!l || !lr) continue;
            double v = strtod(l + 8, NULL);
            cr_expect(isfinite(v) && v > 0, "loss %g at line %s", v, line);
            double r = strtod(lr + 6, NULL);
            if (steps++ == 0) first_lr = r;
            if (r > peak) peak = r;
        }
        fclose(f);
        cr_expect_eq(steps, 10, "%s: %d steps logged:\n%s", runs[k].cmd, steps, out.data);
        cr_expect(fabs(peak - runs[k].peak) < 1e-9, "%s: peak lr %g, expected %g", runs[k].cmd, peak, runs[k].peak);
        cr_expect(fabs(first_lr - runs[k].peak / 25) < 1e-9, "%s: first lr %g, OneCycleLR's is the peak / div_factor", runs[k].cmd,
                  first_lr);
    }
    sb_free(&out);
    support_remove_dir(dir);
}
