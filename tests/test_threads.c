/* test_threads.c — a training program's results do not depend on its number of threads,
 * nor on the compiler that built it: every model of models/ and a LeNet with batch norm
 * (tests/threads/lenet_bn.kiln) train a few steps at --threads 1, 2 and 3 to checkpoints of
 * the same bits, built by Clang inside kiln with no compiler or linker on PATH, and the
 * same again when the program is built by the external compiler (--cc). The products are cut
 * into blocks by their shape alone (kiln_gemm_plan, runtime/kiln_gemm.h) and the totals
 * summed in chunks cut by the shape (KILN_TOTAL_CHUNKS); only which thread runs a block may
 * depend on the threads. The data is written here (no installed dataset needed), small:
 * the whole test takes seconds. */
#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/kiln_rt.h"
#include "ckpt_compare.h"
#include "support.h"

typedef struct {
    const char *name, *file, *build, *train;
} Case;

/* gpt2-124m is left out: 124M parameters, 1.5 GB of checkpoint per run, minutes of the
 * suite for the same kernels gpt and llama run at a smaller width. The image models train
 * at their recipes' batches, where their products are cut into blocks (cnn's 128, lenet_bn's
 * 64), the language models at T 64, gpt also in bf16. */
static const Case cases[] = {
    {"mlp", "models/mlp.kiln", "", "--steps 2 --data image=img.idx --data label=lab.idx --eval-data image=img.idx --eval-data label=lab.idx"},
    {"cnn", "models/cnn.kiln", "", "--steps 2 --data image=img.idx --data label=lab.idx --eval-data image=img.idx --eval-data label=lab.idx"},
    {"lenet_bn", "tests/threads/lenet_bn.kiln", "",
     "--steps 3 --data image=img.idx --data label=lab.idx --eval-data image=img.idx --eval-data label=lab.idx"},
    {"gpt", "models/gpt.kiln", "--bound T=64", "--steps 2 --batch 4 --sample-tokens 0 --data text.txt"},
    {"llama", "models/llama.kiln", "--bound T=64", "--steps 2 --batch 4 --sample-tokens 0 --data text.txt"},
    /* products of bf16 operands: panels widened within each block (kiln_hgemm_beta) */
    {"gpt_bf16", "models/gpt.kiln", "--bound T=64 --precision bf16", "--steps 2 --batch 4 --sample-tokens 0 --data text.txt"},
};

Test(threads, every_model_trains_to_the_same_bits_at_1_2_and_3_threads, .timeout = 300)
{
    char dir[] = "/tmp/kiln-threads-XXXXXX";
    cr_assert(mkdtemp(dir));
    char args[1024];
    support_write_training_data(dir);
    StrBuf out;
    sb_init(&out);
    for (size_t m = 0; m < sizeof cases / sizeof *cases; m++) {
        const Case *c = &cases[m];
        /* Clang in kiln's process where it has it (no compiler or linker on PATH), and the
         * external compiler */
        snprintf(args, sizeof args, "%s %s build %s %s -o %s/%s", KILN_IN_PROCESS_DEFAULT ? "env PATH=/nonexistent" : "", KILN_BINARY,
                 support_path(c->file), c->build, dir, c->name);
        sb_free(&out); /* support_run appends */
        sb_init(&out);
        cr_assert_eq(support_run(args, &out), 0, "%s", out.data);
        snprintf(args, sizeof args, "build %s %s --cc %s -o %s/%s-cc", support_path(c->file), c->build, KILN_CC, dir, c->name);
        cr_assert_eq(support_run_kiln(args, &out), 0, "%s", out.data);
        snprintf(args, sizeof args, "./%s-cc %s --eval-batches 1 --threads 2 --checkpoint-dir ck-%s-cc", c->name, c->train, c->name);
        cr_assert_eq(support_run_in(dir, args, &out), 0, "%s: %s", args, out.data);
        for (int t = 1; t <= 3; t++) {
            snprintf(args, sizeof args, "./%s %s --eval-batches 1 --threads %d --checkpoint-dir ck-%s-%d", c->name, c->train, t, c->name, t);
            cr_assert_eq(support_run_in(dir, args, &out), 0, "%s: %s", args, out.data);
        }
        char ck[4][1100]; /* --threads 1, 2, 3; the external compiler's at 2 */
        for (int t = 1; t <= 4; t++) {
            char d[600];
            int64_t step;
            krt_error err;
            if (t < 4) snprintf(d, sizeof d, "%s/ck-%s-%d", dir, c->name, t);
            else snprintf(d, sizeof d, "%s/ck-%s-cc", dir, c->name);
            cr_assert_eq(krt_ckpt_find(d, ck[t - 1], sizeof ck[t - 1], &step, NULL, &err), KRT_OK, "%s", err.msg);
        }
        static const char *const files[] = {"model.safetensors", "train_state.safetensors"};
        for (int t = 2; t <= 4; t++)
            for (int f = 0; f < 2; f++) {
                char *a = malloc(1200), *b = malloc(1200); /* on the heap: the message's room is not the paths' */
                snprintf(a, 1200, "%s/%s", ck[t == 4 ? 1 : 0], files[f]);
                snprintf(b, 1200, "%s/%s", ck[t - 1], files[f]);
                const char *why = ckpt_difference(a, b);
                if (t < 4) cr_expect(!why, "%s at --threads 1 and %d: %s", c->name, t, why);
                else cr_expect(!why, "%s built in kiln's process and by %s: %s", c->name, KILN_CC, why);
                free(a);
                free(b);
            }
    }
    sb_free(&out);
    support_remove_dir(dir);
}
