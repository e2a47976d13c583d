/* options.c — the `kiln` command's commands, their help texts and one table of flags that
 * drives both the parser and the option lists of the help, so that --help always names
 * every flag a command takes (tests/test_cli.c checks the table against the help, README.md
 * and docs/). Values are checked here; what a flag does is in main.c. */
#include "options.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../frontend/frontend.h"
#include "../passes/passes.h"

#define MODEL_CMDS (CMD_CHECK | CMD_IR | CMD_GRADCHECK | CMD_EMIT | CMD_BUILD)

enum {
    O_MODE, O_ATTENTION, O_AFTER, O_STATS, O_PASSES, O_DOT, O_OUTPUT, O_PRECISION, O_WEIGHT_ROUNDING, O_SEED, O_TOLERANCE, O_ATOL,
    O_SAMPLES, O_SIZE, O_INPUTS, O_TARGET, O_NVCC, O_CC, O_CPU, O_CFLAGS, O_BOUND, O_REPORT, O_TIME_PASSES, O_MEMORY_BUDGET, O_INFER, O_LIB, O_EMBED,
    O_DISTRIBUTED, O_BUCKET_SIZE, O_EXCLUDE, O_WIDTH, O_METRIC, O_LOG_Y, O_NO_JIT,
};

static const CliFlag flags[] = {
    /* the commands that read a model */
    {"--mode", NULL, "train|eval", MODEL_CMDS, O_MODE, "graph to build (default train: dropout on, batch statistics)"},
    /* ir */
    {"--after", NULL, "PASS", CMD_IR, O_AFTER, "print the graph after PASS (kiln ir --passes lists them: lower, autodiff,\nsimplify, precision, remat, fusion, memplan)"},
    {"--passes", NULL, NULL, CMD_IR, O_PASSES, "list the passes in pipeline order"},
    {"--stats", NULL, NULL, CMD_IR, O_STATS, "print node counts before and after each pass (to stderr)"},
    {"--dot", NULL, NULL, CMD_IR, O_DOT, "print Graphviz DOT instead of text"},
    {"--output", "-o", "OUT", CMD_IR, O_OUTPUT, "write to OUT (atomically) instead of standard output"},
    /* gradcheck */
    {"--seed", NULL, "N", CMD_GRADCHECK, O_SEED, "seed of parameters, inputs and samples (default 0)"},
    {"--tolerance", NULL, "T", CMD_GRADCHECK, O_TOLERANCE, "rtol, the relative error allowed (default 1e-6)"},
    {"--atol", NULL, "A", CMD_GRADCHECK, O_ATOL, "absolute error allowed (default: the rounding noise of the\ndifference, 100 * eps * max(|loss|, 1) / step)"},
    {"--samples", NULL, "N", CMD_GRADCHECK, O_SAMPLES, "elements checked per tensor (default 8)"},
    {"--size", NULL, "N", CMD_GRADCHECK, O_SIZE, "value of every symbolic size such as B and T (default 2)"},
    {"--inputs", NULL, NULL, CMD_GRADCHECK, O_INPUTS, "also check the gradients of float inputs"},
    /* emit and build: what is made */
    {"--output", "-o", "DIR", CMD_EMIT, O_OUTPUT, "the directory to write model.c (or model.cu) in; its last level is created"},
    {"--output", "-o", "PROG", CMD_BUILD, O_OUTPUT, "the program to write (with --lib: the library's directory)"},
    {"--infer", NULL, NULL, CMD_EMIT | CMD_BUILD, O_INFER, "an inference program instead: the forward in eval mode on input files,\n"
                                                           "weights from a checkpoint, outputs to .npy (docs/inference.md)"},
    {"--lib", NULL, NULL, CMD_BUILD, O_LIB, "an embeddable C library instead: DIR/MODEL.h, DIR/libMODEL.a and\n"
                                           "DIR/libMODEL.so (docs/library.md; C target only)"},
    {"--embed-weights", NULL, "CKPT", CMD_BUILD, O_EMBED, "with --infer or --lib: compile in the weights of CKPT (a checkpoint\n"
                                                         "directory or a .safetensors file, Kiln's or PyTorch's)"},
    {"--distributed", NULL, NULL, CMD_EMIT | CMD_BUILD, O_DISTRIBUTED, "a data-parallel training program for MPI: mpirun -np N PROG\n"
                                                                      "(docs/distributed.md)"},
    {"--bucket-size", NULL, "SIZE", CMD_EMIT | CMD_BUILD, O_BUCKET_SIZE, "with --distributed: bytes of a gradient bucket (default 25MiB)"},
    {"--target", NULL, "c|cuda|cuda-emu", CMD_EMIT, O_TARGET, "c (default): DIR/model.c; cuda or cuda-emu: DIR/model.cu, in Kiln's\n"
                                                              "CUDA dialect (docs/cuda.md)"},
    {"--target", NULL, "c|cuda|cuda-emu", CMD_BUILD, O_TARGET, "c (default): the CPU (C, OpenMP, OpenBLAS); cuda: an NVIDIA GPU\n"
                                                               "(NVRTC for sm_80 and sm_90, cuBLAS); cuda-emu: the same CUDA program\n"
                                                               "built by $CXX against Kiln's CUDA emulator, run on the CPU (docs/cuda.md)"},
    {"--nvcc", NULL, NULL, CMD_BUILD, O_NVCC, "with --target cuda: compile model.cu whole with nvcc instead of its\n"
                                             "kernels with NVRTC and its host code with Clang (a cross-check)"},
    {"--cc", NULL, "PATH", CMD_BUILD, O_CC, "compile and link with this C compiler (default: $CC, else Clang inside\nkiln, else the compiler Kiln was built with)"},
    {"--cpu", NULL, "NAME", CMD_BUILD, O_CPU, "the CPU the C program is for: -march=NAME (e.g. x86-64-v3, haswell)\ninstead of -march=native, for a program that runs on other machines"},
    /* train and run: kiln's own flags (taken out of the program's, wherever they are after FILE) */
    {"--no-jit", NULL, NULL, CMD_TRAIN | CMD_RUN, O_NO_JIT, "build the program (cached) and run it, instead of\n"
                                                           "running the model in kiln (the JIT)"},
    {"--cc", NULL, "PATH", CMD_TRAIN | CMD_RUN, O_CC, "build the program with this C compiler and run it (no JIT;\nso does $CC)"},
    {"--time-passes", NULL, NULL, CMD_TRAIN | CMD_RUN, O_TIME_PASSES, "print the time of each pass, the compile and the JIT's link\n(to stderr)"},
    {"--cflags", NULL, "FLAGS", CMD_BUILD, O_CFLAGS, "flags for the target's compiler, after Kiln's (so they win)"},
    /* emit and build: the memory and precision of training */
    {"--attention", NULL, "fused|unfused", MODEL_CMDS, O_ATTENTION,
     "fused (default): attention computed by one kernel that keeps no T x T tensor\n(on the CUDA target head sizes up to 128); unfused: as the model writes it\n(a comparison)"},
    {"--precision", NULL, "fp32|bf16|fp16", CMD_IR | CMD_EMIT | CMD_BUILD, O_PRECISION,
     "overrides the recipe's precision: bf16 or fp16 train in mixed precision\n(fp32 master weights; docs/precision.md)"},
    {"--weight-rounding", NULL, "nearest|stochastic", CMD_IR | CMD_EMIT | CMD_BUILD, O_WEIGHT_ROUNDING,
     "bf16: how the step's bf16 weights are rounded from the fp32 masters\n(overrides the recipe's weight_rounding)"},
    {"--bound", NULL, "NAME=N", CMD_EMIT | CMD_BUILD, O_BOUND, "lower a size's bound for this program (memory is planned for it)"},
    {"--memory-budget", NULL, "SIZE", CMD_EMIT | CMD_BUILD, O_MEMORY_BUDGET,
     "make training memory fit SIZE (e.g. 1.5GiB): recompute cheap values,\n"
     "then checkpoint blocks, until the plan fits (or the recipe's memory_budget)"},
    {"--report", NULL, NULL, CMD_EMIT | CMD_BUILD, O_REPORT, "print the memory plan: each slab (parameters, gradients, optimizer\n"
                                                            "state, buffers) and the activation arenas at the bounds; with build\n"
                                                            "--target cuda, each kernel's registers, spills, stack and shared\n"
                                                            "memory for sm_80 and sm_90 (NVRTC's ptxas report)"},
    {"--time-passes", NULL, NULL, CMD_EMIT | CMD_BUILD, O_TIME_PASSES, "print each pass that ran, the graph it ran on and its time (to stderr)"},
    /* tokens */
    {"--output", "-o", "OUT", CMD_TOKENS, O_OUTPUT, "the token file to write"},
    {"--exclude", NULL, "GLOB", CMD_TOKENS, O_EXCLUDE, "leave out the files that match GLOB"},
    {"--width", NULL, "2|4", CMD_TOKENS, O_WIDTH, "bytes per token (default 2)"},
    /* plot */
    {"--output", "-o", "OUT", CMD_PLOT, O_OUTPUT, "the image to write: OUT.png or OUT.svg"},
    {"--output", "-o", "NAME.kiln", CMD_IMPORT, O_OUTPUT, "the model file to write; its weights go beside it, NAME.safetensors"},
    {"--metric", NULL, "NAME", CMD_PLOT, O_METRIC, "also draw this metric (training and eval_ values) in a panel of its own;\n"
                                                  "repeat it or give a comma list (--metric accuracy,f1)"},
    {"--log-y", NULL, NULL, CMD_PLOT, O_LOG_Y, "draw the loss on a logarithmic scale"},
};

const CliFlag *cli_flags(int *n)
{
    *n = (int)(sizeof flags / sizeof flags[0]);
    return flags;
}

static const CliCommand commands[] = {
    {CMD_CHECK, "check", "check FILE          parse and check a model; print its parameters, inputs, outputs,\n"
                         "                      recipe and training memory",
     "usage: kiln check FILE [options]\n"
     "\n"
     "Parses and checks FILE. Prints every parameter (state_dict name, shape, count, init),\n"
     "the total parameter count, the inputs and outputs, symbolic sizes, the training\n"
     "recipe with its defaults and the memory a training step needs. Exits 0 when the\n"
     "model is valid, 1 with diagnostics if not.\n"},
    {CMD_IR, "ir", "ir FILE             print the model's IR after any pass, as text or Graphviz DOT",
     "usage: kiln ir FILE [options]\n"
     "       kiln ir --passes\n"
     "\n"
     "Prints the IR of FILE in Kiln's text form (docs/ir.md), or as a Graphviz graph with\n"
     "--dot (render with: dot -Tsvg OUT -o graph.svg). By default the graph as lowered\n"
     "(forward, loss, metrics); --after PASS runs the pipeline up to PASS.\n"},
    {CMD_GRADCHECK, "gradcheck", "gradcheck FILE      check every parameter gradient against finite differences",
     "usage: kiln gradcheck FILE [options]\n"
     "\n"
     "Differentiates FILE's loss, then compares every parameter gradient (run by the\n"
     "reference interpreter in double precision, parameters initialised as PyTorch does,\n"
     "random inputs) against central finite differences on a sample of its elements.\n"
     "An element passes when |analytic - numeric| <= atol + rtol * |numeric|. Elements whose\n"
     "step crosses a kink (relu at 0, a max-pooling tie, a flipping comparison) are replaced\n"
     "by others; detached values are held fixed. Prints one line per parameter: ok, FAIL,\n"
     "gradient identically zero, or not checked, with notes; exits 1 when any FAILs.\n"},
    {CMD_EMIT, "emit", "emit FILE -o DIR    write the generated code: DIR/model.c (C) or DIR/model.cu (CUDA)",
     "usage: kiln emit FILE -o DIR [options]\n"
     "\n"
     "Writes the code kiln build compiles, without compiling it: DIR/model.c, which defines\n"
     "`kiln_model_def` (runtime/kiln_model.h), or with --target cuda (or cuda-emu: the same\n"
     "file) DIR/model.cu in Kiln's CUDA dialect (docs/cuda.md; a kernel it cannot write yet\n"
     "is an error naming its model line). The flags that shape the program (--infer,\n"
     "--distributed, --precision, --memory-budget, ...) shape the code as they do for build.\n"},
    {CMD_BUILD, "build", "build FILE -o PROG  compile FILE into a training program (--infer: an inference\n"
                         "                      program, --lib: a C library) for the CPU or, with\n"
                         "                      --target cuda, an NVIDIA GPU",
     "usage: kiln build FILE -o PROG [options]\n"
     "\n"
     "Compiles FILE into a standalone program (the generated code and Kiln's runtime, with\n"
     "$CC or the compiler Kiln was built with). On a terminal it shows what it is compiling.\n"
     "\n"
     "outputs:\n"
     "  (default)           a training program: PROG trains by the model's recipe, evaluates,\n"
     "                      logs and checkpoints (PROG --help lists its flags)\n"
     "  --infer             an inference program: the forward on input files (docs/inference.md)\n"
     "  --lib -o DIR        an embeddable C library: DIR/MODEL.h, DIR/libMODEL.a, DIR/libMODEL.so\n"
     "  --distributed       a data-parallel training program for MPI (docs/distributed.md)\n"
     "targets:\n"
     "  --target c          the CPU (default): C with OpenMP and OpenBLAS\n"
     "  --target cuda       an NVIDIA GPU: CUDA by nvcc (sm_80, sm_90), cuBLAS, NCCL\n"
     "  --target cuda-emu   the same CUDA program on Kiln's CUDA emulator, on the CPU\n"
     "\n"
     "--memory-budget SIZE recomputes cheap values (elementwise, views) where the backward\n"
     "pass reads them, then checkpoints blocks (calls of the model's own modules from\n"
     "forward), the most memory per recomputed FLOP first, until the plan fits; an error\n"
     "gives the smallest figure when none does. --precision bf16 or fp16 trains with\n"
     "half-precision matrix-product inputs and kept activations and fp32 master weights\n"
     "(docs/precision.md); --weight-rounding stochastic rounds the step's bf16 weights\n"
     "stochastically (llm.c's), not to nearest (autocast's).\n"},
    {CMD_TRAIN, "train", "train FILE [FLAGS]  train FILE in kiln (JIT) or by its cached program; FLAGS go to it",
     "usage: kiln train FILE [options] [PROGRAM FLAGS...]\n"
     "\n"
     "Trains FILE as its training program would (kiln build's), with every flag after FILE\n"
     "but kiln's own (below) passed to it (e.g. --steps 100, --resume DIR; see kiln train\n"
     "FILE --help). With Clang inside kiln, the model is compiled into the kiln process and\n"
     "trained there (the JIT), bit for bit as the program; otherwise, or with --no-jit, --cc\n"
     "or $CC, the program is built and run. Both are cached by the content of the generated\n"
     "code, in $XDG_CACHE_HOME/kiln or ~/.cache/kiln: an unchanged model starts at once.\n"},
    {CMD_TOKENS, "tokens", "tokens GLOB -o OUT  write a token file (docs/formats.md) of the bytes of text files",
     "usage: kiln tokens GLOB -o OUT [options]\n"
     "\n"
     "Writes the bytes of every file matching GLOB (sorted by name, minus --exclude) as a\n"
     "token file (docs/formats.md) for `data = tokens(\"OUT\", ...)`.\n"},
    {CMD_PLOT, "plot", "plot LOG... -o OUT  draw training logs (PROG --log FILE) as curves: PNG or SVG",
     "usage: kiln plot LOG.jsonl [LOG2.jsonl ...] -o OUT.png|OUT.svg [options]\n"
     "\n"
     "Draws the logs a training program writes with --log FILE (JSON lines): training and\n"
     "evaluation loss against the step, the learning rate in a panel below, and each\n"
     "--metric in a panel of its own. Several logs are overlaid, one colour each, named by\n"
     "file in the legend; training values are solid lines, evaluations dashed with dots.\n"
     "The format is chosen by OUT's extension: .png (960 pixels wide) or .svg.\n"},
    {CMD_RUN, "run", "run FILE [FLAGS]    run FILE's inference program in kiln (JIT); FLAGS go to it",
     "usage: kiln run FILE [options] [PROGRAM FLAGS...]\n"
     "\n"
     "Runs FILE as its inference program would (kiln build --infer's: the forward on input\n"
     "files, or text generation; docs/inference.md), with every flag after FILE but kiln's\n"
     "own (below) passed to it (the weights, the inputs...: see kiln run FILE --help).\n"
     "As kiln train: compiled into the kiln process (the JIT) or, with --no-jit, --cc or\n"
     "$CC, the program built and run; both cached.\n"},
    {CMD_IMPORT, "import", "import FILE.onnx -o NAME.kiln  an ONNX model as a Kiln model file and its weights",
     "usage: kiln import FILE.onnx -o NAME.kiln\n"
     "\n"
     "Writes the ONNX model FILE.onnx as an ordinary Kiln model file, NAME.kiln, one statement\n"
     "per ONNX node with the node's name in a comment, and its initializers as the model's\n"
     "parameters in NAME.safetensors beside it (docs/onnx.md). An operator, attribute or shape\n"
     "Kiln cannot express is one error naming the node.\n"},
};

const CliCommand *cli_commands(int *n)
{
    *n = (int)(sizeof commands / sizeof commands[0]);
    return commands;
}

const CliCommand *cli_command(const char *name)
{
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (name && !strcmp(commands[i].name, name)) return &commands[i];
    return NULL;
}

#define HELP_COLUMN 24

/* One option line: "  -o, --output OUT      help", continuation lines indented. */
static void usage_flag(const CliFlag *f, StrBuf *out)
{
    StrBuf name;
    sb_init(&name);
    if (f->alias) sb_printf(&name, "%s, ", f->alias);
    sb_puts(&name, f->name);
    if (f->arg) sb_printf(&name, " %s", f->arg);
    sb_printf(out, "  %s", name.data);
    if ((int)name.len + 2 >= HELP_COLUMN) sb_printf(out, "\n%*s", HELP_COLUMN, "");
    else sb_printf(out, "%*s", HELP_COLUMN - (int)name.len - 2, "");
    for (const char *h = f->help; *h; h++) {
        sb_putc(out, *h);
        if (*h == '\n') sb_printf(out, "%*s", HELP_COLUMN, "");
    }
    sb_putc(out, '\n');
    sb_free(&name);
}

void cli_usage(const char *cmd, StrBuf *out)
{
    const CliCommand *c = cli_command(cmd);
    if (!c) {
        sb_puts(out, "usage: kiln COMMAND [options]\n"
                     "\n"
                     "Kiln compiles model files (*.kiln) into training programs, inference programs and\n"
                     "embeddable C libraries, for the CPU or NVIDIA GPUs; it prints their IR, checks their\n"
                     "gradients, and plots training logs.\n"
                     "\n"
                     "commands:\n");
        for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++) sb_printf(out, "  %s\n", commands[i].summary);
        sb_puts(out, "\n"
                     "options:\n"
                     "  -h, --help          show this help (kiln COMMAND --help for a command's options)\n"
                     "  --version           print the version\n");
        return;
    }
    sb_puts(out, c->usage);
    sb_puts(out, "\noptions:\n");
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (flags[i].commands & c->bit) usage_flag(&flags[i], out);
    sb_printf(out, "  %-*s%s\n", HELP_COLUMN - 2, "-h, --help", "show this help");
}

int cli_usage_error(const char *cmd, const char *fmt, const char *arg)
{
    fprintf(stderr, "kiln%s%s: error: ", cmd ? " " : "", cmd ? cmd : "");
    fprintf(stderr, fmt, arg);
    StrBuf u;
    sb_init(&u);
    cli_usage(cmd, &u);
    fprintf(stderr, "\n%s", u.data);
    sb_free(&u);
    return 2;
}

/* Parses a number option's value; false when it is not a valid number in [lo, hi]. */
static bool number_arg(const char *s, double lo, double hi, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

/* The row of flag a for command bit, or NULL. */
static const CliFlag *find_flag(const char *a, unsigned bit)
{
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if ((flags[i].commands & bit) && (!strcmp(flags[i].name, a) || (flags[i].alias && !strcmp(flags[i].alias, a)))) return &flags[i];
    return NULL;
}

/* What a flag's missing value should have been, for the message. */
static int missing_value(const char *cmd, const CliFlag *f, const char *given)
{
    switch (f->id) {
    case O_AFTER: return cli_usage_error(cmd, "--after needs a pass name (see kiln ir --passes)%s", "");
    case O_MODE: return cli_usage_error(cmd, "--mode needs a value: train or eval%s", "");
    case O_BOUND: return cli_usage_error(cmd, "--bound needs NAME=N, e.g. --bound T=64%s", "");
    case O_TARGET: return cli_usage_error(cmd, "--target needs a value: c, cuda or cuda-emu%s", "");
    case O_MEMORY_BUDGET: return cli_usage_error(cmd, "--memory-budget needs a size, e.g. 1.5GiB%s", "");
    case O_BUCKET_SIZE: return cli_usage_error(cmd, "--bucket-size needs a size, e.g. 25MiB%s", "");
    case O_PRECISION: return cli_usage_error(cmd, "--precision needs a value: fp32, bf16 or fp16%s", "");
    case O_ATTENTION: return cli_usage_error(cmd, "--attention needs a value: fused or unfused%s", "");
    case O_WEIGHT_ROUNDING: return cli_usage_error(cmd, "--weight-rounding needs a value: nearest or stochastic%s", "");
    case O_EMBED: return cli_usage_error(cmd, "--embed-weights needs a checkpoint: a directory or a .safetensors file%s", "");
    case O_OUTPUT: return cli_usage_error(cmd, "%s needs a file name", given);
    default: {
        char msg[160];
        snprintf(msg, sizeof msg, "%s needs a value: %s", given, f->arg);
        return cli_usage_error(cmd, "%s", msg);
    }
    }
}

/* Checks and stores one flag's value; -1 to go on, else 2 after a message. */
static int apply_flag(const char *cmd, const CliFlag *f, const char *a, const char *val, Options *o)
{
    double v;
    switch (f->id) {
    case O_MODE:
        if (!strcmp(val, "train")) o->mode = MODE_TRAIN;
        else if (!strcmp(val, "eval")) o->mode = MODE_EVAL;
        else return cli_usage_error(cmd, "--mode must be train or eval, not '%s'", val);
        return -1;
    case O_AFTER:
        o->after = val;
        if (!pipeline_has_pass(val)) return cli_usage_error(cmd, "unknown pass '%s' (kiln ir --passes lists them)", val);
        return -1;
    case O_STATS: o->stats = true; return -1;
    case O_PASSES: o->list_passes = true; return -1;
    case O_DOT: o->dot = true; return -1;
    case O_INPUTS: o->inputs = true; return -1;
    case O_REPORT: o->report = true; return -1;
    case O_TIME_PASSES: o->time_passes = true; return -1;
    case O_NO_JIT: o->no_jit = true; return -1;
    case O_INFER: o->infer = true; return -1;
    case O_LIB: o->lib = true; return -1;
    case O_DISTRIBUTED: o->distributed = true; return -1;
    case O_LOG_Y: o->log_y = true; return -1;
    case O_OUTPUT: o->output = val; return -1;
    case O_CFLAGS: o->cflags = val; return -1;
    case O_CC: o->cc = val; return -1;
    case O_NVCC: o->nvcc = true; return -1;
    case O_CPU: /* a word for -march= (and the shell, for an external compiler) */
        if (!*val || strspn(val, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-") != strlen(val) || *val == '-')
            return cli_usage_error(cmd, "--cpu '%s': not a CPU name (e.g. x86-64-v3, haswell, native)", val);
        o->cpu = val;
        return -1;
    case O_EMBED: o->embed = val; return -1;
    case O_EXCLUDE: o->exclude = val; return -1;
    case O_METRIC: o->metrics[o->nmetrics++] = val; return -1;
    case O_SEED:
    case O_TOLERANCE:
    case O_ATOL:
    case O_SAMPLES:
    case O_SIZE:
        if (f->id == O_SEED && number_arg(val, 0, 9e15, &v) && v == floor(v)) o->seed = (uint64_t)v;
        else if (f->id == O_TOLERANCE && number_arg(val, 0, 1e300, &v)) o->tolerance = v;
        else if (f->id == O_ATOL && number_arg(val, 0, 1e300, &v)) o->atol = v;
        else if (f->id == O_SAMPLES && number_arg(val, 1, 1e6, &v) && v == floor(v)) o->samples = (int)v;
        else if (f->id == O_SIZE && number_arg(val, 1, 1 << 20, &v) && v == floor(v)) o->size = (int64_t)v;
        else return cli_usage_error(cmd, "invalid value '%s' for this option", val);
        return -1;
    case O_BOUND:
        if (!strchr(val, '=')) return missing_value(cmd, f, a);
        if (o->nbounds < 8) o->bounds[o->nbounds++] = val;
        return -1;
    case O_TARGET:
        o->cuda = !strcmp(val, "cuda") || !strcmp(val, "cuda-emu");
        o->emulated = !strcmp(val, "cuda-emu");
        if (strcmp(val, "c") && !o->cuda) return cli_usage_error(cmd, "--target must be c, cuda or cuda-emu, not '%s'", val);
        return -1;
    case O_MEMORY_BUDGET:
        if (!util_parse_size(val, &o->memory_budget))
            return cli_usage_error(cmd, "--memory-budget: '%s' is not a size (e.g. 1.5GiB, 800MiB, 2GB, 4096)", val);
        return -1;
    case O_BUCKET_SIZE:
        if (!util_parse_size(val, &o->bucket_bytes) || o->bucket_bytes < 4 || o->bucket_bytes > ((int64_t)1 << 32))
            return cli_usage_error(cmd, "--bucket-size: '%s' is not a size from 4 bytes to 4GiB (e.g. 25MiB, 1MB, 65536)", val);
        return -1;
    case O_ATTENTION:
        if (strcmp(val, "fused") && strcmp(val, "unfused")) return cli_usage_error(cmd, "--attention must be fused or unfused, not '%s'", val);
        o->unfused_attention = !strcmp(val, "unfused");
        return -1;
    case O_PRECISION:
        o->precision = val;
        if (recipe_precision_dtype(val) < 0) return cli_usage_error(cmd, "--precision must be fp32, bf16 or fp16 (f32 and f16 are aliases), not '%s'", val);
        return -1;
    case O_WEIGHT_ROUNDING:
        o->weight_rounding = val;
        if (strcmp(val, "nearest") && strcmp(val, "stochastic"))
            return cli_usage_error(cmd, "--weight-rounding must be nearest or stochastic, not '%s'", val);
        return -1;
    case O_WIDTH:
        if (strcmp(val, "2") && strcmp(val, "4")) return cli_usage_error(cmd, "--width must be 2 or 4, not '%s'", val);
        o->width = val[0] - '0';
        return -1;
    }
    return -1;
}

/* "unknown option": with the nearest flag of the command when one is close. */
static int unknown_flag(const char *cmd, unsigned bit, const char *a)
{
    const char *best = NULL;
    int bestd = 3;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++) {
        if (!(flags[i].commands & bit)) continue;
        int d = util_edit_distance(flags[i].name, a);
        if (d < bestd) bestd = d, best = flags[i].name;
    }
    /* a flag of other commands: say which */
    unsigned others = 0;
    for (size_t i = 0; i < sizeof flags / sizeof flags[0]; i++)
        if (!strcmp(flags[i].name, a) || (flags[i].alias && !strcmp(flags[i].alias, a))) others |= flags[i].commands;
    StrBuf msg;
    sb_init(&msg);
    sb_printf(&msg, "unknown option '%.200s'", a);
    if (others) {
        sb_printf(&msg, " (kiln %s takes no %s; ", cmd, a);
        int n = 0;
        for (size_t c = 0; c < sizeof commands / sizeof commands[0]; c++)
            if (others & commands[c].bit) sb_printf(&msg, "%s%s", n++ ? ", " : "", commands[c].name);
        sb_printf(&msg, " do%s)", n == 1 ? "es" : "");
    } else if (best) {
        sb_printf(&msg, " (did you mean '%s'?)", best);
    }
    int rc = cli_usage_error(cmd, "%s", msg.data);
    sb_free(&msg);
    return rc;
}

int cli_parse_options(const char *cmd, int argc, char **argv, Options *o)
{
    memset(o, 0, sizeof *o);
    o->mode = MODE_TRAIN;
    o->tolerance = 1e-6;
    o->samples = 8;
    o->size = 2;
    o->width = 2;
    o->exclude = "";
    o->files = xcalloc((size_t)argc + 1, sizeof *o->files);
    o->metrics = xcalloc((size_t)argc + 1, sizeof *o->metrics);
    const CliCommand *c = cli_command(cmd);
    unsigned bit = c ? c->bit : 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            StrBuf u;
            sb_init(&u);
            cli_usage(cmd, &u);
            fputs(u.data, stdout);
            sb_free(&u);
            return 0;
        }
        if (a[0] == '-' && a[1]) {
            const CliFlag *f = find_flag(a, bit);
            if (!f) return unknown_flag(cmd, bit, a);
            const char *val = NULL;
            if (f->arg) {
                /* the next word is one of the command's flags: the value was left out */
                if (i + 1 >= argc || find_flag(argv[i + 1], bit)) return missing_value(cmd, f, a);
                val = argv[++i];
            }
            int rc = apply_flag(cmd, f, a, val, o);
            if (rc >= 0) return rc;
        } else if (bit == CMD_PLOT) {
            o->files[o->nfiles++] = a;
        } else if (bit == CMD_IMPORT && o->file) {
            return cli_usage_error(cmd, "more than one ONNX file given ('%s')", a);
        } else if (o->file) {
            return cli_usage_error(cmd, bit == CMD_TOKENS ? "more than one input pattern given ('%s')" : "more than one model file given ('%s')", a);
        } else {
            o->file = a;
        }
    }
    if (bit == CMD_TOKENS) {
        if (!o->file || !o->output) return cli_usage_error(cmd, "needs an input pattern and -o OUT%s", "");
        return -1;
    }
    if (bit == CMD_IMPORT) {
        if (!o->file) return cli_usage_error(cmd, "no ONNX file given%s", "");
        if (!o->output) return cli_usage_error(cmd, "import needs the model file to write: -o NAME.kiln%s", "");
        return -1;
    }
    if (bit == CMD_PLOT) {
        if (!o->nfiles) return cli_usage_error(cmd, "no log given (a file a training program wrote with --log FILE)%s", "");
        if (!o->output) return cli_usage_error(cmd, "plot needs an output image: -o OUT.png or -o OUT.svg%s", "");
        return -1;
    }
    if (!o->file && !o->list_passes) return cli_usage_error(cmd, "no model file given%s", "");
    if (bit == CMD_EMIT && !o->output) return cli_usage_error(cmd, "emit needs an output directory: -o DIR%s", "");
    if (bit == CMD_BUILD && !o->output) return cli_usage_error(cmd, "build needs an output program: -o PROG%s", "");
    if (o->lib && o->infer) return cli_usage_error(cmd, "--lib and --infer: give one of them (a library or an inference program)%s", "");
    if (o->lib && o->cuda) return cli_usage_error(cmd, "--lib is not available for --target %s yet (build it for the C target)", o->emulated ? "cuda-emu" : "cuda");
    if (o->embed && !o->infer && !o->lib)
        return cli_usage_error(cmd, "--embed-weights %s: only inference programs embed weights (add --infer), and libraries (--lib)", o->embed);
    if (o->bucket_bytes && !o->distributed) return cli_usage_error(cmd, "--bucket-size sizes the gradient buckets of distributed programs: add --distributed%s", "");
    if (o->distributed && o->infer) return cli_usage_error(cmd, "--distributed builds a training program; inference programs (--infer) run on one process%s", "");
    if (o->distributed && !o->bucket_bytes) o->bucket_bytes = 25 << 20; /* PyTorch DDP's bucket_cap_mb = 25 */
    return -1;
}

void cli_options_free(Options *o)
{
    free(o->files);
    free(o->metrics);
    o->files = o->metrics = NULL;
}
