/* test_onnx.c — `kiln import` (onnx/, issue 39) against the ONNX project's backend test
 * cases (../shared/onnx-conformance: 117 models exported from PyTorch, with inputs and
 * expected outputs as TensorProto files): each case is imported, built as an inference
 * program and run on its inputs, its outputs compared with the expected ones (rtol 1e-3,
 * atol 1e-5); or it is refused with one error naming the node and operator. An import
 * that does not build or that computes other numbers fails the test; the number passing
 * may only grow (a floor below). And a corpus of malformed ONNX files, written here from a
 * good one with protobuf-c: each one error, no crash. */
#define _DEFAULT_SOURCE /* mkdtemp */
#include <criterion/criterion.h>
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../onnx/onnx.h"
#include "../runtime/kiln_rt.h"
#include "support.h"

#define CONFORMANCE KILN_SOURCE_DIR "/../shared/onnx-conformance"

/* A TensorProto file as a new krt_array, read by the runtime; false when it does not read. */
static bool read_pb(const char *path, krt_array *a)
{
    krt_error e;
    return krt_tensorproto_load(path, a, &e) == KRT_OK;
}

/* Element i of an array of any dtype the runtime reads, as a double. */
static double value_at(const krt_array *a, int64_t i)
{
    switch (a->dtype) {
    case KRT_F32: return ((const float *)a->data)[i];
    case KRT_F64: return ((const double *)a->data)[i];
    case KRT_I64: return (double)((const int64_t *)a->data)[i];
    case KRT_I32: return ((const int32_t *)a->data)[i];
    default: return ((const uint8_t *)a->data)[i];
    }
}

/* The names of the forward's inputs and outputs in an imported model file. */
static int signature(const char *kiln, char names[][64], int cap, bool outputs)
{
    const char *p = strstr(kiln, "\nforward(");
    if (!p) return 0;
    p += 9;
    int n = 0;
    if (outputs) {
        p = strstr(p, ") -> ");
        if (!p) return 0;
        p += 5;
        while (*p && *p != '{' && n < cap) {
            while (*p == ' ' || *p == ',') p++;
            const char *e = p;
            while (*e && *e != ',' && *e != ' ') e++;
            if (e > p) snprintf(names[n++], 64, "%.*s", (int)(e - p), p);
            p = e;
            while (*p == ' ') p++;
        }
        return n;
    }
    while (*p && *p != ')' && n < cap) {
        const char *colon = strchr(p, ':');
        if (!colon) break;
        snprintf(names[n++], 64, "%.*s", (int)(colon - p), p);
        p = strchr(colon, ']');
        if (!p) break;
        p++;
        while (*p == ',' || *p == ' ') p++;
    }
    return n;
}

typedef enum { CASE_PASSED, CASE_REFUSED, CASE_FAILED } CaseResult;

/* One conformance case in dir (scratch in work): what became of it, and why in `why`. */
static CaseResult run_case(const char *dir, const char *work, StrBuf *why)
{
    char cmd[4096], path[4200];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "import %s/model.onnx -o %s/m.kiln", dir, work);
    if (support_run_kiln(cmd, &out) != 0) {
        const char *e = out.data ? out.data : "";
        const bool one_line = strchr(e, '\n') == strrchr(e, '\n') && strstr(e, ": error: ");
        sb_printf(why, "%s", e);
        sb_free(&out);
        return one_line ? CASE_REFUSED : CASE_FAILED;
    }
    snprintf(cmd, sizeof cmd, "build %s/m.kiln --infer -o %s/prog", work, work);
    out.len = 0;
    if (support_run_kiln(cmd, &out) != 0) {
        sb_printf(why, "imported, but does not build: %s", out.data ? out.data : "");
        sb_free(&out);
        return CASE_FAILED;
    }
    snprintf(path, sizeof path, "%s/m.kiln", work);
    size_t len;
    StrBuf err;
    sb_init(&err);
    char *kiln = util_read_file(path, &len, &err);
    sb_free(&err);
    char ins[16][64], outs[16][64];
    const int nin = kiln ? signature(kiln, ins, 16, false) : 0, nout = kiln ? signature(kiln, outs, 16, true) : 0;
    free(kiln);
    StrBuf run;
    sb_init(&run);
    sb_printf(&run, "%s/prog --weights %s/m.safetensors --quiet --output %s/out.npy", work, work, work);
    CaseResult r = CASE_PASSED;
    for (int k = 0; k < nin; k++) /* the inputs as the suite has them: TensorProto files */
        sb_printf(&run, " --data %s=%s/test_data_set_0/input_%d.pb", ins[k], dir, k);
    if (r == CASE_PASSED) {
        out.len = 0;
        if (support_run(run.data, &out) != 0) {
            sb_printf(why, "the program failed: %s", out.data ? out.data : "");
            r = CASE_FAILED;
        }
    }
    for (int k = 0; k < nout && r == CASE_PASSED; k++) {
        krt_array want, got;
        krt_error e;
        snprintf(path, sizeof path, "%s/test_data_set_0/output_%d.pb", dir, k);
        if (!read_pb(path, &want)) {
            sb_printf(why, "cannot read %s", path);
            r = CASE_FAILED;
            break;
        }
        if (nout == 1) snprintf(path, sizeof path, "%s/out.npy", work);
        else snprintf(path, sizeof path, "%s/out.%s.npy", work, outs[k]);
        if (krt_npy_load(path, &got, &e) != KRT_OK || got.dtype != KRT_F32 || krt_array_count(&got) != krt_array_count(&want)) {
            sb_printf(why, "output %d: %s", k, krt_npy_load(path, &got, &e) != KRT_OK ? e.msg : "another shape");
            krt_array_free(&want);
            r = CASE_FAILED;
            break;
        }
        double worst = 0;
        for (int64_t i = 0; i < krt_array_count(&want); i++) {
            /* the program writes float32 (docs/inference.md): the expected value as float32 too */
            const double w = (float)value_at(&want, i), g = ((float *)got.data)[i];
            const double excess = fabs(g - w) - (1e-5 + 1e-3 * fabs(w));
            if (excess > worst || isnan(g) != isnan(w)) worst = isnan(g) != isnan(w) ? INFINITY : excess;
        }
        if (worst > 0) {
            sb_printf(why, "output %d differs from the expected by %.3g over the tolerance", k, worst);
            r = CASE_FAILED;
        }
        krt_array_free(&want);
        krt_array_free(&got);
    }
    sb_free(&run);
    sb_free(&out);
    return r;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* The number of cases that must pass: it only grows as kiln import does. */
#define PASSING_FLOOR 104

Test(onnx, conformance_cases, .timeout = 1200)
{
    static const char *const sets[] = {"pytorch-converted", "pytorch-operator"};
    char work[] = "/tmp/kiln-onnx-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(work));
    int passed = 0, refused = 0, failed = 0;
    StrBuf report;
    sb_init(&report);
    for (int s = 0; s < 2; s++) {
        char setdir[1024];
        snprintf(setdir, sizeof setdir, "%s/%s", CONFORMANCE, sets[s]);
        DIR *d = opendir(setdir);
        cr_assert(d, "no conformance cases in %s", setdir);
        char **names = NULL;
        int n = 0, cap = 0;
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            GROW(names, cap, n + 1);
            names[n++] = xstrdup(e->d_name);
        }
        closedir(d);
        qsort(names, (size_t)n, sizeof *names, cmp_names);
        for (int i = 0; i < n; i++) {
            char dir[2048], scratch[1200];
            snprintf(dir, sizeof dir, "%s/%s", setdir, names[i]);
            snprintf(scratch, sizeof scratch, "%s/%s", work, names[i]);
            cr_assert_eq(mkdir(scratch, 0755), 0);
            StrBuf why;
            sb_init(&why);
            const CaseResult r = run_case(dir, scratch, &why);
            passed += r == CASE_PASSED, refused += r == CASE_REFUSED, failed += r == CASE_FAILED;
            if (r != CASE_PASSED) sb_printf(&report, "%s %s: %s%s", r == CASE_REFUSED ? "refused" : "FAILED", names[i], why.data ? why.data : "",
                                            why.len && why.data[why.len - 1] == '\n' ? "" : "\n");
            cr_expect(r != CASE_FAILED, "%s: %s", names[i], why.data ? why.data : "");
            sb_free(&why);
            free(names[i]);
        }
        free(names);
    }
    printf("onnx conformance: %d passed, %d refused with one error, %d failed, of %d\n%s", passed, refused, failed, passed + refused + failed,
           report.data ? report.data : "");
    fflush(stdout);
    cr_expect_geq(passed, PASSING_FLOOR, "%d cases pass, fewer than the %d that passed before", passed, PASSING_FLOOR);
    sb_free(&report);
    support_remove_dir(work);
}

/* Runs tests/onnx/SCRIPT with its arguments (Debian's python3): false when it exits 77 or
 * there is no python3 (what it needs is not installed); fails the test on another error. */
static bool run_python(const char *script, const char *args)
{
    char cmd[4096];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/tests/onnx/%s' %s", KILN_SOURCE_DIR, script, args);
    const int rc = support_run(cmd, &out);
    if (rc != 77 && rc != 127) cr_assert_eq(rc, 0, "%s:\n%s", cmd, out.data ? out.data : "");
    sb_free(&out);
    return rc == 0;
}

/* bench/'s PyTorch twins exported into dir (export_twins.py); false (the test then skips)
 * without PyTorch. */
static bool export_twins(const char *dir)
{
    char args[1200];
    snprintf(args, sizeof args, "'%s/bench' '%s'", KILN_SOURCE_DIR, dir);
    return run_python("export_twins.py", args);
}

/* ---- single operators ---- */

/* Operators the conformance cases do not have (Where, comparisons, logic, Expand, Shape,
 * ConstantOfShape, LayerNormalization, HardSigmoid, Gelu, ArgMax/Min, Sin, Cos,
 * HardSwish, LRN, Resize nearest and linear), one small model each written by tests/onnx/op_models.py with ONNX's own
 * helper and NumPy's results: each imported, built, run and compared as a conformance
 * case is. */
Test(onnx, single_operators, .timeout = 300)
{
    char dir[] = "/tmp/kiln-onnx-ops-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    char args[1100];
    snprintf(args, sizeof args, "'%s/cases'", dir);
    if (!run_python("op_models.py", args)) {
        support_remove_dir(dir);
        cr_skip_test("Debian's python3-onnx is not installed: the operator models are not written");
    }
    char cases[1100];
    snprintf(cases, sizeof cases, "%s/cases", dir);
    DIR *d = opendir(cases);
    cr_assert(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char cdir[2300], scratch[2300];
        snprintf(cdir, sizeof cdir, "%s/%s", cases, e->d_name);
        snprintf(scratch, sizeof scratch, "%s/run-%s", dir, e->d_name);
        cr_assert_eq(mkdir(scratch, 0755), 0);
        StrBuf why;
        sb_init(&why);
        cr_expect_eq(run_case(cdir, scratch, &why), CASE_PASSED, "%s: %s", e->d_name, why.data ? why.data : "");
        sb_free(&why);
        n++;
    }
    closedir(d);
    cr_expect_geq(n, 19, "only %d operator models", n);
    support_remove_dir(dir);
}

/* The imported mlp, with models/mlp.kiln's loss, metric and train section appended (its
 * output renamed), trains as models/mlp.kiln does: PyTorch's Linear layers are Linear
 * members with the same names, so the same initialisation and the same steps. One epoch of
 * each: the same evaluation line. */
Test(onnx, imported_mlp_trains_as_models_mlp, .timeout = 300)
{
    if (!SUPPORT_REPEAT_RUNS) cr_skip_test("sanitizer build: a numerical comparison of two trainings (support.h)");
    char dir[] = "/tmp/kiln-onnx-train-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    if (!export_twins(dir)) {
        support_remove_dir(dir);
        cr_skip_test("PyTorch (Debian's python3-torch) is not installed: the twins are not exported");
    }
    char cmd[4096], path[1200];
    StrBuf out, mlp, text;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "import %s/mlp.onnx -o %s/mlp.kiln", dir, dir);
    cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
    snprintf(path, sizeof path, "%s/mlp.kiln", dir);
    size_t len;
    StrBuf err;
    sb_init(&err);
    char *imported = util_read_file(path, &len, &err), *reference = util_read_file(support_path("models/mlp.kiln"), &len, &err);
    cr_assert(imported && reference, "%s", err.data);
    char *cut = strstr(imported, "\n# kiln build needs a loss"), *from = strstr(reference, "\nloss(logits");
    cr_assert(cut && from, "the imported file or models/mlp.kiln changed");
    *cut = 0;
    sb_init(&text);
    sb_puts(&text, imported);
    for (const char *p = from; *p;) { /* the reference's tail, its output named as the import names it */
        if (!strncmp(p, "logits", 6)) sb_puts(&text, "v_logits"), p += 6;
        else sb_putc(&text, *p++);
    }
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs(text.data, f);
    fclose(f);
    sb_init(&mlp);
    snprintf(cmd, sizeof cmd, "train %s --epochs 1 --checkpoint-dir %s/ck-imported", path, dir);
    cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
    snprintf(cmd, sizeof cmd, "train %s --epochs 1 --checkpoint-dir %s/ck-mlp", support_path("models/mlp.kiln"), dir);
    cr_assert_eq(support_run_kiln(cmd, &mlp), 0, "%s", mlp.data);
    const char *a = strstr(out.data, "eval at step"), *b = strstr(mlp.data, "eval at step");
    cr_assert(a && b, "no evaluation line:\n%s\n%s", out.data, mlp.data);
    cr_expect(!strncmp(a, b, strcspn(b, "\n")), "the imported mlp: %.*s\nmodels/mlp.kiln: %.*s", (int)strcspn(a, "\n"), a, (int)strcspn(b, "\n"), b);
    printf("onnx: the imported mlp trained one epoch: %.*s\n", (int)strcspn(a, "\n"), a);
    free(imported);
    free(reference);
    sb_free(&err);
    sb_free(&text);
    sb_free(&mlp);
    sb_free(&out);
    support_remove_dir(dir);
}

/* ---- malformed files ---- */

/* test_Linear's model (Gemm of an input and two initializers), unpacked for a change. */
static Onnx__ModelProto *good_model(void)
{
    size_t len;
    StrBuf err;
    sb_init(&err);
    char *bytes = util_read_file(CONFORMANCE "/pytorch-converted/test_Linear/model.onnx", &len, &err);
    cr_assert(bytes, "%s", err.data);
    sb_free(&err);
    Onnx__ModelProto *m = onnx__model_proto__unpack(NULL, len, (const uint8_t *)bytes);
    free(bytes);
    cr_assert(m);
    return m;
}

static void write_bytes(const char *path, const void *data, size_t n)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, n, f), n);
    fclose(f);
}

static void write_model(const char *path, Onnx__ModelProto *m)
{
    const size_t n = onnx__model_proto__get_packed_size(m);
    uint8_t *buf = xmalloc(n + 1);
    onnx__model_proto__pack(m, buf);
    write_bytes(path, buf, n);
    free(buf);
}

/* kiln import of path: exit status 1, one line saying `what`, no model file written. */
static void refused(const char *dir, const char *path, const char *what)
{
    char cmd[2048], out_path[1100];
    snprintf(out_path, sizeof out_path, "%s/out.kiln", dir);
    snprintf(cmd, sizeof cmd, "import %s -o %s", path, out_path);
    StrBuf out;
    sb_init(&out);
    const int rc = support_run_kiln(cmd, &out);
    const char *o = out.data ? out.data : "";
    cr_expect_eq(rc, 1, "%s: exit status %d:\n%s", path, rc, o);
    cr_expect(strstr(o, ": error: ") && strstr(o, what), "%s: expected '%s' in:\n%s", path, what, o);
    cr_expect(strchr(o, '\n') == strrchr(o, '\n'), "%s: more than one line:\n%s", path, o);
    cr_expect(!strstr(o, "Sanitizer") && !strstr(o, "runtime error"), "%s:\n%s", path, o);
    cr_expect(access(out_path, F_OK) != 0, "%s: a model file was written", path);
    sb_free(&out);
}

Test(onnx, malformed_files_are_one_error_each)
{
    char dir[] = "/tmp/kiln-onnx-bad-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    char path[1100];
    /* bytes that are not a model */
    size_t len;
    StrBuf err;
    sb_init(&err);
    char *bytes = util_read_file(CONFORMANCE "/pytorch-converted/test_Linear/model.onnx", &len, &err);
    cr_assert(bytes);
    snprintf(path, sizeof path, "%s/truncated.onnx", dir);
    write_bytes(path, bytes, len / 2);
    refused(dir, path, "does not parse as an onnx.ModelProto");
    snprintf(path, sizeof path, "%s/text.onnx", dir);
    write_bytes(path, "model mlp\nforward(x) -> y { y = x }\n", 36);
    refused(dir, path, "does not parse");
    snprintf(path, sizeof path, "%s/empty.onnx", dir);
    write_bytes(path, "", 0);
    refused(dir, path, "the model has no graph");
    snprintf(path, sizeof path, "%s/missing.onnx", dir);
    refused(dir, path, "missing.onnx");
    free(bytes);
    sb_free(&err);
    /* models changed one way each */
    /* a missing initializer, a cycle, huge dims, bytes short of the shape, a type, the
     * opset, an undefined output, a name defined twice, a negative dim */
    static const char *const said[] = {"reads 'nowhere', which no input, initializer or node defines",
                                       "the graph has a cycle",
                                       "more than 2^31 elements",
                                       "its raw data is 320 bytes, not the 360 its shape and type make",
                                       "its type is STRING",
                                       "opset 99: Kiln reads opsets 6 to 21",
                                       "graph output 'gone' is not defined",
                                       "is defined twice",
                                       "dimension 0 is -8"};
    for (size_t c = 0; c < sizeof said / sizeof *said; c++) {
        Onnx__ModelProto *m = good_model();
        Onnx__GraphProto *g = m->graph;
        Onnx__NodeProto *gemm = g->node[0];
        Onnx__TensorProto *w = g->initializer[0]; /* '1', [8, 10] */
        char *saved = NULL, **slot = NULL; /* a string of the model's, put back before protobuf-c frees it */
        switch (c) {
        case 0: slot = &gemm->input[1], saved = *slot, *slot = (char *)"nowhere"; break;
        case 1: slot = &gemm->input[0], saved = *slot, *slot = gemm->output[0]; break; /* Gemm reads its own output */
        case 2: w->dims[0] = (int64_t)1 << 40; break;
        case 3: w->dims[0] = 9; break;
        case 4: w->data_type = ONNX__TENSOR_PROTO__DATA_TYPE__STRING; break;
        case 5: m->opset_import[0]->version = 99; break;
        case 6: slot = &g->output[0]->name, saved = *slot, *slot = (char *)"gone"; break;
        case 7: slot = &g->initializer[1]->name, saved = *slot, *slot = w->name; break;
        case 8: w->dims[0] = -8; break;
        }
        snprintf(path, sizeof path, "%s/bad%zu.onnx", dir, c);
        write_model(path, m);
        refused(dir, path, said[c]);
        if (slot) *slot = saved;
        onnx__model_proto__free_unpacked(m, NULL);
    }
    support_remove_dir(dir);
}

/* ---- PyTorch's exports ---- */

/* bench/'s twins of mlp, cnn (reference.py), gpt (reference_gpt.py) and llama
 * (reference_llama.py: its grouped-query heads' repeat_interleave folded at import), exported by the
 * installed PyTorch (tests/onnx/export_twins.py): imported, built and run, PyTorch's
 * outputs within 1e-5, the weights under PyTorch's state_dict names. */
Test(onnx, pytorch_twins_give_pytorchs_outputs, .timeout = 300)
{
    char dir[] = "/tmp/kiln-onnx-twins-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    char cmd[4096];
    if (!export_twins(dir)) {
        support_remove_dir(dir);
        cr_skip_test("PyTorch (Debian's python3-torch) is not installed: the twins are not exported");
    }
    StrBuf out;
    sb_init(&out);
    static const char *const models[] = {"mlp", "cnn", "gpt", "llama"};
    static const char *const input[] = {"image=", "image=", "", ""};
    for (int i = 0; i < 4; i++) {
        const char *m = models[i];
        snprintf(cmd, sizeof cmd, "import %s/%s.onnx -o %s/%s.kiln", dir, m, dir, m);
        out.len = 0;
        cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
        /* the weights keep PyTorch's state_dict names: holder modules, the layers' members */
        char path[1100];
        snprintf(path, sizeof path, "%s/%s.kiln", dir, m);
        size_t len;
        StrBuf err;
        sb_init(&err);
        char *text = util_read_file(path, &len, &err);
        cr_assert(text, "%s", err.data);
        if (i < 2) /* PyTorch's Linear layers are Kiln's: fc1 = Linear(784, 256), ..., fc2(x) */
            cr_expect(strstr(text, i ? "\nfc1 = Linear(3136, 128)" : "\nfc1 = Linear(784, 256)") && strstr(text, " = fc2(v_"), "%s", text);
        else if (i == 2) cr_expect(strstr(text, "wte = P_wte()"), "%s", text); /* (h.0.ln_1.weight: a number in the path, p_h_0_ln_1_weight) */
        if (i == 1) cr_expect(strstr(text, "\nconv1 = Conv2d(1, 32, [3, 3]") && strstr(text, "\nconv2 = Conv2d(32, 64,"), "%s", text);
        free(text);
        sb_free(&err);
        snprintf(cmd, sizeof cmd, "build %s/%s.kiln --infer -o %s/%s", dir, m, dir, m);
        out.len = 0;
        cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
        /* one input: --data PATH without its name (mlp, gpt), or with it (cnn) */
        snprintf(cmd, sizeof cmd, "%s/%s --weights %s/%s.safetensors --data %s%s/%s_in.npy --output %s/%s_got.npy --quiet", dir, m, dir, m,
                 i == 1 ? input[i] : "", dir, m, dir, m);
        out.len = 0;
        cr_assert_eq(support_run(cmd, &out), 0, "%s:\n%s", cmd, out.data ? out.data : "");
        char a[1100], b[1100];
        snprintf(a, sizeof a, "%s/%s_got.npy", dir, m);
        snprintf(b, sizeof b, "%s/%s_out.npy", dir, m);
        krt_array got, want;
        krt_error e;
        cr_assert_eq(krt_npy_load(a, &got, &e), KRT_OK, "%s", e.msg);
        cr_assert_eq(krt_npy_load(b, &want, &e), KRT_OK, "%s", e.msg);
        cr_assert_eq(krt_array_count(&got), krt_array_count(&want));
        double worst = 0;
        for (int64_t k = 0; k < krt_array_count(&got); k++) {
            const double d = fabs((double)((float *)got.data)[k] - ((float *)want.data)[k]);
            worst = d > worst ? d : worst;
        }
        printf("onnx: PyTorch's %s exported and imported: outputs within %.3g\n", m, worst);
        cr_expect(worst <= 1e-5, "%s: Kiln's outputs differ from PyTorch's by %g", m, worst);
        krt_array_free(&got);
        krt_array_free(&want);
    }
    sb_free(&out);
    support_remove_dir(dir);
}

/* An inference program's TensorProto inputs that are not what it takes: each one error
 * naming the file, no crash (test_Linear's model: input [4, 10] float). */
Test(onnx, bad_tensorproto_inputs_are_one_error_each)
{
    char dir[] = "/tmp/kiln-onnx-pb-XXXXXX"; /* a mkdtemp template */
    cr_assert(mkdtemp(dir));
    char cmd[4096], path[1100];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "import %s/pytorch-converted/test_Linear/model.onnx -o %s/lin.kiln", CONFORMANCE, dir);
    cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
    snprintf(cmd, sizeof cmd, "build %s/lin.kiln --infer -o %s/lin", dir, dir);
    cr_assert_eq(support_run_kiln(cmd, &out), 0, "%s", out.data);
    /* a good input, then each way of being bad */
    float values[40];
    for (int i = 0; i < 40; i++) values[i] = (float)i / 10;
    int64_t dims[2] = {4, 10};
    static const char *const said[] = {"",
                                       "does not parse as one",
                                       "takes f32[N, 10] per file, this file holds f32[4, 9]",
                                       "raw data is 80 bytes, not the 160",
                                       "a TensorProto of ONNX type 8",
                                       "holds 0 values, not the 40"};
    for (size_t c = 0; c < sizeof said / sizeof *said; c++) {
        Onnx__TensorProto t = ONNX__TENSOR_PROTO__INIT;
        t.n_dims = 2, t.dims = dims;
        t.has_data_type = 1, t.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__FLOAT;
        t.has_raw_data = 1, t.raw_data.data = (uint8_t *)values, t.raw_data.len = sizeof values;
        int64_t narrow[2] = {4, 9};
        if (c == 2) t.dims = narrow, t.raw_data.len = 36 * sizeof(float);
        if (c == 3) t.raw_data.len = 80;
        if (c == 4) t.data_type = ONNX__TENSOR_PROTO__DATA_TYPE__STRING;
        if (c == 5) t.has_raw_data = 0;
        const size_t n = onnx__tensor_proto__get_packed_size(&t);
        uint8_t *buf = xmalloc(n + 1);
        onnx__tensor_proto__pack(&t, buf);
        snprintf(path, sizeof path, "%s/in%zu.pb", dir, c);
        write_bytes(path, buf, c == 1 ? n / 2 : n);
        free(buf);
        snprintf(cmd, sizeof cmd, "%s/lin --weights %s/lin.safetensors --data %s --quiet --output %s/out.npy", dir, dir, path, dir);
        out.len = 0;
        if (out.data) out.data[0] = 0;
        const int rc = support_run(cmd, &out);
        const char *o = out.data ? out.data : "";
        if (!c) {
            cr_expect_eq(rc, 0, "a good TensorProto input: %s", o);
            continue;
        }
        cr_expect_neq(rc, 0, "%s: exit status 0", path);
        cr_expect(strstr(o, path) && strstr(o, said[c]) && strchr(o, '\n') == strrchr(o, '\n'), "%s: expected one line with '%s':\n%s", path,
                  said[c], o);
        cr_expect(!strstr(o, "Sanitizer") && !strstr(o, "runtime error"), "%s:\n%s", path, o);
    }
    sb_free(&out);
    support_remove_dir(dir);
}

