/* test_cuda_codegen.c — the CUDA target (codegen/cuda.c) against the C target, kernel by
 * kernel, in the manner of llm.c's dev/cuda files: the same fused kernel is generated for
 * both targets from the shared kernel-body generator (codegen/kernel.c), the C kernel runs
 * on the host as the reference, the CUDA kernel runs under the CUDA emulator (g++
 * -DKILN_CUDA_EMU, emu/) on the same inputs, and the outputs are compared.
 * model.cu also compiles with nvcc for sm_90 without spills when a toolkit is installed
 * (the models' model.cu in test_cuda_train, for sm_80 and sm_90),
 * and a kernel the target cannot write yet is an error that names it and its model line. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../driver/kiln.h"
#include "../codegen/codegen.h"
#include "../codegen/cuda_internal.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "support.h"

#ifndef KILN_NVCC
#define KILN_NVCC ""
#endif

/* Unsupported kinds are refused, never written wrong: a double-precision matrix product
 * (cuBLAS's Dgemm is not wired yet) is an error naming the kernel and its model line, and
 * no model.cu is written. */
Test(cuda_codegen, unsupported_kernels_are_named_with_their_model_line)
{
    char dir[] = "/tmp/kiln-cudacg-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[512], path[300];
    snprintf(path, sizeof path, "%s/f64mm.kiln", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("model f64mm\ndim B <= 8\nforward(x: f64[B, 4]) -> y {\n    y = f32(matmul(x, transpose(x)))\n}\n"
          "loss(y) = sum(y * y)\n",
          f);
    fclose(f);
    snprintf(args, sizeof args, "emit %s --target cuda -o %s/out", path, dir);
    StrBuf out;
    sb_init(&out);
    int rc = support_run_kiln(args, &out);
    cr_expect_eq(rc, 1, "%s", out.data ? out.data : "");
    const char *msg = out.data ? out.data : "";
    cr_expect(strstr(msg, "f64mm.kiln:4: error: --target cuda does not support non-float32 matrix product kernels yet (kernel 0 "
                          "of the training step, matrix product over double[B, B]: ") &&
                  strstr(msg, "f64mm.kiln:4: y = f32(matmul(x, transpose(x))))"),
              "%s", msg);
    snprintf(path, sizeof path, "%s/out/model.cu", dir);
    cr_expect_neq(access(path, F_OK), 0, "model.cu written despite the error");
    snprintf(args, sizeof args, "emit models/mlp.kiln --target ptx -o %s/out", dir);
    cr_expect_eq(support_run_kiln(args, &out), 2);
    sb_free(&out);
    support_remove_dir(dir);
}

/* Every model of models/ has its every kernel, of the training and the evaluation step,
 * written by the target. */
Test(cuda_codegen, every_model_is_written_whole)
{
    static const char *const models[] = {"mlp", "cnn", "gpt", "gpt2-124m", "llama"};
    for (int m = 0; m < 5; m++) {
        char dir[] = "/tmp/kiln-cudacg-XXXXXX";
        cr_assert(mkdtemp(dir));
        char args[256], path[300];
        snprintf(args, sizeof args, "emit models/%s.kiln --target cuda -o %s/out", models[m], dir);
        StrBuf out;
        sb_init(&out);
        cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data ? out.data : "");
        snprintf(path, sizeof path, "%s/out/model.cu", dir);
        cr_expect_eq(access(path, F_OK), 0, "no model.cu for %s", models[m]);
        sb_free(&out);
        support_remove_dir(dir);
    }
}

/* A kernel member that reads many operands (a concat of many values): the kernel's list of
 * reads had room for three per member, and emitting tests/gradcheck/extremes.kiln for the
 * GPU overran it (a crash in free). */
Test(cuda_codegen, a_member_of_many_operands)
{
    char dir[] = "/tmp/kiln-cudacg-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[512];
    snprintf(args, sizeof args, "emit tests/gradcheck/extremes.kiln --target cuda -o %s/out", dir);
    StrBuf out;
    sb_init(&out);
    cr_expect_eq(support_run_kiln(args, &out), 0, "%s", out.data ? out.data : "");
    sb_free(&out);
    support_remove_dir(dir);
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f, "cannot write %s", path);
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    fclose(f);
}

static int64_t numel_at(const Graph *g, const Shape *s, const int64_t *symvals)
{
    int64_t n = 1;
    for (int k = 0; k < s->rank; k++) n *= ir_dim_eval(s->d[k], symvals);
    return n;
}

/* The text of function `name` in code: from "KILN_KERNEL void NAME(" to its closing brace;
 * NULL when there is none. */
static char *function_text(const char *code, const char *name)
{
    char head[128];
    snprintf(head, sizeof head, "KILN_KERNEL void %s(", name);
    const char *at = strstr(code, head);
    if (!at) return NULL; /* the kernel calls an earlier kernel's function: the same code */
    const char *end = strstr(at, "\n}\n");
    cr_assert(end);
    size_t n = (size_t)(end + 3 - at);
    char *text = malloc(n + 1);
    memcpy(text, at, n);
    text[n] = 0;
    return text;
}

/* The C function training kernel k calls: its entry in model.c's profile table
 * train_kernels[] (codegen/names.c names functions after the model). Owned by the caller. */
static char *c_kernel_function(const char *code, int32_t k)
{
    const char *p = strstr(code, "static const kiln_kernel_info train_kernels[] = {\n");
    cr_assert(p, "model.c has no train_kernels table");
    p = strchr(p, '\n') + 1;
    for (int32_t i = 0; i < k; i++) p = strchr(p, '\n') + 1;
    const char *q = strstr(p, "{\"");
    cr_assert(q && q < strchr(p, '\n'), "train_kernels has no kernel %d", k);
    q += 2;
    return xstrndup(q, (size_t)(strchr(q, '"') - q));
}

/* The launcher of the training graph's kernel k in model.cu (written before the evaluation
 * graph's): the function after the first "Launches kernel k on stream" comment. */
static char *cuda_launcher(const char *cu, int32_t k)
{
    char head[64];
    snprintf(head, sizeof head, "/* Launches kernel %d on stream", k);
    const char *p = strstr(cu, head);
    cr_assert(p, "model.cu launches no kernel %d", k);
    p = strstr(p, "\nvoid ");
    cr_assert(p);
    p += strlen("\nvoid ");
    return xstrndup(p, (size_t)(strchr(p, '(') - p));
}

static int run(const char *cmd, const char *what)
{
    StrBuf out;
    sb_init(&out);
    int rc = support_run(cmd, &out);
    if (rc) cr_log_error("%s failed (%d):\n%s\n%s", what, rc, cmd, out.data ? out.data : "");
    else if (out.len) printf("%s", out.data);
    fflush(stdout);
    sb_free(&out);
    return rc;
}

/* Single-node kernels that --target cuda writes (codegen/cuda.c's single_supported). */
static bool single_written(Op op)
{
    return op == OP_IOTA || op == OP_EXPAND || op == OP_PERMUTE || op == OP_PAD || op == OP_SLICE || op == OP_CONCAT ||
           op == OP_CHECK_INDEX || op == OP_ARGMAX || op == OP_GATHER || op == OP_SCATTER_ADD || op == OP_UNFOLD || op == OP_FOLD;
}

/* The range of the values of integer input j of single-node kernel id (indices), or 0. */
static int64_t index_range(const Graph *g, NodeId id, int j, const int64_t *symvals)
{
    const Node *n = &g->nodes[id];
    if (n->op == OP_CHECK_INDEX) return ir_attrs(g, id)[0] + 3; /* some out of range: bad is checked too */
    if (n->op == OP_GATHER && j == 1) return ir_dim_eval(g->nodes[ir_input(g, id, 0)].shape.d[0], symvals);
    if (n->op == OP_SCATTER_ADD && j == 0) return ir_dim_eval(n->shape.d[0], symvals);
    return 0;
}

/* The harness's call that fills an array of dtype t with values in [-2, 2): filled<T>, or
 * for half precision those values rounded (filled_bf16, filled_f16), not random bits. */
static void filler(StrBuf *b, DType t)
{
    if (t == DT_BF16) sb_puts(b, "filled_bf16");
    else if (t == DT_F16) sb_puts(b, "filled_f16");
    else sb_printf(b, "filled<%s>", cg_ctype(t));
}

/* How far a kernel's element may be from the C target's, relative to 1 + |want|: float
 * sums in another order (or libm's tanhf against the device's); in a kernel that rounds to
 * half precision (t), a value on either side of a rounding boundary rounds one step apart,
 * and so may everything the kernel computes from it. */
static double tolerance(DType t) { return t == DT_BF16 ? 1e-2 : t == DT_F16 ? 2e-3 : 1e-4; }

/* The half precision kernel L rounds to (a member or a store of that dtype), or f32. */
static DType kernel_half(const CgKernel *L)
{
    DType t = DT_F32;
    for (int32_t i = 0; i < L->K->count; i++) {
        const DType d = (DType)L->g->nodes[CG_MEMBER(L, i)].dtype;
        if (d == DT_BF16 || (d == DT_F16 && t == DT_F32)) t = d;
    }
    return t;
}

/* The precision the models are compiled in (the precision pass): f32 unless a test sets it. */
static PrecisionOptions precision = {.half = DT_F32};

/* Single-node kernel k (node id) of the C file against its CUDA kernel: the C function
 * (cfn, its text) and the CUDA kernel's launcher on the same inputs (indices in range, a few
 * out of range for an index check), outputs compared exactly (the same operations in the
 * same order), and an index check's first bad position. */
static void single_kernel_test(const Graph *g, int32_t k, NodeId id, const char *cfn, const char *launcher, const int64_t *symvals,
                               StrBuf *ref, StrBuf *harness, StrBuf *body)
{
    const Node *n = &g->nodes[id];
    const char *op = ir_op_info[n->op].name;
    const bool check = n->op == OP_CHECK_INDEX;
    sb_printf(ref, "void ref_k%d%s\n", k, strchr(cfn, '('));
    sb_printf(harness, "extern \"C\" void ref_k%d(const int64_t *s", k);
    for (uint32_t j = 0; j < n->ninputs; j++)
        sb_printf(harness, ", const %s *", cg_ctype((DType)g->nodes[ir_input(g, id, (int)j)].dtype));
    sb_printf(harness, ", %s *%s);\n", cg_ctype((DType)n->dtype), check ? ", int64_t *" : "");
    sb_printf(body, "    { /* kernel %d: %%%d %s */\n", k, id, op);
    StrBuf hargs, dargs;
    sb_init(&hargs);
    sb_init(&dargs);
    for (uint32_t j = 0; j < n->ninputs; j++) {
        NodeId x = ir_input(g, id, (int)j);
        const char *t = cg_ctype((DType)g->nodes[x].dtype);
        int64_t cnt = numel_at(g, &g->nodes[x].shape, symvals), range = index_range(g, id, (int)j, symvals);
        if (range) sb_printf(body, "        %s *h%u = indices<%s>(%lld, %lld, %du);\n", t, j, t, (long long)cnt, (long long)range, x + 1);
        else {
            sb_printf(body, "        %s *h%u = ", t, j);
            filler(body, (DType)g->nodes[x].dtype);
            sb_printf(body, "(%lld, %du);\n", (long long)cnt, x + 1);
        }
        sb_printf(body, "        %s *d%u = on_device(h%u, %lld);\n", t, j, j, (long long)cnt);
        sb_printf(&hargs, ", h%u", j);
        sb_printf(&dargs, ", d%u", j);
    }
    const char *t = cg_ctype((DType)n->dtype);
    int64_t cnt = numel_at(g, &n->shape, symvals);
    sb_printf(body, "        %s *want = ", t);
    filler(body, (DType)n->dtype);
    sb_printf(body, "(%lld, 7u), *got = ", (long long)cnt);
    filler(body, (DType)n->dtype);
    sb_printf(body, "(%lld, 9u);\n", (long long)cnt);
    sb_printf(body, "        %s *dy = on_device(got, %lld);\n", t, (long long)cnt);
    if (check) sb_puts(body, "        int64_t bad_want = -2, bad_got[2] = {-2, -2}, *dbad = on_device(bad_got, 2); /* position, value */\n");
    sb_printf(body, "        ref_k%d(s%s, want%s);\n        %s(s%s, dy%s, 0);\n", k, hargs.data ? hargs.data : "",
              check ? ", &bad_want" : "", launcher, dargs.data ? dargs.data : "", check ? ", dbad" : "");
    sb_puts(body, "        KILN_CUDA_CHECK(cudaDeviceSynchronize());\n");
    sb_printf(body, "        KILN_CUDA_CHECK(cudaMemcpy(got, dy, %lld * sizeof *got, cudaMemcpyDeviceToHost));\n", (long long)cnt);
    sb_printf(body, "        int64_t differ = 0;\n"
                    "        for (int64_t i = 0; i < %lld; i++) differ += memcmp(&got[i], &want[i], sizeof *got) != 0;\n",
              (long long)cnt);
    if (check) {
        sb_puts(body, "        KILN_CUDA_CHECK(cudaMemcpy(bad_got, dbad, sizeof bad_got, cudaMemcpyDeviceToHost));\n"
                      "        differ += bad_got[0] != bad_want;\n");
        sb_printf(body, "        printf(\"kernel %d, %%%%%d %s: %lld elements, %%lld differ; first bad index %%lld (C: %%lld)\\n\", "
                        "(long long)differ, (long long)bad_got[0], (long long)bad_want);\n",
                  k, id, op, (long long)cnt);
        sb_puts(body, "        KILN_CUDA_CHECK(cudaFree(dbad));\n");
    } else {
        sb_printf(body, "        printf(\"kernel %d, %%%%%d %s: %lld elements, %%lld differ\\n\", (long long)differ);\n", k, id, op,
                  (long long)cnt);
    }
    sb_puts(body, "        bad |= differ != 0;\n");
    for (uint32_t j = 0; j < n->ninputs; j++) sb_printf(body, "        free(h%u);\n        KILN_CUDA_CHECK(cudaFree(d%u));\n", j, j);
    sb_puts(body, "        free(want);\n        free(got);\n        KILN_CUDA_CHECK(cudaFree(dy));\n    }\n");
    sb_free(&hargs);
    sb_free(&dargs);
}

/* Every kernel of the training graph of the model `text` that --target cuda writes (all
 * but double-precision matrix products: model.cu is partial, leaving those out) against
 * the C function of the same kernel. A kernel whose C function is an earlier kernel's
 * (the same code) is compared through that one. */
/* nvcc: whether to compile model.cu with nvcc too; the models' kernels are compiled, word
 * for word, by test_cuda_train's every_model_compiles_for_sm80_and_sm90_without_spills. */
static void check_map_kernels(const char *text, bool nvcc)
{
    char dir[] = "/tmp/kiln-cudacg-XXXXXX";
    cr_assert(mkdtemp(dir));
    char path[512], cmd[4096];
    snprintf(path, sizeof path, "%s/ew.kiln", dir);
    write_file(path, text);

    /* the model through the library call, as kiln emit compiles it (driver/kiln.h); model.cu
     * from the same plans, partial: kernels the target cannot write yet left out */
    KilnOptions ko = {.path = path,
                      .text = text,
                      .len = strlen(text),
                      .unfused_attention = true, /* as the CUDA target plans it (no fused kernels there yet) */
                      .precision = kiln_precision_name(precision.half),
                      .weight_rounding = precision.stochastic_weights ? "stochastic" : NULL};
    KilnProgram *p;
    StrBuf err, cu;
    sb_init(&err);
    sb_init(&cu);
    cr_assert_eq(kiln_compile(&ko, &p, &err), KILN_OK, "%s%s", err.data ? err.data : "", p->diag.out.data ? p->diag.out.data : "");
    const Graph *g = p->train.graph;
    const StrBuf c = p->code;
    CodegenInput in = {.train = {g, &p->train.plan}, .eval = {p->eval.graph, &p->eval.plan}, .source_path = path, .recipe = &p->recipe,
                       .partial = true};
    cr_assert_eq(codegen_cuda(&in, &cu, &err), 0, "%s", err.data);
    snprintf(path, sizeof path, "%s/model.cu", dir);
    write_file(path, cu.data);

    /* Every map kernel of the training graph, each against its C function. */
    Cg cg;
    memset(&cg, 0, sizeof cg);
    cg.g = g;
    cg.prefix = "train";
    cg.fp = p->train.plan.fusion; /* the program's plan, read only */
    cg.mp = p->train.plan.mem;
    cuda_gemm_plan_bgrad(&cg); /* as model.cu's writer pairs them */
    int64_t symvals[8] = {0};
    /* at most 50: sizes that are not multiples of the block, so that the last block is partial */
    for (int s = 0; s < g->nsyms; s++) symvals[s] = g->syms[s].max < 50 ? g->syms[s].max : 50;
    StrBuf ref, harness;
    sb_init(&ref);
    sb_init(&harness);
    sb_puts(&ref, "#pragma GCC diagnostic ignored \"-Wunknown-pragmas\"\n#include <math.h>\n#include <stdint.h>\n#include \"kiln_half.h\"\n"
                  "#include <string.h>\n#include \"kiln_gemm.h\"\n#include \"kiln_math.h\"\n#include \"kiln_rng.h\"\n"
                  "#define KILN_KERNEL\n");
    sb_puts(&harness, "#include \"model.cu\"\n#include <stdio.h>\n#include <stdlib.h>\n\n"
                      "template <typename T> static T *filled(int64_t n, unsigned seed)\n{\n"
                      "    T *x = (T *)malloc((size_t)(n ? n : 1) * sizeof(T));\n"
                      "    for (int64_t i = 0; i < n; i++) {\n"
                      "        seed = seed * 1664525u + 1013904223u;\n"
                      "        x[i] = (T)((double)(seed >> 8) / (1 << 24) * 4 - 2);\n    }\n    return x;\n}\n\n"
                      "template <typename T> static T *indices(int64_t n, int64_t range, unsigned seed)\n{\n"
                      "    T *x = (T *)malloc((size_t)(n ? n : 1) * sizeof(T));\n"
                      "    for (int64_t i = 0; i < n; i++) {\n"
                      "        seed = seed * 1664525u + 1013904223u;\n"
                      "        x[i] = (T)((int64_t)((seed >> 8) % (uint64_t)range));\n    }\n    return x;\n}\n\n"
                      "static inline uint16_t *filled_bf16(int64_t n, unsigned seed)\n{\n"
                      "    float *f = filled<float>(n, seed);\n    uint16_t *h = (uint16_t *)malloc((size_t)(n ? n : 1) * sizeof(uint16_t));\n"
                      "    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_bf16(f[i]);\n    free(f);\n    return h;\n}\n\n"
                      "static inline uint16_t *filled_f16(int64_t n, unsigned seed)\n{\n"
                      "    float *f = filled<float>(n, seed);\n    uint16_t *h = (uint16_t *)malloc((size_t)(n ? n : 1) * sizeof(uint16_t));\n"
                      "    for (int64_t i = 0; i < n; i++) h[i] = kiln_f32_to_f16(f[i]);\n    free(f);\n    return h;\n}\n\n"
                      "template <typename T> static T *on_device(const T *h, int64_t n)\n{\n"
                      "    T *p;\n    KILN_CUDA_CHECK(cudaMalloc(&p, (size_t)(n ? n : 1) * sizeof(T)));\n"
                      "    KILN_CUDA_CHECK(cudaMemcpy(p, h, (size_t)n * sizeof(T), cudaMemcpyHostToDevice));\n    return p;\n}\n\n");
    StrBuf body;
    sb_init(&body);
    sb_puts(&body, "int main(void)\n{\n    const int64_t s[] = {");
    for (int s = 0; s < g->nsyms; s++) sb_printf(&body, "%s%lld", s ? ", " : "", (long long)symvals[s]);
    sb_puts(&body, g->nsyms ? "};\n" : "0};\n");
    sb_puts(&body, "    int bad = 0;\n    cublasHandle_t blas;\n    KILN_CUBLAS_CHECK(cublasCreate(&blas));\n"
                   "    void *partials;\n    KILN_CUDA_CHECK(cudaMalloc(&partials, KILN_CUDA_PARTIALS_BYTES));\n");
    int nmaps = 0;
    StrBuf tested; /* "|name|" of each C function compared: a kernel that calls one again is not */
    sb_init(&tested);
    sb_putc(&tested, '|');
    for (int32_t k = 0; k < cg.fp.nkernels; k++) {
        char *name = c_kernel_function(c.data, k);
        char seen[160];
        snprintf(seen, sizeof seen, "|%s|", name);
        const bool again = strstr(tested.data, seen) != NULL;
        sb_printf(&tested, "%s|", name);
        if (cg.fp.kernels[k].kind == KERNEL_SINGLE) {
            NodeId id = cg.fp.kernels[k].anchor;
            char *fn = single_written((Op)g->nodes[id].op) && !again ? function_text(c.data, name) : NULL;
            if (fn) {
                char *launcher = cuda_launcher(cu.data, k);
                single_kernel_test(g, k, id, fn, launcher, symvals, &ref, &harness, &body);
                free(launcher);
                nmaps++;
            }
            free(fn);
            free(name);
            continue;
        }
        CgKernel L;
        cg_kernel_setup(&L, &cg, k);
        /* every loop kernel (elementwise, row reductions over any axes, column reductions,
         * with random numbers or not); float32 matrix products, summed over a batch or not */
        bool written = L.K->kind == KERNEL_LOOP;
        const bool gemm = L.K->kind == KERNEL_GEMM;
        if (gemm)
            written = L.rank >= 2 && g->nodes[L.K->anchor].dtype == DT_F32 &&
                      (cg.fp.stored[L.K->anchor] || L.K->written != IR_NONE || L.K->summed != IR_NONE);
        char *fn = written && !again ? function_text(c.data, name) : NULL;
        free(name);
        if (!fn) {
            cg_kernel_teardown(&L);
            continue;
        }
        char *launcher = cuda_launcher(cu.data, k);
        /* the reference under another name: the CUDA kernel of model.cu has this one */
        char *paren = strchr(fn, '(');
        sb_printf(&ref, "void ref_k%d%s\n", k, paren);
        free(fn);
        sb_printf(&harness, "extern \"C\" void ref_k%d(const int64_t *s", k);
        for (int i = 0; i < L.nreads; i++) sb_printf(&harness, ", const %s *", cg_ctype((DType)g->nodes[L.reads[i]].dtype));
        for (int i = 0; i < L.nstores; i++) sb_printf(&harness, ", %s *", cg_ctype((DType)g->nodes[L.stores[i]].dtype));
        sb_puts(&harness, L.random ? ", uint64_t, uint64_t);\n" : ");\n"); /* dropout's seed and step */
        sb_printf(&body, "    { /* kernel %d */\n", k);
        StrBuf hargs, dargs, frees;
        sb_init(&hargs);
        sb_init(&dargs);
        sb_init(&frees);
        for (int i = 0; i < L.nreads; i++) {
            NodeId r = L.reads[i];
            const char *t = cg_ctype((DType)g->nodes[r].dtype);
            int64_t n = numel_at(g, &g->nodes[r].shape, symvals);
            sb_printf(&body, "        %s *h%d = ", t, r);
            filler(&body, (DType)g->nodes[r].dtype);
            sb_printf(&body, "(%lld, %du);\n", (long long)n, r + 1);
            sb_printf(&body, "        %s *d%d = on_device(h%d, %lld);\n", t, r, r, (long long)n);
            sb_printf(&hargs, ", h%d", r);
            sb_printf(&dargs, ", d%d", r);
            sb_printf(&frees, "        free(h%d);\n        KILN_CUDA_CHECK(cudaFree(d%d));\n", r, r);
        }
        for (int i = 0; i < L.nstores; i++) {
            NodeId y = L.stores[i];
            const char *t = cg_ctype((DType)g->nodes[y].dtype);
            int64_t n = numel_at(g, &g->nodes[y].shape, symvals);
            sb_printf(&body, "        %s *want%d = ", t, y);
            filler(&body, (DType)g->nodes[y].dtype);
            sb_printf(&body, "(%lld, 7u), *got%d = ", (long long)n, y);
            filler(&body, (DType)g->nodes[y].dtype);
            sb_printf(&body, "(%lld, 9u);\n", (long long)n);
            sb_printf(&body, "        %s *d%d = on_device(got%d, %lld);\n", t, y, y, (long long)n);
            sb_printf(&hargs, ", want%d", y);
            sb_printf(&dargs, ", d%d", y);
            sb_printf(&frees, "        free(want%d);\n        free(got%d);\n        KILN_CUDA_CHECK(cudaFree(d%d));\n", y, y, y);
        }
        /* random numbers: the same seed and step for both, not the first of a run */
        const char *rng = L.random ? ", 0x5eedull, 3" : "";
        bool total = false; /* a loss: the CUDA kernel writes its blocks' parts to `partials` */
        for (int i = 0; i < L.nstores; i++) total |= cg.fp.cls[L.stores[i]] == CLASS_TOTAL;
        sb_printf(&body, "        ref_k%d(s%s%s);\n", k, hargs.data, rng);
        /* a product with a cuBLASLt epilogue (cuda_gemm.c) never stores the product itself:
         * its epilogue's values are compared, computed by cuBLASLt; then again with the bias
         * one float off 16-byte alignment, which takes the fallback (cublasSgemm and the
         * epilogue kernel), the product compared too */
        CudaLtPlan lt;
        const bool fused = gemm && cuda_gemm_lt_plan(&L, &lt);
        /* a weight gradient's product that sums a bias gradient (BGRADB): its extra output,
         * checked against the column sums of its operand (float, row after row, within the
         * tolerance: the C target adds rows into lanes), then again one float off alignment
         * (the fallback: the column kernel) */
        NodeId bg = IR_NONE;
        const bool bgrad = gemm && cuda_gemm_bgrad_source(&cg, k, &bg) >= 0;
        const NodeId bx = bgrad ? cuda_gemm_bgrad_summed(&cg, bg) : IR_NONE; /* float32, or a half copy */
        const int64_t bw = bgrad ? numel_at(g, &g->nodes[bg].shape, symvals) : 0;
        const int64_t bh = bgrad ? numel_at(g, &g->nodes[bx].shape, symvals) / (bw ? bw : 1) : 0;
        if (bgrad) {
            sb_printf(&body, "        float *bg%d = (float *)malloc(%lld * sizeof(float)), *dbg%d, *ubg%d;\n"
                             "        KILN_CUDA_CHECK(cudaMalloc(&dbg%d, %lld * sizeof(float)));\n"
                             "        KILN_CUDA_CHECK(cudaMalloc(&ubg%d, %lld * sizeof(float)));\n",
                      bg, (long long)bw + 1, bg, bg, bg, (long long)bw + 1, bg, (long long)bw + 1);
            sb_printf(&frees, "        free(bg%d);\n        KILN_CUDA_CHECK(cudaFree(dbg%d));\n        KILN_CUDA_CHECK(cudaFree(ubg%d));\n", bg,
                      bg, bg);
        }
        StrBuf bxv; /* an element of the summed value, widened */
        sb_init(&bxv);
        if (bgrad) {
            char elem[64];
            snprintf(elem, sizeof elem, "h%d[r * %lld + j]", bx, (long long)bw);
            cg_load(&bxv, (DType)g->nodes[bx].dtype, elem);
        }
        /* the fallback again, with the bias or residual off alignment (a product whose half
         * copy is all it stores has neither: its fallback is the plain product's path) */
        const bool misalign = fused && (lt.bias != IR_NONE || lt.residual != IR_NONE);
        for (int round = 0; round < 1 + (misalign || bgrad); round++) {
            char bgarg[48] = "";
            if (bgrad) snprintf(bgarg, sizeof bgarg, round ? ", ubg%d + 1" : ", dbg%d", bg);
            if (round && bgrad) {
                for (int i = 0; i < L.nstores; i++) { /* written again, from scratch */
                    const NodeId y = L.stores[i];
                    const int64_t n = numel_at(g, &g->nodes[y].shape, symvals);
                    sb_printf(&body, "        { float *junk = filled<float>(%lld, 9u); KILN_CUDA_CHECK(cudaMemcpy(d%d, junk, %lld * sizeof *junk, cudaMemcpyHostToDevice)); free(junk); }\n",
                              (long long)n, y, (long long)n);
                }
                sb_printf(&body, "        printf(\"kernel %d: unaligned bias gradient, cublasSgemm and the column sums\\n\");\n", k);
                sb_printf(&body, "        %s(s%s%s, 0, blas);\n", launcher, dargs.data, bgarg);
            } else if (round) {
                StrBuf shifted;
                sb_init(&shifted);
                /* the bias, or with none (DEFAULT) the residual C, one float off alignment */
                const NodeId off = lt.bias != IR_NONE ? lt.bias : lt.residual;
                char from[32], to[32];
                snprintf(from, sizeof from, ", d%d,", off);
                snprintf(to, sizeof to, ", u%d + 1,", off);
                const char *at = strstr(dargs.data, from);
                cr_assert(at, "the bias or residual %%%d is not among the arguments %s", off, dargs.data);
                sb_printf(&shifted, "%.*s%s%s", (int)(at - dargs.data), dargs.data, to, at + strlen(from));
                const int64_t nb = numel_at(g, &g->nodes[off].shape, symvals);
                sb_printf(&body, "        float *u%d;\n        KILN_CUDA_CHECK(cudaMalloc(&u%d, %lld * sizeof(float)));\n"
                                 "        KILN_CUDA_CHECK(cudaMemcpy(u%d + 1, h%d, %lld * sizeof(float), cudaMemcpyHostToDevice));\n",
                          off, off, (long long)nb + 1, off, off, (long long)nb);
                for (int i = 0; i < L.nstores; i++) { /* written again, from scratch */
                    const NodeId y = L.stores[i];
                    const char *t = cg_ctype((DType)g->nodes[y].dtype);
                    const int64_t n = numel_at(g, &g->nodes[y].shape, symvals);
                    sb_printf(&body, "        { %s *junk = ", t);
                    filler(&body, (DType)g->nodes[y].dtype);
                    sb_printf(&body, "(%lld, 9u); KILN_CUDA_CHECK(cudaMemcpy(d%d, junk, %lld * sizeof *junk, cudaMemcpyHostToDevice)); free(junk); }\n",
                              (long long)n, y, (long long)n);
                }
                sb_printf(&body, "        printf(\"kernel %d: unaligned %s, cublasSgemm and the epilogue kernel\\n\");\n", k,
                          lt.bias != IR_NONE ? "bias" : "residual");
                sb_printf(&body, "        %s(s%s%s%s, 0%s);\n", launcher, shifted.data, rng, total ? ", partials" : "", ", blas");
                sb_printf(&frees, "        KILN_CUDA_CHECK(cudaFree(u%d));\n", off);
                sb_free(&shifted);
            } else {
                if (fused) sb_printf(&body, "        printf(\"kernel %d: %s\\n\");\n", k, cuda_gemm_lt_name(lt.epilogue));
                if (bgrad) sb_printf(&body, "        printf(\"kernel %d: CUBLASLT_EPILOGUE_BGRADB\\n\");\n", k);
                sb_printf(&body, "        %s(s%s%s%s%s, 0%s);\n", launcher, dargs.data, bgarg, rng, total ? ", partials" : "",
                          gemm ? ", blas" : "");
            }
            sb_puts(&body, "        KILN_CUDA_CHECK(cudaDeviceSynchronize());\n");
            if (bgrad)
                sb_printf(&body,
                          "        KILN_CUDA_CHECK(cudaMemcpy(bg%d, %s, %lld * sizeof(float), cudaMemcpyDeviceToHost));\n"
                          "        {\n"
                          "        double worst = 0;\n"
                          "        for (int64_t j = 0; j < %lld; j++) {\n"
                          "            float want = 0;\n"
                          "            for (int64_t r = 0; r < %lld; r++) want += %s;\n"
                          "            const double e = fabs((double)bg%d[j] - want) / (1 + fabs((double)want));\n"
                          "            if (!(e <= worst)) worst = e;\n"
                          "        }\n"
                          "        printf(\"kernel %d, bias gradient %%%%%d: %lld elements, worst difference %%g\\n\", worst);\n"
                          "        bad |= !(worst <= 1e-4);\n"
                          "        }\n",
                          bg, bgarg + 2, (long long)bw, (long long)bw, (long long)bh, bxv.data, bg, k, bg, (long long)bw);
            for (int i = 0; i < L.nstores; i++) {
                NodeId y = L.stores[i];
                if (fused && !round && y == L.K->anchor) {
                    /* cuBLASLt took the product (its heuristic found an algorithm): the
                     * product's memory still holds what it was filled with */
                    const int64_t n = numel_at(g, &g->nodes[y].shape, symvals);
                    sb_printf(&body,
                              "        {\n"
                              "        float *untouched = filled<float>(%lld, 9u), *now = filled<float>(%lld, 1u);\n"
                              "        KILN_CUDA_CHECK(cudaMemcpy(now, d%d, %lld * sizeof *now, cudaMemcpyDeviceToHost));\n"
                              "        const bool took = !memcmp(now, untouched, %lld * sizeof *now);\n"
                              "        printf(\"kernel %d: cuBLASLt %%s\\n\", took ? \"took the product\" : \"did not take the product\");\n"
                              "        bad |= !took;\n"
                              "        free(untouched);\n"
                              "        free(now);\n"
                              "        }\n",
                              (long long)n, (long long)n, y, (long long)n, (long long)n, k);
                    continue;
                }
                int64_t n = numel_at(g, &g->nodes[y].shape, symvals);
                /* relative to 1 + |want|: sums are added in another order (a block's tree, not
                 * the C target's SIMD lanes), a difference of a few float roundings (tolerance);
                 * half-precision elements widened to float first */
                char gotv[48], wantv[48];
                StrBuf ga, wa;
                sb_init(&ga);
                sb_init(&wa);
                snprintf(gotv, sizeof gotv, "got%d[i]", y);
                snprintf(wantv, sizeof wantv, "want%d[i]", y);
                cg_load(&ga, (DType)g->nodes[y].dtype, gotv);
                cg_load(&wa, (DType)g->nodes[y].dtype, wantv);
                sb_printf(&body,
                          "        KILN_CUDA_CHECK(cudaMemcpy(got%d, d%d, %lld * sizeof *got%d, cudaMemcpyDeviceToHost));\n"
                          "        {\n"
                          "        double worst = 0;\n"
                          "        for (int64_t i = 0; i < %lld; i++) {\n"
                          "            const double a = (double)%s, b = (double)%s;\n"
                          "            /* equal infinities, or NaN in both (sqrt of a negative variance: the inputs are random) */\n"
                          "            const double e = a == b || (a != a && b != b) ? 0 : fabs(a - b) / (1 + fabs(b));\n"
                          "            if (!(e <= worst)) worst = e;\n"
                          "        }\n"
                          "        printf(\"kernel %d, %%%%%d: %lld elements, worst difference %%g\\n\", worst);\n"
                          "        bad |= !(worst <= %g);\n"
                          "        }\n",
                          y, y, (long long)n, y, (long long)n, ga.data, wa.data, k, y, (long long)n, tolerance(kernel_half(&L)));
                sb_free(&ga);
                sb_free(&wa);
            }
        }
        sb_free(&bxv);
        sb_printf(&body, "%s    }\n", frees.data);
        sb_free(&hargs);
        sb_free(&dargs);
        sb_free(&frees);
        free(launcher);
        nmaps++;
        cg_kernel_teardown(&L);
    }
    sb_free(&tested);
    sb_puts(&body, "    KILN_CUBLAS_CHECK(cublasDestroy(blas));\n    KILN_CUDA_CHECK(cudaFree(partials));\n    return bad;\n}\n");
    cr_assert_gt(nmaps, 0, "no kernel of the training graph that --target cuda writes");
    sb_printf(&harness, "\n%s", body.data);
    snprintf(path, sizeof path, "%s/ref.c", dir);
    write_file(path, ref.data);
    snprintf(path, sizeof path, "%s/harness.cu", dir);
    write_file(path, harness.data);

    /* the C reference with the C compiler, model.cu and the harness with g++ and the emulator
     * (and the runtime: the reference's half-precision products take its buffer) */
    snprintf(cmd, sizeof cmd, "'%s' -std=c11 -O2 -Wall -Wextra -Werror -Wno-unused-parameter -Wno-unused-variable -I'%s/runtime' -c '%s/ref.c' -o '%s/ref.o' 2>&1", KILN_CC,
             KILN_SOURCE_DIR, dir, dir);
    cr_assert_eq(run(cmd, "the C reference"), 0);
    snprintf(cmd, sizeof cmd,
             "'%s' %s -Wall -Wextra -Wshadow -Werror -DKILN_CUDA_EMU -I'%s/runtime/cuda' -I'%s/runtime' -x c++ '%s/harness.cu' -x none "
             "'%s/ref.o' '%s' '%s' '%s' '%s' -lprotobuf-c -lz -lpthread -lm -o '%s/harness' 2>&1",
             KILN_CXX, KILN_EMU_CXXFLAGS, KILN_SOURCE_DIR, KILN_SOURCE_DIR, dir, dir, KILN_RUNTIME_LIB, KILN_CUDA_EMU_MODULES_LIB, KILN_CUDA_EMU_LIB,
             KILN_OPENBLAS, dir);
    cr_assert_eq(run(cmd, "model.cu under the emulator"), 0);
    /* every thread order gives the same elements (no kernel here shares anything); the
     * sanitizer build runs the shuffled one only (support.h, SUPPORT_REPEAT_RUNS) */
    static const char *const orders[] = {"shuffle", "forward", "reverse"};
    for (int i = 0; i < (SUPPORT_REPEAT_RUNS ? 3 : 1); i++) {
        snprintf(cmd, sizeof cmd, "KILN_CUDA_EMU_ORDER=%s '%s/harness' 2>&1", orders[i], dir);
        cr_expect_eq(run(cmd, orders[i]), 0, "the CUDA kernels differ from the C target's (order %s)", orders[i]);
    }

    if (nvcc && *KILN_NVCC && SUPPORT_RUN_NVCC) { /* not again in the sanitizer build (support.h) */
        snprintf(cmd, sizeof cmd,
                 "'%s' -std=c++17 -O0 -arch=sm_90 -Xptxas -v -I'%s/runtime/cuda' -I'%s/runtime' -c '%s/model.cu' -o '%s/model.o' 2>&1", /* -O0: the host code's level only */
                 KILN_NVCC, KILN_SOURCE_DIR, KILN_SOURCE_DIR, dir, dir);
        StrBuf out;
        sb_init(&out);
        cr_expect_eq(support_run(cmd, &out), 0, "nvcc:\n%s", out.data ? out.data : "");
        SupportPtxas px = support_ptxas_summary(out.data);
        const int kernels = px.kernels, spilling = px.spilling, stack = px.stack;
        printf("nvcc sm_90: %d kernels, %d spilling, %d with a stack frame\n", kernels, spilling, stack);
        cr_expect_gt(kernels, 0, "%s", out.data);
        cr_expect_eq(spilling, 0, "%s", out.data);
        cr_expect_eq(stack, 0, "%s", out.data);
        sb_free(&out);
    }

    cuda_gemm_free_bgrad(&cg);
    sb_free(&ref);
    sb_free(&harness);
    sb_free(&body);
    sb_free(&err);
    sb_free(&cu);
    kiln_program_free(p);
    /* KILN_TEST_KEEP=1 keeps model.cu, the harness and the C reference to read */
    if (getenv("KILN_TEST_KEEP")) printf("kept %s\n", dir);
    else support_remove_dir(dir);
}

/* One elementwise kernel with a broadcast operand over the last axis, most unary ops. */
Test(cuda_codegen, map_kernels_agree_with_the_c_target, .timeout = 240)
{
    check_map_kernels("model ew\ndim B <= 64\n"
                      "forward(x: f32[B, 37], z: f32[37]) -> y {\n"
                      " y = tanh(x * z) + sigmoid(x) * 2 - relu(x - z) / (exp(z) + 1) + where(x > z, x, -z)\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Broadcasts along leading and middle axes: coordinates from the flat index by division. */
Test(cuda_codegen, broadcast_coordinates, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 9\n"
                      "forward(x: f32[B, 5, 6, 2], z: f32[5, 1, 2], w: f32[6, 1]) -> y {\n"
                      " y = where(x > 0, x * z, z - w) + maximum(x, w) - minimum(z, x)\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Double precision, casts, pow, abs, sqrt and log. */
Test(cuda_codegen, f64_casts_and_math, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 64\n"
                      "forward(x: f64[B, 7], z: f32[B, 7]) -> y {\n"
                      " y = f32(pow(exp(x), 0.5) + sqrt(abs(x) + 1)) * log(abs(z) + 1) + f32(x > 0)\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Row reductions over the last axis: softmax, log-softmax and layer norm with their
 * backward kernels (maxima with NaN flags, sums, several passes over a row). */
Test(cuda_codegen, row_reductions, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 64\nln = LayerNorm(300)\n"
                      "forward(x: f32[B, 300], z: f32[B, 7]) -> y {\n"
                      " y = sum(softmax(x) * x + ln(x), axis = 1, keepdim = true) * log_softmax(z)[:, 0:1]\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Matrix products through cuBLAS (a transposed weight read in place) with their epilogues
 * (bias, activation, the mask of relu's gradient): mlp's layers. */
/* fc1's tanh-GELU takes cuBLASLt's GELU_AUX_BIAS, fc2's erf-GELU stays in its kernel */
#define GELU_MODEL                                                                                  \
    "model t\ndim B <= 64\nfc1 = Linear(37, 72)\nfc2 = Linear(72, 8)\nfc3 = Linear(8, 5)\n"       \
    "forward(x: f32[B, 37]) -> y {\n y = fc3(gelu(fc2(gelu(fc1(x), \"tanh\"))))\n}\n" \
    "loss(y) = sum(y * y / 2 + y)\n"

Test(cuda_codegen, matrix_products_with_epilogues, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 64\nfc1 = Linear(37, 70)\nfc2 = Linear(70, 5)\n"
                      "forward(x: f32[B, 37]) -> y {\n"
                      " y = fc2(relu(fc1(x)))\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
    /* tanh-GELU through cuBLASLt (GELU_AUX_BIAS, its input the backward's), erf-GELU not */
    check_map_kernels(GELU_MODEL, true);
}

/* How many times `what` occurs in s. */
static int occurrences(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what)) n++;
    return n;
}

/* Which products take which cuBLASLt epilogue (cuda_gemm.c), counted in model.cu (the
 * training and evaluation steps): a bias alone, bias + relu when relu's mask is not stored,
 * bias + tanh-GELU with its input as aux when the backward reads it; never an erf GELU,
 * relu with its mask stored or a residual add; and which bias gradients the weight
 * gradient's product sums (BGRADB). */
Test(cuda_codegen, cublaslt_epilogues_where_they_fit)
{
    /* mixed precision: a product whose epilogue stores its result's half copy (what the next
     * products read) writes D in that type, and aux too; a bias gradient summed from a
     * gradient's half copy (the product's A) is BGRADB's with half operands. The eval graph
     * stays float32. */
    /* a residual add of the bias add (a transformer block's x + proj(...)), or of the product
     * alone (tied embedding's gradient: wte's sum of both uses), reads the residual as C:
     * gpt's 16 (train and eval) and one DEFAULT; in bf16 with attention unfused also the 4
     * products whose half copy is all they store (the attention's backward), DEFAULT with D
     * in bf16 (fused, the q/k/v products store a float32 value for the attention besides the
     * bf16 copy for its backward: 4 BIAS fewer); GELU's backward
     * in the epilogue of the product that computes its incoming gradient is DGELU (gpt's
     * 4 MLPs; the GELU model's first GELU: the second's backward is in a kernel with the
     * bias gradient) */
    static const struct {
        const char *model, *precision;
        int bias, relu_bias, gelu_bias, gelu_aux_bias, mask, bgradb, half_d, residual, plain, dgelu;
    } want[] = {{"mlp", "fp32", 2, 2, 0, 0, 2, 2, 0, 0, 0, 0},   {"gpt", "fp32", 24, 0, 4, 4, 0, 16, 0, 17, 1, 4},
                {NULL, "fp32", 0, 0, 1, 1, 0, 3, 0, 0, 0, 1},    {"gpt", "bf16", 20, 0, 4, 4, 0, 16, 8, 17, 1, 4},
                {"gpt", "bf16 --attention unfused", 24, 0, 4, 4, 0, 16, 16, 17, 5, 4},
                {"mlp", "fp16", 2, 2, 0, 0, 0, 3, 0, 0, 0, 0},   {NULL, "bf16", 0, 0, 1, 1, 0, 3, 2, 0, 0, 1}};
    for (int m = 0; m < (int)(sizeof want / sizeof want[0]); m++) {
        char dir[] = "/tmp/kiln-cudacg-XXXXXX";
        cr_assert(mkdtemp(dir));
        char args[512], path[300];
        if (want[m].model) {
            snprintf(args, sizeof args, "emit models/%s.kiln --target cuda --precision %s -o %s/out", want[m].model,
                     want[m].precision, dir);
        } else {
            snprintf(path, sizeof path, "%s/gelu.kiln", dir);
            write_file(path, GELU_MODEL);
            snprintf(args, sizeof args, "emit %s --target cuda --precision %s -o %s/out", path, want[m].precision, dir);
        }
        StrBuf out;
        sb_init(&out);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data ? out.data : "");
        sb_free(&out);
        snprintf(path, sizeof path, "%s/out/model.cu", dir);
        StrBuf err;
        sb_init(&err);
        size_t len;
        char *cu = util_read_file(path, &len, &err);
        cr_assert(cu, "%s", err.data);
        char name[64];
        snprintf(name, sizeof name, "%s %s", want[m].model ? want[m].model : "gelu.kiln", want[m].precision);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_BIAS,"), want[m].bias, "%s", name);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_RELU_BIAS,"), want[m].relu_bias, "%s", name);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_GELU_BIAS,"), want[m].gelu_bias, "%s", name);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,"), want[m].gelu_aux_bias, "%s", name);
        cr_expect_eq(occurrences(cu, "no cuBLASLt epilogue, as relu's mask"), want[m].mask, "%s", name);
        /* each bias gradient summed by its weight gradient's product, its own kernel not launched */
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_BGRADB,"), want[m].bgradb, "%s", name);
        cr_expect_eq(occurrences(cu, "cuBLASLt epilogue (BGRADB) sums it"), want[m].bgradb, "%s", name);
        cr_expect_eq(occurrences(cu, ", D in bf16") + occurrences(cu, ", D in fp16"), want[m].half_d, "%s", name);
        cr_expect_eq(occurrences(cu, "as C (beta 1)"), want[m].residual, "%s", name);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_DEFAULT,"), want[m].plain, "%s", name);
        cr_expect_eq(occurrences(cu, "kiln_lt_matmul(&lt, CUBLASLT_EPILOGUE_DGELU,"), want[m].dgelu, "%s", name);
        free(cu);
        sb_free(&err);
        support_remove_dir(dir);
    }
}

static void check_model_file(const char *name, bool nvcc)
{
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s", KILN_SOURCE_DIR, name);
    StrBuf err;
    sb_init(&err);
    size_t len;
    char *text = util_read_file(path, &len, &err);
    cr_assert(text, "%s", err.data);
    sb_free(&err);
    check_map_kernels(text, nvcc);
    free(text);
}

/* The models' own kernels that --target cuda writes: mlp's label check and argmax (the
 * accuracy metric), gpt's index check, gathers and scatter-adds (embeddings and their
 * gradients), iota, expand, permute, slice and concat copies, cnn's pad and im2col
 * (unfold, fold), besides their elementwise and row kernels. */
Test(cuda_codegen, mlp_kernels, .timeout = 240) { check_model_file("mlp.kiln", false); }
Test(cuda_codegen, gpt_kernels, .timeout = 400) { check_model_file("gpt.kiln", false); }
Test(cuda_codegen, cnn_kernels, .timeout = 400) { check_model_file("cnn.kiln", false); }

/* Mixed precision (passes/precision.c): kernels that read and write bf16 or fp16 arrays,
 * widened to float for the arithmetic (kiln_half.h on the device), against the C target's;
 * gpt's bf16 model.cu through nvcc as well (test_cuda_train's check compiles fp32 ones).
 * gpt's weights are rounded stochastically (round_stochastic; the activations' casts round
 * to nearest, as the weights' do by default). */
Test(cuda_codegen, gpt_bf16_kernels, .timeout = 400)
{
    precision.half = DT_BF16;
    precision.stochastic_weights = true;
    check_model_file("gpt.kiln", true);
}
Test(cuda_codegen, mlp_fp16_kernels, .timeout = 240)
{
    precision.half = DT_F16;
    check_model_file("mlp.kiln", false);
}
/* cuBLASLt writing half precision (GELU_AUX_BIAS with D and aux in bf16, then fp16; BGRADB
 * from a gradient's half copy) against the C target, and through nvcc */
Test(cuda_codegen, gelu_half_epilogues, .timeout = 240)
{
    precision.half = DT_BF16;
    check_map_kernels(GELU_MODEL, true);
    precision.half = DT_F16;
    check_map_kernels(GELU_MODEL, false);
}

/* Copies as single-node kernels: a permute, a strided slice, a concatenation; argmax over
 * a middle axis (inner > 1). */
Test(cuda_codegen, copies_and_argmax_over_a_middle_axis, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 9\n"
                      "forward(x: f32[B, 5, 6], z: f32[B, 7, 5]) -> y {\n"
                      " y = cat(transpose(x, dim0 = -2, dim1 = -1), z[:, 1:7:2, :], dim = 1) * 2\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n"
                      "metric m = mean(f32(argmax(y, axis = 1)))\n", true);
}

/* Reductions over middle and mixed axes: max pooling's 2x2 windows (one thread per short
 * row, in the C target's order), batch norm's statistics over the batch and the pixels and
 * their gradients (one block per row, elements found from their coordinates), a
 * convolution's bias and weight gradients (the products summed over the batch). */
Test(cuda_codegen, reductions_over_middle_axes_and_summed_products, .timeout = 300)
{
    check_map_kernels("model t\ndim B <= 9\nconv = Conv2d(3, 4, 3, padding = 1)\nbn = BatchNorm2d(4)\n"
                      "forward(x: f32[B, 3, 6, 10], z: f32[B, 4, 5, 20]) -> y {\n"
                      " y = max_pool2d(relu(bn(conv(x))), 2) + mean(z, axis = [0, 2], keepdim = true)[:, :, :, 0:5]\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Dropout in every kind of kernel: elementwise, a row reduction (softmax, then dropout),
 * and a column reduction (the bias gradient of a layer whose input is dropped): every
 * kernel draws the C target's numbers by element index, for the same seed and step. */
Test(cuda_codegen, random_numbers_in_every_kind_of_kernel, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 40\nfc = Linear(37, 20)\n"
                      "forward(x: f32[B, 37]) -> y {\n"
                      " y = dropout(softmax(fc(dropout(x, 0.25))), 0.5) + dropout(x[:, 0:20], 0.1)\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* Batched products as cublasSgemmStridedBatched calls: contiguous batch axes as one call
 * (forward and backward), and a product read from a permuted operand whose batch axes do
 * not nest (a loop over the first axis around a call over the second). */
Test(cuda_codegen, batched_products_as_strided_batched_calls, .timeout = 240)
{
    check_map_kernels("model t\ndim B <= 9\n"
                      "forward(x: f32[B, 3, 4, 5], z: f32[B, 3, 5, 6], u: f32[B, 5, 3, 6]) -> y {\n"
                      " y = matmul(x, z) + matmul(x, permute(u, 0, 2, 1, 3))\n"
                      "}\nloss(y) = sum(y * y / 2 + y)\n", true);
}

/* The kernels of model.cu (a file kiln emit wrote) with what their launch comment says of
 * vectorisation, one line each: "NAME: vectorised" or "NAME: not vectorised: WHY". Counts
 * the two kinds. */
static void vectorisation_table(const char *cu, StrBuf *table, int *yes, int *no)
{
    *yes = *no = 0;
    for (const char *p = strstr(cu, "\n * Launch: "); p; p = strstr(p + 1, "\n * Launch: ")) {
        const char *head = strstr(p, "__global__ void __launch_bounds__(256) ");
        const char *next = strstr(p + 1, "\n * Launch: ");
        if (!head || (next && head > next)) continue;
        head += strlen("__global__ void __launch_bounds__(256) ");
        const int name = (int)strcspn(head, "(");
        const char *v = strstr(p, " * Vectorised: "), *nv = strstr(p, " * Not vectorised: ");
        if (v && v < head) {
            sb_printf(table, "  %.*s: vectorised\n", name, head);
            ++*yes;
        } else if (nv && nv < head) {
            nv += strlen(" * Not vectorised: ");
            sb_printf(table, "  %.*s: not vectorised: %.*s\n", name, head, (int)strcspn(nv, "*\n") - 1, nv);
            ++*no;
        }
    }
}

/* Elementwise kernels load and store float32 arrays four elements at a time (float4) where
 * every such pointer is 16-byte aligned, with a scalar loop for the rest; the launch
 * comment of each says whether it is vectorised, and why not. mlp's and gpt's kernels
 * are listed; a kernel with a broadcast operand and a u8 operand is vectorised (those read
 * one element at a time), a cast of labels alone is not, and under the emulator the
 * vectorised kernel gives the scalar expression's bits for aligned and misaligned pointers
 * and element counts that are not multiples of 4. */
Test(cuda_codegen, vectorised_loads_where_aligned, .timeout = 240)
{
    char dir[] = "/tmp/kiln-cudavec-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024], path[512], cmd[4096];
    StrBuf out;
    sb_init(&out);
    static const char *const models[] = {"mlp", "gpt"};
    for (int m = 0; m < 2; m++) {
        snprintf(args, sizeof args, "emit %s/models/%s.kiln --target cuda -o %s/%s", KILN_SOURCE_DIR, models[m], dir, models[m]);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
        snprintf(path, sizeof path, "%s/%s/model.cu", dir, models[m]);
        size_t len;
        char *cu = util_read_file(path, &len, &out);
        cr_assert(cu);
        StrBuf table;
        sb_init(&table);
        int yes, no;
        vectorisation_table(cu, &table, &yes, &no);
        printf("%s: %d elementwise kernels vectorised, %d not:\n%s", models[m], yes, no, table.data ? table.data : "");
        cr_expect_gt(yes, 0, "%s", table.data);
        if (!m) {
            /* the hidden layers' epilogue (fc1's and fc2's: one kernel): the product and the
             * activation as float4, the bias by its coordinate, the relu mask (u8) one element
             * at a time */
            cr_expect(strstr(table.data, "  train_Linear_fwd_epilogue: vectorised\n"), "%s", table.data);
            cr_expect(strstr(cu, "reinterpret_cast<float4 *>(y17)[q] = r17;"));
            cr_expect(strstr(cu, "y89[i] = t89; /* not float32: one element */"));
            /* the labels' cast (u8 to i64): no float32 array */
            cr_expect(strstr(table.data, "  train_cast_fwd_2: not vectorised: no float32 array is read or written at the element itself"),
                      "%s", table.data);
        }
        free(cu);
        sb_free(&table);
    }

    /* y = (x * 2 + 1) * z + m (z broadcast along rows of 8, m u8) and v = w * 3 - 1 (rows
     * of 7): the predict step's two elementwise kernels, against the same expressions on
     * the host */
    snprintf(path, sizeof path, "%s/t.kiln", dir);
    write_file(path, "model t\ndim B <= 64\nforward(x: f32[B, 8], z: f32[8], m: u8[B, 8], w: f32[B, 7]) -> y, v {\n"
                     "    y = (x * 2 + 1) * z + f32(m)\n    v = w * 3 - 1\n}\nloss(y, v) = sum(y * y) + sum(v)\n");
    snprintf(args, sizeof args, "emit %s --infer --target cuda -o %s/t", path, dir);
    cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
    snprintf(path, sizeof path, "%s/t/model.cu", dir);
    size_t len;
    char *cu = util_read_file(path, &len, &out);
    cr_assert(cu);
    cr_expect(strstr(cu, "const bool aligned = ((uintptr_t)p0 | (uintptr_t)y12) % 16 == 0;"), "%s", cu);
    cr_expect(strstr(cu, "const int64_t c1 = l1 + k;"), "the lanes' coordinates from the first one's");
    cr_expect(strstr(cu, "const float t10 = t7 * p1[c1 * (1)];"), "the broadcast z, one element at a time");
    cr_expect(strstr(cu, "const float t11 = (float)p2[i];"), "the u8 m, one element at a time");
    cr_expect(strstr(cu, "const bool aligned = ((uintptr_t)p3 | (uintptr_t)y16) % 16 == 0;"), "%s", cu);
    free(cu);
    snprintf(path, sizeof path, "%s/t/harness.cu", dir);
    write_file(path,
               "#include \"model.cu\"\n#include <stdio.h>\n\n"
               "/* a device copy of n values at `shift` elements past an aligned allocation */\n"
               "template <typename T> static T *on_device(const T *h, int64_t n, int shift)\n{\n"
               "    T *p;\n"
               "    KILN_CUDA_CHECK(cudaMalloc(&p, sizeof(T) * (size_t)(n + 4)));\n"
               "    KILN_CUDA_CHECK(cudaMemcpy(p + shift, h, sizeof(T) * (size_t)n, cudaMemcpyHostToDevice));\n"
               "    return p + shift;\n}\n\n"
               "static int differ(const char *what, const float *want, const float *dev, int64_t n, int64_t B, int shift)\n{\n"
               "    float *got = (float *)malloc(sizeof(float) * (size_t)n);\n"
               "    KILN_CUDA_CHECK(cudaMemcpy(got, dev, sizeof(float) * (size_t)n, cudaMemcpyDeviceToHost));\n"
               "    int bad = 0;\n"
               "    for (int64_t i = 0; i < n; i++) bad += memcmp(&want[i], &got[i], sizeof(float)) != 0;\n"
               "    printf(\"%s, B %lld (n %% 4 = %lld), inputs %s: %d of %lld elements differ\\n\", what, (long long)B, (long long)(n % 4),\n"
               "           shift ? \"misaligned\" : \"aligned\", bad, (long long)n);\n"
               "    free(got);\n    return bad;\n}\n\n"
               "/* B rows; the inputs at `shift` elements past an aligned allocation */\n"
               "static int check(int64_t B, int shift)\n{\n"
               "    const int64_t s[] = {B};\n"
               "    float *x = (float *)malloc(sizeof(float) * (size_t)(8 * B)), z[8], *w = (float *)malloc(sizeof(float) * (size_t)(7 * B));\n"
               "    float *y = (float *)malloc(sizeof(float) * (size_t)(8 * B)), *v = (float *)malloc(sizeof(float) * (size_t)(7 * B));\n"
               "    uint8_t *m = (uint8_t *)malloc((size_t)(8 * B));\n"
               "    for (int j = 0; j < 8; j++) z[j] = 0.3f * (float)j - 1.1f;\n"
               "    for (int64_t i = 0; i < 8 * B; i++) {\n"
               "        x[i] = (float)(i % 13) / 7 - 0.9f, m[i] = (uint8_t)(i * 37 % 251);\n"
               "        y[i] = (x[i] * 2.0f + 1.0f) * z[i % 8] + (float)m[i];\n    }\n"
               "    for (int64_t i = 0; i < 7 * B; i++) w[i] = (float)(i % 11) / 3 - 1.3f, v[i] = w[i] * 3.0f - 1.0f;\n"
               "    float *dx = on_device(x, 8 * B, shift), *dz = on_device(z, 8, 0), *dw = on_device(w, 7 * B, shift);\n"
               "    uint8_t *dm = on_device(m, 8 * B, shift);\n"
               "    float *dy = on_device(y, 8 * B, 0), *dv = on_device(v, 7 * B, 0);\n"
               "    KILN_CUDA_CHECK(cudaMemset(dy, 0xff, sizeof(float) * (size_t)(8 * B)));\n"
               "    KILN_CUDA_CHECK(cudaMemset(dv, 0xff, sizeof(float) * (size_t)(7 * B)));\n"
               "    predict_y_fwd_launch(s, dm, dx, dz, dy, 0);\n"
               "    predict_v_fwd_launch(s, dw, dv, 0);\n"
               "    const int bad = differ(\"y\", y, dy, 8 * B, B, shift) + differ(\"v\", v, dv, 7 * B, B, shift);\n"
               "    cudaFree(dx - shift), cudaFree(dz), cudaFree(dw - shift), cudaFree(dm - shift), cudaFree(dy), cudaFree(dv);\n"
               "    free(x), free(w), free(y), free(v), free(m);\n"
               "    return bad;\n}\n\n"
               "int main(void) { return check(5, 0) || check(4, 0) || check(5, 1) || check(1, 0) || check(64, 0) || check(64, 3); }\n");
    /* the steps of model.cu need the device runtime (device.cu), built as kiln build does */
    snprintf(cmd, sizeof cmd,
             "'%s' %s -DKILN_CUDA_EMU -I'%s/runtime/cuda' -I'%s/runtime' -x c++ -c '%s/runtime/cuda/device.cu' -o '%s/t/device.o' 2>&1 && "
             "'%s' %s -ffp-contract=off -Wall -Wextra -Wshadow -Werror -Wno-unused-variable -DKILN_CUDA_EMU -I'%s/runtime/cuda' "
             "-I'%s/runtime' -x c++ '%s/t/harness.cu' -x none '%s/t/device.o' '%s' '%s' '%s' '%s' -fopenmp -lprotobuf-c -lz -lpthread -lm -o '%s/t/harness' 2>&1 && "
             "'%s/t/harness'",
             KILN_CXX, KILN_EMU_CXXFLAGS, KILN_SOURCE_DIR, KILN_SOURCE_DIR, KILN_SOURCE_DIR, dir, KILN_CXX, KILN_EMU_CXXFLAGS,
             KILN_SOURCE_DIR, KILN_SOURCE_DIR, dir, dir, KILN_RT_LIB, KILN_CUDA_EMU_MODULES_LIB, KILN_CUDA_EMU_LIB, KILN_OPENBLAS, dir, dir);
    cr_expect_eq(run(cmd, "the vectorised kernel under the emulator"), 0);
    sb_free(&out);
    support_remove_dir(dir);
}

/* Each kernel of gpt's model.c and model.cu declares only the names it reads: no
 * `(void)x;` line anywhere. model.cu's __global__ kernels are all different code (after
 * the renaming of values that the C target's sharing uses): a kernel with another's code
 * is launched as that one, so there are fewer kernels than launch functions. */
Test(cuda_codegen, kernels_declare_what_they_read_and_identical_ones_are_shared)
{
    char dir[] = "/tmp/kiln-cudashare-XXXXXX";
    cr_assert(mkdtemp(dir));
    static const char *const targets[] = {"c", "cuda"};
    static const char *const precisions[] = {"", "--precision bf16"};
    for (int t = 0; t < 2; t++)
        for (int q = 0; q < 2; q++) {
            char args[1024], path[512];
            StrBuf out;
            sb_init(&out);
            snprintf(args, sizeof args, "emit %s/models/gpt.kiln --target %s %s -o %s/%s%d", KILN_SOURCE_DIR, targets[t], precisions[q], dir,
                     targets[t], q);
            cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
            snprintf(path, sizeof path, "%s/%s%d/model.%s", dir, targets[t], q, t ? "cu" : "c");
            size_t len;
            char *text = util_read_file(path, &len, &out);
            cr_assert(text, "%s", out.data);
            const char *v = strstr(text, "(void)");
            cr_expect(!v, "%s: %.200s", path, v ? v : "");
            if (t) {
                StrMap seen = {0};
                char **codes = NULL;
                int n = 0, cap = 0, launches = 0;
                static const char head[] = "\n__global__ void __launch_bounds__(256) ";
                for (const char *p = strstr(text, head); p; p = strstr(p + 1, head)) {
                    const char *name = p + strlen(head), *paren = strchr(name, '('), *end = strstr(name, "\n}\n");
                    cr_assert(paren && end);
                    StrBuf body, code;
                    sb_init(&body);
                    sb_init(&code);
                    sb_putn(&body, paren, (size_t)(end - paren));
                    cg_canonical_code(body.data, &code);
                    sb_free(&body);
                    int32_t other = strmap_get(&seen, code.data, -1);
                    cr_expect(other < 0, "%s: kernel %.*s has the same code as an earlier one", path, (int)(paren - name), name);
                    GROW(codes, cap, n + 1);
                    codes[n] = code.data;
                    strmap_put(&seen, codes[n], n);
                    n++;
                }
                for (const char *p = strstr(text, "_launch(const int64_t *"); p; p = strstr(p + 1, "_launch(const int64_t *")) launches++;
                printf("gpt%s: %d __global__ kernels for %d launch functions\n", q ? " bf16" : "", n, launches);
                cr_expect_lt(n, launches, "%s: no kernel is shared", path);
                for (int i = 0; i < n; i++) free(codes[i]);
                free(codes);
                strmap_free(&seen);
            }
            free(text);
            sb_free(&out);
        }
    support_remove_dir(dir);
}
