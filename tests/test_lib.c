/* test_lib.c — embeddable libraries (kiln build --lib, docs/library.md) against the
 * inference program of the same model, whose predict step they share:
 *   - mlp and cnn trained a few steps: the library's logits (tests/lib/driver.c, static
 *     archive) are the inference program's --output logits bit for bit at batch 64, 1
 *     and the bound, one library serving every batch; embedded weights give the same;
 *   - two instances with different weights (a checkpoint, synthetic weights) give each
 *     its own logits, also when run at the same time from two threads;
 *   - the example program of docs/library.md, taken from the file, compiled against the
 *     static and the shared library, prints the class the inference program's --top-k
 *     lists first;
 *   - bad weights buffers (cut at every length of the header and some of the data,
 *     tensors missing, mis-shaped or extra, a corrupted byte under a checksum) and misuse
 *     (NULL, misaligned or short memory, a run before bind, bad batches) return a status
 *     and a message, never a crash (the ASan build runs this too);
 *   - the archive exports only the API, has no writable data (only .data.rel.ro, read-
 *     only after relocation), and calls no malloc, free, fopen or getenv;
 *   - gpt (tokens to logits) at batch 4 and 1 likewise; a token outside the vocabulary is
 *     the library's index error (MODEL_EINDEX), naming the model line;
 *   - a model with buffers (tests/lib/bn.kiln: batch norm's running statistics) likewise;
 *   - --lib with --target cuda, or with --infer, is a usage error. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_rt.h"
#include "support.h"

#define IMAGES "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"

/* What a caller links with an archive kiln built in process: LLVM's libomp, the OpenMP
 * runtime Clang's code calls (docs/library.md); gcc's -fopenmp adds libgomp after it,
 * which then serves nothing. An archive built with --cc gcc needs none. */
#define LIBOMP_IN_PROCESS "-L" KILN_LLVM_LIB_DIR " -Wl,-rpath," KILN_LLVM_LIB_DIR " -lomp"
#define LIBOMP (KILN_IN_PROCESS_DEFAULT ? LIBOMP_IN_PROCESS : "")

static char dir[64];

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/kiln-lib-XXXXXX");
    cr_assert(mkdtemp(dir));
}

static void teardown(void) { support_remove_dir(dir); }

TestSuite(lib, .init = setup, .fini = teardown, .timeout = 300);

static int run(const char *cmd, StrBuf *out) { return support_run_in(dir, cmd, out); }

/* Runs cmd in dir; fails the test unless it exits 0. Returns its output (static). */
static const char *ok(const char *cmd)
{
    static StrBuf out;
    sb_free(&out);
    sb_init(&out);
    int rc = run(cmd, &out);
    cr_assert_eq(rc, 0, "%s: exit status %d:\n%s", cmd, rc, out.data ? out.data : "");
    return out.data ? out.data : "";
}

/* kiln build MODEL extra -o dir/NAME */
static void build(const char *model, const char *extra, const char *name)
{
    StrBuf args, out;
    sb_init(&args);
    sb_init(&out);
    sb_printf(&args, "build %s %s -o %s/%s", support_path(model), extra, dir, name);
    int rc = support_run_kiln(args.data, &out);
    cr_assert_eq(rc, 0, "kiln %s:\n%s", args.data, out.data ? out.data : "");
    sb_free(&args);
    sb_free(&out);
}

/* Compiles tests/lib/driver.c against the library in dir/LIBDIR (static archive) into
 * dir/OUT, for a model of one input and one output; omp: what the archive needs linked
 * for OpenMP (LIBOMP). */
static void compile_driver_omp(const char *name, const char *libdir, const char *in_t, const char *in, const char *out_name, const char *out, const char *omp)
{
    char upper[32], in_up[32], out_up[32], cmd[2048];
    for (int i = 0; i < 32; i++) {
        upper[i] = (char)(i < (int)strlen(name) + 1 ? (name[i] >= 'a' && name[i] <= 'z' ? name[i] - 32 : name[i]) : 0);
        in_up[i] = (char)(i < (int)strlen(in) + 1 ? (in[i] >= 'a' && in[i] <= 'z' ? in[i] - 32 : in[i]) : 0);
        out_up[i] = (char)(i < (int)strlen(out_name) + 1 ? (out_name[i] >= 'a' && out_name[i] <= 'z' ? out_name[i] - 32 : out_name[i]) : 0);
    }
    snprintf(cmd, sizeof cmd,
             "%s %s -std=c11 -Wall -Wextra -Werror -I %s -DMODEL=%s -DUPPER=%s -DIN_T=%s -DOUT_T=float -DIN_ELEMS=%s_%s_SAMPLE_ELEMS "
             "-DOUT_ELEMS=%s_%s_SAMPLE_ELEMS %s %s/lib%s.a %s %s -lm -lpthread -o %s",
             KILN_CC, KILN_GENERATED_CFLAGS, libdir, name, upper, in_t, upper, in_up, upper, out_up, support_path("tests/lib/driver.c"), libdir,
             name, KILN_OPENBLAS, omp, out);
    ok(cmd);
}

static void compile_driver(const char *name, const char *libdir, const char *in_t, const char *in, const char *out_name, const char *out)
{
    compile_driver_omp(name, libdir, in_t, in, out_name, out, LIBOMP);
}

/* The logits of an inference program's --output file (after the .npy header) and of the
 * driver's raw output are the same bits. */
static void expect_same_logits(const char *npy, const char *raw)
{
    char p[256];
    size_t na = 0, nb = 0;
    snprintf(p, sizeof p, "%s/%s", dir, npy);
    FILE *f = fopen(p, "rb");
    cr_assert(f, "%s", p);
    static unsigned char a[1 << 22], b[1 << 22];
    na = fread(a, 1, sizeof a, f);
    fclose(f);
    snprintf(p, sizeof p, "%s/%s", dir, raw);
    f = fopen(p, "rb");
    cr_assert(f, "%s", p);
    nb = fread(b, 1, sizeof b, f);
    fclose(f);
    cr_assert(na > 10 && nb < sizeof b);
    size_t header = 10 + (size_t)(a[8] | a[9] << 8);
    cr_assert_eq(na - header, nb, "%s has %zu bytes of logits, %s %zu", npy, na - header, raw, nb);
    size_t differ = 0;
    for (size_t i = 0; i < nb; i += 4) differ += memcmp(a + header + i, b + i, 4) != 0;
    cr_expect_eq(differ, 0, "%s and %s: %zu of %zu logits differ", npy, raw, differ, nb / 4);
}

static bool same_file(const char *x, const char *y)
{
    char cmd[256];
    StrBuf out;
    sb_init(&out);
    snprintf(cmd, sizeof cmd, "cmp -s %s %s", x, y);
    int rc = run(cmd, &out);
    sb_free(&out);
    return rc == 0;
}

/* The OpenBLAS core the inference program runs with (it may pick a faster one than a
 * plain process's): the library's runs are given the same, for the same bits. */
static void blas_core(char *core, size_t cap)
{
    const char *out = ok("{ KILN_VERBOSE=1 ./infer --help >/dev/null; } 2>&1");
    const char *at = strstr(out, "BLAS core ");
    cr_assert(at, "%s", out);
    at += strlen("BLAS core ");
    snprintf(core, cap, "%.*s", (int)strcspn(at, ", \n"), at);
}

/* dir/STEM.npy: a .npy header (descr, shape "(4, 128)") followed by dir/STEM.raw. */
static void write_npy_of_raw(const char *stem, const char *descr, const char *shape)
{
    char cmd[512];
    char header[128];
    int len = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }", descr, shape);
    while ((len + 11) % 64) header[len++] = ' ';
    header[len++] = '\n';
    char path[256];
    snprintf(path, sizeof path, "%s/%s.npy", dir, stem);
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(len & 0xff, f);
    fputc(len >> 8, f);
    fwrite(header, 1, (size_t)len, f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "cat %s.raw >> %s.npy", stem, stem);
    ok(cmd);
}

/* The first n images of the test set as dir/images.raw (u8, 784 each) and as a .npy
 * u8[n, 28, 28] for the inference program. */
static void write_images(int n)
{
    char cmd[512], shape[64];
    snprintf(cmd, sizeof cmd, "gzip -dc " IMAGES " | tail -c +17 | head -c %d > images.raw", n * 784);
    ok(cmd);
    snprintf(shape, sizeof shape, "(%d, 28, 28)", n);
    write_npy_of_raw("images", "|u1", shape);
}

/* Synthetic mlp weights, all tensors (or one dropped, one transposed, one extra); with
 * Kiln's checksums in the metadata when `checked`. */
static void write_weights_checked(const char *rel, const char *drop, const char *reshape, const char *extra, bool checked)
{
    static const struct {
        const char *name;
        int rank;
        int64_t dims[2];
    } P[] = {{"fc1.weight", 2, {256, 784}}, {"fc1.bias", 1, {256}}, {"fc2.weight", 2, {256, 256}},
             {"fc2.bias", 1, {256}},        {"fc3.weight", 2, {10, 256}}, {"fc3.bias", 1, {10}}};
    krt_st_tensor t[8];
    int n = 0;
    static float data[256 * 784];
    for (int i = 0; i < 256 * 784; i++) data[i] = (float)((i % 13) - 6) / 100;
    for (int i = 0; i < 6; i++) {
        if (drop && !strcmp(drop, P[i].name)) continue;
        t[n] = (krt_st_tensor){P[i].name, KRT_F32, P[i].rank, {P[i].dims[0], P[i].dims[1]}, data};
        if (reshape && !strcmp(reshape, P[i].name)) {
            t[n].dims[0] = P[i].dims[1];
            t[n].dims[1] = P[i].dims[0];
        }
        n++;
    }
    if (extra) t[n++] = (krt_st_tensor){extra, KRT_F32, 1, {4}, data};
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, rel);
    krt_error err;
    krt_status st = checked ? krt_safetensors_write_checked(path, t, n, NULL, 0, &err) : krt_safetensors_write(path, t, n, NULL, 0, &err);
    cr_assert_eq(st, KRT_OK, "%s", err.msg);
}

static void write_mlp_weights(const char *rel, const char *drop, const char *reshape, const char *extra)
{
    write_weights_checked(rel, drop, reshape, extra, false);
}

/* Trains NAME a few steps, builds its inference program and library, and checks the
 * library's logits against the program's on n images at batch 64, 1 and the bound. */
static void library_matches_infer(const char *name, int steps, int n, char *core, size_t cap)
{
    char model[64], cmd[1024];
    snprintf(model, sizeof model, "models/%s.kiln", name);
    build(model, "", "train");
    build(model, "--infer", "infer");
    build(model, "--lib", "lib");
    snprintf(cmd, sizeof cmd, "./train --steps %d --batch 32 --checkpoint-dir ck --eval-batches 1 && cp ck/$(cat ck/latest)/model.safetensors w.safetensors",
             steps);
    ok(cmd);
    write_images(n);
    compile_driver(name, "lib", "uint8_t", "image", "logits", "driver");
    blas_core(core, cap);
    static const int batches[] = {64, 1, 0};
    for (int i = 0; i < 3; i++) {
        int b = batches[i];
        char npy[32], raw[32];
        snprintf(npy, sizeof npy, "p%d.npy", b);
        snprintf(raw, sizeof raw, "l%d.raw", b);
        /* the same threads, BLAS core and floating-point mode (no FTZ) */
        snprintf(cmd, sizeof cmd, "KILN_FTZ=0 ./infer --weights w.safetensors --threads 2 %s%.0d --data image=images.npy --quiet --output %s", b ? "--batch " : "",
                 b, npy);
        ok(cmd);
        /* 0: the bound, the header's BATCH_MAX */
        snprintf(cmd, sizeof cmd,
                 "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver run w.safetensors images.raw %d $(awk '/^#define [A-Z0-9_]*_BATCH_MAX / {print $3}' lib/%s.h) 2 %s",
                 core, n, name, raw);
        if (b) snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver run w.safetensors images.raw %d %d 2 %s", core, n, b, raw);
        ok(cmd);
        expect_same_logits(npy, raw);
    }
}

Test(lib, mlp_matches_infer_two_instances_and_example)
{
    char core[64], cmd[1024];
    library_matches_infer("mlp", 20, 2000, core, sizeof core);

    /* two instances, one with the checkpoint, one with synthetic weights, each its own
     * logits, also at the same time from two threads */
    write_mlp_weights("w2.safetensors", NULL, NULL, NULL);
    ok("KILN_FTZ=0 ./infer --weights w2.safetensors --threads 2 --batch 64 --data image=images.npy --quiet --output q64.npy");
    snprintf(cmd, sizeof cmd,
             "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver run w2.safetensors images.raw 2000 64 2 m64.raw && "
             "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver two w.safetensors w2.safetensors images.raw 2000 64 2 t1.raw t2.raw",
             core, core);
    ok(cmd);
    expect_same_logits("q64.npy", "m64.raw");
    /* each of the two threads runs its instance on 2 OpenMP threads, as the runs alone */
    cr_expect(same_file("l64.raw", "t1.raw"), "instance 1 run beside instance 2 differs from it run alone");
    cr_expect(same_file("m64.raw", "t2.raw"), "instance 2 run beside instance 1 differs from it run alone");
    cr_expect(!same_file("t1.raw", "t2.raw"), "two instances with different weights gave the same logits");

    /* embedded weights: the same bits */
    snprintf(cmd, sizeof cmd, "--lib --embed-weights %s/w.safetensors", dir);
    build("models/mlp.kiln", cmd, "emb");
    compile_driver("mlp", "emb", "uint8_t", "image", "logits", "driver_emb");
    snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver_emb run embedded images.raw 2000 64 2 e64.raw", core);
    ok(cmd);
    cr_expect(same_file("l64.raw", "e64.raw"), "embedded weights give other logits");
    cr_expect(strstr(ok("cat emb/mlp.h"), "#define MLP_HAS_EMBEDDED_WEIGHTS 1"));
    cr_expect(strstr(ok("cat lib/mlp.h"), "#define MLP_HAS_EMBEDDED_WEIGHTS 0"));

    /* docs/library.md's example, as it is in the file, static and shared: the class the
     * inference program lists first for image 0 */
    snprintf(cmd, sizeof cmd, "awk '/^```c$/{f=1;next} /^```$/{if(f)exit} f' %s > classify.c && head -c 784 images.raw > image.u8",
             support_path("docs/library.md"));
    ok(cmd);
    snprintf(cmd, sizeof cmd, "%s %s -std=c11 -Wall -Wextra -Werror classify.c -I lib lib/libmlp.a %s %s -lm -o classify_static", KILN_CC,
             KILN_GENERATED_CFLAGS, KILN_OPENBLAS, LIBOMP);
    ok(cmd);
    snprintf(cmd, sizeof cmd, "%s %s -std=c11 -Wall -Wextra -Werror classify.c -I lib -L lib -lmlp -o classify_shared", KILN_CC,
             KILN_GENERATED_CFLAGS);
    ok(cmd);
    const char *top = ok("./infer --weights w.safetensors --data image=images.npy --top-k 1 | head -1");
    int want = -1;
    cr_assert_eq(sscanf(top, "0: %d", &want), 1, "%s", top);
    char expected[32];
    snprintf(expected, sizeof expected, "class %d\n", want);
    cr_expect_str_eq(ok("./classify_static w.safetensors image.u8"), expected);
    cr_expect_str_eq(ok("LD_LIBRARY_PATH=lib ./classify_shared w.safetensors image.u8"), expected);
    cr_expect(strstr(ok("{ ./classify_static missing.safetensors image.u8 || true; }"), "mlp: safetensors buffer: 0 bytes: not a safetensors file"));
}

Test(lib, cnn_matches_infer) { char core[64]; library_matches_infer("cnn", 5, 500, core, sizeof core); }

/* With no compiler, linker, objcopy or ar on PATH, kiln builds the library in process
 * (Clang, lld, LLVM's objcopy and archive writer): the same header, the same API exported
 * from the archive and the shared library, and the logits of the library the external
 * compiler builds (--cc), bit for bit (both compile under GCC's ISO C rounding,
 * -ffp-contract=off); the shared library names libomp (the mlp test runs it). */
Test(lib, in_process_matches_external_compiler)
{
    if (!KILN_IN_PROCESS_DEFAULT) cr_skip_test("kiln was built without Clang's libraries");
    char cmd[1024];
    StrBuf args, out;
    sb_init(&args);
    sb_init(&out);
    sb_printf(&args, "env PATH=/nonexistent %s build %s --lib -o %s/ip", KILN_BINARY, support_path("models/mlp.kiln"), dir);
    int rc = support_run(args.data, &out);
    cr_assert_eq(rc, 0, "%s:\n%s", args.data, out.data ? out.data : "");
    sb_free(&args);
    sb_free(&out);
    snprintf(cmd, sizeof cmd, "--lib --cc %s", KILN_CC);
    build("models/mlp.kiln", cmd, "ex");
    cr_expect(same_file("ip/mlp.h", "ex/mlp.h"), "the headers differ");
    cr_expect_str_eq(ok("nm -g --defined-only ip/libmlp.a | awk 'NF == 3 {print $3}' | sort | tr '\\n' ' '"), "mlp_bind mlp_init mlp_run mlp_set_threads mlp_workspace_bytes ");
    cr_expect_str_eq(ok("ar t ip/libmlp.a"), "lib_model.o\n");
    cr_expect_str_eq(ok("nm -D --defined-only ip/libmlp.so | awk '$2 == \"T\" {print $3}' | sort | tr '\\n' ' '"),
                     "mlp_bind mlp_init mlp_run mlp_set_threads mlp_workspace_bytes ");
    cr_expect(strstr(ok("readelf -d ip/libmlp.so"), "[libomp.so.5]"));
    cr_expect(strstr(ok("readelf -d ip/libmlp.so"), "Library soname: [libmlp.so]"));
    write_mlp_weights("w.safetensors", NULL, NULL, NULL);
    write_images(300);
    compile_driver_omp("mlp", "ip", "uint8_t", "image", "logits", "driver_ip", LIBOMP_IN_PROCESS);
    compile_driver_omp("mlp", "ex", "uint8_t", "image", "logits", "driver_ex", "");
    ok("OPENBLAS_NUM_THREADS=1 ./driver_ip run w.safetensors images.raw 300 64 2 ip.raw && "
       "OPENBLAS_NUM_THREADS=1 ./driver_ex run w.safetensors images.raw 300 64 2 ex.raw");
    cr_expect(same_file("ip.raw", "ex.raw"), "the in-process library's logits differ from the external compiler's");
}

/* driver bind FILE [CUT]: its status and message */
static void bind_fails(const char *file, long cut, int status, const char *message)
{
    char cmd[256];
    if (cut >= 0) snprintf(cmd, sizeof cmd, "./driver bind %s %ld", file, cut);
    else snprintf(cmd, sizeof cmd, "./driver bind %s", file);
    const char *out = ok(cmd);
    char want[32];
    snprintf(want, sizeof want, "status %d: ", status);
    cr_expect(!strncmp(out, want, strlen(want)) && strstr(out, message), "%s: expected '%s%s', got:\n%s", cmd, want, message, out);
    cr_expect(!strstr(out, "Sanitizer") && !strstr(out, "runtime error"), "%s:\n%s", cmd, out);
}

Test(lib, bad_weights_and_misuse)
{
    build("models/mlp.kiln", "--lib", "lib");
    compile_driver("mlp", "lib", "uint8_t", "image", "logits", "driver");
    write_mlp_weights("good.safetensors", NULL, NULL, NULL);
    write_mlp_weights("missing.safetensors", "fc3.bias", NULL, NULL);
    write_mlp_weights("shape.safetensors", NULL, "fc1.weight", NULL);
    write_mlp_weights("extra.safetensors", NULL, NULL, "fc4.weight");
    bind_fails("good.safetensors", -1, 0, "");
    bind_fails("missing.safetensors", -1, 3, "safetensors buffer: no tensor 'fc3.bias' (the model's parameter)");
    bind_fails("shape.safetensors", -1, 3, "safetensors buffer: tensor 'fc1.weight' is f32[784, 256], the model's is f32[256, 784]");
    bind_fails("extra.safetensors", -1, 3, "safetensors buffer: tensor 'fc4.weight' is not a parameter or buffer of the model");
    bind_fails("good.safetensors", 0, 2, "0 bytes: not a safetensors file");
    bind_fails("good.safetensors", 7, 2, "7 bytes: not a safetensors file");
    bind_fails("good.safetensors", 100, 2, "not a safetensors file, or truncated");
    bind_fails("good.safetensors", 1000000, 2, "the file is truncated or corrupted");
    /* every cut through the header, and some through the data: a status, never a crash */
    const char *all = ok("h=$((8 + $(head -c 8 good.safetensors | od -An -tu8))); i=0; while [ $i -le $((h + 64)) ]; do "
                         "./driver bind good.safetensors $i | grep -v '^status [123]: ' && echo \"cut $i\"; i=$((i + 1)); done; "
                         "for c in 4096 65536 500000 1077290; do ./driver bind good.safetensors $c | grep -v '^status 2: '; done; true");
    cr_expect_str_eq(all, "", "a cut file was bound, or crashed:\n%s", all);
    /* a foreign file, and a corrupted byte under Kiln's checksum */
    bind_fails("driver", -1, 2, "not a safetensors file, or truncated");
    write_weights_checked("ck.safetensors", NULL, NULL, NULL, true);
    ok("cp ck.safetensors bad.safetensors && printf '\\001' | dd of=bad.safetensors bs=1 seek=$(( $(stat -c %s bad.safetensors) - 3 )) conv=notrunc status=none");
    bind_fails("ck.safetensors", -1, 0, "");
    bind_fails("bad.safetensors", -1, 2, "does not match its checksum");

    /* misuse of the API */
    const char *out = ok("./driver misuse");
    cr_expect(strstr(out, "null 1: mlp: the weights or the workspace memory is NULL\n"), "%s", out);
    cr_expect(strstr(out, "misaligned 1: mlp: the weights and the workspace memory must be aligned to 64 bytes\n"), "%s", out);
    cr_expect(strstr(out, "short 1: mlp: the workspace is 663551 bytes, the forward's activations take 663552\n"), "%s", out);
    cr_expect(strstr(out, "init 0: \n"), "%s", out);
    cr_expect(strstr(out, "unbound 4: mlp_run: no weights are bound (mlp_bind)\n"), "%s", out);
    cr_expect(strstr(out, "batch 0 1: mlp: batch 0: give 1 to 128 samples\n"), "%s", out);
    cr_expect(strstr(out, "batch over 1: mlp: batch 129: give 1 to 128 samples\n"), "%s", out);
    cr_expect(strstr(out, "threads 0 1: \n"), "%s", out);
    cr_expect(strstr(out, "null input 1: mlp: input 'image' is NULL\n"), "%s", out);
    cr_expect(strstr(out, "workspace 0 663552 0\n"), "%s", out);
}

/* The archive: only the API exported; no writable data (every data symbol in
 * .data.rel.ro: tables of pointers, read-only once relocated); no allocation, file or
 * environment calls; and two models' archives link into one program (no clash of the
 * kernels', tables' or runtime's names). */
Test(lib, archive_has_no_state_allocation_or_io)
{
    build("models/cnn.kiln", "--lib", "lib");
    const char *out = ok("nm -g --defined-only lib/libcnn.a | awk 'NF == 3 {print $3}' | sort | tr '\\n' ' '");
    cr_expect_str_eq(out, "cnn_bind cnn_init cnn_run cnn_set_threads cnn_workspace_bytes ");
    /* (AddressSanitizer adds writable data of its own to every object: its globals'
     * descriptors and ODR indicators; the sanitizer build checks the rest) */
    if (!strstr(KILN_GENERATED_CFLAGS, "-fsanitize")) {
        out = ok("nm --defined-only -f sysv lib/libcnn.a | awk -F'|' 'NF > 6 && $3 ~ /[bBdDcCgGsSvV]/ && $7 !~ /^ *\\.data\\.rel\\.ro/'");
        cr_expect_str_eq(out, "", "writable data in the library:\n%s", out);
        out = ok("size -A lib/libcnn.a | awk '($1 == \".data\" || $1 == \".bss\") && $2 != 0'");
        cr_expect_str_eq(out, "", "writable sections that are not empty:\n%s", out);
    }
    out = ok("nm -u lib/libcnn.a | awk 'NF == 2 {print $2}' | sort -u | tr '\\n' ' '");
    static const char *const banned[] = {" malloc ", " calloc ", " realloc ", " free ", " fopen ", " open ", " read ", " getenv ",
                                         " printf ", " fprintf ", " puts ", " exit ", " abort "};
    char padded[4096];
    snprintf(padded, sizeof padded, " %s", out);
    for (size_t i = 0; i < sizeof banned / sizeof *banned; i++) cr_expect(!strstr(padded, banned[i]), "the library calls%s:%s", banned[i], padded);
    cr_expect(strstr(padded, " cblas_sgemm "), "%s", padded);
    out = ok("nm -D --defined-only lib/libcnn.so | awk '$2 == \"T\" {print $3}' | sort | tr '\\n' ' '");
    cr_expect_str_eq(out, "cnn_bind cnn_init cnn_run cnn_set_threads cnn_workspace_bytes ");
    /* so two models' libraries link into one program */
    build("models/mlp.kiln", "--lib", "mlp");
    char cmd[1024], path[256];
    snprintf(path, sizeof path, "%s/both.c", dir);
    FILE *f = fopen(path, "w");
    cr_assert(f);
    fputs("#include <stdio.h>\n#include \"cnn.h\"\n#include \"mlp.h\"\n"
          "int main(void)\n{\n    cnn_instance c;\n    mlp_instance m;\n"
          "    printf(\"%d %d\\n\", cnn_init(&c, NULL, 0, NULL, 0, NULL, 0), mlp_init(&m, NULL, 0, NULL, 0, NULL, 0));\n    return 0;\n}\n",
          f);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s -std=c11 -Wall -Wextra -Werror both.c -I lib -I mlp lib/libcnn.a mlp/libmlp.a %s %s -lm -o both && ./both",
             KILN_CC, KILN_GENERATED_CFLAGS, KILN_OPENBLAS, LIBOMP);
    cr_expect_str_eq(ok(cmd), "1 1\n");
}

Test(lib, usage_errors)
{
    StrBuf out;
    char args[512];
    const char *cases[][2] = {
        {"--lib --target cuda", "--lib is not available for --target cuda yet"},
        {"--lib --target cuda-emu", "--lib is not available for --target cuda-emu yet"},
        {"--lib --infer", "--lib and --infer: give one of them"},
        {"--embed-weights x.safetensors", "only inference programs embed weights (add --infer), and libraries (--lib)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        sb_init(&out);
        snprintf(args, sizeof args, "build %s %s -o %s/lib", support_path("models/mlp.kiln"), cases[i][0], dir);
        int rc = support_run_kiln(args, &out);
        cr_expect_eq(rc, 2, "%s: exit status %d:\n%s", args, rc, out.data);
        cr_expect(out.data && strstr(out.data, cases[i][1]), "%s:\n%s", args, out.data);
        sb_free(&out);
    }
    /* -o naming a file, and embedded weights that are not the model's */
    ok("touch afile");
    sb_init(&out);
    snprintf(args, sizeof args, "build %s --lib -o %s/afile", support_path("models/mlp.kiln"), dir);
    cr_expect_eq(support_run_kiln(args, &out), 2, "%s", out.data);
    cr_expect(out.data && strstr(out.data, "exists and is not a directory"), "%s", out.data);
    sb_free(&out);
    write_mlp_weights("shape.safetensors", NULL, "fc1.weight", NULL);
    sb_init(&out);
    snprintf(args, sizeof args, "build %s --lib --embed-weights %s/shape.safetensors -o %s/lib", support_path("models/mlp.kiln"), dir, dir);
    cr_expect_eq(support_run_kiln(args, &out), 1, "%s", out.data);
    cr_expect(out.data && strstr(out.data, "tensor 'fc1.weight' is f32[784, 256], the model's is f32[256, 784]"), "%s", out.data);
    sb_free(&out);
    cr_expect_str_eq(ok("ls lib 2>/dev/null | wc -l"), "0\n", "a failed build left files");
}

/* gpt's logits (i32 tokens [B, T] to f32 [B, T, 256]) at batch 4 and 1; a token outside
 * the vocabulary is the library's index error, with the model line. */
Test(lib, gpt_logits_match_infer)
{
    char core[64], cmd[1024];
    build("models/gpt.kiln", "", "train");
    build("models/gpt.kiln", "--infer", "infer");
    build("models/gpt.kiln", "--lib", "lib");
    ok("head -c 40000 /usr/share/games/fortunes/computers > corpus.txt && "
       "./train --data corpus.txt --steps 1 --checkpoint-dir ck --sample-tokens 0 && cp ck/$(cat ck/latest)/model.safetensors w.safetensors");
    /* 4 windows of 128 bytes of the text, as i32 tokens */
    enum { N = 4, T = 128 };
    static int32_t tokens[N * T];
    const char *text = ok("head -c 512 corpus.txt");
    cr_assert_eq(strlen(text), (size_t)(N * T));
    for (int i = 0; i < N * T; i++) tokens[i] = (unsigned char)text[i];
    char path[256];
    snprintf(path, sizeof path, "%s/tokens.raw", dir);
    FILE *f = fopen(path, "wb");
    cr_assert(f && fwrite(tokens, sizeof tokens, 1, f) == 1);
    fclose(f);
    write_npy_of_raw("tokens", "<i4", "(4, 128)");
    compile_driver("gpt", "lib", "int32_t", "idx", "logits", "driver");
    blas_core(core, sizeof core);
    for (int b = 4; b >= 1; b -= 3) {
        snprintf(cmd, sizeof cmd, "KILN_FTZ=0 ./infer --weights w.safetensors --threads 2 --batch %d --data idx=tokens.npy --quiet --output p%d.npy", b, b);
        ok(cmd);
        snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver run w.safetensors tokens.raw %d %d 2 l%d.raw", core, N, b, b);
        ok(cmd);
        snprintf(cmd, sizeof cmd, "p%d.npy", b);
        char raw[32];
        snprintf(raw, sizeof raw, "l%d.raw", b);
        expect_same_logits(cmd, raw);
    }
    tokens[T + 5] = 300;
    f = fopen(path, "wb");
    cr_assert(f && fwrite(tokens, sizeof tokens, 1, f) == 1);
    fclose(f);
    StrBuf out;
    sb_init(&out);
    int rc = run("OPENBLAS_NUM_THREADS=1 ./driver run w.safetensors tokens.raw 4 4 2 bad.raw", &out);
    cr_expect_eq(rc, 5, "%s", out.data);
    cr_expect(out.data && strstr(out.data, "run: status 5: ") && strstr(out.data, "models/gpt.kiln:33:9: Embedding 'wte': ") &&
                  strstr(out.data, "index 300 out of range [0, 256)"),
              "%s", out.data);
    sb_free(&out);
}

/* --bound B=8: the library's batch bound and workspace follow it, as a program's do. */
Test(lib, bound_flag)
{
    build("models/mlp.kiln", "--lib --bound B=8", "lib");
    const char *h = ok("cat lib/mlp.h");
    cr_expect(strstr(h, "#define MLP_BATCH_MAX 8 /* B */\n"), "%s", h);
    cr_expect(strstr(h, "#define MLP_WORKSPACE_BYTES 41472\n"), "%s", h); /* 8 x the bytes of a sample's activations */
    cr_expect(strstr(h, "#define MLP_WEIGHTS_BYTES 1077312\n"), "%s", h); /* 269,322 floats, at a 64-byte multiple */
    cr_expect(strstr(h, "int mlp_run(mlp_instance *m, int64_t batch, const uint8_t *image, float *logits, char *msg, size_t msg_cap);"), "%s", h);
}

/* Buffers (batch norm's running statistics, and its i64 scalar num_batches_tracked) go
 * where the steps read them: tests/lib/bn.kiln's library, bound to synthetic weights
 * whose statistics move the logits, gives the inference program's bits. */
Test(lib, buffers_match_infer)
{
    char core[64], cmd[1024];
    build("tests/lib/bn.kiln", "--infer", "infer");
    build("tests/lib/bn.kiln", "--lib", "lib");
    static float data[31360];
    for (int i = 0; i < 31360; i++) data[i] = (float)((i * 7 % 23) - 11) / 64;
    static const float mean[4] = {0.25f, -0.5f, 0.125f, 1.0f}, var[4] = {0.5f, 2.0f, 1.5f, 0.75f};
    static const int64_t tracked = 7;
    krt_st_tensor t[] = {{"conv.weight", KRT_F32, 4, {4, 1, 3, 3}, data},     {"conv.bias", KRT_F32, 1, {4}, data + 3},
                         {"norm.weight", KRT_F32, 1, {4}, data + 5},          {"norm.bias", KRT_F32, 1, {4}, data + 9},
                         {"norm.running_mean", KRT_F32, 1, {4}, mean},        {"norm.running_var", KRT_F32, 1, {4}, var},
                         {"norm.num_batches_tracked", KRT_I64, 0, {0}, &tracked}, {"fc.weight", KRT_F32, 2, {10, 3136}, data},
                         {"fc.bias", KRT_F32, 1, {10}, data + 17}};
    char path[256];
    snprintf(path, sizeof path, "%s/w.safetensors", dir);
    krt_error err;
    cr_assert_eq(krt_safetensors_write(path, t, 9, NULL, 0, &err), KRT_OK, "%s", err.msg);
    write_images(100);
    compile_driver("bn", "lib", "uint8_t", "image", "logits", "driver");
    blas_core(core, sizeof core);
    ok("KILN_FTZ=0 ./infer --weights w.safetensors --threads 2 --batch 16 --data image=images.npy --quiet --output p.npy");
    snprintf(cmd, sizeof cmd, "OPENBLAS_CORETYPE=%s OPENBLAS_NUM_THREADS=1 ./driver run w.safetensors images.raw 100 16 2 l.raw", core);
    ok(cmd);
    expect_same_logits("p.npy", "l.raw");
}
