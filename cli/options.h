/* options.h — the `kiln` command's commands and flags: one table (options.c) drives the
 * parser, the help texts and tests/test_cli.c, which checks that every flag is in its
 * command's --help and in README.md or docs/, so that a flag cannot exist undocumented. */
#ifndef KILN_CLI_OPTIONS_H
#define KILN_CLI_OPTIONS_H

#include <stdbool.h>
#include <stdint.h>

#include "../ir/ir.h"
#include "../util/util.h"

/* The commands, as bits of CliFlag.commands. */
enum {
    CMD_CHECK = 1 << 0,
    CMD_IR = 1 << 1,
    CMD_GRADCHECK = 1 << 2,
    CMD_EMIT = 1 << 3,
    CMD_BUILD = 1 << 4,
    CMD_TRAIN = 1 << 5,
    CMD_TOKENS = 1 << 6,
    CMD_PLOT = 1 << 7,
    CMD_RUN = 1 << 8,
    CMD_IMPORT = 1 << 9, /* the commands table holds them in bit order */
};

typedef struct {
    const char *name;    /* "--target" */
    const char *alias;   /* "-o", or NULL */
    const char *arg;     /* what the value is, "c|cuda|cuda-emu"; NULL for a switch */
    unsigned commands;   /* the CMD_ bits of the commands that take it */
    int id;              /* what it sets (options.c) */
    const char *help;    /* for --help; '\n' starts an indented continuation line */
} CliFlag;

/* The flag table; a flag may have one row per command when its meaning differs. */
const CliFlag *cli_flags(int *n);

typedef struct {
    unsigned bit;        /* CMD_ */
    const char *name;    /* "build" */
    const char *summary; /* the one line kiln --help gives it */
    const char *usage;   /* its --help, before the generated list of options */
} CliCommand;

const CliCommand *cli_commands(int *n);
/* The command named name, or NULL. */
const CliCommand *cli_command(const char *name);
/* The help text of a command (NULL: kiln --help), with its options from the table. */
void cli_usage(const char *cmd, StrBuf *out);
/* Prints "kiln CMD: error: " + the message, then the command's help, to stderr; returns 2. */
int cli_usage_error(const char *cmd, const char *fmt, const char *arg);

typedef struct {
    const char *file;
    const char *output;
    const char *after;
    const char *cflags;
    const char *cc; /* build: --cc PATH (NULL: $CC, else Clang in process) */
    const char *cpu; /* build: --cpu NAME (NULL: the host's CPU, -march=native) */
    const char *bounds[8]; /* "T=64": lower a symbol's bound for this build */
    int nbounds;
    bool dot, stats, list_passes, inputs, report;
    bool time_passes; /* build, emit: --time-passes */
    bool no_jit;      /* train, run: --no-jit (main.c takes their flags itself) */
    int64_t memory_budget; /* build, emit: --memory-budget SIZE (0: none) */
    const char *precision; /* build, emit, ir: --precision NAME (NULL: the recipe's) */
    bool unfused_attention; /* check, ir, gradcheck, emit, build: --attention unfused */
    const char *weight_rounding; /* build, emit, ir: --weight-rounding nearest|stochastic (NULL: the recipe's) */
    bool cuda;     /* emit, build: --target cuda or cuda-emu */
    bool emulated; /* build: --target cuda-emu */
    bool nvcc;     /* build: --nvcc (--target cuda by nvcc) */
    bool infer;    /* build: --infer */
    bool lib;      /* build: --lib */
    const char *embed; /* build: --embed-weights CKPT */
    bool distributed;     /* build, emit: --distributed */
    int64_t bucket_bytes; /* build, emit: --bucket-size SIZE (0: not given) */
    GraphMode mode;
    uint64_t seed;
    double tolerance, atol;
    int samples;
    int64_t size;
    const char *exclude; /* tokens: --exclude GLOB */
    int width;           /* tokens: --width 2|4 */
    const char **files;  /* plot: the logs (argv's strings; the array is allocated) */
    int nfiles;
    const char **metrics; /* plot: every --metric value, as given (comma lists) */
    int nmetrics;
    bool log_y;           /* plot: --log-y */
} Options;

/* Parses the options of `cmd` (argv after the command's name) into *o; returns -1 to go
 * on, else the exit status (0 after --help, 2 after a usage error). */
int cli_parse_options(const char *cmd, int argc, char **argv, Options *o);
void cli_options_free(Options *o);

#endif
