/* kiln.h — the compiler as one library call. kiln_compile takes a model file (or its
 * text) and typed build options and returns a KilnProgram: the graphs the program needs
 * (train, eval, predict, decode), each with the plan the pipeline computed for it once
 * (fusion's kernels, memplan's arena), the recipe, the generated code, the reports and the
 * diagnostics. The file is read and parsed once per build, each graph lowered once. The
 * `kiln` command is a client of this header, as are the tests that compile models without
 * the command line; everything a build depends on travels in KilnOptions (no global
 * state), so two builds in one process are independent. Built as the static library
 * kiln_driver. docs/passes.md describes the pipeline and the plans. */
#ifndef KILN_DRIVER_H
#define KILN_DRIVER_H

#include <stdio.h>

#include "../codegen/codegen.h"
#include "../frontend/frontend.h"
#include "../passes/passes.h"
#include "../runtime/kiln_recipe.h"

typedef enum { KILN_TARGET_C, KILN_TARGET_CUDA } KilnTarget;

/* kiln_compile's result: 0, or why there is no program. */
typedef enum {
    KILN_OK = 0,
    KILN_ERR_MODEL = 1, /* the model file (or its plan) has errors: diagnostics or *err */
    KILN_ERR_USAGE = 2, /* an option that does not apply to this model: *err says which */
} KilnStatus;

typedef struct {
    const char *path;  /* the model file's name (diagnostics cite it) */
    const char *text;  /* its text, or NULL to read path */
    size_t len;
    GraphMode mode;    /* the model's graph: MODE_TRAIN (a zeroed struct) or MODE_EVAL (--mode eval) */
    const char *const *bounds; /* --bound NAME=N: lower a size's bound (memory is planned for it) */
    int nbounds;
    KilnTarget target;
    bool infer;        /* an inference program or library: evaluation, predict and decode steps */
    bool plan_only;    /* stop after planning, no code (kiln check) */
    /* kiln ir and gradcheck: run the training graph's pipeline up to and including this
     * pass ("lower": none; fusion, memplan: train.plan too) and stop there */
    const char *stop_after;
    bool stats;        /* with stop_after: node counts around each pass (KilnProgram.stats) */
    bool keep_lowered; /* keep a copy of the model's graph as lowered (KilnProgram.lowered) */
    const char *precision;       /* fp32, bf16, fp16; NULL: the recipe's precision */
    bool unfused_attention;      /* attention computed as written, not by the fused kernels
                                    (--attention unfused; the CUDA target's, until it has them) */
    const char *weight_rounding; /* nearest, stochastic; NULL: the recipe's */
    int64_t memory_budget;       /* bytes of training memory; 0: the recipe's memory_budget, if any */
    int64_t bucket_bytes;        /* a distributed program's gradient buckets; 0: not distributed */
    bool report;        /* the memory report (KilnProgram.report) */
    bool smallest_plan; /* the report gives the smallest plan a budget can reach (a budget search) */
    bool time_passes;   /* KilnProgram.timing: each pass, its graph and its time */
    const char *command; /* the command for messages ("kiln build: error: ..."); NULL: "build" */
    FILE *diagnostics;   /* diagnostics are echoed here as reported (NULL: only collected) */
    /* called at each stage of the build ("running the passes ...") for a progress line */
    void (*progress)(void *ctx, const char *stage);
    void *progress_ctx;
} KilnOptions;

/* A graph of the program and its plan (graph NULL: the program has no such step). */
typedef struct {
    Graph *graph;
    GraphPlan plan;
} KilnGraph;

typedef struct {
    Diag diag;          /* every diagnostic of the build, in order */
    Model *model;       /* the parsed file and its checked recipe (model->graph is NULL: it
                           became train.graph) */
    Graph *lowered;     /* with keep_lowered: the model's graph before any pass */
    KilnGraph train;    /* training programs: after the whole pipeline */
    KilnGraph eval;     /* the evaluation step (eval mode: dropout off, running statistics) */
    KilnGraph predict;  /* inference programs: the forward without loss and metrics */
    KilnGraph decode;   /* a language model's decode step against a key/value cache */
    KilnGraph plain;    /* with report, when the plan recomputes values: the training graph
                           without rematerialisation, for the report's comparison */
    uint64_t model_hash; /* kiln_model.hash: the graph as lowered and its precision (compile.c) */
    int64_t unfused_arena; /* with report, when attention was fused and there is no memory
                              budget: the training activations of the plan with
                              --attention unfused (-1: not planned) */
    int64_t attention_max_head; /* the target's fused kernels' largest head size (0: any) */
    char *decode_why;   /* why a language model has no decode step (NULL: it has one, or is
                           not a language model) */
    PrecisionOptions precision; /* the precision the program trains in, with its loss scaling */
    kiln_recipe recipe; /* the train section as the program runs it (runtime/kiln_recipe.h),
                           loss_scale none where the step scales no loss */
    bool recipe_typed;  /* recipe was filled (code generation) */
    int64_t memory_budget;  /* the budget the plan was made for (0: none) */
    const char *budget_from; /* "--memory-budget" or "memory_budget" */
    RematOptions remat;      /* what the budget search found (blocks, the smallest plan) */
    StrBuf code;        /* model.c or model.cu */
    const char *code_name;  /* "model.c" or "model.cu" */
    StrBuf report;      /* with report: the memory at the bounds, one line per item */
    StrBuf notes;       /* things the build says besides errors (one line each) */
    StrBuf timing;      /* with time_passes: the table of passes */
    StrBuf stats;       /* with stats: one line per pass, the node count before and after */
} KilnProgram;

/* Compiles a model: reads (unless given the text), parses, checks and lowers it, runs the
 * pipeline on each graph the program needs, plans each once, and writes the program's code
 * (unless plan_only). Returns KILN_OK; or an error with the message in *err, or in the
 * diagnostics ((*out)->diag, echoed on opt->diagnostics). *out is always set, with what
 * was made before a stage failed (model NULL: the file did not lower; kiln check prints a
 * model that lowered and says why it has no plan); free it with kiln_program_free. */
KilnStatus kiln_compile(const KilnOptions *opt, KilnProgram **out, StrBuf *err);
void kiln_program_free(KilnProgram *p);

/* report.c — the memory at the bounds of a training program (kiln build --report, kiln
 * check) or of an inference program, from the program's plans. */
void kiln_memory_report(const KilnProgram *p, bool infer, StrBuf *out);
/* The fused attentions of a graph: its attention ops, recomputed copies not counted. */
int kiln_fused_attentions(const Graph *g);
/* `kiln ir --after fusion|memplan`: the graph, then its kernels (and their memory). */
void kiln_print_plan(const Graph *g, const GraphPlan *plan, bool memory, StrBuf *out);
/* "fp32", "bf16", "fp16" */
const char *kiln_precision_name(DType t);
/* Parameters, gradients, optimizer moments and buffers (the slabs) of a graph, in bytes,
 * with the parts (each out pointer may be NULL). */
int64_t kiln_slab_bytes(const Graph *g, const Recipe *recipe, int64_t *params, int64_t *buffers, int *moments, const char **optimizer);
/* What a plan of the budget search checkpoints, for messages, `suffix` after
 * "checkpointed": "cheap values recomputed, 2 of the model's 4 blocks checkpointed", "none
 * of the model's 4 blocks checkpointed", "the model has no block to checkpoint". */
void kiln_checkpointed_blocks(int32_t blocks, int32_t nblocks, bool cheap, const char *suffix, StrBuf *out);

#endif
